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
//! A write is kept only if the feed has not yet passed its revision: then every later change
//! of the key reaches the entry. One answered after the feed passed it (and perhaps a delete
//! of its key after it) is not; the feed itself keeps what it sees of a key while this store
//! is writing it, so such a write is kept from its own event.
//!
//! Values are kept as stored bytes (a fifth of a decoded object) and decoded per read, as
//! etcd's answer would be. Everything this store writes is kept, and what is not read or
//! written again ages out first when room runs short: a heartbeat's keys are touched every few
//! seconds, objects written once (Works, Events) are not.
//!
//! [`Store::get_recent`]: orrery_store::Store::get_recent
//! [`Store::get_copy`]: orrery_store::Store::get_copy

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use orrery_store::Revision;

/// Entries kept at most: a replica's share of 10,000 members' Leases, Clusters and metrics,
/// with room for what controllers update.
const CAP: usize = 16_384;
/// Bytes kept at most, over all entries.
const CAP_BYTES: usize = 64 << 20;
/// A value larger than this is not kept (a heartbeat's objects are a few KiB; a Work or a
/// Secret written once may be a MiB).
const MAX_VALUE: usize = 256 << 10;
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
    /// The sum of the entries' value lengths.
    bytes: usize,
    /// The highest revision the feed has passed: a write at or below it was passed without an
    /// entry to follow it, and a later change of its key (a delete) may have been too.
    fed: Revision,
    /// Keys this store is writing now (how many writes): the feed keeps what it sees of them,
    /// so that a write whose answer comes after its own event is kept all the same.
    writing: HashMap<String, usize>,
    swept: Instant,
}

impl Default for Map {
    fn default() -> Self {
        Map {
            entries: HashMap::new(),
            bytes: 0,
            fed: 0,
            writing: HashMap::new(),
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
    fn map(&self) -> parking_lot::MutexGuard<'_, Map> {
        // Every critical section below leaves the map whole; a panic elsewhere cannot tear it.
        self.map.lock()
    }

    /// The stored bytes at `key` and their revision, if kept.
    pub(crate) fn get(&self, key: &str) -> Option<(Revision, Arc<[u8]>)> {
        let mut map = self.map();
        let entry = map.entries.get_mut(key)?;
        entry.used = Instant::now();
        Some((entry.revision, entry.value.clone()))
    }

    /// This store is about to write `key`: until the guard goes, the feed keeps what it sees
    /// of the key.
    pub(crate) fn writing<'a>(&'a self, key: &'a str) -> Writing<'a> {
        *self.map().writing.entry(key.to_string()).or_default() += 1;
        Writing { recent: self, key }
    }

    /// This store wrote `value` at `key` at `revision`. Kept only while the feed has not yet
    /// passed that revision, so that every later change of the key reaches the entry.
    pub(crate) fn wrote(&self, key: &str, revision: Revision, value: Arc<[u8]>) {
        let now = Instant::now();
        let mut map = self.map();
        if revision <= map.fed {
            // The feed followed the key from its own event if it was kept, and may already
            // have passed a later delete of it if it was not.
            if let Some(entry) = map.entries.get_mut(key) {
                entry.used = now;
            }
            return;
        }
        map.remove(key);
        map.insert(key, revision, value, now);
    }

    /// The feed passed a change of `key` at `revision`: to `value`, or deleted (or
    /// unreadable) with `None`. Only kept keys, and keys this store is writing, are followed.
    pub(crate) fn changed(&self, key: &str, revision: Revision, value: Option<&[u8]>) {
        let mut map = self.map();
        map.fed = map.fed.max(revision);
        let used = match map.entries.get(key) {
            Some(entry) if entry.revision >= revision => return,
            Some(entry) => entry.used,
            None if map.writing.contains_key(key) => Instant::now(),
            None => return,
        };
        map.remove(key);
        if let Some(v) = value {
            map.insert(key, revision, Arc::from(v), used);
        }
    }

    /// `key` is no longer followed (this store deleted it).
    pub(crate) fn forget(&self, key: &str) {
        self.map().remove(key);
    }

    /// The feed lost history and starts again after `revision`: nothing kept can be trusted
    /// to be followed, nor a write at or below it.
    pub(crate) fn clear(&self, revision: Revision) {
        let mut map = self.map();
        map.entries.clear();
        map.bytes = 0;
        map.fed = map.fed.max(revision);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map().entries.len()
    }
}

/// A write of a key in progress (see [`Recent::writing`]).
pub(crate) struct Writing<'a> {
    recent: &'a Recent,
    key: &'a str,
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        let mut map = self.recent.map();
        if let Some(n) = map.writing.get_mut(self.key) {
            *n -= 1;
            if *n == 0 {
                map.writing.remove(self.key);
            }
        }
    }
}

impl Map {
    fn remove(&mut self, key: &str) {
        if let Some(old) = self.entries.remove(key) {
            self.bytes -= old.value.len();
        }
    }

    /// Keeps `value` at `key` if it is small enough and there is room.
    fn insert(&mut self, key: &str, revision: Revision, value: Arc<[u8]>, used: Instant) {
        if value.len() > MAX_VALUE || !self.make_room(Instant::now(), value.len()) {
            return;
        }
        self.bytes += value.len();
        self.entries.insert(
            key.to_string(),
            Entry {
                value,
                revision,
                used,
            },
        );
    }

    /// Whether there is room for another entry of `size` bytes, making it when full from the
    /// entries used longest ago: first those idle for `IDLE`, then for half as long, and so
    /// on, until an eighth of the room is free.
    fn make_room(&mut self, now: Instant, size: usize) -> bool {
        let fits = |m: &Map, slack: usize| {
            m.entries.len() + slack < CAP && m.bytes + size + slack * (CAP_BYTES / CAP) <= CAP_BYTES
        };
        if fits(self, 0) {
            return true;
        }
        if now.duration_since(self.swept) < SWEEP_EVERY {
            return false;
        }
        self.swept = now;
        let mut idle = IDLE;
        while !fits(self, CAP / 8) && idle > Duration::from_millis(10) {
            let mut freed = 0;
            self.entries.retain(|_, e| {
                let keep = now.duration_since(e.used) < idle;
                if !keep {
                    freed += e.value.len();
                }
                keep
            });
            self.bytes -= freed;
            idle /= 2;
        }
        fits(self, 0)
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
        // The feed reaching this store's own write, and a change older than what is kept.
        r.changed("/a", 5, Some(b"a5"));
        r.changed("/a", 4, Some(b"a4"));
        assert_eq!(r.get("/a"), Some((5, bytes("a5"))));
        // Another replica's later write, through the feed.
        r.changed("/a", 8, Some(b"a8"));
        assert_eq!(r.get("/a"), Some((8, bytes("a8"))));
        // This store's write answered after the feed brought a later one: the later stays.
        r.wrote("/a", 7, bytes("a7"));
        assert_eq!(rev(&r, "/a"), Some(8));
        // This store's next write, before the feed reaches it.
        r.wrote("/a", 10, bytes("a10"));
        assert_eq!(r.get("/a"), Some((10, bytes("a10"))));
        // A delete by another replica (or an unreadable change).
        r.changed("/a", 11, None);
        assert_eq!(rev(&r, "/a"), None);
        r.wrote("/b", 12, bytes("b12"));
        r.forget("/b");
        assert_eq!(rev(&r, "/b"), None);
        r.wrote("/c", 13, bytes("c13"));
        r.clear(13);
        assert_eq!(r.len(), 0);
        assert_eq!(r.map().bytes, 0);
    }

    /// A write answered after the feed passed it and a later delete of its key (another
    /// replica's, or this store's own delete racing it) is not kept: nothing would follow it.
    #[test]
    fn a_write_the_feed_has_passed_is_not_kept() {
        let r = Recent::default();
        r.changed("/a", 5, Some(b"a5"));
        r.changed("/a", 6, None);
        r.wrote("/a", 5, bytes("a5"));
        assert_eq!(rev(&r, "/a"), None);
        // Nor after the feed lost history and started again after revision 9.
        r.clear(9);
        r.wrote("/b", 9, bytes("b9"));
        assert_eq!(rev(&r, "/b"), None);
        r.wrote("/b", 10, bytes("b10"));
        assert_eq!(rev(&r, "/b"), Some(10));
        assert_eq!(r.map().bytes, 3);
    }

    /// A write whose answer comes after the feed's event of it is kept from that event.
    #[test]
    fn the_feed_keeps_what_is_being_written() {
        let r = Recent::default();
        {
            let _w = r.writing("/a");
            r.changed("/a", 5, Some(b"a5"));
            r.wrote("/a", 5, bytes("a5"));
        }
        assert_eq!(r.get("/a"), Some((5, bytes("a5"))));
        // Once written, the key is no longer taken from the feed unless kept.
        r.forget("/a");
        r.changed("/a", 6, Some(b"a6"));
        assert_eq!(rev(&r, "/a"), None);
        assert!(r.map().writing.is_empty());
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
        assert_eq!(r.map().bytes, 2 * (CAP - CAP / 4) + 4);
    }

    #[test]
    fn bytes_are_bounded_too() {
        let r = Recent::default();
        // Too large a value is not kept, and replacing a kept one by it drops the entry.
        r.wrote("/big", 1, Arc::from(vec![0u8; MAX_VALUE + 1]));
        assert_eq!(rev(&r, "/big"), None);
        r.wrote("/a", 2, bytes("a2"));
        r.changed("/a", 3, Some(&vec![0u8; MAX_VALUE + 1]));
        assert_eq!(rev(&r, "/a"), None);
        // Values of MAX_VALUE fill the byte budget long before the count.
        let fit = CAP_BYTES / MAX_VALUE;
        for i in 0..fit + 10 {
            r.wrote(
                &format!("/v{i}"),
                10 + i as Revision,
                Arc::from(vec![1u8; MAX_VALUE]),
            );
        }
        assert_eq!(r.len(), fit);
        assert!(r.map().bytes <= CAP_BYTES);
        assert_eq!(rev(&r, &format!("/v{fit}")), None);
    }
}
