//! The cluster proxy end to end: a pull-mode member's agent keeps a tunnel open to the server,
//! and kubectl, with a kubeconfig from `orrery kubeconfig --cluster`, lists the member's pods
//! and reads and follows their logs through it; who may not use the proxy is refused.

#![allow(clippy::unwrap_used)]

mod common;

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

    // A kubeconfig for a's API, from the control plane's.
    let kc = f.s.dir.join("a.kubeconfig");
    let out = Command::new(env!("CARGO_BIN_EXE_orrery"))
        .args(["kubeconfig", "--cluster", "a", "--kubeconfig"])
        .arg(&f.s.kubeconfig)
        .arg("-o")
        .arg(&kc)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

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
    // Upgrades (exec, port-forward) are refused, saying so.
    let out = kubectl_with(&f, &kc, &["exec", "-n", "default", &pod, "--", "true"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("does not carry upgraded connections"), "{err}");

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
}
