//! Progressive rollouts: a template's change reaches its placement's clusters stage by
//! stage (a placement's `rollout`), in the spirit of KubeFleet's staged update runs and Open
//! Cluster Management's progressive rollouts.
//!
//! Each change of a template (other than its replica count and status) is a revision, kept as
//! an `apps/v1` ControllerRevision beside the binding. While revision N+1 rolls out, the
//! clusters not yet reached keep rendering revision N, with N's template and today's
//! overrides: the fleet runs at most two revisions of a workload. What the rollout decided
//! for each cluster is in the binding's `status.rollout`, written before any Work changes.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::Time;
use crate::labels::LabelSelector;
use crate::validation::{ErrorList, FieldError};

/// A binding annotation: `"true"` pauses its rollout (no further cluster is updated; those
/// updating go on). Removed, the rollout goes on.
pub const PAUSED_ANNOTATION: &str = "rollout.orrery.io/paused";
/// A binding annotation: a new value resumes a halted rollout (its failures forgiven, the
/// halted stage tried again).
pub const RESUME_ANNOTATION: &str = "rollout.orrery.io/resume";
/// A binding annotation: a new value aborts the rollout, restoring the stable revision
/// everywhere.
pub const ABORT_ANNOTATION: &str = "rollout.orrery.io/abort";
/// A Work annotation: the template revision it renders.
pub const WORK_REVISION_ANNOTATION: &str = "rollout.orrery.io/revision";
/// A ControllerRevision label: the binding (in the same namespace) whose template it holds.
pub const BINDING_LABEL: &str = "rollout.orrery.io/binding";
/// A ControllerRevision annotation: the digest of the content it holds.
pub const DIGEST_ANNOTATION: &str = "rollout.orrery.io/digest";
/// The stage of the clusters no stage selects: updated last, with the defaults.
pub const REMAINING_STAGE: &str = "remaining";
/// How long a cluster has to run a revision healthily before it counts as failed, when the
/// strategy says nothing.
pub const DEFAULT_PROGRESS_DEADLINE: Duration = Duration::from_secs(600);
/// Revisions kept per binding, beyond the two in use, when the strategy says nothing.
pub const DEFAULT_HISTORY_LIMIT: i64 = 10;

/// How a placement's template changes reach its clusters (`placement.rollout`). Absent: every
/// cluster at once, as before.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RolloutStrategy {
    /// The stages, in order; a cluster is in the first stage that selects it. Clusters no
    /// stage selects form a last stage, `remaining`.
    pub stages: Vec<RolloutStage>,
    /// Clusters that may fail their gate before the rollout halts (0: the first failure
    /// halts it).
    #[serde(default)]
    pub max_failures: i64,
    /// How long an updated cluster has to be healthy before it counts as failed (10m when
    /// unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_deadline: Option<String>,
    /// What a halt does: `Manual` (the default; the updated clusters stay as they are until
    /// `orrery rollout resume` or `abort`) or `Automatic` (the stable revision is restored on
    /// the clusters already updated).
    #[serde(default, skip_serializing_if = "Rollback::is_manual")]
    pub rollback: Rollback,
    /// Old revisions kept beyond the stable and the rolling one (10 when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision_history_limit: Option<i64>,
    /// Restarts of an updated cluster's pods (their containers', summed, as its member
    /// reports them) beyond which it fails its gate, ready or not (unset: not counted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_restarts: Option<i64>,
}

/// One stage of a rollout: which clusters, how many at once, and its gate.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RolloutStage {
    /// The stage's name (unique in the strategy; `remaining` is taken).
    pub name: String,
    /// The clusters whose labels match (one of `clusterSelector`, `clusters`, `percent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_selector: Option<LabelSelector>,
    /// The clusters named, a group.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<String>,
    /// This share of the placement's clusters (1-100, rounded up), the least loaded of those
    /// no earlier stage took.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<i64>,
    /// Clusters updated at once: a number or a percentage of the stage's (all when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrency: Option<IntOrPercent>,
    /// How long each cluster of the stage runs the new revision healthily before it
    /// counts as updated (`5m`; 0 when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_success_time: Option<String>,
    /// The stage starts only once a RolloutApproval names it (with the revision).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub approval: bool,
    /// A cluster of the stage is updated only while its water level (the larger of the
    /// present one and its forecast) is below this (0 < level <= 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_for_level_below: Option<f64>,
}

/// A count, or a percentage of a whole (`"25%"`), as Kubernetes' `IntOrString`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum IntOrPercent {
    Int(i64),
    Percent(String),
}

impl schemars::JsonSchema for IntOrPercent {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "IntOrPercent".into()
    }

    fn inline_schema() -> bool {
        true
    }

    /// Kubernetes' structural form of an int-or-string.
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "x-kubernetes-int-or-string": true,
            "anyOf": [{"type": "integer"}, {"type": "string"}]
        })
    }
}

impl IntOrPercent {
    /// The count it means out of `whole` (a percentage rounded up); `None` if malformed.
    pub fn of(&self, whole: i64) -> Option<i64> {
        match self {
            IntOrPercent::Int(n) => Some(*n),
            IntOrPercent::Percent(s) => {
                let p: i64 = s.strip_suffix('%')?.trim().parse().ok()?;
                Some((p * whole + 99) / 100)
            }
        }
    }
}

/// What a halted rollout does.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum Rollback {
    #[default]
    Manual,
    Automatic,
}

impl Rollback {
    fn is_manual(&self) -> bool {
        *self == Rollback::Manual
    }
}

impl RolloutStrategy {
    /// Appends the errors of the strategy at `path` to `errs`.
    pub fn validate(&self, path: &str, errs: &mut ErrorList) {
        if self.stages.is_empty() {
            errs.push(FieldError::required(
                format!("{path}.stages"),
                "a rollout has at least one stage",
            ));
        }
        if self.max_failures < 0 {
            errs.push(FieldError::invalid(
                format!("{path}.maxFailures"),
                self.max_failures,
                "must not be negative",
            ));
        }
        for (field, v) in [
            ("revisionHistoryLimit", self.revision_history_limit),
            ("maxRestarts", self.max_restarts),
        ] {
            if let Some(l) = v
                && l < 0
            {
                errs.push(FieldError::invalid(
                    format!("{path}.{field}"),
                    l,
                    "must not be negative",
                ));
            }
        }
        duration_field(
            &self.progress_deadline,
            &format!("{path}.progressDeadline"),
            errs,
        );
        let mut names = std::collections::BTreeSet::new();
        for (i, s) in self.stages.iter().enumerate() {
            let p = format!("{path}.stages[{i}]");
            if s.name.is_empty() {
                errs.push(FieldError::required(format!("{p}.name"), ""));
            } else if s.name == REMAINING_STAGE {
                errs.push(FieldError::invalid(
                    format!("{p}.name"),
                    &s.name,
                    "is the name of the stage of the clusters no stage selects",
                ));
            } else if let Some(e) = crate::validation::is_dns1123_label(&s.name).first() {
                errs.push(FieldError::invalid(format!("{p}.name"), &s.name, e.clone()));
            } else if !names.insert(s.name.clone()) {
                errs.push(FieldError::duplicate(format!("{p}.name"), &s.name));
            }
            s.validate(&p, errs);
        }
    }

    /// How long an updated cluster has to become healthy.
    pub fn progress_deadline(&self) -> Duration {
        self.progress_deadline
            .as_deref()
            .and_then(|d| crate::duration::parse(d).ok())
            .unwrap_or(DEFAULT_PROGRESS_DEADLINE)
    }

    /// Old revisions kept beyond those in use.
    pub fn history_limit(&self) -> i64 {
        self.revision_history_limit.unwrap_or(DEFAULT_HISTORY_LIMIT)
    }
}

impl RolloutStage {
    fn validate(&self, p: &str, errs: &mut ErrorList) {
        let chosen = [
            self.cluster_selector.is_some(),
            !self.clusters.is_empty(),
            self.percent.is_some(),
        ]
        .iter()
        .filter(|b| **b)
        .count();
        if chosen != 1 {
            errs.push(FieldError::invalid(
                p.to_string(),
                "",
                "a stage chooses its clusters by exactly one of clusterSelector, clusters, percent",
            ));
        }
        if let Some(s) = &self.cluster_selector
            && let Err(e) = s.to_selector()
        {
            errs.push(FieldError::invalid(format!("{p}.clusterSelector"), "", e.0));
        }
        if let Some(pc) = self.percent
            && !(1..=100).contains(&pc)
        {
            errs.push(FieldError::invalid(
                format!("{p}.percent"),
                pc,
                "must be between 1 and 100",
            ));
        }
        if let Some(m) = &self.max_concurrency {
            let ok = match m {
                IntOrPercent::Int(n) => *n >= 1,
                IntOrPercent::Percent(_) => m.of(100).is_some_and(|n| (1..=100).contains(&n)),
            };
            if !ok {
                errs.push(FieldError::invalid(
                    format!("{p}.maxConcurrency"),
                    format!("{m:?}"),
                    "must be a number of at least 1 or a percentage from 1% to 100%",
                ));
            }
        }
        duration_field(&self.min_success_time, &format!("{p}.minSuccessTime"), errs);
        if let Some(l) = self.wait_for_level_below
            && !(l > 0.0 && l <= 1.0)
        {
            errs.push(FieldError::invalid(
                format!("{p}.waitForLevelBelow"),
                l,
                "must be greater than 0 and at most 1",
            ));
        }
    }

    /// How long each cluster runs the revision healthily before it counts as updated.
    pub fn min_success_time(&self) -> Duration {
        self.min_success_time
            .as_deref()
            .and_then(|d| crate::duration::parse(d).ok())
            .unwrap_or_default()
    }

    /// Whether a cluster of these labels and name is in this stage (a `percent` stage is
    /// chosen by count, not by this).
    pub fn selects(&self, name: &str, labels: &BTreeMap<String, String>) -> bool {
        if let Some(s) = &self.cluster_selector {
            return s.to_selector().is_ok_and(|s| s.matches(labels));
        }
        self.clusters.iter().any(|c| c == name)
    }
}

fn duration_field(d: &Option<String>, path: &str, errs: &mut ErrorList) {
    if let Some(d) = d
        && let Err(e) = crate::duration::parse(d)
    {
        errs.push(FieldError::invalid(path.to_string(), d, e.to_string()));
    }
}

/// A workload's budget for the moves Orrery makes of its own (`placement.disruptionBudget`):
/// failover, shedding, consolidation, rebalancing. At least so many of its replicas stay
/// ready while it moves: a cluster giving replicas up keeps them (a surge) until enough of
/// their replacements are ready. A scale-down by the user is not a move.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DisruptionBudget {
    /// Replicas that stay ready: a number or a percentage of the desired (rounded up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_available: Option<IntOrPercent>,
    /// Replicas that may be unready at once: a number or a percentage (rounded up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrPercent>,
}

/// The condition a budgeted binding carries: whether its moves are within its budget.
pub const CONDITION_DISRUPTION_BUDGET: &str = "DisruptionBudget";

impl DisruptionBudget {
    /// Appends the errors of the budget at `path` to `errs`.
    pub fn validate(&self, path: &str, errs: &mut ErrorList) {
        let fields = [
            ("minAvailable", &self.min_available),
            ("maxUnavailable", &self.max_unavailable),
        ];
        if fields.iter().filter(|(_, v)| v.is_some()).count() != 1 {
            errs.push(FieldError::invalid(
                path.to_string(),
                "",
                "set exactly one of minAvailable and maxUnavailable",
            ));
        }
        for (name, v) in fields {
            let ok = match v {
                None => true,
                Some(IntOrPercent::Int(n)) => *n >= 0,
                Some(p @ IntOrPercent::Percent(_)) => {
                    p.of(100).is_some_and(|n| (0..=100).contains(&n))
                }
            };
            if !ok {
                errs.push(FieldError::invalid(
                    format!("{path}.{name}"),
                    format!("{v:?}"),
                    "must be a number of at least 0 or a percentage from 0% to 100%",
                ));
            }
        }
    }

    /// The replicas that must stay ready out of `desired`.
    pub fn min_available(&self, desired: i64) -> i64 {
        let n = match (&self.min_available, &self.max_unavailable) {
            (Some(m), _) => m.of(desired).unwrap_or(desired),
            (None, Some(u)) => desired - u.of(desired).unwrap_or(0),
            (None, None) => 0,
        };
        n.clamp(0, desired.max(0))
    }
}

/// What each cluster keeps of what it gives up, so that at least `min_available` replicas stay
/// ready: `moves` are `(cluster, replicas it runs, replicas decided, of them ready now)`. A
/// cluster's unready replicas go first and take nothing down (a dark cluster's, a scale-down's
/// surplus that never came up); the ready ones go as far as the fleet's ready count above
/// `min_available` allows, clusters in name order. Returns the clusters that keep more than
/// decided, and how many they keep.
pub fn hold(min_available: i64, moves: &[(String, i64, i64, i64)]) -> BTreeMap<String, i64> {
    let ready: i64 = moves.iter().map(|m| m.3.max(0)).sum();
    let mut allowed = (ready - min_available).max(0);
    let mut sorted: Vec<&(String, i64, i64, i64)> = moves.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let mut held = BTreeMap::new();
    for (c, runs, decided, ready) in sorted {
        let gives = (runs - decided).max(0);
        let unready = (runs - ready.clamp(&0, runs)).max(0);
        let costs = gives - gives.min(unready);
        let take = costs.min(allowed);
        allowed -= take;
        if costs > take {
            held.insert(c.clone(), decided + (costs - take));
        }
    }
    held
}

/// Where a rollout stands (a binding's `status.rollout`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    /// The revision rolling out (or, complete, the one everywhere).
    pub revision: i64,
    /// The revision the clusters not yet reached keep, and a rollback restores.
    pub stable: i64,
    pub phase: RolloutPhase,
    /// The stage under way.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub stage: String,
    /// Why it stands where it does, for people.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// When this revision's rollout started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<Time>,
    /// Clusters that failed their gate in this rollout.
    #[serde(default)]
    pub failures: i64,
    /// The stages, in order, and how each went.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<StageStatus>,
    /// Each cluster: its stage, the revision decided for it, and its gate.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<ClusterRollout>,
    /// The values of the resume and abort annotations last answered.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resume_observed: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub abort_observed: String,
}

/// A rollout's phase.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum RolloutPhase {
    /// Every cluster runs `revision`.
    #[default]
    Complete,
    Progressing,
    /// Paused by its binding's annotation.
    Paused,
    /// A stage waits for its RolloutApproval.
    WaitingForApproval,
    /// A stage failed its gate: no further cluster is touched.
    Halted,
    /// Halted, and the stable revision restored (`rollback: Automatic`).
    RolledBack,
    /// Aborted by its binding's annotation: the stable revision restored.
    Aborted,
}

impl RolloutPhase {
    /// Whether the rollout is over (only a new revision, or a resume, moves it).
    pub fn is_over(self) -> bool {
        matches!(
            self,
            RolloutPhase::Complete | RolloutPhase::RolledBack | RolloutPhase::Aborted
        )
    }
}

/// How one stage went.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StageStatus {
    pub name: String,
    pub state: StageState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished: Option<Time>,
    /// Its clusters.
    #[serde(default)]
    pub clusters: i64,
}

/// A stage's state.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum StageState {
    #[default]
    Pending,
    WaitingForApproval,
    Progressing,
    Succeeded,
    Halted,
}

/// One cluster's part in a rollout.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterRollout {
    pub name: String,
    /// Its stage (kept from when the rollout first placed it).
    pub stage: String,
    /// The revision its Work renders.
    pub revision: i64,
    pub state: ClusterState,
    /// When it entered its state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
    /// Since when it has run `revision` healthily (its gate's clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy_since: Option<Time>,
    /// Why it waits or failed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// A cluster's state in a rollout.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum ClusterState {
    /// Its stage has not come: it keeps the stable revision.
    #[default]
    Pending,
    /// Its stage is under way but it waits (for a slot, or for its level to fall).
    Waiting,
    /// Given the new revision; its gate not passed yet.
    Updating,
    /// Ran the new revision healthily for the stage's `minSuccessTime`.
    Succeeded,
    /// Not healthy within the progress deadline.
    Failed,
}

impl RolloutStatus {
    /// The revision decided for a cluster, if the rollout has placed it.
    pub fn revision_of(&self, cluster: &str) -> Option<i64> {
        self.clusters
            .iter()
            .find(|c| c.name == cluster)
            .map(|c| c.revision)
    }
}

/// A binding's status' `rollout`, read in place.
pub fn status_of(b: &crate::Object) -> Option<RolloutStatus> {
    let v = b.status.as_ref()?.get("rollout")?;
    RolloutStatus::deserialize(v).ok()
}

/// The spec of a RolloutApproval: the user's grant for a stage of a binding's revision to
/// start (a binding of its own namespace).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApprovalSpec {
    /// The ResourceBinding (in this namespace).
    pub binding: String,
    /// The revision rolling out.
    pub revision: i64,
    /// The stage that may start.
    pub stage: String,
}

/// The digest naming a content (stable across versions of Orrery). Keys keep the order the
/// template has, so that an old revision renders exactly what its template did.
pub fn digest_of(content: &Value) -> String {
    crate::meta::short_hash(&content.to_string())
}

/// The ControllerRevision holding revision `n` of a binding's template.
pub fn revision_object(
    binding: &crate::Object,
    n: i64,
    content: Value,
    digest: &str,
) -> crate::Object {
    let name = format!("{}-{digest}", binding.name());
    let name = if name.len() > 253 {
        format!("{}-{digest}", &binding.name()[..241])
    } else {
        name
    };
    let mut o = crate::Object::new("apps/v1", "ControllerRevision").with_name(&name);
    o.metadata.namespace = binding.namespace().to_string();
    if binding.name().len() <= 63 {
        o.metadata
            .labels
            .insert(BINDING_LABEL.into(), binding.name().to_string());
    }
    o.metadata
        .annotations
        .insert(BINDING_LABEL.into(), binding.name().to_string());
    o.metadata
        .annotations
        .insert(DIGEST_ANNOTATION.into(), digest.to_string());
    o.metadata.owner_references.push(crate::OwnerReference {
        api_version: binding.api_version.clone(),
        kind: binding.kind.clone(),
        name: binding.name().to_string(),
        uid: binding.metadata.uid.clone(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    });
    o.other.insert("data".into(), content);
    o.other.insert("revision".into(), Value::from(n));
    o
}

/// A ControllerRevision's number, binding (in its namespace) and digest, if Orrery wrote it.
pub fn revision_of(o: &crate::Object) -> Option<(i64, &str, &str)> {
    let n = o.other.get("revision")?.as_i64()?;
    let b = o.metadata.annotations.get(BINDING_LABEL)?;
    let d = o.metadata.annotations.get(DIGEST_ANNOTATION)?;
    Some((n, b, d))
}

/// Whether an approval was taken.
pub const CONDITION_ACCEPTED: &str = "Accepted";

/// A RolloutApproval's status: whether Orrery took it, and why not.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<crate::conditions::Condition>,
}

impl ApprovalSpec {
    /// Appends what is wrong with the spec to `errs`.
    pub fn validate(&self, errs: &mut ErrorList) {
        if self.binding.is_empty() {
            errs.push(FieldError::required(
                "spec.binding",
                "the ResourceBinding whose rollout it approves",
            ));
        }
        if self.revision < 1 {
            errs.push(FieldError::invalid(
                "spec.revision",
                self.revision,
                "must be at least 1",
            ));
        }
        if self.stage.is_empty() {
            errs.push(FieldError::required(
                "spec.stage",
                "the stage that may start",
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn strategy(v: serde_json::Value) -> RolloutStrategy {
        serde_json::from_value(v).unwrap()
    }

    fn errors(s: &RolloutStrategy) -> Vec<String> {
        let mut errs = ErrorList::new();
        s.validate("spec.placement.rollout", &mut errs);
        errs.iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn a_stage_chooses_its_clusters_one_way() {
        let ok = strategy(json!({"stages": [
            {"name": "canary", "clusters": ["a"], "minSuccessTime": "30s"},
            {"name": "eu", "clusterSelector": {"matchLabels": {"region": "eu"}}, "maxConcurrency": "50%"},
            {"name": "rest", "percent": 100, "approval": true, "waitForLevelBelow": 0.7}
        ], "maxFailures": 1, "rollback": "Automatic", "progressDeadline": "5m"}));
        assert!(errors(&ok).is_empty(), "{:?}", errors(&ok));
        assert_eq!(ok.progress_deadline(), Duration::from_secs(300));
        assert_eq!(ok.stages[0].min_success_time(), Duration::from_secs(30));
        let bad = strategy(json!({"stages": [
            {"name": "two", "clusters": ["a"], "percent": 10},
            {"name": "none"},
            {"name": "remaining", "clusters": ["b"]},
            {"name": "two", "percent": 0, "maxConcurrency": 0, "minSuccessTime": "soon", "waitForLevelBelow": 1.5}
        ], "maxFailures": -1}));
        let e = errors(&bad);
        for want in [
            "stages[0]: Invalid value",
            "stages[1]: Invalid value",
            "stages[2].name",
            "stages[3].name: Duplicate",
            "stages[3].percent",
            "stages[3].maxConcurrency",
            "stages[3].minSuccessTime",
            "stages[3].waitForLevelBelow",
            "maxFailures",
        ] {
            assert!(e.iter().any(|x| x.contains(want)), "{want} not in {e:?}");
        }
        assert!(!errors(&strategy(json!({"stages": []}))).is_empty());
        assert!(
            serde_json::from_value::<RolloutStrategy>(json!({"stages": [], "stagez": 1})).is_err()
        );
    }

    #[test]
    fn a_budget_holds_what_a_move_would_take_down() {
        let m = |c: &str, o: i64, n: i64, r: i64| (c.to_string(), o, n, r);
        // 12 running and ready, 4 moving from a to b, at least 10 ready: 2 go now, a keeps 2.
        let held = hold(10, &[m("a", 6, 2, 6), m("b", 6, 10, 6)]);
        assert_eq!(held, BTreeMap::from([("a".to_string(), 4)]));
        // Once b's new replicas are ready, the rest goes.
        assert!(hold(10, &[m("a", 4, 2, 4), m("b", 10, 10, 10)]).is_empty());
        // A scale-down with every replica ready goes at once.
        assert!(hold(6, &[m("a", 6, 3, 6), m("b", 6, 3, 6)]).is_empty());
        // Half of a's share back to b, which runs nothing yet: a keeps all until b's are
        // ready, then the rest goes.
        let held = hold(12, &[m("a", 12, 6, 12), m("b", 0, 6, 0)]);
        assert_eq!(held, BTreeMap::from([("a".to_string(), 12)]));
        let held = hold(12, &[m("a", 12, 6, 12), m("b", 6, 6, 3)]);
        assert_eq!(held, BTreeMap::from([("a".to_string(), 9)]));
        assert!(hold(12, &[m("a", 12, 6, 12), m("b", 6, 6, 6)]).is_empty());
        // b's Work from before it went dark says 6, none ready: a still keeps all.
        let held = hold(12, &[m("a", 12, 6, 12), m("b", 6, 6, 0)]);
        assert_eq!(held, BTreeMap::from([("a".to_string(), 12)]));
        // A dark cluster's replicas are not ready: a failover away from it waits for nothing.
        assert!(hold(10, &[m("a", 6, 0, 0), m("b", 6, 12, 6)]).is_empty());
        // A whole cluster given up (Duplicated), nothing spare: it keeps all.
        let held = hold(6, &[m("a", 3, 0, 3), m("b", 3, 3, 3), m("c", 0, 3, 0)]);
        assert_eq!(held, BTreeMap::from([("a".to_string(), 3)]));
        // Unready replicas of a cluster giving some up go first.
        assert!(hold(6, &[m("a", 8, 6, 6), m("b", 0, 0, 0)]).is_empty());
        let b = |v: serde_json::Value| serde_json::from_value::<DisruptionBudget>(v).unwrap();
        assert_eq!(b(json!({"minAvailable": "50%"})).min_available(5), 3);
        assert_eq!(b(json!({"maxUnavailable": 1})).min_available(5), 4);
        assert_eq!(b(json!({"maxUnavailable": "10%"})).min_available(12), 10);
        let mut errs = ErrorList::new();
        b(json!({"minAvailable": 1, "maxUnavailable": 1})).validate("p", &mut errs);
        b(json!({"minAvailable": -1})).validate("q", &mut errs);
        assert_eq!(errs.len(), 2, "{errs:?}");
    }

    #[test]
    fn concurrency_as_a_count_or_a_share() {
        assert_eq!(IntOrPercent::Int(2).of(10), Some(2));
        assert_eq!(IntOrPercent::Percent("25%".into()).of(10), Some(3));
        assert_eq!(IntOrPercent::Percent("100%".into()).of(7), Some(7));
        assert_eq!(IntOrPercent::Percent("25".into()).of(10), None);
    }
}
