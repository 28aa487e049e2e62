//! The cluster proxy's cost: requests through the tunnel a member's agent keeps open (server →
//! HTTP/2 over the agent's connection → the member's API) against the same kind of request the
//! server answers itself. A real `orrery server` and an agent process simulating one member.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::stats::{emit, percentile, progress, round};

pub struct Args {
    pub requests: usize,
    pub pods: usize,
    pub server_bin: Option<PathBuf>,
    pub dir: Option<PathBuf>,
}

/// Latencies of `n` sequential GETs of `path`, milliseconds.
async fn latencies(c: &kube::Client, path: &str, n: usize) -> anyhow::Result<Vec<f64>> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let req = http::Request::get(path).body(Vec::new())?;
        let t = Instant::now();
        c.request_text(req).await?;
        v.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(v)
}

pub async fn latency(args: Args) -> anyhow::Result<()> {
    let fleet_args = crate::propagation::Args {
        clusters: 1,
        templates: 0,
        server_bin: args.server_bin.clone(),
        dir: args.dir.clone(),
    };
    let (_server, client, _agent) = crate::propagation::fleet(&fleet_args, "1s").await?;
    crate::propagation::post(
        &client,
        "/apis/apps/v1/namespaces/default/deployments",
        &json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"replicas": args.pods, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "web", "image": "nginx:1.27",
                        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}}}}),
    )
    .await?;
    crate::propagation::post(
        &client,
        "/apis/policy.karmada.io/v1alpha1/namespaces/default/propagationpolicies",
        &json!({"apiVersion": "policy.karmada.io/v1alpha1", "kind": "PropagationPolicy",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}],
                "placement": {"clusterAffinity": {"clusterNames": ["m-0"]}}}}),
    )
    .await?;
    let proxy = "/apis/multicluster.io/v1alpha1/clusters/m-0/proxy";
    let pods_path = format!("{proxy}/api/v1/namespaces/default/pods");
    let started = Instant::now();
    loop {
        let listed: Option<serde_json::Value> = {
            let req = http::Request::get(pods_path.as_str()).body(Vec::new())?;
            client.request(req).await.ok()
        };
        let n = listed
            .and_then(|v| v["items"].as_array().map(Vec::len))
            .unwrap_or(0);
        if n >= args.pods {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(120),
            "only {n} of {} pods through the proxy",
            args.pods
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    progress(format!("{} pods listed through the proxy", args.pods));
    // Warm both paths, then measure them interleaved in rounds (a noisy machine moves both).
    latencies(&client, "/version", 50).await?;
    latencies(&client, &format!("{proxy}/version"), 50).await?;
    let (mut direct, mut tunnel, mut pods) = (Vec::new(), Vec::new(), Vec::new());
    let rounds = 10;
    for r in 0..rounds {
        let n = args.requests / rounds;
        direct.extend(latencies(&client, "/version", n).await?);
        tunnel.extend(latencies(&client, &format!("{proxy}/version"), n).await?);
        pods.extend(latencies(&client, &pods_path, n).await?);
        progress(format!("round {}/{rounds}", r + 1));
    }
    let p = |v: &[f64], q: f64| round(percentile(v, q), 2);
    emit(json!({
        "scenario": "proxy-latency",
        "requests": direct.len(),
        "pods": args.pods,
        "direct_version_ms": {"p50": p(&direct, 50.0), "p99": p(&direct, 99.0)},
        "proxied_version_ms": {"p50": p(&tunnel, 50.0), "p99": p(&tunnel, 99.0)},
        "proxied_pod_list_ms": {"p50": p(&pods, 50.0), "p99": p(&pods, 99.0)},
        "added_p50_ms": round(percentile(&tunnel, 50.0) - percentile(&direct, 50.0), 2),
        "added_p99_ms": round(percentile(&tunnel, 99.0) - percentile(&direct, 99.0), 2),
        "measures": "GET /version answered by the server itself against the same through the cluster proxy (server, tunnel over the agent's connection, the simulated member's API); and a list of the member's pods through the proxy",
        "goal_added_p99_ms": 10,
    }));
    Ok(())
}
