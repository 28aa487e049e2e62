//! Migrations: the move of a stateful workload and its data to another cluster (the draft's
//! follow-up scheduling with "smooth migration strategies, ensuring service continuity, data
//! consistency, and fault recovery").
//!
//! The scheduler starts a Migration when a decision moves a stateful workload (a policy
//! change, a drain, shedding, a failover), or chooses the target of one a user made. This
//! controller carries it out: it reads what the members report in the binding's Works at
//! both ends, asks [`plan::step`] for the next step, and writes the Migration's status, the
//! binding's overlay (which copy is fenced, which transfers each Work carries, where the
//! workload runs) and Events. Everything it acts on is stored, so a restart in any phase
//! carries on where the move was.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use orrery_api::binding::{self, BindingSpec, BindingStatus};
use orrery_api::cluster::{TAINT_NOT_READY, TAINT_UNREACHABLE};
use orrery_api::stateful::{MigrationPhase, MigrationStatus};
use orrery_api::work::{self, Health, WorkStatus};
use orrery_api::{Object, keys};
use orrery_store::{Store, StoreError};
use serde::Deserialize;
use tokio::sync::watch;

use crate::propagation::subject;
use crate::record;
use crate::runtime::Event;
use crate::runtime::controller::{Action, Controller, Keys, Origin, Reconciler, Source};

pub mod plan;
pub mod standby;

pub use plan::Settings;

/// Keeps Migrations until their overlay is out of the binding.
pub const FINALIZER: &str = "multicluster.io/migration";
const COMPONENT: &str = "orrery-migration";

type MKey = (String, String);
type BKey = (String, String);

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Src {
    Migration,
    Binding,
    Work,
    Cluster,
    /// Members' heartbeat Leases: a renewal is hearing from the member.
    Lease,
}

/// What the controller keeps of a cluster.
#[derive(Clone, Copy, Debug, Default)]
struct ClusterFacts {
    serving: bool,
    bandwidth: i64,
    /// When it was last heard from: its last heartbeat's time, or when this controller saw
    /// that heartbeat arrive (finer).
    heard: Option<orrery_api::MicroTime>,
    /// The heartbeat's own time, whole seconds.
    heard_time: Option<i64>,
}

struct Migrations {
    store: Arc<dyn Store>,
    settings: Settings,
    migrations: HashMap<MKey, Arc<Object>>,
    /// The migration under way for each binding (by its status).
    active: HashMap<BKey, MKey>,
    /// Leaders' followers (for the switch).
    followers: HashMap<BKey, BTreeSet<BKey>>,
    leader_of: HashMap<BKey, BKey>,
    /// Bindings of Services, with the Service's name (for the switch: those selecting a
    /// moved workload's pods).
    services: BTreeMap<BKey, String>,
    clusters: HashMap<String, ClusterFacts>,
    dirty: BTreeSet<MKey>,
    /// Bindings that keep a standby copy, and those to look at again.
    standbys: BTreeSet<BKey>,
    dirty_standbys: BTreeSet<BKey>,
    /// Members' Lease renewal times, by cluster.
    renewals: HashMap<String, orrery_api::MicroTime>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Key {
    Migration(MKey),
    /// A binding that keeps a standby copy.
    Standby(BKey),
}

/// The controller's view is written by its steps too, so it is behind an async lock (one
/// step at a time).
struct Mover(tokio::sync::Mutex<Migrations>);

/// Timeouts and grace periods: a migration under way, and a standby, is looked at each second.
const TICK: Duration = Duration::from_secs(1);

#[async_trait::async_trait]
impl Reconciler for Mover {
    type Key = Key;
    type Error = StoreError;

    fn on_event(&mut self, source: Origin, ev: Event, keys: &mut Keys<Key>) {
        let src = match source.name {
            "migrations" => Src::Migration,
            "bindings" => Src::Binding,
            "works" => Src::Work,
            "clusters" => Src::Cluster,
            _ => Src::Lease,
        };
        let m = self.0.get_mut();
        m.on_event(src, ev);
        keys.extend(std::mem::take(&mut m.dirty).into_iter().map(Key::Migration));
        keys.extend(
            std::mem::take(&mut m.dirty_standbys)
                .into_iter()
                .map(Key::Standby),
        );
    }

    fn all_keys(&self) -> Vec<Key> {
        let Ok(m) = self.0.try_lock() else {
            // Never held between rounds, when this is asked.
            return Vec::new();
        };
        let mut all: Vec<Key> = m.migrations.keys().cloned().map(Key::Migration).collect();
        all.extend(m.standbys.iter().cloned().map(Key::Standby));
        all
    }

    async fn reconcile(&self, key: &Key) -> Result<Action, StoreError> {
        let mut m = self.0.lock().await;
        match key {
            Key::Migration(k) => {
                m.reconcile(k).await?;
                Ok(if m.active.values().any(|a| a == k) {
                    Action::After(TICK)
                } else {
                    Action::Done
                })
            }
            Key::Standby(k) => {
                m.reconcile_standby(k).await?;
                Ok(if m.standbys.contains(k) {
                    Action::After(TICK)
                } else {
                    Action::Done
                })
            }
        }
    }
}

/// Runs the migration controller until shutdown.
pub async fn run(
    store: Arc<dyn Store>,
    settings: Settings,
    metrics: Arc<crate::runtime::metrics::ControllerMetrics>,
    shutdown: watch::Receiver<bool>,
) {
    let m = Migrations {
        store: store.clone(),
        settings,
        migrations: HashMap::new(),
        active: HashMap::new(),
        followers: HashMap::new(),
        leader_of: HashMap::new(),
        services: BTreeMap::new(),
        clusters: HashMap::new(),
        dirty: BTreeSet::new(),
        standbys: BTreeSet::new(),
        dirty_standbys: BTreeSet::new(),
        renewals: HashMap::new(),
    };
    Controller::new(
        "migration",
        store,
        Mover(tokio::sync::Mutex::new(m)),
        metrics.of("migration"),
    )
    .source(Source::new(
        "migrations",
        keys::well_known::migrations(None),
    ))
    .source(Source::new("bindings", keys::well_known::bindings(None)))
    .source(Source::new("works", keys::well_known::works(None)))
    .source(Source::new("clusters", keys::well_known::clusters()))
    // Members' heartbeat Leases: a renewal is hearing from the member.
    .source(Source::new("leases", keys::well_known::cluster_leases()).outside_barrier())
    .run(shutdown)
    .await;
}

/// The Service a binding places, if it places one, read without parsing the whole spec.
fn service_of(b: &Object) -> Option<String> {
    let r = b.spec.as_ref()?.get("resource")?;
    (r.get("kind")?.as_str()? == "Service" && r.get("apiVersion")?.as_str()? == "v1")
        .then(|| r.get("name")?.as_str().map(str::to_string))
        .flatten()
}

/// A binding's leader, read without parsing the whole spec.
fn leader_of(b: &Object) -> Option<BKey> {
    let f = b.spec.as_ref()?.pointer("/placement/followUp")?;
    Some((
        b.namespace().to_string(),
        binding::name_for(f.get("kind")?.as_str()?, f.get("name")?.as_str()?),
    ))
}

fn serving(c: &Object) -> ClusterFacts {
    let spec = orrery_api::cluster::ClusterSpec::of(c);
    let st = orrery_api::cluster::ClusterStatus::of(c);
    ClusterFacts {
        serving: st.ready()
            && !spec
                .taints
                .iter()
                .any(|t| t.key == TAINT_NOT_READY || t.key == TAINT_UNREACHABLE),
        bandwidth: st
            .network
            .as_ref()
            .and_then(|n| n.bandwidth_bytes_per_second)
            .filter(|b| *b > 0)
            .unwrap_or(orrery_scheduler::moves::DEFAULT_BANDWIDTH),
        heard: st.last_heartbeat_time,
        heard_time: st.last_heartbeat_time.map(|t| t.time().unix_seconds()),
    }
}

impl Migrations {
    /// Keeps a binding's standby copy: a round whenever it falls half its allowed lag behind.
    async fn reconcile_standby(&mut self, bk: &BKey) -> Result<(), StoreError> {
        let key = keys::well_known::binding(&bk.0, &bk.1);
        let b = match self.store.get(&key).await {
            Ok(b) => b,
            Err(StoreError::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        let Some(spec) = BindingSpec::of(&b) else {
            return Ok(());
        };
        let status = BindingStatus::of(&b);
        let id = standby::transfer_id(&b.metadata.uid);
        let template = spec.resource.clone();
        let source_cluster = standby::source_of(&spec).unwrap_or_default().to_string();
        let source = plan::End {
            serving: self
                .clusters
                .get(&source_cluster)
                .is_some_and(|c| c.serving),
            work: if source_cluster.is_empty() {
                None
            } else {
                self.work_seen(&source_cluster, bk, &id, &template).await?
            },
        };
        let standby_end = plan::End {
            serving: self.clusters.get(&spec.standby).is_some_and(|c| c.serving),
            work: if spec.standby.is_empty() {
                None
            } else {
                self.work_seen(&spec.standby, bk, &id, &template).await?
            },
        };
        let bw = |c: &str| {
            self.clusters
                .get(c)
                .map_or(orrery_scheduler::moves::DEFAULT_BANDWIDTH, |f| f.bandwidth)
        };
        let max_lag = spec
            .placement
            .stateful
            .as_ref()
            .and_then(|s| s.standby.as_ref())
            .map_or(30, |s| s.max_lag_seconds);
        let workload = format!("{}/{}", template.kind, template.name);
        let out = standby::step(&standby::Input {
            now: orrery_api::MicroTime::now(),
            id: &id,
            namespace: &bk.0,
            workload: &workload,
            spec: &spec,
            moving: (!spec.migration.is_empty()).then(|| {
                self.migrations
                    .get(&(bk.0.clone(), spec.migration.clone()))
                    .map(|m| MigrationStatus::of(m).phase)
                    .unwrap_or_default()
            }),
            status: status.standby.as_ref(),
            max_lag_seconds: max_lag,
            source,
            standby: standby_end,
            rate: bw(&source_cluster).min(bw(&spec.standby)),
        });
        let next_spec = standby::with_transfers(&spec, &id, out.transfers);
        // Rounds come from the Works' reports; the lag alone does not need writing each time.
        let same_status = match (&out.status, &status.standby) {
            (Some(a), Some(b)) => {
                let mut a = a.clone();
                a.lag_seconds = b.lag_seconds;
                a == *b
            }
            (a, b) => a == b,
        };
        if next_spec == spec && same_status {
            return Ok(());
        }
        let mut next = b.clone();
        next.spec = serde_json::to_value(&next_spec).ok();
        let mut st = status;
        st.standby = out.status;
        next.status = serde_json::to_value(&st).ok();
        self.store.update(&key, next, b.revision()).await?;
        Ok(())
    }

    fn on_event(&mut self, src: Src, ev: Event) {
        match src {
            Src::Migration => match ev {
                Event::Listed(items) => {
                    self.migrations.clear();
                    self.active.clear();
                    for m in items {
                        self.put_migration(m);
                    }
                }
                Event::Upsert(m) => self.put_migration(m),
                Event::Delete(m) => {
                    let k = (m.namespace().to_string(), m.name().to_string());
                    self.migrations.remove(&k);
                    self.active.retain(|_, v| *v != k);
                }
            },
            Src::Binding => match ev {
                Event::Listed(items) => {
                    self.followers.clear();
                    self.leader_of.clear();
                    self.services.clear();
                    for b in &items {
                        self.put_binding(b, false);
                    }
                }
                Event::Upsert(b) => self.put_binding(&b, false),
                Event::Delete(b) => self.put_binding(&b, true),
            },
            Src::Work => match ev {
                Event::Listed(items) => {
                    for w in &items {
                        self.wake_for_work(w);
                    }
                }
                Event::Upsert(w) | Event::Delete(w) => self.wake_for_work(&w),
            },
            Src::Lease => self.take_lease_event(ev),
            Src::Cluster => self.take_cluster_event(ev),
        }
    }

    /// Keeps (or, `gone`, forgets) what a binding says of leaders, Services and standbys,
    /// and marks the migrations it concerns.
    fn put_binding(&mut self, b: &Object, gone: bool) {
        let k = (b.namespace().to_string(), b.name().to_string());
        if let Some(old) = self.leader_of.remove(&k)
            && let Some(f) = self.followers.get_mut(&old)
        {
            f.remove(&k);
        }
        self.services.remove(&k);
        if !gone && let Some(name) = service_of(b) {
            self.services.insert(k.clone(), name);
        }
        if !gone && let Some(l) = leader_of(b) {
            self.followers
                .entry(l.clone())
                .or_default()
                .insert(k.clone());
            self.leader_of.insert(k.clone(), l);
        }
        // A standby copy is kept (and let go) from the binding's spec.
        let keeps = !gone
            && b.spec
                .as_ref()
                .and_then(|sp| sp.get("standby"))
                .and_then(serde_json::Value::as_str)
                .is_some_and(|c| !c.is_empty());
        if keeps || self.standbys.remove(&k) {
            self.dirty_standbys.insert(k.clone());
        }
        if keeps {
            self.standbys.insert(k.clone());
        }
        // The binding of a migration under way, or a follower of one.
        if let Some(m) = self.active.get(&k) {
            self.dirty.insert(m.clone());
        }
        if let Some(l) = self.leader_of.get(&k)
            && let Some(m) = self.active.get(l)
        {
            self.dirty.insert(m.clone());
        }
    }

    /// A Work changed: the migration and the standby of its binding are marked.
    fn wake_for_work(&mut self, w: &Object) {
        let Some((ns, name)) = w
            .metadata
            .annotations
            .get(binding::BINDING_ANNOTATION)
            .and_then(|b| b.split_once('/'))
        else {
            return;
        };
        let bk = (ns.to_string(), name.to_string());
        if let Some(m) = self.active.get(&bk) {
            self.dirty.insert(m.clone());
        }
        if self.standbys.contains(&bk) {
            self.dirty_standbys.insert(bk);
        }
    }

    /// A cluster Lease changed: a renewal is when the cluster was last heard from.
    fn take_lease_event(&mut self, ev: Event) {
        match ev {
            Event::Listed(items) => {
                self.renewals = items
                    .iter()
                    .filter_map(|l| {
                        let at = orrery_api::cluster::LeaseBeat::of(l).renew_time?;
                        Some((l.name().to_string(), at))
                    })
                    .collect();
            }
            Event::Upsert(l) => {
                // A renewal, not the server's own marks on the Lease.
                let Some(at) = orrery_api::cluster::LeaseBeat::of(&l).renew_time else {
                    return;
                };
                if self.renewals.insert(l.name().to_string(), at) != Some(at)
                    && let Some(f) = self.clusters.get_mut(l.name())
                {
                    f.heard = Some(orrery_api::MicroTime::now());
                }
            }
            Event::Delete(l) => {
                self.renewals.remove(l.name());
            }
        }
    }

    /// A Cluster changed: its facts are kept, and every active migration marked when
    /// whether it serves or its bandwidth changed.
    fn take_cluster_event(&mut self, ev: Event) {
        match ev {
            Event::Listed(items) => {
                self.clusters = items
                    .iter()
                    .map(|c| (c.name().to_string(), serving(c)))
                    .collect();
            }
            Event::Upsert(c) => {
                let mut f = serving(&c);
                // A heartbeat's time has whole seconds; when one arrives is known finer.
                if let Some(old) = self.clusters.get(c.name())
                    && old.heard_time != f.heard_time
                    && f.heard_time.is_some()
                {
                    f.heard = Some(orrery_api::MicroTime::now());
                } else if let Some(old) = self.clusters.get(c.name()) {
                    f.heard = old.heard.max(f.heard);
                }
                let old = self.clusters.insert(c.name().to_string(), f);
                if old.is_none_or(|o| o.serving != f.serving || o.bandwidth != f.bandwidth) {
                    let all: Vec<MKey> = self.active.values().cloned().collect();
                    self.dirty.extend(all);
                }
            }
            Event::Delete(c) => {
                self.clusters.remove(c.name());
                let all: Vec<MKey> = self.active.values().cloned().collect();
                self.dirty.extend(all);
            }
        }
    }

    fn put_migration(&mut self, m: Arc<Object>) {
        let k = (m.namespace().to_string(), m.name().to_string());
        let st = MigrationStatus::of(&m);
        let b = if st.binding.is_empty() {
            orrery_api::stateful::migration_spec(m.spec.as_ref())
                .map(|s| binding::name_for(&s.resource.kind, &s.resource.name))
                .unwrap_or_default()
        } else {
            st.binding.clone()
        };
        let bk = (k.0.clone(), b);
        let holds = m.metadata.finalizers.iter().any(|f| f == FINALIZER);
        // Only a move that started (its target chosen) holds the binding's slot: a second
        // Migration of the same workload, waiting for its target, must not take the first
        // one's place (which would then never be looked at again).
        if holds || (!st.phase.is_done() && !st.target.is_empty()) {
            self.active.insert(bk, k.clone());
        } else if self.active.get(&bk) == Some(&k) {
            self.active.remove(&bk);
        }
        self.dirty.insert(k.clone());
        self.migrations.insert(k, m);
    }

    /// The binding's Work in `cluster`, if there is one.
    async fn work_in(&self, cluster: &str, bk: &BKey) -> Result<Option<Object>, StoreError> {
        let key = keys::well_known::work(
            &orrery_api::cluster::namespace_of(cluster),
            &binding::work_name(&bk.0, &bk.1),
        );
        match self.store.get(&key).await {
            Ok(w) => Ok(Some(w)),
            Err(StoreError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// What the member reports in the binding's Work in `cluster`.
    async fn work_seen(
        &self,
        cluster: &str,
        bk: &BKey,
        id: &str,
        template: &binding::ObjectReference,
    ) -> Result<Option<plan::WorkSeen>, StoreError> {
        let Some(w) = self.work_in(cluster, bk).await? else {
            return Ok(None);
        };
        let st = work_status(&w);
        let applied = orrery_api::conditions::find(&st.conditions, work::CONDITION_APPLIED);
        let current = st.observed_generation == w.metadata.generation;
        Ok(Some(plan::WorkSeen {
            current,
            transfer: st.transfers.iter().find(|t| t.id == id).cloned(),
            workload: st
                .manifest_statuses
                .iter()
                .find(|m| {
                    m.identifier.kind == template.kind
                        && m.identifier.name == template.name
                        && m.identifier.namespace == template.namespace
                })
                .cloned(),
            // A refusal only: a member that did not answer (`MemberUnavailable`) may run what
            // it was given before, so the move waits for it rather than failing back.
            error: applied
                .filter(|c| current && !c.is_true() && c.reason == work::REASON_APPLIED_FAILED)
                .map(|c| c.message.clone()),
        }))
    }

    /// Whether every binding following `bk` runs healthy at `target`.
    /// What does not serve at the target yet, for the switch: followers (`followUp`) not
    /// running healthy there, and Services selecting the workload's pods that are placed at
    /// the source but not applied at the target (clients there would lose them).
    async fn switch_waits(
        &self,
        bk: &BKey,
        st: &MigrationStatus,
        template: &binding::ObjectReference,
    ) -> Result<Vec<String>, StoreError> {
        let mut waits = Vec::new();
        for f in self.followers.get(bk).into_iter().flatten() {
            let b = match self.store.get(&keys::well_known::binding(&f.0, &f.1)).await {
                Ok(b) => b,
                Err(StoreError::NotFound { .. }) => continue,
                Err(e) => return Err(e),
            };
            let Some(spec) = BindingSpec::of(&b) else {
                continue;
            };
            // Kinds without replicas (a Service, a ConfigMap) are placed with 0.
            let there = spec
                .clusters
                .iter()
                .any(|c| c.name == st.target && (c.replicas > 0 || spec.replicas == 0));
            let healthy = BindingStatus::of(&b)
                .aggregated_status
                .iter()
                .any(|a| a.cluster_name == st.target && a.health == Health::Healthy);
            if !there || !healthy {
                waits.push(format!("{} {}", spec.resource.kind, spec.resource.name));
            }
        }
        // The pods' labels, as the target runs them.
        let Some(labels) = self
            .manifest_at(&st.target, bk, &template.kind, &template.name)
            .await?
            .and_then(|m| m.pointer("/spec/template/metadata/labels").cloned())
        else {
            return Ok(waits);
        };
        let in_namespace = self
            .services
            .range((bk.0.clone(), String::new())..)
            .take_while(|((ns, _), _)| *ns == bk.0);
        for (sk, name) in in_namespace {
            let Some(svc) = self.manifest_at(&st.source, sk, "Service", name).await? else {
                continue;
            };
            if !selects(svc.pointer("/spec/selector"), &labels) {
                continue;
            }
            if !self.applied_at(&st.target, sk).await? {
                waits.push(format!("Service {name}"));
            }
        }
        Ok(waits)
    }

    /// The manifest of `kind`/`name` in the Work a cluster has of a binding.
    async fn manifest_at(
        &self,
        cluster: &str,
        bk: &BKey,
        kind: &str,
        name: &str,
    ) -> Result<Option<serde_json::Value>, StoreError> {
        let Some(w) = self.work_in(cluster, bk).await? else {
            return Ok(None);
        };
        Ok(w.spec
            .as_ref()
            .and_then(|s| s.pointer("/workload/manifests"))
            .and_then(serde_json::Value::as_array)
            .into_iter()
            .flatten()
            .find(|m| {
                m.get("kind").and_then(serde_json::Value::as_str) == Some(kind)
                    && m.pointer("/metadata/name")
                        .and_then(serde_json::Value::as_str)
                        == Some(name)
            })
            .cloned())
    }

    /// Whether a cluster's Work of a binding is applied at its current generation.
    async fn applied_at(&self, cluster: &str, bk: &BKey) -> Result<bool, StoreError> {
        let Some(w) = self.work_in(cluster, bk).await? else {
            return Ok(false);
        };
        let st = work_status(&w);
        Ok(st.observed_generation == w.metadata.generation
            && orrery_api::conditions::find(&st.conditions, work::CONDITION_APPLIED)
                .is_some_and(|c| c.status == orrery_api::conditions::TRUE))
    }

    async fn reconcile(&mut self, k: &MKey) -> Result<(), StoreError> {
        let Some(m) = self.migrations.get(k).cloned() else {
            return Ok(());
        };
        let st = MigrationStatus::of(&m);
        let deleting = m.metadata.deletion_timestamp.is_some();
        let holds = m.metadata.finalizers.iter().any(|f| f == FINALIZER);
        if st.phase.is_done() && !holds {
            return Ok(());
        }
        let Ok(spec) = orrery_api::stateful::migration_spec(m.spec.as_ref()) else {
            return Ok(());
        };
        let bname = if st.binding.is_empty() {
            binding::name_for(&spec.resource.kind, &spec.resource.name)
        } else {
            st.binding.clone()
        };
        let bk = (k.0.clone(), bname);
        let bkey = keys::well_known::binding(&bk.0, &bk.1);
        let b = match self.store.get(&bkey).await {
            Ok(b) => Some(b),
            Err(StoreError::NotFound { .. }) => None,
            Err(e) => return Err(e),
        };
        let bspec = b.as_ref().and_then(BindingSpec::of);
        let bstatus = b.as_ref().map(BindingStatus::of).unwrap_or_default();
        // The finalizer goes on before the move touches anything, so that a deletion
        // always finds the binding put back.
        if !holds && !deleting && !st.phase.is_done() && !st.target.is_empty() {
            let mut next = (*m).clone();
            next.metadata.finalizers.push(FINALIZER.to_string());
            self.store
                .update(&keys::well_known::migration(&k.0, &k.1), next, m.revision())
                .await?;
            return Ok(());
        }
        let template = bspec
            .as_ref()
            .map(|s| s.resource.clone())
            .unwrap_or_default();
        let id = m.metadata.uid.clone();
        let (source, target) = self.ends(&st, &bk, &id, &template).await?;
        let rate = self.path_rate(&st);
        // Starting too: one step may pass through Switching.
        let switch_waits = if matches!(
            st.phase,
            MigrationPhase::Starting | MigrationPhase::Switching
        ) {
            self.switch_waits(&bk, &st, &template).await?
        } else {
            Vec::new()
        };
        let workload = format!("{}/{}", template.kind, template.name);
        let input = plan::Input {
            now: orrery_api::MicroTime::now(),
            name: &k.1,
            id: &id,
            namespace: &k.0,
            workload: &workload,
            deleting,
            status: &st,
            binding: bspec.as_ref(),
            source,
            target,
            rate,
            switch_waits,
            starts_empty: bspec
                .as_ref()
                .and_then(|s| s.placement.stateful.as_ref())
                .is_some_and(|s| s.starts_empty()),
            standby: bstatus.standby.as_ref(),
            source_written: bstatus
                .aggregated_status
                .iter()
                .filter(|a| a.cluster_name == st.source)
                .flat_map(|a| &a.volumes)
                .map(|v| (v.name.clone(), v.written_bytes))
                .collect(),
            source_last_heard: self.clusters.get(&st.source).and_then(|c| c.heard),
            budget: bspec.as_ref().and_then(|s| {
                fence_budget(s, &bstatus, &st, |c| {
                    self.clusters.get(c).is_some_and(|c| c.serving)
                })
            }),
            settings: &self.settings,
        };
        let out = plan::step(&input);
        // The status first: a fence is recorded before it takes effect.
        let current = if out.status != st {
            self.record_status(k, &m, &out, &template).await?
        } else {
            m.clone()
        };
        if let (Some(spec), Some(b)) = (&out.binding, &b) {
            let mut next = b.clone();
            next.spec = serde_json::to_value(spec).ok();
            self.store.update(&bkey, next, b.revision()).await?;
        }
        if out.released && holds {
            self.release(k, &current).await?;
        }
        Ok(())
    }

    /// The migration's two ends as this controller sees them: whether each serves, and
    /// what its Work of the binding shows (the source's read first).
    async fn ends(
        &self,
        st: &MigrationStatus,
        bk: &BKey,
        id: &str,
        template: &binding::ObjectReference,
    ) -> Result<(plan::End, plan::End), StoreError> {
        let end = |c: &str| self.clusters.get(c).copied().unwrap_or_default();
        let source = plan::End {
            serving: end(&st.source).serving,
            work: if st.source.is_empty() {
                None
            } else {
                self.work_seen(&st.source, bk, id, template).await?
            },
        };
        let target = plan::End {
            serving: end(&st.target).serving,
            work: if st.target.is_empty() {
                None
            } else {
                self.work_seen(&st.target, bk, id, template).await?
            },
        };
        Ok((source, target))
    }

    /// The path: the smaller of the target's uplink and the source's share of its own
    /// among the moves leaving it now.
    fn path_rate(&self, st: &MigrationStatus) -> i64 {
        let end = |c: &str| self.clusters.get(c).copied().unwrap_or_default();
        let leaving = self
            .migrations
            .values()
            .filter(|o| {
                let s = MigrationStatus::of(o);
                s.source == st.source
                    && matches!(
                        s.phase,
                        MigrationPhase::Replicating
                            | MigrationPhase::Fencing
                            | MigrationPhase::FinalSync
                    )
            })
            .count()
            .max(1) as i64;
        (end(&st.source).bandwidth / leaving).min(end(&st.target).bandwidth)
    }

    /// Writes the step's status (the status first: a fence is recorded before it takes
    /// effect), then its Events; returns the migration as stored.
    async fn record_status(
        &self,
        k: &MKey,
        m: &Arc<Object>,
        out: &plan::Output,
        template: &binding::ObjectReference,
    ) -> Result<Arc<Object>, StoreError> {
        let mut next = (**m).clone();
        next.status = serde_json::to_value(&out.status).ok();
        let stored = self
            .store
            .update(&keys::well_known::migration(&k.0, &k.1), next, m.revision())
            .await?;
        // The transitions are on record: their Events go now (a failed binding write
        // below is retried from the new status, which makes no transition again).
        for e in &out.events {
            let about = subject(
                &template.api_version,
                &template.kind,
                &template.namespace,
                &template.name,
                &template.uid,
            );
            let _ = record::event(
                self.store.as_ref(),
                &about,
                e.type_,
                e.reason,
                &e.message,
                COMPONENT,
            )
            .await;
            tracing::info!(namespace = %k.0, migration = %k.1, reason = e.reason, message = %e.message, "migration");
        }
        Ok(stored)
    }

    /// Nothing of the migration is left in the binding: its finalizer goes.
    async fn release(&self, k: &MKey, current: &Arc<Object>) -> Result<(), StoreError> {
        let mut next = (**current).clone();
        next.metadata.finalizers.retain(|f| f != FINALIZER);
        match self
            .store
            .update(
                &keys::well_known::migration(&k.0, &k.1),
                next,
                current.revision(),
            )
            .await
        {
            Ok(_) | Err(StoreError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// A Work's status as its member reported it (empty if none, or it does not parse).
fn work_status(w: &Object) -> WorkStatus {
    w.status
        .as_ref()
        .and_then(|s| WorkStatus::deserialize(s).ok())
        .unwrap_or_default()
}

/// Whether a Service's selector (its `spec.selector`, a map) picks pods with these labels;
/// a Service without a selector picks none (its endpoints are managed by hand).
fn selects(selector: Option<&serde_json::Value>, labels: &serde_json::Value) -> bool {
    let Some(sel) = selector.and_then(serde_json::Value::as_object) else {
        return false;
    };
    !sel.is_empty() && sel.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// The workload's disruption budget where its move stands, from the binding as stored: what
/// is ready is what the binding's clusters that serve report (a dark cluster's last report is
/// no longer true), the source's among them.
fn fence_budget(
    spec: &BindingSpec,
    status: &BindingStatus,
    st: &MigrationStatus,
    serving: impl Fn(&str) -> bool,
) -> Option<plan::FenceBudget> {
    let budget = spec.placement.disruption_budget.as_ref()?;
    let desired: i64 = if spec.placement.divided() {
        spec.clusters.iter().map(|c| c.replicas).sum()
    } else {
        st.replicas * spec.clusters.len() as i64
    };
    let ready_in = |c: &str| -> i64 {
        if !serving(c) {
            return 0;
        }
        status
            .aggregated_status
            .iter()
            .find(|a| a.cluster_name == c)
            .and_then(|a| a.status.as_ref())
            .and_then(|s| s.get("readyReplicas"))
            .and_then(serde_json::Value::as_i64)
            .unwrap_or(0)
    };
    Some(plan::FenceBudget {
        min_available: budget.min_available(desired),
        ready: spec.clusters.iter().map(|c| ready_in(&c.name)).sum(),
        ready_at_source: ready_in(&st.source),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn a_service_selects_pods_whose_labels_hold_its_whole_selector() {
        let labels = json!({"app": "db", "tier": "data"});
        for (selector, want) in [
            (json!({"app": "db"}), true),
            (json!({"app": "db", "tier": "data"}), true),
            (json!({"app": "db", "tier": "web"}), false),
            (json!({"app": "api"}), false),
            (json!({"zone": "a"}), false),
            // No selector, or an empty one: endpoints managed by hand, no pods picked.
            (json!({}), false),
            (serde_json::Value::Null, false),
        ] {
            assert_eq!(super::selects(Some(&selector), &labels), want, "{selector}");
        }
        assert!(!super::selects(None, &labels));
    }

    #[test]
    fn the_fence_budget_counts_what_serving_clusters_report_ready() {
        let spec: super::BindingSpec = serde_json::from_value(json!({
            "resource": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db"},
            "policy": {"apiVersion": "multicluster.io/v1alpha1", "kind": "ResourcePlacementPolicy", "name": "db"},
            "placement": {
                "replicaScheduling": {"replicaSchedulingType": "Divided"},
                "disruptionBudget": {"maxUnavailable": "25%"}
            },
            "clusters": [{"name": "a", "replicas": 4}, {"name": "b", "replicas": 3}, {"name": "c", "replicas": 1}]
        }))
        .unwrap();
        let status: super::BindingStatus = serde_json::from_value(json!({
            "aggregatedStatus": [
                {"clusterName": "a", "status": {"readyReplicas": 4}},
                {"clusterName": "b", "status": {"readyReplicas": 3}},
                {"clusterName": "c", "status": {"readyReplicas": 1}},
                {"clusterName": "z", "status": {"readyReplicas": 9}}
            ]
        }))
        .unwrap();
        let st = super::MigrationStatus {
            source: "a".into(),
            target: "z".into(),
            replicas: 4,
            ..Default::default()
        };
        // c went dark: its last report does not count; z is not the binding's.
        let b = super::fence_budget(&spec, &status, &st, |c| c != "c").unwrap();
        assert_eq!(
            b,
            super::plan::FenceBudget {
                min_available: 6,
                ready: 7,
                ready_at_source: 4
            }
        );
        let mut none = spec.clone();
        none.placement.disruption_budget = None;
        assert!(super::fence_budget(&none, &status, &st, |_| true).is_none());
    }
}
