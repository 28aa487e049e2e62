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

    /// Records one request. `path` is reduced to the resource it names, among those
    /// `served` (group, version, plural) and the server's fixed routes, and the method to the
    /// ones HTTP defines: whatever a client sends, the number of series stays bounded.
    pub fn observe(
        &self,
        method: &str,
        path: &str,
        code: u16,
        seconds: f64,
        served: impl Fn(&str, &str, &str) -> bool,
    ) {
        let verb = match method {
            "GET" | "HEAD" | "POST" | "PUT" | "PATCH" | "DELETE" | "OPTIONS" => {
                method.to_ascii_lowercase()
            }
            _ => crate::routes::OTHER.to_string(),
        };
        self.requests
            .get_or_create(&RequestLabels {
                verb,
                resource: crate::routes::label(path, served),
                code: code.to_string(),
            })
            .observe(seconds);
    }

    /// Reads what the store says now and renders every family.
    pub async fn render(&self, store: &dyn Store) -> Result<String, StoreError> {
        let clusters = store
            .list(&keys::well_known::clusters(), &ListOptions::default())
            .await?;
        let renewed = crate::dro::clusters::renewals(store).await;
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
            if let Some(hb) = st.last_heartbeat_time.max(renewed.get(c.name()).copied()) {
                self.heartbeat_age
                    .get_or_create(&ClusterLabels {
                        cluster: c.name().to_string(),
                    })
                    .set(orrery_api::MicroTime::from(now).millis_since(hb).max(0) as f64 / 1000.0);
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

/// The content type of the OpenMetrics exposition.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The content type of Prometheus' classic text exposition.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Whether a scraper's `Accept` header asks for OpenMetrics (Prometheus does; `curl` and
/// `promtool` read the classic text format, as `client_golang` serves them by default).
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| {
        a.split(',').any(|part| {
            let mut fields = part.split(';').map(str::trim);
            let ty = fields.next().unwrap_or("");
            // `q=0` refuses the type.
            let refused = fields.any(|f| {
                f.strip_prefix("q=")
                    .and_then(|q| q.parse::<f64>().ok())
                    .is_some_and(|q| q <= 0.0)
            });
            ty.eq_ignore_ascii_case("application/openmetrics-text") && !refused
        })
    })
}

/// Rewrites an OpenMetrics text exposition (what `prometheus-client` encodes) in Prometheus'
/// classic text format 0.0.4: a counter family is named with its `_total` suffix, its
/// `_created` samples go, `unknown` becomes `untyped`, and `# UNIT` and `# EOF` lines go.
pub fn to_prometheus_text(openmetrics: &str) -> String {
    use std::collections::HashSet;
    let meta = |line: &str, tag: &str| -> Option<(String, String)> {
        let rest = line.strip_prefix(tag)?;
        let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
        Some((name.to_string(), tail.to_string()))
    };
    let counters: HashSet<String> = openmetrics
        .lines()
        .filter_map(|l| meta(l, "# TYPE "))
        .filter(|(_, t)| t == "counter")
        .map(|(n, _)| n)
        .collect();
    let created: HashSet<String> = counters.iter().map(|c| format!("{c}_created")).collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some((name, tail)) = meta(line, "# HELP ").or_else(|| meta(line, "# TYPE ")) {
            let tag = &line[..7];
            let name = if counters.contains(&name) {
                format!("{name}_total")
            } else {
                name
            };
            let tail = if tag == "# TYPE " && tail == "unknown" {
                "untyped".to_string()
            } else {
                tail
            };
            out.push_str(tag);
            out.push_str(&name);
            if !tail.is_empty() || tag == "# TYPE " {
                out.push(' ');
                out.push_str(&tail);
            }
            out.push('\n');
            continue;
        }
        let sample = line.split(['{', ' ']).next().unwrap_or("");
        if created.contains(sample) {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openmetrics_to_classic_text() {
        let om = "# HELP a_requests Requests.\n# TYPE a_requests counter\n\
                  a_requests_total{verb=\"get\"} 3\na_requests_created{verb=\"get\"} 1.7e9\n\
                  # HELP b_bytes Size.\n# TYPE b_bytes gauge\n# UNIT b_bytes bytes\nb_bytes 5\n\
                  # HELP c Whatever.\n# TYPE c unknown\nc 1\n\
                  # HELP d_seconds Latency.\n# TYPE d_seconds histogram\n\
                  d_seconds_bucket{le=\"+Inf\"} 2\nd_seconds_sum 0.5\nd_seconds_count 2\n\
                  # EOF\n";
        let want = "# HELP a_requests_total Requests.\n# TYPE a_requests_total counter\n\
                    a_requests_total{verb=\"get\"} 3\n\
                    # HELP b_bytes Size.\n# TYPE b_bytes gauge\nb_bytes 5\n\
                    # HELP c Whatever.\n# TYPE c untyped\nc 1\n\
                    # HELP d_seconds Latency.\n# TYPE d_seconds histogram\n\
                    d_seconds_bucket{le=\"+Inf\"} 2\nd_seconds_sum 0.5\nd_seconds_count 2\n";
        assert_eq!(to_prometheus_text(om), want);
    }

    #[test]
    fn negotiation() {
        for (accept, om) in [
            (None, false),
            (Some("*/*"), false),
            (Some("text/plain"), false),
            (
                Some("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"),
                true,
            ),
            (Some("text/plain, application/openmetrics-text; q=0"), false),
            (Some("Application/OpenMetrics-Text"), true),
        ] {
            assert_eq!(wants_openmetrics(accept), om, "{accept:?}");
        }
    }
}
