//! Orrery's scheduling engine: pure and deterministic, no I/O.
//!
//! Input: the member clusters ([`Fleet`], built from [`ClusterSnapshot`]s) and a task
//! ([`Task`]: what one replica needs, how many, the placement, where it runs now). Output: a
//! [`Decision`]: replicas per cluster, and for every cluster the filter that turned it away or
//! how each score plugin rated it ([`Decision::explain`]).
//!
//! The pipeline follows the draft (7.1-7.4):
//! 1. initialize: validate the task;
//! 2. collect domain information: per cluster, the water level and how many replicas fit
//!    under the limit (totals), and the largest free node (7.2.2);
//! 3. filter ([`filter`]): readiness, eviction, API enablement, cluster affinity, the draft's
//!    `targetClusters`, taints, capabilities, node fit, water level;
//! 4. score ([`score`]): headroom, water level balance, locality, priority, network, with
//!    weights that monitoring adjusts;
//! 5. select: best score first, then spread constraints (min/max groups);
//! 6. divide ([`divide`]): Duplicated, Karmada's static and dynamic weights and Aggregated,
//!    or Orrery's water level division; steady (only the difference moves) or fresh;
//! 7. assume: the caller counts the decision against the clusters ([`assume::AssumeCache`])
//!    until the members report it.
//!
//! Every cluster is visited once per plugin; nothing here reads a clock or allocates per
//! cluster beyond a few numbers.

// Dimension indexes address several vectors at once (capacity, taken, demand).
#![allow(clippy::needless_range_loop)]

pub mod assume;
pub mod divide;
pub mod filter;
pub mod queue;
pub mod score;
mod snapshot;

use std::collections::BTreeMap;

use orrery_api::binding::{ClusterDecision, TargetCluster};
use orrery_api::cluster::ResourceList;
use orrery_api::labels::Selector;
use orrery_api::policy::{
    AGGREGATED, AVAILABLE_REPLICAS, ClusterAffinity, Placement, Target, WATER_LEVEL,
};

pub use divide::divide;
pub use filter::Filter;
pub use score::{Score, Signals, Weights};
pub use snapshot::{ClusterSnapshot, DIMENSIONS, Facts, Fleet, Vector, demand_of, vector_of};

/// Water level limit when the policy sets none: no cluster is filled beyond it.
pub const DEFAULT_WATER_LEVEL_LIMIT: f64 = 0.85;
/// Above this fleet water level, water-filling; below the low mark, aggregation.
pub const DEFAULT_HIGH_MARK: f64 = 0.6;
pub const DEFAULT_LOW_MARK: f64 = 0.3;
/// How far under the limit a cluster that sheds replicas is brought, so it does not flap.
pub const DEFAULT_HYSTERESIS: f64 = 0.05;

/// Steady keeps what runs and moves only the difference; Fresh recomputes everything.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    #[default]
    Steady,
    Fresh,
}

/// What to schedule.
#[derive(Clone, Debug)]
pub struct Task<'a> {
    pub api_version: &'a str,
    pub kind: &'a str,
    /// Replicas to place; for kinds without replicas, 0 (placed whole in each cluster).
    pub replicas: i64,
    /// Whether the kind's replicas can be divided among clusters.
    pub divisible: bool,
    /// What one replica requests.
    pub request: &'a ResourceList,
    pub placement: &'a Placement,
    pub targets: &'a [Target],
    /// Higher goes first in the queue and leans towards quieter clusters.
    pub priority: i32,
    /// The current assignment.
    pub previous: &'a [TargetCluster],
    /// Clusters the workload was evicted from (it may not return).
    pub evicted: &'a [String],
    /// Clusters over their limit for too long: their share is cut to what fits under the
    /// limit less the hysteresis.
    pub shed: &'a [String],
    pub mode: Mode,
    /// Unix seconds, for taints tolerated for a while.
    pub now: i64,
}

/// The engine's settings: the plugins and their weights, and the water level marks.
#[derive(Debug)]
pub struct Config {
    pub filters: Vec<Box<dyn Filter>>,
    pub scores: Vec<Box<dyn Score>>,
    pub weights: Weights,
    pub water_level_limit: f64,
    pub high_mark: f64,
    pub low_mark: f64,
    pub hysteresis: f64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            filters: filter::default_filters(),
            scores: score::default_scores(),
            weights: Weights::default(),
            water_level_limit: DEFAULT_WATER_LEVEL_LIMIT,
            high_mark: DEFAULT_HIGH_MARK,
            low_mark: DEFAULT_LOW_MARK,
            hysteresis: DEFAULT_HYSTERESIS,
        }
    }
}

impl Config {
    /// Karmada's view: placement filters only (no water level, no node fit).
    pub fn karmada() -> Config {
        Config {
            filters: filter::karmada_filters(),
            ..Config::default()
        }
    }
}

/// What the plugins see while one task is scheduled.
#[derive(Debug)]
pub struct Ctx<'a> {
    pub fleet: &'a Fleet,
    pub task: &'a Task<'a>,
    pub affinity: Option<&'a ClusterAffinity>,
    pub target_selectors: Vec<Vec<Selector>>,
    /// Replicas the task runs in each cluster now, by fleet index.
    pub previous: Vec<i64>,
    pub demand: Vector,
    /// Replicas that fit under the limit, by fleet index; `None` when the cluster reports no
    /// capacity.
    pub room: Vec<Option<i64>>,
    pub limit: f64,
    pub divided: bool,
    /// Whether the replicas are divided by water level.
    pub water_division: bool,
    /// Whether any cluster reports capacity.
    pub any_known: bool,
}

impl Ctx<'_> {
    /// Whether the task takes resources (kinds without replicas do not).
    pub fn needs_room(&self) -> bool {
        self.task.replicas > 0
    }

    /// What is taken in cluster `i`, dimension `d`, not counting this task's own replicas.
    pub fn base(&self, i: usize, d: usize) -> f64 {
        (self.fleet.facts()[i].taken(d) - self.previous[i] as f64 * self.demand[d]).max(0.0)
    }

    /// Cluster `i`'s water level, over the dimensions the task needs, with `n` of its
    /// replicas.
    pub fn level_after(&self, i: usize, n: i64) -> f64 {
        let f = &self.fleet.facts()[i];
        let mut level: f64 = 0.0;
        for d in 0..5 {
            if self.demand[d] > 0.0 && f.allocatable[d] > 0.0 {
                level = level.max((self.base(i, d) + n as f64 * self.demand[d]) / f.allocatable[d]);
            }
        }
        level
    }

    /// Replicas of the task that fit in cluster `i` with its level at most `limit`.
    fn room_under(&self, i: usize, limit: f64) -> Option<i64> {
        let f = &self.fleet.facts()[i];
        if !f.known() {
            return None;
        }
        let mut room = i64::MAX;
        for d in 0..5 {
            if self.demand[d] <= 0.0 {
                continue;
            }
            // Pods are not always reported; a missing dimension elsewhere means none of it.
            if f.allocatable[d] <= 0.0 {
                if d == 3 {
                    continue;
                }
                return Some(0);
            }
            let free = limit * f.allocatable[d] - self.base(i, d);
            room = room.min(((free / self.demand[d]) + 1e-9).floor().max(0.0) as i64);
        }
        Some(room)
    }
}

/// Why one cluster got what it got.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Turned away by the filter plugin at this index of the config.
    Filtered(usize),
    /// Left out by a spread constraint.
    Spread(String),
    /// Scored (weighted total, 0-100) and given replicas (possibly 0).
    Scored { total: f64, replicas: i64 },
}

/// The outcome of scheduling one task.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decision {
    /// Replicas per cluster, in name order.
    pub clusters: Vec<TargetCluster>,
    /// The `clusterAffinities` term used, if the placement has terms.
    pub affinity_name: String,
    /// How replicas were divided: Duplicated, StaticWeight, AvailableReplicas, Aggregated,
    /// WaterFilling, Aggregation or ScoreWeighted.
    pub strategy: &'static str,
    /// The water level of the eligible clusters before the decision.
    pub fleet_level: f64,
    /// Replicas that fit nowhere under the limit.
    pub unplaced: i64,
    /// Why nothing (or not everything) could be placed.
    pub error: Option<String>,
    /// One entry per fleet cluster, in fleet order; empty when the task was invalid.
    pub outcomes: Vec<Outcome>,
    /// Per-plugin scores of the scored clusters: fleet index, then one value per plugin.
    pub scores: Vec<(usize, Vec<f64>)>,
}

impl Decision {
    /// Every cluster with its replicas or the reason it got none, and the plugin scores.
    pub fn explain(&self, fleet: &Fleet, task: &Task<'_>, config: &Config) -> Vec<ClusterDecision> {
        let affinity = self.affinity(task);
        let ctx = context(fleet, task, config, affinity.as_ref());
        let scores: BTreeMap<usize, &Vec<f64>> = self.scores.iter().map(|(i, s)| (*i, s)).collect();
        let mut out = Vec::with_capacity(self.outcomes.len());
        for (i, o) in self.outcomes.iter().enumerate() {
            let name = fleet.clusters()[i].name.clone();
            let d = match o {
                Outcome::Filtered(f) => ClusterDecision {
                    name,
                    replicas: None,
                    reason: config.filters[*f].why(&ctx, i),
                    filter: config.filters[*f].name().to_string(),
                    ..Default::default()
                },
                Outcome::Spread(why) => ClusterDecision {
                    name,
                    replicas: None,
                    reason: why.clone(),
                    filter: "SpreadConstraint".into(),
                    ..Default::default()
                },
                Outcome::Scored { total, replicas } => ClusterDecision {
                    name,
                    replicas: (*replicas > 0).then_some(*replicas),
                    reason: if *replicas > 0 {
                        "selected".into()
                    } else {
                        "feasible, but its share rounds to 0 replicas".into()
                    },
                    score: Some(round2(*total)),
                    scores: scores
                        .get(&i)
                        .map(|s| {
                            config
                                .scores
                                .iter()
                                .zip(s.iter())
                                .map(|(p, v)| (p.name().to_string(), round2(*v)))
                                .collect()
                        })
                        .unwrap_or_default(),
                    ..Default::default()
                },
            };
            out.push(d);
        }
        out
    }

    fn affinity(&self, task: &Task<'_>) -> Option<ClusterAffinity> {
        if task.placement.cluster_affinities.is_empty() {
            task.placement.cluster_affinity.clone()
        } else {
            task.placement
                .cluster_affinities
                .iter()
                .find(|t| t.affinity_name == self.affinity_name)
                .map(|t| t.affinity())
        }
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// How a placement divides replicas.
fn strategy_of(task: &Task<'_>) -> &'static str {
    let p = task.placement;
    if !task.divisible || !p.divided() {
        return "Duplicated";
    }
    let rs = p.replica_scheduling.as_ref();
    if rs.is_some_and(|r| r.replica_division_preference == AGGREGATED) {
        return "Aggregated";
    }
    let w = rs.and_then(|r| r.weight_preference.as_ref());
    match w {
        Some(w) if w.dynamic_weight == AVAILABLE_REPLICAS => "AvailableReplicas",
        Some(w) if !w.static_weight_list.is_empty() => "StaticWeight",
        Some(w) if w.dynamic_weight == WATER_LEVEL || w.dynamic_weight.is_empty() => "WaterLevel",
        _ => "WaterLevel",
    }
}

fn context<'a>(
    fleet: &'a Fleet,
    task: &'a Task<'a>,
    config: &Config,
    affinity: Option<&'a ClusterAffinity>,
) -> Ctx<'a> {
    let mut previous = vec![0i64; fleet.len()];
    for p in task.previous {
        if let Some(i) = fleet.position(&p.name) {
            previous[i] = p.replicas.max(0);
        }
    }
    let limit = task
        .placement
        .water_level_limit
        .unwrap_or(config.water_level_limit);
    let strategy = strategy_of(task);
    let mut ctx = Ctx {
        fleet,
        task,
        affinity,
        target_selectors: task
            .targets
            .iter()
            .map(|t| {
                t.labels
                    .iter()
                    .filter_map(|l| Selector::parse(l).ok())
                    .collect()
            })
            .collect(),
        previous,
        demand: demand_of(task.request),
        room: Vec::new(),
        limit,
        divided: strategy != "Duplicated",
        water_division: strategy == "WaterLevel",
        any_known: fleet.facts().iter().any(Facts::known),
    };
    ctx.room = (0..fleet.len()).map(|i| ctx.room_under(i, limit)).collect();
    ctx
}

/// Schedules one task.
pub fn schedule(fleet: &Fleet, task: &Task<'_>, config: &Config) -> Decision {
    if let Err(e) = validate(task, config) {
        return Decision {
            error: Some(e),
            ..Default::default()
        };
    }
    let p = task.placement;
    if p.cluster_affinities.is_empty() {
        return schedule_term(fleet, task, config, p.cluster_affinity.as_ref(), "");
    }
    let mut last = Decision::default();
    for term in &p.cluster_affinities {
        let a = term.affinity();
        let d = schedule_term(fleet, task, config, Some(&a), &term.affinity_name);
        if d.error.is_none() {
            return d;
        }
        last = d;
    }
    last
}

/// Draft 7.1: the task must make sense before anything is looked at.
fn validate(task: &Task<'_>, config: &Config) -> Result<(), String> {
    if task.replicas < 0 {
        return Err(format!(
            "replicas must not be negative, got {}",
            task.replicas
        ));
    }
    let limit = task
        .placement
        .water_level_limit
        .unwrap_or(config.water_level_limit);
    if !(limit > 0.0 && limit <= 1.0) {
        return Err(format!(
            "the water level limit must be in (0, 1], got {limit}"
        ));
    }
    if task.request.values().any(|q| q.is_negative()) {
        return Err("resource requests must not be negative".into());
    }
    Ok(())
}

fn schedule_term(
    fleet: &Fleet,
    task: &Task<'_>,
    config: &Config,
    affinity: Option<&ClusterAffinity>,
    term: &str,
) -> Decision {
    let ctx = context(fleet, task, config, affinity);
    let n = fleet.len();
    let mut outcomes: Vec<Outcome> = Vec::with_capacity(n);
    let mut feasible: Vec<usize> = Vec::with_capacity(n);
    for i in 0..n {
        match config.filters.iter().position(|f| !f.check(&ctx, i)) {
            Some(f) => outcomes.push(Outcome::Filtered(f)),
            None => {
                outcomes.push(Outcome::Scored {
                    total: 0.0,
                    replicas: 0,
                });
                feasible.push(i);
            }
        }
    }
    // Score: one pass per plugin over the feasible clusters.
    let weights = &config.weights;
    let mut per_plugin: Vec<Vec<f64>> = Vec::with_capacity(config.scores.len());
    let mut totals = vec![0.0; feasible.len()];
    let weight_sum: f64 = config.scores.iter().map(|s| weights.of(s.name())).sum();
    for s in &config.scores {
        let mut out = vec![0.0; feasible.len()];
        s.score(&ctx, &feasible, &mut out);
        let w = weights.of(s.name());
        if weight_sum > 0.0 {
            for (t, v) in totals.iter_mut().zip(&out) {
                *t += w * v / weight_sum;
            }
        }
        per_plugin.push(out);
    }
    // Best first: total score, then name (the fleet's order).
    let mut order: Vec<usize> = (0..feasible.len()).collect();
    order.sort_by(|a, b| totals[*b].total_cmp(&totals[*a]).then(a.cmp(b)));
    let mut decision = Decision {
        affinity_name: term.to_string(),
        strategy: strategy_of(task),
        ..Default::default()
    };
    for (k, i) in feasible.iter().enumerate() {
        outcomes[*i] = Outcome::Scored {
            total: totals[k],
            replicas: 0,
        };
        decision
            .scores
            .push((*i, per_plugin.iter().map(|p| p[k]).collect::<Vec<f64>>()));
    }
    let ranked: Vec<usize> = order.iter().map(|k| feasible[*k]).collect();
    let score_of: BTreeMap<usize, f64> = feasible
        .iter()
        .zip(&totals)
        .map(|(i, t)| (*i, *t))
        .collect();
    let kept = match spread(&ctx, ranked, &mut outcomes) {
        Ok(k) => k,
        Err(e) => {
            decision.error = Some(e);
            decision.outcomes = outcomes;
            decision.unplaced = task.replicas;
            return decision;
        }
    };
    if kept.is_empty() {
        decision.error = Some(if n == 0 {
            "no clusters are registered".to_string()
        } else {
            format!("0/{n} clusters are available")
        });
        decision.unplaced = task.replicas;
        decision.outcomes = outcomes;
        return decision;
    }
    let result = allocate(&ctx, config, &kept, &score_of, &mut decision);
    if let Err(e) = result {
        decision.error = Some(e);
    }
    for t in &decision.clusters {
        if let Some(i) = fleet.position(&t.name)
            && let Outcome::Scored { replicas, .. } = &mut outcomes[i]
        {
            *replicas = t.replicas;
        }
    }
    decision.outcomes = outcomes;
    decision
}

/// The group of a cluster under a spread key.
fn group_of(c: &ClusterSnapshot, field: &str, label: &str) -> String {
    if !label.is_empty() {
        return c.labels.get(label).cloned().unwrap_or_default();
    }
    match field {
        "region" => c.region.clone(),
        "zone" => c.zones.first().cloned().unwrap_or_default(),
        "provider" => c.provider.clone(),
        _ => c.name.clone(),
    }
}

/// Applies spread constraints to the ranked clusters; returns the kept ones (still ranked)
/// or why the minimum cannot be met.
fn spread(
    ctx: &Ctx<'_>,
    ranked: Vec<usize>,
    outcomes: &mut [Outcome],
) -> Result<Vec<usize>, String> {
    let mut kept = ranked;
    let clusters = ctx.fleet.clusters();
    for s in &ctx.task.placement.spread_constraints {
        let key = if s.spread_by_label.is_empty() {
            s.spread_by_field.as_str()
        } else {
            s.spread_by_label.as_str()
        };
        let mut order: Vec<String> = Vec::new();
        let mut group_of_idx: Vec<(usize, usize)> = Vec::new();
        for i in &kept {
            let g = group_of(&clusters[*i], &s.spread_by_field, &s.spread_by_label);
            if g.is_empty() {
                outcomes[*i] = Outcome::Spread(format!("has no value for the spread key {key}"));
                continue;
            }
            let gi = match order.iter().position(|x| *x == g) {
                Some(p) => p,
                None => {
                    order.push(g);
                    order.len() - 1
                }
            };
            group_of_idx.push((*i, gi));
        }
        if (order.len() as i64) < s.min_groups {
            return Err(format!(
                "spread by {key} needs at least {} groups, only {} are feasible",
                s.min_groups,
                order.len()
            ));
        }
        let max = if s.max_groups > 0 {
            s.max_groups as usize
        } else {
            usize::MAX
        };
        let mut next = Vec::new();
        for (i, gi) in group_of_idx {
            if gi < max {
                next.push(i);
            } else {
                outcomes[i] =
                    Outcome::Spread(format!("spread by {key} allows at most {max} groups"));
            }
        }
        kept = next;
    }
    Ok(kept)
}

fn static_weight(c: &ClusterSnapshot, placement: &Placement) -> i64 {
    placement
        .replica_scheduling
        .as_ref()
        .and_then(|r| r.weight_preference.as_ref())
        .and_then(|w| {
            w.static_weight_list
                .iter()
                .find(|s| s.target_cluster.matches(&c.view()))
        })
        .map(|s| s.weight)
        .unwrap_or(0)
}

/// Divides the replicas over the kept clusters (best-ranked first) into `decision`.
fn allocate(
    ctx: &Ctx<'_>,
    config: &Config,
    kept: &[usize],
    score_of: &BTreeMap<usize, f64>,
    decision: &mut Decision,
) -> Result<(), String> {
    let task = ctx.task;
    let clusters = ctx.fleet.clusters();
    let name = |i: usize| clusters[i].name.clone();
    if decision.strategy == "Duplicated" {
        decision.clusters = kept
            .iter()
            .map(|i| TargetCluster {
                name: name(*i),
                replicas: task.replicas,
            })
            .collect();
        decision.clusters.sort_by(|a, b| a.name.cmp(&b.name));
        return Ok(());
    }
    let fresh = task.mode == Mode::Fresh || kept.iter().all(|i| ctx.previous[*i] == 0);
    let mut shares = divide::Shares {
        ctx,
        idx: kept.to_vec(),
        n: kept
            .iter()
            .map(|i| if fresh { 0 } else { ctx.previous[*i] })
            .collect(),
        room: kept.iter().map(|i| ctx.room[*i]).collect(),
        score: kept
            .iter()
            .map(|i| score_of.get(i).copied().unwrap_or(0.0))
            .collect(),
    };
    // Shedding: a cluster over its limit keeps only what fits under limit - hysteresis.
    for (j, i) in kept.iter().enumerate() {
        if task.shed.contains(&clusters[*i].name)
            && let Some(r) = ctx.room_under(*i, ctx.limit - config.hysteresis)
        {
            shares.n[j] = shares.n[j].min(r);
            shares.room[j] = Some(r);
        }
    }
    let have: i64 = shares.n.iter().sum();
    let delta = task.replicas - have;
    let mut unplaced = 0;
    match decision.strategy {
        "StaticWeight" => {
            let w: Vec<i64> = kept
                .iter()
                .map(|i| static_weight(&clusters[*i], task.placement))
                .collect();
            if w.iter().all(|x| *x <= 0) {
                return Err("every feasible cluster has a static weight of 0".into());
            }
            shares.n = divide(task.replicas, &w);
        }
        "AvailableReplicas" | "Aggregated" => {
            let avail: Vec<i64> = kept
                .iter()
                .map(|i| {
                    clusters[*i]
                        .available_replicas(task.request)
                        .unwrap_or(1_000_000)
                })
                .collect();
            if delta < 0 {
                shares.shrink(-delta);
            } else if decision.strategy == "Aggregated" {
                // Fewest clusters: the roomiest first; what fits nowhere goes to the roomiest.
                let mut order: Vec<usize> = (0..kept.len()).collect();
                order.sort_by(|a, b| avail[*b].cmp(&avail[*a]).then(a.cmp(b)));
                let mut left = delta;
                for j in &order {
                    let n = left.min(avail[*j].max(0));
                    shares.n[*j] += n;
                    left -= n;
                }
                if left > 0 {
                    shares.n[order[0]] += left;
                }
            } else {
                if avail.iter().all(|x| *x == 0) {
                    return Err("no cluster has room for a single replica".into());
                }
                shares.by_weights(delta, &avail);
            }
        }
        _ => {
            decision.fleet_level = fleet_level(ctx, kept);
            if !ctx.any_known {
                // Nothing reports capacity: equal shares, ranked.
                decision.strategy = "ScoreWeighted";
                shares.score = vec![1.0; kept.len()];
            } else if decision.fleet_level >= config.high_mark {
                decision.strategy = "WaterFilling";
            } else if decision.fleet_level <= config.low_mark {
                decision.strategy = "Aggregation";
            } else {
                decision.strategy = "ScoreWeighted";
            }
            if delta < 0 {
                shares.drain(-delta);
            } else if delta > 0 {
                let placed = match decision.strategy {
                    "WaterFilling" => shares.water_fill(delta),
                    "Aggregation" => {
                        let (groups, min) = spread_groups(ctx, kept);
                        shares.aggregate(delta, &groups, min)
                    }
                    _ => shares.by_score(delta),
                };
                unplaced = delta - placed;
            }
        }
    }
    decision.unplaced = unplaced;
    decision.clusters = kept
        .iter()
        .zip(&shares.n)
        .filter(|(_, n)| **n > 0)
        .map(|(i, n)| TargetCluster {
            name: name(*i),
            replicas: *n,
        })
        .collect();
    decision.clusters.sort_by(|a, b| a.name.cmp(&b.name));
    if unplaced > 0 {
        return Err(format!(
            "{unplaced} of {} replicas fit in no cluster under the water level limit {:.2}",
            task.replicas, ctx.limit
        ));
    }
    if decision.clusters.is_empty() && task.replicas > 0 {
        return Err("no cluster received a replica".into());
    }
    Ok(())
}

/// The water level of the kept clusters together, over the task's dimensions.
fn fleet_level(ctx: &Ctx<'_>, kept: &[usize]) -> f64 {
    let facts = ctx.fleet.facts();
    let mut best: f64 = 0.0;
    for d in 0..5 {
        if ctx.demand[d] <= 0.0 {
            continue;
        }
        let (mut taken, mut cap) = (0.0, 0.0);
        for i in kept {
            if facts[*i].allocatable[d] > 0.0 {
                taken += ctx.base(*i, d);
                cap += facts[*i].allocatable[d];
            }
        }
        if cap > 0.0 {
            best = best.max(taken / cap);
        }
    }
    best
}

/// The groups of the spread constraint with the largest minimum, for aggregation.
fn spread_groups(ctx: &Ctx<'_>, kept: &[usize]) -> (Vec<String>, usize) {
    let clusters = ctx.fleet.clusters();
    match ctx
        .task
        .placement
        .spread_constraints
        .iter()
        .filter(|s| s.min_groups > 0)
        .max_by_key(|s| s.min_groups)
    {
        Some(s) => (
            kept.iter()
                .map(|i| group_of(&clusters[*i], &s.spread_by_field, &s.spread_by_label))
                .collect(),
            s.min_groups as usize,
        ),
        None => (vec![String::new(); kept.len()], 0),
    }
}

#[cfg(test)]
mod tests;
