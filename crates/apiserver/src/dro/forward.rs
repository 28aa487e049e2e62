//! DRO-DS calls that create, change or delete objects go through the Kubernetes REST handlers
//! with the caller's own credentials: the same admission, validation, authorization and
//! durability as `kubectl`, one source of truth with two views. Kubernetes `Status` errors
//! come back as DRO-DS errors.

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};

use super::DroError;
use crate::app::App;
use crate::auth::Identity;

/// What the Kubernetes handler answered.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub body: Value,
}

impl Reply {
    pub fn ok(&self) -> bool {
        self.status < 300
    }

    /// The object a successful call answered with.
    pub fn object(self) -> Result<orrery_api::Object, DroError> {
        serde_json::from_value(self.body).map_err(DroError::internal)
    }

    /// The reply if the call succeeded, else its DRO-DS error (see [`Reply::error`]).
    pub fn checked(
        self,
        not_found: &'static str,
        exists: &'static str,
        details: Value,
    ) -> Result<Reply, DroError> {
        if self.ok() {
            Ok(self)
        } else {
            Err(self.error(not_found, exists, details))
        }
    }

    /// The DRO-DS error for a failed call: `not_found` and `exists` name the codes for a
    /// missing object and a name already taken; `details` are added to what the Status says.
    pub fn error(&self, not_found: &'static str, exists: &'static str, details: Value) -> DroError {
        let reason = self.body["reason"].as_str().unwrap_or("");
        let code = match (self.status, reason) {
            (404, _) => not_found,
            (409, "AlreadyExists") => exists,
            (409, _) => "CONFLICT",
            (400 | 422, _) => "VALIDATION_FAILED",
            (401, _) => "UNAUTHORIZED",
            (403, _) => "FORBIDDEN",
            (413, _) => "PAYLOAD_TOO_LARGE",
            (415, _) => "UNSUPPORTED_MEDIA_TYPE",
            (429, _) => "TOO_MANY_REQUESTS",
            (503, _) => "UNAVAILABLE",
            _ => "INTERNAL",
        };
        let mut d = match details {
            Value::Object(m) => m,
            _ => serde_json::Map::new(),
        };
        if let Some(causes) = self.body["details"]["causes"].as_array() {
            d.insert(
                "fields".into(),
                json!(
                    causes
                        .iter()
                        .map(|c| json!({"field": c["field"], "message": c["message"]}))
                        .collect::<Vec<_>>()
                ),
            );
        }
        DroError {
            status: if code == "VALIDATION_FAILED" {
                400
            } else {
                self.status
            },
            allow: None,
            code,
            message: self.body["message"]
                .as_str()
                .unwrap_or("the request failed")
                .to_string(),
            details: Box::new(Value::Object(d)),
        }
    }
}

/// Calls the Kubernetes REST API at `path` as the caller of the DRO-DS request.
pub async fn call(
    app: &Arc<App>,
    who: &Identity,
    method: Method,
    path: &str,
    content_type: &str,
    body: Option<&Value>,
) -> Result<Reply, DroError> {
    let bytes = match body {
        Some(v) => Bytes::from(serde_json::to_vec(v).map_err(DroError::internal)?),
        None => Bytes::new(),
    };
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::CONTENT_TYPE, content_type)
        .header(http::header::ACCEPT, "application/json");
    let req = req.body(Full::new(bytes)).map_err(DroError::internal)?;
    let resp = app.kube_call(who, req).await;
    let status = resp.status().as_u16();
    let collected = resp
        .into_body()
        .collect()
        .await
        .map_err(DroError::internal)?;
    let raw = collected.to_bytes();
    let body = if raw.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&raw).map_err(DroError::internal)?
    };
    Ok(Reply { status, body })
}

/// Lists through the Kubernetes handlers and answers `{items, count}`, each item in the
/// DRO-DS shape `view` gives it.
pub async fn list(
    app: &Arc<App>,
    who: &Identity,
    path: &str,
    view: impl Fn(&orrery_api::Object) -> Value,
) -> Result<http::Response<crate::http::Body>, DroError> {
    let r = call(app, who, Method::GET, path, "application/json", None)
        .await?
        .checked("NOT_FOUND", "CONFLICT", json!({}))?;
    let items: Vec<Value> = r.body["items"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|o| serde_json::from_value::<orrery_api::Object>(o.clone()).ok())
                .map(|o| view(&o))
                .collect()
        })
        .unwrap_or_default();
    Ok(crate::http::json(
        http::StatusCode::OK,
        &json!({ "items": items, "count": items.len() }),
    ))
}
