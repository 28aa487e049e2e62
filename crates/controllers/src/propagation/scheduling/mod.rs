//! The scheduling controller: decides each binding's `spec.clusters` with the pure engine,
//! records why in the binding's status and in the schedule history, tells the template's
//! owner with an Event, and reschedules when clusters change.
//!
//! - Queue: bindings wait in a priority queue (higher `priority` first, namespaces in turn);
//!   one that fits nowhere is retried once something that may make room changed (within a
//!   second while few wait; at most 1,000 a second), with exponential backoff while nothing
//!   did, and at once when a cluster fact that placement depends on changes (readiness,
//!   taints, labels, location, served APIs, capabilities). Heartbeats that only move
//!   figures reschedule nothing. A binding left `Scheduled=False` is tried again at start.
//! - Assume: a decision's new replicas count against their clusters until the member reports
//!   figures measured after it (or a timeout), so a burst cannot overcommit a cluster. A
//!   decision whose write fails (another writer changed the binding first) gives that back
//!   and is decided again; a binding is not decided twice while its write is in flight, and
//!   the history records only decisions that were written.
//! - Rescheduling: a cluster that is dark or tainted NoExecute (past the placement's
//!   `tolerationSeconds`) loses its replicas, make-before-break: the old copy stays until the
//!   new placement is healthy or a grace period ends. A cluster whose water level stays above
//!   the shed mark (0.95, above the placement limit) for a window sheds replicas of
//!   water-level bindings, a few bindings per window (rate limit), down to the limit less a
//!   hysteresis margin. A recovered cluster is divided onto afresh only for placements with
//!   `rebalanceOnRecovery`.
//! - Application failover (Karmada's): an application unhealthy in a cluster past its
//!   toleration is evicted from it.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use orrery_api::binding::{
    self, AggregatedStatusItem, BindingSpec, BindingStatus, CONDITION_SCHEDULED, Eviction,
    TargetCluster,
};
use orrery_api::cluster::{TAINT_NOT_READY, TAINT_UNREACHABLE};
use orrery_api::conditions::{self, Condition};
use orrery_api::history::{self, ScheduleEntry};
use orrery_api::policy::DEFAULT_FAILOVER_TOLERATION_SECONDS;
use orrery_api::prediction::{Ahead, ForecastTrigger};
use orrery_api::work::Health;
use orrery_api::{MicroTime, Object, Time, keys};
use orrery_scheduler::assume::AssumeCache;
use orrery_scheduler::queue::Backoff;
use orrery_scheduler::{
    ClusterSnapshot, Config as Engine, Decision, FilterCache, Fleet, Mode, Outlook, Task,
    demand_of, schedule_cached,
};
use orrery_store::Store;
use serde::Deserialize;
use tokio::sync::{mpsc, watch};

use futures_util::FutureExt;

use super::{Job, run_jobs, subject};
use crate::record;
use crate::runtime::Event;
use crate::runtime::controller::{Action, Batch, Controller, Keys, Origin, Source};
use crate::runtime::queue::Rank;

const COMPONENT: &str = "orrery-scheduler";

/// Bindings decided between two looks at the event stream (and one chunk of writes).
const CHUNK: usize = 1000;
/// Chunks whose writes may be in flight at once.
const IN_FLIGHT: usize = 4;
/// A binding that found no room is retried after this even when nothing that could make room
/// was seen to change (kube-scheduler's flush of unschedulable pods).
const RETRY_ANYWAY: Duration = Duration::from_secs(300);
/// Bindings waiting for room tried again per second at most, once room may have been made.
const RETRIES_PER_SECOND: u64 = 1_000;
/// Pods seen reported this long before a member's resource figures were measured are in them
/// (heartbeat times have whole seconds).
const ASSUME_MARGIN: Duration = Duration::from_secs(1);

/// What the scheduler reports at `/metrics`.
#[derive(Debug)]
pub struct SchedulerMetrics {
    queue_depth: prometheus_client::metrics::gauge::Gauge,
    decisions: prometheus_client::metrics::counter::Counter,
    unschedulable: prometheus_client::metrics::counter::Counter,
    decision_seconds: prometheus_client::metrics::histogram::Histogram,
}

impl Default for SchedulerMetrics {
    /// Unregistered (for a scheduler nobody scrapes).
    fn default() -> Self {
        SchedulerMetrics {
            queue_depth: Default::default(),
            decisions: Default::default(),
            unschedulable: Default::default(),
            decision_seconds: prometheus_client::metrics::histogram::Histogram::new(
                prometheus_client::metrics::histogram::exponential_buckets(0.000_01, 2.0, 16),
            ),
        }
    }
}

impl SchedulerMetrics {
    /// Registers the scheduler's families.
    pub fn new(
        registry: &parking_lot::Mutex<prometheus_client::registry::Registry>,
    ) -> SchedulerMetrics {
        let m = SchedulerMetrics::default();
        let mut r = registry.lock();
        r.register(
            "orrery_scheduler_queue_depth",
            "Bindings waiting for a scheduling decision",
            m.queue_depth.clone(),
        );
        r.register(
            "orrery_scheduler_decisions",
            "Scheduling decisions made",
            m.decisions.clone(),
        );
        r.register(
            "orrery_scheduler_unschedulable",
            "Decisions that could not place every replica",
            m.unschedulable.clone(),
        );
        r.register(
            "orrery_scheduler_decision_duration_seconds",
            "Time the engine took per decision",
            m.decision_seconds.clone(),
        );
        m
    }
}

/// The scheduler's knobs (`orrery server --scheduler-*`).
#[derive(Clone, Debug)]
pub struct Settings {
    /// Water level no cluster is filled beyond, unless a policy sets its own.
    pub water_level_limit: f64,
    /// How long a cluster stays above the shed mark before it sheds replicas.
    pub shed_window: Duration,
    /// Water level above which a cluster sheds (never below `water_level_limit`).
    pub shed_mark: f64,
    /// Bindings moved off one hot cluster per window.
    pub shed_per_window: usize,
    /// How often bindings whose placement consolidates (`cost.consolidate`) are decided
    /// again to move replicas onto cheaper clusters with room.
    pub consolidate_every: Duration,
    /// Bindings decided again per round of consolidation.
    pub consolidate_per_round: usize,
    /// How long the old copy of moved replicas stays while the new ones start.
    pub move_grace: Duration,
    /// A member's figures measured this long after a decision include it.
    pub assume_settle: Duration,
    /// Assumptions nobody confirmed are dropped after this.
    pub assume_ttl: Duration,
    /// The score plugins' weights before monitoring adjusts them.
    pub weights: orrery_scheduler::Weights,
    /// How far ahead, and at which bound, clusters are judged when a placement does not say;
    /// also what proactive rebalancing looks at.
    pub prediction: Ahead,
    pub metrics: Arc<SchedulerMetrics>,
    /// The runtime's figures (synced, queue depth, rounds), as every controller has them.
    pub controller_metrics: Arc<crate::runtime::metrics::ControllerMetrics>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            water_level_limit: orrery_scheduler::DEFAULT_WATER_LEVEL_LIMIT,
            shed_window: Duration::from_secs(60),
            shed_mark: orrery_scheduler::DEFAULT_SHED_MARK,
            shed_per_window: 10,
            consolidate_every: Duration::from_secs(300),
            consolidate_per_round: orrery_scheduler::DEFAULT_CONSOLIDATE_PER_ROUND,
            move_grace: Duration::from_secs(300),
            assume_settle: Duration::from_secs(5),
            assume_ttl: Duration::from_secs(60),
            weights: orrery_scheduler::Weights::default(),
            prediction: Ahead::default(),
            metrics: Arc::default(),
            controller_metrics: Arc::default(),
        }
    }
}

// The sources, by name.
const CLUSTERS: &str = "clusters";
/// Members' heartbeat Leases: a renewal vouches for the status last written.
const LEASES: &str = "leases";
/// The monitoring system's forecasts of each cluster.
const FORECASTS: &str = "forecasts";
const BINDINGS: &str = "bindings";
const MIGRATIONS: &str = "migrations";
const DATASETS: &str = "datasets";
const DATATRANSFERS: &str = "datatransfers";

/// What the scheduler reads from a Cluster object.
/// Ready and without the health controller's taints: a cluster that can take replicas.
fn serving(s: &ClusterSnapshot) -> bool {
    s.ready
        && !s
            .taints
            .iter()
            .any(|t| t.key == TAINT_NOT_READY || t.key == TAINT_UNREACHABLE)
}

/// The facts placement depends on, hashed.
fn fingerprint(s: &ClusterSnapshot) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    s.labels.hash(&mut h);
    s.provider.hash(&mut h);
    s.region.hash(&mut h);
    s.zones.hash(&mut h);
    s.ready.hash(&mut h);
    s.capabilities.hash(&mut h);
    for t in &s.taints {
        (&t.key, &t.value, t.effect.as_str()).hash(&mut h);
    }
    let mut kinds: Vec<_> = s.api_kinds.iter().flatten().collect();
    kinds.sort();
    kinds.hash(&mut h);
    h.finish()
}

type BKey = (String, String);

/// What asked for a decision (recorded in the history).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Trigger {
    /// The binding changed (or was created, or the controller started).
    Binding,
    ClustersChanged,
    Failover,
    Shed,
    /// A cluster's forecast crosses the shed mark within the horizon: replicas move ahead of
    /// the peak.
    Forecast,
    Recovered,
    Retry,
    /// Moved replicas' old copies are due to go.
    Cleanup,
    /// Someone asked for a fresh decision (`POST /api/v1/bindings`).
    Requested,
    /// A workload it follows or shares a group with now serves elsewhere.
    LeaderMoved,
    /// A user's Migration waits for its target.
    UserMove,
    /// A round of consolidation: replicas may move to cheaper clusters with room.
    Consolidate,
    /// A migration of the binding ended: its status says where it runs now.
    MoveDone,
    /// A data set it reads changed (its copies, or it appeared).
    DataChanged,
}

impl Trigger {
    fn as_str(&self) -> &'static str {
        match self {
            Trigger::Binding => "SpecChanged",
            Trigger::ClustersChanged => "ClustersChanged",
            Trigger::Failover => "Failover",
            Trigger::Shed => "Shed",
            Trigger::Forecast => "Forecast",
            Trigger::Recovered => "Recovered",
            Trigger::Retry => "Retry",
            Trigger::Cleanup => "Cleanup",
            Trigger::Requested => "Requested",
            Trigger::LeaderMoved => "LeaderMoved",
            Trigger::UserMove => "Migration",
            Trigger::Consolidate => "Consolidate",
            Trigger::MoveDone => "MigrationDone",
            Trigger::DataChanged => "DataChanged",
        }
    }
    /// Whether the decision moves replicas the user did not ask to move (make-before-break).
    fn moves(&self) -> bool {
        !matches!(
            self,
            Trigger::Binding | Trigger::Failover | Trigger::MoveDone
        )
    }
}

struct Scheduler {
    store: Arc<dyn Store>,
    settings: Settings,
    engine: Engine,
    filter_cache: FilterCache,
    fleet: Fleet,
    prints: HashMap<String, u64>,
    /// Per cluster: when the figures it last reported were measured.
    heartbeats: HashMap<String, MicroTime>,
    /// Per cluster: the Cluster's resourceVersion last seen (a Lease renewal vouches for a
    /// revision).
    cluster_revisions: HashMap<String, i64>,
    bindings: HashMap<BKey, Arc<Object>>,
    /// Whether the bindings have listed (a cluster back to Ready before then is no recovery).
    bindings_listed: bool,
    /// Keys woken since the loop last took them, and why (the first reason wins until the
    /// binding is decided).
    wake: Vec<BKey>,
    triggers: HashMap<BKey, Trigger>,
    /// Keys woken to be tried again for room: they wait behind fresh work.
    behind: HashSet<BKey>,
    /// Keys woken outside `on_event` and `tick` (a write that lost), handed to the loop.
    wake_tx: mpsc::UnboundedSender<BKey>,
    shed: HashMap<BKey, Vec<String>>,
    /// Clusters a binding is to shed ahead of their forecast peak.
    shed_ahead: HashMap<BKey, Vec<String>>,
    /// Bindings whose placement consolidates onto cheaper clusters, in key order.
    consolidators: BTreeSet<BKey>,
    /// Bindings queued by a round of consolidation.
    consolidating: HashSet<BKey>,
    /// When the last round of consolidation ran.
    last_consolidation: Instant,
    backoff: Backoff<BKey>,
    /// Counts what may have made room in the fleet: resources freed or reported, assumptions
    /// released, weights changed.
    room_epoch: u64,
    /// Bindings that found no room.
    unplaced: HashMap<BKey, Unplaced>,
    /// Writes of decided chunks still in flight; each tells which of its bindings' writes
    /// failed.
    writing: std::collections::VecDeque<tokio::task::JoinHandle<Vec<Written>>>,
    /// Decisions assumed whose writes are in flight: their task number, what woke them and
    /// what was assumed for the binding before. A binding is not decided again until its
    /// write is over (a second decision on the same revision could only lose, and would
    /// have its assumption stacked on one that may be taken back).
    in_flight: HashMap<BKey, InFlight>,
    /// Bindings woken while their write was in flight, and why: queued once it is over.
    deferred: HashMap<BKey, Trigger>,
    /// The in-flight decisions of the chunk being decided.
    chunk_in_flight: Vec<(BKey, u64)>,
    /// Since when the queue has been busy, and how many bindings it handed out since.
    round: Option<(usize, Instant)>,
    /// Bindings holding moved replicas' old copies, and when the first is due to go.
    moves: HashMap<BKey, i64>,
    assume: AssumeCache,
    hot_since: HashMap<String, Instant>,
    /// The fleet's usual network traffic (a slow moving average), for weight adjustment.
    traffic_baseline: Option<f64>,
    /// The network weight last logged at info level.
    weights_told: Option<f64>,
    last_shed: HashMap<String, Instant>,
    /// The same two for the limit, at which consolidating bindings are shed.
    over_since: HashMap<String, Instant>,
    last_limit_shed: HashMap<String, Instant>,
    /// Each cluster's forecast, as the engine reads it.
    outlooks: HashMap<String, Arc<Outlook>>,
    /// The forecasts that made bindings move ahead of a peak, for the history.
    forecast_moves: HashMap<BKey, ForecastTrigger>,
    /// The chunk's decisions, by binding: recorded once the binding's write lands.
    history: Vec<(BKey, ScheduleEntry)>,
    history_tx: mpsc::UnboundedSender<Vec<ScheduleEntry>>,
    seq: u64,
    started: Instant,
    /// Follow-up and group relations, and migrations under way.
    graph: super::stateful::Graph,
    /// Users' Migrations waiting for a target, by binding.
    user_moves: HashMap<BKey, Arc<Object>>,
    /// Data sets, by namespace and name: their size and copies (data-aware scheduling).
    datasets: super::stateful::DataSets,
    /// Data set copies under way: (source, destination, bytes still to send), by transfer.
    booked: HashMap<(String, String), (String, String, f64)>,
    /// Bindings naming a migration not seen yet, and since when.
    unknown_moves: HashMap<BKey, Instant>,
    runtime: crate::runtime::metrics::Handle,
}

/// Runs the scheduling controller until shutdown.
pub async fn run(store: Arc<dyn Store>, settings: Settings, shutdown: watch::Receiver<bool>) {
    let (history_tx, history_rx) = mpsc::unbounded_channel();
    tokio::spawn(super::history::write(store.clone(), history_rx));
    let (wake_tx, wake_rx) = mpsc::unbounded_channel();
    let runtime = settings.controller_metrics.of("scheduling");
    let s = Scheduler::new(
        store.clone(),
        settings,
        history_tx,
        wake_tx,
        runtime.clone(),
    );
    let data = |plural| keys::prefix(orrery_api::cluster::GROUP, plural, None);
    Controller::batched("scheduling", store, s, runtime)
        .source(Source::new(CLUSTERS, keys::well_known::clusters()))
        // Heartbeats only confirm assumptions: nothing waits for their listing.
        .source(Source::new(LEASES, keys::well_known::cluster_leases()).outside_barrier())
        .source(Source::new(
            FORECASTS,
            orrery_api::history::series::FORECAST_PREFIX.to_string(),
        ))
        .source(Source::new(
            BINDINGS,
            keys::prefix("multicluster.io", "resourcebindings", None),
        ))
        .source(Source::new(MIGRATIONS, keys::well_known::migrations(None)))
        .source(Source::new(
            DATASETS,
            data(orrery_api::data::DATASETS_PLURAL),
        ))
        .source(Source::new(
            DATATRANSFERS,
            keys::well_known::datatransfers(None),
        ))
        .trigger(wake_rx)
        .every(TICK)
        .fresh_first()
        .run(shutdown)
        .await;
}

/// How often time-driven work (retries for room, failover, shedding, consolidation) is
/// looked at, however busy the sources are.
const TICK: Duration = Duration::from_secs(1);

impl Scheduler {
    fn new(
        store: Arc<dyn Store>,
        settings: Settings,
        history_tx: mpsc::UnboundedSender<Vec<ScheduleEntry>>,
        wake_tx: mpsc::UnboundedSender<BKey>,
        runtime: crate::runtime::metrics::Handle,
    ) -> Scheduler {
        let engine = Engine {
            water_level_limit: settings.water_level_limit,
            weights: settings.weights,
            prediction: settings.prediction,
            shed_mark: settings.shed_mark,
            ..Engine::default()
        };
        Scheduler {
            store,
            settings,
            engine,
            filter_cache: FilterCache::new(),
            fleet: Fleet::default(),
            prints: HashMap::new(),
            heartbeats: HashMap::new(),
            cluster_revisions: HashMap::new(),
            bindings: HashMap::new(),
            bindings_listed: false,
            wake: Vec::new(),
            triggers: HashMap::new(),
            behind: HashSet::new(),
            wake_tx,
            shed: HashMap::new(),
            shed_ahead: HashMap::new(),
            consolidators: BTreeSet::new(),
            consolidating: HashSet::new(),
            last_consolidation: Instant::now(),
            backoff: Backoff::new(1_000, 60_000),
            room_epoch: 0,
            unplaced: HashMap::new(),
            writing: Default::default(),
            in_flight: HashMap::new(),
            deferred: HashMap::new(),
            chunk_in_flight: Vec::new(),
            round: None,
            moves: HashMap::new(),
            assume: AssumeCache::new(),
            hot_since: HashMap::new(),
            traffic_baseline: None,
            weights_told: None,
            last_shed: HashMap::new(),
            over_since: HashMap::new(),
            last_limit_shed: HashMap::new(),
            outlooks: HashMap::new(),
            forecast_moves: HashMap::new(),
            history: Vec::new(),
            history_tx,
            seq: 0,
            started: Instant::now(),
            runtime,
            graph: Default::default(),
            user_moves: HashMap::new(),
            unknown_moves: HashMap::new(),
            datasets: Default::default(),
            booked: HashMap::new(),
        }
    }

    /// Hands the keys woken since the last look to the loop.
    fn hand_over(&mut self, keys: &mut Keys<BKey>) {
        keys.extend(self.wake.drain(..));
    }

    /// Hands the keys woken outside `on_event` and `tick` to the loop, through its trigger.
    fn wake_loop(&mut self) {
        for k in self.wake.drain(..) {
            // Gone only when the controller is: nothing is left to wake then.
            let _ = self.wake_tx.send(k);
        }
    }
}

#[async_trait::async_trait]
impl Batch for Scheduler {
    type Key = BKey;
    type Error = String;

    fn on_event(&mut self, source: Origin, ev: Event, keys: &mut Keys<BKey>) {
        self.collect_writes();
        match source.name {
            CLUSTERS => self.on_cluster(ev),
            LEASES => self.on_lease(ev),
            FORECASTS => self.on_forecast(ev),
            MIGRATIONS => self.on_migration(ev),
            DATASETS => self.on_dataset(ev),
            DATATRANSFERS => self.on_transfer(ev),
            BINDINGS => self.on_binding(ev),
            _ => {}
        }
        self.hand_over(keys);
    }

    fn tick(&mut self, keys: &mut Keys<BKey>) {
        self.collect_writes();
        self.on_tick();
        self.hand_over(keys);
    }

    /// Decides a chunk; its writes run in the background (up to [`IN_FLIGHT`] chunks at once)
    /// while the next chunk is decided. A decision never fails as the loop counts failures:
    /// one that found no room waits for room ([`Scheduler::on_tick`]), one whose write lost is
    /// decided again once the write is over ([`Scheduler::written`]).
    async fn reconcile_batch(&mut self, keys: Vec<BKey>) -> Vec<(BKey, Result<Action, String>)> {
        self.collect_writes();
        self.decide_chunk(&keys).await;
        self.wake_loop();
        keys.into_iter().map(|k| (k, Ok(Action::Done))).collect()
    }

    fn batch_size(&self) -> usize {
        CHUNK
    }

    /// Higher `priority` first, namespaces in turn, retries for room behind fresh work.
    fn rank(&self, k: &BKey) -> Rank {
        Rank {
            priority: self.bindings.get(k).map_or(0, |b| priority_of(b)),
            group: k.0.clone(),
            behind: self.behind.contains(k),
        }
    }

    async fn idle(&mut self) {
        self.end_round().await;
        self.wake_loop();
    }

    /// What was decided is written before the controller stops.
    async fn stop(&mut self) {
        self.end_round().await;
    }
}

/// A binding that found no room at its last attempt.
struct Unplaced {
    /// When it is due to be tried again; none while it waits in the queue.
    retry_at: Option<Instant>,
    /// The room epoch that attempt saw, and when it was made.
    epoch: u64,
    at: Instant,
}

fn key_of(b: &Object) -> BKey {
    (b.namespace().to_string(), b.name().to_string())
}

fn priority_of(b: &Object) -> i32 {
    b.spec
        .as_ref()
        .and_then(|s| s.get("priority"))
        .and_then(serde_json::Value::as_i64)
        .unwrap_or(0) as i32
}

/// Whether the binding's last decision left replicas unplaced (`Scheduled=False`), read
/// without parsing.
fn found_no_room(b: &Object) -> bool {
    b.status
        .as_ref()
        .and_then(|s| s.get("conditions"))
        .and_then(serde_json::Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| {
            c.get("type").and_then(serde_json::Value::as_str) == Some(CONDITION_SCHEDULED)
                && c.get("status").and_then(serde_json::Value::as_str) == Some(conditions::FALSE)
        })
}

/// Whether the binding's Scheduled condition tells of a migration, read without parsing.
fn says_migrating(b: &Object) -> bool {
    b.status
        .as_ref()
        .and_then(|s| s.get("conditions"))
        .and_then(serde_json::Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| {
            c.get("type").and_then(serde_json::Value::as_str) == Some(CONDITION_SCHEDULED)
                && c.get("reason").and_then(serde_json::Value::as_str) == Some("Migrating")
        })
}

/// The earliest `keepUntil` of the binding's rescheduled evictions, read without parsing.
fn earliest_move(b: &Object) -> Option<i64> {
    let ev = b.spec.as_ref()?.get("evictions")?.as_array()?;
    ev.iter()
        .filter(|e| e.get("rescheduled").and_then(serde_json::Value::as_bool) == Some(true))
        .map(|e| {
            e.get("keepUntil")
                .and_then(serde_json::Value::as_str)
                .and_then(|t| t.parse::<Time>().ok())
                .map(|t| t.unix_seconds())
                .unwrap_or(0)
        })
        .min()
}

impl Scheduler {
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn enqueue(&mut self, k: BKey, why: Trigger) {
        if !self.bindings.contains_key(&k) {
            return;
        }
        self.triggers.entry(k.clone()).or_insert(why);
        if why == Trigger::Retry {
            self.behind.insert(k.clone());
        } else {
            self.behind.remove(&k);
        }
        self.wake.push(k);
    }

    /// Something happened that may make room for bindings that found none.
    fn room_changed(&mut self) {
        self.room_epoch += 1;
    }

    fn enqueue_all(&mut self, why: Trigger) {
        let keys: Vec<BKey> = self.bindings.keys().cloned().collect();
        for k in keys {
            self.enqueue(k, why);
        }
    }

    fn refresh_assumed(&mut self, clusters: &[String]) {
        for c in clusters {
            let t = self.assume.total(c);
            self.fleet.set_assumed(c, t);
        }
    }

    /// Counts what a binding has placed as assumed (at start).
    fn load_assumed(&mut self, k: &BKey, b: &Object, now: u64) -> Vec<String> {
        let Some(spec) = BindingSpec::of(b) else {
            return Vec::new();
        };
        if spec.clusters.is_empty() || spec.resource.is_task() {
            return Vec::new();
        }
        let request = spec
            .replica_requirements
            .as_ref()
            .map(|r| r.resource_request.clone())
            .unwrap_or_default();
        let bkey = format!("{}/{}", k.0, k.1);
        let changed = self.assume.load(
            &bkey,
            demand_of(&request),
            &spec.clusters,
            orrery_api::interpret::counts_pods(&spec.resource.kind),
            now,
        );
        self.observe_pods(k, b);
        changed
    }

    /// Takes in the pods the members report for a binding's workload, while some of its
    /// replicas are assumed.
    fn observe_pods(&mut self, k: &BKey, b: &Object) {
        let bkey = format!("{}/{}", k.0, k.1);
        if !self.assume.has(&bkey) {
            return;
        }
        let kind = b
            .spec
            .as_ref()
            .and_then(|s| s.get("resource"))
            .and_then(|r| r.get("kind"))
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default()
            .to_string();
        let now = self.now_ms();
        for item in BindingStatus::of(b).aggregated_status {
            if let Some(pods) = item
                .status
                .as_ref()
                .and_then(|st| orrery_api::interpret::pods_reported(&kind, st))
            {
                self.assume.observe(&bkey, &item.cluster_name, pods, now);
            }
        }
    }

    /// The member of `cluster` reported figures measured at `at` (a status write, or a Lease
    /// renewal vouching for the last one): assumptions they include are confirmed.
    fn reported(&mut self, cluster: &str, at: MicroTime) {
        if self.heartbeats.get(cluster).is_some_and(|old| *old >= at) {
            return;
        }
        self.heartbeats.insert(cluster.to_string(), at);
        // Heartbeat times are wall-clock; assumptions are stamped on our monotonic clock:
        // compare by age (a time ahead of ours counts as now).
        let age_ms = MicroTime::now().millis_since(at).max(0) as u64;
        let measured = self.now_ms().saturating_sub(age_ms);
        let confirmed = self.assume.confirm(
            cluster,
            measured,
            ASSUME_MARGIN.as_millis() as u64,
            self.settings.assume_settle.as_millis() as u64,
        );
        if !confirmed.is_empty() {
            self.refresh_assumed(&confirmed);
            self.room_changed();
        }
    }

    /// A Cluster changed: the fleet the engine reads, and a decision for every binding when a
    /// fact placement depends on changed.
    fn on_cluster(&mut self, ev: Event) {
        // Whether a fact placement depends on changed, and whether a cluster came
        // back to Ready.
        let (changed, recovered) = match ev {
            Event::Listed(items) => {
                let snaps: Vec<ClusterSnapshot> = items
                    .iter()
                    .map(|c| self.with_bookings(ClusterSnapshot::of(c)))
                    .collect();
                self.prints = snaps
                    .iter()
                    .map(|s| (s.name.clone(), fingerprint(s)))
                    .collect();
                self.fleet = Fleet::new(snaps);
                let names: Vec<String> = self.prints.keys().cloned().collect();
                self.refresh_assumed(&names);
                for n in &names {
                    self.fleet.set_outlook(n, self.outlooks.get(n).cloned());
                }
                self.room_changed();
                (true, false)
            }
            Event::Upsert(c) => {
                let s = self.with_bookings(ClusterSnapshot::of(&c));
                // Read alone: parsing the whole status again cost more.
                let hb = c.status.as_ref().and_then(|st| {
                    st.get("lastHeartbeatTime")?
                        .as_str()?
                        .parse::<MicroTime>()
                        .ok()
                });
                if let Some(rv) = c.revision() {
                    self.cluster_revisions.insert(c.name().to_string(), rv);
                }
                let name = s.name.clone();
                // Back to Ready is not enough: the health controller lifts its taints
                // in a later update, and a placement decided before that still passes
                // the cluster over.
                let was_serving = self.fleet.get(&name).is_some_and(serving);
                let recovered = serving(&s) && !was_serving;
                let print = fingerprint(&s);
                let changed = self.prints.insert(name.clone(), print) != Some(print);
                if self.fleet.get(&name).is_none_or(|old| {
                    (
                        &old.allocatable,
                        &old.allocated,
                        &old.usage,
                        &old.largest_node_free,
                    ) != (&s.allocatable, &s.allocated, &s.usage, &s.largest_node_free)
                }) {
                    self.room_changed();
                }
                self.fleet.upsert(s);
                // A cluster new to the fleet gets the forecast that came before it.
                self.fleet
                    .set_outlook(&name, self.outlooks.get(&name).cloned());
                if let Some(hb) = hb {
                    self.reported(&name, hb);
                }
                (changed, recovered)
            }
            Event::Delete(c) => {
                self.fleet.remove(c.name());
                self.prints.remove(c.name());
                self.heartbeats.remove(c.name());
                self.cluster_revisions.remove(c.name());
                (true, false)
            }
        };
        if changed {
            self.backoff.clear();
            self.enqueue_all(if recovered && self.bindings_listed {
                Trigger::Recovered
            } else {
                Trigger::ClustersChanged
            });
        }
    }

    /// A member's Lease was renewed: the figures it last reported are vouched for.
    fn on_lease(&mut self, ev: Event) {
        let leases = match ev {
            Event::Listed(items) => items,
            Event::Upsert(l) => vec![l],
            Event::Delete(_) => Vec::new(),
        };
        for l in leases {
            let beat = orrery_api::cluster::LeaseBeat::of(&l);
            // Only a renewal over the status this scheduler has seen vouches for
            // figures it holds (the Lease's watch may run ahead of the Clusters').
            if let (Some(renew), Some(rev)) = (beat.renew_time, beat.status_revision)
                && self
                    .cluster_revisions
                    .get(l.name())
                    .is_some_and(|seen| *seen >= rev)
            {
                self.reported(l.name(), renew);
            }
        }
    }

    /// A binding changed: kept, and decided again.
    fn on_binding(&mut self, ev: Event) {
        match ev {
            Event::Listed(items) => {
                self.bindings.clear();
                // Everything is loaded and queued afresh: what was in flight is
                // assumed again from what the store holds.
                self.in_flight.clear();
                self.deferred.clear();
                self.consolidators.clear();
                self.moves.clear();
                self.graph.clear_bindings();
                let now = self.now_ms();
                let mut touched = Vec::new();
                for b in items {
                    let k = key_of(&b);
                    if let Some(t) = earliest_move(&b) {
                        self.moves.insert(k.clone(), t);
                    }
                    // What is placed now counts as assumed until the members' figures
                    // are known to include it (nothing is known of that at start).
                    touched.extend(self.load_assumed(&k, &b, now));
                    // A binding that found no room before is tried again: its generation
                    // is already observed, and when to retry it was not kept (without
                    // this, a partial placement decided just before a restart stayed
                    // partial however much room was made).
                    let why = if found_no_room(&b) {
                        Trigger::Retry
                    } else {
                        Trigger::Binding
                    };
                    self.graph.put(&k, Some(&b));
                    if consolidates(&b) {
                        self.consolidators.insert(k.clone());
                    }
                    self.bindings.insert(k.clone(), b);
                    self.enqueue(k, why);
                }
                let bindings = &self.bindings;
                self.consolidating.retain(|k| bindings.contains_key(k));
                self.refresh_assumed(&touched);
            }
            Event::Upsert(b) => {
                let k = key_of(&b);
                match earliest_move(&b) {
                    Some(t) => self.moves.insert(k.clone(), t),
                    None => self.moves.remove(&k),
                };
                self.observe_pods(&k, &b);
                let served = self.bindings.get(&k).map(|old| self.graph.serving(old));
                self.graph.put(&k, Some(&b));
                let moved = served.is_some_and(|s| s != self.graph.serving(&b));
                if consolidates(&b) {
                    self.consolidators.insert(k.clone());
                } else {
                    self.consolidators.remove(&k);
                }
                self.bindings.insert(k.clone(), b);
                self.enqueue(k.clone(), Trigger::Binding);
                if moved {
                    self.enqueue_dependents(&k);
                }
            }
            Event::Delete(b) => {
                let k = key_of(&b);
                self.graph.put(&k, None);
                self.enqueue_dependents(&k);
                self.bindings.remove(&k);
                self.consolidators.remove(&k);
                self.consolidating.remove(&k);
                self.moves.remove(&k);
                self.forecast_moves.remove(&k);
                self.shed.remove(&k);
                self.shed_ahead.remove(&k);
                self.unplaced.remove(&k);
                self.backoff.reset(&k);
                self.in_flight.remove(&k);
                self.deferred.remove(&k);
                let changed = self.assume.forget(&format!("{}/{}", k.0, k.1));
                if !changed.is_empty() {
                    self.refresh_assumed(&changed);
                    self.room_changed();
                }
            }
        }
    }

    /// A cluster's forecast was made (or went with its cluster): decisions from now on read
    /// it, and bindings waiting for room may find some (nothing else is decided again).
    fn on_forecast(&mut self, ev: Event) {
        let outlook = |o: &Object| -> Option<(String, Arc<Outlook>)> {
            let f: orrery_api::history::series::ClusterForecast =
                serde_json::from_value(o.spec.clone()?).ok()?;
            Some((f.cluster.clone(), Arc::new(Outlook::of(&f)?)))
        };
        match ev {
            Event::Listed(items) => {
                self.outlooks = items.iter().filter_map(|o| outlook(o)).collect();
                let names: Vec<String> = self
                    .fleet
                    .clusters()
                    .iter()
                    .map(|c| c.name.clone())
                    .collect();
                for n in names {
                    self.fleet.set_outlook(&n, self.outlooks.get(&n).cloned());
                }
            }
            Event::Upsert(o) => match outlook(&o) {
                Some((name, out)) => {
                    self.fleet.set_outlook(&name, Some(out.clone()));
                    self.outlooks.insert(name, out);
                }
                None => {
                    self.outlooks.remove(o.name());
                    self.fleet.set_outlook(o.name(), None);
                }
            },
            Event::Delete(o) => {
                self.outlooks.remove(o.name());
                self.fleet.set_outlook(o.name(), None);
            }
        }
        self.room_changed();
    }

    /// A data set copy started, progressed or ended: the links it books are the fleet's
    /// `busy_*_seconds` for the next decisions (nothing is decided again for it).
    fn on_transfer(&mut self, ev: Event) {
        let booking = |t: &Object| -> Option<(String, String, f64)> {
            let st = orrery_api::data::DataTransferStatus::of(t);
            if st.phase != orrery_api::data::TransferPhase::Copying {
                return None;
            }
            let dest = t.spec.as_ref()?.get("destination")?.as_str()?.to_string();
            Some((st.source, dest, (st.bytes - st.copied_bytes).max(0) as f64))
        };
        let mut touched: Vec<String> = Vec::new();
        let mut put = |s: &mut Scheduler, k: (String, String), b: Option<(String, String, f64)>| {
            let old = match b {
                Some(b) => {
                    touched.extend([b.0.clone(), b.1.clone()]);
                    s.booked.insert(k, b)
                }
                None => s.booked.remove(&k),
            };
            if let Some(o) = old {
                touched.extend([o.0, o.1]);
            }
        };
        match ev {
            Event::Listed(items) => {
                let keys: Vec<(String, String)> = self.booked.keys().cloned().collect();
                for k in keys {
                    put(self, k, None);
                }
                for t in &items {
                    put(
                        self,
                        (t.namespace().to_string(), t.name().to_string()),
                        booking(t),
                    );
                }
            }
            Event::Upsert(t) => {
                put(
                    self,
                    (t.namespace().to_string(), t.name().to_string()),
                    booking(&t),
                );
            }
            Event::Delete(t) => put(
                self,
                (t.namespace().to_string(), t.name().to_string()),
                None,
            ),
        }
        touched.sort();
        touched.dedup();
        for name in touched {
            if let Some(c) = self.fleet.get(&name).cloned() {
                let c = self.with_bookings(c);
                self.fleet.upsert(c);
            }
        }
    }

    /// A cluster's snapshot with the seconds its link needs for the copies booked on it.
    fn with_bookings(&self, mut c: ClusterSnapshot) -> ClusterSnapshot {
        let bandwidth = c
            .bandwidth
            .filter(|b| *b > 0)
            .map_or(orrery_scheduler::data::DEFAULT_BANDWIDTH, |b| b as f64);
        let (mut out, mut inn) = (0.0, 0.0);
        for (source, dest, bytes) in self.booked.values() {
            if *source == c.name {
                out += bytes;
            }
            if *dest == c.name {
                inn += bytes;
            }
        }
        c.busy_out_seconds = out / bandwidth;
        c.busy_in_seconds = inn / bandwidth;
        c
    }

    /// A data set changed: the workloads reading it are decided again (those placed stay
    /// where they are unless a filter now turns their cluster away).
    fn on_dataset(&mut self, ev: Event) {
        let changed: Vec<(String, String)> = match ev {
            Event::Listed(items) => {
                self.datasets.clear();
                for d in &items {
                    self.datasets.put(d);
                }
                return;
            }
            Event::Upsert(d) => {
                if !self.datasets.put(&d) {
                    return;
                }
                vec![(d.namespace().to_string(), d.name().to_string())]
            }
            Event::Delete(d) => {
                let k = (d.namespace().to_string(), d.name().to_string());
                self.datasets.remove(&k);
                vec![k]
            }
        };
        let readers: Vec<BKey> = self
            .bindings
            .iter()
            .filter(|(k, b)| {
                BindingSpec::of(b).is_some_and(|s| {
                    changed
                        .iter()
                        .any(|(ns, n)| *ns == k.0 && s.data.datasets.contains(n))
                })
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in readers {
            self.triggers.insert(k.clone(), Trigger::DataChanged);
            self.enqueue(k, Trigger::DataChanged);
        }
    }

    /// The workloads whose decisions depend on where `k` serves are decided again.
    fn enqueue_dependents(&mut self, k: &BKey) {
        for d in self.graph.dependents(k) {
            self.triggers.insert(d.clone(), Trigger::LeaderMoved);
            self.enqueue(d, Trigger::LeaderMoved);
        }
    }

    fn on_migration(&mut self, ev: Event) {
        let put = |s: &mut Scheduler, m: &Object| {
            let mk = (m.namespace().to_string(), m.name().to_string());
            let mut state = super::stateful::MoveState::of(m);
            if state.binding.is_empty()
                && let Ok(spec) = orrery_api::stateful::migration_spec(m.spec.as_ref())
            {
                state.binding = binding::name_for(&spec.resource.kind, &spec.resource.name);
            }
            let bk = (mk.0.clone(), state.binding.clone());
            use orrery_api::stateful::MigrationPhase;
            let serves_at_target = |p: MigrationPhase| p >= MigrationPhase::Switching;
            // Where the workload serves changed (or a move first seen serves already).
            let crossed = match s.graph.migrations.get(&mk) {
                Some(old) => {
                    serves_at_target(old.phase) != serves_at_target(state.phase)
                        || old.phase.is_done() != state.phase.is_done()
                }
                None => serves_at_target(state.phase),
            };
            let needs_target = state.needs_target;
            s.graph.migrations.insert(mk.clone(), state);
            if crossed {
                // What follows it decides again, and so does the binding itself once its
                // move is over.
                s.enqueue_dependents(&bk);
                s.triggers.insert(bk.clone(), Trigger::MoveDone);
                s.enqueue(bk.clone(), Trigger::MoveDone);
            }
            if needs_target {
                s.user_moves.insert(bk.clone(), Arc::new(m.clone()));
                s.triggers.insert(bk.clone(), Trigger::UserMove);
                s.enqueue(bk, Trigger::UserMove);
            } else if s.user_moves.get(&bk).is_some_and(|u| u.name() == mk.1) {
                s.user_moves.remove(&bk);
            }
        };
        match ev {
            Event::Listed(items) => {
                self.graph.migrations.clear();
                for m in &items {
                    put(self, m);
                }
            }
            Event::Upsert(m) => put(self, &m),
            Event::Delete(m) => {
                let mk = (m.namespace().to_string(), m.name().to_string());
                if let Some(state) = self.graph.migrations.remove(&mk) {
                    let bk = (mk.0.clone(), state.binding);
                    if self.user_moves.get(&bk).is_some_and(|u| u.name() == mk.1) {
                        self.user_moves.remove(&bk);
                    }
                    self.enqueue_dependents(&bk);
                    self.triggers.insert(bk.clone(), Trigger::MoveDone);
                    self.enqueue(bk, Trigger::MoveDone);
                }
            }
        }
    }

    /// Once a second: retries that are due, failover, tolerations running out, stale
    /// assumptions, hot clusters, old copies of moved replicas.
    fn on_tick(&mut self) {
        let now = Instant::now();
        // Once something that may make room changed, a binding waiting for room is tried
        // again within a second while few wait, not only when its backoff runs out: a
        // decision already due must not wait a minute (a restart in between would make it
        // at once, and look like the restart's doing). Many waiting share a budget.
        let spacing = Duration::from_millis(
            (self.unplaced.len() as u64 * 1000 / RETRIES_PER_SECOND).clamp(1_000, 60_000),
        );
        let epoch = self.room_epoch;
        let due: Vec<BKey> = self
            .unplaced
            .iter()
            .filter(|(_, u)| {
                u.retry_at.is_some_and(|t| {
                    t <= now || (u.epoch != epoch && now.duration_since(u.at) >= spacing)
                })
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in due {
            let Some(u) = self.unplaced.get_mut(&k) else {
                continue;
            };
            // Retried only if something may have made room since it failed: a saturated
            // fleet is not asked the same question again and again.
            if u.epoch != self.room_epoch || now.duration_since(u.at) >= RETRY_ANYWAY {
                u.retry_at = None;
                self.enqueue(k, Trigger::Retry);
            } else {
                u.retry_at = Some(now + Duration::from_millis(self.backoff.fail(&k)));
            }
        }
        self.check_failover();
        let wall = Time::now().unix_seconds();
        let moved: Vec<BKey> = self
            .moves
            .iter()
            .filter(|(_, t)| **t <= wall)
            .map(|(k, _)| k.clone())
            .collect();
        for k in moved {
            self.enqueue(k, Trigger::Cleanup);
        }
        // Clusters with a NoExecute taint: a toleration with tolerationSeconds may have run out.
        let tainted: HashSet<String> = self
            .fleet
            .clusters()
            .iter()
            .filter(|c| c.taints.iter().any(|t| t.effect.as_str() == "NoExecute"))
            .map(|c| c.name.clone())
            .collect();
        if !tainted.is_empty() {
            let on: Vec<BKey> = self
                .bindings
                .iter()
                .filter(|(_, b)| placed_on(b).iter().any(|c| tainted.contains(c)))
                .map(|(k, _)| k.clone())
                .collect();
            for k in on {
                self.enqueue(k, Trigger::ClustersChanged);
            }
        }
        let changed = self
            .assume
            .expire(self.now_ms(), self.settings.assume_ttl.as_millis() as u64);
        if !changed.is_empty() {
            self.refresh_assumed(&changed);
            self.room_changed();
        }
        self.check_hot(now);
        self.check_consolidation(now);
        self.adjust_weights();
    }

    /// Every `consolidate_every`, up to `consolidate_per_round` of the bindings whose
    /// placement consolidates are decided again to move replicas onto cheaper clusters. With
    /// more than a round holds, rounds take them in slices of the key order chosen by the wall
    /// clock, so a restart (or a new leader) goes on with the slice it would have taken. The
    /// controller's start counts as a round: a restart moves nothing sooner than it would have.
    fn check_consolidation(&mut self, now: Instant) {
        if now.duration_since(self.last_consolidation) < self.settings.consolidate_every {
            return;
        }
        self.last_consolidation = now;
        let per = self.settings.consolidate_per_round.max(1);
        let slices = self.consolidators.len().div_ceil(per).max(1) as u64;
        let every = self.settings.consolidate_every.as_secs().max(1);
        let slice = (Time::now().unix_seconds().max(0) as u64 / every) % slices;
        let round: Vec<BKey> = self
            .consolidators
            .iter()
            .skip(slice as usize * per)
            .take(per)
            .cloned()
            .collect();
        if !round.is_empty() {
            tracing::debug!(
                bindings = round.len(),
                slice,
                slices,
                "a round of consolidation"
            );
        }
        for k in round {
            self.consolidating.insert(k.clone());
            self.enqueue(k, Trigger::Consolidate);
        }
    }

    /// Draft 7.3.3: the score weights follow monitoring. The fleet's traffic is compared with
    /// its usual level (an average over about 15 minutes); a surge raises the network weight
    /// ([`orrery_scheduler::Weights::adjusted`]).
    fn adjust_weights(&mut self) {
        const SMOOTHING: f64 = 1.0 / 900.0;
        let traffic: f64 = self.fleet.facts().iter().map(|f| f.traffic).sum();
        let baseline = match self.traffic_baseline {
            Some(b) => b + (traffic - b) * SMOOTHING,
            None => traffic,
        };
        self.traffic_baseline = Some(baseline);
        let weights = self.settings.weights.adjusted(&orrery_scheduler::Signals {
            traffic,
            traffic_baseline: baseline,
        });
        if weights != self.engine.weights {
            // The weight follows the traffic continuously: only a step of a tenth or more
            // from what was last told is worth a line at info level.
            let told = self.weights_told.unwrap_or(self.settings.weights.network);
            if (weights.network - told).abs() >= 0.1 * told.abs().max(0.1) {
                self.weights_told = Some(weights.network);
                tracing::info!(
                    network_weight = weights.network,
                    traffic,
                    baseline,
                    "score weights adjusted to the fleet's traffic"
                );
            } else {
                tracing::debug!(
                    network_weight = weights.network,
                    traffic,
                    baseline,
                    "score weights adjusted"
                );
            }
            self.engine.weights = weights;
            self.room_changed();
        }
    }

    /// Clusters above the shed mark for a whole window shed replicas of a few bindings; so do
    /// clusters whose forecast (its mean) crosses the mark within the horizon and stays above
    /// it for a window, ahead of the peak. Bindings that consolidate onto cheaper clusters are
    /// held under the limit by moving: the same rules at the limit shed theirs.
    fn check_hot(&mut self, now: Instant) {
        let mark = self.settings.shed_mark.max(self.settings.water_level_limit);
        self.shed_rule(now, mark, false);
        if self.consolidators.is_empty() {
            // Nobody is shed at the limit: what was seen above it is not kept for later.
            self.over_since.clear();
        } else {
            self.shed_rule(now, self.settings.water_level_limit, true);
        }
    }

    /// One shed rule: at `mark`, of every binding divided by water level, or (`consolidating`)
    /// of those that consolidate only, with its own record of when clusters went above it.
    fn shed_rule(&mut self, now: Instant, mark: f64, consolidating: bool) {
        let mut due = Vec::new();
        let wall = Time::now();
        let mut ahead: Vec<(String, orrery_scheduler::Crossing)> = Vec::new();
        // A cluster is shed ahead at most once a window (no longer than the horizon, which is
        // all a forecast confirms); the controller's start counts as a shed, since the last
        // one before it is not remembered: a restart sheds nothing sooner than it would have.
        let ahead_window = self.settings.shed_window.min(Duration::from_secs(
            self.settings.prediction.horizon_seconds.max(0) as u64,
        ));
        let (hot_since, last_shed) = if consolidating {
            (&mut self.over_since, &mut self.last_limit_shed)
        } else {
            (&mut self.hot_since, &mut self.last_shed)
        };
        for (c, f) in self.fleet.clusters().iter().zip(self.fleet.facts()) {
            let last = last_shed.get(&c.name).copied().unwrap_or(self.started);
            if f.known()
                && f.level() <= mark
                && now.duration_since(last) >= ahead_window
                && let Some(x) = f.crossing(
                    wall.unix_seconds(),
                    self.settings.prediction.horizon_seconds,
                    mark,
                    self.settings.shed_window.as_secs() as i64,
                )
            {
                ahead.push((c.name.clone(), x));
            }
            if f.known() && f.level() > mark {
                let since = *hot_since.entry(c.name.clone()).or_insert(now);
                let last = last_shed.get(&c.name).copied();
                if now.duration_since(since) >= self.settings.shed_window
                    && last.is_none_or(|l| now.duration_since(l) >= self.settings.shed_window)
                {
                    due.push(c.name.clone());
                }
            } else {
                hot_since.remove(&c.name);
            }
        }
        let which = |spec: &BindingSpec| !consolidating || spec_consolidates(spec);
        let what = if consolidating {
            "the limit"
        } else {
            "the shed mark"
        };
        for c in due {
            self.last_shed_at(consolidating).insert(c.clone(), now);
            let on = self.most_replicas_on(&c, consolidating, which);
            if on.is_empty() && consolidating {
                continue;
            }
            tracing::info!(cluster = %c, bindings = on.len(), mark, "a cluster above {what} sheds replicas");
            for k in on {
                self.shed.entry(k.clone()).or_default().push(c.clone());
                self.triggers.insert(k.clone(), Trigger::Shed);
                self.enqueue(k, Trigger::Shed);
            }
        }
        for (c, x) in ahead {
            // Of those that judge clusters by their forecast (a placement that looks no time
            // ahead keeps its replicas).
            let default = self.settings.prediction;
            let on = self.most_replicas_on(&c, consolidating, |spec| {
                which(spec)
                    && spec
                        .placement
                        .prediction
                        .as_ref()
                        .is_none_or(|p| !p.resolve(default).is_off())
            });
            if on.is_empty() {
                // The limit's rule looks again a window later, not at every tick.
                if consolidating {
                    self.last_shed_at(consolidating).insert(c.clone(), now);
                }
                continue;
            }
            self.last_shed_at(consolidating).insert(c.clone(), now);
            let outlook = self.outlooks.get(&c);
            let trigger = ForecastTrigger {
                cluster: c.clone(),
                dimension: orrery_scheduler::DIMENSIONS[x.dimension].to_string(),
                level: (x.level * 1000.0).round() / 1000.0,
                forecast: (x.peak * 1000.0).round() / 1000.0,
                crosses_at: Time::from_unix_seconds(x.at).unwrap_or(wall),
                mark,
                basis: Ahead {
                    bound: orrery_api::prediction::Bound::Mean,
                    ..self.settings.prediction
                }
                .describe(),
                model: outlook
                    .map(|o| o.models[x.dimension].clone())
                    .unwrap_or_default(),
                made_at: outlook
                    .and_then(|o| Time::from_unix_seconds(o.time))
                    .unwrap_or(wall),
            };
            tracing::info!(
                cluster = %c,
                bindings = on.len(),
                dimension = %trigger.dimension,
                level = trigger.level,
                forecast = trigger.forecast,
                crosses_at = %trigger.crosses_at,
                mark,
                "a cluster's forecast crosses {what}: replicas move ahead of the peak"
            );
            for k in on {
                self.shed_ahead
                    .entry(k.clone())
                    .or_default()
                    .push(c.clone());
                self.forecast_moves.insert(k.clone(), trigger.clone());
                // A cluster above the mark now says more than one about to cross it.
                if self.triggers.get(&k) != Some(&Trigger::Shed) {
                    self.triggers.insert(k.clone(), Trigger::Forecast);
                }
                self.enqueue(k, Trigger::Forecast);
            }
        }
    }

    /// When each cluster last shed, by the shed mark or (`consolidating`) by the limit.
    fn last_shed_at(&mut self, consolidating: bool) -> &mut HashMap<String, Instant> {
        if consolidating {
            &mut self.last_limit_shed
        } else {
            &mut self.last_shed
        }
    }

    /// The bindings a cluster sheds: of those divided by water level that run replicas there
    /// and that `also` keeps, the `shed_per_window` with the most replicas there.
    /// `consolidating`: of the bindings that consolidate only (the others are not read).
    fn most_replicas_on(
        &self,
        cluster: &str,
        consolidating: bool,
        also: impl Fn(&BindingSpec) -> bool,
    ) -> Vec<BKey> {
        let bindings: Box<dyn Iterator<Item = (&BKey, &Arc<Object>)>> = if consolidating {
            Box::new((self.consolidators.iter()).filter_map(|k| Some((k, self.bindings.get(k)?))))
        } else {
            Box::new(self.bindings.iter())
        };
        let mut on: Vec<(i64, BKey)> = bindings
            .filter_map(|(k, b)| {
                let spec = BindingSpec::of(b)?;
                let n = spec.clusters.iter().find(|t| t.name == cluster)?.replicas;
                (n > 0 && sheddable(&spec) && also(&spec)).then(|| (n, k.clone()))
            })
            .collect();
        on.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        on.truncate(self.settings.shed_per_window);
        on.into_iter().map(|(_, k)| k).collect()
    }

    /// Marks applications that stayed unhealthy in a cluster past their toleration.
    fn check_failover(&mut self) {
        let now = Time::now();
        let mut due = Vec::new();
        for (k, b) in &self.bindings {
            if b.spec.as_ref().is_none_or(|s| s.get("failover").is_none()) {
                continue;
            }
            let Some(spec) = BindingSpec::of(b) else {
                continue;
            };
            let Some(f) = &spec.failover else { continue };
            let tolerate = f
                .decision_conditions
                .toleration_seconds
                .unwrap_or(DEFAULT_FAILOVER_TOLERATION_SECONDS);
            let st = BindingStatus::of(b);
            if st
                .aggregated_status
                .iter()
                .any(|a| unhealthy_for(a, now) >= Some(tolerate))
                && spec
                    .clusters
                    .iter()
                    .any(|c| !spec.evictions.iter().any(|e| e.cluster == c.name))
            {
                due.push(k.clone());
            }
        }
        for k in due {
            self.enqueue(k, Trigger::Failover);
        }
    }

    /// Decides one chunk of what waits in the queue; its writes run while the next chunk is
    /// decided (a few chunks in flight at most).
    async fn decide_chunk(&mut self, keys: &[BKey]) {
        let round = self.round.get_or_insert_with(|| (0, Instant::now()));
        round.0 += keys.len();
        // The loop's depth before this chunk was taken out of it.
        self.settings
            .metrics
            .queue_depth
            .set(self.runtime.depth.get());
        let mut jobs: Vec<Job<BKey>> = Vec::new();
        let mut failed: Vec<(BKey, u64)> = Vec::new();
        for k in keys {
            let k = k.clone();
            self.behind.remove(&k);
            let why = self.triggers.remove(&k).unwrap_or(Trigger::Binding);
            if self.in_flight.contains_key(&k) {
                // Its shed lists and consolidation wait with it.
                self.deferred.entry(k).or_insert(why);
                continue;
            }
            let shed = self.shed.remove(&k).unwrap_or_default();
            let ahead = self.shed_ahead.remove(&k).unwrap_or_default();
            // Consolidated only when a round asked first: whatever else woke it decides as
            // it would have.
            let consolidate = self.consolidating.remove(&k)
                && why == Trigger::Consolidate
                && self.consolidators.contains(&k);
            match self.reconcile(&k, why, &shed, &ahead, consolidate) {
                Outcome::Skip => {}
                Outcome::Write(j) => {
                    self.backoff.reset(&k);
                    self.unplaced.remove(&k);
                    jobs.push(j);
                }
                Outcome::Unschedulable(j) => {
                    // The room epoch as this decision saw it.
                    failed.push((k.clone(), self.room_epoch));
                    if let Some(j) = j {
                        jobs.push(j);
                    }
                }
            }
        }
        let now = Instant::now();
        for (k, epoch) in failed {
            let wait = self.backoff.fail(&k);
            let retry_at = Some(now + Duration::from_millis(wait));
            self.unplaced.insert(
                k,
                Unplaced {
                    retry_at,
                    epoch,
                    at: now,
                },
            );
        }
        if self.writing.len() >= IN_FLIGHT
            && let Some(h) = self.writing.pop_front()
        {
            self.written(h.await.unwrap_or_default());
        }
        let history = std::mem::take(&mut self.history);
        let history_tx = self.history_tx.clone();
        let in_flight = std::mem::take(&mut self.chunk_in_flight);
        // Store conflicts: the binding changed under us; its update event queues it again.
        self.writing.push_back(tokio::spawn(async move {
            let failed = run_jobs(jobs).await;
            // The history tells of decisions that were written, not of those that lost.
            let landed: Vec<ScheduleEntry> = history
                .into_iter()
                .filter(|(k, _)| !failed.contains(k))
                .map(|(_, e)| e)
                .collect();
            if !landed.is_empty() {
                let _ = history_tx.send(landed);
            }
            in_flight
                .into_iter()
                .map(|(k, seq)| {
                    let lost = failed.contains(&k);
                    (k, seq, lost)
                })
                .collect()
        }));
    }

    /// Takes in the chunks whose writes are over, without waiting for the others.
    fn collect_writes(&mut self) {
        while self.writing.front().is_some_and(|h| h.is_finished()) {
            if let Some(h) = self.writing.pop_front() {
                // Finished: its result is there without waiting.
                let writes = h.now_or_never().and_then(Result::ok).unwrap_or_default();
                self.written(writes);
            }
        }
    }

    /// A chunk's writes are over: a decision whose write failed gives back what it assumed
    /// and is decided again; bindings woken meanwhile are queued.
    fn written(&mut self, writes: Vec<Written>) {
        for (k, seq, lost) in writes {
            if self.in_flight.get(&k).is_none_or(|f| f.seq != seq) {
                continue;
            }
            let Some(f) = self.in_flight.remove(&k) else {
                continue;
            };
            if lost && self.bindings.contains_key(&k) {
                let changed = self.assume.restore(&format!("{}/{}", k.0, k.1), f.before);
                self.refresh_assumed(&changed);
                self.room_changed();
                // A conflict's update event queues it too; another failure queues nothing.
                self.enqueue(k.clone(), f.why);
            }
            if let Some(why) = self.deferred.remove(&k) {
                self.enqueue(k, why);
            }
        }
    }

    /// The queue is empty: the round's writes are waited for.
    async fn end_round(&mut self) {
        for h in std::mem::take(&mut self.writing) {
            self.written(h.await.unwrap_or_default());
        }
        if let Some((n, started)) = self.round.take() {
            self.settings.metrics.queue_depth.set(0);
            super::log_round("scheduling", n, started);
        }
    }

    fn reconcile(
        &mut self,
        k: &BKey,
        why: Trigger,
        shed: &[String],
        shed_ahead: &[String],
        consolidate: bool,
    ) -> Outcome {
        let Some(b) = self.bindings.get(k).cloned() else {
            return Outcome::Skip;
        };
        if b.metadata.deletion_timestamp.is_some() {
            return Outcome::Skip;
        }
        // A user's Migration waiting for its target, whatever woke the binding: it stays
        // waiting until its status names the target. A write that lost a race is tried
        // again, and so is one cut short by a restart after the binding named it but before
        // the Migration got its target (deciding again only rewrites the same names; the
        // target is written to the Migration once).
        if let Some(m) = self.user_moves.get(k).cloned() {
            return self.user_move(k, &b, &m);
        }
        // A binding being moved is left to its migration until the move is over; one that
        // names a migration not seen yet waits for it (its event may be on its way), unless
        // that migration never comes.
        if self.graph.moving(&b).is_some() {
            return Outcome::Skip;
        }
        if self.graph.names_unknown(&b) {
            let since = *self
                .unknown_moves
                .entry(k.clone())
                .or_insert_with(Instant::now);
            if since.elapsed() < UNKNOWN_MOVE_WAIT {
                return Outcome::Unschedulable(None);
            }
        } else {
            self.unknown_moves.remove(k);
        }
        let generation = b.metadata.generation.unwrap_or(1);
        // Decided for this generation already, and nothing else asks for a decision: skip
        // without parsing (the binding controller's status writes land here).
        let observed = b
            .status
            .as_ref()
            .and_then(|s| s.get("schedulerObservedGeneration"))
            .and_then(serde_json::Value::as_i64);
        // A fresh decision someone asked for (`POST /api/v1/bindings`), not yet answered.
        let requested = b
            .metadata
            .annotations
            .get(binding::RESCHEDULE_ANNOTATION)
            .filter(|v| {
                b.status
                    .as_ref()
                    .and_then(|s| s.get("rescheduleObserved"))
                    .and_then(serde_json::Value::as_str)
                    != Some(v.as_str())
            })
            .cloned();
        let why = if requested.is_some() {
            Trigger::Requested
        } else if why == Trigger::Binding && says_migrating(&b) {
            // Its status still tells of a move that is over (level-based: whatever woke it).
            Trigger::MoveDone
        } else {
            why
        };
        if why == Trigger::Binding && observed == Some(generation) {
            return Outcome::Skip;
        }
        // Read in place: copying the spec's JSON first cost as much as reading it.
        let mut spec = match b.spec.as_ref().map(BindingSpec::deserialize) {
            Some(Ok(s)) => s,
            other => {
                let error = match other {
                    Some(Err(e)) => e.to_string(),
                    _ => "no spec".into(),
                };
                tracing::warn!(namespace = %k.0, binding = %k.1, %error, "a ResourceBinding that cannot be read is not scheduled");
                return Outcome::Skip;
            }
        };
        if !orrery_api::policy::is_orrery_scheduler(&spec.scheduler_name) {
            // As Karmada's scheduler: another scheduler's binding is not ours to decide.
            let msg = format!(
                "left to the scheduler {:?} that the policy names in spec.schedulerName",
                spec.scheduler_name
            );
            return Outcome::Write(self.write_condition(k, &b, "OtherScheduler", msg));
        }
        let mut status = BindingStatus::of(&b);
        let old_evictions = spec.evictions.clone();
        let now = Time::now();
        // Failover: an application unhealthy past its toleration leaves that cluster.
        let mut evicted_now = Vec::new();
        if let Some(f) = &spec.failover {
            let tolerate = f
                .decision_conditions
                .toleration_seconds
                .unwrap_or(DEFAULT_FAILOVER_TOLERATION_SECONDS);
            for a in &status.aggregated_status {
                let placed = spec.clusters.iter().any(|c| c.name == a.cluster_name);
                let already = spec
                    .evictions
                    .iter()
                    .any(|e| e.cluster == a.cluster_name && !e.rescheduled);
                if placed && !already && unhealthy_for(a, now) >= Some(tolerate) {
                    let keep_until = match f.purge_mode.as_str() {
                        "Graciously" => f.grace_period_seconds.map(|g| now.add_seconds(g)),
                        _ => None,
                    };
                    spec.evictions.retain(|e| e.cluster != a.cluster_name);
                    spec.evictions.push(Eviction {
                        cluster: a.cluster_name.clone(),
                        reason: format!("unhealthy for more than {tolerate}s"),
                        since: now,
                        keep_until,
                        keep: f.purge_mode == "Never",
                        rescheduled: false,
                    });
                    evicted_now.push(a.cluster_name.clone());
                }
            }
        }
        if why == Trigger::Failover && evicted_now.is_empty() && observed == Some(generation) {
            return Outcome::Skip;
        }
        let evicted: Vec<String> = spec
            .evictions
            .iter()
            .filter(|e| !e.rescheduled)
            .map(|e| e.cluster.clone())
            .collect();
        let kind = spec.resource.kind.clone();
        let divisible = spec.replicas > 0 || orrery_api::interpret::has_divisible_replicas(&kind);
        let request = spec
            .replica_requirements
            .as_ref()
            .map(|r| r.resource_request.clone())
            .unwrap_or_default();
        let mode = if why == Trigger::Requested
            || (why == Trigger::Recovered && spec.placement.rebalance_on_recovery)
        {
            Mode::Fresh
        } else if consolidate {
            Mode::Consolidate
        } else {
            Mode::Steady
        };
        let previous = spec.clusters.clone();
        let ties = super::stateful::ties(&self.graph, &self.bindings, &self.datasets, k, &spec);
        let task = Task {
            // A standalone task runs outside Orrery and needs no API of the member.
            api_version: if spec.resource.is_task() {
                ""
            } else {
                &spec.resource.api_version
            },
            kind: &kind,
            replicas: spec.replicas,
            divisible,
            request: &request,
            placement: &spec.placement,
            targets: &spec.target_clusters,
            priority: spec.priority,
            previous: &previous,
            evicted: &evicted,
            shed,
            shed_ahead,
            mode,
            now: now.unix_seconds(),
            seed: seed_of(&b.metadata.uid),
            relations: ties.relations(),
        };
        let engine_started = Instant::now();
        let mut decision =
            schedule_cached(&self.fleet, &task, &self.engine, &mut self.filter_cache);
        if decision.error.is_some()
            && ties.follows
            && let Some(d) = self.nearest_to_leader(&task, &ties)
        {
            decision = d;
        }
        let m = &self.settings.metrics;
        m.decision_seconds
            .observe(engine_started.elapsed().as_secs_f64());
        m.decisions.inc();
        if decision.error.is_some() {
            m.unschedulable.inc();
        }
        let changed_spec_generation = status.scheduler_observed_generation != Some(generation);
        let mut new_clusters = match &decision.error {
            // Clusters going away must not empty a placement that stands; a changed spec
            // with no fit does.
            Some(_)
                if decision.clusters.is_empty()
                    && !changed_spec_generation
                    && evicted_now.is_empty() =>
            {
                spec.clusters.clone()
            }
            _ => decision.clusters.clone(),
        };
        // A stateful workload never moves by being started empty elsewhere: a decision that
        // takes it off a cluster and onto another starts a Migration that carries its data.
        if spec.is_stateful() && !spec.resource.is_task() {
            let added = new_clusters
                .iter()
                .any(|n| n.replicas > 0 && !spec.clusters.iter().any(|c| c.name == n.name));
            let dropped = spec.clusters.iter().find(|c| {
                c.replicas > 0
                    && !new_clusters
                        .iter()
                        .any(|n| n.name == c.name && n.replicas > 0)
            });
            if added && let Some(source) = dropped {
                // Only when it must: its cluster fails a filter (the policy, a taint, a lost
                // cluster), sheds, or fails over; a better score elsewhere moves no data.
                let forced = matches!(why, Trigger::Shed | Trigger::Forecast | Trigger::Failover)
                    || decision
                        .explain(&self.fleet, &task, &self.engine)
                        .iter()
                        .find(|c| c.name == source.name)
                        .is_some_and(|c| {
                            !c.filter.is_empty()
                                && c.filter != "SpreadConstraint"
                                && c.filter != "Sample"
                        });
                if forced {
                    let source = source.clone();
                    return self
                        .start_move(k, &b, &spec, &task, &decision, &ties, &source, why, None);
                }
                new_clusters = spec.clusters.clone();
            }
        }
        // Make-before-break: clusters the scheduler took replicas away from keep the old
        // copy until the new placement is healthy or the grace period ends.
        if why.moves() {
            for old in &spec.clusters {
                if new_clusters.iter().any(|c| c.name == old.name)
                    || spec.evictions.iter().any(|e| e.cluster == old.name)
                {
                    continue;
                }
                spec.evictions.push(Eviction {
                    cluster: old.name.clone(),
                    reason: format!("replicas moved away ({})", why.as_str()),
                    since: now,
                    keep_until: Some(now.add_seconds(self.settings.move_grace.as_secs() as i64)),
                    keep: false,
                    rescheduled: true,
                });
            }
        }
        // Moved replicas' old copies: gone once their time is up or the cluster is back.
        spec.evictions.retain(|e| {
            !e.rescheduled
                || (e.keep_until.is_some_and(|u| u > now)
                    && !new_clusters.iter().any(|c| c.name == e.cluster))
        });
        let (summary, filtered) =
            decision.summary(&self.fleet, &task, &self.engine, history::MAX_EXPLAINED);
        let prediction = decision.prediction(&self.fleet, &task, &self.engine);
        let forecast = self
            .forecast_moves
            .remove(k)
            .filter(|_| why == Trigger::Forecast);
        let cond = match &decision.error {
            None => Condition::new(
                CONDITION_SCHEDULED,
                conditions::TRUE,
                "Success",
                placed_message(&new_clusters),
            ),
            Some(e) => {
                let mut msg = e.clone();
                if !filtered.is_empty() {
                    msg = format!("{msg}; filtered: {}", history::filtered_message(&filtered));
                }
                let reason = if decision.clusters.is_empty() {
                    "Unschedulable"
                } else {
                    "PartiallyScheduled"
                };
                Condition::new(CONDITION_SCHEDULED, conditions::FALSE, reason, msg)
            }
        };
        let old_cond = conditions::find(&status.conditions, CONDITION_SCHEDULED).cloned();
        let mut conds = status.conditions.clone();
        conditions::set(&mut conds, cond.clone(), now);
        let clusters_changed = new_clusters != spec.clusters;
        let standby = self.choose_standby(&spec, &task, &decision, &new_clusters, &ties);
        let standby_changed = standby != spec.standby;
        spec.standby = standby;
        let evictions_changed = old_evictions != spec.evictions || standby_changed;
        let unplaced = (decision.unplaced > 0).then_some(decision.unplaced);
        // The strategy names how the replicas now running were divided: a decision that moves
        // nothing keeps the one that placed them (the fleet's level, which picks the strategy,
        // may have moved since), so the status and the history tell the same story.
        let strategy = if clusters_changed || status.strategy.is_empty() {
            decision.strategy.to_string()
        } else {
            status.strategy.clone()
        };
        let status_changed = conds != status.conditions
            || status.decisions != summary
            || status.scheduler_observed_generation != Some(generation)
            || status.scheduler_observed_affinity_name != decision.affinity_name
            || status.strategy != strategy
            || status.unplaced_replicas != unplaced
            || status.prediction != prediction
            || requested.is_some();
        let failed = decision.error.is_some();
        // A round of consolidation that moves nothing writes nothing: its scores may have
        // drifted since the last decision, but that is no news worth a write a round.
        let status_changed = status_changed
            && !(why == Trigger::Consolidate
                && !clusters_changed
                && !evictions_changed
                && !failed
                && status.scheduler_observed_generation == Some(generation)
                && conds == status.conditions
                && status.unplaced_replicas == unplaced);
        if !clusters_changed && !status_changed && !evictions_changed {
            return if failed {
                Outcome::Unschedulable(None)
            } else {
                Outcome::Skip
            };
        }
        let bkey_str = format!("{}/{}", k.0, k.1);
        if clusters_changed {
            // Taken back should the write not land ([`Scheduler::written`]).
            self.in_flight.insert(
                k.clone(),
                InFlight {
                    seq: self.seq + 1,
                    why,
                    before: self.assume.save(&bkey_str),
                },
            );
            self.chunk_in_flight.push((k.clone(), self.seq + 1));
            let changed = self.assume.assume(
                &bkey_str,
                demand_of(&request),
                &spec.clusters,
                &new_clusters,
                orrery_api::interpret::counts_pods(&kind),
                self.now_ms(),
            );
            self.refresh_assumed(&changed);
            // Replicas taken off a cluster make room there.
            if spec.clusters.iter().any(|old| {
                new_clusters
                    .iter()
                    .find(|c| c.name == old.name)
                    .is_none_or(|c| c.replicas < old.replicas)
            }) {
                self.room_changed();
            }
        }
        self.seq += 1;
        let task_id = format!("{}-{}", b.metadata.uid, self.seq);
        let result = if !failed {
            "Scheduled"
        } else if decision.clusters.is_empty() {
            "Unschedulable"
        } else {
            "PartiallyScheduled"
        };
        // The history records decisions, not evaluations: a restart, a retry or a change of
        // the fleet that leaves the same placement for the same spec adds no entry. A fresh
        // decision someone asked for does.
        if clusters_changed
            || old_cond.as_ref().map(|c| (&c.status, &c.message))
                != Some((&cond.status, &cond.message))
            || status.scheduler_observed_generation != Some(generation)
            || status.unplaced_replicas != unplaced
            || status.strategy != strategy
            || requested.is_some()
            || why == Trigger::Requested
        {
            self.history.push((
                k.clone(),
                ScheduleEntry {
                    id: task_id.clone(),
                    time: now,
                    binding: bkey_str,
                    resource: binding::ObjectReference {
                        resource_version: String::new(),
                        ..spec.resource.clone()
                    },
                    replicas: spec.replicas,
                    trigger: why.as_str().to_string(),
                    strategy: strategy.clone(),
                    fleet_level: (decision.fleet_level * 1000.0).round() / 1000.0,
                    result: result.to_string(),
                    message: cond.message.clone(),
                    clusters: new_clusters.clone(),
                    unplaced: decision.unplaced,
                    decisions: summary.clone(),
                    filtered: filtered.clone(),
                    prediction: prediction.clone(),
                    forecast: if clusters_changed { forecast } else { None },
                },
            ));
        }
        spec.clusters = new_clusters;
        status.conditions = conds;
        status.decisions = summary;
        status.filtered = filtered;
        status.strategy = strategy;
        status.unplaced_replicas = unplaced;
        status.prediction = prediction;
        status.cost = orrery_scheduler::cost_of(&self.fleet, &task, &spec.clusters);
        status.task_id = task_id;
        if let Some(r) = requested {
            status.reschedule_observed = r;
        }
        status.scheduler_observed_generation = Some(generation);
        status.scheduler_observed_affinity_name = decision.affinity_name.clone();
        if clusters_changed {
            status.last_scheduled_time = Some(now);
        }
        let store = self.store.clone();
        let key = k.clone();
        let bkey = keys::well_known::binding(&k.0, &k.1);
        let announce = old_cond.as_ref().map(|c| (&c.status, &c.message))
            != Some((&cond.status, &cond.message))
            || !evicted_now.is_empty();
        let r = spec.resource.clone();
        let uid = b.metadata.uid.clone();
        let job: Job<BKey> = Box::pin(async move {
            // Built here, in the writers' task, not in the loop that decides one binding
            // after another: encoding the spec and status is about as much work as the
            // decision. The old spec and status, the bulk of the binding, are not copied.
            let next = Object {
                api_version: b.api_version.clone(),
                kind: b.kind.clone(),
                metadata: b.metadata.clone(),
                spec: serde_json::to_value(&spec).ok(),
                status: serde_json::to_value(&status).ok(),
                other: b.other.clone(),
            };
            store
                .update(&bkey, next, b.revision())
                .await
                .map_err(|e| (key.clone(), e.to_string()))?;
            if announce {
                // A standalone task has no template: its binding is what the event is about.
                let about = if r.is_task() {
                    subject(binding::API_VERSION, binding::KIND, &key.0, &key.1, &uid)
                } else {
                    subject(&r.api_version, &r.kind, &r.namespace, &r.name, &r.uid)
                };
                let (type_, reason) = if cond.is_true() {
                    ("Normal", "Scheduled")
                } else {
                    ("Warning", "ScheduleFailed")
                };
                let mut msg = cond.message.clone();
                if !evicted_now.is_empty() {
                    msg = format!(
                        "{msg}; moved away from {} (application failover)",
                        evicted_now.join(", ")
                    );
                }
                let _ = record::event(store.as_ref(), &about, type_, reason, &msg, COMPONENT).await;
            }
            Ok(())
        });
        if failed {
            Outcome::Unschedulable(Some(job))
        } else {
            Outcome::Write(job)
        }
    }
}

/// How long after a failed migration the scheduler waits before it moves the workload again.
const MOVE_RETRY: i64 = 300;
/// How long a binding naming a migration nobody has seen waits for it.
const UNKNOWN_MOVE_WAIT: Duration = Duration::from_secs(30);

impl Scheduler {
    /// A follower whose leader's clusters cannot hold it: the nearest cluster (by latency to
    /// them) that can, of the eight nearest.
    fn nearest_to_leader(
        &mut self,
        task: &Task<'_>,
        ties: &super::stateful::Ties,
    ) -> Option<Decision> {
        if ties.near.is_empty() {
            return None;
        }
        let mut by_latency: Vec<(f64, String)> = (0..self.fleet.len())
            .filter(|i| !ties.near.contains(&self.fleet.clusters()[*i].name))
            .filter_map(|i| {
                let l = orrery_scheduler::moves::mean_latency(&self.fleet, i, &ties.near)?;
                Some((l, self.fleet.clusters()[i].name.clone()))
            })
            .collect();
        by_latency.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let why = format!(
            "its leader's clusters ({}) cannot hold it: the nearest that can",
            ties.near.join(", ")
        );
        for (_, c) in by_latency.into_iter().take(8) {
            let only = [c];
            let mut relations = ties.relations();
            relations.within = Some((&only, &why));
            let t = Task {
                relations,
                ..task.clone()
            };
            let d = schedule_cached(&self.fleet, &t, &self.engine, &mut self.filter_cache);
            if d.error.is_none() {
                return Some(d);
            }
        }
        None
    }

    /// A user's Migration: the source it leaves, and the target Orrery picks (among its
    /// `targetClusters`, when it names some).
    fn user_move(&mut self, k: &BKey, b: &Arc<Object>, m: &Arc<Object>) -> Outcome {
        let spec = BindingSpec::of(b);
        let Ok(ms) = orrery_api::stateful::migration_spec(m.spec.as_ref()) else {
            return Outcome::Skip;
        };
        let what = format!("{} {}", ms.resource.kind, ms.resource.name);
        let fail = |msg: String| -> Outcome {
            Outcome::Write(fail_migration(self.store.clone(), m.clone(), msg))
        };
        let Some(spec) = spec else {
            return fail(format!(
                "{what} has no ResourceBinding: no policy places it"
            ));
        };
        if spec.resource.kind != ms.resource.kind
            || spec.resource.api_version != ms.resource.api_version
        {
            return fail(format!("the ResourceBinding {} is not of {what}", k.1));
        }
        if !spec.is_stateful() {
            return fail(format!(
                "{what} owns no persistent volumes: there is no data to move (change its placement to move it)"
            ));
        }
        let other = super::stateful::Graph::named(b)
            .filter(|n| *n != m.name())
            .map(|n| (n, self.graph.migrations.get(&(k.0.clone(), n.to_string()))));
        if let Some((other, state)) = other
            && state.is_none_or(|o| !o.phase.is_done())
        {
            // A move that only cleans up is as good as done: this one waits for it (its end
            // wakes the binding again).
            if state.is_some_and(|o| o.phase == orrery_api::stateful::MigrationPhase::Cleaning) {
                return Outcome::Skip;
            }
            return fail(format!(
                "{what} is being moved already (by migration {other})"
            ));
        }
        let placed: Vec<&TargetCluster> = spec.clusters.iter().filter(|c| c.replicas > 0).collect();
        let source = if ms.source_cluster.is_empty() {
            match placed.as_slice() {
                [one] => (*one).clone(),
                [] => return fail(format!("{what} runs in no cluster yet")),
                many => {
                    let names: Vec<&str> = many.iter().map(|c| c.name.as_str()).collect();
                    return fail(format!(
                        "{what} runs in {}: say which to leave in spec.sourceCluster",
                        names.join(", ")
                    ));
                }
            }
        } else {
            match placed.iter().find(|c| c.name == ms.source_cluster) {
                Some(c) => (*c).clone(),
                None => {
                    return fail(format!(
                        "{what} does not run in {} (it runs in {})",
                        ms.source_cluster,
                        placed
                            .iter()
                            .map(|c| c.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ));
                }
            }
        };
        let mut ties = super::stateful::ties(&self.graph, &self.bindings, &self.datasets, k, &spec);
        if !ms.target_clusters.is_empty() {
            let why = format!(
                "not among the Migration's targetClusters ({})",
                ms.target_clusters.join(", ")
            );
            ties.within = Some(match ties.within.take() {
                Some((w, r)) => (
                    w.into_iter()
                        .filter(|c| ms.target_clusters.contains(c))
                        .collect(),
                    format!("{r}, and {why}"),
                ),
                None => (ms.target_clusters.clone(), why),
            });
        }
        let request = spec
            .replica_requirements
            .as_ref()
            .map(|r| r.resource_request.clone())
            .unwrap_or_default();
        let mut evicted: Vec<String> = spec
            .evictions
            .iter()
            .filter(|e| !e.rescheduled)
            .map(|e| e.cluster.clone())
            .collect();
        evicted.push(source.name.clone());
        let kind = spec.resource.kind.clone();
        let task = Task {
            api_version: &spec.resource.api_version,
            kind: &kind,
            replicas: spec.replicas,
            divisible: spec.replicas > 0 || orrery_api::interpret::has_divisible_replicas(&kind),
            request: &request,
            placement: &spec.placement,
            targets: &spec.target_clusters,
            priority: spec.priority,
            previous: &spec.clusters,
            evicted: &evicted,
            shed: &[],
            shed_ahead: &[],
            mode: Mode::Steady,
            now: Time::now().unix_seconds(),
            seed: seed_of(&b.metadata.uid),
            relations: ties.relations(),
        };
        let decision = schedule_cached(&self.fleet, &task, &self.engine, &mut self.filter_cache);
        self.start_move(
            k,
            b,
            &spec,
            &task,
            &decision,
            &ties,
            &source,
            Trigger::UserMove,
            Some(m.clone()),
        )
    }

    /// Moves a stateful workload's replicas off `source` with their data: picks the target
    /// (copy time over the path, latency to what it depends on, water level), records the
    /// decision, and starts (or, for a user's Migration, completes) the Migration that
    /// carries it out. The placement stays as it is until the migration switches it.
    #[allow(clippy::too_many_arguments)]
    fn start_move(
        &mut self,
        k: &BKey,
        b: &Arc<Object>,
        spec: &BindingSpec,
        task: &Task<'_>,
        decision: &Decision,
        ties: &super::stateful::Ties,
        source: &TargetCluster,
        why: Trigger,
        user: Option<Arc<Object>>,
    ) -> Outcome {
        let now = Time::now();
        if user.is_none()
            && self.graph.migrations.iter().any(|((ns, _), m)| {
                *ns == k.0
                    && m.binding == k.1
                    && m.phase == orrery_api::stateful::MigrationPhase::Failed
                    && m.ended.is_some_and(|e| now.unix_seconds() - e < MOVE_RETRY)
            })
        {
            // Tried and failed lately: the workload stays where it is for a while.
            return Outcome::Unschedulable(None);
        }
        let explained = decision.explain(&self.fleet, task, &self.engine);
        let mut feasible = Vec::new();
        let mut turned = Vec::new();
        for (i, c) in explained.iter().enumerate() {
            // What moves goes to one cluster whole: spreading and sampling do not apply.
            if c.filter.is_empty() || c.filter == "SpreadConstraint" || c.filter == "Sample" {
                feasible.push(i);
            } else {
                turned.push((i, c.reason.clone()));
            }
        }
        let status = BindingStatus::of(b);
        let bytes: i64 = status
            .aggregated_status
            .iter()
            .filter(|a| a.cluster_name == source.name)
            .flat_map(|a| &a.volumes)
            .filter(|v| v.ordinal.is_none_or(|o| o < source.replicas))
            .map(|v| v.used_bytes)
            .sum();
        let request = task.request.clone();
        let limit = spec
            .placement
            .water_level_limit
            .unwrap_or(self.engine.water_level_limit);
        let ranking = orrery_scheduler::moves::rank(
            &self.fleet,
            &feasible,
            &turned,
            &orrery_scheduler::moves::MoveRequest {
                source: &source.name,
                replicas: source.replicas,
                demand: demand_of(&request),
                bytes,
                near: &ties.near,
                limit,
                // Judged ahead as the placement judges clusters.
                ahead: spec
                    .placement
                    .prediction
                    .as_ref()
                    .map_or(self.engine.prediction, |p| {
                        p.resolve(self.engine.prediction)
                    }),
                now: task.now,
                mark: self.engine.shed_mark.max(limit),
            },
        );
        let reason = {
            use orrery_api::stateful::reason;
            let src = self.fleet.get(&source.name);
            if user.is_some() {
                reason::USER
            } else if src.is_none_or(|c| !serving(c)) {
                reason::CLUSTER_FAILOVER
            } else if why == Trigger::Failover {
                reason::APPLICATION_FAILOVER
            } else if matches!(why, Trigger::Shed | Trigger::Forecast) {
                reason::SHED
            } else if src.is_some_and(|c| c.taints.iter().any(|t| t.effect.as_str() == "NoExecute"))
            {
                reason::DRAIN
            } else {
                reason::POLICY_CHANGE
            }
        };
        let estimate = orrery_api::stateful::Estimate {
            bytes,
            bandwidth: ranking.bandwidth,
            seconds: ranking.seconds,
            candidates: ranking.candidates.clone(),
        };
        let what = format!("{} {}", spec.resource.kind, spec.resource.name);
        // A lost source fails over to its standby copy, if it keeps one that can take it.
        let lost = self.fleet.get(&source.name).is_none_or(|c| !serving(c));
        let standby_fits = ranking
            .candidates
            .iter()
            .any(|c| c.cluster == spec.standby && c.score.is_some());
        let chosen = if lost && standby_fits {
            Some(spec.standby.clone())
        } else {
            ranking.chosen.clone()
        };
        let Some(target) = chosen else {
            let first = ranking
                .candidates
                .iter()
                .take(3)
                .map(|c| format!("{}: {}", c.cluster, c.reason))
                .collect::<Vec<_>>()
                .join("; ");
            let msg = format!(
                "cannot move {} replica(s) of {what} off {} with their data: no cluster can take them ({first})",
                source.replicas, source.name
            );
            if let Some(m) = user {
                return Outcome::Write(fail_migration(self.store.clone(), m, msg));
            }
            return Outcome::Unschedulable(Some(self.write_condition(k, b, "MoveBlocked", msg)));
        };
        let message = format!(
            "moving {} replica(s) of {what} from {} to {target} with their data ({} bytes, about {:.0}s at {} bytes/s; {})",
            source.replicas, source.name, bytes, ranking.seconds, ranking.bandwidth, reason
        );
        let migration = match &user {
            Some(m) => {
                let mut next = (**m).clone();
                let mut st = orrery_api::stateful::MigrationStatus::of(m);
                st.source = source.name.clone();
                st.target = target.clone();
                st.replicas = source.replicas;
                st.binding = k.1.clone();
                st.estimate = Some(estimate);
                st.message = message.clone();
                st.start_time = Some(now);
                next.status = serde_json::to_value(st).ok();
                next
            }
            None => super::stateful::new_migration(
                &k.0,
                &spec.resource,
                &k.1,
                &source.name,
                &target,
                source.replicas,
                reason,
                estimate,
                message.clone(),
            ),
        };
        let mname = migration.name().to_string();
        // The target's room is held from now on: the move will need it.
        let mut planned: Vec<TargetCluster> = spec
            .clusters
            .iter()
            .filter(|c| c.name != source.name)
            .cloned()
            .collect();
        planned.push(TargetCluster {
            name: target.clone(),
            replicas: source.replicas,
        });
        planned.sort_by(|a, b| a.name.cmp(&b.name));
        let bkey_str = format!("{}/{}", k.0, k.1);
        let changed = self.assume.assume(
            &bkey_str,
            demand_of(&request),
            &spec.clusters,
            &planned,
            orrery_api::interpret::counts_pods(&spec.resource.kind),
            self.now_ms(),
        );
        self.refresh_assumed(&changed);
        self.seq += 1;
        let task_id = format!("{}-{}", b.metadata.uid, self.seq);
        let (summary, filtered) =
            decision.summary(&self.fleet, task, &self.engine, history::MAX_EXPLAINED);
        self.history.push((
            k.clone(),
            ScheduleEntry {
                id: task_id.clone(),
                time: now,
                binding: bkey_str,
                resource: binding::ObjectReference {
                    resource_version: String::new(),
                    ..spec.resource.clone()
                },
                replicas: spec.replicas,
                trigger: why.as_str().to_string(),
                strategy: "Migration".to_string(),
                fleet_level: (decision.fleet_level * 1000.0).round() / 1000.0,
                result: "Migrating".to_string(),
                message: format!("{message}; migration {mname}"),
                clusters: planned,
                unplaced: 0,
                decisions: summary.clone(),
                filtered: filtered.clone(),
                prediction: decision.prediction(&self.fleet, task, &self.engine),
                forecast: self
                    .forecast_moves
                    .remove(k)
                    .filter(|_| why == Trigger::Forecast),
            },
        ));
        let mut next_spec = spec.clone();
        next_spec.migration = mname.clone();
        let mut st = status;
        let cond = Condition::new(
            CONDITION_SCHEDULED,
            conditions::TRUE,
            "Migrating",
            format!("{message}; migration {mname}"),
        );
        conditions::set(&mut st.conditions, cond, now);
        st.decisions = summary;
        st.filtered = filtered;
        st.task_id = task_id;
        st.scheduler_observed_generation = b.metadata.generation.or(Some(1));
        let store = self.store.clone();
        let key = k.clone();
        let b = b.clone();
        let creating = user.is_none();
        let r = spec.resource.clone();
        Outcome::Write(Box::pin(async move {
            let err = |e: orrery_store::StoreError| (key.clone(), e.to_string());
            // The binding first: it names the migration, so no second move can start; a
            // migration that then fails to be written leaves a name nobody follows, which
            // the next decision replaces.
            let mut next = (*b).clone();
            next.spec = serde_json::to_value(&next_spec).ok();
            next.status = serde_json::to_value(&st).ok();
            store
                .update(
                    &keys::well_known::binding(&key.0, &key.1),
                    next,
                    b.revision(),
                )
                .await
                .map_err(err)?;
            let mkey = keys::well_known::migration(&key.0, migration.name());
            let uid = migration.metadata.uid.clone();
            // Whether this write started the move (a decision taken again before the
            // Migration's target was seen finds it started, and says nothing more).
            let started = if creating {
                match store.create(&mkey, migration).await {
                    Ok(_) => true,
                    Err(orrery_store::StoreError::AlreadyExists { .. }) => false,
                    Err(e) => return Err(err(e)),
                }
            } else {
                // The user's Migration gets its target even if it changed meanwhile (its
                // labels, say): the binding names it now, and nothing else would.
                let status = migration.status.clone();
                let wrote = std::sync::atomic::AtomicBool::new(false);
                orrery_store::update_with(store.as_ref(), &mkey, |mut cur| {
                    wrote.store(false, std::sync::atomic::Ordering::Relaxed);
                    let st = orrery_api::stateful::MigrationStatus::of(&cur);
                    if cur.metadata.uid != uid || !st.target.is_empty() || st.phase.is_done() {
                        return Ok(None);
                    }
                    cur.status = status.clone();
                    wrote.store(true, std::sync::atomic::Ordering::Relaxed);
                    Ok(Some(cur))
                })
                .await
                .map_err(err)?;
                wrote.load(std::sync::atomic::Ordering::Relaxed)
            };
            if started {
                let about = subject(&r.api_version, &r.kind, &r.namespace, &r.name, &r.uid);
                // Once per migration, a restart included.
                let _ = record::event_once_for(
                    store.as_ref(),
                    &about,
                    &uid,
                    "Normal",
                    "MigrationStarted",
                    &message,
                    COMPONENT,
                )
                .await;
            }
            Ok(())
        }))
    }

    /// Where a stateful workload placed in one cluster keeps its standby copy
    /// (`placement.stateful.standby`): the one it has while that still serves and passes the
    /// workload's filters, else the cluster its data would reach soonest (as a move's
    /// target is chosen). Empty when it keeps none.
    fn choose_standby(
        &self,
        spec: &BindingSpec,
        task: &Task<'_>,
        decision: &Decision,
        placed: &[TargetCluster],
        ties: &super::stateful::Ties,
    ) -> String {
        let wants = spec.is_stateful()
            && spec
                .placement
                .stateful
                .as_ref()
                .is_some_and(|s| s.standby.is_some());
        let mut running = placed.iter().filter(|c| c.replicas > 0);
        let (Some(source), None) = (running.next(), running.next()) else {
            return String::new();
        };
        if !wants {
            return String::new();
        }
        let explained = decision.explain(&self.fleet, task, &self.engine);
        let passes = |i: usize| {
            let f = &explained[i].filter;
            f.is_empty() || f == "SpreadConstraint" || f == "Sample"
        };
        if !spec.standby.is_empty()
            && spec.standby != source.name
            && let Some(i) = self.fleet.position(&spec.standby)
            && serving(&self.fleet.clusters()[i])
            && passes(i)
        {
            return spec.standby.clone();
        }
        let feasible: Vec<usize> = (0..explained.len())
            .filter(|i| passes(*i) && serving(&self.fleet.clusters()[*i]))
            .collect();
        let ranking = orrery_scheduler::moves::rank(
            &self.fleet,
            &feasible,
            &[],
            &orrery_scheduler::moves::MoveRequest {
                source: &source.name,
                // A standby runs no pods: only its volumes need room.
                replicas: 0,
                demand: [0.0; 5],
                bytes: 0,
                near: &ties.near,
                limit: 1.0,
                ahead: self.engine.prediction,
                now: Time::now().unix_seconds(),
                mark: 1.0,
            },
        );
        ranking.chosen.unwrap_or_default()
    }

    /// A job that sets the binding's Scheduled condition (the placement stays).
    fn write_condition(&self, k: &BKey, b: &Arc<Object>, reason: &str, msg: String) -> Job<BKey> {
        let store = self.store.clone();
        let key = k.clone();
        let reason = reason.to_string();
        let uid = b.metadata.uid.clone();
        Box::pin(async move {
            let bkey = keys::well_known::binding(&key.0, &key.1);
            orrery_store::update_with(store.as_ref(), &bkey, |mut cur| {
                if cur.metadata.uid != uid {
                    return Ok(None);
                }
                let mut st = BindingStatus::of(&cur);
                let cond =
                    Condition::new(CONDITION_SCHEDULED, conditions::FALSE, &reason, msg.clone());
                if !conditions::set(&mut st.conditions, cond, Time::now()) {
                    return Ok(None);
                }
                cur.status = serde_json::to_value(st).ok();
                Ok(Some(cur))
            })
            .await
            .map(|_| ())
            .map_err(|e| (key, e.to_string()))
        })
    }
}

/// A job that ends a Migration as Failed, with why.
fn fail_migration(store: Arc<dyn Store>, m: Arc<Object>, msg: String) -> Job<BKey> {
    let key = (m.namespace().to_string(), m.name().to_string());
    Box::pin(async move {
        let mkey = keys::well_known::migration(&key.0, &key.1);
        let uid = m.metadata.uid.clone();
        orrery_store::update_with(store.as_ref(), &mkey, |mut cur| {
            if cur.metadata.uid != uid {
                return Ok(None);
            }
            let mut st = orrery_api::stateful::MigrationStatus::of(&cur);
            if st.phase.is_done() {
                return Ok(None);
            }
            let now = Time::now();
            st.phase = orrery_api::stateful::MigrationPhase::Failed;
            st.message = msg.clone();
            st.completion_time = Some(now);
            conditions::set(
                &mut st.conditions,
                Condition::new("Succeeded", conditions::FALSE, "Refused", msg.clone()),
                now,
            );
            cur.status = serde_json::to_value(st).ok();
            Ok(Some(cur))
        })
        .await
        .map(|_| ())
        .map_err(|e| (key, e.to_string()))
    })
}

/// A decision whose write is in flight.
struct InFlight {
    seq: u64,
    why: Trigger,
    before: orrery_scheduler::assume::Saved,
}

/// A binding's write of a chunk: its decision's task number and whether the write failed.
type Written = (BKey, u64, bool);

enum Outcome {
    Skip,
    Write(Job<BKey>),
    /// Nothing (or not everything) fits: retried with backoff.
    Unschedulable(Option<Job<BKey>>),
}

/// A stable number per binding (its sample of a large fleet).
fn seed_of(uid: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    uid.hash(&mut h);
    h.finish()
}

/// The clusters a binding places on, read without parsing it.
fn placed_on(b: &Object) -> Vec<String> {
    b.spec
        .as_ref()
        .and_then(|s| s.get("clusters"))
        .and_then(serde_json::Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|c| c.get("name").and_then(serde_json::Value::as_str))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Whether the scheduler may move a binding's replicas for load: only those it divides by
/// water level (Karmada's modes keep Karmada's behaviour).
fn sheddable(spec: &BindingSpec) -> bool {
    orrery_scheduler::strategy(&spec.placement, true) == "WaterLevel"
}

/// Whether a binding's replicas are consolidated onto cheaper clusters: its placement says
/// so (`cost.consolidate` with a weight), and they are divided by water level. A stateful
/// workload moves only with its data, never to save money.
fn consolidates(b: &Object) -> bool {
    // Most bindings do not ask: their spec is not parsed again on every write.
    let asks = (b.spec.as_ref())
        .and_then(|s| s.pointer("/placement/cost/consolidate"))
        .is_some_and(|v| v == &serde_json::Value::Bool(true));
    asks && BindingSpec::of(b).is_some_and(|s| spec_consolidates(&s))
}

fn spec_consolidates(s: &BindingSpec) -> bool {
    sheddable(s) && !s.is_stateful() && s.placement.consolidates()
}

fn placed_message(clusters: &[TargetCluster]) -> String {
    if clusters.is_empty() {
        return "placed on no cluster".into();
    }
    // A kind without replicas (a Service, a ConfigMap) is placed whole: no counts to show.
    let counted = clusters.iter().any(|c| c.replicas > 0);
    let parts: Vec<String> = clusters
        .iter()
        .map(|c| {
            if counted {
                format!("{}({})", c.name, c.replicas)
            } else {
                c.name.clone()
            }
        })
        .collect();
    format!("placed on {}", parts.join(", "))
}

fn unhealthy_for(a: &AggregatedStatusItem, now: Time) -> Option<i64> {
    if a.health != Health::Unhealthy {
        return None;
    }
    Some(now.seconds_since(a.health_since?))
}

#[cfg(test)]
mod tests;
