//! The endpoints member agents use before they hold a cluster token, and the one that mints
//! bootstrap tokens:
//!
//! - `GET /cacerts` (no authentication): the CA that signed the serving certificate. An agent
//!   given a bootstrap token fetches it without verification and then checks it against the
//!   CA hash the token carries, so nothing needs to be copied and nothing is trusted blindly
//!   (as k3s does it).
//! - `POST /agent/v1/tokens` (admin): a bootstrap token for one cluster.
//! - `POST /agent/v1/register` (that cluster's bootstrap or cluster token, or admin): creates
//!   or refreshes the Cluster and its `orrery-cluster-<name>` namespace, and returns a new
//!   cluster token; the cluster's earlier agent tokens stop working.
//! - `POST /agent/v1/renew` (a cluster token): a new cluster token for the same cluster, good
//!   for `--cluster-token-ttl`; the one renewed keeps working until it expires, so requests
//!   under way with it finish (an agent renews a third of the lifetime ahead).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use orrery_api::Time;
use orrery_api::cluster::{self, Registration};
use serde::Deserialize;
use serde_json::json;

use crate::app::App;
use crate::auth::Identity;
use crate::error::{ApiError, ApiResult};
use crate::http::{self as h, Body};
use crate::registry::register;
use crate::resources::ResourceType;

/// Serves `/cacerts`.
pub fn cacerts(app: &App, method: &Method) -> ApiResult<Response<Body>> {
    if method != Method::GET && method != Method::HEAD {
        return Err(ApiError::method_not_allowed("GET /cacerts only"));
    }
    if app.config.ca_pem.is_empty() {
        return Err(ApiError::new(
            404,
            "NotFound",
            "this server has no CA to hand out",
        ));
    }
    let mut r = Response::new(h::full(app.config.ca_pem.clone()));
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/x-pem-file"),
    );
    Ok(r)
}

fn parse<T: for<'de> Deserialize<'de>>(body: &Bytes) -> ApiResult<T> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid: {e}")))
}

fn cluster_rt(app: &App) -> ApiResult<Arc<ResourceType>> {
    app.resources
        .snapshot()
        .get(cluster::GROUP, cluster::VERSION, "clusters")
        .ok_or_else(|| ApiError::internal("the Cluster kind is not registered"))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenRequest {
    cluster: String,
    /// `24h`, `90m`; `0` for no expiry. Default 24h.
    #[serde(default)]
    ttl: Option<String>,
}

/// The longest a token or certificate may be made for: ten years (a credential that lives
/// longer is one nobody remembers to rotate, and dates past it overflow what a certificate
/// holds soon after).
pub const MAX_TTL: Duration = Duration::from_secs(10 * 365 * 86400);

/// A `ttl` as given (`24h`, `90m`, `30d`; `0` for no expiry; 24h when absent), at most
/// [`MAX_TTL`]: anything else is 400.
fn parse_ttl(s: Option<&str>) -> ApiResult<Option<Duration>> {
    let s = s.unwrap_or("24h").trim();
    if s == "0" {
        return Ok(None);
    }
    let ttl = orrery_api::duration::parse(s)
        .map_err(|e| ApiError::bad_request(format!("ttl: {e}; 0 for none")))?;
    if ttl.is_zero() {
        return Ok(None);
    }
    if ttl > MAX_TTL {
        return Err(ApiError::bad_request(format!(
            "ttl {s:?} is longer than the most a credential may live ({}d)",
            MAX_TTL.as_secs() / 86400
        )));
    }
    Ok(Some(ttl))
}

async fn create_token(app: &App, who: &Identity, body: &Bytes) -> ApiResult<Response<Body>> {
    // A non-resource endpoint: RBAC's nonResourceURLs decide (cluster-admin holds "*").
    app.authz.authorize_path(who, "post", "/agent/v1/tokens")?;
    let req: TokenRequest = parse(body)?;
    let rt = cluster_rt(app)?;
    // `edge-*` covers every cluster whose name starts with `edge-` (for fleets).
    let errs = match req.cluster.strip_suffix('*') {
        Some(prefix) => cluster::validate_name(&format!("{prefix}x")),
        None => cluster::validate_name(&req.cluster),
    };
    if !errs.is_empty() {
        return Err(ApiError::invalid(&rt, &req.cluster, &errs));
    }
    let ttl = parse_ttl(req.ttl.as_deref())?;
    let credential = app
        .auth
        .issue(
            &Identity::Bootstrap {
                name: req.cluster.clone(),
            },
            &format!("bootstrap token for cluster {}", req.cluster),
            ttl,
        )
        .await?;
    let expires =
        ttl.and_then(|t| Time::from_unix_seconds(Time::now().unix_seconds() + t.as_secs() as i64));
    Ok(h::json(
        StatusCode::CREATED,
        &json!({
            "token": orrery_api::token::bootstrap(&app.config.ca_pem, &credential),
            "cluster": req.cluster,
            "expires": expires.map(|t| t.to_string()),
        }),
    ))
}

async fn register(app: &App, who: &Identity, body: &Bytes) -> ApiResult<Response<Body>> {
    let req: Registration = parse(body)?;
    let grant = register::authorize(who, &req.cluster)?;
    let done = register::register(app, grant, &req).await?;
    Ok(h::json(
        StatusCode::OK,
        &json!({
            "token": done.token,
            "expires": done.expires.map(|t| t.to_string()),
            "cluster": req.cluster,
            "uid": done.cluster.metadata.uid,
            "namespace": cluster::namespace_of(&req.cluster),
        }),
    ))
}

/// A cluster token's renewal: only an agent's own token renews (an admin registers instead).
async fn renew(app: &App, who: &Identity) -> ApiResult<Response<Body>> {
    let Identity::Cluster { name } = who else {
        return Err(ApiError::forbidden(
            "only a cluster's agent renews its token (POST /agent/v1/renew with its cluster token)",
        ));
    };
    let ttl = app.config.cluster_token_ttl;
    let token = app
        .auth
        .issue(
            who,
            &format!("agent token for cluster {name} (renewed)"),
            ttl,
        )
        .await?;
    tracing::info!(cluster = %name, "renewed a cluster token");
    Ok(h::json(
        StatusCode::OK,
        &json!({
            "token": token,
            "cluster": name,
            "expires": register::expiry(ttl).map(|t| t.to_string()),
        }),
    ))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UserRequest {
    name: String,
    #[serde(default)]
    groups: Vec<String>,
    /// `720h`, `30d`; default 24h (a certificate cannot be revoked: keep it short).
    #[serde(default)]
    ttl: Option<String>,
    /// The PEM certificate signing request for the user's key (the key never leaves them).
    csr: String,
}

/// `POST /agent/v1/users`: signs a client certificate for a user (CN = name, O = groups), for
/// `orrery user create`. RBAC decides what the user may then do.
async fn create_user(app: &App, who: &Identity, body: &Bytes) -> ApiResult<Response<Body>> {
    app.authz.authorize_path(who, "post", "/agent/v1/users")?;
    let req: UserRequest = parse(body)?;
    let bad_name = |n: &str| n.is_empty() || n.len() > 256 || n.chars().any(char::is_control);
    if bad_name(&req.name) || req.groups.iter().any(|g| bad_name(g)) {
        return Err(ApiError::bad_request(
            "name and groups must be 1 to 256 printable characters",
        ));
    }
    let Some(ttl) = parse_ttl(req.ttl.as_deref())? else {
        return Err(ApiError::bad_request(
            "a user's certificate must expire (it cannot be revoked): give a ttl",
        ));
    };
    let issuer = app.config.user_issuer.as_ref().ok_or_else(|| {
        ApiError::new(
            404,
            "NotFound",
            "this server holds no CA key to sign users' certificates with",
        )
    })?;
    let cert = issuer
        .issue(&req.csr, &req.name, &req.groups, ttl)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let expires = Time::from_unix_seconds(Time::now().unix_seconds() + ttl.as_secs() as i64);
    tracing::info!(user = %req.name, groups = ?req.groups, by = %who.user(), "issued a user certificate");
    Ok(h::json(
        StatusCode::CREATED,
        &serde_json::json!({
            "certificate": cert,
            "ca": app.config.ca_pem,
            "expires": expires.map(|t| t.to_string()),
        }),
    ))
}

pub use crate::registry::register::ensure_cluster_namespace;

/// Serves `/agent/v1/...`.
pub async fn serve(
    app: &App,
    who: &Identity,
    method: &Method,
    rest: &[&str],
    body: Bytes,
) -> ApiResult<Response<Body>> {
    match (method, rest) {
        (&Method::POST, ["tokens"]) => create_token(app, who, &body).await,
        (&Method::POST, ["register"]) => {
            let Ok(_slot) = app.registrations.try_acquire() else {
                return Err(ApiError::too_many_requests(
                    "too many clusters are registering at once; try again shortly",
                ));
            };
            register(app, who, &body).await
        }
        (&Method::POST, ["users"]) => create_user(app, who, &body).await,
        (&Method::POST, ["renew"]) => renew(app, who).await,
        (_, ["tokens"] | ["register"] | ["users"] | ["renew"]) => {
            Err(ApiError::method_not_allowed("use POST"))
        }
        _ => Err(ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use orrery_api::keys;
    use orrery_store::Store;

    /// Beyond the registrations one server carries out at once, a cluster is told to come
    /// back (429 with Retry-After) and nothing is written; once a slot is free it registers.
    #[tokio::test]
    async fn registrations_beyond_the_limit_are_told_to_come_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store: Arc<dyn Store> = Arc::new(
            orrery_store_sqlite::SqliteStore::open_dir(dir.path()).expect("open the store"),
        );
        let auth = crate::auth::Authenticator::start(store.clone())
            .await
            .expect("auth");
        let (_tx, shutdown) = tokio::sync::watch::channel(false);
        let app = App::new(
            store.clone(),
            auth,
            crate::app::ApiConfig::default(),
            shutdown,
        )
        .await
        .expect("app");
        let admin = Identity::Admin {
            name: "admin".into(),
        };
        let body = Bytes::from(r#"{"cluster": "east"}"#);
        let busy = app
            .registrations
            .try_acquire_many(crate::app::CONCURRENT_REGISTRATIONS as u32)
            .expect("every slot");
        let refused = serve(&app, &admin, &Method::POST, &["register"], body.clone())
            .await
            .expect_err("no slot left");
        assert_eq!(refused.code, 429);
        assert_eq!(refused.retry_after_seconds(), Some(1));
        assert!(store.get(&keys::well_known::cluster("east")).await.is_err());
        drop(busy);
        let ok = serve(&app, &admin, &Method::POST, &["register"], body)
            .await
            .expect("registered");
        assert_eq!(ok.status(), StatusCode::OK);
        store
            .get(&keys::well_known::cluster("east"))
            .await
            .expect("the Cluster exists");
    }

    #[test]
    fn patterns() {
        assert!(register::token_covers("east", "east"));
        assert!(!register::token_covers("east", "east-2"));
        assert!(register::token_covers("edge-*", "edge-17"));
        assert!(!register::token_covers("edge-*", "core"));
        assert!(register::token_covers("*", "anything"));
    }

    #[test]
    fn ttls() {
        assert_eq!(parse_ttl(None).unwrap(), Some(Duration::from_secs(86400)));
        assert_eq!(
            parse_ttl(Some("90m")).unwrap(),
            Some(Duration::from_secs(5400))
        );
        assert_eq!(parse_ttl(Some("0")).unwrap(), None);
        assert!(parse_ttl(Some("soon")).is_err());
        assert!(parse_ttl(Some("5y")).is_err());
        assert_eq!(
            parse_ttl(Some("3650d")).unwrap(),
            Some(Duration::from_secs(3650 * 86400))
        );
        // Out of range is 400, never a panic, an already-expired token or none at all.
        for huge in [
            "3000000d",
            "18446744073709551615",
            "999999999999999999d",
            "3651d",
        ] {
            let e = parse_ttl(Some(huge)).unwrap_err();
            assert_eq!(e.code, 400, "{huge}: {e:?}");
        }
    }
}
