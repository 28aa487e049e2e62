//! The scheduling controller: decides each binding's `spec.clusters` with the pure engine,
//! records why in the binding's status, tells the template's owner with an Event, and moves
//! an application away from a cluster where it stays unhealthy (Karmada's application
//! failover).
//!
//! A binding is decided again when its spec changes (its generation) or when a cluster fact
//! that placement depends on changes (readiness, taints, labels, location, served APIs);
//! heartbeats that only move figures do not reschedule anything.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use orrery_api::binding::{
    self, AggregatedStatusItem, BindingSpec, BindingStatus, CONDITION_SCHEDULED, Eviction,
};
use orrery_api::cluster::{CONDITION_READY, ClusterSpec, ClusterStatus};
use orrery_api::conditions::{self, Condition};
use orrery_api::policy::DEFAULT_FAILOVER_TOLERATION_SECONDS;
use orrery_api::work::Health;
use orrery_api::{Object, Time, keys};
use orrery_scheduler::{ClusterSnapshot, Task, schedule};
use orrery_store::Store;
use tokio::sync::{mpsc, watch};

use super::detector::binding_key;
use super::{Job, follow, next_batch, run_jobs, subject};
use crate::informer::Event;
use crate::record;

const COMPONENT: &str = "orrery-scheduler";

#[derive(Clone, Debug)]
enum Src {
    Cluster,
    Binding,
}

/// What the scheduler reads from a Cluster object.
pub fn snapshot_of(c: &Object) -> ClusterSnapshot {
    let spec = ClusterSpec::of(c);
    let st = ClusterStatus::of(c);
    let ready = conditions::find(&st.conditions, CONDITION_READY).is_some_and(|r| r.is_true());
    let api_kinds = (!st.api_enablements.is_empty()).then(|| {
        st.api_enablements
            .iter()
            .flat_map(|e| {
                e.resources
                    .iter()
                    .map(|r| (e.group_version.clone(), r.kind.clone()))
            })
            .collect::<HashSet<_>>()
    });
    // What is taken: placed and pending (waiting for a node) alike.
    let (allocatable, allocated) = match st.resource_summary {
        Some(r) => {
            let mut taken = r.allocated;
            for (k, q) in r.allocating {
                let total = taken.get(&k).map(|a| *a + q).unwrap_or(q);
                taken.insert(k, total);
            }
            (r.allocatable, taken)
        }
        None => Default::default(),
    };
    ClusterSnapshot {
        name: c.name().to_string(),
        labels: c.metadata.labels.clone(),
        provider: spec.provider,
        region: spec.region,
        zones: spec.zones,
        properties: st.properties,
        taints: spec.taints,
        ready,
        api_kinds,
        allocatable,
        allocated,
    }
}

/// The facts placement depends on, hashed.
fn fingerprint(s: &ClusterSnapshot) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    s.labels.hash(&mut h);
    s.provider.hash(&mut h);
    s.region.hash(&mut h);
    s.zones.hash(&mut h);
    s.ready.hash(&mut h);
    for t in &s.taints {
        (&t.key, &t.value, t.effect.as_str()).hash(&mut h);
    }
    let mut kinds: Vec<_> = s.api_kinds.iter().flatten().collect();
    kinds.sort();
    kinds.hash(&mut h);
    h.finish()
}

type BKey = (String, String);

struct Scheduler {
    store: Arc<dyn Store>,
    clusters: BTreeMap<String, ClusterSnapshot>,
    prints: HashMap<String, u64>,
    bindings: HashMap<BKey, Arc<Object>>,
    dirty: BTreeSet<BKey>,
    /// Bindings to decide again because clusters changed (not their own spec).
    cluster_dirty: BTreeSet<BKey>,
    synced: (bool, bool),
}

/// Runs the scheduling controller until shutdown.
pub async fn run(store: Arc<dyn Store>, mut shutdown: watch::Receiver<bool>) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    follow(
        store.clone(),
        keys::well_known::clusters(),
        Src::Cluster,
        tx.clone(),
        shutdown.clone(),
    );
    follow(
        store.clone(),
        keys::prefix("multicluster.io", "resourcebindings", None),
        Src::Binding,
        tx,
        shutdown.clone(),
    );
    let mut s = Scheduler {
        store,
        clusters: BTreeMap::new(),
        prints: HashMap::new(),
        bindings: HashMap::new(),
        dirty: BTreeSet::new(),
        cluster_dirty: BTreeSet::new(),
        synced: (false, false),
    };
    let mut retry = BTreeSet::new();
    loop {
        let Some(batch) = next_batch(&mut rx, Duration::from_secs(1), &mut shutdown).await else {
            return;
        };
        let ticked = batch.is_empty();
        for (src, ev) in batch {
            s.on_event(src, ev);
        }
        if ticked {
            s.dirty.append(&mut retry);
            s.check_failover();
        }
        if s.synced != (true, true) {
            continue;
        }
        let (n, started) = (
            s.dirty.len() + s.cluster_dirty.len(),
            std::time::Instant::now(),
        );
        retry = s.reconcile_dirty().await;
        super::log_round("scheduling", n, started);
    }
}

impl Scheduler {
    fn on_event(&mut self, src: Src, ev: Event) {
        match src {
            Src::Cluster => {
                let before: HashMap<String, u64> = self.prints.clone();
                match ev {
                    Event::Listed(items) => {
                        self.clusters.clear();
                        self.prints.clear();
                        for c in items {
                            let s = snapshot_of(&c);
                            self.prints.insert(s.name.clone(), fingerprint(&s));
                            self.clusters.insert(s.name.clone(), s);
                        }
                        self.synced.0 = true;
                    }
                    Event::Upsert(c) => {
                        let s = snapshot_of(&c);
                        self.prints.insert(s.name.clone(), fingerprint(&s));
                        self.clusters.insert(s.name.clone(), s);
                    }
                    Event::Delete(c) => {
                        self.clusters.remove(c.name());
                        self.prints.remove(c.name());
                    }
                }
                if before != self.prints {
                    self.cluster_dirty.extend(self.bindings.keys().cloned());
                }
            }
            Src::Binding => match ev {
                Event::Listed(items) => {
                    self.bindings.clear();
                    for b in items {
                        let k = (b.namespace().to_string(), b.name().to_string());
                        self.dirty.insert(k.clone());
                        self.bindings.insert(k, b);
                    }
                    self.synced.1 = true;
                }
                Event::Upsert(b) => {
                    let k = (b.namespace().to_string(), b.name().to_string());
                    self.dirty.insert(k.clone());
                    self.bindings.insert(k, b);
                }
                Event::Delete(b) => {
                    self.bindings
                        .remove(&(b.namespace().to_string(), b.name().to_string()));
                }
            },
        }
    }

    /// Evicts applications that stayed unhealthy in a cluster past their toleration.
    fn check_failover(&mut self) {
        let now = Time::now();
        for (k, b) in &self.bindings {
            let Some(spec) = parse_spec(b) else { continue };
            let Some(f) = &spec.failover else { continue };
            let tolerate = f
                .decision_conditions
                .toleration_seconds
                .unwrap_or(DEFAULT_FAILOVER_TOLERATION_SECONDS);
            let st = parse_status(b);
            if st
                .aggregated_status
                .iter()
                .any(|a| unhealthy_for(a, now) >= Some(tolerate))
                && spec
                    .clusters
                    .iter()
                    .any(|c| !spec.evictions.iter().any(|e| e.cluster == c.name))
            {
                self.dirty.insert(k.clone());
            }
        }
    }

    async fn reconcile_dirty(&mut self) -> BTreeSet<BKey> {
        let own = std::mem::take(&mut self.dirty);
        let by_clusters = std::mem::take(&mut self.cluster_dirty);
        let mut jobs: Vec<Job<BKey>> = Vec::new();
        let snapshot: Vec<ClusterSnapshot> = self.clusters.values().cloned().collect();
        for k in own.union(&by_clusters) {
            if let Some(j) = self.reconcile(k, &snapshot, by_clusters.contains(k)) {
                jobs.push(j);
            }
        }
        run_jobs(jobs).await
    }

    fn reconcile(
        &self,
        k: &BKey,
        clusters: &[ClusterSnapshot],
        by_clusters: bool,
    ) -> Option<Job<BKey>> {
        let b = self.bindings.get(k)?.clone();
        if b.metadata.deletion_timestamp.is_some() {
            return None;
        }
        // Decided for this generation already, and nothing else asks for a decision: skip
        // without parsing (the binding controller's status writes land here).
        let observed = b
            .status
            .as_ref()
            .and_then(|s| s.get("schedulerObservedGeneration"))
            .and_then(serde_json::Value::as_i64);
        let failover = b.spec.as_ref().is_some_and(|s| s.get("failover").is_some());
        if !by_clusters && !failover && observed == Some(b.metadata.generation.unwrap_or(1)) {
            return None;
        }
        let mut spec = parse_spec(&b)?;
        let mut status = parse_status(&b);
        let generation = b.metadata.generation.unwrap_or(1);
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
                let already = spec.evictions.iter().any(|e| e.cluster == a.cluster_name);
                if placed && !already && unhealthy_for(a, now) >= Some(tolerate) {
                    let keep_until = match f.purge_mode.as_str() {
                        "Graciously" => f.grace_period_seconds.map(|g| now.add_seconds(g)),
                        _ => None,
                    };
                    spec.evictions.push(Eviction {
                        cluster: a.cluster_name.clone(),
                        reason: format!("unhealthy for more than {tolerate}s"),
                        since: now,
                        keep_until,
                        keep: f.purge_mode == "Never",
                    });
                    evicted_now.push(a.cluster_name.clone());
                }
            }
        }
        let evicted: Vec<String> = spec.evictions.iter().map(|e| e.cluster.clone()).collect();
        let up_to_date =
            status.scheduler_observed_generation == Some(generation) && evicted_now.is_empty();
        if up_to_date && !by_clusters {
            // Our own status write coming back, or the binding controller's.
            return None;
        }
        let kind = spec.resource.kind.clone();
        let divisible = spec.replicas > 0 || orrery_api::interpret::has_divisible_replicas(&kind);
        let request = spec
            .replica_requirements
            .as_ref()
            .map(|r| r.resource_request.clone())
            .unwrap_or_default();
        let decision = schedule(
            clusters,
            &Task {
                api_version: &spec.resource.api_version,
                kind: &kind,
                replicas: spec.replicas,
                divisible,
                request: &request,
                placement: &spec.placement,
                targets: &spec.target_clusters,
                previous: &spec.clusters,
                evicted: &evicted,
            },
        );
        let changed_spec_generation = status.scheduler_observed_generation != Some(generation);
        let new_clusters = match &decision.error {
            // Clusters going away must not empty a placement that stands; a changed spec
            // with no fit does.
            Some(_) if !changed_spec_generation && evicted_now.is_empty() => spec.clusters.clone(),
            _ => decision.clusters.clone(),
        };
        let cond = match &decision.error {
            None => Condition::new(
                CONDITION_SCHEDULED,
                conditions::TRUE,
                "Success",
                placed_message(&new_clusters),
            ),
            Some(e) => Condition::new(
                CONDITION_SCHEDULED,
                conditions::FALSE,
                "Unschedulable",
                e.clone(),
            ),
        };
        let old_cond = conditions::find(&status.conditions, CONDITION_SCHEDULED).cloned();
        let mut conds = status.conditions.clone();
        conditions::set(&mut conds, cond.clone(), now);
        let clusters_changed = new_clusters != spec.clusters;
        let status_changed = conds != status.conditions
            || status.decisions != decision.reasons
            || status.scheduler_observed_generation != Some(generation)
            || status.scheduler_observed_affinity_name != decision.affinity_name;
        if !clusters_changed && !status_changed && evicted_now.is_empty() {
            return None;
        }
        spec.clusters = new_clusters;
        status.conditions = conds;
        status.decisions = decision.reasons.clone();
        status.scheduler_observed_generation = Some(generation);
        status.scheduler_observed_affinity_name = decision.affinity_name.clone();
        if clusters_changed {
            status.last_scheduled_time = Some(now);
        }
        let mut next = (*b).clone();
        next.spec = serde_json::to_value(&spec).ok();
        next.status = serde_json::to_value(&status).ok();
        let store = self.store.clone();
        let key = k.clone();
        let bkey = binding_key(&k.0, &k.1);
        let announce = old_cond.as_ref().map(|c| (&c.status, &c.message))
            != Some((&cond.status, &cond.message))
            || !evicted_now.is_empty();
        let r = spec.resource.clone();
        Some(Box::pin(async move {
            store
                .update(&bkey, next, b.revision())
                .await
                .map_err(|e| (key.clone(), e.to_string()))?;
            if announce {
                let about = subject(&r.api_version, &r.kind, &r.namespace, &r.name, &r.uid);
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
        }))
    }
}

fn placed_message(clusters: &[binding::TargetCluster]) -> String {
    if clusters.is_empty() {
        return "placed on no cluster".into();
    }
    let parts: Vec<String> = clusters
        .iter()
        .map(|c| format!("{}({})", c.name, c.replicas))
        .collect();
    format!("placed on {}", parts.join(", "))
}

fn unhealthy_for(a: &AggregatedStatusItem, now: Time) -> Option<i64> {
    if a.health != Health::Unhealthy {
        return None;
    }
    Some(now.seconds_since(a.health_since?))
}

pub(crate) fn parse_spec(b: &Object) -> Option<BindingSpec> {
    serde_json::from_value(b.spec.clone()?).ok()
}

pub(crate) fn parse_status(b: &Object) -> BindingStatus {
    b.status
        .clone()
        .and_then(|s| serde_json::from_value(s).ok())
        .unwrap_or_default()
}
