//! Leader election among servers sharing one store, through a `coordination.k8s.io/v1` Lease
//! (`orrery-system/orrery-controllers`), as client-go's `leaderelection` does it: a server
//! takes the Lease when it is free or when its holder has not renewed it for the lease duration
//! *as this server has observed it* (its own clock from the moment it saw the record change, so
//! clocks need not agree), renews it every retry period, and gives up leading when it has not
//! renewed for the renew deadline.
//!
//! While leading, the elector publishes a [`Fence`]: the store view made with it commits
//! writes only while this term's Lease stands (see [`orrery_store::Store::fenced`]), so a
//! leader paused past its lease (`SIGSTOP`, a long GC, a partition) commits nothing when it
//! wakes, even before it notices it lost.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use orrery_api::{MicroTime, Object, keys};
use orrery_store::stamp::new_object;
use orrery_store::{Fence, Store, StoreError};
use serde_json::json;
use tokio::sync::watch;

/// The Lease's namespace and name.
pub const NAMESPACE: &str = "orrery-system";
pub const NAME: &str = "orrery-controllers";

/// The Lease's store key.
pub fn lease_key() -> String {
    keys::object("coordination.k8s.io", "leases", Some(NAMESPACE), NAME)
}

/// A holder name for this process: the machine's name and a random suffix, as client-go
/// names holders (a restarted server is a new candidate).
pub fn process_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "orrery".to_string());
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    format!("{host}_{}", &suffix[..8])
}

/// Kubernetes' defaults (kube-controller-manager's `--leader-elect-*`).
#[derive(Clone, Debug)]
pub struct ElectionConfig {
    /// This server's name in the Lease: unique per process (a restarted server is a new
    /// candidate, not the old holder).
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl ElectionConfig {
    pub fn new(identity: impl Into<String>) -> Self {
        ElectionConfig {
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// What the elector last saw of the Lease.
#[derive(Debug)]
struct Observed {
    revision: String,
    /// When this server saw the record change.
    at: Instant,
}

/// The elector's state, for tests and the metrics.
#[derive(Debug)]
pub struct Elector {
    store: Arc<dyn Store>,
    config: ElectionConfig,
    observed: Option<Observed>,
}

/// The outcome of one attempt.
#[derive(Debug, PartialEq)]
enum Attempt {
    /// This server holds the Lease: its term's transitions and the Lease's revision.
    Holding { transitions: i64, revision: i64 },
    /// Another server holds it, and its lease has not run out as observed here.
    Held { holder: String },
}

fn spec_of(lease: &Object) -> (String, i64) {
    let field = |name: &str| lease.spec.as_ref().and_then(|s| s.get(name));
    (
        field("holderIdentity")
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string(),
        field("leaseTransitions")
            .and_then(|v| v.as_i64())
            .unwrap_or(0),
    )
}

fn revision_of(o: &Object) -> i64 {
    o.metadata.resource_version.parse().unwrap_or(0)
}

impl Elector {
    pub fn new(store: Arc<dyn Store>, config: ElectionConfig) -> Self {
        Elector {
            store,
            config,
            observed: None,
        }
    }

    fn spec(&self, transitions: i64, acquired: &str) -> serde_json::Value {
        let now = MicroTime::now().to_string();
        json!({
            "holderIdentity": self.config.identity,
            "leaseDurationSeconds": self.config.lease_duration.as_secs().max(1),
            "acquireTime": acquired,
            "renewTime": now,
            "leaseTransitions": transitions,
        })
    }

    /// Takes or renews the Lease once.
    async fn try_acquire_or_renew(&mut self) -> Result<Attempt, StoreError> {
        let key = lease_key();
        let current = match self.store.get(&key).await {
            Ok(o) => o,
            Err(StoreError::NotFound { .. }) => {
                let mut lease =
                    new_object("coordination.k8s.io/v1", "Lease", Some(NAMESPACE), NAME);
                lease.spec = Some(self.spec(0, &MicroTime::now().to_string()));
                let made = self.store.create(&key, lease).await?;
                return Ok(Attempt::Holding {
                    transitions: 0,
                    revision: revision_of(&made),
                });
            }
            Err(e) => return Err(e),
        };
        let (holder, transitions) = spec_of(&current);
        let changed = self
            .observed
            .as_ref()
            .is_none_or(|o| o.revision != current.metadata.resource_version);
        if changed {
            self.observed = Some(Observed {
                revision: current.metadata.resource_version.clone(),
                at: Instant::now(),
            });
        }
        let mine = holder == self.config.identity;
        let expired = self
            .observed
            .as_ref()
            .is_none_or(|o| o.at.elapsed() >= self.config.lease_duration);
        if !holder.is_empty() && !mine && !expired {
            return Ok(Attempt::Held { holder });
        }
        let (transitions, acquired) = if mine {
            let acquired = current
                .spec
                .as_ref()
                .and_then(|s| s.get("acquireTime"))
                .and_then(|v| v.as_str())
                .map(str::to_string)
                .unwrap_or_else(|| MicroTime::now().to_string());
            (transitions, acquired)
        } else {
            (transitions + 1, MicroTime::now().to_string())
        };
        let mut next = current.clone();
        next.spec = Some(self.spec(transitions, &acquired));
        let written = self
            .store
            .update(&key, next, Some(revision_of(&current)))
            .await?;
        Ok(Attempt::Holding {
            transitions,
            revision: revision_of(&written),
        })
    }

    /// Gives the Lease up (on a clean shutdown), so another server need not wait out the lease
    /// duration. Only this server's own term is released.
    async fn release(&mut self, fence: &Fence) {
        let key = lease_key();
        let Ok(current) = self.store.get(&key).await else {
            return;
        };
        if !fence.holds(&current) {
            return;
        }
        let mut next = current.clone();
        if let Some(spec) = next.spec.as_mut().and_then(|s| s.as_object_mut()) {
            spec.insert("holderIdentity".into(), json!(""));
            spec.insert("leaseDurationSeconds".into(), json!(1));
            spec.insert("renewTime".into(), json!(MicroTime::now().to_string()));
        }
        match self
            .store
            .update(&key, next, Some(revision_of(&current)))
            .await
        {
            Ok(_) => tracing::info!(identity = %self.config.identity, "released the leader lease"),
            Err(e) => tracing::warn!(error = %e, "releasing the leader lease"),
        }
    }
}

/// What a server running the elector sees: `Some(fence)` while it leads.
pub type Leading = watch::Receiver<Option<Fence>>;

/// Runs the elector until `shutdown`; the returned receiver says whether this server leads.
/// On shutdown a leader releases the Lease.
pub fn spawn(
    store: Arc<dyn Store>,
    config: ElectionConfig,
    mut shutdown: watch::Receiver<bool>,
) -> (Leading, tokio::task::JoinHandle<()>) {
    let (tx, rx) = watch::channel(None);
    let task = tokio::spawn(async move {
        let mut elector = Elector::new(store.clone(), config.clone());
        let mut fence: Option<Fence> = None;
        let mut renewed = Instant::now();
        let mut last_holder = String::new();
        // Ends this server's term, if it has one, and says why.
        let step_down = |fence: &mut Option<Fence>, why: &str| {
            if fence.take().is_some() {
                tracing::warn!(identity = %config.identity, "{why}; stepping down");
                let _ = tx.send(None);
            }
        };
        loop {
            // A leader that slept past its renew deadline (paused, starved) steps down before
            // anything else: its lease may already be another's (its writes were fenced
            // meanwhile).
            if renewed.elapsed() >= config.renew_deadline {
                step_down(
                    &mut fence,
                    "leader lease not renewed within the renew deadline",
                );
            }
            // An attempt may not outlast the renew deadline: a store that does not answer
            // must not keep a leader leading.
            let budget = match &fence {
                Some(_) => config.renew_deadline.saturating_sub(renewed.elapsed()),
                None => config.renew_deadline,
            };
            let attempt = match tokio::time::timeout(budget, elector.try_acquire_or_renew()).await {
                Ok(a) => a,
                Err(_) => Err(StoreError::Backend(format!(
                    "no answer from the store within {budget:?}"
                ))),
            };
            match (&attempt, &fence) {
                (
                    Ok(Attempt::Holding {
                        transitions,
                        revision,
                    }),
                    Some(f),
                ) if f.transitions == *transitions => {
                    f.revision.fetch_max(*revision, Ordering::AcqRel);
                    renewed = Instant::now();
                }
                (
                    Ok(Attempt::Holding {
                        transitions,
                        revision,
                    }),
                    _,
                ) => {
                    let f = Fence {
                        key: lease_key(),
                        holder: config.identity.clone(),
                        transitions: *transitions,
                        revision: Arc::new(AtomicI64::new(*revision)),
                    };
                    renewed = Instant::now();
                    tracing::info!(identity = %config.identity, transitions, "became leader");
                    became_leader(&*store, &config.identity).await;
                    fence = Some(f.clone());
                    let _ = tx.send(Some(f));
                }
                (Ok(Attempt::Held { holder }), _) => {
                    step_down(&mut fence, &format!("the leader lease is held by {holder}"));
                    if *holder != last_holder {
                        tracing::info!(%holder, "following the leader");
                        last_holder = holder.clone();
                    }
                }
                (Err(e), _) => {
                    tracing::warn!(error = %e, "leader election: the Lease could not be read or written");
                    if renewed.elapsed() >= config.renew_deadline {
                        step_down(
                            &mut fence,
                            "could not renew the leader lease within the renew deadline",
                        );
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(config.retry_period) => {}
                _ = shutdown.changed() => break,
            }
        }
        if let Some(f) = fence.take() {
            let _ = tx.send(None);
            elector.release(&f).await;
        }
    });
    (rx, task)
}

/// `orrery_leader`: 1 while this server runs the controllers.
#[derive(Clone, Debug, Default)]
pub struct LeaderMetric(prometheus_client::metrics::gauge::Gauge);

impl LeaderMetric {
    pub fn register(registry: &parking_lot::Mutex<prometheus_client::registry::Registry>) -> Self {
        let m = LeaderMetric::default();
        registry.lock().register(
            "orrery_leader",
            "1 while this server holds the leader Lease and runs the controllers, the scheduler, monitoring and push-mode agents",
            m.0.clone(),
        );
        m
    }

    pub fn set(&self, leading: bool) {
        self.0.set(i64::from(leading));
    }
}

/// Kubernetes' record of a new leader: an Event on the Lease, reason `LeaderElection`.
async fn became_leader(store: &dyn Store, identity: &str) {
    let Ok(lease) = store.get(&lease_key()).await else {
        return;
    };
    if let Err(e) = crate::record::event(
        store,
        &lease,
        "Normal",
        "LeaderElection",
        &format!("{identity} became leader"),
        "orrery-controllers",
    )
    .await
    {
        tracing::warn!(error = %e, "recording the leader change");
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    async fn store() -> (tempfile::TempDir, Arc<dyn Store>) {
        let dir = tempfile::tempdir().unwrap();
        let s = orrery_store_sqlite::SqliteStore::open(orrery_store_sqlite::SqliteConfig::new(
            dir.path().join("db"),
        ))
        .unwrap();
        (dir, Arc::new(s))
    }

    fn config(id: &str) -> ElectionConfig {
        ElectionConfig {
            identity: id.into(),
            lease_duration: Duration::from_millis(300),
            renew_deadline: Duration::from_millis(200),
            retry_period: Duration::from_millis(50),
        }
    }

    #[tokio::test]
    async fn one_holds_the_other_takes_over_only_after_the_lease_runs_out_as_it_observed() {
        let (_d, s) = store().await;
        let mut a = Elector::new(s.clone(), config("a"));
        let mut b = Elector::new(s.clone(), config("b"));
        let first = a.try_acquire_or_renew().await.unwrap();
        assert!(matches!(first, Attempt::Holding { transitions: 0, .. }));
        assert_eq!(
            b.try_acquire_or_renew().await.unwrap(),
            Attempt::Held { holder: "a".into() }
        );
        // a renews: same term, a newer revision; b still waits.
        let Attempt::Holding { revision: r1, .. } = first else {
            unreachable!()
        };
        let renewed = a.try_acquire_or_renew().await.unwrap();
        assert!(matches!(renewed, Attempt::Holding { transitions: 0, revision } if revision > r1));
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(
            b.try_acquire_or_renew().await.unwrap(),
            Attempt::Held { holder: "a".into() },
            "b saw a renew 150 ms ago, not a whole lease ago"
        );
        // a stops renewing: b takes over once it has seen no change for the lease duration.
        tokio::time::sleep(Duration::from_millis(350)).await;
        assert!(matches!(
            b.try_acquire_or_renew().await.unwrap(),
            Attempt::Holding { transitions: 1, .. }
        ));
        assert_eq!(
            a.try_acquire_or_renew().await.unwrap(),
            Attempt::Held { holder: "b".into() }
        );
    }

    #[tokio::test]
    async fn a_released_lease_is_taken_at_once_and_the_leader_change_is_recorded() {
        let (_d, s) = store().await;
        let (shut_a, rx_a) = watch::channel(false);
        let (mut leading_a, task_a) = spawn(s.clone(), config("a"), rx_a);
        leading_a.wait_for(Option::is_some).await.unwrap();
        let (_shut_b, rx_b) = watch::channel(false);
        let (mut leading_b, _task_b) = spawn(s.clone(), config("b"), rx_b);
        tokio::time::sleep(Duration::from_millis(120)).await;
        assert!(leading_b.borrow().is_none());
        let started = Instant::now();
        shut_a.send(true).unwrap();
        task_a.await.unwrap();
        leading_b.wait_for(Option::is_some).await.unwrap();
        // Released: b need not wait out a's 300 ms lease.
        assert!(started.elapsed() < Duration::from_millis(250));
        let events = s
            .list(
                &keys::prefix("", "events", Some(NAMESPACE)),
                &Default::default(),
            )
            .await
            .unwrap();
        let said: Vec<String> = events
            .items
            .iter()
            .filter_map(|e| e.other.get("message").and_then(|m| m.as_str()))
            .map(str::to_string)
            .collect();
        assert!(said.contains(&"a became leader".to_string()), "{said:?}");
        assert!(said.contains(&"b became leader".to_string()), "{said:?}");
    }
}
