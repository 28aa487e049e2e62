//! The `scale` subresource (autoscaling/v1 Scale, so `kubectl scale` works), the namespace
//! `finalize` subresource, and a ServiceAccount's `token` (TokenRequest, so `kubectl create
//! token` works).

use bytes::Bytes;
use http::StatusCode;
use orrery_api::Object;
use orrery_api::labels::LabelSelector;
use orrery_api::validation::FieldError;
use orrery_store::{Preconditions, Revision, StoreError};
use serde_json::{Value, json};

use super::Outcome;
use super::write::{apply_patch, patch_type};
use super::{Call, decode_body};
use crate::error::{ApiError, ApiResult};
use crate::resources::ScaleSpec;

const SCALE_SCHEMA: &str = "io.k8s.api.autoscaling.v1.Scale";

fn scale_spec(call: &Call<'_>) -> ApiResult<ScaleSpec> {
    call.target.rt.scale.clone().ok_or_else(|| {
        ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    })
}

/// The Scale view of an object.
fn scale_of(spec: &ScaleSpec, obj: &Object) -> Value {
    let v = obj.to_value();
    let replicas = v
        .pointer(&spec.spec_replicas)
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let current = v
        .pointer(&spec.status_replicas)
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let selector = spec
        .label_selector
        .as_deref()
        .and_then(|p| v.pointer(p))
        .map(|s| match s {
            Value::String(s) => s.clone(),
            other => serde_json::from_value::<LabelSelector>(other.clone())
                .ok()
                .and_then(|ls| ls.to_selector().ok())
                .map(|sel| sel.to_string())
                .unwrap_or_default(),
        });
    let mut status = json!({ "replicas": current });
    if let Some(sel) = selector {
        status["selector"] = json!(sel);
    }
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": obj.name(),
            "namespace": obj.namespace(),
            "uid": obj.metadata.uid,
            "resourceVersion": obj.metadata.resource_version,
            "creationTimestamp": obj.metadata.creation_timestamp,
        },
        "spec": { "replicas": replicas },
        "status": status,
    })
}

fn set_pointer(v: &mut Value, pointer: &str, value: Value) {
    let mut cur = v;
    let parts: Vec<&str> = pointer.trim_start_matches('/').split('/').collect();
    for (i, part) in parts.iter().enumerate() {
        if !cur.is_object() {
            *cur = json!({});
        }
        let Value::Object(m) = cur else { return };
        if i + 1 == parts.len() {
            m.insert(part.to_string(), value);
            return;
        }
        cur = m.entry(part.to_string()).or_insert_with(|| json!({}));
    }
}

pub async fn get_scale(call: Call<'_>) -> ApiResult<Outcome> {
    let spec = scale_spec(&call)?;
    let obj = call
        .app
        .store
        .get(&call.target.key())
        .await
        .map_err(|e| ApiError::from_store(e, &call.target.rt, call.target.name()))?;
    Ok(Outcome::value(&call, StatusCode::OK, scale_of(&spec, &obj)))
}

/// Writes `replicas` into the object (optionally only at revision `precondition`).
async fn write_replicas(
    call: &Call<'_>,
    replicas_of: impl Fn(&Value) -> ApiResult<(i64, Option<Revision>)>,
) -> ApiResult<Outcome> {
    let spec = scale_spec(call)?;
    let rt = &call.target.rt;
    let name = call.target.name();
    let dry = call.options.dry_run;
    for _ in 0..8 {
        let current = call
            .app
            .store
            .get(&call.target.key())
            .await
            .map_err(|e| ApiError::from_store(e, rt, name))?;
        let current_rv = current.revision().unwrap_or(0);
        let (replicas, precondition) = replicas_of(&scale_of(&spec, &current))?;
        if replicas < 0 {
            let e = FieldError::invalid(
                "spec.replicas",
                replicas,
                "must be greater than or equal to 0",
            );
            return Err(ApiError::invalid(rt, name, &[e]));
        }
        // Scale's replicas are an int32, as the workloads' are.
        if i32::try_from(replicas).is_err() {
            let e = FieldError::invalid("spec.replicas", replicas, "must be a 32-bit integer");
            return Err(ApiError::invalid(rt, name, &[e]));
        }
        if precondition.is_some_and(|p| p != current_rv) {
            return Err(ApiError::stale(rt, name));
        }
        let mut v = current.to_value();
        if v.pointer(&spec.spec_replicas).and_then(Value::as_i64) == Some(replicas) {
            return Ok(Outcome::value(
                call,
                StatusCode::OK,
                scale_of(&spec, &current),
            ));
        }
        set_pointer(&mut v, &spec.spec_replicas, json!(replicas));
        let mut next: Object =
            serde_json::from_value(v).map_err(|e| ApiError::internal(e.to_string()))?;
        next.metadata.generation = Some(orrery_store::stamp::next_generation(&current, &next));
        // The scaler now owns the replica count.
        super::write::track(call, Some(&current), &mut next);
        super::check_admission(call, &next, Some(&current)).await?;
        if dry {
            return Ok(Outcome::value(call, StatusCode::OK, scale_of(&spec, &next)));
        }
        match call
            .app
            .store
            .update(&call.target.key(), next, Some(current_rv))
            .await
        {
            Ok(o) => {
                return Ok(Outcome::value(call, StatusCode::OK, scale_of(&spec, &o)));
            }
            Err(StoreError::Conflict { .. }) if precondition.is_none() => continue,
            Err(e) => return Err(ApiError::from_store(e, rt, name)),
        }
    }
    Err(ApiError::stale(rt, name))
}

fn replicas_in(scale: &Value) -> ApiResult<i64> {
    scale
        .pointer("/spec/replicas")
        .map(|r| {
            r.as_i64()
                .ok_or_else(|| ApiError::bad_request("spec.replicas must be an integer"))
        })
        .unwrap_or(Ok(0))
}

pub async fn update_scale(call: Call<'_>, body: &Bytes) -> ApiResult<Outcome> {
    let (scale, _) = decode_body(&call.envelope, body, crate::schema::SCALE)?;
    let replicas = replicas_in(&scale)?;
    let precondition = match scale
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
    {
        Some(rv) if !rv.is_empty() => Some(
            rv.parse::<Revision>()
                .map_err(|_| ApiError::bad_request("invalid resourceVersion"))?,
        ),
        _ => None,
    };
    write_replicas(&call, |_| Ok((replicas, precondition))).await
}

pub async fn patch_scale(call: Call<'_>, body: &Bytes) -> ApiResult<Outcome> {
    let ptype = patch_type(&call)?;
    let patch_doc: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the patch is not valid JSON: {e}")))?;
    write_replicas(&call, |scale| {
        let patched = apply_patch(&call, ptype, scale, &patch_doc, SCALE_SCHEMA)?;
        Ok((replicas_in(&patched)?, None))
    })
    .await
}

/// PUT namespaces/<name>/finalize: sets `spec.finalizers`; a terminating namespace left with
/// none is removed.
pub async fn finalize(call: Call<'_>, body: &Bytes) -> ApiResult<Outcome> {
    let rt = call.target.rt.clone();
    let name = call.target.name().to_string();
    let (v, _) = decode_body(&call.envelope, body, &call.target.rt.schema)?;
    let finalizers = v.pointer("/spec/finalizers").cloned().unwrap_or(json!([]));
    if !finalizers.is_array() {
        return Err(ApiError::bad_request("spec.finalizers must be a list"));
    }
    for _ in 0..8 {
        let current = call
            .app
            .store
            .get(&call.target.key())
            .await
            .map_err(|e| ApiError::from_store(e, &rt, &name))?;
        let rv = current.revision().unwrap_or(0);
        let mut next = current.clone();
        let spec = next.spec.get_or_insert_with(|| json!({}));
        spec["finalizers"] = finalizers.clone();
        let empty = finalizers.as_array().is_some_and(|f| f.is_empty());
        let result = if empty
            && next.metadata.deletion_timestamp.is_some()
            && next.metadata.finalizers.is_empty()
        {
            let pre = Preconditions {
                uid: Some(current.metadata.uid.clone()),
                revision: Some(rv),
            };
            call.app.store.delete(&call.target.key(), &pre).await
        } else {
            call.app
                .store
                .update(&call.target.key(), next, Some(rv))
                .await
        };
        match result {
            Ok(o) => return Ok(Outcome::value(&call, StatusCode::OK, o.to_value())),
            Err(StoreError::Conflict { .. }) => continue,
            Err(e) => return Err(ApiError::from_store(e, &rt, &name)),
        }
    }
    Err(ApiError::stale(&rt, &name))
}

/// Shortest and default lifetime of a ServiceAccount token, as Kubernetes has them.
const TOKEN_MIN_SECONDS: i64 = 600;
const TOKEN_DEFAULT_SECONDS: i64 = 3600;

/// `POST .../serviceaccounts/<name>/token`: a token for the ServiceAccount, good until it
/// expires or the account (this uid) is deleted. Only its hash is stored.
pub async fn create_token(call: Call<'_>, body: &Bytes) -> ApiResult<Outcome> {
    const SCHEMA: &str = "io.k8s.api.authentication.v1.TokenRequest";
    let (req, _) = decode_body(&call.envelope, body, SCHEMA)?;
    let spec = req.get("spec").cloned().unwrap_or_else(|| json!({}));
    let seconds = match spec.get("expirationSeconds") {
        None | Some(Value::Null) => TOKEN_DEFAULT_SECONDS,
        Some(v) => v
            .as_i64()
            .ok_or_else(|| ApiError::bad_request("spec.expirationSeconds must be an integer"))?,
    };
    if seconds < TOKEN_MIN_SECONDS {
        let e = FieldError::invalid(
            "spec.expirationSeconds",
            seconds,
            "may not specify a duration less than 10 minutes",
        );
        return Err(ApiError::new(
            422,
            "Invalid",
            format!(
                "TokenRequest.authentication.k8s.io \"{}\" is invalid: {e}",
                call.target.name()
            ),
        ));
    }
    if spec.get("boundObjectRef").is_some_and(|b| !b.is_null()) {
        return Err(ApiError::bad_request(
            "spec.boundObjectRef: tokens are bound to their ServiceAccount only here",
        ));
    }
    let sa = call
        .app
        .store
        .get(&call.target.key())
        .await
        .map_err(|e| ApiError::from_store(e, &call.target.rt, call.target.name()))?;
    let who = crate::auth::Identity::ServiceAccount {
        namespace: sa.namespace().to_string(),
        name: sa.name().to_string(),
        uid: sa.metadata.uid.clone(),
    };
    // The token works at once only if this server knows the account (its watch may lag a
    // write made a moment ago through another replica).
    call.app.authz.observe(&sa, false);
    let expires =
        orrery_api::Time::from_unix_seconds(orrery_api::Time::now().unix_seconds() + seconds)
            .ok_or_else(|| ApiError::bad_request("spec.expirationSeconds is too large"))?;
    let audiences = spec
        .get("audiences")
        .filter(|a| a.as_array().is_some_and(|a| !a.is_empty()))
        .cloned()
        .unwrap_or_else(|| json!(["orrery"]));
    let token = if call.options.dry_run {
        String::new()
    } else {
        call.app
            .auth
            .issue(
                &who,
                &format!("token of serviceaccount {}/{}", sa.namespace(), sa.name()),
                Some(std::time::Duration::from_secs(seconds as u64)),
            )
            .await?
    };
    let mut out_spec = spec.clone();
    out_spec["audiences"] = audiences;
    out_spec["expirationSeconds"] = json!(seconds);
    let out = json!({
        "kind": "TokenRequest",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"name": sa.name(), "namespace": sa.namespace(), "creationTimestamp": orrery_api::Time::now().to_string()},
        "spec": out_spec,
        "status": {"token": token, "expirationTimestamp": expires.to_string()},
    });
    Ok(Outcome::value(&call, StatusCode::CREATED, out))
}
