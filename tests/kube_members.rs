//! Members that are real Kubernetes APIs: the agent's `kube` backend (pull mode) and the
//! server's own driving of a member (push mode, `orrery join`). A second Orrery server stands
//! in for the member's Kubernetes API (no real cluster runs here): it serves Nodes, Pods,
//! Deployments, server-side apply and ClusterProperties as Kubernetes does.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{Agent, Server, eventually};
use serde_json::{Value, json};

/// A member with two ready nodes, one that is not, a running pod, an object Orrery must not
/// touch, and its cluster id as a ClusterProperty.
fn member() -> Server {
    let m = Server::start();
    for (name, cpu, ready) in [
        ("n1", "4", "True"),
        ("n2", "8", "True"),
        ("n3", "16", "False"),
    ] {
        m.apply(&format!(
            "apiVersion: v1\nkind: Node\nmetadata: {{name: {name}}}\n"
        ));
        let status = json!({"status": {
            "allocatable": {"cpu": cpu, "memory": "16Gi", "pods": "110"},
            "capacity": {"cpu": cpu, "memory": "16Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": ready}],
        }});
        m.ok(&[
            "patch",
            "node",
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            &status.to_string(),
        ]);
    }
    m.apply(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: busy, namespace: default}\nspec:\n  nodeName: n1\n  containers:\n  - {name: c, image: x, resources: {requests: {cpu: '1', memory: 1Gi}}}\n",
    );
    m.apply("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: legacy, namespace: default}\ndata: {owner: someone-else}\n");
    m.apply("apiVersion: about.k8s.io/v1alpha1\nkind: ClusterProperty\nmetadata: {name: cluster.clusterset.k8s.io}\nspec: {value: member-one}\n");
    m
}

const WORK: &str = r#"
apiVersion: multicluster.io/v1alpha1
kind: Work
metadata: {name: shop}
spec:
  workload:
    manifests:
    - apiVersion: apps/v1
      kind: Deployment
      metadata: {name: web, namespace: shop}
      spec:
        replicas: 2
        selector: {matchLabels: {app: web}}
        template:
          metadata: {labels: {app: web}}
          spec: {containers: [{name: web, image: "nginx:1.27"}]}
    - apiVersion: v1
      kind: ConfigMap
      metadata: {name: legacy, namespace: default}
      data: {owner: orrery}
"#;

fn manifest_status(s: &Server, ns: &str, i: usize) -> Value {
    s.get_json(&["work", "shop", "-n", ns])["status"]["manifestStatuses"][i].clone()
}

#[test]
fn the_kube_backend_drives_a_member_api() {
    let m = member();
    let s = Server::start();
    let token = s.token("m1");
    let mk = m.kubeconfig.display().to_string();
    let _agent = Agent::start(
        &s,
        "m1",
        &[
            "--cluster",
            "m1",
            "--token",
            &token,
            "--kubeconfig",
            &mk,
            "--heartbeat-interval",
            "1s",
            "--report-interval",
            "200ms",
        ],
    );
    eventually(Duration::from_secs(15), "Ready", || {
        s.cluster_condition("m1", "Ready") == "True"
    });
    let c = s.get_json(&["cluster", "m1"]);
    let st = &c["status"];
    assert_eq!(
        st["nodeSummary"],
        json!({"totalNum": 3, "readyNum": 2}),
        "{st}"
    );
    assert_eq!(
        st["resourceSummary"]["allocatable"]["cpu"], "12",
        "ready nodes only"
    );
    assert_eq!(st["resourceSummary"]["allocated"]["cpu"], "1");
    assert_eq!(st["largestNodeFree"]["cpu"], "8");
    assert!((st["waterLevel"]["cpu"].as_f64().unwrap() - 1.0 / 12.0).abs() < 0.001);
    assert_eq!(st["properties"]["cluster.clusterset.k8s.io"], "member-one");
    assert!(st["kubernetesVersion"].as_str().unwrap().starts_with('v'));
    assert!(st["apiEnablements"].to_string().contains("deployments"));

    s.stdin(&["apply", "-n", "orrery-cluster-m1", "-f", "-"], WORK);
    // Applied with server-side apply as "orrery", into a namespace the agent created.
    eventually(
        Duration::from_secs(10),
        "the Deployment in the member",
        || {
            m.kubectl(&["get", "deploy", "web", "-n", "shop"])
                .status
                .success()
        },
    );
    let d = m.ok(&[
        "get",
        "deploy",
        "web",
        "-n",
        "shop",
        "--show-managed-fields",
        "-o",
        "json",
    ]);
    let d: Value = serde_json::from_str(&d).unwrap();
    assert_eq!(
        d["metadata"]["labels"]["multicluster.io/managed-by"],
        "orrery"
    );
    assert_eq!(
        d["metadata"]["annotations"]["multicluster.io/work"],
        "orrery-cluster-m1/shop"
    );
    let mf = d["metadata"]["managedFields"].as_array().unwrap();
    assert!(
        mf.iter()
            .any(|e| e["manager"] == "orrery" && e["operation"] == "Apply"),
        "{mf:?}"
    );
    // The object someone else owns is left alone, and the Work says why.
    eventually(
        Duration::from_secs(10),
        "the conflict in the Work's status",
        || {
            manifest_status(&s, "orrery-cluster-m1", 1)["message"]
                .as_str()
                .unwrap_or("")
                .contains("not managed by Orrery")
        },
    );
    assert_eq!(
        m.ok(&["get", "cm", "legacy", "-o", "jsonpath={.data.owner}"]),
        "someone-else"
    );
    let w = s.get_json(&["work", "shop", "-n", "orrery-cluster-m1"]);
    assert!(
        w["status"]["conditions"]
            .to_string()
            .contains("AppliedFailed"),
        "{w}"
    );
    // The member's own controller reports progress; the watch brings it back.
    let status = json!({"status": {"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2, "availableReplicas": 2}});
    m.ok(&[
        "patch",
        "deploy",
        "web",
        "-n",
        "shop",
        "--subresource=status",
        "--type=merge",
        "-p",
        &status.to_string(),
    ]);
    eventually(
        Duration::from_secs(10),
        "the member's status in the Work",
        || {
            let ms = manifest_status(&s, "orrery-cluster-m1", 0);
            ms["health"] == "Healthy" && ms["status"]["readyReplicas"] == 2
        },
    );
    // Deleting the Work deletes what Orrery applied, and only that.
    s.ok(&["delete", "work", "shop", "-n", "orrery-cluster-m1"]);
    eventually(Duration::from_secs(10), "the Deployment to go", || {
        !m.kubectl(&["get", "deploy", "web", "-n", "shop"])
            .status
            .success()
    });
    assert_eq!(
        m.ok(&["get", "cm", "legacy", "-o", "jsonpath={.data.owner}"]),
        "someone-else"
    );
}

#[test]
fn push_mode_drives_a_reachable_member_without_an_agent() {
    let m = member();
    let s = Server::start();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_orrery"))
        .args(["join", "m2", "--kubeconfig"])
        .arg(&m.kubeconfig)
        .arg("--server-kubeconfig")
        .arg(&s.kubeconfig)
        .args(["--region", "on-prem", "--labels", "site=lab"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("joined in Push mode"));
    eventually(
        Duration::from_secs(15),
        "the Push cluster to be Ready",
        || s.cluster_condition("m2", "Ready") == "True",
    );
    let c = s.get_json(&["cluster", "m2"]);
    assert_eq!(c["spec"]["syncMode"], "Push");
    assert_eq!(c["spec"]["apiEndpoint"], m.url.as_str());
    assert_eq!(c["metadata"]["labels"]["site"], "lab");
    assert!(
        c["status"]["conditions"]
            .to_string()
            .contains("PushConnected")
    );
    assert_eq!(c["status"]["nodeSummary"]["readyNum"], 2);
    let table = s.ok(&["get", "clusters"]);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("m2") && l.contains("Push")),
        "{table}"
    );
    // The server itself applies the Work to the member.
    s.stdin(&["apply", "-n", "orrery-cluster-m2", "-f", "-"], WORK);
    eventually(
        Duration::from_secs(10),
        "the Deployment in the member",
        || {
            m.kubectl(&["get", "deploy", "web", "-n", "shop"])
                .status
                .success()
        },
    );
    // An agent cannot take a Push cluster over.
    let token = s.token("m2");
    let mut a = Agent::start(
        &s,
        "m2",
        &[
            "--cluster",
            "m2",
            "--token",
            &token,
            "--simulate",
            "nodes=1",
        ],
    );
    assert!(!a.wait_exit(Duration::from_secs(20)).success());
    assert!(a.log().contains("Push cluster"), "{}", a.log());
}

#[test]
fn push_clusters_with_bad_credentials_say_so() {
    let s = Server::start();
    s.apply("apiVersion: v1\nkind: Secret\nmetadata: {name: broken, namespace: orrery-system}\nstringData: {kubeconfig: 'not a kubeconfig'}\n");
    s.apply("apiVersion: multicluster.io/v1alpha1\nkind: Cluster\nmetadata: {name: broken}\nspec: {syncMode: Push, secretRef: {namespace: orrery-system, name: broken}}\n");
    eventually(Duration::from_secs(10), "Ready=False", || {
        s.cluster_condition("broken", "Ready") == "False"
    });
    let c = s.get_json(&["cluster", "broken"]);
    assert!(
        c["status"]["conditions"]
            .to_string()
            .contains("PushCredentialsInvalid"),
        "{c}"
    );
    // A Push cluster without its secret reference is refused outright.
    let err = s.fails_stdin(
        &["apply", "-f", "-"],
        "apiVersion: multicluster.io/v1alpha1\nkind: Cluster\nmetadata: {name: nocreds}\nspec: {syncMode: Push}\n",
    );
    assert!(err.contains("spec.secretRef"), "{err}");
}
