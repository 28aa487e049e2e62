//! History reported afterwards: samples with their own times through the DRO-DS API
//! (`POST /api/v1/metrics/history`, a past `PUT /api/v1/metrics`), and read from a real
//! Prometheus server (`--forecast-history-from`), into the 5-minute averages the history API
//! and the forecasts read, through a `kill -9`.

use crate::common;

use std::time::Duration;

use common::{Server, eventually};
use serde_json::{Value, json};

async fn call(c: &kube::Client, method: &str, path: &str, body: Value) -> (u16, Value) {
    let (code, _, v) =
        common::send(c, common::req(method, path, "application/json", body), None).await;
    (code, v)
}

const STEP: i64 = 300;

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn iso(t: i64) -> String {
    orrery_api::Time::from_unix_seconds(t).unwrap().to_string()
}

/// A daily cycle's cpu percent at `t`.
fn cpu_at(t: i64) -> f64 {
    let phase = std::f64::consts::TAU * (t % 86_400) as f64 / 86_400.0;
    50.0 + 30.0 * phase.sin()
}

/// The points of `cluster` in the 5-minute history: (time, cpu level, backfilled, memory
/// level).
async fn history(c: &kube::Client, cluster: &str) -> Vec<(i64, f64, bool, Option<f64>)> {
    let (code, v) = call(
        c,
        "GET",
        &format!("/api/v1/monitor/history?resolution=5m&cluster={cluster}&maxEntries=10000"),
        Value::Null,
    )
    .await;
    assert_eq!(code, 200, "{v}");
    v["points"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| {
            let s = &p["clusters"][cluster];
            let t: orrery_api::Time = p["time"].as_str()?.parse().ok()?;
            Some((
                t.unix_seconds(),
                s["levels"]["cpu"].as_f64()?,
                s["backfilled"] == true,
                s["levels"]["memory"].as_f64(),
            ))
        })
        .collect()
}

/// A cluster's history goes in out of order, with duplicates, within bounds; it is merged
/// into the averages at its times (the present left alone), forecast from at once, and
/// read back after a `kill -9`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_reported_with_its_times_is_merged_forecast_and_kept() {
    let mut s = Server::start_with(&["--monitoring-interval", "1s"]);
    s.apply("apiVersion: multicluster.io/v1alpha1\nkind: Cluster\nmetadata: {name: edge}\nspec: {region: eu}\n");
    let c = s.client().await;
    let end = now() / STEP * STEP - STEP;
    // Three days, newest first, and the first day's samples twice: first at 0 % (then
    // replaced by the true figure, later in the body).
    let days = 3 * 288;
    let mut samples: Vec<Value> = (0..days)
        .map(|k| {
            let t = end - k * STEP;
            json!({"timestamp": iso(t), "cpuUsage": cpu_at(t), "memoryAvailable": 4.0})
        })
        .collect();
    let dup: Vec<Value> = (days - 288..days)
        .map(|k| json!({"timestamp": iso(end - k * STEP), "cpuUsage": 0.0, "memoryAvailable": 4.0}))
        .collect();
    let mut body = dup;
    body.append(&mut samples);
    let (code, v) = call(
        &c,
        "POST",
        "/api/v1/metrics/history",
        json!({"cluster": "edge", "samples": body}),
    )
    .await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(
        (v["accepted"].as_u64(), v["replaced"].as_u64()),
        (Some((days + 288) as u64), Some(288)),
        "{v}"
    );

    // Out of bounds, or malformed: refused whole, with the sample named; nothing taken.
    let sample = |t: i64| json!({"timestamp": iso(t), "cpuUsage": 10.0, "memoryAvailable": 1.0});
    for (samples, field, status) in [
        (
            vec![sample(end), sample(now() + 3600)],
            "samples[1].timestamp",
            400,
        ),
        (
            vec![sample(now() - 18 * 86_400)],
            "samples[0].timestamp",
            400,
        ),
        (
            vec![json!({"timestamp": iso(end), "cpuUsage": 101.0, "memoryAvailable": 1.0})],
            "samples[0].cpuUsage",
            400,
        ),
        (vec![], "samples", 400),
    ] {
        let (code, v) = call(
            &c,
            "POST",
            "/api/v1/metrics/history",
            json!({"cluster": "edge", "samples": samples}),
        )
        .await;
        assert_eq!(code, status, "{v}");
        assert_eq!(v["details"]["fields"][0]["field"], field, "{v}");
    }
    let many: Vec<Value> = (0..4097).map(|k| sample(end - k * 60)).collect();
    let (code, v) = call(
        &c,
        "POST",
        "/api/v1/metrics/history",
        json!({"cluster": "edge", "samples": many}),
    )
    .await;
    assert_eq!(code, 413, "{v}");
    let (code, v) = call(
        &c,
        "POST",
        "/api/v1/metrics/history",
        json!({"cluster": "nowhere", "samples": [sample(end)]}),
    )
    .await;
    assert_eq!(
        (code, v["code"].as_str()),
        (404, Some("CLUSTER_NOT_FOUND")),
        "{v}"
    );

    // A report of the present, then one of three days ago: the present stays the present.
    let (code, v) = call(
        &c,
        "PUT",
        "/api/v1/metrics",
        json!({"cluster": "edge", "timestamp": iso(now()), "cpuUsage": 42.0, "memoryAvailable": 1.0}),
    )
    .await;
    assert_eq!((code, v["backfilled"].as_bool()), (200, Some(false)), "{v}");
    let old = end - (days - 1) * STEP - STEP;
    let (code, v) = call(
        &c,
        "PUT",
        "/api/v1/metrics",
        json!({"cluster": "edge", "timestamp": iso(old), "cpuUsage": 7.0, "memoryAvailable": 1.0}),
    )
    .await;
    assert_eq!((code, v["backfilled"].as_bool()), (200, Some(true)), "{v}");
    let k = s.get_json(&["cluster", "edge"]);
    assert_eq!(k["status"]["metrics"]["cpuUsage"], 42.0, "{k}");
    let (code, v) = call(
        &c,
        "PUT",
        "/api/v1/metrics",
        json!({"cluster": "edge", "timestamp": iso(now() + 600), "cpuUsage": 7.0, "memoryAvailable": 1.0}),
    )
    .await;
    assert_eq!(code, 400, "{v}");

    // Merged at their times, each window once, the replaced figures gone.
    let mut got = Vec::new();
    for _ in 0..150 {
        got = history(&c, "edge").await;
        if got.iter().filter(|p| p.2).count() > days as usize {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let back: Vec<_> = got.iter().filter(|p| p.2).collect();
    assert_eq!(back.len(), days as usize + 1, "{got:?}");
    assert_eq!(back[0].0, old, "the oldest first");
    assert!((back[0].1 - 0.07).abs() < 1e-9);
    for (t, level, _, _) in &back[1..] {
        assert!(
            (level - cpu_at(*t) / 100.0).abs() < 0.001,
            "at {t}: {level} (want {})",
            cpu_at(*t) / 100.0
        );
    }
    assert!(back.windows(2).all(|w| w[0].0 < w[1].0));

    // Forecast from at once (no average measured yet), from the whole history.
    let mut f = Value::Null;
    for _ in 0..300 {
        let (code, v) = call(
            &c,
            "GET",
            "/api/v1/monitor/forecast?cluster=edge",
            Value::Null,
        )
        .await;
        assert_eq!(code, 200, "{v}");
        f = v;
        if f["clusters"][0]["history"].as_u64() >= Some(days as u64) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let edge = &f["clusters"][0];
    assert!(edge["history"].as_u64() >= Some(days as u64), "{f}");
    assert_eq!(edge["stepSeconds"], 300, "{f}");
    assert!(edge["series"]["cpu"]["model"].is_string(), "{f}");

    // A `kill -9`: the history is there, and the forecaster reads it back.
    s.kill9();
    s.restart();
    let c = s.client().await;
    let after = history(&c, "edge").await;
    assert_eq!(after.iter().filter(|p| p.2).count(), days as usize + 1);
    eventually(
        Duration::from_secs(30),
        "the forecaster read the history",
        || {
            let log = std::fs::read_to_string(s.dir.join("server.log")).unwrap_or_default();
            log.lines()
                .filter(|l| l.contains("forecasting from the stored history"))
                .nth(1)
                .is_some_and(|l| {
                    l.split("samples=")
                        .nth(1)
                        .and_then(|n| n.split(|c: char| !c.is_ascii_digit()).next())
                        .and_then(|n| n.parse::<usize>().ok())
                        .is_some_and(|n| n > days as usize)
                })
        },
    );
}

/// Writes `text` as OpenMetrics into TSDB blocks and starts Prometheus on them.
fn prometheus(dir: &std::path::Path, text: &str) -> (std::process::Child, u16) {
    let promtool = std::env::var("ORRERY_PROMTOOL").unwrap_or_else(|_| "promtool".into());
    let server = std::env::var("ORRERY_PROMETHEUS").unwrap_or_else(|_| "prometheus".into());
    let input = common::write(dir, "metrics.om", text);
    let data = dir.join("tsdb");
    let out = std::process::Command::new(&promtool)
        .args(["tsdb", "create-blocks-from", "openmetrics", "-q"])
        .arg(&input)
        .arg(&data)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {promtool} ({e}); ./scripts/test provides it"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let config = common::write(dir, "prometheus.yml", "global: {}\n");
    let port = common::free_port();
    let child = std::process::Command::new(&server)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", data.display()))
        .arg("--storage.tsdb.retention.time=30d")
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {server} ({e}); ./scripts/test provides it"));
    eventually(Duration::from_secs(30), "Prometheus ready", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok_and(|mut t| {
            use std::io::{Read, Write};
            let _ = t.write_all(b"GET /-/ready HTTP/1.0\r\n\r\n");
            let mut s = String::new();
            let _ = t.read_to_string(&mut s);
            s.starts_with("HTTP/1.0 200") || s.starts_with("HTTP/1.1 200")
        })
    });
    (child, port)
}

/// Two days of a cluster's cAdvisor and kube-state-metrics series a minute apart: cpu
/// seconds counting at `cpu_at` percent of 8 cores, memory at 25 % of 32 GiB.
fn openmetrics(cluster: &str, from: i64, to: i64) -> String {
    // (An OpenMetrics counter's family is named without its samples' `_total`.)
    let mut cpu = String::from("# TYPE container_cpu_usage_seconds counter\n");
    let mut mem = String::from("# TYPE container_memory_working_set_bytes gauge\n");
    let mut alloc = String::from("# TYPE kube_node_status_allocatable gauge\n");
    let mut alloc_mem = String::new();
    let mut total = 0.0;
    let mut t = from;
    while t <= to {
        total += 60.0 * 8.0 * cpu_at(t) / 100.0;
        let l = format!(r#"cluster="{cluster}",container="app""#);
        cpu.push_str(&format!(
            "container_cpu_usage_seconds_total{{{l}}} {total} {t}\n"
        ));
        mem.push_str(&format!(
            "container_memory_working_set_bytes{{{l}}} {} {t}\n",
            8u64 << 30
        ));
        // One series after the other: a family's series are not interleaved.
        alloc.push_str(&format!(
            "kube_node_status_allocatable{{cluster=\"{cluster}\",resource=\"cpu\"}} 8 {t}\n"
        ));
        alloc_mem.push_str(&format!(
            "kube_node_status_allocatable{{cluster=\"{cluster}\",resource=\"memory\"}} {} {t}\n",
            32u64 << 30
        ));
        t += 60;
    }
    format!("{cpu}{mem}{alloc}{alloc_mem}# EOF\n")
}

/// A server given a Prometheus reads each cluster's past from it when the cluster joins,
/// once: a restart reads only the time since.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joining_clusters_history_is_read_from_prometheus() {
    let dir = tempfile::tempdir().unwrap();
    let to = now() / STEP * STEP - 3 * STEP;
    let from = to - 2 * 86_400;
    let (mut prom, port) = prometheus(dir.path(), &openmetrics("edge", from, to));
    let url = format!("prometheus=http://127.0.0.1:{port}");
    let mut s = Server::start_with(&[
        "--monitoring-interval",
        "1s",
        "--forecast-history-from",
        &url,
    ]);
    s.apply("apiVersion: multicluster.io/v1alpha1\nkind: Cluster\nmetadata: {name: edge}\nspec: {region: eu}\n");
    let c = s.client().await;
    // Until all of it is merged (the windows are written one by one).
    let mut got = Vec::new();
    for _ in 0..300 {
        let now = history(&c, "edge").await;
        if now.len() >= 570 && now.len() == got.len() {
            break;
        }
        got = now;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // A rate over five minutes needs two samples in them: from the second window on.
    assert!(got.len() >= 570, "{} points: {got:?}", got.len());
    assert!(got.iter().all(|p| p.2));
    for (t, level, _, memory) in got.iter().filter(|p| p.0 > from + 600 && p.0 <= to) {
        assert_eq!(*memory, Some(0.25), "at {t}");
        // A 5-minute rate ends at its time: the mean of the minutes before.
        let want: f64 = (0..5).map(|m| cpu_at(t - 60 * m)).sum::<f64>() / 500.0;
        assert!((level - want).abs() < 0.01, "at {t}: {level}, want {want}");
    }
    let log_file = s.dir.join("server.log");
    let log = || std::fs::read_to_string(&log_file).unwrap_or_default();
    let reads = |l: &str| l.matches("history read from Prometheus").count();
    eventually(Duration::from_secs(10), "the import recorded", || {
        reads(&log()) == 1
    });

    // Restarted: read again only from where it stopped (nothing new in Prometheus).
    s.kill9();
    s.restart();
    let c = s.client().await;
    eventually(
        Duration::from_secs(30),
        "the cluster looked at again",
        || log().contains("forecasting from the stored history"),
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = history(&c, "edge").await;
    assert_eq!(after.len(), got.len(), "nothing read twice");
    let _ = prom.kill();
    let _ = prom.wait();
}
