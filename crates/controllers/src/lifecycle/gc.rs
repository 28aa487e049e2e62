//! Garbage collection, from the `ownerReferences` of everything stored: dependents whose
//! owners are all gone are deleted; an owner deleted with `propagationPolicy: Orphan` leaves
//! its dependents without the reference; one deleted with `Foreground` waits for its
//! dependents to be deleted first.
//!
//! The graph of who depends on whom is kept from one reflector over the whole registry. An
//! owner is judged gone only by reading it from the store, right before its dependent is
//! deleted.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use orrery_api::{Object, OwnerReference};
use orrery_store::ops::{delete_object, remove_finalizer};
use orrery_store::{Store, StoreError};
use tokio::sync::watch;

use super::{Api, key_of};
use crate::runtime::Event;
use crate::runtime::controller::{Action, Controller, Keys, Origin, Reconciler, Source};
use crate::runtime::metrics::Handle;

const ORPHAN: &str = "orphan";
const FOREGROUND: &str = "foregroundDeletion";
const ROOT: &str = "/registry/";

/// Who depends on whom.
#[derive(Default)]
struct Graph {
    /// Owner uid → keys of its dependents.
    dependents: HashMap<String, HashSet<String>>,
    /// Dependent key → its owner uids.
    owners: HashMap<String, Vec<String>>,
    /// Uids of the dependents (objects with owners), so that the many objects with none
    /// cost nothing per change.
    dependent_uids: HashSet<String>,
}

impl Graph {
    /// Whether a change of this object can matter to the graph.
    fn concerns(&self, o: &Object) -> bool {
        !o.metadata.owner_references.is_empty()
            || o.metadata.deletion_timestamp.is_some()
            || self.dependent_uids.contains(&o.metadata.uid)
            || self.dependents.contains_key(&o.metadata.uid)
    }

    fn set(&mut self, key: &str, uid: &str, refs: &[OwnerReference]) {
        // Most changes of a dependent leave its owners as they were (a member's Lease is
        // renewed every beat): the entries are already these.
        let unchanged = |owners: &Vec<String>| {
            owners.len() == refs.len() && owners.iter().zip(refs).all(|(o, r)| *o == r.uid)
        };
        if !refs.is_empty()
            && self.dependent_uids.contains(uid)
            && self.owners.get(key).is_some_and(unchanged)
        {
            return;
        }
        self.remove(key);
        self.dependent_uids.remove(uid);
        if refs.is_empty() {
            return;
        }
        self.dependent_uids.insert(uid.to_string());
        for r in refs {
            self.dependents
                .entry(r.uid.clone())
                .or_default()
                .insert(key.to_string());
        }
        self.owners.insert(
            key.to_string(),
            refs.iter().map(|r| r.uid.clone()).collect(),
        );
    }

    fn remove(&mut self, key: &str) {
        if let Some(uids) = self.owners.remove(key) {
            for uid in uids {
                if let Some(d) = self.dependents.get_mut(&uid) {
                    d.remove(key);
                    if d.is_empty() {
                        self.dependents.remove(&uid);
                    }
                }
            }
        }
    }

    fn dependents_of(&self, uid: &str) -> Vec<String> {
        self.dependents
            .get(uid)
            .map(|d| d.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// What to look at.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Task {
    /// A dependent: deleted if none of its owners remains.
    Collect(String),
    /// An owner being deleted: orphan or collect its dependents, per its finalizers.
    Owner(String),
}

struct Collector {
    store: Arc<dyn Store>,
    api: Arc<dyn Api>,
    graph: Graph,
}

#[async_trait::async_trait]
impl Reconciler for Collector {
    type Key = Task;
    type Error = StoreError;

    fn on_event(&mut self, _: Origin, ev: Event, tasks: &mut Keys<Task>) {
        let api = self.api.as_ref();
        let g = &mut self.graph;
        match ev {
            Event::Listed(items) => {
                *g = Graph::default();
                for o in &items {
                    if !g.concerns(o) {
                        continue;
                    }
                    let Some(key) = key_of(api, o) else {
                        continue;
                    };
                    g.set(&key, &o.metadata.uid, &o.metadata.owner_references);
                    if o.metadata.deletion_timestamp.is_some() {
                        tasks.push(Task::Owner(key));
                    }
                }
                // Owners that disappeared while nobody was watching.
                tasks.extend(g.owners.keys().cloned().map(Task::Collect));
            }
            Event::Upsert(o) => {
                if !g.concerns(&o) {
                    return;
                }
                let Some(key) = key_of(api, &o) else {
                    return;
                };
                g.set(&key, &o.metadata.uid, &o.metadata.owner_references);
                if o.metadata.deletion_timestamp.is_some() {
                    tasks.push(Task::Owner(key));
                }
            }
            Event::Delete(o) => {
                if !g.concerns(&o) {
                    return;
                }
                g.dependent_uids.remove(&o.metadata.uid);
                if let Some(key) = key_of(api, &o) {
                    g.remove(&key);
                }
                tasks.extend(
                    g.dependents_of(&o.metadata.uid)
                        .into_iter()
                        .map(Task::Collect),
                );
                // A foreground-deleted owner waits for its last dependent.
                for r in &o.metadata.owner_references {
                    if let Some(key) = owner_key(api, o.namespace(), r) {
                        tasks.push(Task::Owner(key));
                    }
                }
            }
        }
    }

    async fn reconcile(&self, task: &Task) -> Result<Action, StoreError> {
        match task {
            Task::Collect(key) => {
                collect_if_orphaned(self.store.as_ref(), self.api.as_ref(), key).await?
            }
            Task::Owner(key) => {
                handle_owner(self.store.as_ref(), self.api.as_ref(), &self.graph, key).await?
            }
        }
        Ok(Action::Done)
    }
}

pub async fn run(
    store: Arc<dyn Store>,
    api: Arc<dyn Api>,
    metrics: Handle,
    shutdown: watch::Receiver<bool>,
) {
    let r = Collector {
        store: store.clone(),
        api,
        graph: Graph::default(),
    };
    Controller::new("gc", store, r, metrics)
        .source(Source::new("registry", ROOT.to_string()).filtered(listed))
        .run(shutdown)
        .await;
}

/// Whether a listed object can matter to the graph (see [`Graph::concerns`]: a fresh graph
/// holds nothing, so only dependents and objects being deleted). Stored objects are written
/// by serializing an [`Object`], so these keys appear literally if the fields are set (and
/// never escaped); a mention elsewhere only costs a parse.
fn listed(json: &[u8]) -> bool {
    memchr::memmem::find(json, b"\"ownerReferences\"").is_some()
        || memchr::memmem::find(json, b"\"deletionTimestamp\"").is_some()
}

/// The store key of the object an owner reference points at.
fn owner_key(api: &dyn Api, dependent_ns: &str, r: &OwnerReference) -> Option<String> {
    let group = r.api_version.split_once('/').map(|(g, _)| g).unwrap_or("");
    let info = api.kind(group, &r.kind)?;
    let ns = if info.namespaced { dependent_ns } else { "" };
    Some(info.key(ns, &r.name))
}

/// The stored owner a reference points at, if it still exists with that uid.
async fn owner_of(
    store: &dyn Store,
    api: &dyn Api,
    dependent_ns: &str,
    r: &OwnerReference,
) -> Result<Option<Object>, StoreError> {
    let Some(key) = owner_key(api, dependent_ns, r) else {
        return Ok(None);
    };
    match store.get(&key).await {
        Ok(o) => Ok((o.metadata.uid == r.uid).then_some(o)),
        Err(StoreError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Deletes the dependent at `key` if none of its owners remain (an owner being deleted in the
/// foreground takes it too); both are read from the store now.
async fn collect_if_orphaned(
    store: &dyn Store,
    api: &dyn Api,
    key: &str,
) -> Result<(), StoreError> {
    let dep = match store.get(key).await {
        Ok(d) => d,
        Err(StoreError::NotFound { .. }) => return Ok(()),
        Err(e) => return Err(e),
    };
    if dep.metadata.owner_references.is_empty() {
        return Ok(());
    }
    for r in &dep.metadata.owner_references {
        if let Some(owner) = owner_of(store, api, dep.namespace(), r).await? {
            let foreground = owner.metadata.deletion_timestamp.is_some()
                && owner.metadata.finalizers.iter().any(|f| f == FOREGROUND);
            if !foreground {
                return Ok(());
            }
        }
    }
    delete_object(store, key, &dep).await?;
    tracing::debug!(
        key,
        "garbage collector: deleted a dependent whose owners are gone"
    );
    Ok(())
}

/// An owner marked for deletion: orphan or delete its dependents, per its finalizers; a
/// foreground deletion ends once no dependent is left.
async fn handle_owner(
    store: &dyn Store,
    api: &dyn Api,
    graph: &Graph,
    key: &str,
) -> Result<(), StoreError> {
    let owner = match store.get(key).await {
        Ok(o) => o,
        Err(StoreError::NotFound { .. }) => return Ok(()),
        Err(e) => return Err(e),
    };
    if owner.metadata.deletion_timestamp.is_none() {
        return Ok(());
    }
    let deps = graph.dependents_of(&owner.metadata.uid);
    if owner.metadata.finalizers.iter().any(|f| f == ORPHAN) {
        for dep in &deps {
            let uid = owner.metadata.uid.clone();
            match orrery_store::update_with(store, dep, |mut o| {
                let before = o.metadata.owner_references.len();
                o.metadata.owner_references.retain(|r| r.uid != uid);
                Ok((o.metadata.owner_references.len() != before).then_some(o))
            })
            .await
            {
                Ok(_) | Err(StoreError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        remove_finalizer(store, key, ORPHAN).await?;
    } else if owner.metadata.finalizers.iter().any(|f| f == FOREGROUND) {
        if deps.is_empty() {
            remove_finalizer(store, key, FOREGROUND).await?;
        }
        for dep in &deps {
            collect_if_orphaned(store, api, dep).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owned_by(uids: &[&str]) -> Vec<OwnerReference> {
        uids.iter()
            .map(|u| OwnerReference {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                name: format!("owner-{u}"),
                uid: (*u).into(),
                controller: None,
                block_owner_deletion: None,
            })
            .collect()
    }

    #[test]
    fn the_graph_follows_owners_changed_kept_and_dropped() {
        let mut g = Graph::default();
        let dependents = |g: &Graph, owner: &str| {
            let mut d = g.dependents_of(owner);
            d.sort();
            d
        };
        g.set("k1", "d1", &owned_by(&["a", "b"]));
        g.set("k2", "d2", &owned_by(&["a"]));
        // The same owners again (the fast path) change nothing.
        g.set("k1", "d1", &owned_by(&["a", "b"]));
        assert_eq!(dependents(&g, "a"), ["k1", "k2"]);
        assert_eq!(dependents(&g, "b"), ["k1"]);
        // Owners changed: the old one lets go.
        g.set("k1", "d1", &owned_by(&["a", "c"]));
        assert_eq!(dependents(&g, "b"), Vec::<String>::new());
        assert!(!g.dependents.contains_key("b"));
        assert_eq!(dependents(&g, "c"), ["k1"]);
        // Made again under the same key (a new uid), with the same owners.
        g.set("k1", "d1b", &owned_by(&["a", "c"]));
        assert!(g.dependent_uids.contains("d1b"));
        assert_eq!(dependents(&g, "a"), ["k1", "k2"]);
        // Owners dropped.
        g.set("k2", "d2", &[]);
        assert_eq!(dependents(&g, "a"), ["k1"]);
        assert!(!g.dependent_uids.contains("d2"));
        assert!(!g.owners.contains_key("k2"));
    }

    #[test]
    fn a_listing_keeps_exactly_the_objects_the_graph_can_use() {
        let plain = Object::new("v1", "ConfigMap");
        let mut dependent = plain.clone();
        dependent.metadata.owner_references.push(OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: "owner".into(),
            uid: "u1".into(),
            controller: None,
            block_owner_deletion: None,
        });
        let mut deleting = plain.clone();
        deleting.metadata.deletion_timestamp = Some(orrery_api::Time::now());
        // A mention elsewhere is parsed for nothing, and dropped by the graph.
        let mentions = plain
            .clone()
            .with_spec(serde_json::json!({"note": "ownerReferences"}));
        for (o, kept, concerns) in [
            (&plain, false, false),
            (&dependent, true, true),
            (&deleting, true, true),
            (&mentions, true, false),
        ] {
            let json = serde_json::to_vec(o).unwrap();
            assert_eq!(listed(&json), kept, "{}", String::from_utf8_lossy(&json));
            assert_eq!(Graph::default().concerns(o), concerns);
        }
    }
}
