//! Rotation: the serving certificate is issued again before it expires and served without a
//! restart, while agents stay connected; cluster tokens expire and agents renew theirs; the CA
//! rotates in two steps that agents follow without registering again.

use crate::common;

use std::time::{Duration, Instant};

use common::eventually;
use common::fleet::Fleet;

#[test]
fn the_serving_certificate_renews_itself_without_a_restart_or_a_dropped_agent() {
    let started = Instant::now();
    let f = Fleet::start_with(&[("m1", "r1")], &["--tls-cert-validity", "12s"]);
    let crt = f.s.dir.join("tls/server.crt");
    let first = std::fs::read_to_string(&crt).unwrap();
    eventually(Duration::from_secs(30), "m1 Ready", || {
        f.s.cluster_condition("m1", "Ready") == "True"
    });
    eventually(Duration::from_secs(20), "a renewed certificate", || {
        std::fs::read_to_string(&crt).unwrap() != first
    });
    // The file is written a moment before the new certificate is served and said so.
    eventually(Duration::from_secs(10), "the renewal served", || {
        f.s.log().contains("renewed the serving certificate")
    });
    // Past the first certificate's expiry, new connections are served with the new one.
    let left = Duration::from_secs(14).saturating_sub(started.elapsed());
    std::thread::sleep(left);
    f.s.ok(&["get", "clusters"]);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(f.s.cluster_condition("m1", "Ready"), "True");
    let (_, agent, _) = &f.agents[0];
    assert_eq!(
        agent.log().matches(" connected ").count(),
        1,
        "the agent kept its session: {}",
        agent.log()
    );
}

fn state_token(f: &Fleet) -> String {
    let (_, agent, _) = &f.agents[0];
    let s: serde_json::Value =
        serde_json::from_slice(&std::fs::read(agent.dir.join("state/state.json")).unwrap())
            .unwrap();
    s["token"].as_str().unwrap().to_string()
}

/// Cluster tokens expire (`--cluster-token-ttl`); the agent renews its own a third of the
/// way ahead, keeps the new one in its state, and goes on serving its member with no
/// operation in it; the token it renewed stops working when it expires.
#[test]
fn cluster_tokens_expire_and_the_agent_renews_its_own() {
    let f = Fleet::start_with(&[("m1", "r1")], &["--cluster-token-ttl", "9s"]);
    eventually(Duration::from_secs(30), "m1 Ready", || {
        f.s.cluster_condition("m1", "Ready") == "True"
    });
    let first = state_token(&f);
    let admin = f.admin("m1").to_string();
    let journal = || -> usize {
        let (_, body) = common::http("GET", &admin, "/clusters/m1/journal", "");
        let j: serde_json::Value = serde_json::from_str(&body).unwrap();
        j["items"].as_array().unwrap().len()
    };
    let ops = journal();
    let (_, agent, _) = &f.agents[0];
    eventually(Duration::from_secs(30), "two renewals", || {
        agent.log().matches("renewed the cluster token").count() >= 2
    });
    assert_ne!(state_token(&f), first, "the new token is kept");
    // The first token is past its expiry: refused.
    let out = f.s.kubectl(&[
        "--token",
        &first,
        "get",
        "--raw",
        "/api/v1/namespaces/orrery-cluster-m1",
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Unauthorized"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(f.s.cluster_condition("m1", "Ready"), "True");
    assert_eq!(journal(), ops, "renewing moved nothing in the member");
    // And the agent still carries out what is decided.
    f.s.apply(&common::divided_deployment(
        "after-renewal",
        1,
        "{cpu: 100m}",
        "",
    ));
    eventually(Duration::from_secs(30), "placed after the renewals", || {
        f.find("m1", "Deployment", "after-renewal").is_some()
    });
    // Only an agent's own token renews.
    let refused =
        f.s.fails_stdin(&["create", "--raw", "/agent/v1/renew", "-f", "-"], "{}");
    assert!(
        refused.contains("only a cluster's agent renews"),
        "{refused}"
    );
}

fn certificates(pem: &str) -> usize {
    pem.matches("-----BEGIN CERTIFICATE-----").count()
}

/// The CA rotates in two steps while a fleet runs: staged, it is trusted beside the old one
/// and agents learn the bundle over their verified connection (one registered with a token
/// minted before the stage too); the switch is refused while a cluster could not follow, and
/// once done the server signs with the new CA, the old one is trusted no more, kubectl goes on
/// with the kubeconfig the server rewrote, and every agent keeps its cluster token and its
/// member untouched.
#[test]
fn the_ca_rotates_in_two_steps_that_agents_follow_without_registering_again() {
    let sims: Vec<(&str, &str, &str)> = [("m1", "r1"), ("m2", "r2")]
        .iter()
        .map(|(n, r)| (*n, *r, common::fleet::SIM))
        .collect();
    let mut f = Fleet::start_full(&sims, &[], &["--ca-refresh-interval", "1s"]);
    let old = f.s.ok(&["get", "--raw", "/cacerts"]);
    assert_eq!(certificates(&old), 1);
    let old_kubeconfig = f.s.dir.join("before-rotation.kubeconfig");
    std::fs::copy(&f.s.kubeconfig, &old_kubeconfig).unwrap();
    let early_token = f.s.token("m3");
    let mut seen = std::collections::BTreeMap::new();
    f.journals(&mut seen);

    let out = f.s.orrery(&["ca", "switch"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no CA is staged"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Step 1.
    f.s.orrery_ok(&["ca", "stage"]);
    let bundle = f.s.ok(&["get", "--raw", "/cacerts"]);
    assert_eq!(certificates(&bundle), 2, "old and new: {bundle}");
    assert!(bundle.starts_with(&old), "the signing CA first");
    let staged = bundle[old.len()..].to_string();
    // The serving certificate is still the old CA's: the copy of the old kubeconfig works.
    let out = f.s.kubectl(&[
        "--kubeconfig",
        old_kubeconfig.to_str().unwrap(),
        "get",
        "clusters",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A token minted before the stage pins the old CA alone: its agent registers, trusting
    // that, and learns the rest over its verified connection.
    let m3 = common::Agent::start(
        &f.s,
        "m3",
        &[
            "--cluster",
            "m3",
            "--token",
            &early_token,
            "--simulate",
            common::fleet::SIM,
            "--heartbeat-interval",
            "1s",
            "--ca-refresh-interval",
            "1s",
            "--admin-listen",
            "127.0.0.1:0",
        ],
    );
    let m3_admin = m3.admin();
    f.agents.push(("m3".into(), m3, m3_admin));
    let hash = |c: &str| -> String {
        f.s.get_json(&["cluster", c])["status"]["caBundleHash"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    let want = orrery_api::token::ca_hash(&bundle);
    eventually(
        Duration::from_secs(30),
        "every agent trusting the bundle",
        || ["m1", "m2", "m3"].iter().all(|c| hash(c) == want),
    );
    f.journals(&mut seen);

    // A cluster that could not follow (registered, never connected) holds the switch back.
    f.s.apply(
        "apiVersion: multicluster.io/v1alpha1\nkind: Cluster\nmetadata:\n  name: ghost\nspec: {}\n",
    );
    let out = f.s.orrery(&["ca", "switch"]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success());
    assert!(
        err.contains("not connected") && err.contains("ghost"),
        "{err}"
    );
    f.s.ok(&["delete", "cluster", "ghost"]);

    // Step 2.
    f.s.orrery_ok(&["ca", "switch"]);
    let now = f.s.ok(&["get", "--raw", "/cacerts"]);
    assert_eq!(now, staged, "the new CA alone");
    // The server's kubeconfig was rewritten for it; the old one's CA is trusted no more.
    f.s.ok(&["get", "clusters"]);
    let out = f.s.kubectl(&[
        "--kubeconfig",
        old_kubeconfig.to_str().unwrap(),
        "get",
        "clusters",
    ]);
    assert!(
        !out.status.success(),
        "the old CA no longer verifies the server"
    );
    let want = orrery_api::token::ca_hash(&staged);
    eventually(
        Duration::from_secs(30),
        "every agent trusting the new CA alone",
        || ["m1", "m2", "m3"].iter().all(|c| hash(c) == want),
    );
    // Agents carry on with their tokens, across a restart too.
    assert!(f.s.terminate());
    f.s.restart();
    f.s.apply(&common::divided_deployment(
        "after-rotation",
        3,
        "{cpu: 100m}",
        "",
    ));
    let binding = "after-rotation-deployment";
    eventually(Duration::from_secs(40), "the binding", || {
        f.s.kubectl(&["get", "resourcebinding", binding, "-n", "default"])
            .status
            .success()
    });
    eventually(Duration::from_secs(40), "placed after the rotation", || {
        let placed = f.clusters_of(binding);
        !placed.is_empty()
            && placed
                .iter()
                .all(|(c, _)| f.find(c, "Deployment", "after-rotation").is_some())
    });
    for (name, agent, _) in &f.agents {
        assert_eq!(
            agent.log().matches(" registered ").count(),
            1,
            "{name} registered once: {}",
            agent.log()
        );
        assert!(
            !agent.log().contains("refusing to trust"),
            "{}",
            agent.log()
        );
    }
    let moved: Vec<_> = f
        .journals(&mut seen)
        .into_iter()
        .filter(|(_, e)| !e.to_string().contains("after-rotation"))
        .collect();
    assert!(moved.is_empty(), "the rotation moved nothing: {moved:?}");
}
