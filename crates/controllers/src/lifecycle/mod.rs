//! The deletion machinery behind the API's contract, and each member's place in it:
//!
//! - [`namespaces`]: a terminating namespace's contents are deleted, then the namespace;
//! - [`crds`]: a deleted CustomResourceDefinition's objects are deleted, then the CRD (which
//!   stops its kind from being served); the served kinds follow the stored CRDs;
//! - [`gc`]: garbage collection: dependents whose owners (`ownerReferences`) are all gone are
//!   deleted; an owner deleted with `propagationPolicy: Orphan` leaves its dependents without
//!   the reference; one deleted with `Foreground` waits for its dependents to go first;
//! - [`clusters`]: every Cluster has its `orrery-cluster-<name>` namespace; an unregistered
//!   (deleted) Cluster's namespace and Works go first, then its tokens, then the Cluster.
//!
//! Each runs on the controller runtime ([`crate::runtime::controller`]): nothing is decided
//! before its reflector has listed, keys are retried with backoff, and whatever a deletion
//! rests on is read from the store right before it. What they need of the API server (its registry of kinds, its tokens) comes
//! through [`Api`], which the binary wires in.

use std::sync::Arc;

use orrery_api::Object;
use orrery_store::{Store, StoreError};
use tokio::sync::watch;

use crate::propagation::KindInfo;

pub mod clusters;
pub mod crds;
pub mod gc;
pub mod namespaces;

/// What the lifecycle controllers need of the API server.
#[async_trait::async_trait]
pub trait Api: Send + Sync + std::fmt::Debug {
    /// Where objects of a kind live (`group` is empty for the core group).
    fn kind(&self, group: &str, kind: &str) -> Option<KindInfo>;
    /// Every namespaced kind stored.
    fn namespaced_kinds(&self) -> Vec<KindInfo>;
    /// Where the objects of the kind a CustomResourceDefinition defines are stored.
    fn crd_kind(&self, crd: &Object) -> Option<KindInfo>;
    /// Serves what the stored CustomResourceDefinitions define.
    async fn refresh_crds(&self) -> Result<(), StoreError>;
    /// Revokes a cluster's tokens when it is unregistered; returns how many.
    async fn revoke_cluster(&self, cluster: &str) -> Result<usize, StoreError>;
    /// Creates the namespace of a cluster's Works if it is missing.
    async fn ensure_cluster_namespace(&self, cluster: &str) -> Result<(), String>;
}

/// The store key of an object, from its kind.
pub(crate) fn key_of(api: &dyn Api, o: &Object) -> Option<String> {
    let info = api.kind(o.group(), &o.kind)?;
    Some(info.key(o.namespace(), o.name()))
}

/// Starts the four controllers.
pub fn spawn(
    store: Arc<dyn Store>,
    api: Arc<dyn Api>,
    metrics: Arc<crate::runtime::metrics::ControllerMetrics>,
    shutdown: watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    vec![
        tokio::spawn(namespaces::run(
            store.clone(),
            api.clone(),
            metrics.of("namespaces"),
            shutdown.clone(),
        )),
        tokio::spawn(crds::run(
            store.clone(),
            api.clone(),
            metrics.of("crds"),
            shutdown.clone(),
        )),
        tokio::spawn(clusters::run(
            store.clone(),
            api.clone(),
            metrics.of("clusters"),
            shutdown.clone(),
        )),
        tokio::spawn(gc::run(store, api, metrics.of("gc"), shutdown)),
    ]
}
