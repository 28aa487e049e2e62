//! Watch fan-out: one backend feed of committed changes serves any number of watchers.
//!
//! A backend calls [`WatchCache::publish`] with every committed change, in revision order. The
//! cache keeps a ring of recent changes (so most watches that start in the past replay from
//! memory; the older ones in it as stored JSON, see `PARSED_IN_RING`) and a bounded queue per
//! watcher, registered under its key prefix. Each watcher reads its queue at its own pace; its
//! backlog is bounded by the queue's capacity, and a watcher that falls further behind is ended
//! with [`StoreError::Expired`], never silently dropped and never slowing the writer or other
//! watchers. A queue holds only what its watcher has not read yet (a broadcast channel per
//! prefix, used before, kept its last `capacity` changes alive whether read or not: gigabytes
//! under a fleet's heartbeats). Watches that start before the ring fetch the gap from the
//! backend through [`History`].

use parking_lot::{Mutex, MutexGuard};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use orrery_api::{Object, fields, labels};
use tokio::sync::mpsc;

use crate::{Result, Revision, StoreError};

/// What a change did to its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeKind {
    Create,
    Update,
    Delete,
}

/// One committed change, as a backend reports it.
#[derive(Debug)]
pub struct Change {
    pub key: String,
    pub revision: Revision,
    pub kind: ChangeKind,
    /// The object after the change (for a delete, its last state), with `resourceVersion` set
    /// to `revision`.
    pub object: Arc<Object>,
    prev_raw: Option<Vec<u8>>,
    prev: OnceLock<Option<Arc<Object>>>,
    /// `object` as stored JSON (its `resourceVersion` aside), where the backend gave it: the
    /// ring keeps these bytes rather than the parsed object once newer changes have come.
    raw: Option<Arc<[u8]>>,
}

impl Change {
    /// A change whose previous state is known as stored JSON bytes; it is parsed only if a
    /// watcher with a selector needs it.
    pub fn new(
        key: String,
        revision: Revision,
        kind: ChangeKind,
        object: Arc<Object>,
        prev_raw: Option<Vec<u8>>,
    ) -> Self {
        Change {
            key,
            revision,
            kind,
            object,
            prev_raw,
            prev: OnceLock::new(),
            raw: None,
        }
    }

    /// A change whose object is also known as the stored JSON it was parsed from (`raw`,
    /// without `resourceVersion`: parsing it and setting that to `revision` gives `object`).
    pub fn stored(
        key: String,
        revision: Revision,
        kind: ChangeKind,
        object: Arc<Object>,
        raw: Arc<[u8]>,
        prev_raw: Option<Vec<u8>>,
    ) -> Self {
        Change {
            raw: Some(raw),
            ..Change::new(key, revision, kind, object, prev_raw)
        }
    }

    /// A change whose previous state is already parsed (or absent).
    pub fn with_prev(
        key: String,
        revision: Revision,
        kind: ChangeKind,
        object: Arc<Object>,
        prev: Option<Arc<Object>>,
    ) -> Self {
        let cell = OnceLock::new();
        let _ = cell.set(prev);
        Change {
            key,
            revision,
            kind,
            object,
            prev_raw: None,
            prev: cell,
            raw: None,
        }
    }

    /// The object before the change, if it existed.
    pub fn prev(&self) -> Option<&Arc<Object>> {
        self.prev
            .get_or_init(|| {
                let raw = self.prev_raw.as_ref()?;
                match serde_json::from_slice::<Object>(raw) {
                    Ok(o) => Some(Arc::new(o)),
                    Err(e) => {
                        tracing::error!(key = %self.key, error = %e, "stored previous object does not parse");
                        None
                    }
                }
            })
            .as_ref()
    }
}

/// How many of the newest changes the ring keeps parsed: a watch that starts where a listing
/// ended replays from these. Older ones keep their stored JSON where the backend gave it, and
/// are parsed again only for a watcher that replays them: in a large fleet nearly every change
/// in the ring is of an object changed again since, whose parsed copy (seven to ten times its
/// JSON) nothing else holds.
const PARSED_IN_RING: usize = 256;

/// A change as the ring keeps it, or as a backend's [`History`] returns it: parsed, or as
/// the stored JSON, parsed only when a watcher reaches it.
#[derive(Clone, Debug)]
pub enum Kept {
    Parsed(Arc<Change>),
    Stored(Arc<StoredChange>),
}

/// A change as stored: its object's JSON (without `resourceVersion`, which is `revision`).
#[derive(Debug)]
pub struct StoredChange {
    pub key: String,
    pub revision: Revision,
    pub kind: ChangeKind,
    /// The object after the change; for a delete, its last state.
    pub raw: Arc<[u8]>,
    /// The object before an update, as stored.
    pub prev_raw: Option<Vec<u8>>,
}

impl Kept {
    pub fn revision(&self) -> Revision {
        match self {
            Kept::Parsed(c) => c.revision,
            Kept::Stored(c) => c.revision,
        }
    }

    pub fn key(&self) -> &str {
        match self {
            Kept::Parsed(c) => &c.key,
            Kept::Stored(c) => &c.key,
        }
    }

    /// The same change with its object as stored JSON, where that is known.
    fn unparsed(&self) -> Kept {
        match self {
            Kept::Parsed(c) => match &c.raw {
                Some(raw) => Kept::Stored(Arc::new(StoredChange {
                    key: c.key.clone(),
                    revision: c.revision,
                    kind: c.kind,
                    raw: raw.clone(),
                    prev_raw: c.prev_raw.clone(),
                })),
                None => self.clone(),
            },
            Kept::Stored(_) => self.clone(),
        }
    }

    /// The change as a watcher receives it: parsed now if it was kept as stored.
    pub fn change(self) -> Result<Arc<Change>> {
        match self {
            Kept::Parsed(c) => Ok(c),
            Kept::Stored(c) => {
                let mut o: Object = serde_json::from_slice(&c.raw).map_err(|e| {
                    StoreError::Corrupt(format!(
                        "a change to {} at revision {} does not parse: {e}",
                        c.key, c.revision
                    ))
                })?;
                o.metadata.resource_version = c.revision.to_string();
                // Moved out when nothing else holds it (a backend's fresh change), copied
                // when the ring does.
                let c = Arc::try_unwrap(c).unwrap_or_else(|c| StoredChange {
                    key: c.key.clone(),
                    revision: c.revision,
                    kind: c.kind,
                    raw: c.raw.clone(),
                    prev_raw: c.prev_raw.clone(),
                });
                Ok(Arc::new(Change::stored(
                    c.key,
                    c.revision,
                    c.kind,
                    Arc::new(o),
                    c.raw,
                    c.prev_raw,
                )))
            }
        }
    }
}

/// What a watcher receives.
#[derive(Clone, Debug, PartialEq)]
pub enum WatchEvent {
    Added(Arc<Object>),
    Modified(Arc<Object>),
    Deleted(Arc<Object>),
    /// Everything up to this revision has been delivered.
    Bookmark(Revision),
}

impl WatchEvent {
    pub fn revision(&self) -> Revision {
        match self {
            WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o) => {
                o.revision().unwrap_or(0)
            }
            WatchEvent::Bookmark(r) => *r,
        }
    }

    pub fn object(&self) -> Option<&Arc<Object>> {
        match self {
            WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o) => Some(o),
            WatchEvent::Bookmark(_) => None,
        }
    }

    /// `ADDED`, `MODIFIED`, `DELETED` or `BOOKMARK`, as the watch protocol spells it.
    pub fn type_name(&self) -> &'static str {
        match self {
            WatchEvent::Added(_) => "ADDED",
            WatchEvent::Modified(_) => "MODIFIED",
            WatchEvent::Deleted(_) => "DELETED",
            WatchEvent::Bookmark(_) => "BOOKMARK",
        }
    }
}

/// How to watch.
#[derive(Clone, Debug, Default)]
pub struct WatchOptions {
    pub labels: labels::Selector,
    pub fields: fields::Selector,
    /// Send a bookmark this often (`None`: no bookmarks).
    pub bookmark_interval: Option<Duration>,
    /// Give this watcher the queue and the replay window of a watcher of a whole kind, whatever
    /// its prefix: a controller's reflector of one busy namespace (the members' Leases, a
    /// thousand renewals a second at 10,000 members) fell behind the narrow queue within a
    /// second of not being scheduled, and listed the namespace again.
    pub wide: bool,
}

impl WatchOptions {
    /// For a follower inside the server that lists a prefix and then applies every change as
    /// it comes (a controller's reflector, the server's own views): the wide queue and window
    /// whatever the prefix (see [`WatchOptions::wide`]).
    pub fn in_process() -> Self {
        WatchOptions {
            wide: true,
            ..Default::default()
        }
    }

    fn is_everything(&self) -> bool {
        self.labels.is_everything() && self.fields.is_everything()
    }

    fn matches(&self, obj: &Object) -> bool {
        self.labels.matches(obj.labels()) && self.fields.matches(obj)
    }
}

/// The backend's record of past changes, for watches that start before the cache's ring.
#[async_trait::async_trait]
pub trait History: Send + Sync {
    /// Changes to keys under `prefix` with `after < revision <= until`, in revision order.
    /// Fails with [`StoreError::Expired`] if part of that range was compacted. A backend that
    /// has the stored JSON at hand returns it unparsed ([`Kept::Stored`]): a gap before a
    /// wide watch holds thousands of changes, each parsed when the watcher reaches it.
    async fn changes(&self, prefix: &str, after: Revision, until: Revision) -> Result<Vec<Kept>>;
}

/// Sizes of the cache.
#[derive(Clone, Copy, Debug)]
pub struct WatchCacheConfig {
    /// How many recent changes to keep in memory for replay.
    pub history: usize,
    /// How many undelivered events one watcher of a whole kind (or more) may have before it
    /// is ended as expired.
    pub watcher_buffer: usize,
    /// The same for watchers of a narrower prefix (a namespace, one object), which sees only
    /// its own, far fewer, events: a fleet has a namespace per cluster, each watched by its
    /// agent. (Queues take memory only for what they hold.)
    pub narrow_watcher_buffer: usize,
    /// How far before the ring a watch of a narrow prefix may start and still be replayed
    /// from the backend's history, in revisions; one that starts earlier is told to re-list
    /// (`410`), as Kubernetes' watch cache tells a start older than its window. A replay reads
    /// every change of the installation in the gap, whatever the watcher's prefix: a fleet's
    /// agents watching their namespaces again after a failover would each read minutes of
    /// every member's heartbeats, where a re-list reads their one namespace.
    pub max_replay: Revision,
    /// The same for watchers of a whole kind or more (a controller's reflector, a client's
    /// informer), which list before they watch. Listing a large kind takes seconds, and a
    /// fleet writes a thousand revisions a second: with the narrow window such a watch,
    /// starting where its listing ended, was already too old, and its watcher listed again,
    /// and again, each listing slower under the load of the others.
    pub max_replay_wide: Revision,
}

impl Default for WatchCacheConfig {
    fn default() -> Self {
        WatchCacheConfig {
            history: 4096,
            watcher_buffer: 16384,
            narrow_watcher_buffer: 1024,
            max_replay: 4096,
            max_replay_wide: 65_536,
        }
    }
}

impl WatchCacheConfig {
    /// The channel capacity for a wide watcher (see [`is_wide`] and [`WatchOptions::wide`]),
    /// or a narrow one.
    fn buffer_for(&self, wide: bool) -> usize {
        if wide {
            self.watcher_buffer
        } else {
            self.narrow_watcher_buffer
        }
    }

    /// How far before the ring a wide or a narrow watch may start (see `max_replay`).
    fn replay_for(&self, wide: bool) -> Revision {
        if wide {
            self.max_replay_wide.max(self.max_replay)
        } else {
            self.max_replay
        }
    }
}

/// Whether `prefix` is a whole kind or wider: `/registry/<group>/<plural>/` and shallower.
fn is_wide(prefix: &str) -> bool {
    prefix.matches('/').count() <= 4
}

/// A store's watchers, as [`WatchCache::stats`] counts them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WatchStats {
    /// Watchers registered.
    pub watchers: usize,
    /// Changes waiting in their queues, all together.
    pub queued: usize,
    /// Changes waiting in the fullest queue.
    pub queued_max: usize,
}

/// The in-process fan-out of one store's changes.
#[derive(Clone, Debug)]
pub struct WatchCache {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// The highest revision published; every change up to it has been sent to its channels.
    dispatched: AtomicI64,
    closed: AtomicBool,
    config: WatchCacheConfig,
}

#[derive(Debug)]
struct State {
    ring: VecDeque<Kept>,
    /// The ring holds every change with a revision above this.
    ring_start: Revision,
    compacted: Revision,
    /// Per watched prefix, its watchers' queues.
    channels: HashMap<String, Vec<Feed>>,
}

/// One watcher's end of the cache.
#[derive(Debug)]
struct Feed {
    tx: mpsc::Sender<Arc<Change>>,
    /// Set when its queue was full: the watcher is ended as expired once it has read what the
    /// queue holds.
    lagged: Arc<AtomicBool>,
}

impl WatchCache {
    /// A cache whose feed starts after `revision`.
    pub fn new(config: WatchCacheConfig, revision: Revision) -> Self {
        let config = WatchCacheConfig {
            history: config.history.max(1),
            watcher_buffer: config.watcher_buffer.max(1),
            narrow_watcher_buffer: config.narrow_watcher_buffer.max(1),
            max_replay: config.max_replay.max(0),
            max_replay_wide: config.max_replay_wide.max(0),
        };
        WatchCache {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    ring: VecDeque::with_capacity(config.history.min(1 << 16)),
                    ring_start: revision,
                    compacted: 0,
                    channels: HashMap::new(),
                }),
                dispatched: AtomicI64::new(revision),
                closed: AtomicBool::new(false),
                config,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // (parking_lot: no poisoning. A panic while holding this lock leaves the state
        // consistent, every mutation being a single push or insert.)
        self.shared.state.lock()
    }

    /// The highest revision published so far.
    pub fn revision(&self) -> Revision {
        self.shared.dispatched.load(Ordering::Acquire)
    }

    /// Publishes one committed change. Must be called in strictly increasing revision order.
    pub fn publish(&self, change: Arc<Change>) {
        let mut st = self.lock();
        let rev = change.revision;
        if rev <= self.shared.dispatched.load(Ordering::Relaxed) {
            tracing::warn!(rev, "watch cache: change published out of order; ignored");
            return;
        }
        if st.ring.len() >= self.shared.config.history
            && let Some(old) = st.ring.pop_front()
        {
            st.ring_start = old.revision();
        }
        st.ring.push_back(Kept::Parsed(change.clone()));
        if let Some(i) = st.ring.len().checked_sub(PARSED_IN_RING + 1) {
            st.ring[i] = st.ring[i].unparsed();
        }
        if !st.channels.is_empty() {
            let key = change.key.as_str();
            let mut emptied = Vec::new();
            for prefix in std::iter::once("").chain(key.match_indices('/').map(|(i, _)| &key[..=i]))
            {
                let Some(feeds) = st.channels.get_mut(prefix) else {
                    continue;
                };
                // A full queue ends its watcher (lagged); a closed one lost its watcher.
                feeds.retain(|f| match f.tx.try_send(change.clone()) {
                    Ok(()) => true,
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        f.lagged.store(true, Ordering::Release);
                        false
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => false,
                });
                if feeds.is_empty() {
                    emptied.push(prefix.to_string());
                }
            }
            for p in emptied {
                st.channels.remove(&p);
            }
        }
        // After sending: a watcher that reads `dispatched` and then finds its channel empty
        // has seen every change up to it.
        self.shared.dispatched.store(rev, Ordering::Release);
    }

    /// Advances the published revision without a change (another writer's revision).
    pub fn advance(&self, revision: Revision) {
        let _st = self.lock();
        if revision > self.shared.dispatched.load(Ordering::Relaxed) {
            self.shared.dispatched.store(revision, Ordering::Release);
        }
    }

    /// Records that revisions before `revision` are gone; older watches now expire.
    pub fn set_compacted(&self, revision: Revision) {
        let mut st = self.lock();
        st.compacted = st.compacted.max(revision);
    }

    pub fn compacted(&self) -> Revision {
        self.lock().compacted
    }

    /// The feed lost continuity (a backend watch had to restart): every watcher is ended with
    /// an expired error so that it re-lists, and the cache restarts after `revision`.
    pub fn reset(&self, revision: Revision) {
        let mut st = self.lock();
        st.ring.clear();
        st.ring_start = revision;
        st.channels.clear();
        self.shared.dispatched.store(revision, Ordering::Release);
    }

    /// Shuts the cache down: watchers end cleanly.
    pub fn close(&self) {
        self.shared.closed.store(true, Ordering::Release);
        self.lock().channels.clear();
    }

    /// Its watchers and what waits in their queues (for `/metrics`): the changes sent to a
    /// watcher and not read yet, held in memory for it (each may be the last holder of a
    /// parsed object). Watchers gone are not counted.
    pub fn stats(&self) -> WatchStats {
        let st = self.lock();
        let mut stats = WatchStats::default();
        for f in st.channels.values().flatten().filter(|f| !f.tx.is_closed()) {
            let queued = f.tx.max_capacity() - f.tx.capacity();
            stats.watchers += 1;
            stats.queued += queued;
            stats.queued_max = stats.queued_max.max(queued);
        }
        stats
    }

    /// Watches keys under `prefix` (empty, or ending in `/`) for changes after revision
    /// `from`. Changes the ring no longer holds are fetched from `history`.
    pub async fn watch(
        &self,
        prefix: &str,
        from: Revision,
        opts: WatchOptions,
        history: &dyn History,
    ) -> Result<WatchStream> {
        if !(prefix.is_empty() || prefix.ends_with('/')) {
            return Err(StoreError::InvalidArgument(format!(
                "watch prefix {prefix:?} must end with '/'"
            )));
        }
        if self.shared.closed.load(Ordering::Acquire) {
            return Err(StoreError::Closed);
        }
        let (rx, mut replay, gap) = {
            let mut st = self.lock();
            if from < st.compacted {
                return Err(StoreError::Expired {
                    requested: from,
                    compacted: st.compacted,
                });
            }
            let wide = opts.wide || is_wide(prefix);
            let replayable = st.ring_start - self.shared.config.replay_for(wide);
            if from < replayable {
                return Err(StoreError::Expired {
                    requested: from,
                    compacted: replayable,
                });
            }
            let buffer = self.shared.config.buffer_for(wide);
            let (tx, rx) = mpsc::channel(buffer);
            let lagged = Arc::new(AtomicBool::new(false));
            let feeds = st.channels.entry(prefix.to_string()).or_default();
            // Watchers gone from a quiet prefix (no change came to find them gone) go now, so
            // one that watches again and again does not pile up feeds.
            feeds.retain(|f| !f.tx.is_closed());
            feeds.push(Feed {
                tx,
                lagged: lagged.clone(),
            });
            let rx = (rx, lagged);
            let replay: VecDeque<Kept> = st
                .ring
                .iter()
                .filter(|c| c.revision() > from && c.key().starts_with(prefix))
                .cloned()
                .collect();
            let gap = (from < st.ring_start).then_some(st.ring_start);
            (rx, replay, gap)
        };
        if let Some(until) = gap {
            let older = history.changes(prefix, from, until).await?;
            for c in older.into_iter().rev() {
                replay.push_front(c);
            }
        }
        let bookmark = opts.bookmark_interval.map(|every| {
            let mut t = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            t
        });
        Ok(WatchStream {
            shared: self.shared.clone(),
            prefix: prefix.to_string(),
            opts,
            replay,
            rx: rx.0,
            lagged: rx.1,
            last: from,
            bookmark,
            done: false,
            map: None,
        })
    }
}

/// What a store layered over another does to each object a watch delivers (an encrypting
/// store opens what it sealed).
pub type MapObject = Arc<dyn Fn(Arc<Object>) -> Result<Arc<Object>> + Send + Sync>;

struct Mapper(MapObject);

impl std::fmt::Debug for Mapper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Mapper(..)")
    }
}

/// One watcher's stream of events.
#[derive(Debug)]
pub struct WatchStream {
    shared: Arc<Shared>,
    prefix: String,
    opts: WatchOptions,
    /// What the ring and the backend's history hold for this watcher; a change the ring kept
    /// as stored JSON is parsed as it is delivered, not all at once when the watch starts.
    replay: VecDeque<Kept>,
    rx: mpsc::Receiver<Arc<Change>>,
    lagged: Arc<AtomicBool>,
    /// The highest revision delivered (or known to hold nothing for this watcher).
    last: Revision,
    bookmark: Option<tokio::time::Interval>,
    done: bool,
    map: Option<Mapper>,
}

impl WatchStream {
    /// This stream with `f` applied to every object it delivers, after its selectors (which
    /// see the objects as stored); an object `f` refuses ends the stream with that error.
    pub fn map_objects(mut self, f: MapObject) -> Self {
        self.map = Some(Mapper(f));
        self
    }

    /// The next event; `None` when the stream has ended (store closed, or after an error).
    pub async fn next(&mut self) -> Option<Result<WatchEvent>> {
        let ev = self.next_stored().await;
        let Some(Mapper(f)) = &self.map else {
            return ev;
        };
        let mapped = match ev? {
            Ok(WatchEvent::Added(o)) => f(o).map(WatchEvent::Added),
            Ok(WatchEvent::Modified(o)) => f(o).map(WatchEvent::Modified),
            Ok(WatchEvent::Deleted(o)) => f(o).map(WatchEvent::Deleted),
            other => other,
        };
        if mapped.is_err() {
            self.done = true;
        }
        Some(mapped)
    }

    /// The next event as stored.
    async fn next_stored(&mut self) -> Option<Result<WatchEvent>> {
        if self.done {
            return None;
        }
        loop {
            // A watcher that fell behind re-lists anyway: it is told at once, not after
            // reading what its queue still holds.
            if self.lagged.load(Ordering::Acquire) {
                self.done = true;
                tracing::debug!(prefix = %self.prefix, "watcher fell behind; ending it");
                return Some(Err(StoreError::Expired {
                    requested: self.last,
                    compacted: self.last + 1,
                }));
            }
            while let Some(kept) = self.replay.pop_front() {
                let change = match kept.change() {
                    Ok(c) => c,
                    Err(e) => {
                        self.done = true;
                        return Some(Err(e));
                    }
                };
                if let Some(ev) = self.accept(&change) {
                    return Some(Ok(ev));
                }
            }
            let received = match self.bookmark.as_mut() {
                Some(timer) => tokio::select! {
                    biased;
                    r = self.rx.recv() => r,
                    _ = timer.tick() => {
                        let published = self.shared.dispatched.load(Ordering::Acquire);
                        if self.rx.is_empty() {
                            self.last = self.last.max(published);
                            return Some(Ok(WatchEvent::Bookmark(self.last)));
                        }
                        continue;
                    }
                },
                None => self.rx.recv().await,
            };
            match received {
                Some(change) => {
                    if let Some(ev) = self.accept(&change) {
                        return Some(Ok(ev));
                    }
                }
                None => {
                    if self.lagged.load(Ordering::Acquire) {
                        continue;
                    }
                    self.done = true;
                    if self.shared.closed.load(Ordering::Acquire) {
                        return None;
                    }
                    // The cache was reset: this watcher may have missed changes.
                    return Some(Err(StoreError::Expired {
                        requested: self.last,
                        compacted: self.last + 1,
                    }));
                }
            }
        }
    }

    /// A bookmark now, if this watcher has been given everything published so far (nothing
    /// waits in its replay or queue): the revision it has been brought up to. A watch ending
    /// for its timeout sends one, as Kubernetes' does, so that its client starts the next from
    /// a revision still in the ring rather than from its last event or periodic bookmark.
    pub fn bookmark_now(&mut self) -> Option<Revision> {
        // Read before the queue is found empty (see `publish`).
        let published = self.shared.dispatched.load(Ordering::Acquire);
        if self.done
            || self.lagged.load(Ordering::Acquire)
            || !self.replay.is_empty()
            || !self.rx.is_empty()
        {
            return None;
        }
        self.last = self.last.max(published);
        Some(self.last)
    }

    /// The highest revision this watcher has been brought up to.
    pub fn revision(&self) -> Revision {
        self.last
    }

    /// Turns a change into this watcher's event, applying its selectors: an object that stops
    /// matching is reported as deleted, one that starts matching as added.
    fn accept(&mut self, change: &Change) -> Option<WatchEvent> {
        if change.revision <= self.last || !change.key.starts_with(&self.prefix) {
            return None;
        }
        self.last = change.revision;
        let obj = change.object.clone();
        if self.opts.is_everything() {
            return Some(match change.kind {
                ChangeKind::Create => WatchEvent::Added(obj),
                ChangeKind::Update => WatchEvent::Modified(obj),
                ChangeKind::Delete => WatchEvent::Deleted(obj),
            });
        }
        let now = self.opts.matches(&obj);
        match change.kind {
            ChangeKind::Create => now.then_some(WatchEvent::Added(obj)),
            ChangeKind::Delete => now.then_some(WatchEvent::Deleted(obj)),
            ChangeKind::Update => {
                let before = change.prev().is_some_and(|p| self.opts.matches(p));
                match (before, now) {
                    (true, true) => Some(WatchEvent::Modified(obj)),
                    (false, true) => Some(WatchEvent::Added(obj)),
                    (true, false) => Some(WatchEvent::Deleted(obj)),
                    (false, false) => None,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn narrow_prefixes_get_smaller_buffers() {
        let c = WatchCacheConfig::default();
        let buffer = |p: &str| c.buffer_for(is_wide(p));
        assert_eq!(buffer(""), 16384);
        assert_eq!(buffer("/registry/"), 16384);
        assert_eq!(buffer("/registry/apps/deployments/"), 16384);
        assert_eq!(buffer("/registry/apps/deployments/ns/"), 1024);
        assert_eq!(
            buffer("/registry/multicluster.io/works/orrery-cluster-a/"),
            1024
        );
    }

    struct NoHistory;
    #[async_trait::async_trait]
    impl History for NoHistory {
        async fn changes(&self, _: &str, after: Revision, _: Revision) -> Result<Vec<Kept>> {
            Err(StoreError::Expired {
                requested: after,
                compacted: after + 1,
            })
        }
    }

    fn change(key: &str, rev: Revision, kind: ChangeKind, label: &str) -> Arc<Change> {
        let mut o = Object::new("v1", "ConfigMap")
            .with_name(key)
            .with_label("app", label);
        o.metadata.resource_version = rev.to_string();
        Arc::new(Change::with_prev(
            key.to_string(),
            rev,
            kind,
            Arc::new(o),
            None,
        ))
    }

    #[tokio::test]
    async fn replays_ring_then_live_in_order() {
        let cache = WatchCache::new(
            WatchCacheConfig {
                history: 10,
                watcher_buffer: 10,
                narrow_watcher_buffer: 10,
                max_replay: 1000,
                max_replay_wide: 1000,
            },
            0,
        );
        cache.publish(change("/a/1", 1, ChangeKind::Create, "x"));
        cache.publish(change("/b/1", 2, ChangeKind::Create, "x"));
        cache.publish(change("/a/2", 3, ChangeKind::Create, "x"));
        let mut w = cache
            .watch("/a/", 1, WatchOptions::default(), &NoHistory)
            .await
            .unwrap();
        cache.publish(change("/a/1", 4, ChangeKind::Delete, "x"));
        let e1 = w.next().await.unwrap().unwrap();
        let e2 = w.next().await.unwrap().unwrap();
        assert_eq!((e1.type_name(), e1.revision()), ("ADDED", 3));
        assert_eq!((e2.type_name(), e2.revision()), ("DELETED", 4));
    }

    #[tokio::test]
    async fn the_ring_keeps_older_changes_as_stored_and_replays_them_the_same() {
        let cache = WatchCache::new(
            WatchCacheConfig {
                history: 1000,
                watcher_buffer: 1000,
                narrow_watcher_buffer: 1000,
                max_replay: 1000,
                max_replay_wide: 1000,
            },
            0,
        );
        let total = PARSED_IN_RING as Revision + 50;
        let mut published = Vec::new();
        for r in 1..=total {
            let kind = match r {
                1 => ChangeKind::Create,
                r if r == total => ChangeKind::Delete,
                _ => ChangeKind::Update,
            };
            let mut o = Object::new("v1", "ConfigMap")
                .with_name("x")
                .with_label("app", format!("v{r}"));
            let raw: Arc<[u8]> = serde_json::to_vec(&o).unwrap().into();
            o.metadata.resource_version = r.to_string();
            let o = Arc::new(o);
            cache.publish(Arc::new(Change::stored(
                "/a/x".into(),
                r,
                kind,
                o.clone(),
                raw,
                None,
            )));
            published.push((kind, o));
        }
        // The oldest are no longer held parsed; the newest are.
        assert_eq!(Arc::strong_count(&published[0].1), 1);
        assert_eq!(Arc::strong_count(&published[total as usize - 1].1), 2);
        // A watch from the start replays every change as it was published.
        let mut w = cache
            .watch("/a/", 0, WatchOptions::default(), &NoHistory)
            .await
            .unwrap();
        for (kind, o) in &published {
            let ev = w.next().await.unwrap().unwrap();
            let want = match kind {
                ChangeKind::Create => WatchEvent::Added(o.clone()),
                ChangeKind::Update => WatchEvent::Modified(o.clone()),
                ChangeKind::Delete => WatchEvent::Deleted(o.clone()),
            };
            assert_eq!(ev, want);
        }
    }

    #[tokio::test]
    async fn too_old_without_history_expires() {
        let cache = WatchCache::new(
            WatchCacheConfig {
                history: 2,
                watcher_buffer: 10,
                narrow_watcher_buffer: 10,
                max_replay: 1000,
                max_replay_wide: 1000,
            },
            0,
        );
        for r in 1..=5 {
            cache.publish(change("/a/x", r, ChangeKind::Update, "x"));
        }
        assert!(
            cache
                .watch("/a/", 1, WatchOptions::default(), &NoHistory)
                .await
                .unwrap_err()
                .is_expired()
        );
        assert!(
            cache
                .watch("/a/", 3, WatchOptions::default(), &NoHistory)
                .await
                .is_ok()
        );
        assert!(
            cache
                .watch("/a", 3, WatchOptions::default(), &NoHistory)
                .await
                .is_err(),
            "prefix must end in /"
        );
    }

    /// Counts the replays asked of it.
    struct CountingHistory(std::sync::atomic::AtomicUsize);

    #[async_trait::async_trait]
    impl History for CountingHistory {
        async fn changes(&self, _: &str, _: Revision, _: Revision) -> Result<Vec<Kept>> {
            self.0.fetch_add(1, Ordering::Relaxed);
            Ok(Vec::new())
        }
    }

    #[tokio::test]
    async fn a_start_far_before_the_ring_is_told_to_relist_not_replayed() {
        let cache = WatchCache::new(
            WatchCacheConfig {
                history: 2,
                watcher_buffer: 10,
                narrow_watcher_buffer: 10,
                max_replay: 3,
                max_replay_wide: 3,
            },
            0,
        );
        for r in 1..=10 {
            cache.publish(change("/a/x", r, ChangeKind::Update, "x"));
        }
        // The ring holds 9 and 10: a watch from 5 has 6 to 8 replayed from the backend; one
        // from 4 is told to re-list.
        let history = CountingHistory(Default::default());
        let near = cache.watch("/a/", 5, WatchOptions::default(), &history);
        assert!(near.await.is_ok());
        assert_eq!(history.0.load(Ordering::Relaxed), 1, "replayed");
        let far = cache.watch("/a/", 4, WatchOptions::default(), &history);
        match far.await {
            Err(StoreError::Expired {
                requested,
                compacted,
            }) => assert_eq!((requested, compacted), (4, 5)),
            other => panic!("expected Expired, got {other:?}"),
        }
        assert_eq!(history.0.load(Ordering::Relaxed), 1, "not replayed");
    }

    /// A cache's sizes: ring, wide and narrow queues, narrow and wide replay windows.
    fn sized(
        history: usize,
        watcher_buffer: usize,
        narrow_watcher_buffer: usize,
        max_replay: Revision,
        max_replay_wide: Revision,
    ) -> WatchCacheConfig {
        WatchCacheConfig {
            history,
            watcher_buffer,
            narrow_watcher_buffer,
            max_replay,
            max_replay_wide,
        }
    }

    #[tokio::test]
    async fn a_watch_of_a_whole_kind_may_start_further_back_than_one_of_a_namespace() {
        let cache = WatchCache::new(sized(2, 10, 10, 3, 6), 0);
        for r in 1..=10 {
            cache.publish(change(
                "/registry/g/things/ns/x",
                r,
                ChangeKind::Update,
                "x",
            ));
        }
        // The ring holds 9 and 10 (it starts after 8). A start at 4 is too old for a
        // namespace's watcher (the window reaches back to 5) and within a whole kind's (to 2),
        // which a listing of the kind ends at after others have written for a while.
        let history = CountingHistory(Default::default());
        let narrow = cache.watch(
            "/registry/g/things/ns/",
            4,
            WatchOptions::default(),
            &history,
        );
        match narrow.await {
            Err(StoreError::Expired { compacted, .. }) => assert_eq!(compacted, 5),
            other => panic!("expected Expired, got {other:?}"),
        }
        assert_eq!(history.0.load(Ordering::Relaxed), 0);
        let wide = cache.watch("/registry/g/things/", 4, WatchOptions::default(), &history);
        assert!(wide.await.is_ok());
        assert_eq!(history.0.load(Ordering::Relaxed), 1, "replayed");
        let older = cache.watch("/registry/g/things/", 1, WatchOptions::default(), &history);
        match older.await {
            Err(StoreError::Expired { compacted, .. }) => assert_eq!(compacted, 2),
            other => panic!("expected Expired, got {other:?}"),
        }
        // A namespace watched as a whole kind is (a controller's reflector of a busy one).
        let marked = WatchOptions::in_process();
        let marked = cache.watch("/registry/g/things/ns/", 4, marked, &history);
        assert!(marked.await.is_ok());
        assert_eq!(history.0.load(Ordering::Relaxed), 2, "replayed");
    }

    /// A busy namespace watched as a whole kind keeps the wide queue: the narrow one ends its
    /// watcher after a few unread changes, the wide one holds them.
    #[tokio::test]
    async fn a_namespace_watched_as_a_whole_kind_has_the_wide_queue() {
        let cache = WatchCache::new(sized(100, 100, 2, 100, 100), 0);
        let prefix = "/registry/coordination.k8s.io/leases/members/";
        let mut narrow = cache
            .watch(prefix, 0, WatchOptions::default(), &NoHistory)
            .await
            .unwrap();
        let wide = WatchOptions::in_process();
        let mut wide = cache.watch(prefix, 0, wide, &NoHistory).await.unwrap();
        for r in 1..=5 {
            let key = format!("{prefix}m-{r}");
            cache.publish(change(&key, r, ChangeKind::Create, "x"));
        }
        assert!(narrow.next().await.unwrap().unwrap_err().is_expired());
        for r in 1..=5 {
            assert_eq!(wide.next().await.unwrap().unwrap().revision(), r);
        }
    }

    /// What waits counts per watcher, read or not, and a watcher gone is not counted.
    #[tokio::test]
    async fn stats_count_what_waits_in_each_watchers_queue() {
        let cache = WatchCache::new(sized(100, 100, 100, 100, 100), 0);
        assert_eq!(cache.stats(), WatchStats::default());
        let mut a = cache
            .watch("/a/", 0, WatchOptions::default(), &NoHistory)
            .await
            .unwrap();
        let b = cache
            .watch("/b/", 0, WatchOptions::default(), &NoHistory)
            .await
            .unwrap();
        let everything = cache
            .watch("", 0, WatchOptions::default(), &NoHistory)
            .await
            .unwrap();
        for r in 1..=3 {
            cache.publish(change("/a/x", r, ChangeKind::Update, "x"));
        }
        cache.publish(change("/b/x", 4, ChangeKind::Create, "x"));
        let stats = |watchers, queued, queued_max| WatchStats {
            watchers,
            queued,
            queued_max,
        };
        // `a` holds 3, `b` 1, the watcher of everything 4.
        assert_eq!(cache.stats(), stats(3, 8, 4));
        a.next().await.unwrap().unwrap();
        a.next().await.unwrap().unwrap();
        assert_eq!(cache.stats(), stats(3, 6, 4));
        drop(everything);
        assert_eq!(cache.stats(), stats(2, 2, 1));
        drop(b);
        assert_eq!(cache.stats(), stats(1, 1, 1));
    }

    #[tokio::test]
    async fn slow_watcher_expires_and_fast_one_does_not() {
        let cache = WatchCache::new(
            WatchCacheConfig {
                history: 4,
                watcher_buffer: 4,
                narrow_watcher_buffer: 4,
                max_replay: 1000,
                max_replay_wide: 1000,
            },
            0,
        );
        let mut slow = cache
            .watch("/a/", 0, WatchOptions::default(), &NoHistory)
            .await
            .unwrap();
        let mut fast = cache
            .watch("/a/", 0, WatchOptions::default(), &NoHistory)
            .await
            .unwrap();
        for r in 1..=20 {
            cache.publish(change("/a/x", r, ChangeKind::Update, "x"));
            assert_eq!(fast.next().await.unwrap().unwrap().revision(), r);
        }
        assert!(slow.next().await.unwrap().unwrap_err().is_expired());
        assert!(slow.next().await.is_none());
    }

    #[tokio::test]
    async fn selector_transitions() {
        let cache = WatchCache::new(WatchCacheConfig::default(), 0);
        let opts = WatchOptions {
            labels: labels::Selector::parse("app=web").unwrap(),
            ..Default::default()
        };
        let mut w = cache.watch("/a/", 0, opts, &NoHistory).await.unwrap();
        let mk = |rev, kind, label: &str, prev: Option<&str>| {
            let mut o = Object::new("v1", "ConfigMap")
                .with_name("x")
                .with_label("app", label);
            o.metadata.resource_version = format!("{rev}");
            let p = prev.map(|l| {
                Arc::new(
                    Object::new("v1", "ConfigMap")
                        .with_name("x")
                        .with_label("app", l),
                )
            });
            Arc::new(Change::with_prev("/a/x".into(), rev, kind, Arc::new(o), p))
        };
        cache.publish(mk(1, ChangeKind::Create, "db", None));
        cache.publish(mk(2, ChangeKind::Update, "web", Some("db")));
        cache.publish(mk(3, ChangeKind::Update, "web", Some("web")));
        cache.publish(mk(4, ChangeKind::Update, "db", Some("web")));
        cache.publish(mk(5, ChangeKind::Delete, "db", Some("db")));
        let mut got = Vec::new();
        for _ in 0..3 {
            let e = w.next().await.unwrap().unwrap();
            got.push((e.type_name(), e.revision()));
        }
        assert_eq!(got, [("ADDED", 2), ("MODIFIED", 3), ("DELETED", 4)]);
    }

    #[tokio::test]
    async fn bookmarks_and_close() {
        let cache = WatchCache::new(WatchCacheConfig::default(), 7);
        let opts = WatchOptions {
            bookmark_interval: Some(Duration::from_millis(20)),
            ..Default::default()
        };
        let mut w = cache.watch("/a/", 7, opts, &NoHistory).await.unwrap();
        cache.publish(change("/b/x", 8, ChangeKind::Create, "x"));
        assert_eq!(w.next().await.unwrap().unwrap(), WatchEvent::Bookmark(8));
        cache.close();
        assert!(w.next().await.is_none());
    }

    #[tokio::test]
    async fn a_bookmark_on_demand_only_once_everything_was_delivered() {
        let cache = WatchCache::new(WatchCacheConfig::default(), 7);
        let mut w = cache
            .watch("/a/", 7, WatchOptions::default(), &NoHistory)
            .await
            .unwrap();
        // Another prefix's change: nothing for this watcher up to 8.
        cache.publish(change("/b/x", 8, ChangeKind::Create, "x"));
        assert_eq!(w.bookmark_now(), Some(8));
        // Its own change still queued: no bookmark past it, until it is read.
        cache.publish(change("/a/x", 9, ChangeKind::Create, "x"));
        cache.publish(change("/b/y", 10, ChangeKind::Create, "x"));
        assert_eq!(w.bookmark_now(), None);
        assert_eq!(w.next().await.unwrap().unwrap().revision(), 9);
        assert_eq!(w.bookmark_now(), Some(10));
    }

    #[tokio::test]
    async fn reset_expires_watchers() {
        let cache = WatchCache::new(WatchCacheConfig::default(), 0);
        let mut w = cache
            .watch("/a/", 0, WatchOptions::default(), &NoHistory)
            .await
            .unwrap();
        cache.reset(10);
        assert!(w.next().await.unwrap().unwrap_err().is_expired());
    }
}
