//! History reported afterwards: a cluster's figures with the times they were measured at,
//! from the reporting API (`POST /api/v1/metrics/history`, or `PUT /api/v1/metrics` with a
//! past timestamp) or read from a Prometheus server. They wait in one inbox record per
//! cluster ([`PREFIX`]) until the monitoring loop, on the leader, merges them into the
//! 5-minute averages, where the history API, the browser view and the forecasts find them.
//!
//! ```text
//! report / Prometheus ──► inbox /internal/monitoring/backfill/<cluster>
//!                              │ (leader: merged, then the inbox deleted at its revision)
//!                              ├──► /internal/monitoring/5m/<time> records
//!                              └──► the forecaster's series of the cluster
//! ```
//!
//! The rules, all here and pure: a time is taken from the retained window's start up to
//! [`SKEW_SECONDS`] ahead of now; a second reported twice keeps the last report; the points
//! are averaged per 5-minute window and stamped at its end (as the monitoring loop stamps its
//! averages); a window the monitoring loop measured keeps what it measured.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::series::{ClusterSample, FleetSample};

pub const PREFIX: &str = "/internal/monitoring/backfill/";
/// How far ahead of the server's clock a report's time may be (clocks differ a little).
pub const SKEW_SECONDS: i64 = 60;
/// How far back history is kept (the 5-minute averages' retention), and so accepted: 17
/// days, two weeks for the forecasts' weekly season and three days of backtest before them.
pub const RETENTION_SECONDS: i64 = 17 * 86400;
/// Samples one request may carry (14 days of 5-minute samples are 4,032).
pub const MAX_PER_REQUEST: usize = 4096;
/// Samples that may wait in one cluster's inbox: its record stays under etcd's request
/// limit (1.5 MiB; a point is about 140 bytes).
pub const MAX_WAITING: usize = 8192;

pub fn key(cluster: &str) -> String {
    format!("{PREFIX}{cluster}")
}

/// A cluster's samples waiting to be merged.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Inbox {
    pub cluster: String,
    /// By the unix second they were measured at.
    #[serde(default)]
    pub points: BTreeMap<i64, Point>,
}

/// One sample of a cluster's figures.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Point {
    /// Water level per dimension (`cpu`, `memory`, `gpu`, `pods`), 0 to 1.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub levels: BTreeMap<String, f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_usage: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_available: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<i64>,
    /// Bytes per second, in and out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic: Option<f64>,
}

/// Why a sample's time is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TimeRefused {
    #[error("it is {0} s ahead of the server's clock (at most {SKEW_SECONDS} s)")]
    Future(i64),
    #[error("it is older than the {} days of history kept", RETENTION_SECONDS / 86400)]
    TooOld,
}

/// Whether a sample measured at `t` may join the history at `now` (unix seconds).
pub fn check_time(t: i64, now: i64) -> Result<(), TimeRefused> {
    if t > now + SKEW_SECONDS {
        return Err(TimeRefused::Future(t - now));
    }
    if t < now - RETENTION_SECONDS {
        return Err(TimeRefused::TooOld);
    }
    Ok(())
}

impl Inbox {
    /// Takes samples in; how many replaced one of the same second.
    pub fn add(&mut self, points: impl IntoIterator<Item = (i64, Point)>) -> usize {
        points
            .into_iter()
            .filter(|(t, p)| self.points.insert(*t, p.clone()).is_some())
            .count()
    }

    /// Drops what has aged out of the history by `now`.
    pub fn expire(&mut self, now: i64) {
        self.points = self.points.split_off(&(now - RETENTION_SECONDS));
    }
}

/// The end of the `every`-second window (aligned to the epoch) that holds `t`: windows are
/// `(end - every, end]`, as an average stamped at its last sample covers the samples before.
pub fn window_end(t: i64, every: i64) -> i64 {
    let every = every.max(1);
    (t + every - 1).div_euclid(every) * every
}

/// The points averaged per `every`-second window, each as a sample stamped at its window's
/// end: levels, usage and traffic averaged, pods as last reported.
pub fn windows(points: &BTreeMap<i64, Point>, every: i64) -> Vec<(i64, ClusterSample)> {
    #[derive(Default)]
    struct Sums {
        levels: BTreeMap<String, (f64, usize)>,
        cpu: (f64, usize),
        memory: (f64, usize),
        traffic: (f64, usize),
        pods: Option<i64>,
    }
    fn add(s: &mut (f64, usize), x: Option<f64>) {
        if let Some(x) = x {
            s.0 += x;
            s.1 += 1;
        }
    }
    let mean = |s: (f64, usize)| (s.1 > 0).then(|| s.0 / s.1 as f64);
    let round = |x: f64| (x * 1000.0).round() / 1000.0;
    let mut by: BTreeMap<i64, Sums> = BTreeMap::new();
    for (t, p) in points {
        let s = by.entry(window_end(*t, every)).or_default();
        for (d, v) in &p.levels {
            add(s.levels.entry(d.clone()).or_default(), Some(*v));
        }
        add(&mut s.cpu, p.cpu_usage);
        add(&mut s.memory, p.memory_available);
        add(&mut s.traffic, p.traffic);
        s.pods = p.pods.or(s.pods);
    }
    by.into_iter()
        .map(|(end, s)| {
            let levels: BTreeMap<String, f64> = s
                .levels
                .into_iter()
                .map(|(d, (sum, n))| (d, round(sum / n as f64)))
                .collect();
            let sample = ClusterSample {
                // A cluster that reported figures was up.
                ready: true,
                level: levels.values().copied().fold(0.0, f64::max),
                levels,
                cpu_usage: mean(s.cpu),
                memory_available: mean(s.memory),
                pods: s.pods,
                traffic: mean(s.traffic).unwrap_or(0.0),
                backfilled: true,
                ..Default::default()
            };
            (end, sample)
        })
        .collect()
}

/// Which stored sample a window ending at `end` goes into: the first of the stored times in
/// `(end - every, end]` (`None`: a record of its own, at `end`).
pub fn target(stored: &std::collections::BTreeSet<i64>, end: i64, every: i64) -> Option<i64> {
    stored.range(end - every.max(1) + 1..=end).next().copied()
}

/// Sets `cluster`'s backfilled `sample` into a stored one, unless the monitoring loop measured
/// the cluster there; whether it changed.
pub fn merge_into(s: &mut FleetSample, cluster: &str, sample: &ClusterSample) -> bool {
    match s.clusters.get(cluster) {
        Some(c) if !c.backfilled || c == sample => false,
        _ => {
            s.clusters.insert(cluster.to_string(), sample.clone());
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::Time;

    fn point(cpu: f64) -> Point {
        Point {
            levels: [("cpu".to_string(), cpu)].into(),
            cpu_usage: Some(cpu * 100.0),
            ..Default::default()
        }
    }

    #[test]
    fn times_are_taken_within_the_retained_window_and_a_little_ahead() {
        let now = 1_000_000_000;
        assert_eq!(check_time(now, now), Ok(()));
        assert_eq!(check_time(now + SKEW_SECONDS, now), Ok(()));
        assert_eq!(check_time(now + 61, now), Err(TimeRefused::Future(61)));
        assert_eq!(check_time(now - RETENTION_SECONDS, now), Ok(()));
        assert_eq!(
            check_time(now - RETENTION_SECONDS - 1, now),
            Err(TimeRefused::TooOld)
        );
    }

    #[test]
    fn a_second_reported_twice_keeps_the_last_report_whatever_the_order() {
        let mut inbox = Inbox::default();
        // Out of order: the later times first.
        assert_eq!(inbox.add([(600, point(0.6)), (300, point(0.3))]), 0);
        assert_eq!(inbox.add([(300, point(0.4)), (900, point(0.9))]), 1);
        let times: Vec<i64> = inbox.points.keys().copied().collect();
        assert_eq!(times, vec![300, 600, 900]);
        assert_eq!(inbox.points[&300], point(0.4));
        inbox.expire(RETENTION_SECONDS + 600);
        assert_eq!(
            inbox.points.keys().copied().collect::<Vec<_>>(),
            vec![600, 900]
        );
    }

    #[test]
    fn points_are_averaged_per_window_stamped_at_its_end() {
        assert_eq!(window_end(300, 300), 300);
        assert_eq!(window_end(301, 300), 600);
        assert_eq!(window_end(1, 300), 300);
        let points: BTreeMap<i64, Point> = [
            (301, point(0.2)),
            (450, point(0.4)),
            (600, point(0.6)),
            (601, point(0.8)),
        ]
        .into();
        let w = windows(&points, 300);
        assert_eq!(w.len(), 2);
        let (end, s) = &w[0];
        assert_eq!(*end, 600);
        assert_eq!((s.levels["cpu"], s.level), (0.4, 0.4));
        assert!((s.cpu_usage.unwrap() - 40.0).abs() < 1e-9);
        assert!(s.backfilled && s.ready);
        assert_eq!((w[1].0, w[1].1.level), (900, 0.8));
    }

    #[test]
    fn a_window_joins_the_first_stored_sample_in_it_and_never_replaces_a_measured_one() {
        let stored: std::collections::BTreeSet<i64> = [290, 310, 590].into();
        assert_eq!(target(&stored, 600, 300), Some(310));
        assert_eq!(target(&stored, 300, 300), Some(290));
        assert_eq!(target(&stored, 900, 300), None);
        let measured = ClusterSample {
            level: 0.5,
            ..Default::default()
        };
        let mut s = FleetSample {
            time: Time::from_unix_seconds(310).unwrap(),
            clusters: [("a".to_string(), measured.clone())].into(),
        };
        let (_, late) = windows(&[(400, point(0.9))].into(), 300).remove(0);
        assert!(!merge_into(&mut s, "a", &late), "measured wins");
        assert_eq!(s.clusters["a"], measured);
        assert!(merge_into(&mut s, "b", &late));
        assert!(
            !merge_into(&mut s, "b", &late),
            "the same again changes nothing"
        );
        let (_, later) = windows(&[(400, point(0.1))].into(), 300).remove(0);
        assert!(
            merge_into(&mut s, "b", &later),
            "a backfilled one is replaced"
        );
        assert_eq!(s.clusters["b"].level, 0.1);
    }
}
