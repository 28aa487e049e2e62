//! What misbehaving clients cost everyone else (`api-slow-clients`): the real server, a
//! bystander user creating ConfigMaps and an agent writing its Cluster's status, one after
//! another, first alone (the baseline), then while one user holds slow bodies (announcing
//! 100,000 bytes, sending one every few seconds) and another source opens idle TLS
//! connections that send nothing. Reported: both callers' latency in each phase and its
//! ratio, their errors, the server's resident memory per idle connection, and how many idle
//! connections the server still held once the header timeout had passed.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;
use tokio::io::AsyncWriteExt;

use crate::api::{ServerProcess, request};
use crate::stats::{emit, median, percentile, progress, round};

pub struct Args {
    pub slow: usize,
    pub idle: usize,
    pub seconds: u64,
    pub runs: usize,
    pub server_bin: Option<PathBuf>,
    pub dir: Option<PathBuf>,
}

type Tls = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

fn connector(ca_pem: &str) -> anyhow::Result<tokio_rustls::TlsConnector> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.context("the server's CA")?)?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// A TLS connection from `source` (a loopback address of its own).
async fn dial(tls: &tokio_rustls::TlsConnector, source: &str, port: u16) -> anyhow::Result<Tls> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(format!("{source}:0").parse()?)?;
    let tcp = socket.connect(format!("127.0.0.1:{port}").parse()?).await?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1")?;
    Ok(tls.connect(name, tcp).await?)
}

/// A ServiceAccount with `edit` in `ns`, and a token for it.
async fn tenant(admin: &kube::Client, ns: &str) -> anyhow::Result<String> {
    let json = |v: serde_json::Value| serde_json::to_vec(&v).unwrap_or_default();
    admin
        .request_text(request(
            "POST",
            "/api/v1/namespaces",
            "application/json",
            json(json!({"metadata": {"name": ns}})),
        ))
        .await?;
    admin
        .request_text(request(
            "POST",
            &format!("/api/v1/namespaces/{ns}/serviceaccounts"),
            "application/json",
            json(json!({"metadata": {"name": "robot"}})),
        ))
        .await?;
    admin
        .request_text(request(
            "POST",
            &format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings"),
            "application/json",
            json(json!({"metadata": {"name": "robot-edit"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
                "subjects": [{"kind": "ServiceAccount", "name": "robot", "namespace": ns}]})),
        ))
        .await?;
    let answer = admin
        .request_text(request(
            "POST",
            &format!("/api/v1/namespaces/{ns}/serviceaccounts/robot/token"),
            "application/json",
            json(json!({"spec": {"expirationSeconds": 3600}})),
        ))
        .await?;
    let v: serde_json::Value = serde_json::from_str(&answer)?;
    v["status"]["token"]
        .as_str()
        .map(str::to_string)
        .context("no token in the TokenRequest's answer")
}

/// Latencies (ms) and errors of the two callers over `window`, one request after another.
async fn measure(
    user: &kube::Client,
    agent: &kube::Client,
    window: Duration,
    tag: &str,
) -> (Vec<f64>, Vec<f64>, usize, usize) {
    let until = Instant::now() + window;
    let user_loop = async {
        let (mut lat, mut errors, mut i) = (Vec::new(), 0usize, 0usize);
        while Instant::now() < until {
            let body = serde_json::to_vec(
                &json!({"metadata": {"name": format!("{tag}-{i}")}, "data": {"a": "b"}}),
            )
            .unwrap_or_default();
            let t = Instant::now();
            match user
                .request_text(request(
                    "POST",
                    "/api/v1/namespaces/bystander/configmaps",
                    "application/json",
                    body,
                ))
                .await
            {
                Ok(_) => lat.push(t.elapsed().as_secs_f64() * 1000.0),
                Err(_) => errors += 1,
            }
            i += 1;
        }
        (lat, errors)
    };
    let agent_loop = async {
        let (mut lat, mut errors, mut i) = (Vec::new(), 0usize, 0u64);
        while Instant::now() < until {
            let body =
                serde_json::to_vec(&json!({"status": {"properties": {"beat": i.to_string()}}}))
                    .unwrap_or_default();
            let t = Instant::now();
            match agent
                .request_text(request(
                    "PATCH",
                    "/apis/multicluster.io/v1alpha1/clusters/bench-member/status",
                    "application/merge-patch+json",
                    body,
                ))
                .await
            {
                Ok(_) => lat.push(t.elapsed().as_secs_f64() * 1000.0),
                Err(_) => errors += 1,
            }
            i += 1;
        }
        (lat, errors)
    };
    let ((u, ue), (a, ae)) = tokio::join!(user_loop, agent_loop);
    (u, a, ue, ae)
}

/// One run: baseline (user p50, p99, agent p50, p99), the same under attack, (errors
/// baseline, errors under attack, user requests, agent requests), (idle opened, seconds to
/// open them, server bytes per idle connection, idle still open past the header timeout).
type Row = (
    (f64, f64, f64, f64),
    (f64, f64, f64, f64),
    (usize, usize, usize, usize),
    (usize, f64, f64, usize),
);

pub async fn slow_clients(args: Args) -> anyhow::Result<()> {
    let mut rows: Vec<Row> = Vec::new();
    for run in 0..args.runs {
        progress(format!("api-slow-clients: run {}/{}", run + 1, args.runs));
        // The server's defaults, the limit per source included (the bench's servers drop it).
        let server = ServerProcess::start_with(
            &args.server_bin,
            &args.dir,
            &[
                "--max-connections-per-source",
                &orrery_apiserver::server::DEFAULT_MAX_CONNECTIONS_PER_SOURCE.to_string(),
            ],
        )?;
        let admin = orrery_client::from_kubeconfig(&server.kubeconfig).await?;
        let ca = std::fs::read_to_string(server.kubeconfig.with_file_name("tls").join("ca.crt"))?;
        let attacker = tenant(&admin, "attacker").await?;
        let bystander = tenant(&admin, "bystander").await?;
        let registered = admin
            .request_text(request(
                "POST",
                "/agent/v1/register",
                "application/json",
                serde_json::to_vec(&json!({"cluster": "bench-member"})).unwrap_or_default(),
            ))
            .await?;
        let agent_token = serde_json::from_str::<serde_json::Value>(&registered)?["token"]
            .as_str()
            .context("no agent token")?
            .to_string();
        let user = orrery_client::connect(&server.url, &bystander, &ca).await?;
        let agent = orrery_client::connect(&server.url, &agent_token, &ca).await?;
        let port: u16 = server
            .url
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .context("the server's port")?;
        let window = Duration::from_secs(args.seconds);

        let (bu, ba, bue, bae) = measure(&user, &agent, window, "baseline").await;
        let (rss_before, _) = server.usage();

        // The attack: slow bodies from one source, idle connections from another.
        let tls = connector(&ca)?;
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = slow_bodies(&tls, port, &attacker, args.slow, &stop);
        let opened = Arc::new(AtomicUsize::new(0));
        let idle_conns = Arc::new(tokio::sync::Mutex::new(Vec::new()));
        let open_started = Instant::now();
        let opener = open_idle(&tls, port, args.idle, &opened, &idle_conns);
        let (au, aa, aue, aae) = measure(&user, &agent, window, "attack").await;
        let _ = opener.await;
        let open_secs = open_started.elapsed().as_secs_f64();
        let (rss_peak, _) = server.usage();
        let idle_opened = opened.load(Ordering::Relaxed);
        // Past the header timeout, how many idle connections does the server still hold?
        let header = orrery_apiserver::server::DEFAULT_HEADER_TIMEOUT;
        tokio::time::sleep(header + Duration::from_secs(3)).await;
        let still_open = count_open(&idle_conns).await;
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            t.abort();
        }
        let per_idle = if idle_opened > 0 {
            (rss_peak - rss_before).max(0.0) * 1024.0 * 1024.0 / idle_opened as f64
        } else {
            0.0
        };
        rows.push((
            (
                median(&bu),
                percentile(&bu, 99.0),
                median(&ba),
                percentile(&ba, 99.0),
            ),
            (
                median(&au),
                percentile(&au, 99.0),
                median(&aa),
                percentile(&aa, 99.0),
            ),
            (bue + bae, aue + aae, au.len(), aa.len()),
            (idle_opened, open_secs, per_idle, still_open),
        ));
    }
    let col = |f: &dyn Fn(&Row) -> f64| -> f64 { median(&rows.iter().map(f).collect::<Vec<_>>()) };
    let b_user = col(&|r: &Row| r.0.0);
    let a_user = col(&|r: &Row| r.1.0);
    let b_agent = col(&|r: &Row| r.0.2);
    let a_agent = col(&|r: &Row| r.1.2);
    emit(json!({
        "scenario": "api-slow-clients",
        "runs": args.runs,
        "slow_bodies": args.slow,
        "idle_connections": args.idle,
        "window_s": args.seconds,
        "baseline": {
            "user_create_p50_ms": round(b_user, 2),
            "user_create_p99_ms": round(col(&|r: &Row| r.0.1), 2),
            "agent_status_p50_ms": round(b_agent, 2),
            "agent_status_p99_ms": round(col(&|r: &Row| r.0.3), 2),
        },
        "under_attack": {
            "user_create_p50_ms": round(a_user, 2),
            "user_create_p99_ms": round(col(&|r: &Row| r.1.1), 2),
            "agent_status_p50_ms": round(a_agent, 2),
            "agent_status_p99_ms": round(col(&|r: &Row| r.1.3), 2),
            "user_requests": col(&|r: &Row| r.2.2 as f64),
            "agent_requests": col(&|r: &Row| r.2.3 as f64),
        },
        "user_p50_ratio": round(a_user / b_user, 2),
        "agent_p50_ratio": round(a_agent / b_agent, 2),
        "errors_baseline": rows.iter().map(|r| r.2.0).sum::<usize>(),
        "errors_under_attack": rows.iter().map(|r| r.2.1).sum::<usize>(),
        "idle_opened": col(&|r: &Row| r.3.0 as f64),
        "idle_open_seconds": round(col(&|r: &Row| r.3.1), 1),
        "server_bytes_per_idle_connection": round(col(&|r: &Row| r.3.2), 0),
        "idle_still_open_after_header_timeout": col(&|r: &Row| r.3.3 as f64),
    }));
    Ok(())
}

/// `slow` connections from 127.0.0.2 that each send a create's headers and then its body a
/// byte every 3 seconds, until `stop`.
fn slow_bodies(
    tls: &tokio_rustls::TlsConnector,
    port: u16,
    attacker: &str,
    slow: usize,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    for i in 0..slow {
        let (tls, stop, token) = (tls.clone(), stop.clone(), attacker.to_string());
        tasks.push(tokio::spawn(async move {
            let Ok(mut c) = dial(&tls, "127.0.0.2", port).await else {
                return;
            };
            let head = format!(
                "POST /api/v1/namespaces/attacker/configmaps HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{{\"n\": {i}"
            );
            if c.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_secs(3)).await;
                if c.write_all(b" ").await.is_err() || c.flush().await.is_err() {
                    return;
                }
            }
        }));
    }
    tasks
}

/// Opens `n` idle connections from 127.0.0.3 over 32 workers, counting them in `opened` and
/// keeping them in `idle_conns`.
fn open_idle(
    tls: &tokio_rustls::TlsConnector,
    port: u16,
    n: usize,
    opened: &Arc<AtomicUsize>,
    idle_conns: &Arc<tokio::sync::Mutex<Vec<Tls>>>,
) -> tokio::task::JoinHandle<()> {
    let (tls, opened, idle_conns) = (tls.clone(), opened.clone(), idle_conns.clone());
    tokio::spawn(async move {
        let next = Arc::new(AtomicUsize::new(0));
        let workers: Vec<_> = (0..32)
            .map(|_| {
                let (tls, opened, idle_conns, next) = (
                    tls.clone(),
                    opened.clone(),
                    idle_conns.clone(),
                    next.clone(),
                );
                tokio::spawn(async move {
                    while next.fetch_add(1, Ordering::Relaxed) < n {
                        if let Ok(c) = dial(&tls, "127.0.0.3", port).await {
                            opened.fetch_add(1, Ordering::Relaxed);
                            idle_conns.lock().await.push(c);
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            let _ = w.await;
        }
    })
}

/// How many of the idle connections the server still holds open.
async fn count_open(idle_conns: &tokio::sync::Mutex<Vec<Tls>>) -> usize {
    let mut still_open = 0usize;
    for c in idle_conns.lock().await.iter_mut() {
        use tokio::io::AsyncReadExt;
        let mut b = [0u8; 1];
        match tokio::time::timeout(Duration::from_millis(5), c.read(&mut b)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {}
            _ => still_open += 1,
        }
    }
    still_open
}
