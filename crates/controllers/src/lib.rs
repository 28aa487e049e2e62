//! Orrery's controllers. Each watches the store and writes the store; none is called
//! directly, and each converges from what is stored after a restart.
//!
//! - [`health`]: member readiness from heartbeats, health taints, Events and the failure
//!   history;
//! - [`inventory`]: a `ClusterProfile` (KEP-4322) per Cluster;
//! - [`record`]: Events and failure records; [`informer`]: list-then-watch for controllers.

use std::sync::Arc;

use orrery_store::Store;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub mod health;
pub mod informer;
pub mod inventory;
pub mod record;

/// Settings of the controllers.
#[derive(Debug, Clone, Default)]
pub struct Config {
    pub health: health::HealthConfig,
}

/// Starts every controller.
pub fn spawn(
    store: Arc<dyn Store>,
    cfg: Config,
    shutdown: watch::Receiver<bool>,
) -> Vec<JoinHandle<()>> {
    vec![
        tokio::spawn(health::run(store.clone(), cfg.health, shutdown.clone())),
        tokio::spawn(inventory::run(store, shutdown)),
    ]
}
