//! Cost-aware placement (the draft's cost-performance-optimised scheduling, 4.2.6): the
//! `Cost` score, the `Priced` filter for budgeted placements, how far water-filling leans
//! towards cheaper clusters, and a placement's budget and on-demand floor.
//!
//! A replica's price in a cluster is what it requests times the cluster's prices
//! ([`orrery_api::cost::Prices`]). Ranking reads the price of a *served* hour (spot capacity
//! serves only the share of the hour it is not interrupted) plus, for a task that reads data
//! sets, the egress of copying them in; budgets read the hourly price, what is billed.

use orrery_api::cost::Capacity;

use crate::filter::Filter;
use crate::score::Score;
use crate::{Ctx, Vector};

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// The hourly price of `demand` (one replica) at `prices`, or the first resource requested
/// that has no price there.
pub fn unit_hourly(
    prices: &orrery_api::cost::Prices,
    demand: &Vector,
) -> Result<f64, &'static str> {
    prices.hourly(demand[0], demand[1] / GIB, demand[2])
}

/// What the ranking reads of cluster `i`: a served hour of one replica there, and the egress
/// of the data it copies in. `None` where the cluster has no price for what the task requests.
pub fn ranked_price(ctx: &Ctx<'_>, i: usize) -> Option<f64> {
    let prices = &ctx.fleet.facts()[i].prices;
    let unit = ctx.unit_cost(i)?;
    let egress = ctx
        .data_needs()
        .map_or(0.0, |n| crate::data::estimate(ctx, i, n).egress_cost);
    Some(prices.per_served_hour(unit) + egress)
}

/// The `Cost` score: the cheapest cluster (by [`ranked_price`]) gets 100, one that costs
/// twice as much 50; a cluster without prices 50. Its weight is the placement's
/// `cost.weight`; with none (or 0) it takes no part.
#[derive(Debug)]
pub struct CostScore;

impl Score for CostScore {
    fn name(&self) -> &'static str {
        "Cost"
    }
    fn applies(&self, ctx: &Ctx<'_>) -> bool {
        ctx.cost_weight() > 0.0 && ctx.fleet.has_prices() && ctx.needs_room()
    }
    fn weight(&self, ctx: &Ctx<'_>) -> Option<f64> {
        Some(ctx.cost_weight())
    }
    fn score(&self, ctx: &Ctx<'_>, feasible: &[usize], out: &mut [f64]) {
        let prices: Vec<Option<f64>> = feasible.iter().map(|i| ranked_price(ctx, *i)).collect();
        let cheapest = prices
            .iter()
            .flatten()
            .copied()
            .fold(f64::INFINITY, f64::min);
        for (o, p) in out.iter_mut().zip(&prices) {
            *o = match p {
                None => 50.0,
                Some(p) if *p <= 0.0 => 100.0,
                Some(p) => 100.0 * cheapest / p,
            };
        }
    }
}

/// How much higher water-filling takes a cluster's water level to be than it is, for its
/// price: with cost weight `w`, a cluster that costs `x` times the cheapest of the candidates
/// is filled as if its level were `w/10 · ln x` higher (at most 1), so cheaper clusters fill
/// further before dearer ones take replicas (never past the limit: room is unchanged). Twice
/// the price at weight 5: 0.35.
pub fn lean(weight: f64, price: Option<f64>, cheapest: f64) -> f64 {
    match price {
        Some(p) if weight > 0.0 && cheapest.is_finite() && p > 0.0 => {
            let x = if cheapest > 0.0 {
                p / cheapest
            } else {
                std::f64::consts::E.powi(10)
            };
            (weight / orrery_api::cost::MAX_WEIGHT * x.ln()).clamp(0.0, 1.0)
        }
        _ => 0.0,
    }
}

/// What score-weighted division multiplies a cluster's score by for its price: with cost
/// weight `w`, `(cheapest / price)^(w/5)`: at weight 5 a cluster that costs twice as much
/// takes half the share its score alone gives it, at weight 10 a quarter. 1 for the cheapest
/// and for a cluster without prices.
pub fn thrift(weight: f64, price: Option<f64>, cheapest: f64) -> f64 {
    match price {
        Some(p) if weight > 0.0 && cheapest.is_finite() && p > 0.0 => {
            (cheapest.max(0.0) / p).powf(weight / 5.0).clamp(0.0, 1.0)
        }
        _ => 1.0,
    }
}

/// A placement with a budget (`cost.maxHourly`) places replicas only where it knows their
/// price.
#[derive(Debug)]
pub struct Priced;

impl Filter for Priced {
    fn name(&self) -> &'static str {
        "Priced"
    }
    fn check(&self, ctx: &Ctx<'_>, i: usize) -> bool {
        !ctx.has_budget() || ctx.unit_cost(i).is_some()
    }
    fn why(&self, ctx: &Ctx<'_>, i: usize) -> String {
        let what = unit_hourly(&ctx.fleet.facts()[i].prices, &ctx.demand)
            .err()
            .unwrap_or("");
        format!(
            "it has no price for {what}: the placement's budget (cost.maxHourly) cannot be kept there"
        )
    }
}

/// Keeps a division within `budget` an hour. While it costs more, a replica comes off the
/// dearest cluster holding one and goes to the cheapest cluster with room that costs less;
/// where there is none it is left unplaced. `n`, `room` and `unit` (the hourly price of a
/// replica) are per candidate. Returns how many were left unplaced.
pub fn keep_budget(n: &mut [i64], room: &[Option<i64>], unit: &[f64], budget: f64) -> i64 {
    let mut total: f64 = n.iter().zip(unit).map(|(k, u)| *k as f64 * u).sum();
    let mut dropped = 0;
    while total > budget + 1e-9 {
        let Some(j) = dearest(n, unit, |_| true) else {
            break;
        };
        n[j] -= 1;
        total -= unit[j];
        match cheapest_open(n, room, unit, |k| unit[k] < unit[j]) {
            Some(k) => {
                n[k] += 1;
                total += unit[k];
            }
            None => dropped += 1,
        }
    }
    dropped
}

/// Keeps at least `floor` of the replicas (rounded up) on on-demand capacity when any run on
/// spot: a replica comes off the dearest spot cluster and goes to the cheapest on-demand
/// cluster with room, if `budget` still holds, else it is left unplaced. Returns how many were
/// left unplaced.
pub fn keep_floor(
    n: &mut [i64],
    room: &[Option<i64>],
    unit: &[f64],
    capacity: &[Capacity],
    floor: f64,
    budget: Option<f64>,
) -> i64 {
    let spot = |j: usize| capacity[j] == Capacity::Spot;
    let mut dropped = 0;
    loop {
        let placed: i64 = n.iter().sum();
        let on_demand: i64 = (0..n.len()).filter(|j| !spot(*j)).map(|j| n[j]).sum();
        let need = (floor * placed as f64 - 1e-9).ceil() as i64;
        if on_demand >= need || on_demand == placed {
            return dropped;
        }
        let Some(j) = dearest(n, unit, spot) else {
            return dropped;
        };
        n[j] -= 1;
        let total: f64 = n.iter().zip(unit).map(|(k, u)| *k as f64 * u).sum();
        // An on-demand cluster without a price is not known to be on-demand capacity at a
        // price: it takes none (its unit is infinite).
        match cheapest_open(n, room, unit, |k| {
            !spot(k) && unit[k].is_finite() && budget.is_none_or(|b| total + unit[k] <= b + 1e-9)
        }) {
            Some(k) => n[k] += 1,
            None => dropped += 1,
        }
    }
}

/// Consolidation: replicas come off the dearest clusters holding them and go to the cheapest
/// with room, but only where a replica costs at least `saving` (a fraction of its price where
/// it runs) less: a move restarts a replica, and a small saving is not worth it. `price` is what
/// the ranking reads (`None`: no price, neither given nor taken); `room` is how many of the
/// task's replicas a cluster may hold in all (`None`: not known, given none). `keep_one` leaves
/// a replica on every cluster that has one (what spread constraints counted). `floor`, the
/// capacity of each and the placement's `minOnDemand`: no move to spot capacity takes the
/// replicas on on-demand capacity below that share (what [`keep_floor`] would move back).
/// Returns how many replicas moved.
pub fn consolidate(
    n: &mut [i64],
    room: &[Option<i64>],
    price: &[Option<f64>],
    saving: f64,
    keep_one: bool,
    floor: Option<(&[Capacity], f64)>,
) -> i64 {
    let spot = |j: usize| floor.is_some_and(|(c, _)| c[j] == Capacity::Spot);
    let total: i64 = n.iter().sum();
    let need = floor.map_or(0, |(_, f)| (f * total as f64 - 1e-9).ceil() as i64);
    let mut on_demand: i64 = (0..n.len()).filter(|j| !spot(*j)).map(|j| n[j]).sum();
    let mut from: Vec<usize> = (0..n.len())
        .filter(|j| n[*j] > 0 && price[*j].is_some())
        .collect();
    let at = |j: usize| price[j].unwrap_or(f64::INFINITY);
    from.sort_by(|a, b| at(*b).total_cmp(&at(*a)).then(b.cmp(a)));
    let mut to: Vec<usize> = (0..n.len())
        .filter(|j| price[*j].is_some() && room[*j].is_some())
        .collect();
    to.sort_by(|a, b| at(*a).total_cmp(&at(*b)).then(a.cmp(b)));
    let mut moved = 0;
    for s in from {
        let (Some(dear), keep) = (price[s], i64::from(keep_one && n[s] > 0)) else {
            continue;
        };
        for d in &to {
            let (Some(cheap), Some(r)) = (price[*d], room[*d]) else {
                continue;
            };
            if cheap > dear * (1.0 - saving) + 1e-12 || cheap >= dear {
                // The rest cost more still.
                break;
            }
            let mut k = (r - n[*d]).min(n[s] - keep).max(0);
            if !spot(s) && spot(*d) {
                k = k.min(on_demand - need).max(0);
                on_demand -= k;
            } else if spot(s) && !spot(*d) {
                on_demand += k;
            }
            n[s] -= k;
            n[*d] += k;
            moved += k;
        }
    }
    moved
}

/// The candidate holding a replica with the highest price among those `eligible` (the later
/// one on ties).
fn dearest(n: &[i64], unit: &[f64], eligible: impl Fn(usize) -> bool) -> Option<usize> {
    (0..n.len())
        .filter(|j| n[*j] > 0 && eligible(*j))
        .max_by(|a, b| unit[*a].total_cmp(&unit[*b]).then(a.cmp(b)))
}

/// The candidate with room and the lowest price among those `eligible` (the earlier one on
/// ties).
fn cheapest_open(
    n: &[i64],
    room: &[Option<i64>],
    unit: &[f64],
    eligible: impl Fn(usize) -> bool,
) -> Option<usize> {
    (0..n.len())
        .filter(|k| room[*k].is_none_or(|r| n[*k] < r) && eligible(*k))
        .min_by(|a, b| unit[*a].total_cmp(&unit[*b]).then(a.cmp(b)))
}

/// What `clusters`' replicas of the task cost per hour, in all and per cluster; `None` when
/// none of them has prices.
pub fn cost_of(
    fleet: &crate::Fleet,
    task: &crate::Task<'_>,
    clusters: &[orrery_api::binding::TargetCluster],
) -> Option<orrery_api::binding::BindingCost> {
    if !fleet.has_prices() || task.replicas <= 0 {
        return None;
    }
    let demand = crate::demand_of(task.request);
    let mut out = orrery_api::binding::BindingCost::default();
    for t in clusters {
        let Some(i) = fleet.position(&t.name) else {
            continue;
        };
        match unit_hourly(&fleet.facts()[i].prices, &demand) {
            Ok(u) => {
                let c = u * t.replicas as f64;
                out.hourly += c;
                out.clusters.push(orrery_api::binding::ClusterCost {
                    name: t.name.clone(),
                    hourly: round_cost(c),
                });
            }
            Err(_) => out.unpriced.push(t.name.clone()),
        }
    }
    if out.clusters.is_empty() {
        return None;
    }
    out.hourly = round_cost(out.hourly);
    Some(out)
}

/// A price to a ten-thousandth, as status shows it.
pub(crate) fn round_cost(x: f64) -> f64 {
    (x * 10_000.0).round() / 10_000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consolidation_moves_replicas_only_for_a_saving_worth_a_restart() {
        // (n, room, price, keep_one) -> (n, moved); a saving of a tenth is asked for.
        type Case = (
            &'static [i64],
            &'static [Option<i64>],
            &'static [Option<f64>],
            bool,
            &'static [i64],
            i64,
        );
        let cases: &[Case] = &[
            // The cheaper has room for everything: all move.
            (
                &[0, 4],
                &[Some(10), Some(10)],
                &[Some(1.0), Some(2.0)],
                false,
                &[4, 0],
                4,
            ),
            // Only as many as its room takes (room counts what it already holds).
            (
                &[2, 4],
                &[Some(3), Some(10)],
                &[Some(1.0), Some(2.0)],
                false,
                &[3, 3],
                1,
            ),
            // Not a tenth cheaper: nothing moves.
            (
                &[0, 4],
                &[Some(10), Some(10)],
                &[Some(1.0), Some(1.05)],
                false,
                &[0, 4],
                0,
            ),
            // Exactly a tenth is enough.
            (
                &[0, 4],
                &[Some(10), Some(10)],
                &[Some(0.9), Some(1.0)],
                false,
                &[4, 0],
                4,
            ),
            // The dearest moves first, to the cheapest first; a middle one takes the rest.
            (
                &[0, 0, 3, 3],
                &[Some(2), Some(3), Some(10), Some(10)],
                &[Some(1.0), Some(2.0), Some(3.0), Some(4.0)],
                false,
                &[2, 3, 1, 0],
                5,
            ),
            // A cluster without a price neither gives nor takes; nor one without known room.
            (
                &[0, 3, 2],
                &[None, Some(9), Some(9)],
                &[Some(1.0), None, Some(2.0)],
                false,
                &[0, 3, 2],
                0,
            ),
            // Spread constraints counted on the clusters: each keeps one.
            (
                &[0, 3, 1],
                &[Some(9), Some(9), Some(9)],
                &[Some(1.0), Some(2.0), Some(3.0)],
                true,
                &[2, 1, 1],
                2,
            ),
            // A full cheaper cluster takes nothing; an over-full one gives nothing back.
            (
                &[5, 2],
                &[Some(4), Some(9)],
                &[Some(1.0), Some(2.0)],
                false,
                &[5, 2],
                0,
            ),
        ];
        for (n0, room, price, keep_one, want, moved) in cases {
            let mut n = n0.to_vec();
            let got = consolidate(&mut n, room, price, 0.1, *keep_one, None);
            assert_eq!(
                (n.as_slice(), got),
                (*want, *moved),
                "{n0:?} room {room:?} price {price:?} keep_one {keep_one}"
            );
            assert_eq!(
                n.iter().sum::<i64>(),
                n0.iter().sum::<i64>(),
                "replicas kept"
            );
        }
        // Free clusters: nothing moves between them.
        let mut n = vec![0, 3];
        let free = [Some(0.0), Some(0.0)];
        assert_eq!(
            consolidate(&mut n, &[Some(9), Some(9)], &free, 0.1, false, None),
            0
        );
        assert_eq!(n, [0, 3]);
    }

    #[test]
    fn consolidation_keeps_the_on_demand_floor() {
        use Capacity::{OnDemand, Spot};
        // (n, capacity, floor) -> n after; the first cluster is the cheapest, all have room.
        type Case = (&'static [i64], &'static [Capacity], f64, &'static [i64]);
        let cases: &[Case] = &[
            // 10 replicas, a floor of 0.3: 3 stay on on-demand.
            (&[0, 10], &[Spot, OnDemand], 0.3, &[7, 3]),
            // Already at the floor: none moves to spot.
            (&[7, 3], &[Spot, OnDemand], 0.3, &[7, 3]),
            // A dearer spot cluster's replicas may go to the cheaper spot one.
            (&[0, 3, 7], &[Spot, OnDemand, Spot], 0.3, &[7, 3, 0]),
            // No floor: all go.
            (&[0, 10], &[Spot, OnDemand], 0.0, &[10, 0]),
        ];
        for (n0, capacity, floor, want) in cases {
            let mut n = n0.to_vec();
            let price: Vec<Option<f64>> = (0..n.len()).map(|j| Some(1.0 + j as f64)).collect();
            let room = vec![Some(20); n.len()];
            consolidate(&mut n, &room, &price, 0.1, false, Some((capacity, *floor)));
            assert_eq!(n.as_slice(), *want, "{n0:?} {capacity:?} {floor}");
        }
    }

    #[test]
    fn a_budget_moves_replicas_to_cheaper_clusters_before_it_drops_any() {
        // (n, room, unit price, budget) -> (n, unplaced)
        type Case = (
            &'static [i64],
            &'static [Option<i64>],
            &'static [f64],
            f64,
            &'static [i64],
            i64,
        );
        let cases: &[Case] = &[
            // Within the budget: nothing changes.
            (&[2, 2], &[Some(5), Some(5)], &[1.0, 2.0], 6.0, &[2, 2], 0),
            // 1 over: one replica from the dearer to the cheaper, which has room.
            (&[2, 2], &[Some(5), Some(5)], &[1.0, 2.0], 5.0, &[3, 1], 0),
            // The cheaper is full: the dearest replicas are dropped.
            (&[2, 2], &[Some(2), Some(5)], &[1.0, 2.0], 4.0, &[2, 1], 1),
            // Moves as far as room allows, then drops.
            (&[0, 4], &[Some(1), None], &[1.0, 3.0], 7.0, &[1, 2], 1),
            // A budget of 0 places nothing that costs anything.
            (&[1, 1], &[None, None], &[0.0, 1.0], 0.0, &[2, 0], 0),
            (&[3], &[None], &[1.0], 0.0, &[0], 3),
        ];
        for (n0, room, unit, budget, want, dropped) in cases {
            let mut n = n0.to_vec();
            let got = keep_budget(&mut n, room, unit, *budget);
            assert_eq!(
                (n.as_slice(), got),
                (*want, *dropped),
                "{n0:?} {room:?} {unit:?} {budget}"
            );
            let cost: f64 = n.iter().zip(*unit).map(|(k, u)| *k as f64 * u).sum();
            assert!(cost <= budget + 1e-9);
        }
    }

    #[test]
    fn an_on_demand_floor_moves_spot_replicas_or_leaves_them_out() {
        use Capacity::{OnDemand as D, Spot as S};
        // (n, room, unit, capacity, floor, budget) -> (n, unplaced)
        type Case = (
            &'static [i64],
            &'static [Option<i64>],
            &'static [f64],
            &'static [Capacity],
            f64,
            Option<f64>,
            &'static [i64],
            i64,
        );
        let cases: &[Case] = &[
            // No spot: nothing to do.
            (
                &[4, 0],
                &[None, None],
                &[1.0, 0.3],
                &[D, S],
                0.5,
                None,
                &[4, 0],
                0,
            ),
            // 10 on spot, a floor of 0.3: 3 move to on-demand.
            (
                &[0, 10],
                &[None, None],
                &[1.0, 0.3],
                &[D, S],
                0.3,
                None,
                &[3, 7],
                0,
            ),
            // On-demand has room for 1: the floor holds by leaving spot replicas out (1 of 4
            // placed is 0.25 < 0.3: 1 of 3 placed is 0.33).
            (
                &[0, 10],
                &[Some(1), None],
                &[1.0, 0.3],
                &[D, S],
                0.3,
                None,
                &[1, 2],
                7,
            ),
            // Within a budget of 4: a move while it pays (0.3 x 9 + 1 = 3.7), drops while it
            // does not, a move again once the drops made room: 2 x 1 + 4 x 0.3 = 3.2.
            (
                &[0, 10],
                &[None, None],
                &[1.0, 0.3],
                &[D, S],
                0.3,
                Some(4.0),
                &[2, 4],
                4,
            ),
            // An unpriced cluster (infinite unit) is no on-demand capacity to move to.
            (
                &[0, 10, 0],
                &[None, None, None],
                &[1.0, 0.3, f64::INFINITY],
                &[D, S, D],
                0.3,
                None,
                &[3, 7, 0],
                0,
            ),
            // A floor of 1: all on on-demand.
            (
                &[1, 2],
                &[None, None],
                &[1.0, 0.3],
                &[D, S],
                1.0,
                None,
                &[3, 0],
                0,
            ),
        ];
        for (n0, room, unit, cap, floor, budget, want, dropped) in cases {
            let mut n = n0.to_vec();
            let got = keep_floor(&mut n, room, unit, cap, *floor, *budget);
            assert_eq!(
                (n.as_slice(), got),
                (*want, *dropped),
                "{n0:?} floor {floor}"
            );
        }
    }

    #[test]
    fn water_filling_leans_and_score_weighting_thrifts_by_price_and_weight() {
        // (weight, price, cheapest) -> (lean, thrift)
        for (w, p, c, lean_want, thrift_want) in [
            (5.0, Some(2.0), 1.0, 0.5 * 2f64.ln(), 0.5),
            (10.0, Some(2.0), 1.0, 2f64.ln(), 0.25),
            (5.0, Some(1.5), 1.0, 0.5 * 1.5f64.ln(), 1.0 / 1.5),
            (5.0, Some(100.0), 1.0, 1.0, 0.01),
            (0.0, Some(2.0), 1.0, 0.0, 1.0),
            (5.0, None, 1.0, 0.0, 1.0),
            (5.0, Some(1.0), 1.0, 0.0, 1.0),
            // The cheapest is free: everything else is as dear as can be.
            (5.0, Some(1.0), 0.0, 1.0, 0.0),
            (5.0, Some(0.0), 0.0, 0.0, 1.0),
        ] {
            assert!(
                (lean(w, p, c) - lean_want).abs() < 1e-9,
                "lean {w} {p:?} {c}"
            );
            assert!(
                (thrift(w, p, c) - thrift_want).abs() < 1e-9,
                "thrift {w} {p:?} {c}"
            );
        }
    }
}
