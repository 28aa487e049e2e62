//! Moves of stateful workloads: a decision that takes one off a cluster starts a Migration
//! that carries its data; users' Migrations get their target; standbys are chosen.

use super::*;

/// How long after a failed migration the scheduler waits before it moves the workload again.
pub(super) const MOVE_RETRY: i64 = 300;

/// A job that ends a Migration as Failed, with why.
pub(super) fn fail_migration(store: Arc<dyn Store>, m: Arc<Object>, msg: String) -> Job<BKey> {
    let key = (m.namespace().to_string(), m.name().to_string());
    Box::pin(async move {
        let mkey = keys::well_known::migration(&key.0, &key.1);
        let uid = m.metadata.uid.clone();
        orrery_store::update_with(store.as_ref(), &mkey, |mut cur| {
            if cur.metadata.uid != uid {
                return Ok(None);
            }
            let mut st = orrery_api::stateful::MigrationStatus::of(&cur);
            if st.phase.is_done() {
                return Ok(None);
            }
            let now = Time::now();
            st.phase = orrery_api::stateful::MigrationPhase::Failed;
            st.message = msg.clone();
            st.completion_time = Some(now);
            conditions::set(
                &mut st.conditions,
                Condition::new("Succeeded", conditions::FALSE, "Refused", msg.clone()),
                now,
            );
            cur.status = serde_json::to_value(st).ok();
            Ok(Some(cur))
        })
        .await
        .map(|_| ())
        .map_err(|e| (key, e.to_string()))
    })
}

impl Scheduler {
    /// A user's Migration: the source it leaves, and the target Orrery picks (among its
    /// `targetClusters`, when it names some).
    pub(super) fn user_move(&mut self, k: &BKey, b: &Arc<Object>, m: &Arc<Object>) -> Outcome {
        let spec = BindingSpec::of(b);
        let Ok(ms) = orrery_api::stateful::migration_spec(m.spec.as_ref()) else {
            return Outcome::Skip;
        };
        let what = format!("{} {}", ms.resource.kind, ms.resource.name);
        let fail = |msg: String| -> Outcome {
            Outcome::Write(fail_migration(self.store.clone(), m.clone(), msg))
        };
        let Some(spec) = spec else {
            return fail(format!(
                "{what} has no ResourceBinding: no policy places it"
            ));
        };
        if spec.resource.kind != ms.resource.kind
            || spec.resource.api_version != ms.resource.api_version
        {
            return fail(format!("the ResourceBinding {} is not of {what}", k.1));
        }
        if !spec.is_stateful() {
            return fail(format!(
                "{what} owns no persistent volumes: there is no data to move (change its placement to move it)"
            ));
        }
        let other = crate::propagation::stateful::Graph::named(b)
            .filter(|n| *n != m.name())
            .map(|n| (n, self.graph.migrations.get(&(k.0.clone(), n.to_string()))));
        if let Some((other, state)) = other
            && state.is_none_or(|o| !o.phase.is_done())
        {
            // A move that only cleans up is as good as done: this one waits for it (its end
            // wakes the binding again).
            if state.is_some_and(|o| o.phase == orrery_api::stateful::MigrationPhase::Cleaning) {
                return Outcome::Skip;
            }
            return fail(format!(
                "{what} is being moved already (by migration {other})"
            ));
        }
        let placed: Vec<&TargetCluster> = spec.clusters.iter().filter(|c| c.replicas > 0).collect();
        let source = if ms.source_cluster.is_empty() {
            match placed.as_slice() {
                [one] => (*one).clone(),
                [] => return fail(format!("{what} runs in no cluster yet")),
                many => {
                    let names: Vec<&str> = many.iter().map(|c| c.name.as_str()).collect();
                    return fail(format!(
                        "{what} runs in {}: say which to leave in spec.sourceCluster",
                        names.join(", ")
                    ));
                }
            }
        } else {
            match placed.iter().find(|c| c.name == ms.source_cluster) {
                Some(c) => (*c).clone(),
                None => {
                    return fail(format!(
                        "{what} does not run in {} (it runs in {})",
                        ms.source_cluster,
                        placed
                            .iter()
                            .map(|c| c.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ));
                }
            }
        };
        let mut ties = crate::propagation::stateful::ties(
            &self.graph,
            &self.bindings,
            &self.datasets,
            k,
            &spec,
        );
        if !ms.target_clusters.is_empty() {
            let why = format!(
                "not among the Migration's targetClusters ({})",
                ms.target_clusters.join(", ")
            );
            ties.within = Some(match ties.within.take() {
                Some((w, r)) => (
                    w.into_iter()
                        .filter(|c| ms.target_clusters.contains(c))
                        .collect(),
                    format!("{r}, and {why}"),
                ),
                None => (ms.target_clusters.clone(), why),
            });
        }
        let request = spec
            .replica_requirements
            .as_ref()
            .map(|r| r.resource_request.clone())
            .unwrap_or_default();
        let mut evicted: Vec<String> = spec
            .evictions
            .iter()
            .filter(|e| !e.rescheduled)
            .map(|e| e.cluster.clone())
            .collect();
        evicted.push(source.name.clone());
        let kind = spec.resource.kind.clone();
        let task = Task {
            api_version: &spec.resource.api_version,
            kind: &kind,
            replicas: spec.replicas,
            divisible: spec.replicas > 0 || orrery_api::interpret::has_divisible_replicas(&kind),
            request: &request,
            placement: &spec.placement,
            targets: &spec.target_clusters,
            priority: spec.priority,
            previous: &spec.clusters,
            evicted: &evicted,
            shed: &[],
            shed_ahead: &[],
            mode: Mode::Steady,
            now: Time::now().unix_seconds(),
            seed: seed_of(&b.metadata.uid),
            relations: ties.relations(),
            components: &[],
            quota_room: &[],
        };
        let decision = schedule_cached(&self.fleet, &task, &self.engine, &mut self.filter_cache);
        self.start_move(
            k,
            b,
            &spec,
            &task,
            &decision,
            &ties,
            &source,
            Trigger::UserMove,
            Some(m.clone()),
        )
    }

    /// Moves a stateful workload's replicas off `source` with their data: picks the target
    /// (copy time over the path, latency to what it depends on, water level), records the
    /// decision, and starts (or, for a user's Migration, completes) the Migration that
    /// carries it out. The placement stays as it is until the migration switches it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn start_move(
        &mut self,
        k: &BKey,
        b: &Arc<Object>,
        spec: &BindingSpec,
        task: &Task<'_>,
        decision: &Decision,
        ties: &crate::propagation::stateful::Ties,
        source: &TargetCluster,
        why: Trigger,
        user: Option<Arc<Object>>,
    ) -> Outcome {
        let now = Time::now();
        if user.is_none() && self.failed_lately(k, now) {
            // Tried and failed lately: the workload stays where it is for a while.
            return Outcome::Unschedulable(None);
        }
        let (ranking, bytes) = self.rank_targets(b, spec, task, decision, ties, source);
        let reason = self.move_reason(source, why, user.is_some());
        let estimate = orrery_api::stateful::Estimate {
            bytes,
            bandwidth: ranking.bandwidth,
            seconds: ranking.seconds,
            candidates: ranking.candidates.clone(),
        };
        let what = format!("{} {}", spec.resource.kind, spec.resource.name);
        // A lost source fails over to its standby copy, if it keeps one that can take it.
        let lost = self.fleet.get(&source.name).is_none_or(|c| !serving(c));
        let standby_fits = ranking
            .candidates
            .iter()
            .any(|c| c.cluster == spec.standby && c.score.is_some());
        let chosen = if lost && standby_fits {
            Some(spec.standby.clone())
        } else {
            ranking.chosen.clone()
        };
        let Some(target) = chosen else {
            let first = ranking
                .candidates
                .iter()
                .take(3)
                .map(|c| format!("{}: {}", c.cluster, c.reason))
                .collect::<Vec<_>>()
                .join("; ");
            let msg = format!(
                "cannot move {} replica(s) of {what} off {} with their data: no cluster can take them ({first})",
                source.replicas, source.name
            );
            if let Some(m) = user {
                return Outcome::Write(fail_migration(self.store.clone(), m, msg));
            }
            return Outcome::Unschedulable(Some(self.write_condition(k, b, "MoveBlocked", msg)));
        };
        let message = format!(
            "moving {} replica(s) of {what} from {} to {target} with their data ({} bytes, about {:.0}s at {} bytes/s; {})",
            source.replicas, source.name, bytes, ranking.seconds, ranking.bandwidth, reason
        );
        let migration = match &user {
            Some(m) => user_migration_started(m, k, source, &target, estimate, &message, now),
            None => crate::propagation::stateful::new_migration(
                &k.0,
                &spec.resource,
                &k.1,
                &source.name,
                &target,
                source.replicas,
                reason,
                estimate,
                message.clone(),
            ),
        };
        let mname = migration.name().to_string();
        let planned = self.hold_target(k, spec, task, source, &target);
        let bkey_str = format!("{}/{}", k.0, k.1);
        self.seq += 1;
        let task_id = format!("{}-{}", b.metadata.uid, self.seq);
        let (summary, filtered) =
            decision.summary(&self.fleet, task, &self.engine, history::MAX_EXPLAINED);
        self.history.push((
            k.clone(),
            ScheduleEntry {
                id: task_id.clone(),
                time: now,
                binding: bkey_str,
                resource: binding::ObjectReference {
                    resource_version: String::new(),
                    ..spec.resource.clone()
                },
                replicas: spec.replicas,
                trigger: why.as_str().to_string(),
                strategy: "Migration".to_string(),
                fleet_level: (decision.fleet_level * 1000.0).round() / 1000.0,
                result: "Migrating".to_string(),
                message: format!("{message}; migration {mname}"),
                clusters: planned,
                unplaced: 0,
                decisions: summary.clone(),
                filtered: filtered.clone(),
                prediction: decision.prediction(&self.fleet, task, &self.engine),
                forecast: self
                    .forecast_moves
                    .remove(k)
                    .filter(|_| why == Trigger::Forecast),
                rollout: None,
            },
        ));
        let mut next_spec = spec.clone();
        next_spec.migration = mname.clone();
        let mut st = BindingStatus::of(b);
        let cond = Condition::new(
            CONDITION_SCHEDULED,
            conditions::TRUE,
            "Migrating",
            format!("{message}; migration {mname}"),
        );
        conditions::set(&mut st.conditions, cond, now);
        st.decisions = summary;
        st.filtered = filtered;
        st.task_id = task_id;
        st.scheduler_observed_generation = b.metadata.generation.or(Some(1));
        Outcome::Write(move_write(
            self.store.clone(),
            k,
            b.clone(),
            next_spec,
            st,
            migration,
            user.is_none(),
            message,
        ))
    }

    /// The target's room is held from now on (the move will need it): the placement as it
    /// will be once the move is over, assumed.
    fn hold_target(
        &mut self,
        k: &BKey,
        spec: &BindingSpec,
        task: &Task<'_>,
        source: &TargetCluster,
        target: &str,
    ) -> Vec<TargetCluster> {
        let mut planned: Vec<TargetCluster> = spec
            .clusters
            .iter()
            .filter(|c| c.name != source.name)
            .cloned()
            .collect();
        planned.push(TargetCluster {
            name: target.to_string(),
            replicas: source.replicas,
        });
        planned.sort_by(|a, b| a.name.cmp(&b.name));
        let changed = self.assume.assume(
            &format!("{}/{}", k.0, k.1),
            demand_of(task.request),
            &spec.clusters,
            &planned,
            orrery_api::interpret::counts_pods(&spec.resource.kind),
            self.now_ms(),
        );
        self.refresh_assumed(&changed);
        planned
    }

    /// Whether a move of the binding failed lately (it then stays where it is a while).
    fn failed_lately(&self, k: &BKey, now: Time) -> bool {
        self.graph.migrations.iter().any(|((ns, _), m)| {
            *ns == k.0
                && m.binding == k.1
                && m.phase == orrery_api::stateful::MigrationPhase::Failed
                && m.ended.is_some_and(|e| now.unix_seconds() - e < MOVE_RETRY)
        })
    }

    /// The clusters a move of `source`'s replicas could go to, best first, and how many bytes
    /// of data go with them.
    fn rank_targets(
        &self,
        b: &Object,
        spec: &BindingSpec,
        task: &Task<'_>,
        decision: &Decision,
        ties: &crate::propagation::stateful::Ties,
        source: &TargetCluster,
    ) -> (orrery_scheduler::moves::Ranking, i64) {
        let explained = decision.explain(&self.fleet, task, &self.engine);
        let mut feasible = Vec::new();
        let mut turned = Vec::new();
        for (i, c) in explained.iter().enumerate() {
            // What moves goes to one cluster whole: spreading and sampling do not apply.
            if c.filter.is_empty() || c.filter == "SpreadConstraint" || c.filter == "Sample" {
                feasible.push(i);
            } else {
                turned.push((i, c.reason.clone()));
            }
        }
        let status = BindingStatus::of(b);
        let bytes: i64 = status
            .aggregated_status
            .iter()
            .filter(|a| a.cluster_name == source.name)
            .flat_map(|a| &a.volumes)
            .filter(|v| v.ordinal.is_none_or(|o| o < source.replicas))
            .map(|v| v.used_bytes)
            .sum();
        let limit = spec
            .placement
            .water_level_limit
            .unwrap_or(self.engine.water_level_limit);
        let ranking = orrery_scheduler::moves::rank(
            &self.fleet,
            &feasible,
            &turned,
            &orrery_scheduler::moves::MoveRequest {
                source: &source.name,
                replicas: source.replicas,
                demand: demand_of(task.request),
                bytes,
                near: &ties.near,
                limit,
                // Judged ahead as the placement judges clusters.
                ahead: spec
                    .placement
                    .prediction
                    .as_ref()
                    .map_or(self.engine.prediction, |p| {
                        p.resolve(self.engine.prediction)
                    }),
                now: task.now,
                mark: self.engine.shed_mark.max(limit),
            },
        );
        (ranking, bytes)
    }

    /// Why a move starts, as its Migration says.
    fn move_reason(&self, source: &TargetCluster, why: Trigger, user: bool) -> &'static str {
        use orrery_api::stateful::reason;
        let src = self.fleet.get(&source.name);
        if user {
            reason::USER
        } else if src.is_none_or(|c| !serving(c)) {
            reason::CLUSTER_FAILOVER
        } else if why == Trigger::Failover {
            reason::APPLICATION_FAILOVER
        } else if matches!(why, Trigger::Shed | Trigger::Forecast) {
            reason::SHED
        } else if src.is_some_and(|c| c.taints.iter().any(|t| t.effect.as_str() == "NoExecute")) {
            reason::DRAIN
        } else {
            reason::POLICY_CHANGE
        }
    }

    /// Where a stateful workload placed in one cluster keeps its standby copy
    /// (`placement.stateful.standby`): the one it has while that still serves and passes the
    /// workload's filters, else the cluster its data would reach soonest (as a move's
    /// target is chosen). Empty when it keeps none.
    pub(super) fn choose_standby(
        &self,
        spec: &BindingSpec,
        task: &Task<'_>,
        decision: &Decision,
        placed: &[TargetCluster],
        ties: &crate::propagation::stateful::Ties,
    ) -> String {
        let wants = spec.is_stateful()
            && spec
                .placement
                .stateful
                .as_ref()
                .is_some_and(|s| s.standby.is_some());
        let mut running = placed.iter().filter(|c| c.replicas > 0);
        let (Some(source), None) = (running.next(), running.next()) else {
            return String::new();
        };
        if !wants {
            return String::new();
        }
        let explained = decision.explain(&self.fleet, task, &self.engine);
        let passes = |i: usize| {
            let f = &explained[i].filter;
            f.is_empty() || f == "SpreadConstraint" || f == "Sample"
        };
        if !spec.standby.is_empty()
            && spec.standby != source.name
            && let Some(i) = self.fleet.position(&spec.standby)
            && serving(&self.fleet.clusters()[i])
            && passes(i)
        {
            return spec.standby.clone();
        }
        let feasible: Vec<usize> = (0..explained.len())
            .filter(|i| passes(*i) && serving(&self.fleet.clusters()[*i]))
            .collect();
        let ranking = orrery_scheduler::moves::rank(
            &self.fleet,
            &feasible,
            &[],
            &orrery_scheduler::moves::MoveRequest {
                source: &source.name,
                // A standby runs no pods: only its volumes need room.
                replicas: 0,
                demand: [0.0; 5],
                bytes: 0,
                near: &ties.near,
                limit: 1.0,
                ahead: self.engine.prediction,
                now: Time::now().unix_seconds(),
                mark: 1.0,
            },
        );
        ranking.chosen.unwrap_or_default()
    }
}

/// A user's Migration once its move starts: its source, target and estimate.
fn user_migration_started(
    m: &Object,
    k: &BKey,
    source: &TargetCluster,
    target: &str,
    estimate: orrery_api::stateful::Estimate,
    message: &str,
    now: Time,
) -> Object {
    let mut next = m.clone();
    let mut st = orrery_api::stateful::MigrationStatus::of(m);
    st.source = source.name.clone();
    st.target = target.to_string();
    st.replicas = source.replicas;
    st.binding = k.1.clone();
    st.estimate = Some(estimate);
    st.message = message.to_string();
    st.start_time = Some(now);
    next.status = serde_json::to_value(st).ok();
    next
}

/// The write that starts a move: the binding naming its Migration first, then the Migration
/// (created, or a user's given its target), then the Event, once per migration.
#[allow(clippy::too_many_arguments)]
fn move_write(
    store: Arc<dyn Store>,
    k: &BKey,
    b: Arc<Object>,
    next_spec: BindingSpec,
    st: BindingStatus,
    migration: Object,
    creating: bool,
    message: String,
) -> Job<BKey> {
    let key = k.clone();
    Box::pin(async move {
        let r = &next_spec.resource;
        let err = |e: orrery_store::StoreError| (key.clone(), e.to_string());
        // The binding first: it names the migration, so no second move can start; a
        // migration that then fails to be written leaves a name nobody follows, which
        // the next decision replaces.
        let mut next = (*b).clone();
        next.spec = serde_json::to_value(&next_spec).ok();
        next.status = serde_json::to_value(&st).ok();
        store
            .update(
                &keys::well_known::binding(&key.0, &key.1),
                next,
                b.revision(),
            )
            .await
            .map_err(err)?;
        let mkey = keys::well_known::migration(&key.0, migration.name());
        let uid = migration.metadata.uid.clone();
        // Whether this write started the move (a decision taken again before the
        // Migration's target was seen finds it started, and says nothing more).
        let started = if creating {
            match store.create(&mkey, migration).await {
                Ok(_) => true,
                Err(orrery_store::StoreError::AlreadyExists { .. }) => false,
                Err(e) => return Err(err(e)),
            }
        } else {
            // The user's Migration gets its target even if it changed meanwhile (its
            // labels, say): the binding names it now, and nothing else would.
            let status = migration.status.clone();
            let wrote = std::sync::atomic::AtomicBool::new(false);
            orrery_store::update_with(store.as_ref(), &mkey, |mut cur| {
                wrote.store(false, std::sync::atomic::Ordering::Relaxed);
                let st = orrery_api::stateful::MigrationStatus::of(&cur);
                if cur.metadata.uid != uid || !st.target.is_empty() || st.phase.is_done() {
                    return Ok(None);
                }
                cur.status = status.clone();
                wrote.store(true, std::sync::atomic::Ordering::Relaxed);
                Ok(Some(cur))
            })
            .await
            .map_err(err)?;
            wrote.load(std::sync::atomic::Ordering::Relaxed)
        };
        if started {
            let about = subject(&r.api_version, &r.kind, &r.namespace, &r.name, &r.uid);
            // Once per migration, a restart included.
            let _ = record::event_once_for(
                store.as_ref(),
                &about,
                &uid,
                "Normal",
                "MigrationStarted",
                &message,
                COMPONENT,
            )
            .await;
        }
        Ok(())
    })
}
