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
    self, ConflictResolution, Health, ManifestStatus, ResourceIdentifier, Retention, WorkSpec,
    WorkStatus,
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

mod config;
mod heartbeat;
mod report;
mod session;
mod tunnel;
mod works;

use config::SERVICES_WORK_PREFIX;
pub use config::{AgentConfig, AgentError, Stopped};
use heartbeat::*;
use report::*;
pub use session::run;
use tunnel::*;
use works::*;

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
    /// Works whose Retain script failed at their last apply, and why (their `Retained`
    /// condition).
    retain_failed: Mutex<HashMap<String, String>>,
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

#[cfg(test)]
mod tests;
