//! The Cluster: a member of the fleet.

use serde_json::{Value, json};

use super::openapi::{self, conditions, quantities, string, strings};
use super::{AGE, Column, Descriptor, Schema};
use crate::Object;
use crate::cluster;
use crate::validation::ErrorList;

/// Unregistering a cluster cleans up its namespace, Works and tokens first (its finalizer).
pub const CLUSTER: Descriptor = Descriptor {
    group: "multicluster.io",
    version: "v1alpha1",
    also_served: &[],
    kind: "Cluster",
    plural: "clusters",
    namespaced: false,
    short_names: &["cl"],
    status: true,
    description: "A member cluster of the fleet.",
    schema: Schema::Written(schema),
    columns: COLUMNS,
    validate: Some(validate),
    spec_immutable: false,
    finalizer: Some(cluster::FINALIZER),
    on_status: Some(on_status),
};

const COLUMNS: &[Column] = &[
    Column::new(
        "Mode",
        "string",
        ".spec.syncMode",
        0,
        "How Works reach the cluster (Push or Pull)",
    ),
    Column::new(
        "Ready",
        "string",
        ".status.conditions[?(@.type==\"Ready\")].status",
        0,
        "Whether the cluster is ready",
    ),
    Column::new(
        "Region",
        "string",
        ".spec.region",
        0,
        "The cluster's region",
    ),
    Column::new(
        "Water-Level",
        "string",
        ".status.waterLevel.overall",
        0,
        "The cluster's overall Resource Water Level",
    )
    .level(),
    AGE,
    // `-o wide`.
    Column::new(
        "Provider",
        "string",
        ".spec.provider",
        1,
        "The cluster's provider",
    ),
    Column::new("Zones", "string", ".spec.zones[*]", 1, "The zones it spans"),
    Column::new(
        "Version",
        "string",
        ".status.kubernetesVersion",
        1,
        "The member's Kubernetes version",
    ),
    Column::new(
        "Nodes",
        "integer",
        ".status.nodeSummary.readyNum",
        1,
        "Ready nodes",
    ),
    Column::new(
        "CPU",
        "string",
        ".status.waterLevel.cpu",
        1,
        "CPU water level",
    ),
    Column::new(
        "Memory",
        "string",
        ".status.waterLevel.memory",
        1,
        "Memory water level",
    ),
    Column::new(
        "Taints",
        "string",
        ".spec.taints[*].key",
        1,
        "The cluster's taints",
    ),
];

fn validate(obj: &Object, _: Option<&Object>) -> ErrorList {
    let mut errs = cluster::validate_name(obj.name());
    errs.extend(cluster::validate_spec(obj.spec.as_ref()));
    errs.extend(cluster::validate_status(obj.status.as_ref()));
    errs
}

/// Server-owned parts of a status write: the water levels are computed here from what
/// its member reports, and a heartbeat is stamped with the server's clock (so members' clocks
/// do not decide their health).
fn on_status(old_status: Option<&Value>, new_status: &mut Option<Value>) {
    let Some(Value::Object(status)) = new_status.as_mut() else {
        return;
    };
    // Read in place: a copy of the summary first cost as much as parsing it.
    let summary = status
        .get("resourceSummary")
        .and_then(|v| <cluster::ResourceSummary as serde::Deserialize>::deserialize(v).ok());
    match summary {
        Some(s) => {
            let wl = serde_json::to_value(cluster::water_level(&s)).unwrap_or(Value::Null);
            status.insert("waterLevel".into(), wl);
        }
        None => {
            status.remove("waterLevel");
        }
    }
    // So is the monitoring system's forecast.
    if let Some(f) = old_status
        .and_then(|s| s.get("forecast"))
        .filter(|f| !f.is_null())
        && !status.contains_key("forecast")
    {
        status.insert("forecast".into(), f.clone());
    }
    let before = old_status.and_then(|s| s.get("lastHeartbeatTime")).cloned();
    if let Some(hb) = status.get("lastHeartbeatTime")
        && !hb.is_null()
        && Some(hb) != before.as_ref()
    {
        // To the microsecond: heartbeats a second apart or less must each be told apart
        // (whole seconds made two beats in one second look like one, and a silent member
        // was declared Unknown up to a second before its grace period ended).
        status.insert(
            "lastHeartbeatTime".into(),
            json!(crate::MicroTime::now().to_string()),
        );
    }
}

/// The Cluster's schema: a data table (a schema literal).
fn schema(d: &Descriptor) -> Value {
    let taint = json!({
        "type": "object",
        "required": ["key", "effect"],
        "properties": {
            "key": string("The taint key."),
            "value": string("The taint value."),
            "effect": { "type": "string", "enum": ["NoSchedule", "PreferNoSchedule", "NoExecute"],
                        "description": "What the taint does to workloads that do not tolerate it." },
            "timeAdded": { "type": "string", "format": "date-time", "description": "When the taint was added." },
        },
    });
    let spec = json!({
        "type": "object",
        "description": "How to reach the member cluster and what it offers.",
        "properties": {
            "syncMode": { "type": "string", "enum": ["Pull", "Push"], "default": "Pull",
                          "description": "Pull: the member's agent dials in and applies its Works. Push: the server applies Works to apiEndpoint." },
            "apiEndpoint": string("The member's Kubernetes API URL (Push mode; informational in Pull mode)."),
            "secretRef": {
                "type": "object",
                "description": "The Secret holding push-mode credentials: a kubeconfig under the key `kubeconfig`.",
                "properties": { "namespace": string("The Secret's namespace."), "name": string("The Secret's name.") },
            },
            "provider": string("The cloud provider, e.g. aws, gcp, azure, on-prem."),
            "region": string("The region the member runs in."),
            "zones": strings("The zones the member spans."),
            "capabilities": strings("What the member offers workloads, e.g. gpu, tls-encryption."),
            "taints": { "type": "array", "items": taint, "description": "Taints keep workloads away unless they tolerate them." },
            "properties": { "type": "object", "additionalProperties": { "type": "string" },
                            "description": "Orrery's: properties over those the member reports, key by key, e.g. prices (cost.orrery.io/cpu-core-hour, cost.orrery.io/memory-gib-hour, cost.orrery.io/gpu-hour, cost.orrery.io/egress-per-gib, cost.orrery.io/capacity-type: on-demand or spot, cost.orrery.io/interruption-rate)." },
        },
    });
    let status = json!({
        "type": "object",
        "description": "What the member last reported, and its health as the control plane sees it.",
        "properties": {
            "conditions": conditions(),
            "kubernetesVersion": string("The member's Kubernetes version."),
            "apiEnablements": {
                "type": "array",
                "description": "The group/versions and resources the member serves.",
                "items": {
                    "type": "object",
                    "properties": {
                        "groupVersion": { "type": "string" },
                        "resources": { "type": "array", "items": { "type": "object", "properties": {
                            "name": { "type": "string" }, "kind": { "type": "string" } } } },
                    },
                },
            },
            "nodeSummary": {
                "type": "object",
                "properties": {
                    "totalNum": { "type": "integer", "minimum": 0 },
                    "readyNum": { "type": "integer", "minimum": 0 },
                },
            },
            "resourceSummary": {
                "type": "object",
                "properties": {
                    "allocatable": quantities("What the nodes can give to pods."),
                    "allocated": quantities("Requests of the pods placed on nodes."),
                    "allocating": quantities("Requests of the pods waiting for a node."),
                    "usage": quantities("What is in use, background load included."),
                },
            },
            "waterLevel": {
                "type": "object",
                "description": "Resource Water Levels (used / allocatable) per dimension and overall; computed by the server.",
                "additionalProperties": { "type": "number" },
            },
            "largestNodeFree": quantities("The most free cpu, memory and gpu on any single node."),
            "network": {
                "type": "object",
                "properties": {
                    "latencyMs": { "type": "object", "additionalProperties": { "type": "number" } },
                    "ingressBytesPerSecond": { "type": "number" },
                    "egressBytesPerSecond": { "type": "number" },
                    "bandwidthBytesPerSecond": { "type": "integer", "format": "int64",
                                                 "description": "The member's data uplink, which volume transfers share." },
                    "pathBandwidthBytesPerSecond": { "type": "object", "additionalProperties": { "type": "integer", "format": "int64" },
                                                     "description": "What the path to another cluster carries, by name, where it is slower than both uplinks." },
                    "serverLatencyMs": { "type": "number", "description": "Round trip from the member's agent to the control plane (the lowest of its recent heartbeats)." },
                    "estimatedLatencyMs": { "type": "object", "additionalProperties": { "type": "number" },
                                            "description": "No longer kept (earlier versions stored an estimate for every other cluster here): the latency between clusters neither end measures is the sum of both ends' serverLatencyMs." },
                },
            },
            "storageClasses": strings("The storage classes the member offers; the first is its default."),
            "caBundleHash": { "type": "string", "description": "The SHA-256 (hex) of the CA bundle the member's agent trusts, as /cacerts serves it; a CA rotation switches once every connected agent trusts the new CA." },
            "dataSets": {
                "type": "array",
                "description": "The copies of data sets the member holds: its claims labelled orrery.io/dataset.",
                "items": {
                    "type": "object",
                    "properties": {
                        "namespace": { "type": "string" },
                        "name": { "type": "string", "description": "The data set." },
                        "claim": { "type": "string", "description": "The claim holding it." },
                        "bytes": { "type": "integer", "format": "int64" },
                        "dataVersion": { "type": "integer", "format": "int64" },
                    },
                },
            },
            "serviceExports": {
                "type": "array",
                "description": "The ServiceExports the member made of its own (KEP-1645): each exports the member's Service of that name.",
                "items": {
                    "type": "object",
                    "properties": {
                        "namespace": { "type": "string" },
                        "name": { "type": "string" },
                        "created": { "type": "string", "description": "The export's creationTimestamp in the member." },
                        "service": { "type": "object", "x-kubernetes-preserve-unknown-fields": true,
                                     "description": "What the Service exports: ports, headless, sessionAffinity." },
                        "invalid": { "type": "array", "items": { "type": "string" },
                                     "description": "Why it cannot be exported: reason and message." },
                        "endpoints": { "type": "object", "x-kubernetes-preserve-unknown-fields": true,
                                       "description": "The Service's endpoints in the member." },
                        "exported": {
                            "type": "object",
                            "description": "The export's exportedLabels and exportedAnnotations, for its import.",
                            "properties": {
                                "exportedLabels": { "type": "object", "additionalProperties": { "type": "string" } },
                                "exportedAnnotations": { "type": "object", "additionalProperties": { "type": "string" } },
                            },
                        },
                    },
                },
            },
            "metrics": {
                "type": "object",
                "description": "The last report of PUT /api/v1/metrics.",
                "properties": {
                    "timestamp": { "type": "string", "format": "date-time" },
                    "cpuUsage": { "type": "number" },
                    "memoryAvailable": { "type": "number" },
                    "gpuUsage": { "type": "number" },
                    "pods": { "type": "integer" },
                    "networkTraffic": { "type": "number" },
                },
            },
            "properties": { "type": "object", "additionalProperties": { "type": "string" },
                            "description": "ClusterProperty values (KEP-2149) the member reports." },
            "forecast": {
                "type": "object",
                "description": "The monitoring system's forecast of the cluster's water levels: the highest mean level of the next hour (written by the control plane).",
                "properties": {
                    "time": { "type": "string", "format": "date-time", "description": "When the forecast was made." },
                    "horizonSeconds": { "type": "integer", "format": "int64", "description": "How far the peak is looked for: an hour, or less where the forecast reaches less far." },
                    "peak": { "type": "number", "description": "The highest mean water level forecast over the horizon, of any dimension." },
                    "peakDimension": { "type": "string", "description": "Its dimension." },
                    "peakTime": { "type": "string", "format": "date-time", "description": "When it comes." },
                    "peakUpperBound": { "type": "number", "description": "The upper end of that step's 80 % interval." },
                    "model": { "type": "string", "description": "The model of that dimension's series." },
                    "historySeconds": { "type": "integer", "format": "int64", "description": "Seconds of history the forecast was made from; the scheduler reads it once that is a season." },
                    "seasonSeconds": { "type": "integer", "format": "int64", "description": "The season the models were given." },
                },
            },
            "lastHeartbeatTime": { "type": "string", "format": "date-time" },
        },
    });
    openapi::kind(d, spec, Some(status))
}
