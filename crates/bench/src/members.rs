//! Member-cluster benchmarks: registration to Ready, a fleet of simulated clusters in one
//! agent process, and the memory of one agent.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};

use crate::api::{ServerProcess, request};
use crate::stats::{emit, percentile, process_usage, progress, round};

pub(crate) async fn bootstrap_token(
    client: &kube::Client,
    cluster: &str,
) -> anyhow::Result<String> {
    let body = serde_json::to_vec(&json!({ "cluster": cluster, "ttl": "1h" }))?;
    let text = client
        .request_text(request(
            "POST",
            "/agent/v1/tokens",
            "application/json",
            body,
        ))
        .await?;
    let v: Value = serde_json::from_str(&text)?;
    Ok(v["token"].as_str().context("no token")?.to_string())
}

/// Records when each cluster first turned Ready.
fn ready_times(client: kube::Client) -> Arc<Mutex<HashMap<String, Instant>>> {
    let seen: Arc<Mutex<HashMap<String, Instant>>> = Default::default();
    let out = seen.clone();
    let api: Api<DynamicObject> = orrery_client::api(&client, &orrery_client::kinds::CLUSTER, None);
    tokio::spawn(async move {
        let mut s = watcher::watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        while let Some(ev) = s.next().await {
            let objs = match ev {
                Ok(watcher::Event::Apply(o)) | Ok(watcher::Event::InitApply(o)) => vec![o],
                _ => continue,
            };
            for o in objs {
                let ready = o
                    .data
                    .pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c["type"] == "Ready" && c["status"] == "True")
                    });
                if ready && let Some(n) = o.metadata.name {
                    seen.lock().entry(n).or_insert_with(Instant::now);
                }
            }
        }
    });
    out
}

pub struct RegisterArgs {
    pub clusters: usize,
    pub server_bin: Option<PathBuf>,
    pub dir: Option<PathBuf>,
}

/// Registration to Ready: an agent with a fresh bootstrap token starts; the clock stops when
/// a watcher of the control plane sees its Cluster Ready.
pub async fn register(args: RegisterArgs) -> anyhow::Result<()> {
    let server = ServerProcess::start(&args.server_bin, &args.dir)?;
    let admin = orrery_client::from_kubeconfig(&server.kubeconfig).await?;
    let ready = ready_times(admin.clone());
    let url = server.url.clone();
    let (_stop_tx, stop) = tokio::sync::watch::channel(false);
    let mut lat = Vec::new();
    for i in 0..args.clusters {
        let name = format!("reg-{i}");
        let token = bootstrap_token(&admin, &name).await?;
        let mut cfg = orrery_agent::AgentConfig::new(&url, &name);
        cfg.bootstrap_token = Some(token);
        cfg.info.region = "bench".into();
        let spec: orrery_sim::SimSpec = "nodes=10,cpu=16,memory=64Gi"
            .parse()
            .map_err(|e: String| anyhow::anyhow!(e))?;
        let sim = Arc::new(orrery_sim::SimCluster::new(&name, "bench", spec));
        let t0 = Instant::now();
        tokio::spawn(orrery_agent::run(cfg, sim, stop.clone()));
        let deadline = t0 + Duration::from_secs(10);
        loop {
            if let Some(at) = ready.lock().get(&name) {
                lat.push(at.duration_since(t0).as_secs_f64() * 1000.0);
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{name} did not become Ready in 10 s"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        if (i + 1) % 10 == 0 {
            progress(format!("members register: {}/{}", i + 1, args.clusters));
        }
    }
    emit(json!({
        "scenario": "members.register_to_ready",
        "clusters": args.clusters,
        "p50_ms": round(percentile(&lat, 50.0), 1),
        "p99_ms": round(percentile(&lat, 99.0), 1),
        "max_ms": round(percentile(&lat, 100.0), 1),
        "measures": "from starting an agent with a bootstrap token (CA fetch and pin, registration, first heartbeat) to a control-plane watcher seeing Ready=True",
        "goal_p99_ms": 500,
    }));
    Ok(())
}

/// An `orrery agent` process.
pub(crate) struct AgentProcess {
    child: Child,
    pub(crate) admin: String,
    _state: tempfile::TempDir,
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        crate::children::stopped(self.child.id());
    }
}

/// Starts `orrery agent`; with `admin`, waits for its admin endpoint (simulated members only).
pub(crate) fn start_agent(
    bin: &std::path::Path,
    server: &str,
    args: &[String],
    admin: bool,
) -> anyhow::Result<AgentProcess> {
    start_agent_nice(bin, server, args, admin, 0)
}

/// [`start_agent`] at a niceness (through `nice(1)`, as the workspace forbids the `unsafe`
/// a `setpriority` before `exec` would take).
pub(crate) fn start_agent_nice(
    bin: &std::path::Path,
    server: &str,
    args: &[String],
    admin: bool,
    nice: u8,
) -> anyhow::Result<AgentProcess> {
    let state = tempfile::tempdir()?;
    let mut cmd = if nice == 0 {
        Command::new(bin)
    } else {
        let mut c = Command::new("nice");
        c.arg("-n").arg(nice.to_string()).arg(bin);
        c
    };
    cmd.args(["agent", "--server", server, "--state-dir"])
        .arg(state.path())
        .args(args);
    if admin {
        cmd.args(["--admin-listen", "127.0.0.1:0"]);
    }
    // ORRERY_BENCH_AGENT_LOG=<file> keeps each agent's log in <file>.<n> (for looking into a
    // figure); ORRERY_BENCH_AGENT_LOG_LEVEL sets its level.
    static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let stderr = match std::env::var_os("ORRERY_BENCH_AGENT_LOG") {
        Some(mut f) => {
            let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            f.push(format!(".{n}"));
            Stdio::from(std::fs::File::create(f)?)
        }
        None => Stdio::null(),
    };
    let mut child = cmd
        .env(
            "ORRERY_LOG",
            std::env::var("ORRERY_BENCH_AGENT_LOG_LEVEL").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .context("starting the agent")?;
    crate::children::started(child.id());
    let stdout = child.stdout.take().context("agent stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let mut addr = String::new();
    if admin {
        loop {
            match lines.next() {
                Some(Ok(l)) => {
                    if let Some(a) = l.strip_prefix("admin endpoint at http://") {
                        addr = a.to_string();
                        break;
                    }
                }
                _ => anyhow::bail!("the agent exited before serving its admin endpoint"),
            }
        }
    }
    std::thread::spawn(move || for _ in lines {});
    Ok(AgentProcess {
        child,
        admin: addr,
        _state: state,
    })
}

/// A request with a JSON body to a simulated member through the agent's admin endpoint.
pub(crate) fn admin_send(method: &str, addr: &str, path: &str, body: &Value) -> anyhow::Result<()> {
    use std::io::{Read, Write};
    let body = serde_json::to_vec(body)?;
    let mut s = std::net::TcpStream::connect(addr)?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    s.write_all(&body)?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    anyhow::ensure!(
        out.starts_with("HTTP/1.1 2"),
        "{path}: {}",
        out.lines().next().unwrap_or_default()
    );
    Ok(())
}

/// `GET` on the agent's admin endpoint.
pub(crate) fn admin_get(addr: &str, path: &str) -> anyhow::Result<Value> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr)?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    Ok(serde_json::from_str(body)?)
}

pub struct FleetArgs {
    pub clusters: usize,
    pub nodes: usize,
    pub steady_secs: u64,
    pub heartbeat: String,
    /// 1: one server on SQLite; more: that many replicas on a three-member etcd, each with
    /// an agent process hosting its share of the clusters (and knowing the other replicas).
    pub replicas: usize,
    pub server_bin: Option<PathBuf>,
    pub dir: Option<PathBuf>,
    /// The members' background load, as the sim's spec says it (`profile=..,period=..`).
    pub load: String,
    /// The niceness of the processes simulating the members.
    pub agents_nice: u8,
}

pub(crate) fn orrery_bin(server_bin: &Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let bin = match server_bin {
        Some(b) => b.clone(),
        None => std::env::current_exe()?.with_file_name("orrery"),
    };
    anyhow::ensure!(bin.exists(), "no orrery binary at {}", bin.display());
    Ok(bin)
}

/// One agent process hosting many simulated clusters against one server: time to all Ready,
/// then the steady state (server CPU and memory, agent memory, heartbeat and report latency).
pub async fn fleet(args: FleetArgs) -> anyhow::Result<()> {
    let bin = orrery_bin(&args.server_bin)?;
    let n = args.replicas.max(1);
    let (etcd, servers) = start_servers(&args, n)?;
    let server = &servers[0];
    let admin = orrery_client::from_kubeconfig(&server.kubeconfig).await?;
    let token = bootstrap_token(&admin, "fleet-*").await?;
    let dir = tempfile::tempdir()?;
    // Cluster j is hosted by agent j % n, which uses replica j % n first.
    let name_of = move |j: usize| {
        if n == 1 {
            format!("fleet-{j}")
        } else {
            format!("fleet-{}-{}", j % n, j / n)
        }
    };
    let server_clients = {
        let mut v = Vec::new();
        for s in &servers {
            v.push(orrery_client::from_kubeconfig(&s.kubeconfig).await?);
        }
        v
    };
    let beats0 = heartbeat_buckets(&server_clients).await?;
    progress(format!(
        "members fleet: starting {} simulated clusters of {} nodes over {n} server(s)",
        args.clusters, args.nodes
    ));
    let started = Instant::now();
    let agents = start_fleet_agents(&args, &bin, n, dir.path(), &servers, &token)?;

    // Seconds until every member was Ready at once; `None` when a few (at most one in a
    // thousand) still came and went at the deadline: the run goes on to the Works and says so.
    let (all_ready, ready_at_deadline) = wait_all_ready(&admin, &args, started).await?;
    if let Some(t) = all_ready {
        progress(format!("members fleet: all Ready after {t:.1} s"));
    }
    // Let the registration burst settle, then measure.
    tokio::time::sleep(Duration::from_secs(10)).await;
    // Heartbeats while the fleet registered, then afresh while the Works roll out.
    let (registering, beats1) = end_of_phase(&agents, &server_clients).await?;
    let t0 = Instant::now();
    // A Work per cluster, so that statuses are reported too.
    progress(format!(
        "members fleet: one Work per cluster ({})",
        args.clusters
    ));
    let creates = create_works(&admin, args.clusters, name_of).await?;
    let available = works_available(&admin, &args).await?;
    let works_available_after = t0.elapsed().as_secs_f64();
    // Heartbeats while the Works rolled out (created, applied, their statuses reported), then
    // afresh for the steady state, which has only heartbeats and periodic reports.
    let (rolling_out, beats2) = end_of_phase(&agents, &server_clients).await?;
    let kinds2 = heartbeat_kinds(&server_clients).await?;
    progress(format!(
        "members fleet: Works available after {works_available_after:.1} s; measuring {} s of steady state",
        args.steady_secs
    ));
    let server_cpu0: Vec<f64> = servers.iter().map(|s| s.usage_full().2).collect();
    let agent_cpu0: Vec<f64> = agents
        .iter()
        .map(|a| process_usage(a.child.id()).2)
        .collect();
    // What else shares the cores: etcd's members, this process, the machine as a whole.
    let etcd_pids = etcd.as_ref().map(|e| e.pids()).unwrap_or_default();
    let etcd_cpu0: Vec<f64> = etcd_pids.iter().map(|p| process_usage(*p).2).collect();
    let own_cpu0 = process_usage(std::process::id()).2;
    let busy0 = crate::stats::machine_busy_seconds();
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(args.steady_secs)).await;
    let wall = t0.elapsed().as_secs_f64();
    let cores = |cpu1: f64, cpu0: f64| round((cpu1 - cpu0) / wall, 3);
    let etcd_cpu: Vec<f64> = etcd_pids
        .iter()
        .zip(&etcd_cpu0)
        .map(|(p, c0)| cores(process_usage(*p).2, *c0))
        .collect();
    let own_cpu = cores(process_usage(std::process::id()).2, own_cpu0);
    let machine_busy = cores(crate::stats::machine_busy_seconds(), busy0);
    let machine_cores = std::thread::available_parallelism().map_or(1, usize::from);
    let per_server: Vec<Value> = servers
        .iter()
        .zip(&server_cpu0)
        .map(|(s, cpu0)| {
            let (rss, peak, cpu1) = s.usage_full();
            json!({
                "cpu_cores": round((cpu1 - cpu0) / wall, 3),
                "rss_mib": round(rss, 1),
                "peak_rss_mib": round(peak, 1),
            })
        })
        .collect();
    let (per_agent, heartbeat_p99) = agent_figures(&agents, &agent_cpu0, wall)?;
    let beats3 = heartbeat_buckets(&server_clients).await?;
    let kinds3 = heartbeat_kinds(&server_clients).await?;
    let still_ready = orrery_client::ready_clusters(&admin).await?;
    let first = |v: &[Value], k: &str| v.first().map(|x| x[k].clone()).unwrap_or(Value::Null);
    emit(json!({
        "scenario": "members.fleet",
        "clusters": args.clusters,
        "servers": n,
        "store": if n == 1 { "sqlite" } else { "etcd (3 members)" },
        "nodes_per_cluster": args.nodes,
        "heartbeat_interval": args.heartbeat,
        "agents_nice": args.agents_nice,
        "load": args.load,
        "seconds_to_all_ready": all_ready.map(|t| round(t, 1)),
        "ready_at_deadline": ready_at_deadline,
        "steady_seconds": args.steady_secs,
        "ready_at_end": still_ready,
        "works_available": available,
        "work_creates_told_to_wait": creates.told_to_wait,
        // Creates answered 409 (the Work was there): after a 429/503, and without one before.
        "work_creates_found_existing": creates.found_existing,
        "work_creates_found_existing_unasked": creates.found_existing_unasked,
        "seconds_to_works_available": round(works_available_after, 1),
        "server_cpu_cores": first(&per_server, "cpu_cores"),
        // The steady window's CPU beside the servers' and agents' (in `per_server`, `agents`).
        "etcd_cpu_cores": etcd_cpu,
        "bench_cpu_cores": own_cpu,
        "machine_busy_cores": machine_busy,
        "machine_cores": machine_cores,
        "server_rss_mib": first(&per_server, "rss_mib"),
        "server_peak_rss_mib": first(&per_server, "peak_rss_mib"),
        "per_server": per_server,
        "agents": per_agent,
        "heartbeat_p99_ms_max": round(heartbeat_p99, 1),
        "heartbeat_ms_while_registering": registering,
        "server_heartbeat_ms_while_registering": server_quantiles(&beats0, &beats1),
        "heartbeat_ms_while_works_roll_out": rolling_out,
        "server_heartbeat_ms_while_works_roll_out": server_quantiles(&beats1, &beats2),
        "server_heartbeat_ms_steady": server_quantiles(&beats2, &beats3),
        "steady_status_writes": kinds3.0 - kinds2.0,
        "steady_lease_renewals": kinds3.1 - kinds2.1,
        "agent_rss_kib_per_cluster": round(
            agents.iter().map(|a| process_usage(a.child.id()).0).sum::<f64>() * 1024.0 / args.clusters as f64, 1),
        "goals": {"server_rss_mib": 1024, "server_cpu_cores": 1.0, "agent_kib_per_cluster": 1024},
    }));
    Ok(())
}

/// One server (sqlite), or `replicas` of them on a three-member etcd.
fn start_servers(
    args: &FleetArgs,
    n: usize,
) -> anyhow::Result<(
    Option<orrery_store_testkit::etcd::EtcdCluster>,
    Vec<ServerProcess>,
)> {
    let (etcd, servers) = if n == 1 {
        (
            None,
            vec![ServerProcess::start(&args.server_bin, &args.dir)?],
        )
    } else {
        let etcd = orrery_store_testkit::etcd::EtcdCluster::start(3)?;
        // ORRERY_BENCH_SLOW_REQUESTS=<duration> has the replicas log each request slower than
        // that with its steps (kept with ORRERY_BENCH_SERVER_LOG=<file> and
        // ORRERY_BENCH_SERVER_LOG_LEVEL=warn,orrery_apiserver::router=info).
        let slow = std::env::var("ORRERY_BENCH_SLOW_REQUESTS").ok();
        let extra: Vec<&str> = match &slow {
            Some(d) => vec!["--slow-request-threshold", d],
            None => Vec::new(),
        };
        let servers = crate::ha::replicas(&etcd, n, &extra, &args.server_bin, &args.dir)?;
        (Some(etcd), servers)
    };
    Ok((etcd, servers))
}

/// The `n` agent processes, agent k hosting clusters j with j % n == k from a fleet file of
/// its own, replica k first among its servers.
fn start_fleet_agents(
    args: &FleetArgs,
    bin: &std::path::Path,
    n: usize,
    dir: &std::path::Path,
    servers: &[ServerProcess],
    token: &str,
) -> anyhow::Result<Vec<AgentProcess>> {
    let mut agents = Vec::new();
    for k in 0..n {
        let count = (0..args.clusters).filter(|j| j % n == k).count();
        let file = dir.join(format!("fleet-{k}.yaml"));
        let pattern = if n == 1 {
            "fleet-{i}".to_string()
        } else {
            format!("fleet-{k}-{{i}}")
        };
        std::fs::write(
            &file,
            format!(
                "clusters:\n  - name: {pattern}\n    count: {count}\n    regions: [us-east, us-west, eu-central, ap-south]\n    provider: sim\n    simulate: nodes={},cpu=16,memory=64Gi,load=0.3,{}\n",
                args.nodes, args.load
            ),
        )?;
        let urls: Vec<&str> = (0..n).map(|i| servers[(k + i) % n].url.as_str()).collect();
        agents.push(start_agent_nice(
            bin,
            &urls.join(","),
            &[
                "--simulate-fleet".into(),
                file.display().to_string(),
                "--token".into(),
                token.to_string(),
                "--heartbeat-interval".into(),
                args.heartbeat.clone(),
            ],
            true,
            args.agents_nice,
        )?);
    }
    Ok(agents)
}

/// Waits (10 minutes at most) until every member is Ready at once: the seconds that took,
/// or, when a few (at most one in a thousand) still came and went at the deadline, how
/// many were Ready then.
async fn wait_all_ready(
    admin: &kube::Client,
    args: &FleetArgs,
    started: Instant,
) -> anyhow::Result<(Option<f64>, Option<usize>)> {
    let mut all_ready = None;
    let mut ready_at_deadline = None;
    loop {
        let n = orrery_client::ready_clusters(admin).await?;
        if n >= args.clusters {
            all_ready = Some(started.elapsed().as_secs_f64());
            break;
        }
        if started.elapsed() >= Duration::from_secs(600) {
            // Say which members are missing and what their Clusters say, so that a run that
            // misses the deadline tells why (never registered, or declared Unknown).
            for line in not_ready(admin, 20).await? {
                progress(format!("members fleet: not Ready: {line}"));
            }
            if n * 1000 < args.clusters * 999 {
                anyhow::bail!("only {n} clusters Ready after 10 minutes");
            }
            progress(format!(
                "members fleet: {n}/{} Ready after 10 minutes; going on without the rest",
                args.clusters
            ));
            ready_at_deadline = Some(n);
            break;
        }
        progress(format!(
            "members fleet: {n}/{} Ready after {:.0} s",
            args.clusters,
            started.elapsed().as_secs_f64()
        ));
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    Ok((all_ready, ready_at_deadline))
}

/// How the Work creates went: how often the server told a client to wait, and how many
/// found the Work there already (and of those, how many had not been told to wait).
struct WorkCreates {
    told_to_wait: usize,
    found_existing: usize,
    found_existing_unasked: usize,
}

/// Creates a Work per cluster (a Deployment and a ConfigMap), over 16 clients.
async fn create_works(
    admin: &kube::Client,
    clusters: usize,
    name_of: impl Fn(usize) -> String + Copy + Send + 'static,
) -> anyhow::Result<WorkCreates> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let throttled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let existing = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let existing_unasked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (c, next, total) = (admin.clone(), next.clone(), clusters);
        let throttled = throttled.clone();
        let (existing, existing_unasked) = (existing.clone(), existing_unasked.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= total {
                    return Ok::<_, kube::Error>(());
                }
                let ns = format!("orrery-cluster-{}", name_of(i));
                let work = json!({"apiVersion": "multicluster.io/v1alpha1", "kind": "Work",
                    "metadata": {"name": "bench", "namespace": ns},
                    "spec": {"workload": {"manifests": [
                        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "default"},
                         "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                                  "template": {"metadata": {"labels": {"app": "web"}},
                                               "spec": {"containers": [{"name": "web", "image": "nginx",
                                                        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]}}}},
                        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "web", "namespace": "default"}, "data": {"a": "b"}}
                    ]}}});
                // As a client should: told to wait (429, 503), it waits and tries again.
                let body = serde_json::to_vec(&work).unwrap_or_default();
                let mut told_to_wait = false;
                loop {
                    let path = format!("/apis/multicluster.io/v1alpha1/namespaces/{ns}/works");
                    match c.request_text(request("POST", &path, "application/json", body.clone())).await {
                        Ok(_) => break,
                        Err(kube::Error::Api(e)) if e.code == 429 || e.code == 503 => {
                            throttled.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            told_to_wait = true;
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                        // Already there: a 503 for a write that outlasted the server's limit
                        // does not say the write did not happen (its commit may land after).
                        // Counted apart, and whether an answer had told it to wait.
                        Err(kube::Error::Api(e)) if e.code == 409 => {
                            existing.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            if !told_to_wait {
                                existing_unasked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            }
                            break;
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(WorkCreates {
        told_to_wait: throttled.load(std::sync::atomic::Ordering::Relaxed),
        found_existing: existing.load(std::sync::atomic::Ordering::Relaxed),
        found_existing_unasked: existing_unasked.load(std::sync::atomic::Ordering::Relaxed),
    })
}

/// Waits (at least 2 minutes, or the steady window if longer) for every Work to be
/// AllHealthy; how many were then.
async fn works_available(admin: &kube::Client, args: &FleetArgs) -> anyhow::Result<usize> {
    let works: Api<DynamicObject> = orrery_client::api(admin, &orrery_client::kinds::WORK, None);
    let mut available = 0;
    // The Works get their own time once created: at 10,000 members creating them takes
    // longer than this wait, which then never looked.
    let created = Instant::now();
    while created.elapsed() < Duration::from_secs(args.steady_secs.max(120)) {
        // In pages, and every 10 s: at 10,000 members a whole list every 2 s was load of its
        // own on the replica serving it, in the window being measured.
        available = 0;
        orrery_client::for_each(&works, |w| {
            let healthy = w
                .data
                .pointer("/status/conditions")
                .is_some_and(|c| c.to_string().contains("AllHealthy"));
            available += usize::from(healthy);
        })
        .await?;
        if available >= args.clusters {
            break;
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
    Ok(available)
}

/// Each agent's CPU over the steady window (`agent_cpu0` at its start, `wall` seconds),
/// memory and latencies; and the largest heartbeat p99 among them.
fn agent_figures(
    agents: &[AgentProcess],
    agent_cpu0: &[f64],
    wall: f64,
) -> anyhow::Result<(Vec<Value>, f64)> {
    let mut per_agent = Vec::new();
    let mut heartbeat_p99: f64 = 0.0;
    for (a, cpu0) in agents.iter().zip(agent_cpu0) {
        let (rss, peak, cpu1) = process_usage(a.child.id());
        let stats = admin_get(&a.admin, "/stats")?;
        heartbeat_p99 = heartbeat_p99.max(stats["heartbeat"]["p99_ms"].as_f64().unwrap_or(0.0));
        per_agent.push(json!({
            "cpu_cores": round((cpu1 - cpu0) / wall, 3),
            "rss_mib": round(rss, 1),
            "peak_rss_mib": round(peak, 1),
            "heartbeat_ms": stats["heartbeat"],
            "report_ms": stats["report"],
        }));
    }
    Ok((per_agent, heartbeat_p99))
}

/// The Clusters not Ready now (at most `limit` of them described, then a count by reason):
/// each with its Ready condition (or none) and its last heartbeat.
async fn not_ready(admin: &kube::Client, limit: usize) -> anyhow::Result<Vec<String>> {
    let clusters = orrery_client::api(admin, &orrery_client::kinds::CLUSTER, None);
    let mut out = Vec::new();
    let mut reasons: std::collections::BTreeMap<String, usize> = Default::default();
    orrery_client::for_each(&clusters, |o| {
        let ready = o
            .data
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"));
        if ready.is_some_and(|c| c["status"] == "True") {
            return;
        }
        let reason = ready.map_or("no Ready condition".to_string(), |c| {
            format!(
                "{} ({})",
                c["status"].as_str().unwrap_or("?"),
                c["reason"].as_str().unwrap_or("")
            )
        });
        *reasons.entry(reason.clone()).or_default() += 1;
        if out.len() < limit {
            out.push(format!(
                "{}: {reason} since {}, last heartbeat {}",
                o.metadata.name.as_deref().unwrap_or("?"),
                ready
                    .and_then(|c| c["lastTransitionTime"].as_str())
                    .unwrap_or("-"),
                o.data
                    .pointer("/status/lastHeartbeatTime")
                    .and_then(Value::as_str)
                    .unwrap_or("-"),
            ));
        }
    })
    .await?;
    out.extend(reasons.into_iter().map(|(r, k)| format!("{k} with {r}")));
    Ok(out)
}

/// Ends a phase of the run: each agent's heartbeat figures since the last phase (then reset),
/// and the servers' heartbeat histograms now.
async fn end_of_phase(
    agents: &[AgentProcess],
    servers: &[kube::Client],
) -> anyhow::Result<(Vec<Value>, Vec<(f64, f64)>)> {
    let mut beats = Vec::new();
    for agent in agents {
        beats.push(admin_get(&agent.admin, "/stats?reset=true")?["heartbeat"].clone());
    }
    Ok((beats, heartbeat_buckets(servers).await?))
}

/// Which heartbeat a `/metrics` series of `orrery_http_request_duration_seconds` answered
/// with 200 counts, by its labels: `Some(false)` a status write (a PATCH of a Cluster's
/// status), `Some(true)` a Lease renewal.
fn heartbeat_kind(labels: &str) -> Option<bool> {
    if !labels.contains("code=\"200\"") {
        return None;
    }
    if labels.contains("verb=\"patch\"") && labels.contains("resource=\"clusters\"") {
        Some(false)
    } else if labels.contains("verb=\"put\"") && labels.contains("resource=\"leases\"") {
        Some(true)
    } else {
        None
    }
}

/// The series `orrery_http_request_duration_seconds_<suffix>` of heartbeats on every replica:
/// (labels, whether a renewal, value).
async fn heartbeat_series(
    servers: &[kube::Client],
    suffix: &str,
) -> anyhow::Result<Vec<(String, bool, f64)>> {
    let prefix = format!("orrery_http_request_duration_seconds_{suffix}{{");
    let mut out = Vec::new();
    for c in servers {
        let text = c
            .request_text(request("GET", "/metrics", "text/plain", Vec::new()))
            .await?;
        for line in text.lines() {
            let Some(rest) = line.strip_prefix(&prefix) else {
                continue;
            };
            let value = rest.rsplit(' ').next().and_then(|x| x.parse::<f64>().ok());
            if let (Some(renewal), Some(value)) = (heartbeat_kind(rest), value) {
                out.push((rest.to_string(), renewal, value));
            }
        }
    }
    Ok(out)
}

/// The servers' own time for heartbeats (a renewal of a member's Lease, or a PATCH of a
/// Cluster's status when it changed; answered 200), as their `/metrics` histograms count it,
/// summed over the replicas: cumulative counts by upper bound in seconds. The agents' figures
/// add the network and the simulating process's own queueing (thousands of clusters in one
/// process) to this.
async fn heartbeat_buckets(servers: &[kube::Client]) -> anyhow::Result<Vec<(f64, f64)>> {
    let mut sum: Vec<(f64, f64)> = Vec::new();
    for (labels, _, count) in heartbeat_series(servers, "bucket").await? {
        let Some(le) = labels
            .split("le=\"")
            .nth(1)
            .and_then(|x| x.split('"').next())
        else {
            continue;
        };
        let le = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse()?
        };
        match sum.iter_mut().find(|(l, _)| *l == le) {
            Some((_, c)) => *c += count,
            None => sum.push((le, count)),
        }
    }
    sum.sort_by(|a, b| a.0.total_cmp(&b.0));
    Ok(sum)
}

/// How many heartbeats the servers have answered so far, summed over the replicas: status
/// writes and Lease renewals.
async fn heartbeat_kinds(servers: &[kube::Client]) -> anyhow::Result<(f64, f64)> {
    let (mut writes, mut renewals) = (0.0, 0.0);
    for (_, renewal, count) in heartbeat_series(servers, "count").await? {
        if renewal {
            renewals += count;
        } else {
            writes += count;
        }
    }
    Ok((writes, renewals))
}

/// p50 and p99 (milliseconds, interpolated within the histogram's buckets) of what was counted
/// between two readings.
fn server_quantiles(before: &[(f64, f64)], after: &[(f64, f64)]) -> Value {
    let counts: Vec<(f64, f64)> = after
        .iter()
        .map(|(le, c)| {
            let was = before
                .iter()
                .find(|(l, _)| l == le)
                .map_or(0.0, |(_, c)| *c);
            (*le, c - was)
        })
        .collect();
    let total = counts.last().map_or(0.0, |(_, c)| *c);
    let q = |q: f64| -> Value {
        let target = q * total;
        let mut prev = (0.0, 0.0);
        for &(le, c) in &counts {
            if c >= target && total > 0.0 {
                if le.is_infinite() {
                    return json!(format!("> {} ms", prev.0 * 1000.0));
                }
                let within = if c > prev.1 {
                    (target - prev.1) / (c - prev.1)
                } else {
                    1.0
                };
                return json!(round((prev.0 + (le - prev.0) * within) * 1000.0, 1));
            }
            prev = (le, c);
        }
        Value::Null
    };
    json!({"count": total, "p50": q(0.5), "p99": q(0.99),
           "measures": "the servers' own time per heartbeat (their /metrics histogram, buckets doubling from 0.5 ms; interpolated)"})
}

pub struct AgentMemoryArgs {
    pub nodes: usize,
    pub settle_secs: u64,
    pub server_bin: Option<PathBuf>,
    pub dir: Option<PathBuf>,
}

/// One agent process for one cluster: a simulated member, and a member API with many nodes
/// (an Orrery server standing in for a large cluster's API).
pub async fn agent_memory(args: AgentMemoryArgs) -> anyhow::Result<()> {
    let bin = orrery_bin(&args.server_bin)?;
    let server = ServerProcess::start(&args.server_bin, &args.dir)?;
    let admin = orrery_client::from_kubeconfig(&server.kubeconfig).await?;

    // A simulated member of that many nodes.
    let token = bootstrap_token(&admin, "sim-one").await?;
    let sim = start_agent(
        &bin,
        &server.url,
        &[
            "--cluster".into(),
            "sim-one".into(),
            "--token".into(),
            token,
            "--simulate".into(),
            format!("nodes={},cpu=32,memory=128Gi", args.nodes),
            "--heartbeat-interval".into(),
            "2s".into(),
        ],
        true,
    )?;

    // A member API with that many Nodes.
    let member = ServerProcess::start(&args.server_bin, &args.dir)?;
    let mclient = orrery_client::from_kubeconfig(&member.kubeconfig).await?;
    progress(format!(
        "members agent-memory: creating {} nodes in the member",
        args.nodes
    ));
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (c, next, total) = (mclient.clone(), next.clone(), args.nodes);
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= total {
                    return Ok::<_, kube::Error>(());
                }
                let name = format!("node-{i:05}");
                let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name,
                    "labels": {"kubernetes.io/hostname": name, "topology.kubernetes.io/zone": format!("z{}", i % 3)}}});
                c.request_text(request("POST", "/api/v1/nodes", "application/json", serde_json::to_vec(&node).unwrap_or_default())).await?;
                let status = json!({"status": {"allocatable": {"cpu": "32", "memory": "128Gi", "pods": "110"},
                    "capacity": {"cpu": "32", "memory": "128Gi", "pods": "110"},
                    "conditions": [{"type": "Ready", "status": "True"}]}});
                c.request_text(request("PATCH", &format!("/api/v1/nodes/{name}/status"), "application/merge-patch+json", serde_json::to_vec(&status).unwrap_or_default())).await?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    let token = bootstrap_token(&admin, "kube-one").await?;
    let kube_agent = start_agent(
        &bin,
        &server.url,
        &[
            "--cluster".into(),
            "kube-one".into(),
            "--token".into(),
            token,
            "--kubeconfig".into(),
            member.kubeconfig.display().to_string(),
            "--heartbeat-interval".into(),
            "2s".into(),
        ],
        false,
    )?;
    // Several heartbeats (each lists every node) before measuring.
    let deadline = Instant::now() + Duration::from_secs(60);
    while orrery_client::ready_clusters(&admin).await? < 2 {
        anyhow::ensure!(Instant::now() < deadline, "the agents did not become Ready");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_secs(args.settle_secs)).await;
    let (sim_rss, sim_peak, _) = process_usage(sim.child.id());
    let (kube_rss, kube_peak, _) = process_usage(kube_agent.child.id());
    emit(json!({
        "scenario": "members.agent_memory",
        "nodes": args.nodes,
        "simulated_member": {"rss_mib": round(sim_rss, 1), "peak_rss_mib": round(sim_peak, 1)},
        "kube_member": {"rss_mib": round(kube_rss, 1), "peak_rss_mib": round(kube_peak, 1)},
        "measures": "resident memory of one `orrery agent` process after it has reported for a while; the kube member is an Orrery API serving that many Nodes",
        "goal_rss_mib": 20,
    }));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_come_from_the_difference_of_two_readings() {
        let before = [
            (0.001, 10.0),
            (0.002, 10.0),
            (0.004, 10.0),
            (f64::INFINITY, 10.0),
        ];
        let after = [
            (0.001, 10.0),
            (0.002, 60.0),
            (0.004, 110.0),
            (f64::INFINITY, 110.0),
        ];
        let q = server_quantiles(&before, &after);
        assert_eq!(q["count"], 100.0);
        assert_eq!(q["p50"], 2.0);
        assert_eq!(q["p99"], 4.0); // 3.96, to a tenth of a millisecond
        // Beyond the last bound: said as such.
        let after = [
            (0.001, 10.0),
            (0.002, 10.0),
            (0.004, 10.0),
            (f64::INFINITY, 110.0),
        ];
        assert_eq!(server_quantiles(&before, &after)["p99"], "> 4 ms");
        assert_eq!(server_quantiles(&before, &before)["p99"], Value::Null);
    }
}
