//! The schedule history: every scheduling decision, with why each cluster was or was not
//! chosen. Decisions are stored in batches, one record per scheduling round, under keys that
//! sort by time.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::binding::{ClusterDecision, ObjectReference, TargetCluster};
use crate::time::Time;

pub const API_VERSION: &str = "internal.orrery.io/v1";
pub const KIND: &str = "ScheduleRecord";

pub mod backfill;

/// Where schedule records live (a key space the Kubernetes REST API does not expose; the
/// DRO-DS API serves it at `/api/v1/history/schedules`).
pub const PREFIX: &str = "/internal/history/schedules/";

/// At most this many per-cluster explanations are kept per decision; the rest are counted
/// by filter in [`ScheduleEntry::filtered`].
pub const MAX_EXPLAINED: usize = 10;

pub fn key(name: &str) -> String {
    format!("{PREFIX}{name}")
}

/// A record name that sorts by time: nanoseconds since the epoch, zero-padded, and a
/// sequence number for records made in the same nanosecond.
pub fn record_name(unix_nanos: i128, seq: u64) -> String {
    format!("r{:020}-{seq:06}", unix_nanos.max(0))
}

/// One decision.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleEntry {
    /// The task: `<binding uid>-<sequence>`.
    pub id: String,
    pub time: Time,
    /// `<namespace>/<name>` of the ResourceBinding.
    pub binding: String,
    pub resource: ObjectReference,
    pub replicas: i64,
    /// What asked for the decision: Created, SpecChanged, ClustersChanged, Failover, Shed,
    /// Recovered, Retry, ...; Rollout for a rollout's step.
    pub trigger: String,
    pub strategy: String,
    #[serde(default)]
    pub fleet_level: f64,
    /// Scheduled, PartiallyScheduled or Unschedulable; Migrating (a stateful move began) or
    /// Rollout (a rollout's step: see `rollout`).
    #[schemars(extend("enum" = ["Scheduled", "PartiallyScheduled", "Unschedulable", "Migrating", "Rollout"]))]
    pub result: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<TargetCluster>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unplaced: i64,
    /// The chosen clusters, then the others, best first, up to [`MAX_EXPLAINED`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub decisions: Vec<ClusterDecision>,
    /// How many clusters each filter turned away.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub filtered: BTreeMap<String, i64>,
    /// How the clusters' water levels were judged: `Upper80 over 30m for 4 of 5 clusters; present level for c (less than a season of history)`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub prediction: String,
    /// The forecast that moved replicas ahead of a peak (trigger `Forecast`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forecast: Option<crate::prediction::ForecastTrigger>,
    /// A rollout's step (trigger `Rollout`): a stage started or ended, a halt, a rollback. The
    /// placement is the binding's as it stood.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutStep>,
}

/// What a rollout did, as the schedule history records it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStep {
    /// The revision rolling out.
    pub revision: i64,
    /// The stage it stands in (empty when none is under way).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub stage: String,
    /// StageStarted, StageSucceeded, WaitingForApproval, RolloutClusterFailed, RolloutHalted,
    /// RolledBack, RolloutComplete, ...: the reason of the template's Event.
    pub event: String,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// A record's spec as records before `entriesJson` held it (still read).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordSpec {
    pub entries: Vec<ScheduleEntry>,
}

/// The field of a record's spec holding its entries as one JSON text.
const ENTRIES_JSON: &str = "entriesJson";

/// A record's spec: `{"entriesJson": "[...]"}`. The entries go straight to text instead of
/// a tree of JSON values, which cost the scheduler about a tenth of its time when it makes
/// thousands of decisions a second (records are internal; only the history API reads them).
pub fn record_spec(entries: &[ScheduleEntry]) -> Result<serde_json::Value, serde_json::Error> {
    let text = serde_json::to_string(entries)?;
    let mut spec = serde_json::Map::new();
    spec.insert(ENTRIES_JSON.to_string(), serde_json::Value::String(text));
    Ok(serde_json::Value::Object(spec))
}

/// A record's entries, from either form of its spec.
pub fn record_entries(spec: &serde_json::Value) -> Result<Vec<ScheduleEntry>, serde_json::Error> {
    match spec.get(ENTRIES_JSON) {
        Some(serde_json::Value::String(text)) => serde_json::from_str(text),
        _ => RecordSpec::deserialize(spec).map(|r| r.entries),
    }
}

/// A one-line account of why clusters were turned away: `2 WaterLevel, 1 Readiness`.
pub fn filtered_message(filtered: &BTreeMap<String, i64>) -> String {
    let mut v: Vec<(&String, &i64)> = filtered.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    v.iter()
        .map(|(f, n)| format!("{n} {f}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sort_by_time_and_messages_count() {
        let filtered: BTreeMap<String, i64> =
            [("Readiness".to_string(), 1), ("WaterLevel".to_string(), 2)].into();
        assert_eq!(filtered_message(&filtered), "2 WaterLevel, 1 Readiness");
        assert!(record_name(5, 1) < record_name(10, 0));
        assert!(
            record_name(1_700_000_000_000_000_000, 0) > record_name(999_999_999_999_999_999, 9)
        );
    }

    #[test]
    fn records_read_back_in_both_forms() {
        let entry = |id: &str| ScheduleEntry {
            id: id.into(),
            time: Time::from_unix_seconds(1_700_000_000).unwrap(),
            binding: "default/web-deployment".into(),
            resource: ObjectReference::default(),
            replicas: 3,
            trigger: "SpecChanged".into(),
            strategy: "WaterFilling".into(),
            fleet_level: 0.61,
            result: "Scheduled".into(),
            message: "placed on \"a\"(3)".into(),
            clusters: vec![TargetCluster {
                name: "a".into(),
                replicas: 3,
            }],
            unplaced: 0,
            decisions: vec![ClusterDecision {
                name: "a".into(),
                replicas: Some(3),
                score: Some(71.5),
                scores: [("Headroom".to_string(), 80.0)].into(),
                ..Default::default()
            }],
            filtered: [("Readiness".to_string(), 2)].into(),
            prediction: String::new(),
            forecast: None,
            rollout: None,
        };
        let entries = vec![entry("u-1"), entry("u-2")];
        let spec = record_spec(&entries).unwrap();
        assert!(spec["entriesJson"].is_string(), "{spec}");
        assert_eq!(record_entries(&spec).unwrap(), entries);
        // Records written before: the entries as an array.
        let old = serde_json::json!({ "entries": entries });
        assert_eq!(record_entries(&old).unwrap(), entries);
        // Damage is an error, not an empty history.
        assert!(record_entries(&serde_json::json!({"entriesJson": "[{"})).is_err());
        assert!(record_entries(&serde_json::json!({"entries": 3})).is_err());
    }
}

/// Where failure records live (`GET /api/v1/history/failures`).
pub const FAILURES_PREFIX: &str = "/internal/history/failures/";

/// One entry of the failure history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailureRecord {
    pub time: Time,
    pub cluster: String,
    /// `ClusterUnreachable`, `ClusterNotReady`, `ClusterRecovered`, or a domain event's type.
    #[serde(rename = "type")]
    pub type_: String,
    pub reason: String,
    pub message: String,
}

/// A failure record as stored: its key (sorting by time; `unique` tells apart records of the
/// same microsecond) and the object.
pub fn failure_entry(rec: &FailureRecord, unique: &str) -> (String, crate::Object) {
    let micros = rec.time.timestamp().as_microsecond();
    let name = format!("{micros:020}-{}-{unique}", rec.cluster);
    let mut o = crate::Object::new("internal.orrery.io/v1", "FailureRecord").with_name(&name);
    o.spec = serde_json::to_value(rec).ok();
    o.metadata.creation_timestamp = Some(rec.time);
    (format!("{FAILURES_PREFIX}{name}"), o)
}

/// The monitoring time series (draft 5.1): one record per sampling of the whole fleet, under
/// keys that sort by time. Raw samples are kept for hours, 5-minute averages for weeks.
pub mod series {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Serialize};

    use crate::time::Time;

    fn no_long_season(n: &usize) -> bool {
        *n == 0
    }

    pub const RAW_PREFIX: &str = "/internal/monitoring/raw/";
    pub const AVERAGE_PREFIX: &str = "/internal/monitoring/5m/";
    /// Each cluster's latest forecasts, under its name.
    pub const FORECAST_PREFIX: &str = "/internal/monitoring/forecast/";
    /// What Orrery's replicas cost per hour, fleet-wide and per cluster, as of the newest
    /// sample ([`FleetCost`]); written when it changes.
    pub const COST_KEY: &str = "/internal/monitoring/cost";

    /// What Orrery's replicas cost per hour, by the clusters' prices.
    #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct FleetCost {
        pub time: Option<Time>,
        /// All of them, in the fleet's prices' currency.
        pub hourly: f64,
        /// Per cluster with prices.
        #[serde(default)]
        pub clusters: BTreeMap<String, f64>,
    }

    impl FleetCost {
        /// The cost in a sample.
        pub fn of(s: &FleetSample) -> FleetCost {
            let clusters: BTreeMap<String, f64> = s
                .clusters
                .iter()
                .filter_map(|(n, c)| c.cost.map(|x| (n.clone(), x)))
                .collect();
            FleetCost {
                time: Some(s.time),
                // `+ 0.0`: the sum of nothing is -0.0, printed `-0.0`.
                hourly: (clusters.values().sum::<f64>() * 10_000.0).round() / 10_000.0 + 0.0,
                clusters,
            }
        }
    }

    /// The series forecast for each cluster: the water level of each dimension, and traffic.
    pub const FORECAST_SERIES: &[&str] = &["cpu", "memory", "gpu", "pods", "traffic"];

    /// One step of a forecast: the mean and the bounds of its 80 % and 95 % intervals.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct ForecastPoint {
        pub mean: f64,
        pub lower80: f64,
        pub upper80: f64,
        pub lower95: f64,
        pub upper95: f64,
    }

    /// A forecast's points as one array per bound (`{"mean": [..], "lower80": [..], ..}`),
    /// not an object per point. Every cluster's forecast is rewritten each round, and whatever
    /// watches the forecasts (the scheduler, every replica's watch cache) holds them parsed
    /// for a while: parsed, an object per point took about 800 bytes, five numbers in arrays
    /// take 160, and at 10,000 members a round was gigabytes in flight. The old form is still
    /// read (forecasts stored by an earlier version). A bound that is not a number is stored
    /// as `null`, as JSON has no NaN, and read back as NaN.
    pub mod point_columns {
        use serde::{Deserialize, Deserializer, Serialize, Serializer};

        use super::ForecastPoint;

        #[derive(Serialize, Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Columns {
            mean: Vec<Option<f64>>,
            lower80: Vec<Option<f64>>,
            upper80: Vec<Option<f64>>,
            lower95: Vec<Option<f64>>,
            upper95: Vec<Option<f64>>,
        }

        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Stored {
            Columns(Columns),
            Points(Vec<ForecastPoint>),
        }

        pub fn serialize<S: Serializer>(points: &[ForecastPoint], s: S) -> Result<S::Ok, S::Error> {
            let col = |f: fn(&ForecastPoint) -> f64| -> Vec<Option<f64>> {
                points
                    .iter()
                    .map(|p| Some(f(p)).filter(|x| x.is_finite()))
                    .collect()
            };
            Columns {
                mean: col(|p| p.mean),
                lower80: col(|p| p.lower80),
                upper80: col(|p| p.upper80),
                lower95: col(|p| p.lower95),
                upper95: col(|p| p.upper95),
            }
            .serialize(s)
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Vec<ForecastPoint>, D::Error> {
            let c = match Stored::deserialize(d)? {
                Stored::Points(p) => return Ok(p),
                Stored::Columns(c) => c,
            };
            let n = c.mean.len();
            if [&c.lower80, &c.upper80, &c.lower95, &c.upper95]
                .iter()
                .any(|v| v.len() != n)
            {
                return Err(serde::de::Error::custom(
                    "a forecast's columns are of different lengths",
                ));
            }
            let at = |v: &[Option<f64>], i: usize| v[i].unwrap_or(f64::NAN);
            Ok((0..n)
                .map(|i| ForecastPoint {
                    mean: at(&c.mean, i),
                    lower80: at(&c.lower80, i),
                    upper80: at(&c.upper80, i),
                    lower95: at(&c.lower95, i),
                    upper95: at(&c.upper95, i),
                })
                .collect())
        }
    }

    /// One series' forecast and how it was made.
    #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct SeriesForecast {
        /// `naive`, `seasonal-naive`, `ets`, `mstl-ets` or `mstl-ar` (the model of the steps after
        /// the near band's, when the choice gave the first steps their own).
        pub model: String,
        /// The model's mean absolute scaled error over its backtest (below 1 beats the
        /// seasonal naive one step ahead); absent while the history is too short.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub backtest_mase: Option<f64>,
        /// One point per step after the forecast's time. Stored as columns (see
        /// [`point_columns`]).
        #[serde(with = "point_columns")]
        pub points: Vec<ForecastPoint>,
        /// The series' last value, the forecast's starting point: the scheduler reads a
        /// forecast as the change from it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub last: Option<f64>,
        /// The highest the series went over its last season, with Orrery's part as it stands
        /// at the forecast's time: where its daily peak takes it, however far ahead that is.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub season_peak: Option<f64>,
        /// How the model was chosen, so a restarted forecaster goes on with it rather than
        /// choosing every series' model again at once (a different choice would be a change
        /// the restart made).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub choice: Option<ModelChoice>,
    }

    /// A series' model as its backtest chose it.
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct ModelChoice {
        /// Samples per season the model was given (0: none).
        pub season: usize,
        /// Samples per long season (a week) the MSTL models also decompose by (0: none).
        #[serde(default, skip_serializing_if = "no_long_season")]
        pub long_season: usize,
        /// The factor the model's intervals are scaled by.
        pub interval_scale: f64,
        /// When it was chosen, and on how many points.
        pub chosen_at: Time,
        pub history: usize,
        /// The model of the first steps, where the backtest chose one of its own for them
        /// (the series' `model` is then the later steps').
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub near: Option<NearChoice>,
    }

    /// The model of a forecast's first steps, as its backtest chose it.
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct NearChoice {
        /// The model's name, as in `SeriesForecast::model`.
        pub model: String,
        /// The steps it forecasts.
        pub steps: usize,
        /// Its mean MASE over the backtest's first `steps`.
        pub backtest_mase: f64,
        /// The factor its intervals are scaled by.
        pub interval_scale: f64,
    }

    /// A cluster's forecasts, made at the sample of `time`, a point every `step_seconds`.
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct ClusterForecast {
        pub cluster: String,
        pub time: Time,
        pub step_seconds: u64,
        /// The season the models were given (a day unless `--forecast-season` says).
        pub season_seconds: u64,
        /// Samples of history the forecasts were made from.
        pub history: usize,
        pub series: BTreeMap<String, SeriesForecast>,
    }

    /// A cluster's forecast key.
    pub fn forecast_key(cluster: &str) -> String {
        format!("{FORECAST_PREFIX}{cluster}")
    }

    /// A record's key under `prefix` for `unix_seconds`.
    pub fn key(prefix: &str, unix_seconds: i64) -> String {
        format!("{prefix}{:012}", unix_seconds.max(0))
    }

    /// One cluster's figures at one time.
    #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
    #[serde(rename_all = "camelCase")]
    pub struct ClusterSample {
        pub ready: bool,
        /// Overall water level, and per dimension.
        pub level: f64,
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        pub levels: BTreeMap<String, f64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub cpu_usage: Option<f64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub memory_available: Option<f64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub pods: Option<i64>,
        /// Bytes per second, in and out.
        #[serde(default)]
        pub traffic: f64,
        /// What the forecasts made one prediction horizon before said of this time, per
        /// series, beside what was measured (`levels`, `traffic`).
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        pub forecast: crate::prediction::ForecastChecks,
        /// Orrery's own part of each level: the requests of the replicas it placed there, over
        /// allocatable. The forecasts are of the rest (the load Orrery does not move), so a
        /// move of Orrery's is not taken for a change in the cluster's load.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        pub placed: BTreeMap<String, f64>,
        /// What Orrery's replicas there cost per hour, by the cluster's prices (absent when
        /// it has none for what they request).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub cost: Option<f64>,
        /// Reported afterwards with its own time (`POST /api/v1/metrics/history`, or read
        /// from a Prometheus server), not measured by the monitoring loop: a measured
        /// figure of the same time wins over it.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        pub backfilled: bool,
    }

    /// The fleet at one time.
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct FleetSample {
        pub time: Time,
        pub clusters: BTreeMap<String, ClusterSample>,
    }

    /// The average of several samples, stamped with the last one's time: levels, usage and
    /// traffic averaged per cluster over the samples that have it; readiness as last seen.
    pub fn average(samples: &[FleetSample]) -> Option<FleetSample> {
        let mut a = Averager::default();
        for s in samples {
            a.add(s);
        }
        a.take()
    }

    /// [`average`] as samples come, one at a time: it keeps running sums per cluster, not the
    /// samples (twenty whole-fleet samples between two averages were about 200 MB at 10,000
    /// members).
    #[derive(Debug, Default)]
    pub struct Averager {
        time: Option<Time>,
        clusters: BTreeMap<String, Running>,
    }

    /// One cluster's sums: of what every sample has, and of what some have, with their count.
    #[derive(Debug, Default)]
    struct Running {
        samples: usize,
        ready: bool,
        level: f64,
        levels: BTreeMap<String, (f64, usize)>,
        placed: BTreeMap<String, f64>,
        cpu_usage: (f64, usize),
        memory_available: (f64, usize),
        pods: Option<i64>,
        traffic: f64,
        cost: (f64, usize),
    }

    fn add_some(sum: &mut (f64, usize), x: Option<f64>) {
        if let Some(x) = x {
            sum.0 += x;
            sum.1 += 1;
        }
    }

    fn mean_of(sum: (f64, usize)) -> Option<f64> {
        (sum.1 > 0).then(|| sum.0 / sum.1 as f64)
    }

    impl Averager {
        /// Takes a sample in.
        pub fn add(&mut self, s: &FleetSample) {
            self.time = Some(s.time);
            for (name, c) in &s.clusters {
                let r = self.clusters.entry(name.clone()).or_default();
                r.samples += 1;
                r.ready = c.ready;
                r.level += c.level;
                for (d, v) in &c.levels {
                    let e = r.levels.entry(d.clone()).or_default();
                    e.0 += v;
                    e.1 += 1;
                }
                for (d, v) in &c.placed {
                    *r.placed.entry(d.clone()).or_default() += v;
                }
                add_some(&mut r.cpu_usage, c.cpu_usage);
                add_some(&mut r.memory_available, c.memory_available);
                r.pods = c.pods;
                r.traffic += c.traffic;
                add_some(&mut r.cost, c.cost);
            }
        }

        /// The average of the samples taken in since the last one (`None`: there were none),
        /// and a fresh start.
        pub fn take(&mut self) -> Option<FleetSample> {
            let time = self.time.take()?;
            let round = |x: f64| (x * 1000.0).round() / 1000.0;
            let clusters = std::mem::take(&mut self.clusters)
                .into_iter()
                .map(|(name, r)| {
                    let n = r.samples as f64;
                    let sample = ClusterSample {
                        ready: r.ready,
                        level: round(r.level / n),
                        levels: r
                            .levels
                            .into_iter()
                            .map(|(d, (sum, k))| (d, round(sum / k as f64)))
                            .collect(),
                        cpu_usage: mean_of(r.cpu_usage),
                        memory_available: mean_of(r.memory_available),
                        pods: r.pods,
                        traffic: r.traffic / n,
                        // Set by the monitoring loop, which knows the forecasts.
                        forecast: Default::default(),
                        // A sample without a dimension's part had none of it there.
                        placed: r
                            .placed
                            .into_iter()
                            .map(|(d, sum)| (d, round(sum / n)))
                            .collect(),
                        cost: mean_of(r.cost).map(|x| (x * 10_000.0).round() / 10_000.0),
                        backfilled: false,
                    };
                    (name, sample)
                })
                .collect();
            Some(FleetSample { time, clusters })
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn s(t: i64, level: f64, ready: bool) -> FleetSample {
            let mut clusters = BTreeMap::new();
            clusters.insert(
                "a".to_string(),
                ClusterSample {
                    ready,
                    level,
                    levels: [("cpu".to_string(), level)].into(),
                    traffic: level * 10.0,
                    ..Default::default()
                },
            );
            FleetSample {
                time: Time::from_unix_seconds(t).unwrap(),
                clusters,
            }
        }

        #[test]
        fn averages_keep_the_last_time_and_readiness() {
            let mut b = s(3, 0.9, false);
            b.clusters.insert("b".into(), ClusterSample::default());
            // Orrery's part of a's cpu: 0.3 in one sample of three, none in the others.
            let mut first = s(1, 0.2, true);
            if let Some(a) = first.clusters.get_mut("a") {
                a.placed.insert("cpu".into(), 0.3);
            }
            let avg = average(&[first, s(2, 0.4, true), b]).unwrap();
            assert_eq!(avg.clusters["a"].placed["cpu"], 0.1);
            assert_eq!(avg.time.unix_seconds(), 3);
            let a = &avg.clusters["a"];
            assert_eq!((a.level, a.levels["cpu"], a.ready), (0.5, 0.5, false));
            assert!((a.traffic - 5.0).abs() < 1e-9);
            assert!(avg.clusters.contains_key("b"));
            assert!(average(&[]).is_none());
            assert!(key(RAW_PREFIX, 5) < key(RAW_PREFIX, 40));
        }

        #[test]
        fn an_averager_starts_afresh_after_each_average() {
            let mut a = Averager::default();
            let mut x = s(1, 0.2, true);
            if let Some(c) = x.clusters.get_mut("a") {
                c.cpu_usage = Some(2.0);
            }
            a.add(&x);
            a.add(&s(2, 0.4, true));
            let first = a.take().unwrap();
            // Usage is the mean of the samples that have it; the level of all of them.
            assert_eq!(first.clusters["a"].cpu_usage, Some(2.0));
            assert_eq!(first.clusters["a"].level, 0.3);
            a.add(&s(3, 0.9, false));
            let second = a.take().unwrap();
            let c = &second.clusters["a"];
            assert_eq!(second.time.unix_seconds(), 3);
            assert_eq!((c.level, c.cpu_usage, c.ready), (0.9, None, false));
            assert!(a.take().is_none());
        }

        /// Bounds a binary fraction apart, so the JSON below is exact.
        fn point(mean: f64) -> ForecastPoint {
            let (b80, b95) = (0.125, 0.25);
            ForecastPoint {
                mean,
                lower80: mean - b80,
                upper80: mean + b80,
                lower95: mean - b95,
                upper95: mean + b95,
            }
        }

        fn series(points: Vec<ForecastPoint>) -> SeriesForecast {
            SeriesForecast {
                model: "ets".into(),
                points,
                ..Default::default()
            }
        }

        #[test]
        fn forecast_points_are_stored_as_columns_and_read_in_either_form() {
            let s = series(vec![point(0.5), point(0.625)]);
            let v = serde_json::to_value(&s).unwrap();
            assert_eq!(
                v["points"],
                serde_json::json!({"mean": [0.5, 0.625], "lower80": [0.375, 0.5],
                    "upper80": [0.625, 0.75], "lower95": [0.25, 0.375], "upper95": [0.75, 0.875]})
            );
            let back: SeriesForecast = serde_json::from_value(v).unwrap();
            assert_eq!(back, s);
            // As an earlier version stored them: an object per point.
            let old = serde_json::json!({"model": "ets", "points": [
                {"mean": 0.5, "lower80": 0.375, "upper80": 0.625, "lower95": 0.25, "upper95": 0.75},
                {"mean": 0.625, "lower80": 0.5, "upper80": 0.75, "lower95": 0.375, "upper95": 0.875}]});
            assert_eq!(serde_json::from_value::<SeriesForecast>(old).unwrap(), s);
            let none = serde_json::from_value::<SeriesForecast>(serde_json::json!({
                "model": "ets", "points": {"mean": [], "lower80": [], "upper80": [],
                "lower95": [], "upper95": []}}));
            assert_eq!(none.unwrap(), series(vec![]));
        }

        #[test]
        fn forecast_columns_of_different_lengths_or_missing_are_refused() {
            for points in [
                serde_json::json!({"mean": [0.5], "lower80": [], "upper80": [0.6],
                    "lower95": [0.3], "upper95": [0.7]}),
                serde_json::json!({"mean": [0.5], "upper80": [0.6], "lower95": [0.3],
                    "upper95": [0.7]}),
                serde_json::json!([{"mean": 0.5}]),
            ] {
                let v = serde_json::json!({"model": "ets", "points": points});
                assert!(
                    serde_json::from_value::<SeriesForecast>(v.clone()).is_err(),
                    "{v}"
                );
            }
        }

        #[test]
        fn a_bound_that_is_not_a_number_comes_back_as_one_that_is_not() {
            let mut p = point(0.5);
            p.upper95 = f64::NAN;
            let v = serde_json::to_value(series(vec![p])).unwrap();
            assert_eq!(v["points"]["upper95"], serde_json::json!([null]));
            let back: SeriesForecast = serde_json::from_value(v).unwrap();
            assert!(back.points[0].upper95.is_nan());
            assert_eq!(back.points[0].upper80, 0.625);
        }
    }
}
