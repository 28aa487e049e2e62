//! Kueue quotas from member capacity (KubeStellar galaxy #36): a `ClusterResourceClaim` per
//! member records its nominal resources, a Kueue administrator assigns parts of them to
//! `ClusterQueue`s by flavor, and Orrery keeps each queue's `nominalQuota` the sum of what
//! every claim assigns it, scaled down when the member's capacity shrinks.
//!
//! Pure: the claim's shape and validation, when a capacity change is followed (hysteresis),
//! what each assignment gives now, and how a queue's spec takes the sums without ever going
//! below what the queue has admitted.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::conditions::Condition;
use crate::meta::ResourceList;
use crate::quantity::{Format, Quantity};
use crate::validation::{ErrorList, FieldError};

pub const GROUP: &str = "galaxy.kubestellar.io";
pub const API_VERSION: &str = "galaxy.kubestellar.io/v1alpha1";
pub const CLAIM_KIND: &str = "ClusterResourceClaim";
pub const CLAIM_PLURAL: &str = "clusterresourceclaims";
pub const METRICS_KIND: &str = "ClusterMetrics";
pub const METRICS_PLURAL: &str = "clustermetrics";
/// Kueue's API, served once its CRDs are applied.
pub const KUEUE_GROUP: &str = "kueue.x-k8s.io";
pub const QUEUE_PLURAL: &str = "clusterqueues";
/// On a ClusterQueue: the `flavor/resource` quotas Orrery keeps (JSON list), so that a
/// quota no claim names any more is returned, and others are never touched.
pub const ANNOTATION_MANAGED: &str = "quota.orrery.io/managed";
/// The claim's condition: whether its assignments are in the queues' quotas.
pub const CONDITION_APPLIED: &str = "Applied";
/// A change of capacity smaller than this share of the nominal resources is not followed
/// (hysteresis: a node flapping does not move quotas back and forth).
pub const BAND: f64 = 0.05;
/// Resources a claim does not record: they are not quota in Kueue's sense.
const NOT_CLAIMED: &[&str] = &["pods", "ephemeral-storage"];

/// The claim Orrery makes for a member.
pub fn claim_name(cluster: &str) -> String {
    format!("{cluster}-resource-claim")
}

/// A ClusterResourceClaim's spec, the seed's shape.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClaimSpec {
    /// The member cluster whose capacity this is.
    #[serde(default)]
    pub cluster_name: String,
    /// The member's capacity when it joined: what the assignments divide.
    #[serde(default)]
    pub nominal_resources: ResourceList,
    /// Parts of the nominal resources given to Kueue ClusterQueues, by flavor.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resource_assignments: Vec<Assignment>,
}

/// Resources of one flavor given to one ClusterQueue.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Assignment {
    /// The ClusterQueue (kueue.x-k8s.io/v1beta1) that gets the resources.
    pub cluster_queue_name: String,
    /// The ResourceFlavor they count under in that queue.
    pub flavor: String,
    /// How much of each resource.
    #[serde(default)]
    pub resources: ResourceList,
}

/// A ClusterResourceClaim's status, written by Orrery.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimStatus {
    /// The member's schedulable capacity now (its ClusterMetrics, summed over its nodes).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub allocatable: ResourceList,
    /// The capacity the queues' quotas follow: `allocatable` when it last moved by more than
    /// the hysteresis band, at most once per interval.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub applied: ResourceList,
    /// When `applied` last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_time: Option<crate::Time>,
    /// What each assignment gives its queue now: scaled by `applied / nominalResources` where
    /// the member has less than it had.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub assignments: Vec<Assignment>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// One node of a member, as galaxy's ClusterMetrics reports it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeInfo {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub allocatable_resources: ResourceList,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub allocated_resource_requests: ResourceList,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub allocated_resource_limits: ResourceList,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unschedulable: bool,
}

/// A ClusterMetrics' status: the member's nodes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetricsStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeInfo>,
}

impl MetricsStatus {
    /// What the schedulable nodes can give, summed.
    pub fn allocatable(&self) -> ResourceList {
        let mut sum = ResourceList::new();
        for n in self.nodes.iter().filter(|n| !n.unschedulable) {
            for (r, q) in &n.allocatable_resources {
                let e = sum.entry(r.clone()).or_default();
                *e = *e + *q;
            }
        }
        sum
    }
}

/// The nominal resources of a member with `allocatable`: the claimable ones.
pub fn nominal_of(allocatable: &ResourceList) -> ResourceList {
    allocatable
        .iter()
        .filter(|(r, q)| !NOT_CLAIMED.contains(&r.as_str()) && !q.is_zero())
        .map(|(r, q)| (r.clone(), *q))
        .collect()
}

impl ClaimSpec {
    /// A claim's spec, checked: every field the seed names, and no resource assigned beyond
    /// the nominal resources (summed over the assignments).
    pub fn parse(spec: Option<&Value>) -> Result<ClaimSpec, ErrorList> {
        let v = spec.cloned().unwrap_or(Value::Null);
        let s: ClaimSpec = crate::meta::decode(&v, "spec").map_err(|e| vec![e])?;
        let mut errs = ErrorList::new();
        if s.cluster_name.is_empty() {
            errs.push(FieldError::required("spec.clusterName", ""));
        }
        for (r, q) in &s.nominal_resources {
            if q.is_negative() {
                errs.push(FieldError::invalid(
                    format!("spec.nominalResources[{r}]"),
                    q,
                    "must be greater than or equal to 0",
                ));
            }
        }
        let mut seen = BTreeSet::new();
        let mut assigned = ResourceList::new();
        for (i, a) in s.resource_assignments.iter().enumerate() {
            let at = format!("spec.resourceAssignments[{i}]");
            if a.cluster_queue_name.is_empty() {
                errs.push(FieldError::required(format!("{at}.clusterQueueName"), ""));
            }
            if a.flavor.is_empty() {
                errs.push(FieldError::required(format!("{at}.flavor"), ""));
            }
            if !seen.insert((&a.cluster_queue_name, &a.flavor)) {
                errs.push(FieldError::duplicate(
                    &at,
                    format!("{}/{}", a.cluster_queue_name, a.flavor),
                ));
            }
            for (r, q) in &a.resources {
                if q.is_negative() {
                    errs.push(FieldError::invalid(
                        format!("{at}.resources[{r}]"),
                        q,
                        "must be greater than or equal to 0",
                    ));
                }
                let e = assigned.entry(r.clone()).or_default();
                *e = *e + *q;
            }
        }
        for (r, total) in &assigned {
            let nominal = s.nominal_resources.get(r).copied().unwrap_or_default();
            if *total > nominal {
                errs.push(FieldError::invalid(
                    "spec.resourceAssignments",
                    total,
                    format!(
                        "assigns {total} of {r} in all, more than the cluster's nominal {nominal}"
                    ),
                ));
            }
        }
        if errs.is_empty() { Ok(s) } else { Err(errs) }
    }
}

/// Whether quotas should follow the capacity `now` from `applied` (the capacity they follow):
/// always the first time, else when some nominal resource moved by more than [`BAND`] of its
/// nominal amount.
pub fn moved(applied: &ResourceList, now: &ResourceList, nominal: &ResourceList) -> bool {
    if applied.is_empty() {
        return !now.is_empty();
    }
    nominal.iter().any(|(r, n)| {
        let a = applied.get(r).map_or(0.0, Quantity::as_f64);
        let b = now.get(r).map_or(0.0, Quantity::as_f64);
        let n = n.as_f64();
        n > 0.0 && (a - b).abs() > BAND * n
    })
}

/// What `amount` of resource `r` gives at `share` (0–1) of it: rounded down to whole units
/// (thousandths for cpu), so the sum over a member never exceeds what it has.
fn scaled(r: &str, amount: &Quantity, share: f64) -> Quantity {
    if share >= 1.0 {
        return *amount;
    }
    let unit: i128 = if r == "cpu" { 1_000_000 } else { 1_000_000_000 };
    let n = (amount.nanos() as f64 * share.max(0.0)) as i128;
    Quantity::from_nanos(n / unit * unit, amount.format()).unwrap_or_default()
}

/// What each of a claim's assignments gives its queue when the member has `applied`: the
/// assignment itself while the member has its nominal resources, scaled down in proportion
/// where it has less (never scaled up: more capacity than nominal is the administrator's to
/// assign).
pub fn effective(spec: &ClaimSpec, applied: &ResourceList) -> Vec<Assignment> {
    spec.resource_assignments
        .iter()
        .map(|a| Assignment {
            cluster_queue_name: a.cluster_queue_name.clone(),
            flavor: a.flavor.clone(),
            resources: a
                .resources
                .iter()
                .map(|(r, q)| {
                    let nominal = spec.nominal_resources.get(r).map_or(0.0, Quantity::as_f64);
                    let now = applied.get(r).map_or(0.0, Quantity::as_f64);
                    let share = if nominal > 0.0 { now / nominal } else { 0.0 };
                    (r.clone(), scaled(r, q, share))
                })
                .collect(),
        })
        .collect()
}

/// A quota a queue gets: (flavor, resource).
pub type QuotaKey = (String, String);

/// Each queue's quotas: the sum over every claim's effective assignments that name it.
pub fn sums<'a>(
    assignments: impl IntoIterator<Item = &'a Assignment>,
) -> BTreeMap<String, BTreeMap<QuotaKey, Quantity>> {
    let mut out: BTreeMap<String, BTreeMap<QuotaKey, Quantity>> = BTreeMap::new();
    for a in assignments {
        let q = out.entry(a.cluster_queue_name.clone()).or_default();
        for (r, amount) in &a.resources {
            let e = q.entry((a.flavor.clone(), r.clone())).or_default();
            *e = *e + *amount;
        }
    }
    out
}

/// The quotas Orrery keeps on a queue, from its annotation.
pub fn managed_of(annotations: &BTreeMap<String, String>) -> BTreeSet<QuotaKey> {
    annotations
        .get(ANNOTATION_MANAGED)
        .and_then(|s| serde_json::from_str::<Vec<String>>(s).ok())
        .into_iter()
        .flatten()
        .filter_map(|k| {
            let (f, r) = k.split_once('/')?;
            Some((f.to_string(), r.to_string()))
        })
        .collect()
}

/// The annotation value naming `managed`.
pub fn managed_value(managed: &BTreeSet<QuotaKey>) -> String {
    let v: Vec<String> = managed.iter().map(|(f, r)| format!("{f}/{r}")).collect();
    serde_json::to_string(&v).unwrap_or_default()
}

/// One quota of a queue, changed or held.
#[derive(Clone, Debug, PartialEq)]
pub struct QuotaChange {
    pub flavor: String,
    pub resource: String,
    pub from: Quantity,
    pub to: Quantity,
    /// What the claims ask, when the queue keeps more until its admitted workloads finish.
    pub held_for: Option<Quantity>,
}

/// A queue's quota of `flavor`/`resource` in its spec (zero when it has none).
pub fn nominal_quota(spec: &Value, flavor: &str, resource: &str) -> Quantity {
    groups(spec)
        .iter()
        .filter_map(|g| g.get("flavors").and_then(Value::as_array))
        .flatten()
        .filter(|f| f.get("name").and_then(Value::as_str) == Some(flavor))
        .filter_map(|f| f.get("resources").and_then(Value::as_array))
        .flatten()
        .find(|r| r.get("name").and_then(Value::as_str) == Some(resource))
        .and_then(|r| quantity(r.get("nominalQuota")))
        .unwrap_or_default()
}

/// What a queue has admitted of `flavor`/`resource` (`status.flavorsUsage[].resources[].total`).
pub fn admitted(status: Option<&Value>, flavor: &str, resource: &str) -> Quantity {
    status
        .and_then(|s| s.get("flavorsUsage"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|f| f.get("name").and_then(Value::as_str) == Some(flavor))
        .filter_map(|f| f.get("resources").and_then(Value::as_array))
        .flatten()
        .find(|r| r.get("name").and_then(Value::as_str) == Some(resource))
        .and_then(|r| quantity(r.get("total")))
        .unwrap_or_default()
}

fn quantity(v: Option<&Value>) -> Option<Quantity> {
    match v? {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.as_i64().map(|i| Quantity::from_int(i, Format::DecimalSI)),
        _ => None,
    }
}

fn groups(spec: &Value) -> Vec<Value> {
    spec.get("resourceGroups")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

/// Sets a queue's quota of `flavor`/`resource`, making room for it in Kueue's structure: in
/// the resource group that covers the resource (adding the flavor with every covered resource
/// if it is new there), else in the group that has the flavor (covering the resource in each
/// of its flavors), else in a new group.
pub fn set_quota(spec: &mut Value, flavor: &str, resource: &str, quota: Quantity) {
    if !spec.is_object() {
        *spec = json!({});
    }
    let mut gs = groups(spec);
    let covers = |g: &Value| {
        g.get("coveredResources")
            .and_then(Value::as_array)
            .is_some_and(|c| c.iter().any(|r| r.as_str() == Some(resource)))
    };
    let has_flavor = |g: &Value| {
        g.get("flavors")
            .and_then(Value::as_array)
            .is_some_and(|fs| fs.iter().any(|f| f["name"].as_str() == Some(flavor)))
    };
    let zero = json!("0");
    let i = match gs.iter().position(covers) {
        Some(i) => i,
        None => match gs.iter().position(has_flavor) {
            Some(i) => {
                let g = &mut gs[i];
                push(g, "coveredResources", json!(resource));
                if let Some(fs) = g.get_mut("flavors").and_then(Value::as_array_mut) {
                    for f in fs {
                        push(
                            f,
                            "resources",
                            json!({"name": resource, "nominalQuota": zero}),
                        );
                    }
                }
                i
            }
            None => {
                gs.push(json!({"coveredResources": [resource], "flavors": []}));
                gs.len() - 1
            }
        },
    };
    let g = &mut gs[i];
    if !has_flavor(g) {
        let covered: Vec<Value> = g["coveredResources"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let resources: Vec<Value> = covered
            .iter()
            .map(|r| json!({"name": r, "nominalQuota": zero}))
            .collect();
        push(
            g,
            "flavors",
            json!({"name": flavor, "resources": resources}),
        );
    }
    if let Some(fs) = g.get_mut("flavors").and_then(Value::as_array_mut)
        && let Some(f) = fs.iter_mut().find(|f| f["name"].as_str() == Some(flavor))
    {
        let present = f["resources"]
            .as_array()
            .is_some_and(|rs| rs.iter().any(|r| r["name"].as_str() == Some(resource)));
        if !present {
            push(
                f,
                "resources",
                json!({"name": resource, "nominalQuota": zero}),
            );
        }
        if let Some(rs) = f.get_mut("resources").and_then(Value::as_array_mut)
            && let Some(r) = rs.iter_mut().find(|r| r["name"].as_str() == Some(resource))
        {
            r["nominalQuota"] = json!(quota.to_string());
        }
    }
    spec["resourceGroups"] = Value::Array(gs);
}

fn push(v: &mut Value, field: &str, item: Value) {
    if !v.get(field).is_some_and(Value::is_array) {
        v[field] = json!([]);
    }
    if let Some(a) = v.get_mut(field).and_then(Value::as_array_mut) {
        a.push(item);
    }
}

/// Brings a queue's quotas to what the claims ask (`wanted`), for every quota Orrery keeps
/// there (`managed`, and every one wanted). A quota lowered never goes below what the queue
/// has admitted of it (nor above what it had): the rest waits for workloads to finish.
/// Returns the changes made (and quotas held above what is asked), and the quotas Orrery keeps
/// from now on (those asked for, and those still held).
pub fn reconcile_queue(
    spec: &mut Value,
    status: Option<&Value>,
    wanted: &BTreeMap<QuotaKey, Quantity>,
    managed: &BTreeSet<QuotaKey>,
) -> (Vec<QuotaChange>, BTreeSet<QuotaKey>) {
    let keys: BTreeSet<QuotaKey> = wanted.keys().cloned().chain(managed.clone()).collect();
    let mut changes = Vec::new();
    let mut keep = BTreeSet::new();
    for (flavor, resource) in keys {
        let target = wanted
            .get(&(flavor.clone(), resource.clone()))
            .copied()
            .unwrap_or_default();
        let current = nominal_quota(spec, &flavor, &resource);
        let in_use = admitted(status, &flavor, &resource);
        let to = if target < current {
            target.max(current.min(in_use))
        } else {
            target
        };
        let held_for = (to > target).then_some(target);
        if wanted.contains_key(&(flavor.clone(), resource.clone())) || held_for.is_some() {
            keep.insert((flavor.clone(), resource.clone()));
        }
        if to != current {
            set_quota(spec, &flavor, &resource, to);
        }
        if to != current || held_for.is_some() {
            changes.push(QuotaChange {
                flavor,
                resource,
                from: current,
                to,
                held_for,
            });
        }
    }
    (changes, keep)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        s.parse().unwrap()
    }

    fn list(pairs: &[(&str, &str)]) -> ResourceList {
        pairs.iter().map(|(r, v)| (r.to_string(), q(v))).collect()
    }

    fn seed_claim() -> Value {
        json!({
            "clusterName": "cluster2",
            "nominalResources": {"cpu": "1000", "memory": "1000Gi", "gpu": "10"},
            "resourceAssignments": [
                {"clusterQueueName": "high-priority-queue", "flavor": "on-demand",
                 "resources": {"cpu": "500", "memory": "500Gi", "gpu": "5"}},
                {"clusterQueueName": "low-priority-queue", "flavor": "spot",
                 "resources": {"cpu": "500", "memory": "500Gi", "gpu": "5"}},
            ],
        })
    }

    #[test]
    fn claims_are_validated() {
        let s = ClaimSpec::parse(Some(&seed_claim())).unwrap();
        assert_eq!(s.resource_assignments.len(), 2);
        let cases: Vec<(Value, &str)> = vec![
            (json!({"nominalResources": {}}), "spec.clusterName"),
            (
                json!({"clusterName": "a", "nominalResources": {"cpu": "4"},
                       "resourceAssignments": [
                         {"clusterQueueName": "q", "flavor": "f", "resources": {"cpu": "3"}},
                         {"clusterQueueName": "r", "flavor": "f", "resources": {"cpu": "2"}}]}),
                "assigns 5 of cpu in all, more than the cluster's nominal 4",
            ),
            (
                json!({"clusterName": "a", "nominalResources": {"cpu": "4"},
                       "resourceAssignments": [
                         {"clusterQueueName": "q", "flavor": "f", "resources": {"gpu": "1"}}]}),
                "more than the cluster's nominal 0",
            ),
            (
                json!({"clusterName": "a", "nominalResources": {"cpu": "4"},
                       "resourceAssignments": [
                         {"clusterQueueName": "q", "flavor": "f", "resources": {"cpu": "1"}},
                         {"clusterQueueName": "q", "flavor": "f", "resources": {"cpu": "1"}}]}),
                "spec.resourceAssignments[1]",
            ),
            (
                json!({"clusterName": "a", "resourceAssignments": [{"flavor": "f"}]}),
                "clusterQueueName",
            ),
            (
                json!({"clusterName": "a", "nominalResources": {"cpu": "-1"}}),
                "must be greater than or equal to 0",
            ),
            (json!({"clusterName": "a", "owner": "x"}), "spec.owner"),
            (
                json!({"clusterName": "a", "nominalResources": {"cpu": "lots"}}),
                "spec.nominalResources",
            ),
        ];
        for (spec, want) in cases {
            let errs = ClaimSpec::parse(Some(&spec)).unwrap_err();
            let text = format!("{errs:?}");
            assert!(text.contains(want), "{spec}: {text}");
        }
    }

    #[test]
    fn capacity_is_followed_beyond_the_band_only() {
        let nominal = list(&[("cpu", "32"), ("memory", "128Gi")]);
        let applied = list(&[("cpu", "32"), ("memory", "128Gi")]);
        let cases = [
            (list(&[]), list(&[("cpu", "32")]), true),
            (
                applied.clone(),
                list(&[("cpu", "32"), ("memory", "128Gi")]),
                false,
            ),
            // 1 of 32 cores is 3%: within the band.
            (
                applied.clone(),
                list(&[("cpu", "31"), ("memory", "128Gi")]),
                false,
            ),
            // A node of 8: 25%.
            (
                applied.clone(),
                list(&[("cpu", "24"), ("memory", "96Gi")]),
                true,
            ),
            (
                applied.clone(),
                list(&[("cpu", "32"), ("memory", "120Gi")]),
                true,
            ),
            // Back up by a node.
            (
                list(&[("cpu", "24"), ("memory", "96Gi")]),
                list(&[("cpu", "32"), ("memory", "128Gi")]),
                true,
            ),
            (list(&[]), list(&[]), false),
        ];
        for (applied, now, want) in cases {
            assert_eq!(
                moved(&applied, &now, &nominal),
                want,
                "{applied:?} -> {now:?}"
            );
        }
    }

    #[test]
    fn assignments_scale_down_with_capacity_and_never_up() {
        let s = ClaimSpec::parse(Some(&seed_claim())).unwrap();
        let full = effective(
            &s,
            &list(&[("cpu", "1000"), ("memory", "1000Gi"), ("gpu", "10")]),
        );
        assert_eq!(full, s.resource_assignments);
        let more = effective(
            &s,
            &list(&[("cpu", "2000"), ("memory", "2000Gi"), ("gpu", "20")]),
        );
        assert_eq!(more, s.resource_assignments);
        let less = effective(
            &s,
            &list(&[("cpu", "750"), ("memory", "500Gi"), ("gpu", "3")]),
        );
        assert_eq!(
            less[0].resources,
            list(&[("cpu", "375"), ("memory", "250Gi"), ("gpu", "1")])
        );
        assert_eq!(less[1].resources, less[0].resources);
        // What a member without a resource gives of it: nothing.
        let none = effective(&s, &list(&[("cpu", "1000"), ("memory", "1000Gi")]));
        assert!(none[0].resources["gpu"].is_zero());
        // Cores round down to thousandths, the rest to whole units.
        let odd = ClaimSpec {
            cluster_name: "a".into(),
            nominal_resources: list(&[("cpu", "3"), ("memory", "3")]),
            resource_assignments: vec![Assignment {
                cluster_queue_name: "q".into(),
                flavor: "f".into(),
                resources: list(&[("cpu", "1"), ("memory", "1")]),
            }],
        };
        let e = effective(&odd, &list(&[("cpu", "2"), ("memory", "2")]));
        assert_eq!(e[0].resources, list(&[("cpu", "666m"), ("memory", "0")]));
    }

    #[test]
    fn queues_sum_every_claim_that_names_them() {
        let a = Assignment {
            cluster_queue_name: "q".into(),
            flavor: "on-demand".into(),
            resources: list(&[("cpu", "8"), ("memory", "32Gi")]),
        };
        let b = Assignment {
            cluster_queue_name: "q".into(),
            flavor: "on-demand".into(),
            resources: list(&[("cpu", "4")]),
        };
        let c = Assignment {
            cluster_queue_name: "r".into(),
            flavor: "spot".into(),
            resources: list(&[("cpu", "2")]),
        };
        let s = sums([&a, &b, &c]);
        let key = |f: &str, r: &str| (f.to_string(), r.to_string());
        assert_eq!(s["q"][&key("on-demand", "cpu")], q("12"));
        assert_eq!(s["q"][&key("on-demand", "memory")], q("32Gi"));
        assert_eq!(s["r"][&key("spot", "cpu")], q("2"));
        assert_eq!(s.len(), 2);
    }

    fn queue() -> Value {
        json!({
            "cohort": "all",
            "resourceGroups": [{
                "coveredResources": ["cpu", "memory"],
                "flavors": [{"name": "on-demand", "resources": [
                    {"name": "cpu", "nominalQuota": "2"},
                    {"name": "memory", "nominalQuota": "8Gi"}]}],
            }],
        })
    }

    #[test]
    fn quotas_find_their_place_in_kueues_structure() {
        // An existing flavor and resource.
        let mut s = queue();
        set_quota(&mut s, "on-demand", "cpu", q("10"));
        assert_eq!(nominal_quota(&s, "on-demand", "cpu"), q("10"));
        assert_eq!(nominal_quota(&s, "on-demand", "memory"), q("8Gi"));
        assert_eq!(s["cohort"], "all");
        // A new flavor in the group that covers the resource: with every covered resource.
        set_quota(&mut s, "spot", "cpu", q("4"));
        let g = &s["resourceGroups"][0];
        assert_eq!(g["flavors"][1]["name"], "spot");
        assert_eq!(
            g["flavors"][1]["resources"][0],
            json!({"name": "cpu", "nominalQuota": "4"})
        );
        assert_eq!(
            g["flavors"][1]["resources"][1],
            json!({"name": "memory", "nominalQuota": "0"})
        );
        // A new resource of a flavor the group has: covered, in each of its flavors.
        set_quota(&mut s, "spot", "gpu", q("2"));
        let g = &s["resourceGroups"][0];
        assert_eq!(g["coveredResources"], json!(["cpu", "memory", "gpu"]));
        assert_eq!(nominal_quota(&s, "on-demand", "gpu"), q("0"));
        assert_eq!(nominal_quota(&s, "spot", "gpu"), q("2"));
        assert!(g["flavors"][0]["resources"].as_array().unwrap().len() == 3);
        // Neither: a group of its own.
        set_quota(&mut s, "tpu-flavor", "google.com/tpu", q("8"));
        assert_eq!(s["resourceGroups"].as_array().unwrap().len(), 2);
        assert_eq!(nominal_quota(&s, "tpu-flavor", "google.com/tpu"), q("8"));
        // An empty queue.
        let mut e = json!({});
        set_quota(&mut e, "f", "cpu", q("1"));
        assert_eq!(nominal_quota(&e, "f", "cpu"), q("1"));
    }

    #[test]
    fn a_lowered_quota_never_goes_below_what_is_admitted() {
        let key = |f: &str, r: &str| (f.to_string(), r.to_string());
        let usage = |cpu: &str| json!({"flavorsUsage": [{"name": "on-demand", "resources": [{"name": "cpu", "total": cpu, "borrowed": "0"}]}]});
        // (current quota, admitted, wanted) -> (quota, held for)
        let cases = [
            ("2", "0", Some("10"), "10", None),
            ("10", "0", Some("6"), "6", None),
            ("10", "8", Some("6"), "8", Some("6")),
            ("10", "12", Some("6"), "10", Some("6")),
            ("10", "3", None, "3", Some("0")),
            ("10", "0", None, "0", None),
            ("10", "4", Some("6"), "6", None),
        ];
        for (current, in_use, wanted, want, held) in cases {
            let mut s = queue();
            set_quota(&mut s, "on-demand", "cpu", q(current));
            let w: BTreeMap<QuotaKey, Quantity> = wanted
                .map(|x| (key("on-demand", "cpu"), q(x)))
                .into_iter()
                .collect();
            let managed = BTreeSet::from([key("on-demand", "cpu")]);
            let (changes, keep) = reconcile_queue(&mut s, Some(&usage(in_use)), &w, &managed);
            assert_eq!(
                nominal_quota(&s, "on-demand", "cpu"),
                q(want),
                "{current} {in_use} {wanted:?}"
            );
            assert_eq!(
                changes.first().and_then(|c| c.held_for),
                held.map(q),
                "{current} {in_use} {wanted:?}"
            );
            assert_eq!(
                keep.contains(&key("on-demand", "cpu")),
                wanted.is_some() || held.is_some()
            );
            // Memory is not Orrery's to touch.
            assert_eq!(nominal_quota(&s, "on-demand", "memory"), q("8Gi"));
        }
        // Nothing changes where nothing should: no change is reported.
        let mut s = queue();
        let w = BTreeMap::from([(key("on-demand", "cpu"), q("2"))]);
        let (changes, _) = reconcile_queue(&mut s, None, &w, &BTreeSet::new());
        assert!(changes.is_empty());
        assert_eq!(s, queue());
    }

    #[test]
    fn managed_quotas_round_trip_through_the_annotation() {
        let m = BTreeSet::from([
            ("on-demand".to_string(), "cpu".to_string()),
            ("spot".to_string(), "nvidia.com/gpu".to_string()),
        ]);
        let ann = BTreeMap::from([(ANNOTATION_MANAGED.to_string(), managed_value(&m))]);
        assert_eq!(managed_of(&ann), m);
        assert!(managed_of(&BTreeMap::new()).is_empty());
    }

    #[test]
    fn metrics_sum_schedulable_nodes() {
        let m: MetricsStatus = serde_json::from_value(json!({"nodes": [
            {"name": "n1", "allocatableResources": {"cpu": "8", "memory": "32Gi"}},
            {"name": "n2", "allocatableResources": {"cpu": "8", "memory": "32Gi"}},
            {"name": "n3", "allocatableResources": {"cpu": "8"}, "unschedulable": true},
        ]}))
        .unwrap();
        assert_eq!(m.allocatable(), list(&[("cpu", "16"), ("memory", "64Gi")]));
        assert_eq!(
            nominal_of(&list(&[
                ("cpu", "16"),
                ("pods", "110"),
                ("gpu", "0"),
                ("memory", "1Gi")
            ])),
            list(&[("cpu", "16"), ("memory", "1Gi")])
        );
    }
}
