//! Data-aware scheduling end to end: a real server, one agent process per simulated member
//! (with its GPU model and performance, uplink and egress price), the real kubectl. A job
//! with a small input and heavy compute goes to the fast GPUs; one with a huge input and
//! light compute runs where its data is; each decision shows every candidate's estimate in
//! its parts, and a workload whose annotations cannot be read is refused. The data follows:
//! copies on links never booked beyond their bandwidth, readers' pods waiting for them, a
//! cache in the region that a second reader uses, and a server killed mid-copy carrying on.

use crate::common;

use std::time::Duration;

use common::fleet::Fleet;
use common::{eventually, http};
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
        "apiVersion: multicluster.io/v1alpha1\nkind: DataSet\nmetadata: {name: twice, namespace: default}\nspec: {size: 1Gi, locations: [{cluster: fast}, {cluster: fast}]}\n",
    );
    assert!(err.contains("spec.locations[1].cluster"), "{err}");
}

/// Every DataTransfer in `default`.
fn transfers(f: &Fleet) -> Vec<Value> {
    f.s.get_json(&["datatransfers", "-n", "default"])["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[test]
fn data_follows_its_readers_on_booked_links_and_is_cached_in_their_region() {
    // 2 GiB over 200 MiB/s: each cross-region copy takes about ten seconds.
    const LINK: i64 = 200 << 20;
    let slow = "nodes=4,cpu=32,memory=128Gi,gpu=4,load=0.1,start=100ms,job=60s,bandwidth=200Mi";
    let archive = format!("{slow},gpuModel=Tesla-T4,egressPerGiB=0.02");
    let fast = format!("{slow},gpuModel=NVIDIA-H100-80GB-HBM3,gpuPerf=3,cache=20Gi");
    let mut f = Fleet::start_sims(
        &[
            ("archive", "us-east", &archive),
            ("w1", "us-west", &fast),
            ("w2", "us-west", &fast),
        ],
        &[],
    );
    eventually(Duration::from_secs(20), "the cache tiers reported", || {
        ["w1", "w2"].iter().all(|c| {
            f.s.get_json(&["cluster", c])["status"]["properties"]["cache.orrery.io/capacity"]
                == "20Gi"
        })
    });
    f.s.apply(
        r#"
apiVersion: multicluster.io/v1alpha1
kind: DataSet
metadata: {name: tokens, namespace: default}
spec: {size: 2Gi, locations: [{cluster: archive}]}
---
apiVersion: multicluster.io/v1alpha1
kind: DataSet
metadata: {name: images, namespace: default}
spec: {size: 2Gi, locations: [{cluster: archive}]}
---
apiVersion: multicluster.io/v1alpha1
kind: ResourcePlacementPolicy
metadata: {name: jobs, namespace: default}
spec:
  resourceSelector: {apiVersion: batch/v1, kind: Job, namespace: default}
  placement:
    replicaScheduling: {replicaSchedulingType: Divided}
"#,
    );
    // Two jobs with heavy compute at once: both go west, and both inputs leave the archive
    // together on its one uplink.
    f.s.apply(&job("a", "tokens", "8"));
    f.s.apply(&job("c", "images", "8"));
    // The server is killed while the first copy is under way: it carries on from what is
    // stored, and no copy starts over.
    eventually(Duration::from_secs(30), "a copy under way", || {
        transfers(&f).iter().any(|t| {
            t["status"]["phase"] == "Copying" && t["status"]["copiedBytes"].as_i64() > Some(0)
        })
    });
    f.s.kill9();
    f.s.restart();
    let mut seen_waiting = false;
    eventually(Duration::from_secs(90), "both copies in", || {
        let ts = transfers(&f);
        // Never booked beyond a link's bandwidth, at either end.
        let mut out = std::collections::BTreeMap::<String, i64>::new();
        let mut inn = std::collections::BTreeMap::<String, i64>::new();
        for t in &ts {
            let phase = t["status"]["phase"].as_str().unwrap_or("");
            if phase == "Snapshot" || phase == "Copying" {
                let rate = t["status"]["rate"].as_i64().unwrap_or(0);
                *out.entry(t["status"]["source"].as_str().unwrap().to_string())
                    .or_default() += rate;
                *inn.entry(t["spec"]["destination"].as_str().unwrap().to_string())
                    .or_default() += rate;
            }
        }
        for (c, r) in out.iter().chain(inn.iter()) {
            assert!(*r <= LINK, "{c} booked at {r}: {ts:?}");
        }
        // While a copy is under way, its reader's pods wait for it, and say so.
        if !seen_waiting {
            let a = f.s.get_json(&["resourcebinding", "a-job", "-n", "default"]);
            seen_waiting = a["status"]["aggregatedStatus"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|s| {
                    s.to_string()
                        .contains("waiting for data set \\\"tokens\\\"")
                });
        }
        ts.len() == 2 && ts.iter().all(|t| t["status"]["phase"] == "Succeeded")
    });
    assert!(seen_waiting, "job a's pods waited for their input");
    // Each copy started once at its destination: one round, never again from zero.
    for t in transfers(&f) {
        let dest = t["spec"]["destination"].as_str().unwrap();
        let set = t["spec"]["dataSet"].as_str().unwrap();
        let (code, body) = http("GET", f.admin(dest), &format!("/clusters/{dest}/data"), "");
        assert_eq!(code, 200, "{body}");
        let log: Value = serde_json::from_str(&body).unwrap();
        // Both copies may go to one member: count this one's.
        let id = format!("dataset-default-{set}-{dest}");
        let starts = log["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["event"] == "copy-started" && e["transfer"] == id.as_str())
            .count();
        assert_eq!(starts, 1, "{dest}: {log}");
    }
    let placed_a = f.clusters_of("a-job");
    assert!(
        placed_a.len() == 1 && placed_a[0].0.starts_with('w'),
        "{placed_a:?}"
    );
    for t in transfers(&f) {
        assert_eq!(t["status"]["source"], "archive", "{t}");
        assert_eq!(t["status"]["bytes"], 2_i64 << 30, "{t}");
    }
    eventually(Duration::from_secs(30), "job a runs on its copy", || {
        let b = f.s.get_json(&["resourcebinding", "a-job", "-n", "default"]);
        b["status"]["aggregatedStatus"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["status"]["active"] == 1 && s["health"] != "Unhealthy")
    });
    // The copy is a cache in the west: the data set says so, and `kubectl get` shows it.
    let tokens = f.s.get_json(&["dataset", "tokens", "-n", "default"]);
    let copies = tokens["status"]["copies"].as_array().unwrap();
    assert!(
        copies.iter().any(|c| c["cluster"] == placed_a[0].0.as_str()
            && c["role"] == "Cache"
            && c["present"] == true),
        "{tokens}"
    );
    assert!(
        f.s.ok(&["get", "datasets", "-o", "wide"])
            .contains(placed_a[0].0.as_str()),
        "the wide listing shows the copies"
    );
    // A second job reading tokens in the west starts without another cross-region copy.
    f.s.apply(&job("b", "tokens", "8"));
    eventually(Duration::from_secs(30), "job b runs", || {
        let b = f.s.get_json(&["resourcebinding", "b-job", "-n", "default"]);
        b["status"]["aggregatedStatus"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["status"]["active"] == 1 && s["health"] != "Unhealthy")
    });
    let placed_b = f.clusters_of("b-job");
    assert!(placed_b[0].0.starts_with('w'), "{placed_b:?}");
    let from_archive: Vec<Value> = transfers(&f)
        .into_iter()
        .filter(|t| t["status"]["source"] == "archive" && t["spec"]["dataSet"] == "tokens")
        .collect();
    assert_eq!(from_archive.len(), 1, "{from_archive:?}");
    let tokens = f.s.get_json(&["dataset", "tokens", "-n", "default"]);
    let west = tokens["status"]["regions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["region"] == "us-west")
        .cloned()
        .unwrap_or_default();
    assert_eq!(west["lastHour"], 2, "{tokens}");
}

#[test]
fn a_data_set_a_member_holds_is_read_there_and_relayed_around_a_slow_path() {
    // `lab` holds the data set in a claim of its own; its path to `far` carries a tenth of
    // their uplinks, while `mid` reaches both at full speed and has a cache tier.
    const LINK: i64 = 200 << 20;
    let base = "nodes=4,cpu=32,memory=128Gi,gpu=4,load=0.1,start=100ms,job=60s,bandwidth=200Mi";
    let lab = format!("{base},gpuModel=Tesla-T4");
    let mid = format!("{base},cache=20Gi");
    let far = format!("{base},gpuModel=NVIDIA-H100-80GB-HBM3,gpuPerf=3,path.lab=20Mi");
    let f = Fleet::start_sims(
        &[
            ("lab", "us-east", &lab),
            ("mid", "us-central", &mid),
            ("far", "us-west", &far),
        ],
        &[],
    );
    let claim = r#"{"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "corpus-v3", "namespace": "default",
                     "labels": {"orrery.io/dataset": "corpus"},
                     "annotations": {"sim.orrery.io/volume-used": "2Gi"}},
        "spec": {"accessModes": ["ReadOnlyMany"], "resources": {"requests": {"storage": "2Gi"}}}}"#;
    let (code, body) = http("POST", f.admin("lab"), "/clusters/lab/objects", claim);
    assert_eq!(code, 201, "{body}");
    eventually(
        Duration::from_secs(20),
        "the paths and cache reported",
        || {
            let far = f.s.get_json(&["cluster", "far"]);
            let mid = f.s.get_json(&["cluster", "mid"]);
            far["status"]["network"]["pathBandwidthBytesPerSecond"]["lab"] == 20 << 20
                && mid["status"]["properties"]["cache.orrery.io/capacity"] == "20Gi"
                && f.s.get_json(&["cluster", "lab"])["status"]["dataSets"][0]["claim"]
                    == "corpus-v3"
        },
    );
    // A data set no location names: the member's report says where it is.
    f.s.apply(
        r#"
apiVersion: multicluster.io/v1alpha1
kind: DataSet
metadata: {name: corpus, namespace: default}
spec: {size: 2Gi}
---
apiVersion: multicluster.io/v1alpha1
kind: ResourcePlacementPolicy
metadata: {name: jobs, namespace: default}
spec:
  resourceSelector: {apiVersion: batch/v1, kind: Job, namespace: default}
  placement:
    replicaScheduling: {replicaSchedulingType: Divided}
"#,
    );
    eventually(Duration::from_secs(20), "lab's copy in the status", || {
        let d = f.s.get_json(&["dataset", "corpus", "-n", "default"]);
        d["status"]["copies"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["cluster"] == "lab" && c["role"] == "Reported" && c["present"] == true)
    });
    // A job that only reads runs where the data is, with nothing copied.
    f.s.apply(&job("scan", "corpus", "0"));
    eventually(Duration::from_secs(30), "scan runs at lab", || {
        f.clusters_of("scan-job").first().map(|c| c.0.as_str()) == Some("lab")
            && f.s.get_json(&["resourcebinding", "scan-job", "-n", "default"])["status"]
                ["aggregatedStatus"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|s| s["status"]["active"] == 1 || s["status"]["succeeded"] == 1)
    });
    assert!(transfers(&f).is_empty(), "{:?}", transfers(&f));
    // Heavy compute goes to the fast GPUs, and its input goes through mid: two hops at
    // 200 MiB/s beat one at 20.
    f.s.apply(&job("train", "corpus", "8"));
    eventually(Duration::from_secs(30), "train placed", || {
        !f.clusters_of("train-job").is_empty()
    });
    assert_eq!(f.clusters_of("train-job")[0].0, "far");
    let chosen = estimates(&f, "train-job")
        .into_iter()
        .find(|d| d["name"] == "far")
        .unwrap();
    let fetch = &chosen["estimate"]["fetches"][0];
    assert_eq!(
        (fetch["from"].as_str(), fetch["via"].as_str()),
        (Some("lab"), Some("mid")),
        "{chosen}"
    );
    eventually(Duration::from_secs(90), "both hops in", || {
        let ts = transfers(&f);
        for t in &ts {
            let phase = t["status"]["phase"].as_str().unwrap_or("");
            if phase == "Snapshot" || phase == "Copying" {
                assert!(t["status"]["rate"].as_i64().unwrap() <= LINK, "{t}");
            }
        }
        ts.len() == 2 && ts.iter().all(|t| t["status"]["phase"] == "Succeeded")
    });
    let ts = transfers(&f);
    let hop = |dest: &str| {
        ts.iter()
            .find(|t| t["spec"]["destination"] == dest)
            .cloned()
            .unwrap()
    };
    assert_eq!(hop("mid")["status"]["source"], "lab", "{ts:?}");
    assert_eq!(hop("mid")["spec"]["reason"], "relay: on to far", "{ts:?}");
    assert_eq!(hop("far")["status"]["source"], "mid", "{ts:?}");
    assert_eq!(
        hop("far")["status"]["path"],
        serde_json::json!(["lab", "mid", "far"]),
        "{ts:?}"
    );
    eventually(Duration::from_secs(30), "train runs on its copy", || {
        f.s.get_json(&["resourcebinding", "train-job", "-n", "default"])["status"]
            ["aggregatedStatus"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["status"]["active"] == 1 && s["health"] != "Unhealthy")
    });
    // The member's own claim was copied from and never touched: its one journal entry is
    // the one that made it.
    let (code, body) = http("GET", f.admin("lab"), "/clusters/lab/journal", "");
    assert_eq!(code, 200, "{body}");
    let journal: Value = serde_json::from_str(&body).unwrap();
    let touched: Vec<&Value> = journal["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "corpus-v3")
        .collect();
    assert_eq!(touched.len(), 1, "{touched:?}");
}
