//! The RolloutApproval: a user's grant for a stage of a rollout to start.

use super::{AGE, Column, Descriptor, Schema, root};
use crate::Object;
use crate::rollout::{ApprovalSpec, ApprovalStatus};
use crate::validation::{ErrorList, FieldError};

/// An approval is a record: its spec cannot change (create another).
pub const ROLLOUT_APPROVAL: Descriptor = Descriptor {
    group: "multicluster.io",
    version: "v1alpha1",
    also_served: &[],
    kind: "RolloutApproval",
    plural: "rolloutapprovals",
    namespaced: true,
    short_names: &["rapp"],
    status: true,
    description: "Lets a stage of a rollout start: a ResourceBinding of this namespace, the revision rolling out and the stage (one with approval: true). Its Accepted condition says whether Orrery took it.",
    schema: Schema::typed(root::<ApprovalSpec>, Some(root::<ApprovalStatus>)),
    columns: COLUMNS,
    validate: Some(validate),
    spec_immutable: true,
    finalizer: None,
    on_status: None,
};

const COLUMNS: &[Column] = &[
    Column::new(
        "Binding",
        "string",
        ".spec.binding",
        0,
        "The ResourceBinding whose rollout it approves",
    ),
    Column::new(
        "Revision",
        "integer",
        ".spec.revision",
        0,
        "The revision rolling out",
    ),
    Column::new(
        "Stage",
        "string",
        ".spec.stage",
        0,
        "The stage that may start",
    ),
    Column::new(
        "Accepted",
        "string",
        ".status.conditions[?(@.type==\"Accepted\")].status",
        0,
        "Whether Orrery took it",
    ),
    AGE,
];

fn validate(obj: &Object, _: Option<&Object>) -> ErrorList {
    match obj
        .spec
        .as_ref()
        .map(|s| serde_json::from_value::<ApprovalSpec>(s.clone()))
    {
        Some(Ok(a)) => {
            let mut errs = ErrorList::new();
            a.validate(&mut errs);
            errs
        }
        Some(Err(e)) => vec![FieldError::invalid("spec", "", e.to_string())],
        None => vec![FieldError::required("spec", "")],
    }
}
