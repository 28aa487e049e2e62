//! One [`Descriptor`] per kind of Orrery's own: its names, scope, schema, printer columns and
//! the rules the API server applies to it. The server's registry, discovery, OpenAPI, CRD
//! objects, tables and store keys all iterate [`OWN`]; nothing else names an own kind's
//! plural or schema. Adding a kind is its descriptor (beside its family's, in this folder)
//! and one line in [`OWN`].
//!
//! Descriptors are data: no I/O, and hooks are plain functions over objects.

use serde_json::Value;

use crate::Object;
use crate::validation::{ErrorList, FieldError};

mod autoscaling;
mod binding;
mod cluster;
mod data;
mod decisions;
mod federated_quota;
mod interpreter;
mod inventory;
mod location;
mod migration;
pub mod openapi;
mod policies;
mod quota;
mod rebalancer;
mod rollout;
mod services;
mod work;

pub use autoscaling::{CRON_FEDERATED_HPA, FEDERATED_HPA};
pub use binding::RESOURCE_BINDING;
pub use cluster::CLUSTER;
pub use data::{DATA_SET, DATA_TRANSFER};
pub use decisions::{OCM_PLACEMENT_DECISION, SIG_PLACEMENT_DECISION};
pub use federated_quota::FEDERATED_RESOURCE_QUOTA;
pub use interpreter::{RESOURCE_INTERPRETER, RESOURCE_INTERPRETER_CUSTOMIZATION};
pub use inventory::{CLUSTER_PROFILE, CLUSTER_PROPERTY};
pub use location::LOCATION;
pub use migration::MIGRATION;
pub use policies::{
    CLUSTER_OVERRIDE_POLICY, CLUSTER_PROPAGATION_POLICY, KARMADA_CLUSTER_OVERRIDE_POLICY,
    OVERRIDE_POLICY, PROPAGATION_POLICY, RESOURCE_PLACEMENT_POLICY,
};
pub use quota::{CLUSTER_METRICS, CLUSTER_RESOURCE_CLAIM};
pub use rebalancer::WORKLOAD_REBALANCER;
pub use rollout::ROLLOUT_APPROVAL;
pub use services::{SERVICE_EXPORT, SERVICE_IMPORT};
pub use work::WORK;

/// Every own kind, in the order discovery lists them (groups in order of first appearance).
pub const OWN: &[&Descriptor] = &[
    &CLUSTER,
    &RESOURCE_PLACEMENT_POLICY,
    &CLUSTER_OVERRIDE_POLICY,
    &RESOURCE_BINDING,
    &WORK,
    &MIGRATION,
    &DATA_SET,
    &DATA_TRANSFER,
    &RESOURCE_INTERPRETER,
    &RESOURCE_INTERPRETER_CUSTOMIZATION,
    &FEDERATED_HPA,
    &CRON_FEDERATED_HPA,
    &PROPAGATION_POLICY,
    &CLUSTER_PROPAGATION_POLICY,
    &OVERRIDE_POLICY,
    &KARMADA_CLUSTER_OVERRIDE_POLICY,
    &CLUSTER_PROFILE,
    &SERVICE_EXPORT,
    &SERVICE_IMPORT,
    &OCM_PLACEMENT_DECISION,
    &SIG_PLACEMENT_DECISION,
    &LOCATION,
    &CLUSTER_RESOURCE_CLAIM,
    &CLUSTER_METRICS,
    &CLUSTER_PROPERTY,
    &ROLLOUT_APPROVAL,
    &WORKLOAD_REBALANCER,
    &FEDERATED_RESOURCE_QUOTA,
];

/// The category every own kind is in (`kubectl get orrery`).
pub const CATEGORY: &str = "orrery";

/// What the API server knows of one own kind.
#[derive(Debug)]
pub struct Descriptor {
    pub group: &'static str,
    /// The version objects are stored at, and the group's preferred one.
    pub version: &'static str,
    /// Older versions served beside it, of the same schema (upstream's versions differ in
    /// name only): an object written at one reads the same at the other, every field kept.
    pub also_served: &'static [&'static str],
    pub kind: &'static str,
    pub plural: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    /// Whether it has a status subresource.
    pub status: bool,
    /// What `kubectl explain` says of the kind.
    pub description: &'static str,
    pub schema: Schema,
    /// `kubectl get` columns (after the name).
    pub columns: &'static [Column],
    /// Validation beyond the schema, on create (`old` is `None`) and update.
    pub validate: Option<fn(&Object, Option<&Object>) -> ErrorList>,
    /// The spec cannot change once created (a move or copy under way is not redirected).
    pub spec_immutable: bool,
    /// A finalizer every new object gets.
    pub finalizer: Option<&'static str>,
    /// Server-owned parts of a status write: `(stored status, written status)`.
    pub on_status: Option<StatusHook>,
}

/// Fills the server-owned parts of a status write: `(stored status, written status)`.
pub type StatusHook = fn(Option<&Value>, &mut Option<Value>);

/// Where a kind's OpenAPI schema comes from.
#[derive(Clone, Copy, Debug)]
pub enum Schema {
    /// A spec and a status, each generated or written. `open` keeps fields the types do not
    /// declare (objects Orrery writes and reads leniently).
    Parts {
        spec: Part,
        status: Option<Part>,
        open: bool,
    },
    /// Written out: the whole component (kinds of an unusual shape).
    Written(fn(&Descriptor) -> Value),
}

/// One part of a schema.
#[derive(Clone, Copy, Debug)]
pub enum Part {
    /// Generated from the type it is read with, so the two cannot drift.
    Typed(Root),
    /// Written out (what Orrery writes and no one type reads whole).
    Written(fn() -> Value),
}

impl Schema {
    /// A spec and a status generated from their types.
    pub const fn typed(spec: Root, status: Option<Root>) -> Self {
        Schema::Parts {
            spec: Part::Typed(spec),
            status: match status {
                Some(s) => Some(Part::Typed(s)),
                None => None,
            },
            open: false,
        }
    }
}

/// A type's root schema from a generator the server configures.
pub type Root = fn(schemars::SchemaGenerator) -> schemars::Schema;

/// [`Root`] of `T`.
pub fn root<T: schemars::JsonSchema>(g: schemars::SchemaGenerator) -> schemars::Schema {
    g.into_root_schema_for::<T>()
}

/// A printed column (`metav1.TableColumnDefinition` and its JSONPath).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Column {
    pub name: &'static str,
    pub type_: &'static str,
    pub json_path: &'static str,
    /// 0: always shown; 1: with `-o wide`.
    pub priority: i32,
    pub description: &'static str,
    /// A water level (a fraction of capacity): past 1 it says so.
    pub level: bool,
}

impl Column {
    pub const fn new(
        name: &'static str,
        type_: &'static str,
        json_path: &'static str,
        priority: i32,
        description: &'static str,
    ) -> Self {
        Column {
            name,
            type_,
            json_path,
            priority,
            description,
            level: false,
        }
    }

    /// Shown as a water level.
    pub const fn level(mut self) -> Self {
        self.level = true;
        self
    }
}

/// Every kind's age column.
pub const AGE: Column = Column::new(
    "Age",
    "date",
    ".metadata.creationTimestamp",
    0,
    "Time since creation",
);

impl Descriptor {
    /// `group/version`.
    pub fn api_version(&self) -> String {
        format!("{}/{}", self.group, self.version)
    }

    /// The store key of one object (`namespace` is ignored for cluster-scoped kinds).
    pub fn key(&self, namespace: &str, name: &str) -> String {
        let ns = self.namespaced.then_some(namespace);
        crate::layout::object(self.group, self.plural, ns, name)
    }

    /// The store prefix of one namespace's objects, or of all.
    pub fn prefix(&self, namespace: Option<&str>) -> String {
        let ns = namespace.filter(|_| self.namespaced);
        crate::layout::prefix(self.group, self.plural, ns)
    }

    /// Every rule of the kind for a new (`old` is `None`) or updated object.
    pub fn check(&self, obj: &Object, old: Option<&Object>) -> ErrorList {
        let mut errs = self.validate.map(|v| v(obj, old)).unwrap_or_default();
        if self.spec_immutable
            && let Some(old) = old
            && old.spec != obj.spec
        {
            errs.push(FieldError::invalid("spec", "", "field is immutable"));
        }
        errs
    }
}

/// The own kind `kind` of `group`.
pub fn own(group: &str, kind: &str) -> Option<&'static Descriptor> {
    OWN.iter()
        .copied()
        .find(|d| d.group == group && d.kind == kind)
}

pub use crate::meta::same_schema;

/// The own groups and each version they serve, in discovery order.
pub fn own_groups() -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for d in OWN {
        for v in std::iter::once(&d.version).chain(d.also_served) {
            if !out.contains(&(d.group, *v)) {
                out.push((d.group, v));
            }
        }
    }
    out
}

/// A validation hook that parses the spec with `parse` and reports what it says.
fn spec_errors<T>(parsed: Result<T, ErrorList>) -> ErrorList {
    parsed.err().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kinds_served_at_several_versions_are_what_the_descriptors_say() {
        let from_descriptors: Vec<(&str, &str, &str, &[&str])> = OWN
            .iter()
            .filter(|d| !d.also_served.is_empty())
            .map(|d| (d.group, d.kind, d.version, d.also_served))
            .collect();
        assert_eq!(from_descriptors, crate::meta::SERVED_AT_SEVERAL_VERSIONS);
        assert!(same_schema(
            "ServiceExport",
            "multicluster.x-k8s.io/v1alpha1",
            "multicluster.x-k8s.io/v1beta1"
        ));
        assert!(!same_schema(
            "ServiceExport",
            "multicluster.x-k8s.io/v1alpha1",
            "multicluster.x-k8s.io/v2"
        ));
        assert!(!same_schema("Deployment", "apps/v1", "apps/v1beta2"));
    }

    #[test]
    fn every_own_kind_is_listed_once_and_named_consistently() {
        let mut seen = std::collections::HashSet::new();
        for d in OWN {
            assert!(seen.insert((d.group, d.plural)), "{} twice", d.kind);
            assert_eq!(d.plural, d.plural.to_lowercase(), "{}", d.kind);
            assert!(!d.description.is_empty(), "{} has no description", d.kind);
            assert!(own(d.group, d.kind).is_some_and(|f| f.plural == d.plural));
        }
        // A version is served once per kind.
        for d in OWN {
            assert!(!d.also_served.contains(&d.version), "{}", d.kind);
        }
    }

    #[test]
    fn an_immutable_spec_is_refused_on_update_only() {
        let a = Object::new("multicluster.io/v1alpha1", "DataTransfer")
            .with_name("t")
            .with_namespace("ns");
        let mut b = a.clone();
        b.spec = Some(serde_json::json!({"x": 1}));
        let d = Descriptor {
            validate: None,
            ..DATA_TRANSFER
        };
        assert!(d.check(&b, None).is_empty());
        assert!(d.check(&b, Some(&b)).is_empty());
        let errs = d.check(&b, Some(&a));
        assert!(
            format!("{errs:?}").contains("field is immutable"),
            "{errs:?}"
        );
    }
}
