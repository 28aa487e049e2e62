//! The scheduling queue: higher priority first; within a priority, namespaces take turns so
//! that one namespace's burst does not starve the others; fresh work goes before retries
//! ([`Lanes`]); retries back off exponentially.
//!
//! Pure data structures; the caller supplies times in milliseconds.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::hash::Hash;

/// Bindings waiting to be scheduled, keyed by `(namespace, name)`.
#[derive(Debug)]
pub struct Queue<K: Clone + Eq + Hash + Ord> {
    /// priority (negated, so the highest comes first) -> namespace turn order and queues.
    levels: BTreeMap<i64, Level<K>>,
    queued: HashSet<K>,
}

#[derive(Debug)]
struct Level<K> {
    turn: VecDeque<String>,
    by_namespace: HashMap<String, VecDeque<K>>,
}

impl<K: Clone + Eq + Hash + Ord> Default for Queue<K> {
    fn default() -> Self {
        Queue {
            levels: BTreeMap::new(),
            queued: HashSet::new(),
        }
    }
}

impl<K: Clone + Eq + Hash + Ord> Queue<K> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `key` unless it is already waiting.
    pub fn push(&mut self, priority: i32, namespace: &str, key: K) {
        if !self.queued.insert(key.clone()) {
            return;
        }
        let level = self
            .levels
            .entry(-(priority as i64))
            .or_insert_with(|| Level {
                turn: VecDeque::new(),
                by_namespace: HashMap::new(),
            });
        let q = level.by_namespace.entry(namespace.to_string()).or_default();
        if q.is_empty() {
            level.turn.push_back(namespace.to_string());
        }
        q.push_back(key);
    }

    /// The next key: the highest priority, the namespace whose turn it is.
    pub fn pop(&mut self) -> Option<K> {
        let (&p, level) = self.levels.iter_mut().next()?;
        let ns = level.turn.pop_front()?;
        let q = level.by_namespace.get_mut(&ns)?;
        let key = q.pop_front();
        if q.is_empty() {
            level.by_namespace.remove(&ns);
        } else {
            level.turn.push_back(ns);
        }
        if level.turn.is_empty() {
            self.levels.remove(&p);
        }
        if let Some(k) = &key {
            self.queued.remove(k);
        }
        key
    }

    pub fn len(&self) -> usize {
        self.queued.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queued.is_empty()
    }
}

/// Two queues: fresh work (bindings that changed, or that the fleet's changes concern) before
/// retries of bindings that found no room, whatever their priorities, so that a storm of
/// retries cannot hold back new arrivals (kube-scheduler's active and backoff queues).
#[derive(Debug)]
pub struct Lanes<K: Clone + Eq + Hash + Ord> {
    fresh: Queue<K>,
    retry: Queue<K>,
    /// Keys whose retry is still wanted: a key pushed fresh meanwhile leaves its retry entry
    /// behind, skipped when it comes up.
    retrying: HashSet<K>,
}

impl<K: Clone + Eq + Hash + Ord> Default for Lanes<K> {
    fn default() -> Self {
        Lanes {
            fresh: Queue::new(),
            retry: Queue::new(),
            retrying: HashSet::new(),
        }
    }
}

impl<K: Clone + Eq + Hash + Ord> Lanes<K> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `key` to the fresh lane (taking it out of the retry lane), or to the retry lane
    /// unless it waits in the fresh one already.
    pub fn push(&mut self, priority: i32, namespace: &str, key: K, retry: bool) {
        if retry {
            if !self.fresh.queued.contains(&key) {
                self.retrying.insert(key.clone());
                self.retry.push(priority, namespace, key);
            }
        } else {
            self.retrying.remove(&key);
            self.fresh.push(priority, namespace, key);
        }
    }

    /// The next key: fresh work first, then retries.
    pub fn pop(&mut self) -> Option<K> {
        if let Some(k) = self.fresh.pop() {
            return Some(k);
        }
        while let Some(k) = self.retry.pop() {
            if self.retrying.remove(&k) {
                return Some(k);
            }
        }
        None
    }

    /// Keys waiting, in both lanes.
    pub fn len(&self) -> usize {
        self.fresh.len() + self.retrying.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Exponential backoff per key: `base`, doubled per failure, capped at `max`.
#[derive(Debug)]
pub struct Backoff<K: Eq + Hash> {
    failures: HashMap<K, u32>,
    base: u64,
    max: u64,
}

impl<K: Eq + Hash + Clone> Backoff<K> {
    pub fn new(base_ms: u64, max_ms: u64) -> Self {
        Backoff {
            failures: HashMap::new(),
            base: base_ms,
            max: max_ms,
        }
    }

    /// Records a failure; returns how long to wait before the next try.
    pub fn fail(&mut self, key: &K) -> u64 {
        let n = self.failures.entry(key.clone()).or_insert(0);
        let delay = self.base.saturating_mul(1u64 << (*n).min(20)).min(self.max);
        *n = n.saturating_add(1);
        delay
    }

    /// The key succeeded (or its world changed): start afresh.
    pub fn reset(&mut self, key: &K) {
        self.failures.remove(key);
    }

    pub fn clear(&mut self) {
        self.failures.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priority_first_then_namespaces_take_turns() {
        let mut q: Queue<(String, String)> = Queue::new();
        let k = |ns: &str, n: &str| (ns.to_string(), n.to_string());
        for i in 0..3 {
            q.push(0, "busy", k("busy", &format!("b{i}")));
        }
        q.push(0, "quiet", k("quiet", "q0"));
        q.push(10, "busy", k("busy", "urgent"));
        q.push(0, "busy", k("busy", "b0")); // already waiting
        assert_eq!(q.len(), 5);
        let order: Vec<String> = std::iter::from_fn(|| q.pop()).map(|k| k.1).collect();
        assert_eq!(order, ["urgent", "b0", "q0", "b1", "b2"]);
        assert!(q.is_empty());
    }

    #[test]
    fn fresh_work_goes_before_retries() {
        let mut q: Lanes<(String, String)> = Lanes::new();
        let k = |n: &str| ("ns".to_string(), n.to_string());
        q.push(100, "ns", k("urgent-retry"), true);
        q.push(0, "ns", k("retry"), true);
        q.push(0, "ns", k("moved"), true);
        q.push(0, "ns", k("new"), false);
        // A retry that turns fresh is taken once, as fresh work.
        q.push(0, "ns", k("moved"), false);
        // A fresh key asked to retry stays fresh.
        q.push(0, "ns", k("new"), true);
        assert_eq!(q.len(), 4);
        let order: Vec<String> = std::iter::from_fn(|| q.pop()).map(|k| k.1).collect();
        assert_eq!(order, ["new", "moved", "urgent-retry", "retry"]);
        assert!(q.is_empty());
        // A key retried again after its stale entry was skipped is taken.
        q.push(0, "ns", k("again"), true);
        q.push(0, "ns", k("again"), false);
        assert_eq!(q.pop().unwrap().1, "again");
        q.push(0, "ns", k("again"), true);
        assert_eq!(q.pop().unwrap().1, "again");
        assert_eq!(q.pop(), None);
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let mut b = Backoff::new(100, 1000);
        let delays: Vec<u64> = (0..6).map(|_| b.fail(&"x")).collect();
        assert_eq!(delays, [100, 200, 400, 800, 1000, 1000]);
        b.reset(&"x");
        assert_eq!(b.fail(&"x"), 100);
    }
}
