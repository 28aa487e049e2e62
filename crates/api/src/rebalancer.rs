//! Karmada's `WorkloadRebalancer` (apps.karmada.io/v1alpha1): a one-shot fresh division of
//! the workloads it names. Each named workload's binding is asked once for a fresh decision
//! (the scheduler then decides as if nothing were placed, within the water levels and the
//! workload's move budget); the status tells, per workload, whether the request was made.

use serde::{Deserialize, Serialize};

use crate::Time;
use crate::validation::{ErrorList, FieldError};

/// The spec of a WorkloadRebalancer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkloadRebalancerSpec {
    /// The workloads to divide afresh (at least one).
    pub workloads: Vec<WorkloadReference>,
    /// Seconds after it finished (every workload Successful or Failed) until the
    /// rebalancer is deleted; kept without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds_after_finished: Option<i32>,
}

/// A workload: a template's apiVersion, kind, name and (for namespaced kinds) namespace.
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
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkloadReference {
    /// The template's apiVersion (`apps/v1`).
    #[serde(default)]
    pub api_version: String,
    /// The template's kind.
    #[serde(default)]
    pub kind: String,
    /// The template's name.
    #[serde(default)]
    pub name: String,
    /// Empty for a cluster-scoped template.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
}

impl WorkloadReference {
    /// Karmada's sort key: `apiVersion kind namespace name`.
    pub fn sort_key(&self) -> String {
        format!(
            "{} {} {} {}",
            self.api_version, self.kind, self.namespace, self.name
        )
    }
}

/// What became of each workload.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadRebalancerStatus {
    /// Each workload named (and each that was Successful before the spec dropped it), in
    /// `apiVersion kind namespace name` order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub observed_workloads: Vec<ObservedWorkload>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub observed_generation: i64,
    /// When the last workload got its result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_time: Option<Time>,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// One workload's result.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObservedWorkload {
    pub workload: WorkloadReference,
    /// `Successful` (its fresh decision was asked for) or `Failed`; empty while being tried.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub result: String,
    /// Why it failed: `ReferencedBindingNotFound` (no policy places it).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

pub const RESULT_SUCCESSFUL: &str = "Successful";
pub const RESULT_FAILED: &str = "Failed";
pub const REASON_BINDING_NOT_FOUND: &str = "ReferencedBindingNotFound";

impl WorkloadRebalancerSpec {
    pub fn validate(&self) -> ErrorList {
        let mut errs = Vec::new();
        if self.workloads.is_empty() {
            errs.push(FieldError::required(
                "spec.workloads",
                "name at least one workload",
            ));
        }
        for (i, w) in self.workloads.iter().enumerate() {
            for (field, v) in [
                ("apiVersion", &w.api_version),
                ("kind", &w.kind),
                ("name", &w.name),
            ] {
                if v.is_empty() {
                    errs.push(FieldError::required(
                        format!("spec.workloads[{i}].{field}"),
                        "",
                    ));
                }
            }
        }
        if let Some(t) = self.ttl_seconds_after_finished
            && t < 0
        {
            errs.push(FieldError::invalid(
                "spec.ttlSecondsAfterFinished",
                t,
                "must be 0 or more",
            ));
        }
        errs
    }
}

/// Karmada's first step of each pass: the status's workloads made to match the spec. A
/// workload still named keeps its result; one dropped from the spec stays only if it was
/// Successful (what was done stays told); a new one starts with no result. Sorted.
pub fn observe(
    spec: &WorkloadRebalancerSpec,
    status: &WorkloadRebalancerStatus,
) -> Vec<ObservedWorkload> {
    let mut wanted: Vec<&WorkloadReference> = spec.workloads.iter().collect();
    wanted.sort();
    wanted.dedup();
    let mut out: Vec<ObservedWorkload> = Vec::new();
    for item in &status.observed_workloads {
        if let Some(i) = wanted.iter().position(|w| **w == item.workload) {
            out.push(item.clone());
            wanted.remove(i);
        } else if item.result == RESULT_SUCCESSFUL {
            out.push(item.clone());
        }
    }
    out.extend(wanted.into_iter().map(|w| ObservedWorkload {
        workload: w.clone(),
        ..Default::default()
    }));
    out.sort_by_key(|o| o.workload.sort_key());
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn w(name: &str) -> WorkloadReference {
        WorkloadReference {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            name: name.into(),
            namespace: "default".into(),
        }
    }

    #[test]
    fn the_status_follows_the_spec_and_keeps_what_was_done() {
        let spec = WorkloadRebalancerSpec {
            workloads: vec![w("b"), w("a"), w("b")],
            ttl_seconds_after_finished: None,
        };
        let fresh = observe(&spec, &Default::default());
        assert_eq!(
            fresh
                .iter()
                .map(|o| o.workload.name.as_str())
                .collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert!(fresh.iter().all(|o| o.result.is_empty()));
        // a succeeded, c failed and then b and c left the spec for d.
        let status = WorkloadRebalancerStatus {
            observed_workloads: vec![
                ObservedWorkload {
                    workload: w("a"),
                    result: RESULT_SUCCESSFUL.into(),
                    reason: String::new(),
                },
                ObservedWorkload {
                    workload: w("c"),
                    result: RESULT_FAILED.into(),
                    reason: REASON_BINDING_NOT_FOUND.into(),
                },
            ],
            ..Default::default()
        };
        let spec = WorkloadRebalancerSpec {
            workloads: vec![w("d")],
            ttl_seconds_after_finished: None,
        };
        let next = observe(&spec, &status);
        assert_eq!(
            next.iter()
                .map(|o| (o.workload.name.as_str(), o.result.as_str()))
                .collect::<Vec<_>>(),
            [("a", RESULT_SUCCESSFUL), ("d", "")]
        );
    }

    #[test]
    fn a_spec_names_what_it_rebalances() {
        let spec: WorkloadRebalancerSpec = serde_json::from_value(serde_json::json!({
            "workloads": [{"apiVersion": "apps/v1", "kind": "", "name": "web"}],
            "ttlSecondsAfterFinished": -1
        }))
        .unwrap();
        let errs = spec.validate();
        assert_eq!(
            errs.iter().map(|e| e.field.as_str()).collect::<Vec<_>>(),
            ["spec.workloads[0].kind", "spec.ttlSecondsAfterFinished"]
        );
        assert!(!WorkloadRebalancerSpec::default().validate().is_empty());
        assert!(
            serde_json::from_value::<WorkloadRebalancerSpec>(
                serde_json::json!({"workloads": [], "extra": 1})
            )
            .is_err(),
            "unknown fields are refused"
        );
    }
}
