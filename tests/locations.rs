//! Locations end to end (the Datum seed): members labelled with a city code are grouped into
//! Locations that `kubectl get locations` lists; a placement names locations with a label
//! selector or spreads over them by the label, and the binding's status sums replicas per
//! location.

use crate::common;

use std::time::Duration;

use common::fleet::Fleet;
use common::{divided_deployment, eventually};
use serde_json::Value;

const CITY: &str = "topology.datum.net/city-code";

fn locations_of(f: &Fleet, binding: &str) -> Value {
    f.s.get_json(&["resourcebinding", binding, "-n", "default", "-o", "json"])["status"]
        ["locations"]
        .clone()
}

#[test]
fn members_group_into_locations_and_placements_name_and_spread_over_them() {
    let f = Fleet::start(&[("dfw-1", "us"), ("dfw-2", "us"), ("lhr-1", "eu")]);
    for (c, code) in [("dfw-1", "DFW"), ("dfw-2", "DFW"), ("lhr-1", "LHR")] {
        f.s.ok(&["label", "cluster", c, &format!("{CITY}={code}")]);
    }
    eventually(Duration::from_secs(20), "two locations", || {
        f.s.ok(&["get", "locations", "-o", "name"]).trim()
            == "location.multicluster.io/dfw\nlocation.multicluster.io/lhr"
    });
    eventually(
        Duration::from_secs(20),
        "dfw's members ready and summed",
        || {
            let dfw = f.s.get_json(&["location", "dfw", "-o", "json"]);
            dfw["status"]["readyClusters"] == 2
                && dfw["status"]["allocatable"]["cpu"] == "64"
                && dfw["status"]["clusterNames"] == "dfw-1,dfw-2"
        },
    );
    let table = f.s.ok(&["get", "loc"]);
    let header = table.lines().next().unwrap();
    for col in ["CITY", "CLUSTERS", "READY", "CPU", "MEMORY", "WATER LEVEL"] {
        assert!(header.contains(col), "{table}");
    }
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("lhr") && l.contains("LHR") && l.contains("lhr-1")),
        "{table}"
    );

    // Naming a location: a label selector on the city code.
    f.s.apply(&divided_deployment(
        "shop",
        6,
        "{cpu: 100m, memory: 64Mi}",
        &format!(
            "    clusterAffinity:\n      labelSelector:\n        matchExpressions: [{{key: {CITY}, operator: In, values: [DFW]}}]"
        ),
    ));
    eventually(Duration::from_secs(30), "shop summed in DFW", || {
        let l = locations_of(&f, "shop-deployment");
        l.as_array().is_some_and(|l| l.len() == 1)
            && l[0]["location"] == "DFW"
            && l[0]["replicas"] == 6
            && l[0]["readyReplicas"] == 6
            && l[0]["healthyClusters"] == l[0]["clusters"].as_array().unwrap().len()
    });
    let placed = f.clusters_of("shop-deployment");
    assert!(
        placed.iter().all(|(c, _)| c.starts_with("dfw")),
        "{placed:?}"
    );

    // Spreading over locations.
    f.s.apply(&divided_deployment(
        "api",
        4,
        "{cpu: 100m, memory: 64Mi}",
        &format!("    spreadConstraints: [{{spreadByLabel: {CITY}, minGroups: 2, maxGroups: 2}}]"),
    ));
    eventually(Duration::from_secs(30), "api in both locations", || {
        let l = locations_of(&f, "api-deployment");
        l.as_array().is_some_and(|l| {
            l.len() == 2
                && l[0]["location"] == "DFW"
                && l[1]["location"] == "LHR"
                && l.iter()
                    .map(|x| x["replicas"].as_i64().unwrap())
                    .sum::<i64>()
                    == 4
        })
    });

    // A member that leaves its city leaves its Location; the last one takes it away.
    f.s.ok(&["label", "cluster", "lhr-1", &format!("{CITY}-")]);
    eventually(Duration::from_secs(20), "lhr gone", || {
        f.s.ok(&["get", "locations", "-o", "name"]).trim() == "location.multicluster.io/dfw"
    });
}
