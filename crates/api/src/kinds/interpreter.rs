//! The ResourceInterpreter: how Orrery reads a custom kind.

use super::{AGE, Descriptor, Schema, root};
use crate::Object;
use crate::interpret::InterpreterSpec;
use crate::validation::ErrorList;

pub const RESOURCE_INTERPRETER: Descriptor = Descriptor {
    group: "multicluster.io",
    version: "v1alpha1",
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
