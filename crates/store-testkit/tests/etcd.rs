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

/// Lists larger than one etcd range page (1,000 keys) come whole and in order, with and
/// without a limit, at one revision.
#[test]
fn lists_span_several_etcd_pages() {
    use orrery_store::ListOptions;
    use orrery_store_testkit::Harness;

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let h = orrery_store_testkit::EtcdHarness::new();
        let store = h.open().await;
        for i in 0..2_500 {
            let mut o = orrery_store::stamp::new_object(
                "v1",
                "ConfigMap",
                Some("big"),
                &format!("c{i:05}"),
            );
            o.other
                .insert("data".into(), serde_json::json!({"i": i.to_string()}));
            store
                .create(&format!("/registry/core/configmaps/big/c{i:05}"), o)
                .await
                .unwrap();
        }
        let all = store
            .list("/registry/core/configmaps/big/", &ListOptions::default())
            .await
            .unwrap();
        assert_eq!(all.items.len(), 2_500);
        assert!(all.continue_token.is_none());
        let names: Vec<&str> = all.items.iter().map(|o| o.name()).collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);
        // Pages of 1,500 at the first page's revision.
        let mut opts = ListOptions {
            limit: Some(1_500),
            ..Default::default()
        };
        let first = store
            .list("/registry/core/configmaps/big/", &opts)
            .await
            .unwrap();
        assert_eq!(first.items.len(), 1_500);
        opts.continue_token = first.continue_token.clone();
        assert!(opts.continue_token.is_some());
        let second = store
            .list("/registry/core/configmaps/big/", &opts)
            .await
            .unwrap();
        assert_eq!(second.items.len(), 1_000);
        assert!(second.continue_token.is_none());
        assert_eq!(first.revision, second.revision);
        assert_eq!(second.items[0].name(), "c01500");
    });
}

/// Two stores on one etcd, as two replicas: each starts a read-modify-write on what it wrote
/// last (`get_recent`, `get_copy`), and that copy follows the other replica's writes and
/// deletes through its feed; a write conditional on a copy that missed one fails and writes
/// nothing.
#[test]
fn recent_reads_follow_other_replicas() {
    use orrery_store::{Preconditions, StoreError};
    use orrery_store_testkit::Harness;

    let rev = |o: &orrery_api::Object| o.revision().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let server = std::sync::Arc::new(orrery_store_testkit::etcd::EtcdServer::start().unwrap());
        let h = orrery_store_testkit::EtcdHarness::shared(server.clone(), "/recent");
        let (a, b) = (h.open().await, h.open().await);
        let key = "/registry/core/configmaps/default/c";
        let made = a.create(key, config(1)).await.unwrap();
        // Its own write, at once, both ways.
        assert_eq!(rev(&a.get_recent(key).await.unwrap()), rev(&made));
        assert_eq!(rev(&a.get_copy(key).await.unwrap()), rev(&made));
        // A write is kept when its answer comes before the feed's event of it, which is
        // nearly always; a few writes make sure of one.
        let mut updated = made;
        for n in 2..7 {
            updated = a.update(key, config(n), Some(rev(&updated))).await.unwrap();
        }
        assert_eq!(rev(&a.get_recent(key).await.unwrap()), rev(&updated));
        // Kept: with etcd paused, both reads still answer, from the store's own copy.
        let signal = |sig: &str| {
            let ok = std::process::Command::new("kill")
                .args([sig, &server.pid().to_string()])
                .status()
                .unwrap()
                .success();
            assert!(ok, "kill {sig}");
        };
        signal("-STOP");
        let during = tokio::time::timeout(std::time::Duration::from_secs(3), async {
            (a.get_recent(key).await, a.get_copy(key).await)
        })
        .await;
        signal("-CONT");
        let (recent, copy) = during.expect("the reads answer without etcd");
        assert_eq!(rev(&recent.unwrap()), rev(&updated));
        assert_eq!(rev(&copy.unwrap()), rev(&updated));

        // The other replica writes: `a` may read its own last write for a moment (a write on
        // it fails as a conflict and writes nothing), then reads the other's.
        let other = b.update(key, config(3), Some(rev(&updated))).await.unwrap();
        let stale = a.get_recent(key).await.unwrap();
        if rev(&stale) != rev(&other) {
            assert_eq!(rev(&stale), rev(&updated));
            assert!(matches!(
                a.update(key, config(9), Some(rev(&stale))).await,
                Err(StoreError::Conflict { .. })
            ));
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while rev(&a.get_recent(key).await.unwrap()) != rev(&other) {
            assert!(
                std::time::Instant::now() < deadline,
                "a's copy never followed b's write"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(rev(&a.get_copy(key).await.unwrap()), rev(&other));
        assert_eq!(b.get(key).await.unwrap().other["data"]["n"], "3");

        // The other replica deletes it: `a`'s copy goes, and a write on a copy that still
        // showed it finds nothing to update.
        let last = a.update(key, config(4), Some(rev(&other))).await.unwrap();
        b.delete(key, &Preconditions::default()).await.unwrap();
        match a.update(key, config(5), Some(rev(&last))).await {
            Err(StoreError::NotFound { .. }) => {}
            r => panic!("an update of a deleted object: {r:?}"),
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            match a.get_recent(key).await {
                Err(e) if e.is_not_found() => break,
                Ok(o) => assert_eq!(rev(&o), rev(&last), "only what was written"),
                Err(e) => panic!("{e:?}"),
            }
            assert!(
                std::time::Instant::now() < deadline,
                "a's copy outlived b's delete"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(a.get(key).await.unwrap_err().is_not_found());

        // Recreated by the other under the same name: `a` follows only what it wrote or
        // keeps, so it reads the new object from etcd.
        let again = b.create(key, config(6)).await.unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while a.get_recent(key).await.map(|o| rev(&o)).ok() != Some(rev(&again)) {
            assert!(
                std::time::Instant::now() < deadline,
                "a never read the new object"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        // `a` deletes it itself: its own delete is forgotten at once.
        a.delete(key, &Preconditions::default()).await.unwrap();
        assert!(a.get_recent(key).await.unwrap_err().is_not_found());
        assert!(a.get_copy(key).await.unwrap_err().is_not_found());
    });
}
