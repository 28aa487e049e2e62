//! What the scheduler takes in from its sources: the fleet from Clusters (and their Leases,
//! which vouch for the figures last reported), the bindings, forecasts, migrations, data sets
//! and transfers; and which bindings each change wakes.

use super::*;

impl Scheduler {
    pub(super) fn refresh_assumed(&mut self, clusters: &[String]) {
        for c in clusters {
            let t = self.assume.total(c);
            self.fleet.set_assumed(c, t);
        }
    }

    /// Counts what a binding has placed as assumed (at start).
    pub(super) fn load_assumed(&mut self, k: &BKey, b: &Object, now: u64) -> Vec<String> {
        let Some(spec) = BindingSpec::of(b) else {
            return Vec::new();
        };
        if spec.clusters.is_empty() || spec.resource.is_task() {
            return Vec::new();
        }
        let request = spec
            .replica_requirements
            .as_ref()
            .map(|r| r.resource_request.clone())
            .unwrap_or_default();
        let bkey = format!("{}/{}", k.0, k.1);
        let changed = self.assume.load(
            &bkey,
            demand_of(&request),
            &spec.clusters,
            orrery_api::interpret::counts_pods(&spec.resource.kind),
            now,
        );
        self.observe_pods(k, b);
        changed
    }

    /// Takes in the pods the members report for a binding's workload, while some of its
    /// replicas are assumed.
    pub(super) fn observe_pods(&mut self, k: &BKey, b: &Object) {
        let bkey = format!("{}/{}", k.0, k.1);
        if !self.assume.has(&bkey) {
            return;
        }
        let kind = b
            .spec
            .as_ref()
            .and_then(|s| s.get("resource"))
            .and_then(|r| r.get("kind"))
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default()
            .to_string();
        let now = self.now_ms();
        for item in BindingStatus::of(b).aggregated_status {
            if let Some(pods) = item
                .status
                .as_ref()
                .and_then(|st| orrery_api::interpret::pods_reported(&kind, st))
            {
                self.assume.observe(&bkey, &item.cluster_name, pods, now);
            }
        }
    }

    /// The member of `cluster` reported figures measured at `at` (a status write, or a Lease
    /// renewal vouching for the last one): assumptions they include are confirmed.
    pub(super) fn reported(&mut self, cluster: &str, at: MicroTime) {
        if self.heartbeats.get(cluster).is_some_and(|old| *old >= at) {
            return;
        }
        self.heartbeats.insert(cluster.to_string(), at);
        // Heartbeat times are wall-clock; assumptions are stamped on our monotonic clock:
        // compare by age (a time ahead of ours counts as now).
        let age_ms = MicroTime::now().millis_since(at).max(0) as u64;
        let measured = self.now_ms().saturating_sub(age_ms);
        let confirmed = self.assume.confirm(
            cluster,
            measured,
            ASSUME_MARGIN.as_millis() as u64,
            self.settings.assume_settle.as_millis() as u64,
        );
        if !confirmed.is_empty() {
            self.refresh_assumed(&confirmed);
            self.room_changed();
        }
    }

    /// A Cluster changed: the fleet the engine reads, and a decision for every binding when a
    /// fact placement depends on changed.
    pub(super) fn on_cluster(&mut self, ev: Event) {
        // Whether a fact placement depends on changed, and whether a cluster came
        // back to Ready.
        let (changed, recovered) = match ev {
            Event::Listed(items) => {
                let snaps: Vec<ClusterSnapshot> = items
                    .iter()
                    .map(|c| self.with_bookings(ClusterSnapshot::of(c)))
                    .collect();
                self.prints = snaps
                    .iter()
                    .map(|s| (s.name.clone(), fingerprint(s)))
                    .collect();
                self.fleet = Fleet::new(snaps);
                let names: Vec<String> = self.prints.keys().cloned().collect();
                self.refresh_assumed(&names);
                for n in &names {
                    self.fleet.set_outlook(n, self.outlooks.get(n).cloned());
                }
                self.room_changed();
                (true, false)
            }
            Event::Upsert(c) => {
                let s = self.with_bookings(ClusterSnapshot::of(&c));
                // Read alone: parsing the whole status again cost more.
                let hb = c.status.as_ref().and_then(|st| {
                    st.get("lastHeartbeatTime")?
                        .as_str()?
                        .parse::<MicroTime>()
                        .ok()
                });
                if let Some(rv) = c.revision() {
                    self.cluster_revisions.insert(c.name().to_string(), rv);
                }
                let name = s.name.clone();
                // Back to Ready is not enough: the health controller lifts its taints
                // in a later update, and a placement decided before that still passes
                // the cluster over.
                let was_serving = self.fleet.get(&name).is_some_and(serving);
                let recovered = serving(&s) && !was_serving;
                let print = fingerprint(&s);
                let changed = self.prints.insert(name.clone(), print) != Some(print);
                if self.fleet.get(&name).is_none_or(|old| {
                    (
                        &old.allocatable,
                        &old.allocated,
                        &old.usage,
                        &old.largest_node_free,
                    ) != (&s.allocatable, &s.allocated, &s.usage, &s.largest_node_free)
                }) {
                    self.room_changed();
                }
                self.fleet.upsert(s);
                // A cluster new to the fleet gets the forecast that came before it.
                self.fleet
                    .set_outlook(&name, self.outlooks.get(&name).cloned());
                if let Some(hb) = hb {
                    self.reported(&name, hb);
                }
                (changed, recovered)
            }
            Event::Delete(c) => {
                self.fleet.remove(c.name());
                self.prints.remove(c.name());
                self.heartbeats.remove(c.name());
                self.cluster_revisions.remove(c.name());
                (true, false)
            }
        };
        if changed {
            self.backoff.clear();
            self.enqueue_all(if recovered && self.bindings_listed {
                Trigger::Recovered
            } else {
                Trigger::ClustersChanged
            });
        }
    }

    /// A member's Lease was renewed: the figures it last reported are vouched for.
    pub(super) fn on_lease(&mut self, ev: Event) {
        let leases = match ev {
            Event::Listed(items) => items,
            Event::Upsert(l) => vec![l],
            Event::Delete(_) => Vec::new(),
        };
        for l in leases {
            let beat = orrery_api::cluster::LeaseBeat::of(&l);
            // Only a renewal over the status this scheduler has seen vouches for
            // figures it holds (the Lease's watch may run ahead of the Clusters').
            if let (Some(renew), Some(rev)) = (beat.renew_time, beat.status_revision)
                && self
                    .cluster_revisions
                    .get(l.name())
                    .is_some_and(|seen| *seen >= rev)
            {
                self.reported(l.name(), renew);
            }
        }
    }

    /// A binding changed: kept, and decided again.
    pub(super) fn on_binding(&mut self, ev: Event) {
        match ev {
            Event::Listed(items) => {
                self.bindings.clear();
                // Everything is loaded and queued afresh: what was in flight is
                // assumed again from what the store holds.
                self.in_flight.clear();
                self.deferred.clear();
                self.consolidators.clear();
                self.moves.clear();
                self.graph.clear_bindings();
                let now = self.now_ms();
                let mut touched = Vec::new();
                for b in items {
                    let k = key_of(&b);
                    if let Some(t) = earliest_move(&b) {
                        self.moves.insert(k.clone(), t);
                    }
                    // What is placed now counts as assumed until the members' figures
                    // are known to include it (nothing is known of that at start).
                    touched.extend(self.load_assumed(&k, &b, now));
                    // A binding that found no room before is tried again: its generation
                    // is already observed, and when to retry it was not kept (without
                    // this, a partial placement decided just before a restart stayed
                    // partial however much room was made).
                    let why = if found_no_room(&b) {
                        Trigger::Retry
                    } else {
                        Trigger::Binding
                    };
                    self.graph.put(&k, Some(&b));
                    if consolidates(&b) {
                        self.consolidators.insert(k.clone());
                    }
                    self.bindings.insert(k.clone(), b);
                    self.enqueue(k, why);
                }
                let bindings = &self.bindings;
                self.consolidating.retain(|k| bindings.contains_key(k));
                self.refresh_assumed(&touched);
                self.bindings_listed = true;
            }
            Event::Upsert(b) => {
                let k = key_of(&b);
                match earliest_move(&b) {
                    Some(t) => self.moves.insert(k.clone(), t),
                    None => self.moves.remove(&k),
                };
                self.observe_pods(&k, &b);
                let served = self.bindings.get(&k).map(|old| self.graph.serving(old));
                self.graph.put(&k, Some(&b));
                let moved = served.is_some_and(|s| s != self.graph.serving(&b));
                if consolidates(&b) {
                    self.consolidators.insert(k.clone());
                } else {
                    self.consolidators.remove(&k);
                }
                for w in self.quota.on_binding(&k, Some(&b)) {
                    self.enqueue(w, Trigger::Binding);
                }
                self.bindings.insert(k.clone(), b);
                self.enqueue(k.clone(), Trigger::Binding);
                if moved {
                    self.enqueue_dependents(&k);
                }
            }
            Event::Delete(b) => {
                let k = key_of(&b);
                for w in self.quota.on_binding(&k, None) {
                    self.enqueue(w, Trigger::Binding);
                }
                self.graph.put(&k, None);
                self.enqueue_dependents(&k);
                self.bindings.remove(&k);
                self.consolidators.remove(&k);
                self.consolidating.remove(&k);
                self.moves.remove(&k);
                self.forecast_moves.remove(&k);
                self.shed.remove(&k);
                self.shed_ahead.remove(&k);
                self.unplaced.remove(&k);
                self.backoff.reset(&k);
                self.in_flight.remove(&k);
                self.deferred.remove(&k);
                let changed = self.assume.forget(&format!("{}/{}", k.0, k.1));
                if !changed.is_empty() {
                    self.refresh_assumed(&changed);
                    self.room_changed();
                }
            }
        }
    }

    /// A cluster's forecast was made (or went with its cluster): decisions from now on read
    /// it, and bindings waiting for room may find some (nothing else is decided again).
    pub(super) fn on_forecast(&mut self, ev: Event) {
        let outlook = |o: &Object| -> Option<(String, Arc<Outlook>)> {
            let f: orrery_api::history::series::ClusterForecast =
                serde_json::from_value(o.spec.clone()?).ok()?;
            Some((f.cluster.clone(), Arc::new(Outlook::of(&f)?)))
        };
        match ev {
            Event::Listed(items) => {
                self.outlooks = items.iter().filter_map(|o| outlook(o)).collect();
                let names: Vec<String> = self
                    .fleet
                    .clusters()
                    .iter()
                    .map(|c| c.name.clone())
                    .collect();
                for n in names {
                    self.fleet.set_outlook(&n, self.outlooks.get(&n).cloned());
                }
            }
            Event::Upsert(o) => match outlook(&o) {
                Some((name, out)) => {
                    self.fleet.set_outlook(&name, Some(out.clone()));
                    self.outlooks.insert(name, out);
                }
                None => {
                    self.outlooks.remove(o.name());
                    self.fleet.set_outlook(o.name(), None);
                }
            },
            Event::Delete(o) => {
                self.outlooks.remove(o.name());
                self.fleet.set_outlook(o.name(), None);
            }
        }
        self.room_changed();
    }

    /// A data set copy started, progressed or ended: the links it books are the fleet's
    /// `busy_*_seconds` for the next decisions (nothing is decided again for it).
    pub(super) fn on_transfer(&mut self, ev: Event) {
        let booking = |t: &Object| -> Option<(String, String, f64)> {
            let st = orrery_api::data::DataTransferStatus::of(t);
            if st.phase != orrery_api::data::TransferPhase::Copying {
                return None;
            }
            let dest = t.spec.as_ref()?.get("destination")?.as_str()?.to_string();
            Some((st.source, dest, (st.bytes - st.copied_bytes).max(0) as f64))
        };
        let mut touched: Vec<String> = Vec::new();
        let mut put = |s: &mut Scheduler, k: (String, String), b: Option<(String, String, f64)>| {
            let old = match b {
                Some(b) => {
                    touched.extend([b.0.clone(), b.1.clone()]);
                    s.booked.insert(k, b)
                }
                None => s.booked.remove(&k),
            };
            if let Some(o) = old {
                touched.extend([o.0, o.1]);
            }
        };
        match ev {
            Event::Listed(items) => {
                let keys: Vec<(String, String)> = self.booked.keys().cloned().collect();
                for k in keys {
                    put(self, k, None);
                }
                for t in &items {
                    put(
                        self,
                        (t.namespace().to_string(), t.name().to_string()),
                        booking(t),
                    );
                }
            }
            Event::Upsert(t) => {
                put(
                    self,
                    (t.namespace().to_string(), t.name().to_string()),
                    booking(&t),
                );
            }
            Event::Delete(t) => put(
                self,
                (t.namespace().to_string(), t.name().to_string()),
                None,
            ),
        }
        touched.sort();
        touched.dedup();
        for name in touched {
            if let Some(c) = self.fleet.get(&name).cloned() {
                let c = self.with_bookings(c);
                self.fleet.upsert(c);
            }
        }
    }

    /// A cluster's snapshot with the seconds its link needs for the copies booked on it.
    pub(super) fn with_bookings(&self, mut c: ClusterSnapshot) -> ClusterSnapshot {
        let bandwidth = c
            .bandwidth
            .filter(|b| *b > 0)
            .map_or(orrery_scheduler::data::DEFAULT_BANDWIDTH, |b| b as f64);
        let (mut out, mut inn) = (0.0, 0.0);
        for (source, dest, bytes) in self.booked.values() {
            if *source == c.name {
                out += bytes;
            }
            if *dest == c.name {
                inn += bytes;
            }
        }
        c.busy_out_seconds = out / bandwidth;
        c.busy_in_seconds = inn / bandwidth;
        c
    }

    /// A data set changed: the workloads reading it are decided again (those placed stay
    /// where they are unless a filter now turns their cluster away).
    pub(super) fn on_dataset(&mut self, ev: Event) {
        let changed: Vec<(String, String)> = match ev {
            Event::Listed(items) => {
                self.datasets.clear();
                for d in &items {
                    self.datasets.put(d);
                }
                return;
            }
            Event::Upsert(d) => {
                if !self.datasets.put(&d) {
                    return;
                }
                vec![(d.namespace().to_string(), d.name().to_string())]
            }
            Event::Delete(d) => {
                let k = (d.namespace().to_string(), d.name().to_string());
                self.datasets.remove(&k);
                vec![k]
            }
        };
        let readers: Vec<BKey> = self
            .bindings
            .iter()
            .filter(|(k, b)| {
                BindingSpec::of(b).is_some_and(|s| {
                    changed
                        .iter()
                        .any(|(ns, n)| *ns == k.0 && s.data.datasets.contains(n))
                })
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in readers {
            self.triggers.insert(k.clone(), Trigger::DataChanged);
            self.enqueue(k, Trigger::DataChanged);
        }
    }

    /// The workloads whose decisions depend on where `k` serves are decided again.
    pub(super) fn enqueue_dependents(&mut self, k: &BKey) {
        for d in self.graph.dependents(k) {
            self.triggers.insert(d.clone(), Trigger::LeaderMoved);
            self.enqueue(d, Trigger::LeaderMoved);
        }
    }

    pub(super) fn on_migration(&mut self, ev: Event) {
        let put = |s: &mut Scheduler, m: &Object| {
            let mk = (m.namespace().to_string(), m.name().to_string());
            let mut state = crate::propagation::stateful::MoveState::of(m);
            if state.binding.is_empty()
                && let Ok(spec) = orrery_api::stateful::migration_spec(m.spec.as_ref())
            {
                state.binding = binding::name_for(&spec.resource.kind, &spec.resource.name);
            }
            let bk = (mk.0.clone(), state.binding.clone());
            use orrery_api::stateful::MigrationPhase;
            let serves_at_target = |p: MigrationPhase| p >= MigrationPhase::Switching;
            // Where the workload serves changed (or a move first seen serves already).
            let crossed = match s.graph.migrations.get(&mk) {
                Some(old) => {
                    serves_at_target(old.phase) != serves_at_target(state.phase)
                        || old.phase.is_done() != state.phase.is_done()
                }
                None => serves_at_target(state.phase),
            };
            let needs_target = state.needs_target;
            s.graph.migrations.insert(mk.clone(), state);
            if crossed {
                // What follows it decides again, and so does the binding itself once its
                // move is over.
                s.enqueue_dependents(&bk);
                s.triggers.insert(bk.clone(), Trigger::MoveDone);
                s.enqueue(bk.clone(), Trigger::MoveDone);
            }
            if needs_target {
                s.user_moves.insert(bk.clone(), Arc::new(m.clone()));
                s.triggers.insert(bk.clone(), Trigger::UserMove);
                s.enqueue(bk, Trigger::UserMove);
            } else if s.user_moves.get(&bk).is_some_and(|u| u.name() == mk.1) {
                s.user_moves.remove(&bk);
            }
        };
        match ev {
            Event::Listed(items) => {
                self.graph.migrations.clear();
                for m in &items {
                    put(self, m);
                }
            }
            Event::Upsert(m) => put(self, &m),
            Event::Delete(m) => {
                let mk = (m.namespace().to_string(), m.name().to_string());
                if let Some(state) = self.graph.migrations.remove(&mk) {
                    let bk = (mk.0.clone(), state.binding);
                    if self.user_moves.get(&bk).is_some_and(|u| u.name() == mk.1) {
                        self.user_moves.remove(&bk);
                    }
                    self.enqueue_dependents(&bk);
                    self.triggers.insert(bk.clone(), Trigger::MoveDone);
                    self.enqueue(bk, Trigger::MoveDone);
                }
            }
        }
    }
}
