//! Hierarchies deeper than two levels: a regional Orrery joins a global one as a member
//! (`orrery agent --backend orrery`), takes what it is sent as templates, divides them among
//! its own members with its own scheduler, and reports its fleet summed; status and water
//! levels flow up, and each level explains its own decision.

use crate::common;

use std::time::Duration;

use common::fleet::SIM;
use common::{Agent, Server, divided_deployment, eventually};

#[test]
fn a_deployment_at_the_root_of_three_levels_runs_in_the_leaves_and_its_status_sums_up() {
    let root = Server::start();
    let mid = Server::start();
    let mut leaves = Vec::new();
    for (name, region) in [("leaf-1", "r1"), ("leaf-2", "r2")] {
        let token = mid.token(name);
        leaves.push(Agent::start(
            &mid,
            name,
            &[
                "--cluster",
                name,
                "--token",
                &token,
                "--simulate",
                SIM,
                "--region",
                region,
                "--heartbeat-interval",
                "1s",
                "--report-interval",
                "100ms",
            ],
        ));
    }
    eventually(Duration::from_secs(60), "the leaves Ready in mid", || {
        ["leaf-1", "leaf-2"]
            .iter()
            .all(|c| mid.cluster_condition(c, "Ready") == "True")
    });
    // mid joins root as one member.
    let token = root.token("mid");
    let kubeconfig = mid.kubeconfig.display().to_string();
    let _mid_agent = Agent::start(
        &root,
        "mid",
        &[
            "--cluster",
            "mid",
            "--token",
            &token,
            "--kubeconfig",
            &kubeconfig,
            "--backend",
            "orrery",
            "--region",
            "global",
            "--heartbeat-interval",
            "1s",
            "--report-interval",
            "100ms",
        ],
    );
    eventually(Duration::from_secs(60), "mid Ready in root", || {
        root.cluster_condition("mid", "Ready") == "True"
    });
    // Its fleet, summed: two leaves of four 8-core nodes.
    eventually(
        Duration::from_secs(20),
        "mid's capacity and water level",
        || {
            let c = root.get_json(&["cluster", "mid", "-o", "json"]);
            c["status"]["resourceSummary"]["allocatable"]["cpu"] == "64"
                && c["status"]["nodeSummary"]["totalNum"] == 8
                && c["status"]["properties"]["hierarchy.orrery.io/members"] == "2"
                && c["status"]["waterLevel"]["overall"]
                    .as_f64()
                    .is_some_and(|w| w > 0.0)
        },
    );

    root.apply(&divided_deployment(
        "web",
        6,
        "{cpu: 100m, memory: 64Mi}",
        "    clusterAffinity: {clusterNames: [mid]}",
    ));
    let placed = |s: &Server| s.clusters_of("web-deployment");
    eventually(
        Duration::from_secs(60),
        "web divided among the leaves",
        || {
            let p = placed(&mid);
            p.iter().map(|(_, r)| r).sum::<i64>() == 6
                && p.iter().all(|(c, _)| c.starts_with("leaf-"))
        },
    );
    eventually(
        Duration::from_secs(60),
        "web's status summed up to the root",
        || {
            root.get_json(&["deployment", "web", "-n", "default", "-o", "json"])["status"]["readyReplicas"]
                == 6
        },
    );
    assert_eq!(placed(&root), vec![("mid".to_string(), 6)]);
    // Each level explains its own decision.
    for (s, cluster) in [(&root, "mid"), (&mid, "leaf-")] {
        let b = s.get_json(&[
            "resourcebinding",
            "web-deployment",
            "-n",
            "default",
            "-o",
            "json",
        ]);
        let decisions = b["status"]["decisions"].as_array().unwrap();
        assert!(
            decisions
                .iter()
                .any(|d| d["name"].as_str().unwrap().starts_with(cluster)
                    && d["reason"] == "selected"),
            "{b:#}"
        );
    }

    // A change at the root goes all the way down, and its status comes back up.
    root.ok(&[
        "scale",
        "deployment",
        "web",
        "-n",
        "default",
        "--replicas",
        "10",
    ]);
    eventually(Duration::from_secs(60), "ten ready at the root", || {
        placed(&mid).iter().map(|(_, r)| r).sum::<i64>() == 10
            && root.get_json(&["deployment", "web", "-n", "default", "-o", "json"])["status"]["readyReplicas"]
                == 10
    });
    // Deleted at the root: gone from mid, and from the leaves.
    root.ok(&["delete", "deployment", "web", "-n", "default"]);
    eventually(Duration::from_secs(60), "web gone from mid", || {
        !mid.kubectl(&["get", "deployment", "web", "-n", "default"])
            .status
            .success()
    });
    eventually(
        Duration::from_secs(60),
        "web's bindings gone from mid",
        || {
            !mid.kubectl(&["get", "resourcebinding", "web-deployment", "-n", "default"])
                .status
                .success()
        },
    );
}
