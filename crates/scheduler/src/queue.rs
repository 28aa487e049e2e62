//! How long a binding that found no room waits before it is tried again: an exponential
//! backoff per key. (The scheduling queue itself, priorities and namespaces in turn, is the
//! runtime's `WorkQueue` with the scheduling controller's `Rank`s.)
//!
//! Pure data; the caller supplies times in milliseconds.

use std::collections::HashMap;
use std::hash::Hash;

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
    fn backoff_doubles_up_to_the_cap() {
        let mut b = Backoff::new(100, 1000);
        let delays: Vec<u64> = (0..6).map(|_| b.fail(&"x")).collect();
        assert_eq!(delays, [100, 200, 400, 800, 1000, 1000]);
        b.reset(&"x");
        assert_eq!(b.fail(&"x"), 100);
    }
}
