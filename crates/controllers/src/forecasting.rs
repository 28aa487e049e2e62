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
//! again every `choose_every`; in between each round only fits the chosen one.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use orrery_api::history::series::{
    self, ClusterForecast, ClusterSample, FleetSample, ForecastPoint, SeriesForecast,
};
use orrery_api::{Object, Time};
use orrery_forecast::{Choice, Settings};
use orrery_store::{ListOptions, Store, StoreError};
use tokio::sync::{mpsc, watch};

/// What is forecast, and how far.
#[derive(Clone, Debug)]
pub struct ForecastConfig {
    /// The season of the fleet's load (`--forecast-season`; a day).
    pub season: Duration,
    /// How far ahead.
    pub horizon: Duration,
    /// How often each series' model is chosen again.
    pub choose_every: Duration,
    /// Seasons of history a series keeps (older points are dropped).
    pub seasons_kept: usize,
}

impl Default for ForecastConfig {
    fn default() -> Self {
        ForecastConfig {
            season: Duration::from_secs(24 * 3600),
            horizon: Duration::from_secs(6 * 3600),
            choose_every: Duration::from_secs(3600),
            seasons_kept: 14,
        }
    }
}

/// The value of series `name` in a sample.
fn value_of(c: &ClusterSample, name: &str) -> Option<f64> {
    match name {
        "traffic" => Some(c.traffic),
        dim => c.levels.get(dim).copied(),
    }
}

/// The forecaster's state: every series' recent history and chosen model.
#[derive(Debug)]
pub struct Forecaster {
    cfg: ForecastConfig,
    /// Seconds between points.
    step: u64,
    /// Points per season, and kept.
    season: usize,
    keep: usize,
    horizon: usize,
    history: BTreeMap<(String, String), VecDeque<f64>>,
    /// Each series' model, when it was chosen and on how many points.
    choices: BTreeMap<(String, String), (Choice, i64, usize)>,
    /// The time of the last point taken.
    last: Option<Time>,
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
            step,
            season,
            keep: season * cfg.seasons_kept.max(2),
            horizon: (cfg.horizon.as_secs() / step).max(1) as usize,
            cfg,
            history: BTreeMap::new(),
            choices: BTreeMap::new(),
            last: None,
        }
    }

    /// Whether its points are the 5-minute averages (else the raw samples).
    pub fn uses_averages(&self, raw_interval: Duration) -> bool {
        self.step != raw_interval.as_secs().max(1)
    }

    /// Takes one sample of the fleet; a cluster missing from it keeps its last value, a
    /// cluster new to it starts its series.
    pub fn push(&mut self, s: &FleetSample) {
        if self.last.is_some_and(|l| s.time <= l) {
            return;
        }
        self.last = Some(s.time);
        for (cluster, c) in &s.clusters {
            for name in series::FORECAST_SERIES {
                let Some(v) = value_of(c, name).filter(|v| v.is_finite()) else {
                    continue;
                };
                let h = self
                    .history
                    .entry((cluster.clone(), (*name).to_string()))
                    .or_default();
                h.push_back(v);
                if h.len() > self.keep {
                    h.pop_front();
                }
            }
        }
        // Clusters gone from the fleet go from the forecasts.
        self.history.retain(|(c, _), _| s.clusters.contains_key(c));
        self.choices.retain(|(c, _), _| s.clusters.contains_key(c));
    }

    /// Every cluster's forecasts from the history now. CPU-bound: run it off the runtime.
    pub fn forecast_all(&mut self) -> Vec<ClusterForecast> {
        let Some(time) = self.last else {
            return Vec::new();
        };
        let now = time.unix_seconds();
        let settings = Settings {
            season: Some(self.season),
            ..Default::default()
        };
        let mut out: BTreeMap<String, ClusterForecast> = BTreeMap::new();
        for ((cluster, name), h) in &self.history {
            let y: Vec<f64> = h.iter().copied().collect();
            if y.len() < 2 {
                continue;
            }
            let key = (cluster.clone(), name.clone());
            // Chosen again once its time is up, or once the history has doubled (a young
            // series outgrows the naive model it started with).
            let fresh = self
                .choices
                .get(&key)
                .filter(|(_, at, n)| {
                    now - at < self.cfg.choose_every.as_secs() as i64 && y.len() < 2 * n
                })
                .map(|(c, _, _)| c.clone());
            let choice = match fresh {
                Some(c) => c,
                None => match orrery_forecast::choose(&y, self.horizon.min(self.season), &settings)
                {
                    Ok(c) => {
                        self.choices.insert(key, (c.clone(), now, y.len()));
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
                                mean: round(b.mean),
                                lower80: round(b.lower80),
                                upper80: round(b.upper80),
                                lower95: round(b.lower95),
                                upper95: round(b.upper95),
                            })
                            .collect(),
                    },
                );
        }
        out.into_values().collect()
    }
}

/// Reads the stored history the forecaster works on, oldest first.
async fn load(store: &dyn Store, prefix: &str) -> Result<Vec<FleetSample>, StoreError> {
    let list = store.list(prefix, &ListOptions::default()).await?;
    let mut out: Vec<FleetSample> = list
        .items
        .iter()
        .filter_map(|o| o.spec.clone())
        .filter_map(|s| serde_json::from_value(s).ok())
        .collect();
    out.sort_by_key(|s: &FleetSample| s.time.unix_seconds());
    Ok(out)
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
pub async fn run(
    store: Arc<dyn Store>,
    cfg: ForecastConfig,
    raw_interval: Duration,
    average_every: Duration,
    mut samples: mpsc::Receiver<(FleetSample, bool)>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut f = Forecaster::new(cfg, raw_interval, average_every);
    let averages = f.uses_averages(raw_interval);
    let prefix = if averages {
        series::AVERAGE_PREFIX
    } else {
        series::RAW_PREFIX
    };
    match load(store.as_ref(), prefix).await {
        Ok(history) => {
            for s in &history {
                f.push(s);
            }
            tracing::info!(
                samples = history.len(),
                step_seconds = f.step,
                season = f.season,
                "forecasting from the stored history"
            );
        }
        Err(e) => tracing::warn!(error = %e, "reading the monitoring history to forecast from"),
    }
    let mut stale: BTreeSet<String> = BTreeSet::new();
    loop {
        let got = tokio::select! {
            _ = shutdown.changed() => return,
            s = samples.recv() => s,
        };
        let Some((s, is_average)) = got else { return };
        if is_average != averages {
            continue;
        }
        f.push(&s);
        // Samples that came while the last round ran are taken before the next.
        while let Ok((s, is_average)) = samples.try_recv() {
            if is_average == averages {
                f.push(&s);
            }
        }
        let started = std::time::Instant::now();
        let (back, forecasts) = match tokio::task::spawn_blocking(move || {
            let out = f.forecast_all();
            (f, out)
        })
        .await
        {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "the forecasting round failed");
                return;
            }
        };
        f = back;
        for c in &forecasts {
            if let Err(e) = write(store.as_ref(), c).await {
                tracing::warn!(cluster = %c.cluster, error = %e, "writing a forecast");
            }
        }
        // Forecasts of clusters that left go.
        let now: BTreeSet<String> = forecasts.iter().map(|c| c.cluster.clone()).collect();
        for gone in stale.difference(&now) {
            let _ = store
                .delete(&series::forecast_key(gone), &Default::default())
                .await;
        }
        stale = now;
        tracing::debug!(
            clusters = forecasts.len(),
            ms = started.elapsed().as_millis() as u64,
            "forecasts made"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(day.uses_averages(raw));
        assert_eq!((day.step, day.season, day.horizon), (300, 288, 144));
        let short = Forecaster::new(cfg(60), raw, avg);
        assert!(!short.uses_averages(raw));
        assert_eq!((short.step, short.season, short.horizon), (1, 60, 30));
    }

    #[test]
    fn every_series_of_every_cluster_is_forecast_and_old_points_go() {
        let mut f = Forecaster::new(
            ForecastConfig {
                season: Duration::from_secs(20),
                horizon: Duration::from_secs(10),
                seasons_kept: 3,
                ..Default::default()
            },
            Duration::from_secs(1),
            Duration::from_secs(300),
        );
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
            cpu.model == "seasonal-naive" || cpu.model == "mstl-ets",
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
}
