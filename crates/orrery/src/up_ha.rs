//! `orrery up --ha`: the highly available control plane on one machine, to try what an HA
//! installation does: a three-member etcd cluster (Debian's `etcd-server`) and three
//! `orrery server` replicas on it, processes of their own, sharing one identity through a
//! cluster secret kept in the data directory. Ports are chosen at the first start and kept,
//! so a second `orrery up --ha` on the same directory resumes the same cluster.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};

/// The local cluster's ports, chosen once.
#[derive(Serialize, Deserialize)]
struct Ports {
    /// (client, peer) per etcd member.
    etcd: Vec<(u16, u16)>,
}

/// A running HA control plane.
pub struct HaPlane {
    etcd: Vec<Child>,
    replicas: Vec<Child>,
    pub urls: Vec<String>,
    pub etcd_endpoints: Vec<String>,
    pub kubeconfig: PathBuf,
}

/// The etcd binary: `$ORRERY_ETCD`, else `etcd` on the PATH.
fn etcd_binary() -> String {
    std::env::var("ORRERY_ETCD").unwrap_or_else(|_| "etcd".to_string())
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn ports(dir: &Path) -> anyhow::Result<(Ports, bool)> {
    let path = dir.join("ports.json");
    if let Ok(text) = std::fs::read_to_string(&path) {
        let p: Ports =
            serde_json::from_str(&text).with_context(|| format!("reading {}", path.display()))?;
        return Ok((p, false));
    }
    let p = Ports {
        etcd: (0..3)
            .map(|_| Ok((free_port()?, free_port()?)))
            .collect::<anyhow::Result<_>>()?,
    };
    std::fs::write(&path, serde_json::to_string_pretty(&p)?)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok((p, true))
}

/// The installation's secret, made at the first start (readable by its owner only).
fn cluster_secret(data_dir: &Path) -> anyhow::Result<PathBuf> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = data_dir.join("cluster-secret");
    if !path.exists() {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("writing {}", path.display()))?;
        f.write_all(hex.as_bytes())?;
    }
    Ok(path)
}

async fn etcd_healthy(client: u16) -> bool {
    matches!(
        crate::sim::loopback(&format!("127.0.0.1:{client}"), http::Method::GET, "/health", None).await,
        Ok((status, v)) if status.is_success() && v["health"] == "true"
    )
}

/// Starts etcd and the replicas; returns once every replica serves.
pub async fn start(data_dir: &Path, listen: SocketAddr) -> anyhow::Result<HaPlane> {
    let etcd_dir = data_dir.join("etcd");
    std::fs::create_dir_all(&etcd_dir)
        .with_context(|| format!("creating {}", etcd_dir.display()))?;
    let (ports, fresh) = ports(&etcd_dir)?;
    let initial: Vec<String> = ports
        .etcd
        .iter()
        .enumerate()
        .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
        .collect();
    let mut etcd = Vec::new();
    for (i, (client, peer)) in ports.etcd.iter().enumerate() {
        let name = format!("m{i}");
        let client_url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let child = Command::new(etcd_binary())
            .args(["--name", &name, "--data-dir"])
            .arg(etcd_dir.join(&name))
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &initial.join(",")])
            .args(["--initial-cluster-token", "orrery-up"])
            .args(["--logger", "zap", "--log-outputs"])
            .arg(etcd_dir.join(format!("{name}.log")))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                anyhow::anyhow!(
                    "`orrery up --ha` runs a local etcd cluster and cannot start `{}`: {e}. Install etcd \
                     (Debian and Ubuntu: sudo apt-get install etcd-server), or name the binary in ORRERY_ETCD",
                    etcd_binary()
                )
            })?;
        etcd.push(child);
    }
    let endpoints: Vec<String> = ports
        .etcd
        .iter()
        .map(|(c, _)| format!("http://127.0.0.1:{c}"))
        .collect();
    println!(
        "  etcd: 3 members at {} ({})",
        endpoints.join(","),
        if fresh { "new" } else { "resumed" }
    );
    let started = Instant::now();
    for (i, (client, _)) in ports.etcd.iter().enumerate() {
        while !etcd_healthy(*client).await {
            if let Some(status) = etcd[i].try_wait()? {
                anyhow::bail!(
                    "etcd member m{i} exited with {status}; see {}",
                    etcd_dir.join(format!("m{i}.log")).display()
                );
            }
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(60),
                "the etcd cluster did not become healthy in 60 s; see the logs in {}",
                etcd_dir.display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    let secret = cluster_secret(data_dir)?;
    let exe = std::env::current_exe().context("finding the orrery binary")?;
    let mut replicas = Vec::new();
    let mut urls = Vec::new();
    let mut ready = Vec::new();
    for i in 0..3u16 {
        // Port 0 gives each replica a free port of its own.
        let port = if listen.port() == 0 {
            0
        } else {
            listen.port() + i
        };
        let addr = SocketAddr::new(listen.ip(), port);
        let dir = data_dir.join(format!("replica-{i}"));
        let mut child = Command::new(&exe)
            .arg("server")
            .arg("--data-dir")
            .arg(&dir)
            .args(["--listen", &addr.to_string()])
            .args(["--store", "etcd", "--etcd-endpoints", &endpoints.join(",")])
            .arg("--cluster-secret-file")
            .arg(&secret)
            // The simulated fleet's load cycles every 10 minutes (as `orrery up`'s).
            .args(["--forecast-season", "10m", "--forecast-horizon", "10m"])
            .args(["--prediction-horizon", "2m"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(
                data_dir.join(format!("replica-{i}.log")),
            )?)
            .kill_on_drop(true)
            .spawn()
            .context("starting a server replica")?;
        let out = child.stdout.take().context("the replica's output")?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(out).lines();
            let mut tx = Some(tx);
            while let Ok(Some(line)) = lines.next_line().await {
                // "orrery server ready at URL (kubeconfig: ...)": the URL it serves on.
                if let Some(url) = line
                    .strip_prefix("orrery server ready at ")
                    .and_then(|rest| rest.split_whitespace().next())
                    && let Some(tx) = tx.take()
                {
                    let _ = tx.send(url.to_string());
                }
            }
        });
        ready.push(rx);
        replicas.push(child);
    }
    for (i, rx) in ready.into_iter().enumerate() {
        match tokio::time::timeout(Duration::from_secs(60), rx).await {
            Ok(Ok(url)) => urls.push(url),
            _ => anyhow::bail!(
                "server replica {i} did not start; see {}",
                data_dir.join(format!("replica-{i}.log")).display()
            ),
        }
    }
    Ok(HaPlane {
        etcd,
        replicas,
        urls,
        etcd_endpoints: endpoints,
        kubeconfig: data_dir.join("replica-0").join("admin.kubeconfig"),
    })
}

impl HaPlane {
    /// Stops the replicas (SIGTERM: the leader gives its Lease up), then etcd.
    pub async fn stop(mut self) {
        for child in self.replicas.iter_mut().chain(self.etcd.iter_mut()) {
            if let Some(pid) = child.id() {
                let _ = std::process::Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .status();
            }
            if tokio::time::timeout(Duration::from_secs(15), child.wait())
                .await
                .is_err()
            {
                let _ = child.kill().await;
            }
        }
    }
}
