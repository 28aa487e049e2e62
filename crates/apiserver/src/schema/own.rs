//! OpenAPI schemas of Orrery's own kinds whose fields are specified. Kinds not listed here are
//! served with an open schema until their feature defines them.

use serde_json::{Value, json};

use super::{OBJECT_META, QUANTITY, gvk, reference};

fn string(description: &str) -> Value {
    json!({ "type": "string", "description": description })
}

fn strings(description: &str) -> Value {
    json!({ "type": "array", "items": { "type": "string" }, "description": description })
}

fn quantities(description: &str) -> Value {
    json!({ "type": "object", "additionalProperties": reference(QUANTITY), "description": description })
}

fn conditions() -> Value {
    json!({
        "type": "array",
        "description": "The latest observations of the object's state.",
        "items": {
            "type": "object",
            "required": ["type", "status"],
            "properties": {
                "type": string("Type of condition, e.g. Ready."),
                "status": { "type": "string", "enum": ["True", "False", "Unknown"] },
                "reason": string("A CamelCase reason for the last transition."),
                "message": string("A human-readable message about the last transition."),
                "lastTransitionTime": { "type": "string", "format": "date-time" },
                "observedGeneration": { "type": "integer", "format": "int64" },
            },
        },
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
    })
}

fn kind(
    group: &str,
    version: &str,
    kind: &str,
    description: &str,
    spec: Value,
    status: Option<Value>,
) -> Value {
    let mut props = json!({
        "apiVersion": string("The versioned schema of this representation of an object."),
        "kind": string("The REST resource this object represents."),
        "metadata": { "allOf": [reference(OBJECT_META)], "default": {} },
        "spec": spec,
    });
    if let Some(s) = status {
        props["status"] = s;
    }
    json!({
        "description": description,
        "type": "object",
        "properties": props,
        "x-kubernetes-group-version-kind": gvk(group, version, kind),
    })
}

fn cluster() -> Value {
    let taint = json!({
        "type": "object",
        "required": ["key", "effect"],
        "properties": {
            "key": string("The taint key."),
            "value": string("The taint value."),
            "effect": { "type": "string", "enum": ["NoSchedule", "PreferNoSchedule", "NoExecute"] },
            "timeAdded": { "type": "string", "format": "date-time" },
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
                "properties": { "namespace": { "type": "string" }, "name": { "type": "string" } },
            },
            "provider": string("The cloud provider, e.g. aws, gcp, azure, on-prem."),
            "region": string("The region the member runs in."),
            "zones": strings("The zones the member spans."),
            "capabilities": strings("What the member offers workloads, e.g. gpu, tls-encryption."),
            "taints": { "type": "array", "items": taint, "description": "Taints keep workloads away unless they tolerate them." },
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
            "lastHeartbeatTime": { "type": "string", "format": "date-time" },
        },
    });
    kind(
        "multicluster.io",
        "v1alpha1",
        "Cluster",
        "A member cluster of the fleet.",
        spec,
        Some(status),
    )
}

fn work() -> Value {
    let identifier = json!({
        "type": "object",
        "properties": {
            "ordinal": { "type": "integer" },
            "group": { "type": "string" }, "version": { "type": "string" }, "kind": { "type": "string" },
            "namespace": { "type": "string" }, "name": { "type": "string" },
        },
    });
    let spec = json!({
        "type": "object",
        "properties": {
            "workload": {
                "type": "object",
                "properties": {
                    "manifests": {
                        "type": "array",
                        "description": "The objects to apply to the member.",
                        "items": { "type": "object", "x-kubernetes-preserve-unknown-fields": true, "x-kubernetes-embedded-resource": true },
                    },
                },
            },
            "conflictResolution": { "type": "string", "enum": ["Abort", "Overwrite"], "default": "Abort",
                                    "description": "What to do when the member already has an object Orrery does not manage." },
            "preserveResourcesOnDeletion": { "type": "boolean", "description": "Keep the objects in the member when the Work goes." },
        },
    });
    let status = json!({
        "type": "object",
        "properties": {
            "conditions": conditions(),
            "observedGeneration": { "type": "integer", "format": "int64" },
            "manifestStatuses": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "identifier": identifier,
                        "applied": { "type": "boolean" },
                        "health": { "type": "string", "enum": ["Healthy", "Progressing", "Unhealthy", "Unknown"] },
                        "status": { "type": "object", "x-kubernetes-preserve-unknown-fields": true },
                        "message": { "type": "string" },
                    },
                },
            },
        },
    });
    kind(
        "multicluster.io",
        "v1alpha1",
        "Work",
        "The objects one member cluster must run, and their status there.",
        spec,
        Some(status),
    )
}

fn cluster_profile() -> Value {
    let spec = json!({
        "type": "object",
        "properties": {
            "displayName": string("A human-readable name of the cluster."),
            "clusterManager": { "type": "object", "required": ["name"],
                                "properties": { "name": string("The manager of the cluster (orrery).") } },
        },
    });
    let status = json!({
        "type": "object",
        "properties": {
            "conditions": conditions(),
            "version": { "type": "object", "properties": { "kubernetes": { "type": "string" } } },
            "properties": { "type": "array", "items": { "type": "object", "required": ["name", "value"], "properties": {
                "name": { "type": "string" }, "value": { "type": "string" },
                "lastObservedTime": { "type": "string", "format": "date-time" } } } },
        },
    });
    kind(
        "multicluster.x-k8s.io",
        "v1alpha1",
        "ClusterProfile",
        "A cluster's inventory entry (KEP-4322), kept by Orrery from its Cluster.",
        spec,
        Some(status),
    )
}

fn cluster_property() -> Value {
    let mut s = kind(
        "about.k8s.io",
        "v1alpha1",
        "ClusterProperty",
        "A property of the cluster it is stored in (KEP-2149), e.g. cluster.clusterset.k8s.io.",
        json!({ "type": "object" }),
        None,
    );
    if let Some(p) = s["properties"].as_object_mut() {
        p.remove("spec");
        p.insert(
            "spec".into(),
            json!({ "type": "object", "required": ["value"], "properties": {
                "value": { "type": "string", "maxLength": 128000 } } }),
        );
    }
    s
}

/// Schemas of own kinds, by kind (keyed by the component name the registry gives them).
pub fn schemas() -> Vec<(&'static str, &'static str, Value)> {
    vec![
        ("multicluster.io", "Cluster", cluster()),
        ("multicluster.io", "Work", work()),
        ("multicluster.x-k8s.io", "ClusterProfile", cluster_profile()),
        ("about.k8s.io", "ClusterProperty", cluster_property()),
    ]
}
