//! Kueue quotas from member capacity (KubeStellar galaxy #36).
//!
//! For every member it keeps a `ClusterMetrics` (galaxy.kubestellar.io/v1alpha1, its nodes, as
//! the member's agent reports them) and a `ClusterResourceClaim` (`<cluster>-resource-claim`,
//! `spec.nominalResources` from the member's capacity when it joined), both owned by the
//! Cluster so that they go with it. A Kueue administrator assigns parts of a claim to
//! ClusterQueues by flavor (`spec.resourceAssignments`); each queue's `nominalQuota` for a
//! flavor and resource is then the sum over every claim that names it, scaled down where a
//! member has lost capacity, and never lowered below what the queue has admitted (the rest
//! waits for workloads to finish; the claim's `Applied` condition says so).
//!
//! Capacity is followed with hysteresis: a change smaller than 5 % of the nominal resources
//! is not followed, and a claim follows at most once per `interval` (a member leaving is
//! followed at once: its claim goes with it). Only the quotas Orrery keeps are touched (listed
//! in the queue's `quota.orrery.io/managed` annotation). Everything is written only when it
//! differs from what is stored, and Events are told only with a write, so a restart writes
//! nothing.

use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use orrery_api::cluster::ResourceList;
use orrery_api::conditions::{self, Condition};
use orrery_api::quantity::Quantity;
use orrery_api::quota::{
    self, API_VERSION, CLAIM_KIND, CONDITION_APPLIED, ClaimSpec, ClaimStatus, KUEUE_GROUP,
    METRICS_KIND, MetricsStatus, QUEUE_PLURAL, QuotaKey,
};
use orrery_api::{Object, OwnerReference, Time, keys};
use orrery_store::stamp::new_object;
use orrery_store::{Store, StoreError};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::runtime::cache::Cache;
use crate::runtime::controller::{Action, Controller, Keys, Origin, Reconciler, Source};
use crate::runtime::metrics::Handle;
use crate::runtime::reflector::Event;

const COMPONENT: &str = "orrery-quotas";

/// How the quotas follow capacity.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The least time between two capacity changes a claim follows.
    pub interval: Duration,
    /// The member where Kueue runs, if not the control plane: the queues (and their flavors
    /// and local queues) defined here are propagated to it by a ClusterPropagationPolicy
    /// `orrery-kueue`, and their status (the usage Kueue admits) comes back as any template's.
    pub kueue_cluster: Option<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            interval: Duration::from_secs(30),
            kueue_cluster: None,
        }
    }
}

/// The policy that takes Kueue's objects to `--kueue-cluster`.
pub const KUEUE_POLICY: &str = "orrery-kueue";
const POLICY_OWNER: (&str, &str) = ("app.kubernetes.io/managed-by", COMPONENT);

fn kueue_policy_key() -> String {
    keys::object(
        "policy.karmada.io",
        "clusterpropagationpolicies",
        None,
        KUEUE_POLICY,
    )
}

/// The spec of the policy that places Kueue's objects in `cluster`.
pub fn kueue_policy_spec(cluster: &str) -> Value {
    let kinds = ["ResourceFlavor", "ClusterQueue", "LocalQueue"];
    json!({
        "resourceSelectors": kinds
            .iter()
            .map(|k| json!({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": k}))
            .collect::<Vec<_>>(),
        "placement": {"clusterAffinity": {"clusterNames": [cluster]}},
    })
}

fn claim_key(name: &str) -> String {
    orrery_api::kinds::CLUSTER_RESOURCE_CLAIM.key("", name)
}

/// How many members' objects (or claims' statuses) are written at once.
const AT_ONCE: usize = 16;

/// Runs `f` on every item, [`AT_ONCE`] at a time; the first error once all are done.
async fn at_once<T, F, Fut>(items: impl IntoIterator<Item = T>, f: F) -> Result<(), StoreError>
where
    F: FnMut(T) -> Fut,
    Fut: std::future::Future<Output = Result<(), StoreError>>,
{
    use futures_util::StreamExt;
    let done: Vec<Result<(), StoreError>> = futures_util::stream::iter(items)
        .map(f)
        .buffer_unordered(AT_ONCE)
        .collect()
        .await;
    done.into_iter().collect()
}

fn metrics_key(name: &str) -> String {
    orrery_api::kinds::CLUSTER_METRICS.key("", name)
}

fn queue_key(name: &str) -> String {
    keys::object(KUEUE_GROUP, QUEUE_PLURAL, None, name)
}

fn live(o: &Object) -> bool {
    o.metadata.deletion_timestamp.is_none()
}

struct Quotas {
    store: Arc<dyn Store>,
    settings: Settings,
    members: Members,
    claims: Arc<Cache>,
    queues: Arc<Cache>,
    capacities: Capacities,
}

/// What a round reads of a member's Cluster: who owns the member's objects, whether it is
/// being deleted, and the capacity its status reports (read when its nodes are not). Not the
/// Cluster: a parsed one is about 25 KB, and a round reads these few fields.
#[derive(Debug)]
struct Member {
    owner: OwnerReference,
    live: bool,
    allocatable: ResourceList,
}

impl Member {
    fn of(c: &Object) -> Member {
        Member {
            owner: OwnerReference::controller_of(c),
            live: live(c),
            allocatable: c
                .status
                .as_ref()
                .and_then(|s| s.pointer("/resourceSummary/allocatable"))
                .and_then(|a| ResourceList::deserialize(a).ok())
                .unwrap_or_default(),
        }
    }

    fn name(&self) -> &str {
        &self.owner.name
    }
}

/// The members as their Clusters' events tell them.
#[derive(Default)]
struct Members(Mutex<BTreeMap<String, Arc<Member>>>);

impl Members {
    fn map(&self) -> parking_lot::MutexGuard<'_, BTreeMap<String, Arc<Member>>> {
        self.0.lock()
    }

    fn follow(&self, event: &Event) {
        let mut m = self.map();
        match event {
            Event::Listed(items) => {
                *m = items
                    .iter()
                    .map(|c| (c.name().to_string(), Arc::new(Member::of(c))))
                    .collect();
            }
            Event::Upsert(c) => {
                m.insert(c.name().to_string(), Arc::new(Member::of(c)));
            }
            Event::Delete(c) => {
                m.remove(c.name());
            }
        }
    }

    /// The members not being deleted, by name.
    fn live(&self) -> BTreeMap<String, Arc<Member>> {
        self.map()
            .iter()
            .filter(|(_, m)| m.live)
            .map(|(n, m)| (n.clone(), m.clone()))
            .collect()
    }
}

/// Each member's nominal capacity from its reported nodes (`None`: no node reported), as of
/// the last ClusterMetrics event seen: which members have a ClusterMetrics, and all that is
/// read of them. A member's ClusterMetrics changes with its nodes' usage (under a moving load,
/// at every heartbeat); only a change of capacity calls for a round, and a round reads
/// capacities from here rather than decoding every member's nodes again (at 3,000 members
/// that decoding, a round after every burst of heartbeats, was half the leader's CPU while
/// Works rolled out). The objects are not kept: a member's nodes, decoded, are tens of KiB
/// (the largest share of the leader's memory at 10,000 members).
#[derive(Default)]
struct Capacities(Mutex<HashMap<String, Option<ResourceList>>>);

impl Capacities {
    fn map(&self) -> parking_lot::MutexGuard<'_, HashMap<String, Option<ResourceList>>> {
        self.0.lock()
    }

    /// Follows a ClusterMetrics event; whether a member's capacity changed with it.
    fn seen(&self, event: &Event) -> bool {
        let mut caps = self.map();
        match event {
            Event::Listed(items) => {
                *caps = items
                    .iter()
                    .map(|m| (m.name().to_string(), node_capacity(m)))
                    .collect();
                true
            }
            Event::Upsert(m) => {
                let cap = node_capacity(m);
                caps.insert(m.name().to_string(), cap.clone()).as_ref() != Some(&cap)
            }
            Event::Delete(m) => caps.remove(m.name()).is_some(),
        }
    }

    /// A ClusterMetrics this controller made: known at once, so that the next round does not
    /// make it again before its event comes (an entry from an event is newer, and kept).
    fn created(&self, metrics: &Object) {
        self.map()
            .entry(metrics.name().to_string())
            .or_insert_with(|| node_capacity(metrics));
    }

    /// The member's capacity from its nodes: `None` when it has no ClusterMetrics (none seen),
    /// `Some(None)` when it reports no node.
    fn get(&self, member: &str) -> Option<Option<ResourceList>> {
        self.map().get(member).cloned()
    }

    /// Whether the member reported nodes (its capacity is then theirs, not its Cluster's).
    fn has_nodes(&self, member: &str) -> bool {
        self.map().get(member).is_some_and(Option::is_some)
    }
}

/// A ClusterMetrics' nominal capacity from its nodes; `None` when it reports none.
fn node_capacity(metrics: &Object) -> Option<ResourceList> {
    let status = MetricsStatus::deserialize(metrics.status.as_ref()?).ok()?;
    (!status.nodes.is_empty()).then(|| quota::nominal_of(&status.allocatable()))
}

/// A claim's status as stored (default when absent or unreadable), read in place.
fn claim_status_of(claim: &Object) -> ClaimStatus {
    claim
        .status
        .as_ref()
        .and_then(|s| ClaimStatus::deserialize(s).ok())
        .unwrap_or_default()
}

/// One claim in a round: its spec (or why it does not count: invalid, or its cluster is not a
/// member), and its status as it should be.
struct Plan {
    claim: Arc<Object>,
    spec: Result<ClaimSpec, String>,
    status: ClaimStatus,
}

impl Plan {
    /// Whether its assignments count in the queues.
    fn counts(&self) -> bool {
        self.spec.is_ok()
    }
}

/// What became of one claim's assignments in the queues.
#[derive(Default)]
struct Outcome {
    missing: BTreeSet<String>,
    /// (queue, flavor/resource, kept, asked).
    held: Vec<(String, String, Quantity, Quantity)>,
}

impl Quotas {
    /// The member's capacity now: its nodes as reported, else its Cluster's summary.
    fn capacity(&self, member: &Member) -> ResourceList {
        match self.capacities.get(member.name()).flatten() {
            Some(n) => n,
            None => quota::nominal_of(&member.allocatable),
        }
    }

    /// Keeps the policy for `--kueue-cluster` as the settings say: made or corrected when one
    /// is named, removed (if it is ours) when none is.
    async fn kueue_policy(&self) -> Result<(), StoreError> {
        let key = kueue_policy_key();
        let current = match self.store.get(&key).await {
            Ok(o) => Some(o),
            Err(StoreError::NotFound { .. }) => None,
            Err(e) => return Err(e),
        };
        let ours =
            |o: &Object| o.labels().get(POLICY_OWNER.0).map(String::as_str) == Some(POLICY_OWNER.1);
        match (&self.settings.kueue_cluster, current) {
            (Some(cluster), None) => {
                let mut p = new_object(
                    "policy.karmada.io/v1alpha1",
                    "ClusterPropagationPolicy",
                    None,
                    KUEUE_POLICY,
                );
                p.metadata
                    .labels
                    .insert(POLICY_OWNER.0.to_string(), POLICY_OWNER.1.to_string());
                p.spec = Some(kueue_policy_spec(cluster));
                match self.store.create(&key, p).await {
                    Ok(_) | Err(StoreError::AlreadyExists { .. }) => Ok(()),
                    Err(e) => Err(e),
                }
            }
            (Some(cluster), Some(cur)) => {
                let spec = kueue_policy_spec(cluster);
                if !ours(&cur) || cur.spec.as_ref() == Some(&spec) {
                    // Someone's own policy of that name is theirs to keep.
                    return Ok(());
                }
                let mut next = cur;
                next.spec = Some(spec);
                let rev = next.revision();
                match self.store.update(&key, next, rev).await {
                    Ok(_) | Err(StoreError::Conflict { .. }) => Ok(()),
                    Err(e) => Err(e),
                }
            }
            (None, Some(cur)) if ours(&cur) => {
                match self
                    .store
                    .delete(&key, &orrery_store::Preconditions::default())
                    .await
                {
                    Ok(_) | Err(StoreError::NotFound { .. }) => Ok(()),
                    Err(e) => Err(e),
                }
            }
            (None, _) => Ok(()),
        }
    }

    /// Creates what a member lacks: its ClusterMetrics, and its claim once its capacity is known.
    async fn ensure(&self, cluster: &Member) -> Result<(), StoreError> {
        if self.capacities.get(cluster.name()).is_none() {
            let mut m = new_object(API_VERSION, METRICS_KIND, None, cluster.name());
            m.metadata.owner_references = vec![cluster.owner.clone()];
            m.spec = Some(json!({}));
            match self.store.create(&metrics_key(cluster.name()), m).await {
                Ok(o) => self.capacities.created(&o),
                // Someone made it first, or its Cluster is going: the events bring it.
                Err(StoreError::AlreadyExists { .. }) | Err(StoreError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        let name = quota::claim_name(cluster.name());
        if self.claims.get("", &name).is_none() {
            let nominal = self.capacity(cluster);
            if nominal.is_empty() {
                return Ok(());
            }
            let mut c = new_object(API_VERSION, CLAIM_KIND, None, &name);
            c.metadata.owner_references = vec![cluster.owner.clone()];
            let spec = ClaimSpec {
                cluster_name: cluster.name().to_string(),
                nominal_resources: nominal,
                resource_assignments: Vec::new(),
            };
            c.spec = serde_json::to_value(&spec).ok();
            self.created(&self.claims, self.store.create(&claim_key(&name), c).await)?;
        }
        Ok(())
    }

    fn created(&self, cache: &Cache, r: Result<Arc<Object>, StoreError>) -> Result<(), StoreError> {
        match r {
            Ok(o) => {
                cache.upsert(o.clone(), o.revision().unwrap_or(0));
                Ok(())
            }
            // Someone made it first, or its Cluster is going: the events bring it.
            Err(StoreError::AlreadyExists { .. }) | Err(StoreError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// One round: members' objects, claims' capacity, queues' quotas, claims' status.
    /// Returns when it should run again at the latest (a capacity change waiting for its
    /// interval).
    async fn round(&self) -> Result<Option<Duration>, StoreError> {
        let clusters = self.members.live();
        self.kueue_policy().await?;
        // A few at a time: a fleet registering together must not wait for thousands of
        // creates one after another (each an etcd commit; at 10,000 members the last were
        // made minutes late, and their members' metrics refused meanwhile).
        at_once(clusters.values().cloned(), |c| async move {
            self.ensure(&c).await
        })
        .await?;
        let now = Time::now();
        let mut wake: Option<Duration> = None;
        // Each claim's capacity followed and assignments computed.
        let mut plans: Vec<Plan> = Vec::new();
        for claim in self.claims.list().into_iter().filter(|c| live(c)) {
            let mut st = claim_status_of(&claim);
            let spec = match ClaimSpec::parse(claim.spec.as_ref()) {
                Ok(s) => s,
                Err(errs) => {
                    let why = errs
                        .iter()
                        .map(|e| e.to_string())
                        .collect::<Vec<_>>()
                        .join("; ");
                    plans.push(Plan {
                        claim,
                        spec: Err(why),
                        status: st,
                    });
                    continue;
                }
            };
            let Some(cluster) = clusters.get(&spec.cluster_name) else {
                plans.push(Plan {
                    claim,
                    spec: Err(format!("cluster {} is not a member", spec.cluster_name)),
                    status: st,
                });
                continue;
            };
            st.allocatable = self.capacity(cluster);
            if quota::moved(&st.applied, &st.allocatable, &spec.nominal_resources) {
                let since = st
                    .applied_time
                    .map(|t| Duration::from_secs(now.seconds_since(t).max(0) as u64));
                match since {
                    Some(s) if !st.applied.is_empty() && s < self.settings.interval => {
                        let left = self.settings.interval - s;
                        wake = Some(wake.map_or(left, |w| w.min(left)));
                    }
                    _ => {
                        st.applied = st.allocatable.clone();
                        st.applied_time = Some(now);
                    }
                }
            }
            st.assignments = quota::effective(&spec, &st.applied);
            plans.push(Plan {
                claim,
                spec: Ok(spec),
                status: st,
            });
        }
        // Every queue's quotas: the sum over the claims that name it.
        let sums = quota::sums(
            plans
                .iter()
                .filter(|p| p.counts())
                .flat_map(|p| p.status.assignments.iter()),
        );
        let mut outcomes: BTreeMap<String, Outcome> = BTreeMap::new();
        let mut queue_names: BTreeSet<String> = sums.keys().cloned().collect();
        for q in self.queues.list() {
            if !quota::managed_of(&q.metadata.annotations).is_empty() {
                queue_names.insert(q.name().to_string());
            }
        }
        for name in queue_names {
            let wanted = sums.get(&name).cloned().unwrap_or_default();
            let claims_of: Vec<String> = plans
                .iter()
                .filter(|p| {
                    p.counts()
                        && p.status
                            .assignments
                            .iter()
                            .any(|a| a.cluster_queue_name == name)
                })
                .map(|p| p.claim.name().to_string())
                .collect();
            match self.queues.get("", &name).filter(|q| live(q)) {
                None => {
                    for c in &claims_of {
                        outcomes
                            .entry(c.clone())
                            .or_default()
                            .missing
                            .insert(name.clone());
                    }
                }
                Some(q) => {
                    let held = self.queue(&q, &wanted, &claims_of).await?;
                    for c in &claims_of {
                        let o = outcomes.entry(c.clone()).or_default();
                        for (key, kept, asked) in &held {
                            o.held.push((
                                name.clone(),
                                format!("{}/{}", key.0, key.1),
                                *kept,
                                *asked,
                            ));
                        }
                    }
                }
            }
        }
        // A few at a time, as the members' objects above: every new member's claim gets a
        // status, thousands at once while a fleet registers.
        let work: Vec<(Plan, Option<Outcome>)> = plans
            .into_iter()
            .map(|p| {
                let outcome = outcomes.remove(p.claim.name());
                (p, outcome)
            })
            .collect();
        at_once(work, |(p, outcome)| async move {
            self.claim_status(&p.claim, p.spec, p.status, outcome, now)
                .await
        })
        .await?;
        Ok(wake)
    }

    /// Brings one queue's quotas to `wanted`; returns the quotas held above what is asked.
    async fn queue(
        &self,
        q: &Object,
        wanted: &BTreeMap<QuotaKey, Quantity>,
        claims: &[String],
    ) -> Result<Vec<(QuotaKey, Quantity, Quantity)>, StoreError> {
        let managed = quota::managed_of(&q.metadata.annotations);
        let mut spec = q.spec.clone().unwrap_or_else(|| json!({}));
        let (changes, keep) =
            quota::reconcile_queue(&mut spec, q.status.as_ref(), wanted, &managed);
        let held: Vec<(QuotaKey, Quantity, Quantity)> = changes
            .iter()
            .filter_map(|c| {
                c.held_for
                    .map(|asked| ((c.flavor.clone(), c.resource.clone()), c.to, asked))
            })
            .collect();
        let moved: Vec<&quota::QuotaChange> = changes.iter().filter(|c| c.from != c.to).collect();
        if moved.is_empty() && keep == managed {
            return Ok(held);
        }
        let value = quota::managed_value(&keep);
        let stored =
            orrery_store::update_with(self.store.as_ref(), &queue_key(q.name()), |mut cur| {
                let managed = quota::managed_of(&cur.metadata.annotations);
                let mut spec = cur.spec.clone().unwrap_or_else(|| json!({}));
                let (changes, keep) =
                    quota::reconcile_queue(&mut spec, cur.status.as_ref(), wanted, &managed);
                if changes.iter().all(|c| c.from == c.to) && keep == managed {
                    return Ok(None);
                }
                cur.spec = Some(spec);
                if keep.is_empty() {
                    cur.metadata.annotations.remove(quota::ANNOTATION_MANAGED);
                } else {
                    cur.metadata
                        .annotations
                        .insert(quota::ANNOTATION_MANAGED.to_string(), value.clone());
                }
                Ok(Some(cur))
            })
            .await;
        let stored = match stored {
            Ok(o) => o,
            Err(StoreError::NotFound { .. }) => return Ok(held),
            Err(e) => return Err(e),
        };
        self.queues
            .upsert(stored.clone(), stored.revision().unwrap_or(0));
        let from = if claims.is_empty() {
            "no claim names it any more".to_string()
        } else {
            format!("from claims {}", claims.join(", "))
        };
        for c in moved {
            let mut msg = format!(
                "nominalQuota of {} in flavor {}: {} -> {} ({from})",
                c.resource, c.flavor, c.from, c.to
            );
            if let Some(asked) = c.held_for {
                msg.push_str(&format!(
                    "; {asked} asked, the rest waits for admitted workloads to finish"
                ));
            }
            let _ = crate::record::event(
                self.store.as_ref(),
                &stored,
                "Normal",
                "QuotaChanged",
                &msg,
                COMPONENT,
            )
            .await;
        }
        Ok(held)
    }

    async fn claim_status(
        &self,
        claim: &Object,
        spec: Result<ClaimSpec, String>,
        mut st: ClaimStatus,
        outcome: Option<Outcome>,
        now: Time,
    ) -> Result<(), StoreError> {
        let old = claim_status_of(claim);
        let outcome = outcome.unwrap_or_default();
        let cond = match &spec {
            Err(why) => Condition::new(CONDITION_APPLIED, conditions::FALSE, "Invalid", why.clone()),
            Ok(s) if s.resource_assignments.is_empty() => Condition::new(
                CONDITION_APPLIED,
                conditions::TRUE,
                "NothingAssigned",
                "no resource is assigned to a ClusterQueue yet (spec.resourceAssignments)",
            ),
            Ok(_) if !outcome.missing.is_empty() => Condition::new(
                CONDITION_APPLIED,
                conditions::FALSE,
                "QueueNotFound",
                format!(
                    "no ClusterQueue {} (kueue.x-k8s.io/v1beta1): apply Kueue's CRDs and create it",
                    outcome.missing.iter().cloned().collect::<Vec<_>>().join(", ")
                ),
            ),
            Ok(_) if !outcome.held.is_empty() => Condition::new(
                CONDITION_APPLIED,
                conditions::FALSE,
                "WaitingForWorkloads",
                outcome
                    .held
                    .iter()
                    .map(|(q, what, kept, asked)| {
                        format!("ClusterQueue {q} keeps {what} at {kept} ({asked} asked) until its admitted workloads finish")
                    })
                    .collect::<Vec<_>>()
                    .join("; "),
            ),
            Ok(s) => {
                let queues: BTreeSet<&str> = s
                    .resource_assignments
                    .iter()
                    .map(|a| a.cluster_queue_name.as_str())
                    .collect();
                Condition::new(
                    CONDITION_APPLIED,
                    conditions::TRUE,
                    "QuotaApplied",
                    format!(
                        "in the quotas of ClusterQueue {}",
                        queues.into_iter().collect::<Vec<_>>().join(", ")
                    ),
                )
            }
        };
        conditions::set(&mut st.conditions, cond, now);
        if st == old {
            return Ok(());
        }
        let capacity_moved = !old.applied.is_empty() && old.applied != st.applied;
        let status = serde_json::to_value(&st).unwrap_or(Value::Null);
        let stored =
            orrery_store::update_with(self.store.as_ref(), &claim_key(claim.name()), |mut cur| {
                if cur.metadata.uid != claim.metadata.uid {
                    return Ok(None);
                }
                cur.status = Some(status.clone());
                Ok(Some(cur))
            })
            .await;
        let stored = match stored {
            Ok(o) => o,
            Err(StoreError::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        self.claims
            .upsert(stored.clone(), stored.revision().unwrap_or(0));
        if capacity_moved {
            let _ = crate::record::event(
                self.store.as_ref(),
                &stored,
                "Normal",
                "CapacityChanged",
                &format!(
                    "the cluster has {} (was {}): assignments follow",
                    list(&st.applied),
                    list(&old.applied)
                ),
                COMPONENT,
            )
            .await;
        }
        Ok(())
    }
}

fn list(l: &orrery_api::cluster::ResourceList) -> String {
    l.iter()
        .map(|(r, q)| format!("{r} {q}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// One key: a round covers every member, claim and queue.
#[async_trait::async_trait]
impl Reconciler for Quotas {
    type Key = ();
    type Error = StoreError;

    fn on_event(&mut self, source: Origin, e: Event, keys: &mut Keys<()>) {
        if source == "clusters" {
            self.members.follow(&e);
        }
        let matters = match (source.name, &e) {
            // A member's usage may change at every heartbeat; a round is for its capacity.
            ("metrics", e) => self.capacities.seen(e),
            (_, Event::Listed(_) | Event::Delete(_)) => true,
            // A heartbeat matters where it brings a member's first capacity, or its only word
            // on capacity (no node reported).
            (source, Event::Upsert(o)) => {
                source != "clusters"
                    || !live(o)
                    || self.claims.get("", &quota::claim_name(o.name())).is_none()
                    || !self.capacities.has_nodes(o.name())
            }
        };
        if matters {
            keys.push(());
        }
    }

    fn all_keys(&self) -> Vec<()> {
        vec![()]
    }

    /// Runs again when a capacity change waiting for its interval is due.
    async fn reconcile(&self, _: &()) -> Result<Action, StoreError> {
        self.round().await.map(Action::from)
    }
}

/// Runs the controller until shutdown.
pub async fn run(
    store: Arc<dyn Store>,
    settings: Settings,
    metrics: Handle,
    shutdown: watch::Receiver<bool>,
) {
    let cache = || Arc::new(Cache::new(&[]));
    let (claims, queues) = (cache(), cache());
    let r = Quotas {
        store: store.clone(),
        settings,
        members: Members::default(),
        claims: claims.clone(),
        queues: queues.clone(),
        capacities: Capacities::default(),
    };
    // The claims' and queues' caches are kept in step by their reflectors, ahead of the
    // changes the controller takes in (a Cluster made again under its name would otherwise
    // get objects owned by its old uid).
    Controller::new("quotas", store, r, metrics)
        .source(Source::new("clusters", keys::well_known::clusters()))
        .source(Source::new(
            "metrics",
            orrery_api::kinds::CLUSTER_METRICS.prefix(None),
        ))
        .source(
            Source::new(
                "claims",
                orrery_api::kinds::CLUSTER_RESOURCE_CLAIM.prefix(None),
            )
            .cached(claims),
        )
        .source(Source::new("queues", keys::prefix(KUEUE_GROUP, QUEUE_PLURAL, None)).cached(queues))
        // Events come in bursts (every member's heartbeat): one round for a burst.
        .settle(Duration::from_millis(200))
        // One key for every member: a failure holds up the rest no longer than 5 s.
        .backoff(Duration::from_secs(1), Duration::from_secs(5))
        .run(shutdown)
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics(name: &str, nodes: &[(&str, &str, bool)]) -> Arc<Object> {
        let mut m = new_object(API_VERSION, METRICS_KIND, None, name);
        let nodes: Vec<Value> = nodes
            .iter()
            .map(|(cpu, used, unschedulable)| {
                json!({"allocatableResources": {"cpu": cpu, "memory": "8Gi"},
                       "allocatedResourceRequests": {"cpu": used},
                       "unschedulable": unschedulable})
            })
            .collect();
        if !nodes.is_empty() {
            m.status = Some(json!({ "nodes": nodes }));
        }
        Arc::new(m)
    }

    #[test]
    fn a_member_is_kept_as_its_owner_reference_and_reported_capacity() {
        let mut c = new_object("cluster.karmada.io/v1alpha1", "Cluster", None, "east");
        c.metadata.uid = "u-1".into();
        c.status = Some(json!({
            "apiEnablements": [{"groupVersion": "v1", "resources": [{"name": "pods", "kind": "Pod"}]}],
            "resourceSummary": {"allocatable": {"cpu": "8", "memory": "32Gi"}, "allocated": {"cpu": "1"}},
        }));
        let m = Member::of(&c);
        assert_eq!(m.owner, OwnerReference::controller_of(&c));
        assert!(m.live);
        assert_eq!(m.allocatable["cpu"].value(), 8);
        assert_eq!(m.allocatable.len(), 2);
        c.metadata.deletion_timestamp = Some(Time::now());
        c.status = None;
        let gone = Member::of(&c);
        assert!(!gone.live && gone.allocatable.is_empty());
        let members = Members::default();
        members.follow(&Event::Listed(vec![Arc::new(c)]));
        assert!(members.live().is_empty());
    }

    #[test]
    fn only_a_change_of_capacity_calls_for_a_round() {
        let caps = Capacities::default();
        let listed = vec![metrics("a", &[]), metrics("b", &[("4", "1", false)])];
        assert!(caps.seen(&Event::Listed(listed)), "a listing");
        assert_eq!(caps.get("a"), Some(None), "no node reported");
        assert!(!caps.has_nodes("a"));
        assert!(caps.has_nodes("b"));
        assert_eq!(caps.get("c"), None, "never seen");
        // (event, whether a round is called for, b's cpu afterwards)
        let table: Vec<(Event, bool, Option<&str>)> = vec![
            // Usage moved, capacity did not: every heartbeat.
            (
                Event::Upsert(metrics("b", &[("4", "3", false)])),
                false,
                Some("4"),
            ),
            (
                Event::Upsert(metrics("b", &[("4", "2", false)])),
                false,
                Some("4"),
            ),
            // A node more.
            (
                Event::Upsert(metrics("b", &[("4", "2", false), ("2", "0", false)])),
                true,
                Some("6"),
            ),
            // A node cordoned: it gives nothing.
            (
                Event::Upsert(metrics("b", &[("4", "2", false), ("2", "0", true)])),
                true,
                Some("4"),
            ),
            (
                Event::Upsert(metrics("b", &[("4", "1", false), ("2", "0", true)])),
                false,
                Some("4"),
            ),
            // A member's first nodes.
            (
                Event::Upsert(metrics("a", &[("8", "0", false)])),
                true,
                Some("4"),
            ),
            // A new member's empty ClusterMetrics.
            (Event::Upsert(metrics("c", &[])), true, Some("4")),
            (Event::Delete(metrics("b", &[])), true, None),
            // Gone already.
            (Event::Delete(metrics("b", &[])), false, None),
        ];
        for (i, (event, round, cpu)) in table.into_iter().enumerate() {
            assert_eq!(caps.seen(&event), round, "row {i}");
            let b = caps.get("b").flatten();
            assert_eq!(
                b.as_ref().and_then(|l| l.get("cpu")).map(|q| q.to_string()),
                cpu.map(str::to_string),
                "row {i}"
            );
        }
        assert!(caps.has_nodes("a"));
        assert_eq!(caps.get("c"), Some(None));
        // One this controller made is known at once; an event's word is newer and kept.
        caps.created(&metrics("d", &[]));
        assert_eq!(caps.get("d"), Some(None));
        caps.created(&metrics("a", &[]));
        assert!(caps.has_nodes("a"), "made earlier, reported since");
    }
}
