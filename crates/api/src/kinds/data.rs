//! Data-aware placement: data sets and the transfers that copy them.

use super::{AGE, Column, Descriptor, Schema, root, spec_errors};
use crate::Object;
use crate::data::{DataSetSpec, DataSetStatus, DataTransferSpec, DataTransferStatus};
use crate::validation::ErrorList;

pub const DATA_SET: Descriptor = Descriptor {
    group: "multicluster.io",
    version: "v1alpha1",
    also_served: &[],
    kind: "DataSet",
    plural: "datasets",
    namespaced: true,
    short_names: &["dset"],
    status: true,
    description: "A data set workloads read (the pod template's orrery.io/datasets): its size and the clusters holding authoritative copies. The scheduler weighs moving the work to the data against moving the data to the work.",
    schema: Schema::typed(root::<DataSetSpec>, Some(root::<DataSetStatus>)),
    columns: SET_COLUMNS,
    validate: Some(validate_set),
    spec_immutable: false,
    finalizer: None,
    on_status: None,
};

/// A transfer is not redirected: delete it and ask for another (its spec is immutable).
pub const DATA_TRANSFER: Descriptor = Descriptor {
    group: "multicluster.io",
    version: "v1alpha1",
    also_served: &[],
    kind: "DataTransfer",
    plural: "datatransfers",
    namespaced: true,
    short_names: &["dtr"],
    status: true,
    description: "A copy of a data set to a cluster, planned and run by Orrery (for a workload placed there, a cache, a refresh) or asked by a user (a prefetch): its source, the bandwidth booked on its links, and its progress.",
    schema: Schema::typed(root::<DataTransferSpec>, Some(root::<DataTransferStatus>)),
    columns: TRANSFER_COLUMNS,
    validate: Some(validate_transfer),
    spec_immutable: true,
    finalizer: None,
    on_status: None,
};

const SET_COLUMNS: &[Column] = &[
    Column::new("Size", "string", ".spec.size", 0, "How big it is"),
    Column::new(
        "Locations",
        "string",
        ".spec.locations[*].cluster",
        0,
        "The clusters holding an authoritative copy",
    ),
    AGE,
    Column::new(
        "Tiers",
        "string",
        ".spec.locations[*].tier",
        1,
        "The tiers of those copies",
    ),
    Column::new(
        "Copies",
        "string",
        ".status.copies[?(@.present==true)].cluster",
        1,
        "The clusters holding a readable copy, caches included",
    ),
];

const TRANSFER_COLUMNS: &[Column] = &[
    Column::new(
        "Data Set",
        "string",
        ".spec.dataSet",
        0,
        "The data set copied",
    ),
    Column::new(
        "Source",
        "string",
        ".status.source",
        0,
        "Where it comes from",
    ),
    Column::new(
        "Destination",
        "string",
        ".spec.destination",
        0,
        "The cluster receiving it",
    ),
    Column::new("Phase", "string", ".status.phase", 0, "Where it stands"),
    Column::new("Bytes", "integer", ".status.bytes", 0, "What it sends"),
    Column::new(
        "Copied",
        "integer",
        ".status.copiedBytes",
        0,
        "What is in so far",
    ),
    AGE,
    Column::new(
        "Rate",
        "integer",
        ".status.rate",
        1,
        "Bytes per second booked on its links",
    ),
    Column::new("Reason", "string", ".spec.reason", 1, "Why it is made"),
];

fn validate_set(obj: &Object, _: Option<&Object>) -> ErrorList {
    spec_errors(DataSetSpec::parse(obj.spec.as_ref()))
}

fn validate_transfer(obj: &Object, _: Option<&Object>) -> ErrorList {
    spec_errors(DataTransferSpec::parse(obj.spec.as_ref()))
}
