//! DRO-DS REST benchmarks: metrics ingestion from many clusters, and status batches of 1,000
//! objects.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::api::{ServerProcess, request};
use crate::stats::{emit, median, percentile, progress, round};

pub struct MetricsArgs {
    pub clusters: usize,
    pub seconds: u64,
    pub runs: usize,
    pub server_bin: Option<PathBuf>,
    pub dir: Option<PathBuf>,
}

fn cluster(name: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "multicluster.io/v1alpha1", "kind": "Cluster",
        "metadata": {"name": name},
        "spec": {"region": "r1"},
    }))
    .unwrap_or_default()
}

fn summary_status() -> Vec<u8> {
    serde_json::to_vec(&json!({"status": {
        "conditions": [{"type": "Ready", "status": "True", "reason": "Bench", "lastTransitionTime": orrery_api::Time::now().to_string()}],
        "resourceSummary": {"allocatable": {"cpu": "256", "memory": "1Ti", "pods": "1100"},
            "allocated": {"cpu": "64", "memory": "256Gi", "pods": "300"}},
    }}))
    .unwrap_or_default()
}

/// `clusters` reporters, each `PUT /api/v1/metrics` once a second for `seconds`: latency per
/// report and the server's CPU share over the window.
pub async fn metrics(args: MetricsArgs) -> anyhow::Result<()> {
    let mut p99s = Vec::new();
    let mut p50s = Vec::new();
    let mut cpus = Vec::new();
    let mut errors_total = 0usize;
    for run in 0..args.runs {
        let server = ServerProcess::start(&args.server_bin, &args.dir)?;
        let client = orrery_client::from_kubeconfig(&server.kubeconfig).await?;
        progress(format!(
            "run {}: registering {} clusters",
            run + 1,
            args.clusters
        ));
        for i in 0..args.clusters {
            let name = format!("m{i:05}");
            client
                .request_text(request(
                    "POST",
                    "/apis/multicluster.io/v1alpha1/clusters",
                    "application/json",
                    cluster(&name),
                ))
                .await?;
            client
                .request_text(request(
                    "PATCH",
                    &format!("/apis/multicluster.io/v1alpha1/clusters/{name}/status"),
                    "application/merge-patch+json",
                    summary_status(),
                ))
                .await?;
        }
        progress(format!("run {}: reporting for {} s", run + 1, args.seconds));
        let started = Instant::now();
        let (_, cpu0) = server.usage();
        let mut tasks = Vec::new();
        for i in 0..args.clusters {
            let client = client.clone();
            let seconds = args.seconds;
            let n = args.clusters;
            tasks.push(tokio::spawn(async move {
                // Spread the reporters over the second.
                tokio::time::sleep(Duration::from_secs_f64(i as f64 / n as f64)).await;
                let mut tick = tokio::time::interval(Duration::from_secs(1));
                let mut lat = Vec::new();
                let mut errors = 0usize;
                for s in 0..seconds {
                    tick.tick().await;
                    let body = serde_json::to_vec(&json!({
                        "cluster": format!("m{i:05}"),
                        "timestamp": orrery_api::Time::now().to_string(),
                        "cpuUsage": 20.0 + ((i as u64 + s) % 60) as f64,
                        "memoryAvailable": 100.0 + (s % 50) as f64,
                        "networkTraffic": 1.0e6,
                    }))
                    .unwrap_or_default();
                    let t = Instant::now();
                    match client
                        .request_text(request("PUT", "/api/v1/metrics", "application/json", body))
                        .await
                    {
                        Ok(_) => lat.push(t.elapsed().as_secs_f64() * 1000.0),
                        Err(_) => errors += 1,
                    }
                }
                (lat, errors)
            }));
        }
        let mut lat = Vec::new();
        for t in tasks {
            let (l, e) = t.await?;
            lat.extend(l);
            errors_total += e;
        }
        let wall = started.elapsed().as_secs_f64();
        let (_, cpu1) = server.usage();
        let cpu = (cpu1 - cpu0) / wall;
        progress(format!(
            "run {}: {} reports, p99 {:.1} ms, server {:.2} cores",
            run + 1,
            lat.len(),
            percentile(&lat, 99.0),
            cpu
        ));
        p50s.push(percentile(&lat, 50.0));
        p99s.push(percentile(&lat, 99.0));
        cpus.push(cpu);
    }
    emit(json!({
        "scenario": "dro-metrics-ingestion",
        "clusters": args.clusters,
        "interval_seconds": 1,
        "seconds": args.seconds,
        "runs": args.runs,
        "p50_ms_median": round(median(&p50s), 2),
        "p99_ms_median": round(median(&p99s), 2),
        "p99_ms_runs": p99s.iter().map(|x| round(*x, 2)).collect::<Vec<_>>(),
        "server_cores_median": round(median(&cpus), 3),
        "server_cores_runs": cpus.iter().map(|x| round(*x, 3)).collect::<Vec<_>>(),
        "errors": errors_total,
    }));
    Ok(())
}

pub struct BatchArgs {
    pub objects: usize,
    pub requests: usize,
    pub runs: usize,
    pub server_bin: Option<PathBuf>,
    pub dir: Option<PathBuf>,
}

/// `POST /api/v1/sync/batch` with `objects` Work statuses, `requests` times: latency.
pub async fn batch(args: BatchArgs) -> anyhow::Result<()> {
    let mut p99s = Vec::new();
    let mut p50s = Vec::new();
    for run in 0..args.runs {
        let server = ServerProcess::start(&args.server_bin, &args.dir)?;
        let client = orrery_client::from_kubeconfig(&server.kubeconfig).await?;
        client
            .request_text(request(
                "POST",
                "/apis/multicluster.io/v1alpha1/clusters",
                "application/json",
                cluster("east"),
            ))
            .await?;
        progress(format!("run {}: storing {} Works", run + 1, args.objects));
        // The cluster's namespace appears once the inventory controller has seen it.
        let ns = "orrery-cluster-east";
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let r = client
                .request_text(request(
                    "GET",
                    &format!("/api/v1/namespaces/{ns}"),
                    "application/json",
                    Vec::new(),
                ))
                .await;
            if r.is_ok() || Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for i in 0..args.objects {
            let work = serde_json::to_vec(&json!({
                "apiVersion": "multicluster.io/v1alpha1", "kind": "Work",
                "metadata": {"name": format!("w{i:05}"), "namespace": ns},
                "spec": {"workload": {"manifests": [{"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": format!("c{i}"), "namespace": "default"}, "data": {"k": "v"}}]}},
            }))
            .unwrap_or_default();
            client
                .request_text(request(
                    "POST",
                    &format!("/apis/multicluster.io/v1alpha1/namespaces/{ns}/works"),
                    "application/json",
                    work,
                ))
                .await?;
        }
        let mut lat = Vec::new();
        for r in 0..args.requests {
            let items: Vec<serde_json::Value> = (0..args.objects)
                .map(|i| json!({"kind": "Work", "namespace": ns, "name": format!("w{i:05}"),
                    "status": {"conditions": [{"type": "Applied", "status": "True", "reason": "Bench",
                        "message": format!("round {r}"), "lastTransitionTime": orrery_api::Time::now().to_string()}]}}))
                .collect();
            let body = serde_json::to_vec(&json!({ "items": items })).unwrap_or_default();
            let t = Instant::now();
            let out = client
                .request_text(request(
                    "POST",
                    "/api/v1/sync/batch",
                    "application/json",
                    body,
                ))
                .await?;
            lat.push(t.elapsed().as_secs_f64() * 1000.0);
            let v: serde_json::Value = serde_json::from_str(&out)?;
            if v["applied"].as_u64() != Some(args.objects as u64) {
                anyhow::bail!("a batch was not fully applied: {}", v["failed"]);
            }
        }
        let slowest = lat
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(i, _)| i + 1)
            .unwrap_or(0);
        progress(format!(
            "run {}: p50 {:.1} ms, p99 {:.1} ms (slowest: request {slowest} of {})",
            run + 1,
            percentile(&lat, 50.0),
            percentile(&lat, 99.0),
            lat.len()
        ));
        p50s.push(percentile(&lat, 50.0));
        p99s.push(percentile(&lat, 99.0));
    }
    emit(json!({
        "scenario": "dro-sync-batch",
        "objects": args.objects,
        "requests": args.requests,
        "runs": args.runs,
        "p50_ms_median": round(median(&p50s), 1),
        "p99_ms_median": round(median(&p99s), 1),
        "p99_ms_runs": p99s.iter().map(|x| round(*x, 1)).collect::<Vec<_>>(),
    }));
    Ok(())
}
