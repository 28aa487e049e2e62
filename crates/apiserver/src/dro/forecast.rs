//! `GET /api/v1/monitor/forecast`: the monitoring system's forecasts of every cluster's water
//! level per dimension and of its traffic (the draft's Predictive Algorithms, 3.1 and 5.1),
//! from its latest round: a point per step with the mean and the 80 % and 95 % bounds, the
//! model each series' backtest chose, and that model's backtest error.

use std::collections::BTreeMap;

use http::StatusCode;
use orrery_api::history::series::{self, ClusterForecast};
use orrery_api::{Time, keys};
use orrery_store::{ListOptions, StoreError};

use super::DroError;
use super::answers::{ForecastView, MonitorForecast, PointView, SeriesView};
use super::monitor::bad;
use crate::app::App;
use crate::auth::Identity;
use crate::http::Body;

/// A horizon: a whole number of seconds, minutes, hours or days (`90s`, `30m`, `6h`, `1d`).
pub fn parse_horizon(s: &str) -> Result<i64, String> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let n: i64 = s[..split]
        .parse()
        .ok()
        .filter(|n| *n > 0 && *n <= 1_000_000)
        .ok_or_else(|| format!("horizon {s:?} is not a positive duration such as 30m or 6h"))?;
    match &s[split..] {
        "s" => Ok(n),
        "m" => Ok(n * 60),
        "h" => Ok(n * 3600),
        "d" => Ok(n * 86_400),
        _ => Err(format!("horizon {s:?}: the unit must be s, m, h or d")),
    }
}

/// One cluster's forecasts as the API shows them, cut at `horizon` seconds.
fn shown(f: &ClusterForecast, horizon: Option<i64>) -> ForecastView {
    let step = f.step_seconds.max(1) as i64;
    let steps = horizon.map_or(usize::MAX, |h| (h / step).max(1) as usize);
    let start = f.time.unix_seconds();
    let series: BTreeMap<String, SeriesView> = f
        .series
        .iter()
        .map(|(name, s)| {
            let points: Vec<PointView> = s
                .points
                .iter()
                .take(steps)
                .enumerate()
                .map(|(i, p)| PointView {
                    // Out of range only past the year 9999.
                    time: Time::from_unix_seconds(start + step * (i as i64 + 1)).unwrap_or(f.time),
                    mean: p.mean,
                    lower80: p.lower80,
                    upper80: p.upper80,
                    lower95: p.lower95,
                    upper95: p.upper95,
                })
                .collect();
            let v = SeriesView {
                model: s.model.clone(),
                points,
                backtest_mase: s.backtest_mase,
                last: s.last,
                season_peak: s.season_peak,
            };
            (name.clone(), v)
        })
        .collect();
    ForecastView {
        cluster: f.cluster.clone(),
        time: f.time,
        step_seconds: f.step_seconds,
        season_seconds: f.season_seconds,
        history: f.history,
        series,
    }
}

/// `GET /api/v1/monitor/forecast`: `cluster=NAME` keeps one cluster (404 when none is
/// registered by that name), `horizon=DURATION` cuts the points.
pub async fn forecast(
    app: &App,
    who: &Identity,
    query: &str,
) -> Result<http::Response<Body>, DroError> {
    super::monitor::may_read_fleet(app, who)?;
    let (mut only, mut horizon) = (None::<String>, None::<i64>);
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        match k.as_ref() {
            "cluster" => only = Some(v.into_owned()),
            "horizon" => horizon = Some(parse_horizon(&v).map_err(|m| bad(m, "horizon"))?),
            other => return Err(bad(format!("unknown parameter {other:?}"), other)),
        }
    }
    if let Some(c) = &only {
        match app.store.get(&keys::well_known::cluster(c)).await {
            Ok(_) => {}
            Err(StoreError::NotFound { .. }) => return Err(DroError::cluster_not_found(c)),
            Err(e) => return Err(DroError::internal(e)),
        }
    }
    let key = only.as_deref().map(series::forecast_key);
    let list = app
        .store
        .list(series::FORECAST_PREFIX, &ListOptions::default())
        .await
        .map_err(DroError::internal)?;
    let clusters: Vec<ForecastView> = list
        .items
        .iter()
        .filter(|o| {
            key.as_ref()
                .is_none_or(|k| *k == format!("{}{}", series::FORECAST_PREFIX, o.name()))
        })
        .filter_map(|o| o.spec.clone())
        .filter_map(|s| serde_json::from_value::<ClusterForecast>(s).ok())
        .map(|f| shown(&f, horizon))
        .collect();
    Ok(super::answers::send(
        StatusCode::OK,
        &MonitorForecast {
            count: clusters.len(),
            clusters,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use orrery_api::history::series::{ForecastPoint, SeriesForecast};

    #[test]
    fn horizons_read_like_durations() {
        let cases = [
            ("90s", Ok(90)),
            ("30m", Ok(1800)),
            ("6h", Ok(21_600)),
            ("1d", Ok(86_400)),
        ];
        for (s, want) in cases {
            assert_eq!(parse_horizon(s), want, "{s}");
        }
        for s in ["", "0m", "-1h", "6", "6 hours", "1.5h", "h"] {
            assert!(parse_horizon(s).is_err(), "{s}");
        }
    }

    #[test]
    fn points_are_timed_from_the_forecasts_sample_and_cut_at_the_horizon() {
        let f = ClusterForecast {
            cluster: "a".into(),
            time: Time::from_unix_seconds(1_000).unwrap(),
            step_seconds: 300,
            season_seconds: 86_400,
            history: 10,
            series: [(
                "cpu".to_string(),
                SeriesForecast {
                    model: "naive".into(),
                    backtest_mase: None,
                    points: vec![ForecastPoint::default(); 12],
                    last: Some(0.5),
                    season_peak: None,
                    choice: None,
                },
            )]
            .into(),
        };
        let v = serde_json::to_value(shown(&f, Some(1800))).unwrap();
        let points = v["series"]["cpu"]["points"].as_array().unwrap();
        assert_eq!(points.len(), 6);
        assert_eq!(
            points[0]["time"],
            serde_json::json!(Time::from_unix_seconds(1_300).unwrap())
        );
        assert!(v["series"]["cpu"].get("backtestMase").is_none());
        assert_eq!(shown(&f, None).series["cpu"].points.len(), 12);
    }
}
