//! The policy controller: which policy places each template, and the template's
//! `ResourceBinding` (created, kept in step, deleted). A template gets the propagation
//! finalizer while it is bound, so deleting it waits until its binding (and so its Works) is
//! gone; a restart midway resumes from what is stored.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use orrery_api::binding::{self, BindingSpec, Dependency, ObjectReference, ReplicaRequirements};
use orrery_api::interpret::{DEPENDENCY_API_VERSION, InterpreterSpec};
use orrery_api::policy::{self, PLACEMENT_KINDS, PlacementPolicy, PolicyRef};
use orrery_api::{Object, keys};
use orrery_store::ops::{delete_object, remove_finalizer};
use orrery_store::{Store, StoreError};
use serde_json::Value;
use tokio::sync::watch;

use super::{
    Job, Kinds, TEMPLATES, TemplateKinds, content_digest, is_system_namespace, run_jobs,
    same_but_status,
};
use crate::runtime::Event;
use crate::runtime::controller::{Action, Batch, Controller, Keys, Origin, Source};
use orrery_store::stamp::new_object;

/// Annotation on a binding: the content digest of the template version it describes.
pub const DIGEST_ANNOTATION: &str = "multicluster.io/template-digest";

/// A template: apiVersion, kind, namespace, name.
type TKey = (String, String, String, String);

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Src {
    Policy(usize),
    Template(usize),
    Binding,
    Interpreter,
    Customization,
    PriorityClass,
}

/// The namespace a template's binding lives in (cluster-scoped templates: `orrery-system`).
pub fn binding_namespace(template_ns: &str) -> &str {
    if template_ns.is_empty() {
        crate::inventory::NAMESPACE
    } else {
        template_ns
    }
}

struct Detector {
    store: Arc<dyn Store>,
    kinds: Arc<dyn Kinds>,
    policies: BTreeMap<PolicyRef, PlacementPolicy>,
    policy_slots: HashMap<PolicyRef, usize>,
    /// What each policy's status says it binds.
    policy_bound: HashMap<PolicyRef, Option<i64>>,
    /// What each policy's status was last sent as (cleared each tick, so a lost write is
    /// sent again).
    policy_sent: HashMap<PolicyRef, i64>,
    /// Policy statuses to write, in order, by [`write_reports`].
    reports: tokio::sync::mpsc::UnboundedSender<(String, serde_json::Value)>,
    /// The templates each policy holds (from the bindings).
    bound_by: HashMap<PolicyRef, BTreeSet<TKey>>,
    /// Template kinds followed: (apiVersion, kind) → slot.
    watched: TemplateKinds,
    templates: HashMap<TKey, Arc<Object>>,
    /// Bindings by (namespace, name).
    bindings: HashMap<(String, String), Arc<Object>>,
    interpreters: HashMap<(String, String), InterpreterSpec>,
    /// Karmada's customizations, per kind.
    customized: super::customized::Customized,
    /// The value and preemption policy of each Kubernetes PriorityClass, by name (Karmada's
    /// `schedulePriority`).
    priority_classes: HashMap<String, binding::SchedulePriority>,
    /// Templates to decide, for the controller's queue.
    dirty: Vec<TKey>,
    /// Workloads told (by uid) that no policy selects them.
    told_unselected: parking_lot::Mutex<std::collections::HashSet<String>>,
    /// Templates to decide again at a time (one too young to be told no policy selects it).
    later: parking_lot::Mutex<Vec<(TKey, std::time::Instant)>>,
}

/// The source of Kubernetes PriorityClasses.
const PRIORITY_CLASSES: &str = "priorityclasses";
/// Karmada's Event reason when a template's binding cannot be built.
pub const APPLY_POLICY_FAILED: &str = "ApplyPolicyFailed";

/// Keeps each PriorityClass's `value` and `preemptionPolicy` by name.
fn follow_priority_classes(map: &mut HashMap<String, binding::SchedulePriority>, ev: Event) {
    let value = |o: &Object| {
        let priority = o
            .other
            .get("value")
            .and_then(Value::as_i64)
            .and_then(|v| i32::try_from(v).ok())?;
        let preemption_policy = o
            .other
            .get("preemptionPolicy")
            .and_then(Value::as_str)
            .unwrap_or(binding::PREEMPT_LOWER_PRIORITY)
            .to_string();
        Some(binding::SchedulePriority {
            priority,
            preemption_policy,
        })
    };
    match ev {
        Event::Listed(items) => {
            *map = items
                .iter()
                .filter_map(|o| Some((o.name().to_string(), value(o)?)))
                .collect()
        }
        Event::Upsert(o) => {
            if let Some(v) = value(&o) {
                map.insert(o.name().to_string(), v);
            }
        }
        Event::Delete(o) => {
            map.remove(o.name());
        }
    }
}

/// The Event reason on a workload that no placement policy selects.
pub const NO_POLICY_REASON: &str = "NoPlacementPolicy";
/// What a template's status says when no policy places it.
const NO_POLICY_STATUS: &str = "no placement policy selects it: it runs in no cluster";
/// How long a workload may wait for its policy before it is told none selects it (a
/// template and its policy applied from one file arrive a moment apart).
const UNSELECTED_GRACE: Duration = Duration::from_secs(10);

/// Kinds whose templates a newcomer expects to run somewhere (told when nothing places them).
fn is_workload(kind: &str) -> bool {
    matches!(
        kind,
        "Deployment" | "StatefulSet" | "DaemonSet" | "Job" | "CronJob" | "ReplicaSet"
    )
}

#[async_trait::async_trait]
impl Batch for Detector {
    type Key = TKey;
    type Error = StoreError;

    fn on_event(&mut self, source: Origin, ev: Event, keys: &mut Keys<TKey>) {
        let src = match (source.name, source.slot) {
            ("policies", Some(i)) => Src::Policy(i),
            (TEMPLATES, Some(i)) => Src::Template(i),
            ("bindings", _) => Src::Binding,
            ("customizations", _) => Src::Customization,
            (PRIORITY_CLASSES, _) => Src::PriorityClass,
            _ => Src::Interpreter,
        };
        self.take_event(src, ev);
        self.hand_over(keys);
    }

    /// Time-driven work runs on a clock, however busy the event stream is.
    fn tick(&mut self, keys: &mut Keys<TKey>) {
        // Kinds that could not be resolved yet (a CRD arriving later).
        self.follow_policy_kinds();
        self.policy_sent.clear();
        // A policy that places nothing says so too (the loop ticks only once everything is
        // listed: before the bindings are, every policy would be told it places nothing).
        self.report_policies();
        self.hand_over(keys);
    }

    async fn reconcile_batch(
        &mut self,
        keys: Vec<TKey>,
    ) -> Vec<(TKey, Result<Action, StoreError>)> {
        let (n, started) = (keys.len(), std::time::Instant::now());
        let failed = self.reconcile_keys(&keys).await;
        let now = std::time::Instant::now();
        let later: HashMap<TKey, std::time::Instant> = std::mem::take(&mut *self.later.lock())
            .into_iter()
            .collect();
        super::log_round("policy", n, started);
        keys.into_iter()
            .map(|k| {
                let r = if failed.contains(&k) {
                    Err(StoreError::Backend(format!(
                        "deciding the binding of {} {}/{} failed",
                        k.1, k.2, k.3
                    )))
                } else {
                    Ok(later.get(&k).map_or(Action::Done, |at| {
                        Action::After(at.saturating_duration_since(now))
                    }))
                };
                (k, r)
            })
            .collect()
    }
}

impl Detector {
    /// Hands the controller's loop the templates to decide and the kinds to follow.
    fn hand_over(&mut self, keys: &mut Keys<TKey>) {
        keys.extend(self.dirty.drain(..));
        for s in self.watched.take_new() {
            keys.follow(s);
        }
    }
}

/// Runs the policy controller until shutdown.
pub async fn run(
    store: Arc<dyn Store>,
    kinds: Arc<dyn Kinds>,
    metrics: Arc<crate::runtime::metrics::ControllerMetrics>,
    shutdown: watch::Receiver<bool>,
) {
    let (reports_tx, reports_rx) = tokio::sync::mpsc::unbounded_channel();
    let reporter = tokio::spawn(write_reports(store.clone(), reports_rx));
    let d = Detector {
        store: store.clone(),
        kinds: kinds.clone(),
        policies: BTreeMap::new(),
        policy_slots: HashMap::new(),
        policy_bound: HashMap::new(),
        policy_sent: HashMap::new(),
        reports: reports_tx,
        bound_by: HashMap::new(),
        watched: TemplateKinds::new(kinds),
        templates: HashMap::new(),
        bindings: HashMap::new(),
        interpreters: HashMap::new(),
        customized: Default::default(),
        priority_classes: HashMap::new(),
        dirty: Vec::new(),
        told_unselected: Default::default(),
        later: Default::default(),
    };
    let mut c = Controller::batched("policy", store, d, metrics.of("policy"))
        .backoff(Duration::from_millis(200), Duration::from_secs(30))
        .every(Duration::from_secs(2));
    for (i, (group, _, plural)) in PLACEMENT_KINDS.iter().enumerate() {
        c = c.source(Source::slot(
            "policies",
            i,
            keys::prefix(group, plural, None),
        ));
    }
    c.source(Source::new(
        "bindings",
        orrery_api::kinds::RESOURCE_BINDING.prefix(None),
    ))
    .source(Source::new(
        "interpreters",
        keys::well_known::interpreters(),
    ))
    .source(Source::new(
        "customizations",
        orrery_api::kinds::RESOURCE_INTERPRETER_CUSTOMIZATION.prefix(None),
    ))
    .source(Source::new(
        PRIORITY_CLASSES,
        keys::prefix("scheduling.k8s.io", "priorityclasses", None),
    ))
    .run(shutdown)
    .await;
    // The statuses decided so far are written before the controller stops (the controller,
    // and with it the sender, is gone).
    let _ = reporter.await;
}

impl Detector {
    fn take_event(&mut self, src: Src, ev: Event) {
        match src {
            Src::Policy(slot) => self.take_policy_event(slot, ev),
            Src::Template(slot) => self.take_template_event(slot, ev),
            Src::Binding => self.take_binding_event(ev),
            Src::Interpreter => {
                super::follow_interpreters(&mut self.interpreters, ev);
                let all: Vec<TKey> = self.templates.keys().cloned().collect();
                self.mark_all(all);
            }
            Src::Customization => {
                self.customized.follow(ev);
                let all: Vec<TKey> = self.templates.keys().cloned().collect();
                self.mark_all(all);
            }
            Src::PriorityClass => {
                follow_priority_classes(&mut self.priority_classes, ev);
                // Rare: every template is looked at again (one waiting for its class too).
                let all: Vec<TKey> = self.templates.keys().cloned().collect();
                self.mark_all(all);
            }
        }
    }

    /// A policy of the kind in `slot` changed: it is kept, and the templates it may move
    /// are marked.
    fn take_policy_event(&mut self, slot: usize, ev: Event) {
        // What this event may move: templates the policy's old or new selectors could
        // match, and those it held.
        let mut sels: Vec<policy::ResourceSelector> = Vec::new();
        let mut everything = false;
        let mut held: Vec<TKey> = Vec::new();
        match &ev {
            Event::Listed(_) => everything = true,
            // A status write (ours) or a no-op update moves nothing.
            Event::Upsert(o)
                if policy::from_object(o).ok().as_ref() == self.policies.get(&PolicyRef::of(o)) =>
            {
                let bound = o
                    .status
                    .as_ref()
                    .and_then(|s| s.get("boundResources"))
                    .and_then(Value::as_i64);
                self.policy_bound.insert(PolicyRef::of(o), bound);
                return;
            }
            Event::Upsert(o) | Event::Delete(o) => {
                let r = PolicyRef::of(o);
                if let Some(p) = self.policies.get(&r) {
                    sels.extend(p.selectors.iter().cloned());
                }
                if let Ok(p) = policy::from_object(o) {
                    sels.extend(p.selectors);
                }
                held.extend(self.bound_by.get(&r).into_iter().flatten().cloned());
            }
        }
        let apply = |d: &mut Detector, o: &Object| {
            let bound = o
                .status
                .as_ref()
                .and_then(|s| s.get("boundResources"))
                .and_then(Value::as_i64);
            d.policy_bound.insert(PolicyRef::of(o), bound);
            if let Ok(p) = policy::from_object(o) {
                d.policy_slots.insert(p.reference.clone(), slot);
                d.policies.insert(p.reference.clone(), p);
            }
        };
        match ev {
            Event::Listed(items) => {
                let gone: Vec<PolicyRef> = self
                    .policy_slots
                    .iter()
                    .filter(|(_, s)| **s == slot)
                    .map(|(r, _)| r.clone())
                    .collect();
                for r in gone {
                    self.policies.remove(&r);
                    self.policy_slots.remove(&r);
                }
                for o in &items {
                    apply(self, o);
                }
            }
            Event::Upsert(o) => {
                self.policies.remove(&PolicyRef::of(&o));
                apply(self, &o);
            }
            Event::Delete(o) => {
                let r = PolicyRef::of(&o);
                self.policies.remove(&r);
                self.policy_slots.remove(&r);
                self.policy_bound.remove(&r);
            }
        }
        self.follow_policy_kinds();
        // Re-deciding writes nothing when nothing changes.
        let could_match = |k: &TKey| {
            everything
                || sels.iter().any(|s| {
                    s.kind == k.1
                        && orrery_api::kinds::same_schema(&k.1, &s.api_version, &k.0)
                        && (s.namespace.is_empty() || s.namespace == k.2)
                        && (s.name.is_empty() || s.name == k.3)
                })
        };
        let mut dirty: Vec<TKey> = self
            .templates
            .keys()
            .filter(|k| could_match(k))
            .cloned()
            .collect();
        if everything {
            dirty.extend(self.bindings.values().filter_map(|b| template_of(b)));
        }
        dirty.extend(held);
        self.mark_all(dirty);
    }

    /// A template of the kind in `slot` changed: it is kept, and marked unless only its
    /// status changed.
    fn take_template_event(&mut self, slot: usize, ev: Event) {
        match ev {
            Event::Listed(items) => {
                let gone: Vec<TKey> = self
                    .templates
                    .keys()
                    .filter(|k| self.watched.slot(&k.0, &k.1) == Some(slot))
                    .cloned()
                    .collect();
                for k in gone {
                    self.templates.remove(&k);
                    self.mark(k);
                }
                for o in items {
                    if let Some(k) = self.template_key(&o) {
                        self.mark(k.clone());
                        self.templates.insert(k, o);
                    }
                }
            }
            Event::Upsert(o) => {
                if let Some(k) = self.template_key(&o) {
                    // A status write (the binding controller's) changes nothing here.
                    if !self
                        .templates
                        .get(&k)
                        .is_some_and(|old| same_but_status(old, &o))
                    {
                        self.mark(k.clone());
                    }
                    self.templates.insert(k, o);
                }
            }
            Event::Delete(o) => {
                if let Some(k) = self.template_key(&o) {
                    self.templates.remove(&k);
                    self.mark(k);
                }
            }
        }
    }

    /// A binding changed: it is kept and indexed, and its template marked when what this
    /// controller decides of it changed.
    fn take_binding_event(&mut self, ev: Event) {
        match ev {
            Event::Listed(items) => {
                let before: Vec<TKey> = self
                    .bindings
                    .values()
                    .filter_map(|b| template_of(b))
                    .collect();
                self.mark_all(before);
                self.bindings.clear();
                self.bound_by.clear();
                for b in items {
                    self.put_binding(b);
                }
            }
            Event::Upsert(b) => {
                let k = (b.namespace().to_string(), b.name().to_string());
                // The scheduler's and the binding controller's writes leave what this
                // controller decides (the generation) alone.
                if let Some(old) = self.bindings.get(&k)
                    && old.metadata.generation == b.metadata.generation
                    && old.metadata.deletion_timestamp == b.metadata.deletion_timestamp
                    && old.metadata.annotations == b.metadata.annotations
                {
                    self.bindings.insert(k, b);
                    return;
                }
                if let Some(old) = self.bindings.remove(&k) {
                    self.unindex(&old);
                }
                self.put_binding(b);
            }
            Event::Delete(b) => {
                if let Some(k) = template_of(&b) {
                    self.mark(k);
                }
                if let Some(old) = self
                    .bindings
                    .remove(&(b.namespace().to_string(), b.name().to_string()))
                {
                    self.unindex(&old);
                }
            }
        }
    }

    fn mark(&mut self, k: TKey) {
        self.dirty.push(k);
    }

    fn mark_all(&mut self, keys: impl IntoIterator<Item = TKey>) {
        self.dirty.extend(keys);
    }

    fn put_binding(&mut self, b: Arc<Object>) {
        if let Some(k) = template_of(&b) {
            self.mark(k.clone());
            if let Some(p) = policy_of(&b) {
                self.bound_by.entry(p).or_default().insert(k);
            }
        }
        self.bindings
            .insert((b.namespace().to_string(), b.name().to_string()), b);
    }

    fn unindex(&mut self, b: &Object) {
        if let (Some(k), Some(p)) = (template_of(b), policy_of(b))
            && let Some(set) = self.bound_by.get_mut(&p)
        {
            set.remove(&k);
            if set.is_empty() {
                self.bound_by.remove(&p);
            }
        }
    }

    fn template_key(&self, o: &Object) -> Option<TKey> {
        // (Orrery's own imports and slices are distributed by the services controller.)
        if is_system_namespace(o.namespace()) || orrery_api::services::is_orrerys_own(o) {
            return None;
        }
        Some((
            o.api_version.clone(),
            o.kind.clone(),
            o.namespace().to_string(),
            o.name().to_string(),
        ))
    }

    /// Starts following every template kind a policy names (once each), and the workload
    /// kinds always (one that no policy selects is told so).
    fn follow_policy_kinds(&mut self) {
        let wanted: BTreeSet<(String, String)> = self
            .policies
            .values()
            .flat_map(|p| {
                p.selectors
                    .iter()
                    .map(|s| (s.api_version.clone(), s.kind.clone()))
            })
            .chain(
                [
                    ("apps/v1", "Deployment"),
                    ("apps/v1", "StatefulSet"),
                    ("apps/v1", "DaemonSet"),
                    ("batch/v1", "Job"),
                    ("batch/v1", "CronJob"),
                ]
                .map(|(v, k)| (v.to_string(), k.to_string())),
            )
            .collect();
        // Each new kind is handed to the loop, whose barrier holds every round until it has
        // listed: no template is decided while its kind may hold more.
        for (api_version, kind) in wanted {
            self.watched.follow(&api_version, &kind);
        }
    }

    async fn reconcile_keys(&mut self, keys: &[TKey]) -> BTreeSet<TKey> {
        let mut jobs: Vec<Job<TKey>> = Vec::new();
        for k in keys {
            if let Some(j) = self.reconcile(k) {
                jobs.push(j);
            }
            // What a customization's scripts failed at in deciding it, told on the template.
            if let Some(t) = self.templates.get(k)
                && let Some(s) = self.customized.of(&self.interpreters, &k.0, &k.1)
                && let f = s.take_failures()
                && !f.is_empty()
            {
                jobs.push(super::customized::report(
                    self.store.clone(),
                    f.iter().map(|f| f.text()).collect(),
                    t.clone(),
                    None,
                ));
            }
        }
        let failed = run_jobs(jobs).await;
        self.report_policies();
        failed
    }

    /// Tells each policy, in its status, how many templates it places: a selector that
    /// matches nothing is accepted and shows here. The writes run in the background.
    fn report_policies(&mut self) {
        for r in self.policies.keys() {
            let n = self.bound_by.get(r).map(|s| s.len() as i64).unwrap_or(0);
            if self.policy_bound.get(r) == Some(&Some(n)) || self.policy_sent.get(r) == Some(&n) {
                continue;
            }
            self.policy_sent.insert(r.clone(), n);
            let Some((group, _, plural)) = PLACEMENT_KINDS.iter().find(|(_, k, _)| *k == r.kind)
            else {
                continue;
            };
            let ns = (!r.namespace.is_empty()).then_some(r.namespace.as_str());
            let key = keys::object(group, plural, ns, &r.name);
            let (status, reason, message) = if n > 0 {
                ("True", "Bound", format!("places {n} resource(s)"))
            } else {
                (
                    "False",
                    "NoMatch",
                    "no resource matches the selectors (or another policy holds them)".to_string(),
                )
            };
            let mut condition =
                orrery_api::conditions::Condition::new("Bound", status, reason, message);
            condition.last_transition_time = Some(orrery_api::Time::now());
            let report = orrery_api::policy::PolicyStatus {
                bound_resources: n,
                conditions: vec![condition],
            };
            let Ok(body) = serde_json::to_value(&report) else {
                continue;
            };
            let _ = self.reports.send((key, body));
        }
    }

    fn reconcile(&self, k: &TKey) -> Option<Job<TKey>> {
        let (api_version, kind, ns, name) = k;
        let bns = binding_namespace(ns).to_string();
        let bname = binding::name_for(kind, name);
        let existing = self.bindings.get(&(bns.clone(), bname.clone())).cloned();
        let bkey = keys::well_known::binding(&bns, &bname);
        let template = self.templates.get(k).cloned();
        let info = self.kinds.resolve(api_version, kind);
        let unbind = |existing: Option<Arc<Object>>, template: Option<Arc<Object>>| {
            self.unbind(k, &bkey, existing, template, info.clone())
        };
        let Some(t) = template else {
            return unbind(existing, None);
        };
        if t.metadata.deletion_timestamp.is_some() {
            return unbind(existing, Some(t));
        }
        let claimant: Option<PolicyRef> = existing
            .as_ref()
            .filter(|b| b.metadata.deletion_timestamp.is_none())
            .and_then(|b| b.spec.as_ref()?.get("policy").cloned())
            .and_then(|p| serde_json::from_value(p).ok());
        let Some(p) = policy::choose(self.policies.values(), &t, claimant.as_ref()) else {
            let bound = existing.is_some();
            let placed_before = has_finalizer(&t);
            return unbind(existing, Some(t.clone())).or_else(|| {
                if bound || placed_before {
                    return None;
                }
                self.unselected_jobs(k, &t, info.clone())
            });
        };
        if existing
            .as_ref()
            .is_some_and(|b| b.metadata.deletion_timestamp.is_some())
        {
            // The old binding is still going away; bind again once it is gone.
            return None;
        }
        let schedule_priority = match &p.schedule_priority {
            None => None,
            Some(sp) => match self.priority_classes.get(&sp.priority_class_name) {
                Some(v) => Some(v.clone()),
                // Karmada builds no binding then: what is bound stays as it is.
                None => return self.priority_class_missing(k, &t, p, &sp.priority_class_name),
            },
        };
        let digest = content_digest(&t);
        let mut spec = self.desired(&t, &digest, p, existing.as_deref());
        spec.schedule_priority = schedule_priority;
        let interp = self.customized.interpreter(&self.interpreters, &t);
        spec.components = interp.components(&serde_json::to_value(&*t).unwrap_or(Value::Null));
        let info = info?;
        let tkey = info.key(t.namespace(), t.name());
        let store = self.store.clone();
        let key = k.clone();
        let needs_finalizer = !has_finalizer(&t);
        let write_binding = binding_to_write(
            &bns,
            &bname,
            kind,
            existing.as_ref(),
            serde_json::to_value(&spec).ok(),
            digest,
        );
        if !needs_finalizer && write_binding.is_none() {
            return None;
        }
        let creating = existing.is_none();
        let forget = self.no_policy_event_to_forget(&t, creating);
        Some(bind_job(
            store,
            Bind {
                key,
                bkey,
                tkey,
                t,
                forget,
                needs_finalizer,
                write_binding,
                creating,
            },
        ))
    }

    /// The policy names a PriorityClass that does not exist: an Event on the template says so
    /// (Karmada's reason and message), and the template is bound once the class exists.
    fn priority_class_missing(
        &self,
        k: &TKey,
        t: &Arc<Object>,
        p: &PlacementPolicy,
        class: &str,
    ) -> Option<Job<TKey>> {
        let store = self.store.clone();
        let (key, t) = (k.clone(), t.clone());
        let r = &p.reference;
        let policy = if r.namespace.is_empty() {
            r.name.clone()
        } else {
            format!("{}/{}", r.namespace, r.name)
        };
        let message = format!(
            "Apply policy({policy}) failed: priorityclasses.scheduling.k8s.io \"{class}\" not found"
        );
        let once = format!("{}-{class}", t.metadata.uid);
        Some(Box::pin(async move {
            crate::record::event_once_for(
                store.as_ref(),
                &t,
                &once,
                "Warning",
                APPLY_POLICY_FAILED,
                &message,
                "orrery-policy-controller",
            )
            .await
            .map(|_| ())
            .map_err(|e| (key, e.to_string()))
        }))
    }

    /// Nothing places the template: its status says what runs (nothing), and an Event why.
    fn unselected_jobs(
        &self,
        k: &TKey,
        t: &Arc<Object>,
        info: Option<super::KindInfo>,
    ) -> Option<Job<TKey>> {
        let status = self.unplaced_status_job(k, t, info);
        let told = self.tell_unselected(k, t);
        match (status, told) {
            (Some(a), Some(b)) => Some(Box::pin(async move {
                let (x, y) = tokio::join!(a, b);
                x.and(y)
            }) as Job<TKey>),
            (a, b) => a.or(b),
        }
    }

    /// The template whose no-policy Event goes now that a binding is made for it: selected
    /// at last, the warning that no policy did goes (and is said again should it lose its
    /// policy).
    fn no_policy_event_to_forget(&self, t: &Arc<Object>, creating: bool) -> Option<Arc<Object>> {
        let told = creating && self.told_unselected.lock().remove(&t.metadata.uid);
        // (Told by an earlier run of this server: a workload that waited longer than the
        // grace for its policy may have been.)
        let waited = t.metadata.creation_timestamp.is_some_and(|c| {
            orrery_api::Time::now().unix_seconds() - c.unix_seconds()
                >= UNSELECTED_GRACE.as_secs() as i64
        });
        (told || (creating && waited && is_workload(&t.kind))).then(|| t.clone())
    }

    /// A template no policy places whose status still tells of pods running (its policy went
    /// while this server was down, say): the status says none run, and why.
    fn unplaced_status_job(
        &self,
        k: &TKey,
        t: &Arc<Object>,
        info: Option<super::KindInfo>,
    ) -> Option<Job<TKey>> {
        if !orrery_api::interpret::shows_running(t, NO_POLICY_REASON) {
            return None;
        }
        let tkey = info?.key(t.namespace(), t.name());
        let (store, key, uid) = (self.store.clone(), k.clone(), t.metadata.uid.clone());
        Some(Box::pin(async move {
            let r = orrery_store::update_with(store.as_ref(), &tkey, |mut cur| {
                if cur.metadata.uid != uid
                    || !orrery_api::interpret::shows_running(&cur, NO_POLICY_REASON)
                {
                    return Ok(None);
                }
                cur.status = orrery_api::interpret::unplaced_status(
                    &cur,
                    NO_POLICY_REASON,
                    NO_POLICY_STATUS,
                );
                Ok(Some(cur))
            })
            .await;
            match r {
                Ok(_) | Err(StoreError::NotFound { .. }) => Ok(()),
                Err(e) => Err((key, e.to_string())),
            }
        }))
    }

    /// A workload that no policy selects runs nowhere: an Event on it says so, once (also
    /// across restarts: one already recorded is not recorded again).
    fn tell_unselected(&self, k: &TKey, t: &Arc<Object>) -> Option<Job<TKey>> {
        let ns = t.namespace();
        if !is_workload(&t.kind)
            || ns.is_empty()
            || ns.starts_with("orrery-")
            || ns.starts_with("kube-")
        {
            return None;
        }
        // A template and its policy applied together arrive a moment apart: only one left
        // unselected for a while is told so.
        let age = t
            .metadata
            .creation_timestamp
            .map(|c| orrery_api::Time::now().unix_seconds() - c.unix_seconds())
            .unwrap_or(i64::MAX);
        if age < UNSELECTED_GRACE.as_secs() as i64 {
            let wait = UNSELECTED_GRACE.saturating_sub(Duration::from_secs(age.max(0) as u64));
            self.later
                .lock()
                .push((k.clone(), std::time::Instant::now() + wait));
            return None;
        }
        if !self.told_unselected.lock().insert(t.metadata.uid.clone()) {
            return None;
        }
        let store = self.store.clone();
        let (key, t) = (k.clone(), t.clone());
        Some(Box::pin(async move {
            let message = format!(
                "no placement policy selects this {}: it runs in no cluster (create a ResourcePlacementPolicy or PropagationPolicy that selects it; see docs/policies.md)",
                t.kind
            );
            crate::record::event_once(
                store.as_ref(),
                &t,
                "Warning",
                NO_POLICY_REASON,
                &message,
                "orrery-policy-controller",
            )
            .await
            .map_err(|e| (key, e.to_string()))
        }))
    }

    /// Unbinding: delete the binding first; its Works go with it (the binding controller
    /// holds it until they are gone); then release the template.
    fn unbind(
        &self,
        k: &TKey,
        bkey: &str,
        existing: Option<Arc<Object>>,
        template: Option<Arc<Object>>,
        info: Option<super::KindInfo>,
    ) -> Option<Job<TKey>> {
        let store = self.store.clone();
        let key = k.clone();
        match existing {
            Some(b) => {
                if b.metadata.deletion_timestamp.is_some() {
                    return None;
                }
                let bkey = bkey.to_string();
                let kinds = self.kinds.clone();
                Some(Box::pin(async move {
                    // Deleting a binding takes its workload out of every member: the decision
                    // is read afresh from the store before it is carried out.
                    let claimant = policy_of(&b);
                    match unbind_still_holds(store.as_ref(), kinds.as_ref(), &key, claimant).await {
                        Ok(true) => {}
                        Ok(false) => {
                            return Err((
                                key,
                                "the store still places the template; the view was behind".into(),
                            ));
                        }
                        Err(e) => return Err((key, e.to_string())),
                    }
                    delete_object(store.as_ref(), &bkey, &b)
                        .await
                        .map_err(|e| (key, e.to_string()))
                }))
            }
            None => {
                let t = template?;
                if !t
                    .metadata
                    .finalizers
                    .iter()
                    .any(|f| f == binding::FINALIZER)
                {
                    return None;
                }
                let tkey = info?.key(t.namespace(), t.name());
                let uid = t.metadata.uid.clone();
                if t.metadata.deletion_timestamp.is_some() {
                    // Going: released (the last finalizer out deletes it).
                    return Some(Box::pin(async move {
                        remove_finalizer(store.as_ref(), &tkey, binding::FINALIZER)
                            .await
                            .map_err(|e| (key, e.to_string()))
                    }));
                }
                Some(Box::pin(async move {
                    // Released, and said to run nowhere (its members' summed status would
                    // otherwise outlive the placement) in one write.
                    let r = orrery_store::update_with(store.as_ref(), &tkey, |mut cur| {
                        if cur.metadata.deletion_timestamp.is_some() {
                            // Deleted meanwhile: released as above, on the next pass.
                            return Err(StoreError::Backend(
                                "the template is being deleted; released on the next pass".into(),
                            ));
                        }
                        if cur.metadata.uid != uid {
                            return Ok(None);
                        }
                        let before = cur.metadata.finalizers.len();
                        cur.metadata.finalizers.retain(|f| f != binding::FINALIZER);
                        let mut changed = cur.metadata.finalizers.len() != before;
                        if cur.metadata.deletion_timestamp.is_none()
                            && orrery_api::interpret::shows_running(&cur, NO_POLICY_REASON)
                        {
                            cur.status = orrery_api::interpret::unplaced_status(
                                &cur,
                                NO_POLICY_REASON,
                                NO_POLICY_STATUS,
                            );
                            changed = true;
                        }
                        Ok(changed.then_some(cur))
                    })
                    .await;
                    match r {
                        Ok(_) | Err(StoreError::NotFound { .. }) => Ok(()),
                        Err(e) => Err((key, e.to_string())),
                    }
                }))
            }
        }
    }

    /// The binding spec a template and its policy call for; the scheduler's fields are kept.
    fn desired(
        &self,
        t: &Object,
        digest: &str,
        p: &PlacementPolicy,
        existing: Option<&Object>,
    ) -> BindingSpec {
        let interp = self.customized.interpreter(&self.interpreters, t);
        let v = serde_json::to_value(t).unwrap_or(Value::Null);
        let replicas = interp.replicas(&v);
        let requests = interp.requests(&v);
        let dependencies = if p.propagate_deps {
            interp
                .dependencies(&v)
                .into_iter()
                .map(|(kind, name)| Dependency {
                    api_version: DEPENDENCY_API_VERSION.to_string(),
                    kind,
                    namespace: t.namespace().to_string(),
                    name,
                })
                .collect()
        } else {
            vec![]
        };
        let old: Option<BindingSpec> = existing
            .and_then(|b| b.spec.clone())
            .and_then(|s| serde_json::from_value(s).ok());
        let same_content = existing
            .and_then(|b| b.metadata.annotations.get(DIGEST_ANNOTATION))
            .is_some_and(|d| d == digest || super::same_content(d, t));
        // A status-only change of the template keeps the recorded version, so the binding is
        // not rewritten for it.
        let resource_version = match (&old, same_content) {
            (Some(o), true) => o.resource.resource_version.clone(),
            _ => t.metadata.resource_version.clone(),
        };
        BindingSpec {
            resource: ObjectReference {
                api_version: t.api_version.clone(),
                kind: t.kind.clone(),
                namespace: t.namespace().to_string(),
                name: t.name().to_string(),
                uid: t.metadata.uid.clone(),
                resource_version,
            },
            replicas: replicas.unwrap_or(0),
            replica_requirements: (!requests.is_empty()).then_some(ReplicaRequirements {
                resource_request: requests,
            }),
            dependencies,
            placement: p.placement.clone(),
            target_clusters: p.targets.clone(),
            policy: p.reference.clone(),
            priority: p.priority,
            conflict_resolution: p.conflict_resolution,
            preserve_resources_on_deletion: p.preserve_resources_on_deletion,
            suspension: p.suspension.clone(),
            failover: p.failover.clone(),
            scheduler_name: p.scheduler_name.clone(),
            volumes: orrery_api::stateful::claims_of(&v),
            // Admission refuses bad annotations on the built-in kinds; on others they are
            // left out.
            data: orrery_api::data::of_parts(&t.kind, &t.metadata.annotations, t.spec.as_ref())
                .unwrap_or_default(),
            affinity_groups: p
                .placement
                .workload_affinity
                .as_ref()
                .map(|w| w.groups(&t.metadata.labels))
                .filter(|g| !g.is_empty()),
            // What the scheduler and the migration controller decided stays theirs.
            ..old
                .map(|o| BindingSpec {
                    clusters: o.clusters,
                    evictions: o.evictions,
                    migration: o.migration,
                    fenced: o.fenced,
                    transfers: o.transfers,
                    standby: o.standby,
                    ..Default::default()
                })
                .unwrap_or_default()
        }
    }
}

/// Whether the template carries the binding finalizer (it was placed before).
fn has_finalizer(t: &Object) -> bool {
    t.metadata
        .finalizers
        .iter()
        .any(|f| f == binding::FINALIZER)
}

/// The binding to write for a template: a new one, or the existing one with the new spec
/// and digest; `None` when the existing one says it all already.
fn binding_to_write(
    bns: &str,
    bname: &str,
    kind: &str,
    existing: Option<&Arc<Object>>,
    new_spec: Option<Value>,
    digest: String,
) -> Option<Object> {
    match existing {
        None => {
            let mut b = new_object(binding::API_VERSION, binding::KIND, Some(bns), bname);
            b.metadata.finalizers.push(binding::FINALIZER.to_string());
            b.metadata
                .annotations
                .insert(DIGEST_ANNOTATION.into(), digest);
            b.metadata
                .labels
                .insert("multicluster.io/template-kind".into(), kind.to_lowercase());
            b.spec = new_spec;
            Some(b)
        }
        Some(b) => {
            // (A digest an earlier version recorded, of the same content, is rewritten
            // once as the stable one: the spec is the same, so is the generation, and
            // nothing downstream moves.)
            if b.spec == new_spec && b.metadata.annotations.get(DIGEST_ANNOTATION) == Some(&digest)
            {
                None
            } else {
                let mut next = (**b).clone();
                next.spec = new_spec;
                next.metadata
                    .annotations
                    .insert(DIGEST_ANNOTATION.into(), digest);
                next.metadata.generation = Some(orrery_store::stamp::next_generation(b, &next));
                Some(next)
            }
        }
    }
}

/// What binding a template writes: its binding (`bkey`) and the template's finalizer.
struct Bind {
    key: TKey,
    bkey: String,
    tkey: String,
    t: Arc<Object>,
    /// The template whose no-policy Event goes first.
    forget: Option<Arc<Object>>,
    needs_finalizer: bool,
    write_binding: Option<Object>,
    creating: bool,
}

/// Writes a binding and the template's finalizer.
fn bind_job(store: Arc<dyn Store>, w: Bind) -> Job<TKey> {
    let Bind {
        key,
        bkey,
        tkey,
        t,
        forget,
        needs_finalizer,
        write_binding,
        creating,
    } = w;
    Box::pin(async move {
        let err = |e: StoreError| (key.clone(), e.to_string());
        if let Some(t) = forget
            && let Err(e) = crate::record::forget_once(store.as_ref(), &t, NO_POLICY_REASON).await
        {
            tracing::debug!(error = %e, "removing the no-policy event failed");
        }
        // Both writes at once: a failed one is retried, and the finalizer is in place
        // before any Work can have been applied (Works need the binding's decision first).
        let finalize = async {
            if !needs_finalizer {
                return Ok(());
            }
            // Read afresh: what this controller saw may be behind its own last write.
            let uid = t.metadata.uid.clone();
            orrery_store::update_with(store.as_ref(), &tkey, |mut cur| {
                if cur.metadata.uid != uid
                    || cur.metadata.deletion_timestamp.is_some()
                    || cur
                        .metadata
                        .finalizers
                        .iter()
                        .any(|f| f == binding::FINALIZER)
                {
                    return Ok(None);
                }
                cur.metadata.finalizers.push(binding::FINALIZER.to_string());
                Ok(Some(cur))
            })
            .await
            .map(|_| ())
        };
        let bind = async {
            match write_binding {
                None => Ok(()),
                Some(b) if creating => match store.create(&bkey, b).await {
                    Ok(_) | Err(StoreError::AlreadyExists { .. }) => Ok(()),
                    Err(e) => Err(e),
                },
                Some(b) => {
                    let rev = b.revision();
                    store.update(&bkey, b, rev).await.map(|_| ())
                }
            }
        };
        let (a, b) = tokio::join!(finalize, bind);
        a.map_err(err)?;
        b.map_err(err)?;
        Ok(())
    })
}

/// Whether a template's binding should go, read afresh from the store: the template is gone or
/// being deleted, or no placement policy places it any more.
async fn unbind_still_holds(
    store: &dyn Store,
    kinds: &dyn Kinds,
    k: &TKey,
    claimant: Option<PolicyRef>,
) -> Result<bool, StoreError> {
    let (api_version, kind, ns, name) = k;
    let Some(info) = kinds.resolve(api_version, kind) else {
        // A kind no longer served has no templates.
        return Ok(true);
    };
    let t = match store.get(&info.key(ns, name)).await {
        Ok(t) => t,
        Err(StoreError::NotFound { .. }) => return Ok(true),
        Err(e) => return Err(e),
    };
    if t.metadata.deletion_timestamp.is_some() {
        return Ok(true);
    }
    let mut policies = Vec::new();
    for (group, _, plural) in PLACEMENT_KINDS {
        let list = store
            .list(
                &keys::prefix(group, plural, None),
                &orrery_store::ListOptions::default(),
            )
            .await?;
        policies.extend(
            list.items
                .iter()
                .filter_map(|o| policy::from_object(o).ok()),
        );
    }
    Ok(policy::choose(policies.iter(), &t, claimant.as_ref()).is_none())
}

/// The policy a binding follows.
fn policy_of(b: &Object) -> Option<PolicyRef> {
    serde_json::from_value(b.spec.as_ref()?.get("policy")?.clone()).ok()
}

/// The template a binding is for.
/// The template a binding is for; none for a standalone task's binding, which this
/// controller neither makes nor removes.
fn template_of(b: &Object) -> Option<TKey> {
    let r = b.spec.as_ref()?.get("resource")?;
    let s = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    if binding::is_task(&s("apiVersion"), &s("kind")) {
        return None;
    }
    Some((s("apiVersion"), s("kind"), s("namespace"), s("name")))
}

/// Writes policy statuses in the order they were decided, off the detector's path (a round
/// must not wait for them). One writer: a count written late can never overwrite a newer one;
/// what queued up meanwhile is written together, each policy's latest only.
async fn write_reports(
    store: Arc<dyn Store>,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<(String, serde_json::Value)>,
) {
    while let Some(first) = rx.recv().await {
        let mut latest: BTreeMap<String, serde_json::Value> = BTreeMap::new();
        latest.insert(first.0, first.1);
        while let Ok((k, body)) = rx.try_recv() {
            latest.insert(k, body);
        }
        let writes = latest.into_iter().map(|(key, body)| {
            let store = store.clone();
            async move {
                let r = orrery_store::update_with(store.as_ref(), &key, |mut cur| {
                    if cur.status.as_ref().and_then(|s| s.get("boundResources"))
                        == body.get("boundResources")
                    {
                        return Ok(None);
                    }
                    cur.status = Some(body.clone());
                    Ok(Some(cur))
                })
                .await;
                if let Err(e) = r
                    && !e.is_not_found()
                {
                    tracing::debug!(policy = %key, error = %e, "writing a policy's status failed; retrying");
                }
            }
        });
        futures_util::future::join_all(writes).await;
    }
}
