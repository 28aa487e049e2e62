//! Karmada's CronFederatedHPA: each rule sets its workload template's replicas at the times
//! its schedule names, in its time zone; the scheduler then divides the change among the
//! clusters as the template's placement says. Executions are recorded in status, newest
//! first, as many as the rule keeps.
//!
//! Restart safety: a rule's next time is kept in status. A time that passed while the server
//! was down runs once when it comes back, if no more than [`CATCH_UP`] late (setting replicas is
//! idempotent: running it twice changes nothing); a later one is recorded as missed, not run.
//! A new or changed rule starts from now: nothing runs for a time before it existed.

use std::sync::Arc;
use std::time::Duration;

use orrery_api::autoscaling::{
    self as a, CronFederatedHPARule, CronFederatedHPASpec, CronFederatedHPAStatus,
    ExecutionHistory, FailedExecution, Schedule, SuccessfulExecution, federated,
};
use orrery_api::{Object, Time};
use orrery_store::{Store, StoreError, update_with};
use tokio::sync::watch;

use crate::runtime::cache::Cache;
use crate::runtime::controller::{Action, Controller, Keys, Origin, Reconciler, Source};
use crate::runtime::metrics::Handle;
use crate::runtime::reflector::Event;

/// How late a scheduled time may still run (the server was down, or busy).
pub const CATCH_UP: Duration = Duration::from_secs(300);

/// What one pass over an object decided: replicas to set (per rule that is due, with its
/// scheduled time), and the status to write.
#[derive(Debug, PartialEq)]
pub struct Plan {
    pub due: Vec<(String, Time, i32)>,
    pub missed: Vec<(String, Time)>,
    pub status: CronFederatedHPAStatus,
}

/// A rule's schedule and zone, read once per pass; `None` while it is suspended (admission
/// made sure both read).
type Timing = Option<(Schedule, jiff::tz::TimeZone)>;

fn timing(rule: &CronFederatedHPARule) -> Timing {
    if rule.suspended() {
        return None;
    }
    Some((Schedule::parse(&rule.schedule).ok()?, rule.zone().ok()?))
}

/// The next time after `t` (none if suspended, or the schedule names none).
fn next_of(timing: &Timing, t: jiff::Timestamp) -> Option<Time> {
    let (s, tz) = timing.as_ref()?;
    s.next_after(t, tz).map(Time)
}

/// Whether `next` is a time the rule names (it is not, once its schedule or zone changed, or
/// while it is suspended).
fn names(timing: &Timing, next: Time) -> bool {
    let before = next.0 - jiff::SignedDuration::from_secs(1);
    next_of(timing, before) == Some(next)
}

/// Which rules are due at `now`, and each rule's next time. Pure: the tests drive it with
/// clocks of their own.
pub fn plan(spec: &CronFederatedHPASpec, status: &CronFederatedHPAStatus, now: Time) -> Plan {
    let mut out = Plan {
        due: Vec::new(),
        missed: Vec::new(),
        status: CronFederatedHPAStatus::default(),
    };
    for rule in &spec.rules {
        let when = timing(rule);
        let mut h = status
            .execution_histories
            .iter()
            .find(|h| h.rule_name == rule.name)
            .cloned()
            .unwrap_or_else(|| ExecutionHistory {
                rule_name: rule.name.clone(),
                ..Default::default()
            });
        match h.next_execution_time {
            Some(next) if names(&when, next) && next.0 <= now.0 => {
                if now.unix_seconds() - next.unix_seconds() <= CATCH_UP.as_secs() as i64 {
                    // Admission made sure a rule for a workload has its replicas (a rule for a
                    // FederatedHPA sets its bounds instead).
                    out.due
                        .push((rule.name.clone(), next, rule.target_replicas.unwrap_or(0)));
                } else {
                    out.missed.push((rule.name.clone(), next));
                    // The latest time within the catch-up window still runs (down from 10:55
                    // to 11:02, an hourly rule misses 10:00 and runs 11:00).
                    let window = jiff::SignedDuration::from_secs(CATCH_UP.as_secs() as i64);
                    let mut latest = None;
                    let mut t = next_of(&when, now.0 - window);
                    while let Some(x) = t.filter(|x| x.0 <= now.0) {
                        latest = Some(x);
                        t = next_of(&when, x.0);
                    }
                    if let Some(x) = latest {
                        out.due
                            .push((rule.name.clone(), x, rule.target_replicas.unwrap_or(0)));
                    }
                }
                h.next_execution_time = next_of(&when, now.0);
            }
            Some(next) if names(&when, next) => {}
            // New, resumed, suspended or changed: from now on.
            _ => h.next_execution_time = next_of(&when, now.0),
        }
        out.status.execution_histories.push(h);
    }
    out
}

/// Records an execution in a rule's history, newest first, trimmed to its limits.
fn record(
    status: &mut CronFederatedHPAStatus,
    rule: &CronFederatedHPARule,
    outcome: Result<SuccessfulExecution, FailedExecution>,
) {
    let Some(h) = status
        .execution_histories
        .iter_mut()
        .find(|h| h.rule_name == rule.name)
    else {
        return;
    };
    match outcome {
        Ok(s) => {
            h.successful_executions.insert(0, s);
            let keep = rule
                .successful_history_limit
                .unwrap_or(a::DEFAULT_HISTORY_LIMIT)
                .max(1) as usize;
            h.successful_executions.truncate(keep);
        }
        Err(f) => {
            h.failed_executions.insert(0, f);
            let keep = rule
                .failed_history_limit
                .unwrap_or(a::DEFAULT_HISTORY_LIMIT)
                .max(0) as usize;
            h.failed_executions.truncate(keep);
        }
    }
}

/// Sets a FederatedHPA's bounds as a rule says (Karmada: the ones it names; the result must
/// still have min no more than max).
async fn set_bounds(
    store: &dyn Store,
    ns: &str,
    name: &str,
    rule: &CronFederatedHPARule,
) -> Result<(), String> {
    let key = orrery_api::kinds::FEDERATED_HPA.key(ns, name);
    let r = update_with(store, &key, |o| {
        let mut next = o.clone();
        let Some(spec) = next.spec.as_mut().and_then(|s| s.as_object_mut()) else {
            return Err(StoreError::InvalidArgument(
                "the FederatedHPA has no spec".into(),
            ));
        };
        if let Some(min) = rule.target_min_replicas {
            spec.insert("minReplicas".into(), min.into());
        }
        if let Some(max) = rule.target_max_replicas {
            spec.insert("maxReplicas".into(), max.into());
        }
        let min = spec
            .get("minReplicas")
            .and_then(serde_json::Value::as_i64)
            .unwrap_or(1);
        let max = spec
            .get("maxReplicas")
            .and_then(serde_json::Value::as_i64)
            .unwrap_or(0);
        if min > max {
            return Err(StoreError::InvalidArgument(format!(
                "the FederatedHPA would have minReplicas {min} above maxReplicas {max}"
            )));
        }
        if next.spec == o.spec {
            return Ok(None);
        }
        next.metadata.generation = Some(orrery_store::stamp::next_generation(&o, &next));
        Ok(Some(next))
    })
    .await;
    match r {
        Ok(_) => Ok(()),
        Err(StoreError::NotFound { .. }) => Err("the FederatedHPA does not exist".into()),
        Err(StoreError::InvalidArgument(m)) => Err(m),
        Err(e) => Err(e.to_string()),
    }
}

async fn reconcile(store: &dyn Store, o: &Object, now: Time) {
    let Ok(spec) = CronFederatedHPASpec::parse(o.spec.as_ref()) else {
        return;
    };
    let status: CronFederatedHPAStatus = o
        .status
        .clone()
        .and_then(|s| serde_json::from_value(s).ok())
        .unwrap_or_default();
    let mut p = plan(&spec, &status, now);
    let ns = o.namespace();
    for (name, at, n) in &p.due {
        let Some(rule) = spec.rules.iter().find(|r| &r.name == name) else {
            continue;
        };
        let to_hpa = federated::is_reference(&spec.scale_target_ref);
        let result = if to_hpa {
            set_bounds(store, ns, &spec.scale_target_ref.name, rule).await
        } else {
            match super::target_key(ns, &spec.scale_target_ref) {
                Some(key) => super::scale(store, &key, *n).await.map(|_| ()),
                None => Err(format!(
                    "{} is not a kind whose replicas a rule sets",
                    spec.scale_target_ref.kind
                )),
            }
        };
        let executed = Time::now();
        match result {
            Ok(()) => {
                tracing::info!(cronfederatedhpa = %format!("{ns}/{}", o.name()), rule = %name, replicas = n, min = ?rule.target_min_replicas, max = ?rule.target_max_replicas, "scaled at its schedule");
                record(
                    &mut p.status,
                    rule,
                    Ok(SuccessfulExecution {
                        schedule_time: *at,
                        execution_time: executed,
                        applied_replicas: (!to_hpa).then_some(*n),
                        applied_max_replicas: rule.target_max_replicas.filter(|_| to_hpa),
                        applied_min_replicas: rule.target_min_replicas.filter(|_| to_hpa),
                    }),
                );
            }
            Err(message) => {
                tracing::warn!(cronfederatedhpa = %format!("{ns}/{}", o.name()), rule = %name, %message, "scaling at its schedule failed");
                record(
                    &mut p.status,
                    rule,
                    Err(FailedExecution {
                        schedule_time: *at,
                        execution_time: executed,
                        message,
                    }),
                );
            }
        }
    }
    for (name, at) in &p.missed {
        if let Some(rule) = spec.rules.iter().find(|r| &r.name == name) {
            let late = now.unix_seconds() - at.unix_seconds();
            record(
                &mut p.status,
                rule,
                Err(FailedExecution {
                    schedule_time: *at,
                    execution_time: now,
                    message: format!(
                        "missed: the server was not running at the scheduled time ({late}s ago, more than {}s)",
                        CATCH_UP.as_secs()
                    ),
                }),
            );
        }
    }
    if p.status == status {
        return;
    }
    let key = orrery_api::kinds::CRON_FEDERATED_HPA.key(ns, o.name());
    let Ok(value) = serde_json::to_value(&p.status) else {
        return;
    };
    // Written against the object as read: a change meanwhile is planned again next round.
    let mut next = o.clone();
    next.status = Some(value);
    match store.update(&key, next, o.revision()).await {
        Ok(_) | Err(StoreError::Conflict { .. }) | Err(StoreError::NotFound { .. }) => {}
        Err(e) => tracing::warn!(error = %e, "writing a CronFederatedHPA's status"),
    }
}

struct Cron {
    store: Arc<dyn Store>,
    objects: Arc<Cache>,
}

/// How often each CronFederatedHPA's rules are looked at.
const TICK: Duration = Duration::from_secs(1);

#[async_trait::async_trait]
impl Reconciler for Cron {
    /// A CronFederatedHPA's namespace and name.
    type Key = (String, String);
    type Error = StoreError;

    fn on_event(&mut self, _: Origin, ev: Event, keys: &mut Keys<Self::Key>) {
        match ev {
            Event::Listed(_) => keys.all(),
            Event::Upsert(o) => keys.push((o.namespace().to_string(), o.name().to_string())),
            Event::Delete(_) => {}
        }
    }

    fn all_keys(&self) -> Vec<Self::Key> {
        self.objects
            .list()
            .iter()
            .map(|o| (o.namespace().to_string(), o.name().to_string()))
            .collect()
    }

    /// Runs what is due of its rules; looked at again every second while it exists.
    async fn reconcile(&self, (ns, name): &Self::Key) -> Result<Action, StoreError> {
        let Some(o) = self.objects.get(ns, name) else {
            return Ok(Action::Done);
        };
        if o.metadata.deletion_timestamp.is_some() {
            return Ok(Action::Done);
        }
        reconcile(self.store.as_ref(), &o, Time::now()).await;
        Ok(Action::After(TICK))
    }
}

/// Runs every CronFederatedHPA's rules until shutdown.
pub async fn run(store: Arc<dyn Store>, metrics: Handle, shutdown: watch::Receiver<bool>) {
    let objects = Arc::new(Cache::new(&[]));
    let r = Cron {
        store: store.clone(),
        objects: objects.clone(),
    };
    Controller::new("cron", store, r, metrics)
        .source(
            Source::new("cron", orrery_api::kinds::CRON_FEDERATED_HPA.prefix(None)).cached(objects),
        )
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

    fn spec(rules: serde_json::Value) -> CronFederatedHPASpec {
        CronFederatedHPASpec::parse(Some(&serde_json::json!({
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
            "rules": rules,
        })))
        .unwrap()
    }

    /// A rule runs once per scheduled time, however often it is looked at; a new rule waits
    /// for its next time; a time missed by more than the catch-up window is recorded, not run.
    #[test]
    fn rules_run_once_at_their_times() {
        let s = spec(
            serde_json::json!([{"name": "up", "schedule": "*/10 * * * *", "targetReplicas": 5}]),
        );
        // First sight at 10:03: the next time is 10:10, nothing runs.
        let p = plan(&s, &Default::default(), t("2026-11-26T10:03:00Z"));
        assert!(p.due.is_empty());
        assert_eq!(
            p.status.execution_histories[0].next_execution_time,
            Some(t("2026-11-26T10:10:00Z"))
        );
        // Looked at again before then: the same.
        let again = plan(&s, &p.status, t("2026-11-26T10:09:59Z"));
        assert!(again.due.is_empty());
        assert_eq!(again.status, p.status);
        // At 10:10:01: due once, the next at 10:20.
        let at = plan(&s, &p.status, t("2026-11-26T10:10:01Z"));
        assert_eq!(at.due, [("up".to_string(), t("2026-11-26T10:10:00Z"), 5)]);
        assert_eq!(
            at.status.execution_histories[0].next_execution_time,
            Some(t("2026-11-26T10:20:00Z"))
        );
        let after = plan(&s, &at.status, t("2026-11-26T10:10:02Z"));
        assert!(after.due.is_empty());
        // Down from 10:15 to 10:24: 10:20 runs on the way back, 4 minutes late.
        let back = plan(&s, &at.status, t("2026-11-26T10:24:00Z"));
        assert_eq!(back.due, [("up".to_string(), t("2026-11-26T10:20:00Z"), 5)]);
        // Down until 10:28: 8 minutes late, missed.
        let late = plan(&s, &at.status, t("2026-11-26T10:28:00Z"));
        assert!(late.due.is_empty());
        assert_eq!(late.missed, [("up".to_string(), t("2026-11-26T10:20:00Z"))]);
        // Down until 10:33: 10:20 missed, 10:30 (3 minutes late) runs.
        let later = plan(&s, &at.status, t("2026-11-26T10:33:00Z"));
        assert_eq!(
            later.missed,
            [("up".to_string(), t("2026-11-26T10:20:00Z"))]
        );
        assert_eq!(
            later.due,
            [("up".to_string(), t("2026-11-26T10:30:00Z"), 5)]
        );
        assert_eq!(
            later.status.execution_histories[0].next_execution_time,
            Some(t("2026-11-26T10:40:00Z"))
        );
        assert_eq!(
            late.status.execution_histories[0].next_execution_time,
            Some(t("2026-11-26T10:30:00Z"))
        );
    }

    /// 02:30 in Berlin does not exist on 29 March 2026: the rule runs when the gap ends
    /// (01:30 UTC), once.
    #[test]
    fn a_time_a_dst_gap_skips_runs_when_the_gap_ends() {
        let s = spec(
            serde_json::json!([{"name": "night", "schedule": "30 2 * * *",
                                          "timeZone": "Europe/Berlin", "targetReplicas": 2}]),
        );
        let p = plan(&s, &Default::default(), t("2026-03-28T12:00:00Z"));
        assert_eq!(
            p.status.execution_histories[0].next_execution_time,
            Some(t("2026-03-29T01:30:00Z"))
        );
        let at = plan(&s, &p.status, t("2026-03-29T01:30:20Z"));
        assert_eq!(
            at.due,
            [("night".to_string(), t("2026-03-29T01:30:00Z"), 2)]
        );
        assert_eq!(
            at.status.execution_histories[0].next_execution_time,
            Some(t("2026-03-30T00:30:00Z"))
        );
    }

    #[test]
    fn changed_suspended_and_removed_rules_start_again_from_now() {
        let s = spec(serde_json::json!([
            {"name": "up", "schedule": "0 * * * *", "targetReplicas": 5},
            {"name": "down", "schedule": "30 * * * *", "targetReplicas": 1}
        ]));
        let p = plan(&s, &Default::default(), t("2026-11-26T10:05:00Z"));
        // `up` moves to another zone: its stored next time (11:00 UTC, 16:30 in Kolkata) is
        // not one its schedule names there, so it starts again from now (10:40 UTC, 16:10 in
        // Kolkata: next 17:00 there, 11:30 UTC), and nothing runs.
        let mut changed = s.clone();
        changed.rules[0].time_zone = Some("Asia/Kolkata".into());
        let c = plan(&changed, &p.status, t("2026-11-26T10:40:00Z"));
        assert!(c.due.is_empty());
        assert_eq!(
            c.status.execution_histories[0].next_execution_time,
            Some(t("2026-11-26T11:30:00Z"))
        );
        // Suspended: no next time, nothing runs, even past it.
        let mut suspended = s.clone();
        suspended.rules[1].suspend = Some(true);
        let sp = plan(&suspended, &p.status, t("2026-11-26T10:31:00Z"));
        assert!(sp.due.is_empty());
        assert_eq!(sp.status.execution_histories[1].next_execution_time, None);
        // Resumed at 10:45: from then on (11:30), not the 10:30 it slept through.
        let r = plan(&s, &sp.status, t("2026-11-26T10:45:00Z"));
        assert!(r.due.is_empty());
        assert_eq!(
            r.status.execution_histories[1].next_execution_time,
            Some(t("2026-11-26T11:30:00Z"))
        );
        // A removed rule's history goes.
        let mut one = s.clone();
        one.rules.truncate(1);
        assert_eq!(
            plan(&one, &p.status, t("2026-11-26T10:06:00Z"))
                .status
                .execution_histories
                .len(),
            1
        );
    }

    #[test]
    fn histories_keep_what_their_rules_say() {
        let s = spec(
            serde_json::json!([{"name": "up", "schedule": "@hourly", "targetReplicas": 5,
                                          "successfulHistoryLimit": 2, "failedHistoryLimit": 0}]),
        );
        let mut st = plan(&s, &Default::default(), t("2026-11-26T10:05:00Z")).status;
        for i in 0..4 {
            let at = t("2026-11-26T11:00:00Z");
            record(
                &mut st,
                &s.rules[0],
                Ok(SuccessfulExecution {
                    schedule_time: at,
                    execution_time: Time(at.0 + jiff::SignedDuration::from_secs(i)),
                    applied_replicas: Some(5),
                    applied_max_replicas: None,
                    applied_min_replicas: None,
                }),
            );
            record(
                &mut st,
                &s.rules[0],
                Err(FailedExecution {
                    schedule_time: at,
                    execution_time: at,
                    message: "no".into(),
                }),
            );
        }
        let h = &st.execution_histories[0];
        assert_eq!(h.successful_executions.len(), 2);
        assert_eq!(
            h.successful_executions[0].execution_time,
            t("2026-11-26T11:00:03Z")
        );
        assert!(h.failed_executions.is_empty());
    }
}
