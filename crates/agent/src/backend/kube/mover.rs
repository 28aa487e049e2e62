//! The `kube` backend's data mover: moves a workload's volumes between real member clusters
//! with CSI `VolumeSnapshot`s and restic.
//!
//! Per volume and round, at the source: a `VolumeSnapshot` of the claim, a claim restored
//! from it, and a Job backing that claim up to a restic repository every member shares (the
//! Secret `orrery-system/orrery-data-mover` in each member names it). At the target: the claim
//! (created if missing) and a Job restoring the snapshot of the wanted data version into it.
//!
//! Kubernetes cannot tell when a volume's data is written, so here a data version counts
//! snapshots: each one taken gives the claim a new version (annotation
//! `orrery.io/data-version`), and a restore gives the target's claim the version it restored.
//! Every object a round needs is named after (transfer, volume, round) and each result is
//! written on the claim, so a restarted agent picks up where the last one stopped and never
//! repeats a finished round.

use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use orrery_api::Quantity;
use orrery_api::stateful::{
    Transfer, TransferRole, TransferStatus, TransferVolume, TransferVolumeStatus, VolumeStatus,
    claims_of,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::Key;

/// Where each member keeps its mover's configuration.
pub const CONFIG_NAMESPACE: &str = "orrery-system";
/// The Secret holding the mover's environment: `RESTIC_REPOSITORY`, `RESTIC_PASSWORD` and
/// the repository's credentials (`AWS_ACCESS_KEY_ID`...).
pub const CONFIG_SECRET: &str = "orrery-data-mover";
/// Annotations of that Secret: the mover's image, and the VolumeSnapshotClass to use.
pub const IMAGE_ANNOTATION: &str = "orrery.io/mover-image";
pub const SNAPSHOT_CLASS_ANNOTATION: &str = "orrery.io/volume-snapshot-class";
pub const DEFAULT_IMAGE: &str = "docker.io/restic/restic:0.17.3";

/// Annotations of claims: the data version, and what the mover learnt of their contents.
pub const DATA_VERSION: &str = "orrery.io/data-version";
pub const USED_BYTES: &str = "orrery.io/used-bytes";
pub const WRITTEN_BYTES: &str = "orrery.io/written-bytes";
/// The version a claim had when the pod named by `STARTED_POD` started, recorded when a
/// snapshot changes the version under a running pod.
pub const STARTED_VERSION: &str = "orrery.io/started-version";
pub const STARTED_POD: &str = "orrery.io/started-pod";

/// Labels of the mover's own objects.
const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
const MANAGED_BY_VALUE: &str = "orrery-data-mover";
const TRANSFER_LABEL: &str = "orrery.io/mover-transfer";
const VOLUME_LABEL: &str = "orrery.io/mover-volume";
/// On a claim a Receive created: the transfer that made it (it goes with the transfer unless
/// a workload took it).
const RECEIVED_BY: &str = "orrery.io/received-by";
const FIELD_MANAGER: &str = "orrery-data-mover";

/// How often transfers under way are looked at.
const POLL: Duration = Duration::from_secs(1);

fn hash10(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    h.finalize()
        .iter()
        .take(5)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Names one transfer in object names and labels.
pub fn transfer_hash(id: &str) -> String {
    hash10(&[id])
}

/// Names one volume of one transfer; the restic host of its snapshots, so both ends agree.
pub fn volume_hash(id: &str, namespace: &str, volume: &str) -> String {
    hash10(&[id, namespace, volume])
}

/// The round's VolumeSnapshot, and the claim restored from it.
pub fn snapshot_name(vh: &str, round: u32) -> String {
    format!("om-{vh}-r{round}")
}

pub fn backup_job_name(vh: &str, round: u32) -> String {
    format!("om-{vh}-r{round}-up")
}

/// A restore is named after the version it brings in: a round asked again for other data is
/// another restore.
pub fn restore_job_name(vh: &str, version: u64) -> String {
    format!("om-{vh}-v{version}-down")
}

pub fn secret_name(th: &str) -> String {
    format!("om-{th}")
}

/// What a member's mover is configured with.
#[derive(Debug, Clone, PartialEq)]
pub struct MoverConfig {
    pub image: String,
    pub snapshot_class: Option<String>,
    /// The Secret's data, copied into each namespace a transfer works in.
    pub data: Value,
    /// The Secret's resourceVersion: a change is copied again.
    pub revision: String,
}

impl MoverConfig {
    pub fn of(secret: &Value) -> MoverConfig {
        let ann = |k: &str| {
            secret
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(k))
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        };
        MoverConfig {
            image: ann(IMAGE_ANNOTATION).unwrap_or_else(|| DEFAULT_IMAGE.to_string()),
            snapshot_class: ann(SNAPSHOT_CLASS_ANNOTATION),
            data: secret.get("data").cloned().unwrap_or_else(|| json!({})),
            revision: secret
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
        }
    }
}

fn labels(th: &str, vh: Option<&str>) -> Value {
    let mut l = json!({MANAGED_BY: MANAGED_BY_VALUE, TRANSFER_LABEL: th});
    if let Some(vh) = vh {
        l[VOLUME_LABEL] = json!(vh);
    }
    l
}

/// The source's snapshot of `claim` for a round, carrying the data version it gives.
pub fn snapshot_manifest(
    cfg: &MoverConfig,
    th: &str,
    vh: &str,
    namespace: &str,
    claim: &str,
    round: u32,
    version: u64,
) -> Value {
    let mut spec = json!({"source": {"persistentVolumeClaimName": claim}});
    if let Some(c) = &cfg.snapshot_class {
        spec["volumeSnapshotClassName"] = json!(c);
    }
    json!({
        "apiVersion": "snapshot.storage.k8s.io/v1",
        "kind": "VolumeSnapshot",
        "metadata": {
            "name": snapshot_name(vh, round),
            "namespace": namespace,
            "labels": labels(th, Some(vh)),
            "annotations": {DATA_VERSION: version.to_string()},
        },
        "spec": spec,
    })
}

/// A claim restored from the round's snapshot, for the backup Job to read.
pub fn clone_manifest(
    th: &str,
    vh: &str,
    namespace: &str,
    round: u32,
    source_claim: &Value,
    restore_size: Option<&Value>,
) -> Value {
    let size = restore_size
        .cloned()
        .or_else(|| source_claim.pointer("/status/capacity/storage").cloned())
        .or_else(|| {
            source_claim
                .pointer("/spec/resources/requests/storage")
                .cloned()
        })
        .unwrap_or_else(|| json!("1Gi"));
    let mut spec = json!({
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": size}},
        "dataSource": {
            "apiGroup": "snapshot.storage.k8s.io",
            "kind": "VolumeSnapshot",
            "name": snapshot_name(vh, round),
        },
    });
    if let Some(c) = source_claim.pointer("/spec/storageClassName") {
        spec["storageClassName"] = c.clone();
    }
    json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": snapshot_name(vh, round),
            "namespace": namespace,
            "labels": labels(th, Some(vh)),
        },
        "spec": spec,
    })
}

/// The target's claim for a volume it receives and does not have.
pub fn target_claim_manifest(th: &str, namespace: &str, tv: &TransferVolume) -> Value {
    let size = tv.capacity.map(|q| q.to_string()).unwrap_or_else(|| {
        Quantity::from_int(tv.used_bytes.max(1), orrery_api::Format::BinarySI).to_string()
    });
    let mut spec = json!({
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": size}},
    });
    if !tv.storage_class.is_empty() {
        spec["storageClassName"] = json!(tv.storage_class);
    }
    json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": tv.name,
            "namespace": namespace,
            "labels": {RECEIVED_BY: th},
            // Nothing is in it yet.
            "annotations": {DATA_VERSION: "0"},
        },
        "spec": spec,
    })
}

/// The script of a backup: initialise the repository if it is new, back `/data` up under
/// the volume's host name and tags, and leave restic's summary as the termination message
/// (where the agent reads what the round copied).
const BACKUP_SCRIPT: &str = r#"set -eu
restic cat config >/dev/null 2>&1 || restic init >/dev/null 2>&1 || restic cat config >/dev/null
restic backup /data --json --host "$ORRERY_HOST" --tag "$ORRERY_TAGS" > /tmp/out
grep '"message_type":"summary"' /tmp/out | tail -n 1 > /dev/termination-log
"#;

/// The script of a restore: the snapshot of the wanted version, over what the claim holds
/// (only files that differ are written; files the snapshot lacks go).
const RESTORE_SCRIPT: &str = r#"set -eu
restic $ORRERY_LIMIT restore "latest:/data" --host "$ORRERY_HOST" --tag "$ORRERY_TAGS" --target /data --overwrite if-changed --delete --json > /tmp/out
grep '"message_type":"summary"' /tmp/out | tail -n 1 > /dev/termination-log
"#;

/// The tags that find one version of one volume in the repository.
pub fn version_tags(id: &str, version: u64) -> String {
    format!("orrery-transfer={id},orrery-version={version}")
}

#[allow(clippy::too_many_arguments)]
fn job_manifest(
    cfg: &MoverConfig,
    th: &str,
    vh: &str,
    namespace: &str,
    name: &str,
    claim: &str,
    read_only: bool,
    script: &str,
    env: Value,
) -> Value {
    json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels(th, Some(vh))},
        "spec": {
            "backoffLimit": 3,
            "template": {
                "metadata": {"labels": labels(th, Some(vh))},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{
                        "name": "restic",
                        "image": cfg.image,
                        "command": ["/bin/sh", "-c", script],
                        "env": env,
                        "envFrom": [{"secretRef": {"name": secret_name(th)}}],
                        "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": read_only}],
                    }],
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim, "readOnly": read_only}}],
                },
            },
        },
    })
}

/// The Job backing up a round's clone of a volume.
pub fn backup_job(cfg: &MoverConfig, t: &Transfer, th: &str, vh: &str, version: u64) -> Value {
    let round = t.round;
    job_manifest(
        cfg,
        th,
        vh,
        &t.namespace,
        &backup_job_name(vh, round),
        &snapshot_name(vh, round),
        true,
        BACKUP_SCRIPT,
        json!([
            {"name": "ORRERY_HOST", "value": vh},
            {"name": "ORRERY_TAGS", "value": version_tags(&t.id, version)},
        ]),
    )
}

/// The Job restoring a version of a volume into the target's claim, at the path's rate.
pub fn restore_job(
    cfg: &MoverConfig,
    t: &Transfer,
    th: &str,
    vh: &str,
    tv: &TransferVolume,
) -> Value {
    // restic takes KiB per second.
    let limit = if t.rate > 0 {
        format!("--limit-download {}", (t.rate / 1024).max(1))
    } else {
        String::new()
    };
    job_manifest(
        cfg,
        th,
        vh,
        &t.namespace,
        &restore_job_name(vh, tv.data_version),
        &tv.name,
        false,
        RESTORE_SCRIPT,
        json!([
            {"name": "ORRERY_HOST", "value": vh},
            {"name": "ORRERY_TAGS", "value": version_tags(&t.id, tv.data_version)},
            {"name": "ORRERY_LIMIT", "value": limit},
        ]),
    )
}

/// How a Job ended, if it did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobOutcome {
    Running,
    Succeeded,
    Failed(String),
}

pub fn job_outcome(job: &Value) -> JobOutcome {
    for c in job
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if c.get("status").and_then(Value::as_str) != Some("True") {
            continue;
        }
        match c.get("type").and_then(Value::as_str) {
            Some("Complete") | Some("SuccessCriteriaMet") => return JobOutcome::Succeeded,
            Some("Failed") | Some("FailureTarget") => {
                let s = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or("");
                return JobOutcome::Failed(
                    [s("reason"), s("message")]
                        .iter()
                        .filter(|x| !x.is_empty())
                        .copied()
                        .collect::<Vec<_>>()
                        .join(": "),
                );
            }
            _ => {}
        }
    }
    JobOutcome::Running
}

/// What restic said at the end of a backup or restore.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// Backup: new data the repository took; restore: bytes written.
    pub moved: i64,
    /// The volume's size.
    pub total: i64,
}

/// Reads restic's JSON summary line (backup: `data_added`, `total_bytes_processed`;
/// restore: `bytes_restored`, `total_bytes`).
pub fn summary(message: &str) -> Option<Summary> {
    let line = message.lines().rev().find(|l| !l.trim().is_empty())?;
    let v: Value = serde_json::from_str(line.trim()).ok()?;
    if v.get("message_type").and_then(Value::as_str) != Some("summary") {
        return None;
    }
    let n = |k: &str| v.get(k).and_then(Value::as_i64);
    Some(Summary {
        moved: n("data_added").or_else(|| n("bytes_restored")).unwrap_or(0),
        total: n("total_bytes_processed")
            .or_else(|| n("total_bytes"))
            .unwrap_or(0),
    })
}

fn annotation<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    obj.pointer("/metadata/annotations")
        .and_then(|a| a.get(key))
        .and_then(Value::as_str)
}

fn annotation_num<T: std::str::FromStr>(obj: &Value, key: &str) -> Option<T> {
    annotation(obj, key).and_then(|s| s.parse().ok())
}

/// A claim's data version: 1 for a claim the mover never touched (it holds whatever it was
/// given), 0 for one a Receive made and nothing filled yet.
pub fn claim_version(claim: &Value) -> u64 {
    annotation_num(claim, DATA_VERSION).unwrap_or(1)
}

/// A finished round of a Send, kept on the source's claim (`orrery.io/sent-<volume hash>`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sent {
    pub round: u32,
    pub version: u64,
    pub bytes: i64,
    pub used: i64,
    pub written: i64,
}

/// A finished restore, kept on the target's claim (`orrery.io/received-<volume hash>`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Received {
    pub round: u32,
    pub version: u64,
    pub bytes: i64,
}

fn sent_key(vh: &str) -> String {
    format!("orrery.io/sent-{vh}")
}

fn received_key(vh: &str) -> String {
    format!("orrery.io/received-{vh}")
}

fn record<T: serde::de::DeserializeOwned>(claim: &Value, key: &str) -> Option<T> {
    serde_json::from_str(annotation(claim, key)?).ok()
}

/// Whether a pod still holds its volumes (anything but Succeeded or Failed).
fn pod_live(pod: &Value) -> bool {
    !matches!(
        pod.pointer("/status/phase").and_then(Value::as_str),
        Some("Succeeded") | Some("Failed")
    )
}

fn pod_running(pod: &Value) -> bool {
    pod.pointer("/status/phase").and_then(Value::as_str) == Some("Running")
}

/// The claims a pod mounts.
fn pod_claims(pod: &Value) -> impl Iterator<Item = &str> {
    pod.pointer("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| {
            v.pointer("/persistentVolumeClaim/claimName")
                .and_then(Value::as_str)
        })
}

fn is_mover_pod(pod: &Value) -> bool {
    pod.pointer("/metadata/labels")
        .and_then(|l| l.get(MANAGED_BY))
        .and_then(Value::as_str)
        == Some(MANAGED_BY_VALUE)
}

/// The workload pod running on a claim, if one is.
fn running_user<'a>(pods: &'a [Value], claim: &str) -> Option<&'a Value> {
    pods.iter()
        .find(|p| !is_mover_pod(p) && pod_running(p) && pod_claims(p).any(|c| c == claim))
}

fn capacity_of(claim: &Value) -> Option<Quantity> {
    let q = claim
        .pointer("/status/capacity/storage")
        .or_else(|| claim.pointer("/spec/resources/requests/storage"))?;
    match q {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.to_string().parse().ok(),
        _ => None,
    }
}

/// A claim as a workload's status reports it; `pods` are the pods of its namespace.
pub fn volume_status(claim: &Value, ordinal: Option<i64>, pods: &[Value]) -> VolumeStatus {
    let version = claim_version(claim);
    let started_version = running_user(pods, claim_name(claim)).map(|pod| {
        let uid = pod.pointer("/metadata/uid").and_then(Value::as_str);
        // A snapshot moved the version under this pod: it started on the one recorded then.
        match (annotation(claim, STARTED_POD), uid) {
            (Some(p), Some(u)) if p == u => {
                annotation_num(claim, STARTED_VERSION).unwrap_or(version)
            }
            _ => version,
        }
    });
    VolumeStatus {
        name: claim_name(claim).to_string(),
        ordinal,
        capacity: capacity_of(claim),
        storage_class: claim
            .pointer("/spec/storageClassName")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        used_bytes: annotation_num(claim, USED_BYTES).unwrap_or(0),
        data_version: version,
        started_version,
        written_bytes: annotation_num(claim, WRITTEN_BYTES).unwrap_or(0),
    }
}

fn claim_name(claim: &Value) -> &str {
    claim
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// The claims a workload's pods own, among `claims` (its namespace's): a StatefulSet's per
/// ordinal, and the claims its pod template names.
pub fn workload_volumes(workload: &Value, claims: &[Value], pods: &[Value]) -> Vec<VolumeStatus> {
    let name = workload
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let mut out = Vec::new();
    for c in claims_of(workload) {
        if c.per_ordinal {
            let prefix = format!("{}-{name}-", c.name);
            let mut mine: Vec<(i64, &Value)> = claims
                .iter()
                .filter_map(|pvc| {
                    let o = claim_name(pvc).strip_prefix(&prefix)?.parse::<i64>().ok()?;
                    Some((o, pvc))
                })
                .collect();
            mine.sort_by_key(|(o, _)| *o);
            out.extend(
                mine.into_iter()
                    .map(|(o, pvc)| volume_status(pvc, Some(o), pods)),
            );
        } else if let Some(pvc) = claims.iter().find(|p| claim_name(p) == c.name) {
            out.push(volume_status(pvc, None, pods));
        }
    }
    out
}

/// How one volume of a transfer stands.
#[derive(Debug, Clone, PartialEq)]
enum Progress {
    Done(TransferVolumeStatus),
    Waiting(TransferVolumeStatus),
    Failed(String),
}

/// Why a transfer cannot go on (shown in its status), or a member that does not answer
/// (tried again).
#[derive(Debug, thiserror::Error)]
enum StepError {
    #[error("{0}")]
    Failed(String),
    #[error("the member did not answer: {0}")]
    Unavailable(String),
}

impl From<kube::Error> for StepError {
    fn from(e: kube::Error) -> Self {
        match e {
            kube::Error::Api(s)
                if (400..500).contains(&s.code) && s.code != 429 && s.code != 409 =>
            {
                StepError::Failed(s.message)
            }
            other => StepError::Unavailable(other.to_string()),
        }
    }
}

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        },
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// The mover of one member.
pub struct Mover {
    client: kube::Client,
    /// The member's applied objects, as the backend watches them.
    cache: Arc<Mutex<HashMap<Key, Value>>>,
    /// Transfer id → (Work, what it asks).
    wanted: Mutex<BTreeMap<String, (String, Transfer)>>,
    statuses: Mutex<BTreeMap<String, TransferStatus>>,
    /// Namespace secret copies made, by transfer hash: the config's revision then.
    secrets: Mutex<BTreeMap<String, String>>,
    /// Rounds whose leftovers were removed in this process.
    cleaned: Mutex<BTreeSet<String>>,
    stamp: AtomicU64,
    milestone: AtomicU64,
    /// Moves when the mover changes a claim's annotations (its workload's state changes).
    pub volumes_epoch: AtomicU64,
    kick: Arc<tokio::sync::Notify>,
    changed: Arc<tokio::sync::watch::Sender<u64>>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for Mover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mover").finish_non_exhaustive()
    }
}

impl Drop for Mover {
    fn drop(&mut self) {
        if let Some(t) = self.task.lock().take() {
            t.abort();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> parking_lot::MutexGuard<'_, T> {
    m.lock()
}

impl Mover {
    pub fn new(
        client: kube::Client,
        cache: Arc<Mutex<HashMap<Key, Value>>>,
        changed: Arc<tokio::sync::watch::Sender<u64>>,
    ) -> Self {
        Mover {
            client,
            cache,
            wanted: Mutex::new(BTreeMap::new()),
            statuses: Mutex::new(BTreeMap::new()),
            secrets: Mutex::new(BTreeMap::new()),
            cleaned: Mutex::new(BTreeSet::new()),
            stamp: AtomicU64::new(0),
            milestone: AtomicU64::new(0),
            volumes_epoch: AtomicU64::new(0),
            kick: Arc::new(tokio::sync::Notify::new()),
            changed,
            task: Mutex::new(None),
        }
    }

    pub fn stamp(&self) -> u64 {
        self.stamp.load(Ordering::Relaxed)
    }

    pub fn milestone(&self) -> u64 {
        self.milestone.load(Ordering::Relaxed)
    }

    fn api(&self, r: &ApiResource, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), namespace, r)
    }

    fn claims_api(&self, ns: &str) -> Api<DynamicObject> {
        self.api(
            &resource("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims"),
            ns,
        )
    }

    fn jobs_api(&self, ns: &str) -> Api<DynamicObject> {
        self.api(&resource("batch", "v1", "Job", "jobs"), ns)
    }

    fn pods_api(&self, ns: &str) -> Api<DynamicObject> {
        self.api(&resource("", "v1", "Pod", "pods"), ns)
    }

    fn secrets_api(&self, ns: &str) -> Api<DynamicObject> {
        self.api(&resource("", "v1", "Secret", "secrets"), ns)
    }

    fn snapshots_api(&self, ns: &str) -> Api<DynamicObject> {
        self.api(
            &resource(
                "snapshot.storage.k8s.io",
                "v1",
                "VolumeSnapshot",
                "volumesnapshots",
            ),
            ns,
        )
    }

    /// Replaces what a Work asks for; transfers it no longer asks for end (their objects go).
    pub async fn set(self: &Arc<Self>, work: &str, transfers: &[Transfer]) {
        let ended: Vec<Transfer> = {
            let mut wanted = lock(&self.wanted);
            let ids: BTreeSet<&str> = transfers.iter().map(|t| t.id.as_str()).collect();
            let ended: Vec<String> = wanted
                .iter()
                .filter(|(id, (w, _))| w == work && !ids.contains(id.as_str()))
                .map(|(id, _)| id.clone())
                .collect();
            let ended = ended
                .into_iter()
                .filter_map(|id| wanted.remove(&id).map(|(_, t)| t))
                .collect();
            for t in transfers {
                wanted.insert(t.id.clone(), (work.to_string(), t.clone()));
            }
            ended
        };
        for t in &ended {
            lock(&self.statuses).remove(&t.id);
            if let Err(e) = self.end(t).await {
                tracing::warn!(transfer = %t.id, error = %e, "removing an ended transfer's objects failed");
            }
        }
        if !transfers.is_empty() {
            self.ensure_running();
        }
        self.kick.notify_one();
    }

    fn ensure_running(self: &Arc<Self>) {
        let mut task = lock(&self.task);
        if task.is_some() {
            return;
        }
        let me = Arc::downgrade(self);
        *task = Some(tokio::spawn(async move {
            loop {
                let Some(m) = me.upgrade() else { return };
                m.reconcile().await;
                let wait = if lock(&m.wanted).is_empty() {
                    Duration::from_secs(3600)
                } else {
                    POLL
                };
                // Waits without holding the mover, so that a dropped backend lets it go.
                let kick = m.kick.clone();
                drop(m);
                let _ = tokio::time::timeout(wait, kick.notified()).await;
            }
        }));
    }

    /// Where the transfers a Work asked for stand, in its order.
    pub fn statuses(&self, transfers: &[Transfer]) -> Vec<TransferStatus> {
        let s = lock(&self.statuses);
        transfers
            .iter()
            .filter_map(|t| s.get(&t.id).cloned())
            .collect()
    }

    async fn reconcile(&self) {
        let wanted: Vec<Transfer> = lock(&self.wanted)
            .values()
            .map(|(_, t)| t.clone())
            .collect();
        // The configuration is read once a pass, for every transfer.
        let cfg = match self.config().await {
            Ok(c) => Ok(c),
            Err(StepError::Failed(m)) => Err(m),
            Err(StepError::Unavailable(e)) => {
                tracing::debug!(error = %e, "the member did not answer; trying again");
                return;
            }
        };
        let mut changed = false;
        for t in wanted {
            let result = match &cfg {
                Ok(c) => self.step(c, &t).await,
                Err(m) => Err(StepError::Failed(m.clone())),
            };
            let status = match result {
                Ok(s) => s,
                Err(StepError::Failed(m)) => TransferStatus {
                    id: t.id.clone(),
                    role: t.role,
                    round: t.round,
                    message: m,
                    ..Default::default()
                },
                Err(StepError::Unavailable(e)) => {
                    tracing::debug!(transfer = %t.id, error = %e, "the member did not answer; trying again");
                    continue;
                }
            };
            // The transfer may have ended meanwhile.
            if !lock(&self.wanted).contains_key(&t.id) {
                continue;
            }
            let mut statuses = lock(&self.statuses);
            let before = statuses.get(&t.id);
            if before == Some(&status) {
                continue;
            }
            let milestone = before.is_none_or(|b| {
                (status.complete && (!b.complete || b.round != status.round))
                    || b.fenced != status.fenced
                    || (!status.message.is_empty() && b.message != status.message)
            });
            if milestone {
                self.milestone.fetch_add(1, Ordering::Relaxed);
            }
            statuses.insert(t.id.clone(), status);
            changed = true;
        }
        if changed {
            self.stamp.fetch_add(1, Ordering::Relaxed);
            self.changed.send_modify(|v| *v = v.wrapping_add(1));
        }
    }

    async fn config(&self) -> Result<MoverConfig, StepError> {
        match self
            .secrets_api(CONFIG_NAMESPACE)
            .get_opt(CONFIG_SECRET)
            .await?
        {
            Some(s) => Ok(MoverConfig::of(
                &serde_json::to_value(&s).unwrap_or_default(),
            )),
            None => Err(StepError::Failed(format!(
                "this member has no data mover: create the Secret {CONFIG_NAMESPACE}/{CONFIG_SECRET} \
                 with the restic repository every member shares (RESTIC_REPOSITORY, \
                 RESTIC_PASSWORD and its credentials); see docs/stateful.md"
            ))),
        }
    }

    /// The mover's credentials in the transfer's namespace (Jobs read them from there).
    async fn ensure_secret(
        &self,
        cfg: &MoverConfig,
        t: &Transfer,
        th: &str,
    ) -> Result<(), StepError> {
        if lock(&self.secrets).get(th) == Some(&cfg.revision) {
            return Ok(());
        }
        let s = json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": secret_name(th), "namespace": t.namespace, "labels": labels(th, None)},
            "type": "Opaque",
            "data": cfg.data,
        });
        self.secrets_api(&t.namespace)
            .patch(
                &secret_name(th),
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&s),
            )
            .await?;
        lock(&self.secrets).insert(th.to_string(), cfg.revision.clone());
        Ok(())
    }

    async fn step(&self, cfg: &MoverConfig, t: &Transfer) -> Result<TransferStatus, StepError> {
        let th = transfer_hash(&t.id);
        self.ensure_secret(cfg, t, &th).await?;
        let pods = self.pods(&t.namespace).await?;
        let fenced = t.role == TransferRole::Send && t.after_fence && self.fenced(t, &pods);
        let mut status = TransferStatus {
            id: t.id.clone(),
            role: t.role,
            round: t.round,
            fenced,
            ..Default::default()
        };
        let mut complete = true;
        for tv in &t.volumes {
            let p = match t.role {
                TransferRole::Send => self.send_volume(cfg, t, &th, tv, fenced, &pods).await?,
                TransferRole::Receive => self.receive_volume(cfg, t, &th, tv, &pods).await?,
            };
            match p {
                Progress::Done(v) => status.volumes.push(v),
                Progress::Waiting(v) => {
                    complete = false;
                    status.volumes.push(v);
                }
                Progress::Failed(m) => return Err(StepError::Failed(format!("{}: {m}", tv.name))),
            }
        }
        status.complete = complete;
        Ok(status)
    }

    async fn pods(&self, ns: &str) -> Result<Vec<Value>, StepError> {
        let l = self.pods_api(ns).list(&ListParams::default()).await?;
        Ok(l.items
            .iter()
            .filter_map(|p| serde_json::to_value(p).ok())
            .collect())
    }

    /// The fence holds: the workload asks for no pods and none of its pods holds a volume.
    fn fenced(&self, t: &Transfer, pods: &[Value]) -> bool {
        if let Some((kind, name)) = t.workload.split_once('/') {
            let group = match kind {
                "StatefulSet" | "Deployment" | "ReplicaSet" => "apps",
                _ => "",
            };
            let key = (
                group.to_string(),
                kind.to_string(),
                t.namespace.clone(),
                name.to_string(),
            );
            if let Some(w) = lock(&self.cache).get(&key)
                && w.pointer("/spec/replicas")
                    .and_then(Value::as_i64)
                    .unwrap_or(1)
                    > 0
            {
                return false;
            }
        }
        !pods.iter().any(|p| {
            !is_mover_pod(p)
                && pod_live(p)
                && pod_claims(p).any(|c| t.volumes.iter().any(|v| v.name == c))
        })
    }

    async fn patch_claim(&self, ns: &str, name: &str, annotations: Value) -> Result<(), StepError> {
        let patch = json!({"metadata": {"annotations": annotations}});
        self.claims_api(ns)
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        self.volumes_epoch.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    async fn get(&self, api: &Api<DynamicObject>, name: &str) -> Result<Option<Value>, StepError> {
        Ok(api
            .get_opt(name)
            .await?
            .and_then(|o| serde_json::to_value(o).ok()))
    }

    async fn create(&self, api: &Api<DynamicObject>, obj: &Value) -> Result<(), StepError> {
        let o: DynamicObject = serde_json::from_value(obj.clone())
            .map_err(|e| StepError::Failed(format!("building the mover's object: {e}")))?;
        match api.create(&Default::default(), &o).await {
            Ok(_) => Ok(()),
            // Made by an earlier pass whose answer was lost.
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Err(StepError::Failed(format!(
                "the member does not serve {} {} (for snapshots: install the CSI snapshot controller and its CRDs)",
                obj.get("kind").and_then(Value::as_str).unwrap_or(""),
                obj.get("apiVersion").and_then(Value::as_str).unwrap_or(""),
            ))),
            Err(e) => Err(e.into()),
        }
    }

    async fn delete(&self, api: &Api<DynamicObject>, name: &str) -> Result<(), StepError> {
        match api.delete(name, &DeleteParams::background()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Removes a finished backup round's Job, clone and snapshot (once per process).
    async fn clean_send_round(&self, ns: &str, vh: &str, round: u32) -> Result<(), StepError> {
        let key = format!("{vh}/r{round}");
        if lock(&self.cleaned).contains(&key) {
            return Ok(());
        }
        self.delete(&self.jobs_api(ns), &backup_job_name(vh, round))
            .await?;
        self.delete(&self.claims_api(ns), &snapshot_name(vh, round))
            .await?;
        self.delete(&self.snapshots_api(ns), &snapshot_name(vh, round))
            .await?;
        lock(&self.cleaned).insert(key);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    async fn send_volume(
        &self,
        cfg: &MoverConfig,
        t: &Transfer,
        th: &str,
        tv: &TransferVolume,
        fenced: bool,
        pods: &[Value],
    ) -> Result<Progress, StepError> {
        let ns = &t.namespace;
        let vh = volume_hash(&t.id, ns, &tv.name);
        let waiting = |claim: &Value| {
            Progress::Waiting(TransferVolumeStatus {
                name: tv.name.clone(),
                used_bytes: annotation_num(claim, USED_BYTES).unwrap_or(0),
                ..Default::default()
            })
        };
        let Some(claim) = self.get(&self.claims_api(ns), &tv.name).await? else {
            return Ok(Progress::Failed(format!(
                "the claim {ns}/{} does not exist in this member",
                tv.name
            )));
        };
        if let Some(s) = record::<Sent>(&claim, &sent_key(&vh))
            && s.round >= t.round
        {
            self.clean_send_round(ns, &vh, s.round).await?;
            return Ok(Progress::Done(TransferVolumeStatus {
                name: tv.name.clone(),
                data_version: s.version,
                used_bytes: s.used,
                bytes: s.bytes,
                copied: 0,
                written_bytes: s.written,
            }));
        }
        if t.after_fence && !fenced {
            return Ok(waiting(&claim));
        }
        let name = snapshot_name(&vh, t.round);
        let snaps = self.snapshots_api(ns);
        let snapshot = match self.get(&snaps, &name).await? {
            Some(s) => s,
            None => {
                let version = claim_version(&claim) + 1;
                self.create(
                    &snaps,
                    &snapshot_manifest(cfg, th, &vh, ns, &tv.name, t.round, version),
                )
                .await?;
                return Ok(waiting(&claim));
            }
        };
        let version: u64 = annotation_num(&snapshot, DATA_VERSION).unwrap_or(1);
        // The snapshot gives the claim its version (again after a restart between the two).
        if claim_version(&claim) < version {
            let mut ann = json!({DATA_VERSION: version.to_string()});
            if let Some(pod) = running_user(pods, &tv.name)
                && let Some(uid) = pod.pointer("/metadata/uid").and_then(Value::as_str)
                && annotation(&claim, STARTED_POD) != Some(uid)
            {
                ann[STARTED_POD] = json!(uid);
                ann[STARTED_VERSION] = json!(claim_version(&claim).to_string());
            }
            self.patch_claim(ns, &tv.name, ann).await?;
        }
        if let Some(e) = snapshot
            .pointer("/status/error/message")
            .and_then(Value::as_str)
        {
            return Ok(Progress::Failed(format!("the snapshot {name} failed: {e}")));
        }
        if snapshot
            .pointer("/status/readyToUse")
            .and_then(Value::as_bool)
            != Some(true)
        {
            return Ok(waiting(&claim));
        }
        let claims = self.claims_api(ns);
        if self.get(&claims, &name).await?.is_none() {
            self.create(
                &claims,
                &clone_manifest(
                    th,
                    &vh,
                    ns,
                    t.round,
                    &claim,
                    snapshot.pointer("/status/restoreSize"),
                ),
            )
            .await?;
        }
        let jobs = self.jobs_api(ns);
        let job_name = backup_job_name(&vh, t.round);
        let Some(job) = self.get(&jobs, &job_name).await? else {
            self.create(&jobs, &backup_job(cfg, t, th, &vh, version))
                .await?;
            return Ok(waiting(&claim));
        };
        match job_outcome(&job) {
            JobOutcome::Running => Ok(waiting(&claim)),
            JobOutcome::Failed(m) => Ok(Progress::Failed(format!(
                "the backup Job {job_name} failed: {m}"
            ))),
            JobOutcome::Succeeded => {
                let s = self.job_summary(ns, &job_name, pods).await?;
                let previous = record::<Sent>(&claim, &sent_key(&vh));
                let used = s.map_or(annotation_num(&claim, USED_BYTES).unwrap_or(0), |s| s.total);
                // The first round copies everything; later ones what the repository took.
                let bytes = match (previous, s) {
                    (None, _) => used,
                    (Some(_), Some(s)) => s.moved,
                    (Some(_), None) => used,
                };
                let written = annotation_num::<i64>(&claim, WRITTEN_BYTES).unwrap_or(0) + bytes;
                let sent = Sent {
                    round: t.round,
                    version,
                    bytes,
                    used,
                    written,
                };
                self.patch_claim(
                    ns,
                    &tv.name,
                    json!({
                        sent_key(&vh): serde_json::to_string(&sent).unwrap_or_default(),
                        USED_BYTES: used.to_string(),
                        WRITTEN_BYTES: written.to_string(),
                    }),
                )
                .await?;
                self.clean_send_round(ns, &vh, t.round).await?;
                Ok(Progress::Done(TransferVolumeStatus {
                    name: tv.name.clone(),
                    data_version: version,
                    used_bytes: used,
                    bytes,
                    copied: 0,
                    written_bytes: written,
                }))
            }
        }
    }

    /// restic's summary, from the termination message of the Job's succeeded pod.
    async fn job_summary(
        &self,
        ns: &str,
        job: &str,
        pods: &[Value],
    ) -> Result<Option<Summary>, StepError> {
        let of_job = |p: &&Value| {
            p.pointer("/metadata/labels")
                .and_then(|l| {
                    l.get("job-name")
                        .or_else(|| l.get("batch.kubernetes.io/job-name"))
                })
                .and_then(Value::as_str)
                == Some(job)
        };
        let mut found: Vec<Value> = pods.iter().filter(of_job).cloned().collect();
        if found.is_empty() {
            // The pod may be newer than the list this pass began with.
            found = self
                .pods(ns)
                .await?
                .into_iter()
                .filter(|p| of_job(&p))
                .collect();
        }
        Ok(found.iter().find_map(|p| {
            p.pointer("/status/containerStatuses")
                .and_then(Value::as_array)?
                .iter()
                .find_map(|c| {
                    c.pointer("/state/terminated/message")
                        .and_then(Value::as_str)
                })
                .and_then(summary)
        }))
    }

    async fn receive_volume(
        &self,
        cfg: &MoverConfig,
        t: &Transfer,
        th: &str,
        tv: &TransferVolume,
        pods: &[Value],
    ) -> Result<Progress, StepError> {
        let ns = &t.namespace;
        let vh = volume_hash(&t.id, ns, &tv.name);
        let claims = self.claims_api(ns);
        let claim = match self.get(&claims, &tv.name).await? {
            Some(c) => c,
            None => {
                let c = target_claim_manifest(th, ns, tv);
                self.create(&claims, &c).await?;
                c
            }
        };
        let have = claim_version(&claim);
        // A round applies on top of the version it was taken after; anything else is a
        // whole copy (restic still fetches only what the claim lacks).
        let bytes = if tv.base_version != 0 && have == tv.base_version {
            tv.bytes
        } else {
            tv.bytes.max(tv.used_bytes)
        };
        let jobs = self.jobs_api(ns);
        let job_name = restore_job_name(&vh, tv.data_version);
        if have == tv.data_version {
            let got = record::<Received>(&claim, &received_key(&vh))
                .filter(|r| r.version == tv.data_version)
                .map_or(0, |r| r.bytes);
            let key = format!("{vh}/v{}", tv.data_version);
            if !lock(&self.cleaned).contains(&key) {
                self.delete(&jobs, &job_name).await?;
                lock(&self.cleaned).insert(key);
            }
            return Ok(Progress::Done(TransferVolumeStatus {
                name: tv.name.clone(),
                data_version: have,
                used_bytes: annotation_num(&claim, USED_BYTES).unwrap_or(tv.used_bytes),
                bytes: got,
                copied: got,
                written_bytes: 0,
            }));
        }
        let waiting = Progress::Waiting(TransferVolumeStatus {
            name: tv.name.clone(),
            data_version: have,
            used_bytes: annotation_num(&claim, USED_BYTES).unwrap_or(0),
            bytes,
            copied: 0,
            written_bytes: 0,
        });
        if let Some(pod) = running_user(pods, &tv.name) {
            // Restoring under a running workload would corrupt what it serves.
            return Ok(Progress::Failed(format!(
                "the claim is in use by pod {}; the copy waits for it to stop",
                pod.pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
            )));
        }
        let Some(job) = self.get(&jobs, &job_name).await? else {
            self.create(&jobs, &restore_job(cfg, t, th, &vh, tv))
                .await?;
            return Ok(waiting);
        };
        match job_outcome(&job) {
            JobOutcome::Running => Ok(waiting),
            JobOutcome::Failed(m) => Ok(Progress::Failed(format!(
                "the restore Job {job_name} failed: {m}"
            ))),
            JobOutcome::Succeeded => {
                let got = Received {
                    round: t.round,
                    version: tv.data_version,
                    bytes,
                };
                self.patch_claim(
                    ns,
                    &tv.name,
                    json!({
                        DATA_VERSION: tv.data_version.to_string(),
                        USED_BYTES: tv.used_bytes.to_string(),
                        WRITTEN_BYTES: tv.used_bytes.to_string(),
                        received_key(&vh): serde_json::to_string(&got).unwrap_or_default(),
                    }),
                )
                .await?;
                self.delete(&jobs, &job_name).await?;
                Ok(Progress::Done(TransferVolumeStatus {
                    name: tv.name.clone(),
                    data_version: tv.data_version,
                    used_bytes: tv.used_bytes,
                    bytes,
                    copied: bytes,
                    written_bytes: 0,
                }))
            }
        }
    }

    /// Removes what an ended transfer made: its Jobs, snapshots, clones and Secret copy, and
    /// the claims a Receive created that no workload took.
    async fn end(&self, t: &Transfer) -> Result<(), StepError> {
        let ns = &t.namespace;
        let th = transfer_hash(&t.id);
        let mine = ListParams::default().labels(&format!("{TRANSFER_LABEL}={th}"));
        for api in [
            self.jobs_api(ns),
            self.claims_api(ns),
            self.snapshots_api(ns),
            self.secrets_api(ns),
        ] {
            let items = match api.list(&mine).await {
                Ok(l) => l.items,
                // A member without snapshots has none to remove.
                Err(kube::Error::Api(s)) if s.code == 404 => continue,
                Err(e) => return Err(e.into()),
            };
            for o in items {
                if let Some(n) = &o.metadata.name {
                    self.delete(&api, n).await?;
                }
            }
        }
        lock(&self.secrets).remove(&th);
        if t.role == TransferRole::Receive {
            let made = ListParams::default().labels(&format!("{RECEIVED_BY}={th}"));
            let claims = self.claims_api(ns);
            let pods = self.pods(ns).await?;
            let taken = self.claims_of_workloads(ns);
            for c in claims.list(&made).await?.items {
                let Some(n) = c.metadata.name.clone() else {
                    continue;
                };
                let used = pods
                    .iter()
                    .any(|p| !is_mover_pod(p) && pod_claims(p).any(|x| x == n));
                if !used && !taken.contains(&n) {
                    self.delete(&claims, &n).await?;
                }
            }
        }
        Ok(())
    }

    /// The claims the workloads Orrery applied in a namespace own.
    fn claims_of_workloads(&self, ns: &str) -> BTreeSet<String> {
        let cache = lock(&self.cache);
        let mut out = BTreeSet::new();
        for ((_, _, n, _), obj) in cache.iter() {
            if n != ns {
                continue;
            }
            let name = obj
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("");
            let replicas = obj
                .pointer("/spec/replicas")
                .and_then(Value::as_i64)
                .unwrap_or(1);
            for c in claims_of(obj) {
                if c.per_ordinal {
                    for o in 0..replicas.max(0) {
                        out.insert(orrery_api::stateful::ordinal_volume(&c.name, name, o));
                    }
                } else {
                    out.insert(c.name);
                }
            }
        }
        out
    }

    /// The volumes of an applied workload, for its state.
    pub async fn volumes_of(
        &self,
        workload: &Value,
        ns: &str,
    ) -> Result<Vec<VolumeStatus>, kube::Error> {
        let claims: Vec<Value> = self
            .claims_api(ns)
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter_map(|c| serde_json::to_value(c).ok())
            .collect();
        let pods: Vec<Value> = self
            .pods_api(ns)
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter_map(|p| serde_json::to_value(p).ok())
            .collect();
        Ok(workload_volumes(workload, &claims, &pods))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn transfer(role: TransferRole) -> Transfer {
        Transfer {
            id: "0f1e-uid".into(),
            role,
            namespace: "shop".into(),
            peer: "b".into(),
            round: 3,
            volumes: vec![TransferVolume {
                name: "data-db-0".into(),
                ordinal: Some(0),
                capacity: Some("10Gi".parse().unwrap()),
                storage_class: "fast".into(),
                bytes: 100,
                data_version: 7,
                used_bytes: 5000,
                base_version: 6,
            }],
            rate: 10 << 20,
            ..Default::default()
        }
    }

    fn cfg() -> MoverConfig {
        MoverConfig::of(&json!({
            "metadata": {"resourceVersion": "5", "annotations": {SNAPSHOT_CLASS_ANNOTATION: "csi-snap"}},
            "data": {"RESTIC_REPOSITORY": "czM6Ly9iL3I=", "RESTIC_PASSWORD": "cA=="},
        }))
    }

    #[test]
    fn names_are_short_stable_and_distinct() {
        let a = volume_hash("uid", "ns", "data-db-0");
        assert_eq!(a, volume_hash("uid", "ns", "data-db-0"));
        assert_eq!(a.len(), 10);
        for other in [
            volume_hash("uid", "ns", "data-db-1"),
            volume_hash("uid2", "ns", "data-db-0"),
            volume_hash("uid", "ns2", "data-db-0"),
            // The separator keeps ("ab","c") and ("a","bc") apart.
            volume_hash("uid", "nsd", "ata-db-0"),
        ] {
            assert_ne!(a, other);
        }
        // Job names carry a label of their own name: 63 characters at most.
        assert!(restore_job_name(&a, u64::MAX).len() <= 63);
        assert!(backup_job_name(&a, u32::MAX).len() <= 63);
    }

    #[test]
    fn config_reads_image_class_and_data() {
        let c = cfg();
        assert_eq!(c.image, DEFAULT_IMAGE);
        assert_eq!(c.snapshot_class.as_deref(), Some("csi-snap"));
        assert_eq!(c.revision, "5");
        let c = MoverConfig::of(&json!({"metadata": {"annotations": {IMAGE_ANNOTATION: "r:1"}}}));
        assert_eq!(c.image, "r:1");
        assert_eq!(c.snapshot_class, None);
    }

    #[test]
    fn backup_and_restore_jobs_agree_on_what_they_name() {
        let c = cfg();
        let send = transfer(TransferRole::Send);
        let recv = transfer(TransferRole::Receive);
        let th = transfer_hash(&send.id);
        let vh = volume_hash(&send.id, "shop", "data-db-0");
        let up = backup_job(&c, &send, &th, &vh, 7);
        let down = restore_job(&c, &recv, &th, &vh, &recv.volumes[0]);
        let env = |j: &Value, k: &str| {
            j.pointer("/spec/template/spec/containers/0/env")
                .unwrap()
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["name"] == k)
                .map(|e| e["value"].as_str().unwrap().to_string())
                .unwrap()
        };
        // The restore finds exactly the version the backup stored.
        assert_eq!(env(&up, "ORRERY_HOST"), env(&down, "ORRERY_HOST"));
        assert_eq!(env(&up, "ORRERY_TAGS"), env(&down, "ORRERY_TAGS"));
        assert_eq!(
            env(&up, "ORRERY_TAGS"),
            "orrery-transfer=0f1e-uid,orrery-version=7"
        );
        assert_eq!(env(&down, "ORRERY_LIMIT"), "--limit-download 10240");
        // The backup reads the round's clone, read-only; the restore writes the claim.
        assert_eq!(
            up.pointer("/spec/template/spec/volumes/0/persistentVolumeClaim"),
            Some(&json!({"claimName": snapshot_name(&vh, 3), "readOnly": true}))
        );
        assert_eq!(
            down.pointer("/spec/template/spec/volumes/0/persistentVolumeClaim"),
            Some(&json!({"claimName": "data-db-0", "readOnly": false}))
        );
        assert_eq!(
            up.pointer("/spec/template/spec/containers/0/envFrom/0/secretRef/name"),
            Some(&json!(secret_name(&th)))
        );
        assert_eq!(up["metadata"]["name"], backup_job_name(&vh, 3));
        assert_eq!(down["metadata"]["name"], restore_job_name(&vh, 7));
        let unlimited = Transfer {
            rate: 0,
            ..recv.clone()
        };
        assert_eq!(
            env(
                &restore_job(&c, &unlimited, &th, &vh, &recv.volumes[0]),
                "ORRERY_LIMIT"
            ),
            ""
        );
    }

    #[test]
    fn snapshots_and_clones_are_wired_together() {
        let c = cfg();
        let s = snapshot_manifest(&c, "th", "vh", "shop", "data-db-0", 2, 9);
        assert_eq!(
            s["spec"]["source"]["persistentVolumeClaimName"],
            "data-db-0"
        );
        assert_eq!(s["spec"]["volumeSnapshotClassName"], "csi-snap");
        assert_eq!(s["metadata"]["annotations"][DATA_VERSION], "9");
        let claim = json!({"spec": {"storageClassName": "fast", "resources": {"requests": {"storage": "5Gi"}}},
                           "status": {"capacity": {"storage": "8Gi"}}});
        let clone = clone_manifest("th", "vh", "shop", 2, &claim, None);
        assert_eq!(clone["spec"]["dataSource"]["name"], s["metadata"]["name"]);
        assert_eq!(clone["spec"]["resources"]["requests"]["storage"], "8Gi");
        assert_eq!(clone["spec"]["storageClassName"], "fast");
        let clone = clone_manifest("th", "vh", "shop", 2, &claim, Some(&json!("9Gi")));
        assert_eq!(clone["spec"]["resources"]["requests"]["storage"], "9Gi");
        let tv = &transfer(TransferRole::Receive).volumes[0];
        let target = target_claim_manifest("th", "shop", tv);
        assert_eq!(target["metadata"]["name"], "data-db-0");
        assert_eq!(target["metadata"]["annotations"][DATA_VERSION], "0");
        assert_eq!(target["spec"]["resources"]["requests"]["storage"], "10Gi");
        assert_eq!(target["spec"]["storageClassName"], "fast");
    }

    #[test]
    fn job_outcomes() {
        let cases = [
            (json!({}), JobOutcome::Running),
            (json!({"status": {"active": 1}}), JobOutcome::Running),
            (
                json!({"status": {"conditions": [{"type": "Complete", "status": "True"}]}}),
                JobOutcome::Succeeded,
            ),
            (
                json!({"status": {"conditions": [{"type": "Complete", "status": "False"}]}}),
                JobOutcome::Running,
            ),
            (
                json!({"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit"}]}}),
                JobOutcome::Failed(
                    "BackoffLimitExceeded: Job has reached the specified backoff limit".into(),
                ),
            ),
        ];
        for (job, want) in cases {
            assert_eq!(job_outcome(&job), want, "{job}");
        }
    }

    #[test]
    fn restic_summaries() {
        let backup = r#"{"message_type":"summary","files_new":2,"data_added":1234,"total_bytes_processed":99999}"#;
        assert_eq!(
            summary(backup),
            Some(Summary {
                moved: 1234,
                total: 99999
            })
        );
        let restore =
            "\n{\"message_type\":\"summary\",\"total_bytes\":500,\"bytes_restored\":20}\n\n";
        assert_eq!(
            summary(restore),
            Some(Summary {
                moved: 20,
                total: 500
            })
        );
        assert_eq!(summary(r#"{"message_type":"status"}"#), None);
        assert_eq!(summary("Fatal: wrong password"), None);
        assert_eq!(summary(""), None);
    }

    fn pod(name: &str, uid: &str, phase: &str, claims: &[&str]) -> Value {
        json!({
            "metadata": {"name": name, "uid": uid},
            "spec": {"volumes": claims.iter().map(|c| json!({"name": "v", "persistentVolumeClaim": {"claimName": c}})).collect::<Vec<_>>()},
            "status": {"phase": phase},
        })
    }

    #[test]
    fn a_statefulsets_volumes_with_their_versions() {
        let sts = json!({
            "apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "db"},
            "spec": {"replicas": 2, "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {"resources": {"requests": {"storage": "1Gi"}}}}],
                     "template": {"spec": {"containers": []}}},
        });
        let claims = vec![
            json!({"metadata": {"name": "data-db-1", "annotations": {DATA_VERSION: "4", USED_BYTES: "10"}}, "spec": {"storageClassName": "fast"}, "status": {"capacity": {"storage": "1Gi"}}}),
            json!({"metadata": {"name": "data-db-0", "annotations": {DATA_VERSION: "6", STARTED_POD: "u0", STARTED_VERSION: "5"}}}),
            json!({"metadata": {"name": "data-dbx-0"}}),
            json!({"metadata": {"name": "data-db-x"}}),
            json!({"metadata": {"name": "other"}}),
        ];
        let pods = vec![
            // Started before a snapshot moved its claim's version.
            pod("db-0", "u0", "Running", &["data-db-0"]),
            // Started after: on the version there is.
            pod("db-1", "u1", "Running", &["data-db-1"]),
            // The mover's own pod is no workload.
            {
                let mut p = pod("om", "u9", "Running", &["data-db-1"]);
                p["metadata"]["labels"] = json!({MANAGED_BY: MANAGED_BY_VALUE});
                p
            },
        ];
        let v = workload_volumes(&sts, &claims, &pods);
        assert_eq!(v.len(), 2);
        assert_eq!((v[0].name.as_str(), v[0].ordinal), ("data-db-0", Some(0)));
        assert_eq!((v[0].data_version, v[0].started_version), (6, Some(5)));
        assert_eq!((v[1].data_version, v[1].started_version), (4, Some(4)));
        assert_eq!(v[1].used_bytes, 10);
        assert_eq!(v[1].storage_class, "fast");
        assert_eq!(v[1].capacity, Some("1Gi".parse().unwrap()));
        // No pod runs on it: no started version; a claim never touched holds version 1.
        let pending = vec![pod("db-0", "u0", "Pending", &["data-db-0"])];
        let untouched = vec![json!({"metadata": {"name": "data-db-0"}})];
        let v = workload_volumes(&sts, &untouched, &pending);
        assert_eq!((v[0].data_version, v[0].started_version), (1, None));
    }
}
