//! The ResourceBinding: a template bound to its policy, where it was placed and how it runs.

use super::{AGE, Column, Descriptor, Part, Schema, root};
use crate::Object;
use crate::binding::{BindingSpec, BindingStatus};
use crate::validation::{ErrorList, FieldError};

pub const RESOURCE_BINDING: Descriptor = Descriptor {
    group: "multicluster.io",
    version: "v1alpha1",
    also_served: &[],
    kind: "ResourceBinding",
    plural: "resourcebindings",
    namespaced: true,
    short_names: &["rb"],
    status: true,
    description: "A template bound to its policy: where the scheduler placed it, why, and how it runs there. Written by Orrery.",
    schema: Schema::Parts {
        spec: Part::Typed(root::<BindingSpec>),
        status: Some(Part::Typed(root::<BindingStatus>)),
        // Written and read leniently by Orrery: an edit through kubectl never loses a field
        // an older or newer server wrote.
        open: true,
    },
    columns: COLUMNS,
    validate: Some(validate),
    spec_immutable: false,
    finalizer: None,
    on_status: None,
};

const COLUMNS: &[Column] = &[
    Column::new(
        "Kind",
        "string",
        ".spec.resource.kind",
        0,
        "The template's kind",
    ),
    Column::new(
        "Scheduled",
        "string",
        ".status.conditions[?(@.type==\"Scheduled\")].status",
        0,
        "Whether the scheduler placed the template",
    ),
    Column::new(
        "Fully-Applied",
        "string",
        ".status.conditions[?(@.type==\"FullyApplied\")].status",
        0,
        "Whether every target cluster runs it",
    ),
    Column::new(
        "Clusters",
        "string",
        ".status.conditions[?(@.type==\"Scheduled\")].message",
        0,
        "Where it was placed",
    ),
    AGE,
    Column::new(
        "Replicas",
        "integer",
        ".spec.replicas",
        1,
        "Desired replicas",
    ),
    Column::new(
        "Policy",
        "string",
        ".spec.policy.name",
        1,
        "The placement policy that places it",
    ),
    Column::new(
        "Strategy",
        "string",
        ".status.strategy",
        1,
        "How the replicas were divided",
    ),
    Column::new(
        "Migration",
        "string",
        ".spec.migration",
        1,
        "The Migration moving it now",
    ),
    Column::new(
        "Revision",
        "integer",
        ".status.rollout.revision",
        1,
        "The template revision rolling out (placement.rollout)",
    ),
    Column::new(
        "Rollout",
        "string",
        ".status.rollout.phase",
        1,
        "Where its rollout stands",
    ),
    Column::new(
        "Stage",
        "string",
        ".status.rollout.stage",
        1,
        "The rollout's stage under way",
    ),
];

/// A binding's spec parses, and refers to nothing outside its namespace.
fn validate(obj: &Object, _: Option<&Object>) -> ErrorList {
    let mut errs = ErrorList::new();
    match obj
        .spec
        .as_ref()
        .map(|s| serde_json::from_value::<BindingSpec>(s.clone()))
    {
        Some(Ok(b)) => errs.extend(b.foreign_references(obj.namespace())),
        Some(Err(e)) => errs.push(FieldError::invalid("spec", "", e.to_string())),
        None => {}
    }
    errs
}
