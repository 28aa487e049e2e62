//! Karmada's WorkloadRebalancer.

use super::{AGE, Column, Descriptor, Schema, root};
use crate::Object;
use crate::rebalancer::{WorkloadRebalancerSpec, WorkloadRebalancerStatus};
use crate::validation::ErrorList;

pub const WORKLOAD_REBALANCER: Descriptor = Descriptor {
    group: "apps.karmada.io",
    version: "v1alpha1",
    also_served: &[],
    kind: "WorkloadRebalancer",
    plural: "workloadrebalancers",
    namespaced: false,
    short_names: &[],
    status: true,
    description: "Karmada's WorkloadRebalancer: a one-shot fresh division of the workloads it names. Each workload's binding is asked once for a fresh decision (the water levels and the workload's move budget still hold); the status says per workload Successful, or Failed with ReferencedBindingNotFound, and ttlSecondsAfterFinished deletes it that long after its last result.",
    schema: Schema::typed(
        root::<WorkloadRebalancerSpec>,
        Some(root::<WorkloadRebalancerStatus>),
    ),
    columns: &[
        Column::new(
            "Finished",
            "string",
            ".status.finishTime",
            0,
            "When the last workload got its result",
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
    match crate::meta::decode::<WorkloadRebalancerSpec>(&v, "spec") {
        Ok(s) => s.validate(),
        Err(e) => vec![e],
    }
}
