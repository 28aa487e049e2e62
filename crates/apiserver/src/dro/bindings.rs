//! Task scheduling (draft 6.2.5): `POST /api/v1/bindings` starts a cross-domain scheduling
//! task and returns its id; `GET /api/v1/bindings/{bindingId}/status` says where it stands,
//! where it went and why; `DELETE /api/v1/bindings/{bindingId}` ends a standalone task.
//!
//! A task is a ResourceBinding, of one of two sorts:
//! - `{"resource": {...}}`: a fresh decision for a template a policy already places. The
//!   request sets the binding's reschedule annotation (through the Kubernetes handlers, as the
//!   caller), and the scheduler answers with a fresh division.
//! - `{"task": {...}}`: a standalone task (draft 7.1: requirements and priority, no template).
//!   A binding is created for it; the scheduler places it like any other and counts it against
//!   the clusters it chose; no Work is rendered, the submitter runs it where it was placed.
//!
//! Either way the answer is the binding's status. The id is `<namespace>.<binding name>`.

use std::sync::Arc;

use http::StatusCode;
use orrery_api::binding::{
    self, BindingStatus, CONDITION_SCHEDULED, RESCHEDULE_ANNOTATION, SYSTEM_NAMESPACE, TASK_LABEL,
    Task,
};
use orrery_api::{Object, Time, conditions};
use serde::Deserialize;
use serde_json::{Value, json};

use super::answers::{DeletedState, TaskAccepted, TaskDeleted, TaskState, TaskStatus};
use super::{DroError, forward};
use crate::app::App;
use crate::auth::Identity;
use crate::http::Body;
use crate::registry::{Input, Target};

/// A template a policy places, for a fresh decision.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(rename = "TaskResource")]
pub(super) struct Resource {
    #[schemars(length(min = 1))]
    api_version: String,
    #[schemars(length(min = 1))]
    kind: String,
    #[serde(default)]
    namespace: String,
    #[schemars(length(min = 1))]
    name: String,
}

/// Exactly one of the two.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Submit {
    #[serde(default)]
    resource: Option<Resource>,
    #[serde(default)]
    task: Option<Task>,
}

/// A binding (or, without a name, a namespace's bindings) as the registry addresses it.
fn binding(app: &App, namespace: &str, name: Option<&str>) -> Result<Target, DroError> {
    Ok(Target::own(
        app,
        &orrery_api::kinds::RESOURCE_BINDING,
        Some(namespace),
        name,
    )?)
}

fn not_found(id: &str, message: String) -> DroError {
    DroError::new(404, "BINDING_NOT_FOUND", message).with_details(json!({ "bindingId": id }))
}

fn accepted(id: &str) -> http::Response<Body> {
    super::answers::send(
        StatusCode::ACCEPTED,
        &TaskAccepted {
            binding_id: id.to_string(),
            state: "Pending",
            status_url: format!("/api/v1/bindings/{id}/status"),
        },
    )
}

fn field_errors(errs: &[orrery_api::validation::FieldError]) -> Value {
    json!(
        errs.iter()
            .map(|e| json!({"field": e.field, "message": e.detail}))
            .collect::<Vec<_>>()
    )
}

pub async fn submit(
    app: &Arc<App>,
    who: &Identity,
    body: &[u8],
) -> Result<http::Response<Body>, DroError> {
    let s: Submit = serde_json::from_slice(body)
        .map_err(|e| DroError::validation(format!("the body is not a valid task: {e}")))?;
    match (s.resource, s.task) {
        (Some(r), None) => reschedule(app, who, &r).await,
        (None, Some(t)) => standalone(app, who, &t).await,
        _ => Err(DroError::validation(
            "give either `resource` (a template a policy places) or `task` (a standalone task)",
        )
        .with_details(json!({ "fields": [
            {"field": "resource", "message": "exactly one of resource and task"},
            {"field": "task", "message": "exactly one of resource and task"},
        ] }))),
    }
}

/// A standalone task: its binding is created, and the scheduler takes it from there.
async fn standalone(
    app: &Arc<App>,
    who: &Identity,
    t: &Task,
) -> Result<http::Response<Body>, DroError> {
    let errs = t.validate();
    if !errs.is_empty() {
        return Err(DroError::validation(format!(
            "the task is not valid: {}",
            errs.iter()
                .map(|e| format!("{}: {}", e.field, e.detail))
                .collect::<Vec<_>>()
                .join("; ")
        ))
        .with_details(json!({ "fields": field_errors(&errs) })));
    }
    let ns = t.binding_namespace();
    let name = t.binding_name();
    let id = format!("{ns}.{name}");
    let spec = serde_json::to_value(t.spec()).map_err(DroError::internal)?;
    let obj = json!({
        "apiVersion": binding::API_VERSION,
        "kind": binding::KIND,
        "metadata": {"name": name, "namespace": ns, "labels": {TASK_LABEL: "standalone"}},
        "spec": spec,
    });
    let reply = forward::call(app, who, binding(app, ns, None)?, Input::Create(obj)).await?;
    if reply.ok() {
        return Ok(accepted(&id));
    }
    let mut e = reply.error(
        "VALIDATION_FAILED",
        "BINDING_EXISTS",
        json!({ "bindingId": id }),
    );
    match e.code {
        // The namespace is what was not found.
        "VALIDATION_FAILED" if reply.status == 404 => {
            e.status = 400;
            e.message = format!("namespace {ns:?} does not exist");
            e.details = Box::new(json!({
                "bindingId": id,
                "fields": [{"field": "task.namespace", "message": "no such namespace"}],
            }));
        }
        "BINDING_EXISTS" => e.message = format!("a task {:?} exists already in {ns}", t.name),
        _ => {}
    }
    Err(e)
}

/// A fresh decision for a template a policy places.
async fn reschedule(
    app: &Arc<App>,
    who: &Identity,
    r: &Resource,
) -> Result<http::Response<Body>, DroError> {
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
        binding(app, ns, Some(&name))?,
        Input::MergePatch(patch),
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
    reply.checked("BINDING_NOT_FOUND", "CONFLICT", json!({ "bindingId": id }))?;
    Ok(accepted(&id))
}

/// Where a task stands.
pub fn status_view(id: &str, b: &Object) -> TaskStatus {
    let st: BindingStatus = b
        .status
        .clone()
        .and_then(|s| serde_json::from_value(s).ok())
        .unwrap_or_default();
    let requested = b.metadata.annotations.get(RESCHEDULE_ANNOTATION);
    let answered = requested.is_none_or(|r| *r == st.reschedule_observed);
    let cond = conditions::find(&st.conditions, CONDITION_SCHEDULED);
    let state = match cond {
        _ if !answered => TaskState::Pending,
        Some(c) if c.is_true() => TaskState::Scheduled,
        Some(c) if c.reason == "PartiallyScheduled" => TaskState::PartiallyScheduled,
        Some(_) => TaskState::Unschedulable,
        None => TaskState::Pending,
    };
    let spec = b.spec.clone().unwrap_or(Value::Null);
    let applied = conditions::find(&st.conditions, binding::CONDITION_FULLY_APPLIED)
        .is_some_and(|c| c.is_true());
    TaskStatus {
        binding_id: id.to_string(),
        task_id: st.task_id,
        state,
        resource: spec["resource"].clone(),
        replicas: spec["replicas"].clone(),
        clusters: spec["clusters"].as_array().cloned().unwrap_or_default(),
        message: cond.map(|c| c.message.clone()).unwrap_or_default(),
        strategy: st.strategy,
        unplaced_replicas: st.unplaced_replicas.unwrap_or(0),
        reasons: st.decisions,
        filtered: st.filtered,
        prediction: st.prediction,
        last_scheduled_time: st.last_scheduled_time,
        fully_applied: applied,
        standalone: is_standalone(b),
        priority: spec["priority"].as_i64().unwrap_or(0),
    }
}

/// The binding a task id names, as the caller may read it.
async fn get(
    app: &Arc<App>,
    who: &Identity,
    id: &str,
) -> Result<(String, String, Object), DroError> {
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
    let reply = forward::call(app, who, binding(app, ns, Some(name))?, Input::Get).await?;
    if reply.status == 404 {
        return Err(not_found(id, format!("no binding {id:?}")));
    }
    let b = reply
        .checked("BINDING_NOT_FOUND", "CONFLICT", json!({ "bindingId": id }))?
        .object()?;
    Ok((ns.to_string(), name.to_string(), b))
}

pub async fn status(
    app: &Arc<App>,
    who: &Identity,
    id: &str,
) -> Result<http::Response<Body>, DroError> {
    let (_, _, b) = get(app, who, id).await?;
    Ok(super::answers::send(StatusCode::OK, &status_view(id, &b)))
}

fn is_standalone(b: &Object) -> bool {
    b.spec.as_ref().is_some_and(|s| {
        let r = &s["resource"];
        binding::is_task(
            r["apiVersion"].as_str().unwrap_or(""),
            r["kind"].as_str().unwrap_or(""),
        )
    })
}

/// Ends a standalone task: its binding goes, and the capacity it held is free again. A
/// template's binding is the policy's to remove, not this endpoint's.
pub async fn delete(
    app: &Arc<App>,
    who: &Identity,
    id: &str,
) -> Result<http::Response<Body>, DroError> {
    let (ns, name, b) = get(app, who, id).await?;
    if !is_standalone(&b) {
        return Err(DroError::new(
            409,
            "CONFLICT",
            format!(
                "{id} places a template: it goes when the template or its policy does, not on request"
            ),
        )
        .with_details(json!({ "bindingId": id })));
    }
    // Only the binding that was read: a task deleted and submitted again meanwhile stays.
    let uid = Some(b.metadata.uid.clone());
    let reply = forward::call(
        app,
        who,
        binding(app, &ns, Some(&name))?,
        Input::Delete { uid },
    )
    .await?;
    if reply.status == 404 {
        return Err(not_found(id, format!("no binding {id:?}")));
    }
    reply.checked("BINDING_NOT_FOUND", "CONFLICT", json!({ "bindingId": id }))?;
    Ok(super::answers::send(
        StatusCode::OK,
        &TaskDeleted {
            binding_id: id.to_string(),
            state: DeletedState::Deleted,
        },
    ))
}
