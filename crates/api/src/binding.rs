//! `ResourceBinding` (multicluster.io/v1alpha1): one template, the policy that placed it, what
//! it needs, where the scheduler put it, and how it is doing in each cluster.

use std::collections::BTreeMap;

pub use crate::meta::short_hash;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::conditions::Condition;
use crate::meta::ResourceList;
use crate::policy::{
    ApplicationFailover, DIVIDED, Placement, PolicyRef, ReplicaScheduling, Suspension, Target,
};
use crate::stateful::{AffinityGroups, Transfer, VolumeClaim, VolumeStatus};
use crate::time::Time;
use crate::validation::{
    ErrorList, FieldError, is_dns1123_label, is_dns1123_subdomain, is_qualified_name,
};
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

/// `spec.resource.kind` of a standalone task's binding (`POST /api/v1/bindings` with a
/// `task`): the scheduler places it like any binding, but there is no template and no Work;
/// whoever submitted the task runs it where the decision says.
pub const TASK_KIND: &str = "Task";
/// Label on a standalone task's binding.
pub const TASK_LABEL: &str = "multicluster.io/task";

/// The template a binding is for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectReference {
    /// The template's API version.
    pub api_version: String,
    /// The template's kind.
    pub kind: String,
    /// The template's namespace.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// The template's name.
    pub name: String,
    /// The template's uid.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// The template's version this binding was last written for.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resource_version: String,
}

/// Whether a binding's `resource` of this API version and kind is a standalone task rather
/// than a template.
pub fn is_task(api_version: &str, kind: &str) -> bool {
    kind == TASK_KIND && api_version == API_VERSION
}

impl ObjectReference {
    /// Whether this names a standalone task rather than a template.
    pub fn is_task(&self) -> bool {
        is_task(&self.api_version, &self.kind)
    }
}

/// Karmada's `Component` of a binding: one part of a multi-component workload.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Component {
    /// Unique within the workload.
    pub name: String,
    /// Its replicas.
    #[serde(default)]
    pub replicas: i64,
    /// What each of its replicas requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_requirements: Option<ReplicaRequirements>,
}

impl BindingSpec {
    /// Whether the workload runs whole in one cluster: two or more components.
    pub fn is_whole_set(&self) -> bool {
        self.components.len() > 1
    }

    /// Whether each cluster runs its share of the replicas: a divided placement, unless the
    /// workload goes whole.
    pub fn divides_replicas(&self) -> bool {
        self.placement.divided() && !self.is_whole_set()
    }
}

impl Component {
    /// What each of its replicas requests (nothing when not said).
    pub fn request(&self) -> &ResourceList {
        static NONE: ResourceList = ResourceList::new();
        self.replica_requirements
            .as_ref()
            .map_or(&NONE, |r| &r.resource_request)
    }
}

/// What a whole set of parts requests: every part's replicas times its per-replica request,
/// summed, with the parts' pods counted under `pods`. A sum too large to count is the largest
/// quantity (it fits nowhere).
pub fn set_request<'a>(parts: impl IntoIterator<Item = (i64, &'a ResourceList)>) -> ResourceList {
    let mut out = ResourceList::new();
    let mut pods = 0i64;
    for (replicas, request) in parts {
        let n = replicas.max(0);
        pods = pods.saturating_add(n);
        for (name, q) in request.iter().filter(|(name, _)| *name != "pods") {
            let add = q
                .checked_mul(n)
                .unwrap_or_else(|| crate::Quantity::from_int(i64::MAX, q.format()));
            let sum = out.get(name).map_or(add, |have| *have + add);
            out.insert(name.clone(), sum);
        }
    }
    out.insert(
        "pods".into(),
        crate::Quantity::from_int(pods, crate::Format::DecimalSI),
    );
    out
}

/// Karmada's `SchedulePriority` of a binding.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SchedulePriority {
    /// Higher is scheduled first (0 when unset).
    #[serde(default)]
    pub priority: i32,
    /// The PriorityClass's `preemptionPolicy` (Karmada's binding-preemption proposal):
    /// `PreemptLowerPriority` may take room from lower priorities that are preemptible;
    /// `Never` does not.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub preemption_policy: String,
}

/// A PriorityClass's `preemptionPolicy` that preempts.
pub const PREEMPT_LOWER_PRIORITY: &str = "PreemptLowerPriority";

/// A standalone scheduling task (draft 7.1): how many replicas, what each needs, how urgent it
/// is, and where it may go. It becomes a ResourceBinding without a template.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Task {
    #[schemars(length(min = 1, max = 240))]
    pub name: String,
    /// Where its binding lives; `orrery-system` when empty.
    #[serde(default)]
    pub namespace: String,
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = TASK_MAX_REPLICAS))]
    pub replicas: i64,
    /// What each replica needs (`cpu`, `memory`, `nvidia.com/gpu`...).
    #[serde(default)]
    pub requirements: ResourceList,
    /// Higher is decided first.
    #[serde(default)]
    pub priority: i32,
    /// Where it may go and how its replicas divide; by default divided by water level over
    /// every ready cluster.
    #[serde(default)]
    // Karmada's placement with Orrery's fields: its full schema is the policies' (served at
    // /openapi/v3); here it is an object, so that what a fuzzer makes of it stays a request.
    #[schemars(with = "Option<serde_json::Map<String, serde_json::Value>>")]
    pub placement: Option<Placement>,
}

fn one() -> i64 {
    1
}

/// Most replicas one task may ask for.
pub const TASK_MAX_REPLICAS: i64 = 100_000;

impl Task {
    /// Field errors, with paths under `task.`.
    pub fn validate(&self) -> ErrorList {
        let mut errs = ErrorList::new();
        if self.name.is_empty() {
            errs.push(FieldError::required("task.name", ""));
        } else {
            for m in is_dns1123_subdomain(&self.name) {
                errs.push(FieldError::invalid("task.name", &self.name, m));
            }
            // Room for the binding name's suffix.
            if self.name.len() > 240 {
                errs.push(FieldError::too_long("task.name", 240));
            }
        }
        if !self.namespace.is_empty() {
            for m in is_dns1123_label(&self.namespace) {
                errs.push(FieldError::invalid("task.namespace", &self.namespace, m));
            }
        }
        if !(1..=TASK_MAX_REPLICAS).contains(&self.replicas) {
            errs.push(FieldError::invalid(
                "task.replicas",
                self.replicas,
                format!("must be between 1 and {TASK_MAX_REPLICAS}"),
            ));
        }
        for (name, q) in &self.requirements {
            let path = format!("task.requirements[{name}]");
            for m in is_qualified_name(name) {
                errs.push(FieldError::invalid(&path, name, m));
            }
            if q.is_negative() {
                errs.push(FieldError::invalid(&path, q, "must not be negative"));
            }
        }
        if let Some(p) = &self.placement {
            p.validate("task.placement", &mut errs);
        }
        errs
    }

    /// The namespace of the task's binding.
    pub fn binding_namespace(&self) -> &str {
        if self.namespace.is_empty() {
            SYSTEM_NAMESPACE
        } else {
            &self.namespace
        }
    }

    /// The binding's name: the task's name with a suffix no template kind produces.
    pub fn binding_name(&self) -> String {
        name_for(TASK_KIND, &self.name)
    }

    /// The binding spec the scheduler decides for.
    pub fn spec(&self) -> BindingSpec {
        let mut placement = self.placement.clone().unwrap_or_default();
        // A task's replicas are divided unless it says otherwise (Karmada's default,
        // Duplicated, would run every replica count in every cluster).
        if placement.replica_scheduling.is_none() {
            placement.replica_scheduling = Some(ReplicaScheduling {
                replica_scheduling_type: DIVIDED.into(),
                ..Default::default()
            });
        }
        BindingSpec {
            resource: ObjectReference {
                api_version: API_VERSION.into(),
                kind: TASK_KIND.into(),
                namespace: self.binding_namespace().to_string(),
                name: self.name.clone(),
                ..Default::default()
            },
            replicas: self.replicas,
            replica_requirements: (!self.requirements.is_empty()).then(|| ReplicaRequirements {
                resource_request: self.requirements.clone(),
            }),
            placement,
            priority: self.priority,
            ..Default::default()
        }
    }
}

/// Where bindings of cluster-scoped templates and standalone tasks without a namespace live.
pub const SYSTEM_NAMESPACE: &str = "orrery-system";

/// Another object a template needs in the same cluster (a ConfigMap it mounts...).
#[derive(
    Clone,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct Dependency {
    /// Its API version (v1).
    pub api_version: String,
    /// Its kind.
    pub kind: String,
    /// Its namespace.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// How many replicas one cluster runs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TargetCluster {
    /// The cluster.
    pub name: String,
    /// The replicas it runs.
    #[serde(default)]
    pub replicas: i64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaRequirements {
    /// What one replica requests (cpu, memory, nvidia.com/gpu...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resource_request: ResourceList,
}

/// A cluster the application was moved away from, and until when its old copy may stay.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Eviction {
    /// The cluster left.
    pub cluster: String,
    /// Why: ApplicationFailure, ClusterFailure, Shed...
    pub reason: String,
    /// When the move started.
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

/// The template, what its policy says of its placement, and where the scheduler placed it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BindingSpec {
    /// The template bound.
    pub resource: ObjectReference,
    /// Desired replicas of a divisible workload; 0 for kinds without replicas.
    #[serde(default)]
    pub replicas: i64,
    /// What one replica needs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_requirements: Option<ReplicaRequirements>,
    /// Objects the template uses, propagated with it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dependencies: Vec<Dependency>,
    /// The placement of the policy, as the scheduler applies it.
    #[serde(default)]
    pub placement: Placement,
    /// The draft's `targetClusters` of a ResourcePlacementPolicy (ORed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub target_clusters: Vec<Target>,
    /// The policy that placed the template.
    pub policy: PolicyRef,
    /// The policy's priority.
    #[serde(default)]
    pub priority: i32,
    /// Karmada's `components` (its `InterpretComponent`): a workload of two or more runs whole
    /// in one cluster.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub components: Vec<Component>,
    /// Karmada's scheduling priority: the value of the PriorityClass the policy's
    /// `schedulePriority` names; the scheduling queue takes higher values first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule_priority: Option<SchedulePriority>,
    /// Abort or Overwrite, from the policy.
    #[serde(default, skip_serializing_if = "is_abort")]
    pub conflict_resolution: ConflictResolution,
    /// Keep the objects in the members when the template is deleted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub preserve_resources_on_deletion: bool,
    /// Works held back, from the policy.
    #[serde(default, skip_serializing_if = "is_default")]
    pub suspension: Suspension,
    /// Application failover, from the policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failover: Option<ApplicationFailover>,
    /// Where the scheduler placed the template.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<TargetCluster>,
    /// Clusters the workload is moving away from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evictions: Vec<Eviction>,
    /// The volumes the template's pods own (from the template): a binding with any is
    /// stateful, and moves only through a Migration.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeClaim>,
    /// Karmada's affinity groups, from the placement's `workloadAffinity` and the template's
    /// labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity_groups: Option<AffinityGroups>,
    /// The Migration moving the workload now (the scheduler leaves the binding alone until it
    /// is done).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub migration: String,
    /// Clusters whose copy must run no pods (a migration's fence): rendered with no
    /// replicas, volumes kept.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fenced: Vec<String>,
    /// Volume transfers, each rendered into its cluster's Work (a cluster may take part in
    /// one without running the workload).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub transfers: Vec<ClusterTransfer>,
    /// Where a standby copy of a stateful workload is kept (`placement.stateful.standby`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub standby: String,
    /// Karmada's `schedulerName`, from the policy: another scheduler's bindings are left to it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub scheduler_name: String,
    /// What the template reads and how much work it is (its pod template's annotations).
    #[serde(default, skip_serializing_if = "crate::data::WorkloadData::is_empty")]
    pub data: crate::data::WorkloadData,
}

/// A transfer one cluster takes part in.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterTransfer {
    /// The cluster taking part.
    pub cluster: String,
    /// What it does.
    pub transfer: Transfer,
}

impl BindingSpec {
    /// Whether the template's pods own persistent volumes.
    pub fn is_stateful(&self) -> bool {
        !self.volumes.is_empty()
    }

    /// What this binding, stored in `namespace`, names outside it: a binding reaches only its
    /// own namespace's template, dependencies and volumes (a cluster-scoped template's binding
    /// lives in [`SYSTEM_NAMESPACE`] and names no namespace). Empty when it stays home.
    pub fn foreign_references(&self, namespace: &str) -> ErrorList {
        let mut errs = ErrorList::new();
        let home = if namespace == SYSTEM_NAMESPACE && self.resource.namespace.is_empty() {
            ""
        } else {
            namespace
        };
        let mut check = |field: String, ns: &str| {
            if ns != home {
                errs.push(FieldError::forbidden(
                    field,
                    format!(
                        "a ResourceBinding in namespace {namespace:?} refers to objects there only, not in {ns:?}"
                    ),
                ));
            }
        };
        check("spec.resource.namespace".into(), &self.resource.namespace);
        for (i, d) in self.dependencies.iter().enumerate() {
            check(format!("spec.dependencies[{i}].namespace"), &d.namespace);
        }
        for (i, t) in self.transfers.iter().enumerate() {
            check(
                format!("spec.transfers[{i}].transfer.namespace"),
                &t.transfer.namespace,
            );
        }
        errs
    }
}

fn is_abort(c: &ConflictResolution) -> bool {
    *c == ConflictResolution::Abort
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// How the template is doing in one cluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AggregatedStatusItem {
    /// The cluster.
    pub cluster_name: String,
    /// Whether the member applied the Work.
    #[serde(default)]
    pub applied: bool,
    /// Healthy, Progressing, Unhealthy or Unknown.
    #[serde(default)]
    pub health: Health,
    /// The template's status there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Value>,
    /// Why it is not applied or healthy.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Since when the health has been what it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_since: Option<Time>,
    /// The persistent volumes the template's pods use there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeStatus>,
}

/// Why a cluster was or was not chosen, in short.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterDecision {
    /// The cluster.
    pub name: String,
    /// Replicas given to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i64>,
    /// Why it was or was not chosen.
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
    /// For a workload that reads data sets: its completion here, in its parts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate: Option<CompletionEstimate>,
    /// Its water level now and, judged by the forecast, over the prediction horizon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub water_level: Option<crate::prediction::LevelSeen>,
    /// What one replica costs there per hour, where the cluster has prices for what the
    /// workload requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_hourly: Option<f64>,
}

/// What a binding's replicas cost per hour.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BindingCost {
    /// All its priced replicas together.
    pub hourly: f64,
    /// Per cluster with prices (a list, as Kubernetes lists what is named: kubectl describe
    /// would print a map's cluster names as if they were field names). A map, as earlier
    /// versions wrote it, is read too.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "cluster_costs"
    )]
    pub clusters: Vec<ClusterCost>,
    /// Clusters it runs in that have no price for what it requests (not counted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unpriced: Vec<String>,
}

/// What a binding's replicas in one cluster cost per hour.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterCost {
    pub name: String,
    pub hourly: f64,
}

impl BindingCost {
    /// One cluster's cost, if it has prices.
    pub fn of(&self, cluster: &str) -> Option<f64> {
        self.clusters
            .iter()
            .find(|c| c.name == cluster)
            .map(|c| c.hourly)
    }
}

fn cluster_costs<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<ClusterCost>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        List(Vec<ClusterCost>),
        Map(std::collections::BTreeMap<String, f64>),
    }
    Ok(match Either::deserialize(d)? {
        Either::List(l) => l,
        Either::Map(m) => m
            .into_iter()
            .map(|(name, hourly)| ClusterCost { name, hourly })
            .collect(),
    })
}

/// A data-aware workload's completion in one cluster: the transfer of the inputs it does not
/// hold, the wait for room, and the compute at its GPU performance.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CompletionEstimate {
    /// Transfer, wait and compute together.
    pub total_seconds: f64,
    /// Copying the inputs it does not hold.
    pub transfer_seconds: f64,
    /// Waiting for room: the rounds its replicas run in beyond the first.
    pub wait_seconds: f64,
    /// Computing, at its GPU performance.
    pub compute_seconds: f64,
    /// Bytes copied to it.
    #[serde(default)]
    pub transfer_bytes: i64,
    /// What those bytes cost leaving their sources.
    #[serde(default)]
    pub egress_cost: f64,
    /// Where each input would come from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fetches: Vec<DataFetch>,
}

/// One input's way to a cluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataFetch {
    /// The data set.
    pub dataset: String,
    /// The cluster it comes from.
    pub from: String,
    /// The cluster it is relayed through, when the path from its source is slower than two
    /// hops through it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub via: String,
    /// Its bytes.
    pub bytes: i64,
}

/// How the template was placed and how it runs: written by the scheduler and the binding
/// controller.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BindingStatus {
    /// Scheduled, FullyApplied and others.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// How the template runs in each cluster.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aggregated_status: Vec<AggregatedStatusItem>,
    /// The spec generation the scheduler last decided for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_observed_generation: Option<i64>,
    /// The affinity term of `clusterAffinities` the last decision used.
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
    /// How the last decision judged the clusters' water levels: by their forecast (`Upper80 over 30m`) or by their present level, and why.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub prediction: String,
    /// What the placed replicas cost per hour, in the fleet's prices' currency: in all and
    /// per cluster. Absent when no cluster it runs in has prices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<BindingCost>,
    /// Replicas that fit in no cluster under the water level limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unplaced_replicas: Option<i64>,
    /// The id of the last scheduling task, as in the schedule history.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub task_id: String,
    /// The value of the reschedule annotation last answered.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reschedule_observed: String,
    /// When the scheduler last decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scheduled_time: Option<Time>,
    /// A stateful workload's standby copy (`placement.stateful.standby`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standby: Option<crate::stateful::StandbyStatus>,
    /// Its replicas per location: the clusters labelled with a city code
    /// (`topology.datum.net/city-code`), summed per code.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub locations: Vec<LocationReplicas>,
    /// Where the rollout of its template's latest revision stands
    /// (`placement.rollout`), cluster by cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<crate::rollout::RolloutStatus>,
}

impl BindingSpec {
    /// A binding's spec, read in place; `None` if it has none or it does not parse.
    pub fn of(b: &crate::Object) -> Option<BindingSpec> {
        BindingSpec::deserialize(b.spec.as_ref()?).ok()
    }
}

impl BindingStatus {
    /// A binding's status, read in place (empty if it has none or it does not parse).
    pub fn of(b: &crate::Object) -> BindingStatus {
        b.status
            .as_ref()
            .and_then(|s| BindingStatus::deserialize(s).ok())
            .unwrap_or_default()
    }
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

/// A workload's replicas in one location.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LocationReplicas {
    /// The city code.
    pub location: String,
    pub clusters: Vec<String>,
    /// Replicas placed there (the divided share; for a duplicated workload, each cluster's
    /// whole count).
    #[serde(default)]
    pub replicas: i64,
    /// Replicas ready there, as the members report them.
    #[serde(default)]
    pub ready_replicas: i64,
    /// Members there where the workload is healthy.
    #[serde(default)]
    pub healthy_clusters: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cost_per_cluster_is_a_list_and_the_old_map_is_read() {
        let new: BindingCost = serde_json::from_value(serde_json::json!(
            {"hourly": 0.3, "clusters": [{"name": "aws-us-east", "hourly": 0.1}, {"name": "b", "hourly": 0.2}]}
        ))
        .unwrap();
        let old: BindingCost = serde_json::from_value(serde_json::json!(
            {"hourly": 0.3, "clusters": {"aws-us-east": 0.1, "b": 0.2}}
        ))
        .unwrap();
        assert_eq!(new, old);
        assert_eq!(new.of("b"), Some(0.2));
        assert_eq!(
            serde_json::to_value(&new).unwrap()["clusters"][0],
            serde_json::json!({"name": "aws-us-east", "hourly": 0.1})
        );
    }

    fn task(v: serde_json::Value) -> Result<Task, serde_json::Error> {
        serde_json::from_value(v)
    }

    /// A binding reaches its own namespace only: its template, dependencies and volumes;
    /// a cluster-scoped template's binding (in orrery-system) names no namespace.
    #[test]
    fn a_binding_refers_to_its_own_namespace_only() {
        let spec = |v: serde_json::Value| -> BindingSpec { serde_json::from_value(v).unwrap() };
        let home = spec(serde_json::json!({
            "resource": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "team-a", "name": "web"},
            "dependencies": [{"apiVersion": "v1", "kind": "Secret", "namespace": "team-a", "name": "s"}],
            "placement": {},
            "policy": {"apiVersion": "multicluster.io/v1alpha1", "kind": "ResourcePlacementPolicy", "name": "p"},
        }));
        assert!(home.foreign_references("team-a").is_empty());
        let errs = home.foreign_references("team-b");
        assert_eq!(
            errs.iter().map(|e| e.field.as_str()).collect::<Vec<_>>(),
            ["spec.resource.namespace", "spec.dependencies[0].namespace"]
        );
        let grab = spec(serde_json::json!({
            "resource": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "team-a", "name": "web"},
            "dependencies": [{"apiVersion": "v1", "kind": "Secret", "namespace": "team-b", "name": "s2"}],
            "transfers": [{"cluster": "c1", "transfer": {"id": "x", "role": "Send", "namespace": "kube-system", "peer": "c2", "round": 1, "volumes": []}}],
            "placement": {},
            "policy": {"apiVersion": "multicluster.io/v1alpha1", "kind": "ResourcePlacementPolicy", "name": "p"},
        }));
        let errs = grab.foreign_references("team-a");
        assert_eq!(
            errs.iter().map(|e| e.field.as_str()).collect::<Vec<_>>(),
            [
                "spec.dependencies[0].namespace",
                "spec.transfers[0].transfer.namespace"
            ]
        );
        assert!(errs[0].detail.contains("not in \"team-b\""), "{errs:?}");
        let cluster_scoped = spec(serde_json::json!({
            "resource": {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "name": "r"},
            "placement": {},
            "policy": {"apiVersion": "multicluster.io/v1alpha1", "kind": "ResourcePlacementPolicy", "name": "p"},
        }));
        assert!(
            cluster_scoped
                .foreign_references(SYSTEM_NAMESPACE)
                .is_empty()
        );
        assert!(!cluster_scoped.foreign_references("team-a").is_empty());
    }

    #[test]
    fn standalone_tasks() {
        let t = task(serde_json::json!({
            "name": "train", "replicas": 4, "priority": 7,
            "requirements": {"cpu": "2", "nvidia.com/gpu": "1"},
        }))
        .unwrap();
        assert!(t.validate().is_empty(), "{:?}", t.validate());
        assert_eq!(t.binding_namespace(), SYSTEM_NAMESPACE);
        assert_eq!(t.binding_name(), "train-task");
        let spec = t.spec();
        assert!(spec.resource.is_task());
        assert_eq!((spec.replicas, spec.priority), (4, 7));
        // Divided by default: a task's replicas are a total, not a count per cluster.
        assert!(spec.placement.divided());
        let req = &spec.replica_requirements.unwrap().resource_request;
        assert_eq!(req["cpu"].milli_value(), 2000);
        // An explicit Duplicated stays.
        let t = task(serde_json::json!({"name": "d", "placement": {"replicaScheduling": {"replicaSchedulingType": "Duplicated"}}})).unwrap();
        assert_eq!(t.replicas, 1);
        assert!(!t.spec().placement.divided());
        // A template's reference is not a task's.
        let r = ObjectReference {
            api_version: "apps/v1".into(),
            kind: TASK_KIND.into(),
            ..Default::default()
        };
        assert!(!r.is_task());
    }

    #[test]
    fn bad_tasks() {
        for (body, field) in [
            (serde_json::json!({"name": ""}), "task.name"),
            (serde_json::json!({"name": "Not_A_Name"}), "task.name"),
            (
                serde_json::json!({"name": "a", "namespace": "a.b"}),
                "task.namespace",
            ),
            (
                serde_json::json!({"name": "a", "replicas": 0}),
                "task.replicas",
            ),
            (
                serde_json::json!({"name": "a", "replicas": 100_001}),
                "task.replicas",
            ),
            (
                serde_json::json!({"name": "a", "requirements": {"cpu": "-1"}}),
                "task.requirements[cpu]",
            ),
            (
                serde_json::json!({"name": "a", "requirements": {"bad name!": "1"}}),
                "task.requirements[bad name!]",
            ),
            (
                serde_json::json!({"name": "a", "placement": {"waterLevelLimit": 2.0}}),
                "task.placement.waterLevelLimit",
            ),
        ] {
            let errs = task(body.clone()).unwrap().validate();
            assert!(errs.iter().any(|e| e.field == field), "{body}: {errs:?}");
        }
        // Unknown fields and wrong types do not parse.
        assert!(task(serde_json::json!({"name": "a", "gpu": 1})).is_err());
        assert!(task(serde_json::json!({"name": "a", "requirements": {"cpu": "lots"}})).is_err());
    }

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
