//! Karmada's autoscalers (autoscaling.karmada.io/v1alpha1): [`cron`] runs CronFederatedHPA
//! rules at their times, [`federated`] keeps a FederatedHPA's workload at the replicas its
//! members' usage (and, if asked, its forecast) calls for; [`recommend`] is the pure HPA
//! algorithm the latter applies. Both set a workload template's replicas; the scheduler
//! divides the change among the clusters as the template's placement says.

pub mod cron;
pub mod federated;
pub mod recommend;

use orrery_api::autoscaling::CrossVersionObjectReference;
use orrery_api::keys;
use orrery_store::{Store, StoreError, update_with};

/// Where a workload template is stored, if it is a kind whose replicas are set.
pub fn target_key(ns: &str, r: &CrossVersionObjectReference) -> Option<String> {
    let plural = match r.kind.as_str() {
        "Deployment" => "deployments",
        "StatefulSet" => "statefulsets",
        "ReplicaSet" => "replicasets",
        _ => return None,
    };
    Some(keys::object("apps", plural, Some(ns), &r.name))
}

/// Sets the template's replicas (a no-op if it has them already); returns whether it changed.
pub async fn scale(store: &dyn Store, key: &str, replicas: i32) -> Result<bool, String> {
    let mut changed = false;
    let r = update_with(store, key, |o| {
        changed = false;
        let current = o
            .spec
            .as_ref()
            .and_then(|s| s.get("replicas"))
            .and_then(serde_json::Value::as_i64);
        if current == Some(i64::from(replicas)) {
            return Ok(None);
        }
        let mut next = o.clone();
        if let Some(spec) = next.spec.as_mut().and_then(|s| s.as_object_mut()) {
            spec.insert("replicas".into(), replicas.into());
        }
        next.metadata.generation = Some(orrery_store::stamp::next_generation(&o, &next));
        changed = true;
        Ok(Some(next))
    })
    .await;
    match r {
        Ok(_) => Ok(changed),
        Err(StoreError::NotFound { .. }) => Err("the scale target does not exist".into()),
        Err(e) => Err(e.to_string()),
    }
}
