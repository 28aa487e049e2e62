//! Propagation: from a template and a policy to objects running in member clusters, and their
//! status back. Three controllers, each watching and writing the store (DESIGN.md, data flow
//! steps 3 to 7):
//!
//! - [`detector`]: placement policies select templates; one `ResourceBinding` per template,
//!   with what it needs (replicas, per-replica requests, dependencies) and the placement;
//!   finalizers on templates so nothing is orphaned;
//! - [`scheduling`]: bindings and clusters in, `spec.clusters` out, through the pure engine
//!   (`orrery-scheduler`), with the reasons in the binding's status and Events on the
//!   template; application failover;
//! - [`binding`]: one `Work` per target cluster with the rendered manifests (dependencies,
//!   replica share, overrides), and member status aggregated into the binding and the
//!   template; under a placement's `rollout`, each cluster's from the revision [`rollout`]
//!   decided.
//!
//! Each is a `Batch` on the runtime's `Controller`: it keeps what it watches in memory, says
//! which bindings an event touches, and decides every due one in a round whose store writes
//! run concurrently.

use std::collections::BTreeSet;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use orrery_api::Object;

use crate::runtime::reflector::Event;

pub mod binding;
mod customized;
pub mod detector;
pub mod history;
pub mod quota;
pub mod rebalancer;
pub mod rollout;
pub mod scheduling;
mod stateful;

/// Where a kind's objects are stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KindInfo {
    pub group: String,
    pub plural: String,
    pub namespaced: bool,
}

impl KindInfo {
    pub fn key(&self, namespace: &str, name: &str) -> String {
        let ns = self.namespaced.then_some(namespace);
        orrery_api::keys::object(&self.group, &self.plural, ns, name)
    }
    pub fn prefix(&self) -> String {
        orrery_api::keys::prefix(&self.group, &self.plural, None)
    }
}

/// Resolves `apiVersion` + `kind` to where objects of the kind live (the API server's
/// registry, built-in kinds and CRDs alike; the binary wires it in).
pub trait Kinds: Send + Sync + std::fmt::Debug {
    fn resolve(&self, api_version: &str, kind: &str) -> Option<KindInfo>;
}

/// Namespaces whose objects are Orrery's or the control plane's own, never templates.
pub fn is_system_namespace(ns: &str) -> bool {
    ns.starts_with("orrery-") || ns.starts_with("kube-")
}

/// The template kinds a controller follows (those its policies or bindings name), each a
/// source of the family `templates` under a slot of its own, so its events say which kind
/// they are of. New ones wait in [`TemplateKinds::take_new`] for the controller's loop to
/// follow them (and to hold its barrier until they have listed).
pub(crate) struct TemplateKinds {
    kinds: Arc<dyn Kinds>,
    slots: std::collections::HashMap<(String, String), usize>,
    prefixes: Vec<String>,
    new: Vec<crate::runtime::controller::Source>,
}

/// The family name of template sources.
pub(crate) const TEMPLATES: &str = "templates";

impl TemplateKinds {
    pub(crate) fn new(kinds: Arc<dyn Kinds>) -> Self {
        TemplateKinds {
            kinds,
            slots: Default::default(),
            prefixes: Vec::new(),
            new: Vec::new(),
        }
    }

    /// Starts following a kind, once, if the API serves it. Returns whether the kind is
    /// followed (now or before).
    pub(crate) fn follow(&mut self, api_version: &str, kind: &str) -> bool {
        let id = (api_version.to_string(), kind.to_string());
        if self.slots.contains_key(&id) {
            return true;
        }
        let Some(info) = self.kinds.resolve(api_version, kind) else {
            return false;
        };
        let slot = self.prefixes.len();
        self.slots.insert(id, slot);
        self.prefixes.push(info.prefix());
        self.new.push(crate::runtime::controller::Source::slot(
            TEMPLATES,
            slot,
            info.prefix(),
        ));
        true
    }

    /// The kinds followed since last asked, for the controller's loop to follow.
    pub(crate) fn take_new(&mut self) -> Vec<crate::runtime::controller::Source> {
        std::mem::take(&mut self.new)
    }

    /// The slot of a followed kind.
    pub(crate) fn slot(&self, api_version: &str, kind: &str) -> Option<usize> {
        self.slots
            .get(&(api_version.to_string(), kind.to_string()))
            .copied()
    }

    /// Where the objects of a slot's kind are stored.
    pub(crate) fn prefix(&self, slot: usize) -> Option<&str> {
        self.prefixes.get(slot).map(String::as_str)
    }
}

impl std::fmt::Debug for TemplateKinds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TemplateKinds")
            .field("slots", &self.slots)
            .finish_non_exhaustive()
    }
}

/// Keeps a map of `ResourceInterpreter`s, by target (apiVersion, kind), from their events.
pub(crate) fn follow_interpreters(
    map: &mut std::collections::HashMap<(String, String), orrery_api::interpret::InterpreterSpec>,
    ev: Event,
) {
    let read = |o: &Object| -> Option<((String, String), orrery_api::interpret::InterpreterSpec)> {
        let s: orrery_api::interpret::InterpreterSpec =
            serde::Deserialize::deserialize(o.spec.as_ref()?).ok()?;
        Some(((s.target.api_version.clone(), s.target.kind.clone()), s))
    };
    match ev {
        Event::Listed(items) => *map = items.iter().filter_map(|o| read(o)).collect(),
        Event::Upsert(o) => {
            if let Some((k, s)) = read(&o) {
                map.insert(k, s);
            }
        }
        Event::Delete(o) => {
            if let Some((k, _)) = read(&o) {
                map.remove(&k);
            }
        }
    }
}

/// Logs a round of work: at debug level always, at info level when it was slow.
pub(crate) fn log_round(controller: &str, items: usize, started: std::time::Instant) {
    let ms = started.elapsed().as_millis() as u64;
    if ms >= 1000 {
        tracing::info!(controller, items, ms, "a slow propagation round");
    } else if items > 0 {
        tracing::debug!(controller, items, ms, "propagation round");
    }
}

/// A store write whose failure puts `K` back on the dirty list.
pub(crate) type Job<K> = BoxFuture<'static, Result<(), (K, String)>>;

/// Runs writes, at most `CONCURRENCY` at a time (the store groups concurrent writes into one
/// commit); returns the keys whose write failed.
pub(crate) async fn run_jobs<K: Ord>(jobs: Vec<Job<K>>) -> BTreeSet<K> {
    const CONCURRENCY: usize = 256;
    let mut failed = BTreeSet::new();
    let mut s = futures_util::stream::iter(jobs).buffer_unordered(CONCURRENCY);
    while let Some(r) = s.next().await {
        if let Err((k, e)) = r {
            tracing::debug!(error = %e, "a propagation write failed; retrying");
            failed.insert(k);
        }
    }
    failed
}

/// A digest of what a user controls in an object (everything but status and the server's
/// bookkeeping), to tell content changes from status-only ones: stored in bindings, so
/// stable across builds ([`orrery_api::object::content_digest`]).
pub fn content_digest(o: &Object) -> String {
    orrery_api::object::content_digest(o)
}

/// The digest earlier versions stored (std's `DefaultHasher`, whose algorithm a toolchain may
/// change): read only, to recognise a binding written by them as current.
pub fn legacy_content_digest(o: &Object) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    o.metadata.labels.hash(&mut h);
    o.metadata.annotations.hash(&mut h);
    o.spec
        .as_ref()
        .map(|s| s.to_string())
        .unwrap_or_default()
        .hash(&mut h);
    serde_json::Value::Object(o.other.clone())
        .to_string()
        .hash(&mut h);
    format!("{:016x}", h.finish())
}

/// Whether a recorded digest is of `o`'s content as it is: the stable digest, or one an
/// earlier version recorded.
pub fn same_content(recorded: &str, o: &Object) -> bool {
    if recorded.starts_with(orrery_api::object::CONTENT_DIGEST_PREFIX) {
        recorded == content_digest(o)
    } else {
        recorded == legacy_content_digest(o)
    }
}

/// Whether two versions of a template differ in their status (or version) only.
pub(crate) fn same_but_status(a: &Object, b: &Object) -> bool {
    a.spec == b.spec
        && a.other == b.other
        && a.metadata.labels == b.metadata.labels
        && a.metadata.annotations == b.metadata.annotations
        && a.metadata.finalizers == b.metadata.finalizers
        && a.metadata.deletion_timestamp == b.metadata.deletion_timestamp
        && a.metadata.uid == b.metadata.uid
}

/// An Object with just enough to be the subject of an Event.
pub(crate) fn subject(api_version: &str, kind: &str, ns: &str, name: &str, uid: &str) -> Object {
    let mut o = Object::new(api_version, kind).with_name(name);
    o.metadata.namespace = ns.to_string();
    o.metadata.uid = uid.to_string();
    o
}
