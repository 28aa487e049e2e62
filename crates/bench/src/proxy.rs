//! The cluster proxy's cost: requests through the tunnel a member's agent keeps open (server →
//! HTTP/2 over the agent's connection → the member's API) against the same kind of request the
//! server answers itself. A real `orrery server` and an agent process simulating one member;
//! with `--via-replica`, two replicas on etcd, the agent connected to the first and the proxy
//! asked of the second, which forwards to the first.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::stats::{emit, percentile, progress, round};

pub struct Args {
    pub requests: usize,
    pub pods: usize,
    pub via_replica: bool,
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
    // `client` asks: the server holding the tunnel, or (via a replica) the other one.
    let (_etcd, _servers, holder, client, _agent) = if args.via_replica {
        let etcd = orrery_store_testkit::etcd::EtcdCluster::start(1)?;
        let servers = crate::ha::replicas(&etcd, 2, &[], &args.server_bin, &args.dir)?;
        let (holder, agent) =
            crate::propagation::fleet_on(&servers[0], &args.server_bin, 1, "1s").await?;
        let asked = orrery_client::from_kubeconfig(&servers[1].kubeconfig).await?;
        (Some(etcd), servers, holder, asked, agent)
    } else {
        let fleet_args = crate::propagation::Args {
            clusters: 1,
            templates: 0,
            server_bin: args.server_bin.clone(),
            dir: args.dir.clone(),
        };
        let (server, client, agent) = crate::propagation::fleet(&fleet_args, "1s").await?;
        (None, vec![server], client.clone(), client, agent)
    };
    crate::propagation::post(
        &holder,
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
        &holder,
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
    let (mut direct, mut tunnel, mut pods, mut at_holder) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let rounds = 10;
    for r in 0..rounds {
        let n = args.requests / rounds;
        direct.extend(latencies(&client, "/version", n).await?);
        tunnel.extend(latencies(&client, &format!("{proxy}/version"), n).await?);
        pods.extend(latencies(&client, &pods_path, n).await?);
        if args.via_replica {
            at_holder.extend(latencies(&holder, &format!("{proxy}/version"), n).await?);
        }
        progress(format!("round {}/{rounds}", r + 1));
    }
    let p = |v: &[f64], q: f64| round(percentile(v, q), 2);
    let mut out = json!({
        "scenario": if args.via_replica { "proxy-latency-via-replica" } else { "proxy-latency" },
        "requests": direct.len(),
        "pods": args.pods,
        "direct_version_ms": {"p50": p(&direct, 50.0), "p99": p(&direct, 99.0)},
        "proxied_version_ms": {"p50": p(&tunnel, 50.0), "p99": p(&tunnel, 99.0)},
        "proxied_pod_list_ms": {"p50": p(&pods, 50.0), "p99": p(&pods, 99.0)},
        "added_p50_ms": round(percentile(&tunnel, 50.0) - percentile(&direct, 50.0), 2),
        "added_p99_ms": round(percentile(&tunnel, 99.0) - percentile(&direct, 99.0), 2),
        "measures": "GET /version answered by the server itself against the same through the cluster proxy (server, tunnel over the agent's connection, the simulated member's API); and a list of the member's pods through the proxy",
        "goal_added_p99_ms": 10,
    });
    if args.via_replica {
        out["measures"] = json!(
            "GET /version answered by a replica itself against the same through the cluster proxy asked of that replica, which forwards it to the replica holding the member's tunnel (on an HTTP/2 connection the replicas keep); holder_proxied_version_ms: the proxy asked of the holder itself"
        );
        out["holder_proxied_version_ms"] =
            json!({"p50": p(&at_holder, 50.0), "p99": p(&at_holder, 99.0)});
    }
    emit(out);
    Ok(())
}
