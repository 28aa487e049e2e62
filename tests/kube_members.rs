//! Members that are real Kubernetes APIs: the agent's `kube` backend (pull mode) and the
//! server's own driving of a member (push mode, `orrery join`). A second Orrery server stands
//! in for the member's Kubernetes API (no real cluster runs here): it serves Nodes, Pods,
//! Deployments, server-side apply and ClusterProperties as Kubernetes does.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{Agent, Server, eventually};
use serde_json::{Value, json};

/// A member with two ready nodes (one with 8 H100 GPUs, as NVIDIA's feature discovery labels
/// it), one that is not, a running pod, an object Orrery must not touch, and its cluster id as
/// a ClusterProperty.
fn member() -> Server {
    let m = Server::start();
    for (name, cpu, ready) in [
        ("n1", "4", "True"),
        ("n2", "8", "True"),
        ("n3", "16", "False"),
    ] {
        let gpus = if name == "n2" { "8" } else { "0" };
        m.apply(&format!(
            "apiVersion: v1\nkind: Node\nmetadata: {{name: {name}, labels: {{nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}}}}\n"
        ));
        let status = json!({"status": {
            "allocatable": {"cpu": cpu, "memory": "16Gi", "pods": "110", "nvidia.com/gpu": gpus},
            "capacity": {"cpu": cpu, "memory": "16Gi", "pods": "110", "nvidia.com/gpu": gpus},
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
    // Its GPUs, for data-aware scheduling: the model from the nodes' labels, its
    // performance from Orrery's table.
    assert_eq!(
        st["properties"]["gpu.orrery.io/model"],
        "NVIDIA-H100-80GB-HBM3"
    );
    assert_eq!(st["properties"]["gpu.orrery.io/performance"], "3");
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
    // No metrics server in the member: no usage.
    assert!(
        manifest_status(&s, "orrery-cluster-m1", 0)["usage"].is_null(),
        "usage without a metrics API"
    );
    // Now it has one (metrics.k8s.io PodMetrics, served here as a custom resource), and the
    // workload two pods: one ready with metrics, one not yet measured.
    m.apply(
        r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: pods.metrics.k8s.io}
spec:
  group: metrics.k8s.io
  names: {kind: PodMetrics, plural: pods, singular: podmetrics}
  scope: Namespaced
  versions:
  - name: v1beta1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
"#,
    );
    for pod in ["web-1", "web-2"] {
        m.apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {pod}, namespace: shop, labels: {{app: web}}}}\nspec:\n  nodeName: n1\n  containers:\n  - {{name: web, image: x, resources: {{requests: {{cpu: 250m, memory: 128Mi}}}}}}\n"
        ));
        m.ok(&[
            "patch",
            "pod",
            pod,
            "-n",
            "shop",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}"#,
        ]);
    }
    eventually(Duration::from_secs(10), "the metrics API served", || {
        m.kubectl(&["get", "podmetrics", "-n", "shop"])
            .status
            .success()
    });
    m.apply(
        "apiVersion: metrics.k8s.io/v1beta1\nkind: PodMetrics\nmetadata: {name: web-1, namespace: shop, labels: {app: web}}\nwindow: 30s\ncontainers:\n- {name: web, usage: {cpu: 200m, memory: 100Mi}}\n",
    );
    // The workload's next change of status brings its usage along.
    m.ok(&[
        "patch",
        "deploy",
        "web",
        "-n",
        "shop",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status": {"availableReplicas": 1}}"#,
    ]);
    eventually(
        Duration::from_secs(10),
        "the pods' usage in the Work",
        || {
            manifest_status(&s, "orrery-cluster-m1", 0)["usage"]
                == json!({"readyPods": 1, "unreadyPods": 1, "cpuMilli": 200,
                      "cpuRequestMilli": 250, "memoryBytes": 100 << 20,
                      "memoryRequestBytes": 128 << 20})
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
    // The cluster proxy reaches the member's API with the member's credentials (the server's
    // own agent for it keeps a tunnel, as a pull-mode agent does).
    let mut nodes = String::new();
    eventually(
        Duration::from_secs(15),
        "m2's nodes through the proxy",
        || {
            let out = s.kubectl(&[
                "get",
                "--raw",
                "/apis/multicluster.io/v1alpha1/clusters/m2/proxy/api/v1/nodes",
            ]);
            nodes = String::from_utf8_lossy(&out.stdout).into_owned();
            out.status.success()
        },
    );
    let nodes: Value = serde_json::from_str(&nodes).unwrap();
    let names: Vec<&str> = nodes["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["metadata"]["name"].as_str())
        .collect();
    assert_eq!(names, ["n1", "n2", "n3"]);
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

/// The CRD of CSI snapshots (snapshot.storage.k8s.io), as a cluster with the external
/// snapshotter serves it.
const SNAPSHOT_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: volumesnapshots.snapshot.storage.k8s.io}
spec:
  group: snapshot.storage.k8s.io
  scope: Namespaced
  names: {plural: volumesnapshots, singular: volumesnapshot, kind: VolumeSnapshot, shortNames: [vs]}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
"#;

const MOVER_SECRET: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: orrery-system}
---
apiVersion: v1
kind: Secret
metadata:
  name: orrery-data-mover
  namespace: orrery-system
  annotations: {orrery.io/volume-snapshot-class: csi-snapclass}
stringData: {RESTIC_REPOSITORY: "s3:https://objects.example/fleet", RESTIC_PASSWORD: hunter2}
"#;

const DB: &str = r#"
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db, namespace: default}
spec:
  replicas: 2
  serviceName: db
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec:
      containers:
      - {name: pg, image: "postgres:16", resources: {requests: {cpu: 500m, memory: 512Mi}}}
  volumeClaimTemplates:
  - metadata: {name: data}
    spec: {resources: {requests: {storage: 2Gi}}}
---
apiVersion: multicluster.io/v1alpha1
kind: ResourcePlacementPolicy
metadata: {name: db, namespace: default}
spec:
  resourceSelector: {apiVersion: apps/v1, kind: StatefulSet, name: db, namespace: default}
  placement:
    clusterAffinity: {clusterNames: [a, b]}
    spreadConstraints: [{spreadByField: cluster, maxGroups: 1}]
"#;

const CONTENT: &str = "test.orrery.io/content";

/// What a real member runs and the stand-in does not: a StatefulSet controller, a kubelet
/// (pods run at once; a running pod writes its claims), the CSI snapshotter and restic. A
/// claim's data is the string in its annotation `test.orrery.io/content`; the repository
/// maps restic's (host, tags) to the data backed up under them, as both members share it.
#[derive(Default)]
struct Plant {
    /// (member, snapshot) → the data the snapshot holds.
    snapshots: BTreeMap<(String, String), String>,
    repository: BTreeMap<(String, String), String>,
    /// Every mover Job run, by member.
    jobs: Vec<(String, String)>,
    writes: u64,
    /// (member, claim) → the data its last pod started on.
    started_on: BTreeMap<(String, String), String>,
    /// While set, mover Jobs do not run (the test restarts an agent meanwhile).
    paused: bool,
}

fn items(all: &Value, kind: &str) -> Vec<Value> {
    all["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["kind"] == kind)
        .cloned()
        .collect()
}

fn env_of(job: &Value, name: &str) -> String {
    job["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name)
        .map(|e| e["value"].as_str().unwrap().to_string())
        .unwrap()
}

fn status_patch(m: &Server, what: &[&str], status: Value) {
    let mut args = vec!["patch"];
    args.extend_from_slice(what);
    let patch = status.to_string();
    args.extend_from_slice(&[
        "-n",
        "default",
        "--subresource=status",
        "--type=merge",
        "-p",
        &patch,
    ]);
    // An object deleted since the plant read it is no failure: a controller meets that all
    // the time.
    let out = m.kubectl(&args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() || err.contains("NotFound"),
        "kubectl {args:?} failed: {err}"
    );
}

/// Merges `annotations` into a claim of the member's `default` namespace.
fn annotate_claim(m: &Server, claim: &str, annotations: Value) {
    let patch = json!({"metadata": {"annotations": annotations}}).to_string();
    m.ok(&[
        "patch",
        "pvc",
        claim,
        "-n",
        "default",
        "--type=merge",
        "-p",
        &patch,
    ]);
}

fn claims_mounted(pod: &Value) -> Vec<String> {
    pod["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["persistentVolumeClaim"]["claimName"].as_str())
        .map(str::to_string)
        .collect()
}

impl Plant {
    fn tick(&mut self, cluster: &str, m: &Server) {
        let all: Value = serde_json::from_str(&m.ok(&[
            "get",
            "statefulsets,persistentvolumeclaims,pods,volumesnapshots,jobs",
            "-n",
            "default",
            "-o",
            "json",
        ]))
        .unwrap();
        let claims = items(&all, "PersistentVolumeClaim");
        let pods = items(&all, "Pod");
        let content = |claim: &str| {
            claims
                .iter()
                .find(|c| c["metadata"]["name"] == claim)
                .and_then(|c| c["metadata"]["annotations"][CONTENT].as_str())
                .unwrap_or("")
                .to_string()
        };
        let mover = |o: &Value| {
            o["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "orrery-data-mover"
        };
        // The StatefulSet controller and the kubelet.
        for sts in items(&all, "StatefulSet") {
            let name = sts["metadata"]["name"].as_str().unwrap();
            let replicas = sts["spec"]["replicas"].as_i64().unwrap_or(1);
            let mut running = 0;
            for o in 0..replicas {
                let claim = format!("data-{name}-{o}");
                if !claims
                    .iter()
                    .any(|c| c["metadata"]["name"] == claim.as_str())
                {
                    m.apply(&format!("apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: {claim}, namespace: default, labels: {{app: db}}}}\nspec: {{accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 2Gi}}}}}}\n"));
                }
                let pod = format!("{name}-{o}");
                match pods.iter().find(|p| p["metadata"]["name"] == pod.as_str()) {
                    None => {
                        self.started_on
                            .insert((cluster.to_string(), claim.clone()), content(&claim));
                        m.apply(&format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: {pod}, namespace: default, labels: {{app: db}}}}\nspec:\n  containers: [{{name: pg, image: 'postgres:16'}}]\n  volumes: [{{name: data, persistentVolumeClaim: {{claimName: {claim}}}}}]\n"));
                        status_patch(m, &["pod", &pod], json!({"status": {"phase": "Running"}}));
                    }
                    Some(_) => running += 1,
                }
            }
            for p in &pods {
                let pname = p["metadata"]["name"].as_str().unwrap();
                if let Some(o) = pname
                    .strip_prefix(&format!("{name}-"))
                    .and_then(|o| o.parse::<i64>().ok())
                    && o >= replicas
                {
                    m.ok(&["delete", "pod", pname, "-n", "default", "--wait=false"]);
                }
            }
            status_patch(
                m,
                &["statefulset", name],
                json!({"status": {
                    "observedGeneration": sts["metadata"]["generation"],
                    "replicas": running, "readyReplicas": running, "currentReplicas": running,
                    "updatedReplicas": running, "availableReplicas": running,
                }}),
            );
        }
        // Running pods write their claims.
        for p in pods
            .iter()
            .filter(|p| !mover(p) && p["status"]["phase"] == "Running")
        {
            for claim in claims_mounted(p) {
                self.writes += 1;
                annotate_claim(
                    m,
                    &claim,
                    json!({CONTENT: format!("{cluster}:{claim}:w{}", self.writes)}),
                );
            }
        }
        // The CSI snapshotter: a snapshot holds its claim's data as it is now.
        for vs in items(&all, "VolumeSnapshot") {
            if vs["status"]["readyToUse"] == true {
                continue;
            }
            assert_eq!(vs["spec"]["volumeSnapshotClassName"], "csi-snapclass");
            let name = vs["metadata"]["name"].as_str().unwrap().to_string();
            let source = vs["spec"]["source"]["persistentVolumeClaimName"]
                .as_str()
                .unwrap();
            self.snapshots
                .insert((cluster.to_string(), name.clone()), content(source));
            status_patch(
                m,
                &["volumesnapshot", &name],
                json!({"status": {"readyToUse": true, "restoreSize": "2Gi"}}),
            );
        }
        if self.paused {
            return;
        }
        // restic, run by the mover's Jobs.
        for job in items(&all, "Job") {
            let name = job["metadata"]["name"].as_str().unwrap().to_string();
            if !mover(&job) || job["status"]["conditions"].to_string().contains("Complete") {
                continue;
            }
            let claim =
                job["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"]
                    .as_str()
                    .unwrap()
                    .to_string();
            let key = (env_of(&job, "ORRERY_HOST"), env_of(&job, "ORRERY_TAGS"));
            let outcome = if name.ends_with("-up") {
                // kubectl lists claims before Jobs: a claim made just before its Job may not
                // be in this listing yet. Its Job waits for it, as a real one's pod would.
                let Some(clone) = claims
                    .iter()
                    .find(|c| c["metadata"]["name"] == claim.as_str())
                else {
                    continue;
                };
                let snapshot = clone["spec"]["dataSource"]["name"]
                    .as_str()
                    .unwrap()
                    .to_string();
                let data = self.snapshots[&(cluster.to_string(), snapshot)].clone();
                self.repository.insert(key, data);
                "Complete"
            } else {
                assert!(
                    !pods.iter().any(|p| !mover(p)
                        && p["status"]["phase"] == "Running"
                        && claims_mounted(p).contains(&claim)),
                    "a restore into {claim} while a pod runs on it"
                );
                match self.repository.get(&key) {
                    Some(data) => {
                        annotate_claim(m, &claim, json!({CONTENT: data}));
                        "Complete"
                    }
                    None => "Failed",
                }
            };
            let pod = format!("{name}-p");
            m.apply(&format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: {pod}, namespace: default, labels: {{job-name: {name}, app.kubernetes.io/managed-by: orrery-data-mover}}}}\nspec: {{containers: [{{name: restic, image: restic}}]}}\n"));
            let summary = json!({"message_type": "summary", "data_added": 4096, "total_bytes_processed": 1_000_000}).to_string();
            status_patch(
                m,
                &["pod", &pod],
                json!({"status": {"phase": "Succeeded", "containerStatuses": [{"name": "restic", "image": "restic", "imageID": "restic@sha256:0", "ready": false, "restartCount": 0, "state": {"terminated": {"exitCode": 0, "message": summary}}}]}}),
            );
            status_patch(
                m,
                &["job", &name],
                json!({"status": {"conditions": [{"type": outcome, "status": "True"}]}}),
            );
            self.jobs.push((cluster.to_string(), name));
        }
    }
}

#[test]
fn the_kube_backend_moves_a_statefulset_with_its_data() {
    let members = [("a", member()), ("b", member())];
    for (_, m) in &members {
        m.apply(SNAPSHOT_CRD);
    }
    let s = Server::start();
    let mut agents = BTreeMap::new();
    for (name, m) in &members {
        let token = s.token(name);
        let mk = m.kubeconfig.display().to_string();
        let args: Vec<String> = [
            "--cluster",
            name,
            "--token",
            &token,
            "--kubeconfig",
            &mk,
            "--heartbeat-interval",
            "1s",
            "--report-interval",
            "200ms",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        agents.insert(*name, Agent::start(&s, name, &args));
    }
    for (name, _) in &members {
        eventually(Duration::from_secs(60), "Ready", || {
            s.cluster_condition(name, "Ready") == "True"
        });
    }
    s.apply(DB);
    let plant = std::sync::Mutex::new(Plant::default());
    let stop = std::sync::atomic::AtomicBool::new(false);
    /// Stops the stand-in plant when the test body ends, by a panic too: otherwise the scope
    /// would wait for the plant forever and a failure would hang the test instead.
    struct StopOnDrop<'a>(&'a std::sync::atomic::AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    std::thread::scope(|scope| {
        let _stop = StopOnDrop(&stop);
        scope.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for (name, m) in &members {
                    plant.lock().unwrap().tick(name, m);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        // The members are alike, so the scheduler may take either (it ranks them by what it
        // has seen of them when the StatefulSet comes): the move goes to the other.
        let mut source = None;
        eventually(
            Duration::from_secs(60),
            "db running, reporting its volumes",
            || {
                source = ["a", "b"].into_iter().find(|c| {
                    let ns = format!("orrery-cluster-{c}");
                    let w = s.get_json(&["work", "-n", &ns, "-o", "json"]);
                    w.to_string().contains("\"startedVersion\":1")
                });
                source.is_some()
            },
        );
        let (src_name, dst_name, a, b) = match source {
            Some("a") => ("a", "b", &members[0].1, &members[1].1),
            _ => ("b", "a", &members[1].1, &members[0].1),
        };

        // A member without a data mover refuses the move; the workload runs on.
        s.apply(&format!("apiVersion: multicluster.io/v1alpha1\nkind: Migration\nmetadata: {{name: nomover, namespace: default}}\nspec:\n  resource: {{apiVersion: apps/v1, kind: StatefulSet, name: db}}\n  targetClusters: [{dst_name}]\n"));
        eventually(Duration::from_secs(60), "the move refused", || {
            let m = s.get_json(&["migration", "nomover", "-n", "default"]);
            m["status"]["phase"] == "Failed"
        });
        let msg =
            s.get_json(&["migration", "nomover", "-n", "default"])["status"]["message"].to_string();
        assert!(
            msg.contains("no data mover") && msg.contains("orrery-system/orrery-data-mover"),
            "{msg}"
        );
        eventually(
            Duration::from_secs(60),
            "db back at two replicas in the source",
            || a.ok(&["get", "sts", "db", "-o", "jsonpath={.spec.replicas}"]) == "2",
        );

        for (_, m) in &members {
            m.apply(MOVER_SECRET);
        }
        // Stop the Jobs, so the source's agent is killed with its first round under way.
        plant.lock().unwrap().paused = true;
        s.apply(&format!("apiVersion: multicluster.io/v1alpha1\nkind: Migration\nmetadata: {{name: move, namespace: default}}\nspec:\n  resource: {{apiVersion: apps/v1, kind: StatefulSet, name: db}}\n  targetClusters: [{dst_name}]\n"));
        eventually(Duration::from_secs(60), "the first backup Jobs", || {
            a.ok(&["get", "jobs", "-n", "default", "-o", "name"])
                .lines()
                .count()
                == 2
        });
        let src = agents.get_mut(src_name).unwrap();
        src.kill9();
        src.restart();
        std::thread::sleep(Duration::from_secs(2));
        plant.lock().unwrap().paused = false;
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        let done = loop {
            assert!(!plant.is_poisoned(), "the stand-in plant failed");
            let m = s.get_json(&["migration", "move", "-n", "default"]);
            assert_ne!(m["status"]["phase"], "Failed", "{m:#}");
            if m["status"]["phase"] == "Succeeded" {
                break m;
            }
            if std::time::Instant::now() > deadline {
                let works = s.get_json(&["works", "-A"]);
                panic!(
                    "the move did not end: {m:#}\nworks: {works:#}\na: {}\nb: {}",
                    a.ok(&[
                        "get",
                        "all,pvc,volumesnapshots",
                        "-n",
                        "default",
                        "-o",
                        "yaml"
                    ]),
                    b.ok(&[
                        "get",
                        "all,pvc,volumesnapshots",
                        "-n",
                        "default",
                        "-o",
                        "yaml"
                    ]),
                );
            }
            std::thread::sleep(Duration::from_millis(300));
        };
        stop.store(true, std::sync::atomic::Ordering::Relaxed);

        // The target runs on exactly what the source held when it stopped.
        for o in 0..2 {
            let claim = format!("data-db-{o}");
            let get = |m: &Server| -> Value {
                serde_json::from_str(&m.ok(&["get", "pvc", &claim, "-o", "json"])).unwrap()
            };
            let (src, dst) = (get(a), get(b));
            let data = src["metadata"]["annotations"][CONTENT].as_str().unwrap();
            assert!(data.starts_with(&format!("{src_name}:")), "{data}");
            assert_eq!(
                plant.lock().unwrap().started_on[&(dst_name.to_string(), claim.clone())],
                data,
                "{dst_name} started on the last write in {src_name}"
            );
            let fenced = done["status"]["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["name"] == claim.as_str())
                .unwrap()["fencedVersion"]
                .clone();
            assert_eq!(
                dst["metadata"]["annotations"]["orrery.io/data-version"],
                fenced.as_u64().unwrap().to_string()
            );
            assert_eq!(
                src["metadata"]["annotations"]["orrery.io/data-version"],
                dst["metadata"]["annotations"]["orrery.io/data-version"]
            );
        }
        assert!(
            b.ok(&["get", "pods", "-n", "default", "-o", "name"])
                .contains("pod/db-1")
        );
        assert!(
            !a.kubectl(&["get", "sts", "db"]).status.success(),
            "the source's copy is gone"
        );
        // Every Job ran once (a restarted agent resumed its round), and nothing is left.
        let rounds = done["status"]["rounds"].as_u64().unwrap() as usize;
        assert!(
            rounds >= 2,
            "a round while it ran, the last after the fence"
        );
        let p = plant.lock().unwrap();
        let mut seen = std::collections::BTreeSet::new();
        for j in &p.jobs {
            assert!(seen.insert(j), "{j:?} ran twice: {:?}", p.jobs);
        }
        assert_eq!(
            p.jobs
                .iter()
                .filter(|(c, n)| c == src_name && n.ends_with("-up"))
                .count(),
            2 * rounds,
            "two volumes, {rounds} rounds: {:?}",
            p.jobs
        );
        assert_eq!(
            p.jobs
                .iter()
                .filter(|(c, n)| c == dst_name && n.ends_with("-down"))
                .count(),
            2 * rounds,
            "two volumes, {rounds} rounds: {:?}",
            p.jobs
        );
        drop(p);
        for (_, m) in &members {
            eventually(
                Duration::from_secs(20),
                "the mover's objects removed",
                || {
                    let left = m.ok(&[
                        "get",
                        "jobs,volumesnapshots,secrets,pvc",
                        "-n",
                        "default",
                        "-l",
                        "app.kubernetes.io/managed-by=orrery-data-mover",
                        "-o",
                        "name",
                    ]);
                    left.trim().is_empty()
                },
            );
        }
    });
}
