//! Rotation: the serving certificate is issued again before it expires and served without a
//! restart, while agents stay connected.
#![allow(clippy::unwrap_used)]

mod common;

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
    assert!(f.s.log().contains("renewed the serving certificate"));
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
