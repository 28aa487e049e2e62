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
//! - `GET /agent/v1/ca`, `POST /agent/v1/ca/stage`, `POST /agent/v1/ca/switch` (admin): a
//!   CA rotation in two steps ([`crate::ca`]); the switch is refused while a cluster's agent
//!   does not trust the staged CA, unless forced.
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
    let bundle = app.ca_bundle();
    if bundle.is_empty() {
        return Err(ApiError::new(
            404,
            "NotFound",
            "this server has no CA to hand out",
        ));
    }
    let mut r = Response::new(h::full(bundle));
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
            "token": orrery_api::token::bootstrap(&app.ca_bundle(), &credential),
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
    let issuer = app.user_issuer().ok_or_else(|| {
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
            "ca": app.ca_bundle(),
            "expires": expires.map(|t| t.to_string()),
        }),
    ))
}

/// The clusters as a CA switch sees them: those whose agent trusts `bundle_hash`, those
/// connected that do not yet, and those not connected (which cannot learn it now).
async fn clusters_trusting(
    app: &App,
    bundle_hash: &str,
) -> ApiResult<(usize, Vec<String>, Vec<String>)> {
    let listed = app
        .store
        .list(
            &orrery_api::keys::well_known::clusters(),
            &orrery_store::ListOptions::default(),
        )
        .await?;
    let (mut trusting, mut behind, mut away) = (0, Vec::new(), Vec::new());
    for c in &listed.items {
        let status = cluster::ClusterStatus::of(c);
        let name = c.metadata.name.clone();
        if status.ca_bundle_hash == bundle_hash {
            trusting += 1;
        } else if status.ready() {
            behind.push(name);
        } else {
            away.push(name);
        }
    }
    Ok((trusting, behind, away))
}

fn authority(app: &App) -> ApiResult<&Arc<crate::ca::Authority>> {
    app.config.authority.as_ref().ok_or_else(|| {
        ApiError::new(
            404,
            "NotFound",
            "this server holds no certificate authority",
        )
    })
}

fn ca_error(e: crate::ca::CaError) -> ApiError {
    match e {
        crate::ca::CaError::NothingStaged => ApiError::new(409, "Conflict", e.to_string()),
        e => ApiError::internal(format!("the certificate authority: {e}")),
    }
}

async fn ca_status(app: &App) -> ApiResult<serde_json::Value> {
    let now = authority(app)?.current();
    let hash = now.bundle_hash();
    let (trusting, behind, away) = clusters_trusting(app, &hash).await?;
    Ok(json!({
        "signing": orrery_api::token::ca_hash(now.signing()),
        "staged": now.staged.as_deref().map(orrery_api::token::ca_hash),
        "bundle": hash,
        "clusters": {
            "trusting": trusting,
            "notYet": behind,
            "notConnected": away,
        },
    }))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SwitchRequest {
    /// Switch although some clusters' agents do not trust the staged CA (they will need a
    /// new bootstrap token).
    #[serde(default)]
    force: bool,
}

fn names(v: &[String]) -> String {
    const SHOWN: usize = 10;
    let mut s = v.iter().take(SHOWN).cloned().collect::<Vec<_>>().join(", ");
    if v.len() > SHOWN {
        s.push_str(&format!(" and {} more", v.len() - SHOWN));
    }
    s
}

async fn ca(
    app: &App,
    who: &Identity,
    method: &Method,
    step: Option<&str>,
    body: &Bytes,
) -> ApiResult<Response<Body>> {
    let path = match step {
        Some(s) => format!("/agent/v1/ca/{s}"),
        None => "/agent/v1/ca".to_string(),
    };
    let verb = if method == Method::GET { "get" } else { "post" };
    app.authz.authorize_path(who, verb, &path)?;
    match (method, step) {
        (&Method::GET, None) => Ok(h::json(StatusCode::OK, &ca_status(app).await?)),
        (&Method::POST, Some("stage")) => {
            let made = authority(app)?.stage().await.map_err(ca_error)?;
            tracing::info!(by = %who.user(), made, "CA rotation: staged");
            let mut status = ca_status(app).await?;
            status["made"] = json!(made);
            Ok(h::json(StatusCode::OK, &status))
        }
        (&Method::POST, Some("switch")) => {
            let req: SwitchRequest = if body.is_empty() {
                SwitchRequest::default()
            } else {
                parse(body)?
            };
            let ca = authority(app)?;
            let now = ca.current();
            if now.staged.is_none() {
                return Err(ca_error(crate::ca::CaError::NothingStaged));
            }
            let (_, behind, away) = clusters_trusting(app, &now.bundle_hash()).await?;
            let all_follow = behind.is_empty() && away.is_empty();
            if !req.force && !all_follow {
                let mut why = Vec::new();
                if !behind.is_empty() {
                    why.push(format!("connected but not trusting the staged CA yet (wait for their next --ca-refresh-interval): {}", names(&behind)));
                }
                if !away.is_empty() {
                    why.push(format!("not connected, so they cannot learn it (after the switch they need a new bootstrap token): {}", names(&away)));
                }
                return Err(ApiError::new(
                    409,
                    "Conflict",
                    format!(
                        "not switching: some clusters' agents would no longer trust this server; {}; switch with force to go ahead anyway",
                        why.join("; ")
                    ),
                ));
            }
            ca.switch().await.map_err(ca_error)?;
            tracing::info!(by = %who.user(), forced = req.force, left_behind = behind.len() + away.len(), "CA rotation: switched");
            Ok(h::json(StatusCode::OK, &ca_status(app).await?))
        }
        (_, None | Some("stage") | Some("switch")) => Err(ApiError::method_not_allowed(
            "GET /agent/v1/ca, POST /agent/v1/ca/stage, POST /agent/v1/ca/switch",
        )),
        _ => Err(ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )),
    }
}

pub use crate::registry::register::ensure_cluster_namespace;

/// An endpoint of the agent API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Endpoint {
    Tokens,
    Register,
    Users,
    Renew,
    Ca,
    CaStep,
}

/// The agent API's paths: a data table, matched by `matchit`.
const ENDPOINTS: &[(&str, Endpoint)] = &[
    ("/agent/v1/tokens", Endpoint::Tokens),
    ("/agent/v1/register", Endpoint::Register),
    ("/agent/v1/users", Endpoint::Users),
    ("/agent/v1/renew", Endpoint::Renew),
    ("/agent/v1/ca", Endpoint::Ca),
    ("/agent/v1/ca/{step}", Endpoint::CaStep),
];

static TABLE: std::sync::LazyLock<matchit::Router<Endpoint>> = std::sync::LazyLock::new(|| {
    let mut r = matchit::Router::new();
    for (path, e) in ENDPOINTS {
        // The table is fixed and tested: a conflict is a bug found by the first test run.
        r.insert(*path, *e)
            .unwrap_or_else(|err| panic!("agent route {path}: {err}"));
    }
    r
});

/// Serves `/agent/v1/...` (`path` is the whole request path).
pub async fn serve(
    app: &App,
    who: &Identity,
    method: &Method,
    path: &str,
    body: Bytes,
) -> ApiResult<Response<Body>> {
    let Ok(found) = TABLE.at(path.trim_end_matches('/')) else {
        return Err(ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        ));
    };
    use Endpoint as E;
    match (*found.value, method) {
        (E::Tokens, &Method::POST) => create_token(app, who, &body).await,
        (E::Register, &Method::POST) => {
            let Ok(_slot) = app.registrations.try_acquire() else {
                return Err(ApiError::too_many_requests(
                    "too many clusters are registering at once; try again shortly",
                ));
            };
            register(app, who, &body).await
        }
        (E::Users, &Method::POST) => create_user(app, who, &body).await,
        (E::Renew, &Method::POST) => renew(app, who).await,
        (E::Ca, _) => ca(app, who, method, None, &body).await,
        (E::CaStep, _) => ca(app, who, method, found.params.get("step"), &body).await,
        (E::Tokens | E::Register | E::Users | E::Renew, _) => {
            Err(ApiError::method_not_allowed("use POST"))
        }
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
        let refused = serve(
            &app,
            &admin,
            &Method::POST,
            "/agent/v1/register",
            body.clone(),
        )
        .await
        .expect_err("no slot left");
        assert_eq!(refused.code, 429);
        assert_eq!(refused.retry_after_seconds(), Some(1));
        assert!(store.get(&keys::well_known::cluster("east")).await.is_err());
        drop(busy);
        let ok = serve(&app, &admin, &Method::POST, "/agent/v1/register", body)
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
