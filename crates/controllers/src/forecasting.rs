//! The monitoring system's forecasts (the draft's Predictive Algorithms, 3.1 and 5.1): every
//! cluster's water level per dimension and its traffic, forecast from the monitoring history
//! up to `horizon` ahead with 80 % and 95 % intervals, by the model each series' own backtest
//! chooses (`orrery-forecast`). Stored beside the history (one record per cluster under
//! [`series::FORECAST_PREFIX`]), so they survive restarts; `GET /api/v1/monitor/forecast`
//! reads them.
//!
//! The series are the 5-minute averages when the season holds at least 24 of them (a day:
//! 288), else the raw samples (a test's short season). The history is read from the store
//! once at start, then fed by the monitoring loop sample by sample. A series' model is chosen
//! again every `choose_every` (at most a 24th of a season; twice that once the history holds
//! the weekly season's backtest, which costs a choice twice as much), less often in a large fleet (up to
//! a quarter of a season: choosing is most of a round's CPU); in between each round only fits
//! the chosen one.
//!
//! A water level series is the level less Orrery's own part of it (the requests of the
//! replicas it placed there, `ClusterSample::placed`): the load Orrery does not move. Moving
//! replicas off a cluster ahead of its peak would otherwise look like a change of the
//! cluster's daily pattern, and seasonal models would lose a season to it. The forecast is
//! shown with Orrery's part at its time added back: the level, should placements stay.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use orrery_api::history::series::{
    self, ClusterForecast, ClusterSample, FleetSample, ForecastPoint, ModelChoice, NearChoice,
    SeriesForecast,
};
use orrery_api::prediction::{ForecastCheck, ForecastChecks, ForecastSummary};
use orrery_api::{Object, Time};
use orrery_forecast::{Choice, Near, Settings};
use orrery_store::{ListOptions, Store, StoreError};
use tokio::sync::{mpsc, watch};

use crate::runtime::controller::{Action, Controller, Keys, Origin, Reconciler};
use crate::runtime::metrics::Handle;
use crate::runtime::reflector::Event;

/// What is forecast, and how far.
#[derive(Clone, Debug)]
pub struct ForecastConfig {
    /// The season of the fleet's load (`--forecast-season`; a day).
    pub season: Duration,
    /// How far ahead.
    pub horizon: Duration,
    /// How often each series' model is chosen again (at most every 24th of a season: an hour
    /// of a day), in a fleet of up to `choose_series` series.
    pub choose_every: Duration,
    /// Series chosen again every `choose_every`: a fleet of more has its models chosen as much
    /// less often (at most a quarter of a season apart), so that choosing costs the leader no
    /// more than it does for this many, up to six times as many at a day's season.
    pub choose_series: usize,
    /// Seasons of history a series keeps (older points are dropped), while the fleet's
    /// series fit in `history_bytes`: 17 at a day's season, two weeks for the weekly season
    /// and three days for the backtest's folds before them.
    pub seasons_kept: usize,
    /// Seasons in the long season the MSTL models also decompose by once two of it precede
    /// the backtest (7: a week of a day's season; 0: none).
    pub long_season: usize,
    /// Bytes the points of all series may take (each series' room may be up to a 32nd over
    /// its points, and its key and header are not counted): a large fleet keeps fewer seasons
    /// (never fewer than [`MIN_SEASONS`]). Fourteen days of 10,000 members' five series are
    /// 800 MB.
    pub history_bytes: usize,
    /// How long before a sample the forecast set beside it in the monitoring history was
    /// made (the scheduler's default prediction horizon; at most `horizon`).
    pub check_lead: Duration,
}

impl Default for ForecastConfig {
    fn default() -> Self {
        ForecastConfig {
            season: Duration::from_secs(24 * 3600),
            horizon: Duration::from_secs(6 * 3600),
            choose_every: Duration::from_secs(3600),
            choose_series: DEFAULT_CHOOSE_SERIES,
            seasons_kept: 17,
            long_season: 7,
            history_bytes: DEFAULT_HISTORY_BYTES,
            check_lead: Duration::from_secs(orrery_api::prediction::DEFAULT_HORIZON_SECONDS as u64),
        }
    }
}

/// The forecaster's history of a fleet: 17 seasons of up to 2,000 members' five series, 3.5
/// of 10,000 members'.
pub const DEFAULT_HISTORY_BYTES: usize = 192 << 20;

/// Series whose models are chosen again every hour (about 1,600 members' five): choosing one
/// is 40–65 ms of a core, so 50,000 series chosen hourly were over half a core (every six
/// hours now, the most apart a day's season allows).
pub const DEFAULT_CHOOSE_SERIES: usize = 8_192;

/// The fewest seasons a series keeps, whatever the budget: the seasonal models are chosen
/// on three backtests of six hours over two seasons of fit (their intervals are then
/// calibrated on as many of the eight backtests as reach back that far: three at three
/// seasons, five at 3.5).
pub const MIN_SEASONS: usize = 3;

/// The value of series `name` in a sample.
fn value_of(c: &ClusterSample, name: &str) -> Option<f64> {
    match name {
        "traffic" => Some(c.traffic),
        // The load Orrery does not move: the level less its own part.
        dim => c.levels.get(dim).map(|l| (l - placed_of(c, dim)).max(0.0)),
    }
}

/// Orrery's own part of series `name` in a sample (none of traffic).
fn placed_of(c: &ClusterSample, name: &str) -> f64 {
    c.placed.get(name).copied().unwrap_or(0.0)
}

/// What the monitoring loop hands the forecaster.
#[derive(Debug)]
pub enum Feed {
    /// A sample of the fleet (`true`: a 5-minute average).
    Sample(FleetSample, bool),
    /// A cluster's history reported afterwards, as 5-minute averages by the unix second of
    /// each one's end, oldest first.
    Backfill(String, Vec<(i64, ClusterSample)>),
}

/// The forecaster's state: every series' recent history and chosen model.
#[derive(Debug)]
pub struct Forecaster {
    cfg: ForecastConfig,
    /// Seconds between points.
    step: u64,
    /// Points per season.
    season: usize,
    horizon: usize,
    /// Seconds between choices of a series' model, in a fleet of up to `choose_series`.
    choose_every: i64,
    /// Kept as `f32`: seventeen days of five series of a thousand clusters are 93 MiB so, 187
    /// as `f64`, and the samples have three or four significant digits.
    history: BTreeMap<(String, String), VecDeque<f32>>,
    /// Orrery's part of each series in the last sample: forecasts are of the rest, and shown
    /// with it added back (the level, should Orrery's placements stay as they are).
    placed: BTreeMap<(String, String), f64>,
    /// Each series' model, when it was chosen and on how many points.
    choices: BTreeMap<(String, String), (Choice, i64, usize)>,
    /// The time of the last point taken.
    last: Option<Time>,
    /// Whether the points are the 5-minute averages (else the raw samples).
    averages: bool,
    /// The unix second of each cluster's last point (its series' points are a step apart
    /// before it).
    ends: BTreeMap<String, i64>,
}

impl Forecaster {
    /// A forecaster over samples taken every `raw_interval` (and 5-minute averages).
    pub fn new(cfg: ForecastConfig, raw_interval: Duration, average_every: Duration) -> Self {
        let season_s = cfg.season.as_secs().max(1);
        let step = if season_s / average_every.as_secs().max(1) >= 24 {
            average_every.as_secs().max(1)
        } else {
            raw_interval.as_secs().max(1)
        };
        let season = (season_s / step).max(2) as usize;
        Forecaster {
            averages: step != raw_interval.as_secs().max(1),
            step,
            season,
            horizon: (cfg.horizon.as_secs() / step).max(1) as usize,
            choose_every: (cfg.choose_every.as_secs() as i64).min(season_s as i64 / 24),
            cfg,
            history: BTreeMap::new(),
            placed: BTreeMap::new(),
            choices: BTreeMap::new(),
            last: None,
            ends: BTreeMap::new(),
        }
    }

    /// Goes on with the models stored forecasts were made with (the choices of the server
    /// that ran before this one), as long as they are not due to be chosen again.
    pub fn resume(&mut self, stored: &[ClusterForecast]) {
        for f in stored {
            for (name, s) in &f.series {
                let (Some(c), Some(model)) = (&s.choice, orrery_forecast::Model::named(&s.model))
                else {
                    continue;
                };
                // A near band whose model this build does not know is dropped: the series
                // then forecasts its whole horizon with `model` until it is chosen again.
                let near = c.near.as_ref().and_then(|n| {
                    let model = orrery_forecast::Model::named(&n.model)?;
                    Some(Near {
                        model,
                        steps: n.steps,
                        backtest_mase: n.backtest_mase,
                        interval_scale: n.interval_scale,
                    })
                });
                let choice = Choice {
                    backtest_mase: s.backtest_mase,
                    interval_scale: c.interval_scale,
                    near,
                    long_season: c.long_season,
                    ..Choice::of(model, c.season)
                };
                self.choices.insert(
                    (f.cluster.clone(), name.clone()),
                    (choice, c.chosen_at.unix_seconds(), c.history),
                );
            }
        }
    }

    /// How many points each series keeps now: its seasons, or what the budget leaves each of
    /// the fleet's series.
    fn keep(&self) -> usize {
        let most = self.season * self.cfg.seasons_kept.max(MIN_SEASONS);
        let fits = self.cfg.history_bytes / (self.history.len().max(1) * size_of::<f32>());
        fits.clamp(self.season * MIN_SEASONS, most)
    }

    /// Seconds between two choices of a series' model now: `choose_every`, times as many
    /// `choose_series` as the fleet has series, up to a quarter of a season.
    pub fn choose_every_seconds(&self) -> i64 {
        self.choose_after(0)
    }

    /// Seconds until a series whose model was chosen on `n` samples is chosen again:
    /// [`choose_every_seconds`](Self::choose_every_seconds), twice that where `n` held the
    /// weekly season before every fold of the backtest, up to a quarter of a season. Such a
    /// choice backtests the MSTL models twice (with and without the week, whichever wins),
    /// which doubled its CPU and took the steady state to 2.5x the forecaster's before the
    /// week; choosing those every two hours keeps it within 2x, and on held-out series of 20
    /// and 28 days (all of them that long) it forecast as well (MASE at 1 h +0.3 %, at 6 h the
    /// same, docs/benchmarks.md).
    pub fn choose_after(&self, n: usize) -> i64 {
        let shares = self
            .history
            .len()
            .div_ceil(self.cfg.choose_series.max(1))
            .max(1);
        let week = orrery_forecast::backtests_long_season(
            n,
            self.season,
            self.season * self.cfg.long_season,
            self.horizon.min(self.season),
            orrery_forecast::FOLDS,
        );
        let long = if week { 2 } else { 1 };
        // `choose_every` is at most a 24th of the season, so never over this.
        let quarter = self.cfg.season.as_secs().max(1) as i64 / 4;
        self.choose_every
            .saturating_mul(shares as i64)
            .saturating_mul(long)
            .min(quarter)
    }

    /// The most points any series holds.
    pub fn points_held(&self) -> usize {
        self.history.values().map(VecDeque::len).max().unwrap_or(0)
    }

    /// Whether its points are the 5-minute averages (else the raw samples).
    pub fn uses_averages(&self) -> bool {
        self.averages
    }

    /// Takes one sample of the fleet; a cluster missing from it keeps its last value, a
    /// cluster new to it starts its series.
    pub fn push(&mut self, s: &FleetSample) {
        if self.last.is_some_and(|l| s.time <= l) {
            return;
        }
        self.last = Some(s.time);
        // From the series as they were: clusters joining or leaving with this sample count
        // from the next one.
        let keep = self.keep();
        for (cluster, c) in &s.clusters {
            self.ends.insert(cluster.clone(), s.time.unix_seconds());
            for name in series::FORECAST_SERIES {
                let Some(v) = value_of(c, name).filter(|v| v.is_finite()) else {
                    continue;
                };
                self.placed
                    .insert((cluster.clone(), (*name).to_string()), placed_of(c, name));
                let h = self
                    .history
                    .entry((cluster.clone(), (*name).to_string()))
                    .or_default();
                if h.len() >= keep {
                    h.drain(..=h.len() - keep);
                    // A fleet that grew leaves each series less room: give back the rest
                    // (a little slack, so that a member coming and going does not have every
                    // series reallocated).
                    if h.capacity() > keep + keep / 32 {
                        h.shrink_to(keep);
                    }
                } else if h.len() == h.capacity() {
                    // Grows by doubling, but never past what it keeps (a deque's own
                    // doubling would leave up to half of each series' room unused).
                    h.reserve_exact(h.len().max(16).min(keep - h.len()));
                }
                h.push_back(v as f32);
            }
        }
        // A record that holds only history reported afterwards (before the monitoring loop
        // measured anything then) says nothing of which clusters are in the fleet.
        if !s.clusters.is_empty() && s.clusters.values().all(|c| c.backfilled) {
            return;
        }
        // Clusters gone from the fleet go from the forecasts.
        self.ends.retain(|c, _| s.clusters.contains_key(c));
        self.history.retain(|(c, _), _| s.clusters.contains_key(c));
        self.placed.retain(|(c, _), _| s.clusters.contains_key(c));
        self.choices.retain(|(c, _), _| s.clusters.contains_key(c));
    }

    /// Takes a cluster's history reported afterwards (5-minute averages by the second each
    /// ends, oldest first) in before what its series hold: the points before a series' first
    /// one are set on its grid, a step apart (a step without one takes the one before it);
    /// those within what the series holds are left out, as the monitoring loop measured
    /// them. The cluster's models are chosen again on the longer history. Nothing when the
    /// series are of raw samples (backfill reaches the averages only).
    pub fn backfill(&mut self, cluster: &str, points: &[(i64, ClusterSample)]) {
        let step = self.step as i64;
        let (Some(first_t), Some(last_t)) =
            (points.first().map(|p| p.0), points.last().map(|p| p.0))
        else {
            return;
        };
        if !self.averages {
            return;
        }
        let keep = self.keep();
        let end = self.ends.get(cluster).copied();
        for name in series::FORECAST_SERIES {
            let key = (cluster.to_string(), (*name).to_string());
            let held = self.history.get(&key).map_or(0, VecDeque::len) as i64;
            // The grid's last step: a step before the series' first point, or the last point
            // reported when the series holds none.
            let until = match end {
                Some(e) if held > 0 => e - held * step,
                _ => last_t,
            };
            if until < first_t - step / 2 {
                continue;
            }
            let slots = ((until - first_t + step / 2) / step) as usize + 1;
            let start = until - (slots as i64 - 1) * step;
            let mut grid: Vec<f32> = Vec::with_capacity(slots);
            let mut it = points
                .iter()
                .filter_map(|(t, c)| Some((*t, value_of(c, name).filter(|v| v.is_finite())?)))
                .peekable();
            let mut prev: Option<f64> = None;
            for k in 0..slots as i64 {
                let at = start + k * step;
                // The newest point up to half a step after the slot, else the last one.
                while let Some((t, v)) = it.peek().copied() {
                    if t > at + step / 2 {
                        break;
                    }
                    prev = Some(v);
                    it.next();
                }
                if let Some(v) = prev {
                    grid.push(v as f32);
                }
            }
            if grid.is_empty() {
                continue;
            }
            let h = self.history.entry(key.clone()).or_default();
            let mut joined: VecDeque<f32> = grid.into();
            joined.extend(h.drain(..));
            if joined.len() > keep {
                joined.drain(..joined.len() - keep);
            }
            *h = joined;
            self.choices.remove(&key);
        }
        if end.is_none() {
            self.ends.insert(cluster.to_string(), last_t);
        }
        // A fleet with history reported but no average measured yet is forecast from it at
        // once (a new server reading weeks of history forecasts from its first minute).
        if self.last.is_none() {
            self.last = Time::from_unix_seconds(last_t);
        }
    }

    /// Every cluster's forecasts from the history now. CPU-bound: run it off the runtime.
    pub fn forecast_all(&mut self) -> Vec<ClusterForecast> {
        self.forecast_from(None, usize::MAX).0
    }

    /// The forecasts of at most `clusters` clusters, those after `after` in name order (from
    /// the first when `None`), and the last cluster looked at (`None` once every one has
    /// been). A round over a large fleet goes a share at a time: the forecasts of 10,000
    /// members at once were about 150 MB.
    pub fn forecast_from(
        &mut self,
        after: Option<&str>,
        clusters: usize,
    ) -> (Vec<ClusterForecast>, Option<String>) {
        let Some(time) = self.last else {
            return (Vec::new(), None);
        };
        let now = time.unix_seconds();
        let settings = Settings {
            season: Some(self.season),
            long_season: (self.cfg.long_season >= 2).then(|| self.season * self.cfg.long_season),
            ..Default::default()
        };
        let mut out: BTreeMap<String, ClusterForecast> = BTreeMap::new();
        // The history is ordered by cluster, so a cluster's series come together.
        let (clusters, mut looked) = (clusters.max(1), 0);
        let mut last: Option<&String> = None;
        for ((cluster, name), h) in &self.history {
            if after.is_some_and(|a| cluster.as_str() <= a) {
                continue;
            }
            if last != Some(cluster) {
                if looked == clusters {
                    // More are left: the next share starts after the last one looked at.
                    return (out.into_values().collect(), last.cloned());
                }
                looked += 1;
                last = Some(cluster);
            }
            let y: Vec<f64> = h.iter().map(|v| f64::from(*v)).collect();
            if y.len() < 2 {
                continue;
            }
            let key = (cluster.clone(), name.clone());
            // Chosen again once its time is up, or once the history has doubled (a young
            // series outgrows the naive model it started with).
            let fresh = self
                .choices
                .get(&key)
                .filter(|(_, at, n)| now - at < self.choose_after(*n) && y.len() < 2 * n)
                .map(|(c, _, _)| c.clone());
            let choice = match fresh {
                Some(c) => c,
                None => match orrery_forecast::choose(&y, self.horizon.min(self.season), &settings)
                {
                    Ok(c) => {
                        self.choices.insert(key.clone(), (c.clone(), now, y.len()));
                        c
                    }
                    Err(e) => {
                        tracing::debug!(cluster, series = name, error = %e, "no forecast");
                        continue;
                    }
                },
            };
            let f = match orrery_forecast::forecast_with(&choice, &y, self.horizon, &settings) {
                Ok(f) => f,
                Err(e) => {
                    tracing::debug!(cluster, series = name, error = %e, "no forecast");
                    continue;
                }
            };
            let round = |x: f64| (x * 10_000.0).round() / 10_000.0;
            let placed = self.placed.get(&key).copied().unwrap_or(0.0);
            let add = |x: f64| round(x + placed);
            out.entry(cluster.clone())
                .or_insert_with(|| ClusterForecast {
                    cluster: cluster.clone(),
                    time,
                    step_seconds: self.step,
                    season_seconds: self.cfg.season.as_secs(),
                    history: y.len(),
                    series: BTreeMap::new(),
                })
                .series
                .insert(
                    name.clone(),
                    SeriesForecast {
                        model: f.model.name().to_string(),
                        backtest_mase: f.backtest_mase.map(|m| (m * 1000.0).round() / 1000.0),
                        points: f
                            .points
                            .iter()
                            .map(|b| ForecastPoint {
                                mean: add(b.mean),
                                lower80: add(b.lower80),
                                upper80: add(b.upper80),
                                lower95: add(b.lower95),
                                upper95: add(b.upper95),
                            })
                            .collect(),
                        last: y.last().copied().map(add),
                        season_peak: y
                            .iter()
                            .rev()
                            .take(self.season)
                            .copied()
                            .reduce(f64::max)
                            .map(add),
                        choice: self.choices.get(&key).map(|(c, at, n)| ModelChoice {
                            season: c.season,
                            long_season: c.long_season,
                            interval_scale: c.interval_scale,
                            chosen_at: Time::from_unix_seconds(*at).unwrap_or(time),
                            history: *n,
                            near: c.near.as_ref().map(|n| NearChoice {
                                model: n.model.name().to_string(),
                                steps: n.steps,
                                backtest_mase: n.backtest_mase,
                                interval_scale: n.interval_scale,
                            }),
                        }),
                    },
                );
        }
        (out.into_values().collect(), None)
    }
}

/// How many clusters a round forecasts and writes at a time (their forecasts are about 15 KB
/// each in memory).
const ROUND_SHARE: usize = 256;

/// What the forecasts said of times still to come, kept for the monitoring loop to set beside
/// what it measures when those times come (forecast against actual in the monitoring
/// history). Shared between the forecaster, which puts, and the monitoring loop, which takes.
#[derive(Debug, Default)]
pub struct Checks {
    inner: parking_lot::Mutex<ChecksInner>,
}

#[derive(Debug, Default)]
struct ChecksInner {
    /// Whether the forecasts are of the 5-minute averages (else of the raw samples).
    averages: bool,
    step: i64,
    /// By cluster, then the time a forecast is of.
    due: BTreeMap<String, BTreeMap<i64, ForecastChecks>>,
}

impl Checks {
    fn lock(&self) -> parking_lot::MutexGuard<'_, ChecksInner> {
        self.inner.lock()
    }

    fn set_series(&self, averages: bool, step: i64) {
        let mut c = self.lock();
        c.averages = averages;
        c.step = step.max(1);
    }

    /// Whether the forecaster takes samples of this series (averages or raw ones); until it
    /// has said which, both.
    pub fn wants(&self, average: bool) -> bool {
        let c = self.lock();
        c.step == 0 || c.averages == average
    }

    /// Keeps what a round's forecasts say of the time one lead ahead.
    fn put(&self, forecasts: &[ClusterForecast], lead_steps: usize) {
        let mut c = self.lock();
        let k = lead_steps.max(1);
        for f in forecasts {
            let mut checks = ForecastChecks::new();
            for (name, s) in &f.series {
                if let Some(p) = s.points.get(k - 1) {
                    checks.insert(
                        name.clone(),
                        ForecastCheck {
                            mean: p.mean,
                            lower80: p.lower80,
                            upper80: p.upper80,
                            made_at: f.time,
                        },
                    );
                }
            }
            let at = f.time.unix_seconds() + f.step_seconds.max(1) as i64 * k as i64;
            // The first forecast of a time stands: later ones are made closer to it.
            c.due
                .entry(f.cluster.clone())
                .or_default()
                .entry(at)
                .or_insert(checks);
        }
    }

    /// Forgets the clusters a round made no forecast of (they left).
    fn keep_only(&self, clusters: &BTreeSet<String>) {
        self.lock().due.retain(|name, _| clusters.contains(name));
    }

    /// Sets the forecasts made of each cluster's sample time beside it (within half a step),
    /// when `s` is of the series that is forecast; forgets what is older.
    pub fn annotate(&self, s: &mut FleetSample, average: bool) {
        let mut c = self.lock();
        if c.step == 0 || c.averages != average {
            return;
        }
        let (t, half) = (s.time.unix_seconds(), c.step / 2);
        for (name, sample) in s.clusters.iter_mut() {
            let Some(due) = c.due.get_mut(name) else {
                continue;
            };
            if let Some((&at, _)) = due.range(t - half..=t + half).next()
                && let Some(checks) = due.remove(&at)
            {
                sample.forecast = checks;
            }
            due.retain(|at, _| *at > t - half);
        }
    }
}

/// What `kubectl describe cluster` shows: the highest mean water level the forecast gives
/// over the next hour (or as far as it reaches), of any dimension.
pub fn summary(f: &ClusterForecast) -> Option<ForecastSummary> {
    let step = f.step_seconds.max(1) as i64;
    let steps = (3600 / step).max(1) as usize;
    let mut best: Option<(f64, &str, usize, &SeriesForecast)> = None;
    for (name, s) in &f.series {
        if !["cpu", "memory", "gpu", "pods"].contains(&name.as_str()) {
            continue;
        }
        for (k, p) in s.points.iter().take(steps).enumerate() {
            if best.is_none_or(|b| p.mean > b.0) {
                best = Some((p.mean, name, k, s));
            }
        }
    }
    let (peak, dim, k, s) = best?;
    let reach = s.points.len().min(steps) as i64 * step;
    Some(ForecastSummary {
        time: f.time,
        horizon_seconds: reach,
        peak,
        peak_dimension: dim.to_string(),
        peak_time: f.time.add_seconds(step * (k as i64 + 1)),
        peak_upper_bound: s.points[k].upper80,
        model: s.model.clone(),
        history_seconds: f.history as i64 * step,
        season_seconds: f.season_seconds as i64,
    })
}

/// Whether a Cluster's summary should be written over: its figures moved by a hundredth, its
/// peak's dimension, model or the history's coming of age changed, or it is older than
/// `max_age` seconds.
fn summary_differs(old: Option<&ForecastSummary>, new: &ForecastSummary, max_age: i64) -> bool {
    let Some(old) = old else { return true };
    let moved = |a: f64, b: f64| (a - b).abs() >= 0.01;
    moved(old.peak, new.peak)
        || moved(old.peak_upper_bound, new.peak_upper_bound)
        || old.peak_dimension != new.peak_dimension
        || old.model != new.model
        || (old.history_seconds >= old.season_seconds)
            != (new.history_seconds >= new.season_seconds)
        || new.time.seconds_since(old.time) >= max_age
}

/// Writes a cluster's summary into its status, unless what is there says the same.
async fn write_summary(store: &dyn Store, f: &ClusterForecast) -> Result<(), StoreError> {
    let Some(next) = summary(f) else {
        return Ok(());
    };
    let max_age = (f.step_seconds as i64 * 3).max(300);
    let key = orrery_api::keys::well_known::cluster(&f.cluster);
    orrery_store::update_with(store, &key, |mut cur| {
        let old = cur
            .status
            .as_ref()
            .and_then(|s| s.get("forecast"))
            .and_then(|v| serde_json::from_value::<ForecastSummary>(v.clone()).ok());
        if !summary_differs(old.as_ref(), &next, max_age) {
            return Ok(None);
        }
        let status = cur.status.get_or_insert_with(|| serde_json::json!({}));
        if !status.is_object() {
            *status = serde_json::json!({});
        }
        status["forecast"] = serde_json::to_value(&next).unwrap_or_default();
        Ok(Some(cur))
    })
    .await
    .map(|_| ())
}

/// Records a start-up reads at a time: a day of 5-minute averages of 10,000 members is over
/// 300 MB of JSON, and read at once it was several GB parsed.
const LOAD_PAGE: usize = 8;

/// Times a start-up reads the history before it forecasts from new samples only.
const LOAD_ATTEMPTS: usize = 3;

/// Each record's `spec`, parsed from its stored JSON as the type it holds.
#[derive(serde::Deserialize)]
struct Record<T> {
    spec: Option<T>,
}

/// Every record under `prefix`, a page at a time, in key order, each parsed as a `T` (those
/// that do not parse are skipped) and handed to `take`; how many were.
async fn each_record<T: serde::de::DeserializeOwned>(
    store: &dyn Store,
    prefix: &str,
    page: usize,
    mut take: impl FnMut(T),
) -> Result<usize, StoreError> {
    let (mut n, mut token) = (0, None);
    loop {
        let opts = ListOptions {
            limit: Some(page),
            continue_token: token.take(),
            ..Default::default()
        };
        let list = store.list_raw(prefix, &opts).await?;
        for raw in &list.items {
            if let Ok(Record { spec: Some(t) }) = serde_json::from_slice::<Record<T>>(&raw.json) {
                take(t);
                n += 1;
            }
        }
        match list.continue_token {
            Some(t) => token = Some(t),
            None => return Ok(n),
        }
    }
}

/// Takes the stored history the forecaster works on into it, oldest first (a record's key
/// is its time, zero-padded, so key order is time order); how many samples.
async fn load(store: &dyn Store, prefix: &str, f: &mut Forecaster) -> Result<usize, StoreError> {
    each_record(store, prefix, LOAD_PAGE, |s: FleetSample| f.push(&s)).await
}

/// Takes the models of the stored forecasts into the forecaster; the clusters they are of.
async fn resume(store: &dyn Store, f: &mut Forecaster) -> Result<BTreeSet<String>, StoreError> {
    let mut clusters = BTreeSet::new();
    each_record(
        store,
        series::FORECAST_PREFIX,
        ROUND_SHARE,
        |c: ClusterForecast| {
            f.resume(std::slice::from_ref(&c));
            clusters.insert(c.cluster);
        },
    )
    .await?;
    Ok(clusters)
}

async fn write(store: &dyn Store, f: &ClusterForecast) -> Result<(), StoreError> {
    let key = series::forecast_key(&f.cluster);
    let mut o = Object::new("internal.orrery.io/v1", "ClusterForecast").with_name(&f.cluster);
    o.spec = serde_json::to_value(f).ok();
    match store.get(&key).await {
        Ok(mut old) => {
            old.spec = o.spec;
            store.update(&key, old, None).await.map(|_| ())
        }
        Err(StoreError::NotFound { .. }) => store.create(&key, o).await.map(|_| ()),
        Err(e) => Err(e),
    }
}

/// Forecasts from the samples the monitoring loop sends (raw ones, and the averages marked
/// `true`), until shutdown.
#[allow(clippy::too_many_arguments)] // the monitoring loop's settings and its channel, wired once
pub async fn run(
    store: Arc<dyn Store>,
    cfg: ForecastConfig,
    raw_interval: Duration,
    average_every: Duration,
    mut samples: mpsc::Receiver<Feed>,
    checks: Arc<Checks>,
    metrics: Handle,
    shutdown: watch::Receiver<bool>,
) {
    let lead = cfg.check_lead.min(cfg.horizon).as_secs();
    let mut f = Forecaster::new(cfg.clone(), raw_interval, average_every);
    let mut stale: BTreeSet<String> = BTreeSet::new();
    let averages = f.uses_averages();
    checks.set_series(averages, f.step as i64);
    let lead_steps = lead.div_ceil(f.step).max(1) as usize;
    let prefix = if averages {
        series::AVERAGE_PREFIX
    } else {
        series::RAW_PREFIX
    };
    // The history is read a page at a time, so a read that fails partway has taken in the
    // oldest pages only: it is read again (a sample not newer than the last one taken is
    // ignored, so a retry goes on where the failure stopped), and after the last attempt the
    // forecaster starts empty rather than from half a history with a gap after it.
    let mut loaded = load(store.as_ref(), prefix, &mut f).await;
    for attempt in 1..LOAD_ATTEMPTS {
        let Err(e) = &loaded else { break };
        tracing::warn!(attempt, error = %e, "reading the monitoring history to forecast from; reading on");
        tokio::time::sleep(Duration::from_secs(attempt as u64)).await;
        loaded = load(store.as_ref(), prefix, &mut f).await;
    }
    match loaded {
        Ok(samples) => {
            match resume(store.as_ref(), &mut f).await {
                // Forecasts of clusters gone while the server was down go at its first round.
                Ok(stored) => stale = stored,
                Err(e) => tracing::warn!(error = %e, "reading the stored forecasts"),
            }
            tracing::info!(
                samples,
                step_seconds = f.step,
                season = f.season,
                "forecasting from the stored history"
            );
        }
        Err(e) => {
            f = Forecaster::new(cfg, raw_interval, average_every);
            tracing::warn!(error = %e, "reading the monitoring history to forecast from; forecasting from new samples only");
        }
    }
    // Samples wait in a buffer of the channel's size: a forecaster that falls behind misses
    // samples rather than holding up the sampling.
    let buffer: Arc<parking_lot::Mutex<Waiting>> = Arc::default();
    let (wake, woken) = mpsc::unbounded_channel();
    let waiting = buffer.clone();
    tokio::spawn(async move {
        while let Some(feed) = samples.recv().await {
            match feed {
                Feed::Sample(s, is_average) => {
                    if is_average != averages {
                        continue;
                    }
                    let mut b = waiting.lock();
                    if b.samples.len() >= SAMPLES_WAITING {
                        continue;
                    }
                    b.samples.push_back(s);
                }
                // Each one at most a cluster's history: never dropped.
                Feed::Backfill(c, points) => waiting.lock().backfills.push((c, points)),
            }
            if wake.send(()).is_err() {
                return;
            }
        }
    });
    let r = Forecasting {
        store: store.clone(),
        checks,
        lead_steps,
        buffer,
        rounds: tokio::sync::Mutex::new(Rounds { f: Some(f), stale }),
    };
    Controller::new("forecasting", store, r, metrics)
        .trigger(woken)
        .run(shutdown)
        .await;
}

/// Samples that may wait for the forecaster (as many as the monitoring loop's channel holds).
const SAMPLES_WAITING: usize = 64;

/// What waits for the next round.
#[derive(Debug, Default)]
struct Waiting {
    samples: VecDeque<FleetSample>,
    backfills: Vec<(String, Vec<(i64, ClusterSample)>)>,
}

/// What a round carries to the next: the forecaster (moved to a blocking thread for the
/// round) and the clusters forecast last.
struct Rounds {
    f: Option<Forecaster>,
    stale: BTreeSet<String>,
}

/// The one key, woken by samples: a round forecasts the fleet from what they added.
struct Forecasting {
    store: Arc<dyn Store>,
    checks: Arc<Checks>,
    lead_steps: usize,
    buffer: Arc<parking_lot::Mutex<Waiting>>,
    rounds: tokio::sync::Mutex<Rounds>,
}

/// A round that could not finish: the forecaster's thread panicked, and the controller ends
/// (as a panic would end it).
#[derive(Debug)]
struct RoundFailed(String);

impl std::fmt::Display for RoundFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the forecasting round failed: {}", self.0)
    }
}

impl crate::runtime::controller::ReconcileError for RoundFailed {
    fn is_closed(&self) -> bool {
        true
    }
}

#[async_trait::async_trait]
impl Reconciler for Forecasting {
    type Key = ();
    type Error = RoundFailed;

    fn on_event(&mut self, _: Origin, _: Event, _: &mut Keys<()>) {}

    async fn reconcile(&self, _: &()) -> Result<Action, RoundFailed> {
        let mut rounds = self.rounds.lock().await;
        let Some(mut f) = rounds.f.take() else {
            return Err(RoundFailed("an earlier round lost the forecaster".into()));
        };
        // Samples that came while the last round ran are taken before the next; history
        // reported afterwards first, as it is older.
        let Waiting { samples, backfills } = std::mem::take(&mut *self.buffer.lock());
        if samples.is_empty() && backfills.is_empty() {
            rounds.f = Some(f);
            return Ok(Action::Done);
        }
        for (cluster, points) in &backfills {
            f.backfill(cluster, points);
        }
        for s in &samples {
            f.push(s);
        }
        let store = self.store.as_ref();
        let started = std::time::Instant::now();
        // A share of the fleet at a time, each share written before the next is made: a
        // round's memory does not grow with the fleet.
        let mut now: BTreeSet<String> = BTreeSet::new();
        let mut after: Option<String> = None;
        loop {
            let from = after.take();
            let (back, (forecasts, next)) = tokio::task::spawn_blocking(move || {
                let out = f.forecast_from(from.as_deref(), ROUND_SHARE);
                (f, out)
            })
            .await
            .map_err(|e| {
                tracing::error!(error = %e, "the forecasting round failed");
                RoundFailed(e.to_string())
            })?;
            f = back;
            self.checks.put(&forecasts, self.lead_steps);
            now.extend(forecasts.iter().map(|c| c.cluster.clone()));
            for c in forecasts {
                if let Err(e) = write(store, &c).await {
                    tracing::warn!(cluster = %c.cluster, error = %e, "writing a forecast");
                }
                match write_summary(store, &c).await {
                    // The cluster left while its forecast was made.
                    Ok(()) | Err(StoreError::NotFound { .. }) => {}
                    Err(e) => {
                        tracing::warn!(cluster = %c.cluster, error = %e, "writing a forecast's summary")
                    }
                }
            }
            match next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        rounds.f = Some(f);
        self.checks.keep_only(&now);
        let made = now.len();
        // Forecasts of clusters that left go.
        for gone in rounds.stale.difference(&now) {
            let _ = store
                .delete(&series::forecast_key(gone), &Default::default())
                .await;
        }
        rounds.stale = now;
        tracing::debug!(
            clusters = made,
            ms = started.elapsed().as_millis() as u64,
            "forecasts made"
        );
        Ok(Action::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use orrery_forecast::Model;

    #[test]
    fn the_forecaster_is_handed_only_the_series_it_forecasts() {
        let checks = Checks::default();
        assert!(checks.wants(true) && checks.wants(false));
        checks.set_series(true, 300);
        assert!(checks.wants(true) && !checks.wants(false));
        checks.set_series(false, 15);
        assert!(!checks.wants(true) && checks.wants(false));
    }

    fn sample(t: i64, cpu: f64) -> FleetSample {
        let c = ClusterSample {
            ready: true,
            level: cpu,
            levels: [("cpu".to_string(), cpu)].into(),
            traffic: 1000.0,
            ..Default::default()
        };
        FleetSample {
            time: Time::from_unix_seconds(t).unwrap(),
            clusters: [("m-0".to_string(), c)].into(),
        }
    }

    #[test]
    fn a_short_season_is_forecast_from_raw_samples_and_a_day_from_averages() {
        let cfg = |season: u64| ForecastConfig {
            season: Duration::from_secs(season),
            horizon: Duration::from_secs(season / 2),
            ..Default::default()
        };
        let raw = Duration::from_secs(1);
        let avg = Duration::from_secs(300);
        let day = Forecaster::new(cfg(86_400), raw, avg);
        assert!(day.uses_averages());
        assert_eq!((day.step, day.season, day.horizon), (300, 288, 144));
        let short = Forecaster::new(cfg(60), raw, avg);
        assert!(!short.uses_averages());
        assert_eq!((short.step, short.season, short.horizon), (1, 60, 30));
    }

    #[test]
    fn every_series_of_every_cluster_is_forecast_and_old_points_go() {
        let mut f = raw_forecaster(ForecastConfig {
            season: Duration::from_secs(20),
            horizon: Duration::from_secs(10),
            seasons_kept: 3,
            ..Default::default()
        });
        // A daily-like cycle of 20 samples, for four cycles; a sample out of order is ignored.
        for t in 0..80 {
            let phase = std::f64::consts::TAU * t as f64 / 20.0;
            f.push(&sample(1_000 + t, 0.5 + 0.3 * phase.sin()));
        }
        f.push(&sample(1_010, 9.0));
        assert_eq!(
            f.history[&("m-0".into(), "cpu".into())].len(),
            60,
            "three seasons kept"
        );
        let out = f.forecast_all();
        assert_eq!(out.len(), 1);
        let c = &out[0];
        assert_eq!((c.step_seconds, c.time.unix_seconds()), (1, 1_079));
        assert_eq!(c.series.len(), 2, "cpu and traffic: {:?}", c.series.keys());
        let cpu = &c.series["cpu"];
        assert_eq!(cpu.points.len(), 10);
        assert!(
            ["seasonal-naive", "mstl-ets", "mstl-ar"].contains(&cpu.model.as_str()),
            "{}",
            cpu.model
        );
        // The next point of the cycle: 0.5 + 0.3 sin(2π·80/20) = 0.5.
        assert!(
            (cpu.points[0].mean - 0.5).abs() < 0.05,
            "{:?}",
            cpu.points[0]
        );
        // The choice is kept between rounds; a cluster that leaves is forgotten.
        assert!(f.choices.contains_key(&("m-0".into(), "cpu".into())));
        f.push(&FleetSample {
            time: Time::from_unix_seconds(2_000).unwrap(),
            clusters: BTreeMap::new(),
        });
        assert!(f.forecast_all().is_empty());
        assert!(f.choices.is_empty());
    }

    fn point(mean: f64) -> ForecastPoint {
        ForecastPoint {
            mean,
            lower80: mean - 0.1,
            upper80: mean + 0.1,
            lower95: mean - 0.2,
            upper95: mean + 0.2,
        }
    }

    fn forecast(t: i64, step: u64, series: &[(&str, Vec<f64>)]) -> ClusterForecast {
        ClusterForecast {
            cluster: "m-0".into(),
            time: Time::from_unix_seconds(t).unwrap(),
            step_seconds: step,
            season_seconds: 20,
            history: 40,
            series: series
                .iter()
                .map(|(name, means)| {
                    (
                        name.to_string(),
                        SeriesForecast {
                            model: "seasonal-naive".into(),
                            backtest_mase: None,
                            points: means.iter().map(|m| point(*m)).collect(),
                            last: Some(0.5),
                            season_peak: None,
                            choice: None,
                        },
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn a_forecast_is_set_beside_the_sample_of_the_time_it_was_made_for() {
        let checks = Checks::default();
        checks.set_series(false, 1);
        // Made at 1000, three steps ahead: of 1003.
        let means: Vec<f64> = (1..=10).map(|k| 0.5 + k as f64 / 100.0).collect();
        checks.put(&[forecast(1_000, 1, &[("cpu", means.clone())])], 3);
        checks.put(&[forecast(1_001, 1, &[("cpu", means)])], 3);
        let mut early = sample(1_002, 0.5);
        checks.annotate(&mut early, false);
        assert!(
            early.clusters["m-0"].forecast.is_empty(),
            "nothing was forecast of 1002"
        );
        // An average is not what is forecast here.
        let mut avg = sample(1_003, 0.5);
        checks.annotate(&mut avg, true);
        assert!(avg.clusters["m-0"].forecast.is_empty());
        let mut s = sample(1_003, 0.55);
        checks.annotate(&mut s, false);
        let c = &s.clusters["m-0"].forecast["cpu"];
        assert_eq!((c.mean, c.made_at.unix_seconds()), (0.53, 1_000));
        // Taken once; a later sample gets the next forecast's.
        let mut again = sample(1_004, 0.55);
        checks.annotate(&mut again, false);
        assert_eq!(
            again.clusters["m-0"].forecast["cpu"].made_at.unix_seconds(),
            1_001
        );
        assert!(
            checks.lock().due["m-0"].is_empty(),
            "what is past is forgotten"
        );
        // A share of a round forgets nothing; a cluster the whole round did not forecast goes
        // from what is kept.
        let mut other = forecast(1_005, 1, &[("cpu", vec![0.5; 10])]);
        other.cluster = "m-1".into();
        checks.put(&[other], 3);
        assert!(checks.lock().due.contains_key("m-0"));
        checks.keep_only(&["m-1".to_string()].into());
        assert!(!checks.lock().due.contains_key("m-0"));
        assert!(checks.lock().due.contains_key("m-1"));
        checks.keep_only(&BTreeSet::new());
        assert!(checks.lock().due.is_empty());
    }

    #[test]
    fn the_summary_is_the_next_hours_highest_mean() {
        // Five-minute steps: an hour is twelve. Memory peaks higher, but after the hour.
        let cpu: Vec<f64> = (0..24).map(|k| if k == 5 { 0.8 } else { 0.5 }).collect();
        let memory: Vec<f64> = (0..24).map(|k| if k == 20 { 0.95 } else { 0.6 }).collect();
        let f = forecast(
            10_000,
            300,
            &[("cpu", cpu), ("memory", memory), ("traffic", vec![9e9; 24])],
        );
        let s = summary(&f).unwrap();
        assert_eq!(
            (
                s.peak,
                s.peak_dimension.as_str(),
                s.peak_time.unix_seconds()
            ),
            (0.8, "cpu", 10_000 + 6 * 300)
        );
        assert_eq!((s.peak_upper_bound, s.horizon_seconds), (0.9, 3600));
        assert_eq!((s.history_seconds, s.season_seconds), (12_000, 20));
        // Written again only when it says something new, or has aged.
        assert!(!summary_differs(Some(&s), &s, 300));
        let mut later = s.clone();
        later.time = s.time.add_seconds(60);
        later.peak += 0.004;
        assert!(!summary_differs(Some(&s), &later, 300));
        later.peak += 0.01;
        assert!(summary_differs(Some(&s), &later, 300));
        let mut aged = s.clone();
        aged.time = s.time.add_seconds(300);
        assert!(summary_differs(Some(&s), &aged, 300));
        assert!(summary_differs(None, &s, 300));
        // A forecast of traffic alone has no water level to summarize.
        assert!(summary(&forecast(10_000, 300, &[("traffic", vec![1.0; 3])])).is_none());
    }

    /// A level series is forecast without Orrery's part, which is added back as it stands at
    /// the forecast's time: replicas moved off a cluster do not show as a change of its load.
    #[test]
    fn orrerys_part_is_left_out_of_what_is_forecast() {
        let mut f = twenty_second_season();
        // A background cycle; Orrery's replicas add 0.2 for the first 50 samples, then
        // move away.
        for t in 0..80 {
            let phase = std::f64::consts::TAU * t as f64 / 20.0;
            let background = 0.5 + 0.2 * phase.sin();
            let part = if t < 50 { 0.2 } else { 0.0 };
            let mut s = sample(1_000 + t, background + part);
            let c = s.clusters.get_mut("m-0").unwrap();
            if part > 0.0 {
                c.placed.insert("cpu".into(), part);
            }
            f.push(&s);
        }
        let series: Vec<f64> = f.history[&("m-0".into(), "cpu".into())]
            .iter()
            .map(|v| f64::from(*v))
            .collect();
        assert!(
            series.iter().all(|v| (0.29..=0.71).contains(v)),
            "the background alone: {series:?}"
        );
        let out = f.forecast_all();
        let cpu = &out[0].series["cpu"];
        // Next: 0.5 + 0.2 sin(2π·80/20) = 0.5, with nothing of Orrery's there now.
        assert!(
            (cpu.points[0].mean - 0.5).abs() < 0.05,
            "{:?}",
            cpu.points[0]
        );
        let at_79 = 0.5 + 0.2 * (std::f64::consts::TAU * 79.0 / 20.0).sin();
        assert!((cpu.last.unwrap() - at_79).abs() < 1e-3, "{:?}", cpu.last);
        // With Orrery's part back, the forecast is shown on top of it.
        let mut s = sample(1_080, 0.5 + 0.3);
        s.clusters
            .get_mut("m-0")
            .unwrap()
            .placed
            .insert("cpu".into(), 0.3);
        f.push(&s);
        let cpu = &f.forecast_all()[0].series["cpu"];
        assert!((cpu.last.unwrap() - 0.8).abs() < 1e-3, "{:?}", cpu.last);
        assert!(cpu.points[0].mean > 0.75, "{:?}", cpu.points[0]);
    }

    /// A forecaster of raw samples a second apart (and 5-minute averages).
    fn raw_forecaster(cfg: ForecastConfig) -> Forecaster {
        Forecaster::new(cfg, Duration::from_secs(1), Duration::from_secs(300))
    }

    /// A forecaster of raw samples a second apart, with a season of twenty.
    fn twenty_second_season() -> Forecaster {
        raw_forecaster(ForecastConfig {
            season: Duration::from_secs(20),
            horizon: Duration::from_secs(10),
            ..Default::default()
        })
    }

    fn fleet_forecaster(clusters: usize, samples: i64) -> Forecaster {
        let mut f = twenty_second_season();
        feed(&mut f, clusters, 0..samples);
        f
    }

    /// A sample a second of `clusters` clusters in a cycle of twenty, at times `times`.
    fn feed(f: &mut Forecaster, clusters: usize, times: std::ops::Range<i64>) {
        for t in times {
            let phase = std::f64::consts::TAU * t as f64 / 20.0;
            let mut s = sample(1_000 + t, 0.0);
            let one = s.clusters.remove("m-0").unwrap();
            for i in 0..clusters {
                let mut c = one.clone();
                c.levels
                    .insert("cpu".into(), 0.3 + 0.02 * i as f64 + 0.1 * phase.sin());
                s.clusters.insert(format!("m-{i}"), c);
            }
            f.push(&s);
        }
    }

    /// A fleet keeps its seasons while its series fit in the budget, fewer as it grows (never
    /// under three seasons), and gives the room back.
    #[test]
    fn the_history_keeps_within_its_budget_as_the_fleet_grows() {
        // Two series a cluster (cpu, traffic) of 4 bytes a point: 8,000 bytes are 1,000
        // points of two series, 100 of twenty.
        let mut f = twenty_second_season();
        f.cfg.history_bytes = 8_000;
        let most = |f: &Forecaster| f.history.values().map(VecDeque::len).max().unwrap();
        let room = |f: &Forecaster| f.history.values().map(VecDeque::capacity).sum::<usize>();

        feed(&mut f, 1, 0..400);
        assert_eq!(f.history.len(), 2);
        assert_eq!(most(&f), 340, "one cluster keeps its seventeen seasons");
        assert!(room(&f) <= 2 * 383, "room {}", room(&f));

        feed(&mut f, 10, 400..600);
        assert_eq!(f.history.len(), 20);
        assert!(
            f.history.values().all(|h| h.len() == 100),
            "five seasons each"
        );
        assert!(room(&f) * 4 <= 8_000 * 33 / 32, "room {} points", room(&f));

        feed(&mut f, 100, 600..700);
        assert_eq!(most(&f), 60, "never fewer than three seasons");
        assert!(room(&f) <= 200 * 60 * 33 / 32, "room {} points", room(&f));
        let out = f.forecast_all();
        assert_eq!(out.len(), 100, "every cluster still forecast");
        assert!(out.iter().all(|c| c.history == 60));
    }

    /// A round made a share at a time makes what a round made at once does, each cluster
    /// once, and says when it is through.
    #[test]
    fn a_round_in_shares_makes_every_forecast_once() {
        let all = fleet_forecaster(7, 60).forecast_all();
        assert_eq!(all.len(), 7);
        let mut f = fleet_forecaster(7, 60);
        let (mut got, mut after, mut shares) = (Vec::new(), None::<String>, 0);
        loop {
            let (share, next) = f.forecast_from(after.as_deref(), 3);
            assert!(share.len() <= 3);
            got.extend(share);
            shares += 1;
            match next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        assert_eq!(shares, 3);
        assert_eq!(got, all);
    }

    /// A new leader reads the history and the stored forecasts a page at a time, in time
    /// order, into the forecaster.
    #[tokio::test]
    async fn the_stored_history_and_forecasts_are_read_a_page_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(orrery_store_sqlite::SqliteStore::open_dir(dir.path()).unwrap());
        // More records than a page, written newest first.
        for t in (0..(LOAD_PAGE as i64 * 2 + 3)).rev() {
            let s = sample(1_000 + t, 0.1 * t as f64);
            let mut o = Object::new("internal.orrery.io/v1", "FleetSample")
                .with_name(format!("{:012}", 1_000 + t));
            o.spec = serde_json::to_value(&s).ok();
            store
                .create(&series::key(series::RAW_PREFIX, 1_000 + t), o)
                .await
                .unwrap();
        }
        let mut f = fleet_forecaster(0, 0);
        let n = load(store.as_ref(), series::RAW_PREFIX, &mut f)
            .await
            .unwrap();
        assert_eq!(n, LOAD_PAGE * 2 + 3);
        // Every sample taken (none ignored as out of order), the last one last.
        let cpu = &f.history[&("m-0".into(), "cpu".into())];
        assert_eq!(cpu.len(), n);
        assert!((f64::from(*cpu.back().unwrap()) - 0.1 * (n - 1) as f64).abs() < 1e-4);
        // Read again (a start-up's retry after a failure partway), nothing is taken twice.
        load(store.as_ref(), series::RAW_PREFIX, &mut f)
            .await
            .unwrap();
        assert_eq!(f.history[&("m-0".into(), "cpu".into())].len(), n);
        for c in f.forecast_all() {
            write(store.as_ref(), &c).await.unwrap();
        }
        let mut g = fleet_forecaster(0, 0);
        let clusters = resume(store.as_ref(), &mut g).await.unwrap();
        assert_eq!(clusters.into_iter().collect::<Vec<_>>(), ["m-0"]);
        assert_eq!(g.choices.len(), f.choices.len());
    }

    /// A restarted forecaster goes on with the models the stored forecasts were made with
    /// instead of choosing every series' again at once.
    #[test]
    fn a_restarted_forecaster_goes_on_with_the_stored_choices() {
        // A four-minute season: a choice stands for ten seconds.
        let cfg = ForecastConfig {
            season: Duration::from_secs(240),
            horizon: Duration::from_secs(10),
            ..Default::default()
        };
        let new = || raw_forecaster(cfg.clone());
        let mut f = new();
        for t in 0..60 {
            let phase = std::f64::consts::TAU * t as f64 / 20.0;
            f.push(&sample(1_000 + t, 0.5 + 0.3 * phase.sin()));
        }
        f.forecast_all();
        let key = ("m-0".to_string(), "cpu".to_string());
        // The first steps by a model of their own, as a backtest that found one chooses:
        // it is stored with the choice and goes on after the restart too.
        let far = f.choices[&key].0.model;
        let near_model = if far == Model::Naive {
            Model::SeasonalNaive
        } else {
            Model::Naive
        };
        let standing = &mut f.choices.get_mut(&key).unwrap().0;
        standing.near = Some(Near {
            model: near_model,
            steps: 3,
            backtest_mase: 0.25,
            interval_scale: 1.5,
        });
        // And the weekly season, as a choice on two weeks of history takes it.
        standing.long_season = 7 * f.season;
        let stored = f.forecast_all();
        let chosen = stored[0].series["cpu"].choice.clone().unwrap();
        assert_eq!(
            chosen.long_season,
            7 * f.season,
            "the long season is stored"
        );
        let near = chosen.near.clone().expect("the near band is stored");
        assert_eq!(
            (near.model.as_str(), near.steps, near.interval_scale),
            (near_model.name(), 3, 1.5)
        );
        assert_eq!(
            (chosen.chosen_at.unix_seconds(), chosen.history),
            (1_059, 60)
        );
        let mut g = new();
        for t in 0..61 {
            let phase = std::f64::consts::TAU * t as f64 / 20.0;
            g.push(&sample(1_000 + t, 0.5 + 0.3 * phase.sin()));
        }
        g.resume(&stored);
        let (a, b) = (&g.choices[&key], &f.choices[&key]);
        // (The backtest's MASE is stored rounded; the rest as it was.)
        assert_eq!(
            (
                a.0.model,
                a.0.season,
                a.0.long_season,
                a.0.interval_scale,
                &a.0.near,
                a.1,
                a.2
            ),
            (
                b.0.model,
                b.0.season,
                b.0.long_season,
                b.0.interval_scale,
                &b.0.near,
                b.1,
                b.2
            )
        );
        // Its next round forecasts with the same model, not one chosen again.
        let next = g.forecast_all();
        assert_eq!(next[0].series["cpu"].model, stored[0].series["cpu"].model);
        assert_eq!(g.choices[&key].1, 1_059, "not chosen again");
    }

    /// A fleet of more series than `choose_series` has its models chosen as much less often,
    /// up to a quarter of a season apart.
    #[test]
    fn a_large_fleets_models_are_chosen_less_often() {
        // A four-minute season: a choice stands for ten seconds, at most a minute.
        let new = || {
            raw_forecaster(ForecastConfig {
                season: Duration::from_secs(240),
                horizon: Duration::from_secs(10),
                choose_series: 2,
                ..Default::default()
            })
        };
        let chosen_at = |f: &Forecaster| f.choices[&("m-0".to_string(), "cpu".to_string())].1;
        // Two series a cluster (cpu, traffic).
        for (clusters, every) in [(1, 10), (3, 30), (10, 60)] {
            let mut f = new();
            feed(&mut f, clusters, 0..100);
            assert_eq!(f.choose_every_seconds(), every, "{clusters} clusters");
            f.forecast_all();
            assert_eq!(chosen_at(&f), 1_099);
            // Just before the choice's time is up it stands; once up, it is made again.
            feed(&mut f, clusters, 100..100 + every - 1);
            f.forecast_all();
            assert_eq!(chosen_at(&f), 1_099, "{clusters} clusters: still standing");
            feed(&mut f, clusters, 100 + every - 1..100 + every);
            f.forecast_all();
            assert_eq!(
                chosen_at(&f),
                1_099 + every,
                "{clusters} clusters: chosen again"
            );
        }
        // A choice on history long enough to backtest the weekly season (two weeks before
        // eight folds of the horizon, here 10 s a step) stands twice as long, up to the
        // quarter.
        let f = new();
        let week = 2 * f.season * 7 + 2 + 8 * f.horizon.min(f.season);
        assert_eq!(f.choose_after(week - 1), 10);
        assert_eq!(f.choose_after(week), 20);
        let mut f = new();
        feed(&mut f, 10, 0..100);
        assert_eq!(f.choose_after(week), 60, "at most a quarter of a season");
    }

    /// A day's season of 5-minute averages.
    fn daily() -> Forecaster {
        Forecaster::new(
            ForecastConfig::default(),
            Duration::from_secs(15),
            Duration::from_secs(300),
        )
    }

    fn reported(t: i64, cpu: f64) -> (i64, ClusterSample) {
        let (_, c) = orrery_api::history::backfill::windows(
            &[(
                t,
                orrery_api::history::backfill::Point {
                    levels: [("cpu".to_string(), cpu)].into(),
                    ..Default::default()
                },
            )]
            .into(),
            300,
        )
        .remove(0);
        (t, c)
    }

    fn cpu(f: &Forecaster, cluster: &str) -> Vec<f32> {
        f.history[&(cluster.to_string(), "cpu".to_string())]
            .iter()
            .copied()
            .collect()
    }

    #[test]
    fn history_reported_afterwards_goes_before_what_was_measured_on_its_grid() {
        let mut f = daily();
        let t0 = 1_800_000_000;
        for k in 0..4 {
            f.push(&sample(t0 + 300 * k, 0.5));
        }
        // Six windows before the first measured one, one of them missing, and two that
        // overlap what was measured (left out), out of order within the call's own order.
        let mut points: Vec<(i64, ClusterSample)> = [-6, -5, -3, -2, -1, 0, 1]
            .iter()
            .map(|k| reported(t0 + 300 * k, 0.1 * (7 + k) as f64))
            .collect();
        points.sort_by_key(|p| p.0);
        f.backfill("m-0", &points);
        let got = cpu(&f, "m-0");
        // -6, -5, (-4: as -5), -3, -2, -1, then the four measured.
        let want = [0.1, 0.2, 0.2, 0.4, 0.5, 0.6, 0.5, 0.5, 0.5, 0.5];
        assert_eq!(got.len(), want.len(), "{got:?}");
        for (g, w) in got.iter().zip(want) {
            assert!((f64::from(*g) - w).abs() < 1e-6, "{got:?}");
        }
        // A cluster the forecaster has not measured yet starts from its history; the next
        // measured sample follows it.
        f.backfill("new", &[reported(t0, 0.3), reported(t0 + 300, 0.4)]);
        assert_eq!(cpu(&f, "new"), vec![0.3, 0.4]);
        let mut next = sample(t0 + 1200, 0.5);
        let one = next.clusters["m-0"].clone();
        next.clusters.insert("new".into(), one);
        f.push(&next);
        assert_eq!(cpu(&f, "new"), vec![0.3, 0.4, 0.5]);
        // A record of history alone (read back at a restart) drops no cluster.
        let mut alone = sample(t0 + 1500, 0.0);
        alone.clusters = [("old".to_string(), reported(t0, 0.2).1)].into();
        f.push(&alone);
        assert!(
            f.history
                .contains_key(&("m-0".to_string(), "cpu".to_string()))
        );
        // Raw samples' series take none of it.
        let mut raw = twenty_second_season();
        raw.push(&sample(10, 0.5));
        raw.backfill("m-0", &[reported(0, 0.3)]);
        assert_eq!(cpu(&raw, "m-0"), vec![0.5]);
    }
}
