//! Filter plugins (draft 7.3.2): each says whether a cluster can take the task at all.
//!
//! A plugin answers fast (`check`, on the hot path, for every cluster) and explains itself
//! slowly (`why`, only when a decision is rendered for people).

use orrery_api::cluster::Taint;
use orrery_api::labels::Selector;
use orrery_api::policy::{Placement, Target};

use crate::Ctx;

/// One filter plugin.
pub trait Filter: Send + Sync + std::fmt::Debug {
    fn name(&self) -> &'static str;
    /// Whether cluster `i` passes.
    fn check(&self, ctx: &Ctx<'_>, i: usize) -> bool;
    /// Why cluster `i` does not pass.
    fn why(&self, ctx: &Ctx<'_>, i: usize) -> String;
    /// Whether the answer depends only on the task's placement and the cluster's placement
    /// facts (labels, location, taints, readiness, APIs, capabilities), not on its figures,
    /// so it can be remembered per placement ([`crate::FilterCache`]). Where the task runs
    /// now may still matter; clusters it runs in are always asked afresh.
    fn is_static(&self) -> bool {
        false
    }
}

/// The storage classes the task's volumes need must be offered (a cluster that has not said
/// which it offers is not turned away).
#[derive(Debug)]
pub struct StorageClass;

impl StorageClass {
    fn missing<'a>(ctx: &Ctx<'a>, i: usize) -> Option<&'a str> {
        let offered = &ctx.fleet.clusters()[i].storage_classes;
        if offered.is_empty() {
            return None;
        }
        ctx.task
            .relations
            .storage_classes
            .iter()
            .find(|c| !c.is_empty() && !offered.contains(c))
            .map(String::as_str)
    }
}

impl Filter for StorageClass {
    fn name(&self) -> &'static str {
        "StorageClass"
    }
    fn check(&self, ctx: &Ctx<'_>, i: usize) -> bool {
        Self::missing(ctx, i).is_none()
    }
    fn why(&self, ctx: &Ctx<'_>, i: usize) -> String {
        format!(
            "the cluster offers no storage class {:?} (it has {})",
            Self::missing(ctx, i).unwrap_or(""),
            ctx.fleet.clusters()[i].storage_classes.join(", ")
        )
    }
}

/// Where the task must run or must not run because of other workloads: its follow-up
/// leader's clusters, its affinity group's, away from its anti-affinity group's.
#[derive(Debug)]
pub struct WorkloadAffinity;

impl Filter for WorkloadAffinity {
    fn name(&self) -> &'static str {
        "WorkloadAffinity"
    }
    fn check(&self, ctx: &Ctx<'_>, i: usize) -> bool {
        let name = &ctx.fleet.clusters()[i].name;
        let r = &ctx.task.relations;
        r.within.is_none_or(|(w, _)| w.contains(name))
            && r.avoid.is_none_or(|(a, _)| !a.contains(name))
    }
    fn why(&self, ctx: &Ctx<'_>, i: usize) -> String {
        let name = &ctx.fleet.clusters()[i].name;
        let r = &ctx.task.relations;
        match (r.within, r.avoid) {
            (Some((w, why)), _) if !w.contains(name) => why.to_string(),
            (_, Some((_, why))) => why.to_string(),
            _ => String::new(),
        }
    }
}

/// Karmada's filters: placement only, with no view of water levels or nodes (the quality
/// benchmark's Karmada strategies use these).
pub fn karmada_filters() -> Vec<Box<dyn Filter>> {
    vec![
        Box::new(Readiness),
        Box::new(Evicted),
        Box::new(ApiEnablement),
        Box::new(Affinity),
        Box::new(TargetClusters),
        Box::new(TaintToleration),
    ]
}

/// A cluster that is not Ready takes no new replicas, but keeps what it runs until its taints
/// say otherwise (NoExecute after the eviction timeout), as nodes do in Kubernetes.
#[derive(Debug)]
pub struct Readiness;

impl Filter for Readiness {
    fn is_static(&self) -> bool {
        true
    }
    fn name(&self) -> &'static str {
        "Readiness"
    }
    fn check(&self, ctx: &Ctx<'_>, i: usize) -> bool {
        ctx.fleet.clusters()[i].ready || ctx.previous[i] > 0
    }
    fn why(&self, _: &Ctx<'_>, _: usize) -> String {
        "the cluster is not ready".into()
    }
}

/// Clusters the workload was evicted from (application failover).
#[derive(Debug)]
pub struct Evicted;

impl Filter for Evicted {
    fn is_static(&self) -> bool {
        true
    }
    fn name(&self) -> &'static str {
        "Eviction"
    }
    fn check(&self, ctx: &Ctx<'_>, i: usize) -> bool {
        !ctx.task.evicted.contains(&ctx.fleet.clusters()[i].name)
    }
    fn why(&self, _: &Ctx<'_>, _: usize) -> String {
        "the workload was evicted from this cluster".into()
    }
}

/// The member must serve the template's kind.
#[derive(Debug)]
pub struct ApiEnablement;

impl Filter for ApiEnablement {
    fn is_static(&self) -> bool {
        true
    }
    fn name(&self) -> &'static str {
        "APIEnablement"
    }
    fn check(&self, ctx: &Ctx<'_>, i: usize) -> bool {
        if ctx.task.api_version.is_empty() {
            return true;
        }
        match &ctx.fleet.clusters()[i].api_kinds {
            Some(kinds) => kinds.contains(&ctx.api_key),
            None => true,
        }
    }
    fn why(&self, ctx: &Ctx<'_>, _: usize) -> String {
        format!(
            "the cluster does not serve {} {}",
            ctx.task.api_version, ctx.task.kind
        )
    }
}

/// Cluster affinity: names, labels, provider/region/zone fields, exclusions.
#[derive(Debug)]
pub struct Affinity;

impl Filter for Affinity {
    fn is_static(&self) -> bool {
        true
    }
    fn name(&self) -> &'static str {
        "ClusterAffinity"
    }
    fn check(&self, ctx: &Ctx<'_>, i: usize) -> bool {
        ctx.affinity
            .as_ref()
            .is_none_or(|a| a.matches(&ctx.fleet.clusters()[i].view()))
    }
    fn why(&self, _: &Ctx<'_>, _: usize) -> String {
        "cluster affinity does not match".into()
    }
}

/// The draft's `targetClusters` (by name or label).
#[derive(Debug)]
pub struct TargetClusters;

fn targets_match(targets: &[Target], selectors: &[Vec<Selector>], i: usize, ctx: &Ctx<'_>) -> bool {
    let c = &ctx.fleet.clusters()[i];
    targets.is_empty()
        || targets
            .iter()
            .zip(selectors)
            .any(|(t, sels)| t.names.contains(&c.name) || sels.iter().any(|s| s.matches(&c.labels)))
}

impl Filter for TargetClusters {
    fn is_static(&self) -> bool {
        true
    }
    fn name(&self) -> &'static str {
        "TargetClusters"
    }
    fn check(&self, ctx: &Ctx<'_>, i: usize) -> bool {
        targets_match(ctx.task.targets, &ctx.target_selectors, i, ctx)
    }
    fn why(&self, _: &Ctx<'_>, _: usize) -> String {
        "not among the policy's targetClusters".into()
    }
}

/// Whether a taint keeps the task off a cluster. NoSchedule keeps what already runs there;
/// a NoExecute taint tolerated with `tolerationSeconds` is tolerated for that long after it
/// was added.
pub fn taint_blocks(t: &Taint, placement: &Placement, already_there: bool, now: i64) -> bool {
    let effect = t.effect.as_str();
    if effect == "PreferNoSchedule" {
        return false;
    }
    if effect == "NoSchedule" && already_there {
        return false;
    }
    !placement.cluster_tolerations.iter().any(|tol| {
        tol.tolerates(&t.key, &t.value, effect)
            && match (effect, tol.toleration_seconds, t.time_added) {
                ("NoExecute", Some(secs), Some(added)) => now < added.unix_seconds() + secs,
                ("NoExecute", Some(secs), None) => secs > 0,
                _ => true,
            }
    })
}

#[derive(Debug)]
pub struct TaintToleration;

impl TaintToleration {
    fn blocking<'c>(ctx: &Ctx<'_>, c: &'c crate::ClusterSnapshot, i: usize) -> Option<&'c Taint> {
        c.taints
            .iter()
            .find(|t| taint_blocks(t, ctx.task.placement, ctx.previous[i] > 0, ctx.task.now))
    }
}

impl Filter for TaintToleration {
    fn is_static(&self) -> bool {
        true
    }
    fn name(&self) -> &'static str {
        "TaintToleration"
    }
    fn check(&self, ctx: &Ctx<'_>, i: usize) -> bool {
        let c = &ctx.fleet.clusters()[i];
        c.taints.is_empty() || Self::blocking(ctx, c, i).is_none()
    }
    fn why(&self, ctx: &Ctx<'_>, i: usize) -> String {
        let c = &ctx.fleet.clusters()[i];
        match Self::blocking(ctx, c, i) {
            Some(t) => format!("taint {}:{} is not tolerated", t.key, t.effect.as_str()),
            None => "a taint is not tolerated".into(),
        }
    }
}

/// The cluster must offer every capability the placement asks for (`gpu`...).
#[derive(Debug)]
pub struct Capabilities;

impl Filter for Capabilities {
    fn is_static(&self) -> bool {
        true
    }
    fn name(&self) -> &'static str {
        "Capabilities"
    }
    fn check(&self, ctx: &Ctx<'_>, i: usize) -> bool {
        let have = &ctx.fleet.clusters()[i].capabilities;
        ctx.task
            .placement
            .capabilities
            .iter()
            .all(|c| have.contains(c))
    }
    fn why(&self, ctx: &Ctx<'_>, i: usize) -> String {
        let have = &ctx.fleet.clusters()[i].capabilities;
        let missing: Vec<&str> = ctx
            .task
            .placement
            .capabilities
            .iter()
            .filter(|c| !have.contains(c))
            .map(String::as_str)
            .collect();
        format!("lacks the capabilities {}", missing.join(", "))
    }
}

/// One replica must fit on a single node (draft 7.2.2), so replicas never land where only
/// fragments are free.
#[derive(Debug)]
pub struct NodeFit;

impl NodeFit {
    /// The first pod that fits on no node (its component's name, empty for the task's own
    /// replica) and the dimensions it is short of; `None` when every pod fits. A whole set
    /// of components asks it of each component's pod, not of the set.
    fn first_short(ctx: &Ctx<'_>, i: usize) -> Option<(String, Vec<&'static str>)> {
        let f = &ctx.fleet.facts()[i];
        // Pods are counted per node by the member; the largest free node says nothing of them.
        let free = f.largest_free.as_ref()?;
        let short = |demand: &crate::Vector| -> Vec<&'static str> {
            (0..5)
                .filter(|d| *d != 3 && demand[*d] > 0.0 && demand[*d] > free[*d] + 1e-9)
                .map(|d| crate::DIMENSIONS[d])
                .collect()
        };
        if ctx.task.components.len() < 2 {
            let s = short(&ctx.demand);
            return (!s.is_empty()).then(|| (String::new(), s));
        }
        ctx.task.components.iter().find_map(|c| {
            let s = short(&crate::demand_of(&c.request));
            (!s.is_empty() && c.replicas > 0).then(|| (c.name.clone(), s))
        })
    }
}

impl Filter for NodeFit {
    fn name(&self) -> &'static str {
        "NodeFit"
    }
    fn check(&self, ctx: &Ctx<'_>, i: usize) -> bool {
        if !ctx.needs_room() {
            return true;
        }
        NodeFit::first_short(ctx, i).is_none()
    }
    fn why(&self, ctx: &Ctx<'_>, i: usize) -> String {
        let (component, short) = NodeFit::first_short(ctx, i).unwrap_or_default();
        let of = if component.is_empty() {
            String::new()
        } else {
            format!(" of component {component}")
        };
        format!(
            "no single node has room for one replica{of} ({} too short)",
            short.join(", ")
        )
    }
}

/// The cluster's water level after the replicas it would take must stay within the limit.
#[derive(Debug)]
pub struct WaterLevel;

impl Filter for WaterLevel {
    fn name(&self) -> &'static str {
        "WaterLevel"
    }
    fn check(&self, ctx: &Ctx<'_>, i: usize) -> bool {
        if !ctx.needs_room() {
            return true;
        }
        // Replicas it already runs stay (steady mode); shedding is the rescheduler's job.
        if ctx.previous[i] > 0 {
            return true;
        }
        let need = if ctx.divided {
            1
        } else {
            ctx.task.replicas.max(1)
        };
        match ctx.room[i] {
            Some(room) => room >= need,
            None => !ctx.water_division || !ctx.any_known,
        }
    }
    fn why(&self, ctx: &Ctx<'_>, i: usize) -> String {
        if ctx.room[i].is_none() {
            return "the cluster reports no capacity to weigh its water level by".into();
        }
        if let Some(why) = component_over(ctx, i) {
            return why;
        }
        let level = ctx.level_after(i, 1);
        let now = ctx.level_after_now(i, 1);
        if level > now + 5e-3 {
            return format!(
                "its water level would reach {:.2} by the forecast ({}), above the limit {:.2} ({:.2} by its present level)",
                level,
                ctx.ahead.describe(),
                ctx.limit,
                now
            );
        }
        format!(
            "its water level would reach {:.2}, above the limit {:.2}",
            level, ctx.limit
        )
    }
}

/// A whole set of components must fit what the member's ResourceQuotas of its namespace
/// leave free, where the member reports them ([`crate::components::QuotaRoom`]).
#[derive(Debug)]
pub struct ResourceQuota;

impl ResourceQuota {
    fn first_short<'c>(ctx: &'c Ctx<'_>, i: usize) -> Option<(&'c str, &'c str, i64, &'c str)> {
        let components = ctx.task.components;
        if components.len() < 2 {
            return None;
        }
        let name = &ctx.fleet.clusters()[i].name;
        let runs_here = ctx.previous[i] > 0;
        ctx.task
            .quota_room
            .iter()
            .filter(|r| r.cluster == *name)
            .find_map(|r| {
                let (c, limit) = r.first_short(components, runs_here)?;
                Some((c.name.as_str(), r.quota.as_str(), c.replicas, limit))
            })
    }
}

impl Filter for ResourceQuota {
    fn name(&self) -> &'static str {
        "ResourceQuota"
    }
    fn check(&self, ctx: &Ctx<'_>, i: usize) -> bool {
        ResourceQuota::first_short(ctx, i).is_none()
    }
    fn why(&self, ctx: &Ctx<'_>, i: usize) -> String {
        let Some((component, quota, replicas, limit)) = ResourceQuota::first_short(ctx, i) else {
            return String::new();
        };
        format!(
            "component {component} ({replicas} replicas) does not fit: with the components before it, the namespace's ResourceQuota {quota} there would pass its {limit}"
        )
    }
}

/// For a whole set of components: the first component that takes cluster `i` over the limit
/// once the components before it are counted, told as such.
fn component_over(ctx: &Ctx<'_>, i: usize) -> Option<String> {
    let components = ctx.task.components;
    if components.len() < 2 {
        return None;
    }
    let f = &ctx.fleet.facts()[i];
    let base: crate::Vector = std::array::from_fn(|d| {
        // What the set takes now, if it runs here, is not counted against it.
        ctx.base(i, d)
    });
    let mut added = [0.0; 5];
    for c in components {
        let demand = crate::demand_of(&c.request);
        for d in 0..5 {
            added[d] += demand[d] * c.replicas.max(0) as f64;
        }
        let level = (0..5)
            .filter(|d| f.allocatable[*d] > 0.0)
            .map(|d| (base[d] + added[d]) / f.allocatable[d])
            .fold(0.0, f64::max);
        if level > ctx.limit + 1e-9 {
            return Some(format!(
                "component {} ({} replicas) does not fit: with the components before it its water level would reach {level:.2}, above the limit {:.2}",
                c.name, c.replicas, ctx.limit
            ));
        }
    }
    None
}
