//! Store benchmarks: durable write throughput against plain-SQLite baselines, watch fan-out
//! latency, and memory with many stored objects.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use orrery_api::Object;
use orrery_store::{ListOptions, Store, WatchEvent, WatchOptions};
use orrery_store_sqlite::{SqliteConfig, SqliteStore};
use serde_json::json;

use crate::stats::{emit, median, peak_rss_mib, percentile, progress, round, rss_mib};

/// An object of roughly `bytes` bytes of JSON.
pub fn sized_object(name: &str, bytes: usize) -> Object {
    let base = orrery_store_testkit::object(name, "bench", "");
    let overhead = serde_json::to_vec(&base).map(|v| v.len()).unwrap_or(0);
    orrery_store_testkit::object(name, "bench", &"x".repeat(bytes.saturating_sub(overhead)))
}

fn open_sqlite(dir: &Path) -> anyhow::Result<SqliteStore> {
    Ok(SqliteStore::open(SqliteConfig::new(dir.join("orrery.db")))?)
}

/// Durable creates per second through the `Store` trait with `writers` concurrent writers.
async fn store_rate(
    store: Arc<dyn Store>,
    writers: usize,
    seconds: f64,
    bytes: usize,
) -> anyhow::Result<f64> {
    let template = sized_object("x", bytes);
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..writers {
        let store = store.clone();
        let mut obj = template.clone();
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < deadline {
                obj.metadata.name = format!("w{w}-{n}");
                store
                    .create(&format!("/bench/ns/w{w}-{n}"), obj.clone())
                    .await?;
                n += 1;
            }
            Ok::<u64, orrery_store::StoreError>(n)
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

/// Plain rusqlite into a keyed table, WAL with `synchronous=FULL`, `per_txn` rows per
/// transaction: (a) 1 is what a naive store does; (b) 256 is the limit of the disk. The rows
/// are the ones the store gets from `writers` concurrent writers: the same value bytes and the
/// same keys in the same interleaved order (`w0-0, w1-0, ... w0-1, ...`), since scattered keys
/// cost a B-tree more than sequential ones.
///
/// `wal` false keeps rusqlite's defaults (a rollback journal): what a naive store gets out of
/// the box.
fn baseline_rate(
    path: &Path,
    wal: bool,
    per_txn: usize,
    writers: usize,
    seconds: f64,
    bytes: usize,
) -> anyhow::Result<f64> {
    let conn = rusqlite::Connection::open(path)?;
    if wal {
        conn.query_row("PRAGMA journal_mode=WAL", [], |_| Ok(()))?;
    }
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.execute_batch("CREATE TABLE IF NOT EXISTS kv (id INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE, value BLOB NOT NULL)")?;
    let value = serde_json::to_vec(&sized_object("x", bytes))?;
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let mut n = 0u64;
    while Instant::now() < deadline {
        let tx = conn.unchecked_transaction()?;
        {
            let mut stmt = tx.prepare_cached("INSERT INTO kv (key, value) VALUES (?1, ?2)")?;
            for _ in 0..per_txn {
                let (w, i) = (n % writers as u64, n / writers as u64);
                stmt.execute(rusqlite::params![format!("/bench/ns/w{w}-{i}"), value])?;
                n += 1;
            }
        }
        tx.commit()?;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

pub struct WriteArgs {
    pub runs: usize,
    pub seconds: f64,
    pub bytes: usize,
    pub writers: Vec<usize>,
    pub dir: Option<PathBuf>,
    pub etcd: bool,
    pub skip_baselines: bool,
    pub commit_delay: Option<std::time::Duration>,
}

fn tempdir_in(dir: &Option<PathBuf>) -> anyhow::Result<tempfile::TempDir> {
    Ok(match dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            tempfile::tempdir_in(d)?
        }
        None => tempfile::tempdir()?,
    })
}

pub async fn writes(args: WriteArgs) -> anyhow::Result<()> {
    let mut naive = Vec::new();
    let mut naive_wal = Vec::new();
    let mut batched = Vec::new();
    let mut ours: Vec<Vec<f64>> = vec![Vec::new(); args.writers.len()];
    for run in 0..args.runs {
        progress(format!("store writes: run {}/{}", run + 1, args.runs));
        let d = tempdir_in(&args.dir)?;
        if !args.skip_baselines {
            naive.push(baseline_rate(
                &d.path().join("naive.db"),
                false,
                1,
                256,
                args.seconds,
                args.bytes,
            )?);
            naive_wal.push(baseline_rate(
                &d.path().join("naive-wal.db"),
                true,
                1,
                256,
                args.seconds,
                args.bytes,
            )?);
            batched.push(baseline_rate(
                &d.path().join("batched.db"),
                true,
                256,
                256,
                args.seconds,
                args.bytes,
            )?);
        }
        for (i, &w) in args.writers.iter().enumerate() {
            let d = tempdir_in(&args.dir)?;
            let mut config = SqliteConfig::new(d.path().join("orrery.db"));
            if let Some(delay) = args.commit_delay {
                config.commit_delay = delay;
            }
            let store = SqliteStore::open(config)?;
            ours[i].push(store_rate(Arc::new(store.clone()), w, args.seconds, args.bytes).await?);
            let st = store.write_stats();
            progress(format!(
                "  {w} writers: {:.0} writes per transaction",
                st.writes as f64 / st.transactions.max(1) as f64
            ));
            store.close().await;
        }
    }
    let (naive_m, naive_wal_m, batched_m) = (median(&naive), median(&naive_wal), median(&batched));
    for (i, &w) in args.writers.iter().enumerate() {
        let m = median(&ours[i]);
        emit(json!({
            "scenario": "store.durable_creates",
            "backend": "sqlite",
            "writers": w,
            "object_bytes": args.bytes,
            "commit_delay_us": args.commit_delay.map(|d| d.as_micros() as u64),
            "ops_per_sec": round(m, 0),
            "samples": ours[i].iter().map(|v| round(*v, 0)).collect::<Vec<_>>(),
            "baseline_a_one_row_per_txn_ops_per_sec": round(naive_m, 0),
            "baseline_a_wal_one_row_per_txn_ops_per_sec": round(naive_wal_m, 0),
            "baseline_b_256_rows_per_txn_ops_per_sec": round(batched_m, 0),
            "vs_a": round(m / naive_m, 2),
            "vs_a_wal": round(m / naive_wal_m, 2),
            "vs_b": round(m / batched_m, 2),
            "runs": args.runs,
        }));
    }
    if args.etcd {
        etcd_writes(&args).await?;
    }
    Ok(())
}

async fn etcd_writes(args: &WriteArgs) -> anyhow::Result<()> {
    let server = orrery_store_testkit::etcd::EtcdServer::start()?;
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); args.writers.len()];
    for run in 0..args.runs {
        progress(format!("etcd writes: run {}/{}", run + 1, args.runs));
        for (i, &w) in args.writers.iter().enumerate() {
            let config = orrery_store_etcd::EtcdConfig::new(vec![server.endpoint.clone()])
                .with_prefix(format!("/bench-{run}-{w}"));
            let store = orrery_store_etcd::EtcdStore::connect(config).await?;
            samples[i]
                .push(store_rate(Arc::new(store.clone()), w, args.seconds, args.bytes).await?);
            store.close().await;
        }
    }
    for (i, &w) in args.writers.iter().enumerate() {
        emit(json!({
            "scenario": "store.durable_creates",
            "backend": "etcd",
            "writers": w,
            "object_bytes": args.bytes,
            "ops_per_sec": round(median(&samples[i]), 0),
            "samples": samples[i].iter().map(|v| round(*v, 0)).collect::<Vec<_>>(),
            "runs": args.runs,
        }));
    }
    Ok(())
}

pub struct FanoutArgs {
    pub watchers: usize,
    pub writes: usize,
    pub writers: usize,
    /// Writes per second; 0 writes as fast as the writers go.
    pub rate: u64,
    pub runs: usize,
    pub dir: Option<PathBuf>,
}

/// `watchers` watchers on one prefix, `writes` writes; for each write, the time from its
/// submission to its delivery to the last watcher.
pub async fn fanout(args: FanoutArgs) -> anyhow::Result<()> {
    let mut p50s = Vec::new();
    let mut p99s = Vec::new();
    let mut maxes = Vec::new();
    let mut write_rates = Vec::new();
    let mut ack_p99s = Vec::new();
    let mut expired_total = 0;
    for run in 0..args.runs {
        progress(format!(
            "watch fan-out: run {}/{} ({} watchers, {} writes)",
            run + 1,
            args.runs,
            args.watchers,
            args.writes
        ));
        let d = tempdir_in(&args.dir)?;
        let store = open_sqlite(d.path())?;
        let origin = Instant::now();
        let now_ns = move || origin.elapsed().as_nanos() as u64;
        let submitted: Arc<Vec<AtomicU64>> =
            Arc::new((0..args.writes).map(|_| AtomicU64::new(0)).collect());
        let delivered: Arc<Vec<AtomicU64>> =
            Arc::new((0..args.writes).map(|_| AtomicU64::new(0)).collect());
        let expired = Arc::new(AtomicUsize::new(0));
        let from = store.current_revision().await?;
        let mut watchers = Vec::new();
        for _ in 0..args.watchers {
            let mut w = store
                .watch("/bench/ns/", from, WatchOptions::default())
                .await?;
            let delivered = delivered.clone();
            let expired = expired.clone();
            let writes = args.writes;
            watchers.push(tokio::spawn(async move {
                let mut seen = 0;
                while seen < writes {
                    match w.next().await {
                        Some(Ok(WatchEvent::Added(o))) => {
                            let idx: usize = o.name().parse().unwrap_or(0);
                            delivered[idx].fetch_max(now_ns(), Ordering::Relaxed);
                            seen += 1;
                        }
                        Some(Ok(_)) => {}
                        Some(Err(_)) | None => {
                            expired.fetch_add(1, Ordering::Relaxed);
                            return;
                        }
                    }
                }
            }));
        }
        let template = sized_object("x", 1024);
        let next = Arc::new(AtomicUsize::new(0));
        let started = Instant::now();
        let mut writers = Vec::new();
        for _ in 0..args.writers {
            let (store, submitted, next, mut obj) = (
                store.clone(),
                submitted.clone(),
                next.clone(),
                template.clone(),
            );
            let (writes, rate) = (args.writes, args.rate);
            writers.push(tokio::spawn(async move {
                let mut acks = Vec::new();
                loop {
                    let idx = next.fetch_add(1, Ordering::Relaxed);
                    if idx >= writes {
                        return Ok::<_, orrery_store::StoreError>(acks);
                    }
                    if rate > 0 {
                        let due = started + Duration::from_secs_f64(idx as f64 / rate as f64);
                        tokio::time::sleep_until(due.into()).await;
                    }
                    obj.metadata.name = idx.to_string();
                    let t = now_ns();
                    submitted[idx].store(t, Ordering::Relaxed);
                    store
                        .create(&format!("/bench/ns/{idx}"), obj.clone())
                        .await?;
                    acks.push((now_ns() - t) as f64 / 1e6);
                }
            }));
        }
        let mut acks = Vec::new();
        for w in writers {
            acks.extend(w.await??);
        }
        let write_secs = started.elapsed().as_secs_f64();
        for w in watchers {
            tokio::time::timeout(Duration::from_secs(120), w)
                .await
                .context("watchers did not finish")??;
        }
        let lat: Vec<f64> = (0..args.writes)
            .map(|i| {
                let d = delivered[i].load(Ordering::Relaxed);
                let s = submitted[i].load(Ordering::Relaxed);
                d.saturating_sub(s) as f64 / 1e6
            })
            .collect();
        p50s.push(percentile(&lat, 50.0));
        p99s.push(percentile(&lat, 99.0));
        maxes.push(percentile(&lat, 100.0));
        ack_p99s.push(percentile(&acks, 99.0));
        write_rates.push(args.writes as f64 / write_secs);
        expired_total += expired.load(Ordering::Relaxed);
        store.close().await;
    }
    emit(json!({
        "scenario": "store.watch_fanout",
        "backend": "sqlite",
        "watchers": args.watchers,
        "writes": args.writes,
        "writers": args.writers,
        "target_rate_per_sec": args.rate,
        "achieved_writes_per_sec": round(median(&write_rates), 0),
        "delivery_p50_ms": round(median(&p50s), 2),
        "delivery_p99_ms": round(median(&p99s), 2),
        "delivery_max_ms": round(median(&maxes), 2),
        "p99_samples_ms": p99s.iter().map(|v| round(*v, 2)).collect::<Vec<_>>(),
        "write_ack_p99_ms": round(median(&ack_p99s), 2),
        "watchers_expired": expired_total,
        "runs": args.runs,
        "measures": "from a write's submission to its delivery to the last of all watchers",
    }));
    Ok(())
}

pub struct MemoryArgs {
    pub objects: usize,
    pub bytes: usize,
    pub dir: Option<PathBuf>,
}

/// Loads `objects` objects, then measures resident memory in this process and in a fresh
/// process that opens the store and lists everything page by page (as an informer would).
pub async fn memory(args: MemoryArgs) -> anyhow::Result<()> {
    let d = tempdir_in(&args.dir)?;
    let store = open_sqlite(d.path())?;
    let template = sized_object("x", args.bytes);
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let (store, next, mut obj, total) =
            (store.clone(), next.clone(), template.clone(), args.objects);
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    return Ok::<_, orrery_store::StoreError>(());
                }
                if i % 20_000 == 0 {
                    progress(format!("memory: loaded {i}/{total}"));
                }
                obj.metadata.name = format!("o{i:07}");
                store
                    .create(&format!("/bench/ns/o{i:07}"), obj.clone())
                    .await?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    let after_load = rss_mib();
    let file_mib = std::fs::metadata(store.path())
        .map(|m| m.len() as f64 / 1048576.0)
        .unwrap_or(0.0);
    store.close().await;
    drop(store);

    let exe = std::env::current_exe()?;
    let out = std::process::Command::new(exe)
        .args([
            "store-memory-probe",
            &d.path().join("orrery.db").display().to_string(),
        ])
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "probe failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let probe: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    emit(json!({
        "scenario": "store.memory",
        "backend": "sqlite",
        "objects": args.objects,
        "object_bytes": args.bytes,
        "db_file_mib": round(file_mib, 1),
        "writer_rss_after_load_mib": round(after_load, 1),
        "fresh_open_rss_mib": probe["open_rss_mib"],
        "fresh_after_full_list_rss_mib": probe["after_list_rss_mib"],
        "fresh_peak_rss_mib": probe["peak_rss_mib"],
        "listed": probe["listed"],
        "goal_mib": 300,
    }));
    Ok(())
}

/// The child side of [`memory`].
pub async fn memory_probe(path: &str) -> anyhow::Result<()> {
    let store = SqliteStore::open(SqliteConfig::new(path))?;
    let open_rss = rss_mib();
    let mut listed = 0;
    let mut opts = ListOptions::default().with_limit(500);
    loop {
        let page = store.list("/bench/", &opts).await?;
        listed += page.items.len();
        match page.continue_token {
            Some(t) => opts.continue_token = Some(t),
            None => break,
        }
    }
    println!(
        "{}",
        json!({"open_rss_mib": round(open_rss, 1), "after_list_rss_mib": round(rss_mib(), 1),
               "peak_rss_mib": round(peak_rss_mib(), 1), "listed": listed})
    );
    Ok(())
}
