//! OpenAPI schemas of Orrery's own kinds: generated from the Rust types for the kinds users
//! write (policies, interpreters) and for bindings, written out here for the rest.

use serde_json::{Value, json};

use orrery_api::binding::{BindingSpec, BindingStatus};
use orrery_api::interpret::InterpreterSpec;
use orrery_api::overrides::{DraftOverrideSpec, KarmadaOverrideSpec};
use orrery_api::policy::{PlacementPolicySpec, PolicyStatus, PropagationSpec};

use super::generated::{open_schema_of, schema_of};
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

/// The Cluster's schema: a data table (a schema literal).
fn cluster() -> Value {
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
                "description": "What the member runs.",
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
            "transfers": { "type": "array", "items": transfer(),
                           "description": "Volume transfers the member takes part in (Orrery's data mover), carried out by its agent." },
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
                        "volumes": { "type": "array", "items": volume_status(),
                                     "description": "The persistent volumes the object's pods use." },
                    },
                },
            },
            "transfers": { "type": "array", "items": transfer_status(),
                           "description": "Where each of the spec's transfers stands." },
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

fn int(description: &str) -> Value {
    json!({ "type": "integer", "format": "int64", "description": description })
}

fn volume_status() -> Value {
    json!({
        "type": "object",
        "required": ["name"],
        "properties": {
            "name": string("The PersistentVolumeClaim's name."),
            "ordinal": int("The StatefulSet ordinal it belongs to."),
            "capacity": reference(QUANTITY),
            "storageClass": string("Its storage class."),
            "usedBytes": int("Bytes of data it holds."),
            "dataVersion": int("Changes whenever data is written."),
            "startedVersion": int("The data version when the pod now using it started."),
        },
    })
}

fn transfer_volume() -> Value {
    json!({
        "type": "object",
        "required": ["name"],
        "properties": {
            "name": string("The PersistentVolumeClaim's name."),
            "ordinal": int("The StatefulSet ordinal it belongs to."),
            "capacity": reference(QUANTITY),
            "storageClass": string("Its storage class."),
            "bytes": int("Receive: the bytes this round copies."),
            "dataVersion": int("Receive: the source's data version at this round's snapshot."),
            "usedBytes": int("Receive: the volume's size at that snapshot."),
            "baseVersion": int("Receive: the data version the round applies on top of (0: a full copy)."),
        },
    })
}

fn transfer() -> Value {
    json!({
        "type": "object",
        "required": ["id", "role", "namespace", "peer", "round", "volumes"],
        "properties": {
            "id": string("Names the transfer."),
            "role": { "type": "string", "enum": ["Send", "Receive"],
                      "description": "Send: snapshots per round; Receive: copies each round from the peer." },
            "namespace": string("The namespace of the volumes."),
            "peer": string("The cluster at the other end."),
            "round": { "type": "integer", "minimum": 0, "description": "The round wanted." },
            "afterFence": { "type": "boolean", "description": "Send: snapshot only once the workload's pods have stopped." },
            "workload": string("Send: the workload whose pods must have stopped (Kind/name)."),
            "volumes": { "type": "array", "items": transfer_volume(), "description": "The volumes transferred." },
            "rate": int("Receive: bytes per second the path allows."),
            "holdWorkload": { "type": "boolean", "description": "Receive: the Work's manifests wait until this round is in." },
        },
    })
}

fn transfer_status() -> Value {
    json!({
        "type": "object",
        "required": ["id", "role", "round"],
        "properties": {
            "id": string("The transfer."),
            "role": { "type": "string", "enum": ["Send", "Receive"] },
            "round": { "type": "integer", "minimum": 0, "description": "The round these figures are of." },
            "complete": { "type": "boolean", "description": "That round is done." },
            "fenced": { "type": "boolean", "description": "Send after the fence: the workload's pods have all stopped." },
            "volumes": { "type": "array", "items": { "type": "object", "properties": {
                "name": { "type": "string" }, "dataVersion": { "type": "integer" },
                "usedBytes": { "type": "integer" }, "bytes": { "type": "integer" },
                "copied": { "type": "integer" } } } },
            "message": string("Why it does not progress, if it does not."),
        },
    })
}

fn migration() -> Value {
    let spec = json!({
        "type": "object",
        "required": ["resource"],
        "description": "What to move, and where to.",
        "properties": {
            "resource": {
                "type": "object",
                "required": ["apiVersion", "kind", "name"],
                "description": "The template to move, in the Migration's namespace.",
                "properties": {
                    "apiVersion": string("Its API version, e.g. apps/v1."),
                    "kind": string("Its kind, e.g. StatefulSet."),
                    "name": string("Its name."),
                },
            },
            "targetClusters": strings("Where to move it; empty: Orrery picks the cluster."),
            "sourceCluster": string("The cluster to leave; empty: the one it runs in."),
            "reason": { "type": "string",
                        "enum": ["User", "PolicyChange", "Drain", "Shed", "ApplicationFailover", "ClusterFailover"],
                        "description": "Why it moves (set by Orrery when it starts a move itself)." },
        },
    });
    let phase = json!({ "type": "string",
        "enum": ["Pending", "Replicating", "Fencing", "FinalSync", "Starting", "Switching", "Cleaning", "Succeeded", "Failed"] });
    let status = json!({
        "type": "object",
        "description": "How the move goes.",
        "properties": {
            "phase": phase,
            "conditions": conditions(),
            "source": string("The cluster it leaves."),
            "target": string("The cluster it moves to."),
            "replicas": int("The replicas that move."),
            "binding": string("The ResourceBinding of the template."),
            "volumes": { "type": "array", "items": { "type": "object", "properties": {
                "name": { "type": "string" }, "ordinal": { "type": "integer" },
                "bytes": int("The volume's size at the last snapshot."),
                "copied": int("Bytes copied over every round so far."),
                "roundBytes": int("Bytes of the round in flight."),
                "roundCopied": int("Of which copied."),
                "sourceVersion": int("The source's version at the last snapshot."),
                "targetVersion": int("The version the target holds."),
                "roundBase": int("The version the last snapshot's round applies on top of."),
                "fencedVersion": int("The version at the fence."),
                "startedVersion": int("The version the target's pod started on."),
            } } },
            "rounds": int("Copy rounds finished, the final one included."),
            "snapshotRound": int("The round of the last snapshot taken at the source."),
            "rate": int("Bytes per second of the path, as the current round uses it."),
            "downtimeSeconds": { "type": "number", "description": "From the fence until the target reported the workload ready." },
            "fencedAt": { "type": "string", "format": "date-time", "description": "When the source's pods were told to stop (to the microsecond)." },
            "phases": { "type": "array", "items": { "type": "object", "properties": {
                "phase": phase,
                "started": { "type": "string", "format": "date-time" },
                "finished": { "type": "string", "format": "date-time" },
                "durationMs": { "type": "integer" } } } },
            "estimate": { "type": "object", "properties": {
                "bytes": { "type": "integer" }, "bandwidth": { "type": "integer" }, "seconds": { "type": "number" },
                "candidates": { "type": "array", "items": { "type": "object", "properties": {
                    "cluster": { "type": "string" }, "estimatedSeconds": { "type": "number" },
                    "latencyMs": { "type": "number" }, "waterLevel": { "type": "number" },
                    "score": { "type": "number" }, "reason": { "type": "string" } } } } } },
            "dataLoss": { "type": "object", "description": "A failover's recovery point: what was written after the copy it started from.",
                          "properties": { "bytes": { "type": "integer" }, "seconds": { "type": "number" } } },
            "startedEmpty": { "type": "boolean", "description": "The target started with empty volumes (onDataLoss: StartEmpty)." },
            "standbyFailover": { "type": "boolean", "description": "The source was lost and the target started on its standby copy." },
            "message": string("What happens now, or why it failed."),
            "startTime": { "type": "string", "format": "date-time" },
            "completionTime": { "type": "string", "format": "date-time" },
        },
    });
    kind(
        "multicluster.io",
        "v1alpha1",
        "Migration",
        "The move of a stateful workload and its data to another cluster: copy, fence, final sync, start, switch, clean up.",
        spec,
        Some(status),
    )
}

fn cluster_profile() -> Value {
    let spec = json!({
        "type": "object",
        "properties": {
            "displayName": string("A human-readable name of the cluster."),
            "clusterManager": { "type": "object", "required": ["name"], "description": "What manages the cluster.",
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
            "accessProviders": providers("How to reach the cluster's API: Orrery's cluster proxy (a kubeconfig cluster: server and CA; the credentials are the consumer's own)."),
            "credentialProviders": providers("The same as accessProviders, under the name earlier releases of the API used."),
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

fn location() -> Value {
    kind(
        orrery_api::location::GROUP,
        "v1alpha1",
        orrery_api::location::KIND,
        "The members in one city (labelled topology.datum.net/city-code), kept by Orrery: their regions, zones, readiness, summed capacity and highest water level. Place by location with spreadByLabel: topology.datum.net/city-code, or a cluster label selector on that key.",
        json!({ "type": "object", "properties": { "cityCode": string("The city code.") } }),
        Some(schema_of::<orrery_api::location::LocationStatus>()),
    )
}

fn resource_claim() -> Value {
    kind(
        orrery_api::quota::GROUP,
        "v1alpha1",
        orrery_api::quota::CLAIM_KIND,
        "A member cluster's capacity for Kueue (KubeStellar galaxy #36): Orrery makes one per member (<cluster>-resource-claim) with its nominal resources; an administrator assigns parts of them to ClusterQueues by flavor, and Orrery keeps each queue's nominalQuota the sum of what the claims assign it, scaled down when the member loses capacity and never below what the queue has admitted.",
        schema_of::<orrery_api::quota::ClaimSpec>(),
        Some(schema_of::<orrery_api::quota::ClaimStatus>()),
    )
}

fn cluster_metrics() -> Value {
    kind(
        orrery_api::quota::GROUP,
        "v1alpha1",
        orrery_api::quota::METRICS_KIND,
        "A member cluster's nodes (KubeStellar galaxy's ClusterMetrics): what each can give and what is requested of it, written by the member's agent.",
        json!({ "type": "object", "properties": {}, "description": "Nothing: the object is its status." }),
        Some(schema_of::<orrery_api::quota::MetricsStatus>()),
    )
}

fn providers(description: &str) -> Value {
    json!({
        "type": "array",
        "description": description,
        "items": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": string("The provider's name."),
                "cluster": {
                    "type": "object",
                    "description": "A kubeconfig cluster entry.",
                    "properties": {
                        "server": string("The API's URL."),
                        "certificate-authority-data": string("The CA's PEM, base64."),
                    },
                    "x-kubernetes-preserve-unknown-fields": true,
                },
            },
        },
    })
}

fn service_export() -> Value {
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
    kind(
        "multicluster.x-k8s.io",
        "v1alpha1",
        "ServiceExport",
        "Exports a Service to the ClusterSet (KEP-1645). Conditions: Valid (the Service exists and can be exported), Ready (exported, and from where), Conflict (the members' Services disagree; the oldest export wins). Annotations: multicluster.orrery.io/traffic-policy (PreferLocal, LowestLatency, Weighted) and multicluster.orrery.io/consumer-selector (a label selector over Clusters that import it).",
        spec,
        Some(status),
    )
}

fn service_import() -> Value {
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
    kind(
        "multicluster.x-k8s.io",
        "v1alpha1",
        "ServiceImport",
        "A Service exported to the ClusterSet (KEP-1645): its type, ports, ClusterSet IP and the clusters it is exported from. Orrery writes it from the ServiceExports and distributes it to the consuming clusters with its EndpointSlices.",
        spec,
        Some(status),
    )
}

fn ocm_placement_decision() -> Value {
    let status = json!({
        "type": "object",
        "required": ["decisions"],
        "properties": {
            "decisions": {
                "type": "array",
                "description": "The clusters chosen (at most 100 per object; more are split across objects labelled with the same placement).",
                "items": {
                    "type": "object",
                    "required": ["clusterName", "reason"],
                    "properties": {
                        "clusterName": string("The cluster's name."),
                        "reason": string("Why it was chosen."),
                        "score": { "type": "integer", "format": "int64", "description": "The cluster's score, where the scheduler gives one." },
                    },
                },
            },
        },
    });
    let mut s = kind(
        "cluster.open-cluster-management.io",
        "v1beta1",
        "PlacementDecision",
        "Where a placement put its workload, in Open Cluster Management's shape (what Argo CD's clusterDecisionResource generator reads). Orrery keeps one set per ResourceBinding, labelled cluster.open-cluster-management.io/placement=<binding>.",
        json!({ "type": "object" }),
        Some(status),
    );
    // No spec in this kind.
    if let Some(p) = s["properties"].as_object_mut() {
        p.remove("spec");
    }
    s
}

fn sig_placement_decision() -> Value {
    let mut s = kind(
        "multicluster.x-k8s.io",
        "v1alpha1",
        "PlacementDecision",
        "Where a placement put its workload (SIG-Multicluster KEP-5313): references to the chosen clusters' ClusterProfiles. Orrery keeps one set per ResourceBinding, labelled multicluster.x-k8s.io/placement-key=<binding>.",
        json!({ "type": "object" }),
        None,
    );
    if let Some(p) = s["properties"].as_object_mut() {
        p.remove("spec");
        p.insert(
            "decisions".into(),
            json!({
                "type": "array",
                "maxItems": 100,
                "description": "The clusters chosen (at most 100 per object; more are split across objects with the same decision key).",
                "items": {
                    "type": "object",
                    "required": ["clusterProfileRef"],
                    "properties": {
                        "clusterProfileRef": {
                            "type": "object",
                            "required": ["name"],
                            "description": "The chosen cluster's ClusterProfile.",
                            "properties": {
                                "name": string("The ClusterProfile's name."),
                                "namespace": string("Its namespace (the decision's own when empty)."),
                            },
                        },
                        "reason": string("Why it was chosen."),
                    },
                },
            }),
        );
        p.insert(
            "schedulerName".into(),
            string("The scheduler that made the decisions."),
        );
    }
    s
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
                "value": { "type": "string", "maxLength": 128000, "description": "The property's value." } } }),
        );
    }
    s
}

/// The kinds whose schemas are generated from the Rust types their specs are read with.
fn generated() -> Vec<(&'static str, &'static str, Value)> {
    let karmada = "policy.karmada.io";
    let own = "multicluster.io";
    let propagation = |kind: &str, scope: &str| {
        kind_of(
            karmada,
            kind,
            &format!(
                "Karmada's {kind}: which templates {scope} go to which member clusters, and how their replicas divide."
            ),
            schema_of::<PropagationSpec>(),
            Some(schema_of::<PolicyStatus>()),
        )
    };
    let overrides = |kind: &str, scope: &str| {
        kind_of(
            karmada,
            kind,
            &format!(
                "Karmada's {kind}: how templates {scope} are changed for some member clusters."
            ),
            schema_of::<KarmadaOverrideSpec>(),
            None,
        )
    };
    vec![
        (
            karmada,
            "PropagationPolicy",
            propagation("PropagationPolicy", "of its namespace"),
        ),
        (
            karmada,
            "ClusterPropagationPolicy",
            propagation(
                "ClusterPropagationPolicy",
                "of any namespace, or cluster-scoped,",
            ),
        ),
        (
            karmada,
            "OverridePolicy",
            overrides("OverridePolicy", "of its namespace"),
        ),
        (
            karmada,
            "ClusterOverridePolicy",
            overrides("ClusterOverridePolicy", "of any namespace"),
        ),
        (
            own,
            "ResourcePlacementPolicy",
            kind_of(
                own,
                "ResourcePlacementPolicy",
                "The draft's placement policy: which templates of its namespace go to which member clusters. Replicas divide by Resource Water Level unless the placement says otherwise.",
                schema_of::<PlacementPolicySpec>(),
                Some(schema_of::<PolicyStatus>()),
            ),
        ),
        (
            own,
            "ClusterOverridePolicy",
            kind_of(
                own,
                "ClusterOverridePolicy",
                "The draft's override policy: field patches applied to a template in the clusters a selector names.",
                schema_of::<DraftOverrideSpec>(),
                None,
            ),
        ),
        (
            own,
            "DataSet",
            kind_of(
                own,
                "DataSet",
                "A data set workloads read (the pod template's orrery.io/datasets): its size and the clusters holding authoritative copies. The scheduler weighs moving the work to the data against moving the data to the work.",
                schema_of::<orrery_api::data::DataSetSpec>(),
                Some(schema_of::<orrery_api::data::DataSetStatus>()),
            ),
        ),
        (
            own,
            "DataTransfer",
            kind_of(
                own,
                "DataTransfer",
                "A copy of a data set to a cluster, planned and run by Orrery (for a workload placed there, a cache, a refresh) or asked by a user (a prefetch): its source, the bandwidth booked on its links, and its progress.",
                schema_of::<orrery_api::data::DataTransferSpec>(),
                Some(schema_of::<orrery_api::data::DataTransferStatus>()),
            ),
        ),
        (
            orrery_api::autoscaling::GROUP,
            orrery_api::autoscaling::CRON_KIND,
            kind_of(
                orrery_api::autoscaling::GROUP,
                orrery_api::autoscaling::CRON_KIND,
                "Karmada's CronFederatedHPA: rules that set a workload template's replicas, or a FederatedHPA's bounds, on a cron schedule, in a time zone; Orrery divides the change among the clusters as its placement says.",
                schema_of::<orrery_api::autoscaling::CronFederatedHPASpec>(),
                Some(schema_of::<orrery_api::autoscaling::CronFederatedHPAStatus>()),
            ),
        ),
        (
            orrery_api::autoscaling::GROUP,
            orrery_api::autoscaling::federated::KIND,
            kind_of(
                orrery_api::autoscaling::GROUP,
                orrery_api::autoscaling::federated::KIND,
                "Karmada's FederatedHPA: a workload template's replicas follow the usage its pods report from every member cluster (autoscaling/v2 metrics, behavior and status); Orrery's predictive block also covers the forecast of that usage over a horizon.",
                schema_of::<orrery_api::autoscaling::federated::FederatedHPASpec>(),
                Some(schema_of::<
                    orrery_api::autoscaling::federated::FederatedHPAStatus,
                >()),
            ),
        ),
        (
            own,
            "ResourceInterpreter",
            kind_of(
                own,
                "ResourceInterpreter",
                "How Orrery reads a custom kind: where its replicas, requests, health and dependencies are.",
                schema_of::<InterpreterSpec>(),
                None,
            ),
        ),
        (
            own,
            "ResourceBinding",
            kind_of(
                own,
                "ResourceBinding",
                "A template bound to its policy: where the scheduler placed it, why, and how it runs there. Written by Orrery.",
                open_schema_of::<BindingSpec>(),
                Some(open_schema_of::<BindingStatus>()),
            ),
        ),
    ]
}

fn kind_of(
    group: &str,
    kind_name: &str,
    description: &str,
    spec: Value,
    status: Option<Value>,
) -> Value {
    kind(group, "v1alpha1", kind_name, description, spec, status)
}

/// Schemas of own kinds, by kind (keyed by the component name the registry gives them).
pub fn schemas() -> Vec<(&'static str, &'static str, Value)> {
    let mut v = generated();
    v.extend([
        ("multicluster.io", "Cluster", cluster()),
        ("multicluster.io", "Work", work()),
        ("multicluster.io", "Migration", migration()),
        ("multicluster.x-k8s.io", "ClusterProfile", cluster_profile()),
        ("about.k8s.io", "ClusterProperty", cluster_property()),
        ("multicluster.x-k8s.io", "ServiceExport", service_export()),
        ("multicluster.io", "Location", location()),
        (
            orrery_api::quota::GROUP,
            orrery_api::quota::CLAIM_KIND,
            resource_claim(),
        ),
        (
            orrery_api::quota::GROUP,
            orrery_api::quota::METRICS_KIND,
            cluster_metrics(),
        ),
        ("multicluster.x-k8s.io", "ServiceImport", service_import()),
        (
            "cluster.open-cluster-management.io",
            "PlacementDecision",
            ocm_placement_decision(),
        ),
        (
            "multicluster.x-k8s.io",
            "PlacementDecision",
            sig_placement_decision(),
        ),
    ]);
    v
}
