//! Forecasts of the fleet's time series (the draft's Predictive Algorithms, 3.1 and 5.1):
//! given one series sampled at a fixed step, where it goes next, with 80 % and 95 %
//! prediction intervals.
//!
//! - **Models.** Naive (the last value), seasonal naive (the value one season ago), ETS
//!   (exponential smoothing, the best of its error/trend forms by likelihood) and MSTL-ETS
//!   (the series less its seasonal component, forecast by simple exponential smoothing fitted
//!   to its errors a few steps ahead, the season added back). ETS and
//!   MSTL are Grafana's `augurs`; the two naive models are a line each.
//! - **Choice.** Each series gets the model that forecast its own recent past best: a rolling
//!   backtest over its last few horizons, scored by MASE (the error over that of the seasonal
//!   naive one step ahead in the training data), so a flat series keeps naive and a daily
//!   cycle gets MSTL.
//! - **Season.** Given (samples per season), or found in the series by its autocorrelation.
//! - **Intervals.** The chosen model's own, each widened or narrowed by the factor that makes
//!   it cover the backtest's errors as often as it says (so an 80 % band holds about 80 % of
//!   what follows).
//!
//! No clock and no I/O: the same history gives the same forecast.

use augurs::ets::AutoETS;
use augurs::ets::model::{
    ErrorComponent, ModelType, OptimizationCriteria, SeasonalComponent, TrendComponent,
    Unfit as ModelUnfit,
};
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
}

impl Model {
    pub const ALL: [Model; 4] = [
        Model::Naive,
        Model::SeasonalNaive,
        Model::Ets,
        Model::MstlEts,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Model::Naive => "naive",
            Model::SeasonalNaive => "seasonal-naive",
            Model::Ets => "ets",
            Model::MstlEts => "mstl-ets",
        }
    }

    fn seasonal(self) -> bool {
        matches!(self, Model::SeasonalNaive | Model::MstlEts)
    }

    /// The fewest points it fits on.
    fn min_points(self, season: usize) -> usize {
        match self {
            Model::Naive => 2,
            Model::Ets => 10,
            Model::SeasonalNaive => season + 2,
            Model::MstlEts => 2 * season + 2,
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
    pub model: Model,
    /// Samples per season (0: none).
    pub season: usize,
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
    /// The shortest and longest season looked for, in samples.
    pub season_range: (usize, usize),
    /// Backtest folds: each forecasts one horizon from a point further back.
    pub folds: usize,
    /// Folds the chosen model's intervals are calibrated on (at least `folds`): a load's
    /// deviations last, so the errors within one fold are alike, and three folds say little
    /// of how wide the band must be.
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
            season_range: (4, 2048),
            folds: 3,
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
/// with the choice, one).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Choice {
    pub model: Model,
    /// Samples per season (0: none).
    pub season: usize,
    /// The model's mean MASE over the backtest; `None` when the history was too short.
    pub backtest_mase: Option<f64>,
    /// The factor its intervals are scaled by to cover the backtest's errors.
    pub interval_scale: f64,
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

/// Chooses the model for `y` by a rolling backtest `horizon` steps ahead.
pub fn choose(y: &[f64], horizon: usize, settings: &Settings) -> Result<Choice, ForecastError> {
    check(y)?;
    let horizon = horizon.max(1);
    let season = settings
        .season
        .filter(|s| *s >= 2)
        .or_else(|| detect_season(y, settings.season_range.0, settings.season_range.1))
        .unwrap_or(0);
    let scale = mase_scale(y, season);
    let mut best: Option<(Model, Backtest)> = None;
    for &m in &settings.candidates {
        if m.seasonal() && season < 2 {
            continue;
        }
        let Some(b) = backtest(m, y, season, horizon, settings.folds, scale) else {
            continue;
        };
        if best.as_ref().is_none_or(|(_, bb)| b.mase < bb.mase) {
            best = Some((m, b));
        }
    }
    Ok(match best {
        Some((model, b)) => {
            // The intervals from more folds than the choice was made on (the model that won
            // the choice also looks better on its own folds than it will do next).
            let calibrated = (settings.calibration_folds > settings.folds)
                .then(|| backtest(model, y, season, horizon, settings.calibration_folds, scale))
                .flatten()
                .unwrap_or(b.clone());
            Choice {
                model,
                season,
                backtest_mase: Some(b.mase),
                interval_scale: calibrated.interval_scale(),
            }
        }
        // Too short to backtest: the simplest model that fits.
        None => Choice {
            model: if season >= 2 && y.len() >= Model::SeasonalNaive.min_points(season) {
                Model::SeasonalNaive
            } else {
                Model::Naive
            },
            season,
            backtest_mase: None,
            interval_scale: 1.0,
        },
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
    let mut points = predict(choice.model, y, choice.season, horizon.max(1))?;
    for p in points.iter_mut() {
        p.widen(choice.interval_scale);
        if settings.non_negative {
            p.clamp_at_zero();
        }
    }
    Ok(Forecast {
        model: choice.model,
        season: choice.season,
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

/// What a model's backtest found.
#[derive(Clone, Debug)]
struct Backtest {
    mase: f64,
    /// Each held-out point's error over the half-width of its 80 % band.
    ratios: Vec<f64>,
}

impl Backtest {
    /// The factor that makes the 80 % band hold 80 % of the backtest's points, within
    /// reason (a band is never made more than 4 times wider or narrower).
    fn interval_scale(&self) -> f64 {
        if self.ratios.len() < 10 {
            return 1.0;
        }
        let mut r = self.ratios.clone();
        r.sort_by(f64::total_cmp);
        let k = r[((r.len() as f64 * 0.8).ceil() as usize).min(r.len()) - 1];
        if k.is_finite() && k > 0.0 {
            k.clamp(0.25, 4.0)
        } else {
            1.0
        }
    }
}

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

/// `model`'s rolling-origin backtest over the last `folds` horizons of `y`.
fn backtest(
    model: Model,
    y: &[f64],
    season: usize,
    horizon: usize,
    folds: usize,
    scale: f64,
) -> Option<Backtest> {
    let mut errors = 0.0;
    let mut count = 0usize;
    let mut ratios = Vec::new();
    for k in (1..=folds.max(1)).rev() {
        // Folds reaching back before the model's first fit are left out.
        let Some(end) = y.len().checked_sub(k * horizon) else {
            continue;
        };
        if end < model.min_points(season) {
            continue;
        }
        let held = &y[end..(end + horizon).min(y.len())];
        let Ok(bands) = predict(model, &y[..end], season, held.len()) else {
            continue;
        };
        for (b, actual) in bands.iter().zip(held) {
            errors += (actual - b.mean).abs();
            count += 1;
            let half = (b.upper80 - b.mean).max(1e-12);
            ratios.push((actual - b.mean).abs() / half);
        }
    }
    (count > 0).then(|| Backtest {
        mase: errors / count as f64 / scale,
        ratios,
    })
}

/// `model` fitted to `y`, `horizon` steps ahead, with its own intervals.
pub fn predict(
    model: Model,
    y: &[f64],
    season: usize,
    horizon: usize,
) -> Result<Vec<Band>, ForecastError> {
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
        // ETS weighs recent points most; fitted to the last ETS_TAIL it costs a fraction of a
        // fit to weeks of history and forecasts the same.
        Model::Ets => {
            let fit = ets()
                .fit(&y[y.len().saturating_sub(ETS_TAIL)..])
                .map_err(|e| fit_error(model, e))?;
            bands(model, &fit, horizon)
        }
        Model::MstlEts => {
            // The decomposition (cheap) takes the whole history, so the season is learnt
            // from every cycle; ETS forecasts the rest from its tail.
            let decomposed = MSTLModel::naive(vec![season])
                .fit(y)
                .map_err(|e| fit_error(model, e))?;
            let parts = decomposed.fit();
            let seasonal = parts
                .seasonal()
                .first()
                .ok_or_else(|| fit_error(model, "no seasonal component"))?;
            let rest: Vec<f64> = parts
                .trend()
                .iter()
                .zip(parts.remainder())
                .map(|(t, r)| f64::from(*t) + f64::from(*r))
                .collect();
            // The rest is a level and noise; its smoothing is fitted to the errors of the
            // forecasts a few steps ahead, not of the next step alone: a level that chases the last few points (what likelihood picks when the
            // noise lingers a while) forecasts an hour ahead no better than seasonal naive.
            let fit = ModelUnfit::new(ModelType {
                error: ErrorComponent::Additive,
                trend: TrendComponent::None,
                season: SeasonalComponent::None,
            })
            .opt_crit(OptimizationCriteria::AMSE)
            .nmse(horizon.clamp(1, AMSE_STEPS))
            .max_iterations(AMSE_ITERATIONS)
            .fit(&rest[rest.len().saturating_sub(AMSE_TAIL)..])
            .map_err(|e| fit_error(model, e))?;
            let mut out = bands(model, &fit, horizon)?;
            let n = seasonal.len();
            for (h, b) in out.iter_mut().enumerate() {
                let s = f64::from(seasonal[n - season + h % season]);
                b.mean += s;
                b.lower80 += s;
                b.upper80 += s;
                b.lower95 += s;
                b.upper95 += s;
            }
            Ok(out)
        }
    }
}

/// The points ETS is fitted to: the most recent.
const ETS_TAIL: usize = 576;
/// The multi-step fit of MSTL-ETS's rest costs its points × steps × iterations: these keep a
/// fit to a few milliseconds.
const AMSE_TAIL: usize = 288;
const AMSE_STEPS: usize = 6;
const AMSE_ITERATIONS: usize = 300;

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
            Band {
                mean,
                lower80: mean - Z80 * sd,
                upper80: mean + Z80 * sd,
                lower95: mean - Z95 * sd,
                upper95: mean + Z95 * sd,
            }
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
