//! Prometheus exposition at `/metrics` (OpenMetrics text): request latency by verb, resource
//! and status; per-cluster Resource Water Levels and heartbeat age, clusters ready and Works
//! not yet applied (read from the store at scrape time); and whatever other components
//! register in the shared registry (the scheduler's queue depth and decision latency).

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use orrery_api::cluster::{self, ClusterStatus};
use orrery_api::{Time, conditions, keys};
use orrery_store::{ListOptions, Store, StoreError};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The registry the server's components share.
pub type SharedRegistry = Arc<Mutex<Registry>>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    verb: String,
    resource: String,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LevelLabels {
    cluster: String,
    dimension: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterLabels {
    cluster: String,
}

/// The API server's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: SharedRegistry,
    requests: Family<RequestLabels, Histogram>,
    water_level: Family<LevelLabels, Gauge<f64, AtomicU64>>,
    heartbeat_age: Family<ClusterLabels, Gauge<f64, AtomicU64>>,
    clusters_ready: Gauge,
    works_pending: Gauge,
}

impl Metrics {
    /// Registers the server's families in `registry`.
    pub fn new(registry: SharedRegistry) -> Metrics {
        let requests = Family::<RequestLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0005, 2.0, 16))
        });
        let water_level = Family::<LevelLabels, Gauge<f64, AtomicU64>>::default();
        let heartbeat_age = Family::<ClusterLabels, Gauge<f64, AtomicU64>>::default();
        let clusters_ready = Gauge::default();
        let works_pending = Gauge::default();
        {
            let mut r = registry.lock().unwrap_or_else(|p| p.into_inner());
            r.register(
                "orrery_http_request_duration_seconds",
                "API request latency by verb, resource and status code",
                requests.clone(),
            );
            r.register(
                "orrery_cluster_water_level",
                "Resource Water Level of each member cluster by dimension (0-1)",
                water_level.clone(),
            );
            r.register(
                "orrery_cluster_heartbeat_age_seconds",
                "Seconds since each member cluster's last heartbeat",
                heartbeat_age.clone(),
            );
            r.register(
                "orrery_clusters_ready",
                "Member clusters that are Ready",
                clusters_ready.clone(),
            );
            r.register(
                "orrery_works_pending",
                "Works not yet applied in their member cluster",
                works_pending.clone(),
            );
        }
        Metrics {
            registry,
            requests,
            water_level,
            heartbeat_age,
            clusters_ready,
            works_pending,
        }
    }

    /// Records one request. `path` is reduced to the resource it names, so that the number
    /// of series stays bounded.
    pub fn observe(&self, method: &str, path: &str, code: u16, seconds: f64) {
        self.requests
            .get_or_create(&RequestLabels {
                verb: method.to_ascii_lowercase(),
                resource: resource_of(path),
                code: code.to_string(),
            })
            .observe(seconds);
    }

    /// Reads what the store says now and renders every family.
    pub async fn render(&self, store: &dyn Store) -> Result<String, StoreError> {
        let clusters = store
            .list(&keys::well_known::clusters(), &ListOptions::default())
            .await?;
        let now = Time::now();
        self.water_level.clear();
        self.heartbeat_age.clear();
        let mut ready = 0;
        for c in &clusters.items {
            let st = ClusterStatus::of(c);
            if conditions::find(&st.conditions, cluster::CONDITION_READY)
                .is_some_and(|r| r.is_true())
            {
                ready += 1;
            }
            if let Some(wl) = &st.water_level {
                for (d, v) in &wl.dimensions {
                    self.water_level
                        .get_or_create(&LevelLabels {
                            cluster: c.name().to_string(),
                            dimension: d.clone(),
                        })
                        .set(*v);
                }
                self.water_level
                    .get_or_create(&LevelLabels {
                        cluster: c.name().to_string(),
                        dimension: "overall".into(),
                    })
                    .set(wl.overall);
            }
            if let Some(hb) = st.last_heartbeat_time {
                self.heartbeat_age
                    .get_or_create(&ClusterLabels {
                        cluster: c.name().to_string(),
                    })
                    .set(now.seconds_since(hb).max(0) as f64);
            }
        }
        self.clusters_ready.set(ready);
        let works = store
            .list(&keys::well_known::works(None), &ListOptions::default())
            .await?;
        let pending = works
            .items
            .iter()
            .filter(|w| {
                let applied = w
                    .status
                    .as_ref()
                    .and_then(|s| s.get("conditions"))
                    .and_then(serde_json::Value::as_array)
                    .is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c["type"] == "Applied" && c["status"] == "True")
                    });
                !applied
            })
            .count();
        self.works_pending.set(pending as i64);
        let mut out = String::new();
        let r = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        prometheus_client::encoding::text::encode(&mut out, &r)
            .map_err(|e| StoreError::Backend(format!("encoding metrics: {e}")))?;
        Ok(out)
    }
}

/// The resource a request path names: the plural of a Kubernetes resource, the first segment
/// of a DRO-DS path, or the path's first segment.
pub fn resource_of(path: &str) -> String {
    let s: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let resource_in = |rest: &[&str]| -> String {
        match rest {
            ["namespaces", _, plural, ..] => (*plural).to_string(),
            [plural, ..] => (*plural).to_string(),
            [] => "discovery".to_string(),
        }
    };
    match s.as_slice() {
        ["api", "v1", rest @ ..] => resource_in(rest),
        ["apis", _, _, rest @ ..] => resource_in(rest),
        ["api"] | ["apis"] | ["apis", _] => "discovery".into(),
        [first, ..] => (*first).to_string(),
        [] => "root".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_reduce_to_resources() {
        let cases = [
            ("/api/v1/namespaces/default/configmaps/x", "configmaps"),
            ("/api/v1/namespaces", "namespaces"),
            ("/apis/apps/v1/namespaces/a/deployments", "deployments"),
            (
                "/apis/multicluster.io/v1alpha1/clusters/east/status",
                "clusters",
            ),
            ("/api/v1/clusters", "clusters"),
            ("/api/v1/history/schedules", "history"),
            ("/apis", "discovery"),
            ("/version", "version"),
            ("/", "root"),
        ];
        for (p, want) in cases {
            assert_eq!(resource_of(p), want, "{p}");
        }
    }
}
