//! What forecasting costs a series in the steady state, as the server spends it: a choice an
//! hour (`choose`; every two hours once the history holds the long season's backtest, as the
//! server's `Forecaster::choose_after`) and a forecast every 5 minutes (`forecast_with`), 6 hours ahead, on the
//! newest `WINDOW` samples of each series of a `series_id,timestamp,value` CSV
//! (`crates/bench/peers/make_series.py`). CPU is the thread's own (`/proc/thread-self/schedstat`).
//!
//! ```sh
//! cargo run --release -p orrery-forecast --example steady_cpu -- FILE.csv WINDOW HOURS [LONG]
//! ```
//! `LONG`: samples per long season (the server's: 2016, a week of 5-minute samples; 0 none).
//! The same file builds against older versions of the crate (the side-by-side runs of
//! docs/benchmarks.md): for one without the long season, drop the `long_season` line (its
//! window is then never long enough for the two-hourly choice).

use std::collections::BTreeMap;
use std::time::Duration;

use orrery_forecast::{Settings, choose, forecast_with};

const SEASON: usize = 288;
const HORIZON: usize = 72;
/// Samples (and forecasts, one a sample) an hour.
const HOUR: usize = 12;
/// Hours a choice on history that holds the long season's backtest stands.
const LONG_EVERY: usize = 2;

fn cpu() -> Duration {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    let ns = text
        .split_whitespace()
        .next()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    Duration::from_nanos(ns)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 {
        return Err("usage: steady_cpu FILE.csv WINDOW HOURS [LONG]".into());
    }
    let window: usize = args[2].parse()?;
    let hours: usize = args[3].parse()?;
    let long: usize = match args.get(4) {
        Some(v) => v.parse()?,
        None => 2016,
    };
    let text = std::fs::read_to_string(&args[1])?;
    let mut series: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for line in text.lines().skip(1) {
        let mut f = line.split(',');
        let (Some(id), Some(_), Some(v)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if let Ok(v) = v.trim().parse::<f64>() {
            series.entry(id.to_string()).or_default().push(v);
        }
    }
    let settings = Settings {
        season: Some(SEASON),
        long_season: (long > 0).then_some(long),
        ..Default::default()
    };
    let (mut choose_cpu, mut forecast_cpu) = (Duration::ZERO, Duration::ZERO);
    let (mut chosen, mut forecasts, mut series_hours) = (0usize, 0usize, 0usize);
    for y in series.values() {
        // The last `hours` hours of the file, each from its own window of history, a choice
        // made when the last one's time is up.
        let mut standing = None;
        for hour in (0..hours).rev() {
            let Some(end) = y.len().checked_sub((hour + 1) * HOUR) else {
                continue;
            };
            let Some(start) = end.checked_sub(window) else {
                continue;
            };
            let (choice, left) = match standing.take() {
                Some((c, left)) if left > 0 => (c, left),
                _ => {
                    let t = cpu();
                    let Ok(c) = choose(&y[start..end], HORIZON.min(SEASON), &settings) else {
                        continue;
                    };
                    choose_cpu += cpu() - t;
                    chosen += 1;
                    // Settings::default().folds: the example builds against older crates.
                    let week = long > 0 && end - start >= 2 * long + 2 + settings.folds * HORIZON;
                    let every = if week { LONG_EVERY } else { 1 };
                    (c, every)
                }
            };
            series_hours += 1;
            // The hour's forecasts, each from the window one more sample on.
            for k in 0..HOUR {
                let t = cpu();
                let _ = forecast_with(&choice, &y[start + k..end + k], HORIZON, &settings);
                forecast_cpu += cpu() - t;
                forecasts += 1;
            }
            standing = Some((choice, left - 1));
        }
    }
    let per = |d: Duration, n: usize| d.as_secs_f64() * 1000.0 / n.max(1) as f64;
    let (c, f) = (per(choose_cpu, chosen), per(forecast_cpu, forecasts));
    let hourly = per(choose_cpu + forecast_cpu, series_hours);
    println!(
        "{{\"file\":{:?},\"window\":{window},\"long_season\":{long},\"choices\":{chosen},\"forecasts\":{forecasts},\"series_hours\":{series_hours},\"ms_per_choice\":{c:.2},\"ms_per_forecast\":{f:.2},\"ms_per_series_hour\":{hourly:.1}}}",
        args[1]
    );
    Ok(())
}
