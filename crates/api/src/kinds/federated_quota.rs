//! Karmada's FederatedResourceQuota.

use super::{AGE, Column, Descriptor, Schema, root};
use crate::Object;
use crate::federated_quota::{FederatedResourceQuotaSpec, FederatedResourceQuotaStatus};
use crate::validation::ErrorList;

pub const FEDERATED_RESOURCE_QUOTA: Descriptor = Descriptor {
    group: crate::federated_quota::GROUP,
    version: "v1alpha1",
    also_served: &[],
    kind: crate::federated_quota::KIND,
    plural: "federatedresourcequotas",
    namespaced: true,
    short_names: &[],
    status: true,
    description: "Karmada's FederatedResourceQuota: a namespace's limits across every member cluster (overall), and parts of them given to clusters (staticAssignments), each enforced there as a ResourceQuota of the same name. What the namespace's bindings place counts against overall (the per-replica request times the replicas placed, for the resource names overall lists); a template change, or a decision, that would take the namespace over a limit is refused with reason QuotaExceeded.",
    schema: Schema::typed(
        root::<FederatedResourceQuotaSpec>,
        Some(root::<FederatedResourceQuotaStatus>),
    ),
    columns: &[
        Column::new(
            "Overall",
            "string",
            ".status.overall",
            0,
            "The limits in force",
        ),
        Column::new(
            "Overall_Used",
            "string",
            ".status.overallUsed",
            0,
            "What the namespace's bindings place",
        ),
        AGE,
    ],
    validate: Some(validate),
    spec_immutable: false,
    finalizer: None,
    on_status: None,
};

fn validate(obj: &Object, _: Option<&Object>) -> ErrorList {
    let v = obj.spec.clone().unwrap_or(serde_json::Value::Null);
    match crate::meta::decode::<FederatedResourceQuotaSpec>(&v, "spec") {
        Ok(s) => s.validate(obj.name()),
        Err(e) => vec![e],
    }
}
