//! Forecasts of the fleet's time series (the draft's Predictive Algorithms, 3.1 and 5.1):
//! given one series sampled at a fixed step, where it goes next, with 80 % and 95 %
//! prediction intervals.
//!
//! - **Models.** Naive (the last value), seasonal naive (the value one season ago), ETS
//!   (exponential smoothing, the best of its error/trend forms by likelihood), and two that
//!   split the series by MSTL into its season and the rest and forecast the rest: MSTL-ETS by
//!   ETS, MSTL-AR by an autoregression (order by AIC, least squares), which returns to the
//!   level at the series' own pace where ETS stays where the last points left it. ETS and
//!   MSTL are Grafana's `augurs`; the autoregression and the naive models are here.
//! - **Choice.** Each series gets the model that forecast its own recent past best: a rolling
//!   backtest over its last few horizons, scored by MASE (the error over that of the seasonal
//!   naive one step ahead in the training data), so a flat series keeps naive and a daily
//!   cycle gets an MSTL. The horizon's first sixth (its first hour of six) gets its own
//!   model, the best over the same backtest's first sixth: the model that follows the last
//!   hour best is often not the one that is best six hours out.
//! - **Season.** Given (samples per season), or found in the series by its autocorrelation.
//!   MSTL's decomposition is robust: points far off its first fit (bursts) are weighed down
//!   before the season is fitted again, so a burst stays in the rest and out of the season.
//!   A long season (a week) may be given too: where two of it precede the backtest's folds,
//!   the MSTL models are backtested with it beside the season, and keep it where their best
//!   forecast the folds better with it.
//! - **Intervals.** The chosen models' own, each widened or narrowed by the factor that makes
//!   it cover the backtest's errors over its own steps as often as it says (so an 80 % band
//!   holds about 80 % of what follows).
//!
//! No clock and no I/O: the same history gives the same forecast.

use augurs::ets::AutoETS;
use augurs::mstl::MSTLModel;
use augurs::{Fit, Predict};
use serde::{Deserialize, Serialize};

/// The two interval levels every forecast carries.
pub const LEVELS: [f64; 2] = [0.8, 0.95];
/// The standard normal quantiles of [`LEVELS`] (two-sided).
const Z80: f64 = 1.281_551_565_544_600_4;
const Z95: f64 = 1.959_963_984_540_054;

/// A forecasting model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Model {
    /// The last value, for ever.
    Naive,
    /// The value one season before.
    SeasonalNaive,
    /// Exponential smoothing without a season.
    Ets,
    /// The seasonal component by MSTL, the rest by ETS.
    MstlEts,
    /// The seasonal component by MSTL, the rest by an autoregression.
    MstlAr,
}

impl Model {
    pub const ALL: [Model; 5] = [
        Model::Naive,
        Model::SeasonalNaive,
        Model::Ets,
        Model::MstlEts,
        Model::MstlAr,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Model::Naive => "naive",
            Model::SeasonalNaive => "seasonal-naive",
            Model::Ets => "ets",
            Model::MstlEts => "mstl-ets",
            Model::MstlAr => "mstl-ar",
        }
    }

    /// The model of a [`Model::name`].
    pub fn named(name: &str) -> Option<Model> {
        Model::ALL.into_iter().find(|m| m.name() == name)
    }

    /// Whether it forecasts by an MSTL decomposition (and so can take a long season).
    fn mstl(self) -> bool {
        matches!(self, Model::MstlEts | Model::MstlAr)
    }

    fn seasonal(self) -> bool {
        matches!(self, Model::SeasonalNaive | Model::MstlEts | Model::MstlAr)
    }

    /// The fewest points it fits on.
    fn min_points(self, season: usize) -> usize {
        match self {
            Model::Naive => 2,
            Model::Ets => 10,
            Model::SeasonalNaive => season + 2,
            Model::MstlEts | Model::MstlAr => 2 * season + 2,
        }
    }
}

impl std::fmt::Display for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ForecastError {
    #[error("a forecast needs at least 2 points of history, not {0}")]
    TooShort(usize),
    #[error("the history holds a value that is not a number")]
    NotFinite,
    #[error("{model} could not be fitted: {message}")]
    Fit { model: Model, message: String },
}

/// One step of a forecast: the mean and the bounds of its two intervals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Band {
    pub mean: f64,
    pub lower80: f64,
    pub upper80: f64,
    pub lower95: f64,
    pub upper95: f64,
}

/// A series' forecast, and how it was made.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Forecast {
    /// The model of the whole horizon, or of the steps after the near band's.
    pub model: Model,
    /// The model of the first steps, when the choice gave them their own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub near_model: Option<Model>,
    /// Samples per season (0: none).
    pub season: usize,
    /// Samples per long season the MSTL models also decomposed by (0: none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub long_season: usize,
    /// The chosen model's mean MASE over the backtest (lower is better; 1 is as good as the
    /// seasonal naive one step ahead in its training data). `None` when the history was too
    /// short to backtest.
    pub backtest_mase: Option<f64>,
    /// The factor the model's intervals were scaled by to cover the backtest's errors.
    pub interval_scale: f64,
    /// One band per step after the last sample.
    pub points: Vec<Band>,
}

/// How forecasts are made.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Samples per season; `None` to find it in the series.
    pub season: Option<usize>,
    /// A second, longer season (a week of a daily one), in samples: where the history holds
    /// two of it before every fold of the backtest, the MSTL models are backtested with it
    /// too, and it is kept where it forecast better. `None`: the one season only.
    pub long_season: Option<usize>,
    /// The shortest and longest season looked for, in samples.
    pub season_range: (usize, usize),
    /// Backtest folds: each forecasts one horizon from a point further back. (Eight of six
    /// hours: on three, the choice was seasonal naive or naive at a third of the held-out
    /// origins, and worse than MSTL alone.)
    pub folds: usize,
    /// Folds the chosen models' intervals are calibrated on: `folds`, and the older ones up
    /// to this many (a load's deviations last, so the errors within one fold are alike, and
    /// a few folds say little of how wide the band must be).
    pub calibration_folds: usize,
    /// The models tried.
    pub candidates: Vec<Model>,
    /// Clamp the forecast at 0 (water levels, traffic and counts are never negative).
    pub non_negative: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            season: None,
            long_season: None,
            season_range: (4, 2048),
            folds: FOLDS,
            calibration_folds: 8,
            candidates: Model::ALL.to_vec(),
            non_negative: true,
        }
    }
}

/// The strongest season in `y` between `min` and `max` samples long, if any stands out: the
/// lag at which the series, less its linear trend, is most like itself (its autocorrelation's
/// highest peak, at least 0.3), the shortest of near-equal peaks so a season is not taken for
/// two of it. (augurs' periodogram works on a Welch spectrum too coarse to tell a 48-sample
/// season from a 43-sample one.)
pub fn detect_season(y: &[f64], min: usize, max: usize) -> Option<usize> {
    // A season shows only where the series holds at least two of it.
    let max = max.min(y.len() / 2);
    let min = min.max(2);
    if max <= min {
        return None;
    }
    let n = y.len() as f64;
    let (tm, ym) = ((n - 1.0) / 2.0, y.iter().sum::<f64>() / n);
    let (mut sxy, mut sxx) = (0.0, 0.0);
    for (t, v) in y.iter().enumerate() {
        sxy += (t as f64 - tm) * (v - ym);
        sxx += (t as f64 - tm).powi(2);
    }
    let slope = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    let d: Vec<f64> = y
        .iter()
        .enumerate()
        .map(|(t, v)| v - ym - slope * (t as f64 - tm))
        .collect();
    let var: f64 = d.iter().map(|x| x * x).sum();
    if var <= 1e-12 {
        return None;
    }
    let acf = |lag: usize| (lag..d.len()).map(|t| d[t] * d[t - lag]).sum::<f64>() / var;
    let r: Vec<f64> = (min - 1..=max + 1).map(acf).collect();
    let peaks: Vec<(usize, f64)> = (1..r.len() - 1)
        .filter(|&i| r[i] >= r[i - 1] && r[i] >= r[i + 1])
        .map(|i| (i + min - 1, r[i]))
        .collect();
    let top = peaks.iter().map(|p| p.1).fold(f64::MIN, f64::max);
    if top < 0.3 {
        return None;
    }
    peaks.iter().find(|p| p.1 >= 0.9 * top).map(|p| p.0)
}

/// The model a series' own backtest chooses, and how its intervals are scaled: what a
/// forecaster keeps between refits (choosing costs a fit per candidate and fold; forecasting
/// with the choice, one or two).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Choice {
    /// The model of the whole horizon (of the steps after `near`'s, when there is one).
    pub model: Model,
    /// Samples per season (0: none).
    pub season: usize,
    /// Samples per long season the MSTL models also decompose by (0: none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub long_season: usize,
    /// The model's mean MASE over the backtest; `None` when the history was too short.
    pub backtest_mase: Option<f64>,
    /// The factor its intervals are scaled by to cover the backtest's errors.
    pub interval_scale: f64,
    /// The first steps' model, chosen by how it did over those steps alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub near: Option<Near>,
}

/// The model of a forecast's first steps: the one that forecast the first steps of the
/// backtest's horizons best, which need not be the best over the whole horizon (a model that
/// follows the last hour's deviation closely can be the best next hour and the worst at six).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Near {
    pub model: Model,
    /// The steps it forecasts.
    pub steps: usize,
    /// Its mean MASE over the first `steps` of the backtest's horizons.
    pub backtest_mase: f64,
    /// The factor its intervals are scaled by to cover its errors over those steps.
    pub interval_scale: f64,
}

impl Choice {
    /// A choice of one model for the whole horizon, its intervals as the model makes them.
    pub fn of(model: Model, season: usize) -> Choice {
        Choice {
            model,
            season,
            long_season: 0,
            backtest_mase: None,
            interval_scale: 1.0,
            near: None,
        }
    }
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

fn check(y: &[f64]) -> Result<(), ForecastError> {
    if y.len() < 2 {
        return Err(ForecastError::TooShort(y.len()));
    }
    if y.iter().any(|v| !v.is_finite()) {
        return Err(ForecastError::NotFinite);
    }
    Ok(())
}

/// The steps of a horizon's near band: its first sixth (the first hour of six), none when
/// the horizon is too short to split.
pub fn near_steps(horizon: usize) -> usize {
    horizon / 6
}

/// The backtest folds of [`Settings::default`].
pub const FOLDS: usize = 8;

/// Whether a choice on `n` points backtests the MSTL models with the long season `long` too
/// (every fold's history holds two of it): such a choice fits the MSTL models twice.
pub fn backtests_long_season(
    n: usize,
    season: usize,
    long: usize,
    horizon: usize,
    folds: usize,
) -> bool {
    season >= 2 && long > season && n >= 2 * long + 2 + folds * horizon
}

/// Chooses the model for `y` by a rolling backtest `horizon` steps ahead, and the model of
/// the horizon's first sixth by the same backtest's first steps.
pub fn choose(y: &[f64], horizon: usize, settings: &Settings) -> Result<Choice, ForecastError> {
    check(y)?;
    let horizon = horizon.max(1);
    let season = settings
        .season
        .filter(|s| *s >= 2)
        .or_else(|| detect_season(y, settings.season_range.0, settings.season_range.1))
        .unwrap_or(0);
    let scale = mase_scale(y, season);
    let near = near_steps(horizon);
    let candidates: Vec<Model> = settings
        .candidates
        .iter()
        .copied()
        .filter(|m| !m.seasonal() || season >= 2)
        .collect();
    let folds = 1..=settings.folds.max(1);
    let mut tried = backtest(&candidates, y, (season, 0), horizon, folds.clone(), scale);
    // The near band's candidates, kept apart where the long season replaces them: never with
    // it. Over the first hour a week's pattern estimated from two or three weeks adds more
    // noise than it tells (on held-out series the 1-hour MASE was 2-8 % worse with it,
    // docs/benchmarks.md).
    let mut plain = None;
    // The long season where every fold's history holds two of it: the MSTL models with it
    // replace those without where the best of them forecast better with it.
    let mut long = 0;
    if let Some(l) = settings
        .long_season
        .filter(|&l| backtests_long_season(y.len(), season, l, horizon, *folds.end()))
    {
        let mstl: Vec<Model> = candidates.iter().copied().filter(|m| m.mstl()).collect();
        let with = backtest(&mstl, y, (season, l), horizon, folds.clone(), scale);
        let best_mstl = |t: &[(Model, Backtest)]| {
            t.iter()
                .filter(|(m, _)| m.mstl())
                .filter_map(|(_, b)| b.mase(0..horizon))
                .min_by(f64::total_cmp)
        };
        let better = match (best_mstl(&with), best_mstl(&tried)) {
            (Some(a), Some(b)) => a < b,
            (a, _) => a.is_some(),
        };
        if better {
            plain = Some(tried.clone());
            tried.retain(|(m, _)| !m.mstl());
            tried.extend(with);
            long = l;
        }
    }
    let best = |tried: &[(Model, Backtest)], steps: std::ops::Range<usize>| {
        tried
            .iter()
            .filter_map(|(m, b)| Some((*m, b.mase(steps.clone())?)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
    };
    let Some((model, mase)) = best(&tried, 0..horizon) else {
        // Too short to backtest: the simplest model that fits.
        return Ok(Choice::of(
            if season >= 2 && y.len() >= Model::SeasonalNaive.min_points(season) {
                Model::SeasonalNaive
            } else {
                Model::Naive
            },
            season,
        ));
    };
    // The intervals from more folds than the choice was made on (the model that won the
    // choice also looks better on its own folds than it will do next), each band's on its
    // own steps.
    let calibrated = |tried: &[(Model, Backtest)], m: Model, long: usize| {
        let mut b = tried.iter().find(|t| t.0 == m).map(|t| t.1.clone())?;
        let older = settings.folds.max(1) + 1..=settings.calibration_folds;
        if !older.is_empty()
            && let Some((_, more)) = backtest(&[m], y, (season, long), horizon, older, scale).pop()
        {
            b.points.extend(more.points);
        }
        Some(b)
    };
    let long = if model.mstl() { long } else { 0 };
    let plain = plain.as_deref().unwrap_or(&tried);
    let far = calibrated(&tried, model, long);
    let near =
        (near >= 1)
            .then(|| best(plain, 0..near))
            .flatten()
            .map(|(near_model, near_mase)| {
                let b = if near_model == model && long == 0 {
                    far.clone()
                } else {
                    calibrated(plain, near_model, 0)
                };
                Near {
                    model: near_model,
                    steps: near,
                    backtest_mase: near_mase,
                    interval_scale: b.map_or(1.0, |b| b.interval_scale(0..near)),
                }
            });
    Ok(Choice {
        model,
        season,
        long_season: long,
        backtest_mase: Some(mase),
        interval_scale: far.map_or(1.0, |b| {
            b.interval_scale(near.as_ref().map_or(0, |n| n.steps)..horizon)
        }),
        near,
    })
}

/// Forecasts `horizon` steps after `y` with a model chosen before (on `y` or an earlier part
/// of it).
pub fn forecast_with(
    choice: &Choice,
    y: &[f64],
    horizon: usize,
    settings: &Settings,
) -> Result<Forecast, ForecastError> {
    check(y)?;
    let horizon = horizon.max(1);
    let mut fits = Fits::new(y, (choice.season, choice.long_season));
    let mut points = fits.predict(choice.model, horizon)?;
    let near = choice.near.as_ref().filter(|n| n.steps >= 1);
    let split = near.map_or(0, |n| n.steps.min(horizon));
    // The near band never takes the long season: where the far model is decomposed by it,
    // an MSTL near model is fitted again without.
    let near_alone = choice.long_season > 0 && near.is_some_and(|n| n.model.mstl());
    if let Some(n) = near
        && (n.model != choice.model || near_alone)
    {
        let first = if near_alone {
            Fits::new(y, (choice.season, 0)).predict(n.model, split)?
        } else {
            fits.predict(n.model, split)?
        };
        points[..split].copy_from_slice(&first);
    }
    for (h, p) in points.iter_mut().enumerate() {
        p.widen(match near {
            Some(n) if h < split => n.interval_scale,
            _ => choice.interval_scale,
        });
        if settings.non_negative {
            p.clamp_at_zero();
        }
    }
    Ok(Forecast {
        model: choice.model,
        near_model: near.map(|n| n.model),
        season: choice.season,
        long_season: fits.long_used(),
        backtest_mase: choice.backtest_mase,
        interval_scale: choice.interval_scale,
        points,
    })
}

/// Forecasts `horizon` steps after `y` with the model its own backtest chooses.
pub fn forecast(y: &[f64], horizon: usize, settings: &Settings) -> Result<Forecast, ForecastError> {
    let choice = choose(y, horizon, settings)?;
    forecast_with(&choice, y, horizon, settings)
}

impl Band {
    /// The bands of a normal error of deviation `sd` around `mean`.
    fn normal(mean: f64, sd: f64) -> Band {
        Band {
            mean,
            lower80: mean - Z80 * sd,
            upper80: mean + Z80 * sd,
            lower95: mean - Z95 * sd,
            upper95: mean + Z95 * sd,
        }
    }

    fn widen(&mut self, k: f64) {
        self.lower80 = self.mean - (self.mean - self.lower80) * k;
        self.upper80 = self.mean + (self.upper80 - self.mean) * k;
        self.lower95 = self.mean - (self.mean - self.lower95) * k;
        self.upper95 = self.mean + (self.upper95 - self.mean) * k;
    }

    fn clamp_at_zero(&mut self) {
        for v in [
            &mut self.mean,
            &mut self.lower80,
            &mut self.upper80,
            &mut self.lower95,
            &mut self.upper95,
        ] {
            *v = v.max(0.0);
        }
    }
}

/// What a model's backtest found: each held-out point's step ahead, its error over the
/// MASE scale, and its error over the half-width of its 80 % band.
#[derive(Clone, Debug, Default)]
struct Backtest {
    points: Vec<(usize, f64, f64)>,
}

impl Backtest {
    /// The mean scaled error over the given steps ahead.
    fn mase(&self, steps: std::ops::Range<usize>) -> Option<f64> {
        let (sum, n) = self
            .points
            .iter()
            .filter(|p| steps.contains(&p.0))
            .fold((0.0, 0usize), |(s, n), p| (s + p.1, n + 1));
        (n > 0).then(|| sum / n as f64)
    }

    /// The factor that makes the 80 % band hold [`CALIBRATION_QUANTILE`] of the backtest's
    /// points over the given steps, within reason (a band is never made more than 4 times
    /// wider or narrower).
    fn interval_scale(&self, steps: std::ops::Range<usize>) -> f64 {
        let mut r: Vec<f64> = self
            .points
            .iter()
            .filter(|p| steps.contains(&p.0))
            .map(|p| p.2)
            .collect();
        if r.len() < 10 {
            return 1.0;
        }
        r.sort_by(f64::total_cmp);
        let k = r[((r.len() as f64 * CALIBRATION_QUANTILE).ceil() as usize).min(r.len()) - 1];
        if k.is_finite() && k > 0.0 {
            k.clamp(0.25, 4.0)
        } else {
            1.0
        }
    }
}

/// The share of the backtest's points an 80 % band is widened to hold. Bands made to hold
/// 80 % of the backtest held 74 % of what followed (20 held-out series at 15 origins each,
/// docs/benchmarks.md): the backtest is the last two days, and the model chosen on them is
/// the one they flatter most. Holding 85 % of them, the bands held 79 % (1 h) and 78 % (6 h).
const CALIBRATION_QUANTILE: f64 = 0.85;

/// The mean absolute error of the one-step seasonal naive forecast (naive when there is no
/// season) within `y`: what MASE divides by.
fn mase_scale(y: &[f64], season: usize) -> f64 {
    let lag = if season >= 2 && y.len() > season {
        season
    } else {
        1
    };
    let n = y.len().saturating_sub(lag);
    if n == 0 {
        return 1.0;
    }
    let mae = (lag..y.len())
        .map(|t| (y[t] - y[t - lag]).abs())
        .sum::<f64>()
        / n as f64;
    if mae > 1e-12 { mae } else { 1.0 }
}

/// The rolling-origin backtests of `models` over folds `folds` of `y` (fold k forecasts
/// the k-th horizon from the end), one per model that could be fitted to any.
fn backtest(
    models: &[Model],
    y: &[f64],
    seasons: (usize, usize),
    horizon: usize,
    folds: std::ops::RangeInclusive<usize>,
    scale: f64,
) -> Vec<(Model, Backtest)> {
    let mut out: Vec<(Model, Backtest)> =
        models.iter().map(|m| (*m, Backtest::default())).collect();
    for k in folds.rev() {
        // Folds reaching back before a model's first fit are left out.
        let Some(end) = y.len().checked_sub(k * horizon) else {
            continue;
        };
        let held = &y[end..(end + horizon).min(y.len())];
        let mut fits = Fits::new(&y[..end], seasons);
        for (model, b) in out.iter_mut() {
            let Ok(bands) = fits.predict(*model, held.len()) else {
                continue;
            };
            for (h, (band, actual)) in bands.iter().zip(held).enumerate() {
                let half = (band.upper80 - band.mean).max(1e-12);
                let error = (actual - band.mean).abs();
                b.points.push((h, error / scale, error / half));
            }
        }
    }
    out.retain(|(_, b)| !b.points.is_empty());
    out
}

/// `model` fitted to `y`, `horizon` steps ahead, with its own intervals.
pub fn predict(
    model: Model,
    y: &[f64],
    season: usize,
    horizon: usize,
) -> Result<Vec<Band>, ForecastError> {
    Fits::new(y, (season, 0)).predict(model, horizon)
}

/// The models fitted to one history: the MSTL models share its decomposition (a third to
/// a half of their cost).
struct Fits<'a> {
    y: &'a [f64],
    season: usize,
    /// The long season the MSTL models also decompose by (0: none).
    long: usize,
    decomposed: Option<Decomposed>,
}

impl<'a> Fits<'a> {
    /// `seasons`: samples per season and per long season (0: none).
    fn new(y: &'a [f64], (season, long): (usize, usize)) -> Self {
        Fits {
            y,
            season,
            long,
            decomposed: None,
        }
    }

    /// The long season the forecasts so far were decomposed by (0: none, or no MSTL model).
    fn long_used(&self) -> usize {
        self.decomposed.as_ref().map_or(0, |d| d.long)
    }

    fn decomposed(&mut self, model: Model) -> Result<&Decomposed, ForecastError> {
        if self.decomposed.is_none() {
            // The long season only where the history holds two of it (MSTL could not
            // estimate it from less).
            let mut periods = vec![self.season];
            if self.long > self.season && self.y.len() >= 2 * self.long + 2 {
                periods.push(self.long);
            }
            self.decomposed = Some(decompose(model, self.y, &periods)?);
        }
        self.decomposed
            .as_ref()
            .ok_or_else(|| fit_error(model, "no decomposition"))
    }

    fn predict(&mut self, model: Model, horizon: usize) -> Result<Vec<Band>, ForecastError> {
        let (y, season) = (self.y, self.season);
        if y.len() < model.min_points(season) || (model.seasonal() && season < 2) {
            return Err(ForecastError::Fit {
                model,
                message: format!(
                    "{} points are too few (it needs {})",
                    y.len(),
                    model.min_points(season)
                ),
            });
        }
        match model {
            Model::Naive => Ok(naive(y, 1, horizon)),
            Model::SeasonalNaive => Ok(naive(y, season, horizon)),
            Model::Ets => ets_on_tail(model, y, horizon),
            Model::MstlEts => {
                let d = self.decomposed(model)?;
                let mut out = ets_on_tail(model, &d.rest, horizon)?;
                d.add_season(&mut out);
                Ok(out)
            }
            Model::MstlAr => {
                let d = self.decomposed(model)?;
                let mut out = ar_rest(&d.rest, horizon);
                d.add_season(&mut out);
                Ok(out)
            }
        }
    }
}

/// A series split by MSTL: the rest (trend and remainder) and the seasonal components' last
/// cycle, which a forecast repeats.
struct Decomposed {
    /// The long season it took (0: none).
    long: usize,
    rest: Vec<f64>,
    /// The seasonal part of each step ahead, repeated after its end.
    cycle: Vec<f64>,
}

impl Decomposed {
    fn add_season(&self, out: &mut [Band]) {
        for (h, b) in out.iter_mut().enumerate() {
            let s = self.cycle[h % self.cycle.len()];
            b.mean += s;
            b.lower80 += s;
            b.upper80 += s;
            b.lower95 += s;
            b.upper95 += s;
        }
    }
}

/// Robustness passes of each STL inside MSTL: after a first fit, points far off it (a burst,
/// a saturated hour) are weighed down (bisquare weights of the remainder) and the season and
/// trend fitted again, so one day's burst does not become part of every day's season. One
/// pass costs what the plain fit's second inner loop did (robust STL takes one inner loop a
/// pass). Measured on held-out series of 14-28 days (docs/benchmarks.md): the burst family's
/// MASE 6.5 % lower at 1 h and 1.8 % at 6 h, all families 0.9 % lower at 1 h and the same at
/// 6 h, the same CPU.
const ROBUST_PASSES: usize = 1;

/// The decomposition (cheap) takes the whole history, so the season is learnt from every
/// cycle; the rest's model forecasts from its tail.
fn decompose(model: Model, y: &[f64], periods: &[usize]) -> Result<Decomposed, ForecastError> {
    decompose_with(model, y, periods, ROBUST_PASSES)
}

/// [`decompose`] with `robust` robustness passes (0: the plain fit).
fn decompose_with(
    model: Model,
    y: &[f64],
    periods: &[usize],
    robust: usize,
) -> Result<Decomposed, ForecastError> {
    let mut mstl = MSTLModel::naive(periods.to_vec());
    if robust > 0 {
        let mut stl = augurs::mstl::stlrs::StlParams::new();
        stl.robust(true).outer_loops(robust);
        let mut params = augurs::mstl::stlrs::MstlParams::new();
        params.stl_params(stl);
        mstl = mstl.mstl_params(params);
    }
    let decomposed = mstl.fit(y).map_err(|e| fit_error(model, e))?;
    let parts = decomposed.fit();
    let seasonal = parts.seasonal();
    if seasonal.len() != periods.len() {
        return Err(fit_error(model, "a seasonal component is missing"));
    }
    let rest = parts
        .trend()
        .iter()
        .zip(parts.remainder())
        .map(|(t, r)| f64::from(*t) + f64::from(*r))
        .collect();
    // Each component's own last cycle, repeated: over the longest period they add up to.
    let n = y.len();
    let longest = periods.iter().copied().max().unwrap_or(1);
    let cycle = (0..longest)
        .map(|h| {
            periods
                .iter()
                .zip(seasonal)
                .map(|(&p, s)| f64::from(s[n - p + h % p]))
                .sum()
        })
        .collect();
    Ok(Decomposed {
        long: periods.get(1).copied().unwrap_or(0),
        rest,
        cycle,
    })
}

/// ETS (a level, and a damped or straight trend where the likelihood finds one) fitted to the
/// last [`ETS_TAIL`] points of `x`: the series for ETS, MSTL's rest for MSTL-ETS. ETS weighs
/// recent points most, so a fit to the tail costs a fraction of one to weeks of history and
/// forecasts the same.
fn ets_on_tail(model: Model, x: &[f64], horizon: usize) -> Result<Vec<Band>, ForecastError> {
    let fit = ets()
        .fit(&x[x.len().saturating_sub(ETS_TAIL)..])
        .map_err(|e| fit_error(model, e))?;
    bands(model, &fit, horizon)
}

/// MSTL-AR's rest: an autoregression of order 1 to [`AR_MAX_ORDER`] with a mean, the order
/// by AIC, fitted by least squares to the last [`AR_TAIL`] points. Where ETS's level stays
/// where the last points left it, an AR's forecast returns to the mean at the rate the series
/// itself does, so a deviation that lasts hours is followed for hours and not for ever.
fn ar_rest(rest: &[f64], horizon: usize) -> Vec<Band> {
    let x = &rest[rest.len().saturating_sub(AR_TAIL)..];
    let ar = (1..=AR_MAX_ORDER)
        .filter_map(|p| Ar::fit(x, p, AR_MAX_ORDER))
        .min_by(|a, b| a.aic.total_cmp(&b.aic))
        .unwrap_or_else(|| Ar::flat(x));
    ar.forecast(x, horizon)
}

/// An AR(p) with an intercept: x_t = c + Σ φ_i x_{t−i} + e_t, Var e = σ².
#[derive(Clone, Debug)]
struct Ar {
    c: f64,
    phi: Vec<f64>,
    sigma2: f64,
    aic: f64,
}

impl Ar {
    /// Least squares on `x` from index `skip` (the same points for every order, so their AICs
    /// compare); `None` when the fit is singular or not stationary.
    fn fit(x: &[f64], p: usize, skip: usize) -> Option<Ar> {
        let k = p + 1;
        if x.len() < skip + 4 * k {
            return None;
        }
        // The normal equations of [1, x_{t−1}, …, x_{t−p}] → x_t.
        let mut a = vec![vec![0.0; k + 1]; k];
        for t in skip..x.len() {
            let row: Vec<f64> = std::iter::once(1.0)
                .chain((1..=p).map(|i| x[t - i]))
                .collect();
            for i in 0..k {
                for j in 0..k {
                    a[i][j] += row[i] * row[j];
                }
                a[i][k] += row[i] * x[t];
            }
        }
        let beta = solve(a)?;
        let (c, phi) = (beta[0], beta[1..].to_vec());
        if !stationary(&phi) {
            return None;
        }
        let n = (x.len() - skip) as f64;
        let sse: f64 = (skip..x.len())
            .map(|t| {
                let f = c + (1..=p).map(|i| phi[i - 1] * x[t - i]).sum::<f64>();
                (x[t] - f).powi(2)
            })
            .sum();
        let sigma2 = (sse / n).max(1e-18);
        Some(Ar {
            c,
            phi,
            sigma2,
            aic: n * sigma2.ln() + 2.0 * k as f64,
        })
    }

    /// The mean and the spread of `x`, without memory: what is left when no order fits.
    fn flat(x: &[f64]) -> Ar {
        let n = x.len().max(1) as f64;
        let mean = x.iter().sum::<f64>() / n;
        let sigma2 = x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
        Ar {
            c: mean,
            phi: Vec::new(),
            sigma2,
            aic: f64::INFINITY,
        }
    }

    /// `horizon` steps after `x`, the intervals from the ψ weights (Box and Jenkins: the
    /// h-step error's variance is σ² Σ_{j<h} ψ_j²).
    fn forecast(&self, x: &[f64], horizon: usize) -> Vec<Band> {
        let p = self.phi.len();
        let mut hist: Vec<f64> = x[x.len().saturating_sub(p)..].to_vec();
        let mut psi: Vec<f64> = Vec::with_capacity(horizon);
        let mut var = 0.0;
        (0..horizon)
            .map(|j| {
                let mean = self.c
                    + (1..=p)
                        .map(|i| self.phi[i - 1] * hist[hist.len() - i])
                        .sum::<f64>();
                hist.push(mean);
                let w = if j == 0 {
                    1.0
                } else {
                    (1..=p.min(j)).map(|i| self.phi[i - 1] * psi[j - i]).sum()
                };
                psi.push(w);
                var += self.sigma2 * w * w;
                let sd = var.sqrt();
                Band::normal(mean, sd)
            })
            .collect()
    }
}

/// Whether x_t = Σ φ_i x_{t−i} + e is stationary: every partial autocorrelation, found by
/// the Levinson-Durbin step-down recursion, within (−1, 1) (Box and Jenkins' condition that
/// the roots lie outside the unit circle, without finding the roots).
fn stationary(phi: &[f64]) -> bool {
    let mut a = phi.to_vec();
    while let Some(&kappa) = a.last() {
        if !kappa.is_finite() || kappa.abs() >= AR_MAX_ROOT {
            return false;
        }
        let k = a.len();
        let d = 1.0 - kappa * kappa;
        a = (0..k - 1)
            .map(|j| (a[j] + kappa * a[k - 2 - j]) / d)
            .collect();
    }
    true
}

/// Gaussian elimination with partial pivoting of an augmented k × (k+1) system.
fn solve(mut a: Vec<Vec<f64>>) -> Option<Vec<f64>> {
    let k = a.len();
    for col in 0..k {
        let pivot = (col..k).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[pivot][col].abs() < 1e-12 {
            return None;
        }
        a.swap(col, pivot);
        let top = a[col].clone();
        for row in a.iter_mut().skip(col + 1) {
            let f = row[col] / top[col];
            for (v, t) in row.iter_mut().zip(&top).skip(col) {
                *v -= f * t;
            }
        }
    }
    let mut x = vec![0.0; k];
    for row in (0..k).rev() {
        let s: f64 = (row + 1..k).map(|c| a[row][c] * x[c]).sum();
        x[row] = (a[row][k] - s) / a[row][row];
    }
    x.iter().all(|v| v.is_finite()).then_some(x)
}

/// MSTL-AR's autoregression: at most this order (enough to follow noise that lasts hours
/// under noise that does not), on the last this many points (two weeks of 5-minute samples;
/// a fit costs about a millisecond), its partial autocorrelations at most this far from ±1.
const AR_MAX_ORDER: usize = 8;
const AR_TAIL: usize = 4032;
const AR_MAX_ROOT: f64 = 0.9995;

/// The points ETS is fitted to: the most recent.
const ETS_TAIL: usize = 576;

/// Exponential smoothing with additive errors, the trend none, additive or damped, whichever
/// fits best by likelihood.
fn ets() -> AutoETS {
    // "AZN" is a valid specification: the error additive, the trend chosen, no season.
    AutoETS::new(1, "AZN").unwrap_or_else(|_| AutoETS::non_seasonal())
}

fn fit_error(model: Model, e: impl std::fmt::Display) -> ForecastError {
    ForecastError::Fit {
        model,
        message: e.to_string(),
    }
}

/// A fitted augurs model's forecast at both levels.
fn bands<P: Predict>(model: Model, fit: &P, horizon: usize) -> Result<Vec<Band>, ForecastError> {
    let f80 = fit
        .predict(horizon, LEVELS[0])
        .map_err(|e| fit_error(model, e))?;
    let f95 = fit
        .predict(horizon, LEVELS[1])
        .map_err(|e| fit_error(model, e))?;
    let (Some(i80), Some(i95)) = (f80.intervals, f95.intervals) else {
        return Err(fit_error(model, "no prediction intervals"));
    };
    let out: Vec<Band> = (0..horizon)
        .map(|h| Band {
            mean: f80.point.get(h).copied().unwrap_or(f64::NAN),
            lower80: i80.lower.get(h).copied().unwrap_or(f64::NAN),
            upper80: i80.upper.get(h).copied().unwrap_or(f64::NAN),
            lower95: i95.lower.get(h).copied().unwrap_or(f64::NAN),
            upper95: i95.upper.get(h).copied().unwrap_or(f64::NAN),
        })
        .collect();
    if out
        .iter()
        .any(|b| !b.mean.is_finite() || !b.upper95.is_finite())
    {
        return Err(fit_error(model, "the forecast is not a number"));
    }
    Ok(out)
}

/// The value `lag` steps before, repeated; the intervals from the residuals of that forecast
/// within `y`, growing with each season ahead (Hyndman and Athanasopoulos, 5.5).
fn naive(y: &[f64], lag: usize, horizon: usize) -> Vec<Band> {
    let n = y.len();
    let residuals: Vec<f64> = (lag..n).map(|t| y[t] - y[t - lag]).collect();
    let sigma = if residuals.is_empty() {
        0.0
    } else {
        (residuals.iter().map(|e| e * e).sum::<f64>() / residuals.len() as f64).sqrt()
    };
    (0..horizon)
        .map(|h| {
            let mean = y[n - lag + h % lag];
            let sd = sigma * (((h / lag) + 1) as f64).sqrt();
            Band::normal(mean, sd)
        })
        .collect()
}

/// Forecast accuracy, for tests and benchmarks.
pub mod accuracy {
    /// Mean absolute scaled error of `predicted` against `actual`, scaled by the in-sample
    /// one-step seasonal naive error of `training` (`season` 0 or 1: naive).
    pub fn mase(actual: &[f64], predicted: &[f64], training: &[f64], season: usize) -> f64 {
        let n = actual.len().min(predicted.len());
        if n == 0 {
            return f64::NAN;
        }
        let mae = actual
            .iter()
            .zip(predicted)
            .map(|(a, p)| (a - p).abs())
            .sum::<f64>()
            / n as f64;
        mae / super::mase_scale(training, season)
    }

    /// Symmetric mean absolute percentage error, in percent.
    pub fn smape(actual: &[f64], predicted: &[f64]) -> f64 {
        let terms: Vec<f64> = actual
            .iter()
            .zip(predicted)
            .map(|(a, p)| {
                let d = a.abs() + p.abs();
                if d == 0.0 {
                    0.0
                } else {
                    2.0 * (a - p).abs() / d
                }
            })
            .collect();
        if terms.is_empty() {
            f64::NAN
        } else {
            100.0 * terms.iter().sum::<f64>() / terms.len() as f64
        }
    }
}

#[cfg(test)]
mod tests;
