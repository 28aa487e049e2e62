//! The data plane and monitoring interfaces of the draft:
//!
//! - `PUT /api/v1/metrics` (6.3.1): a domain's figures. They land in its Cluster's status
//!   (`status.metrics`, and the usage the Resource Water Level is computed from), so the
//!   scheduler sees them. A member's agent may report only its own cluster.
//! - `POST /api/v1/metrics/events` (6.3.1): a domain event, recorded as a Kubernetes Event on
//!   the Cluster, and in the failure history when it is a failure.
//! - `PUT /api/v1/sync/configs` (6.3.2): a domain's configuration (labels, capabilities,
//!   taints, properties).
//! - `GET /api/v1/monitor/realtime` (6.4.1) and `GET /api/v1/history/failures` (6.4.2).

use std::collections::BTreeMap;

use http::StatusCode;
use orrery_api::cluster::{self, ClusterSpec, ClusterStatus, MetricsSummary, Taint};
use orrery_api::history::{self, FailureRecord};
use orrery_api::{Object, Quantity, Time, keys};
use orrery_store::{ListOptions, StoreError};
use serde::Deserialize;
use serde_json::{Value, json};

use super::DroError;
use super::answers::{
    ClusterNow, EventRecorded, FailureHistory, HistoryPoint, MetricsAccepted, MonitorHistory,
    Realtime,
};
use crate::app::App;
use crate::auth::{Attributes, Identity};
use crate::http::Body;
use crate::registry::write::StatusCheck;
use crate::registry::{self, StatusGrant};

pub(super) fn bad(message: impl Into<String>, field: &str) -> DroError {
    DroError::validation(message).with_details(json!({ "fields": [{"field": field}] }))
}

/// Speaking for a cluster (its metrics, events, latencies) is writing its status: its own
/// agent may, and whoever RBAC lets update `clusters/status` of that cluster.
pub(super) fn authorize(app: &App, who: &Identity, cluster: &str) -> Result<StatusGrant, DroError> {
    let rt = cluster_type(app)?;
    registry::authorize_status(app, who, &rt, None, cluster)
        .map_err(|e| DroError::from(e).with_details(json!({ "clusterName": cluster })))
}

/// Reading the fleet's monitoring data (and forecasts) is listing its clusters.
pub(super) fn may_read_fleet(app: &App, who: &Identity) -> Result<(), DroError> {
    app.authz
        .authorize(
            who,
            &Attributes {
                verb: "list",
                group: "multicluster.io",
                resource: "clusters",
                ..Attributes::default()
            },
        )
        .map_err(DroError::from)
}

/// The Cluster kind as the API serves it.
fn cluster_type(app: &App) -> Result<std::sync::Arc<crate::resources::ResourceType>, DroError> {
    app.resources
        .snapshot()
        .by_kind(cluster::GROUP, "Cluster")
        .ok_or_else(|| DroError::internal("the Cluster kind is not registered"))
}

/// Reads, changes and writes one Cluster with compare-and-swap, validated like any update.
async fn update_cluster(
    app: &App,
    grant: &StatusGrant,
    mut change: impl FnMut(&mut Object) -> Result<(), DroError>,
) -> Result<std::sync::Arc<Object>, DroError> {
    let name = grant.name();
    let key = keys::well_known::cluster(name);
    let rt = cluster_type(app)?;
    for _ in 0..5 {
        let current = match app.store.get(&key).await {
            Ok(o) => o,
            Err(StoreError::NotFound { .. }) => return Err(DroError::cluster_not_found(name)),
            Err(e) => return Err(DroError::internal(e)),
        };
        let mut next = current.clone();
        change(&mut next)?;
        crate::registry::validate_object(app, &rt, &next, Some(&current))
            .map_err(DroError::from)?;
        match app.store.update(&key, next, current.revision()).await {
            Ok(o) => return Ok(o),
            Err(StoreError::Conflict { .. }) => continue,
            Err(e) => return Err(DroError::internal(e)),
        }
    }
    Err(DroError::new(
        409,
        "CONFLICT",
        format!("cluster {name:?} kept changing; try again"),
    ))
}

/// The draft's resource report, with Orrery's optional figures.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(rename = "MetricsReport", extend("example" = {
    "cluster": "aws-us-east", "timestamp": "2023-07-20T08:30:00Z", "cpuUsage": 72.4, "memoryAvailable": 15.2,
}))]
pub(super) struct Report {
    cluster: String,
    #[schemars(extend("format" = "date-time"))]
    timestamp: String,
    /// Percent of the cpu in use (0-100).
    #[schemars(range(min = 0, max = 100))]
    cpu_usage: f64,
    /// GiB of memory free.
    #[schemars(range(min = 0))]
    memory_available: f64,
    /// Percent of the GPUs in use (0-100).
    #[serde(default)]
    #[schemars(range(min = 0, max = 100))]
    gpu_usage: Option<f64>,
    #[serde(default)]
    #[schemars(range(min = 0))]
    pods: Option<i64>,
    /// Bytes per second, in and out.
    #[serde(default)]
    #[schemars(range(min = 0))]
    network_traffic: Option<f64>,
    /// Round-trip latency to other clusters, milliseconds.
    #[serde(default)]
    #[schemars(inner(range(min = 0)))]
    latencies: BTreeMap<String, f64>,
}

pub async fn metrics(
    app: &App,
    who: &Identity,
    body: &[u8],
) -> Result<http::Response<Body>, DroError> {
    let r: Report = serde_json::from_slice(body).map_err(|e| {
        DroError::validation(format!("the body is not a valid metrics report: {e}"))
    })?;
    let authorized = authorize(app, who, &r.cluster)?;
    let now = Time::now();
    let ts = super::backfill::time_of(&r.timestamp, now, "timestamp")?;
    let figures = super::backfill::Sample {
        timestamp: r.timestamp.clone(),
        cpu_usage: r.cpu_usage,
        memory_available: r.memory_available,
        gpu_usage: r.gpu_usage,
        pods: r.pods,
        network_traffic: r.network_traffic,
    };
    figures.check("")?;
    if r.latencies.values().any(|l| !(*l >= 0.0 && l.is_finite())) {
        return Err(bad("latencies are milliseconds, not negative", "latencies"));
    }
    // A report of a past time is history: it joins the averages at its time, and the
    // cluster's present figures stay as they are.
    if now.unix_seconds() - ts.unix_seconds() > super::backfill::LIVE_SECONDS {
        return backfilled(app, &r.cluster, ts, figures).await;
    }
    let summary = MetricsSummary {
        timestamp: ts,
        cpu_usage: r.cpu_usage,
        memory_available: r.memory_available,
        gpu_usage: r.gpu_usage,
        pods: r.pods,
        network_traffic: r.network_traffic,
    };
    let metrics = serde_json::to_value(&summary).map_err(DroError::internal)?;
    // A report older than the one the status holds (they crossed on the way) is history too.
    let mut older = false;
    // A status write: the report changes nothing else of the Cluster. The status is edited as
    // JSON, in place: parsing it whole and writing it back cost more than the rest of the
    // handler, and fields this handler does not know stay as they are.
    let stored = registry::update_status(app, &authorized, None, StatusCheck::Trusted, |c| {
        let mut st = match &c.status {
            Some(Value::Object(m)) => m.clone(),
            _ => serde_json::Map::new(),
        };
        older = st
            .get("metrics")
            .and_then(|m| m.get("timestamp"))
            .and_then(Value::as_str)
            .and_then(|t| t.parse::<Time>().ok())
            .is_some_and(|last| last > ts);
        if older {
            return Ok(Value::Object(st));
        }
        if let Some(Value::Object(rs)) = st.get_mut("resourceSummary") {
            // The report's usage feeds the water level (computed from the summary when the
            // status is written) the scheduler reads.
            let allocatable = |name: &str| {
                rs.get("allocatable")
                    .and_then(|a| a.get(name))
                    .and_then(Value::as_str)
                    .and_then(|q| q.parse::<Quantity>().ok())
            };
            let cpu = allocatable("cpu").and_then(|cpu| {
                let used = (cpu.nanos() as f64 * r.cpu_usage / 100.0) as i128;
                Quantity::from_nanos(used, orrery_api::Format::DecimalSI).ok()
            });
            let memory = allocatable("memory").and_then(|mem| {
                let free = (r.memory_available * (1u64 << 30) as f64 * 1e9) as i128;
                let used = (mem.nanos() - free).max(0);
                Quantity::from_nanos(used, orrery_api::Format::BinarySI).ok()
            });
            if cpu.is_some() || memory.is_some() {
                let usage = object_field(rs, "usage");
                for (name, q) in [("cpu", cpu), ("memory", memory)] {
                    if let Some(q) = q {
                        usage.insert(name.into(), Value::String(q.to_string()));
                    }
                }
            }
        }
        if r.network_traffic.is_some() || !r.latencies.is_empty() {
            let n = object_field(&mut st, "network");
            if let Some(t) = r.network_traffic {
                n.insert("ingressBytesPerSecond".into(), json!(t / 2.0));
                n.insert("egressBytesPerSecond".into(), json!(t / 2.0));
            }
            if !r.latencies.is_empty() {
                n.insert("latencyMs".into(), json!(r.latencies));
            }
        }
        st.insert("metrics".into(), metrics.clone());
        Ok(Value::Object(st))
    })
    .await
    .map_err(|e| {
        if e.code == 404 {
            DroError::cluster_not_found(&r.cluster)
        } else {
            DroError::from(e)
        }
    })?;
    if older {
        return backfilled(app, &r.cluster, ts, figures).await;
    }
    Ok(super::answers::send(
        StatusCode::OK,
        &MetricsAccepted {
            cluster: r.cluster.clone(),
            accepted: true,
            water_level: level_of(&stored),
            backfilled: false,
        },
    ))
}

/// A Cluster's `status.waterLevel`.
fn level_of(c: &Object) -> Value {
    c.status
        .as_ref()
        .and_then(|s| s.get("waterLevel"))
        .cloned()
        .unwrap_or(Value::Null)
}

/// A report of a past time, into the history.
async fn backfilled(
    app: &App,
    cluster: &str,
    ts: Time,
    figures: super::backfill::Sample,
) -> Result<http::Response<Body>, DroError> {
    let c = super::backfill::cluster(app, cluster).await?;
    super::backfill::put(app, &c, &[(ts.unix_seconds(), &figures)]).await?;
    Ok(super::answers::send(
        StatusCode::OK,
        &MetricsAccepted {
            cluster: cluster.to_string(),
            accepted: true,
            water_level: level_of(&c),
            backfilled: true,
        },
    ))
}

/// The object at `key` in `m`, made an empty one first when it is missing or not an object.
fn object_field<'a>(
    m: &'a mut serde_json::Map<String, Value>,
    key: &str,
) -> &'a mut serde_json::Map<String, Value> {
    let v = m
        .entry(key)
        .or_insert_with(|| Value::Object(Default::default()));
    if !v.is_object() {
        *v = Value::Object(Default::default());
    }
    // Invariant: made an object just above.
    #[allow(clippy::expect_used)]
    v.as_object_mut().expect("an object")
}

/// A domain event (6.3.1 `POST /events`).
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct DomainEvent {
    cluster: String,
    /// Normal, Warning or Failure.
    #[serde(rename = "type")]
    #[schemars(extend("enum" = ["Normal", "Warning", "Failure"]))]
    type_: String,
    #[schemars(length(min = 1, max = 128))]
    reason: String,
    #[serde(default)]
    #[schemars(length(max = 4096))]
    message: String,
    #[serde(default)]
    #[schemars(extend("format" = "date-time"))]
    timestamp: Option<String>,
}

pub async fn event(
    app: &App,
    who: &Identity,
    body: &[u8],
) -> Result<http::Response<Body>, DroError> {
    let e: DomainEvent = serde_json::from_slice(body)
        .map_err(|e| DroError::validation(format!("the body is not a valid event: {e}")))?;
    authorize(app, who, &e.cluster)?;
    if !["Normal", "Warning", "Failure"].contains(&e.type_.as_str()) {
        return Err(bad("type must be Normal, Warning or Failure", "type"));
    }
    if e.reason.is_empty() || e.reason.len() > 128 {
        return Err(bad("reason must be 1 to 128 characters", "reason"));
    }
    if e.message.len() > 4096 {
        return Err(bad("message must be at most 4096 characters", "message"));
    }
    let time = match &e.timestamp {
        Some(t) => t.parse::<Time>().map_err(|_| {
            bad(
                format!("timestamp {t:?} is not an ISO 8601 time"),
                "timestamp",
            )
        })?,
        None => Time::now(),
    };
    let cluster = match app.store.get(&keys::well_known::cluster(&e.cluster)).await {
        Ok(c) => c,
        Err(StoreError::NotFound { .. }) => return Err(DroError::cluster_not_found(&e.cluster)),
        Err(err) => return Err(DroError::internal(err)),
    };
    let unique = uuid::Uuid::new_v4().simple().to_string();
    let failure = e.type_ == "Failure";
    if failure {
        let rec = FailureRecord {
            time,
            cluster: e.cluster.clone(),
            type_: e.reason.clone(),
            reason: e.reason.clone(),
            message: e.message.clone(),
        };
        let (key, o) = history::failure_entry(&rec, &unique[..8]);
        app.store
            .create(&key, o)
            .await
            .map_err(DroError::internal)?;
    }
    // A Kubernetes Event too, so `kubectl describe cluster` shows it.
    let name = format!("{}.{}", e.cluster, &unique[..16]);
    let mut ev = orrery_store::stamp::new_object("v1", "Event", Some("default"), &name);
    let fields = [
        (
            "involvedObject",
            json!({"apiVersion": cluster::API_VERSION, "kind": "Cluster", "name": e.cluster, "uid": cluster.metadata.uid}),
        ),
        ("reason", json!(e.reason)),
        ("message", json!(e.message)),
        (
            "type",
            json!(if e.type_ == "Normal" {
                "Normal"
            } else {
                "Warning"
            }),
        ),
        ("source", json!({"component": "dro-events"})),
        ("firstTimestamp", json!(time.to_string())),
        ("lastTimestamp", json!(time.to_string())),
        ("count", json!(1)),
    ];
    for (k, v) in fields {
        ev.other.insert(k.into(), v);
    }
    app.store
        .create(&keys::well_known::event("default", &name), ev)
        .await
        .map_err(DroError::internal)?;
    Ok(super::answers::send(
        StatusCode::CREATED,
        &EventRecorded {
            cluster: e.cluster.clone(),
            recorded: true,
            failure,
        },
    ))
}

/// A domain's configuration (6.3.2 `PUT /configs`): what is given replaces what was there.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(rename = "DomainConfig")]
pub(super) struct Config {
    cluster: String,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    capabilities: Option<Vec<String>>,
    #[serde(default)]
    taints: Option<Vec<Taint>>,
    #[serde(default)]
    properties: Option<BTreeMap<String, String>>,
}

pub async fn configs(
    app: &App,
    who: &Identity,
    body: &[u8],
) -> Result<http::Response<Body>, DroError> {
    let c: Config = serde_json::from_slice(body)
        .map_err(|e| DroError::validation(format!("the body is not a valid configuration: {e}")))?;
    let authorized = authorize(app, who, &c.cluster)?;
    // Labels, taints and capabilities decide what is placed on the cluster: they are the
    // administrator's (`update clusters`), never its agent's, or a compromised member could
    // attract workloads. What the member reports of itself (properties) is status.
    if c.labels.is_some() || c.taints.is_some() || c.capabilities.is_some() {
        app.authz
            .authorize(
                who,
                &Attributes {
                    verb: "update",
                    group: cluster::GROUP,
                    resource: "clusters",
                    name: Some(&c.cluster),
                    ..Default::default()
                },
            )
            .map_err(|e| {
                let mut d = DroError::from(e);
                d.message = format!(
                    "{}; labels, taints and capabilities are set by whoever may update the Cluster (an agent reports properties only)",
                    d.message
                );
                d.with_details(json!({ "clusterName": c.cluster }))
            })?;
    }
    let o = update_cluster(app, &authorized, |o| {
        if let Some(l) = &c.labels {
            o.metadata.labels = l.clone();
        }
        let mut spec = ClusterSpec::of(o);
        if let Some(caps) = &c.capabilities {
            spec.capabilities = caps.clone();
        }
        if let Some(t) = &c.taints {
            spec.taints = t.clone();
        }
        let mut spec_v = o.spec.clone().unwrap_or(json!({}));
        if let (Some(m), Ok(Value::Object(n))) =
            (spec_v.as_object_mut(), serde_json::to_value(&spec))
        {
            m.insert(
                "capabilities".into(),
                n.get("capabilities").cloned().unwrap_or(json!([])),
            );
            m.insert(
                "taints".into(),
                n.get("taints").cloned().unwrap_or(json!([])),
            );
        }
        o.spec = Some(spec_v);
        if let Some(p) = &c.properties {
            let mut st = ClusterStatus::of(o);
            st.properties = p.clone();
            o.status = Some(serde_json::to_value(&st).map_err(DroError::internal)?);
        }
        Ok(())
    })
    .await?;
    let renewed = super::clusters::renewed(app.store.as_ref(), o.name()).await;
    Ok(super::answers::send(
        StatusCode::OK,
        &super::clusters::view(&o, renewed.as_ref()),
    ))
}

/// `GET /api/v1/monitor/realtime`: the fleet now.
pub async fn realtime(app: &App, who: &Identity) -> Result<http::Response<Body>, DroError> {
    may_read_fleet(app, who)?;
    let list = app
        .store
        .list(&keys::well_known::clusters(), &ListOptions::default())
        .await
        .map_err(DroError::internal)?;
    // Pods and traffic are what runs now: a cluster that is not Ready reports nothing, and
    // what it last said is counted apart (`unreachablePods`), not as running.
    let (mut active, mut pods, mut traffic, mut unreachable) = (0usize, 0i64, 0.0f64, 0i64);
    let mut clusters = Vec::new();
    let (mut taken, mut cap) = (
        BTreeMap::<String, f64>::new(),
        BTreeMap::<String, f64>::new(),
    );
    let mut prices = Vec::new();
    for c in &list.items {
        let st = ClusterStatus::of(c);
        let ready = st.ready();
        let spec = orrery_api::cluster::ClusterSpec::of(c);
        prices.push(
            orrery_api::cost::Prices::of(orrery_api::cost::merged(
                &st.properties,
                &spec.properties,
            ))
            .0,
        );
        if ready {
            active += 1;
        }
        let running = st.pods().unwrap_or(0);
        let t = st.traffic();
        if ready {
            pods += running;
            traffic += t;
        } else {
            unreachable += running;
        }
        if ready && let Some(rs) = &st.resource_summary {
            for (res, q) in &rs.allocatable {
                if let Some(d) = cluster::dimension_of(res) {
                    *cap.entry(d.into()).or_default() += q.as_f64();
                    let used = rs
                        .allocated
                        .get(res)
                        .map(|x| x.as_f64())
                        .unwrap_or(0.0)
                        .max(rs.usage.get(res).map(|x| x.as_f64()).unwrap_or(0.0));
                    *taken.entry(d.into()).or_default() += used;
                }
            }
        }
        clusters.push(ClusterNow {
            name: c.name().to_string(),
            ready,
            pods: running,
            water_level: st.water_level.clone(),
            network_bytes_per_second: t,
            hourly_cost: None,
        });
    }
    let fleet: BTreeMap<String, f64> = cap
        .iter()
        .filter(|(_, c)| **c > 0.0)
        .map(|(d, c)| {
            (
                d.clone(),
                ((taken.get(d).copied().unwrap_or(0.0) / c) * 1000.0).round() / 1000.0,
            )
        })
        .collect();
    // What Orrery's replicas cost, as of the newest monitoring sample.
    let cost = match app.store.get(history::series::COST_KEY).await {
        Ok(o) => o
            .spec
            .and_then(|s| serde_json::from_value::<history::series::FleetCost>(s).ok()),
        Err(orrery_store::StoreError::NotFound { .. }) => None,
        Err(e) => return Err(DroError::internal(e)),
    };
    for c in &mut clusters {
        c.hourly_cost = cost.as_ref().and_then(|f| f.clusters.get(&c.name)).copied();
    }
    // Costs are in the currency the priced clusters name; several are not added up as one
    // (Orrery converts none), so the view says which.
    let (currency, currencies) = match orrery_api::cost::fleet_currency(&prices) {
        Ok(c) => (c, Vec::new()),
        Err(several) => (None, several),
    };
    let out = Realtime {
        hourly_cost: cost.as_ref().map(|c| c.hourly),
        cost_time: cost.as_ref().and_then(|c| c.time),
        active_clusters: active,
        total_clusters: list.items.len(),
        total_pods: pods,
        unreachable_pods: unreachable,
        network_traffic: bits_per_second(traffic * 8.0),
        network_bytes_per_second: traffic,
        fleet_water_level: fleet,
        clusters,
        currency: currency.map(|c| c.to_string()),
        currencies: currencies.into_iter().map(|c| c.to_string()).collect(),
    };
    Ok(super::answers::send(StatusCode::OK, &out))
}

/// `1.2Gbps`, as the draft writes traffic.
fn bits_per_second(bps: f64) -> String {
    let units = [("Tbps", 1e12), ("Gbps", 1e9), ("Mbps", 1e6), ("Kbps", 1e3)];
    for (u, f) in units {
        if bps >= f {
            return format!("{:.1}{u}", bps / f);
        }
    }
    format!("{bps:.0}bps")
}

/// `GET /api/v1/history/failures`: failure records, newest first.
pub async fn failures(
    app: &App,
    who: &Identity,
    query: &str,
) -> Result<http::Response<Body>, DroError> {
    may_read_fleet(app, who)?;
    let (start, end, max) = super::history::parse_query(query)?;
    let list = app
        .store
        .list(history::FAILURES_PREFIX, &ListOptions::default())
        .await
        .map_err(DroError::internal)?;
    let mut out: Vec<FailureRecord> = Vec::new();
    for o in list.items.iter().rev() {
        let Some(rec) = o
            .spec
            .clone()
            .and_then(|s| serde_json::from_value::<FailureRecord>(s).ok())
        else {
            continue;
        };
        let t = rec.time.unix_seconds();
        if start.is_some_and(|s| t < s) || end.is_some_and(|x| t > x) {
            continue;
        }
        out.push(rec);
        if out.len() >= max {
            break;
        }
    }
    Ok(super::answers::send(
        StatusCode::OK,
        &FailureHistory {
            count: out.len(),
            entries: out,
        },
    ))
}

/// `GET /api/v1/monitor/history`: the monitoring time series, oldest first (the newest
/// `maxEntries`). `resolution=raw` (default; kept hours) or `5m` (kept weeks); `cluster=NAME`
/// keeps one cluster.
pub async fn series(
    app: &App,
    who: &Identity,
    query: &str,
) -> Result<http::Response<Body>, DroError> {
    may_read_fleet(app, who)?;
    let (mut resolution, mut only) = ("raw".to_string(), None::<String>);
    // The serializer is not `Send`: done with before anything is awaited.
    let rest = {
        let mut rest = form_urlencoded::Serializer::new(String::new());
        for (k, v) in form_urlencoded::parse(query.as_bytes()) {
            match k.as_ref() {
                "resolution" => resolution = v.into_owned(),
                "cluster" => only = Some(v.into_owned()),
                _ => {
                    rest.append_pair(&k, &v);
                }
            }
        }
        rest.finish()
    };
    let prefix = match resolution.as_str() {
        "raw" => history::series::RAW_PREFIX,
        "5m" => history::series::AVERAGE_PREFIX,
        other => {
            return Err(bad(
                format!("resolution must be raw or 5m, got {other:?}"),
                "resolution",
            ));
        }
    };
    let (start, end, max) = super::history::parse_query(&rest)?;
    let list = app
        .store
        .list(prefix, &ListOptions::default())
        .await
        .map_err(DroError::internal)?;
    let mut points: Vec<HistoryPoint> = Vec::new();
    for o in list.items.iter().rev() {
        let Some(mut s) = o
            .spec
            .clone()
            .and_then(|s| serde_json::from_value::<history::series::FleetSample>(s).ok())
        else {
            continue;
        };
        let t = s.time.unix_seconds();
        if start.is_some_and(|x| t < x) || end.is_some_and(|x| t > x) {
            continue;
        }
        if let Some(c) = &only {
            s.clusters.retain(|name, _| name == c);
        }
        let ready: Vec<f64> = s
            .clusters
            .values()
            .filter(|c| c.ready)
            .map(|c| c.level)
            .collect();
        let mean = if ready.is_empty() {
            0.0
        } else {
            ready.iter().sum::<f64>() / ready.len() as f64
        };
        let cost = history::series::FleetCost::of(&s);
        points.push(HistoryPoint {
            time: s.time,
            mean_level: (mean * 1000.0).round() / 1000.0,
            clusters: s.clusters,
            hourly_cost: (!cost.clusters.is_empty()).then_some(cost.hourly),
        });
        if points.len() >= max {
            break;
        }
    }
    points.reverse();
    Ok(super::answers::send(
        StatusCode::OK,
        &MonitorHistory {
            resolution,
            count: points.len(),
            points,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traffic_reads_like_the_draft() {
        assert_eq!(bits_per_second(1.2e9), "1.2Gbps");
        assert_eq!(bits_per_second(2_500_000.0), "2.5Mbps");
        assert_eq!(bits_per_second(12.0), "12bps");
    }
}
