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
//! 3. filter ([`filter`]): readiness, eviction, API enablement, affinity, the draft's
//!    `targetClusters`, taints, capabilities, node fit, member quota, water level;
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

mod allocate;
pub mod assume;
pub mod components;
pub mod cost;
pub mod data;
pub mod divide;
pub mod filter;
pub mod moves;
mod overflow;
pub mod profile;
pub mod queue;
pub mod score;
mod snapshot;

use std::collections::BTreeMap;

use orrery_api::binding::{ClusterDecision, TargetCluster};
use orrery_api::cluster::ResourceList;
use orrery_api::labels::Selector;
use orrery_api::overrides::CompiledAffinity;
use orrery_api::policy::{AGGREGATED, AVAILABLE_REPLICAS, ClusterAffinity, Placement, Target};
use orrery_api::prediction::{Ahead, LevelSeen};

pub use cost::cost_of;
pub use divide::divide;
pub use filter::Filter;
pub use score::{Score, Signals, Weights};
pub use snapshot::{
    ClusterSnapshot, Crossing, DIMENSIONS, Facts, Fleet, Outlook, Present, Vector, Window,
    demand_of, vector_of,
};

/// Water level limit when the policy sets none: no cluster is filled beyond it.
pub const DEFAULT_WATER_LEVEL_LIMIT: f64 = 0.85;
/// Above this fleet water level, water-filling; below the low mark, aggregation.
pub const DEFAULT_HIGH_MARK: f64 = 0.6;
pub const DEFAULT_LOW_MARK: f64 = 0.3;
/// Clusters scored per decision in a large fleet (see [`Config::score_sample`]).
pub const DEFAULT_SCORE_SAMPLE: usize = 128;
/// How far under the limit a cluster that sheds replicas is brought, so it does not flap.
pub const DEFAULT_HYSTERESIS: f64 = 0.05;
/// Water level a cluster must stay above (for the shed window) before it sheds replicas.
/// Above the placement limit on purpose: between the two every pod still runs, and a
/// background load that drifts into that band comes back out of it on its own, so moving
/// replicas there would be churn with nothing gained. New replicas still avoid the band.
pub const DEFAULT_SHED_MARK: f64 = 0.95;
/// The least a replica's price must fall, as a share of it, for consolidation to move it.
pub const DEFAULT_CONSOLIDATE_SAVING: f64 = 0.1;
/// Bindings the controller decides again per round of consolidation (see
/// [`Mode::Consolidate`]); a round is every five minutes by default.
pub const DEFAULT_CONSOLIDATE_PER_ROUND: usize = 1000;

/// Steady keeps what runs and moves only the difference; Fresh recomputes everything;
/// Consolidate keeps what runs, then moves replicas to clusters where they cost at least
/// [`Config::consolidate_saving`] less and that have room (for a placement that consolidates,
/// `cost.consolidate`, divided by water level; otherwise as Steady).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    #[default]
    Steady,
    Fresh,
    Consolidate,
}

/// What to schedule.
#[derive(Clone, Debug)]
pub struct Task<'a> {
    /// The API the workload needs in a member; empty for a standalone task, which needs none.
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
    /// Clusters not above the shed mark yet whose forecast crosses it: each keeps what the
    /// mean of its forecast, as far as it reaches, has under the shed mark less the
    /// hysteresis. Moving ahead of a peak is prevention: it moves what keeps the cluster from
    /// crossing the mark, not what would bring it under the limit.
    pub shed_ahead: &'a [String],
    pub mode: Mode,
    /// Unix seconds, for taints tolerated for a while.
    pub now: i64,
    /// Picks which clusters are scored when the fleet is larger than
    /// [`Config::score_sample`] (the caller passes something stable per binding, so the same
    /// input gives the same output and different bindings see different samples).
    pub seed: u64,
    /// What ties the task to its data and to other workloads.
    pub relations: Relations<'a>,
    /// Its components: two or more are scheduled as one whole set ([`components`]), which
    /// must fit what members report their ResourceQuotas of its namespace leave free.
    pub components: &'a [components::ComponentNeed],
    pub quota_room: &'a [components::QuotaRoom],
}

/// What ties a task to its data and to other workloads (none by default).
#[derive(Clone, Copy, Debug, Default)]
pub struct Relations<'a> {
    /// The storage classes its volumes need (empty: the member's default).
    pub storage_classes: &'a [String],
    /// The only clusters it may run in, and why (its leader's, for follow-up scheduling;
    /// its affinity group's); `None`: any.
    pub within: Option<(&'a [String], &'a str)>,
    /// Clusters it may not run in, and why (its anti-affinity group's).
    pub avoid: Option<(&'a [String], &'a str)>,
    /// Clusters it should be close to, by latency (its leader's, when they cannot hold it).
    pub near: &'a [String],
    /// The data sets it reads and its work (data-aware scheduling).
    pub data: Option<&'a data::DataNeeds>,
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
    /// When more clusters than this pass the placement filters, only this many are scored
    /// (evenly strided from a per-task offset, plus every cluster the task runs in), as
    /// Kubernetes' `percentageOfNodesToScore` does; 0 scores them all.
    pub score_sample: usize,
    /// How far ahead, and at which bound, clusters are judged when a placement does not say
    /// (`placement.prediction`).
    pub prediction: Ahead,
    /// The water level above which clusters shed replicas (at least the limit): no replica
    /// is placed where the mean of the cluster's forecast would take it above this.
    pub shed_mark: f64,
    /// The least share of a replica's price that moving it must save ([`Mode::Consolidate`]).
    pub consolidate_saving: f64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            filters: profile::default_filters(),
            scores: profile::default_scores(),
            weights: Weights::default(),
            water_level_limit: DEFAULT_WATER_LEVEL_LIMIT,
            high_mark: DEFAULT_HIGH_MARK,
            low_mark: DEFAULT_LOW_MARK,
            hysteresis: DEFAULT_HYSTERESIS,
            score_sample: DEFAULT_SCORE_SAMPLE,
            prediction: Ahead::default(),
            shed_mark: DEFAULT_SHED_MARK,
            consolidate_saving: DEFAULT_CONSOLIDATE_SAVING,
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
    pub affinity: Option<CompiledAffinity<'a>>,
    /// The task's `(apiVersion, kind)`, as clusters list what they serve.
    pub api_key: (String, String),
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
    /// How far ahead clusters are judged (by the placement, else the config).
    pub ahead: Ahead,
    /// Above this water level clusters shed replicas: none is placed where the forecast
    /// says it would have to move again.
    pub mark: f64,
    /// What the forecast adds to the dimensions of the clusters whose room is worked out,
    /// over the horizon and, by its mean, over all it reaches (in the dimensions' units);
    /// `None` where the present level stands. `rise_slot` holds each cluster's index into it
    /// (`u32::MAX`: not worked out); both are empty when no cluster has a forecast.
    pub rise: Vec<Option<(Vector, Vector)>>,
    pub rise_slot: Vec<u32>,
    /// Replicas that fit in each cluster (by fleet index) before its forecast crosses the
    /// shed mark ([`Ctx::room_before_mark`]), worked out with `room`; `None` where the cluster
    /// is not judged by a forecast. A division fills this room first, and the rest of `room`
    /// only with what fits nowhere else: a replica placed there would likely have to move
    /// again, but one placed nowhere is Pending now.
    pub mark_room: Vec<Option<i64>>,
}

impl<'a> Ctx<'a> {
    /// What one replica costs per hour in cluster `i`; `None` where it has no price for what
    /// the task requests.
    pub fn unit_cost(&self, i: usize) -> Option<f64> {
        cost::unit_hourly(&self.fleet.facts()[i].prices, &self.demand).ok()
    }

    /// The placement's `cost.weight` (0 when it has none).
    pub fn cost_weight(&self) -> f64 {
        self.task
            .placement
            .cost
            .as_ref()
            .map_or(0.0, orrery_api::cost::CostPolicy::weight)
    }

    /// Whether the placement has a budget (`cost.maxHourly`).
    pub fn has_budget(&self) -> bool {
        self.task
            .placement
            .cost
            .as_ref()
            .is_some_and(|c| c.max_hourly.is_some())
    }

    /// The task's data needs, when it reads data sets.
    pub fn data_needs(&self) -> Option<&'a data::DataNeeds> {
        self.task.relations.data
    }
}

impl Ctx<'_> {
    /// Whether the task takes resources (kinds without replicas do not).
    pub fn needs_room(&self) -> bool {
        self.task.replicas > 0
    }

    /// What is taken in cluster `i`, dimension `d`, not counting this task's own replicas;
    /// with what the forecast adds over the horizon where the cluster is judged by it.
    pub fn base(&self, i: usize, d: usize) -> f64 {
        let f = &self.fleet.facts()[i];
        (f.taken(d) - self.previous[i] as f64 * self.demand[d]).max(0.0) + self.rise_of(i, d)
    }

    /// What the forecast adds to cluster `i`'s dimension `d` over the horizon.
    pub fn rise_of(&self, i: usize, d: usize) -> f64 {
        match self.rise_slot.get(i) {
            Some(&k) if k != u32::MAX => self.rise[k as usize].map_or(0.0, |r| r.0[d]),
            Some(_) => self.fleet.facts()[i].rise(d, self.task.now, &self.ahead),
            // No cluster has a forecast.
            None => 0.0,
        }
    }

    /// Cluster `i`'s overall water level as the task judges it (the larger of the present
    /// level and the forecast over the horizon, per dimension).
    pub fn level_ahead(&self, i: usize) -> f64 {
        let f = &self.fleet.facts()[i];
        (0..5)
            .filter(|d| f.allocatable[*d] > 0.0)
            .map(|d| (f.taken(d) + self.rise_of(i, d)) / f.allocatable[d])
            .fold(0.0, f64::max)
    }

    /// What a decision saw of cluster `i`'s water level.
    pub fn level_seen(&self, i: usize) -> LevelSeen {
        let f = &self.fleet.facts()[i];
        let round = |x: f64| (x * 1000.0).round() / 1000.0;
        match f.outlook_step(self.task.now, &self.ahead) {
            Ok(_) => LevelSeen {
                now: round(f.level()),
                ahead: Some(round(f.level_ahead(self.task.now, &self.ahead))),
                basis: self.ahead.describe(),
            },
            Err(why) => LevelSeen {
                now: round(f.level()),
                ahead: None,
                basis: format!("present level ({})", why.reason()),
            },
        }
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

    /// [`Ctx::level_after`] by the present level alone, whatever the forecast says.
    pub fn level_after_now(&self, i: usize, n: i64) -> f64 {
        let f = &self.fleet.facts()[i];
        let mut level: f64 = 0.0;
        for d in 0..5 {
            if self.demand[d] > 0.0 && f.allocatable[d] > 0.0 {
                let base = (f.taken(d) - self.previous[i] as f64 * self.demand[d]).max(0.0);
                level = level.max((base + n as f64 * self.demand[d]) / f.allocatable[d]);
            }
        }
        level
    }

    /// Replicas of the task that fit in cluster `i` with its level at most `limit`.
    pub(crate) fn room_under(&self, i: usize, limit: f64) -> Option<i64> {
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

    /// Replicas that fit in cluster `i` before the mean of its forecast, over all the
    /// forecast reaches, takes it above the shed mark: a replica placed beyond that would be
    /// moved again before long. `None` where the cluster is not judged by its forecast.
    pub(crate) fn room_before_mark(&self, i: usize) -> Option<i64> {
        self.room_before(i, self.fill_mark())
    }

    /// Where a division stops filling a cluster by its forecast's reach before it looks
    /// elsewhere: the shed mark; for a placement that weighs price, the limit (it packs the
    /// cheaper clusters fuller, and their daily peak must not take them past the limit).
    pub fn fill_mark(&self) -> f64 {
        if self.cost_weight() > 0.0 {
            self.limit
        } else {
            self.mark
        }
    }

    /// Replicas that fit in cluster `i` with the mean of its forecast, over all the forecast
    /// reaches, at most `level`; `None` where the cluster is not judged by its forecast.
    fn room_before(&self, i: usize, level: f64) -> Option<i64> {
        let f = &self.fleet.facts()[i];
        let (_, reach) = match self.rise_slot.get(i) {
            Some(&k) if k != u32::MAX => self.rise[k as usize]?,
            _ => f.rises(self.task.now, &self.ahead)?,
        };
        let mut room = i64::MAX;
        for d in 0..5 {
            if self.demand[d] <= 0.0 || f.allocatable[d] <= 0.0 {
                continue;
            }
            let base = (f.taken(d) - self.previous[i] as f64 * self.demand[d]).max(0.0) + reach[d];
            let free = level * f.allocatable[d] - base;
            room = room.min(((free / self.demand[d]) + 1e-9).floor().max(0.0) as i64);
        }
        Some(room)
    }

    /// The room of cluster `i` both under the limit and before its forecast crosses the
    /// shed mark (what a division fills first).
    pub fn room_ahead(&self, i: usize) -> Option<i64> {
        let room = self.room[i]?;
        Some(self.mark_room[i].map_or(room, |m| room.min(m)))
    }
}

/// Why one cluster got what it got.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Outcome {
    /// Turned away by the filter plugin at this index of the config.
    Filtered(usize),
    /// Left out by the spread constraint at this index of the placement.
    Spread(usize, SpreadWhy),
    /// Feasible by placement, but not among the clusters scored in a large fleet.
    NotSampled,
    /// Scored (weighted total, 0-100) and given replicas (possibly 0).
    Scored { total: f64, replicas: i64 },
    /// In the overflow group at this index of its term (1: the first overflow group), which
    /// the decision did not need: the groups before it had room.
    Reserve(usize),
}

/// Why a spread constraint left a cluster out.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SpreadWhy {
    /// The cluster has no value for the spread key.
    NoValue,
    /// Its group ranks beyond `maxGroups`.
    TooMany,
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
    /// Replicas moved to cheaper clusters ([`Mode::Consolidate`]).
    pub consolidated: i64,
    /// Why nothing (or not everything) could be placed.
    pub error: Option<String>,
    /// What became of each fleet cluster; empty when the task was invalid.
    pub outcomes: Outcomes,
    /// The clusters that passed the filters (fleet indexes), in fleet order.
    pub scored: Vec<usize>,
    /// Per plugin: a score per scored cluster, or one value for all of them.
    pub plugin_scores: Vec<PluginScores>,
}

/// One score plugin's ratings of the scored clusters.
#[derive(Clone, Debug, PartialEq)]
pub enum PluginScores {
    Each(Vec<f64>),
    /// The plugin rates every cluster the same (it cannot change the ranking).
    All(f64),
    /// The plugin has nothing to say of this task ([`score::Score::applies`]).
    NotApplicable,
}

impl PluginScores {
    fn get(&self, k: usize) -> f64 {
        match self {
            PluginScores::Each(v) => v.get(k).copied().unwrap_or(0.0),
            PluginScores::All(x) => *x,
            PluginScores::NotApplicable => 0.0,
        }
    }
}

impl Decision {
    /// Every cluster with its replicas or the reason it got none, and the plugin scores.
    pub fn explain(&self, fleet: &Fleet, task: &Task<'_>, config: &Config) -> Vec<ClusterDecision> {
        let affinity = self.affinity(task);
        let mut ctx = context(fleet, task, config, affinity.as_ref());
        ctx.fill_room(0..fleet.len());
        let position = self.positions();
        (0..self.outcomes.len())
            .map(|i| self.render(&ctx, config, &position, i))
            .collect()
    }

    /// What a binding's status and the history keep: the chosen clusters, then the best of
    /// the others, then those filtered out, up to `max` explained; and how many clusters each
    /// filter (or the spread constraints, or sampling) turned away. Only the explained
    /// clusters are rendered, so this costs little in a large fleet.
    pub fn summary(
        &self,
        fleet: &Fleet,
        task: &Task<'_>,
        config: &Config,
        max: usize,
    ) -> (Vec<ClusterDecision>, BTreeMap<String, i64>) {
        // Counted by index first (a string map per cluster costs too much in a large fleet),
        // and without walking the fleet: the clusters not looked at closely are counted once
        // per placement in the static pass, corrected here for those that were.
        let mut by_filter = vec![0i64; config.filters.len()];
        let (mut spread_out, mut not_sampled, mut reserved) = (0i64, 0i64, 0i64);
        match &self.outcomes.statics {
            Some(s) => {
                for (f, n) in s.turned_away.iter().enumerate() {
                    by_filter[f] += n;
                }
                not_sampled += s.passing.len() as i64;
            }
            None => not_sampled += self.outcomes.len() as i64,
        }
        let mut chosen: Vec<(f64, usize)> = Vec::new();
        let mut others: Vec<(f64, usize)> = Vec::new();
        for (i, o) in &self.outcomes.entries {
            match self.outcomes.unlooked(*i) {
                Outcome::Filtered(f) => by_filter[f] -= 1,
                _ => not_sampled -= 1,
            }
            match *o {
                Outcome::Scored { total, replicas } if replicas > 0 => chosen.push((total, *i)),
                Outcome::Scored { total, .. } => others.push((total, *i)),
                Outcome::Filtered(f) => by_filter[f] += 1,
                Outcome::Spread(..) => spread_out += 1,
                Outcome::NotSampled => not_sampled += 1,
                Outcome::Reserve(_) => reserved += 1,
            }
        }
        // The first `max` clusters turned away, in fleet order: usually found in a few steps.
        let mut turned_away: Vec<usize> = Vec::new();
        for i in 0..self.outcomes.len() {
            if turned_away.len() >= max {
                break;
            }
            if !matches!(self.outcomes.get(i), Outcome::Scored { .. }) {
                turned_away.push(i);
            }
        }
        let mut filtered: BTreeMap<String, i64> = BTreeMap::new();
        for (f, n) in config.filters.iter().zip(by_filter) {
            if n > 0 {
                *filtered.entry(f.name().to_string()).or_default() += n;
            }
        }
        if spread_out > 0 {
            filtered.insert("SpreadConstraint".into(), spread_out);
        }
        if not_sampled > 0 {
            filtered.insert("Sample".into(), not_sampled);
        }
        if reserved > 0 {
            filtered.insert("OverflowAffinity".into(), reserved);
        }
        let by_score = |a: &(f64, usize), b: &(f64, usize)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        chosen.sort_by(by_score);
        others.sort_by(by_score);
        let mut picked: Vec<usize> = chosen
            .iter()
            .chain(&others)
            .map(|(_, i)| *i)
            .chain(turned_away)
            .take(max)
            .collect();
        picked.sort_unstable();
        let affinity = self.affinity(task);
        let mut ctx = context(fleet, task, config, affinity.as_ref());
        ctx.fill_room(picked.iter().copied());
        let position = self.positions();
        let explained = picked
            .into_iter()
            .map(|i| self.render(&ctx, config, &position, i))
            .collect();
        (explained, filtered)
    }

    fn positions(&self) -> BTreeMap<usize, usize> {
        self.scored
            .iter()
            .enumerate()
            .map(|(k, i)| (*i, k))
            .collect()
    }

    fn render(
        &self,
        ctx: &Ctx<'_>,
        config: &Config,
        position: &BTreeMap<usize, usize>,
        i: usize,
    ) -> ClusterDecision {
        let name = ctx.fleet.clusters()[i].name.clone();
        let outcome = self.outcomes.get(i);
        let mut out = match outcome {
            Outcome::Filtered(f) => ClusterDecision {
                name,
                replicas: None,
                reason: config.filters[f].why(ctx, i),
                filter: config.filters[f].name().to_string(),
                ..Default::default()
            },
            Outcome::Spread(c, why) => {
                let sc = &ctx.task.placement.spread_constraints[c];
                let key = if sc.spread_by_label.is_empty() {
                    &sc.spread_by_field
                } else {
                    &sc.spread_by_label
                };
                ClusterDecision {
                    name,
                    replicas: None,
                    reason: match why {
                        SpreadWhy::NoValue => format!("has no value for the spread key {key}"),
                        SpreadWhy::TooMany => {
                            format!("spread by {key} allows at most {} groups", sc.max_groups)
                        }
                    },
                    filter: "SpreadConstraint".into(),
                    ..Default::default()
                }
            }
            Outcome::Reserve(k) => ClusterDecision {
                reason: format!(
                    "in the overflow group {}: it takes replicas only when the groups before it are full",
                    self.overflow_group(ctx.task, k)
                ),
                name,
                replicas: None,
                filter: "OverflowAffinity".into(),
                ..Default::default()
            },
            Outcome::NotSampled => ClusterDecision {
                name,
                replicas: None,
                reason: format!(
                    "not among the {} clusters scored for this decision",
                    config.score_sample
                ),
                filter: "Sample".into(),
                ..Default::default()
            },
            Outcome::Scored { total, replicas } => ClusterDecision {
                estimate: ctx
                    .task
                    .relations
                    .data
                    .filter(|d| !d.is_empty())
                    .map(|d| data::estimate(ctx, i, d).summary()),
                name,
                replicas: (replicas > 0).then_some(replicas),
                reason: if replicas > 0 {
                    "selected".into()
                } else if ctx.mark_room.get(i).copied().flatten() == Some(0)
                    && ctx.room[i].is_some_and(|r| r > 0)
                {
                    format!(
                        "feasible, but its forecast takes it above {} {:.2} within the forecast's reach (its mean, or the last season's peak): it takes replicas only when they fit nowhere else",
                        if ctx.fill_mark() <= ctx.limit {
                            "the limit"
                        } else {
                            "the shed mark"
                        },
                        ctx.fill_mark()
                    )
                } else {
                    "feasible, but its share rounds to 0 replicas".into()
                },
                score: Some(round2(total)),
                scores: position
                    .get(&i)
                    .map(|k| {
                        config
                            .scores
                            .iter()
                            .zip(&self.plugin_scores)
                            .filter(|(_, v)| !matches!(v, PluginScores::NotApplicable))
                            .map(|(p, v)| (p.name().to_string(), round2(v.get(*k))))
                            .collect()
                    })
                    .unwrap_or_default(),
                ..Default::default()
            },
        };
        // The level it was judged by, where the level mattered: it was scored, or turned away
        // for want of room.
        let judged = match outcome {
            Outcome::Scored { .. } => true,
            Outcome::Filtered(f) => !config.filters[f].is_static(),
            _ => false,
        };
        if judged && ctx.needs_room() && ctx.fleet.facts()[i].known() {
            out.water_level = Some(ctx.level_seen(i));
        }
        if ctx.needs_room() {
            out.replica_hourly = ctx.unit_cost(i).map(cost::round_cost);
        }
        out
    }

    /// How the decision judged the water levels of the clusters it looked at closely: `Upper80
    /// over 30m: forecast for 4 of 5 clusters; present level for 1 (less than a season of
    /// history: c)`. Empty for a task that takes no room.
    pub fn prediction(&self, fleet: &Fleet, task: &Task<'_>, config: &Config) -> String {
        if task.replicas <= 0 || self.outcomes.entries.is_empty() {
            return String::new();
        }
        let affinity = self.affinity(task);
        let ctx = context(fleet, task, config, affinity.as_ref());
        if ctx.ahead.is_off() {
            return format!("present level ({})", Present::Off.reason());
        }
        let mut forecast = 0usize;
        let mut present: BTreeMap<Present, Vec<&str>> = BTreeMap::new();
        let mut looked = 0usize;
        for (i, o) in &self.outcomes.entries {
            let judged = match o {
                Outcome::Scored { .. } => true,
                Outcome::Filtered(f) => !config.filters[*f].is_static(),
                _ => false,
            };
            let f = &fleet.facts()[*i];
            if !judged || !f.known() {
                continue;
            }
            looked += 1;
            match f.outlook_step(task.now, &ctx.ahead) {
                Ok(_) => forecast += 1,
                Err(why) => present
                    .entry(why)
                    .or_default()
                    .push(&fleet.clusters()[*i].name),
            }
        }
        if looked == 0 {
            return String::new();
        }
        let mut msg = format!(
            "{}: forecast for {forecast} of {looked} clusters",
            ctx.ahead.describe()
        );
        for (why, names) in present {
            let shown: Vec<&str> = names.iter().take(3).copied().collect();
            let more = if names.len() > 3 { ", ..." } else { "" };
            msg.push_str(&format!(
                "; present level for {} ({}: {}{more})",
                names.len(),
                why.reason(),
                shown.join(", ")
            ));
        }
        msg
    }

    /// The name of the overflow group at index `k` of the term the decision used.
    fn overflow_group<'t>(&self, task: &'t Task<'_>, k: usize) -> &'t str {
        task.placement
            .cluster_affinities
            .iter()
            .find(|t| t.affinity_name == self.affinity_name)
            .and_then(|t| t.overflow_affinities.get(k.wrapping_sub(1)))
            .map_or("", |o| o.affinity_name.as_str())
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
    strategy(task.placement, task.divisible)
}

/// How a placement divides the replicas of a kind (`divisible`: whether the kind's replicas
/// can be split): Duplicated, Aggregated, AvailableReplicas, StaticWeight or WaterLevel.
pub fn strategy(p: &Placement, divisible: bool) -> &'static str {
    if !divisible || !p.divided() {
        return "Duplicated";
    }
    let rs = p.replica_scheduling.as_ref();
    if rs.is_some_and(|r| r.replica_division_preference == AGGREGATED) {
        return "Aggregated";
    }
    match rs.and_then(|r| r.weight_preference.as_ref()) {
        Some(w) if w.dynamic_weight == AVAILABLE_REPLICAS => "AvailableReplicas",
        Some(w) if !w.static_weight_list.is_empty() => "StaticWeight",
        // No weights, or `dynamicWeight: WaterLevel`.
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
        affinity: affinity.map(ClusterAffinity::compile),
        api_key: (task.api_version.to_string(), task.kind.to_string()),
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
        ahead: task
            .placement
            .prediction
            .as_ref()
            .map_or(config.prediction, |p| p.resolve(config.prediction)),
        // A placement that consolidates onto cheaper clusters is held under the limit by
        // moving: its replicas are shed at the limit, not the shed mark.
        mark: if task.placement.consolidates() {
            limit
        } else {
            config.shed_mark.max(limit)
        },
        rise: Vec::new(),
        rise_slot: Vec::new(),
        mark_room: Vec::new(),
    };
    ctx.room = vec![None; fleet.len()];
    ctx.mark_room = vec![None; fleet.len()];
    ctx
}

impl Ctx<'_> {
    fn fill_room(&mut self, clusters: impl Iterator<Item = usize>) {
        let ahead = self.fleet.has_outlooks() && !self.ahead.is_off();
        if ahead && self.rise_slot.is_empty() {
            self.rise_slot = vec![u32::MAX; self.fleet.len()];
        }
        for i in clusters {
            if ahead && self.rise_slot[i] == u32::MAX {
                self.rise_slot[i] = self.rise.len() as u32;
                self.rise
                    .push(self.fleet.facts()[i].rises(self.task.now, &self.ahead));
            }
            self.room[i] = self.room_under(i, self.limit);
            if ahead {
                self.mark_room[i] = self.room_before_mark(i);
            }
        }
    }
}

/// Remembers, per placement, which clusters the placement-only filters
/// ([`Filter::is_static`]) let through, until a cluster's placement facts change. Bindings
/// selected by one policy share a placement, so most decisions skip those filters.
#[derive(Debug, Default)]
pub struct FilterCache {
    generation: u64,
    entries: std::collections::HashMap<u64, std::sync::Arc<StaticPass>>,
}

/// A cluster every static filter let through.
const PASSED: u8 = u8::MAX;
/// Entries kept before the cache starts afresh.
const CACHE_ENTRIES: usize = 4096;

impl FilterCache {
    pub fn new() -> Self {
        Self::default()
    }
}

/// What the static filters' answers depend on, hashed.
fn static_key(task: &Task<'_>, term: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_string(task.placement)
        .unwrap_or_default()
        .hash(&mut h);
    term.hash(&mut h);
    (task.api_version, task.kind).hash(&mut h);
    format!("{:?}", task.targets).hash(&mut h);
    task.evicted.hash(&mut h);
    // Tolerations limited in time make the answer depend on the clock.
    if task
        .placement
        .cluster_tolerations
        .iter()
        .any(|t| t.toleration_seconds.is_some())
    {
        task.now.hash(&mut h);
    }
    h.finish()
}

/// The placement-only filters' answers for a task that runs nowhere yet.
#[derive(Clone, Debug, PartialEq)]
pub struct StaticPass {
    /// The first static filter each cluster fails, [`PASSED`] if none.
    first: Vec<u8>,
    /// The clusters that pass them all, in fleet order.
    passing: Vec<usize>,
    /// How many clusters each static filter turned away (by filter index), so a decision's
    /// summary counts them without walking the fleet.
    turned_away: Vec<i64>,
}

fn static_pass(
    fleet: &Fleet,
    task: &Task<'_>,
    config: &Config,
    affinity: Option<&ClusterAffinity>,
    n_static: usize,
) -> StaticPass {
    let bare = Task {
        previous: &[],
        ..task.clone()
    };
    let ctx = context(fleet, &bare, config, affinity);
    let first: Vec<u8> = (0..fleet.len())
        .map(|i| {
            config.filters[..n_static]
                .iter()
                .position(|f| !f.check(&ctx, i))
                .map_or(PASSED, |f| f as u8)
        })
        .collect();
    let passing = (0..fleet.len()).filter(|i| first[*i] == PASSED).collect();
    let mut turned_away = vec![0i64; n_static];
    for f in &first {
        if *f != PASSED {
            turned_away[*f as usize] += 1;
        }
    }
    StaticPass {
        first,
        passing,
        turned_away,
    }
}

/// What became of each cluster: stored for the clusters that were looked at closely; the
/// rest were turned away by a placement filter or left out of a large fleet's sample.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcomes {
    n: usize,
    statics: Option<std::sync::Arc<StaticPass>>,
    /// By fleet index, sorted.
    entries: Vec<(usize, Outcome)>,
}

impl Outcomes {
    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The outcome of cluster `i`.
    pub fn get(&self, i: usize) -> Outcome {
        if let Ok(k) = self.entries.binary_search_by_key(&i, |e| e.0) {
            return self.entries[k].1;
        }
        self.unlooked(i)
    }

    /// What cluster `i`'s outcome is when it was not looked at closely.
    fn unlooked(&self, i: usize) -> Outcome {
        match &self.statics {
            Some(s) if s.first[i] != PASSED => Outcome::Filtered(s.first[i] as usize),
            _ => Outcome::NotSampled,
        }
    }

    fn get_mut(&mut self, i: usize) -> Option<&mut Outcome> {
        let k = self.entries.binary_search_by_key(&i, |e| e.0).ok()?;
        Some(&mut self.entries[k].1)
    }

    fn set(&mut self, i: usize, o: Outcome) {
        match self.entries.binary_search_by_key(&i, |e| e.0) {
            Ok(k) => self.entries[k].1 = o,
            Err(k) => self.entries.insert(k, (i, o)),
        }
    }

    /// Every cluster's outcome, in fleet order.
    pub fn to_vec(&self) -> Vec<Outcome> {
        (0..self.n).map(|i| self.get(i)).collect()
    }
}

/// Schedules one task.
pub fn schedule(fleet: &Fleet, task: &Task<'_>, config: &Config) -> Decision {
    schedule_cached(fleet, task, config, &mut FilterCache::new())
}

/// Schedules one task, reusing what `cache` remembers of earlier tasks' placements.
pub fn schedule_cached(
    fleet: &Fleet,
    task: &Task<'_>,
    config: &Config,
    cache: &mut FilterCache,
) -> Decision {
    if let Err(e) = validate(task, config) {
        return Decision {
            error: Some(e),
            ..Default::default()
        };
    }
    let p = task.placement;
    if p.cluster_affinities.is_empty() {
        return schedule_term(fleet, task, config, p.cluster_affinity.as_ref(), "", cache);
    }
    let mut last = Decision::default();
    for term in &p.cluster_affinities {
        let d = if overflow::applies(task, term) {
            overflow::schedule(fleet, task, config, term, cache)
        } else {
            let a = term.affinity();
            schedule_term(fleet, task, config, Some(&a), &term.affinity_name, cache)
        };
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

/// Schedules one task under one cluster affinity (`term`: the name of the placement's term,
/// empty without terms): filter, score, spread, then divide ([`allocate::allocate`]).
fn schedule_term(
    fleet: &Fleet,
    task: &Task<'_>,
    config: &Config,
    affinity: Option<&ClusterAffinity>,
    term: &str,
    cache: &mut FilterCache,
) -> Decision {
    let mut ctx = context(fleet, task, config, affinity);
    let n = fleet.len();
    // Placement-only filters first, from the cache where it knows the placement (clusters
    // the task runs in are asked afresh: readiness and NoSchedule spare them).
    let n_static = config.filters.iter().take_while(|f| f.is_static()).count();
    let statics = cache.lookup(fleet, task, config, affinity, term, n_static);
    let mut outcomes = Outcomes {
        n,
        statics: Some(statics.clone()),
        entries: Vec::new(),
    };
    let mut candidates = sample(&ctx, config, &statics);
    readmit_running(
        &ctx,
        config,
        &statics,
        n_static,
        &mut candidates,
        &mut outcomes,
    );
    // Domain figures (7.2) only for the clusters still in the running.
    ctx.fill_room(candidates.iter().copied());
    let feasible = filter_dynamic(&ctx, config, n_static, candidates, &mut outcomes);
    let (plugin_scores, totals) = score_feasible(&ctx, config, &feasible);
    let mut decision = Decision {
        affinity_name: term.to_string(),
        strategy: strategy_of(task),
        ..Default::default()
    };
    let mut score_of = vec![0.0; n];
    for (k, i) in feasible.iter().enumerate() {
        outcomes.set(
            *i,
            Outcome::Scored {
                total: totals[k],
                replicas: 0,
            },
        );
        score_of[*i] = totals[k];
    }
    let candidates = feasible.clone();
    decision.scored = feasible;
    decision.plugin_scores = plugin_scores;
    let kept = match spread(&ctx, candidates, &score_of, &mut outcomes) {
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
    let result = allocate::allocate(&ctx, config, &kept, &score_of, &mut decision);
    if let Err(e) = result {
        decision.error = Some(e);
    }
    for t in &decision.clusters {
        if let Some(i) = fleet.position(&t.name)
            && let Some(Outcome::Scored { replicas, .. }) = outcomes.get_mut(i)
        {
            *replicas = t.replicas;
        }
    }
    decision.outcomes = outcomes;
    decision
}

impl FilterCache {
    /// The static filters' answers for the task's placement under `term`: remembered, or
    /// worked out and remembered. The cache starts afresh when a cluster's placement facts
    /// change, and when it is full.
    fn lookup(
        &mut self,
        fleet: &Fleet,
        task: &Task<'_>,
        config: &Config,
        affinity: Option<&ClusterAffinity>,
        term: &str,
        n_static: usize,
    ) -> std::sync::Arc<StaticPass> {
        if self.generation != fleet.generation() || self.entries.len() >= CACHE_ENTRIES {
            self.entries.clear();
            self.generation = fleet.generation();
        }
        self.entries
            .entry(static_key(task, term))
            .or_insert_with(|| {
                std::sync::Arc::new(static_pass(fleet, task, config, affinity, n_static))
            })
            .clone()
    }
}

/// The clusters that passed the static filters and are looked at closely. A large fleet:
/// an evenly strided sample, always with the clusters the task runs in.
fn sample(ctx: &Ctx<'_>, config: &Config, statics: &StaticPass) -> Vec<usize> {
    let (fleet, task) = (ctx.fleet, ctx.task);
    let passing = &statics.passing;
    if !(config.score_sample > 0 && passing.len() > config.score_sample) {
        return passing.clone();
    }
    let m = passing.len();
    let offset = (task.seed % m as u64) as usize;
    let mut picked: Vec<usize> = (0..config.score_sample)
        .map(|k| passing[(offset + k * m / config.score_sample) % m])
        .collect();
    picked.extend(task.previous.iter().filter_map(|p| fleet.position(&p.name)));
    // A placement that consolidates looks at the cheapest clusters too, wherever the
    // stride falls: they are where its replicas go.
    if task.placement.consolidates() && fleet.has_prices() && strategy_of(task) == "WaterLevel" {
        let mut priced: Vec<(f64, usize)> = passing
            .iter()
            .filter_map(|i| Some((cost::ranked_price(ctx, *i)?, *i)))
            .collect();
        let k = (config.score_sample / 4).max(1).min(priced.len());
        if k < priced.len() {
            priced.select_nth_unstable_by(k, |a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        }
        picked.extend(priced[..k].iter().map(|x| x.1));
    }
    picked.sort_unstable();
    picked.dedup();
    picked.retain(|i| statics.first[*i] == PASSED);
    picked
}

/// Clusters the task runs in that the cached static answers turned away are asked afresh
/// (readiness and NoSchedule spare them): those that pass join `candidates` (kept sorted).
fn readmit_running(
    ctx: &Ctx<'_>,
    config: &Config,
    statics: &StaticPass,
    n_static: usize,
    candidates: &mut Vec<usize>,
    outcomes: &mut Outcomes,
) {
    let mut added = false;
    for p in ctx.task.previous {
        let Some(i) = ctx.fleet.position(&p.name) else {
            continue;
        };
        if statics.first[i] == PASSED {
            continue;
        }
        match config.filters[..n_static]
            .iter()
            .position(|f| !f.check(ctx, i))
        {
            None => {
                candidates.push(i);
                added = true;
            }
            Some(f) => outcomes.set(i, Outcome::Filtered(f)),
        }
    }
    if added {
        candidates.sort_unstable();
        candidates.dedup();
    }
}

/// The filters after the static ones (those that read the domain figures), over the
/// candidates: returns the feasible clusters, and records the filter that turned each
/// other one away.
fn filter_dynamic(
    ctx: &Ctx<'_>,
    config: &Config,
    n_static: usize,
    candidates: Vec<usize>,
    outcomes: &mut Outcomes,
) -> Vec<usize> {
    let mut feasible: Vec<usize> = Vec::with_capacity(candidates.len());
    for i in candidates {
        match config.filters[n_static..]
            .iter()
            .position(|f| !f.check(ctx, i))
        {
            Some(f) => outcomes.set(i, Outcome::Filtered(n_static + f)),
            None => feasible.push(i),
        }
    }
    feasible
}

/// Scores the feasible clusters: one pass per plugin; a plugin that rates them all the same
/// is not run (it cannot change the ranking). Returns each plugin's ratings and each
/// cluster's weighted total (by position in `feasible`).
fn score_feasible(
    ctx: &Ctx<'_>,
    config: &Config,
    feasible: &[usize],
) -> (Vec<PluginScores>, Vec<f64>) {
    let weights = &config.weights;
    let mut plugin_scores: Vec<PluginScores> = Vec::with_capacity(config.scores.len());
    let mut totals = vec![0.0; feasible.len()];
    let applies: Vec<bool> = config.scores.iter().map(|s| s.applies(ctx)).collect();
    let weight_sum: f64 = config
        .scores
        .iter()
        .zip(&applies)
        .filter(|(_, a)| **a)
        .map(|(s, _)| s.weight(ctx).unwrap_or_else(|| weights.of(s.name())))
        .sum();
    for (s, applies) in config.scores.iter().zip(applies) {
        if !applies {
            plugin_scores.push(PluginScores::NotApplicable);
            continue;
        }
        let w = if weight_sum > 0.0 {
            s.weight(ctx).unwrap_or_else(|| weights.of(s.name())) / weight_sum
        } else {
            0.0
        };
        match s.constant(ctx, feasible) {
            Some(x) => {
                for t in totals.iter_mut() {
                    *t += w * x;
                }
                plugin_scores.push(PluginScores::All(x));
            }
            None => {
                let mut out = vec![0.0; feasible.len()];
                s.score(ctx, feasible, &mut out);
                for (t, v) in totals.iter_mut().zip(&out) {
                    *t += w * v;
                }
                plugin_scores.push(PluginScores::Each(out));
            }
        }
    }
    (plugin_scores, totals)
}

/// The group of a cluster under a spread key.
fn group_of<'c>(c: &'c ClusterSnapshot, field: &str, label: &str) -> &'c str {
    if !label.is_empty() {
        return c.labels.get(label).map(String::as_str).unwrap_or("");
    }
    match field {
        "region" => &c.region,
        "zone" => c.zones.first().map(String::as_str).unwrap_or(""),
        "provider" => &c.provider,
        _ => &c.name,
    }
}

/// Applies spread constraints to the ranked clusters; returns the kept ones (still ranked)
/// or why the minimum cannot be met.
fn spread(
    ctx: &Ctx<'_>,
    candidates: Vec<usize>,
    score_of: &[f64],
    outcomes: &mut Outcomes,
) -> Result<Vec<usize>, String> {
    let mut kept = candidates;
    let clusters = ctx.fleet.clusters();
    // In steady mode the clusters (and so the groups) it runs in now stay chosen while they
    // are feasible: a change elsewhere in the fleet (a label, a score) swaps nothing.
    let mut held = vec![false; clusters.len()];
    if ctx.task.mode == Mode::Steady {
        for p in ctx.task.previous {
            if let Some(i) = ctx.fleet.position(&p.name) {
                held[i] = true;
            }
        }
    }
    // Better: held now, then higher score, then earlier name.
    let better = |a: usize, b: usize| {
        held[b]
            .cmp(&held[a])
            .then(score_of[b].total_cmp(&score_of[a]))
            .then(a.cmp(&b))
    };
    for (ci, s) in ctx.task.placement.spread_constraints.iter().enumerate() {
        let key = if s.spread_by_label.is_empty() {
            s.spread_by_field.as_str()
        } else {
            s.spread_by_label.as_str()
        };
        let max = if s.max_groups > 0 {
            s.max_groups as usize
        } else {
            usize::MAX
        };
        if s.spread_by_label.is_empty() && s.spread_by_field == "cluster" {
            // Every cluster is its own group: keep the best `max`, without sorting them all.
            if (kept.len() as i64) < s.min_groups {
                return Err(format!(
                    "spread by {key} needs at least {} groups, only {} are feasible",
                    s.min_groups,
                    kept.len()
                ));
            }
            if kept.len() > max {
                let mut by_rank = kept.clone();
                by_rank.select_nth_unstable_by(max - 1, |a, b| better(*a, *b));
                for i in &by_rank[max..] {
                    outcomes.set(*i, Outcome::Spread(ci, SpreadWhy::TooMany));
                }
                by_rank.truncate(max);
                by_rank.sort_unstable();
                kept = by_rank;
            }
            continue;
        }
        // Groups ranked by their best cluster.
        let mut best: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
        let mut member: Vec<(usize, &str)> = Vec::with_capacity(kept.len());
        for i in &kept {
            let g = group_of(&clusters[*i], &s.spread_by_field, &s.spread_by_label);
            if g.is_empty() {
                outcomes.set(*i, Outcome::Spread(ci, SpreadWhy::NoValue));
                continue;
            }
            let e = best.entry(g).or_insert(*i);
            if better(*i, *e).is_lt() {
                *e = *i;
            }
            member.push((*i, g));
        }
        if (best.len() as i64) < s.min_groups {
            return Err(format!(
                "spread by {key} needs at least {} groups, only {} are feasible",
                s.min_groups,
                best.len()
            ));
        }
        let mut groups: Vec<(&str, usize)> = best.into_iter().collect();
        groups.sort_unstable_by(|a, b| better(a.1, b.1));
        let allowed: std::collections::HashSet<&str> =
            groups.iter().take(max).map(|(g, _)| *g).collect();
        let mut next = Vec::with_capacity(member.len());
        for (i, g) in member {
            if allowed.contains(g) {
                next.push(i);
            } else {
                outcomes.set(i, Outcome::Spread(ci, SpreadWhy::TooMany));
            }
        }
        kept = next;
    }
    Ok(kept)
}

#[cfg(test)]
mod tests;
