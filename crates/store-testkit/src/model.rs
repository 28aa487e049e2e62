//! The [`Store`] trait checked against a model: random sequences of operations (seeded,
//! reproducible, shrunk to a minimal failing sequence by `proptest`) run against a real store
//! and against a plain in-memory model of the semantics the trait documents, side by side.
//!
//! The model is the log of every write the sequence made. From it follow the state at any
//! revision, the expected answer and error of every write (conflict, not found, already
//! exists, failed preconditions), the pages of a list at a revision, and the events a watch
//! from a revision must deliver (selectors included). Compaction raises the revision below
//! which lists, continue tokens and watches must expire and must never change what a read at or
//! after it returns; restarts (close and reopen) and, where the harness can, SIGKILL of a
//! writer process in the middle of concurrent writes must lose nothing acknowledged. Revisions
//! are compared with the store's own: a backend may use revisions for other keys (etcd's
//! fences), so the model checks order, not arithmetic.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use orrery_api::{Object, labels};
use orrery_store::{
    ChangeKind, ListOptions, Preconditions, Revision, Store, StoreError, WatchEvent, WatchOptions,
    WatchStream,
};
use proptest::prelude::*;
use proptest::strategy::Union;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};

use crate::{CrashOp, CrashOutcome, CrashWrite, Harness};

const DIRS: [&str; 2] = ["x", "y"];
/// Names per directory: few, so that writes collide (conflicts, re-creation after deletes).
const NAMES: u8 = 3;
const KEYS: u8 = 2 * NAMES;
/// How long one operation may take before the store is taken to hang.
const STEP_TIMEOUT: Duration = Duration::from_secs(30);
const EVENT_TIMEOUT: Duration = Duration::from_secs(10);

fn key_of(k: u8) -> String {
    format!(
        "/m/{}/k{}",
        DIRS[usize::from(k / NAMES) % DIRS.len()],
        k % NAMES
    )
}

/// The key an object of the model lives under (its namespace is its directory).
fn key_of_object(o: &Object) -> String {
    format!("/m/{}/{}", o.metadata.namespace, o.metadata.name)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum App {
    A,
    B,
}

impl App {
    fn label(self) -> &'static str {
        match self {
            App::A => "a",
            App::B => "b",
        }
    }
}

/// Which keys a list or watch covers.
#[derive(Clone, Copy, Debug)]
pub enum Scope {
    All,
    Dir(u8),
}

impl Scope {
    fn prefix(self) -> String {
        match self {
            Scope::All => "/m/".to_string(),
            Scope::Dir(d) => format!("/m/{}/", DIRS[usize::from(d) % DIRS.len()]),
        }
    }
}

/// A revision to read at, relative to the sequence's writes.
#[derive(Clone, Copy, Debug)]
pub enum At {
    Latest,
    /// The revision of the write this many writes before the latest (or the sequence's start).
    Back(u8),
    /// A revision that has not happened yet.
    Future,
}

#[derive(Clone, Copy, Debug)]
pub enum UpdatePre {
    None,
    /// The key's current revision.
    Current,
    /// Another revision.
    Stale,
}

#[derive(Clone, Copy, Debug)]
pub enum DeletePre {
    None,
    Revision,
    StaleRevision,
    Uid,
    WrongUid,
    Both,
}

#[derive(Clone, Copy, Debug)]
pub enum CrashKind {
    Create,
    Update,
    Delete,
}

/// One operation of a sequence.
#[derive(Clone, Debug)]
pub enum Step {
    Create {
        key: u8,
        app: App,
    },
    Update {
        key: u8,
        app: App,
        pre: UpdatePre,
    },
    Delete {
        key: u8,
        pre: DeletePre,
    },
    Get {
        key: u8,
    },
    /// A whole list, page by page.
    List {
        scope: Scope,
        at: At,
        limit: Option<u8>,
        app: Option<App>,
        raw: bool,
    },
    /// The first page of a list kept open in `slot`; later pages come with [`Step::ListNext`],
    /// with other operations (and compactions, restarts) in between.
    ListFirst {
        slot: u8,
        scope: Scope,
        at: At,
        limit: u8,
        app: Option<App>,
    },
    ListNext {
        slot: u8,
    },
    /// A watch from a past revision, read until it has replayed everything since.
    Watch {
        scope: Scope,
        from: At,
        app: Option<App>,
    },
    Compact {
        at: At,
    },
    /// Wait for the background work of compactions (SQLite's physical clean-up).
    Settle,
    /// Close the store and open it again.
    Restart,
    /// Writes to distinct keys run concurrently by another process, killed with SIGKILL after
    /// `kill_after` answers.
    Crash {
        writes: Vec<(u8, CrashKind, App)>,
        kill_after: u8,
    },
}

impl Step {
    /// Whether the step writes (what a failing sequence's summary counts).
    fn writes(&self) -> bool {
        matches!(
            self,
            Step::Create { .. } | Step::Update { .. } | Step::Delete { .. } | Step::Crash { .. }
        )
    }
}

fn app() -> impl Strategy<Value = App> {
    prop_oneof![Just(App::A), Just(App::B)]
}

fn selector() -> impl Strategy<Value = Option<App>> {
    prop_oneof![2 => Just(None), 1 => app().prop_map(Some)]
}

fn scope() -> impl Strategy<Value = Scope> {
    prop_oneof![2 => Just(Scope::All), 1 => (0u8..2).prop_map(Scope::Dir)]
}

fn at() -> impl Strategy<Value = At> {
    prop_oneof![
        3 => Just(At::Latest),
        6 => (0u8..40).prop_map(At::Back),
        1 => Just(At::Future),
    ]
}

fn past() -> impl Strategy<Value = At> {
    prop_oneof![1 => Just(At::Latest), 4 => (0u8..40).prop_map(At::Back)]
}

/// One random step; crash steps only when the harness can crash a writer process.
pub fn step(crash: bool) -> BoxedStrategy<Step> {
    let key = 0..KEYS;
    let update_pre = prop_oneof![
        2 => Just(UpdatePre::None),
        2 => Just(UpdatePre::Current),
        1 => Just(UpdatePre::Stale)
    ];
    let delete_pre = prop_oneof![
        Just(DeletePre::None),
        Just(DeletePre::Revision),
        Just(DeletePre::StaleRevision),
        Just(DeletePre::Uid),
        Just(DeletePre::WrongUid),
        Just(DeletePre::Both),
    ];
    let mut arms: Vec<(u32, BoxedStrategy<Step>)> = vec![
        (
            6,
            (key.clone(), app())
                .prop_map(|(key, app)| Step::Create { key, app })
                .boxed(),
        ),
        (
            6,
            (key.clone(), app(), update_pre)
                .prop_map(|(key, app, pre)| Step::Update { key, app, pre })
                .boxed(),
        ),
        (
            4,
            (key.clone(), delete_pre)
                .prop_map(|(key, pre)| Step::Delete { key, pre })
                .boxed(),
        ),
        (2, key.prop_map(|key| Step::Get { key }).boxed()),
        (
            2,
            (
                scope(),
                at(),
                proptest::option::of(1u8..5),
                selector(),
                any::<bool>(),
            )
                .prop_map(|(scope, at, limit, app, raw)| Step::List {
                    scope,
                    at,
                    limit,
                    app,
                    raw,
                })
                .boxed(),
        ),
        (
            1,
            (0u8..2, scope(), at(), 1u8..4, selector())
                .prop_map(|(slot, scope, at, limit, app)| Step::ListFirst {
                    slot,
                    scope,
                    at,
                    limit,
                    app,
                })
                .boxed(),
        ),
        (2, (0u8..2).prop_map(|slot| Step::ListNext { slot }).boxed()),
        (
            2,
            (scope(), past(), selector())
                .prop_map(|(scope, from, app)| Step::Watch { scope, from, app })
                .boxed(),
        ),
        (3, at().prop_map(|at| Step::Compact { at }).boxed()),
        (1, Just(Step::Settle).boxed()),
        (1, Just(Step::Restart).boxed()),
    ];
    if crash {
        let kind = prop_oneof![
            Just(CrashKind::Create),
            Just(CrashKind::Update),
            Just(CrashKind::Delete)
        ];
        arms.push((
            1,
            (
                proptest::collection::vec((0..KEYS, kind, app()), 1..8),
                0u8..8,
            )
                .prop_map(|(writes, kill_after)| Step::Crash { writes, kill_after })
                .boxed(),
        ));
    }
    Union::new_weighted(arms).boxed()
}

/// A value an object of the model carries.
#[derive(Clone, Debug, PartialEq)]
struct Value {
    payload: String,
    app: App,
    uid: String,
}

impl Value {
    fn object(&self, key: &str) -> Object {
        let mut parts = key.rsplitn(3, '/');
        let name = parts.next().unwrap_or_default();
        let dir = parts.next().unwrap_or_default();
        let mut o = Object::new("v1", "ConfigMap")
            .with_name(name)
            .with_namespace(dir)
            .with_label("app", self.app.label());
        o.metadata.uid = self.uid.clone();
        o.other.insert(
            "data".into(),
            serde_json::json!({ "payload": self.payload }),
        );
        o
    }
}

/// Whether `o`, read from the store, is `value` of `key` written at `rev`.
fn same(o: &Object, key: &str, rev: Revision, value: &Value) -> Result<(), String> {
    let payload = o.other.get("data").and_then(|d| d.get("payload"));
    let app = o.metadata.labels.get("app").map(String::as_str);
    if key_of_object(o) == key
        && o.revision() == Some(rev)
        && payload.and_then(|p| p.as_str()) == Some(value.payload.as_str())
        && app == Some(value.app.label())
        && o.metadata.uid == value.uid
    {
        Ok(())
    } else {
        Err(format!(
            "expected {key} at revision {rev} with payload {} (app {}, uid {}); got {} at {:?} \
             with payload {payload:?} (app {app:?}, uid {})",
            value.payload,
            value.app.label(),
            value.uid,
            key_of_object(o),
            o.revision(),
            o.metadata.uid
        ))
    }
}

/// One write the model knows of.
#[derive(Clone, Debug)]
struct Entry {
    rev: Revision,
    key: String,
    kind: ChangeKind,
    /// The state written; for a delete, the object's last state.
    value: Value,
    /// The state before (none for a creation).
    prev: Option<Value>,
}

/// An event a watch must deliver.
#[derive(Debug)]
struct Expected {
    kind: &'static str,
    key: String,
    rev: Revision,
    value: Value,
}

impl Expected {
    fn check(&self, ev: &WatchEvent) -> Result<(), String> {
        match ev.object() {
            Some(o) if ev.type_name() == self.kind => same(o, &self.key, self.rev, &self.value),
            _ => Err(format!(
                "expected {} of {} at {}, got {} at {}",
                self.kind,
                self.key,
                self.rev,
                ev.type_name(),
                ev.revision()
            )),
        }
    }
}

#[derive(Debug, Default)]
struct Model {
    /// The store's revision when the sequence started.
    start: Revision,
    log: Vec<Entry>,
    compacted: Revision,
    counter: u64,
}

impl Model {
    fn last(&self) -> Revision {
        self.log.last().map_or(self.start, |e| e.rev)
    }

    fn current(&self, key: &str) -> Option<(Revision, &Value)> {
        let e = self.log.iter().rev().find(|e| e.key == key)?;
        (e.kind != ChangeKind::Delete).then_some((e.rev, &e.value))
    }

    fn state_at(&self, rev: Revision) -> BTreeMap<String, (Revision, Value)> {
        let mut state = BTreeMap::new();
        for e in self.log.iter().take_while(|e| e.rev <= rev) {
            if e.kind == ChangeKind::Delete {
                state.remove(&e.key);
            } else {
                state.insert(e.key.clone(), (e.rev, e.value.clone()));
            }
        }
        state
    }

    fn revision_at(&self, back: u8) -> Revision {
        let back = usize::from(back);
        if back >= self.log.len() {
            self.start
        } else {
            self.log[self.log.len() - 1 - back].rev
        }
    }

    fn fresh(&mut self, app: App) -> Value {
        self.counter += 1;
        Value {
            payload: format!("v{}", self.counter),
            app,
            uid: format!("uid-{}", self.counter),
        }
    }

    fn record(
        &mut self,
        rev: Revision,
        key: &str,
        kind: ChangeKind,
        value: Value,
    ) -> Result<(), String> {
        if rev <= self.last() {
            return Err(format!(
                "write of {key} got revision {rev}, not after the last write's {}",
                self.last()
            ));
        }
        let prev = self.current(key).map(|(_, v)| v.clone());
        self.log.push(Entry {
            rev,
            key: key.to_string(),
            kind,
            value,
            prev,
        });
        Ok(())
    }

    /// What a watch of `prefix` from `from` must deliver (an object that starts or stops
    /// matching the selector arrives as added or deleted).
    fn events(&self, prefix: &str, from: Revision, app: Option<App>) -> Vec<Expected> {
        let matches = |v: &Value| app.is_none_or(|a| v.app == a);
        let mut out = Vec::new();
        for e in self
            .log
            .iter()
            .filter(|e| e.rev > from && e.key.starts_with(prefix))
        {
            let kind = match e.kind {
                ChangeKind::Create => matches(&e.value).then_some("ADDED"),
                ChangeKind::Delete => matches(&e.value).then_some("DELETED"),
                ChangeKind::Update => {
                    match (e.prev.as_ref().is_some_and(matches), matches(&e.value)) {
                        (true, true) => Some("MODIFIED"),
                        (false, true) => Some("ADDED"),
                        (true, false) => Some("DELETED"),
                        (false, false) => None,
                    }
                }
            };
            if let Some(kind) = kind {
                out.push(Expected {
                    kind,
                    key: e.key.clone(),
                    rev: e.rev,
                    value: e.value.clone(),
                });
            }
        }
        out
    }
}

/// A watch kept open over the whole sequence (until a restart), drained after every step.
#[derive(Debug)]
struct Live {
    stream: WatchStream,
    from: Revision,
    got: Vec<WatchEvent>,
    /// How it ended: `Some(None)` cleanly, `Some(Some(e))` with an error.
    ended: Option<Option<StoreError>>,
}

/// A list whose pages are read over several steps.
#[derive(Debug)]
struct Paging {
    prefix: String,
    rev: Revision,
    limit: usize,
    app: Option<App>,
    token: String,
    delivered: usize,
}

struct Run<'a> {
    h: &'a dyn Harness,
    store: Arc<dyn Store>,
    model: Model,
    live: Option<Live>,
    pages: [Option<Paging>; 2],
}

fn selector_of(app: Option<App>) -> labels::Selector {
    match app {
        Some(a) => {
            labels::Selector::parse(&format!("app={}", a.label())).expect("a valid selector")
        }
        None => labels::Selector::default(),
    }
}

fn expect_err(
    what: &str,
    got: Result<impl std::fmt::Debug, StoreError>,
    ok: impl Fn(&StoreError) -> bool,
) -> Result<(), String> {
    match got {
        Err(e) if ok(&e) => Ok(()),
        other => Err(format!("{what}: got {other:?}")),
    }
}

impl Run<'_> {
    async fn step(&mut self, step: &Step) -> Result<(), String> {
        match step {
            Step::Create { key, app } => self.create(&key_of(*key), *app).await,
            Step::Update { key, app, pre } => self.update(&key_of(*key), *app, *pre).await,
            Step::Delete { key, pre } => self.delete(&key_of(*key), *pre).await,
            Step::Get { key } => self.get(&key_of(*key)).await,
            Step::List {
                scope,
                at,
                limit,
                app,
                raw,
            } => {
                self.list(scope.prefix(), *at, limit.map(usize::from), *app, *raw)
                    .await
            }
            Step::ListFirst {
                slot,
                scope,
                at,
                limit,
                app,
            } => {
                self.list_first(usize::from(*slot), scope.prefix(), *at, *limit, *app)
                    .await
            }
            Step::ListNext { slot } => self.list_next(usize::from(*slot)).await,
            Step::Watch { scope, from, app } => self.watch(scope.prefix(), *from, *app).await,
            Step::Compact { at } => self.compact(*at).await,
            Step::Settle => {
                self.h.settle().await;
                Ok(())
            }
            Step::Restart => self.restart().await,
            Step::Crash { writes, kill_after } => self.crash(writes, *kill_after).await,
        }
    }

    async fn create(&mut self, key: &str, app: App) -> Result<(), String> {
        let value = self.model.fresh(app);
        let got = self.store.create(key, value.object(key)).await;
        if self.model.current(key).is_some() {
            return expect_err(&format!("create of existing {key}"), got, |e| {
                matches!(e, StoreError::AlreadyExists { .. })
            });
        }
        let o = got.map_err(|e| format!("create of {key}: {e}"))?;
        let rev = o.revision().unwrap_or_default();
        same(&o, key, rev, &value)?;
        self.model.record(rev, key, ChangeKind::Create, value)
    }

    async fn update(&mut self, key: &str, app: App, pre: UpdatePre) -> Result<(), String> {
        let value = self.model.fresh(app);
        let current = self.model.current(key).map(|(r, _)| r);
        let expected = match pre {
            UpdatePre::None => None,
            UpdatePre::Current => Some(current.unwrap_or(self.model.last())),
            UpdatePre::Stale => Some(current.unwrap_or(self.model.last()) - 1),
        };
        let got = self.store.update(key, value.object(key), expected).await;
        let Some(current) = current else {
            return expect_err(&format!("update of missing {key}"), got, |e| {
                e.is_not_found()
            });
        };
        if let Some(exp) = expected.filter(|e| *e != current) {
            return expect_err(
                &format!("update of {key} expecting {exp}, current {current}"),
                got,
                |e| {
                    matches!(e, StoreError::Conflict { expected, current: c, .. }
                    if *expected == exp && *c == current)
                },
            );
        }
        let o = got.map_err(|e| format!("update of {key}: {e}"))?;
        let rev = o.revision().unwrap_or_default();
        same(&o, key, rev, &value)?;
        self.model.record(rev, key, ChangeKind::Update, value)
    }

    async fn delete(&mut self, key: &str, pre: DeletePre) -> Result<(), String> {
        let current = self
            .model
            .current(key)
            .map(|(r, v)| (r, v.clone()))
            .unwrap_or((
                self.model.last(),
                Value {
                    payload: String::new(),
                    app: App::A,
                    uid: "uid-none".into(),
                },
            ));
        let (rev, uid) = (current.0, current.1.uid.clone());
        let preconditions = match pre {
            DeletePre::None => Preconditions::default(),
            DeletePre::Revision => Preconditions {
                revision: Some(rev),
                uid: None,
            },
            DeletePre::StaleRevision => Preconditions {
                revision: Some(rev - 1),
                uid: None,
            },
            DeletePre::Uid => Preconditions {
                revision: None,
                uid: Some(uid),
            },
            DeletePre::WrongUid => Preconditions {
                revision: None,
                uid: Some("uid-wrong".into()),
            },
            DeletePre::Both => Preconditions {
                revision: Some(rev),
                uid: Some(uid),
            },
        };
        let got = self.store.delete(key, &preconditions).await;
        let Some((rev, last)) = self.model.current(key).map(|(r, v)| (r, v.clone())) else {
            return expect_err(&format!("delete of missing {key}"), got, |e| {
                e.is_not_found()
            });
        };
        if preconditions.revision.is_some_and(|r| r != rev) {
            return expect_err(
                &format!("delete of {key} with a stale revision"),
                got,
                |e| e.is_conflict(),
            );
        }
        if preconditions.uid.as_ref().is_some_and(|u| *u != last.uid) {
            return expect_err(&format!("delete of {key} with a wrong uid"), got, |e| {
                matches!(e, StoreError::PreconditionFailed { .. })
            });
        }
        let o = got.map_err(|e| format!("delete of {key}: {e}"))?;
        let deleted_at = o.revision().unwrap_or_default();
        same(&o, key, deleted_at, &last).map_err(|e| format!("delete answer: {e}"))?;
        self.model.record(deleted_at, key, ChangeKind::Delete, last)
    }

    async fn get(&mut self, key: &str) -> Result<(), String> {
        let got = self.store.get(key).await;
        let shared = self.store.get_shared(key).await;
        match self.model.current(key) {
            None => {
                expect_err(&format!("get of missing {key}"), got, |e| e.is_not_found())?;
                expect_err(&format!("shared get of missing {key}"), shared, |e| {
                    e.is_not_found()
                })
            }
            Some((rev, value)) => {
                let o = got.map_err(|e| format!("get of {key}: {e}"))?;
                same(&o, key, rev, value).map_err(|e| format!("get: {e}"))?;
                let o = shared.map_err(|e| format!("shared get of {key}: {e}"))?;
                same(&o, key, rev, value).map_err(|e| format!("shared get: {e}"))
            }
        }
    }

    /// The revision `at` names, or the error a read there must fail with.
    async fn read_revision(&self, at: At) -> Result<Result<Option<Revision>, StoreError>, String> {
        Ok(match at {
            At::Latest => Ok(None),
            At::Back(n) => {
                let r = self.model.revision_at(n);
                if r < self.model.compacted {
                    Err(StoreError::Expired {
                        requested: r,
                        compacted: self.model.compacted,
                    })
                } else {
                    Ok(Some(r))
                }
            }
            At::Future => {
                let now = self
                    .store
                    .current_revision()
                    .await
                    .map_err(|e| format!("current revision: {e}"))?;
                Err(StoreError::FutureRevision {
                    requested: now + 1000,
                    current: now,
                })
            }
        })
    }

    /// The items of a list of `prefix` at `rev`, in key order.
    fn expected_items(
        &self,
        prefix: &str,
        rev: Revision,
        app: Option<App>,
    ) -> Vec<(String, Revision, Value)> {
        self.model
            .state_at(rev)
            .into_iter()
            .filter(|(k, (_, v))| k.starts_with(prefix) && app.is_none_or(|a| v.app == a))
            .map(|(k, (r, v))| (k, r, v))
            .collect()
    }

    async fn list_page(
        &self,
        prefix: &str,
        opts: &ListOptions,
        raw: bool,
    ) -> Result<(Vec<Object>, Revision, Option<String>), StoreError> {
        if raw {
            let page = self.store.list_raw(prefix, opts).await?;
            let mut items = Vec::new();
            for r in page.items {
                let o: Object = serde_json::from_slice(&r.json)
                    .map_err(|e| StoreError::Corrupt(format!("raw list item: {e}")))?;
                if o.revision() != Some(r.revision) {
                    return Err(StoreError::Corrupt(format!(
                        "raw list item at {} says resourceVersion {:?}",
                        r.revision,
                        o.revision()
                    )));
                }
                items.push(o);
            }
            Ok((items, page.revision, page.continue_token))
        } else {
            let page = self.store.list(prefix, opts).await?;
            Ok((page.items, page.revision, page.continue_token))
        }
    }

    /// Checks one page against the expected items of the whole list, `delivered` of which came
    /// before it; returns how many have been delivered after it.
    fn check_page(
        expected: &[(String, Revision, Value)],
        delivered: usize,
        items: &[Object],
        more: bool,
        limit: Option<usize>,
        filtered: bool,
    ) -> Result<usize, String> {
        let remaining = expected.len().saturating_sub(delivered);
        if let Some(l) = limit
            && items.len() > l
        {
            return Err(format!("a page of limit {l} held {}", items.len()));
        }
        if items.len() > remaining {
            let held: Vec<String> = items
                .iter()
                .map(|o| format!("{}@{}", key_of_object(o), o.metadata.resource_version))
                .collect();
            return Err(format!(
                "a page held {} items where {remaining} remained: {}",
                items.len(),
                held.join(", ")
            ));
        }
        for (i, o) in items.iter().enumerate() {
            let (k, r, v) = &expected[delivered + i];
            same(o, k, *r, v).map_err(|e| format!("item {} of the list: {e}", delivered + i))?;
        }
        let now = delivered + items.len();
        if !more && now != expected.len() {
            return Err(format!(
                "the list ended after {now} of {} items",
                expected.len()
            ));
        }
        // Without selectors a page is full unless it is the last, and only then has no token.
        // With selectors a token may promise more that then does not come (Kubernetes allows it).
        if !filtered {
            let full = limit.map_or(remaining, |l| l.min(remaining));
            let expect_more = limit.is_some_and(|l| remaining > l);
            if items.len() != full || more != expect_more {
                return Err(format!(
                    "a page of limit {limit:?} with {remaining} remaining held {} items, more: {more}",
                    items.len()
                ));
            }
        }
        Ok(now)
    }

    async fn list(
        &mut self,
        prefix: String,
        at: At,
        limit: Option<usize>,
        app: Option<App>,
        raw: bool,
    ) -> Result<(), String> {
        let mut opts = ListOptions {
            labels: selector_of(app),
            limit,
            ..Default::default()
        };
        let rev = match self.read_revision(at).await? {
            Ok(r) => r,
            Err(want) => {
                opts.revision = Some(match want {
                    StoreError::Expired { requested, .. } => requested,
                    StoreError::FutureRevision { requested, .. } => requested,
                    _ => unreachable!("read_revision gives only these"),
                });
                let got = self.list_page(&prefix, &opts, raw).await;
                return expect_err(
                    &format!("list of {prefix} at {:?}", opts.revision),
                    got,
                    |e| std::mem::discriminant(e) == std::mem::discriminant(&want),
                );
            }
        };
        opts.revision = rev;
        let mut delivered = 0;
        let mut expected = None;
        let mut list_rev = None;
        loop {
            let (items, page_rev, token) = self
                .list_page(&prefix, &opts, raw)
                .await
                .map_err(|e| format!("list of {prefix} at {rev:?}: {e}"))?;
            let at = *list_rev.get_or_insert(page_rev);
            if page_rev != at {
                return Err(format!("pages at {at} and {page_rev}"));
            }
            match rev {
                Some(r) if r != at => return Err(format!("a list at {r} answered at {at}")),
                None if at < self.model.last() => {
                    return Err(format!(
                        "a list answered at {at}, before the last write at {}",
                        self.model.last()
                    ));
                }
                _ => {}
            }
            let expected = expected.get_or_insert_with(|| self.expected_items(&prefix, at, app));
            delivered = Self::check_page(
                expected,
                delivered,
                &items,
                token.is_some(),
                limit,
                app.is_some(),
            )
            .map_err(|e| format!("list of {prefix} at {at} (limit {limit:?}, app {app:?}): {e}"))?;
            match token {
                Some(t) => opts.continue_token = Some(t),
                None => return Ok(()),
            }
        }
    }

    async fn list_first(
        &mut self,
        slot: usize,
        prefix: String,
        at: At,
        limit: u8,
        app: Option<App>,
    ) -> Result<(), String> {
        self.pages[slot] = None;
        let limit = usize::from(limit);
        let mut opts = ListOptions {
            labels: selector_of(app),
            limit: Some(limit),
            ..Default::default()
        };
        match self.read_revision(at).await? {
            Ok(r) => opts.revision = r,
            // The error cases are the plain list's; here only pages that follow matter.
            Err(_) => return Ok(()),
        }
        let (items, rev, token) = self
            .list_page(&prefix, &opts, false)
            .await
            .map_err(|e| format!("first page of {prefix}: {e}"))?;
        if opts.revision.is_some_and(|r| r != rev) || rev < self.model.last() && at_latest(at) {
            return Err(format!(
                "first page of {prefix} at {:?} answered at {rev}",
                opts.revision
            ));
        }
        let expected = self.expected_items(&prefix, rev, app);
        let delivered = Self::check_page(
            &expected,
            0,
            &items,
            token.is_some(),
            Some(limit),
            app.is_some(),
        )
        .map_err(|e| format!("first page of {prefix} at {rev}: {e}"))?;
        if let Some(token) = token {
            self.pages[slot] = Some(Paging {
                prefix,
                rev,
                limit,
                app,
                token,
                delivered,
            });
        }
        Ok(())
    }

    async fn list_next(&mut self, slot: usize) -> Result<(), String> {
        let Some(p) = self.pages[slot].take() else {
            return Ok(());
        };
        let opts = ListOptions {
            labels: selector_of(p.app),
            limit: Some(p.limit),
            continue_token: Some(p.token.clone()),
            ..Default::default()
        };
        let got = self.list_page(&p.prefix, &opts, false).await;
        if p.rev < self.model.compacted {
            return expect_err(
                &format!(
                    "continuing a list at {} after compaction to {}",
                    p.rev, self.model.compacted
                ),
                got,
                |e| e.is_expired(),
            );
        }
        let (items, rev, token) =
            got.map_err(|e| format!("next page of {} at {}: {e}", p.prefix, p.rev))?;
        if rev != p.rev {
            return Err(format!("a list at {} continued at {rev}", p.rev));
        }
        let expected = self.expected_items(&p.prefix, p.rev, p.app);
        let delivered = Self::check_page(
            &expected,
            p.delivered,
            &items,
            token.is_some(),
            Some(p.limit),
            p.app.is_some(),
        )
        .map_err(|e| format!("next page of {} at {}: {e}", p.prefix, p.rev))?;
        if let Some(token) = token {
            self.pages[slot] = Some(Paging {
                token,
                delivered,
                ..p
            });
        }
        Ok(())
    }

    async fn watch(&mut self, prefix: String, from: At, app: Option<App>) -> Result<(), String> {
        let from = match from {
            At::Back(n) => self.model.revision_at(n),
            _ => self.model.last(),
        };
        let opts = WatchOptions {
            labels: selector_of(app),
            ..Default::default()
        };
        let stream = self.store.watch(&prefix, from, opts).await;
        if from < self.model.compacted {
            // Refused at once, or ended with the error before any event.
            let what = format!(
                "watch of {prefix} from {from} after compaction to {}",
                self.model.compacted
            );
            return match stream {
                Err(e) if e.is_expired() => Ok(()),
                Err(e) => Err(format!("{what}: {e}")),
                Ok(mut w) => match tokio::time::timeout(EVENT_TIMEOUT, w.next()).await {
                    Ok(Some(Err(e))) if e.is_expired() => Ok(()),
                    other => Err(format!("{what}: got {other:?}")),
                },
            };
        }
        let mut w = stream.map_err(|e| format!("watch of {prefix} from {from}: {e}"))?;
        let expected = self.model.events(&prefix, from, app);
        for (i, exp) in expected.iter().enumerate() {
            let ev = next_event(&mut w).await.map_err(|e| {
                format!(
                    "watch of {prefix} from {from} (app {app:?}), event {i} of {}: {e}",
                    expected.len()
                )
            })?;
            exp.check(&ev).map_err(|e| {
                format!("watch of {prefix} from {from} (app {app:?}), event {i}: {e}")
            })?;
        }
        match tokio::time::timeout(Duration::from_millis(5), w.next()).await {
            Err(_) => Ok(()),
            Ok(extra) => Err(format!(
                "watch of {prefix} from {from} (app {app:?}): an event after all {} expected: {extra:?}",
                expected.len()
            )),
        }
    }

    async fn compact(&mut self, at: At) -> Result<(), String> {
        let target = match at {
            At::Latest => self.model.last(),
            At::Back(n) => self.model.revision_at(n),
            At::Future => {
                let now = self
                    .store
                    .current_revision()
                    .await
                    .map_err(|e| format!("current revision: {e}"))?;
                let got = self.store.compact(now + 1000).await;
                return expect_err("compaction to the future", got, |e| {
                    matches!(e, StoreError::FutureRevision { .. })
                });
            }
        };
        self.store
            .compact(target)
            .await
            .map_err(|e| format!("compaction to {target}: {e}"))?;
        self.model.compacted = self.model.compacted.max(target);
        self.check_compacted().await
    }

    async fn check_compacted(&self) -> Result<(), String> {
        let c = self
            .store
            .compacted_revision()
            .await
            .map_err(|e| format!("compacted revision: {e}"))?;
        // Compacting to revision 1 (the first) removes nothing, and etcd cannot tell it apart
        // from never compacting.
        if c < self.model.compacted && self.model.compacted > 1 {
            return Err(format!(
                "the store says it is compacted to {c}; it was compacted to {}",
                self.model.compacted
            ));
        }
        Ok(())
    }

    async fn open_live(&mut self) -> Result<(), String> {
        let from = self.model.last();
        let stream = self
            .store
            .watch("/m/", from, WatchOptions::default())
            .await
            .map_err(|e| format!("opening the live watch from {from}: {e}"))?;
        self.live = Some(Live {
            stream,
            from,
            got: Vec::new(),
            ended: None,
        });
        Ok(())
    }

    /// Takes in what the live watch has ready.
    async fn drain_live(&mut self) {
        let Some(live) = self.live.as_mut() else {
            return;
        };
        while live.ended.is_none() {
            match tokio::time::timeout(Duration::ZERO, live.stream.next()).await {
                Err(_) => break,
                Ok(Some(Ok(WatchEvent::Bookmark(_)))) => {}
                Ok(Some(Ok(ev))) => live.got.push(ev),
                Ok(Some(Err(e))) => live.ended = Some(Some(e)),
                Ok(None) => live.ended = Some(None),
            }
        }
    }

    /// Reads the live watch up to the last write and checks everything it delivered: every
    /// change in order, once, or a prefix of them ended by an expired error.
    async fn finish_live(&mut self) -> Result<(), String> {
        let Some(mut live) = self.live.take() else {
            return Ok(());
        };
        let expected = self.model.events("/m/", live.from, None);
        while live.ended.is_none() && live.got.len() < expected.len() {
            match tokio::time::timeout(EVENT_TIMEOUT, live.stream.next()).await {
                Err(_) => {
                    return Err(format!(
                        "the live watch from {} stalled after {} of {} events",
                        live.from,
                        live.got.len(),
                        expected.len()
                    ));
                }
                Ok(Some(Ok(WatchEvent::Bookmark(_)))) => {}
                Ok(Some(Ok(ev))) => live.got.push(ev),
                Ok(Some(Err(e))) => live.ended = Some(Some(e)),
                Ok(None) => live.ended = Some(None),
            }
        }
        if live.got.len() > expected.len() {
            return Err(format!(
                "the live watch from {} delivered {} events; {} happened",
                live.from,
                live.got.len(),
                expected.len()
            ));
        }
        for (i, (ev, exp)) in live.got.iter().zip(&expected).enumerate() {
            exp.check(ev)
                .map_err(|e| format!("live watch from {}, event {i}: {e}", live.from))?;
        }
        match live.ended {
            Some(None) => Err(format!(
                "the live watch from {} ended without an error after {} of {} events",
                live.from,
                live.got.len(),
                expected.len()
            )),
            Some(Some(e)) if !e.is_expired() => {
                Err(format!("the live watch from {} failed: {e}", live.from))
            }
            _ => Ok(()),
        }
    }

    async fn restart(&mut self) -> Result<(), String> {
        self.finish_live().await?;
        self.store.close().await;
        self.reopen().await
    }

    async fn reopen(&mut self) -> Result<(), String> {
        self.store = self.h.open().await;
        let now = self
            .store
            .current_revision()
            .await
            .map_err(|e| format!("current revision after reopening: {e}"))?;
        if now < self.model.last() {
            return Err(format!(
                "reopened at revision {now}, before the last write at {}",
                self.model.last()
            ));
        }
        self.check_compacted().await?;
        self.open_live().await
    }

    async fn crash(
        &mut self,
        writes: &[(u8, CrashKind, App)],
        kill_after: u8,
    ) -> Result<(), String> {
        if !self.h.can_crash() {
            return Ok(());
        }
        self.finish_live().await?;
        self.store.close().await;
        // Distinct keys, so that each write's outcome does not depend on the others' order.
        let mut script: Vec<(CrashWrite, Option<Value>)> = Vec::new();
        for (k, kind, app) in writes {
            let key = key_of(*k);
            if script.iter().any(|(w, _)| w.key == key) {
                continue;
            }
            let (op, value) = match kind {
                CrashKind::Create => {
                    let v = self.model.fresh(*app);
                    (CrashOp::Create(v.object(&key)), Some(v))
                }
                CrashKind::Update => {
                    let v = self.model.fresh(*app);
                    (CrashOp::Update(v.object(&key)), Some(v))
                }
                CrashKind::Delete => (CrashOp::Delete, None),
            };
            script.push((CrashWrite { key, op }, value));
        }
        let writes: Vec<CrashWrite> = script.iter().map(|(w, _)| w.clone()).collect();
        let answers = self.h.crash(&writes, usize::from(kill_after)).await;
        let before = self.model.last();
        // What each write must do, given the state before: write, or fail as it says.
        let outcome = |w: &CrashWrite, model: &Model| -> CrashOutcome {
            let live = model.current(&w.key).is_some();
            match (&w.op, live) {
                (CrashOp::Create(_), true) => CrashOutcome::AlreadyExists,
                (CrashOp::Create(_), false) => CrashOutcome::Written(0),
                (_, true) => CrashOutcome::Written(0),
                (_, false) => CrashOutcome::NotFound,
            }
        };
        let mut acked: BTreeMap<usize, Revision> = BTreeMap::new();
        for (i, answer) in &answers {
            let w = &writes[*i];
            let want = outcome(w, &self.model);
            match (answer, &want) {
                (CrashOutcome::Written(rev), CrashOutcome::Written(_)) => {
                    acked.insert(*i, *rev);
                }
                (a, b) if a == b => {}
                (a, b) => {
                    return Err(format!(
                        "crash writer: {:?} of {} answered {a:?}, expected {b:?}",
                        w.op, w.key
                    ));
                }
            }
        }
        self.store = self.h.open().await;
        let now = self
            .store
            .current_revision()
            .await
            .map_err(|e| format!("current revision after the crash: {e}"))?;
        // What happened, in order: every change since the crash began.
        let mut w = self
            .store
            .watch("/m/", before, WatchOptions::default())
            .await
            .map_err(|e| format!("watch of the crash's writes from {before}: {e}"))?;
        let mut seen = vec![false; writes.len()];
        let mut last = before;
        while last < now {
            let ev =
                match tokio::time::timeout(Duration::from_millis(500), next_event(&mut w)).await {
                    Ok(ev) => ev?,
                    // Revisions after the last change may belong to no key of ours.
                    Err(_) => break,
                };
            last = ev.revision();
            let o = ev.object().ok_or("a watch event without an object")?;
            let key = key_of_object(o);
            let i = writes
                .iter()
                .position(|w| w.key == key)
                .ok_or_else(|| format!("a change of {key} at {last} that no crash write made"))?;
            if std::mem::replace(&mut seen[i], true) {
                return Err(format!("crash write {i} on {key} happened twice"));
            }
            if outcome(&writes[i], &self.model) != CrashOutcome::Written(0) {
                return Err(format!(
                    "crash write {:?} of {key} should have failed but is stored at {last}",
                    writes[i].op
                ));
            }
            if let Some(rev) = acked.get(&i)
                && *rev != last
            {
                return Err(format!(
                    "crash write on {key} was acknowledged at {rev}, stored at {last}"
                ));
            }
            let (kind, type_name, value) = match (&writes[i].op, &script[i].1) {
                (CrashOp::Create(_), Some(v)) => (ChangeKind::Create, "ADDED", v.clone()),
                (CrashOp::Update(_), Some(v)) => (ChangeKind::Update, "MODIFIED", v.clone()),
                _ => (
                    ChangeKind::Delete,
                    "DELETED",
                    self.model
                        .current(&key)
                        .map(|(_, v)| v.clone())
                        .ok_or("a delete of a missing key")?,
                ),
            };
            Expected {
                kind: type_name,
                key: key.clone(),
                rev: last,
                value: value.clone(),
            }
            .check(&ev)?;
            self.model.record(last, &key, kind, value)?;
        }
        for i in acked.keys() {
            if !seen[*i] {
                return Err(format!(
                    "crash write {:?} of {} was acknowledged at {} and is lost",
                    writes[*i].op, writes[*i].key, acked[i]
                ));
            }
        }
        self.check_compacted().await?;
        self.open_live().await
    }

    /// The end of a sequence: the live watch and the whole current state.
    async fn finish(&mut self) -> Result<(), String> {
        self.finish_live().await?;
        self.list("/m/".into(), At::Latest, None, None, false).await
    }
}

fn at_latest(at: At) -> bool {
    matches!(at, At::Latest)
}

async fn next_event(w: &mut WatchStream) -> Result<WatchEvent, String> {
    loop {
        match tokio::time::timeout(EVENT_TIMEOUT, w.next()).await {
            Err(_) => return Err("no event within the timeout".into()),
            Ok(None) => return Err("the watch ended".into()),
            Ok(Some(Err(e))) => return Err(format!("the watch failed: {e}")),
            Ok(Some(Ok(WatchEvent::Bookmark(_)))) => {}
            Ok(Some(Ok(ev))) => return Ok(ev),
        }
    }
}

/// Runs one sequence against a fresh store from `h` and the model; the error names the step.
pub async fn run(h: &dyn Harness, steps: &[Step]) -> Result<(), String> {
    let store = h.open().await;
    let start = store
        .current_revision()
        .await
        .map_err(|e| format!("current revision: {e}"))?;
    let compacted = store
        .compacted_revision()
        .await
        .map_err(|e| format!("compacted revision: {e}"))?;
    let mut run = Run {
        h,
        store,
        model: Model {
            start,
            compacted,
            ..Model::default()
        },
        live: None,
        pages: [None, None],
    };
    let result = async {
        run.open_live().await?;
        for (i, step) in steps.iter().enumerate() {
            match tokio::time::timeout(STEP_TIMEOUT, run.step(step)).await {
                Ok(r) => r.map_err(|e| format!("step {i} ({step:?}): {e}"))?,
                Err(_) => return Err(format!("step {i} ({step:?}) hung")),
            }
            run.drain_live().await;
        }
        run.finish().await.map_err(|e| format!("at the end: {e}"))
    }
    .await;
    run.store.close().await;
    result
}

/// Settings of one model test.
#[derive(Clone, Debug)]
pub struct ModelTest {
    pub name: &'static str,
    /// Sequences to run (`ORRERY_MODEL_CASES` overrides).
    pub cases: u32,
    /// The longest sequence.
    pub max_steps: usize,
    /// Include crash steps (the harness must support them).
    pub crash: bool,
}

/// Runs `test.cases` random sequences, each against a fresh harness from `make` (given the
/// case's number), on one runtime. The seed comes from `ORRERY_MODEL_SEED` or the clock and is
/// printed, so a failure can be run again; a failing sequence is shrunk to a minimal one and
/// printed with the seed and the error.
pub fn check<H, F>(test: ModelTest, make: F)
where
    H: Harness + 'static,
    F: Fn(u64) -> H,
{
    let seed: u64 = match std::env::var("ORRERY_MODEL_SEED") {
        Ok(s) => s.parse().expect("ORRERY_MODEL_SEED is a number"),
        Err(_) => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or_default();
            nanos ^ (u64::from(std::process::id()) << 32)
        }
    };
    let cases = std::env::var("ORRERY_MODEL_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(test.cases);
    eprintln!(
        "model test {}: {cases} sequences of up to {} steps, seed {seed} (ORRERY_MODEL_SEED={seed} runs it again)",
        test.name, test.max_steps
    );
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let config = Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 4096,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime for the model test");
    let sequences = proptest::collection::vec(step(test.crash), 1..test.max_steps);
    let counter = std::sync::atomic::AtomicU64::new(0);
    let first_failure = parking_lot::Mutex::new(None::<usize>);
    let result = runner.run(&sequences, |steps| {
        let n = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let h = make(n);
        let outcome = rt.block_on(run(&h, &steps));
        if outcome.is_err() {
            first_failure.lock().get_or_insert(steps.len());
        }
        outcome.map_err(TestCaseError::fail)
    });
    match result {
        Ok(()) => {}
        Err(TestError::Fail(reason, steps)) => {
            let mut listing = String::new();
            for (i, s) in steps.iter().enumerate() {
                let _ = writeln!(listing, "  {i:3}: {s:?}");
            }
            panic!(
                "model test {} failed (seed {seed}; ORRERY_MODEL_SEED={seed} runs it again).\n\
                 The first failing sequence had {} steps; shrunk to {} steps ({} writes):\n{listing}{reason}",
                test.name,
                first_failure.lock().unwrap_or_default(),
                steps.len(),
                steps.iter().filter(|s| s.writes()).count(),
            )
        }
        Err(TestError::Abort(reason)) => {
            panic!("model test {} aborted (seed {seed}): {reason}", test.name)
        }
    }
}
