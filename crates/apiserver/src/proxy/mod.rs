//! The cluster proxy: a request to `/apis/multicluster.io/v1alpha1/clusters/<name>/proxy/<path>`
//! reaches `<path>` on the member's API through a tunnel that the member's agent opened to
//! this server, so a member behind NAT (pull mode) needs no inbound connection.
//!
//! The agent opens the tunnel with `POST .../clusters/<name>/tunnel` and `Upgrade:
//! orrery-tunnel`; after the `101` the connection is a byte stream on which this server is the
//! HTTP/2 client and the agent the server: each proxied request is one HTTP/2 stream, so many
//! share the tunnel and a followed log streams as it comes. Push-mode members have their agent
//! inside the server, which opens its tunnel the same way. Tunnels live in the replica the
//! agent is connected to; another replica forwards to it (`peers`).
//!
//! Authorization: the verb of the request's method on `clusters/proxy` of that cluster (RBAC);
//! the request reaches the member with the agent's credentials there, never the caller's token.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};

use crate::app::App;
use crate::auth::{Attributes, Identity};
use crate::error::{ApiError, ApiResult};
use crate::http::Body;

pub mod peers;

/// The protocol an agent asks to upgrade its connection to.
pub const TUNNEL_PROTOCOL: &str = "orrery-tunnel";
const PREFIX: &str = "/apis/multicluster.io/v1alpha1/clusters/";
/// The largest request body forwarded.
const MAX_BODY: usize = 3 * 1024 * 1024;

/// What a path asks of the proxy.
#[derive(Debug, PartialEq, Eq)]
pub enum Target<'a> {
    /// An agent opening its cluster's tunnel.
    Tunnel(&'a str),
    /// A request for `path` on the cluster's API.
    Proxy { cluster: &'a str, path: &'a str },
}

/// The proxy's part of a path, if it is one.
pub fn target(path: &str) -> Option<Target<'_>> {
    let rest = path.strip_prefix(PREFIX)?;
    let (cluster, sub) = rest.split_once('/')?;
    if cluster.is_empty() {
        return None;
    }
    match sub {
        "tunnel" => Some(Target::Tunnel(cluster)),
        "proxy" => Some(Target::Proxy { cluster, path: "/" }),
        _ => {
            let p = sub.strip_prefix("proxy")?;
            p.starts_with('/')
                .then_some(Target::Proxy { cluster, path: p })
        }
    }
}

use crate::tunnels::Sender;
pub use crate::tunnels::Tunnels;

impl Tunnels {
    fn lock(&self) -> parking_lot::MutexGuard<'_, HashMap<String, (u64, Sender)>> {
        self.open.lock()
    }

    /// Keeps a cluster's new tunnel (in place of an older one); returns its id.
    fn put(&self, cluster: &str, s: Sender) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(cluster.to_string(), (id, s));
        id
    }

    /// Forgets tunnel `id` of a cluster (not a newer one).
    fn remove(&self, cluster: &str, id: u64) {
        let mut open = self.lock();
        if open.get(cluster).is_some_and(|(i, _)| *i == id) {
            open.remove(cluster);
        }
    }

    fn get(&self, cluster: &str) -> Option<Sender> {
        self.lock().get(cluster).map(|(_, s)| s.clone())
    }

    /// Whether a cluster's agent has a tunnel open here.
    pub fn has(&self, cluster: &str) -> bool {
        self.lock().contains_key(cluster)
    }
}

/// Headers that belong to one hop, not to the request or answer proxied.
fn hop_by_hop(name: &http::HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
            | "content-length"
    )
}

fn verb_of(m: &http::Method) -> &'static str {
    match m.as_str() {
        "POST" => "create",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" => "delete",
        _ => "get",
    }
}

/// Serves a tunnel or proxy request.
pub async fn serve<B>(
    app: &Arc<App>,
    who: &Identity,
    target: Target<'_>,
    mut req: Request<B>,
) -> ApiResult<Response<Body>>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    match target {
        Target::Tunnel(cluster) => {
            if !matches!(who, Identity::Cluster { name } if name == cluster) {
                return Err(ApiError::forbidden(format!(
                    "only the agent of cluster {cluster} may open its tunnel"
                )));
            }
            let asks = req
                .headers()
                .get(http::header::UPGRADE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.eq_ignore_ascii_case(TUNNEL_PROTOCOL));
            if !asks {
                return Err(ApiError::bad_request(format!(
                    "a tunnel is opened with Upgrade: {TUNNEL_PROTOCOL}"
                )));
            }
            let upgrade = hyper::upgrade::on(&mut req);
            let app = app.clone();
            let cluster = cluster.to_string();
            tokio::spawn(async move {
                let io = match upgrade.await {
                    Ok(io) => io,
                    Err(e) => {
                        tracing::debug!(%cluster, error = %e, "the tunnel's upgrade failed");
                        return;
                    }
                };
                let (send, conn) =
                    match hyper::client::conn::http2::Builder::new(TokioExecutor::new())
                        .handshake(io)
                        .await
                    {
                        Ok(x) => x,
                        Err(e) => {
                            tracing::debug!(%cluster, error = %e, "the tunnel's handshake failed");
                            return;
                        }
                    };
                let id = app.tunnels.put(&cluster, send);
                tracing::debug!(%cluster, "cluster proxy tunnel open");
                // Recorded beside the connection, which must be driven meanwhile (a store
                // that is slow or without quorum would stall the tunnel).
                let recording = tokio::spawn({
                    let (app, cluster) = (app.clone(), cluster.clone());
                    async move { peers::record(&app, &cluster).await }
                });
                let mut shutdown = app.shutdown.clone();
                tokio::select! {
                    r = conn => if let Err(e) = r {
                        tracing::debug!(%cluster, error = %e, "the tunnel ended");
                    },
                    _ = shutdown.changed() => {}
                }
                app.tunnels.remove(&cluster, id);
                tracing::info!(%cluster, "cluster proxy tunnel closed");
                // The record first (it stops once the tunnel is gone), so that it cannot
                // follow the removal.
                let _ = recording.await;
                peers::forget(&app, &cluster).await;
            });
            let mut r = Response::new(crate::http::full(Bytes::new()));
            *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
            r.headers_mut().insert(
                http::header::CONNECTION,
                http::HeaderValue::from_static("Upgrade"),
            );
            r.headers_mut().insert(
                http::header::UPGRADE,
                http::HeaderValue::from_static(TUNNEL_PROTOCOL),
            );
            Ok(r)
        }
        Target::Proxy { cluster, path } => {
            // An upgrade (exec, attach, port-forward) acts in the member: `create`, as
            // Kubernetes asks for pods/exec, never the `get` of its GET.
            let verb = match req.headers().contains_key(http::header::UPGRADE) {
                true => "create",
                false => verb_of(req.method()),
            };
            app.authz.authorize(
                who,
                &Attributes {
                    verb,
                    group: "multicluster.io",
                    resource: "clusters",
                    subresource: Some("proxy"),
                    namespace: None,
                    name: Some(cluster),
                },
            )?;
            let Some(mut send) = app.tunnels.get(cluster) else {
                let forwarded = req.headers().contains_key(peers::FORWARDED);
                if !forwarded && let Some(holder) = peers::holder(app, cluster).await {
                    return peers::forward(app, &holder, cluster, path, req).await;
                }
                return Err(ApiError::service_unavailable(format!(
                    "cluster {cluster} has no tunnel to this server: its agent is not connected{}",
                    match forwarded {
                        true => " (asked by another replica, which thought it was)",
                        false => "",
                    }
                )));
            };
            if req.headers().contains_key(http::header::UPGRADE) {
                return upgrade(cluster, path, req, send).await;
            }
            let (parts, body) = req.into_parts();
            let body = crate::http::read_body(body, MAX_BODY).await?;
            let out = to_member(path, &parts, &[])
                .method(parts.method.clone())
                .body(Full::new(body))
                .map_err(|e| ApiError::bad_request(e.to_string()))?;
            Ok(relay(send_on(cluster, &mut send, out).await?))
        }
    }
}

/// A request for the member's API: `path` with the caller's query, and the caller's headers
/// less the hop-by-hop ones, its credentials and `skip`.
fn to_member(
    path: &str,
    parts: &http::request::Parts,
    skip: &[http::HeaderName],
) -> http::request::Builder {
    let uri = match parts.uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_string(),
    };
    let mut out = Request::builder().uri(uri);
    for (k, v) in &parts.headers {
        if !hop_by_hop(k) && k != http::header::AUTHORIZATION && !skip.contains(k) {
            out = out.header(k, v);
        }
    }
    out
}

/// Sends one request on a cluster's tunnel.
async fn send_on(
    cluster: &str,
    send: &mut Sender,
    req: Request<Full<Bytes>>,
) -> ApiResult<Response<hyper::body::Incoming>> {
    let unavailable = |e: hyper::Error| {
        ApiError::service_unavailable(format!("the tunnel to cluster {cluster}: {e}"))
    };
    send.ready().await.map_err(unavailable)?;
    send.send_request(req).await.map_err(unavailable)
}

/// The member's answer as it comes (a followed log streams; an error ends it), without its
/// hop-by-hop headers.
fn relay(answer: Response<hyper::body::Incoming>) -> Response<Body> {
    let (parts, incoming) = answer.into_parts();
    let frames = futures_util::stream::unfold(Some(incoming), |state| async move {
        let mut b = state?;
        match b.frame().await {
            Some(Ok(f)) => Some((Ok::<Frame<Bytes>, std::convert::Infallible>(f), Some(b))),
            _ => None,
        }
    });
    let mut r = Response::new(StreamBody::new(frames).boxed());
    *r.status_mut() = parts.status;
    for (k, v) in &parts.headers {
        if !hop_by_hop(k) {
            r.headers_mut().append(k, v.clone());
        }
    }
    r
}

/// The kinds whose pods run in member clusters, never in the control plane: (group, kind,
/// plural).
const WORKLOADS: &[(&str, &str, &str)] = &[
    ("apps", "Deployment", "deployments"),
    ("apps", "StatefulSet", "statefulsets"),
    ("apps", "DaemonSet", "daemonsets"),
    ("apps", "ReplicaSet", "replicasets"),
    ("batch", "Job", "jobs"),
];

/// Where the pods of a propagated workload run: a warning with how to reach them, and the
/// short sentence of an error.
#[derive(Clone, Debug)]
pub struct Elsewhere {
    pub warning: String,
    pub short: String,
}

/// What to tell someone who lists the control plane's pods by a selector that a propagated
/// workload's pods match (`kubectl logs deploy/web` does, then waits 20 s for a pod that
/// never comes): where they run, and how to reach them. `None` when no workload matches.
pub async fn pods_elsewhere(app: &App, namespace: &str, selector: &str) -> Option<Elsewhere> {
    let sel = orrery_api::labels::Selector::parse(selector).ok()?;
    let bindings = app
        .store
        .list(
            &orrery_api::keys::well_known::bindings(Some(namespace)),
            &Default::default(),
        )
        .await
        .ok()?;
    let mut found: Vec<(String, Vec<String>)> = Vec::new();
    for b in &bindings.items {
        let Some(spec) = orrery_api::binding::BindingSpec::of(b) else {
            continue;
        };
        let r = &spec.resource;
        let group = r.api_version.split_once('/').map_or("", |(g, _)| g);
        let Some((_, _, plural)) = WORKLOADS
            .iter()
            .find(|(g, k, _)| *g == group && *k == r.kind)
        else {
            continue;
        };
        let key = orrery_api::keys::object(group, plural, Some(namespace), &r.name);
        let Ok(t) = app.store.get(&key).await else {
            continue;
        };
        let labels: std::collections::BTreeMap<String, String> = t
            .spec
            .as_ref()
            .and_then(|s| s.pointer("/template/metadata/labels"))
            .and_then(|l| serde_json::from_value(l.clone()).ok())
            .unwrap_or_default();
        let clusters: Vec<String> = spec.clusters.iter().map(|c| c.name.clone()).collect();
        if !labels.is_empty() && sel.matches(&labels) && !clusters.is_empty() {
            found.push((format!("{} {namespace}/{}", r.kind, r.name), clusters));
        }
    }
    let first = found.first()?.1.first()?.clone();
    let what: Vec<String> = found
        .iter()
        .map(|(w, cs)| format!("{w} in {}", cs.join(", ")))
        .collect();
    Some(Elsewhere {
        warning: format!(
            "pods run in member clusters, not in the control plane: {}; reach them through the cluster proxy: orrery kubeconfig --cluster {first} -o {first}.kubeconfig && kubectl --kubeconfig {first}.kubeconfig get pods -n {namespace}",
            what.join("; ")
        ),
        short: format!(
            "no pod runs in the control plane: the pods of {} (see the warning above for how to reach them)",
            what.join("; ")
        ),
    })
}

/// The namespace of a request to list its pods (`/api/v1/namespaces/<ns>/pods`).
pub fn pods_list_namespace(path: &str) -> Option<&str> {
    path.strip_prefix("/api/v1/namespaces/")?
        .strip_suffix("/pods")
        .filter(|ns| !ns.is_empty() && !ns.contains('/'))
}

/// Joins the caller's upgraded connection to the other side's once both are upgraded, bytes
/// flowing both ways until either ends.
fn join(cluster: &str, ours: hyper::upgrade::OnUpgrade, theirs: hyper::upgrade::OnUpgrade) {
    let cluster = cluster.to_string();
    tokio::spawn(async move {
        let (a, b) = match (ours.await, theirs.await) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => {
                tracing::debug!(%cluster, error = %e, "a proxied upgrade failed");
                return;
            }
        };
        let (mut a, mut b) = (TokioIo::new(a), TokioIo::new(b));
        if let Err(e) = tokio::io::copy_bidirectional(&mut a, &mut b).await {
            tracing::debug!(%cluster, error = %e, "a proxied stream ended");
        }
    });
}

/// A WebSocket upgrade (kubectl's exec, attach and port-forward since 1.30/1.31) carried
/// through the tunnel as an HTTP/2 extended CONNECT (RFC 8441): the agent answers it, and once
/// both sides are upgraded the bytes flow between the caller and the agent unchanged.
async fn upgrade<B>(
    cluster: &str,
    path: &str,
    mut req: Request<B>,
    mut send: Sender,
) -> ApiResult<Response<Body>>
where
    B: hyper::body::Body<Data = Bytes>,
{
    // In a block: the closure's borrow of the request is not held across the awaits below
    // (a request body need not be `Sync`).
    let key = {
        let header = |name: &str| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let websocket = header("upgrade").is_some_and(|u| u.eq_ignore_ascii_case("websocket"));
        header("sec-websocket-key").filter(|_| websocket)
    };
    let Some(key) = key else {
        return Err(ApiError::bad_request(
            "the cluster proxy carries WebSocket upgrades only (kubectl 1.30 or newer uses them for exec and attach, 1.31 for port-forward; 1.30 with KUBECTL_PORT_FORWARD_WEBSOCKETS=true)",
        ));
    };
    // The caller's side of the upgrade (it completes once the 101 below is sent).
    let ours = hyper::upgrade::on(&mut req);
    let (parts, _) = req.into_parts();
    let mut out = to_member(path, &parts, &[http::header::SEC_WEBSOCKET_KEY])
        .method(http::Method::CONNECT)
        .body(Full::new(Bytes::new()))
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    out.extensions_mut()
        .insert(hyper::ext::Protocol::from_static("websocket"));
    let mut answer = send_on(cluster, &mut send, out).await?;
    if answer.status() != StatusCode::OK {
        // The member's refusal (a Status), as it is.
        return Ok(relay(answer));
    }
    join(cluster, ours, hyper::upgrade::on(&mut answer));
    let mut r = Response::new(crate::http::full(Bytes::new()));
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = r.headers_mut();
    h.insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("Upgrade"),
    );
    h.insert(
        http::header::UPGRADE,
        http::HeaderValue::from_static("websocket"),
    );
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    if let Ok(v) = http::HeaderValue::from_str(&accept) {
        h.insert(http::header::SEC_WEBSOCKET_ACCEPT, v);
    }
    if let Some(p) = answer.headers().get(http::header::SEC_WEBSOCKET_PROTOCOL) {
        h.insert(http::header::SEC_WEBSOCKET_PROTOCOL, p.clone());
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_of_the_proxy() {
        let p = "/apis/multicluster.io/v1alpha1/clusters/";
        let cases = [
            (format!("{p}a/tunnel"), Some(Target::Tunnel("a"))),
            (
                format!("{p}a/proxy"),
                Some(Target::Proxy {
                    cluster: "a",
                    path: "/",
                }),
            ),
            (
                format!("{p}east-1/proxy/api/v1/namespaces/default/pods"),
                Some(Target::Proxy {
                    cluster: "east-1",
                    path: "/api/v1/namespaces/default/pods",
                }),
            ),
            (format!("{p}a/status"), None),
            (format!("{p}a/proxyx"), None),
            (format!("{p}a"), None),
            (format!("{p}/proxy"), None),
            ("/api/v1/pods".to_string(), None),
        ];
        for (path, want) in cases {
            assert_eq!(target(&path), want, "{path}");
        }
    }

    #[test]
    fn lists_of_pods_by_namespace() {
        let cases = [
            ("/api/v1/namespaces/default/pods", Some("default")),
            ("/api/v1/namespaces/default/pods/web-0", None),
            ("/api/v1/pods", None),
            ("/api/v1/namespaces//pods", None),
            ("/api/v1/namespaces/a/b/pods", None),
        ];
        for (path, want) in cases {
            assert_eq!(pods_list_namespace(path), want, "{path}");
        }
    }
}
