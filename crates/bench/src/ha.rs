//! High availability: server replicas on a three-member etcd cluster (real etcd processes on
//! loopback, Debian's `etcd-server`). Leader failover time over repeated `kill -9`s of the
//! leader, and write throughput through one replica and through three.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::api::{ServerProcess, request};
use crate::stats::{emit, median, percentile, progress, round};
use orrery_store_testkit::etcd::EtcdCluster;

const SECRET: &str = "the benchmark installation's secret";

/// `n` replicas on `etcd`, with `extra` flags.
pub(crate) fn replicas(
    etcd: &EtcdCluster,
    n: usize,
    extra: &[&str],
    server_bin: &Option<std::path::PathBuf>,
    dir: &Option<std::path::PathBuf>,
) -> anyhow::Result<Vec<ServerProcess>> {
    let endpoints = etcd.endpoints().join(",");
    let mut args = vec![
        "--store",
        "etcd",
        "--etcd-endpoints",
        &endpoints,
        "--cluster-secret",
        SECRET,
    ];
    args.extend_from_slice(extra);
    (0..n)
        .map(|_| ServerProcess::start_with(server_bin, dir, &args))
        .collect()
}

/// Whether the replica says it leads (`orrery_leader 1`); `None` when it does not answer.
async fn leads(c: &kube::Client) -> Option<bool> {
    let text = tokio::time::timeout(
        Duration::from_secs(2),
        c.request_text(request("GET", "/metrics", "text/plain", Vec::new())),
    )
    .await
    .ok()?
    .ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("orrery_leader "))
        .map(|v| v.trim() == "1")
}

pub struct FailoverArgs {
    pub kills: usize,
    pub server_bin: Option<std::path::PathBuf>,
    pub dir: Option<std::path::PathBuf>,
}

/// Kills the leading replica `kills` times (restarting it each time) and times how long the
/// others take to run the controllers again: from the kill to a replica's `orrery_leader 1`.
pub async fn failover(args: FailoverArgs) -> anyhow::Result<()> {
    let etcd = EtcdCluster::start(3)?;
    let mut servers = replicas(&etcd, 3, &[], &args.server_bin, &args.dir)?;
    let mut clients = Vec::new();
    for s in &servers {
        clients.push(orrery_client::from_kubeconfig(&s.kubeconfig).await?);
    }
    let mut times = Vec::new();
    for k in 0..args.kills {
        // Exactly one leads before the kill.
        let started = Instant::now();
        let leader = loop {
            let mut leading = Vec::new();
            for (i, c) in clients.iter().enumerate() {
                if leads(c).await == Some(true) {
                    leading.push(i);
                }
            }
            if leading.len() == 1 {
                break leading[0];
            }
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(60),
                "no single leader: {leading:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        servers[leader].kill9();
        let killed = Instant::now();
        let took = 'wait: loop {
            for (i, c) in clients.iter().enumerate() {
                if i != leader && leads(c).await == Some(true) {
                    break 'wait killed.elapsed().as_secs_f64();
                }
            }
            anyhow::ensure!(
                killed.elapsed() < Duration::from_secs(120),
                "no new leader 120 s after the kill"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        progress(format!(
            "ha failover: kill {}/{}: a new leader after {took:.2} s",
            k + 1,
            args.kills
        ));
        times.push(took);
        servers[leader].relaunch()?;
        clients[leader] = orrery_client::from_kubeconfig(&servers[leader].kubeconfig).await?;
    }
    emit(json!({
        "scenario": "ha.failover",
        "kills": args.kills,
        "lease_duration_s": 15, "renew_deadline_s": 10, "retry_period_s": 2,
        "failover_p50_s": round(percentile(&times, 50.0), 2),
        "failover_p99_s": round(percentile(&times, 99.0), 2),
        "failover_max_s": round(times.iter().cloned().fold(0.0, f64::max), 2),
        "samples_s": times.iter().map(|t| round(*t, 2)).collect::<Vec<_>>(),
        "goal_s": 17,
    }));
    Ok(())
}

pub struct WritesArgs {
    pub clients: usize,
    pub seconds: u64,
    pub runs: usize,
    pub server_bin: Option<std::path::PathBuf>,
    pub dir: Option<std::path::PathBuf>,
}

/// Creates through `clients` (spread over the replicas they were made for) for `seconds`:
/// (creates per second, latencies in ms).
async fn write_for(clients: &[kube::Client], seconds: u64, tag: &str) -> (f64, Vec<f64>) {
    let until = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for c in clients {
        let (c, next, tag) = (c.clone(), next.clone(), tag.to_string());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while Instant::now() < until {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let body = serde_json::to_vec(&json!({
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": format!("{tag}-{i}")},
                    "data": {"payload": "x".repeat(512)},
                }))
                .unwrap_or_default();
                let t = Instant::now();
                if c.request_text(request(
                    "POST",
                    "/api/v1/namespaces/default/configmaps",
                    "application/json",
                    body,
                ))
                .await
                .is_ok()
                {
                    lat.push(t.elapsed().as_secs_f64() * 1000.0);
                }
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap_or_default());
    }
    (all.len() as f64 / started.elapsed().as_secs_f64(), all)
}

/// Create throughput on a three-member etcd through one replica, then through three (the
/// clients spread evenly), in the same run.
pub async fn writes(args: WritesArgs) -> anyhow::Result<()> {
    for n in [1usize, 3] {
        let (mut rates, mut p50, mut p99) = (Vec::new(), Vec::new(), Vec::new());
        for run in 0..args.runs {
            progress(format!(
                "ha writes: {n} replica(s), run {}/{}",
                run + 1,
                args.runs
            ));
            let etcd = EtcdCluster::start(3)?;
            let servers = replicas(&etcd, n, &[], &args.server_bin, &args.dir)?;
            let mut clients = Vec::new();
            for i in 0..args.clients {
                clients.push(orrery_client::from_kubeconfig(&servers[i % n].kubeconfig).await?);
            }
            let (rate, lat) = write_for(&clients, args.seconds, &format!("r{run}")).await;
            rates.push(rate);
            p50.push(percentile(&lat, 50.0));
            p99.push(percentile(&lat, 99.0));
        }
        emit(json!({
            "scenario": "ha.writes",
            "etcd_members": 3,
            "replicas": n,
            "clients": args.clients,
            "creates_per_sec": round(median(&rates), 0),
            "latency_p50_ms": round(median(&p50), 2),
            "latency_p99_ms": round(median(&p99), 2),
            "samples_per_sec": rates.iter().map(|r| round(*r, 0)).collect::<Vec<_>>(),
            "runs": args.runs,
        }));
    }
    Ok(())
}
