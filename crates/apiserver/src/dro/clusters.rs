//! Cluster management (draft 6.2.1): `GET/POST /api/v1/clusters`,
//! `DELETE /api/v1/clusters/{name}`. A registered domain is the same `Cluster` object
//! `kubectl get clusters` shows; its agent joins it with a bootstrap token.

use std::collections::HashMap;
use std::sync::Arc;

use http::StatusCode;
use orrery_api::cluster::{self, ClusterSpec, ClusterStatus, check_endpoint};
use orrery_api::conditions;
use orrery_api::{MicroTime, Object};
use serde::Deserialize;
use serde_json::json;

use super::answers::{ClusterList, ClusterView, Deleted, Truth};
use super::{DroError, forward};
use crate::app::App;
use crate::auth::Identity;
use crate::http::Body;
use crate::registry::{Input, Target};

/// A Cluster (or, without a name, all of them) as the registry addresses it.
fn cluster_target(app: &App, name: Option<&str>) -> Result<Target, DroError> {
    Ok(Target::own(app, &orrery_api::kinds::CLUSTER, None, name)?)
}

/// The draft's request body (6.2.1), with optional location fields.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "RegisterCluster", extend("example" = {
    "name": "gcp-production", "endpoint": "https://k8s.gcp.example", "capabilities": ["gpu", "tls-encryption"],
}))]
pub(super) struct Register {
    #[schemars(regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"), length(max = 48))]
    name: String,
    /// http(s)://host[:port][/path]
    #[serde(default)]
    endpoint: Option<String>,
    #[serde(default)]
    #[schemars(inner(length(min = 1, max = 63)))]
    capabilities: Vec<String>,
    #[serde(default)]
    provider: Option<String>,
    #[serde(default)]
    region: Option<String>,
    #[serde(default)]
    labels: std::collections::BTreeMap<String, String>,
}

/// Members' Lease renewal times, by cluster: a heartbeat renews the Lease, and the status's
/// `lastHeartbeatTime` is when the status was last written. Empty if they cannot be read
/// (the status's time is shown then).
pub async fn renewals(store: &dyn orrery_store::Store) -> HashMap<String, MicroTime> {
    let listed = store
        .list(
            &orrery_api::keys::well_known::cluster_leases(),
            &orrery_store::ListOptions::default(),
        )
        .await;
    match listed {
        Ok(l) => l
            .items
            .iter()
            .filter_map(|l| Some((l.name().to_string(), cluster::LeaseBeat::of(l).renew_time?)))
            .collect(),
        Err(e) => {
            tracing::warn!(error = %e, "reading the members' Leases failed");
            HashMap::new()
        }
    }
}

/// When the agent of cluster `name` last renewed its Lease.
pub async fn renewed(store: &dyn orrery_store::Store, name: &str) -> Option<MicroTime> {
    let lease = store
        .get(&orrery_api::keys::well_known::cluster_lease(name))
        .await
        .ok()?;
    cluster::LeaseBeat::of(&lease).renew_time
}

/// A cluster in the draft's shape; `renewed`: when its agent last renewed its Lease.
pub fn view(o: &Object, renewed: Option<&MicroTime>) -> ClusterView {
    let spec = ClusterSpec::of(o);
    let st = ClusterStatus::of(o);
    let ready = conditions::find(&st.conditions, cluster::CONDITION_READY)
        .map_or(Truth::Unknown, |c| Truth::of(&c.status));
    ClusterView {
        name: o.name().to_string(),
        endpoint: spec.api_endpoint,
        capabilities: spec.capabilities,
        provider: spec.provider,
        region: spec.region,
        labels: o.metadata.labels.clone().into_iter().collect(),
        sync_mode: spec.sync_mode,
        ready,
        water_level: st.water_level.clone(),
        last_heartbeat_time: st.last_heartbeat_time.max(renewed.copied()),
        created_at: o.metadata.creation_timestamp,
    }
}

pub async fn list(app: &Arc<App>, who: &Identity) -> Result<http::Response<Body>, DroError> {
    let renewed = renewals(app.store.as_ref()).await;
    let items: Vec<ClusterView> = forward::list(app, who, cluster_target(app, None)?, None)
        .await?
        .iter()
        .map(|o| view(o, renewed.get(o.name())))
        .collect();
    let count = items.len();
    Ok(super::answers::send(
        StatusCode::OK,
        &ClusterList { items, count },
    ))
}

pub async fn register(
    app: &Arc<App>,
    who: &Identity,
    body: &[u8],
) -> Result<http::Response<Body>, DroError> {
    let req: Register = serde_json::from_slice(body)
        .map_err(|e| DroError::validation(format!("the body is not a valid cluster: {e}")))?;
    let mut fields = Vec::new();
    for e in cluster::validate_name(&req.name) {
        fields.push(json!({"field": "name", "message": e.to_string()}));
    }
    if let Some(ep) = &req.endpoint
        && let Err(e) = check_endpoint(ep)
    {
        fields.push(json!({"field": "endpoint", "message": e}));
    }
    for (i, c) in req.capabilities.iter().enumerate() {
        if c.is_empty() || c.len() > 63 {
            fields.push(json!({"field": format!("capabilities[{i}]"), "message": "must be 1 to 63 characters"}));
        }
    }
    if !fields.is_empty() {
        return Err(DroError::validation("the cluster is not valid")
            .with_details(json!({ "clusterName": req.name, "fields": fields })));
    }
    let mut spec = serde_json::Map::new();
    if let Some(ep) = &req.endpoint {
        spec.insert("apiEndpoint".into(), json!(ep));
    }
    if !req.capabilities.is_empty() {
        spec.insert("capabilities".into(), json!(req.capabilities));
    }
    if let Some(p) = &req.provider {
        spec.insert("provider".into(), json!(p));
    }
    if let Some(r) = &req.region {
        spec.insert("region".into(), json!(r));
    }
    let obj = json!({
        "apiVersion": cluster::API_VERSION,
        "kind": "Cluster",
        "metadata": { "name": req.name, "labels": req.labels },
        "spec": spec,
    });
    let r = forward::call(app, who, cluster_target(app, None)?, Input::Create(obj)).await?;
    if !r.ok() {
        let mut e = r.error(
            "CLUSTER_NOT_FOUND",
            "CLUSTER_EXISTS",
            json!({ "clusterName": req.name }),
        );
        if e.code == "CLUSTER_EXISTS" {
            e.message = format!("cluster {:?} is already registered", req.name);
        }
        return Err(e);
    }
    let o = r.object()?;
    Ok(super::answers::send(StatusCode::CREATED, &view(&o, None)))
}

pub async fn unregister(
    app: &Arc<App>,
    who: &Identity,
    name: &str,
) -> Result<http::Response<Body>, DroError> {
    if !cluster::validate_name(name).is_empty() {
        return Err(DroError::cluster_not_found(name));
    }
    let r = forward::call(
        app,
        who,
        cluster_target(app, Some(name))?,
        Input::Delete { uid: None },
    )
    .await?;
    if !r.ok() {
        let e = r.error(
            "CLUSTER_NOT_FOUND",
            "CONFLICT",
            json!({ "clusterName": name }),
        );
        if e.code == "CLUSTER_NOT_FOUND" {
            return Err(DroError::cluster_not_found(name));
        }
        return Err(e);
    }
    // The Cluster's finalizer removes its namespace, Works and tokens before it goes.
    let o: Option<Object> = serde_json::from_value(r.value().clone()).ok();
    Ok(super::answers::send(
        StatusCode::OK,
        &Deleted {
            name: name.to_string(),
            status: if o
                .as_ref()
                .is_some_and(|o| o.metadata.deletion_timestamp.is_some())
            {
                "Unregistering"
            } else {
                "Unregistered"
            },
        },
    ))
}
