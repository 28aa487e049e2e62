//! Backups and restores: `orrery backup` under a write load holds every write acknowledged
//! before it; a server started from `orrery restore` converges with its members without any
//! operation in them for what did not change since the backup, and puts back only what did.

use crate::common;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::fleet::Fleet;
use common::{eventually, req};
use serde_json::{Value, json};

const SIM: &str = "nodes=2,cpu=8,memory=32Gi,load=0.1,start=100ms";

fn orrery(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_orrery"))
        .args(args)
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
}

fn image(f: &Fleet, cluster: &str, name: &str) -> Option<String> {
    f.find(cluster, "Deployment", name).and_then(|d| {
        d["spec"]["template"]["spec"]["containers"][0]["image"]
            .as_str()
            .map(str::to_string)
    })
}

#[test]
fn a_restore_under_writes_converges_with_no_member_operation_for_what_did_not_change() {
    let mut f = Fleet::start_sims(&[("m1", "r1", SIM), ("m2", "r2", SIM)], &[]);
    for name in ["web-1", "web-2", "web-3"] {
        f.s.apply(&format!(
            r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: default}}
spec:
  replicas: 2
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      containers: [{{name: c, image: "nginx:1.0", resources: {{requests: {{cpu: 100m}}}}}}]
---
apiVersion: policy.karmada.io/v1alpha1
kind: PropagationPolicy
metadata: {{name: {name}, namespace: default}}
spec:
  resourceSelectors: [{{apiVersion: apps/v1, kind: Deployment, name: {name}}}]
  placement:
    clusterAffinity: {{clusterNames: [m1, m2]}}
    replicaScheduling: {{replicaSchedulingType: Duplicated}}
"#
        ));
    }
    eventually(Duration::from_secs(60), "placed on both members", || {
        ["m1", "m2"].iter().all(|m| {
            ["web-1", "web-2", "web-3"]
                .iter()
                .all(|n| image(&f, m, n).as_deref() == Some("nginx:1.0"))
        })
    });

    // A write load: ConfigMaps created one after another, each acknowledged with its revision.
    let acknowledged: Arc<Mutex<Vec<(String, i64)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (acknowledged, stop) = (acknowledged.clone(), stop.clone());
        let kubeconfig = f.s.kubeconfig.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.block_on(async {
                let c = orrery_client::from_kubeconfig(&kubeconfig).await.unwrap();
                let mut i = 0;
                while !stop.load(Ordering::SeqCst) {
                    let name = format!("load-{i}");
                    let r = req(
                        "POST",
                        "/api/v1/namespaces/default/configmaps",
                        "application/json",
                        json!({"apiVersion": "v1", "kind": "ConfigMap",
                            "metadata": {"name": name}, "data": {"i": i.to_string()}}),
                    );
                    let (parts, body) = r.into_parts();
                    let r = http::Request::from_parts(parts, kube::client::Body::from(body));
                    if let Ok(resp) = c.send(r).await
                        && resp.status().as_u16() == 201
                    {
                        use http_body_util::BodyExt;
                        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
                        let v: Value = serde_json::from_slice(&bytes).unwrap();
                        let rv: i64 = v["metadata"]["resourceVersion"]
                            .as_str()
                            .unwrap()
                            .parse()
                            .unwrap();
                        acknowledged.lock().unwrap().push((name, rv));
                    }
                    i += 1;
                }
            });
        })
    };
    std::thread::sleep(Duration::from_secs(1));
    let before = acknowledged.lock().unwrap().len();
    assert!(before > 0, "the load writes");
    let file = f.s.dir.join("backup.db");
    let data_dir = f.s.dir.to_str().unwrap().to_string();
    let (ok, said) = orrery(&[
        "backup",
        "--data-dir",
        &data_dir,
        "--to",
        file.to_str().unwrap(),
    ]);
    assert!(ok, "{said}");
    let revision: i64 = said
        .split("at revision ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("no revision in {said:?}"));
    // Changed after the backup: the restore puts the older image back.
    f.s.ok(&[
        "set",
        "image",
        "deployment/web-1",
        "c=nginx:2.0",
        "-n",
        "default",
    ]);
    eventually(
        Duration::from_secs(30),
        "the new image on both members",
        || {
            ["m1", "m2"]
                .iter()
                .all(|m| image(&f, m, "web-1").as_deref() == Some("nginx:2.0"))
        },
    );
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::SeqCst);
    writer.join().unwrap();
    let acknowledged = acknowledged.lock().unwrap().clone();
    assert!(
        acknowledged.iter().any(|(_, rv)| *rv > revision),
        "writes went on past the backup"
    );

    let mut seen = BTreeMap::new();
    f.journals(&mut seen);
    f.s.kill9();
    let restored = tempfile::tempdir().unwrap();
    let (ok, said) = orrery(&[
        "restore",
        "--from",
        file.to_str().unwrap(),
        "--data-dir",
        restored.path().to_str().unwrap(),
    ]);
    assert!(ok, "{said}");
    assert!(said.contains("certificate authority"), "{said}");
    // Never over a store.
    let (ok, again) = orrery(&[
        "restore",
        "--from",
        file.to_str().unwrap(),
        "--data-dir",
        restored.path().to_str().unwrap(),
    ]);
    assert!(!ok && again.contains("new data directory"), "{again}");
    f.s.restart_in(restored.path().to_path_buf());

    // Every write acknowledged up to the backup's revision is there, none after it.
    let names: Vec<String> =
        f.s.ok(&[
            "get",
            "configmaps",
            "-n",
            "default",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ])
        .split_whitespace()
        .map(str::to_string)
        .collect();
    for (i, (name, rv)) in acknowledged.iter().enumerate() {
        let has = names.contains(name);
        if *rv <= revision {
            assert!(
                has,
                "{name} (revision {rv} <= {revision}) is in the restore"
            );
        } else {
            assert!(
                !has,
                "{name} (revision {rv} > {revision}) came after the backup"
            );
        }
        if i < before {
            assert!(has, "{name} was acknowledged before the backup began");
        }
    }
    // The members converge on the restored state: web-1's older image back, nothing else.
    eventually(Duration::from_secs(60), "the older image back", || {
        ["m1", "m2"]
            .iter()
            .all(|m| image(&f, m, "web-1").as_deref() == Some("nginx:1.0"))
    });
    eventually(Duration::from_secs(30), "members Ready again", || {
        ["m1", "m2"]
            .iter()
            .all(|m| f.s.cluster_condition(m, "Ready") == "True")
    });
    std::thread::sleep(Duration::from_secs(5));
    let ops = f.journals(&mut seen);
    let summary: Vec<String> = ops
        .iter()
        .map(|(m, e)| format!("{m} {} {} {}", e["op"], e["kind"], e["name"]))
        .collect();
    assert!(
        ops.iter()
            .all(|(_, e)| e["name"] == "web-1" && e["op"] == "update"),
        "only what changed after the backup is applied again: {summary:?}"
    );
    assert_eq!(ops.len(), 2, "web-1 once in each member: {summary:?}");
}

/// On etcd, the backup is etcd's own snapshot: etcdctl makes a data directory of it, and a
/// server on an etcd started there serves what was written before it.
#[test]
fn an_etcd_snapshot_restores_with_etcds_own_tool() {
    let etcd = orrery_store_testkit::etcd::EtcdServer::start().unwrap();
    let mut s =
        common::Server::start_with(&["--store", "etcd", "--etcd-endpoints", &etcd.endpoint]);
    for i in 0..5 {
        s.ok(&[
            "create",
            "configmap",
            &format!("before-{i}"),
            "-n",
            "default",
        ]);
    }
    let file = s.dir.join("etcd.snapshot");
    let (ok, said) = orrery(&[
        "backup",
        "--store",
        "etcd",
        "--etcd-endpoints",
        &etcd.endpoint,
        "--to",
        file.to_str().unwrap(),
    ]);
    assert!(ok, "{said}");
    assert!(said.contains("at revision "), "{said}");
    s.ok(&["create", "configmap", "after", "-n", "default"]);
    // `orrery restore` is for SQLite backups, and says what to do with this one.
    let elsewhere = tempfile::tempdir().unwrap();
    let (ok, refused) = orrery(&[
        "restore",
        "--from",
        file.to_str().unwrap(),
        "--data-dir",
        elsewhere.path().to_str().unwrap(),
    ]);
    assert!(
        !ok && refused.contains("etcdutl snapshot restore"),
        "{refused}"
    );
    s.kill9();
    drop(etcd);

    let etcd = orrery_store_testkit::etcd::EtcdServer::start_from(Some(&file)).unwrap();
    let s = common::Server::start_with(&["--store", "etcd", "--etcd-endpoints", &etcd.endpoint]);
    let names = s.ok(&[
        "get",
        "configmaps",
        "-n",
        "default",
        "-o",
        "jsonpath={.items[*].metadata.name}",
    ]);
    for i in 0..5 {
        assert!(names.contains(&format!("before-{i}")), "{names}");
    }
    assert!(!names.contains("after"), "{names}");
}
