//! The loop every controller runs (kube-runtime's `Controller`, client-go's
//! controller pattern): sources mapped to keys, `reconcile(key) -> Action`, an error policy.
//!
//! A controller is its state, its sources and its [`Reconciler`]. The [`Controller`] owns the
//! rest, the same way for all of them:
//!
//! ```text
//!   reflectors ──▶ inbox (one change per object) ──on_event──▶ keys ──▶ WorkQueue
//!                                                                        │ due keys, once
//!                     Barrier: nothing is reconciled before              ▼ each at a time
//!                     every source has listed                 reconcile(key), `concurrency`
//!                                                              at once ──▶ Action / error
//!                                                                 │           │
//!                                      Done: forgotten; After(d): again then; error: backoff
//! ```
//!
//! - **Sources** are reflectors over store prefixes, all sending into one inbox tagged with
//!   their name; a source's listing replaces its changes still waiting, so a controller behind
//!   a busy source holds one change per object.
//! - **Keys**: [`Reconciler::on_event`] keeps what the controller keeps of a change and says
//!   which keys it touches, now or after a settling time (a burst of heartbeats makes one
//!   round). When the barrier first passes, and whenever `on_event` asks for it (a source
//!   listed again) or a resync period passes, every key of [`Reconciler::all_keys`] is queued.
//! - **One retry behaviour**: a failed key comes back after a per-key exponential backoff
//!   with jitter, behind fresh work, unless [`Reconciler::error_policy`] says otherwise; a
//!   success resets it. A store that closed ends the controller.
//! - **Concurrency**: up to `concurrency` keys are reconciled at once, never one key twice at
//!   a time; changes are taken in between batches, so a long catch-up does not starve them.
//! - **Metrics**: synced, queue depth, reconcile durations, errors and retries per controller
//!   ([`crate::metrics`]).
//!
//! Leader gating and fencing are a term's: [`crate::terms`] starts a term's controllers on a
//! fenced store and stops them when the term ends.

use std::collections::HashSet;
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use orrery_store::{Store, StoreError};
use tokio::sync::watch;

use crate::Barrier;
use crate::cache::Cache;
use crate::inbox::{Inbox, InboxSender, inbox};
use crate::metrics::Handle;
use crate::queue::{Rank, WorkQueue};
use crate::reflector::{self, Event, Health, Keep};

/// What a reconcile asks for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing until a source says the key changed.
    Done,
    /// Another look after this long (time-driven work: a grace period, a schedule).
    After(Duration),
}

impl From<Option<Duration>> for Action {
    /// `Some(d)`: another look after `d`.
    fn from(after: Option<Duration>) -> Self {
        after.map_or(Action::Done, Action::After)
    }
}

/// What to do with a key whose reconcile failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// The per-key exponential backoff with jitter.
    Backoff,
    /// After this long (the error says when trying again makes sense).
    After(Duration),
    /// Not again until a source says the key changed (the error is the object's, and will not
    /// pass by trying again).
    Wait,
}

/// An error a reconcile returns.
pub trait ReconcileError: std::fmt::Display + Send + 'static {
    /// The store closed: the controller ends.
    fn is_closed(&self) -> bool {
        false
    }
}

impl ReconcileError for StoreError {
    fn is_closed(&self) -> bool {
        matches!(self, StoreError::Closed)
    }
}

impl ReconcileError for String {}

/// Where a change came from: a source's name and, for a family of sources (one per
/// template kind a controller follows), its slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Origin {
    pub name: &'static str,
    pub slot: Option<usize>,
}

impl Origin {
    /// A source of its own (not of a family).
    pub const fn named(name: &'static str) -> Origin {
        Origin { name, slot: None }
    }

    /// What the barrier knows the source by: `name`, or `name/slot`.
    fn barrier_key(&self) -> String {
        match self.slot {
            Some(i) => format!("{}/{i}", self.name),
            None => self.name.to_string(),
        }
    }
}

impl PartialEq<&str> for Origin {
    fn eq(&self, other: &&str) -> bool {
        self.name == *other
    }
}

/// The keys a change touches (see [`Reconciler::on_event`]), and sources to follow from now
/// on.
#[derive(Debug)]
pub struct Keys<K> {
    now: Vec<K>,
    later: Vec<(K, Duration)>,
    all: bool,
    follow: Vec<Source>,
}

impl<K> Default for Keys<K> {
    fn default() -> Self {
        Keys {
            now: Vec::new(),
            later: Vec::new(),
            all: false,
            follow: Vec::new(),
        }
    }
}

impl<K> Keys<K> {
    /// Reconcile `k` (soon: after the controller's settling time, if it has one).
    pub fn push(&mut self, k: K) {
        self.now.push(k);
    }

    /// Reconcile `k` after `d` at the latest (an earlier push wins).
    pub fn push_after(&mut self, k: K, d: Duration) {
        self.later.push((k, d));
    }

    /// Reconcile every key of [`Reconciler::all_keys`].
    pub fn all(&mut self) {
        self.all = true;
    }

    /// Follow a source from now on (once per origin): a kind a policy names. It holds the
    /// barrier until it has listed, as the sources given at the start do.
    pub fn follow(&mut self, s: Source) {
        self.follow.push(s);
    }

    /// The keys pushed to go now, in order (for tests of a reconciler's `on_event`).
    pub fn pushed(&self) -> &[K] {
        &self.now
    }

    /// Whether every key was asked for.
    pub fn wants_all(&self) -> bool {
        self.all
    }
}

impl<K> Extend<K> for Keys<K> {
    fn extend<I: IntoIterator<Item = K>>(&mut self, iter: I) {
        self.now.extend(iter)
    }
}

/// A controller that reconciles one key at a time (several keys at once, each on its own):
/// its state and logic.
#[async_trait::async_trait]
pub trait Reconciler: Send + Sync + 'static {
    type Key: Clone + Eq + Hash + Debug + Send + Sync + 'static;
    type Error: ReconcileError;

    /// Takes in a change from `source`: keeps what the controller keeps of it and pushes the
    /// keys it touches. Called between reconciles, never during one.
    fn on_event(&mut self, source: Origin, ev: Event, keys: &mut Keys<Self::Key>);

    /// Every key there is now: queued when the barrier first passes, at each resync, and
    /// when `on_event` asks for all.
    fn all_keys(&self) -> Vec<Self::Key> {
        Vec::new()
    }

    /// Time-driven work between reconciles, every [`Controller::every`] period once every
    /// source has listed.
    fn tick(&mut self, _keys: &mut Keys<Self::Key>) {}

    /// Brings what `key` names to what is wanted, from the newest state (caches and the
    /// store), never from the event that woke it.
    async fn reconcile(&self, key: &Self::Key) -> Result<Action, Self::Error>;

    /// What to do with `key` after its reconcile failed `failures` times in a row.
    fn error_policy(&self, _key: &Self::Key, _error: &Self::Error, _failures: u32) -> Retry {
        Retry::Backoff
    }
}

/// A controller whose reconciles share a round: every due key at once, over one pass of its
/// view, with the writes of the round run together (the propagation controllers: thousands
/// of bindings after a policy change are one round, not thousands). The same contract as
/// [`Reconciler`], with the round in place of the single key.
#[async_trait::async_trait]
pub trait Batch: Send + 'static {
    type Key: Clone + Eq + Hash + Debug + Send + Sync + 'static;
    type Error: ReconcileError;

    /// See [`Reconciler::on_event`].
    fn on_event(&mut self, source: Origin, ev: Event, keys: &mut Keys<Self::Key>);

    /// See [`Reconciler::all_keys`].
    fn all_keys(&self) -> Vec<Self::Key> {
        Vec::new()
    }

    /// See [`Reconciler::tick`].
    fn tick(&mut self, _keys: &mut Keys<Self::Key>) {}

    /// Reconciles `keys` together: what came of each.
    async fn reconcile_batch(
        &mut self,
        keys: Vec<Self::Key>,
    ) -> Vec<(Self::Key, Result<Action, Self::Error>)>;

    /// See [`Reconciler::error_policy`].
    fn error_policy(&self, _key: &Self::Key, _error: &Self::Error, _failures: u32) -> Retry {
        Retry::Backoff
    }

    /// How many due keys a round takes at most.
    fn batch_size(&self) -> usize {
        usize::MAX
    }

    /// Where `key` waits in the queue (see [`Rank`]): the default for all, a FIFO, unless
    /// the controller orders its work (the scheduler: priorities, namespaces in turn, and
    /// bindings that found no room behind fresh work).
    fn rank(&self, _key: &Self::Key) -> Rank {
        Rank::default()
    }

    /// The queue is empty after a round: work the rounds left running (writes in flight) may
    /// be finished here.
    async fn idle(&mut self) {}

    /// The controller stops (shutdown, or the store closed): what was decided is finished.
    async fn stop(&mut self) {}
}

/// A [`Reconciler`] run as rounds of up to `concurrency` reconciles at once.
#[derive(Debug)]
pub struct PerKey<R> {
    reconciler: R,
    concurrency: usize,
}

#[async_trait::async_trait]
impl<R: Reconciler> Batch for PerKey<R> {
    type Key = R::Key;
    type Error = R::Error;

    fn on_event(&mut self, source: Origin, ev: Event, keys: &mut Keys<R::Key>) {
        self.reconciler.on_event(source, ev, keys)
    }

    fn all_keys(&self) -> Vec<R::Key> {
        self.reconciler.all_keys()
    }

    fn tick(&mut self, keys: &mut Keys<R::Key>) {
        self.reconciler.tick(keys)
    }

    async fn reconcile_batch(
        &mut self,
        keys: Vec<R::Key>,
    ) -> Vec<(R::Key, Result<Action, R::Error>)> {
        let r = &self.reconciler;
        futures_util::stream::iter(keys)
            .map(|k| async move {
                let res = r.reconcile(&k).await;
                (k, res)
            })
            .buffer_unordered(self.concurrency)
            .collect()
            .await
    }

    fn error_policy(&self, key: &R::Key, error: &R::Error, failures: u32) -> Retry {
        self.reconciler.error_policy(key, error, failures)
    }

    /// A few rounds' worth: changes, and a shutdown, are taken in between (one key at a time
    /// for a controller that reconciles one at a time: a shutdown waits for one reconcile).
    fn batch_size(&self) -> usize {
        if self.concurrency > 1 {
            self.concurrency * 4
        } else {
            1
        }
    }
}

/// A source: a store prefix the controller follows.
#[derive(Debug)]
pub struct Source {
    origin: Origin,
    prefix: String,
    cache: Option<Arc<Cache>>,
    keep: Option<Keep>,
    barrier: bool,
}

impl Source {
    /// Follows everything under `prefix`; its changes come to `on_event` from `name`.
    pub fn new(name: &'static str, prefix: String) -> Self {
        Source {
            origin: Origin { name, slot: None },
            prefix,
            cache: None,
            keep: None,
            barrier: true,
        }
    }

    /// One of a family of sources (`name/slot`).
    pub fn slot(name: &'static str, slot: usize, prefix: String) -> Self {
        Source {
            origin: Origin {
                name,
                slot: Some(slot),
            },
            ..Source::new(name, prefix)
        }
    }

    /// Keeps `cache` in step before each change is handed on.
    pub fn cached(mut self, cache: Arc<Cache>) -> Self {
        self.cache = Some(cache);
        self
    }

    /// A listing parses only the objects `keep` accepts (see [`reflector::spawn_filtered`]).
    pub fn filtered(mut self, keep: Keep) -> Self {
        self.keep = Some(keep);
        self
    }

    /// Not waited for by the barrier: a source the controller copes without until it lists
    /// (its keys say so themselves), so that one slow or failing listing does not hold up
    /// everything else.
    pub fn outside_barrier(mut self) -> Self {
        self.barrier = false;
        self
    }
}

/// Runs a [`Reconciler`] or a [`Batch`]; see the module's documentation.
pub struct Controller<B: Batch> {
    name: &'static str,
    store: Arc<dyn Store>,
    logic: B,
    sources: Vec<Source>,
    settle: Duration,
    resync: Option<Duration>,
    every: Option<Duration>,
    backoff: (Duration, Duration),
    metrics: Handle,
    trigger: Option<tokio::sync::mpsc::UnboundedReceiver<B::Key>>,
    fresh_first: bool,
}

impl<B: Batch> Debug for Controller<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("name", &self.name)
            .field("sources", &self.sources)
            .finish_non_exhaustive()
    }
}

impl<R: Reconciler> Controller<PerKey<R>> {
    /// A controller named `name` (its logs and metrics label) over `store`.
    pub fn new(name: &'static str, store: Arc<dyn Store>, reconciler: R, metrics: Handle) -> Self {
        let logic = PerKey {
            reconciler,
            concurrency: 1,
        };
        Controller::batched(name, store, logic, metrics)
    }

    /// Up to `n` reconciles at once (of different keys).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.logic.concurrency = n.max(1);
        self
    }
}

impl<B: Batch> Controller<B> {
    /// A controller whose reconciles share rounds (see [`Batch`]).
    pub fn batched(name: &'static str, store: Arc<dyn Store>, logic: B, metrics: Handle) -> Self {
        Controller {
            name,
            store,
            logic,
            sources: Vec::new(),
            settle: Duration::ZERO,
            resync: None,
            every: None,
            backoff: (Duration::from_millis(100), Duration::from_secs(30)),
            metrics,
            trigger: None,
            fresh_first: false,
        }
    }

    /// Retries, timed keys and keys ranked behind go only when no fresh work waits (see
    /// [`WorkQueue::fresh_first`]); by default every few fresh keys a due one goes first.
    pub fn fresh_first(mut self) -> Self {
        self.fresh_first = true;
        self
    }

    /// Keys sent here are queued as a change's would be: a source that is not the store (a
    /// cache's notification, samples handed over in process).
    pub fn trigger(mut self, keys: tokio::sync::mpsc::UnboundedReceiver<B::Key>) -> Self {
        self.trigger = Some(keys);
        self
    }

    /// Follows a source.
    pub fn source(mut self, s: Source) -> Self {
        self.sources.push(s);
        self
    }

    /// Keys pushed by changes wait this long, so that a burst of changes makes one reconcile.
    pub fn settle(mut self, d: Duration) -> Self {
        self.settle = d;
        self
    }

    /// Every key is reconciled again this often (repairs what no change reports).
    pub fn resync(mut self, every: Duration) -> Self {
        self.resync = Some(every);
        self
    }

    /// The reconciler's `tick` runs this often, however busy the sources are (not before the
    /// barrier passes).
    pub fn every(mut self, period: Duration) -> Self {
        self.every = Some(period);
        self
    }

    /// Retries wait `base`, doubling per failure up to `max`.
    pub fn backoff(mut self, base: Duration, max: Duration) -> Self {
        self.backoff = (base, max);
        self
    }

    /// Runs until `shutdown`, or until the store closes.
    pub async fn run(self, shutdown: watch::Receiver<bool>) {
        let Controller {
            name,
            store,
            mut logic,
            sources,
            settle,
            resync,
            every,
            backoff,
            metrics,
            mut trigger,
            fresh_first,
        } = self;
        let (tx, inbox) = inbox::<Origin>();
        let (ended_tx, ended) = tokio::sync::mpsc::unbounded_channel();
        let mut l = Loop {
            name,
            store,
            tx,
            shutdown: shutdown.clone(),
            followed: HashSet::new(),
            ended_tx,
            ended,
            ended_count: 0,
            inbox,
            barrier: Barrier::new(),
            settle,
            synced: false,
            all: false,
            next_resync: resync.map(|d| Instant::now() + d),
            next_tick: every.map(|d| Instant::now() + d),
        };
        for s in sources {
            l.follow(s);
        }
        let mut queue = WorkQueue::new(backoff.0, backoff.1).with_jitter(0.2);
        if fresh_first {
            queue = queue.fresh_first();
        }
        let mut shutdown = shutdown;
        loop {
            if !l
                .wait(&mut logic, &mut queue, &mut trigger, &mut shutdown)
                .await
            {
                break;
            }
            l.take_in(&mut logic, &mut queue, &mut trigger);
            if !l.barrier.is_synced() {
                continue;
            }
            let now = Instant::now();
            l.timed(&mut logic, &mut queue, every, resync, &metrics, now);
            if *shutdown.borrow() {
                queue.shut_down();
                break;
            }
            let keys = queue.pop_batch(now, logic.batch_size());
            if keys.is_empty() {
                continue;
            }
            metrics.depth.set((queue.len() + keys.len()) as i64);
            if !round(name, &mut logic, &mut queue, &metrics, keys).await {
                break;
            }
        }
        logic.stop().await;
    }
}

/// Reconciles `keys` and files what came of each: forgotten, due again later, or backed off
/// as the error policy says; `false` when the store closed (the controller ends).
async fn round<B: Batch>(
    name: &'static str,
    logic: &mut B,
    queue: &mut WorkQueue<B::Key>,
    metrics: &Handle,
    keys: Vec<B::Key>,
) -> bool {
    let started = Instant::now();
    let results = logic.reconcile_batch(keys).await;
    let mut failed = 0;
    let now = Instant::now();
    for (k, res) in results {
        match res {
            Ok(Action::Done) => queue.forget(&k),
            Ok(Action::After(d)) => {
                queue.forget(&k);
                queue.done(&k);
                queue.after(k, now + d);
                continue;
            }
            Err(e) if e.is_closed() => return false,
            Err(e) => {
                failed += 1;
                let failures = queue.failures(&k) + 1;
                // Quiet at first: most failures are conflicts another round settles.
                if failures >= 5 {
                    tracing::warn!(controller = name, key = ?k, failures, error = %e, "reconcile keeps failing; retrying");
                } else {
                    tracing::debug!(controller = name, key = ?k, error = %e, "reconcile failed; retrying");
                }
                match logic.error_policy(&k, &e, failures) {
                    Retry::Backoff => queue.retry(k.clone(), now),
                    Retry::After(d) => queue.retry_at(k.clone(), now + d),
                    Retry::Wait => queue.forget(&k),
                }
            }
        }
        queue.done(&k);
    }
    metrics.round(started, failed, queue.len());
    if queue.is_empty() {
        logic.idle().await;
    }
    true
}

/// The most changes taken in between two rounds.
const DRAIN: usize = 10_000;

/// The next key a trigger sends; never, without one. `None` once its senders are gone.
async fn next_key<K>(t: &mut Option<tokio::sync::mpsc::UnboundedReceiver<K>>) -> Option<K> {
    match t {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// The parts of the loop that take changes in and follow sources.
struct Loop {
    name: &'static str,
    store: Arc<dyn Store>,
    /// Kept for sources followed later (so the inbox never ends on its own: the controller
    /// ends at shutdown, or when a reconcile finds the store closed).
    tx: InboxSender<Origin>,
    shutdown: watch::Receiver<bool>,
    followed: HashSet<Origin>,
    /// A message each time a source's reflector ends (the store closed, or shutdown).
    ended_tx: tokio::sync::mpsc::UnboundedSender<()>,
    ended: tokio::sync::mpsc::UnboundedReceiver<()>,
    ended_count: usize,
    inbox: Inbox<Origin>,
    barrier: Barrier,
    settle: Duration,
    synced: bool,
    /// Every key is to be queued at the next turn.
    all: bool,
    next_resync: Option<Instant>,
    next_tick: Option<Instant>,
}

impl Loop {
    /// Waits until there is something to do, taking in the change or trigger that ends the
    /// wait: at once while the barrier has passed and keys wait (or a controller without
    /// sources starts); else a change, a trigger, a key coming due, the resync, the tick.
    /// `false` when the controller ends: shutdown, or every source ended (the store closed).
    async fn wait<B: Batch>(
        &mut self,
        logic: &mut B,
        queue: &mut WorkQueue<B::Key>,
        trigger: &mut Option<tokio::sync::mpsc::UnboundedReceiver<B::Key>>,
        shutdown: &mut watch::Receiver<bool>,
    ) -> bool {
        let now = Instant::now();
        // A source followed later holds the barrier again: nothing is done until it lists.
        let acting = self.synced && self.barrier.is_synced();
        // A controller with nothing to wait for (no sources yet to list) starts at once.
        let starting = !self.synced && self.barrier.is_synced();
        if starting || (acting && !queue.is_empty()) {
            return true;
        }
        let due = [queue.next_due(), self.next_resync, self.next_tick]
            .into_iter()
            .flatten()
            .filter(|_| acting)
            .min();
        let wait = due.map_or(Duration::from_secs(3600), |t| {
            t.saturating_duration_since(now)
        });
        tokio::select! {
            ev = self.inbox.recv() => match ev {
                Some(ev) => self.take(logic, queue, ev),
                None => return false,
            },
            k = next_key(trigger) => match k {
                Some(k) => {
                    let mut keys = Keys::default();
                    keys.push(k);
                    self.queue_keys(logic, queue, keys);
                }
                None => *trigger = None,
            },
            _ = self.ended.recv() => {
                // Every source ended without a shutdown: the store closed.
                self.ended_count += 1;
                if self.ended_count >= self.followed.len() && !*shutdown.borrow() {
                    tracing::debug!(controller = self.name, "the store closed; stopping");
                    return false;
                }
            }
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.changed() => {
                queue.shut_down();
                return false;
            }
        }
        true
    }

    /// Takes in what else has arrived before acting (a bounded share: changes coming faster
    /// than they are taken in must not keep the rounds from running), and the triggers' keys.
    fn take_in<B: Batch>(
        &mut self,
        logic: &mut B,
        queue: &mut WorkQueue<B::Key>,
        trigger: &mut Option<tokio::sync::mpsc::UnboundedReceiver<B::Key>>,
    ) {
        for _ in 0..DRAIN {
            match self.inbox.try_recv() {
                Ok(ev) => self.take(logic, queue, ev),
                Err(_) => break,
            }
        }
        if let Some(t) = trigger {
            let mut keys = Keys::default();
            while let Ok(k) = t.try_recv() {
                keys.push(k);
            }
            self.queue_keys(logic, queue, keys);
        }
    }

    /// Time-driven work, once the barrier has passed: the tick, and every key at the first
    /// sync, at each resync and when `on_event` asked for all.
    fn timed<B: Batch>(
        &mut self,
        logic: &mut B,
        queue: &mut WorkQueue<B::Key>,
        every: Option<Duration>,
        resync: Option<Duration>,
        metrics: &Handle,
        now: Instant,
    ) {
        if let (Some(at), Some(period)) = (self.next_tick, every)
            && at <= now
        {
            self.next_tick = Some(now + period);
            let mut keys = Keys::default();
            logic.tick(&mut keys);
            self.queue_keys(logic, queue, keys);
        }
        if !self.synced {
            self.synced = true;
            self.all = true;
        }
        if let (Some(at), Some(period)) = (self.next_resync, resync)
            && at <= now
        {
            self.all = true;
            self.next_resync = Some(now + period);
        }
        if std::mem::take(&mut self.all) {
            for k in logic.all_keys() {
                let rank = logic.rank(&k);
                queue.add_ranked(k, rank);
            }
            metrics.synced(queue.len());
        }
    }

    fn follow(&mut self, s: Source) {
        if !self.followed.insert(s.origin) {
            return;
        }
        if s.barrier {
            self.barrier.expect(s.origin.barrier_key());
        }
        let reflector = reflector::spawn_into(
            self.store.clone(),
            s.prefix,
            s.cache,
            s.keep,
            self.tx.clone(),
            s.origin,
            Health::default(),
            self.shutdown.clone(),
        );
        let ended = self.ended_tx.clone();
        tokio::spawn(async move {
            let _ = reflector.await;
            let _ = ended.send(());
        });
    }

    fn take<B: Batch>(
        &mut self,
        b: &mut B,
        queue: &mut WorkQueue<B::Key>,
        (source, ev): (Origin, Event),
    ) {
        if matches!(ev, Event::Listed(_)) {
            let key = source.barrier_key();
            if self.barrier.has_listed(&key) {
                tracing::debug!(controller = self.name, source = %key, "a source listed again");
            }
            self.barrier.listed(key);
        }
        let mut keys = Keys::default();
        b.on_event(source, ev, &mut keys);
        self.queue_keys(b, queue, keys);
    }

    fn queue_keys<B: Batch>(&mut self, b: &B, queue: &mut WorkQueue<B::Key>, keys: Keys<B::Key>) {
        let now = Instant::now();
        let mut seen = HashSet::new();
        for k in keys.now {
            if !seen.insert(k.clone()) {
                continue;
            }
            let rank = b.rank(&k);
            if self.settle.is_zero() {
                queue.add_ranked(k, rank);
            } else {
                queue.after_ranked(k, now + self.settle, rank);
            }
        }
        for (k, d) in keys.later {
            let rank = b.rank(&k);
            queue.after_ranked(k, now + d, rank);
        }
        for s in keys.follow {
            self.follow(s);
        }
        self.all |= keys.all && self.synced;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use orrery_api::keys;
    use orrery_store::stamp::new_object;
    use parking_lot::Mutex;
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn prefix(plural: &str) -> String {
        keys::prefix("test.orrery.io", plural, None)
    }

    fn key(plural: &str, name: &str) -> String {
        keys::object("test.orrery.io", plural, None, name)
    }

    async fn put(store: &dyn Store, plural: &str, name: &str) {
        let o = new_object("test.orrery.io/v1", "Thing", None, name);
        store.create(&key(plural, name), o).await.unwrap();
    }

    /// Keys are the names of `things`; a `gate` source must list too. Reconciles are recorded;
    /// a name starting with `fail` fails until `heal`; `tick` asks to be looked at again.
    #[derive(Default)]
    struct Recorder {
        seen: BTreeMap<String, ()>,
        calls: Arc<Mutex<Vec<String>>>,
        failing: Arc<Mutex<u32>>,
        in_flight: Arc<AtomicUsize>,
        most_in_flight: Arc<AtomicUsize>,
        slow: bool,
    }

    #[async_trait::async_trait]
    impl Reconciler for Recorder {
        type Key = String;
        type Error = String;

        fn on_event(&mut self, source: Origin, ev: Event, keys: &mut Keys<String>) {
            if source == "extra" {
                assert_eq!(source.slot, Some(7));
                if let Event::Upsert(o) = ev {
                    keys.push(format!("extra:{}", o.name()));
                }
                return;
            }
            if source != "things" {
                return;
            }
            // Listed or changed: the controller may have started after it was made.
            let asks = match &ev {
                Event::Listed(items) => items.iter().any(|o| o.name() == "follow"),
                Event::Upsert(o) => o.name() == "follow",
                Event::Delete(_) => false,
            };
            if asks {
                keys.follow(Source::slot("extra", 7, prefix("extras")));
            }
            match ev {
                Event::Listed(items) => {
                    self.seen = items.iter().map(|o| (o.name().to_string(), ())).collect();
                    keys.all();
                }
                Event::Upsert(o) => {
                    self.seen.insert(o.name().to_string(), ());
                    keys.push(o.name().to_string());
                }
                Event::Delete(o) => {
                    self.seen.remove(o.name());
                    keys.push(o.name().to_string());
                }
            }
        }

        fn all_keys(&self) -> Vec<String> {
            self.seen.keys().cloned().collect()
        }

        async fn reconcile(&self, key: &String) -> Result<Action, String> {
            let n = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.most_in_flight.fetch_max(n, Ordering::SeqCst);
            if self.slow {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            self.calls.lock().push(key.clone());
            if key.starts_with("fail") {
                let mut left = self.failing.lock();
                if *left > 0 {
                    *left -= 1;
                    return Err(format!("{key} failed"));
                }
            }
            if key.starts_with("tick") {
                return Ok(Action::After(Duration::from_millis(100)));
            }
            Ok(Action::Done)
        }

        fn error_policy(&self, key: &String, _: &String, _: u32) -> Retry {
            if key.starts_with("failwait") {
                Retry::Wait
            } else {
                Retry::Backoff
            }
        }
    }

    async fn store() -> (tempfile::TempDir, Arc<dyn Store>) {
        let dir = tempfile::tempdir().unwrap();
        let s = orrery_store_sqlite::SqliteStore::open(orrery_store_sqlite::SqliteConfig::new(
            dir.path().join("db"),
        ))
        .unwrap();
        (dir, Arc::new(s))
    }

    fn controller(store: &Arc<dyn Store>, r: Recorder) -> Controller<PerKey<Recorder>> {
        let metrics = crate::metrics::ControllerMetrics::default().of("test");
        Controller::new("test", store.clone(), r, metrics)
            .source(Source::new("things", prefix("things")))
            .source(Source::new("gate", prefix("gates")))
            .backoff(Duration::from_millis(50), Duration::from_millis(200))
    }

    async fn until(what: &str, mut f: impl FnMut() -> bool) {
        for _ in 0..400 {
            if f() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("timed out waiting for {what}");
    }

    #[tokio::test]
    async fn keys_wait_for_every_source_then_each_is_reconciled_once_per_change() {
        let (_d, store) = store().await;
        for n in ["a", "b"] {
            put(store.as_ref(), "things", n).await;
        }
        let r = Recorder::default();
        let calls = r.calls.clone();
        let (tx, rx) = watch::channel(false);
        let task = tokio::spawn(controller(&store, r).run(rx));
        tokio::time::sleep(Duration::from_millis(300)).await;
        // "gates" is an empty prefix, but it lists: the barrier passes once it has.
        until("the first round", || calls.lock().len() == 2).await;
        assert_eq!(
            *calls.lock(),
            ["a", "b"],
            "every key once when the barrier passes"
        );
        put(store.as_ref(), "things", "c").await;
        until("the change", || calls.lock().len() == 3).await;
        assert_eq!(calls.lock()[2], "c");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(calls.lock().len(), 3, "nothing without a change");
        tx.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn failures_back_off_then_succeed_and_timed_keys_come_back() {
        let (_d, store) = store().await;
        for n in ["fail-1", "failwait-1", "tick-1"] {
            put(store.as_ref(), "things", n).await;
        }
        let r = Recorder::default();
        *r.failing.lock() = 3;
        let calls = r.calls.clone();
        let (tx, rx) = watch::channel(false);
        let task = tokio::spawn(controller(&store, r).run(rx));
        let count = |k: &str| calls.lock().iter().filter(|c| *c == k).count();
        // failwait fails once and waits; fail fails twice more with backoff, then succeeds.
        until("fail-1 to succeed", || count("fail-1") == 3).await;
        until("ticks", || count("tick-1") >= 4).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(count("fail-1"), 3, "not again once it succeeded");
        assert_eq!(count("failwait-1"), 1, "Wait: not again without a change");
        let o = store.get(&key("things", "failwait-1")).await.unwrap();
        let mut o = o;
        o.metadata.labels.insert("x".into(), "y".into());
        store
            .update(&key("things", "failwait-1"), o, None)
            .await
            .unwrap();
        until("the change to the waiting key", || count("failwait-1") == 2).await;
        tx.send(true).unwrap();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn a_source_followed_later_delivers_its_changes() {
        let (_d, store) = store().await;
        put(store.as_ref(), "extras", "e1").await;
        let r = Recorder::default();
        let calls = r.calls.clone();
        let (tx, rx) = watch::channel(false);
        let task = tokio::spawn(controller(&store, r).run(rx));
        put(store.as_ref(), "things", "follow").await;
        until("the key that asks to follow", || {
            calls.lock().iter().any(|c| c == "follow")
        })
        .await;
        put(store.as_ref(), "extras", "e2").await;
        until("a change of the source followed", || {
            calls.lock().iter().any(|c| c == "extra:e2")
        })
        .await;
        tx.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn a_controller_without_sources_starts_at_once_and_one_whose_store_closed_ends() {
        let (_d, store) = store().await;
        let mut r = Recorder::default();
        r.seen.insert("only".into(), ());
        let calls = r.calls.clone();
        let metrics = crate::metrics::ControllerMetrics::default().of("test");
        let (_tx, rx) = watch::channel(false);
        let task = tokio::spawn(Controller::new("test", store.clone(), r, metrics).run(rx));
        until("the first round", || calls.lock().len() == 1).await;

        let (tx, rx) = watch::channel(false);
        let other = tokio::spawn(controller(&store, Recorder::default()).run(rx));
        tokio::time::sleep(Duration::from_millis(200)).await;
        store.close().await;
        tokio::time::timeout(Duration::from_secs(10), other)
            .await
            .expect("a controller whose store closed ends without a shutdown")
            .unwrap();
        drop(tx);
        task.abort();
    }

    #[tokio::test]
    async fn reconciles_run_concurrently_up_to_the_limit() {
        let (_d, store) = store().await;
        for i in 0..20 {
            put(store.as_ref(), "things", &format!("k{i:02}")).await;
        }
        let r = Recorder {
            slow: true,
            ..Default::default()
        };
        let (calls, most) = (r.calls.clone(), r.most_in_flight.clone());
        let (tx, rx) = watch::channel(false);
        let task = tokio::spawn(controller(&store, r).concurrency(4).run(rx));
        until("every key", || calls.lock().len() == 20).await;
        assert_eq!(most.load(Ordering::SeqCst), 4);
        tx.send(true).unwrap();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn a_settling_time_makes_one_reconcile_of_a_burst() {
        let (_d, store) = store().await;
        put(store.as_ref(), "things", "x").await;
        let r = Recorder::default();
        let calls = r.calls.clone();
        let (tx, rx) = watch::channel(false);
        let task = tokio::spawn(
            controller(&store, r)
                .settle(Duration::from_millis(300))
                .run(rx),
        );
        until("the first round", || calls.lock().len() == 1).await;
        for i in 0..5 {
            let mut o = store.get(&key("things", "x")).await.unwrap();
            o.metadata.labels.insert("i".into(), i.to_string());
            store.update(&key("things", "x"), o, None).await.unwrap();
        }
        until("the burst's round", || calls.lock().len() == 2).await;
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(calls.lock().len(), 2, "five changes, one reconcile");
        tx.send(true).unwrap();
        task.await.unwrap();
    }

    /// A batch whose keys rank by the number in their name; it records its rounds, when the
    /// queue went idle, and that it was stopped.
    #[derive(Default)]
    struct Ranked {
        rounds: Arc<Mutex<Vec<Vec<String>>>>,
        idle: Arc<AtomicUsize>,
        stopped: Arc<AtomicUsize>,
    }

    #[async_trait::async_trait]
    impl Batch for Ranked {
        type Key = String;
        type Error = String;

        fn on_event(&mut self, _: Origin, ev: Event, keys: &mut Keys<String>) {
            match ev {
                Event::Listed(objs) => keys.extend(objs.iter().map(|o| o.metadata.name.clone())),
                Event::Upsert(o) => keys.push(o.metadata.name.clone()),
                Event::Delete(_) => {}
            }
        }

        async fn reconcile_batch(
            &mut self,
            keys: Vec<String>,
        ) -> Vec<(String, Result<Action, String>)> {
            self.rounds.lock().push(keys.clone());
            keys.into_iter().map(|k| (k, Ok(Action::Done))).collect()
        }

        fn rank(&self, key: &String) -> Rank {
            let (group, n) = key.split_once('-').unwrap();
            Rank {
                priority: n.parse().unwrap(),
                group: group.into(),
                behind: group == "late",
            }
        }

        async fn idle(&mut self) {
            self.idle.fetch_add(1, Ordering::SeqCst);
        }

        async fn stop(&mut self) {
            self.stopped.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn keys_go_in_the_order_their_rank_says_and_a_batch_hears_of_idle_and_stop() {
        let (_d, store) = store().await;
        for n in ["late-9", "a-1", "a-5", "b-1", "a-01"] {
            put(store.as_ref(), "things", n).await;
        }
        let r = Ranked::default();
        let (rounds, idle, stopped) = (r.rounds.clone(), r.idle.clone(), r.stopped.clone());
        let metrics = crate::metrics::ControllerMetrics::default().of("test");
        let (tx, rx) = watch::channel(false);
        let c = Controller::batched("test", store.clone(), r, metrics)
            .source(Source::new("things", prefix("things")))
            .fresh_first();
        let task = tokio::spawn(c.run(rx));
        until("the first round", || !rounds.lock().is_empty()).await;
        // Priority 5 first; at priority 1 groups a and b take turns; the key ranked behind
        // (though its priority is the highest) after all fresh work.
        let first = rounds.lock()[0].clone();
        assert_eq!(first[0], "a-5");
        assert_eq!(
            first[1..3].iter().filter(|k| k.starts_with("b")).count(),
            1,
            "{first:?}"
        );
        assert_eq!(first.last().unwrap(), "late-9");
        until("idle", || idle.load(Ordering::SeqCst) == 1).await;
        assert_eq!(stopped.load(Ordering::SeqCst), 0);
        tx.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(stopped.load(Ordering::SeqCst), 1, "told it stops");
    }
}
