//! The embedded SQLite backend of the Orrery store (the default; the k3s/kine approach).
//!
//! - Durability: WAL with `synchronous=FULL`; a write is acknowledged only after the
//!   transaction holding it has been fsynced.
//! - Throughput: one writer thread commits every queued write in one transaction (group
//!   commit), so concurrent writers share fsyncs.
//! - Reads run on a pool of read-only connections against WAL snapshots and never wait for the
//!   writer.
//! - Compaction raises the compacted revision at once and removes dead versions in bounded
//!   steps queued between ordinary writes.
//! - A corrupt or foreign file is refused at open with a clear message, never reset.

use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use orrery_api::Object;
use orrery_store::{
    History, Kept, ListOptions, ListResult, Preconditions, Result, Revision, Store, StoreError,
    WatchCache, WatchCacheConfig, WatchOptions, WatchStream,
};
use tokio::sync::{mpsc, oneshot};

mod backup;
mod checkpoint;
mod gather;
mod latest;
mod reader;
mod schema;
mod writer;

use reader::Readers;
use writer::{Op, Reply, Request, Shared};

pub use backup::{Attachments, Backup, Restored, backup, restore};
pub use schema::{APPLICATION_ID, SCHEMA_VERSION};

/// The longest the writer waits for more writes to commit with one (gather.rs).
pub const DEFAULT_COMMIT_DELAY: std::time::Duration = std::time::Duration::from_millis(2);

/// How to open a SQLite store.
#[derive(Clone, Debug)]
pub struct SqliteConfig {
    pub path: PathBuf,
    /// The most writes one transaction may carry.
    pub max_batch: usize,
    /// The longest the writer waits for more writes before committing, while a steady stream
    /// of writes makes waiting pay (gather.rs); zero commits at once.
    pub commit_delay: std::time::Duration,
    /// How many writes may wait in the queue before writers are made to wait.
    pub queue: usize,
    /// Versions removed per compaction step (bounds how long one step holds the writer).
    pub compaction_step: usize,
    /// Run SQLite's `quick_check` over the whole file at open.
    pub integrity_check: bool,
    /// Stored JSON bytes of recently written objects kept in memory for point reads (0: none).
    pub object_cache_bytes: usize,
    pub watch: WatchCacheConfig,
}

impl SqliteConfig {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        SqliteConfig {
            path: path.into(),
            max_batch: 1024,
            commit_delay: DEFAULT_COMMIT_DELAY,
            queue: 16 * 1024,
            compaction_step: 500,
            integrity_check: true,
            object_cache_bytes: 16 << 20,
            watch: WatchCacheConfig::default(),
        }
    }
}

/// The SQLite store.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    path: PathBuf,
    queue: mpsc::Sender<Request>,
    readers: Arc<Readers>,
    cache: WatchCache,
    shared: Arc<Shared>,
    compaction_step: usize,
    compacting: AtomicBool,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// Held while the store is open: one process writes the file (the object cache relies on
    /// it). Released by `close` or with the process.
    lock: Mutex<Option<std::fs::File>>,
}

/// Write counters: how many writes, in how many transactions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteStats {
    pub writes: u64,
    pub transactions: u64,
}

impl SqliteStore {
    /// Opens (or creates) the store file. Must be called inside a Tokio runtime.
    pub fn open(config: SqliteConfig) -> Result<Self> {
        if let Some(dir) = config.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| StoreError::Backend(format!("creating {}: {e}", dir.display())))?;
        }
        let lock = lock_file(&config.path)?;
        private_files(&config.path)?;
        let conn = schema::open_writer(&config.path, config.integrity_check)?;
        // SQLite makes the -wal and -shm files with the database file's mode; ones left by
        // an earlier version are narrowed too.
        private_files(&config.path)?;
        let (rev, compacted, compact_done) =
            writer::initial_revisions(&conn).map_err(|e| schema::open_error(&config.path, e))?;
        let shared = Arc::new(Shared {
            current: rev.into(),
            compacted: compacted.into(),
            compact_done: compact_done.into(),
            stats: writer::Stats::default(),
            latest: latest::Latest::new(config.object_cache_bytes),
        });
        let cache = WatchCache::new(config.watch, rev);
        cache.set_compacted(compacted);

        let (queue, rx) = mpsc::channel(config.queue.max(1));
        let (dispatch_tx, dispatch_rx) = std::sync::mpsc::channel();
        let (checkpoint_tx, checkpoint_rx) = std::sync::mpsc::sync_channel(1);
        let w = writer::Writer::new(
            conn,
            rev,
            compacted,
            compact_done,
            (config.max_batch, config.commit_delay),
            shared.clone(),
            checkpoint_tx,
        );
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name.to_string())
                .spawn(f)
                .map_err(|e| StoreError::Backend(format!("starting the {name} thread: {e}")))
        };
        let writer_thread = spawn("store-writer", Box::new(move || w.run(rx, dispatch_tx)))?;
        let dispatch_cache = cache.clone();
        let dispatch_thread = spawn(
            "store-dispatch",
            Box::new(move || writer::dispatch(dispatch_rx, dispatch_cache)),
        )?;
        let checkpoint_path = config.path.clone();
        let checkpoint_thread = spawn(
            "store-checkpoint",
            Box::new(move || checkpoint::run(checkpoint_path, checkpoint_rx)),
        )?;

        tracing::info!(path = %config.path.display(), revision = rev, compacted, "opened SQLite store");
        let store = SqliteStore {
            inner: Arc::new(Inner {
                path: config.path.clone(),
                queue,
                readers: Arc::new(Readers::new(config.path)),
                cache,
                shared,
                compaction_step: config.compaction_step.max(1),
                compacting: AtomicBool::new(false),
                threads: Mutex::new(vec![writer_thread, dispatch_thread, checkpoint_thread]),
                lock: Mutex::new(Some(lock)),
            }),
        };
        if compact_done < compacted {
            store.spawn_compaction_steps();
        }
        Ok(store)
    }

    /// Opens the store at `DIR/orrery.db` with default settings.
    pub fn open_dir(dir: &Path) -> Result<Self> {
        Self::open(SqliteConfig::new(dir.join("orrery.db")))
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    pub fn write_stats(&self) -> WriteStats {
        let s = &self.inner.shared.stats;
        WriteStats {
            writes: s.writes.load(Ordering::Relaxed),
            transactions: s.transactions.load(Ordering::Relaxed),
        }
    }

    /// How many versions (live, superseded and tombstones) the file holds; compaction lowers it.
    pub async fn stored_versions(&self) -> Result<u64> {
        self.inner
            .readers
            .with(|c| {
                c.query_row("SELECT count(*) FROM kv", [], |r| r.get::<_, i64>(0))
                    .map(|n| n as u64)
                    .map_err(|e| StoreError::Backend(e.to_string()))
            })
            .await
    }

    /// Waits until physical compaction has caught up with the compacted revision (it runs in
    /// the background after [`Store::compact`]), or the store is closed.
    pub async fn wait_for_compaction(&self) {
        let s = &self.inner.shared;
        while s.compact_done.load(Ordering::Acquire) < s.compacted.load(Ordering::Acquire)
            && !self.inner.queue.is_closed()
        {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }

    async fn submit(&self, op: Op) -> Result<Reply> {
        let (reply, rx) = oneshot::channel();
        self.inner
            .queue
            .send(Request { op, reply })
            .await
            .map_err(|_| StoreError::Closed)?;
        rx.await.map_err(|_| StoreError::Closed)?
    }

    async fn write_object(&self, op: Op) -> Result<Arc<Object>> {
        match self.submit(op).await? {
            Reply::Object(o) => Ok(o),
            _ => Err(StoreError::Backend(
                "unexpected reply from the writer".into(),
            )),
        }
    }

    /// Runs physical compaction steps in the background until they catch up.
    fn spawn_compaction_steps(&self) {
        if self.inner.compacting.swap(true, Ordering::AcqRel) {
            return;
        }
        let store = self.clone();
        tokio::spawn(async move {
            loop {
                match store
                    .submit(Op::CompactStep {
                        limit: store.inner.compaction_step,
                    })
                    .await
                {
                    Ok(Reply::Stepped { finished: true }) => break,
                    Ok(_) => tokio::task::yield_now().await,
                    Err(e) => {
                        if e != StoreError::Closed {
                            tracing::warn!(error = %e, "compaction step failed");
                        }
                        break;
                    }
                }
            }
            store.inner.compacting.store(false, Ordering::Release);
            // A compaction requested while the last step ran saw us busy and left it to us.
            let s = &store.inner.shared;
            if s.compact_done.load(Ordering::Acquire) < s.compacted.load(Ordering::Acquire)
                && !store.inner.queue.is_closed()
            {
                store.spawn_compaction_steps();
            }
        });
    }

    fn encode(obj: &mut Object) -> Result<Vec<u8>> {
        obj.metadata.resource_version.clear();
        serde_json::to_vec(obj)
            .map_err(|e| StoreError::InvalidArgument(format!("object does not serialize: {e}")))
    }
}

/// Locks `<store>.lock` exclusively, so a second process cannot open the same store.
/// What [`scrub`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scrubbed {
    /// The revision history was compacted to.
    pub revision: Revision,
    /// Bytes of the database and its WAL, before and after.
    pub bytes_before: u64,
    pub bytes_after: u64,
}

/// Removes from the store's files everything no longer current: history is compacted to the
/// newest revision (every superseded version and tombstone goes), then the file is rewritten
/// (`VACUUM`, with `secure_delete` on) and its WAL emptied, so nothing deleted or overwritten
/// (a Secret's plaintext from before encryption at rest was turned on, say) can be read from
/// the files. The store must not be open elsewhere (the server stopped): the file's lock says
/// so otherwise. Must be called inside a Tokio runtime.
pub async fn scrub(path: &Path) -> Result<Scrubbed> {
    let size = |p: &Path| -> u64 {
        let wal = {
            let mut n = p.as_os_str().to_owned();
            n.push("-wal");
            PathBuf::from(n)
        };
        [p.to_path_buf(), wal]
            .iter()
            .filter_map(|f| std::fs::metadata(f).ok())
            .map(|m| m.len())
            .sum()
    };
    if !path.exists() {
        return Err(StoreError::Backend(format!(
            "{}: no store there to scrub",
            path.display()
        )));
    }
    let bytes_before = size(path);
    let store = SqliteStore::open(SqliteConfig::new(path))?;
    let revision = store.current_revision().await?;
    store.compact(revision).await?;
    store.wait_for_compaction().await;
    store.close().await;
    drop(store);
    let path_owned = path.to_path_buf();
    tokio::task::spawn_blocking(move || -> Result<()> {
        let path = path_owned.as_path();
        let _lock = lock_file(path)?;
        let err =
            |e: rusqlite::Error| StoreError::Backend(format!("scrubbing {}: {e}", path.display()));
        let conn = rusqlite::Connection::open(path).map_err(err)?;
        conn.pragma_update(None, "secure_delete", "ON")
            .map_err(err)?;
        conn.execute_batch("VACUUM").map_err(err)?;
        // Every page into the file, and the WAL (which held the old ones) cut to nothing.
        let busy: i64 = conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))
            .map_err(err)?;
        if busy != 0 {
            return Err(StoreError::Backend(format!(
                "{}: the WAL could not be emptied (is the store open elsewhere?)",
                path.display()
            )));
        }
        conn.close().map_err(|(_, e)| err(e))?;
        private_files(path)
    })
    .await
    .map_err(|e| StoreError::Backend(format!("scrubbing: {e}")))??;
    Ok(Scrubbed {
        revision,
        bytes_before,
        bytes_after: size(path),
    })
}

/// The suffixes of the files a store is kept in.
const FILES: [&str; 4] = ["", "-wal", "-shm", ".lock"];

/// Makes the store's files readable by their owner only, whatever the umask (they hold every
/// object, Secrets among them): the database is created so if it is missing, and the files
/// there are narrowed to 0600.
fn private_files(path: &Path) -> Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let err = |p: &Path, e: std::io::Error| StoreError::Backend(format!("{}: {e}", p.display()));
    if !path.exists() {
        // An empty file is a new database to SQLite.
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| err(path, e))?;
    }
    for suffix in FILES {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        let p = PathBuf::from(name);
        match std::fs::metadata(&p) {
            Ok(m) if m.permissions().mode() & 0o077 != 0 => {
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600))
                    .map_err(|e| err(&p, e))?;
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(err(&p, e)),
        }
    }
    Ok(())
}

fn lock_file(path: &Path) -> Result<std::fs::File> {
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    let lock_path = PathBuf::from(name);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| StoreError::Backend(format!("opening {}: {e}", lock_path.display())))?;
    // A lock released a moment ago can still be held by a process this one has just forked
    // (the descriptor lives until that child's exec closes it), so a refusal waits a little.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(StoreError::Backend(format!(
                    "{} is in use by another process (another Orrery server on the same data directory?)",
                    path.display()
                )));
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(StoreError::Backend(format!(
                    "locking {}: {e}",
                    lock_path.display()
                )));
            }
        }
    }
}

#[async_trait::async_trait]
impl History for SqliteStore {
    async fn changes(&self, prefix: &str, after: Revision, until: Revision) -> Result<Vec<Kept>> {
        let prefix = prefix.to_string();
        let changes = self
            .inner
            .readers
            .with(move |c| reader::history(c, &prefix, after, until))
            .await?;
        Ok(changes.into_iter().map(Kept::Parsed).collect())
    }
}

#[async_trait::async_trait]
impl Store for SqliteStore {
    async fn get(&self, key: &str) -> Result<Object> {
        // A cached object is copied; one read from SQLite is not.
        self.get_shared(key).await.map(Arc::unwrap_or_clone)
    }

    async fn get_shared(&self, key: &str) -> Result<Arc<Object>> {
        if let Some(o) = self.inner.shared.latest.get(key) {
            return Ok(o);
        }
        let key = key.to_string();
        // One SELECT: its own snapshot.
        self.inner
            .readers
            .with_statement(move |c| reader::get(c, &key))
            .await
            .map(Arc::new)
    }

    async fn list(&self, prefix: &str, opts: &ListOptions) -> Result<ListResult> {
        let (prefix, opts) = (prefix.to_string(), opts.clone());
        self.inner
            .readers
            .with(move |c| reader::list(c, &prefix, &opts))
            .await
    }

    async fn list_raw(
        &self,
        prefix: &str,
        opts: &ListOptions,
    ) -> Result<orrery_store::RawListResult> {
        let (prefix, opts) = (prefix.to_string(), opts.clone());
        self.inner
            .readers
            .with(move |c| reader::list_raw(c, &prefix, &opts))
            .await
    }

    async fn create(&self, key: &str, mut obj: Object) -> Result<Arc<Object>> {
        let value = Self::encode(&mut obj)?;
        self.write_object(Op::Create {
            key: key.to_string(),
            value,
            obj: Box::new(obj),
        })
        .await
    }

    async fn update(
        &self,
        key: &str,
        mut obj: Object,
        expected: Option<Revision>,
    ) -> Result<Arc<Object>> {
        let value = Self::encode(&mut obj)?;
        self.write_object(Op::Update {
            key: key.to_string(),
            value,
            obj: Box::new(obj),
            expected,
        })
        .await
    }

    async fn delete(&self, key: &str, preconditions: &Preconditions) -> Result<Arc<Object>> {
        self.write_object(Op::Delete {
            key: key.to_string(),
            pre: preconditions.clone(),
        })
        .await
    }

    async fn watch(&self, prefix: &str, from: Revision, opts: WatchOptions) -> Result<WatchStream> {
        self.inner.cache.watch(prefix, from, opts, self).await
    }

    async fn current_revision(&self) -> Result<Revision> {
        if self.inner.queue.is_closed() {
            return Err(StoreError::Closed);
        }
        Ok(self.inner.shared.current.load(Ordering::Acquire))
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        self.submit(Op::Compact { target: revision }).await?;
        self.spawn_compaction_steps();
        Ok(())
    }

    async fn compacted_revision(&self) -> Result<Revision> {
        Ok(self.inner.shared.compacted.load(Ordering::Acquire))
    }

    async fn close(&self) {
        self.inner.cache.close();
        let threads: Vec<_> = std::mem::take(&mut *self.inner.threads.lock());
        if threads.is_empty() {
            return;
        }
        // Everything queued before the shutdown is committed and acknowledged first.
        let _ = self.submit(Op::Shutdown).await;
        let _ = tokio::task::spawn_blocking(move || {
            for t in threads {
                let _ = t.join();
            }
        })
        .await;
        self.inner.lock.lock().take();
    }

    fn watch_stats(&self) -> Option<orrery_store::WatchStats> {
        Some(self.inner.cache.stats())
    }
}
