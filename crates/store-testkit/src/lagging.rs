//! A store whose recent reads lag: [`Lagging`] wraps a real store and answers
//! [`Store::get_recent`] and [`Store::get_copy`] with a copy the test held back, as an etcd member behind its leader
//! answers a serializable read. Real lag cannot be produced on demand (a follower catches up in
//! milliseconds), so this stands in for it; everything else is the wrapped store's.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

use orrery_api::Object;
use orrery_store::{
    Fence, ListOptions, ListResult, Preconditions, RawListResult, Result, Revision, Store,
    StoreError, WatchOptions, WatchStream,
};

#[derive(Debug)]
pub struct Lagging {
    inner: Arc<dyn Store>,
    /// Per key, what recent reads return (`None`: not there yet).
    held: Mutex<HashMap<String, Option<Arc<Object>>>>,
    /// How many recent reads were answered from a held copy.
    pub lagged_reads: std::sync::atomic::AtomicUsize,
    /// When set, the next update is carried out and then reported failed (as a write whose
    /// answer was lost: etcd's timeout after the commit).
    pub lose_next_answer: std::sync::atomic::AtomicBool,
    /// When set, watches cannot start (as while etcd's leader is being elected): listings
    /// still answer.
    pub refuse_watches: std::sync::atomic::AtomicBool,
}

impl Lagging {
    pub fn new(inner: Arc<dyn Store>) -> Self {
        Lagging {
            inner,
            held: Mutex::new(HashMap::new()),
            lagged_reads: Default::default(),
            lose_next_answer: Default::default(),
            refuse_watches: Default::default(),
        }
    }

    /// From now on recent reads of `key` return the object as it is now (or not found).
    pub async fn hold(&self, key: &str) {
        let now = self.inner.get_shared(key).await.ok();
        self.held.lock().insert(key.to_string(), now);
    }

    /// Recent reads of `key` are current again.
    pub fn release(&self, key: &str) {
        self.held.lock().remove(key);
    }

    fn held(&self, key: &str) -> Option<Option<Arc<Object>>> {
        self.held.lock().get(key).cloned()
    }

    /// The held copy of `key` (counted), else what `read` of the wrapped store answers.
    async fn held_or(
        &self,
        key: &str,
        read: impl std::future::Future<Output = Result<Arc<Object>>>,
    ) -> Result<Arc<Object>> {
        match self.held(key) {
            Some(copy) => {
                self.lagged_reads
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                copy.ok_or_else(|| StoreError::NotFound {
                    key: key.to_string(),
                })
            }
            None => read.await,
        }
    }
}

#[async_trait::async_trait]
impl Store for Lagging {
    async fn get(&self, key: &str) -> Result<Object> {
        self.inner.get(key).await
    }

    async fn get_recent(&self, key: &str) -> Result<Arc<Object>> {
        self.held_or(key, self.inner.get_recent(key)).await
    }

    async fn get_copy(&self, key: &str) -> Result<Arc<Object>> {
        self.held_or(key, self.inner.get_copy(key)).await
    }

    async fn get_shared(&self, key: &str) -> Result<Arc<Object>> {
        self.inner.get_shared(key).await
    }

    async fn list(&self, prefix: &str, opts: &ListOptions) -> Result<ListResult> {
        self.inner.list(prefix, opts).await
    }

    async fn list_raw(&self, prefix: &str, opts: &ListOptions) -> Result<RawListResult> {
        self.inner.list_raw(prefix, opts).await
    }

    async fn create(&self, key: &str, obj: Object) -> Result<Arc<Object>> {
        self.inner.create(key, obj).await
    }

    async fn update(
        &self,
        key: &str,
        obj: Object,
        expected: Option<Revision>,
    ) -> Result<Arc<Object>> {
        let done = self.inner.update(key, obj, expected).await?;
        if self
            .lose_next_answer
            .swap(false, std::sync::atomic::Ordering::AcqRel)
        {
            return Err(StoreError::Backend(
                "the answer was lost (written all the same)".into(),
            ));
        }
        Ok(done)
    }

    async fn delete(&self, key: &str, preconditions: &Preconditions) -> Result<Arc<Object>> {
        self.inner.delete(key, preconditions).await
    }

    async fn watch(&self, prefix: &str, from: Revision, opts: WatchOptions) -> Result<WatchStream> {
        if self
            .refuse_watches
            .load(std::sync::atomic::Ordering::Acquire)
        {
            return Err(StoreError::Unavailable(
                "watches refused by the test".into(),
            ));
        }
        self.inner.watch(prefix, from, opts).await
    }

    async fn current_revision(&self) -> Result<Revision> {
        self.inner.current_revision().await
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        self.inner.compact(revision).await
    }

    async fn compacted_revision(&self) -> Result<Revision> {
        self.inner.compacted_revision().await
    }

    async fn close(&self) {
        self.inner.close().await
    }

    fn degraded(&self) -> Option<String> {
        self.inner.degraded()
    }

    fn watch_stats(&self) -> Option<orrery_store::WatchStats> {
        self.inner.watch_stats()
    }

    fn fenced(&self, fence: Fence) -> Option<Arc<dyn Store>> {
        // A fenced view would read the wrapped store's recent copies, not the held ones.
        let _ = fence;
        None
    }
}
