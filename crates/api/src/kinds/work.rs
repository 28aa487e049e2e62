//! The Work: a template rendered for one member cluster, and how it is applied there.

use serde_json::{Value, json};

use super::openapi::{self, QUANTITY, conditions, int, reference, string};
use super::{AGE, Column, Descriptor, Schema};
use crate::Object;
use crate::validation::ErrorList;

pub const WORK: Descriptor = Descriptor {
    group: "multicluster.io",
    version: "v1alpha1",
    also_served: &[],
    kind: "Work",
    plural: "works",
    namespaced: true,
    short_names: &[],
    status: true,
    description: "The objects one member cluster must run, and their status there.",
    schema: Schema::Written(schema),
    columns: COLUMNS,
    validate: Some(validate),
    spec_immutable: false,
    finalizer: None,
    on_status: None,
};

const COLUMNS: &[Column] = &[
    Column::new(
        "Applied",
        "string",
        ".status.conditions[?(@.type==\"Applied\")].status",
        0,
        "Whether the member applied every manifest",
    ),
    AGE,
    Column::new(
        "Available",
        "string",
        ".status.conditions[?(@.type==\"Available\")].status",
        1,
        "Whether every manifest is healthy in the member",
    ),
    Column::new(
        "Manifests",
        "string",
        ".spec.workload.manifests[*].kind",
        1,
        "The kinds it carries",
    ),
];

fn validate(obj: &Object, _: Option<&Object>) -> ErrorList {
    crate::work::validate_spec(obj.spec.as_ref())
}

fn schema(d: &Descriptor) -> Value {
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
            "retention": {
                "type": "array",
                "description": "Karmada's Retain scripts for the manifests of a kind: on each update of an object the member has, its agent applies Retain(desired, observed) instead.",
                "items": {
                    "type": "object",
                    "required": ["apiVersion", "kind", "luaScript"],
                    "properties": {
                        "apiVersion": string("The manifests' apiVersion."),
                        "kind": string("The manifests' kind."),
                        "customization": string("The ResourceInterpreterCustomization it comes from."),
                        "luaScript": string("The Lua script defining Retain(desiredObj, observedObj)."),
                    },
                },
            },
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
                        "generation": int("The object's metadata.generation in the member."),
                        "volumes": { "type": "array", "items": volume_status(),
                                     "description": "The persistent volumes the object's pods use." },
                        "usage": { "type": "object", "x-kubernetes-preserve-unknown-fields": true,
                                   "description": "What a workload's pods use, for members that measure it." },
                        "endpoints": { "type": "object", "x-kubernetes-preserve-unknown-fields": true,
                                       "description": "A Service's endpoints in the member." },
                        "restarts": int("How many times the containers of a workload's pods restarted, summed."),
                    },
                },
            },
            "transfers": { "type": "array", "items": transfer_status(),
                           "description": "Where each of the spec's transfers stands." },
        },
    });
    openapi::kind(d, spec, Some(status))
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
