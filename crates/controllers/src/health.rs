//! Cluster health: a member whose heartbeats stop for the grace period becomes Ready=Unknown;
//! a cluster that is not Ready is tainted `NoSchedule` at once and `NoExecute` once it has
//! stayed so for the eviction timeout (its replicas may then be moved elsewhere); the taints go
//! when it is Ready again. With an eviction rate (`--eviction-rate`), the NoExecute taints of a
//! wide outage are given at that pace (a token bucket of clusters, with a burst), the longest
//! not Ready first: the rest wait, tainted NoSchedule, and say so in the log and the metrics. Every change of readiness is recorded as an Event on the Cluster and
//! in the failure history.
//!
//! A heartbeat is a renewal of the member's Lease (`orrery-member-lease/<cluster>`, which this
//! controller makes for every Cluster) or a write of the Cluster's status (agents that know no
//! Lease, and every status report). Heartbeats are judged by when this controller saw them
//! arrive (a monotonic clock), not by the timestamps in them, so clock skew between machines
//! does not matter. A cluster this controller declares Unknown has its Lease marked, so that
//! an agent still renewing it (its renewals were late, or a new leader gave up on it) writes
//! its whole status again at its next beat instead of renewing over the Unknown.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use orrery_api::cluster::{
    self, CONDITION_READY, ClusterStatus, TAINT_NOT_READY, TAINT_UNREACHABLE, Taint, TaintEffect,
};
use orrery_api::conditions::{self, Condition};
use orrery_api::{MicroTime, Object, OwnerReference, Time, keys};
use orrery_store::{Store, StoreError, update_with};
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::record::{self, FailureRecord};
use crate::runtime::controller::{Action, Controller, Keys, Origin, Reconciler, Source};
use crate::runtime::metrics::Handle;
use crate::runtime::reflector::Event;

const COMPONENT: &str = "orrery-cluster-health";

#[derive(Debug, Clone)]
pub struct HealthConfig {
    /// How long a silent member stays Ready.
    pub grace_period: Duration,
    /// How long a cluster is not Ready before it is also tainted NoExecute.
    pub eviction_timeout: Duration,
    /// The fleet's pace of evictions (`None`: every due cluster at once).
    pub eviction_rate: Option<EvictionRate>,
    pub eviction_metrics: EvictionMetrics,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            grace_period: Duration::from_secs(40),
            eviction_timeout: Duration::from_secs(30),
            eviction_rate: None,
            eviction_metrics: EvictionMetrics::default(),
        }
    }
}

/// Clusters' worth of evictions per minute, and how many may go at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvictionRate {
    pub per_minute: f64,
    pub burst: u32,
}

/// `orrery_cluster_evictions_total` and `orrery_cluster_evictions_waiting`.
#[derive(Debug, Clone, Default)]
pub struct EvictionMetrics {
    pub evicted: prometheus_client::metrics::counter::Counter,
    pub waiting: prometheus_client::metrics::gauge::Gauge,
}

impl EvictionMetrics {
    /// Registers the families.
    pub fn new(
        registry: &parking_lot::Mutex<prometheus_client::registry::Registry>,
    ) -> EvictionMetrics {
        let m = EvictionMetrics::default();
        let mut r = registry.lock();
        r.register(
            "orrery_cluster_evictions",
            "Clusters tainted NoExecute (their workloads moved away) for being not Ready",
            m.evicted.clone(),
        );
        r.register(
            "orrery_cluster_evictions_waiting",
            "Clusters due for eviction that wait for the fleet's eviction rate",
            m.waiting.clone(),
        );
        m
    }
}

/// A token bucket of evictions: `burst` at most, refilled at the rate.
#[derive(Debug)]
struct Bucket {
    rate: EvictionRate,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn new(rate: EvictionRate, now: Instant) -> Bucket {
        Bucket {
            rate,
            tokens: f64::from(rate.burst.max(1)),
            at: now,
        }
    }

    /// Takes a token if there is one.
    fn take(&mut self, now: Instant) -> bool {
        let refill = now.duration_since(self.at).as_secs_f64() * self.rate.per_minute / 60.0;
        self.tokens = (self.tokens + refill).min(f64::from(self.rate.burst.max(1)));
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[derive(Debug)]
struct Seen {
    heartbeat: Option<MicroTime>,
    heartbeat_at: Instant,
    deleting: bool,
    /// Derived from the object when it arrives, so that ticks parse nothing.
    ready: Option<Condition>,
    taints: Vec<Taint>,
    /// A reference to the Cluster, for its Lease's ownerReferences.
    owner: OwnerReference,
}

impl Seen {
    fn new(o: &Object, heartbeat_at: Instant) -> Seen {
        let mut s = Seen {
            heartbeat: None,
            heartbeat_at,
            deleting: false,
            ready: None,
            taints: Vec::new(),
            owner: OwnerReference::controller_of(o),
        };
        s.observe(o, heartbeat_at);
        s
    }

    /// Takes in a new version of the Cluster; returns the readiness it had before, if the
    /// new one differs.
    fn observe(&mut self, o: &Object, now: Instant) -> Option<String> {
        // Every heartbeat and metrics report comes through here: read only what health needs,
        // not the resource summaries.
        #[derive(serde::Deserialize, Default)]
        #[serde(rename_all = "camelCase", default)]
        struct Beat {
            conditions: Vec<Condition>,
            last_heartbeat_time: Option<MicroTime>,
        }
        #[derive(serde::Deserialize, Default)]
        #[serde(default)]
        struct Tainted {
            taints: Vec<cluster::Taint>,
        }
        use serde::Deserialize;
        let st = o
            .status
            .as_ref()
            .and_then(|s| Beat::deserialize(s).ok())
            .unwrap_or_default();
        if st.last_heartbeat_time.is_some() && st.last_heartbeat_time != self.heartbeat {
            self.heartbeat = st.last_heartbeat_time;
            self.heartbeat_at = now;
        }
        self.deleting = o.metadata.deletion_timestamp.is_some();
        self.taints = o
            .spec
            .as_ref()
            .and_then(|s| Tainted::deserialize(s).ok())
            .unwrap_or_default()
            .taints;
        let ready = ready_of(&st.conditions).cloned();
        let before = self
            .ready
            .as_ref()
            .map(|c| c.status.clone())
            .unwrap_or_default();
        let changed = ready.as_ref().is_some_and(|r| r.status != before);
        if ready.is_some() {
            self.ready = ready;
        }
        changed.then_some(before)
    }

    fn ready_status(&self) -> &str {
        self.ready.as_ref().map(|c| c.status.as_str()).unwrap_or("")
    }
}

fn ready_of(conds: &[Condition]) -> Option<&Condition> {
    conditions::find(conds, CONDITION_READY)
}

/// The local instant a wall-clock time corresponds to (for state found at start-up).
fn instant_of(t: Option<MicroTime>, now: Instant) -> Instant {
    let Some(t) = t else { return now };
    let ago = MicroTime::now().millis_since(t).max(0) as u64;
    now.checked_sub(Duration::from_millis(ago)).unwrap_or(now)
}

/// The taints readiness calls for: `(key, effect)`.
pub fn wanted_taints(
    ready: Option<&Condition>,
    now: Time,
    eviction: Duration,
) -> Vec<(&'static str, TaintEffect)> {
    let Some(c) = ready else { return Vec::new() };
    let key = match c.status.as_str() {
        conditions::TRUE => return Vec::new(),
        conditions::FALSE => TAINT_NOT_READY,
        _ => TAINT_UNREACHABLE,
    };
    let since = c
        .last_transition_time
        .map(|t| t.unix_seconds())
        .unwrap_or(now.unix_seconds());
    let mut out = vec![(key, TaintEffect::NoSchedule)];
    if now.unix_seconds() - since >= eviction.as_secs() as i64 {
        out.push((key, TaintEffect::NoExecute));
    }
    out
}

/// Whether a write of a cluster's taints may add a NoExecute taint: always without a rate;
/// under one only with a token taken for an eviction this sweep saw start (`starts`).
fn may_evict(bucket: Option<&parking_lot::Mutex<Bucket>>, starts: bool, now: Instant) -> bool {
    match bucket {
        None => true,
        Some(b) => starts && b.lock().take(now),
    }
}

/// Whether `wanted` would add a NoExecute taint `taints` lack: an eviction starting.
fn starts_eviction(wanted: &[(&str, TaintEffect)], taints: &[Taint]) -> bool {
    wanted.iter().any(|(k, e)| {
        *e == TaintEffect::NoExecute && !taints.iter().any(|t| t.key == *k && t.effect == *e)
    })
}

/// Leaves out of `wanted` the NoExecute taints `taints` lack (an eviction that must wait).
fn hold_eviction(wanted: &mut Vec<(&'static str, TaintEffect)>, taints: &[Taint]) {
    wanted.retain(|(k, e)| {
        *e != TaintEffect::NoExecute || taints.iter().any(|t| t.key == *k && t.effect == *e)
    });
}

/// `taints` with the health taints made to be exactly `wanted`; `None` if nothing changes.
pub fn reconcile_taints(
    taints: &[Taint],
    wanted: &[(&str, TaintEffect)],
    now: Time,
) -> Option<Vec<Taint>> {
    let health = |k: &str| k == TAINT_NOT_READY || k == TAINT_UNREACHABLE;
    let mut out: Vec<Taint> = taints
        .iter()
        .filter(|t| !health(&t.key) || wanted.iter().any(|(k, e)| *k == t.key && *e == t.effect))
        .cloned()
        .collect();
    for (k, e) in wanted {
        if !out.iter().any(|t| t.key == *k && t.effect == *e) {
            out.push(Taint::new(k, *e, now));
        }
    }
    if out == taints { None } else { Some(out) }
}

async fn set_unknown(store: &dyn Store, name: &str, grace: Duration) -> Result<(), StoreError> {
    let key = keys::well_known::cluster(name);
    let r = update_with(store, &key, |mut o| {
        let mut st = ClusterStatus::of(&o);
        if ready_of(&st.conditions).is_some_and(|c| c.status == conditions::UNKNOWN) {
            return Ok(None);
        }
        let changed = conditions::set(
            &mut st.conditions,
            Condition::new(
                CONDITION_READY,
                conditions::UNKNOWN,
                "ClusterStatusUnknown",
                format!(
                    "no heartbeat from the cluster for more than {}s",
                    grace.as_secs()
                ),
            ),
            Time::now(),
        );
        if !changed {
            return Ok(None);
        }
        let mut status = serde_json::to_value(&st).unwrap_or(Value::Null);
        // Keep what the member last reported; only the condition changes.
        if let (Some(Value::Object(old)), Value::Object(new)) = (&o.status, &mut status) {
            for (k, v) in old {
                new.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        o.status = Some(status);
        Ok(Some(o))
    })
    .await;
    match r {
        Ok(_) => want_status(store, name).await,
        Err(StoreError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Marks the member's Lease so that its agent writes its whole status at its next beat: the
/// agent renews with the Lease's last resourceVersion it knows, is refused, reads the Lease
/// and finds the mark.
async fn want_status(store: &dyn Store, name: &str) -> Result<(), StoreError> {
    let r = update_with(store, &keys::well_known::cluster_lease(name), |mut l| {
        l.metadata.annotations.insert(
            orrery_api::cluster::LEASE_STATUS_WANTED.to_string(),
            MicroTime::now().to_string(),
        );
        Ok(Some(l))
    })
    .await;
    match r {
        Ok(_) | Err(StoreError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Asks for the Lease of Cluster `name` if it has none (and is not being deleted).
fn ask_for_lease(
    name: &str,
    seen: &HashMap<String, Seen>,
    renewals: &HashMap<String, (Option<MicroTime>, Instant)>,
    asked: &mut std::collections::HashSet<String>,
    tx: &mpsc::UnboundedSender<(String, OwnerReference)>,
) {
    if let Some(s) = seen.get(name)
        && !s.deleting
        && !renewals.contains_key(name)
        && asked.insert(name.to_string())
    {
        let _ = tx.send((name.to_string(), s.owner.clone()));
    }
}

/// Asks for the Leases of Clusters that have none (and are not being deleted).
fn ask_for_leases(
    seen: &HashMap<String, Seen>,
    renewals: &HashMap<String, (Option<MicroTime>, Instant)>,
    asked: &mut std::collections::HashSet<String>,
    tx: &mpsc::UnboundedSender<(String, OwnerReference)>,
) {
    for name in seen.keys() {
        ask_for_lease(name, seen, renewals, asked, tx);
    }
}

/// Makes the Leases asked for, a few at a time; one that could not be made is tried again
/// a few times, 5 s apart (its agent writes its status meanwhile, which is a heartbeat too).
/// Ends with the controller (the sender dropped).
async fn make_leases(
    store: Arc<dyn Store>,
    grace: Duration,
    mut rx: mpsc::UnboundedReceiver<(String, OwnerReference)>,
) {
    use futures_util::StreamExt;
    let mut batch: Vec<(String, OwnerReference)> = Vec::new();
    let mut again: Vec<(String, OwnerReference, u32)> = Vec::new();
    loop {
        if again.is_empty() {
            if rx.recv_many(&mut batch, 256).await == 0 {
                return;
            }
        } else {
            tokio::time::sleep(Duration::from_secs(5)).await;
            if rx.is_closed() && rx.is_empty() {
                return;
            }
            while let Ok(x) = rx.try_recv() {
                batch.push(x);
            }
        }
        let work: Vec<_> = again
            .drain(..)
            .chain(batch.drain(..).map(|(n, o)| (n, o, 0)))
            .collect();
        again = futures_util::stream::iter(work)
            .map(|(name, owner, tried)| make_lease(store.as_ref(), grace, name, owner, tried))
            .buffer_unordered(8)
            .filter_map(|retry| async move { retry })
            .collect()
            .await;
    }
}

/// Makes one member's Lease; what is to be tried again if it could not be made.
async fn make_lease(
    store: &dyn Store,
    grace: Duration,
    name: String,
    owner: OwnerReference,
    tried: u32,
) -> Option<(String, OwnerReference, u32)> {
    const ATTEMPTS: u32 = 5;
    let mut l = orrery_store::stamp::new_object(
        "coordination.k8s.io/v1",
        "Lease",
        Some(orrery_api::cluster::LEASE_NAMESPACE),
        &name,
    );
    l.metadata.owner_references = vec![owner.clone()];
    l.spec = Some(json!({
        "holderIdentity": name,
        "leaseDurationSeconds": grace.as_secs().max(1),
    }));
    match store
        .create(&keys::well_known::cluster_lease(&name), l)
        .await
    {
        Ok(_) | Err(StoreError::AlreadyExists { .. }) => None,
        Err(e) => {
            tracing::warn!(cluster = %name, error = %e, attempt = tried + 1, "making the cluster's heartbeat Lease failed");
            (tried + 1 < ATTEMPTS).then_some((name, owner, tried + 1))
        }
    }
}

/// Writes the taints readiness calls for; without `evict`, no NoExecute taint is added (the
/// cluster waits for the eviction rate).
async fn set_taints(
    store: &dyn Store,
    name: &str,
    eviction: Duration,
    evict: bool,
) -> Result<(), StoreError> {
    let key = keys::well_known::cluster(name);
    let r = update_with(store, &key, |mut o| {
        if o.metadata.deletion_timestamp.is_some() {
            return Ok(None);
        }
        let now = Time::now();
        let st = ClusterStatus::of(&o);
        let spec = cluster::ClusterSpec::of(&o);
        let mut wanted = wanted_taints(ready_of(&st.conditions), now, eviction);
        if !evict {
            hold_eviction(&mut wanted, &spec.taints);
        }
        let Some(taints) = reconcile_taints(&spec.taints, &wanted, now) else {
            return Ok(None);
        };
        let spec_obj = o
            .spec
            .get_or_insert_with(|| Value::Object(Default::default()));
        if let Value::Object(m) = spec_obj {
            if taints.is_empty() {
                m.remove("taints");
            } else {
                m.insert(
                    "taints".into(),
                    serde_json::to_value(&taints).unwrap_or(Value::Null),
                );
            }
        }
        // Taints are in the spec.
        o.metadata.generation = Some(o.metadata.generation.unwrap_or(1) + 1);
        Ok(Some(o))
    })
    .await;
    match r {
        Ok(_) | Err(StoreError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Records a change of readiness.
async fn transition(store: &dyn Store, obj: &Object, from: &str, to: &Condition) {
    let (event_type, reason, failure) = match to.status.as_str() {
        conditions::TRUE if from.is_empty() => ("Normal", "ClusterReady", None),
        conditions::TRUE => ("Normal", "ClusterReady", Some("ClusterRecovered")),
        conditions::FALSE => ("Warning", "ClusterNotReady", Some("ClusterNotReady")),
        _ => ("Warning", "ClusterUnreachable", Some("ClusterUnreachable")),
    };
    let message = if to.message.is_empty() {
        format!("Ready is {} ({})", to.status, to.reason)
    } else {
        format!("Ready is {}: {}", to.status, to.message)
    };
    tracing::info!(cluster = obj.name(), from = %if from.is_empty() { "none" } else { from }, to = %to.status, reason = %to.reason, "cluster readiness changed");
    if let Err(e) = record::event(store, obj, event_type, reason, &message, COMPONENT).await {
        tracing::warn!(cluster = obj.name(), error = %e, "recording an event failed");
    }
    if let Some(type_) = failure {
        let rec = FailureRecord {
            time: Time::now(),
            cluster: obj.name().to_string(),
            type_: type_.to_string(),
            reason: to.reason.clone(),
            message,
        };
        if let Err(e) = record::failure(store, &rec).await {
            tracing::warn!(cluster = obj.name(), error = %e, "recording a failure failed");
        }
    }
}

/// How many tasks record readiness changes.
const RECORDERS: usize = 8;

/// The recorder of a member's changes: always the same one, so that they are recorded in
/// the order they happened.
fn recorder_of(name: &str, recorders: usize) -> usize {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    name.hash(&mut h);
    (h.finish() % recorders.max(1) as u64) as usize
}

type Renewals = HashMap<String, (Option<MicroTime>, Instant)>;

/// Heartbeats are taken in as they come (a heartbeat counts when this controller sees it);
/// the one key, a tick, judges them.
struct Health {
    store: Arc<dyn Store>,
    cfg: HealthConfig,
    metrics: Handle,
    /// Every cluster gets a whole grace period from our start (as Kubernetes' node lifecycle
    /// controller does): heartbeats that could not arrive while the control plane was down
    /// say nothing about the members.
    started: Instant,
    seen: HashMap<String, Seen>,
    leases_listed: bool,
    /// Lease name -> its renewTime and when this controller saw it change.
    renewals: Renewals,
    /// Leases asked for and not seen yet (made off the loop: thousands of Clusters arriving at
    /// once must not hold up the heartbeats queued behind them).
    asked: std::collections::HashSet<String>,
    make_tx: mpsc::UnboundedSender<(String, OwnerReference)>,
    /// Readiness changes are recorded (Events, the failure history) off the loop, each
    /// member's in order: a fleet turning Ready at once must not hold up the heartbeats
    /// queued behind it. A few recorders, each member always on the same one: one alone,
    /// writing one after another, was minutes behind a fleet of 10,000 registering.
    recorders: Vec<mpsc::UnboundedSender<(Arc<Object>, String, Condition)>>,
    /// The tick's writes (Unknown, taints) run off the loop too, one round at a time.
    writing: parking_lot::Mutex<Option<tokio::task::JoinHandle<()>>>,
    last_prune: parking_lot::Mutex<Instant>,
    /// The eviction rate's tokens, when there is a rate.
    bucket: Option<parking_lot::Mutex<Bucket>>,
}

impl Health {
    fn record(&self, o: Arc<Object>, from: String, to: Condition) {
        let k = recorder_of(o.name(), self.recorders.len());
        let _ = self.recorders[k].send((o, from, to));
    }

    fn on_cluster(&mut self, ev: Event) {
        let now = Instant::now();
        let listed_now = matches!(ev, Event::Listed(_));
        match ev {
            Event::Listed(items) => {
                let (seen, started) = (&self.seen, self.started);
                let fresh = items
                    .into_iter()
                    .map(|o| {
                        let st = ClusterStatus::of(&o);
                        let mut at = instant_of(
                            st.last_heartbeat_time
                                .or(o.metadata.creation_timestamp.map(Into::into)),
                            now,
                        )
                        .max(started);
                        // Listed again: what this controller saw arrive stands.
                        if let Some(old) = seen.get(o.name()) {
                            at = at.max(old.heartbeat_at);
                        }
                        (o.name().to_string(), Seen::new(&o, at))
                    })
                    .collect();
                self.seen = fresh;
            }
            Event::Upsert(o) => {
                let change = match self.seen.get_mut(o.name()) {
                    Some(entry) => entry.observe(&o, now),
                    None => {
                        let entry = Seen::new(&o, now);
                        let first = entry.ready.is_some().then(String::new);
                        self.seen.insert(o.name().to_string(), entry);
                        first
                    }
                };
                if let Some(from) = change
                    && let Some(to) = self.seen.get(o.name()).and_then(|e| e.ready.clone())
                {
                    self.record(o.clone(), from, to);
                }
                if self.leases_listed {
                    ask_for_lease(
                        o.name(),
                        &self.seen,
                        &self.renewals,
                        &mut self.asked,
                        &self.make_tx,
                    );
                }
            }
            Event::Delete(o) => {
                self.seen.remove(o.name());
                self.asked.remove(o.name());
            }
        }
        if self.leases_listed && listed_now {
            ask_for_leases(&self.seen, &self.renewals, &mut self.asked, &self.make_tx);
        }
    }

    fn on_lease(&mut self, ev: Event) {
        let now = Instant::now();
        let listed_now = matches!(ev, Event::Listed(_));
        if listed_now {
            self.leases_listed = true;
        }
        match ev {
            Event::Listed(items) => {
                let before = std::mem::take(&mut self.renewals);
                for l in items {
                    let renew = orrery_api::cluster::LeaseBeat::of(&l).renew_time;
                    let at = match before.get(l.name()) {
                        // Listed again: what this controller saw arrive stands.
                        Some((r, at)) if *r == renew => *at,
                        Some(_) => now,
                        None => instant_of(renew, now).max(self.started),
                    };
                    self.renewals.insert(l.name().to_string(), (renew, at));
                }
            }
            Event::Upsert(l) => {
                let renew = orrery_api::cluster::LeaseBeat::of(&l).renew_time;
                match self.renewals.get_mut(l.name()) {
                    Some((r, at)) => {
                        if *r != renew {
                            *r = renew;
                            *at = now;
                        }
                    }
                    None => {
                        self.renewals.insert(l.name().to_string(), (renew, now));
                    }
                }
            }
            Event::Delete(l) => {
                self.renewals.remove(l.name());
                self.asked.remove(l.name());
                ask_for_lease(
                    l.name(),
                    &self.seen,
                    &self.renewals,
                    &mut self.asked,
                    &self.make_tx,
                );
            }
        }
        if listed_now {
            ask_for_leases(&self.seen, &self.renewals, &mut self.asked, &self.make_tx);
        }
    }

    fn tick(&self) -> Duration {
        (self.cfg.grace_period / 4).clamp(Duration::from_millis(100), Duration::from_secs(1))
    }

    /// Judges every member's heartbeats: Unknown past the grace period, taints past the
    /// eviction timeout; the writes go off the loop.
    fn judge(&self) {
        let mut writing = self.writing.lock();
        // The last round's writes still under way: this tick judges nothing (what it would
        // write is being written).
        if writing.as_ref().is_some_and(|w| !w.is_finished()) {
            return;
        }
        let now_t = Time::now();
        let mut todo: Vec<(String, bool, bool, bool)> = Vec::new();
        // The longest not Ready first, so that a rate lets the oldest outage go first.
        let mut order: Vec<(&String, &Seen)> = self.seen.iter().collect();
        order.sort_by_key(|(n, s)| {
            (
                s.ready.as_ref().and_then(|c| c.last_transition_time),
                n.as_str(),
            )
        });
        let mut waiting = 0i64;
        for (name, s) in order {
            if s.deleting {
                continue;
            }
            let heard = match self.renewals.get(name) {
                Some((_, at)) => s.heartbeat_at.max(*at),
                None => s.heartbeat_at,
            };
            let unknown =
                heard.elapsed() > self.cfg.grace_period && s.ready_status() != conditions::UNKNOWN;
            let mut wanted = wanted_taints(s.ready.as_ref(), now_t, self.cfg.eviction_timeout);
            // Under a rate, a write may add a NoExecute taint only with a token taken here:
            // the write decides its taints again from the stored status, later, and may find
            // the eviction timeout passed where this sweep did not (it is then held, and the
            // next sweep takes its token).
            let starts = starts_eviction(&wanted, &s.taints);
            let evict = may_evict(self.bucket.as_ref(), starts, Instant::now());
            if starts && !evict {
                waiting += 1;
                hold_eviction(&mut wanted, &s.taints);
                tracing::debug!(cluster = %name, "its eviction waits for the fleet's eviction rate");
            }
            let taints = reconcile_taints(&s.taints, &wanted, now_t).is_some();
            if evict && starts_eviction(&wanted, &s.taints) {
                self.cfg.eviction_metrics.evicted.inc();
            }
            if unknown || taints {
                todo.push((name.clone(), unknown, taints, evict));
            }
        }
        let before = self.cfg.eviction_metrics.waiting.set(waiting);
        if waiting > 0 && before == 0 {
            tracing::warn!(
                waiting,
                "evictions wait for the fleet's eviction rate (--eviction-rate)"
            );
        }
        if todo.is_empty() {
            return;
        }
        let (store, cfg, metrics) = (self.store.clone(), self.cfg.clone(), self.metrics.clone());
        *writing = Some(tokio::spawn(async move {
            let mut failed = 0;
            for (name, unknown, taints, evict) in todo {
                if unknown
                    && let Err(e) = set_unknown(store.as_ref(), &name, cfg.grace_period).await
                {
                    tracing::warn!(cluster = %name, error = %e, "marking the cluster unknown failed");
                    failed += 1;
                }
                if taints
                    && let Err(e) =
                        set_taints(store.as_ref(), &name, cfg.eviction_timeout, evict).await
                {
                    tracing::warn!(cluster = %name, error = %e, "updating the cluster's taints failed");
                    failed += 1;
                }
            }
            metrics.errors.inc_by(failed);
        }));
    }
}

#[async_trait::async_trait]
impl Reconciler for Health {
    type Key = ();
    type Error = StoreError;

    fn on_event(&mut self, source: Origin, ev: Event, _: &mut Keys<()>) {
        match source.name {
            "clusters" => self.on_cluster(ev),
            _ => self.on_lease(ev),
        }
    }

    fn all_keys(&self) -> Vec<()> {
        vec![()]
    }

    async fn reconcile(&self, _: &()) -> Result<Action, StoreError> {
        self.judge();
        let prune = {
            let mut last = self.last_prune.lock();
            let due = last.elapsed() > Duration::from_secs(3600);
            if due {
                *last = Instant::now();
            }
            due
        };
        if prune && let Err(e) = record::prune_failures(&self.store, 30 * 86400).await {
            tracing::warn!(error = %e, "pruning the failure history failed");
        }
        Ok(Action::After(self.tick()))
    }
}

/// Runs the health controller until shutdown.
pub async fn run(
    store: Arc<dyn Store>,
    cfg: HealthConfig,
    metrics: Arc<crate::runtime::metrics::ControllerMetrics>,
    shutdown: watch::Receiver<bool>,
) {
    let metrics = metrics.of("health");
    let (make_tx, make_rx) = mpsc::unbounded_channel();
    tokio::spawn(make_leases(store.clone(), cfg.grace_period, make_rx));
    let recorders = (0..RECORDERS)
        .map(|_| {
            let (tx, mut rx) = mpsc::unbounded_channel::<(Arc<Object>, String, Condition)>();
            let store = store.clone();
            tokio::spawn(async move {
                while let Some((o, from, to)) = rx.recv().await {
                    transition(store.as_ref(), &o, &from, &to).await;
                }
            });
            tx
        })
        .collect();
    let bucket = cfg
        .eviction_rate
        .map(|r| parking_lot::Mutex::new(Bucket::new(r, Instant::now())));
    let h = Health {
        store: store.clone(),
        cfg,
        metrics: metrics.clone(),
        started: Instant::now(),
        seen: HashMap::new(),
        leases_listed: false,
        renewals: HashMap::new(),
        asked: Default::default(),
        make_tx,
        recorders,
        writing: Default::default(),
        last_prune: parking_lot::Mutex::new(Instant::now()),
        bucket,
    };
    Controller::new("health", store, h, metrics)
        .source(Source::new("clusters", keys::well_known::clusters()))
        .source(Source::new("leases", keys::well_known::cluster_leases()))
        .run(shutdown)
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(status: &str, secs_ago: i64) -> Condition {
        let mut c = Condition::new(CONDITION_READY, status, "R", "");
        c.last_transition_time = Time::from_unix_seconds(Time::now().unix_seconds() - secs_ago);
        c
    }

    #[test]
    fn a_members_changes_go_to_one_recorder_and_members_spread_over_all() {
        let mut used = [0usize; RECORDERS];
        for i in 0..1000 {
            let name = format!("fleet-{i}");
            let k = recorder_of(&name, RECORDERS);
            assert_eq!(recorder_of(&name, RECORDERS), k, "{name}");
            used[k] += 1;
        }
        assert!(used.iter().all(|&n| n > 60), "{used:?}");
        assert_eq!(recorder_of("x", 1), 0);
    }

    #[test]
    fn the_eviction_bucket_keeps_its_pace() {
        let t0 = Instant::now();
        let mut b = Bucket::new(
            EvictionRate {
                per_minute: 6.0,
                burst: 2,
            },
            t0,
        );
        // The burst at once, then one every 10 s.
        assert!(b.take(t0) && b.take(t0));
        assert!(!b.take(t0));
        assert!(!b.take(t0 + Duration::from_secs(9)));
        assert!(b.take(t0 + Duration::from_secs(10)));
        assert!(!b.take(t0 + Duration::from_secs(11)));
        // Idle a long while: no more than the burst.
        let later = t0 + Duration::from_secs(600);
        assert!(b.take(later) && b.take(later) && !b.take(later));
        // A write for a cluster whose eviction this sweep did not see start may add no
        // NoExecute taint under a rate (it would find the timeout passed later and evict
        // without a token), and takes no token.
        let b = parking_lot::Mutex::new(Bucket::new(
            EvictionRate {
                per_minute: 6.0,
                burst: 1,
            },
            t0,
        ));
        assert!(!may_evict(Some(&b), false, t0));
        assert!(may_evict(Some(&b), true, t0));
        assert!(!may_evict(Some(&b), true, t0));
        assert!(may_evict(None, false, t0));
    }

    #[test]
    fn a_held_eviction_keeps_noschedule_and_a_given_noexecute() {
        let now = Time::now();
        let mut wanted = vec![
            (TAINT_UNREACHABLE, TaintEffect::NoSchedule),
            (TAINT_UNREACHABLE, TaintEffect::NoExecute),
        ];
        assert!(starts_eviction(&wanted, &[]));
        hold_eviction(&mut wanted, &[]);
        assert_eq!(wanted, vec![(TAINT_UNREACHABLE, TaintEffect::NoSchedule)]);
        // One already tainted stays so.
        let given = [Taint::new(TAINT_UNREACHABLE, TaintEffect::NoExecute, now)];
        let mut wanted = vec![(TAINT_UNREACHABLE, TaintEffect::NoExecute)];
        assert!(!starts_eviction(&wanted, &given));
        hold_eviction(&mut wanted, &given);
        assert_eq!(wanted.len(), 1);
    }

    #[test]
    fn taints_follow_readiness() {
        let now = Time::now();
        let ev = Duration::from_secs(30);
        assert!(wanted_taints(None, now, ev).is_empty());
        assert!(wanted_taints(Some(&cond("True", 100)), now, ev).is_empty());
        assert_eq!(
            wanted_taints(Some(&cond("False", 5)), now, ev),
            vec![(TAINT_NOT_READY, TaintEffect::NoSchedule)]
        );
        assert_eq!(
            wanted_taints(Some(&cond("Unknown", 31)), now, ev),
            vec![
                (TAINT_UNREACHABLE, TaintEffect::NoSchedule),
                (TAINT_UNREACHABLE, TaintEffect::NoExecute)
            ]
        );
    }

    #[test]
    fn reconciling_keeps_user_taints_and_stamps() {
        let now = Time::now();
        let user = Taint {
            key: "dedicated".into(),
            value: "ml".into(),
            effect: TaintEffect::NoSchedule,
            time_added: None,
        };
        let old = Taint::new(
            TAINT_UNREACHABLE,
            TaintEffect::NoSchedule,
            Time::from_unix_seconds(1).unwrap(),
        );
        // Nothing to change.
        assert!(
            reconcile_taints(
                &[user.clone(), old.clone()],
                &[(TAINT_UNREACHABLE, TaintEffect::NoSchedule)],
                now
            )
            .is_none()
        );
        // Add NoExecute, keep the first taint's time.
        let out = reconcile_taints(
            &[user.clone(), old.clone()],
            &[
                (TAINT_UNREACHABLE, TaintEffect::NoSchedule),
                (TAINT_UNREACHABLE, TaintEffect::NoExecute),
            ],
            now,
        )
        .unwrap();
        assert_eq!(out.len(), 3);
        assert_eq!(out[1].time_added, old.time_added);
        assert_eq!(out[2].effect, TaintEffect::NoExecute);
        // Healthy again: only the user's taint stays.
        assert_eq!(reconcile_taints(&out, &[], now).unwrap(), vec![user]);
        // Switching from unreachable to not-ready replaces the key.
        let out =
            reconcile_taints(&[old], &[(TAINT_NOT_READY, TaintEffect::NoSchedule)], now).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].key, TAINT_NOT_READY);
    }
}
