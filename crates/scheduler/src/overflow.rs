//! Karmada 1.18's overflow affinities: a `clusterAffinities` term whose inline affinity is
//! the preferred group of clusters and whose `overflowAffinities` are further groups, in
//! order. A workload's replicas fill the first group as far as its clusters have room under
//! the limit; what does not fit goes to the next group, and so on. Scaling down, the first
//! groups keep what they hold and the last groups give replicas back first.
//!
//! Each group is decided by the ordinary pipeline ([`crate::schedule_term`]) over its own
//! clusters, with the replicas the groups before it left over and the replicas it holds now;
//! a cluster belongs to the first group that matches it (Karmada's rule). The decisions are
//! then put together into one, in which a cluster of a group that was not needed is held in
//! reserve ([`Outcome::Reserve`]). Only workloads that divide their replicas by room
//! overflow (Karmada's `IsOverflowSchedulingAllowed`, and its `IsWorkload`): anything else
//! uses the inline group alone.
//!
//! ```text
//!   remaining = replicas
//!   group 0 ──place(min(remaining, room))──▶ remaining -= placed ──▶ group 1 ──▶ ... ──▶ 0 left: done
//!                                                                               └─ groups left over: Reserve
//! ```

use orrery_api::binding::TargetCluster;
use orrery_api::policy::{ClusterAffinity, ClusterAffinityTerm};

use crate::{
    Config, Decision, FilterCache, Fleet, Outcome, PluginScores, Task, demand_of, schedule_term,
};

/// Whether `term`'s overflow groups take part in scheduling `task`.
pub(crate) fn applies(task: &Task<'_>, term: &ClusterAffinityTerm) -> bool {
    !term.overflow_affinities.is_empty()
        && task.divisible
        && task.replicas > 0
        && task.placement.divides_dynamically()
}

/// One group: the affinity that selects exactly its clusters, and those clusters (fleet
/// indexes, in fleet order).
struct Group {
    affinity: ClusterAffinity,
    members: Vec<usize>,
}

/// The term's groups, in order: the inline affinity, then each overflow affinity less the
/// clusters an earlier group already has.
fn groups(fleet: &Fleet, term: &ClusterAffinityTerm) -> Vec<Group> {
    let mut taken = vec![false; fleet.len()];
    let all = std::iter::once(term.affinity())
        .chain(term.overflow_affinities.iter().map(|o| o.affinity()));
    let mut out = Vec::new();
    for mut affinity in all {
        let mut members = Vec::new();
        let mut earlier = Vec::new();
        for (i, c) in fleet.clusters().iter().enumerate() {
            if !affinity.matches(&c.view()) {
                continue;
            }
            if taken[i] {
                earlier.push(c.name.clone());
            } else {
                members.push(i);
            }
        }
        for i in &members {
            taken[*i] = true;
        }
        affinity.exclude.extend(earlier);
        out.push(Group { affinity, members });
    }
    out
}

/// Schedules `task` over the term's groups in order (see the module's doc).
pub(crate) fn schedule(
    fleet: &Fleet,
    task: &Task<'_>,
    config: &Config,
    term: &ClusterAffinityTerm,
    cache: &mut FilterCache,
) -> Decision {
    let groups = groups(fleet, term);
    let mut remaining = task.replicas;
    let mut parts: Vec<(usize, Decision)> = Vec::new();
    for (k, g) in groups.iter().enumerate() {
        if k > 0 && (remaining == 0 || g.members.is_empty()) {
            continue;
        }
        // What the group holds now: its own replicas only, so that what another group holds
        // is neither counted here nor moved here.
        let previous: Vec<TargetCluster> = task
            .previous
            .iter()
            .filter(|t| {
                fleet
                    .position(&t.name)
                    .is_some_and(|i| g.members.binary_search(&i).is_ok())
            })
            .cloned()
            .collect();
        let sub = Task {
            replicas: remaining,
            previous: &previous,
            ..task.clone()
        };
        // The filter cache knows a group by the term's name and the group's index.
        let key = if k == 0 {
            term.affinity_name.clone()
        } else {
            format!("{}\u{1f}overflow{k}", term.affinity_name)
        };
        let mut d = schedule_term(fleet, &sub, config, Some(&g.affinity), &key, cache);
        // Karmada's divisions without a limit put what fits nowhere in the roomiest cluster;
        // here it goes on to the next group instead, so the group gets only what it holds.
        if let Some(room) = karmada_room(fleet, &sub, &d)
            && placed(&d) > room
        {
            if room == 0 {
                d = unplaced(d, &sub, fleet);
            } else {
                let fits = Task {
                    replicas: room,
                    ..sub.clone()
                };
                d = schedule_term(fleet, &fits, config, Some(&g.affinity), &key, cache);
            }
        }
        remaining = (remaining - placed(&d)).max(0);
        parts.push((k, d));
    }
    merge(task, term, &groups, parts, remaining)
}

fn placed(d: &Decision) -> i64 {
    d.clusters.iter().map(|c| c.replicas).sum()
}

/// What the clusters a Karmada division (Aggregated or AvailableReplicas, no limit named)
/// kept can hold, by Karmada's count: what each holds of the task now and the replicas that
/// fit in what its requests leave free. `None` for the divisions that keep to the limit and
/// leave what does not fit unplaced themselves.
fn karmada_room(fleet: &Fleet, task: &Task<'_>, d: &Decision) -> Option<i64> {
    let p = task.placement;
    if p.water_level_limit.is_some() || !matches!(d.strategy, "Aggregated" | "AvailableReplicas") {
        return None;
    }
    let demand = demand_of(task.request);
    let mut room = 0i64;
    for i in &d.scored {
        if !matches!(d.outcomes.get(*i), Outcome::Scored { .. }) {
            continue;
        }
        let c = &fleet.clusters()[*i];
        let holds = task
            .previous
            .iter()
            .find(|t| t.name == c.name)
            .map_or(0, |t| t.replicas.max(0));
        // A cluster that reports no capacity is taken at its word, as the division takes it.
        let free = fleet.facts()[*i]
            .available_replicas(&demand)
            .unwrap_or(1_000_000);
        room = room.saturating_add(holds).saturating_add(free);
    }
    Some(room)
}

/// `d` with nothing placed: the group has no room at all.
fn unplaced(mut d: Decision, task: &Task<'_>, fleet: &Fleet) -> Decision {
    for t in &d.clusters {
        if let Some(i) = fleet.position(&t.name)
            && let Some(Outcome::Scored { replicas, .. }) = d.outcomes.get_mut(i)
        {
            *replicas = 0;
        }
    }
    d.clusters.clear();
    d.unplaced = task.replicas;
    d.error = Some("its clusters have no room for a replica".into());
    d
}

/// One decision from the groups' decisions: the first group's, with the later groups'
/// clusters, outcomes and scores added, and the error only if replicas are left over.
fn merge(
    task: &Task<'_>,
    term: &ClusterAffinityTerm,
    groups: &[Group],
    parts: Vec<(usize, Decision)>,
    remaining: i64,
) -> Decision {
    let mut parts = parts.into_iter();
    let Some((_, mut out)) = parts.next() else {
        // Unreachable: the first group is always decided.
        return Decision {
            error: Some("no cluster group to schedule in".into()),
            unplaced: task.replicas,
            ..Default::default()
        };
    };
    out.affinity_name = term.affinity_name.clone();
    let rest: Vec<(usize, Decision)> = parts.collect();
    for (k, g) in groups.iter().enumerate().skip(1) {
        let part = rest.iter().find(|(pk, _)| *pk == k).map(|(_, d)| d);
        for i in &g.members {
            let o = part.map_or(Outcome::Reserve(k), |d| d.outcomes.get(*i));
            out.outcomes.set(*i, o);
        }
    }
    let mut last_error = out.error.take();
    let mut last_group = 0;
    let mut scored_lens = vec![out.scored.len()];
    let mut all_scores = vec![std::mem::take(&mut out.plugin_scores)];
    for (k, d) in rest {
        if d.error.is_some() {
            last_error = d.error.clone();
            last_group = k;
        }
        out.clusters.extend(d.clusters);
        out.consolidated += d.consolidated;
        scored_lens.push(d.scored.len());
        out.scored.extend(d.scored);
        all_scores.push(d.plugin_scores);
    }
    out.plugin_scores = concat_scores(&scored_lens, all_scores);
    out.clusters.sort_by(|a, b| a.name.cmp(&b.name));
    out.unplaced = remaining;
    out.error = (remaining > 0).then(|| {
        let why = last_error.unwrap_or_else(|| "no room".into());
        let group = if last_group == 0 {
            term.affinity_name.as_str()
        } else {
            term.overflow_affinities[last_group - 1].affinity_name.as_str()
        };
        format!(
            "{remaining} of {} replicas fit in none of the groups of {} (last: {group}: {why}); {} placed",
            task.replicas,
            term.affinity_name,
            task.replicas - remaining
        )
    });
    out
}

/// The plugins' scores of the groups' scored clusters, one list in the order the groups'
/// `scored` lists were put together.
fn concat_scores(lens: &[usize], parts: Vec<Vec<PluginScores>>) -> Vec<PluginScores> {
    let plugins = parts.iter().map(Vec::len).max().unwrap_or(0);
    (0..plugins)
        .map(|p| {
            if parts
                .iter()
                .all(|s| matches!(s.get(p), None | Some(PluginScores::NotApplicable)))
            {
                return PluginScores::NotApplicable;
            }
            let mut each = Vec::new();
            for (s, len) in parts.iter().zip(lens) {
                match s.get(p) {
                    Some(PluginScores::Each(v)) => each.extend(v.iter().copied()),
                    Some(PluginScores::All(x)) => each.extend(std::iter::repeat_n(*x, *len)),
                    _ => each.extend(std::iter::repeat_n(0.0, *len)),
                }
            }
            PluginScores::Each(each)
        })
        .collect()
}
