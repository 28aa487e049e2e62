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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use orrery_api::binding::{
    self, AggregatedStatusItem, BINDING_ANNOTATION, BINDING_NAMESPACE_LABEL, BindingSpec,
    CONDITION_FULLY_APPLIED, Dependency,
};
use orrery_api::cluster::namespace_of;
use orrery_api::conditions::{self, Condition};
use orrery_api::interpret::{DEPENDENCY_KINDS, Interpreter, InterpreterSpec};
use orrery_api::overrides::{self, OVERRIDE_KINDS, OverridePolicy};
use orrery_api::policy::PolicyRef;
use orrery_api::work::{Health, WorkSpec, WorkStatus, Workload};
use orrery_api::{Object, Time, keys};
use orrery_scheduler::ClusterSnapshot;
use orrery_store::ops::{delete_object, remove_finalizer};
use orrery_store::{Store, StoreError, update_with};
use serde_json::Value;
use tokio::sync::{mpsc, watch};

use super::detector::{binding_key, interpreters_prefix};
use super::scheduling::{parse_spec, parse_status, snapshot_of};
use super::{Job, Kinds, follow, next_batch, run_jobs, subject};
use crate::informer::Event;
use crate::record::{self, new_object};

const COMPONENT: &str = "orrery-binding-controller";

#[derive(Clone, Debug)]
enum Src {
    Binding,
    Work,
    Cluster,
    Override(usize),
    Dependency(usize),
    Interpreter,
}

type BKey = (String, String);
/// A dependency: kind, namespace, name.
type DKey = (String, String, String);

struct Controller {
    store: Arc<dyn Store>,
    kinds: Arc<dyn Kinds>,
    bindings: HashMap<BKey, Arc<Object>>,
    /// Works by (cluster, work name).
    works: HashMap<(String, String), Arc<Object>>,
    /// The clusters holding a Work of each binding.
    works_of: HashMap<BKey, BTreeSet<String>>,
    clusters: BTreeMap<String, ClusterSnapshot>,
    prints: HashMap<String, u64>,
    /// The last version of each Cluster, to tell heartbeats from changes of its view.
    seen: HashMap<String, Arc<Object>>,
    overrides: BTreeMap<PolicyRef, (usize, OverridePolicy)>,
    deps: HashMap<DKey, Arc<Object>>,
    dependents: HashMap<DKey, BTreeSet<BKey>>,
    interpreters: HashMap<(String, String), InterpreterSpec>,
    dirty: BTreeSet<BKey>,
    synced: BTreeSet<&'static str>,
    /// Bumped when overrides, dependencies, interpreters or clusters' labels change.
    epoch: u64,
    /// Per binding: the render inputs last rendered, and what failed then.
    rendered: std::sync::Mutex<HashMap<BKey, Rendered>>,
}

type Rendered = (u64, BTreeMap<String, String>, Vec<String>);

/// Runs the binding controller until shutdown.
pub async fn run(
    store: Arc<dyn Store>,
    kinds: Arc<dyn Kinds>,
    mut shutdown: watch::Receiver<bool>,
) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let sd = || shutdown.clone();
    follow(
        store.clone(),
        keys::prefix("multicluster.io", "resourcebindings", None),
        Src::Binding,
        tx.clone(),
        sd(),
    );
    follow(
        store.clone(),
        keys::well_known::works(None),
        Src::Work,
        tx.clone(),
        sd(),
    );
    follow(
        store.clone(),
        keys::well_known::clusters(),
        Src::Cluster,
        tx.clone(),
        sd(),
    );
    for (i, (group, _, plural)) in OVERRIDE_KINDS.iter().enumerate() {
        follow(
            store.clone(),
            keys::prefix(group, plural, None),
            Src::Override(i),
            tx.clone(),
            sd(),
        );
    }
    for (i, (_, plural)) in DEPENDENCY_KINDS.iter().enumerate() {
        follow(
            store.clone(),
            keys::prefix("", plural, None),
            Src::Dependency(i),
            tx.clone(),
            sd(),
        );
    }
    follow(
        store.clone(),
        interpreters_prefix(),
        Src::Interpreter,
        tx,
        sd(),
    );
    let mut c = Controller {
        store,
        kinds,
        bindings: HashMap::new(),
        works: HashMap::new(),
        works_of: HashMap::new(),
        clusters: BTreeMap::new(),
        prints: HashMap::new(),
        seen: HashMap::new(),
        overrides: BTreeMap::new(),
        deps: HashMap::new(),
        dependents: HashMap::new(),
        interpreters: HashMap::new(),
        dirty: BTreeSet::new(),
        synced: BTreeSet::new(),
        epoch: 0,
        rendered: Default::default(),
    };
    let mut retry = BTreeSet::new();
    let mut last_tick = std::time::Instant::now();
    loop {
        let Some(batch) = next_batch(&mut rx, Duration::from_secs(1), &mut shutdown).await else {
            return;
        };
        // Time-driven work runs on a clock, however busy the event stream is.
        let ticked = last_tick.elapsed() >= Duration::from_secs(1);
        if ticked {
            last_tick = std::time::Instant::now();
        }
        for (src, ev) in batch {
            c.on_event(src, ev);
        }
        if ticked {
            c.dirty.append(&mut retry);
            // Graceful evictions end by time.
            for (k, b) in &c.bindings {
                if b.spec.as_ref().and_then(|s| s.get("evictions")).is_some() {
                    c.dirty.insert(k.clone());
                }
            }
        }
        // Works and bindings must both be known before anything is judged missing.
        if !(c.synced.contains("bindings")
            && c.synced.contains("works")
            && c.synced.contains("clusters"))
        {
            continue;
        }
        let (n, started) = (c.dirty.len(), std::time::Instant::now());
        retry = c.reconcile_dirty().await;
        super::log_round("binding", n, started);
    }
}

fn bkey_of_work(w: &Object) -> Option<BKey> {
    let (ns, name) = w
        .metadata
        .annotations
        .get(BINDING_ANNOTATION)?
        .split_once('/')?;
    Some((ns.to_string(), name.to_string()))
}

fn view_print(s: &ClusterSnapshot) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    s.labels.hash(&mut h);
    s.properties.hash(&mut h);
    s.provider.hash(&mut h);
    s.region.hash(&mut h);
    s.zones.hash(&mut h);
    h.finish()
}

impl Controller {
    fn on_event(&mut self, src: Src, ev: Event) {
        match src {
            Src::Binding => {
                let put = |c: &mut Controller, b: Arc<Object>| {
                    let k = (b.namespace().to_string(), b.name().to_string());
                    c.index_dependencies(&k, Some(&b));
                    c.dirty.insert(k.clone());
                    c.bindings.insert(k, b);
                };
                match ev {
                    Event::Listed(items) => {
                        let old: Vec<BKey> = self.bindings.keys().cloned().collect();
                        for k in old {
                            self.index_dependencies(&k, None);
                            self.dirty.insert(k);
                        }
                        self.bindings.clear();
                        for b in items {
                            put(self, b);
                        }
                        self.synced.insert("bindings");
                    }
                    Event::Upsert(b) => put(self, b),
                    Event::Delete(b) => {
                        let k = (b.namespace().to_string(), b.name().to_string());
                        self.index_dependencies(&k, None);
                        self.bindings.remove(&k);
                        // Works left by a binding removed without us (forced): clean up.
                        self.dirty.insert(k);
                    }
                }
            }
            Src::Work => {
                let put = |c: &mut Controller, w: Arc<Object>| {
                    let Some(cluster) = orrery_api::cluster::cluster_of_namespace(w.namespace())
                    else {
                        return;
                    };
                    let cluster = cluster.to_string();
                    if let Some(k) = bkey_of_work(&w) {
                        c.works_of
                            .entry(k.clone())
                            .or_default()
                            .insert(cluster.clone());
                        c.dirty.insert(k);
                    }
                    c.works.insert((cluster, w.name().to_string()), w);
                };
                match ev {
                    Event::Listed(items) => {
                        for k in self.works_of.keys() {
                            self.dirty.insert(k.clone());
                        }
                        self.works.clear();
                        self.works_of.clear();
                        for w in items {
                            put(self, w);
                        }
                        self.synced.insert("works");
                    }
                    Event::Upsert(w) => put(self, w),
                    Event::Delete(w) => {
                        if let Some(cluster) =
                            orrery_api::cluster::cluster_of_namespace(w.namespace())
                        {
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
            Src::Cluster => {
                // Whether anything overrides read changed (compared per event: copying the
                // whole map per heartbeat costs too much in a large fleet).
                let changed = match ev {
                    Event::Listed(items) => {
                        self.clusters.clear();
                        self.prints.clear();
                        self.seen.clear();
                        for c in items {
                            self.seen.insert(c.name().to_string(), c.clone());
                            let s = snapshot_of(&c);
                            self.prints.insert(s.name.clone(), view_print(&s));
                            self.clusters.insert(s.name.clone(), s);
                        }
                        self.synced.insert("clusters");
                        true
                    }
                    Event::Upsert(c) => {
                        // What rendering reads of a Cluster (its view) comes from its labels,
                        // spec and properties; a heartbeat or a metrics report changes none of
                        // them and is not parsed.
                        let same_view = self.seen.get(c.name()).is_some_and(|old| {
                            old.metadata.labels == c.metadata.labels
                                && old.spec == c.spec
                                && old.status.as_ref().and_then(|s| s.get("properties"))
                                    == c.status.as_ref().and_then(|s| s.get("properties"))
                        });
                        self.seen.insert(c.name().to_string(), c.clone());
                        if same_view {
                            false
                        } else {
                            let s = snapshot_of(&c);
                            let print = view_print(&s);
                            let changed = self.prints.insert(s.name.clone(), print) != Some(print);
                            self.clusters.insert(s.name.clone(), s);
                            changed
                        }
                    }
                    Event::Delete(c) => {
                        self.clusters.remove(c.name());
                        self.seen.remove(c.name());
                        self.prints.remove(c.name()).is_some()
                    }
                };
                if changed {
                    // Labels and properties feed overrides and template expansion.
                    self.epoch += 1;
                    self.dirty.extend(self.bindings.keys().cloned());
                }
            }
            Src::Override(slot) => {
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
            Src::Dependency(slot) => {
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
            Src::Interpreter => {
                super::follow_interpreters(&mut self.interpreters, ev);
                self.epoch += 1;
                self.dirty.extend(self.bindings.keys().cloned());
            }
        }
    }

    /// Keeps the index from dependencies to the bindings that need them.
    fn index_dependencies(&mut self, k: &BKey, b: Option<&Object>) {
        if let Some(old) = self.bindings.get(k).and_then(|b| parse_spec(b)) {
            for d in old.dependencies {
                let dk = (d.kind, d.namespace, d.name);
                if let Some(set) = self.dependents.get_mut(&dk) {
                    set.remove(k);
                    if set.is_empty() {
                        self.dependents.remove(&dk);
                    }
                }
            }
        }
        if let Some(new) = b.and_then(parse_spec) {
            for d in new.dependencies {
                self.dependents
                    .entry((d.kind, d.namespace, d.name))
                    .or_default()
                    .insert(k.clone());
            }
        }
    }

    async fn reconcile_dirty(&mut self) -> BTreeSet<BKey> {
        let dirty = std::mem::take(&mut self.dirty);
        // Templates are read from the store (the detector keeps them; this controller only
        // needs the ones it is about to render).
        let mut tasks = BTreeSet::new();
        let wanted: Vec<(BKey, String)> = dirty
            .iter()
            .filter_map(|k| {
                let spec = parse_spec(self.bindings.get(k)?)?;
                if spec.resource.is_task() {
                    // A standalone task has no template and no Works.
                    tasks.insert(k.clone());
                    return None;
                }
                let info = self
                    .kinds
                    .resolve(&spec.resource.api_version, &spec.resource.kind)?;
                Some((
                    k.clone(),
                    info.key(&spec.resource.namespace, &spec.resource.name),
                ))
            })
            .collect();
        let store = self.store.clone();
        let templates: HashMap<BKey, Option<Object>> = futures_util::stream::iter(wanted)
            .map(|(k, key)| {
                let store = store.clone();
                async move {
                    match store.get(&key).await {
                        Ok(o) => (k, Some(Some(o))),
                        Err(StoreError::NotFound { .. }) => (k, Some(None)),
                        Err(_) => (k, None),
                    }
                }
            })
            .buffer_unordered(256)
            .filter_map(|(k, r)| async move { r.map(|r| (k, r)) })
            .collect()
            .await;
        let mut jobs: Vec<Job<BKey>> = Vec::new();
        let mut later = BTreeSet::new();
        for k in dirty {
            match templates.get(&k) {
                _ if tasks.contains(&k) => jobs.extend(self.reconcile(&k, None)),
                Some(t) => jobs.extend(self.reconcile(&k, t.as_ref())),
                None if self.bindings.contains_key(&k)
                    && parse_spec(&self.bindings[&k]).is_some() =>
                {
                    // The template could not be read now; try again.
                    later.insert(k);
                }
                None => jobs.extend(self.reconcile(&k, None)),
            }
        }
        let mut failed = run_jobs(jobs).await;
        {
            // What failed is rendered again next time.
            let mut r = self.rendered.lock().unwrap_or_else(|p| p.into_inner());
            for k in &failed {
                r.remove(k);
            }
            r.retain(|k, _| self.bindings.contains_key(k));
        }
        failed.append(&mut later);
        failed
    }

    fn work_key(cluster: &str, name: &str) -> String {
        keys::well_known::work(&namespace_of(cluster), name)
    }

    fn reconcile(&self, k: &BKey, template: Option<&Object>) -> Vec<Job<BKey>> {
        let mut jobs: Vec<Job<BKey>> = Vec::new();
        let work_name = binding::work_name(&k.0, &k.1);
        let have: Vec<String> = self
            .works_of
            .get(k)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        let b = self.bindings.get(k).cloned();
        let delete_work = |cluster: &str| -> Option<Job<BKey>> {
            let w = self
                .works
                .get(&(cluster.to_string(), work_name.clone()))?
                .clone();
            let store = self.store.clone();
            let key = k.clone();
            let wkey = Self::work_key(cluster, &work_name);
            Some(Box::pin(async move {
                delete_object(store.as_ref(), &wkey, &w)
                    .await
                    .map_err(|e| (key, e.to_string()))
            }))
        };
        let Some(b) = b else {
            // The binding is gone: so are its Works.
            return have.iter().filter_map(|c| delete_work(c)).collect();
        };
        if b.metadata.deletion_timestamp.is_some() {
            if !have.is_empty() {
                return have.iter().filter_map(|c| delete_work(c)).collect();
            }
            let store = self.store.clone();
            let key = k.clone();
            let bkey = binding_key(&k.0, &k.1);
            return vec![Box::pin(async move {
                remove_finalizer(store.as_ref(), &bkey, binding::FINALIZER)
                    .await
                    .map_err(|e| (key, e.to_string()))
            })];
        }
        let Some(spec) = parse_spec(&b) else {
            return jobs;
        };
        let Some(t) = template else { return jobs };
        if !spec.resource.uid.is_empty() && t.metadata.uid != spec.resource.uid {
            // A different object of the same name: the detector rebinds it.
            return jobs;
        }
        let custom = self
            .interpreters
            .get(&(t.api_version.clone(), t.kind.clone()));
        let interp = custom
            .map(Interpreter::Custom)
            .unwrap_or(Interpreter::BuiltIn);
        let targets: BTreeSet<&str> = spec.clusters.iter().map(|c| c.name.as_str()).collect();
        // Rendering is skipped when none of its inputs changed (a Work status coming back
        // changes none of them).
        let fp = self.render_inputs(&b, t, &have, &work_name);
        let cached = self
            .rendered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(k)
            .filter(|c| c.0 == fp)
            .cloned();
        let (errors, missing_deps) = match cached {
            Some((_, e, m)) => (e, m),
            None => {
                let (e, m) = self.render_works(k, &spec, t, interp, &work_name, &mut jobs);
                self.rendered
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(k.clone(), (fp, e.clone(), m.clone()));
                (e, m)
            }
        };
        // Works of clusters no longer targeted go, unless an eviction keeps them a while.
        let now = Time::now();
        let new_all_healthy = {
            let st = parse_status(&b);
            spec.clusters.iter().all(|c| {
                st.aggregated_status
                    .iter()
                    .any(|a| a.cluster_name == c.name && a.health == Health::Healthy)
            })
        };
        for c in &have {
            if targets.contains(c.as_str()) {
                continue;
            }
            let kept = spec.evictions.iter().any(|e| {
                e.cluster == *c
                    && (e.keep || (e.keep_until.is_some_and(|u| u > now) && !new_all_healthy))
            });
            if !kept && let Some(j) = delete_work(c) {
                jobs.push(j);
            }
        }
        jobs.extend(self.status_jobs(k, &b, &spec, t, interp, &errors, &missing_deps, &work_name));
        jobs
    }

    /// A hash of everything a binding's Works are rendered from.
    fn render_inputs(&self, b: &Object, t: &Object, have: &[String], work_name: &str) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        b.metadata.generation.hash(&mut h);
        if let Some(s) = &b.spec {
            s.get("clusters").map(|v| v.to_string()).hash(&mut h);
            s.get("suspension").map(|v| v.to_string()).hash(&mut h);
        }
        t.metadata.uid.hash(&mut h);
        t.metadata.resource_version.hash(&mut h);
        self.epoch.hash(&mut h);
        for c in have {
            c.hash(&mut h);
            self.works
                .get(&(c.clone(), work_name.to_string()))
                .and_then(|w| w.metadata.generation)
                .hash(&mut h);
        }
        h.finish()
    }

    /// Renders each target cluster's Work, queueing the writes of those that changed;
    /// returns the clusters whose rendering failed (and why) and the missing dependencies.
    fn render_works(
        &self,
        k: &BKey,
        spec: &BindingSpec,
        t: &Object,
        interp: Interpreter<'_>,
        work_name: &str,
        jobs: &mut Vec<Job<BKey>>,
    ) -> (BTreeMap<String, String>, Vec<String>) {
        let work_name = work_name.to_string();
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
        let divided = spec.placement.divided()
            && interp
                .replicas(&serde_json::to_value(t).unwrap_or(Value::Null))
                .is_some();
        for tc in &spec.clusters {
            if spec.suspension.holds(&tc.name) {
                continue;
            }
            let Some(cluster) = self.clusters.get(&tc.name) else {
                errors.insert(tc.name.clone(), "the cluster is not registered".into());
                continue;
            };
            let view = cluster.view();
            let mut manifests = Vec::new();
            let mut failed = None;
            for d in &dep_objects {
                let ops = overrides::applicable(all_overrides.iter().copied(), d);
                match overrides::render(d, Interpreter::BuiltIn, None, &view, &ops) {
                    Ok(m) => manifests.push(m),
                    Err(e) => failed = Some(e),
                }
            }
            let share = divided.then_some(tc.replicas);
            match overrides::render(t, interp, share, &view, &template_ops) {
                Ok(m) => manifests.push(m),
                Err(e) => failed = Some(e),
            }
            if let Some(e) = failed {
                errors.insert(tc.name.clone(), e);
                continue;
            }
            let ws = WorkSpec {
                workload: Workload { manifests },
                conflict_resolution: spec.conflict_resolution,
                preserve_resources_on_deletion: spec.preserve_resources_on_deletion,
            };
            let Ok(ws_value) = serde_json::to_value(&ws) else {
                continue;
            };
            let existing = self
                .works
                .get(&(tc.name.clone(), work_name.clone()))
                .cloned();
            if existing
                .as_ref()
                .is_some_and(|w| w.spec.as_ref() == Some(&ws_value))
            {
                continue;
            }
            let store = self.store.clone();
            let key = k.clone();
            let wkey = Self::work_key(&tc.name, &work_name);
            let cluster_ns = namespace_of(&tc.name);
            let wname = work_name.clone();
            let bref = format!("{}/{}", k.0, k.1);
            let bns = k.0.clone();
            jobs.push(Box::pin(async move {
                let err = |e: StoreError| (key.clone(), e.to_string());
                match existing {
                    Some(w) => {
                        let mut next = (*w).clone();
                        next.spec = Some(ws_value);
                        next.metadata.generation = Some(next.metadata.generation.unwrap_or(1) + 1);
                        store.update(&wkey, next, w.revision()).await.map_err(err)?;
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
                        if bns.len() <= 63 {
                            w.metadata
                                .labels
                                .insert(BINDING_NAMESPACE_LABEL.into(), bns);
                        }
                        w.spec = Some(ws_value);
                        match store.create(&wkey, w).await {
                            Ok(_) | Err(StoreError::AlreadyExists { .. }) => {}
                            Err(e) => return Err(err(e)),
                        }
                    }
                }
                Ok(())
            }));
        }
        (errors, missing_deps)
    }

    /// Aggregates member status into the binding and the template.
    #[allow(clippy::too_many_arguments)]
    fn status_jobs(
        &self,
        k: &BKey,
        b: &Arc<Object>,
        spec: &BindingSpec,
        t: &Object,
        interp: Interpreter<'_>,
        errors: &BTreeMap<String, String>,
        missing_deps: &[String],
        work_name: &str,
    ) -> Vec<Job<BKey>> {
        let mut jobs: Vec<Job<BKey>> = Vec::new();
        let old = parse_status(b);
        let now = Time::now();
        let mut items = Vec::new();
        let mut all_applied = !spec.clusters.is_empty();
        let mut reasons = Vec::new();
        for tc in &spec.clusters {
            let w = self.works.get(&(tc.name.clone(), work_name.to_string()));
            let ws: Option<WorkStatus> = w
                .and_then(|w| w.status.clone())
                .and_then(|s| serde_json::from_value(s).ok());
            let current = match (w, &ws) {
                (Some(w), Some(s)) => s.observed_generation == w.metadata.generation,
                _ => false,
            };
            let ms = ws.as_ref().and_then(|s| {
                s.manifest_statuses.iter().find(|m| {
                    m.identifier.kind == t.kind
                        && m.identifier.name == t.name()
                        && m.identifier.namespace == t.namespace()
                })
            });
            let mut item = AggregatedStatusItem {
                cluster_name: tc.name.clone(),
                ..Default::default()
            };
            if let Some(m) = ms {
                item.applied = m.applied && current;
                let as_object = serde_json::json!({
                    "kind": t.kind, "spec": t.spec, "status": m.status.clone().unwrap_or(Value::Null)
                });
                item.health = interp.health(&as_object, m.health);
                item.status = m.status.clone();
                item.message = m.message.clone();
            }
            if let Some(e) = errors.get(&tc.name) {
                item.applied = false;
                item.message = e.clone();
            } else if spec.suspension.holds(&tc.name) {
                item.message = "dispatching is suspended".into();
            } else if ms.is_none() {
                item.message = if w.is_none() {
                    "the Work is not created yet".into()
                } else {
                    "the member has not reported yet".into()
                };
            }
            // Work-level failures (a conflict, a refused manifest) explain an unapplied item.
            if !item.applied
                && item.message.is_empty()
                && let Some(c) = ws.as_ref().and_then(|s| {
                    conditions::find(&s.conditions, orrery_api::work::CONDITION_APPLIED)
                })
            {
                item.message = c.message.clone();
            }
            let prev = old
                .aggregated_status
                .iter()
                .find(|a| a.cluster_name == tc.name);
            item.health_since = match prev {
                Some(p) if p.health == item.health => p.health_since.or(Some(now)),
                _ => Some(now),
            };
            if !item.applied {
                all_applied = false;
                reasons.push(format!(
                    "{}: {}",
                    tc.name,
                    if item.message.is_empty() {
                        "not applied yet"
                    } else {
                        &item.message
                    }
                ));
            }
            items.push(item);
        }
        if !missing_deps.is_empty() {
            reasons.push(format!("missing dependencies: {}", missing_deps.join(", ")));
        }
        let cond = if all_applied && missing_deps.is_empty() {
            Condition::new(
                CONDITION_FULLY_APPLIED,
                conditions::TRUE,
                "FullyApplied",
                "applied in every target cluster",
            )
        } else if spec.clusters.is_empty() {
            Condition::new(
                CONDITION_FULLY_APPLIED,
                conditions::FALSE,
                "NotScheduled",
                "no target cluster",
            )
        } else {
            Condition::new(
                CONDITION_FULLY_APPLIED,
                conditions::FALSE,
                "NotFullyApplied",
                reasons.join("; "),
            )
        };
        let mut conds = old.conditions.clone();
        conditions::set(&mut conds, cond.clone(), now);
        // Times alone do not make a status change worth a write.
        let strip = |v: &[AggregatedStatusItem]| -> Vec<AggregatedStatusItem> {
            v.iter()
                .cloned()
                .map(|mut i| {
                    i.health_since = None;
                    i
                })
                .collect()
        };
        if conds != old.conditions || strip(&items) != strip(&old.aggregated_status) {
            let store = self.store.clone();
            let key = k.clone();
            let bkey = binding_key(&k.0, &k.1);
            // Events for what a person must look at: an error in some cluster. (Placement
            // has its own Event; a normal rollout needs none per binding.)
            let trouble = !errors.is_empty()
                || items
                    .iter()
                    .any(|i| !i.applied && i.message.contains("conflict"));
            let announce = trouble
                && conditions::find(&old.conditions, CONDITION_FULLY_APPLIED)
                    .map(|c| c.message.clone())
                    != Some(cond.message.clone());
            let r = spec.resource.clone();
            let items = items.clone();
            let cond2 = cond.clone();
            let cond = cond.clone();
            let seen = b.clone();
            jobs.push(Box::pin(async move {
                let with_status = |mut cur: Object| {
                    let mut st = parse_status(&cur);
                    conditions::set(&mut st.conditions, cond2.clone(), now);
                    st.aggregated_status = items.clone();
                    cur.status = serde_json::to_value(&st).ok();
                    cur
                };
                // The binding as this controller saw it is usually current: write over it,
                // and read afresh only when someone wrote in between.
                let first = store
                    .update(&bkey, with_status((*seen).clone()), seen.revision())
                    .await;
                match first {
                    Ok(_) => {}
                    Err(StoreError::Conflict { .. }) => {
                        update_with(store.as_ref(), &bkey, |cur| {
                            if cur.metadata.deletion_timestamp.is_some() {
                                return Ok(None);
                            }
                            Ok(Some(with_status(cur)))
                        })
                        .await
                        .map_err(|e| (key.clone(), e.to_string()))?;
                    }
                    Err(e) => return Err((key.clone(), e.to_string())),
                }
                if announce {
                    let about = subject(&r.api_version, &r.kind, &r.namespace, &r.name, &r.uid);
                    let _ = record::event(
                        store.as_ref(),
                        &about,
                        "Warning",
                        "NotYetAvailable",
                        &cond.message,
                        COMPONENT,
                    )
                    .await;
                }
                Ok(())
            }));
        }
        // The template's own status.
        let parts: Vec<(&str, &Value)> = items
            .iter()
            .filter_map(|i| Some((i.cluster_name.as_str(), i.status.as_ref()?)))
            .collect();
        if let Some(mut agg) = interp.aggregate(&t.kind, &parts) {
            if cond.is_true()
                && let (Some(m), Some(g)) = (agg.as_object_mut(), t.metadata.generation)
                && (m.contains_key("observedGeneration") || parts.len() > 1)
            {
                // The members run the current spec: in the control plane's terms, the
                // template's generation is observed.
                m.insert("observedGeneration".into(), Value::from(g));
            }
            if t.status.as_ref() != Some(&agg)
                && let Some(info) = self.kinds.resolve(&t.api_version, &t.kind)
            {
                let store = self.store.clone();
                let key = k.clone();
                let tkey = info.key(t.namespace(), t.name());
                let uid = t.metadata.uid.clone();
                jobs.push(Box::pin(async move {
                    let r = update_with(store.as_ref(), &tkey, |mut cur| {
                        if cur.metadata.uid != uid || cur.status.as_ref() == Some(&agg) {
                            return Ok(None);
                        }
                        cur.status = Some(agg.clone());
                        Ok(Some(cur))
                    })
                    .await;
                    match r {
                        Ok(_) | Err(StoreError::NotFound { .. }) => Ok(()),
                        Err(e) => Err((key, e.to_string())),
                    }
                }));
            }
        }
        jobs
    }
}
