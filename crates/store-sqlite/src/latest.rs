//! The latest committed version of recently written keys, kept in memory, so that a point read
//! of a hot object (a Cluster reporting every second, a Work whose status comes back, a
//! template being rendered) needs neither an SQLite query nor a JSON parse.
//!
//! # Invariant
//! An entry is always its key's latest committed version. Only the writer thread changes
//! entries: before it commits a group it removes every key the group touches, and after the
//! commit it puts the versions it wrote. A read that misses goes to SQLite, which is as current
//! as ever. Readers never fill the cache, so no older version can slip in behind a commit.
//!
//! The cache is bounded by the stored JSON size of its entries (least recently used go first);
//! its objects are the same `Arc`s the watch cache hands to watchers, so most cost no memory of
//! their own.

use parking_lot::Mutex;
use std::sync::Arc;

use hashlink::LinkedHashMap;
use orrery_api::Object;

#[derive(Debug)]
pub struct Latest {
    budget: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Least recently used first.
    map: LinkedHashMap<String, (Arc<Object>, usize)>,
    bytes: usize,
}

impl State {
    fn remove(&mut self, key: &str) {
        if let Some((_, w)) = self.map.remove(key) {
            self.bytes -= w;
        }
    }
}

impl Latest {
    /// A cache holding at most `budget` bytes of stored JSON; 0 turns it off.
    pub fn new(budget: usize) -> Self {
        Latest {
            budget,
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> parking_lot::MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave an entry wrong: every change is a single
        // map operation.
        self.state.lock()
    }

    /// The latest version of `key`, if cached.
    pub fn get(&self, key: &str) -> Option<Arc<Object>> {
        if self.budget == 0 {
            return None;
        }
        self.state().map.to_back(key).map(|(o, _)| o.clone())
    }

    /// Before a commit: forget every key it may change.
    pub fn forget<'a>(&self, keys: impl Iterator<Item = &'a str>) {
        if self.budget == 0 {
            return;
        }
        let mut s = self.state();
        for k in keys {
            s.remove(k);
        }
    }

    /// After a commit: the versions it wrote (`weight` is the stored JSON's size).
    pub fn put(&self, written: impl Iterator<Item = (String, Arc<Object>, usize)>) {
        if self.budget == 0 {
            return;
        }
        let mut s = self.state();
        for (key, obj, weight) in written {
            if weight > self.budget / 8 {
                // One huge object would push out many small ones.
                s.remove(&key);
                continue;
            }
            if let Some((_, old)) = s.map.insert(key, (obj, weight)) {
                s.bytes -= old;
            }
            s.bytes += weight;
        }
        while s.bytes > self.budget {
            match s.map.pop_front() {
                Some((_, (_, w))) => s.bytes -= w,
                None => break,
            }
        }
    }

    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.state().bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(name: &str, rv: i64) -> Arc<Object> {
        let mut o = Object::new("v1", "ConfigMap").with_name(name);
        o.metadata.resource_version = rv.to_string();
        Arc::new(o)
    }

    #[test]
    fn puts_forgets_and_evicts_least_recently_used() {
        let c = Latest::new(800);
        c.put(
            [
                ("a".to_string(), obj("a", 1), 100),
                ("b".to_string(), obj("b", 2), 100),
            ]
            .into_iter(),
        );
        assert_eq!(c.get("a").unwrap().metadata.resource_version, "1");
        assert_eq!(c.bytes(), 200);
        // A newer version replaces the old one and its weight.
        c.put([("a".to_string(), obj("a", 3), 50)].into_iter());
        assert_eq!(c.get("a").unwrap().metadata.resource_version, "3");
        assert_eq!(c.bytes(), 150);
        c.forget(["a", "missing"].into_iter());
        assert!(c.get("a").is_none());
        assert_eq!(c.bytes(), 100);
        c.put([("c".to_string(), obj("c", 4), 100)].into_iter());
        assert!(c.get("b").is_some());
        // Over budget (900 bytes): the least recently used goes first; "b" was read after
        // "c" was written, so "c" goes and "b" stays.
        c.put((0..7).map(|i| (format!("d{i}"), obj("d", 5 + i), 100)));
        assert!(c.get("c").is_none());
        assert!(c.get("b").is_some());
        assert!(c.get("d6").is_some());
        assert_eq!(c.bytes(), 800);
    }

    #[test]
    fn huge_objects_and_a_zero_budget_are_not_kept() {
        let c = Latest::new(800);
        c.put([("a".to_string(), obj("a", 1), 100)].into_iter());
        c.put([("a".to_string(), obj("a", 2), 101)].into_iter());
        // The old version must not stay behind when the new one is too big to keep.
        assert!(c.get("a").is_none());
        assert_eq!(c.bytes(), 0);
        let off = Latest::new(0);
        off.put([("a".to_string(), obj("a", 1), 1)].into_iter());
        assert!(off.get("a").is_none());
    }
}
