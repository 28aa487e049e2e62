//! Score plugins (draft 7.3.3): each rates the clusters that passed the filters from 0 to 100;
//! the total is the weighted mean. Weights are configurable and follow monitoring: see
//! [`Weights::adjusted`].
//!
//! A plugin is a name, a weight and a function over the feasible clusters; the data-aware
//! one ([`crate::data::Completion`]) lives with its filters in `data.rs`.

use crate::Ctx;

/// One score plugin.
pub trait Score: Send + Sync + std::fmt::Debug {
    fn name(&self) -> &'static str;
    /// Scores `feasible` (cluster indexes) into `out`, 0..=100 each.
    fn score(&self, ctx: &Ctx<'_>, feasible: &[usize], out: &mut [f64]);
    /// The score every cluster gets, when the plugin can tell without looking at them all
    /// (it then cannot change the ranking and is not run).
    fn constant(&self, _ctx: &Ctx<'_>, _feasible: &[usize]) -> Option<f64> {
        None
    }
    /// Whether the plugin has anything to say of this task at all. One that has not takes no
    /// part in the weighted mean: its weight would only pull every total towards the middle,
    /// and division by score would come out flatter.
    fn applies(&self, _ctx: &Ctx<'_>) -> bool {
        true
    }
    /// The plugin's weight for this task, where the task sets it (the placement's
    /// `cost.weight`); otherwise the configured [`Weights`].
    fn weight(&self, _ctx: &Ctx<'_>) -> Option<f64> {
        None
    }
}

/// Weights of the built-in plugins.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Weights {
    pub headroom: f64,
    pub balance: f64,
    pub locality: f64,
    pub priority: f64,
    pub network: f64,
    pub proximity: f64,
    /// Completion time of a task that reads data sets ([`crate::data::Completion`]).
    pub completion: f64,
}

impl Default for Weights {
    fn default() -> Self {
        Weights {
            headroom: 1.0,
            balance: 2.0,
            locality: 1.0,
            priority: 1.0,
            network: 1.0,
            // Above balance and locality together: a workload stays close to what it
            // follows unless nothing close can hold it.
            proximity: 4.0,
            // A task that reads data sets goes where it finishes first: the estimate outweighs
            // the load-based plugins together.
            completion: 6.0,
        }
    }
}

/// What monitoring says about the fleet right now, for weight adjustment.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Signals {
    /// The fleet's network traffic now and its usual level (a slow moving average), bytes/s.
    pub traffic: f64,
    pub traffic_baseline: f64,
}

/// Traffic above this multiple of its usual level is a surge.
pub const SURGE: f64 = 1.5;
/// The network weight grows with the surge up to this factor.
pub const SURGE_MAX_FACTOR: f64 = 4.0;

impl Weights {
    /// The weights adjusted from monitoring (draft 7.3.3). The rule: when the fleet's traffic
    /// is more than [`SURGE`] times its usual level, the network weight is multiplied by the
    /// ratio, up to [`SURGE_MAX_FACTOR`]; otherwise the weights stand.
    pub fn adjusted(&self, s: &Signals) -> Weights {
        let mut w = *self;
        if s.traffic_baseline > 0.0 {
            let ratio = s.traffic / s.traffic_baseline;
            if ratio > SURGE {
                w.network *= ratio.min(SURGE_MAX_FACTOR);
            }
        }
        w
    }

    pub fn of(&self, plugin: &str) -> f64 {
        match plugin {
            "Headroom" => self.headroom,
            "Balance" => self.balance,
            "Locality" => self.locality,
            "Priority" => self.priority,
            "Network" => self.network,
            "Proximity" => self.proximity,
            "Completion" => self.completion,
            _ => 0.0,
        }
    }
}

/// Why a weights setting (`--score-weights`) cannot be taken.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WeightsError {
    #[error("`{0}` is not PLUGIN=WEIGHT")]
    Malformed(String),
    #[error(
        "unknown score plugin `{0}` (known: headroom, balance, locality, priority, network, proximity, completion)"
    )]
    UnknownPlugin(String),
    #[error("the weight of {plugin} must be a number of at least 0, not `{value}`")]
    BadWeight { plugin: String, value: String },
    #[error("{0} is named twice")]
    Repeated(String),
    #[error("every weight is 0: nothing would rank the clusters")]
    AllZero,
}

impl std::str::FromStr for Weights {
    type Err = WeightsError;

    /// `balance=3,network=0.5`: comma-separated `PLUGIN=WEIGHT` (plugin names in any case);
    /// plugins not named keep their default weight. An empty text is the defaults.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut w = Weights::default();
        let mut seen: Vec<String> = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, value) = part
                .split_once('=')
                .ok_or_else(|| WeightsError::Malformed(part.to_string()))?;
            let name = name.trim().to_ascii_lowercase();
            let slot = match name.as_str() {
                "headroom" => &mut w.headroom,
                "balance" => &mut w.balance,
                "locality" => &mut w.locality,
                "priority" => &mut w.priority,
                "network" => &mut w.network,
                "proximity" => &mut w.proximity,
                "completion" => &mut w.completion,
                _ => return Err(WeightsError::UnknownPlugin(name)),
            };
            if seen.contains(&name) {
                return Err(WeightsError::Repeated(name));
            }
            let value = value.trim();
            *slot = value
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| WeightsError::BadWeight {
                    plugin: name.clone(),
                    value: value.to_string(),
                })?;
            seen.push(name);
        }
        // Proximity ranks only workloads tied to others: it cannot rank clusters alone.
        if w.headroom + w.balance + w.locality + w.priority + w.network == 0.0 {
            return Err(WeightsError::AllZero);
        }
        Ok(w)
    }
}

/// Room for more replicas under the water level limit, relative to the roomiest cluster.
#[derive(Debug)]
pub struct Headroom;

impl Score for Headroom {
    fn name(&self) -> &'static str {
        "Headroom"
    }
    fn score(&self, ctx: &Ctx<'_>, feasible: &[usize], out: &mut [f64]) {
        // The room before the forecast crosses the shed mark, where there is a forecast.
        let max = feasible
            .iter()
            .filter_map(|i| ctx.room_ahead(*i))
            .max()
            .unwrap_or(0);
        for (o, i) in out.iter_mut().zip(feasible) {
            *o = match ctx.room_ahead(*i) {
                _ if max == 0 => 50.0,
                Some(r) => 100.0 * r as f64 / max as f64,
                None => 50.0,
            };
        }
    }
}

/// Lower water level after one more replica scores higher: 100 when empty, 0 at the limit.
#[derive(Debug)]
pub struct Balance;

impl Score for Balance {
    fn name(&self) -> &'static str {
        "Balance"
    }
    fn score(&self, ctx: &Ctx<'_>, feasible: &[usize], out: &mut [f64]) {
        for (o, i) in out.iter_mut().zip(feasible) {
            *o = if ctx.fleet.facts()[*i].known() {
                (100.0 * (1.0 - ctx.level_after(*i, 1) / ctx.limit)).clamp(0.0, 100.0)
            } else {
                50.0
            };
        }
    }
}

/// Clusters already running the workload score 100, to avoid churn.
#[derive(Debug)]
pub struct Locality;

impl Score for Locality {
    fn name(&self) -> &'static str {
        "Locality"
    }
    fn score(&self, ctx: &Ctx<'_>, feasible: &[usize], out: &mut [f64]) {
        for (o, i) in out.iter_mut().zip(feasible) {
            *o = if ctx.previous[*i] > 0 { 100.0 } else { 0.0 };
        }
    }
    fn constant(&self, ctx: &Ctx<'_>, _: &[usize]) -> Option<f64> {
        ctx.task.previous.is_empty().then_some(0.0)
    }
}

/// Higher-priority tasks lean towards the least loaded clusters, where they meet the least
/// contention: the cluster's free fraction, scaled by the task's priority (0 to 100, clamped);
/// a task of priority 0 or less scores every cluster the same.
#[derive(Debug)]
pub struct Priority;

impl Score for Priority {
    fn name(&self) -> &'static str {
        "Priority"
    }
    fn score(&self, ctx: &Ctx<'_>, feasible: &[usize], out: &mut [f64]) {
        let p = (ctx.task.priority.clamp(0, 100)) as f64 / 100.0;
        for (o, i) in out.iter_mut().zip(feasible) {
            let level = ctx.level_ahead(*i);
            let free = (1.0 - level).clamp(0.0, 1.0);
            *o = 100.0 * (p * free + (1.0 - p) * 0.5);
        }
    }
    fn constant(&self, ctx: &Ctx<'_>, _: &[usize]) -> Option<f64> {
        (ctx.task.priority <= 0).then_some(50.0)
    }
}

/// Less traffic and lower latency to the rest of the fleet score higher; clusters that report
/// no figures score in the middle.
#[derive(Debug)]
pub struct Network;

impl Score for Network {
    fn name(&self) -> &'static str {
        "Network"
    }
    fn score(&self, ctx: &Ctx<'_>, feasible: &[usize], out: &mut [f64]) {
        let facts = ctx.fleet.facts();
        let max_traffic = feasible
            .iter()
            .map(|i| facts[*i].traffic)
            .fold(0.0, f64::max);
        let max_latency = feasible
            .iter()
            .filter_map(|i| facts[*i].latency)
            .fold(0.0, f64::max);
        for (o, i) in out.iter_mut().zip(feasible) {
            let f = &facts[*i];
            let t = if max_traffic > 0.0 {
                100.0 * (1.0 - f.traffic / max_traffic)
            } else {
                50.0
            };
            let l = match f.latency {
                Some(l) if max_latency > 0.0 => 100.0 * (1.0 - l / max_latency),
                _ => 50.0,
            };
            *o = (t + l) / 2.0;
        }
    }
    fn constant(&self, ctx: &Ctx<'_>, feasible: &[usize]) -> Option<f64> {
        let facts = ctx.fleet.facts();
        feasible
            .iter()
            .all(|i| facts[*i].traffic <= 0.0 && facts[*i].latency.is_none())
            .then_some(50.0)
    }
}

/// Closer (by round-trip latency) to the clusters the task should be near scores higher:
/// 100 for the closest feasible cluster (or one of them), 0 for the farthest; a cluster
/// whose latency to them nobody reports scores in the middle.
#[derive(Debug)]
pub struct Proximity;

impl Proximity {
    /// The mean latency from cluster `i` to the clusters the task should be near.
    fn mean_latency(ctx: &Ctx<'_>, i: usize) -> Option<f64> {
        let near = ctx.task.relations.near;
        let clusters = ctx.fleet.clusters();
        let c = &clusters[i];
        let mut sum = 0.0;
        let mut n = 0;
        for name in near {
            let Some(j) = ctx.fleet.position(name) else {
                continue;
            };
            if let Some(l) = c.latency_to(&clusters[j]) {
                sum += l;
                n += 1;
            }
        }
        (n > 0).then(|| sum / n as f64)
    }
}

impl Score for Proximity {
    fn name(&self) -> &'static str {
        "Proximity"
    }
    fn score(&self, ctx: &Ctx<'_>, feasible: &[usize], out: &mut [f64]) {
        let lat: Vec<Option<f64>> = feasible
            .iter()
            .map(|i| Self::mean_latency(ctx, *i))
            .collect();
        let (min, max) = lat
            .iter()
            .flatten()
            .fold((f64::MAX, 0.0f64), |(lo, hi), l| (lo.min(*l), hi.max(*l)));
        for (o, l) in out.iter_mut().zip(&lat) {
            *o = match l {
                Some(l) if max > min => 100.0 * (1.0 - (l - min) / (max - min)),
                Some(_) => 100.0,
                None => 50.0,
            };
        }
    }
    fn constant(&self, ctx: &Ctx<'_>, _: &[usize]) -> Option<f64> {
        ctx.task.relations.near.is_empty().then_some(50.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traffic_surge_raises_the_network_weight() {
        let w = Weights::default();
        let cases = [
            (100.0, 100.0, 1.0),
            (140.0, 100.0, 1.0),
            (200.0, 100.0, 2.0),
            (1000.0, 100.0, 4.0),
            (500.0, 0.0, 1.0),
        ];
        for (now, base, factor) in cases {
            let a = w.adjusted(&Signals {
                traffic: now,
                traffic_baseline: base,
            });
            assert_eq!(a.network, w.network * factor, "{now}/{base}");
            assert_eq!(a.balance, w.balance);
        }
    }

    #[test]
    fn weights_are_read_from_their_setting() {
        let d = Weights::default();
        let ok = [
            ("", d),
            ("balance=3", Weights { balance: 3.0, ..d }),
            (
                " Locality = 0 , network=0.5,",
                Weights {
                    locality: 0.0,
                    network: 0.5,
                    ..d
                },
            ),
            (
                "headroom=2,balance=0,locality=0,priority=0,network=0",
                Weights {
                    headroom: 2.0,
                    balance: 0.0,
                    locality: 0.0,
                    priority: 0.0,
                    network: 0.0,
                    proximity: d.proximity,
                    completion: d.completion,
                },
            ),
        ];
        for (text, want) in ok {
            assert_eq!(text.parse::<Weights>(), Ok(want), "{text:?}");
        }
        let bad = [
            ("balance", WeightsError::Malformed("balance".into())),
            ("cost=1", WeightsError::UnknownPlugin("cost".into())),
            (
                "balance=-1",
                WeightsError::BadWeight {
                    plugin: "balance".into(),
                    value: "-1".into(),
                },
            ),
            (
                "network=NaN",
                WeightsError::BadWeight {
                    plugin: "network".into(),
                    value: "NaN".into(),
                },
            ),
            (
                "network=inf",
                WeightsError::BadWeight {
                    plugin: "network".into(),
                    value: "inf".into(),
                },
            ),
            (
                "balance=1,Balance=2",
                WeightsError::Repeated("balance".into()),
            ),
            (
                "headroom=0,balance=0,locality=0,priority=0,network=0",
                WeightsError::AllZero,
            ),
        ];
        for (text, want) in bad {
            assert_eq!(text.parse::<Weights>(), Err(want), "{text:?}");
        }
    }
}
