//! The cluster inventory: ClusterProfiles (KEP-4322) and ClusterProperties (KEP-2149).

use serde_json::{Value, json};

use super::openapi::{self, conditions, string};
use super::{AGE, Column, Descriptor, Schema};

pub const CLUSTER_PROFILE: Descriptor = Descriptor {
    group: "multicluster.x-k8s.io",
    version: "v1alpha1",
    also_served: &[],
    kind: "ClusterProfile",
    plural: "clusterprofiles",
    namespaced: true,
    short_names: &["cp"],
    status: true,
    description: "A cluster's inventory entry (KEP-4322), kept by Orrery from its Cluster.",
    schema: Schema::Written(profile_schema),
    columns: &[AGE],
    validate: None,
    spec_immutable: false,
    finalizer: None,
    on_status: None,
};

pub const CLUSTER_PROPERTY: Descriptor = Descriptor {
    group: "about.k8s.io",
    version: "v1beta1",
    also_served: &["v1alpha1"],
    kind: "ClusterProperty",
    plural: "clusterproperties",
    namespaced: false,
    short_names: &["cprop"],
    // As about-api's CRD: a status subresource (an empty status) and the value as a column.
    status: true,
    description: "A property of the cluster it is stored in (KEP-2149), e.g. cluster.clusterset.k8s.io.",
    schema: Schema::Written(property_schema),
    columns: &[
        Column::new("Value", "string", ".spec.value", 0, "The property's value"),
        AGE,
    ],
    validate: None,
    spec_immutable: false,
    finalizer: None,
    on_status: None,
};

fn profile_schema(d: &Descriptor) -> Value {
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
    openapi::kind(d, spec, Some(status))
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

fn property_schema(d: &Descriptor) -> Value {
    let mut s = openapi::kind(
        d,
        json!({ "type": "object" }),
        Some(
            json!({ "type": "object", "description": "Nothing yet (about-api defines no status fields)." }),
        ),
    );
    if let Some(p) = s["properties"].as_object_mut() {
        p.remove("spec");
        p.insert(
            "spec".into(),
            json!({ "type": "object", "required": ["value"], "properties": {
                "value": { "type": "string", "minLength": 1, "maxLength": 128000, "description": "The property's value." } } }),
        );
    }
    s
}
