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
use tokio::sync::watch;

use crate::informer::{self, Event};

/// How often and for how long.
#[derive(Clone, Debug)]
pub struct MonitoringConfig {
    /// Between raw samples.
    pub interval: Duration,
    /// Raw samples older than this go.
    pub raw_retention: Duration,
    /// 5-minute averages older than this go.
    pub average_retention: Duration,
}

impl Default for MonitoringConfig {
    fn default() -> Self {
        MonitoringConfig {
            interval: Duration::from_secs(15),
            raw_retention: Duration::from_secs(6 * 3600),
            average_retention: Duration::from_secs(14 * 86400),
        }
    }
}

const AVERAGE_EVERY: Duration = Duration::from_secs(300);

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
    mut shutdown: watch::Receiver<bool>,
) {
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
                let s = FleetSample { time: Time::now(), clusters };
                if let Err(e) = write(store.as_ref(), series::RAW_PREFIX, &s).await {
                    tracing::warn!(error = %e, "writing a monitoring sample");
                }
                since_average.push(s);
                if last_average.elapsed() >= AVERAGE_EVERY {
                    last_average = tokio::time::Instant::now();
                    if let Some(avg) = series::average(&std::mem::take(&mut since_average))
                        && let Err(e) = write(store.as_ref(), series::AVERAGE_PREFIX, &avg).await
                    {
                        tracing::warn!(error = %e, "writing a monitoring average");
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
