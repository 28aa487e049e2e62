//! Stateful workloads end to end: a real server, one agent process per simulated member, the
//! real kubectl. A StatefulSet moves with its data (rounds of copies while it runs, a fence,
//! the last delta, the target started on exactly the fenced data), its follower goes after
//! it, a drain moves it the same way, and a server killed in the middle of a move resumes it.
//!
//! Every check of the data's safety reads what the members did (their data logs at the
//! agents' admin endpoints), not what the control plane says it did: no ordinal ever runs in
//! two clusters at once, the target's pods start on the version fenced at the source, and a
//! copy is never started again from zero.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::eventually;
use common::fleet::Fleet;
use serde_json::Value;

/// Pods start in 300 ms; volumes start with `used` bytes, written at `rate` bytes a second.
fn statefulset(used: &str, rate: &str) -> String {
    format!(
        r#"
apiVersion: apps/v1
kind: StatefulSet
metadata: {{name: db, namespace: default}}
spec:
  replicas: 2
  serviceName: db
  selector: {{matchLabels: {{app: db}}}}
  template:
    metadata:
      labels: {{app: db}}
      annotations: {{sim.orrery.io/volume-used: "{used}", sim.orrery.io/write-rate: "{rate}"}}
    spec:
      containers:
      - name: pg
        image: postgres:16
        resources: {{requests: {{cpu: 500m, memory: 512Mi}}}}
  volumeClaimTemplates:
  - metadata: {{name: data}}
    spec: {{resources: {{requests: {{storage: 2Gi}}}}}}
"#
    )
}

fn db_policy(clusters: &[&str]) -> String {
    format!(
        r#"
apiVersion: multicluster.io/v1alpha1
kind: ResourcePlacementPolicy
metadata: {{name: db, namespace: default}}
spec:
  resourceSelector: {{apiVersion: apps/v1, kind: StatefulSet, name: db, namespace: default}}
  placement:
    clusterAffinity: {{clusterNames: [{}]}}
    spreadConstraints: [{{spreadByField: cluster, maxGroups: 1}}]
"#,
        clusters.join(", ")
    )
}

const APP: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: app, namespace: default}
spec:
  replicas: 2
  selector: {matchLabels: {app: app}}
  template:
    metadata: {labels: {app: app}}
    spec:
      containers:
      - name: app
        image: app:1
        resources: {requests: {cpu: 100m, memory: 64Mi}}
---
apiVersion: multicluster.io/v1alpha1
kind: ResourcePlacementPolicy
metadata: {name: app, namespace: default}
spec:
  resourceSelector: {apiVersion: apps/v1, kind: Deployment, name: app, namespace: default}
  placement:
    followUp: {apiVersion: apps/v1, kind: StatefulSet, name: db}
"#;

fn sim(bandwidth: &str) -> String {
    format!("nodes=4,cpu=8,memory=32Gi,load=0.1,start=300ms,bandwidth={bandwidth}")
}

fn migrations(f: &Fleet) -> Vec<Value> {
    f.s.get_json(&["migrations", "-n", "default"])["items"]
        .as_array()
        .unwrap()
        .clone()
}

/// The cluster db runs in, once it is placed whole there and its pods are ready.
fn db_placed(f: &Fleet) -> String {
    let mut placed = String::new();
    eventually(Duration::from_secs(30), "db placed", || {
        match f.clusters_of("db-statefulset").first() {
            Some((c, 2)) => {
                placed = c.clone();
                f.find(c, "StatefulSet", "db")
                    .is_some_and(|s| s["status"]["readyReplicas"] == 2)
            }
            _ => false,
        }
    });
    placed
}

/// The one migration of the test, once it reached `phase` (or any, with `None`).
fn wait_migration(f: &Fleet, phase: Option<&str>, timeout: Duration) -> Value {
    let mut found = Value::Null;
    eventually(timeout, &format!("a migration {phase:?}"), || {
        let ms = migrations(f);
        match ms.iter().find(|m| {
            phase.is_none_or(|p| m["status"]["phase"] == p) && m["status"]["phase"] != "Failed"
        }) {
            Some(m) => {
                found = m.clone();
                true
            }
            None => {
                if let Some(failed) = ms.iter().find(|m| m["status"]["phase"] == "Failed") {
                    panic!("a migration failed: {failed:#}");
                }
                false
            }
        }
    });
    found
}

/// A member's data log (volumes, pods on them, snapshots, copies).
fn data_log(f: &Fleet, cluster: &str) -> Vec<Value> {
    let (code, body) = common::http(
        "GET",
        f.admin(cluster),
        &format!("/clusters/{cluster}/data"),
        "",
    );
    assert_eq!(code, 200, "{body}");
    serde_json::from_str::<Value>(&body).unwrap()["items"]
        .as_array()
        .unwrap()
        .clone()
}

/// Checks what the members did with the StatefulSet's volumes: at no moment two clusters
/// run a pod on the same ordinal's volume, and every pod that started on the target after
/// the move started on the version the source had when its pod stopped last.
fn check_data(f: &Fleet, members: &[&str]) {
    // (time, cluster, event, volume, version)
    let mut events: Vec<(u64, String, String, String, u64)> = Vec::new();
    for m in members {
        for e in data_log(f, m) {
            if e["workload"] != "StatefulSet/db"
                && !e["event"].as_str().unwrap().starts_with("copy")
            {
                continue;
            }
            events.push((
                e["timeMs"].as_u64().unwrap(),
                m.to_string(),
                e["event"].as_str().unwrap().to_string(),
                e["volume"].as_str().unwrap().to_string(),
                e["dataVersion"].as_u64().unwrap(),
            ));
        }
    }
    events.sort();
    let started_in: std::collections::BTreeSet<&String> = events
        .iter()
        .filter(|e| e.2 == "pod-started")
        .map(|e| &e.1)
        .collect();
    assert!(
        started_in.len() >= 2,
        "pods ran in {started_in:?} only: {events:#?}"
    );
    // Running pods per volume name, by cluster; the version each volume was left at.
    let mut running: BTreeMap<String, BTreeMap<String, u32>> = BTreeMap::new();
    let mut left_at: BTreeMap<String, u64> = BTreeMap::new();
    for (t, cluster, ev, vol, version) in &events {
        let on = running.entry(vol.clone()).or_default();
        match ev.as_str() {
            "pod-started" => {
                *on.entry(cluster.clone()).or_default() += 1;
                let clusters: Vec<&String> =
                    on.iter().filter(|(_, n)| **n > 0).map(|(c, _)| c).collect();
                assert!(
                    clusters.len() <= 1,
                    "{vol} runs in {clusters:?} at once (at {t} ms): {events:#?}"
                );
                if let Some(last) = left_at.get(vol) {
                    assert_eq!(
                        version, last,
                        "{vol} started in {cluster} on version {version}, but its data was left at {last}"
                    );
                }
            }
            "pod-stopped" => {
                *on.entry(cluster.clone()).or_default() -= 1;
                left_at.insert(vol.clone(), *version);
            }
            _ => {}
        }
    }
}

/// The volumes of a migration: each fenced version equals the version its pod started on.
fn check_versions(m: &Value) {
    let vols = m["status"]["volumes"].as_array().unwrap();
    assert_eq!(vols.len(), 2, "{m:#}");
    for v in vols {
        assert!(v["fencedVersion"].as_u64().unwrap() > 1, "{v}");
        assert_eq!(v["fencedVersion"], v["startedVersion"], "{v}");
        assert_eq!(v["targetVersion"], v["fencedVersion"], "{v}");
        // A failover copies nothing: the standby held the data already.
        if m["status"]["standbyFailover"] != true {
            assert!(
                v["copied"].as_i64().unwrap() >= v["bytes"].as_i64().unwrap(),
                "{v}"
            );
        }
    }
}

#[test]
fn a_policy_change_moves_a_statefulset_and_its_follower_to_the_faster_link_with_their_data() {
    let f = Fleet::start_sims(
        &[
            ("src", "eu", &sim("100Mi")),
            ("slow", "eu", &sim("10Mi")),
            ("fast", "us", &sim("1Gi")),
        ],
        &["--migration-cleanup-grace", "2s"],
    );
    f.s.apply(&format!(
        "{}---{}",
        statefulset("64Mi", "1Mi"),
        db_policy(&["src"])
    ));
    f.s.apply(APP);
    eventually(
        Duration::from_secs(30),
        "db and its follower in src",
        || {
            f.clusters_of("db-statefulset") == vec![("src".to_string(), 2)]
                && f.clusters_of("app-deployment") == vec![("src".to_string(), 2)]
                && f.find("src", "StatefulSet", "db")
                    .is_some_and(|s| s["status"]["readyReplicas"] == 2)
        },
    );
    // Members in separate processes measure no latency to one another: each reports its
    // round trip to the control plane (the scheduler estimates a pair from both), and no
    // Cluster carries a matrix of every other cluster.
    eventually(
        Duration::from_secs(20),
        "every member's round trip to the control plane",
        || {
            ["src", "slow", "fast"].iter().all(|c| {
                let cl = f.s.get_json(&["cluster", c]);
                cl["status"]["network"]["serverLatencyMs"]
                    .as_f64()
                    .is_some()
                    && cl["status"]["network"]["estimatedLatencyMs"].is_null()
            })
        },
    );
    let described = f.s.ok(&["describe", "cluster", "fast"]);
    assert!(described.contains("Server Latency Ms"), "{described}");
    let sts = f.find("src", "StatefulSet", "db").unwrap();
    let vols = sts["status"]["volumes"].as_array().unwrap();
    assert_eq!(vols.len(), 2, "{sts:#}");
    assert_eq!(vols[0]["name"], "data-db-0");
    assert!(
        vols[0]["usedBytes"].as_i64().unwrap() >= 64 << 20,
        "{sts:#}"
    );

    // The policy no longer admits src: db moves to the cluster its data reaches soonest.
    f.s.apply(&db_policy(&["slow", "fast"]));
    let m = wait_migration(&f, Some("Succeeded"), Duration::from_secs(60));
    assert_eq!(m["spec"]["reason"], "PolicyChange", "{m:#}");
    assert_eq!(m["status"]["source"], "src");
    assert_eq!(m["status"]["target"], "fast");
    let slow = m["status"]["estimate"]["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["cluster"] == "slow")
        .unwrap()
        .clone();
    assert!(
        slow["reason"]
            .as_str()
            .unwrap()
            .starts_with("copying its data takes"),
        "{slow}"
    );
    // Its follower ran in src: each candidate's latency to it counted.
    assert!(slow["latencyMs"].as_f64().is_some(), "{slow}");
    check_versions(&m);
    let downtime = m["status"]["downtimeSeconds"].as_f64().unwrap();
    assert!(downtime > 0.0 && downtime < 10.0, "downtime {downtime}");
    assert!(m["status"]["rounds"].as_u64().unwrap() >= 2, "{m:#}");
    let phases: Vec<&str> = m["status"]["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["phase"].as_str().unwrap())
        .collect();
    assert_eq!(
        phases,
        [
            "Pending",
            "Replicating",
            "Fencing",
            "FinalSync",
            "Starting",
            "Switching",
            "Cleaning"
        ]
    );
    // The follower went after it, and the source's copy and volumes are gone.
    eventually(
        Duration::from_secs(30),
        "the follower in fast, nothing left in src",
        || {
            f.clusters_of("app-deployment") == vec![("fast".to_string(), 2)]
                && f.find("fast", "Deployment", "app")
                    .is_some_and(|d| d["status"]["readyReplicas"] == 2)
                && f.find("src", "Deployment", "app").is_none()
                && f.find("src", "StatefulSet", "db").is_none()
        },
    );
    let deleted: Vec<Value> = data_log(&f, "src")
        .into_iter()
        .filter(|e| e["event"] == "volume-deleted")
        .collect();
    assert_eq!(
        deleted.len(),
        2,
        "the source's volumes go with its copy: {deleted:#?}"
    );
    assert!(
        data_log(&f, "slow").is_empty(),
        "the slower cluster was never used"
    );
    check_data(&f, &["src", "fast"]);
    let b =
        f.s.get_json(&["resourcebinding", "db-statefulset", "-n", "default"]);
    assert_eq!(
        b["spec"]["clusters"],
        serde_json::json!([{"name": "fast", "replicas": 2}])
    );
    assert!(b["spec"].get("migration").is_none(), "{b:#}");
    // kubectl shows it.
    let table = f.s.ok(&["get", "migrations", "-n", "default"]);
    assert!(
        table.contains("Succeeded") && table.contains("fast"),
        "{table}"
    );
    let described = f.s.ok(&["describe", "migration", "-n", "default"]);
    assert!(
        described.contains("Candidates") && described.contains("Fenced Version"),
        "{described}"
    );
    let events = f.s.ok(&[
        "get",
        "events",
        "-n",
        "default",
        "--field-selector",
        "involvedObject.name=db",
    ]);
    assert!(
        events.contains("MigrationStarted") && events.contains("Migrated"),
        "{events}"
    );
    // Told once: decisions taken again before the Migration's target was seen say nothing.
    let told: Vec<Value> = f.s.get_json(&["events", "-n", "default"])["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["reason"] == "MigrationStarted" && e["involvedObject"]["name"] == "db")
        .cloned()
        .collect();
    assert_eq!(told.len(), 1, "{told:#?}");
    assert_eq!(told[0]["count"].as_i64().unwrap_or(1), 1, "{told:#?}");
}

#[test]
fn a_noexecute_taint_drains_a_statefulset_with_its_data() {
    let f = Fleet::start_sims(
        &[("a", "eu", &sim("200Mi")), ("b", "eu", &sim("200Mi"))],
        &[
            "--migration-cleanup-grace",
            "1s",
            "--migration-switch-timeout",
            "4s",
        ],
    );
    f.s.apply(&format!(
        "{}---{}",
        statefulset("32Mi", "512Ki"),
        db_policy(&["a", "b"])
    ));
    let placed = db_placed(&f);
    let other = if placed == "a" { "b" } else { "a" };
    // A disruption budget that keeps one of its two replicas ready: its moves stop the whole
    // source, so the Migration holds its fence; the binding says how.
    set_budget(&f, r#"{"minAvailable":1}"#);
    eventually(Duration::from_secs(20), "the budget's condition", || {
        let rb = f.s.get_json(&["resourcebinding", "db-statefulset"]);
        rb["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter().any(|c| {
                c["type"] == "DisruptionBudget"
                    && c["status"] == "True"
                    && c["reason"] == "FenceHeld"
                    && c["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("at least 1"))
            })
        })
    });
    // A Service for its pods, kept in its first cluster by its policy: it cannot follow,
    // and the switch says so once it stops waiting for it.
    f.s.apply(&format!(
        r#"
apiVersion: v1
kind: Service
metadata: {{name: db, namespace: default}}
spec:
  selector: {{app: db}}
  ports: [{{port: 5432}}]
---
apiVersion: multicluster.io/v1alpha1
kind: ResourcePlacementPolicy
metadata: {{name: db-service, namespace: default}}
spec:
  resourceSelector: {{apiVersion: v1, kind: Service, name: db, namespace: default}}
  placement:
    clusterAffinity: {{clusterNames: [{placed}]}}
    clusterTolerations: [{{key: maintenance, operator: Exists, effect: NoExecute}}]
"#
    ));
    eventually(Duration::from_secs(20), "the Service in place", || {
        f.find(&placed, "Service", "db").is_some()
    });
    f.s.ok(&[
        "patch",
        "cluster",
        &placed,
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"taints":[{"key":"maintenance","effect":"NoExecute"}]}}"#,
    ]);
    // The drain's Migration copies, then waits at the fence: stopping both ready replicas
    // would leave none. The source keeps serving while it waits.
    eventually(
        Duration::from_secs(60),
        "the fence held by the budget",
        || {
            let ms = migrations(&f);
            ms.first().is_some_and(|m| {
                m["status"]["phase"] == "Replicating"
                    && m["status"]["conditions"].as_array().is_some_and(|cs| {
                        cs.iter().any(|c| {
                            c["reason"] == "BudgetWaits"
                                && c["message"].as_str().is_some_and(|t| {
                                    t.contains(&format!(
                                        "2 ready replica(s) in {placed} would leave 0"
                                    ))
                                })
                        })
                    })
            })
        },
    );
    let rounds = migrations(&f)[0]["status"]["rounds"].clone();
    for _ in 0..4 {
        std::thread::sleep(Duration::from_millis(500));
        let m = &migrations(&f)[0];
        assert_eq!(m["status"]["phase"], "Replicating", "{m:#}");
        assert_eq!(
            m["status"]["rounds"], rounds,
            "nothing copied while it waits: {m:#}"
        );
        let db = f
            .find(&placed, "StatefulSet", "db")
            .expect("db still in its cluster");
        assert_eq!(db["status"]["readyReplicas"], 2, "{db:#}");
    }
    assert!(any_event(&f, |e| e["reason"] == "MigrationWaits"));
    // The budget let go: the move goes on.
    set_budget(&f, r#"{"minAvailable":null,"maxUnavailable":"100%"}"#);
    let m = wait_migration(&f, Some("Succeeded"), Duration::from_secs(60));
    assert_eq!(m["spec"]["reason"], "Drain", "{m:#}");
    assert!(
        m["status"]["rounds"].as_u64() > rounds.as_u64(),
        "one more round after the wait: {m:#}"
    );
    let cleaning = m["status"]["phases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["phase"] == "Switching")
        .unwrap()["durationMs"]
        .as_i64()
        .unwrap();
    assert!(cleaning >= 4000, "the switch waited for the Service: {m:#}");
    assert!(any_event(&f, |e| {
        e["reason"] == "MigrationSwitchIncomplete"
            && e["message"]
                .as_str()
                .is_some_and(|t| t.contains("Service db still not serving"))
    }));
    assert_eq!(
        (
            m["status"]["source"].as_str(),
            m["status"]["target"].as_str()
        ),
        (Some(placed.as_str()), Some(other))
    );
    check_versions(&m);
    eventually(
        Duration::from_secs(20),
        "nothing left in the drained cluster",
        || f.find(&placed, "StatefulSet", "db").is_none(),
    );
    check_data(&f, &["a", "b"]);
}

/// Sets db's policy's disruption budget (a merge patch of it).
fn set_budget(f: &Fleet, budget: &str) {
    f.s.ok(&[
        "patch",
        "resourceplacementpolicy",
        "db",
        "--type=merge",
        "-p",
        &format!(r#"{{"spec":{{"placement":{{"disruptionBudget":{budget}}}}}}}"#),
    ]);
}

/// Whether an Event in `default` matches (all of them printed when none does).
fn any_event(f: &Fleet, matches: impl Fn(&Value) -> bool) -> bool {
    let events = f.s.get_json(&["events", "-n", "default"]);
    let found = events["items"].as_array().unwrap().iter().any(matches);
    if !found {
        eprintln!("{events:#}");
    }
    found
}

/// Starts a user's Migration of db to `target` (Orrery checks the target like any).
fn migrate(f: &Fleet, name: &str, target: &str) {
    f.s.apply(&format!(
        r#"
apiVersion: multicluster.io/v1alpha1
kind: Migration
metadata: {{name: {name}, namespace: default}}
spec:
  resource: {{apiVersion: apps/v1, kind: StatefulSet, name: db}}
  targetClusters: [{target}]
"#
    ));
}

fn migration(f: &Fleet, name: &str) -> Value {
    f.s.get_json(&["migration", name, "-n", "default"])
}

#[test]
fn a_server_killed_while_replicating_and_while_fencing_resumes_the_move() {
    let mut f = Fleet::start_sims(
        &[("src", "eu", &sim("16Mi")), ("dst", "eu", &sim("16Mi"))],
        &["--migration-cleanup-grace", "1s"],
    );
    // 2 x 96 MiB over 16 MiB/s: a first round of 12 s.
    f.s.apply(&format!(
        "{}---{}",
        statefulset("96Mi", "256Ki"),
        db_policy(&["src", "dst"])
    ));
    let from = db_placed(&f);
    let to = if from == "src" { "dst" } else { "src" };

    // A user's Migration; the server is killed while the first round is being copied.
    migrate(&f, "first", to);
    eventually(Duration::from_secs(30), "the first round under way", || {
        let m = migration(&f, "first");
        m["status"]["phase"] == "Replicating"
            && m["status"]["volumes"]
                .as_array()
                .is_some_and(|v| v.iter().any(|v| v["roundCopied"].as_i64().unwrap_or(0) > 0))
    });
    f.s.kill9();
    std::thread::sleep(Duration::from_secs(2));
    f.s.restart();
    let m = {
        let mut m = Value::Null;
        eventually(Duration::from_secs(90), "the first move done", || {
            m = migration(&f, "first");
            assert_ne!(m["status"]["phase"], "Failed", "{m:#}");
            m["status"]["phase"] == "Succeeded"
        });
        m
    };
    assert!(
        m["spec"].get("reason").is_none(),
        "a user's Migration keeps its spec: {m:#}"
    );
    check_versions(&m);
    // The target copied round 1 once: the copy went on through the restart.
    let starts: Vec<Value> = data_log(&f, to)
        .into_iter()
        .filter(|e| e["event"] == "copy-started" && e["round"] == 1)
        .collect();
    assert_eq!(
        starts.len(),
        2,
        "one start of round 1 per volume: {starts:#?}"
    );

    // Back again; the source answers slowly, so the fence takes a while, and the server is
    // killed while it holds.
    migrate(&f, "second", &from);
    eventually(
        Duration::from_secs(60),
        "the second move's last round",
        || {
            let m = migration(&f, "second");
            m["status"]["phase"] == "Replicating"
                && m["status"]["rounds"].as_u64().unwrap_or(0) >= 1
        },
    );
    let (code, body) = common::http(
        "PUT",
        f.admin(to),
        &format!("/clusters/{to}/faults"),
        r#"{"latencyMs": 3000}"#,
    );
    assert_eq!(code, 200, "{body}");
    eventually(Duration::from_secs(60), "the fence", || {
        migration(&f, "second")["status"]["phase"] == "Fencing"
    });
    f.s.kill9();
    std::thread::sleep(Duration::from_secs(1));
    f.s.restart();
    let (code, body) = common::http("DELETE", f.admin(to), &format!("/clusters/{to}/faults"), "");
    assert_eq!(code, 200, "{body}");
    let m = {
        let mut m = Value::Null;
        eventually(Duration::from_secs(90), "the second move done", || {
            m = migration(&f, "second");
            assert_ne!(m["status"]["phase"], "Failed", "{m:#}");
            m["status"]["phase"] == "Succeeded"
        });
        m
    };
    check_versions(&m);
    check_data(&f, &["src", "dst"]);
    assert_eq!(f.clusters_of("db-statefulset"), vec![(from.clone(), 2)]);
}

#[test]
fn a_copy_refused_while_the_data_mover_is_down_starts_once_it_is_back() {
    let f = Fleet::start_sims(
        &[("src", "eu", &sim("64Mi")), ("dst", "eu", &sim("64Mi"))],
        &["--migration-cleanup-grace", "1s"],
    );
    f.s.apply(&format!(
        "{}---{}",
        statefulset("32Mi", "64Ki"),
        db_policy(&["src", "dst"])
    ));
    let from = db_placed(&f);
    let to = if from == "src" { "dst" } else { "src" };
    // The source's API answers (the cluster stays Ready), its data mover does not: the
    // first round's snapshot is refused as unavailable.
    let path = format!("/clusters/{from}/faults");
    let (code, body) = common::http("PUT", f.admin(&from), &path, r#"{"dataMoverOutage": true}"#);
    assert_eq!(code, 200, "{body}");
    migrate(&f, "late", to);
    let ns = format!("orrery-cluster-{from}");
    eventually(Duration::from_secs(30), "the transfer refused", || {
        let w = f.s.get_json(&["work", "default.db-statefulset", "-n", &ns]);
        w["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| {
                c["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("data mover"))
            })
    });
    // Retried while the Work stays as it is: nothing starts while the mover is down.
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        !data_log(&f, &from).iter().any(|e| e["event"] == "snapshot"),
        "no snapshot while the data mover is down"
    );
    assert_eq!(migration(&f, "late")["status"]["phase"], "Replicating");
    let (code, body) = common::http("DELETE", f.admin(&from), &path, "");
    assert_eq!(code, 200, "{body}");
    let m = {
        let mut m = Value::Null;
        eventually(Duration::from_secs(60), "the move done", || {
            m = migration(&f, "late");
            assert_ne!(m["status"]["phase"], "Failed", "{m:#}");
            m["status"]["phase"] == "Succeeded"
        });
        m
    };
    check_versions(&m);
    check_data(&f, &["src", "dst"]);
    assert_eq!(f.clusters_of("db-statefulset"), vec![(to.to_string(), 2)]);
}

#[test]
fn a_migration_that_cannot_be_done_says_why() {
    let f = Fleet::start_sims(
        &[("a", "eu", &sim("100Mi")), ("b", "eu", &sim("100Mi"))],
        &[],
    );
    // A Deployment owns no volumes.
    f.s.apply(APP.split("---").next().unwrap());
    f.s.apply(
        r#"
apiVersion: multicluster.io/v1alpha1
kind: ResourcePlacementPolicy
metadata: {name: app, namespace: default}
spec:
  resourceSelector: {apiVersion: apps/v1, kind: Deployment, name: app, namespace: default}
  placement: {clusterAffinity: {clusterNames: [a]}}
"#,
    );
    eventually(Duration::from_secs(30), "app placed", || {
        f.clusters_of("app-deployment") == vec![("a".to_string(), 2)]
    });
    f.s.apply(
        r#"
apiVersion: multicluster.io/v1alpha1
kind: Migration
metadata: {name: nodata, namespace: default}
spec:
  resource: {apiVersion: apps/v1, kind: Deployment, name: app}
"#,
    );
    eventually(Duration::from_secs(20), "the migration refused", || {
        let m = migration(&f, "nodata");
        m["status"]["phase"] == "Failed"
            && m["status"]["message"]
                .as_str()
                .unwrap_or("")
                .contains("owns no persistent volumes")
    });
    // Bad specs are refused at once, with the field.
    let err = f.s.fails_stdin(
        &["apply", "-f", "-"],
        "apiVersion: multicluster.io/v1alpha1\nkind: Migration\nmetadata: {name: bad, namespace: default}\nspec: {resource: {apiVersion: apps/v1, kind: StatefulSet, name: db}, targetClusters: [b, b]}\n",
    );
    assert!(err.contains("spec.targetClusters[1]"), "{err}");
}

#[test]
fn a_lost_source_fails_over_to_its_standby_copy_and_reports_what_was_lost() {
    let mut f = Fleet::start_sims(
        &[
            ("a", "us", &sim("100Mi")),
            ("b", "eu", &sim("100Mi")),
            ("c", "eu", &sim("100Mi")),
        ],
        &[
            "--cluster-grace-period",
            "3s",
            "--cluster-eviction-timeout",
            "2s",
            "--migration-cleanup-grace",
            "1s",
        ],
    );
    let policy = r#"
apiVersion: multicluster.io/v1alpha1
kind: ResourcePlacementPolicy
metadata: {name: db, namespace: default}
spec:
  resourceSelector: {apiVersion: apps/v1, kind: StatefulSet, name: db, namespace: default}
  placement:
    spreadConstraints: [{spreadByField: cluster, maxGroups: 1}]
    stateful:
      standby: {maxLagSeconds: 4}
"#;
    f.s.apply(&format!("{}---{}", statefulset("32Mi", "1Mi"), policy));
    // Placed, with a standby elsewhere kept a few rounds in sync.
    let (mut primary, mut standby) = (String::new(), String::new());
    eventually(
        Duration::from_secs(40),
        "db placed with a standby in sync",
        || {
            let b =
                f.s.get_json(&["resourcebinding", "db-statefulset", "-n", "default"]);
            let placed = f.clusters_of("db-statefulset");
            let Some((p, 2)) = placed.first().cloned() else {
                return false;
            };
            primary = p;
            standby = b["spec"]["standby"].as_str().unwrap_or("").to_string();
            !standby.is_empty()
                && standby != primary
                && b["status"]["standby"]["rounds"].as_u64().unwrap_or(0) >= 2
                && b["status"]["standby"]["lagSeconds"]
                    .as_f64()
                    .unwrap_or(99.0)
                    < 4.0
        },
    );
    // The standby holds the volumes, runs no pods.
    let held: Vec<Value> = data_log(&f, &standby)
        .into_iter()
        .filter(|e| e["event"] == "copy-done")
        .collect();
    assert!(
        held.len() >= 4,
        "two volumes, two rounds at least: {held:#?}"
    );
    assert!(f.find(&standby, "StatefulSet", "db").is_none());

    // The primary's cluster is lost, with the member and what it ran.
    let agent = &mut f
        .agents
        .iter_mut()
        .find(|(n, _, _)| *n == primary)
        .unwrap()
        .1;
    agent.kill9();
    let m = wait_migration(&f, Some("Succeeded"), Duration::from_secs(60));
    assert_eq!(m["spec"]["reason"], "ClusterFailover", "{m:#}");
    assert_eq!(
        m["status"]["target"].as_str(),
        Some(standby.as_str()),
        "{m:#}"
    );
    assert_eq!(m["status"]["standbyFailover"], true);
    let loss = &m["status"]["dataLoss"];
    assert!(
        loss["bytes"].as_i64().unwrap() > 0,
        "writes after the last round are lost: {m:#}"
    );
    let secs = loss["seconds"].as_f64().unwrap();
    assert!(
        (0.0..10.0).contains(&secs),
        "the loss is within the allowed lag, give or take: {secs}"
    );
    check_versions(&m);
    // It runs in the standby's cluster, on the last round it copied.
    eventually(Duration::from_secs(20), "db running on the standby", || {
        f.find(&standby, "StatefulSet", "db")
            .is_some_and(|s| s["status"]["readyReplicas"] == 2)
    });
    let log = data_log(&f, &standby);
    for vol in ["data-db-0", "data-db-1"] {
        let last_copy = log
            .iter()
            .rfind(|e| e["event"] == "copy-done" && e["volume"] == vol)
            .unwrap();
        let started = log
            .iter()
            .find(|e| e["event"] == "pod-started" && e["volume"] == vol)
            .unwrap();
        assert_eq!(started["dataVersion"], last_copy["dataVersion"], "{vol}");
    }
    // And a new standby is chosen among the clusters still there.
    eventually(Duration::from_secs(30), "a new standby", || {
        let b =
            f.s.get_json(&["resourcebinding", "db-statefulset", "-n", "default"]);
        let s = b["spec"]["standby"].as_str().unwrap_or("");
        !s.is_empty() && s != primary && s != standby
    });
}

/// The target goes dark while it starts the workload on the copied data: the move waits for
/// it rather than failing back (the source started again while the target may run the
/// workload would be two writers), and finishes once the target answers. At no moment do
/// both clusters run an ordinal.
#[test]
fn a_target_dark_while_it_starts_the_workload_is_waited_for() {
    let f = Fleet::start_sims(
        &[
            (
                "src",
                "eu",
                "nodes=4,cpu=8,memory=32Gi,load=0.1,start=3s,bandwidth=64Mi",
            ),
            (
                "dst",
                "eu",
                "nodes=4,cpu=8,memory=32Gi,load=0.1,start=3s,bandwidth=64Mi",
            ),
        ],
        &["--migration-cleanup-grace", "1s"],
    );
    f.s.apply(&format!(
        "{}---{}",
        statefulset("16Mi", "64Ki"),
        db_policy(&["src", "dst"])
    ));
    let from = db_placed(&f);
    let to = if from == "src" { "dst" } else { "src" };
    migrate(&f, "dark", to);
    // Pods take 3 s to start: the outage comes while they do.
    eventually(
        Duration::from_secs(60),
        "the workload released at the target",
        || migration(&f, "dark")["status"]["phase"] == "Starting",
    );
    let path = format!("/clusters/{to}/faults");
    let (code, body) = common::http("PUT", f.admin(to), &path, r#"{"outage": true}"#);
    assert_eq!(code, 200, "{body}");
    std::thread::sleep(Duration::from_secs(6));
    let m = migration(&f, "dark");
    assert_eq!(m["status"]["phase"], "Starting", "{m:#}");
    check_data(&f, &["src", "dst"]);
    let (code, body) = common::http("DELETE", f.admin(to), &path, "");
    assert_eq!(code, 200, "{body}");
    let mut m = Value::Null;
    eventually(Duration::from_secs(60), "the move done", || {
        m = migration(&f, "dark");
        assert_ne!(m["status"]["phase"], "Failed", "{m:#}");
        m["status"]["phase"] == "Succeeded"
    });
    check_versions(&m);
    check_data(&f, &["src", "dst"]);
    assert_eq!(f.clusters_of("db-statefulset"), vec![(to.to_string(), 2)]);
}
