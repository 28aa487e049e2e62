//! Shared harness for end-to-end tests: real `orrery` processes on loopback ports, the real
//! `kubectl`, and clients built with the `kube` crate.
#![allow(dead_code, clippy::unwrap_used)]

pub mod fleet;
pub mod netns;
pub mod proxy;

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A free loopback port (released before use; a clash is retried by the caller).
/// Sends `sig` (`TERM`, `INT`, `STOP`, `CONT`...) to process `pid` with the real `kill`;
/// whether it was delivered.
pub fn signal(pid: u32, sig: &str) -> bool {
    Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success())
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running `orrery server` in its own data directory.
pub struct Server {
    child: Option<Child>,
    pub dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    pub port: u16,
    pub url: String,
    pub kubeconfig: PathBuf,
    cache: tempfile::TempDir,
    extra: Vec<String>,
    /// Its environment beyond the test's.
    env: Vec<(String, String)>,
    /// The loopback address it listens on.
    host: String,
    /// What it printed before it was ready.
    pub said: Vec<String>,
}

impl Server {
    /// Starts a server in a fresh temporary directory.
    pub fn start() -> Server {
        Self::start_with(&[])
    }

    pub fn start_with(extra: &[&str]) -> Server {
        Self::start_on("127.0.0.1", extra)
    }

    /// Listening on another loopback address (one a network namespace reaches).
    pub fn start_on(host: &str, extra: &[&str]) -> Server {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let mut s = Server::launch(
            dir,
            host,
            // A free port the server binds itself (one chosen here could be taken first).
            0,
            extra.iter().map(|s| s.to_string()).collect(),
            Vec::new(),
        );
        s._tmp = Some(tmp);
        s
    }

    /// With `env` in its environment (a Pod's, say).
    pub fn start_env(extra: &[&str], env: &[(&str, &str)]) -> Server {
        let tmp = tempfile::tempdir().unwrap();
        let mut s = Server::launch(
            tmp.path().to_path_buf(),
            "127.0.0.1",
            0,
            extra.iter().map(|s| s.to_string()).collect(),
            env.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        s._tmp = Some(tmp);
        s
    }

    /// In `dir`, which must exist; the caller keeps it.
    pub fn start_in(dir: PathBuf, extra: &[&str]) -> Server {
        Server::launch(
            dir,
            "127.0.0.1",
            0,
            extra.iter().map(|s| s.to_string()).collect(),
            Vec::new(),
        )
    }

    fn launch(
        dir: PathBuf,
        host: &str,
        port: u16,
        extra: Vec<String>,
        env: Vec<(String, String)>,
    ) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_orrery"))
            .args(["server", "--data-dir"])
            .arg(&dir)
            .args(["--listen", &format!("{host}:{port}")])
            .args(&extra)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env("ORRERY_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start orrery server");
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        // Keep the server's log for failing tests; drain it so the server never blocks.
        drain_to_file(stderr, dir.join("server.log"));
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        // "orrery server ready at https://HOST:PORT (kubeconfig: ...)"
        let mut said = Vec::new();
        let port = loop {
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(line) if line.starts_with("orrery server ready at ") => {
                    break line
                        .split_whitespace()
                        .nth(4)
                        .and_then(|url| url.rsplit(':').next())
                        .and_then(|p| p.parse::<u16>().ok())
                        .unwrap_or_else(|| panic!("no port in {line:?}"));
                }
                Ok(line) => said.push(line),
                Err(_) => {
                    if let Some(status) = child.try_wait().unwrap() {
                        let log =
                            std::fs::read_to_string(dir.join("server.log")).unwrap_or_default();
                        panic!("orrery server exited with {status} before it was ready:\n{log}");
                    }
                    assert!(
                        Instant::now() < deadline,
                        "orrery server did not become ready"
                    );
                }
            }
        };
        Server {
            child: Some(child),
            kubeconfig: dir.join("admin.kubeconfig"),
            url: format!("https://{host}:{port}"),
            dir,
            _tmp: None,
            port,
            cache: tempfile::tempdir().unwrap(),
            extra,
            env,
            host: host.to_string(),
            said,
        }
    }

    /// Runs kubectl against this server with its own discovery cache.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        Command::new("kubectl")
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("KUBECACHEDIR", self.cache.path())
            .env("HOME", self.cache.path())
            .output()
            .expect("run kubectl (a kubectl of 1.26 or newer must be on the PATH)")
    }

    /// kubectl, which must succeed; its standard output.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {} failed:\n{}\n{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// kubectl, which must fail; its standard error.
    pub fn fails(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            !out.status.success(),
            "kubectl {} should have failed:\n{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    /// kubectl with a manifest on standard input.
    pub fn apply(&self, manifest: &str) -> String {
        self.stdin(&["apply", "-f", "-"], manifest)
    }

    /// kubectl with a manifest on standard input, which must fail; its standard error.
    pub fn fails_stdin(&self, args: &[&str], input: &str) -> String {
        let out = self.run_stdin(args, input);
        assert!(
            !out.status.success(),
            "kubectl {} should have failed",
            args.join(" ")
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    pub fn run_stdin(&self, args: &[&str], input: &str) -> Output {
        use std::io::Write;
        let mut child = Command::new("kubectl")
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("KUBECACHEDIR", self.cache.path())
            .env("HOME", self.cache.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    }

    pub fn stdin(&self, args: &[&str], input: &str) -> String {
        let out = self.run_stdin(args, input);
        assert!(
            out.status.success(),
            "kubectl {} failed:\n{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// SIGKILL: no chance to flush anything.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait; returns whether the server exited successfully.
    pub fn terminate(&mut self) -> bool {
        let Some(mut c) = self.child.take() else {
            return true;
        };
        signal(c.id(), "TERM");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = c.try_wait().unwrap() {
                return status.success();
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts the server again on the same directory and port (after `kill9` or `terminate`).
    /// Starts it again with `extra` flags from now on (instead of those it started with).
    pub fn restart_with(&mut self, extra: &[&str]) {
        self.extra = extra.iter().map(|s| s.to_string()).collect();
        self.restart();
    }

    /// Starts the server again on the same port but on another data directory (a restored
    /// one), which the caller keeps.
    pub fn restart_in(&mut self, dir: PathBuf) {
        self.dir = dir;
        self.restart();
    }

    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "stop the server first");
        let tmp = self._tmp.take();
        let mut again = Server::launch(
            self.dir.clone(),
            &self.host,
            self.port,
            self.extra.clone(),
            self.env.clone(),
        );
        again._tmp = tmp;
        again.cache = std::mem::replace(&mut self.cache, tempfile::tempdir().unwrap());
        *self = again;
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    /// A kube client with the admin kubeconfig.
    pub async fn client(&self) -> kube::Client {
        orrery_client::from_kubeconfig(&self.kubeconfig)
            .await
            .unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Polls `f` until it returns true, or panics after `timeout`.
pub fn eventually(timeout: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Appends a child's output to a log file, line by line, so the child never blocks on it.
fn drain_to_file(from: impl std::io::Read + Send + 'static, log: PathBuf) {
    std::thread::spawn(move || {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        for line in BufReader::new(from).lines().map_while(Result::ok) {
            use std::io::Write;
            let _ = writeln!(f, "{line}");
        }
    });
}

/// Writes `contents` to a file in `dir`.
pub fn write(dir: &Path, name: &str, contents: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, contents).unwrap();
    p
}

impl Server {
    /// `orrery ARGS --kubeconfig <the admin's>` (a client command against this server).
    pub fn orrery(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_orrery"))
            .args(args)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .output()
            .unwrap()
    }

    /// [`Server::orrery`], which must succeed; its standard output.
    pub fn orrery_ok(&self, args: &[&str]) -> String {
        let out = self.orrery(args);
        assert!(
            out.status.success(),
            "orrery {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A bootstrap token from `orrery token create`.
    pub fn token(&self, cluster: &str) -> String {
        self.orrery_ok(&["token", "create", "--cluster", cluster])
            .trim()
            .to_string()
    }

    /// The JSON of `kubectl get <what> -o json`.
    pub fn get_json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = vec!["get"];
        a.extend_from_slice(args);
        a.extend_from_slice(&["-o", "json"]);
        serde_json::from_str(&self.ok(&a)).unwrap()
    }

    /// Where a ResourceBinding in `default` places its template: (cluster, replicas).
    pub fn clusters_of(&self, binding: &str) -> Vec<(String, i64)> {
        let b = self.get_json(&["resourcebinding", binding, "-n", "default"]);
        b["spec"]["clusters"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                (
                    c["name"].as_str().unwrap().to_string(),
                    c["replicas"].as_i64().unwrap_or(0),
                )
            })
            .collect()
    }

    /// The status of a condition of a cluster ("" if absent or no such cluster).
    pub fn cluster_condition(&self, cluster: &str, type_: &str) -> String {
        let out = self.kubectl(&[
            "get",
            "cluster",
            cluster,
            "-o",
            &format!("jsonpath={{.status.conditions[?(@.type==\"{type_}\")].status}}"),
        ]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

/// A running `orrery agent` process.
pub struct Agent {
    child: Option<Child>,
    pub dir: PathBuf,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    args: Vec<String>,
    server_url: String,
    env: Vec<(String, String)>,
    /// A command the agent runs under (`ip netns exec <ns>`), if any.
    wrapper: Vec<String>,
}

impl Agent {
    /// Starts `orrery agent --server <url> <args>` with its state in `<server dir>/agents/<name>`.
    pub fn start(server: &Server, name: &str, args: &[&str]) -> Agent {
        Self::start_env(server, name, args, &[])
    }

    pub fn start_env(server: &Server, name: &str, args: &[&str], env: &[(&str, &str)]) -> Agent {
        Self::start_at(server, &server.url, name, args, env)
    }

    /// An agent given `urls` (comma-separated: several replicas) for its `--server`, with its
    /// state under `server`'s directory.
    pub fn start_at(
        server: &Server,
        urls: &str,
        name: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Agent {
        Self::start_wrapped(server, urls, name, args, env, Vec::new())
    }

    /// Like [`Agent::start_at`], run under `wrapper` (a network namespace's `ip netns exec`).
    pub fn start_wrapped(
        server: &Server,
        urls: &str,
        name: &str,
        args: &[&str],
        env: &[(&str, &str)],
        wrapper: Vec<String>,
    ) -> Agent {
        let dir = server.dir.join("agents").join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let mut a = Agent {
            child: None,
            dir,
            lines: Default::default(),
            args: args.iter().map(|s| s.to_string()).collect(),
            server_url: urls.to_string(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            wrapper,
        };
        a.launch();
        a
    }

    fn launch(&mut self) {
        let bin = env!("CARGO_BIN_EXE_orrery");
        let mut cmd = match self.wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        cmd.args(["agent", "--server", &self.server_url, "--state-dir"])
            .arg(self.dir.join("state"))
            .args(&self.args)
            .env("ORRERY_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        // A restarted agent prints afresh (its admin endpoint may be on another port).
        self.lines.lock().unwrap().clear();
        let mut child = cmd.spawn().expect("start orrery agent");
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        drain_to_file(stderr, self.dir.join("agent.log"));
        let lines = self.lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(line);
            }
        });
        self.child = Some(child);
    }

    /// What the agent printed on standard output so far.
    pub fn output(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// The address of its admin endpoint (started with `--admin-listen 127.0.0.1:0`).
    pub fn admin(&self) -> String {
        let mut found = None;
        eventually(
            Duration::from_secs(20),
            "the agent's admin endpoint",
            || {
                found = self.output().iter().find_map(|l| {
                    l.strip_prefix("admin endpoint at http://")
                        .map(str::to_string)
                });
                found.is_some()
            },
        );
        found.unwrap()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("agent.log")).unwrap_or_default()
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Freezes (`STOP`) or thaws (`CONT`) the agent process, as a long pause or a partition would.
    pub fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("the agent is running").id();
        assert!(signal(pid, sig), "kill -{sig} {pid}");
    }

    /// Starts the same agent again (same state directory and arguments).
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "stop the agent first");
        self.launch();
    }

    /// Waits for the agent to exit on its own.
    pub fn wait_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + timeout;
        let c = self.child.as_mut().expect("the agent is running");
        loop {
            if let Some(s) = c.try_wait().unwrap() {
                self.child = None;
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "the agent did not exit:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Agent {
    /// A simulated member `name` (2 nodes of 8 cores), registered with a fresh bootstrap
    /// token and heartbeating every second, once its cluster is Ready.
    pub fn sim_member(server: &Server, name: &str) -> Agent {
        let token = server.token(name);
        let a = Agent::start(
            server,
            name,
            &[
                "--cluster",
                name,
                "--token",
                &token,
                "--simulate",
                "nodes=2,cpu=8,memory=32Gi,load=0.1",
                "--heartbeat-interval",
                "1s",
            ],
        );
        eventually(Duration::from_secs(30), &format!("{name} Ready"), || {
            server.cluster_condition(name, "Ready") == "True"
        });
        a
    }

    /// The cluster token the agent got when it registered (kept in its state directory).
    pub fn cluster_token(&self) -> String {
        let state: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(self.dir.join("state/state.json")).unwrap(),
        )
        .unwrap();
        state["token"].as_str().unwrap().to_string()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A plain HTTP/1.1 request (for the agent's loopback admin endpoint): (status, body).
pub fn http(method: &str, addr: &str, path: &str, body: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// A request with a JSON body (`Value::Null`: none).
pub fn req(method: &str, path: &str, ct: &str, body: serde_json::Value) -> http::Request<Vec<u8>> {
    let bytes = if body.is_null() {
        Vec::new()
    } else {
        serde_json::to_vec(&body).unwrap()
    };
    http::Request::builder()
        .method(method)
        .uri(path)
        .header("Content-Type", ct)
        .body(bytes)
        .unwrap()
}

/// Sends a request with a client; status, headers and the JSON body (`Null` if not JSON).
pub async fn send(
    c: &kube::Client,
    r: http::Request<Vec<u8>>,
    accept: Option<&str>,
) -> (u16, http::HeaderMap, serde_json::Value) {
    use http_body_util::BodyExt;
    let (mut parts, body) = r.into_parts();
    if let Some(a) = accept {
        parts
            .headers
            .insert("Accept", http::HeaderValue::from_str(a).unwrap());
    }
    let r = http::Request::from_parts(parts, kube::client::Body::from(body));
    let resp = c.send(r).await.unwrap();
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    let v = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    (parts.status.as_u16(), parts.headers, v)
}

/// A Deployment of `replicas` pods requesting `requests` (`{cpu: "1", memory: 1Gi}`), and a
/// ResourcePlacementPolicy dividing it with `placement` (further lines of its placement,
/// indented by four spaces).
pub fn divided_deployment(name: &str, replicas: i64, requests: &str, placement: &str) -> String {
    format!(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: default}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      containers:
      - name: app
        image: nginx:1.25
        resources: {{requests: {requests}}}
---
apiVersion: multicluster.io/v1alpha1
kind: ResourcePlacementPolicy
metadata: {{name: {name}, namespace: default}}
spec:
  resourceSelector: {{apiVersion: apps/v1, kind: Deployment, name: {name}, namespace: default}}
  placement:
    replicaScheduling: {{replicaSchedulingType: Divided}}
{placement}
"#
    )
}

/// Writes, from the kubeconfig `via` (the admin's or a user's), one for `cluster`'s API through
/// the cluster proxy (`orrery kubeconfig --cluster`), at `out`.
#[allow(dead_code)] // not every test binary reaches members through the proxy
pub fn cluster_kubeconfig(via: &std::path::Path, cluster: &str, out: &std::path::Path) {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_orrery"))
        .args(["kubeconfig", "--cluster", cluster, "--kubeconfig"])
        .arg(via)
        .arg("-o")
        .arg(out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}
