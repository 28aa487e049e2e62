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
    pub endpoint: String,
    _dir: tempfile::TempDir,
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The etcd binary: `$ORRERY_ETCD`, else `etcd` on the PATH.
pub fn etcd_binary() -> String {
    std::env::var("ORRERY_ETCD").unwrap_or_else(|_| "etcd".to_string())
}

impl EtcdServer {
    /// Starts etcd and waits until it answers; retries on a port clash.
    pub fn start() -> anyhow::Result<Self> {
        let mut last_err = None;
        for _ in 0..5 {
            match Self::try_start() {
                Ok(s) => return Ok(s),
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| anyhow::anyhow!("etcd did not start")))
    }

    fn try_start() -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let (client, peer) = (free_port()?, free_port()?);
        let endpoint = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
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
        // `sh` runs etcd and kills it as soon as our end of its stdin closes (we exit or drop).
        let mut child = Command::new("sh")
            .arg("-c")
            .arg("\"$@\" </dev/null & pid=$!; read _; kill $pid 2>/dev/null; wait $pid")
            .arg("sh")
            .arg(etcd_binary())
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                anyhow::anyhow!(
                    "cannot run etcd ({}): {e}; install Debian's etcd-server",
                    etcd_binary()
                )
            })?;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = child.try_wait()? {
                let mut msg = String::new();
                if let Some(err) = child.stderr.take() {
                    for line in BufReader::new(err).lines().map_while(Result::ok).take(20) {
                        msg.push_str(&line);
                        msg.push('\n');
                    }
                }
                anyhow::bail!("etcd exited with {status}: {msg}");
            }
            if health(client) {
                return Ok(EtcdServer {
                    child,
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
