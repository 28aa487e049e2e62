//! The monitoring system's time series (draft 5.1): the fleet's figures (water levels per
//! dimension, reported usage, pods, traffic, readiness) sampled at a fixed interval into the
//! store, kept raw for hours and as 5-minute averages for weeks. `GET /api/v1/monitor/history`
//! reads them (and the browser view's charts).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use std::collections::HashMap;

use orrery_api::binding::BindingSpec;
use orrery_api::cluster::ClusterStatus;
use orrery_api::history::series::{self, ClusterSample, FleetSample};
use orrery_api::{Object, Time, keys};
use orrery_scheduler::Vector;
use orrery_store::{ListOptions, Store, StoreError};
use tokio::sync::{mpsc, watch};

use crate::runtime::controller::{Action, Controller, Keys, Origin, Reconciler, Source};
use crate::runtime::metrics::Handle;
use crate::runtime::reflector::Event;

mod backfill;

/// How often and for how long.
#[derive(Clone, Debug)]
pub struct MonitoringConfig {
    /// Between raw samples.
    pub interval: Duration,
    /// Raw samples older than this go.
    pub raw_retention: Duration,
    /// 5-minute averages older than this go.
    pub average_retention: Duration,
    /// At most this many bytes of raw samples are kept in the store (the oldest go first),
    /// whatever their retention: a sample holds every member (about 115 bytes each, 1.2 MB at
    /// 10,000 members), and six hours of them would be most of etcd's default 2 GiB quota.
    pub raw_budget: u64,
    /// The same for the averages.
    pub average_budget: u64,
    /// Between averages (5 minutes; the API calls their resolution `5m`), and between
    /// prunings.
    pub average_every: Duration,
    /// Where the fleet's cost is exported (`None`: not on `/metrics`).
    pub cost_metrics: Option<Arc<CostMetrics>>,
}

impl Default for MonitoringConfig {
    fn default() -> Self {
        MonitoringConfig {
            interval: Duration::from_secs(15),
            raw_retention: Duration::from_secs(6 * 3600),
            average_retention: Duration::from_secs(
                orrery_api::history::backfill::RETENTION_SECONDS as u64,
            ),
            raw_budget: 128 << 20,
            average_budget: 384 << 20,
            average_every: Duration::from_secs(300),
            cost_metrics: None,
        }
    }
}

/// The dimensions whose levels are forecast, as [`orrery_scheduler::DIMENSIONS`] names them.
const FORECAST_DIMENSIONS: [(usize, &str); 4] =
    [(0, "cpu"), (1, "memory"), (2, "gpu"), (3, "pods")];

/// A hash of what a binding's placement is read from (its clusters, the request of one
/// replica and its resource), without parsing it.
fn placement_print(b: &Object) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    if let Some(spec) = &b.spec {
        for field in ["clusters", "replicaRequirements", "resource"] {
            spec.get(field).map(|v| v.to_string()).hash(&mut h);
        }
    }
    h.finish()
}

/// What one binding places: per cluster, the requests of its replicas there.
type Parts = Vec<(String, Vector)>;

/// Where the monitoring loop hands its samples to be forecast, and where it finds what the
/// forecasts said of them.
pub type ToForecaster = (
    mpsc::Sender<crate::forecasting::Feed>,
    Arc<crate::forecasting::Checks>,
);

/// What Orrery itself placed in each cluster: the requests of the replicas its bindings give
/// it (one pod each), in base units per water level dimension.
#[derive(Debug, Default)]
pub struct Placed {
    /// Each binding's placement fingerprint ([`placement_print`]) and what it places where.
    by_binding: HashMap<(String, String), (u64, Parts)>,
    by_cluster: HashMap<String, Vector>,
    /// The same, apart by which priced dimensions (cpu, memory, gpu) the replicas request:
    /// a cluster with no price for gpus still prices the replicas that request none.
    by_priced: HashMap<String, [Vector; 8]>,
}

/// Which of the priced dimensions (cpu, memory, gpu: bits 0 to 2) a demand asks for.
fn priced_mask(v: &Vector) -> usize {
    (0..3).filter(|d| v[*d] > 0.0).map(|d| 1 << d).sum()
}

impl Placed {
    /// Takes a binding in (`None`: it is gone).
    pub fn put(&mut self, key: (String, String), b: Option<&Object>) {
        // The scheduler writes its decisions into the spec without a new generation: what a
        // binding places is told by the fields it is read from.
        let print = b.map(placement_print).unwrap_or(0);
        if b.is_some() && self.by_binding.get(&key).is_some_and(|(p, _)| *p == print) {
            // Only its status changed: what it places is the same.
            return;
        }
        if let Some((_, old)) = self.by_binding.remove(&key) {
            for (c, v) in old {
                if let Some(t) = self.by_cluster.get_mut(&c) {
                    for d in 0..5 {
                        t[d] = (t[d] - v[d]).max(0.0);
                    }
                }
                if let Some(t) = self.by_priced.get_mut(&c) {
                    let t = &mut t[priced_mask(&v)];
                    for d in 0..5 {
                        t[d] = (t[d] - v[d]).max(0.0);
                    }
                }
            }
        }
        let Some(spec) = b.and_then(BindingSpec::of) else {
            return;
        };
        // A standalone task runs outside the members: it takes nothing there.
        if spec.resource.is_task() {
            return;
        }
        let request = spec
            .replica_requirements
            .map(|r| r.resource_request)
            .unwrap_or_default();
        let demand = orrery_scheduler::demand_of(&request);
        let mut parts = Vec::new();
        for t in spec.clusters.iter().filter(|t| t.replicas > 0) {
            let v: Vector = std::array::from_fn(|d| demand[d] * t.replicas as f64);
            let total = self.by_cluster.entry(t.name.clone()).or_insert([0.0; 5]);
            for d in 0..5 {
                total[d] += v[d];
            }
            let part = &mut self
                .by_priced
                .entry(t.name.clone())
                .or_insert([[0.0; 5]; 8])[priced_mask(&v)];
            for d in 0..5 {
                part[d] += v[d];
            }
            parts.push((t.name.clone(), v));
        }
        self.by_binding.insert(key, (print, parts));
    }

    /// Starts again from a listing.
    pub fn reset(&mut self, items: &[Arc<Object>]) {
        self.by_binding.clear();
        self.by_cluster.clear();
        self.by_priced.clear();
        for b in items {
            self.put((b.namespace().to_string(), b.name().to_string()), Some(b));
        }
    }

    /// [`Placed::cost_in`], with the Cluster's prices read from it.
    #[cfg(test)]
    fn cost(&self, c: &Object) -> Option<f64> {
        self.cost_in(c.name(), &Seen::of(c).prices)
    }

    /// What Orrery's replicas in a cluster cost per hour, by its prices (its own properties
    /// over its member's): those it has prices for (replicas requesting what it does not
    /// price are left out, as a binding's status lists the cluster apart); `None` where it
    /// has no price at all.
    fn cost_in(&self, cluster: &str, prices: &orrery_api::cost::Prices) -> Option<f64> {
        if !prices.is_priced() {
            return None;
        }
        let total: f64 = self
            .by_priced
            .get(cluster)
            .into_iter()
            .flatten()
            .filter_map(|v| orrery_scheduler::cost::unit_hourly(prices, v).ok())
            .sum();
        // `+ 0.0`: the sum of nothing is -0.0 in Rust, which JSON prints as `-0.0`.
        Some((total * 10_000.0).round() / 10_000.0 + 0.0)
    }

    /// [`Placed::shares_in`], with the Cluster's allocatable read from it.
    #[cfg(test)]
    fn shares(&self, c: &Object) -> BTreeMap<String, f64> {
        self.shares_in(c.name(), &Seen::of(c).allocatable)
    }

    /// Orrery's share of each of a cluster's forecast dimensions: what it placed over what
    /// the cluster can give.
    fn shares_in(&self, cluster: &str, allocatable: &Vector) -> BTreeMap<String, f64> {
        let Some(placed) = self.by_cluster.get(cluster) else {
            return BTreeMap::new();
        };
        FORECAST_DIMENSIONS
            .iter()
            .filter(|(d, _)| allocatable[*d] > 0.0 && placed[*d] > 0.0)
            .map(|(d, name)| {
                let share = (placed[*d] / allocatable[*d] * 1000.0).round() / 1000.0;
                (name.to_string(), share)
            })
            .collect()
    }
}

/// What the sampler keeps of a Cluster between its ticks, read from each change as it comes.
/// Not the Cluster: a parsed one is about 25 KB, and kept here every member's stayed alive
/// (at 10,000 members, a quarter of a GiB) after everything else had let it go.
#[derive(Debug)]
struct Seen {
    sample: ClusterSample,
    allocatable: Vector,
    prices: orrery_api::cost::Prices,
}

/// The fields of a Cluster's status the sampler reads: decoded at every change of every
/// member, so the rest (API kinds, nodes, exports) is skipped rather than built.
#[derive(Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Read {
    #[serde(default)]
    conditions: Vec<orrery_api::conditions::Condition>,
    #[serde(default)]
    resource_summary: Option<orrery_api::cluster::ResourceSummary>,
    #[serde(default)]
    water_level: Option<orrery_api::cluster::WaterLevel>,
    #[serde(default)]
    network: Option<orrery_api::cluster::NetworkStatus>,
    #[serde(default)]
    metrics: Option<orrery_api::cluster::MetricsSummary>,
    #[serde(default)]
    properties: BTreeMap<String, String>,
}

impl Seen {
    fn of(c: &Object) -> Seen {
        use serde::Deserialize;
        let read = c
            .status
            .as_ref()
            .and_then(|s| Read::deserialize(s).ok())
            .unwrap_or_default();
        let st = ClusterStatus {
            conditions: read.conditions,
            resource_summary: read.resource_summary,
            water_level: read.water_level,
            network: read.network,
            metrics: read.metrics,
            properties: read.properties,
            ..Default::default()
        };
        let spec = orrery_api::cluster::ClusterSpec::of(c);
        let (prices, _) = orrery_api::cost::Prices::of(orrery_api::cost::merged(
            &st.properties,
            &spec.properties,
        ));
        Seen {
            sample: sample_from(&st),
            allocatable: st
                .resource_summary
                .as_ref()
                .map(|r| orrery_scheduler::vector_of(&r.allocatable))
                .unwrap_or_default(),
            prices,
        }
    }
}

/// One cluster's figures now.
fn sample_from(st: &ClusterStatus) -> ClusterSample {
    let (level, levels) = match &st.water_level {
        Some(w) => (w.overall, w.dimensions.clone()),
        None => (0.0, BTreeMap::new()),
    };
    ClusterSample {
        ready: st.ready(),
        level,
        levels,
        cpu_usage: st.metrics.as_ref().map(|m| m.cpu_usage),
        memory_available: st.metrics.as_ref().map(|m| m.memory_available),
        pods: st.pods(),
        traffic: st.traffic(),
        forecast: Default::default(),
        placed: BTreeMap::new(),
        cost: None,
        backfilled: false,
    }
}

/// Writes the fleet's cost over what was there.
async fn put_cost(store: &dyn Store, cost: &series::FleetCost) -> Result<(), StoreError> {
    let mut o = Object::new("internal.orrery.io/v1", "FleetCost").with_name("cost");
    o.spec = serde_json::to_value(cost).ok();
    match store.get(series::COST_KEY).await {
        Ok(mut old) => {
            old.spec = o.spec;
            store.update(series::COST_KEY, old, None).await.map(|_| ())
        }
        Err(StoreError::NotFound { .. }) => store.create(series::COST_KEY, o).await.map(|_| ()),
        Err(e) => Err(e),
    }
}

/// What Orrery's replicas cost per hour, on `/metrics`.
#[derive(Debug, Default)]
pub struct CostMetrics {
    fleet: prometheus_client::metrics::gauge::Gauge<f64, std::sync::atomic::AtomicU64>,
    clusters: prometheus_client::metrics::family::Family<
        Vec<(String, String)>,
        prometheus_client::metrics::gauge::Gauge<f64, std::sync::atomic::AtomicU64>,
    >,
}

impl CostMetrics {
    /// Registers the families.
    pub fn new(
        registry: &parking_lot::Mutex<prometheus_client::registry::Registry>,
    ) -> CostMetrics {
        let m = CostMetrics::default();
        let mut r = registry.lock();
        r.register(
            "orrery_fleet_hourly_cost",
            "What the replicas Orrery placed cost per hour, by the clusters' prices",
            m.fleet.clone(),
        );
        r.register(
            "orrery_cluster_hourly_cost",
            "What the replicas Orrery placed in a cluster cost per hour, by its prices",
            m.clusters.clone(),
        );
        m
    }

    fn set(&self, cost: &series::FleetCost) {
        self.fleet.set(cost.hourly);
        self.clusters.clear();
        for (name, x) in &cost.clusters {
            self.clusters
                .get_or_create(&vec![("cluster".to_string(), name.clone())])
                .set(*x);
        }
    }
}

/// Stores a sample under `prefix`; what it was followed in `kept`.
async fn write(
    store: &dyn Store,
    prefix: &str,
    s: &FleetSample,
    kept: &mut Kept,
) -> Result<(), StoreError> {
    let key = series::key(prefix, s.time.unix_seconds());
    let name = key.trim_start_matches(prefix).to_string();
    let mut o = Object::new("internal.orrery.io/v1", "FleetSample").with_name(&name);
    o.metadata.creation_timestamp = Some(s.time);
    o.spec = serde_json::to_value(s).ok();
    let size = serde_json::to_vec(&o).map_or(0, |v| v.len() as u64);
    match store.create(&key, o).await {
        Ok(_) => {
            kept.wrote(key, size);
            Ok(())
        }
        // Two samples in one second (a restart): the first stands.
        Err(StoreError::AlreadyExists { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// The records of one series in the store, oldest first, with their sizes: listed once
/// (names and sizes only, in small pages: a record can be over a megabyte), then followed
/// by what this controller writes and deletes.
#[derive(Default)]
struct Kept {
    records: Option<BTreeMap<String, u64>>,
}

impl Kept {
    fn wrote(&mut self, key: String, size: u64) {
        // Not listed yet: the listing finds it.
        if let Some(r) = &mut self.records {
            r.insert(key, size);
        }
    }

    async fn records(
        &mut self,
        store: &dyn Store,
        prefix: &str,
    ) -> Result<&mut BTreeMap<String, u64>, StoreError> {
        #[derive(serde::Deserialize)]
        struct Named {
            metadata: Meta,
        }
        #[derive(serde::Deserialize)]
        struct Meta {
            name: String,
        }
        if self.records.is_none() {
            let mut found = BTreeMap::new();
            let mut opts = ListOptions::default().with_limit(16);
            loop {
                let page = store.list_raw(prefix, &opts).await?;
                for r in &page.items {
                    // Only the name is decoded, the rest skipped.
                    if let Ok(n) = serde_json::from_slice::<Named>(&r.json) {
                        found.insert(format!("{prefix}{}", n.metadata.name), r.json.len() as u64);
                    }
                }
                match page.continue_token.filter(|t| !t.is_empty()) {
                    Some(t) => opts = opts.with_continue(t),
                    None => break,
                }
            }
            self.records = Some(found);
        }
        Ok(self.records.get_or_insert_with(BTreeMap::new))
    }
}

/// Deletes records under `prefix` older than `keep`, and the oldest of those beyond
/// `budget` bytes.
async fn prune(
    store: &dyn Store,
    prefix: &str,
    keep: Duration,
    budget: u64,
    kept: &mut Kept,
) -> Result<usize, StoreError> {
    let cutoff = series::key(prefix, Time::now().unix_seconds() - keep.as_secs() as i64);
    let records = kept.records(store, prefix).await?;
    let mut total: u64 = records.values().sum();
    let mut gone = 0;
    while let Some((key, size)) = records.first_key_value().map(|(k, v)| (k.clone(), *v)) {
        if key >= cutoff && total <= budget {
            break;
        }
        match store.delete(&key, &Default::default()).await {
            Ok(_) | Err(StoreError::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
        records.remove(&key);
        total = total.saturating_sub(size);
        gone += 1;
    }
    Ok(gone)
}

/// What a sampling round keeps from the one before.
#[derive(Default)]
struct Rounds {
    since_average: series::Averager,
    /// The cost last written (none yet: written at the first sample).
    last_cost: Option<series::FleetCost>,
    last_average: Option<tokio::time::Instant>,
    raw_kept: Kept,
    average_kept: Kept,
}

/// The fleet as its Clusters and bindings stand; the one key, a tick, samples it. Nothing is
/// sampled before both are listed (Orrery's part of a level unknown, the forecasts would see
/// a step where there is none).
struct Sampler {
    store: Arc<dyn Store>,
    cfg: MonitoringConfig,
    forecaster: Option<ToForecaster>,
    placed: Placed,
    now: BTreeMap<String, Seen>,
    rounds: tokio::sync::Mutex<Rounds>,
}

impl Sampler {
    /// A forecaster that falls behind misses samples rather than holding up the sampling. It
    /// is handed only the series it forecasts: the others waited in its queue through a round
    /// (at 10,000 members a sample is megabytes, and a round takes minutes) to be dropped.
    fn hand(&self, s: &FleetSample, average: bool) {
        if let Some((f, checks)) = &self.forecaster
            && checks.wants(average)
        {
            let _ = f.try_send(crate::forecasting::Feed::Sample(s.clone(), average));
        }
    }

    /// Merges a cluster's history reported afterwards into the averages, and hands it to
    /// the forecaster (which waits for it: a backfill is not to be missed).
    async fn merge(&self, cluster: &str) -> Result<Action, StoreError> {
        let every = self.cfg.average_every.as_secs().max(1) as i64;
        let merged = {
            let mut r = self.rounds.lock().await;
            backfill::merge(self.store.as_ref(), cluster, every, &mut r.average_kept).await?
        };
        if !merged.windows.is_empty() {
            tracing::info!(
                cluster,
                windows = merged.windows.len(),
                written = merged.written,
                "history reported afterwards merged"
            );
            if let Some((f, _)) = &self.forecaster {
                let feed = crate::forecasting::Feed::Backfill(cluster.to_string(), merged.windows);
                let _ = f.send(feed).await;
            }
        }
        // Samples that came meanwhile are merged once their write's event comes, or in a
        // second should it have come while this merge ran.
        Ok(if merged.again {
            Action::After(Duration::from_secs(1))
        } else {
            Action::Done
        })
    }

    /// What the forecasts said of a sample's time is stored with it.
    fn annotate(&self, s: &mut FleetSample, average: bool) {
        if let Some((_, checks)) = &self.forecaster {
            checks.annotate(s, average);
        }
    }

    async fn sample(&self) {
        let (store, cfg) = (self.store.as_ref(), &self.cfg);
        let mut r = self.rounds.lock().await;
        let r = &mut *r;
        let clusters = self
            .now
            .iter()
            .map(|(n, c)| {
                let mut sample = c.sample.clone();
                sample.placed = self.placed.shares_in(n, &c.allocatable);
                sample.cost = self.placed.cost_in(n, &c.prices);
                (n.clone(), sample)
            })
            .collect();
        let mut s = FleetSample {
            time: Time::now(),
            clusters,
        };
        self.annotate(&mut s, false);
        let cost = series::FleetCost::of(&s);
        if let Some(m) = &cfg.cost_metrics {
            m.set(&cost);
        }
        if r.last_cost
            .as_ref()
            .is_none_or(|c| (&c.hourly, &c.clusters) != (&cost.hourly, &cost.clusters))
        {
            match put_cost(store, &cost).await {
                Ok(()) => r.last_cost = Some(cost),
                Err(e) => tracing::warn!(error = %e, "writing the fleet's cost"),
            }
        }
        if let Err(e) = write(store, series::RAW_PREFIX, &s, &mut r.raw_kept).await {
            tracing::warn!(error = %e, "writing a monitoring sample");
        }
        self.hand(&s, false);
        r.since_average.add(&s);
        let last_average = *r.last_average.get_or_insert_with(tokio::time::Instant::now);
        if last_average.elapsed() >= cfg.average_every {
            r.last_average = Some(tokio::time::Instant::now());
            if let Some(mut avg) = r.since_average.take() {
                self.annotate(&mut avg, true);
                if let Err(e) =
                    write(store, series::AVERAGE_PREFIX, &avg, &mut r.average_kept).await
                {
                    tracing::warn!(error = %e, "writing a monitoring average");
                }
                self.hand(&avg, true);
            }
            for (prefix, keep, budget, kept) in [
                (
                    series::RAW_PREFIX,
                    cfg.raw_retention,
                    cfg.raw_budget,
                    &mut r.raw_kept,
                ),
                (
                    series::AVERAGE_PREFIX,
                    cfg.average_retention,
                    cfg.average_budget,
                    &mut r.average_kept,
                ),
            ] {
                match prune(store, prefix, keep, budget, kept).await {
                    Ok(n) if n > 0 => {
                        tracing::debug!(prefix, removed = n, "monitoring records pruned")
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "pruning monitoring records"),
                }
            }
        }
    }
}

/// What the monitoring loop does: sample the fleet (a tick), or merge a cluster's history
/// reported afterwards.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Job {
    Sample,
    Merge(String),
}

#[async_trait::async_trait]
impl Reconciler for Sampler {
    type Key = Job;
    type Error = StoreError;

    fn on_event(&mut self, source: Origin, ev: Event, keys: &mut Keys<Job>) {
        match (source.name, ev) {
            ("backfill", Event::Listed(items)) => {
                for i in items {
                    keys.push(Job::Merge(i.name().to_string()));
                }
            }
            ("backfill", Event::Upsert(i)) => keys.push(Job::Merge(i.name().to_string())),
            ("backfill", Event::Delete(_)) => {}
            ("clusters", Event::Listed(items)) => {
                self.now = items
                    .iter()
                    .map(|c| (c.name().to_string(), Seen::of(c)))
                    .collect();
            }
            ("clusters", Event::Upsert(c)) => {
                self.now.insert(c.name().to_string(), Seen::of(&c));
            }
            ("clusters", Event::Delete(c)) => {
                self.now.remove(c.name());
            }
            (_, Event::Listed(items)) => self.placed.reset(&items),
            (_, Event::Upsert(b)) => {
                self.placed
                    .put((b.namespace().to_string(), b.name().to_string()), Some(&b));
            }
            (_, Event::Delete(b)) => {
                self.placed
                    .put((b.namespace().to_string(), b.name().to_string()), None);
            }
        }
    }

    fn all_keys(&self) -> Vec<Job> {
        vec![Job::Sample]
    }

    /// Samples are an interval apart, from start to start (a round over a large fleet takes
    /// a while).
    async fn reconcile(&self, job: &Job) -> Result<Action, StoreError> {
        if let Job::Merge(cluster) = job {
            return self.merge(cluster).await;
        }
        let started = std::time::Instant::now();
        self.sample().await;
        Ok(Action::After(
            self.cfg.interval.saturating_sub(started.elapsed()),
        ))
    }
}

/// Samples the fleet until shutdown.
pub async fn run(
    store: Arc<dyn Store>,
    cfg: MonitoringConfig,
    forecaster: Option<ToForecaster>,
    metrics: Handle,
    shutdown: watch::Receiver<bool>,
) {
    let r = Sampler {
        store: store.clone(),
        cfg,
        forecaster,
        placed: Placed::default(),
        now: BTreeMap::new(),
        rounds: Default::default(),
    };
    Controller::new("monitoring", store, r, metrics)
        .source(Source::new("clusters", keys::well_known::clusters()))
        .source(Source::new(
            "bindings",
            orrery_api::kinds::RESOURCE_BINDING.prefix(None),
        ))
        .source(Source::new(
            "backfill",
            orrery_api::history::backfill::PREFIX.to_string(),
        ))
        .run(shutdown)
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(level: f64, at: i64) -> FleetSample {
        let c = ClusterSample {
            ready: true,
            level,
            ..Default::default()
        };
        FleetSample {
            time: Time::from_unix_seconds(at).unwrap(),
            clusters: [("m-0".to_string(), c)].into(),
        }
    }

    async fn levels(store: &dyn Store, prefix: &str) -> Vec<(i64, f64)> {
        let page = store.list(prefix, &ListOptions::default()).await.unwrap();
        page.items
            .iter()
            .map(|o| {
                let s: FleetSample = serde_json::from_value(o.spec.clone().unwrap()).unwrap();
                (s.time.unix_seconds(), s.clusters["m-0"].level)
            })
            .collect()
    }

    async fn inbox(store: &dyn Store, cluster: &str, points: &[(i64, f64)]) {
        use orrery_api::history::backfill::{Inbox, Point, key};
        let mut i = Inbox {
            cluster: cluster.into(),
            ..Default::default()
        };
        i.add(points.iter().map(|(t, cpu)| {
            let p = Point {
                levels: [("cpu".to_string(), *cpu)].into(),
                ..Default::default()
            };
            (*t, p)
        }));
        let mut o = Object::new("internal.orrery.io/v1", "MetricsBackfill").with_name(cluster);
        o.spec = Some(serde_json::to_value(&i).unwrap());
        store.create(&key(cluster), o).await.unwrap();
    }

    async fn averages(store: &dyn Store) -> Vec<FleetSample> {
        let page = store
            .list(series::AVERAGE_PREFIX, &ListOptions::default())
            .await
            .unwrap();
        page.items
            .iter()
            .map(|o| serde_json::from_value(o.spec.clone().unwrap()).unwrap())
            .collect()
    }

    /// History reported afterwards joins the stored average of its window, or a record of
    /// its own; what the monitoring loop measured stays; the inbox goes; merging the same
    /// history again writes nothing.
    #[tokio::test]
    async fn history_reported_afterwards_is_merged_into_the_averages() {
        let dir = tempfile::tempdir().unwrap();
        let store = orrery_store_sqlite::SqliteStore::open_dir(dir.path()).unwrap();
        let end = (Time::now().unix_seconds() / 300 - 10) * 300;
        let measured = end - 100;
        let mut kept = Kept::default();
        write(
            &store,
            series::AVERAGE_PREFIX,
            &sample(0.5, measured),
            &mut kept,
        )
        .await
        .unwrap();
        // m-0 in the measured window (left out) and 40 minutes before; b in the window.
        inbox(&store, "m-0", &[(end - 50, 0.9), (end - 2400, 0.3)]).await;
        inbox(&store, "b", &[(end - 250, 0.2), (end - 10, 0.4)]).await;
        let m = backfill::merge(&store, "m-0", 300, &mut kept)
            .await
            .unwrap();
        assert_eq!((m.windows.len(), m.written, m.again), (2, 1, false));
        let m = backfill::merge(&store, "b", 300, &mut kept).await.unwrap();
        assert_eq!((m.windows.len(), m.written), (1, 1));
        let all = averages(&store).await;
        assert_eq!(all.len(), 2, "{all:?}");
        let (early, window) = (&all[0], &all[1]);
        assert_eq!(early.time.unix_seconds(), end - 2400);
        assert!(early.clusters["m-0"].backfilled);
        assert_eq!(early.clusters["m-0"].levels["cpu"], 0.3);
        assert_eq!(window.time.unix_seconds(), measured);
        assert_eq!(window.clusters["m-0"].level, 0.5);
        assert!(!window.clusters["m-0"].backfilled);
        assert!(window.clusters["b"].backfilled);
        assert!((window.clusters["b"].levels["cpu"] - 0.3).abs() < 1e-9);
        for c in ["m-0", "b"] {
            let gone = store.get(&orrery_api::history::backfill::key(c)).await;
            assert!(matches!(gone, Err(StoreError::NotFound { .. })), "{c}");
        }
        // Reported again (a retry, or a crash before the inbox went): nothing changes.
        inbox(&store, "b", &[(end - 250, 0.2), (end - 10, 0.4)]).await;
        let m = backfill::merge(&store, "b", 300, &mut kept).await.unwrap();
        assert_eq!(m.written, 0);
        assert_eq!(averages(&store).await, all);
        // Nothing waiting: nothing to do.
        let m = backfill::merge(&store, "b", 300, &mut kept).await.unwrap();
        assert!(m.windows.is_empty());
    }

    /// Samples are taken, averaged and pruned as configured: records past their retention
    /// go, younger ones stay, and the averages are those of the samples.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn samples_are_averaged_and_pruned() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(orrery_store_sqlite::SqliteStore::open_dir(dir.path()).unwrap());
        let now = Time::now().unix_seconds();
        // Left by an earlier run: one raw sample past its retention, one within it, and an
        // average past its own.
        write(
            store.as_ref(),
            series::RAW_PREFIX,
            &sample(0.9, now - 7200),
            &mut Kept::default(),
        )
        .await
        .unwrap();
        write(
            store.as_ref(),
            series::RAW_PREFIX,
            &sample(0.8, now - 600),
            &mut Kept::default(),
        )
        .await
        .unwrap();
        write(
            store.as_ref(),
            series::AVERAGE_PREFIX,
            &sample(0.7, now - 30 * 86400),
            &mut Kept::default(),
        )
        .await
        .unwrap();
        let mut c = Object::new("multicluster.io/v1alpha1", "Cluster").with_name("m-0");
        c.status = Some(serde_json::json!({
            "conditions": [{"type": "Ready", "status": "True"}],
            "waterLevel": {"cpu": 0.25, "overall": 0.25},
        }));
        store
            .create(&keys::well_known::cluster("m-0"), c)
            .await
            .unwrap();
        let cfg = MonitoringConfig {
            interval: Duration::from_millis(200),
            raw_retention: Duration::from_secs(3600),
            average_retention: Duration::from_secs(14 * 86400),
            average_every: Duration::from_millis(1500),
            ..Default::default()
        };
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(run(
            store.clone(),
            cfg,
            None,
            crate::runtime::metrics::ControllerMetrics::default().of("test"),
            stopped,
        ));
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !levels(store.as_ref(), series::AVERAGE_PREFIX)
            .await
            .iter()
            .any(|(t, _)| *t >= now)
            && std::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = stop.send(true);
        task.await.unwrap();
        // The average went in before the pruning of its round.
        let averages = levels(store.as_ref(), series::AVERAGE_PREFIX).await;
        assert!(!averages.is_empty());
        assert!(
            averages.iter().all(|(t, l)| *t >= now && *l == 0.25),
            "the old average is pruned, the new one is of the samples: {averages:?}"
        );
        let raw = levels(store.as_ref(), series::RAW_PREFIX).await;
        assert!(
            raw.contains(&(now - 600, 0.8)),
            "a sample within its retention stays: {raw:?}"
        );
        assert!(
            !raw.iter().any(|(t, _)| *t == now - 7200),
            "a sample past its retention goes: {raw:?}"
        );
        assert!(
            raw.iter().filter(|(t, l)| *t >= now && *l == 0.25).count() >= 2,
            "samples are taken every interval: {raw:?}"
        );
    }

    /// Records beyond the byte budget go, oldest first, even within their retention; the
    /// budget is of what is stored before this controller ran (listed) and what it wrote.
    #[tokio::test]
    async fn records_beyond_the_budget_go_oldest_first() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(orrery_store_sqlite::SqliteStore::open_dir(dir.path()).unwrap());
        let now = Time::now().unix_seconds();
        let hour = Duration::from_secs(3600);
        // Five samples of an earlier run, a minute apart, all within the retention.
        for i in 0..5 {
            let s = sample(0.1 * (i + 1) as f64, now - 300 + 60 * i);
            write(store.as_ref(), series::RAW_PREFIX, &s, &mut Kept::default())
                .await
                .unwrap();
        }
        let mut kept = Kept::default();
        assert_eq!(
            prune(
                store.as_ref(),
                series::RAW_PREFIX,
                hour,
                u64::MAX,
                &mut kept
            )
            .await
            .unwrap(),
            0,
            "within the retention and the budget"
        );
        let sizes: Vec<u64> = kept.records.as_ref().unwrap().values().copied().collect();
        assert_eq!(sizes.len(), 5, "listed: {sizes:?}");
        // Room for the newest two and this run's own sample.
        write(
            store.as_ref(),
            series::RAW_PREFIX,
            &sample(0.9, now),
            &mut kept,
        )
        .await
        .unwrap();
        assert_eq!(
            kept.records.as_ref().unwrap().len(),
            6,
            "its own write followed"
        );
        let budget = sizes[3] + sizes[4] + sizes[4] + sizes[4] / 2;
        let gone = prune(store.as_ref(), series::RAW_PREFIX, hour, budget, &mut kept)
            .await
            .unwrap();
        assert_eq!(gone, 3);
        let left: Vec<f64> = levels(store.as_ref(), series::RAW_PREFIX)
            .await
            .into_iter()
            .map(|(_, l)| l)
            .collect();
        assert_eq!(left, vec![0.4, 0.5, 0.9], "the oldest went");
        assert_eq!(kept.records.as_ref().unwrap().len(), 3);
        // Within the budget now; the retention still applies.
        assert_eq!(
            prune(store.as_ref(), series::RAW_PREFIX, hour, budget, &mut kept)
                .await
                .unwrap(),
            0
        );
        let gone = prune(
            store.as_ref(),
            series::RAW_PREFIX,
            Duration::from_secs(30),
            budget,
            &mut kept,
        )
        .await
        .unwrap();
        assert_eq!(gone, 2, "past a retention of 30 s");
        assert_eq!(levels(store.as_ref(), series::RAW_PREFIX).await.len(), 1);
    }

    fn binding(name: &str, generation: i64, clusters: serde_json::Value) -> Object {
        let mut b = Object::new("multicluster.io/v1alpha1", "ResourceBinding").with_name(name);
        b.metadata.namespace = "default".into();
        b.metadata.generation = Some(generation);
        b.spec = Some(serde_json::json!({
            "resource": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "default", "name": name},
            "replicas": 4,
            "replicaRequirements": {"resourceRequest": {"cpu": "500m", "memory": "1Gi"}},
            "policy": {"apiVersion": "multicluster.io/v1alpha1", "kind": "ResourcePlacementPolicy", "name": "web"},
            "clusters": clusters,
        }));
        b
    }

    fn member(name: &str) -> Object {
        let mut c = Object::new("multicluster.io/v1alpha1", "Cluster").with_name(name);
        c.status = Some(serde_json::json!({
            "resourceSummary": {"allocatable": {"cpu": "10", "memory": "8Gi", "pods": "100"}},
        }));
        c
    }

    /// What the sampler keeps of a Cluster reads as the whole status does: every field a
    /// sample, a share or a cost is made from is among those it decodes.
    #[test]
    fn a_clusters_figures_are_read_from_the_fields_kept() {
        let mut c = member("a");
        c.spec =
            Some(serde_json::json!({"properties": {"cost.orrery.io/memory-gib-hour": "0.01"}}));
        c.status = Some(serde_json::json!({
            "conditions": [{"type": "Ready", "status": "True", "reason": "Up", "message": "",
                            "lastTransitionTime": "2026-11-29T00:00:00Z"}],
            "apiEnablements": [{"groupVersion": "v1", "resources": [{"name": "pods", "kind": "Pod"}]}],
            "nodeSummary": {"totalNum": 3, "readyNum": 3},
            "resourceSummary": {"allocatable": {"cpu": "10", "memory": "8Gi", "pods": "100"},
                                "allocated": {"cpu": "4", "pods": "17"}},
            "waterLevel": {"overall": 0.42, "cpu": 0.42, "memory": 0.3},
            "network": {"ingressBytesPerSecond": 100.0, "egressBytesPerSecond": 20.0},
            "metrics": {"timestamp": "2026-11-29T00:00:00Z", "cpuUsage": 3.5,
                        "memoryAvailable": 1000.0, "pods": 12},
            "properties": {"cost.orrery.io/cpu-core-hour": "0.04"},
        }));
        let seen = Seen::of(&c);
        let whole = ClusterStatus::of(&c);
        assert!(whole.ready() && whole.metrics.is_some() && whole.network.is_some());
        assert_eq!(seen.sample, sample_from(&whole));
        assert_eq!(seen.sample.pods, Some(12));
        assert!(seen.prices.cpu_core_hour.is_some() && seen.prices.memory_gib_hour.is_some());
        assert_eq!(seen.allocatable[0], 10.0);
        let mut p = Placed::default();
        let b = binding("web", 1, serde_json::json!([{"name": "a", "replicas": 2}]));
        p.put(("default".to_string(), "web".to_string()), Some(&b));
        assert_eq!(p.shares_in("a", &seen.allocatable), p.shares(&c));
        assert_eq!(p.cost_in("a", &seen.prices), p.cost(&c));
        assert!(p.cost(&c).is_some());
        // A priced cluster running nothing of Orrery's costs 0, not -0 (printed `-0.0`).
        let idle = p.cost_in("b", &seen.prices).unwrap();
        assert!(idle == 0.0 && idle.is_sign_positive(), "{idle}");
    }

    /// Orrery's part of each cluster's levels follows what its bindings place there: a new
    /// decision replaces the old one (the scheduler writes it without a new generation), a
    /// status write changes nothing, a deletion takes it away.
    #[test]
    fn orrerys_part_of_each_level_follows_the_bindings() {
        let mut p = Placed::default();
        let key = ("default".to_string(), "web".to_string());
        let b = binding(
            "web",
            1,
            serde_json::json!([{"name": "a", "replicas": 3}, {"name": "b", "replicas": 1}]),
        );
        p.put(key.clone(), Some(&b));
        let a = p.shares(&member("a"));
        assert_eq!(a["cpu"], 0.15);
        assert_eq!(a["memory"], 0.375);
        assert_eq!(a["pods"], 0.03);
        assert!(!a.contains_key("gpu"));
        assert_eq!(p.shares(&member("b"))["cpu"], 0.05);
        // A decision moves everything to b (the same generation: the scheduler's write).
        let moved = binding("web", 1, serde_json::json!([{"name": "b", "replicas": 4}]));
        p.put(key.clone(), Some(&moved));
        assert!(p.shares(&member("a")).is_empty());
        assert_eq!(p.shares(&member("b"))["cpu"], 0.2);
        // A status write changes nothing.
        let mut status = binding("web", 1, serde_json::json!([{"name": "b", "replicas": 4}]));
        status.status = Some(serde_json::json!({"conditions": []}));
        p.put(key.clone(), Some(&status));
        assert_eq!(p.shares(&member("b"))["cpu"], 0.2);
        p.put(key, None);
        assert!(p.shares(&member("b")).is_empty());
        // A listing starts again.
        p.reset(&[Arc::new(b)]);
        assert_eq!(p.shares(&member("a"))["cpu"], 0.15);
    }

    /// What Orrery's replicas cost in a cluster: what they request at its prices, the
    /// Cluster's own over its member's; nothing where it has no prices.
    #[test]
    fn orrerys_replicas_cost_what_they_request_at_the_clusters_prices() {
        let mut p = Placed::default();
        let b = binding(
            "web",
            1,
            serde_json::json!([{"name": "a", "replicas": 3}, {"name": "b", "replicas": 1}]),
        );
        p.put(("default".to_string(), "web".to_string()), Some(&b));
        let priced = |name: &str, status: serde_json::Value, spec: serde_json::Value| {
            let mut c = member(name);
            c.status.as_mut().unwrap()["properties"] = status;
            c.spec = Some(serde_json::json!({ "properties": spec }));
            c
        };
        let prices = serde_json::json!({"cost.orrery.io/cpu-core-hour": "0.04", "cost.orrery.io/memory-gib-hour": "0.01"});
        // 3 replicas of 0.5 core and 1 GiB: 1.5 x 0.04 + 3 x 0.01.
        let a = priced("a", prices.clone(), serde_json::json!({}));
        assert_eq!(p.cost(&a), Some(0.09));
        let a = priced(
            "a",
            prices.clone(),
            serde_json::json!({"cost.orrery.io/cpu-core-hour": "0.02"}),
        );
        assert_eq!(p.cost(&a), Some(0.06));
        // Priced, nothing placed: nothing spent.
        assert_eq!(
            p.cost(&priced("c", prices.clone(), serde_json::json!({}))),
            Some(0.0)
        );
        assert_eq!(p.cost(&member("a")), None);
        // A training job requesting GPUs there, which a has no price for: the replicas it
        // prices still count (its status lists a apart for the job).
        let mut gpu = binding(
            "train",
            1,
            serde_json::json!([{"name": "a", "replicas": 2}]),
        );
        gpu.spec.as_mut().unwrap()["replicaRequirements"]["resourceRequest"]["nvidia.com/gpu"] =
            "1".into();
        p.put(("default".to_string(), "train".to_string()), Some(&gpu));
        let a = priced("a", prices.clone(), serde_json::json!({}));
        assert_eq!(p.cost(&a), Some(0.09));
        let with_gpu = priced(
            "a",
            prices,
            serde_json::json!({"cost.orrery.io/gpu-hour": "2"}),
        );
        // + 2 x (0.5 x 0.04 + 1 x 0.01 + 2).
        assert_eq!(p.cost(&with_gpu), Some(4.15));
        p.put(("default".to_string(), "train".to_string()), None);
        assert_eq!(p.cost(&a), Some(0.09));
    }
}
