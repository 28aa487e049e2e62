//! The binding controller: one `Work` per target cluster, and status back.
//!
//! For each binding it renders, per target cluster, the manifests the member must run: the
//! template's dependencies (when the policy propagates them), then the template with its
//! replica share, template expansion and overrides (`orrery_api::overrides::render`). A
//! cluster whose rendering fails keeps its previous Work untouched and the error is reported;
//! nothing is half-applied. Unchanged Works are not rewritten.
//!
//! Member status comes back through the Works: per cluster into the binding's
//! `aggregatedStatus` and `FullyApplied`, and into the template's own `status` (summed; a
//! single cluster's copied as it is).
//!
//! A binding being deleted keeps its finalizer until its Works are gone.
//!
//! The controller keeps what it renders from in memory, templates included (it follows the
//! kinds its bindings name), and takes the objects its own writes return into that view at
//! once: a round never works from a version older than what the last one wrote, so a status
//! is not written twice for one change.

use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use orrery_api::binding::{
    self, AggregatedStatusItem, BINDING_ANNOTATION, BINDING_NAMESPACE_LABEL, BindingSpec,
    BindingStatus, CONDITION_FULLY_APPLIED, Dependency,
};
use orrery_api::cluster::namespace_of;
use orrery_api::conditions::{self, Condition};
use orrery_api::interpret::{DEPENDENCY_KINDS, Interpreter, InterpreterSpec};
use orrery_api::object::json_digest;
use orrery_api::overrides::{self, ClusterView, OVERRIDE_KINDS, OverridePolicy};
use orrery_api::policy::PolicyRef;
use orrery_api::work::{self, Health, ManifestStatus, WorkSpec, WorkStatus, Workload};
use orrery_api::{Object, Time, keys};
use orrery_scheduler::ClusterSnapshot;
use orrery_store::ops::{delete_object, remove_finalizer};
use orrery_store::{Store, StoreError, update_with};
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::watch;

use super::same_but_status;
use super::{Job, Kinds, TEMPLATES, TemplateKinds, run_jobs, subject};
use crate::record;
use crate::runtime::Event;
use crate::runtime::controller::{Action, Batch, Controller, Keys, Origin, Source};
use orrery_store::stamp::new_object;

mod rollout;
mod status;
use rollout::{Level, Prepared, Revisions};
use status::{Extras, Rendering, RolloutWrite, Subject};

const COMPONENT: &str = "orrery-binding-controller";

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Src {
    Binding,
    Work,
    Cluster,
    Override(usize),
    Dependency(usize),
    Interpreter,
    Customization,
    /// Templates of one kind (a slot of `Controller::followed`).
    Template(usize),
    Revision,
    Approval,
}

type BKey = (String, String);
/// A dependency: kind, namespace, name.
type DKey = (String, String, String);

/// A template as last seen, and the revision of its last change other than its status
/// (what renderings depend on: this controller's own status writes do not re-render).
#[derive(Debug)]
struct Template {
    obj: Arc<Object>,
    content: String,
}

/// What this controller keeps of a Work: enough to compare a rendering with, to delete it,
/// and to read its member's report; not its manifests, which are most of it (a parsed Work
/// takes about nine times its JSON in memory, and this controller holds every Work).
#[derive(Debug)]
struct WorkView {
    uid: String,
    revision: i64,
    generation: Option<i64>,
    deleting: bool,
    /// A digest of the spec as stored ([`json_digest`]).
    spec: u64,
    /// The template revision it renders, under a rollout.
    rollout_revision: Option<i64>,
    /// The replicas its template manifest (the last) runs.
    replicas: Option<i64>,
    status: Option<WorkStatus>,
}

/// Karmada's annotation of a member's object: the template generation it was rendered from
/// (what a customization's ReflectStatus reports as `resourceTemplateGeneration`).
const TEMPLATE_GENERATION_ANNOTATION: &str = "resourcetemplate.karmada.io/generation";

/// The template as a member's object is judged (its status goes in beside): with the
/// member's own generation when it reports one, and the template generation the member runs
/// (`rendered`) when that is known.
fn member_object(t: &Object, m: Option<&ManifestStatus>, rendered: Option<i64>) -> Value {
    let generation = m.and_then(|m| m.generation).or(t.metadata.generation);
    let mut o = serde_json::json!({
        "apiVersion": t.api_version, "kind": t.kind,
        "metadata": {"name": t.name(), "namespace": t.namespace(), "generation": generation},
        "spec": t.spec,
    });
    if let Some(g) = rendered {
        o["metadata"]["annotations"] =
            serde_json::json!({ TEMPLATE_GENERATION_ANNOTATION: g.to_string() });
    }
    o
}

/// How healthy the template is in a member, as its interpreter judges the member's report.
/// `divided`: the replicas the member was given, when the placement divides them (the
/// object judged has them, as the member's has).
fn health_of(
    interp: Interpreter<'_>,
    t: &Object,
    m: &ManifestStatus,
    divided: Option<i64>,
) -> Health {
    // The built-in kinds' health is judged in the member already.
    if matches!(interp, Interpreter::BuiltIn) {
        return m.health;
    }
    let mut as_object = member_object(t, Some(m), None);
    if let Some(n) = divided {
        interp.set_replicas(&mut as_object, n);
    }
    if let Some(o) = as_object.as_object_mut() {
        o.insert("status".into(), m.status.clone().unwrap_or(Value::Null));
    }
    interp.health(&as_object, m.health)
}

impl WorkView {
    fn of(w: &Object) -> WorkView {
        WorkView {
            uid: w.metadata.uid.clone(),
            revision: w.revision().unwrap_or(0),
            generation: w.metadata.generation,
            deleting: w.metadata.deletion_timestamp.is_some(),
            spec: json_digest(&w.spec),
            replicas: w
                .spec
                .as_ref()
                .and_then(|s| s.pointer("/workload/manifests"))
                .and_then(Value::as_array)
                .and_then(|m| m.last())
                .and_then(|m| m.pointer("/spec/replicas"))
                .and_then(Value::as_i64),
            rollout_revision: w
                .metadata
                .annotations
                .get(orrery_api::rollout::WORK_REVISION_ANNOTATION)
                .and_then(|r| r.parse().ok()),
            // Only a binding's Work has its status read (into the binding's); another's
            // would be kept for nothing.
            status: w
                .status
                .as_ref()
                .filter(|_| w.metadata.annotations.contains_key(BINDING_ANNOTATION))
                .and_then(|s| WorkStatus::deserialize(s).ok()),
        }
    }
}

/// An object one of this controller's writes stored.
#[derive(Debug)]
enum Written {
    Binding(BKey, Arc<Object>),
    /// (cluster, Work name).
    Work((String, String), Arc<Object>),
    /// The template's store key.
    Template(String, Arc<Object>),
}

/// What this round's writes stored, shared with the write jobs.
type WrittenLog = Arc<Mutex<Vec<Written>>>;

fn log_written(log: &WrittenLog, w: Written) {
    log.lock().push(w);
}

struct Binder {
    store: Arc<dyn Store>,
    kinds: Arc<dyn Kinds>,
    bindings: HashMap<BKey, Arc<Object>>,
    /// Each binding's spec, parsed once per version.
    specs: HashMap<BKey, Arc<BindingSpec>>,
    /// ControllerRevisions of rollout bindings, by binding and number.
    revisions: HashMap<BKey, BTreeMap<i64, Arc<Object>>>,
    /// RolloutApprovals by namespace and name.
    approvals: HashMap<(String, String), Arc<Object>>,
    /// Each cluster's load, which a rollout's order follows.
    levels: HashMap<String, Level>,
    /// Template kinds followed, and the slots whose first listing came.
    followed: TemplateKinds,
    listed: HashSet<usize>,
    /// Templates by store key, and the binding each belongs to.
    templates: HashMap<String, Template>,
    bound: HashMap<String, BKey>,
    /// Objects this controller's last round wrote, and deletions seen since (key →
    /// revision), so that what is taken in is never older than what the watch showed.
    written: WrittenLog,
    deleted: HashMap<String, i64>,
    /// Works by (cluster, work name).
    works: HashMap<(String, String), WorkView>,
    /// The clusters holding a Work of each binding.
    works_of: HashMap<BKey, BTreeSet<String>>,
    /// What rendering reads of each Cluster (not the whole scheduler's snapshot, nor the
    /// stored object: a large fleet's Clusters change at every report).
    clusters: HashMap<String, Member>,
    overrides: BTreeMap<PolicyRef, (usize, OverridePolicy)>,
    deps: HashMap<DKey, Arc<Object>>,
    dependents: HashMap<DKey, BTreeSet<BKey>>,
    interpreters: HashMap<(String, String), InterpreterSpec>,
    /// Karmada's customizations, per kind.
    customized: super::customized::Customized,
    /// What events touched since the last round (it goes into the queue then).
    dirty: BTreeSet<BKey>,
    /// Bumped when overrides, dependencies, interpreters or clusters' labels change.
    epoch: u64,
    /// Per binding: the render inputs last rendered, and what failed then.
    rendered: parking_lot::Mutex<HashMap<BKey, Rendered>>,
    /// Where rollouts' steps are recorded (the schedule history).
    history: Option<crate::propagation::history::History>,
}

type Rendered = (u64, BTreeMap<String, String>, Vec<String>);

#[async_trait::async_trait]
impl Batch for Binder {
    type Key = BKey;
    type Error = StoreError;

    fn on_event(&mut self, source: Origin, ev: Event, keys: &mut Keys<BKey>) {
        let src = match (source.name, source.slot) {
            ("bindings", _) => Src::Binding,
            ("works", _) => Src::Work,
            ("clusters", _) => Src::Cluster,
            ("revisions", _) => Src::Revision,
            ("approvals", _) => Src::Approval,
            ("overrides", Some(i)) => Src::Override(i),
            ("dependencies", Some(i)) => Src::Dependency(i),
            (TEMPLATES, Some(i)) => Src::Template(i),
            ("customizations", _) => Src::Customization,
            _ => Src::Interpreter,
        };
        self.take_event(src, ev);
        self.hand_over(keys);
    }

    /// Time-driven work runs on a clock, however busy the event stream is.
    fn tick(&mut self, keys: &mut Keys<BKey>) {
        // Kinds that could not be resolved yet (a CRD arriving later) are tried again.
        self.follow_template_kinds();
        // Graceful evictions end by time, and rollouts' gates are timed.
        for (k, b) in &self.bindings {
            if b.spec.as_ref().and_then(|s| s.get("evictions")).is_some() || Self::rolling(b) {
                self.dirty.insert(k.clone());
            }
        }
        self.hand_over(keys);
    }

    /// Works and bindings are both known before anything is judged missing, and overrides
    /// and dependencies before anything is rendered: the loop's barrier holds until then.
    async fn reconcile_batch(
        &mut self,
        keys: Vec<BKey>,
    ) -> Vec<(BKey, Result<Action, StoreError>)> {
        let (n, started) = (keys.len(), std::time::Instant::now());
        let (failed, later) = self.reconcile_keys(keys.clone()).await;
        super::log_round("binding", n, started);
        keys.into_iter()
            .map(|k| {
                let r = if failed.contains(&k) {
                    Err(StoreError::Backend(format!(
                        "reconciling binding {}/{} failed",
                        k.0, k.1
                    )))
                } else if later.contains(&k) {
                    // Its kind is not served, or not listed, yet: the listing marks it again.
                    Ok(Action::After(Duration::from_secs(1)))
                } else {
                    Ok(Action::Done)
                };
                (k, r)
            })
            .collect()
    }
}

impl Binder {
    /// Hands the controller's loop the bindings to reconcile and the kinds to follow.
    fn hand_over(&mut self, keys: &mut Keys<BKey>) {
        keys.extend(std::mem::take(&mut self.dirty));
        // Not waited for: a binding whose kind has not listed yet waits on its own (`later`),
        // the others go on.
        for s in self.followed.take_new() {
            keys.follow(s.outside_barrier());
        }
    }
}

/// Runs the binding controller until shutdown.
pub async fn run(
    store: Arc<dyn Store>,
    kinds: Arc<dyn Kinds>,
    metrics: Arc<crate::runtime::metrics::ControllerMetrics>,
    history: Option<crate::propagation::history::History>,
    shutdown: watch::Receiver<bool>,
) {
    let b = Binder {
        store: store.clone(),
        kinds: kinds.clone(),
        bindings: HashMap::new(),
        specs: HashMap::new(),
        followed: TemplateKinds::new(kinds),
        listed: HashSet::new(),
        templates: HashMap::new(),
        bound: HashMap::new(),
        written: Arc::default(),
        deleted: HashMap::new(),
        works: HashMap::new(),
        works_of: HashMap::new(),
        clusters: HashMap::new(),
        overrides: BTreeMap::new(),
        deps: HashMap::new(),
        dependents: HashMap::new(),
        interpreters: HashMap::new(),
        customized: Default::default(),
        revisions: HashMap::new(),
        approvals: HashMap::new(),
        levels: HashMap::new(),
        dirty: BTreeSet::new(),
        epoch: 0,
        rendered: Default::default(),
        history,
    };
    let mut c = Controller::batched("binding", store, b, metrics.of("binding"))
        .backoff(Duration::from_millis(200), Duration::from_secs(30))
        .every(Duration::from_secs(1))
        .source(Source::new(
            "bindings",
            orrery_api::kinds::RESOURCE_BINDING.prefix(None),
        ))
        .source(Source::new("works", keys::well_known::works(None)))
        .source(Source::new("clusters", keys::well_known::clusters()))
        .source(Source::new(
            "revisions",
            keys::prefix("apps", "controllerrevisions", None),
        ))
        .source(Source::new(
            "approvals",
            orrery_api::kinds::ROLLOUT_APPROVAL.prefix(None),
        ));
    for (i, (group, _, plural)) in OVERRIDE_KINDS.iter().enumerate() {
        c = c.source(Source::slot(
            "overrides",
            i,
            keys::prefix(group, plural, None),
        ));
    }
    for (i, (_, plural)) in DEPENDENCY_KINDS.iter().enumerate() {
        c = c.source(Source::slot(
            "dependencies",
            i,
            keys::prefix("", plural, None),
        ));
    }
    c.source(Source::new(
        "interpreters",
        keys::well_known::interpreters(),
    ))
    .source(Source::new(
        "customizations",
        orrery_api::kinds::RESOURCE_INTERPRETER_CUSTOMIZATION.prefix(None),
    ))
    .run(shutdown)
    .await;
}

fn bkey_of_work(w: &Object) -> Option<BKey> {
    let (ns, name) = w
        .metadata
        .annotations
        .get(BINDING_ANNOTATION)?
        .split_once('/')?;
    Some((ns.to_string(), name.to_string()))
}

/// A member cluster as rendering sees it (overrides, template expansion, locations).
#[derive(Debug)]
struct Member {
    view: Looks,
    /// A digest of what the view is made from as stored (labels, spec, properties): a
    /// heartbeat or a metrics report changes none of them and is not parsed.
    source: u64,
}

/// What rendering reads of a Cluster.
#[derive(Debug, PartialEq)]
struct Looks {
    labels: BTreeMap<String, String>,
    provider: String,
    region: String,
    zones: Vec<String>,
    properties: BTreeMap<String, String>,
}

impl Member {
    fn source_of(c: &Object) -> u64 {
        json_digest(&(
            &c.metadata.labels,
            &c.spec,
            c.status.as_ref().and_then(|s| s.get("properties")),
        ))
    }

    fn of(c: &Object, source: u64) -> Member {
        let s = ClusterSnapshot::of(c);
        Member {
            view: Looks {
                labels: s.labels,
                provider: s.provider,
                region: s.region,
                zones: s.zones,
                properties: s.properties,
            },
            source,
        }
    }

    fn view<'a>(&'a self, name: &'a str) -> ClusterView<'a> {
        let v = &self.view;
        ClusterView {
            name,
            labels: &v.labels,
            provider: &v.provider,
            region: &v.region,
            zones: &v.zones,
            properties: &v.properties,
        }
    }
}

impl Binder {
    fn take_event(&mut self, src: Src, ev: Event) {
        match src {
            Src::Binding => self.take_binding_event(ev),
            Src::Template(slot) => self.take_template_event(slot, ev),
            Src::Work => self.take_work_event(ev),
            Src::Cluster => self.take_cluster_event(ev),
            Src::Revision => self.take_revision_event(ev),
            Src::Approval => self.take_approval_event(ev),
            Src::Override(slot) => self.take_override_event(slot, ev),
            Src::Dependency(slot) => self.take_dependency_event(slot, ev),
            Src::Interpreter => {
                super::follow_interpreters(&mut self.interpreters, ev);
                self.epoch += 1;
                self.dirty.extend(self.bindings.keys().cloned());
            }
            Src::Customization => {
                self.customized.follow(ev);
                self.epoch += 1;
                self.dirty.extend(self.bindings.keys().cloned());
            }
        }
    }

    /// A binding changed: it is put (or removed) and marked.
    fn take_binding_event(&mut self, ev: Event) {
        match ev {
            Event::Listed(items) => {
                let old: Vec<BKey> = self.bindings.keys().cloned().collect();
                for k in old {
                    self.put_binding(&k, None);
                    self.dirty.insert(k);
                }
                for b in items {
                    let k = (b.namespace().to_string(), b.name().to_string());
                    self.put_binding(&k, Some(b));
                    self.dirty.insert(k);
                }
            }
            Event::Upsert(b) => {
                let k = (b.namespace().to_string(), b.name().to_string());
                self.put_binding(&k, Some(b));
                self.dirty.insert(k);
            }
            Event::Delete(b) => {
                let k = (b.namespace().to_string(), b.name().to_string());
                self.deleted.insert(
                    keys::well_known::binding(&k.0, &k.1),
                    b.revision().unwrap_or(0),
                );
                self.put_binding(&k, None);
                // Works left by a binding removed without us (forced): clean up.
                self.dirty.insert(k);
            }
        }
    }

    /// A template of the kind in `slot` changed: the bindings bound to it are marked.
    fn take_template_event(&mut self, slot: usize, ev: Event) {
        let mut touched = Vec::new();
        match ev {
            Event::Listed(items) => {
                self.listed.insert(slot);
                // A listing replaces what was known of this kind.
                if let Some(prefix) = self.followed.prefix(slot) {
                    self.templates.retain(|k, _| !k.starts_with(prefix));
                }
                for o in items {
                    touched.push(self.put_template(o));
                }
                touched.extend(self.bound.keys().cloned());
            }
            Event::Upsert(o) => touched.push(self.put_template(o)),
            Event::Delete(o) => {
                if let Some(key) = self.template_key(&o) {
                    self.templates.remove(&key);
                    self.deleted.insert(key.clone(), o.revision().unwrap_or(0));
                    touched.push(key);
                }
            }
        }
        for key in touched {
            if let Some(k) = self.bound.get(&key) {
                self.dirty.insert(k.clone());
            }
        }
    }

    /// A Work changed: its view is kept, and its binding marked.
    fn take_work_event(&mut self, ev: Event) {
        match ev {
            Event::Listed(items) => {
                // The listing and the watch after it show the Works as they are; one
                // the last round wrote may be gone since (its deletion unseen).
                self.written
                    .lock()
                    .retain(|w| !matches!(w, Written::Work(..)));
                for k in self.works_of.keys() {
                    self.dirty.insert(k.clone());
                }
                self.works.clear();
                self.works_of.clear();
                for w in items {
                    self.put_work(w);
                }
            }
            Event::Upsert(w) => self.put_work(w),
            Event::Delete(w) => {
                self.deleted
                    .insert(Self::work_key_of(&w), w.revision().unwrap_or(0));
                if let Some(cluster) = orrery_api::cluster::cluster_of_namespace(w.namespace()) {
                    self.works
                        .remove(&(cluster.to_string(), w.name().to_string()));
                    if let Some(k) = bkey_of_work(&w) {
                        if let Some(set) = self.works_of.get_mut(&k) {
                            set.remove(cluster);
                            if set.is_empty() {
                                self.works_of.remove(&k);
                            }
                        }
                        self.dirty.insert(k);
                    }
                }
            }
        }
    }

    /// Keeps the view of a Work in a member's namespace, indexed by its binding (marked).
    fn put_work(&mut self, w: Arc<Object>) {
        let Some(cluster) = orrery_api::cluster::cluster_of_namespace(w.namespace()) else {
            return;
        };
        let cluster = cluster.to_string();
        if let Some(k) = bkey_of_work(&w) {
            self.works_of
                .entry(k.clone())
                .or_default()
                .insert(cluster.clone());
            self.dirty.insert(k);
        }
        self.works
            .insert((cluster, w.name().to_string()), WorkView::of(&w));
    }

    /// A Cluster changed: when anything overrides read changed, every binding renders again.
    fn take_cluster_event(&mut self, ev: Event) {
        // Whether anything overrides read changed (compared per event: copying the
        // whole map per heartbeat costs too much in a large fleet).
        let changed = match ev {
            Event::Listed(items) => {
                self.clusters = items
                    .iter()
                    .map(|c| (c.name().to_string(), Member::of(c, Member::source_of(c))))
                    .collect();
                self.levels = items
                    .iter()
                    .map(|c| (c.name().to_string(), Level::of(c)))
                    .collect();
                true
            }
            Event::Upsert(c) => {
                self.levels.insert(c.name().to_string(), Level::of(&c));
                let source = Member::source_of(&c);
                match self.clusters.get(c.name()) {
                    Some(m) if m.source == source => false,
                    old => {
                        let m = Member::of(&c, source);
                        let changed = old.is_none_or(|o| o.view != m.view);
                        self.clusters.insert(c.name().to_string(), m);
                        changed
                    }
                }
            }
            Event::Delete(c) => {
                self.levels.remove(c.name());
                self.clusters.remove(c.name()).is_some()
            }
        };
        if changed {
            // Labels and properties feed overrides and template expansion.
            self.epoch += 1;
            self.dirty.extend(self.bindings.keys().cloned());
        }
    }

    /// An override policy of the kind in `slot` changed: every binding renders again.
    fn take_override_event(&mut self, slot: usize, ev: Event) {
        match ev {
            Event::Listed(items) => {
                self.overrides.retain(|_, (s, _)| *s != slot);
                for o in items {
                    if let Ok(p) = overrides::from_object(&o) {
                        self.overrides.insert(p.reference.clone(), (slot, p));
                    }
                }
            }
            Event::Upsert(o) => {
                self.overrides.remove(&PolicyRef::of(&o));
                if let Ok(p) = overrides::from_object(&o) {
                    self.overrides.insert(p.reference.clone(), (slot, p));
                }
            }
            Event::Delete(o) => {
                self.overrides.remove(&PolicyRef::of(&o));
            }
        }
        self.epoch += 1;
        self.dirty.extend(self.bindings.keys().cloned());
    }

    /// A dependency (ConfigMap, Secret...) of the kind in `slot` changed: the bindings that
    /// depend on it are marked.
    fn take_dependency_event(&mut self, slot: usize, ev: Event) {
        let kind = DEPENDENCY_KINDS[slot].0.to_string();
        let key = |o: &Object| {
            (
                kind.clone(),
                o.namespace().to_string(),
                o.name().to_string(),
            )
        };
        let mut touched = Vec::new();
        match ev {
            Event::Listed(items) => {
                self.deps.retain(|k, _| k.0 != kind);
                for o in items {
                    touched.push(key(&o));
                    self.deps.insert(key(&o), o);
                }
                touched.extend(self.dependents.keys().filter(|k| k.0 == kind).cloned());
            }
            Event::Upsert(o) => {
                touched.push(key(&o));
                self.deps.insert(key(&o), o);
            }
            Event::Delete(o) => {
                touched.push(key(&o));
                self.deps.remove(&key(&o));
            }
        }
        self.epoch += 1;
        for k in touched {
            if let Some(bs) = self.dependents.get(&k) {
                self.dirty.extend(bs.iter().cloned());
            }
        }
    }

    /// Puts (or with `None` removes) a binding, keeping its parsed spec and the indexes
    /// from dependencies and templates to it.
    fn put_binding(&mut self, k: &BKey, b: Option<Arc<Object>>) {
        let same_spec = match (self.bindings.get(k), &b) {
            (Some(old), Some(new)) => old.spec == new.spec,
            _ => false,
        };
        if same_spec {
            if let Some(b) = b {
                self.bindings.insert(k.clone(), b);
            }
            return;
        }
        if let Some(old) = self.specs.remove(k) {
            for d in &old.dependencies {
                let dk = (d.kind.clone(), d.namespace.clone(), d.name.clone());
                if let Some(set) = self.dependents.get_mut(&dk) {
                    set.remove(k);
                    if set.is_empty() {
                        self.dependents.remove(&dk);
                    }
                }
            }
            if let Some(info) = self
                .kinds
                .resolve(&old.resource.api_version, &old.resource.kind)
            {
                let tkey = info.key(&old.resource.namespace, &old.resource.name);
                if self.bound.get(&tkey) == Some(k) {
                    self.bound.remove(&tkey);
                }
            }
        }
        let Some(b) = b else {
            self.bindings.remove(k);
            return;
        };
        if let Some(new) = BindingSpec::of(&b) {
            for d in &new.dependencies {
                self.dependents
                    .entry((d.kind.clone(), d.namespace.clone(), d.name.clone()))
                    .or_default()
                    .insert(k.clone());
            }
            if !new.resource.is_task() {
                self.follow_kind(&new.resource.api_version, &new.resource.kind);
                if let Some(info) = self
                    .kinds
                    .resolve(&new.resource.api_version, &new.resource.kind)
                {
                    self.bound.insert(
                        info.key(&new.resource.namespace, &new.resource.name),
                        k.clone(),
                    );
                }
            }
            self.specs.insert(k.clone(), Arc::new(new));
        }
        self.bindings.insert(k.clone(), b);
    }

    /// Starts following a template kind (once), if the API serves it yet; returns whether it
    /// is followed.
    fn follow_kind(&mut self, api_version: &str, kind: &str) -> bool {
        self.followed.follow(api_version, kind)
    }

    /// Follows the kinds of bindings whose kind could not be resolved before.
    fn follow_template_kinds(&mut self) {
        let wanted: BTreeSet<(String, String)> = self
            .specs
            .values()
            .filter(|s| !s.resource.is_task())
            .map(|s| (s.resource.api_version.clone(), s.resource.kind.clone()))
            .filter(|(a, k)| self.followed.slot(a, k).is_none())
            .collect();
        for (api_version, kind) in wanted {
            if self.follow_kind(&api_version, &kind) {
                // Their templates' keys are known now.
                let keys: Vec<BKey> = self
                    .specs
                    .iter()
                    .filter(|(_, s)| {
                        s.resource.api_version == api_version && s.resource.kind == kind
                    })
                    .map(|(k, _)| k.clone())
                    .collect();
                for k in keys {
                    // Put again from scratch (an unchanged spec is otherwise not indexed
                    // again), and rendered.
                    if let Some(b) = self.bindings.remove(&k) {
                        self.put_binding(&k, Some(b));
                        self.dirty.insert(k);
                    }
                }
            }
        }
    }

    fn template_key(&self, o: &Object) -> Option<String> {
        let info = self.kinds.resolve(&o.api_version, &o.kind)?;
        Some(info.key(o.namespace(), o.name()))
    }

    /// Puts a template; returns its key.
    fn put_template(&mut self, o: Arc<Object>) -> String {
        let Some(key) = self.template_key(&o) else {
            return String::new();
        };
        let content = match self.templates.get(&key) {
            Some(old) if same_but_status(&old.obj, &o) => old.content.clone(),
            _ => o.metadata.resource_version.clone(),
        };
        self.templates
            .insert(key.clone(), Template { obj: o, content });
        key
    }

    /// Takes in what the last round's writes stored, unless the watch has shown something
    /// newer (a later write, a deletion) already.
    fn take_written(&mut self) {
        let written = std::mem::take(&mut *self.written.lock());
        let deleted = std::mem::take(&mut self.deleted);
        let newer = |have: Option<i64>, key: &str, o: &Object| {
            let rev = o.revision().unwrap_or(0);
            have.is_none_or(|h| h < rev) && deleted.get(key).is_none_or(|d| *d < rev)
        };
        let rev = |o: &Arc<Object>| o.revision().unwrap_or(0);
        for w in written {
            match w {
                Written::Binding(k, o) => {
                    if self.bindings.contains_key(&k)
                        && newer(
                            self.bindings.get(&k).map(rev),
                            &keys::well_known::binding(&k.0, &k.1),
                            &o,
                        )
                    {
                        self.put_binding(&k, Some(o));
                    }
                }
                Written::Work(wk, o) => {
                    if newer(
                        self.works.get(&wk).map(|w| w.revision),
                        &Self::work_key_of(&o),
                        &o,
                    ) {
                        if let Some(k) = bkey_of_work(&o) {
                            self.works_of.entry(k).or_default().insert(wk.0.clone());
                        }
                        self.works.insert(wk, WorkView::of(&o));
                    }
                }
                Written::Template(key, o) => {
                    if self.templates.contains_key(&key)
                        && newer(self.templates.get(&key).map(|t| rev(&t.obj)), &key, &o)
                    {
                        self.put_template(o);
                    }
                }
            }
        }
    }

    /// Reconciles `keys`; returns those that failed and those that must wait for their
    /// template kind.
    async fn reconcile_keys(&mut self, keys: Vec<BKey>) -> (BTreeSet<BKey>, BTreeSet<BKey>) {
        self.take_written();
        let mut jobs: Vec<Job<BKey>> = Vec::new();
        let mut later = BTreeSet::new();
        for k in keys {
            let deleting = self
                .bindings
                .get(&k)
                .is_some_and(|b| b.metadata.deletion_timestamp.is_some());
            let template = match self.specs.get(&k) {
                // Gone or going (its Works go; no template needed, nor its kind served), or a
                // standalone task (no template, no Works).
                None => None,
                _ if deleting => None,
                Some(spec) if spec.resource.is_task() => None,
                Some(spec) => {
                    let r = &spec.resource;
                    let info = self.kinds.resolve(&r.api_version, &r.kind);
                    let listed = self
                        .followed
                        .slot(&r.api_version, &r.kind)
                        .is_some_and(|s| self.listed.contains(&s));
                    let Some(info) = info.filter(|_| listed) else {
                        // Not served yet, or its templates not listed yet: the listing marks
                        // it again, the tick retries.
                        later.insert(k);
                        continue;
                    };
                    // None: no template (the detector unbinds it; a deletion still goes on).
                    self.templates.get(&info.key(&r.namespace, &r.name))
                }
            };
            jobs.extend(self.reconcile(&k, template));
        }
        let failed = run_jobs(jobs).await;
        {
            // What failed is rendered again next time.
            let mut r = self.rendered.lock();
            for k in &failed {
                r.remove(k);
            }
            r.retain(|k, _| self.bindings.contains_key(k));
        }
        (failed, later)
    }

    fn work_key_of(w: &Object) -> String {
        keys::well_known::work(w.namespace(), w.name())
    }

    fn work_key(cluster: &str, name: &str) -> String {
        keys::well_known::work(&namespace_of(cluster), name)
    }

    /// A binding's Works and status, and the status of the approvals naming it.
    fn reconcile(&self, k: &BKey, template: Option<&Template>) -> Vec<Job<BKey>> {
        let mut jobs = self.reconcile_works(k, template);
        jobs.extend(self.approval_jobs(k));
        jobs
    }

    fn reconcile_works(&self, k: &BKey, template: Option<&Template>) -> Vec<Job<BKey>> {
        let work_name = binding::work_name(&k.0, &k.1);
        let have: Vec<String> = self
            .works_of
            .get(k)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        let Gate { b, spec, template } = match self.gate(k, template, &have, &work_name) {
            Ok(g) => g,
            Err(jobs) => return jobs,
        };
        let mut jobs: Vec<Job<BKey>> = Vec::new();
        let t = template.obj.as_ref();
        let scripts = self
            .customized
            .of(&self.interpreters, &t.api_version, &t.kind);
        let interp = self.customized.interpreter(&self.interpreters, t);
        let (revisions, rollout) = match self.prepare_rollout(k, &b, &spec, t, interp, &work_name) {
            Prepared::Off { clear } => (None, RolloutWrite::from(clear)),
            Prepared::Wait(j) => {
                jobs.extend(j);
                return jobs;
            }
            Prepared::Ready {
                revisions,
                status,
                jobs: j,
            } => {
                jobs.extend(j);
                (
                    Some(revisions),
                    status.map_or(RolloutWrite::Keep, |s| RolloutWrite::Set(*s)),
                )
            }
        };
        // A move within the disruption budget: clusters giving replicas up keep what the
        // budget does not let go yet.
        let (spec, budget, held) = self.apply_budget(&spec, t, interp, &work_name, &have);
        let extras = Extras { rollout, budget };
        // Clusters whose Works stay: targets, fenced copies and ends of transfers.
        let targets: BTreeSet<&str> = work_plan(&spec).into_keys().collect();
        // Rendering is skipped when none of its inputs changed (a Work status coming back
        // changes none of them).
        let fp = self.render_inputs(&b, template, &have, &work_name)
            ^ revisions.as_deref().map_or(0, |r| r.digest)
            ^ held;
        let cached = self.rendered.lock().get(k).filter(|c| c.0 == fp).cloned();
        // `writing`: clusters whose Works this round writes (they count as created).
        let (errors, missing_deps, writing) = match cached {
            Some((_, e, m)) => (e, m, BTreeSet::new()),
            None => {
                let (e, m, w) = self.render_works(
                    k,
                    &spec,
                    (t, revisions.as_deref()),
                    interp,
                    &work_name,
                    &mut jobs,
                );
                self.rendered
                    .lock()
                    .insert(k.clone(), (fp, e.clone(), m.clone()));
                (e, m, w)
            }
        };
        // Works of clusters no longer targeted go, unless an eviction keeps them a while.
        let now = Time::now();
        let old = BindingStatus::of(&b);
        let new_all_healthy =
            self.new_placement_healthy(&spec, t, interp, &work_name, &writing, &errors);
        for c in &have {
            if targets.contains(c.as_str()) {
                continue;
            }
            let kept = spec.evictions.iter().any(|e| {
                e.cluster == *c
                    && (e.keep || (e.keep_until.is_some_and(|u| u > now) && !new_all_healthy))
            });
            if !kept && let Some(j) = self.delete_work(k, &work_name, c) {
                jobs.push(j);
            }
        }
        jobs.extend(self.status_jobs(
            Subject {
                k,
                b: &b,
                old: &old,
                spec: &spec,
                template,
                interp,
            },
            Rendering {
                errors: &errors,
                missing_deps: &missing_deps,
                writing: &writing,
                work_name: &work_name,
                extras: &extras,
                revisions: revisions.as_deref(),
            },
        ));
        // What the customization's scripts failed at, here and (Retain) in the members, told
        // on the template and the binding.
        let mut failed: Vec<String> = scripts
            .map(|s| s.take_failures())
            .unwrap_or_default()
            .iter()
            .map(|f| f.text())
            .collect();
        failed.extend(targets.iter().filter_map(|c| {
            let w = self.works.get(&(c.to_string(), work_name.clone()))?;
            let cond = conditions::find(&w.status.as_ref()?.conditions, work::CONDITION_RETAINED)?;
            (cond.status == conditions::FALSE).then(|| format!("in cluster {c}: {}", cond.message))
        }));
        if !failed.is_empty() {
            jobs.push(super::customized::report(
                self.store.clone(),
                failed,
                template.obj.clone(),
                Some(b.clone()),
            ));
        }
        jobs
    }

    /// The binding, its spec and its template when its Works are to be rendered; else
    /// (`Err`) the jobs instead: its Works deleted when it is gone, going (then its
    /// finalizer removed) or reaching past its namespace, and nothing while its spec or
    /// template is unknown or the template is another object of the same name.
    fn gate<'t>(
        &self,
        k: &BKey,
        template: Option<&'t Template>,
        have: &[String],
        work_name: &str,
    ) -> Result<Gate<'t>, Vec<Job<BKey>>> {
        let b = self.bindings.get(k).cloned();
        let delete_all = || -> Vec<Job<BKey>> {
            have.iter()
                .filter_map(|c| self.delete_work(k, work_name, c))
                .collect()
        };
        let Some(b) = b else {
            // The binding is gone: so are its Works.
            return Err(delete_all());
        };
        if b.metadata.deletion_timestamp.is_some() {
            if !have.is_empty() {
                return Err(delete_all());
            }
            let store = self.store.clone();
            let key = k.clone();
            let bkey = keys::well_known::binding(&k.0, &k.1);
            return Err(vec![Box::pin(async move {
                remove_finalizer(store.as_ref(), &bkey, binding::FINALIZER)
                    .await
                    .map_err(|e| (key, e.to_string()))
            })]);
        }
        let Some(spec) = self.specs.get(k).cloned() else {
            return Err(Vec::new());
        };
        let foreign = spec.foreign_references(&k.0);
        if !foreign.is_empty() {
            // A binding reaching past its namespace (written by hand, or stored before
            // admission refused it) renders nothing, and what it rendered goes.
            if !have.is_empty() {
                tracing::warn!(namespace = %k.0, binding = %k.1, field = %foreign[0].field, "a binding refers to another namespace; removing its Works");
            }
            return Err(delete_all());
        }
        let Some(template) = template else {
            return Err(Vec::new());
        };
        let t = template.obj.as_ref();
        if !spec.resource.uid.is_empty() && t.metadata.uid != spec.resource.uid {
            // A different object of the same name: the detector rebinds it.
            return Err(Vec::new());
        }
        Ok(Gate { b, spec, template })
    }

    /// Make-before-break: the new placement counts as healthy once every target's member
    /// runs its current Work (not one written this round) and reports the template
    /// healthy. The binding's stored status will not do: it may describe the Works from
    /// before the move.
    fn new_placement_healthy(
        &self,
        spec: &BindingSpec,
        t: &Object,
        interp: Interpreter<'_>,
        work_name: &str,
        writing: &BTreeSet<String>,
        errors: &BTreeMap<String, String>,
    ) -> bool {
        spec.clusters.iter().all(|c| {
            !writing.contains(&c.name)
                && !errors.contains_key(&c.name)
                && matches!(
                    self.member_status(&c.name, work_name, t),
                    (_, true, Some(m)) if m.applied
                        && health_of(
                            interp,
                            t,
                            m,
                            spec.divides_replicas()
                                .then_some(c.replicas),
                        )
                            == Health::Healthy
                )
        })
    }

    /// Deletes a cluster's Work of this binding (unless it is going already), once the
    /// stored binding confirms it no longer wants it.
    fn delete_work(&self, k: &BKey, work_name: &str, cluster: &str) -> Option<Job<BKey>> {
        let w = self
            .works
            .get(&(cluster.to_string(), work_name.to_string()))?;
        if w.deleting {
            return None;
        }
        let uid = w.uid.clone();
        let store = self.store.clone();
        let key = k.clone();
        let wkey = Self::work_key(cluster, work_name);
        let bkey = keys::well_known::binding(&k.0, &k.1);
        let cluster = cluster.to_string();
        Some(Box::pin(async move {
            let err = |e: StoreError| (key.clone(), e.to_string());
            // Deleting a Work takes its objects out of the member: the binding it is
            // decided from is read afresh first.
            match store.get(&bkey).await {
                Ok(b) if b.metadata.deletion_timestamp.is_none() => {
                    let spec = BindingSpec::of(&b);
                    let wanted = spec.as_ref().is_some_and(|s| {
                        s.foreign_references(b.namespace()).is_empty()
                            && (work_plan(s).contains_key(cluster.as_str())
                                || s.evictions.iter().any(|e| e.cluster == cluster && e.keep))
                    });
                    if wanted {
                        return Err((
                            key.clone(),
                            format!(
                                "the stored binding still targets {cluster}; the view was behind"
                            ),
                        ));
                    }
                }
                Ok(_) | Err(StoreError::NotFound { .. }) => {}
                Err(e) => return Err(err(e)),
            }
            // The Work as stored (this controller keeps only a view of it), if it is
            // still the one it saw.
            let w = match store.get(&wkey).await {
                Ok(w) => w,
                Err(StoreError::NotFound { .. }) => return Ok(()),
                Err(e) => return Err(err(e)),
            };
            if w.metadata.uid != uid {
                return Ok(());
            }
            delete_object(store.as_ref(), &wkey, &w).await.map_err(err)
        }))
    }

    /// A hash of everything a binding's Works are rendered from.
    fn render_inputs(&self, b: &Object, t: &Template, have: &[String], work_name: &str) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        b.metadata.generation.hash(&mut h);
        if let Some(s) = &b.spec {
            for f in ["clusters", "suspension", "fenced", "transfers"] {
                s.get(f).map(|v| v.to_string()).hash(&mut h);
            }
        }
        t.obj.metadata.uid.hash(&mut h);
        // Not the template's resourceVersion: its status (this controller writes it) is not
        // rendered.
        t.content.hash(&mut h);
        self.epoch.hash(&mut h);
        for c in have {
            c.hash(&mut h);
            self.works
                .get(&(c.clone(), work_name.to_string()))
                .and_then(|w| w.generation)
                .hash(&mut h);
        }
        h.finish()
    }

    /// Renders each target cluster's Work, queueing the writes of those that changed;
    /// returns the clusters whose rendering failed (and why), the missing dependencies, and
    /// the clusters whose Works it writes.
    fn render_works(
        &self,
        k: &BKey,
        spec: &BindingSpec,
        (t, revisions): (&Object, Option<&Revisions>),
        interp: Interpreter<'_>,
        work_name: &str,
        jobs: &mut Vec<Job<BKey>>,
    ) -> (BTreeMap<String, String>, Vec<String>, BTreeSet<String>) {
        let work_name = work_name.to_string();
        let mut writing = BTreeSet::new();
        let all_overrides: Vec<&OverridePolicy> = self.overrides.values().map(|(_, p)| p).collect();
        let template_ops = overrides::applicable(all_overrides.iter().copied(), t);
        let mut errors: BTreeMap<String, String> = BTreeMap::new();
        let mut missing_deps = Vec::new();
        let dep_objects: Vec<&Object> = spec
            .dependencies
            .iter()
            .filter_map(|d: &Dependency| {
                let o = self
                    .deps
                    .get(&(d.kind.clone(), d.namespace.clone(), d.name.clone()));
                if o.is_none() {
                    missing_deps.push(format!("{} {}", d.kind, d.name));
                }
                o.map(|o| o.as_ref())
            })
            .collect();
        // A workload of several components goes whole: its replicas are not revised.
        let divided = spec.divides_replicas()
            && interp
                .replicas(&serde_json::to_value(t).unwrap_or(Value::Null))
                .is_some();
        // A customization's Retain runs in each member, on the object there.
        let retention = interp.retention(&t.api_version, &t.kind);
        for (name, part) in work_plan(spec) {
            if spec.suspension.holds(name) || revisions.is_some_and(|r| r.hold.contains(name)) {
                continue;
            }
            // Under a rollout, the revision decided for the cluster (an older one renders
            // from the template as that revision held it).
            let (revision, t, old_ops) = match revisions.and_then(|r| r.per_cluster.get(name)) {
                Some((n, Some(old))) => (
                    Some(*n),
                    old,
                    Some(overrides::applicable(all_overrides.iter().copied(), old)),
                ),
                Some((n, None)) => (Some(*n), t, None),
                None => (None, t, None),
            };
            let template_ops = old_ops.as_ref().unwrap_or(&template_ops);
            let Some(cluster) = self.clusters.get(name) else {
                errors.insert(name.to_string(), "the cluster is not registered".into());
                continue;
            };
            let view = cluster.view(name);
            let mut manifests = Vec::new();
            let mut failed = None;
            if let Some(replicas) = part.workload {
                for d in &dep_objects {
                    let ops = overrides::applicable(all_overrides.iter().copied(), d);
                    match overrides::render(d, Interpreter::BuiltIn, None, &view, &ops) {
                        Ok(m) => manifests.push(m),
                        Err(e) => failed = Some(e),
                    }
                }
                let share = divided.then_some(replicas);
                match overrides::render(t, interp, share, &view, template_ops) {
                    Ok(mut m) => {
                        if part.fenced {
                            fence(interp, &mut m);
                        }
                        manifests.push(m)
                    }
                    Err(e) => failed = Some(e),
                }
            }
            if let Some(e) = failed {
                errors.insert(name.to_string(), e);
                continue;
            }
            let ws = WorkSpec {
                workload: Workload { manifests },
                conflict_resolution: spec.conflict_resolution,
                preserve_resources_on_deletion: spec.preserve_resources_on_deletion,
                transfers: part.transfers,
                retention: retention.clone(),
            };
            let cluster_name = name.to_string();
            let Ok(ws_value) = serde_json::to_value(&ws) else {
                continue;
            };
            let existing = self
                .works
                .get(&(cluster_name.clone(), work_name.clone()))
                .map(|w| (w.uid.clone(), w.spec, w.rollout_revision));
            let digest = json_digest(&Some(&ws_value));
            if existing
                .as_ref()
                .is_some_and(|(_, d, r)| *d == digest && (revision.is_none() || *r == revision))
            {
                continue;
            }
            writing.insert(cluster_name.clone());
            let stamp = revision.map(|r| r.to_string());
            jobs.push(self.write_work(k, &cluster_name, &work_name, existing, ws_value, stamp));
        }
        (errors, missing_deps, writing)
    }

    /// The job writing a cluster's Work: created, or updated over the one seen (`existing`:
    /// its uid, spec digest and revision), stamped with its rollout revision.
    fn write_work(
        &self,
        k: &BKey,
        cluster_name: &str,
        work_name: &str,
        existing: Option<(String, u64, Option<i64>)>,
        ws_value: Value,
        stamp: Option<String>,
    ) -> Job<BKey> {
        let store = self.store.clone();
        let key = k.clone();
        let wkey = Self::work_key(cluster_name, work_name);
        let cluster_ns = namespace_of(cluster_name);
        let wname = work_name.to_string();
        let bref = format!("{}/{}", k.0, k.1);
        let bns = k.0.clone();
        let log = self.written.clone();
        let wk = (cluster_name.to_string(), work_name.to_string());
        Box::pin(async move {
            let err = |e: StoreError| (key.clone(), e.to_string());
            match existing {
                Some((uid, _, _)) => {
                    let stored = update_with(store.as_ref(), &wkey, |mut cur| {
                        let ann = &mut cur.metadata.annotations;
                        let same_stamp = stamp.is_none()
                            || ann.get(orrery_api::rollout::WORK_REVISION_ANNOTATION)
                                == stamp.as_ref();
                        if cur.metadata.uid != uid
                            || (cur.spec.as_ref() == Some(&ws_value) && same_stamp)
                        {
                            return Ok(None);
                        }
                        if let Some(s) = &stamp {
                            ann.insert(
                                orrery_api::rollout::WORK_REVISION_ANNOTATION.into(),
                                s.clone(),
                            );
                        }
                        if cur.spec.as_ref() != Some(&ws_value) {
                            cur.spec = Some(ws_value.clone());
                            cur.metadata.generation =
                                Some(cur.metadata.generation.unwrap_or(1) + 1);
                        }
                        Ok(Some(cur))
                    })
                    .await;
                    match stored {
                        Ok(stored) => log_written(&log, Written::Work(wk, stored)),
                        Err(StoreError::NotFound { .. }) => {}
                        Err(e) => return Err(err(e)),
                    }
                }
                None => {
                    let mut w = new_object(
                        "multicluster.io/v1alpha1",
                        "Work",
                        Some(&cluster_ns),
                        &wname,
                    );
                    w.metadata
                        .annotations
                        .insert(BINDING_ANNOTATION.into(), bref);
                    if let Some(s) = stamp {
                        w.metadata
                            .annotations
                            .insert(orrery_api::rollout::WORK_REVISION_ANNOTATION.into(), s);
                    }
                    if bns.len() <= 63 {
                        w.metadata
                            .labels
                            .insert(BINDING_NAMESPACE_LABEL.into(), bns);
                    }
                    w.spec = Some(ws_value);
                    match store.create(&wkey, w).await {
                        Ok(stored) => log_written(&log, Written::Work(wk, stored)),
                        Err(StoreError::AlreadyExists { .. }) => {}
                        Err(e) => return Err(err(e)),
                    }
                }
            }
            Ok(())
        })
    }
}

/// A binding whose Works are rendered: the binding, its spec and its template.
struct Gate<'t> {
    b: Arc<Object>,
    spec: Arc<BindingSpec>,
    template: &'t Template,
}

/// What one cluster's Work holds.
#[derive(Debug, Default)]
struct WorkPart {
    /// The template, with this many replicas (`None`: the Work carries only transfers).
    workload: Option<i64>,
    /// A migration's fence: the copy runs no pods, and its volumes go with it.
    fenced: bool,
    transfers: Vec<orrery_api::stateful::Transfer>,
}

/// The Works a binding calls for, by cluster: its targets, the copies a migration fenced
/// (kept until it is done), and the clusters at either end of a transfer.
fn work_plan(spec: &BindingSpec) -> BTreeMap<&str, WorkPart> {
    let mut plan: BTreeMap<&str, WorkPart> = BTreeMap::new();
    for tc in &spec.clusters {
        plan.entry(&tc.name).or_default().workload = Some(tc.replicas);
    }
    for c in &spec.fenced {
        let part = plan.entry(c).or_default();
        part.fenced = true;
        part.workload.get_or_insert(0);
    }
    for t in &spec.transfers {
        plan.entry(&t.cluster)
            .or_default()
            .transfers
            .push(t.transfer.clone());
    }
    plan
}

/// A fenced copy: no replicas (a StatefulSet keeps its volumes when scaled down), and its
/// volumes deleted with it when the migration is done and its Work goes.
fn fence(interp: Interpreter<'_>, m: &mut Value) {
    interp.set_replicas(m, 0);
    if m.get("kind").and_then(Value::as_str) == Some("StatefulSet")
        && let Some(spec) = m.get_mut("spec").and_then(Value::as_object_mut)
    {
        spec.insert(
            "persistentVolumeClaimRetentionPolicy".into(),
            serde_json::json!({"whenDeleted": "Delete", "whenScaled": "Retain"}),
        );
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::status::with_status;
    use super::*;

    fn item(cluster: &str, health: Health, since: Option<Time>) -> AggregatedStatusItem {
        AggregatedStatusItem {
            cluster_name: cluster.into(),
            applied: health == Health::Healthy,
            health,
            health_since: since,
            ..Default::default()
        }
    }

    /// Serves Deployments only once told to (a CRD's kind, registered after its bindings).
    #[derive(Debug, Default)]
    struct LateKinds(std::sync::atomic::AtomicBool);

    impl Kinds for LateKinds {
        fn resolve(&self, api_version: &str, kind: &str) -> Option<super::super::KindInfo> {
            (self.0.load(std::sync::atomic::Ordering::SeqCst)
                && api_version == "apps/v1"
                && kind == "Deployment")
                .then(|| super::super::KindInfo {
                    group: "apps".into(),
                    plural: "deployments".into(),
                    namespaced: true,
                })
        }
    }

    async fn eventually<F: Future<Output = bool>>(what: &str, mut f: impl FnMut() -> F) {
        let start = std::time::Instant::now();
        while !f().await {
            assert!(start.elapsed() < Duration::from_secs(10), "{what}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A binding whose template kind the API serves only later is rendered once it does; a
    /// binding being deleted loses its Works and its finalizer even when its kind is no longer
    /// served (a CRD removed).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn kinds_served_late_and_deletions_without_a_kind() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(orrery_store_sqlite::SqliteStore::open_dir(dir.path()).unwrap());
        let mut c = Object::new("multicluster.io/v1alpha1", "Cluster").with_name("m-0");
        c.spec = Some(serde_json::json!({"region": "r"}));
        store
            .create(&keys::well_known::cluster("m-0"), c)
            .await
            .unwrap();
        let mut t = Object::new("apps/v1", "Deployment").with_name("web");
        t.metadata.namespace = "default".into();
        t.metadata.uid = "t-uid".into();
        t.spec = Some(serde_json::json!({"replicas": 1, "template": {"spec": {"containers": []}}}));
        store
            .create(
                &keys::object("apps", "deployments", Some("default"), "web"),
                t,
            )
            .await
            .unwrap();
        let bkey = keys::well_known::binding("default", "web-deployment");
        let mut b = Object::new(binding::API_VERSION, binding::KIND).with_name("web-deployment");
        b.metadata.namespace = "default".into();
        b.metadata.uid = "b-uid".into();
        b.metadata.generation = Some(1);
        b.metadata.finalizers.push(binding::FINALIZER.into());
        b.spec = Some(serde_json::json!({
            "resource": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "default",
                "name": "web", "uid": "t-uid"},
            "replicas": 1,
            "placement": {"replicaScheduling": {"replicaSchedulingType": "Duplicated"}},
            "policy": {"apiVersion": "policy.karmada.io/v1alpha1", "kind": "PropagationPolicy",
                "namespace": "default", "name": "p"},
            "clusters": [{"name": "m-0", "replicas": 1}],
        }));
        store.create(&bkey, b).await.unwrap();
        let wkey = keys::well_known::work(&namespace_of("m-0"), "default.web-deployment");

        let kinds = Arc::new(LateKinds::default());
        let (stop, stopped) = watch::channel(false);
        let ctl = tokio::spawn(run(
            store.clone(),
            kinds.clone(),
            Arc::default(),
            None,
            stopped,
        ));
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(
            store.get(&wkey).await.is_err(),
            "no Work while the kind is not served"
        );
        kinds.0.store(true, std::sync::atomic::Ordering::SeqCst);
        eventually("the Work once the kind is served", || async {
            store.get(&wkey).await.is_ok()
        })
        .await;

        kinds.0.store(false, std::sync::atomic::Ordering::SeqCst);
        // Deleted as the API server deletes an object with a finalizer (the controller may be
        // writing the binding's status meanwhile: read afresh on a conflict).
        update_with(store.as_ref(), &bkey, |mut cur| {
            cur.metadata.deletion_timestamp = Some(Time::now());
            Ok(Some(cur))
        })
        .await
        .unwrap();
        eventually("the Work to go", || async {
            store.get(&wkey).await.is_err()
        })
        .await;
        eventually("the binding to go", || async {
            store.get(&bkey).await.is_err()
        })
        .await;
        let _ = stop.send(true);
        let _ = ctl.await;
        store.close().await;
    }

    /// A status is written only for a change, and a health keeps the time it began, whatever
    /// version of the binding the status was computed from.
    #[test]
    fn statuses_change_only_with_what_they_say() {
        let t0: Time = "2026-01-01T00:00:00Z".parse().unwrap();
        let t1: Time = "2026-01-01T00:01:00Z".parse().unwrap();
        let applied = Condition::new(
            CONDITION_FULLY_APPLIED,
            conditions::TRUE,
            "FullyApplied",
            "applied in every target cluster",
        );
        let waiting = Condition::new(
            CONDITION_FULLY_APPLIED,
            conditions::FALSE,
            "NotFullyApplied",
            "b: not applied yet",
        );
        let mut stored = BindingStatus::default();
        conditions::set(&mut stored.conditions, applied.clone(), t0);
        stored.aggregated_status = vec![
            item("a", Health::Healthy, Some(t0)),
            item("b", Health::Healthy, Some(t0)),
        ];
        // (condition, items computed (their times do not matter), expected: None, or each
        // cluster's health time)
        type Case = (Condition, Vec<AggregatedStatusItem>, Option<Vec<Time>>);
        let cases: Vec<(&str, Case)> = vec![
            (
                "the same, computed from an older version (other times)",
                (
                    applied.clone(),
                    vec![
                        item("a", Health::Healthy, Some(t1)),
                        item("b", Health::Healthy, None),
                    ],
                    None,
                ),
            ),
            (
                "one cluster turns unhealthy: its time is now, the other keeps its own",
                (
                    waiting.clone(),
                    vec![
                        item("a", Health::Healthy, None),
                        item("b", Health::Unhealthy, None),
                    ],
                    Some(vec![t0, t1]),
                ),
            ),
            (
                "a new cluster",
                (
                    applied.clone(),
                    vec![
                        item("a", Health::Healthy, None),
                        item("b", Health::Healthy, None),
                        item("c", Health::Healthy, None),
                    ],
                    Some(vec![t0, t0, t1]),
                ),
            ),
        ];
        for (what, (cond, items, want)) in cases {
            let extras = Extras {
                rollout: RolloutWrite::Keep,
                budget: None,
            };
            let got = with_status(&stored, &cond, &items, &[], &extras, t1);
            match want {
                None => assert!(got.is_none(), "{what}: {got:?}"),
                Some(times) => {
                    let got = got.unwrap_or_else(|| panic!("{what}: no change"));
                    let since: Vec<Time> = got
                        .aggregated_status
                        .iter()
                        .map(|i| i.health_since.unwrap())
                        .collect();
                    assert_eq!(since, times, "{what}");
                    let c = conditions::find(&got.conditions, CONDITION_FULLY_APPLIED).unwrap();
                    assert_eq!((&c.status, &c.message), (&cond.status, &cond.message));
                }
            }
        }
    }
}
