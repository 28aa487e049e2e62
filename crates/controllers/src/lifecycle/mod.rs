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
//! Each runs on the controller runtime: nothing is decided before its reflectors have listed,
//! keys are retried with backoff, and whatever a deletion rests on is read from the store
//! right before it. What they need of the API server (its registry of kinds, its tokens) comes
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

/// One lifecycle controller: how events become keys, and how a key is reconciled.
#[async_trait::async_trait]
pub(crate) trait Reconciler: Send {
    type Key: Clone + Eq + std::hash::Hash + std::fmt::Debug + Send + Sync;

    /// Takes in an event; pushes the keys it touches.
    fn on_event(&mut self, ev: crate::runtime::Event, keys: &mut Vec<Self::Key>);

    /// Reconciles one key; `Ok(Some(after))` when it needs another look then.
    async fn reconcile(
        &mut self,
        key: &Self::Key,
    ) -> Result<Option<std::time::Duration>, StoreError>;
}

/// Drives a work queue from one reflector's events until shutdown. Nothing is reconciled
/// before the first listing; failed keys are retried with backoff.
pub(crate) async fn drive<R: Reconciler>(
    mut events: crate::runtime::inbox::Events,
    r: &mut R,
    metrics: &crate::runtime::metrics::Handle,
    mut shutdown: watch::Receiver<bool>,
) {
    use std::time::{Duration, Instant};
    let mut queue =
        crate::runtime::queue::WorkQueue::new(Duration::from_millis(100), Duration::from_secs(30));
    let mut listed = false;
    loop {
        let wait = queue
            .next_due()
            .map(|t| t.saturating_duration_since(Instant::now()))
            .unwrap_or(Duration::from_secs(60));
        let ev = tokio::select! {
            ev = events.recv() => match ev {
                Some(ev) => Some(ev),
                None => return,
            },
            _ = tokio::time::sleep(wait) => None,
            _ = shutdown.changed() => {
                queue.shut_down();
                return;
            }
        };
        let mut keys = Vec::new();
        if let Some(ev) = ev {
            listed |= matches!(ev, crate::runtime::Event::Listed(_));
            r.on_event(ev, &mut keys);
            // Take in what else has arrived before acting.
            while let Ok(ev) = events.try_recv() {
                listed |= matches!(ev, crate::runtime::Event::Listed(_));
                r.on_event(ev, &mut keys);
            }
        }
        for k in keys {
            queue.add(k);
        }
        if !listed {
            continue;
        }
        metrics.synced(queue.len());
        let started = Instant::now();
        let mut failed = 0;
        while let Some(k) = queue.pop(Instant::now()) {
            if *shutdown.borrow() {
                queue.shut_down();
                return;
            }
            match r.reconcile(&k).await {
                Ok(None) => queue.forget(&k),
                Ok(Some(after)) => {
                    queue.forget(&k);
                    queue.after(k.clone(), Instant::now() + after);
                }
                Err(StoreError::Closed) => return,
                Err(e) => {
                    tracing::debug!(key = ?k, error = %e, "a lifecycle reconcile failed; retrying");
                    failed += 1;
                    queue.retry(k.clone(), Instant::now());
                }
            }
            queue.done(&k);
        }
        metrics.round(started, failed, queue.len());
    }
}
