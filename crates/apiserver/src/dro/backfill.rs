//! History reported afterwards: `POST /api/v1/metrics/history` (a cluster's samples with the
//! times they were measured at, up to [`backfill::MAX_PER_REQUEST`]), and a `PUT
//! /api/v1/metrics` whose timestamp is past or older than the cluster's last report. Checked
//! as a report is, turned into water levels by the cluster's allocatable, and put into the
//! cluster's inbox (`orrery_api::history::backfill`), which the monitoring loop merges into the
//! 5-minute averages the history and the forecasts read.

use std::collections::BTreeMap;

use http::StatusCode;
use orrery_api::history::backfill::{self, Inbox, Point};
use orrery_api::{Object, Quantity, Time, keys};
use orrery_store::StoreError;
use serde::Deserialize;
use serde_json::{Value, json};

use super::DroError;
use super::monitor::bad;
use crate::app::App;
use crate::auth::Identity;
use crate::http::Body;

/// A report this much older than the server's clock is history, not the cluster's present.
pub(super) const LIVE_SECONDS: i64 = 120;

/// A cluster's history taken in (`POST /api/v1/metrics/history`); the monitoring loop merges
/// it into the 5-minute averages within seconds.
#[derive(Debug, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HistoryAccepted {
    pub cluster: String,
    /// Samples taken.
    pub accepted: usize,
    /// Of those, how many replaced a sample of the same time still waiting.
    pub replaced: usize,
    /// Samples of the cluster waiting to be merged, these included.
    pub waiting: usize,
}

/// A cluster's history (Orrery's extension of 6.3.1).
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(rename = "MetricsHistory", extend("example" = {
    "cluster": "aws-us-east", "samples": [
        {"timestamp": "2023-07-20T08:25:00Z", "cpuUsage": 70.1, "memoryAvailable": 15.9},
        {"timestamp": "2023-07-20T08:30:00Z", "cpuUsage": 72.4, "memoryAvailable": 15.2}],
}))]
pub(super) struct HistoryReport {
    cluster: String,
    /// In any order; a time given twice keeps the last.
    #[schemars(length(min = 1, max = 4096))]
    samples: Vec<Sample>,
}

/// One sample of a cluster's history: the figures of a report, at its time.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(rename = "MetricsSample")]
pub(super) struct Sample {
    #[schemars(extend("format" = "date-time"))]
    pub(super) timestamp: String,
    #[schemars(range(min = 0, max = 100))]
    pub(super) cpu_usage: f64,
    #[schemars(range(min = 0))]
    pub(super) memory_available: f64,
    #[serde(default)]
    #[schemars(range(min = 0, max = 100))]
    pub(super) gpu_usage: Option<f64>,
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub(super) pods: Option<i64>,
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub(super) network_traffic: Option<f64>,
}

impl Sample {
    /// Refuses figures out of their ranges; `at` prefixes the fields named.
    pub(super) fn check(&self, at: &str) -> Result<(), DroError> {
        let field = |f: &str| format!("{at}{f}");
        if !(0.0..=100.0).contains(&self.cpu_usage) {
            return Err(bad(
                "cpuUsage is a percentage, 0 to 100",
                &field("cpuUsage"),
            ));
        }
        if !(self.memory_available >= 0.0 && self.memory_available.is_finite()) {
            return Err(bad(
                "memoryAvailable is GiB, not negative",
                &field("memoryAvailable"),
            ));
        }
        if self.gpu_usage.is_some_and(|g| !(0.0..=100.0).contains(&g)) {
            return Err(bad(
                "gpuUsage is a percentage, 0 to 100",
                &field("gpuUsage"),
            ));
        }
        if self.pods.is_some_and(|p| p < 0) {
            return Err(bad("pods must not be negative", &field("pods")));
        }
        if self
            .network_traffic
            .is_some_and(|t| !(t >= 0.0 && t.is_finite()))
        {
            return Err(bad(
                "networkTraffic is bytes per second, not negative",
                &field("networkTraffic"),
            ));
        }
        Ok(())
    }

    /// The figures as water levels by the cluster's allocatable (a dimension it has none of
    /// is left out; a report has usage only, so a level is usage, not requests).
    fn point(&self, allocatable: &BTreeMap<String, Quantity>) -> Point {
        let round = |x: f64| (x.clamp(0.0, 1.0) * 1000.0).round() / 1000.0;
        let mut levels = BTreeMap::new();
        levels.insert("cpu".to_string(), round(self.cpu_usage / 100.0));
        if let Some(mem) = allocatable.get("memory").filter(|q| q.nanos() > 0) {
            let total = mem.nanos() as f64 / 1e9;
            let free = self.memory_available * (1u64 << 30) as f64;
            levels.insert("memory".into(), round((total - free) / total));
        }
        if let Some(g) = self.gpu_usage {
            levels.insert("gpu".into(), round(g / 100.0));
        }
        if let (Some(p), Some(total)) =
            (self.pods, allocatable.get("pods").filter(|q| q.nanos() > 0))
        {
            levels.insert("pods".into(), round(p as f64 * 1e9 / total.nanos() as f64));
        }
        Point {
            levels,
            cpu_usage: Some(self.cpu_usage),
            memory_available: Some(self.memory_available),
            pods: self.pods,
            traffic: self.network_traffic,
        }
    }
}

/// A sample's time, parsed and within the history kept.
pub(super) fn time_of(s: &str, now: Time, field: &str) -> Result<Time, DroError> {
    let t: Time = s
        .parse()
        .map_err(|_| bad(format!("timestamp {s:?} is not an ISO 8601 time"), field))?;
    backfill::check_time(t.unix_seconds(), now.unix_seconds())
        .map_err(|e| bad(format!("timestamp {s:?}: {e}"), field))?;
    Ok(t)
}

/// `POST /api/v1/metrics/history`.
pub async fn history(
    app: &App,
    who: &Identity,
    body: &[u8],
) -> Result<http::Response<Body>, DroError> {
    let r: HistoryReport = serde_json::from_slice(body).map_err(|e| {
        DroError::validation(format!("the body is not a valid metrics history: {e}"))
    })?;
    super::monitor::authorize(app, who, &r.cluster)?;
    if r.samples.is_empty() {
        return Err(bad("samples must hold at least one sample", "samples"));
    }
    if r.samples.len() > backfill::MAX_PER_REQUEST {
        return Err(DroError::new(
            413,
            "PAYLOAD_TOO_LARGE",
            format!(
                "{} samples in one request; at most {} (send the rest in another)",
                r.samples.len(),
                backfill::MAX_PER_REQUEST
            ),
        ));
    }
    let now = Time::now();
    let mut checked = Vec::with_capacity(r.samples.len());
    for (i, s) in r.samples.iter().enumerate() {
        let t = time_of(&s.timestamp, now, &format!("samples[{i}].timestamp"))?;
        s.check(&format!("samples[{i}]."))?;
        checked.push((t.unix_seconds(), s));
    }
    let c = cluster(app, &r.cluster).await?;
    let accepted = put(app, &c, &checked).await?;
    Ok(super::answers::send(StatusCode::OK, &accepted))
}

/// The Cluster `name` (`CLUSTER_NOT_FOUND` when there is none).
pub(super) async fn cluster(app: &App, name: &str) -> Result<Object, DroError> {
    match app.store.get(&keys::well_known::cluster(name)).await {
        Ok(c) => Ok(c),
        Err(StoreError::NotFound { .. }) => Err(DroError::cluster_not_found(name)),
        Err(e) => Err(DroError::internal(e)),
    }
}

/// Puts checked samples of Cluster `c` into its inbox, as water levels by its allocatable.
pub(super) async fn put(
    app: &App,
    c: &Object,
    samples: &[(i64, &Sample)],
) -> Result<HistoryAccepted, DroError> {
    let allocatable = allocatable_of(c);
    let points: Vec<(i64, Point)> = samples
        .iter()
        .map(|(t, s)| (*t, s.point(&allocatable)))
        .collect();
    enqueue(app.store.as_ref(), c.name(), points).await
}

/// Puts samples of `cluster`'s history into its inbox with compare-and-swap, for the
/// monitoring loop to merge (also what a Prometheus server's history is read into).
pub async fn enqueue(
    store: &dyn orrery_store::Store,
    cluster: &str,
    points: Vec<(i64, Point)>,
) -> Result<HistoryAccepted, DroError> {
    let key = backfill::key(cluster);
    for _ in 0..5 {
        // (the inbox, whether it exists, its revision)
        let (mut inbox, exists, revision) = match store.get(&key).await {
            Ok(o) => (
                o.spec
                    .as_ref()
                    .and_then(|s| serde_json::from_value::<Inbox>(s.clone()).ok())
                    .unwrap_or_default(),
                true,
                o.revision(),
            ),
            Err(StoreError::NotFound { .. }) => (Inbox::default(), false, None),
            Err(e) => return Err(DroError::internal(e)),
        };
        inbox.cluster = cluster.to_string();
        inbox.expire(Time::now().unix_seconds());
        let replaced = inbox.add(points.iter().cloned());
        if inbox.points.len() > backfill::MAX_WAITING {
            return Err(DroError::new(
                429,
                "TOO_MANY_REQUESTS",
                format!(
                    "{} samples of cluster {cluster:?} wait to be merged into the history \
                     (at most {}); send these again in a few seconds",
                    inbox.points.len() - (points.len() - replaced),
                    backfill::MAX_WAITING
                ),
            )
            .with_details(json!({ "clusterName": cluster, "retryAfterSeconds": 5 })));
        }
        let mut o = Object::new("internal.orrery.io/v1", "MetricsBackfill").with_name(cluster);
        o.spec = Some(serde_json::to_value(&inbox).map_err(DroError::internal)?);
        let written = if exists {
            store.update(&key, o, revision).await
        } else {
            store.create(&key, o).await
        };
        match written {
            Ok(_) => {
                return Ok(HistoryAccepted {
                    cluster: cluster.to_string(),
                    accepted: points.len(),
                    replaced,
                    waiting: inbox.points.len(),
                });
            }
            Err(StoreError::Conflict { .. } | StoreError::AlreadyExists { .. }) => continue,
            Err(StoreError::NotFound { .. }) => continue,
            Err(e) => return Err(DroError::internal(e)),
        }
    }
    Err(DroError::new(
        409,
        "CONFLICT",
        format!("the history of cluster {cluster:?} kept changing; try again"),
    ))
}

/// A Cluster's `status.resourceSummary.allocatable`.
fn allocatable_of(c: &Object) -> BTreeMap<String, Quantity> {
    c.status
        .as_ref()
        .and_then(|s| s.pointer("/resourceSummary/allocatable"))
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.parse().ok()?)))
                .collect()
        })
        .unwrap_or_default()
}
