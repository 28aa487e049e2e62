//! API errors, answered as Kubernetes `Status` objects with the reason and code clients expect.

use orrery_api::validation::FieldError;
use orrery_store::StoreError;
use serde_json::{Value, json};

use crate::resources::ResourceType;

/// One cause of a failure (`metav1.StatusCause`).
#[derive(Clone, Debug, PartialEq)]
pub struct Cause {
    pub reason: String,
    pub message: String,
    pub field: String,
}

/// An API failure: HTTP status code, `reason`, message, and optional details.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    /// Boxed: most errors have none, and errors travel in every `Result`.
    pub details: Option<Box<Details>>,
}

/// `metav1.StatusDetails`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Details {
    pub name: Option<String>,
    pub group: Option<String>,
    /// The resource (plural) or kind the details refer to.
    pub kind: Option<String>,
    pub causes: Vec<Cause>,
    pub retry_after_seconds: Option<u32>,
}

pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    /// The details, created on first use.
    pub fn details_mut(&mut self) -> &mut Details {
        self.details.get_or_insert_with(Box::default)
    }

    pub fn causes(&self) -> &[Cause] {
        self.details
            .as_ref()
            .map(|d| d.causes.as_slice())
            .unwrap_or(&[])
    }

    pub fn retry_after_seconds(&self) -> Option<u32> {
        self.details.as_ref().and_then(|d| d.retry_after_seconds)
    }

    fn about(mut self, rt: &ResourceType, name: &str) -> Self {
        let d = self.details_mut();
        d.name = Some(name.to_string());
        d.group = Some(rt.group.clone());
        d.kind = Some(rt.plural.clone());
        self
    }

    pub fn not_found(rt: &ResourceType, name: &str) -> Self {
        ApiError::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", rt.qualified()),
        )
        .about(rt, name)
    }

    pub fn already_exists(rt: &ResourceType, name: &str) -> Self {
        ApiError::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", rt.qualified()),
        )
        .about(rt, name)
    }

    pub fn conflict(rt: &ResourceType, name: &str, why: &str) -> Self {
        ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                rt.qualified()
            ),
        )
        .about(rt, name)
    }

    /// A stale write: the object changed since the client read it.
    pub fn stale(rt: &ResourceType, name: &str) -> Self {
        Self::conflict(
            rt,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 with one cause per field error, worded as Kubernetes words them.
    pub fn invalid(rt: &ResourceType, name: &str, errs: &[FieldError]) -> Self {
        let list: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
        let joined = if list.len() == 1 {
            list[0].clone()
        } else {
            format!("[{}]", list.join(", "))
        };
        let mut e = ApiError::new(
            422,
            "Invalid",
            format!("{} \"{name}\" is invalid: {joined}", rt.kind_qualified()),
        );
        let d = e.details_mut();
        d.name = Some(name.to_string());
        d.group = Some(rt.group.clone());
        d.kind = Some(rt.kind.clone());
        d.causes = errs
            .iter()
            .map(|fe| Cause {
                reason: fe.kind.reason().to_string(),
                message: fe.body(),
                field: fe.field.clone(),
            })
            .collect();
        e
    }

    /// 409 for a server-side apply that would change fields other managers own.
    pub fn apply_conflicts(
        rt: &ResourceType,
        name: &str,
        conflicts: &[crate::managed::Conflict],
    ) -> Self {
        let list: Vec<String> = conflicts
            .iter()
            .map(|c| {
                format!(
                    "conflict with {} using {}: {}",
                    c.manager, c.api_version, c.field
                )
            })
            .collect();
        let mut e = ApiError::new(
            409,
            "Conflict",
            format!(
                "Apply failed with {} conflict{}: {}",
                conflicts.len(),
                if conflicts.len() == 1 { "" } else { "s" },
                list.join("\n")
            ),
        )
        .about(rt, name);
        e.details_mut().causes = conflicts
            .iter()
            .map(|c| Cause {
                reason: "FieldManagerConflict".into(),
                message: format!("conflict with {} using {}", c.manager, c.api_version),
                field: c.field.clone(),
            })
            .collect();
        e
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(400, "BadRequest", message)
    }

    /// A well-formed request that cannot be carried out on this object (kube-apiserver's
    /// answer to a JSON patch operation that fails).
    pub fn unprocessable(message: impl Into<String>) -> Self {
        ApiError::new(422, "Invalid", message)
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        ApiError::new(405, "MethodNotAllowed", message)
    }

    pub fn not_acceptable(message: impl Into<String>) -> Self {
        ApiError::new(406, "NotAcceptable", message)
    }

    pub fn unsupported_media_type(content_type: &str) -> Self {
        ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/vnd.kubernetes.protobuf (got {content_type:?})"
            ),
        )
    }

    pub fn too_large(limit: usize) -> Self {
        ApiError::new(
            413,
            "RequestEntityTooLarge",
            format!("the request body is too large: the limit is {limit} bytes"),
        )
    }

    /// 410: the requested resource version is no longer available; re-list.
    pub fn expired(message: impl Into<String>) -> Self {
        ApiError::new(410, "Expired", message)
    }

    pub fn unauthorized() -> Self {
        ApiError::new(401, "Unauthorized", "Unauthorized")
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        ApiError::new(403, "Forbidden", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::new(
            500,
            "InternalError",
            format!("Internal error occurred: {}", message.into()),
        )
    }

    pub fn timeout(message: impl Into<String>) -> Self {
        let mut e = ApiError::new(504, "Timeout", message);
        e.details_mut().retry_after_seconds = Some(1);
        e
    }

    /// 429: come back in a second; nothing was done.
    pub fn too_many_requests(message: impl Into<String>) -> Self {
        let mut e = ApiError::new(429, "TooManyRequests", message);
        e.details_mut().retry_after_seconds = Some(1);
        e
    }

    pub fn service_unavailable(message: impl Into<String>) -> Self {
        ApiError::new(503, "ServiceUnavailable", message)
    }

    /// The store's answer, worded for the resource at hand.
    pub fn from_store(e: StoreError, rt: &ResourceType, name: &str) -> Self {
        match e {
            StoreError::NotFound { .. } => Self::not_found(rt, name),
            StoreError::AlreadyExists { .. } => Self::already_exists(rt, name),
            StoreError::Conflict { .. } => Self::stale(rt, name),
            StoreError::PreconditionFailed { message, .. } => {
                Self::conflict(rt, name, &format!("Precondition failed: {message}"))
            }
            other => Self::from(other),
        }
    }

    /// The `Status` object.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        let Some(d) = &self.details else {
            return status;
        };
        let mut details = serde_json::Map::new();
        if let Some(n) = &d.name {
            details.insert("name".into(), json!(n));
        }
        if let Some(g) = &d.group
            && !g.is_empty()
        {
            details.insert("group".into(), json!(g));
        }
        if let Some(k) = &d.kind {
            details.insert("kind".into(), json!(k));
        }
        if !d.causes.is_empty() {
            let causes: Vec<Value> = d
                .causes
                .iter()
                .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
                .collect();
            details.insert("causes".into(), Value::Array(causes));
        }
        if let Some(s) = d.retry_after_seconds {
            details.insert("retryAfterSeconds".into(), json!(s));
        }
        if !details.is_empty() {
            status["details"] = Value::Object(details);
        }
        status
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Expired {
                requested,
                compacted,
            } => ApiError::expired(format!(
                "too old resource version: {requested} ({compacted})"
            )),
            StoreError::FutureRevision { requested, current } => {
                let mut e = ApiError::timeout(format!(
                    "Too large resource version: {requested}, current: {current}"
                ));
                e.details_mut().causes.push(Cause {
                    reason: "ResourceVersionTooLarge".into(),
                    message: "Too large resource version".into(),
                    field: String::new(),
                });
                e
            }
            StoreError::InvalidContinue(m) => {
                ApiError::bad_request(format!("invalid continue token: {m}"))
            }
            StoreError::InvalidArgument(m) => ApiError::bad_request(m),
            StoreError::Closed => ApiError::service_unavailable("the server is shutting down"),
            StoreError::Fenced { .. } => {
                ApiError::service_unavailable("this server no longer leads; try again")
            }
            StoreError::Unavailable(m) => {
                let mut e = ApiError::service_unavailable(format!(
                    "the store cannot commit writes now ({m}); nothing was written, try again"
                ));
                e.details_mut().retry_after_seconds = Some(5);
                e
            }
            StoreError::Busy(m) => ApiError::too_many_requests(format!(
                "the store is overloaded ({m}); nothing was written, try again"
            )),
            StoreError::NotFound { key } => {
                ApiError::new(404, "NotFound", format!("{key} not found"))
            }
            StoreError::AlreadyExists { key } => {
                ApiError::new(409, "AlreadyExists", format!("{key} already exists"))
            }
            StoreError::Conflict { key, .. } => {
                ApiError::new(409, "Conflict", format!("conflict on {key}"))
            }
            StoreError::PreconditionFailed { message, .. } => {
                ApiError::new(409, "Conflict", message)
            }
            StoreError::Corrupt(m) | StoreError::Backend(m) => ApiError::internal(m),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a client is told when the store cannot take a write now: the status, and how long
    /// to wait before trying again.
    #[test]
    fn store_refusals_say_when_to_try_again() {
        let cases = [
            (
                StoreError::Busy("etcd: too many requests".into()),
                429,
                "TooManyRequests",
                Some(1),
            ),
            (
                StoreError::Unavailable("etcd: no leader".into()),
                503,
                "ServiceUnavailable",
                Some(5),
            ),
            (
                StoreError::Backend("disk".into()),
                500,
                "InternalError",
                None,
            ),
        ];
        for (err, code, reason, retry) in cases {
            let e = ApiError::from(err);
            assert_eq!((e.code, e.reason), (code, reason), "{e:?}");
            assert_eq!(e.retry_after_seconds(), retry, "{e:?}");
        }
    }
}
