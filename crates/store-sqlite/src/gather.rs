//! When the writer waits a little for more writes before it commits (group commit for writes
//! that arrive apart).
//!
//! Writes that are queued together share one transaction and one fsync anyway. But a steady
//! stream of independent writes (a thousand clusters reporting once a second each) arrives one
//! at a time, each finding the writer idle, and pays a commit and an fsync of its own. Waiting a
//! moment for the next ones cuts that cost to a half or a third, at the price of the wait. The
//! writer waits only where that pays:
//! - writes come close together: the first write of a group comes, on average, sooner after
//!   the last commit than the longest wait (sparse writes are committed at once);
//! - and recent groups were larger than what is at hand: a sequential client, which sends its
//!   next write only when the last is answered, makes groups of one and is never waited for;
//!   a few such clients make groups of their number, and are waited for only until all are in.
//!
//! To find out whether groups would grow, it probes now and then: waits the whole delay once.
//!
//! Pure logic; the writer keeps the clock and the queue.

use std::time::{Duration, Instant};

/// Groups committed between probes while waiting does not pay; each probe that finds nothing
/// doubles the interval, up to the longest, so a sequential client seldom pays for one.
const PROBE_EVERY: u32 = 32;
const PROBE_EVERY_LONGEST: u32 = 1024;
/// Groups whose size sets how many writes a wait is for.
const RECENT: usize = 8;
/// Weight of the newest gap in the smoothed gap between a commit and the next write.
const SMOOTHING: f64 = 0.25;

/// Whether and how long to wait before committing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    /// Commit at this instant at the latest.
    pub until: Instant,
    /// Commit as soon as this many writes are gathered.
    pub enough: usize,
}

#[derive(Debug)]
pub struct Gather {
    delay: Duration,
    /// Sizes of the last groups committed (a ring).
    recent: [usize; RECENT],
    next: usize,
    /// Smoothed time from a commit to the first write of the next group, in seconds.
    gap: f64,
    since_probe: u32,
    probe_every: u32,
    /// The largest recent group when the current probe began: it pays if it gathers more.
    probing: Option<usize>,
    last_commit: Option<Instant>,
}

impl Gather {
    /// `delay`: the longest wait; zero never waits.
    pub fn new(delay: Duration) -> Self {
        Gather {
            delay,
            recent: [1; RECENT],
            next: 0,
            gap: f64::INFINITY,
            since_probe: 0,
            probe_every: PROBE_EVERY,
            probing: None,
            last_commit: None,
        }
    }

    /// With `n` writes at hand (and none more queued) at `now`: whether to wait for more.
    pub fn wait(&mut self, n: usize, max: usize, now: Instant) -> Option<Wait> {
        let delay = self.delay.as_secs_f64();
        // A gap counts at most ten delays, so one quiet spell does not hide a stream for long.
        let gap = self.last_commit.map_or(f64::INFINITY, |t| {
            now.saturating_duration_since(t)
                .as_secs_f64()
                .min(10.0 * delay)
        });
        self.gap = if self.gap.is_finite() {
            self.gap * (1.0 - SMOOTHING) + gap * SMOOTHING
        } else {
            gap
        };
        // (The gap is a finite or an infinite number of seconds, never NaN.)
        if self.delay.is_zero() || n >= max || self.gap >= delay {
            return None;
        }
        let until = now + self.delay;
        let largest = self.recent.iter().copied().max().unwrap_or(1);
        self.since_probe += 1;
        if self.since_probe >= self.probe_every {
            // Also while waiting: groups only ever grow to what a wait is for, so a stream
            // that would fill larger groups is found only by waiting longer.
            self.since_probe = 0;
            self.probing = Some(largest);
            return Some(Wait { until, enough: max });
        }
        let enough = largest.min(max);
        (n < enough).then_some(Wait { until, enough })
    }

    /// A group of `n` writes was committed at `now`.
    pub fn committed(&mut self, n: usize, now: Instant) {
        if let Some(largest) = self.probing.take() {
            self.probe_every = if n > largest {
                PROBE_EVERY
            } else {
                (self.probe_every * 2).min(PROBE_EVERY_LONGEST)
            };
        }
        self.recent[self.next] = n;
        self.next = (self.next + 1) % RECENT;
        self.last_commit = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Duration = Duration::from_millis(2);
    const MS: Duration = Duration::from_millis(1);

    /// Feeds groups of the given sizes, the first write of each `gap` after the last commit,
    /// and returns how many of them the writer would have waited for.
    fn waits(g: &mut Gather, sizes: &[usize], gap: Duration, t: &mut Instant) -> usize {
        let mut waited = 0;
        for &n in sizes {
            *t += gap;
            if g.wait(1, 1024, *t).is_some() {
                waited += 1;
            }
            g.committed(n, *t);
        }
        waited
    }

    #[test]
    fn zero_delay_never_waits() {
        let mut g = Gather::new(Duration::ZERO);
        let mut t = Instant::now();
        assert_eq!(
            waits(&mut g, &[5; 100], Duration::from_micros(100), &mut t),
            0
        );
    }

    #[test]
    fn a_sequential_writer_waits_only_on_ever_rarer_probes() {
        let mut g = Gather::new(D);
        let mut t = Instant::now();
        // Probes after 32, 64, 128, ... groups (the first write, after no commit at all, is
        // never waited for).
        let n = 1 + (32 + 64 + 128 + 256 + 512) + 3 * 1024;
        let waited = waits(&mut g, &vec![1; n], Duration::from_micros(300), &mut t);
        assert_eq!(waited, 8);
    }

    #[test]
    fn a_probe_that_finds_a_stream_starts_the_waits() {
        let mut g = Gather::new(D);
        let mut t = Instant::now();
        waits(&mut g, &[1; 33], Duration::from_micros(300), &mut t);
        // The next probe is 64 groups on; it gathers three.
        let mut probed = None;
        for _ in 0..64 {
            t += MS;
            probed = g.wait(1, 1024, t);
            g.committed(if probed.is_some() { 3 } else { 1 }, t);
        }
        assert_eq!(probed.map(|w| w.enough), Some(1024));
        t += MS;
        assert_eq!(g.wait(1, 1024, t).map(|w| w.enough), Some(3));
    }

    #[test]
    fn a_close_stream_that_groups_is_waited_for() {
        let mut g = Gather::new(D);
        let mut t = Instant::now();
        let waited = waits(&mut g, &[3; 100], MS, &mut t);
        assert!(waited >= 98, "waited for {waited} of 100 groups");
        t += MS;
        assert_eq!(
            g.wait(1, 1024, t),
            Some(Wait {
                until: t + D,
                enough: 3
            })
        );
        // The largest recent group sets the count.
        g.committed(5, t);
        t += MS;
        assert_eq!(g.wait(2, 1024, t).map(|w| w.enough), Some(5));
    }

    #[test]
    fn a_stream_waited_for_in_small_groups_is_found_to_fill_larger_ones() {
        let mut g = Gather::new(D);
        let mut t = Instant::now();
        // Two writes once came together; waits for two keep the groups at two, until a probe
        // waits the whole delay and gathers six.
        waits(&mut g, &[2; 8], MS, &mut t);
        let mut probes = 0;
        for _ in 0..PROBE_EVERY {
            t += MS;
            let w = g.wait(1, 1024, t).expect("waits");
            let probe = w.enough == 1024;
            probes += usize::from(probe);
            g.committed(if probe { 6 } else { w.enough }, t);
        }
        assert_eq!(probes, 1);
        t += MS;
        assert_eq!(g.wait(1, 1024, t).map(|w| w.enough), Some(6));
    }

    #[test]
    fn sparse_writes_are_never_waited_for() {
        let mut g = Gather::new(D);
        let mut t = Instant::now();
        // Even groups of three (writes that came together) do not make a stream.
        assert_eq!(waits(&mut g, &[3; 100], 3 * MS, &mut t), 0);
    }

    #[test]
    fn a_stream_that_stops_grouping_stops_being_waited_for() {
        let mut g = Gather::new(D);
        let mut t = Instant::now();
        waits(&mut g, &[3; 50], MS, &mut t);
        let waited = waits(&mut g, &[1; 100], MS, &mut t);
        let most = RECENT + 100 / PROBE_EVERY as usize + 1;
        assert!(waited <= most, "waited for {waited} of 100 single writes");
    }

    #[test]
    fn closed_loop_clients_are_waited_for_only_until_all_are_in() {
        let mut g = Gather::new(D);
        let mut t = Instant::now();
        waits(&mut g, &[4; 50], Duration::from_micros(100), &mut t);
        t += Duration::from_micros(100);
        assert_eq!(g.wait(2, 1024, t).map(|w| w.enough), Some(4));
        // All four at hand: commit at once.
        assert_eq!(g.wait(4, 1024, t), None);
    }

    #[test]
    fn a_quiet_spell_ends_a_stream() {
        let mut g = Gather::new(D);
        let mut t = Instant::now();
        waits(&mut g, &[3; 50], MS, &mut t);
        t += Duration::from_millis(100);
        assert_eq!(g.wait(1, 1024, t), None);
    }

    #[test]
    fn a_wait_is_never_for_more_than_a_batch() {
        let mut g = Gather::new(D);
        let mut t = Instant::now();
        waits(&mut g, &[8; 50], MS, &mut t);
        t += MS;
        assert_eq!(g.wait(8, 8, t), None);
        assert_eq!(g.wait(3, 4, t).map(|w| w.enough), Some(4));
    }
}
