//! The cluster proxy across replicas. A tunnel lives in the replica its agent connected to;
//! that replica records itself as the tunnel's holder in the Lease
//! `orrery-system/proxy-<cluster>` (`holderIdentity`: its `--advertise-url`). Another replica
//! asked for that cluster authorizes the caller itself, then forwards the request to the
//! holder as the replica (a client certificate signed by the installation's CA, user
//! `system:orrery-replica` in `system:masters`), upgraded streams included. A forwarded request
//! is never forwarded again: a record left by a replica that died cannot send it around.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use orrery_store::{Preconditions, StoreError};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use super::{MAX_BODY, PREFIX, hop_by_hop, join, relay};
use crate::app::App;
use crate::error::{ApiError, ApiResult};
use crate::http::Body;

/// Marks a request one replica forwarded to another.
pub const FORWARDED: &str = "x-orrery-proxy-forwarded";
const NAMESPACE: &str = "orrery-system";
/// The user a replica forwards as (in `system:masters`: the caller was authorized already).
const REPLICA_USER: &str = "system:orrery-replica";
/// How long the replica's client certificate is good for; a new one is made at half of it.
const CERT_TTL: Duration = Duration::from_secs(24 * 3600);
/// The most a connection to another replica (TCP and TLS) may take.
const DIAL_TIMEOUT: Duration = Duration::from_secs(5);

fn lease_key(cluster: &str) -> String {
    orrery_api::keys::object(
        "coordination.k8s.io",
        "leases",
        Some(NAMESPACE),
        &format!("proxy-{cluster}"),
    )
}

use crate::tunnels::H2;
pub use crate::tunnels::Peers;

impl Peers {
    fn tls(&self, app: &App) -> Result<Arc<rustls::ClientConfig>, String> {
        let generation = app
            .config
            .authority
            .as_ref()
            .map_or(0, |a| a.current().generation);
        let mut cached = self.tls.lock();
        if let Some((made, g, c)) = cached.as_ref()
            && made.elapsed() < CERT_TTL / 2
            && *g == generation
        {
            return Ok(c.clone());
        }
        let c = Arc::new(client_config(app)?);
        *cached = Some((Instant::now(), generation, c.clone()));
        Ok(c)
    }

    fn cached(&self, holder: &str) -> Option<H2> {
        let h2 = self.h2.lock();
        h2.get(holder).filter(|s| !s.is_closed()).cloned()
    }

    fn keep(&self, holder: &str, s: H2) {
        let mut h2 = self.h2.lock();
        h2.retain(|_, s| !s.is_closed());
        h2.insert(holder.to_string(), s);
    }

    fn drop_cached(&self, holder: &str) {
        self.h2.lock().remove(holder);
    }
}

/// A TLS connection to the replica at `holder`, speaking `alpn`.
async fn dial(
    app: &App,
    holder: &str,
    alpn: &[u8],
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
    let uri: http::Uri = holder
        .parse()
        .map_err(|e: http::uri::InvalidUri| e.to_string())?;
    let host = uri.host().ok_or("not an https:// URL")?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = uri.port_u16().unwrap_or(443);
    let mut tls = (*app.tunnels.peers.tls(app)?).clone();
    tls.alpn_protocols = vec![alpn.to_vec()];
    let name = ServerName::try_from(host.clone()).map_err(|e| e.to_string())?;
    // A replica that is gone (its record left behind) must not hold the caller for the
    // kernel's connect timeout.
    tokio::time::timeout(DIAL_TIMEOUT, async {
        let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| e.to_string())?;
        tokio_rustls::TlsConnector::from(Arc::new(tls))
            .connect(name, tcp)
            .await
            .map_err(|e| e.to_string())
    })
    .await
    .map_err(|_| format!("no TLS connection within {DIAL_TIMEOUT:?}"))?
}

/// Sends a plain request on the HTTP/2 connection to `holder` (made once and kept; made again
/// if the kept one fails before the request is sent).
async fn send_h2(
    app: &App,
    holder: &str,
    req: Request<Full<Bytes>>,
) -> Result<Response<hyper::body::Incoming>, String> {
    let peers = &app.tunnels.peers;
    if let Some(mut s) = peers.cached(holder)
        && s.ready().await.is_ok()
    {
        match s.send_request(clone_request(&req)).await {
            Ok(r) => return Ok(r),
            // Not sent on a connection that went away: try a new one.
            Err(e) if e.is_canceled() || e.is_closed() => peers.drop_cached(holder),
            Err(e) => return Err(e.to_string()),
        }
    }
    let io = dial(app, holder, b"h2").await?;
    // Pings find a peer that went away without closing (its cached connection would
    // otherwise hold every request sent on it).
    let (mut s, conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .timer(hyper_util::rt::TokioTimer::new())
            .keep_alive_interval(Duration::from_secs(15))
            .keep_alive_timeout(Duration::from_secs(10))
            .keep_alive_while_idle(true)
            .handshake(TokioIo::new(io))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "a connection to another replica ended");
        }
    });
    peers.keep(holder, s.clone());
    s.ready().await.map_err(|e| e.to_string())?;
    s.send_request(req).await.map_err(|e| e.to_string())
}

fn clone_request(r: &Request<Full<Bytes>>) -> Request<Full<Bytes>> {
    let mut c = Request::new(r.body().clone());
    *c.method_mut() = r.method().clone();
    *c.uri_mut() = r.uri().clone();
    *c.headers_mut() = r.headers().clone();
    c
}

fn client_config(app: &App) -> Result<rustls::ClientConfig, String> {
    let issuer = app
        .user_issuer()
        .ok_or("this replica holds no CA key to sign its certificate with")?;
    let (key_pem, csr) = crate::pki::key_and_csr().map_err(|e| e.to_string())?;
    let cert_pem = issuer
        .issue(
            &csr,
            REPLICA_USER,
            &["system:masters".to_string()],
            CERT_TTL,
        )
        .map_err(|e| e.to_string())?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| e.to_string())?;
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(app.ca_bundle().as_bytes()) {
        roots
            .add(ca.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut c = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_client_auth_cert(certs, key)
        .map_err(|e| e.to_string())?;
    // ALPN is chosen per connection (`dial`).
    c.alpn_protocols = Vec::new();
    Ok(c)
}

/// Records this replica as the holder of a cluster's tunnel (HA installations only), trying
/// again for as long as the tunnel is open here (another replica may be writing or removing
/// the record at the same moment; the store may be without quorum). The record is not
/// renewed: a tunnel is recorded each time an agent opens it.
pub async fn record(app: &App, cluster: &str) {
    let Some(me) = app.config.advertise_url.as_deref() else {
        return;
    };
    let mut wait = Duration::from_millis(200);
    let mut told = false;
    while app.tunnels.has(cluster) {
        let e = match try_record(app, cluster, me).await {
            Ok(()) => return,
            Err(e) => e,
        };
        if matches!(
            e,
            StoreError::Conflict { .. } | StoreError::AlreadyExists { .. }
        ) {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        if !told {
            told = true;
            tracing::warn!(%cluster, error = %e, "could not record this replica as the holder of the cluster's tunnel (trying again): other replicas cannot forward to it meanwhile");
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_secs(10));
    }
}

async fn try_record(app: &App, cluster: &str, me: &str) -> Result<(), StoreError> {
    let key = lease_key(cluster);
    let now = orrery_api::MicroTime::now().to_string();
    let spec = serde_json::json!({"holderIdentity": me, "acquireTime": now, "renewTime": now});
    match app.store.get(&key).await {
        Ok(current) => {
            let mut next = current.clone();
            next.spec = Some(spec);
            app.store.update(&key, next, current.revision()).await?;
        }
        Err(StoreError::NotFound { .. }) => {
            let mut lease = orrery_store::stamp::new_object(
                "coordination.k8s.io/v1",
                "Lease",
                Some(NAMESPACE),
                &format!("proxy-{cluster}"),
            );
            lease
                .metadata
                .labels
                .insert("multicluster.io/cluster".into(), cluster.into());
            // Owned by the Cluster: a record a replica could not remove (it died) goes with the
            // cluster.
            if let Ok(c) = app
                .store
                .get(&orrery_api::keys::well_known::cluster(cluster))
                .await
            {
                lease.metadata.owner_references =
                    vec![orrery_api::OwnerReference::controller_of(&c)];
            }
            lease.spec = Some(spec);
            app.store.create(&key, lease).await?;
        }
        Err(e) => return Err(e),
    }
    Ok(())
}

/// Forgets this replica as the holder of a cluster's tunnel, unless a newer tunnel of the
/// cluster is open here or another replica holds it now.
pub async fn forget(app: &App, cluster: &str) {
    let Some(me) = app.config.advertise_url.as_deref() else {
        return;
    };
    if app.tunnels.has(cluster) {
        return;
    }
    let key = lease_key(cluster);
    let Ok(current) = app.store.get(&key).await else {
        return;
    };
    if holder_of(&current).as_deref() != Some(me) {
        return;
    }
    let pre = Preconditions {
        uid: None,
        revision: current.revision(),
    };
    if let Err(e) = app.store.delete(&key, &pre).await {
        tracing::debug!(%cluster, error = %e, "the tunnel's holder record was not removed");
    }
}

fn holder_of(lease: &orrery_api::Object) -> Option<String> {
    lease
        .spec
        .as_ref()?
        .get("holderIdentity")?
        .as_str()
        .filter(|h| !h.is_empty())
        .map(str::to_string)
}

/// The replica holding a cluster's tunnel, if another one does.
pub async fn holder(app: &App, cluster: &str) -> Option<String> {
    let me = app.config.advertise_url.as_deref();
    let lease = app.store.get(&lease_key(cluster)).await.ok()?;
    holder_of(&lease).filter(|h| Some(h.as_str()) != me)
}

/// Sends the (already authorized) request to the replica `holder`, and relays its answer or
/// joins the upgraded streams.
pub async fn forward<B>(
    app: &App,
    holder: &str,
    cluster: &str,
    path: &str,
    mut req: Request<B>,
) -> ApiResult<Response<Body>>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    // The cause goes to the log, not to the caller (the record's address is only as good as
    // whoever may write Leases in orrery-system).
    let unavailable = |e: &dyn std::fmt::Display| {
        tracing::warn!(%cluster, %holder, error = %e, "could not forward a cluster proxy request to the replica holding the tunnel");
        ApiError::service_unavailable(format!(
            "cluster {cluster}'s tunnel is held by the replica at {holder}, which could not be reached"
        ))
    };
    let authority = holder
        .parse::<http::Uri>()
        .ok()
        .and_then(|u| u.authority().cloned())
        .ok_or_else(|| unavailable(&"not an https:// URL"))?;
    let upgrading = req.headers().contains_key(http::header::UPGRADE);
    let ours = upgrading.then(|| hyper::upgrade::on(&mut req));
    let (parts, body) = req.into_parts();
    let body = crate::http::read_body(body, MAX_BODY).await?;
    let uri = match parts.uri.query() {
        Some(q) => format!("{PREFIX}{cluster}/proxy{path}?{q}"),
        None => format!("{PREFIX}{cluster}/proxy{path}"),
    };
    let mut out = Request::builder()
        .method(parts.method.clone())
        .uri(uri)
        .header(FORWARDED, "1");
    for (k, v) in &parts.headers {
        // An upgrade keeps its Connection and Upgrade headers: the holder answers it.
        let keep = upgrading && (k == http::header::CONNECTION || k == http::header::UPGRADE);
        if (keep || !hop_by_hop(k)) && k != http::header::AUTHORIZATION {
            out = out.header(k, v);
        }
    }
    let Some(ours) = ours else {
        let out = out
            .body(Full::new(body))
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let answer = send_h2(app, holder, out)
            .await
            .map_err(|e| unavailable(&e))?;
        return Ok(relay(answer));
    };
    let io = dial(app, holder, b"http/1.1")
        .await
        .map_err(|e| unavailable(&e))?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| unavailable(&e))?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "a connection to another replica ended");
        }
    });
    let out = out
        .header(http::header::HOST, authority.as_str())
        .body(Full::new(body))
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let mut answer = send.send_request(out).await.map_err(|e| unavailable(&e))?;
    if answer.status() != StatusCode::SWITCHING_PROTOCOLS {
        return Ok(relay(answer));
    }
    join(cluster, ours, hyper::upgrade::on(&mut answer));
    // The holder's 101, with the headers that complete the caller's handshake.
    let mut r = Response::new(crate::http::full(Bytes::new()));
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    for (k, v) in answer.headers() {
        if k != http::header::CONTENT_LENGTH {
            r.headers_mut().append(k, v.clone());
        }
    }
    Ok(r)
}
