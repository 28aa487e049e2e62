//! Clusterset DNS: queries per second the responder answers (the one `orrery agent
//! --dns-listen` and `orrery server --dns-listen` run), from a directory of many services,
//! with clients over loopback UDP asking a mix of names (ClusterSetIP A, Headless A, SRV,
//! names that do not exist). Or, with `--addr`, a running agent's or server's DNS.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, Query};
use hickory_proto::rr::{Name, RecordType};
use serde_json::{Value, json};
use tokio::net::UdpSocket;

use crate::stats::{emit, median, progress, round};

pub struct Args {
    pub services: usize,
    pub clients: usize,
    pub seconds: u64,
    pub runs: usize,
    pub addr: Option<SocketAddr>,
}

/// A directory like a busy ClusterSet's: half the services ClusterSetIP, half Headless with
/// three clusters of four endpoints each.
fn directory(services: usize) -> orrery_dns::Directory {
    let mut imports = Vec::new();
    let mut slices = Vec::new();
    for i in 0..services {
        let name = format!("svc-{i}");
        let headless = i % 2 == 1;
        imports.push(json!({
            "metadata": {"namespace": "bench", "name": name},
            "spec": {"type": if headless { "Headless" } else { "ClusterSetIP" },
                     "ips": if headless { json!([]) } else { json!([format!("10.254.{}.{}", i / 250, 1 + i % 250)]) },
                     "ports": [{"name": "http", "protocol": "TCP", "port": 80}]},
        }));
        if headless {
            for c in 0..3 {
                let eps: Vec<Value> = (0..4)
                    .map(|e| json!({"addresses": [format!("10.{}.{}.{}", c + 1, i % 250, e + 1)],
                                    "hostname": format!("{name}-{e}"), "conditions": {"ready": true}}))
                    .collect();
                slices.push(json!({
                    "metadata": {"namespace": "bench", "name": format!("{name}-c{c}"),
                                 "labels": {"multicluster.kubernetes.io/service-name": name,
                                            "multicluster.kubernetes.io/source-cluster": format!("c{c}")}},
                    "addressType": "IPv4", "endpoints": eps,
                    "ports": [{"name": "http", "protocol": "TCP", "port": 8080}],
                }));
            }
        }
    }
    orrery_dns::Directory::build(&imports, &slices)
}

/// The queries asked, in turn: (bytes, with the id at 0..2 rewritten per query).
fn queries(services: usize) -> anyhow::Result<Vec<Vec<u8>>> {
    let mut v = Vec::new();
    for i in 0..services.min(1000) {
        let (name, t) = match i % 4 {
            0 => (
                format!("svc-{i}.bench.svc.clusterset.local."),
                RecordType::A,
            ),
            1 => (
                format!("svc-{i}.bench.svc.clusterset.local."),
                RecordType::A,
            ),
            2 => (
                format!("_http._tcp.svc-{i}.bench.svc.clusterset.local."),
                RecordType::SRV,
            ),
            _ => (
                format!("nope-{i}.bench.svc.clusterset.local."),
                RecordType::A,
            ),
        };
        let mut m = Message::query();
        m.add_query(Query::query(Name::from_ascii(&name)?, t));
        v.push(m.to_vec()?);
    }
    Ok(v)
}

async fn client(
    target: SocketAddr,
    queries: Arc<Vec<Vec<u8>>>,
    until: Instant,
    answered: Arc<AtomicU64>,
    offset: usize,
) -> anyhow::Result<()> {
    let sock = UdpSocket::bind("127.0.0.1:0").await?;
    sock.connect(target).await?;
    let mut buf = vec![0u8; 4096];
    let mut i = offset;
    // A few queries in flight per client, as a resolver with concurrent lookups has.
    const WINDOW: usize = 4;
    let mut next_id: u16 = 0;
    let send = |i: usize, id: u16| {
        let mut q = queries[i % queries.len()].clone();
        q[0..2].copy_from_slice(&id.to_be_bytes());
        q
    };
    for _ in 0..WINDOW {
        sock.send(&send(i, next_id)).await?;
        i += 1;
        next_id = next_id.wrapping_add(1);
    }
    while Instant::now() < until {
        // A lost datagram times out: another is put in flight all the same.
        if let Ok(Ok(_)) =
            tokio::time::timeout(Duration::from_millis(200), sock.recv(&mut buf)).await
        {
            answered.fetch_add(1, Ordering::Relaxed);
        }
        sock.send(&send(i, next_id)).await?;
        i += 1;
        next_id = next_id.wrapping_add(1);
    }
    Ok(())
}

pub async fn qps(args: Args) -> anyhow::Result<()> {
    let (_stop_tx, stop) = tokio::sync::watch::channel(false);
    let (_dir_tx, target) = match args.addr {
        Some(a) => (None, a),
        None => {
            let started = Instant::now();
            let dir = directory(args.services);
            progress(format!(
                "directory of {} services built in {:.1} ms",
                dir.len(),
                started.elapsed().as_secs_f64() * 1000.0
            ));
            let (tx, rx) = tokio::sync::watch::channel(Arc::new(dir));
            let addr = orrery_dns::serve("127.0.0.1:0".parse()?, rx, stop.clone()).await?;
            (Some(tx), addr)
        }
    };
    let qs = Arc::new(queries(args.services)?);
    let mut rates = Vec::new();
    for run in 0..args.runs {
        let answered = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let until = started + Duration::from_secs(args.seconds);
        let tasks: Vec<_> = (0..args.clients)
            .map(|c| tokio::spawn(client(target, qs.clone(), until, answered.clone(), c * 97)))
            .collect();
        for t in tasks {
            t.await??;
        }
        let rate = answered.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
        progress(format!("run {}: {:.0} queries/s", run + 1, rate));
        rates.push(rate);
    }
    emit(json!({
        "scenario": "dns-qps",
        "target": if args.addr.is_some() { "given address" } else { "the agent's responder, in process" },
        "services": args.services,
        "clients": args.clients,
        "seconds": args.seconds,
        "runs": args.runs,
        "queries_per_second_median": round(median(&rates), 0),
        "queries_per_second_runs": rates.iter().map(|r| round(*r, 0)).collect::<Vec<_>>(),
        "goal": 20000,
    }));
    Ok(())
}
