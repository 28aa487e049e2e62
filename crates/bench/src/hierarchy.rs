//! Hierarchies: from a Deployment created at the root to its replicas ready as the root sees
//! them, with the leaves directly under the root (two levels) and under a regional Orrery that
//! is the root's one member (three levels). Real `orrery server` processes; the leaves are
//! simulated by one agent process per parent.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::api::ServerProcess;
use crate::members::{AgentProcess, bootstrap_token, orrery_bin, start_agent};
use crate::stats::{emit, percentile, progress, round};

pub struct Args {
    pub rounds: usize,
    pub replicas: i64,
    pub server_bin: Option<PathBuf>,
}

/// Two simulated leaves under `parent`.
async fn leaves(
    bin: &std::path::Path,
    parent: &ServerProcess,
    client: &kube::Client,
) -> anyhow::Result<(AgentProcess, tempfile::TempDir)> {
    let token = bootstrap_token(client, "leaf-*").await?;
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("fleet.yaml");
    std::fs::write(
        &file,
        "clusters:\n  - name: leaf-{i}\n    count: 2\n    regions: [us-east, eu-central]\n    provider: sim\n    simulate: nodes=4,cpu=16,memory=64Gi,load=0.1,start=0s\n",
    )?;
    let agent = start_agent(
        bin,
        &parent.url,
        &[
            "--simulate-fleet".into(),
            file.display().to_string(),
            "--token".into(),
            token,
            "--heartbeat-interval".into(),
            "2s".into(),
            "--report-interval".into(),
            "100ms".into(),
        ],
        true,
    )?;
    Ok((agent, dir))
}

async fn ready_members(client: &kube::Client, n: usize) -> anyhow::Result<()> {
    let started = Instant::now();
    while orrery_client::ready_clusters(client).await? < n {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(120),
            "members not Ready"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

async fn get(c: &kube::Client, path: &str) -> Option<Value> {
    let req = http::Request::get(path).body(Vec::new()).ok()?;
    c.request(req).await.ok()
}

/// Creates Deployments at the root one after another; the time of each to all replicas ready
/// at the root, milliseconds.
async fn rounds(root: &kube::Client, args: &Args, level: &str) -> anyhow::Result<Vec<f64>> {
    crate::propagation::post(
        root,
        "/apis/policy.karmada.io/v1alpha1/clusterpropagationpolicies",
        &json!({"apiVersion": "policy.karmada.io/v1alpha1", "kind": "ClusterPropagationPolicy",
            "metadata": {"name": "all"},
            "spec": {"resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment"}],
                     "placement": {"replicaScheduling": {"replicaSchedulingType": "Divided"}}}}),
    )
    .await?;
    let mut out = Vec::new();
    for i in 0..args.rounds {
        let name = format!("web-{i}");
        let started = Instant::now();
        crate::propagation::post(
            root,
            "/apis/apps/v1/namespaces/default/deployments",
            &json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"replicas": args.replicas, "selector": {"matchLabels": {"app": name}},
                    "template": {"metadata": {"labels": {"app": name}},
                        "spec": {"containers": [{"name": "web", "image": "nginx:1.27",
                            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}}}}),
        )
        .await?;
        let path = format!("/apis/apps/v1/namespaces/default/deployments/{name}");
        loop {
            let ready = get(root, &path)
                .await
                .and_then(|d| d["status"]["readyReplicas"].as_i64())
                .unwrap_or(0);
            if ready >= args.replicas {
                break;
            }
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(60),
                "{level}: {name} not ready after 60 s"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        out.push(started.elapsed().as_secs_f64() * 1000.0);
        progress(format!("{level}: round {}/{}", i + 1, args.rounds));
    }
    Ok(out)
}

pub async fn latency(args: Args) -> anyhow::Result<()> {
    let bin = orrery_bin(&args.server_bin)?;
    // Two levels: the leaves under the root.
    let two = {
        let root = ServerProcess::start(&args.server_bin, &None)?;
        let client = orrery_client::from_kubeconfig(&root.kubeconfig).await?;
        let _leaves = leaves(&bin, &root, &client).await?;
        ready_members(&client, 2).await?;
        rounds(&client, &args, "two levels").await?
    };
    // Three levels: the leaves under a regional Orrery that is the root's member.
    let three = {
        let root = ServerProcess::start(&args.server_bin, &None)?;
        let mid = ServerProcess::start(&args.server_bin, &None)?;
        let root_client = orrery_client::from_kubeconfig(&root.kubeconfig).await?;
        let mid_client = orrery_client::from_kubeconfig(&mid.kubeconfig).await?;
        let _leaves = leaves(&bin, &mid, &mid_client).await?;
        ready_members(&mid_client, 2).await?;
        let token = bootstrap_token(&root_client, "mid").await?;
        let _mid_agent = start_agent(
            &bin,
            &root.url,
            &[
                "--cluster".into(),
                "mid".into(),
                "--token".into(),
                token,
                "--kubeconfig".into(),
                mid.kubeconfig.display().to_string(),
                "--backend".into(),
                "orrery".into(),
                "--heartbeat-interval".into(),
                "2s".into(),
                "--report-interval".into(),
                "100ms".into(),
            ],
            false,
        )?;
        ready_members(&root_client, 1).await?;
        rounds(&root_client, &args, "three levels").await?
    };
    let p = |v: &[f64], q: f64| round(percentile(v, q), 1);
    emit(json!({
        "scenario": "hierarchy-latency",
        "rounds": args.rounds,
        "replicas": args.replicas,
        "two_levels_ms": {"p50": p(&two, 50.0), "p99": p(&two, 99.0)},
        "three_levels_ms": {"p50": p(&three, 50.0), "p99": p(&three, 99.0)},
        "ratio_p50": round(percentile(&three, 50.0) / percentile(&two, 50.0), 2),
        "measures": "from creating a Deployment at the root to all its replicas ready in the root's view: leaves under the root, against leaves under a regional Orrery that is the root's member",
    }));
    Ok(())
}
