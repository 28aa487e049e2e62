//! `orrery sim`: drives the simulated clusters of `orrery up` through their admin endpoint (on
//! loopback; its address is kept in the data directory), to see what Orrery does when a
//! cluster goes dark, slows down or fills up.

use std::path::Path;

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

/// The file, in `orrery up`'s data directory, holding its admin endpoint's address.
pub const ADMIN_FILE: &str = "sim-admin";

#[derive(Debug, clap::Args)]
pub struct SimArgs {
    #[command(subcommand)]
    pub command: SimCommand,
    #[command(flatten)]
    pub locate: crate::locate::Locate,
}

#[derive(Debug, clap::Subcommand)]
pub enum SimCommand {
    /// The simulated clusters: nodes, pods, load and faults.
    List,
    /// Injects a fault into a simulated cluster, or clears them (each command sets one fault
    /// and clears the others).
    Fault {
        /// The cluster's name.
        cluster: String,
        #[command(subcommand)]
        fault: Fault,
    },
}

#[derive(Debug, Clone, PartialEq, clap::Subcommand)]
pub enum Fault {
    /// The cluster stops answering its agent (a lost cluster: its Ready condition goes False,
    /// then its workloads move away).
    Outage,
    /// Every fault cleared.
    Recover,
    /// Every call to the cluster takes this many milliseconds longer.
    Latency { ms: u64 },
    /// This many of its nodes are lost (NotReady).
    LoseNodes { nodes: u32 },
    /// Its background load, a fraction of its capacity (0 to 1).
    Load { fraction: f64 },
}

/// The admin request a fault makes: method, path (under the cluster) and body.
pub fn request_of(fault: &Fault) -> anyhow::Result<(http::Method, &'static str, Option<Value>)> {
    Ok(match fault {
        Fault::Outage => (http::Method::PUT, "faults", Some(json!({"outage": true}))),
        Fault::Recover => (http::Method::DELETE, "faults", None),
        Fault::Latency { ms } => (http::Method::PUT, "faults", Some(json!({"latencyMs": ms}))),
        Fault::LoseNodes { nodes } => (
            http::Method::PUT,
            "faults",
            Some(json!({"lostNodes": nodes})),
        ),
        Fault::Load { fraction } => {
            if !(0.0..=1.0).contains(fraction) {
                bail!("the load is a fraction of capacity, between 0 and 1");
            }
            (http::Method::PUT, "load", Some(json!({"load": fraction})))
        }
    })
}

fn admin_address(data_dir: &Path) -> anyhow::Result<String> {
    let file = data_dir.join(ADMIN_FILE);
    let addr = std::fs::read_to_string(&file).with_context(|| {
        format!(
            "no simulated clusters found ({} is missing): is `orrery up` running on this data directory? (it is --data-dir, else ORRERY_DATA_DIR, else the directory of $KUBECONFIG, else ./orrery-data)",
            file.display()
        )
    })?;
    Ok(addr.trim().to_string())
}

/// One request to the admin endpoint: (status, body).
async fn call(
    addr: &str,
    method: http::Method,
    path: &str,
    body: Option<Value>,
) -> anyhow::Result<(http::StatusCode, Value)> {
    loopback(addr, method, path, body)
        .await
        .with_context(|| format!("the simulated clusters' admin endpoint at {addr} does not answer: has `orrery up` stopped?"))
}

/// One plain HTTP/1.1 request to a loopback address: (status, body as JSON, or as a string).
pub async fn loopback(
    addr: &str,
    method: http::Method,
    path: &str,
    body: Option<Value>,
) -> anyhow::Result<(http::StatusCode, Value)> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let bytes = body.map(|b| b.to_string()).unwrap_or_default();
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, addr)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(bytes)))?;
    let resp = sender.send_request(req).await?;
    let status = resp.status();
    let body = resp.into_body().collect().await?.to_bytes();
    let value = serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    Ok((status, value))
}

/// `orrery sim list`'s table: columns as wide as their widest cell, as kubectl prints.
pub fn list_table(v: &Value) -> String {
    let mut rows = vec![[
        "NAME".to_string(),
        "READY-NODES".to_string(),
        "PODS".to_string(),
        "LOAD".to_string(),
        "FAULTS".to_string(),
    ]];
    for c in v.as_array().into_iter().flatten() {
        let mut faults = Vec::new();
        if c["outage"] == true {
            faults.push("outage".to_string());
        }
        if let Some(ms) = c["latencyMs"].as_u64().filter(|m| *m > 0) {
            faults.push(format!("latency {ms}ms"));
        }
        if let Some(n) = c["lostNodes"].as_u64().filter(|n| *n > 0) {
            faults.push(format!("{n} nodes lost"));
        }
        let n = |k: &str| c[k].as_u64().unwrap_or(0);
        rows.push([
            c["name"].as_str().unwrap_or("").to_string(),
            format!("{}/{}", n("readyNodes"), n("nodes")),
            n("podsRunning").to_string(),
            format!("{:.2}", c["load"].as_f64().unwrap_or(0.0)),
            if faults.is_empty() {
                "-".to_string()
            } else {
                faults.join(", ")
            },
        ]);
    }
    let widths: Vec<usize> = (0..5)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in &rows {
        let mut line = String::new();
        for (i, cell) in r.iter().enumerate() {
            if i + 1 == r.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}   ", w = widths[i]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn error_of(v: &Value) -> String {
    v.get("error")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| v.to_string())
}

pub async fn run(args: SimArgs) -> anyhow::Result<()> {
    let addr = admin_address(&args.locate.data_dir())?;
    match args.command {
        SimCommand::List => {
            let (status, v) = call(&addr, http::Method::GET, "/clusters", None).await?;
            if !status.is_success() {
                bail!("listing the simulated clusters failed: {}", error_of(&v));
            }
            print!("{}", list_table(&v));
        }
        SimCommand::Fault { cluster, fault } => {
            let (method, what, body) = request_of(&fault)?;
            let path = format!("/clusters/{cluster}/{what}");
            let (status, v) = call(&addr, method, &path, body).await?;
            if status == http::StatusCode::NOT_FOUND {
                bail!("no simulated cluster is called {cluster:?} (orrery sim list)");
            }
            if !status.is_success() {
                bail!("{cluster}: {}", error_of(&v));
            }
            let done = match fault {
                Fault::Outage => "is in an outage: it stops answering its agent".to_string(),
                Fault::Recover => "has no faults".to_string(),
                Fault::Latency { ms } => format!("answers {ms} ms slower"),
                Fault::LoseNodes { nodes } => format!("lost {nodes} node(s)"),
                Fault::Load { fraction } => format!("runs at a background load of {fraction}"),
            };
            println!("{cluster} {done}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_lines_up_its_columns() {
        let v = json!([
            {"name": "aws-us-east", "readyNodes": 8, "nodes": 8, "podsRunning": 10, "load": 0.35},
            {"name": "azure-asia", "readyNodes": 10, "nodes": 10, "podsRunning": 0, "load": 0.55,
             "outage": true, "latencyMs": 200},
        ]);
        let t = list_table(&v);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3, "{t}");
        // Every column starts at the same offset on every line.
        for col in ["READY-NODES", "PODS", "LOAD", "FAULTS"] {
            let at = lines[0].find(col).unwrap();
            for l in &lines[1..] {
                assert_ne!(l.as_bytes()[at], b' ', "{col} in {l:?}\n{t}");
                assert_eq!(l.as_bytes()[at - 1], b' ', "{col} in {l:?}\n{t}");
            }
        }
        assert!(lines[2].ends_with("outage, latency 200ms"), "{t}");
        assert!(lines[1].ends_with('-'), "{t}");
    }

    #[test]
    fn each_fault_is_one_admin_request() {
        let cases = [
            (
                Fault::Outage,
                "PUT",
                "faults",
                Some(json!({"outage": true})),
            ),
            (Fault::Recover, "DELETE", "faults", None),
            (
                Fault::Latency { ms: 200 },
                "PUT",
                "faults",
                Some(json!({"latencyMs": 200})),
            ),
            (
                Fault::LoseNodes { nodes: 2 },
                "PUT",
                "faults",
                Some(json!({"lostNodes": 2})),
            ),
            (
                Fault::Load { fraction: 0.9 },
                "PUT",
                "load",
                Some(json!({"load": 0.9})),
            ),
        ];
        for (f, m, p, b) in cases {
            let (method, path, body) = request_of(&f).unwrap_or_else(|e| panic!("{f:?}: {e}"));
            assert_eq!((method.as_str(), path, body), (m, p, b), "{f:?}");
        }
        assert!(request_of(&Fault::Load { fraction: 1.5 }).is_err());
    }
}
