//! Cost-aware placement end to end: simulated members with prices (one cheap, one dear, one
//! on spot capacity), the real server and kubectl. A placement's cost weight sends replicas
//! to the cheaper clusters, its budget leaves out what it cannot pay for and says so, its
//! on-demand floor holds beside spot capacity; every binding shows its hourly cost; the
//! fleet's cost is served (realtime, history) and exported on `/metrics`; a Cluster's own
//! prices override its member's, and a price that is no number is refused.

use crate::common;

use std::time::Duration;

use common::eventually;
use common::fleet::Fleet;
use serde_json::Value;

const CHEAP: &str =
    "nodes=4,cpu=8,memory=32Gi,load=0.1,start=100ms,cpuCoreHour=0.02,memoryGiBHour=0.002";
const DEAR: &str =
    "nodes=4,cpu=8,memory=32Gi,load=0.1,start=100ms,cpuCoreHour=0.06,memoryGiBHour=0.006";
const SPOT: &str = "nodes=4,cpu=8,memory=32Gi,load=0.1,start=100ms,cpuCoreHour=0.008,memoryGiBHour=0.001,capacityType=spot,interruptionRate=0.05";

fn deployment(name: &str, replicas: i64, cost: &str) -> String {
    common::divided_deployment(
        name,
        replicas,
        r#"{cpu: "1", memory: 1Gi}"#,
        &format!("    cost: {cost}"),
    )
}

fn raw(f: &Fleet, path: &str) -> Value {
    serde_json::from_str(&f.s.ok(&["get", "--raw", path])).unwrap()
}

/// Sets a Cluster's own prices of a core and a GiB an hour (over its member's).
fn set_prices(f: &Fleet, cluster: &str, core: &str, gib: &str) {
    f.s.ok(&[
        "patch",
        "cluster",
        cluster,
        "--type=merge",
        "-p",
        &format!(
            r#"{{"spec":{{"properties":{{"cost.orrery.io/cpu-core-hour":"{core}","cost.orrery.io/memory-gib-hour":"{gib}"}}}}}}"#
        ),
    ]);
}

fn on(f: &Fleet, name: &str, cluster: &str) -> i64 {
    f.clusters_of(&format!("{name}-deployment"))
        .iter()
        .find(|(c, _)| c == cluster)
        .map_or(0, |(_, n)| *n)
}

#[test]
fn placements_weigh_price_keep_budgets_and_floors_and_show_what_they_cost() {
    let f = Fleet::start_sims(
        &[
            ("cheap", "us-east", CHEAP),
            ("dear", "eu-west", DEAR),
            ("spot", "us-west", SPOT),
        ],
        &["--monitoring-interval", "1s"],
    );

    // Price counts heavily: replicas go to the cheapest, spot, until the floor asks for a
    // third on on-demand capacity, which the cheaper on-demand cluster takes.
    f.s.apply(&deployment("thrifty", 9, "{weight: 10, minOnDemand: 0.3}"));
    eventually(Duration::from_secs(30), "thrifty placed", || {
        f.clusters_of("thrifty-deployment")
            .iter()
            .map(|(_, n)| n)
            .sum::<i64>()
            == 9
    });
    let on_demand = on(&f, "thrifty", "cheap") + on(&f, "thrifty", "dear");
    assert!(on_demand >= 3, "{:?}", f.clusters_of("thrifty-deployment"));
    assert!(
        on(&f, "thrifty", "spot") > on_demand
            && on(&f, "thrifty", "cheap") >= on(&f, "thrifty", "dear"),
        "{:?}",
        f.clusters_of("thrifty-deployment")
    );
    // Its status: the hourly cost, in all and per cluster, and each cluster's price of a
    // replica among the decisions.
    let b = f.s.get_json(&["resourcebinding", "thrifty-deployment"]);
    let cost = &b["status"]["cost"];
    let per: f64 = cost["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["hourly"].as_f64().unwrap())
        .sum();
    // A replica: 1 core and 1 GiB.
    let expect = on(&f, "thrifty", "cheap") as f64 * 0.022
        + on(&f, "thrifty", "dear") as f64 * 0.066
        + on(&f, "thrifty", "spot") as f64 * 0.009;
    assert!(
        (cost["hourly"].as_f64().unwrap() - expect).abs() < 1e-3,
        "{b}"
    );
    assert!((per - expect).abs() < 1e-3, "{b}");
    let decisions = b["status"]["decisions"].as_array().unwrap();
    let dear = decisions.iter().find(|d| d["name"] == "dear").unwrap();
    assert_eq!(dear["replicaHourly"], 0.066, "{b}");
    assert!(dear["scores"]["Cost"].as_f64().unwrap() < 20.0, "{b}");

    // A budget of 0.05 an hour: the replicas go to the cheapest cluster with room (spot, 0.009
    // a replica), 5 of them; the other 3 are left out, and the binding says why.
    f.s.apply(&deployment("capped", 8, "{maxHourly: 0.05}"));
    eventually(Duration::from_secs(30), "capped decided", || {
        let b = f.s.get_json(&["resourcebinding", "capped-deployment"]);
        b["status"]["unplacedReplicas"].as_i64().unwrap_or(0) > 0
    });
    let b = f.s.get_json(&["resourcebinding", "capped-deployment"]);
    assert_eq!(
        f.clusters_of("capped-deployment"),
        [("spot".to_string(), 5)],
        "{b}"
    );
    assert_eq!(b["status"]["unplacedReplicas"], 3, "{b}");
    assert_eq!(b["status"]["cost"]["hourly"], 0.045, "{b}");
    let cond = b["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Scheduled")
        .unwrap();
    assert!(
        cond["message"]
            .as_str()
            .unwrap()
            .contains("3 of 8 replicas are beyond the budget of 0.05 an hour"),
        "{cond}"
    );

    // Bad input: a cost weight out of range, a price that is no number.
    let refused = f.s.fails_stdin(
        &["apply", "-f", "-"],
        &deployment("greedy", 1, "{weight: 11}"),
    );
    assert!(refused.contains("cost.weight"), "{refused}");
    let refused = f.s.fails(&[
        "patch",
        "cluster",
        "dear",
        "--type=merge",
        "-p",
        r#"{"spec":{"properties":{"cost.orrery.io/cpu-core-hour":"cheap"}}}"#,
    ]);
    assert!(refused.contains("is not a price"), "{refused}");

    // A Cluster's own price overrides its member's: dear becomes the cheapest on-demand
    // cluster, and a new placement prefers it.
    set_prices(&f, "dear", "0.01", "0.001");
    // The scheduler reads the new price as the Cluster changes; a decision made before it
    // did is made again.
    let mut tries = 0;
    loop {
        tries += 1;
        f.s.apply(&deployment("probe", 1, "{weight: 10, minOnDemand: 1}"));
        eventually(Duration::from_secs(30), "probe decided", || {
            f.s.kubectl(&["get", "resourcebinding", "probe-deployment"])
                .status
                .success()
                && f.s.get_json(&["resourcebinding", "probe-deployment"])["status"]["decisions"]
                    .is_array()
        });
        let b = f.s.get_json(&["resourcebinding", "probe-deployment"]);
        let dear = b["status"]["decisions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["name"] == "dear")
            .cloned()
            .unwrap();
        if dear["replicaHourly"] == 0.011 {
            break;
        }
        assert!(tries < 5, "the new price never reached the scheduler: {b}");
        f.s.ok(&["delete", "deployment", "probe"]);
        f.s.ok(&["delete", "resourceplacementpolicy", "probe"]);
        eventually(Duration::from_secs(20), "probe's binding gone", || {
            !f.s.kubectl(&["get", "resourcebinding", "probe-deployment"])
                .status
                .success()
        });
    }
    assert_eq!(f.clusters_of("probe-deployment"), [("dear".to_string(), 1)]);

    // The fleet's cost: now (realtime, per cluster) and over time (history), and on /metrics.
    eventually(Duration::from_secs(20), "the fleet's cost served", || {
        let rt = raw(&f, "/api/v1/monitor/realtime");
        let h = raw(&f, "/api/v1/monitor/history?maxEntries=3");
        let sum: f64 = rt["clusters"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|c| c["hourlyCost"].as_f64())
            .sum();
        rt["hourlyCost"]
            .as_f64()
            .is_some_and(|x| x > 0.0 && (x - sum).abs() < 1e-3)
            && h["points"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["hourlyCost"].as_f64().is_some_and(|x| x > 0.0))
    });
    let metrics = f.s.ok(&["get", "--raw", "/metrics"]);
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("orrery_fleet_hourly_cost ") && !l.ends_with(" 0.0")),
        "{metrics}"
    );
    assert!(
        metrics.contains("orrery_cluster_hourly_cost{cluster=\"spot\"}"),
        "{metrics}"
    );
}

/// Consolidation end to end: a placement with `cost.consolidate` moves its running replicas
/// to a cluster once it becomes a tenth cheaper (here: its Cluster's own price drops); one
/// without it stays where it runs; the move is a decision of its own in the history, and the
/// replicas' old copies are kept while the new ones start.
#[test]
fn consolidating_placements_follow_a_price_drop_and_others_stay() {
    let f = Fleet::start_sims(
        &[("cheap", "us-east", CHEAP), ("dear", "eu-west", DEAR)],
        &[
            "--monitoring-interval",
            "1s",
            "--consolidate-interval",
            "2s",
        ],
    );
    let refused = f.s.fails_stdin(
        &["apply", "-f", "-"],
        &deployment("aimless", 1, "{consolidate: true}"),
    );
    assert!(refused.contains("cost.consolidate"), "{refused}");

    // Both run on the cheaper cluster (their six cores leave it well under the limit).
    f.s.apply(&deployment("mover", 6, "{weight: 10, consolidate: true}"));
    f.s.apply(&deployment("stayer", 6, "{weight: 10}"));
    for name in ["mover", "stayer"] {
        eventually(Duration::from_secs(30), "placed", || {
            on(&f, name, "cheap") + on(&f, name, "dear") == 6
        });
    }
    let stayer = f.clusters_of("stayer-deployment");
    assert!(on(&f, "mover", "cheap") > on(&f, "mover", "dear"));

    // The dear cluster's contract now costs a quarter of the cheap one's.
    set_prices(&f, "dear", "0.005", "0.0005");
    eventually(Duration::from_secs(60), "mover consolidated", || {
        on(&f, "mover", "dear") == 6
    });
    let b = f.s.get_json(&["resourcebinding", "mover-deployment"]);
    // Make-before-break: the copy on cheap stays while the moved replicas start.
    let evictions = b["spec"]["evictions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        evictions
            .iter()
            .any(|e| e["cluster"] == "cheap"
                && e["reason"].as_str().unwrap().contains("Consolidate")),
        "{b}"
    );
    let h = raw(&f, "/api/v1/history/schedules?maxEntries=100");
    assert!(
        h["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["trigger"] == "Consolidate" && e["binding"] == "default/mover-deployment"),
        "{h}"
    );
    // Several rounds later the other placement still runs where it did.
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(f.clusters_of("stayer-deployment"), stayer);
    let h = raw(&f, "/api/v1/history/schedules?maxEntries=100");
    assert!(
        !h["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["binding"] == "default/stayer-deployment" && e["trigger"] == "Consolidate"),
        "{h}"
    );
}
