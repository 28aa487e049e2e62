//! The work queue of a controller: keys to reconcile (client-go's rate-limited work queue).
//!
//! - A key waits at most once, however often it is added.
//! - A key handed out is not handed out again until [`WorkQueue::done`]; added meanwhile, it
//!   comes back after (one reconcile of a key at a time, and none lost).
//! - A failed key is retried after a per-key exponential backoff, in a lane behind fresh work,
//!   so retries never hold up new keys (yet every few fresh keys a due one goes first, so a
//!   steady stream of fresh work starves neither retries nor keys due at a time); success
//!   resets its backoff.
//!   A key added again while it waits in that lane is fresh work: it moves up.
//! - Where a key waits is its [`Rank`]: a priority (higher first), a group (groups take turns
//!   within a priority), and whether it waits behind fresh work; the default rank for all is
//!   a FIFO. [`WorkQueue::fresh_first`] lets keys behind go only when no fresh work waits.
//! - After [`WorkQueue::shut_down`] no key is handed out; what was taken can still finish.
//! - Backoffs may be spread by a jitter ([`WorkQueue::with_jitter`]): keys that failed
//!   together (a store that was away) do not all come back in the same instant.
//!
//! Time is passed in, so the queue is plain data and tested without a clock.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::Hash;
use std::time::{Duration, Instant};

/// Where a key waits: the queue's policy, chosen per key by the controller (the scheduler's
/// priorities and namespaces; every other controller leaves the default, a plain FIFO).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rank {
    /// Higher first.
    pub priority: i32,
    /// Within a priority, groups take turns (one namespace's burst does not starve another's).
    pub group: String,
    /// Waits behind fresh work, with the retries (a binding that found no room, tried again).
    pub behind: bool,
}

/// Keys by priority, groups taking turns within one (a FIFO when every key has the default).
#[derive(Debug)]
struct Fair<K> {
    levels: BTreeMap<Reverse<i32>, Level<K>>,
}

#[derive(Debug)]
struct Level<K> {
    turn: VecDeque<String>,
    groups: HashMap<String, VecDeque<K>>,
}

impl<K> Fair<K> {
    fn new() -> Self {
        Fair {
            levels: BTreeMap::new(),
        }
    }

    fn push(&mut self, rank: &Rank, k: K) {
        let level = self
            .levels
            .entry(Reverse(rank.priority))
            .or_insert_with(|| Level {
                turn: VecDeque::new(),
                groups: HashMap::new(),
            });
        let q = level.groups.entry(rank.group.clone()).or_default();
        if q.is_empty() {
            level.turn.push_back(rank.group.clone());
        }
        q.push_back(k);
    }

    /// The highest priority's next key, from the group whose turn it is.
    fn pop(&mut self) -> Option<K> {
        let mut entry = self.levels.first_entry()?;
        let level = entry.get_mut();
        let group = level.turn.pop_front()?;
        let q = level.groups.get_mut(&group)?;
        let k = q.pop_front();
        if q.is_empty() {
            level.groups.remove(&group);
        } else {
            level.turn.push_back(group);
        }
        if level.turn.is_empty() {
            entry.remove();
        }
        k
    }
}

/// Which lane a queued key waits in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    Fresh,
    Retry,
}

#[derive(Debug)]
pub struct WorkQueue<K> {
    fresh: Fair<K>,
    /// May hold keys moved to the fresh lane since (skipped when they come up).
    retry: Fair<K>,
    /// Keys waiting in a lane: which, and their rank.
    queued: HashMap<K, (Lane, Rank)>,
    /// Keys handed out and not yet done, with their rank; `true` when added again meanwhile.
    processing: HashMap<K, (bool, Rank)>,
    /// Failed keys waiting for their backoff to pass, by when they are due.
    waiting: BTreeMap<(Instant, u64), (K, Rank)>,
    waiting_keys: HashMap<K, (Instant, u64)>,
    failures: HashMap<K, u32>,
    seq: u64,
    base: Duration,
    max: Duration,
    /// The share of a backoff taken off at random (0 to 1).
    jitter: f64,
    /// Fresh keys handed out in a row (every few, a due retry or timed key goes first, so a
    /// steady stream of fresh work does not starve them).
    fresh_streak: u32,
    /// Retries only when no fresh work waits ([`WorkQueue::fresh_first`]).
    fresh_first: bool,
    shut: bool,
}

impl<K: Clone + Eq + Hash> WorkQueue<K> {
    /// Retries wait `base`, doubling per failure up to `max`.
    pub fn new(base: Duration, max: Duration) -> Self {
        WorkQueue {
            fresh: Fair::new(),
            retry: Fair::new(),
            queued: HashMap::new(),
            processing: HashMap::new(),
            waiting: BTreeMap::new(),
            waiting_keys: HashMap::new(),
            failures: HashMap::new(),
            seq: 0,
            base,
            max,
            jitter: 0.0,
            fresh_streak: 0,
            fresh_first: false,
            shut: false,
        }
    }

    /// Takes up to `share` (0 to 1) of each backoff off at random.
    pub fn with_jitter(mut self, share: f64) -> Self {
        self.jitter = share.clamp(0.0, 1.0);
        self
    }

    /// Retries and timed keys go only when no fresh work waits (kube-scheduler's active and
    /// backoff queues: a storm of retries never holds back new arrivals).
    pub fn fresh_first(mut self) -> Self {
        self.fresh_first = true;
        self
    }

    /// Queues `k` for a reconcile (a key waiting for a retry goes now).
    pub fn add(&mut self, k: K) {
        self.add_ranked(k, Rank::default());
    }

    /// Queues `k` where `rank` says: fresh (taking it out of the retry lane), or behind fresh
    /// work unless it waits there already.
    pub fn add_ranked(&mut self, k: K, rank: Rank) {
        if self.shut {
            return;
        }
        if let Some((again, r)) = self.processing.get_mut(&k) {
            *again = true;
            *r = rank;
            return;
        }
        if let Some(at) = self.waiting_keys.remove(&k) {
            self.waiting.remove(&at);
        }
        self.enqueue(k, rank);
    }

    fn enqueue(&mut self, k: K, rank: Rank) {
        let lane = if rank.behind {
            Lane::Retry
        } else {
            Lane::Fresh
        };
        match self.queued.get(&k) {
            Some((Lane::Fresh, _)) => return,
            Some((Lane::Retry, _)) if lane == Lane::Retry => return,
            _ => {}
        }
        self.queued.insert(k.clone(), (lane, rank.clone()));
        match lane {
            Lane::Fresh => self.fresh.push(&rank, k),
            Lane::Retry => self.retry.push(&rank, k),
        }
    }

    /// A reconcile of `k` failed: it comes back after its backoff.
    pub fn retry(&mut self, k: K, now: Instant) {
        let n = self.failures.entry(k.clone()).or_insert(0);
        let mut wait = self.base.saturating_mul(1u32 << (*n).min(20)).min(self.max);
        *n += 1;
        if self.jitter > 0.0 {
            wait = wait.mul_f64(1.0 - self.jitter * random_unit());
        }
        self.after(k, now + wait);
    }

    /// A reconcile of `k` failed and is to be tried again at `when` (counted as a failure).
    pub fn retry_at(&mut self, k: K, when: Instant) {
        *self.failures.entry(k.clone()).or_insert(0) += 1;
        self.after(k, when);
    }

    /// Queues `k` at `when` (time-driven work: a grace period ending).
    pub fn after(&mut self, k: K, when: Instant) {
        let rank = self
            .processing
            .get(&k)
            .map(|(_, r)| r.clone())
            .unwrap_or_default();
        self.after_ranked(k, when, rank);
    }

    /// [`WorkQueue::after`], waiting where `rank` says once due.
    pub fn after_ranked(&mut self, k: K, when: Instant, rank: Rank) {
        if self.shut || self.queued.contains_key(&k) {
            return;
        }
        if let Some(at) = self.waiting_keys.get(&k)
            && at.0 <= when
        {
            return;
        }
        if let Some(at) = self.waiting_keys.remove(&k) {
            self.waiting.remove(&at);
        }
        self.seq += 1;
        self.waiting.insert((when, self.seq), (k.clone(), rank));
        self.waiting_keys.insert(k, (when, self.seq));
    }

    /// A reconcile of `k` succeeded: its backoff starts afresh.
    pub fn forget(&mut self, k: &K) {
        self.failures.remove(k);
    }

    /// How often `k` has failed in a row.
    pub fn failures(&self, k: &K) -> u32 {
        self.failures.get(k).copied().unwrap_or(0)
    }

    /// Moves retries that are due into their lane.
    fn promote(&mut self, now: Instant) {
        while let Some((&(at, seq), _)) = self.waiting.first_key_value() {
            if at > now {
                break;
            }
            let Some((k, rank)) = self.waiting.remove(&(at, seq)) else {
                break;
            };
            self.waiting_keys.remove(&k);
            if let Some((again, _)) = self.processing.get_mut(&k) {
                // Still being reconciled: it comes back when that is done.
                *again = true;
            } else {
                self.enqueue(
                    k,
                    Rank {
                        behind: true,
                        ..rank
                    },
                );
            }
        }
    }

    /// The next key of the retry lane still waiting there.
    fn pop_retry(&mut self) -> Option<K> {
        while let Some(k) = self.retry.pop() {
            if self.queued.get(&k).is_some_and(|(l, _)| *l == Lane::Retry) {
                return Some(k);
            }
        }
        None
    }

    /// The next key to reconcile, fresh work first; `None` when nothing is due (or after
    /// shutdown). The key counts as being processed until [`WorkQueue::done`].
    pub fn pop(&mut self, now: Instant) -> Option<K> {
        if self.shut {
            return None;
        }
        self.promote(now);
        let retry_turn = !self.fresh_first && self.fresh_streak >= FRESH_BEFORE_RETRY;
        let (k, fresh) = match retry_turn.then(|| self.pop_retry()).flatten() {
            Some(k) => (k, false),
            None => match self.fresh.pop() {
                Some(k) => (k, true),
                None => (self.pop_retry()?, false),
            },
        };
        self.fresh_streak = if fresh { self.fresh_streak + 1 } else { 0 };
        let rank = self.queued.remove(&k).map(|(_, r)| r).unwrap_or_default();
        self.processing.insert(k.clone(), (false, rank));
        Some(k)
    }

    /// Up to `n` keys (see [`WorkQueue::pop`]).
    pub fn pop_batch(&mut self, now: Instant, n: usize) -> Vec<K> {
        let mut out = Vec::new();
        while out.len() < n {
            match self.pop(now) {
                Some(k) => out.push(k),
                None => break,
            }
        }
        out
    }

    /// The reconcile of `k` is over; added meanwhile, it is queued again (where it was last
    /// added to go).
    pub fn done(&mut self, k: &K) {
        if let Some((true, rank)) = self.processing.remove(k) {
            self.add_ranked(k.clone(), rank);
        }
    }

    /// Keys waiting in a lane (not those waiting for their backoff).
    pub fn len(&self) -> usize {
        self.queued.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// When the next retry is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.waiting.first_key_value().map(|(k, _)| k.0)
    }

    /// Stops handing out keys; keys being processed may still be marked done.
    pub fn shut_down(&mut self) {
        self.shut = true;
    }

    pub fn is_shut_down(&self) -> bool {
        self.shut
    }
}

/// Fresh keys handed out before a waiting retry (or timed key) gets its turn.
const FRESH_BEFORE_RETRY: u32 = 4;

/// A number in [0, 1): std's per-process random hash keys, which is enough to spread retries.
fn random_unit() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0);
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q() -> WorkQueue<&'static str> {
        WorkQueue::new(Duration::from_millis(10), Duration::from_secs(1))
    }

    #[test]
    fn keys_wait_once_and_in_order() {
        let now = Instant::now();
        let mut q = q();
        q.add("a");
        q.add("b");
        q.add("a");
        assert_eq!(q.len(), 2);
        assert_eq!(q.pop_batch(now, 10), ["a", "b"]);
        assert!(q.pop(now).is_none());
    }

    #[test]
    fn a_key_is_never_reconciled_twice_at_once_and_never_lost() {
        let now = Instant::now();
        let mut q = q();
        q.add("a");
        assert_eq!(q.pop(now), Some("a"));
        q.add("a");
        assert!(
            q.pop(now).is_none(),
            "not again while it is being reconciled"
        );
        q.done(&"a");
        assert_eq!(q.pop(now), Some("a"), "added meanwhile: it comes back");
        q.done(&"a");
        assert!(q.pop(now).is_none());
    }

    #[test]
    fn failures_back_off_exponentially_behind_fresh_work_and_success_resets() {
        let t0 = Instant::now();
        let mut q = q();
        q.add("bad");
        assert_eq!(q.pop(t0), Some("bad"));
        q.retry("bad", t0);
        q.done(&"bad");
        assert!(q.pop(t0).is_none(), "not before its backoff");
        assert_eq!(q.next_due(), Some(t0 + Duration::from_millis(10)));
        let t1 = t0 + Duration::from_millis(10);
        q.add("new");
        assert_eq!(q.pop_batch(t1, 10), ["new", "bad"], "fresh work first");
        q.retry("bad", t1);
        q.done(&"bad");
        q.done(&"new");
        assert_eq!(
            q.next_due(),
            Some(t1 + Duration::from_millis(20)),
            "doubled"
        );
        for _ in 0..20 {
            q.retry("bad", t1);
        }
        assert_eq!(q.failures(&"bad"), 22);
        assert!(
            q.next_due().unwrap() <= t1 + Duration::from_secs(1),
            "capped"
        );
        q.forget(&"bad");
        assert_eq!(q.failures(&"bad"), 0);
        // Added again, a waiting key goes at once.
        q.add("bad");
        assert_eq!(q.pop(t1), Some("bad"));
    }

    #[test]
    fn timed_keys_come_when_due_and_the_earliest_time_wins() {
        let t0 = Instant::now();
        let mut q = q();
        q.after("grace", t0 + Duration::from_secs(5));
        q.after("grace", t0 + Duration::from_secs(2));
        q.after("grace", t0 + Duration::from_secs(9));
        assert!(q.pop(t0 + Duration::from_secs(1)).is_none());
        assert_eq!(q.pop(t0 + Duration::from_secs(2)), Some("grace"));
        q.done(&"grace");
        assert!(q.pop(t0 + Duration::from_secs(10)).is_none(), "once");
    }

    #[test]
    fn a_stream_of_fresh_work_does_not_starve_retries() {
        let t0 = Instant::now();
        let mut q = q();
        q.after("timed", t0);
        for i in 0..10 {
            q.add(if i % 2 == 0 { "x" } else { "y" });
            q.add(["a", "b", "c", "d", "e", "f"][i % 6]);
        }
        let got = q.pop_batch(t0, 6);
        assert!(got.contains(&"timed"), "{got:?}");
    }

    #[test]
    fn jitter_spreads_backoffs_below_their_exponential_bound() {
        let t0 = Instant::now();
        let mut waits = std::collections::BTreeSet::new();
        for i in 0..50 {
            let mut q = WorkQueue::new(Duration::from_millis(100), Duration::from_secs(10))
                .with_jitter(0.5);
            q.retry(i, t0);
            let wait = q.next_due().unwrap() - t0;
            assert!(
                wait > Duration::from_millis(50) && wait <= Duration::from_millis(100),
                "{wait:?}"
            );
            waits.insert(wait);
        }
        assert!(waits.len() > 10, "spread: {waits:?}");
    }

    fn rank(priority: i32, group: &str, behind: bool) -> Rank {
        Rank {
            priority,
            group: group.into(),
            behind,
        }
    }

    #[test]
    fn higher_priority_first_and_groups_take_turns() {
        let now = Instant::now();
        let mut q = q();
        for k in ["a1", "a2", "a3"] {
            q.add_ranked(k, rank(0, "a", false));
        }
        q.add_ranked("b1", rank(0, "b", false));
        q.add_ranked("b2", rank(0, "b", false));
        q.add_ranked("urgent", rank(10, "c", false));
        q.add_ranked("low", rank(-1, "a", false));
        assert_eq!(
            q.pop_batch(now, 10),
            ["urgent", "a1", "b1", "a2", "b2", "a3", "low"]
        );
    }

    #[test]
    fn keys_behind_wait_for_fresh_work_and_a_fresh_add_moves_them_up() {
        let now = Instant::now();
        let mut q = q().fresh_first();
        q.add_ranked("r1", rank(0, "", true));
        q.add_ranked("r2", rank(5, "", true));
        for i in 0..8 {
            q.add(["f0", "f1", "f2", "f3", "f4", "f5", "f6", "f7"][i]);
        }
        // Fresh first, all of it (no turn for a retry every few: `fresh_first`), then the
        // retries by priority.
        let got = q.pop_batch(now, 20);
        assert_eq!(
            got,
            ["f0", "f1", "f2", "f3", "f4", "f5", "f6", "f7", "r2", "r1"]
        );
        for k in got {
            q.done(&k);
        }
        q.add_ranked("r1", rank(0, "", true));
        q.add("f0");
        q.add_ranked("r1", rank(0, "", false));
        assert_eq!(q.len(), 2);
        assert_eq!(
            q.pop_batch(now, 10),
            ["f0", "r1"],
            "moved to the fresh lane once"
        );
        assert!(
            q.pop(now).is_none(),
            "its old place in the retry lane is skipped"
        );
    }

    #[test]
    fn a_key_added_again_while_reconciled_keeps_its_newest_rank() {
        let now = Instant::now();
        // Strictly fresh first, so that the order below is not a retry's turn.
        let mut q = q().fresh_first();
        q.add_ranked("k", rank(0, "x", false));
        assert_eq!(q.pop(now), Some("k"));
        q.add_ranked("k", rank(9, "x", false));
        q.add_ranked("other", rank(1, "y", false));
        q.done(&"k");
        assert_eq!(q.pop_batch(now, 10), ["k", "other"], "priority 9 now");
        // A failed key's backoff keeps its rank: it comes back behind fresh work.
        q.done(&"k");
        q.done(&"other");
        q.add_ranked("k", rank(3, "x", false));
        assert_eq!(q.pop(now), Some("k"));
        q.retry("k", now);
        q.done(&"k");
        let later = now + Duration::from_secs(2);
        q.add("fresh");
        assert_eq!(q.pop_batch(later, 10), ["fresh", "k"]);
    }

    /// The scheduler's queue (moved from `orrery-scheduler`'s `Queue`): priority first,
    /// then namespaces take turns; a key already waiting keeps its place.
    #[test]
    fn priority_first_then_namespaces_take_turns() {
        let now = Instant::now();
        let mut q: WorkQueue<(String, String)> = q_of().fresh_first();
        let k = |ns: &str, n: &str| (ns.to_string(), n.to_string());
        for i in 0..3 {
            q.add_ranked(k("busy", &format!("b{i}")), rank(0, "busy", false));
        }
        q.add_ranked(k("quiet", "q0"), rank(0, "quiet", false));
        q.add_ranked(k("busy", "urgent"), rank(10, "busy", false));
        q.add_ranked(k("busy", "b0"), rank(0, "busy", false)); // already waiting
        assert_eq!(q.len(), 5);
        let order: Vec<String> = q.pop_batch(now, 10).into_iter().map(|k| k.1).collect();
        assert_eq!(order, ["urgent", "b0", "q0", "b1", "b2"]);
        assert!(q.is_empty());
    }

    /// The scheduler's lanes (moved from `orrery-scheduler`'s `Lanes`): fresh work before
    /// keys ranked behind, whatever their priorities.
    #[test]
    fn fresh_work_goes_before_retries() {
        let now = Instant::now();
        let mut q: WorkQueue<(String, String)> = q_of().fresh_first();
        let k = |n: &str| ("ns".to_string(), n.to_string());
        q.add_ranked(k("urgent-retry"), rank(100, "ns", true));
        q.add_ranked(k("retry"), rank(0, "ns", true));
        q.add_ranked(k("moved"), rank(0, "ns", true));
        q.add_ranked(k("new"), rank(0, "ns", false));
        // A retry that turns fresh is taken once, as fresh work.
        q.add_ranked(k("moved"), rank(0, "ns", false));
        // A fresh key asked to retry stays fresh.
        q.add_ranked(k("new"), rank(0, "ns", true));
        assert_eq!(q.len(), 4);
        let order: Vec<(String, String)> = q.pop_batch(now, 10);
        for key in &order {
            q.done(key);
        }
        let order: Vec<String> = order.into_iter().map(|k| k.1).collect();
        assert_eq!(order, ["new", "moved", "urgent-retry", "retry"]);
        assert!(q.is_empty());
        // A key retried again after its stale entry was skipped is taken.
        q.add_ranked(k("again"), rank(0, "ns", true));
        q.add_ranked(k("again"), rank(0, "ns", false));
        assert_eq!(q.pop(now).unwrap().1, "again");
        q.done(&k("again"));
        q.add_ranked(k("again"), rank(0, "ns", true));
        assert_eq!(q.pop(now).unwrap().1, "again");
        q.done(&k("again"));
        assert_eq!(q.pop(now), None);
    }

    fn q_of<K: Clone + Eq + Hash>() -> WorkQueue<K> {
        WorkQueue::new(Duration::from_millis(10), Duration::from_secs(1))
    }

    #[test]
    fn a_key_waiting_in_a_lane_is_not_timed_again() {
        let t0 = Instant::now();
        let mut q = q();
        q.add_ranked("k", rank(0, "", true));
        q.after("k", t0 + Duration::from_secs(1));
        assert_eq!(q.pop(t0), Some("k"));
        q.done(&"k");
        assert_eq!(q.next_due(), None, "once is enough");
        assert!(q.pop(t0 + Duration::from_secs(2)).is_none());
    }

    #[test]
    fn shutdown_hands_out_nothing_more() {
        let now = Instant::now();
        let mut q = q();
        q.add("a");
        q.add("b");
        assert_eq!(q.pop(now), Some("a"));
        q.shut_down();
        assert!(q.pop(now).is_none());
        q.add("c");
        q.done(&"a");
        assert!(q.pop(now).is_none());
        assert!(q.is_shut_down());
    }
}
