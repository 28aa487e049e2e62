//! Karmada's `FederatedResourceQuota` (policy.karmada.io/v1alpha1): a namespace's limits
//! across the whole fleet (`overall`), and per-cluster parts of them (`staticAssignments`)
//! that each member enforces as a ResourceQuota of the same name.
//!
//! What counts against `overall` is Karmada's: each of the namespace's bindings uses its
//! per-replica request times the replicas its decision places (summed over clusters, so a
//! duplicated workload counts in every cluster), and only the resource names `overall` lists
//! count, spelled as requests are (`cpu`, `memory`; `requests.cpu` never accrues usage).
//! A change that would take a quota over a limit is refused with Karmada's message
//! ([`exceeded`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::binding::{self, BindingSpec};
use crate::meta::ResourceList;
use crate::quantity::Quantity;
use crate::validation::{self, ErrorList, FieldError};

pub const GROUP: &str = "policy.karmada.io";
pub const API_VERSION: &str = "policy.karmada.io/v1alpha1";
pub const KIND: &str = "FederatedResourceQuota";
/// Labels on the Works (and so the member ResourceQuotas) made from a quota's assignments.
pub const LABEL_NAMESPACE: &str = "federatedresourcequota.karmada.io/namespace";
pub const LABEL_NAME: &str = "federatedresourcequota.karmada.io/name";
/// The reason of a refusal, and of a binding's `Scheduled` condition, for a quota exceeded.
pub const REASON_QUOTA_EXCEEDED: &str = "QuotaExceeded";
/// The longest quota name: it is a label value on what it makes.
pub const MAX_NAME_LEN: usize = validation::DNS1123_LABEL_MAX;

/// The spec of a FederatedResourceQuota.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FederatedResourceQuotaSpec {
    /// The namespace's limits across every cluster.
    pub overall: ResourceList,
    /// Parts of `overall` given to clusters, each enforced there as a ResourceQuota named as
    /// this quota. (The scheduler does not place by them, as in Karmada.)
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub static_assignments: Vec<StaticClusterAssignment>,
}

/// One cluster's part of the limits.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StaticClusterAssignment {
    /// The member cluster.
    pub cluster_name: String,
    /// Its limits: the ResourceQuota's `spec.hard` there (within `overall`).
    pub hard: ResourceList,
}

/// What the quota observes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FederatedResourceQuotaStatus {
    /// The limits in force (the spec's `overall`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub overall: ResourceList,
    /// What the namespace's bindings place, for the resources `overall` names.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub overall_used: ResourceList,
    /// Each assigned cluster's ResourceQuota as the member reports it, by cluster name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aggregated_status: Vec<ClusterQuotaStatus>,
}

/// A member's ResourceQuota status.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterQuotaStatus {
    /// The member cluster.
    pub cluster_name: String,
    /// The limits its ResourceQuota enforces.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub hard: ResourceList,
    /// What the member counts against them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub used: ResourceList,
}

/// Resource names a quota may limit (Kubernetes' standard quota resources).
const QUOTA_RESOURCES: &[&str] = &[
    "cpu",
    "memory",
    "ephemeral-storage",
    "requests.cpu",
    "requests.memory",
    "requests.storage",
    "requests.ephemeral-storage",
    "limits.cpu",
    "limits.memory",
    "limits.ephemeral-storage",
    "pods",
    "resourcequotas",
    "services",
    "replicationcontrollers",
    "secrets",
    "persistentvolumeclaims",
    "configmaps",
    "services.nodeports",
    "services.loadbalancers",
];

/// Counted resources: their quantities must be whole.
const INTEGER_RESOURCES: &[&str] = &[
    "pods",
    "resourcequotas",
    "services",
    "replicationcontrollers",
    "secrets",
    "configmaps",
    "persistentvolumeclaims",
    "services.nodeports",
    "services.loadbalancers",
];

/// Kubernetes' rules for a quota's resource names and values (Karmada's
/// `validateResourceList`), each error at `path[<name>]`.
fn validate_resource_list(list: &ResourceList, path: &str, errs: &mut ErrorList) {
    for (name, q) in list {
        let at = format!("{path}[{name}]");
        let mut named_ok = true;
        for m in validation::is_qualified_name(name) {
            errs.push(FieldError::invalid(&at, name, m));
            named_ok = false;
        }
        let standard = QUOTA_RESOURCES.contains(&name.as_str())
            || name.starts_with("hugepages-")
            || name.starts_with("requests.hugepages-");
        if named_ok && !name.contains('/') && !standard {
            errs.push(FieldError::invalid(
                &at,
                name,
                "must be a standard resource type or fully qualified",
            ));
            errs.push(FieldError::invalid(
                &at,
                name,
                "must be a standard resource for quota",
            ));
        }
        if q.is_negative() {
            errs.push(FieldError::invalid(
                &at,
                q.to_string(),
                "must be greater than or equal to 0",
            ));
        }
        let integer = INTEGER_RESOURCES.contains(&name.as_str()) || name.contains('/');
        if integer && q.nanos() % 1_000_000_000 != 0 {
            errs.push(FieldError::invalid(
                &at,
                q.to_string(),
                "must be an integer",
            ));
        }
    }
}

impl FederatedResourceQuotaSpec {
    /// Karmada's admission checks of a quota named `name`.
    pub fn validate(&self, name: &str) -> ErrorList {
        let mut errs = Vec::new();
        if name.len() > MAX_NAME_LEN {
            errs.push(FieldError::invalid(
                "metadata.name",
                name,
                format!("must be no more than {MAX_NAME_LEN} characters"),
            ));
        }
        validate_resource_list(&self.overall, "spec.overall", &mut errs);
        let mut seen = std::collections::BTreeSet::new();
        for (i, a) in self.static_assignments.iter().enumerate() {
            let at = format!("spec.staticAssignments[{i}]");
            for e in crate::cluster::validate_name(&a.cluster_name) {
                errs.push(FieldError::invalid(
                    format!("{at}.clusterName"),
                    &a.cluster_name,
                    e.detail,
                ));
            }
            // Karmada counts a repeated cluster twice and enforces its first part only:
            // refused here, rather than enforced differently than written.
            if !seen.insert(a.cluster_name.as_str()) {
                errs.push(FieldError::duplicate(
                    format!("{at}.clusterName"),
                    &a.cluster_name,
                ));
            }
            validate_resource_list(&a.hard, &format!("{at}.hard"), &mut errs);
        }
        for (res, limit) in &self.overall {
            let assigned: Quantity = self
                .static_assignments
                .iter()
                .filter_map(|a| a.hard.get(res))
                .cloned()
                .sum();
            if *limit < assigned {
                errs.push(FieldError::invalid(
                    format!("spec.overall[{res}]"),
                    limit.to_string(),
                    "overall is less than assignments",
                ));
            }
        }
        for (i, a) in self.static_assignments.iter().enumerate() {
            for res in a.hard.keys().filter(|r| !self.overall.contains_key(*r)) {
                errs.push(FieldError::invalid(
                    format!("spec.staticAssignments[{i}].hard[{res}]"),
                    res,
                    "assignment resourceName is not exist in overall",
                ));
            }
        }
        errs
    }
}

/// What a binding uses (Karmada's `CalculateResourceUsage`): its per-replica request times the
/// replicas its decision places, summed over clusters; nothing before it is placed.
pub fn usage_of(spec: &BindingSpec) -> ResourceList {
    if spec.is_whole_set() {
        let placed = spec.clusters.iter().filter(|c| c.replicas > 0).count();
        return whole_set_use(&spec.components, placed as i64);
    }
    let placed: i64 = spec.clusters.iter().map(|c| c.replicas.max(0)).sum();
    let Some(req) = spec.replica_requirements.as_ref() else {
        return ResourceList::new();
    };
    times(&req.resource_request, placed)
}

/// What a workload of several components uses placed whole in `sets` clusters: the set's
/// request in each (its pods left out, as for any binding).
pub fn whole_set_use(components: &[binding::Component], sets: i64) -> ResourceList {
    let mut set = binding::set_request(components.iter().map(|c| (c.replicas, c.request())));
    set.remove("pods");
    times(&set, sets)
}

/// `request` times `n`, zero quantities left out.
pub fn times(request: &ResourceList, n: i64) -> ResourceList {
    if n <= 0 {
        return ResourceList::new();
    }
    request
        .iter()
        .filter(|(_, q)| !q.is_zero())
        .filter_map(|(r, q)| Some((r.clone(), q.checked_mul(n)?)))
        .collect()
}

/// `a + b`, key by key.
pub fn add(a: &ResourceList, b: &ResourceList) -> ResourceList {
    let mut out = a.clone();
    for (r, q) in b {
        let sum = out.get(r).map_or_else(|| *q, |o| *o + *q);
        out.insert(r.clone(), sum);
    }
    out
}

/// `a - b`, key by key (what a workload's old use gives back).
pub fn sub(a: &ResourceList, b: &ResourceList) -> ResourceList {
    let mut out = a.clone();
    for (r, q) in b {
        let left = out.get(r).cloned().unwrap_or_default() - *q;
        out.insert(r.clone(), left);
    }
    out
}

/// The part of `used` that `overall` limits, positive quantities only (Karmada leaves a
/// resource nothing uses out of `overallUsed`).
pub fn counted(used: &ResourceList, overall: &ResourceList) -> ResourceList {
    used.iter()
        .filter(|(r, q)| overall.contains_key(*r) && !q.is_zero() && !q.is_negative())
        .map(|(r, q)| (r.clone(), *q))
        .collect()
}

/// Karmada's refusal when `used` (the namespace's use after the change) is over one of the
/// quota's limits: `FederatedResourceQuota(<ns>/<name>) exceeded for resource <res>:
/// requested sum <used>, limit <overall>.` — the first resource by name.
pub fn exceeded(
    namespace: &str,
    name: &str,
    overall: &ResourceList,
    used: &ResourceList,
) -> Option<String> {
    used.iter().find_map(|(res, q)| {
        let limit = overall.get(res)?;
        (q > limit).then(|| {
            format!(
                "FederatedResourceQuota({namespace}/{name}) exceeded for resource {res}: \
                 requested sum {q}, limit {limit}."
            )
        })
    })
}

/// What a placed binding would use with `replicas` replicas of `request` each, placed as it
/// is: divided, the replicas; duplicated, the replicas in every cluster. Nothing for a binding
/// not placed yet (its decision is checked instead).
pub fn projected_use(spec: &BindingSpec, replicas: i64, request: &ResourceList) -> ResourceList {
    if spec.clusters.is_empty() {
        return ResourceList::new();
    }
    let placed = if spec.placement.divided() {
        replicas
    } else {
        replicas.saturating_mul(spec.clusters.len() as i64)
    };
    times(request, placed)
}

/// The refusal of a change that takes a namespace's use from `before` to `after`, under one
/// quota: the first limited resource (by name) whose use grows and ends over its limit, in
/// Karmada's words ([`exceeded`]). A change that does not grow a resource is let through even
/// when the namespace is over a limit lowered since (Karmada refuses it too, so that a
/// workload could not even shrink; Kubernetes' ResourceQuota lets it).
pub fn refusal(
    namespace: &str,
    name: &str,
    overall: &ResourceList,
    before: &ResourceList,
    after: &ResourceList,
) -> Option<String> {
    let (before, after) = (counted(before, overall), counted(after, overall));
    let grown: ResourceList = after
        .iter()
        .filter(|(r, q)| before.get(*r).is_none_or(|b| *q > b))
        .map(|(r, q)| (r.clone(), *q))
        .collect();
    exceeded(namespace, name, overall, &grown)
}

/// Whether a change from `old` to `new` (a binding's use) must be checked: Karmada checks a
/// change of what is used, an increase or not (a namespace already over a lowered limit
/// stays refused until it is under).
pub fn changes_use(old: &ResourceList, new: &ResourceList) -> bool {
    let norm = |l: &ResourceList| -> ResourceList {
        l.iter()
            .filter(|(_, q)| !q.is_zero())
            .map(|(r, q)| (r.clone(), *q))
            .collect()
    };
    norm(old) != norm(new)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::binding::{ReplicaRequirements, TargetCluster};

    fn list(items: &[(&str, &str)]) -> ResourceList {
        items
            .iter()
            .map(|(r, q)| (r.to_string(), q.parse().unwrap()))
            .collect()
    }

    fn spec(
        overall: &[(&str, &str)],
        assigned: &[(&str, &[(&str, &str)])],
    ) -> FederatedResourceQuotaSpec {
        FederatedResourceQuotaSpec {
            overall: list(overall),
            static_assignments: assigned
                .iter()
                .map(|(c, hard)| StaticClusterAssignment {
                    cluster_name: c.to_string(),
                    hard: list(hard),
                })
                .collect(),
        }
    }

    fn messages(errs: &ErrorList) -> Vec<String> {
        errs.iter()
            .map(|e| format!("{}: {}", e.field, e.detail))
            .collect()
    }

    #[test]
    fn a_valid_quota_passes() {
        let s = spec(
            &[("cpu", "2"), ("memory", "4Gi"), ("pods", "10")],
            &[
                ("east", &[("cpu", "1")]),
                ("west", &[("cpu", "1"), ("pods", "4")]),
            ],
        );
        assert!(
            s.validate("team-a").is_empty(),
            "{:?}",
            s.validate("team-a")
        );
    }

    #[test]
    fn assignments_above_overall_or_outside_it_are_refused() {
        let s = spec(
            &[("cpu", "1")],
            &[
                ("east", &[("cpu", "600m")]),
                ("west", &[("cpu", "600m"), ("memory", "1Gi")]),
            ],
        );
        let m = messages(&s.validate("q"));
        assert!(
            m.contains(&"spec.overall[cpu]: overall is less than assignments".to_string()),
            "{m:?}"
        );
        assert!(
            m.contains(
                &"spec.staticAssignments[1].hard[memory]: assignment resourceName is not exist in overall"
                    .to_string()
            ),
            "{m:?}"
        );
    }

    #[test]
    fn resource_names_and_values_follow_kubernetes_quota_rules() {
        let s = spec(&[("cpus", "1"), ("pods", "1500m"), ("memory", "-1")], &[]);
        let m = messages(&s.validate("q"));
        assert!(
            m.contains(&"spec.overall[cpus]: must be a standard resource for quota".to_string()),
            "{m:?}"
        );
        assert!(
            m.contains(&"spec.overall[pods]: must be an integer".to_string()),
            "{m:?}"
        );
        assert!(
            m.contains(&"spec.overall[memory]: must be greater than or equal to 0".to_string()),
            "{m:?}"
        );
        let fq = spec(&[("example.com/gpu", "2")], &[]);
        assert!(
            fq.validate("q").is_empty(),
            "a fully qualified name is allowed"
        );
    }

    #[test]
    fn names_and_clusters_are_checked() {
        let s = spec(
            &[("cpu", "1")],
            &[("East", &[]), ("east", &[]), ("east", &[])],
        );
        let m = messages(&s.validate(&"q".repeat(64)));
        assert!(
            m.iter()
                .any(|e| e.starts_with("metadata.name: must be no more than 63")),
            "{m:?}"
        );
        assert!(
            m.iter()
                .any(|e| e.starts_with("spec.staticAssignments[0].clusterName")),
            "{m:?}"
        );
        assert!(
            s.validate("q")
                .iter()
                .any(|e| e.field == "spec.staticAssignments[2].clusterName"
                    && e.kind == validation::ErrorType::Duplicate),
            "a cluster assigned twice is refused"
        );
    }

    #[test]
    fn use_is_request_times_placed_replicas() {
        let mut b = BindingSpec {
            replicas: 3,
            replica_requirements: Some(ReplicaRequirements {
                resource_request: list(&[("cpu", "200m"), ("memory", "0")]),
            }),
            ..Default::default()
        };
        assert!(usage_of(&b).is_empty(), "nothing is used before a decision");
        b.clusters = vec![
            TargetCluster {
                name: "a".into(),
                replicas: 3,
            },
            TargetCluster {
                name: "b".into(),
                replicas: 3,
            },
        ];
        // Duplicated: every cluster's replicas count.
        assert_eq!(usage_of(&b), list(&[("cpu", "1200m")]));
        b.replica_requirements = None;
        assert!(usage_of(&b).is_empty());
    }

    #[test]
    fn a_whole_set_uses_every_components_request_once_per_cluster() {
        let part = |name: &str, replicas, cpu: &str| binding::Component {
            name: name.into(),
            replicas,
            replica_requirements: Some(ReplicaRequirements {
                resource_request: list(&[("cpu", cpu), ("memory", "1Gi")]),
            }),
        };
        let mut b = BindingSpec {
            replicas: 4,
            components: vec![part("head", 1, "500m"), part("worker", 3, "2")],
            ..Default::default()
        };
        assert!(usage_of(&b).is_empty(), "nothing is used before a decision");
        // One set placed (its replica count is 1, whatever the template's replicas).
        b.clusters = vec![TargetCluster {
            name: "a".into(),
            replicas: 1,
        }];
        assert_eq!(
            usage_of(&b),
            list(&[("cpu", "6500m"), ("memory", "4Gi")]),
            "no pods counted"
        );
        // A component with no requirements asks nothing; negative replicas count as none.
        b.components.push(binding::Component {
            name: "sidecar".into(),
            replicas: -2,
            replica_requirements: None,
        });
        assert_eq!(usage_of(&b)["cpu"], "6500m".parse().unwrap());
    }

    #[test]
    fn only_the_limited_names_count_and_the_message_is_karmadas() {
        let overall = list(&[("cpu", "1"), ("requests.memory", "1Gi")]);
        let used = counted(&list(&[("cpu", "1200m"), ("memory", "2Gi")]), &overall);
        assert_eq!(
            used,
            list(&[("cpu", "1200m")]),
            "memory is not requests.memory"
        );
        assert_eq!(
            exceeded("team-a", "q", &overall, &used).unwrap(),
            "FederatedResourceQuota(team-a/q) exceeded for resource cpu: requested sum 1200m, limit 1."
        );
        assert_eq!(
            exceeded("team-a", "q", &overall, &list(&[("cpu", "1")])),
            None,
            "at the limit is within it"
        );
    }

    #[test]
    fn a_change_is_refused_only_when_a_limited_use_grows_past_its_limit() {
        let overall = list(&[("cpu", "1")]);
        let before = list(&[("cpu", "800m")]);
        let m = refusal("ns", "q", &overall, &before, &list(&[("cpu", "1200m")])).unwrap();
        assert!(m.contains("requested sum 1200m, limit 1."), "{m}");
        assert!(refusal("ns", "q", &overall, &before, &list(&[("cpu", "1")])).is_none());
        // Over a lowered limit: shrinking is let through, growing is not.
        let over = list(&[("cpu", "2")]);
        assert!(refusal("ns", "q", &overall, &over, &list(&[("cpu", "1500m")])).is_none());
        assert!(refusal("ns", "q", &overall, &over, &list(&[("cpu", "2100m")])).is_some());
        // A resource no limit names never refuses.
        assert!(
            refusal(
                "ns",
                "q",
                &overall,
                &before,
                &list(&[("cpu", "800m"), ("memory", "9Gi")])
            )
            .is_none()
        );
    }

    #[test]
    fn a_placed_binding_projects_its_new_replicas_as_placed() {
        let mut b = BindingSpec {
            clusters: vec![
                TargetCluster {
                    name: "a".into(),
                    replicas: 2,
                },
                TargetCluster {
                    name: "b".into(),
                    replicas: 2,
                },
            ],
            ..Default::default()
        };
        let req = list(&[("cpu", "100m")]);
        assert_eq!(
            projected_use(&b, 3, &req),
            list(&[("cpu", "600m")]),
            "duplicated: in each cluster"
        );
        b.placement.replica_scheduling = Some(crate::policy::ReplicaScheduling {
            replica_scheduling_type: "Divided".into(),
            ..Default::default()
        });
        assert_eq!(
            projected_use(&b, 3, &req),
            list(&[("cpu", "300m")]),
            "divided: shared out"
        );
        b.clusters.clear();
        assert!(projected_use(&b, 3, &req).is_empty(), "not placed yet");
    }

    #[test]
    fn arithmetic_and_change_detection() {
        let a = list(&[("cpu", "1"), ("memory", "1Gi")]);
        let b = list(&[("cpu", "500m")]);
        assert_eq!(add(&a, &b), list(&[("cpu", "1500m"), ("memory", "1Gi")]));
        assert_eq!(sub(&a, &b), list(&[("cpu", "500m"), ("memory", "1Gi")]));
        assert_eq!(times(&b, 0), ResourceList::new());
        assert!(!changes_use(&list(&[("cpu", "0")]), &ResourceList::new()));
        assert!(changes_use(&a, &b));
    }
}
