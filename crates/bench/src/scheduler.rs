//! Scheduler benchmarks: the engine's decisions per second over synthetic fleets, the
//! scheduling controller over a real store, and the trace-driven quality simulation
//! (`quality.rs`).

use std::time::Instant;

use orrery_api::binding::TargetCluster;
use orrery_api::cluster::{ResourceList, Taint, TaintEffect};
use orrery_api::policy::Placement;
use orrery_api::{Format, Quantity, Time};
use orrery_scheduler::{
    ClusterSnapshot, Config, FilterCache, Fleet, Mode, Task, demand_of, schedule_cached,
};
use serde_json::json;

use crate::stats::{emit, median, percentile, progress, round};

/// A small deterministic generator (PCG-style LCG), so a seed gives the same fleet and trace.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407))
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 11
    }
    /// Uniform in [0, n).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 42) as f64
    }
}

pub const REGIONS: [&str; 6] = [
    "us-east",
    "us-west",
    "eu-west",
    "eu-central",
    "ap-south",
    "ap-east",
];
pub const PROVIDERS: [&str; 3] = ["aws", "gcp", "azure"];

pub fn cores(n: i64) -> Quantity {
    Quantity::from_int(n, Format::DecimalSI)
}

pub fn millis(n: i64) -> Quantity {
    Quantity::from_milli(n)
}

pub fn gib(n: i64) -> Quantity {
    Quantity::from_int(n << 30, Format::BinarySI)
}

pub fn mib(n: i64) -> Quantity {
    Quantity::from_int(n << 20, Format::BinarySI)
}

/// One cluster of the synthetic fleet: `nodes` nodes of `node_cpu` cores (4 GiB per core).
pub fn synthetic_cluster(i: usize, rng: &mut Rng) -> ClusterSnapshot {
    let nodes = [4, 8, 16, 32, 64][rng.below(5) as usize];
    let node_cpu = [16, 32, 64][rng.below(3) as usize];
    let load = 0.1 + 0.5 * rng.unit();
    let cpu = nodes * node_cpu;
    let mut c = ClusterSnapshot {
        name: format!("c{i:05}"),
        region: REGIONS[i % REGIONS.len()].into(),
        provider: PROVIDERS[i % PROVIDERS.len()].into(),
        zones: vec![format!("{}-{}", REGIONS[i % REGIONS.len()], 1 + i % 3)],
        ready: true,
        ..Default::default()
    };
    c.labels.insert(
        "env".into(),
        ["prod", "prod", "staging", "edge"][i % 4].into(),
    );
    c.labels.insert("tier".into(), format!("t{}", i % 5));
    c.allocatable = [
        ("cpu".to_string(), cores(cpu)),
        ("memory".to_string(), gib(cpu * 4)),
        ("pods".to_string(), cores(nodes * 110)),
    ]
    .into();
    c.usage = [
        (
            "cpu".to_string(),
            millis((cpu as f64 * 1000.0 * load) as i64),
        ),
        (
            "memory".to_string(),
            mib((cpu as f64 * 4096.0 * load) as i64),
        ),
    ]
    .into();
    c.largest_node_free = [
        (
            "cpu".to_string(),
            millis((node_cpu as f64 * 1000.0 * (1.0 - load)) as i64),
        ),
        (
            "memory".to_string(),
            mib((node_cpu as f64 * 4096.0 * (1.0 - load)) as i64),
        ),
    ]
    .into();
    if i % 50 == 7 {
        c.taints.push(Taint::new(
            "maintenance",
            TaintEffect::NoSchedule,
            Time::from_unix_seconds(0).unwrap_or(Time::now()),
        ));
    }
    c
}

/// The placements of the throughput mix: every division mode, affinities, spreads.
fn placements() -> Vec<(&'static str, Placement)> {
    let p = |v: serde_json::Value| -> Placement {
        // A fixed literal of this file; a parse failure is a bug in the benchmark itself.
        serde_json::from_value(v).unwrap_or_default()
    };
    vec![
        (
            "water-level, all clusters",
            p(json!({"replicaScheduling": {"replicaSchedulingType": "Divided"}})),
        ),
        (
            "water-level, two regions",
            p(
                json!({"clusterAffinity": {"fieldSelector": {"matchExpressions": [
                {"key": "region", "operator": "In", "values": ["us-east", "eu-west"]}]}},
                "replicaScheduling": {"replicaSchedulingType": "Divided"}}),
            ),
        ),
        (
            "duplicated, three names",
            p(json!({"clusterAffinity": {"clusterNames": ["c00001", "c00002", "c00003"]}})),
        ),
        (
            "static weights by label",
            p(
                json!({"clusterAffinity": {"labelSelector": {"matchLabels": {"env": "prod"}}},
                "replicaScheduling": {"replicaSchedulingType": "Divided", "replicaDivisionPreference": "Weighted",
                "weightPreference": {"staticWeightList": [
                    {"targetCluster": {"labelSelector": {"matchLabels": {"tier": "t0"}}}, "weight": 2},
                    {"targetCluster": {"labelSelector": {"matchLabels": {"tier": "t2"}}}, "weight": 1}]}}}),
            ),
        ),
        (
            "available replicas, spread over regions",
            p(
                json!({"spreadConstraints": [{"spreadByField": "region", "minGroups": 2, "maxGroups": 3}],
                "replicaScheduling": {"replicaSchedulingType": "Divided", "replicaDivisionPreference": "Weighted",
                "weightPreference": {"dynamicWeight": "AvailableReplicas"}}}),
            ),
        ),
        (
            "water-level, prod, at most 5 clusters",
            p(
                json!({"clusterAffinity": {"labelSelector": {"matchLabels": {"env": "prod"}}},
                "spreadConstraints": [{"spreadByField": "cluster", "maxGroups": 5}],
                "replicaScheduling": {"replicaSchedulingType": "Divided"}}),
            ),
        ),
        (
            "aggregated",
            p(
                json!({"replicaScheduling": {"replicaSchedulingType": "Divided", "replicaDivisionPreference": "Aggregated"}}),
            ),
        ),
        (
            "one cluster, the best",
            p(json!({"spreadConstraints": [{"spreadByField": "cluster", "maxGroups": 1}]})),
        ),
    ]
}

struct Spec {
    seed: u64,
    placement: usize,
    replicas: i64,
    request: ResourceList,
}

fn tasks(n: usize, rng: &mut Rng, kinds: usize) -> Vec<Spec> {
    (0..n)
        .map(|i| Spec {
            seed: rng.next_u64(),
            placement: i % kinds,
            replicas: 1 + rng.below(10) as i64,
            request: [
                ("cpu".to_string(), millis(100 * (1 + rng.below(20) as i64))),
                ("memory".to_string(), mib(128 * (1 + rng.below(32) as i64))),
            ]
            .into(),
        })
        .collect()
}

/// Schedules `specs` one after the other on `fleet`, counting each decision against it
/// (the assume step). Returns per-decision latencies in microseconds and the wall time.
fn run_engine(
    fleet: &mut Fleet,
    specs: &[Spec],
    placements: &[(&'static str, Placement)],
    config: &Config,
    now: i64,
) -> (Vec<f64>, f64, usize) {
    let mut lat = Vec::with_capacity(specs.len());
    // Bindings come and go: at most this many are live, older ones are deleted and give
    // their resources back, so the fleet stays in a steady state rather than filling up.
    let window = fleet.len() * 10;
    let mut live: std::collections::VecDeque<(Vec<TargetCluster>, orrery_scheduler::Vector)> =
        std::collections::VecDeque::new();
    let mut placed = 0usize;
    let mut cache = FilterCache::new();
    let started = Instant::now();
    for s in specs {
        let t0 = Instant::now();
        let task = Task {
            api_version: "apps/v1",
            kind: "Deployment",
            replicas: s.replicas,
            divisible: true,
            request: &s.request,
            placement: &placements[s.placement].1,
            targets: &[],
            priority: 0,
            previous: &[],
            evicted: &[],
            shed: &[],
            shed_ahead: &[],
            mode: Mode::Steady,
            now,
            seed: s.seed,
            relations: Default::default(),
            components: &[],
            quota_room: &[],
        };
        let d = schedule_cached(fleet, &task, config, &mut cache);
        placed += usize::from(d.error.is_none());
        let demand = demand_of(&s.request);
        for t in &d.clusters {
            fleet.add_assumed(&t.name, &demand, t.replicas);
        }
        live.push_back((d.clusters, demand));
        if live.len() > window
            && let Some((gone, demand)) = live.pop_front()
        {
            for t in &gone {
                fleet.add_assumed(&t.name, &demand, -t.replicas);
            }
        }
        lat.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    (lat, started.elapsed().as_secs_f64(), placed)
}

pub struct EngineArgs {
    pub clusters: Vec<usize>,
    pub bindings: usize,
    pub runs: usize,
    pub threads: usize,
    pub forecasts: bool,
}

/// When the synthetic forecasts were made (and the decisions are made).
const FORECAST_TIME: i64 = 1_800_000_000;

/// Every cluster a forecast of its cpu and memory over 6 hours in 5-minute steps, made now
/// from a day of history: a rise of up to a fifth of its capacity, at a phase of its own.
fn with_forecasts(fleet: &mut Fleet, clusters: &[ClusterSnapshot]) {
    use orrery_api::history::series::{ClusterForecast, ForecastPoint, SeriesForecast};
    for (i, c) in clusters.iter().enumerate() {
        let phase = i as f64 * 0.7;
        let points: Vec<ForecastPoint> = (1..=72)
            .map(|k| {
                let mean = 0.4 + 0.2 * ((k as f64 / 72.0) * std::f64::consts::PI + phase).sin();
                ForecastPoint {
                    mean,
                    lower80: mean - 0.03,
                    upper80: mean + 0.03,
                    lower95: mean - 0.05,
                    upper95: mean + 0.05,
                }
            })
            .collect();
        let series = SeriesForecast {
            model: "mstl-ets".into(),
            backtest_mase: Some(0.6),
            points,
            last: Some(0.4 + 0.2 * phase.sin()),
            season_peak: None,
            choice: None,
        };
        let f = ClusterForecast {
            cluster: c.name.clone(),
            time: Time::from_unix_seconds(FORECAST_TIME).unwrap_or(Time::now()),
            step_seconds: 300,
            season_seconds: 86_400,
            history: 288,
            series: [
                ("cpu".to_string(), series.clone()),
                ("memory".to_string(), series),
            ]
            .into(),
        };
        fleet.set_outlook(
            &c.name,
            orrery_scheduler::Outlook::of(&f).map(std::sync::Arc::new),
        );
    }
}

/// Decisions per second of the engine alone, per fleet size.
pub fn engine(args: EngineArgs) -> anyhow::Result<()> {
    let placements = placements();
    let config = Config::default();
    for &n in &args.clusters {
        let mut rates = Vec::new();
        let mut p50s = Vec::new();
        let mut p99s = Vec::new();
        let mut parallel = Vec::new();
        let mut scheduled = 0;
        for run in 0..args.runs {
            let mut rng = Rng::new(42 + run as u64);
            let clusters: Vec<ClusterSnapshot> =
                (0..n).map(|i| synthetic_cluster(i, &mut rng)).collect();
            let specs = tasks(args.bindings, &mut rng, placements.len());
            let mut fleet = Fleet::new(clusters.clone());
            if args.forecasts {
                with_forecasts(&mut fleet, &clusters);
            }
            let (lat, secs, placed) =
                run_engine(&mut fleet, &specs, &placements, &config, FORECAST_TIME);
            scheduled = placed;
            rates.push(specs.len() as f64 / secs);
            p50s.push(percentile(&lat, 50.0));
            p99s.push(percentile(&lat, 99.0));
            progress(format!(
                "{n} clusters, run {}: {:.0} decisions/s, p99 {:.1} us",
                run + 1,
                specs.len() as f64 / secs,
                percentile(&lat, 99.0)
            ));
            // The same work split over threads, each deciding its share on its own copy of
            // the fleet: what the engine could give if decisions were made in parallel. The
            // controller decides one binding at a time and puts the rest of the work (encoding,
            // store writes, history) on the other cores; `scheduler-service` measures that.
            if args.threads > 1 {
                let started = Instant::now();
                std::thread::scope(|scope| {
                    for chunk in specs.chunks(specs.len().div_ceil(args.threads)) {
                        let placements = &placements;
                        let config = &config;
                        let clusters = clusters.clone();
                        let forecasts = args.forecasts;
                        scope.spawn(move || {
                            let mut f = Fleet::new(clusters.clone());
                            if forecasts {
                                with_forecasts(&mut f, &clusters);
                            }
                            run_engine(&mut f, chunk, placements, config, FORECAST_TIME)
                        });
                    }
                });
                parallel.push(specs.len() as f64 / started.elapsed().as_secs_f64());
            }
        }
        emit(json!({
            "scenario": "scheduler-engine",
            "clusters": n,
            "bindings": args.bindings,
            "runs": args.runs,
            "placements": placements.iter().map(|p| p.0).collect::<Vec<_>>(),
            "scheduled": scheduled,
            "decisions_per_second_median": round(median(&rates), 0),
            "decisions_per_second_runs": rates.iter().map(|r| round(*r, 0)).collect::<Vec<_>>(),
            "p50_us_median": round(median(&p50s), 1),
            "p99_us_median": round(median(&p99s), 1),
            "threads": args.threads,
            "forecasts": args.forecasts,
            "parallel_decisions_per_second_median": if parallel.is_empty() { json!(null) } else { json!(round(median(&parallel), 0)) },
        }));
    }
    Ok(())
}

pub struct ServiceArgs {
    pub clusters: Vec<usize>,
    pub bindings: usize,
    pub latency_bindings: usize,
    pub latency_rate: u64,
    pub runs: usize,
    pub dir: Option<std::path::PathBuf>,
}

/// The scheduling controller over a real SQLite store: bindings already stored, the
/// controller started, time until every binding carries its decision (store writes, the
/// schedule history and Events included), and the cores the process used meanwhile. Then,
/// once the controller is idle again, single bindings arrive at a steady rate: the latency
/// from each one's creation to its decision in the store.
pub async fn service(args: ServiceArgs) -> anyhow::Result<()> {
    use orrery_api::keys;
    let placements = placements();
    let binding_key = |name: &str| {
        keys::object(
            "multicluster.io",
            "resourcebindings",
            Some("bench"),
            &format!("{name}-deployment"),
        )
    };
    for &n in &args.clusters {
        let mut rates = Vec::new();
        let mut firsts = Vec::new();
        let mut cores = Vec::new();
        let mut p50s = Vec::new();
        let mut p99s = Vec::new();
        for run in 0..args.runs {
            let (_tmp, store) = crate::inproc::store(&args.dir)?;
            let mut rng = Rng::new(7 + run as u64);
            progress(format!("{n} clusters: storing clusters"));
            for i in 0..n {
                let c = synthetic_cluster(i, &mut rng);
                store
                    .create(&keys::well_known::cluster(&c.name), cluster_object(&c))
                    .await?;
            }
            progress(format!("{n} clusters: storing {} bindings", args.bindings));
            let specs = tasks(args.bindings, &mut rng, placements.len());
            let mut pending = Vec::new();
            for (i, s) in specs.iter().enumerate() {
                let key = binding_key(&format!("w{i:06}"));
                let obj = binding_object(&format!("w{i:06}"), i, s, &placements[s.placement].1);
                let st = store.clone();
                pending.push(async move { st.create(&key, obj).await.map(|_| ()) });
                if pending.len() == 512 {
                    for r in futures_util::future::join_all(std::mem::take(&mut pending)).await {
                        r?;
                    }
                }
            }
            for r in futures_util::future::join_all(pending).await {
                r?;
            }
            let from = store.current_revision().await?;
            let mut watch = store
                .watch(
                    &orrery_api::kinds::RESOURCE_BINDING.prefix(None),
                    from,
                    Default::default(),
                )
                .await?;
            let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
            let cpu_before = crate::stats::process_usage(std::process::id()).2;
            let started = Instant::now();
            let ctl = tokio::spawn(orrery_controllers::propagation::scheduling::run(
                store.clone(),
                Default::default(),
                stop_rx,
            ));
            let mut decided = std::collections::HashSet::new();
            let mut first = None;
            let mut last_report = Instant::now();
            while decided.len() < specs.len() {
                let ev = tokio::time::timeout(std::time::Duration::from_secs(120), watch.next())
                    .await
                    .map_err(|_| {
                        anyhow::anyhow!(
                            "no decision for 120 s ({} of {})",
                            decided.len(),
                            specs.len()
                        )
                    })?;
                let Some(ev) = ev else { break };
                if let orrery_store::WatchEvent::Modified(o) = ev? {
                    let observed = o
                        .status
                        .as_ref()
                        .and_then(|s| s.get("schedulerObservedGeneration"))
                        .is_some();
                    if observed && decided.insert(o.name().to_string()) && first.is_none() {
                        first = Some(started.elapsed().as_secs_f64());
                    }
                }
                if last_report.elapsed().as_secs() >= 5 {
                    last_report = Instant::now();
                    progress(format!("{} of {} decided", decided.len(), specs.len()));
                }
            }
            let secs = started.elapsed().as_secs_f64();
            cores.push((crate::stats::process_usage(std::process::id()).2 - cpu_before) / secs);
            rates.push(decided.len() as f64 / secs);
            firsts.push(first.unwrap_or(f64::NAN));
            progress(format!(
                "{n} clusters, run {}: {:.0} bindings/s ({} in {secs:.1} s), {:.2} cores",
                run + 1,
                decided.len() as f64 / secs,
                decided.len(),
                cores.last().copied().unwrap_or(0.0),
            ));
            // The controller still takes in the events of its own last writes for a moment
            // after the bulk: the steady arrivals start once that is done.
            tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            drop(watch);
            let lat = latencies(&store, &args, &specs, &placements, |i| {
                binding_key(&format!("l{i:06}"))
            })
            .await?;
            p50s.push(percentile(&lat, 50.0));
            p99s.push(percentile(&lat, 99.0));
            progress(format!(
                "{n} clusters, run {}: decision latency p50 {:.1} ms, p99 {:.1} ms",
                run + 1,
                percentile(&lat, 50.0),
                percentile(&lat, 99.0)
            ));
            crate::inproc::finish(started, stop_tx, ctl, &store).await;
        }
        emit(json!({
            "scenario": "scheduler-service",
            "store": "sqlite",
            "clusters": n,
            "bindings": args.bindings,
            "runs": args.runs,
            "bindings_per_second_median": round(median(&rates), 0),
            "bindings_per_second_runs": rates.iter().map(|r| round(*r, 0)).collect::<Vec<_>>(),
            "first_decision_seconds_median": round(median(&firsts), 2),
            "cores_used_median": round(median(&cores), 2),
            "latency_bindings": args.latency_bindings,
            "latency_rate_per_second": args.latency_rate,
            "decision_latency_ms_p50_median": round(median(&p50s), 1),
            "decision_latency_ms_p99_median": round(median(&p99s), 1),
            "decision_latency_ms_p99_runs": p99s.iter().map(|p| round(*p, 1)).collect::<Vec<_>>(),
        }));
    }
    Ok(())
}

fn cluster_object(c: &ClusterSnapshot) -> orrery_api::Object {
    let mut o = orrery_api::Object::new("multicluster.io/v1alpha1", "Cluster").with_name(&c.name);
    o.metadata.labels = c.labels.clone();
    o.metadata.generation = Some(1);
    o.spec = Some(
        json!({"provider": c.provider, "region": c.region, "zones": c.zones,
        "taints": c.taints}),
    );
    o.status = Some(json!({
        "conditions": [{"type": "Ready", "status": "True", "reason": "Bench",
            "lastTransitionTime": Time::now().to_string()}],
        "resourceSummary": {"allocatable": c.allocatable, "allocated": c.allocated, "usage": c.usage},
        "largestNodeFree": c.largest_node_free,
        "lastHeartbeatTime": Time::now().to_string(),
    }));
    o
}

/// Creates `latency_bindings` bindings at `latency_rate` per second while the controller runs,
/// and returns each one's milliseconds from creation to its decision seen in the store.
async fn latencies(
    store: &std::sync::Arc<dyn orrery_store::Store>,
    args: &ServiceArgs,
    specs: &[Spec],
    placements: &[(&'static str, Placement)],
    key: impl Fn(usize) -> String,
) -> anyhow::Result<Vec<f64>> {
    // A watch of its own, from now: the bulk's watch may have fallen behind the Events and
    // history written after it, and would replay them first.
    let mut watch = store
        .watch(
            &orrery_api::kinds::RESOURCE_BINDING.prefix(None),
            store.current_revision().await?,
            Default::default(),
        )
        .await?;
    let sent: std::sync::Arc<parking_lot::Mutex<std::collections::HashMap<String, Instant>>> =
        Default::default();
    let total = args.latency_bindings.min(specs.len());
    let creator = {
        let store = store.clone();
        let sent = sent.clone();
        let jobs: Vec<(String, orrery_api::Object)> = (0..total)
            .map(|i| {
                let s = &specs[i];
                // Uids apart from the bulk's.
                let obj = binding_object(
                    &format!("l{i:06}"),
                    1_000_000 + i,
                    s,
                    &placements[s.placement].1,
                );
                (key(i), obj)
            })
            .collect();
        let every = std::time::Duration::from_secs_f64(1.0 / args.latency_rate.max(1) as f64);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            for (k, obj) in jobs {
                tick.tick().await;
                let name = obj.name().to_string();
                let store = store.clone();
                let sent = sent.clone();
                // Each create on its own, so a slow commit does not hold back the next arrival.
                tokio::spawn(async move {
                    let at = Instant::now();
                    if store.create(&k, obj).await.is_ok() {
                        sent.lock().insert(name, at);
                    }
                });
            }
        })
    };
    let mut lat = Vec::with_capacity(total);
    // When each decision was seen (it may be seen before the creator has noted its start).
    let mut seen: std::collections::HashMap<String, Instant> = Default::default();
    let deadline = Instant::now() + std::time::Duration::from_secs(120);
    while seen.len() < total {
        let left = deadline.saturating_duration_since(Instant::now());
        let ev = tokio::time::timeout(left, watch.next())
            .await
            .map_err(|_| anyhow::anyhow!("{} of {total} single decisions in 120 s", seen.len()))?;
        let Some(ev) = ev else { break };
        let now = Instant::now();
        if let orrery_store::WatchEvent::Modified(o) = ev? {
            let name = o.name();
            if !name.starts_with('l')
                || o.status
                    .as_ref()
                    .and_then(|s| s.get("schedulerObservedGeneration"))
                    .is_none()
                || seen.contains_key(name)
            {
                continue;
            }
            seen.insert(name.to_string(), now);
        }
    }
    let _ = creator.await;
    let sent = sent.lock();
    for (name, decided) in seen {
        if let Some(at) = sent.get(&name) {
            lat.push(decided.saturating_duration_since(*at).as_secs_f64() * 1e3);
        }
    }
    Ok(lat)
}

fn binding_object(name: &str, i: usize, s: &Spec, placement: &Placement) -> orrery_api::Object {
    let mut o = orrery_api::Object::new("multicluster.io/v1alpha1", "ResourceBinding")
        .with_name(format!("{name}-deployment"));
    o.metadata.namespace = "bench".into();
    o.metadata.generation = Some(1);
    o.metadata.uid = format!("00000000-0000-0000-0000-{i:012}");
    o.spec = Some(json!({
        "resource": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "bench",
            "name": name, "uid": format!("t-{i}")},
        "replicas": s.replicas,
        "replicaRequirements": {"resourceRequest": s.request},
        "placement": placement,
        "policy": {"apiVersion": "multicluster.io/v1alpha1", "kind": "ResourcePlacementPolicy",
            "namespace": "bench", "name": "bench"},
    }));
    o
}
