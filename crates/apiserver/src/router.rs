//! The request router, the [pipeline](crate::pipeline)'s last step: the fixed routes
//! (discovery, OpenAPI, metrics, the agent API, the DRO-DS API, the reviews) and, for
//! everything else, the resource tree (`rest::serve`). The state it routes over is
//! `app.rs`'s.

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};

use crate::app::App;
use crate::auth::Identity;
use crate::error::{ApiError, ApiResult};
use crate::http::{self as h, Body, Query};
use crate::routes::{self, Route};
use crate::{discovery, openapi, rest};

/// For a list of pods in a namespace: its selector (told only to whoever may list them, after
/// the list is served), and whether it is a one-shot watch (informers ask for bookmarks;
/// kubectl's wait for a pod does not).
fn pods_asked_for(
    path: &str,
    method: &Method,
    query: Option<&str>,
    is_watch: bool,
) -> (Option<(String, String)>, bool) {
    match crate::proxy::pods_list_namespace(path) {
        Some(ns) if method == Method::GET => {
            let q = h::Query::parse(query);
            (
                q.get("labelSelector")
                    .map(|sel| (ns.to_string(), sel.to_string())),
                is_watch && !q.flag("allowWatchBookmarks").unwrap_or(false),
            )
        }
        _ => (None, false),
    }
}

/// Refuses what is not a read on a read-only URL.
fn read_only(m: &Method, path: &str) -> ApiResult<()> {
    if m == Method::GET || m == Method::HEAD {
        Ok(())
    } else {
        Err(ApiError::method_not_allowed(format!(
            "{m} is not allowed on {path}"
        )))
    }
}

/// The last step of the [pipeline](crate::pipeline): the fixed routes and the resource tree,
/// for a request authenticated as `who` whose body has been read.
pub async fn serve<B>(
    app: Arc<App>,
    req: Request<B>,
    who: Identity,
    impersonated: Option<crate::impersonation::Impersonated>,
) -> ApiResult<Response<Body>>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let path = req.uri().path().to_string();
    let is_watch = h::asks_to_watch(req.uri().query());
    // A list of pods that run in members: say where (kubectl prints warnings).
    // (Told only to whoever may list them, after the list is served.)
    // And whether it is a one-shot watch (informers ask for bookmarks; kubectl's wait for
    // a pod does not).
    let (selector, one_shot) = pods_asked_for(&path, req.method(), req.uri().query(), is_watch);
    let answer = crate::impersonation::CURRENT
        // Boxed: the resource tree's future is large (every surface's states), and a
        // request's own stays small on its connection's task.
        .scope(impersonated, Box::pin(app.dispatch(req, &who)))
        .await?;
    app.where_pods_run(answer, selector, one_shot).await
}

impl App {
    /// The routes served before authentication: health (`/readyz` not while the store has
    /// no quorum, nor while who is who, or who may do what, is out of step with it: a revoked
    /// token, or a removed binding, would still be honoured), the UI page (public, holding no
    /// data: it fetches with the token the user gives it), and `/cacerts` (public by design:
    /// agents verify it against the hash in their bootstrap token).
    pub(crate) fn public(&self, path: &str, method: &Method) -> Option<ApiResult<Response<Body>>> {
        match routes::route(path) {
            Some(Route::Health) => {
                if path == "/readyz"
                    && let Some(why) = self
                        .store
                        .degraded()
                        .or_else(|| self.auth.out_of_step())
                        .or_else(|| self.authz.out_of_step())
                {
                    let mut r = Response::new(h::full(format!("not ready: {why}")));
                    *r.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
                    return Some(Ok(r));
                }
                let mut r = Response::new(h::full("ok"));
                r.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("text/plain"),
                );
                Some(Ok(r))
            }
            Some(Route::Ui) => Some(crate::ui::page(method)),
            Some(Route::CaCerts) => Some(crate::agent_api::cacerts(self, method)),
            _ => None,
        }
    }

    /// A list of pods that run in members, served: says where they run (kubectl prints
    /// warnings). A one-shot watch for such pods (kubectl logs, exec, attach and port-forward
    /// of deploy/web wait on one for a pod that never comes) is refused, 404 saying where they
    /// run, so kubectl ends at once with that (an error event in a stream it would skip, and
    /// then say only that the watch closed). Informers (their watches ask for bookmarks) get
    /// the warning only and watch on.
    async fn where_pods_run(
        &self,
        mut r: Response<Body>,
        selector: Option<(String, String)>,
        one_shot: bool,
    ) -> ApiResult<Response<Body>> {
        let elsewhere = match &selector {
            Some((ns, sel)) if r.status().is_success() => {
                crate::proxy::pods_elsewhere(self, ns, sel).await
            }
            _ => None,
        };
        if let (Some(w), true) = (&elsewhere, one_shot) {
            return Err(ApiError::new(404, "NotFound", w.short.clone()));
        }
        if let Some(w) = elsewhere.map(|e| e.warning) {
            let text = format!("299 - \"{}\"", w.replace(['"', '\\'], "'"));
            if let Ok(v) = http::HeaderValue::from_str(&text) {
                r.headers_mut().append(http::header::WARNING, v);
            }
        }
        Ok(r)
    }

    /// Who sent a request: its bearer token's identity (a ServiceAccount's only while that
    /// account exists), else its client certificate's subject (verified against Orrery's CA
    /// by the TLS layer: CN is the user, each O a group, as in Kubernetes).
    pub fn authenticate(
        &self,
        headers: &http::HeaderMap,
        extensions: &http::Extensions,
    ) -> ApiResult<Identity> {
        let header = headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        if header.is_none()
            && let Some(cert) = extensions.get::<crate::auth::ClientCert>()
        {
            return Ok(Identity::User {
                name: cert.user.clone(),
                groups: cert.groups.clone(),
            });
        }
        let who = self.auth.authenticate(header)?;
        if let Identity::ServiceAccount {
            namespace,
            name,
            uid,
        } = &who
            && !self.authz.service_account_is(namespace, name, uid)
        {
            return Err(ApiError::unauthorized());
        }
        Ok(who)
    }

    async fn dispatch<B>(
        self: &Arc<Self>,
        req: Request<B>,
        who: &Identity,
    ) -> ApiResult<Response<Body>>
    where
        B: hyper::body::Body<Data = Bytes>,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let (parts, body) = req.into_parts();
        let path = parts.uri.path().trim_end_matches('/').to_string();
        let query = Query::parse(parts.uri.query());
        let segments: Vec<&str> = path.split('/').skip(1).collect();
        let reg = self.resources.snapshot();
        let route = routes::route(&path);
        // Discovery, OpenAPI, the version and metrics are non-resource URLs: RBAC's
        // `nonResourceURLs` rules decide (system:discovery grants the first three to everyone).
        if matches!(
            route,
            Some(
                Route::Metrics
                    | Route::Version
                    | Route::Discovery
                    | Route::OpenApiV2
                    | Route::OpenApiV3
                    | Route::OpenApiV3Doc
            )
        ) {
            let verb = parts.method.as_str().to_ascii_lowercase();
            self.authz.authorize_path(who, &verb, &path)?;
            read_only(&parts.method, &path)?;
        }
        match (route, segments.as_slice()) {
            (Some(Route::Metrics), _) => self.metrics_page(&parts),
            (Some(Route::Version), _) => Ok(h::json(StatusCode::OK, &discovery::version())),
            (Some(Route::Discovery), segments) => self.discovery(&parts, &reg, segments),
            (Some(Route::OpenApiV2), _) => self.openapi_v2(&parts, &reg),
            (Some(Route::OpenApiV3), _) => Ok(h::json(
                StatusCode::OK,
                &openapi::v3_index(&reg, &self.schemas.set(), &self.openapi),
            )),
            (Some(Route::OpenApiV3Doc), ["openapi", "v3", rest @ ..]) => {
                self.openapi_v3(&reg, rest)
            }
            (Some(Route::Agent), _) => {
                let body = h::read_body(body, self.config.max_body_bytes).await?;
                crate::agent_api::serve(self, who, &parts.method, parts.uri.path(), body).await
            }
            (Some(Route::Dro), _) => {
                let body = h::read_body(body, self.config.max_body_bytes).await?;
                Ok(self.dro(&parts, who, body).await)
            }
            (None, ["api", "v1", rest @ ..]) => {
                self.resource(&parts, body, who, "", "v1", rest, query)
                    .await
            }
            (Some(Route::Review), ["apis", group, version, plural]) => {
                let kind = crate::reviews::kind_at(group, version, plural).ok_or_else(not_found)?;
                if parts.method != Method::POST {
                    return Err(ApiError::method_not_allowed(format!(
                        "{} supports only create",
                        kind.plural
                    )));
                }
                let body = h::read_body(body, self.config.max_body_bytes).await?;
                self.review(&parts, who, kind, body)
            }
            (None, ["apis", group, version, rest @ ..]) => {
                self.resource(&parts, body, who, group, version, rest, query)
                    .await
            }
            _ => Err(not_found()),
        }
    }

    /// `/metrics`: the registry's families, with the caches' and the seats' figures of now,
    /// as OpenMetrics or the Prometheus text format.
    fn metrics_page(&self, parts: &http::request::Parts) -> ApiResult<Response<Body>> {
        self.metrics.cache(
            "tokens",
            self.auth.out_of_step().is_none(),
            self.auth.health().counts(),
        );
        self.metrics.cache(
            "rbac",
            self.authz.out_of_step().is_none(),
            self.authz.health_counts(),
        );
        for (kind, seats) in [
            ("readOnly", &self.in_flight.0),
            ("mutating", &self.in_flight.1),
        ] {
            if let Some(seats) = seats {
                self.metrics.seats(kind, seats);
            }
        }
        let text = self
            .metrics
            .render()
            .map_err(|e| ApiError::internal(e.to_string()))?;
        let accept = parts
            .headers
            .get(http::header::ACCEPT)
            .and_then(|v| v.to_str().ok());
        let (text, ct) = if crate::metrics::wants_openmetrics(accept) {
            (text, crate::metrics::OPENMETRICS)
        } else {
            (
                crate::metrics::to_prometheus_text(&text),
                crate::metrics::PROMETHEUS_TEXT,
            )
        };
        let mut r = Response::new(h::full(text));
        r.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static(ct),
        );
        Ok(r)
    }

    /// `/api`, `/apis` (aggregated when asked for), and a group's or group version's
    /// resources.
    fn discovery(
        &self,
        parts: &http::request::Parts,
        reg: &crate::resources::Registry,
        segments: &[&str],
    ) -> ApiResult<Response<Body>> {
        match segments {
            ["api"] => Ok(match h::wants_aggregated_discovery(&parts.headers) {
                Some(ct) => h::json_typed(
                    StatusCode::OK,
                    &discovery::aggregated(reg, true, discovery_api_version(ct)),
                    ct,
                ),
                None => h::json(
                    StatusCode::OK,
                    &discovery::api_versions(&self.config.server_address),
                ),
            }),
            ["apis"] => Ok(match h::wants_aggregated_discovery(&parts.headers) {
                Some(ct) => h::json_typed(
                    StatusCode::OK,
                    &discovery::aggregated(reg, false, discovery_api_version(ct)),
                    ct,
                ),
                None => h::json(StatusCode::OK, &discovery::group_list(reg)),
            }),
            ["api", "v1"] => discovery::resource_list(reg, "", "v1")
                .map(|v| h::json(StatusCode::OK, &v))
                .ok_or_else(not_found),
            ["apis", group] => discovery::group(reg, group)
                .map(|v| h::json(StatusCode::OK, &v))
                .ok_or_else(not_found),
            ["apis", group, version] => discovery::resource_list(reg, group, version)
                .map(|v| h::json(StatusCode::OK, &v))
                .ok_or_else(not_found),
            _ => Err(not_found()),
        }
    }

    /// `/openapi/v2`: protobuf when asked for (what client-go reads), else JSON.
    fn openapi_v2(
        &self,
        parts: &http::request::Parts,
        reg: &crate::resources::Registry,
    ) -> ApiResult<Response<Body>> {
        let accepted = h::accept(&parts.headers);
        let set = self.schemas.set();
        if accepted
            .iter()
            .any(|m| m.essence == crate::openapi_v2pb::MEDIA_TYPE)
        {
            // What client-go asks for (and the only form it reads).
            let doc = self.openapi.get_or_build_bytes("v2pb", || {
                crate::openapi_v2pb::encode(&openapi::v2_document(reg, &set))
            });
            let mut r = Response::new(h::full(doc.bytes.clone()));
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static(crate::openapi_v2pb::CONTENT_TYPE),
            );
            return Ok(r);
        }
        let accepts_json = accepted.is_empty()
            || accepted.iter().any(|m| {
                matches!(
                    m.essence.as_str(),
                    "application/json" | "*/*" | "application/*"
                )
            });
        if !accepts_json {
            return Err(ApiError::not_acceptable(
                "the OpenAPI v2 document is served as application/json or as protobuf",
            ));
        }
        let doc = self
            .openapi
            .get_or_build("v2", || openapi::v2_document(reg, &set));
        Ok(bytes_json(doc.bytes.clone()))
    }

    /// `/openapi/v3/api/v1`, `/openapi/v3/apis/<group>/<version>`: a group version's document.
    fn openapi_v3(
        &self,
        reg: &crate::resources::Registry,
        rest: &[&str],
    ) -> ApiResult<Response<Body>> {
        let (group, version) = match rest {
            ["api", v] => ("", *v),
            ["apis", g, v] => (*g, *v),
            _ => return Err(not_found()),
        };
        if reg.in_group_version(group, version).is_empty() {
            return Err(not_found());
        }
        let set = self.schemas.set();
        let key = openapi::gv_path(group, version);
        let doc = self.openapi.get_or_build(&key, || {
            openapi::v3_document(reg, &set, group, version).unwrap_or_default()
        });
        Ok(bytes_json(doc.bytes.clone()))
    }

    /// The DRO-DS API; the operations the call runs are audited with where it came from.
    async fn dro(
        self: &Arc<Self>,
        parts: &http::request::Parts,
        who: &Identity,
        body: Bytes,
    ) -> Response<Body> {
        let origin = crate::registry::RequestOrigin {
            source_ips: parts
                .extensions
                .get::<crate::audit::Peer>()
                .map(|p| vec![p.0.ip().to_string()])
                .unwrap_or_default(),
            user_agent: parts
                .headers
                .get(http::header::USER_AGENT)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string(),
        };
        let served = crate::dro::serve(
            self,
            who,
            &parts.method,
            &parts.headers,
            parts.uri.path(),
            parts.uri.query().unwrap_or(""),
            body,
        );
        crate::registry::ORIGIN.scope(origin, served).await
    }

    /// A review (`SubjectAccessReview` and its kin): authorized as a create of its kind,
    /// answered at once, never stored.
    fn review(
        &self,
        parts: &http::request::Parts,
        who: &Identity,
        kind: &crate::reviews::ReviewKind,
        body: Bytes,
    ) -> ApiResult<Response<Body>> {
        self.authz.authorize(
            who,
            &crate::auth::Attributes {
                verb: "create",
                group: kind.group,
                resource: kind.plural,
                ..Default::default()
            },
        )?;
        let v = if body.is_empty() {
            serde_json::json!({})
        } else {
            crate::registry::decode_body(
                &crate::registry::Envelope::of(&parts.headers),
                &body,
                &kind.schema(),
            )?
            .0
        };
        let answer = crate::reviews::review(&self.authz, kind, who, &v)?;
        Ok(h::json(StatusCode::CREATED, &answer))
    }

    #[allow(clippy::too_many_arguments)]
    async fn resource<B>(
        self: &Arc<Self>,
        parts: &http::request::Parts,
        body: B,
        who: &Identity,
        group: &str,
        version: &str,
        rest: &[&str],
        query: Query,
    ) -> ApiResult<Response<Body>>
    where
        B: hyper::body::Body<Data = Bytes>,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let reg = self.resources.snapshot();
        let target = crate::registry::parse_target(&reg, group, version, rest)?;
        let request = rest::Request {
            target,
            representation: h::representation(&parts.headers)?,
            envelope: crate::registry::Envelope::of(&parts.headers),
            query,
        };
        rest::serve(self, who, request, &parts.method, body).await
    }
}

fn discovery_api_version(content_type: &str) -> &'static str {
    if content_type == h::DISCOVERY_V2_BETA1 {
        "apidiscovery.k8s.io/v2beta1"
    } else {
        "apidiscovery.k8s.io/v2"
    }
}

fn bytes_json(bytes: Vec<u8>) -> Response<Body> {
    let mut r = Response::new(h::full(bytes));
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(h::JSON),
    );
    r
}

fn not_found() -> ApiError {
    ApiError::new(
        404,
        "NotFound",
        "the server could not find the requested resource",
    )
}

/// A quick JSON body for tests and tools.
pub fn json_body(v: serde_json::Value) -> http_body_util::Full<Bytes> {
    http_body_util::Full::new(Bytes::from(serde_json::to_vec(&v).unwrap_or_default()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::ApiConfig;
    use crate::auth::Authenticator;
    use orrery_store::Store;
    use tokio::sync::watch;

    /// Beyond the requests served at once, others wait in their user's queue and then are
    /// told to come back; each priority level keeps its seats (a user holding every seat of
    /// theirs leaves the agents theirs); `system:masters` and watches are not counted, and
    /// read-only and mutating requests have seats of their own.
    #[tokio::test]
    async fn requests_beyond_the_in_flight_limit_are_told_to_come_back() {
        use crate::fairness::Level;
        let dir = tempfile::tempdir().expect("tempdir");
        let store: Arc<dyn Store> = Arc::new(
            orrery_store_sqlite::SqliteStore::open_dir(dir.path()).expect("open the store"),
        );
        let auth = Authenticator::start(store.clone()).await.expect("auth");
        let (_tx, shutdown) = watch::channel(false);
        let config = ApiConfig {
            // 10 seats of each kind: 5 for agents, 1 for leader election, 4 for users.
            max_in_flight: (10, 10),
            max_watches_per_user: 1,
            max_queued_per_user: 2,
            queue_timeout: std::time::Duration::from_millis(300),
            ..ApiConfig::default()
        };
        let app = App::new(store, auth.clone(), config, shutdown)
            .await
            .expect("app");
        let token = |who: Identity| {
            let auth = auth.clone();
            async move { auth.issue(&who, "t", None).await.expect("a token") }
        };
        let agent = token(Identity::Cluster {
            name: "east".into(),
        })
        .await;
        let admin = token(Identity::Admin {
            name: "admin".into(),
        })
        .await;
        let alice = token(Identity::User {
            name: "alice".into(),
            groups: vec![],
        })
        .await;
        let call = |method: &str, uri: &str, token: &str| {
            let app = app.clone();
            let req = Request::builder()
                .method(method)
                .uri(uri)
                .header(http::header::AUTHORIZATION, format!("Bearer {token}"))
                .header(http::header::CONTENT_TYPE, "application/merge-patch+json")
                .body(json_body(serde_json::json!({"status": {}})))
                .expect("a request");
            async move { app.handle(req).await }
        };
        let status_of_east = "/apis/multicluster.io/v1alpha1/clusters/east/status";
        let works = "/apis/multicluster.io/v1alpha1/namespaces/orrery-cluster-east/works";
        let cms = "/api/v1/namespaces/default/configmaps";
        let (reads, writes) = (
            app.in_flight.0.clone().expect("read seats"),
            app.in_flight.1.clone().expect("mutating seats"),
        );
        // Users hold every mutating seat of theirs.
        let mut held = Vec::new();
        for i in 0..4 {
            held.push(
                writes
                    .acquire(Level::Workload, &format!("u{i}"))
                    .await
                    .expect("a seat"),
            );
        }
        // Alice waits in her queue, then is told to come back.
        let started = std::time::Instant::now();
        let r = call("POST", cms, &alice).await;
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(started.elapsed() >= std::time::Duration::from_millis(300));
        assert_eq!(
            r.headers()
                .get(http::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok()),
            Some("1")
        );
        // The agent's status write has its level's seats (404: east was never registered),
        // and the admin is never counted.
        assert_eq!(
            call("PATCH", status_of_east, &agent).await.status(),
            StatusCode::NOT_FOUND
        );
        assert_ne!(
            call("PATCH", status_of_east, &admin).await.status(),
            StatusCode::TOO_MANY_REQUESTS
        );
        // Reads have seats of their own (403: alice may read nothing).
        assert_eq!(
            call("GET", cms, &alice).await.status(),
            StatusCode::FORBIDDEN
        );
        // A freed seat goes to whoever waits: alice's next write is served once one is.
        let app2 = app.clone();
        let alice2 = alice.clone();
        let waiting = tokio::spawn(async move {
            let req = Request::builder()
                .method("POST")
                .uri(cms)
                .header(http::header::AUTHORIZATION, format!("Bearer {alice2}"))
                .body(json_body(serde_json::json!({})))
                .expect("a request");
            app2.handle(req).await.status()
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        drop(held.pop());
        assert_eq!(waiting.await.expect("served"), StatusCode::FORBIDDEN);
        drop(held);
        // Agents borrow what users leave idle: all ten read seats; then one more waits.
        let mut agents = Vec::new();
        for i in 0..10 {
            agents.push(
                reads
                    .acquire(Level::System, &format!("c{i}"))
                    .await
                    .expect("a seat"),
            );
        }
        assert_eq!(
            call("GET", works, &agent).await.status(),
            StatusCode::TOO_MANY_REQUESTS
        );
        // A watch is still served.
        assert_eq!(
            call("GET", &format!("{works}?watch=true"), &agent)
                .await
                .status(),
            StatusCode::OK
        );
        drop(agents);
        // Watches: counted per user while their streams are open.
        let first = call("GET", &format!("{works}?watch=true"), &agent).await;
        let second = call("GET", &format!("{works}?watch=true"), &agent).await;
        assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(
            String::from_utf8_lossy(
                &http_body_util::BodyExt::collect(second.into_body())
                    .await
                    .expect("a body")
                    .to_bytes()
            )
            .contains("holds 1 watches already")
        );
        drop(first);
        assert_eq!(
            call("GET", &format!("{works}?watch=true"), &agent)
                .await
                .status(),
            StatusCode::OK
        );
    }

    /// The token and RBAC caches follow the store with the project's reflector: while their
    /// watches cannot start (etcd electing a leader, say), `/readyz` says the caches are out
    /// of step (a revoked token or a removed binding would still be honoured), and `/metrics`
    /// counts the failures; once watches start again, ready.
    #[tokio::test]
    async fn readyz_says_when_a_security_cache_is_out_of_step() {
        use std::sync::atomic::Ordering;
        let dir = tempfile::tempdir().expect("tempdir");
        let sqlite: Arc<dyn Store> = Arc::new(
            orrery_store_sqlite::SqliteStore::open_dir(dir.path()).expect("open the store"),
        );
        let lagging = Arc::new(orrery_store_testkit::lagging::Lagging::new(sqlite));
        lagging.refuse_watches.store(true, Ordering::Release);
        let store: Arc<dyn Store> = lagging.clone();
        let auth = Authenticator::start(store.clone()).await.expect("auth");
        let (_tx, shutdown) = watch::channel(false);
        let app = App::new(store, auth.clone(), ApiConfig::default(), shutdown)
            .await
            .expect("app");
        let admin = auth
            .issue(
                &Identity::Admin {
                    name: "admin".into(),
                },
                "admin",
                None,
            )
            .await
            .expect("a token");
        let get = |path: &str| {
            let req = Request::builder()
                .uri(path)
                .header(http::header::AUTHORIZATION, format!("Bearer {admin}"))
                .body(json_body(serde_json::Value::Null))
                .expect("a request");
            let app = app.clone();
            async move {
                let r = app.handle(req).await;
                let code = r.status();
                let body = http_body_util::BodyExt::collect(r.into_body())
                    .await
                    .expect("a body")
                    .to_bytes();
                (code, String::from_utf8_lossy(&body).into_owned())
            }
        };
        // Listed, but not watching: out of step once the tolerance has passed.
        tokio::time::sleep(crate::app::CACHE_TOLERANCE + std::time::Duration::from_millis(500))
            .await;
        let (code, body) = get("/readyz").await;
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert!(body.contains("the token cache is out of step"), "{body}");
        assert!(body.contains("watches refused by the test"), "{body}");
        let (_, metrics) = get("/metrics").await;
        assert!(
            metrics.contains("orrery_cache_in_step{cache=\"tokens\"} 0"),
            "{metrics}"
        );
        assert!(
            metrics.lines().any(
                |l| l.starts_with("orrery_cache_failures_total{cache=\"rbac\"}")
                    && !l.ends_with(" 0")
            ),
            "{metrics}"
        );
        // Watches again: in step, ready.
        lagging.refuse_watches.store(false, Ordering::Release);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
        loop {
            let (code, body) = get("/readyz").await;
            if code == StatusCode::OK {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "still not ready: {body}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    /// A body that does not arrive within the body timeout is answered 408, holding no seat
    /// meanwhile: the other requests are served while it trickles.
    #[tokio::test]
    async fn a_slow_body_gets_408_and_holds_no_seat() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store: Arc<dyn Store> = Arc::new(
            orrery_store_sqlite::SqliteStore::open_dir(dir.path()).expect("open the store"),
        );
        let auth = Authenticator::start(store.clone()).await.expect("auth");
        let (_tx, shutdown) = watch::channel(false);
        let config = ApiConfig {
            max_in_flight: (10, 10),
            request_body_timeout: std::time::Duration::from_secs(1),
            queue_timeout: std::time::Duration::from_millis(100),
            ..ApiConfig::default()
        };
        let app = App::new(store, auth.clone(), config, shutdown)
            .await
            .expect("app");
        let alice = auth
            .issue(
                &Identity::User {
                    name: "alice".into(),
                    groups: vec![],
                },
                "t",
                None,
            )
            .await
            .expect("a token");
        // Bodies that never end: one byte, then nothing.
        let slow = |app: Arc<App>, alice: String| async move {
            let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(1);
            let body = http_body_util::StreamBody::new(futures_util::stream::unfold(
                rx,
                |mut rx| async move {
                    rx.recv().await.map(|b| {
                        (
                            Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(b)),
                            rx,
                        )
                    })
                },
            ));
            let _ = tx.try_send(Bytes::from_static(b"{"));
            let req = Request::builder()
                .method("POST")
                .uri("/api/v1/namespaces/default/configmaps")
                .header(http::header::AUTHORIZATION, format!("Bearer {alice}"))
                .body(body)
                .expect("a request");
            let r = app.handle(req).await;
            drop(tx);
            r.status()
        };
        let started = std::time::Instant::now();
        let slow_ones: Vec<_> = (0..20)
            .map(|_| tokio::spawn(slow(app.clone(), alice.clone())))
            .collect();
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        // Twenty slow bodies from alice, four seats for users: her quick request is served
        // meanwhile (403: she may write nothing), not queued behind them.
        let quick = Request::builder()
            .method("POST")
            .uri("/api/v1/namespaces/default/configmaps")
            .header(http::header::AUTHORIZATION, format!("Bearer {alice}"))
            .body(json_body(serde_json::json!({})))
            .expect("a request");
        assert_eq!(app.handle(quick).await.status(), StatusCode::FORBIDDEN);
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        for t in slow_ones {
            assert_eq!(t.await.expect("answered"), StatusCode::REQUEST_TIMEOUT);
        }
        assert!(started.elapsed() >= std::time::Duration::from_secs(1));
    }
}
