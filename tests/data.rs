//! Data-aware scheduling end to end: a real server, one agent process per simulated member
//! (with its GPU model and performance, uplink and egress price), the real kubectl. A job
//! with a small input and heavy compute goes to the fast GPUs; one with a huge input and
//! light compute runs where its data is; each decision shows every candidate's estimate in
//! its parts, and a workload whose annotations cannot be read is refused.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::eventually;
use common::fleet::Fleet;
use serde_json::Value;

const NODES: &str =
    "nodes=4,cpu=32,memory=128Gi,gpu=4,load=0.1,start=100ms,job=60s,bandwidth=1250Mi";

fn job(name: &str, datasets: &str, hours: &str) -> String {
    format!(
        r#"
apiVersion: batch/v1
kind: Job
metadata: {{name: {name}, namespace: default}}
spec:
  template:
    metadata:
      annotations: {{orrery.io/datasets: "{datasets}", orrery.io/gpu-hours: "{hours}"}}
    spec:
      restartPolicy: Never
      containers:
      - name: main
        image: trainer:1
        resources: {{requests: {{cpu: "1", nvidia.com/gpu: "1"}}, limits: {{nvidia.com/gpu: "1"}}}}
"#
    )
}

const DATA: &str = r#"
apiVersion: multicluster.io/v1alpha1
kind: DataSet
metadata: {name: tokens, namespace: default}
spec:
  size: 10Gi
  locations: [{cluster: archive, tier: warm}]
---
apiVersion: multicluster.io/v1alpha1
kind: DataSet
metadata: {name: telescope, namespace: default}
spec:
  size: 2Ti
  locations: [{cluster: archive, tier: cold}]
---
apiVersion: multicluster.io/v1alpha1
kind: ResourcePlacementPolicy
metadata: {name: jobs, namespace: default}
spec:
  resourceSelector: {apiVersion: batch/v1, kind: Job, namespace: default}
  placement:
    replicaScheduling: {replicaSchedulingType: Divided}
"#;

fn estimates(f: &Fleet, binding: &str) -> Vec<Value> {
    let b = f.s.get_json(&["resourcebinding", binding, "-n", "default"]);
    b["status"]["decisions"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[test]
fn work_goes_to_the_fast_gpus_or_stays_with_its_data() {
    let archive = format!("{NODES},gpuModel=Tesla-T4,egressPerGiB=0.02");
    let fast = format!("{NODES},gpuModel=NVIDIA-H100-80GB-HBM3,gpuPerf=3,egressPerGiB=0.09");
    let f = Fleet::start_sims(
        &[("archive", "us-east", &archive), ("fast", "us-west", &fast)],
        &[],
    );
    eventually(Duration::from_secs(20), "the GPU facts reported", || {
        f.s.get_json(&["cluster", "fast"])["status"]["properties"]["gpu.orrery.io/performance"]
            == "3"
    });
    f.s.apply(DATA);
    assert!(f.s.ok(&["get", "datasets"]).contains("telescope"));

    // 10 GiB and 8 GPU-hours: the copy takes seconds, the faster GPUs save hours.
    f.s.apply(&job("train", "tokens", "8"));
    eventually(Duration::from_secs(20), "train placed on fast", || {
        f.clusters_of("train-job") == vec![("fast".to_string(), 1)]
    });
    let d = estimates(&f, "train-job");
    let of = |name: &str| {
        d.iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("{name} in {d:?}"))["estimate"]
            .clone()
    };
    let (on_fast, on_archive) = (of("fast"), of("archive"));
    // 10 GiB over 1250 MiB/s is 8.2 s; 8 hours at 3× is 9,600 s, at the T4's 0.2 it is 144,000.
    assert_eq!(on_fast["fetches"][0]["from"], "archive");
    assert_eq!(on_fast["transferBytes"], 10_i64 << 30);
    assert_eq!(on_fast["computeSeconds"], 9600.0);
    assert_eq!(on_fast["egressCost"], 0.2);
    assert_eq!(on_archive["transferSeconds"], 0.0);
    assert_eq!(on_archive["computeSeconds"], 144_000.0);
    // `kubectl describe` shows each candidate's estimate in its parts.
    let described = f.s.ok(&["describe", "resourcebinding", "train-job"]);
    for part in [
        "Transfer Seconds",
        "Compute Seconds",
        "Wait Seconds",
        "Egress Cost",
    ] {
        assert!(described.contains(part), "{part}:\n{described}");
    }

    // 2 TiB and 0.05 GPU-hours: copying takes 28 minutes at 1250 MiB/s, computing on the T4
    // 15: the work stays with the data.
    f.s.apply(&job("scan", "telescope", "0.05"));
    eventually(Duration::from_secs(20), "scan placed on archive", || {
        f.clusters_of("scan-job") == vec![("archive".to_string(), 1)]
    });
    let d = estimates(&f, "scan-job");
    let fast = d.iter().find(|c| c["name"] == "fast").unwrap();
    assert!(
        fast["estimate"]["transferSeconds"].as_f64().unwrap() > 1600.0,
        "{fast}"
    );

    // A job reading a data set that does not exist waits, and says why.
    f.s.apply(&job("orphan", "nowhere", "1"));
    eventually(Duration::from_secs(20), "orphan unschedulable", || {
        let b =
            f.s.get_json(&["resourcebinding", "orphan-job", "-n", "default"]);
        b["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| {
                c["type"] == "Scheduled"
                    && c["status"] == "False"
                    && c["message"].as_str().unwrap_or("").contains("DataReach")
            })
    });
    // ...and is placed once it does.
    f.s.apply(
        "apiVersion: multicluster.io/v1alpha1\nkind: DataSet\nmetadata: {name: nowhere, namespace: default}\nspec:\n  size: 1Gi\n  locations: [{cluster: fast}]\n",
    );
    eventually(Duration::from_secs(20), "orphan placed", || {
        !f.clusters_of("orphan-job").is_empty()
    });

    // Annotations that cannot be read are refused, naming them.
    let err =
        f.s.fails_stdin(&["apply", "-f", "-"], &job("bad", "tokens", "lots"));
    assert!(
        err.contains("spec.template.metadata.annotations") && err.contains("orrery.io/gpu-hours"),
        "{err}"
    );
    let err = f.s.fails_stdin(
        &["apply", "-f", "-"],
        "apiVersion: multicluster.io/v1alpha1\nkind: DataSet\nmetadata: {name: empty, namespace: default}\nspec: {size: 1Gi}\n",
    );
    assert!(err.contains("spec.locations"), "{err}");
}
