//! Karmada's autoscalers: FederatedHPA and CronFederatedHPA.

use super::{AGE, Column, Descriptor, Schema, root, spec_errors};
use crate::Object;
use crate::autoscaling::federated::{FederatedHPASpec, FederatedHPAStatus, KIND, PLURAL};
use crate::autoscaling::{
    CRON_KIND, CRON_PLURAL, CronFederatedHPASpec, CronFederatedHPAStatus, GROUP,
};
use crate::validation::ErrorList;

pub const FEDERATED_HPA: Descriptor = Descriptor {
    group: GROUP,
    version: "v1alpha1",
    also_served: &[],
    kind: KIND,
    plural: PLURAL,
    namespaced: true,
    short_names: &["fhpa"],
    status: true,
    description: "Karmada's FederatedHPA: a workload template's replicas follow the usage its pods report from every member cluster (autoscaling/v2 metrics, behavior and status); Orrery's predictive block also covers the forecast of that usage over a horizon.",
    schema: Schema::typed(root::<FederatedHPASpec>, Some(root::<FederatedHPAStatus>)),
    columns: HPA_COLUMNS,
    validate: Some(validate_hpa),
    spec_immutable: false,
    finalizer: None,
    on_status: None,
};

pub const CRON_FEDERATED_HPA: Descriptor = Descriptor {
    group: GROUP,
    version: "v1alpha1",
    also_served: &[],
    kind: CRON_KIND,
    plural: CRON_PLURAL,
    namespaced: true,
    short_names: &["cronfhpa"],
    status: true,
    description: "Karmada's CronFederatedHPA: rules that set a workload template's replicas, or a FederatedHPA's bounds, on a cron schedule, in a time zone; Orrery divides the change among the clusters as its placement says.",
    schema: Schema::typed(
        root::<CronFederatedHPASpec>,
        Some(root::<CronFederatedHPAStatus>),
    ),
    columns: CRON_COLUMNS,
    validate: Some(validate_cron),
    spec_immutable: false,
    finalizer: None,
    on_status: None,
};

const HPA_COLUMNS: &[Column] = &[
    Column::new(
        "Reference-Kind",
        "string",
        ".spec.scaleTargetRef.kind",
        0,
        "The kind of the scaled workload",
    ),
    Column::new(
        "Reference-Name",
        "string",
        ".spec.scaleTargetRef.name",
        0,
        "The scaled workload",
    ),
    Column::new(
        "MinPods",
        "integer",
        ".spec.minReplicas",
        0,
        "The fewest replicas",
    ),
    Column::new(
        "MaxPods",
        "integer",
        ".spec.maxReplicas",
        0,
        "The most replicas",
    ),
    Column::new(
        "Replicas",
        "integer",
        ".status.currentReplicas",
        0,
        "The replicas now",
    ),
    AGE,
];

const CRON_COLUMNS: &[Column] = &[
    Column::new(
        "Reference-Kind",
        "string",
        ".spec.scaleTargetRef.kind",
        0,
        "The kind of what the rules scale",
    ),
    Column::new(
        "Reference-Name",
        "string",
        ".spec.scaleTargetRef.name",
        0,
        "What the rules scale",
    ),
    AGE,
];

fn validate_hpa(obj: &Object, _: Option<&Object>) -> ErrorList {
    spec_errors(FederatedHPASpec::parse(obj.spec.as_ref()))
}

fn validate_cron(obj: &Object, _: Option<&Object>) -> ErrorList {
    spec_errors(CronFederatedHPASpec::parse(obj.spec.as_ref()))
}
