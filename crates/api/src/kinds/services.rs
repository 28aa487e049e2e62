//! Multi-cluster services (KEP-1645): ServiceExports and the ServiceImports made from them.

use serde_json::{Value, json};

use super::openapi::{self, conditions, string};
use super::{AGE, Column, Descriptor, Schema};
use crate::services::{EXPORT_KIND, EXPORT_PLURAL, GROUP, IMPORT_KIND, IMPORT_PLURAL};

pub const SERVICE_EXPORT: Descriptor = Descriptor {
    group: GROUP,
    version: crate::services::VERSION,
    also_served: &[crate::services::VERSION_V1ALPHA1],
    kind: EXPORT_KIND,
    plural: EXPORT_PLURAL,
    namespaced: true,
    short_names: &["svcex", "svcexport"],
    status: true,
    description: "Exports a Service to the ClusterSet (KEP-1645). Conditions: Valid (the Service exists and can be exported), Ready (exported, and from where), Conflict (the members' Services disagree; the oldest export wins). Annotations: multicluster.orrery.io/traffic-policy (PreferLocal, LowestLatency, Weighted) and multicluster.orrery.io/consumer-selector (a label selector over Clusters that import it).",
    schema: Schema::Written(export_schema),
    columns: EXPORT_COLUMNS,
    validate: None,
    spec_immutable: false,
    finalizer: None,
    on_status: None,
};

pub const SERVICE_IMPORT: Descriptor = Descriptor {
    group: GROUP,
    version: crate::services::VERSION,
    also_served: &[crate::services::VERSION_V1ALPHA1],
    kind: IMPORT_KIND,
    plural: IMPORT_PLURAL,
    namespaced: true,
    short_names: &["svcim", "svcimport"],
    status: true,
    description: "A Service exported to the ClusterSet (KEP-1645): its type, ports, ClusterSet IP and the clusters it is exported from. Orrery writes it from the ServiceExports and distributes it to the consuming clusters with its EndpointSlices.",
    schema: Schema::Written(import_schema),
    columns: IMPORT_COLUMNS,
    validate: None,
    spec_immutable: false,
    finalizer: None,
    on_status: None,
};

const EXPORT_COLUMNS: &[Column] = &[
    Column::new(
        "Ready",
        "string",
        ".status.conditions[?(@.type==\"Ready\")].status",
        0,
        "Whether the Service is exported",
    ),
    Column::new(
        "Conflict",
        "string",
        ".status.conditions[?(@.type==\"Conflict\")].status",
        0,
        "Whether the exporting clusters' Services disagree",
    ),
    AGE,
];

const IMPORT_COLUMNS: &[Column] = &[
    Column::new(
        "Type",
        "string",
        ".spec.type",
        0,
        "ClusterSetIP or Headless",
    ),
    Column::new("IP", "string", ".spec.ips", 0, "The ClusterSet IP"),
    AGE,
    Column::new(
        "Clusters",
        "string",
        ".status.clusters[*].cluster",
        1,
        "The clusters it is exported from",
    ),
];

fn export_schema(d: &Descriptor) -> Value {
    let labels = |what: &str| json!({ "type": "object", "additionalProperties": { "type": "string" }, "description": what });
    let spec = json!({
        "type": "object",
        "description": "Exports the Service of the same name and namespace from every member cluster that runs it (KEP-1645).",
        "properties": {
            "exportedLabels": labels("Labels the ServiceImport made from this export carries."),
            "exportedAnnotations": labels("Annotations the ServiceImport made from this export carries."),
        },
    });
    let status = json!({
        "type": "object",
        "properties": {
            "conditions": conditions(),
        },
    });
    openapi::kind(d, spec, Some(status))
}

fn import_schema(d: &Descriptor) -> Value {
    let port = json!({
        "type": "object",
        "required": ["port"],
        "properties": {
            "name": string("The port's name (unique within the import)."),
            "protocol": string("TCP, UDP or SCTP."),
            "appProtocol": string("The application protocol."),
            "port": { "type": "integer", "format": "int32", "description": "The port number." },
        },
    });
    let spec = json!({
        "type": "object",
        "description": "The Service as the ClusterSet sees it (written by Orrery from the exports).",
        "properties": {
            "ports": { "type": "array", "items": port, "description": "The exported ports: their union over the exporting clusters." },
            "ips": { "type": "array", "items": { "type": "string" }, "description": "The ClusterSet IP (a ClusterSetIP import)." },
            "type": string("ClusterSetIP or Headless."),
            "sessionAffinity": string("ClientIP or None."),
            "sessionAffinityConfig": { "type": "object", "x-kubernetes-preserve-unknown-fields": true, "description": "Session affinity settings." },
            "ipFamilies": { "type": "array", "items": { "type": "string" }, "description": "IPv4 and/or IPv6." },
            "internalTrafficPolicy": string("Cluster or Local."),
            "trafficDistribution": string("How traffic is distributed among endpoints."),
        },
    });
    let status = json!({
        "type": "object",
        "properties": {
            "clusters": { "type": "array", "items": { "type": "object", "required": ["cluster"],
                "properties": { "cluster": { "type": "string" } } } },
            "conditions": conditions(),
        },
    });
    openapi::kind(d, spec, Some(status))
}
