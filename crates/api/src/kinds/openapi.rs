//! Pieces of the OpenAPI v3 schemas written out for own kinds (the shapes Kubernetes
//! publishes them in).

use serde_json::{Value, json};

use super::Descriptor;

/// The component holding standard object metadata.
pub const OBJECT_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";
pub const QUANTITY: &str = "io.k8s.apimachinery.pkg.api.resource.Quantity";

/// A reference to a component.
pub fn reference(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

/// `x-kubernetes-group-version-kind`.
pub fn gvk(group: &str, version: &str, kind: &str) -> Value {
    json!([{ "group": group, "version": version, "kind": kind }])
}

pub fn string(description: &str) -> Value {
    json!({ "type": "string", "description": description })
}

pub fn strings(description: &str) -> Value {
    json!({ "type": "array", "items": { "type": "string" }, "description": description })
}

pub fn quantities(description: &str) -> Value {
    json!({ "type": "object", "additionalProperties": reference(QUANTITY), "description": description })
}

pub fn conditions() -> Value {
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

pub fn int(description: &str) -> Value {
    json!({ "type": "integer", "format": "int64", "description": description })
}

/// A kind's component: `apiVersion`, `kind`, standard `metadata`, `spec` and `status`.
pub fn kind(d: &Descriptor, spec: Value, status: Option<Value>) -> Value {
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
        "description": d.description,
        "type": "object",
        "properties": props,
        "x-kubernetes-group-version-kind": gvk(d.group, d.version, d.kind),
    })
}
