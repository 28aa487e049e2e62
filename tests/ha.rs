//! High availability end to end: several `orrery server` replicas on one etcd cluster (real
//! etcd members on loopback ports), one leader elected through a Lease, fenced controller
//! writes, and the faults an installation must survive.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{Agent, Server, eventually, http, signal};
use orrery_store::Store;
use orrery_store_testkit::etcd::EtcdCluster;

const SECRET: &str = "an installation secret of some length";
/// Short leases, so that a test need not wait Kubernetes' 15 seconds.
const LEASE: Duration = Duration::from_secs(4);

fn replica(etcd: &EtcdCluster, extra: &[&str]) -> Server {
    replica_retrying(etcd, "500ms", extra)
}

/// A replica trying for the Lease every `retry`.
fn replica_retrying(etcd: &EtcdCluster, retry: &str, extra: &[&str]) -> Server {
    replica_on(etcd, "127.0.0.1", retry, extra)
}

/// A replica listening on `host` (a loopback address).
fn replica_on(etcd: &EtcdCluster, host: &str, retry: &str, extra: &[&str]) -> Server {
    let endpoints = etcd.endpoints().join(",");
    let mut args = vec![
        "--store",
        "etcd",
        "--etcd-endpoints",
        &endpoints,
        "--cluster-secret",
        SECRET,
        "--leader-elect-lease-duration",
        "4s",
        "--leader-elect-renew-deadline",
        "3s",
        "--leader-elect-retry-period",
        retry,
    ];
    args.extend_from_slice(extra);
    Server::start_on(host, &args)
}

/// Runs kubectl with `via`'s kubeconfig against `at`'s address.
fn on(via: &Server, at: &Server, args: &[&str]) -> std::process::Output {
    let mut a = vec!["--server", at.url.as_str()];
    a.extend_from_slice(args);
    via.kubectl(&a)
}

/// The holder of the leader Lease, as `kubeconfig` reads it ("" when none; `None` when the
/// replica does not answer).
fn lease_holder(kubeconfig: &std::path::Path, home: &std::path::Path) -> Option<String> {
    let out = std::process::Command::new("kubectl")
        .args([
            "get",
            "lease",
            "-n",
            "orrery-system",
            "orrery-controllers",
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ])
        .env("KUBECONFIG", kubeconfig)
        .env("HOME", home)
        .output()
        .unwrap();
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn holder_of(s: &Server) -> String {
    lease_holder(&s.kubeconfig, &s.dir).expect("the Lease")
}

/// Whether replica `s` says it leads (`orrery_leader 1` on its /metrics); `None` when it
/// does not answer.
fn leads(s: &Server) -> Option<bool> {
    let out = s.kubectl(&["get", "--raw", "/metrics"]);
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("orrery_leader "))
        .map(|v| v.trim() == "1")
}

/// The index of the one replica that leads, once exactly one does.
fn the_leader(replicas: &[&Server], timeout: Duration) -> usize {
    let mut found = None;
    eventually(timeout, "exactly one replica leading", || {
        let leading: Vec<usize> = replicas
            .iter()
            .enumerate()
            .filter(|(_, s)| leads(s) == Some(true))
            .map(|(i, _)| i)
            .collect();
        found = (leading.len() == 1).then(|| leading[0]);
        found.is_some()
    });
    found.unwrap()
}

fn sim_member(s: &Server, name: &str) -> (Agent, String) {
    sim_member_at(s, &s.url, name)
}

/// A simulated member whose agent is given `urls` (several replicas, comma-separated).
fn sim_member_at(s: &Server, urls: &str, name: &str) -> (Agent, String) {
    sim_member_wrapped(s, urls, name, "127.0.0.1:0", Vec::new())
}

/// Like [`sim_member_at`], its admin endpoint on `admin_at`, run under `wrapper` (a network
/// namespace's `ip netns exec`).
fn sim_member_wrapped(
    s: &Server,
    urls: &str,
    name: &str,
    admin_at: &str,
    wrapper: Vec<String>,
) -> (Agent, String) {
    let token = s.token(name);
    let a = Agent::start_wrapped(
        s,
        urls,
        name,
        &[
            "--cluster",
            name,
            "--token",
            &token,
            "--simulate",
            "nodes=4,cpu=8,memory=32Gi,load=0.1,start=100ms",
            "--heartbeat-interval",
            "1s",
            "--report-interval",
            "100ms",
            "--admin-listen",
            admin_at,
        ],
        &[],
        wrapper,
    );
    let admin = a.admin();
    eventually(Duration::from_secs(30), "the member Ready", || {
        s.cluster_condition(name, "Ready") == "True"
    });
    (a, admin)
}

fn deployment(name: &str) -> String {
    common::divided_deployment(name, 3, "{cpu: 100m, memory: 64Mi}", "")
}

/// The member's journal of operations after `since`: (seq, op, kind, name).
fn journal(admin: &str, cluster: &str, since: u64) -> Vec<(u64, String, String, String)> {
    let (code, body) = http(
        "GET",
        admin,
        &format!("/clusters/{cluster}/journal?since={since}"),
        "",
    );
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["seq"].as_u64().unwrap(),
                e["op"].as_str().unwrap_or_default().to_string(),
                e["kind"].as_str().unwrap_or_default().to_string(),
                e["name"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn member_runs(admin: &str, cluster: &str, name: &str) -> bool {
    let (code, body) = http("GET", admin, &format!("/clusters/{cluster}/objects"), "");
    code == 200
        && serde_json::from_str::<serde_json::Value>(&body).is_ok_and(|v| {
            v["items"].as_array().is_some_and(|items| {
                items
                    .iter()
                    .any(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == name)
            })
        })
}

async fn etcd_store(etcd: &EtcdCluster) -> orrery_store_etcd::EtcdStore {
    orrery_store_etcd::EtcdStore::connect(orrery_store_etcd::EtcdConfig::new(etcd.endpoints()))
        .await
        .unwrap()
}

#[test]
fn replicas_share_one_identity_and_a_killed_leader_is_replaced_losing_no_write() {
    let etcd = EtcdCluster::start(3).unwrap();
    let a = replica(&etcd, &[]);
    let b = replica(&etcd, &[]);
    let c = replica(&etcd, &[]);
    // One CA and one admin token: any replica's kubeconfig works against every replica.
    let ca = |s: &Server| std::fs::read_to_string(s.dir.join("tls/ca.crt")).unwrap();
    assert_eq!(ca(&a), ca(&b));
    assert_eq!(ca(&a), ca(&c));
    for at in [&a, &b, &c] {
        let out = on(&a, at, &["get", "namespaces"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // A CRD written through one replica is served by every one, leader or not (each follows
    // the stored CRDs itself).
    a.apply(
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: widgets.example.com}\nspec:\n  group: example.com\n  scope: Namespaced\n  names: {plural: widgets, singular: widget, kind: Widget}\n  versions:\n  - name: v1\n    served: true\n    storage: true\n    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}\n",
    );
    common::eventually(
        Duration::from_secs(20),
        "every replica serving Widgets",
        || {
            [&a, &b, &c]
                .iter()
                .all(|at| on(&a, at, &["get", "widgets", "-A"]).status.success())
        },
    );
    // A CA rotation asked of one replica is adopted by the others (each polls the shared
    // identity): staged on a, b and c hand out both CAs; switched on b, a and c sign with
    // the new one alone, and a's kubeconfig, which a rewrote, works against c.
    let cacerts = |via: &Server, at: &Server| {
        let out = on(via, at, &["get", "--raw", "/cacerts"]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let certs = |pem: &str| pem.matches("BEGIN CERTIFICATE").count();
    a.orrery_ok(&["ca", "stage"]);
    let bundle = cacerts(&a, &a);
    assert_eq!(certs(&bundle), 2);
    common::eventually(Duration::from_secs(30), "b and c trusting both CAs", || {
        cacerts(&a, &b) == bundle && cacerts(&a, &c) == bundle
    });
    b.orrery_ok(&["ca", "switch"]);
    let new = bundle[ca(&a).len()..].to_string();
    common::eventually(
        Duration::from_secs(30),
        "a and c signing with the new CA",
        || cacerts(&b, &a) == new && cacerts(&b, &c) == new && ca(&a) == new && ca(&c) == new,
    );
    for at in [&a, &b, &c] {
        let out = on(&a, at, &["get", "namespaces"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Each replica's watch cache is fed by etcd: a watch on one sees a write made through
    // another.
    let mut watch = std::process::Command::new("kubectl")
        .args([
            "--server",
            &c.url,
            "get",
            "configmaps",
            "--watch-only",
            "-o",
            "name",
        ])
        .env("KUBECONFIG", &a.kubeconfig)
        .env("HOME", a.dir.join("watch-home"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    a.ok(&[
        "create",
        "configmap",
        "seen-elsewhere",
        "--from-literal",
        "k=v",
    ]);
    let seen_line = {
        use std::io::BufRead;
        let out = watch.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        rx.recv_timeout(Duration::from_secs(10))
    };
    let _ = watch.kill();
    let _ = watch.wait();
    assert_eq!(seen_line.ok().as_deref(), Some("configmap/seen-elsewhere"));
    let mut replicas = vec![a, b, c];
    let refs: Vec<&Server> = replicas.iter().collect();
    let leader = the_leader(&refs, Duration::from_secs(20));
    let holder = holder_of(refs[0]);
    assert!(!holder.is_empty());
    let follower = (leader + 1) % 3;
    // The member's agent knows every replica and uses the leader's first.
    let urls: Vec<String> = std::iter::once(leader)
        .chain((0..3).filter(|i| *i != leader))
        .map(|i| replicas[i].url.clone())
        .collect();
    let (agent, admin) = sim_member_at(&replicas[leader], &urls.join(","), "m1");
    replicas[follower].apply(&deployment("before"));
    eventually(
        Duration::from_secs(30),
        "before running in the member",
        || member_runs(&admin, "m1", "before"),
    );
    let seen = journal(&admin, "m1", 0).last().map_or(0, |e| e.0);

    // Writers send creates to every replica throughout; each acknowledged one must survive.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        let kubeconfig = replicas[follower].kubeconfig.clone();
        let urls: Vec<String> = replicas.iter().map(|s| s.url.clone()).collect();
        std::thread::spawn(move || {
            let mut acknowledged = Vec::new();
            let mut n = 0;
            while !stop.load(Ordering::Acquire) {
                let name = format!("w-{n}");
                let out = std::process::Command::new("kubectl")
                    .args(["--server", &urls[n % urls.len()], "--request-timeout", "5s"])
                    .args(["create", "configmap", &name, "--from-literal", "k=v"])
                    .env("KUBECONFIG", &kubeconfig)
                    .output()
                    .unwrap();
                if out.status.success() {
                    acknowledged.push(name);
                }
                n += 1;
            }
            acknowledged
        })
    };
    std::thread::sleep(Duration::from_secs(2));
    replicas[leader].kill9();
    let killed_at = Instant::now();
    let survivors: Vec<&Server> = replicas
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != leader)
        .map(|(_, s)| s)
        .collect();
    let next = the_leader(&survivors, Duration::from_secs(30));
    let failover = killed_at.elapsed();
    // Within the lease duration and a few retry periods (a loaded machine is slow to answer).
    assert!(
        failover < LEASE + Duration::from_secs(5),
        "a new leader after {failover:?}"
    );
    let new_holder = holder_of(survivors[0]);
    assert_ne!(new_holder, holder);
    eprintln!("failover took {failover:?}; replica {next} of the survivors leads");
    // The agent lost its replica and moved to another.
    eventually(
        Duration::from_secs(30),
        "the agent on another replica",
        || agent.log().matches(" connected ").count() >= 2,
    );

    // The new leader's controllers place a new Deployment on the member.
    survivors[0].apply(&deployment("after"));
    eventually(
        Duration::from_secs(40),
        "the Deployment made after the failover running in the member",
        || member_runs(&admin, "m1", "after"),
    );
    std::thread::sleep(Duration::from_secs(1));
    // Moving to another replica and the new leader changed nothing in the member: the only
    // operations since are the new Deployment's.
    let since = journal(&admin, "m1", seen);
    assert!(
        since.iter().all(|(_, _, _, name)| name == "after"),
        "operations no decision asked for: {since:?}"
    );
    assert!(agent.log().contains(&replicas[leader].url));
    stop.store(true, Ordering::Release);
    let acknowledged = writer.join().unwrap();
    assert!(
        acknowledged.len() > 10,
        "only {} writes",
        acknowledged.len()
    );
    let listed = survivors[0].ok(&["get", "configmaps", "-o", "name"]);
    for name in &acknowledged {
        assert!(
            listed.contains(&format!("configmap/{name}\n")),
            "acknowledged {name} is gone"
        );
    }
    replicas.clear();
}

/// An upgrade as a StatefulSet rolls it: each replica stopped (SIGTERM) and started again in
/// turn, under a write load sent to every replica and with a member placed: no acknowledged
/// write lost, no operation in the member, and no client error but the retryable ones (503,
/// 429) or the refused connection of the replica that is down (which a Service's endpoints
/// leave out).
#[test]
fn a_rolling_restart_of_the_replicas_loses_no_write_and_moves_nothing() {
    let etcd = EtcdCluster::start(3).unwrap();
    let mut replicas = vec![
        replica(&etcd, &[]),
        replica(&etcd, &[]),
        replica(&etcd, &[]),
    ];
    let urls: Vec<String> = replicas.iter().map(|s| s.url.clone()).collect();
    let (_agent, admin) = sim_member_at(&replicas[0], &urls.join(","), "m1");
    replicas[1].apply(&deployment("steady"));
    eventually(
        Duration::from_secs(30),
        "steady running in the member",
        || member_runs(&admin, "m1", "steady"),
    );
    std::thread::sleep(Duration::from_secs(2));
    let seen = journal(&admin, "m1", 0).last().map_or(0, |e| e.0);

    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        let kubeconfig = replicas[0].kubeconfig.clone();
        let urls = urls.clone();
        std::thread::spawn(move || {
            let (mut acknowledged, mut refused, mut unexpected) = (Vec::new(), 0, Vec::new());
            let mut n = 0;
            while !stop.load(Ordering::Acquire) {
                let name = format!("r-{n}");
                let out = std::process::Command::new("kubectl")
                    .args(["--server", &urls[n % urls.len()], "--request-timeout", "5s"])
                    .args(["create", "configmap", &name, "--from-literal", "k=v"])
                    .env("KUBECONFIG", &kubeconfig)
                    .output()
                    .unwrap();
                let err = String::from_utf8_lossy(&out.stderr).to_string();
                if out.status.success() {
                    acknowledged.push(name);
                } else if err.contains("connection refused")
                    || err.contains("ServiceUnavailable")
                    || err.contains("TooManyRequests")
                {
                    refused += 1;
                } else if err.contains("AlreadyExists") {
                    // A retried create whose first attempt was committed: acknowledged.
                    acknowledged.push(name);
                } else {
                    unexpected.push(err);
                }
                n += 1;
            }
            (acknowledged, refused, unexpected)
        })
    };
    std::thread::sleep(Duration::from_secs(1));
    for r in &mut replicas {
        assert!(r.terminate(), "a replica stops cleanly on SIGTERM");
        std::thread::sleep(Duration::from_millis(500));
        r.restart();
        std::thread::sleep(Duration::from_secs(2));
    }
    stop.store(true, Ordering::Release);
    let (acknowledged, refused, unexpected) = writer.join().unwrap();
    eprintln!(
        "rolling restart: {} writes acknowledged, {refused} refused while a replica was down",
        acknowledged.len()
    );
    assert!(unexpected.is_empty(), "client errors: {unexpected:?}");
    assert!(
        acknowledged.len() > 10,
        "only {} writes",
        acknowledged.len()
    );
    let refs: Vec<&Server> = replicas.iter().collect();
    the_leader(&refs, Duration::from_secs(30));
    let listed = replicas[2].ok(&["get", "configmaps", "-o", "name"]);
    for name in &acknowledged {
        assert!(
            listed.contains(&format!("configmap/{name}\n")),
            "acknowledged {name} is gone"
        );
    }
    // Placed after the restarts too, and nothing else done in the member meanwhile.
    replicas[0].apply(&deployment("after"));
    eventually(
        Duration::from_secs(40),
        "after running in the member",
        || member_runs(&admin, "m1", "after"),
    );
    std::thread::sleep(Duration::from_secs(1));
    let since = journal(&admin, "m1", seen);
    assert!(
        since.iter().all(|(_, _, _, name)| name == "after"),
        "operations no decision asked for: {since:?}"
    );
}

#[test]
fn a_paused_leader_commits_nothing_when_it_wakes() {
    let etcd = EtcdCluster::start(3).unwrap();
    // The third replica, started once another leads, tries for the Lease once an hour: it
    // only serves, so that the test knows who acts.
    let replicas = [
        replica(&etcd, &[]),
        replica(&etcd, &[]),
        replica_retrying(&etcd, "1h", &[]),
    ];
    let refs: Vec<&Server> = replicas.iter().collect();
    let first = the_leader(&refs[..2], Duration::from_secs(20));
    let (new, api) = (1 - first, 2);
    assert_eq!(leads(&replicas[api]), Some(false));
    let (agent, admin) = sim_member(&replicas[api], "m1");

    // The leader freezes past its lease: the other takes over.
    assert!(signal(replicas[first].pid(), "STOP"));
    eventually(Duration::from_secs(20), "the other replica leading", || {
        leads(&replicas[new]) == Some(true)
    });
    replicas[api].apply(&deployment("one"));
    eventually(
        Duration::from_secs(30),
        "one placed by the new leader",
        || member_runs(&admin, "m1", "one"),
    );

    // Freeze the new leader and the member too, so that nobody but the old leader may write;
    // then give the old leader work (a Deployment to place) and wake it.
    assert!(signal(replicas[new].pid(), "STOP"));
    agent.signal("STOP");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt.block_on(etcd_store(&etcd));
    replicas[api].apply(&deployment("two"));
    let before = rt.block_on(store.current_revision()).unwrap();
    assert!(signal(replicas[first].pid(), "CONT"));
    // Less than the lease duration as the old leader observes it once awake (4 s): it may
    // not take the Lease over in this time, and it must not commit anything as leader.
    std::thread::sleep(Duration::from_secs(3));
    let after = rt.block_on(store.current_revision()).unwrap();
    let changes = rt
        .block_on(orrery_store::History::changes(&store, "/", before, after))
        .unwrap();
    let keys: Vec<&str> = changes.iter().map(|c| c.key()).collect();
    assert!(
        changes.is_empty(),
        "the old leader committed after waking: {keys:?}\nits log:\n{}",
        replicas[first].log()
    );
    assert_eq!(
        leads(&replicas[first]),
        Some(false),
        "the old leader still leads:\n{}",
        replicas[first].log()
    );

    // Everyone back: the Deployment is placed by whoever leads now.
    assert!(signal(replicas[new].pid(), "CONT"));
    agent.signal("CONT");
    eventually(Duration::from_secs(40), "two placed after the thaw", || {
        member_runs(&admin, "m1", "two")
    });
    the_leader(&refs[..2], Duration::from_secs(20));
}

/// A kube client of `s` that does not retry (kube's default client retries a 503 up to 15
/// times, minding Retry-After): what a single request gets.
async fn single_shot(s: &Server) -> kube::Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(&s.kubeconfig).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    config.default_retry = false;
    kube::Client::try_from(config).unwrap()
}

/// A ConfigMap create through a client that does not retry: status, Retry-After, and how
/// long it took.
async fn create_configmap(c: &kube::Client, name: &str) -> (u16, Option<String>, Duration) {
    let started = Instant::now();
    let (code, headers, _) = common::send(
        c,
        common::req(
            "POST",
            "/api/v1/namespaces/default/configmaps",
            "application/json",
            serde_json::json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name}, "data": {"k": "v"},
            }),
        ),
        None,
    )
    .await;
    let retry = headers
        .get("Retry-After")
        .map(|v| v.to_str().unwrap().to_string());
    (code, retry, started.elapsed())
}

async fn get_namespaces(c: &kube::Client) -> (u16, Option<String>) {
    let (code, headers, _) = common::send(
        c,
        common::req(
            "GET",
            "/api/v1/namespaces",
            "application/json",
            serde_json::Value::Null,
        ),
        None,
    )
    .await;
    let warning = headers
        .get("Warning")
        .map(|v| v.to_str().unwrap().to_string());
    (code, warning)
}

async fn readyz(c: &kube::Client) -> u16 {
    common::send(
        c,
        common::req(
            "GET",
            "/readyz",
            "application/json",
            serde_json::Value::Null,
        ),
        None,
    )
    .await
    .0
}

#[test]
fn etcd_losing_one_member_serves_losing_quorum_fails_fast_then_recovers() {
    let mut etcd = EtcdCluster::start(3).unwrap();
    let a = replica(&etcd, &[]);
    let b = replica(&etcd, &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (ca, cb) = rt.block_on(async { (single_shot(&a).await, single_shot(&b).await) });
    let mut n = 0;
    let mut next = || {
        n += 1;
        format!("cm-{n}")
    };

    // One member lost: both replicas go on taking writes (a call in flight on the lost
    // member may fail; the next goes to another).
    etcd.kill9(0);
    for c in [&ca, &cb] {
        let mut ok = 0;
        let deadline = Instant::now() + Duration::from_secs(15);
        while ok < 5 {
            assert!(
                Instant::now() < deadline,
                "writes failing with one member lost"
            );
            if rt.block_on(create_configmap(c, &next())).0 == 201 {
                ok += 1;
            }
        }
        assert_eq!(rt.block_on(readyz(c)), 200);
    }

    // Quorum lost: writes fail within 5 s with 503 and Retry-After; reads are served and
    // say they may be stale; the replicas are not ready.
    etcd.kill9(1);
    std::thread::sleep(Duration::from_secs(3));
    for c in [&ca, &cb] {
        let (code, retry, took) = rt.block_on(create_configmap(c, &next()));
        assert_eq!(code, 503, "a write without quorum");
        assert!(retry.is_some(), "503 without Retry-After");
        assert!(took < Duration::from_secs(5), "the write took {took:?}");
        let (code, warning) = rt.block_on(get_namespaces(c));
        assert_eq!(code, 200);
        let warning = warning.expect("a read without quorum says it may be stale");
        assert!(warning.contains("stale"), "{warning}");
        assert_eq!(rt.block_on(readyz(c)), 503);
    }
    eventually(
        Duration::from_secs(15),
        "no replica leading without quorum",
        || leads(&a) == Some(false) && leads(&b) == Some(false),
    );

    // Quorum back: everything resumes by itself.
    etcd.restart(1, true).unwrap();
    etcd.restart(0, true).unwrap();
    for c in [&ca, &cb] {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (code, ..) = rt.block_on(create_configmap(c, &next()));
            if code == 201 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "writes still fail after quorum returned: {code}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        let (code, warning) = rt.block_on(get_namespaces(c));
        assert_eq!((code, warning), (200, None));
        assert_eq!(rt.block_on(readyz(c)), 200);
    }
    the_leader(&[&a, &b], Duration::from_secs(30));
    let (_agent, admin) = sim_member(&a, "m1");
    b.apply(&deployment("after"));
    eventually(
        Duration::from_secs(30),
        "a Deployment placed after recovery",
        || member_runs(&admin, "m1", "after"),
    );
}

/// `orrery up --ha`: three etcd members and three replicas, one leading; another leads when
/// the leading replica's process is killed, and Ctrl-C leaves nothing running.
#[test]
fn orrery_up_ha_runs_three_replicas_on_three_etcd_members() {
    use std::io::BufRead;

    let dir = tempfile::tempdir().unwrap();
    // Port 0: each replica binds a free port of its own (three consecutive ports chosen here
    // could be taken by another test's connection before the replicas bind them).
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_orrery"))
        .args(["up", "--ha", "--clusters", "2", "--data-dir"])
        .arg(dir.path())
        .args(["--listen", "127.0.0.1:0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(dir.path().join("up.log")).unwrap())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut said = Vec::new();
    for l in lines.by_ref() {
        let l = l.unwrap();
        let done = l.starts_with("Ctrl-C stops everything");
        said.push(l);
        if done {
            break;
        }
    }
    std::thread::spawn(move || for _ in lines {});
    let text = said.join("\n");
    let logs = || {
        ["up.log", "replica-0.log", "replica-1.log", "replica-2.log"]
            .iter()
            .map(|f| {
                let log = std::fs::read_to_string(dir.path().join(f)).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(30).collect();
                format!(
                    "--- {f}:\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(text.contains("etcd: 3 members at"), "{text}\n{}", logs());
    assert!(
        text.contains("three control-plane replicas"),
        "{text}\n{}",
        logs()
    );
    let kubeconfig = dir.path().join("replica-0/admin.kubeconfig");
    let holder = || lease_holder(&kubeconfig, dir.path()).unwrap_or_default();
    eventually(Duration::from_secs(20), "a leader", || !holder().is_empty());
    let first = holder();
    // Kill the leading replica's process: another takes the Lease.
    let pid = |i: usize| -> Option<u32> {
        let out = std::process::Command::new("pgrep")
            .args(["-f", &format!("{}/replica-{i} ", dir.path().display())])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
    };
    let leading = (0..3)
        .find(|i| {
            let log = std::fs::read_to_string(dir.path().join(format!("replica-{i}.log")))
                .unwrap_or_default();
            log.contains("became leader") && log.contains(&first)
        })
        .expect("the leader's log");
    signal(pid(leading).expect("the leader's pid"), "KILL");
    let other = (leading + 1) % 3;
    let kubeconfig_other = dir.path().join(format!("replica-{other}/admin.kubeconfig"));
    eventually(Duration::from_secs(40), "another replica leading", || {
        lease_holder(&kubeconfig_other, dir.path()).is_some_and(|h| !h.is_empty() && h != first)
    });
    signal(child.id(), "INT");
    let status = child.wait().unwrap();
    assert!(status.success(), "orrery up exited with {status}");
    let left = std::process::Command::new("pgrep")
        .args(["-f", &dir.path().display().to_string()])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&left.stdout).trim().is_empty(),
        "processes left running: {}",
        String::from_utf8_lossy(&left.stdout)
    );
}

/// A Deployment's `spec.replicas` in the member, if it runs it.
fn member_replicas(admin: &str, cluster: &str, name: &str) -> Option<i64> {
    let (code, body) = http("GET", admin, &format!("/clusters/{cluster}/objects"), "");
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["items"]
        .as_array()?
        .iter()
        .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == name)
        .and_then(|o| o["spec"]["replicas"].as_i64())
}

/// The servers of the partition tests: the member turns not Ready soon, and nothing is moved
/// off it for the test's length.
const CUT_OFF: [&str; 4] = [
    "--cluster-grace-period",
    "3s",
    "--cluster-eviction-timeout",
    "1h",
];

/// A partition between a member's agent and every server replica (a loopback proxy that
/// stops passing bytes: see `common::proxy`): the member keeps running what it has, nothing in
/// it is undone, and once the partition heals it converges to what changed meanwhile.
#[test]
fn a_member_cut_off_from_the_servers_keeps_running_and_converges_after() {
    use common::proxy::Partition;

    let etcd = EtcdCluster::start(3).unwrap();
    let a = replica(&etcd, &CUT_OFF);
    let b = replica(&etcd, &CUT_OFF);
    let links: Vec<Partition> = [&a, &b]
        .iter()
        .map(|s| Partition::to(std::net::SocketAddr::from(([127, 0, 0, 1], s.port))))
        .collect();
    let urls: Vec<String> = links.iter().map(Partition::url).collect();
    let (_agent, admin) = sim_member_at(&a, &urls.join(","), "m1");
    // The proxy cuts the agent's links to the servers only: its admin endpoint still answers.
    cut_off_and_back(
        &a,
        &admin,
        || links.iter().for_each(Partition::cut),
        || links.iter().for_each(Partition::heal),
        true,
    );
}

/// The same partition made of a real link: the agent runs in a network namespace joined to
/// the servers by a veth pair (`common::netns`), and the namespace's end is taken down, so
/// packets are dropped both ways with no reset from anyone. The member keeps running what it
/// has, does nothing while cut off, and converges once the link is back. Skipped, saying why,
/// where a network namespace cannot be made (not root, no `ip`).
#[test]
fn a_member_behind_a_veth_pair_taken_down_keeps_running_and_converges_after() {
    let ns = match common::netns::Netns::make() {
        Ok(ns) => ns,
        Err(why) => {
            eprintln!(
                "skipped: no network namespace can be made here ({why}); \
                 a_member_cut_off_from_the_servers_keeps_running_and_converges_after covers the \
                 same behaviour through a loopback proxy"
            );
            return;
        }
    };
    let etcd = EtcdCluster::start(3).unwrap();
    let a = replica_on(&etcd, &ns.host_ip, "500ms", &CUT_OFF);
    let b = replica_on(&etcd, &ns.host_ip, "500ms", &CUT_OFF);
    let (_agent, admin) = sim_member_wrapped(
        &a,
        &format!("{},{}", a.url, b.url),
        "m1",
        &format!("{}:0", ns.ns_ip),
        ns.wrap(),
    );
    // The link down, the member's admin endpoint is out of reach too.
    cut_off_and_back(&a, &admin, || ns.cut(), || ns.heal(), false);
}

/// Places web in the member, cuts the member off from the servers with `cut`, scales web
/// meanwhile, and checks that the member kept running what it had, did nothing while cut off
/// (read then if its admin endpoint is `reachable_while_cut`, else from its journal once the
/// link is back), and after `heal` converged by updating web and nothing else.
fn cut_off_and_back(
    a: &Server,
    admin: &str,
    cut: impl Fn(),
    heal: impl Fn(),
    reachable_while_cut: bool,
) {
    a.apply(&deployment("web"));
    eventually(Duration::from_secs(30), "web running in the member", || {
        member_replicas(admin, "m1", "web") == Some(3)
    });
    let seen = journal(admin, "m1", 0).last().map_or(0, |e| e.0);

    cut();
    eventually(Duration::from_secs(30), "the member not Ready", || {
        let ready = a.cluster_condition("m1", "Ready");
        !ready.is_empty() && ready != "True"
    });
    // A change made while the member cannot hear of it.
    a.ok(&["scale", "deployment", "web", "--replicas", "5"]);
    std::thread::sleep(Duration::from_secs(3));
    if reachable_while_cut {
        assert_eq!(member_replicas(admin, "m1", "web"), Some(3));
        assert!(
            journal(admin, "m1", seen).is_empty(),
            "the member did something while cut off"
        );
    }

    heal();
    // A neighbour entry that failed during the cut refuses the first attempts at once.
    eventually(Duration::from_secs(30), "the link back", || {
        std::net::TcpStream::connect(admin).is_ok()
    });
    eventually(
        Duration::from_secs(60),
        "the member converged after the partition",
        || {
            member_replicas(admin, "m1", "web") == Some(5)
                && a.cluster_condition("m1", "Ready") == "True"
        },
    );
    // Converging was updating web, nothing else: nothing was deleted or made again, while
    // cut off or after.
    let since = journal(admin, "m1", seen);
    assert!(
        since
            .iter()
            .all(|(_, op, kind, name)| op == "update" && kind == "Deployment" && name == "web"),
        "{since:?}"
    );
}

/// The cluster proxy through any replica: the member's agent keeps its tunnel to one replica,
/// which records itself as the holder (Lease `orrery-system/proxy-<cluster>`); another replica
/// forwards `get pods` and an upgraded `exec` to it.
#[test]
fn the_cluster_proxy_reaches_a_member_through_a_replica_it_is_not_connected_to() {
    let etcd = EtcdCluster::start(1).unwrap();
    let a = replica(&etcd, &[]);
    let b = replica(&etcd, &[]);
    let (agent, _) = sim_member(&a, "m");
    a.apply(&deployment("web"));
    eventually(Duration::from_secs(30), "web running in m", || {
        a.get_json(&["deployment", "web", "-n", "default", "-o", "json"])["status"]["readyReplicas"]
            == 3
    });
    // The holder record, as b serves it.
    let record = |jsonpath: &str| {
        let out = on(
            &a,
            &b,
            &[
                "get",
                "lease",
                "proxy-m",
                "-n",
                "orrery-system",
                "-o",
                &format!("jsonpath={jsonpath}"),
            ],
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    eventually(
        Duration::from_secs(20),
        "the tunnel's holder recorded",
        || record("{.spec.holderIdentity}") == a.url,
    );
    // Owned by the Cluster, so a record no replica removed goes with it.
    assert_eq!(
        record("{.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}"),
        "Cluster/m"
    );

    // get pods, asked of b.
    let path = "/apis/multicluster.io/v1alpha1/clusters/m/proxy/api/v1/namespaces/default/pods";
    let mut pods = serde_json::Value::Null;
    eventually(Duration::from_secs(20), "m's pods through b", || {
        let out = on(&a, &b, &["get", "--raw", path]);
        pods = serde_json::from_slice(&out.stdout).unwrap_or_default();
        out.status.success() && pods["items"].as_array().is_some_and(|i| i.len() == 3)
    });
    let pod = pods["items"][0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();

    // exec, an upgraded stream, asked of b with a kubeconfig for m's proxy there.
    let kc = a.dir.join("m-via-b.kubeconfig");
    common::cluster_kubeconfig(&a.kubeconfig, "m", &kc);
    let home = a.dir.join("exec-home");
    std::fs::create_dir_all(&home).unwrap();
    let out = std::process::Command::new("kubectl")
        .args([
            "--server",
            &format!("{}/apis/multicluster.io/v1alpha1/clusters/m/proxy", b.url),
        ])
        .args(["exec", "-n", "default", &pod, "--", "echo", "through", "b"])
        .env("KUBECONFIG", &kc)
        .env("HOME", &home)
        .env("KUBECACHEDIR", &home)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "through b\n");

    // A member with no tunnel anywhere: b answers 503 and does not forward.
    let out = on(
        &a,
        &b,
        &[
            "get",
            "--raw",
            "/apis/multicluster.io/v1alpha1/clusters/nowhere/proxy/api",
        ],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cluster nowhere has no tunnel to this server"),
        "{err}"
    );

    // The agent gone, its tunnel closes and a forgets being its holder.
    drop(agent);
    eventually(Duration::from_secs(20), "the holder record removed", || {
        let out = on(&a, &b, &["get", "lease", "proxy-m", "-n", "orrery-system"]);
        String::from_utf8_lossy(&out.stderr).contains("NotFound")
    });
}
