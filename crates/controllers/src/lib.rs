//! Orrery's controllers. Each watches the store and writes the store; none is called
//! directly, and each converges from what is stored after a restart.
//!
//! - [`health`]: member readiness from heartbeats, health taints, Events and the failure
//!   history;
//! - [`inventory`]: a `ClusterProfile` (KEP-4322) per Cluster;
//! - [`locations`]: a `Location` per city code members are labelled with;
//! - [`quotas`]: a `ClusterResourceClaim` and `ClusterMetrics` per Cluster, and the Kueue
//!   ClusterQueue quotas the claims assign;
//! - [`propagation`]: policies to bindings, scheduling, bindings to Works, status back;
//! - [`migration`]: moves of stateful workloads with their data;
//! - [`data`]: copies of data sets to their readers, caches, refreshes, link booking;
//! - [`record`]: Events and failure records; [`runtime`]: reflectors, sync barriers, work
//!   queues and metrics, what every controller stands on.

use std::sync::Arc;

use orrery_store::Store;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub mod autoscaling;
pub mod data;
pub mod decisions;
pub mod forecasting;
pub mod health;
pub mod inventory;
pub mod leader;
pub mod lifecycle;
pub mod locations;
pub mod migration;
pub mod monitoring;
pub mod propagation;
pub mod quotas;
pub mod record;
/// The runtime (its own crate, which the API server's caches stand on too).
pub use orrery_runtime as runtime;
pub mod services;

/// Settings of the controllers.
#[derive(Debug, Clone, Default)]
pub struct Config {
    pub health: health::HealthConfig,
    /// Where template kinds are stored; without it nothing is propagated.
    pub kinds: Option<Arc<dyn propagation::Kinds>>,
    pub scheduler: propagation::scheduling::Settings,
    pub monitoring: monitoring::MonitoringConfig,
    pub forecast: forecasting::ForecastConfig,
    pub migration: migration::Settings,
    pub data: data::Settings,
    pub autoscaling: autoscaling::federated::Settings,
    pub services: services::Settings,
    pub quotas: quotas::Settings,
    pub inventory: inventory::Settings,
    /// Per-controller figures on `/metrics`.
    pub metrics: Arc<runtime::metrics::ControllerMetrics>,
}

/// Starts every controller.
pub fn spawn(
    store: Arc<dyn Store>,
    cfg: Config,
    shutdown: watch::Receiver<bool>,
) -> Vec<JoinHandle<()>> {
    let mut tasks = vec![
        tokio::spawn(health::run(
            store.clone(),
            cfg.health,
            cfg.metrics.clone(),
            shutdown.clone(),
        )),
        tokio::spawn(inventory::run(
            store.clone(),
            cfg.inventory,
            cfg.metrics.of("inventory"),
            shutdown.clone(),
        )),
        tokio::spawn(decisions::run(
            store.clone(),
            cfg.metrics.of("decisions"),
            shutdown.clone(),
        )),
        tokio::spawn(services::run(
            store.clone(),
            cfg.services,
            cfg.metrics.of("services"),
            shutdown.clone(),
        )),
        tokio::spawn(quotas::run(
            store.clone(),
            cfg.quotas,
            cfg.metrics.of("quotas"),
            shutdown.clone(),
        )),
        tokio::spawn(locations::run(
            store.clone(),
            cfg.metrics.of("locations"),
            shutdown.clone(),
        )),
        tokio::spawn(autoscaling::cron::run(
            store.clone(),
            cfg.metrics.of("cron"),
            shutdown.clone(),
        )),
        tokio::spawn(autoscaling::federated::run(
            store.clone(),
            cfg.autoscaling,
            cfg.metrics.of("federatedhpa"),
            shutdown.clone(),
        )),
    ];
    // The monitoring loop hands its samples to the forecaster, which works apart from it (a
    // round over a large fleet takes longer than a sampling interval).
    // What the forecasts said of times to come goes beside what is measured then.
    let (samples, to_forecast) = tokio::sync::mpsc::channel(64);
    let checks = Arc::new(forecasting::Checks::default());
    tasks.push(tokio::spawn(forecasting::run(
        store.clone(),
        cfg.forecast,
        cfg.monitoring.interval,
        cfg.monitoring.average_every,
        to_forecast,
        checks.clone(),
        cfg.metrics.of("forecasting"),
        shutdown.clone(),
    )));
    tasks.push(tokio::spawn(monitoring::run(
        store.clone(),
        cfg.monitoring,
        Some((samples, checks)),
        cfg.metrics.of("monitoring"),
        shutdown.clone(),
    )));
    if let Some(kinds) = cfg.kinds {
        tasks.push(tokio::spawn(propagation::detector::run(
            store.clone(),
            kinds.clone(),
            cfg.metrics.clone(),
            shutdown.clone(),
        )));
        let mut scheduler = cfg.scheduler;
        scheduler.controller_metrics = cfg.metrics.clone();
        let history = propagation::history::History::spawn(store.clone());
        scheduler.history = Some(history.clone());
        tasks.push(tokio::spawn(propagation::scheduling::run(
            store.clone(),
            scheduler,
            shutdown.clone(),
        )));
        tasks.push(tokio::spawn(propagation::rebalancer::run(
            store.clone(),
            cfg.metrics.of("rebalancer"),
            shutdown.clone(),
        )));
        tasks.push(tokio::spawn(propagation::quota::run(
            store.clone(),
            cfg.metrics.of("federated-quota"),
            shutdown.clone(),
        )));
        tasks.push(tokio::spawn(migration::run(
            store.clone(),
            cfg.migration,
            cfg.metrics.clone(),
            shutdown.clone(),
        )));
        tasks.push(tokio::spawn(data::run(
            store.clone(),
            cfg.data,
            cfg.metrics.clone(),
            shutdown.clone(),
        )));
        tasks.push(tokio::spawn(propagation::binding::run(
            store,
            kinds,
            cfg.metrics.clone(),
            Some(history),
            shutdown,
        )));
    }
    tasks
}
