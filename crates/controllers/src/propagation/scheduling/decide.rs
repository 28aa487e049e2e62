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
            // Consolidated only when a round asked first: whatever else woke it decides as
            // it would have.
            let consolidate = self.consolidating.remove(&k)
                && why == Trigger::Consolidate
                && self.consolidators.contains(&k);
            match self.reconcile(&k, why, &shed, &ahead, consolidate) {
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
            if !landed.is_empty() {
                let _ = history_tx.send(landed);
            }
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
            if let Some(h) = self.writing.pop_front() {
                // Finished: its result is there without waiting.
                let writes = h.now_or_never().and_then(Result::ok).unwrap_or_default();
                self.written(writes);
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

    pub(super) fn reconcile(
        &mut self,
        k: &BKey,
        why: Trigger,
        shed: &[String],
        shed_ahead: &[String],
        consolidate: bool,
    ) -> Outcome {
        let Some(b) = self.bindings.get(k).cloned() else {
            return Outcome::Skip;
        };
        if b.metadata.deletion_timestamp.is_some() {
            return Outcome::Skip;
        }
        // A user's Migration waiting for its target, whatever woke the binding: it stays
        // waiting until its status names the target. A write that lost a race is tried
        // again, and so is one cut short by a restart after the binding named it but before
        // the Migration got its target (deciding again only rewrites the same names; the
        // target is written to the Migration once).
        if let Some(m) = self.user_moves.get(k).cloned() {
            return self.user_move(k, &b, &m);
        }
        // A binding being moved is left to its migration until the move is over; one that
        // names a migration not seen yet waits for it (its event may be on its way), unless
        // that migration never comes.
        if self.graph.moving(&b).is_some() {
            return Outcome::Skip;
        }
        if self.graph.names_unknown(&b) {
            let since = *self
                .unknown_moves
                .entry(k.clone())
                .or_insert_with(Instant::now);
            if since.elapsed() < UNKNOWN_MOVE_WAIT {
                return Outcome::Unschedulable(None);
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
            return Outcome::Skip;
        }
        // Read in place: copying the spec's JSON first cost as much as reading it.
        let mut spec = match b.spec.as_ref().map(BindingSpec::deserialize) {
            Some(Ok(s)) => s,
            other => {
                let error = match other {
                    Some(Err(e)) => e.to_string(),
                    _ => "no spec".into(),
                };
                tracing::warn!(namespace = %k.0, binding = %k.1, %error, "a ResourceBinding that cannot be read is not scheduled");
                return Outcome::Skip;
            }
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
        // Failover: an application unhealthy past its toleration leaves that cluster.
        let mut evicted_now = Vec::new();
        if let Some(f) = &spec.failover {
            let tolerate = f
                .decision_conditions
                .toleration_seconds
                .unwrap_or(DEFAULT_FAILOVER_TOLERATION_SECONDS);
            for a in &status.aggregated_status {
                let placed = spec.clusters.iter().any(|c| c.name == a.cluster_name);
                let already = spec
                    .evictions
                    .iter()
                    .any(|e| e.cluster == a.cluster_name && !e.rescheduled);
                if placed && !already && unhealthy_for(a, now) >= Some(tolerate) {
                    let keep_until = match f.purge_mode.as_str() {
                        "Graciously" => f.grace_period_seconds.map(|g| now.add_seconds(g)),
                        _ => None,
                    };
                    spec.evictions.retain(|e| e.cluster != a.cluster_name);
                    spec.evictions.push(Eviction {
                        cluster: a.cluster_name.clone(),
                        reason: format!("unhealthy for more than {tolerate}s"),
                        since: now,
                        keep_until,
                        keep: f.purge_mode == "Never",
                        rescheduled: false,
                    });
                    evicted_now.push(a.cluster_name.clone());
                }
            }
        }
        if why == Trigger::Failover && evicted_now.is_empty() && observed == Some(generation) {
            return Outcome::Skip;
        }
        let evicted: Vec<String> = spec
            .evictions
            .iter()
            .filter(|e| !e.rescheduled)
            .map(|e| e.cluster.clone())
            .collect();
        let kind = spec.resource.kind.clone();
        let divisible = spec.replicas > 0 || orrery_api::interpret::has_divisible_replicas(&kind);
        let request = spec
            .replica_requirements
            .as_ref()
            .map(|r| r.resource_request.clone())
            .unwrap_or_default();
        let mode = if why == Trigger::Requested
            || (why == Trigger::Recovered && spec.placement.rebalance_on_recovery)
        {
            Mode::Fresh
        } else if consolidate {
            Mode::Consolidate
        } else {
            Mode::Steady
        };
        let previous = spec.clusters.clone();
        let ties = crate::propagation::stateful::ties(
            &self.graph,
            &self.bindings,
            &self.datasets,
            k,
            &spec,
        );
        let task = Task {
            // A standalone task runs outside Orrery and needs no API of the member.
            api_version: if spec.resource.is_task() {
                ""
            } else {
                &spec.resource.api_version
            },
            kind: &kind,
            replicas: spec.replicas,
            divisible,
            request: &request,
            placement: &spec.placement,
            targets: &spec.target_clusters,
            priority: spec.priority,
            previous: &previous,
            evicted: &evicted,
            shed,
            shed_ahead,
            mode,
            now: now.unix_seconds(),
            seed: seed_of(&b.metadata.uid),
            relations: ties.relations(),
        };
        let engine_started = Instant::now();
        let mut decision =
            schedule_cached(&self.fleet, &task, &self.engine, &mut self.filter_cache);
        if decision.error.is_some()
            && ties.follows
            && let Some(d) = self.nearest_to_leader(&task, &ties)
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
        let changed_spec_generation = status.scheduler_observed_generation != Some(generation);
        let mut new_clusters = match &decision.error {
            // Clusters going away must not empty a placement that stands; a changed spec
            // with no fit does.
            Some(_)
                if decision.clusters.is_empty()
                    && !changed_spec_generation
                    && evicted_now.is_empty() =>
            {
                spec.clusters.clone()
            }
            _ => decision.clusters.clone(),
        };
        // A stateful workload never moves by being started empty elsewhere: a decision that
        // takes it off a cluster and onto another starts a Migration that carries its data.
        if spec.is_stateful() && !spec.resource.is_task() {
            let added = new_clusters
                .iter()
                .any(|n| n.replicas > 0 && !spec.clusters.iter().any(|c| c.name == n.name));
            let dropped = spec.clusters.iter().find(|c| {
                c.replicas > 0
                    && !new_clusters
                        .iter()
                        .any(|n| n.name == c.name && n.replicas > 0)
            });
            if added && let Some(source) = dropped {
                // Only when it must: its cluster fails a filter (the policy, a taint, a lost
                // cluster), sheds, or fails over; a better score elsewhere moves no data.
                let forced = matches!(why, Trigger::Shed | Trigger::Forecast | Trigger::Failover)
                    || decision
                        .explain(&self.fleet, &task, &self.engine)
                        .iter()
                        .find(|c| c.name == source.name)
                        .is_some_and(|c| {
                            !c.filter.is_empty()
                                && c.filter != "SpreadConstraint"
                                && c.filter != "Sample"
                        });
                if forced {
                    let source = source.clone();
                    return self
                        .start_move(k, &b, &spec, &task, &decision, &ties, &source, why, None);
                }
                new_clusters = spec.clusters.clone();
            }
        }
        // Make-before-break: clusters the scheduler took replicas away from keep the old
        // copy until the new placement is healthy or the grace period ends.
        if why.moves() {
            for old in &spec.clusters {
                if new_clusters.iter().any(|c| c.name == old.name)
                    || spec.evictions.iter().any(|e| e.cluster == old.name)
                {
                    continue;
                }
                spec.evictions.push(Eviction {
                    cluster: old.name.clone(),
                    reason: format!("replicas moved away ({})", why.as_str()),
                    since: now,
                    keep_until: Some(now.add_seconds(self.settings.move_grace.as_secs() as i64)),
                    keep: false,
                    rescheduled: true,
                });
            }
        }
        // Moved replicas' old copies: gone once their time is up or the cluster is back.
        spec.evictions.retain(|e| {
            !e.rescheduled
                || (e.keep_until.is_some_and(|u| u > now)
                    && !new_clusters.iter().any(|c| c.name == e.cluster))
        });
        let (summary, filtered) =
            decision.summary(&self.fleet, &task, &self.engine, history::MAX_EXPLAINED);
        let prediction = decision.prediction(&self.fleet, &task, &self.engine);
        let forecast = self
            .forecast_moves
            .remove(k)
            .filter(|_| why == Trigger::Forecast);
        let cond = match &decision.error {
            None => Condition::new(
                CONDITION_SCHEDULED,
                conditions::TRUE,
                "Success",
                placed_message(&new_clusters),
            ),
            Some(e) => {
                let mut msg = e.clone();
                if !filtered.is_empty() {
                    msg = format!("{msg}; filtered: {}", history::filtered_message(&filtered));
                }
                let reason = if decision.clusters.is_empty() {
                    "Unschedulable"
                } else {
                    "PartiallyScheduled"
                };
                Condition::new(CONDITION_SCHEDULED, conditions::FALSE, reason, msg)
            }
        };
        let old_cond = conditions::find(&status.conditions, CONDITION_SCHEDULED).cloned();
        let mut conds = status.conditions.clone();
        conditions::set(&mut conds, cond.clone(), now);
        let clusters_changed = new_clusters != spec.clusters;
        let standby = self.choose_standby(&spec, &task, &decision, &new_clusters, &ties);
        let standby_changed = standby != spec.standby;
        spec.standby = standby;
        let evictions_changed = old_evictions != spec.evictions || standby_changed;
        let unplaced = (decision.unplaced > 0).then_some(decision.unplaced);
        // The strategy names how the replicas now running were divided: a decision that moves
        // nothing keeps the one that placed them (the fleet's level, which picks the strategy,
        // may have moved since), so the status and the history tell the same story.
        let strategy = if clusters_changed || status.strategy.is_empty() {
            decision.strategy.to_string()
        } else {
            status.strategy.clone()
        };
        let status_changed = conds != status.conditions
            || status.decisions != summary
            || status.scheduler_observed_generation != Some(generation)
            || status.scheduler_observed_affinity_name != decision.affinity_name
            || status.strategy != strategy
            || status.unplaced_replicas != unplaced
            || status.prediction != prediction
            || requested.is_some();
        let failed = decision.error.is_some();
        // A round of consolidation that moves nothing writes nothing: its scores may have
        // drifted since the last decision, but that is no news worth a write a round.
        let status_changed = status_changed
            && !(why == Trigger::Consolidate
                && !clusters_changed
                && !evictions_changed
                && !failed
                && status.scheduler_observed_generation == Some(generation)
                && conds == status.conditions
                && status.unplaced_replicas == unplaced);
        if !clusters_changed && !status_changed && !evictions_changed {
            return if failed {
                Outcome::Unschedulable(None)
            } else {
                Outcome::Skip
            };
        }
        let bkey_str = format!("{}/{}", k.0, k.1);
        if clusters_changed {
            // Taken back should the write not land ([`Scheduler::written`]).
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
                demand_of(&request),
                &spec.clusters,
                &new_clusters,
                orrery_api::interpret::counts_pods(&kind),
                self.now_ms(),
            );
            self.refresh_assumed(&changed);
            // Replicas taken off a cluster make room there.
            if spec.clusters.iter().any(|old| {
                new_clusters
                    .iter()
                    .find(|c| c.name == old.name)
                    .is_none_or(|c| c.replicas < old.replicas)
            }) {
                self.room_changed();
            }
        }
        self.seq += 1;
        let task_id = format!("{}-{}", b.metadata.uid, self.seq);
        let result = if !failed {
            "Scheduled"
        } else if decision.clusters.is_empty() {
            "Unschedulable"
        } else {
            "PartiallyScheduled"
        };
        // The history records decisions, not evaluations: a restart, a retry or a change of
        // the fleet that leaves the same placement for the same spec adds no entry. A fresh
        // decision someone asked for does.
        if clusters_changed
            || old_cond.as_ref().map(|c| (&c.status, &c.message))
                != Some((&cond.status, &cond.message))
            || status.scheduler_observed_generation != Some(generation)
            || status.unplaced_replicas != unplaced
            || status.strategy != strategy
            || requested.is_some()
            || why == Trigger::Requested
        {
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
                    strategy: strategy.clone(),
                    fleet_level: (decision.fleet_level * 1000.0).round() / 1000.0,
                    result: result.to_string(),
                    message: cond.message.clone(),
                    clusters: new_clusters.clone(),
                    unplaced: decision.unplaced,
                    decisions: summary.clone(),
                    filtered: filtered.clone(),
                    prediction: prediction.clone(),
                    forecast: if clusters_changed { forecast } else { None },
                },
            ));
        }
        spec.clusters = new_clusters;
        status.conditions = conds;
        status.decisions = summary;
        status.filtered = filtered;
        status.strategy = strategy;
        status.unplaced_replicas = unplaced;
        status.prediction = prediction;
        status.cost = orrery_scheduler::cost_of(&self.fleet, &task, &spec.clusters);
        status.task_id = task_id;
        if let Some(r) = requested {
            status.reschedule_observed = r;
        }
        status.scheduler_observed_generation = Some(generation);
        status.scheduler_observed_affinity_name = decision.affinity_name.clone();
        if clusters_changed {
            status.last_scheduled_time = Some(now);
        }
        let store = self.store.clone();
        let key = k.clone();
        let bkey = keys::well_known::binding(&k.0, &k.1);
        let announce = old_cond.as_ref().map(|c| (&c.status, &c.message))
            != Some((&cond.status, &cond.message))
            || !evicted_now.is_empty();
        let r = spec.resource.clone();
        let uid = b.metadata.uid.clone();
        let job: Job<BKey> = Box::pin(async move {
            // Built here, in the writers' task, not in the loop that decides one binding
            // after another: encoding the spec and status is about as much work as the
            // decision. The old spec and status, the bulk of the binding, are not copied.
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
            if announce {
                // A standalone task has no template: its binding is what the event is about.
                let about = if r.is_task() {
                    subject(binding::API_VERSION, binding::KIND, &key.0, &key.1, &uid)
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
            }
            Ok(())
        });
        if failed {
            Outcome::Unschedulable(Some(job))
        } else {
            Outcome::Write(job)
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
