//! Crash test: a process writes through the store from many concurrent writers, is killed with
//! SIGKILL in mid-stream, and every write it acknowledged must be there when the store is
//! reopened, with the file intact. Three rounds, each reopening what the last one left.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed test

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use orrery_store::Store;

/// What one run of the writer acknowledged.
#[derive(Default, Debug)]
struct Acks {
    creates: BTreeMap<String, i64>,
    /// Per counter key: the highest acknowledged (revision, value).
    counters: BTreeMap<String, (i64, u64)>,
}

/// Runs the writer until it has acknowledged `target` creates, then SIGKILLs it.
fn run_and_kill(args: &[String], target: usize) -> Acks {
    let mut child = Command::new(env!("CARGO_BIN_EXE_store-writer"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the writer");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut acks = Acks::default();
    let record = |line: &str, acks: &mut Acks| {
        let parts: Vec<&str> = line.split(' ').collect();
        match parts.as_slice() {
            ["ready"] => {}
            ["C", key, rev] => {
                acks.creates.insert(key.to_string(), rev.parse().unwrap());
            }
            ["U", key, rev, n] => {
                let entry = acks.counters.entry(key.to_string()).or_default();
                *entry = (*entry).max((rev.parse().unwrap(), n.parse().unwrap()));
            }
            // A line cut short by the kill was never a complete acknowledgement.
            _ => {}
        }
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while acks.creates.len() < target {
        assert!(
            Instant::now() < deadline,
            "the writer made too little progress"
        );
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(line) => record(&line, &mut acks),
            Err(e) => panic!("writer stopped talking: {e}"),
        }
    }
    child.kill().expect("SIGKILL the writer");
    child.wait().unwrap();
    reader.join().unwrap();
    // Acknowledgements printed before the kill count too.
    for line in rx.try_iter() {
        record(&line, &mut acks);
    }
    acks
}

async fn verify(store: Arc<dyn Store>, acks: &Acks) {
    let mut max_rev = 0;
    for (key, rev) in &acks.creates {
        let obj = store
            .get(key)
            .await
            .unwrap_or_else(|e| panic!("acknowledged create {key} lost: {e}"));
        assert_eq!(
            obj.revision(),
            Some(*rev),
            "{key} has the acknowledged revision"
        );
        max_rev = max_rev.max(*rev);
    }
    for (key, (rev, n)) in &acks.counters {
        let obj = store
            .get(key)
            .await
            .unwrap_or_else(|e| panic!("acknowledged counter {key} lost: {e}"));
        let have: u64 = obj.other["data"]["payload"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(have >= *n, "{key}: acknowledged value {n}, found {have}");
        assert!(obj.revision().unwrap() >= *rev);
        max_rev = max_rev.max(*rev);
    }
    assert!(
        store.current_revision().await.unwrap() >= max_rev,
        "the revision never goes back"
    );
}

#[test]
fn sqlite_keeps_every_acknowledged_write_across_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orrery.db");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut all = Acks::default();
    for round in 0..3 {
        let args = [
            "sqlite".to_string(),
            path.display().to_string(),
            "--writers".into(),
            "64".into(),
            "--round".into(),
            round.to_string(),
        ];
        let acks = run_and_kill(&args, 1500);
        all.creates.extend(acks.creates);
        for (k, v) in acks.counters {
            let e = all.counters.entry(k).or_default();
            *e = (*e).max(v);
        }
        rt.block_on(async {
            // The default configuration runs SQLite's integrity check at open.
            let store = orrery_store_sqlite::SqliteStore::open(
                orrery_store_sqlite::SqliteConfig::new(&path),
            )
            .expect("the store reopens intact after SIGKILL");
            verify(Arc::new(store.clone()), &all).await;
            store.close().await;
        });
    }
    assert!(all.creates.len() >= 4500);
}

#[test]
fn etcd_keeps_every_acknowledged_write_across_kill_9() {
    let etcd = orrery_store_testkit::etcd::EtcdServer::start().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let args = [
        "etcd".to_string(),
        etcd.endpoint.clone(),
        "/crash".into(),
        "--writers".into(),
        "32".into(),
    ];
    let acks = run_and_kill(&args, 500);
    rt.block_on(async {
        let config =
            orrery_store_etcd::EtcdConfig::new(vec![etcd.endpoint.clone()]).with_prefix("/crash");
        let store = orrery_store_etcd::EtcdStore::connect(config).await.unwrap();
        verify(Arc::new(store), &acks).await;
    });
}
