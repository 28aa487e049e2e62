//! The examples of `examples/`, as a newcomer runs them: `orrery up`, then the real kubectl
//! and the REST script against it. Each must place what it says, so none of them rots.

use crate::common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::eventually;
use serde_json::Value;

struct Up {
    child: Child,
    dir: tempfile::TempDir,
}

impl Drop for Up {
    fn drop(&mut self) {
        common::signal(self.child.id(), "INT");
        let _ = self.child.wait();
    }
}

fn up(clusters: usize) -> Up {
    up_in(tempfile::tempdir().unwrap(), clusters)
}

/// `orrery up` on a data directory (a new one, or one a stopped `orrery up` left).
fn up_in(dir: tempfile::TempDir, clusters: usize) -> Up {
    let port = common::free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_orrery"))
        .args(["up", "--clusters", &clusters.to_string(), "--data-dir"])
        .arg(dir.path())
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.path().join("up.log")).unwrap())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    for l in lines.by_ref() {
        if l.unwrap().starts_with("Ctrl-C stops everything") {
            break;
        }
    }
    std::thread::spawn(move || for _ in lines {});
    Up { child, dir }
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

impl Up {
    /// Stops it with SIGINT (Ctrl-C) or SIGKILL; the data directory is handed back.
    fn stop(mut self, how: &str) -> tempfile::TempDir {
        common::signal(self.child.id(), how);
        let _ = self.child.wait();
        let dir = tempfile::tempdir().unwrap();
        std::mem::replace(&mut self.dir, dir)
    }

    /// Every binding and Work: uid, generation, placement, and the times of their conditions
    /// and of their members' health (a workload recreated in a member shows in those).
    fn state(&self) -> Vec<String> {
        let mut out = Vec::new();
        for kind in ["resourcebindings", "works"] {
            let (ok, json) = self.kubectl(&["get", kind, "-A", "-o", "json"]);
            assert!(ok, "{json}");
            let v: Value = serde_json::from_str(&json).unwrap();
            for o in v["items"].as_array().unwrap() {
                let times = |path: &str, key: &str| -> Vec<String> {
                    o.pointer(path)
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .map(|c| format!("{}", c[key]))
                        .collect()
                };
                out.push(format!(
                    "{} {}/{} uid {} generation {} clusters {} conditions {:?} health {:?}",
                    o["kind"],
                    o["metadata"]["namespace"],
                    o["metadata"]["name"],
                    o["metadata"]["uid"],
                    o["metadata"]["generation"],
                    o["spec"]["clusters"],
                    times("/status/conditions", "lastTransitionTime"),
                    times("/status/aggregatedStatus", "healthSince"),
                ));
            }
        }
        out.sort();
        out
    }

    fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("admin.kubeconfig")
    }

    fn kubectl(&self, args: &[&str]) -> (bool, String) {
        let o = Command::new("kubectl")
            .args(args)
            .env("KUBECONFIG", self.kubeconfig())
            .env("HOME", self.dir.path())
            .output()
            .unwrap();
        (
            o.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
        )
    }

    /// Replicas per cluster of a binding's decision.
    fn placed(&self, binding: &str) -> BTreeMap<String, i64> {
        let (ok, out) = self.kubectl(&["get", "resourcebinding", binding, "-o", "json"]);
        if !ok {
            return BTreeMap::new();
        }
        let v: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
        v["spec"]["clusters"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|c| {
                        (
                            c["name"].as_str().unwrap_or("").to_string(),
                            c["replicas"].as_i64().unwrap_or(0),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[test]
fn every_example_places_what_it_says() {
    let u = up(4);
    for f in [
        "web.yaml",
        "karmada.yaml",
        "statefulset.yaml",
        "job.yaml",
        "cost.yaml",
        "autoscaling.yaml",
    ] {
        let path = examples().join(f);
        let (ok, out) = u.kubectl(&["apply", "-f", path.to_str().unwrap()]);
        assert!(ok, "{f}: {out}");
    }
    // web: by water level over the clusters with TLS, all 12 replicas.
    eventually(Duration::from_secs(30), "web placed", || {
        let p = u.placed("web-deployment");
        p.values().sum::<i64>() == 12 && p.keys().all(|c| c == "aws-us-east" || c == "gcp-europe")
    });
    eventually(Duration::from_secs(60), "web ready in the members", || {
        let (_, out) = u.kubectl(&[
            "get",
            "deploy",
            "web",
            "-o",
            "jsonpath={.status.readyReplicas}",
        ]);
        out.trim() == "12"
    });
    // karmada: static weights 2:1.
    eventually(Duration::from_secs(30), "api placed 4 + 2", || {
        u.placed("api-deployment")
            == BTreeMap::from([
                ("aws-us-east".to_string(), 4),
                ("gcp-europe".to_string(), 2),
            ])
    });
    // statefulset: one cluster, all of it.
    eventually(Duration::from_secs(30), "cache in one cluster", || {
        let p = u.placed("cache-statefulset");
        p.len() == 1 && p.values().all(|n| *n == 3)
    });
    // job: only where there are GPUs.
    eventually(Duration::from_secs(30), "train on the GPU cluster", || {
        let p = u.placed("train-job");
        p.keys().map(String::as_str).collect::<Vec<_>>() == ["onprem-gpu"]
    });
    // cost: all 10 within the budget, the cheapest cluster (on premises, 0.0119 a replica
    // against 0.0202 and more in the clouds) holding more than any other.
    eventually(Duration::from_secs(30), "workers placed by price", || {
        let p = u.placed("workers-deployment");
        let cheapest = p.get("onprem-gpu").copied().unwrap_or(0);
        p.values().sum::<i64>() == 10 && p.iter().all(|(c, n)| c == "onprem-gpu" || *n < cheapest)
    });
    let (ok, out) = u.kubectl(&[
        "get",
        "resourcebinding",
        "workers-deployment",
        "-o",
        "jsonpath={.status.cost.hourly}",
    ]);
    assert!(ok, "{out}");
    let hourly: f64 = out.trim().parse().unwrap();
    assert!(hourly > 0.0 && hourly <= 0.2, "{hourly}");
    // autoscaling: the members report the shop's usage (above its target whatever the time
    // of the simulated day), and its FederatedHPA scales it up; the scheduler places them.
    eventually(
        Duration::from_secs(90),
        "the shop scaled on its usage",
        || {
            let (_, out) = u.kubectl(&[
            "get",
            "fhpa",
            "shop",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"ScalingActive\")].reason} {.status.desiredReplicas}",
        ]);
            let mut it = out.split_whitespace();
            it.next() == Some("ValidMetricFound")
                && it
                    .next()
                    .and_then(|n| n.parse::<i64>().ok())
                    .is_some_and(|n| n > 2)
        },
    );
    eventually(
        Duration::from_secs(30),
        "the shop's replicas placed",
        || u.placed("shop-deployment").values().sum::<i64>() > 2,
    );
    // `orrery status` shows the fleet and where the workloads run.
    let out = Command::new(env!("CARGO_BIN_EXE_orrery"))
        .args(["status", "--kubeconfig"])
        .arg(u.kubeconfig())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("CLUSTERS (4 registered, 4 ready)"), "{text}");
    assert!(text.contains("onprem-gpu"), "{text}");
    assert!(
        text.lines().any(|l| l.starts_with("default/web")
            && l.contains("Deployment")
            && l.contains("aws-us-east(")
            || l.starts_with("default/web") && l.contains("gcp-europe(")),
        "{text}"
    );
    assert!(text.contains("default/train"), "{text}");

    // The draft's REST calls, as the script makes them: on objects of its own, removed at
    // the end; a Deployment no policy places stays unplaced, and the rest where it was.
    let (ok, out) = u.kubectl(&["create", "deployment", "loner", "--image", "nginx"]);
    assert!(ok, "{out}");
    let before = (u.placed("web-deployment"), u.placed("api-deployment"));
    let out = Command::new("bash")
        .arg(examples().join("dro-rest.sh"))
        .env_remove("ORRERY_DATA_DIR")
        .env("KUBECONFIG", u.kubeconfig())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "dro-rest.sh failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("\"activeClusters\":4"), "{stdout}");
    // The DroExample is placed where the patched policy says (its CRD went to the members
    // first, so they serve the kind).
    let placed = stdout
        .lines()
        .find(|l| l.starts_with("\"clusters\":["))
        .unwrap_or_else(|| panic!("the DroExample was not placed: {stdout}"));
    assert!(
        placed.contains("aws-us-east") && placed.contains("gcp-europe"),
        "{placed}"
    );
    assert_eq!(
        (u.placed("web-deployment"), u.placed("api-deployment")),
        before
    );
    assert!(
        u.placed("loner-deployment").is_empty(),
        "the script placed a Deployment of yours"
    );
    eventually(Duration::from_secs(20), "the script's objects gone", || {
        let (_, crds) = u.kubectl(&["get", "crd", "-o", "name"]);
        let (_, clusters) = u.kubectl(&["get", "clusters", "-o", "name"]);
        !crds.contains("droexamples") && !clusters.contains("gcp-production")
    });

    // A newcomer's first run warns of nothing (the agents' CA fetch, checked against the
    // token's pin, is not a warning).
    let log = std::fs::read_to_string(u.dir.path().join("up.log")).unwrap();
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains("WARN")).collect();
    assert!(warnings.is_empty(), "{warnings:#?}");
}

#[test]
fn orrery_up_started_again_moves_nothing() {
    let u = up(3);
    for f in ["web.yaml", "statefulset.yaml"] {
        let path = examples().join(f);
        let (ok, out) = u.kubectl(&["apply", "-f", path.to_str().unwrap()]);
        assert!(ok, "{f}: {out}");
    }
    eventually(Duration::from_secs(60), "web and cache ready", || {
        ["deploy/web", "statefulset/cache"].iter().all(|o| {
            let (_, ready) = u.kubectl(&["get", o, "-o", "jsonpath={.status.readyReplicas}"]);
            let (_, want) = u.kubectl(&["get", o, "-o", "jsonpath={.spec.replicas}"]);
            !want.trim().is_empty() && ready.trim() == want.trim()
        })
    });
    // Settled: the members' health reported.
    std::thread::sleep(Duration::from_secs(3));
    let before = u.state();
    assert!(before.len() >= 4, "bindings and Works: {before:#?}");
    let mut u = u;
    for how in ["INT", "KILL"] {
        let dir = u.stop(how);
        u = up_in(dir, 3);
        // Long enough for every agent to reconnect, resume and report twice; a fleet at rest
        // logs nothing at INFO once started (no "slow round" every few seconds).
        std::thread::sleep(Duration::from_secs(3));
        let info = |log: &str| log.lines().filter(|l| l.contains(" INFO ")).count();
        let started = std::fs::read_to_string(u.dir.path().join("up.log")).unwrap();
        std::thread::sleep(Duration::from_secs(5));
        let log = std::fs::read_to_string(u.dir.path().join("up.log")).unwrap();
        assert!(!log.contains('\u{1b}'), "colours in a file: {log}");
        assert_eq!(
            info(&started),
            info(&log),
            "INFO lines at rest after SIG{how}:\n{}",
            &log[started.len()..]
        );
        assert!(
            info(&log) <= 15,
            "{} INFO lines to start:\n{log}",
            info(&log)
        );
        let after = u.state();
        assert_eq!(
            before, after,
            "started again after SIG{how}: bindings, Works, placements or the members' workloads changed"
        );
    }
}

/// `examples/stateful.yaml` and `examples/migration.yaml`: the database runs in one of its
/// clusters with a standby copy in another and its API beside it; the Migration moves it with
/// its data, and the API follows.
#[test]
fn the_stateful_example_moves_the_database_with_its_data_and_the_api_follows() {
    let u = up(4);
    let apply = |f: &str| {
        let path = examples().join(f);
        let (ok, out) = u.kubectl(&["apply", "-f", path.to_str().unwrap()]);
        assert!(ok, "{f}: {out}");
    };
    apply("stateful.yaml");
    let mut first = String::new();
    eventually(
        Duration::from_secs(60),
        "db and its API together, with a standby",
        || {
            let db = u.placed("db-statefulset");
            let api = u.placed("orders-api-deployment");
            let (_, b) = u.kubectl(&["get", "resourcebinding", "db-statefulset", "-o", "json"]);
            let b: Value = serde_json::from_str(&b).unwrap_or(Value::Null);
            let Some((c, 2)) = db.iter().next().map(|(c, n)| (c.clone(), *n)) else {
                return false;
            };
            first = c.clone();
            api == BTreeMap::from([(c.clone(), 3)])
                && b["spec"]["standby"]
                    .as_str()
                    .is_some_and(|s| !s.is_empty() && s != c)
                && b["status"]["standby"]["rounds"].as_u64().unwrap_or(0) >= 1
        },
    );
    apply("migration.yaml");
    eventually(Duration::from_secs(90), "the move done", || {
        let (_, m) = u.kubectl(&["get", "migration", "db-move", "-o", "json"]);
        let m: Value = serde_json::from_str(&m).unwrap_or(Value::Null);
        assert_ne!(m["status"]["phase"], "Failed", "{m:#}");
        matches!(
            m["status"]["phase"].as_str(),
            Some("Cleaning" | "Succeeded")
        ) && m["status"]["volumes"].as_array().is_some_and(|v| {
            v.len() == 2 && v.iter().all(|v| v["startedVersion"] == v["fencedVersion"])
        })
    });
    eventually(Duration::from_secs(60), "the API followed", || {
        let db = u.placed("db-statefulset");
        let api = u.placed("orders-api-deployment");
        db.len() == 1 && !db.contains_key(&first) && api.keys().eq(db.keys())
    });
    // Its Service went along, and the switch did not wait out its timeout for it.
    let svc = u.placed("db-service");
    assert!(svc.keys().eq(u.placed("db-statefulset").keys()), "{svc:?}");
    let (_, m) = u.kubectl(&["get", "migration", "db-move", "-o", "json"]);
    let m: Value = serde_json::from_str(&m).unwrap();
    let switching = m["status"]["phases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["phase"] == "Switching")
        .unwrap()
        .clone();
    assert!(
        switching["durationMs"].as_i64().unwrap() < 30_000,
        "the switch waited for nothing it had: {m:#}"
    );
}

/// `orrery up` stopped in the middle of a move (Ctrl-C, then `kill -9`), members and all:
/// started again, the move goes on from where it was and ends on the fenced data.
#[test]
fn orrery_up_stopped_during_a_move_resumes_it() {
    let mut u = up(4);
    let (ok, out) = u.kubectl(&[
        "apply",
        "-f",
        examples().join("stateful.yaml").to_str().unwrap(),
    ]);
    assert!(ok, "{out}");
    eventually(Duration::from_secs(60), "db placed", || {
        u.placed("db-statefulset").values().sum::<i64>() == 2
    });
    let migration = |u: &Up, name: &str| -> Value {
        let (_, m) = u.kubectl(&["get", "migration", name, "-o", "json"]);
        serde_json::from_str(&m).unwrap_or(Value::Null)
    };
    for (i, how) in ["INT", "KILL"].into_iter().enumerate() {
        let name = format!("move-{i}");
        let m = format!(
            "apiVersion: multicluster.io/v1alpha1\nkind: Migration\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  resource: {{apiVersion: apps/v1, kind: StatefulSet, name: db}}\n"
        );
        let file = u.dir.path().join(format!("{name}.yaml"));
        std::fs::write(&file, m).unwrap();
        let (ok, out) = u.kubectl(&["apply", "-f", file.to_str().unwrap()]);
        assert!(ok, "{out}");
        // (The second waits for the first to finish cleaning up.)
        eventually(Duration::from_secs(60), "the first round under way", || {
            let m = migration(&u, &name);
            m["status"]["phase"] == "Replicating"
                && m["status"]["volumes"]
                    .as_array()
                    .is_some_and(|v| v.iter().any(|v| v["roundCopied"].as_i64().unwrap_or(0) > 0))
        });
        let dir = u.stop(how);
        u = up_in(dir, 4);
        let mut m = Value::Null;
        eventually(Duration::from_secs(120), "the move done", || {
            m = migration(&u, &name);
            assert_ne!(m["status"]["phase"], "Failed", "after SIG{how}: {m:#}");
            // Cleaning: the target serves; the source's copy goes after its grace period.
            matches!(
                m["status"]["phase"].as_str(),
                Some("Cleaning" | "Succeeded")
            )
        });
        for v in m["status"]["volumes"].as_array().unwrap() {
            assert_eq!(v["startedVersion"], v["fencedVersion"], "SIG{how}: {v}");
            // Copied once, with what was written meanwhile: not again from zero.
            let (bytes, copied) = (v["bytes"].as_i64().unwrap(), v["copied"].as_i64().unwrap());
            assert!(
                copied < bytes + bytes / 2,
                "after SIG{how} the copy started again: {copied} of {bytes}: {m:#}"
            );
        }
    }
}

/// `orrery sim` drives `orrery up`'s simulated clusters: faults and load, undone again.
#[test]
fn orrery_sim_drives_the_fleet_of_orrery_up() {
    let u = up(2);
    let sim = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_orrery"))
            .arg("sim")
            .args(args)
            .arg("--data-dir")
            .arg(u.dir.path())
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, list, err) = sim(&["list"]);
    assert!(ok, "{err}");
    assert!(list.contains("aws-us-east"), "{list}");
    assert_eq!(list.lines().count(), 3, "a header and two clusters: {list}");

    let (ok, out, err) = sim(&["fault", "aws-us-east", "load", "0.9"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("aws-us-east runs at a background load of 0.9"),
        "{out}"
    );
    eventually(
        Duration::from_secs(20),
        "the load in the cluster's water level",
        || {
            let (_, level) = u.kubectl(&[
                "get",
                "cluster",
                "aws-us-east",
                "-o",
                "jsonpath={.status.waterLevel.cpu}",
            ]);
            level.trim().parse::<f64>().is_ok_and(|l| l >= 0.85)
        },
    );

    let (ok, _, err) = sim(&["fault", "aws-us-east", "outage"]);
    assert!(ok, "{err}");
    let (_, list, _) = sim(&["list"]);
    let line = list.lines().find(|l| l.starts_with("aws-us-east")).unwrap();
    assert!(line.ends_with("outage"), "{list}");
    let (ok, _, err) = sim(&["fault", "aws-us-east", "recover"]);
    assert!(ok, "{err}");
    let (_, list, _) = sim(&["list"]);
    let line = list.lines().find(|l| l.starts_with("aws-us-east")).unwrap();
    assert!(line.ends_with('-'), "{list}");

    let (ok, _, err) = sim(&["fault", "nowhere", "outage"]);
    assert!(!ok);
    assert!(
        err.contains("no simulated cluster is called \"nowhere\""),
        "{err}"
    );
    let (ok, _, err) = sim(&["fault", "aws-us-east", "load", "1.5"]);
    assert!(!ok && err.contains("between 0 and 1"), "{err}");
    let elsewhere = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_orrery"))
        .args(["sim", "list", "--data-dir"])
        .arg(elsewhere.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("is `orrery up` running on this data directory?"),
        "{out:?}"
    );

    // One way to find the data directory: the KUBECONFIG `orrery up --data-dir D` prints, or
    // ORRERY_DATA_DIR=D, is enough for every command (run from a directory holding no
    // ./orrery-data, with a KUBECONFIG elsewhere where ORRERY_DATA_DIR is set).
    let bare = tempfile::tempdir().unwrap();
    let orrery = |args: &[&str], env: (&str, &Path)| {
        let out = Command::new(env!("CARGO_BIN_EXE_orrery"))
            .args(args)
            .current_dir(bare.path())
            .env_remove("ORRERY_DATA_DIR")
            .env("KUBECONFIG", elsewhere.path().join("config"))
            .env(env.0, env.1)
            .output()
            .unwrap();
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let exported = u.kubeconfig();
    for env in [
        ("KUBECONFIG", exported.as_path()),
        ("ORRERY_DATA_DIR", u.dir.path()),
    ] {
        let (ok, out) = orrery(&["sim", "list"], env);
        assert!(ok && out.contains("aws-us-east"), "{env:?}: {out}");
        let (ok, out) = orrery(&["status"], env);
        assert!(
            ok && out.contains("CLUSTERS (2 registered"),
            "{env:?}: {out}"
        );
        let (ok, out) = orrery(&["token", "create", "--cluster", "later"], env);
        assert!(ok && out.trim().len() > 20, "{env:?}: {out}");
        let (ok, out) = orrery(&["kubeconfig", "--cluster", "aws-us-east"], env);
        assert!(
            ok && out.contains("/clusters/aws-us-east/proxy"),
            "{env:?}: {out}"
        );
    }
}
