//! Orrery installed as a team would on real clusters: the agent run as a Pod in its member
//! (the in-cluster configuration, its state in a Secret, its probes), the config file. A
//! second Orrery server stands in for the member's Kubernetes API (no real cluster runs
//! here); the agent is started as a Deployment would start it: no kubeconfig, the
//! ServiceAccount's token and CA in a directory, `KUBERNETES_SERVICE_HOST`/`_PORT` set.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{Server, eventually, free_port, http};

/// A ServiceAccount of the member with `cluster-admin` (the ClusterRole an agent that
/// propagates any kind needs), and a token for it.
fn service_account(m: &Server, name: &str) -> String {
    let _ = m.kubectl(&["create", "namespace", "orrery-agent"]);
    m.ok(&["create", "serviceaccount", name, "-n", "orrery-agent"]);
    m.ok(&[
        "create",
        "clusterrolebinding",
        name,
        "--clusterrole",
        "cluster-admin",
        &format!("--serviceaccount=orrery-agent:{name}"),
    ]);
    m.ok(&[
        "create",
        "token",
        name,
        "-n",
        "orrery-agent",
        "--duration",
        "1h",
    ])
    .trim()
    .to_string()
}

/// What the kubelet mounts for the Pod's ServiceAccount; a new token is written as the
/// kubelet writes a rotated one (a new file renamed over the old).
fn mount(dir: &Path, m: &Server, token: &str) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::copy(m.dir.join("tls/ca.crt"), dir.join("ca.crt")).unwrap();
    std::fs::write(dir.join("namespace"), "orrery-agent").unwrap();
    std::fs::write(dir.join("token.new"), token).unwrap();
    std::fs::rename(dir.join("token.new"), dir.join("token")).unwrap();
}

struct PodAgent {
    child: Child,
    log: std::path::PathBuf,
}

impl PodAgent {
    /// The agent as the Deployment runs it: in `cwd` (its read-only root), state in a Secret.
    fn start(
        s: &Server,
        m: &Server,
        sa_dir: &Path,
        cwd: &Path,
        health: u16,
        token: Option<&str>,
    ) -> PodAgent {
        let log = cwd.join(format!("agent-{}.log", std::process::id()));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_orrery"));
        cmd.current_dir(cwd)
            .args(["agent", "--server", &s.url, "--cluster", "m1"])
            .args(["--state-secret", "orrery-agent/orrery-agent-state"])
            .args(["--health-listen", &format!("127.0.0.1:{health}")])
            .arg("--service-account-dir")
            .arg(sa_dir)
            .args(["--heartbeat-interval", "1s", "--report-interval", "200ms"])
            .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
            .env("KUBERNETES_SERVICE_PORT", m.port.to_string())
            .env_remove("KUBECONFIG")
            .env("ORRERY_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        if let Some(t) = token {
            cmd.env("ORRERY_TOKEN", t);
        }
        PodAgent {
            child: cmd.spawn().unwrap(),
            log,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for PodAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn probe(port: u16, path: &str) -> (u16, String) {
    match std::net::TcpStream::connect(("127.0.0.1", port)) {
        Ok(_) => http("GET", &format!("127.0.0.1:{port}"), path, ""),
        Err(_) => (0, String::new()),
    }
}

#[test]
fn the_agent_runs_in_its_member_as_a_pod() {
    let m = Server::start();
    let s = Server::start();
    let pod = tempfile::tempdir().unwrap();
    let sa = pod.path().join("serviceaccount");
    let first = service_account(&m, "orrery-agent");
    mount(&sa, &m, &first);
    let health = free_port();
    let bootstrap = s.token("m1");
    let mut agent = PodAgent::start(&s, &m, &sa, pod.path(), health, Some(&bootstrap));

    eventually(Duration::from_secs(20), "the agent ready", || {
        probe(health, "/readyz").0 == 200
    });
    let (_, ready) = probe(health, "/readyz");
    for line in ["[+]registered ok", "[+]session ok", "[+]member ok"] {
        assert!(ready.contains(line), "{ready}");
    }
    assert_eq!(probe(health, "/livez").0, 200);
    let (code, metrics) = probe(health, "/metrics");
    assert_eq!(code, 200);
    assert!(metrics.contains("orrery_agent_session_up 1"), "{metrics}");
    assert!(
        metrics.contains("orrery_agent_member_reachable 1"),
        "{metrics}"
    );
    assert_eq!(s.cluster_condition("m1", "Ready"), "True");

    // A Deployment placed by the control plane runs in the member.
    s.apply(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: default}\nspec:\n  replicas: 2\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec: {containers: [{name: web, image: nginx}]}\n---\napiVersion: multicluster.io/v1alpha1\nkind: ResourcePlacementPolicy\nmetadata: {name: web, namespace: default}\nspec:\n  resourceSelector: {apiVersion: apps/v1, kind: Deployment, name: web}\n  placement: {clusterAffinity: {clusterNames: [m1]}}\n",
    );
    eventually(
        Duration::from_secs(20),
        "the Deployment in the member",
        || m.kubectl(&["get", "deploy", "web"]).status.success(),
    );
    // Its state is a Secret of the member, not a file: the Pod needs no volume.
    let state = m.get_json(&["secret", "orrery-agent-state", "-n", "orrery-agent"]);
    assert!(state["data"]["state.json"].is_string(), "{state}");
    assert!(
        !pod.path().join("orrery-agent-state").exists(),
        "the agent wrote a state directory"
    );

    // Killed and started again without the bootstrap token (a rescheduled Pod): it resumes
    // from the Secret, does not register again, and changes nothing in the member.
    let version = |m: &Server| {
        m.get_json(&["deploy", "web"])["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let before = version(&m);
    let _ = agent.child.kill();
    let _ = agent.child.wait();
    eventually(Duration::from_secs(5), "the probes gone", || {
        probe(health, "/livez").0 == 0
    });
    agent = PodAgent::start(&s, &m, &sa, pod.path(), health, None);
    eventually(Duration::from_secs(20), "the agent ready again", || {
        probe(health, "/readyz").0 == 200
    });
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        version(&m),
        before,
        "the restart changed the member's Deployment"
    );
    let log = agent.log();
    assert!(
        !log.contains("registered cluster") && !log.contains(" registered "),
        "{log}"
    );

    // The kubelet rotates the projected token: the old one stops working, the agent reads
    // the new file (at least once a minute, as client-go does) and goes on.
    let second = service_account(&m, "orrery-agent-rotated");
    mount(&sa, &m, &second);
    m.ok(&[
        "delete",
        "serviceaccount",
        "orrery-agent",
        "-n",
        "orrery-agent",
    ]);
    let check = m.kubectl(&[
        "--token",
        &second,
        "get",
        "secret",
        "orrery-agent-state",
        "-n",
        "orrery-agent",
    ]);
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    s.ok(&["scale", "deploy", "web", "--replicas", "3"]);
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while m.get_json(&["deploy", "web"])["spec"]["replicas"] != 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "the scale never reached the member:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(
        probe(health, "/readyz").0 == 200,
        "{}",
        probe(health, "/readyz").1
    );

    // The member's API gone: not ready, and the probe says which check failed; still live.
    drop(m);
    eventually(
        Duration::from_secs(20),
        "not ready without the member",
        || {
            let (code, body) = probe(health, "/readyz");
            code == 503 && body.contains("[-]member failed")
        },
    );
    assert_eq!(probe(health, "/livez").0, 200);
}

#[test]
fn an_agent_outside_a_pod_says_how_to_choose_its_member() {
    let s = Server::start();
    let out = Command::new(env!("CARGO_BIN_EXE_orrery"))
        .args([
            "agent",
            "--server",
            &s.url,
            "--cluster",
            "x",
            "--token",
            "t",
        ])
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--kubeconfig") && err.contains("KUBERNETES_SERVICE_HOST"),
        "{err}"
    );
    // In a Pod whose ServiceAccount is not mounted: the path it looked at.
    let empty = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_orrery"))
        .args([
            "agent",
            "--server",
            &s.url,
            "--cluster",
            "x",
            "--token",
            "t",
        ])
        .arg("--service-account-dir")
        .arg(empty.path())
        .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        .env("KUBERNETES_SERVICE_PORT", "1")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ca.crt"), "{err}");
}

#[test]
fn server_and_agent_read_a_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("server.yaml");
    std::fs::write(
        &file,
        "listen: 127.0.0.1:0\nwater-level-limit: 0.7\ntls-san: [orrery.example, 10.0.0.1]\ncluster-secret: do-not-print-me\n",
    )
    .unwrap();
    let print = |extra: &[&str], env: &[(&str, &str)]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_orrery"));
        c.args(["server", "--config"])
            .arg(&file)
            .args(extra)
            .arg("--print-config");
        for (k, v) in env {
            c.env(k, v);
        }
        let out = c.output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (ok, out, err) = print(&[], &[]);
    assert!(ok, "{err}");
    assert!(
        out.contains("water-level-limit: 0.7  # config file"),
        "{out}"
    );
    assert!(out.contains("tls-san: [orrery.example, 10.0.0.1]"), "{out}");
    assert!(out.contains("cluster-secret: \"(redacted)\""), "{out}");
    assert!(!out.contains("do-not-print-me"), "{out}");
    assert!(out.contains("store: sqlite  # default"), "{out}");
    let (_, out, _) = print(&[], &[("ORRERY_WATER_LEVEL_LIMIT", "0.75")]);
    assert!(
        out.contains("water-level-limit: 0.75  # environment"),
        "{out}"
    );
    let (_, out, _) = print(
        &["--water-level-limit", "0.8"],
        &[("ORRERY_WATER_LEVEL_LIMIT", "0.75")],
    );
    assert!(out.contains("water-level-limit: 0.8  # flag"), "{out}");
    // An unknown key is refused by name; a bad value as the flag's own parser refuses it.
    std::fs::write(&file, "listen: 127.0.0.1:0\nwater-level-limt: 0.7\n").unwrap();
    let (ok, _, err) = print(&[], &[]);
    assert!(
        !ok && err.contains("\"water-level-limt\" is no flag of `orrery server`"),
        "{err}"
    );
    std::fs::write(&file, "water-level-limit: 7\n").unwrap();
    let (ok, _, err) = print(&[], &[]);
    assert!(!ok && err.contains("water-level-limit"), "{err}");

    // The server runs from its file: the limit it was given is the one it uses.
    std::fs::write(
        &file,
        format!(
            "data-dir: {}\nlisten: 127.0.0.1:0\nwater-level-limit: 0.7\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let s = Server::start_with(&["--config", file.to_str().unwrap()]);
    assert!(s.ok(&["get", "--raw", "/livez"]).contains("ok"));

    // The agent's file: every flag of its own.
    let agent = dir.path().join("agent.yaml");
    std::fs::write(
        &agent,
        format!(
            "server: {}\ncluster: from-file\nsimulate: nodes=2,cpu=4,memory=8Gi\ntoken: secret-token\nheartbeat-interval: 2s\nzone: [a, b]\n",
            s.url
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_orrery"))
        .args(["agent", "--config"])
        .arg(&agent)
        .arg("--print-config")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("cluster: from-file  # config file"), "{text}");
    assert!(text.contains("zone: [a, b]"), "{text}");
    assert!(text.contains("token: \"(redacted)\""), "{text}");
    assert!(!text.contains("secret-token"), "{text}");
}
