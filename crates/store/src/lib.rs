//! The store of versioned, watchable objects that all of Orrery stands on.
//!
//! This crate defines the [`Store`] trait and the pieces every backend shares (errors, list
//! options and continue tokens, the [`WatchCache`]); it knows no backend. Backends live beside
//! it (`orrery-store-sqlite`, `orrery-store-etcd`) and are checked by one conformance suite
//! (`orrery-store-testkit`).
//!
//! # Invariants
//! - One global, strictly increasing revision numbers every write; an object's
//!   `metadata.resourceVersion` is the revision of its last write.
//! - A write is acknowledged only once it is durable.
//! - A list or watch at a revision older than the compacted revision fails with
//!   [`StoreError::Expired`].
//! - Watchers see every change under their prefix after their start revision, in revision
//!   order, exactly once, or they are ended with [`StoreError::Expired`].

use std::sync::Arc;
use std::time::Duration;

use orrery_api::Object;

mod error;
pub mod format;
mod list;
pub mod ops;
pub mod stamp;
mod watch;

pub use error::{Result, StoreError};
pub use list::{
    ListOptions, ListResult, RawListResult, RawObject, decode_continue, encode_continue,
    prefix_end, with_resource_version,
};
pub use watch::{
    Change, ChangeKind, History, Kept, MapObject, StoredChange, WatchCache, WatchCacheConfig,
    WatchEvent, WatchOptions, WatchStats, WatchStream,
};

/// A store revision (what `resourceVersion` carries).
pub type Revision = i64;

/// Conditions a delete must meet.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Preconditions {
    /// The object's uid must be this one.
    pub uid: Option<String>,
    /// The object's revision must be this one.
    pub revision: Option<Revision>,
}

/// What a fenced store's writes are conditional on: the leader lease at `key` (a
/// `coordination.k8s.io/v1` Lease) still held by `holder` in the same term (`transitions`,
/// its `spec.leaseTransitions` when this holder acquired it).
///
/// `revision` is the lease's revision as its holder last wrote it (acquired or renewed); the
/// elector keeps it current. A write whose fence check fails because of the holder's own
/// renewal is tried again at the lease's new revision; one that finds another holder or term
/// fails with [`StoreError::Fenced`].
#[derive(Clone, Debug)]
pub struct Fence {
    pub key: String,
    pub holder: String,
    pub transitions: i64,
    pub revision: Arc<std::sync::atomic::AtomicI64>,
}

impl Fence {
    /// Whether the lease object `lease` is this fence's holder in this fence's term.
    pub fn holds(&self, lease: &Object) -> bool {
        let field = |name: &str| lease.spec.as_ref().and_then(|s| s.get(name));
        field("holderIdentity").and_then(|v| v.as_str()) == Some(self.holder.as_str())
            && field("leaseTransitions")
                .and_then(|v| v.as_i64())
                .unwrap_or(0)
                == self.transitions
    }
}

/// A store of versioned objects under string keys (`/registry/apps/deployments/ns/name`).
///
/// Objects are stored without `resourceVersion`; reads and write results carry the revision of
/// the object's last write in it.
#[async_trait::async_trait]
pub trait Store: Send + Sync + std::fmt::Debug + 'static {
    /// The object at `key`, or [`StoreError::NotFound`].
    async fn get(&self, key: &str) -> Result<Object>;

    /// Like [`Store::get`], shared: a store that keeps the object in memory hands out its own
    /// copy instead of a new one (for readers that build a changed object from parts of it).
    async fn get_shared(&self, key: &str) -> Result<Arc<Object>> {
        self.get(key).await.map(Arc::new)
    }

    /// The object at `key` as this store last saw it, which may lag behind the latest
    /// committed write (an etcd member's own copy, read without consensus). Only for the read
    /// of a read-modify-write whose write is conditional on the revision read: a lagging read
    /// then fails the write as a conflict, and the caller reads again with [`Store::get`].
    /// Stores whose reads are always current serve it as [`Store::get_shared`].
    async fn get_recent(&self, key: &str) -> Result<Arc<Object>> {
        self.get_shared(key).await
    }

    /// The object at `key` as the nearest copy has it, however far that copy is behind the
    /// latest committed write (on etcd, the member's own, read without consensus and without
    /// [`Store::get_recent`]'s check that the member has caught up with what this store has
    /// seen). Only for a caller that can tell from the object itself whether it will do: an
    /// update requiring the revision its client gave can start on a copy at that revision, as
    /// its write, conditional on that revision, succeeds exactly when the copy is the object
    /// as it is. Stores whose reads are always current serve it as [`Store::get_shared`].
    async fn get_copy(&self, key: &str) -> Result<Arc<Object>> {
        self.get_shared(key).await
    }

    /// Objects under `prefix` in key order, filtered by the options' selectors, one page at a
    /// time. All pages of one list reflect the same revision.
    async fn list(&self, prefix: &str, opts: &ListOptions) -> Result<ListResult>;

    /// Like [`Store::list`], but the objects as stored JSON (with their resourceVersion), so
    /// that serving a list need not parse and re-serialize every object.
    async fn list_raw(&self, prefix: &str, opts: &ListOptions) -> Result<RawListResult> {
        let page = self.list(prefix, opts).await?;
        let items = page
            .items
            .iter()
            .map(|o| RawObject {
                revision: o.revision().unwrap_or(0),
                json: serde_json::to_vec(o).unwrap_or_default(),
            })
            .collect();
        Ok(RawListResult {
            items,
            revision: page.revision,
            continue_token: page.continue_token,
        })
    }

    /// Creates `key`; fails with [`StoreError::AlreadyExists`] if it exists.
    async fn create(&self, key: &str, obj: Object) -> Result<Arc<Object>>;

    /// Replaces `key`, which must exist. With `expected`, only if the object's current revision
    /// is that one (compare-and-swap), else [`StoreError::Conflict`].
    async fn update(
        &self,
        key: &str,
        obj: Object,
        expected: Option<Revision>,
    ) -> Result<Arc<Object>>;

    /// Deletes `key` if the preconditions hold; returns the object's last state with the
    /// revision of the delete.
    async fn delete(&self, key: &str, preconditions: &Preconditions) -> Result<Arc<Object>>;

    /// Changes under `prefix` (empty or ending in `/`) after revision `from`.
    async fn watch(&self, prefix: &str, from: Revision, opts: WatchOptions) -> Result<WatchStream>;

    /// The revision of the latest committed write.
    async fn current_revision(&self) -> Result<Revision>;

    /// Discards history before `revision`: lists and watches from older revisions expire.
    /// Physical clean-up may continue in the background.
    async fn compact(&self, revision: Revision) -> Result<()>;

    /// The revision before which history is gone.
    async fn compacted_revision(&self) -> Result<Revision>;

    /// Stops background work and ends all watches cleanly.
    async fn close(&self);

    /// Why reads may be stale now (etcd without quorum: reads are served by one member
    /// without consensus), or `None` when the store is whole.
    fn degraded(&self) -> Option<String> {
        None
    }

    /// Its watchers and what waits in their queues (for `/metrics`), where the store fans
    /// its changes out itself; `None` where it does not.
    fn watch_stats(&self) -> Option<WatchStats> {
        None
    }

    /// A view of this store whose writes (create, update, delete) commit only while `fence`
    /// holds, checked in the same transaction as the write; reads and watches are the same as
    /// this store's. `None` when the backend cannot fence (SQLite: one server owns the file).
    fn fenced(&self, fence: Fence) -> Option<Arc<dyn Store>> {
        let _ = fence;
        None
    }
}

/// Reads `key`, applies `f`, and writes the result with compare-and-swap, retrying on
/// conflicts (the API server's "guaranteed update"). `f` returning `Ok(None)` leaves the object
/// unchanged.
pub async fn update_with<F>(store: &dyn Store, key: &str, mut f: F) -> Result<Arc<Object>>
where
    F: FnMut(Object) -> Result<Option<Object>> + Send,
{
    let mut backoff = Duration::from_millis(1);
    // The first read may lag (see `Store::get_recent`); anything but a successful write on
    // it is tried again on a current read, so a caller never acts on a lagging copy.
    let mut first = true;
    loop {
        let recent = std::mem::take(&mut first);
        let current = match read_for_write(store, key, recent).await {
            Err(_) if recent => continue,
            r => Arc::unwrap_or_clone(r?),
        };
        let rev = current.revision().unwrap_or(0);
        let next = match f(current.clone()) {
            Ok(Some(next)) => next,
            Ok(None) | Err(_) if recent => continue,
            Ok(None) => return Ok(Arc::new(current)),
            Err(e) => return Err(e),
        };
        match store.update(key, next, Some(rev)).await {
            Err(StoreError::Conflict { .. }) if recent => {}
            Err(StoreError::Conflict { .. }) => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

/// The read of one attempt of a read-modify-write: the store's recent copy for the first
/// attempt (`recent`; see [`Store::get_recent`]), the object as it is for the others.
pub async fn read_for_write(store: &dyn Store, key: &str, recent: bool) -> Result<Arc<Object>> {
    if recent {
        store.get_recent(key).await
    } else {
        store.get_shared(key).await
    }
}

/// Periodically compacts `store` to the revision it had one `interval` earlier, so history
/// covers at least `interval` (what the Kubernetes API server does every five minutes).
pub fn spawn_compactor(store: Arc<dyn Store>, interval: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut previous: Option<Revision> = None;
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Some(rev) = previous {
                match store.compact(rev).await {
                    Ok(()) => tracing::debug!(revision = rev, "compacted store history"),
                    Err(StoreError::Closed) => return,
                    Err(e) => tracing::warn!(revision = rev, error = %e, "compaction failed"),
                }
            }
            match store.current_revision().await {
                Ok(r) => previous = Some(r),
                Err(StoreError::Closed) => return,
                Err(e) => tracing::warn!(error = %e, "reading the current revision failed"),
            }
        }
    })
}
