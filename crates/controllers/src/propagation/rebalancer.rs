//! Karmada's WorkloadRebalancer: each workload it names has its binding asked once for a
//! fresh decision, by the binding's reschedule annotation (what `POST /api/v1/bindings`
//! sets). The scheduler then divides it afresh, within the water levels and its move budget.
//!
//! The request's value is the rebalancer's creation time, as Karmada's
//! `rescheduleTriggeredAt`: a binding asked at or after that time (by this rebalancer before a
//! restart, or by a newer request) is not asked again, so restarts and retries move nothing.
//! A workload with a result (`Successful`, or `Failed` when no binding places it) is not
//! looked at again; `ttlSecondsAfterFinished` deletes the rebalancer that long after the
//! last result.

use std::sync::Arc;
use std::time::Duration;

use orrery_api::binding::{self, RESCHEDULE_ANNOTATION, SYSTEM_NAMESPACE};
use orrery_api::kinds::{RESOURCE_BINDING, WORKLOAD_REBALANCER};
use orrery_api::rebalancer::{
    self as r, WorkloadRebalancerSpec, WorkloadRebalancerStatus, WorkloadReference,
};
use orrery_api::{Object, Time};
use orrery_store::{Preconditions, Store, StoreError, update_with};
use tokio::sync::watch;

use crate::runtime::cache::Cache;
use crate::runtime::controller::{Action, Controller, Keys, Origin, Reconciler, Source};
use crate::runtime::metrics::Handle;
use crate::runtime::reflector::Event;

/// Whether a binding asked at `asked` (its annotation) should be asked again for a request
/// made at `at`: not if it was asked then or later.
pub fn needs_asking(asked: Option<&str>, at: Time) -> bool {
    match asked.map(str::parse::<jiff::Timestamp>) {
        Some(Ok(t)) => t < at.0,
        // Never asked, or asked with a value that is no time: this request is newer.
        _ => true,
    }
}

/// Asks the workload's binding for a fresh decision, unless it was asked since `at`.
async fn ask(store: &dyn Store, w: &WorkloadReference, at: Time) -> Result<(), StoreError> {
    let ns = if w.namespace.is_empty() {
        SYSTEM_NAMESPACE
    } else {
        w.namespace.as_str()
    };
    let key = RESOURCE_BINDING.key(ns, &binding::name_for(&w.kind, &w.name));
    let stamp = at.to_string();
    update_with(store, &key, |b| {
        let asked = b.metadata.annotations.get(RESCHEDULE_ANNOTATION);
        if !needs_asking(asked.map(String::as_str), at) {
            return Ok(None);
        }
        let mut next = b;
        next.metadata
            .annotations
            .insert(RESCHEDULE_ANNOTATION.to_string(), stamp.clone());
        Ok(Some(next))
    })
    .await
    .map(|_| ())
}

struct Rebalancer {
    store: Arc<dyn Store>,
    objects: Arc<Cache>,
}

impl Rebalancer {
    /// One pass; `Err` when a workload could not be asked and must be tried again.
    async fn pass(&self, o: &Object) -> Result<Action, StoreError> {
        let Some(spec) = o
            .spec
            .as_ref()
            .and_then(|s| serde_json::from_value::<WorkloadRebalancerSpec>(s.clone()).ok())
        else {
            return Ok(Action::Done);
        };
        let status: WorkloadRebalancerStatus = o
            .status
            .clone()
            .and_then(|s| serde_json::from_value(s).ok())
            .unwrap_or_default();
        let at = o.metadata.creation_timestamp.unwrap_or_else(Time::now);
        let mut observed = r::observe(&spec, &status);
        let mut failed: Option<StoreError> = None;
        for item in observed.iter_mut().filter(|i| i.result.is_empty()) {
            match ask(self.store.as_ref(), &item.workload, at).await {
                Ok(()) => item.result = r::RESULT_SUCCESSFUL.into(),
                Err(StoreError::NotFound { .. }) => {
                    item.result = r::RESULT_FAILED.into();
                    item.reason = r::REASON_BINDING_NOT_FOUND.into();
                }
                Err(e) => {
                    tracing::warn!(rebalancer = %o.name(), workload = %item.workload.name, error = %e, "asking for a fresh decision failed; tried again");
                    failed = Some(e);
                }
            }
        }
        let mut next = WorkloadRebalancerStatus {
            observed_workloads: observed,
            observed_generation: o.metadata.generation.unwrap_or(1),
            finish_time: status.finish_time,
        };
        if next != status && failed.is_none() {
            next.finish_time = Some(Time::now());
        }
        if next != status {
            let key = WORKLOAD_REBALANCER.key("", o.name());
            let mut obj = o.clone();
            obj.status = serde_json::to_value(&next).ok();
            // Against the version read: a change meanwhile is a new pass (asking is
            // idempotent, so nothing is asked twice).
            match self.store.update(&key, obj, o.revision()).await {
                Ok(_) | Err(StoreError::NotFound { .. }) => {}
                Err(StoreError::Conflict { .. }) => return Ok(Action::After(Duration::ZERO)),
                Err(e) => return Err(e),
            }
            tracing::info!(rebalancer = %o.name(), workloads = next.observed_workloads.len(), "workloads asked for a fresh division");
            // The status write comes back as an event: the TTL is handled on that pass.
            return failed.map_or(Ok(Action::Done), Err);
        }
        if let Some(e) = failed {
            return Err(e);
        }
        let (Some(ttl), Some(finished)) = (spec.ttl_seconds_after_finished, next.finish_time)
        else {
            return Ok(Action::Done);
        };
        let expires = finished.add_seconds(i64::from(ttl.max(0)));
        let left = expires.seconds_since(Time::now());
        if left > 0 {
            return Ok(Action::After(Duration::from_secs(left as u64)));
        }
        let pre = Preconditions {
            uid: None,
            revision: o.revision(),
        };
        match self
            .store
            .delete(&WORKLOAD_REBALANCER.key("", o.name()), &pre)
            .await
        {
            Ok(_) | Err(StoreError::NotFound { .. }) | Err(StoreError::Conflict { .. }) => {
                Ok(Action::Done)
            }
            Err(e) => Err(e),
        }
    }
}

#[async_trait::async_trait]
impl Reconciler for Rebalancer {
    /// A rebalancer's name (cluster-scoped).
    type Key = String;
    type Error = StoreError;

    fn on_event(&mut self, _: Origin, ev: Event, keys: &mut Keys<Self::Key>) {
        match ev {
            Event::Listed(_) => keys.all(),
            Event::Upsert(o) => keys.push(o.name().to_string()),
            Event::Delete(_) => {}
        }
    }

    fn all_keys(&self) -> Vec<Self::Key> {
        self.objects
            .list()
            .iter()
            .map(|o| o.name().to_string())
            .collect()
    }

    async fn reconcile(&self, name: &Self::Key) -> Result<Action, StoreError> {
        let Some(o) = self.objects.get("", name) else {
            return Ok(Action::Done);
        };
        if o.metadata.deletion_timestamp.is_some() {
            return Ok(Action::Done);
        }
        self.pass(&o).await
    }
}

/// Runs the WorkloadRebalancers until shutdown.
pub async fn run(store: Arc<dyn Store>, metrics: Handle, shutdown: watch::Receiver<bool>) {
    let objects = Arc::new(Cache::new(&[]));
    let r = Rebalancer {
        store: store.clone(),
        objects: objects.clone(),
    };
    Controller::new("rebalancer", store, r, metrics)
        .source(Source::new("rebalancer", WORKLOAD_REBALANCER.prefix(None)).cached(objects))
        .run(shutdown)
        .await;
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn t(s: &str) -> Time {
        Time(s.parse().unwrap())
    }

    #[test]
    fn a_binding_is_asked_once_per_newer_request() {
        let at = t("2026-12-03T10:00:00Z");
        assert!(needs_asking(None, at));
        assert!(needs_asking(Some("2026-12-03T09:59:59Z"), at));
        assert!(
            !needs_asking(Some("2026-12-03T10:00:00Z"), at),
            "asked by this one"
        );
        assert!(
            !needs_asking(Some("2026-12-03T10:00:00.5Z"), at),
            "asked since by a newer request"
        );
        assert!(needs_asking(Some("soon"), at));
    }
}
