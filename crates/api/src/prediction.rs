//! Scheduling ahead of the load (the draft's Predictive Algorithms, 3.1 and 4.2 item 6): the
//! placement's `prediction` block, and what decisions, Clusters, the schedule history and the
//! monitoring history say of the forecasts they used.
//!
//! The water level a placement judges a cluster by is the larger of its present level and its
//! forecast over the placement's horizon, at the placement's bound (the forecast's mean, or the
//! upper end of its 80 % or 95 % interval). A cluster whose forecast holds less than one season
//! of history is judged by its present level, and the decision says so.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::time::Time;
use crate::validation::{ErrorList, FieldError};

pub const MEAN: &str = "Mean";
pub const UPPER80: &str = "Upper80";
pub const UPPER95: &str = "Upper95";
/// The bounds a placement may name.
pub const BOUNDS: [&str; 3] = [MEAN, UPPER80, UPPER95];

/// Orrery's horizon when a placement names none: 30 minutes.
pub const DEFAULT_HORIZON_SECONDS: i64 = 1800;
/// The longest horizon a placement may ask for.
pub const MAX_HORIZON_SECONDS: i64 = 86_400;

/// Which forecast a placement judges clusters by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Bound {
    Mean,
    /// The upper end of the 80 % prediction interval.
    #[default]
    Upper80,
    Upper95,
}

impl Bound {
    pub fn as_str(self) -> &'static str {
        match self {
            Bound::Mean => MEAN,
            Bound::Upper80 => UPPER80,
            Bound::Upper95 => UPPER95,
        }
    }

    /// Its index among `[Mean, Upper80, Upper95]`.
    pub fn index(self) -> usize {
        match self {
            Bound::Mean => 0,
            Bound::Upper80 => 1,
            Bound::Upper95 => 2,
        }
    }
}

impl std::str::FromStr for Bound {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            MEAN => Ok(Bound::Mean),
            UPPER80 => Ok(Bound::Upper80),
            UPPER95 => Ok(Bound::Upper95),
            _ => Err(format!(
                "unsupported bound {s:?}: one of {}",
                BOUNDS.join(", ")
            )),
        }
    }
}

/// A placement's look ahead, resolved: how far, and which bound. A horizon of 0 judges every
/// cluster by its present level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ahead {
    pub horizon_seconds: i64,
    pub bound: Bound,
}

impl Default for Ahead {
    fn default() -> Self {
        Ahead {
            horizon_seconds: DEFAULT_HORIZON_SECONDS,
            bound: Bound::Upper80,
        }
    }
}

impl Ahead {
    pub fn is_off(&self) -> bool {
        self.horizon_seconds <= 0
    }

    /// `Upper80 over 30m`.
    pub fn describe(&self) -> String {
        format!(
            "{} over {}",
            self.bound.as_str(),
            format_seconds(self.horizon_seconds)
        )
    }
}

/// Orrery's `placement.prediction`: judge clusters by their forecast water level.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Prediction {
    /// How far ahead clusters are judged, a duration such as 30m or 1h30m (at most 24h); 0s judges them by their present water level. Default: the server's (30m).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub horizon: String,
    /// Which forecast is judged: Mean, Upper80 (the upper end of the 80 % prediction interval) or Upper95. Default: the server's (Upper80).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub bound: String,
}

impl Prediction {
    pub fn validate(&self, path: &str, errs: &mut ErrorList) {
        if !self.horizon.is_empty()
            && let Err(e) = parse_horizon(&self.horizon)
        {
            errs.push(FieldError::invalid(
                format!("{path}.horizon"),
                &self.horizon,
                e,
            ));
        }
        if !self.bound.is_empty() && !BOUNDS.contains(&self.bound.as_str()) {
            errs.push(FieldError::not_supported(
                format!("{path}.bound"),
                &self.bound,
                &BOUNDS,
            ));
        }
    }

    /// The placement's look ahead, `default` for what it leaves out (or cannot be read: it
    /// was validated when it was written).
    pub fn resolve(&self, default: Ahead) -> Ahead {
        Ahead {
            horizon_seconds: parse_horizon(&self.horizon).unwrap_or(default.horizon_seconds),
            bound: self.bound.parse().unwrap_or(default.bound),
        }
    }
}

/// A horizon in whole seconds: a duration as Kubernetes writes them (`30m`, `1h30m`, `90s`,
/// `0s`) or ISO 8601 (`PT30M`), between 0 and 24 hours.
pub fn parse_horizon(s: &str) -> Result<i64, String> {
    let d: jiff::SignedDuration = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a duration such as 30m, 1h30m or 0s"))?;
    if d.is_negative() {
        return Err("must not be negative".into());
    }
    let secs = d.as_secs() + i64::from(d.subsec_nanos() > 0);
    if secs > MAX_HORIZON_SECONDS {
        return Err("must be at most 24h".into());
    }
    Ok(secs)
}

/// `90s`, `30m`, `1h30m`, `6h`.
pub fn format_seconds(s: i64) -> String {
    let (h, m, sec) = (s / 3600, (s % 3600) / 60, s % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if sec > 0 || out.is_empty() {
        out.push_str(&format!("{sec}s"));
    }
    out
}

/// What a decision saw of one cluster's water level: now and, where it judged by the
/// forecast, the level the forecast gives over the horizon.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LevelSeen {
    /// Its water level now (the fullest dimension).
    pub now: f64,
    /// The highest its water level reaches over the horizon by the forecast: what the water level filter and the balance and headroom scores used. Absent where the present level was used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ahead: Option<f64>,
    /// `Upper80 over 30m`, or why the present level was used (less than a season of history, no forecast, a stale forecast, prediction off).
    pub basis: String,
}

/// The forecast that made the scheduler move replicas ahead of a peak (in the schedule
/// history).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ForecastTrigger {
    /// The cluster about to cross the shed mark.
    pub cluster: String,
    /// The dimension that crosses it first.
    pub dimension: String,
    /// Its water level in that dimension when the decision was made.
    pub level: f64,
    /// The highest the forecast takes it over the horizon.
    pub forecast: f64,
    /// When the forecast has it cross the mark.
    pub crosses_at: Time,
    /// The shed mark.
    pub mark: f64,
    /// `Upper80 over 30m`.
    pub basis: String,
    /// The model of that dimension's series.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub model: String,
    /// When the forecast was made.
    pub made_at: Time,
}

/// What `kubectl describe cluster` shows of the monitoring system's forecast
/// (`status.forecast`): the highest mean water level of the next hour.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ForecastSummary {
    /// When the forecast was made.
    pub time: Time,
    /// How far the peak is looked for: an hour, or less where the forecast reaches less far.
    pub horizon_seconds: i64,
    /// The highest mean water level forecast over it, of any dimension.
    pub peak: f64,
    /// Its dimension.
    pub peak_dimension: String,
    /// When it comes.
    pub peak_time: Time,
    /// The upper end of that step's 80 % interval.
    pub peak_upper_bound: f64,
    /// The model of that dimension's series.
    pub model: String,
    /// Seconds of history the forecast was made from; the scheduler reads it once that is a season.
    pub history_seconds: i64,
    /// The season the models were given.
    pub season_seconds: i64,
}

/// What a forecast said of a time, set beside what was measured then in the monitoring
/// history (`/api/v1/monitor/history`): a forecast that proves wrong shows there.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ForecastCheck {
    pub mean: f64,
    pub lower80: f64,
    pub upper80: f64,
    /// When the forecast was made (one prediction horizon before, or the nearest after).
    pub made_at: Time,
}

/// The forecasts of each series for one sample, by series name (`cpu`, `memory`, `gpu`,
/// `pods`, `traffic`).
pub type ForecastChecks = BTreeMap<String, ForecastCheck>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn horizons_read_as_kubernetes_durations() {
        let cases: &[(&str, Result<i64, ()>)] = &[
            ("30m", Ok(1800)),
            ("1h30m", Ok(5400)),
            ("90s", Ok(90)),
            ("0s", Ok(0)),
            ("1.5h", Ok(5400)),
            ("PT45M", Ok(2700)),
            ("24h", Ok(86_400)),
            ("500ms", Ok(1)),
            ("25h", Err(())),
            ("-5m", Err(())),
            ("soon", Err(())),
            ("", Err(())),
            ("30", Err(())),
        ];
        for (s, want) in cases {
            assert_eq!(parse_horizon(s).map_err(|_| ()), *want, "{s}");
        }
    }

    #[test]
    fn a_placement_keeps_what_it_says_and_takes_the_rest_from_the_default() {
        let def = Ahead::default();
        let p = |h: &str, b: &str| Prediction {
            horizon: h.into(),
            bound: b.into(),
        };
        assert_eq!(p("", "").resolve(def), def);
        assert_eq!(
            p("1h", "Mean").resolve(def),
            Ahead {
                horizon_seconds: 3600,
                bound: Bound::Mean
            }
        );
        assert!(p("0s", "").resolve(def).is_off());
        assert_eq!(p("", "Upper95").resolve(def).describe(), "Upper95 over 30m");

        let mut errs = ErrorList::new();
        p("2d", "Upper99").validate("spec.placement.prediction", &mut errs);
        let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.placement.prediction.horizon",
                "spec.placement.prediction.bound"
            ]
        );
    }

    #[test]
    fn durations_print_short() {
        for (s, want) in [
            (0, "0s"),
            (90, "1m30s"),
            (1800, "30m"),
            (5400, "1h30m"),
            (21_600, "6h"),
        ] {
            assert_eq!(format_seconds(s), want);
        }
    }
}
