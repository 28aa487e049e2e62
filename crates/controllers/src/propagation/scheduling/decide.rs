//! Deciding: a chunk of due bindings through the engine, each decision written in the
//! background (make-before-break, the assume cache, the history, an Event on the template),
//! and what a write that lost gives back.

use super::*;

impl Scheduler {
    /// Decides one chunk of what waits in the queue; its writes run while the next chunk is
    /// decided (a few chunks in flight at most).
    pub(super) async fn decide_chunk(&mut self, keys: &[BKey]) {
        let round = self.round.get_or_insert_with(|| (0, Instant::now()));
        round.0 += keys.len();
        // The loop's depth before this chunk was taken out of it.
        self.settings
            .metrics
            .queue_depth
            .set(self.runtime.depth.get());
        let mut jobs: Vec<Job<BKey>> = Vec::new();
        let mut failed: Vec<(BKey, u64)> = Vec::new();
        for k in keys {
            let k = k.clone();
            self.behind.remove(&k);
            let why = self.triggers.remove(&k).unwrap_or(Trigger::Binding);
            if self.in_flight.contains_key(&k) {
                // Its shed lists and consolidation wait with it.
                self.deferred.entry(k).or_insert(why);
                continue;
            }
            let shed = self.shed.remove(&k).unwrap_or_default();
            let ahead = self.shed_ahead.remove(&k).unwrap_or_default();
            let preempted = self.preempt.remove(&k).unwrap_or_default();
            // Leaving for a higher priority is decided, whatever else queued it.
            let why = if preempted.is_empty() {
                why
            } else {
                Trigger::Preempted
            };
            // Consolidated only when a round asked first: whatever else woke it decides as
            // it would have.
            let consolidate = self.consolidating.remove(&k)
                && why == Trigger::Consolidate
                && self.consolidators.contains(&k);
            match self.reconcile(&k, why, &shed, &ahead, &preempted, consolidate) {
                Outcome::Skip => {}
                Outcome::Write(j) => {
                    self.backoff.reset(&k);
                    self.unplaced.remove(&k);
                    jobs.push(j);
                }
                Outcome::Unschedulable(j) => {
                    // The room epoch as this decision saw it.
                    failed.push((k.clone(), self.room_epoch));
                    if let Some(j) = j {
                        jobs.push(j);
                    }
                }
            }
        }
        let now = Instant::now();
        for (k, epoch) in failed {
            let wait = self.backoff.fail(&k);
            let retry_at = Some(now + Duration::from_millis(wait));
            self.unplaced.insert(
                k,
                Unplaced {
                    retry_at,
                    epoch,
                    at: now,
                },
            );
        }
        if self.writing.len() >= IN_FLIGHT
            && let Some(h) = self.writing.pop_front()
        {
            self.written(h.await.unwrap_or_default());
        }
        let history = std::mem::take(&mut self.history);
        let history_tx = self.history_tx.clone();
        let in_flight = std::mem::take(&mut self.chunk_in_flight);
        // Store conflicts: the binding changed under us; its update event queues it again.
        self.writing.push_back(tokio::spawn(async move {
            let failed = run_jobs(jobs).await;
            // The history tells of decisions that were written, not of those that lost.
            let landed: Vec<ScheduleEntry> = history
                .into_iter()
                .filter(|(k, _)| !failed.contains(k))
                .map(|(_, e)| e)
                .collect();
            history_tx.send(landed);
            in_flight
                .into_iter()
                .map(|(k, seq)| {
                    let lost = failed.contains(&k);
                    (k, seq, lost)
                })
                .collect()
        }));
    }

    /// Takes in the chunks whose writes are over, without waiting for the others.
    pub(super) fn collect_writes(&mut self) {
        while self.writing.front().is_some_and(|h| h.is_finished()) {
            let Some(mut h) = self.writing.pop_front() else {
                break;
            };
            match (&mut h).now_or_never() {
                Some(writes) => self.written(writes.unwrap_or_default()),
                // Finished, but this task's cooperative budget is spent (a join counts
                // against it): kept for the next look, never dropped with its result.
                None => {
                    self.writing.push_front(h);
                    break;
                }
            }
        }
    }

    /// A chunk's writes are over: a decision whose write failed gives back what it assumed
    /// and is decided again; bindings woken meanwhile are queued.
    pub(super) fn written(&mut self, writes: Vec<Written>) {
        for (k, seq, lost) in writes {
            if self.in_flight.get(&k).is_none_or(|f| f.seq != seq) {
                continue;
            }
            let Some(f) = self.in_flight.remove(&k) else {
                continue;
            };
            if lost && self.bindings.contains_key(&k) {
                let changed = self.assume.restore(&format!("{}/{}", k.0, k.1), f.before);
                self.refresh_assumed(&changed);
                self.room_changed();
                // A conflict's update event queues it too; another failure queues nothing.
                self.enqueue(k.clone(), f.why);
            }
            if let Some(why) = self.deferred.remove(&k) {
                self.enqueue(k, why);
            }
        }
    }

    /// The queue is empty: the round's writes are waited for.
    pub(super) async fn end_round(&mut self) {
        for h in std::mem::take(&mut self.writing) {
            self.written(h.await.unwrap_or_default());
        }
        if let Some((n, started)) = self.round.take() {
            self.settings.metrics.queue_depth.set(0);
            crate::propagation::log_round("scheduling", n, started);
        }
    }

    /// Decides one binding: its gate (is a decision wanted at all), the engine's decision,
    /// what it changes (placement, evictions, status), and the write that carries it. It is
    /// long because its steps share the engine's `Task`, which borrows the spec the later
    /// steps change (evictions, standby, clusters); apart, each decision would copy the
    /// placement.
    pub(super) fn reconcile(
        &mut self,
        k: &BKey,
        why: Trigger,
        shed: &[String],
        shed_ahead: &[String],
        preempted: &[preempt::Preemption],
        consolidate: bool,
    ) -> Outcome {
        let gate = match self.gate(k, why) {
            Ok(g) => g,
            Err(outcome) => return outcome,
        };
        let Gate {
            b,
            why,
            generation,
            observed,
            requested,
        } = gate;
        let Some(mut spec) = read_spec(k, &b) else {
            return Outcome::Skip;
        };
        if !orrery_api::policy::is_orrery_scheduler(&spec.scheduler_name) {
            // As Karmada's scheduler: another scheduler's binding is not ours to decide.
            let msg = format!(
                "left to the scheduler {:?} that the policy names in spec.schedulerName",
                spec.scheduler_name
            );
            return Outcome::Write(self.write_condition(k, &b, "OtherScheduler", msg));
        }
        let mut status = BindingStatus::of(&b);
        let old_evictions = spec.evictions.clone();
        let now = Time::now();
        let evicted_now = evict_unhealthy(&mut spec, &status, now);
        if why == Trigger::Failover && evicted_now.is_empty() && observed == Some(generation) {
            return Outcome::Skip;
        }
        // Owned here: the task borrows them while the spec changes. A cluster the binding is
        // preempted from is out of this decision only: it stays eligible after.
        let preempted = preempt::still_placed(preempted, &spec);
        let evicted: Vec<String> = (spec.evictions.iter())
            .filter(|e| !e.rescheduled)
            .map(|e| e.cluster.clone())
            .chain(preempted.iter().map(|p| p.cluster.clone()))
            .collect();
        let kind = spec.resource.kind.clone();
        let request = (spec.replica_requirements.as_ref())
            .map_or_else(Default::default, |r| r.resource_request.clone());
        let previous = spec.clusters.clone();
        let ties = crate::propagation::stateful::ties(
            &self.graph,
            &self.bindings,
            &self.datasets,
            k,
            &spec,
        );
        let needs: Vec<orrery_scheduler::components::ComponentNeed> = (spec.components.iter())
            .map(|c| orrery_scheduler::components::ComponentNeed {
                name: c.name.clone(),
                replicas: c.replicas,
                request: (c.replica_requirements.as_ref())
                    .map_or_else(Default::default, |r| r.resource_request.clone()),
            })
            .collect();
        let rooms = if needs.len() > 1 {
            self.quota.rooms(&spec.resource.namespace)
        } else {
            Vec::new()
        };
        let task = Task {
            // A standalone task runs outside Orrery and needs no API of the member.
            api_version: if spec.resource.is_task() {
                ""
            } else {
                &spec.resource.api_version
            },
            kind: &kind,
            replicas: spec.replicas,
            divisible: spec.replicas > 0 || orrery_api::interpret::has_divisible_replicas(&kind),
            request: &request,
            placement: &spec.placement,
            targets: &spec.target_clusters,
            priority: spec.priority,
            previous: &previous,
            evicted: &evicted,
            shed,
            shed_ahead,
            mode: mode_of(why, consolidate, &spec),
            now: now.unix_seconds(),
            seed: seed_of(&b.metadata.uid),
            relations: ties.relations(),
            components: &needs,
            quota_room: &rooms,
        };
        // A workload of several components is placed as one whole set.
        let set = orrery_scheduler::components::WholeSet::of(&task, &self.engine);
        let task = set.as_ref().map_or_else(|| task.clone(), |s| s.task(&task));
        let request = task.request.clone();
        // A quota counts a set's resources as any binding's, its pods left out.
        let mut quota_request = request.clone();
        if set.is_some() {
            quota_request.remove("pods");
        }
        let mut decision = self.run_engine(&task, &ties);
        if let Some(note) = self.preempt_for(k, &spec, &decision) {
            decision.error = decision.error.map(|e| format!("{e}; {note}"));
        }
        let changed_spec_generation = status.scheduler_observed_generation != Some(generation);
        let leaving: Vec<String> = (evicted_now.iter().cloned())
            .chain(preempted.iter().map(|p| p.cluster.clone()))
            .collect();
        let mut new_clusters =
            placement_after(&decision, &spec.clusters, changed_spec_generation, &leaving);
        // A stateful workload never moves by being started empty elsewhere: a decision that
        // takes it off a cluster and onto another starts a Migration that carries its data.
        if spec.is_stateful() && !spec.resource.is_task() {
            match self.stateful_move(k, &b, &spec, &task, &decision, &ties, &new_clusters, why) {
                StatefulMove::None => {}
                StatefulMove::Stay => new_clusters = spec.clusters.clone(),
                StatefulMove::Start(outcome) => return outcome,
            }
        }
        let grace = self.settings.move_grace;
        old_copies(
            &mut spec.evictions,
            &spec.clusters,
            &new_clusters,
            why,
            now,
            grace,
        );
        let forecast = self
            .forecast_moves
            .remove(k)
            .filter(|_| why == Trigger::Forecast);
        let standby = self.choose_standby(&spec, &task, &decision, &new_clusters, &ties);
        let standby_changed = standby != spec.standby;
        spec.standby = standby;
        let v = Verdict::of(
            &self.fleet,
            &self.engine,
            &task,
            &decision,
            &status,
            &new_clusters,
            Seen {
                clusters: &spec.clusters,
                evictions_changed: old_evictions != spec.evictions || standby_changed,
                generation,
                requested: requested.is_some(),
                why,
            },
            now,
        );
        if !v.clusters_changed && !v.status_changed && !v.evictions_changed {
            return if v.failed {
                Outcome::Unschedulable(None)
            } else {
                Outcome::Skip
            };
        }
        if v.clusters_changed
            && let Some(msg) = self.quota.check(
                k,
                &spec.resource.namespace,
                &quota_request,
                &spec.clusters,
                &new_clusters,
                &self.bindings,
            )
        {
            return Outcome::Write(self.quota_refused(k, &b, &spec, msg));
        }
        if v.clusters_changed {
            self.assume_decision(k, why, &request, &kind, &spec.clusters, &new_clusters);
        }
        self.seq += 1;
        let task_id = format!("{}-{}", b.metadata.uid, self.seq);
        // The history records decisions, not evaluations: a restart, a retry or a change of
        // the fleet that leaves the same placement for the same spec adds no entry. A fresh
        // decision someone asked for does.
        if v.worth_recording(&status, generation, requested.is_some(), why) {
            let entry = v.history_entry(
                k,
                &spec,
                &decision,
                &new_clusters,
                &task_id,
                why,
                forecast,
                now,
            );
            self.history.push((k.clone(), entry));
        }
        status.cost = orrery_scheduler::cost_of(&self.fleet, &task, &new_clusters);
        spec.clusters = new_clusters;
        let affinity = decision.affinity_name.clone();
        stamp(
            &mut status,
            task_id,
            requested,
            generation,
            affinity,
            v.clusters_changed,
            now,
        );
        let announce =
            (v.cond_changed() || !evicted_now.is_empty() || !preempted.is_empty()).then(|| {
                Announce {
                    cond: v.cond.clone(),
                    evicted_now,
                    preempted: preempted.iter().map(|p| p.why.clone()).collect(),
                }
            });
        let failed = v.failed;
        v.apply(&mut status);
        let job = decision_write(self.store.clone(), k, b, spec, status, announce);
        if failed {
            Outcome::Unschedulable(Some(job))
        } else {
            Outcome::Write(job)
        }
    }

    /// Whether `k` wants a decision now, and with what reason: a binding being deleted, left
    /// to a migration, or already decided for its generation does not.
    fn gate(&mut self, k: &BKey, why: Trigger) -> Result<Gate, Outcome> {
        let Some(b) = self.bindings.get(k).cloned() else {
            return Err(Outcome::Skip);
        };
        if b.metadata.deletion_timestamp.is_some() {
            return Err(Outcome::Skip);
        }
        // A user's Migration waiting for its target, whatever woke the binding: it stays
        // waiting until its status names the target. A write that lost a race is tried
        // again, and so is one cut short by a restart after the binding named it but before
        // the Migration got its target (deciding again only rewrites the same names; the
        // target is written to the Migration once).
        if let Some(m) = self.user_moves.get(k).cloned() {
            return Err(self.user_move(k, &b, &m));
        }
        // A binding being moved is left to its migration until the move is over; one that
        // names a migration not seen yet waits for it (its event may be on its way), unless
        // that migration never comes.
        if self.graph.moving(&b).is_some() {
            return Err(Outcome::Skip);
        }
        if self.graph.names_unknown(&b) {
            let since = *self
                .unknown_moves
                .entry(k.clone())
                .or_insert_with(Instant::now);
            if since.elapsed() < UNKNOWN_MOVE_WAIT {
                return Err(Outcome::Unschedulable(None));
            }
        } else {
            self.unknown_moves.remove(k);
        }
        let generation = b.metadata.generation.unwrap_or(1);
        // Decided for this generation already, and nothing else asks for a decision: skip
        // without parsing (the binding controller's status writes land here).
        let observed = b
            .status
            .as_ref()
            .and_then(|s| s.get("schedulerObservedGeneration"))
            .and_then(serde_json::Value::as_i64);
        // A fresh decision someone asked for (`POST /api/v1/bindings`), not yet answered.
        let requested = b
            .metadata
            .annotations
            .get(binding::RESCHEDULE_ANNOTATION)
            .filter(|v| {
                b.status
                    .as_ref()
                    .and_then(|s| s.get("rescheduleObserved"))
                    .and_then(serde_json::Value::as_str)
                    != Some(v.as_str())
            })
            .cloned();
        let why = if requested.is_some() {
            Trigger::Requested
        } else if why == Trigger::Binding && says_migrating(&b) {
            // Its status still tells of a move that is over (level-based: whatever woke it).
            Trigger::MoveDone
        } else {
            why
        };
        if why == Trigger::Binding && observed == Some(generation) {
            return Err(Outcome::Skip);
        }
        Ok(Gate {
            b,
            why,
            generation,
            observed,
            requested,
        })
    }

    /// The engine's decision (a follower that fits nowhere near its leader goes to the
    /// nearest cluster that can hold it), counted in the scheduler's metrics.
    fn run_engine(
        &mut self,
        task: &Task<'_>,
        ties: &crate::propagation::stateful::Ties,
    ) -> Decision {
        let engine_started = Instant::now();
        let mut decision = schedule_cached(&self.fleet, task, &self.engine, &mut self.filter_cache);
        if decision.error.is_some()
            && ties.follows
            && let Some(d) = self.nearest_to_leader(task, ties)
        {
            decision = d;
        }
        let m = &self.settings.metrics;
        m.decision_seconds
            .observe(engine_started.elapsed().as_secs_f64());
        m.decisions.inc();
        if decision.error.is_some() {
            m.unschedulable.inc();
        }
        decision
    }

    /// Whether a decision moves a stateful workload off a cluster onto another: a move with
    /// its data only when it must (its cluster fails a filter, is lost, sheds or fails over);
    /// a better score elsewhere moves no data, and the workload stays.
    #[allow(clippy::too_many_arguments)]
    fn stateful_move(
        &mut self,
        k: &BKey,
        b: &Arc<Object>,
        spec: &BindingSpec,
        task: &Task<'_>,
        decision: &Decision,
        ties: &crate::propagation::stateful::Ties,
        new_clusters: &[TargetCluster],
        why: Trigger,
    ) -> StatefulMove {
        let added = new_clusters
            .iter()
            .any(|n| n.replicas > 0 && !spec.clusters.iter().any(|c| c.name == n.name));
        let dropped = spec.clusters.iter().find(|c| {
            c.replicas > 0
                && !new_clusters
                    .iter()
                    .any(|n| n.name == c.name && n.replicas > 0)
        });
        let (true, Some(source)) = (added, dropped) else {
            return StatefulMove::None;
        };
        let forced = matches!(why, Trigger::Shed | Trigger::Forecast | Trigger::Failover)
            || decision
                .explain(&self.fleet, task, &self.engine)
                .iter()
                .find(|c| c.name == source.name)
                .is_some_and(|c| {
                    !c.filter.is_empty() && c.filter != "SpreadConstraint" && c.filter != "Sample"
                });
        if !forced {
            return StatefulMove::Stay;
        }
        let source = source.clone();
        StatefulMove::Start(self.start_move(k, b, spec, task, decision, ties, &source, why, None))
    }

    /// Counts a decision's new replicas against their clusters until the members report them
    /// (taken back should its write not land: [`Scheduler::written`]).
    fn assume_decision(
        &mut self,
        k: &BKey,
        why: Trigger,
        request: &orrery_api::cluster::ResourceList,
        kind: &str,
        old: &[TargetCluster],
        new: &[TargetCluster],
    ) {
        let bkey_str = format!("{}/{}", k.0, k.1);
        self.in_flight.insert(
            k.clone(),
            InFlight {
                seq: self.seq + 1,
                why,
                before: self.assume.save(&bkey_str),
            },
        );
        self.chunk_in_flight.push((k.clone(), self.seq + 1));
        let changed = self.assume.assume(
            &bkey_str,
            demand_of(request),
            old,
            new,
            orrery_api::interpret::counts_pods(kind),
            self.now_ms(),
        );
        self.refresh_assumed(&changed);
        // Replicas taken off a cluster make room there.
        if old.iter().any(|o| {
            new.iter()
                .find(|c| c.name == o.name)
                .is_none_or(|c| c.replicas < o.replicas)
        }) {
            self.room_changed();
        }
    }

    /// A follower whose leader's clusters cannot hold it: the nearest cluster (by latency to
    /// them) that can, of the eight nearest.
    pub(super) fn nearest_to_leader(
        &mut self,
        task: &Task<'_>,
        ties: &crate::propagation::stateful::Ties,
    ) -> Option<Decision> {
        if ties.near.is_empty() {
            return None;
        }
        let mut by_latency: Vec<(f64, String)> = (0..self.fleet.len())
            .filter(|i| !ties.near.contains(&self.fleet.clusters()[*i].name))
            .filter_map(|i| {
                let l = orrery_scheduler::moves::mean_latency(&self.fleet, i, &ties.near)?;
                Some((l, self.fleet.clusters()[i].name.clone()))
            })
            .collect();
        by_latency.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let why = format!(
            "its leader's clusters ({}) cannot hold it: the nearest that can",
            ties.near.join(", ")
        );
        for (_, c) in by_latency.into_iter().take(8) {
            let only = [c];
            let mut relations = ties.relations();
            relations.within = Some((&only, &why));
            let t = Task {
                relations,
                ..task.clone()
            };
            let d = schedule_cached(&self.fleet, &t, &self.engine, &mut self.filter_cache);
            if d.error.is_none() {
                return Some(d);
            }
        }
        None
    }

    /// A job that sets the binding's Scheduled condition (the placement stays).
    /// A decision refused by a FederatedResourceQuota: the placement stays, the binding says
    /// why, and the template's owner and the binding are told once (Karmada's
    /// `ScheduleBindingFailed`).
    fn quota_refused(
        &self,
        k: &BKey,
        b: &Arc<Object>,
        spec: &BindingSpec,
        msg: String,
    ) -> Job<BKey> {
        let reason = orrery_api::federated_quota::REASON_QUOTA_EXCEEDED;
        let already = conditions::find(&BindingStatus::of(b).conditions, CONDITION_SCHEDULED)
            .is_some_and(|c| c.reason == reason && c.message == msg);
        let write = self.write_condition(k, b, reason, msg.clone());
        let store = self.store.clone();
        let r = spec.resource.clone();
        let binding = b.clone();
        Box::pin(async move {
            write.await?;
            if !already {
                let about = subject(&r.api_version, &r.kind, &r.namespace, &r.name, &r.uid);
                for o in [&about, binding.as_ref()] {
                    let _ = record::event(
                        store.as_ref(),
                        o,
                        "Warning",
                        "ScheduleBindingFailed",
                        &msg,
                        COMPONENT,
                    )
                    .await;
                }
            }
            Ok(())
        })
    }

    pub(super) fn write_condition(
        &self,
        k: &BKey,
        b: &Arc<Object>,
        reason: &str,
        msg: String,
    ) -> Job<BKey> {
        let store = self.store.clone();
        let key = k.clone();
        let reason = reason.to_string();
        let uid = b.metadata.uid.clone();
        Box::pin(async move {
            let bkey = keys::well_known::binding(&key.0, &key.1);
            orrery_store::update_with(store.as_ref(), &bkey, |mut cur| {
                if cur.metadata.uid != uid {
                    return Ok(None);
                }
                let mut st = BindingStatus::of(&cur);
                let cond =
                    Condition::new(CONDITION_SCHEDULED, conditions::FALSE, &reason, msg.clone());
                if !conditions::set(&mut st.conditions, cond, Time::now()) {
                    return Ok(None);
                }
                cur.status = serde_json::to_value(st).ok();
                Ok(Some(cur))
            })
            .await
            .map(|_| ())
            .map_err(|e| (key, e.to_string()))
        })
    }
}

/// A binding that wants a decision, and what [`Scheduler::gate`] read of it.
struct Gate {
    b: Arc<Object>,
    why: Trigger,
    generation: i64,
    /// The generation the last decision was for.
    observed: Option<i64>,
    /// A fresh decision asked for and not yet answered (the annotation's value).
    requested: Option<String>,
}

/// What [`Scheduler::stateful_move`] found.
enum StatefulMove {
    /// The decision moves no stateful replicas.
    None,
    /// It would, but nothing forces a move: the placement stands.
    Stay,
    /// A move with the data starts.
    Start(Outcome),
}

/// The binding's spec, read in place (copying its JSON first cost as much as reading it);
/// `None`, and a warning, if it cannot be read.
fn read_spec(k: &BKey, b: &Object) -> Option<BindingSpec> {
    match b.spec.as_ref().map(BindingSpec::deserialize) {
        Some(Ok(s)) => Some(s),
        other => {
            let error = match other {
                Some(Err(e)) => e.to_string(),
                _ => "no spec".into(),
            };
            tracing::warn!(namespace = %k.0, binding = %k.1, %error, "a ResourceBinding that cannot be read is not scheduled");
            None
        }
    }
}

/// How the engine treats the current placement: afresh when a user asks (or a cluster
/// recovered and the placement rebalances then), towards cheaper clusters in a round of
/// consolidation, else keeping what stands.
fn mode_of(why: Trigger, consolidate: bool, spec: &BindingSpec) -> Mode {
    if why == Trigger::Requested
        || (why == Trigger::Recovered && spec.placement.rebalance_on_recovery)
    {
        Mode::Fresh
    } else if consolidate {
        Mode::Consolidate
    } else {
        Mode::Steady
    }
}

/// Application failover: an application unhealthy in a cluster past its toleration is
/// evicted from it. Returns the clusters evicted now.
fn evict_unhealthy(spec: &mut BindingSpec, status: &BindingStatus, now: Time) -> Vec<String> {
    let mut evicted_now = Vec::new();
    let Some(f) = &spec.failover else {
        return evicted_now;
    };
    let tolerate = f
        .decision_conditions
        .toleration_seconds
        .unwrap_or(DEFAULT_FAILOVER_TOLERATION_SECONDS);
    let (purge_mode, grace) = (f.purge_mode.clone(), f.grace_period_seconds);
    for a in &status.aggregated_status {
        let placed = spec.clusters.iter().any(|c| c.name == a.cluster_name);
        let already = spec
            .evictions
            .iter()
            .any(|e| e.cluster == a.cluster_name && !e.rescheduled);
        if placed && !already && unhealthy_for(a, now) >= Some(tolerate) {
            let keep_until = match purge_mode.as_str() {
                "Graciously" => grace.map(|g| now.add_seconds(g)),
                _ => None,
            };
            spec.evictions.retain(|e| e.cluster != a.cluster_name);
            spec.evictions.push(Eviction {
                cluster: a.cluster_name.clone(),
                reason: format!("unhealthy for more than {tolerate}s"),
                since: now,
                keep_until,
                keep: purge_mode == "Never",
                rescheduled: false,
            });
            evicted_now.push(a.cluster_name.clone());
        }
    }
    evicted_now
}

/// The placement a decision leaves: clusters going away must not empty a placement that
/// stands; a changed spec with no fit does.
fn placement_after(
    decision: &Decision,
    current: &[TargetCluster],
    changed_spec_generation: bool,
    evicted_now: &[String],
) -> Vec<TargetCluster> {
    match &decision.error {
        Some(_)
            if decision.clusters.is_empty()
                && !changed_spec_generation
                && evicted_now.is_empty() =>
        {
            current.to_vec()
        }
        _ => decision.clusters.clone(),
    }
}

/// Make-before-break: clusters the scheduler took replicas away from keep the old copy until
/// the new placement is healthy or the grace period ends; old copies are gone once their time
/// is up or the cluster is back in the placement.
fn old_copies(
    evictions: &mut Vec<Eviction>,
    old: &[TargetCluster],
    new: &[TargetCluster],
    why: Trigger,
    now: Time,
    grace: Duration,
) {
    // First the copies this decision leaves behind (not where one is kept already, even one
    // about to go), then the ones whose time is up.
    for o in old.iter().filter(|_| why.moves()) {
        if new.iter().any(|c| c.name == o.name) || evictions.iter().any(|e| e.cluster == o.name) {
            continue;
        }
        evictions.push(Eviction {
            cluster: o.name.clone(),
            reason: format!("replicas moved away ({})", why.as_str()),
            since: now,
            keep_until: Some(now.add_seconds(grace.as_secs() as i64)),
            keep: false,
            rescheduled: true,
        });
    }
    evictions.retain(|e| {
        !e.rescheduled
            || (e.keep_until.is_some_and(|u| u > now) && !new.iter().any(|c| c.name == e.cluster))
    });
}

/// The binding's `Scheduled` condition for a decision.
fn scheduled_condition(
    decision: &Decision,
    placed: &[TargetCluster],
    filtered: &std::collections::BTreeMap<String, i64>,
) -> Condition {
    match &decision.error {
        None => Condition::new(
            CONDITION_SCHEDULED,
            conditions::TRUE,
            "Success",
            placed_message(placed),
        ),
        Some(e) => {
            let mut msg = e.clone();
            if !filtered.is_empty() {
                msg = format!("{msg}; filtered: {}", history::filtered_message(filtered));
            }
            let reason = if decision.clusters.is_empty() {
                "Unschedulable"
            } else {
                "PartiallyScheduled"
            };
            Condition::new(CONDITION_SCHEDULED, conditions::FALSE, reason, msg)
        }
    }
}

/// Which decision the status tells of: its task, the request it answers, the generation and
/// affinity decided for, and when the placement last changed.
fn stamp(
    status: &mut BindingStatus,
    task_id: String,
    requested: Option<String>,
    generation: i64,
    affinity: String,
    clusters_changed: bool,
    now: Time,
) {
    status.task_id = task_id;
    if let Some(r) = requested {
        status.reschedule_observed = r;
    }
    status.scheduler_observed_generation = Some(generation);
    status.scheduler_observed_affinity_name = affinity;
    if clusters_changed {
        status.last_scheduled_time = Some(now);
    }
}

/// What a decision tells the template's owner with an Event.
struct Announce {
    cond: Condition,
    /// Clusters left by application failover.
    evicted_now: Vec<String>,
    /// Why it left clusters for workloads of a higher priority (an Event `Preempted` each).
    preempted: Vec<String>,
}

/// The write of a decision: the binding's spec and status (conditional on the revision
/// decided from), then the Event, if any.
fn decision_write(
    store: Arc<dyn Store>,
    k: &BKey,
    b: Arc<Object>,
    spec: BindingSpec,
    status: BindingStatus,
    announce: Option<Announce>,
) -> Job<BKey> {
    let key = k.clone();
    let bkey = keys::well_known::binding(&k.0, &k.1);
    Box::pin(async move {
        // Built here, in the writers' task, not in the loop that decides one binding after
        // another: encoding the spec and status is about as much work as the decision. The
        // old spec and status, the bulk of the binding, are not copied.
        let next = Object {
            api_version: b.api_version.clone(),
            kind: b.kind.clone(),
            metadata: b.metadata.clone(),
            spec: serde_json::to_value(&spec).ok(),
            status: serde_json::to_value(&status).ok(),
            other: b.other.clone(),
        };
        store
            .update(&bkey, next, b.revision())
            .await
            .map_err(|e| (key.clone(), e.to_string()))?;
        if let Some(Announce {
            cond,
            evicted_now,
            preempted,
        }) = announce
        {
            let r = &spec.resource;
            // A standalone task has no template: its binding is what the event is about.
            let about = if r.is_task() {
                subject(
                    binding::API_VERSION,
                    binding::KIND,
                    &key.0,
                    &key.1,
                    &b.metadata.uid,
                )
            } else {
                subject(&r.api_version, &r.kind, &r.namespace, &r.name, &r.uid)
            };
            let (type_, reason) = if cond.is_true() {
                ("Normal", "Scheduled")
            } else {
                ("Warning", "ScheduleFailed")
            };
            let mut msg = cond.message.clone();
            if !evicted_now.is_empty() {
                msg = format!(
                    "{msg}; moved away from {} (application failover)",
                    evicted_now.join(", ")
                );
            }
            let _ = record::event(store.as_ref(), &about, type_, reason, &msg, COMPONENT).await;
            for why in preempted {
                let _ = record::event(
                    store.as_ref(),
                    &about,
                    "Warning",
                    preempt::PREEMPTED_REASON,
                    &why,
                    COMPONENT,
                )
                .await;
            }
        }
        Ok(())
    })
}

/// What a decision is compared with: the placement now, and what else asks for a write.
struct Seen<'a> {
    clusters: &'a [TargetCluster],
    /// Evictions or the standby changed.
    evictions_changed: bool,
    generation: i64,
    /// A fresh decision was asked for.
    requested: bool,
    why: Trigger,
}

/// A decision as the binding's status tells it, and what changed.
struct Verdict {
    summary: Vec<orrery_api::binding::ClusterDecision>,
    filtered: std::collections::BTreeMap<String, i64>,
    prediction: String,
    cond: Condition,
    old_cond: Option<Condition>,
    conds: Vec<Condition>,
    strategy: String,
    unplaced: Option<i64>,
    failed: bool,
    clusters_changed: bool,
    evictions_changed: bool,
    status_changed: bool,
}

impl Verdict {
    #[allow(clippy::too_many_arguments)]
    fn of(
        fleet: &Fleet,
        engine: &Engine,
        task: &Task<'_>,
        decision: &Decision,
        status: &BindingStatus,
        placed: &[TargetCluster],
        seen: Seen<'_>,
        now: Time,
    ) -> Verdict {
        let (summary, filtered) = decision.summary(fleet, task, engine, history::MAX_EXPLAINED);
        let prediction = decision.prediction(fleet, task, engine);
        let cond = scheduled_condition(decision, placed, &filtered);
        let old_cond = conditions::find(&status.conditions, CONDITION_SCHEDULED).cloned();
        let mut conds = status.conditions.clone();
        conditions::set(&mut conds, cond.clone(), now);
        let clusters_changed = placed != seen.clusters;
        let unplaced = (decision.unplaced > 0).then_some(decision.unplaced);
        // The strategy names how the replicas now running were divided: a decision that moves
        // nothing keeps the one that placed them (the fleet's level, which picks the strategy,
        // may have moved since), so the status and the history tell the same story.
        let strategy = if clusters_changed || status.strategy.is_empty() {
            decision.strategy.to_string()
        } else {
            status.strategy.clone()
        };
        let failed = decision.error.is_some();
        let generation = seen.generation;
        let status_changed = conds != status.conditions
            || status.decisions != summary
            || status.scheduler_observed_generation != Some(generation)
            || status.scheduler_observed_affinity_name != decision.affinity_name
            || status.strategy != strategy
            || status.unplaced_replicas != unplaced
            || status.prediction != prediction
            || seen.requested;
        // A round of consolidation that moves nothing writes nothing: its scores may have
        // drifted since the last decision, but that is no news worth a write a round.
        let status_changed = status_changed
            && !(seen.why == Trigger::Consolidate
                && !clusters_changed
                && !seen.evictions_changed
                && !failed
                && status.scheduler_observed_generation == Some(generation)
                && conds == status.conditions
                && status.unplaced_replicas == unplaced);
        Verdict {
            summary,
            filtered,
            prediction,
            cond,
            old_cond,
            conds,
            strategy,
            unplaced,
            failed,
            clusters_changed,
            evictions_changed: seen.evictions_changed,
            status_changed,
        }
    }

    /// Whether the decision goes into the history: a change of placement, of what the
    /// status tells, or of the generation decided for, or a decision asked for.
    fn worth_recording(
        &self,
        status: &BindingStatus,
        generation: i64,
        requested: bool,
        why: Trigger,
    ) -> bool {
        self.clusters_changed
            || self.cond_changed()
            || status.scheduler_observed_generation != Some(generation)
            || status.unplaced_replicas != self.unplaced
            || status.strategy != self.strategy
            || requested
            || why == Trigger::Requested
    }

    /// Whether the condition says something new.
    fn cond_changed(&self) -> bool {
        self.old_cond.as_ref().map(|c| (&c.status, &c.message))
            != Some((&self.cond.status, &self.cond.message))
    }

    #[allow(clippy::too_many_arguments)]
    fn history_entry(
        &self,
        k: &BKey,
        spec: &BindingSpec,
        decision: &Decision,
        placed: &[TargetCluster],
        task_id: &str,
        why: Trigger,
        forecast: Option<ForecastTrigger>,
        now: Time,
    ) -> ScheduleEntry {
        let result = if !self.failed {
            "Scheduled"
        } else if decision.clusters.is_empty() {
            "Unschedulable"
        } else {
            "PartiallyScheduled"
        };
        ScheduleEntry {
            id: task_id.to_string(),
            time: now,
            binding: format!("{}/{}", k.0, k.1),
            resource: binding::ObjectReference {
                resource_version: String::new(),
                ..spec.resource.clone()
            },
            replicas: spec.replicas,
            trigger: why.as_str().to_string(),
            strategy: self.strategy.clone(),
            fleet_level: (decision.fleet_level * 1000.0).round() / 1000.0,
            result: result.to_string(),
            message: self.cond.message.clone(),
            clusters: placed.to_vec(),
            unplaced: decision.unplaced,
            decisions: self.summary.clone(),
            filtered: self.filtered.clone(),
            prediction: self.prediction.clone(),
            forecast: if self.clusters_changed {
                forecast
            } else {
                None
            },
            rollout: None,
        }
    }

    /// Writes what the status tells of the decision.
    fn apply(self, status: &mut BindingStatus) {
        status.conditions = self.conds;
        status.decisions = self.summary;
        status.filtered = self.filtered;
        status.strategy = self.strategy;
        status.unplaced_replicas = self.unplaced;
        status.prediction = self.prediction;
    }
}
