//! Orrery installed as a team would on real clusters: the agent run as a Pod in its member
//! (the in-cluster configuration, its state in a Secret, its probes), the config file. A
//! second Orrery server stands in for the member's Kubernetes API (no real cluster runs
//! here); the agent is started as a Deployment would start it: no kubeconfig, the
//! ServiceAccount's token and CA in a directory, `KUBERNETES_SERVICE_HOST`/`_PORT` set.

use crate::common;

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
    // Ready again once its watches of the member have recovered from the refused token.
    eventually(Duration::from_secs(30), "ready with the new token", || {
        probe(health, "/readyz").0 == 200
    });

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
    let agent = || {
        let mut c = Command::new(env!("CARGO_BIN_EXE_orrery"));
        c.args([
            "agent",
            "--server",
            &s.url,
            "--cluster",
            "x",
            "--token",
            "t",
        ]);
        c
    };
    let out = agent()
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
    let out = agent()
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

/// The objects of a multi-document YAML, by kind and name.
fn by_name(yaml: &str) -> std::collections::BTreeMap<String, serde_json::Value> {
    serde_saphyr::from_multiple::<serde_json::Value>(yaml)
        .unwrap()
        .into_iter()
        .filter(|o| !o.is_null())
        .map(|o| {
            (
                format!(
                    "{}/{}",
                    o["kind"].as_str().unwrap(),
                    o["metadata"]["name"].as_str().unwrap()
                ),
                o,
            )
        })
        .collect()
}

/// Runs `cmd`, which must succeed; its standard output.
fn succeeds(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

fn repo() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn deploy_agent_is_the_bundle_join_prints_and_an_api_accepts_it() {
    let out = succeeds(
        Command::new(env!("CARGO_BIN_EXE_orrery"))
            .args(["join", "my-cluster", "--pull", "--print"])
            .args(["--server", "https://orrery.example.com:6443"])
            .args(["--token", "REPLACE-WITH-A-BOOTSTRAP-TOKEN"]),
    );
    let printed = out;
    let out = succeeds(
        Command::new("kubectl")
            .arg("kustomize")
            .arg(repo().join("deploy/agent")),
    );
    let rendered = out;
    let (a, b) = (by_name(&printed), by_name(&rendered));
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "deploy/agent and `orrery join --pull --print` hold other objects"
    );
    for (k, v) in &a {
        assert_eq!(
            v, &b[k],
            "{k} differs between deploy/agent and join --print"
        );
    }
    // The Deployment's arguments are ones the binary takes.
    let d = &a["Deployment/orrery-agent"];
    let args: Vec<&str> = d["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(args[0], "agent");
    let help = Command::new(env!("CARGO_BIN_EXE_orrery"))
        .args(["agent", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for flag in args.iter().filter(|a| a.starts_with("--")) {
        assert!(help.contains(flag), "{flag} is no flag of orrery agent");
    }
    // Its config file's keys are the agent's flags: --print-config reads it.
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agent.yaml");
    std::fs::write(
        &cfg,
        a["ConfigMap/orrery-agent-config"]["data"]["agent.yaml"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let out = succeeds(
        Command::new(env!("CARGO_BIN_EXE_orrery"))
            .args(["agent", "--config"])
            .arg(&cfg)
            .arg("--print-config"),
    );
    assert!(out.contains("cluster: my-cluster  # config file"), "{out}");
    // Every object is accepted by a Kubernetes API (a server-side dry run; as with
    // Kubernetes, the namespaced ones need their Namespace to exist).
    let m = Server::start();
    m.ok(&["create", "namespace", "orrery-agent"]);
    let out = m.run_stdin(&["apply", "--dry-run=server", "-f", "-"], &rendered);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !m.kubectl(&["get", "deployment", "orrery-agent", "-n", "orrery-agent"])
            .status
            .success(),
        "a dry run made the Deployment"
    );
}

#[test]
fn join_pull_puts_the_agent_in_its_member_and_unjoin_takes_it_out() {
    let m = Server::start();
    let s = Server::start();
    let out = succeeds(
        Command::new(env!("CARGO_BIN_EXE_orrery"))
            .args([
                "join",
                "m1",
                "--pull",
                "--region",
                "eu-central",
                // The restricted role: ConfigMaps only.
                "--kinds",
                "configmaps",
                "--kubeconfig",
            ])
            .arg(&m.kubeconfig)
            .arg("--server-kubeconfig")
            .arg(&s.kubeconfig),
    );
    assert!(out.contains("bundle is in the member"), "{out}");
    // What the member's kubelet would start: the Deployment's container, its config from
    // the ConfigMap, its token from the Secret, the ServiceAccount's token and CA mounted.
    let d = m.get_json(&["deploy", "orrery-agent", "-n", "orrery-agent"]);
    let c = &d["spec"]["template"]["spec"]["containers"][0];
    let pod = tempfile::tempdir().unwrap();
    let etc = pod.path().join("etc-orrery");
    std::fs::create_dir_all(&etc).unwrap();
    let cm = m.get_json(&["configmap", "orrery-agent-config", "-n", "orrery-agent"]);
    std::fs::write(
        etc.join("agent.yaml"),
        cm["data"]["agent.yaml"].as_str().unwrap(),
    )
    .unwrap();
    let secret = m.get_json(&["secret", "orrery-agent-token", "-n", "orrery-agent"]);
    use base64::Engine;
    let token = String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(secret["data"]["token"].as_str().unwrap())
            .unwrap(),
    )
    .unwrap();
    // The bundle's own ServiceAccount, with the roles the bundle gave it.
    let sa_token = m
        .ok(&["create", "token", "orrery-agent", "-n", "orrery-agent"])
        .trim()
        .to_string();
    let sa = pod.path().join("serviceaccount");
    mount(&sa, &m, &sa_token);
    let health = free_port();
    let args: Vec<String> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            // The mount's path, where the test can write it.
            v.as_str()
                .unwrap()
                .replace("/etc/orrery", etc.to_str().unwrap())
        })
        .collect();
    let log = pod.path().join("agent.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_orrery"))
        .current_dir(pod.path())
        .args(&args)
        .arg("--service-account-dir")
        .arg(&sa)
        .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        .env("KUBERNETES_SERVICE_PORT", m.port.to_string())
        .env("ORRERY_TOKEN", &token)
        // Loopback only in tests: the environment overrides the file's 0.0.0.0.
        .env("ORRERY_HEALTH_LISTEN", format!("127.0.0.1:{health}"))
        .env("ORRERY_HEARTBEAT_INTERVAL", "1s")
        .env_remove("KUBECONFIG")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let agent_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while probe(health, "/readyz").0 != 200 {
        assert!(std::time::Instant::now() < deadline, "{}", agent_log());
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(s.cluster_condition("m1", "Ready"), "True");
    let cl = s.get_json(&["cluster", "m1"]);
    assert_eq!(cl["spec"]["region"], "eu-central", "{cl}");
    s.apply(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: hello, namespace: default}\ndata: {a: b}\n---\napiVersion: multicluster.io/v1alpha1\nkind: ResourcePlacementPolicy\nmetadata: {name: hello, namespace: default}\nspec:\n  resourceSelector: {apiVersion: v1, kind: ConfigMap, name: hello}\n  placement: {clusterAffinity: {clusterNames: [m1]}}\n",
    );
    eventually(
        Duration::from_secs(20),
        "the ConfigMap in the member",
        || m.kubectl(&["get", "cm", "hello"]).status.success(),
    );
    // A kind the role leaves out: Applied=False with the member's RBAC refusal, tried once
    // (an answer, not an outage), and the agent goes on.
    s.apply(
        "apiVersion: v1\nkind: Secret\nmetadata: {name: hush, namespace: default}\nstringData: {a: b}\n---\napiVersion: multicluster.io/v1alpha1\nkind: ResourcePlacementPolicy\nmetadata: {name: hush, namespace: default}\nspec:\n  resourceSelector: {apiVersion: v1, kind: Secret, name: hush}\n  placement: {clusterAffinity: {clusterNames: [m1]}}\n",
    );
    let refused = || {
        let w = s.get_json(&["work", "default.hush-secret", "-n", "orrery-cluster-m1"]);
        w["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Applied")
            .cloned()
            .unwrap_or_default()
    };
    eventually(Duration::from_secs(20), "the Secret refused", || {
        refused()["status"] == "False"
    });
    let c = refused();
    assert!(
        c["message"].as_str().unwrap_or("").contains("forbidden"),
        "{c}"
    );
    assert!(!m.kubectl(&["get", "secret", "hush"]).status.success());
    let tries = |log: &str| log.matches("default/hush").count();
    let first = tries(&agent_log());
    assert!(
        first >= 1,
        "the refusal is not in the log:\n{}",
        agent_log()
    );
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(
        tries(&agent_log()),
        first,
        "retried in a loop:\n{}",
        agent_log()
    );
    assert_eq!(probe(health, "/readyz").0, 200);

    // unjoin: the cluster unregistered (the agent removes what it ran), the bundle gone.
    let out = Command::new(env!("CARGO_BIN_EXE_orrery"))
        .args(["unjoin", "m1", "--kubeconfig"])
        .arg(&m.kubeconfig)
        .env("KUBECONFIG", &s.kubeconfig)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        agent_log()
    );
    assert!(!s.kubectl(&["get", "cluster", "m1"]).status.success());
    assert!(
        !m.kubectl(&["get", "cm", "hello"]).status.success(),
        "the agent left what it ran"
    );
    for what in [
        &["clusterrole", "orrery-agent"][..],
        &["clusterrolebinding", "orrery-agent"],
    ] {
        assert!(
            !m.kubectl(what).status.success(),
            "{what:?} left in the member"
        );
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A CustomResourceDefinition of the Prometheus Operator's, for the dry run (the stand-in
/// has no operator; the kind's schema is its own business).
fn operator_crd(kind: &str, plural: &str) -> String {
    format!(
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {{name: {plural}.monitoring.coreos.com}}\nspec:\n  group: monitoring.coreos.com\n  scope: Namespaced\n  names: {{plural: {plural}, singular: {}, kind: {kind}}}\n  versions:\n  - name: v1\n    served: true\n    storage: true\n    schema: {{openAPIV3Schema: {{type: object, x-kubernetes-preserve-unknown-fields: true}}}}\n",
        plural.trim_end_matches('s')
    )
}

#[test]
fn the_server_and_monitoring_bundles_render_and_an_api_accepts_them() {
    let m = Server::start();
    for (kind, plural) in [
        ("ServiceMonitor", "servicemonitors"),
        ("PodMonitor", "podmonitors"),
        ("PrometheusRule", "prometheusrules"),
    ] {
        m.apply(&operator_crd(kind, plural));
    }
    m.ok(&["create", "namespace", "orrery-agent"]);
    let help = succeeds(Command::new(env!("CARGO_BIN_EXE_orrery")).args(["server", "--help"]));
    for bundle in ["server", "ha", "monitoring"] {
        let rendered = succeeds(
            Command::new("kubectl")
                .arg("kustomize")
                .arg(repo().join("deploy").join(bundle)),
        );
        let objects = by_name(&rendered);
        // The server's flags and config file are ones the binary takes, as the kubelet
        // would start it (the Pod's IP put in its arguments, the Secret's keys in its
        // environment).
        if let Some(sts) = objects.get("StatefulSet/orrery") {
            let c = &sts["spec"]["template"]["spec"]["containers"][0];
            let args: Vec<String> = c["args"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap().replace("$(POD_IP)", "10.1.2.3"))
                .collect();
            assert_eq!(args[0], "server");
            for flag in args.iter().filter(|a| a.starts_with("--")) {
                assert!(
                    help.contains(flag.as_str()),
                    "{bundle}: {flag} is no flag of orrery server"
                );
            }
            let dir = tempfile::tempdir().unwrap();
            let cm = &objects["ConfigMap/orrery-config"];
            std::fs::write(
                dir.path().join("config.yaml"),
                cm["data"]["config.yaml"].as_str().unwrap(),
            )
            .unwrap();
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_orrery"));
            cmd.args(
                args.iter()
                    .map(|a| a.replace("/etc/orrery", dir.path().to_str().unwrap())),
            )
            .arg("--print-config");
            for e in c["env"].as_array().into_iter().flatten() {
                let key = e["valueFrom"]["secretKeyRef"]["key"].as_str();
                if let Some(key) = key {
                    use base64::Engine;
                    let secret = &objects[&format!(
                        "Secret/{}",
                        e["valueFrom"]["secretKeyRef"]["name"].as_str().unwrap()
                    )];
                    let v = base64::engine::general_purpose::STANDARD
                        .decode(
                            secret["data"][key]
                                .as_str()
                                .unwrap()
                                .split_whitespace()
                                .collect::<String>(),
                        )
                        .unwrap();
                    cmd.env(e["name"].as_str().unwrap(), String::from_utf8(v).unwrap());
                }
            }
            let printed = succeeds(&mut cmd);
            assert!(
                printed.contains("listen: 0.0.0.0:6443  # config file"),
                "{printed}"
            );
            if bundle == "ha" {
                assert!(printed.contains("store: etcd  # config file"), "{printed}");
                assert!(
                    printed.contains("etcd-endpoints: [https://etcd-0.etcd:2379"),
                    "{printed}"
                );
                assert!(
                    printed.contains("cluster-secret: \"(redacted)\"  # environment"),
                    "{printed}"
                );
                assert!(
                    printed.contains("advertise-url: https://10.1.2.3:6443  # flag"),
                    "{printed}"
                );
            }
        }
        // The alert rules are valid Prometheus rules.
        if let Some(rule) = objects.get("PrometheusRule/orrery") {
            let dir = tempfile::tempdir().unwrap();
            let file = dir.path().join("rules.yaml");
            std::fs::write(&file, serde_json::to_string(&rule["spec"]).unwrap()).unwrap();
            let promtool = std::env::var("ORRERY_PROMTOOL").unwrap_or_else(|_| "promtool".into());
            succeeds(Command::new(promtool).args(["check", "rules"]).arg(&file));
            let dash = &objects["ConfigMap/orrery-dashboard"]["data"]["orrery-fleet.json"];
            let dash: serde_json::Value = serde_json::from_str(dash.as_str().unwrap()).unwrap();
            assert!(dash["panels"].as_array().unwrap().len() >= 5);
        }
        let out = m.run_stdin(&["apply", "--dry-run=server", "-f", "-"], &rendered);
        assert!(
            out.status.success(),
            "{bundle}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Secret data wrapped over lines (as kustomize writes long values) is read as Kubernetes
    // reads it, and kept on one line.
    m.apply("apiVersion: v1\nkind: Secret\nmetadata: {name: wrapped, namespace: default}\ndata:\n  k: |\n    aHR0cHM6Ly9ldGNkLTAuZXRjZDoyMzc5LGh0dHBzOi8vZXRjZC0xLmV0Y2Q6MjM3OSxodHRwczovL2V0\n    Y2QtMi5ldGNkOjIzNzk=\n");
    assert_eq!(
        m.ok(&["get", "secret", "wrapped", "-o", "jsonpath={.data.k}"]),
        "aHR0cHM6Ly9ldGNkLTAuZXRjZDoyMzc5LGh0dHBzOi8vZXRjZC0xLmV0Y2Q6MjM3OSxodHRwczovL2V0Y2QtMi5ldGNkOjIzNzk="
    );
}

/// The server as its bundle's StatefulSet runs it (the bundle's config file; only its
/// addresses changed for a test's loopback), in a cluster whose API a second Orrery server
/// stands in for, with the bundle's ServiceAccount and Role: it exports its admin kubeconfig
/// as the Secret the bundle names, that kubeconfig reaches it, and a CA rotation's first step
/// writes the Secret again with both CAs.
#[test]
fn the_server_exports_its_kubeconfig_as_a_secret_of_its_cluster() {
    let host = Server::start();
    let rendered = succeeds(
        Command::new("kubectl")
            .arg("kustomize")
            .arg(repo().join("deploy/server")),
    );
    let objects = by_name(&rendered);
    // (orrery-system exists on an Orrery server, as kube-system does on a cluster.)
    for o in [
        "ServiceAccount/orrery",
        "Role/orrery-kubeconfig",
        "RoleBinding/orrery-kubeconfig",
    ] {
        host.stdin(&["apply", "-f", "-"], &objects[o].to_string());
    }
    let token = host
        .ok(&[
            "create",
            "token",
            "orrery",
            "-n",
            "orrery-system",
            "--duration",
            "1h",
        ])
        .trim()
        .to_string();
    let pod = tempfile::tempdir().unwrap();
    let sa = pod.path().join("serviceaccount");
    std::fs::create_dir_all(&sa).unwrap();
    std::fs::copy(host.dir.join("tls/ca.crt"), sa.join("ca.crt")).unwrap();
    std::fs::write(sa.join("namespace"), "orrery-system").unwrap();
    std::fs::write(sa.join("token"), &token).unwrap();
    let config = pod.path().join("config.yaml");
    std::fs::write(
        &config,
        objects["ConfigMap/orrery-config"]["data"]["config.yaml"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let port = host.port.to_string();
    let s = Server::start_env(
        &[
            "--config",
            config.to_str().unwrap(),
            "--service-account-dir",
            sa.to_str().unwrap(),
        ],
        &[
            ("KUBERNETES_SERVICE_HOST", "127.0.0.1"),
            ("KUBERNETES_SERVICE_PORT", &port),
        ],
    );
    let exported = || -> Option<String> {
        let out = host.kubectl(&[
            "get",
            "secret",
            "orrery-kubeconfig",
            "-n",
            "orrery-system",
            "-o",
            "jsonpath={.data.kubeconfig}",
        ]);
        use base64::Engine;
        let b = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (out.status.success() && !b.is_empty()).then(|| {
            String::from_utf8(base64::engine::general_purpose::STANDARD.decode(b).unwrap()).unwrap()
        })
    };
    eventually(Duration::from_secs(30), "the exported kubeconfig", || {
        exported().is_some()
    });
    let kc = exported().unwrap();
    assert!(
        kc.contains("server: https://orrery.orrery-system.svc:6443"),
        "it names the Service: {kc}"
    );
    let file = pod.path().join("exported.kubeconfig");
    std::fs::write(&file, &kc).unwrap();
    let cache = pod.path().join("kube-cache");
    let via_export = |args: &[&str]| {
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&file)
            .arg("--cache-dir")
            .arg(&cache)
            .args(["--server", &s.url])
            .args(args)
            .output()
            .unwrap()
    };
    let out = via_export(&["get", "namespaces"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The bundle's Role lets it write that Secret and nothing else.
    let denied = host.kubectl(&[
        "--token",
        &token,
        "get",
        "secret",
        "-n",
        "orrery-system",
        "other",
    ]);
    assert!(
        String::from_utf8_lossy(&denied.stderr).contains("forbidden"),
        "{}",
        String::from_utf8_lossy(&denied.stderr)
    );
    s.orrery_ok(&["ca", "stage"]);
    eventually(Duration::from_secs(30), "the Secret with both CAs", || {
        exported().is_some_and(|k| {
            use base64::Engine;
            let ca = k
                .lines()
                .find_map(|l| l.trim().strip_prefix("certificate-authority-data: "))
                .map(|b| base64::engine::general_purpose::STANDARD.decode(b).unwrap())
                .unwrap_or_default();
            String::from_utf8_lossy(&ca)
                .matches("BEGIN CERTIFICATE")
                .count()
                == 2
        })
    });
    assert!(s.log().contains("exported the admin kubeconfig"));
}
