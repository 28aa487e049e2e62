//! Member clusters (`multicluster.io/v1alpha1` Cluster): spec and status types, their
//! validation, and the Resource Water Level (RWL) arithmetic of the DRO-DS draft.
//!
//! RWL of a dimension d = used_d / allocatable_d, where used is the larger of what pods have
//! requested and what is actually in use (so background load the member reports counts, which
//! Karmada's request-only view misses). The cluster's overall RWL is the maximum over its
//! dimensions; the scheduler takes the maximum over the dimensions a workload needs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::conditions::Condition;
use crate::quantity::Quantity;
use crate::time::{MicroTime, Time};
use crate::validation::{self, ErrorList, FieldError};

pub const GROUP: &str = "multicluster.io";
pub const VERSION: &str = "v1alpha1";
pub const API_VERSION: &str = "multicluster.io/v1alpha1";

/// Works of cluster `x` live in the namespace `orrery-cluster-x`.
pub const NAMESPACE_PREFIX: &str = "orrery-cluster-";
/// A cluster name must leave room for the prefix in a 63-character namespace name.
pub const MAX_NAME_LEN: usize = validation::DNS1123_LABEL_MAX - NAMESPACE_PREFIX.len();

/// Taint for a cluster whose member reports itself unhealthy (Ready=False).
pub const TAINT_NOT_READY: &str = "cluster.multicluster.io/not-ready";
/// Taint for a cluster that stopped reporting (Ready=Unknown).
pub const TAINT_UNREACHABLE: &str = "cluster.multicluster.io/unreachable";

pub const CONDITION_READY: &str = "Ready";
pub const CONDITION_JOINED: &str = "Joined";

/// The finalizer that keeps a Cluster until its namespace, Works and tokens are gone.
pub const FINALIZER: &str = "multicluster.io/cluster-cleanup";

/// Where each cluster's proxy identity lives (a ServiceAccount named after the cluster,
/// allowed `clusters/proxy` of that cluster alone): its tokens are what `orrery credentials`
/// hands a ClusterProfile consumer.
pub const PROXY_NAMESPACE: &str = "orrery-cluster-proxy";

/// Each member's heartbeat Lease (`coordination.k8s.io/v1`, named after the cluster) lives
/// here, as nodes' do in `kube-node-lease`: renewing a small Lease is the heartbeat, and the
/// Cluster's status is written only when it changed (or now and then), so the fleet's
/// heartbeats do not rewrite every Cluster. Not under [`NAMESPACE_PREFIX`]: no cluster's
/// Works namespace can be it.
pub const LEASE_NAMESPACE: &str = "orrery-member-lease";
/// On a member's Lease: the Cluster's resourceVersion after the agent's last status write.
/// A renewal vouches that this status still describes the member at `renewTime`.
pub const LEASE_STATUS_REVISION: &str = "cluster.orrery.io/status-revision";
/// On a member's Lease, written by the server: the agent is asked to write its whole status
/// at its next heartbeat (the server changed the Cluster's conditions, e.g. to Unknown).
pub const LEASE_STATUS_WANTED: &str = "cluster.orrery.io/status-wanted";

/// Resource names of the water level dimensions.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

pub fn namespace_of(cluster: &str) -> String {
    format!("{NAMESPACE_PREFIX}{cluster}")
}

/// The cluster whose Works a namespace holds, if it is such a namespace.
pub fn cluster_of_namespace(ns: &str) -> Option<&str> {
    ns.strip_prefix(NAMESPACE_PREFIX).filter(|c| !c.is_empty())
}

/// What a member's heartbeat Lease says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseBeat {
    /// When the agent last renewed it.
    pub renew_time: Option<MicroTime>,
    /// The Cluster's resourceVersion after the agent's last status write.
    pub status_revision: Option<i64>,
}

impl LeaseBeat {
    pub fn of(lease: &crate::Object) -> LeaseBeat {
        LeaseBeat {
            renew_time: lease
                .spec
                .as_ref()
                .and_then(|s| s.get("renewTime"))
                .and_then(Value::as_str)
                .and_then(|t| t.parse().ok()),
            status_revision: lease
                .metadata
                .annotations
                .get(LEASE_STATUS_REVISION)
                .and_then(|r| r.parse().ok()),
        }
    }
}

pub use crate::meta::ResourceList;

#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum SyncMode {
    /// The member's agent dials in and applies its Works.
    #[default]
    Pull,
    /// The server applies Works to the member's API itself.
    Push,
}

/// A reference to the Secret holding push-mode credentials (a kubeconfig under `kubeconfig`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SecretRef {
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub name: String,
}

#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
pub enum TaintEffect {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
}

impl TaintEffect {
    pub fn as_str(&self) -> &'static str {
        match self {
            TaintEffect::NoSchedule => "NoSchedule",
            TaintEffect::PreferNoSchedule => "PreferNoSchedule",
            TaintEffect::NoExecute => "NoExecute",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Taint {
    pub key: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub value: String,
    pub effect: TaintEffect,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_added: Option<Time>,
}

impl Taint {
    pub fn new(key: &str, effect: TaintEffect, now: Time) -> Self {
        Taint {
            key: key.to_string(),
            value: String::new(),
            effect,
            time_added: Some(now),
        }
    }
}

/// What a member says about itself when it joins (an agent registering, `orrery join`); the
/// same fields land in its Cluster's spec, and the labels on the Cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterFacts {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub provider: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub region: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub zones: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_endpoint: String,
}

impl ClusterFacts {
    /// Writes the facts that belong in a Cluster's spec into it (the labels do not).
    pub fn apply_to_spec(&self, spec: &mut serde_json::Map<String, Value>) {
        if let Ok(Value::Object(m)) = serde_json::to_value(self) {
            spec.extend(m.into_iter().filter(|(k, _)| k != "labels"));
        }
    }
}

/// The body of `POST /agent/v1/register`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Registration {
    pub cluster: String,
    #[serde(default)]
    pub facts: ClusterFacts,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSpec {
    #[serde(default)]
    pub sync_mode: SyncMode,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_endpoint: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretRef>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub provider: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub region: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub zones: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<Taint>,
    /// Orrery's: properties the platform team sets (prices, `cost.orrery.io/...`), over
    /// those the member reports, key by key.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub properties: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSummary {
    #[serde(default)]
    pub total_num: i64,
    #[serde(default)]
    pub ready_num: i64,
}

/// Capacity and its use, summed over the member's nodes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceSummary {
    /// What the nodes can give to pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub allocatable: ResourceList,
    /// Requests of the pods placed on nodes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub allocated: ResourceList,
    /// Requests of the pods waiting for a node.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub allocating: ResourceList,
    /// What is actually in use (background load included), where the member measures it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub usage: ResourceList,
}

/// The API groups/versions and resources a member serves.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiEnablement {
    pub group_version: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<ApiResourceRef>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiResourceRef {
    pub name: String,
    pub kind: String,
}

/// Network figures a member reports.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkStatus {
    /// Round-trip latency in milliseconds to other clusters, by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub latency_ms: BTreeMap<String, f64>,
    #[serde(default)]
    pub ingress_bytes_per_second: f64,
    #[serde(default)]
    pub egress_bytes_per_second: f64,
    /// The member's data uplink, bytes per second (what volume transfers share).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth_bytes_per_second: Option<i64>,
    /// What the path to another cluster carries, bytes per second, by name, where it is
    /// slower than both uplinks (a long-haul route, a congested peering). Elsewhere a path
    /// carries the slower of its two uplinks.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub path_bandwidth_bytes_per_second: BTreeMap<String, i64>,
    /// Round-trip time from the member's agent to the control plane, milliseconds (the
    /// lowest of its recent heartbeats).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_latency_ms: Option<f64>,
}

/// What a domain last reported through `PUT /api/v1/metrics` (the draft's 6.3.1 figures).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MetricsSummary {
    pub timestamp: Time,
    /// Percent of the cpu in use.
    pub cpu_usage: f64,
    /// GiB of memory free.
    pub memory_available: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_usage: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<i64>,
    /// Bytes per second, in and out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_traffic: Option<f64>,
}

/// Water levels per dimension (`cpu`, `memory`, `gpu`, `pods`, `storage`) and overall.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WaterLevel {
    #[serde(flatten)]
    pub dimensions: BTreeMap<String, f64>,
    #[serde(default)]
    pub overall: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kubernetes_version: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub api_enablements: Vec<ApiEnablement>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_summary: Option<NodeSummary>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_summary: Option<ResourceSummary>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub water_level: Option<WaterLevel>,
    /// The most free cpu/memory/gpu on any single node (draft 7.2.2).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub largest_node_free: ResourceList,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkStatus>,
    /// The last report of `PUT /api/v1/metrics`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<MetricsSummary>,
    /// KEP-2149 ClusterProperty values reported by the member, by property name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub properties: BTreeMap<String, String>,
    /// The storage classes the member offers; the first is its default.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub storage_classes: Vec<String>,
    /// The copies of data sets the member holds: its claims labelled `orrery.io/dataset`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub data_sets: Vec<crate::data::HeldDataSet>,
    /// The ServiceExports the member made of its own (KEP-1645), with what they export.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub service_exports: Vec<crate::services::MemberExport>,
    /// The monitoring system's forecast: the next hour's peak (written by the control plane).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forecast: Option<crate::prediction::ForecastSummary>,
    /// The SHA-256 (hex) of the CA bundle the member's agent trusts, as `/cacerts` serves it:
    /// during a CA rotation, the server switches only once every connected agent trusts the
    /// new CA.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ca_bundle_hash: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// When the server last heard the member, to the microsecond.
    pub last_heartbeat_time: Option<MicroTime>,
}

impl ClusterSpec {
    /// A Cluster object's spec (defaults where it is missing or malformed).
    pub fn of(c: &crate::Object) -> ClusterSpec {
        // Read in place: copying the JSON tree first cost more than parsing it.
        c.spec
            .as_ref()
            .and_then(|s| ClusterSpec::deserialize(s).ok())
            .unwrap_or_default()
    }
}

impl ClusterStatus {
    /// A Cluster object's status (defaults where it is missing or malformed).
    pub fn of(c: &crate::Object) -> ClusterStatus {
        c.status
            .as_ref()
            .and_then(|s| ClusterStatus::deserialize(s).ok())
            .unwrap_or_default()
    }

    /// Whether the cluster is Ready.
    pub fn ready(&self) -> bool {
        crate::conditions::find(&self.conditions, CONDITION_READY).is_some_and(|r| r.is_true())
    }

    /// Pods it runs: as last reported through `PUT /api/v1/metrics`, else as placed.
    pub fn pods(&self) -> Option<i64> {
        self.metrics.as_ref().and_then(|m| m.pods).or_else(|| {
            self.resource_summary
                .as_ref()
                .and_then(|r| r.allocated.get("pods"))
                .map(|q| q.value() as i64)
        })
    }

    /// Network traffic in and out, bytes per second.
    pub fn traffic(&self) -> f64 {
        self.network
            .as_ref()
            .map(|n| n.ingress_bytes_per_second + n.egress_bytes_per_second)
            .unwrap_or(0.0)
    }
}

/// The water level dimension of a resource name, if it is one.
pub fn dimension_of(resource: &str) -> Option<&'static str> {
    match resource {
        "cpu" => Some("cpu"),
        "memory" => Some("memory"),
        "pods" => Some("pods"),
        "ephemeral-storage" => Some("storage"),
        r if r == GPU_RESOURCE || r.ends_with("/gpu") => Some("gpu"),
        _ => None,
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The water levels of a resource summary: per dimension, max(allocated, usage) over
/// allocatable (dimensions without allocatable are absent), and the maximum of them.
pub fn water_level(summary: &ResourceSummary) -> WaterLevel {
    let mut dims: BTreeMap<String, f64> = BTreeMap::new();
    for (resource, total) in &summary.allocatable {
        let Some(dim) = dimension_of(resource) else {
            continue;
        };
        if total.nanos() <= 0 {
            continue;
        }
        let zero = Quantity::default();
        let allocated = summary.allocated.get(resource).unwrap_or(&zero);
        let usage = summary.usage.get(resource).unwrap_or(&zero);
        let used = std::cmp::max(allocated, usage).nanos().max(0);
        let level = round3(used as f64 / total.nanos() as f64);
        let slot = dims.entry(dim.to_string()).or_insert(0.0);
        *slot = slot.max(level);
    }
    let overall = dims.values().copied().fold(0.0, f64::max);
    WaterLevel {
        dimensions: dims,
        overall,
    }
}

/// Checks an `http(s)://host[:port][/path]` endpoint.
pub fn check_endpoint(s: &str) -> Result<(), String> {
    let rest = s
        .strip_prefix("https://")
        .or_else(|| s.strip_prefix("http://"))
        .ok_or("must be an http:// or https:// URL")?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.is_empty() {
        return Err("must name a host".into());
    }
    if authority.contains('@') {
        return Err("must not carry credentials (use secretRef)".into());
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, after) = v6.split_once(']').ok_or("unterminated IPv6 address")?;
        (h, after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty()
        || !host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | ':' | '_'))
    {
        return Err(format!("invalid host {host:?}"));
    }
    if let Some(p) = port
        && !p.parse::<u16>().is_ok_and(|p| p > 0)
    {
        return Err(format!("invalid port {p:?}"));
    }
    if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("must not contain whitespace".into());
    }
    Ok(())
}

/// Validates a cluster's name (it becomes part of a namespace name).
pub fn validate_name(name: &str) -> ErrorList {
    let mut errs = Vec::new();
    for m in validation::is_dns1123_label(name) {
        errs.push(FieldError::invalid("metadata.name", name, m));
    }
    if name.len() > MAX_NAME_LEN {
        errs.push(FieldError::invalid(
            "metadata.name",
            name,
            format!(
                "must be no more than {MAX_NAME_LEN} characters, so that its namespace {NAMESPACE_PREFIX}<name> is a valid name"
            ),
        ));
    }
    errs
}

fn str_at<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

/// Validates a Cluster's spec (as JSON, so that errors name the exact field).
pub fn validate_spec(spec: Option<&Value>) -> ErrorList {
    let mut errs = Vec::new();
    let empty = Value::Object(Default::default());
    let spec = spec.unwrap_or(&empty);
    let mode = str_at(spec, "syncMode").unwrap_or("Pull");
    if !matches!(mode, "Pull" | "Push") {
        errs.push(FieldError::not_supported(
            "spec.syncMode",
            mode,
            &["Pull", "Push"],
        ));
    }
    if let Some(ep) = str_at(spec, "apiEndpoint")
        && !ep.is_empty()
        && let Err(m) = check_endpoint(ep)
    {
        errs.push(FieldError::invalid("spec.apiEndpoint", ep, m));
    }
    let secret = spec.get("secretRef").filter(|v| !v.is_null());
    if let Some(r) = secret {
        for f in ["namespace", "name"] {
            let v = str_at(r, f).unwrap_or("");
            if v.is_empty() {
                errs.push(FieldError::required(format!("spec.secretRef.{f}"), ""));
            } else {
                for m in validation::is_dns1123_subdomain(v) {
                    errs.push(FieldError::invalid(format!("spec.secretRef.{f}"), v, m));
                }
            }
        }
    }
    if mode == "Push" && secret.is_none() {
        errs.push(FieldError::required(
            "spec.secretRef",
            "a Push cluster needs the Secret that holds the credentials for its API",
        ));
    }
    for f in ["provider", "region"] {
        if let Some(v) = str_at(spec, f) {
            for m in validation::is_valid_label_value(v) {
                errs.push(FieldError::invalid(format!("spec.{f}"), v, m));
            }
        }
    }
    if let Some(Value::Array(zones)) = spec.get("zones") {
        for (i, z) in zones.iter().enumerate() {
            let z = z.as_str().unwrap_or("");
            for m in validation::is_valid_label_value(z) {
                errs.push(FieldError::invalid(format!("spec.zones[{i}]"), z, m));
            }
        }
    }
    if let Some(Value::Array(caps)) = spec.get("capabilities") {
        for (i, c) in caps.iter().enumerate() {
            let c = c.as_str().unwrap_or("");
            for m in validation::is_qualified_name(c) {
                errs.push(FieldError::invalid(format!("spec.capabilities[{i}]"), c, m));
            }
        }
    }
    if let Some(Value::Array(taints)) = spec.get("taints") {
        errs.extend(validate_taints(taints));
    }
    if let Some(Value::Object(props)) = spec.get("properties") {
        let mut strings = BTreeMap::new();
        for (k, v) in props {
            for m in validation::is_qualified_name(k) {
                errs.push(FieldError::invalid(format!("spec.properties[{k}]"), k, m));
            }
            match v.as_str() {
                Some(s) => {
                    strings.insert(k.clone(), s.to_string());
                }
                None => errs.push(FieldError::invalid(
                    format!("spec.properties[{k}]"),
                    v,
                    "must be a string",
                )),
            }
        }
        crate::cost::validate_properties(&strings, "spec.properties", &mut errs);
    }
    errs
}

fn validate_taints(taints: &[Value]) -> ErrorList {
    let mut errs = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (i, t) in taints.iter().enumerate() {
        let path = format!("spec.taints[{i}]");
        let key = str_at(t, "key").unwrap_or("");
        if key.is_empty() {
            errs.push(FieldError::required(format!("{path}.key"), ""));
        }
        for m in validation::is_qualified_name(key)
            .into_iter()
            .filter(|_| !key.is_empty())
        {
            errs.push(FieldError::invalid(format!("{path}.key"), key, m));
        }
        if let Some(v) = str_at(t, "value") {
            for m in validation::is_valid_label_value(v) {
                errs.push(FieldError::invalid(format!("{path}.value"), v, m));
            }
        }
        let effect = str_at(t, "effect").unwrap_or("");
        if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
            if effect.is_empty() {
                errs.push(FieldError::required(format!("{path}.effect"), ""));
            } else {
                errs.push(FieldError::not_supported(
                    format!("{path}.effect"),
                    effect,
                    &["NoExecute", "NoSchedule", "PreferNoSchedule"],
                ));
            }
        }
        if let Some(at) = str_at(t, "timeAdded")
            && at.parse::<Time>().is_err()
        {
            errs.push(FieldError::invalid(
                format!("{path}.timeAdded"),
                at,
                "must be an RFC 3339 time",
            ));
        }
        if !key.is_empty() && !effect.is_empty() && !seen.insert((key, effect)) {
            errs.push(FieldError::duplicate(
                path.clone(),
                format!("{key}:{effect}"),
            ));
        }
    }
    errs
}

fn validate_resource_list(path: &str, v: &Value, errs: &mut ErrorList) {
    let Value::Object(m) = v else {
        if !v.is_null() {
            errs.push(FieldError::invalid(
                path,
                v,
                "must be a map of resource quantities",
            ));
        }
        return;
    };
    for (name, q) in m {
        let field = format!("{path}[{name}]");
        for msg in validation::is_qualified_name(name) {
            errs.push(FieldError::invalid(&field, name, msg));
        }
        let parsed = match q {
            Value::String(s) => s.parse::<Quantity>().map_err(|e| e.to_string()),
            Value::Number(n) => n.to_string().parse::<Quantity>().map_err(|e| e.to_string()),
            other => Err(format!("must be a quantity, not {other}")),
        };
        match parsed {
            Ok(q) if q.is_negative() => {
                errs.push(FieldError::invalid(&field, q, "must not be negative"))
            }
            Ok(_) => {}
            Err(e) => errs.push(FieldError::invalid(&field, q, e)),
        }
    }
}

/// Validates the figures of a Cluster's status: quantities parse and are not negative,
/// counts are not negative, times parse, conditions have a type and a valid status.
pub fn validate_status(status: Option<&Value>) -> ErrorList {
    let mut errs = Vec::new();
    let Some(status) = status.filter(|s| !s.is_null()) else {
        return errs;
    };
    if let Some(rs) = status.get("resourceSummary").filter(|v| !v.is_null()) {
        for part in ["allocatable", "allocated", "allocating", "usage"] {
            if let Some(v) = rs.get(part) {
                validate_resource_list(&format!("status.resourceSummary.{part}"), v, &mut errs);
            }
        }
    }
    if let Some(v) = status.get("largestNodeFree") {
        validate_resource_list("status.largestNodeFree", v, &mut errs);
    }
    if let Some(ns) = status.get("nodeSummary").filter(|v| !v.is_null()) {
        for f in ["totalNum", "readyNum"] {
            if let Some(n) = ns.get(f)
                && n.as_i64().is_none_or(|n| n < 0)
            {
                errs.push(FieldError::invalid(
                    format!("status.nodeSummary.{f}"),
                    n,
                    "must be a non-negative integer",
                ));
            }
        }
    }
    if let Some(Value::Array(cs)) = status.get("conditions") {
        for (i, c) in cs.iter().enumerate() {
            if str_at(c, "type").unwrap_or("").is_empty() {
                errs.push(FieldError::required(
                    format!("status.conditions[{i}].type"),
                    "",
                ));
            }
            let s = str_at(c, "status").unwrap_or("");
            if !matches!(s, "True" | "False" | "Unknown") {
                errs.push(FieldError::not_supported(
                    format!("status.conditions[{i}].status"),
                    s,
                    &["False", "True", "Unknown"],
                ));
            }
        }
    }
    if let Some(t) = status.get("lastHeartbeatTime").and_then(Value::as_str)
        && t.parse::<Time>().is_err()
    {
        errs.push(FieldError::invalid(
            "status.lastHeartbeatTime",
            t,
            "must be an RFC 3339 time",
        ));
    }
    if errs.is_empty()
        && let Err(e) = ClusterStatus::deserialize(status)
    {
        errs.push(FieldError::invalid("status", "", e.to_string()));
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn q(s: &str) -> Quantity {
        s.parse().unwrap()
    }

    #[test]
    fn water_levels_take_the_larger_of_requests_and_usage() {
        let s = ResourceSummary {
            allocatable: [
                ("cpu".to_string(), q("10")),
                ("memory".to_string(), q("100Gi")),
                ("pods".to_string(), q("110")),
                (GPU_RESOURCE.to_string(), q("0")),
                ("example.com/widget".to_string(), q("5")),
            ]
            .into(),
            allocated: [
                ("cpu".to_string(), q("2500m")),
                ("memory".to_string(), q("10Gi")),
            ]
            .into(),
            allocating: [("cpu".to_string(), q("50"))].into(),
            usage: [
                ("cpu".to_string(), q("4")),
                ("memory".to_string(), q("5Gi")),
            ]
            .into(),
        };
        let wl = water_level(&s);
        assert_eq!(wl.dimensions["cpu"], 0.4, "usage above requests wins");
        assert_eq!(wl.dimensions["memory"], 0.1, "requests above usage win");
        assert_eq!(wl.dimensions["pods"], 0.0);
        assert!(
            !wl.dimensions.contains_key("gpu"),
            "no gpu capacity, no gpu level"
        );
        assert_eq!(
            wl.dimensions.len(),
            3,
            "unknown resources are not dimensions"
        );
        assert_eq!(wl.overall, 0.4, "pending requests do not count");
        let j = serde_json::to_value(&wl).unwrap();
        assert_eq!(
            j,
            json!({"cpu": 0.4, "memory": 0.1, "pods": 0.0, "overall": 0.4})
        );
        assert_eq!(water_level(&ResourceSummary::default()).overall, 0.0);
    }

    #[test]
    fn endpoints() {
        for ok in [
            "https://k8s.gcp.example",
            "https://10.0.0.1:6443",
            "http://localhost:8080/base",
            "https://[::1]:6443",
        ] {
            assert!(check_endpoint(ok).is_ok(), "{ok}");
        }
        for bad in [
            "k8s.example",
            "ftp://x",
            "https://",
            "https://user:pw@host",
            "https://host:99999",
            "https://host:0",
            "https://ho st",
            "https://[::1",
        ] {
            assert!(check_endpoint(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn names_fit_in_a_namespace() {
        assert!(validate_name("gcp-production").is_empty());
        assert!(!validate_name("Upper").is_empty());
        assert!(!validate_name(&"a".repeat(49)).is_empty());
        assert!(validate_name(&"a".repeat(48)).is_empty());
        assert_eq!(namespace_of("east"), "orrery-cluster-east");
        assert_eq!(cluster_of_namespace("orrery-cluster-east"), Some("east"));
        assert_eq!(cluster_of_namespace("orrery-cluster-"), None);
        assert_eq!(cluster_of_namespace("default"), None);
    }

    #[test]
    fn spec_validation() {
        let cases: Vec<(Value, Vec<&str>)> = vec![
            (json!({}), vec![]),
            (
                json!({"syncMode": "Pull", "region": "us-east-1", "zones": ["us-east-1a"],
                       "capabilities": ["gpu", "tls-encryption"], "provider": "aws",
                       "taints": [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]}),
                vec![],
            ),
            (json!({"syncMode": "Sideways"}), vec!["spec.syncMode"]),
            (
                json!({"properties": {"cost.orrery.io/cpu-core-hour": "0.04",
                                      "cost.orrery.io/capacity-type": "spot",
                                      "cost.orrery.io/interruption-rate": "0.05",
                                      "tier": "gold"}}),
                vec![],
            ),
            (
                json!({"properties": {"cost.orrery.io/cpu-core-hour": "cheap"}}),
                vec!["spec.properties[cost.orrery.io/cpu-core-hour]"],
            ),
            (
                json!({"properties": {"cost.orrery.io/capacity-type": "reserved", "n": 1}}),
                vec![
                    "spec.properties[n]",
                    "spec.properties[cost.orrery.io/capacity-type]",
                ],
            ),
            (
                json!({"properties": {"bad key!": "x"}}),
                vec!["spec.properties[bad key!]"],
            ),
            (json!({"syncMode": "Push"}), vec!["spec.secretRef"]),
            (
                json!({"syncMode": "Push", "secretRef": {"namespace": "x", "name": ""}}),
                vec!["spec.secretRef.name"],
            ),
            (
                json!({"apiEndpoint": "not a url"}),
                vec!["spec.apiEndpoint"],
            ),
            (json!({"region": "us east"}), vec!["spec.region"]),
            (json!({"zones": ["ok", "not ok"]}), vec!["spec.zones[1]"]),
            (
                json!({"capabilities": ["-bad"]}),
                vec!["spec.capabilities[0]"],
            ),
            (
                json!({"taints": [{"key": "a", "effect": "Sometimes"}, {"effect": "NoSchedule"}]}),
                vec!["spec.taints[0].effect", "spec.taints[1].key"],
            ),
            (
                json!({"taints": [{"key": "a", "effect": "NoSchedule"}, {"key": "a", "effect": "NoSchedule"}]}),
                vec!["spec.taints[1]"],
            ),
            (
                json!({"taints": [{"key": "a", "effect": "NoExecute", "timeAdded": "yesterday"}]}),
                vec!["spec.taints[0].timeAdded"],
            ),
        ];
        for (spec, fields) in cases {
            let errs = validate_spec(Some(&spec));
            let got: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
            assert_eq!(got, fields, "{spec}");
        }
    }

    #[test]
    fn status_validation() {
        let good = json!({
            "conditions": [{"type": "Ready", "status": "True", "reason": "AgentReady"}],
            "resourceSummary": {"allocatable": {"cpu": "32", "memory": "128Gi", "pods": 110}},
            "nodeSummary": {"totalNum": 8, "readyNum": 8},
            "largestNodeFree": {"cpu": "4"},
            "lastHeartbeatTime": "2026-01-01T00:00:00Z",
        });
        assert!(
            validate_status(Some(&good)).is_empty(),
            "{:?}",
            validate_status(Some(&good))
        );
        let cases = [
            (
                json!({"resourceSummary": {"allocatable": {"cpu": "lots"}}}),
                "status.resourceSummary.allocatable[cpu]",
            ),
            (
                json!({"resourceSummary": {"allocated": {"cpu": "-1"}}}),
                "status.resourceSummary.allocated[cpu]",
            ),
            (
                json!({"resourceSummary": {"usage": {"cpu": true}}}),
                "status.resourceSummary.usage[cpu]",
            ),
            (
                json!({"largestNodeFree": "all of it"}),
                "status.largestNodeFree",
            ),
            (
                json!({"nodeSummary": {"totalNum": -3}}),
                "status.nodeSummary.totalNum",
            ),
            (
                json!({"conditions": [{"type": "Ready", "status": "Yes"}]}),
                "status.conditions[0].status",
            ),
            (
                json!({"lastHeartbeatTime": "noon"}),
                "status.lastHeartbeatTime",
            ),
            (json!({"waterLevel": "high"}), "status"),
        ];
        for (status, field) in cases {
            let errs = validate_status(Some(&status));
            assert_eq!(errs.len(), 1, "{status}: {errs:?}");
            assert_eq!(errs[0].field, field, "{status}");
        }
    }

    #[test]
    fn facts_go_into_the_spec_but_not_the_labels() {
        let facts = ClusterFacts {
            region: "eu".into(),
            zones: vec!["a".into()],
            labels: [("k".to_string(), "v".to_string())].into(),
            ..Default::default()
        };
        let mut spec = serde_json::Map::new();
        spec.insert("syncMode".into(), json!("Pull"));
        facts.apply_to_spec(&mut spec);
        assert_eq!(
            Value::Object(spec),
            json!({"syncMode": "Pull", "region": "eu", "zones": ["a"]})
        );
        let r: Registration = serde_json::from_value(json!({"cluster": "x"})).unwrap();
        assert_eq!(r.facts, ClusterFacts::default());
        assert!(
            serde_json::from_value::<Registration>(json!({"cluster": "x", "facts": {"colour": 1}}))
                .is_err()
        );
    }

    #[test]
    fn typed_round_trip() {
        let spec: ClusterSpec = serde_json::from_value(json!({
            "syncMode": "Push", "secretRef": {"namespace": "orrery-system", "name": "east"},
            "taints": [{"key": TAINT_UNREACHABLE, "effect": "NoSchedule", "timeAdded": "2026-01-01T00:00:00Z"}]
        }))
        .unwrap();
        assert_eq!(spec.sync_mode, SyncMode::Push);
        assert_eq!(spec.taints[0].effect, TaintEffect::NoSchedule);
        let back = serde_json::to_value(&spec).unwrap();
        assert_eq!(back["taints"][0]["timeAdded"], "2026-01-01T00:00:00Z");
        assert!(back.get("zones").is_none());
    }
}
