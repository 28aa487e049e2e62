//! `elastic`: a FederatedHPA reactive vs predictive over simulated days of a workload with a
//! business-day demand.
//!
//! The demand (cores) is the same every day, with persistent noise: 8 cores at night, a steep
//! ramp to about 60 at 08:00 (most of it within 5 minutes: the start of a business day), a
//! lunch bump, a ramp down around 19:00. Pods request 1 core, burst to 2, and are ready
//! `--pod-start` after they are asked for; their usage reaches the autoscaler 30 s late (a
//! metrics window and a member's report); the autoscaler aims at 70 % cpu and runs every 15 s. Both autoscalers are
//! Orrery's own code ([`orrery_controllers::autoscaling`]: the replica calculator,
//! stabilization and limits of `recommend`, and for the predictive one the controller's usage
//! series and forecast at a point per 5 minutes), driven on a simulated clock. After
//! `--history` days (the predictive one needs a season and a quarter of usage before it
//! forecasts), `--test` days are measured: minutes under-provisioned (the demand above what
//! the ready pods' requests cover) and replica-hours (every pod asked for, ready or not).

use std::collections::BTreeMap;

use orrery_api::autoscaling::federated::{FederatedHPASpec, Target};
use orrery_api::prediction::{Ahead, Bound};
use orrery_api::work::WorkloadUsage;
use orrery_controllers::autoscaling::federated::{self as fed, SEASON_POINTS, UsageSeries};
use orrery_controllers::autoscaling::recommend::{self, History};
use serde_json::json;

use crate::stats::{emit, median, progress, round};

#[derive(Debug)]
pub struct ElasticArgs {
    pub seeds: Vec<u64>,
    pub history: usize,
    pub test: usize,
    pub pod_start_seconds: i64,
    pub horizon: String,
    pub bound: String,
}

const DAY: i64 = 86_400;
const SYNC: i64 = 15;
const STEP: i64 = DAY / SEASON_POINTS as i64;
const BURST: f64 = 2.0;
/// How late the autoscaler hears of usage, in syncs.
const METRICS_LAG: usize = 2;

/// A smooth step from 0 to 1 around `at` (hours), `width` hours wide.
fn ramp(h: f64, at: f64, width: f64) -> f64 {
    1.0 / (1.0 + (-(h - at) / width).exp())
}

/// The demand at `t` seconds, cores, before noise.
fn shape(t: i64) -> f64 {
    let h = (t.rem_euclid(DAY)) as f64 / 3600.0;
    let day = ramp(h, 8.0, 0.02) * (1.0 - ramp(h, 19.0, 0.25));
    let lunch = 10.0 * (-((h - 12.5) / 0.6).powi(2)).exp();
    8.0 + 50.0 * day + lunch
}

/// Noise that lasts (an AR(1) over 5-minute windows), from a seed: a share of the demand.
struct Noise {
    state: u64,
    value: f64,
    window: i64,
}

impl Noise {
    fn new(seed: u64) -> Noise {
        // splitmix64: neighbouring seeds give unrelated streams.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Noise {
            state: (z ^ (z >> 31)) | 1,
            value: 0.0,
            window: -1,
        }
    }

    fn uniform(&mut self) -> f64 {
        // xorshift64*
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        (self.state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }

    fn at(&mut self, t: i64) -> f64 {
        let w = t / STEP;
        while self.window < w {
            self.window += 1;
            let e = (self.uniform() + self.uniform() + self.uniform() - 1.5) * 2.0 / 1.5;
            self.value = 0.8 * self.value + 0.6 * 0.06 * e;
        }
        self.value
    }
}

#[derive(Debug, Default)]
struct Outcome {
    under_minutes: f64,
    replica_hours: f64,
    peak_replicas: i32,
    scalings: usize,
}

/// One autoscaler over the days; returns what the test days measured.
fn run(
    spec: &FederatedHPASpec,
    ahead: Option<Ahead>,
    seed: u64,
    days: (usize, usize),
    pod_start: i64,
) -> Outcome {
    let target = spec.targets().remove(0);
    let mut noise = Noise::new(seed);
    let mut history = History::default();
    let mut series = UsageSeries {
        step: STEP,
        ..Default::default()
    };
    let mut in_step = 0;
    let mut peaks: Option<Result<fed::Peaks, String>> = None;
    let mut replicas = spec.min();
    // When each pod asked for is ready.
    let mut pods: Vec<i64> = vec![0; replicas as usize];
    let mut out = Outcome::default();
    let start_test = days.0 as i64 * DAY;
    let end = (days.0 + days.1) as i64 * DAY;
    let mut t = 0;
    let mut heard: std::collections::VecDeque<WorkloadUsage> = std::collections::VecDeque::new();
    while t < end {
        let demand = shape(t) * (1.0 + noise.at(t));
        let ready = pods.iter().filter(|r| **r <= t).count() as i64;
        let used = demand.min(ready as f64 * BURST);
        let usage = WorkloadUsage {
            ready_pods: ready,
            unready_pods: pods.len() as i64 - ready,
            cpu_milli: (used * 1000.0) as i64,
            cpu_request_milli: ready * 1000,
            memory_bytes: ready << 28,
            memory_request_bytes: ready << 29,
        };
        heard.push_back(usage);
        if heard.len() > METRICS_LAG + 1 {
            heard.pop_front();
        }
        let usage = heard.front().cloned().unwrap_or_default();
        let mut predicted = None;
        if let Some(a) = ahead {
            let (cores, per_pod) = fed::reading(&usage, "cpu");
            let before = series.last_step;
            series.push(
                t,
                &BTreeMap::from([("cpu".to_string(), cores)]),
                &mut in_step,
                SEASON_POINTS * 3,
            );
            if series.last_step != before {
                let horizon_points = (a.horizon_seconds as usize).div_ceil(STEP as usize);
                peaks = Some(fed::forecast_peaks(
                    &series,
                    SEASON_POINTS,
                    horizon_points,
                    a.bound,
                ));
            }
            if let (Some(Ok(p)), Some(per_pod)) = (&peaks, per_pod) {
                predicted = p
                    .get("cpu")
                    .and_then(|(peak, _)| recommend::replicas_for(&target, *peak, per_pod));
            }
        }
        let d = history.decide(spec, replicas, Some(&usage), predicted, t, 300);
        if d.desired != replicas {
            history.scaled(replicas, d.desired, t);
            if d.desired > replicas {
                pods.extend(std::iter::repeat_n(
                    t + pod_start,
                    (d.desired - replicas) as usize,
                ));
            } else {
                // The newest go first (starting ones before ready ones).
                pods.sort_unstable();
                pods.truncate(d.desired as usize);
            }
            replicas = d.desired;
            if t >= start_test {
                out.scalings += 1;
            }
        }
        if t >= start_test {
            let ready_after = pods.iter().filter(|r| **r <= t).count() as f64;
            if demand > ready_after {
                if std::env::var_os("ELASTIC_DEBUG").is_some() {
                    eprintln!(
                        "under {} t={:.3}h demand {demand:.1} ready {ready_after} replicas {replicas} predicted {predicted:?}",
                        ahead.is_some(),
                        (t % DAY) as f64 / 3600.0
                    );
                }
                out.under_minutes += SYNC as f64 / 60.0;
            }
            out.replica_hours += pods.len() as f64 * SYNC as f64 / 3600.0;
            out.peak_replicas = out.peak_replicas.max(replicas);
        }
        t += SYNC;
    }
    out
}

pub fn elastic(args: ElasticArgs) -> anyhow::Result<()> {
    let spec = FederatedHPASpec::parse(Some(&json!({
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
        "minReplicas": 2, "maxReplicas": 200,
        "metrics": [{"type": "Resource", "resource": {"name": "cpu",
            "target": {"type": "Utilization", "averageUtilization": 70}}}]
    })))
    .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let ahead = Ahead {
        horizon_seconds: orrery_api::prediction::parse_horizon(&args.horizon)
            .map_err(anyhow::Error::msg)?,
        bound: args.bound.parse::<Bound>().map_err(anyhow::Error::msg)?,
    };
    debug_assert!(matches!(spec.targets()[0], Target::Utilization { .. }));
    let mut rows = Vec::new();
    for (i, seed) in args.seeds.iter().enumerate() {
        progress(format!(
            "elastic: seed {seed} ({} of {})",
            i + 1,
            args.seeds.len()
        ));
        let days = (args.history, args.test);
        let reactive = run(&spec, None, *seed, days, args.pod_start_seconds);
        let predictive = run(&spec, Some(ahead), *seed, days, args.pod_start_seconds);
        rows.push((reactive, predictive));
    }
    let med = |f: &dyn Fn(&(Outcome, Outcome)) -> f64| -> f64 {
        let v: Vec<f64> = rows.iter().map(f).collect();
        median(&v)
    };
    let cut = |r: &(Outcome, Outcome)| {
        if r.0.under_minutes > 0.0 {
            1.0 - r.1.under_minutes / r.0.under_minutes
        } else {
            0.0
        }
    };
    let extra = |r: &(Outcome, Outcome)| r.1.replica_hours / r.0.replica_hours - 1.0;
    let under_cut = med(&cut);
    let more_hours = med(&extra);
    emit(json!({
        "scenario": "elastic",
        "seeds": args.seeds,
        "historyDays": args.history,
        "testDays": args.test,
        "podStartSeconds": args.pod_start_seconds,
        "target": "cpu 70 % of 1-core requests, min 2, max 200, sync 15 s",
        "predictive": {"horizon": args.horizon, "bound": args.bound},
        "reactive": {
            "underProvisionedMinutes": round(med(&|r| r.0.under_minutes), 2),
            "replicaHours": round(med(&|r| r.0.replica_hours), 1),
            "peakReplicas": med(&|r| f64::from(r.0.peak_replicas)),
            "scalings": med(&|r| r.0.scalings as f64),
        },
        "predictiveRun": {
            "underProvisionedMinutes": round(med(&|r| r.1.under_minutes), 2),
            "replicaHours": round(med(&|r| r.1.replica_hours), 1),
            "peakReplicas": med(&|r| f64::from(r.1.peak_replicas)),
            "scalings": med(&|r| r.1.scalings as f64),
        },
        "underProvisionedCut": round(under_cut, 3),
        "moreReplicaHours": round(more_hours, 3),
        "perSeed": rows.iter().map(|r| json!({
            "reactiveUnder": round(r.0.under_minutes, 2), "predictiveUnder": round(r.1.under_minutes, 2),
            "reactiveHours": round(r.0.replica_hours, 1), "predictiveHours": round(r.1.replica_hours, 1),
        })).collect::<Vec<_>>(),
        "goalMet": under_cut >= 0.8 && more_hours <= 0.1,
    }));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demand_ramps_in_the_morning() {
        assert!(shape(3 * 3600) < 9.0);
        assert!(shape(10 * 3600) > 55.0);
        // Most of the morning ramp within 5 minutes, nearly all of it within 10.
        let (a, b) = (
            shape(7 * 3600 + 57 * 60 + 30),
            shape(8 * 3600 + 2 * 60 + 30),
        );
        assert!(b - a > 0.75 * 50.0, "{a} {b}");
        let (a, b) = (shape(7 * 3600 + 55 * 60), shape(8 * 3600 + 5 * 60));
        assert!(b - a > 0.95 * 50.0, "{a} {b}");
    }
}
