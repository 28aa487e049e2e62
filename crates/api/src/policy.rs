//! Placement policies: which templates go where.
//!
//! Three kinds say it, and all become one [`PlacementPolicy`]:
//! - `ResourcePlacementPolicy` (multicluster.io/v1alpha1), the draft's 6.2.3 shape with
//!   Orrery's extensions (`labelSelector` in the selector, a Karmada-style `placement`);
//! - Karmada's `PropagationPolicy` (namespaced) and `ClusterPropagationPolicy`
//!   (policy.karmada.io/v1alpha1), accepted unchanged.
//!
//! Every field is decoded strictly: a field Orrery does not know, or does not support yet, is
//! a validation error naming its path, never silently ignored.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::labels::LabelSelector;
use crate::object::Object;
use crate::validation::{ErrorList, FieldError};

pub use crate::meta::decode;
use crate::work::ConflictResolution;

pub const GROUP: &str = "multicluster.io";
pub const KARMADA_GROUP: &str = "policy.karmada.io";

/// What a policy selects: a kind, optionally narrowed by name or labels.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResourceSelector {
    /// The API version of the templates selected, e.g. apps/v1.
    pub api_version: String,
    /// The kind of the templates selected, e.g. Deployment.
    pub kind: String,
    /// Only templates of this namespace (cluster-wide policies); empty: any.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Only the template of this name; empty: any.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Only templates whose labels match; ignored when `name` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<LabelSelector>,
}

/// How specific a match is: a name beats labels beats the kind alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Specificity {
    Kind = 1,
    Labels = 2,
    Name = 3,
}

impl ResourceSelector {
    /// Whether `t` is selected, and how specifically.
    pub fn matches(&self, t: &Object) -> Option<Specificity> {
        if t.kind != self.kind
            || !crate::meta::same_schema(&t.kind, &t.api_version, &self.api_version)
        {
            return None;
        }
        if !self.namespace.is_empty() && t.namespace() != self.namespace {
            return None;
        }
        let mut how = Specificity::Kind;
        if let Some(ls) = &self.label_selector {
            let sel = ls.to_selector().ok()?;
            if !sel.matches(&t.metadata.labels) {
                return None;
            }
            how = Specificity::Labels;
        }
        if !self.name.is_empty() {
            if t.name() != self.name {
                return None;
            }
            how = Specificity::Name;
        }
        Some(how)
    }

    fn validate(&self, path: &str, errs: &mut ErrorList) {
        if self.api_version.is_empty() {
            errs.push(FieldError::required(format!("{path}.apiVersion"), ""));
        }
        if self.kind.is_empty() {
            errs.push(FieldError::required(format!("{path}.kind"), ""));
        }
        if let Some(ls) = &self.label_selector
            && let Err(e) = ls.to_selector()
        {
            errs.push(FieldError::invalid(
                format!("{path}.labelSelector"),
                "",
                e.0,
            ));
        }
    }
}

/// Karmada's `ClusterAffinity`: the conditions are ANDed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterAffinity {
    /// Clusters whose labels match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<LabelSelector>,
    /// Clusters whose provider, region or zone match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field_selector: Option<FieldSelector>,
    /// Clusters by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_names: Vec<String>,
    /// Clusters never chosen, by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<String>,
}

/// A named affinity term of `clusterAffinities`, tried in order. It repeats
/// `ClusterAffinity`'s fields because serde cannot combine `flatten` with
/// `deny_unknown_fields`, and unknown fields must be refused.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterAffinityTerm {
    /// Names the term; the binding's status says which term the scheduler used.
    pub affinity_name: String,
    /// Clusters whose labels match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<LabelSelector>,
    /// Clusters whose provider, region or zone match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field_selector: Option<FieldSelector>,
    /// Clusters by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_names: Vec<String>,
    /// Clusters never chosen, by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<String>,
    /// Karmada 1.18: further cluster groups, in order, that a workload's replicas spill into
    /// when the groups before them are full (the inline affinity is the first group); scale
    /// down empties them in reverse. A cluster belongs to the first group that matches it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub overflow_affinities: Vec<OverflowClusterAffinity>,
}

impl ClusterAffinityTerm {
    pub fn affinity(&self) -> ClusterAffinity {
        ClusterAffinity {
            label_selector: self.label_selector.clone(),
            field_selector: self.field_selector.clone(),
            cluster_names: self.cluster_names.clone(),
            exclude: self.exclude.clone(),
        }
    }
}

/// One overflow group of a [`ClusterAffinityTerm`] (Karmada's `OverflowClusterAffinity`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OverflowClusterAffinity {
    /// Names the group (a label key, at most 32 characters, unique within its term).
    pub affinity_name: String,
    /// Clusters whose labels match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<LabelSelector>,
    /// Clusters whose provider, region or zone match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field_selector: Option<FieldSelector>,
    /// Clusters by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_names: Vec<String>,
    /// Clusters never chosen, by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<String>,
}

impl OverflowClusterAffinity {
    pub fn affinity(&self) -> ClusterAffinity {
        ClusterAffinity {
            label_selector: self.label_selector.clone(),
            field_selector: self.field_selector.clone(),
            cluster_names: self.cluster_names.clone(),
            exclude: self.exclude.clone(),
        }
    }
}

impl ClusterAffinity {
    /// Whether it selects nothing in particular (Karmada's `emptyClusterAffinity`).
    pub fn is_empty(&self) -> bool {
        self.label_selector.is_none()
            && self.field_selector.is_none()
            && self.cluster_names.is_empty()
            && self.exclude.is_empty()
    }
}

/// Selection by the cluster's `provider`, `region` or `zone`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FieldSelector {
    /// Requirements on the cluster's fields, ANDed.
    #[serde(default)]
    pub match_expressions: Vec<FieldRequirement>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FieldRequirement {
    /// The cluster field: provider, region or zone.
    pub key: String,
    /// In or NotIn.
    pub operator: String,
    /// The values the field is compared with.
    #[serde(default)]
    pub values: Vec<String>,
}

pub const FIELD_KEYS: &[&str] = &["provider", "region", "zone"];
pub const FIELD_OPERATORS: &[&str] = &["In", "NotIn"];

/// A toleration of a cluster taint (`corev1.Toleration`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Toleration {
    /// The taint key tolerated; empty with operator Exists: every taint.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub key: String,
    /// Exists (any value) or Equal (the default: the value must match).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub operator: String,
    /// The taint value tolerated (operator Equal).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub value: String,
    /// The taint effect tolerated (NoSchedule, PreferNoSchedule, NoExecute); empty: all.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub effect: String,
    /// With NoExecute: how long the workload stays on a cluster tainted after it was placed; unset: forever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toleration_seconds: Option<i64>,
}

impl Toleration {
    /// Whether this toleration covers a taint (`key`, `value`, `effect`).
    pub fn tolerates(&self, key: &str, value: &str, effect: &str) -> bool {
        if !self.effect.is_empty() && self.effect != effect {
            return false;
        }
        // As Kubernetes' `ToleratesTaint`: an empty key matches every key.
        if !self.key.is_empty() && self.key != key {
            return false;
        }
        match self.operator.as_str() {
            "Exists" => true,
            "" | "Equal" => self.value == value,
            _ => false,
        }
    }
}

/// Karmada's `SpreadConstraint`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SpreadConstraint {
    /// Spread over groups of clusters sharing this field: cluster, region, zone or provider.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub spread_by_field: String,
    /// Spread over groups of clusters sharing this label's value.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub spread_by_label: String,
    /// At most this many groups.
    #[serde(default)]
    pub max_groups: i64,
    /// At least this many groups, or the template is not scheduled.
    #[serde(default)]
    pub min_groups: i64,
}

pub const SPREAD_FIELDS: &[&str] = &["cluster", "region", "zone", "provider"];

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StaticClusterWeight {
    /// The clusters this weight applies to.
    pub target_cluster: ClusterAffinity,
    /// Their weight: replicas divide in proportion. 0 or more: 0 gives them none (Karmada asks
    /// for at least 1; a policy it accepts means the same here).
    pub weight: i64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WeightPreference {
    /// Fixed weights per group of clusters.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub static_weight_list: Vec<StaticClusterWeight>,
    /// Weights from each cluster's state: AvailableReplicas (Karmada: how many replicas fit) or WaterLevel (Orrery: by Resource Water Level). Overrides the static list.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub dynamic_weight: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReplicaScheduling {
    /// Duplicated (every cluster runs all replicas, Karmada's default) or Divided (the replicas are shared out).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub replica_scheduling_type: String,
    /// How Divided shares replicas: Aggregated (in as few clusters as possible) or Weighted (by weightPreference). Without a preference, Karmada's kinds divide equally and a ResourcePlacementPolicy divides by water level.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub replica_division_preference: String,
    /// The weights of Weighted division; absent: equal weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_preference: Option<WeightPreference>,
}

pub const DUPLICATED: &str = "Duplicated";
pub const DIVIDED: &str = "Divided";
pub const AGGREGATED: &str = "Aggregated";
pub const WEIGHTED: &str = "Weighted";
pub const AVAILABLE_REPLICAS: &str = "AvailableReplicas";
/// Orrery's division by Resource Water Level (also what Divided means without weights).
pub const WATER_LEVEL: &str = "WaterLevel";

/// Karmada's `Placement` (the same block in a ResourcePlacementPolicy).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Placement {
    /// The clusters the template may go to; absent: every cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_affinity: Option<ClusterAffinity>,
    /// Affinity terms tried in order: the first under which the template fits is used.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_affinities: Vec<ClusterAffinityTerm>,
    /// The cluster taints the template tolerates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_tolerations: Vec<Toleration>,
    /// How many groups of clusters (regions, zones, providers) the template spreads over.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub spread_constraints: Vec<SpreadConstraint>,
    /// Whether replicas are duplicated or divided, and how.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_scheduling: Option<ReplicaScheduling>,
    /// Orrery: capabilities every chosen cluster must offer (`gpu`...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<String>,
    /// Orrery: no cluster is filled beyond this water level (0 < limit <= 1); the server's
    /// default when unset. Set, it holds Karmada's divisions too (static weights, equal,
    /// AvailableReplicas, Aggregated); unset, those divide as Karmada does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub water_level_limit: Option<f64>,
    /// Orrery: when a cluster recovers, divide the replicas afresh so it takes its share
    /// again; by default what runs stays where it is.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rebalance_on_recovery: bool,
    /// Orrery (the draft's follow-up scheduling): run where this workload of the same
    /// namespace runs; if those clusters cannot hold it, in the nearest by latency. When the
    /// leader moves, this one follows once the leader serves at its new place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follow_up: Option<crate::stateful::FollowUp>,
    /// Karmada's inter-workload affinity (KEP-521): groups kept together or apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_affinity: Option<crate::stateful::WorkloadAffinity>,
    /// Orrery: a stateful workload's standby copy and what to do when its data is lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stateful: Option<crate::stateful::StatefulPlacement>,
    /// Orrery: what to optimize for a workload that reads data sets (the pod template's
    /// `orrery.io/datasets`): its completion time (the default) or the egress its inputs
    /// cost, and the most that may be copied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_policy: Option<crate::data::DataPolicy>,
    /// Orrery: judge clusters by their forecast water level over a horizon (the larger of the present level and the forecast), so a cluster about to peak receives no new replicas and sheds replicas before it crosses the shed mark. Absent: the server's default (30m, Upper80) for clusters with a season of history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prediction: Option<crate::prediction::Prediction>,
    /// Orrery's: how much price counts, a budget and an on-demand floor (docs/cost.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<crate::cost::CostPolicy>,
    /// Orrery: how a change of the template reaches the clusters: stage by stage, each
    /// gated on the health of the last (docs/rollouts.md). Absent: all at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<crate::rollout::RolloutStrategy>,
    /// Orrery: how many replicas the moves Orrery makes of its own (failover, shedding,
    /// consolidation, rebalancing) may take down at once (docs/rollouts.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disruption_budget: Option<crate::rollout::DisruptionBudget>,
    /// Orrery: a workload of a higher `schedulePriority` whose PriorityClass preempts may
    /// take this workload's room in a full cluster: its replicas there move elsewhere,
    /// make-before-break and within its disruption budget, or wait (docs/scheduling.md).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub preemptible: bool,
}

impl Placement {
    /// Whether its replicas are consolidated onto cheaper clusters (`cost.consolidate` with
    /// a weight).
    pub fn consolidates(&self) -> bool {
        self.cost.as_ref().is_some_and(|c| c.consolidates())
    }

    /// Appends the errors of the placement at `path` to `errs`.
    pub fn validate(&self, path: &str, errs: &mut ErrorList) {
        self.validate_affinities(path, errs);
        for (i, t) in self.cluster_tolerations.iter().enumerate() {
            validate_toleration(t, &format!("{path}.clusterTolerations[{i}]"), errs);
        }
        if let Some(l) = self.water_level_limit
            && !(l > 0.0 && l <= 1.0)
        {
            errs.push(FieldError::invalid(
                format!("{path}.waterLevelLimit"),
                l,
                "must be greater than 0 and at most 1",
            ));
        }
        for (i, c) in self.capabilities.iter().enumerate() {
            if c.is_empty() {
                errs.push(FieldError::required(
                    format!("{path}.capabilities[{i}]"),
                    "",
                ));
            }
        }
        for (i, s) in self.spread_constraints.iter().enumerate() {
            validate_spread_constraint(s, &format!("{path}.spreadConstraints[{i}]"), errs);
        }
        self.validate_orrery_parts(path, errs);
        if let Some(r) = &self.replica_scheduling {
            validate_replica_scheduling(r, &format!("{path}.replicaScheduling"), errs);
        }
    }

    /// `clusterAffinity`, or `clusterAffinities` (not both): each term named, uniquely.
    fn validate_affinities(&self, path: &str, errs: &mut ErrorList) {
        if self.cluster_affinity.is_some() && !self.cluster_affinities.is_empty() {
            errs.push(FieldError::forbidden(
                format!("{path}.clusterAffinities"),
                "clusterAffinity and clusterAffinities cannot both be set",
            ));
        }
        if let Some(a) = &self.cluster_affinity {
            validate_affinity(a, &format!("{path}.clusterAffinity"), errs);
        }
        let mut names = std::collections::BTreeSet::new();
        for (i, t) in self.cluster_affinities.iter().enumerate() {
            let p = format!("{path}.clusterAffinities[{i}]");
            if t.affinity_name.is_empty() {
                errs.push(FieldError::required(format!("{p}.affinityName"), ""));
            } else if !names.insert(t.affinity_name.clone()) {
                errs.push(FieldError::duplicate(
                    format!("{p}.affinityName"),
                    &t.affinity_name,
                ));
            }
            validate_affinity(&t.affinity(), &p, errs);
            self.validate_overflow(t, &p, errs);
        }
    }

    /// Karmada's `ValidateOverflowAffinities` and its placement check, with its messages;
    /// and what Orrery refuses beside them (docs/scheduling.md, "Overflow affinities").
    fn validate_overflow(&self, t: &ClusterAffinityTerm, p: &str, errs: &mut ErrorList) {
        if t.overflow_affinities.is_empty() {
            return;
        }
        let path = format!("{p}.overflowAffinities");
        if !self.divides_dynamically() {
            errs.push(FieldError::invalid(
                &path,
                "",
                "overflowAffinities can only be used together with dynamic weight or aggregated scheduling",
            ));
        }
        if t.affinity().is_empty() {
            errs.push(FieldError::invalid(
                &path,
                "",
                "overflowAffinities can only be used together with the inline ClusterAffinity",
            ));
        }
        // Each group is filled in turn under its own division: a fleet-wide budget or spread
        // across groups would have to be shared between them, which Orrery does not do.
        if self
            .cost
            .as_ref()
            .is_some_and(|c| c.max_hourly.is_some() || c.min_on_demand.is_some())
        {
            errs.push(FieldError::invalid(
                &path,
                "",
                "overflowAffinities cannot be combined with cost.maxHourly or cost.minOnDemand",
            ));
        }
        if self
            .spread_constraints
            .iter()
            .any(|s| s.spread_by_field != "cluster")
        {
            errs.push(FieldError::invalid(
                &path,
                "",
                "overflowAffinities cannot be combined with spread constraints over regions, zones, providers or labels",
            ));
        }
        let mut names = std::collections::BTreeSet::from([t.affinity_name.as_str()]);
        for (i, o) in t.overflow_affinities.iter().enumerate() {
            let name_path = format!("{path}[{i}].affinityName");
            if o.affinity_name.is_empty() {
                errs.push(FieldError::required(&name_path, ""));
            } else if o.affinity_name.len() > 32 {
                errs.push(FieldError::invalid(
                    &name_path,
                    &o.affinity_name,
                    "must be no more than 32 characters",
                ));
            }
            for m in crate::validation::is_qualified_name(&o.affinity_name) {
                errs.push(FieldError::invalid(&name_path, &o.affinity_name, m));
            }
            if !names.insert(o.affinity_name.as_str()) {
                errs.push(FieldError::invalid(
                    &name_path,
                    &o.affinity_name,
                    "overflow affinity name must be unique and must not duplicate the primary group's affinityName",
                ));
            }
            validate_affinity(&o.affinity(), &format!("{path}[{i}]"), errs);
        }
    }

    /// The parts only Orrery has, each checked by its own type: follow-up, workload
    /// affinity, stateful, data policy, prediction, cost.
    fn validate_orrery_parts(&self, path: &str, errs: &mut ErrorList) {
        if let Some(f) = &self.follow_up {
            f.validate(&format!("{path}.followUp"), errs);
        }
        if let Some(w) = &self.workload_affinity {
            w.validate(&format!("{path}.workloadAffinity"), errs);
        }
        if let Some(st) = &self.stateful {
            st.validate(&format!("{path}.stateful"), errs);
        }
        if let Some(d) = &self.data_policy {
            d.validate(&format!("{path}.dataPolicy"), errs);
        }
        if let Some(p) = &self.prediction {
            p.validate(&format!("{path}.prediction"), errs);
        }
        if let Some(c) = &self.cost {
            c.validate(&format!("{path}.cost"), errs);
        }
        if let Some(r) = &self.rollout {
            r.validate(&format!("{path}.rollout"), errs);
        }
        if let Some(d) = &self.disruption_budget {
            d.validate(&format!("{path}.disruptionBudget"), errs);
        }
    }

    /// Whether replicas are divided (Karmada's default when `replicaScheduling` is unset is
    /// Duplicated).
    pub fn divided(&self) -> bool {
        self.replica_scheduling
            .as_ref()
            .is_some_and(|r| r.replica_scheduling_type != DUPLICATED)
    }

    /// Whether replicas are divided by what clusters have room for (Aggregated,
    /// AvailableReplicas, or Orrery's water level), not by static weights: Karmada's
    /// `IsOverflowSchedulingAllowed`, with the water level as Orrery's dynamic weight.
    pub fn divides_dynamically(&self) -> bool {
        let Some(r) = self.replica_scheduling.as_ref().filter(|_| self.divided()) else {
            return false;
        };
        if r.replica_division_preference == AGGREGATED {
            return true;
        }
        r.weight_preference.as_ref().is_none_or(|w| {
            w.dynamic_weight == AVAILABLE_REPLICAS || w.static_weight_list.is_empty()
        })
    }
}

/// One of a placement's cluster tolerations, at `p`.
fn validate_toleration(t: &Toleration, p: &str, errs: &mut ErrorList) {
    match t.operator.as_str() {
        // Karmada accepts an empty key here (it matches taints of any key with
        // the same value), unlike a pod's toleration.
        "" | "Equal" => {}
        "Exists" => {
            if !t.value.is_empty() {
                errs.push(FieldError::invalid(
                    format!("{p}.value"),
                    &t.value,
                    "value must be empty when operator is Exists",
                ));
            }
        }
        o => errs.push(FieldError::not_supported(
            format!("{p}.operator"),
            o,
            &["Equal", "Exists"],
        )),
    }
    if !["", "NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&t.effect.as_str()) {
        errs.push(FieldError::not_supported(
            format!("{p}.effect"),
            &t.effect,
            &["NoSchedule", "PreferNoSchedule", "NoExecute"],
        ));
    }
    if let Some(s) = t.toleration_seconds
        && t.effect != "NoExecute"
    {
        errs.push(FieldError::invalid(
            format!("{p}.tolerationSeconds"),
            s,
            "only a toleration of effect NoExecute can be limited in time",
        ));
    }
}

/// One of a placement's spread constraints, at `p`: by a known field or by a label (one of
/// them), with sensible group counts.
fn validate_spread_constraint(s: &SpreadConstraint, p: &str, errs: &mut ErrorList) {
    match (s.spread_by_field.is_empty(), s.spread_by_label.is_empty()) {
        (true, true) => errs.push(FieldError::required(
            format!("{p}.spreadByField"),
            "one of spreadByField or spreadByLabel is required",
        )),
        (false, false) => errs.push(FieldError::forbidden(
            format!("{p}.spreadByLabel"),
            "spreadByField and spreadByLabel cannot both be set",
        )),
        _ => {}
    }
    if !s.spread_by_field.is_empty() && !SPREAD_FIELDS.contains(&s.spread_by_field.as_str()) {
        errs.push(FieldError::not_supported(
            format!("{p}.spreadByField"),
            &s.spread_by_field,
            SPREAD_FIELDS,
        ));
    }
    if s.min_groups < 0 {
        errs.push(FieldError::invalid(
            format!("{p}.minGroups"),
            s.min_groups,
            "must be greater than or equal to 0",
        ));
    }
    if s.max_groups < 0 || (s.max_groups > 0 && s.max_groups < s.min_groups) {
        errs.push(FieldError::invalid(
            format!("{p}.maxGroups"),
            s.max_groups,
            "must be 0 (no limit) or at least minGroups",
        ));
    }
}

/// A placement's `replicaScheduling`, at `p`: known type and division preference, and the
/// weights.
fn validate_replica_scheduling(r: &ReplicaScheduling, p: &str, errs: &mut ErrorList) {
    if ![DUPLICATED, DIVIDED, ""].contains(&r.replica_scheduling_type.as_str()) {
        errs.push(FieldError::not_supported(
            format!("{p}.replicaSchedulingType"),
            &r.replica_scheduling_type,
            &[DUPLICATED, DIVIDED],
        ));
    }
    if ![AGGREGATED, WEIGHTED, ""].contains(&r.replica_division_preference.as_str()) {
        errs.push(FieldError::not_supported(
            format!("{p}.replicaDivisionPreference"),
            &r.replica_division_preference,
            &[AGGREGATED, WEIGHTED],
        ));
    }
    if let Some(w) = &r.weight_preference {
        validate_weight_preference(w, &format!("{p}.weightPreference"), errs);
    }
}

/// A `weightPreference`, at `wp`: a known dynamic weight or a static list (not both), each
/// static weight not negative and its clusters' affinity valid.
fn validate_weight_preference(w: &WeightPreference, wp: &str, errs: &mut ErrorList) {
    if ![AVAILABLE_REPLICAS, WATER_LEVEL, ""].contains(&w.dynamic_weight.as_str()) {
        errs.push(FieldError::not_supported(
            format!("{wp}.dynamicWeight"),
            &w.dynamic_weight,
            &[AVAILABLE_REPLICAS, WATER_LEVEL],
        ));
    }
    if !w.dynamic_weight.is_empty() && !w.static_weight_list.is_empty() {
        errs.push(FieldError::forbidden(
            format!("{wp}.staticWeightList"),
            "staticWeightList and dynamicWeight cannot both be set",
        ));
    }
    for (i, s) in w.static_weight_list.iter().enumerate() {
        let sp = format!("{wp}.staticWeightList[{i}]");
        if s.weight < 0 {
            errs.push(FieldError::invalid(
                format!("{sp}.weight"),
                s.weight,
                "must be greater than or equal to 0",
            ));
        }
        validate_affinity(&s.target_cluster, &format!("{sp}.targetCluster"), errs);
    }
}

fn validate_affinity(a: &ClusterAffinity, path: &str, errs: &mut ErrorList) {
    if let Some(ls) = &a.label_selector
        && let Err(e) = ls.to_selector()
    {
        errs.push(FieldError::invalid(
            format!("{path}.labelSelector"),
            "",
            e.0,
        ));
    }
    if let Some(fs) = &a.field_selector {
        for (i, r) in fs.match_expressions.iter().enumerate() {
            let p = format!("{path}.fieldSelector.matchExpressions[{i}]");
            if !FIELD_KEYS.contains(&r.key.as_str()) {
                errs.push(FieldError::not_supported(
                    format!("{p}.key"),
                    &r.key,
                    FIELD_KEYS,
                ));
            }
            if !FIELD_OPERATORS.contains(&r.operator.as_str()) {
                errs.push(FieldError::not_supported(
                    format!("{p}.operator"),
                    &r.operator,
                    FIELD_OPERATORS,
                ));
            }
            if r.values.is_empty() {
                errs.push(FieldError::required(format!("{p}.values"), ""));
            }
        }
    }
    for (i, n) in a.cluster_names.iter().enumerate() {
        if n.is_empty() {
            errs.push(FieldError::required(
                format!("{path}.clusterNames[{i}]"),
                "",
            ));
        }
    }
}

/// Karmada's `Suspension`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Suspension {
    /// True: no Work is sent or updated in any cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dispatching: Option<bool>,
    /// Clusters whose Works are held back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dispatching_on_clusters: Option<SuspendClusters>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SuspendClusters {
    /// The clusters, by name.
    #[serde(default)]
    pub cluster_names: Vec<String>,
}

impl Suspension {
    /// Whether Works for `cluster` are held back.
    pub fn holds(&self, cluster: &str) -> bool {
        self.dispatching == Some(true)
            || self
                .dispatching_on_clusters
                .as_ref()
                .is_some_and(|c| c.cluster_names.iter().any(|n| n == cluster))
    }
}

/// Karmada's `FailoverBehavior`: what happens when the application is unhealthy in a cluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FailoverBehavior {
    /// Move the application away from a cluster where it stays unhealthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub application: Option<ApplicationFailover>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApplicationFailover {
    /// When an unhealthy application is moved.
    pub decision_conditions: DecisionConditions,
    /// What becomes of the old copy: Immediately (removed at once), Graciously (kept until the new one is healthy or gracePeriodSeconds pass) or Never (kept).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub purge_mode: String,
    /// With Graciously: the longest the old copy is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_period_seconds: Option<i64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DecisionConditions {
    /// How long the application may be unhealthy before it moves (300 by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toleration_seconds: Option<i64>,
}

/// Karmada's default wait before an unhealthy application is moved.
pub const DEFAULT_FAILOVER_TOLERATION_SECONDS: i64 = 300;

/// Karmada's `PropagationSpec` (PropagationPolicy and ClusterPropagationPolicy).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PropagationSpec {
    /// The templates the policy places; a name beats labels beats a kind alone when policies compete.
    pub resource_selectors: Vec<ResourceSelector>,
    /// Also propagate what the templates use (ConfigMaps, Secrets, ServiceAccounts, PersistentVolumeClaims) to the same clusters.
    #[serde(default)]
    pub propagate_deps: bool,
    /// Where the templates go and how their replicas divide.
    #[serde(default)]
    pub placement: Placement,
    /// Among policies matching a template equally, the higher wins.
    #[serde(default)]
    pub priority: i32,
    /// Always: take templates from policies of lower priority; Never (the default): leave them.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub preemption: String,
    /// Karmada's wait for named OverridePolicies before propagating; refused: overrides apply as soon as they exist.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dependent_overrides: Vec<String>,
    /// The scheduler that places these templates; another scheduler's are left to it (Scheduled=False, reason OtherScheduler).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub scheduler_name: String,
    /// Deprecated by Karmada in favour of `propagateDeps`, and ignored there: accepted with a
    /// warning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub association: Option<bool>,
    /// What happens when the application is unhealthy in a cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failover: Option<FailoverBehavior>,
    /// Abort (the default): leave an object a member already has and Orrery does not manage; Overwrite: take it over.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub conflict_resolution: String,
    /// Karmada's Lazy activation; not supported (must be empty).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub activation_preference: String,
    /// Hold back the Works of all or some clusters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspension: Option<Suspension>,
    /// Keep the objects in the members when the template is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preserve_resources_on_deletion: Option<bool>,
    /// Karmada's scheduling priority: the value of a Kubernetes PriorityClass orders the
    /// scheduling queue (higher first) and is carried on the binding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule_priority: Option<SchedulePriority>,
}

/// `KubePriorityClass`: the priority is the value of a `scheduling.k8s.io/v1` PriorityClass.
pub const KUBE_PRIORITY_CLASS: &str = "KubePriorityClass";

/// Karmada's `SchedulePriority` of a policy: where the priority comes from.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SchedulePriority {
    /// `KubePriorityClass` (Karmada's `PodPriorityClass` and `FederatedPriorityClass` are not
    /// implemented there either, and are refused).
    pub priority_class_source: String,
    /// The PriorityClass whose value is the priority.
    pub priority_class_name: String,
}

impl SchedulePriority {
    fn validate(&self, path: &str, errs: &mut ErrorList) {
        if self.priority_class_source != KUBE_PRIORITY_CLASS {
            errs.push(FieldError::not_supported(
                format!("{path}.priorityClassSource"),
                &self.priority_class_source,
                &[KUBE_PRIORITY_CLASS],
            ));
        }
        if self.priority_class_name.is_empty() {
            errs.push(FieldError::required(
                format!("{path}.priorityClassName"),
                "",
            ));
        } else {
            for m in crate::validation::is_dns1123_subdomain(&self.priority_class_name) {
                errs.push(FieldError::invalid(
                    format!("{path}.priorityClassName"),
                    &self.priority_class_name,
                    m,
                ));
            }
        }
    }
}

/// One entry of the draft's `targetClusters`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TargetClusters {
    /// name: values are cluster names; label: values are label selectors (env=prod,tier in (a,b)).
    pub selector_type: String,
    /// The names or selectors; any of them qualifies a cluster.
    #[serde(default)]
    pub values: Vec<String>,
}

/// The `ResourcePlacementPolicy` spec: the draft's fields, then Orrery's.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PlacementPolicySpec {
    /// The templates the policy places.
    pub resource_selector: ResourceSelector,
    /// The clusters the templates may go to (the entries are ORed); absent: every cluster.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub target_clusters: Vec<TargetClusters>,
    /// Karmada's placement block: affinities, tolerations, spread and replica division.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
    /// Also propagate what the templates use (ConfigMaps, Secrets, ServiceAccounts, PersistentVolumeClaims).
    #[serde(default)]
    pub propagate_deps: bool,
    /// Among policies matching a template equally, the higher wins.
    #[serde(default)]
    pub priority: i32,
    /// Always: take templates from policies of lower priority; Never (the default): leave them.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub preemption: String,
    /// Abort (the default): leave an object a member already has and Orrery does not manage; Overwrite: take it over.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub conflict_resolution: String,
    /// Hold back the Works of all or some clusters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspension: Option<Suspension>,
    /// Keep the objects in the members when the template is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preserve_resources_on_deletion: Option<bool>,
    /// What happens when the application is unhealthy in a cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failover: Option<FailoverBehavior>,
}

/// A placement policy's status: how many templates it places (a selector that matches
/// nothing is accepted, and shows here).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyStatus {
    /// How many templates the policy places now.
    #[serde(default)]
    pub bound_resources: i64,
    /// `Bound`: True when it places at least one template.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<crate::conditions::Condition>,
}

/// Names the policy a binding follows.
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
pub struct PolicyRef {
    /// The policy's API version.
    pub api_version: String,
    /// The policy's kind.
    pub kind: String,
    /// The policy's namespace (empty for cluster-wide policies).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// The policy's name.
    pub name: String,
}

impl PolicyRef {
    /// The reference to a policy object.
    pub fn of(o: &Object) -> PolicyRef {
        PolicyRef {
            api_version: o.api_version.clone(),
            kind: o.kind.clone(),
            namespace: o.metadata.namespace.clone(),
            name: o.name().to_string(),
        }
    }
}

impl std::fmt::Display for PolicyRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{} {}", self.kind, self.name)
        } else {
            write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
        }
    }
}

/// One of the draft's `targetClusters` entries, compiled: clusters by name, or by any of
/// several label selectors. The entries of a policy are ORed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Target {
    /// Clusters by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
    /// Label selectors in the string form (`env=prod,tier in (a,b)`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
}

/// Every placement policy kind, as one.
#[derive(Clone, Debug, PartialEq)]
pub struct PlacementPolicy {
    pub reference: PolicyRef,
    pub uid: String,
    pub selectors: Vec<ResourceSelector>,
    pub priority: i32,
    pub preemption: bool,
    pub propagate_deps: bool,
    pub placement: Placement,
    pub targets: Vec<Target>,
    pub conflict_resolution: ConflictResolution,
    pub preserve_resources_on_deletion: bool,
    pub suspension: Suspension,
    pub failover: Option<ApplicationFailover>,
    /// Karmada's `schedulerName`: a name other than Orrery's leaves the templates the policy
    /// selects to that scheduler (empty: Orrery's).
    pub scheduler_name: String,
    /// Karmada's `schedulePriority`: the PriorityClass whose value orders the queue.
    pub schedule_priority: Option<SchedulePriority>,
    pub deleting: bool,
}

/// The scheduler names Orrery answers to (Karmada's default, and its own).
pub const SCHEDULER_NAMES: &[&str] = &["", "default-scheduler", "orrery"];

/// Whether Orrery's scheduler decides for a policy or binding naming `scheduler`.
pub fn is_orrery_scheduler(scheduler: &str) -> bool {
    SCHEDULER_NAMES.contains(&scheduler)
}

/// What a write of a placement policy is warned about (kubectl prints them): accepted fields
/// that do not do what they may seem to.
pub fn warnings(api_version: &str, kind: &str, spec: Option<&Value>) -> Vec<String> {
    let group = api_version.split('/').next().unwrap_or("");
    if group != KARMADA_GROUP || !matches!(kind, "PropagationPolicy" | "ClusterPropagationPolicy") {
        return Vec::new();
    }
    let mut out = Vec::new();
    let Some(spec) = spec else { return out };
    if spec.get("association").is_some() {
        out.push(
            "spec.association is deprecated and has no effect: use spec.propagateDeps".to_string(),
        );
    }
    if let Some(s) = spec.get("schedulerName").and_then(Value::as_str)
        && !is_orrery_scheduler(s)
    {
        out.push(format!(
            "spec.schedulerName {s:?} is not Orrery's scheduler (default-scheduler): what this policy selects stays unscheduled until a scheduler of that name places it"
        ));
    }
    out
}

/// The placement kinds, `(group, kind, plural)`.
pub const PLACEMENT_KINDS: &[(&str, &str, &str)] = &[
    (
        GROUP,
        "ResourcePlacementPolicy",
        "resourceplacementpolicies",
    ),
    (KARMADA_GROUP, "PropagationPolicy", "propagationpolicies"),
    (
        KARMADA_GROUP,
        "ClusterPropagationPolicy",
        "clusterpropagationpolicies",
    ),
];

fn conflict(v: &str, path: &str, errs: &mut ErrorList) -> ConflictResolution {
    match v {
        "" | "Abort" => ConflictResolution::Abort,
        "Overwrite" => ConflictResolution::Overwrite,
        o => {
            errs.push(FieldError::not_supported(path, o, &["Abort", "Overwrite"]));
            ConflictResolution::Abort
        }
    }
}

fn preemption(v: &str, path: &str, errs: &mut ErrorList) -> bool {
    match v {
        "" | "Never" => false,
        "Always" => true,
        o => {
            errs.push(FieldError::not_supported(path, o, &["Always", "Never"]));
            false
        }
    }
}

fn validate_failover(
    f: &Option<FailoverBehavior>,
    errs: &mut ErrorList,
) -> Option<ApplicationFailover> {
    let a = f.as_ref()?.application.clone()?;
    let p = "spec.failover.application";
    if !["", "Immediately", "Graciously", "Never"].contains(&a.purge_mode.as_str()) {
        errs.push(FieldError::not_supported(
            format!("{p}.purgeMode"),
            &a.purge_mode,
            &["Immediately", "Graciously", "Never"],
        ));
    }
    if let Some(s) = a.decision_conditions.toleration_seconds
        && s < 0
    {
        errs.push(FieldError::invalid(
            format!("{p}.decisionConditions.tolerationSeconds"),
            s,
            "must be greater than or equal to 0",
        ));
    }
    match (a.purge_mode.as_str(), a.grace_period_seconds) {
        ("Graciously", None) => errs.push(FieldError::required(
            format!("{p}.gracePeriodSeconds"),
            "required when purgeMode is Graciously",
        )),
        (_, Some(g)) if g <= 0 => errs.push(FieldError::invalid(
            format!("{p}.gracePeriodSeconds"),
            g,
            "must be greater than 0",
        )),
        _ => {}
    }
    Some(a)
}

/// A Karmada placement as Karmada reads it: its webhook makes a `Divided` placement without
/// a preference `Weighted`, and its scheduler gives every feasible cluster a weight of 1 when
/// a `Weighted` division names no weights (an equal split). Orrery's division by water level
/// is asked for with `weightPreference.dynamicWeight: WaterLevel`; it stays the default of
/// the draft's ResourcePlacementPolicy.
pub fn karmada_meaning(mut p: Placement) -> Placement {
    let Some(r) = p.replica_scheduling.as_mut() else {
        return p;
    };
    if r.replica_scheduling_type == DUPLICATED {
        return p;
    }
    if r.replica_division_preference.is_empty() && r.weight_preference.is_none() {
        r.replica_division_preference = WEIGHTED.to_string();
    }
    if r.replica_division_preference == WEIGHTED {
        let w = r.weight_preference.get_or_insert_with(Default::default);
        if w.static_weight_list.is_empty() && w.dynamic_weight.is_empty() {
            w.static_weight_list.push(StaticClusterWeight {
                // An empty affinity matches every cluster.
                target_cluster: ClusterAffinity::default(),
                weight: 1,
            });
        }
    }
    p
}

/// Reads any placement kind; the errors are what a create or update must be refused with.
pub fn from_object(obj: &Object) -> Result<PlacementPolicy, ErrorList> {
    let group = obj.api_version.split('/').next().unwrap_or("");
    let spec = obj.spec.clone().unwrap_or(Value::Null);
    let mut errs = Vec::new();
    let reference = PolicyRef::of(obj);
    let namespaced = !obj.metadata.namespace.is_empty();
    let mut p = match (group, obj.kind.as_str()) {
        (GROUP, "ResourcePlacementPolicy") => {
            let s: PlacementPolicySpec = decode(&spec, "spec").map_err(|e| vec![e])?;
            let mut sel = s.resource_selector.clone();
            if namespaced {
                // A tenant's rights end at its namespace: reaching another needs a
                // cluster-scoped kind and cluster-wide rights (as Karmada's PropagationPolicy).
                if !sel.namespace.is_empty() && sel.namespace != obj.metadata.namespace {
                    errs.push(FieldError::forbidden(
                        "spec.resourceSelector.namespace",
                        format!(
                            "a ResourcePlacementPolicy selects resources in its own namespace ({}) only; \
                             create it in {} or use a ClusterPropagationPolicy",
                            obj.metadata.namespace, sel.namespace
                        ),
                    ));
                }
                sel.namespace = obj.metadata.namespace.clone();
            }
            sel.validate("spec.resourceSelector", &mut errs);
            let mut targets = Vec::new();
            for (i, t) in s.target_clusters.iter().enumerate() {
                let p = format!("spec.targetClusters[{i}]");
                if t.values.is_empty() {
                    errs.push(FieldError::required(format!("{p}.values"), ""));
                }
                match t.selector_type.as_str() {
                    "name" => targets.push(Target {
                        names: t.values.clone(),
                        labels: vec![],
                    }),
                    "label" => {
                        for (j, v) in t.values.iter().enumerate() {
                            if let Err(e) = crate::labels::Selector::parse(v) {
                                errs.push(FieldError::invalid(format!("{p}.values[{j}]"), v, e.0));
                            }
                        }
                        targets.push(Target {
                            names: vec![],
                            labels: t.values.clone(),
                        })
                    }
                    o => errs.push(FieldError::not_supported(
                        format!("{p}.selectorType"),
                        o,
                        &["name", "label"],
                    )),
                }
            }
            PlacementPolicy {
                reference,
                uid: obj.metadata.uid.clone(),
                selectors: vec![sel],
                priority: s.priority,
                preemption: preemption(&s.preemption, "spec.preemption", &mut errs),
                propagate_deps: s.propagate_deps,
                placement: s.placement.clone().unwrap_or_default(),
                targets,
                conflict_resolution: conflict(
                    &s.conflict_resolution,
                    "spec.conflictResolution",
                    &mut errs,
                ),
                preserve_resources_on_deletion: s.preserve_resources_on_deletion.unwrap_or(false),
                suspension: s.suspension.clone().unwrap_or_default(),
                failover: validate_failover(&s.failover, &mut errs),
                scheduler_name: String::new(),
                schedule_priority: None,
                deleting: false,
            }
        }
        (KARMADA_GROUP, "PropagationPolicy" | "ClusterPropagationPolicy") => {
            let s: PropagationSpec = decode(&spec, "spec").map_err(|e| vec![e])?;
            if s.resource_selectors.is_empty() {
                errs.push(FieldError::required(
                    "spec.resourceSelectors",
                    "at least one resource selector is required",
                ));
            }
            let mut selectors = Vec::new();
            for (i, sel) in s.resource_selectors.iter().enumerate() {
                let path = format!("spec.resourceSelectors[{i}]");
                let mut sel = sel.clone();
                if namespaced {
                    if !sel.namespace.is_empty() && sel.namespace != obj.metadata.namespace {
                        errs.push(FieldError::forbidden(
                            format!("{path}.namespace"),
                            "a PropagationPolicy selects resources in its own namespace only",
                        ));
                    }
                    sel.namespace = obj.metadata.namespace.clone();
                }
                sel.validate(&path, &mut errs);
                selectors.push(sel);
            }
            if !s.dependent_overrides.is_empty() {
                errs.push(FieldError::invalid(
                    "spec.dependentOverrides",
                    "",
                    "not supported yet: overrides apply as soon as they exist",
                ));
            }
            if !s.activation_preference.is_empty() {
                errs.push(FieldError::not_supported(
                    "spec.activationPreference",
                    &s.activation_preference,
                    &[""],
                ));
            }
            PlacementPolicy {
                reference,
                uid: obj.metadata.uid.clone(),
                selectors,
                priority: s.priority,
                preemption: preemption(&s.preemption, "spec.preemption", &mut errs),
                propagate_deps: s.propagate_deps,
                placement: karmada_meaning(s.placement.clone()),
                targets: vec![],
                conflict_resolution: conflict(
                    &s.conflict_resolution,
                    "spec.conflictResolution",
                    &mut errs,
                ),
                preserve_resources_on_deletion: s.preserve_resources_on_deletion.unwrap_or(false),
                suspension: s.suspension.clone().unwrap_or_default(),
                failover: validate_failover(&s.failover, &mut errs),
                scheduler_name: s.scheduler_name.clone(),
                schedule_priority: s.schedule_priority.clone().inspect(|sp| {
                    sp.validate("spec.schedulePriority", &mut errs);
                }),
                deleting: false,
            }
        }
        _ => {
            return Err(vec![FieldError::invalid(
                "kind",
                &obj.kind,
                "not a placement policy kind",
            )]);
        }
    };
    p.placement.validate("spec.placement", &mut errs);
    p.deleting = obj.metadata.deletion_timestamp.is_some();
    if errs.is_empty() { Ok(p) } else { Err(errs) }
}

impl PlacementPolicy {
    /// How specifically this policy selects `t`, if it does.
    pub fn matches(&self, t: &Object) -> Option<Specificity> {
        // A namespaced policy never reaches past its namespace, whatever its selectors say
        // (one stored before admission refused that included).
        if !self.reference.namespace.is_empty() && t.namespace() != self.reference.namespace {
            return None;
        }
        self.selectors.iter().filter_map(|s| s.matches(t)).max()
    }

    /// Orders candidates: priority, then specificity, then namespaced before cluster-scoped,
    /// then name (smaller wins, so the key is reversed by the caller's `max`).
    fn rank(&self, how: Specificity) -> (i32, Specificity, bool, std::cmp::Reverse<&PolicyRef>) {
        (
            self.priority,
            how,
            !self.reference.namespace.is_empty(),
            std::cmp::Reverse(&self.reference),
        )
    }
}

/// The policy that places `t`: the current claimant keeps it while it still matches, unless a
/// matching policy with preemption and a higher priority takes it; otherwise the best match.
pub fn choose<'a>(
    policies: impl IntoIterator<Item = &'a PlacementPolicy>,
    t: &Object,
    claimant: Option<&PolicyRef>,
) -> Option<&'a PlacementPolicy> {
    let mut best: Option<(&PlacementPolicy, Specificity)> = None;
    let mut current: Option<&PlacementPolicy> = None;
    for p in policies {
        if p.deleting {
            continue;
        }
        let Some(how) = p.matches(t) else { continue };
        if claimant == Some(&p.reference) {
            current = Some(p);
        }
        if best.is_none_or(|(b, bh)| p.rank(how) > b.rank(bh)) {
            best = Some((p, how));
        }
    }
    let (best, _) = best?;
    match current {
        Some(c) if best.preemption && best.priority > c.priority => Some(best),
        Some(c) => Some(c),
        None => Some(best),
    }
}

/// The draft's `fieldPatches` entry.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FieldPatch {
    /// The field to set, as a dotted path with list indexes (spec.template.spec.containers[0].image).
    pub path: String,
    /// The value it gets.
    #[serde(default)]
    pub value: Value,
}

/// The draft's cluster selector of an override (names or labels; both ANDed when both set).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DraftClusterSelector {
    /// Clusters by name; empty: any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
    /// Labels the clusters must all have.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Object {
        serde_json::from_value(v).unwrap()
    }

    fn deploy(ns: &str, name: &str, labels: Value) -> Object {
        obj(json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": ns, "labels": labels}}))
    }

    fn pp(ns: &str, name: &str, spec: Value) -> Object {
        let kind = if ns.is_empty() {
            "ClusterPropagationPolicy"
        } else {
            "PropagationPolicy"
        };
        obj(
            json!({"apiVersion": "policy.karmada.io/v1alpha1", "kind": kind,
            "metadata": {"name": name, "namespace": ns}, "spec": spec}),
        )
    }

    #[test]
    fn karmada_documentation_policy_is_accepted() {
        let p = from_object(&pp("default", "example-policy", json!({
            "resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "nginx"}],
            "placement": {
                "clusterAffinity": {"clusterNames": ["member1", "member2"]},
                "replicaScheduling": {
                    "replicaDivisionPreference": "Weighted",
                    "replicaSchedulingType": "Divided",
                    "weightPreference": {"staticWeightList": [
                        {"targetCluster": {"clusterNames": ["member1"]}, "weight": 1},
                        {"targetCluster": {"clusterNames": ["member2"]}, "weight": 1}
                    ]}
                }
            }
        })))
        .unwrap();
        assert_eq!(p.selectors[0].namespace, "default");
        assert!(p.placement.divided());
    }

    /// Karmada 1.18's overflow affinities: its own checks, with its messages.
    #[test]
    fn overflow_affinities_are_checked_as_karmada_checks_them() {
        let spec = |term: Value, division: Value| {
            json!({"resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment"}],
                "placement": {"clusterAffinities": [term], "replicaScheduling": division}})
        };
        let aggregated =
            json!({"replicaSchedulingType": "Divided", "replicaDivisionPreference": "Aggregated"});
        let term = json!({"affinityName": "home", "clusterNames": ["a"],
            "overflowAffinities": [{"affinityName": "burst", "labelSelector": {"matchLabels": {"tier": "burst"}}}]});
        let p = from_object(&pp("ns", "p", spec(term.clone(), aggregated.clone()))).unwrap();
        let t = &p.placement.cluster_affinities[0];
        assert_eq!(t.overflow_affinities[0].affinity_name, "burst");
        assert!(t.overflow_affinities[0].affinity().label_selector.is_some());
        let dynamic = json!({"replicaSchedulingType": "Divided", "replicaDivisionPreference": "Weighted",
            "weightPreference": {"dynamicWeight": "AvailableReplicas"}});
        assert!(from_object(&pp("ns", "p", spec(term.clone(), dynamic))).is_ok());
        let refused = |spec: Value| -> String {
            let errs = from_object(&pp("ns", "p", spec)).unwrap_err();
            errs.iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("; ")
        };
        // Karmada's plain Divided means equal static weights: no overflow.
        let e = refused(spec(
            term.clone(),
            json!({"replicaSchedulingType": "Divided"}),
        ));
        assert!(
            e.contains("spec.placement.clusterAffinities[0].overflowAffinities")
                && e.contains("only be used together with dynamic weight or aggregated scheduling"),
            "{e}"
        );
        let e = refused(spec(
            term.clone(),
            json!({"replicaSchedulingType": "Duplicated"}),
        ));
        assert!(e.contains("dynamic weight or aggregated"), "{e}");
        let bare = json!({"affinityName": "home",
            "overflowAffinities": [{"affinityName": "burst", "clusterNames": ["b"]}]});
        let e = refused(spec(bare, aggregated.clone()));
        assert!(
            e.contains("only be used together with the inline ClusterAffinity"),
            "{e}"
        );
        let dup = json!({"affinityName": "home", "clusterNames": ["a"],
            "overflowAffinities": [{"affinityName": "home", "clusterNames": ["b"]},
                {"affinityName": "x/y/z", "clusterNames": ["c"]}]});
        let e = refused(spec(dup, aggregated.clone()));
        assert!(
            e.contains("overflowAffinities[0].affinityName")
                && e.contains("must not duplicate the primary group's affinityName"),
            "{e}"
        );
        assert!(e.contains("overflowAffinities[1].affinityName"), "{e}");
        let unknown = json!({"affinityName": "home", "clusterNames": ["a"],
            "overflowAffinities": [{"affinityName": "b", "clusterNamez": ["b"]}]});
        assert!(refused(spec(unknown, aggregated.clone())).contains("clusterNamez"));
        let mut budget = spec(term.clone(), aggregated.clone());
        budget["placement"]["cost"] = json!({"maxHourly": 3.0});
        assert!(refused(budget).contains("cannot be combined with cost.maxHourly"));
        let mut zones = spec(term, aggregated);
        zones["placement"]["spreadConstraints"] =
            json!([{"spreadByField": "region", "minGroups": 1, "maxGroups": 2}]);
        assert!(refused(zones).contains("cannot be combined with spread constraints"));
    }

    #[test]
    fn bad_policies_name_the_field() {
        let cases = [
            (
                json!({"resourceSelectors": [{"apiVersion": "v1", "kind": "X"}], "bogus": 1}),
                "spec.bogus",
            ),
            (
                json!({"resourceSelectors": [{"apiVersion": "v1", "kind": "X", "nam": "a"}]}),
                "spec.resourceSelectors[0].nam",
            ),
            (json!({"resourceSelectors": []}), "spec.resourceSelectors"),
            (
                json!({"resourceSelectors": [{"apiVersion": "v1", "kind": "X"}],
                "placement": {"replicaScheduling": {"replicaSchedulingType": "Divided",
                "weightPreference": {"staticWeightList": [{"targetCluster": {"clusterNames": ["a"]}, "weight": -1}]}}}}),
                "spec.placement.replicaScheduling.weightPreference.staticWeightList[0].weight",
            ),
            (
                json!({"resourceSelectors": [{"apiVersion": "v1", "kind": "X"}],
                "placement": {"clusterAffinity": {"fieldSelector": {"matchExpressions": [{"key": "planet", "operator": "In", "values": ["x"]}]}}}}),
                "spec.placement.clusterAffinity.fieldSelector.matchExpressions[0].key",
            ),
            (
                json!({"resourceSelectors": [{"apiVersion": "v1", "kind": "X"}], "activationPreference": "Lazy"}),
                "spec.activationPreference",
            ),
            (
                json!({"resourceSelectors": [{"apiVersion": "v1", "kind": "X", "namespace": "other"}]}),
                "spec.resourceSelectors[0].namespace",
            ),
            (
                json!({"resourceSelectors": [{"apiVersion": "v1", "kind": "X"}], "placement": {"spreadConstraints": [{"spreadByField": "galaxy"}]}}),
                "spec.placement.spreadConstraints[0].spreadByField",
            ),
            (
                json!({"resourceSelectors": [{"apiVersion": "v1", "kind": "X"}], "priority": "high"}),
                "spec.priority",
            ),
        ];
        for (spec, field) in cases {
            let errs = from_object(&pp("default", "p", spec.clone())).unwrap_err();
            assert!(errs.iter().any(|e| e.field == field), "{spec}: {errs:?}");
        }
    }

    #[test]
    fn draft_example_becomes_a_placement() {
        let o = obj(
            json!({"apiVersion": "multicluster.io/v1alpha1", "kind": "ResourcePlacementPolicy",
            "metadata": {"name": "webapp-placement", "namespace": "production"},
            "spec": {"resourceSelector": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "webapp", "namespace": "production"},
                "targetClusters": [{"selectorType": "name", "values": ["cluster-east", "cluster-west"]}]}}),
        );
        let p = from_object(&o).unwrap();
        assert_eq!(p.selectors[0].namespace, "production");
        assert_eq!(p.targets[0].names, ["cluster-east", "cluster-west"]);
        assert!(
            p.matches(&deploy("production", "webapp", json!({})))
                .is_some()
        );
        assert!(p.matches(&deploy("default", "webapp", json!({}))).is_none());
        // The same policy in another namespace is refused: a tenant selects its own.
        let mut elsewhere = o.clone();
        elsewhere.metadata.namespace = "default".into();
        let errs = from_object(&elsewhere).unwrap_err();
        assert_eq!(errs[0].field, "spec.resourceSelector.namespace", "{errs:?}");
        assert!(
            errs[0].detail.contains("own namespace (default)"),
            "{errs:?}"
        );
        // And one that got stored anyway (an earlier version admitted it) matches nothing
        // outside its namespace.
        let mut stored = p.clone();
        stored.reference.namespace = "default".into();
        assert!(
            stored
                .matches(&deploy("production", "webapp", json!({})))
                .is_none()
        );
        let mut bad = o.clone();
        bad.spec.as_mut().unwrap()["targetClusters"][0]["selectorType"] = json!("planet");
        assert_eq!(
            from_object(&bad).unwrap_err()[0].field,
            "spec.targetClusters[0].selectorType"
        );
    }

    #[test]
    fn the_winner_is_chosen_by_rank_and_claims_hold() {
        let t = deploy("default", "web", json!({"app": "web"}));
        let sel = |extra: Value| {
            let mut s = json!({"apiVersion": "apps/v1", "kind": "Deployment"});
            s.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            s
        };
        let kind_only = from_object(&pp(
            "default",
            "a-kind",
            json!({"resourceSelectors": [sel(json!({}))]}),
        ))
        .unwrap();
        let by_label = from_object(&pp("default", "b-label", json!({"resourceSelectors": [sel(json!({"labelSelector": {"matchLabels": {"app": "web"}}}))]}))).unwrap();
        let by_name = from_object(&pp(
            "default",
            "c-name",
            json!({"resourceSelectors": [sel(json!({"name": "web"}))]}),
        ))
        .unwrap();
        let cluster_name = from_object(&pp(
            "",
            "aa-cluster",
            json!({"resourceSelectors": [sel(json!({"name": "web"}))]}),
        ))
        .unwrap();
        let high = from_object(&pp(
            "default",
            "e-high",
            json!({"priority": 5, "resourceSelectors": [sel(json!({}))]}),
        ))
        .unwrap();
        let preempt = from_object(&pp(
            "default",
            "f-pre",
            json!({"priority": 9, "preemption": "Always", "resourceSelectors": [sel(json!({}))]}),
        ))
        .unwrap();
        let all = [
            kind_only.clone(),
            by_label.clone(),
            by_name.clone(),
            cluster_name.clone(),
        ];
        // Namespaced before cluster-scoped at equal specificity, though name order would
        // pick the cluster-scoped one.
        assert_eq!(choose(&all, &t, None).unwrap().reference.name, "c-name");
        // A label selector before kind only, though name order would pick kind only.
        let label_or_kind = [kind_only.clone(), by_label.clone()];
        assert_eq!(
            choose(&label_or_kind, &t, None).unwrap().reference.name,
            "b-label"
        );
        // Name order last: of two equal policies, the first name.
        let mut twin = kind_only.clone();
        twin.reference.name = "z-kind".into();
        let twins = [twin, kind_only.clone()];
        assert_eq!(choose(&twins, &t, None).unwrap().reference.name, "a-kind");
        let no_ns = [kind_only.clone(), cluster_name.clone()];
        assert_eq!(
            choose(&no_ns, &t, None).unwrap().reference.name,
            "aa-cluster"
        );
        let with_high = [by_name.clone(), high.clone()];
        assert_eq!(
            choose(&with_high, &t, None).unwrap().reference.name,
            "e-high"
        );
        // A claim holds against a better match without preemption...
        assert_eq!(
            choose(&with_high, &t, Some(&by_name.reference))
                .unwrap()
                .reference
                .name,
            "c-name"
        );
        // ...but not against a higher-priority one with it.
        let with_pre = [by_name.clone(), preempt.clone()];
        assert_eq!(
            choose(&with_pre, &t, Some(&by_name.reference))
                .unwrap()
                .reference
                .name,
            "f-pre"
        );
        // A claimant that no longer matches loses the template.
        let other = deploy("default", "db", json!({}));
        assert_eq!(
            choose(&all, &other, Some(&by_name.reference))
                .unwrap()
                .reference
                .name,
            "a-kind"
        );
        // Name order breaks the last tie.
        let twin = from_object(&pp(
            "default",
            "0-first",
            json!({"resourceSelectors": [sel(json!({}))]}),
        ))
        .unwrap();
        assert_eq!(
            choose(&[kind_only, twin], &t, None).unwrap().reference.name,
            "0-first"
        );
    }

    #[test]
    fn tolerations() {
        let t = |k: &str, op: &str, v: &str, e: &str| Toleration {
            key: k.into(),
            operator: op.into(),
            value: v.into(),
            effect: e.into(),
            toleration_seconds: None,
        };
        let cases = [
            (t("a", "Equal", "1", ""), ("a", "1", "NoSchedule"), true),
            (t("a", "Equal", "1", ""), ("a", "2", "NoSchedule"), false),
            (
                t("a", "Exists", "", "NoExecute"),
                ("a", "x", "NoSchedule"),
                false,
            ),
            (
                t("a", "Exists", "", "NoExecute"),
                ("a", "x", "NoExecute"),
                true,
            ),
            (t("", "Exists", "", ""), ("anything", "", "NoExecute"), true),
            (t("b", "", "", ""), ("a", "", "NoSchedule"), false),
            // Empty key and operator: any key, the same (empty) value.
            (t("", "", "", ""), ("a", "", "NoSchedule"), true),
            (t("", "", "", ""), ("a", "x", "NoSchedule"), false),
            (
                t("", "Equal", "x", "NoSchedule"),
                ("b", "x", "NoSchedule"),
                true,
            ),
            (t("a", "Lt", "1", ""), ("a", "1", "NoSchedule"), false),
        ];
        for (tol, (k, v, e), want) in cases {
            assert_eq!(tol.tolerates(k, v, e), want, "{tol:?} vs {k}={v}:{e}");
        }
    }

    #[test]
    fn karmada_placements_keep_karmadas_meaning() {
        let equal = || {
            Some(WeightPreference {
                static_weight_list: vec![StaticClusterWeight {
                    target_cluster: ClusterAffinity::default(),
                    weight: 1,
                }],
                dynamic_weight: String::new(),
            })
        };
        let rs = |t: &str, p: &str, w: Option<WeightPreference>| ReplicaScheduling {
            replica_scheduling_type: t.into(),
            replica_division_preference: p.into(),
            weight_preference: w,
        };
        let dynamic = |d: &str| {
            Some(WeightPreference {
                dynamic_weight: d.into(),
                ..Default::default()
            })
        };
        let cases = [
            // Divided, nothing more: Weighted, every cluster 1.
            (rs(DIVIDED, "", None), rs(DIVIDED, WEIGHTED, equal())),
            // The type defaults to Divided.
            (rs("", "", None), rs("", WEIGHTED, equal())),
            (rs(DIVIDED, WEIGHTED, None), rs(DIVIDED, WEIGHTED, equal())),
            // Asked for: kept.
            (rs(DIVIDED, AGGREGATED, None), rs(DIVIDED, AGGREGATED, None)),
            (
                rs(DIVIDED, "", dynamic(WATER_LEVEL)),
                rs(DIVIDED, "", dynamic(WATER_LEVEL)),
            ),
            (
                rs(DIVIDED, WEIGHTED, dynamic(AVAILABLE_REPLICAS)),
                rs(DIVIDED, WEIGHTED, dynamic(AVAILABLE_REPLICAS)),
            ),
            (rs(DUPLICATED, "", None), rs(DUPLICATED, "", None)),
        ];
        for (given, want) in cases {
            let p = karmada_meaning(Placement {
                replica_scheduling: Some(given.clone()),
                ..Default::default()
            });
            assert_eq!(p.replica_scheduling, Some(want), "{given:?}");
        }
        assert_eq!(karmada_meaning(Placement::default()), Placement::default());
        // Read from a PropagationPolicy, not from the draft's ResourcePlacementPolicy.
        let spec =
            json!({"placement": {"replicaScheduling": {"replicaSchedulingType": "Divided"}}});
        let pp = from_object(&obj(json!({"apiVersion": "policy.karmada.io/v1alpha1", "kind": "PropagationPolicy",
            "metadata": {"name": "p", "namespace": "d"},
            "spec": {"resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment"}], "placement": spec["placement"]}})))
        .unwrap();
        assert_eq!(
            pp.placement.replica_scheduling.unwrap().weight_preference,
            equal()
        );
        let rpp = from_object(&obj(json!({"apiVersion": "multicluster.io/v1alpha1", "kind": "ResourcePlacementPolicy",
            "metadata": {"name": "p", "namespace": "d"},
            "spec": {"resourceSelector": {"apiVersion": "apps/v1", "kind": "Deployment"}, "placement": spec["placement"]}})))
        .unwrap();
        assert_eq!(
            rpp.placement.replica_scheduling.unwrap().weight_preference,
            None
        );
        // Karmada accepts a toleration with neither key nor operator; only Lt/Gt are refused.
        let with = |tol: Value| {
            from_object(&obj(
                json!({"apiVersion": "policy.karmada.io/v1alpha1", "kind": "PropagationPolicy",
                "metadata": {"name": "p", "namespace": "d"},
                "spec": {"resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment"}],
                    "placement": {"clusterTolerations": [tol]}}}),
            ))
        };
        assert!(with(json!({"effect": "NoSchedule"})).is_ok());
        let e = with(json!({"key": "a", "operator": "Gt", "value": "1"})).unwrap_err();
        assert_eq!(e[0].field, "spec.placement.clusterTolerations[0].operator");
    }
}
