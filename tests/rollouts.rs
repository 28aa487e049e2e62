//! Progressive rollouts end to end: a real server, simulated members behind real agents, the
//! real kubectl. A template change reaches the clusters stage by stage, each gated on the
//! health of the last; a bad revision halts in its stage and, with automatic rollback, the
//! stable one is restored; a stage waits for its RolloutApproval.

use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::eventually;
use common::fleet::Fleet;
use serde_json::Value;

fn deployment(image: &str, bad: bool) -> String {
    let ann = if bad {
        r#"annotations: {"sim.orrery.io/never-ready": "true"}"#
    } else {
        "annotations: {}"
    };
    format!(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, namespace: default, labels: {{app: web}}}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata:
      labels: {{app: web}}
      {ann}
    spec:
      containers:
      - name: web
        image: {image}
        resources: {{requests: {{cpu: 100m, memory: 64Mi}}}}
"#
    )
}

fn policy(stages: &str, extra: &str) -> String {
    placed(stages, extra, "")
}

/// [`policy`], with more of the placement (`placement`: its lines, indented by four).
fn placed(stages: &str, extra: &str, placement: &str) -> String {
    format!(
        r#"
apiVersion: policy.karmada.io/v1alpha1
kind: PropagationPolicy
metadata: {{name: web, namespace: default}}
spec:
  resourceSelectors:
  - {{apiVersion: apps/v1, kind: Deployment, name: web}}
  placement:
    clusterAffinity:
      clusterNames: [m1, m2, m3, m4]
{placement}
    rollout:
      progressDeadline: 5s
      {extra}
      stages:
{stages}
"#
    )
}

fn image_in(f: &Fleet, m: &str) -> Option<String> {
    f.find(m, "Deployment", "web").map(|d| {
        d["spec"]["template"]["spec"]["containers"][0]["image"]
            .as_str()
            .unwrap_or("")
            .to_string()
    })
}

fn rollout(f: &Fleet) -> Value {
    f.s.get_json(&["resourcebinding", "web-deployment"])["status"]["rollout"].clone()
}

fn fleet() -> Fleet {
    let f = Fleet::start(&[
        ("m1", "us-east"),
        ("m2", "us-west"),
        ("m3", "eu-west"),
        ("m4", "eu-north"),
    ]);
    for (m, ring) in [
        ("m1", "canary"),
        ("m2", "early"),
        ("m3", "late"),
        ("m4", "late"),
    ] {
        f.s.ok(&["label", "cluster", m, &format!("ring={ring}")]);
    }
    f
}

const RINGS: &str = r#"      - {name: canary, clusterSelector: {matchLabels: {ring: canary}}, minSuccessTime: 2s}
      - {name: early, clusterSelector: {matchLabels: {ring: early}}}
      - {name: late, clusterSelector: {matchLabels: {ring: late}}, maxConcurrency: 1}"#;

/// Polls until every member runs `image`, noting when each first did.
fn watch_until_all(f: &Fleet, image: &str, within: Duration) -> BTreeMap<String, Instant> {
    let deadline = Instant::now() + within;
    let mut first = BTreeMap::new();
    while first.len() < 4 {
        for m in ["m1", "m2", "m3", "m4"] {
            if !first.contains_key(m) && image_in(f, m).as_deref() == Some(image) {
                first.insert(m.to_string(), Instant::now());
            }
        }
        assert!(
            Instant::now() < deadline,
            "not every member runs {image}: {first:?}; rollout {}",
            rollout(f)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    first
}

#[test]
fn a_change_goes_stage_by_stage_and_a_bad_one_halts_and_rolls_back() {
    let f = fleet();
    let s = &f.s;
    s.apply(&deployment("web:1", false));
    s.apply(&policy(RINGS, "rollback: Automatic"));
    watch_until_all(&f, "web:1", Duration::from_secs(30));
    eventually(Duration::from_secs(20), "revision 1 complete", || {
        rollout(&f)["phase"] == "Complete"
    });
    assert_eq!(rollout(&f)["revision"], 1);

    // Revision 2: the canary first, and only after it ran healthily for 2s the next stage.
    let started = Instant::now();
    s.apply(&deployment("web:2", false));
    let first = watch_until_all(&f, "web:2", Duration::from_secs(60));
    let took = started.elapsed();
    let gap = first["m2"].duration_since(first["m1"]);
    assert!(gap >= Duration::from_secs(2), "canary to early: {gap:?}");
    for late in ["m3", "m4"] {
        assert!(first[late] >= first["m2"], "{first:?}");
    }
    eprintln!("a healthy rollout of 3 stages: {took:?} (minSuccessTime 2s)");
    eventually(Duration::from_secs(20), "revision 2 complete", || {
        let r = rollout(&f);
        r["phase"] == "Complete" && r["stable"] == 2
    });
    let r = rollout(&f);
    let stages: Vec<&str> = r["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(stages, ["canary", "early", "late"], "{r}");
    // The revisions are ControllerRevisions beside the binding.
    let revs = s.ok(&[
        "get",
        "controllerrevisions",
        "-l",
        "rollout.orrery.io/binding=web-deployment",
    ]);
    assert_eq!(revs.lines().count(), 3, "{revs}");

    // Revision 3 never becomes ready: it halts in the canary stage, no other member is
    // touched, and revision 2 is restored on the canary.
    let mut seen = BTreeMap::new();
    f.journals(&mut seen);
    s.apply(&deployment("web:3", true));
    eventually(Duration::from_secs(30), "revision 3 on the canary", || {
        image_in(&f, "m1").as_deref() == Some("web:3")
    });
    eventually(Duration::from_secs(30), "rolled back", || {
        rollout(&f)["phase"] == "RolledBack"
    });
    let r = rollout(&f);
    assert!(
        r["message"]
            .as_str()
            .unwrap()
            .contains("halted in stage canary")
            && r["message"].as_str().unwrap().contains("m1"),
        "{r}"
    );
    eventually(Duration::from_secs(20), "revision 2 back on m1", || {
        image_in(&f, "m1").as_deref() == Some("web:2")
    });
    for (m, e) in f.journals(&mut seen) {
        assert_eq!(m, "m1", "a member of a later stage was touched: {e}");
    }
    for m in ["m2", "m3", "m4"] {
        assert_eq!(image_in(&f, m).as_deref(), Some("web:2"), "{m}");
    }
    let events = s.ok(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=web",
    ]);
    assert!(
        events.contains("RolloutHalted") && events.contains("RolledBack"),
        "{events}"
    );
    // The schedule history tells the same steps, each once.
    let steps = history_steps(&f);
    for want in [
        "2 canary StageStarted",
        "2 canary StageSucceeded",
        "2  RolloutComplete",
        "3 canary RolloutHalted",
        "3 canary RolledBack",
    ] {
        assert_eq!(
            steps.iter().filter(|s| s.as_str() == want).count(),
            1,
            "{want}: {steps:?}"
        );
    }
}

/// The rollout steps of the schedule history, oldest first: `revision stage event`.
fn history_steps(f: &Fleet) -> Vec<String> {
    let raw =
        f.s.ok(&["get", "--raw", "/api/v1/history/schedules?maxEntries=1000"]);
    let v: Value = serde_json::from_str(&raw).unwrap();
    let mut steps: Vec<(String, String)> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["trigger"] == "Rollout")
        .map(|e| {
            let r = &e["rollout"];
            (
                e["time"].as_str().unwrap_or_default().to_string(),
                format!(
                    "{} {} {}",
                    r["revision"],
                    r["stage"].as_str().unwrap_or_default(),
                    r["event"].as_str().unwrap_or_default()
                ),
            )
        })
        .collect();
    steps.sort();
    steps.into_iter().map(|(_, s)| s).collect()
}

/// A revision that becomes ready and then crashes again and again fails its gate by its pods'
/// restarts (`maxRestarts`), and the rollout halts in the canary stage.
#[test]
fn restarts_beyond_the_count_fail_the_gate() {
    let f = fleet();
    let s = &f.s;
    s.apply(&deployment("web:1", false));
    s.apply(&policy(RINGS, "maxRestarts: 1"));
    watch_until_all(&f, "web:1", Duration::from_secs(30));
    eventually(Duration::from_secs(20), "revision 1 complete", || {
        rollout(&f)["phase"] == "Complete"
    });
    let crashing = deployment("web:2", false).replace(
        "annotations: {}",
        r#"annotations: {"sim.orrery.io/restart-every": "1s"}"#,
    );
    s.apply(&crashing);
    eventually(
        Duration::from_secs(30),
        "halted by the canary's restarts",
        || {
            let r = rollout(&f);
            r["phase"] == "Halted"
                && r["clusters"].as_array().is_some_and(|cs| {
                    cs.iter().any(|c| {
                        c["name"] == "m1"
                            && c["state"] == "Failed"
                            && c["message"].as_str().is_some_and(|m| {
                                m.contains("restarted") && m.contains("maxRestarts 1")
                            })
                    })
                })
        },
    );
    for m in ["m2", "m3", "m4"] {
        assert_eq!(image_in(&f, m).as_deref(), Some("web:1"), "{m}");
    }
}

#[test]
fn a_stage_waits_for_its_approval_and_a_pause_holds_the_rest() {
    let f = fleet();
    let s = &f.s;
    let stages = r#"      - {name: canary, clusterSelector: {matchLabels: {ring: canary}}}
      - {name: rest, percent: 100, approval: true, maxConcurrency: 1}"#;
    s.apply(&deployment("web:1", false));
    s.apply(&policy(stages, ""));
    watch_until_all(&f, "web:1", Duration::from_secs(30));
    s.apply(&deployment("web:2", false));
    eventually(
        Duration::from_secs(30),
        "the rest waits for approval",
        || rollout(&f)["phase"] == "WaitingForApproval",
    );
    assert_eq!(image_in(&f, "m1").as_deref(), Some("web:2"));
    for m in ["m2", "m3", "m4"] {
        assert_eq!(image_in(&f, m).as_deref(), Some("web:1"), "{m}");
    }
    let table = s.ok(&["get", "resourcebinding", "web-deployment", "-o", "wide"]);
    assert!(table.contains("WaitingForApproval"), "{table}");
    let status = s.orrery_ok(&["rollout", "status", "deploy/web"]);
    assert!(
        status.contains("revision 2 (stable 1): WaitingForApproval, stage rest"),
        "{status}"
    );

    // An approval of a stage that does not exist is refused, saying why; the right one is
    // taken.
    let approval = |name: &str, stage: &str| {
        format!(
            "apiVersion: multicluster.io/v1alpha1\nkind: RolloutApproval\nmetadata: {{name: {name}, namespace: default}}\nspec: {{binding: web-deployment, revision: 2, stage: {stage}}}\n"
        )
    };
    s.apply(&approval("wrong", "nope"));
    eventually(
        Duration::from_secs(20),
        "the wrong approval refused",
        || {
            let a = s.get_json(&["rolloutapproval", "wrong"]);
            a["status"]["conditions"][0]["reason"] == "NoSuchStage"
        },
    );
    // Paused before approving: the approval alone moves nothing.
    s.orrery_ok(&["rollout", "pause", "deploy/web"]);
    s.orrery_ok(&["rollout", "approve", "deploy/web", "--stage", "rest"]);
    eventually(Duration::from_secs(20), "the approval accepted", || {
        let a = s.get_json(&["rolloutapproval", "web-deployment-r2-rest"]);
        a["status"]["conditions"][0]["status"] == "True"
    });
    eventually(Duration::from_secs(10), "paused", || {
        rollout(&f)["phase"] == "Paused"
    });
    std::thread::sleep(Duration::from_secs(2));
    for m in ["m2", "m3", "m4"] {
        assert_eq!(
            image_in(&f, m).as_deref(),
            Some("web:1"),
            "{m} moved while paused"
        );
    }
    s.orrery_ok(&["rollout", "resume", "deploy/web"]);
    watch_until_all(&f, "web:2", Duration::from_secs(60));
    eventually(Duration::from_secs(20), "complete", || {
        rollout(&f)["phase"] == "Complete"
    });
    let history = s.orrery_ok(&["rollout", "history", "deploy/web"]);
    assert!(history.contains("rolling out, stable"), "{history}");

    // Undo: revision 1's template back, as revision 3, rolled out like any change.
    s.orrery_ok(&["rollout", "undo", "deploy/web"]);
    eventually(
        Duration::from_secs(20),
        "revision 3 waits for approval",
        || {
            let r = rollout(&f);
            r["revision"] == 3 && r["phase"] == "WaitingForApproval"
        },
    );
    assert_eq!(image_in(&f, "m1").as_deref(), Some("web:1"));
    assert_eq!(image_in(&f, "m2").as_deref(), Some("web:2"));
}

#[test]
fn a_restart_mid_rollout_resumes_where_it_was_and_moves_nothing() {
    let mut f = fleet();
    let stages = r#"      - {name: canary, clusterSelector: {matchLabels: {ring: canary}}, minSuccessTime: 1s}
      - {name: rest, percent: 100, approval: true}"#;
    f.s.apply(&deployment("web:1", false));
    f.s.apply(&policy(stages, ""));
    watch_until_all(&f, "web:1", Duration::from_secs(30));
    f.s.apply(&deployment("web:2", false));
    eventually(Duration::from_secs(30), "waiting for approval", || {
        rollout(&f)["phase"] == "WaitingForApproval"
    });
    let before = rollout(&f);
    let mut seen = BTreeMap::new();
    f.journals(&mut seen);
    f.s.kill9();
    f.s.restart();
    eventually(Duration::from_secs(30), "the members back", || {
        ["m1", "m2", "m3", "m4"]
            .iter()
            .all(|m| f.s.cluster_condition(m, "Ready") == "True")
    });
    std::thread::sleep(Duration::from_secs(3));
    let after = rollout(&f);
    assert_eq!(after["phase"], "WaitingForApproval");
    assert_eq!(after["clusters"], before["clusters"], "the decisions stand");
    let moved = f.journals(&mut seen);
    assert!(moved.is_empty(), "a restart moved something: {moved:?}");
    // Nor did it record a step again.
    let steps = history_steps(&f);
    let approval = steps
        .iter()
        .filter(|s| s.ends_with("WaitingForApproval"))
        .count();
    assert_eq!(approval, 1, "{steps:?}");
    // It goes on from there.
    f.s.orrery_ok(&["rollout", "approve", "deploy/web", "--stage", "rest"]);
    watch_until_all(&f, "web:2", Duration::from_secs(60));
}

#[test]
fn a_change_while_one_rolls_out_supersedes_it() {
    let f = fleet();
    let s = &f.s;
    let stages = r#"      - {name: canary, clusterSelector: {matchLabels: {ring: canary}}, minSuccessTime: 1h}
      - {name: rest, percent: 100}"#;
    s.apply(&deployment("web:1", false));
    s.apply(&policy(stages, ""));
    watch_until_all(&f, "web:1", Duration::from_secs(30));
    let mut seen = BTreeMap::new();
    f.journals(&mut seen);
    s.apply(&deployment("web:2", false));
    eventually(Duration::from_secs(20), "revision 2 on the canary", || {
        image_in(&f, "m1").as_deref() == Some("web:2")
    });
    // Revision 3 while 2 soaks on the canary: the canary takes 3 at once, the rest keeps 1.
    s.apply(&deployment("web:3", false));
    eventually(Duration::from_secs(20), "revision 3 on the canary", || {
        image_in(&f, "m1").as_deref() == Some("web:3")
    });
    let r = rollout(&f);
    assert_eq!(
        (r["revision"].as_i64(), r["stable"].as_i64()),
        (Some(3), Some(1)),
        "{r}"
    );
    assert_eq!(r["stage"], "canary");
    for (m, e) in f.journals(&mut seen) {
        assert_eq!(m, "m1", "a cluster of a later stage was touched: {e}");
    }
    for m in ["m2", "m3", "m4"] {
        assert_eq!(image_in(&f, m).as_deref(), Some("web:1"), "{m}");
    }
}

#[test]
fn the_least_loaded_go_first_and_a_hot_cluster_waits_for_its_level() {
    let f = fleet();
    let s = &f.s;
    // m4 the hottest, yet under the default water level limit.
    for (m, load) in [("m1", 0.4), ("m2", 0.1), ("m3", 0.25), ("m4", 0.7)] {
        f.set_load(m, load);
    }
    eventually(Duration::from_secs(30), "the loads reported", || {
        let level = |m: &str| {
            s.get_json(&["cluster", m])["status"]["waterLevel"]["overall"]
                .as_f64()
                .unwrap_or(0.0)
        };
        level("m4") > 0.65 && level("m1") > 0.35 && level("m3") > 0.2
    });
    let stages = r#"      - {name: all, percent: 100, maxConcurrency: 1, minSuccessTime: 1s, waitForLevelBelow: 0.6}"#;
    s.apply(&deployment("web:1", false));
    s.apply(&policy(stages, ""));
    watch_until_all(&f, "web:1", Duration::from_secs(30));
    s.apply(&deployment("web:2", false));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut order = Vec::new();
    while order.len() < 3 {
        for m in ["m1", "m2", "m3", "m4"] {
            if !order.contains(&m) && image_in(&f, m).as_deref() == Some("web:2") {
                order.push(m);
            }
        }
        assert!(Instant::now() < deadline, "{order:?}; {}", rollout(&f));
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(order, ["m2", "m3", "m1"], "least loaded first");
    // The hot cluster waits, and the status says why.
    eventually(Duration::from_secs(10), "m4 waits for its level", || {
        let r = rollout(&f);
        r["clusters"].as_array().unwrap().iter().any(|c| {
            c["name"] == "m4"
                && c["state"] == "Waiting"
                && c["message"]
                    .as_str()
                    .unwrap_or("")
                    .contains("is not below 0.60")
        })
    });
    assert_eq!(image_in(&f, "m4").as_deref(), Some("web:1"));
    f.set_load("m4", 0.2);
    eventually(
        Duration::from_secs(40),
        "m4 updated once its load fell",
        || image_in(&f, "m4").as_deref() == Some("web:2"),
    );
    eventually(Duration::from_secs(20), "complete", || {
        rollout(&f)["phase"] == "Complete"
    });
}

#[test]
fn a_failover_mid_rollout_places_the_revision_its_stage_reached() {
    let mut f = Fleet::start_with(
        &[
            ("m1", "us-east"),
            ("m2", "us-west"),
            ("m3", "eu-west"),
            ("m4", "eu-north"),
        ],
        &[
            "--cluster-grace-period",
            "2s",
            "--cluster-eviction-timeout",
            "2s",
        ],
    );
    let s = &f.s;
    let stages = r#"      - {name: canary, clusterSelector: {matchLabels: {ring: canary}}}
      - {name: rest, percent: 100, approval: true}"#;
    let three = "    spreadConstraints: [{spreadByField: cluster, minGroups: 3, maxGroups: 3}]";
    s.apply(&deployment("web:1", false));
    s.apply(&placed(stages, "", three));
    // Where it settles: three clusters placed, each running it.
    let placed_and_running = || {
        let c: Vec<String> = f
            .clusters_of("web-deployment")
            .into_iter()
            .map(|c| c.0)
            .collect();
        (c.len() == 3
            && c.iter()
                .all(|m| image_in(&f, m).as_deref() == Some("web:1")))
        .then_some(c)
    };
    eventually(
        Duration::from_secs(30),
        "placed on three, running there",
        || placed_and_running().is_some(),
    );
    let chosen = placed_and_running().unwrap();
    let spare = ["m1", "m2", "m3", "m4"]
        .into_iter()
        .find(|m| !chosen.iter().any(|c| c == m))
        .unwrap();
    // The canary stage: one placed cluster and the spare.
    for m in ["m1", "m2", "m3", "m4"] {
        let ring = if m == chosen[0] || m == spare {
            "canary"
        } else {
            "rest"
        };
        s.ok(&[
            "label",
            "cluster",
            m,
            &format!("ring={ring}"),
            "--overwrite",
        ]);
    }
    s.apply(&deployment("web:2", false));
    eventually(
        Duration::from_secs(30),
        "the rest waits for approval",
        || rollout(&f)["phase"] == "WaitingForApproval",
    );
    assert_eq!(image_in(&f, &chosen[0]).as_deref(), Some("web:2"));
    // The canary's cluster goes dark: its copy fails over to the spare, a canary cluster,
    // which runs what the canary stage reached; the others keep revision 1.
    let i = f
        .agents
        .iter()
        .position(|(n, _, _)| *n == chosen[0])
        .unwrap();
    f.agents[i].1.kill9();
    eventually(Duration::from_secs(40), "the spare runs revision 2", || {
        f.clusters_of("web-deployment").iter().any(|c| c.0 == spare)
            && image_in(&f, spare).as_deref() == Some("web:2")
    });
    eventually(Duration::from_secs(20), "the others on revision 1", || {
        chosen[1..]
            .iter()
            .all(|m| image_in(&f, m).as_deref() == Some("web:1"))
    });
    let placed = f.clusters_of("web-deployment");
    assert_eq!(placed.len(), 3, "{placed:?}");
    assert_eq!(rollout(&f)["phase"], "WaitingForApproval");
}
