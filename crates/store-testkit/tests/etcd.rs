//! The conformance suite on a real etcd (Debian's `etcd-server`, started on loopback ports).
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed test

orrery_store_testkit::store_conformance_tests!(orrery_store_testkit::EtcdHarness::new());

/// The store against the model on one etcd, each sequence under its own prefix.
#[test]
fn etcd_follows_the_model() {
    let server = std::sync::Arc::new(orrery_store_testkit::etcd::EtcdServer::start().unwrap());
    orrery_store_testkit::model::check(
        orrery_store_testkit::model::ModelTest {
            name: "etcd",
            cases: 300,
            max_steps: 40,
            crash: false,
        },
        |n| orrery_store_testkit::EtcdHarness::shared(server.clone(), format!("/model-{n}")),
    );
}
