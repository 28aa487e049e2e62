//! List-then-watch over one store prefix, as a stream of events for a controller: a full
//! listing first (and again whenever the watch breaks or expires), then each change.

use std::sync::Arc;
use std::time::Duration;

use orrery_api::Object;
use orrery_store::{ListOptions, Store, StoreError, WatchEvent, WatchOptions};
use tokio::sync::{mpsc, watch};

#[derive(Debug)]
pub enum Event {
    /// Everything under the prefix now: replace what you knew.
    Listed(Vec<Arc<Object>>),
    Upsert(Arc<Object>),
    Delete(Arc<Object>),
}

/// Starts following `prefix`; the receiver ends when the store closes or on shutdown.
pub fn spawn(
    store: Arc<dyn Store>,
    prefix: String,
    mut shutdown: watch::Receiver<bool>,
) -> mpsc::UnboundedReceiver<Event> {
    // Unbounded: the store ends a watcher that falls behind, and a controller in the middle
    // of a long round must not make its watch fall behind (and relist everything). The
    // backlog holds `Arc`s of objects the store already shares.
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            if *shutdown.borrow() {
                return;
            }
            let list = match store.list(&prefix, &ListOptions::default()).await {
                Ok(l) => l,
                Err(StoreError::Closed) => return,
                Err(e) => {
                    tracing::warn!(prefix = %prefix, error = %e, "listing failed; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            };
            let items = list.items.into_iter().map(Arc::new).collect();
            if tx.send(Event::Listed(items)).is_err() {
                return;
            }
            let mut w = match store
                .watch(&prefix, list.revision, WatchOptions::default())
                .await
            {
                Ok(w) => w,
                Err(StoreError::Closed) => return,
                Err(_) => continue,
            };
            loop {
                let ev = tokio::select! {
                    ev = w.next() => ev,
                    _ = shutdown.changed() => return,
                };
                let out = match ev {
                    Some(Ok(WatchEvent::Added(o))) | Some(Ok(WatchEvent::Modified(o))) => {
                        Event::Upsert(o)
                    }
                    Some(Ok(WatchEvent::Deleted(o))) => Event::Delete(o),
                    Some(Ok(WatchEvent::Bookmark(_))) => continue,
                    // Expired or ended: list again.
                    Some(Err(e)) => {
                        tracing::warn!(prefix = %prefix, error = %e, "a controller's watch ended; listing again");
                        break;
                    }
                    None => break,
                };
                if tx.send(out).is_err() {
                    return;
                }
            }
        }
    });
    rx
}
