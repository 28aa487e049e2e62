//! Runs of one controller in this process over a SQLite store in a temporary directory
//! (`scheduler-service`, `propagation-works`): the store, and the end of a timed run.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use orrery_store::Store;

/// A fresh SQLite store in a temporary directory (under `dir` if given), and the directory,
/// which goes when dropped.
pub fn store(dir: &Option<PathBuf>) -> anyhow::Result<(tempfile::TempDir, Arc<dyn Store>)> {
    let tmp = match dir {
        Some(d) => tempfile::tempdir_in(d)?,
        None => tempfile::tempdir()?,
    };
    let store: Arc<dyn Store> = Arc::new(orrery_store_sqlite::SqliteStore::open_dir(tmp.path())?);
    Ok((tmp, store))
}

/// Ends a timed run: the clock stops, the controller and the store are stopped. Returns the
/// seconds the run took.
pub async fn finish(
    started: Instant,
    stop: tokio::sync::watch::Sender<bool>,
    controller: tokio::task::JoinHandle<()>,
    store: &Arc<dyn Store>,
) -> f64 {
    let secs = started.elapsed().as_secs_f64();
    let _ = stop.send(true);
    let _ = controller.await;
    store.close().await;
    secs
}
