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
//!
//! Where a member reports a ResourceQuota of the workload's namespace ([`QuotaRoom`], read
//! from a FederatedResourceQuota's `aggregatedStatus`), the set must also fit what it leaves
//! free there, as Karmada's estimator counts the namespace's quota for component sets; the
//! `ResourceQuota` filter names the first component that does not.

use orrery_api::Quantity;
use orrery_api::binding::TargetCluster;
use orrery_api::cluster::ResourceList;
use orrery_api::policy::{AGGREGATED, DIVIDED, Placement, ReplicaScheduling};

use crate::{Config, Task};

/// One component of a workload: its name, replicas and what each of its replicas requests.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ComponentNeed {
    pub name: String,
    pub replicas: i64,
    pub request: ResourceList,
}

/// What one ResourceQuota of the workload's namespace leaves free in a member, as the member
/// reports it (`hard` less `used`, for the limits it names).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QuotaRoom {
    pub cluster: String,
    /// The ResourceQuota's name.
    pub quota: String,
    pub free: ResourceList,
}

impl QuotaRoom {
    /// A member's report of one quota: `hard` less `used` for every limit `hard` names.
    pub fn of(cluster: &str, quota: &str, hard: &ResourceList, used: &ResourceList) -> QuotaRoom {
        let free = hard
            .iter()
            .map(|(name, h)| {
                let u = used.get(name).copied().unwrap_or_default();
                (name.clone(), h.checked_sub(&u).unwrap_or_default())
            })
            .collect();
        QuotaRoom {
            cluster: cluster.into(),
            quota: quota.into(),
            free,
        }
    }

    /// The first component that takes the set past what the quota leaves free, once the
    /// components before it are counted, and the quota's limit it passes. `runs_here`: the
    /// set runs in this member now, so its own use is in `used` and is given back first.
    pub fn first_short<'c>(
        &self,
        components: &'c [ComponentNeed],
        runs_here: bool,
    ) -> Option<(&'c ComponentNeed, &str)> {
        let own = set_request(components);
        for (k, c) in components.iter().enumerate() {
            // What this component and the ones before it take.
            let taken = set_request(&components[..=k]);
            let over = self.free.iter().find(|(limit, free)| {
                // Kubernetes counts `cpu` and `requests.cpu` alike; limits are not known here.
                let resource = limit.strip_prefix("requests.").unwrap_or(limit);
                let Some(t) = taken.get(resource) else {
                    return false;
                };
                let back = if runs_here {
                    own.get(resource).copied().unwrap_or_default()
                } else {
                    Quantity::default()
                };
                !t.is_zero() && *t > **free + back
            });
            if let Some((limit, _)) = over {
                return Some((c, limit.as_str()));
            }
        }
        None
    }
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
    orrery_api::binding::set_request(components.iter().map(|c| (c.replicas, &c.request)))
}
