//! Placement and override policies: the draft's and Karmada's.

use super::{AGE, Column, Descriptor, Schema, root, spec_errors};
use crate::Object;
use crate::overrides::{DraftOverrideSpec, KarmadaOverrideSpec};
use crate::policy::{PlacementPolicySpec, PolicyStatus, PropagationSpec};
use crate::validation::ErrorList;

const KARMADA: &str = "policy.karmada.io";
const OWN: &str = "multicluster.io";

pub const RESOURCE_PLACEMENT_POLICY: Descriptor = Descriptor {
    group: OWN,
    version: "v1alpha1",
    also_served: &[],
    kind: "ResourcePlacementPolicy",
    plural: "resourceplacementpolicies",
    namespaced: true,
    short_names: &["rpp"],
    status: true,
    description: "The draft's placement policy: which templates of its namespace go to which member clusters. Replicas divide by Resource Water Level unless the placement says otherwise.",
    schema: Schema::typed(root::<PlacementPolicySpec>, Some(root::<PolicyStatus>)),
    columns: COLUMNS,
    validate: Some(placement),
    spec_immutable: false,
    finalizer: None,
    on_status: None,
};

pub const CLUSTER_OVERRIDE_POLICY: Descriptor = Descriptor {
    group: OWN,
    version: "v1alpha1",
    also_served: &[],
    kind: "ClusterOverridePolicy",
    plural: "clusteroverridepolicies",
    namespaced: false,
    short_names: &["mcop"],
    status: false,
    description: "The draft's override policy: field patches applied to a template in the clusters a selector names.",
    schema: Schema::typed(root::<DraftOverrideSpec>, None),
    columns: &[AGE],
    validate: Some(overrides),
    spec_immutable: false,
    finalizer: None,
    on_status: None,
};

pub const PROPAGATION_POLICY: Descriptor = Descriptor {
    group: KARMADA,
    version: "v1alpha1",
    also_served: &[],
    kind: "PropagationPolicy",
    plural: "propagationpolicies",
    namespaced: true,
    short_names: &["pp"],
    status: true,
    description: "Karmada's PropagationPolicy: which templates of its namespace go to which member clusters, and how their replicas divide.",
    schema: Schema::typed(root::<PropagationSpec>, Some(root::<PolicyStatus>)),
    columns: COLUMNS,
    validate: Some(placement),
    spec_immutable: false,
    finalizer: None,
    on_status: None,
};

pub const CLUSTER_PROPAGATION_POLICY: Descriptor = Descriptor {
    group: KARMADA,
    version: "v1alpha1",
    also_served: &[],
    kind: "ClusterPropagationPolicy",
    plural: "clusterpropagationpolicies",
    namespaced: false,
    short_names: &["cpp"],
    status: true,
    description: "Karmada's ClusterPropagationPolicy: which templates of any namespace, or cluster-scoped, go to which member clusters, and how their replicas divide.",
    schema: Schema::typed(root::<PropagationSpec>, Some(root::<PolicyStatus>)),
    columns: COLUMNS,
    validate: Some(placement),
    spec_immutable: false,
    finalizer: None,
    on_status: None,
};

pub const OVERRIDE_POLICY: Descriptor = Descriptor {
    group: KARMADA,
    version: "v1alpha1",
    also_served: &[],
    kind: "OverridePolicy",
    plural: "overridepolicies",
    namespaced: true,
    short_names: &["op"],
    status: false,
    description: "Karmada's OverridePolicy: how templates of its namespace are changed for some member clusters.",
    schema: Schema::typed(root::<KarmadaOverrideSpec>, None),
    columns: &[AGE],
    validate: Some(overrides),
    spec_immutable: false,
    finalizer: None,
    on_status: None,
};

pub const KARMADA_CLUSTER_OVERRIDE_POLICY: Descriptor = Descriptor {
    group: KARMADA,
    version: "v1alpha1",
    also_served: &[],
    kind: "ClusterOverridePolicy",
    plural: "clusteroverridepolicies",
    namespaced: false,
    short_names: &["cop"],
    status: false,
    description: "Karmada's ClusterOverridePolicy: how templates of any namespace are changed for some member clusters.",
    schema: Schema::typed(root::<KarmadaOverrideSpec>, None),
    columns: &[AGE],
    validate: Some(overrides),
    spec_immutable: false,
    finalizer: None,
    on_status: None,
};

/// The placement policies' columns (one set for the three kinds).
const COLUMNS: &[Column] = &[
    Column::new(
        "Bound",
        "integer",
        ".status.boundResources",
        0,
        "Templates this policy places",
    ),
    AGE,
    Column::new("Priority", "integer", ".spec.priority", 1, "Its priority"),
    Column::new(
        "Reason",
        "string",
        ".status.conditions[?(@.type==\"Bound\")].reason",
        1,
        "Why it binds what it binds (NoMatch: its selectors match nothing)",
    ),
];

fn placement(obj: &Object, _: Option<&Object>) -> ErrorList {
    spec_errors(crate::policy::from_object(obj))
}

fn overrides(obj: &Object, _: Option<&Object>) -> ErrorList {
    spec_errors(crate::overrides::from_object(obj))
}
