//! Orrery's scheduling engine: pure and deterministic, no I/O.
//!
//! Input: a snapshot of the member clusters ([`ClusterSnapshot`]) and a task ([`Task`]: what
//! one replica needs, how many, the placement). Output: a [`Decision`]: replicas per cluster,
//! and for every cluster why it was filtered out or chosen.
//!
//! The pipeline, in the order of the draft (7.3):
//! 1. filter: readiness, API enablement, cluster affinity (names, labels, provider/region/zone,
//!    exclude; `clusterAffinities` terms tried in order), the draft's `targetClusters`,
//!    taint toleration, evictions;
//! 2. select: spread constraints (min/max groups by cluster, region, zone, provider or label);
//! 3. divide: Duplicated, Divided by static weights, by available replicas (Karmada's
//!    `dynamicWeight`), Aggregated, or equal shares; rounding by largest remainder with ties
//!    broken by weight and then name, so the same input always gives the same output.
//!
//! Every cluster is visited once per step.

use std::collections::{BTreeMap, HashSet};

use orrery_api::binding::{ClusterDecision, TargetCluster};
use orrery_api::cluster::{ResourceList, Taint};
use orrery_api::labels::Selector;
use orrery_api::overrides::ClusterView;
use orrery_api::policy::{AGGREGATED, AVAILABLE_REPLICAS, ClusterAffinity, Placement, Target};

/// What the scheduler knows about one member cluster.
#[derive(Clone, Debug, Default)]
pub struct ClusterSnapshot {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub provider: String,
    pub region: String,
    pub zones: Vec<String>,
    pub properties: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    pub ready: bool,
    /// `group/version` + kind pairs the member serves; `None` when it has not said.
    pub api_kinds: Option<HashSet<(String, String)>>,
    /// Capacity and what is taken (placed, pending and assumed); empty when unknown.
    pub allocatable: ResourceList,
    pub allocated: ResourceList,
}

impl ClusterSnapshot {
    pub fn view(&self) -> ClusterView<'_> {
        ClusterView {
            name: &self.name,
            labels: &self.labels,
            provider: &self.provider,
            region: &self.region,
            zones: &self.zones,
            properties: &self.properties,
        }
    }

    /// How many more replicas of `request` fit, by the cluster's totals; `None` when the
    /// cluster reports no capacity or the replica asks for nothing.
    pub fn available_replicas(&self, request: &ResourceList) -> Option<i64> {
        if self.allocatable.is_empty() {
            return None;
        }
        let mut fit: Option<i64> = None;
        for (k, need) in request {
            if need.nanos() <= 0 {
                continue;
            }
            let have = self.allocatable.get(k).map(|q| q.nanos()).unwrap_or(0);
            let used = self.allocated.get(k).map(|q| q.nanos()).unwrap_or(0);
            let n = ((have - used).max(0) / need.nanos()) as i64;
            fit = Some(fit.map_or(n, |f| f.min(n)));
        }
        fit
    }
}

/// What to schedule.
#[derive(Clone, Debug)]
pub struct Task<'a> {
    pub api_version: &'a str,
    pub kind: &'a str,
    /// Replicas to place; for kinds without replicas, 0 (placed whole in each cluster).
    pub replicas: i64,
    /// Whether the kind's replicas can be divided among clusters.
    pub divisible: bool,
    pub request: &'a ResourceList,
    pub placement: &'a Placement,
    pub targets: &'a [Target],
    /// The current assignment (clusters keep replicas through NoSchedule taints).
    pub previous: &'a [TargetCluster],
    /// Clusters the workload was moved away from.
    pub evicted: &'a [String],
}

/// The outcome.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decision {
    pub clusters: Vec<TargetCluster>,
    /// The `clusterAffinities` term used, if the placement has terms.
    pub affinity_name: String,
    /// Every cluster, with its replicas or the reason it got none.
    pub reasons: Vec<ClusterDecision>,
    /// Why nothing could be placed.
    pub error: Option<String>,
}

fn taint_blocks(t: &Taint, placement: &Placement, already_there: bool) -> bool {
    let effect = t.effect.as_str();
    if effect == "PreferNoSchedule" {
        return false;
    }
    // NoSchedule keeps what is already there out of the new decision's way.
    if effect == "NoSchedule" && already_there {
        return false;
    }
    !placement
        .cluster_tolerations
        .iter()
        .any(|tol| tol.tolerates(&t.key, &t.value, effect))
}

fn targets_match(targets: &[Target], c: &ClusterSnapshot) -> bool {
    targets.is_empty()
        || targets.iter().any(|t| {
            t.names.contains(&c.name)
                || t.labels
                    .iter()
                    .any(|l| Selector::parse(l).is_ok_and(|s| s.matches(&c.labels)))
        })
}

/// Why a cluster cannot take the task under `affinity`, or `None` if it can.
fn filter(
    c: &ClusterSnapshot,
    task: &Task<'_>,
    affinity: Option<&ClusterAffinity>,
) -> Option<String> {
    let there = task.previous.iter().any(|p| p.name == c.name);
    // A cluster that stops being Ready takes no new replicas, but keeps what it runs until
    // its taints say otherwise (NoExecute after the eviction timeout), as in Kubernetes.
    if !c.ready && !there {
        return Some("the cluster is not ready".into());
    }
    if task.evicted.contains(&c.name) {
        return Some("the workload was evicted from this cluster".into());
    }
    if let Some(kinds) = &c.api_kinds
        && !kinds.contains(&(task.api_version.to_string(), task.kind.to_string()))
    {
        return Some(format!(
            "the cluster does not serve {} {}",
            task.api_version, task.kind
        ));
    }
    if let Some(a) = affinity
        && !a.matches(&c.view())
    {
        return Some("cluster affinity does not match".into());
    }
    if !targets_match(task.targets, c) {
        return Some("not among the policy's targetClusters".into());
    }
    if let Some(t) = c
        .taints
        .iter()
        .find(|t| taint_blocks(t, task.placement, there))
    {
        return Some(format!(
            "taint {}:{} is not tolerated",
            t.key,
            t.effect.as_str()
        ));
    }
    None
}

/// The group of a cluster under a spread key.
fn group_of(c: &ClusterSnapshot, field: &str, label: &str) -> String {
    if !label.is_empty() {
        return c.labels.get(label).cloned().unwrap_or_default();
    }
    match field {
        "region" => c.region.clone(),
        "zone" => c.zones.first().cloned().unwrap_or_default(),
        "provider" => c.provider.clone(),
        _ => c.name.clone(),
    }
}

/// Applies spread constraints to the feasible clusters (best first); returns the kept ones or
/// why the minimum cannot be met.
fn spread<'a>(
    feasible: Vec<&'a ClusterSnapshot>,
    placement: &Placement,
    reasons: &mut BTreeMap<String, String>,
) -> Result<Vec<&'a ClusterSnapshot>, String> {
    let mut kept = feasible;
    for s in &placement.spread_constraints {
        let mut order: Vec<String> = Vec::new();
        let mut groups: BTreeMap<String, Vec<&ClusterSnapshot>> = BTreeMap::new();
        for c in &kept {
            let g = group_of(c, &s.spread_by_field, &s.spread_by_label);
            if g.is_empty() {
                reasons.insert(c.name.clone(), "has no value for the spread key".into());
                continue;
            }
            if !groups.contains_key(&g) {
                order.push(g.clone());
            }
            groups.entry(g).or_default().push(c);
        }
        let key = if s.spread_by_label.is_empty() {
            s.spread_by_field.as_str()
        } else {
            s.spread_by_label.as_str()
        };
        if (groups.len() as i64) < s.min_groups {
            return Err(format!(
                "spread by {key} needs at least {} groups, only {} are feasible",
                s.min_groups,
                groups.len()
            ));
        }
        let max = if s.max_groups > 0 {
            s.max_groups as usize
        } else {
            usize::MAX
        };
        let mut next = Vec::new();
        for (i, g) in order.iter().enumerate() {
            for c in &groups[g] {
                if i < max {
                    next.push(*c);
                } else {
                    reasons.insert(
                        c.name.clone(),
                        format!("spread by {key} allows at most {max} groups"),
                    );
                }
            }
        }
        kept = next;
    }
    Ok(kept)
}

/// Divides `total` in proportion to `weights` by largest remainder; ties go to the larger
/// weight, then to the earlier entry.
pub fn divide(total: i64, weights: &[i64]) -> Vec<i64> {
    let sum: i128 = weights.iter().map(|w| (*w).max(0) as i128).sum();
    if sum == 0 || total <= 0 {
        return vec![0; weights.len()];
    }
    let mut out: Vec<i64> = Vec::with_capacity(weights.len());
    let mut rems: Vec<(i128, i64, usize)> = Vec::with_capacity(weights.len());
    let mut given = 0i64;
    for (i, w) in weights.iter().enumerate() {
        let exact = total as i128 * (*w).max(0) as i128;
        let q = (exact / sum) as i64;
        out.push(q);
        given += q;
        rems.push((exact % sum, *w, i));
    }
    rems.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
    for (_, _, i) in rems.into_iter().take((total - given) as usize) {
        out[i] += 1;
    }
    out
}

fn static_weight(c: &ClusterSnapshot, placement: &Placement) -> Option<i64> {
    let w = placement
        .replica_scheduling
        .as_ref()?
        .weight_preference
        .as_ref()?;
    if w.static_weight_list.is_empty() {
        return None;
    }
    Some(
        w.static_weight_list
            .iter()
            .find(|s| s.target_cluster.matches(&c.view()))
            .map(|s| s.weight)
            .unwrap_or(0),
    )
}

/// Schedules one task.
pub fn schedule(clusters: &[ClusterSnapshot], task: &Task<'_>) -> Decision {
    let terms: Vec<(String, Option<ClusterAffinity>)> =
        if task.placement.cluster_affinities.is_empty() {
            vec![(String::new(), task.placement.cluster_affinity.clone())]
        } else {
            task.placement
                .cluster_affinities
                .iter()
                .map(|t| (t.affinity_name.clone(), Some(t.affinity())))
                .collect()
        };
    let mut last = Decision::default();
    for (name, affinity) in &terms {
        let d = schedule_term(clusters, task, affinity.as_ref());
        if d.error.is_none() {
            return Decision {
                affinity_name: name.clone(),
                ..d
            };
        }
        last = Decision {
            affinity_name: name.clone(),
            ..d
        };
    }
    last
}

fn schedule_term(
    clusters: &[ClusterSnapshot],
    task: &Task<'_>,
    affinity: Option<&ClusterAffinity>,
) -> Decision {
    let mut reasons: BTreeMap<String, String> = BTreeMap::new();
    let mut feasible: Vec<&ClusterSnapshot> = Vec::new();
    for c in clusters {
        match filter(c, task, affinity) {
            Some(why) => {
                reasons.insert(c.name.clone(), why);
            }
            None => feasible.push(c),
        }
    }
    // Best first: most room for the task, then name.
    let avail: BTreeMap<&str, Option<i64>> = feasible
        .iter()
        .map(|c| (c.name.as_str(), c.available_replicas(task.request)))
        .collect();
    feasible.sort_by(|a, b| {
        let (x, y) = (avail[a.name.as_str()], avail[b.name.as_str()]);
        let rank = |v: Option<i64>| v.unwrap_or(i64::MAX);
        rank(y).cmp(&rank(x)).then(a.name.cmp(&b.name))
    });
    let finish = |reasons: BTreeMap<String, String>,
                  clusters_out: Vec<TargetCluster>,
                  error: Option<String>| {
        let mut rs: Vec<ClusterDecision> = reasons
            .into_iter()
            .map(|(name, reason)| ClusterDecision {
                name,
                replicas: None,
                reason,
            })
            .collect();
        for t in &clusters_out {
            rs.push(ClusterDecision {
                name: t.name.clone(),
                replicas: Some(t.replicas),
                reason: "selected".into(),
            });
        }
        rs.sort_by(|a, b| a.name.cmp(&b.name));
        let mut clusters_out = clusters_out;
        clusters_out.sort_by(|a, b| a.name.cmp(&b.name));
        Decision {
            clusters: clusters_out,
            affinity_name: String::new(),
            reasons: rs,
            error,
        }
    };
    let kept = match spread(feasible, task.placement, &mut reasons) {
        Ok(k) => k,
        Err(e) => return finish(reasons, vec![], Some(e)),
    };
    if kept.is_empty() {
        let e = if clusters.is_empty() {
            "no clusters are registered".to_string()
        } else {
            format!("0/{} clusters are available", clusters.len())
        };
        return finish(reasons, vec![], Some(e));
    }
    let rs = task.placement.replica_scheduling.as_ref();
    if !task.divisible || !task.placement.divided() {
        let out = kept
            .iter()
            .map(|c| TargetCluster {
                name: c.name.clone(),
                replicas: task.replicas,
            })
            .collect();
        return finish(reasons, out, None);
    }
    let preference = rs
        .map(|r| r.replica_division_preference.as_str())
        .unwrap_or("");
    let dynamic = rs
        .and_then(|r| r.weight_preference.as_ref())
        .is_some_and(|w| w.dynamic_weight == AVAILABLE_REPLICAS);
    let shares: Vec<i64> = if preference == AGGREGATED {
        // Fewest clusters: fill the roomiest first; what fits nowhere goes to the roomiest
        // (`kept` is not empty: checked above).
        let mut left = task.replicas;
        let mut shares: Vec<i64> = kept
            .iter()
            .map(|c| {
                let n = left.min(avail[c.name.as_str()].unwrap_or(i64::MAX));
                left -= n;
                n
            })
            .collect();
        shares[0] += left;
        shares
    } else if dynamic {
        let w: Vec<i64> = kept
            .iter()
            .map(|c| avail[c.name.as_str()].unwrap_or(1_000_000))
            .collect();
        if w.iter().all(|x| *x == 0) {
            return finish(
                reasons,
                vec![],
                Some("no cluster has room for a single replica".into()),
            );
        }
        divide(task.replicas, &w)
    } else {
        let w: Vec<i64> = kept
            .iter()
            .map(|c| static_weight(c, task.placement).unwrap_or(1))
            .collect();
        if w.iter().all(|x| *x == 0) {
            for c in &kept {
                reasons.insert(c.name.clone(), "its static weight is 0".into());
            }
            return finish(
                reasons,
                vec![],
                Some("every feasible cluster has a static weight of 0".into()),
            );
        }
        divide(task.replicas, &w)
    };
    let mut out = Vec::new();
    for (c, n) in kept.iter().zip(shares) {
        if n > 0 {
            out.push(TargetCluster {
                name: c.name.clone(),
                replicas: n,
            });
        } else {
            reasons.insert(
                c.name.clone(),
                "feasible, but its share rounds to 0 replicas".into(),
            );
        }
    }
    if out.is_empty() && task.replicas > 0 {
        return finish(reasons, out, Some("no cluster received a replica".into()));
    }
    finish(reasons, out, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use orrery_api::Quantity;
    use orrery_api::cluster::TaintEffect;
    use serde_json::json;

    fn cluster(name: &str, region: &str, cpu: i64, used: i64) -> ClusterSnapshot {
        let mut c = ClusterSnapshot {
            name: name.into(),
            region: region.into(),
            provider: "aws".into(),
            ready: true,
            ..Default::default()
        };
        c.labels.insert(
            "env".into(),
            if name.ends_with('3') {
                "edge".into()
            } else {
                "prod".into()
            },
        );
        c.allocatable.insert(
            "cpu".into(),
            Quantity::from_int(cpu, orrery_api::Format::DecimalSI),
        );
        c.allocated.insert(
            "cpu".into(),
            Quantity::from_int(used, orrery_api::Format::DecimalSI),
        );
        c
    }

    fn fleet() -> Vec<ClusterSnapshot> {
        vec![
            cluster("m1", "us", 10, 0),
            cluster("m2", "eu", 20, 0),
            cluster("m3", "asia", 40, 10),
        ]
    }

    fn placement(v: serde_json::Value) -> Placement {
        serde_json::from_value(v).unwrap()
    }

    fn run(clusters: &[ClusterSnapshot], p: &Placement, replicas: i64) -> Decision {
        let mut req = ResourceList::new();
        req.insert(
            "cpu".into(),
            Quantity::from_int(1, orrery_api::Format::DecimalSI),
        );
        schedule(
            clusters,
            &Task {
                api_version: "apps/v1",
                kind: "Deployment",
                replicas,
                divisible: true,
                request: &req,
                placement: p,
                targets: &[],
                previous: &[],
                evicted: &[],
            },
        )
    }

    fn shares(d: &Decision) -> Vec<(String, i64)> {
        d.clusters
            .iter()
            .map(|t| (t.name.clone(), t.replicas))
            .collect()
    }

    fn s(v: &[(&str, i64)]) -> Vec<(String, i64)> {
        v.iter().map(|(n, r)| (n.to_string(), *r)).collect()
    }

    #[test]
    fn largest_remainder() {
        let cases: &[(i64, &[i64], &[i64])] = &[
            (1, &[1, 1, 1], &[1, 0, 0]),
            (2, &[1, 1, 1], &[1, 1, 0]),
            (10, &[1, 2, 2], &[2, 4, 4]),
            (5, &[0, 1, 0], &[0, 5, 0]),
            (4, &[0, 0], &[0, 0]),
            (7, &[3, 3, 1], &[3, 3, 1]),
            // 3/7, 15/7, 3/7: the tied remainders go to the earlier entry.
            (3, &[1, 5, 1], &[1, 2, 0]),
            (0, &[1, 1], &[0, 0]),
            (1, &[1, 2], &[0, 1]),
        ];
        for (total, w, want) in cases {
            let got = divide(*total, w);
            assert_eq!(got, want.to_vec(), "{total} over {w:?}");
            assert_eq!(
                got.iter().sum::<i64>(),
                if w.iter().sum::<i64>() > 0 { *total } else { 0 }
            );
        }
    }

    #[test]
    fn division_modes() {
        let c = fleet();
        // No replicaScheduling: Duplicated.
        assert_eq!(
            shares(&run(&c, &placement(json!({})), 3)),
            s(&[("m1", 3), ("m2", 3), ("m3", 3)])
        );
        // Divided with no weights: equal shares, the remainder to the roomiest.
        let d = run(
            &c,
            &placement(json!({"replicaScheduling": {"replicaSchedulingType": "Divided"}})),
            4,
        );
        assert_eq!(shares(&d), s(&[("m1", 1), ("m2", 1), ("m3", 2)]));
        // Static weights (Karmada's documentation example).
        let p = placement(
            json!({"replicaScheduling": {"replicaSchedulingType": "Divided", "replicaDivisionPreference": "Weighted",
            "weightPreference": {"staticWeightList": [
                {"targetCluster": {"clusterNames": ["m1"]}, "weight": 1},
                {"targetCluster": {"clusterNames": ["m2"]}, "weight": 2}]}}}),
        );
        assert_eq!(shares(&run(&c, &p, 6)), s(&[("m1", 2), ("m2", 4)]));
        let d = run(&c, &p, 6);
        assert!(
            d.reasons
                .iter()
                .any(|r| r.name == "m3" && r.reason.contains("share rounds to 0")),
            "{:?}",
            d.reasons
        );
        // Dynamic weight by available replicas: 10, 20, 30 free.
        let p = placement(
            json!({"replicaScheduling": {"replicaSchedulingType": "Divided", "replicaDivisionPreference": "Weighted",
            "weightPreference": {"dynamicWeight": "AvailableReplicas"}}}),
        );
        assert_eq!(
            shares(&run(&c, &p, 12)),
            s(&[("m1", 2), ("m2", 4), ("m3", 6)])
        );
        // Aggregated: as few clusters as possible.
        let p = placement(
            json!({"replicaScheduling": {"replicaSchedulingType": "Divided", "replicaDivisionPreference": "Aggregated"}}),
        );
        assert_eq!(shares(&run(&c, &p, 25)), s(&[("m3", 25)]));
        assert_eq!(shares(&run(&c, &p, 35)), s(&[("m2", 5), ("m3", 30)]));
        // Zero weights everywhere: a clear error.
        let p = placement(
            json!({"replicaScheduling": {"replicaSchedulingType": "Divided",
            "weightPreference": {"staticWeightList": [{"targetCluster": {"clusterNames": ["m1"]}, "weight": 0}]}}}),
        );
        let d = run(&c, &p, 3);
        assert!(d.clusters.is_empty() && d.error.unwrap().contains("static weight of 0"));
    }

    #[test]
    fn filters_explain_themselves() {
        let mut c = fleet();
        c[0].ready = false;
        c[1].taints.push(Taint::new(
            "maintenance",
            TaintEffect::NoSchedule,
            orrery_api::Time::now(),
        ));
        let d = run(&c, &placement(json!({})), 1);
        assert_eq!(shares(&d), s(&[("m3", 1)]));
        let why: BTreeMap<_, _> = d
            .reasons
            .iter()
            .map(|r| (r.name.as_str(), r.reason.as_str()))
            .collect();
        assert_eq!(why["m1"], "the cluster is not ready");
        assert_eq!(why["m2"], "taint maintenance:NoSchedule is not tolerated");
        assert_eq!(why["m3"], "selected");
        // A cluster that stops being Ready keeps what it already runs (until a NoExecute taint).
        let req = ResourceList::new();
        let p0 = Placement::default();
        let prev = [TargetCluster {
            name: "m1".into(),
            replicas: 1,
        }];
        let task = |prev: &'static [TargetCluster]| Task {
            api_version: "apps/v1",
            kind: "Deployment",
            replicas: 1,
            divisible: true,
            request: &req,
            placement: &p0,
            targets: &[],
            previous: prev,
            evicted: &[],
        };
        let leaked: &'static [TargetCluster] = Box::leak(Box::new(prev));
        assert!(shares(&schedule(&c, &task(leaked))).contains(&("m1".to_string(), 1)));
        let mut gone = c.clone();
        gone[0].taints.push(Taint::new(
            "cluster.multicluster.io/unreachable",
            TaintEffect::NoExecute,
            orrery_api::Time::now(),
        ));
        assert!(
            !shares(&schedule(&gone, &task(leaked)))
                .iter()
                .any(|(n, _)| n == "m1")
        );
        // Tolerated, it is chosen.
        let p = placement(
            json!({"clusterTolerations": [{"key": "maintenance", "operator": "Exists"}]}),
        );
        assert_eq!(shares(&run(&c, &p, 1)).len(), 2);
        // Affinity by label, by field, exclusion.
        let c = fleet();
        let p = placement(
            json!({"clusterAffinity": {"labelSelector": {"matchLabels": {"env": "prod"}}, "exclude": ["m1"]}}),
        );
        assert_eq!(shares(&run(&c, &p, 1)), s(&[("m2", 1)]));
        let p = placement(
            json!({"clusterAffinity": {"fieldSelector": {"matchExpressions": [{"key": "region", "operator": "In", "values": ["asia", "us"]}]}}}),
        );
        assert_eq!(shares(&run(&c, &p, 1)), s(&[("m1", 1), ("m3", 1)]));
        // Nothing fits: the error says how many were available.
        let p = placement(json!({"clusterAffinity": {"clusterNames": ["nowhere"]}}));
        let d = run(&c, &p, 1);
        assert_eq!(d.error.as_deref(), Some("0/3 clusters are available"));
        assert_eq!(d.reasons.len(), 3);
        // clusterAffinities: the first term that works wins.
        let p = placement(json!({"clusterAffinities": [
            {"affinityName": "primary", "clusterNames": ["nowhere"]},
            {"affinityName": "backup", "clusterNames": ["m2"]}]}));
        let d = run(&c, &p, 1);
        assert_eq!(
            (d.affinity_name.as_str(), shares(&d)),
            ("backup", s(&[("m2", 1)]))
        );
    }

    #[test]
    fn spread_constraints() {
        let mut c = fleet();
        c.push(cluster("m4", "us", 50, 0));
        let p =
            placement(json!({"spreadConstraints": [{"spreadByField": "cluster", "maxGroups": 2}]}));
        // The two roomiest clusters.
        assert_eq!(shares(&run(&c, &p, 1)), s(&[("m3", 1), ("m4", 1)]));
        let p =
            placement(json!({"spreadConstraints": [{"spreadByField": "region", "maxGroups": 1}]}));
        // The roomiest region (us, through m4) keeps both of its clusters.
        assert_eq!(shares(&run(&c, &p, 1)), s(&[("m1", 1), ("m4", 1)]));
        let p =
            placement(json!({"spreadConstraints": [{"spreadByField": "region", "minGroups": 4}]}));
        assert!(
            run(&c, &p, 1)
                .error
                .unwrap()
                .contains("at least 4 groups, only 3")
        );
    }

    #[test]
    fn targets_and_api_enablement() {
        let mut c = fleet();
        c[1].api_kinds = Some([("apps/v1".to_string(), "StatefulSet".to_string())].into());
        let targets = vec![
            Target {
                names: vec!["m1".into()],
                labels: vec![],
            },
            Target {
                names: vec![],
                labels: vec!["env=edge".into()],
            },
        ];
        let req = ResourceList::new();
        let p = Placement::default();
        let d = schedule(
            &c,
            &Task {
                api_version: "apps/v1",
                kind: "Deployment",
                replicas: 2,
                divisible: true,
                request: &req,
                placement: &p,
                targets: &targets,
                previous: &[],
                evicted: &[],
            },
        );
        assert_eq!(shares(&d), s(&[("m1", 2), ("m3", 2)]));
        assert!(
            d.reasons
                .iter()
                .any(|r| r.name == "m2" && r.reason.contains("does not serve apps/v1 Deployment"))
        );
    }
}
