//! Member clusters: every Cluster has the namespace of its Works; an unregistered (deleted)
//! Cluster loses its heartbeat Lease and that namespace (and with it its Works) first, then
//! its tokens, then its finalizer. Looked at again every second while an unregistration is under way.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use orrery_api::{cluster, keys};
use orrery_store::ops::{delete_object, remove_finalizer};
use orrery_store::{ListOptions, Store, StoreError};
use tokio::sync::watch;

use super::Api;
use crate::runtime::Event;
use crate::runtime::controller::{Action, Controller, Keys, Origin, Reconciler, Source};
use crate::runtime::metrics::Handle;

struct Clusters {
    store: Arc<dyn Store>,
    api: Arc<dyn Api>,
    /// Clusters and whether each is being deleted.
    clusters: HashMap<String, bool>,
    /// Clusters whose namespace is known to exist (written by reconciles too).
    known: parking_lot::Mutex<HashSet<String>>,
    /// When the namespaces were last listed to learn `known` (see `reconcile`).
    namespaces_listed: parking_lot::Mutex<Option<Instant>>,
}

/// How stale a listing of the namespaces may be before a Cluster not known is looked up
/// by listing them again.
const RELEARN: Duration = Duration::from_secs(10);

impl Clusters {
    /// Learns from one listing which Clusters' namespaces exist (and are not being deleted).
    async fn learn_namespaces(&self) -> Result<(), StoreError> {
        #[derive(serde::Deserialize)]
        struct Meta {
            metadata: orrery_api::ObjectMeta,
        }
        let prefix = keys::prefix("", "namespaces", None);
        let list = self
            .store
            .list_raw(&prefix, &ListOptions::default())
            .await?;
        for item in &list.items {
            let Ok(ns) = serde_json::from_slice::<Meta>(&item.json) else {
                continue;
            };
            let m = ns.metadata;
            if let Some(name) = m.name.strip_prefix(cluster::NAMESPACE_PREFIX)
                && m.deletion_timestamp.is_none()
                && self.clusters.get(name) == Some(&false)
            {
                self.known.lock().insert(name.to_string());
            }
        }
        *self.namespaces_listed.lock() = Some(Instant::now());
        Ok(())
    }
}

#[async_trait::async_trait]
impl Reconciler for Clusters {
    type Key = String;
    type Error = StoreError;

    fn on_event(&mut self, _: Origin, ev: Event, keys: &mut Keys<String>) {
        match ev {
            Event::Listed(items) => {
                self.clusters = items
                    .iter()
                    .map(|c| {
                        (
                            c.name().to_string(),
                            c.metadata.deletion_timestamp.is_some(),
                        )
                    })
                    .collect();
                let clusters = &self.clusters;
                self.known.get_mut().retain(|c| clusters.contains_key(c));
                keys.extend(self.clusters.keys().cloned());
            }
            Event::Upsert(c) => {
                let deleting = c.metadata.deletion_timestamp.is_some();
                // Heartbeats change Clusters often: only what matters here queues a key.
                if self.clusters.insert(c.name().to_string(), deleting) != Some(deleting)
                    || (!deleting && !self.known.get_mut().contains(c.name()))
                {
                    keys.push(c.name().to_string());
                }
            }
            Event::Delete(c) => {
                self.clusters.remove(c.name());
                self.known.get_mut().remove(c.name());
            }
        }
    }

    async fn reconcile(&self, name: &String) -> Result<Action, StoreError> {
        match self.clusters.get(name) {
            None => Ok(Action::Done),
            Some(false) => {
                if self.known.lock().contains(name) {
                    return Ok(Action::Done);
                }
                // A fleet registering, or a new leader taking over, brings thousands of
                // Clusters at once: one listing of the namespaces answers for all of them,
                // where a read each was as many round trips to the store (at 10,000 members
                // a quarter of an hour of the controller's time, on etcd's busiest minutes).
                let stale = self
                    .namespaces_listed
                    .lock()
                    .is_none_or(|t| t.elapsed() >= RELEARN);
                if stale {
                    self.learn_namespaces().await?;
                    if self.known.lock().contains(name) {
                        return Ok(Action::Done);
                    }
                }
                match self.api.ensure_cluster_namespace(name).await {
                    Ok(()) => {
                        self.known.lock().insert(name.clone());
                        Ok(Action::Done)
                    }
                    Err(e) => Err(StoreError::Backend(format!(
                        "creating the namespace of cluster {name}: {e}"
                    ))),
                }
            }
            Some(true) => {
                self.known.lock().remove(name);
                unregister(self.store.as_ref(), self.api.as_ref(), name)
                    .await
                    .map(Action::from)
            }
        }
    }
}

pub async fn run(
    store: Arc<dyn Store>,
    api: Arc<dyn Api>,
    metrics: Handle,
    shutdown: watch::Receiver<bool>,
) {
    let r = Clusters {
        store: store.clone(),
        api,
        clusters: HashMap::new(),
        known: Default::default(),
        namespaces_listed: Default::default(),
    };
    Controller::new("clusters", store, r, metrics)
        .source(Source::new("clusters", keys::well_known::clusters()))
        .run(shutdown)
        .await;
}

async fn unregister(
    store: &dyn Store,
    api: &dyn Api,
    name: &str,
) -> Result<Option<Duration>, StoreError> {
    let key = keys::well_known::cluster(name);
    let c = match store.get(&key).await {
        Ok(c) => c,
        Err(StoreError::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    if c.metadata.deletion_timestamp.is_none()
        || !c
            .metadata
            .finalizers
            .iter()
            .any(|f| f == cluster::FINALIZER)
    {
        return Ok(None);
    }
    // Its heartbeat Lease first: the agent's next renewal fails, and the Cluster it reads
    // then tells it of the unregistration.
    let lease_key = keys::well_known::cluster_lease(name);
    match store.get(&lease_key).await {
        Ok(l) => delete_object(store, &lease_key, &l).await?,
        Err(StoreError::NotFound { .. }) => {}
        Err(e) => return Err(e),
    }
    let ns_key = keys::well_known::namespace(&cluster::namespace_of(name));
    match store.get(&ns_key).await {
        Ok(ns) => {
            // The namespace controller deletes the Works, then the namespace; come back after.
            delete_object(store, &ns_key, &ns).await?;
            return Ok(Some(Duration::from_secs(1)));
        }
        Err(StoreError::NotFound { .. }) => {}
        Err(e) => return Err(e),
    }
    let revoked = api.revoke_cluster(name).await?;
    remove_finalizer(store, &key, cluster::FINALIZER).await?;
    tracing::info!(
        cluster = name,
        tokens_revoked = revoked,
        "cluster unregistered"
    );
    Ok(None)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use orrery_api::Object;

    use super::*;
    use crate::propagation::KindInfo;

    /// Makes a cluster's namespace as the API server would, and counts how often it is asked.
    #[derive(Debug)]
    struct Namespaces {
        store: Arc<dyn Store>,
        asked: AtomicUsize,
    }

    #[async_trait::async_trait]
    impl super::super::Api for Namespaces {
        fn kind(&self, _: &str, _: &str) -> Option<KindInfo> {
            None
        }
        fn namespaced_kinds(&self) -> Vec<KindInfo> {
            Vec::new()
        }
        fn crd_kind(&self, _: &Object) -> Option<KindInfo> {
            None
        }
        async fn refresh_crds(&self) -> Result<(), StoreError> {
            Ok(())
        }
        async fn revoke_cluster(&self, _: &str) -> Result<usize, StoreError> {
            Ok(0)
        }
        async fn ensure_cluster_namespace(&self, cluster: &str) -> Result<(), String> {
            self.asked.fetch_add(1, Ordering::Relaxed);
            make_namespace(self.store.as_ref(), cluster).await;
            Ok(())
        }
    }

    async fn make_namespace(store: &dyn Store, cluster: &str) {
        let ns = cluster::namespace_of(cluster);
        let o = Object::new("v1", "Namespace").with_name(&ns);
        match store.create(&keys::well_known::namespace(&ns), o).await {
            Ok(_) | Err(StoreError::AlreadyExists { .. }) => {}
            Err(e) => panic!("{e}"),
        }
    }

    /// A new leader (or a fleet registering) brings every Cluster at once: those whose
    /// namespace is there are settled from one listing; only the others are made.
    #[tokio::test]
    async fn namespaces_that_exist_are_learned_from_a_listing_not_asked_for_one_by_one() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(orrery_store_sqlite::SqliteStore::open_dir(dir.path()).unwrap());
        let mut clusters = Vec::new();
        for i in 0..40 {
            let name = format!("m-{i}");
            let c = Object::new("multicluster.io/v1alpha1", "Cluster").with_name(&name);
            clusters.push(Arc::new(c));
            // The first 35 have their namespace already (made at registration).
            if i < 35 {
                make_namespace(store.as_ref(), &name).await;
            }
        }
        // A namespace being deleted is not one to count on.
        let doomed = cluster::namespace_of("m-0");
        let mut ns = store
            .get(&keys::well_known::namespace(&doomed))
            .await
            .unwrap();
        ns.metadata.deletion_timestamp = Some(orrery_api::Time::now());
        let rev = ns.revision();
        store
            .update(&keys::well_known::namespace(&doomed), ns, rev)
            .await
            .unwrap();
        let api = Arc::new(Namespaces {
            store: store.clone(),
            asked: AtomicUsize::new(0),
        });
        let mut r = Clusters {
            store: store.clone(),
            api: api.clone(),
            clusters: HashMap::new(),
            known: Default::default(),
            namespaces_listed: Default::default(),
        };
        let mut keys = Keys::default();
        r.on_event(
            Origin::named("clusters"),
            Event::Listed(clusters),
            &mut keys,
        );
        let keys = keys.pushed().to_vec();
        assert_eq!(keys.len(), 40);
        for k in &keys {
            r.reconcile(k).await.unwrap();
        }
        // m-0 (its namespace going) and m-35..m-39 (none yet).
        assert_eq!(api.asked.load(Ordering::Relaxed), 6);
        for i in 35..40 {
            let ns = cluster::namespace_of(&format!("m-{i}"));
            assert!(store.get(&keys::well_known::namespace(&ns)).await.is_ok());
        }
        // Settled: a second pass asks for nothing.
        for k in &keys {
            r.reconcile(k).await.unwrap();
        }
        assert_eq!(api.asked.load(Ordering::Relaxed), 6);
    }
}
