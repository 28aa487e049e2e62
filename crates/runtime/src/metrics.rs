//! Per-controller figures on `/metrics`: how many keys wait, how long reconciles take, how
//! many fail and how many are retried, labelled by controller.

use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

fn histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_1, 2.0, 18))
}

/// The families, shared by every controller.
#[derive(Debug)]
pub struct ControllerMetrics {
    synced: Family<Labels, Gauge>,
    depth: Family<Labels, Gauge>,
    duration: Family<Labels, Histogram, fn() -> Histogram>,
    errors: Family<Labels, Counter>,
    retries: Family<Labels, Counter>,
}

impl Default for ControllerMetrics {
    /// Unregistered (for controllers nobody scrapes).
    fn default() -> Self {
        ControllerMetrics {
            synced: Family::default(),
            depth: Family::default(),
            duration: Family::new_with_constructor(histogram),
            errors: Family::default(),
            retries: Family::default(),
        }
    }
}

impl ControllerMetrics {
    /// Registers the families.
    pub fn new(registry: &Mutex<Registry>) -> ControllerMetrics {
        let m = ControllerMetrics::default();
        let mut r = registry.lock();
        r.register(
            "orrery_controller_synced",
            "1 once every source a controller reads has been listed (it acts only then)",
            m.synced.clone(),
        );
        r.register(
            "orrery_controller_queue_depth",
            "Keys waiting for a controller to reconcile them",
            m.depth.clone(),
        );
        r.register(
            "orrery_controller_reconcile_duration_seconds",
            "Time a controller's reconcile rounds took",
            m.duration.clone(),
        );
        r.register(
            "orrery_controller_reconcile_errors",
            "Reconciles that failed (their keys are retried)",
            m.errors.clone(),
        );
        r.register(
            "orrery_controller_retries",
            "Keys queued again after a failure",
            m.retries.clone(),
        );
        m
    }

    /// The figures of one controller.
    pub fn of(&self, controller: &str) -> Handle {
        let l: Labels = vec![("controller".to_string(), controller.to_string())];
        Handle {
            name: controller.to_string(),
            idle_once: Arc::new(AtomicBool::new(false)),
            synced: self.synced.get_or_create(&l).clone(),
            depth: self.depth.get_or_create(&l).clone(),
            duration: self.duration.get_or_create(&l).clone(),
            errors: self.errors.get_or_create(&l).clone(),
            retries: self.retries.get_or_create(&l).clone(),
        }
    }
}

/// One controller's figures.
#[derive(Debug, Clone)]
pub struct Handle {
    name: String,
    /// Set once the queue first ran empty after the barrier (logged once: the end of a
    /// start-up's catch-up).
    idle_once: Arc<AtomicBool>,
    pub synced: Gauge,
    pub depth: Gauge,
    pub duration: Histogram,
    pub errors: Counter,
    pub retries: Counter,
}

impl Handle {
    /// The controller's barrier passed: it acts from now on, with `waiting` keys to do.
    pub fn synced(&self, waiting: usize) {
        let before = self.synced.set(1);
        self.depth.set(waiting as i64);
        if before == 0 {
            tracing::debug!(controller = %self.name, waiting, "controller synced");
        }
        self.note_idle(waiting);
    }

    fn note_idle(&self, waiting: usize) {
        if waiting == 0 && !self.idle_once.swap(true, Ordering::Relaxed) {
            tracing::debug!(controller = %self.name, "controller caught up");
        }
    }

    /// Records a round: how long it took, how many keys failed (and are retried), and how
    /// many wait now.
    pub fn round(&self, started: std::time::Instant, failed: usize, waiting: usize) {
        self.duration.observe(started.elapsed().as_secs_f64());
        self.errors.inc_by(failed as u64);
        self.retries.inc_by(failed as u64);
        self.depth.set(waiting as i64);
        self.note_idle(waiting);
    }
}
