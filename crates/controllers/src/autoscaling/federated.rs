//! Karmada's FederatedHPA: every sync period, the usage of the workload's pods as its members
//! report it (summed over the clusters of its binding) gives the replicas the workload needs
//! ([`super::recommend`], Kubernetes' algorithm); the template is scaled to them and the
//! scheduler divides the change. With `predictive`, the workload's own usage is recorded (a
//! point per 288th of the forecast season) and forecast, and the replicas also cover the
//! forecast's bound over the horizon, so they are running before a daily peak. Replicas
//! outside minReplicas..maxReplicas go to the nearest bound before any metric is read
//! (Kubernetes' order), with or without usage.
//!
//! Restart safety: the recommendations behind the stabilization windows live in memory; a
//! restarted controller starts each window as if it had recommended the current replicas
//! all along, so a restart never shortens a window (it delays a scale-down by one window at
//! most). The recorded usage is stored, so a forecast survives restarts.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use orrery_api::autoscaling::federated::{
    self as f, FederatedHPASpec, FederatedHPAStatus, MetricStatus, MetricValueStatus,
    PredictionStatus, ResourceMetricStatus, Target,
};
use orrery_api::binding::{self, BindingSpec};
use orrery_api::conditions::{self, Condition};
use orrery_api::prediction::{Ahead, Bound};
use orrery_api::work::{WorkStatus, WorkloadUsage};
use orrery_api::{Object, Time, keys};
use orrery_store::{Store, StoreError};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::recommend;
use crate::runtime::cache::Cache;
use crate::runtime::controller::{Action, Controller, Keys, Origin, Reconciler, Source};
use crate::runtime::metrics::Handle;
use crate::runtime::reflector::Event;

/// Where each FederatedHPA's recorded usage is kept.
pub const USAGE_PREFIX: &str = "/internal/autoscaling/usage/";

#[derive(Debug, Clone)]
pub struct Settings {
    /// How often each FederatedHPA is looked at (`--hpa-sync-period`; Karmada's 15s).
    pub sync_period: Duration,
    /// The scale-down stabilization window when a behavior sets none
    /// (`--hpa-downscale-stabilization`; 5 minutes).
    pub downscale_window: Duration,
    /// The season of the workloads' usage, as of the fleet's load (`--forecast-season`).
    pub season: Duration,
    /// What `predictive` leaves out.
    pub ahead: Ahead,
    /// Seasons of usage kept.
    pub seasons_kept: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            sync_period: Duration::from_secs(15),
            downscale_window: Duration::from_secs(300),
            season: Duration::from_secs(24 * 3600),
            ahead: Ahead::default(),
            seasons_kept: 3,
        }
    }
}

/// Points per season of the recorded usage.
pub const SEASON_POINTS: usize = 288;

/// A FederatedHPA's recorded usage: per resource, the mean over each step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageSeries {
    /// Seconds per point.
    pub step: i64,
    /// The unix second the last point's step starts at.
    pub last_step: i64,
    /// Oldest first; cpu in cores, memory in bytes, summed over the pods.
    pub points: BTreeMap<String, Vec<f64>>,
}

impl UsageSeries {
    /// Adds a reading taken at `now`: the current step's point is the mean of its readings
    /// (`n` of them so far); steps missed are filled with the last point.
    pub fn push(&mut self, now: i64, readings: &BTreeMap<String, f64>, n: &mut u32, keep: usize) {
        let step_start = now - now.rem_euclid(self.step);
        let gap = if self.last_step == 0 {
            1
        } else {
            (step_start - self.last_step) / self.step
        };
        for (resource, v) in readings {
            let series = self.points.entry(resource.clone()).or_default();
            if gap <= 0 && !series.is_empty() {
                let last = series.len() - 1;
                series[last] = (series[last] * f64::from(*n) + v) / f64::from(*n + 1);
                continue;
            }
            let fill = series.last().copied();
            for _ in 1..gap.min(keep as i64) {
                if let Some(x) = fill {
                    series.push(x);
                }
            }
            series.push(*v);
            if series.len() > keep {
                let cut = series.len() - keep;
                series.drain(..cut);
            }
        }
        if gap > 0 || self.last_step == 0 {
            *n = 1;
            self.last_step = step_start;
        } else {
            *n += 1;
        }
    }
}

/// What the controller remembers of one FederatedHPA between passes.
#[derive(Debug, Default)]
struct Memory {
    history: recommend::History,
    series: Option<UsageSeries>,
    /// Readings in the series' current step.
    in_step: u32,
    /// The forecast's peak per resource over the horizon, and the step it was made at.
    forecast: Option<(i64, Result<Peaks, String>)>,
}

type Key = (String, String);

/// Per resource: the forecast's peak over the horizon, and the model that made it.
pub type Peaks = BTreeMap<String, (f64, String)>;

fn usage_key(ns: &str, name: &str) -> String {
    format!("{USAGE_PREFIX}{ns}/{name}")
}

/// The usage the members report for the template, summed over its binding's clusters;
/// `None` when no member reports any.
async fn gather(
    store: &dyn Store,
    ns: &str,
    kind: &str,
    name: &str,
) -> Result<Option<WorkloadUsage>, StoreError> {
    let bname = binding::name_for(kind, name);
    let b = match store.get(&keys::well_known::binding(ns, &bname)).await {
        Ok(b) => b,
        Err(StoreError::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    let Some(spec) = BindingSpec::of(&b) else {
        return Ok(None);
    };
    let mut total: Option<WorkloadUsage> = None;
    for c in &spec.clusters {
        let key = keys::well_known::work(
            &orrery_api::cluster::namespace_of(&c.name),
            &binding::work_name(ns, &bname),
        );
        let w = match store.get(&key).await {
            Ok(w) => w,
            Err(StoreError::NotFound { .. }) => continue,
            Err(e) => return Err(e),
        };
        let Some(st) = w
            .status
            .as_ref()
            .and_then(|s| WorkStatus::deserialize(s).ok())
        else {
            continue;
        };
        for m in &st.manifest_statuses {
            if m.identifier.kind != kind || m.identifier.name != name {
                continue;
            }
            if let Some(u) = &m.usage {
                let t = total.get_or_insert_with(WorkloadUsage::default);
                t.ready_pods += u.ready_pods;
                t.unready_pods += u.unready_pods;
                t.cpu_milli += u.cpu_milli;
                t.cpu_request_milli += u.cpu_request_milli;
                t.memory_bytes += u.memory_bytes;
                t.memory_request_bytes += u.memory_request_bytes;
            }
        }
    }
    Ok(total)
}

/// A resource's total usage in its base unit, and its request per ready pod.
pub fn reading(u: &WorkloadUsage, resource: &str) -> (f64, Option<f64>) {
    let (used, req) = match resource {
        "cpu" => (
            u.cpu_milli as f64 / 1000.0,
            u.cpu_request_milli as f64 / 1000.0,
        ),
        _ => (u.memory_bytes as f64, u.memory_request_bytes as f64),
    };
    let per_pod = (u.ready_pods > 0 && req > 0.0).then(|| req / u.ready_pods as f64);
    (used, per_pod)
}

/// The forecast's bound, highest over the next `horizon` points, per resource.
pub fn forecast_peaks(
    series: &UsageSeries,
    season_points: usize,
    horizon_points: usize,
    bound: Bound,
) -> Result<Peaks, String> {
    let mut out = BTreeMap::new();
    for (resource, y) in &series.points {
        if y.len() < season_points + season_points / 4 {
            return Err(format!(
                "recording the workload's usage: {} of the {} points a forecast needs",
                y.len(),
                season_points + season_points / 4
            ));
        }
        let settings = orrery_forecast::Settings {
            season: Some(season_points),
            ..Default::default()
        };
        let fc = orrery_forecast::forecast(y, horizon_points.max(1), &settings)
            .map_err(|e| format!("no forecast of its {resource} usage: {e}"))?;
        let peak = fc
            .points
            .iter()
            .map(|b| match bound {
                Bound::Mean => b.mean,
                Bound::Upper80 => b.upper80,
                Bound::Upper95 => b.upper95,
            })
            .fold(0.0_f64, f64::max);
        // What the workload used over the same stretch a season ago: a model chosen for
        // being right most of the day smooths away a ramp that comes at the same time each
        // day, and the autoscaler must not miss that one.
        let h = horizon_points.max(1);
        let last_season = y[y.len() - season_points..]
            .iter()
            .take(h)
            .fold(0.0_f64, |m, v| m.max(*v));
        let (peak, model) = if last_season > peak {
            (
                last_season,
                format!("{} (last season's peak)", fc.model.name()),
            )
        } else {
            (peak, fc.model.name().to_string())
        };
        out.insert(resource.clone(), (peak, model));
    }
    if out.is_empty() {
        return Err("no usage recorded yet".into());
    }
    Ok(out)
}

struct Scaler {
    store: Arc<dyn Store>,
    settings: Settings,
    memory: BTreeMap<Key, Memory>,
}

impl Scaler {
    fn step_seconds(&self) -> i64 {
        (self.settings.season.as_secs() as i64 / SEASON_POINTS as i64)
            .max(self.settings.sync_period.as_secs().max(1) as i64)
    }

    fn season_points(&self) -> usize {
        (self.settings.season.as_secs() as i64 / self.step_seconds()).max(4) as usize
    }

    async fn reconcile(&mut self, o: &Object, spec: &FederatedHPASpec, rivals: &[String]) {
        let ns = o.namespace().to_string();
        let name = o.name().to_string();
        let now = Time::now();
        let secs = now.unix_seconds();
        let old: FederatedHPAStatus = o
            .status
            .clone()
            .and_then(|s| serde_json::from_value(s).ok())
            .unwrap_or_default();
        let mut st = old.clone();
        st.observed_generation = o.metadata.generation;
        let r = &spec.scale_target_ref;
        if !rivals.is_empty() {
            // Kubernetes' reading: two autoscalers on one workload would fight; neither scales.
            set(
                &mut st,
                "ScalingActive",
                false,
                "AmbiguousSelector",
                &format!(
                    "{} {} is scaled by more than one FederatedHPA ({name}, {}): none of them scales it",
                    r.kind,
                    r.name,
                    rivals.join(", ")
                ),
                now,
            );
            self.write(o, &old, st).await;
            return;
        }
        let (tkey, template) = match self.read_target(&ns, r).await {
            Ok(x) => x,
            Err(msg) => {
                set(&mut st, "AbleToScale", false, "FailedGetScale", &msg, now);
                self.write(o, &old, st).await;
                return;
            }
        };
        let current = template
            .spec
            .as_ref()
            .and_then(|s| s.get("replicas"))
            .and_then(serde_json::Value::as_i64)
            .unwrap_or(1) as i32;
        st.current_replicas = current;
        let usage = match gather(self.store.as_ref(), &ns, &r.kind, &r.name).await {
            Ok(u) => u,
            Err(e) => {
                tracing::warn!(federatedhpa = %format!("{ns}/{name}"), error = %e, "reading the members' usage");
                return;
            }
        };
        let targets = spec.targets();
        let step = self.step_seconds();
        let season_points = self.season_points();
        let keep = season_points * self.settings.seasons_kept.max(2);
        let ahead = spec
            .predictive
            .as_ref()
            .map(|p| p.resolve(self.settings.ahead));
        let key = (ns.clone(), name.clone());
        // The usage is recorded for a predictive FederatedHPA only.
        if ahead.is_some() && self.memory.get(&key).is_none_or(|m| m.series.is_none()) {
            self.load_series(&key, step).await;
        }
        let mem = self.memory.entry(key.clone()).or_default();
        let mut predicted = None;
        let mut prediction_status = None;
        if let (Some(ahead), Some(u)) = (ahead, usage.as_ref()) {
            let readings: BTreeMap<String, f64> = targets
                .iter()
                .map(|t| (t.resource().to_string(), reading(u, t.resource()).0))
                .collect();
            let series = mem.series.get_or_insert_with(UsageSeries::default);
            let before = series.last_step;
            series.push(secs, &readings, &mut mem.in_step, keep);
            let stepped = series.last_step != before;
            if stepped {
                // A step ended: store the series and forecast again.
                store_series(self.store.as_ref(), &ns, &name, series).await;
                let horizon_points = (ahead.horizon_seconds as usize).div_ceil(step as usize);
                mem.forecast = Some((
                    series.last_step,
                    forecast_peaks(series, season_points, horizon_points, ahead.bound),
                ));
            }
            let (p, ps) = prediction(&ahead, step, mem.forecast.as_ref(), &targets, u);
            predicted = p;
            prediction_status = Some(ps);
        }
        let window = self.settings.downscale_window.as_secs() as i64;
        let d = mem
            .history
            .decide(spec, current, usage.as_ref(), predicted, secs, window);
        st.prediction = prediction_status;
        st.current_metrics = metric_statuses(&d.readings);
        set_metric_conditions(&mut st, &d, &targets, now);
        st.desired_replicas = d.desired;
        if d.desired != current && d.inactive.is_none() {
            match super::scale(self.store.as_ref(), &tkey, d.desired).await {
                Ok(_) => {
                    tracing::info!(federatedhpa = %format!("{ns}/{name}"), from = current, to = d.desired, predicted = ?predicted, reason = d.out_of_range.unwrap_or("metrics"), "scaled");
                    mem.history.scaled(current, d.desired, secs);
                    st.last_scale_time = Some(now);
                    st.current_replicas = d.desired;
                    set(
                        &mut st,
                        "AbleToScale",
                        true,
                        "SucceededRescale",
                        &format!(
                            "the HPA controller was able to update the target scale to {}",
                            d.desired
                        ),
                        now,
                    );
                }
                Err(e) => set(&mut st, "AbleToScale", false, "FailedUpdateScale", &e, now),
            }
        } else {
            set(
                &mut st,
                "AbleToScale",
                true,
                "ReadyForNewScale",
                "recommended size matches current size",
                now,
            );
        }
        self.write(o, &old, st).await;
    }

    /// Reads the scale target (its key and object); else the `FailedGetScale` message.
    async fn read_target(
        &self,
        ns: &str,
        r: &orrery_api::autoscaling::CrossVersionObjectReference,
    ) -> Result<(String, Object), String> {
        let template = match super::target_key(ns, r) {
            Some(k) => self.store.get(&k).await.map(|t| (k, t)),
            None => Err(StoreError::NotFound {
                key: r.kind.clone(),
            }),
        };
        template.map_err(|e| match e {
            StoreError::NotFound { .. } => {
                format!("the scale target {} {} does not exist", r.kind, r.name)
            }
            e => format!("the scale target could not be read: {e}"),
        })
    }

    /// Takes up the usage series recorded before (a restart shortens no window), or starts
    /// one; a stored series of another step is dropped.
    async fn load_series(&mut self, key: &Key, step: i64) {
        let (ns, name) = key;
        let stored = match self.store.get(&usage_key(ns, name)).await {
            Ok(s) => s
                .spec
                .clone()
                .and_then(|v| serde_json::from_value::<UsageSeries>(v).ok())
                .filter(|s| s.step == step),
            Err(_) => None,
        };
        self.memory.entry(key.clone()).or_default().series = Some(stored.unwrap_or(UsageSeries {
            step,
            ..Default::default()
        }));
    }

    async fn write(&self, o: &Object, old: &FederatedHPAStatus, st: FederatedHPAStatus) {
        if &st == old {
            return;
        }
        let Ok(value) = serde_json::to_value(&st) else {
            return;
        };
        let key = keys::object(
            orrery_api::autoscaling::GROUP,
            f::PLURAL,
            Some(o.namespace()),
            o.name(),
        );
        let mut next = o.clone();
        next.status = Some(value);
        // Against the object as read: a change meanwhile is looked at again next pass.
        match self.store.update(&key, next, o.revision()).await {
            Ok(_) | Err(StoreError::Conflict { .. }) | Err(StoreError::NotFound { .. }) => {}
            Err(e) => tracing::warn!(error = %e, "writing a FederatedHPA's status"),
        }
    }
}

/// Stores the recorded usage series (a failure is logged; the next step tries again).
async fn store_series(store: &dyn Store, ns: &str, name: &str, series: &UsageSeries) {
    let mut so = Object::new("internal.orrery.io/v1", "UsageSeries").with_name(name);
    so.metadata.namespace = ns.to_string();
    so.spec = serde_json::to_value(series).ok();
    let k = usage_key(ns, name);
    let w = match store.get(&k).await {
        Ok(mut prev) => {
            prev.spec = so.spec;
            store.update(&k, prev, None).await.map(|_| ())
        }
        Err(StoreError::NotFound { .. }) => store.create(&k, so).await.map(|_| ()),
        Err(e) => Err(e),
    };
    if let Err(e) = w {
        tracing::warn!(federatedhpa = %format!("{ns}/{name}"), error = %e, "storing the recorded usage");
    }
}

/// The replicas the forecast asks for (the most any target's peak needs), and the
/// prediction's status.
fn prediction(
    ahead: &Ahead,
    step: i64,
    forecast: Option<&(i64, Result<Peaks, String>)>,
    targets: &[Target],
    u: &WorkloadUsage,
) -> (Option<i32>, PredictionStatus) {
    let mut predicted = None;
    let mut ps = PredictionStatus {
        horizon: orrery_api::prediction::format_seconds(ahead.horizon_seconds),
        bound: ahead.bound.as_str().to_string(),
        ..Default::default()
    };
    match forecast.map(|(_, f)| f) {
        Some(Ok(peaks)) => {
            let mut models = Vec::new();
            for t in targets {
                if let (Some((peak, model)), (_, Some(per_pod))) =
                    (peaks.get(t.resource()), reading(u, t.resource()))
                    && let Some(n) = recommend::replicas_for(t, *peak, per_pod)
                {
                    predicted = Some(predicted.map_or(n, |p: i32| p.max(n)));
                    models.push(format!("{} {model}", t.resource()));
                }
            }
            ps.replicas = predicted.unwrap_or(0);
            ps.message = format!("forecast by {}", models.join(", "));
        }
        Some(Err(why)) => ps.message = why.clone(),
        None => {
            ps.message = format!(
                "recording the workload's usage: a point every {step}s, a forecast once a season and a quarter are in"
            )
        }
    }
    (predicted, ps)
}

/// The status's `currentMetrics`: each reading of the decision.
fn metric_statuses(readings: &[recommend::Reading]) -> Vec<MetricStatus> {
    readings
        .iter()
        .map(|r| MetricStatus {
            type_: "Resource".into(),
            resource: Some(ResourceMetricStatus {
                name: r.resource.clone(),
                current: MetricValueStatus {
                    average_value: Some(average_text(&r.resource, r.average)),
                    average_utilization: r.utilization,
                },
            }),
        })
        .collect()
}

/// `ScalingActive` and `ScalingLimited` as the decision says.
fn set_metric_conditions(
    st: &mut FederatedHPAStatus,
    d: &recommend::Decision,
    targets: &[Target],
    now: Time,
) {
    match (&d.inactive, d.out_of_range) {
        // Brought within the bounds before any metric was read: ScalingActive stays as it
        // was (Kubernetes' order).
        (_, Some(_)) => {}
        (Some((reason, msg)), None) => set(st, "ScalingActive", false, reason, msg, now),
        (None, None) => {
            let what = targets
                .iter()
                .map(|t| match t {
                    Target::Utilization { resource, .. } => {
                        format!("{resource} resource utilization (percentage of request)")
                    }
                    Target::AverageValue { resource, .. } => {
                        format!("{resource} resource")
                    }
                })
                .collect::<Vec<_>>()
                .join(", ");
            set(
                st,
                "ScalingActive",
                true,
                "ValidMetricFound",
                &format!("the HPA was able to successfully calculate a replica count from {what}"),
                now,
            );
        }
    }
    match &d.limited {
        Some((reason, msg)) => set(st, "ScalingLimited", true, reason, msg, now),
        None => set(
            st,
            "ScalingLimited",
            false,
            "DesiredWithinRange",
            "the desired count is within the acceptable range",
            now,
        ),
    }
}

fn average_text(resource: &str, v: f64) -> String {
    if resource == "cpu" {
        format!("{}m", (v * 1000.0).round() as i64)
    } else {
        format!("{}", v.round() as i64)
    }
}

fn set(st: &mut FederatedHPAStatus, type_: &str, ok: bool, reason: &str, msg: &str, now: Time) {
    let status = if ok {
        conditions::TRUE
    } else {
        conditions::FALSE
    };
    conditions::set(
        &mut st.conditions,
        Condition::new(type_, status, reason, msg),
        now,
    );
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Task {
    /// Every FederatedHPA, once a sync period.
    Pass,
    /// After a listing: the usage series of FederatedHPAs deleted while the server was down.
    Sweep,
    /// A deleted FederatedHPA: its usage series goes.
    Forget(Key),
}

/// The scaler remembers between passes (usage series, forecasts), so it is behind an async
/// lock (one pass at a time).
struct FederatedHpas {
    scaler: tokio::sync::Mutex<Scaler>,
    objects: Arc<Cache>,
}

impl FederatedHpas {
    async fn pass(&self) {
        let mut c = self.scaler.lock().await;
        // Each spec read once a pass (admission checked them: one that does not read is
        // skipped).
        let all: Vec<(Arc<Object>, FederatedHPASpec)> = self
            .objects
            .list()
            .into_iter()
            .filter(|o| o.metadata.deletion_timestamp.is_none())
            .filter_map(|o| {
                FederatedHPASpec::parse(o.spec.as_ref())
                    .ok()
                    .map(|s| (o, s))
            })
            .collect();
        // Which FederatedHPAs scale each workload.
        let target = |o: &Object, s: &FederatedHPASpec| {
            let r = &s.scale_target_ref;
            (o.namespace().to_string(), r.kind.clone(), r.name.clone())
        };
        let mut by_target: BTreeMap<(String, String, String), Vec<String>> = BTreeMap::new();
        for (o, s) in &all {
            by_target
                .entry(target(o, s))
                .or_default()
                .push(o.name().to_string());
        }
        for (o, spec) in all {
            let rivals: Vec<String> = by_target
                .get(&target(&o, &spec))
                .into_iter()
                .flatten()
                .filter(|n| *n != o.name())
                .cloned()
                .collect();
            c.reconcile(&o, &spec, &rivals).await;
        }
    }
}

fn key_of(o: &Object) -> Key {
    (o.namespace().to_string(), o.name().to_string())
}

#[async_trait::async_trait]
impl Reconciler for FederatedHpas {
    type Key = Task;
    type Error = StoreError;

    /// The cache follows the events; what is remembered of a FederatedHPA goes with it.
    fn on_event(&mut self, _: Origin, ev: Event, keys: &mut Keys<Task>) {
        let memory = &mut self.scaler.get_mut().memory;
        match ev {
            Event::Listed(items) => {
                let listed: std::collections::BTreeSet<Key> =
                    items.iter().map(|o| key_of(o)).collect();
                memory.retain(|k, _| listed.contains(k));
                keys.push(Task::Sweep);
            }
            Event::Upsert(_) => {}
            Event::Delete(o) => {
                let k = key_of(&o);
                memory.remove(&k);
                keys.push(Task::Forget(k));
            }
        }
    }

    fn all_keys(&self) -> Vec<Task> {
        vec![Task::Pass]
    }

    async fn reconcile(&self, task: &Task) -> Result<Action, StoreError> {
        let store = self.scaler.lock().await.store.clone();
        match task {
            Task::Pass => {
                // A sync period apart, from start to start.
                let started = std::time::Instant::now();
                self.pass().await;
                let period = self.scaler.lock().await.settings.sync_period;
                let period = period.max(Duration::from_millis(100));
                return Ok(Action::After(period.saturating_sub(started.elapsed())));
            }
            Task::Sweep => {
                let page = store.list(USAGE_PREFIX, &Default::default()).await?;
                for s in page.items {
                    let k = key_of(&s);
                    if self.objects.get(&k.0, &k.1).is_none() {
                        forget(store.as_ref(), &k).await?;
                    }
                }
            }
            Task::Forget(k) => forget(store.as_ref(), k).await?,
        }
        Ok(Action::Done)
    }
}

async fn forget(store: &dyn Store, (ns, name): &Key) -> Result<(), StoreError> {
    match store
        .delete(&usage_key(ns, name), &Default::default())
        .await
    {
        Ok(_) | Err(StoreError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Runs every FederatedHPA until shutdown.
pub async fn run(
    store: Arc<dyn Store>,
    settings: Settings,
    metrics: Handle,
    shutdown: watch::Receiver<bool>,
) {
    let objects = Arc::new(Cache::new(&[]));
    let r = FederatedHpas {
        scaler: tokio::sync::Mutex::new(Scaler {
            store: store.clone(),
            settings,
            memory: BTreeMap::new(),
        }),
        objects: objects.clone(),
    };
    let prefix = orrery_api::kinds::FEDERATED_HPA.prefix(None);
    Controller::new("federatedhpa", store, r, metrics)
        .source(Source::new("federatedhpas", prefix).cached(objects))
        .run(shutdown)
        .await;
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    async fn put(store: &dyn Store, key: &str, o: Object) {
        match store.get(key).await {
            Ok(old) => {
                let mut next = o;
                next.metadata = old.metadata.clone();
                store.update(key, next, None).await.unwrap();
            }
            Err(_) => {
                store.create(key, o).await.unwrap();
            }
        }
    }

    /// A Work in `cluster` reporting `cpu` millicores used by `ready` pods of 500m each.
    async fn report(store: &dyn Store, cluster: &str, ready: i64, cpu: i64) {
        let mut w = Object::new("multicluster.io/v1alpha1", "Work")
            .with_name(binding::work_name("default", "web-deployment"))
            .with_namespace(orrery_api::cluster::namespace_of(cluster));
        w.status = Some(serde_json::json!({"manifestStatuses": [{
            "identifier": {"ordinal": 0, "group": "apps", "version": "v1", "kind": "Deployment",
                           "namespace": "default", "name": "web"},
            "usage": {"readyPods": ready, "unreadyPods": 0, "cpuMilli": cpu,
                      "cpuRequestMilli": ready * 500, "memoryBytes": 0, "memoryRequestBytes": 0}}]}));
        let key = keys::well_known::work(
            &orrery_api::cluster::namespace_of(cluster),
            &binding::work_name("default", "web-deployment"),
        );
        put(store, &key, w).await;
    }

    fn replicas(o: &Object) -> i64 {
        o.spec.as_ref().unwrap()["replicas"].as_i64().unwrap()
    }

    /// The controller against a store: it scales the template on the usage the Works
    /// report, writes status, and a restarted controller scales nothing down before a
    /// window has passed; the usage series of a FederatedHPA gone while it was down goes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn scales_on_reported_usage_and_a_restart_shortens_no_window() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(orrery_store_sqlite::SqliteStore::open_dir(dir.path()).unwrap());
        let tkey = keys::object("apps", "deployments", Some("default"), "web");
        let mut d = Object::new("apps/v1", "Deployment")
            .with_name("web")
            .with_namespace("default");
        d.spec = Some(serde_json::json!({"replicas": 2}));
        store.create(&tkey, d).await.unwrap();
        let mut b = Object::new("multicluster.io/v1alpha1", "ResourceBinding")
            .with_name("web-deployment")
            .with_namespace("default");
        b.spec = Some(serde_json::json!({
            "resource": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "default", "name": "web"},
            "replicas": 2,
            "policy": {"apiVersion": "multicluster.io/v1alpha1", "kind": "ResourcePlacementPolicy", "name": "web"},
            "clusters": [{"name": "a", "replicas": 1}, {"name": "b", "replicas": 1}],
        }));
        store
            .create(&keys::well_known::binding("default", "web-deployment"), b)
            .await
            .unwrap();
        // 2 pods of 500m using 1600m: 160 % of requests against 80 %: 4 replicas.
        report(store.as_ref(), "a", 1, 800).await;
        report(store.as_ref(), "b", 1, 800).await;
        let mut h = Object::new("autoscaling.karmada.io/v1alpha1", "FederatedHPA")
            .with_name("web")
            .with_namespace("default");
        h.spec = Some(serde_json::json!({
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
            "minReplicas": 1, "maxReplicas": 10}));
        let hkey = keys::object(
            orrery_api::autoscaling::GROUP,
            f::PLURAL,
            Some("default"),
            "web",
        );
        store.create(&hkey, h).await.unwrap();
        // The usage of a FederatedHPA deleted while the controller was down.
        let mut orphan = Object::new("internal.orrery.io/v1", "UsageSeries")
            .with_name("gone")
            .with_namespace("default");
        orphan.spec = Some(serde_json::json!({"step": 1, "lastStep": 0, "points": {}}));
        store
            .create(&usage_key("default", "gone"), orphan)
            .await
            .unwrap();
        let settings = Settings {
            sync_period: Duration::from_millis(100),
            downscale_window: Duration::from_secs(60),
            ..Default::default()
        };
        let (stop, rx) = watch::channel(false);
        let task = tokio::spawn(run(
            store.clone(),
            settings.clone(),
            crate::runtime::metrics::ControllerMetrics::default().of("test"),
            rx,
        ));
        let mut scaled = 0;
        for _ in 0..50 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            scaled = replicas(&store.get(&tkey).await.unwrap());
            if scaled != 2 {
                break;
            }
        }
        assert_eq!(scaled, 4, "{:?}", store.get(&hkey).await.unwrap().status);
        // The status is written after the scale: wait for it.
        let mut status = None;
        for _ in 0..50 {
            status = store.get(&hkey).await.unwrap().status.clone();
            if status.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let st: FederatedHPAStatus = serde_json::from_value(status.unwrap()).unwrap();
        assert_eq!(
            st.current_metrics[0]
                .resource
                .as_ref()
                .unwrap()
                .current
                .average_utilization,
            Some(160)
        );
        assert!(st.last_scale_time.is_some());
        assert!(matches!(
            store.get(&usage_key("default", "gone")).await,
            Err(StoreError::NotFound { .. })
        ));
        stop.send(true).unwrap();
        task.await.unwrap();
        // The load falls away while the controller is down (4 pods at 10 %): started again,
        // it keeps 4 for its 60-second window, as it would have without the restart.
        report(store.as_ref(), "a", 2, 100).await;
        report(store.as_ref(), "b", 2, 100).await;
        let (stop, rx) = watch::channel(false);
        let task = tokio::spawn(run(
            store.clone(),
            settings,
            crate::runtime::metrics::ControllerMetrics::default().of("test"),
            rx,
        ));
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(replicas(&store.get(&tkey).await.unwrap()), 4);
        let st: FederatedHPAStatus =
            serde_json::from_value(store.get(&hkey).await.unwrap().status.clone().unwrap())
                .unwrap();
        assert_eq!(st.desired_replicas, 4, "{st:?}");
        // A second FederatedHPA on the same Deployment: neither scales it, both say why.
        let mut rival = Object::new("autoscaling.karmada.io/v1alpha1", "FederatedHPA")
            .with_name("web-too")
            .with_namespace("default");
        rival.spec = Some(serde_json::json!({
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
            "minReplicas": 7, "maxReplicas": 10}));
        let rkey = keys::object(
            orrery_api::autoscaling::GROUP,
            f::PLURAL,
            Some("default"),
            "web-too",
        );
        store.create(&rkey, rival).await.unwrap();
        let ambiguous = |o: &Object| {
            o.status.as_ref().is_some_and(|s| {
                s["conditions"]
                    .as_array()
                    .is_some_and(|c| c.iter().any(|c| c["reason"] == "AmbiguousSelector"))
            })
        };
        for _ in 0..50 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if ambiguous(&store.get(&hkey).await.unwrap())
                && ambiguous(&store.get(&rkey).await.unwrap())
            {
                break;
            }
        }
        assert!(ambiguous(&store.get(&hkey).await.unwrap()));
        assert!(ambiguous(&store.get(&rkey).await.unwrap()));
        assert_eq!(
            replicas(&store.get(&tkey).await.unwrap()),
            4,
            "the rival's minimum of 7 is not applied"
        );
        stop.send(true).unwrap();
        task.await.unwrap();
    }

    /// A ramp that comes at the same point of every season is in the forecast's peak, even
    /// when the model chosen for the rest of the season smooths it away.
    #[test]
    fn last_seasons_ramp_is_in_the_peak() {
        let season = 12;
        let mut y = Vec::new();
        for i in 0..season * 2 + 4 {
            let at = i % season;
            y.push(if (6..9).contains(&at) {
                10.0
            } else {
                1.0 + 0.01 * (i % 3) as f64
            });
        }
        // The last point is at 3 of its season: of the next 4 (4 to 7), 6 and 7 are in the
        // ramp.
        let series = UsageSeries {
            step: 1,
            last_step: 0,
            points: BTreeMap::from([("cpu".to_string(), y)]),
        };
        let p = forecast_peaks(&series, season, 4, Bound::Mean).unwrap();
        assert!(p["cpu"].0 >= 9.9, "{p:?}");
        // Two points ahead only (4, 5): no ramp then.
        let p = forecast_peaks(&series, season, 2, Bound::Mean).unwrap();
        assert!(p["cpu"].0 < 5.0, "{p:?}");
    }

    /// Readings within a step make its mean; a missed step is filled with the last point;
    /// the series keeps what it is told to.
    #[test]
    fn the_usage_series_keeps_a_mean_per_step() {
        let mut s = UsageSeries {
            step: 10,
            ..Default::default()
        };
        let mut n = 0;
        let r = |v: f64| BTreeMap::from([("cpu".to_string(), v)]);
        s.push(100, &r(2.0), &mut n, 5);
        s.push(105, &r(4.0), &mut n, 5);
        assert_eq!(s.points["cpu"], vec![3.0]);
        s.push(111, &r(1.0), &mut n, 5);
        assert_eq!(s.points["cpu"], vec![3.0, 1.0]);
        // 120 and 130 missed: filled with 1.0.
        s.push(140, &r(5.0), &mut n, 5);
        assert_eq!(s.points["cpu"], vec![3.0, 1.0, 1.0, 1.0, 5.0]);
        s.push(150, &r(6.0), &mut n, 5);
        assert_eq!(s.points["cpu"], vec![1.0, 1.0, 1.0, 5.0, 6.0]);
        assert_eq!(s.last_step, 150);
    }
}
