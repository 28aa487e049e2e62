use super::*;
use orrery_api::Quantity;
use orrery_api::cluster::{Taint, TaintEffect};
use orrery_api::{Format, Time};
use serde_json::json;

fn cpu(n: i64) -> Quantity {
    Quantity::from_int(n, Format::DecimalSI)
}

/// A cluster with `cores` cpu, `used` of them requested.
fn cluster(name: &str, region: &str, cores: i64, used: i64) -> ClusterSnapshot {
    let mut c = ClusterSnapshot {
        name: name.into(),
        region: region.into(),
        provider: "aws".into(),
        ready: true,
        ..Default::default()
    };
    c.labels.insert(
        "env".into(),
        if name.ends_with('3') { "edge" } else { "prod" }.into(),
    );
    c.allocatable.insert("cpu".into(), cpu(cores));
    c.allocated.insert("cpu".into(), cpu(used));
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

fn one_cpu() -> ResourceList {
    [("cpu".to_string(), cpu(1))].into()
}

struct T {
    replicas: i64,
    request: ResourceList,
    placement: Placement,
    targets: Vec<Target>,
    previous: Vec<TargetCluster>,
    shed: Vec<String>,
    mode: Mode,
    priority: i32,
    now: i64,
    storage_classes: Vec<String>,
    within: Option<Vec<String>>,
    avoid: Option<Vec<String>>,
    near: Vec<String>,
    data: Option<data::DataNeeds>,
    components: Vec<components::ComponentNeed>,
    quota_room: Vec<components::QuotaRoom>,
}

impl T {
    fn new(p: serde_json::Value, replicas: i64) -> T {
        T {
            replicas,
            request: one_cpu(),
            placement: placement(p),
            targets: vec![],
            previous: vec![],
            shed: vec![],
            mode: Mode::Steady,
            priority: 0,
            now: Time::now().unix_seconds(),
            storage_classes: vec![],
            within: None,
            avoid: None,
            near: vec![],
            data: None,
            components: vec![],
            quota_room: vec![],
        }
    }
    fn task(&self) -> Task<'_> {
        Task {
            api_version: "apps/v1",
            kind: "Deployment",
            replicas: self.replicas,
            divisible: true,
            request: &self.request,
            placement: &self.placement,
            targets: &self.targets,
            priority: self.priority,
            previous: &self.previous,
            evicted: &[],
            shed: &self.shed,
            shed_ahead: &[],
            mode: self.mode,
            now: self.now,
            seed: 0,
            relations: crate::Relations {
                storage_classes: &self.storage_classes,
                within: self
                    .within
                    .as_deref()
                    .map(|w| (w, "the leader db runs in a")),
                avoid: self
                    .avoid
                    .as_deref()
                    .map(|a| (a, "its anti-affinity group runs there")),
                near: &self.near,
                data: self.data.as_ref(),
            },
            components: &self.components,
            quota_room: &self.quota_room,
        }
    }
    fn run(&self, clusters: &[ClusterSnapshot]) -> Decision {
        schedule(
            &Fleet::new(clusters.to_vec()),
            &self.task(),
            &Config::default(),
        )
    }
    fn run_with(&self, clusters: &[ClusterSnapshot], config: &Config) -> Decision {
        schedule(&Fleet::new(clusters.to_vec()), &self.task(), config)
    }
    fn explain(&self, clusters: &[ClusterSnapshot]) -> BTreeMap<String, ClusterDecision> {
        let f = Fleet::new(clusters.to_vec());
        let c = Config::default();
        let d = schedule(&f, &self.task(), &c);
        d.explain(&f, &self.task(), &c)
            .into_iter()
            .map(|x| (x.name.clone(), x))
            .collect()
    }
}

fn run(clusters: &[ClusterSnapshot], p: serde_json::Value, replicas: i64) -> Decision {
    T::new(p, replicas).run(clusters)
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

fn prev(v: &[(&str, i64)]) -> Vec<TargetCluster> {
    v.iter()
        .map(|(n, r)| TargetCluster {
            name: n.to_string(),
            replicas: *r,
        })
        .collect()
}

const DIVIDED: &str = "Divided";

fn divided() -> serde_json::Value {
    json!({"replicaScheduling": {"replicaSchedulingType": DIVIDED}})
}

#[test]
fn karmada_division_modes() {
    let c = fleet();
    // No replicaScheduling: Duplicated.
    assert_eq!(
        shares(&run(&c, json!({}), 3)),
        s(&[("m1", 3), ("m2", 3), ("m3", 3)])
    );
    // Static weights (Karmada's documentation example); m3 has no weight.
    let p = json!({"replicaScheduling": {"replicaSchedulingType": "Divided", "replicaDivisionPreference": "Weighted",
        "weightPreference": {"staticWeightList": [
            {"targetCluster": {"clusterNames": ["m1"]}, "weight": 1},
            {"targetCluster": {"clusterNames": ["m2"]}, "weight": 2}]}}});
    let d = run(&c, p.clone(), 6);
    assert_eq!(
        (shares(&d), d.strategy),
        (s(&[("m1", 2), ("m2", 4)]), "StaticWeight")
    );
    let why = T::new(p, 6).explain(&c);
    assert!(why["m3"].reason.contains("share rounds to 0"), "{why:?}");
    // Dynamic weight by available replicas (requests only): 10, 20, 30 free.
    let p = json!({"replicaScheduling": {"replicaSchedulingType": "Divided", "replicaDivisionPreference": "Weighted",
        "weightPreference": {"dynamicWeight": "AvailableReplicas"}}});
    assert_eq!(
        shares(&run(&c, p, 12)),
        s(&[("m1", 2), ("m2", 4), ("m3", 6)])
    );
    // Aggregated: as few clusters as possible.
    let p = json!({"replicaScheduling": {"replicaSchedulingType": "Divided", "replicaDivisionPreference": "Aggregated"}});
    assert_eq!(shares(&run(&c, p.clone(), 25)), s(&[("m3", 25)]));
    assert_eq!(shares(&run(&c, p, 35)), s(&[("m2", 5), ("m3", 30)]));
    // Zero weights everywhere: a clear error.
    let p = json!({"replicaScheduling": {"replicaSchedulingType": "Divided",
        "weightPreference": {"staticWeightList": [{"targetCluster": {"clusterNames": ["m1"]}, "weight": 0}]}}});
    let d = run(&c, p, 3);
    assert!(d.clusters.is_empty() && d.error.unwrap().contains("static weight of 0"));
}

/// Karmada's divisions keep Karmada's meaning (equal weights, weights, available replicas,
/// fewest clusters) and, without a limit of the placement's own, divide room or not; a
/// `waterLevelLimit` the user wrote holds every cluster at its room under it, gives what a
/// full cluster cannot take to the others by their weights, and leaves the rest unplaced.
#[test]
fn an_explicit_water_level_limit_holds_karmadas_divisions() {
    // Rooms under 0.8 with 30, 40 and 50 of 100 cores used: 50, 40, 30 one-core replicas.
    let c = loaded([30, 40, 50]);
    let with = |mut p: serde_json::Value, limit: Option<f64>| {
        if let Some(l) = limit {
            p["waterLevelLimit"] = json!(l);
        }
        p
    };
    let weighted = |weights: [i64; 3]| {
        json!({"replicaScheduling": {"replicaSchedulingType": "Divided", "replicaDivisionPreference": "Weighted",
            "weightPreference": {"staticWeightList": [
                {"targetCluster": {"clusterNames": ["a"]}, "weight": weights[0]},
                {"targetCluster": {"clusterNames": ["b"]}, "weight": weights[1]},
                {"targetCluster": {"clusterNames": ["c"]}, "weight": weights[2]}]}}})
    };
    // Equal weights (Karmada's Divided without a preference, as its policy is read).
    let equal = json!({"replicaScheduling": {"replicaSchedulingType": "Divided", "replicaDivisionPreference": "Weighted",
        "weightPreference": {"staticWeightList": [{"targetCluster": {}, "weight": 1}]}}});
    let d = run(&c, with(equal.clone(), None), 130);
    assert_eq!(shares(&d), s(&[("a", 44), ("b", 43), ("c", 43)]));
    assert_eq!((d.unplaced, d.error.is_none()), (0, true));
    let d = run(&c, with(equal.clone(), Some(0.8)), 120);
    assert_eq!(
        (shares(&d), d.strategy, d.unplaced),
        (s(&[("a", 50), ("b", 40), ("c", 30)]), "StaticWeight", 0)
    );
    let d = run(&c, with(equal, Some(0.8)), 130);
    assert_eq!(shares(&d), s(&[("a", 50), ("b", 40), ("c", 30)]));
    assert_eq!(d.unplaced, 10);
    let why = d.error.expect("a partial placement says so");
    assert!(
        why.contains("10 of 130 replicas fit in no cluster under the water level limit 0.80"),
        "{why}"
    );
    // Static weights: what c cannot take goes to a and b by their weights.
    assert_eq!(
        shares(&run(&c, with(weighted([1, 1, 2]), None), 100)),
        s(&[("a", 25), ("b", 25), ("c", 50)])
    );
    assert_eq!(
        shares(&run(&c, with(weighted([1, 1, 2]), Some(0.8)), 100)),
        s(&[("a", 35), ("b", 35), ("c", 30)])
    );
    // A weight of 0 takes nothing, not even what the others cannot.
    let d = run(&c, with(weighted([0, 1, 1]), Some(0.8)), 100);
    assert_eq!((shares(&d), d.unplaced), (s(&[("b", 40), ("c", 30)]), 30));
    // Available replicas (70, 60, 50 free).
    let avail = json!({"replicaScheduling": {"replicaSchedulingType": "Divided", "replicaDivisionPreference": "Weighted",
        "weightPreference": {"dynamicWeight": "AvailableReplicas"}}});
    assert_eq!(
        shares(&run(&c, with(avail.clone(), None), 115)),
        s(&[("a", 45), ("b", 38), ("c", 32)])
    );
    assert_eq!(
        shares(&run(&c, with(avail, Some(0.8)), 115)),
        s(&[("a", 46), ("b", 39), ("c", 30)])
    );
    // Aggregated: the roomiest first, held at its room; then the rest unplaced.
    let agg = json!({"replicaScheduling": {"replicaSchedulingType": "Divided", "replicaDivisionPreference": "Aggregated"}});
    assert_eq!(
        shares(&run(&c, with(agg.clone(), None), 60)),
        s(&[("a", 60)])
    );
    assert_eq!(
        shares(&run(&c, with(agg.clone(), Some(0.8)), 60)),
        s(&[("a", 50), ("b", 10)])
    );
    let d = run(&c, with(agg, Some(0.8)), 130);
    assert_eq!(
        (shares(&d), d.unplaced),
        (s(&[("a", 50), ("b", 40), ("c", 30)]), 10)
    );
    // A limit that holds nobody back changes nothing.
    let f = fleet();
    for p in [
        json!({"replicaScheduling": {"replicaSchedulingType": "Divided", "replicaDivisionPreference": "Weighted",
            "weightPreference": {"staticWeightList": [
                {"targetCluster": {"clusterNames": ["m1"]}, "weight": 1},
                {"targetCluster": {"clusterNames": ["m2"]}, "weight": 2}]}}}),
        json!({"replicaScheduling": {"replicaSchedulingType": "Divided", "replicaDivisionPreference": "Weighted",
            "weightPreference": {"dynamicWeight": "AvailableReplicas"}}}),
        json!({"replicaScheduling": {"replicaSchedulingType": "Divided", "replicaDivisionPreference": "Aggregated"}}),
    ] {
        assert_eq!(
            shares(&run(&f, with(p.clone(), Some(1.0)), 12)),
            shares(&run(&f, p, 12))
        );
    }
}

/// Three clusters of 100 cores with a given number of cores already used.
fn loaded(used: [i64; 3]) -> Vec<ClusterSnapshot> {
    vec![
        cluster("a", "us", 100, used[0]),
        cluster("b", "eu", 100, used[1]),
        cluster("c", "asia", 100, used[2]),
    ]
}

#[test]
fn water_level_division_by_fleet_level() {
    // Busy fleet (70%): water-filling evens the levels out: 10 replicas of 1 core onto
    // 60/70/80 used: 60->70 takes 10, b and c get none, levels end 70/70/80.
    let d = run(&loaded([60, 70, 80]), divided(), 10);
    assert_eq!(d.strategy, "WaterFilling");
    assert!((d.fleet_level - 0.7).abs() < 1e-9);
    assert_eq!(shares(&d), s(&[("a", 10)]));
    // 25 replicas: a to 70, then a and b in turn to 78 and 77; c (80) untouched.
    let d = run(&loaded([60, 70, 80]), divided(), 25);
    assert_eq!(shares(&d), s(&[("a", 18), ("b", 7)]));
    // Idle fleet (10%): aggregation fills the best cluster first.
    let d = run(&loaded([5, 10, 15]), divided(), 30);
    assert_eq!((d.strategy, shares(&d)), ("Aggregation", s(&[("a", 30)])));
    // ... up to the limit (85 of 100 with 5 used: 80 fit), then opens the next.
    let d = run(&loaded([5, 10, 15]), divided(), 100);
    assert_eq!(shares(&d), s(&[("a", 80), ("b", 20)]));
    // Aggregation still meets a spread minimum.
    let mut p = divided();
    p["spreadConstraints"] = json!([{"spreadByField": "region", "minGroups": 2}]);
    let d = run(&loaded([5, 10, 15]), p, 30);
    assert_eq!(shares(&d), s(&[("a", 29), ("b", 1)]));
    // In between (40%): score-weighted, more where the level is lower.
    let d = run(&loaded([20, 40, 60]), divided(), 30);
    assert_eq!(d.strategy, "ScoreWeighted");
    let got: BTreeMap<String, i64> = shares(&d).into_iter().collect();
    assert_eq!(got.values().sum::<i64>(), 30);
    assert!(
        got["a"] > got["b"] && got["b"] > got.get("c").copied().unwrap_or(0),
        "{got:?}"
    );
    // dynamicWeight: WaterLevel says the same explicitly.
    let p = json!({"replicaScheduling": {"replicaSchedulingType": "Divided",
        "weightPreference": {"dynamicWeight": "WaterLevel"}}});
    assert_eq!(shares(&run(&loaded([20, 40, 60]), p, 30)), shares(&d));
}

#[test]
fn no_cluster_goes_over_its_limit() {
    // 25+15+5 = 45 replicas fit under 0.85; 50 are asked for.
    let d = run(&loaded([60, 70, 80]), divided(), 50);
    assert_eq!(d.unplaced, 5);
    assert_eq!(shares(&d), s(&[("a", 25), ("b", 15), ("c", 5)]));
    assert!(
        d.error
            .unwrap()
            .contains("5 of 50 replicas fit in no cluster")
    );
    // A policy's own limit.
    let mut p = divided();
    p["waterLevelLimit"] = json!(0.7);
    let d = run(&loaded([60, 70, 80]), p, 50);
    assert_eq!(shares(&d), s(&[("a", 10)]));
    assert_eq!(d.unplaced, 40);
    let why = {
        let mut t = T::new(divided(), 1);
        t.placement.water_level_limit = Some(0.7);
        t.explain(&loaded([60, 70, 80]))
    };
    assert_eq!(why["c"].filter, "WaterLevel");
    assert_eq!(
        why["c"].reason,
        "its water level would reach 0.81, above the limit 0.70"
    );
}

#[test]
fn rounding_edge_cases() {
    // 1 replica over 3 identical empty clusters: exactly one gets it, always the same.
    let eq = loaded([0, 0, 0]);
    let d = run(&eq, divided(), 1);
    assert_eq!(shares(&d), s(&[("a", 1)]));
    assert_eq!(shares(&run(&eq, divided(), 1)), shares(&d));
    // Score-weighted with 1 replica over 3 (fleet at 40%): the best-scoring one.
    let d = run(&loaded([30, 40, 50]), divided(), 1);
    assert_eq!(shares(&d), s(&[("a", 1)]));
    // Everything filtered.
    let d = run(
        &eq,
        json!({"clusterAffinity": {"clusterNames": ["nowhere"]}}),
        1,
    );
    assert_eq!(d.error.as_deref(), Some("0/3 clusters are available"));
    assert_eq!(d.unplaced, 1);
    // No clusters at all.
    assert_eq!(
        run(&[], divided(), 1).error.as_deref(),
        Some("no clusters are registered")
    );
    // Zero replicas: placed nowhere, no error.
    let d = run(&eq, divided(), 0);
    assert!(d.clusters.is_empty() && d.error.is_none());
    // Invalid tasks are refused before anything is looked at.
    assert!(run(&eq, divided(), -1).error.unwrap().contains("negative"));
    // Clusters reporting no capacity at all: equal shares.
    let blank: Vec<ClusterSnapshot> = ["x", "y", "z"]
        .iter()
        .map(|n| ClusterSnapshot {
            name: n.to_string(),
            ready: true,
            ..Default::default()
        })
        .collect();
    assert_eq!(
        shares(&run(&blank, divided(), 4)),
        s(&[("x", 2), ("y", 1), ("z", 1)])
    );
}

#[test]
fn steady_mode_moves_only_the_difference() {
    let c = loaded([40, 40, 40]);
    let mut t = T::new(divided(), 12);
    t.previous = prev(&[("a", 2), ("b", 8)]);
    // Scale up by 2: a and b keep theirs, the 2 new go where levels are lowest (c).
    let d = t.run(&c);
    let got: BTreeMap<String, i64> = shares(&d).into_iter().collect();
    assert!(got["a"] >= 2 && got["b"] >= 8, "{got:?}");
    assert_eq!(got.values().sum::<i64>(), 12);
    // Scale down to 6 from a:2 b:8 c:2 — the fullest (b) gives back first.
    t.previous = prev(&[("a", 2), ("b", 8), ("c", 2)]);
    t.replicas = 6;
    let got: BTreeMap<String, i64> = shares(&t.run(&loaded([40, 70, 40]))).into_iter().collect();
    assert_eq!(got.values().sum::<i64>(), 6);
    assert_eq!((got["a"], got["c"]), (2, 2), "{got:?}");
    // Fresh mode recomputes from scratch.
    t.mode = Mode::Fresh;
    t.replicas = 12;
    t.previous = prev(&[("b", 12)]);
    let fresh: BTreeMap<String, i64> = shares(&t.run(&c)).into_iter().collect();
    assert!(fresh.len() >= 2, "{fresh:?}");
}

#[test]
fn shedding_cuts_a_hot_cluster_to_under_its_limit() {
    // a is at 95 of 100 cores with 20 of our replicas among them.
    let c = loaded([95, 30, 30]);
    let mut t = T::new(divided(), 30);
    t.previous = prev(&[("a", 20), ("b", 5), ("c", 5)]);
    // Without shedding nothing moves.
    assert_eq!(shares(&t.run(&c)), s(&[("a", 20), ("b", 5), ("c", 5)]));
    t.shed = vec!["a".into()];
    let got: BTreeMap<String, i64> = shares(&t.run(&c)).into_iter().collect();
    // Under 0.80: 80 - 75 (others) = 5 replicas stay.
    assert_eq!(got["a"], 5, "{got:?}");
    assert_eq!(got.values().sum::<i64>(), 30);
}

#[test]
fn storage_classes_and_workload_relations_filter_and_proximity_ranks() {
    let mut c = fleet();
    c[0].storage_classes = vec!["standard".into(), "fast".into()];
    c[1].storage_classes = vec!["standard".into()];
    // m3 reports none: not turned away for it.
    let mut t = T::new(json!({}), 1);
    t.storage_classes = vec!["fast".into(), String::new()];
    let why = t.explain(&c);
    assert_eq!(why["m2"].filter, "StorageClass");
    assert_eq!(
        why["m2"].reason,
        "the cluster offers no storage class \"fast\" (it has standard)"
    );
    assert!(why["m1"].filter.is_empty() && why["m3"].filter.is_empty());
    // Follow-up: only where the leader runs.
    let mut t = T::new(json!({}), 1);
    t.within = Some(vec!["m2".into()]);
    assert_eq!(shares(&t.run(&c)), s(&[("m2", 1)]));
    assert_eq!(t.explain(&c)["m1"].reason, "the leader db runs in a");
    // Anti-affinity: never where the group runs.
    let mut t = T::new(json!({}), 1);
    t.avoid = Some(vec!["m3".into(), "m2".into()]);
    assert_eq!(shares(&t.run(&c)), s(&[("m1", 1)]));
    assert_eq!(t.explain(&c)["m3"].filter, "WorkloadAffinity");
    // Proximity: near m1, the closer of m2 (10 ms) and m3 (200 ms) wins, though m3 is the
    // roomier; as reported by either end.
    let mut c = fleet();
    c[0].ready = false;
    c[1].latency_ms.insert("m1".into(), 10.0);
    c[0].latency_ms.insert("m3".into(), 200.0);
    let one = json!({"spreadConstraints": [{"spreadByField": "cluster", "maxGroups": 1}]});
    let mut t = T::new(one, 1);
    assert_eq!(
        shares(&t.run(&c)),
        s(&[("m3", 1)]),
        "without it, room decides"
    );
    t.near = vec!["m1".into()];
    assert_eq!(shares(&t.run(&c)), s(&[("m2", 1)]));
    let why = t.explain(&c);
    assert_eq!(why["m2"].scores["Proximity"], 100.0);
    assert!(
        why["m2"].score > why["m3"].score,
        "{:?} {:?}",
        why["m2"],
        why["m3"]
    );
}

#[test]
fn filters_explain_themselves() {
    let mut c = fleet();
    c[0].ready = false;
    c[1].taints.push(Taint::new(
        "maintenance",
        TaintEffect::NoSchedule,
        Time::now(),
    ));
    let t = T::new(json!({}), 1);
    assert_eq!(shares(&t.run(&c)), s(&[("m3", 1)]));
    let why = t.explain(&c);
    assert_eq!(why["m1"].reason, "the cluster is not ready");
    assert_eq!(why["m1"].filter, "Readiness");
    assert_eq!(
        why["m2"].reason,
        "taint maintenance:NoSchedule is not tolerated"
    );
    assert_eq!(why["m3"].reason, "selected");
    assert!(why["m3"].score.is_some() && why["m3"].scores.len() == 6);
    // A cluster that stops being Ready keeps what it already runs (until a NoExecute taint).
    let mut t = T::new(json!({}), 1);
    t.previous = prev(&[("m1", 1)]);
    assert!(shares(&t.run(&c)).contains(&("m1".to_string(), 1)));
    let mut gone = c.clone();
    gone[0].taints.push(Taint::new(
        "cluster.multicluster.io/unreachable",
        TaintEffect::NoExecute,
        Time::from_unix_seconds(t.now - 100).unwrap(),
    ));
    assert!(!shares(&t.run(&gone)).iter().any(|(n, _)| n == "m1"));
    // Tolerated for 300 s after it was added: it stays; for 60 s: it is gone.
    for (secs, stays) in [(300, true), (60, false)] {
        t.placement = placement(json!({"clusterTolerations": [
            {"key": "cluster.multicluster.io/unreachable", "operator": "Exists",
             "effect": "NoExecute", "tolerationSeconds": secs}]}));
        assert_eq!(
            shares(&t.run(&gone)).iter().any(|(n, _)| n == "m1"),
            stays,
            "{secs}"
        );
    }
    // Tolerated, it is chosen.
    let p = json!({"clusterTolerations": [{"key": "maintenance", "operator": "Exists"}]});
    assert_eq!(shares(&run(&c, p, 1)).len(), 2);
    // Affinity by label, by field, exclusion.
    let c = fleet();
    let p = json!({"clusterAffinity": {"labelSelector": {"matchLabels": {"env": "prod"}}, "exclude": ["m1"]}});
    assert_eq!(shares(&run(&c, p, 1)), s(&[("m2", 1)]));
    let p = json!({"clusterAffinity": {"fieldSelector": {"matchExpressions": [{"key": "region", "operator": "In", "values": ["asia", "us"]}]}}});
    assert_eq!(shares(&run(&c, p, 1)), s(&[("m1", 1), ("m3", 1)]));
    // clusterAffinities: the first term that works wins.
    let p = json!({"clusterAffinities": [
        {"affinityName": "primary", "clusterNames": ["nowhere"]},
        {"affinityName": "backup", "clusterNames": ["m2"]}]});
    let d = run(&c, p, 1);
    assert_eq!(
        (d.affinity_name.as_str(), shares(&d)),
        ("backup", s(&[("m2", 1)]))
    );
}

#[test]
fn capabilities_and_node_fit() {
    let mut c = loaded([0, 0, 0]);
    c[0].capabilities = vec!["gpu".into()];
    c[1].capabilities = vec!["gpu".into(), "tls-encryption".into()];
    let mut p = divided();
    p["capabilities"] = json!(["gpu", "tls-encryption"]);
    let t = T::new(p, 2);
    assert_eq!(shares(&t.run(&c)), s(&[("b", 2)]));
    let why = t.explain(&c);
    assert_eq!(why["a"].reason, "lacks the capabilities tls-encryption");
    assert_eq!(why["c"].filter, "Capabilities");
    // Plenty free in total, but no node with 4 free cores: no replica of 4 cores lands.
    c[0].largest_node_free.insert("cpu".into(), cpu(3));
    c[1].largest_node_free.insert("cpu".into(), cpu(8));
    let mut t = T::new(divided(), 2);
    t.request = [("cpu".to_string(), cpu(4))].into();
    assert!(!shares(&t.run(&c)).iter().any(|(n, _)| n == "a"));
    let why = t.explain(&c);
    assert_eq!(
        why["a"].reason,
        "no single node has room for one replica (cpu too short)"
    );
    // A GPU replica cannot go where there are no GPUs.
    let mut t = T::new(divided(), 1);
    t.request = [("nvidia.com/gpu".to_string(), cpu(1))].into();
    let mut g = loaded([0, 0, 0]);
    g[2].allocatable.insert("nvidia.com/gpu".into(), cpu(4));
    assert_eq!(shares(&t.run(&g)), s(&[("c", 1)]));
    // Karmada's profile does not look at water levels or nodes.
    let t = T::new(json!({}), 1);
    let mut hot = loaded([99, 99, 99]);
    hot[0].largest_node_free.insert("cpu".into(), cpu(0));
    assert!(t.run(&hot).clusters.is_empty());
    assert!(!t.run_with(&hot, &Config::karmada()).clusters.is_empty());
}

#[test]
fn scores_rank_the_feasible_clusters() {
    // Locality: the cluster already running the workload wins a Duplicated single pick.
    let c = loaded([50, 50, 50]);
    let mut t = T::new(
        json!({"spreadConstraints": [{"spreadByField": "cluster", "maxGroups": 1}]}),
        1,
    );
    t.previous = prev(&[("c", 1)]);
    assert_eq!(shares(&t.run(&c)), s(&[("c", 1)]));
    // Balance and headroom: the emptiest cluster ranks first.
    let t = T::new(
        json!({"spreadConstraints": [{"spreadByField": "cluster", "maxGroups": 1}]}),
        1,
    );
    assert_eq!(shares(&t.run(&loaded([50, 10, 50]))), s(&[("b", 1)]));
    // Network: with equal load, the quieter, closer cluster.
    let mut c = loaded([50, 50, 50]);
    c[0].traffic = 900.0;
    c[1].traffic = 100.0;
    c[2].traffic = 500.0;
    assert_eq!(shares(&t.run(&c)), s(&[("b", 1)]));
    // Priority leans towards the least loaded cluster.
    let mut t = T::new(json!({}), 1);
    t.priority = 100;
    let hi = t.explain(&loaded([10, 50, 50]));
    t.priority = 0;
    let lo = t.explain(&loaded([10, 50, 50]));
    assert!(hi["a"].scores["Priority"] > hi["b"].scores["Priority"]);
    assert_eq!(lo["a"].scores["Priority"], lo["b"].scores["Priority"]);
}

#[test]
fn weights_decide_between_staying_and_moving() {
    // One replica runs on c; b is emptier. Locality alone keeps it on c, balance and
    // headroom alone move it to b.
    let c = loaded([50, 10, 50]);
    let mut t = T::new(
        json!({"spreadConstraints": [{"spreadByField": "cluster", "maxGroups": 1}]}),
        1,
    );
    t.previous = prev(&[("c", 1)]);
    t.mode = Mode::Fresh;
    let with = |w: &str| Config {
        weights: w.parse().unwrap(),
        ..Config::default()
    };
    let stay = with("headroom=0,balance=0,locality=1,priority=0,network=0");
    let go = with("headroom=1,balance=1,locality=0,priority=0,network=0");
    assert_eq!(shares(&t.run_with(&c, &stay)), s(&[("c", 1)]));
    assert_eq!(shares(&t.run_with(&c, &go)), s(&[("b", 1)]));
}

#[test]
fn spread_constraints() {
    let mut c = fleet();
    c.push(cluster("m4", "us", 50, 0));
    // The two best-scoring clusters.
    let d = run(
        &c,
        json!({"spreadConstraints": [{"spreadByField": "cluster", "maxGroups": 2}]}),
        1,
    );
    assert_eq!(shares(&d), s(&[("m2", 1), ("m4", 1)]));
    // The best region (us, through m4) keeps both of its clusters.
    let d = run(
        &c,
        json!({"spreadConstraints": [{"spreadByField": "region", "maxGroups": 1}]}),
        1,
    );
    assert_eq!(shares(&d), s(&[("m1", 1), ("m4", 1)]));
    let d = run(
        &c,
        json!({"spreadConstraints": [{"spreadByField": "region", "minGroups": 4}]}),
        1,
    );
    assert!(d.error.unwrap().contains("at least 4 groups, only 3"));
}

/// A spread that picks some of the feasible clusters keeps the ones it runs in while they
/// stay feasible, however the others' scores change; afresh, it takes the best.
#[test]
fn a_steady_spread_keeps_the_clusters_it_runs_in() {
    let mut c = fleet();
    c.push(cluster("m4", "us", 50, 0));
    let mut t = T::new(
        json!({"spreadConstraints": [{"spreadByField": "cluster", "maxGroups": 2}]}),
        1,
    );
    assert_eq!(shares(&t.run(&c)), s(&[("m2", 1), ("m4", 1)]));
    t.previous = prev(&[("m1", 1), ("m3", 1)]);
    assert_eq!(shares(&t.run(&c)), s(&[("m1", 1), ("m3", 1)]));
    // By region too: us (m1, m4) is kept over a better-scoring one.
    let mut r = T::new(
        json!({"spreadConstraints": [{"spreadByField": "region", "maxGroups": 1}]}),
        1,
    );
    r.previous = prev(&[("m3", 1)]);
    let kept = shares(&r.run(&c));
    assert!(kept.iter().all(|(n, _)| n == "m3"), "{kept:?}");
    // A held cluster that is no longer feasible gives way.
    let mut gone = c.clone();
    gone.retain(|x| x.name != "m3");
    assert_eq!(shares(&t.run(&gone)), s(&[("m1", 1), ("m4", 1)]));
    // Afresh, without the locality score's pull to stay, the best two again.
    t.mode = Mode::Fresh;
    let no_locality = Config {
        weights: "headroom=1,balance=1,locality=0,priority=0,network=0"
            .parse()
            .unwrap(),
        ..Config::default()
    };
    let best = shares(&t.run_with(&c, &no_locality));
    t.previous = Vec::new();
    assert_eq!(best, shares(&t.run_with(&c, &no_locality)));
    assert_ne!(best, s(&[("m1", 1), ("m3", 1)]));
}

#[test]
fn targets_and_api_enablement() {
    let mut c = fleet();
    c[1].api_kinds = Some([("apps/v1".to_string(), "StatefulSet".to_string())].into());
    let mut t = T::new(json!({}), 2);
    t.targets = vec![
        Target {
            names: vec!["m1".into()],
            labels: vec![],
        },
        Target {
            names: vec![],
            labels: vec!["env=edge".into()],
        },
    ];
    assert_eq!(shares(&t.run(&c)), s(&[("m1", 2), ("m3", 2)]));
    let why = t.explain(&c);
    assert!(
        why["m2"]
            .reason
            .contains("does not serve apps/v1 Deployment")
    );
}

/// A standalone task (no API named) is not held back by what the members serve; a workload
/// is.
#[test]
fn standalone_tasks_need_no_api() {
    let mut c = fleet();
    for x in c.iter_mut() {
        x.api_kinds = Some([("batch/v1".to_string(), "Job".to_string())].into());
    }
    let t = T::new(
        json!({"replicaScheduling": {"replicaSchedulingType": "Divided"}}),
        3,
    );
    assert!(shares(&t.run(&c)).is_empty());
    let mut task = t.task();
    task.api_version = "";
    let d = schedule(&Fleet::new(c.clone()), &task, &Config::default());
    assert_eq!(d.clusters.iter().map(|x| x.replicas).sum::<i64>(), 3);
}

/// The property the issue asks of water-filling: after placing, no eligible cluster that
/// received replicas sits higher than another eligible cluster could have taken them to.
#[test]
fn water_filling_evens_levels_on_many_shapes() {
    for seed in 0..50u64 {
        let mut x = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let mut next = || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) as i64
        };
        let c: Vec<ClusterSnapshot> = (0..6)
            .map(|i| {
                let cap = 20 + next() % 200;
                let used = cap * (60 + next() % 25) / 100;
                cluster(&format!("k{i}"), "r", cap, used)
            })
            .collect();
        let replicas = 1 + next() % 60;
        let d = run(&c, divided(), replicas);
        assert_eq!(d.strategy, "WaterFilling", "seed {seed}");
        let f = Fleet::new(c.clone());
        let level = |name: &str, n: i64| {
            let i = f.position(name).unwrap();
            let fa = &f.facts()[i];
            (fa.taken(0) + n as f64) / fa.allocatable[0]
        };
        let got: BTreeMap<String, i64> = shares(&d).into_iter().collect();
        assert_eq!(
            got.values().sum::<i64>() + d.unplaced,
            replicas,
            "seed {seed}"
        );
        for (a, na) in &got {
            // Its last replica went where the level was lowest.
            let before_last = level(a, na - 1);
            for cl in &c {
                let nb = got.get(&cl.name).copied().unwrap_or(0);
                let alt = level(&cl.name, nb + 1);
                if alt <= 0.85 + 1e-9 {
                    assert!(
                        before_last <= alt + 1e-9,
                        "seed {seed}: {a} got its last replica at {before_last} while {} would be at {alt}",
                        cl.name
                    );
                }
            }
            assert!(
                level(a, *na) <= 0.85 + 1e-9,
                "seed {seed}: {a} over the limit"
            );
        }
    }
}

/// The filter cache changes nothing but speed: the same decisions with and without it, as
/// tasks with and without a current placement come and go and clusters change.
#[test]
fn the_filter_cache_gives_the_same_decisions() {
    let mut c = fleet();
    c.push(cluster("m4", "us", 50, 0));
    let mut f = Fleet::new(c);
    let mut cache = FilterCache::new();
    let config = Config::default();
    let placements = [
        json!({}),
        divided(),
        json!({"clusterAffinity": {"labelSelector": {"matchLabels": {"env": "prod"}}}}),
        json!({"clusterTolerations": [{"key": "maintenance", "operator": "Exists"}],
               "replicaScheduling": {"replicaSchedulingType": "Divided"}}),
    ];
    for round in 0..4 {
        if round == 2 {
            // A placement fact changes: a taint and a readiness flip.
            let mut m2 = f.get("m2").unwrap().clone();
            m2.taints.push(Taint::new(
                "maintenance",
                TaintEffect::NoSchedule,
                Time::now(),
            ));
            f.upsert(m2);
            let mut m1 = f.get("m1").unwrap().clone();
            m1.ready = false;
            f.upsert(m1);
        }
        for (k, p) in placements.iter().enumerate() {
            let mut t = T::new(p.clone(), 3);
            if k % 2 == 1 {
                t.previous = prev(&[("m1", 1), ("m2", 2)]);
            }
            let cached = schedule_cached(&f, &t.task(), &config, &mut cache);
            let fresh = schedule(&f, &t.task(), &config);
            assert_eq!(cached, fresh, "round {round}, placement {k}");
        }
    }
}

#[test]
fn large_fleets_score_a_sample_that_keeps_the_current_clusters() {
    let c: Vec<ClusterSnapshot> = (0..300)
        .map(|i| cluster(&format!("k{i:03}"), "r", 100, (i % 50) as i64))
        .collect();
    let f = Fleet::new(c);
    let config = Config::default();
    let mut t = T::new(divided(), 20);
    t.previous = prev(&[("k299", 3)]);
    let mut task = t.task();
    let count = |d: &Decision| {
        d.outcomes
            .to_vec()
            .iter()
            .filter(|o| matches!(o, Outcome::Scored { .. }))
            .count()
    };
    let d = schedule(&f, &task, &config);
    assert_eq!(count(&d), DEFAULT_SCORE_SAMPLE + 1);
    assert!(matches!(d.outcomes.get(299), Outcome::Scored { .. }));
    assert_eq!(d.clusters.iter().map(|c| c.replicas).sum::<i64>(), 20);
    // Another seed, another sample; the same seed, the same decision.
    task.seed = 7;
    let other = schedule(&f, &task, &config);
    assert_ne!(other.outcomes.to_vec(), d.outcomes.to_vec());
    assert_eq!(schedule(&f, &task, &config), other);
    let why = other.explain(&f, &task, &config);
    assert!(why.iter().any(|w| w.filter == "Sample"));
    // Scoring everything is a setting away.
    let all = Config {
        score_sample: 0,
        ..Config::default()
    };
    assert_eq!(count(&schedule(&f, &task, &all)), 300);
}

#[test]
fn summaries_explain_the_chosen_first_and_count_the_rest() {
    let mut c: Vec<ClusterSnapshot> = (0..300)
        .map(|i| cluster(&format!("k{i:03}"), "r", 100, (i % 50) as i64))
        .collect();
    for x in c.iter_mut().take(20) {
        x.ready = false;
    }
    let f = Fleet::new(c);
    let config = Config::default();
    let t = T::new(divided(), 20);
    let d = schedule(&f, &t.task(), &config);
    let (kept, filtered) = d.summary(&f, &t.task(), &config, 10);
    assert_eq!(kept.len(), 10);
    let chosen = d.clusters.len().min(10);
    assert!(kept.iter().filter(|k| k.replicas.is_some()).count() == chosen);
    assert_eq!(filtered["Readiness"], 20);
    assert_eq!(filtered["Sample"], 300 - 20 - DEFAULT_SCORE_SAMPLE as i64);
    // The full explanation agrees with the counts.
    let all = d.explain(&f, &t.task(), &config);
    assert_eq!(all.len(), 300);
    assert_eq!(all.iter().filter(|x| x.filter == "Readiness").count(), 20);
    assert_eq!(
        all.iter().filter(|x| x.filter == "Sample").count() as i64,
        filtered["Sample"]
    );
}

#[test]
fn summary_counts_agree_with_every_outcome() {
    // A fleet where every kind of outcome occurs: not ready, tainted, excluded by affinity,
    // full (water level), left out of the sample, scored; and tasks running on clusters that
    // the placement now turns away.
    let mut c: Vec<ClusterSnapshot> = (0..400)
        .map(|i| {
            cluster(
                &format!("k{i:03}"),
                "r",
                100,
                if i % 7 == 0 { 99 } else { 10 },
            )
        })
        .collect();
    for (i, x) in c.iter_mut().enumerate() {
        if i % 11 == 0 {
            x.ready = false;
        }
        if i % 13 == 0 {
            x.taints.push(Taint::new(
                "maintenance",
                TaintEffect::NoSchedule,
                Time::now(),
            ));
        }
    }
    let f = Fleet::new(c);
    let affinity = json!({"clusterAffinity": {"labelSelector": {"matchLabels": {"env": "prod"}}},
                          "replicaScheduling": {"replicaSchedulingType": DIVIDED}});
    let cases: Vec<(&str, serde_json::Value, Vec<TargetCluster>, usize)> = vec![
        ("divided, sampled", divided(), vec![], DEFAULT_SCORE_SAMPLE),
        ("divided, all scored", divided(), vec![], 0),
        ("affinity", affinity.clone(), vec![], DEFAULT_SCORE_SAMPLE),
        (
            // k003 has env=edge, k011 is not ready, k013 tainted, k014 full.
            "running where it is now turned away",
            affinity,
            prev(&[
                ("k003", 2),
                ("k011", 1),
                ("k013", 1),
                ("k014", 1),
                ("k100", 1),
            ]),
            DEFAULT_SCORE_SAMPLE,
        ),
        ("duplicated, all scored", json!({}), vec![], 0),
    ];
    for (what, p, previous, sample) in cases {
        let config = Config {
            score_sample: sample,
            ..Config::default()
        };
        let mut t = T::new(p, 30);
        t.previous = previous;
        let mut cache = FilterCache::new();
        let d = schedule_cached(&f, &t.task(), &config, &mut cache);
        let (kept, filtered) = d.summary(&f, &t.task(), &config, 10);
        // The same counts by walking every cluster's outcome.
        let mut want: BTreeMap<String, i64> = BTreeMap::new();
        let mut first_away: Vec<String> = Vec::new();
        for (i, o) in d.outcomes.to_vec().into_iter().enumerate() {
            let key = match o {
                Outcome::Scored { .. } => continue,
                Outcome::Filtered(k) => config.filters[k].name().to_string(),
                Outcome::Spread(..) => "SpreadConstraint".to_string(),
                Outcome::NotSampled => "Sample".to_string(),
                Outcome::Reserve(_) => "OverflowAffinity".to_string(),
            };
            *want.entry(key).or_default() += 1;
            first_away.push(f.clusters()[i].name.clone());
        }
        assert_eq!(filtered, want, "{what}");
        assert!(
            want.len() >= 2 || what.starts_with("duplicated"),
            "{what}: {want:?}"
        );
        // The explained ones: every chosen cluster first, then (room left) the first turned
        // away in fleet order.
        let chosen = d.clusters.len().min(10);
        assert_eq!(
            kept.iter().filter(|k| k.replicas.is_some()).count(),
            chosen,
            "{what}"
        );
        let away: Vec<&String> = kept
            .iter()
            .filter(|k| !k.filter.is_empty())
            .map(|k| &k.name)
            .collect();
        for n in &away {
            let at = first_away.iter().position(|x| x == *n).unwrap();
            assert!(at < 10, "{what}: {n} is not among the first turned away");
        }
    }
}

/// The second finding of issue 21: a partial placement retried before its pods exist must
/// stay partial. The assume cache keeps the first decision's replicas counted until the member
/// reports their pods and then figures measured after that; whatever the order of reports,
/// no retry fills the cluster beyond its limit.
#[test]
fn retries_never_fill_a_cluster_beyond_its_limit_before_its_pods_exist() {
    use crate::assume::AssumeCache;
    // 100 cores, 10 taken by others: 70 replicas of one core fit under 0.8.
    let base = vec![cluster("a", "us", 100, 10)];
    let mut t = T::new(divided(), 100);
    t.placement.water_level_limit = Some(0.8);
    let demand = demand_of(&t.request);
    let mut fleet = Fleet::new(base.clone());
    let first = schedule(&fleet, &t.task(), &Config::default());
    assert_eq!((shares(&first), first.unplaced), (s(&[("a", 70)]), 30));
    let mut cache = AssumeCache::new();
    cache.assume("ns/big", demand, &[], &first.clusters, true, 0);
    // The decision is retried in every state the member's figures and pod reports can be in:
    // (figures include the pods, pods reported, report measured after the pods were seen).
    t.previous = first.clusters.clone();
    for (step, (figures_include_pods, pods_reported, measured_after)) in [
        (false, false, true),
        (false, true, false),
        (true, false, true),
        (true, true, true),
    ]
    .into_iter()
    .enumerate()
    {
        let mut c = cache.clone();
        let mut member = base.clone();
        if figures_include_pods {
            member[0].allocated.insert("cpu".into(), cpu(80));
        }
        if pods_reported {
            c.observe("ns/big", "a", 70, 1000);
        }
        c.confirm("a", if measured_after { 60_000 } else { 1000 }, 1000, 5000);
        // A report measured after pods were seen means the figures include them.
        if pods_reported && measured_after && !figures_include_pods {
            continue;
        }
        fleet = Fleet::new(member);
        fleet.set_assumed("a", c.total("a"));
        let again = schedule(&fleet, &t.task(), &Config::default());
        assert_eq!(
            (shares(&again), again.unplaced),
            (s(&[("a", 70)]), 30),
            "step {step}: a retry places nothing more"
        );
        assert!(again.error.is_some(), "step {step}: still partial");
    }
}

/// A fleet for data-aware decisions: `gpu` the GPU performance, `gbit` the uplink, `price`
/// the egress price per GiB; every cluster roomy and equally loaded.
fn data_cluster(name: &str, gpu: f64, gbit: f64, price: f64) -> ClusterSnapshot {
    let mut c = cluster(name, "r", 64, 8);
    c.bandwidth = Some((gbit * 125_000_000.0) as i64);
    c.properties.insert(
        orrery_api::data::GPU_PERFORMANCE_PROPERTY.into(),
        gpu.to_string(),
    );
    c.properties.insert(
        orrery_api::data::EGRESS_PRICE_PROPERTY.into(),
        price.to_string(),
    );
    c
}

fn input(name: &str, bytes: i64, holders: &[&str]) -> data::Input {
    data::Input {
        name: name.into(),
        bytes,
        holders: holders
            .iter()
            .map(|h| (h.to_string(), orrery_api::data::Tier::Warm))
            .collect(),
    }
}

const GIB: i64 = 1 << 30;

#[test]
fn data_aware_placement_weighs_transfer_against_compute() {
    // `slow` holds the data and has a slow GPU; `fast` has a GPU 4× faster, 10 Gbit/s away.
    let clusters = vec![
        data_cluster("slow", 1.0, 10.0, 0.02),
        data_cluster("fast", 4.0, 10.0, 0.09),
    ];
    let job = |bytes: i64, hours: f64| {
        let mut t = T::new(divided(), 1);
        t.data = Some(data::DataNeeds {
            inputs: vec![input("in", bytes, &["slow"])],
            gpu_hours: hours,
            ..Default::default()
        });
        t
    };
    // (input, GPU hours, where it runs): heavy compute on a small input follows the GPU;
    // a huge input with light compute stays with its data.
    let cases = [
        (10 * GIB, 8.0, "fast"),
        (2048 * GIB, 0.5, "slow"),
        (0, 1.0, "fast"),
    ];
    for (bytes, hours, want) in cases {
        let t = job(bytes, hours);
        let d = t.run(&clusters);
        assert_eq!(shares(&d), s(&[(want, 1)]), "{bytes} bytes, {hours} h");
        let e = t.explain(&clusters);
        let est = e[want].estimate.as_ref().expect("an estimate");
        let other = e[if want == "fast" { "slow" } else { "fast" }]
            .estimate
            .as_ref()
            .unwrap();
        assert!(
            est.total_seconds <= other.total_seconds,
            "{est:?} vs {other:?}"
        );
    }
    // The parts: 10 GiB over 10 Gbit/s is 8.6 s; 8 hours on a 4× GPU is 2 h.
    let e = job(10 * GIB, 8.0).explain(&clusters);
    let fast = e["fast"].estimate.clone().unwrap();
    assert_eq!(fast.transfer_seconds, 8.6);
    assert_eq!(fast.compute_seconds, 7200.0);
    assert_eq!(fast.wait_seconds, 0.0);
    assert_eq!(fast.transfer_bytes, 10 * GIB);
    assert_eq!(fast.egress_cost, 0.2, "10 GiB at the source's 0.02");
    assert_eq!(fast.fetches[0].from, "slow");
    let slow = e["slow"].estimate.clone().unwrap();
    assert_eq!(
        (slow.transfer_seconds, slow.compute_seconds),
        (0.0, 28800.0)
    );
}

#[test]
fn data_filters_tier_network_reach_and_transfer_cost() {
    let mut clusters = vec![
        data_cluster("a", 1.0, 1.0, 0.10),
        data_cluster("b", 1.0, 1.0, 0.01),
        data_cluster("c", 1.0, 1.0, 0.05),
    ];
    clusters[0]
        .labels
        .insert(orrery_api::data::STORAGE_TIER_KEY.into(), "hot".into());
    clusters[1]
        .labels
        .insert(orrery_api::data::STORAGE_TIER_KEY.into(), "cold".into());
    clusters[0]
        .labels
        .insert(orrery_api::data::NETWORK_KEY.into(), "lab".into());
    let with = |clusters: &[ClusterSnapshot], f: &dyn Fn(&mut data::DataNeeds)| {
        let mut t = T::new(divided(), 1);
        let mut n = data::DataNeeds {
            inputs: vec![input("in", 100 * GIB, &["a", "b"])],
            ..Default::default()
        };
        f(&mut n);
        t.data = Some(n);
        t.explain(clusters)
    };
    // A warm tier: `b` (cold) and `c` (no label) are turned away, with why.
    let e = with(&clusters, &|n| n.tier = Some(orrery_api::data::Tier::Warm));
    assert_eq!(e["a"].replicas, Some(1));
    assert_eq!(e["b"].filter, "StorageTier");
    assert!(
        e["b"].reason.contains("slower than the warm"),
        "{}",
        e["b"].reason
    );
    assert!(e["c"].reason.contains("no orrery.io/storage-tier label"));
    // A network.
    let e = with(&clusters, &|n| n.network = "lab".into());
    assert_eq!(e["b"].filter, "Network");
    assert_eq!(e["a"].replicas, Some(1));
    // maxTransfer: `c` would need 100 GiB copied.
    let e = with(&clusters, &|n| n.max_transfer = Some(10 * GIB));
    assert_eq!(e["c"].filter, "DataReach");
    assert!(e["c"].reason.contains("100 GiB"), "{}", e["c"].reason);
    // An input nobody holds: nothing can start.
    let e = with(&clusters, &|n| n.missing = vec!["ghost".into()]);
    assert!(e.values().all(|c| c.filter == "DataReach"));
    assert!(e["a"].reason.contains("ghost"));
    // Transfer cost first: the copy comes from the cheaper holder.
    let e = with(&clusters, &|n| n.cost_first = true);
    assert_eq!(e["c"].estimate.as_ref().unwrap().fetches[0].from, "b");
    // Transfers booked on a holder's link go first: the copy comes from the free one.
    clusters[1].busy_out_seconds = 10_000.0;
    let e = with(&clusters, &|n| n.cost_first = false);
    let c = e["c"].estimate.as_ref().unwrap();
    assert_eq!(c.fetches[0].from, "a");
    clusters[0].busy_out_seconds = 20_000.0;
    let e = with(&clusters, &|_| {});
    let c = e["c"].estimate.as_ref().unwrap();
    assert_eq!(c.fetches[0].from, "b");
    assert!(c.transfer_seconds > 10_000.0, "{c:?}");
    clusters[0].busy_out_seconds = 0.0;
    clusters[1].busy_out_seconds = 0.0;
    // A holder that is not ready is no source.
    clusters[1].ready = false;
    let e = with(&clusters, &|_| {});
    assert_eq!(e["c"].estimate.as_ref().unwrap().fetches[0].from, "a");
}

#[test]
fn an_input_comes_through_a_relay_when_two_hops_beat_a_slow_path() {
    // `home` holds 100 GiB; its path to `far` carries 1 Gbit/s of their 10 Gbit/s uplinks,
    // while `mid` reaches both at 10 Gbit/s and has a cache tier to hold the copy in between.
    let mut clusters = vec![
        data_cluster("home", 0.1, 10.0, 0.02),
        data_cluster("mid", 0.1, 10.0, 0.01),
        data_cluster("far", 4.0, 10.0, 0.05),
    ];
    clusters[0].path_bandwidth.insert("far".into(), 125_000_000);
    let job = || {
        let mut t = T::new(divided(), 1);
        t.data = Some(data::DataNeeds {
            inputs: vec![input("in", 100 * GIB, &["home"])],
            gpu_hours: 8.0,
            ..Default::default()
        });
        t
    };
    // No cache tier at `mid`: no relay, the slow path it is (100 GiB at 1 Gbit/s: 859 s).
    let e = job().explain(&clusters);
    let far = e["far"].estimate.clone().unwrap();
    assert_eq!(far.fetches[0].via, "");
    assert_eq!(far.transfer_seconds, 859.0);
    // With one, through `mid`: two hops of 85.9 s, and both pay egress.
    clusters[1]
        .properties
        .insert(orrery_api::data::CACHE_PROPERTY.into(), "1Ti".into());
    let e = job().explain(&clusters);
    let far = e["far"].estimate.clone().unwrap();
    assert_eq!(
        (far.fetches[0].from.as_str(), far.fetches[0].via.as_str()),
        ("home", "mid")
    );
    assert_eq!(far.transfer_seconds, 171.8);
    assert_eq!(far.egress_cost, 3.0, "100 GiB at 0.02, then at 0.01");
    assert_eq!(shares(&job().run(&clusters)), s(&[("far", 1)]));
    // The path as the far end reports it counts the same.
    clusters[0].path_bandwidth.clear();
    clusters[2]
        .path_bandwidth
        .insert("home".into(), 125_000_000);
    let e = job().explain(&clusters);
    assert_eq!(e["far"].estimate.as_ref().unwrap().fetches[0].via, "mid");
    // A relay that is not ready, or two hops that are no faster, are not taken.
    clusters[1].ready = false;
    let e = job().explain(&clusters);
    assert_eq!(e["far"].estimate.as_ref().unwrap().fetches[0].via, "");
    clusters[1].ready = true;
    clusters[1].bandwidth = Some(200_000_000);
    let e = job().explain(&clusters);
    assert_eq!(e["far"].estimate.as_ref().unwrap().fetches[0].via, "");
}

#[test]
fn replicas_that_do_not_fit_at_once_wait_for_room() {
    // 4 replicas of 12 cores; under the limit (0.85 of 64 cores, 8 used) 3 fit at once, so
    // the fourth runs in a second round.
    let clusters = vec![data_cluster("only", 2.0, 10.0, 0.0)];
    let mut t = T::new(divided(), 4);
    t.request = [("cpu".to_string(), cpu(12))].into();
    t.data = Some(data::DataNeeds {
        gpu_hours: 4.0,
        ..Default::default()
    });
    let est = t.explain(&clusters)["only"].estimate.clone().unwrap();
    // Each replica does an hour of reference work: half an hour on this GPU.
    assert_eq!(est.compute_seconds, 1800.0);
    assert_eq!(est.wait_seconds, 1800.0);
    assert_eq!(est.total_seconds, 3600.0);
}

/// A whole set of components runs all its pods at once: the completion estimate spreads
/// the work over the sum of its components' replicas, in one round.
#[test]
fn a_whole_sets_completion_counts_every_component() {
    let clusters = vec![data_cluster("only", 2.0, 10.0, 0.0)];
    let mut t = T::new(divided(), 0);
    t.components = flink();
    t.data = Some(data::DataNeeds {
        gpu_hours: 5.0,
        ..Default::default()
    });
    let config = Config::default();
    let set = components::WholeSet::of(&t.task(), &config).unwrap();
    let whole = set.task(&t.task());
    let fl = Fleet::new(clusters);
    let d = schedule(&fl, &whole, &config);
    let why = d.explain(&fl, &whole, &config);
    let est = why[0].estimate.clone().unwrap();
    // Five pods (1 + 4), an hour of reference work each: half an hour on this GPU.
    assert_eq!((est.compute_seconds, est.wait_seconds), (1800.0, 0.0));
}

/// A task that reads no data is scored as if the Completion plugin did not exist: its weight
/// does not flatten the totals (which score-weighted division follows).
#[test]
fn a_plugin_with_nothing_to_say_takes_no_part_in_the_mean() {
    let t = T::new(divided(), 12);
    let totals = |config: &Config| {
        let d = t.run_with(&fleet(), config);
        let f = Fleet::new(fleet());
        d.explain(&f, &t.task(), config)
            .into_iter()
            .map(|c| (c.name, c.score, c.scores.contains_key("Completion")))
            .collect::<Vec<_>>()
    };
    let with = totals(&Config::default());
    let mut without = Config::default();
    without.weights.completion = 0.0;
    assert_eq!(with, totals(&without));
    assert!(with.iter().all(|(_, _, completion)| !completion));
}

// Scheduling ahead of the load (`placement.prediction`).

/// A forecast of cluster cpu levels made at `time`: one point a minute, `means` for the mean,
/// each bound `spread` above it, a day of history against a day's season unless `history`
/// says otherwise, starting from `last`.
fn forecast_of(
    time: i64,
    last: f64,
    means: &[f64],
    spread: f64,
    history_points: usize,
) -> orrery_api::history::series::ClusterForecast {
    use orrery_api::history::series::{ClusterForecast, ForecastPoint, SeriesForecast};
    ClusterForecast {
        cluster: "x".into(),
        time: Time::from_unix_seconds(time).unwrap(),
        step_seconds: 60,
        season_seconds: 86_400,
        history: history_points,
        series: [(
            "cpu".to_string(),
            SeriesForecast {
                model: "mstl-ets".into(),
                backtest_mase: Some(0.6),
                points: means
                    .iter()
                    .map(|m| ForecastPoint {
                        mean: *m,
                        lower80: m - spread,
                        upper80: m + spread,
                        lower95: m - 2.0 * spread,
                        upper95: m + 2.0 * spread,
                    })
                    .collect(),
                last: Some(last),
                season_peak: None,
                choice: None,
            },
        )]
        .into(),
    }
}

const NOW: i64 = 1_800_000_000;
const DAY: usize = 1440;

/// `a` and `b` at 60 % of 100 cores (the fleet is busy: water-filling); `a`'s forecast climbs
/// by 0.305 over the next hour, evenly (its history as given), `b`'s stays flat (and sure).
fn peaking(history_points: usize, made: i64) -> Fleet {
    let mut fleet = Fleet::new(vec![
        cluster("a", "us", 100, 60),
        cluster("b", "eu", 100, 60),
    ]);
    let rising: Vec<f64> = (1..=60).map(|m| 0.6 + 0.305 * m as f64 / 60.0).collect();
    let flat = vec![0.6; 60];
    for (name, means, spread) in [("a", rising, 0.02), ("b", flat, 0.0)] {
        let f = forecast_of(made, 0.6, &means, spread, history_points);
        fleet.set_outlook(name, Outlook::of(&f).map(std::sync::Arc::new));
    }
    fleet
}

fn prediction(horizon: &str, bound: &str) -> serde_json::Value {
    let mut p = divided();
    p["prediction"] = json!({"horizon": horizon, "bound": bound});
    p
}

#[test]
fn a_cluster_about_to_peak_receives_no_new_replicas() {
    // 24 replicas of 1 core, water-filled: each where the level it makes is lowest. By the
    // present level a and b are alike and share them. a is judged at 60 % plus its forecast's
    // rise over the horizon (+0.1525 in 30 minutes, +0.2033 in 40, +0.305 in an hour by the
    // mean; Upper80 adds 0.02, Upper95 0.04): b fills to a's level first, and a takes none
    // once the rise leaves no room under the limit (0.85).
    // (what, placement, points of history, when the forecast was made, shares)
    type Case<'a> = (&'a str, serde_json::Value, usize, i64, &'a [(&'a str, i64)]);
    let cases: &[Case] = &[
        (
            "present level",
            prediction("0s", "Mean"),
            DAY,
            NOW,
            &[("a", 12), ("b", 12)],
        ),
        (
            "30m mean",
            prediction("30m", "Mean"),
            DAY,
            NOW,
            &[("a", 4), ("b", 20)],
        ),
        (
            "40m mean",
            prediction("40m", "Mean"),
            DAY,
            NOW,
            &[("a", 2), ("b", 22)],
        ),
        (
            "40m upper80",
            prediction("40m", "Upper80"),
            DAY,
            NOW,
            &[("a", 1), ("b", 23)],
        ),
        (
            "40m upper95",
            prediction("40m", "Upper95"),
            DAY,
            NOW,
            &[("b", 24)],
        ),
        ("1h mean", prediction("1h", "Mean"), DAY, NOW, &[("b", 24)]),
        // The server's default: 30m, Upper80 (+0.1725).
        ("default", divided(), DAY, NOW, &[("a", 3), ("b", 21)]),
        // Less than a season of history: the present level stands.
        (
            "young history",
            prediction("1h", "Mean"),
            DAY - 1,
            NOW,
            &[("a", 12), ("b", 12)],
        ),
        // A forecast made 10 minutes ago (more than three steps): stale.
        (
            "stale",
            prediction("1h", "Mean"),
            DAY,
            NOW - 600,
            &[("a", 12), ("b", 12)],
        ),
        // Made 2 minutes ago: an hour from now is past its end: its last point stands in.
        (
            "2 minutes old",
            prediction("1h", "Mean"),
            DAY,
            NOW - 120,
            &[("b", 24)],
        ),
    ];
    for (what, p, history, made, want) in cases {
        let fleet = peaking(*history, *made);
        let mut t = T::new(p.clone(), 24);
        t.now = NOW;
        let d = schedule(&fleet, &t.task(), &Config::default());
        assert_eq!(shares(&d), s(want), "{what}: {d:?}");
        assert_eq!(d.strategy, "WaterFilling", "{what}");
        assert!(d.error.is_none(), "{what}: {:?}", d.error);
    }
}

#[test]
fn decisions_say_how_each_level_was_judged() {
    let config = Config::default();
    let fleet = peaking(DAY, NOW);
    let mut t = T::new(prediction("1h", "Upper80"), 4);
    t.now = NOW;
    let d = schedule(&fleet, &t.task(), &config);
    let why: BTreeMap<String, ClusterDecision> = d
        .explain(&fleet, &t.task(), &config)
        .into_iter()
        .map(|x| (x.name.clone(), x))
        .collect();
    assert_eq!(why["a"].filter, "WaterLevel");
    assert_eq!(
        why["a"].reason,
        "its water level would reach 0.94 by the forecast (Upper80 over 1h), above the limit 0.85 (0.61 by its present level)"
    );
    assert_eq!(
        why["a"].water_level,
        Some(LevelSeen {
            now: 0.6,
            ahead: Some(0.925),
            basis: "Upper80 over 1h".into()
        })
    );
    assert_eq!(why["b"].water_level.as_ref().unwrap().ahead, Some(0.6));
    assert_eq!(
        d.prediction(&fleet, &t.task(), &config),
        "Upper80 over 1h: forecast for 2 of 2 clusters"
    );
    // b has too little history, and its level is the present one; off, both are.
    let mut fleet = peaking(DAY, NOW);
    let young = forecast_of(NOW, 0.6, &[0.6; 60], 0.02, 10);
    fleet.set_outlook("b", Outlook::of(&young).map(std::sync::Arc::new));
    let d = schedule(&fleet, &t.task(), &config);
    assert_eq!(
        d.prediction(&fleet, &t.task(), &config),
        "Upper80 over 1h: forecast for 1 of 2 clusters; present level for 1 (less than a season of history: b)"
    );
    let b = &d.explain(&fleet, &t.task(), &config)[1];
    assert_eq!(
        b.water_level,
        Some(LevelSeen {
            now: 0.6,
            ahead: None,
            basis: "present level (less than a season of history)".into()
        })
    );
    let off = T {
        now: NOW,
        ..T::new(prediction("0s", ""), 4)
    };
    let d = schedule(&fleet, &off.task(), &config);
    assert_eq!(
        d.prediction(&fleet, &off.task(), &config),
        "present level (prediction off)"
    );
}

#[test]
fn shedding_ahead_keeps_only_what_fits_at_the_forecast_peak() {
    // a runs 30 of our replicas (70 of 100 cores taken); its forecast rises by 0.2 within
    // the hour. Shed with the forecast, a keeps what fits under 0.80 at the peak: 80 - 20 -
    // 40 (the others) = 20, and none of the 10 it gives up go anywhere the forecast says
    // would cross the limit.
    let mut fleet = Fleet::new(vec![
        cluster("a", "us", 100, 70),
        cluster("b", "eu", 100, 30),
        cluster("c", "asia", 100, 30),
    ]);
    let up: Vec<f64> = (1..=60).map(|m| 0.7 + 0.2 * m as f64 / 60.0).collect();
    fleet.set_outlook(
        "a",
        Outlook::of(&forecast_of(NOW, 0.7, &up, 0.0, DAY)).map(std::sync::Arc::new),
    );
    // c's forecast climbs to 0.84: it takes no more than 1 replica of the ten.
    let c_up: Vec<f64> = (1..=60).map(|m| 0.3 + 0.54 * m as f64 / 60.0).collect();
    fleet.set_outlook(
        "c",
        Outlook::of(&forecast_of(NOW, 0.3, &c_up, 0.0, DAY)).map(std::sync::Arc::new),
    );
    let mut t = T::new(prediction("1h", "Mean"), 34);
    t.now = NOW;
    t.previous = prev(&[("a", 30), ("b", 2), ("c", 2)]);
    t.shed = vec!["a".into()];
    let got: BTreeMap<String, i64> = shares(&schedule(&fleet, &t.task(), &Config::default()))
        .into_iter()
        .collect();
    assert_eq!(got["a"], 20, "{got:?}");
    // c takes at most 1 of them (28 + 54 by its forecast + 3 = 85), b the rest.
    assert!(got["c"] <= 3, "{got:?}");
    assert_eq!(got["b"] + got["c"], 14, "{got:?}");
    // Without the forecast, a keeps what fits under 0.80 by its present level: 80 - 40.
    t.placement.prediction = Some(orrery_api::prediction::Prediction {
        horizon: "0s".into(),
        bound: String::new(),
    });
    let got: BTreeMap<String, i64> = shares(&schedule(&fleet, &t.task(), &Config::default()))
        .into_iter()
        .collect();
    assert_eq!(got["a"], 30, "{got:?}");
}

#[test]
fn a_forecast_crossing_is_found_where_it_stays_above_the_mark() {
    // The mean rises from 0.5 by 0.5 over the hour; the upper bounds are 0.2 and 0.4 above
    // it, and do not count: proactive rebalancing follows the mean.
    let up: Vec<f64> = (1..=60).map(|m| 0.5 + 0.5 * m as f64 / 60.0).collect();
    let o = Outlook::of(&forecast_of(NOW, 0.5, &up, 0.2, DAY)).unwrap();
    let mut f = Fleet::new(vec![cluster("a", "us", 100, 50)]);
    f.set_outlook("a", Some(std::sync::Arc::new(o)));
    let facts = &f.facts()[0];
    // 0.5 + m/120 > 0.95 from the 55th minute (step 54), and stays there.
    let c = facts.crossing(NOW, 3600, 0.95, 60).unwrap();
    assert_eq!((c.dimension, c.step, c.at), (0, 54, NOW + 55 * 60));
    assert!((c.level - 0.5).abs() < 1e-9 && (c.peak - 1.0).abs() < 1e-6);
    // Not within 50 minutes; nor with no time ahead; nor for a window longer than what is
    // left of the forecast after the crossing (6 minutes).
    assert!(facts.crossing(NOW, 3000, 0.95, 60).is_none());
    assert!(facts.crossing(NOW, 0, 0.95, 60).is_none());
    assert!(facts.crossing(NOW, 3600, 0.95, 420).is_none());
    assert_eq!(facts.crossing(NOW, 3600, 0.95, 360).unwrap().step, 54);
    // A cluster above the mark already is not a crossing (shedding by the present level
    // takes it).
    let mut hot = Fleet::new(vec![cluster("a", "us", 100, 96)]);
    hot.set_outlook("a", f.facts()[0].outlook.clone());
    assert!(hot.facts()[0].crossing(NOW, 3600, 0.95, 60).is_none());
    // A brief peak above the mark crosses only for a window it fills.
    let blip: Vec<f64> = (1..=60)
        .map(|m| if (20..23).contains(&m) { 0.97 } else { 0.5 })
        .collect();
    let mut b = Fleet::new(vec![cluster("a", "us", 100, 50)]);
    b.set_outlook(
        "a",
        Outlook::of(&forecast_of(NOW, 0.5, &blip, 0.0, DAY)).map(std::sync::Arc::new),
    );
    assert_eq!(
        b.facts()[0].crossing(NOW, 3600, 0.95, 180).unwrap().step,
        19
    );
    assert!(b.facts()[0].crossing(NOW, 3600, 0.95, 240).is_none());
    // A window longer than the horizon asks for the horizon's steps: above from the 6th
    // minute on, 10 minutes ahead, an hour's window.
    let from_6: Vec<f64> = (1..=60).map(|m| if m >= 6 { 0.97 } else { 0.5 }).collect();
    b.set_outlook(
        "a",
        Outlook::of(&forecast_of(NOW, 0.5, &from_6, 0.0, DAY)).map(std::sync::Arc::new),
    );
    assert_eq!(b.facts()[0].crossing(NOW, 600, 0.95, 3600).unwrap().step, 5);
    assert!(b.facts()[0].crossing(NOW, 240, 0.95, 3600).is_none());
}

#[test]
fn outlooks_keep_running_maxima_of_the_rise_per_bound() {
    // Up, down, up again; below the starting point it counts as no rise.
    let means = [0.45, 0.6, 0.5, 0.3, 0.7];
    let o = Outlook::of(&forecast_of(NOW, 0.5, &means, 0.1, DAY)).unwrap();
    let mean: Vec<f64> = (0..5)
        .map(|k| {
            (o.rise(
                orrery_api::prediction::Bound::Mean,
                Window { first: 0, last: k },
                0,
            ) * 100.0)
                .round()
                / 100.0
        })
        .collect();
    assert_eq!(mean, [0.0, 0.1, 0.1, 0.1, 0.2]);
    let u95: Vec<f64> = (0..5)
        .map(|k| {
            (o.rise(
                orrery_api::prediction::Bound::Upper95,
                Window { first: 0, last: k },
                0,
            ) * 100.0)
                .round()
                / 100.0
        })
        .collect();
    assert_eq!(u95, [0.15, 0.3, 0.3, 0.3, 0.4]);
    // Dimensions not forecast rise by nothing; neither does a forecast of traffic alone.
    assert_eq!(
        o.rise(
            orrery_api::prediction::Bound::Upper95,
            Window { first: 0, last: 4 },
            1
        ),
        0.0
    );
    let mut traffic_only = forecast_of(NOW, 0.5, &means, 0.1, DAY);
    let s = traffic_only.series.remove("cpu").unwrap();
    traffic_only.series.insert("traffic".into(), s);
    assert!(Outlook::of(&traffic_only).is_none());
    assert_eq!(
        (o.len(), o.time, o.step, o.history_seconds),
        (5, NOW, 60, 86_400)
    );
}

#[test]
fn what_the_forecast_saw_before_now_counts_for_nothing() {
    // Made three minutes ago: a blip to 0.97 a minute after it (passed), then a climb from
    // 0.5 by 0.01 a minute from the 4th minute on. Now the climb is measured from what the
    // forecast expected of now (0.5 at the 3rd minute), not from its start, and the blip is
    // neither a rise nor a crossing.
    let means: Vec<f64> = (1..=60)
        .map(|m| match m {
            1 => 0.97,
            m if m <= 3 => 0.5,
            m => 0.5 + 0.01 * (m - 3) as f64,
        })
        .collect();
    let o = Outlook::of(&forecast_of(NOW - 180, 0.5, &means, 0.0, DAY)).unwrap();
    let w = o.window(NOW, 600).unwrap();
    assert_eq!((w.first, w.last), (3, 12));
    let mean = orrery_api::prediction::Bound::Mean;
    // Ten minutes ahead: up to the 13th minute, 0.6.
    assert!(
        (o.rise(mean, w, 0) - 0.1).abs() < 1e-9,
        "{}",
        o.rise(mean, w, 0)
    );
    // From its own time the blip would have counted.
    let from_start = Window { first: 0, last: 12 };
    assert!((o.rise(mean, from_start, 0) - 0.47).abs() < 1e-9);
    let mut f = Fleet::new(vec![cluster("a", "us", 100, 50)]);
    f.set_outlook("a", Some(std::sync::Arc::new(o)));
    assert!(f.facts()[0].crossing(NOW, 600, 0.95, 60).is_none());
    // Over everything it reaches (the 60th minute, 0.5 + 0.57), from now.
    assert!((f.facts()[0].outlook.as_ref().unwrap().reach(w, 0) - 0.57).abs() < 1e-9);
}

#[test]
fn a_cluster_its_forecast_takes_past_the_shed_mark_takes_only_what_fits_nowhere_else() {
    // a and b at 60 of 100 cores. a's forecast is flat for the next hour, but its series went
    // 0.4 higher at its peak over the last season: it is past the shed mark (0.95) when that
    // peak comes back, whatever is added.
    let mut fleet = Fleet::new(vec![
        cluster("a", "us", 100, 60),
        cluster("b", "eu", 100, 60),
    ]);
    let mut fa = forecast_of(NOW, 0.6, &[0.6; 60], 0.0, DAY);
    if let Some(s) = fa.series.get_mut("cpu") {
        s.season_peak = Some(0.6 + 0.4);
    }
    let fb = forecast_of(NOW, 0.6, &[0.6; 60], 0.0, DAY);
    fleet.set_outlook("a", Outlook::of(&fa).map(std::sync::Arc::new));
    fleet.set_outlook("b", Outlook::of(&fb).map(std::sync::Arc::new));
    let config = Config::default();
    let run = |n: i64| {
        let mut t = T::new(prediction("30m", "Upper80"), n);
        t.now = NOW;
        let d = schedule(&fleet, &t.task(), &config);
        (shares(&d), d.unplaced, t)
    };
    // 20 fit in b under the limit: a gets none, and says why.
    let (got, unplaced, t) = run(20);
    assert_eq!((got, unplaced), (s(&[("b", 20)]), 0));
    let d = schedule(&fleet, &t.task(), &config);
    let why = d.explain(&fleet, &t.task(), &config);
    assert!(
        why[0].reason.contains("above the shed mark 0.95"),
        "{why:?}"
    );
    // 40: b takes its 25 under the limit, a the rest rather than leave them Pending.
    let (got, unplaced, _) = run(40);
    assert_eq!((got, unplaced), (s(&[("a", 15), ("b", 25)]), 0));
    // With a peak of +0.3, a's first 5 fit before the mark (60 + 30 + 5 = 95).
    if let Some(s) = fa.series.get_mut("cpu") {
        s.season_peak = Some(0.6 + 0.3);
    }
    let mut fleet = fleet;
    fleet.set_outlook("a", Outlook::of(&fa).map(std::sync::Arc::new));
    let mut t = T::new(prediction("30m", "Upper80"), 20);
    t.now = NOW;
    assert_eq!(
        shares(&schedule(&fleet, &t.task(), &config)),
        s(&[("a", 5), ("b", 15)])
    );
}

fn priced(mut c: ClusterSnapshot, props: &[(&str, &str)]) -> ClusterSnapshot {
    for (k, v) in props {
        c.properties.insert((*k).into(), (*v).into());
    }
    c
}

fn cost_placement(cost: serde_json::Value) -> serde_json::Value {
    json!({"replicaScheduling": {"replicaSchedulingType": "Divided"}, "cost": cost})
}

use orrery_api::cost::{CAPACITY_TYPE, CPU_CORE_HOUR, INTERRUPTION_RATE};

#[test]
fn the_cost_weight_sends_replicas_to_cheaper_clusters() {
    // Two clusters alike but for the price; 10 replicas. (used cores, replicas on cheap by
    // weight 0, 5, 10): water-filling (fleet above the high mark), score-weighted between
    // the marks, aggregation below the low mark.
    for (used, by_weight) in [(70, [5, 10, 10]), (40, [5, 7, 9]), (10, [10, 10, 10])] {
        let fleet = [
            priced(
                cluster("cheap", "us", 100, used),
                &[(CPU_CORE_HOUR, "0.02")],
            ),
            priced(cluster("dear", "eu", 100, used), &[(CPU_CORE_HOUR, "0.04")]),
        ];
        let mut got = Vec::new();
        for w in [0, 5, 10] {
            let t = T::new(cost_placement(json!({"weight": w})), 10);
            let d = t.run(&fleet);
            assert_eq!(d.unplaced, 0);
            got.push(
                shares(&d)
                    .iter()
                    .find(|(n, _)| n == "cheap")
                    .map_or(0, |x| x.1),
            );
            let why = t.explain(&fleet);
            // The plugin takes part only with a weight.
            assert_eq!(why["cheap"].scores.contains_key("Cost"), w > 0, "{why:?}");
            if w > 0 {
                assert_eq!(
                    (why["cheap"].scores["Cost"], why["dear"].scores["Cost"]),
                    (100.0, 50.0)
                );
            }
            assert_eq!(
                (why["cheap"].replica_hourly, why["dear"].replica_hourly),
                (Some(0.02), Some(0.04))
            );
        }
        assert_eq!(got, by_weight, "used {used}");
    }
}

#[test]
fn a_budget_keeps_the_hourly_cost_and_says_what_it_left_out() {
    let fleet = [
        priced(cluster("cheap", "us", 10, 5), &[(CPU_CORE_HOUR, "1")]),
        priced(cluster("dear", "eu", 100, 50), &[(CPU_CORE_HOUR, "2")]),
        cluster("unpriced", "asia", 100, 0),
    ];
    // (budget, replicas placed, error)
    for (budget, placed, error) in [
        (100.0, 10, None),
        // 3 fit in cheap under the limit (8.5 of 10), the rest in dear at 2: 3 + 2 x 7 = 17.
        (17.0, 10, None),
        (
            16.0,
            9,
            Some("1 of 10 replicas are beyond the budget of 16 an hour"),
        ),
        (2.5, 2, Some("8 of 10 replicas are beyond the budget")),
        (0.0, 0, Some("10 of 10 replicas are beyond the budget")),
    ] {
        let t = T::new(cost_placement(json!({"maxHourly": budget})), 10);
        let d = t.run(&fleet);
        let total: i64 = d.clusters.iter().map(|c| c.replicas).sum();
        assert_eq!(total, placed, "budget {budget}: {:?}", d.clusters);
        assert_eq!(d.unplaced, 10 - placed);
        match error {
            None => assert_eq!(d.error, None),
            Some(e) => assert!(
                d.error.as_deref().unwrap_or("").contains(e),
                "{:?}",
                d.error
            ),
        }
        let f = Fleet::new(fleet.to_vec());
        let cost = crate::cost_of(&f, &t.task(), &d.clusters);
        let hourly = cost.as_ref().map_or(0.0, |c| c.hourly);
        assert!(hourly <= budget + 1e-9, "{hourly} over {budget}");
        // A cluster without prices takes none of a budgeted workload's replicas, and says why.
        let why = t.explain(&fleet);
        let u = &why["unpriced"];
        assert_eq!(u.filter, "Priced");
        assert!(u.reason.contains("no price for cpu"), "{}", u.reason);
    }
    // Without a budget the unpriced cluster is a candidate as any other, and status lists it
    // apart.
    let t = T::new(cost_placement(json!({})), 10);
    assert_eq!(t.explain(&fleet)["unpriced"].filter, "");
    let placed = [
        TargetCluster {
            name: "cheap".into(),
            replicas: 2,
        },
        TargetCluster {
            name: "dear".into(),
            replicas: 1,
        },
        TargetCluster {
            name: "unpriced".into(),
            replicas: 3,
        },
    ];
    let cost = crate::cost_of(&Fleet::new(fleet.to_vec()), &t.task(), &placed).unwrap();
    assert_eq!(cost.hourly, 4.0);
    assert_eq!(cost.of("cheap"), Some(2.0));
    assert_eq!(cost.unpriced, ["unpriced"]);
}

#[test]
fn an_on_demand_floor_holds_beside_spot_capacity() {
    let fleet = [
        priced(
            cluster("spot", "us", 100, 0),
            &[
                (CPU_CORE_HOUR, "0.01"),
                (CAPACITY_TYPE, "spot"),
                (INTERRUPTION_RATE, "0.05"),
            ],
        ),
        priced(cluster("od", "eu", 100, 0), &[(CPU_CORE_HOUR, "0.04")]),
    ];
    // (floor, replicas on on-demand of 10), all placed; cost weighs so that spot is
    // preferred.
    for (floor, on_demand) in [(0.0, 0), (0.3, 3), (0.55, 6), (1.0, 10)] {
        let t = T::new(
            cost_placement(json!({"weight": 10, "minOnDemand": floor})),
            10,
        );
        let d = t.run(&fleet);
        assert_eq!(d.unplaced, 0);
        let od = shares(&d)
            .iter()
            .find(|(n, _)| n == "od")
            .map_or(0, |x| x.1);
        assert_eq!(od, on_demand, "floor {floor}: {:?}", d.clusters);
    }
    // With a budget that cannot pay for the floor, spot replicas are left out instead.
    let t = T::new(
        cost_placement(json!({"weight": 10, "minOnDemand": 0.5, "maxHourly": 0.1})),
        10,
    );
    let d = t.run(&fleet);
    let od = shares(&d)
        .iter()
        .find(|(n, _)| n == "od")
        .map_or(0, |x| x.1);
    let spot = shares(&d)
        .iter()
        .find(|(n, _)| n == "spot")
        .map_or(0, |x| x.1);
    assert!(od >= spot && od * 4 + spot <= 10, "{:?}", d.clusters);
    assert!(d.error.unwrap().contains("cost.m"));
}

/// Static weights say where replicas may go: a budget or a floor never moves one to a
/// cluster weighed 0, however cheap; it leaves the replica out instead.
#[test]
fn a_budget_and_a_floor_keep_to_static_weights() {
    let fleet = [
        priced(cluster("dear", "us", 100, 0), &[(CPU_CORE_HOUR, "2")]),
        priced(cluster("cheap", "eu", 100, 0), &[(CPU_CORE_HOUR, "1")]),
        priced(
            cluster("spot", "asia", 100, 0),
            &[(CPU_CORE_HOUR, "0.5"), (CAPACITY_TYPE, "spot")],
        ),
    ];
    let weights = |cost: serde_json::Value| {
        json!({"replicaScheduling": {"replicaSchedulingType": "Divided",
            "weightPreference": {"staticWeightList": [
                {"targetCluster": {"clusterNames": ["dear"]}, "weight": 1},
                {"targetCluster": {"clusterNames": ["spot"]}, "weight": 1},
                {"targetCluster": {"clusterNames": ["cheap"]}, "weight": 0}]}},
            "cost": cost})
    };
    // 5 + 5 cost 12.5: a budget of 10 moves replicas from dear to spot, never to cheap;
    // one of 4 leaves some out rather than use cheap.
    for (budget, unplaced) in [(10.0, 0), (4.0, 2)] {
        let t = T::new(weights(json!({"maxHourly": budget})), 10);
        let d = t.run(&fleet);
        assert!(
            shares(&d).iter().all(|(n, _)| n != "cheap"),
            "{:?}",
            d.clusters
        );
        assert_eq!(d.unplaced, unplaced, "{budget}: {:?}", d.clusters);
        let cost = crate::cost_of(&Fleet::new(fleet.to_vec()), &t.task(), &d.clusters).unwrap();
        assert!(cost.hourly <= budget, "{budget}: {:?}", d.clusters);
    }
    // A floor of 80 % on on-demand capacity: only dear is, 8 there at most from spot's 5.
    let d = T::new(weights(json!({"minOnDemand": 0.8})), 10).run(&fleet);
    assert!(
        shares(&d).iter().all(|(n, _)| n != "cheap"),
        "{:?}",
        d.clusters
    );
}

#[test]
fn a_budget_keeps_the_best_copies_of_a_duplicated_workload() {
    let fleet = [
        priced(cluster("m1", "us", 100, 0), &[(CPU_CORE_HOUR, "1")]),
        priced(cluster("m2", "eu", 100, 0), &[(CPU_CORE_HOUR, "1")]),
        priced(cluster("m3", "asia", 100, 0), &[(CPU_CORE_HOUR, "5")]),
    ];
    let t = T::new(
        json!({"replicaScheduling": {"replicaSchedulingType": "Duplicated"}, "cost": {"weight": 5, "maxHourly": 4.5}}),
        2,
    );
    let d = t.run(&fleet);
    assert_eq!(shares(&d), s(&[("m1", 2), ("m2", 2)]));
    assert!(
        d.error
            .unwrap()
            .contains("1 of 3 feasible clusters left out")
    );
}

/// A Duplicated workload's floor counts copies: the lowest-ranked spot copies go until
/// enough of the rest are on on-demand capacity.
#[test]
fn an_on_demand_floor_counts_the_copies_of_a_duplicated_workload() {
    let spot = |name: &str, region: &str| {
        priced(
            cluster(name, region, 100, 0),
            &[(CPU_CORE_HOUR, "0.5"), (CAPACITY_TYPE, "spot")],
        )
    };
    let fleet = [
        priced(cluster("od", "us", 100, 0), &[(CPU_CORE_HOUR, "1")]),
        spot("s1", "eu"),
        spot("s2", "asia"),
        spot("s3", "sa"),
    ];
    // (floor, copies kept, of which on spot)
    for (floor, copies, on_spot) in [
        (0.0, 4, 3),
        (0.25, 4, 3),
        (0.3, 3, 2),
        (0.5, 2, 1),
        (1.0, 1, 0),
    ] {
        let t = T::new(
            json!({"replicaScheduling": {"replicaSchedulingType": "Duplicated"},
                   "cost": {"weight": 5, "minOnDemand": floor}}),
            2,
        );
        let d = t.run(&fleet);
        let got = shares(&d);
        assert_eq!(got.len(), copies, "floor {floor}: {got:?}");
        assert!(got.iter().any(|(n, _)| n == "od"), "floor {floor}: {got:?}");
        assert_eq!(
            got.iter().filter(|(n, _)| n.starts_with('s')).count(),
            on_spot,
            "floor {floor}: {got:?}"
        );
        assert_eq!(
            d.error.is_some(),
            copies < 4,
            "floor {floor}: {:?}",
            d.error
        );
    }
}

#[test]
fn a_placement_that_weighs_price_fills_a_cluster_first_only_to_the_limit_by_its_peak() {
    // a (cheap) at 60 and b (dear) at 40 of 100 cores, flat forecasts, 20 replicas weighing
    // price heavily. With a's series 0.2 higher at its peak over the last season, a takes
    // only its room before the limit by that peak (60 + 20 + 5 = 85), however cheap it is;
    // without that peak, price gives it more.
    let run = |peak: Option<f64>| {
        let mut fleet = Fleet::new(vec![
            priced(cluster("a", "us", 100, 60), &[(CPU_CORE_HOUR, "0.02")]),
            priced(cluster("b", "eu", 100, 40), &[(CPU_CORE_HOUR, "0.04")]),
        ]);
        let mut fa = forecast_of(NOW, 0.6, &[0.6; 60], 0.0, DAY);
        if let Some(s) = fa.series.get_mut("cpu") {
            s.season_peak = peak;
        }
        let fb = forecast_of(NOW, 0.4, &[0.4; 60], 0.0, DAY);
        fleet.set_outlook("a", Outlook::of(&fa).map(std::sync::Arc::new));
        fleet.set_outlook("b", Outlook::of(&fb).map(std::sync::Arc::new));
        let mut p = prediction("30m", "Upper80");
        p["cost"] = json!({"weight": 10});
        let mut t = T::new(p, 20);
        t.now = NOW;
        let d = schedule(&fleet, &t.task(), &Config::default());
        let on_a = shares(&d).iter().find(|(n, _)| n == "a").map_or(0, |x| x.1);
        (on_a, d.unplaced)
    };
    assert_eq!(run(Some(0.8)), (5, 0));
    let (free, unplaced) = run(None);
    assert!(free > 5 && unplaced == 0, "{free}");
}

#[test]
fn a_budget_moves_nothing_into_a_cluster_being_shed() {
    // cheap is above the limit and sheds this workload's 10 replicas; staying within the
    // budget would be easiest there, but a cluster being shed takes nothing back: what dear
    // cannot hold within the budget is left out.
    let fleet = [
        priced(cluster("cheap", "us", 100, 90), &[(CPU_CORE_HOUR, "1")]),
        priced(cluster("dear", "eu", 100, 10), &[(CPU_CORE_HOUR, "2")]),
    ];
    let mut t = T::new(cost_placement(json!({"maxHourly": 12})), 10);
    t.previous = prev(&[("cheap", 10)]);
    t.shed = vec!["cheap".into()];
    let d = t.run(&fleet);
    assert_eq!(shares(&d), s(&[("dear", 6)]));
    assert_eq!(d.unplaced, 4);
}

#[test]
fn consolidation_moves_running_replicas_to_cheaper_room_under_the_limit() {
    // 10 replicas run on dear (30 of its cores taken besides them). (cheap's price, cores
    // taken on cheap, mode) -> replicas on cheap, consolidated.
    let p = cost_placement(json!({"weight": 5, "consolidate": true}));
    for (price, used, mode, want) in [
        // Room for all under the limit less the hysteresis (0.80): all move.
        ("0.02", 60, Mode::Consolidate, 10),
        // Room for 5 there (80 - 75): 5 move; none beyond it.
        ("0.02", 75, Mode::Consolidate, 5),
        // Already at 0.80: nothing (it sheds this placement's replicas at the limit).
        ("0.02", 80, Mode::Consolidate, 0),
        // Less than a tenth cheaper: not worth a restart.
        ("0.038", 60, Mode::Consolidate, 0),
        // A decision that is not a round of consolidation keeps what runs.
        ("0.02", 60, Mode::Steady, 0),
    ] {
        let fleet = [
            priced(cluster("cheap", "us", 100, used), &[(CPU_CORE_HOUR, price)]),
            priced(cluster("dear", "eu", 100, 40), &[(CPU_CORE_HOUR, "0.04")]),
        ];
        let mut t = T::new(p.clone(), 10);
        t.previous = vec![TargetCluster {
            name: "dear".into(),
            replicas: 10,
        }];
        t.mode = mode;
        let d = t.run(&fleet);
        assert_eq!(d.error, None, "{price} {used} {mode:?}");
        let on_cheap = shares(&d)
            .iter()
            .find(|(n, _)| n == "cheap")
            .map_or(0, |x| x.1);
        assert_eq!(
            (on_cheap, d.consolidated),
            (want, want),
            "{price} {used} {mode:?}"
        );
        assert_eq!(shares(&d).iter().map(|x| x.1).sum::<i64>(), 10);
    }
}

#[test]
fn a_consolidating_placements_new_replicas_start_where_a_round_would_move_them() {
    // 10 run on dear; 4 more are asked for. Cheap has room for 5 under 0.80.
    let fleet = [
        priced(cluster("cheap", "us", 100, 75), &[(CPU_CORE_HOUR, "0.02")]),
        priced(cluster("dear", "eu", 100, 40), &[(CPU_CORE_HOUR, "0.04")]),
    ];
    for (scale_to, want) in [
        // The 4 new start on cheap; the 10 running stay.
        (14, [("cheap", 4), ("dear", 10)]),
        // Room for 5: the sixth new one goes where the division put it.
        (16, [("cheap", 5), ("dear", 11)]),
    ] {
        let mut t = T::new(
            cost_placement(json!({"weight": 5, "consolidate": true})),
            scale_to,
        );
        t.previous = vec![TargetCluster {
            name: "dear".into(),
            replicas: 10,
        }];
        let d = t.run(&fleet);
        let want: Vec<(String, i64)> = want.iter().map(|(n, k)| (n.to_string(), *k)).collect();
        assert_eq!(shares(&d), want, "{scale_to}");
        assert_eq!(d.consolidated, 0, "nothing that ran moved");
    }
    // Without consolidation the division alone decides (here: not all on cheap).
    let mut t = T::new(cost_placement(json!({"weight": 5})), 14);
    t.previous = vec![TargetCluster {
        name: "dear".into(),
        replicas: 10,
    }];
    let d = t.run(&fleet);
    assert!(
        shares(&d).iter().any(|(n, k)| n == "dear" && *k > 10),
        "{:?}",
        shares(&d)
    );
}

#[test]
fn in_a_large_fleet_a_consolidating_placement_looks_at_the_cheapest_clusters() {
    // Eight clusters alike but for the price, the cheapest last; four are scored per decision
    // (the stride from seed 0: c0, c2, c4, c6).
    let fleet: Vec<ClusterSnapshot> = (0..8)
        .map(|k| {
            let price = if k == 7 { "0.01" } else { "0.04" };
            priced(
                cluster(&format!("c{k}"), "us", 100, 40),
                &[(CPU_CORE_HOUR, price)],
            )
        })
        .collect();
    let config = Config {
        score_sample: 4,
        ..Config::default()
    };
    for (consolidate, cheapest_seen) in [(true, true), (false, false)] {
        let mut t = T::new(
            cost_placement(json!({"weight": 5, "consolidate": consolidate})),
            4,
        );
        t.previous = vec![TargetCluster {
            name: "c0".into(),
            replicas: 4,
        }];
        t.mode = Mode::Consolidate;
        let d = schedule(&Fleet::new(fleet.clone()), &t.task(), &config);
        assert_eq!(
            shares(&d) == [("c7".to_string(), 4)],
            cheapest_seen,
            "{consolidate}: {:?}",
            shares(&d)
        );
    }
}

/// Karmada 1.18's overflow affinities: m1 is the preferred group, m2 the first overflow
/// group, m3 the second (its selector matches m1 too, which stays in the first group).
fn overflow(division: serde_json::Value) -> serde_json::Value {
    let mut p = json!({"clusterAffinities": [{
        "affinityName": "home", "clusterNames": ["m1"],
        "overflowAffinities": [
            {"affinityName": "burst", "clusterNames": ["m2"]},
            {"affinityName": "edge", "clusterNames": ["m1", "m3"]}]}]});
    p["replicaScheduling"] = division["replicaScheduling"].clone();
    p
}

#[test]
fn overflow_groups_fill_in_order_and_empty_in_reverse() {
    // 10, 20 and 40 cores, 10 used on m3: under the 0.85 limit 8, 17 and 24 replicas fit.
    let c = fleet();
    let p = overflow(divided());
    // Room in the first group: the others are held in reserve, and say so.
    let t = T::new(p.clone(), 5);
    let d = t.run(&c);
    assert_eq!((shares(&d), d.error.clone()), (s(&[("m1", 5)]), None));
    assert_eq!(d.affinity_name, "home");
    let why = t.explain(&c);
    assert_eq!(why["m2"].filter, "OverflowAffinity", "{why:?}");
    assert!(why["m2"].reason.contains("overflow group burst"), "{why:?}");
    assert!(why["m3"].reason.contains("overflow group edge"), "{why:?}");
    let f = Fleet::new(c.clone());
    let (_, filtered) = d.summary(&f, &t.task(), &Config::default(), 10);
    assert_eq!(filtered.get("OverflowAffinity"), Some(&2), "{filtered:?}");
    // Beyond the first group's room: the rest spills into the next group, then the next.
    let d = run(&c, p.clone(), 12);
    assert_eq!((shares(&d), d.error), (s(&[("m1", 8), ("m2", 4)]), None));
    let d = run(&c, p.clone(), 30);
    assert_eq!(
        (shares(&d), d.error),
        (s(&[("m1", 8), ("m2", 17), ("m3", 5)]), None)
    );
    // Scaling down: the last group gives its replicas back first.
    let mut t = T::new(p.clone(), 20);
    t.previous = prev(&[("m1", 8), ("m2", 17), ("m3", 5)]);
    assert_eq!(shares(&t.run(&c)), s(&[("m1", 8), ("m2", 12)]));
    t.replicas = 6;
    assert_eq!(shares(&t.run(&c)), s(&[("m1", 6)]));
    // More than every group holds: what fits is placed, and the rest is explained.
    let d = run(&c, p, 60);
    assert_eq!(shares(&d), s(&[("m1", 8), ("m2", 17), ("m3", 24)]));
    assert_eq!(d.unplaced, 11);
    let e = d.error.unwrap();
    assert!(
        e.starts_with("11 of 60 replicas fit in none of the groups of home (last: edge"),
        "{e}"
    );
}

#[test]
fn overflow_follows_each_dynamic_division_and_only_workloads_overflow() {
    let c = fleet();
    // Aggregated (no limit named: Karmada's free room, 10 on m1).
    let p = overflow(
        json!({"replicaScheduling": {"replicaSchedulingType": DIVIDED,
        "replicaDivisionPreference": "Aggregated"}}),
    );
    assert_eq!(shares(&run(&c, p.clone(), 10)), s(&[("m1", 10)]));
    assert_eq!(shares(&run(&c, p.clone(), 13)), s(&[("m1", 10), ("m2", 3)]));
    // The first group full: everything goes to the next one.
    let mut full = c.clone();
    full[0] = cluster("m1", "us", 10, 10);
    let d = run(&full, p, 5);
    assert_eq!((shares(&d), d.error), (s(&[("m2", 5)]), None));
    // Dynamic weight by available replicas.
    let p = overflow(
        json!({"replicaScheduling": {"replicaSchedulingType": DIVIDED,
        "replicaDivisionPreference": "Weighted", "weightPreference": {"dynamicWeight": "AvailableReplicas"}}}),
    );
    assert_eq!(shares(&run(&c, p, 14)), s(&[("m1", 10), ("m2", 4)]));
    // A kind without divisible replicas uses the inline group alone.
    let p = overflow(divided());
    let t = T::new(p, 0);
    let mut task = t.task();
    task.divisible = false;
    let d = schedule(&Fleet::new(c.clone()), &task, &Config::default());
    assert_eq!(shares(&d), s(&[("m1", 0)]));
}

/// A member's ResourceQuota of the namespace, where reported, must hold the whole set too:
/// the first component past it is named, and a set running there counts its own use back.
#[test]
fn a_whole_set_fits_the_members_resource_quota_where_reported() {
    let p = json!({"replicaScheduling": {"replicaSchedulingType": DIVIDED}});
    let mut t = T::new(p, 0);
    t.components = flink();
    let config = Config::default();
    let room = |cluster: &str, free: &str| components::QuotaRoom {
        cluster: cluster.into(),
        quota: "team".into(),
        free: [("requests.cpu".to_string(), free.parse().unwrap())].into(),
    };
    let placed = |t: &T| {
        let set = components::WholeSet::of(&t.task(), &config).unwrap();
        let whole = set.task(&t.task());
        let fl = Fleet::new(fleet());
        let d = schedule(&fl, &whole, &config);
        let why: BTreeMap<String, ClusterDecision> = d
            .explain(&fl, &whole, &config)
            .into_iter()
            .map(|x| (x.name.clone(), x))
            .collect();
        (shares(&d), why)
    };
    // Without a quota the set goes to m2 or m3; a quota of 9 cores in both turns both away,
    // naming the task managers (2 + 4 x 2 cores = 10 > 9).
    let (free, _) = placed(&t);
    assert_eq!(free.len(), 1, "{free:?}");
    t.quota_room = vec![room("m2", "9"), room("m3", "9")];
    let (none, why) = placed(&t);
    assert!(none.is_empty(), "{none:?}");
    assert_eq!(why["m3"].filter, "ResourceQuota", "{why:?}");
    assert_eq!(
        why["m3"].reason,
        "component taskmanager (4 replicas) does not fit: with the components before it, the \
         namespace's ResourceQuota team there would pass its requests.cpu"
    );
    // Room for 10 cores in m2 only: it goes there.
    t.quota_room = vec![room("m2", "10"), room("m3", "9")];
    assert_eq!(placed(&t).0, s(&[("m2", 1)]));
    // Running in m3 already, its own 10 cores are in the member's `used`: 1 core free is
    // room enough to stay.
    t.quota_room = vec![room("m2", "0"), room("m3", "1")];
    t.previous = vec![TargetCluster {
        name: "m3".into(),
        replicas: 1,
    }];
    assert_eq!(placed(&t).0, s(&[("m3", 1)]));
    // A quota of another resource, or of a resource the set does not ask for, holds nothing.
    let mut mem = room("m3", "0");
    mem.free = [("requests.memory".to_string(), "0".parse().unwrap())].into();
    t.previous.clear();
    t.quota_room = vec![room("m2", "0"), mem];
    assert_eq!(placed(&t).0, s(&[("m3", 1)]));
}

fn flink() -> Vec<components::ComponentNeed> {
    let two = |n: &str, r: i64| components::ComponentNeed {
        name: n.into(),
        replicas: r,
        request: [("cpu".to_string(), cpu(2))].into(),
    };
    vec![two("jobmanager", 1), two("taskmanager", 4)]
}

/// A workload of several components runs whole in one cluster whose room under the limit
/// holds every component, whatever division the placement names; where it does not fit, the
/// first component that does not is named.
#[test]
fn a_multi_component_workload_is_placed_whole_in_one_cluster() {
    // 10, 20 and 40 (10 used) cores under 0.85: 8.5, 17 and 24.5 cores of room; the set
    // (1 × 2 + 4 × 2 cores) is 10.
    let c = fleet();
    let p = json!({"replicaScheduling": {"replicaSchedulingType": DIVIDED,
        "weightPreference": {"staticWeightList": [
            {"targetCluster": {"clusterNames": ["m1"]}, "weight": 1},
            {"targetCluster": {"clusterNames": ["m2"]}, "weight": 1}]}}});
    let mut t = T::new(p, 0);
    t.components = flink();
    let config = Config::default();
    let set = components::WholeSet::of(&t.task(), &config).unwrap();
    let whole = set.task(&t.task());
    let fl = Fleet::new(c.clone());
    let d = schedule(&fl, &whole, &config);
    assert_eq!(d.error, None);
    assert_eq!(d.clusters.len(), 1, "one cluster: {:?}", d.clusters);
    assert_eq!(d.clusters[0].replicas, 1, "one whole set");
    let why: BTreeMap<String, ClusterDecision> = d
        .explain(&fl, &whole, &config)
        .into_iter()
        .map(|x| (x.name.clone(), x))
        .collect();
    assert_eq!(why["m1"].filter, "WaterLevel", "{why:?}");
    assert!(
        why["m1"]
            .reason
            .starts_with("component taskmanager (4 replicas) does not fit"),
        "{why:?}"
    );
    // A single task manager's pod too large for any node of m2 and m3: named too.
    let mut small = c.clone();
    for s in small.iter_mut().skip(1) {
        s.largest_node_free.insert("cpu".into(), cpu(1));
    }
    let fl = Fleet::new(small);
    let d = schedule(&fl, &whole, &config);
    assert!(d.clusters.is_empty(), "{:?}", d.clusters);
    let why = d.explain(&fl, &whole, &config);
    let m2 = why.iter().find(|x| x.name == "m2").unwrap();
    assert_eq!(
        (m2.filter.as_str(), m2.reason.as_str()),
        (
            "NodeFit",
            "no single node has room for one replica of component jobmanager (cpu too short)"
        )
    );
    // A task of one component is scheduled as it is.
    let mut one = T::new(divided(), 3);
    one.components = flink()[..1].to_vec();
    assert!(components::WholeSet::of(&one.task(), &config).is_none());
    // The set's request: every component's replicas times its request, and its pods.
    let r = components::set_request(&flink());
    assert_eq!((r["cpu"].value(), r["pods"].value()), (10, 5));
}
