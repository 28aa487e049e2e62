//! Policy management (draft 6.2.2): `POST/GET /api/v1/propagationpolicies`,
//! `GET/PATCH/DELETE /api/v1/propagationpolicies/{policyName}`.
//!
//! A policy in the draft's short form (`name`, `resourceType`, `targetClusters`) is stored as a
//! Karmada `ClusterPropagationPolicy` labelled `multicluster.io/api: dro`: it selects every
//! template of that kind, in any namespace, and divides replicas over the target clusters by
//! water level (all clusters when the list is empty). `kubectl get clusterpropagationpolicies`
//! shows it, and it behaves like any other policy.

use std::sync::Arc;

use http::{HeaderMap, StatusCode};
use orrery_api::Object;
use serde::Deserialize;
use serde_json::{Value, json};

use super::answers::{PolicyList, PolicyView};
use super::{DroError, forward};
use crate::app::App;
use crate::auth::Identity;
use crate::http::Body;
use crate::registry::{Input, Target};

/// A ClusterPropagationPolicy (or, without a name, all of them) as the registry addresses it.
fn policy(app: &App, name: Option<&str>) -> Result<Target, DroError> {
    Ok(Target::own(
        app,
        &orrery_api::kinds::CLUSTER_PROPAGATION_POLICY,
        None,
        name,
    )?)
}
const LABEL: &str = "multicluster.io/api";
const LABEL_VALUE: &str = "dro";

/// The draft's short form.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(rename = "Policy", extend("example" = {
    "name": "cross-region-policy", "resourceType": "Deployment", "targetClusters": ["aws-us-east", "azure-europe"],
}))]
pub(super) struct Short {
    name: String,
    /// A kind the server serves, e.g. Deployment
    resource_type: String,
    #[serde(default)]
    #[schemars(inner(length(min = 1)))]
    target_clusters: Vec<String>,
}

fn not_found(name: &str) -> DroError {
    DroError::new(
        404,
        "POLICY_NOT_FOUND",
        format!("no propagation policy {name:?}"),
    )
    .with_details(json!({ "policyName": name }))
}

/// The apiVersion of a kind by its name: the built-in groups first, then any other served.
fn api_version_of(app: &App, kind: &str) -> Option<String> {
    let reg = app.resources.snapshot();
    let all = reg.all();
    let rank = |g: &str| match g {
        "" => 0,
        "apps" => 1,
        "batch" => 2,
        _ => 3,
    };
    all.iter()
        .filter(|t| t.kind == kind && t.storage)
        .min_by_key(|t| (rank(&t.group), t.group.clone()))
        .map(|t| {
            if t.group.is_empty() {
                t.version.clone()
            } else {
                format!("{}/{}", t.group, t.version)
            }
        })
}

/// The ClusterPropagationPolicy spec for a short form.
fn spec_of(app: &App, s: &Short) -> Result<Value, DroError> {
    let mut fields = Vec::new();
    if s.resource_type.is_empty() {
        fields.push(json!({"field": "resourceType", "message": "required"}));
    }
    for (i, c) in s.target_clusters.iter().enumerate() {
        if c.is_empty() {
            fields.push(
                json!({"field": format!("targetClusters[{i}]"), "message": "must not be empty"}),
            );
        }
    }
    let api_version = api_version_of(app, &s.resource_type);
    if api_version.is_none() && !s.resource_type.is_empty() {
        fields.push(json!({"field": "resourceType", "message": format!("no served kind is called {:?}", s.resource_type)}));
    }
    if !fields.is_empty() {
        return Err(DroError::validation("the policy is not valid")
            .with_details(json!({ "policyName": s.name, "fields": fields })));
    }
    // The draft's division by water level (a Karmada kind divides equally unless told).
    let mut placement = json!({"replicaScheduling": {"replicaSchedulingType": "Divided",
        "weightPreference": {"dynamicWeight": "WaterLevel"}}});
    if !s.target_clusters.is_empty() {
        placement["clusterAffinity"] = json!({ "clusterNames": s.target_clusters });
    }
    Ok(json!({
        "resourceSelectors": [{"apiVersion": api_version, "kind": s.resource_type}],
        "placement": placement,
    }))
}

/// A stored policy in the draft's short form.
fn view(o: &Object) -> PolicyView {
    let spec = o.spec.clone().unwrap_or(Value::Null);
    PolicyView {
        name: o.name().to_string(),
        resource_type: spec["resourceSelectors"][0]["kind"].clone(),
        target_clusters: spec["placement"]["clusterAffinity"]["clusterNames"]
            .as_array()
            .cloned()
            .unwrap_or_default(),
        created_at: o.metadata.creation_timestamp,
        resource_version: o.metadata.resource_version.clone(),
        bound_resources: o
            .status
            .as_ref()
            .and_then(|s| s.get("boundResources"))
            .and_then(Value::as_i64)
            .unwrap_or(0),
    }
}

fn is_ours(o: &Object) -> bool {
    o.metadata.labels.get(LABEL).map(String::as_str) == Some(LABEL_VALUE)
}

async fn get_ours(app: &Arc<App>, who: &Identity, name: &str) -> Result<Object, DroError> {
    if !orrery_api::validation::is_dns1123_subdomain(name).is_empty() {
        return Err(not_found(name));
    }
    let r = forward::call(app, who, policy(app, Some(name))?, Input::Get).await?;
    if r.status == 404 {
        return Err(not_found(name));
    }
    let r = r.checked(
        "POLICY_NOT_FOUND",
        "POLICY_CONFLICT",
        json!({ "policyName": name }),
    )?;
    let o = r.object()?;
    // Policies made with kubectl are not this API's to show in the short form.
    if !is_ours(&o) {
        return Err(not_found(name));
    }
    Ok(o)
}

pub async fn list(app: &Arc<App>, who: &Identity) -> Result<http::Response<Body>, DroError> {
    let selector = format!("{LABEL}={LABEL_VALUE}");
    let items: Vec<PolicyView> = forward::list(app, who, policy(app, None)?, Some(&selector))
        .await?
        .iter()
        .map(view)
        .collect();
    let count = items.len();
    Ok(super::answers::send(
        StatusCode::OK,
        &PolicyList { items, count },
    ))
}

pub async fn get(
    app: &Arc<App>,
    who: &Identity,
    name: &str,
) -> Result<http::Response<Body>, DroError> {
    let o = get_ours(app, who, name).await?;
    Ok(super::answers::send(StatusCode::OK, &view(&o)))
}

pub async fn create(
    app: &Arc<App>,
    who: &Identity,
    body: &[u8],
) -> Result<http::Response<Body>, DroError> {
    let s: Short = serde_json::from_slice(body)
        .map_err(|e| DroError::validation(format!("the body is not a valid policy: {e}")))?;
    let spec = spec_of(app, &s)?;
    let obj = json!({
        "apiVersion": "policy.karmada.io/v1alpha1",
        "kind": "ClusterPropagationPolicy",
        "metadata": { "name": s.name, "labels": { LABEL: LABEL_VALUE } },
        "spec": spec,
    });
    let r = forward::call(app, who, policy(app, None)?, Input::Create(obj)).await?;
    if !r.ok() {
        let mut e = r.error(
            "POLICY_NOT_FOUND",
            "POLICY_CONFLICT",
            json!({ "policyName": s.name }),
        );
        if e.code == "POLICY_CONFLICT" {
            e.message = "Policy name already exists".into();
        }
        return Err(e);
    }
    let o = r.object()?;
    Ok(super::answers::send(StatusCode::CREATED, &view(&o)))
}

/// `PATCH` with `application/merge-patch+json` (RFC 7386) on the short form.
pub async fn patch(
    app: &Arc<App>,
    who: &Identity,
    headers: &HeaderMap,
    name: &str,
    body: &[u8],
) -> Result<http::Response<Body>, DroError> {
    let ct = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if ct.split(';').next().unwrap_or("").trim() != "application/merge-patch+json" {
        return Err(DroError::new(
            415,
            "UNSUPPORTED_MEDIA_TYPE",
            format!("a policy is patched with application/merge-patch+json, not {ct:?}"),
        ));
    }
    let patch: Value = serde_json::from_slice(body)
        .map_err(|e| DroError::validation(format!("the patch is not valid JSON: {e}")))?;
    if !patch.is_object() {
        return Err(DroError::validation("a merge patch must be a JSON object"));
    }
    // A merge patch carries no resourceVersion: as Kubernetes's patch handler does, it is
    // applied again to the fresh object when another writer (a controller updating the
    // policy's status, say) got in between the read and the write. Each write is still
    // guarded by the resourceVersion it read, so nothing is lost.
    let mut attempt = 0;
    let r = loop {
        attempt += 1;
        let current = get_ours(app, who, name).await?;
        let next = patched(app, name, &current, &patch)?;
        let r = forward::call(app, who, policy(app, Some(name))?, Input::Update(next)).await?;
        let conflict = r.status == 409 && r.reason() != Some("AlreadyExists");
        if !conflict || attempt == PATCH_ATTEMPTS {
            break r;
        }
    };
    let r = r.checked(
        "POLICY_NOT_FOUND",
        "POLICY_CONFLICT",
        json!({ "policyName": name }),
    )?;
    let o = r.object()?;
    Ok(super::answers::send(StatusCode::OK, &view(&o)))
}

/// How often a merge patch is tried against a policy other writers keep changing.
const PATCH_ATTEMPTS: u32 = 5;

/// `current` with the merge patch applied to its short form.
fn patched(
    app: &Arc<App>,
    name: &str,
    current: &orrery_api::Object,
    patch: &Value,
) -> Result<Value, DroError> {
    let v = view(current);
    let mut short = json!({
        "name": v.name,
        "resourceType": v.resource_type,
        "targetClusters": v.target_clusters,
    });
    crate::patch::merge_patch(&mut short, patch)
        .map_err(|e| DroError::validation(format!("the patch does not apply: {e}")))?;
    let s: Short = serde_json::from_value(short)
        .map_err(|e| DroError::validation(format!("the patched policy is not valid: {e}")))?;
    if s.name != name {
        return Err(DroError::validation("a policy's name cannot change")
            .with_details(json!({ "policyName": name, "fields": [{"field": "name", "message": "cannot change"}] })));
    }
    let spec = spec_of(app, &s)?;
    let mut next = serde_json::to_value(current).map_err(DroError::internal)?;
    next["spec"]["resourceSelectors"] = spec["resourceSelectors"].clone();
    next["spec"]["placement"]["clusterAffinity"] = spec["placement"]["clusterAffinity"].clone();
    if next["spec"]["placement"]["clusterAffinity"].is_null()
        && let Some(p) = next["spec"]["placement"].as_object_mut()
    {
        p.remove("clusterAffinity");
    }
    Ok(next)
}

pub async fn delete(
    app: &Arc<App>,
    who: &Identity,
    name: &str,
) -> Result<http::Response<Body>, DroError> {
    let current = get_ours(app, who, name).await?;
    let r = forward::call(
        app,
        who,
        policy(app, Some(name))?,
        Input::Delete {
            uid: Some(current.metadata.uid.clone()),
        },
    )
    .await?;
    r.checked(
        "POLICY_NOT_FOUND",
        "POLICY_CONFLICT",
        json!({ "policyName": name }),
    )?;
    Ok(super::answers::send(
        StatusCode::OK,
        &json!({ "name": name, "status": "Deleted" }),
    ))
}
