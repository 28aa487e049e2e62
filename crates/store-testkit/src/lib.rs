// Test support: a failed unwrap here is a failed test, which is what tests want.
#![allow(clippy::unwrap_used)]

//! Test support for the store: the conformance suite that every backend must pass, a launcher
//! for a real etcd, and helpers shared by store tests and benchmarks.

use parking_lot::Mutex;
use std::path::PathBuf;
use std::sync::Arc;

use orrery_api::Object;
use orrery_store::{Store, WatchCacheConfig};

pub mod conformance;
pub mod crash;
pub mod etcd;
pub mod lagging;
pub mod model;

pub use crash::{CrashOp, CrashOutcome, CrashWrite};

/// Opens one store location, repeatedly (to test restarts).
#[async_trait::async_trait]
pub trait Harness: Send + Sync {
    async fn open(&self) -> Arc<dyn Store>;

    /// Waits until the backend has finished the background work a compaction started (a no-op
    /// where there is none), so a test can order later writes after it.
    async fn settle(&self) {}

    /// Whether [`Harness::crash`] is supported.
    fn can_crash(&self) -> bool {
        false
    }

    /// Runs `writes` concurrently in another process on this store location (which the caller
    /// has closed) and kills it with SIGKILL once `kill_after` of them have been answered.
    /// Returns the answers the process gave before it died.
    async fn crash(
        &self,
        _writes: &[CrashWrite],
        _kill_after: usize,
    ) -> Vec<(usize, CrashOutcome)> {
        panic!("this harness cannot crash a writer process")
    }
}

/// Small watch-cache sizes, so tests exercise history replay and slow-watcher expiry.
pub fn test_watch_config() -> WatchCacheConfig {
    WatchCacheConfig {
        history: 16,
        watcher_buffer: 64,
        narrow_watcher_buffer: 64,
        max_replay: 1000,
        max_replay_wide: 1000,
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
    /// Versions removed per compaction step.
    pub compaction_step: usize,
    /// The `store-writer` binary, for [`Harness::crash`].
    pub crash_writer: Option<PathBuf>,
    /// The store last opened, for [`Harness::settle`].
    last: Mutex<Option<orrery_store_sqlite::SqliteStore>>,
}

impl SqliteHarness {
    pub fn new() -> Self {
        Self::in_dir(tempfile::tempdir().expect("a temporary directory for the test store"))
    }

    /// A store in memory-backed storage where there is some (`/dev/shm`): the same code paths,
    /// without waiting for the disk's fsyncs, for tests that open thousands of stores.
    pub fn in_memory_fs() -> Self {
        let dir = tempfile::tempdir_in("/dev/shm")
            .or_else(|_| tempfile::tempdir())
            .expect("a temporary directory for the test store");
        Self::in_dir(dir)
    }

    fn in_dir(dir: tempfile::TempDir) -> Self {
        SqliteHarness {
            dir,
            compaction_step: 7,
            crash_writer: None,
            last: Mutex::new(None),
        }
    }

    pub fn with_compaction_step(mut self, step: usize) -> Self {
        self.compaction_step = step;
        self
    }

    /// Enables [`Harness::crash`] with the `store-writer` binary at `path`.
    pub fn with_crash_writer(mut self, path: impl Into<PathBuf>) -> Self {
        self.crash_writer = Some(path.into());
        self
    }

    pub fn path(&self) -> PathBuf {
        self.dir.path().join("orrery.db")
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
        let mut config = orrery_store_sqlite::SqliteConfig::new(self.path());
        config.watch = test_watch_config();
        config.compaction_step = self.compaction_step;
        let store = orrery_store_sqlite::SqliteStore::open(config).expect("open the SQLite store");
        *self.last.lock() = Some(store.clone());
        Arc::new(store)
    }

    async fn settle(&self) {
        let store = self.last.lock().clone();
        if let Some(s) = store {
            s.wait_for_compaction().await;
        }
    }

    fn can_crash(&self) -> bool {
        self.crash_writer.is_some()
    }

    async fn crash(&self, writes: &[CrashWrite], kill_after: usize) -> Vec<(usize, CrashOutcome)> {
        let writer = self
            .crash_writer
            .clone()
            .expect("with_crash_writer sets the writer binary");
        let args = vec![
            "script".to_string(),
            "sqlite".into(),
            self.path().display().to_string(),
            "--compaction-step".into(),
            self.compaction_step.to_string(),
        ];
        let writes = writes.to_vec();
        tokio::task::spawn_blocking(move || crash::run_script(&writer, &args, &writes, kill_after))
            .await
            .unwrap()
    }
}

/// An etcd store under a prefix, on its own etcd server (compaction is global to an etcd, so
/// conformance tests do not share one) or on a shared one (the model test gives each sequence
/// its own prefix: its revisions are only compared with its own writes).
#[derive(Debug)]
pub struct EtcdHarness {
    pub server: Arc<etcd::EtcdServer>,
    pub prefix: String,
}

impl EtcdHarness {
    pub fn new() -> Self {
        EtcdHarness {
            server: Arc::new(etcd::EtcdServer::start().expect("start etcd")),
            prefix: "/orrery-test".into(),
        }
    }

    /// A harness on `server` under its own `prefix`.
    pub fn shared(server: Arc<etcd::EtcdServer>, prefix: impl Into<String>) -> Self {
        EtcdHarness {
            server,
            prefix: prefix.into(),
        }
    }
}

impl Default for EtcdHarness {
    fn default() -> Self {
        Self::new()
    }
}

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
