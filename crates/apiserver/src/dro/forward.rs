//! DRO-DS calls that read, create, change or delete objects are registry operations
//! ([`crate::registry`]) on behalf of the caller: the same authorization, admission,
//! validation and durability as `kubectl`, one source of truth with two views. The registry's
//! errors become DRO-DS errors here, in one mapping.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method};
use serde_json::{Value, json};

use super::DroError;
use crate::app::App;
use crate::auth::Identity;
use crate::error::ApiError;
use crate::http::Query;
use crate::registry::{self, Operation};

/// What an operation answered: its status and JSON, or the registry's error.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    result: Result<Value, ApiError>,
}

impl Reply {
    pub fn ok(&self) -> bool {
        self.result.is_ok()
    }

    /// The answer's JSON (`Null` for an error).
    pub fn value(&self) -> &Value {
        self.result.as_ref().unwrap_or(&Value::Null)
    }

    /// The refusal's reason (`AlreadyExists`, `Conflict`...), if it was refused.
    pub fn reason(&self) -> Option<&'static str> {
        self.result.as_ref().err().map(|e| e.reason)
    }

    /// The object a successful call answered with.
    pub fn object(self) -> Result<orrery_api::Object, DroError> {
        serde_json::from_value(self.result.map_err(DroError::from)?).map_err(DroError::internal)
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
    /// missing object and a name already taken; `details` are added to the error's own (the
    /// fields a validation failure names).
    pub fn error(&self, not_found: &'static str, exists: &'static str, details: Value) -> DroError {
        let Err(e) = &self.result else {
            return DroError::internal("the call succeeded");
        };
        let mut out = DroError::from(e.clone());
        out.code = match (e.code, e.reason) {
            (404, _) => not_found,
            (409, "AlreadyExists") => exists,
            _ => out.code,
        };
        let mut d = match details {
            Value::Object(m) => m,
            _ => serde_json::Map::new(),
        };
        if let Some(fields) = out.details.get("fields") {
            d.insert("fields".into(), fields.clone());
        }
        out.details = Box::new(Value::Object(d));
        out
    }
}

/// Runs the registry operation a Kubernetes API path and method name (`POST
/// /apis/multicluster.io/v1alpha1/clusters`) as the caller of the DRO-DS request.
pub async fn call(
    app: &Arc<App>,
    who: &Identity,
    method: Method,
    path: &str,
    content_type: &str,
    body: Option<&Value>,
) -> Result<Reply, DroError> {
    let (path, query) = path.split_once('?').unwrap_or((path, ""));
    let query = Query::parse(Some(query).filter(|q| !q.is_empty()));
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_str(content_type).map_err(DroError::internal)?,
    );
    let body_json = body;
    let body = match body {
        Some(v) => Bytes::from(serde_json::to_vec(v).map_err(DroError::internal)?),
        None => Bytes::new(),
    };
    let target = registry::target_of(app, path)?;
    let verb = crate::rest::verb(&method, &target, &query)?;
    let audited = target.clone();
    let result = async {
        let authorized = registry::authorize(app, who, &target, verb)?;
        let op = Operation {
            who,
            target,
            verb,
            query,
            headers: &headers,
            representation: crate::http::Representation::Json,
            body,
        };
        registry::operate(app, op, authorized).await
    }
    .await;
    let reply = match result {
        Ok(out) => Reply {
            status: out.status.as_u16(),
            result: Ok(out.into_value()),
        },
        Err(e) => Reply {
            status: e.code,
            result: Err(e),
        },
    };
    registry::audit(
        app,
        who,
        verb.as_str(),
        &audited,
        reply.status,
        body_json,
        reply.result.as_ref().ok(),
    )
    .await;
    Ok(reply)
}

/// Lists what a Kubernetes API path names (with its selectors) and answers `{items, count}`,
/// each item in the DRO-DS shape `view` gives it.
pub async fn list(
    app: &Arc<App>,
    who: &Identity,
    path: &str,
    view: impl Fn(&orrery_api::Object) -> Value,
) -> Result<http::Response<crate::http::Body>, DroError> {
    let (path, query) = path.split_once('?').unwrap_or((path, ""));
    let query = Query::parse(Some(query).filter(|q| !q.is_empty()));
    let target = registry::target_of(app, path)?;
    let listed = registry::list(app, who, target.clone(), query).await;
    let code = listed.as_ref().map_or_else(|e| e.code, |_| 200);
    registry::audit(app, who, "list", &target, code, None, None).await;
    let items: Vec<Value> = listed?.iter().map(view).collect();
    Ok(crate::http::json(
        http::StatusCode::OK,
        &json!({ "items": items, "count": items.len() }),
    ))
}
