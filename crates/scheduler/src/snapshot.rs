//! What the scheduler knows about the member clusters (draft 7.2: totals, and the largest
//! free amount on a single node), and the numeric form it computes with.
//!
//! A [`Fleet`] turns each [`ClusterSnapshot`] into a few fixed-size vectors once, when the
//! cluster changes, so that scheduling a binding is float arithmetic over arrays rather than
//! map lookups: the engine must decide tens of thousands of bindings a second over a thousand
//! clusters.

use std::collections::{BTreeMap, HashMap, HashSet};

use orrery_api::cluster::{ResourceList, Taint, dimension_of};
use orrery_api::overrides::ClusterView;
use orrery_api::prediction::{Ahead, Bound};

/// The water level dimensions, in the order of a [`Vector`].
pub const DIMENSIONS: [&str; 5] = ["cpu", "memory", "gpu", "pods", "storage"];
const PODS: usize = 3;

/// An amount per dimension, in base units (cores, bytes, GPUs, pods, bytes).
pub type Vector = [f64; 5];

/// A resource list as a vector; resources that are no water level dimension are left out.
pub fn vector_of(list: &ResourceList) -> Vector {
    let mut v = [0.0; 5];
    for (name, q) in list {
        if let Some(d) = dimension_of(name)
            && let Some(i) = DIMENSIONS.iter().position(|x| *x == d)
        {
            v[i] += q.as_f64();
        }
    }
    v
}

/// What one replica takes: its requests, and one pod.
pub fn demand_of(request: &ResourceList) -> Vector {
    let mut v = vector_of(request);
    v[PODS] = v[PODS].max(1.0);
    v
}

/// What the scheduler knows about one member cluster.
#[derive(Clone, Debug, Default)]
pub struct ClusterSnapshot {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub provider: String,
    pub region: String,
    pub zones: Vec<String>,
    pub properties: BTreeMap<String, String>,
    /// What the member offers beyond plain capacity (`gpu`, `tls-encryption`...).
    pub capabilities: Vec<String>,
    pub taints: Vec<Taint>,
    pub ready: bool,
    /// `group/version` + kind pairs the member serves; `None` when it has not said.
    pub api_kinds: Option<HashSet<(String, String)>>,
    /// Capacity and what pods have requested (placed and pending); empty when unknown.
    pub allocatable: ResourceList,
    pub allocated: ResourceList,
    /// What is actually in use, background load included, where the member measures it.
    pub usage: ResourceList,
    /// The most free on any single node (draft 7.2.2); empty when unknown.
    pub largest_node_free: ResourceList,
    /// Round-trip latency to other clusters in milliseconds, by name.
    pub latency_ms: BTreeMap<String, f64>,
    /// Its member's round trip to the control plane: the latency to a cluster neither end
    /// measures is estimated as the sum of the two (an upper bound by the triangle
    /// inequality; members behind NAT cannot reach each other to measure).
    pub server_latency_ms: Option<f64>,
    /// Ingress plus egress, bytes per second.
    pub traffic: f64,
    /// The storage classes it offers, the default first; empty when it has not said.
    pub storage_classes: Vec<String>,
    /// Its data uplink, bytes per second, when it says.
    pub bandwidth: Option<i64>,
    /// What the paths to other clusters carry, bytes per second, by name, where it reports
    /// them slower than both uplinks.
    pub path_bandwidth: BTreeMap<String, i64>,
    /// Seconds of data transfers already booked on its link, out and in: a new transfer from
    /// or to it starts after them (data-aware scheduling; 0 when nothing is booked).
    pub busy_out_seconds: f64,
    pub busy_in_seconds: f64,
}

impl ClusterSnapshot {
    /// What the scheduler reads of a stored Cluster.
    pub fn of(c: &orrery_api::Object) -> ClusterSnapshot {
        let spec = orrery_api::cluster::ClusterSpec::of(c);
        let st = orrery_api::cluster::ClusterStatus::of(c);
        let ready = st.ready();
        let traffic = st.traffic();
        let latency_ms = st
            .network
            .as_ref()
            .map(|n| n.latency_ms.clone())
            .unwrap_or_default();
        let bandwidth = st
            .network
            .as_ref()
            .and_then(|n| n.bandwidth_bytes_per_second);
        let path_bandwidth = st
            .network
            .as_ref()
            .map(|n| n.path_bandwidth_bytes_per_second.clone())
            .unwrap_or_default();
        let server_latency_ms = st.network.as_ref().and_then(|n| n.server_latency_ms);
        let api_kinds = (!st.api_enablements.is_empty()).then(|| {
            st.api_enablements
                .iter()
                .flat_map(|e| {
                    e.resources
                        .iter()
                        .map(|r| (e.group_version.clone(), r.kind.clone()))
                })
                .collect::<std::collections::HashSet<_>>()
        });
        // What is taken: placed and pending (waiting for a node) alike.
        let (allocatable, allocated, usage) = match st.resource_summary {
            Some(r) => {
                let mut taken = r.allocated;
                for (k, q) in r.allocating {
                    let total = taken.get(&k).map(|a| *a + q).unwrap_or(q);
                    taken.insert(k, total);
                }
                (r.allocatable, taken, r.usage)
            }
            None => Default::default(),
        };

        ClusterSnapshot {
            name: c.name().to_string(),
            labels: c.metadata.labels.clone(),
            provider: spec.provider,
            region: spec.region,
            zones: spec.zones,
            // The Cluster's own properties over the member's, key by key (prices a platform
            // team knows better than the member).
            properties: {
                let mut p = st.properties;
                p.extend(spec.properties);
                p
            },
            capabilities: spec.capabilities,
            taints: spec.taints,
            ready,
            api_kinds,
            allocatable,
            allocated,
            usage,
            largest_node_free: st.largest_node_free,
            latency_ms,
            server_latency_ms,
            traffic,
            storage_classes: st.storage_classes,
            bandwidth,
            path_bandwidth,
            busy_out_seconds: 0.0,
            busy_in_seconds: 0.0,
        }
    }

    /// The round-trip latency to `other`, as either of the two measures it, else estimated
    /// from both ends' round trips to the control plane (0 to itself).
    pub fn latency_to(&self, other: &ClusterSnapshot) -> Option<f64> {
        if self.name == other.name {
            return Some(0.0);
        }
        self.latency_ms
            .get(&other.name)
            .or_else(|| other.latency_ms.get(&self.name))
            .copied()
            .or_else(|| {
                let (a, b) = (self.server_latency_ms?, other.server_latency_ms?);
                Some(((a + b) * 10.0).round() / 10.0)
            })
    }

    /// What the path between this cluster and `other` carries, bytes per second: the slower
    /// of the two uplinks (`default` for one that does not say), or less where either end
    /// reports the path slower.
    pub fn path_bandwidth_to(&self, other: &ClusterSnapshot, default: i64) -> i64 {
        let up = |c: &ClusterSnapshot| c.bandwidth.filter(|b| *b > 0).unwrap_or(default);
        [
            self.path_bandwidth.get(&other.name),
            other.path_bandwidth.get(&self.name),
        ]
        .into_iter()
        .flatten()
        .filter(|p| **p > 0)
        .fold(up(self).min(up(other)), |bw, p| bw.min(*p))
    }

    pub fn view(&self) -> ClusterView<'_> {
        ClusterView {
            name: &self.name,
            labels: &self.labels,
            provider: &self.provider,
            region: &self.region,
            zones: &self.zones,
            properties: &self.properties,
        }
    }
}

/// The numbers of one cluster, ready for arithmetic.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Facts {
    pub allocatable: Vector,
    /// Requested by pods (placed and pending).
    pub allocated: Vector,
    pub usage: Vector,
    /// Reserved by decisions the member has not reported yet (the assume cache).
    pub assumed: Vector,
    pub largest_free: Option<Vector>,
    /// Mean round-trip latency to the other clusters it reports, in milliseconds.
    pub latency: Option<f64>,
    pub traffic: f64,
    /// The monitoring system's forecast of its water levels, when there is one.
    pub outlook: Option<std::sync::Arc<Outlook>>,
    /// Its prices, from its properties ([`orrery_api::cost`]).
    pub prices: orrery_api::cost::Prices,
}

impl Facts {
    fn of(c: &ClusterSnapshot) -> Facts {
        let latency = (!c.latency_ms.is_empty())
            .then(|| c.latency_ms.values().sum::<f64>() / c.latency_ms.len() as f64);
        Facts {
            allocatable: vector_of(&c.allocatable),
            allocated: vector_of(&c.allocated),
            usage: vector_of(&c.usage),
            assumed: [0.0; 5],
            largest_free: (!c.largest_node_free.is_empty())
                .then(|| vector_of(&c.largest_node_free)),
            latency,
            traffic: c.traffic,
            outlook: None,
            prices: orrery_api::cost::Prices::of(
                c.properties.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            )
            .0,
        }
    }

    /// What is taken in dimension `d`: the larger of requests and usage, plus what decisions
    /// assigned that the member's figures do not include yet (those pods will take at least
    /// their requests on top of either).
    pub fn taken(&self, d: usize) -> f64 {
        self.allocated[d].max(self.usage[d]) + self.assumed[d]
    }

    /// How many more replicas of `demand` fit by requests alone (Karmada's view, which
    /// ignores actual usage; pods are not counted); `None` when the cluster reports no
    /// capacity or the replica asks for nothing.
    pub fn available_replicas(&self, demand: &Vector) -> Option<i64> {
        if !self.known() {
            return None;
        }
        let mut fit: Option<i64> = None;
        for d in 0..5 {
            if d == PODS || demand[d] <= 0.0 {
                continue;
            }
            let free = (self.allocatable[d] - self.allocated[d] - self.assumed[d]).max(0.0);
            let n = (free / demand[d] + 1e-9).floor() as i64;
            fit = Some(fit.map_or(n, |f| f.min(n)));
        }
        fit
    }

    /// Whether the cluster reports any capacity.
    pub fn known(&self) -> bool {
        self.allocatable.iter().any(|a| *a > 0.0)
    }

    /// The overall water level: the highest over the dimensions it reports.
    pub fn level(&self) -> f64 {
        (0..5)
            .filter(|d| self.allocatable[*d] > 0.0)
            .map(|d| self.taken(d) / self.allocatable[d])
            .fold(0.0, f64::max)
    }

    /// The steps of its forecast a look `ahead` from `now` covers, or why the present level
    /// stands in for the forecast.
    pub fn outlook_step(&self, now: i64, ahead: &Ahead) -> Result<(&Outlook, Window), Present> {
        if ahead.is_off() {
            return Err(Present::Off);
        }
        let o = self.outlook.as_deref().ok_or(Present::NoForecast)?;
        o.window(now, ahead.horizon_seconds).map(|w| (o, w))
    }

    /// What the forecast adds to dimension `d` over the look `ahead` (0 where the present
    /// level stands), in the dimension's units.
    pub fn rise(&self, d: usize, now: i64, ahead: &Ahead) -> f64 {
        match self.outlook_step(now, ahead) {
            Ok((o, w)) => o.rise(ahead.bound, w, d) * self.allocatable[d],
            Err(_) => 0.0,
        }
    }

    /// [`Facts::rise`] of every dimension, and the rise of the forecast's mean over all it
    /// reaches (what the shed-mark rule reads); `None` where the present level stands.
    pub fn rises(&self, now: i64, ahead: &Ahead) -> Option<(Vector, Vector)> {
        let (o, w) = self.outlook_step(now, ahead).ok()?;
        Some((
            std::array::from_fn(|d| o.rise(ahead.bound, w, d) * self.allocatable[d]),
            std::array::from_fn(|d| o.reach(w, d) * self.allocatable[d]),
        ))
    }

    /// The overall water level the look `ahead` judges the cluster by: the larger of the
    /// present level and the forecast, per dimension.
    pub fn level_ahead(&self, now: i64, ahead: &Ahead) -> f64 {
        let step = self.outlook_step(now, ahead).ok();
        (0..5)
            .filter(|d| self.allocatable[*d] > 0.0)
            .map(|d| {
                let rise = step.map_or(0.0, |(o, w)| o.rise(ahead.bound, w, d));
                self.taken(d) / self.allocatable[d] + rise
            })
            .fold(0.0, f64::max)
    }

    /// Where the forecast's mean has the cluster cross `mark` within `horizon` seconds of
    /// `now` and stay above it for `window` seconds (at least one of its steps, at most as
    /// many as the horizon holds: a forecast confirms no more than its horizon): the first
    /// dimension and step to do so, unless it is above the mark already (shedding by the
    /// present level takes it then). The mean, not an upper bound: moving replicas costs
    /// something, and a cluster is shed by what it is expected to do; new replicas are kept
    /// away by the placement's bound.
    pub fn crossing(&self, now: i64, horizon: i64, mark: f64, window: i64) -> Option<Crossing> {
        let ahead = Ahead {
            horizon_seconds: horizon,
            bound: Bound::Mean,
        };
        let (o, win) = self.outlook_step(now, &ahead).ok()?;
        let steps = win.last + 1 - win.first;
        let w = (((window.max(1) + o.step - 1) / o.step).max(1) as usize).min(steps);
        let mut first: Option<Crossing> = None;
        for d in (0..5).filter(|d| self.allocatable[*d] > 0.0) {
            let level = self.taken(d) / self.allocatable[d];
            if level > mark {
                return None;
            }
            // Each step's mean as a change from what the forecast expected of now.
            let base = o.expected_now(win, d);
            let at = |k: usize| level + widen(o.steps[0][k][d]) - base;
            // The first step within the horizon from which it stays above for the window.
            let Some(k) = (win.first..=win.last)
                .find(|k| k + w <= o.len() && (*k..k + w).all(|j| at(j) > mark))
            else {
                continue;
            };
            if first.as_ref().is_some_and(|c| c.step <= k) {
                continue;
            }
            let peak = (win.first..(win.last + w).min(o.len()))
                .map(at)
                .fold(level, f64::max);
            first = Some(Crossing {
                dimension: d,
                level,
                peak,
                step: k,
                at: o.time + o.step * (k as i64 + 1),
            });
        }
        first
    }
}

/// The steps of a forecast a look ahead covers: from the first still to come to the last the
/// horizon reaches (the forecast's last, if it reaches less far).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub first: usize,
    pub last: usize,
}

/// Why a decision judged a cluster by its present level rather than its forecast.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Present {
    /// The placement (or the server) looks no time ahead.
    Off,
    NoForecast,
    /// Its forecast holds less than one season of history.
    YoungHistory,
    /// Its forecast was made too long ago to say anything of now.
    Stale,
}

impl Present {
    pub fn reason(self) -> &'static str {
        match self {
            Present::Off => "prediction off",
            Present::NoForecast => "no forecast yet",
            Present::YoungHistory => "less than a season of history",
            Present::Stale => "its forecast is stale",
        }
    }
}

/// Where a cluster's forecast crosses a mark.
#[derive(Clone, Debug, PartialEq)]
pub struct Crossing {
    /// The dimension (an index of [`DIMENSIONS`]).
    pub dimension: usize,
    /// Its level in that dimension now, and the highest the forecast takes it.
    pub level: f64,
    pub peak: f64,
    /// The forecast's step that crosses, and its time (unix seconds).
    pub step: usize,
    pub at: i64,
}

/// A cluster's forecast as the scheduler reads it: per bound and dimension, how far above its
/// starting point the forecast rises over its first steps (running maxima, never below 0), so
/// the peak over any horizon is one lookup.
#[derive(Clone, Debug, PartialEq)]
pub struct Outlook {
    /// When the forecast was made (unix seconds) and the seconds between its steps.
    pub time: i64,
    pub step: i64,
    /// Seconds of history it was made from, and the season it was given.
    pub history_seconds: i64,
    pub season_seconds: i64,
    /// The model of each dimension's series (empty where there is none).
    pub models: [String; 5],
    /// `rise[bound][k][d]`: the highest (forecast at that bound - last value) over steps
    /// `0..=k` of dimension `d`, never below 0, a share of its capacity, in [`Fixed`] units:
    /// the peak over a horizon from the forecast's time is one lookup.
    rise: [Vec<[Fixed; 5]>; 3],
    /// `steps[bound][k][d]`: step `k` at that bound less the last value, for a look that
    /// starts after the forecast's first step (made a step or more before now).
    steps: [Vec<[Fixed; 5]>; 3],
    /// How far above its last value each dimension's series went at its peak over the last
    /// season (`-inf` where it is not known): the daily peak that comes back, however far
    /// ahead.
    peak: [f64; 5],
    /// What the shed-mark rule reads for every decision, per dimension: the higher of the
    /// mean's rise over all the forecast reaches (`rise[Mean]` at its last step) and the
    /// season's peak, never below 0.
    reach: [f64; 5],
}

/// A share of capacity in hundred-thousandths: a large fleet's forecasts in half the memory
/// of `f64`, exact for the four decimals forecasts are stored with (a float's own error would
/// take a replica off a room computed to the core).
type Fixed = i32;

fn fixed(x: f64) -> Fixed {
    (x * 1e5)
        .round()
        .clamp(f64::from(i32::MIN), f64::from(i32::MAX)) as Fixed
}

/// Within a few units in the last place of the value (far inside the 1e-9 of a replica
/// that rooms are rounded with).
fn widen(x: Fixed) -> f64 {
    f64::from(x) * 1e-5
}

impl Outlook {
    /// What the scheduler reads of a stored forecast; `None` when it forecasts no dimension.
    pub fn of(f: &orrery_api::history::series::ClusterForecast) -> Option<Outlook> {
        let len = f
            .series
            .iter()
            .filter(|(name, _)| DIMENSIONS.contains(&name.as_str()))
            .map(|(_, s)| s.points.len())
            .max()
            .filter(|n| *n > 0)?;
        let mut rise: [Vec<[Fixed; 5]>; 3] = std::array::from_fn(|_| vec![[0; 5]; len]);
        let mut steps: [Vec<[Fixed; 5]>; 3] = std::array::from_fn(|_| vec![[0; 5]; len]);
        let mut models: [String; 5] = Default::default();
        let mut peak = [f64::NEG_INFINITY; 5];
        for (name, s) in &f.series {
            let Some(d) = DIMENSIONS.iter().position(|x| x == name) else {
                continue;
            };
            models[d] = s.model.clone();
            // A forecast without its starting point (written before it was kept) rises from
            // its first step.
            let Some(start) = s.last.or(s.points.first().map(|p| p.mean)) else {
                continue;
            };
            if let Some(p) = s.season_peak.filter(|p| p.is_finite()) {
                peak[d] = p - start;
            }
            for b in 0..3 {
                let mut high = 0.0f64;
                let mut previous = 0.0f64;
                for k in 0..len {
                    // A missing or broken point repeats the one before.
                    let v = s
                        .points
                        .get(k)
                        .map(|p| [p.mean, p.upper80, p.upper95][b] - start)
                        .filter(|v| v.is_finite())
                        .unwrap_or(previous);
                    previous = v;
                    high = high.max(v);
                    steps[b][k][d] = fixed(v);
                    rise[b][k][d] = fixed(high);
                }
            }
        }
        let step = f.step_seconds.max(1) as i64;
        let reach = std::array::from_fn(|d| widen(rise[0][len - 1][d]).max(peak[d]));
        Some(Outlook {
            time: f.time.unix_seconds(),
            step,
            history_seconds: f.history as i64 * step,
            season_seconds: f.season_seconds as i64,
            models,
            rise,
            steps,
            peak,
            reach,
        })
    }

    /// Steps the forecast holds.
    pub fn len(&self) -> usize {
        self.rise[0].len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The steps a horizon from `now` covers, or why the forecast cannot be used. A forecast
    /// older than three of its steps (and a minute) is stale: the forecaster has stopped or
    /// fallen behind.
    pub fn window(&self, now: i64, horizon: i64) -> Result<Window, Present> {
        if self.history_seconds < self.season_seconds {
            return Err(Present::YoungHistory);
        }
        if now - self.time > (3 * self.step).max(60) {
            return Err(Present::Stale);
        }
        if self.is_empty() {
            return Err(Present::NoForecast);
        }
        let len = self.len() as i64;
        // Step k is of time + step·(k+1): the first after now, the last at or before now +
        // horizon (at least the first).
        let first = ((now - self.time).max(0) / self.step).min(len - 1);
        let reach = (now + horizon - self.time).max(1);
        let last = ((reach + self.step - 1) / self.step - 1).clamp(first, len - 1);
        Ok(Window {
            first: first as usize,
            last: last as usize,
        })
    }

    /// What the forecast expected of now in dimension `d`, as a change from its last value:
    /// 0 until its first step has passed, then the mean of the last step passed.
    fn expected_now(&self, w: Window, d: usize) -> f64 {
        match w.first {
            0 => 0.0,
            k => widen(self.steps[0][k - 1][d]),
        }
    }

    /// How far dimension `d` climbs at `bound` over window `w`, from what the forecast
    /// expected of now (never below 0), a share of capacity: the larger of the present level
    /// and the forecast, read as a change applied to the present level.
    pub fn rise(&self, bound: Bound, w: Window, d: usize) -> f64 {
        if w.first == 0 {
            return self.rise[bound.index()]
                .get(w.last)
                .map_or(0.0, |r| widen(r[d]));
        }
        let base = self.expected_now(w, d);
        self.steps[bound.index()][w.first..=w.last]
            .iter()
            .map(|r| widen(r[d]) - base)
            .fold(0.0, f64::max)
    }

    /// How far dimension `d` climbs from now by the mean over all the forecast reaches, or to
    /// the season's peak if that is higher: where no replica may take it past the shed mark.
    pub fn reach(&self, w: Window, d: usize) -> f64 {
        if w.first == 0 {
            return self.reach[d];
        }
        let ahead = self.rise(
            Bound::Mean,
            Window {
                first: w.first,
                last: self.len() - 1,
            },
            d,
        );
        ahead.max(self.peak[d] - self.expected_now(w, d))
    }
}

/// The member clusters, in name order, with their numbers.
#[derive(Clone, Debug, Default)]
pub struct Fleet {
    clusters: Vec<ClusterSnapshot>,
    facts: Vec<Facts>,
    index: HashMap<String, usize>,
    /// Changes whenever a cluster comes or goes or its placement facts change; unique across
    /// fleets, so a filter cache can tell.
    generation: u64,
    /// Clusters with a forecast (a fleet with none skips what prediction costs).
    outlooks: usize,
    /// How many clusters have prices.
    priced: usize,
}

static GENERATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn next_generation() -> u64 {
    GENERATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Whether two snapshots of a cluster agree on everything the placement-only filters read.
fn same_placement_facts(a: &ClusterSnapshot, b: &ClusterSnapshot) -> bool {
    a.name == b.name
        && a.ready == b.ready
        && a.labels == b.labels
        && a.provider == b.provider
        && a.region == b.region
        && a.zones == b.zones
        && a.taints == b.taints
        && a.api_kinds == b.api_kinds
        && a.capabilities == b.capabilities
        && a.properties == b.properties
}

impl Fleet {
    pub fn new(mut clusters: Vec<ClusterSnapshot>) -> Fleet {
        clusters.sort_by(|a, b| a.name.cmp(&b.name));
        clusters.dedup_by(|a, b| a.name == b.name);
        let facts: Vec<Facts> = clusters.iter().map(Facts::of).collect();
        let index = clusters
            .iter()
            .enumerate()
            .map(|(i, c)| (c.name.clone(), i))
            .collect();
        let priced = facts.iter().filter(|f| f.prices.is_priced()).count();
        Fleet {
            clusters,
            facts,
            index,
            generation: next_generation(),
            outlooks: 0,
            priced,
        }
    }

    /// See the field; a filter cache keyed by another generation is stale.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn len(&self) -> usize {
        self.clusters.len()
    }

    pub fn is_empty(&self) -> bool {
        self.clusters.is_empty()
    }

    pub fn clusters(&self) -> &[ClusterSnapshot] {
        &self.clusters
    }

    pub fn facts(&self) -> &[Facts] {
        &self.facts
    }

    pub fn position(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied()
    }

    pub fn get(&self, name: &str) -> Option<&ClusterSnapshot> {
        self.position(name).map(|i| &self.clusters[i])
    }

    /// Adds or replaces one cluster (its assumptions are kept).
    pub fn upsert(&mut self, c: ClusterSnapshot) {
        let mut f = Facts::of(&c);
        match self.position(&c.name) {
            Some(i) => {
                f.assumed = self.facts[i].assumed;
                f.outlook = self.facts[i].outlook.take();
                self.priced = self.priced + usize::from(f.prices.is_priced())
                    - usize::from(self.facts[i].prices.is_priced());
                self.facts[i] = f;
                if !same_placement_facts(&self.clusters[i], &c) {
                    self.generation = next_generation();
                }
                self.clusters[i] = c;
            }
            None => {
                self.priced += usize::from(f.prices.is_priced());
                let at = self.clusters.partition_point(|x| x.name < c.name);
                self.shift_index(at, true);
                self.index.insert(c.name.clone(), at);
                self.clusters.insert(at, c);
                self.facts.insert(at, f);
                self.generation = next_generation();
            }
        }
    }

    pub fn remove(&mut self, name: &str) {
        if let Some(i) = self.position(name) {
            if self.facts[i].outlook.is_some() {
                self.outlooks -= 1;
            }
            if self.facts[i].prices.is_priced() {
                self.priced -= 1;
            }
            self.index.remove(name);
            self.clusters.remove(i);
            self.facts.remove(i);
            self.shift_index(i, false);
            self.generation = next_generation();
        }
    }

    /// Moves the positions from `at` on one place up (a cluster inserted at `at`) or down (the
    /// one at `at` removed). Not a new index: a fleet of 10,000 registering rebuilt it, every
    /// name copied and hashed, for every member that joined (an eighth of the leader's CPU).
    fn shift_index(&mut self, at: usize, up: bool) {
        for i in self.index.values_mut().filter(|i| **i >= at) {
            if up {
                *i += 1;
            } else {
                *i -= 1;
            }
        }
    }

    /// Sets a cluster's forecast (`None`: it has none).
    pub fn set_outlook(&mut self, name: &str, outlook: Option<std::sync::Arc<Outlook>>) {
        if let Some(i) = self.position(name) {
            let had = self.facts[i].outlook.is_some();
            self.outlooks = self.outlooks + usize::from(outlook.is_some()) - usize::from(had);
            self.facts[i].outlook = outlook;
        }
    }

    /// Whether any cluster has prices.
    pub fn has_prices(&self) -> bool {
        self.priced > 0
    }

    /// Whether any cluster has a forecast.
    pub fn has_outlooks(&self) -> bool {
        self.outlooks > 0
    }

    /// Sets what the assume cache holds against a cluster.
    pub fn set_assumed(&mut self, name: &str, assumed: Vector) {
        if let Some(i) = self.position(name) {
            self.facts[i].assumed = assumed;
        }
    }

    /// Counts `replicas` more of `demand` against a cluster (a decision just made).
    pub fn add_assumed(&mut self, name: &str, demand: &Vector, replicas: i64) {
        if let Some(i) = self.position(name) {
            for (d, x) in demand.iter().enumerate() {
                self.facts[i].assumed[d] =
                    (self.facts[i].assumed[d] + x * replicas as f64).max(0.0);
            }
        }
    }

    /// The fleet's water level over the dimensions `demand` needs: taken over capacity summed
    /// over the clusters reporting capacity, highest dimension.
    pub fn level(&self, demand: &Vector) -> f64 {
        let mut best: f64 = 0.0;
        for d in 0..5 {
            if demand[d] <= 0.0 {
                continue;
            }
            let (mut taken, mut cap) = (0.0, 0.0);
            for f in &self.facts {
                if f.allocatable[d] > 0.0 {
                    taken += f.taken(d);
                    cap += f.allocatable[d];
                }
            }
            if cap > 0.0 {
                best = best.max(taken / cap);
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use orrery_api::{Format, Quantity};

    fn list(cpu: i64, mem_gi: i64) -> ResourceList {
        let mut l = ResourceList::new();
        l.insert("cpu".into(), Quantity::from_int(cpu, Format::DecimalSI));
        l.insert(
            "memory".into(),
            Quantity::from_int(mem_gi << 30, Format::BinarySI),
        );
        l
    }

    #[test]
    fn positions_follow_clusters_coming_and_going_in_any_order() {
        let named = |name: &str| ClusterSnapshot {
            name: name.into(),
            ..Default::default()
        };
        let mut fleet = Fleet::new(vec![named("m"), named("c")]);
        // (joins, leaves): each step, every member is found where it is, and no other.
        let steps: [(&[&str], &[&str]); 6] = [
            (&["a", "z", "k"], &[]),
            (&["b"], &["a"]),
            (&[], &["z", "c"]),
            (&["a", "c", "y"], &["m"]),
            // An update of one already there moves nothing.
            (&["k"], &["nobody"]),
            (&["d"], &["a", "y", "b", "c", "d", "k"]),
        ];
        for (step, (joins, leaves)) in steps.iter().enumerate() {
            for n in *joins {
                fleet.upsert(named(n));
            }
            for n in *leaves {
                fleet.remove(n);
            }
            let names: Vec<&str> = fleet.clusters().iter().map(|c| c.name.as_str()).collect();
            let mut sorted = names.clone();
            sorted.sort();
            assert_eq!(names, sorted, "step {step}: kept in name order");
            for (i, n) in names.iter().enumerate() {
                assert_eq!(fleet.position(n), Some(i), "step {step}: {n}");
            }
            for gone in *leaves {
                assert_eq!(fleet.position(gone), None, "step {step}: {gone}");
            }
            assert_eq!(fleet.facts().len(), names.len());
        }
        assert!(fleet.is_empty());
    }

    #[test]
    fn latency_is_measured_by_either_end_else_estimated_through_the_control_plane() {
        let named = |name: &str, server: Option<f64>, measured: &[(&str, f64)]| ClusterSnapshot {
            name: name.into(),
            server_latency_ms: server,
            latency_ms: measured.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            ..Default::default()
        };
        let a = named("a", Some(12.04), &[("c", 3.0)]);
        let b = named("b", Some(30.0), &[]);
        let c = named("c", Some(50.0), &[]);
        let d = named("d", None, &[]);
        let table = [
            (&a, &a, Some(0.0)),
            (&a, &c, Some(3.0)),
            // Measured by the other end only.
            (&c, &a, Some(3.0)),
            // Neither measures: both round trips to the control plane, rounded to 0.1 ms.
            (&a, &b, Some(42.0)),
            (&b, &c, Some(80.0)),
            // One end never reported its round trip: unknown.
            (&b, &d, None),
        ];
        for (x, y, want) in table {
            assert_eq!(x.latency_to(y), want, "{} to {}", x.name, y.name);
        }
    }

    #[test]
    fn facts_take_the_larger_of_requests_and_usage() {
        let c = ClusterSnapshot {
            name: "a".into(),
            allocatable: list(10, 40),
            allocated: list(2, 30),
            usage: list(6, 10),
            ..Default::default()
        };
        let mut f = Facts::of(&c);
        assert_eq!(f.taken(0), 6.0);
        assert_eq!(f.taken(1), (30i64 << 30) as f64);
        assert!((f.level() - 0.75).abs() < 1e-9);
        // Assumed pods come on top of the larger of the two.
        f.assumed[0] = 5.0;
        assert_eq!(f.taken(0), 11.0);
        assert_eq!(demand_of(&list(1, 1))[PODS], 1.0);
    }

    #[test]
    fn fleet_keeps_name_order_and_assumptions() {
        let mk = |n: &str| ClusterSnapshot {
            name: n.into(),
            allocatable: list(10, 10),
            ..Default::default()
        };
        let mut f = Fleet::new(vec![mk("c"), mk("a")]);
        f.add_assumed("c", &demand_of(&list(2, 0)), 2);
        f.upsert(mk("b"));
        f.upsert(mk("c"));
        let names: Vec<_> = f.clusters().iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(f.facts()[2].assumed[0], 4.0);
        // 4 of 30 cores taken over the fleet.
        assert!((f.level(&demand_of(&list(1, 0))) - 4.0 / 30.0).abs() < 1e-9);
        f.remove("a");
        assert_eq!(f.position("c"), Some(1));
    }
}
