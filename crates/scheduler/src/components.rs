//! Multi-component workloads (Karmada's `MultiplePodTemplatesScheduling`): a workload whose
//! interpreter names two or more components (a Flink job manager and its task managers, a
//! Ray head and its workers) runs whole in one cluster, never divided. The engine places it
//! as one replica whose request is the whole set (every component's replicas times its
//! request), in as few clusters as possible (one) and under the water level limit whatever
//! the placement's division says; the node-fit filter asks that each component's own pod fits
//! on a node, and the water level filter names the first component that does not fit.
//!
//! The caller turns its task into the set's with [`WholeSet`] and schedules and explains
//! with that task, so the decision and its explanation read the same figures.

use orrery_api::binding::TargetCluster;
use orrery_api::cluster::ResourceList;
use orrery_api::policy::{AGGREGATED, DIVIDED, Placement, ReplicaScheduling};
use orrery_api::{Format, Quantity};

use crate::{Config, Task};

/// One component of a workload: its name, replicas and what each of its replicas requests.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ComponentNeed {
    pub name: String,
    pub replicas: i64,
    pub request: ResourceList,
}

/// What a multi-component task is scheduled as: one replica of the whole set.
#[derive(Clone, Debug)]
pub struct WholeSet {
    request: ResourceList,
    placement: Placement,
    previous: Vec<TargetCluster>,
}

impl WholeSet {
    /// The set a task of two or more components is placed as; `None` for any other task.
    pub fn of(task: &Task<'_>, config: &Config) -> Option<WholeSet> {
        if task.components.len() < 2 {
            return None;
        }
        let mut placement = task.placement.clone();
        placement.replica_scheduling = Some(ReplicaScheduling {
            replica_scheduling_type: DIVIDED.into(),
            replica_division_preference: AGGREGATED.into(),
            weight_preference: None,
        });
        // Never past the limit, whichever division the placement names.
        placement.water_level_limit = Some(
            placement
                .water_level_limit
                .unwrap_or(config.water_level_limit),
        );
        Some(WholeSet {
            request: set_request(task.components),
            placement,
            // Wherever it runs, it runs whole.
            previous: task
                .previous
                .iter()
                .filter(|t| t.replicas > 0)
                .map(|t| TargetCluster {
                    name: t.name.clone(),
                    replicas: 1,
                })
                .collect(),
        })
    }

    /// `task` as the set: one replica of the whole set's request.
    pub fn task<'a>(&'a self, task: &Task<'a>) -> Task<'a> {
        Task {
            replicas: 1,
            divisible: true,
            request: &self.request,
            placement: &self.placement,
            previous: &self.previous,
            ..task.clone()
        }
    }
}

/// Every component's replicas times its request, summed; `pods` counts their pods.
pub fn set_request(components: &[ComponentNeed]) -> ResourceList {
    let mut out = ResourceList::new();
    let mut pods = 0i64;
    for c in components {
        let n = c.replicas.max(0);
        pods = pods.saturating_add(n);
        for (name, q) in &c.request {
            if name == "pods" {
                continue;
            }
            // A set too large to count fits nowhere.
            let add = q
                .checked_mul(n)
                .unwrap_or_else(|| Quantity::from_int(i64::MAX, q.format()));
            let sum = match out.get(name) {
                Some(have) => *have + add,
                None => add,
            };
            out.insert(name.clone(), sum);
        }
    }
    out.insert("pods".into(), Quantity::from_int(pods, Format::DecimalSI));
    out
}
