//! The cluster proxy end to end: a pull-mode member's agent keeps a tunnel open to the server,
//! and kubectl, with a kubeconfig from `orrery kubeconfig --cluster`, lists the member's pods
//! and reads and follows their logs through it; who may not use the proxy is refused.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::fleet::Fleet;
use common::{divided_deployment, eventually};

fn kubectl_with(f: &Fleet, kubeconfig: &std::path::Path, args: &[&str]) -> std::process::Output {
    let home = f.s.dir.join("proxy-home");
    std::fs::create_dir_all(&home).unwrap();
    Command::new("kubectl")
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("KUBECACHEDIR", &home)
        .env("HOME", &home)
        .output()
        .unwrap()
}

#[test]
fn kubectl_reaches_a_pull_mode_members_pods_and_logs_through_the_proxy() {
    let f = Fleet::start(&[("a", "r1"), ("b", "r1")]);
    f.s.apply(&divided_deployment(
        "web",
        2,
        "{cpu: 100m, memory: 64Mi}",
        "    clusterAffinity: {clusterNames: [a]}",
    ));
    eventually(Duration::from_secs(30), "web running in a", || {
        f.s.get_json(&["deployment", "web", "-n", "default", "-o", "json"])["status"]["readyReplicas"]
            == 2
    });

    // The control plane runs no pods: kubectl logs (and exec) of the template stop at once,
    // saying where they are, not after kubectl's 20 s wait for a pod (its wait is a watch,
    // refused with a 404 that says so; kubectl prints the list's warning and that error, not
    // that its watch closed).
    for args in [
        &["logs", "deploy/web", "-n", "default"][..],
        &["exec", "deploy/web", "-n", "default", "--", "true"][..],
    ] {
        let asked = Instant::now();
        let out = f.s.kubectl(args);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(
                "Warning: pods run in member clusters, not in the control plane: Deployment default/web in a;"
            ) && err.contains("orrery kubeconfig --cluster a")
                && err.contains("Error from server (NotFound): no pod runs in the control plane")
                && !err.contains("watch closed"),
            "{err}"
        );
        assert!(
            asked.elapsed() < Duration::from_secs(10),
            "{:?}",
            asked.elapsed()
        );
    }
    // A plain list of them is answered (empty), with the same words as a warning.
    let out =
        f.s.kubectl(&["get", "pods", "-n", "default", "-l", "app=web"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && err.contains("Warning: pods run in member clusters"),
        "{err}"
    );

    // A kubeconfig for a's API, from the control plane's.
    let kc = f.s.dir.join("a.kubeconfig");
    common::cluster_kubeconfig(&f.s.kubeconfig, "a", &kc);

    let mut pods = String::new();
    eventually(
        Duration::from_secs(20),
        "a's pods through the proxy",
        || {
            let out = kubectl_with(&f, &kc, &["get", "pods", "-n", "default"]);
            pods = String::from_utf8_lossy(&out.stdout).into_owned();
            out.status.success() && pods.lines().filter(|l| l.starts_with("web-")).count() == 2
        },
    );
    let header = pods.lines().next().unwrap();
    for col in ["NAME", "READY", "STATUS", "AGE"] {
        assert!(header.contains(col), "{pods}");
    }
    assert!(
        pods.lines()
            .filter(|l| l.starts_with("web-"))
            .all(|l| l.contains("1/1") && l.contains("Running")),
        "{pods}"
    );
    let pod = pods
        .lines()
        .find(|l| l.starts_with("web-"))
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    // The pod as JSON, as the member serves it.
    let out = kubectl_with(
        &f,
        &kc,
        &["get", "pod", &pod, "-n", "default", "-o", "json"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let p: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(p["metadata"]["labels"]["app"], "web", "{p:#}");
    assert!(
        p["status"]["podIP"].as_str().unwrap().starts_with("10."),
        "{p:#}"
    );

    // Logs, the last lines (a line a second since the pod started).
    let mut logs = String::new();
    eventually(Duration::from_secs(10), "two lines of logs", || {
        let out = kubectl_with(&f, &kc, &["logs", &pod, "-n", "default", "--tail", "2"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        logs = String::from_utf8_lossy(&out.stdout).into_owned();
        logs.lines().count() == 2
    });
    assert!(
        logs.lines()
            .all(|l| l.contains(&format!("app {pod}: simulated log line"))),
        "{logs}"
    );

    // The member's workloads, read through the proxy: kubectl finds a Deployment's pods by
    // its selector (logs deploy/web), and label selectors narrow pod lists.
    let out = kubectl_with(&f, &kc, &["get", "deployments", "-n", "default"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success()
            && text
                .lines()
                .any(|l| l.starts_with("web ") && l.contains("2/2") && !l.contains("<unknown>")),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = kubectl_with(
        &f,
        &kc,
        &["logs", "deploy/web", "-n", "default", "--tail", "1"],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains(": simulated log line"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let names = |selector: &str| {
        let out = kubectl_with(
            &f,
            &kc,
            &["get", "pods", "-n", "default", "-l", selector, "-o", "name"],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).lines().count()
    };
    assert_eq!(names("app=web"), 2);
    assert_eq!(names("app=web,tier notin (web)"), 2);
    assert_eq!(names("app=other"), 0);

    // A followed log keeps coming as the pod writes it.
    let mut follow = Command::new("kubectl")
        .args(["logs", "-f", &pod, "-n", "default", "--tail", "1"])
        .env("KUBECONFIG", &kc)
        .env("HOME", f.s.dir.join("proxy-home"))
        .env("KUBECACHEDIR", f.s.dir.join("proxy-home"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(follow.stdout.take().unwrap()).lines();
    let started = Instant::now();
    let mut seen = Vec::new();
    while seen.len() < 3 && started.elapsed() < Duration::from_secs(20) {
        match lines.next() {
            Some(Ok(l)) => seen.push(l),
            _ => break,
        }
    }
    let _ = follow.kill();
    let _ = follow.wait();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "later lines came at once"
    );

    // The proxy says clearly what it cannot do, and what does not exist.
    let out = kubectl_with(&f, &kc, &["get", "pod", "nope", "-n", "default"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("\"nope\" not found"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // What the cluster's ClusterProfile says of reaching it (KEP-4322 access providers, what
    // MultiKueue reads) works: the proxy's endpoint, with the server's CA.
    let profile =
        f.s.get_json(&["clusterprofile", "a", "-n", "orrery-system", "-o", "json"]);
    let server = profile["status"]["accessProviders"][0]["cluster"]["server"]
        .as_str()
        .unwrap()
        .to_string();
    let listed = f.s.ok(&[
        "--server", &server, "get", "pods", "-n", "default", "-o", "name",
    ]);
    assert_eq!(
        listed.lines().filter(|l| l.starts_with("pod/web-")).count(),
        2,
        "{listed}"
    );

    // A cluster without an agent (`--raw` takes the whole path: kubectl puts no prefix on it).
    let proxied = |cluster: &str| {
        format!(
            "/apis/multicluster.io/v1alpha1/clusters/{cluster}/proxy/api/v1/namespaces/default/pods"
        )
    };
    let err = f.s.fails(&["get", "--raw", &proxied("x")]);
    assert!(
        err.contains("cluster x has no tunnel to this server"),
        "{err}"
    );
    // exec: a WebSocket upgraded through the tunnel to the member's shell.
    let exec = |args: &[&str], stdin: &str| {
        use std::io::Write;
        let home = f.s.dir.join("proxy-home");
        let mut c = Command::new("kubectl")
            .args(["exec", "-n", "default"])
            .args(args)
            .env("KUBECONFIG", &kc)
            .env("HOME", &home)
            .env("KUBECACHEDIR", &home)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        c.wait_with_output().unwrap()
    };
    let out = exec(&[&pod, "--", "echo", "hello", "world"], "");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello world\n");
    let out = exec(&[&pod, "--", "hostname"], "");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), pod);
    let out = exec(&["-i", &pod, "--", "cat"], "abc\ndef\n");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "abc\ndef\n");
    let out = exec(&[&pod, "--", "false"], "");
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = exec(&["-i", &pod, "--", "sh"], "echo hi\nhostname\nexit 3\n");
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("hi\n{pod}\n"));
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A pod with a ConfigMap volume and env from it: its shell sees them; every exec ends
    // (within seconds, never waiting on a stdin nobody sends), with the command's status.
    f.s.apply(
        r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: web-config, namespace: default}
data: {greeting: hello}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: files, namespace: default}
spec:
  replicas: 1
  selector: {matchLabels: {app: files}}
  template:
    metadata: {labels: {app: files}}
    spec:
      containers:
      - name: c
        image: busybox
        env: [{name: GREETING, valueFrom: {configMapKeyRef: {name: web-config, key: greeting}}}]
        volumeMounts: [{name: config, mountPath: /etc/web}]
      volumes: [{name: config, configMap: {name: web-config}}]
---
apiVersion: multicluster.io/v1alpha1
kind: ResourcePlacementPolicy
metadata: {name: files, namespace: default}
spec:
  resourceSelector: {apiVersion: apps/v1, kind: Deployment, name: files}
  propagateDeps: true
  placement: {clusterAffinity: {clusterNames: [a]}}
"#,
    );
    let mut files_pod = String::new();
    eventually(Duration::from_secs(30), "files' pod running in a", || {
        let out = kubectl_with(
            &f,
            &kc,
            &[
                "get",
                "pods",
                "-n",
                "default",
                "-l",
                "app=files",
                "-o",
                "jsonpath={.items[0].metadata.name} {.items[0].status.phase}",
            ],
        );
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        match text.split_once(' ') {
            Some((name, "Running")) => {
                files_pod = name.to_string();
                true
            }
            _ => false,
        }
    });
    let timed = |args: &[&str]| {
        let started = Instant::now();
        let out = exec(args, "");
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "{args:?} took {:?}",
            started.elapsed()
        );
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    for (args, code, stdout) in [
        (
            vec!["cat", "/etc/hostname"],
            Some(0),
            format!("{files_pod}\n"),
        ),
        (
            vec!["cat", "/etc/web/greeting"],
            Some(0),
            "hello".to_string(),
        ),
        (
            vec!["sh", "-c", "echo hi; uname -s"],
            Some(0),
            "hi\nLinux\n".to_string(),
        ),
        (vec!["ls", "/etc/web"], Some(0), "greeting\n".to_string()),
        (vec!["printenv", "GREETING"], Some(0), "hello\n".to_string()),
        (
            vec!["sh", "-c", "false && echo no || echo $GREETING"],
            Some(0),
            "hello\n".to_string(),
        ),
        (vec!["sh", "-c", "exit 4"], Some(4), String::new()),
    ] {
        let mut a = vec![files_pod.as_str(), "--"];
        a.extend(args.iter().copied());
        let (got, out, err) = timed(&a);
        assert_eq!(
            (got, out.as_str()),
            (code, stdout.as_str()),
            "{args:?}: {err}"
        );
    }
    let (got, _, err) = timed(&[files_pod.as_str(), "--", "nosuch"]);
    assert_eq!(got, Some(127), "{err}");
    assert!(err.contains("not found"), "{err}");
    // The member's own objects answer through the proxy too.
    for (args, shows) in [
        (vec!["get", "nodes"], "a-node-0"),
        (vec!["get", "ns"], "kube-system"),
        (vec!["get", "svc", "-n", "default"], "kubernetes"),
        (vec!["get", "cm", "-n", "default"], "web-config"),
        (vec!["get", "sa", "-n", "default"], "default"),
    ] {
        let out = kubectl_with(&f, &kc, &args);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains(shows),
            "{args:?}: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let cm = kubectl_with(&f, &kc, &["get", "cm", "web-config", "-n", "default"]);
    let text = String::from_utf8_lossy(&cm.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("web-config") && l.split_whitespace().nth(1) == Some("1")),
        "{text}"
    );

    // RBAC on clusters/proxy: a user with no role is refused; one bound to a role that
    // grants the proxy of a (and only a) gets through to a.
    let alice = f.s.dir.join("alice.kubeconfig");
    let out = Command::new(env!("CARGO_BIN_EXE_orrery"))
        .args(["user", "create", "alice", "--kubeconfig"])
        .arg(&f.s.kubeconfig)
        .arg("--output")
        .arg(&alice)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let as_alice = |path: &str| kubectl_with(&f, &alice, &["get", "--raw", path]);
    let out = as_alice(&proxied("a"));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Forbidden") || err.contains("forbidden"),
        "{err}"
    );
    f.s.apply(
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: proxy-a}
rules:
- {apiGroups: [multicluster.io], resources: [clusters/proxy], resourceNames: [a], verbs: [get]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: alice-proxy-a}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: proxy-a}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: alice}]
"#,
    );
    eventually(Duration::from_secs(10), "alice through a's proxy", || {
        let out = as_alice(&proxied("a"));
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("web-")
    });
    assert!(!as_alice(&proxied("b")).status.success(), "alice reached b");
    // get on a's proxy reads; exec acts in the member and needs create.
    let alice_a = f.s.dir.join("alice-a.kubeconfig");
    common::cluster_kubeconfig(&alice, "a", &alice_a);
    let out = kubectl_with(
        &f,
        &alice_a,
        &["exec", "-n", "default", &pod, "--", "echo", "hi"],
    );
    assert!(!out.status.success(), "alice could exec with get");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("forbidden") || err.contains("Forbidden"),
        "{err}"
    );
}

/// `kubectl port-forward` through the proxy into a simulated pod (kubectl tunnels SPDY/3.1 in
/// a WebSocket): a declared port echoes what it is sent and answers HTTP naming the pod; a
/// port the pod does not declare is refused with kubelet's message on the error stream.
#[test]
fn kubectl_port_forward_reaches_a_simulated_pods_declared_ports() {
    use std::io::{Read, Write};
    let f = Fleet::start(&[("a", "r1")]);
    // The pod declares port 80 (what a simulated pod listens on).
    f.s.apply(
        &divided_deployment("api", 1, "{cpu: 100m, memory: 64Mi}", "").replace(
            "        image: nginx:1.25\n",
            "        image: nginx:1.25\n        ports: [{containerPort: 80}]\n",
        ),
    );
    eventually(Duration::from_secs(30), "api running in a", || {
        f.s.get_json(&["deployment", "api", "-n", "default", "-o", "json"])["status"]["readyReplicas"]
            == 1
    });
    let kc = f.s.dir.join("a.kubeconfig");
    common::cluster_kubeconfig(&f.s.kubeconfig, "a", &kc);
    let mut pod = String::new();
    eventually(
        Duration::from_secs(20),
        "api's pod through the proxy",
        || {
            let out = kubectl_with(
                &f,
                &kc,
                &[
                    "get",
                    "pods",
                    "-n",
                    "default",
                    "-o",
                    "jsonpath={.items[*].metadata.name}",
                ],
            );
            pod = String::from_utf8_lossy(&out.stdout).trim().to_string();
            out.status.success() && pod.starts_with("api-")
        },
    );

    let home = f.s.dir.join("proxy-home");
    let mut pf = Command::new("kubectl")
        .args(["port-forward", "-n", "default", "--address", "127.0.0.1"])
        .arg("deploy/api")
        .args([":80", ":81"])
        // kubectl 1.30 tunnels port-forward in a WebSocket only when asked (1.31 and newer do
        // by default).
        .env("KUBECTL_PORT_FORWARD_WEBSOCKETS", "true")
        .env("KUBECONFIG", &kc)
        .env("HOME", &home)
        .env("KUBECACHEDIR", &home)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // "Forwarding from 127.0.0.1:<local> -> <remote>", once per port.
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = pf.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut local = std::collections::HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while local.len() < 2 {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| {
                let _ = pf.kill();
                let mut err = String::new();
                pf.stderr.take().unwrap().read_to_string(&mut err).unwrap();
                panic!("kubectl port-forward did not start: {err}")
            });
        if let Some(rest) = line.strip_prefix("Forwarding from 127.0.0.1:") {
            let (l, r) = rest.split_once(" -> ").unwrap();
            local.insert(r.trim().to_string(), l.parse::<u16>().unwrap());
        }
    }
    let connect = |remote: &str| {
        let c = std::net::TcpStream::connect(("127.0.0.1", local[remote])).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        c
    };

    // Echo: what goes in comes back, in two writes; closing our side ends the connection.
    let mut c = connect("80");
    let mut got = Vec::new();
    for part in ["hello ", "orrery\n"] {
        c.write_all(part.as_bytes()).unwrap();
        let mut buf = vec![0; part.len()];
        if let Err(e) = c.read_exact(&mut buf) {
            let _ = pf.kill();
            let mut err = String::new();
            pf.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            panic!("{e}: {err}");
        }
        got.extend(buf);
    }
    assert_eq!(String::from_utf8_lossy(&got), "hello orrery\n");
    c.shutdown(std::net::Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    c.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "{rest:?}");

    // HTTP, twice (each connection is a new pair of streams on the one tunnel).
    for path in ["/hello", "/again"] {
        let mut c = connect("80");
        write!(c, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
        let mut answer = String::new();
        c.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(
            answer.ends_with(&format!("\r\n\r\n{pod} in a, port 80: GET {path}\n")),
            "{answer}"
        );
    }

    // Port 81 is not declared: no bytes, and kubectl reports kubelet's message (it then drops
    // the whole forward, as it does against a real kubelet).
    let mut c = connect("81");
    let _ = c.write_all(b"anyone?");
    let mut nothing = Vec::new();
    let _ = c.read_to_end(&mut nothing);
    assert!(nothing.is_empty(), "{nothing:?}");
    let deadline = Instant::now() + Duration::from_secs(15);
    while pf.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = pf.kill();
    let mut err = String::new();
    pf.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(
        err.contains("an error occurred forwarding")
            && err.contains("localhost:81")
            && err.contains("listens on the ports its containers declare: 80"),
        "{err}"
    );
}
