//! The behaviour every [`Store`] backend must have. Each function is one test; the
//! [`store_conformance_tests!`](crate::store_conformance_tests) macro instantiates all of them
//! for a backend's harness.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use orrery_api::{Object, fields, labels};
use orrery_store::{
    ListOptions, Preconditions, Revision, Store, StoreError, WatchEvent, WatchOptions, WatchStream,
};

use crate::{Harness, object};

const WAIT: Duration = Duration::from_secs(10);

/// Reads `n` events, failing the test if they do not come within a few seconds.
pub async fn take(w: &mut WatchStream, n: usize) -> Vec<WatchEvent> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        match tokio::time::timeout(WAIT, w.next()).await {
            Ok(Some(Ok(WatchEvent::Bookmark(_)))) => {}
            Ok(Some(Ok(ev))) => out.push(ev),
            Ok(Some(Err(e))) => panic!("watch failed after {} events: {e}", out.len()),
            Ok(None) => panic!("watch ended after {} of {n} events", out.len()),
            Err(_) => panic!("timed out after {} of {n} events", out.len()),
        }
    }
    out
}

/// Asserts that no further event arrives within a short time.
pub async fn assert_quiet(w: &mut WatchStream) {
    loop {
        match tokio::time::timeout(Duration::from_millis(300), w.next()).await {
            Err(_) => return,
            Ok(Some(Ok(WatchEvent::Bookmark(_)))) => continue,
            Ok(other) => panic!("unexpected watch event: {other:?}"),
        }
    }
}

fn summary(evs: &[WatchEvent]) -> Vec<(&'static str, String, Revision)> {
    evs.iter()
        .map(|e| {
            (
                e.type_name(),
                e.object().map(|o| o.name().to_string()).unwrap_or_default(),
                e.revision(),
            )
        })
        .collect()
}

fn payload(o: &Object) -> String {
    o.other["data"]["payload"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn rev(o: &Object) -> Revision {
    o.revision()
        .expect("objects from the store carry their revision")
}

pub async fn crud(h: &dyn Harness) {
    let s = h.open().await;
    let r0 = s.current_revision().await.unwrap();
    let created = s.create("/t/ns/a", object("a", "web", "v1")).await.unwrap();
    let r1 = rev(&created);
    assert!(r1 > r0, "a write gets a new revision");
    assert_eq!(s.current_revision().await.unwrap(), r1);

    let got = s.get("/t/ns/a").await.unwrap();
    assert_eq!(rev(&got), r1);
    assert_eq!(payload(&got), "v1");
    assert_eq!(got.metadata.labels["app"], "web");

    let err = s
        .create("/t/ns/a", object("a", "web", "again"))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::AlreadyExists { .. }), "{err:?}");

    let updated = s
        .update("/t/ns/a", object("a", "web", "v2"), Some(r1))
        .await
        .unwrap();
    let r2 = rev(&updated);
    assert!(r2 > r1);
    assert_eq!(payload(&s.get("/t/ns/a").await.unwrap()), "v2");

    // Unconditional update of an existing key, and of a missing one.
    let r3 = rev(&s
        .update("/t/ns/a", object("a", "web", "v3"), None)
        .await
        .unwrap());
    assert!(r3 > r2);
    assert!(
        s.update("/t/ns/missing", object("missing", "x", ""), None)
            .await
            .unwrap_err()
            .is_not_found()
    );
    assert!(
        s.update("/t/ns/missing", object("missing", "x", ""), Some(1))
            .await
            .unwrap_err()
            .is_not_found()
    );

    let deleted = s
        .delete("/t/ns/a", &Preconditions::default())
        .await
        .unwrap();
    let r4 = rev(&deleted);
    assert!(r4 > r3, "a delete is a write with its own revision");
    assert_eq!(payload(&deleted), "v3", "a delete returns the last state");
    assert!(s.get("/t/ns/a").await.unwrap_err().is_not_found());
    assert!(
        s.delete("/t/ns/a", &Preconditions::default())
            .await
            .unwrap_err()
            .is_not_found()
    );

    // A deleted key can be created again.
    let again = s.create("/t/ns/a", object("a", "web", "v5")).await.unwrap();
    assert!(rev(&again) > r4);
    assert_eq!(payload(&s.get("/t/ns/a").await.unwrap()), "v5");
}

/// A recent read (`Store::get_recent`) and a copy (`Store::get_copy`) may lag, but they catch
/// up with every write (create, update, delete) within moments and show only revisions that
/// were written.
pub async fn recent_reads_catch_up(h: &dyn Harness) {
    let s = h.open().await;
    for copy in [false, true] {
        let key = "/t/ns/a";
        assert!(
            read(s.as_ref(), key, copy)
                .await
                .unwrap_err()
                .is_not_found()
        );
        let mut written = vec![rev(&s.create(key, object("a", "web", "v1")).await.unwrap())];
        recent_reaches(s.as_ref(), key, copy, Some(written[0]), &written).await;
        written.push(rev(&s
            .update(key, object("a", "web", "v2"), Some(written[0]))
            .await
            .unwrap()));
        let got = recent_reaches(s.as_ref(), key, copy, Some(written[1]), &written).await;
        assert_eq!(payload(&got.unwrap()), "v2");
        s.delete(key, &Preconditions::default()).await.unwrap();
        recent_reaches(s.as_ref(), key, copy, None, &written).await;
    }
}

/// A recent read of `key`, or with `copy` the nearest copy.
async fn read(s: &dyn Store, key: &str, copy: bool) -> orrery_store::Result<Arc<Object>> {
    if copy {
        s.get_copy(key).await
    } else {
        s.get_recent(key).await
    }
}

/// Reads `key` recently (or its copy) until it shows revision `want` (`None`: gone), checking
/// that whatever it shows on the way is one of the revisions `written`.
async fn recent_reaches(
    s: &dyn Store,
    key: &str,
    copy: bool,
    want: Option<Revision>,
    written: &[Revision],
) -> Option<Arc<Object>> {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let got = match read(s, key, copy).await {
            Ok(o) => Some(o),
            Err(e) if e.is_not_found() => None,
            Err(e) => panic!("a recent read failed: {e:?}"),
        };
        let seen = got.as_deref().map(rev);
        if let Some(r) = seen {
            assert!(written.contains(&r), "revision {r} was never written");
        }
        if seen == want {
            return got;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "a recent read still shows {seen:?}, not {want:?}, after 5 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub async fn cas_and_preconditions(h: &dyn Harness) {
    let s = h.open().await;
    let mut o = object("a", "web", "v1");
    o.metadata.uid = "uid-1".into();
    let r1 = rev(&s.create("/t/ns/a", o.clone()).await.unwrap());
    let r2 = rev(&s.update("/t/ns/a", o.clone(), Some(r1)).await.unwrap());

    match s.update("/t/ns/a", o.clone(), Some(r1)).await.unwrap_err() {
        StoreError::Conflict {
            expected, current, ..
        } => assert_eq!((expected, current), (r1, r2)),
        e => panic!("stale update must conflict, got {e:?}"),
    }
    let stale_rv = Preconditions {
        revision: Some(r1),
        uid: None,
    };
    assert!(
        s.delete("/t/ns/a", &stale_rv)
            .await
            .unwrap_err()
            .is_conflict()
    );
    let wrong_uid = Preconditions {
        uid: Some("uid-2".into()),
        revision: None,
    };
    match s.delete("/t/ns/a", &wrong_uid).await.unwrap_err() {
        StoreError::PreconditionFailed { message, .. } => {
            assert!(message.contains("uid-2"), "{message}")
        }
        e => panic!("wrong uid must fail the precondition, got {e:?}"),
    }
    assert!(
        s.get("/t/ns/a").await.is_ok(),
        "failed deletes delete nothing"
    );
    let right = Preconditions {
        uid: Some("uid-1".into()),
        revision: Some(r2),
    };
    s.delete("/t/ns/a", &right).await.unwrap();
    assert!(s.get("/t/ns/a").await.unwrap_err().is_not_found());

    // An update of a missing key is NotFound whatever revision it expects, 0 included (etcd
    // compares a missing key's revision as 0), and creates nothing.
    for expected in [None, Some(0), Some(r1), Some(r2)] {
        let e = s.update("/t/ns/a", o.clone(), expected).await.unwrap_err();
        assert!(e.is_not_found(), "update expecting {expected:?}: {e:?}");
        let e = s
            .update("/t/ns/never", o.clone(), expected)
            .await
            .unwrap_err();
        assert!(e.is_not_found(), "update expecting {expected:?}: {e:?}");
    }
    assert!(s.get("/t/ns/a").await.unwrap_err().is_not_found());
    assert!(s.get("/t/ns/never").await.unwrap_err().is_not_found());
}

pub async fn concurrent_writers(h: &dyn Harness) {
    let s = h.open().await;
    s.create("/t/ns/counter", object("counter", "c", "0"))
        .await
        .unwrap();
    let (tasks, per_task) = (8, 25);
    let mut handles = Vec::new();
    for t in 0..tasks {
        let s = s.clone();
        handles.push(tokio::spawn(async move {
            let mut revs = Vec::new();
            for i in 0..per_task {
                // Compare-and-swap increments: lost updates would show in the final count.
                let done = orrery_store::update_with(s.as_ref(), "/t/ns/counter", |mut o| {
                    let n: u64 = payload(&o).parse().unwrap();
                    o.other.insert(
                        "data".into(),
                        serde_json::json!({ "payload": (n + 1).to_string() }),
                    );
                    Ok(Some(o))
                })
                .await
                .unwrap();
                revs.push(rev(&done));
                // Interleave creates of distinct keys.
                let c = s
                    .create(
                        &format!("/t/ns/k-{t}-{i}"),
                        object(&format!("k-{t}-{i}"), "k", ""),
                    )
                    .await
                    .unwrap();
                revs.push(rev(&c));
            }
            revs
        }));
    }
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.unwrap());
    }
    let unique: BTreeSet<_> = all.iter().collect();
    assert_eq!(unique.len(), all.len(), "every write has its own revision");
    let counter = s.get("/t/ns/counter").await.unwrap();
    assert_eq!(
        payload(&counter),
        (tasks * per_task).to_string(),
        "no increment was lost"
    );
    let listed = s.list("/t/ns/", &ListOptions::default()).await.unwrap();
    assert_eq!(listed.items.len(), tasks * per_task + 1);
    assert!(listed.revision >= *all.iter().max().unwrap());
}

pub async fn list_pagination_is_consistent(h: &dyn Harness) {
    let s = h.open().await;
    for i in 0..40 {
        s.create(
            &format!("/t/ns/{i:03}"),
            object(&format!("{i:03}"), "web", "v1"),
        )
        .await
        .unwrap();
    }
    // Keys just outside the prefix must never appear.
    s.create("/t/nsx/000", object("000", "web", ""))
        .await
        .unwrap();
    s.create("/t/n/000", object("000", "web", ""))
        .await
        .unwrap();

    let first = s
        .list("/t/ns/", &ListOptions::default().with_limit(7))
        .await
        .unwrap();
    assert_eq!(first.items.len(), 7);
    let at = first.revision;
    let mut token = first.continue_token.clone().expect("more pages follow");
    let mut names: Vec<String> = first.items.iter().map(|o| o.name().to_string()).collect();

    // Writes after the first page must not show in later pages.
    s.delete("/t/ns/020", &Preconditions::default())
        .await
        .unwrap();
    s.update("/t/ns/030", object("030", "web", "v2"), None)
        .await
        .unwrap();
    s.create("/t/ns/0355", object("0355", "web", "new"))
        .await
        .unwrap();
    s.create("/t/ns/999", object("999", "web", "new"))
        .await
        .unwrap();

    loop {
        let page = s
            .list(
                "/t/ns/",
                &ListOptions::default()
                    .with_limit(7)
                    .with_continue(token.clone()),
            )
            .await
            .unwrap();
        assert_eq!(
            page.revision, at,
            "every page reflects the first page's revision"
        );
        assert!(page.items.len() <= 7);
        for o in &page.items {
            if o.name() == "030" {
                assert_eq!(payload(o), "v1", "later updates are invisible");
            }
            assert!(rev(o) <= at);
        }
        names.extend(page.items.iter().map(|o| o.name().to_string()));
        match page.continue_token {
            Some(t) => token = t,
            None => break,
        }
    }
    let expected: Vec<String> = (0..40).map(|i| format!("{i:03}")).collect();
    assert_eq!(
        names, expected,
        "pages are in key order, complete, without duplicates"
    );

    // A fresh list sees the later writes.
    let now = s.list("/t/ns/", &ListOptions::default()).await.unwrap();
    let now_names: Vec<_> = now.items.iter().map(|o| o.name().to_string()).collect();
    assert!(!now_names.contains(&"020".to_string()));
    assert!(now_names.contains(&"0355".to_string()) && now_names.contains(&"999".to_string()));
    assert_eq!(now.items.len(), 41);
    assert!(now.continue_token.is_none());

    // A limit that covers everything gives no continue token.
    let all = s
        .list("/t/ns/", &ListOptions::default().with_limit(41))
        .await
        .unwrap();
    assert_eq!(all.items.len(), 41);
    assert!(all.continue_token.is_none());
}

pub async fn list_selectors_and_revisions(h: &dyn Harness) {
    let s = h.open().await;
    for i in 0..30 {
        let app = if i % 3 == 0 { "db" } else { "web" };
        let mut o = object(&format!("o{i:02}"), app, "");
        o.metadata.namespace = if i % 2 == 0 {
            "even".into()
        } else {
            "odd".into()
        };
        s.create(&format!("/t/{}/o{i:02}", o.metadata.namespace), o)
            .await
            .unwrap();
    }
    let sel = |l: &str, f: &str| ListOptions {
        labels: labels::Selector::parse(l).unwrap(),
        fields: fields::Selector::parse(f).unwrap(),
        ..Default::default()
    };
    assert_eq!(
        s.list("/t/", &sel("app=db", "")).await.unwrap().items.len(),
        10
    );
    assert_eq!(
        s.list("/t/", &sel("app!=db", ""))
            .await
            .unwrap()
            .items
            .len(),
        20
    );
    assert_eq!(
        s.list("/t/", &sel("app in (db,web)", "metadata.namespace=even"))
            .await
            .unwrap()
            .items
            .len(),
        15
    );
    assert_eq!(
        s.list("/t/", &sel("", "metadata.name=o07"))
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    assert_eq!(
        s.list("/t/", &sel("missing", ""))
            .await
            .unwrap()
            .items
            .len(),
        0
    );

    // Limits count matching items; paging a filtered list still finds them all.
    let mut found = Vec::new();
    let mut opts = sel("app=db", "");
    opts.limit = Some(3);
    loop {
        let page = s.list("/t/", &opts).await.unwrap();
        assert!(page.items.len() <= 3);
        found.extend(page.items.iter().map(|o| o.name().to_string()));
        match page.continue_token {
            Some(t) => opts.continue_token = Some(t),
            None => break,
        }
    }
    // Key order: everything under /t/even/ before /t/odd/.
    assert_eq!(
        found,
        [
            "o00", "o06", "o12", "o18", "o24", "o03", "o09", "o15", "o21", "o27"
        ]
    );

    // The state at an earlier revision.
    let before = s.current_revision().await.unwrap();
    s.delete("/t/even/o00", &Preconditions::default())
        .await
        .unwrap();
    s.update("/t/odd/o01", object("o01", "changed", ""), None)
        .await
        .unwrap();
    let then = s
        .list("/t/", &ListOptions::default().at_revision(before))
        .await
        .unwrap();
    assert_eq!(then.revision, before);
    assert_eq!(then.items.len(), 30);
    assert_eq!(
        then.items
            .iter()
            .find(|o| o.name() == "o01")
            .unwrap()
            .metadata
            .labels["app"],
        "web"
    );
    assert_eq!(
        s.list("/t/", &ListOptions::default())
            .await
            .unwrap()
            .items
            .len(),
        29
    );

    let future = s.current_revision().await.unwrap() + 1000;
    let err = s
        .list("/t/", &ListOptions::default().at_revision(future))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::FutureRevision { .. }), "{err:?}");
    let err = s
        .list("/t/", &ListOptions::default().with_continue("not-a-token"))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::InvalidContinue(_)), "{err:?}");
}

pub async fn raw_lists_match_parsed_lists(h: &dyn Harness) {
    let s = h.open().await;
    for i in 0..23 {
        let app = if i % 2 == 0 { "web" } else { "db" };
        s.create(
            &format!("/t/ns/r{i:02}"),
            object(&format!("r{i:02}"), app, &format!("v{i}")),
        )
        .await
        .unwrap();
    }
    s.update("/t/ns/r03", object("r03", "db", "changed"), None)
        .await
        .unwrap();
    for opts in [
        ListOptions::default(),
        ListOptions::default().with_labels(labels::Selector::parse("app=web").unwrap()),
        ListOptions::default().with_limit(5),
        ListOptions::default()
            .with_limit(4)
            .with_labels(labels::Selector::parse("app=db").unwrap()),
    ] {
        let mut parsed_all = Vec::new();
        let mut raw_all = Vec::new();
        let (mut a, mut b) = (opts.clone(), opts.clone());
        loop {
            let parsed = s.list("/t/ns/", &a).await.unwrap();
            let raw = s.list_raw("/t/ns/", &b).await.unwrap();
            assert_eq!(parsed.revision, raw.revision);
            assert_eq!(
                parsed.continue_token.is_some(),
                raw.continue_token.is_some()
            );
            parsed_all.extend(parsed.items);
            for r in raw.items {
                let o: orrery_api::Object = serde_json::from_slice(&r.json).unwrap();
                assert_eq!(
                    o.revision(),
                    Some(r.revision),
                    "the raw JSON carries its resourceVersion"
                );
                raw_all.push(o);
            }
            match (parsed.continue_token, raw.continue_token) {
                (Some(x), Some(y)) => {
                    a.continue_token = Some(x);
                    b.continue_token = Some(y);
                }
                _ => break,
            }
        }
        assert_eq!(
            raw_all, parsed_all,
            "raw and parsed lists agree for {opts:?}"
        );
        assert!(!raw_all.is_empty());
    }
}

pub async fn watch_replays_later_events_in_order(h: &dyn Harness) {
    let s = h.open().await;
    let start = s.current_revision().await.unwrap();
    let mut expected = Vec::new();
    // More writes than the test cache's history, so early starts replay from the backend.
    for i in 0..30 {
        let key = format!("/t/ns/o{}", i % 5);
        let name = format!("o{}", i % 5);
        let o = match s.get(&key).await {
            Ok(_) => (
                s.update(&key, object(&name, "web", &i.to_string()), None)
                    .await
                    .unwrap(),
                "MODIFIED",
            ),
            Err(_) => (
                s.create(&key, object(&name, "web", &i.to_string()))
                    .await
                    .unwrap(),
                "ADDED",
            ),
        };
        expected.push((o.1, name.clone(), rev(&o.0)));
        if i % 7 == 6 {
            let d = s.delete(&key, &Preconditions::default()).await.unwrap();
            expected.push(("DELETED", name, rev(&d)));
        }
        // Noise under another prefix.
        s.create(&format!("/u/ns/n{i}"), object(&format!("n{i}"), "web", ""))
            .await
            .unwrap();
    }
    for from_index in [0usize, 1, 10, expected.len() - 3, expected.len()] {
        let from = if from_index == 0 {
            start
        } else {
            expected[from_index - 1].2
        };
        let mut w = s.watch("/t/", from, WatchOptions::default()).await.unwrap();
        let want = &expected[from_index..];
        let got = take(&mut w, want.len()).await;
        let got = summary(&got);
        let want: Vec<_> = want.iter().map(|(t, n, r)| (*t, n.clone(), *r)).collect();
        assert_eq!(got, want, "watch from revision {from}");
        assert_quiet(&mut w).await;
    }
    // Then live events follow the replay.
    let mut w = s
        .watch(
            "/t/",
            s.current_revision().await.unwrap(),
            WatchOptions::default(),
        )
        .await
        .unwrap();
    let live = s
        .create("/t/ns/live", object("live", "web", ""))
        .await
        .unwrap();
    let got = take(&mut w, 1).await;
    assert_eq!(summary(&got), [("ADDED", "live".to_string(), rev(&live))]);
}

pub async fn watch_sees_deletes_and_prefixes(h: &dyn Harness) {
    let s = h.open().await;
    let from = s.current_revision().await.unwrap();
    let mut ns = s
        .watch("/t/ns/", from, WatchOptions::default())
        .await
        .unwrap();
    let mut all = s.watch("/t/", from, WatchOptions::default()).await.unwrap();
    let mut everything = s.watch("", from, WatchOptions::default()).await.unwrap();
    s.create("/t/ns/a", object("a", "web", "last"))
        .await
        .unwrap();
    s.create("/t/nsx/b", object("b", "web", "")).await.unwrap();
    let d = s
        .delete("/t/ns/a", &Preconditions::default())
        .await
        .unwrap();

    let evs = take(&mut ns, 2).await;
    assert_eq!(evs[1].type_name(), "DELETED");
    assert_eq!(
        evs[1].revision(),
        rev(&d),
        "a delete event carries the delete's revision"
    );
    assert_eq!(
        payload(evs[1].object().unwrap()),
        "last",
        "and the object's last state"
    );
    assert_quiet(&mut ns).await;
    assert_eq!(take(&mut all, 3).await.len(), 3);
    assert_eq!(take(&mut everything, 3).await.len(), 3);
    assert!(
        s.watch("/t/ns", from, WatchOptions::default())
            .await
            .is_err(),
        "a watch prefix ends with '/'"
    );
}

pub async fn watch_selectors(h: &dyn Harness) {
    let s = h.open().await;
    let from = s.current_revision().await.unwrap();
    let opts = WatchOptions {
        labels: labels::Selector::parse("app=web").unwrap(),
        ..Default::default()
    };
    let mut w = s.watch("/t/", from, opts).await.unwrap();
    s.create("/t/ns/a", object("a", "db", "")).await.unwrap(); // not selected
    s.update("/t/ns/a", object("a", "web", ""), None)
        .await
        .unwrap(); // starts matching: ADDED
    s.update("/t/ns/a", object("a", "web", "2"), None)
        .await
        .unwrap(); // MODIFIED
    s.update("/t/ns/a", object("a", "db", ""), None)
        .await
        .unwrap(); // stops matching: DELETED
    s.delete("/t/ns/a", &Preconditions::default())
        .await
        .unwrap(); // not selected
    s.create("/t/ns/b", object("b", "web", "")).await.unwrap(); // ADDED
    let got: Vec<_> = summary(&take(&mut w, 4).await)
        .into_iter()
        .map(|(t, n, _)| (t, n))
        .collect();
    let want = [
        ("ADDED", "a"),
        ("MODIFIED", "a"),
        ("DELETED", "a"),
        ("ADDED", "b"),
    ];
    assert_eq!(got, want.map(|(t, n)| (t, n.to_string())));
    assert_quiet(&mut w).await;

    let opts = WatchOptions {
        fields: fields::Selector::parse("metadata.name=b").unwrap(),
        ..Default::default()
    };
    let mut w = s.watch("/t/", from, opts).await.unwrap();
    assert_eq!(take(&mut w, 1).await[0].object().unwrap().name(), "b");
}

pub async fn compaction_expires_old_revisions(h: &dyn Harness) {
    let s = h.open().await;
    let mut revs = Vec::new();
    let mut paged = None;
    for i in 0..20 {
        if i == 5 {
            // A paginated list in progress at an early revision.
            paged = Some(
                s.list("/t/", &ListOptions::default().with_limit(2))
                    .await
                    .unwrap(),
            );
        }
        let o = s
            .update("/t/ns/hot", object("hot", "web", &i.to_string()), None)
            .await;
        let o = match o {
            Ok(o) => o,
            Err(_) => s
                .create("/t/ns/hot", object("hot", "web", &i.to_string()))
                .await
                .unwrap(),
        };
        revs.push(rev(&o));
        s.create(&format!("/t/ns/c{i}"), object(&format!("c{i}"), "web", ""))
            .await
            .unwrap();
        if i % 4 == 0 {
            s.delete(&format!("/t/ns/c{i}"), &Preconditions::default())
                .await
                .unwrap();
        }
    }
    let before = s.list("/t/", &ListOptions::default()).await.unwrap();
    let paged = paged.unwrap();
    let target = revs[15];
    s.compact(target).await.unwrap();
    assert!(s.compacted_revision().await.unwrap() >= target);
    // Compacting to the past again is harmless; to the future is refused.
    s.compact(revs[3]).await.unwrap();
    let future = s.current_revision().await.unwrap() + 100;
    assert!(matches!(
        s.compact(future).await.unwrap_err(),
        StoreError::FutureRevision { .. }
    ));

    let err = s
        .list("/t/", &ListOptions::default().at_revision(revs[10]))
        .await
        .unwrap_err();
    assert!(
        err.is_expired(),
        "list before the compacted revision: {err:?}"
    );
    let err = s
        .watch("/t/", revs[10], WatchOptions::default())
        .await
        .unwrap_err();
    assert!(
        err.is_expired(),
        "watch before the compacted revision: {err:?}"
    );
    let err = s
        .list(
            "/t/",
            &ListOptions::default()
                .with_limit(2)
                .with_continue(paged.continue_token.unwrap()),
        )
        .await
        .unwrap_err();
    assert!(
        err.is_expired(),
        "a continue token from before compaction: {err:?}"
    );

    // Physical clean-up runs in the background; reads at and after the target stay exact.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = s.list("/t/", &ListOptions::default()).await.unwrap();
    assert_eq!(
        after.items, before.items,
        "compaction never changes the current state"
    );
    let at = s
        .list("/t/", &ListOptions::default().at_revision(target))
        .await
        .unwrap();
    let hot = at.items.iter().find(|o| o.name() == "hot").unwrap();
    assert_eq!(payload(hot), "15");
    let mut w = s
        .watch("/t/", target, WatchOptions::default())
        .await
        .unwrap();
    let evs = take(&mut w, 1).await;
    assert!(evs[0].revision() > target);
}

/// A version kept by one compaction (it was its key's latest then) must not come back when a
/// later compaction removes the newer tombstone or version, nor after a restart.
pub async fn compaction_across_windows_keeps_deletes_deleted(h: &dyn Harness) {
    let s = h.open().await;
    let fill = |round: usize| {
        let s = s.clone();
        async move {
            for i in 0..10 {
                s.create(
                    &format!("/t/fill/{round}-{i}"),
                    object(&format!("{round}-{i}"), "fill", ""),
                )
                .await
                .unwrap();
            }
        }
    };
    s.create("/t/ns/ghost", object("ghost", "web", "old"))
        .await
        .unwrap();
    s.create("/t/ns/changed", object("changed", "web", "old"))
        .await
        .unwrap();
    s.create("/t/ns/kept", object("kept", "web", "old"))
        .await
        .unwrap();
    fill(0).await;
    // The first window covers all three while each is its key's latest version.
    s.compact(s.current_revision().await.unwrap())
        .await
        .unwrap();
    h.settle().await;
    s.delete("/t/ns/ghost", &Preconditions::default())
        .await
        .unwrap();
    let changed = s
        .update("/t/ns/changed", object("changed", "web", "new"), None)
        .await
        .unwrap();
    fill(1).await;
    // The second covers the tombstone and the newer version.
    s.compact(s.current_revision().await.unwrap())
        .await
        .unwrap();
    h.settle().await;
    fill(2).await;
    s.compact(s.current_revision().await.unwrap())
        .await
        .unwrap();
    h.settle().await;
    let mut s = s;
    for restart in [false, true] {
        if restart {
            s.close().await;
            s = h.open().await;
        }
        assert!(
            s.get("/t/ns/ghost").await.unwrap_err().is_not_found(),
            "a deleted object stays deleted"
        );
        let got = s.get("/t/ns/changed").await.unwrap();
        assert_eq!(payload(&got), "new", "the newer version stays the latest");
        assert_eq!(rev(&got), rev(&changed));
        assert_eq!(payload(&s.get("/t/ns/kept").await.unwrap()), "old");
        let names: Vec<String> = s
            .list("/t/ns/", &ListOptions::default())
            .await
            .unwrap()
            .items
            .iter()
            .map(|o| o.name().to_string())
            .collect();
        assert_eq!(names, ["changed", "kept"]);
    }
}

pub async fn slow_watcher_is_cut_off(h: &dyn Harness) {
    let s = h.open().await;
    let from = s.current_revision().await.unwrap();
    let mut slow = s.watch("/t/", from, WatchOptions::default()).await.unwrap();
    let mut fast = s.watch("/t/", from, WatchOptions::default()).await.unwrap();
    let writes = 300; // well over the test watcher buffer
    let writer = {
        let s = s.clone();
        tokio::spawn(async move {
            for i in 0..writes {
                s.create(&format!("/t/ns/{i}"), object(&format!("{i}"), "web", ""))
                    .await
                    .unwrap();
            }
        })
    };
    let got = take(&mut fast, writes).await;
    assert_eq!(got.len(), writes, "a reader that keeps up sees everything");
    writer.await.unwrap();
    // The slow one is ended with an expired error (so its client re-lists), then ends.
    let mut delivered = 0;
    loop {
        match tokio::time::timeout(WAIT, slow.next())
            .await
            .expect("the slow watcher gets an answer")
        {
            Some(Ok(_)) => delivered += 1,
            Some(Err(e)) => {
                assert!(e.is_expired(), "{e:?}");
                break;
            }
            None => panic!("the slow watcher ended without an error"),
        }
    }
    assert!(
        delivered < writes,
        "the slow watcher did not see all events before expiring"
    );
    assert!(slow.next().await.is_none());
}

pub async fn bookmarks(h: &dyn Harness) {
    let s = h.open().await;
    let from = s.current_revision().await.unwrap();
    let opts = WatchOptions {
        bookmark_interval: Some(Duration::from_millis(100)),
        ..Default::default()
    };
    let mut w = s.watch("/quiet/", from, opts).await.unwrap();
    let other = s.create("/t/ns/x", object("x", "web", "")).await.unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let ev = tokio::time::timeout_at(deadline, w.next())
            .await
            .expect("a bookmark arrives")
            .unwrap()
            .unwrap();
        match ev {
            WatchEvent::Bookmark(r) if r >= rev(&other) => break,
            WatchEvent::Bookmark(r) => assert!(r >= from),
            e => panic!("no events expected under /quiet/: {e:?}"),
        }
    }
}

pub async fn reopen_keeps_everything(h: &dyn Harness) {
    let s = h.open().await;
    let mut last = 0;
    let mut expected = BTreeMap::new();
    for i in 0..25 {
        let o = s
            .create(
                &format!("/t/ns/{i:02}"),
                object(&format!("{i:02}"), "web", &i.to_string()),
            )
            .await
            .unwrap();
        last = rev(&o);
        expected.insert(format!("{i:02}"), i.to_string());
    }
    let d = s
        .delete("/t/ns/24", &Preconditions::default())
        .await
        .unwrap();
    expected.remove("24");
    last = last.max(rev(&d));
    s.close().await;
    assert!(
        s.create("/t/ns/late", object("late", "web", ""))
            .await
            .is_err(),
        "a closed store takes no writes"
    );
    drop(s);

    let s = h.open().await;
    assert!(
        s.current_revision().await.unwrap() >= last,
        "revisions never go backwards"
    );
    let listed = s.list("/t/ns/", &ListOptions::default()).await.unwrap();
    let got: BTreeMap<_, _> = listed
        .items
        .iter()
        .map(|o| (o.name().to_string(), payload(o)))
        .collect();
    assert_eq!(got, expected);
    let next = s
        .create("/t/ns/after", object("after", "web", ""))
        .await
        .unwrap();
    assert!(rev(&next) > last);
    // History from before the restart can still be watched.
    let mut w = s
        .watch("/t/ns/", last - 1, WatchOptions::default())
        .await
        .unwrap();
    let evs = take(&mut w, 2).await;
    assert_eq!(evs[0].type_name(), "DELETED");
    assert_eq!(evs[1].object().unwrap().name(), "after");
}

/// The store's format record: made on a new store, left alone when current, an older format
/// migrated step by step (recorded once, idempotent across restarts and racing replicas), a
/// newer one refused.
pub async fn format_is_recorded_migrated_and_refused_when_newer(h: &dyn Harness) {
    use orrery_store::format::{self, FormatError, Outcome, Step};
    let s = h.open().await;
    assert_eq!(
        format::ensure(s.as_ref(), "b1").await.unwrap(),
        Outcome::Created
    );
    assert_eq!(
        format::ensure(s.as_ref(), "b1").await.unwrap(),
        Outcome::Current
    );
    // A later build with a step 1 -> 2 that writes an object (idempotently).
    fn step(
        s: &dyn Store,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = orrery_store::Result<()>> + Send + '_>>
    {
        Box::pin(async move {
            match s
                .create("/registry/t/ns/migrated", object("migrated", "a", ""))
                .await
            {
                Ok(_) | Err(orrery_store::StoreError::AlreadyExists { .. }) => Ok(()),
                Err(e) => Err(e),
            }
        })
    }
    let steps = [
        Step {
            from: 0,
            what: "record",
            run: |_| Box::pin(async { Ok(()) }),
        },
        Step {
            from: 1,
            what: "add an object",
            run: step,
        },
    ];
    // Two replicas at once: the step is recorded once.
    let (a, b) = tokio::join!(
        format::ensure_with(s.as_ref(), "b2", &steps, 2),
        format::ensure_with(s.as_ref(), "b2", &steps, 2)
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    let made: usize = [a, b]
        .iter()
        .map(|o| match o {
            Outcome::Migrated(m) => m.len(),
            _ => 0,
        })
        .sum();
    assert_eq!(made, 1, "one replica records the step");
    let rec: format::Format =
        serde_json::from_value(s.get(format::KEY).await.unwrap().spec.unwrap()).unwrap();
    assert_eq!(rec.version, 2);
    assert_eq!(rec.migrations.len(), 1);
    assert_eq!((rec.migrations[0].from, rec.migrations[0].to), (1, 2));
    assert!(s.get("/registry/t/ns/migrated").await.is_ok());
    assert_eq!(
        format::ensure_with(s.as_ref(), "b2", &steps, 2)
            .await
            .unwrap(),
        Outcome::Current
    );
    // This build (format 1) refuses what b2 wrote, naming it.
    match format::ensure(s.as_ref(), "b1").await {
        Err(e @ FormatError::Newer { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("format version 2") && msg.contains("b2"),
                "{msg}"
            );
        }
        other => panic!("a newer format is refused: {other:?}"),
    }
    // A store with objects and no record was written before formats were recorded: 0 -> 1.
    s.delete(format::KEY, &Default::default()).await.unwrap();
    match format::ensure(s.as_ref(), "b1").await.unwrap() {
        Outcome::Migrated(m) => assert_eq!((m.len(), m[0].from, m[0].to), (1, 0, 1)),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        format::ensure(s.as_ref(), "b1").await.unwrap(),
        Outcome::Current
    );
}

/// Instantiates the whole conformance suite for one backend: `$harness` is an expression that
/// makes a fresh [`Harness`](crate::Harness) for each test.
#[macro_export]
macro_rules! store_conformance_tests {
    ($harness:expr) => {
        $crate::store_conformance_tests!(@each $harness;
            crud, recent_reads_catch_up, cas_and_preconditions, concurrent_writers, list_pagination_is_consistent,
            list_selectors_and_revisions, raw_lists_match_parsed_lists, watch_replays_later_events_in_order,
            watch_sees_deletes_and_prefixes, watch_selectors, compaction_expires_old_revisions,
            compaction_across_windows_keeps_deletes_deleted, slow_watcher_is_cut_off, bookmarks, reopen_keeps_everything,
            format_is_recorded_migrated_and_refused_when_newer);
    };
    (@each $harness:expr; $($name:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let harness = $harness;
                $crate::conformance::$name(&harness).await;
            }
        )*
    };
}
