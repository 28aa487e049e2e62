//! DRO-DS calls that read, create, change or delete objects are registry operations
//! ([`crate::registry`]) on behalf of the caller: the same authorization, admission,
//! validation and durability as `kubectl`, one source of truth with two views. The registry's
//! errors become DRO-DS errors here, in one mapping.

use std::sync::Arc;

use serde_json::Value;

use super::DroError;
use crate::app::App;
use crate::auth::Identity;
use crate::error::ApiError;
use crate::registry::{self, Input, Target};

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

/// Runs `input` on `target` (see [`registry::run`]) as the caller of the DRO-DS request, and
/// records it in the audit log as the registry operation it was.
pub async fn call(
    app: &Arc<App>,
    who: &Identity,
    target: Target,
    input: Input,
) -> Result<Reply, DroError> {
    let verb = input.verb();
    let audited = target.clone();
    let (body, result) = registry::run(app, who, target, input).await;
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
        body.as_ref(),
        reply.result.as_ref().ok(),
    )
    .await;
    Ok(reply)
}

/// Lists `target`'s objects (those `label_selector` selects, if given), audited as the
/// registry operation it is.
pub async fn list(
    app: &Arc<App>,
    who: &Identity,
    target: Target,
    label_selector: Option<&str>,
) -> Result<Vec<orrery_api::Object>, DroError> {
    let options = registry::Options::selecting(label_selector);
    let listed = registry::list(app, who, target.clone(), options).await;
    let code = listed.as_ref().map_or_else(|e| e.code, |_| 200);
    registry::audit(app, who, "list", &target, code, None, None).await;
    Ok(listed?)
}
