//! A real etcd server (Debian's `etcd-server`) on loopback ports in a temporary directory.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running etcd; killed when dropped, and also when the test process exits (it watches our
/// end of a pipe), so no test leaves one behind.
#[derive(Debug)]
pub struct EtcdServer {
    child: Child,
    /// etcd's own pid (the child is the `sh` that runs it).
    pid: u32,
    pub endpoint: String,
    _dir: tempfile::TempDir,
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl EtcdServer {
    /// Where the member keeps its data (its write-ahead log and database).
    pub fn data_dir(&self) -> std::path::PathBuf {
        self._dir.path().join("data")
    }

    /// etcd's process id (for pausing it with SIGSTOP).
    pub fn pid(&self) -> u32 {
        self.pid
    }
}

/// The etcd binary: `$ORRERY_ETCD`, else `etcd` on the PATH.
pub fn etcd_binary() -> String {
    std::env::var("ORRERY_ETCD").unwrap_or_else(|_| "etcd".to_string())
}

/// The etcdctl binary: `$ORRERY_ETCDCTL`, else `etcdctl` on the PATH.
pub fn etcdctl_binary() -> String {
    std::env::var("ORRERY_ETCDCTL").unwrap_or_else(|_| "etcdctl".to_string())
}

impl EtcdServer {
    /// Starts etcd and waits until it answers; retries on a port clash.
    pub fn start() -> anyhow::Result<Self> {
        Self::start_from(None)
    }

    /// Starts etcd on a data directory made from `snapshot` (`etcdctl snapshot restore`, as an
    /// operator restores a backup), or empty.
    pub fn start_from(snapshot: Option<&std::path::Path>) -> anyhow::Result<Self> {
        let mut last_err = None;
        for _ in 0..5 {
            match Self::try_start(snapshot) {
                Ok(s) => return Ok(s),
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| anyhow::anyhow!("etcd did not start")))
    }

    fn try_start(snapshot: Option<&std::path::Path>) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let (client, peer) = (free_port()?, free_port()?);
        let endpoint = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        if let Some(snapshot) = snapshot {
            let out = Command::new(etcdctl_binary())
                .env("ETCDCTL_API", "3")
                .arg("snapshot")
                .arg("restore")
                .arg(snapshot)
                .arg("--data-dir")
                .arg(dir.path().join("data"))
                .args(["--name", "test"])
                .arg(format!("--initial-cluster=test={peer_url}"))
                .arg(format!("--initial-advertise-peer-urls={peer_url}"))
                .output()
                .map_err(|e| {
                    anyhow::anyhow!(
                        "cannot run etcdctl ({}): {e}; install Debian's etcd-client",
                        etcdctl_binary()
                    )
                })?;
            if !out.status.success() {
                anyhow::bail!(
                    "etcdctl snapshot restore failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
        let args = [
            "--name".to_string(),
            "test".into(),
            "--data-dir".into(),
            dir.path().join("data").display().to_string(),
            "--listen-client-urls".into(),
            endpoint.clone(),
            "--advertise-client-urls".into(),
            endpoint.clone(),
            "--listen-peer-urls".into(),
            peer_url.clone(),
            "--initial-advertise-peer-urls".into(),
            peer_url.clone(),
            "--initial-cluster".into(),
            format!("test={peer_url}"),
            "--logger".into(),
            "zap".into(),
            "--log-outputs".into(),
            dir.path().join("etcd.log").display().to_string(),
        ];
        let (mut child, pid) = spawn(&args)?;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = child.try_wait()? {
                anyhow::bail!("etcd exited with {status}: {}", stderr_of(&mut child));
            }
            if health(client) {
                return Ok(EtcdServer {
                    child,
                    pid,
                    endpoint,
                    _dir: dir,
                });
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                anyhow::bail!("etcd did not become healthy on {endpoint} within 20 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Runs etcd under `sh`, which kills it as soon as our end of its stdin closes (we exit or
/// drop): the wrapper and etcd's own pid (for `kill -9` and SIGSTOP), which it prints first.
fn spawn(args: &[String]) -> anyhow::Result<(Child, u32)> {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg("\"$@\" </dev/null & pid=$!; echo $pid; read _; kill $pid 2>/dev/null; wait $pid")
        .arg("sh")
        .arg(etcd_binary())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot run etcd ({}): {e}; install Debian's etcd-server",
                etcd_binary()
            )
        })?;
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        BufReader::new(out).read_line(&mut line)?;
    }
    let pid: u32 = line
        .trim()
        .parse()
        .map_err(|_| anyhow::anyhow!("etcd's wrapper printed no pid: {line:?}"))?;
    Ok((child, pid))
}

fn stderr_of(child: &mut Child) -> String {
    let mut msg = String::new();
    if let Some(err) = child.stderr.take() {
        for line in BufReader::new(err).lines().map_while(Result::ok).take(20) {
            msg.push_str(&line);
            msg.push('\n');
        }
    }
    msg
}

/// One member of an [`EtcdCluster`].
#[derive(Debug)]
struct Member {
    name: String,
    client: u16,
    peer: u16,
    /// The wrapper and etcd's pid, while it runs.
    running: Option<(Child, u32)>,
}

/// A cluster of etcd members on loopback ports, for fault tests: members can be killed with
/// `SIGKILL` and started again on their data. Killed with the test process, as [`EtcdServer`].
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<Member>,
    dir: tempfile::TempDir,
}

impl EtcdCluster {
    /// Starts `n` members and waits until every one answers healthy.
    pub fn start(n: usize) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let mut members = Vec::new();
        for i in 0..n {
            members.push(Member {
                name: format!("m{i}"),
                client: free_port()?,
                peer: free_port()?,
                running: None,
            });
        }
        let mut cluster = EtcdCluster { members, dir };
        for i in 0..n {
            cluster.launch(i)?;
        }
        for i in 0..n {
            cluster.wait_healthy(i, Duration::from_secs(30))?;
        }
        Ok(cluster)
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn launch(&mut self, i: usize) -> anyhow::Result<()> {
        let initial = self.initial_cluster();
        let m = &self.members[i];
        let endpoint = format!("http://127.0.0.1:{}", m.client);
        let peer = format!("http://127.0.0.1:{}", m.peer);
        let data = self.dir.path().join(&m.name);
        let args: Vec<String> = vec![
            "--name".into(),
            m.name.clone(),
            "--data-dir".into(),
            data.display().to_string(),
            "--listen-client-urls".into(),
            endpoint.clone(),
            "--advertise-client-urls".into(),
            endpoint,
            "--listen-peer-urls".into(),
            peer.clone(),
            "--initial-advertise-peer-urls".into(),
            peer,
            "--initial-cluster".into(),
            initial,
            "--initial-cluster-token".into(),
            "orrery-test".into(),
            "--logger".into(),
            "zap".into(),
            "--log-outputs".into(),
            self.dir
                .path()
                .join(format!("{}.log", m.name))
                .display()
                .to_string(),
        ];
        self.members[i].running = Some(spawn(&args)?);
        Ok(())
    }

    fn wait_healthy(&mut self, i: usize, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let m = &mut self.members[i];
            if let Some((child, _)) = m.running.as_mut()
                && let Some(status) = child.try_wait()?
            {
                anyhow::bail!("etcd {} exited with {status}: {}", m.name, stderr_of(child));
            }
            if health(m.client) {
                return Ok(());
            }
            if Instant::now() > deadline {
                anyhow::bail!("etcd {} did not become healthy", m.name);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Every member's client URL.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("http://127.0.0.1:{}", m.client))
            .collect()
    }

    /// The process ids of the members running.
    pub fn pids(&self) -> Vec<u32> {
        self.members
            .iter()
            .filter_map(|m| m.running.as_ref().map(|(_, pid)| *pid))
            .collect()
    }

    /// `kill -9` of member `i`.
    pub fn kill9(&mut self, i: usize) {
        if let Some((mut child, pid)) = self.members[i].running.take() {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            drop(child.stdin.take());
            let _ = child.wait();
        }
    }

    /// Starts member `i` again on its data; waits until it is healthy when `wait` (a member
    /// alone without quorum never is).
    pub fn restart(&mut self, i: usize, wait: bool) -> anyhow::Result<()> {
        anyhow::ensure!(self.members[i].running.is_none(), "member {i} is running");
        self.launch(i)?;
        if wait {
            self.wait_healthy(i, Duration::from_secs(30))?;
        }
        Ok(())
    }

    /// Whether member `i` answers healthy (it has a leader and quorum).
    pub fn healthy(&self, i: usize) -> bool {
        health(self.members[i].client)
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for m in &mut self.members {
            if let Some((mut child, _)) = m.running.take() {
                drop(child.stdin.take());
                let _ = child.wait();
            }
        }
    }
}

/// etcd's `/health` over plain HTTP.
fn health(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body.contains("\"health\":\"true\"")
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        // Closing stdin makes the wrapper kill etcd and wait for it.
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}
