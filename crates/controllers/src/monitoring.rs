//! The monitoring system's time series (draft 5.1): the fleet's figures (water levels per
//! dimension, reported usage, pods, traffic, readiness) sampled at a fixed interval into the
//! store, kept raw for hours and as 5-minute averages for weeks. `GET /api/v1/monitor/history`
//! reads them (and the browser view's charts).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use orrery_api::cluster::ClusterStatus;
use orrery_api::history::series::{self, ClusterSample, FleetSample};
use orrery_api::{Object, Time, keys};
use orrery_store::{ListOptions, Store, StoreError};
use tokio::sync::{mpsc, watch};

use crate::runtime::reflector::{self as informer, Event};

/// How often and for how long.
#[derive(Clone, Debug)]
pub struct MonitoringConfig {
    /// Between raw samples.
    pub interval: Duration,
    /// Raw samples older than this go.
    pub raw_retention: Duration,
    /// 5-minute averages older than this go.
    pub average_retention: Duration,
    /// Between averages (5 minutes; the API calls their resolution `5m`), and between
    /// prunings.
    pub average_every: Duration,
}

impl Default for MonitoringConfig {
    fn default() -> Self {
        MonitoringConfig {
            interval: Duration::from_secs(15),
            raw_retention: Duration::from_secs(6 * 3600),
            average_retention: Duration::from_secs(14 * 86400),
            average_every: Duration::from_secs(300),
        }
    }
}

/// One cluster's figures now.
pub fn sample_of(c: &Object) -> ClusterSample {
    let st = ClusterStatus::of(c);
    let (level, levels) = match &st.water_level {
        Some(w) => (w.overall, w.dimensions.clone()),
        None => (0.0, BTreeMap::new()),
    };
    ClusterSample {
        ready: st.ready(),
        level,
        levels,
        cpu_usage: st.metrics.as_ref().map(|m| m.cpu_usage),
        memory_available: st.metrics.as_ref().map(|m| m.memory_available),
        pods: st.pods(),
        traffic: st.traffic(),
        forecast: Default::default(),
    }
}

async fn write(store: &dyn Store, prefix: &str, s: &FleetSample) -> Result<(), StoreError> {
    let key = series::key(prefix, s.time.unix_seconds());
    let name = key.trim_start_matches(prefix).to_string();
    let mut o = Object::new("internal.orrery.io/v1", "FleetSample").with_name(&name);
    o.metadata.creation_timestamp = Some(s.time);
    o.spec = serde_json::to_value(s).ok();
    match store.create(&key, o).await {
        // Two samples in one second (a restart): the first stands.
        Ok(_) | Err(StoreError::AlreadyExists { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Deletes records under `prefix` older than `keep`.
async fn prune(store: &dyn Store, prefix: &str, keep: Duration) -> Result<usize, StoreError> {
    let cutoff = series::key(prefix, Time::now().unix_seconds() - keep.as_secs() as i64);
    let mut gone = 0;
    loop {
        let page = store
            .list(prefix, &ListOptions::default().with_limit(500))
            .await?;
        let old: Vec<&Object> = page
            .items
            .iter()
            .filter(|o| format!("{prefix}{}", o.name()) < cutoff)
            .collect();
        if old.is_empty() {
            return Ok(gone);
        }
        for o in &old {
            match store
                .delete(&format!("{prefix}{}", o.name()), &Default::default())
                .await
            {
                Ok(_) | Err(StoreError::NotFound { .. }) => gone += 1,
                Err(e) => return Err(e),
            }
        }
        if old.len() < page.items.len() {
            return Ok(gone);
        }
    }
}

/// Samples the fleet until shutdown.
pub async fn run(
    store: Arc<dyn Store>,
    cfg: MonitoringConfig,
    forecaster: Option<(
        mpsc::Sender<(FleetSample, bool)>,
        Arc<crate::forecasting::Checks>,
    )>,
    mut shutdown: watch::Receiver<bool>,
) {
    // A forecaster that falls behind misses samples rather than holding up the sampling.
    let hand = |s: &FleetSample, average: bool| {
        if let Some((f, _)) = &forecaster {
            let _ = f.try_send((s.clone(), average));
        }
    };
    // What the forecasts said of a sample's time is stored with it.
    let annotate = |s: &mut FleetSample, average: bool| {
        if let Some((_, checks)) = &forecaster {
            checks.annotate(s, average);
        }
    };
    let mut rx = informer::spawn(
        store.clone(),
        keys::well_known::clusters(),
        shutdown.clone(),
    );
    let mut now: BTreeMap<String, Arc<Object>> = BTreeMap::new();
    let mut synced = false;
    let mut tick = tokio::time::interval(cfg.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut since_average: Vec<FleetSample> = Vec::new();
    let mut last_average = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            ev = rx.recv() => match ev {
                None => return,
                // The latest object is kept and read at the tick: a busy fleet changes each
                // Cluster far more often than it is sampled.
                Some(Event::Listed(items)) => {
                    now = items.into_iter().map(|c| (c.name().to_string(), c)).collect();
                    synced = true;
                }
                Some(Event::Upsert(c)) => {
                    now.insert(c.name().to_string(), c);
                }
                Some(Event::Delete(c)) => {
                    now.remove(c.name());
                }
            },
            _ = tick.tick() => {
                if !synced {
                    continue;
                }
                let clusters = now.iter().map(|(n, c)| (n.clone(), sample_of(c))).collect();
                let mut s = FleetSample { time: Time::now(), clusters };
                annotate(&mut s, false);
                if let Err(e) = write(store.as_ref(), series::RAW_PREFIX, &s).await {
                    tracing::warn!(error = %e, "writing a monitoring sample");
                }
                hand(&s, false);
                since_average.push(s);
                if last_average.elapsed() >= cfg.average_every {
                    last_average = tokio::time::Instant::now();
                    if let Some(mut avg) = series::average(&std::mem::take(&mut since_average)) {
                        annotate(&mut avg, true);
                        if let Err(e) = write(store.as_ref(), series::AVERAGE_PREFIX, &avg).await {
                            tracing::warn!(error = %e, "writing a monitoring average");
                        }
                        hand(&avg, true);
                    }
                    for (prefix, keep) in [
                        (series::RAW_PREFIX, cfg.raw_retention),
                        (series::AVERAGE_PREFIX, cfg.average_retention),
                    ] {
                        match prune(store.as_ref(), prefix, keep).await {
                            Ok(n) if n > 0 => tracing::debug!(prefix, removed = n, "monitoring records pruned"),
                            Ok(_) => {}
                            Err(e) => tracing::warn!(error = %e, "pruning monitoring records"),
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(level: f64, at: i64) -> FleetSample {
        let c = ClusterSample {
            ready: true,
            level,
            ..Default::default()
        };
        FleetSample {
            time: Time::from_unix_seconds(at).unwrap(),
            clusters: [("m-0".to_string(), c)].into(),
        }
    }

    async fn levels(store: &dyn Store, prefix: &str) -> Vec<(i64, f64)> {
        let page = store.list(prefix, &ListOptions::default()).await.unwrap();
        page.items
            .iter()
            .map(|o| {
                let s: FleetSample = serde_json::from_value(o.spec.clone().unwrap()).unwrap();
                (s.time.unix_seconds(), s.clusters["m-0"].level)
            })
            .collect()
    }

    /// Samples are taken, averaged and pruned as configured: records past their retention
    /// go, younger ones stay, and the averages are those of the samples.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn samples_are_averaged_and_pruned() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(orrery_store_sqlite::SqliteStore::open_dir(dir.path()).unwrap());
        let now = Time::now().unix_seconds();
        // Left by an earlier run: one raw sample past its retention, one within it, and an
        // average past its own.
        write(store.as_ref(), series::RAW_PREFIX, &sample(0.9, now - 7200))
            .await
            .unwrap();
        write(store.as_ref(), series::RAW_PREFIX, &sample(0.8, now - 600))
            .await
            .unwrap();
        write(
            store.as_ref(),
            series::AVERAGE_PREFIX,
            &sample(0.7, now - 30 * 86400),
        )
        .await
        .unwrap();
        let mut c = Object::new("multicluster.io/v1alpha1", "Cluster").with_name("m-0");
        c.status = Some(serde_json::json!({
            "conditions": [{"type": "Ready", "status": "True"}],
            "waterLevel": {"cpu": 0.25, "overall": 0.25},
        }));
        store
            .create(&keys::well_known::cluster("m-0"), c)
            .await
            .unwrap();
        let cfg = MonitoringConfig {
            interval: Duration::from_millis(200),
            raw_retention: Duration::from_secs(3600),
            average_retention: Duration::from_secs(14 * 86400),
            average_every: Duration::from_millis(1500),
        };
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(run(store.clone(), cfg, None, stopped));
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !levels(store.as_ref(), series::AVERAGE_PREFIX)
            .await
            .iter()
            .any(|(t, _)| *t >= now)
            && std::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = stop.send(true);
        task.await.unwrap();
        // The average went in before the pruning of its round.
        let averages = levels(store.as_ref(), series::AVERAGE_PREFIX).await;
        assert!(!averages.is_empty());
        assert!(
            averages.iter().all(|(t, l)| *t >= now && *l == 0.25),
            "the old average is pruned, the new one is of the samples: {averages:?}"
        );
        let raw = levels(store.as_ref(), series::RAW_PREFIX).await;
        assert!(
            raw.contains(&(now - 600, 0.8)),
            "a sample within its retention stays: {raw:?}"
        );
        assert!(
            !raw.iter().any(|(t, _)| *t == now - 7200),
            "a sample past its retention goes: {raw:?}"
        );
        assert!(
            raw.iter().filter(|(t, l)| *t >= now && *l == 0.25).count() >= 2,
            "samples are taken every interval: {raw:?}"
        );
    }
}
