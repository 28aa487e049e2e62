//! Objects this store read-modify-wrote lately, kept (as stored JSON) as the watch feed
//! changes them, for the first read of the next read-modify-write ([`Store::get_recent`],
//! [`Store::get_copy`]).
//!
//! A member renewing its Lease or writing its status every few seconds does a read and a
//! conditional write each time, through the replica it is connected to. The read was a round
//! trip to etcd (and, with the member's copy behind the replica's watch, a linearizable one:
//! a round of consensus); under a fleet's registration it was half of a heartbeat's time. The
//! object as this store last wrote it, or as its feed delivered it since, is what that read
//! would give: the write that follows is conditional on its revision, so an entry that missed
//! another replica's write fails as a conflict and the caller reads again, as the contract of
//! those reads says. Nothing here is answered to a client without such a write.
//!
//! Values are kept as stored bytes (a fifth of a decoded object) and decoded per read, as
//! etcd's answer would be. Everything this store writes is kept, and what is not read or
//! written again ages out first when room runs short: a heartbeat's keys are touched every few
//! seconds, objects written once (Works, Events) are not.
//!
//! [`Store::get_recent`]: orrery_store::Store::get_recent
//! [`Store::get_copy`]: orrery_store::Store::get_copy

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use orrery_store::Revision;

/// Entries kept at most: a replica's share of 10,000 members' Leases, Clusters and metrics,
/// with room for what controllers update.
const CAP: usize = 16_384;
/// An entry not read or written for this long may go to make room: a heartbeat touches its
/// own every ten seconds.
const IDLE: Duration = Duration::from_secs(60);
/// Room is looked for at most this often when the map is full (a sweep visits every entry).
const SWEEP_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
pub(crate) struct Recent {
    map: Mutex<Map>,
}

#[derive(Debug)]
struct Map {
    entries: HashMap<String, Entry>,
    swept: Instant,
}

impl Default for Map {
    fn default() -> Self {
        Map {
            entries: HashMap::new(),
            swept: Instant::now(),
        }
    }
}

#[derive(Debug)]
struct Entry {
    /// The stored bytes at `revision`.
    value: Arc<[u8]>,
    revision: Revision,
    used: Instant,
}

impl Recent {
    fn map(&self) -> std::sync::MutexGuard<'_, Map> {
        // Every critical section below leaves the map whole; a panic elsewhere cannot tear it.
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The stored bytes at `key` and their revision, if kept.
    pub(crate) fn get(&self, key: &str) -> Option<(Revision, Arc<[u8]>)> {
        let mut map = self.map();
        let entry = map.entries.get_mut(key)?;
        entry.used = Instant::now();
        Some((entry.revision, entry.value.clone()))
    }

    /// This store wrote `value` at `key` at `revision`.
    pub(crate) fn wrote(&self, key: &str, revision: Revision, value: Arc<[u8]>) {
        let now = Instant::now();
        let mut map = self.map();
        if let Some(entry) = map.entries.get_mut(key) {
            // The feed may have brought a later change first.
            if entry.revision < revision {
                entry.value = value;
                entry.revision = revision;
            }
            entry.used = now;
            return;
        }
        if map.make_room(now) {
            map.entries.insert(
                key.to_string(),
                Entry {
                    value,
                    revision,
                    used: now,
                },
            );
        }
    }

    /// The feed saw `key` change at `revision`: to `value`, or deleted (or unreadable) with
    /// `None`. Only kept keys are followed.
    pub(crate) fn changed(&self, key: &str, revision: Revision, value: Option<&[u8]>) {
        let mut map = self.map();
        let Some(entry) = map.entries.get_mut(key) else {
            return;
        };
        if entry.revision >= revision {
            return;
        }
        match value {
            Some(v) => {
                entry.value = Arc::from(v);
                entry.revision = revision;
            }
            None => {
                map.entries.remove(key);
            }
        }
    }

    /// `key` is no longer followed (this store deleted it).
    pub(crate) fn forget(&self, key: &str) {
        self.map().entries.remove(key);
    }

    /// The feed lost history: nothing kept can be trusted to be followed.
    pub(crate) fn clear(&self) {
        self.map().entries.clear();
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map().entries.len()
    }
}

impl Map {
    /// Whether there is room for another entry, making it when full from the entries used
    /// longest ago: first those idle for `IDLE`, then for half as long, and so on, until an
    /// eighth of the room is free.
    fn make_room(&mut self, now: Instant) -> bool {
        if self.entries.len() < CAP {
            return true;
        }
        if now.duration_since(self.swept) < SWEEP_EVERY {
            return false;
        }
        self.swept = now;
        let mut idle = IDLE;
        while self.entries.len() > CAP - CAP / 8 && idle > Duration::from_millis(10) {
            self.entries
                .retain(|_, e| now.duration_since(e.used) < idle);
            idle /= 2;
        }
        self.entries.len() < CAP
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed test
mod tests {
    use super::*;

    fn bytes(b: &str) -> Arc<[u8]> {
        Arc::from(b.as_bytes())
    }

    fn rev(r: &Recent, key: &str) -> Option<Revision> {
        r.get(key).map(|(rev, _)| rev)
    }

    #[test]
    fn follows_its_writes_and_the_feed_in_revision_order() {
        let r = Recent::default();
        // The feed follows only what this store wrote.
        r.changed("/a", 3, Some(b"a3"));
        assert_eq!(rev(&r, "/a"), None);
        r.wrote("/a", 5, bytes("a5"));
        assert_eq!(r.get("/a"), Some((5, bytes("a5"))));
        // A change older than what is kept (the feed behind this store's write) is ignored.
        r.changed("/a", 4, Some(b"a4"));
        assert_eq!(rev(&r, "/a"), Some(5));
        // Another replica's later write, through the feed.
        r.changed("/a", 8, Some(b"a8"));
        assert_eq!(r.get("/a"), Some((8, bytes("a8"))));
        // This store's write answered after the feed brought a later one: the later stays.
        r.wrote("/a", 7, bytes("a7"));
        assert_eq!(rev(&r, "/a"), Some(8));
        // A delete by another replica (or an unreadable change).
        r.changed("/a", 9, None);
        assert_eq!(r.len(), 0);
        r.wrote("/b", 2, bytes("b2"));
        r.forget("/b");
        assert_eq!(rev(&r, "/b"), None);
        r.wrote("/c", 2, bytes("c2"));
        r.clear();
        assert_eq!(r.len(), 0);
    }

    #[test]
    fn full_it_makes_room_from_what_was_used_longest_ago() {
        let r = Recent::default();
        let ago = |secs: u64| {
            Instant::now()
                .checked_sub(Duration::from_secs(secs))
                .unwrap()
        };
        for i in 0..CAP {
            r.wrote(&format!("/k{i}"), 1, bytes("k1"));
        }
        assert_eq!(r.len(), CAP);
        // Full, swept a moment ago: a new key is not kept, a kept one still follows writes.
        r.map().swept = Instant::now();
        r.wrote("/new", 2, bytes("new2"));
        assert_eq!(rev(&r, "/new"), None);
        r.wrote("/k0", 3, bytes("k3"));
        assert_eq!(rev(&r, "/k0"), Some(3));
        // A quarter used 40 s ago, the rest 20 s ago but "/k0" (now): the oldest quarter goes
        // first, and no more than it takes.
        {
            let mut map = r.map();
            for (k, e) in map.entries.iter_mut() {
                let i: usize = k[2..].parse().unwrap();
                if i != 0 {
                    e.used = if i % 4 == 1 { ago(40) } else { ago(20) };
                }
            }
            map.swept = ago(2);
        }
        r.wrote("/new", 4, bytes("new4"));
        assert_eq!(rev(&r, "/new"), Some(4));
        assert_eq!(rev(&r, "/k0"), Some(3));
        assert_eq!(rev(&r, "/k1"), None);
        assert_eq!(rev(&r, "/k2"), Some(1));
        assert_eq!(r.len(), CAP - CAP / 4 + 1);
    }
}
