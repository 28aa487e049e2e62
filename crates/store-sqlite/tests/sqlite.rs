//! Behaviour specific to the SQLite backend (the shared suite is in orrery-store-testkit).
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed test

use std::sync::Arc;

use orrery_api::Object;
use orrery_store::{Preconditions, Store, StoreError};
use orrery_store_sqlite::{SqliteConfig, SqliteStore};

fn obj(name: &str) -> Object {
    Object::new("v1", "ConfigMap")
        .with_name(name)
        .with_namespace("ns")
}

fn refused(path: &std::path::Path) -> String {
    match SqliteStore::open(SqliteConfig::new(path)) {
        Err(StoreError::Corrupt(msg)) => msg,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn refuses_garbage_without_touching_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orrery.db");
    let garbage: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&path, &garbage).unwrap();
    let msg = refused(&path);
    assert!(msg.contains("not a usable SQLite database"), "{msg}");
    assert!(
        msg.contains("orrery.db"),
        "the message names the file: {msg}"
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        garbage,
        "the file is left as it was"
    );
}

#[tokio::test]
async fn refuses_a_foreign_sqlite_database() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orrery.db");
    let other = rusqlite::Connection::open(&path).unwrap();
    other.execute_batch("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT); INSERT INTO users VALUES (1, 'a');").unwrap();
    drop(other);
    let msg = refused(&path);
    assert!(msg.contains("not an Orrery store"), "{msg}");
    let other = rusqlite::Connection::open(&path).unwrap();
    let n: i64 = other
        .query_row("SELECT count(*) FROM users", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 1, "the foreign data is untouched");
}

#[tokio::test]
async fn refuses_a_damaged_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orrery.db");
    {
        let s = SqliteStore::open(SqliteConfig::new(&path)).unwrap();
        for i in 0..400 {
            s.create(&format!("/t/ns/{i:04}"), obj(&format!("{i:04}")))
                .await
                .unwrap();
        }
        s.close().await;
    }
    // Checkpoint the WAL into the main file, then overwrite a page in the middle of it.
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")
        .unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    assert!(bytes.len() > 8 * 4096, "the store spans several pages");
    let page = 4096 * 3;
    for b in &mut bytes[page..page + 4096] {
        *b = 0xA5;
    }
    std::fs::write(&path, &bytes).unwrap();
    let msg = refused(&path);
    assert!(
        msg.contains("integrity") || msg.contains("not a usable"),
        "{msg}"
    );
}

#[tokio::test]
async fn an_empty_file_becomes_a_new_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orrery.db");
    std::fs::write(&path, b"").unwrap();
    let s = SqliteStore::open(SqliteConfig::new(&path)).unwrap();
    assert_eq!(s.current_revision().await.unwrap(), 0);
    s.create("/t/ns/a", obj("a")).await.unwrap();
}

/// The store's files are the owner's alone whatever the umask: a new store's, and those an
/// earlier version left readable by everyone.
#[tokio::test]
async fn the_store_files_are_readable_by_their_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let path = dir.path().join("orrery.db");
    let s = SqliteStore::open(SqliteConfig::new(&path)).unwrap();
    s.create("/t/ns/a", obj("a")).await.unwrap();
    let files = [
        "orrery.db",
        "orrery.db-wal",
        "orrery.db-shm",
        "orrery.db.lock",
    ];
    for f in files {
        assert_eq!(mode(&dir.path().join(f)), 0o600, "{f}");
    }
    s.close().await;
    drop(s);
    for f in files {
        let p = dir.path().join(f);
        if p.exists() {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
    }
    let s = SqliteStore::open(SqliteConfig::new(&path)).unwrap();
    s.create("/t/ns/b", obj("b")).await.unwrap();
    for f in files {
        assert_eq!(mode(&dir.path().join(f)), 0o600, "{f} after reopening");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_share_transactions() {
    let dir = tempfile::tempdir().unwrap();
    let s = Arc::new(SqliteStore::open(SqliteConfig::new(dir.path().join("orrery.db"))).unwrap());
    let mut tasks = Vec::new();
    for w in 0..64 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..20 {
                s.create(&format!("/t/ns/{w}-{i}"), obj(&format!("{w}-{i}")))
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let stats = s.write_stats();
    assert_eq!(stats.writes, 64 * 20);
    assert!(
        stats.transactions * 4 < stats.writes,
        "group commit should put several writes in each transaction: {stats:?}"
    );
}

/// Transactions a stream of `n` separate writes, one started every `every`, takes.
async fn transactions_for_a_stream(
    delay: std::time::Duration,
    n: usize,
    every: std::time::Duration,
) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    let mut config = SqliteConfig::new(dir.path().join("orrery.db"));
    config.commit_delay = delay;
    let s = Arc::new(SqliteStore::open(config).unwrap());
    let start = std::time::Instant::now();
    let mut tasks = Vec::new();
    for i in 0..n {
        // Each write is its own client, started on a schedule (not when the last one is
        // answered), like members reporting on their own clocks.
        let at = start + every * i as u32;
        if let Some(d) = at.checked_duration_since(std::time::Instant::now()) {
            tokio::time::sleep(d).await;
        }
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            s.create(&format!("/t/ns/{i}"), obj(&i.to_string()))
                .await
                .unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let stats = s.write_stats();
    assert_eq!(stats.writes, n as u64);
    s.close().await;
    stats.transactions
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steady_stream_of_separate_writes_is_committed_in_groups() {
    let every = std::time::Duration::from_millis(2);
    let at_once = transactions_for_a_stream(std::time::Duration::ZERO, 300, every).await;
    let gathered =
        transactions_for_a_stream(std::time::Duration::from_millis(10), 300, every).await;
    assert!(
        gathered * 2 < at_once,
        "waiting up to 10 ms for more writes should at least halve the commits of writes \
         that come every 2 ms: {gathered} transactions, against {at_once} without waiting"
    );
}

#[tokio::test]
async fn one_failed_write_does_not_fail_its_group() {
    let dir = tempfile::tempdir().unwrap();
    let s = Arc::new(SqliteStore::open(SqliteConfig::new(dir.path().join("orrery.db"))).unwrap());
    s.create("/t/ns/taken", obj("taken")).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..50 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            if i % 5 == 0 {
                s.create("/t/ns/taken", obj("taken")).await.map(|_| ())
            } else {
                s.create(&format!("/t/ns/{i}"), obj(&i.to_string()))
                    .await
                    .map(|_| ())
            }
        }));
    }
    let mut ok = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(()) => ok += 1,
            Err(e) => assert!(matches!(e, StoreError::AlreadyExists { .. })),
        }
    }
    assert_eq!(ok, 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_removes_dead_versions_in_the_background() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = SqliteConfig::new(dir.path().join("orrery.db"));
    config.compaction_step = 10;
    let s = SqliteStore::open(config.clone()).unwrap();
    s.create("/t/ns/hot", obj("hot")).await.unwrap();
    for _ in 0..99 {
        s.update("/t/ns/hot", obj("hot"), None).await.unwrap();
    }
    for i in 0..20 {
        s.create(&format!("/t/ns/gone-{i}"), obj("gone"))
            .await
            .unwrap();
        s.delete(&format!("/t/ns/gone-{i}"), &Preconditions::default())
            .await
            .unwrap();
    }
    assert_eq!(s.stored_versions().await.unwrap(), 140);
    let now = s.current_revision().await.unwrap();
    s.compact(now).await.unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    // Only the live version of "hot" remains.
    while s.stored_versions().await.unwrap() != 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "compaction did not finish"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // The revision survives a restart even though its row (a tombstone) is gone.
    s.close().await;
    let s = SqliteStore::open(config).unwrap();
    assert_eq!(s.current_revision().await.unwrap(), now);
    let next = s.create("/t/ns/next", obj("next")).await.unwrap();
    assert_eq!(next.revision(), Some(now + 1));
}

/// Point reads may come from the in-memory cache of recently written objects: they must still
/// never be older than a write already acknowledged, never go back in time, and never show a
/// deleted object, also when the cache is small enough to evict all the time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn point_reads_are_never_behind_acknowledged_writes() {
    for budget in [64 << 20, 600, 0] {
        let dir = tempfile::tempdir().unwrap();
        let mut config = SqliteConfig::new(dir.path().join("orrery.db"));
        config.object_cache_bytes = budget;
        let s = Arc::new(SqliteStore::open(config).unwrap());
        let keys: Vec<String> = (0..4).map(|i| format!("/t/ns/k{i}")).collect();
        for (i, k) in keys.iter().enumerate() {
            s.create(k, obj(&format!("k{i}"))).await.unwrap();
        }
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        // Writers: each write is checked by a read right after its acknowledgement.
        let mut writers = Vec::new();
        for w in 0..4 {
            let (s, keys) = (s.clone(), keys.clone());
            writers.push(tokio::spawn(async move {
                for i in 0..150 {
                    let k = &keys[(w + i) % keys.len()];
                    let written = orrery_store::update_with(s.as_ref(), k, |mut o| {
                        o.metadata.labels.insert("n".into(), format!("{w}-{i}"));
                        Ok(Some(o))
                    })
                    .await
                    .unwrap();
                    let read = s.get(k).await.unwrap();
                    assert!(
                        read.revision() >= written.revision(),
                        "read {:?} after writing {:?}",
                        read.revision(),
                        written.revision()
                    );
                }
            }));
        }
        // Readers: per key, revisions never go backwards.
        let mut readers = Vec::new();
        for _ in 0..2 {
            let (s, keys, done) = (s.clone(), keys.clone(), done.clone());
            readers.push(tokio::spawn(async move {
                let mut last = vec![0i64; keys.len()];
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    for (i, k) in keys.iter().enumerate() {
                        let rev = s.get(k).await.unwrap().revision().unwrap();
                        assert!(rev >= last[i], "{k} went back from {} to {rev}", last[i]);
                        last[i] = rev;
                    }
                    // A cached read completes without waiting: let the writers run.
                    tokio::task::yield_now().await;
                }
            }));
        }
        for w in writers {
            w.await.unwrap();
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        for r in readers {
            r.await.unwrap();
        }
        // A deleted object is gone for point reads at once, and a new one of the same name is
        // read as the new one.
        let gone = s.delete(&keys[0], &Preconditions::default()).await.unwrap();
        assert!(matches!(
            s.get(&keys[0]).await,
            Err(StoreError::NotFound { .. })
        ));
        let again = s.create(&keys[0], obj("k0")).await.unwrap();
        assert!(again.revision() > gone.revision());
        let read = s.get(&keys[0]).await.unwrap();
        assert_eq!(read.revision(), again.revision());
        assert!(read.metadata.labels.is_empty());
        // What point reads return agrees with a list, read straight from SQLite.
        let listed = s
            .list("/t/ns/", &orrery_store::ListOptions::default())
            .await
            .unwrap();
        assert_eq!(listed.items.len(), keys.len());
        for o in &listed.items {
            let got = s.get(&format!("/t/ns/{}", o.name())).await.unwrap();
            assert_eq!(got.revision(), o.revision(), "{}", o.name());
            assert_eq!(got.metadata.labels, o.metadata.labels, "{}", o.name());
        }
        s.close().await;
    }
}

#[tokio::test]
async fn a_store_in_use_is_not_opened_twice() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orrery.db");
    let s = SqliteStore::open(SqliteConfig::new(&path)).unwrap();
    s.create("/t/ns/a", obj("a")).await.unwrap();
    match SqliteStore::open(SqliteConfig::new(&path)) {
        Err(StoreError::Backend(msg)) => assert!(msg.contains("in use"), "{msg}"),
        other => panic!("a second open must be refused, got {other:?}"),
    }
    // Closing releases it.
    s.close().await;
    let s = SqliteStore::open(SqliteConfig::new(&path)).unwrap();
    assert_eq!(s.get("/t/ns/a").await.unwrap().name(), "a");
}

/// A file written before schema version 2 may hold versions that compaction kept although a
/// newer version of their key is compacted too (a pass looked only at what was written since
/// the last one): they are removed at open, once, and compaction in progress goes on correctly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_from_the_old_compaction_is_repaired_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orrery.db");
    {
        let s = SqliteStore::open(SqliteConfig::new(&path)).unwrap();
        s.create("/t/ns/k", obj("k")).await.unwrap(); // 1
        s.create("/t/ns/g", obj("g")).await.unwrap(); // 2
        s.update("/t/ns/k", obj("k"), None).await.unwrap(); // 3
        s.delete("/t/ns/g", &Preconditions::default())
            .await
            .unwrap(); // 4
        s.create("/t/ns/f", obj("f")).await.unwrap(); // 5
        s.close().await;
    }
    // What the old compaction left after one pass to 2 and part of a pass to 5 that got as far
    // as 3: it had kept k@1 and g@2 (the latest then) and never looked at them again.
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.execute_batch(
            "UPDATE meta SET value = 5 WHERE name = 'compact_rev';
             UPDATE meta SET value = 3 WHERE name = 'compact_done';
             PRAGMA user_version = 1;",
        )
        .unwrap();
    }
    let s = SqliteStore::open(SqliteConfig::new(&path)).unwrap();
    s.wait_for_compaction().await;
    assert!(
        s.get("/t/ns/g").await.unwrap_err().is_not_found(),
        "the deleted object stays deleted once compaction passes its tombstone"
    );
    assert_eq!(s.get("/t/ns/k").await.unwrap().revision(), Some(3));
    // k@3 and f@5 are all that any read at or after revision 5 can see.
    assert_eq!(s.stored_versions().await.unwrap(), 2);
    s.close().await;
    let c = rusqlite::Connection::open(&path).unwrap();
    let version: i64 = c
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(version, 2, "the file is marked repaired");
    drop(c);
    // A build that reads only version 1 refuses it; this one opens it without repairing again.
    let s = SqliteStore::open(SqliteConfig::new(&path)).unwrap();
    assert_eq!(s.get("/t/ns/k").await.unwrap().revision(), Some(3));
    s.close().await;
}

/// The watch cache's ring keeps only its newest changes parsed and the older ones as the JSON
/// written: the SQLite backend hands it that JSON with each change (without it every change in
/// the ring stayed parsed, ten times its size, and an idle server holding a round of large
/// records grew to gigabytes). A watch replaying from the ring still gets every change whole.
#[tokio::test]
async fn the_watch_ring_keeps_older_changes_as_their_json() {
    let dir = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(SqliteConfig::new(dir.path().join("orrery.db"))).unwrap();
    let first = s.create("/t/ns/x", obj("x")).await.unwrap();
    let mut written = vec![first.clone()];
    for i in 0..600 {
        let mut o = (*written[written.len() - 1]).clone();
        o.metadata.labels.insert("n".into(), i.to_string());
        written.push(s.update("/t/ns/x", o, None).await.unwrap());
    }
    // Nothing but this test holds the first version parsed any more; the newest is also held
    // by the ring (and the cache of recent writes).
    assert_eq!(Arc::strong_count(&first), 2, "the test's two copies only");
    assert!(Arc::strong_count(&written[600]) > 2);
    let from = first.revision().unwrap() - 1;
    let mut w = s.watch("/t/ns/", from, Default::default()).await.unwrap();
    for want in &written {
        let ev = w.next().await.unwrap().unwrap();
        match ev {
            orrery_store::WatchEvent::Added(o) | orrery_store::WatchEvent::Modified(o) => {
                assert_eq!(&o, want)
            }
            other => panic!("{other:?}"),
        }
    }
}

/// A backup taken while writes go on holds every write acknowledged before it started and is
/// one snapshot; a restore of it continues past any revision the old store may have given out
/// after the snapshot, with older history marked compacted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_under_writes_restores_every_write_acknowledged_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orrery.db");
    let store = Arc::new(SqliteStore::open(SqliteConfig::new(&path)).unwrap());
    for i in 0..200 {
        store
            .create(
                &format!("/registry/configmaps/ns/a{i}"),
                obj(&format!("a{i}")),
            )
            .await
            .unwrap();
    }
    // Writes acknowledged before the backup starts, and a stream of them during it.
    let acknowledged = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (store, acknowledged, stop) = (store.clone(), acknowledged.clone(), stop.clone());
        tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let key = format!("/registry/configmaps/ns/b{i}");
                let o = store.create(&key, obj(&format!("b{i}"))).await.unwrap();
                acknowledged.lock().push((key, o.revision().unwrap()));
                i += 1;
            }
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let before: Vec<(String, i64)> = acknowledged.lock().clone();
    let to = dir.path().join("backup.db");
    let (p, t) = (path.clone(), to.clone());
    let backup = tokio::task::spawn_blocking(move || {
        orrery_store_sqlite::backup(&p, &t, &[("tls/ca.crt".into(), b"pem".to_vec())])
    })
    .await
    .unwrap()
    .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    writer.await.unwrap();
    let after = acknowledged.lock().clone();
    assert!(
        after.len() > before.len(),
        "writes went on during the backup"
    );
    let last = store.current_revision().await.unwrap();
    assert!(backup.revision < last, "{backup:?} {last}");
    store.close().await;

    // Never over a store.
    let again = orrery_store_sqlite::restore(&to, &path, 1000);
    assert!(
        matches!(&again, Err(StoreError::Backend(m)) if m.contains("never overwrites")),
        "{again:?}"
    );
    let restored_dir = tempfile::tempdir().unwrap();
    let target = restored_dir.path().join("orrery.db");
    let (r, kept) = orrery_store_sqlite::restore(&to, &target, 1_000_000).unwrap();
    assert_eq!(kept, vec![("tls/ca.crt".to_string(), b"pem".to_vec())]);
    assert_eq!(r.revision, backup.revision);
    assert_eq!(r.continues_at, backup.revision + 1_000_000);
    let restored = SqliteStore::open(SqliteConfig::new(&target)).unwrap();
    // Every write acknowledged before the backup began, and exactly those up to its revision.
    for (key, rev) in &after {
        let got = restored.get(key).await;
        if *rev <= backup.revision {
            assert_eq!(got.unwrap().revision(), Some(*rev), "{key}");
        } else {
            assert!(matches!(got, Err(StoreError::NotFound { .. })), "{key}");
        }
    }
    for (key, _) in &before {
        assert!(
            restored.get(key).await.is_ok(),
            "{key} was acknowledged first"
        );
    }
    assert_eq!(restored.current_revision().await.unwrap(), r.continues_at);
    let o = restored
        .create("/registry/configmaps/ns/new", obj("new"))
        .await
        .unwrap();
    assert!(
        o.revision().unwrap() > last,
        "no revision is given out twice"
    );
    // A watch from before the restore is told to list again.
    let w = restored
        .watch("/registry/", backup.revision, Default::default())
        .await;
    assert!(matches!(w, Err(StoreError::Expired { .. })), "{w:?}");
    restored.close().await;
    // A file that is not a store is refused.
    std::fs::write(dir.path().join("junk.db"), b"not a database at all").unwrap();
    let junk = orrery_store_sqlite::restore(
        &dir.path().join("junk.db"),
        &restored_dir.path().join("other.db"),
        0,
    );
    assert!(junk.is_err(), "{junk:?}");
}

#[tokio::test]
async fn a_store_of_a_newer_schema_is_refused_saying_why() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orrery.db");
    let s = SqliteStore::open(SqliteConfig::new(&path)).unwrap();
    s.close().await;
    drop(s);
    let c = rusqlite::Connection::open(&path).unwrap();
    c.pragma_update(
        None,
        "user_version",
        orrery_store_sqlite::SCHEMA_VERSION + 1,
    )
    .unwrap();
    drop(c);
    let msg = refused(&path);
    assert!(msg.contains("newer than this build"), "{msg}");
    assert!(msg.contains("downgrades are not supported"), "{msg}");
}
