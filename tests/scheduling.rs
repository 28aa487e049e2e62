//! The water level scheduler end to end: a real server, three agents whose simulated members
//! carry different background loads, the real kubectl. Replicas land as the water levels say,
//! move away from a cluster whose load rises past the shed mark, leave a cluster that goes dark
//! make-before-break, and every decision is in the schedule history.

use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::eventually;
use common::fleet::Fleet;
use serde_json::Value;

const WEB: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: 12
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - name: web
        image: nginx:1.25
        resources: {requests: {cpu: 250m, memory: 128Mi}}
---
apiVersion: multicluster.io/v1alpha1
kind: ResourcePlacementPolicy
metadata: {name: web, namespace: default}
spec:
  resourceSelector: {apiVersion: apps/v1, kind: Deployment, name: web, namespace: default}
  targetClusters:
  - selectorType: label
    values: ["tier=app"]
  placement:
    replicaScheduling: {replicaSchedulingType: Divided}
"#;

/// Pods take a second to start, so that a move that broke the old copy before the new one
/// was ready would be seen.
fn sim(load: f64) -> String {
    format!("nodes=4,cpu=8,memory=32Gi,load={load},start=1s")
}

/// Ready replicas per member, as the members report them.
fn ready(f: &Fleet, members: &[&str]) -> i64 {
    members
        .iter()
        .filter_map(|m| f.find(m, "Deployment", "web"))
        .map(|d| d["status"]["readyReplicas"].as_i64().unwrap_or(0))
        .sum()
}

/// Replicas per member, as the members run them.
fn running(f: &Fleet, members: &[&str]) -> BTreeMap<String, i64> {
    members
        .iter()
        .filter_map(|m| {
            let d = f.find(m, "Deployment", "web")?;
            Some((m.to_string(), d["spec"]["replicas"].as_i64().unwrap_or(0)))
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// Replicas per cluster in the binding's decision.
fn decided(f: &Fleet) -> BTreeMap<String, i64> {
    decided_for(f, "web")
}

/// Replicas per cluster in the decision for Deployment `name`.
fn decided_for(f: &Fleet, name: &str) -> BTreeMap<String, i64> {
    let rb =
        f.s.get_json(&["resourcebinding", &format!("{name}-deployment")]);
    rb["spec"]["clusters"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|c| {
                    (
                        c["name"].as_str().unwrap().to_string(),
                        c["replicas"].as_i64().unwrap(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn replicas_follow_the_water_levels() {
    let (quiet, busy, busier) = (sim(0.2), sim(0.45), sim(0.6));
    let mut f = Fleet::start_sims(
        &[
            ("quiet", "us-east", quiet.as_str()),
            ("busy", "eu-west", busy.as_str()),
            ("busier", "ap-south", busier.as_str()),
        ],
        &[
            "--shed-window",
            "2s",
            "--cluster-grace-period",
            "2s",
            "--cluster-eviction-timeout",
            "2s",
        ],
    );
    let members = ["quiet", "busy", "busier"];
    for m in members {
        f.s.ok(&["label", "cluster", m, "tier=app"]);
    }
    f.s.apply(WEB);
    // The fleet is at about 0.42: score-weighted division, the emptiest cluster first.
    eventually(Duration::from_secs(20), "12 replicas running", || {
        running(&f, &members).values().sum::<i64>() == 12
    });
    let first = decided(&f);
    assert!(
        first["quiet"] > first.get("busy").copied().unwrap_or(0)
            && first.get("busy").copied().unwrap_or(0) >= first.get("busier").copied().unwrap_or(0),
        "{first:?}"
    );
    let rb = f.s.get_json(&["resourcebinding", "web-deployment"]);
    assert_eq!(rb["status"]["strategy"], "ScoreWeighted", "{rb}");
    // Every cluster is explained, with each plugin's score.
    let why: Vec<&Value> = rb["status"]["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .collect();
    assert_eq!(why.len(), 3, "{rb}");
    assert!(
        why.iter()
            .all(|d| d["scores"]["Balance"].is_number() && d["score"].is_number()),
        "{rb}"
    );
    // kubectl describe shows them too.
    let described = f.s.ok(&["describe", "resourcebinding", "web-deployment"]);
    assert!(described.contains("Balance"), "{described}");

    // The DRO-DS task interface: ask for a fresh decision, then read its status.
    let task = common::write(
        &f.s.dir,
        "task.json",
        r#"{"resource": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "default", "name": "web"}}"#,
    );
    let out = f.s.ok(&[
        "create",
        "--raw",
        "/api/v1/bindings",
        "-f",
        task.to_str().unwrap(),
    ]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["bindingId"], "default.web-deployment", "{v}");
    eventually(Duration::from_secs(10), "the task answered", || {
        let raw = f.s.ok(&[
            "get",
            "--raw",
            "/api/v1/bindings/default.web-deployment/status",
        ]);
        let st: Value = serde_json::from_str(&raw).unwrap();
        st["state"] == "Scheduled"
            && st["clusters"].as_array().is_some_and(|c| !c.is_empty())
            && st["reasons"].as_array().is_some_and(|r| r.len() == 3)
            && st["taskId"].as_str().is_some_and(|t| !t.is_empty())
    });
    let missing = common::write(
        &f.s.dir,
        "missing.json",
        r#"{"resource": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "default", "name": "nobody"}}"#,
    );
    let out = f.s.kubectl(&[
        "create",
        "--raw",
        "/api/v1/bindings",
        "-f",
        missing.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("NotFound"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eventually(Duration::from_secs(20), "12 replicas still running", || {
        running(&f, &members).values().sum::<i64>() == 12
    });
    let first = decided(&f);

    // The quiet cluster's background load jumps past the shed mark: after the shed window its
    // share moves to the others, and nothing is lost.
    f.set_load("quiet", 0.98);
    eventually(Duration::from_secs(30), "quiet sheds its replicas", || {
        let d = decided(&f);
        d.get("quiet").copied().unwrap_or(0) < first["quiet"] && d.values().sum::<i64>() == 12
    });
    eventually(
        Duration::from_secs(20),
        "the members run the new shares",
        || {
            let r = running(&f, &members);
            r.get("quiet").copied().unwrap_or(0) < first["quiet"] && r.values().sum::<i64>() == 12
        },
    );

    // `busy` goes dark: once it is tainted NoExecute its replicas move. The old copy stays
    // (an eviction with a deadline) until the new placement is healthy.
    let before = decided(&f);
    assert!(before.get("busy").copied().unwrap_or(0) > 0, "{before:?}");
    f.agents[1].1.kill9();
    // Busy's Work goes only once the others have all 12 ready: whenever it is seen gone,
    // the readiness read after must already be complete (it only grows meanwhile).
    let busy_work = || {
        f.s.kubectl(&[
            "get",
            "work",
            "-n",
            "orrery-cluster-busy",
            "default.web-deployment",
        ])
        .status
        .success()
    };
    // Looked at the moment the decision moves: the new replicas take a second to start.
    let mut seen_kept = false;
    eventually(Duration::from_secs(30), "busy's replicas move", || {
        let d = decided(&f);
        let moved = !d.contains_key("busy") && d.values().sum::<i64>() == 12;
        seen_kept |= moved && busy_work();
        moved
    });
    let rb = f.s.get_json(&["resourcebinding", "web-deployment"]);
    let evictions = rb["spec"]["evictions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        evictions.iter().any(|e| e["cluster"] == "busy"
            && e["rescheduled"] == true
            && e["keepUntil"].is_string()),
        "make-before-break keeps the old copy a while: {rb}"
    );
    eventually(
        Duration::from_secs(20),
        "the others run all 12, then busy's Work goes",
        || {
            if busy_work() {
                seen_kept = true;
                return false;
            }
            let r = ready(&f, &["quiet", "busier"]);
            assert_eq!(r, 12, "busy's Work went before the new replicas were ready");
            true
        },
    );
    assert!(
        seen_kept,
        "busy's Work was kept while the new replicas started"
    );

    // The schedule history has every decision, newest first, with its reasons.
    let raw =
        f.s.ok(&["get", "--raw", "/api/v1/history/schedules?maxEntries=50"]);
    let h: Value = serde_json::from_str(&raw).unwrap();
    let entries = h["entries"].as_array().unwrap();
    let ours: Vec<&Value> = entries
        .iter()
        .filter(|e| e["binding"] == "default/web-deployment")
        .collect();
    let triggers: Vec<&str> = ours
        .iter()
        .map(|e| e["trigger"].as_str().unwrap())
        .collect();
    assert!(triggers.contains(&"Shed"), "{triggers:?}");
    assert!(triggers.contains(&"ClustersChanged"), "{triggers:?}");
    assert_eq!(
        *triggers.last().unwrap(),
        "SpecChanged",
        "the first decision is oldest: {triggers:?}"
    );
    let t0 = ours.last().unwrap();
    assert_eq!(t0["result"], "Scheduled", "{t0}");
    assert!(t0["decisions"].as_array().unwrap().len() == 3, "{t0}");
    assert!(
        ours.iter()
            .all(|e| e["id"].as_str().is_some_and(|i| !i.is_empty()))
    );
    // Bad parameters get the DRO-DS error body.
    let out = f.s.kubectl(&[
        "get",
        "--raw",
        "/api/v1/history/schedules?startTime=yesterday",
    ]);
    assert!(!out.status.success());
    // maxEntries caps, time windows filter.
    let raw =
        f.s.ok(&["get", "--raw", "/api/v1/history/schedules?maxEntries=1"]);
    let h: Value = serde_json::from_str(&raw).unwrap();
    assert_eq!(h["entries"].as_array().unwrap().len(), 1);
    let raw = f.s.ok(&[
        "get",
        "--raw",
        "/api/v1/history/schedules?endTime=2000-01-01T00:00:00Z",
    ]);
    let h: Value = serde_json::from_str(&raw).unwrap();
    assert_eq!(h["count"], 0, "{h}");
}

#[test]
fn a_shed_mark_below_the_placement_limit_is_refused_at_start() {
    // Every cluster filled to the limit would shed at once, round after round.
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_orrery"))
        .args(["server", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .args(["--water-level-limit", "0.8", "--shed-mark", "0.7"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--shed-mark 0.7 is below --water-level-limit 0.8"),
        "{err}"
    );
    // Nothing was created for a server that never started.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn score_weights_that_cannot_be_read_are_refused_at_start() {
    for (weights, why) in [
        (
            "balance=-1",
            "the weight of balance must be a number of at least 0, not `-1`",
        ),
        ("cost=2", "unknown score plugin `cost`"),
        (
            "headroom=0,balance=0,locality=0,priority=0,network=0",
            "every weight is 0",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_orrery"))
            .args(["server", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.path())
            .args(["--score-weights", weights])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{weights}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--score-weights") && err.contains(why),
            "{err}"
        );
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}

/// A binding that fits nowhere waits Unschedulable, with the reason, and is placed once the
/// fleet makes room (the member's load falls), without anything else asking.
#[test]
fn an_unschedulable_binding_is_placed_once_room_is_made() {
    let hot = sim(0.95);
    let f = Fleet::start_sims(&[("only", "us-east", hot.as_str())], &[]);
    f.s.ok(&["label", "cluster", "only", "tier=app"]);
    f.s.apply(WEB);
    let scheduled = || {
        f.s.ok(&[
            "get",
            "resourcebinding",
            "web-deployment",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Scheduled\")].status} {.status.conditions[?(@.type==\"Scheduled\")].message}",
        ])
    };
    eventually(Duration::from_secs(20), "Unschedulable, with why", || {
        let s = scheduled();
        s.starts_with("False") && s.contains("filtered: 1 WaterLevel")
    });
    assert!(f.find("only", "Deployment", "web").is_none());
    f.set_load("only", 0.1);
    eventually(Duration::from_secs(30), "placed once room is made", || {
        scheduled().starts_with("True")
            && f.find("only", "Deployment", "web")
                .is_some_and(|d| d["spec"]["replicas"] == 12)
    });
}

/// The same across a restart: a binding left Unschedulable by the server before it was
/// killed is tried again by the next one once room is made (its generation was already
/// decided, and the next server did not know it waited for room: it stayed unplaced).
#[test]
fn an_unschedulable_binding_is_tried_again_after_a_restart() {
    let hot = sim(0.95);
    let mut f = Fleet::start_sims(&[("only", "us-east", hot.as_str())], &[]);
    f.s.ok(&["label", "cluster", "only", "tier=app"]);
    f.s.apply(WEB);
    let scheduled = |f: &Fleet| {
        f.s.ok(&[
            "get",
            "resourcebinding",
            "web-deployment",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Scheduled\")].status}",
        ])
    };
    eventually(Duration::from_secs(20), "Unschedulable", || {
        scheduled(&f) == "False"
    });
    f.s.kill9();
    // Room is made while no server runs: nothing but the binding's status says it waits.
    f.set_load("only", 0.1);
    f.s.restart();
    eventually(Duration::from_secs(30), "placed once room is made", || {
        scheduled(&f) == "True"
            && f.find("only", "Deployment", "web")
                .is_some_and(|d| d["spec"]["replicas"] == 12)
    });
}

/// A cluster that comes back after its replicas moved away gets its share back only from a
/// placement that asks for it (`rebalanceOnRecovery`); elsewhere what runs stays put.
#[test]
fn a_recovered_cluster_takes_a_share_back_only_when_asked_or_rebalanced() {
    // Both halfway loaded: the fleet sits between the water level marks, so replicas are
    // divided by score rather than gathered into one cluster.
    let load = sim(0.45);
    let mut f = Fleet::start_sims(
        &[
            ("east", "us-east", load.as_str()),
            ("west", "eu-west", load.as_str()),
        ],
        &[
            "--cluster-grace-period",
            "2s",
            "--cluster-eviction-timeout",
            "2s",
        ],
    );
    for m in ["east", "west"] {
        f.s.ok(&["label", "cluster", m, "tier=app"]);
    }
    let app = |name: &str, rebalance: bool| {
        WEB.replace("name: web,", &format!("name: {name},"))
            .replace("kind: Deployment, name: web,", &format!("kind: Deployment, name: {name},"))
            .replace(
                "replicaScheduling: {replicaSchedulingType: Divided}",
                &format!("replicaScheduling: {{replicaSchedulingType: Divided}}\n    rebalanceOnRecovery: {rebalance}"),
            )
    };
    f.s.apply(&app("again", true));
    f.s.apply(&app("stays", false));
    eventually(Duration::from_secs(20), "both spread over both", || {
        ["again", "stays"].iter().all(|n| {
            let d = decided_for(&f, n);
            d.len() == 2 && d.values().sum::<i64>() == 12
        })
    });
    f.agents[1].1.kill9();
    eventually(Duration::from_secs(30), "everything moved to east", || {
        ["again", "stays"]
            .iter()
            .all(|n| decided_for(&f, n) == BTreeMap::from([("east".to_string(), 12)]))
    });
    f.agents[1].1.restart();
    eventually(
        Duration::from_secs(30),
        "west takes its share of again back",
        || decided_for(&f, "again").get("west").copied().unwrap_or(0) > 0,
    );
    assert_eq!(
        decided_for(&f, "stays"),
        BTreeMap::from([("east".to_string(), 12)]),
        "without rebalanceOnRecovery what runs stays put"
    );

    // Karmada's WorkloadRebalancer divides `stays` afresh, once; a workload no policy
    // places fails with ReferencedBindingNotFound; the rebalancer goes after its TTL.
    f.s.apply(
        r#"
apiVersion: apps.karmada.io/v1alpha1
kind: WorkloadRebalancer
metadata: {name: spread-again}
spec:
  ttlSecondsAfterFinished: 3
  workloads:
  - {apiVersion: apps/v1, kind: Deployment, name: stays, namespace: default}
  - {apiVersion: apps/v1, kind: Deployment, name: nowhere, namespace: default}
"#,
    );
    eventually(
        Duration::from_secs(20),
        "west takes its share of stays once rebalanced",
        || decided_for(&f, "stays").get("west").copied().unwrap_or(0) > 0,
    );
    let wr = f.s.get_json(&["workloadrebalancer", "spread-again"]);
    let results: Vec<(String, String, String)> = wr["status"]["observedWorkloads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            let s = |v: &Value| v.as_str().unwrap_or("").to_string();
            (s(&o["workload"]["name"]), s(&o["result"]), s(&o["reason"]))
        })
        .collect();
    assert_eq!(
        results,
        [
            (
                "nowhere".into(),
                "Failed".into(),
                "ReferencedBindingNotFound".into()
            ),
            ("stays".into(), "Successful".into(), String::new()),
        ]
    );
    assert!(wr["status"]["finishTime"].is_string(), "{wr}");
    let asked = |f: &Fleet| {
        f.s.get_json(&["resourcebinding", "stays-deployment"])["metadata"]["annotations"]
            ["multicluster.io/reschedule"]
            .clone()
    };
    let stamp = asked(&f);
    assert_eq!(
        stamp, wr["metadata"]["creationTimestamp"],
        "asked as of its creation"
    );
    eventually(
        Duration::from_secs(20),
        "the rebalancer is gone after its TTL",
        || {
            !f.s.kubectl(&["get", "workloadrebalancer", "spread-again"])
                .status
                .success()
        },
    );
    assert_eq!(asked(&f), stamp, "asked once");
}

/// A wide outage evicts at the fleet's pace (`--eviction-rate`): the workloads of three dark
/// clusters move one cluster's worth at a time, ten seconds apart, never faster, and the
/// waiting ones are counted on /metrics.
#[test]
fn a_wide_outage_evicts_at_the_set_rate() {
    let load = sim(0.45);
    let names = ["a", "b", "c", "d", "e"];
    let members: Vec<(&str, &str, &str)> = names
        .iter()
        .map(|n| (*n, "us-east", load.as_str()))
        .collect();
    let mut f = Fleet::start_sims(
        &members,
        &[
            "--cluster-grace-period",
            "2s",
            "--cluster-eviction-timeout",
            "1s",
            "--eviction-rate",
            "6",
            "--eviction-burst",
            "1",
        ],
    );
    for m in names {
        f.s.ok(&["label", "cluster", m, "tier=app"]);
    }
    f.s.apply(WEB);
    eventually(Duration::from_secs(30), "placed", || {
        decided_for(&f, "web").values().sum::<i64>() == 12
    });
    for i in 0..3 {
        f.agents[i].1.kill9();
    }
    let noexecute = |f: &Fleet, m: &str| -> Option<i64> {
        let c = f.s.get_json(&["cluster", m]);
        c["spec"]["taints"].as_array()?.iter().find_map(|t| {
            (t["effect"] == "NoExecute")
                .then(|| t["timeAdded"].as_str()?.parse::<orrery_api::Time>().ok())
                .flatten()
                .map(|t| t.unix_seconds())
        })
    };
    let mut saw_waiting = false;
    let deadline = Instant::now() + Duration::from_secs(60);
    let times = loop {
        let t: Vec<Option<i64>> = names[..3].iter().map(|m| noexecute(&f, m)).collect();
        if !saw_waiting && t.iter().any(Option::is_some) && t.iter().any(Option::is_none) {
            let metrics = f.s.ok(&["get", "--raw", "/metrics"]);
            saw_waiting |= metrics
                .lines()
                .any(|l| l.starts_with("orrery_cluster_evictions_waiting ") && !l.ends_with(" 0"));
        }
        if t.iter().all(Option::is_some) {
            let mut t: Vec<i64> = t.into_iter().flatten().collect();
            t.sort();
            break t;
        }
        assert!(
            Instant::now() < deadline,
            "not every dark cluster evicted: {t:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    // One cluster every 10 s (6 a minute, a burst of 1): no faster.
    for w in times.windows(2) {
        assert!(w[1] - w[0] >= 9, "evicted faster than the rate: {times:?}");
    }
    assert!(
        saw_waiting,
        "the waiting evictions were not counted on /metrics"
    );
    eventually(
        Duration::from_secs(30),
        "everything on the two left",
        || {
            let d = decided_for(&f, "web");
            d.keys().all(|c| c == "d" || c == "e") && d.values().sum::<i64>() == 12
        },
    );
    let metrics = f.s.ok(&["get", "--raw", "/metrics"]);
    assert!(
        metrics.contains("orrery_cluster_evictions_total 3"),
        "{metrics}"
    );
}

/// Ready replicas of `web` over all members, as the binding aggregates their reports (an
/// agent started again serves its admin endpoint on another port), and its DisruptionBudget
/// condition.
fn budget_view(f: &Fleet) -> (i64, Option<Value>, Value) {
    let rb = f.s.get_json(&["resourcebinding", "web-deployment"]);
    let ready = rb["status"]["aggregatedStatus"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|i| i["status"]["readyReplicas"].as_i64().unwrap_or(0))
                .sum()
        })
        .unwrap_or(0);
    let cond = rb["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "DisruptionBudget").cloned());
    (ready, cond, rb)
}

/// Watches a move under a budget of `floor` ready replicas from the moment `moving` says the
/// decision moved: the ready count never falls below the floor, until the move is done (the
/// decision as `done` wants it, `floor` ready, the condition back to WithinBudget). Returns
/// whether the binding ever said the move waited.
fn keeps_budget(
    f: &Fleet,
    floor: i64,
    moving: impl Fn(&BTreeMap<String, i64>) -> bool,
    done: impl Fn(&BTreeMap<String, i64>) -> bool,
) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut waited, mut moved) = (false, false);
    loop {
        let d = decided(f);
        let (ready, cond, rb) = budget_view(f);
        let reason = cond
            .as_ref()
            .map(|c| c["reason"].clone())
            .unwrap_or(Value::Null);
        waited |= reason == "MoveWaits";
        moved |= moving(&d);
        if moved {
            assert!(ready >= floor, "the budget broke: {ready} ready, {rb}");
            if done(&d) && ready >= floor && reason == "WithinBudget" {
                return waited;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the move did not finish: moved {moved}, waited {waited}, {rb}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Two simulated members whose pods take 3 s to start, labelled for `web`, and `web` placed
/// on them with `placement` added (its lines, indented by four); waits until 12 are ready
/// over both.
fn budget_fleet(names: [&str; 2], sim: &str, server_args: &[&str], placement: &str) -> Fleet {
    let f = Fleet::start_sims(
        &[(names[0], "us-east", sim), (names[1], "eu-west", sim)],
        server_args,
    );
    for m in names {
        f.s.ok(&["label", "cluster", m, "tier=app"]);
    }
    f.s.apply(&WEB.replace(
        "replicaScheduling: {replicaSchedulingType: Divided}",
        &format!("replicaScheduling: {{replicaSchedulingType: Divided}}\n{placement}"),
    ));
    eventually(Duration::from_secs(30), "12 ready over both", || {
        ready(&f, &names) == 12 && decided(&f).len() == 2
    });
    f
}

/// A rebalance within a disruption budget: a recovered cluster takes its share back, and the
/// cluster giving replicas up keeps them until their replacements are ready, so the ready count
/// never falls below the budget's floor, and the binding says the move waits.
#[test]
fn a_rebalance_keeps_the_workloads_disruption_budget() {
    let members = ["east", "west"];
    let mut f = budget_fleet(
        members,
        "nodes=4,cpu=8,memory=32Gi,load=0.45,start=3s",
        &[
            "--cluster-grace-period",
            "2s",
            "--cluster-eviction-timeout",
            "2s",
        ],
        "    rebalanceOnRecovery: true\n    disruptionBudget: {minAvailable: 12}",
    );
    f.agents[1].1.kill9();
    eventually(Duration::from_secs(40), "12 ready on east", || {
        decided(&f) == BTreeMap::from([("east".to_string(), 12)]) && ready(&f, &["east"]) == 12
    });
    f.agents[1].1.restart();
    let back = |d: &BTreeMap<String, i64>| d.get("west").copied().unwrap_or(0) > 0;
    let waited = keeps_budget(&f, 12, back, back);
    assert!(
        waited,
        "east gave its replicas up without waiting for west's"
    );
    // What east kept it gives up once west's are ready: the members run the decision (as
    // they report it: west's agent came back on another admin port).
    eventually(Duration::from_secs(20), "the decision runs", || {
        let d = decided(&f);
        let (_, _, rb) = budget_view(&f);
        let runs: BTreeMap<String, i64> = rb["status"]["aggregatedStatus"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|i| {
                let c = i["clusterName"].as_str().unwrap_or_default().to_string();
                (c, i["status"]["replicas"].as_i64().unwrap_or(0))
            })
            .collect();
        runs == d
    });
}

/// Shedding within a disruption budget: a cluster past its shed mark gives its share up, and
/// keeps what the budget does not let go until the other cluster's replicas are ready.
#[test]
fn shedding_keeps_the_workloads_disruption_budget() {
    let f = budget_fleet(
        ["hot", "cool"],
        "nodes=4,cpu=8,memory=32Gi,load=0.45,start=3s",
        &["--shed-window", "2s"],
        "    disruptionBudget: {maxUnavailable: 2}",
    );
    let first = decided(&f)["hot"];
    let (_, cond, rb) = budget_view(&f);
    assert_eq!(
        cond.as_ref().map(|c| c["reason"].clone()),
        Some("WithinBudget".into()),
        "{rb}"
    );
    f.set_load("hot", 0.98);
    let shed = |d: &BTreeMap<String, i64>| d.get("hot").copied().unwrap_or(0) < first;
    let waited = keeps_budget(&f, 10, shed, shed);
    assert!(
        waited,
        "hot shed more than 2 replicas before cool's were ready"
    );
}

/// Consolidation within a disruption budget: the placement's replicas follow a price drop to
/// the other cluster, and the cluster they leave keeps them until their replacements are
/// ready.
#[test]
fn consolidation_keeps_the_workloads_disruption_budget() {
    let sim = |core: &str| {
        format!(
            "nodes=4,cpu=8,memory=32Gi,load=0.1,start=3s,cpuCoreHour={core},memoryGiBHour=0.002"
        )
    };
    let (cheap, dear) = (sim("0.02"), sim("0.06"));
    let f = Fleet::start_sims(
        &[("cheap", "us-east", &cheap), ("dear", "eu-west", &dear)],
        &[
            "--monitoring-interval",
            "1s",
            "--consolidate-interval",
            "2s",
        ],
    );
    for m in ["cheap", "dear"] {
        f.s.ok(&["label", "cluster", m, "tier=app"]);
    }
    f.s.apply(&WEB.replace(
        "replicaScheduling: {replicaSchedulingType: Divided}",
        "replicaScheduling: {replicaSchedulingType: Divided}\n    cost: {weight: 10, consolidate: true}\n    disruptionBudget: {minAvailable: 12}",
    ));
    eventually(Duration::from_secs(30), "12 ready, most on cheap", || {
        let d = decided(&f);
        ready(&f, &["cheap", "dear"]) == 12
            && d.get("cheap").copied().unwrap_or(0) > d.get("dear").copied().unwrap_or(0)
    });
    let before = decided(&f).get("dear").copied().unwrap_or(0);
    // The dear cluster's contract now costs a quarter of the cheap one's.
    f.s.ok(&[
        "patch",
        "cluster",
        "dear",
        "--type=merge",
        "-p",
        r#"{"spec":{"properties":{"cost.orrery.io/cpu-core-hour":"0.005","cost.orrery.io/memory-gib-hour":"0.0005"}}}"#,
    ]);
    let waited = keeps_budget(
        &f,
        12,
        |d| d.get("dear").copied().unwrap_or(0) > before,
        |d| d.get("dear").copied() == Some(12),
    );
    assert!(
        waited,
        "cheap gave its replicas up before dear's were ready"
    );
}

/// Karmada's FederatedResourceQuota: what the namespace's bindings place is summed in its
/// status, a template change that would go over `overall` is refused with the quota's name, a
/// new workload whose first decision would go over waits (Scheduled=False, QuotaExceeded)
/// until the limit is raised, and each assignment is a ResourceQuota in its member.
#[test]
fn a_federated_quota_bounds_what_a_namespace_places() {
    let load = sim(0.1);
    let f = Fleet::start_sims(
        &[
            ("east", "us-east", load.as_str()),
            ("west", "eu-west", load.as_str()),
        ],
        &[],
    );
    for m in ["east", "west"] {
        f.s.ok(&["label", "cluster", m, "tier=app"]);
    }
    let quota = |cpu: &str, assignments: &str| {
        format!(
            "apiVersion: policy.karmada.io/v1alpha1\nkind: FederatedResourceQuota\n\
             metadata: {{name: team, namespace: default}}\n\
             spec:\n  overall: {{cpu: \"{cpu}\", memory: 8Gi}}\n  staticAssignments: {assignments}\n"
        )
    };
    // Karmada's admission checks of the quota itself.
    let err = f.s.fails_stdin(
        &["apply", "-f", "-"],
        &quota("1", "[{clusterName: east, hard: {cpu: 2, pods: 3}}]"),
    );
    assert!(err.contains("overall is less than assignments"), "{err}");
    assert!(
        err.contains("assignment resourceName is not exist in overall"),
        "{err}"
    );
    f.s.apply(&quota(
        "3",
        "[{clusterName: east, hard: {cpu: 2}}, {clusterName: west, hard: {cpu: 1}}]",
    ));
    f.s.apply(&WEB.replace("replicas: 12", "replicas: 8"));
    eventually(Duration::from_secs(20), "web placed and counted", || {
        let q = f.s.get_json(&["federatedresourcequota", "team"]);
        decided_for(&f, "web").values().sum::<i64>() == 8
            && q["status"]["overallUsed"] == serde_json::json!({"cpu": "2", "memory": "1Gi"})
    });
    // 16 × 250m would be 4 cores of 3: refused, and nothing changes.
    let err = f.s.fails(&["scale", "deployment", "web", "--replicas=16"]);
    assert!(
        err.contains(
            "FederatedResourceQuota(default/team) exceeded for resource cpu: requested sum 4, limit 3."
        ),
        "{err}"
    );
    let replicas = f.s.get_json(&["deployment", "web"])["spec"]["replicas"].clone();
    assert_eq!(replicas, 8);
    // Up to the limit is within it.
    f.s.ok(&["scale", "deployment", "web", "--replicas=12"]);
    eventually(Duration::from_secs(20), "web at 12, 3 cores used", || {
        let q = f.s.get_json(&["federatedresourcequota", "team"]);
        decided_for(&f, "web").values().sum::<i64>() == 12
            && q["status"]["overallUsed"]["cpu"] == "3"
    });

    // A new workload is accepted, but its first decision would go over: it waits, told why.
    let extra = WEB
        .replace("replicas: 12", "replicas: 2")
        .replace("name: web,", "name: extra,")
        .replace(
            "kind: Deployment, name: web,",
            "kind: Deployment, name: extra,",
        );
    f.s.apply(&extra);
    eventually(
        Duration::from_secs(20),
        "extra refused by the quota",
        || {
            let rb = f.s.get_json(&["resourcebinding", "extra-deployment"]);
            rb["status"]["conditions"].as_array().is_some_and(|cs| {
                cs.iter().any(|c| {
                    c["type"] == "Scheduled"
                        && c["status"] == "False"
                        && c["reason"] == "QuotaExceeded"
                        && c["message"]
                            .as_str()
                            .is_some_and(|m| m.contains("requested sum 3500m, limit 3."))
                })
            })
        },
    );
    assert!(decided_for(&f, "extra").is_empty(), "nothing placed");
    let events = f.s.ok(&[
        "get",
        "events",
        "--field-selector",
        "reason=ScheduleBindingFailed",
    ]);
    assert!(events.contains("extra"), "{events}");
    // A raised limit lets it in.
    f.s.apply(&quota(
        "4",
        "[{clusterName: east, hard: {cpu: 2}}, {clusterName: west, hard: {cpu: 1}}]",
    ));
    eventually(
        Duration::from_secs(20),
        "extra placed under the raised limit",
        || decided_for(&f, "extra").values().sum::<i64>() == 2,
    );

    // Each assignment is a ResourceQuota in its member, reported back by cluster.
    eventually(
        Duration::from_secs(20),
        "members report their quotas",
        || {
            let q = f.s.get_json(&["federatedresourcequota", "team"]);
            let agg = q["status"]["aggregatedStatus"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let hard: Vec<(String, String)> = agg
                .iter()
                .map(|a| {
                    (
                        a["clusterName"].as_str().unwrap_or("").to_string(),
                        a["hard"]["cpu"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect();
            hard == [
                ("east".to_string(), "2".to_string()),
                ("west".to_string(), "1".to_string()),
            ] && agg.iter().all(|a| a["used"]["cpu"].is_string())
        },
    );
    let rq = f
        .find("east", "ResourceQuota", "team")
        .expect("east's quota");
    assert_eq!(rq["metadata"]["namespace"], "default");
    assert_eq!(
        rq["metadata"]["labels"]["federatedresourcequota.karmada.io/name"],
        "team"
    );
    // An assignment withdrawn is a ResourceQuota gone.
    f.s.apply(&quota("4", "[{clusterName: east, hard: {cpu: 2}}]"));
    eventually(Duration::from_secs(20), "west's quota withdrawn", || {
        f.find("west", "ResourceQuota", "team").is_none()
    });
    assert!(f.find("east", "ResourceQuota", "team").is_some());
}

/// Karmada 1.18's overflow affinities: a small home cluster is filled first, replicas it has
/// no room for spill into the cloud group, and scaling down empties the cloud first.
#[test]
fn replicas_overflow_from_the_home_group_and_come_back_first() {
    let f = Fleet::start_sims(
        &[
            ("home", "on-prem", "nodes=1,cpu=4,memory=16Gi,load=0"),
            ("cloud-a", "us-east", "nodes=2,cpu=8,memory=32Gi,load=0"),
            ("cloud-b", "us-west", "nodes=2,cpu=8,memory=32Gi,load=0"),
        ],
        &[],
    );
    for m in ["cloud-a", "cloud-b"] {
        f.s.ok(&["label", "cluster", m, "tier=cloud"]);
    }
    let policy = |division: &str| {
        format!(
            r#"
apiVersion: policy.karmada.io/v1alpha1
kind: PropagationPolicy
metadata: {{name: web, namespace: default}}
spec:
  resourceSelectors: [{{apiVersion: apps/v1, kind: Deployment, name: web}}]
  placement:
    clusterAffinities:
    - affinityName: home
      clusterNames: [home]
      overflowAffinities:
      - affinityName: cloud
        labelSelector: {{matchLabels: {{tier: cloud}}}}
    replicaScheduling: {division}
"#
        )
    };
    // Karmada's refusal: equal static weights do not overflow.
    let err = f.s.fails_stdin(
        &["apply", "-f", "-"],
        &policy("{replicaSchedulingType: Divided}"),
    );
    assert!(
        err.contains("overflowAffinities can only be used together with dynamic weight or aggregated scheduling"),
        "{err}"
    );
    // A limit keeps home under Orrery's shed mark; without one Karmada's count fills it to
    // its allocatable, and the water level then sheds what is over (docs/scheduling.md).
    f.s.apply(&policy(
        "{replicaSchedulingType: Divided, replicaDivisionPreference: Aggregated}\n    waterLevelLimit: 0.8",
    ));
    let web = WEB
        .split("---")
        .next()
        .unwrap()
        .replace("replicas: 12", "replicas: 3")
        .replace("cpu: 250m", "cpu: 1");
    f.s.apply(&web);
    eventually(Duration::from_secs(20), "3 replicas at home", || {
        decided_for(&f, "web") == BTreeMap::from([("home".to_string(), 3)])
    });
    let rb = f.s.get_json(&["resourcebinding", "web-deployment"]);
    assert_eq!(rb["status"]["schedulerObservedAffinityName"], "home");
    // 4 cores at home hold 3 replicas of 1 core under 0.8: the other 7 go to the cloud group.
    f.s.ok(&["scale", "deployment", "web", "--replicas=10"]);
    eventually(
        Duration::from_secs(20),
        "home full, the rest in the cloud",
        || {
            let d = decided_for(&f, "web");
            let cloud: i64 = d
                .iter()
                .filter(|(n, _)| n.starts_with("cloud-"))
                .map(|(_, r)| r)
                .sum();
            d.get("home") == Some(&3) && cloud == 7
        },
    );
    // Scaling down: the cloud gives its replicas back before home does.
    f.s.ok(&["scale", "deployment", "web", "--replicas=5"]);
    eventually(
        Duration::from_secs(20),
        "two replicas left in the cloud",
        || {
            let d = decided_for(&f, "web");
            d.get("home") == Some(&3) && d.values().sum::<i64>() == 5
        },
    );
    f.s.ok(&["scale", "deployment", "web", "--replicas=2"]);
    eventually(Duration::from_secs(20), "home alone again", || {
        decided_for(&f, "web") == BTreeMap::from([("home".to_string(), 2)])
    });
}

/// A Deployment of `replicas` one-core replicas and its Karmada policy: Aggregated under a
/// 0.8 limit, with `spec` and `placement` lines added (each starting with a newline, indented
/// as the policy's `spec` and `placement` fields are).
fn one_core_app(name: &str, replicas: i64, spec: &str, placement: &str) -> String {
    let web = WEB
        .split("---")
        .next()
        .unwrap()
        .replace("name: web,", &format!("name: {name},"))
        .replace("replicas: 12", &format!("replicas: {replicas}"))
        .replace("cpu: 250m", "cpu: 1");
    format!(
        r#"{web}---
apiVersion: policy.karmada.io/v1alpha1
kind: PropagationPolicy
metadata: {{name: {name}, namespace: default}}
spec:
  resourceSelectors: [{{apiVersion: apps/v1, kind: Deployment, name: {name}}}]{spec}
  placement:
    waterLevelLimit: 0.8{placement}
    replicaScheduling: {{replicaSchedulingType: Divided, replicaDivisionPreference: Aggregated}}
"#
    )
}

/// Karmada's `schedulePriority`: the policy names a Kubernetes PriorityClass, the binding
/// carries its value, and when room comes free the higher priority takes it first (though
/// its name sorts last). A class
/// that does not exist holds the binding back, told in Karmada's words.
#[test]
fn the_higher_priority_class_takes_the_room_first() {
    let f = Fleet::start_sims(
        &[("only", "on-prem", "nodes=1,cpu=4,memory=16Gi,load=0")],
        &[],
    );
    let app = |name: &str, class: Option<&str>| {
        let priority = class.map_or(String::new(), |c| {
            format!("\n  schedulePriority: {{priorityClassSource: KubePriorityClass, priorityClassName: {c}}}")
        });
        one_core_app(name, 3, &priority, "")
    };
    let class = |name: &str, value: i64| {
        format!(
            "apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata: {{name: {name}}}\nvalue: {value}\n"
        )
    };
    // Kubernetes' own checks of a PriorityClass.
    let err =
        f.s.fails_stdin(&["apply", "-f", "-"], &class("huge", 2_000_000_000));
    assert!(
        err.contains("maximum allowed value of a user defined priority is 1000000000"),
        "{err}"
    );
    f.s.apply(&class("high", 1000));
    let err = f.s.fails_stdin(&["apply", "-f", "-"], &class("high", 5));
    assert!(err.contains("may not be changed in an update"), "{err}");
    let pc = f.s.get_json(&["priorityclass", "high"]);
    assert_eq!(pc["preemptionPolicy"], "PreemptLowerPriority");

    // 0.8 of 4 cores: room for 3 replicas of 1 core, which the filler takes.
    f.s.apply(&app("filler", None));
    eventually(Duration::from_secs(20), "the filler placed", || {
        decided_for(&f, "filler").values().sum::<i64>() == 3
    });
    // `low` names a class that does not exist yet: no binding, and an Event says why.
    f.s.apply(&app("batch", Some("low")));
    eventually(
        Duration::from_secs(20),
        "the ApplyPolicyFailed event",
        || {
            f.s.ok(&["get", "events", "-n", "default", "-o", "json"]).contains(
            "Apply policy(default/batch) failed: priorityclasses.scheduling.k8s.io \\\"low\\\" not found",
        )
        },
    );
    let missing = f.s.kubectl(&["get", "resourcebinding", "batch-deployment"]);
    assert!(
        !missing.status.success(),
        "no binding while the class is missing"
    );
    f.s.apply(&class("low", 10));
    f.s.apply(&app("urgent", Some("high")));
    eventually(
        Duration::from_secs(20),
        "both bound, carrying their priorities, and waiting",
        || {
            ["batch", "urgent"].iter().all(|n| {
                let out = f.s.kubectl(&[
                    "get",
                    "resourcebinding",
                    &format!("{n}-deployment"),
                    "-o",
                    "json",
                ]);
                serde_json::from_slice::<Value>(&out.stdout)
                    .ok()
                    .is_some_and(|rb| {
                        let want = if *n == "batch" { 10 } else { 1000 };
                        rb["spec"]["schedulePriority"]["priority"] == want
                            && rb["status"]["conditions"].as_array().is_some_and(|c| {
                                c.iter()
                                    .any(|c| c["type"] == "Scheduled" && c["status"] == "False")
                            })
                    })
            })
        },
    );
    // Both have waited for room a while; the room comes free at once.
    std::thread::sleep(Duration::from_secs(2));
    f.s.ok(&["delete", "deployment", "filler"]);
    eventually(
        Duration::from_secs(30),
        "urgent placed in the freed room",
        || decided_for(&f, "urgent").values().sum::<i64>() == 3,
    );
    assert_eq!(
        decided_for(&f, "batch").values().sum::<i64>(),
        0,
        "batch (whose name comes first) waits behind urgent"
    );
}

/// Orrery's binding preemption (Karmada's proposal): a workload whose class preempts takes
/// the room of a lower-priority workload that is `preemptible`, make-before-break; a class
/// with `preemptionPolicy: Never` waits instead.
#[test]
fn a_preempting_class_takes_room_from_a_preemptible_lower_priority() {
    let f = Fleet::start_sims(
        &[("only", "on-prem", "nodes=1,cpu=4,memory=16Gi,load=0")],
        &["--move-grace-period", "3s"],
    );
    let app = |name: &str, class: &str, replicas: i64, preemptible: bool| {
        one_core_app(
            name,
            replicas,
            &format!(
                "\n  schedulePriority: {{priorityClassSource: KubePriorityClass, priorityClassName: {class}}}"
            ),
            &format!("\n    preemptible: {preemptible}"),
        )
    };
    for (name, value, policy) in [
        ("low", 10, "PreemptLowerPriority"),
        ("polite", 500, "Never"),
        ("urgent", 1000, "PreemptLowerPriority"),
    ] {
        f.s.apply(&format!(
            "apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata: {{name: {name}}}\nvalue: {value}\npreemptionPolicy: {policy}\n"
        ));
    }
    // 0.8 of 4 cores: room for 3 replicas of 1 core, all batch's.
    f.s.apply(&app("batch", "low", 3, true));
    eventually(Duration::from_secs(20), "batch placed", || {
        decided_for(&f, "batch").values().sum::<i64>() == 3
    });
    let preempted = || {
        let events = f.s.ok(&["get", "events", "-n", "default", "-o", "json"]);
        let events: Value = serde_json::from_str(&events).unwrap();
        events["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["reason"] == "Preempted")
            .map(|e| e["message"].as_str().unwrap_or("").to_string())
            .collect::<Vec<_>>()
    };
    // A higher priority that never preempts waits for room.
    f.s.apply(&app("polite", "polite", 2, false));
    eventually(Duration::from_secs(20), "polite waiting", || {
        let rb = f.s.get_json(&["resourcebinding", "polite-deployment"]);
        rb["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Scheduled" && c["status"] == "False")
        })
    });
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(decided_for(&f, "batch").values().sum::<i64>(), 3);
    assert!(preempted().is_empty(), "{:?}", preempted());
    f.s.ok(&["delete", "deployment", "polite"]);

    // One that preempts takes batch's room: batch leaves (nowhere else to go, it waits).
    f.s.apply(&app("urgent", "urgent", 2, false));
    eventually(Duration::from_secs(20), "batch preempted", || {
        preempted()
            .iter()
            .any(|m| m == "preempted from only by default/urgent-deployment (priority 1000)")
    });
    // The preemptor's status (and the Event telling of it) says whom it preempts, or that
    // it waits for the room a preemption frees.
    eventually(
        Duration::from_secs(10),
        "the preemptor's ScheduleFailed event",
        || {
            // (A first decision whose write lost is decided again: that one waits.)
            let ev = f.s.ok(&["get", "events", "-n", "default", "-o", "json"]);
            ev.contains("preempting default/batch-deployment in only (lower priority, preemptible)")
                || ev.contains("waiting for the room a preemption frees in only")
        },
    );
    eventually(
        Duration::from_secs(30),
        "urgent placed once the old copies went",
        || decided_for(&f, "urgent") == BTreeMap::from([("only".to_string(), 2)]),
    );
    // What room is left goes back to batch; urgent is never preempted by it.
    eventually(Duration::from_secs(30), "batch takes what is left", || {
        decided_for(&f, "batch").values().sum::<i64>() == 1
    });
    assert_eq!(preempted().len(), 1, "one preemption: {:?}", preempted());
}
