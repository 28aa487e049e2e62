//! Member capacity for Kueue (KubeStellar galaxy #36): resource claims and node metrics.

use serde_json::{Value, json};

use super::{AGE, Column, Descriptor, Part, Schema, root, spec_errors};
use crate::Object;
use crate::quota::{
    CLAIM_KIND, CLAIM_PLURAL, ClaimSpec, ClaimStatus, GROUP, METRICS_KIND, METRICS_PLURAL,
    MetricsStatus,
};
use crate::validation::ErrorList;

pub const CLUSTER_RESOURCE_CLAIM: Descriptor = Descriptor {
    group: GROUP,
    version: "v1alpha1",
    also_served: &[],
    kind: CLAIM_KIND,
    plural: CLAIM_PLURAL,
    namespaced: false,
    short_names: &[],
    status: true,
    description: "A member cluster's capacity for Kueue (KubeStellar galaxy #36): Orrery makes one per member (<cluster>-resource-claim) with its nominal resources; an administrator assigns parts of them to ClusterQueues by flavor, and Orrery keeps each queue's nominalQuota the sum of what the claims assign it, scaled down when the member loses capacity and never below what the queue has admitted.",
    schema: Schema::typed(root::<ClaimSpec>, Some(root::<ClaimStatus>)),
    columns: CLAIM_COLUMNS,
    validate: Some(validate_claim),
    spec_immutable: false,
    finalizer: None,
    on_status: None,
};

pub const CLUSTER_METRICS: Descriptor = Descriptor {
    group: GROUP,
    version: "v1alpha1",
    also_served: &[],
    kind: METRICS_KIND,
    plural: METRICS_PLURAL,
    namespaced: false,
    short_names: &["cmet", "cmets"],
    status: true,
    description: "A member cluster's nodes (KubeStellar galaxy's ClusterMetrics): what each can give and what is requested of it, written by the member's agent.",
    schema: Schema::Parts {
        spec: Part::Written(metrics_spec),
        status: Some(Part::Typed(root::<MetricsStatus>)),
        open: false,
    },
    columns: METRICS_COLUMNS,
    validate: None,
    spec_immutable: false,
    finalizer: None,
    on_status: None,
};

const CLAIM_COLUMNS: &[Column] = &[
    Column::new(
        "Cluster",
        "string",
        ".spec.clusterName",
        0,
        "The member cluster whose capacity this is",
    ),
    Column::new(
        "Applied",
        "string",
        ".status.conditions[?(@.type==\"Applied\")].reason",
        0,
        "Whether the assignments are in the queues' quotas",
    ),
    AGE,
];

const METRICS_COLUMNS: &[Column] = &[
    Column::new(
        "Nodes",
        "string",
        ".status.nodes[*].name",
        1,
        "The member's nodes",
    ),
    AGE,
];

fn validate_claim(obj: &Object, _: Option<&Object>) -> ErrorList {
    spec_errors(ClaimSpec::parse(obj.spec.as_ref()))
}

fn metrics_spec() -> Value {
    json!({ "type": "object", "properties": {}, "description": "Nothing: the object is its status." })
}
