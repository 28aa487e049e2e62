//! Storage-transmission-compute integration (data-aware scheduling): four strategies on one
//! deterministic trace, decided by the real engine over a simulated fleet and clock.
//!
//! The fleet: 12 clusters in 4 regions, GPUs of different performance (0.2 to 3 times the
//! reference), uplinks of 1 to 25 Gbit/s, egress prices of 0.01 to 0.12 per GiB. The data:
//! 20 data sets of 10 GiB to 2 TiB, each held by one cluster, read with Zipf popularity. The
//! work: jobs arriving over a day, each reading one data set, with 0.05 to 20 GPU-hours on 1
//! to 4 GPUs.
//!
//! A job placed away from its data waits for the copy: the source's uplink and the
//! destination's downlink carry one transfer at a time at the slower of the two rates (a link
//! is never booked beyond its capacity), then it computes at the cluster's GPU performance.
//! Its GPUs are taken from the decision until it ends. A job nothing can take now waits for
//! the next job to end.
//!
//! Orrery's data mover keeps what it copied as a cache in the destination's cache tier (1 TiB
//! per cluster, least recently used out first): later jobs see a cache copy as a holder, a
//! job placed where a copy is arriving waits for it, and a copy comes from the holder in the
//! destination's region first. The other strategies have no data mover: every job away from
//! its data copies it from its home. `orrery-joint-estimate-no-cache` is Orrery's scheduler
//! without the caches, to show what each part brings.

use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

use orrery_api::Quantity;
use orrery_api::binding::TargetCluster;
use orrery_api::cluster::ResourceList;
use orrery_api::data::{EGRESS_PRICE_PROPERTY, GPU_PERFORMANCE_PROPERTY, Tier};
use orrery_api::policy::Placement;
use orrery_scheduler::data::{DataNeeds, Input};
use orrery_scheduler::{ClusterSnapshot, Config, FilterCache, Fleet, Mode, Relations, Task};
use serde_json::json;

use crate::scheduler::Rng;
use crate::stats::{emit, percentile, progress, round};

pub struct StciArgs {
    pub seed: u64,
    pub jobs: usize,
}

const GIB: f64 = (1u64 << 30) as f64;
const DAY: f64 = 86_400.0;

struct Site {
    name: String,
    region: usize,
    gpus: i64,
    perf: f64,
    /// Bytes per second.
    uplink: f64,
    price: f64,
}

struct DataSet {
    name: String,
    bytes: i64,
    home: usize,
}

#[derive(Clone)]
struct Job {
    arrival: f64,
    dataset: usize,
    gpu_hours: f64,
    gpus: i64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Strategy {
    WaterLevel,
    ToTheData,
    AvailableReplicas,
    OrreryNoCache,
    Orrery,
}

/// Each cluster's cache tier for Orrery's copies.
const CACHE_BYTES: f64 = 1024.0 * GIB;

/// A cache copy: the data set, when it is in, and when a job last read it.
#[derive(Clone, Copy, Debug)]
struct CacheCopy {
    dataset: usize,
    ready: f64,
    used: f64,
}

impl Strategy {
    fn name(self) -> &'static str {
        match self {
            Strategy::WaterLevel => "water-level-only",
            Strategy::ToTheData => "always-to-the-data",
            Strategy::AvailableReplicas => "karmada-available-replicas",
            Strategy::OrreryNoCache => "orrery-joint-estimate-no-cache",
            Strategy::Orrery => "orrery-joint-estimate",
        }
    }
}

fn fleet(rng: &mut Rng) -> Vec<Site> {
    let perfs = [0.2, 0.4, 1.0, 3.0];
    let gbits = [1.0, 5.0, 10.0, 25.0];
    (0..12)
        .map(|i| Site {
            name: format!("c{i:02}"),
            region: i / 3,
            gpus: [8, 16, 32][rng.below(3) as usize],
            perf: perfs[(i + rng.below(2) as usize) % 4],
            uplink: gbits[rng.below(4) as usize] * 125_000_000.0,
            price: [0.01, 0.02, 0.05, 0.09, 0.12][rng.below(5) as usize],
        })
        .collect()
}

fn latency_ms(a: &Site, b: &Site) -> f64 {
    if a.name == b.name {
        0.0
    } else if a.region == b.region {
        2.0
    } else {
        60.0 + 30.0 * (a.region as f64 - b.region as f64).abs()
    }
}

fn datasets(rng: &mut Rng, sites: usize) -> Vec<DataSet> {
    // Log-uniform from 10 GiB to 2 TiB.
    (0..20)
        .map(|i| DataSet {
            name: format!("ds{i:02}"),
            bytes: (10.0 * GIB * (204.8f64).powf(rng.unit())) as i64,
            home: rng.below(sites as u64) as usize,
        })
        .collect()
}

fn zipf(rng: &mut Rng, n: usize, s: f64) -> usize {
    let weights: Vec<f64> = (1..=n).map(|k| 1.0 / (k as f64).powf(s)).collect();
    let total: f64 = weights.iter().sum();
    let mut x = rng.unit() * total;
    for (i, w) in weights.iter().enumerate() {
        if x < *w {
            return i;
        }
        x -= w;
    }
    n - 1
}

fn trace(rng: &mut Rng, jobs: usize) -> Vec<Job> {
    let mut out: Vec<Job> = (0..jobs)
        .map(|_| Job {
            arrival: rng.unit() * DAY,
            dataset: zipf(rng, 20, 1.1),
            // Log-uniform from 0.05 to 20 GPU-hours.
            gpu_hours: 0.05 * (400f64).powf(rng.unit()),
            gpus: 1 + rng.below(4) as i64,
        })
        .collect();
    out.sort_by(|a, b| a.arrival.total_cmp(&b.arrival));
    out
}

fn q(n: i64) -> Quantity {
    Quantity::from_int(n, orrery_api::Format::DecimalSI)
}

/// What the engine sees of the fleet now: GPUs taken by running jobs, transfers booked on
/// each link, and the facts.
fn snapshots(sites: &[Site], busy: &[i64], links: &[(f64, f64)]) -> Vec<ClusterSnapshot> {
    sites
        .iter()
        .zip(busy)
        .zip(links)
        .map(|((s, b), (out, into))| {
            let mut c = ClusterSnapshot {
                name: s.name.clone(),
                region: format!("r{}", s.region),
                ready: true,
                bandwidth: Some(s.uplink as i64),
                busy_out_seconds: *out,
                busy_in_seconds: *into,
                ..Default::default()
            };
            c.allocatable = [
                ("cpu".to_string(), q(s.gpus * 8)),
                ("nvidia.com/gpu".to_string(), q(s.gpus)),
            ]
            .into();
            c.allocated = [
                ("cpu".to_string(), q(*b)),
                ("nvidia.com/gpu".to_string(), q(*b)),
            ]
            .into();
            c.properties
                .insert(GPU_PERFORMANCE_PROPERTY.into(), s.perf.to_string());
            c.properties
                .insert(EGRESS_PRICE_PROPERTY.into(), s.price.to_string());
            c.latency_ms = sites
                .iter()
                .map(|o| (o.name.clone(), latency_ms(s, o)))
                .collect();
            c
        })
        .collect()
}

fn placement(strategy: Strategy, home: &str) -> Placement {
    let mut p = json!({
        "replicaScheduling": {"replicaSchedulingType": "Divided"},
        // A job runs whole in one cluster.
        "spreadConstraints": [{"spreadByField": "cluster", "maxGroups": 1, "minGroups": 1}],
    });
    match strategy {
        Strategy::ToTheData => p["clusterAffinity"] = json!({"clusterNames": [home]}),
        // Karmada's choice for work that runs whole in one cluster: the cluster where the
        // most replicas are available (Aggregated division, roomiest by requests first).
        Strategy::AvailableReplicas => {
            p["replicaScheduling"]["replicaDivisionPreference"] = json!("Aggregated");
        }
        Strategy::WaterLevel | Strategy::Orrery | Strategy::OrreryNoCache => {}
    }
    serde_json::from_value(p).unwrap_or_default()
}

struct Outcome {
    completion: Vec<f64>,
    bytes: f64,
    egress: f64,
    gpu_seconds: f64,
    makespan: f64,
    decisions: u64,
    decide_secs: f64,
}

fn run(strategy: Strategy, sites: &[Site], data: &[DataSet], jobs: &[Job]) -> Outcome {
    let config = Config::default();
    let mut cache = FilterCache::new();
    let mut busy = vec![0i64; sites.len()];
    let mut up_free = vec![0.0f64; sites.len()];
    let mut down_free = vec![0.0f64; sites.len()];
    // Running jobs: (end, cluster, gpus).
    let mut running: Vec<(f64, usize, i64)> = Vec::new();
    let mut waiting: VecDeque<usize> = VecDeque::new();
    let caching = strategy == Strategy::Orrery;
    let mut copies: Vec<Vec<CacheCopy>> = vec![Vec::new(); sites.len()];
    let mut out = Outcome {
        completion: Vec::new(),
        bytes: 0.0,
        egress: 0.0,
        gpu_seconds: 0.0,
        makespan: 0.0,
        decisions: 0,
        decide_secs: 0.0,
    };
    let request: ResourceList = [
        ("cpu".to_string(), q(1)),
        ("nvidia.com/gpu".to_string(), q(1)),
    ]
    .into();
    let mut next = 0;
    let mut now: f64;
    loop {
        // The next event: an arrival or the end of a running job.
        let arrival = jobs.get(next).map(|j| j.arrival);
        let ending = running.iter().map(|r| r.0).min_by(|a, b| a.total_cmp(b));
        now = match (arrival, ending) {
            (Some(a), Some(e)) => a.min(e),
            (Some(a), None) => a,
            (None, Some(e)) => e,
            (None, None) => break,
        };
        let mut freed = false;
        running.retain(|(end, c, g)| {
            if *end <= now {
                busy[*c] -= g;
                freed = true;
                false
            } else {
                true
            }
        });
        if arrival == Some(now) {
            waiting.push_back(next);
            next += 1;
        } else if !freed {
            continue;
        }
        // Every waiting job is tried, in order of arrival.
        let mut still = VecDeque::new();
        while let Some(j) = waiting.pop_front() {
            let job = &jobs[j];
            let ds = &data[job.dataset];
            let home = &sites[ds.home].name;
            let p = placement(strategy, home);
            // The home and every cache copy that is in.
            let holders = holders(sites, &copies, home, job.dataset, now);
            let needs = DataNeeds {
                inputs: vec![Input {
                    name: ds.name.clone(),
                    bytes: ds.bytes,
                    holders,
                }],
                gpu_hours: job.gpu_hours,
                ..Default::default()
            };
            let links: Vec<(f64, f64)> = (0..sites.len())
                .map(|i| ((up_free[i] - now).max(0.0), (down_free[i] - now).max(0.0)))
                .collect();
            let fleet = Fleet::new(snapshots(sites, &busy, &links));
            let task = Task {
                api_version: "batch/v1",
                kind: "Job",
                replicas: job.gpus,
                divisible: true,
                request: &request,
                placement: &p,
                targets: &[],
                priority: 0,
                previous: &[] as &[TargetCluster],
                evicted: &[],
                shed: &[],
                shed_ahead: &[],
                mode: Mode::Steady,
                now: 0,
                seed: j as u64,
                relations: Relations {
                    data: matches!(strategy, Strategy::Orrery | Strategy::OrreryNoCache)
                        .then_some(&needs),
                    ..Default::default()
                },
                components: &[],
                quota_room: &[],
            };
            let started = Instant::now();
            let d = orrery_scheduler::schedule_cached(&fleet, &task, &config, &mut cache);
            out.decide_secs += started.elapsed().as_secs_f64();
            out.decisions += 1;
            let placed: i64 = d.clusters.iter().map(|c| c.replicas).sum();
            let Some(target) = d.clusters.first().filter(|_| placed == job.gpus) else {
                still.push_back(j);
                continue;
            };
            let Some(c) = sites.iter().position(|s| s.name == target.name) else {
                still.push_back(j);
                continue;
            };
            let mut ready = now;
            let cached = copies[c].iter_mut().find(|x| x.dataset == job.dataset);
            if let Some(x) = cached {
                // In, or arriving: the job waits for it.
                ready = now.max(x.ready);
                x.used = now;
            } else if c != ds.home {
                // From a copy in the destination's region first, then over the fastest link.
                let src = if caching {
                    nearest_source(sites, &copies, ds, job.dataset, c, now)
                } else {
                    ds.home
                };
                let start = now.max(up_free[src]).max(down_free[c]);
                let rate = sites[src].uplink.min(sites[c].uplink);
                let secs = latency_ms(&sites[src], &sites[c]) / 1000.0 + ds.bytes as f64 / rate;
                up_free[src] = start + secs;
                down_free[c] = start + secs;
                ready = start + secs;
                out.bytes += ds.bytes as f64;
                out.egress += ds.bytes as f64 / GIB * sites[src].price;
                if caching {
                    keep_copy(&mut copies[c], data, job.dataset, ready, now);
                }
            }
            let compute = job.gpu_hours * 3600.0 / (sites[c].perf * job.gpus as f64);
            let end = ready + compute;
            busy[c] += job.gpus;
            running.push((end, c, job.gpus));
            out.gpu_seconds += compute * job.gpus as f64;
            out.completion.push(end - job.arrival);
            out.makespan = out.makespan.max(end);
        }
        waiting = still;
    }
    out
}

/// Where a job's data set is in at `now`: its home, and every site with a copy that is in.
fn holders(
    sites: &[Site],
    copies: &[Vec<CacheCopy>],
    home: &str,
    dataset: usize,
    now: f64,
) -> Vec<(String, Tier)> {
    let mut holders = vec![(home.to_string(), Tier::Warm)];
    for (i, cs) in copies.iter().enumerate() {
        if cs.iter().any(|x| x.dataset == dataset && x.ready <= now) {
            holders.push((sites[i].name.clone(), Tier::Warm));
        }
    }
    holders
}

/// Where a copy for site `c` comes from: a copy in the destination's region first (or the
/// home), then over the fastest link.
fn nearest_source(
    sites: &[Site],
    copies: &[Vec<CacheCopy>],
    ds: &DataSet,
    dataset: usize,
    c: usize,
    now: f64,
) -> usize {
    (0..sites.len())
        .filter(|i| {
            *i == ds.home
                || copies[*i]
                    .iter()
                    .any(|x| x.dataset == dataset && x.ready <= now)
        })
        .min_by(|a, b| {
            let key = |i: usize| {
                (
                    sites[i].region != sites[c].region,
                    -(sites[i].uplink.min(sites[c].uplink)),
                )
            };
            let (ka, kb) = (key(*a), key(*b));
            ka.0.cmp(&kb.0).then(ka.1.total_cmp(&kb.1))
        })
        .unwrap_or(ds.home)
}

/// Keeps a copy of `dataset` at a site (in at `ready`); beyond the cache tier, the least
/// recently used copies that are in go.
fn keep_copy(cs: &mut Vec<CacheCopy>, data: &[DataSet], dataset: usize, ready: f64, now: f64) {
    cs.push(CacheCopy {
        dataset,
        ready,
        used: now,
    });
    let size = |x: &CacheCopy| data[x.dataset].bytes as f64;
    while cs.iter().map(size).sum::<f64>() > CACHE_BYTES {
        let Some(oldest) = cs
            .iter()
            .enumerate()
            .filter(|(_, x)| x.ready <= now && x.dataset != dataset)
            .min_by(|a, b| a.1.used.total_cmp(&b.1.used))
            .map(|(i, _)| i)
        else {
            break;
        };
        cs.remove(oldest);
    }
}

pub fn stci(args: StciArgs) -> anyhow::Result<()> {
    let mut rng = Rng::new(args.seed);
    let sites = fleet(&mut rng);
    let data = datasets(&mut rng, sites.len());
    let jobs = trace(&mut rng, args.jobs);
    let total_gpus: i64 = sites.iter().map(|s| s.gpus).sum();
    let mut rows = BTreeMap::new();
    for strategy in [
        Strategy::WaterLevel,
        Strategy::ToTheData,
        Strategy::AvailableReplicas,
        Strategy::OrreryNoCache,
        Strategy::Orrery,
    ] {
        progress(format!(
            "stci: {} over {} jobs",
            strategy.name(),
            jobs.len()
        ));
        let o = run(strategy, &sites, &data, &jobs);
        let mean = o.completion.iter().sum::<f64>() / o.completion.len().max(1) as f64;
        rows.insert(
            strategy.name(),
            json!({
                "jobs_done": o.completion.len(),
                "mean_completion_hours": round(mean / 3600.0, 2),
                "p95_completion_hours": round(percentile(&o.completion, 95.0) / 3600.0, 2),
                "bytes_moved_tib": round(o.bytes / GIB / 1024.0, 2),
                "egress_cost": round(o.egress, 0),
                "gpu_utilization": round(o.gpu_seconds / (total_gpus as f64 * o.makespan.max(1.0)), 3),
                "decisions_per_second": round(o.decisions as f64 / o.decide_secs.max(1e-9), 0),
                "mean": mean,
                "bytes": o.bytes,
            }),
        );
    }
    let orrery = &rows["orrery-joint-estimate"];
    let best_other = rows
        .iter()
        .filter(|(k, _)| !k.starts_with("orrery-"))
        .map(|(_, v)| v["mean"].as_f64().unwrap_or(f64::MAX))
        .fold(f64::MAX, f64::min);
    let water_bytes = rows["water-level-only"]["bytes"].as_f64().unwrap_or(0.0);
    let mean = orrery["mean"].as_f64().unwrap_or(0.0);
    let bytes = orrery["bytes"].as_f64().unwrap_or(0.0);
    let mut strategies = serde_json::Map::new();
    for (k, mut v) in rows.clone() {
        if let Some(m) = v.as_object_mut() {
            m.remove("mean");
            m.remove("bytes");
        }
        strategies.insert(k.to_string(), v);
    }
    emit(json!({
        "scenario": "stci",
        "seed": args.seed,
        "clusters": sites.len(),
        "datasets": data.len(),
        "jobs": jobs.len(),
        "strategies": strategies,
        "orrery_mean_vs_best_other": round(mean / best_other, 3),
        "orrery_bytes_vs_water_level": if water_bytes > 0.0 { json!(round(bytes / water_bytes, 3)) } else { json!(null) },
    }));
    Ok(())
}
