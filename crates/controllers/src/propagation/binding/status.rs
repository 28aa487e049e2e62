//! Status back from the members: per cluster into the binding's `aggregatedStatus`,
//! `locations` and `FullyApplied`, and into the template's own `status` (summed; a single
//! cluster's copied as it is).

use super::*;

impl Binder {
    /// A cluster's Work, whether its member's report is of the Work's current generation, and
    /// the template's entry in that report.
    pub(super) fn member_status(
        &self,
        cluster: &str,
        work_name: &str,
        t: &Object,
    ) -> (Option<&WorkView>, bool, Option<&ManifestStatus>) {
        let w = self
            .works
            .get(&(cluster.to_string(), work_name.to_string()));
        let ws: Option<&WorkStatus> = w.and_then(|w| w.status.as_ref());
        let current = match (w, ws) {
            (Some(w), Some(s)) => s.observed_generation == w.generation,
            _ => false,
        };
        let ms = ws.and_then(|s| {
            s.manifest_statuses.iter().find(|m| {
                m.identifier.kind == t.kind
                    && m.identifier.name == t.name()
                    && m.identifier.namespace == t.namespace()
            })
        });
        (w, current, ms)
    }

    /// Aggregates member status into the binding and the template.
    pub(super) fn status_jobs(&self, x: Subject<'_>, r: Rendering<'_>) -> Vec<Job<BKey>> {
        let t = x.template.obj.as_ref();
        let mut jobs: Vec<Job<BKey>> = Vec::new();
        let now = Time::now();
        let (items, reasons) = self.status_items(x, r);
        let cond = fully_applied(x.spec, &items, reasons, r.missing_deps);
        let locations = self.locations_of(x.spec, &items);
        if with_status(x.old, &cond, &items, &locations, r.extras, now).is_some() {
            jobs.push(self.binding_status_job(x, r, &cond, &items, &locations, now));
        }
        // The template's own status.
        if let Some(agg) = template_status(t, x.interp, x.spec, &items, &cond)
            && t.status.as_ref() != Some(&agg)
            && let Some(info) = self.kinds.resolve(&t.api_version, &t.kind)
        {
            let tkey = info.key(t.namespace(), t.name());
            jobs.push(self.template_status_job(x.k, x.template.obj.clone(), tkey, agg));
        }
        jobs
    }

    /// Each target cluster's aggregated item, and for those not applied, why (as
    /// `cluster: reason`).
    fn status_items(
        &self,
        x: Subject<'_>,
        r: Rendering<'_>,
    ) -> (Vec<AggregatedStatusItem>, Vec<String>) {
        let mut items = Vec::new();
        let mut reasons = Vec::new();
        for tc in &x.spec.clusters {
            let item = self.status_item(&tc.name, x, r);
            if !item.applied {
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
        (items, reasons)
    }

    /// One target cluster's aggregated item: what its member reports of the template, or why
    /// there is nothing (a rendering error, suspension, no Work or report yet, a Work-level
    /// failure).
    fn status_item(&self, cluster: &str, x: Subject<'_>, r: Rendering<'_>) -> AggregatedStatusItem {
        let t = x.template.obj.as_ref();
        let (w, current, ms) = self.member_status(cluster, r.work_name, t);
        let ws = w.and_then(|w| w.status.as_ref());
        let mut item = AggregatedStatusItem {
            cluster_name: cluster.to_string(),
            ..Default::default()
        };
        if let Some(m) = ms {
            item.applied = m.applied && current;
            let divided = x
                .spec
                .divides_replicas()
                .then(|| x.spec.clusters.iter().find(|c| c.name == cluster))
                .flatten()
                .map(|c| c.replicas);
            item.health = health_of(x.interp, t, m, divided);
            // The template generation the member runs: its Work's, once applied as it is.
            let rendered =
                (current && !r.writing.contains(cluster) && !r.errors.contains_key(cluster))
                    .then(
                        || match r.revisions.and_then(|v| v.per_cluster.get(cluster)) {
                            Some((_, Some(old))) => old.metadata.generation,
                            _ => t.metadata.generation,
                        },
                    )
                    .flatten();
            item.status = reflected(x.interp, t, m, rendered);
            item.message = m.message.clone();
            item.volumes = m.volumes.clone();
        }
        if let Some(e) = r.errors.get(cluster) {
            item.applied = false;
            item.message = e.clone();
        } else if x.spec.suspension.holds(cluster) {
            item.message = "dispatching is suspended".into();
        } else if ms.is_none() {
            item.message = if w.is_none() && !r.writing.contains(cluster) {
                "the Work is not created yet".into()
            } else {
                "the member has not reported yet".into()
            };
        }
        // Work-level failures (a conflict, a refused manifest) explain an unapplied item.
        if !item.applied
            && item.message.is_empty()
            && let Some(c) = ws
                .and_then(|s| conditions::find(&s.conditions, orrery_api::work::CONDITION_APPLIED))
        {
            item.message = c.message.clone();
        }
        item
    }

    /// The binding's replicas by location (the city its clusters' labels name).
    fn locations_of(
        &self,
        spec: &BindingSpec,
        items: &[AggregatedStatusItem],
    ) -> Vec<orrery_api::location::LocationReplicas> {
        let targets: Vec<(String, i64)> = spec
            .clusters
            .iter()
            .map(|t| (t.name.clone(), t.replicas))
            .collect();
        orrery_api::location::by_location(&targets, items, |c| {
            self.clusters
                .get(c)
                .and_then(|s| orrery_api::location::city_of(&s.view.labels))
                .map(str::to_string)
        })
    }

    /// Writes the binding's status (and, for trouble newly seen, a Warning Event on the
    /// template).
    fn binding_status_job(
        &self,
        x: Subject<'_>,
        r: Rendering<'_>,
        cond: &Condition,
        items: &[AggregatedStatusItem],
        locations: &[orrery_api::location::LocationReplicas],
        now: Time,
    ) -> Job<BKey> {
        let (k, spec, old) = (x.k, x.spec, x.old);
        let store = self.store.clone();
        let key = k.clone();
        let bkey = keys::well_known::binding(&k.0, &k.1);
        // Events for what a person must look at: an error in some cluster. (Placement
        // has its own Event; a normal rollout needs none per binding.)
        let trouble = !r.errors.is_empty()
            || items
                .iter()
                .any(|i| !i.applied && i.message.contains("conflict"));
        let announce = trouble
            && conditions::find(&old.conditions, CONDITION_FULLY_APPLIED)
                .map(|c| c.message.clone())
                != Some(cond.message.clone());
        let res = spec.resource.clone();
        let cond = cond.clone();
        let items = items.to_vec();
        let locations = locations.to_vec();
        let extras = r.extras.clone();
        let seen = x.b.clone();
        let log = self.written.clone();
        Box::pin(async move {
            // The status as computed against the stored one: health times carried over,
            // nothing written when nothing but times would change.
            let next = |cur: &Object| -> Option<Object> {
                if cur.metadata.deletion_timestamp.is_some() {
                    return None;
                }
                let st = with_status(
                    &BindingStatus::of(cur),
                    &cond,
                    &items,
                    &locations,
                    &extras,
                    now,
                )?;
                Some(Object {
                    api_version: cur.api_version.clone(),
                    kind: cur.kind.clone(),
                    metadata: cur.metadata.clone(),
                    spec: cur.spec.clone(),
                    status: serde_json::to_value(&st).ok(),
                    other: cur.other.clone(),
                })
            };
            // The binding as this controller saw it is usually current: write over it,
            // and read afresh only when someone wrote in between.
            let stored = match next(&seen) {
                None => None,
                Some(o) => match store.update(&bkey, o, seen.revision()).await {
                    Ok(stored) => Some(stored),
                    Err(StoreError::Conflict { .. }) => {
                        let r = update_with(store.as_ref(), &bkey, |cur| Ok(next(&cur))).await;
                        match r {
                            Ok(stored) => Some(stored),
                            Err(StoreError::NotFound { .. }) => None,
                            Err(e) => return Err((key.clone(), e.to_string())),
                        }
                    }
                    Err(e) => return Err((key.clone(), e.to_string())),
                },
            };
            if let Some(stored) = stored {
                log_written(&log, Written::Binding(key.clone(), stored));
            }
            if announce {
                let about = subject(
                    &res.api_version,
                    &res.kind,
                    &res.namespace,
                    &res.name,
                    &res.uid,
                );
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
        })
    }

    /// Writes the template's status `agg` over the version this controller has (`seen`).
    fn template_status_job(
        &self,
        k: &BKey,
        seen: Arc<Object>,
        tkey: String,
        agg: Value,
    ) -> Job<BKey> {
        let store = self.store.clone();
        let key = k.clone();
        let log = self.written.clone();
        Box::pin(async move {
            let uid = seen.metadata.uid.clone();
            let next = |cur: &Object| -> Option<Object> {
                if cur.metadata.uid != uid || cur.status.as_ref() == Some(&agg) {
                    return None;
                }
                let mut o = Object {
                    api_version: cur.api_version.clone(),
                    kind: cur.kind.clone(),
                    metadata: cur.metadata.clone(),
                    spec: cur.spec.clone(),
                    status: None,
                    other: cur.other.clone(),
                };
                o.status = Some(agg.clone());
                Some(o)
            };
            // Over the version this controller has, read afresh only on a conflict.
            let r = match next(&seen) {
                None => return Ok(()),
                Some(o) => match store.update(&tkey, o, seen.revision()).await {
                    Err(StoreError::Conflict { .. }) => {
                        update_with(store.as_ref(), &tkey, |cur| Ok(next(&cur))).await
                    }
                    other => other,
                },
            };
            match r {
                Ok(stored) => {
                    log_written(&log, Written::Template(tkey, stored));
                    Ok(())
                }
                Err(StoreError::NotFound { .. }) => Ok(()),
                Err(e) => Err((key, e.to_string())),
            }
        })
    }
}

/// The binding's `FullyApplied`: true when every target applied it and no dependency is
/// missing; else why not (`reasons`, the unapplied targets', then the missing dependencies).
fn fully_applied(
    spec: &BindingSpec,
    items: &[AggregatedStatusItem],
    mut reasons: Vec<String>,
    missing_deps: &[String],
) -> Condition {
    let all_applied = !spec.clusters.is_empty() && items.iter().all(|i| i.applied);
    if !missing_deps.is_empty() {
        reasons.push(format!("missing dependencies: {}", missing_deps.join(", ")));
    }
    if all_applied && missing_deps.is_empty() {
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
    }
}

/// The template's own status: its members' statuses aggregated (or, placed nowhere, what
/// says it no longer runs), with the template's generation observed once it is fully applied.
fn template_status(
    t: &Object,
    interp: Interpreter<'_>,
    spec: &BindingSpec,
    items: &[AggregatedStatusItem],
    cond: &Condition,
) -> Option<Value> {
    let parts: Vec<(&str, &Value)> = items
        .iter()
        .filter_map(|i| Some((i.cluster_name.as_str(), i.status.as_ref()?)))
        .collect();
    // A customization's AggregateStatus first; placed in no cluster (nothing feasible, or
    // the placement emptied): what its members said before no longer runs anywhere.
    let scripted = interp.scripts().and_then(|s| {
        let desired = serde_json::to_value(t).ok()?;
        let out = s.aggregate(&desired, &karmada_items(items))?;
        Some(
            out.get("status")
                .cloned()
                .unwrap_or(Value::Object(Default::default())),
        )
    });
    let mut agg = scripted
        .or_else(|| interp.aggregate(&t.kind, &parts))
        .or_else(|| {
            (parts.is_empty()
                && spec.clusters.is_empty()
                && !spec.resource.is_task()
                && orrery_api::interpret::shows_running(t, NOT_SCHEDULED))
            .then(|| {
                orrery_api::interpret::unplaced_status(
                    t,
                    NOT_SCHEDULED,
                    "placed in no cluster: see its ResourceBinding's Scheduled condition",
                )
            })
            .flatten()
        })?;
    if cond.is_true()
        && let (Some(m), Some(g)) = (agg.as_object_mut(), t.metadata.generation)
        && (m.contains_key("observedGeneration") || parts.len() > 1)
    {
        // The members run the current spec: in the control plane's terms, the
        // template's generation is observed.
        m.insert("observedGeneration".into(), Value::from(g));
    }
    Some(agg)
}

/// A member's report of the template's status, through the customization's ReflectStatus
/// when it has one (the script sees the template with that status, the member's generation
/// and, where known, Karmada's annotation of the template generation it runs).
fn reflected(
    interp: Interpreter<'_>,
    t: &Object,
    m: &ManifestStatus,
    rendered: Option<i64>,
) -> Option<Value> {
    let status = m.status.as_ref()?;
    let Some(s) = interp.scripts() else {
        return Some(status.clone());
    };
    let mut observed = member_object(t, Some(m), rendered);
    if let Some(o) = observed.as_object_mut() {
        o.insert("status".into(), status.clone());
    }
    Some(s.reflect(&observed).unwrap_or_else(|| status.clone()))
}

/// The items as Karmada's `AggregatedStatusItem`s (what AggregateStatus scripts read).
fn karmada_items(items: &[AggregatedStatusItem]) -> Vec<Value> {
    items
        .iter()
        .map(|i| {
            let mut m = serde_json::Map::new();
            m.insert("clusterName".into(), Value::from(i.cluster_name.clone()));
            if let Some(s) = &i.status {
                m.insert("status".into(), s.clone());
            }
            if i.applied {
                m.insert("applied".into(), Value::Bool(true));
            }
            if !i.message.is_empty() && !i.applied {
                m.insert("appliedMessage".into(), Value::from(i.message.clone()));
            }
            // Karmada has no Progressing: not healthy yet is unhealthy to it.
            let health = match i.health {
                Health::Healthy => "Healthy",
                Health::Unhealthy | Health::Progressing => "Unhealthy",
                Health::Unknown => "Unknown",
            };
            m.insert("health".into(), Value::from(health));
            Value::Object(m)
        })
        .collect()
}

/// The reason a template's status gives when its binding places it nowhere.
const NOT_SCHEDULED: &str = "NotScheduled";

/// The binding whose status is aggregated, and what it is read with.
#[derive(Clone, Copy)]
pub(super) struct Subject<'a> {
    pub(super) k: &'a BKey,
    pub(super) b: &'a Arc<Object>,
    /// Its status as this controller saw it.
    pub(super) old: &'a BindingStatus,
    pub(super) spec: &'a BindingSpec,
    pub(super) template: &'a Template,
    pub(super) interp: Interpreter<'a>,
}

/// What a binding's rendering came to, for its status.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rendering<'a> {
    /// Clusters whose rendering failed, and why.
    pub(super) errors: &'a BTreeMap<String, String>,
    pub(super) missing_deps: &'a [String],
    /// Clusters whose Works this round writes.
    pub(super) writing: &'a BTreeSet<String>,
    pub(super) work_name: &'a str,
    /// What becomes of `status.rollout` and the budget's condition.
    pub(super) extras: &'a Extras,
    /// Under a rollout, the revision each cluster renders.
    pub(super) revisions: Option<&'a Revisions>,
}

/// What a status write sets beside the members' reports.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Extras {
    pub(super) rollout: RolloutWrite,
    /// The disruption budget's condition (`None`: the placement has no budget).
    pub(super) budget: Option<Condition>,
}

/// What a status write does with `status.rollout`.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum RolloutWrite {
    Keep,
    Set(orrery_api::rollout::RolloutStatus),
    /// The placement no longer rolls out.
    Clear,
}

impl From<bool> for RolloutWrite {
    /// `true`: cleared.
    fn from(clear: bool) -> Self {
        if clear {
            RolloutWrite::Clear
        } else {
            RolloutWrite::Keep
        }
    }
}

/// `old` with the `FullyApplied` condition and the aggregated items set, health times carried
/// over from `old` where the health is the same; `None` when that changes nothing but times.
pub(super) fn with_status(
    old: &BindingStatus,
    cond: &Condition,
    items: &[AggregatedStatusItem],
    locations: &[orrery_api::location::LocationReplicas],
    extras: &Extras,
    now: Time,
) -> Option<BindingStatus> {
    let mut st = old.clone();
    match &extras.budget {
        Some(c) => {
            conditions::set(&mut st.conditions, c.clone(), now);
        }
        None => st
            .conditions
            .retain(|c| c.type_ != orrery_api::rollout::CONDITION_DISRUPTION_BUDGET),
    }
    match &extras.rollout {
        RolloutWrite::Keep => {}
        RolloutWrite::Set(r) => st.rollout = Some(r.clone()),
        RolloutWrite::Clear => st.rollout = None,
    }
    conditions::set(&mut st.conditions, cond.clone(), now);
    st.locations = locations.to_vec();
    st.aggregated_status = items
        .iter()
        .map(|i| {
            let mut i = i.clone();
            let prev = old
                .aggregated_status
                .iter()
                .find(|a| a.cluster_name == i.cluster_name);
            i.health_since = match prev {
                Some(p) if p.health == i.health => p.health_since.or(Some(now)),
                _ => Some(now),
            };
            i
        })
        .collect();
    (st != *old).then_some(st)
}
