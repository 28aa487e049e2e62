//! `ResourceBinding` (multicluster.io/v1alpha1): one template, the policy that placed it, what
//! it needs, where the scheduler put it, and how it is doing in each cluster.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::cluster::ResourceList;
use crate::conditions::Condition;
use crate::policy::{ApplicationFailover, Placement, PolicyRef, Suspension, Target};
use crate::time::Time;
use crate::work::{ConflictResolution, Health};

pub const API_VERSION: &str = "multicluster.io/v1alpha1";
pub const KIND: &str = "ResourceBinding";

pub const CONDITION_SCHEDULED: &str = "Scheduled";
pub const CONDITION_FULLY_APPLIED: &str = "FullyApplied";

/// Finalizer on templates (and bindings): their Works and member objects go first.
pub const FINALIZER: &str = "multicluster.io/propagation";
/// Annotation on Works naming their binding (`namespace/name`).
pub const BINDING_ANNOTATION: &str = "multicluster.io/binding";
/// Label on Works: the binding's namespace (for listing a namespace's Works).
pub const BINDING_NAMESPACE_LABEL: &str = "multicluster.io/binding-namespace";
/// Annotation on templates: whose policy placed it.
pub const POLICY_ANNOTATION: &str = "multicluster.io/policy";
/// Set (to any new value, e.g. a time) to ask the scheduler for a fresh decision; the value
/// it answered is in `status.rescheduleObserved` (`POST /api/v1/bindings` uses it).
pub const RESCHEDULE_ANNOTATION: &str = "multicluster.io/reschedule";

/// The template a binding is for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectReference {
    pub api_version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resource_version: String,
}

/// Another object a template needs in the same cluster (a ConfigMap it mounts...).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Dependency {
    pub api_version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    pub name: String,
}

/// How many replicas one cluster runs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetCluster {
    pub name: String,
    #[serde(default)]
    pub replicas: i64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaRequirements {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resource_request: ResourceList,
}

/// A cluster the application was moved away from, and until when its old copy may stay.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Eviction {
    pub cluster: String,
    pub reason: String,
    pub since: Time,
    /// The old copy is kept until the new placement is healthy or this time passes; `None`
    /// removes it at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_until: Option<Time>,
    /// `Never`: the old copy is kept.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keep: bool,
    /// The scheduler moved the replicas (the cluster went dark or shed load); unlike an
    /// application failover, the cluster stays eligible, and the entry goes once the old
    /// copy is gone.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rescheduled: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BindingSpec {
    pub resource: ObjectReference,
    /// Desired replicas of a divisible workload; 0 for kinds without replicas.
    #[serde(default)]
    pub replicas: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_requirements: Option<ReplicaRequirements>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dependencies: Vec<Dependency>,
    #[serde(default)]
    pub placement: Placement,
    /// The draft's `targetClusters` of a ResourcePlacementPolicy (ORed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub target_clusters: Vec<Target>,
    pub policy: PolicyRef,
    #[serde(default)]
    pub priority: i32,
    #[serde(default, skip_serializing_if = "is_abort")]
    pub conflict_resolution: ConflictResolution,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub preserve_resources_on_deletion: bool,
    #[serde(default, skip_serializing_if = "is_default")]
    pub suspension: Suspension,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failover: Option<ApplicationFailover>,
    /// Where the scheduler placed the template.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<TargetCluster>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evictions: Vec<Eviction>,
}

fn is_abort(c: &ConflictResolution) -> bool {
    *c == ConflictResolution::Abort
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// How the template is doing in one cluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AggregatedStatusItem {
    pub cluster_name: String,
    #[serde(default)]
    pub applied: bool,
    #[serde(default)]
    pub health: Health,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Value>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Since when the health has been what it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_since: Option<Time>,
}

/// Why a cluster was or was not chosen, in short.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterDecision {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i64>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// The filter plugin that turned the cluster away.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub filter: String,
    /// The weighted total score (0-100) of a cluster that passed the filters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
    /// Each score plugin's rating.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub scores: std::collections::BTreeMap<String, f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BindingStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aggregated_status: Vec<AggregatedStatusItem>,
    /// The spec generation the scheduler last decided for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub scheduler_observed_affinity_name: String,
    /// The last decision, cluster by cluster (the chosen ones, then the best of the others,
    /// up to 10).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub decisions: Vec<ClusterDecision>,
    /// How many clusters each filter turned away in the last decision.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub filtered: std::collections::BTreeMap<String, i64>,
    /// How the replicas were divided (WaterFilling, Aggregation, ScoreWeighted,
    /// StaticWeight...).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub strategy: String,
    /// Replicas that fit in no cluster under the water level limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unplaced_replicas: Option<i64>,
    /// The id of the last scheduling task, as in the schedule history.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub task_id: String,
    /// The value of the reschedule annotation last answered.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reschedule_observed: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scheduled_time: Option<Time>,
}

fn short_hash(s: &str) -> String {
    crate::token::ca_hash(s)[..10].to_string()
}

/// The binding's name for a template: `<name>-<kind>`, as Karmada names them.
pub fn name_for(kind: &str, name: &str) -> String {
    let full = format!("{name}-{}", kind.to_lowercase());
    if full.len() <= 253 {
        return full;
    }
    // Too long: keep a readable head and make it unique with a hash.
    let digest = short_hash(&full);
    format!("{}-{digest}", &full[..240])
}

/// The Work's name for a binding: `<namespace>.<binding>` (unique within a cluster's
/// namespace, where the Works of every namespace meet).
pub fn work_name(namespace: &str, binding: &str) -> String {
    let full = format!("{namespace}.{binding}");
    if full.len() <= 253 {
        return full;
    }
    let digest = short_hash(&full);
    format!("{}-{digest}", &full[..240])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(name_for("Deployment", "web"), "web-deployment");
        assert_eq!(
            work_name("default", "web-deployment"),
            "default.web-deployment"
        );
        let long = "a".repeat(250);
        let n = name_for("Deployment", &long);
        assert!(n.len() <= 253, "{}", n.len());
        assert_ne!(n, name_for("StatefulSet", &long));
        let spec = BindingSpec::default();
        let v = serde_json::to_value(&spec).unwrap();
        assert!(
            v.get("suspension").is_none() && v.get("conflictResolution").is_none(),
            "{v}"
        );
    }
}
