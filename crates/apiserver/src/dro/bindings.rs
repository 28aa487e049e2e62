//! Task scheduling (draft 6.2.5): `POST /api/v1/bindings` asks for a fresh cross-domain
//! decision for a template that a policy places, and returns the task's id;
//! `GET /api/v1/bindings/{bindingId}/status` says where it stands, where it went and why.
//!
//! A task is a ResourceBinding: the request sets its reschedule annotation (through the
//! Kubernetes handlers, as the caller), the scheduler answers with a fresh division, and the
//! answer is the binding's status. The id is `<namespace>.<binding name>`.

use std::sync::Arc;

use http::{Method, StatusCode};
use orrery_api::binding::{self, BindingStatus, CONDITION_SCHEDULED, RESCHEDULE_ANNOTATION};
use orrery_api::{Object, Time, conditions};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{DroError, forward};
use crate::app::App;
use crate::auth::Identity;
use crate::http::{self as h, Body};

/// Cluster-scoped templates' bindings live here.
const SYSTEM_NAMESPACE: &str = "orrery-system";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Resource {
    api_version: String,
    kind: String,
    #[serde(default)]
    namespace: String,
    name: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Submit {
    resource: Resource,
}

fn path(namespace: &str, name: &str) -> String {
    format!("/apis/multicluster.io/v1alpha1/namespaces/{namespace}/resourcebindings/{name}")
}

fn not_found(id: &str, message: String) -> DroError {
    DroError::new(404, "BINDING_NOT_FOUND", message).with_details(json!({ "bindingId": id }))
}

pub async fn submit(
    app: &Arc<App>,
    who: &Identity,
    body: &[u8],
) -> Result<http::Response<Body>, DroError> {
    let s: Submit = serde_json::from_slice(body)
        .map_err(|e| DroError::validation(format!("the body is not a valid task: {e}")))?;
    let r = &s.resource;
    for (field, v) in [
        ("resource.kind", &r.kind),
        ("resource.name", &r.name),
        ("resource.apiVersion", &r.api_version),
    ] {
        if v.is_empty() {
            return Err(DroError::validation(format!("{field} is required"))
                .with_details(json!({ "fields": [{"field": field, "message": "required"}] })));
        }
    }
    let mut bad: Vec<Value> = Vec::new();
    if !r.namespace.is_empty() && !orrery_api::validation::is_dns1123_label(&r.namespace).is_empty()
    {
        bad.push(json!({"field": "resource.namespace", "message": "not a namespace name"}));
    }
    if !orrery_api::validation::is_dns1123_subdomain(&r.name).is_empty() {
        bad.push(json!({"field": "resource.name", "message": "not an object name"}));
    }
    if r.kind.chars().any(|c| !c.is_ascii_alphanumeric()) {
        bad.push(json!({"field": "resource.kind", "message": "not a kind"}));
    }
    if !bad.is_empty() {
        return Err(
            DroError::validation("the task names no object that can exist")
                .with_details(json!({ "fields": bad })),
        );
    }
    let ns = if r.namespace.is_empty() {
        SYSTEM_NAMESPACE
    } else {
        r.namespace.as_str()
    };
    let name = binding::name_for(&r.kind, &r.name);
    let id = format!("{ns}.{name}");
    // Nanoseconds: two requests in one second are two requests.
    let stamp = Time::now().timestamp().to_string();
    let patch = json!({ "metadata": { "annotations": { RESCHEDULE_ANNOTATION: stamp } } });
    let reply = forward::call(
        app,
        who,
        Method::PATCH,
        &path(ns, &name),
        "application/merge-patch+json",
        Some(&patch),
    )
    .await?;
    if reply.status == 404 {
        return Err(not_found(
            &id,
            format!(
                "no policy places {} {}{}; create a placement policy for it first",
                r.kind,
                if r.namespace.is_empty() {
                    String::new()
                } else {
                    format!("{}/", r.namespace)
                },
                r.name
            ),
        ));
    }
    if !reply.ok() {
        return Err(reply.error("BINDING_NOT_FOUND", "CONFLICT", json!({ "bindingId": id })));
    }
    Ok(h::json(
        StatusCode::ACCEPTED,
        &json!({
            "bindingId": id,
            "state": "Pending",
            "statusUrl": format!("/api/v1/bindings/{id}/status"),
        }),
    ))
}

/// Where a task stands.
pub fn status_view(id: &str, b: &Object) -> Value {
    let st: BindingStatus = b
        .status
        .clone()
        .and_then(|s| serde_json::from_value(s).ok())
        .unwrap_or_default();
    let requested = b.metadata.annotations.get(RESCHEDULE_ANNOTATION);
    let answered = requested.is_none_or(|r| *r == st.reschedule_observed);
    let cond = conditions::find(&st.conditions, CONDITION_SCHEDULED);
    let state = match cond {
        _ if !answered => "Pending",
        Some(c) if c.is_true() => "Scheduled",
        Some(c) if c.reason == "PartiallyScheduled" => "PartiallyScheduled",
        Some(_) => "Unschedulable",
        None => "Pending",
    };
    let spec = b.spec.clone().unwrap_or(Value::Null);
    let applied = conditions::find(&st.conditions, binding::CONDITION_FULLY_APPLIED)
        .is_some_and(|c| c.is_true());
    json!({
        "bindingId": id,
        "taskId": st.task_id,
        "state": state,
        "resource": spec["resource"],
        "replicas": spec["replicas"],
        "clusters": spec["clusters"].as_array().cloned().unwrap_or_default(),
        "message": cond.map(|c| c.message.clone()).unwrap_or_default(),
        "strategy": st.strategy,
        "unplacedReplicas": st.unplaced_replicas.unwrap_or(0),
        "reasons": st.decisions,
        "filtered": st.filtered,
        "lastScheduledTime": st.last_scheduled_time,
        "fullyApplied": applied,
    })
}

pub async fn status(
    app: &Arc<App>,
    who: &Identity,
    id: &str,
) -> Result<http::Response<Body>, DroError> {
    // Namespaces never contain a dot; binding names may.
    let Some((ns, name)) = id.split_once('.').filter(|(ns, name)| {
        orrery_api::validation::is_dns1123_label(ns).is_empty()
            && orrery_api::validation::is_dns1123_subdomain(name).is_empty()
    }) else {
        return Err(not_found(
            id,
            format!("{id:?} is not a binding id (<namespace>.<name>)"),
        ));
    };
    let reply = forward::call(
        app,
        who,
        Method::GET,
        &path(ns, name),
        "application/json",
        None,
    )
    .await?;
    if reply.status == 404 {
        return Err(not_found(id, format!("no binding {id:?}")));
    }
    if !reply.ok() {
        return Err(reply.error("BINDING_NOT_FOUND", "CONFLICT", json!({ "bindingId": id })));
    }
    let b = reply.object()?;
    Ok(h::json(StatusCode::OK, &status_view(id, &b)))
}
