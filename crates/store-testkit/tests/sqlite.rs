//! The conformance suite on the SQLite backend.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed test

orrery_store_testkit::store_conformance_tests!(orrery_store_testkit::SqliteHarness::new());

/// The store against the model: thousands of random sequences, with restarts; in two halves
/// of 1,000 (each with its own seed) so that they run side by side.
fn sqlite_model(name: &'static str) {
    orrery_store_testkit::model::check(
        orrery_store_testkit::model::ModelTest {
            name,
            cases: 1000,
            max_steps: 60,
            crash: false,
        },
        |n| {
            // Every step size, from one version per step up.
            orrery_store_testkit::SqliteHarness::in_memory_fs()
                .with_compaction_step(1 + (n as usize % 9))
        },
    );
}

#[test]
fn sqlite_follows_the_model() {
    sqlite_model("sqlite");
}

#[test]
fn sqlite_follows_the_model_second_half() {
    sqlite_model("sqlite-second-half");
}

/// The same with writer processes killed with SIGKILL in the middle of concurrent writes.
#[test]
fn sqlite_follows_the_model_across_kill_9() {
    orrery_store_testkit::model::check(
        orrery_store_testkit::model::ModelTest {
            name: "sqlite-kill-9",
            cases: 200,
            max_steps: 40,
            crash: true,
        },
        |n| {
            orrery_store_testkit::SqliteHarness::in_memory_fs()
                .with_compaction_step(1 + (n as usize % 5))
                .with_crash_writer(env!("CARGO_BIN_EXE_store-writer"))
        },
    );
}

fn payload(o: &orrery_api::Object) -> String {
    o.other["data"]["payload"].as_str().unwrap().to_string()
}

fn with_payload(mut o: orrery_api::Object, p: &str) -> orrery_api::Object {
    o.other
        .insert("data".into(), serde_json::json!({ "payload": p }));
    o
}

/// A read-modify-write that starts on a lagging copy (`Store::get_recent`, as an etcd member
/// behind its leader answers) acts on the object as it is: `update_with` reads again when the
/// copy turns out old, and when the change is none on the copy.
#[tokio::test]
async fn update_with_on_a_lagging_copy_acts_on_the_current_object() {
    use orrery_store_testkit::Harness;
    use std::sync::atomic::Ordering;
    let h = orrery_store_testkit::SqliteHarness::new();
    let s = h.open().await;
    let lag = orrery_store_testkit::lagging::Lagging::new(s.clone());
    let key = "/t/ns/c";
    let c = s
        .create(key, orrery_store_testkit::object("c", "web", "0"))
        .await
        .unwrap();
    lag.hold(key).await;
    s.update(key, with_payload((*c).clone(), "1"), None)
        .await
        .unwrap();

    // An increment: on the held copy it would write 1 again.
    let done = orrery_store::update_with(&lag, key, |o| {
        let n: u64 = payload(&o).parse().unwrap();
        Ok(Some(with_payload(o, &(n + 1).to_string())))
    })
    .await
    .unwrap();
    assert_eq!(payload(&done), "2");
    assert_eq!(lag.lagged_reads.load(Ordering::Relaxed), 1);

    // Setting 0, which the held copy already says: not skipped as a change of nothing.
    let done = orrery_store::update_with(&lag, key, |o| {
        Ok((payload(&o) != "0").then(|| with_payload(o, "0")))
    })
    .await
    .unwrap();
    assert_eq!(payload(&done), "0");
    assert_eq!(payload(&s.get(key).await.unwrap()), "0");
    assert_eq!(lag.lagged_reads.load(Ordering::Relaxed), 2);

    // A key the copy does not have yet: read again, found.
    let key2 = "/t/ns/new";
    lag.hold(key2).await;
    s.create(key2, orrery_store_testkit::object("new", "web", "5"))
        .await
        .unwrap();
    let done = orrery_store::update_with(&lag, key2, |o| Ok(Some(with_payload(o, "6"))))
        .await
        .unwrap();
    assert_eq!(payload(&done), "6");
}
