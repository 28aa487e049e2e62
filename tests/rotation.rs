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
