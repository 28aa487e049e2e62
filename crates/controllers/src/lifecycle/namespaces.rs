//! A terminating namespace: its objects of every namespaced kind are deleted, then its
//! `kubernetes` finalizer goes and the namespace with it. Looked at again every second while
//! objects remain.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use orrery_api::keys;
use orrery_store::ops::{delete_object, namespace_spec_finalized};
use orrery_store::{ListOptions, Preconditions, Store, StoreError};
use serde_json::Value;
use tokio::sync::watch;

use super::Api;
use crate::runtime::metrics::Handle;
use crate::runtime::{Event, reflector};

/// The finalizer the API server puts on every namespace (`spec.finalizers`).
pub const NAMESPACE_FINALIZER: &str = "kubernetes";

struct Namespaces {
    store: Arc<dyn Store>,
    api: Arc<dyn Api>,
    /// Namespaces being deleted.
    terminating: HashSet<String>,
}

#[async_trait::async_trait]
impl super::Reconciler for Namespaces {
    type Key = String;

    fn on_event(&mut self, ev: Event, keys: &mut Vec<String>) {
        match ev {
            Event::Listed(items) => {
                self.terminating.clear();
                for o in items {
                    if o.metadata.deletion_timestamp.is_some() {
                        self.terminating.insert(o.name().to_string());
                        keys.push(o.name().to_string());
                    }
                }
            }
            Event::Upsert(o) => {
                if o.metadata.deletion_timestamp.is_some()
                    && self.terminating.insert(o.name().to_string())
                {
                    keys.push(o.name().to_string());
                }
            }
            Event::Delete(o) => {
                self.terminating.remove(o.name());
            }
        }
    }

    async fn reconcile(&mut self, name: &String) -> Result<Option<Duration>, StoreError> {
        if !self.terminating.contains(name) {
            return Ok(None);
        }
        finish(self.store.as_ref(), self.api.as_ref(), name).await
    }
}

pub async fn run(
    store: Arc<dyn Store>,
    api: Arc<dyn Api>,
    metrics: Handle,
    shutdown: watch::Receiver<bool>,
) {
    let events = reflector::spawn(
        store.clone(),
        keys::prefix("", "namespaces", None),
        shutdown.clone(),
    );
    let mut r = Namespaces {
        store,
        api,
        terminating: HashSet::new(),
    };
    super::drive(events, &mut r, &metrics, shutdown).await;
}

/// Deletes what the namespace holds; once it is empty, the namespace. `Some(wait)` while
/// objects remain.
async fn finish(
    store: &dyn Store,
    api: &dyn Api,
    name: &str,
) -> Result<Option<Duration>, StoreError> {
    let key = keys::well_known::namespace(name);
    // Decided from the stored namespace, not the cached one.
    let ns = match store.get(&key).await {
        Ok(ns) => ns,
        Err(StoreError::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    if ns.metadata.deletion_timestamp.is_none() {
        return Ok(None);
    }
    let mut remaining = 0;
    for kind in api.namespaced_kinds() {
        let list = store
            .list(
                &orrery_api::keys::prefix(&kind.group, &kind.plural, Some(name)),
                &ListOptions::default(),
            )
            .await?;
        for obj in &list.items {
            remaining += 1;
            delete_object(store, &kind.key(name, obj.name()), obj).await?;
        }
    }
    if remaining > 0 {
        return Ok(Some(Duration::from_secs(1)));
    }
    let rev = ns.revision();
    let mut next = ns.clone();
    if let Some(Value::Array(f)) = next.spec.as_mut().and_then(|s| s.get_mut("finalizers")) {
        f.retain(|x| x != NAMESPACE_FINALIZER);
    }
    let result = if next.metadata.finalizers.is_empty() && namespace_spec_finalized(&next) {
        store
            .delete(
                &key,
                &Preconditions {
                    uid: Some(ns.metadata.uid.clone()),
                    revision: rev,
                },
            )
            .await
            .map(|_| ())
    } else {
        store.update(&key, next, rev).await.map(|_| ())
    };
    match result {
        Ok(()) => {
            tracing::info!(namespace = name, "namespace deleted");
            Ok(None)
        }
        Err(StoreError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}
