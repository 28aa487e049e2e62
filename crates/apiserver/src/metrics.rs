//! Prometheus exposition at `/metrics` (OpenMetrics text): request latency by verb, resource
//! and status; per-cluster Resource Water Levels and heartbeat age, clusters ready and Works
//! not yet applied (kept from this replica's watches, so a scrape reads memory); and whatever
//! other components register in the shared registry (the scheduler's queue depth and decision
//! latency).

use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};

use orrery_api::cluster::{self, ClusterStatus};
use orrery_api::{Object, Time, conditions, keys};
use orrery_store::{Store, StoreError};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
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

/// A priority level's seats of one kind ([`crate::fairness`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SeatLabels {
    priority_level: &'static str,
    /// `readOnly` or `mutating`, as kube-apiserver's `request_kind`.
    request_kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RejectLabels {
    priority_level: &'static str,
    reason: &'static str,
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
    watchers: Gauge,
    watch_queued: Gauge,
    watch_queued_max: Gauge,
    seats_in_use: Family<SeatLabels, Gauge>,
    seats_queued: Family<SeatLabels, Gauge>,
    rejected: Family<RejectLabels, Counter>,
    slow_bodies: Counter,
    connections_refused: Counter,
    view: Arc<Mutex<View>>,
    /// The store whose watchers are counted, once [`Metrics::start`] has it.
    store: OnceLock<Arc<dyn Store>>,
    /// Stops the reflectors of the view when the metrics go.
    following: OnceLock<tokio::sync::watch::Sender<bool>>,
    /// The caches of tokens and roles: whether each is in step, their failures and listings
    /// again (set by the server before each render), and what was counted already.
    caches: Family<CacheLabels, Gauge>,
    cache_failures: Family<CacheLabels, Counter>,
    cache_relists: Family<CacheLabels, Counter>,
    counted: Mutex<HashMap<&'static str, (u64, u64)>>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CacheLabels {
    cache: &'static str,
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
        let (watchers, watch_queued, watch_queued_max) =
            (Gauge::default(), Gauge::default(), Gauge::default());
        let (seats_in_use, seats_queued) = (Family::default(), Family::default());
        let rejected = Family::<RejectLabels, Counter>::default();
        let (slow_bodies, connections_refused) = (Counter::default(), Counter::default());
        let caches = Family::<CacheLabels, Gauge>::default();
        let (cache_failures, cache_relists) = (
            Family::<CacheLabels, Counter>::default(),
            Family::<CacheLabels, Counter>::default(),
        );
        {
            let mut r = registry.lock();
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
            r.register(
                "orrery_watchers",
                "Watches this replica serves from its watch cache (clients' and its own)",
                watchers.clone(),
            );
            r.register(
                "orrery_watch_queued_changes",
                "Changes waiting in this replica's watchers' queues, all together",
                watch_queued.clone(),
            );
            r.register(
                "orrery_watch_queued_changes_max",
                "Changes waiting in this replica's fullest watcher queue",
                watch_queued_max.clone(),
            );
            r.register(
                "orrery_request_seats_in_use",
                "Requests being served, by priority level and kind",
                seats_in_use.clone(),
            );
            r.register(
                "orrery_request_seats_queued",
                "Requests waiting for a seat, by priority level and kind",
                seats_queued.clone(),
            );
            r.register(
                "orrery_requests_rejected",
                "Requests told to come back (429) for want of a seat, by priority level and why",
                rejected.clone(),
            );
            r.register(
                "orrery_request_body_timeouts",
                "Requests whose body did not arrive within --request-body-timeout (408)",
                slow_bodies.clone(),
            );
            r.register(
                "orrery_cache_in_step",
                "Whether a security cache of the API server (tokens, rbac) is in step with the store (1) or not (0)",
                caches.clone(),
            );
            r.register(
                "orrery_cache_failures",
                "Listings and watches of a security cache that failed",
                cache_failures.clone(),
            );
            r.register(
                "orrery_cache_relists",
                "Times a security cache listed everything again (its watch lost its history)",
                cache_relists.clone(),
            );
            r.register(
                "orrery_connections_refused",
                "Connections closed at once: their source held --max-connections-per-source",
                connections_refused.clone(),
            );
        }
        Metrics {
            registry,
            requests,
            water_level,
            heartbeat_age,
            clusters_ready,
            works_pending,
            watchers,
            watch_queued,
            watch_queued_max,
            seats_in_use,
            seats_queued,
            rejected,
            slow_bodies,
            connections_refused,
            view: Arc::default(),
            store: OnceLock::new(),
            following: OnceLock::new(),
            caches,
            cache_failures,
            cache_relists,
            counted: Mutex::default(),
        }
    }

    /// Sets a security cache's figures: whether it is in step, and its counts of failures
    /// and listings again so far.
    pub fn cache(&self, cache: &'static str, in_step: bool, (failures, relists): (u64, u64)) {
        let labels = CacheLabels { cache };
        self.caches.get_or_create(&labels).set(i64::from(in_step));
        let mut counted = self.counted.lock();
        let seen = counted.entry(cache).or_default();
        self.cache_failures
            .get_or_create(&labels)
            .inc_by(failures.saturating_sub(seen.0));
        self.cache_relists
            .get_or_create(&labels)
            .inc_by(relists.saturating_sub(seen.1));
        *seen = (failures.max(seen.0), relists.max(seen.1));
    }

    /// A request refused for want of a seat.
    pub fn refused(&self, priority_level: &'static str, reason: &'static str) {
        self.rejected
            .get_or_create(&RejectLabels {
                priority_level,
                reason,
            })
            .inc();
    }

    /// A request whose body did not arrive in time.
    pub fn slow_body(&self) {
        self.slow_bodies.inc();
    }

    /// A connection closed at once for its source's limit.
    pub fn connection_refused(&self) {
        self.connections_refused.inc();
    }

    /// Sets the seat gauges from what each level holds now.
    pub fn seats(&self, request_kind: &'static str, seats: &crate::fairness::Seats) {
        for (level, st) in seats.stats() {
            let labels = SeatLabels {
                priority_level: level.name(),
                request_kind,
            };
            self.seats_in_use
                .get_or_create(&labels)
                .set(st.in_use as i64);
            self.seats_queued
                .get_or_create(&labels)
                .set(st.queued as i64);
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

    /// Reads every Cluster, member Lease and Work, and follows their changes from this
    /// replica's watches (the project's reflector), for [`Metrics::render`]. Returns once
    /// each has been listed.
    pub async fn start(&self, store: Arc<dyn Store>) -> Result<(), StoreError> {
        use orrery_runtime::reflector::{self, Event};
        // Started once per server; a second start keeps counting the first store's watchers.
        let _ = self.store.set(store.clone());
        let (stop, stopped) = tokio::sync::watch::channel(false);
        for part in Part::ALL {
            let mut events = reflector::spawn(store.clone(), part.prefix(), stopped.clone());
            let apply = move |view: &Mutex<View>, ev: Event| {
                let mut v = view.lock();
                match ev {
                    Event::Listed(items) => {
                        v.clear(part);
                        for o in &items {
                            v.apply(part, o, false);
                        }
                    }
                    Event::Upsert(o) => v.apply(part, &o, false),
                    Event::Delete(o) => v.apply(part, &o, true),
                }
            };
            match events.recv().await {
                Some(first @ Event::Listed(_)) => apply(&self.view, first),
                _ => return Err(StoreError::Closed),
            }
            let view = self.view.clone();
            tokio::spawn(async move {
                while let Some(ev) = events.recv().await {
                    apply(&view, ev);
                }
            });
        }
        let _ = self.following.set(stop);
        Ok(())
    }

    /// Renders every family, the members' figures as this replica's watches have them.
    pub fn render(&self) -> Result<String, StoreError> {
        let now = orrery_api::MicroTime::from(Time::now());
        self.water_level.clear();
        self.heartbeat_age.clear();
        {
            let view = self.view.lock();
            let mut ready = 0;
            for (name, f) in &view.clusters {
                ready += i64::from(f.ready);
                for (d, v) in &f.levels {
                    self.water_level
                        .get_or_create(&LevelLabels {
                            cluster: name.clone(),
                            dimension: d.clone(),
                        })
                        .set(*v);
                }
                if let Some(hb) = f.heartbeat.max(view.renewed.get(name).copied()) {
                    self.heartbeat_age
                        .get_or_create(&ClusterLabels {
                            cluster: name.clone(),
                        })
                        .set(now.millis_since(hb).max(0) as f64 / 1000.0);
                }
            }
            self.clusters_ready.set(ready);
            self.works_pending.set(view.pending.len() as i64);
        }
        if let Some(w) = self.store.get().and_then(|s| s.watch_stats()) {
            self.watchers.set(w.watchers as i64);
            self.watch_queued.set(w.queued as i64);
            self.watch_queued_max.set(w.queued_max as i64);
        }
        let mut out = String::new();
        let r = self.registry.lock();
        prometheus_client::encoding::text::encode(&mut out, &r)
            .map_err(|e| StoreError::Backend(format!("encoding metrics: {e}")))?;
        Ok(out)
    }
}

/// What `/metrics` says of the members and their Works, kept from this replica's watches: a
/// scrape reads memory. (Listing every Cluster, Lease and Work at each scrape took a replica
/// 0.6-1 s at 3,000 members, and the heartbeats it served meanwhile waited.)
#[derive(Debug, Default)]
struct View {
    clusters: HashMap<String, Figures>,
    /// When each member's agent last renewed its Lease.
    renewed: HashMap<String, orrery_api::MicroTime>,
    /// Works not yet applied, by namespace and name.
    pending: HashSet<(String, String)>,
}

/// One member's figures.
#[derive(Debug, Default, PartialEq)]
struct Figures {
    ready: bool,
    /// By dimension, and `overall`.
    levels: Vec<(String, f64)>,
    heartbeat: Option<orrery_api::MicroTime>,
}

impl Figures {
    fn of(c: &Object) -> Figures {
        let st = ClusterStatus::of(c);
        let mut levels = Vec::new();
        if let Some(wl) = &st.water_level {
            levels.extend(wl.dimensions.iter().map(|(d, v)| (d.clone(), *v)));
            levels.push(("overall".to_string(), wl.overall));
        }
        Figures {
            ready: conditions::find(&st.conditions, cluster::CONDITION_READY)
                .is_some_and(|r| r.is_true()),
            levels,
            heartbeat: st.last_heartbeat_time,
        }
    }
}

/// The kinds the view follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    Clusters,
    Leases,
    Works,
}

impl Part {
    const ALL: [Part; 3] = [Part::Clusters, Part::Leases, Part::Works];

    fn prefix(self) -> String {
        match self {
            Part::Clusters => keys::well_known::clusters(),
            Part::Leases => keys::well_known::cluster_leases(),
            Part::Works => keys::well_known::works(None),
        }
    }
}

impl View {
    /// Takes in an object of `part` as stored (or deleted).
    fn apply(&mut self, part: Part, o: &Object, deleted: bool) {
        let name = o.name().to_string();
        match part {
            Part::Clusters if deleted => {
                self.clusters.remove(&name);
            }
            Part::Clusters => {
                self.clusters.insert(name, Figures::of(o));
            }
            Part::Leases => match cluster::LeaseBeat::of(o).renew_time {
                Some(t) if !deleted => {
                    self.renewed.insert(name, t);
                }
                _ => {
                    self.renewed.remove(&name);
                }
            },
            Part::Works => {
                let key = (o.namespace().to_string(), name);
                if deleted || applied(o) {
                    self.pending.remove(&key);
                } else {
                    self.pending.insert(key);
                }
            }
        }
    }

    fn clear(&mut self, part: Part) {
        match part {
            Part::Clusters => self.clusters.clear(),
            Part::Leases => self.renewed.clear(),
            Part::Works => self.pending.clear(),
        }
    }
}

/// Whether a Work's status says it is applied in its member.
fn applied(w: &Object) -> bool {
    w.status
        .as_ref()
        .and_then(|s| s.get("conditions"))
        .and_then(serde_json::Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Applied" && c["status"] == "True")
        })
}

/// Reads every object of `part` into the view afresh; returns the revision to watch from.
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
    use orrery_store_testkit::Harness;

    fn object(v: serde_json::Value) -> Object {
        serde_json::from_value(v).expect("an object")
    }

    fn cluster(name: &str, ready: &str, cpu: f64) -> Object {
        object(serde_json::json!({
            "apiVersion": "multicluster.io/v1alpha1", "kind": "Cluster",
            "metadata": {"name": name},
            "status": {
                "conditions": [{"type": "Ready", "status": ready}],
                "waterLevel": {"cpu": cpu, "overall": cpu},
                "lastHeartbeatTime": "2026-01-01T00:00:00.000000Z",
            },
        }))
    }

    fn work(name: &str, applied: bool) -> Object {
        let status = if applied { "True" } else { "False" };
        object(serde_json::json!({
            "apiVersion": "multicluster.io/v1alpha1", "kind": "Work",
            "metadata": {"name": name, "namespace": "orrery-cluster-a"},
            "status": {"conditions": [{"type": "Applied", "status": status}]},
        }))
    }

    /// The line of `family` (with its labels) in `text`, its value parsed.
    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    /// What was there at the start is rendered, and every change after it (a member turning
    /// Ready, a Work applied, a Lease renewed, a member gone) shows in the next scrape without
    /// a read of the store.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn members_figures_follow_the_store() {
        let h = orrery_store_testkit::SqliteHarness::new();
        let store = h.open().await;
        let a = keys::well_known::cluster("a");
        store.create(&a, cluster("a", "True", 0.5)).await.unwrap();
        let b = keys::well_known::cluster("b");
        store.create(&b, cluster("b", "False", 0.25)).await.unwrap();
        let w1 = keys::well_known::work("orrery-cluster-a", "w1");
        store.create(&w1, work("w1", false)).await.unwrap();
        let w2 = keys::well_known::work("orrery-cluster-a", "w2");
        store.create(&w2, work("w2", true)).await.unwrap();

        let m = Metrics::new(SharedRegistry::default());
        m.start(store.clone()).await.unwrap();
        let text = m.render().unwrap();
        assert_eq!(value(&text, "orrery_clusters_ready"), Some(1.0), "{text}");
        assert_eq!(value(&text, "orrery_works_pending"), Some(1.0), "{text}");
        let level = |c: &str, d: &str| {
            format!("orrery_cluster_water_level{{cluster=\"{c}\",dimension=\"{d}\"}}")
        };
        assert_eq!(value(&text, &level("b", "cpu")), Some(0.25), "{text}");
        assert_eq!(value(&text, &level("a", "overall")), Some(0.5), "{text}");
        let age = |c: &str| format!("orrery_cluster_heartbeat_age_seconds{{cluster=\"{c}\"}}");
        let old = value(&text, &age("a")).expect("an age");
        assert!(old > 86_400.0, "from the status' heartbeat: {old}");

        let cur = store.get(&b).await.unwrap();
        let rv = cur.revision();
        store
            .update(&b, cluster("b", "True", 0.75), rv)
            .await
            .unwrap();
        let cur = store.get(&w1).await.unwrap();
        store
            .update(&w1, work("w1", true), cur.revision())
            .await
            .unwrap();
        let lease = object(serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "a", "namespace": cluster::LEASE_NAMESPACE},
            "spec": {"renewTime": orrery_api::MicroTime::from(Time::now()).to_string()},
        }));
        store
            .create(&keys::well_known::cluster_lease("a"), lease)
            .await
            .unwrap();
        store.delete(&a, &Default::default()).await.unwrap();
        let mut last = String::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let done = |t: &str| {
            value(t, "orrery_clusters_ready") == Some(1.0)
                && value(t, "orrery_works_pending") == Some(0.0)
                && value(t, &level("b", "cpu")) == Some(0.75)
                && value(t, &level("a", "cpu")).is_none()
                && value(t, &age("a")).is_none()
        };
        while !done(&last) {
            assert!(std::time::Instant::now() < deadline, "{last}");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            last = m.render().unwrap();
        }

        // A renewed Lease makes the age its own (the status' heartbeat is older).
        store.create(&a, cluster("a", "True", 0.5)).await.unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let t = m.render().unwrap();
            if let Some(age) = value(&t, &age("a")) {
                assert!(age < 60.0, "the Lease's renewal counts: {age}");
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{t}");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// A watcher that does not read shows in the queued changes; its own followers of the
    /// members' figures are watchers too.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn watchers_and_what_waits_for_them() {
        let h = orrery_store_testkit::SqliteHarness::new();
        let store = h.open().await;
        let m = Metrics::new(SharedRegistry::default());
        m.start(store.clone()).await.unwrap();
        let from = store.current_revision().await.unwrap();
        let idle = store
            .watch(
                "/registry/configmaps/",
                from,
                orrery_store::WatchOptions::default(),
            )
            .await
            .unwrap();
        for i in 0..5 {
            let key = format!("/registry/configmaps/default/c{i}");
            let o = object(serde_json::json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": format!("c{i}"), "namespace": "default"},
            }));
            store.create(&key, o).await.unwrap();
        }
        // The followers register and the changes are fanned out after the calls return.
        let settled = |want: &[(&str, f64)]| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            loop {
                let t = m.render().unwrap();
                if want.iter().all(|(k, v)| value(&t, k) == Some(*v)) {
                    return;
                }
                assert!(std::time::Instant::now() < deadline, "{want:?} in {t}");
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        };
        // Clusters, Leases and Works followed, and the idle watcher.
        settled(&[
            ("orrery_watchers", 4.0),
            ("orrery_watch_queued_changes", 5.0),
            ("orrery_watch_queued_changes_max", 5.0),
        ]);
        drop(idle);
        settled(&[
            ("orrery_watchers", 3.0),
            ("orrery_watch_queued_changes", 0.0),
        ]);
    }

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
