//! Time-driven reasons to decide again, looked at every tick: bindings waiting for room,
//! application failover, moved replicas' old copies due to go, NoExecute taints past their
//! toleration, hot clusters shedding (now or ahead of a forecast peak), consolidation rounds,
//! and the weights monitoring adjusts.

use super::*;

impl Scheduler {
    /// Once a second: retries that are due, failover, tolerations running out, stale
    /// assumptions, hot clusters, old copies of moved replicas.
    pub(super) fn on_tick(&mut self) {
        let now = Instant::now();
        // Once something that may make room changed, a binding waiting for room is tried
        // again within a second while few wait, not only when its backoff runs out: a
        // decision already due must not wait a minute (a restart in between would make it
        // at once, and look like the restart's doing). Many waiting share a budget.
        let spacing = Duration::from_millis(
            (self.unplaced.len() as u64 * 1000 / RETRIES_PER_SECOND).clamp(1_000, 60_000),
        );
        let epoch = self.room_epoch;
        let due: Vec<BKey> = self
            .unplaced
            .iter()
            .filter(|(_, u)| {
                u.retry_at.is_some_and(|t| {
                    t <= now || (u.epoch != epoch && now.duration_since(u.at) >= spacing)
                })
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in due {
            let Some(u) = self.unplaced.get_mut(&k) else {
                continue;
            };
            // Retried only if something may have made room since it failed: a saturated
            // fleet is not asked the same question again and again.
            if u.epoch != self.room_epoch || now.duration_since(u.at) >= RETRY_ANYWAY {
                u.retry_at = None;
                self.enqueue(k, Trigger::Retry);
            } else {
                u.retry_at = Some(now + Duration::from_millis(self.backoff.fail(&k)));
            }
        }
        self.check_failover();
        let wall = Time::now().unix_seconds();
        let moved: Vec<BKey> = self
            .moves
            .iter()
            .filter(|(_, t)| **t <= wall)
            .map(|(k, _)| k.clone())
            .collect();
        for k in moved {
            self.enqueue(k, Trigger::Cleanup);
        }
        // Clusters with a NoExecute taint: a toleration with tolerationSeconds may have run out.
        let tainted: HashSet<String> = self
            .fleet
            .clusters()
            .iter()
            .filter(|c| c.taints.iter().any(|t| t.effect.as_str() == "NoExecute"))
            .map(|c| c.name.clone())
            .collect();
        if !tainted.is_empty() {
            let on: Vec<BKey> = self
                .bindings
                .iter()
                .filter(|(_, b)| placed_on(b).iter().any(|c| tainted.contains(c)))
                .map(|(k, _)| k.clone())
                .collect();
            for k in on {
                self.enqueue(k, Trigger::ClustersChanged);
            }
        }
        let changed = self
            .assume
            .expire(self.now_ms(), self.settings.assume_ttl.as_millis() as u64);
        if !changed.is_empty() {
            self.refresh_assumed(&changed);
            self.room_changed();
        }
        self.check_hot(now);
        self.check_consolidation(now);
        self.adjust_weights();
    }

    /// Every `consolidate_every`, up to `consolidate_per_round` of the bindings whose
    /// placement consolidates are decided again to move replicas onto cheaper clusters. With
    /// more than a round holds, rounds take them in slices of the key order chosen by the wall
    /// clock, so a restart (or a new leader) goes on with the slice it would have taken. The
    /// controller's start counts as a round: a restart moves nothing sooner than it would have.
    pub(super) fn check_consolidation(&mut self, now: Instant) {
        if now.duration_since(self.last_consolidation) < self.settings.consolidate_every {
            return;
        }
        self.last_consolidation = now;
        let per = self.settings.consolidate_per_round.max(1);
        let slices = self.consolidators.len().div_ceil(per).max(1) as u64;
        let every = self.settings.consolidate_every.as_secs().max(1);
        let slice = (Time::now().unix_seconds().max(0) as u64 / every) % slices;
        let round: Vec<BKey> = self
            .consolidators
            .iter()
            .skip(slice as usize * per)
            .take(per)
            .cloned()
            .collect();
        if !round.is_empty() {
            tracing::debug!(
                bindings = round.len(),
                slice,
                slices,
                "a round of consolidation"
            );
        }
        for k in round {
            self.consolidating.insert(k.clone());
            self.enqueue(k, Trigger::Consolidate);
        }
    }

    /// Draft 7.3.3: the score weights follow monitoring. The fleet's traffic is compared with
    /// its usual level (an average over about 15 minutes); a surge raises the network weight
    /// ([`orrery_scheduler::Weights::adjusted`]).
    pub(super) fn adjust_weights(&mut self) {
        const SMOOTHING: f64 = 1.0 / 900.0;
        let traffic: f64 = self.fleet.facts().iter().map(|f| f.traffic).sum();
        let baseline = match self.traffic_baseline {
            Some(b) => b + (traffic - b) * SMOOTHING,
            None => traffic,
        };
        self.traffic_baseline = Some(baseline);
        let weights = self.settings.weights.adjusted(&orrery_scheduler::Signals {
            traffic,
            traffic_baseline: baseline,
        });
        if weights != self.engine.weights {
            // The weight follows the traffic continuously: only a step of a tenth or more
            // from what was last told is worth a line at info level.
            let told = self.weights_told.unwrap_or(self.settings.weights.network);
            if (weights.network - told).abs() >= 0.1 * told.abs().max(0.1) {
                self.weights_told = Some(weights.network);
                tracing::info!(
                    network_weight = weights.network,
                    traffic,
                    baseline,
                    "score weights adjusted to the fleet's traffic"
                );
            } else {
                tracing::debug!(
                    network_weight = weights.network,
                    traffic,
                    baseline,
                    "score weights adjusted"
                );
            }
            self.engine.weights = weights;
            self.room_changed();
        }
    }

    /// Clusters above the shed mark for a whole window shed replicas of a few bindings; so do
    /// clusters whose forecast (its mean) crosses the mark within the horizon and stays above
    /// it for a window, ahead of the peak. Bindings that consolidate onto cheaper clusters are
    /// held under the limit by moving: the same rules at the limit shed theirs.
    pub(super) fn check_hot(&mut self, now: Instant) {
        let mark = self.settings.shed_mark.max(self.settings.water_level_limit);
        self.shed_rule(now, mark, false);
        if self.consolidators.is_empty() {
            // Nobody is shed at the limit: what was seen above it is not kept for later.
            self.over_since.clear();
        } else {
            self.shed_rule(now, self.settings.water_level_limit, true);
        }
    }

    /// One shed rule: at `mark`, of every binding divided by water level, or (`consolidating`)
    /// of those that consolidate only, with its own record of when clusters went above it.
    pub(super) fn shed_rule(&mut self, now: Instant, mark: f64, consolidating: bool) {
        let mut due = Vec::new();
        let wall = Time::now();
        let mut ahead: Vec<(String, orrery_scheduler::Crossing)> = Vec::new();
        // A cluster is shed ahead at most once a window (no longer than the horizon, which is
        // all a forecast confirms); the controller's start counts as a shed, since the last
        // one before it is not remembered: a restart sheds nothing sooner than it would have.
        let ahead_window = self.settings.shed_window.min(Duration::from_secs(
            self.settings.prediction.horizon_seconds.max(0) as u64,
        ));
        let (hot_since, last_shed) = if consolidating {
            (&mut self.over_since, &mut self.last_limit_shed)
        } else {
            (&mut self.hot_since, &mut self.last_shed)
        };
        for (c, f) in self.fleet.clusters().iter().zip(self.fleet.facts()) {
            let last = last_shed.get(&c.name).copied().unwrap_or(self.started);
            if f.known()
                && f.level() <= mark
                && now.duration_since(last) >= ahead_window
                && let Some(x) = f.crossing(
                    wall.unix_seconds(),
                    self.settings.prediction.horizon_seconds,
                    mark,
                    self.settings.shed_window.as_secs() as i64,
                )
            {
                ahead.push((c.name.clone(), x));
            }
            if f.known() && f.level() > mark {
                let since = *hot_since.entry(c.name.clone()).or_insert(now);
                let last = last_shed.get(&c.name).copied();
                if now.duration_since(since) >= self.settings.shed_window
                    && last.is_none_or(|l| now.duration_since(l) >= self.settings.shed_window)
                {
                    due.push(c.name.clone());
                }
            } else {
                hot_since.remove(&c.name);
            }
        }
        let which = |spec: &BindingSpec| !consolidating || spec_consolidates(spec);
        let what = if consolidating {
            "the limit"
        } else {
            "the shed mark"
        };
        for c in due {
            self.last_shed_at(consolidating).insert(c.clone(), now);
            let on = self.most_replicas_on(&c, consolidating, which);
            if on.is_empty() && consolidating {
                continue;
            }
            tracing::info!(cluster = %c, bindings = on.len(), mark, "a cluster above {what} sheds replicas");
            for k in on {
                self.shed.entry(k.clone()).or_default().push(c.clone());
                self.triggers.insert(k.clone(), Trigger::Shed);
                self.enqueue(k, Trigger::Shed);
            }
        }
        for (c, x) in ahead {
            // Of those that judge clusters by their forecast (a placement that looks no time
            // ahead keeps its replicas).
            let default = self.settings.prediction;
            let on = self.most_replicas_on(&c, consolidating, |spec| {
                which(spec)
                    && spec
                        .placement
                        .prediction
                        .as_ref()
                        .is_none_or(|p| !p.resolve(default).is_off())
            });
            if on.is_empty() {
                // The limit's rule looks again a window later, not at every tick.
                if consolidating {
                    self.last_shed_at(consolidating).insert(c.clone(), now);
                }
                continue;
            }
            self.last_shed_at(consolidating).insert(c.clone(), now);
            let outlook = self.outlooks.get(&c);
            let trigger = ForecastTrigger {
                cluster: c.clone(),
                dimension: orrery_scheduler::DIMENSIONS[x.dimension].to_string(),
                level: (x.level * 1000.0).round() / 1000.0,
                forecast: (x.peak * 1000.0).round() / 1000.0,
                crosses_at: Time::from_unix_seconds(x.at).unwrap_or(wall),
                mark,
                basis: Ahead {
                    bound: orrery_api::prediction::Bound::Mean,
                    ..self.settings.prediction
                }
                .describe(),
                model: outlook
                    .map(|o| o.models[x.dimension].clone())
                    .unwrap_or_default(),
                made_at: outlook
                    .and_then(|o| Time::from_unix_seconds(o.time))
                    .unwrap_or(wall),
            };
            tracing::info!(
                cluster = %c,
                bindings = on.len(),
                dimension = %trigger.dimension,
                level = trigger.level,
                forecast = trigger.forecast,
                crosses_at = %trigger.crosses_at,
                mark,
                "a cluster's forecast crosses {what}: replicas move ahead of the peak"
            );
            for k in on {
                self.shed_ahead
                    .entry(k.clone())
                    .or_default()
                    .push(c.clone());
                self.forecast_moves.insert(k.clone(), trigger.clone());
                // A cluster above the mark now says more than one about to cross it.
                if self.triggers.get(&k) != Some(&Trigger::Shed) {
                    self.triggers.insert(k.clone(), Trigger::Forecast);
                }
                self.enqueue(k, Trigger::Forecast);
            }
        }
    }

    /// When each cluster last shed, by the shed mark or (`consolidating`) by the limit.
    pub(super) fn last_shed_at(&mut self, consolidating: bool) -> &mut HashMap<String, Instant> {
        if consolidating {
            &mut self.last_limit_shed
        } else {
            &mut self.last_shed
        }
    }

    /// The bindings a cluster sheds: of those divided by water level that run replicas there
    /// and that `also` keeps, the `shed_per_window` with the most replicas there.
    /// `consolidating`: of the bindings that consolidate only (the others are not read).
    pub(super) fn most_replicas_on(
        &self,
        cluster: &str,
        consolidating: bool,
        also: impl Fn(&BindingSpec) -> bool,
    ) -> Vec<BKey> {
        let bindings: Box<dyn Iterator<Item = (&BKey, &Arc<Object>)>> = if consolidating {
            Box::new((self.consolidators.iter()).filter_map(|k| Some((k, self.bindings.get(k)?))))
        } else {
            Box::new(self.bindings.iter())
        };
        let mut on: Vec<(i64, BKey)> = bindings
            .filter_map(|(k, b)| {
                let spec = BindingSpec::of(b)?;
                let n = spec.clusters.iter().find(|t| t.name == cluster)?.replicas;
                (n > 0 && sheddable(&spec) && also(&spec)).then(|| (n, k.clone()))
            })
            .collect();
        on.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        on.truncate(self.settings.shed_per_window);
        on.into_iter().map(|(_, k)| k).collect()
    }

    /// Marks applications that stayed unhealthy in a cluster past their toleration.
    pub(super) fn check_failover(&mut self) {
        let now = Time::now();
        let mut due = Vec::new();
        for (k, b) in &self.bindings {
            if b.spec.as_ref().is_none_or(|s| s.get("failover").is_none()) {
                continue;
            }
            let Some(spec) = BindingSpec::of(b) else {
                continue;
            };
            let Some(f) = &spec.failover else { continue };
            let tolerate = f
                .decision_conditions
                .toleration_seconds
                .unwrap_or(DEFAULT_FAILOVER_TOLERATION_SECONDS);
            let st = BindingStatus::of(b);
            if st
                .aggregated_status
                .iter()
                .any(|a| unhealthy_for(a, now) >= Some(tolerate))
                && spec
                    .clusters
                    .iter()
                    .any(|c| !spec.evictions.iter().any(|e| e.cluster == c.name))
            {
                due.push(k.clone());
            }
        }
        for k in due {
            self.enqueue(k, Trigger::Failover);
        }
    }
}
