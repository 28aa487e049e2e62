//! CustomResourceDefinitions: a deleted CRD's objects go before the CRD does (then its kind
//! is served no more). The served kinds follow the stored CRDs on every replica, leader or
//! not (the API server's `App::follow_crds`).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use orrery_api::keys;
use orrery_store::ops::{delete_object, remove_finalizer};
use orrery_store::{ListOptions, Store, StoreError};
use tokio::sync::watch;

use super::Api;
use crate::runtime::Event;
use crate::runtime::controller::{Action, Controller, Keys, Origin, Reconciler, Source};
use crate::runtime::metrics::Handle;

/// The finalizer the API server puts on every CRD.
pub const CRD_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

/// A key of this controller's queue: a CRD being deleted.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Key {
    Deleting(String),
}

struct Crds {
    store: Arc<dyn Store>,
    api: Arc<dyn Api>,
    prefix: String,
    deleting: HashSet<String>,
}

#[async_trait::async_trait]
impl Reconciler for Crds {
    type Key = Key;
    type Error = StoreError;

    fn on_event(&mut self, _: Origin, ev: Event, keys: &mut Keys<Key>) {
        match ev {
            Event::Listed(items) => {
                self.deleting.clear();
                for o in items {
                    if o.metadata.deletion_timestamp.is_some() {
                        self.deleting.insert(o.name().to_string());
                        keys.push(Key::Deleting(o.name().to_string()));
                    }
                }
            }
            Event::Upsert(o) => {
                if o.metadata.deletion_timestamp.is_some()
                    && self.deleting.insert(o.name().to_string())
                {
                    keys.push(Key::Deleting(o.name().to_string()));
                }
            }
            Event::Delete(o) => {
                self.deleting.remove(o.name());
            }
        }
    }

    async fn reconcile(&self, key: &Key) -> Result<Action, StoreError> {
        match key {
            Key::Deleting(name) if self.deleting.contains(name) => {
                finish(self.store.as_ref(), self.api.as_ref(), &self.prefix, name)
                    .await
                    .map(Action::from)
            }
            Key::Deleting(_) => Ok(Action::Done),
        }
    }
}

pub async fn run(
    store: Arc<dyn Store>,
    api: Arc<dyn Api>,
    metrics: Handle,
    shutdown: watch::Receiver<bool>,
) {
    let prefix = keys::prefix("apiextensions.k8s.io", "customresourcedefinitions", None);
    let r = Crds {
        store: store.clone(),
        api,
        prefix: prefix.clone(),
        deleting: HashSet::new(),
    };
    Controller::new("crds", store, r, metrics)
        .source(Source::new("crds", prefix))
        .run(shutdown)
        .await;
}

async fn finish(
    store: &dyn Store,
    api: &dyn Api,
    prefix: &str,
    name: &str,
) -> Result<Option<Duration>, StoreError> {
    let key = format!("{prefix}{name}");
    let crd = match store.get(&key).await {
        Ok(c) => c,
        Err(StoreError::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    if crd.metadata.deletion_timestamp.is_none()
        || !crd.metadata.finalizers.iter().any(|f| f == CRD_FINALIZER)
    {
        return Ok(None);
    }
    let mut remaining = 0;
    if let Some(kind) = api.crd_kind(&crd) {
        let list = store.list(&kind.prefix(), &ListOptions::default()).await?;
        for obj in &list.items {
            remaining += 1;
            delete_object(store, &kind.key(obj.namespace(), obj.name()), obj).await?;
        }
    }
    if remaining > 0 {
        return Ok(Some(Duration::from_secs(1)));
    }
    remove_finalizer(store, &key, CRD_FINALIZER).await?;
    api.refresh_crds().await?;
    tracing::info!(crd = name, "custom resource definition deleted");
    Ok(None)
}
