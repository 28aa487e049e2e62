//! Step 6 of the pipeline: dividing a task's replicas over the clusters the filters and the
//! spread constraints kept, into the [`Decision`]. In named steps: a copy each for
//! Duplicated ([`duplicate`]); otherwise the starting shares ([`Alloc::start`]), price
//! ([`Alloc::weigh_prices`]), shedding ([`Alloc::shed`]), the division the strategy names,
//! then the budget and the on-demand floor ([`Alloc::keep_to_cost`]) and what fell short
//! ([`Alloc::shortfall`]).

use orrery_api::binding::TargetCluster;
use orrery_api::cost::Capacity;
use orrery_api::overrides::CompiledAffinity;
use orrery_api::policy::Placement;

use crate::divide::{self, divide};
use crate::{ClusterSnapshot, Config, Ctx, Decision, Mode, cost, group_of};

/// Divides the replicas over the kept clusters (best-ranked first) into `decision`.
pub(crate) fn allocate(
    ctx: &Ctx<'_>,
    config: &Config,
    kept: &[usize],
    score_of: &[f64],
    decision: &mut Decision,
) -> Result<(), String> {
    let task = ctx.task;
    let policy = task.placement.cost.as_ref();
    let budget = policy.and_then(|c| c.max_hourly);
    let floor = policy.and_then(|c| c.min_on_demand).filter(|f| *f > 0.0);
    if decision.strategy == "Duplicated" {
        return duplicate(ctx, kept, score_of, budget, floor, decision);
    }
    let kept = rank_for_aggregation(ctx, config, kept, score_of, decision.strategy);
    let a = Alloc {
        ctx,
        config,
        kept: &kept,
        budget,
        floor,
        // A limit the placement names holds Karmada's divisions too; without one they divide
        // as Karmada does (docs/scheduling.md).
        capped: task.placement.water_level_limit.is_some(),
    };
    let mut shares = a.start(score_of);
    let prices = a.weigh_prices(&mut shares);
    a.shed(&mut shares);
    // Each cluster's room under the limit (less, for one being shed): what the budget and
    // the floor may move replicas into.
    let room_under_limit = shares.room.clone();
    // What stays where it runs, before the division adds or takes any (for a placement that
    // consolidates: its new replicas are placed apart from it).
    let consolidates = task.placement.consolidates();
    let staying = if consolidates {
        shares.n.clone()
    } else {
        Vec::new()
    };
    let have: i64 = shares.n.iter().sum();
    let delta = task.replicas - have;
    // Clusters a static weight of 0 keeps out: the budget and the floor move nothing there.
    let mut weighed_out = vec![false; kept.len()];
    let mut unplaced = match decision.strategy {
        "StaticWeight" => {
            let (unplaced, out) = a.by_static_weight(&mut shares)?;
            weighed_out = out;
            unplaced
        }
        "AvailableReplicas" | "Aggregated" => {
            a.by_available_replicas(decision.strategy, delta, &mut shares)?
        }
        _ => {
            a.choose_water_division(&mut shares, decision);
            let unplaced =
                a.by_water_level(decision.strategy, delta, &room_under_limit, &mut shares);
            if let Some(price) = &prices
                && consolidates
                && (task.mode == Mode::Consolidate || delta > 0)
            {
                a.consolidate(price, &room_under_limit, &staying, &mut shares, decision);
            }
            unplaced
        }
    };
    let (over_budget, under_floor) = a.keep_to_cost(&mut shares.n, &room_under_limit, &weighed_out);
    unplaced += over_budget + under_floor;
    decision.unplaced = unplaced;
    decision.clusters = a.targets(&shares.n);
    a.shortfall(over_budget, under_floor, unplaced, decision)
}

/// Duplicated: a copy in each kept cluster. A budget keeps the best-ranked copies that fit
/// in it, and the on-demand floor then drops the lowest-ranked spot copies.
fn duplicate(
    ctx: &Ctx<'_>,
    kept: &[usize],
    score_of: &[f64],
    budget: Option<f64>,
    floor: Option<f64>,
    decision: &mut Decision,
) -> Result<(), String> {
    let (copies, over) = copies_in_budget(ctx, kept, score_of, budget);
    decision.clusters = copies;
    let off_spot = floor.map_or(0, |f| {
        keep_copies_on_demand(ctx, kept, f, &mut decision.clusters)
    });
    decision.clusters.sort_by(|a, b| a.name.cmp(&b.name));
    let mut why = Vec::new();
    if over > 0 {
        why.push(format!(
            "{over} of {} feasible clusters left out: a copy there would take the workload past its budget of {} an hour",
            kept.len(),
            budget.unwrap_or_default()
        ));
    }
    if off_spot > 0 {
        why.push(format!(
            "{off_spot} copies on spot capacity left out: cost.minOnDemand keeps {} of the copies on on-demand capacity",
            floor.unwrap_or_default()
        ));
    }
    if !why.is_empty() {
        return Err(why.join("; "));
    }
    Ok(())
}

/// The copies of a Duplicated task, in rank order, that fit in the budget (all of them
/// without one), and how many clusters the budget left out.
fn copies_in_budget(
    ctx: &Ctx<'_>,
    kept: &[usize],
    score_of: &[f64],
    budget: Option<f64>,
) -> (Vec<TargetCluster>, usize) {
    let task = ctx.task;
    let clusters = ctx.fleet.clusters();
    let mut spent = 0.0;
    let mut over = 0;
    let mut order = kept.to_vec();
    order.sort_by(|a, b| score_of[*b].total_cmp(&score_of[*a]).then(a.cmp(b)));
    let copies = order
        .iter()
        .filter(|i| match budget {
            Some(b) => {
                let c = task.replicas as f64 * ctx.unit_cost(**i).unwrap_or(f64::INFINITY);
                let fits = spent + c <= b + 1e-9;
                if fits {
                    spent += c;
                } else {
                    over += 1;
                }
                fits
            }
            None => true,
        })
        .map(|i| TargetCluster {
            name: clusters[*i].name.clone(),
            replicas: task.replicas,
        })
        .collect();
    (copies, over)
}

/// The on-demand floor over copies: the lowest-ranked spot copies go until enough of those
/// left are on on-demand capacity (a cluster without a price is not known to be). `copies`
/// are in rank order; returns how many went.
fn keep_copies_on_demand(
    ctx: &Ctx<'_>,
    kept: &[usize],
    floor: f64,
    copies: &mut Vec<TargetCluster>,
) -> usize {
    let clusters = ctx.fleet.clusters();
    let on_demand = |c: &TargetCluster| {
        kept.iter()
            .find(|i| clusters[**i].name == c.name)
            .is_some_and(|i| {
                ctx.unit_cost(*i).is_some()
                    && ctx.fleet.facts()[*i].prices.capacity != Capacity::Spot
            })
    };
    let mut off_spot = 0;
    loop {
        let total = copies.len();
        let od = copies.iter().filter(|c| on_demand(c)).count();
        if od == total || od as f64 >= (floor * total as f64 - 1e-9).ceil() {
            break;
        }
        // The clusters are in rank order: the last spot one is the lowest ranked.
        let Some(j) = copies.iter().rposition(|c| !on_demand(c)) else {
            break;
        };
        copies.remove(j);
        off_spot += 1;
    }
    off_spot
}

/// The kept clusters in the order the division takes them: aggregation fills in rank order;
/// the other divisions break ties by score themselves, so they keep fleet order.
fn rank_for_aggregation(
    ctx: &Ctx<'_>,
    config: &Config,
    kept: &[usize],
    score_of: &[f64],
    strategy: &str,
) -> Vec<usize> {
    let mut kept = kept.to_vec();
    if strategy == "WaterLevel" && ctx.any_known && fleet_level(ctx, &kept) <= config.low_mark {
        kept.sort_unstable_by(|a, b| score_of[*b].total_cmp(&score_of[*a]).then(a.cmp(b)));
    }
    kept
}

/// What the steps of one division (all but Duplicated) read.
struct Alloc<'a, 'c> {
    ctx: &'a Ctx<'c>,
    config: &'a Config,
    /// The kept clusters (fleet indexes), in the order the division takes them.
    kept: &'a [usize],
    /// `cost.maxHourly`.
    budget: Option<f64>,
    /// `cost.minOnDemand`, when above 0.
    floor: Option<f64>,
    /// The placement names its own water level limit.
    capped: bool,
}

impl<'a, 'c> Alloc<'a, 'c> {
    /// The shares the division starts from: what runs in each cluster (nothing, for a fresh
    /// division or a task that runs nowhere), its room under the limit and its score.
    fn start(&self, score_of: &[f64]) -> divide::Shares<'a, 'c> {
        let (ctx, kept) = (self.ctx, self.kept);
        let fresh = ctx.task.mode == Mode::Fresh || kept.iter().all(|i| ctx.previous[*i] == 0);
        divide::Shares {
            ctx,
            idx: kept.to_vec(),
            n: kept
                .iter()
                .map(|i| if fresh { 0 } else { ctx.previous[*i] })
                .collect(),
            room: kept.iter().map(|i| ctx.room[*i]).collect(),
            score: kept.iter().map(|i| score_of[*i]).collect(),
            lean: vec![0.0; kept.len()],
            thrift: vec![1.0; kept.len()],
        }
    }

    /// Where price counts (a cost weight and a fleet with prices): each cluster's lean and
    /// thrift for its price against the cheapest, and the ranked prices (for consolidation).
    fn weigh_prices(&self, shares: &mut divide::Shares<'_, '_>) -> Option<Vec<Option<f64>>> {
        let ctx = self.ctx;
        let weight = ctx.cost_weight();
        if !(weight > 0.0 && ctx.fleet.has_prices()) {
            return None;
        }
        let ranked: Vec<Option<f64>> = self
            .kept
            .iter()
            .map(|i| cost::ranked_price(ctx, *i))
            .collect();
        let cheapest = ranked
            .iter()
            .flatten()
            .copied()
            .fold(f64::INFINITY, f64::min);
        shares.lean = ranked
            .iter()
            .map(|p| cost::lean(weight, *p, cheapest))
            .collect();
        shares.thrift = ranked
            .iter()
            .map(|p| cost::thrift(weight, *p, cheapest))
            .collect();
        Some(ranked)
    }

    /// Shedding: a cluster over its limit keeps only what fits under limit - hysteresis; one
    /// shed ahead of its forecast peak, what keeps its forecast's mean under the shed mark -
    /// hysteresis as far as the forecast reaches (the rule new replicas are placed by, with a
    /// margin).
    fn shed(&self, shares: &mut divide::Shares<'_, '_>) {
        let (ctx, config, task) = (self.ctx, self.config, self.ctx.task);
        let clusters = ctx.fleet.clusters();
        for (j, i) in self.kept.iter().enumerate() {
            let name = &clusters[*i].name;
            let room = if task.shed.contains(name) {
                ctx.room_under(*i, ctx.limit - config.hysteresis)
            } else if task.shed_ahead.contains(name) {
                let to = ctx.mark - config.hysteresis;
                ctx.room_before(*i, to).or_else(|| ctx.room_under(*i, to))
            } else {
                continue;
            };
            if let Some(r) = room {
                shares.n[j] = shares.n[j].min(r);
                // What it keeps may be above its room under the limit; it takes nothing more.
                shares.room[j] = Some(shares.room[j].map_or(r, |limit| limit.min(r)));
            }
        }
    }

    /// StaticWeight: the replicas in proportion to each cluster's static weight (held at each
    /// cluster's room when capped). Returns what stays unplaced and the clusters a weight of
    /// 0 keeps out.
    fn by_static_weight(
        &self,
        shares: &mut divide::Shares<'_, '_>,
    ) -> Result<(i64, Vec<bool>), String> {
        let (task, kept) = (self.ctx.task, self.kept);
        let clusters = self.ctx.fleet.clusters();
        let of: Vec<&ClusterSnapshot> = kept.iter().map(|i| &clusters[*i]).collect();
        let w = static_weights(&of, task.placement);
        if w.iter().all(|x| *x <= 0) {
            return Err("every feasible cluster has a static weight of 0".into());
        }
        let weighed_out = w.iter().map(|x| *x <= 0).collect();
        let mut unplaced = 0;
        if self.capped {
            shares.n = vec![0; kept.len()];
            unplaced = task.replicas - shares.by_weights_capped(task.replicas, &w);
        } else {
            shares.n = divide(task.replicas, &w);
        }
        Ok((unplaced, weighed_out))
    }

    /// AvailableReplicas and Aggregated: `delta` more (or fewer) replicas by how many more
    /// fit in each cluster. Returns what stays unplaced.
    fn by_available_replicas(
        &self,
        strategy: &str,
        delta: i64,
        shares: &mut divide::Shares<'_, '_>,
    ) -> Result<i64, String> {
        let ctx = self.ctx;
        let avail: Vec<i64> = self
            .kept
            .iter()
            .map(|i| {
                ctx.fleet.facts()[*i]
                    .available_replicas(&ctx.demand)
                    .unwrap_or(1_000_000)
            })
            .collect();
        if delta < 0 {
            shares.shrink(-delta);
            return Ok(0);
        }
        if strategy == "Aggregated" {
            return Ok(self.aggregated(delta, &avail, shares));
        }
        if avail.iter().all(|x| *x == 0) {
            return Err("no cluster has room for a single replica".into());
        }
        Ok(if self.capped {
            delta - shares.by_weights_capped(delta, &avail)
        } else {
            shares.by_weights(delta, &avail);
            0
        })
    }

    /// Aggregated, fewest clusters: the roomiest first; what fits nowhere goes to the
    /// roomiest (with an explicit limit, no cluster past its room: what fits nowhere stays
    /// unplaced instead). Returns what stays unplaced.
    fn aggregated(&self, delta: i64, avail: &[i64], shares: &mut divide::Shares<'_, '_>) -> i64 {
        let capped = self.capped;
        let mut order: Vec<usize> = (0..self.kept.len()).collect();
        order.sort_by(|a, b| avail[*b].cmp(&avail[*a]).then(a.cmp(b)));
        let room_left = |shares: &divide::Shares, j: usize| match shares.room[j] {
            Some(r) if capped => (r - shares.n[j]).max(0),
            _ => i64::MAX,
        };
        let mut left = delta;
        for j in &order {
            let n = left.min(avail[*j].max(0)).min(room_left(shares, *j));
            shares.n[*j] += n;
            left -= n;
        }
        if left > 0 && capped {
            for j in &order {
                let n = left.min(room_left(shares, *j));
                shares.n[*j] += n;
                left -= n;
            }
            return left;
        } else if left > 0 {
            shares.n[order[0]] += left;
        }
        0
    }

    /// The water level division this fleet gets, by its water level (into `decision`):
    /// water-filling at or above the high mark, aggregation at or below the low mark,
    /// score-weighted between; equal shares, ranked, when nothing reports capacity.
    fn choose_water_division(&self, shares: &mut divide::Shares<'_, '_>, decision: &mut Decision) {
        let (ctx, config) = (self.ctx, self.config);
        decision.fleet_level = fleet_level(ctx, self.kept);
        if !ctx.any_known {
            // Nothing reports capacity: equal shares, ranked.
            decision.strategy = "ScoreWeighted";
            shares.score = vec![1.0; self.kept.len()];
        } else if decision.fleet_level >= config.high_mark {
            decision.strategy = "WaterFilling";
        } else if decision.fleet_level <= config.low_mark {
            decision.strategy = "Aggregation";
        } else {
            decision.strategy = "ScoreWeighted";
        }
    }

    /// The water level division `strategy` names, of `delta` more (or fewer) replicas: first
    /// where no forecast has the cluster cross the shed mark; then, for what fits nowhere
    /// else, wherever the limit still holds it. Returns what stays unplaced.
    fn by_water_level(
        &self,
        strategy: &str,
        delta: i64,
        room_under_limit: &[Option<i64>],
        shares: &mut divide::Shares<'_, '_>,
    ) -> i64 {
        let (ctx, kept) = (self.ctx, self.kept);
        if delta < 0 {
            shares.drain(-delta);
            return 0;
        }
        if delta == 0 {
            return 0;
        }
        let marks: Vec<Option<i64>> = kept.iter().map(|i| ctx.mark_room[*i]).collect();
        let soft = marks.iter().any(Option::is_some);
        if soft {
            for (room, m) in shares.room.iter_mut().zip(&marks) {
                if let (Some(r), Some(m)) = (room.as_mut(), m) {
                    *r = (*r).min(*m);
                }
            }
        }
        let mut placed = 0;
        for pass in 0..if soft { 2 } else { 1 } {
            if pass == 1 {
                if placed == delta {
                    break;
                }
                shares.room = room_under_limit.to_vec();
            }
            placed += match strategy {
                "WaterFilling" => shares.water_fill(delta - placed),
                "Aggregation" => {
                    let (groups, min) = spread_groups(ctx, kept);
                    shares.aggregate(delta - placed, &groups, min)
                }
                _ => shares.by_score(delta - placed),
            };
        }
        delta - placed
    }

    /// A placement that consolidates: in a consolidation round, replicas move to cheaper
    /// clusters (into `decision.consolidated`); otherwise its new replicas start where such a
    /// round would move them, and what runs stays.
    fn consolidate(
        &self,
        price: &[Option<f64>],
        room_under_limit: &[Option<i64>],
        staying: &[i64],
        shares: &mut divide::Shares<'_, '_>,
        decision: &mut Decision,
    ) {
        let (ctx, config, task, kept) = (self.ctx, self.config, self.ctx.task, self.kept);
        // Into the room under the limit less the hysteresis, over the horizon: the cluster
        // sheds this task's replicas at the limit (its mark), and must not take back at once
        // what it has just shed.
        let room: Vec<Option<i64>> = kept
            .iter()
            .zip(room_under_limit)
            .map(|(i, r)| {
                let r = (*r)?;
                Some(r.min(ctx.room_under(*i, ctx.limit - config.hysteresis)?))
            })
            .collect();
        let keep_one = !task.placement.spread_constraints.is_empty();
        let saving = config.consolidate_saving;
        let capacity: Vec<Capacity> = (kept.iter())
            .map(|i| ctx.fleet.facts()[*i].prices.capacity)
            .collect();
        let floor = self.floor.map(|f| (capacity.as_slice(), f));
        if task.mode == Mode::Consolidate {
            decision.consolidated =
                cost::consolidate(&mut shares.n, &room, price, saving, keep_one, floor);
        } else {
            // New replicas of a placement that consolidates start where a round would move
            // them, not where a round would restart them; what runs stays.
            let mut added: Vec<i64> = (shares.n.iter().zip(staying))
                .map(|(n, s)| (n - s).max(0))
                .collect();
            let left: Vec<Option<i64>> = (room.iter().zip(&shares.n).zip(&added))
                .map(|((r, n), a)| r.map(|r| r - (n - a)))
                .collect();
            cost::consolidate(&mut added, &left, price, saving, keep_one, floor);
            for ((n, s), a) in shares.n.iter_mut().zip(staying).zip(&added) {
                *n = (*n).min(*s) + a;
            }
        }
    }

    /// The budget, then the on-demand floor (which keeps to the budget), over what the
    /// division gave (`n`); the Priced filter left only clusters with prices when there is a
    /// budget. Returns the replicas each took out: (over the budget, under the floor).
    fn keep_to_cost(
        &self,
        n: &mut [i64],
        room_under_limit: &[Option<i64>],
        weighed_out: &[bool],
    ) -> (i64, i64) {
        let (ctx, kept, budget) = (self.ctx, self.kept, self.budget);
        let mut over_budget = 0;
        let mut under_floor = 0;
        if budget.is_none() && self.floor.is_none() {
            return (over_budget, under_floor);
        }
        // A cluster without a price (only without a budget: `Priced` turns it away otherwise)
        // is no on-demand capacity the floor can count on.
        let unit: Vec<f64> = kept
            .iter()
            .map(|i| ctx.unit_cost(*i).unwrap_or(f64::INFINITY))
            .collect();
        let limits: &Vec<Option<i64>> = &room_under_limit
            .iter()
            .zip(weighed_out)
            .map(|(r, out)| if *out { Some(0) } else { *r })
            .collect();
        if let Some(b) = budget {
            over_budget = cost::keep_budget(n, limits, &unit, b);
        }
        if let Some(f) = self.floor {
            let capacity: Vec<Capacity> = kept
                .iter()
                .map(|i| ctx.fleet.facts()[*i].prices.capacity)
                .collect();
            under_floor = cost::keep_floor(n, limits, &unit, &capacity, f, budget);
        }
        (over_budget, under_floor)
    }

    /// The clusters that got replicas, in name order.
    fn targets(&self, n: &[i64]) -> Vec<TargetCluster> {
        let clusters = self.ctx.fleet.clusters();
        let mut out: Vec<TargetCluster> = self
            .kept
            .iter()
            .zip(n)
            .filter(|(_, n)| **n > 0)
            .map(|(i, n)| TargetCluster {
                name: clusters[*i].name.clone(),
                replicas: *n,
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// Why not every replica was placed, if one was not: the budget first, then the floor,
    /// then the limit.
    fn shortfall(
        &self,
        over_budget: i64,
        under_floor: i64,
        unplaced: i64,
        decision: &Decision,
    ) -> Result<(), String> {
        let task = self.ctx.task;
        if over_budget > 0 {
            return Err(format!(
                "{over_budget} of {} replicas are beyond the budget of {} an hour (cost.maxHourly)",
                task.replicas,
                self.budget.unwrap_or_default()
            ));
        }
        if under_floor > 0 {
            return Err(format!(
                "{under_floor} of {} replicas left out: on-demand capacity has no room for the share cost.minOnDemand ({}) asks for beside them",
                task.replicas,
                self.floor.unwrap_or_default()
            ));
        }
        if unplaced > 0 {
            return Err(format!(
                "{unplaced} of {} replicas fit in no cluster under the water level limit {:.2}",
                task.replicas, self.ctx.limit
            ));
        }
        if decision.clusters.is_empty() && task.replicas > 0 {
            return Err("no cluster received a replica".into());
        }
        Ok(())
    }
}

/// Each cluster's static weight: the first entry of the list that matches it, else 0.
fn static_weights(clusters: &[&ClusterSnapshot], placement: &Placement) -> Vec<i64> {
    let list: Vec<(CompiledAffinity<'_>, i64)> = placement
        .replica_scheduling
        .iter()
        .filter_map(|r| r.weight_preference.as_ref())
        .flat_map(|w| &w.static_weight_list)
        .map(|s| (s.target_cluster.compile(), s.weight))
        .collect();
    clusters
        .iter()
        .map(|c| {
            let v = c.view();
            list.iter()
                .find(|(a, _)| a.matches(&v))
                .map(|(_, w)| *w)
                .unwrap_or(0)
        })
        .collect()
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
                .map(|i| {
                    group_of(&clusters[*i], &s.spread_by_field, &s.spread_by_label).to_string()
                })
                .collect(),
            s.min_groups as usize,
        ),
        None => (vec![String::new(); kept.len()], 0),
    }
}
