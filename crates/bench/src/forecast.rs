//! `forecast-accuracy`: how well Orrery's forecaster predicts simulated members' load.
//!
//! Series come from the sim's own load profiles (`orrery_sim::profile_factor`,
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

use orrery_forecast::{Settings, accuracy, predict};
use orrery_sim::{SimSpec, profile_factor};
use serde_json::json;

use crate::stats::{emit, percentile, progress, round};

#[derive(Debug)]
pub struct ForecastArgs {
    pub seed: u64,
    /// Seasons of history before the first origin.
    pub history: usize,
    /// Seasons forecast, one origin an hour.
    pub test: usize,
    /// Points each forecast is made from (the newest), when not all.
    pub window: Option<usize>,
    /// Hours between two choices of a series' model.
    pub choose_every: usize,
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
            let mut current: Option<(usize, orrery_forecast::Choice)> = None;
            for origin in (first..n.saturating_sub(h)).step_by(12) {
                let past = &y[args.window.map_or(0, |w| origin.saturating_sub(w))..origin];
                let next = &y[origin..origin + h];
                // The model is chosen again every `choose_every` hours (an origin is an hour).
                let choice = match &current {
                    Some((at, c)) if origin - at < args.choose_every.max(1) * 12 => c.clone(),
                    _ => {
                        let started = Instant::now();
                        let c = orrery_forecast::choose(past, h, &settings)?;
                        choose_secs.push(started.elapsed().as_secs_f64());
                        current = Some((origin, c.clone()));
                        c
                    }
                };
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
                "window_points": args.window,
                "choose_every_hours": args.choose_every,
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

#[derive(Debug)]
pub struct LoadArgs {
    pub clusters: usize,
    pub days: usize,
    /// Clusters whose rounds are timed (the cost per series is the same for any number).
    pub timed: usize,
    /// The forecaster's budget for its history.
    pub history_bytes: usize,
}

/// A fleet sample of the server's 5-minute averages: every cluster's cpu, memory, gpu and
/// pods levels (diurnal with lasting noise, phases spread) and its traffic.
fn fleet_sample(
    clusters: usize,
    step: usize,
    seed: u64,
) -> orrery_api::history::series::FleetSample {
    use orrery_api::history::series::{ClusterSample, FleetSample};
    let spec: SimSpec = "profile=diurnal,period=24h,noise=0.05"
        .parse()
        .unwrap_or_default();
    let at = STEP * step as u32;
    let clusters = (0..clusters)
        .map(|c| {
            // Each cluster its own phase (a region) and noise.
            let shift = Duration::from_secs((c as u64 % 24) * 3600);
            let level = 0.4 * profile_factor(&spec, seed ^ c as u64, at + shift);
            let levels = [
                ("cpu".to_string(), level),
                ("memory".to_string(), 0.8 * level + 0.1),
                ("gpu".to_string(), 0.5 * level),
                ("pods".to_string(), 0.3 * level),
            ]
            .into();
            (
                format!("member-{c:04}"),
                ClusterSample {
                    ready: true,
                    level,
                    levels,
                    traffic: 1e6 * level,
                    ..Default::default()
                },
            )
        })
        .collect();
    FleetSample {
        time: orrery_api::Time::from_unix_seconds(1_800_000_000 + 300 * step as i64)
            .unwrap_or(orrery_api::Time::now()),
        clusters,
    }
}

/// What forecasting a fleet costs the server: the memory its forecaster holds for `clusters`
/// clusters × 5 series with `days` of 5-minute history, and the CPU of its rounds (a model
/// chosen hourly per series, a forecast every 5 minutes), from the server's own forecaster
/// (`orrery_controllers::forecasting::Forecaster`).
pub fn forecast_load(args: LoadArgs) -> anyhow::Result<()> {
    use orrery_controllers::forecasting::{ForecastConfig, Forecaster};
    let points = args.days * SEASON;
    let config = ForecastConfig {
        history_bytes: args.history_bytes,
        ..Default::default()
    };
    let raw = Duration::from_secs(15);
    let before = crate::stats::rss_mib();
    let mut f = Forecaster::new(config.clone(), raw, STEP);
    progress(format!(
        "forecast-load: {} clusters, {} days of history",
        args.clusters, args.days
    ));
    for step in 0..points {
        f.push(&fleet_sample(args.clusters, step, 1));
    }
    let held = crate::stats::rss_mib() - before;
    let kept = f.points_held();
    let choose_every = f.choose_every_seconds() as f64;
    drop(f);
    // Rounds over a few clusters: the first chooses every series' model and forecasts, the
    // next only forecasts. Their budget is the fleet's share, so that each series holds what
    // the whole fleet's would.
    let timed_config = ForecastConfig {
        history_bytes: (config.history_bytes / args.clusters.max(1)).saturating_mul(args.timed),
        ..config
    };
    let mut t = Forecaster::new(timed_config, raw, STEP);
    for step in 0..points {
        t.push(&fleet_sample(args.timed, step, 1));
    }
    let series = (args.timed * 5) as f64;
    let cpu = cpu_now();
    let started = Instant::now();
    let first = t.forecast_all();
    let choose_and_forecast = cpu_now() - cpu;
    let first_wall = started.elapsed().as_secs_f64();
    t.push(&fleet_sample(args.timed, points, 1));
    let cpu = cpu_now();
    let next = t.forecast_all();
    let forecast_only = cpu_now() - cpu;
    let record_bytes = first
        .first()
        .map(|c| serde_json::to_vec(c).map(|v| v.len()).unwrap_or(0))
        .unwrap_or(0);
    let per_series_forecast = forecast_only / series;
    let per_series_choice = (choose_and_forecast - forecast_only).max(0.0) / series;
    let n = (args.clusters * 5) as f64;
    emit(json!({
        "scenario": "forecast-load",
        "clusters": args.clusters,
        "series": args.clusters * 5,
        "history_days": args.days,
        "history_points_per_series": points,
        "history_budget_mib": args.history_bytes >> 20,
        "history_points_kept": kept,
        "timed_points_kept": t.points_held(),
        "memory_mib": round(held, 1),
        "timed_clusters": args.timed,
        "forecasts_made": first.len() + next.len(),
        "choose_ms_per_series": round(per_series_choice * 1000.0, 2),
        "forecast_ms_per_series": round(per_series_forecast * 1000.0, 2),
        "first_round_wall_seconds_timed": round(first_wall, 2),
        // Steady: each series' model chosen again as often as the fleet's forecaster does, a
        // forecast every 5 minutes.
        "choose_every_seconds": choose_every,
        "cpu_seconds_per_minute": round(n * (per_series_choice * 60.0 / choose_every.max(1.0) + per_series_forecast / 5.0), 1),
        // At start every model is chosen at once.
        "cpu_seconds_first_round": round(n * (per_series_choice + per_series_forecast), 0),
        "record_bytes_per_cluster": record_bytes,
        "written_bytes_per_minute": record_bytes * args.clusters / 5,
    }));
    Ok(())
}

/// This process's CPU seconds so far (user and system).
fn cpu_now() -> f64 {
    crate::stats::process_usage(std::process::id()).2
}
