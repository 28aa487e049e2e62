//! `forecast-accuracy`: how well Orrery's forecaster predicts simulated members' load.
//!
//! Series come from the sim's own load profiles (`orrery_agent::backend::sim::profile_factor`,
//! the function a simulated member's background load follows), one family each: diurnal,
//! diurnal with a trend, spikes, and flat with noise, all with noise on top, sampled every
//! 5 minutes over a 1-day season. With `history` seasons behind it, each origin of the next
//! `test` seasons (one an hour) is forecast `h` steps ahead by the model Orrery chooses, by
//! naive (the last value) and by seasonal naive (a day before). Reported per family and
//! horizon: MASE and sMAPE of each, the chosen model's MASE over the seasonal naive's, the
//! share of truths inside its 80 % and 95 % bands, which models it chose, the time choosing
//! a model and forecasting with it take, and what forecasting 1,000 clusters × 5 series would
//! cost a core.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use orrery_agent::backend::sim::{SimSpec, profile_factor};
use orrery_forecast::{Settings, accuracy, predict};
use serde_json::json;

use crate::stats::{emit, percentile, progress, round};

#[derive(Debug)]
pub struct ForecastArgs {
    pub seed: u64,
    /// Seasons of history before the first origin.
    pub history: usize,
    /// Seasons forecast, one origin an hour.
    pub test: usize,
}

/// Samples per day (5-minute steps).
const SEASON: usize = 288;
const STEP: Duration = Duration::from_secs(300);

/// The families of series: (name, the sim's SPEC).
const FAMILIES: [(&str, &str); 4] = [
    ("diurnal", "profile=diurnal,period=24h,noise=0.05"),
    (
        "diurnal-trend",
        "profile=diurnal,period=24h,trend=0.03,noise=0.05",
    ),
    ("spikes", "profile=spikes,period=24h,noise=0.05"),
    ("flat-noise", "profile=flat,period=24h,noise=0.1"),
];

/// A member's water level every 5 minutes: a base load of 0.4 times its profile.
fn series(spec: &SimSpec, seed: u64, n: usize) -> Vec<f64> {
    (0..n)
        .map(|i| 0.4 * profile_factor(spec, seed, STEP * i as u32))
        .collect()
}

pub fn forecast_accuracy(args: ForecastArgs) -> anyhow::Result<()> {
    let settings = Settings {
        season: Some(SEASON),
        ..Default::default()
    };
    for (family, spec) in FAMILIES {
        let spec: SimSpec = spec.parse().map_err(anyhow::Error::msg)?;
        let n = (args.history + args.test) * SEASON;
        let y = series(&spec, args.seed, n);
        for (label, h) in [("1h", 12usize), ("6h", 72)] {
            progress(format!("forecast-accuracy: {family}, {label} ahead"));
            let mut chosen = Vec::new();
            let mut mase = BTreeMap::<&str, Vec<f64>>::new();
            let mut smape = BTreeMap::<&str, Vec<f64>>::new();
            let mut models = BTreeMap::<String, usize>::new();
            let (mut in80, mut in95, mut total) = (0usize, 0usize, 0usize);
            let mut seconds = Vec::new();
            let mut choose_secs = Vec::new();
            let first = args.history * SEASON;
            for origin in (first..n.saturating_sub(h)).step_by(12) {
                let past = &y[..origin];
                let next = &y[origin..origin + h];
                let started = Instant::now();
                let choice = orrery_forecast::choose(past, h, &settings)?;
                choose_secs.push(started.elapsed().as_secs_f64());
                let started = Instant::now();
                let f = orrery_forecast::forecast_with(&choice, past, h, &settings)?;
                seconds.push(started.elapsed().as_secs_f64());
                *models.entry(f.model.name().to_string()).or_default() += 1;
                let mean: Vec<f64> = f.points.iter().map(|p| p.mean).collect();
                let naive: Vec<f64> = predict(orrery_forecast::Model::Naive, past, 0, h)?
                    .iter()
                    .map(|p| p.mean)
                    .collect();
                let snaive: Vec<f64> =
                    predict(orrery_forecast::Model::SeasonalNaive, past, SEASON, h)?
                        .iter()
                        .map(|p| p.mean)
                        .collect();
                for (name, pred) in [
                    ("chosen", &mean),
                    ("naive", &naive),
                    ("seasonal_naive", &snaive),
                ] {
                    mase.entry(name)
                        .or_default()
                        .push(accuracy::mase(next, pred, past, SEASON));
                    smape
                        .entry(name)
                        .or_default()
                        .push(accuracy::smape(next, pred));
                }
                for (p, a) in f.points.iter().zip(next) {
                    total += 1;
                    in80 += usize::from(p.lower80 <= *a && *a <= p.upper80);
                    in95 += usize::from(p.lower95 <= *a && *a <= p.upper95);
                }
                chosen.push(f.model);
            }
            let mean_of = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
            let m = |k: &str| mean_of(mase.get(k).map_or(&[][..], Vec::as_slice));
            let s = |k: &str| mean_of(smape.get(k).map_or(&[][..], Vec::as_slice));
            emit(json!({
                "scenario": "forecast-accuracy",
                "seed": args.seed,
                "family": family,
                "horizon": label,
                "origins": chosen.len(),
                "history_seasons": args.history,
                "mase": {"chosen": round(m("chosen"), 3), "naive": round(m("naive"), 3), "seasonal_naive": round(m("seasonal_naive"), 3)},
                "smape_percent": {"chosen": round(s("chosen"), 2), "naive": round(s("naive"), 2), "seasonal_naive": round(s("seasonal_naive"), 2)},
                "chosen_vs_seasonal_naive": round(m("chosen") / m("seasonal_naive").max(1e-12), 3),
                "coverage80": round(in80 as f64 / total.max(1) as f64, 3),
                "coverage95": round(in95 as f64 / total.max(1) as f64, 3),
                "models": models,
                "choose_ms_p50": round(percentile(&choose_secs, 50.0) * 1000.0, 1),
                "forecast_ms_p50": round(percentile(&seconds, 50.0) * 1000.0, 1),
                "forecast_ms_p95": round(percentile(&seconds, 95.0) * 1000.0, 1),
                // 1,000 clusters × 5 series on 5-minute averages: each series chosen again
                // every hour and forecast every 5 minutes (when a new average is in).
                "cpu_seconds_per_minute_1000x5": round(
                    5000.0 * (mean_of(&choose_secs) / 60.0 + mean_of(&seconds) / 5.0),
                    1
                ),
            }));
        }
    }
    Ok(())
}
