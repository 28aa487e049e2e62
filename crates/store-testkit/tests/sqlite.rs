//! The conformance suite on the SQLite backend.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed test

orrery_store_testkit::store_conformance_tests!(orrery_store_testkit::SqliteHarness::new());

/// The store against the model: thousands of random sequences, with restarts.
#[test]
fn sqlite_follows_the_model() {
    orrery_store_testkit::model::check(
        orrery_store_testkit::model::ModelTest {
            name: "sqlite",
            cases: 2000,
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
