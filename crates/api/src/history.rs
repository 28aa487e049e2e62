//! The schedule history: every scheduling decision, with why each cluster was or was not
//! chosen. Decisions are stored in batches, one record per scheduling round, under keys that
//! sort by time.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::binding::{ClusterDecision, ObjectReference, TargetCluster};
use crate::time::Time;

pub const API_VERSION: &str = "internal.orrery.io/v1";
pub const KIND: &str = "ScheduleRecord";

/// Where schedule records live (a key space the Kubernetes REST API does not expose; the
/// DRO-DS API serves it at `/api/v1/history/schedules`).
pub const PREFIX: &str = "/internal/history/schedules/";

/// At most this many per-cluster explanations are kept per decision; the rest are counted
/// by filter in [`ScheduleEntry::filtered`].
pub const MAX_EXPLAINED: usize = 10;

pub fn key(name: &str) -> String {
    format!("{PREFIX}{name}")
}

/// A record name that sorts by time: nanoseconds since the epoch, zero-padded, and a
/// sequence number for records made in the same nanosecond.
pub fn record_name(unix_nanos: i128, seq: u64) -> String {
    format!("r{:020}-{seq:06}", unix_nanos.max(0))
}

/// One decision.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleEntry {
    /// The task: `<binding uid>-<sequence>`.
    pub id: String,
    pub time: Time,
    /// `<namespace>/<name>` of the ResourceBinding.
    pub binding: String,
    pub resource: ObjectReference,
    pub replicas: i64,
    /// What asked for the decision: Created, SpecChanged, ClustersChanged, Failover, Shed,
    /// Recovered, Retry.
    pub trigger: String,
    pub strategy: String,
    #[serde(default)]
    pub fleet_level: f64,
    /// Scheduled, PartiallyScheduled or Unschedulable.
    pub result: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<TargetCluster>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unplaced: i64,
    /// The chosen clusters, then the others, best first, up to [`MAX_EXPLAINED`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub decisions: Vec<ClusterDecision>,
    /// How many clusters each filter turned away.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub filtered: BTreeMap<String, i64>,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordSpec {
    pub entries: Vec<ScheduleEntry>,
}

/// A one-line account of why clusters were turned away: `2 WaterLevel, 1 Readiness`.
pub fn filtered_message(filtered: &BTreeMap<String, i64>) -> String {
    let mut v: Vec<(&String, &i64)> = filtered.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    v.iter()
        .map(|(f, n)| format!("{n} {f}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sort_by_time_and_messages_count() {
        let filtered: BTreeMap<String, i64> =
            [("Readiness".to_string(), 1), ("WaterLevel".to_string(), 2)].into();
        assert_eq!(filtered_message(&filtered), "2 WaterLevel, 1 Readiness");
        assert!(record_name(5, 1) < record_name(10, 0));
        assert!(
            record_name(1_700_000_000_000_000_000, 0) > record_name(999_999_999_999_999_999, 9)
        );
    }
}

/// Where failure records live (`GET /api/v1/history/failures`).
pub const FAILURES_PREFIX: &str = "/internal/history/failures/";

/// One entry of the failure history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FailureRecord {
    pub time: Time,
    pub cluster: String,
    /// `ClusterUnreachable`, `ClusterNotReady`, `ClusterRecovered`, or a domain event's type.
    #[serde(rename = "type")]
    pub type_: String,
    pub reason: String,
    pub message: String,
}

/// A failure record as stored: its key (sorting by time; `unique` tells apart records of the
/// same microsecond) and the object.
pub fn failure_entry(rec: &FailureRecord, unique: &str) -> (String, crate::Object) {
    let micros = rec.time.timestamp().as_microsecond();
    let name = format!("{micros:020}-{}-{unique}", rec.cluster);
    let mut o = crate::Object::new("internal.orrery.io/v1", "FailureRecord").with_name(&name);
    o.spec = serde_json::to_value(rec).ok();
    o.metadata.creation_timestamp = Some(rec.time);
    (format!("{FAILURES_PREFIX}{name}"), o)
}
