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
    /// Where decisions are recorded (the schedule history's writer, shared with the binding
    /// controller's rollout steps); `None`: the scheduler starts its own.
    pub history: Option<crate::propagation::history::History>,
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
            history: None,
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
const QUOTAS: &str = "quotas";
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
    /// A workload of a higher priority takes its room in a cluster ([`preempt`]).
    Preempted,
}

impl Trigger {
    /// What a binding queued for `self` is decided for once `new` comes too: the first,
    /// unless the new one decides it afresh (a user's request, a recovery its placement
    /// rebalances on), which a trigger queued before it must not swallow.
    fn merged(self, new: Trigger) -> Trigger {
        match (self, new) {
            (Trigger::Requested, _) => Trigger::Requested,
            (_, Trigger::Requested | Trigger::Recovered) => new,
            _ => self,
        }
    }

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
            Trigger::Preempted => "Preempted",
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
    /// Keys woken fresh since the loop last took them: a retry wake of one of them keeps it
    /// fresh (as a retry of a key waiting in the fresh lane does).
    woken_fresh: HashSet<BKey>,
    /// Keys woken outside `on_event` and `tick` (a write that lost), handed to the loop.
    wake_tx: mpsc::UnboundedSender<BKey>,
    /// Keys were handed to the loop by `wake_tx` during the last round: the queue only looks
    /// empty, and the round goes on.
    woke_in_round: bool,
    shed: HashMap<BKey, Vec<String>>,
    /// Clusters a binding is to leave for a workload of a higher priority, and why.
    preempt: HashMap<BKey, Vec<preempt::Preemption>>,
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
    history_tx: crate::propagation::history::History,
    seq: u64,
    started: Instant,
    /// Follow-up and group relations, and migrations under way.
    graph: crate::propagation::stateful::Graph,
    /// Users' Migrations waiting for a target, by binding.
    user_moves: HashMap<BKey, Arc<Object>>,
    /// Data sets, by namespace and name: their size and copies (data-aware scheduling).
    datasets: crate::propagation::stateful::DataSets,
    /// Data set copies under way: (source, destination, bytes still to send), by transfer.
    booked: HashMap<(String, String), (String, String, f64)>,
    /// Bindings naming a migration not seen yet, and since when.
    unknown_moves: HashMap<BKey, Instant>,
    runtime: crate::runtime::metrics::Handle,
    /// The namespaces' FederatedResourceQuotas, and what their bindings use.
    quota: quota::QuotaBook,
}

/// Runs the scheduling controller until shutdown.
pub async fn run(store: Arc<dyn Store>, settings: Settings, shutdown: watch::Receiver<bool>) {
    let history_tx = match &settings.history {
        Some(h) => h.clone(),
        None => crate::propagation::history::History::spawn(store.clone()),
    };
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
            orrery_api::kinds::RESOURCE_BINDING.prefix(None),
        ))
        .source(Source::new(MIGRATIONS, keys::well_known::migrations(None)))
        .source(Source::new(
            QUOTAS,
            orrery_api::kinds::FEDERATED_RESOURCE_QUOTA.prefix(None),
        ))
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
        history_tx: crate::propagation::history::History,
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
            woken_fresh: HashSet::new(),
            wake_tx,
            woke_in_round: false,
            shed: HashMap::new(),
            preempt: HashMap::new(),
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
            quota: Default::default(),
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
        self.woken_fresh.clear();
    }

    /// Hands the keys woken outside `on_event` and `tick` to the loop, through its trigger;
    /// whether there were any.
    fn wake_loop(&mut self) -> bool {
        let woke = !self.wake.is_empty();
        for k in self.wake.drain(..) {
            // Gone only when the controller is: nothing is left to wake then.
            let _ = self.wake_tx.send(k);
        }
        self.woken_fresh.clear();
        woke
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
            QUOTAS => {
                for k in self.quota.on_quota(ev) {
                    self.enqueue(k, Trigger::Binding);
                }
            }
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
        self.woke_in_round = self.wake_loop();
        // Let the tasks sharing this thread (the reflectors feeding us, the writes) run, and
        // this task's cooperative budget start afresh.
        tokio::task::yield_now().await;
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

    /// The round is over unless the last chunk woke keys the loop has yet to take.
    async fn idle(&mut self) {
        if std::mem::take(&mut self.woke_in_round) {
            return;
        }
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

/// The binding's place in the queue: Karmada's `schedulePriority` (a PriorityClass's value)
/// when its policy names one, otherwise the policy's (or task's) priority, read without
/// parsing.
fn priority_of(b: &Object) -> i32 {
    let spec = b.spec.as_ref();
    spec.and_then(|s| s.get("schedulePriority"))
        .map(|p| {
            p.get("priority")
                .and_then(serde_json::Value::as_i64)
                .unwrap_or(0)
        })
        .or_else(|| {
            spec.and_then(|s| s.get("priority"))
                .and_then(serde_json::Value::as_i64)
        })
        .unwrap_or(0)
        .clamp(i32::MIN as i64, i32::MAX as i64) as i32
}

/// Whether the binding's last decision left replicas unplaced (`Scheduled=False`), read
/// without parsing.
fn found_no_room(b: &Object) -> bool {
    scheduled_has(b, "status", conditions::FALSE)
}

/// Whether the binding's Scheduled condition tells of a migration, read without parsing.
fn says_migrating(b: &Object) -> bool {
    scheduled_has(b, "reason", "Migrating")
}

/// Whether the binding's Scheduled condition has `field` set to `value`.
fn scheduled_has(b: &Object, field: &str, value: &str) -> bool {
    b.status
        .as_ref()
        .and_then(|s| s.get("conditions"))
        .and_then(serde_json::Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| {
            c.get("type").and_then(serde_json::Value::as_str) == Some(CONDITION_SCHEDULED)
                && c.get(field).and_then(serde_json::Value::as_str) == Some(value)
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
        let queued = self.triggers.entry(k.clone()).or_insert(why);
        *queued = queued.merged(why);
        if why != Trigger::Retry {
            self.behind.remove(&k);
            self.woken_fresh.insert(k.clone());
        } else if !self.woken_fresh.contains(&k) {
            self.behind.insert(k.clone());
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
}

/// How long a binding naming a migration nobody has seen waits for it.
const UNKNOWN_MOVE_WAIT: Duration = Duration::from_secs(30);

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

mod decide;
mod ingest;
mod moves;
mod preempt;
mod quota;
mod triggers;

#[cfg(test)]
mod tests;
