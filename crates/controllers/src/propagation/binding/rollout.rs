//! The binding controller's part in rollouts (`placement.rollout`): the template's revisions
//! kept as ControllerRevisions, the plan's next `status.rollout`, the revision each cluster's
//! Work renders (from the stored status only), and the RolloutApprovals' status; and in
//! disruption budgets (`placement.disruptionBudget`): what a cluster giving replicas up keeps
//! until their replacements are ready.

use orrery_api::history::ScheduleEntry;
use orrery_api::rollout::{self as ro, RolloutStatus};

use super::*;
use crate::propagation::rollout::plan::{self, Controls, Running};

/// A cluster's load, as a rollout orders its clusters by.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct Level {
    /// The larger of its water level and its forecast peak.
    pub(super) level: Option<f64>,
    pub(super) peak_time: Option<Time>,
    /// Whether its Ready condition is True (what its members report is current).
    pub(super) ready: bool,
}

impl Level {
    /// Read in place from a Cluster's status (a heartbeat changes it; nothing is parsed whole).
    pub(super) fn of(c: &Object) -> Level {
        let s = c.status.as_ref();
        let num = |p: &str| s.and_then(|s| s.pointer(p)).and_then(Value::as_f64);
        let level = match (num("/waterLevel/overall"), num("/forecast/peak")) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        let peak_time = s
            .and_then(|s| s.pointer("/forecast/peakTime"))
            .and_then(Value::as_str)
            .and_then(|t| t.parse().ok());
        let ready = s
            .and_then(|s| s.get("conditions"))
            .and_then(Value::as_array)
            .is_some_and(|cs| {
                cs.iter().any(|c| {
                    c.get("type").and_then(Value::as_str) == Some("Ready")
                        && c.get("status").and_then(Value::as_str) == Some("True")
                })
            });
        Level {
            level,
            peak_time,
            ready,
        }
    }
}

/// The revisions a rollout binding's Works render: per cluster, the revision and, when it is
/// not the template's latest, the template as that revision held it. Clusters the stored
/// status has not decided yet are held (their Works stay as they are).
#[derive(Debug, Default)]
pub(super) struct Revisions {
    pub(super) per_cluster: BTreeMap<String, (i64, Option<Object>)>,
    pub(super) hold: BTreeSet<String>,
    /// What the choice is made of, for the rendering's fingerprint.
    pub(super) digest: u64,
}

/// What the rollout asks of this round.
pub(super) enum Prepared {
    /// No rollout: render as always (clearing a rollout status left from before).
    Off { clear: bool },
    /// A revision is stored first; nothing is rendered until it is seen.
    Wait(Vec<Job<BKey>>),
    Ready {
        revisions: Box<Revisions>,
        /// The status to write, when it changed.
        status: Option<Box<RolloutStatus>>,
        jobs: Vec<Job<BKey>>,
    },
}

impl Binder {
    /// A ControllerRevision changed: kept under its binding, which is marked.
    pub(super) fn take_revision_event(&mut self, ev: Event) {
        let put = |this: &mut Binder, o: Arc<Object>| {
            if let Some((n, b, _)) = ro::revision_of(&o) {
                let k = (o.namespace().to_string(), b.to_string());
                this.revisions
                    .entry(k.clone())
                    .or_default()
                    .retain(|_, r| r.name() != o.name());
                this.revisions.entry(k.clone()).or_default().insert(n, o);
                this.dirty.insert(k);
            }
        };
        match ev {
            Event::Listed(items) => {
                self.dirty.extend(self.revisions.keys().cloned());
                self.revisions.clear();
                for o in items {
                    put(self, o);
                }
            }
            Event::Upsert(o) => put(self, o),
            Event::Delete(o) => {
                if let Some((_, b, _)) = ro::revision_of(&o) {
                    let k = (o.namespace().to_string(), b.to_string());
                    if let Some(m) = self.revisions.get_mut(&k) {
                        m.retain(|_, r| r.name() != o.name());
                        if m.is_empty() {
                            self.revisions.remove(&k);
                        }
                    }
                    self.dirty.insert(k);
                }
            }
        }
    }

    /// A RolloutApproval changed: kept, and its binding marked.
    pub(super) fn take_approval_event(&mut self, ev: Event) {
        let binding_of = |o: &Object| {
            let b = o.spec.as_ref()?.get("binding")?.as_str()?;
            Some((o.namespace().to_string(), b.to_string()))
        };
        match ev {
            Event::Listed(items) => {
                for o in self.approvals.values() {
                    if let Some(k) = binding_of(o) {
                        self.dirty.insert(k);
                    }
                }
                self.approvals.clear();
                for o in items {
                    if let Some(k) = binding_of(&o) {
                        self.dirty.insert(k);
                    }
                    self.approvals
                        .insert((o.namespace().to_string(), o.name().to_string()), o);
                }
            }
            Event::Upsert(o) => {
                if let Some(k) = binding_of(&o) {
                    self.dirty.insert(k);
                }
                self.approvals
                    .insert((o.namespace().to_string(), o.name().to_string()), o);
            }
            Event::Delete(o) => {
                if let Some(k) = binding_of(&o) {
                    self.dirty.insert(k);
                }
                self.approvals
                    .remove(&(o.namespace().to_string(), o.name().to_string()));
            }
        }
    }

    /// The approvals naming binding `k`: objects and specs.
    fn approvals_of(&self, k: &BKey) -> Vec<(&Arc<Object>, ro::ApprovalSpec)> {
        self.approvals
            .iter()
            .filter(|((ns, _), _)| *ns == k.0)
            .filter_map(|(_, o)| {
                let s = ro::ApprovalSpec::deserialize(o.spec.as_ref()?).ok()?;
                (s.binding == k.1).then_some((o, s))
            })
            .collect()
    }

    /// Whether the binding's rollout is under way (the tick looks at it again).
    pub(super) fn rolling(b: &Object) -> bool {
        b.status
            .as_ref()
            .and_then(|s| s.pointer("/rollout/phase"))
            .and_then(Value::as_str)
            .is_some_and(|p| !matches!(p, "Complete" | "RolledBack" | "Aborted"))
    }

    /// The rollout's part of a round for a binding with its template.
    pub(super) fn prepare_rollout(
        &self,
        k: &BKey,
        b: &Arc<Object>,
        spec: &BindingSpec,
        t: &Object,
        interp: Interpreter<'_>,
        work_name: &str,
    ) -> Prepared {
        let old = BindingStatus::of(b).rollout;
        let Some(strategy) = spec.placement.rollout.as_ref() else {
            return Prepared::Off {
                clear: old.is_some(),
            };
        };
        let content = super::super::rollout::content_of(t, interp);
        let digest = ro::digest_of(&content);
        let empty = BTreeMap::new();
        let revs = self.revisions.get(k).unwrap_or(&empty);
        let newest = revs.iter().next_back();
        let latest = match newest {
            Some((n, r)) if ro::revision_of(r).is_some_and(|x| x.2 == digest) => *n,
            _ => return Prepared::Wait(vec![self.store_revision(k, b, revs, content, &digest)]),
        };
        let now = Time::now();
        let approved = self.approved(k);
        let ann = |a: &str| b.metadata.annotations.get(a).map(String::as_str);
        let controls = Controls {
            paused: ann(ro::PAUSED_ANNOTATION) == Some("true"),
            resume: ann(ro::RESUME_ANNOTATION),
            abort: ann(ro::ABORT_ANNOTATION),
            approved,
        };
        let no_labels = BTreeMap::new();
        let members: Vec<plan::Member<'_>> = spec
            .clusters
            .iter()
            .map(|tc| {
                let level = self.levels.get(&tc.name).copied().unwrap_or_default();
                let (w, current, ms) = self.member_status(&tc.name, work_name, t);
                let runs = match (w, current, ms) {
                    (Some(w), true, Some(m)) if m.applied => {
                        w.rollout_revision.map(|revision| Running {
                            revision,
                            healthy: health_of(
                                interp,
                                t,
                                m,
                                spec.divides_replicas().then_some(tc.replicas),
                            ) == Health::Healthy,
                            restarts: m.restarts,
                        })
                    }
                    _ => None,
                };
                plan::Member {
                    name: &tc.name,
                    labels: self
                        .clusters
                        .get(&tc.name)
                        .map_or(&no_labels, |m| &m.view.labels),
                    level: level.level,
                    peak_time: level.peak_time,
                    runs,
                }
            })
            .collect();
        let step = plan::step(strategy, old.as_ref(), latest, &members, &controls, now);
        let revisions = self.revisions_to_render(spec, old.as_ref(), latest, revs, t, interp);
        let mut jobs = Vec::new();
        let changed = old.as_ref() != Some(&step.status);
        if changed && !step.notes.is_empty() {
            jobs.push(self.note_job(k, spec, &step.status, &step.notes));
        }
        jobs.extend(self.prune_revisions(strategy, &step.status, revs));
        Prepared::Ready {
            revisions: Box::new(revisions),
            status: changed.then(|| Box::new(step.status)),
            jobs,
        }
    }

    /// The (revision, stage) pairs the binding's approvals grant.
    fn approved(&self, k: &BKey) -> BTreeSet<(i64, String)> {
        self.approvals_of(k)
            .into_iter()
            .map(|(_, s)| (s.revision, s.stage))
            .collect()
    }

    /// What each target renders, from the stored status: its decided revision (the
    /// template's latest renders from the template itself, so turning a rollout on rewrites
    /// no Work); a cluster not decided yet waits.
    fn revisions_to_render(
        &self,
        spec: &BindingSpec,
        old: Option<&RolloutStatus>,
        latest: i64,
        revs: &BTreeMap<i64, Arc<Object>>,
        t: &Object,
        interp: Interpreter<'_>,
    ) -> Revisions {
        let mut out = Revisions::default();
        let mut h = std::collections::hash_map::DefaultHasher::new();
        latest.hash(&mut h);
        let names = spec
            .clusters
            .iter()
            .map(|c| c.name.as_str())
            .chain(spec.fenced.iter().map(String::as_str));
        for name in names {
            let decided = match old {
                None => Some(latest),
                Some(st) => st.revision_of(name),
            };
            name.hash(&mut h);
            decided.hash(&mut h);
            match decided {
                Some(r) if r == latest => {
                    out.per_cluster.insert(name.to_string(), (r, None));
                }
                Some(r) => match revs
                    .get(&r)
                    .and_then(|o| super::super::rollout::template_at(o, t, interp))
                {
                    Some(old_t) => {
                        out.per_cluster.insert(name.to_string(), (r, Some(old_t)));
                    }
                    // Its revision is gone (deleted by hand): the cluster waits rather than
                    // take a revision no decision gave it.
                    None => {
                        out.hold.insert(name.to_string());
                    }
                },
                None => {
                    out.hold.insert(name.to_string());
                }
            }
        }
        out.digest = h.finish();
        out
    }

    /// Stores the template's content as the next revision (or renumbers the revision that
    /// holds it already, as Kubernetes does when a rollback returns to an old template).
    fn store_revision(
        &self,
        k: &BKey,
        b: &Arc<Object>,
        revs: &BTreeMap<i64, Arc<Object>>,
        content: Value,
        digest: &str,
    ) -> Job<BKey> {
        let next = revs.keys().next_back().copied().unwrap_or(0) + 1;
        let existing = revs
            .values()
            .find(|r| ro::revision_of(r).is_some_and(|x| x.2 == digest))
            .map(|r| r.name().to_string());
        let obj = ro::revision_object(b, next, content, digest);
        let store = self.store.clone();
        let key = k.clone();
        let ns = k.0.clone();
        Box::pin(async move {
            let err = |e: StoreError| (key.clone(), e.to_string());
            let rkey = keys::object("apps", "controllerrevisions", Some(&ns), obj.name());
            match existing {
                Some(_) => {
                    update_with(store.as_ref(), &rkey, |mut cur| {
                        if cur.other.get("revision").and_then(Value::as_i64) == Some(next) {
                            return Ok(None);
                        }
                        cur.other.insert("revision".into(), Value::from(next));
                        Ok(Some(cur))
                    })
                    .await
                    .map_err(err)?;
                }
                None => {
                    let mut o = obj;
                    orrery_store::stamp::stamp_new(&mut o.metadata);
                    match store.create(&rkey, o).await {
                        Ok(_) | Err(StoreError::AlreadyExists { .. }) => {}
                        Err(e) => return Err(err(e)),
                    }
                }
            }
            Ok(())
        })
    }

    /// Deletes the oldest revisions no cluster runs beyond the strategy's history limit.
    fn prune_revisions(
        &self,
        strategy: &ro::RolloutStrategy,
        st: &RolloutStatus,
        revs: &BTreeMap<i64, Arc<Object>>,
    ) -> Vec<Job<BKey>> {
        let in_use = |n: i64| {
            n == st.revision || n == st.stable || st.clusters.iter().any(|c| c.revision == n)
        };
        let old: Vec<&Arc<Object>> = revs
            .iter()
            .filter(|(n, _)| !in_use(**n))
            .map(|(_, o)| o)
            .collect();
        let over = old
            .len()
            .saturating_sub(strategy.history_limit().max(0) as usize);
        old.into_iter()
            .take(over)
            .map(|o| {
                let store = self.store.clone();
                let o = o.clone();
                let key = (o.namespace().to_string(), String::new());
                let job: Job<BKey> = Box::pin(async move {
                    let rkey =
                        keys::object("apps", "controllerrevisions", Some(o.namespace()), o.name());
                    match delete_object(store.as_ref(), &rkey, &o).await {
                        Ok(_)
                        | Err(StoreError::NotFound { .. })
                        | Err(StoreError::Conflict { .. }) => Ok(()),
                        Err(e) => Err((key, e.to_string())),
                    }
                });
                job
            })
            .collect()
    }

    /// Events on the template for what the rollout did (once each), each also an entry of the
    /// schedule history (when its Event was told now: a restart records nothing again).
    fn note_job(
        &self,
        k: &BKey,
        spec: &BindingSpec,
        st: &RolloutStatus,
        notes: &[plan::Note],
    ) -> Job<BKey> {
        let store = self.store.clone();
        let r = &spec.resource;
        let about = subject(&r.api_version, &r.kind, &r.namespace, &r.name, &r.uid);
        let notes = notes.to_vec();
        let history = self.history.clone();
        let entry = |n: &plan::Note| ScheduleEntry {
            id: format!("{}-r{}-{}", r.uid, st.revision, n.reason.to_lowercase()),
            time: Time::now(),
            binding: format!("{}/{}", k.0, k.1),
            resource: orrery_api::binding::ObjectReference {
                resource_version: String::new(),
                ..r.clone()
            },
            replicas: spec.replicas,
            trigger: "Rollout".to_string(),
            strategy: String::new(),
            fleet_level: 0.0,
            result: "Rollout".to_string(),
            message: n.message.clone(),
            clusters: spec.clusters.clone(),
            unplaced: 0,
            decisions: Vec::new(),
            filtered: BTreeMap::new(),
            prediction: String::new(),
            forecast: None,
            rollout: Some(orrery_api::history::RolloutStep {
                revision: st.revision,
                stage: n.stage.clone(),
                event: n.reason.to_string(),
            }),
        };
        let entries: Vec<ScheduleEntry> = notes.iter().map(entry).collect();
        Box::pin(async move {
            let mut told = Vec::new();
            for (n, e) in notes.into_iter().zip(entries) {
                let once = orrery_api::meta::short_hash(&format!(
                    "{}/{}/{}",
                    about.metadata.uid, n.reason, n.message
                ));
                let now = record::event_once_for(
                    store.as_ref(),
                    &about,
                    &once,
                    if n.warning { "Warning" } else { "Normal" },
                    n.reason,
                    &n.message,
                    COMPONENT,
                )
                .await;
                if matches!(now, Ok(true)) {
                    told.push(e);
                }
            }
            if let Some(h) = history {
                h.send(told);
            }
            Ok(())
        })
    }

    /// The Accepted condition of each approval naming `k` (the binding as seen, if any).
    pub(super) fn approval_jobs(&self, k: &BKey) -> Vec<Job<BKey>> {
        let b = self.bindings.get(k);
        let spec = self.specs.get(k);
        let st = b.and_then(|b| BindingStatus::of(b).rollout);
        let now = Time::now();
        self.approvals_of(k)
            .into_iter()
            .filter_map(|(o, a)| {
                let strategy = spec.and_then(|s| s.placement.rollout.as_ref());
                let stage = strategy.and_then(|s| s.stages.iter().find(|x| x.name == a.stage));
                let (ok, reason, message) = match (b, strategy, stage, &st) {
                    (None, ..) => (
                        false,
                        "NoBinding",
                        format!("no ResourceBinding {} in this namespace", a.binding),
                    ),
                    (_, None, ..) => (
                        false,
                        "NoRollout",
                        "its placement has no rollout".to_string(),
                    ),
                    (_, _, None, _) => (
                        false,
                        "NoSuchStage",
                        format!("its rollout has no stage {}", a.stage),
                    ),
                    (_, _, Some(s), _) if !s.approval => (
                        false,
                        "NoApprovalNeeded",
                        format!("stage {} needs no approval", a.stage),
                    ),
                    (_, _, _, Some(st)) if st.revision == a.revision => (
                        true,
                        "Approved",
                        format!("stage {} of revision {} may start", a.stage, a.revision),
                    ),
                    (_, _, _, st) => (
                        false,
                        "OtherRevision",
                        format!(
                            "revision {} is not rolling out (revision {} is)",
                            a.revision,
                            st.as_ref().map_or(0, |s| s.revision)
                        ),
                    ),
                };
                let cond = Condition::new(
                    ro::CONDITION_ACCEPTED,
                    if ok {
                        conditions::TRUE
                    } else {
                        conditions::FALSE
                    },
                    reason,
                    message,
                );
                let mut status =
                    ro::ApprovalStatus::deserialize(o.status.clone().unwrap_or(Value::Null))
                        .unwrap_or_default();
                if !conditions::set(&mut status.conditions, cond, now) {
                    return None;
                }
                let store = self.store.clone();
                let akey = orrery_api::kinds::ROLLOUT_APPROVAL.key(o.namespace(), o.name());
                let uid = o.metadata.uid.clone();
                let key = k.clone();
                let job: Job<BKey> = Box::pin(async move {
                    let status = serde_json::to_value(&status).ok();
                    let r = update_with(store.as_ref(), &akey, |mut cur| {
                        if cur.metadata.uid != uid || cur.status == status {
                            return Ok(None);
                        }
                        cur.status = status.clone();
                        Ok(Some(cur))
                    })
                    .await;
                    match r {
                        Ok(_) | Err(StoreError::NotFound { .. }) => Ok(()),
                        Err(e) => Err((key, e.to_string())),
                    }
                });
                Some(job)
            })
            .collect()
    }

    /// The spec to render under the placement's disruption budget: clusters giving replicas
    /// up keep what the budget does not let go yet (read from their Works, so a restart
    /// holds what was held). Also the budget's condition, and a digest of what is held.
    pub(super) fn apply_budget(
        &self,
        spec: &Arc<BindingSpec>,
        t: &Object,
        interp: Interpreter<'_>,
        work_name: &str,
        have: &[String],
    ) -> (Arc<BindingSpec>, Option<Condition>, u64) {
        let Some(budget) = spec.placement.disruption_budget.as_ref() else {
            return (spec.clone(), None, 0);
        };
        let cond = |status: &str, reason: &str, message: String| {
            Condition::new(ro::CONDITION_DISRUPTION_BUDGET, status, reason, message)
        };
        let template = serde_json::to_value(t).unwrap_or(Value::Null);
        let divided = spec.placement.divided();
        let whole = interp.replicas(&template).unwrap_or(0);
        let decided: BTreeMap<&str, i64> = spec
            .clusters
            .iter()
            .map(|c| (c.name.as_str(), if divided { c.replicas } else { whole }))
            .collect();
        let desired: i64 = decided.values().sum();
        let floor = budget.min_available(desired);
        if !orrery_api::stateful::claims_of(&template).is_empty() {
            // Its moves are Migrations, which stop the source (the fence) before the target
            // starts: nothing held here would keep a replica ready. The Migration holds its
            // fence instead, and says when it waits.
            let c = cond(
                conditions::TRUE,
                "FenceHeld",
                format!(
                    "a workload with volumes moves through Migrations: each stops its source \
                     only when at least {floor} replicas stay ready elsewhere (the Migration \
                     says when it waits)"
                ),
            );
            return (spec.clone(), Some(c), 0);
        }
        let (mut ready, mut reported, mut moves) = (0i64, false, Vec::new());
        for c in have {
            let Some(w) = self.works.get(&(c.clone(), work_name.to_string())) else {
                continue;
            };
            let (_, current, ms) = self.member_status(c, work_name, t);
            // A Deployment's status leaves readyReplicas out when none is ready; one that
            // says its observedGeneration has reported.
            let st = ms.and_then(|m| m.status.as_ref());
            let r = st
                .and_then(|s| s.get("readyReplicas"))
                .and_then(Value::as_i64);
            let said = st.is_some_and(|s| s.get("observedGeneration").is_some());
            let r = r.or(said.then_some(0));
            reported |= r.is_some();
            // A dark cluster's last report is no longer true; a report of an older Work may
            // count pods that Work no longer runs.
            let up = self.levels.get(c.as_str()).is_some_and(|l| l.ready);
            let r = if up { r.unwrap_or(0) } else { 0 };
            let r = if current {
                r
            } else {
                r.min(w.replicas.unwrap_or(0))
            };
            ready += r;
            if let Some(runs) = w.replicas {
                let decided = decided.get(c.as_str()).copied().unwrap_or(0);
                moves.push((c.clone(), runs, decided, r));
            }
        }
        // Clusters decided that run nothing yet: what they are to take comes on top.
        for (c, n) in &decided {
            if !moves.iter().any(|m| m.0 == *c) {
                moves.push((c.to_string(), 0, *n, 0));
            }
        }
        let held = ro::hold(floor, &moves);
        if !reported && !held.is_empty() {
            // Nothing to wait for would ever come: the move goes, and the binding says so.
            let c = cond(
                conditions::UNKNOWN,
                "NoReadyCount",
                "its members report no ready replicas for it: the budget cannot be kept".into(),
            );
            return (spec.clone(), Some(c), 0);
        }
        if held.is_empty() {
            let c = cond(
                conditions::TRUE,
                "WithinBudget",
                format!("{ready} replicas ready, at least {floor} stay so while it moves"),
            );
            return (spec.clone(), Some(c), 0);
        }
        let mut s = (**spec).clone();
        for (c, n) in &held {
            match s.clusters.iter_mut().find(|tc| tc.name == *c) {
                Some(tc) => tc.replicas = *n,
                None => s.clusters.push(orrery_api::binding::TargetCluster {
                    name: c.clone(),
                    replicas: *n,
                }),
            }
        }
        let keeps: Vec<String> = held.iter().map(|(c, n)| format!("{c} keeps {n}")).collect();
        let c = cond(
            conditions::FALSE,
            "MoveWaits",
            format!(
                "a move waits for the disruption budget ({ready} ready, at least {floor} must stay so): {}",
                keeps.join(", ")
            ),
        );
        let mut h = std::collections::hash_map::DefaultHasher::new();
        held.hash(&mut h);
        (Arc::new(s), Some(c), h.finish())
    }
}
