//! What the DRO-DS API answers, typed: the handlers serialize these, and the OpenAPI
//! document's response components are generated from them (`openapi::answer_schemas`), so
//! the document says what the server sends. Each type is named as its component.

use std::collections::BTreeMap;

use orrery_api::binding::{ClusterDecision, ObjectReference, TargetCluster};
use orrery_api::cluster::{SyncMode, WaterLevel};
use orrery_api::history::series::ClusterSample;
use orrery_api::history::{FailureRecord, ScheduleEntry};
use orrery_api::{MicroTime, Time};
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::Value;

/// Levels by dimension, as stored (`WaterLevel` flattens its dimensions beside `overall`).
type Levels = BTreeMap<String, f64>;

/// An error: a stable code, a message, and what it concerns.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "Error")]
pub struct ErrorBody<'a> {
    #[schemars(schema_with = "error_codes")]
    pub code: &'a str,
    pub message: &'a str,
    /// What the error concerns (`clusterName`, `fields`, `index`...).
    #[schemars(with = "BTreeMap<String, Value>")]
    pub details: &'a Value,
}

fn error_codes(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let codes: Vec<&str> = super::openapi::ERROR_CODES
        .iter()
        .map(|(c, _)| *c)
        .collect();
    schemars::json_schema!({"type": "string", "enum": codes})
}

/// A condition's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, JsonSchema)]
pub enum Truth {
    True,
    False,
    Unknown,
}

impl Truth {
    pub fn of(status: &str) -> Truth {
        match status {
            "True" => Truth::True,
            "False" => Truth::False,
            _ => Truth::Unknown,
        }
    }
}

/// A registered cluster.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "Cluster")]
pub struct ClusterView {
    pub name: String,
    pub endpoint: String,
    pub capabilities: Vec<String>,
    pub provider: String,
    pub region: String,
    pub labels: BTreeMap<String, String>,
    pub sync_mode: SyncMode,
    pub ready: Truth,
    #[schemars(with = "Option<Levels>")]
    pub water_level: Option<WaterLevel>,
    pub last_heartbeat_time: Option<MicroTime>,
    pub created_at: Option<Time>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ClusterList {
    pub items: Vec<ClusterView>,
    pub count: usize,
}

/// What an unregistration did: `Unregistering` while the cluster's finalizer clears its
/// namespace, Works and tokens; `Unregistered` once it is gone.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Deleted {
    pub name: String,
    pub status: &'static str,
}

/// A policy in the draft's short form.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyView {
    pub name: String,
    #[schemars(with = "String")]
    pub resource_type: Value,
    #[schemars(with = "Vec<String>")]
    pub target_clusters: Vec<Value>,
    pub created_at: Option<Time>,
    pub resource_version: String,
    /// How many templates the policy places.
    pub bound_resources: i64,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct PolicyList {
    pub items: Vec<PolicyView>,
    pub count: usize,
}

/// A task accepted for scheduling, and where its status is read.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskAccepted {
    pub binding_id: String,
    pub state: &'static str,
    pub status_url: String,
}

#[derive(Debug, Serialize, JsonSchema)]
pub enum DeletedState {
    Deleted,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskDeleted {
    pub binding_id: String,
    pub state: DeletedState,
}

/// Where a binding's scheduling stands.
#[derive(Clone, Copy, Debug, Serialize, JsonSchema)]
pub enum TaskState {
    Pending,
    Scheduled,
    PartiallyScheduled,
    Unschedulable,
}

/// A task's (a binding's) scheduling status.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskStatus {
    pub binding_id: String,
    pub task_id: String,
    pub state: TaskState,
    /// The template or standalone task placed.
    #[schemars(with = "Option<ObjectReference>")]
    pub resource: Value,
    #[schemars(with = "Option<i64>")]
    pub replicas: Value,
    #[schemars(with = "Vec<TargetCluster>")]
    pub clusters: Vec<Value>,
    pub message: String,
    pub strategy: String,
    pub unplaced_replicas: i64,
    pub reasons: Vec<ClusterDecision>,
    pub filtered: BTreeMap<String, i64>,
    /// How the clusters' water levels were judged: by their forecast or their present
    /// level, and why.
    pub prediction: String,
    pub last_scheduled_time: Option<Time>,
    pub fully_applied: bool,
    /// A standalone task rather than a template's binding.
    pub standalone: bool,
    pub priority: i64,
}

/// A metrics report taken in.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetricsAccepted {
    pub cluster: String,
    pub accepted: bool,
    /// The cluster's water level now.
    #[schemars(with = "Option<Levels>")]
    pub water_level: Value,
    /// The report's time was past (or older than the cluster's last report): it joined the
    /// history at its time, and the cluster's present figures are as they were.
    pub backfilled: bool,
}

/// A domain event recorded (as a Kubernetes Event on the cluster).
#[derive(Debug, Serialize, JsonSchema)]
pub struct EventRecorded {
    pub cluster: String,
    pub recorded: bool,
    pub failure: bool,
}

/// One status write of a batch.
#[derive(Debug, Default, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ItemResult {
    pub kind: String,
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// `OK`, or the error's code.
    pub code: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct BatchResult {
    pub applied: usize,
    pub failed: usize,
    pub results: Vec<ItemResult>,
}

/// One cluster, now.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterNow {
    pub name: String,
    pub ready: bool,
    pub pods: i64,
    #[schemars(with = "Option<Levels>")]
    pub water_level: Option<WaterLevel>,
    pub network_bytes_per_second: f64,
    /// What Orrery's replicas there cost per hour; absent where the cluster has no prices.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hourly_cost: Option<f64>,
}

/// The fleet now.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Realtime {
    /// What the replicas Orrery placed cost per hour, by the clusters' prices, as of
    /// costTime (the newest monitoring sample); null before the first sample.
    pub hourly_cost: Option<f64>,
    pub cost_time: Option<Time>,
    pub active_clusters: usize,
    pub total_clusters: usize,
    /// Pods running in the Ready clusters.
    pub total_pods: i64,
    /// Pods the clusters that are not Ready last reported (not counted as running).
    pub unreachable_pods: i64,
    /// The Ready clusters' traffic, as the draft writes it (`1.2Gbps`).
    pub network_traffic: String,
    pub network_bytes_per_second: f64,
    pub fleet_water_level: Levels,
    pub clusters: Vec<ClusterNow>,
    /// The ISO 4217 code the priced clusters' prices are in (cost.orrery.io/currency), when
    /// they name one and agree.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
    /// The codes, when priced clusters name different currencies (their costs are not
    /// converted).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub currencies: Vec<String>,
}

/// One forecast point: the mean and the 80 % and 95 % bounds.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PointView {
    pub time: Time,
    pub mean: f64,
    pub lower80: f64,
    pub upper80: f64,
    pub lower95: f64,
    pub upper95: f64,
}

/// The models a series' backtest chooses from.
fn models(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "string", "enum": ["naive", "seasonal-naive", "ets", "mstl-ets", "mstl-ar"]})
}

/// One series' forecast.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SeriesView {
    #[schemars(schema_with = "models")]
    pub model: String,
    pub points: Vec<PointView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backtest_mase: Option<f64>,
    /// The series' value at the forecast's time, where the points start from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last: Option<f64>,
    /// The highest the series went over its last season (a water level with Orrery's part
    /// as it stands): where its daily peak takes it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub season_peak: Option<f64>,
}

/// A cluster's forecasts.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ForecastView {
    pub cluster: String,
    pub time: Time,
    pub step_seconds: u64,
    pub season_seconds: u64,
    pub history: usize,
    /// By series: cpu, memory, gpu and pods water levels, and traffic (bytes per second).
    pub series: BTreeMap<String, SeriesView>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct MonitorForecast {
    pub clusters: Vec<ForecastView>,
    pub count: usize,
}

/// The fleet at one time.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HistoryPoint {
    pub time: Time,
    /// The Ready clusters' mean water level.
    pub mean_level: f64,
    pub clusters: BTreeMap<String, ClusterSample>,
    /// What Orrery's replicas cost per hour then, over the clusters with prices.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hourly_cost: Option<f64>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct MonitorHistory {
    pub resolution: String,
    pub points: Vec<HistoryPoint>,
    pub count: usize,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ScheduleHistory {
    pub entries: Vec<ScheduleEntry>,
    pub count: usize,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct FailureHistory {
    pub entries: Vec<FailureRecord>,
    pub count: usize,
}

/// The answers' components, generated with `g` (which holds the requests' already).
pub fn register(g: &mut schemars::SchemaGenerator) {
    g.subschema_for::<ErrorBody<'static>>();
    g.subschema_for::<ClusterView>();
    g.subschema_for::<ClusterList>();
    g.subschema_for::<Deleted>();
    g.subschema_for::<PolicyView>();
    g.subschema_for::<PolicyList>();
    g.subschema_for::<TaskAccepted>();
    g.subschema_for::<TaskDeleted>();
    g.subschema_for::<TaskStatus>();
    g.subschema_for::<MetricsAccepted>();
    g.subschema_for::<super::backfill::HistoryAccepted>();
    g.subschema_for::<EventRecorded>();
    g.subschema_for::<BatchResult>();
    g.subschema_for::<Realtime>();
    g.subschema_for::<MonitorForecast>();
    g.subschema_for::<MonitorHistory>();
    g.subschema_for::<ScheduleHistory>();
    g.subschema_for::<FailureHistory>();
}

/// An answer: `value` as JSON (a 500 in the API's error shape should it not serialize; no
/// answer type here has a map with keys other than strings, so none does).
pub fn send<T: Serialize>(
    status: http::StatusCode,
    value: &T,
) -> http::Response<crate::http::Body> {
    match serde_json::to_vec(value) {
        Ok(bytes) => {
            let mut r = http::Response::new(crate::http::full(bytes));
            *r.status_mut() = status;
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            r
        }
        Err(e) => super::DroError::internal(e).response(),
    }
}
