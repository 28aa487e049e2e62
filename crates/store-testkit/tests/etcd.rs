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

fn lease(holder: &str, transitions: i64) -> orrery_api::Object {
    let mut o = orrery_store::stamp::new_object(
        "coordination.k8s.io/v1",
        "Lease",
        Some("orrery-system"),
        "orrery-controllers",
    );
    o.spec = Some(serde_json::json!({
        "holderIdentity": holder,
        "leaseDurationSeconds": 15,
        "leaseTransitions": transitions,
    }));
    o
}

fn config(n: i64) -> orrery_api::Object {
    let mut o = orrery_store::stamp::new_object("v1", "ConfigMap", Some("default"), "c");
    o.other
        .insert("data".into(), serde_json::json!({ "n": n.to_string() }));
    o
}

/// A fenced view writes while its holder holds the lease, follows the holder's own renewals,
/// and writes nothing once another holder has taken the lease.
#[test]
fn fenced_writes_stop_when_the_lease_changes_hands() {
    use std::sync::Arc;
    use std::sync::atomic::AtomicI64;

    use orrery_store::{Fence, Preconditions, StoreError};
    use orrery_store_testkit::Harness;

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let h = orrery_store_testkit::EtcdHarness::new();
        let store = h.open().await;
        let lease_key = "/registry/coordination.k8s.io/leases/orrery-system/orrery-controllers";
        let taken = store.create(lease_key, lease("a", 0)).await.unwrap();
        let rev: i64 = taken.metadata.resource_version.parse().unwrap();
        let fence = Fence {
            key: lease_key.into(),
            holder: "a".into(),
            transitions: 0,
            revision: Arc::new(AtomicI64::new(rev)),
        };
        let fenced = store.fenced(fence.clone()).expect("etcd fences");
        let key = "/registry/core/configmaps/default/c";
        let made = fenced.create(key, config(1)).await.unwrap();

        // The holder renews: the lease's revision moves, the fence follows it.
        let mut renewed = store.get(lease_key).await.unwrap();
        renewed
            .metadata
            .annotations
            .insert("renew".into(), "1".into());
        store.update(lease_key, renewed, None).await.unwrap();
        let rv: i64 = made.metadata.resource_version.parse().unwrap();
        let updated = fenced.update(key, config(2), Some(rv)).await.unwrap();
        assert!(fence.revision.load(std::sync::atomic::Ordering::Acquire) > rev);

        // A stale expectation of the object's own revision is still a conflict, not a fence.
        assert!(matches!(
            fenced.update(key, config(3), Some(rv)).await,
            Err(StoreError::Conflict { .. })
        ));

        // Another holder takes the lease: no write of the fenced view commits.
        store.update(lease_key, lease("b", 1), None).await.unwrap();
        let before = store.current_revision().await.unwrap();
        let rv: i64 = updated.metadata.resource_version.parse().unwrap();
        assert!(matches!(
            fenced.update(key, config(4), Some(rv)).await,
            Err(StoreError::Fenced { .. })
        ));
        assert!(matches!(
            fenced
                .create("/registry/core/configmaps/default/d", config(5))
                .await,
            Err(StoreError::Fenced { .. })
        ));
        assert!(matches!(
            fenced.delete(key, &Preconditions::default()).await,
            Err(StoreError::Fenced { .. })
        ));
        assert_eq!(store.current_revision().await.unwrap(), before);
        assert_eq!(
            store.get(key).await.unwrap().other["data"]["n"],
            serde_json::json!("2")
        );
        // The same holder in a later term is another fence.
        store.update(lease_key, lease("a", 2), None).await.unwrap();
        assert!(matches!(
            fenced.update(key, config(6), None).await,
            Err(StoreError::Fenced { .. })
        ));
        // The unfenced store writes as ever.
        store.update(key, config(7), None).await.unwrap();
    });
}
