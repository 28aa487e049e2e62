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
            &json!({ "code": self.code, "message": self.message, "details": *self.details }),
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

/// Serves one DRO-DS request (the path after `/api/v1/`).
pub async fn serve(
    app: &std::sync::Arc<App>,
    who: &Identity,
    method: &Method,
    headers: &http::HeaderMap,
    rest: &[&str],
    query: &str,
    body: Bytes,
) -> Response<Body> {
    let json_body = || require_json(headers);
    let result = match (method, rest) {
        (&Method::GET, ["clusters"]) => clusters::list(app, who).await,
        (&Method::POST, ["clusters"]) => match json_body() {
            Ok(()) => clusters::register(app, who, &body).await,
            Err(e) => Err(e),
        },
        (_, ["clusters"]) => Err(method_not_allowed("GET, POST")),
        (&Method::DELETE, ["clusters", name]) => clusters::unregister(app, who, name).await,
        (_, ["clusters", _]) => Err(method_not_allowed("DELETE")),
        (&Method::GET, ["propagationpolicies"]) => policies::list(app, who).await,
        (&Method::POST, ["propagationpolicies"]) => match json_body() {
            Ok(()) => policies::create(app, who, &body).await,
            Err(e) => Err(e),
        },
        (_, ["propagationpolicies"]) => Err(method_not_allowed("GET, POST")),
        (&Method::GET, ["propagationpolicies", name]) => policies::get(app, who, name).await,
        (&Method::PATCH, ["propagationpolicies", name]) => {
            policies::patch(app, who, headers, name, &body).await
        }
        (&Method::DELETE, ["propagationpolicies", name]) => policies::delete(app, who, name).await,
        (_, ["propagationpolicies", _]) => Err(method_not_allowed("GET, PATCH, DELETE")),
        (&Method::POST, ["bindings"]) => match json_body() {
            Ok(()) => bindings::submit(app, who, &body).await,
            Err(e) => Err(e),
        },
        (_, ["bindings"]) => Err(method_not_allowed("POST")),
        (&Method::GET, ["bindings", id, "status"]) => bindings::status(app, who, id).await,
        (_, ["bindings", _, "status"]) => Err(method_not_allowed("GET")),
        (&Method::DELETE, ["bindings", id]) => bindings::delete(app, who, id).await,
        (_, ["bindings", _]) => Err(method_not_allowed("DELETE")),
        (&Method::PUT, ["metrics"]) => match json_body() {
            Ok(()) => monitor::metrics(app, who, &body).await,
            Err(e) => Err(e),
        },
        (_, ["metrics"]) => Err(method_not_allowed("PUT")),
        (&Method::POST, ["metrics", "events"]) => match json_body() {
            Ok(()) => monitor::event(app, who, &body).await,
            Err(e) => Err(e),
        },
        (_, ["metrics", "events"]) => Err(method_not_allowed("POST")),
        (&Method::PUT, ["sync", "configs"]) => match json_body() {
            Ok(()) => monitor::configs(app, who, &body).await,
            Err(e) => Err(e),
        },
        (_, ["sync", "configs"]) => Err(method_not_allowed("PUT")),
        (&Method::POST, ["sync", "batch"]) => match json_body() {
            Ok(()) => sync::batch(app, who, &body).await,
            Err(e) => Err(e),
        },
        (_, ["sync", "batch"]) => Err(method_not_allowed("POST")),
        (&Method::GET, ["monitor", "realtime"]) => monitor::realtime(app, who).await,
        (&Method::GET, ["monitor", "history"]) => monitor::series(app, who, query).await,
        (&Method::GET, ["monitor", "forecast"]) => forecast::forecast(app, who, query).await,
        (_, ["monitor", "realtime" | "history" | "forecast"]) => Err(method_not_allowed("GET")),
        (&Method::GET, ["history", "schedules"]) => history::schedules(app, who, query).await,
        (&Method::GET, ["history", "failures"]) => monitor::failures(app, who, query).await,
        (_, ["history", "schedules" | "failures"]) => Err(method_not_allowed("GET")),
        (&Method::GET, ["openapi.json"]) => Ok(h::json(StatusCode::OK, &openapi::document())),
        (_, ["openapi.json"]) => Err(method_not_allowed("GET")),
        _ => Err(DroError::new(404, "NOT_FOUND", "no such endpoint")),
    };
    result.unwrap_or_else(|e| e.response())
}

#[cfg(test)]
mod tests {
    use super::*;

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
