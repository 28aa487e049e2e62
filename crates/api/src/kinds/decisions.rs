//! Placement results for Argo CD and other consumers, in Open Cluster Management's shape and
//! in SIG-Multicluster's KEP-5313.

use serde_json::{Value, json};

use super::openapi::{self, string};
use super::{AGE, Descriptor, Schema};

pub const OCM_PLACEMENT_DECISION: Descriptor = Descriptor {
    group: "cluster.open-cluster-management.io",
    version: "v1beta1",
    also_served: &[],
    kind: "PlacementDecision",
    plural: "placementdecisions",
    namespaced: true,
    short_names: &[],
    status: true,
    description: "Where a placement put its workload, in Open Cluster Management's shape (what Argo CD's clusterDecisionResource generator reads). Orrery keeps one set per ResourceBinding, labelled cluster.open-cluster-management.io/placement=<binding>.",
    schema: Schema::Written(ocm_schema),
    columns: &[AGE],
    validate: None,
    spec_immutable: false,
    finalizer: None,
    on_status: None,
};

pub const SIG_PLACEMENT_DECISION: Descriptor = Descriptor {
    group: crate::services::GROUP,
    version: "v1alpha1",
    also_served: &[],
    kind: "PlacementDecision",
    plural: "placementdecisions",
    namespaced: true,
    short_names: &[],
    status: false,
    description: "Where a placement put its workload (SIG-Multicluster KEP-5313): references to the chosen clusters' ClusterProfiles. Orrery keeps one set per ResourceBinding, labelled multicluster.x-k8s.io/placement-key=<binding>.",
    schema: Schema::Written(sig_schema),
    columns: &[AGE],
    validate: None,
    spec_immutable: false,
    finalizer: None,
    on_status: None,
};

fn ocm_schema(d: &Descriptor) -> Value {
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
    let mut s = openapi::kind(d, json!({ "type": "object" }), Some(status));
    // No spec in this kind.
    if let Some(p) = s["properties"].as_object_mut() {
        p.remove("spec");
    }
    s
}

fn sig_schema(d: &Descriptor) -> Value {
    let mut s = openapi::kind(d, json!({ "type": "object" }), None);
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
