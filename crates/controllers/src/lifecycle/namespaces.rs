//! A terminating namespace: its objects of every namespaced kind are deleted, then its
//! `kubernetes` finalizer goes and the namespace with it. Looked at again every second while
//! objects remain.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use orrery_api::conditions::{self, Condition};
use orrery_api::{Object, Time, keys};
use orrery_store::ops::{delete_object, namespace_spec_finalized};
use orrery_store::{ListOptions, Preconditions, Store, StoreError};
use serde_json::Value;
use tokio::sync::watch;

use super::Api;
use crate::runtime::Event;
use crate::runtime::controller::{Action, Controller, Keys, Origin, Reconciler, Source};
use crate::runtime::metrics::Handle;

/// The finalizer the API server puts on every namespace (`spec.finalizers`).
pub const NAMESPACE_FINALIZER: &str = "kubernetes";

struct Namespaces {
    store: Arc<dyn Store>,
    api: Arc<dyn Api>,
    /// Namespaces being deleted.
    terminating: HashSet<String>,
}

#[async_trait::async_trait]
impl Reconciler for Namespaces {
    type Key = String;
    type Error = StoreError;

    fn on_event(&mut self, _: Origin, ev: Event, keys: &mut Keys<String>) {
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

    async fn reconcile(&self, name: &String) -> Result<Action, StoreError> {
        if !self.terminating.contains(name) {
            return Ok(Action::Done);
        }
        finish(self.store.as_ref(), self.api.as_ref(), name)
            .await
            .map(Action::from)
    }
}

pub async fn run(
    store: Arc<dyn Store>,
    api: Arc<dyn Api>,
    metrics: Handle,
    shutdown: watch::Receiver<bool>,
) {
    let r = Namespaces {
        store: store.clone(),
        api,
        terminating: HashSet::new(),
    };
    Controller::new("namespaces", store, r, metrics)
        .source(Source::new(
            "namespaces",
            keys::prefix("", "namespaces", None),
        ))
        .run(shutdown)
        .await;
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
    // What is left, as kube-apiserver's namespace controller tells it: instances per
    // `resource.group`, and per finalizer.
    let mut by_resource: BTreeMap<String, usize> = BTreeMap::new();
    let mut by_finalizer: BTreeMap<String, usize> = BTreeMap::new();
    for kind in api.namespaced_kinds() {
        let list = store
            .list(
                &orrery_api::keys::prefix(&kind.group, &kind.plural, Some(name)),
                &ListOptions::default(),
            )
            .await?;
        for obj in &list.items {
            remaining += 1;
            *by_resource
                .entry(format!("{}.{}", kind.plural, kind.group))
                .or_default() += 1;
            for f in &obj.metadata.finalizers {
                *by_finalizer.entry(f.clone()).or_default() += 1;
            }
            delete_object(store, &kind.key(name, obj.name()), obj).await?;
        }
    }
    if remaining > 0 {
        record_progress(store, &ns, &by_resource, &by_finalizer).await?;
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

/// A terminating namespace's conditions, as kube-apiserver's namespace controller writes them
/// (what clients such as `kubectl describe namespace` and kopf wait on).
pub fn termination_conditions(
    by_resource: &BTreeMap<String, usize>,
    by_finalizer: &BTreeMap<String, usize>,
) -> Vec<Condition> {
    let remaining = |m: &BTreeMap<String, usize>| {
        m.iter()
            .map(|(k, n)| format!("{k} has {n} resource instances"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    vec![
        Condition::new(
            "NamespaceDeletionDiscoveryFailure",
            conditions::FALSE,
            "ResourcesDiscovered",
            "All resources successfully discovered",
        ),
        Condition::new(
            "NamespaceDeletionGroupVersionParsingFailure",
            conditions::FALSE,
            "ParsedGroupVersions",
            "All legacy kube types successfully parsed",
        ),
        Condition::new(
            "NamespaceDeletionContentFailure",
            conditions::FALSE,
            "ContentDeleted",
            "All content successfully deleted, may be waiting on finalization",
        ),
        if by_resource.is_empty() {
            Condition::new(
                "NamespaceContentRemaining",
                conditions::FALSE,
                "ContentRemoved",
                "All content successfully removed",
            )
        } else {
            Condition::new(
                "NamespaceContentRemaining",
                conditions::TRUE,
                "SomeResourcesRemain",
                format!("Some resources are remaining: {}", remaining(by_resource)),
            )
        },
        if by_finalizer.is_empty() {
            Condition::new(
                "NamespaceFinalizersRemaining",
                conditions::FALSE,
                "ContentHasNoFinalizers",
                "All content-preserving finalizers finished",
            )
        } else {
            Condition::new(
                "NamespaceFinalizersRemaining",
                conditions::TRUE,
                "SomeFinalizersRemain",
                format!(
                    "Some content in the namespace has finalizers remaining: {}",
                    by_finalizer
                        .iter()
                        .map(|(f, n)| format!("{f} in {n} resource instances"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
        },
    ]
}

/// Writes the conditions when they change (a count, a finalizer gone).
async fn record_progress(
    store: &dyn Store,
    ns: &Object,
    by_resource: &BTreeMap<String, usize>,
    by_finalizer: &BTreeMap<String, usize>,
) -> Result<(), StoreError> {
    let mut status = ns.status.clone().unwrap_or_else(|| serde_json::json!({}));
    let mut conds: Vec<Condition> = status
        .get("conditions")
        .cloned()
        .and_then(|c| serde_json::from_value(c).ok())
        .unwrap_or_default();
    let now = Time::now();
    let mut changed = false;
    for c in termination_conditions(by_resource, by_finalizer) {
        changed |= conditions::set(&mut conds, c, now);
    }
    if !changed {
        return Ok(());
    }
    status["phase"] = Value::from("Terminating");
    status["conditions"] = serde_json::to_value(&conds).unwrap_or_default();
    let mut next = ns.clone();
    next.status = Some(status);
    match store
        .update(&keys::well_known::namespace(ns.name()), next, ns.revision())
        .await
    {
        // Lost to another write: told again on the next look, a second from now.
        Ok(_) | Err(StoreError::Conflict { .. }) | Err(StoreError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn termination_conditions_say_what_remains() {
        let mut res = BTreeMap::new();
        res.insert("configmaps.".to_string(), 2);
        res.insert("deployments.apps".to_string(), 1);
        let mut fin = BTreeMap::new();
        fin.insert("example.com/keep".to_string(), 1);
        let c = termination_conditions(&res, &fin);
        let by = |t: &str| c.iter().find(|x| x.type_ == t).unwrap();
        assert_eq!(by("NamespaceContentRemaining").status, "True");
        assert_eq!(
            by("NamespaceContentRemaining").message,
            "Some resources are remaining: configmaps. has 2 resource instances, deployments.apps has 1 resource instances"
        );
        assert_eq!(
            by("NamespaceFinalizersRemaining").message,
            "Some content in the namespace has finalizers remaining: example.com/keep in 1 resource instances"
        );
        let done = termination_conditions(&BTreeMap::new(), &BTreeMap::new());
        assert!(done.iter().all(|x| x.status == "False"), "{done:?}");
        assert_eq!(done.len(), 5);
    }
}
