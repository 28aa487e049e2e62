//! Binding preemption: a workload whose PriorityClass preempts (`preemptionPolicy:
//! PreemptLowerPriority`, carried on its binding's `schedulePriority`) and that found too
//! little room may take room in one cluster from workloads of a lower priority that allow it
//! (`placement.preemptible`). This is Karmada's binding-preemption proposal, which Karmada
//! 1.18 has not built (its `PriorityBasedPreemptiveScheduling` gate does nothing yet);
//! Orrery adds the victim's consent, so that nothing is preempted that did not say it may be.
//!
//! ```text
//!   preemptor unplaced ──▶ a preemption already frees room in a cluster it may use? ──yes──▶ wait
//!          │ no
//!          ▼
//!   per cluster: victims lowest priority first (larger share first) until what they free
//!   covers the shortfall; the cluster needing the lowest priorities, then the fewest victims
//!          │ none covers it: nothing is preempted (it would not help)
//!          ▼
//!   each victim decided again without that cluster (Trigger::Preempted): its replicas there
//!   move elsewhere make-before-break, or wait for room; an Event `Preempted` says why
//!          ▼
//!   the old copies go ──▶ room ──▶ the preemptor's retry comes first (higher priority)
//! ```
//!
//! Held: a victim keeps at least its disruption budget's `minAvailable` of its desired
//! replicas (a victim the preemption would take below it is passed over); a stateful victim
//! (one that moves only through a Migration) and cluster-scoped templates are never
//! preempted; one preemption at a time frees room in a cluster, so a preemptor retried before
//! the old copies are gone preempts nothing more. Which clusters were chosen is read back
//! from the victims' stored evictions, so a restart in between preempts nothing twice.

use super::*;

use orrery_api::binding::PREEMPT_LOWER_PRIORITY;
use orrery_scheduler::{Outcome as EngineOutcome, vector_of};

/// The Event reason on a workload that leaves a cluster for a higher priority.
pub(super) const PREEMPTED_REASON: &str = "Preempted";
const DIMS: usize = orrery_scheduler::DIMENSIONS.len();
/// What the old copy's eviction entry says (the trigger's name, in `old_copies`).
const PREEMPTED_EVICTION: &str = "(Preempted)";

/// A cluster a binding is to leave for a workload of a higher priority.
#[derive(Clone, Debug)]
pub(super) struct Preemption {
    pub cluster: String,
    /// What the Event on the victim says.
    pub why: String,
}

/// The preemptions of `spec` that still apply: clusters it still runs replicas in.
pub(super) fn still_placed(preempted: &[Preemption], spec: &BindingSpec) -> Vec<Preemption> {
    preempted
        .iter()
        .filter(|p| {
            spec.clusters
                .iter()
                .any(|c| c.name == p.cluster && c.replicas > 0)
        })
        .cloned()
        .collect()
}

/// One workload that could give up its replicas in a cluster.
struct Victim {
    key: BKey,
    priority: i32,
    replicas: i64,
    freed: orrery_scheduler::Vector,
}

fn priority(spec: &BindingSpec) -> i32 {
    spec.schedule_priority.as_ref().map_or(0, |p| p.priority)
}

impl Scheduler {
    /// For a binding whose class preempts and that left replicas unplaced: picks the
    /// lower-priority workloads to move out of one cluster and queues them, and returns what
    /// its status adds (`None`: nothing to add).
    pub(super) fn preempt_for(
        &mut self,
        k: &BKey,
        spec: &BindingSpec,
        decision: &Decision,
    ) -> Option<String> {
        let sp = spec.schedule_priority.as_ref()?;
        if sp.preemption_policy != PREEMPT_LOWER_PRIORITY
            || decision.unplaced <= 0
            || spec.resource.namespace.is_empty()
            || spec.is_whole_set()
        {
            return None;
        }
        let request = (spec.replica_requirements.as_ref())
            .map(|r| vector_of(&r.resource_request))
            .unwrap_or_default();
        let need: orrery_scheduler::Vector =
            std::array::from_fn(|d| request[d] * decision.unplaced as f64);
        if need.iter().all(|n| *n <= 0.0) {
            return None;
        }
        let candidates = self.could_use(decision);
        if let Some(c) = candidates.iter().find(|c| self.preemption_pending(c)) {
            return Some(format!("waiting for the room a preemption frees in {c}"));
        }
        let (cluster, victims) = self.choose_victims(k, sp.priority, &candidates, &need)?;
        let names: Vec<String> = victims.iter().map(|v| format!("{}/{}", v.0, v.1)).collect();
        for v in victims {
            let why = format!(
                "preempted from {cluster} by {}/{} (priority {})",
                k.0, k.1, sp.priority
            );
            self.preempt.entry(v.clone()).or_default().push(Preemption {
                cluster: cluster.clone(),
                why,
            });
            self.enqueue(v, Trigger::Preempted);
        }
        tracing::info!(namespace = %k.0, binding = %k.1, %cluster, victims = %names.join(","), "preempting lower-priority workloads");
        Some(format!(
            "preempting {} in {cluster} (lower priority, preemptible)",
            names.join(", ")
        ))
    }

    /// The clusters the decision would have used had they had room: scored, or turned away
    /// by a filter of room.
    fn could_use(&self, decision: &Decision) -> Vec<String> {
        let clusters = self.fleet.clusters();
        (0..decision.outcomes.len())
            .filter(|i| match decision.outcomes.get(*i) {
                EngineOutcome::Scored { .. } => true,
                EngineOutcome::Filtered(f) => self
                    .engine
                    .filters
                    .get(f)
                    .is_some_and(|f| matches!(f.name(), "WaterLevel" | "NodeFit")),
                _ => false,
            })
            .map(|i| clusters[i].name.clone())
            .collect()
    }

    /// Whether a preemption is already freeing room in `cluster`: a victim is queued to
    /// leave it, or keeps an old copy there that is still to go.
    fn preemption_pending(&self, cluster: &str) -> bool {
        if self
            .preempt
            .values()
            .any(|ps| ps.iter().any(|p| p.cluster == cluster))
        {
            return true;
        }
        let now = Time::now();
        self.bindings.values().any(|b| {
            b.spec.as_ref().and_then(|s| s.get("evictions")).is_some()
                && BindingSpec::of(b).is_some_and(|s| {
                    s.evictions.iter().any(|e| {
                        e.cluster == cluster
                            && e.rescheduled
                            && e.reason.ends_with(PREEMPTED_EVICTION)
                            && e.keep_until.is_some_and(|u| u > now)
                    })
                })
        })
    }

    /// The cluster whose victims free `need` with the lowest priorities, then the fewest of
    /// them; `None` when no cluster's victims are enough.
    fn choose_victims(
        &self,
        preemptor: &BKey,
        priority: i32,
        candidates: &[String],
        need: &orrery_scheduler::Vector,
    ) -> Option<(String, Vec<BKey>)> {
        let mut best: Option<((i32, usize, String), Vec<BKey>)> = None;
        for cluster in candidates {
            let mut victims = self.victims_in(preemptor, priority, cluster);
            victims.sort_by(|a, b| {
                (a.priority, std::cmp::Reverse(a.replicas), &a.key).cmp(&(
                    b.priority,
                    std::cmp::Reverse(b.replicas),
                    &b.key,
                ))
            });
            let mut freed = [0.0; DIMS];
            let mut taken: Vec<&Victim> = Vec::new();
            for v in &victims {
                if (0..DIMS).all(|d| need[d] <= 0.0 || freed[d] >= need[d]) {
                    break;
                }
                for (f, x) in freed.iter_mut().zip(v.freed) {
                    *f += x;
                }
                taken.push(v);
            }
            if !(0..DIMS).all(|d| need[d] <= 0.0 || freed[d] >= need[d]) || taken.is_empty() {
                continue;
            }
            let rank = (
                taken.iter().map(|v| v.priority).max().unwrap_or(i32::MIN),
                taken.len(),
                cluster.clone(),
            );
            if best.as_ref().is_none_or(|(r, _)| rank < *r) {
                best = Some((rank, taken.iter().map(|v| v.key.clone()).collect()));
            }
        }
        best.map(|((_, _, cluster), victims)| (cluster, victims))
    }

    /// The workloads that may give up their replicas in `cluster` to a workload of
    /// `priority`: lower, preemptible, not stateful, namespaced, decided by Orrery, and left
    /// with their disruption budget's floor.
    fn victims_in(&self, preemptor: &BKey, above: i32, cluster: &str) -> Vec<Victim> {
        let mut out = Vec::new();
        for (k, b) in &self.bindings {
            // Read without parsing first: most bindings are not preemptible.
            let preemptible = b
                .spec
                .as_ref()
                .and_then(|s| s.get("placement"))
                .and_then(|p| p.get("preemptible"))
                == Some(&serde_json::Value::Bool(true));
            if !preemptible || k == preemptor || b.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let Some(spec) = BindingSpec::of(b) else {
                continue;
            };
            if priority(&spec) >= above
                || spec.is_stateful()
                || spec.is_whole_set()
                || spec.resource.namespace.is_empty()
                || !orrery_api::policy::is_orrery_scheduler(&spec.scheduler_name)
            {
                continue;
            }
            let Some(here) = spec
                .clusters
                .iter()
                .find(|c| c.name == cluster && c.replicas > 0)
            else {
                continue;
            };
            let floor = spec
                .placement
                .disruption_budget
                .as_ref()
                .map_or(0, |d| d.min_available(spec.replicas));
            if spec.replicas - here.replicas < floor {
                continue;
            }
            let request = (spec.replica_requirements.as_ref())
                .map(|r| vector_of(&r.resource_request))
                .unwrap_or_default();
            out.push(Victim {
                key: k.clone(),
                priority: priority(&spec),
                replicas: here.replicas,
                freed: std::array::from_fn(|d| request[d] * here.replicas as f64),
            });
        }
        out
    }
}
