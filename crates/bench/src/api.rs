//! API server benchmarks: the real `orrery server` process, driven over HTTPS by kube clients
//! with pre-serialized bodies.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::StreamExt;
use serde_json::json;

use crate::stats::{emit, median, percentile, progress, round};

/// A server process for one benchmark.
pub struct ServerProcess {
    child: Child,
    /// Set before the bench stops the server itself, so the watchdog stays quiet.
    stopping: Arc<AtomicBool>,
    pub kubeconfig: PathBuf,
    pub url: String,
    bin: PathBuf,
    port: u16,
    extra: Vec<String>,
    _dir: tempfile::TempDir,
}

impl ServerProcess {
    pub fn start(bin: &Option<PathBuf>, dir: &Option<PathBuf>) -> anyhow::Result<Self> {
        Self::start_with(bin, dir, &[])
    }

    /// A server with more flags (`--migration-cleanup-grace 1s`...).
    pub fn start_with(
        bin: &Option<PathBuf>,
        dir: &Option<PathBuf>,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        let bin = match bin {
            Some(b) => b.clone(),
            None => std::env::current_exe()?.with_file_name("orrery"),
        };
        anyhow::ensure!(
            bin.exists(),
            "no orrery binary at {} (cargo build --release -p orrery, or --server-bin)",
            bin.display()
        );
        let tmp = match dir {
            Some(d) => {
                std::fs::create_dir_all(d)?;
                tempfile::tempdir_in(d)?
            }
            None => tempfile::tempdir()?,
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let (child, stopping) = Self::launch(&bin, tmp.path(), port, &extra)?;
        Ok(ServerProcess {
            child,
            stopping,
            kubeconfig: tmp.path().join("admin.kubeconfig"),
            url: format!("https://127.0.0.1:{port}"),
            bin,
            port,
            extra,
            _dir: tmp,
        })
    }

    /// Stops the server with SIGTERM and starts it again on the same data directory and
    /// port; returns once it says it is ready.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.stopping.store(true, Ordering::Relaxed);
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        self.child.wait()?;
        crate::children::stopped(self.child.id());
        let (child, stopping) = Self::launch(&self.bin, self._dir.path(), self.port, &self.extra)?;
        self.child = child;
        self.stopping = stopping;
        Ok(())
    }

    fn launch(
        bin: &std::path::Path,
        dir: &std::path::Path,
        port: u16,
        extra: &[String],
    ) -> anyhow::Result<(Child, Arc<AtomicBool>)> {
        let mut child = Command::new(bin)
            .args(["server", "--data-dir"])
            .arg(dir)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            // Every member and client of a benchmark connects from loopback (unless the
            // scenario sets the limit itself).
            .args(
                if extra.iter().any(|a| a == "--max-connections-per-source") {
                    &[][..]
                } else {
                    &["--max-connections-per-source", "0"][..]
                },
            )
            .args(extra)
            .env(
                "ORRERY_LOG",
                std::env::var("ORRERY_BENCH_SERVER_LOG_LEVEL").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::piped())
            // ORRERY_BENCH_SERVER_LOG=<file> keeps the server's log (for looking into a figure),
            // in <file>.<port>: each replica its own.
            .stderr(match std::env::var_os("ORRERY_BENCH_SERVER_LOG") {
                Some(f) => {
                    let mut f = f;
                    f.push(format!(".{port}"));
                    Stdio::from(std::fs::File::create(f)?)
                }
                None => Stdio::null(),
            })
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        crate::children::started(child.id());
        let stdout = child.stdout.take().context("server stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        loop {
            match lines.next() {
                Some(Ok(l)) if l.contains("ready") => break,
                Some(_) => {}
                None => anyhow::bail!("the server exited before it was ready"),
            }
        }
        std::thread::spawn(move || for _ in lines {});
        let stopping = Arc::new(AtomicBool::new(false));
        watchdog(child.id(), stopping.clone());
        Ok((child, stopping))
    }

    /// `kill -9`, for failover benchmarks; [`ServerProcess::relaunch`] starts it again.
    pub fn kill9(&mut self) {
        self.stopping.store(true, Ordering::Relaxed);
        let _ = self.child.kill();
        let _ = self.child.wait();
        crate::children::stopped(self.child.id());
    }

    /// Starts a killed server again on its data directory and port.
    pub fn relaunch(&mut self) -> anyhow::Result<()> {
        let (child, stopping) = Self::launch(&self.bin, self._dir.path(), self.port, &self.extra)?;
        self.child = child;
        self.stopping = stopping;
        Ok(())
    }

    /// (resident MiB, peak resident MiB, CPU seconds) of the server so far.
    pub fn usage_full(&self) -> (f64, f64, f64) {
        crate::stats::process_usage(self.child.id())
    }

    /// (resident MiB, CPU seconds) of the server so far.
    pub fn usage(&self) -> (f64, f64) {
        let (rss, _, cpu) = self.usage_full();
        (rss, cpu)
    }
}

/// Ends the bench with an error as soon as the server dies under it: a dead server would
/// otherwise leave some phases waiting on retrying watches instead of failing.
fn watchdog(pid: u32, stopping: Arc<AtomicBool>) {
    std::thread::spawn(move || {
        while !stopping.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(250));
            if !crate::stats::process_alive(pid) && !stopping.load(Ordering::Relaxed) {
                eprintln!(
                    "orrery-bench: the server (pid {pid}) died during the benchmark; set ORRERY_BENCH_SERVER_LOG=<file> to keep its log"
                );
                crate::children::exit(3);
            }
        }
    });
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::Relaxed);
        let _ = self.child.kill();
        let _ = self.child.wait();
        crate::children::stopped(self.child.id());
    }
}

pub fn request(
    method: &str,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
) -> http::Request<Vec<u8>> {
    http::Request::builder()
        .method(method)
        .uri(path)
        .header("Content-Type", content_type)
        .body(body)
        .unwrap_or_default()
}

fn configmap(name: &str, value: u64) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {"app": "bench"}},
        "data": {"value": value.to_string(), "payload": "x".repeat(512)}
    }))
    .unwrap_or_default()
}

pub struct CrudArgs {
    /// Run as a user RBAC decides for (bound to `edit` in the namespace), with this many
    /// other RoleBindings in the store; `None`: as the admin (`system:masters`, which RBAC
    /// does not consult).
    pub as_user_with_bindings: Option<usize>,
    pub clients: usize,
    pub per_client: usize,
    pub rate: u64,
    pub runs: usize,
    pub server_bin: Option<PathBuf>,
    pub dir: Option<PathBuf>,
}

/// One phase: `clients` clients each doing `per_client` requests of one verb.
async fn phase(
    clients: &[kube::Client],
    per_client: usize,
    rate: u64,
    verb: &'static str,
    run: usize,
) -> anyhow::Result<(f64, Vec<f64>)> {
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let total = clients.len() * per_client;
    let mut tasks = Vec::new();
    for (c, client) in clients.iter().enumerate() {
        let (client, next) = (client.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(per_client);
            for i in 0..per_client {
                if rate > 0 {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep_until(
                        (started + Duration::from_secs_f64(k as f64 / rate as f64)).into(),
                    )
                    .await;
                }
                let name = format!("r{run}-c{c}-{i}");
                let req = match verb {
                    "create" => request(
                        "POST",
                        "/api/v1/namespaces/default/configmaps",
                        "application/json",
                        configmap(&name, 0),
                    ),
                    "update" => request(
                        "PATCH",
                        &format!("/api/v1/namespaces/default/configmaps/{name}"),
                        "application/merge-patch+json",
                        format!(r#"{{"data":{{"value":"{i}"}}}}"#).into_bytes(),
                    ),
                    _ => request(
                        "GET",
                        &format!("/api/v1/namespaces/default/configmaps/{name}"),
                        "application/json",
                        Vec::new(),
                    ),
                };
                let t = Instant::now();
                client.request_text(req).await?;
                lat.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            Ok::<_, kube::Error>(lat)
        }));
    }
    let mut all = Vec::with_capacity(total);
    for t in tasks {
        all.extend(t.await??);
    }
    Ok((total as f64 / started.elapsed().as_secs_f64(), all))
}

pub async fn crud(args: CrudArgs) -> anyhow::Result<()> {
    // Per verb: throughputs, p50s and p99s of each run.
    type Samples = (Vec<f64>, Vec<f64>, Vec<f64>);
    let mut results: std::collections::BTreeMap<&str, Samples> = Default::default();
    let mut cpu_share = Vec::new();
    let mut rss = Vec::new();
    for run in 0..args.runs {
        progress(format!(
            "api crud: run {}/{} ({} clients, rate {})",
            run + 1,
            args.runs,
            args.clients,
            if args.rate == 0 {
                "unpaced".into()
            } else {
                args.rate.to_string()
            }
        ));
        let server = ServerProcess::start(&args.server_bin, &args.dir)?;
        let kubeconfig = match args.as_user_with_bindings {
            Some(n) => rbac_user(&server, n).await?,
            None => server.kubeconfig.clone(),
        };
        let mut clients = Vec::new();
        for _ in 0..args.clients {
            clients.push(orrery_client::from_kubeconfig(&kubeconfig).await?);
        }
        let (_, cpu_before) = server.usage();
        let wall = Instant::now();
        for verb in ["create", "update", "get"] {
            let (throughput, lat) = phase(&clients, args.per_client, args.rate, verb, run).await?;
            let e = results.entry(verb).or_default();
            e.0.push(throughput);
            e.1.push(percentile(&lat, 50.0));
            e.2.push(percentile(&lat, 99.0));
        }
        let (mem, cpu_after) = server.usage();
        cpu_share.push((cpu_after - cpu_before) / wall.elapsed().as_secs_f64());
        rss.push(mem);
    }
    for (verb, (tp, p50, p99)) in results {
        emit(json!({
            "scenario": "api.single_object",
            "verb": verb,
            "identity": if args.as_user_with_bindings.is_some() { "rbac-user" } else { "admin" },
            "rbac_bindings": args.as_user_with_bindings.unwrap_or(0),
            "clients": args.clients,
            "requests_per_run": args.clients * args.per_client,
            "target_rate_per_sec": args.rate,
            "throughput_per_sec": round(median(&tp), 0),
            "latency_p50_ms": round(median(&p50), 2),
            "latency_p99_ms": round(median(&p99), 2),
            "p99_samples_ms": p99.iter().map(|v| round(*v, 2)).collect::<Vec<_>>(),
            "server_cpu_cores": round(median(&cpu_share), 2),
            "server_rss_mib": round(median(&rss), 1),
            "runs": args.runs,
        }));
    }
    Ok(())
}

/// A user (client certificate from `orrery user create`) bound to `edit` in `default`, after
/// `bindings` RoleBindings of other users and groups spread over 100 namespaces; its
/// kubeconfig.
async fn rbac_user(server: &ServerProcess, bindings: usize) -> anyhow::Result<PathBuf> {
    progress(format!("api crud: writing {bindings} role bindings"));
    let admin = orrery_client::from_kubeconfig(&server.kubeconfig).await?;
    let namespaces = 100.min(bindings.max(1));
    for i in 0..namespaces {
        let body = serde_json::to_vec(
            &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": format!("team-{i}")}}),
        )?;
        admin
            .request_text(request(
                "POST",
                "/api/v1/namespaces",
                "application/json",
                body,
            ))
            .await?;
    }
    let binding = |ns: &str, name: &str, kind: &str, subject: &str, role: &str| {
        serde_json::to_vec(&json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": subject}],
        }))
        .unwrap_or_default()
    };
    let writers = 32;
    let mut tasks = Vec::new();
    for w in 0..writers {
        let admin = admin.clone();
        let bodies: Vec<(String, Vec<u8>)> = (w..bindings)
            .step_by(writers)
            .map(|i| {
                let ns = format!("team-{}", i % namespaces);
                let (kind, subject) = if i % 2 == 0 {
                    ("User", format!("user-{}", i % 5000))
                } else {
                    ("Group", format!("group-{}", i % 500))
                };
                let roles = ["view", "edit", "admin"];
                let body = binding(&ns, &format!("b-{i}"), kind, &subject, roles[i % 3]);
                (
                    format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings"),
                    body,
                )
            })
            .collect();
        tasks.push(tokio::spawn(async move {
            for (path, body) in bodies {
                admin
                    .request_text(request("POST", &path, "application/json", body))
                    .await?;
            }
            Ok::<_, kube::Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    admin
        .request_text(request(
            "POST",
            "/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings",
            "application/json",
            binding("default", "bench-edit", "User", "bench", "edit"),
        ))
        .await?;
    let out = server.kubeconfig.with_file_name("bench-user.kubeconfig");
    let status = Command::new(&server.bin)
        .args(["user", "create", "bench", "--ttl", "2h", "--kubeconfig"])
        .arg(&server.kubeconfig)
        .arg("-o")
        .arg(&out)
        .stderr(Stdio::null())
        .status()
        .context("running orrery user create")?;
    anyhow::ensure!(status.success(), "orrery user create failed");
    Ok(out)
}

fn deployment(name: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name, "tier": "web", "team": "bench"},
                     "annotations": {"description": "a deployment of the list benchmark, about as large as a typical one"}},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name, "tier": "web"}},
                "spec": {"containers": [{
                    "name": "web", "image": "registry.example.com/team/web:1.27.3",
                    "ports": [{"containerPort": 8080, "name": "http"}],
                    "env": [{"name": "MODE", "value": "production"}, {"name": "LOG_LEVEL", "value": "info"}],
                    "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}},
                    "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 10}
                }]}
            }
        }
    }))
    .unwrap_or_default()
}

pub struct ListArgs {
    pub objects: usize,
    pub runs: usize,
    pub server_bin: Option<PathBuf>,
    pub dir: Option<PathBuf>,
}

pub async fn list(args: ListArgs) -> anyhow::Result<()> {
    let server = ServerProcess::start(&args.server_bin, &args.dir)?;
    let client = orrery_client::from_kubeconfig(&server.kubeconfig).await?;
    progress(format!("api list: creating {} deployments", args.objects));
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let (client, next, total) = (client.clone(), next.clone(), args.objects);
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    return Ok::<_, kube::Error>(());
                }
                let req = request(
                    "POST",
                    "/apis/apps/v1/namespaces/default/deployments",
                    "application/json",
                    deployment(&format!("web-{i:05}")),
                );
                client.request_text(req).await?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    let mut full = Vec::new();
    let mut paged = Vec::new();
    let mut table = Vec::new();
    let mut bytes = 0;
    for run in 0..args.runs {
        progress(format!("api list: run {}/{}", run + 1, args.runs));
        let t = Instant::now();
        let body = client
            .request_text(request(
                "GET",
                "/apis/apps/v1/deployments",
                "application/json",
                Vec::new(),
            ))
            .await?;
        full.push(t.elapsed().as_secs_f64() * 1000.0);
        bytes = body.len();
        let v: serde_json::Value = serde_json::from_str(&body)?;
        anyhow::ensure!(
            v["items"].as_array().map(Vec::len) == Some(args.objects),
            "the list is complete"
        );

        let t = Instant::now();
        let mut token: Option<String> = None;
        let mut n = 0;
        loop {
            let path = match &token {
                Some(c) => format!("/apis/apps/v1/deployments?limit=500&continue={c}"),
                None => "/apis/apps/v1/deployments?limit=500".to_string(),
            };
            let v: serde_json::Value = serde_json::from_str(
                &client
                    .request_text(request("GET", &path, "application/json", Vec::new()))
                    .await?,
            )?;
            n += v["items"].as_array().map(Vec::len).unwrap_or(0);
            match v["metadata"]["continue"].as_str() {
                Some(c) if !c.is_empty() => token = Some(c.to_string()),
                _ => break,
            }
        }
        anyhow::ensure!(n == args.objects);
        paged.push(t.elapsed().as_secs_f64() * 1000.0);

        let t = Instant::now();
        let mut req = request(
            "GET",
            "/apis/apps/v1/deployments",
            "application/json",
            Vec::new(),
        );
        req.headers_mut().insert(
            "Accept",
            http::HeaderValue::from_static("application/json;as=Table;v=v1;g=meta.k8s.io"),
        );
        client.request_text(req).await?;
        table.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let (rss, _) = server.usage();
    emit(json!({
        "scenario": "api.list",
        "kind": "Deployment",
        "objects": args.objects,
        "response_mib": round(bytes as f64 / 1048576.0, 1),
        "full_list_ms": round(median(&full), 1),
        "full_list_samples_ms": full.iter().map(|v| round(*v, 1)).collect::<Vec<_>>(),
        "paginated_500_total_ms": round(median(&paged), 1),
        "table_list_ms": round(median(&table), 1),
        "server_rss_mib": round(rss, 1),
        "runs": args.runs,
        "goal_ms": 300,
    }));
    Ok(())
}

pub struct WatchArgs {
    pub watchers: usize,
    pub writes: usize,
    pub rate: u64,
    pub runs: usize,
    pub server_bin: Option<PathBuf>,
    pub dir: Option<PathBuf>,
}

pub async fn watch(args: WatchArgs) -> anyhow::Result<()> {
    let mut p50s = Vec::new();
    let mut p99s = Vec::new();
    let mut rss = Vec::new();
    for run in 0..args.runs {
        progress(format!(
            "api watch: run {}/{} ({} watchers, {} writes)",
            run + 1,
            args.runs,
            args.watchers,
            args.writes
        ));
        let server = ServerProcess::start(&args.server_bin, &args.dir)?;
        let client = orrery_client::from_kubeconfig(&server.kubeconfig).await?;
        let origin = Instant::now();
        let now_ns = move || origin.elapsed().as_nanos() as u64;
        let delivered: Arc<Vec<AtomicU64>> =
            Arc::new((0..args.writes).map(|_| AtomicU64::new(0)).collect());
        let counts = Arc::new(AtomicUsize::new(0));
        let ready = Arc::new(AtomicUsize::new(0));
        let mut watchers = Vec::new();
        for w in 0..args.watchers {
            // Each watch is a long request; HTTP/1.1 clients need a connection apiece.
            let client = if w % 50 == 0 {
                orrery_client::from_kubeconfig(&server.kubeconfig).await?
            } else {
                client.clone()
            };
            let (delivered, counts, ready, writes) = (
                delivered.clone(),
                counts.clone(),
                ready.clone(),
                args.writes,
            );
            watchers.push(tokio::spawn(async move {
                let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
                    kube::Api::namespaced(client, "default");
                let mut s = api
                    .watch(&kube::api::WatchParams::default().timeout(600), "0")
                    .await?
                    .boxed();
                ready.fetch_add(1, Ordering::Relaxed);
                let mut seen = 0;
                while seen < writes {
                    match s.next().await {
                        Some(Ok(kube::core::WatchEvent::Added(cm))) => {
                            let idx: usize = cm
                                .metadata
                                .name
                                .as_deref()
                                .and_then(|n| n.strip_prefix("w-"))
                                .and_then(|n| n.parse().ok())
                                .unwrap_or(0);
                            delivered[idx].fetch_max(now_ns(), Ordering::Relaxed);
                            seen += 1;
                            counts.fetch_add(1, Ordering::Relaxed);
                        }
                        Some(Ok(_)) => {}
                        Some(Err(e)) => return Err(e),
                        None => break,
                    }
                }
                Ok::<_, kube::Error>(())
            }));
        }
        while ready.load(Ordering::Relaxed) < args.watchers {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let submitted: Vec<u64> = {
            let mut out = vec![0; args.writes];
            let started = Instant::now();
            for (i, slot) in out.iter_mut().enumerate() {
                if args.rate > 0 {
                    tokio::time::sleep_until(
                        (started + Duration::from_secs_f64(i as f64 / args.rate as f64)).into(),
                    )
                    .await;
                }
                *slot = now_ns();
                client
                    .request_text(request(
                        "POST",
                        "/api/v1/namespaces/default/configmaps",
                        "application/json",
                        configmap(&format!("w-{i}"), 0),
                    ))
                    .await?;
            }
            out
        };
        for w in watchers {
            tokio::time::timeout(Duration::from_secs(300), w)
                .await
                .context("watchers did not finish")???;
        }
        let lat: Vec<f64> = (0..args.writes)
            .map(|i| {
                delivered[i]
                    .load(Ordering::Relaxed)
                    .saturating_sub(submitted[i]) as f64
                    / 1e6
            })
            .collect();
        p50s.push(percentile(&lat, 50.0));
        p99s.push(percentile(&lat, 99.0));
        rss.push(server.usage().0);
        anyhow::ensure!(
            counts.load(Ordering::Relaxed) == args.watchers * args.writes,
            "every watcher saw every write"
        );
    }
    emit(json!({
        "scenario": "api.watch",
        "watchers": args.watchers,
        "writes": args.writes,
        "target_rate_per_sec": args.rate,
        "delivery_p50_ms": round(median(&p50s), 2),
        "delivery_p99_ms": round(median(&p99s), 2),
        "p99_samples_ms": p99s.iter().map(|v| round(*v, 2)).collect::<Vec<_>>(),
        "server_rss_mib": round(median(&rss), 1),
        "runs": args.runs,
        "measures": "from a create's submission to its delivery to the last of all watchers, over HTTPS",
    }));
    Ok(())
}
