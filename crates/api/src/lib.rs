//! Orrery's object model, with no I/O (in the manner of `kube-core`).
//!
//! - [`Object`]: a Kubernetes-style object of any kind, unknown fields preserved;
//! - [`ObjectMeta`]: typed standard metadata;
//! - [`labels`] and [`fields`]: selectors as the Kubernetes API parses them;
//! - [`Quantity`]: resource amounts with exact arithmetic;
//! - [`validation`]: name, label and metadata rules, and field errors for 422 responses;
//! - [`cluster`], [`work`], [`conditions`]: Orrery's member-cluster kinds and their rules;
//! - [`policy`], [`binding`], [`overrides`], [`interpret`]: placement policies, bindings,
//!   per-cluster overrides and what Orrery knows about workload kinds;
//! - [`stateful`]: volumes, the data mover's transfers, and migrations of stateful workloads;
//! - [`history`]: the schedule history's records;
//! - [`prediction`]: scheduling ahead of the load (a placement's `prediction`, and what
//!   decisions and the histories say of the forecasts they used);
//! - [`rollout`]: progressive rollouts (a placement's stages, revisions, the rollout's status);
//! - [`services`]: multi-cluster services (KEP-1645): exports merged into imports;
//! - [`kinds`]: one descriptor per own kind (names, scope, schema, columns, rules);
//! - [`keys`]: where each object lives in the store.

pub mod autoscaling;
pub mod binding;
pub mod cluster;
pub mod conditions;
pub mod cost;
pub mod customization;
pub mod data;
pub mod duration;
pub mod federated_quota;
pub mod fieldpath;
pub mod fields;
pub mod history;
pub mod interpret;
pub mod keys;
pub mod kinds;
pub mod labels;
mod layout;
pub mod location;
pub mod meta;
pub mod object;
pub mod overrides;
pub mod policy;
pub mod prediction;
pub mod quantity;
pub mod quota;
pub mod rebalancer;
pub mod rollout;
pub mod services;
pub mod stateful;
pub mod time;
pub mod token;
pub mod validation;
pub mod work;

pub use object::{Object, ObjectMeta, OwnerReference};
pub use quantity::{Format, Quantity, QuantityError};
pub use time::{MicroTime, Time};
