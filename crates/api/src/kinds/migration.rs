//! The Migration: a stateful workload moved with its data.

use serde_json::{Value, json};

use super::openapi::{self, conditions, int, string, strings};
use super::{AGE, Column, Descriptor, Schema, spec_errors};
use crate::Object;
use crate::validation::ErrorList;

/// A move under way cannot be redirected: delete it and start another (its spec is immutable).
pub const MIGRATION: Descriptor = Descriptor {
    group: "multicluster.io",
    version: "v1alpha1",
    also_served: &[],
    kind: "Migration",
    plural: "migrations",
    namespaced: true,
    short_names: &["mig"],
    status: true,
    description: "The move of a stateful workload and its data to another cluster: copy, fence, final sync, start, switch, clean up.",
    schema: Schema::Written(schema),
    columns: COLUMNS,
    validate: Some(validate),
    spec_immutable: true,
    finalizer: None,
    on_status: None,
};

const COLUMNS: &[Column] = &[
    Column::new(
        "Resource",
        "string",
        ".spec.resource.name",
        0,
        "The template it moves",
    ),
    Column::new(
        "Phase",
        "string",
        ".status.phase",
        0,
        "Where the move stands",
    ),
    Column::new(
        "Source",
        "string",
        ".status.source",
        0,
        "The cluster it leaves",
    ),
    Column::new(
        "Target",
        "string",
        ".status.target",
        0,
        "The cluster it moves to",
    ),
    Column::new("Rounds", "integer", ".status.rounds", 0, "Copy rounds done"),
    Column::new(
        "Downtime",
        "number",
        ".status.downtimeSeconds",
        0,
        "Seconds from the fence until the target was ready",
    ),
    Column::new("Reason", "string", ".spec.reason", 1, "Why it moves"),
    AGE,
];

fn validate(obj: &Object, _: Option<&Object>) -> ErrorList {
    spec_errors(crate::stateful::migration_spec(obj.spec.as_ref()))
}

fn schema(d: &Descriptor) -> Value {
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
    openapi::kind(d, spec, Some(status))
}
