//! Locations: the members grouped by city code (the Datum seed), a view Orrery keeps.

use serde_json::{Value, json};

use super::openapi::string;
use super::{AGE, Column, Descriptor, Part, Schema, root};
use crate::location::{GROUP, KIND, LocationStatus, PLURAL};

pub const LOCATION: Descriptor = Descriptor {
    group: GROUP,
    version: "v1alpha1",
    also_served: &[],
    kind: KIND,
    plural: PLURAL,
    namespaced: false,
    short_names: &["loc"],
    status: true,
    description: "The members in one city (labelled topology.datum.net/city-code), kept by Orrery: their regions, zones, readiness, summed capacity and highest water level. Place by location with spreadByLabel: topology.datum.net/city-code, or a cluster label selector on that key.",
    schema: Schema::Parts {
        spec: Part::Written(spec),
        status: Some(Part::Typed(root::<LocationStatus>)),
        open: false,
    },
    columns: COLUMNS,
    validate: None,
    spec_immutable: false,
    finalizer: None,
    on_status: None,
};

const COLUMNS: &[Column] = &[
    Column::new(
        "City",
        "string",
        ".status.cityCode",
        0,
        "The city code its members are labelled with",
    ),
    Column::new(
        "Clusters",
        "string",
        ".status.clusterNames",
        0,
        "Its members",
    ),
    Column::new(
        "Ready",
        "integer",
        ".status.readyClusters",
        0,
        "Members ready",
    ),
    Column::new(
        "CPU",
        "string",
        ".status.allocatable.cpu",
        0,
        "What the ready members' nodes give",
    ),
    Column::new(
        "Memory",
        "string",
        ".status.allocatable.memory",
        0,
        "What the ready members' nodes give",
    ),
    Column::new(
        "Water Level",
        "number",
        ".status.waterLevel",
        0,
        "The highest water level of its ready members",
    ),
    AGE,
];

fn spec() -> Value {
    json!({ "type": "object", "properties": { "cityCode": string("The city code.") } })
}
