//! `forecast-accuracy --input FILE.csv`: Orrery's forecaster on series a user brings (a CSV of
//! `series_id,timestamp,value`, a header line optional, timestamps RFC 3339 or unix seconds,
//! evenly spaced per series), called as the server calls it: a model chosen by the series'
//! own backtest over the largest horizon, one forecast that far, each horizon scored on its
//! first points.
//!
//! The protocol is `crates/bench/peers/run_statsforecast.py`'s, so that a peer is measured on
//! the same file and origins: for a series of `n` points and `H` the largest horizon, origins
//! `o_k = n − H − k·stride` for `k < origins` (those with two seasons of history before them),
//! the history `y[..o_k]`, the truth `y[o_k..o_k+h]`. MASE is scaled by the training data's
//! one-step seasonal naive error; sMAPE in percent; coverage is the share of truths inside
//! the 80 % (and 95 %) band. Seasonal naive is scored in the same run, as the baseline.
//! Reported per horizon for all series and per family (the series id up to its last `-`),
//! with the models chosen and the time a forecast takes (choice included; one thread).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use orrery_forecast::{Model, Settings, accuracy, predict};
use serde_json::json;

use crate::stats::{emit, progress, round};

#[derive(Debug)]
pub struct InputArgs {
    pub path: PathBuf,
    pub origins: usize,
    pub stride: usize,
    /// Samples per season (`None`: a day of the file's step).
    pub season: Option<usize>,
    /// Samples per long season (`None`: 7 seasons; 0: none).
    pub long_season: Option<usize>,
    /// Horizons in steps, the largest last.
    pub horizons: Vec<usize>,
    /// The model at every origin instead of the chosen one (an ablation).
    pub fixed: Option<Model>,
    /// Only the first this many series.
    pub limit: Option<usize>,
    /// Hours between two choices, as the server makes them: the model at an origin is the
    /// one chosen at the last multiple of this since the series' first sample (`None`: chosen
    /// at every origin, on the history up to it).
    pub choose_every_hours: Option<usize>,
}

/// A series from the file.
#[derive(Debug)]
struct Series {
    id: String,
    /// Seconds between points.
    step: i64,
    y: Vec<f64>,
}

/// A timestamp as unix seconds: RFC 3339, or a number of seconds.
fn seconds(s: &str) -> Option<i64> {
    if let Ok(x) = s.parse::<f64>() {
        return x.is_finite().then_some(x.round() as i64);
    }
    s.parse::<orrery_api::Time>().ok().map(|t| t.unix_seconds())
}

/// Reads the CSV: series in the order they first appear, each sorted by time and checked.
fn read(path: &PathBuf) -> anyhow::Result<Vec<Series>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path:?}"))?;
    let mut by: BTreeMap<String, (usize, Vec<(i64, f64)>)> = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        if f.len() != 3 {
            bail!("{path:?} line {}: want series_id,timestamp,value", i + 1);
        }
        let (Some(t), Ok(v)) = (seconds(f[1]), f[2].parse::<f64>()) else {
            if i == 0 {
                continue; // the header
            }
            bail!(
                "{path:?} line {}: {:?} is not a time and a number",
                i + 1,
                line
            );
        };
        if !v.is_finite() {
            bail!("{path:?} line {}: the value is not a number", i + 1);
        }
        let n = by.len();
        by.entry(f[0].to_string())
            .or_insert((n, Vec::new()))
            .1
            .push((t, v));
    }
    let mut out: Vec<(usize, Series)> = Vec::new();
    for (id, (order, mut points)) in by {
        points.sort_by_key(|p| p.0);
        if points.len() < 3 {
            bail!("series {id:?} has {} points", points.len());
        }
        let step = points[1].0 - points[0].0;
        if let Some(w) = points.windows(2).find(|w| w[1].0 - w[0].0 != step) {
            bail!(
                "series {id:?} is not evenly spaced: {} s between {} and {} (its step is {step} s); \
                 fill its gaps first",
                w[1].0 - w[0].0,
                w[0].0,
                w[1].0
            );
        }
        if step <= 0 {
            bail!("series {id:?} has two points at one time");
        }
        let y = points.into_iter().map(|p| p.1).collect();
        out.push((order, Series { id, step, y }));
    }
    out.sort_by_key(|(o, _)| *o);
    Ok(out.into_iter().map(|(_, s)| s).collect())
}

fn family_of(id: &str) -> &str {
    id.rsplit_once('-').map_or(id, |(f, _)| f)
}

/// What the origins add up to, per (family, horizon).
#[derive(Default)]
struct Scores {
    mase: Vec<f64>,
    mase_snaive: Vec<f64>,
    smape: Vec<f64>,
    in80: usize,
    in95: usize,
    points: usize,
    models: BTreeMap<&'static str, usize>,
    /// Origins forecast with the long season.
    long: usize,
    ms: Vec<f64>,
}

pub fn run(args: InputArgs) -> anyhow::Result<()> {
    let mut series = read(&args.path)?;
    if let Some(l) = args.limit {
        series.truncate(l);
    }
    let hmax = *args.horizons.iter().max().unwrap_or(&72);
    let mut scores: BTreeMap<(String, usize), Scores> = BTreeMap::new();
    for (i, s) in series.iter().enumerate() {
        let season = args
            .season
            .unwrap_or((86_400 / s.step.max(1)).max(2) as usize);
        let long = args.long_season.unwrap_or(7 * season);
        let settings = Settings {
            season: Some(season),
            long_season: (long > 0).then_some(long),
            ..Default::default()
        };
        progress(format!(
            "forecast-accuracy --input: {} ({}/{})",
            s.id,
            i + 1,
            series.len()
        ));
        let n = s.y.len();
        for k in 0..args.origins {
            let Some(o) = n.checked_sub(hmax + k * args.stride) else {
                continue;
            };
            if o < 2 * season {
                continue;
            }
            let (past, next) = (&s.y[..o], &s.y[o..o + hmax]);
            let started = Instant::now();
            let f = match args.fixed {
                Some(m) => {
                    let choice = orrery_forecast::Choice {
                        long_season: long,
                        ..orrery_forecast::Choice::of(m, season)
                    };
                    orrery_forecast::forecast_with(&choice, past, hmax, &settings)?
                }
                // As the server: chosen by a backtest over the horizon (at most a season), on
                // the history at the last choice.
                None => {
                    let at = chosen_at(o, args.choose_every_hours, s.step);
                    let choice = orrery_forecast::choose(&s.y[..at], hmax.min(season), &settings)?;
                    orrery_forecast::forecast_with(&choice, past, hmax, &settings)?
                }
            };
            let ms = started.elapsed().as_secs_f64() * 1000.0;
            let snaive = predict(Model::SeasonalNaive, past, season, hmax)?;
            for &h in &args.horizons {
                let mean: Vec<f64> = f.points[..h].iter().map(|p| p.mean).collect();
                let base: Vec<f64> = snaive[..h].iter().map(|p| p.mean).collect();
                for fam in [family_of(&s.id).to_string(), "all".to_string()] {
                    let sc = scores.entry((fam, h)).or_default();
                    sc.mase
                        .push(accuracy::mase(&next[..h], &mean, past, season));
                    sc.mase_snaive
                        .push(accuracy::mase(&next[..h], &base, past, season));
                    sc.smape.push(accuracy::smape(&next[..h], &mean));
                    for (p, a) in f.points[..h].iter().zip(&next[..h]) {
                        sc.points += 1;
                        sc.in80 += usize::from(p.lower80 <= *a && *a <= p.upper80);
                        sc.in95 += usize::from(p.lower95 <= *a && *a <= p.upper95);
                    }
                    *sc.models.entry(f.model.name()).or_default() += 1;
                    sc.long += usize::from(f.long_season > 0);
                    sc.ms.push(ms);
                }
            }
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    for ((family, h), sc) in &scores {
        let step = series.first().map_or(300, |s| s.step);
        emit(json!({
            "scenario": "forecast-accuracy-input",
            "input": args.path.display().to_string(),
            "model": args.fixed.map_or("orrery", Model::name),
            "family": family,
            "horizon": format!("{}m", *h as i64 * step / 60),
            "horizon_steps": h,
            "origins": sc.mase.len(),
            "mase": round(mean(&sc.mase), 4),
            "mase_seasonal_naive": round(mean(&sc.mase_snaive), 4),
            "vs_seasonal_naive": round(mean(&sc.mase) / mean(&sc.mase_snaive).max(1e-12), 3),
            "smape_percent": round(mean(&sc.smape), 2),
            "coverage80": round(sc.in80 as f64 / sc.points.max(1) as f64, 3),
            "coverage95": round(sc.in95 as f64 / sc.points.max(1) as f64, 3),
            "models": sc.models,
            "long_season_origins": sc.long,
            "ms_per_forecast": round(mean(&sc.ms), 2),
            "choose_every_hours": args.choose_every_hours,
        }));
    }
    Ok(())
}

/// Where the choice an origin `o` forecasts with was made: `o` itself, or the last multiple
/// of `every` hours (of samples `step` seconds apart) at or before it, never before the
/// second sample.
fn chosen_at(o: usize, every_hours: Option<usize>, step: i64) -> usize {
    let Some(h) = every_hours.filter(|h| *h > 0) else {
        return o;
    };
    let every = (h as i64 * 3600 / step.max(1)).max(1) as usize;
    (o - o % every).max(2.min(o))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.csv");
        std::fs::write(&p, text).unwrap();
        (dir, p)
    }

    #[test]
    fn a_csv_is_read_per_series_in_time_order_and_gaps_are_refused() {
        let (_d, p) = file(
            "series_id,timestamp,value\nb-1,600,2\na-1,2026-01-01T00:00:00Z,1\nb-1,0,0\nb-1,300,1\n\
             a-1,2026-01-01T00:05:00Z,2\na-1,2026-01-01T00:10:00Z,3\n",
        );
        let s = read(&p).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].id.as_str(), s[0].step), ("b-1", 300));
        assert_eq!(s[0].y, vec![0.0, 1.0, 2.0]);
        assert_eq!(s[1].y, vec![1.0, 2.0, 3.0]);
        assert_eq!(family_of("twopeak-3"), "twopeak");
        let (_d, p) = file("a,0,1\na,300,1\na,900,1\n");
        let e = read(&p).unwrap_err().to_string();
        assert!(e.contains("not evenly spaced"), "{e}");
        let (_d, p) = file("a,0,1\na,300,x\n");
        assert!(read(&p).is_err());
        let (_d, p) = file("a,0,1\n");
        assert!(read(&p).is_err());
    }

    #[test]
    fn a_choice_is_made_at_the_last_multiple_of_its_period_before_the_origin() {
        // 5-minute samples: 12 an hour.
        assert_eq!(chosen_at(100, None, 300), 100);
        assert_eq!(chosen_at(100, Some(0), 300), 100);
        assert_eq!(chosen_at(100, Some(1), 300), 96);
        assert_eq!(chosen_at(96, Some(1), 300), 96);
        assert_eq!(chosen_at(100, Some(2), 300), 96);
        assert_eq!(chosen_at(100, Some(3), 300), 72);
        // Minute samples: 60 an hour.
        assert_eq!(chosen_at(100, Some(1), 60), 60);
        // Never on less than two samples.
        assert_eq!(chosen_at(10, Some(1), 300), 2);
    }
}
