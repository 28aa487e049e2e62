//! `orrery server --forecast-history-from prometheus=URL`: each cluster's past usage read from
//! a Prometheus server (or Thanos, Mimir: its HTTP query API) with range queries, one per
//! series at 5-minute steps over the 17 days the history keeps, at the start of each term of
//! leadership and when a cluster joins. What they return goes into the cluster's history inbox,
//! the path `POST /api/v1/metrics/history` takes, so a fleet that already has weeks of metrics
//! is forecast from its first minute.
//!
//! A record per cluster (`/internal/monitoring/imported/<cluster>`: the Cluster's uid and the
//! time read up to) keeps the next term from reading it all again: it reads only the time
//! since, should the server have been down a while. A cluster deleted and joined again under
//! its name (another uid) is read afresh.
//!
//! Each query names the cluster as `{cluster}`; the defaults read kube-state-metrics' and
//! cAdvisor's series by a `cluster` label, as a Prometheus over several clusters labels them.
//! A series a query returns nothing for is left to the monitoring loop.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use orrery_api::history::backfill::{self, Point};
use orrery_api::{Object, Time, keys};
use orrery_controllers::runtime::controller::{
    Action, Controller, Keys, Origin, Reconciler, Retry, Source,
};
use orrery_controllers::runtime::reflector::Event;
use orrery_store::{Store, StoreError};
use serde_json::{Value, json};
use tokio::sync::watch;

/// Where the history is read from, and how.
#[derive(Clone, Debug, PartialEq)]
pub struct HistoryFrom {
    /// `host:port` of the Prometheus server.
    authority: String,
    /// The path its API is under (`""`, or a prefix such as `/prometheus`).
    path: String,
    /// Per series (`cpu`, `memory`, `gpu`, `pods`, `traffic`), its PromQL.
    pub queries: BTreeMap<String, String>,
}

/// The series a query may be given for.
pub const SERIES: [&str; 5] = ["cpu", "memory", "gpu", "pods", "traffic"];

/// The default queries: a water level per dimension (usage over allocatable; the history
/// knows no requests), traffic in bytes per second.
pub fn default_queries() -> BTreeMap<String, String> {
    [
        (
            "cpu",
            r#"sum(rate(container_cpu_usage_seconds_total{cluster="{cluster}",container!=""}[5m])) / sum(kube_node_status_allocatable{cluster="{cluster}",resource="cpu"})"#,
        ),
        (
            "memory",
            r#"sum(container_memory_working_set_bytes{cluster="{cluster}",container!=""}) / sum(kube_node_status_allocatable{cluster="{cluster}",resource="memory"})"#,
        ),
        (
            "pods",
            r#"sum(kube_pod_status_phase{cluster="{cluster}",phase="Running"}) / sum(kube_node_status_allocatable{cluster="{cluster}",resource="pods"})"#,
        ),
        (
            "gpu",
            r#"avg(DCGM_FI_DEV_GPU_UTIL{cluster="{cluster}"}) / 100"#,
        ),
        (
            "traffic",
            r#"sum(rate(container_network_receive_bytes_total{cluster="{cluster}"}[5m])) + sum(rate(container_network_transmit_bytes_total{cluster="{cluster}"}[5m]))"#,
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

impl std::str::FromStr for HistoryFrom {
    type Err = String;

    /// `prometheus=http://host:port[/path]`.
    fn from_str(s: &str) -> Result<Self, String> {
        let url = s.strip_prefix("prometheus=").ok_or_else(|| {
            format!("{s:?}: the history is read from `prometheus=URL` (the only source)")
        })?;
        let uri: http::Uri = url
            .parse()
            .map_err(|e| format!("{url:?} is not a URL: {e}"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => {
                return Err(format!(
                    "{url:?}: only plain http:// is read (reach a TLS Prometheus through a \
                     local proxy, or its in-cluster http port)"
                ));
            }
            _ => return Err(format!("{url:?} is not an http:// URL")),
        }
        let host = uri.authority().filter(|a| !a.as_str().contains('@'));
        let (Some(host), None) = (host, uri.query()) else {
            return Err(format!(
                "{url:?}: give the server as http://host:port[/path], without credentials or a query"
            ));
        };
        // A port that is there but not a number is left out of both.
        if host.port_u16().is_none() && host.as_str() != host.host() {
            return Err(format!("{url:?}: the port is not a number"));
        }
        let authority = format!("{}:{}", host.host(), host.port_u16().unwrap_or(80));
        let path = uri.path().trim_end_matches('/');
        Ok(HistoryFrom {
            authority,
            path: path.to_string(),
            queries: default_queries(),
        })
    }
}

/// `SERIES=PROMQL`, one `--forecast-history-query`.
pub fn parse_query(s: &str) -> Result<(String, String), String> {
    let (name, q) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: give it as SERIES=PROMQL"))?;
    if !SERIES.contains(&name) {
        return Err(format!(
            "{name:?} is not a series; one of {}",
            SERIES.join(", ")
        ));
    }
    if q.trim().is_empty() {
        return Err(format!("the query for {name} is empty"));
    }
    Ok((name.to_string(), q.to_string()))
}

/// A string as a PromQL double-quoted literal's contents.
fn escape(s: &str) -> String {
    s.replace('\\', r"\\").replace('"', "\\\"")
}

/// Seconds between two points: the 5-minute averages' step.
const STEP: i64 = 300;

impl HistoryFrom {
    /// One range query: its points, by unix second (a value that is not a number left out).
    async fn range(&self, query: &str, start: i64, end: i64) -> Result<Vec<(i64, f64)>, String> {
        let params = form_urlencoded::Serializer::new(String::new())
            .append_pair("query", query)
            .append_pair("start", &start.to_string())
            .append_pair("end", &end.to_string())
            .append_pair("step", &STEP.to_string())
            .finish();
        let path = format!("{}/api/v1/query_range?{params}", self.path);
        let addr = &self.authority;
        let ask = async {
            let stream = tokio::net::TcpStream::connect(addr)
                .await
                .map_err(|e| format!("connecting to {addr}: {e}"))?;
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(conn);
            let req = http::Request::get(&path)
                .header(http::header::HOST, addr.as_str())
                .header(http::header::ACCEPT, "application/json")
                .body(Full::new(Bytes::new()))
                .map_err(|e| e.to_string())?;
            let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
            let status = resp.status();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            Ok::<_, String>((status, body))
        };
        let (status, body) = tokio::time::timeout(Duration::from_secs(60), ask)
            .await
            .map_err(|_| format!("{addr} did not answer within a minute"))??;
        let v: Value = serde_json::from_slice(&body).map_err(|_| {
            format!(
                "{addr} answered {status} with what is not JSON: {}",
                String::from_utf8_lossy(&body[..body.len().min(200)])
            )
        })?;
        if v["status"] != "success" {
            return Err(format!(
                "{addr} answered {status}: {} {}",
                v["errorType"].as_str().unwrap_or(""),
                v["error"].as_str().unwrap_or("")
            ));
        }
        Ok(points_of(&v["data"]))
    }
}

/// The points of a range query's `data`: a matrix's series summed by time (a query should
/// return one series; several are added up, as a sum by nothing would).
fn points_of(data: &Value) -> Vec<(i64, f64)> {
    let mut by: BTreeMap<i64, f64> = BTreeMap::new();
    for series in data["result"].as_array().into_iter().flatten() {
        for p in series["values"].as_array().into_iter().flatten() {
            let (Some(t), Some(v)) = (
                p[0].as_f64(),
                p[1].as_str().and_then(|v| v.parse::<f64>().ok()),
            ) else {
                continue;
            };
            if v.is_finite() {
                *by.entry(t.round() as i64).or_default() += v;
            }
        }
    }
    by.into_iter().collect()
}

/// What the record of a cluster's import holds.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Imported {
    uid: String,
    /// Unix seconds the history was read up to.
    until: i64,
}

const IMPORTED_PREFIX: &str = "/internal/monitoring/imported/";

/// Reads each cluster's history once per term (and the time since on the next ones).
struct Importer {
    from: HistoryFrom,
    store: Arc<dyn Store>,
    /// Clusters read this term, by uid: a Cluster's every heartbeat is an event.
    done: parking_lot::Mutex<HashMap<String, String>>,
}

impl Importer {
    async fn import(&self, cluster: &str) -> Result<Action, String> {
        let store = self.store.as_ref();
        let c = match store.get(&keys::well_known::cluster(cluster)).await {
            Ok(c) => c,
            Err(StoreError::NotFound { .. }) => return Ok(Action::Done),
            Err(e) => return Err(e.to_string()),
        };
        let uid = c.metadata.uid.clone();
        let key = format!("{IMPORTED_PREFIX}{cluster}");
        let (record, before) = match store.get(&key).await {
            Ok(o) => {
                let i: Imported = o
                    .spec
                    .as_ref()
                    .and_then(|s| serde_json::from_value(s.clone()).ok())
                    .unwrap_or_default();
                (Some(o), i)
            }
            Err(StoreError::NotFound { .. }) => (None, Imported::default()),
            Err(e) => return Err(e.to_string()),
        };
        let now = Time::now().unix_seconds();
        // Points land on the averages' windows' ends.
        let end = now.div_euclid(STEP) * STEP;
        let oldest = (now - backfill::RETENTION_SECONDS).div_euclid(STEP) * STEP + STEP;
        let start = if before.uid == uid {
            (before.until + STEP).max(oldest)
        } else {
            oldest
        };
        if start > end {
            self.done.lock().insert(cluster.to_string(), uid);
            return Ok(Action::Done);
        }
        let mut points: BTreeMap<i64, Point> = BTreeMap::new();
        for (name, query) in &self.from.queries {
            let q = query.replace("{cluster}", &escape(cluster));
            for (t, v) in self.from.range(&q, start, end).await? {
                let p = points.entry(t).or_default();
                if name == "traffic" {
                    p.traffic = Some(v.max(0.0));
                } else {
                    p.levels
                        .insert(name.clone(), (v.max(0.0) * 1000.0).round() / 1000.0);
                }
            }
        }
        let read = points.len();
        let points: Vec<(i64, Point)> = points
            .into_iter()
            .filter(|(t, _)| backfill::check_time(*t, now).is_ok())
            .collect();
        for chunk in points.chunks(backfill::MAX_PER_REQUEST) {
            let mut waited = 0;
            loop {
                match orrery_apiserver::dro::backfill::enqueue(store, cluster, chunk.to_vec()).await
                {
                    Ok(_) => break,
                    // The monitoring loop has the inbox's earlier samples to merge first.
                    Err(e) if e.status == 429 && waited < 24 => {
                        waited += 1;
                        tokio::time::sleep(Duration::from_secs(5)).await;
                    }
                    Err(e) => {
                        return Err(format!(
                            "writing cluster {cluster}'s history: {}",
                            e.message
                        ));
                    }
                }
            }
        }
        let mut o = record.unwrap_or_else(|| {
            Object::new("internal.orrery.io/v1", "HistoryImport").with_name(cluster)
        });
        o.spec = Some(json!(Imported {
            uid: uid.clone(),
            until: end
        }));
        let written = if o.metadata.resource_version.is_empty() {
            store.create(&key, o).await
        } else {
            let rev = o.revision();
            store.update(&key, o, rev).await
        };
        written.map_err(|e| e.to_string())?;
        tracing::info!(
            cluster,
            points = read,
            from = start,
            until = end,
            "history read from Prometheus"
        );
        self.done.lock().insert(cluster.to_string(), uid);
        Ok(Action::Done)
    }
}

#[async_trait::async_trait]
impl Reconciler for Importer {
    type Key = String;
    type Error = String;

    fn on_event(&mut self, _: Origin, ev: Event, keys: &mut Keys<String>) {
        let done = self.done.get_mut();
        let mut take = |c: &Object| {
            if done.get(c.name()) != Some(&c.metadata.uid) {
                keys.push(c.name().to_string());
            }
        };
        match ev {
            Event::Listed(items) => items.iter().for_each(|c| take(c)),
            Event::Upsert(c) => take(&c),
            Event::Delete(c) => {
                done.remove(c.name());
            }
        }
    }

    async fn reconcile(&self, cluster: &String) -> Result<Action, String> {
        self.import(cluster).await
    }

    fn error_policy(&self, cluster: &String, e: &String, failures: u32) -> Retry {
        tracing::warn!(cluster, failures, error = %e, "reading history from Prometheus");
        Retry::After(Duration::from_secs(30).min(Duration::from_secs(5) * failures.max(1)))
    }
}

/// Reads the clusters' history from `from` while this term lasts.
pub fn spawn(
    from: HistoryFrom,
    store: Arc<dyn Store>,
    metrics: orrery_controllers::runtime::metrics::Handle,
    shutdown: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let r = Importer {
        from,
        store: store.clone(),
        done: Default::default(),
    };
    tokio::spawn(
        Controller::new("history-import", store, r, metrics)
            .source(Source::new("clusters", keys::well_known::clusters()))
            .run(shutdown),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_source_and_queries_are_read_or_refused_with_a_reason() {
        let h: HistoryFrom = "prometheus=http://127.0.0.1:9090".parse().unwrap();
        assert_eq!(
            (h.authority.as_str(), h.path.as_str()),
            ("127.0.0.1:9090", "")
        );
        assert_eq!(h.queries.len(), 5);
        let h: HistoryFrom = "prometheus=http://thanos/query/".parse().unwrap();
        assert_eq!(
            (h.authority.as_str(), h.path.as_str()),
            ("thanos:80", "/query")
        );
        for bad in [
            "http://127.0.0.1:9090",
            "prometheus=https://p:9090",
            "prometheus=ftp://p",
            "prometheus=http://u:p@h:1",
            "prometheus=http://h:x",
            "prometheus=http://h:1/?q=1",
        ] {
            assert!(bad.parse::<HistoryFrom>().is_err(), "{bad}");
        }
        assert_eq!(
            parse_query("cpu=up").unwrap(),
            ("cpu".to_string(), "up".to_string())
        );
        assert!(parse_query("disk=up").is_err());
        assert!(parse_query("cpu=").is_err());
        assert_eq!(escape(r#"a"b\c"#), r#"a\"b\\c"#);
    }

    #[test]
    fn a_matrix_is_read_by_time_and_what_is_not_a_number_left_out() {
        let data = json!({"resultType": "matrix", "result": [
            {"metric": {}, "values": [[1800000000, "0.5"], [1800000300.0, "NaN"], [1800000600, "x"]]},
            {"metric": {"node": "b"}, "values": [[1800000000, "0.25"]]},
        ]});
        assert_eq!(points_of(&data), vec![(1_800_000_000, 0.75)]);
        assert!(points_of(&json!({"result": []})).is_empty());
    }
}
