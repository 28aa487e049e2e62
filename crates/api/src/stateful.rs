//! Stateful workloads: the persistent volumes their pods own, the data mover's transfers
//! between members, and `Migration` (multicluster.io/v1alpha1), the move of a stateful
//! workload together with its data.
//!
//! A move never re-creates a stateful workload empty elsewhere. Its volumes are copied in
//! rounds while it runs (each round a snapshot at the source and a copy of what changed since
//! the last one to the target), then the source's pods are stopped (the fence), the last
//! delta is copied, and the target starts the same ordinals on the copied volumes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::Quantity;
use crate::conditions::Condition;
use crate::time::{MicroTime, Time};
use crate::validation::{ErrorList, FieldError, is_dns1123_subdomain};

pub const MIGRATION_KIND: &str = "Migration";
pub const MIGRATION_PLURAL: &str = "migrations";

/// A persistent volume a workload's pods use, as its template declares it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeClaim {
    /// A StatefulSet's claim template (volumes `<name>-<workload>-<ordinal>`), or the name of
    /// a PersistentVolumeClaim the pods mount.
    pub name: String,
    /// One volume per ordinal (a StatefulSet's `volumeClaimTemplates`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub per_ordinal: bool,
    /// The storage requested, when the template says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<Quantity>,
    /// Empty: the member's default class.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub storage_class: String,
}

/// The volumes a workload template's pods own: a StatefulSet's claim templates, then the
/// PersistentVolumeClaims its pod template mounts. A workload with any is stateful.
pub fn claims_of(template: &Value) -> Vec<VolumeClaim> {
    let mut out = Vec::new();
    let kind = template.get("kind").and_then(Value::as_str).unwrap_or("");
    if kind == "StatefulSet" {
        for t in template
            .pointer("/spec/volumeClaimTemplates")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let Some(name) = t.pointer("/metadata/name").and_then(Value::as_str) else {
                continue;
            };
            out.push(VolumeClaim {
                name: name.to_string(),
                per_ordinal: true,
                capacity: storage_request(t.get("spec")),
                storage_class: t
                    .pointer("/spec/storageClassName")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
            });
        }
    }
    if let Some(pod) = crate::meta::pod_spec_pointer(kind).and_then(|p| template.pointer(p)) {
        for v in pod
            .get("volumes")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(claim) = v
                .pointer("/persistentVolumeClaim/claimName")
                .and_then(Value::as_str)
                .filter(|c| !c.is_empty())
                && !out.iter().any(|c| c.name == claim)
            {
                out.push(VolumeClaim {
                    name: claim.to_string(),
                    ..Default::default()
                });
            }
        }
    }
    out
}

/// `spec.resources.requests.storage` of a claim's spec.
pub fn storage_request(spec: Option<&Value>) -> Option<Quantity> {
    match spec?.pointer("/resources/requests/storage")? {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.to_string().parse().ok(),
        _ => None,
    }
}

/// The name Kubernetes gives ordinal `ordinal`'s volume of claim template `claim` of
/// StatefulSet `workload`.
pub fn ordinal_volume(claim: &str, workload: &str, ordinal: i64) -> String {
    format!("{claim}-{workload}-{ordinal}")
}

/// A volume as its member reports it, in the status of the workload that uses it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeStatus {
    /// The PersistentVolumeClaim's name.
    pub name: String,
    /// The StatefulSet ordinal it belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordinal: Option<i64>,
    /// Its size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<Quantity>,
    /// Its storage class.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub storage_class: String,
    /// Bytes of data it holds.
    #[serde(default)]
    pub used_bytes: i64,
    /// Changes whenever data is written.
    #[serde(default)]
    pub data_version: u64,
    /// The data version the volume had when the pod now using it started; absent while no
    /// pod runs on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_version: Option<u64>,
    /// Every byte ever written to it (overwrites included): what is lost between two of its
    /// readings is their difference.
    #[serde(default)]
    pub written_bytes: i64,
}

/// Which end of a transfer a member is.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
pub enum TransferRole {
    /// Takes snapshots of its volumes, one per round, for the peer to copy.
    #[default]
    Send,
    /// Copies each round's changes from the peer into volumes of the same names.
    Receive,
}

/// One volume of a transfer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TransferVolume {
    /// The PersistentVolumeClaim's name.
    pub name: String,
    /// The StatefulSet ordinal it belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordinal: Option<i64>,
    /// Its size, for a claim the receiver creates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<Quantity>,
    /// Its storage class at the receiver; empty: the member's default.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub storage_class: String,
    /// Receive: the bytes this round copies (what the source's snapshot says changed).
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub bytes: i64,
    /// Receive: the source's data version at this round's snapshot: the volume's once the
    /// round is in.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub data_version: u64,
    /// Receive: the volume's size at that snapshot.
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub used_bytes: i64,
    /// Receive: the data version the round applies on top of (0: a full copy). A target
    /// holding anything else copies the whole volume.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub base_version: u64,
}

fn is_zero_i64(n: &i64) -> bool {
    *n == 0
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

/// What the data mover asks of one member, carried in its Work (`spec.transfers`) and done
/// by its agent, never applied as an object.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Transfer {
    /// Names the transfer (the migration's uid, or `standby-<binding uid>`).
    pub id: String,
    /// Send or Receive.
    pub role: TransferRole,
    /// The namespace of the volumes.
    pub namespace: String,
    /// The cluster at the other end.
    pub peer: String,
    /// The round wanted: a Send takes snapshot `round`; a Receive copies it.
    pub round: u32,
    /// Send: take the snapshot only once the workload's pods have all stopped (the fence).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub after_fence: bool,
    /// Send: the workload whose pods must have stopped (`Kind/name`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub workload: String,
    /// The volumes transferred.
    pub volumes: Vec<TransferVolume>,
    /// Receive: bytes per second the path allows this transfer.
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub rate: i64,
    /// Receive: the Work's manifests are applied only once this round is in (the target
    /// starts on the copied data without waiting for the control plane).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hold_workload: bool,
}

/// One volume of a transfer, as the member reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TransferVolumeStatus {
    pub name: String,
    /// Send: the snapshot's version; Receive: the version the volume now holds.
    #[serde(default)]
    pub data_version: u64,
    #[serde(default)]
    pub used_bytes: i64,
    /// Send: bytes changed since the previous snapshot of this transfer (all of it for the
    /// first); Receive: bytes this round copies.
    #[serde(default)]
    pub bytes: i64,
    /// Receive: bytes of this round copied so far.
    #[serde(default)]
    pub copied: i64,
    /// Send: every byte written to the volume up to the snapshot.
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub written_bytes: i64,
}

/// Where a transfer stands in a member.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TransferStatus {
    pub id: String,
    pub role: TransferRole,
    /// The round these figures are of.
    pub round: u32,
    /// That round is done: the snapshot taken (Send) or the copy in (Receive).
    #[serde(default)]
    pub complete: bool,
    /// Send with `afterFence`: the workload's pods have all stopped.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fenced: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<TransferVolumeStatus>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// A standby copy's volume: what the standby holds, and the snapshot being copied.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StandbyVolume {
    /// The PersistentVolumeClaim's name.
    pub name: String,
    /// The StatefulSet ordinal it belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordinal: Option<i64>,
    /// Its size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<Quantity>,
    /// Its storage class at the standby.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub storage_class: String,
    /// The version the standby holds, and the source's written bytes at that snapshot.
    #[serde(default)]
    pub synced_version: u64,
    /// The source's bytes written at the snapshot the standby holds.
    #[serde(default)]
    pub synced_written: i64,
    /// The last snapshot taken at the source.
    #[serde(default)]
    pub snapshot_version: u64,
    /// The source's bytes written at the last snapshot.
    #[serde(default)]
    pub snapshot_written: i64,
    /// The volume's size at the last snapshot.
    #[serde(default)]
    pub snapshot_used: i64,
    /// Bytes the round in flight copies.
    #[serde(default)]
    pub round_bytes: i64,
    /// The version the round in flight applies on top of.
    #[serde(default)]
    pub round_base: u64,
}

/// Where a stateful workload's standby copy stands (`ResourceBinding.status.standby`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StandbyStatus {
    /// The cluster keeping the copy.
    pub cluster: String,
    /// The cluster the copy is taken from.
    pub source: String,
    /// Rounds copied; the last is what a failover starts from.
    #[serde(default)]
    pub rounds: u32,
    /// When the snapshot the standby holds was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synced_at: Option<MicroTime>,
    /// The round of the last snapshot taken at the source.
    #[serde(default)]
    pub snapshot_round: u32,
    /// When that snapshot was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_at: Option<MicroTime>,
    /// Bytes per second of the path, as the round in flight uses it.
    #[serde(default)]
    pub rate: i64,
    /// The copy, volume by volume.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<StandbyVolume>,
    /// How far behind the source the copy was at the last look, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag_seconds: Option<f64>,
    /// Why the copy does not progress, if it does not.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// The template a migration moves (in the Migration's namespace).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkloadRef {
    pub api_version: String,
    pub kind: String,
    pub name: String,
}

/// Why a migration happens.
pub mod reason {
    pub const USER: &str = "User";
    pub const POLICY_CHANGE: &str = "PolicyChange";
    pub const DRAIN: &str = "Drain";
    pub const SHED: &str = "Shed";
    pub const APPLICATION_FAILOVER: &str = "ApplicationFailover";
    pub const CLUSTER_FAILOVER: &str = "ClusterFailover";
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MigrationSpec {
    pub resource: WorkloadRef,
    /// Where to move it; empty: Orrery picks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub target_clusters: Vec<String>,
    /// The cluster to leave; empty: the one the workload runs in.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source_cluster: String,
    /// Why (set by Orrery when it starts a move itself; `User` otherwise).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

/// A migration's phases, in order; `Failed` may follow any phase before `Switching`.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub enum MigrationPhase {
    #[default]
    Pending,
    Replicating,
    Fencing,
    FinalSync,
    Starting,
    Switching,
    Cleaning,
    Succeeded,
    Failed,
}

impl MigrationPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            MigrationPhase::Pending => "Pending",
            MigrationPhase::Replicating => "Replicating",
            MigrationPhase::Fencing => "Fencing",
            MigrationPhase::FinalSync => "FinalSync",
            MigrationPhase::Starting => "Starting",
            MigrationPhase::Switching => "Switching",
            MigrationPhase::Cleaning => "Cleaning",
            MigrationPhase::Succeeded => "Succeeded",
            MigrationPhase::Failed => "Failed",
        }
    }

    /// Succeeded or Failed: nothing more happens.
    pub fn is_done(self) -> bool {
        matches!(self, MigrationPhase::Succeeded | MigrationPhase::Failed)
    }
}

/// One volume of a migration.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigrationVolume {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordinal: Option<i64>,
    /// The volume's size at the last snapshot.
    #[serde(default)]
    pub bytes: i64,
    /// Bytes copied over every round so far.
    #[serde(default)]
    pub copied: i64,
    /// Bytes of the round in flight, and how many of them are in.
    #[serde(default)]
    pub round_bytes: i64,
    #[serde(default)]
    pub round_copied: i64,
    /// The source's version at the last snapshot, and the version the target holds.
    #[serde(default)]
    pub source_version: u64,
    #[serde(default)]
    pub target_version: u64,
    /// The version the last snapshot's round applies on top of (0: a full copy).
    #[serde(default)]
    pub round_base: u64,
    /// The version at the fence, and the version the target's pod started on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fenced_version: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_version: Option<u64>,
}

/// When a phase began and ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PhaseTime {
    pub phase: MigrationPhase,
    pub started: MicroTime,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished: Option<MicroTime>,
    /// Milliseconds, once finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<i64>,
}

/// One candidate target, as the target choice rated it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Candidate {
    pub cluster: String,
    /// Estimated time to copy the data there, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_seconds: Option<f64>,
    /// Mean latency to the workloads it depends on and that depend on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub water_level: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
    /// Why it was not chosen (empty for the chosen one).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

/// What the move was expected to take.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Estimate {
    pub bytes: i64,
    /// Bytes per second of the path (the smaller uplink).
    pub bandwidth: i64,
    pub seconds: f64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub candidates: Vec<Candidate>,
}

/// Data written at the source after the last copy a failover started from (all of it when
/// it started empty).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DataLoss {
    pub bytes: i64,
    /// How much time of writes that is, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigrationStatus {
    #[serde(default)]
    pub phase: MigrationPhase,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub target: String,
    /// The replicas that move.
    #[serde(default)]
    pub replicas: i64,
    /// The ResourceBinding of the template (`name`, in the same namespace).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub binding: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<MigrationVolume>,
    /// Copy rounds finished (the final one included).
    #[serde(default)]
    pub rounds: u32,
    /// The round of the last snapshot taken at the source.
    #[serde(default)]
    pub snapshot_round: u32,
    /// Bytes per second of the path, as the current round uses it.
    #[serde(default)]
    pub rate: i64,
    /// From the fence until the target reported the workload ready, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downtime_seconds: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fenced_at: Option<MicroTime>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phases: Vec<PhaseTime>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate: Option<Estimate>,
    /// A failover's recovery point: what was written after the copy it started from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_loss: Option<DataLoss>,
    /// The target started with empty volumes (`onDataLoss: StartEmpty`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub started_empty: bool,
    /// The source was lost and the target started on its standby copy.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub standby_failover: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
}

impl MigrationStatus {
    /// A migration's status, read in place (empty if it has none or it does not parse).
    pub fn of(m: &crate::Object) -> MigrationStatus {
        m.status
            .as_ref()
            .and_then(|s| MigrationStatus::deserialize(s).ok())
            .unwrap_or_default()
    }
}

/// Reads and checks a Migration's spec; the errors are what a create or update is refused
/// with.
pub fn migration_spec(spec: Option<&Value>) -> Result<MigrationSpec, ErrorList> {
    let spec = spec.cloned().unwrap_or(Value::Null);
    let s: MigrationSpec = crate::meta::decode(&spec, "spec").map_err(|e| vec![e])?;
    let mut errs = ErrorList::new();
    if s.resource.api_version.is_empty() {
        errs.push(FieldError::required("spec.resource.apiVersion", ""));
    }
    if s.resource.kind.is_empty() {
        errs.push(FieldError::required("spec.resource.kind", ""));
    }
    if s.resource.name.is_empty() {
        errs.push(FieldError::required("spec.resource.name", ""));
    } else {
        for m in is_dns1123_subdomain(&s.resource.name) {
            errs.push(FieldError::invalid(
                "spec.resource.name",
                &s.resource.name,
                m,
            ));
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, c) in s.target_clusters.iter().enumerate() {
        let path = format!("spec.targetClusters[{i}]");
        for e in crate::cluster::validate_name(c) {
            errs.push(FieldError::invalid(&path, c, e.detail));
        }
        if !seen.insert(c) {
            errs.push(FieldError::duplicate(&path, c));
        }
        if *c == s.source_cluster {
            errs.push(FieldError::invalid(
                &path,
                c,
                "the target cannot be the source cluster",
            ));
        }
    }
    if !s.source_cluster.is_empty() {
        for e in crate::cluster::validate_name(&s.source_cluster) {
            errs.push(FieldError::invalid(
                "spec.sourceCluster",
                &s.source_cluster,
                e.detail,
            ));
        }
    }
    let known = [
        reason::USER,
        reason::POLICY_CHANGE,
        reason::DRAIN,
        reason::SHED,
        reason::APPLICATION_FAILOVER,
        reason::CLUSTER_FAILOVER,
    ];
    if !s.reason.is_empty() && !known.contains(&s.reason.as_str()) {
        errs.push(FieldError::not_supported("spec.reason", &s.reason, &known));
    }
    if errs.is_empty() { Ok(s) } else { Err(errs) }
}

/// What a placement says about a stateful workload (Orrery's `placement.stateful`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StatefulPlacement {
    /// Keep an asynchronously replicated copy elsewhere, to fail over to when the cluster
    /// running the workload is lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standby: Option<Standby>,
    /// When the cluster is lost without a standby copy: `Wait` (the default) for it to come
    /// back, or `StartEmpty` elsewhere, losing the data.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub on_data_loss: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Standby {
    /// How many clusters keep a copy (only 1 is supported).
    #[serde(default = "one")]
    pub clusters: i64,
    /// A copy is refreshed before it falls this far behind.
    #[serde(default = "default_lag")]
    pub max_lag_seconds: i64,
}

fn one() -> i64 {
    1
}

fn default_lag() -> i64 {
    30
}

pub const WAIT: &str = "Wait";
pub const START_EMPTY: &str = "StartEmpty";

impl StatefulPlacement {
    pub fn validate(&self, path: &str, errs: &mut ErrorList) {
        if let Some(s) = &self.standby {
            if s.clusters != 1 {
                errs.push(FieldError::invalid(
                    format!("{path}.standby.clusters"),
                    s.clusters,
                    "only one standby cluster is supported",
                ));
            }
            if s.max_lag_seconds < 1 {
                errs.push(FieldError::invalid(
                    format!("{path}.standby.maxLagSeconds"),
                    s.max_lag_seconds,
                    "must be at least 1",
                ));
            }
        }
        if !["", WAIT, START_EMPTY].contains(&self.on_data_loss.as_str()) {
            errs.push(FieldError::not_supported(
                format!("{path}.onDataLoss"),
                &self.on_data_loss,
                &[WAIT, START_EMPTY],
            ));
        }
    }

    pub fn starts_empty(&self) -> bool {
        self.on_data_loss == START_EMPTY
    }
}

/// A placement's `followUp`: run where another workload (its leader, same namespace) runs.
#[derive(
    Clone,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FollowUp {
    /// The leader's API version.
    pub api_version: String,
    /// The leader's kind.
    pub kind: String,
    /// The leader's name, in this template's namespace.
    pub name: String,
}

impl FollowUp {
    pub fn validate(&self, path: &str, errs: &mut ErrorList) {
        for (f, v) in [
            ("apiVersion", &self.api_version),
            ("kind", &self.kind),
            ("name", &self.name),
        ] {
            if v.is_empty() {
                errs.push(FieldError::required(format!("{path}.{f}"), ""));
            }
        }
    }
}

/// Karmada's `placement.workloadAffinity` (KEP-521): workloads whose templates carry the
/// same value of `groupByLabelKey` (in one namespace) form a group, kept together
/// (affinity) or apart (anti-affinity). The first of a group goes anywhere.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkloadAffinity {
    /// Keep the workloads of a group in the same clusters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<GroupTerm>,
    /// Keep the workloads of a group in different clusters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anti_affinity: Option<GroupTerm>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GroupTerm {
    /// Templates with the same value of this label form a group.
    pub group_by_label_key: String,
}

impl WorkloadAffinity {
    pub fn validate(&self, path: &str, errs: &mut ErrorList) {
        for (f, t) in [
            ("affinity", &self.affinity),
            ("antiAffinity", &self.anti_affinity),
        ] {
            if let Some(t) = t {
                let p = format!("{path}.{f}.groupByLabelKey");
                if t.group_by_label_key.is_empty() {
                    errs.push(FieldError::required(p, ""));
                } else {
                    for m in crate::validation::is_qualified_name(&t.group_by_label_key) {
                        errs.push(FieldError::invalid(&p, &t.group_by_label_key, m));
                    }
                }
            }
        }
    }

    /// The groups a template with these labels belongs to (Karmada's `affinityGroups`:
    /// `<key>=<value>`); a template without the label belongs to none.
    pub fn groups(&self, labels: &BTreeMap<String, String>) -> AffinityGroups {
        let group = |t: &Option<GroupTerm>| {
            t.as_ref().and_then(|t| {
                labels
                    .get(&t.group_by_label_key)
                    .map(|v| format!("{}={v}", t.group_by_label_key))
            })
        };
        AffinityGroups {
            affinity_group: group(&self.affinity).unwrap_or_default(),
            anti_affinity_group: group(&self.anti_affinity).unwrap_or_default(),
        }
    }
}

/// The groups a binding belongs to (Karmada's `ResourceBinding.spec.affinityGroups`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AffinityGroups {
    /// The group kept together (`<key>=<value>`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub affinity_group: String,
    /// The group kept apart (`<key>=<value>`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub anti_affinity_group: String,
}

impl AffinityGroups {
    pub fn is_empty(&self) -> bool {
        self.affinity_group.is_empty() && self.anti_affinity_group.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn claims_of_templates() {
        let sts = json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db"},
            "spec": {"replicas": 3, "template": {"spec": {"containers": [{"name": "c"}],
                "volumes": [{"name": "cfg", "configMap": {"name": "x"}}, {"name": "shared", "persistentVolumeClaim": {"claimName": "shared-data"}}]}},
              "volumeClaimTemplates": [
                {"metadata": {"name": "data"}, "spec": {"storageClassName": "fast", "resources": {"requests": {"storage": "10Gi"}}}},
                {"metadata": {"name": "wal"}, "spec": {"resources": {"requests": {"storage": 1048576}}}}]}});
        let c = claims_of(&sts);
        assert_eq!(c.len(), 3, "{c:?}");
        assert_eq!(
            (
                c[0].name.as_str(),
                c[0].per_ordinal,
                c[0].storage_class.as_str()
            ),
            ("data", true, "fast")
        );
        assert_eq!(c[0].capacity.unwrap().value(), 10 << 30);
        assert_eq!(c[1].capacity.unwrap().value(), 1 << 20);
        assert_eq!(
            (c[2].name.as_str(), c[2].per_ordinal),
            ("shared-data", false)
        );
        assert_eq!(ordinal_volume("data", "db", 2), "data-db-2");
        // A Deployment mounting a claim is stateful; one without is not.
        let dep = json!({"kind": "Deployment", "spec": {"template": {"spec": {"volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "files"}}]}}}});
        assert_eq!(claims_of(&dep)[0].name, "files");
        let plain = json!({"kind": "Deployment", "spec": {"template": {"spec": {"volumes": [{"name": "v", "emptyDir": {}}]}}}});
        assert!(claims_of(&plain).is_empty());
        // Claim templates of another kind mean nothing.
        assert!(claims_of(&json!({"kind": "Deployment", "spec": {"volumeClaimTemplates": [{"metadata": {"name": "x"}}]}})).is_empty());
    }

    #[test]
    fn migration_specs() {
        let ok = json!({"resource": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db"}, "targetClusters": ["b"]});
        let s = migration_spec(Some(&ok)).unwrap();
        assert_eq!(s.target_clusters, vec!["b".to_string()]);
        for (spec, field) in [
            (
                json!({"resource": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": ""}}),
                "spec.resource.name",
            ),
            (
                json!({"resource": {"apiVersion": "", "kind": "StatefulSet", "name": "db"}}),
                "spec.resource.apiVersion",
            ),
            (
                json!({"resource": {"apiVersion": "v1", "kind": "X", "name": "db"}, "targetClusters": ["b", "b"]}),
                "spec.targetClusters[1]",
            ),
            (
                json!({"resource": {"apiVersion": "v1", "kind": "X", "name": "db"}, "targetClusters": ["Bad_Name"]}),
                "spec.targetClusters[0]",
            ),
            (
                json!({"resource": {"apiVersion": "v1", "kind": "X", "name": "db"}, "sourceCluster": "a", "targetClusters": ["a"]}),
                "spec.targetClusters[0]",
            ),
            (
                json!({"resource": {"apiVersion": "v1", "kind": "X", "name": "db"}, "reason": "Whim"}),
                "spec.reason",
            ),
            (
                json!({"resource": {"apiVersion": "v1", "kind": "X", "name": "db"}, "speed": 1}),
                "spec.speed",
            ),
            (json!({}), "spec"),
        ] {
            let errs = migration_spec(Some(&spec)).unwrap_err();
            assert!(errs.iter().any(|e| e.field == field), "{spec}: {errs:?}");
        }
    }

    #[test]
    fn stateful_placements_and_groups() {
        let mut errs = ErrorList::new();
        let p: StatefulPlacement = serde_json::from_value(
            json!({"standby": {"maxLagSeconds": 10}, "onDataLoss": "StartEmpty"}),
        )
        .unwrap();
        p.validate("spec.placement.stateful", &mut errs);
        assert!(errs.is_empty(), "{errs:?}");
        assert_eq!(p.standby.as_ref().unwrap().clusters, 1);
        assert!(p.starts_empty());
        let bad: StatefulPlacement = serde_json::from_value(
            json!({"standby": {"clusters": 2, "maxLagSeconds": 0}, "onDataLoss": "Shrug"}),
        )
        .unwrap();
        bad.validate("p", &mut errs);
        let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "p.standby.clusters",
                "p.standby.maxLagSeconds",
                "p.onDataLoss"
            ]
        );

        let wa: WorkloadAffinity = serde_json::from_value(
            json!({"affinity": {"groupByLabelKey": "app.group"}, "antiAffinity": {"groupByLabelKey": "ha"}}),
        )
        .unwrap();
        let labels: BTreeMap<String, String> = [("app.group".to_string(), "db".to_string())].into();
        let g = wa.groups(&labels);
        assert_eq!(g.affinity_group, "app.group=db");
        assert_eq!(g.anti_affinity_group, "", "no label, no group");
        let mut errs = ErrorList::new();
        let bad: WorkloadAffinity =
            serde_json::from_value(json!({"affinity": {"groupByLabelKey": "not a key!"}})).unwrap();
        bad.validate("p.workloadAffinity", &mut errs);
        assert_eq!(errs[0].field, "p.workloadAffinity.affinity.groupByLabelKey");
        assert!(
            serde_json::from_value::<WorkloadAffinity>(json!({"affinity": {"labelSelector": {}}}))
                .is_err()
        );
    }

    #[test]
    fn phases_order() {
        use MigrationPhase::*;
        let all = [
            Pending,
            Replicating,
            Fencing,
            FinalSync,
            Starting,
            Switching,
            Cleaning,
            Succeeded,
        ];
        assert!(all.windows(2).all(|w| w[0] < w[1]));
        assert!(Succeeded.is_done() && Failed.is_done() && !Cleaning.is_done());
        let v = serde_json::to_value(MigrationStatus {
            phase: FinalSync,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(v["phase"], "FinalSync");
        assert_eq!(v["phase"].as_str(), Some(FinalSync.as_str()));
    }
}
