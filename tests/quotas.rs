//! Kueue quotas from member capacity end to end (KubeStellar galaxy #36): Kueue's CRDs applied
//! to the control plane, three simulated members whose ClusterResourceClaims and ClusterMetrics
//! Orrery makes, claims assigned to two ClusterQueues by flavor, a node loss that lowers a
//! queue's quota but never below what it has admitted, and a member leaving with its share.

use crate::common;

use std::time::Duration;

use common::fleet::Fleet;
use common::{eventually, http};
use serde_json::Value;

const KUEUE_CRDS: &str = include_str!("fixtures/kueue-crds.yaml");

const QUEUES: &str = r#"
apiVersion: kueue.x-k8s.io/v1beta1
kind: ResourceFlavor
metadata: {name: on-demand}
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: ResourceFlavor
metadata: {name: spot}
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: ClusterQueue
metadata: {name: high}
spec:
  cohort: research
  namespaceSelector: {}
  resourceGroups:
  - coveredResources: [cpu, memory]
    flavors:
    - name: on-demand
      resources:
      - {name: cpu, nominalQuota: 0}
      - {name: memory, nominalQuota: 0}
  - coveredResources: [nvidia.com/gpu]
    flavors:
    - name: gpus
      resources:
      - {name: nvidia.com/gpu, nominalQuota: 4}
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: ClusterQueue
metadata: {name: low}
spec:
  namespaceSelector: {}
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: LocalQueue
metadata: {name: team, namespace: default}
spec: {clusterQueue: high}
"#;

/// A ClusterQueue's nominal quota of `flavor`/`resource`, as kubectl reads it.
fn quota(f: &Fleet, queue: &str, flavor: &str, resource: &str) -> String {
    let q = f.s.get_json(&["clusterqueue", queue, "-o", "json"]);
    q["spec"]["resourceGroups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["flavors"].as_array().cloned().unwrap_or_default())
        .filter(|fl| fl["name"] == flavor)
        .flat_map(|fl| fl["resources"].as_array().cloned().unwrap_or_default())
        .find(|r| r["name"] == resource)
        .map(|r| match &r["nominalQuota"] {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .unwrap_or_default()
}

fn claim(f: &Fleet, cluster: &str) -> Value {
    f.s.get_json(&[
        "clusterresourceclaim",
        &format!("{cluster}-resource-claim"),
        "-o",
        "json",
    ])
}

fn applied(claim: &Value) -> (String, String) {
    let c = claim["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Applied")
        .cloned()
        .unwrap_or_default();
    (
        c["reason"].as_str().unwrap_or_default().to_string(),
        c["message"].as_str().unwrap_or_default().to_string(),
    )
}

fn assign(f: &Fleet, cluster: &str, assignments: &str) {
    f.s.ok(&[
        "patch",
        "clusterresourceclaim",
        &format!("{cluster}-resource-claim"),
        "--type=merge",
        "-p",
        &format!(r#"{{"spec": {{"resourceAssignments": {assignments}}}}}"#),
    ]);
}

fn admit(f: &Fleet, queue: &str, cpu: &str) {
    f.s.ok(&[
        "patch",
        "clusterqueue",
        queue,
        "--subresource=status",
        "--type=merge",
        "-p",
        &format!(
            r#"{{"status": {{"admittedWorkloads": 1, "flavorsUsage": [{{"name": "on-demand", "resources": [{{"name": "cpu", "total": "{cpu}", "borrowed": "0"}}, {{"name": "memory", "total": "0", "borrowed": "0"}}]}}]}}}}"#
        ),
    ]);
}

#[test]
fn claims_feed_kueue_queues_and_follow_capacity_down_but_never_below_admitted() {
    let mut f = Fleet::start_with(
        &[("a", "r1"), ("b", "r1"), ("c", "r2")],
        &["--quota-interval", "1s"],
    );
    f.s.apply(KUEUE_CRDS);
    eventually(Duration::from_secs(20), "Kueue's kinds served", || {
        f.s.kubectl(&["get", "clusterqueues"]).status.success()
    });
    f.s.apply(QUEUES);

    // Orrery's part: a claim per member with its capacity, and its nodes in ClusterMetrics.
    eventually(Duration::from_secs(30), "every member's claim", || {
        ["a", "b", "c"].iter().all(|c| {
            f.s.kubectl(&[
                "get",
                "clusterresourceclaim",
                &format!("{c}-resource-claim"),
            ])
            .status
            .success()
        })
    });
    let a = claim(&f, "a");
    assert_eq!(a["spec"]["clusterName"], "a", "{a:#}");
    assert_eq!(a["spec"]["nominalResources"]["cpu"], "32", "{a:#}");
    assert_eq!(a["spec"]["nominalResources"]["memory"], "128Gi", "{a:#}");
    assert_eq!(
        a["metadata"]["ownerReferences"][0]["kind"], "Cluster",
        "{a:#}"
    );
    eventually(
        Duration::from_secs(30),
        "a's four nodes in its ClusterMetrics",
        || {
            let m = f.s.get_json(&["clustermetrics", "a", "-o", "json"]);
            m["status"]["nodes"].as_array().is_some_and(|n| {
                n.len() == 4
                    && n.iter().all(|n| {
                        n["allocatableResources"]["cpu"] == "8"
                            && n["allocatedResourceRequests"]["cpu"].is_string()
                    })
            })
        },
    );
    let names = f.s.ok(&["get", "cmet", "-o", "name"]);
    assert_eq!(names.lines().count(), 3, "{names}");
    assert_eq!(applied(&a).0, "NothingAssigned", "{a:#}");

    // Assignments beyond the nominal resources are refused, and nothing is lost.
    let refused = f.s.fails(&[
        "patch",
        "clusterresourceclaim",
        "c-resource-claim",
        "--type=merge",
        "-p",
        r#"{"spec": {"resourceAssignments": [{"clusterQueueName": "high", "flavor": "on-demand", "resources": {"cpu": "20"}}, {"clusterQueueName": "low", "flavor": "spot", "resources": {"cpu": "20"}}]}}"#,
    ]);
    assert!(
        refused.contains("assigns 40 of cpu in all, more than the cluster's nominal 32"),
        "{refused}"
    );

    // Two claims assign to two queues; each queue's quota is the sum of what names it.
    assign(
        &f,
        "a",
        r#"[{"clusterQueueName": "high", "flavor": "on-demand", "resources": {"cpu": "16", "memory": "64Gi"}},
            {"clusterQueueName": "low", "flavor": "spot", "resources": {"cpu": "16", "memory": "64Gi"}}]"#,
    );
    assign(
        &f,
        "b",
        r#"[{"clusterQueueName": "high", "flavor": "on-demand", "resources": {"cpu": "8", "memory": "32Gi"}}]"#,
    );
    eventually(Duration::from_secs(20), "the queues' quotas summed", || {
        quota(&f, "high", "on-demand", "cpu") == "24"
            && quota(&f, "high", "on-demand", "memory") == "96Gi"
            && quota(&f, "low", "spot", "cpu") == "16"
            && quota(&f, "low", "spot", "memory") == "64Gi"
    });
    // What Orrery does not keep is left alone.
    assert_eq!(quota(&f, "high", "gpus", "nvidia.com/gpu"), "4");
    let high = f.s.get_json(&["clusterqueue", "high", "-o", "json"]);
    assert_eq!(high["spec"]["cohort"], "research", "{high:#}");
    eventually(Duration::from_secs(10), "a's claim applied", || {
        applied(&claim(&f, "a")).0 == "QuotaApplied"
    });

    // The high queue has admitted 20 cores; a loses half its nodes: its share halves, but the
    // queue keeps what it has admitted until those workloads finish.
    admit(&f, "high", "20");
    let (code, body) = http(
        "PUT",
        f.admin("a"),
        "/clusters/a/faults",
        r#"{"lostNodes": 2}"#,
    );
    assert_eq!(code, 200, "{body}");
    eventually(
        Duration::from_secs(30),
        "a's quotas follow its capacity",
        || {
            quota(&f, "low", "spot", "cpu") == "8"
                && quota(&f, "high", "on-demand", "memory") == "64Gi"
                && quota(&f, "high", "on-demand", "cpu") == "20"
        },
    );
    let a = claim(&f, "a");
    assert_eq!(a["status"]["applied"]["cpu"], "16", "{a:#}");
    let (reason, message) = applied(&a);
    assert_eq!(reason, "WaitingForWorkloads", "{a:#}");
    assert!(
        message.contains("ClusterQueue high keeps on-demand/cpu at 20 (16 asked)"),
        "{message}"
    );
    // The workloads finish: the quota comes down to what the claims give.
    admit(&f, "high", "0");
    eventually(Duration::from_secs(20), "the quota released", || {
        quota(&f, "high", "on-demand", "cpu") == "16"
    });
    eventually(Duration::from_secs(10), "a's claim applied again", || {
        applied(&claim(&f, "a")).0 == "QuotaApplied"
    });

    // Each change is told on the queue.
    let events = f.s.ok(&[
        "get",
        "events",
        "-n",
        "default",
        "--field-selector",
        "involvedObject.name=high,reason=QuotaChanged",
        "-o",
        "jsonpath={range .items[*]}{.message}{\"\\n\"}{end}",
    ]);
    assert!(
        events.contains("nominalQuota of cpu in flavor on-demand: 20 -> 16"),
        "{events}"
    );

    // A restarted server finds everything as it should be and writes nothing.
    let rv = |f: &Fleet, what: &[&str]| {
        let mut args = vec!["get"];
        args.extend_from_slice(what);
        args.extend_from_slice(&["-o", "jsonpath={.metadata.resourceVersion}"]);
        f.s.ok(&args)
    };
    let before = (
        rv(&f, &["clusterqueue", "high"]),
        rv(&f, &["clusterqueue", "low"]),
        rv(&f, &["clusterresourceclaim", "b-resource-claim"]),
    );
    f.s.kill9();
    f.s.restart();
    eventually(Duration::from_secs(30), "the members back", || {
        ["a", "b", "c"]
            .iter()
            .all(|c| f.s.cluster_condition(c, "Ready") == "True")
    });
    std::thread::sleep(Duration::from_secs(3));
    let after = (
        rv(&f, &["clusterqueue", "high"]),
        rv(&f, &["clusterqueue", "low"]),
        rv(&f, &["clusterresourceclaim", "b-resource-claim"]),
    );
    assert_eq!(before, after, "a restart rewrote queues or claims");

    // b leaves: its claim goes with it, and so does its share of the queue.
    f.s.ok(&["delete", "cluster", "b", "--wait=false"]);
    eventually(Duration::from_secs(60), "b's claim gone", || {
        !f.s.kubectl(&["get", "clusterresourceclaim", "b-resource-claim"])
            .status
            .success()
    });
    eventually(Duration::from_secs(20), "b's share gone", || {
        quota(&f, "high", "on-demand", "cpu") == "8"
            && quota(&f, "high", "on-demand", "memory") == "32Gi"
    });
    let high = f.s.get_json(&["clusterqueue", "high", "-o", "json"]);
    assert_eq!(
        high["metadata"]["annotations"]["quota.orrery.io/managed"],
        r#"["on-demand/cpu","on-demand/memory"]"#,
        "{high:#}"
    );
}

/// Kueue's CRDs as JSON objects (for a simulated member's admin endpoint).
fn crd_objects() -> Vec<Value> {
    KUEUE_CRDS
        .split("\n---\n")
        .map(|doc| serde_saphyr::from_str::<Value>(doc).unwrap())
        .collect()
}

#[test]
fn queues_defined_here_run_in_the_kueue_cluster_and_its_admitted_usage_comes_back() {
    let f = Fleet::start_with(
        &[("a", "r1"), ("hub", "r1")],
        &["--quota-interval", "1s", "--kueue-cluster", "hub"],
    );
    // Kueue runs in hub: its CRDs there (as installing Kueue makes them), and here.
    for crd in crd_objects() {
        let (code, body) = http(
            "POST",
            f.admin("hub"),
            "/clusters/hub/objects",
            &crd.to_string(),
        );
        assert_eq!(code, 201, "{body}");
    }
    f.s.apply(KUEUE_CRDS);
    eventually(Duration::from_secs(20), "Kueue's kinds served", || {
        f.s.kubectl(&["get", "clusterqueues"]).status.success()
    });
    f.s.apply(QUEUES);
    let policy =
        f.s.get_json(&["clusterpropagationpolicy", "orrery-kueue", "-o", "json"]);
    assert_eq!(
        policy["spec"]["placement"]["clusterAffinity"]["clusterNames"],
        serde_json::json!(["hub"]),
        "{policy:#}"
    );
    eventually(Duration::from_secs(30), "a's claim", || {
        f.s.kubectl(&["get", "clusterresourceclaim", "a-resource-claim"])
            .status
            .success()
    });
    assign(
        &f,
        "a",
        r#"[{"clusterQueueName": "high", "flavor": "on-demand", "resources": {"cpu": "16"}}]"#,
    );
    // The quota reaches the queue in hub.
    let in_hub = |resource: &str| {
        f.find("hub", "ClusterQueue", "high").and_then(|q| {
            q["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
                .as_array()?
                .iter()
                .find(|r| r["name"] == resource)
                .map(|r| {
                    r["nominalQuota"]
                        .as_str()
                        .map(str::to_string)
                        .unwrap_or(r["nominalQuota"].to_string())
                })
        })
    };
    eventually(Duration::from_secs(30), "high's quota in hub", || {
        in_hub("cpu").as_deref() == Some("16")
    });
    // Its flavor is propagated on its own, and may land a moment after (Kueue holds a queue
    // whose flavor is missing inactive until it comes).
    eventually(Duration::from_secs(30), "the flavor in hub", || {
        f.find("hub", "ResourceFlavor", "on-demand").is_some()
    });
    // Kueue in hub admits 12 cores; the usage comes back to the queue defined here.
    let usage = serde_json::json!({
        "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue", "metadata": {"name": "high"},
        "status": {"admittedWorkloads": 3, "flavorsUsage": [{"name": "on-demand", "resources": [
            {"name": "cpu", "total": "12", "borrowed": "0"}, {"name": "memory", "total": "0", "borrowed": "0"}]}]},
    });
    let (code, body) = http(
        "PUT",
        f.admin("hub"),
        "/clusters/hub/objects/status",
        &usage.to_string(),
    );
    assert_eq!(code, 200, "{body}");
    eventually(Duration::from_secs(30), "hub's usage here", || {
        let q = f.s.get_json(&["clusterqueue", "high", "-o", "json"]);
        q["status"]["flavorsUsage"][0]["resources"][0]["total"] == "12"
    });
    // a loses half its nodes: its share halves to 8, but the queue keeps the 12 admitted.
    let (code, body) = http(
        "PUT",
        f.admin("a"),
        "/clusters/a/faults",
        r#"{"lostNodes": 2}"#,
    );
    assert_eq!(code, 200, "{body}");
    eventually(
        Duration::from_secs(30),
        "the quota held at what hub admitted",
        || quota(&f, "high", "on-demand", "cpu") == "12" && in_hub("cpu").as_deref() == Some("12"),
    );
    assert_eq!(applied(&claim(&f, "a")).0, "WaitingForWorkloads");
}
