//! A reflector: one store prefix, listed and then watched, as a stream of events for a
//! controller (and, optionally, kept in an indexed [`Cache`]).
//!
//! - The first event is always [`Event::Listed`], everything under the prefix: the controller
//!   replaces what it knew (and counts the source as synced).
//! - Then every change, in revision order. A watch that ends for any other reason than lost
//!   history resumes from the last revision delivered, so nothing is missed and nothing is
//!   listed again needlessly; one that ends with `Expired` (410: the store compacted past it,
//!   or the watcher fell too far behind) lists again, and the controller gets a fresh
//!   [`Event::Listed`].

use std::sync::Arc;
use std::time::Duration;

use orrery_api::Object;
use orrery_store::{ListOptions, Revision, Store, StoreError, WatchEvent, WatchOptions};
use tokio::sync::watch;

use super::cache::Cache;
use super::inbox::{Events, InboxSender, inbox};

#[derive(Debug)]
pub enum Event {
    /// Everything under the prefix now: replace what you knew.
    Listed(Vec<Arc<Object>>),
    Upsert(Arc<Object>),
    Delete(Arc<Object>),
}

/// The longest pause between attempts after a failure.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Whether a reflector is in step with the store: it has listed, and it is watching (or has
/// just resumed) rather than failing to list or to watch. Shared with whoever must say so: the
/// API server's `/readyz` and `/metrics` for its caches of tokens and roles.
#[derive(Clone, Debug, Default)]
pub struct Health(Arc<parking_lot::Mutex<HealthState>>);

#[derive(Debug, Default)]
struct HealthState {
    listed: bool,
    /// Since when listing or watching has failed, and why, while it does.
    failing: Option<(std::time::Instant, String)>,
    /// Listings or watches that failed, and listings done again, since the start.
    errors: u64,
    relists: u64,
}

impl Health {
    fn state(&self) -> parking_lot::MutexGuard<'_, HealthState> {
        // A few fields set together: consistent whatever panicked while holding them.
        self.0.lock()
    }

    fn failed(&self, why: &StoreError) {
        let mut s = self.state();
        s.errors += 1;
        if s.failing.is_none() {
            s.failing = Some((std::time::Instant::now(), why.to_string()));
        }
    }

    fn listed(&self) {
        let mut s = self.state();
        if s.listed {
            s.relists += 1;
        }
        s.listed = true;
    }

    fn watching(&self) {
        self.state().failing = None;
    }

    /// Why it is not in step, if it is not: never listed, or failing for longer than
    /// `tolerance` (a watch that breaks and resumes at once is in step).
    pub fn out_of_step(&self, tolerance: Duration) -> Option<String> {
        let s = self.state();
        if !s.listed {
            return Some(match &s.failing {
                Some((_, why)) => format!("not listed yet ({why})"),
                None => "not listed yet".into(),
            });
        }
        match &s.failing {
            Some((since, why)) if since.elapsed() >= tolerance => {
                Some(format!("failing for {}s: {why}", since.elapsed().as_secs()))
            }
            _ => None,
        }
    }

    /// (failed listings and watches, listings done again) since the start.
    pub fn counts(&self) -> (u64, u64) {
        let s = self.state();
        (s.errors, s.relists)
    }
}

/// Starts following `prefix`; the receiver ends when the store closes or on shutdown.
pub fn spawn(store: Arc<dyn Store>, prefix: String, shutdown: watch::Receiver<bool>) -> Events {
    spawn_cached(store, prefix, None, shutdown)
}

/// Like [`spawn`], keeping `cache` in step before each event is sent.
pub fn spawn_cached(
    store: Arc<dyn Store>,
    prefix: String,
    cache: Option<Arc<Cache>>,
    shutdown: watch::Receiver<bool>,
) -> Events {
    run(store, prefix, cache, None, shutdown)
}

/// Whether a listed object, as its stored JSON, may matter to a controller.
pub type Keep = fn(&[u8]) -> bool;

/// Like [`spawn`], for a controller that cares about few of the objects under a wide prefix:
/// a listing parses only the stored objects `keep` accepts (a listing of the whole registry
/// is most of a start-up's work otherwise); changes are delivered whole, as they come
/// parsed already.
pub fn spawn_filtered(
    store: Arc<dyn Store>,
    prefix: String,
    keep: Keep,
    shutdown: watch::Receiver<bool>,
) -> Events {
    run(store, prefix, None, Some(keep), shutdown)
}

/// Everything under `prefix` now, and the revision it was read at.
async fn list(
    store: &dyn Store,
    prefix: &str,
    keep: Option<Keep>,
) -> Result<(Vec<Arc<Object>>, Revision), StoreError> {
    let Some(keep) = keep else {
        let list = store.list(prefix, &ListOptions::default()).await?;
        return Ok((
            list.items.into_iter().map(Arc::new).collect(),
            list.revision,
        ));
    };
    let list = store.list_raw(prefix, &ListOptions::default()).await?;
    let mut items = Vec::new();
    for raw in list.items.iter().filter(|r| keep(&r.json)) {
        let o: Object = serde_json::from_slice(&raw.json)
            .map_err(|e| StoreError::Corrupt(format!("an object under {prefix}: {e}")))?;
        items.push(Arc::new(o));
    }
    Ok((items, list.revision))
}

fn run(
    store: Arc<dyn Store>,
    prefix: String,
    cache: Option<Arc<Cache>>,
    keep: Option<Keep>,
    shutdown: watch::Receiver<bool>,
) -> Events {
    // Not a bounded channel: the store ends a watcher that falls behind, and a controller in
    // the middle of a long round must not make its watch fall behind (and list everything
    // again). The inbox keeps one change per object, so the backlog is bounded by what is
    // stored, not by how often it changes.
    let (tx, rx) = inbox::<()>();
    let health = Health::default();
    let events = Events::new(rx, health.clone());
    // Its end shows as the inbox's end (its one sender is gone).
    drop(spawn_into(
        store,
        prefix,
        cache,
        keep,
        tx,
        (),
        health,
        shutdown,
    ));
    events
}

/// Starts a reflector that sends its events, tagged `tag`, into a shared inbox (a
/// controller's, with its other sources).
#[allow(clippy::too_many_arguments)] // one call site per kind of reflector
pub(crate) fn spawn_into<S: Clone + Eq + std::hash::Hash + Send + 'static>(
    store: Arc<dyn Store>,
    prefix: String,
    cache: Option<Arc<Cache>>,
    keep: Option<Keep>,
    tx: InboxSender<S>,
    tag: S,
    health: Health,
    mut shutdown: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut backoff = Duration::from_millis(100);
        'list: loop {
            if *shutdown.borrow() {
                return;
            }
            let listing = std::time::Instant::now();
            let (items, revision) = match list(store.as_ref(), &prefix, keep).await {
                Ok(l) => l,
                Err(StoreError::Closed) => return,
                Err(e) => {
                    health.failed(&e);
                    tracing::warn!(prefix = %prefix, error = %e, "listing failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    continue;
                }
            };
            if let Some(c) = &cache {
                c.replace(&items, revision);
            }
            health.listed();
            if tx.send((tag.clone(), Event::Listed(items))).is_err() {
                return;
            }
            let mut last: Revision = revision;
            loop {
                // A wide watcher whatever the prefix: what it is sent goes at once into an
                // inbox that keeps one change per object, and falling behind a narrow queue
                // would cost a listing of the prefix.
                let mut w = match store.watch(&prefix, last, WatchOptions::in_process()).await {
                    Ok(w) => w,
                    Err(StoreError::Closed) => return,
                    Err(e) if e.is_expired() => {
                        health.failed(&e);
                        // Said aloud: a watch that cannot start where its listing ended lists
                        // again, and if listings keep outlasting the store's window that is a
                        // loop that parses the whole prefix over and over.
                        tracing::warn!(
                            prefix = %prefix,
                            from = last,
                            listed_in_ms = listing.elapsed().as_millis() as u64,
                            error = %e,
                            "a reflector's watch could not resume from its revision; listing again"
                        );
                        continue 'list;
                    }
                    Err(e) => {
                        health.failed(&e);
                        tracing::warn!(prefix = %prefix, error = %e, "watching failed; retrying");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                        continue;
                    }
                };
                backoff = Duration::from_millis(100);
                health.watching();
                loop {
                    let ev = tokio::select! {
                        ev = w.next() => ev,
                        _ = shutdown.changed() => return,
                    };
                    let out = match ev {
                        Some(Ok(WatchEvent::Added(o))) | Some(Ok(WatchEvent::Modified(o))) => {
                            last = last.max(o.revision().unwrap_or(last));
                            if let Some(c) = &cache {
                                c.upsert(o.clone(), last);
                            }
                            Event::Upsert(o)
                        }
                        Some(Ok(WatchEvent::Deleted(o))) => {
                            last = last.max(o.revision().unwrap_or(last));
                            if let Some(c) = &cache {
                                c.remove(&o, last);
                            }
                            Event::Delete(o)
                        }
                        Some(Ok(WatchEvent::Bookmark(r))) => {
                            last = last.max(r);
                            continue;
                        }
                        Some(Err(e)) if e.is_expired() => {
                            health.failed(&e);
                            tracing::warn!(prefix = %prefix, error = %e, "a reflector's watch lost its history or fell behind; listing again");
                            continue 'list;
                        }
                        Some(Err(StoreError::Closed)) => return,
                        Some(Err(e)) => {
                            health.failed(&e);
                            tracing::warn!(prefix = %prefix, error = %e, "a reflector's watch broke; resuming");
                            break;
                        }
                        // The store is closing, or the stream ended: resume if it is not.
                        None => match store.current_revision().await {
                            Err(StoreError::Closed) => return,
                            _ => break,
                        },
                    };
                    if tx.send((tag.clone(), out)).is_err() {
                        return;
                    }
                }
                // Not at once: a stream that keeps ending must not spin.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    })
}
