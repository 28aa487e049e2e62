//! The Works: applied to the member as they change, their statuses computed, their
//! deletions owed kept until done, the watch that brings them.

use super::*;

/// Why a Retain could not be run: the member did not give its object, or the script failed.
enum RetainError {
    Member(BackendError),
    Script(String),
}

impl Inner {
    /// The CA bundle the agent trusts: the one learnt from the server (kept in the state),
    /// else the one it was given.
    pub(super) fn trusted_ca(&self) -> String {
        let learnt = self.lock_state().ca_pem.clone();
        if learnt.is_empty() {
            self.cfg.ca_pem.clone().unwrap_or_default()
        } else {
            learnt
        }
    }

    pub(super) fn new(cfg: AgentConfig, backend: Arc<dyn Backend>, state: AgentState) -> Inner {
        Inner {
            cfg,
            backend,
            state: Mutex::new(state),
            state_dirty: AtomicBool::new(true),
            errors: Mutex::new(HashMap::new()),
            errors_seq: std::sync::atomic::AtomicU64::new(0),
            refused: Mutex::new(HashMap::new()),
            retry: Mutex::new(HashSet::new()),
            retain_failed: Mutex::new(HashMap::new()),
            reported: Mutex::new(HashMap::new()),
            computed: Mutex::new(HashMap::new()),
            report_now: Notify::new(),
            urgent: Mutex::new(HashMap::new()),
            round_trips: Mutex::new(std::collections::VecDeque::new()),
            metrics_sent: Mutex::new(None),
            metrics_missing: Mutex::new(None),
            member: tokio::sync::Mutex::new(()),
            current: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// The server URL in use.
    pub(super) fn server(&self) -> String {
        let servers = self.cfg.servers();
        if servers.is_empty() {
            return self.cfg.server.clone();
        }
        servers[self.current.load(Ordering::Acquire) % servers.len()].to_string()
    }

    pub(super) fn lock_state(&self) -> parking_lot::MutexGuard<'_, AgentState> {
        self.state.lock()
    }

    /// The Works last applied, copied out of the lock.
    pub(super) fn works_snapshot(&self) -> Vec<(String, AppliedWork)> {
        self.lock_state()
            .works
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    pub(super) fn mark_dirty(&self) {
        self.state_dirty.store(true, Ordering::Release);
    }

    /// Writes what the control plane decided of the member's own ServiceExports (carried on
    /// the ServiceImports of a services Work) into their status.
    pub(super) async fn write_export_statuses(&self, work: &str) {
        let imports: Vec<Value> = self
            .lock_state()
            .works
            .get(work)
            .map(|w| {
                w.manifests
                    .iter()
                    .filter(|m| {
                        m.get("kind").and_then(Value::as_str)
                            == Some(orrery_api::services::IMPORT_KIND)
                    })
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        for i in imports {
            let Some(status) = i
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(orrery_api::services::ANNOTATION_EXPORT_STATUS))
                .and_then(Value::as_str)
                .and_then(|s| serde_json::from_str::<Value>(s).ok())
            else {
                continue;
            };
            let at = |p: &str| i.pointer(p).and_then(Value::as_str).unwrap_or_default();
            let (ns, name) = (at("/metadata/namespace"), at("/metadata/name"));
            if let Err(e) = self.backend.set_export_status(ns, name, &status).await {
                tracing::warn!(cluster = %self.cfg.cluster, namespace = ns, name, error = %e, "writing a ServiceExport's status failed");
            }
        }
    }

    /// Publishes the imported services' objects, after a change of a Work carrying them.
    pub(super) fn publish_services(&self) {
        let Some(tx) = &self.cfg.services else {
            return;
        };
        let objects: Vec<Value> = self
            .lock_state()
            .works
            .iter()
            .filter(|(name, _)| name.starts_with(SERVICES_WORK_PREFIX))
            .flat_map(|(_, w)| w.manifests.iter().cloned())
            .collect();
        tx.send_if_modified(|cur| {
            if *cur == objects {
                return false;
            }
            *cur = objects;
            true
        });
    }

    pub(super) async fn flush_state(&self) {
        if self.state_dirty.swap(false, Ordering::AcqRel) {
            let snapshot = self.lock_state().clone();
            if let Some(h) = &self.cfg.health {
                h.set_works(snapshot.works.len());
            }
            if let Err(e) = self.cfg.state.save(&snapshot).await {
                tracing::warn!(cluster = %self.cfg.cluster, error = %e, "saving agent state failed");
                self.mark_dirty();
            }
        }
    }

    pub(super) fn namespace(&self) -> String {
        cluster::namespace_of(&self.cfg.cluster)
    }

    /// Why a Work is carried out now.
    pub(super) fn cause(&self, w: &Object, reason: &'static str) -> Cause {
        Cause {
            work: format!("{}/{}", self.namespace(), w.name()),
            uid: w.metadata.uid.clone(),
            generation: w.metadata.generation.unwrap_or(1),
            revision: w.metadata.resource_version.clone(),
            reason,
        }
    }

    /// The cause of applying again what the state file says was applied.
    pub(super) fn applied_cause(&self, name: &str, w: &AppliedWork, reason: &'static str) -> Cause {
        Cause {
            work: format!("{}/{name}", self.namespace()),
            uid: w.uid.clone(),
            generation: w.generation,
            revision: String::new(),
            reason,
        }
    }

    /// Records a Work's apply errors; its status is computed afresh.
    pub(super) fn set_errors(&self, name: String, errors: BTreeMap<usize, String>) {
        self.computed.lock().remove(&name);
        let seq = self.errors_seq.fetch_add(1, Ordering::AcqRel) + 1;
        self.errors.lock().insert(name, (seq, errors));
    }

    /// Which version of a Work's apply errors is recorded (`None`: the Work has none).
    pub(super) fn errors_version(&self, name: &str) -> Option<u64> {
        self.errors.lock().get(name).map(|e| e.0)
    }

    /// Takes the server's copy of a Work's status as what it has, so that only what differs
    /// from it is reported (after a listing, after someone else wrote it).
    pub(super) fn observe_server_status(&self, w: &Object) {
        let mut reported = self.reported.lock();
        match server_status(w) {
            Some(seen) => {
                if reported.get(w.name()).map(|r| r.0) != Some(seen.0) {
                    reported.insert(w.name().to_string(), seen);
                }
            }
            None => {
                reported.remove(w.name());
            }
        }
    }

    /// Applies manifests; returns the errors by ordinal, and whether any was the member
    /// being unavailable (worth retrying). An object of a kind `retention` has a Retain
    /// script for, and that the member has, is applied as `Retain(desired, observed)`; a
    /// failing script leaves the manifest as it is and is kept for the Work's status.
    pub(super) async fn apply_manifests(
        &self,
        work: &str,
        manifests: &[Value],
        overwrite: bool,
        retention: &[Retention],
        cause: &Cause,
    ) -> (BTreeMap<usize, String>, bool) {
        let mut errors = BTreeMap::new();
        let mut unavailable = false;
        let mut failed = Vec::new();
        for (i, m) in manifests.iter().enumerate() {
            let retained = match retention.iter().find(|r| r.applies_to(m)) {
                Some(r) => match self.retained(m, r).await {
                    Ok(v) => Ok(v),
                    Err(RetainError::Member(e)) => Err(e),
                    Err(RetainError::Script(message)) => {
                        failed.push(message);
                        Ok(None)
                    }
                },
                None => Ok(None),
            };
            let applied = match retained {
                Ok(v) => {
                    self.backend
                        .apply(v.as_ref().unwrap_or(m), overwrite, cause)
                        .await
                }
                Err(e) => Err(e),
            };
            if let Err(e) = applied {
                unavailable |= matches!(e, BackendError::Unavailable(_));
                errors.insert(i, e.to_string());
            }
        }
        let mut kept = self.retain_failed.lock();
        if failed.is_empty() {
            kept.remove(work);
        } else {
            tracing::warn!(cluster = %self.cfg.cluster, work = %work, error = %failed[0], "a Retain script failed; the manifest was applied as it is");
            kept.insert(work.to_string(), failed.join("; "));
        }
        (errors, unavailable)
    }

    /// `Retain(desired, observed)` for an object the member has (`None` when it has none:
    /// Karmada retains on updates only). Orrery's label and annotation stay whatever the
    /// script returns, so the object stays Orrery's.
    async fn retained(&self, desired: &Value, r: &Retention) -> Result<Option<Value>, RetainError> {
        let Some(id) = ResourceIdentifier::of(0, desired) else {
            return Ok(None);
        };
        let Some(observed) = self
            .backend
            .observed(&id)
            .await
            .map_err(RetainError::Member)?
        else {
            return Ok(None);
        };
        let (script, want) = (r.lua_script.clone(), desired.clone());
        // A script runs for up to its time limit: off the runtime's threads.
        let out = tokio::task::spawn_blocking(move || {
            orrery_interpreter::Vm::default().retain(&script, &want, &observed)
        })
        .await
        .map_err(|e| RetainError::Script(format!("Retain did not finish: {e}")))?;
        let mut v = out.map_err(|e| {
            RetainError::Script(format!(
                "Retain of ResourceInterpreterCustomization {} failed: {}; the manifest is applied as it is",
                r.customization, e.message
            ))
        })?;
        // `retain` answers an object (it checks its kind), so indexing into it cannot panic.
        for (field, key) in [
            ("labels", work::MANAGED_LABEL),
            ("annotations", work::WORK_ANNOTATION),
        ] {
            let Some(val) = desired.get("metadata").and_then(|m| m.get(field)?.get(key)) else {
                continue;
            };
            if !v.get("metadata").is_some_and(Value::is_object) {
                v["metadata"] = json!({});
            }
            if !v["metadata"].get(field).is_some_and(Value::is_object) {
                v["metadata"][field] = json!({});
            }
            v["metadata"][field][key] = val.clone();
        }
        Ok(Some(v))
    }

    /// Deletes objects owed by [`owe_dropped`]; each is struck off once deleted, and left
    /// to [`Self::retry_deletes`] when the member fails it.
    pub(super) async fn delete_owed(
        &self,
        owed: Vec<(ResourceIdentifier, PendingDelete)>,
        cause: &Cause,
    ) {
        for (id, p) in owed {
            match self.backend.delete(&id, cause).await {
                Ok(()) => {
                    self.lock_state().pending_deletes.retain(|q| q != &p);
                    self.mark_dirty();
                }
                Err(e) => {
                    tracing::warn!(cluster = %self.cfg.cluster, object = %id.describe(), error = %e, "deleting a dropped object failed; it is tried again");
                }
            }
        }
    }

    /// Deletes again what could not be deleted before, unless a Work applies it again now.
    /// Each entry stays owed until its deletion succeeds: a retry cut short (the session
    /// ends while a slow member answers, and this future is dropped) is tried again, not
    /// forgotten with the object still in the member.
    pub(super) async fn retry_deletes(&self) {
        let pending = self.lock_state().pending_deletes.clone();
        if pending.is_empty() {
            return;
        }
        let applied: Vec<ResourceIdentifier> = self
            .lock_state()
            .works
            .values()
            .flat_map(|w| identifiers(&w.manifests).into_iter().flatten())
            .collect();
        for p in pending {
            let settled = match ResourceIdentifier::of(0, &p.manifest) {
                None => true,
                Some(id) if applied.iter().any(|a| same_object(a, &id)) => true,
                Some(id) => {
                    let cause = Cause {
                        work: p.work.clone(),
                        uid: p.uid.clone(),
                        generation: p.generation,
                        revision: p.revision.clone(),
                        reason: "retried: the member was unavailable",
                    };
                    self.backend.delete(&id, &cause).await.is_ok()
                }
            };
            if settled {
                self.lock_state().pending_deletes.retain(|q| q != &p);
                self.mark_dirty();
            }
        }
    }

    /// Brings the member in line with one Work.
    pub(super) async fn apply_work(&self, w: &Object) {
        let name = w.name().to_string();
        let spec: WorkSpec = match w.spec.clone().map(serde_json::from_value).transpose() {
            Ok(s) => s.unwrap_or_default(),
            Err(e) => {
                let mut errs = BTreeMap::new();
                errs.insert(0, format!("the Work's spec is not valid: {e}"));
                self.set_errors(name, errs);
                self.report_now.notify_one();
                return;
            }
        };
        let work_ref = format!("{}/{name}", self.namespace());
        let manifests: Vec<Value> = spec
            .workload
            .manifests
            .iter()
            .map(|m| stamped(m, &work_ref))
            .collect();
        let overwrite = spec.conflict_resolution == ConflictResolution::Overwrite;
        let digest = digest_of(&json!([
            w.metadata.uid,
            manifests,
            overwrite,
            spec.preserve_resources_on_deletion,
            spec.transfers,
        ]));
        // Retain scripts count only where there are some: the digests of Works without any
        // stay what an older agent recorded, so an upgrade applies nothing again.
        let digest = if spec.retention.is_empty() {
            digest
        } else {
            digest_of(&json!([digest, spec.retention]))
        };
        let previous = self.lock_state().works.get(&name).cloned();
        let retrying = self.retry.lock().contains(&name);
        if previous.as_ref().is_some_and(|p| p.digest == digest) && !retrying {
            // Unchanged (typically after a reconnect): nothing to do to the member.
            return;
        }
        let mut cause = self.cause(w, "applied");
        // Transfers first: a target's workload may wait for a copy they start.
        let transfer_error = self
            .backend
            .set_transfers(&name, &spec.transfers)
            .await
            .err();
        let (manifests, held) = if self.copy_pending(&name, &spec.transfers).await {
            (Vec::new(), manifests)
        } else {
            (manifests, Vec::new())
        };
        // Only the transfers changed (a copy round, a fence elsewhere): the member's objects
        // are left alone, and so are the errors they gave.
        let same_objects = !retrying
            && previous.as_ref().is_some_and(|p| {
                p.uid == w.metadata.uid
                    && p.overwrite == overwrite
                    && p.preserve == spec.preserve_resources_on_deletion
                    && p.held == held
                    && p.manifests == manifests
            });
        let (mut errors, mut unavailable) = if same_objects {
            let mut kept = self
                .errors
                .lock()
                .get(&name)
                .map(|(_, e)| e.clone())
                .unwrap_or_default();
            kept.remove(&TRANSFER_ERROR);
            (kept, false)
        } else {
            self.apply_manifests(&name, &manifests, overwrite, &spec.retention, &cause)
                .await
        };
        if let Some(e) = transfer_error {
            unavailable |= matches!(e, BackendError::Unavailable(_));
            errors.insert(TRANSFER_ERROR, format!("volume transfers: {e}"));
        }
        cause.reason = "dropped from the Work";
        let dropped = {
            let mut st = self.lock_state();
            let dropped = previous
                .as_ref()
                .map(|prev| owe_dropped(&mut st, &prev.manifests, &manifests, &cause))
                .unwrap_or_default();
            let applied = AppliedWork {
                uid: w.metadata.uid.clone(),
                generation: w.metadata.generation.unwrap_or(1),
                digest,
                manifests,
                preserve: spec.preserve_resources_on_deletion,
                overwrite,
                transfers: spec.transfers.clone(),
                held,
                retention: spec.retention.clone(),
            };
            st.works.insert(name.clone(), applied);
            dropped
        };
        // A new version of the Work deserves a report of its own, whatever the last met.
        self.refused.lock().remove(&name);
        self.mark_dirty();
        if name.starts_with(SERVICES_WORK_PREFIX) {
            self.publish_services();
            self.write_export_statuses(&name).await;
        }
        self.delete_owed(dropped, &cause).await;
        {
            let mut retry = self.retry.lock();
            if unavailable {
                retry.insert(name.clone());
            } else {
                retry.remove(&name);
            }
        }
        if !errors.is_empty() {
            tracing::warn!(cluster = %self.cfg.cluster, work = %name, errors = errors.len(), first = %errors.values().next().cloned().unwrap_or_default(), "applying a Work failed in part");
        }
        self.set_errors(name, errors);
        self.report_now.notify_one();
    }

    /// Whether one of `transfers` holds the Work's manifests back: a Receive with
    /// `holdWorkload` whose round is not in yet.
    pub(super) async fn copy_pending(&self, name: &str, transfers: &[Transfer]) -> bool {
        if !transfers
            .iter()
            .any(|t| t.role == TransferRole::Receive && t.hold_workload)
        {
            return false;
        }
        let statuses = self.backend.transfer_statuses(name, transfers).await;
        transfers
            .iter()
            .filter(|t| t.role == TransferRole::Receive && t.hold_workload)
            .any(|t| {
                !statuses
                    .iter()
                    .any(|s| s.id == t.id && s.complete && s.round >= t.round)
            })
    }

    /// Whether something must be reported without waiting for the next report slot: a
    /// transfer's milestone since `last_milestone`, or a Work released from a hold whose
    /// workload is not reported healthy yet.
    pub(super) fn urgent(&self, last_milestone: u64) -> bool {
        if self.backend.milestone() != last_milestone {
            return true;
        }
        let mut urgent = self.urgent.lock();
        urgent.retain(|_, since| since.elapsed() < URGENT_FOR);
        !urgent.is_empty()
    }

    /// Applies the manifests of Works that waited for a copy that is now in: the target
    /// starts on the copied data without waiting for the control plane.
    pub(super) async fn release_held(&self) {
        let waiting: Vec<(String, AppliedWork)> = self
            .lock_state()
            .works
            .iter()
            .filter(|(_, w)| !w.held.is_empty())
            .map(|(n, w)| (n.clone(), w.clone()))
            .collect();
        for (name, w) in waiting {
            if self.copy_pending(&name, &w.transfers).await {
                continue;
            }
            let cause = self.applied_cause(&name, &w, "applied: the volume copy is in");
            let (errors, unavailable) = self
                .apply_manifests(&name, &w.held, w.overwrite, &w.retention, &cause)
                .await;
            {
                let mut st = self.lock_state();
                // Unless the Work changed meanwhile (it was applied anew then).
                if let Some(cur) = st.works.get_mut(&name)
                    && cur.digest == w.digest
                {
                    cur.manifests = std::mem::take(&mut cur.held);
                }
            }
            // A status computed while the manifests were held names none of them (same
            // digest, no objects): it is computed afresh, and sent at once whatever a
            // refusal before held back.
            self.computed.lock().remove(&name);
            self.refused.lock().remove(&name);
            self.mark_dirty();
            if unavailable {
                self.retry.lock().insert(name.clone());
            }
            tracing::info!(cluster = %self.cfg.cluster, work = %name, "the volume copy is in: the Work's manifests are applied");
            self.urgent.lock().insert(name.clone(), Instant::now());
            self.set_errors(name, errors);
            self.report_now.notify_one();
        }
    }

    /// Removes a Work's objects from the member (unless it asked to keep them).
    pub(super) async fn remove_work(&self, name: &str, revision: &str, reason: &'static str) {
        let removed = {
            let mut st = self.lock_state();
            st.works.remove(name).map(|old| {
                let cause = Cause {
                    work: format!("{}/{name}", self.namespace()),
                    uid: old.uid.clone(),
                    generation: old.generation,
                    revision: revision.to_string(),
                    reason,
                };
                let dropped = if old.preserve {
                    Vec::new()
                } else {
                    owe_dropped(&mut st, &old.manifests, &[], &cause)
                };
                (dropped, cause)
            })
        };
        if let Some((dropped, cause)) = removed {
            self.mark_dirty();
            if name.starts_with(SERVICES_WORK_PREFIX) {
                self.publish_services();
            }
            self.delete_owed(dropped, &cause).await;
        }
        if let Err(e) = self.backend.set_transfers(name, &[]).await {
            tracing::warn!(cluster = %self.cfg.cluster, work = %name, error = %e, "ending a removed Work's transfers failed");
        }
        self.errors.lock().remove(name);
        self.retry.lock().remove(name);
        self.reported.lock().remove(name);
        self.computed.lock().remove(name);
        self.refused.lock().remove(name);
    }

    /// After a (re)list: apply what changed, remove what is gone, and take the listed
    /// statuses as what the server has (a listing after a broken watch must not make every
    /// Work's status be sent again, with new transition times).
    pub(super) async fn sync_all(&self, works: Vec<Object>) {
        let listed: HashSet<String> = works.iter().map(|w| w.name().to_string()).collect();
        let stale: Vec<String> = self
            .lock_state()
            .works
            .keys()
            .filter(|k| !listed.contains(*k))
            .cloned()
            .collect();
        for name in stale {
            self.remove_work(&name, "", "Work gone when listed again")
                .await;
        }
        for w in &works {
            self.apply_work(w).await;
            self.observe_server_status(w);
        }
        self.report_now.notify_one();
    }

    /// Re-applies what the state file says was applied (a restarted agent with a simulated
    /// member, or a member that lost objects while the agent was away).
    pub(super) async fn resume(&self) {
        self.publish_services();
        let works = self.works_snapshot();
        if works.is_empty() {
            return;
        }
        tracing::info!(cluster = %self.cfg.cluster, works = works.len(), "resuming the Works applied before");
        for (name, w) in works {
            // The member's part in transfers carries on where it is (a member that kept
            // them changes nothing).
            if !w.transfers.is_empty()
                && let Err(e) = self.backend.set_transfers(&name, &w.transfers).await
            {
                tracing::warn!(cluster = %self.cfg.cluster, work = %name, error = %e, "resuming a Work's transfers failed");
            }
            // Only what the member lacks: objects it still has are left as they are, so an
            // agent restart is no operation in a member that kept its objects.
            let mut missing = Vec::new();
            for m in &w.manifests {
                let present = match ResourceIdentifier::of(0, m) {
                    Some(id) => matches!(self.backend.state(&id).await, Ok(Some(_))),
                    None => false,
                };
                if !present {
                    missing.push(m.clone());
                }
            }
            if missing.is_empty() {
                continue;
            }
            let cause = self.applied_cause(&name, &w, "resumed: the member lacked it");
            let (errors, unavailable) = self
                .apply_manifests(&name, &missing, w.overwrite, &w.retention, &cause)
                .await;
            if unavailable {
                self.retry.lock().insert(name.clone());
            }
            self.set_errors(name, errors);
        }
    }

    pub(super) async fn retry_failed(&self) {
        self.retry_deletes().await;
        let names: Vec<String> = self.retry.lock().iter().cloned().collect();
        for name in names {
            let Some(w) = self.lock_state().works.get(&name).cloned() else {
                continue;
            };
            let cause = self.applied_cause(&name, &w, "retried: the member was unavailable");
            // The member's part in the Work's transfers too: a copy round asked for while the
            // member was away starts once it is back (the Work itself does not change).
            let transfer_error = self.backend.set_transfers(&name, &w.transfers).await.err();
            let (mut errors, mut unavailable) = self
                .apply_manifests(&name, &w.manifests, w.overwrite, &w.retention, &cause)
                .await;
            if let Some(e) = transfer_error {
                unavailable |= matches!(e, BackendError::Unavailable(_));
                errors.insert(TRANSFER_ERROR, format!("volume transfers: {e}"));
            }
            if !unavailable {
                self.retry.lock().remove(&name);
            }
            self.set_errors(name, errors);
        }
    }

    /// The status of one Work as the member has it now.
    pub(super) async fn work_status(
        &self,
        name: &str,
        generation: i64,
        ids: Vec<Option<ResourceIdentifier>>,
        now: Time,
    ) -> WorkStatus {
        let errors = self
            .errors
            .lock()
            .get(name)
            .map(|e| e.1.clone())
            .unwrap_or_default();
        let mut statuses = Vec::with_capacity(ids.len());
        // A status the member did not answer for: what it runs is unknown, not refused.
        let mut unread = false;
        for (i, id) in ids.into_iter().enumerate() {
            let Some(id) = id else { continue };
            let mut ms = ManifestStatus {
                identifier: id.clone(),
                ..Default::default()
            };
            if let Some(e) = errors.get(&i) {
                ms.message = e.clone();
            } else {
                match self.backend.state(&id).await {
                    Ok(Some(s)) => {
                        ms.applied = true;
                        ms.health = s.health;
                        ms.status = s.status;
                        ms.generation = s.generation;
                        ms.message = s.message;
                        ms.volumes = s.volumes;
                        ms.usage = s.usage;
                        ms.endpoints = s.endpoints;
                        ms.restarts = s.restarts;
                    }
                    Ok(None) => ms.message = "not present in the member".into(),
                    Err(e) => {
                        unread |= matches!(e, BackendError::Unavailable(_));
                        ms.message = e.to_string();
                    }
                }
            }
            statuses.push(ms);
        }
        let all_applied = statuses.iter().all(|s| s.applied) && errors.is_empty();
        let mut conds = self
            .reported
            .lock()
            .get(name)
            .map(|(_, c)| c.clone())
            .unwrap_or_default();
        let applied = if all_applied {
            Condition::new(
                work::CONDITION_APPLIED,
                conditions::TRUE,
                "AppliedSuccessful",
                "every manifest is applied",
            )
        } else {
            let first = errors.get(&TRANSFER_ERROR).cloned().or_else(|| {
                statuses
                    .iter()
                    .find(|s| !s.applied)
                    .map(|s| format!("{}: {}", s.identifier.describe(), s.message))
            });
            // Failed because the member did not answer (the Work is retried once it does):
            // not a refusal, and whatever it ran before may still run there. A move must not
            // take it for the target refusing the workload and start the source again.
            let unavailable = unread || self.retry.lock().contains(name);
            Condition::new(
                work::CONDITION_APPLIED,
                conditions::FALSE,
                if unavailable {
                    work::REASON_MEMBER_UNAVAILABLE
                } else {
                    work::REASON_APPLIED_FAILED
                },
                first.unwrap_or_default(),
            )
        };
        conditions::set(&mut conds, applied, now);
        match self.retain_failed.lock().get(name) {
            Some(why) => {
                let c = Condition::new(
                    work::CONDITION_RETAINED,
                    conditions::FALSE,
                    work::REASON_INTERPRET_FAILED,
                    why.clone(),
                );
                conditions::set(&mut conds, c, now);
            }
            None => {
                conds.retain(|c| c.type_ != work::CONDITION_RETAINED);
            }
        }
        let available = if statuses.iter().any(|s| s.health == Health::Unhealthy) {
            let first = statuses
                .iter()
                .find(|s| s.health == Health::Unhealthy)
                .map(|s| format!("{}: {}", s.identifier.describe(), s.message));
            Condition::new(
                work::CONDITION_AVAILABLE,
                conditions::FALSE,
                "Unhealthy",
                first.unwrap_or_default(),
            )
        } else if all_applied && statuses.iter().all(|s| s.health == Health::Healthy) {
            Condition::new(
                work::CONDITION_AVAILABLE,
                conditions::TRUE,
                "AllHealthy",
                "every manifest is healthy",
            )
        } else {
            Condition::new(
                work::CONDITION_AVAILABLE,
                conditions::FALSE,
                "Progressing",
                "not every manifest is healthy yet",
            )
        };
        conditions::set(&mut conds, available, now);
        let transfers = match self.lock_state().works.get(name) {
            Some(w) if !w.transfers.is_empty() => w.transfers.clone(),
            _ => Vec::new(),
        };
        let transfers = if transfers.is_empty() {
            Vec::new()
        } else {
            self.backend.transfer_statuses(name, &transfers).await
        };
        WorkStatus {
            conditions: conds,
            manifest_statuses: statuses,
            observed_generation: Some(generation),
            transfers,
        }
    }

    /// Status items of the Works whose status differs from what the server has. A Work is
    /// read again only if it, its apply errors or the backend's stamp of one of its objects
    /// changed since last time, or with `everything` (the periodic resync).
    pub(super) async fn changed_statuses(
        &self,
        everything: bool,
    ) -> Vec<(String, u64, Vec<Condition>, Value)> {
        let works: Vec<(String, String, i64)> = self
            .lock_state()
            .works
            .iter()
            .map(|(k, v)| (k.clone(), v.digest.clone(), v.generation))
            .collect();
        // Which Works need reading: cheap checks under the locks, no awaits.
        let todo: Vec<Stale> = {
            let computed = self.computed.lock();
            let reported = self.reported.lock();
            let refused = self.refused.lock();
            works
                .into_iter()
                .filter_map(|(name, digest, generation)| {
                    if refused
                        .get(&name)
                        .is_some_and(|(t, hold)| t.elapsed() < *hold)
                    {
                        return None;
                    }
                    let c = computed.get(&name);
                    let same = !everything
                        && c.is_some_and(|c| {
                            c.still(self.backend.as_ref(), &digest, generation)
                                && reported.get(&name).map(|r| r.0) == Some(c.status)
                        });
                    if same {
                        return None;
                    }
                    let ids = c.filter(|c| c.digest == digest).map(|c| c.ids.clone());
                    Some(Stale {
                        name,
                        digest,
                        generation,
                        ids,
                    })
                })
                .collect()
        };
        let now = Time::now();
        let mut out = Vec::new();
        for Stale {
            name,
            digest,
            generation,
            ids,
        } in todo
        {
            let ids = match ids {
                Some(ids) => ids,
                None => match self.lock_state().works.get(&name) {
                    Some(w) => identifiers(&w.manifests),
                    None => continue,
                },
            };
            // Stamps and the errors' version before reading: a change during the read (the
            // reads await) shows next time.
            let stamps: Vec<Option<u64>> = ids
                .iter()
                .map(|id| id.as_ref().and_then(|id| self.backend.state_stamp(id)))
                .collect();
            let has_transfers = self
                .lock_state()
                .works
                .get(&name)
                .is_some_and(|w| !w.transfers.is_empty());
            let transfer_stamp = has_transfers.then(|| self.backend.transfer_stamp());
            let errors = self.errors_version(&name);
            let status = self.work_status(&name, generation, ids.clone(), now).await;
            let h = status_digest(&status);
            let still_there = self.lock_state().works.contains_key(&name);
            if still_there && self.errors_version(&name) == errors {
                self.computed.lock().insert(
                    name.clone(),
                    Computed {
                        digest,
                        generation,
                        ids,
                        stamps,
                        transfers: transfer_stamp,
                        status: h,
                    },
                );
            }
            let same = self
                .reported
                .lock()
                .get(&name)
                .is_some_and(|(d, _)| *d == h);
            if !same {
                let item = json!({
                    "kind": "Work",
                    "namespace": self.namespace(),
                    "name": name,
                    "status": serde_json::to_value(&status).unwrap_or_default(),
                });
                out.push((name, h, status.conditions, item));
            }
        }
        out
    }

    /// Removes everything applied (the cluster was unregistered) and forgets the state.
    pub(super) async fn forget_everything(&self) {
        let _member = self.member.lock().await;
        let names: Vec<String> = self.lock_state().works.keys().cloned().collect();
        for n in names {
            self.remove_work(&n, "", "cluster unregistered").await;
        }
        self.cfg.state.remove().await;
    }
}

pub(super) async fn works_loop(inner: &Inner, t: &Transport) -> End {
    loop {
        let (items, mut rv) = match t.list_works().await {
            Ok(x) => x,
            Err(e) => return e.into(),
        };
        {
            let _member = inner.member.lock().await;
            inner.sync_all(items).await;
        }
        inner.flush_state().await;
        loop {
            let stream = match t.watch_works(&rv).await {
                Ok(s) => s,
                Err(TransportError::Expired(_)) => break,
                Err(e) => return e.into(),
            };
            tokio::pin!(stream);
            let mut expired = false;
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(WorkEvent::Applied(w)) => {
                        rv = w.metadata.resource_version.clone();
                        let _member = inner.member.lock().await;
                        inner.apply_work(&w).await;
                        inner.observe_server_status(&w);
                    }
                    Ok(WorkEvent::Deleted(w)) => {
                        rv = w.metadata.resource_version.clone();
                        let _member = inner.member.lock().await;
                        inner
                            .remove_work(w.name(), &w.metadata.resource_version, "Work deleted")
                            .await;
                        inner.report_now.notify_one();
                    }
                    Ok(WorkEvent::Bookmark(r)) => rv = r,
                    Err(TransportError::Expired(_)) => {
                        expired = true;
                        break;
                    }
                    Err(e) => return e.into(),
                }
            }
            if expired {
                break;
            }
            // The server ended the watch (its timeout): watch again from where it stopped.
        }
    }
}
