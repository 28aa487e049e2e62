//! The ResourceInterpreter: how Orrery reads a custom kind.

use super::{AGE, Column, Descriptor, Schema, root};
use crate::Object;
use crate::customization::CustomizationSpec;
use crate::interpret::InterpreterSpec;
use crate::validation::ErrorList;

pub const RESOURCE_INTERPRETER: Descriptor = Descriptor {
    group: "multicluster.io",
    version: "v1alpha1",
    also_served: &[],
    kind: "ResourceInterpreter",
    plural: "resourceinterpreters",
    namespaced: false,
    short_names: &["ri"],
    status: false,
    description: "How Orrery reads a custom kind: where its replicas, requests, health and dependencies are.",
    schema: Schema::typed(root::<InterpreterSpec>, None),
    columns: &[AGE],
    validate: Some(validate),
    spec_immutable: false,
    finalizer: None,
    on_status: None,
};

fn validate(obj: &Object, _: Option<&Object>) -> ErrorList {
    let v = obj.spec.clone().unwrap_or(serde_json::Value::Null);
    match crate::policy::decode::<InterpreterSpec>(&v, "spec") {
        Ok(s) => s.validate(),
        Err(e) => vec![e],
    }
}

/// Karmada's ResourceInterpreterCustomization: Lua scripts per operation of a kind.
pub const RESOURCE_INTERPRETER_CUSTOMIZATION: Descriptor = Descriptor {
    group: "config.karmada.io",
    version: "v1alpha1",
    also_served: &[],
    kind: "ResourceInterpreterCustomization",
    plural: "resourceinterpretercustomizations",
    namespaced: false,
    short_names: &["ric"],
    status: false,
    description: "How a kind is interpreted (Karmada's meaning): Lua scripts for its replicas, revision, retained fields, status, health, dependencies and components. It takes precedence over the built-in interpreters.",
    schema: Schema::typed(root::<CustomizationSpec>, None),
    columns: &[
        Column::new(
            "Target-API-Version",
            "string",
            ".spec.target.apiVersion",
            0,
            "The interpreted kind's API version",
        ),
        Column::new(
            "Target-Kind",
            "string",
            ".spec.target.kind",
            0,
            "The interpreted kind",
        ),
        AGE,
    ],
    validate: Some(validate_customization),
    spec_immutable: false,
    finalizer: None,
    on_status: None,
};

fn validate_customization(obj: &Object, _: Option<&Object>) -> ErrorList {
    let v = obj.spec.clone().unwrap_or(serde_json::Value::Null);
    match crate::meta::decode::<CustomizationSpec>(&v, "spec") {
        Ok(s) => s.validate(),
        Err(e) => vec![e],
    }
}
