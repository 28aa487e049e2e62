//! The conformance suite on a real etcd (Debian's `etcd-server`, started on loopback ports).
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed test
#![cfg(feature = "etcd")]

orrery_store_testkit::store_conformance_tests!(orrery_store_testkit::EtcdHarness::new());
