// Test support: a failed unwrap here is a failed test, which is what tests want.
#![allow(clippy::unwrap_used)]

//! Test support for the store: the conformance suite that every backend must pass, a launcher
//! for a real etcd, and helpers shared by store tests and benchmarks.

use std::sync::Arc;

use orrery_api::Object;
use orrery_store::{Store, WatchCacheConfig};

pub mod conformance;
pub mod etcd;

/// Opens one store location, repeatedly (to test restarts).
#[async_trait::async_trait]
pub trait Harness: Send + Sync {
    async fn open(&self) -> Arc<dyn Store>;
}

/// Small watch-cache sizes, so tests exercise history replay and slow-watcher expiry.
pub fn test_watch_config() -> WatchCacheConfig {
    WatchCacheConfig {
        history: 16,
        watcher_buffer: 64,
        narrow_watcher_buffer: 64,
    }
}

/// A ConfigMap-like object with a name, a label and some payload.
pub fn object(name: &str, app: &str, payload: &str) -> Object {
    let mut o = Object::new("v1", "ConfigMap")
        .with_name(name)
        .with_namespace("ns")
        .with_label("app", app);
    o.other
        .insert("data".into(), serde_json::json!({ "payload": payload }));
    o
}

/// A SQLite store in a temporary directory.
#[derive(Debug)]
pub struct SqliteHarness {
    pub dir: tempfile::TempDir,
}

impl SqliteHarness {
    pub fn new() -> Self {
        SqliteHarness {
            dir: tempfile::tempdir().expect("a temporary directory for the test store"),
        }
    }
}

impl Default for SqliteHarness {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait::async_trait]
impl Harness for SqliteHarness {
    async fn open(&self) -> Arc<dyn Store> {
        let mut config = orrery_store_sqlite::SqliteConfig::new(self.dir.path().join("orrery.db"));
        config.watch = test_watch_config();
        config.compaction_step = 7;
        Arc::new(orrery_store_sqlite::SqliteStore::open(config).expect("open the SQLite store"))
    }
}

/// An etcd store on its own etcd server (compaction is global to an etcd, so tests do not
/// share one), under a prefix.
#[cfg(feature = "etcd")]
#[derive(Debug)]
pub struct EtcdHarness {
    pub server: etcd::EtcdServer,
    pub prefix: String,
}

#[cfg(feature = "etcd")]
impl EtcdHarness {
    pub fn new() -> Self {
        EtcdHarness {
            server: etcd::EtcdServer::start().expect("start etcd"),
            prefix: "/orrery-test".into(),
        }
    }
}

#[cfg(feature = "etcd")]
impl Default for EtcdHarness {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(feature = "etcd")]
#[async_trait::async_trait]
impl Harness for EtcdHarness {
    async fn open(&self) -> Arc<dyn Store> {
        let mut config = orrery_store_etcd::EtcdConfig::new(vec![self.server.endpoint.clone()])
            .with_prefix(self.prefix.clone());
        config.watch = test_watch_config();
        Arc::new(
            orrery_store_etcd::EtcdStore::connect(config)
                .await
                .expect("connect to etcd"),
        )
    }
}
