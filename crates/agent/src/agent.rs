//! One member cluster's agent: registration, the Works sync loop, status reports and
//! heartbeats, and riding out a server that comes and goes.
//!
//! A session is one connection's life: a heartbeat (which also proves the token), then three
//! activities side by side until one fails: the Works loop (list, then watch from where the
//! list ended; re-list when the watch expires), the heartbeat loop, and the reporter (Work
//! statuses in batches of up to 1,000, at most once per report interval). When a session ends
//! for a transient reason the agent waits (backoff with jitter) and starts another; meanwhile
//! the member keeps running what was last applied, which the state file also remembers across
//! restarts. On reconnect, Works whose content did not change are not applied again.

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use orrery_api::cluster::{self, CONDITION_JOINED, CONDITION_READY, ClusterFacts, Registration};
use orrery_api::conditions::{self, Condition};
use orrery_api::stateful::{Transfer, TransferRole};
use orrery_api::work::{
    self, ConflictResolution, Health, ManifestStatus, ResourceIdentifier, WorkSpec, WorkStatus,
};
use orrery_api::{MicroTime, Object, Time};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::backend::{Backend, BackendError, Cause, MemberReport};
use crate::backoff::Backoff;
use crate::state::{AgentState, AppliedWork, PendingDelete, StateError, StateFile};
use crate::transport::{self, Transport, TransportError, WorkEvent};

/// How one agent runs.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The server's URL, or several replicas' URLs separated by commas: the agent moves to
    /// the next when the one it uses fails.
    pub server: String,
    pub cluster: String,
    /// A bootstrap token (`ORR1<ca hash>::<id>.<secret>`), needed when no cluster token is
    /// stored yet, and to re-register if the stored one is revoked.
    pub bootstrap_token: Option<String>,
    /// The server's CA, when given as a file rather than pinned by the token.
    pub ca_pem: Option<String>,
    /// A cluster token to use as is, without registering (push mode: the server runs the
    /// agent for a member it reaches itself; needs `ca_pem`).
    pub cluster_token: Option<String>,
    pub info: ClusterFacts,
    pub state: StateFile,
    pub heartbeat_interval: Duration,
    /// Least time between two status reports.
    pub report_interval: Duration,
    /// How often every object is read again, whatever the backend's stamps say (what differs
    /// from the server's copy is sent, as always).
    pub resync_interval: Duration,
    /// Where the agent publishes the multi-cluster services its member imports (the
    /// ServiceImports and EndpointSlices of Orrery's `orrery-mcs.*` Works), for its clusterset
    /// DNS.
    pub services: Option<watch::Sender<Vec<Value>>>,
    /// Whether the agent keeps the cluster proxy's tunnel open to the server (a simulated
    /// fleet of thousands does not).
    pub tunnel: bool,
    /// Shared by the members of a simulated fleet, which share one process: how many of them
    /// may be setting up a session at once (fetching the CA, registering, the first heartbeat,
    /// each a TLS handshake). Thousands starting at once on a few cores otherwise make every
    /// handshake so slow that the server's handshake timeout ends them all, and they try again
    /// together. `None` for an agent of its own.
    pub connecting: Option<Arc<tokio::sync::Semaphore>>,
    /// What the agent's probes and metrics read (`--health-listen`).
    pub health: Option<Arc<crate::health::Health>>,
    /// How often the agent reads the server's CA bundle again (a CA rotation's new CA is
    /// trusted from then on, without registering again).
    pub ca_refresh: Duration,
}

impl AgentConfig {
    /// The servers' URLs, in the order they are tried.
    pub fn servers(&self) -> Vec<&str> {
        self.server
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect()
    }

    pub fn new(server: &str, cluster: &str) -> Self {
        AgentConfig {
            server: server.to_string(),
            cluster: cluster.to_string(),
            bootstrap_token: None,
            ca_pem: None,
            cluster_token: None,
            info: ClusterFacts::default(),
            state: StateFile::none(),
            heartbeat_interval: Duration::from_secs(10),
            report_interval: Duration::from_secs(1),
            resync_interval: Duration::from_secs(60),
            services: None,
            tunnel: true,
            connecting: None,
            health: None,
            ca_refresh: Duration::from_secs(600),
        }
    }
}

/// The Works of multi-cluster services a member imports.
const SERVICES_WORK_PREFIX: &str = "orrery-mcs.";

/// Why an agent stopped without an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// Asked to.
    Shutdown,
    /// Its cluster was unregistered; what it applied has been removed.
    Unregistered,
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    State(#[from] StateError),
    #[error("cannot register cluster {cluster}: {message}")]
    Bootstrap { cluster: String, message: String },
    #[error(
        "the server no longer accepts this agent's token for cluster {0} (the cluster was unregistered or another agent registered it); give a new bootstrap token with --token"
    )]
    Revoked(String),
    #[error("connecting to the server: {0}")]
    Client(String),
}

/// How a session ended.
#[derive(Debug)]
enum End {
    Stopped(Stopped),
    /// Try again after a pause.
    Transient(String),
    /// The token was refused.
    Revoked,
    /// The token was renewed: connect again with the new one, at once.
    Renewed,
    /// The server's CA bundle changed (a CA rotation): connect again trusting it, at once.
    NewTrust,
    /// Cannot go on.
    Fatal(AgentError),
}

impl From<TransportError> for End {
    fn from(e: TransportError) -> Self {
        match e {
            TransportError::Unauthorized(_) => End::Revoked,
            other => End::Transient(other.to_string()),
        }
    }
}

/// Shared between the activities of a session (locks are never held across an await).
#[derive(Debug)]
struct Inner {
    cfg: AgentConfig,
    /// Which of the servers' URLs the agent uses (counts up on each lost connection).
    current: std::sync::atomic::AtomicUsize,
    backend: Arc<dyn Backend>,
    state: Mutex<AgentState>,
    state_dirty: AtomicBool,
    /// Per Work: a number that changes with each change of its apply errors (from
    /// `errors_seq`), and the error of each manifest by ordinal.
    errors: Mutex<HashMap<String, (u64, ApplyErrors)>>,
    errors_seq: std::sync::atomic::AtomicU64,
    /// Works whose last report the server refused, and when: held back a while, then sent
    /// again.
    refused: Mutex<HashMap<String, (Instant, Duration)>>,
    /// Works whose last apply hit an unavailable member.
    retry: Mutex<HashSet<String>>,
    /// Per Work: the digest of the status the server has (what was last reported, or what a
    /// listing or watch event showed), and its conditions (their transition times).
    reported: Mutex<HashMap<String, (u64, Vec<Condition>)>>,
    /// Per Work: what its status was last computed from. Lock order: `computed`, then
    /// `reported`, then `refused`.
    computed: Mutex<HashMap<String, Computed>>,
    report_now: Notify,
    /// Works released from a hold on a copy (a migration's target), and since when: each of
    /// their changes is reported at once until their workload is healthy, since the
    /// workload is down until the control plane hears so.
    urgent: Mutex<HashMap<String, Instant>>,
    /// Round trips of the last heartbeats, milliseconds.
    round_trips: Mutex<std::collections::VecDeque<f64>>,
    /// The nodes last written into the member's ClusterMetrics, and when.
    metrics_sent: Mutex<Option<(Vec<orrery_api::quota::NodeInfo>, Instant)>>,
    /// When the server last said the member has no ClusterMetrics (it makes them; a fleet
    /// registering at once waits for thousands): not asked again before `METRICS_MISSING`.
    metrics_missing: Mutex<Option<Instant>>,
    /// Held by whatever changes the member (a Work applied or removed, a failed apply
    /// retried, held manifests released): their steps await the member, and interleaved, a
    /// retry that read a Work before it was removed would bring its deleted objects back.
    member: tokio::sync::Mutex<()>,
}

/// Heartbeats whose round trips make the reported latency to the control plane.
const ROUND_TRIPS: usize = 10;

/// How long a Work released from a hold is reported without the rate limit at most.
const URGENT_FOR: Duration = Duration::from_secs(60);

/// A Work's apply errors, by manifest ordinal.
type ApplyErrors = BTreeMap<usize, String>;

/// How long a Work whose report the server refused waits before it is sent again: a refusal
/// on its merits (an invalid status) waits long; one the server may take a moment later (a
/// conflict with another writer, a busy server) waits little, twice as long each time.
const REFUSED_HOLD: Duration = Duration::from_secs(10);
const RETRY_HOLD: Duration = Duration::from_millis(500);
const RETRY_HOLD_MAX: Duration = Duration::from_secs(5);

/// The hold after a refusal (`CODE: message`, as the DRO-DS batch answers), given the last.
fn refusal_hold(why: &str, last: Option<Duration>) -> Duration {
    let code = why.split(':').next().unwrap_or_default().trim();
    match code {
        "CONFLICT" | "TOO_MANY_REQUESTS" | "UNAVAILABLE" | "INTERNAL" | "TIMEOUT" => last
            .filter(|d| *d < REFUSED_HOLD)
            .map_or(RETRY_HOLD, |d| (d * 2).min(RETRY_HOLD_MAX)),
        _ => REFUSED_HOLD,
    }
}

/// Where a Work's apply errors keep the failure of its transfers (the others are keyed by
/// manifest ordinal).
const TRANSFER_ERROR: usize = usize::MAX;

/// A Work whose status is to be read again: its name, applied digest and generation, and
/// the identifiers of its objects when they are known already.
#[derive(Debug)]
struct Stale {
    name: String,
    digest: String,
    generation: i64,
    ids: Option<Vec<Option<ResourceIdentifier>>>,
}

/// What a Work's status was last computed from, so that a Work none of whose objects
/// changed is not read again (a member runs thousands; reports come several times a second).
#[derive(Debug, Clone)]
struct Computed {
    /// The applied Work (its digest) and generation.
    digest: String,
    generation: i64,
    ids: Vec<Option<ResourceIdentifier>>,
    /// The backend's stamps of those objects, taken before they were read.
    stamps: Vec<Option<u64>>,
    /// The backend's stamp of transfers then, for a Work with any.
    transfers: Option<Option<u64>>,
    /// The digest of the status computed then.
    status: u64,
}

impl Computed {
    /// Whether the status would come out the same now.
    fn still(&self, backend: &dyn Backend, digest: &str, generation: i64) -> bool {
        self.digest == digest
            && self.generation == generation
            && self
                .ids
                .iter()
                .zip(&self.stamps)
                .all(|(id, stamp)| match (id, stamp) {
                    (None, _) => true,
                    (Some(id), Some(s)) => backend.state_stamp(id) == Some(*s),
                    (Some(_), None) => false,
                })
            && match self.transfers {
                None => true,
                Some(Some(s)) => backend.transfer_stamp() == Some(s),
                Some(None) => false,
            }
    }
}

/// A digest of a Work status, transition times left out (they do not make a change alone).
fn status_digest(s: &WorkStatus) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for c in &s.conditions {
        (
            &c.type_,
            &c.status,
            &c.reason,
            &c.message,
            c.observed_generation,
        )
            .hash(&mut h);
    }
    orrery_api::object::json_digest(&s.manifest_statuses).hash(&mut h);
    orrery_api::object::json_digest(&s.transfers).hash(&mut h);
    s.observed_generation.hash(&mut h);
    h.finish()
}

/// The server's copy of a Work's status, as a digest and its conditions (`None`: it has none).
fn server_status(w: &Object) -> Option<(u64, Vec<Condition>)> {
    use serde::Deserialize;
    let st = WorkStatus::deserialize(w.status.as_ref()?).ok()?;
    Some((status_digest(&st), st.conditions))
}

fn digest_of(v: &Value) -> String {
    Sha256::digest(v.to_string().as_bytes())
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The manifest as applied: Orrery's label and the Work it comes from.
fn stamped(manifest: &Value, work_ref: &str) -> Value {
    let mut m = manifest.clone();
    if let Some(meta) = m.get_mut("metadata").and_then(Value::as_object_mut) {
        let labels = meta.entry("labels").or_insert_with(|| json!({}));
        if let Some(l) = labels.as_object_mut() {
            l.insert(work::MANAGED_LABEL.into(), json!(work::MANAGED_VALUE));
        }
        let ann = meta.entry("annotations").or_insert_with(|| json!({}));
        if let Some(a) = ann.as_object_mut() {
            a.insert(work::WORK_ANNOTATION.into(), json!(work_ref));
        }
    }
    m
}

fn identifiers(manifests: &[Value]) -> Vec<Option<ResourceIdentifier>> {
    manifests
        .iter()
        .enumerate()
        .map(|(i, m)| ResourceIdentifier::of(i, m))
        .collect()
}

/// Records the objects of `old` that `new` no longer has as owed deletions, in the same
/// step as the caller's change to the Works it holds: a deletion cut short (the session ends
/// while a slow member answers, and the future is dropped) or failed (the member is away) is
/// retried, not forgotten with the object still in the member. Returns what to delete now.
fn owe_dropped(
    st: &mut AgentState,
    old: &[Value],
    new: &[Value],
    cause: &Cause,
) -> Vec<(ResourceIdentifier, PendingDelete)> {
    let keep: Vec<ResourceIdentifier> = identifiers(new).into_iter().flatten().collect();
    let mut owed = Vec::new();
    for (m, id) in old.iter().zip(identifiers(old)) {
        let Some(id) = id else { continue };
        if keep.iter().any(|k| same_object(k, &id)) {
            continue;
        }
        let p = PendingDelete {
            manifest: m.clone(),
            work: cause.work.clone(),
            uid: cause.uid.clone(),
            generation: cause.generation,
            revision: cause.revision.clone(),
        };
        st.pending_deletes.retain(|q| {
            ResourceIdentifier::of(0, &q.manifest).is_none_or(|o| !same_object(&o, &id))
        });
        st.pending_deletes.push(p.clone());
        owed.push((id, p));
    }
    owed
}

/// The same object, whatever its position in the Work.
fn same_object(a: &ResourceIdentifier, b: &ResourceIdentifier) -> bool {
    a.group == b.group && a.kind == b.kind && a.namespace == b.namespace && a.name == b.name
}

impl Inner {
    /// The CA bundle the agent trusts: the one learnt from the server (kept in the state),
    /// else the one it was given.
    fn trusted_ca(&self) -> String {
        let learnt = self.lock_state().ca_pem.clone();
        if learnt.is_empty() {
            self.cfg.ca_pem.clone().unwrap_or_default()
        } else {
            learnt
        }
    }

    fn new(cfg: AgentConfig, backend: Arc<dyn Backend>, state: AgentState) -> Inner {
        Inner {
            cfg,
            backend,
            state: Mutex::new(state),
            state_dirty: AtomicBool::new(true),
            errors: Mutex::new(HashMap::new()),
            errors_seq: std::sync::atomic::AtomicU64::new(0),
            refused: Mutex::new(HashMap::new()),
            retry: Mutex::new(HashSet::new()),
            reported: Mutex::new(HashMap::new()),
            computed: Mutex::new(HashMap::new()),
            report_now: Notify::new(),
            urgent: Mutex::new(HashMap::new()),
            round_trips: Mutex::new(std::collections::VecDeque::new()),
            metrics_sent: Mutex::new(None),
            metrics_missing: Mutex::new(None),
            member: tokio::sync::Mutex::new(()),
            current: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// The server URL in use.
    fn server(&self) -> String {
        let servers = self.cfg.servers();
        if servers.is_empty() {
            return self.cfg.server.clone();
        }
        servers[self.current.load(Ordering::Acquire) % servers.len()].to_string()
    }

    fn lock_state(&self) -> parking_lot::MutexGuard<'_, AgentState> {
        self.state.lock()
    }

    /// The Works last applied, copied out of the lock.
    fn works_snapshot(&self) -> Vec<(String, AppliedWork)> {
        self.lock_state()
            .works
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    fn mark_dirty(&self) {
        self.state_dirty.store(true, Ordering::Release);
    }

    /// Writes what the control plane decided of the member's own ServiceExports (carried on
    /// the ServiceImports of a services Work) into their status.
    async fn write_export_statuses(&self, work: &str) {
        let imports: Vec<Value> = self
            .lock_state()
            .works
            .get(work)
            .map(|w| {
                w.manifests
                    .iter()
                    .filter(|m| {
                        m.get("kind").and_then(Value::as_str)
                            == Some(orrery_api::services::IMPORT_KIND)
                    })
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        for i in imports {
            let Some(status) = i
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(orrery_api::services::ANNOTATION_EXPORT_STATUS))
                .and_then(Value::as_str)
                .and_then(|s| serde_json::from_str::<Value>(s).ok())
            else {
                continue;
            };
            let at = |p: &str| i.pointer(p).and_then(Value::as_str).unwrap_or_default();
            let (ns, name) = (at("/metadata/namespace"), at("/metadata/name"));
            if let Err(e) = self.backend.set_export_status(ns, name, &status).await {
                tracing::warn!(cluster = %self.cfg.cluster, namespace = ns, name, error = %e, "writing a ServiceExport's status failed");
            }
        }
    }

    /// Publishes the imported services' objects, after a change of a Work carrying them.
    fn publish_services(&self) {
        let Some(tx) = &self.cfg.services else {
            return;
        };
        let objects: Vec<Value> = self
            .lock_state()
            .works
            .iter()
            .filter(|(name, _)| name.starts_with(SERVICES_WORK_PREFIX))
            .flat_map(|(_, w)| w.manifests.iter().cloned())
            .collect();
        tx.send_if_modified(|cur| {
            if *cur == objects {
                return false;
            }
            *cur = objects;
            true
        });
    }

    async fn flush_state(&self) {
        if self.state_dirty.swap(false, Ordering::AcqRel) {
            let snapshot = self.lock_state().clone();
            if let Some(h) = &self.cfg.health {
                h.set_works(snapshot.works.len());
            }
            if let Err(e) = self.cfg.state.save(&snapshot).await {
                tracing::warn!(cluster = %self.cfg.cluster, error = %e, "saving agent state failed");
                self.mark_dirty();
            }
        }
    }

    fn namespace(&self) -> String {
        cluster::namespace_of(&self.cfg.cluster)
    }

    /// Why a Work is carried out now.
    fn cause(&self, w: &Object, reason: &'static str) -> Cause {
        Cause {
            work: format!("{}/{}", self.namespace(), w.name()),
            uid: w.metadata.uid.clone(),
            generation: w.metadata.generation.unwrap_or(1),
            revision: w.metadata.resource_version.clone(),
            reason,
        }
    }

    /// The cause of applying again what the state file says was applied.
    fn applied_cause(&self, name: &str, w: &AppliedWork, reason: &'static str) -> Cause {
        Cause {
            work: format!("{}/{name}", self.namespace()),
            uid: w.uid.clone(),
            generation: w.generation,
            revision: String::new(),
            reason,
        }
    }

    /// Records a Work's apply errors; its status is computed afresh.
    fn set_errors(&self, name: String, errors: BTreeMap<usize, String>) {
        self.computed.lock().remove(&name);
        let seq = self.errors_seq.fetch_add(1, Ordering::AcqRel) + 1;
        self.errors.lock().insert(name, (seq, errors));
    }

    /// Which version of a Work's apply errors is recorded (`None`: the Work has none).
    fn errors_version(&self, name: &str) -> Option<u64> {
        self.errors.lock().get(name).map(|e| e.0)
    }

    /// Takes the server's copy of a Work's status as what it has, so that only what differs
    /// from it is reported (after a listing, after someone else wrote it).
    fn observe_server_status(&self, w: &Object) {
        let mut reported = self.reported.lock();
        match server_status(w) {
            Some(seen) => {
                if reported.get(w.name()).map(|r| r.0) != Some(seen.0) {
                    reported.insert(w.name().to_string(), seen);
                }
            }
            None => {
                reported.remove(w.name());
            }
        }
    }

    /// Applies manifests; returns the errors by ordinal, and whether any was the member
    /// being unavailable (worth retrying).
    async fn apply_manifests(
        &self,
        manifests: &[Value],
        overwrite: bool,
        cause: &Cause,
    ) -> (BTreeMap<usize, String>, bool) {
        let mut errors = BTreeMap::new();
        let mut unavailable = false;
        for (i, m) in manifests.iter().enumerate() {
            if let Err(e) = self.backend.apply(m, overwrite, cause).await {
                unavailable |= matches!(e, BackendError::Unavailable(_));
                errors.insert(i, e.to_string());
            }
        }
        (errors, unavailable)
    }

    /// Deletes objects owed by [`owe_dropped`]; each is struck off once deleted, and left
    /// to [`Self::retry_deletes`] when the member fails it.
    async fn delete_owed(&self, owed: Vec<(ResourceIdentifier, PendingDelete)>, cause: &Cause) {
        for (id, p) in owed {
            match self.backend.delete(&id, cause).await {
                Ok(()) => {
                    self.lock_state().pending_deletes.retain(|q| q != &p);
                    self.mark_dirty();
                }
                Err(e) => {
                    tracing::warn!(cluster = %self.cfg.cluster, object = %id.describe(), error = %e, "deleting a dropped object failed; it is tried again");
                }
            }
        }
    }

    /// Deletes again what could not be deleted before, unless a Work applies it again now.
    /// Each entry stays owed until its deletion succeeds: a retry cut short (the session
    /// ends while a slow member answers, and this future is dropped) is tried again, not
    /// forgotten with the object still in the member.
    async fn retry_deletes(&self) {
        let pending = self.lock_state().pending_deletes.clone();
        if pending.is_empty() {
            return;
        }
        let applied: Vec<ResourceIdentifier> = self
            .lock_state()
            .works
            .values()
            .flat_map(|w| identifiers(&w.manifests).into_iter().flatten())
            .collect();
        for p in pending {
            let settled = match ResourceIdentifier::of(0, &p.manifest) {
                None => true,
                Some(id) if applied.iter().any(|a| same_object(a, &id)) => true,
                Some(id) => {
                    let cause = Cause {
                        work: p.work.clone(),
                        uid: p.uid.clone(),
                        generation: p.generation,
                        revision: p.revision.clone(),
                        reason: "retried: the member was unavailable",
                    };
                    self.backend.delete(&id, &cause).await.is_ok()
                }
            };
            if settled {
                self.lock_state().pending_deletes.retain(|q| q != &p);
                self.mark_dirty();
            }
        }
    }

    /// Brings the member in line with one Work.
    async fn apply_work(&self, w: &Object) {
        let name = w.name().to_string();
        let spec: WorkSpec = match w.spec.clone().map(serde_json::from_value).transpose() {
            Ok(s) => s.unwrap_or_default(),
            Err(e) => {
                let mut errs = BTreeMap::new();
                errs.insert(0, format!("the Work's spec is not valid: {e}"));
                self.set_errors(name, errs);
                self.report_now.notify_one();
                return;
            }
        };
        let work_ref = format!("{}/{name}", self.namespace());
        let manifests: Vec<Value> = spec
            .workload
            .manifests
            .iter()
            .map(|m| stamped(m, &work_ref))
            .collect();
        let overwrite = spec.conflict_resolution == ConflictResolution::Overwrite;
        let digest = digest_of(&json!([
            w.metadata.uid,
            manifests,
            overwrite,
            spec.preserve_resources_on_deletion,
            spec.transfers,
        ]));
        let previous = self.lock_state().works.get(&name).cloned();
        let retrying = self.retry.lock().contains(&name);
        if previous.as_ref().is_some_and(|p| p.digest == digest) && !retrying {
            // Unchanged (typically after a reconnect): nothing to do to the member.
            return;
        }
        let mut cause = self.cause(w, "applied");
        // Transfers first: a target's workload may wait for a copy they start.
        let transfer_error = self
            .backend
            .set_transfers(&name, &spec.transfers)
            .await
            .err();
        let (manifests, held) = if self.copy_pending(&name, &spec.transfers).await {
            (Vec::new(), manifests)
        } else {
            (manifests, Vec::new())
        };
        // Only the transfers changed (a copy round, a fence elsewhere): the member's objects
        // are left alone, and so are the errors they gave.
        let same_objects = !retrying
            && previous.as_ref().is_some_and(|p| {
                p.uid == w.metadata.uid
                    && p.overwrite == overwrite
                    && p.preserve == spec.preserve_resources_on_deletion
                    && p.held == held
                    && p.manifests == manifests
            });
        let (mut errors, mut unavailable) = if same_objects {
            let mut kept = self
                .errors
                .lock()
                .get(&name)
                .map(|(_, e)| e.clone())
                .unwrap_or_default();
            kept.remove(&TRANSFER_ERROR);
            (kept, false)
        } else {
            self.apply_manifests(&manifests, overwrite, &cause).await
        };
        if let Some(e) = transfer_error {
            unavailable |= matches!(e, BackendError::Unavailable(_));
            errors.insert(TRANSFER_ERROR, format!("volume transfers: {e}"));
        }
        cause.reason = "dropped from the Work";
        let dropped = {
            let mut st = self.lock_state();
            let dropped = previous
                .as_ref()
                .map(|prev| owe_dropped(&mut st, &prev.manifests, &manifests, &cause))
                .unwrap_or_default();
            let applied = AppliedWork {
                uid: w.metadata.uid.clone(),
                generation: w.metadata.generation.unwrap_or(1),
                digest,
                manifests,
                preserve: spec.preserve_resources_on_deletion,
                overwrite,
                transfers: spec.transfers.clone(),
                held,
            };
            st.works.insert(name.clone(), applied);
            dropped
        };
        // A new version of the Work deserves a report of its own, whatever the last met.
        self.refused.lock().remove(&name);
        self.mark_dirty();
        if name.starts_with(SERVICES_WORK_PREFIX) {
            self.publish_services();
            self.write_export_statuses(&name).await;
        }
        self.delete_owed(dropped, &cause).await;
        {
            let mut retry = self.retry.lock();
            if unavailable {
                retry.insert(name.clone());
            } else {
                retry.remove(&name);
            }
        }
        if !errors.is_empty() {
            tracing::warn!(cluster = %self.cfg.cluster, work = %name, errors = errors.len(), first = %errors.values().next().cloned().unwrap_or_default(), "applying a Work failed in part");
        }
        self.set_errors(name, errors);
        self.report_now.notify_one();
    }

    /// Whether one of `transfers` holds the Work's manifests back: a Receive with
    /// `holdWorkload` whose round is not in yet.
    async fn copy_pending(&self, name: &str, transfers: &[Transfer]) -> bool {
        if !transfers
            .iter()
            .any(|t| t.role == TransferRole::Receive && t.hold_workload)
        {
            return false;
        }
        let statuses = self.backend.transfer_statuses(name, transfers).await;
        transfers
            .iter()
            .filter(|t| t.role == TransferRole::Receive && t.hold_workload)
            .any(|t| {
                !statuses
                    .iter()
                    .any(|s| s.id == t.id && s.complete && s.round >= t.round)
            })
    }

    /// Whether something must be reported without waiting for the next report slot: a
    /// transfer's milestone since `last_milestone`, or a Work released from a hold whose
    /// workload is not reported healthy yet.
    fn urgent(&self, last_milestone: u64) -> bool {
        if self.backend.milestone() != last_milestone {
            return true;
        }
        let mut urgent = self.urgent.lock();
        urgent.retain(|_, since| since.elapsed() < URGENT_FOR);
        !urgent.is_empty()
    }

    /// Applies the manifests of Works that waited for a copy that is now in: the target
    /// starts on the copied data without waiting for the control plane.
    async fn release_held(&self) {
        let waiting: Vec<(String, AppliedWork)> = self
            .lock_state()
            .works
            .iter()
            .filter(|(_, w)| !w.held.is_empty())
            .map(|(n, w)| (n.clone(), w.clone()))
            .collect();
        for (name, w) in waiting {
            if self.copy_pending(&name, &w.transfers).await {
                continue;
            }
            let cause = self.applied_cause(&name, &w, "applied: the volume copy is in");
            let (errors, unavailable) = self.apply_manifests(&w.held, w.overwrite, &cause).await;
            {
                let mut st = self.lock_state();
                // Unless the Work changed meanwhile (it was applied anew then).
                if let Some(cur) = st.works.get_mut(&name)
                    && cur.digest == w.digest
                {
                    cur.manifests = std::mem::take(&mut cur.held);
                }
            }
            // A status computed while the manifests were held names none of them (same
            // digest, no objects): it is computed afresh, and sent at once whatever a
            // refusal before held back.
            self.computed.lock().remove(&name);
            self.refused.lock().remove(&name);
            self.mark_dirty();
            if unavailable {
                self.retry.lock().insert(name.clone());
            }
            tracing::info!(cluster = %self.cfg.cluster, work = %name, "the volume copy is in: the Work's manifests are applied");
            self.urgent.lock().insert(name.clone(), Instant::now());
            self.set_errors(name, errors);
            self.report_now.notify_one();
        }
    }

    /// Removes a Work's objects from the member (unless it asked to keep them).
    async fn remove_work(&self, name: &str, revision: &str, reason: &'static str) {
        let removed = {
            let mut st = self.lock_state();
            st.works.remove(name).map(|old| {
                let cause = Cause {
                    work: format!("{}/{name}", self.namespace()),
                    uid: old.uid.clone(),
                    generation: old.generation,
                    revision: revision.to_string(),
                    reason,
                };
                let dropped = if old.preserve {
                    Vec::new()
                } else {
                    owe_dropped(&mut st, &old.manifests, &[], &cause)
                };
                (dropped, cause)
            })
        };
        if let Some((dropped, cause)) = removed {
            self.mark_dirty();
            if name.starts_with(SERVICES_WORK_PREFIX) {
                self.publish_services();
            }
            self.delete_owed(dropped, &cause).await;
        }
        if let Err(e) = self.backend.set_transfers(name, &[]).await {
            tracing::warn!(cluster = %self.cfg.cluster, work = %name, error = %e, "ending a removed Work's transfers failed");
        }
        self.errors.lock().remove(name);
        self.retry.lock().remove(name);
        self.reported.lock().remove(name);
        self.computed.lock().remove(name);
        self.refused.lock().remove(name);
    }

    /// After a (re)list: apply what changed, remove what is gone, and take the listed
    /// statuses as what the server has (a listing after a broken watch must not make every
    /// Work's status be sent again, with new transition times).
    async fn sync_all(&self, works: Vec<Object>) {
        let listed: HashSet<String> = works.iter().map(|w| w.name().to_string()).collect();
        let stale: Vec<String> = self
            .lock_state()
            .works
            .keys()
            .filter(|k| !listed.contains(*k))
            .cloned()
            .collect();
        for name in stale {
            self.remove_work(&name, "", "Work gone when listed again")
                .await;
        }
        for w in &works {
            self.apply_work(w).await;
            self.observe_server_status(w);
        }
        self.report_now.notify_one();
    }

    /// Re-applies what the state file says was applied (a restarted agent with a simulated
    /// member, or a member that lost objects while the agent was away).
    async fn resume(&self) {
        self.publish_services();
        let works = self.works_snapshot();
        if works.is_empty() {
            return;
        }
        tracing::info!(cluster = %self.cfg.cluster, works = works.len(), "resuming the Works applied before");
        for (name, w) in works {
            // The member's part in transfers carries on where it is (a member that kept
            // them changes nothing).
            if !w.transfers.is_empty()
                && let Err(e) = self.backend.set_transfers(&name, &w.transfers).await
            {
                tracing::warn!(cluster = %self.cfg.cluster, work = %name, error = %e, "resuming a Work's transfers failed");
            }
            // Only what the member lacks: objects it still has are left as they are, so an
            // agent restart is no operation in a member that kept its objects.
            let mut missing = Vec::new();
            for m in &w.manifests {
                let present = match ResourceIdentifier::of(0, m) {
                    Some(id) => matches!(self.backend.state(&id).await, Ok(Some(_))),
                    None => false,
                };
                if !present {
                    missing.push(m.clone());
                }
            }
            if missing.is_empty() {
                continue;
            }
            let cause = self.applied_cause(&name, &w, "resumed: the member lacked it");
            let (errors, unavailable) = self.apply_manifests(&missing, w.overwrite, &cause).await;
            if unavailable {
                self.retry.lock().insert(name.clone());
            }
            self.set_errors(name, errors);
        }
    }

    async fn retry_failed(&self) {
        self.retry_deletes().await;
        let names: Vec<String> = self.retry.lock().iter().cloned().collect();
        for name in names {
            let Some(w) = self.lock_state().works.get(&name).cloned() else {
                continue;
            };
            let cause = self.applied_cause(&name, &w, "retried: the member was unavailable");
            // The member's part in the Work's transfers too: a copy round asked for while the
            // member was away starts once it is back (the Work itself does not change).
            let transfer_error = self.backend.set_transfers(&name, &w.transfers).await.err();
            let (mut errors, mut unavailable) = self
                .apply_manifests(&w.manifests, w.overwrite, &cause)
                .await;
            if let Some(e) = transfer_error {
                unavailable |= matches!(e, BackendError::Unavailable(_));
                errors.insert(TRANSFER_ERROR, format!("volume transfers: {e}"));
            }
            if !unavailable {
                self.retry.lock().remove(&name);
            }
            self.set_errors(name, errors);
        }
    }

    /// The status of one Work as the member has it now.
    async fn work_status(
        &self,
        name: &str,
        generation: i64,
        ids: Vec<Option<ResourceIdentifier>>,
        now: Time,
    ) -> WorkStatus {
        let errors = self
            .errors
            .lock()
            .get(name)
            .map(|e| e.1.clone())
            .unwrap_or_default();
        let mut statuses = Vec::with_capacity(ids.len());
        // A status the member did not answer for: what it runs is unknown, not refused.
        let mut unread = false;
        for (i, id) in ids.into_iter().enumerate() {
            let Some(id) = id else { continue };
            let mut ms = ManifestStatus {
                identifier: id.clone(),
                ..Default::default()
            };
            if let Some(e) = errors.get(&i) {
                ms.message = e.clone();
            } else {
                match self.backend.state(&id).await {
                    Ok(Some(s)) => {
                        ms.applied = true;
                        ms.health = s.health;
                        ms.status = s.status;
                        ms.message = s.message;
                        ms.volumes = s.volumes;
                        ms.usage = s.usage;
                        ms.endpoints = s.endpoints;
                    }
                    Ok(None) => ms.message = "not present in the member".into(),
                    Err(e) => {
                        unread |= matches!(e, BackendError::Unavailable(_));
                        ms.message = e.to_string();
                    }
                }
            }
            statuses.push(ms);
        }
        let all_applied = statuses.iter().all(|s| s.applied) && errors.is_empty();
        let mut conds = self
            .reported
            .lock()
            .get(name)
            .map(|(_, c)| c.clone())
            .unwrap_or_default();
        let applied = if all_applied {
            Condition::new(
                work::CONDITION_APPLIED,
                conditions::TRUE,
                "AppliedSuccessful",
                "every manifest is applied",
            )
        } else {
            let first = errors.get(&TRANSFER_ERROR).cloned().or_else(|| {
                statuses
                    .iter()
                    .find(|s| !s.applied)
                    .map(|s| format!("{}: {}", s.identifier.describe(), s.message))
            });
            // Failed because the member did not answer (the Work is retried once it does):
            // not a refusal, and whatever it ran before may still run there. A move must not
            // take it for the target refusing the workload and start the source again.
            let unavailable = unread || self.retry.lock().contains(name);
            Condition::new(
                work::CONDITION_APPLIED,
                conditions::FALSE,
                if unavailable {
                    work::REASON_MEMBER_UNAVAILABLE
                } else {
                    work::REASON_APPLIED_FAILED
                },
                first.unwrap_or_default(),
            )
        };
        conditions::set(&mut conds, applied, now);
        let available = if statuses.iter().any(|s| s.health == Health::Unhealthy) {
            let first = statuses
                .iter()
                .find(|s| s.health == Health::Unhealthy)
                .map(|s| format!("{}: {}", s.identifier.describe(), s.message));
            Condition::new(
                work::CONDITION_AVAILABLE,
                conditions::FALSE,
                "Unhealthy",
                first.unwrap_or_default(),
            )
        } else if all_applied && statuses.iter().all(|s| s.health == Health::Healthy) {
            Condition::new(
                work::CONDITION_AVAILABLE,
                conditions::TRUE,
                "AllHealthy",
                "every manifest is healthy",
            )
        } else {
            Condition::new(
                work::CONDITION_AVAILABLE,
                conditions::FALSE,
                "Progressing",
                "not every manifest is healthy yet",
            )
        };
        conditions::set(&mut conds, available, now);
        let transfers = match self.lock_state().works.get(name) {
            Some(w) if !w.transfers.is_empty() => w.transfers.clone(),
            _ => Vec::new(),
        };
        let transfers = if transfers.is_empty() {
            Vec::new()
        } else {
            self.backend.transfer_statuses(name, &transfers).await
        };
        WorkStatus {
            conditions: conds,
            manifest_statuses: statuses,
            observed_generation: Some(generation),
            transfers,
        }
    }

    /// Status items of the Works whose status differs from what the server has. A Work is
    /// read again only if it, its apply errors or the backend's stamp of one of its objects
    /// changed since last time, or with `everything` (the periodic resync).
    async fn changed_statuses(
        &self,
        everything: bool,
    ) -> Vec<(String, u64, Vec<Condition>, Value)> {
        let works: Vec<(String, String, i64)> = self
            .lock_state()
            .works
            .iter()
            .map(|(k, v)| (k.clone(), v.digest.clone(), v.generation))
            .collect();
        // Which Works need reading: cheap checks under the locks, no awaits.
        let todo: Vec<Stale> = {
            let computed = self.computed.lock();
            let reported = self.reported.lock();
            let refused = self.refused.lock();
            works
                .into_iter()
                .filter_map(|(name, digest, generation)| {
                    if refused
                        .get(&name)
                        .is_some_and(|(t, hold)| t.elapsed() < *hold)
                    {
                        return None;
                    }
                    let c = computed.get(&name);
                    let same = !everything
                        && c.is_some_and(|c| {
                            c.still(self.backend.as_ref(), &digest, generation)
                                && reported.get(&name).map(|r| r.0) == Some(c.status)
                        });
                    if same {
                        return None;
                    }
                    let ids = c.filter(|c| c.digest == digest).map(|c| c.ids.clone());
                    Some(Stale {
                        name,
                        digest,
                        generation,
                        ids,
                    })
                })
                .collect()
        };
        let now = Time::now();
        let mut out = Vec::new();
        for Stale {
            name,
            digest,
            generation,
            ids,
        } in todo
        {
            let ids = match ids {
                Some(ids) => ids,
                None => match self.lock_state().works.get(&name) {
                    Some(w) => identifiers(&w.manifests),
                    None => continue,
                },
            };
            // Stamps and the errors' version before reading: a change during the read (the
            // reads await) shows next time.
            let stamps: Vec<Option<u64>> = ids
                .iter()
                .map(|id| id.as_ref().and_then(|id| self.backend.state_stamp(id)))
                .collect();
            let has_transfers = self
                .lock_state()
                .works
                .get(&name)
                .is_some_and(|w| !w.transfers.is_empty());
            let transfer_stamp = has_transfers.then(|| self.backend.transfer_stamp());
            let errors = self.errors_version(&name);
            let status = self.work_status(&name, generation, ids.clone(), now).await;
            let h = status_digest(&status);
            let still_there = self.lock_state().works.contains_key(&name);
            if still_there && self.errors_version(&name) == errors {
                self.computed.lock().insert(
                    name.clone(),
                    Computed {
                        digest,
                        generation,
                        ids,
                        stamps,
                        transfers: transfer_stamp,
                        status: h,
                    },
                );
            }
            let same = self
                .reported
                .lock()
                .get(&name)
                .is_some_and(|(d, _)| *d == h);
            if !same {
                let item = json!({
                    "kind": "Work",
                    "namespace": self.namespace(),
                    "name": name,
                    "status": serde_json::to_value(&status).unwrap_or_default(),
                });
                out.push((name, h, status.conditions, item));
            }
        }
        out
    }

    /// Removes everything applied (the cluster was unregistered) and forgets the state.
    async fn forget_everything(&self) {
        let _member = self.member.lock().await;
        let names: Vec<String> = self.lock_state().works.keys().cloned().collect();
        for n in names {
            self.remove_work(&n, "", "cluster unregistered").await;
        }
        self.cfg.state.remove().await;
    }
}

fn cluster_status(
    report: &Result<MemberReport, BackendError>,
    conds: &mut Vec<Condition>,
    now: Time,
    push: bool,
    server_latency: Option<f64>,
    ca_bundle_hash: &str,
) -> Value {
    let ready = match report {
        Ok(r) if r.healthy => Condition::new(
            CONDITION_READY,
            conditions::TRUE,
            "MemberHealthy",
            r.message.clone(),
        ),
        Ok(r) => Condition::new(
            CONDITION_READY,
            conditions::FALSE,
            "MemberUnhealthy",
            r.message.clone(),
        ),
        Err(e) => Condition::new(
            CONDITION_READY,
            conditions::FALSE,
            "MemberUnreachable",
            e.to_string(),
        ),
    };
    conditions::set(conds, ready, now);
    let joined = if push {
        Condition::new(
            CONDITION_JOINED,
            conditions::TRUE,
            "PushConnected",
            "the server reaches the cluster's API",
        )
    } else {
        Condition::new(
            CONDITION_JOINED,
            conditions::TRUE,
            "AgentRegistered",
            "the cluster's agent is connected",
        )
    };
    conditions::set(conds, joined, now);
    let mut status = json!({
        "conditions": conds,
        "lastHeartbeatTime": now.to_string(),
        "caBundleHash": ca_bundle_hash,
    });
    if let Ok(r) = report {
        let s = &mut status;
        s["kubernetesVersion"] = json!(r.kubernetes_version);
        s["apiEnablements"] = json!(r.api_enablements);
        s["nodeSummary"] = json!(r.node_summary);
        s["resourceSummary"] = json!(r.resource_summary);
        s["largestNodeFree"] = json!(r.largest_node_free);
        if let Some(n) = &r.network {
            s["network"] = json!(n);
        }
        if let Some(l) = server_latency {
            if !s["network"].is_object() {
                s["network"] = json!({});
            }
            s["network"]["serverLatencyMs"] = json!(l);
        }
        s["properties"] = json!(r.properties);
        if !r.storage_classes.is_empty() {
            s["storageClasses"] = json!(r.storage_classes);
        }
        if !r.data_sets.is_empty() {
            s["dataSets"] = json!(r.data_sets);
        }
        if !r.service_exports.is_empty() {
            s["serviceExports"] = json!(r.service_exports);
        }
    }
    status
}

async fn sleep_or_shutdown(d: Duration, shutdown: &mut watch::Receiver<bool>) -> bool {
    if *shutdown.borrow() {
        return true;
    }
    tokio::select! {
        _ = tokio::time::sleep(d) => false,
        _ = shutdown.changed() => true,
    }
}

/// The longest a fleet member holds its place among those setting up a session: a server
/// that never answers must not keep the rest of the fleet waiting.
const SETTING_UP: Duration = Duration::from_secs(15);

/// Holds a fleet's permit to set up a session until the returned sender is dropped, or
/// [`SETTING_UP`] at most.
fn hold_while_setting_up(
    permit: tokio::sync::OwnedSemaphorePermit,
) -> tokio::sync::oneshot::Sender<()> {
    let (done, set_up) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let _ = tokio::time::timeout(SETTING_UP, set_up).await;
        drop(permit);
    });
    done
}

/// Runs one agent until it is shut down, its cluster is unregistered, or it cannot go on.
pub async fn run(
    cfg: AgentConfig,
    backend: Arc<dyn Backend>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<Stopped, AgentError> {
    let mut state = cfg.state.load().await?;
    if state.cluster != cfg.cluster {
        // A state file of another cluster (or none): start afresh.
        state = AgentState {
            cluster: cfg.cluster.clone(),
            ..Default::default()
        };
    }
    state.server = cfg.server.clone();
    let inner = Arc::new(Inner::new(cfg, backend, state));
    inner.resume().await;
    inner.flush_state().await;
    let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
    let result = loop {
        if *shutdown.borrow() {
            break Ok(Stopped::Shutdown);
        }
        let setting_up = match &inner.cfg.connecting {
            Some(limit) => tokio::select! {
                p = limit.clone().acquire_owned() => p.ok().map(hold_while_setting_up),
                _ = shutdown.changed() => break Ok(Stopped::Shutdown),
            },
            None => None,
        };
        if let Some(h) = &inner.cfg.health {
            h.attempt();
        }
        let end = match connect(&inner).await {
            Ok(client) => {
                let end = session(&inner, client, &mut shutdown, &mut backoff, setting_up).await;
                if let Some(h) = &inner.cfg.health {
                    h.set_session(false);
                }
                end
            }
            Err(e) => e,
        };
        match end {
            End::Stopped(s) => break Ok(s),
            End::Renewed => {
                tracing::info!(cluster = %inner.cfg.cluster, "renewed the cluster token; connecting with it");
            }
            End::NewTrust => {
                tracing::info!(cluster = %inner.cfg.cluster, "the server's CA bundle changed; connecting with it");
            }
            End::Fatal(e) => break Err(e),
            End::Revoked => {
                if inner.cfg.bootstrap_token.is_none() || inner.cfg.cluster_token.is_some() {
                    break Err(AgentError::Revoked(inner.cfg.cluster.clone()));
                }
                tracing::warn!(cluster = %inner.cfg.cluster, "the agent token was refused; registering again with the bootstrap token");
                if let Some(h) = &inner.cfg.health {
                    h.set_registered(false);
                }
                inner.lock_state().token.clear();
                inner.mark_dirty();
            }
            End::Transient(why) => {
                let d = backoff.delay();
                let failed = inner.server();
                // Another replica, if there are several: the next attempt goes there.
                inner.current.fetch_add(1, Ordering::AcqRel);
                tracing::warn!(cluster = %inner.cfg.cluster, server = %failed, next = %inner.server(), error = %why, retry_in_ms = d.as_millis() as u64, "lost the server; the member keeps running what it has");
                if sleep_or_shutdown(d, &mut shutdown).await {
                    break Ok(Stopped::Shutdown);
                }
            }
        }
    };
    if matches!(result, Ok(Stopped::Unregistered)) {
        tracing::info!(cluster = %inner.cfg.cluster, "the cluster was unregistered; removing what it ran and stopping");
        inner.forget_everything().await;
    } else {
        inner.flush_state().await;
    }
    result
}

/// A client holding the cluster token, registering first if there is none.
async fn connect(inner: &Inner) -> Result<kube::Client, End> {
    let cfg = &inner.cfg;
    if let Some(token) = &cfg.cluster_token {
        return orrery_client::connect(&inner.server(), token, &inner.trusted_ca())
            .await
            .map_err(|e| End::Transient(e.to_string()));
    }
    let (token, ca) = {
        let s = inner.lock_state();
        (s.token.clone(), s.ca_pem.clone())
    };
    if !token.is_empty() && !ca.is_empty() {
        if let Some(h) = &cfg.health {
            h.set_registered(true);
        }
        return orrery_client::connect(&inner.server(), &token, &ca)
            .await
            .map_err(|e| End::Transient(e.to_string()));
    }
    let fatal = |message: String| {
        End::Fatal(AgentError::Bootstrap {
            cluster: cfg.cluster.clone(),
            message,
        })
    };
    let Some(bootstrap) = cfg.bootstrap_token.clone() else {
        return Err(fatal(
            "no agent token is stored and no bootstrap token was given (--token)".into(),
        ));
    };
    let (pinned, credential) = orrery_api::token::parse(&bootstrap);
    let ca = match (&cfg.ca_pem, pinned) {
        (Some(pem), Some(hash)) if orrery_api::token::ca_hash(pem) != hash => {
            return Err(fatal(
                "the CA file does not match the CA hash in the token".into(),
            ));
        }
        (Some(pem), _) => pem.clone(),
        (None, Some(hash)) => {
            let fetched = orrery_client::fetch_ca_unverified(&inner.server())
                .await
                .map_err(|e| End::Transient(format!("fetching the server's CA: {e}")))?;
            // Only what the token pins is trusted; during a CA rotation the rest of the
            // bundle is learnt over the verified connection later.
            let Some(trusted) = orrery_api::token::trusted_part(&fetched, hash) else {
                return Err(fatal(format!(
                    "the server at {} presented a CA that does not match the token's CA hash; refusing to trust it (a token minted before a CA switch pins a CA that is gone: mint a new one)",
                    inner.server()
                )));
            };
            tracing::debug!(server = %inner.server(), "fetched the server's CA without verifying the connection; it matches the hash the token pins");
            trusted
        }
        (None, None) => {
            return Err(fatal(
                "the token carries no CA hash; pass the server's CA with --ca-file".into(),
            ));
        }
    };
    let client = orrery_client::connect(&inner.server(), credential, &ca)
        .await
        .map_err(|e| End::Transient(e.to_string()))?;
    let request = Registration {
        cluster: cfg.cluster.clone(),
        facts: cfg.info.clone(),
    };
    let reg = match transport::register(&client, &request).await {
        Ok(r) => r,
        Err(e) if e.is_transient() => return Err(End::Transient(e.to_string())),
        // Another agent runs the cluster: this one is let in once that one's heartbeat
        // lapses (a replacement started before the old one's lease ran out).
        Err(TransportError::Conflict(m)) => {
            tracing::warn!(cluster = %cfg.cluster, reason = %m, "the server refused to register this agent while another runs the cluster; trying again");
            return Err(End::Transient(m));
        }
        Err(e) => return Err(fatal(e.to_string())),
    };
    tracing::info!(cluster = %cfg.cluster, uid = %reg.uid, namespace = %reg.namespace, "registered");
    if let Some(h) = &cfg.health {
        h.set_registered(true);
    }
    {
        let mut s = inner.lock_state();
        s.token = reg.token.clone();
        s.ca_pem = ca.clone();
        s.token_issued = Some(orrery_api::Time::now());
        s.token_expires = reg.expires;
    }
    inner.mark_dirty();
    inner.flush_state().await;
    orrery_client::connect(&inner.server(), &reg.token, &ca)
        .await
        .map_err(|e| End::Transient(e.to_string()))
}

async fn session(
    inner: &Arc<Inner>,
    client: kube::Client,
    shutdown: &mut watch::Receiver<bool>,
    backoff: &mut Backoff,
    setting_up: Option<tokio::sync::oneshot::Sender<()>>,
) -> End {
    let t = Transport::new(client, &inner.cfg.cluster);
    let mut conds: Vec<Condition> = Vec::new();
    let mut beats = Beats::default();
    // The first heartbeat writes the status: it proves the token and makes the cluster
    // Ready at once.
    match beat_in_time(inner, &t, &mut conds, &mut beats).await {
        Some(Ok(None)) => {}
        Some(Ok(Some(s))) => return End::Stopped(s),
        Some(Err(e)) => return e,
        None => {
            return End::Transient("the session's first heartbeat had no answer in time".into());
        }
    }
    drop(setting_up);
    backoff.reset();
    if let Some(h) = &inner.cfg.health {
        h.set_session(true);
    }
    tracing::info!(cluster = %inner.cfg.cluster, server = %inner.server(), "connected");
    let works = works_loop(inner, &t);
    let beats = heartbeat_loop(inner, &t, conds, beats);
    let reports = report_loop(inner, &t);
    let tunnel = tunnel_loop(inner, &t);
    let renewal = renew_loop(inner, &t);
    let trust = ca_loop(inner, &t);
    tokio::pin!(works, beats, reports, tunnel, renewal, trust);
    tokio::select! {
        e = &mut renewal => e,
        e = &mut trust => e,
        e = &mut works => e,
        e = &mut beats => e,
        e = &mut reports => e,
        e = &mut tunnel => e,
        _ = shutdown.changed() => End::Stopped(Stopped::Shutdown),
    }
}

/// Renews the cluster token a third of its life before it expires (kept in the state before
/// it is used), then ends the session so the next one connects with it. Never ends for a
/// token that does not expire.
async fn renew_loop(inner: &Arc<Inner>, t: &Transport) -> End {
    loop {
        let due = {
            let s = inner.lock_state();
            match (s.token_issued, s.token_expires) {
                (Some(issued), Some(expires)) => {
                    let life = expires.unix_seconds() - issued.unix_seconds();
                    Some(expires.unix_seconds() - life / 3)
                }
                // Issued before its lifetime was kept: renew once less than a day is left.
                (None, Some(expires)) => Some(expires.unix_seconds() - 86_400),
                _ => None,
            }
        };
        let Some(due) = due else {
            return std::future::pending().await;
        };
        let wait = due - orrery_api::Time::now().unix_seconds();
        if wait > 0 {
            tokio::time::sleep(Duration::from_secs(wait.min(60) as u64)).await;
            continue;
        }
        match t.renew().await {
            Ok(r) => {
                {
                    let mut s = inner.lock_state();
                    s.token = r.token;
                    s.token_issued = Some(orrery_api::Time::now());
                    s.token_expires = r.expires;
                }
                inner.mark_dirty();
                inner.flush_state().await;
                return End::Renewed;
            }
            Err(TransportError::Unauthorized(_)) => return End::Revoked,
            Err(e) => {
                tracing::warn!(cluster = %inner.cfg.cluster, error = %e, "renewing the cluster token; trying again shortly");
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        }
    }
}

/// Reads the server's CA bundle every `ca_refresh` (spread over the fleet by the cluster's
/// name) and, when it changed, keeps it and ends the session so that the next one trusts it.
/// The connection it is read over was verified with the bundle held, so the new one is the
/// server's.
async fn ca_loop(inner: &Arc<Inner>, t: &Transport) -> End {
    let every = inner.cfg.ca_refresh.max(Duration::from_millis(100));
    // A fixed offset per cluster: a fleet that connected together does not ask together.
    let spread = inner
        .cfg
        .cluster
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        });
    let first = every.mul_f64(0.5 + (spread % 1000) as f64 / 2000.0);
    tokio::time::sleep(first).await;
    loop {
        match t.ca_bundle().await {
            Ok(bundle) => {
                if bundle != inner.trusted_ca() {
                    if orrery_client::pem_certificates(&bundle).is_empty() {
                        tracing::warn!(cluster = %inner.cfg.cluster, "the server's CA bundle holds no certificate; keeping the one held");
                    } else {
                        tracing::info!(
                            cluster = %inner.cfg.cluster,
                            certificates = orrery_client::pem_certificates(&bundle).len(),
                            "the server hands out a new CA bundle; trusting it from now on"
                        );
                        inner.lock_state().ca_pem = bundle;
                        inner.mark_dirty();
                        inner.flush_state().await;
                        return End::NewTrust;
                    }
                }
            }
            Err(TransportError::Unauthorized(_)) => return End::Revoked,
            Err(e) => {
                tracing::debug!(cluster = %inner.cfg.cluster, error = %e, "reading the server's CA bundle; trying again at the next refresh");
            }
        }
        tokio::time::sleep(every).await;
    }
}

/// How long a status that has not changed goes unwritten at most: the Lease's renewals stand
/// for it meanwhile (Kubernetes' kubelet waits 5 minutes; a Cluster's figures are read by
/// more, so a minute).
const STATUS_REFRESH: Duration = Duration::from_secs(60);

/// How long an agent whose server has no Lease for it (an older server, or one not done
/// making it) writes its status with every beat before it asks again.
const LEASE_RECHECK: Duration = Duration::from_secs(30);

/// What a session's heartbeats remember: the status last written, and the Lease.
#[derive(Debug, Default)]
struct Beats {
    /// The status last written (as [`comparable`] makes it), when, and the Cluster's
    /// resourceVersion after it.
    written: Option<(Value, Instant, String)>,
    /// The Lease as last read or renewed.
    lease: Option<Object>,
    /// When the server last had no Lease for us (or forbade it).
    no_lease: Option<Instant>,
}

/// How far a measured figure may drift before the status is written ahead of
/// [`STATUS_REFRESH`], as a share of the capacity it is measured against (usage against
/// allocatable, traffic against bandwidth): background load and traffic move a little at
/// every beat, and placement reads water levels to the percent (Orrery's own replicas are in
/// `allocated`, compared exactly).
const DRIFT: f64 = 0.01;

/// The measured figures of a status: (where the figure is, where its capacity is).
const MEASURED: &[(&str, &str)] = &[
    (
        "/resourceSummary/usage/cpu",
        "/resourceSummary/allocatable/cpu",
    ),
    (
        "/resourceSummary/usage/memory",
        "/resourceSummary/allocatable/memory",
    ),
    (
        "/resourceSummary/usage/nvidia.com~1gpu",
        "/resourceSummary/allocatable/nvidia.com~1gpu",
    ),
    (
        "/network/egressBytesPerSecond",
        "/network/bandwidthBytesPerSecond",
    ),
    (
        "/network/ingressBytesPerSecond",
        "/network/bandwidthBytesPerSecond",
    ),
];

/// What [`same_status`] leaves out of the exact comparison: the beat's time, the round trip
/// (compared by [`same_latency`]) and the measured figures (compared within [`DRIFT`]).
static UNCOMPARED: std::sync::LazyLock<Vec<&'static str>> = std::sync::LazyLock::new(|| {
    ["/lastHeartbeatTime", "/network/serverLatencyMs"]
        .into_iter()
        .chain(MEASURED.iter().map(|(at, _)| *at))
        .collect()
});

/// Whether `a` and `b` are equal but for the values at the JSON pointers `skip`, `at` being
/// where both are. Compared in place: a heartbeat used to copy both statuses to strip them
/// (a tenth of a simulating process's CPU at 3,000 members).
fn equal_except(a: &Value, b: &Value, at: &mut String, skip: &[&str]) -> bool {
    let within = |p: &&str| {
        p.len() > at.len() && p.starts_with(at.as_str()) && p.as_bytes()[at.len()] == b'/'
    };
    if !skip.iter().any(within) {
        return a == b;
    }
    let depth = at.len();
    // The pointer of the member `key` of the value at `at` (RFC 6901 escapes).
    let enter = |at: &mut String, key: &str| {
        at.truncate(depth);
        at.push('/');
        for c in key.chars() {
            match c {
                '~' => at.push_str("~0"),
                '/' => at.push_str("~1"),
                c => at.push(c),
            }
        }
    };
    let same = match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            x.iter().all(|(k, va)| {
                enter(at, k);
                skip.contains(&at.as_str())
                    || y.get(k).is_some_and(|vb| equal_except(va, vb, at, skip))
            }) && y.keys().all(|k| {
                enter(at, k);
                x.contains_key(k) || skip.contains(&at.as_str())
            })
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len()
                && x.iter().zip(y).enumerate().all(|(i, (va, vb))| {
                    enter(at, &i.to_string());
                    skip.contains(&at.as_str()) || equal_except(va, vb, at, skip)
                })
        }
        _ => a == b,
    };
    at.truncate(depth);
    same
}

/// Whether two round trips to the server (`network.serverLatencyMs`) tell the same: both
/// absent, or within 5 ms or a factor of 2 of each other (a round trip varies from beat to
/// beat with the server's load; placement reads it to tell near from far).
fn same_latency(a: Option<f64>, b: Option<f64>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => (a - b).abs() <= 5.0 || (a.max(b) <= 2.0 * a.min(b)),
        _ => false,
    }
}

/// A figure as a number (a JSON number or a quantity).
fn figure(v: Option<&Value>) -> Option<f64> {
    match v? {
        Value::Number(n) => n.as_f64(),
        Value::String(q) => q.parse::<orrery_api::Quantity>().ok().map(|q| q.as_f64()),
        _ => None,
    }
}

/// Whether `now` says what `written` said: equal but for the beat's time and the measured
/// figures, each of those within [`DRIFT`] of its capacity, and the round trip to the server
/// as [`same_latency`] says.
fn same_status(written: &Value, now: &Value) -> bool {
    let latency = |v: &Value| {
        v.pointer("/network/serverLatencyMs")
            .and_then(Value::as_f64)
    };
    if !same_latency(latency(written), latency(now)) {
        return false;
    }
    if !equal_except(written, now, &mut String::new(), &UNCOMPARED) {
        return false;
    }
    MEASURED.iter().all(|(at, capacity)| {
        let (a, b) = (written.pointer(at), now.pointer(at));
        match (figure(a), figure(b), figure(now.pointer(capacity))) {
            (Some(a), Some(b), Some(cap)) if cap > 0.0 => (a - b).abs() <= DRIFT * cap,
            _ => a == b,
        }
    })
}

/// How long a heartbeat may take: the interval, 10 s at least.
fn beat_limit(interval: Duration) -> Duration {
    interval.max(Duration::from_secs(10))
}

/// A [`heartbeat`] given up after [`beat_limit`] (`None`). A request may hang on a connection
/// that died without a word, and a silent member is declared Unknown after the grace period:
/// kubelet bounds its heartbeats and drops their connections the same way. Giving up drops
/// the request's connection (the agent's client speaks HTTP/1.1, a connection per request
/// in flight), so the next beat makes a new one.
async fn beat_in_time(
    inner: &Inner,
    t: &Transport,
    conds: &mut Vec<Condition>,
    beats: &mut Beats,
) -> Option<Result<Option<Stopped>, End>> {
    tokio::time::timeout(
        beat_limit(inner.cfg.heartbeat_interval),
        heartbeat(inner, t, conds, beats),
    )
    .await
    .ok()
}

/// What the session does when a beat was given up: a first one is skipped (its connection
/// is gone, the next beat makes another); a second in a row ends the session, so that the
/// agent tries the next replica (a server that takes requests and never answers, as a
/// stopped one does).
fn unanswered(inner: &Inner, in_a_row: &mut u32) -> Option<End> {
    *in_a_row += 1;
    let limit = beat_limit(inner.cfg.heartbeat_interval);
    if *in_a_row >= 2 {
        return Some(End::Transient(format!(
            "two heartbeats in a row had no answer within {limit:?}"
        )));
    }
    tracing::warn!(cluster = %inner.cfg.cluster, server = %inner.server(), ?limit, "a heartbeat had no answer in time; the next goes on a new connection");
    None
}

/// One heartbeat: the Lease renewed when the member's status is what was last written (and
/// not too long ago), else the status written. `Some` when the cluster turned out to be
/// unregistered.
async fn heartbeat(
    inner: &Inner,
    t: &Transport,
    conds: &mut Vec<Condition>,
    beats: &mut Beats,
) -> Result<Option<Stopped>, End> {
    let report = inner.backend.report().await;
    if let Some(h) = &inner.cfg.health {
        h.member(report.as_ref().map(|_| ()).map_err(|e| e.to_string()));
    }
    let measured = MicroTime::now();
    // The lowest recent round trip: the network's share, without the server's work.
    let server_latency = inner.round_trips.lock().iter().copied().reduce(f64::min);
    let trusted = orrery_api::token::ca_hash(&inner.trusted_ca());
    let status = cluster_status(
        &report,
        conds,
        measured.time(),
        inner.cfg.cluster_token.is_some(),
        server_latency,
        &trusted,
    );
    let nodes = report.as_ref().ok().map(|r| r.nodes.clone());
    let unchanged = beats
        .written
        .as_ref()
        .is_some_and(|(w, at, _)| at.elapsed() < STATUS_REFRESH && same_status(w, &status));
    let mut status = status;
    if unchanged
        && beats
            .no_lease
            .is_none_or(|at| at.elapsed() >= LEASE_RECHECK)
    {
        match renew(inner, t, beats, measured).await {
            Ok(Renewal::Renewed) => {
                if let Some(h) = &inner.cfg.health {
                    h.heartbeat(true);
                }
                if let Some(nodes) = nodes {
                    write_metrics(inner, t, nodes).await;
                }
                return Ok(None);
            }
            Ok(Renewal::WriteStatus) => {}
            // The server changed the Cluster's conditions: the status is written over what
            // it has, so that a condition's transition time is the server's.
            Ok(Renewal::ReadFirst) => match t.get_cluster().await {
                Ok(c) if c.metadata.deletion_timestamp.is_some() => {
                    return Ok(Some(Stopped::Unregistered));
                }
                Ok(c) => {
                    *conds = cluster::ClusterStatus::of(&c).conditions;
                    status = cluster_status(
                        &report,
                        conds,
                        measured.time(),
                        inner.cfg.cluster_token.is_some(),
                        server_latency,
                        &trusted,
                    );
                }
                Err(e) => return failed_beat(inner, e),
            },
            Err(e) => return failed_beat(inner, e),
        }
    }
    let sent = Instant::now();
    let written = status.clone();
    let answer = t.heartbeat(status).await;
    timed(inner, sent.elapsed());
    if let (Some(h), true) = (&inner.cfg.health, answer.is_ok()) {
        h.heartbeat(true);
    }
    match answer {
        Ok(c) if c.metadata.deletion_timestamp.is_some() => Ok(Some(Stopped::Unregistered)),
        Ok(c) => {
            beats.written = Some((written, sent, c.metadata.resource_version.clone()));
            if let Some(s) = c
                .status
                .and_then(|s| serde_json::from_value::<cluster::ClusterStatus>(s).ok())
            {
                *conds = s.conditions;
            }
            if let Some(nodes) = nodes {
                write_metrics(inner, t, nodes).await;
            }
            Ok(None)
        }
        Err(e) => failed_beat(inner, e),
    }
}

/// What a heartbeat whose request failed comes to.
fn failed_beat(inner: &Inner, e: TransportError) -> Result<Option<Stopped>, End> {
    if let Some(h) = &inner.cfg.health {
        h.heartbeat(false);
    }
    match e {
        TransportError::NotRegistered(_) => Ok(Some(Stopped::Unregistered)),
        // An overloaded server: this beat is skipped, the session kept (ending it would add
        // a reconnection to the load); the next beat comes at the usual time.
        TransportError::Busy(why) => {
            tracing::debug!(cluster = %inner.cfg.cluster, %why, "the server is busy; skipping a heartbeat");
            Ok(None)
        }
        e => Err(e.into()),
    }
}

/// A heartbeat's round trip, for the stats and the latency reported to the server.
fn timed(inner: &Inner, took: Duration) {
    crate::stats::heartbeat(took);
    let mut rt = inner.round_trips.lock();
    rt.push_back((took.as_secs_f64() * 10_000.0).round() / 10.0);
    while rt.len() > ROUND_TRIPS {
        rt.pop_front();
    }
}

/// What became of a Lease renewal.
enum Renewal {
    Renewed,
    /// The status is to be written instead: there is no Lease (yet).
    WriteStatus,
    /// The server changed the Lease or asks for the status: the Cluster is read, and the
    /// status written over it.
    ReadFirst,
}

/// Renews the Lease, vouching that the status last written describes the member at
/// `measured`.
async fn renew(
    inner: &Inner,
    t: &Transport,
    beats: &mut Beats,
    measured: MicroTime,
) -> Result<Renewal, TransportError> {
    let Some(revision) = beats.written.as_ref().map(|(_, _, rv)| rv.clone()) else {
        return Ok(Renewal::WriteStatus);
    };
    let mut lease = match beats.lease.take() {
        Some(l) => l,
        None => match t.get_lease().await {
            Ok(l) => l,
            Err(TransportError::NotRegistered(_) | TransportError::Forbidden(_)) => {
                beats.no_lease = Some(Instant::now());
                return Ok(Renewal::WriteStatus);
            }
            Err(e) => return Err(e),
        },
    };
    beats.no_lease = None;
    let ann = &mut lease.metadata.annotations;
    // The server asks for the status (it changed the Cluster's conditions): written now,
    // the mark dropped with the next renewal.
    if ann.remove(cluster::LEASE_STATUS_WANTED).is_some() {
        beats.lease = Some(lease);
        return Ok(Renewal::ReadFirst);
    }
    ann.insert(cluster::LEASE_STATUS_REVISION.to_string(), revision);
    let spec = lease.spec.get_or_insert_with(|| json!({}));
    if let Some(m) = spec.as_object_mut() {
        m.insert("holderIdentity".into(), json!(inner.cfg.cluster));
        m.insert("renewTime".into(), json!(measured.to_string()));
    }
    let sent = Instant::now();
    let answer = t.renew_lease(&lease).await;
    timed(inner, sent.elapsed());
    match answer {
        Ok(l) => {
            beats.lease = Some(l);
            Ok(Renewal::Renewed)
        }
        // Changed by the server (a mark, or made again), or gone (the cluster is being
        // unregistered): read again next time; the Cluster read now says what happened.
        Err(TransportError::Conflict(_) | TransportError::NotRegistered(_)) => {
            Ok(Renewal::ReadFirst)
        }
        Err(e) => Err(e),
    }
}

/// Keeps the cluster proxy's tunnel open for as long as the session lasts: the server sends
/// requests for the member's API on it (HTTP/2, the agent answering), and the backend answers
/// them. A tunnel that fails is opened again with backoff; it never ends the session.
async fn tunnel_loop(inner: &Arc<Inner>, t: &Transport) -> End {
    if !inner.cfg.tunnel {
        return std::future::pending().await;
    }
    let mut wait = Duration::from_secs(1);
    loop {
        match t.open_tunnel().await {
            Ok(io) => {
                wait = Duration::from_secs(1);
                let backend = inner.backend.clone();
                let service = hyper::service::service_fn(
                    move |mut req: http::Request<hyper::body::Incoming>| {
                        let backend = backend.clone();
                        async move {
                            use http_body_util::BodyExt;
                            // A WebSocket upgrade, as HTTP/2 carries it (extended CONNECT).
                            if req.method() == http::Method::CONNECT
                                && req.extensions().get::<hyper::ext::Protocol>().is_some()
                            {
                                let upgrade = hyper::upgrade::on(&mut req);
                                let (parts, _) = req.into_parts();
                                return Ok(backend.proxy_upgrade(parts, upgrade).await);
                            }
                            let (parts, body) = req.into_parts();
                            let body = match body.collect().await {
                                Ok(b) => b.to_bytes(),
                                Err(e) => {
                                    return Ok::<_, std::convert::Infallible>(
                                        crate::backend::proxy_error(
                                            http::StatusCode::BAD_REQUEST,
                                            &e.to_string(),
                                        ),
                                    );
                                }
                            };
                            Ok(backend.proxy(http::Request::from_parts(parts, body)).await)
                        }
                    },
                );
                tracing::debug!(cluster = %inner.cfg.cluster, "cluster proxy tunnel open");
                let served =
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .enable_connect_protocol()
                        .serve_connection(io, service)
                        .await;
                if let Err(e) = served {
                    tracing::debug!(cluster = %inner.cfg.cluster, error = %e, "the cluster proxy tunnel ended");
                }
            }
            // A server without the proxy: asked again now and then (it may be upgraded).
            Err(TransportError::NotRegistered(_)) => wait = Duration::from_secs(60),
            Err(e) => {
                tracing::debug!(cluster = %inner.cfg.cluster, error = %e, "opening the cluster proxy tunnel failed");
            }
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_secs(30));
    }
}

/// How long nodes unchanged go without being written again (repairs a ClusterMetrics made
/// afresh, or edited, on the server).
const METRICS_REFRESH: Duration = Duration::from_secs(300);

/// How many heartbeat intervals a member whose ClusterMetrics the server has not made yet
/// waits before writing again (every third beat). Each refused write costs the server a
/// linearizable read (a 404 is never answered from a copy): at 10,000 members registering
/// together, tens of thousands of them took over a second each while the objects were made.
const METRICS_MISSING_BEATS: f64 = 2.5;

/// Writes the member's nodes into its ClusterMetrics when they changed since last written.
/// Failures wait for the next heartbeat (a missing object, for a few): the object may not be
/// made yet, or the server may be older than this agent; the session goes on either way.
async fn write_metrics(inner: &Inner, t: &Transport, nodes: Vec<orrery_api::quota::NodeInfo>) {
    {
        let sent = inner.metrics_sent.lock();
        if let Some((last, at)) = &*sent
            && *last == nodes
            && at.elapsed() < METRICS_REFRESH
        {
            return;
        }
    }
    let missing = || inner.metrics_missing.lock();
    let wait = inner.cfg.heartbeat_interval.mul_f64(METRICS_MISSING_BEATS);
    if missing().is_some_and(|at| at.elapsed() < wait) {
        return;
    }
    let status = json!({ "nodes": nodes });
    match t.write_metrics(status).await {
        Ok(()) => {
            *inner.metrics_sent.lock() = Some((nodes, Instant::now()));
        }
        Err(TransportError::NotRegistered(why)) => {
            tracing::debug!(cluster = %inner.cfg.cluster, %why, "the server has not made the member's ClusterMetrics yet; writing again in {wait:?}");
            *missing() = Some(Instant::now());
        }
        Err(e) => {
            tracing::debug!(cluster = %inner.cfg.cluster, error = %e, "writing the member's ClusterMetrics failed; trying again with the next heartbeat");
        }
    }
}

async fn heartbeat_loop(
    inner: &Inner,
    t: &Transport,
    mut conds: Vec<Condition>,
    mut beats: Beats,
) -> End {
    let mut unanswered_in_a_row = 0;
    loop {
        // ±10% so that agents started together spread out.
        let base = inner.cfg.heartbeat_interval;
        let d = base.mul_f64(0.9 + crate::backoff::random_fraction() * 0.2);
        tokio::time::sleep(d).await;
        match beat_in_time(inner, t, &mut conds, &mut beats).await {
            Some(Ok(None)) => unanswered_in_a_row = 0,
            Some(Ok(Some(s))) => return End::Stopped(s),
            Some(Err(e)) => return e,
            None => {
                if let Some(end) = unanswered(inner, &mut unanswered_in_a_row) {
                    return end;
                }
            }
        }
    }
}

async fn works_loop(inner: &Inner, t: &Transport) -> End {
    loop {
        let (items, mut rv) = match t.list_works().await {
            Ok(x) => x,
            Err(e) => return e.into(),
        };
        {
            let _member = inner.member.lock().await;
            inner.sync_all(items).await;
        }
        inner.flush_state().await;
        loop {
            let stream = match t.watch_works(&rv).await {
                Ok(s) => s,
                Err(TransportError::Expired(_)) => break,
                Err(e) => return e.into(),
            };
            tokio::pin!(stream);
            let mut expired = false;
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(WorkEvent::Applied(w)) => {
                        rv = w.metadata.resource_version.clone();
                        let _member = inner.member.lock().await;
                        inner.apply_work(&w).await;
                        inner.observe_server_status(&w);
                    }
                    Ok(WorkEvent::Deleted(w)) => {
                        rv = w.metadata.resource_version.clone();
                        let _member = inner.member.lock().await;
                        inner
                            .remove_work(w.name(), &w.metadata.resource_version, "Work deleted")
                            .await;
                        inner.report_now.notify_one();
                    }
                    Ok(WorkEvent::Bookmark(r)) => rv = r,
                    Err(TransportError::Expired(_)) => {
                        expired = true;
                        break;
                    }
                    Err(e) => return e.into(),
                }
            }
            if expired {
                break;
            }
            // The server ended the watch (its timeout): watch again from where it stopped.
        }
    }
}

async fn report_loop(inner: &Inner, t: &Transport) -> End {
    let mut changed = inner.backend.changed();
    let mut last = Instant::now() - inner.cfg.report_interval;
    let mut last_milestone = inner.backend.milestone();
    let mut last_full = Instant::now();
    let mut last_flush = Instant::now();
    let mut flush_cost = Duration::ZERO;
    loop {
        tokio::select! {
            _ = changed.changed() => {}
            _ = inner.report_now.notified() => {}
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        // Rate limit: at most one report per interval, whatever the churn; a transfer's
        // milestone, or any change of a workload just released from a hold, goes at once
        // (a migration waits for them with its workload stopped), even one that comes while
        // this waits.
        let since = last.elapsed();
        if since < inner.cfg.report_interval && !inner.urgent(last_milestone) {
            let until = tokio::time::sleep(inner.cfg.report_interval - since);
            tokio::pin!(until);
            loop {
                tokio::select! {
                    _ = &mut until => break,
                    _ = changed.changed() => {
                        if inner.urgent(last_milestone) {
                            break;
                        }
                    }
                }
            }
        }
        last_milestone = inner.backend.milestone();
        last = Instant::now();
        // Not while a Work is being applied (its statuses are reported meanwhile); the next
        // report retries.
        if let Ok(_member) = inner.member.try_lock() {
            inner.retry_failed().await;
            inner.release_held().await;
        }
        // The state file holds every applied Work: with thousands of them, rewriting it on
        // every report would cost more than the reports. Saving is paced to take at most a
        // tenth of the time (a small state is saved on every report, as before).
        if last_flush.elapsed() >= flush_cost * 10 {
            let started = Instant::now();
            inner.flush_state().await;
            flush_cost = started.elapsed();
            last_flush = Instant::now();
        }
        // Now and then every object is read again, stamps or not; still only what differs
        // from the server's copy is sent.
        let everything = last_full.elapsed() >= inner.cfg.resync_interval;
        if everything {
            last_full = Instant::now();
        }
        let items = inner.changed_statuses(everything).await;
        for chunk in items.chunks(crate::MAX_BATCH) {
            let payload: Vec<Value> = chunk.iter().map(|(_, _, _, item)| item.clone()).collect();
            let sent = Instant::now();
            let answer = t.report(payload).await;
            crate::stats::report(sent.elapsed(), chunk.len());
            match answer {
                Ok(results) => {
                    // A Work deleted since it was read (its deletion is on its way to this
                    // agent) is no news; any other refusal is.
                    let gone = |why: &String| why.starts_with("NOT_FOUND");
                    let failed = results
                        .iter()
                        .filter(|r| r.as_ref().is_some_and(|w| !gone(w)))
                        .count();
                    let refusal = |news: bool| {
                        results.iter().enumerate().find_map(|(i, r)| {
                            r.as_ref().filter(|w| gone(w) != news).map(|w| (i, w))
                        })
                    };
                    if let Some((i, why)) = refusal(true).or_else(|| refusal(false)) {
                        let first = format!("{}: {why}", chunk[i].0);
                        if failed > 0 {
                            tracing::warn!(cluster = %inner.cfg.cluster, failed, %first, "some status reports were refused");
                        } else {
                            tracing::debug!(cluster = %inner.cfg.cluster, %first, "status reports of Works deleted meanwhile were refused");
                        }
                    }
                    let mut reported = inner.reported.lock();
                    let mut refused = inner.refused.lock();
                    let mut urgent = inner.urgent.lock();
                    for ((name, h, conds, _), result) in chunk.iter().zip(&results) {
                        // A released workload reported available needs no haste any more.
                        if result.is_none()
                            && conditions::find(conds, work::CONDITION_AVAILABLE)
                                .is_some_and(Condition::is_true)
                        {
                            urgent.remove(name);
                        }
                        if let Some(why) = result {
                            // Not what the server has: sent again after a while (soon, where
                            // the refusal was the moment's).
                            reported.remove(name);
                            let last = refused.get(name).map(|(_, d)| *d);
                            refused.insert(name.clone(), (Instant::now(), refusal_hold(why, last)));
                        } else {
                            reported.insert(name.clone(), (*h, conds.clone()));
                            refused.remove(name);
                        }
                    }
                }
                Err(e) => return e.into(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_refusal_of_the_moment_is_retried_soon_one_on_its_merits_later() {
        use super::{REFUSED_HOLD, RETRY_HOLD, RETRY_HOLD_MAX, refusal_hold};
        let conflict = "CONFLICT: Operation cannot be fulfilled on works";
        assert_eq!(refusal_hold(conflict, None), RETRY_HOLD);
        assert_eq!(refusal_hold(conflict, Some(RETRY_HOLD)), RETRY_HOLD * 2);
        assert_eq!(refusal_hold(conflict, Some(RETRY_HOLD_MAX)), RETRY_HOLD_MAX);
        assert_eq!(refusal_hold("TOO_MANY_REQUESTS: later", None), RETRY_HOLD);
        assert_eq!(
            refusal_hold("VALIDATION_FAILED: bad status", None),
            REFUSED_HOLD
        );
        // After a long hold, a conflict starts short again.
        assert_eq!(refusal_hold(conflict, Some(REFUSED_HOLD)), RETRY_HOLD);
    }

    use super::*;
    use crate::backend::sim::{Faults, SimCluster, SimSpec};

    #[tokio::test(start_paused = true)]
    async fn a_fleet_member_gives_its_place_back_when_set_up_or_after_a_while() {
        let limit = Arc::new(tokio::sync::Semaphore::new(1));
        // Given back as soon as the session is set up.
        let done = hold_while_setting_up(limit.clone().acquire_owned().await.unwrap());
        tokio::task::yield_now().await;
        assert!(
            limit.clone().try_acquire_owned().is_err(),
            "held while setting up"
        );
        drop(done);
        let again = tokio::time::timeout(Duration::from_millis(1), limit.clone().acquire_owned());
        let permit = again.await.expect("given back once set up").unwrap();
        // A session that never gets set up (a server that never answers) holds it no longer
        // than SETTING_UP.
        let _stuck = hold_while_setting_up(permit);
        tokio::time::sleep(SETTING_UP - Duration::from_secs(1)).await;
        assert!(limit.clone().try_acquire_owned().is_err());
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(
            limit.try_acquire_owned().is_ok(),
            "given back after SETTING_UP"
        );
    }

    #[test]
    fn values_compare_equal_but_for_the_skipped_pointers() {
        let skip = ["/t", "/n/lat", "/u/nvidia.com~1gpu", "/a/1"];
        let base = json!({
            "t": 1, "n": {"lat": 1.0, "region": "r1"},
            "u": {"cpu": "1", "nvidia.com/gpu": "2"}, "a": [1, 2, 3],
        });
        let with = |at: &str, v: Option<Value>| {
            let mut x = base.clone();
            let (parent, key) = at.rsplit_once('/').unwrap();
            let key = key.replace("~1", "/");
            let target = x.pointer_mut(parent).unwrap();
            match (target, v) {
                (Value::Array(a), Some(v)) => a[key.parse::<usize>().unwrap()] = v,
                (Value::Object(m), Some(v)) => {
                    m.insert(key, v);
                }
                (Value::Object(m), None) => {
                    m.remove(&key);
                }
                _ => unreachable!(),
            }
            x
        };
        let cases = [
            ("itself", base.clone(), true),
            ("a skipped member changed", with("/t", Some(json!(2))), true),
            ("a skipped member gone", with("/t", None), true),
            (
                "a nested skipped member changed",
                with("/n/lat", Some(json!(9))),
                true,
            ),
            (
                "a skipped member whose key has a slash",
                with("/u/nvidia.com~1gpu", Some(json!("7"))),
                true,
            ),
            (
                "a skipped array element",
                with("/a/1", Some(json!(5))),
                true,
            ),
            ("its sibling", with("/n/region", Some(json!("r2"))), false),
            ("a sibling gone", with("/n/region", None), false),
            ("a member added", with("/n/zone", Some(json!("z"))), false),
            (
                "a key like the skipped one",
                with("/u/nvidia.com", Some(json!("2"))),
                false,
            ),
            ("another array element", with("/a/0", Some(json!(5))), false),
            (
                "a member not skipped",
                with("/u/cpu", Some(json!("2"))),
                false,
            ),
        ];
        for (what, other, same) in cases {
            let mut at = String::new();
            assert_eq!(equal_except(&base, &other, &mut at, &skip), same, "{what}");
            assert_eq!(
                equal_except(&other, &base, &mut at, &skip),
                same,
                "{what}, reversed"
            );
            assert!(at.is_empty(), "{what}: the pointer is given back as it was");
        }
    }

    #[test]
    fn a_status_is_written_again_only_when_it_says_something_new() {
        let status = |usage_cpu: &str, allocated_cpu: &str, ready: &str, latency: f64, at: &str| {
            json!({
                "conditions": [{"type": "Ready", "status": ready}],
                "lastHeartbeatTime": at,
                "network": {"serverLatencyMs": latency, "region": "r1"},
                "resourceSummary": {
                    "allocatable": {"cpu": "100", "memory": "64Gi"},
                    "allocated": {"cpu": allocated_cpu},
                    "usage": {"cpu": usage_cpu, "memory": "10Gi"},
                },
            })
        };
        let written = status("30", "20", "True", 1.5, "2026-01-01T00:00:00Z");
        let cases = [
            (
                "the time and latency of the beat",
                status("30", "20", "True", 2.4, "2026-01-01T00:00:10Z"),
                true,
            ),
            (
                "a round trip much longer",
                status("30", "20", "True", 9.0, "x"),
                false,
            ),
            (
                "usage drifting under a percent of allocatable",
                status("30900m", "20", "True", 1.5, "x"),
                true,
            ),
            (
                "usage drifting by more",
                status("31100m", "20", "True", 1.5, "x"),
                false,
            ),
            (
                "usage falling by more",
                status("28", "20", "True", 1.5, "x"),
                false,
            ),
            (
                "one more replica's requests",
                status("30", "20100m", "True", 1.5, "x"),
                false,
            ),
            ("readiness", status("30", "20", "False", 1.5, "x"), false),
        ];
        for (what, now, same) in cases {
            assert_eq!(same_status(&written, &now), same, "{what}");
        }
        // The first round trip measured is news.
        let mut unmeasured = written.clone();
        unmeasured["network"]
            .as_object_mut()
            .unwrap()
            .remove("serverLatencyMs");
        assert!(!same_status(&unmeasured, &written));
        assert!(same_latency(Some(40.0), Some(79.0)));
        assert!(!same_latency(Some(40.0), Some(81.0)));
        assert!(same_latency(Some(0.2), Some(5.1)));
        assert!(!same_latency(Some(0.2), Some(5.3)));
        // Traffic is measured against the uplink's bandwidth.
        let traffic = |egress: f64| {
            let mut v = written.clone();
            v["network"]["bandwidthBytesPerSecond"] = json!(1000);
            v["network"]["egressBytesPerSecond"] = json!(egress);
            v
        };
        assert!(same_status(&traffic(500.0), &traffic(509.5)));
        assert!(!same_status(&traffic(500.0), &traffic(511.0)));
        assert!(!same_status(&written, &traffic(500.0)), "traffic begins");
        // A resource with nothing to measure drift against is compared exactly.
        let mut odd = written.clone();
        odd["resourceSummary"]["usage"]["gpu"] = json!("1");
        let mut odd2 = odd.clone();
        odd2["resourceSummary"]["usage"]["gpu"] = json!("2");
        assert!(same_status(&odd, &odd.clone()));
        assert!(!same_status(&odd, &odd2));
        assert!(!same_status(&written, &odd));
    }

    fn cause() -> Cause {
        Cause {
            work: "orrery-cluster-m1/default.web-deployment".into(),
            uid: "u1".into(),
            generation: 1,
            revision: "7".into(),
            reason: "Work deleted",
        }
    }

    /// A server that takes the connection and never answers does not hold the heartbeats:
    /// each beat is given up at its limit; the first is skipped, the second in a row ends
    /// the session (the next tries another replica, on new connections).
    #[tokio::test(start_paused = true)]
    async fn heartbeats_that_get_no_answer_end_the_session_in_time() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let held = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((c, _)) = listener.accept().await {
                open.push(c);
            }
        });
        let sim = Arc::new(SimCluster::new("m1", "r1", SimSpec::default()));
        let mut cfg = AgentConfig::new(&url, "m1");
        cfg.heartbeat_interval = Duration::from_millis(100);
        let inner = Inner::new(cfg, sim, AgentState::default());
        let client = orrery_client::connect(&url, "t", "").await.unwrap();
        let t = Transport::new(client, "m1");
        let started = tokio::time::Instant::now();
        let end = heartbeat_loop(&inner, &t, Vec::new(), Beats::default()).await;
        assert!(
            matches!(&end, End::Transient(why) if why.contains("two heartbeats in a row")),
            "{end:?}"
        );
        // Two beats of 10 s each, and the pauses before them.
        let took = started.elapsed();
        assert!(
            took >= Duration::from_secs(20) && took < Duration::from_secs(21),
            "{took:?}"
        );
        held.abort();
    }

    /// A Work the member could not take because it did not answer says so
    /// (`MemberUnavailable`), not that it was refused (`AppliedFailed`): a move must not take
    /// an outage at its target for a refusal.
    #[tokio::test]
    async fn an_apply_failed_for_an_outage_is_not_a_refusal() {
        let sim = Arc::new(SimCluster::new("m1", "r1", SimSpec::default()));
        let inner = Inner::new(
            AgentConfig::new("https://127.0.0.1:1", "m1"),
            sim.clone(),
            AgentState::default(),
        );
        let work = |name: &str| {
            Object::from_value(json!({
                "apiVersion": "multicluster.io/v1alpha1", "kind": "Work",
                "metadata": {"name": name, "namespace": "orrery-cluster-m1", "uid": name, "generation": 1},
                "spec": {"workload": {"manifests": [
                    {"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": name, "namespace": "default"}, "data": {"v": "1"}}]}}
            }))
            .expect("a Work")
        };
        let reason = |st: &WorkStatus| {
            orrery_api::conditions::find(&st.conditions, work::CONDITION_APPLIED)
                .map(|c| (c.status.clone(), c.reason.clone()))
        };
        // Applied, then the member stops answering: its status cannot be read.
        inner.apply_work(&work("before")).await;
        let ids = |n: &str| identifiers(&inner.lock_state().works[n].manifests);
        let st = inner
            .work_status("before", 1, ids("before"), Time::now())
            .await;
        assert_eq!(
            reason(&st),
            Some(("True".into(), "AppliedSuccessful".into()))
        );
        sim.set_faults(Faults {
            outage: true,
            ..Faults::default()
        });
        let st = inner
            .work_status("before", 1, ids("before"), Time::now())
            .await;
        assert_eq!(
            reason(&st),
            Some(("False".into(), work::REASON_MEMBER_UNAVAILABLE.into()))
        );
        // Applied while it does not answer.
        inner.apply_work(&work("away")).await;
        let st = inner.work_status("away", 1, ids("away"), Time::now()).await;
        assert_eq!(
            reason(&st),
            Some(("False".into(), work::REASON_MEMBER_UNAVAILABLE.into()))
        );
        // A refusal is still a refusal.
        sim.set_faults(Faults::default());
        let mut refused = work("refused");
        // A manifest without a kind is refused.
        refused.spec.as_mut().expect("a spec")["workload"]["manifests"][0]
            .as_object_mut()
            .expect("a manifest")
            .remove("kind");
        inner.apply_work(&refused).await;
        let st = inner
            .work_status("refused", 1, ids("refused"), Time::now())
            .await;
        assert_eq!(reason(&st), Some(("False".into(), "AppliedFailed".into())));
    }

    /// A retried deletion cut short (the session ends while the member answers slowly, and
    /// the future is dropped) stays owed, and is carried out by the next retry.
    #[tokio::test]
    async fn a_retried_delete_cut_short_stays_owed() {
        let sim = Arc::new(SimCluster::new("m1", "r1", SimSpec::default()));
        let m = stamped(
            &json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "web", "namespace": "default"}, "data": {"v": "1"}}),
            "orrery-cluster-m1/default.web-deployment",
        );
        let id = ResourceIdentifier::of(0, &m).expect("a manifest with a kind and a name");
        sim.apply(&m, false, &cause()).await.expect("applied");
        let mut state = AgentState::default();
        let owed = owe_dropped(&mut state, std::slice::from_ref(&m), &[], &cause());
        assert_eq!(owed.len(), 1);
        let inner = Inner::new(
            AgentConfig::new("https://127.0.0.1:1", "m1"),
            sim.clone(),
            state,
        );
        sim.set_faults(Faults {
            latency: Duration::from_millis(500),
            ..Faults::default()
        });
        let cut = tokio::time::timeout(Duration::from_millis(50), inner.retry_deletes()).await;
        assert!(cut.is_err(), "the slow member outlasts the session");
        assert_eq!(inner.lock_state().pending_deletes.len(), 1, "still owed");
        assert!(matches!(sim.state(&id).await, Ok(Some(_))));
        sim.set_faults(Faults::default());
        inner.retry_deletes().await;
        assert!(inner.lock_state().pending_deletes.is_empty());
        assert!(matches!(sim.state(&id).await, Ok(None)), "deleted");
    }
}
