//! Round-trip times of an agent process's heartbeats and status reports, for the admin
//! endpoint (`GET /stats`) and the benchmarks.

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::time::Duration;

const KEEP: usize = 20_000;

#[derive(Debug, Default)]
struct Samples {
    heartbeats: VecDeque<f64>,
    reports: VecDeque<f64>,
    /// Status items sent since the last reset (a quiet member sends none).
    items: u64,
}

static SAMPLES: Mutex<Samples> = Mutex::new(Samples {
    heartbeats: VecDeque::new(),
    reports: VecDeque::new(),
    items: 0,
});

fn push(q: &mut VecDeque<f64>, d: Duration) {
    if q.len() == KEEP {
        q.pop_front();
    }
    q.push_back(d.as_secs_f64() * 1000.0);
}

pub fn heartbeat(d: Duration) {
    push(&mut SAMPLES.lock().heartbeats, d);
}

/// One status report of `items` Work statuses that took `d`.
pub fn report(d: Duration, items: usize) {
    let mut s = SAMPLES.lock();
    push(&mut s.reports, d);
    s.items += items as u64;
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn summary(q: &VecDeque<f64>) -> serde_json::Value {
    let mut v: Vec<f64> = q.iter().copied().collect();
    v.sort_by(f64::total_cmp);
    serde_json::json!({
        "count": v.len(),
        "p50_ms": (percentile(&v, 50.0) * 100.0).round() / 100.0,
        "p99_ms": (percentile(&v, 99.0) * 100.0).round() / 100.0,
        "max_ms": (v.last().copied().unwrap_or(0.0) * 100.0).round() / 100.0,
    })
}

/// The latest samples' percentiles; `reset` starts afresh (to measure a steady state).
pub fn snapshot(reset: bool) -> serde_json::Value {
    let mut s = SAMPLES.lock();
    let out = serde_json::json!({
        "heartbeat": summary(&s.heartbeats),
        "report": summary(&s.reports),
        "statusItems": s.items,
    });
    if reset {
        s.heartbeats.clear();
        s.reports.clear();
        s.items = 0;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        snapshot(true);
        for ms in 1..=100 {
            heartbeat(Duration::from_millis(ms));
        }
        let s = snapshot(true);
        assert_eq!(s["heartbeat"]["count"], 100);
        assert_eq!(s["heartbeat"]["p50_ms"], 51.0);
        assert_eq!(s["heartbeat"]["p99_ms"], 99.0);
        assert_eq!(snapshot(false)["heartbeat"]["count"], 0);
    }
}
