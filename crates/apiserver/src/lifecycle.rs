//! The deletion machinery behind the API's contract, run beside the server:
//!
//! - namespaces: a terminating namespace's contents are deleted, then the namespace;
//! - CustomResourceDefinitions: a deleted CRD's objects are deleted, then the CRD (which stops
//!   its kind from being served);
//! - garbage collection: dependents whose owners (`ownerReferences`) are all gone are deleted;
//!   an owner deleted with `propagationPolicy: Orphan` leaves its dependents without the
//!   reference; one deleted with `Foreground` waits for its dependents to be deleted first;
//! - member clusters: every Cluster has its `orrery-cluster-<name>` namespace; an unregistered
//!   (deleted) Cluster's namespace and Works go first, then its tokens, then the Cluster.
//!
//! Each works from what is stored and converges after a restart.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use orrery_api::{Object, OwnerReference};
use orrery_store::ops::{delete_object, namespace_spec_finalized, remove_finalizer};
use orrery_store::{
    ListOptions, Preconditions, Revision, Store, StoreError, WatchEvent, WatchOptions,
};
use serde_json::Value;

use crate::app::App;
use crate::resources::ResourceType;
use crate::strategy::{CRD_FINALIZER, NAMESPACE_FINALIZER};

const ORPHAN: &str = "orphan";
const FOREGROUND: &str = "foregroundDeletion";

/// Starts the loops.
pub fn spawn(app: Arc<App>) -> Vec<tokio::task::JoinHandle<()>> {
    vec![
        tokio::spawn(namespaces(app.clone())),
        tokio::spawn(crds(app.clone())),
        tokio::spawn(clusters(app.clone())),
        tokio::spawn(garbage_collector(app)),
    ]
}

/// Keeps each Cluster's namespace, and unregisters deleted Clusters. Event-driven (heartbeats
/// change Clusters often), with a full pass at start, after a broken watch, and every few
/// seconds while an unregistration is under way.
async fn clusters(app: Arc<App>) {
    let prefix = orrery_api::keys::well_known::clusters();
    let mut shutdown = app.shutdown.clone();
    while !closed(&app) {
        let list = match app.store.list(&prefix, &ListOptions::default()).await {
            Ok(l) => l,
            Err(StoreError::Closed) => return,
            Err(e) => {
                tracing::warn!(error = %e, "listing clusters failed");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let mut known: HashSet<String> = HashSet::new();
        let mut deleting = false;
        for c in &list.items {
            deleting |= handle_cluster(&app, c, &mut known).await;
        }
        let mut w = match app
            .store
            .watch(&prefix, list.revision, WatchOptions::default())
            .await
        {
            Ok(w) => w,
            Err(StoreError::Closed) => return,
            Err(_) => continue,
        };
        loop {
            let tick = if deleting {
                Duration::from_secs(1)
            } else {
                Duration::from_secs(60)
            };
            let ev = tokio::select! {
                ev = w.next() => ev,
                _ = tokio::time::sleep(tick) => break,
                _ = shutdown.changed() => return,
            };
            match ev {
                Some(Ok(WatchEvent::Added(o))) | Some(Ok(WatchEvent::Modified(o))) => {
                    deleting |= handle_cluster(&app, &o, &mut known).await;
                }
                Some(Ok(WatchEvent::Deleted(o))) => {
                    known.remove(o.name());
                }
                Some(Ok(WatchEvent::Bookmark(_))) => {}
                Some(Err(_)) | None => break,
            }
        }
    }
}

/// Returns whether the cluster is being unregistered (and needs another look soon).
async fn handle_cluster(app: &App, c: &Object, known: &mut HashSet<String>) -> bool {
    use orrery_api::cluster;
    if c.metadata.deletion_timestamp.is_none() {
        if !known.contains(c.name()) {
            match crate::agent_api::ensure_cluster_namespace(app, c.name()).await {
                Ok(()) => {
                    known.insert(c.name().to_string());
                }
                Err(e) => {
                    tracing::warn!(cluster = c.name(), error = %e.message, "creating the cluster's namespace failed")
                }
            }
        }
        return false;
    }
    known.remove(c.name());
    if !c
        .metadata
        .finalizers
        .iter()
        .any(|f| f == cluster::FINALIZER)
    {
        return false;
    }
    if let Err(e) = unregister(app, c).await {
        tracing::warn!(cluster = c.name(), error = %e, "unregistering the cluster failed");
    }
    true
}

async fn unregister(app: &App, c: &Object) -> Result<(), StoreError> {
    use orrery_api::{cluster, keys};
    let ns_key = keys::well_known::namespace(&cluster::namespace_of(c.name()));
    match app.store.get(&ns_key).await {
        Ok(ns) => {
            // The namespace loop deletes the Works, then the namespace; come back after.
            return delete_object(app.store.as_ref(), &ns_key, &ns).await;
        }
        Err(StoreError::NotFound { .. }) => {}
        Err(e) => return Err(e),
    }
    let revoked = app
        .auth
        .revoke_cluster(c.name(), crate::auth::Revoke::Unregister)
        .await?;
    remove_finalizer(
        app.store.as_ref(),
        &keys::well_known::cluster(c.name()),
        cluster::FINALIZER,
    )
    .await?;
    tracing::info!(
        cluster = c.name(),
        tokens_revoked = revoked,
        "cluster unregistered"
    );
    Ok(())
}

fn closed(app: &App) -> bool {
    *app.shutdown.borrow()
}

/// Waits for a change under `prefix` after `from`, or `tick`, whichever comes first.
async fn wait_for_change(store: &dyn Store, prefix: &str, from: Revision, tick: Duration) {
    if let Ok(mut w) = store.watch(prefix, from, WatchOptions::default()).await {
        let _ = tokio::time::timeout(tick, w.next()).await;
    } else {
        tokio::time::sleep(tick).await;
    }
}

async fn namespaces(app: Arc<App>) {
    while !closed(&app) {
        let reg = app.resources.snapshot();
        let Some(ns_rt) = reg.get("", "v1", "namespaces") else {
            return;
        };
        let prefix = ns_rt.prefix(None);
        let mut from = 0;
        match app.store.list(&prefix, &ListOptions::default()).await {
            Ok(list) => {
                from = list.revision;
                for ns in list
                    .items
                    .iter()
                    .filter(|n| n.metadata.deletion_timestamp.is_some())
                {
                    if let Err(e) = finish_namespace(&app, &ns_rt, ns).await {
                        tracing::warn!(namespace = ns.name(), error = %e, "namespace clean-up failed");
                    }
                }
            }
            Err(StoreError::Closed) => return,
            Err(e) => tracing::warn!(error = %e, "listing namespaces failed"),
        }
        wait_for_change(app.store.as_ref(), &prefix, from, Duration::from_secs(1)).await;
    }
}

async fn finish_namespace(app: &App, ns_rt: &ResourceType, ns: &Object) -> Result<(), StoreError> {
    let reg = app.resources.snapshot();
    let mut remaining = 0;
    for rt in reg.stored().iter().filter(|t| t.namespaced) {
        let list = app
            .store
            .list(&rt.prefix(Some(ns.name())), &ListOptions::default())
            .await?;
        for obj in &list.items {
            remaining += 1;
            delete_object(app.store.as_ref(), &rt.key(ns.name(), obj.name()), obj).await?;
        }
    }
    if remaining > 0 {
        return Ok(());
    }
    let key = ns_rt.key("", ns.name());
    for _ in 0..8 {
        let current = match app.store.get(&key).await {
            Ok(o) => o,
            Err(StoreError::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        let rev = current.revision();
        let mut next = current.clone();
        if let Some(Value::Array(f)) = next.spec.as_mut().and_then(|s| s.get_mut("finalizers")) {
            f.retain(|x| x != NAMESPACE_FINALIZER);
        }
        let result = if next.metadata.finalizers.is_empty() && namespace_spec_finalized(&next) {
            app.store
                .delete(
                    &key,
                    &Preconditions {
                        uid: Some(current.metadata.uid.clone()),
                        revision: rev,
                    },
                )
                .await
                .map(|_| ())
        } else {
            app.store.update(&key, next, rev).await.map(|_| ())
        };
        match result {
            Ok(()) => {
                tracing::info!(namespace = ns.name(), "namespace deleted");
                return Ok(());
            }
            Err(StoreError::Conflict { .. }) => continue,
            Err(StoreError::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

async fn crds(app: Arc<App>) {
    while !closed(&app) {
        let reg = app.resources.snapshot();
        let Some(crd_rt) = reg.get("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        else {
            return;
        };
        let prefix = crd_rt.prefix(None);
        let mut from = 0;
        match app.store.list(&prefix, &ListOptions::default()).await {
            Ok(list) => {
                from = list.revision;
                for crd in list
                    .items
                    .iter()
                    .filter(|c| c.metadata.deletion_timestamp.is_some())
                {
                    if let Err(e) = finish_crd(&app, &crd_rt, crd).await {
                        tracing::warn!(crd = crd.name(), error = %e, "custom resource clean-up failed");
                    }
                }
            }
            Err(StoreError::Closed) => return,
            Err(e) => tracing::warn!(error = %e, "listing custom resource definitions failed"),
        }
        // Changes made elsewhere (another replica, this loop) change what is served.
        if let Err(e) = app.refresh_crds().await
            && e != StoreError::Closed
        {
            tracing::warn!(error = %e, "refreshing custom resource definitions failed");
        }
        wait_for_change(app.store.as_ref(), &prefix, from, Duration::from_secs(2)).await;
    }
}

async fn finish_crd(app: &App, crd_rt: &ResourceType, crd: &Object) -> Result<(), StoreError> {
    if !crd.metadata.finalizers.iter().any(|f| f == CRD_FINALIZER) {
        return Ok(());
    }
    let mut remaining = 0;
    if let Some((rt, _)) = crate::crd::types_of(crd)
        .into_iter()
        .find(|(rt, _)| rt.storage)
    {
        let list = app
            .store
            .list(&rt.prefix(None), &ListOptions::default())
            .await?;
        for obj in &list.items {
            remaining += 1;
            delete_object(
                app.store.as_ref(),
                &rt.key(obj.namespace(), obj.name()),
                obj,
            )
            .await?;
        }
    }
    if remaining == 0 {
        remove_finalizer(
            app.store.as_ref(),
            &crd_rt.key("", crd.name()),
            CRD_FINALIZER,
        )
        .await?;
        app.refresh_crds().await?;
        tracing::info!(crd = crd.name(), "custom resource definition deleted");
    }
    Ok(())
}

/// Who depends on whom, from the `ownerReferences` of everything stored.
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

const ROOT: &str = "/registry/";

async fn garbage_collector(app: Arc<App>) {
    while !closed(&app) {
        let mut graph = Graph::default();
        let mut opts = ListOptions::default().with_limit(1000);
        let mut from;
        let mut pending_owners: Vec<Object> = Vec::new();
        loop {
            let page = match app.store.list(ROOT, &opts).await {
                Ok(p) => p,
                Err(StoreError::Closed) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "garbage collector: listing failed");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            from = page.revision;
            for obj in page.items {
                if obj.metadata.owner_references.is_empty()
                    && obj.metadata.deletion_timestamp.is_none()
                {
                    continue;
                }
                let key = key_of(&app, &obj);
                graph.set(&key, &obj.metadata.uid, &obj.metadata.owner_references);
                if obj.metadata.deletion_timestamp.is_some() {
                    pending_owners.push(obj);
                }
            }
            match page.continue_token {
                Some(t) => opts.continue_token = Some(t),
                None => break,
            }
        }
        // Work left over from before a restart.
        for obj in &pending_owners {
            handle_deleting_owner(&app, &graph, obj).await;
        }
        sweep_orphans(&app, &graph).await;
        let mut w = match app.store.watch(ROOT, from, WatchOptions::default()).await {
            Ok(w) => w,
            Err(StoreError::Closed) => return,
            Err(_) => continue,
        };
        let mut shutdown = app.shutdown.clone();
        loop {
            let ev = tokio::select! {
                ev = w.next() => ev,
                _ = shutdown.changed() => return,
            };
            match ev {
                Some(Ok(WatchEvent::Added(o))) | Some(Ok(WatchEvent::Modified(o))) => {
                    if !graph.concerns(&o) {
                        continue;
                    }
                    let key = key_of(&app, &o);
                    graph.set(&key, &o.metadata.uid, &o.metadata.owner_references);
                    if o.metadata.deletion_timestamp.is_some() {
                        handle_deleting_owner(&app, &graph, &o).await;
                    }
                }
                Some(Ok(WatchEvent::Deleted(o))) => {
                    if !graph.concerns(&o) {
                        continue;
                    }
                    graph.dependent_uids.remove(&o.metadata.uid);
                    let key = key_of(&app, &o);
                    let owners = graph.owners.get(&key).cloned().unwrap_or_default();
                    graph.remove(&key);
                    for dep in graph.dependents_of(&o.metadata.uid) {
                        collect_if_orphaned(&app, &dep).await;
                    }
                    // A foreground-deleted owner waits for its last dependent.
                    for owner_uid in owners {
                        if graph.dependents_of(&owner_uid).is_empty() {
                            finish_foreground(&app, &o, &owner_uid).await;
                        }
                    }
                }
                Some(Ok(WatchEvent::Bookmark(_))) => {}
                Some(Err(_)) | None => break,
            }
        }
    }
}

/// The store key of an object, from its kind.
fn key_of(app: &App, obj: &Object) -> String {
    let reg = app.resources.snapshot();
    match reg.by_kind(obj.group(), &obj.kind) {
        Some(rt) => rt.key(obj.namespace(), obj.name()),
        None => String::new(),
    }
}

/// The stored owner a reference points at, if it still exists with that uid.
async fn owner_of(app: &App, dependent_ns: &str, r: &OwnerReference) -> Option<Object> {
    let reg = app.resources.snapshot();
    let group = r.api_version.split_once('/').map(|(g, _)| g).unwrap_or("");
    let rt = reg.by_kind(group, &r.kind)?;
    let ns = if rt.namespaced { dependent_ns } else { "" };
    let owner = app.store.get(&rt.key(ns, &r.name)).await.ok()?;
    (owner.metadata.uid == r.uid).then_some(owner)
}

/// Deletes the dependent at `key` if none of its owners remain.
async fn collect_if_orphaned(app: &App, key: &str) {
    let Ok(dep) = app.store.get(key).await else {
        return;
    };
    if dep.metadata.owner_references.is_empty() {
        return;
    }
    for r in &dep.metadata.owner_references {
        if let Some(owner) = owner_of(app, dep.namespace(), r).await {
            // An owner being deleted in the foreground takes its dependents with it.
            let foreground = owner.metadata.deletion_timestamp.is_some()
                && owner.metadata.finalizers.iter().any(|f| f == FOREGROUND);
            if !foreground {
                return;
            }
        }
    }
    if let Err(e) = delete_object(app.store.as_ref(), key, &dep).await {
        tracing::warn!(key, error = %e, "garbage collector: deleting a dependent failed");
    } else {
        tracing::debug!(
            key,
            "garbage collector: deleted a dependent whose owners are gone"
        );
    }
}

/// An owner marked for deletion: orphan or delete its dependents, per its finalizers.
async fn handle_deleting_owner(app: &App, graph: &Graph, owner: &Object) {
    let key = key_of(app, owner);
    let deps = graph.dependents_of(&owner.metadata.uid);
    if owner.metadata.finalizers.iter().any(|f| f == ORPHAN) {
        for dep in &deps {
            let uid = owner.metadata.uid.clone();
            let _ = orrery_store::update_with(app.store.as_ref(), dep, |mut o| {
                let before = o.metadata.owner_references.len();
                o.metadata.owner_references.retain(|r| r.uid != uid);
                Ok((o.metadata.owner_references.len() != before).then_some(o))
            })
            .await;
        }
        if let Err(e) = remove_finalizer(app.store.as_ref(), &key, ORPHAN).await {
            tracing::warn!(key, error = %e, "garbage collector: orphaning failed");
        }
    } else if owner.metadata.finalizers.iter().any(|f| f == FOREGROUND) {
        if deps.is_empty() {
            let _ = remove_finalizer(app.store.as_ref(), &key, FOREGROUND).await;
        }
        for dep in &deps {
            collect_if_orphaned(app, dep).await;
        }
    }
}

/// After a dependent is gone: an owner in foreground deletion with no dependents left goes too.
async fn finish_foreground(app: &App, dependent: &Object, owner_uid: &str) {
    for r in dependent
        .metadata
        .owner_references
        .iter()
        .filter(|r| r.uid == owner_uid)
    {
        if let Some(owner) = owner_of(app, dependent.namespace(), r).await
            && owner.metadata.deletion_timestamp.is_some()
            && owner.metadata.finalizers.iter().any(|f| f == FOREGROUND)
        {
            let _ = remove_finalizer(app.store.as_ref(), &key_of(app, &owner), FOREGROUND).await;
        }
    }
}

/// Collects dependents whose owners disappeared while nobody was watching.
async fn sweep_orphans(app: &App, graph: &Graph) {
    let keys: Vec<String> = graph.owners.keys().cloned().collect();
    for key in keys {
        collect_if_orphaned(app, &key).await;
    }
}
