//! The conformance suite on the SQLite backend.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed test

orrery_store_testkit::store_conformance_tests!(orrery_store_testkit::SqliteHarness::new());
