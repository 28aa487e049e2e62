//! The DRO-DS REST API of the draft (section 6) under `/api/v1/`: the same store seen through
//! the draft's shapes. Every error is `{"code", "message", "details"}` with a stable code.
//!
//! These paths share `/api/v1` with the Kubernetes core group, whose resources Orrery serves at
//! other names (`/api/v1/namespaces/...`, `/api/v1/nodes`), so the first segment decides.

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use serde_json::{Value, json};

use crate::app::App;
use crate::auth::Identity;
use crate::error::ApiError;
use crate::http::{self as h, Body};

mod answers;
pub mod backfill;
mod bindings;
pub(crate) mod clusters;
mod forecast;
mod forward;
mod history;
mod monitor;
pub mod openapi;
mod policies;
mod sync;

/// Most objects one `POST /api/v1/sync/batch` may carry.
pub const MAX_BATCH: usize = 1000;

pub use crate::routes::is_dro_path;

/// A DRO-DS error: HTTP status, stable code, message, details.
#[derive(Clone, Debug, PartialEq)]
pub struct DroError {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
    /// Boxed: errors travel in every `Result` and should stay small.
    pub details: Box<Value>,
    /// For 405: the methods the endpoint takes (the `Allow` header).
    pub allow: Option<&'static str>,
}

impl DroError {
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> Self {
        DroError {
            status,
            code,
            message: message.into(),
            details: Box::new(json!({})),
            allow: None,
        }
    }

    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Box::new(details);
        self
    }

    /// A fault of the server.
    pub fn internal(e: impl std::fmt::Display) -> Self {
        DroError::new(500, "INTERNAL", e.to_string())
    }

    /// No Cluster of that name (`details.clusterName`).
    pub fn cluster_not_found(name: &str) -> Self {
        DroError::new(
            404,
            "CLUSTER_NOT_FOUND",
            format!("no cluster {name:?} is registered"),
        )
        .with_details(json!({ "clusterName": name }))
    }

    pub fn validation(message: impl Into<String>) -> Self {
        DroError::new(400, "VALIDATION_FAILED", message)
    }

    pub fn response(&self) -> Response<Body> {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut r = h::json(
            status,
            // Strings and a JSON value: serializing cannot fail.
            &serde_json::to_value(answers::ErrorBody {
                code: self.code,
                message: &self.message,
                details: &self.details,
            })
            .unwrap_or_default(),
        );
        if let Some(allow) = self.allow {
            r.headers_mut()
                .insert(http::header::ALLOW, http::HeaderValue::from_static(allow));
        }
        if self.status == 429 {
            r.headers_mut().insert(
                http::header::RETRY_AFTER,
                http::HeaderValue::from_static("1"),
            );
        }
        r
    }
}

impl From<ApiError> for DroError {
    fn from(e: ApiError) -> Self {
        let code = match (e.code, e.reason) {
            (401, _) => "UNAUTHORIZED",
            (403, _) => "FORBIDDEN",
            (404, _) => "NOT_FOUND",
            (409, _) => "CONFLICT",
            (413, _) => "PAYLOAD_TOO_LARGE",
            (415, _) => "UNSUPPORTED_MEDIA_TYPE",
            (400 | 422, _) => "VALIDATION_FAILED",
            (405, _) => "METHOD_NOT_ALLOWED",
            (429, _) => "TOO_MANY_REQUESTS",
            (503, _) => "UNAVAILABLE",
            _ => "INTERNAL",
        };
        let mut details = serde_json::Map::new();
        if let Some(d) = &e.details {
            if let Some(n) = &d.name {
                details.insert("name".into(), json!(n));
            }
            if !d.causes.is_empty() {
                details.insert(
                    "fields".into(),
                    json!(
                        d.causes
                            .iter()
                            .map(|c| json!({"field": c.field, "message": c.message}))
                            .collect::<Vec<_>>()
                    ),
                );
            }
        }
        DroError {
            // One status per code: a validation failure is a 400 wherever it was found.
            status: if code == "VALIDATION_FAILED" {
                400
            } else {
                e.code
            },
            code,
            message: e.message,
            details: Box::new(Value::Object(details)),
            allow: None,
        }
    }
}

/// The error response for a DRO-DS path (also for failures before routing, like a bad token).
pub fn error_response(e: &ApiError) -> Response<Body> {
    DroError::from(e.clone()).response()
}

fn require_json(headers: &http::HeaderMap) -> Result<(), DroError> {
    let ct = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    let base = ct.split(';').next().unwrap_or("").trim();
    if base.eq_ignore_ascii_case("application/json") {
        Ok(())
    } else {
        Err(DroError::new(
            415,
            "UNSUPPORTED_MEDIA_TYPE",
            format!("expected application/json, got {ct:?}"),
        ))
    }
}

fn method_not_allowed(allowed: &'static str) -> DroError {
    let mut e = DroError::new(
        405,
        "METHOD_NOT_ALLOWED",
        format!("this endpoint takes {allowed}"),
    );
    e.allow = Some(allowed);
    e
}

/// A DRO-DS endpoint: one path of the draft's API (section 6), whatever the method.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Endpoint {
    Clusters,
    Cluster,
    Policies,
    Policy,
    Bindings,
    Binding,
    BindingStatus,
    Metrics,
    Events,
    Configs,
    Batch,
    Realtime,
    MonitorHistory,
    Forecast,
    MetricsHistory,
    Schedules,
    Failures,
    OpenApi,
}

/// The endpoints' paths, their parameters named as the OpenAPI document names them: a data
/// table, matched by `matchit`.
const ENDPOINTS: &[(&str, Endpoint)] = &[
    ("/api/v1/clusters", Endpoint::Clusters),
    ("/api/v1/clusters/{clusterName}", Endpoint::Cluster),
    ("/api/v1/propagationpolicies", Endpoint::Policies),
    ("/api/v1/propagationpolicies/{policyName}", Endpoint::Policy),
    ("/api/v1/bindings", Endpoint::Bindings),
    ("/api/v1/bindings/{bindingId}", Endpoint::Binding),
    (
        "/api/v1/bindings/{bindingId}/status",
        Endpoint::BindingStatus,
    ),
    ("/api/v1/metrics", Endpoint::Metrics),
    ("/api/v1/metrics/events", Endpoint::Events),
    ("/api/v1/metrics/history", Endpoint::MetricsHistory),
    ("/api/v1/sync/configs", Endpoint::Configs),
    ("/api/v1/sync/batch", Endpoint::Batch),
    ("/api/v1/monitor/realtime", Endpoint::Realtime),
    ("/api/v1/monitor/history", Endpoint::MonitorHistory),
    ("/api/v1/monitor/forecast", Endpoint::Forecast),
    ("/api/v1/history/schedules", Endpoint::Schedules),
    ("/api/v1/history/failures", Endpoint::Failures),
    ("/api/v1/openapi.json", Endpoint::OpenApi),
];

static TABLE: std::sync::LazyLock<matchit::Router<Endpoint>> = std::sync::LazyLock::new(|| {
    let mut r = matchit::Router::new();
    for (path, e) in ENDPOINTS {
        // The table is fixed and tested: a conflict is a bug found by the first test run.
        r.insert(*path, *e)
            .unwrap_or_else(|err| panic!("DRO-DS route {path}: {err}"));
    }
    r
});

/// Serves one DRO-DS request (`path` is the whole request path).
pub async fn serve(
    app: &std::sync::Arc<App>,
    who: &Identity,
    method: &Method,
    headers: &http::HeaderMap,
    path: &str,
    query: &str,
    body: Bytes,
) -> Response<Body> {
    let Ok(found) = TABLE.at(path.trim_end_matches('/')) else {
        return DroError::new(404, "NOT_FOUND", "no such endpoint").response();
    };
    let param = |name: &str| found.params.get(name).unwrap_or_default();
    let json_body = || require_json(headers);
    use Endpoint as E;
    let result = match (*found.value, method) {
        (E::Clusters, &Method::GET) => clusters::list(app, who).await,
        (E::Clusters, &Method::POST) => match json_body() {
            Ok(()) => clusters::register(app, who, &body).await,
            Err(e) => Err(e),
        },
        (E::Clusters, _) => Err(method_not_allowed("GET, POST")),
        (E::Cluster, &Method::DELETE) => clusters::unregister(app, who, param("clusterName")).await,
        (E::Cluster, _) => Err(method_not_allowed("DELETE")),
        (E::Policies, &Method::GET) => policies::list(app, who).await,
        (E::Policies, &Method::POST) => match json_body() {
            Ok(()) => policies::create(app, who, &body).await,
            Err(e) => Err(e),
        },
        (E::Policies, _) => Err(method_not_allowed("GET, POST")),
        (E::Policy, &Method::GET) => policies::get(app, who, param("policyName")).await,
        (E::Policy, &Method::PATCH) => {
            policies::patch(app, who, headers, param("policyName"), &body).await
        }
        (E::Policy, &Method::DELETE) => policies::delete(app, who, param("policyName")).await,
        (E::Policy, _) => Err(method_not_allowed("GET, PATCH, DELETE")),
        (E::Bindings, &Method::POST) => match json_body() {
            Ok(()) => bindings::submit(app, who, &body).await,
            Err(e) => Err(e),
        },
        (E::Bindings, _) => Err(method_not_allowed("POST")),
        (E::BindingStatus, &Method::GET) => bindings::status(app, who, param("bindingId")).await,
        (E::BindingStatus, _) => Err(method_not_allowed("GET")),
        (E::Binding, &Method::DELETE) => bindings::delete(app, who, param("bindingId")).await,
        (E::Binding, _) => Err(method_not_allowed("DELETE")),
        (E::Metrics, &Method::PUT) => match json_body() {
            Ok(()) => monitor::metrics(app, who, &body).await,
            Err(e) => Err(e),
        },
        (E::Metrics, _) => Err(method_not_allowed("PUT")),
        (E::MetricsHistory, &Method::POST) => match json_body() {
            Ok(()) => backfill::history(app, who, &body).await,
            Err(e) => Err(e),
        },
        (E::MetricsHistory, _) => Err(method_not_allowed("POST")),
        (E::Events, &Method::POST) => match json_body() {
            Ok(()) => monitor::event(app, who, &body).await,
            Err(e) => Err(e),
        },
        (E::Events, _) => Err(method_not_allowed("POST")),
        (E::Configs, &Method::PUT) => match json_body() {
            Ok(()) => monitor::configs(app, who, &body).await,
            Err(e) => Err(e),
        },
        (E::Configs, _) => Err(method_not_allowed("PUT")),
        (E::Batch, &Method::POST) => match json_body() {
            Ok(()) => sync::batch(app, who, &body).await,
            Err(e) => Err(e),
        },
        (E::Batch, _) => Err(method_not_allowed("POST")),
        (E::Realtime, &Method::GET) => monitor::realtime(app, who).await,
        (E::MonitorHistory, &Method::GET) => monitor::series(app, who, query).await,
        (E::Forecast, &Method::GET) => forecast::forecast(app, who, query).await,
        (E::Realtime | E::MonitorHistory | E::Forecast, _) => Err(method_not_allowed("GET")),
        (E::Schedules, &Method::GET) => history::schedules(app, who, query).await,
        (E::Failures, &Method::GET) => monitor::failures(app, who, query).await,
        (E::Schedules | E::Failures, _) => Err(method_not_allowed("GET")),
        (E::OpenApi, &Method::GET) => Ok(h::json(StatusCode::OK, &openapi::document())),
        (E::OpenApi, _) => Err(method_not_allowed("GET")),
    };
    result.unwrap_or_else(|e| e.response())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table and the OpenAPI document name the same paths, with the same parameters.
    #[test]
    fn the_endpoints_are_the_documented_paths() {
        let doc = openapi::document();
        let documented: std::collections::BTreeSet<&str> = doc["paths"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let served: std::collections::BTreeSet<&str> = ENDPOINTS.iter().map(|(p, _)| *p).collect();
        assert_eq!(documented, served);
        let at = |p: &str| TABLE.at(p).map(|m| *m.value).ok();
        assert_eq!(
            at("/api/v1/bindings/ns.web/status"),
            Some(Endpoint::BindingStatus)
        );
        assert_eq!(
            TABLE
                .at("/api/v1/clusters/east")
                .unwrap()
                .params
                .get("clusterName"),
            Some("east")
        );
        assert_eq!(at("/api/v1/clusters/east/extra"), None);
    }

    #[test]
    fn dro_paths() {
        assert!(is_dro_path("/api/v1/sync/batch"));
        assert!(!is_dro_path("/api/v1/namespaces/default/configmaps"));
        assert!(!is_dro_path("/api/v1/nodes"));
        assert!(!is_dro_path("/apis/apps/v1/deployments"));
    }

    #[test]
    fn errors_map_to_stable_codes() {
        let e = DroError::from(ApiError::unauthorized());
        assert_eq!((e.status, e.code), (401, "UNAUTHORIZED"));
        let e = DroError::from(ApiError::too_large(10));
        assert_eq!((e.status, e.code), (413, "PAYLOAD_TOO_LARGE"));
        let e = DroError::from(ApiError::internal("x"));
        assert_eq!((e.status, e.code), (500, "INTERNAL"));
    }
}
