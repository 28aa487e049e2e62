//! Data-aware scheduling (draft 5.1, 7.3.1): storage tier, network and computing power as the
//! filters and the estimate of a task that reads data sets.
//!
//! For each candidate cluster the estimate is the task's completion time there:
//!
//! - **transfer**: every input the cluster holds no copy of comes from the ready holder it
//!   would arrive from first: what is already booked on either end's link, latency, plus its
//!   bytes over the path (the slower of the two uplinks, or less where a member reports the
//!   path slower). Where the path is slower than both uplinks, it may come through a relay
//!   whose cache tier holds the copy in between, when the two hops one after the other beat
//!   the direct path. The cluster's own downlink is shared: the transfer takes at least all
//!   the bytes over it.
//! - **compute**: the work (hours of the reference GPU) over the replicas, at the cluster's
//!   GPU performance; when fewer replicas fit than the task has, they run in rounds, and the
//!   rounds but the first are the **wait**. A whole set of components runs at once: the work
//!   is over the sum of its components' replicas.
//! - **egress**: the bytes leaving each source, at its price per GiB.
//!
//! Completion is transfer + wait + compute. Moving the compute to the data and the data to
//! the compute are the same comparison: a holder of the data needs no transfer. A task that
//! reads no data is not scored by [`Completion`] at all (it takes no part in the mean).

use orrery_api::data::{CACHE_PROPERTY, EGRESS_PRICE_PROPERTY, GPU_PERFORMANCE_PROPERTY};
use orrery_api::data::{NETWORK_KEY, Tier};
use orrery_api::data::{STORAGE_TIER_KEY, gpu_performance};

use crate::Ctx;
use crate::filter::Filter;
use crate::score::Score;

/// The uplink assumed of a cluster that does not report one: 1 Gbit/s.
pub const DEFAULT_BANDWIDTH: f64 = 125.0 * 1024.0 * 1024.0;

/// One data set a task reads.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Input {
    pub name: String,
    pub bytes: i64,
    /// The clusters holding a copy (authoritative or cached), with its tier.
    pub holders: Vec<(String, Tier)>,
}

/// What ties a task to its data: its inputs, its work and what its placement optimizes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DataNeeds {
    pub inputs: Vec<Input>,
    /// Hours of the reference GPU; 0 when the task does not say.
    pub gpu_hours: f64,
    /// Egress cost first, then completion time (`dataPolicy.optimizeFor: TransferCost`).
    pub cost_first: bool,
    /// The most that may be copied to a chosen cluster, bytes.
    pub max_transfer: Option<i64>,
    /// The storage tier every chosen cluster must offer.
    pub tier: Option<Tier>,
    /// The network every chosen cluster must be on (its `orrery.io/network` label).
    pub network: String,
    /// Inputs named by the task that do not exist (it waits for them).
    pub missing: Vec<String>,
}

impl DataNeeds {
    pub fn is_empty(&self) -> bool {
        self.inputs.is_empty()
            && self.missing.is_empty()
            && self.gpu_hours == 0.0
            && self.tier.is_none()
            && self.network.is_empty()
    }
}

/// One input's way to a cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct Fetch {
    pub input: String,
    pub from: String,
    /// The cluster it is relayed through, when two hops beat the direct path.
    pub via: Option<String>,
    pub bytes: i64,
}

/// A task's completion in one cluster, in its parts.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Estimate {
    pub transfer_seconds: f64,
    pub wait_seconds: f64,
    pub compute_seconds: f64,
    pub transfer_bytes: i64,
    pub egress_cost: f64,
    pub fetches: Vec<Fetch>,
    /// Inputs no ready cluster holds: the task cannot start here.
    pub unreachable: Vec<String>,
}

impl Estimate {
    /// As a binding's status shows it (tenths of seconds, cents: what a small change of
    /// latency moves is not worth a status write).
    pub fn summary(&self) -> orrery_api::binding::CompletionEstimate {
        let tenth = |x: f64| {
            if x.is_finite() {
                (x * 10.0).round() / 10.0
            } else {
                -1.0
            }
        };
        orrery_api::binding::CompletionEstimate {
            total_seconds: tenth(self.total_seconds()),
            transfer_seconds: tenth(self.transfer_seconds),
            wait_seconds: tenth(self.wait_seconds),
            compute_seconds: tenth(self.compute_seconds),
            transfer_bytes: self.transfer_bytes,
            egress_cost: (self.egress_cost * 100.0).round() / 100.0,
            fetches: self
                .fetches
                .iter()
                .map(|f| orrery_api::binding::DataFetch {
                    dataset: f.input.clone(),
                    from: f.from.clone(),
                    via: f.via.clone().unwrap_or_default(),
                    bytes: f.bytes,
                })
                .collect(),
        }
    }

    pub fn total_seconds(&self) -> f64 {
        if !self.unreachable.is_empty() {
            return f64::INFINITY;
        }
        self.transfer_seconds + self.wait_seconds + self.compute_seconds
    }
}

fn property(ctx: &Ctx<'_>, i: usize, name: &str) -> Option<f64> {
    ctx.fleet.clusters()[i]
        .properties
        .get(name)
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v >= 0.0)
}

/// Cluster `i`'s GPU performance against the reference GPU: its property, else its model's
/// entry in the table, else 1.
pub fn performance(ctx: &Ctx<'_>, i: usize) -> f64 {
    property(ctx, i, GPU_PERFORMANCE_PROPERTY)
        .filter(|p| *p > 0.0)
        .or_else(|| {
            ctx.fleet.clusters()[i]
                .properties
                .get(orrery_api::data::GPU_MODEL_PROPERTY)
                .map(|m| gpu_performance(m))
        })
        .unwrap_or(1.0)
}

fn uplink(ctx: &Ctx<'_>, i: usize) -> f64 {
    ctx.fleet.clusters()[i]
        .bandwidth
        .filter(|b| *b > 0)
        .map_or(DEFAULT_BANDWIDTH, |b| b as f64)
}

/// What the path between clusters `a` and `b` carries, bytes per second.
fn path(ctx: &Ctx<'_>, a: usize, b: usize) -> f64 {
    let clusters = ctx.fleet.clusters();
    clusters[a].path_bandwidth_to(&clusters[b], DEFAULT_BANDWIDTH as i64) as f64
}

/// Bytes of cluster `i`'s cache tier (`cache.orrery.io/capacity`), 0 when it has none.
fn cache_bytes(ctx: &Ctx<'_>, i: usize) -> i64 {
    ctx.fleet.clusters()[i]
        .properties
        .get(CACHE_PROPERTY)
        .and_then(|v| v.parse::<orrery_api::Quantity>().ok())
        .map_or(0, |q| q.value() as i64)
}

/// One way an input may come: from holder `from`, straight or through `via`.
#[derive(Clone, Copy, Debug)]
struct Way {
    from: usize,
    via: Option<usize>,
    /// Until its first byte arrives: what is booked on the links, then the latency.
    lead: f64,
    /// Sending its bytes: over the path, or over both hops one after the other (a relay
    /// holds the whole copy before it passes it on).
    send: f64,
    cost: f64,
}

impl Way {
    fn seconds(&self) -> f64 {
        self.lead + self.send
    }
}

/// The ways an input of `bytes` may reach cluster `i` from holder `s`: straight, and, where
/// that path is slower than both uplinks, through each ready cluster whose cache tier can
/// hold a copy and whose two hops together beat it.
fn ways(ctx: &Ctx<'_>, i: usize, s: usize, bytes: i64, out: &mut Vec<Way>) {
    let clusters = ctx.fleet.clusters();
    let here = &clusters[i];
    let price = |c: usize| gib(bytes) * property(ctx, c, EGRESS_PRICE_PROPERTY).unwrap_or(0.0);
    let latency = |a: usize, b: usize| clusters[a].latency_to(&clusters[b]).unwrap_or(0.0) / 1000.0;
    let booked = clusters[s].busy_out_seconds.max(here.busy_in_seconds);
    let straight = path(ctx, s, i);
    let direct = Way {
        from: s,
        via: None,
        lead: booked + latency(s, i),
        send: bytes as f64 / straight,
        cost: price(s),
    };
    out.push(direct);
    if straight >= uplink(ctx, s).min(uplink(ctx, i)) {
        return;
    }
    for r in 0..clusters.len() {
        if r == s || r == i || !clusters[r].ready || cache_bytes(ctx, r) < bytes {
            continue;
        }
        let relayed = Way {
            from: s,
            via: Some(r),
            lead: booked + latency(s, r) + latency(r, i),
            send: bytes as f64 / path(ctx, s, r) + bytes as f64 / path(ctx, r, i),
            cost: price(s) + price(r),
        };
        if relayed.seconds() < direct.seconds() {
            out.push(relayed);
        }
    }
}

/// The task's completion in cluster `i`.
pub fn estimate(ctx: &Ctx<'_>, i: usize, needs: &DataNeeds) -> Estimate {
    let clusters = ctx.fleet.clusters();
    let here = &clusters[i];
    let down = uplink(ctx, i);
    let mut e = Estimate::default();
    // Seconds each source spends sending, and the longest lead.
    let mut per_source: Vec<(usize, f64)> = Vec::new();
    let mut lead: f64 = 0.0;
    let mut candidates = Vec::new();
    for input in &needs.inputs {
        if input.holders.iter().any(|(c, _)| *c == here.name) {
            continue;
        }
        candidates.clear();
        for s in input
            .holders
            .iter()
            .filter_map(|(c, _)| ctx.fleet.position(c))
            .filter(|s| clusters[*s].ready)
        {
            ways(ctx, i, s, input.bytes, &mut candidates);
        }
        let best = candidates.iter().min_by(|a, b| {
            let key = |x: &Way| {
                if needs.cost_first {
                    (x.cost, x.seconds())
                } else {
                    (x.seconds(), x.cost)
                }
            };
            let (ka, kb) = (key(a), key(b));
            ka.0.total_cmp(&kb.0)
                .then(ka.1.total_cmp(&kb.1))
                .then((a.from, a.via).cmp(&(b.from, b.via)))
        });
        match best {
            Some(w) => {
                e.transfer_bytes += input.bytes;
                e.egress_cost += w.cost;
                lead = lead.max(w.lead);
                match per_source.iter_mut().find(|(x, _)| *x == w.from) {
                    Some((_, t)) => *t += w.send,
                    None => per_source.push((w.from, w.send)),
                }
                e.fetches.push(Fetch {
                    input: input.name.clone(),
                    from: clusters[w.from].name.clone(),
                    via: w.via.map(|r| clusters[r].name.clone()),
                    bytes: input.bytes,
                });
            }
            None => e.unreachable.push(input.name.clone()),
        }
    }
    e.unreachable.extend(needs.missing.iter().cloned());
    if e.transfer_bytes > 0 {
        let slowest_source = per_source.iter().map(|(_, t)| *t).fold(0.0, f64::max);
        e.transfer_seconds = lead + slowest_source.max(e.transfer_bytes as f64 / down);
    }
    if needs.gpu_hours > 0.0 {
        // A whole set of components runs all its pods at once: the work is over their sum.
        let set: i64 = ctx.task.components.iter().map(|c| c.replicas.max(0)).sum();
        let whole = ctx.task.components.len() > 1;
        let replicas = if whole {
            set.max(1)
        } else {
            ctx.task.replicas.max(1)
        };
        let at_once = match ctx.room.get(i).copied().flatten() {
            Some(r) if ctx.needs_room() && !whole => r.clamp(1, replicas),
            _ => replicas,
        };
        let rounds = (replicas + at_once - 1) / at_once;
        let round = needs.gpu_hours * 3600.0 / (replicas as f64 * performance(ctx, i));
        e.compute_seconds = round;
        e.wait_seconds = (rounds - 1) as f64 * round;
    }
    e
}

fn gib(bytes: i64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// The task's data needs, when it has any.
fn needs<'a>(ctx: &Ctx<'a>) -> Option<&'a DataNeeds> {
    ctx.task.relations.data
}

/// The storage tier the task needs must be served by the cluster's (`orrery.io/storage-tier`
/// label: its best tier; a faster tier serves a slower need).
#[derive(Debug)]
pub struct StorageTier;

impl Filter for StorageTier {
    fn name(&self) -> &'static str {
        "StorageTier"
    }
    fn check(&self, ctx: &Ctx<'_>, i: usize) -> bool {
        let Some(wanted) = needs(ctx).and_then(|n| n.tier) else {
            return true;
        };
        ctx.fleet.clusters()[i]
            .labels
            .get(STORAGE_TIER_KEY)
            .and_then(|t| Tier::parse(t))
            .is_some_and(|t| t.serves(wanted))
    }
    fn why(&self, ctx: &Ctx<'_>, i: usize) -> String {
        let wanted = needs(ctx)
            .and_then(|n| n.tier)
            .map(|t| format!("{t:?}").to_lowercase())
            .unwrap_or_default();
        match ctx.fleet.clusters()[i].labels.get(STORAGE_TIER_KEY) {
            Some(t) => {
                format!("its storage tier {t} is slower than the {wanted} the workload needs")
            }
            None => {
                format!("it has no {STORAGE_TIER_KEY} label; the workload needs {wanted} storage")
            }
        }
    }
}

/// The network the task names must be the cluster's (`orrery.io/network` label).
#[derive(Debug)]
pub struct Network;

impl Filter for Network {
    fn name(&self) -> &'static str {
        "Network"
    }
    fn check(&self, ctx: &Ctx<'_>, i: usize) -> bool {
        match needs(ctx) {
            Some(n) if !n.network.is_empty() => {
                ctx.fleet.clusters()[i].labels.get(NETWORK_KEY) == Some(&n.network)
            }
            _ => true,
        }
    }
    fn why(&self, ctx: &Ctx<'_>, i: usize) -> String {
        let wanted = needs(ctx).map(|n| n.network.as_str()).unwrap_or("");
        match ctx.fleet.clusters()[i].labels.get(NETWORK_KEY) {
            Some(n) => format!("it is on network {n}, not {wanted}"),
            None => {
                format!("it is on no network ({NETWORK_KEY} label); the workload needs {wanted}")
            }
        }
    }
}

/// The task's inputs must be able to reach the cluster: each one held by a ready cluster,
/// and no more copied than the placement's `dataPolicy.maxTransfer`.
#[derive(Debug)]
pub struct DataReach;

impl Filter for DataReach {
    fn name(&self) -> &'static str {
        "DataReach"
    }
    fn check(&self, ctx: &Ctx<'_>, i: usize) -> bool {
        let Some(n) = needs(ctx) else {
            return true;
        };
        if n.inputs.is_empty() && n.missing.is_empty() {
            return true;
        }
        let e = estimate(ctx, i, n);
        e.unreachable.is_empty() && n.max_transfer.is_none_or(|m| e.transfer_bytes <= m)
    }
    fn why(&self, ctx: &Ctx<'_>, i: usize) -> String {
        let Some(n) = needs(ctx) else {
            return String::new();
        };
        let e = estimate(ctx, i, n);
        if !e.unreachable.is_empty() {
            return format!(
                "no ready cluster holds its data set(s) {}",
                e.unreachable.join(", ")
            );
        }
        format!(
            "{} GiB of its inputs would be copied here, above the maxTransfer of {} GiB",
            round1(gib(e.transfer_bytes)),
            round1(gib(n.max_transfer.unwrap_or(0)))
        )
    }
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// Rates clusters by the task's completion time there (or, when its placement optimizes
/// transfer cost, by egress cost first): the best gets 100, the worst 0.
#[derive(Debug)]
pub struct Completion;

impl Score for Completion {
    fn name(&self) -> &'static str {
        "Completion"
    }
    fn score(&self, ctx: &Ctx<'_>, feasible: &[usize], out: &mut [f64]) {
        let Some(n) = needs(ctx) else {
            out.iter_mut().for_each(|o| *o = 50.0);
            return;
        };
        let est: Vec<Estimate> = feasible.iter().map(|i| estimate(ctx, *i, n)).collect();
        let scale = |v: &[f64]| -> Vec<f64> {
            let finite = v.iter().filter(|x| x.is_finite());
            let (lo, hi) = finite.fold((f64::MAX, f64::MIN), |(l, h), x| (l.min(*x), h.max(*x)));
            v.iter()
                .map(|x| {
                    if !x.is_finite() {
                        0.0
                    } else if hi > lo {
                        100.0 * (1.0 - (x - lo) / (hi - lo))
                    } else {
                        100.0
                    }
                })
                .collect()
        };
        let time = scale(&est.iter().map(Estimate::total_seconds).collect::<Vec<_>>());
        let result = if n.cost_first {
            let cost = scale(&est.iter().map(|e| e.egress_cost).collect::<Vec<_>>());
            cost.iter()
                .zip(&time)
                .map(|(c, t)| 0.7 * c + 0.3 * t)
                .collect()
        } else {
            time
        };
        out.copy_from_slice(&result);
    }
    fn applies(&self, ctx: &Ctx<'_>) -> bool {
        needs(ctx).is_some_and(|n| !n.is_empty())
    }
}
