//! The Kubernetes API against a model of what it stores: random sequences (seeded, printed on
//! failure) of creates, updates with and without a resourceVersion, merge patches, JSON patches
//! guarded by a `test` of the resourceVersion, deletes with uid and resourceVersion
//! preconditions, gets, lists at exact revisions page by page, and watches from past
//! revisions, through the `kube` crate against a real `orrery server` that compacts its history
//! every 400 ms and is killed (SIGKILL) or stopped and started again now and then. A watch that
//! breaks resumes from the last revision it saw, as an informer does.
//!
//! Every answer is checked against the model: the same objects, revisions, uids and errors; a
//! deleted object never comes back; a watch delivers every change once, in order. The only
//! freedom the server has is compaction's timing, so a 410 Gone is accepted for a revision
//! only if the server's compactor could have removed it by then: it compacts to the revision
//! it read one interval earlier, which is no newer than any revision written since.
//! This covers the caches above the store (the point-read cache, the watch cache) as well.

use crate::common;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::pin::Pin;
use std::time::{Duration, Instant};

use common::Server;
use futures_util::{Stream, StreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions, VersionMatch,
    WatchEvent, WatchParams,
};
use proptest::prelude::*;
use proptest::strategy::Union;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};

const INTERVAL: Duration = Duration::from_millis(400);
/// How long after its tick the compactor may take to read the revision it will compact to.
const SLACK: Duration = Duration::from_millis(300);
const NAMES: u8 = 4;
const WAIT: Duration = Duration::from_secs(20);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum App {
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

#[derive(Clone, Copy, Debug)]
enum Guard {
    None,
    Current,
    Stale,
}

#[derive(Clone, Copy, Debug)]
enum DeletePre {
    None,
    Uid,
    WrongUid,
    Revision,
    StaleRevision,
}

#[derive(Clone, Debug)]
enum Op {
    Create {
        k: u8,
        app: App,
    },
    Replace {
        k: u8,
        app: App,
        guard: Guard,
    },
    MergePatch {
        k: u8,
        app: App,
    },
    JsonPatch {
        k: u8,
        app: App,
        guard: Guard,
    },
    Delete {
        k: u8,
        pre: DeletePre,
    },
    Get {
        k: u8,
    },
    /// All pages, at the latest revision or exactly at the one `back` writes ago.
    List {
        back: Option<u8>,
        limit: Option<u8>,
        app: Option<App>,
    },
    /// A watch from the revision `back` writes ago, read until it has caught up.
    Watch {
        back: u8,
        app: Option<App>,
    },
    /// Time for the compactor to run.
    Sleep,
    Restart {
        kill: bool,
    },
}

fn op() -> BoxedStrategy<Op> {
    let k = 0..NAMES;
    let app = || prop_oneof![Just(App::A), Just(App::B)];
    let guard = || prop_oneof![Just(Guard::None), Just(Guard::Current), Just(Guard::Stale)];
    let select = || proptest::option::of(app());
    let pre = prop_oneof![
        Just(DeletePre::None),
        Just(DeletePre::Uid),
        Just(DeletePre::WrongUid),
        Just(DeletePre::Revision),
        Just(DeletePre::StaleRevision),
    ];
    Union::new_weighted(vec![
        (
            6,
            (k.clone(), app())
                .prop_map(|(k, app)| Op::Create { k, app })
                .boxed(),
        ),
        (
            3,
            (k.clone(), app(), guard())
                .prop_map(|(k, app, guard)| Op::Replace { k, app, guard })
                .boxed(),
        ),
        (
            2,
            (k.clone(), app())
                .prop_map(|(k, app)| Op::MergePatch { k, app })
                .boxed(),
        ),
        (
            2,
            (k.clone(), app(), guard())
                .prop_map(|(k, app, guard)| Op::JsonPatch { k, app, guard })
                .boxed(),
        ),
        (
            5,
            (k.clone(), pre)
                .prop_map(|(k, pre)| Op::Delete { k, pre })
                .boxed(),
        ),
        (3, k.prop_map(|k| Op::Get { k }).boxed()),
        (
            3,
            (
                proptest::option::of(0u8..30),
                proptest::option::of(1u8..4),
                select(),
            )
                .prop_map(|(back, limit, app)| Op::List { back, limit, app })
                .boxed(),
        ),
        (
            2,
            (0u8..30, select())
                .prop_map(|(back, app)| Op::Watch { back, app })
                .boxed(),
        ),
        // Compaction passes between writes are what bring deleted objects back if the
        // compactor is wrong: with less time for it, few sequences reach two passes.
        (5, Just(Op::Sleep).boxed()),
    ])
    .boxed()
}

/// A sequence: the operations, with a server restart now and then.
fn sequence() -> impl Strategy<Value = Vec<Op>> {
    proptest::collection::vec(
        prop_oneof![
            40 => op(),
            1 => any::<bool>().prop_map(|kill| Op::Restart { kill }),
        ],
        1..50,
    )
}

#[derive(Clone, Debug, PartialEq)]
struct Value {
    payload: String,
    app: App,
    uid: String,
}

#[derive(Clone, Debug)]
struct Entry {
    rev: i64,
    name: String,
    /// ADDED, MODIFIED or DELETED.
    kind: &'static str,
    value: Value,
    prev: Option<Value>,
}

fn rv(cm: &ConfigMap) -> i64 {
    cm.metadata
        .resource_version
        .as_deref()
        .and_then(|r| r.parse().ok())
        .unwrap_or(-1)
}

/// Whether `cm` is `value` of `name` at `rev`.
fn same(cm: &ConfigMap, name: &str, rev: i64, value: &Value) -> Result<(), String> {
    let payload = cm.data.as_ref().and_then(|d| d.get("payload")).cloned();
    let app = cm
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("app"))
        .cloned();
    let ok = cm.metadata.name.as_deref() == Some(name)
        && rv(cm) == rev
        && payload.as_deref() == Some(value.payload.as_str())
        && app.as_deref() == Some(value.app.label())
        && cm.metadata.uid.as_deref() == Some(value.uid.as_str());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "expected {name} at {rev} with {} (app {}, uid {}), got {:?} at {} with {payload:?} \
             (app {app:?}, uid {:?})",
            value.payload,
            value.app.label(),
            value.uid,
            cm.metadata.name,
            rv(cm),
            cm.metadata.uid
        ))
    }
}

type Events = Pin<Box<dyn Stream<Item = kube::Result<WatchEvent<ConfigMap>>> + Send>>;

/// The watch kept open over the sequence, resumed when it breaks.
struct Live {
    stream: Option<Events>,
    /// The revision it has delivered everything up to.
    at: i64,
    /// Events since the last (re)start, to check.
    got: Vec<ConfigMap>,
    kinds: Vec<&'static str>,
}

struct Run<'a> {
    server: &'a mut Server,
    client: kube::Client,
    api: Api<ConfigMap>,
    case: u64,
    log: Vec<Entry>,
    start: i64,
    counter: u64,
    /// (when the request started, a revision current at its answer): bounds what the
    /// compactor may have removed.
    timeline: Vec<(Instant, i64)>,
    live: Live,
}

fn code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

fn expect_code<T: std::fmt::Debug>(
    what: &str,
    got: kube::Result<T>,
    codes: &[u16],
) -> Result<(), String> {
    match got {
        Err(e) if code(&e).is_some_and(|c| codes.contains(&c)) => Ok(()),
        other => Err(format!("{what}: expected {codes:?}, got {other:?}")),
    }
}

impl Run<'_> {
    fn name(&self, k: u8) -> String {
        format!("c{}-k{k}", self.case)
    }

    fn selector(&self, app: Option<App>) -> String {
        match app {
            Some(a) => format!("case=c{},app={}", self.case, a.label()),
            None => format!("case=c{}", self.case),
        }
    }

    fn last(&self) -> i64 {
        self.log.last().map_or(self.start, |e| e.rev)
    }

    fn current(&self, name: &str) -> Option<(i64, Value)> {
        let e = self.log.iter().rev().find(|e| e.name == name)?;
        (e.kind != "DELETED").then(|| (e.rev, e.value.clone()))
    }

    fn state_at(&self, rev: i64) -> BTreeMap<String, (i64, Value)> {
        let mut state = BTreeMap::new();
        for e in self.log.iter().take_while(|e| e.rev <= rev) {
            if e.kind == "DELETED" {
                state.remove(&e.name);
            } else {
                state.insert(e.name.clone(), (e.rev, e.value.clone()));
            }
        }
        state
    }

    fn back(&self, n: u8) -> i64 {
        let n = usize::from(n);
        if n >= self.log.len() {
            self.start
        } else {
            self.log[self.log.len() - 1 - n].rev
        }
    }

    fn fresh(&mut self, app: App, uid: &str) -> Value {
        self.counter += 1;
        Value {
            payload: format!("v{}", self.counter),
            app,
            uid: uid.to_string(),
        }
    }

    fn object(&self, name: &str, v: &Value, rv: Option<i64>) -> ConfigMap {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": name,
                "labels": {"case": format!("c{}", self.case), "app": v.app.label()},
                "resourceVersion": rv.map(|r| r.to_string()),
            },
            "data": {"payload": v.payload},
        }))
        .unwrap()
    }

    fn record(
        &mut self,
        started: Instant,
        rev: i64,
        name: &str,
        kind: &'static str,
        value: Value,
    ) -> Result<(), String> {
        if rev <= self.last() {
            return Err(format!(
                "a write of {name} got revision {rev}, not after {}",
                self.last()
            ));
        }
        let prev = self.current(name).map(|(_, v)| v);
        self.log.push(Entry {
            rev,
            name: name.to_string(),
            kind,
            value,
            prev,
        });
        self.timeline.push((started, rev));
        Ok(())
    }

    /// Whether the compactor may have removed revision `r` by the time a request started at
    /// `started` was served.
    fn may_be_gone(&self, r: i64, started: Instant) -> bool {
        // The compactor's revision was read no later than `started - INTERVAL + SLACK`, and is
        // no newer than any revision written by a request that started after that.
        let read_by = started.checked_sub(INTERVAL - SLACK).unwrap_or(started);
        self.timeline
            .iter()
            .filter(|(t, _)| *t >= read_by)
            .map(|(_, rev)| *rev)
            .min()
            .is_none_or(|bound| r < bound)
    }

    fn events(&self, from: i64, app: Option<App>) -> Vec<(&'static str, Entry)> {
        let matches = |v: &Value| app.is_none_or(|a| v.app == a);
        self.log
            .iter()
            .filter(|e| e.rev > from)
            .filter_map(|e| {
                let kind = match e.kind {
                    "MODIFIED" => match (e.prev.as_ref().is_some_and(matches), matches(&e.value)) {
                        (true, true) => Some("MODIFIED"),
                        (false, true) => Some("ADDED"),
                        (true, false) => Some("DELETED"),
                        (false, false) => None,
                    },
                    k => matches(&e.value).then_some(k),
                };
                kind.map(|k| (k, e.clone()))
            })
            .collect()
    }

    async fn step(&mut self, op: &Op) -> Result<(), String> {
        let started = Instant::now();
        match op {
            Op::Create { k, app } => {
                let name = self.name(*k);
                let mut value = self.fresh(*app, "");
                let got = self
                    .api
                    .create(&PostParams::default(), &self.object(&name, &value, None))
                    .await;
                if self.current(&name).is_some() {
                    return expect_code(&format!("create of existing {name}"), got, &[409]);
                }
                let cm = got.map_err(|e| format!("create of {name}: {e}"))?;
                value.uid = cm.metadata.uid.clone().unwrap_or_default();
                same(&cm, &name, rv(&cm), &value)?;
                self.record(started, rv(&cm), &name, "ADDED", value)
            }
            Op::Replace { k, app, guard } => {
                let name = self.name(*k);
                let current = self.current(&name);
                let uid = current
                    .as_ref()
                    .map(|c| c.1.uid.clone())
                    .unwrap_or_default();
                let value = self.fresh(*app, &uid);
                let at = current.as_ref().map_or(self.last(), |c| c.0);
                let given = match guard {
                    Guard::None => None,
                    Guard::Current => Some(at),
                    Guard::Stale => Some(at - 1),
                };
                let got = self
                    .api
                    .replace(
                        &name,
                        &PostParams::default(),
                        &self.object(&name, &value, given),
                    )
                    .await;
                self.written(started, &name, current, given, value, got, "replace")
            }
            Op::MergePatch { k, app } => {
                let name = self.name(*k);
                let current = self.current(&name);
                let uid = current
                    .as_ref()
                    .map(|c| c.1.uid.clone())
                    .unwrap_or_default();
                let value = self.fresh(*app, &uid);
                let patch = serde_json::json!({
                    "metadata": {"labels": {"app": value.app.label()}},
                    "data": {"payload": value.payload},
                });
                let got = self
                    .api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await;
                self.written(started, &name, current, None, value, got, "merge patch")
            }
            Op::JsonPatch { k, app, guard } => {
                let name = self.name(*k);
                let current = self.current(&name);
                let uid = current
                    .as_ref()
                    .map(|c| c.1.uid.clone())
                    .unwrap_or_default();
                let value = self.fresh(*app, &uid);
                let at = current.as_ref().map_or(self.last(), |c| c.0);
                let given = match guard {
                    Guard::None => None,
                    Guard::Current => Some(at),
                    Guard::Stale => Some(at - 1),
                };
                let mut ops = Vec::new();
                if let Some(r) = given {
                    ops.push(serde_json::json!({"op": "test", "path": "/metadata/resourceVersion", "value": r.to_string()}));
                }
                ops.push(serde_json::json!({"op": "replace", "path": "/data/payload", "value": value.payload}));
                ops.push(serde_json::json!({"op": "replace", "path": "/metadata/labels/app", "value": value.app.label()}));
                let req =
                    http::Request::patch(format!("/api/v1/namespaces/default/configmaps/{name}"))
                        .header("content-type", "application/json-patch+json")
                        .body(serde_json::to_vec(&ops).unwrap())
                        .unwrap();
                let got: kube::Result<ConfigMap> = self.client.request(req).await;
                // A failed `test` is an invalid patch (422, as kube-apiserver answers and kopf
                // retries on), not a conflict.
                if let (Some(c), Some(g)) = (&current, given)
                    && c.0 != g
                {
                    return expect_code(&format!("guarded JSON patch of {name}"), got, &[422]);
                }
                self.written(started, &name, current, None, value, got, "JSON patch")
            }
            Op::Delete { k, pre } => self.delete(started, &self.name(*k), *pre).await,
            Op::Get { k } => {
                let name = self.name(*k);
                let got = self.api.get(&name).await;
                match self.current(&name) {
                    None => expect_code(&format!("get of deleted {name}"), got, &[404]),
                    Some((rev, value)) => {
                        let cm = got.map_err(|e| format!("get of {name}: {e}"))?;
                        same(&cm, &name, rev, &value).map_err(|e| format!("get: {e}"))
                    }
                }
            }
            Op::List { back, limit, app } => self
                .list(
                    started,
                    back.map(|b| self.back(b)),
                    limit.map(u32::from),
                    *app,
                )
                .await
                .map(|_| ()),
            Op::Watch { back, app } => self.watch(started, self.back(*back), *app).await,
            Op::Sleep => {
                tokio::time::sleep(INTERVAL + Duration::from_millis(100)).await;
                Ok(())
            }
            Op::Restart { kill } => {
                self.catch_up().await?;
                if *kill {
                    self.server.kill9();
                } else {
                    assert!(
                        self.server.terminate(),
                        "the server stops cleanly on SIGTERM"
                    );
                }
                self.server.restart();
                self.client = self.server.client().await;
                self.api = Api::namespaced(self.client.clone(), "default");
                Ok(())
            }
        }
    }

    /// Checks the answer to a write of `name` that must succeed unless the object is missing or
    /// `given` is not its revision.
    #[allow(clippy::too_many_arguments)]
    fn written(
        &mut self,
        started: Instant,
        name: &str,
        current: Option<(i64, Value)>,
        given: Option<i64>,
        value: Value,
        got: kube::Result<ConfigMap>,
        what: &str,
    ) -> Result<(), String> {
        let Some((at, _)) = current else {
            return expect_code(&format!("{what} of deleted {name}"), got, &[404]);
        };
        if given.is_some_and(|g| g != at) {
            return expect_code(
                &format!("{what} of {name} at a stale revision"),
                got,
                &[409],
            );
        }
        let cm = got.map_err(|e| format!("{what} of {name}: {e}"))?;
        same(&cm, name, rv(&cm), &value).map_err(|e| format!("{what}: {e}"))?;
        self.record(started, rv(&cm), name, "MODIFIED", value)
    }

    async fn delete(&mut self, started: Instant, name: &str, pre: DeletePre) -> Result<(), String> {
        let current = self.current(name);
        let (at, uid) = current
            .as_ref()
            .map_or((self.last(), String::new()), |c| (c.0, c.1.uid.clone()));
        let preconditions = match pre {
            DeletePre::None => None,
            DeletePre::Uid => Some(Preconditions {
                uid: Some(uid.clone()),
                resource_version: None,
            }),
            DeletePre::WrongUid => Some(Preconditions {
                uid: Some("00000000-0000-0000-0000-000000000000".into()),
                resource_version: None,
            }),
            DeletePre::Revision => Some(Preconditions {
                uid: None,
                resource_version: Some(at.to_string()),
            }),
            DeletePre::StaleRevision => Some(Preconditions {
                uid: None,
                resource_version: Some((at - 1).to_string()),
            }),
        };
        let params = DeleteParams {
            preconditions,
            ..Default::default()
        };
        let got = self.api.delete(name, &params).await;
        let Some((_, last)) = current else {
            return expect_code(&format!("delete of deleted {name}"), got, &[404]);
        };
        if matches!(pre, DeletePre::WrongUid | DeletePre::StaleRevision) {
            return expect_code(
                &format!("delete of {name} with a failing precondition"),
                got,
                &[409],
            );
        }
        let answer = got.map_err(|e| format!("delete of {name}: {e}"))?;
        let cm = answer
            .left()
            .ok_or_else(|| format!("delete of {name} answered a Status, not the object"))?;
        // The answer is the object's last state at the delete's revision.
        same(&cm, name, rv(&cm), &last).map_err(|e| format!("delete: {e}"))?;
        self.record(started, rv(&cm), name, "DELETED", last)
    }

    /// Lists every page; returns the list's revision, or `None` after an accepted 410.
    async fn list(
        &mut self,
        started: Instant,
        at: Option<i64>,
        limit: Option<u32>,
        app: Option<App>,
    ) -> Result<Option<i64>, String> {
        let mut params = ListParams {
            label_selector: Some(self.selector(app)),
            limit,
            ..Default::default()
        };
        if let Some(r) = at {
            params.resource_version = Some(r.to_string());
            params.version_match = Some(VersionMatch::Exact);
        }
        let mut delivered: Vec<ConfigMap> = Vec::new();
        let mut list_rev = None;
        loop {
            let page = match self.api.list(&params).await {
                Err(e)
                    if code(&e) == Some(410)
                        && at.is_some_and(|r| self.may_be_gone(r, started)) =>
                {
                    return Ok(None);
                }
                other => other.map_err(|e| format!("list at {at:?}: {e}"))?,
            };
            let page_rev: i64 = page
                .metadata
                .resource_version
                .as_deref()
                .and_then(|r| r.parse().ok())
                .ok_or("a list without a resourceVersion")?;
            if *list_rev.get_or_insert(page_rev) != page_rev {
                return Err(format!("pages at {list_rev:?} and {page_rev}"));
            }
            if limit.is_some_and(|l| page.items.len() > l as usize) {
                return Err(format!(
                    "a page of limit {limit:?} held {}",
                    page.items.len()
                ));
            }
            delivered.extend(page.items);
            match page.metadata.continue_ {
                Some(t) if !t.is_empty() => {
                    params.continue_token = Some(t);
                    params.resource_version = None;
                    params.version_match = None;
                }
                _ => break,
            }
        }
        let rev = list_rev.unwrap_or_default();
        match at {
            Some(r) if r != rev => return Err(format!("a list at {r} answered at {rev}")),
            None if rev < self.last() => {
                return Err(format!(
                    "a list answered at {rev}, before the last write at {}",
                    self.last()
                ));
            }
            None => self.timeline.push((started, rev)),
            _ => {}
        }
        let expected: Vec<(String, (i64, Value))> = self
            .state_at(rev)
            .into_iter()
            .filter(|(_, (_, v))| app.is_none_or(|a| v.app == a))
            .collect();
        if delivered.len() != expected.len() {
            let got: Vec<_> = delivered
                .iter()
                .map(|c| format!("{}@{}", c.metadata.name.clone().unwrap_or_default(), rv(c)))
                .collect();
            let want: Vec<_> = expected
                .iter()
                .map(|(n, (r, _))| format!("{n}@{r}"))
                .collect();
            return Err(format!(
                "list at {rev} ({app:?}): got {got:?}, expected {want:?}"
            ));
        }
        for (cm, (name, (r, v))) in delivered.iter().zip(&expected) {
            same(cm, name, *r, v).map_err(|e| format!("list at {rev}: {e}"))?;
        }
        Ok(Some(rev))
    }

    async fn open(&self, from: i64, app: Option<App>) -> kube::Result<Events> {
        let params = WatchParams {
            label_selector: Some(self.selector(app)),
            ..Default::default()
        };
        Ok(self.api.watch(&params, &from.to_string()).await?.boxed())
    }

    async fn watch(&mut self, started: Instant, from: i64, app: Option<App>) -> Result<(), String> {
        let expected = self.events(from, app);
        let mut stream = self
            .open(from, app)
            .await
            .map_err(|e| format!("watch from {from}: {e}"))?;
        for (i, (kind, e)) in expected.iter().enumerate() {
            let ev = tokio::time::timeout(WAIT, stream.next())
                .await
                .map_err(|_| format!("watch from {from}: no event {i} of {}", expected.len()))?;
            let (got_kind, cm) = match ev {
                Some(Ok(WatchEvent::Added(c))) => ("ADDED", c),
                Some(Ok(WatchEvent::Modified(c))) => ("MODIFIED", c),
                Some(Ok(WatchEvent::Deleted(c))) => ("DELETED", c),
                Some(Ok(WatchEvent::Error(s)))
                    if s.code == 410 && i == 0 && self.may_be_gone(from, started) =>
                {
                    return Ok(());
                }
                other => return Err(format!("watch from {from}, event {i}: {other:?}")),
            };
            if got_kind != *kind {
                return Err(format!(
                    "watch from {from}, event {i}: {got_kind}, expected {kind} of {}",
                    e.name
                ));
            }
            same(&cm, &e.name, e.rev, &e.value)
                .map_err(|err| format!("watch from {from}, event {i}: {err}"))?;
        }
        if expected.is_empty() && from < self.last() {
            // Nothing to read, but a gone revision must still be refused.
            if let Ok(Some(Ok(WatchEvent::Error(s)))) =
                tokio::time::timeout(Duration::from_millis(20), stream.next()).await
                && !(s.code == 410 && self.may_be_gone(from, started))
            {
                return Err(format!("watch from {from}: {s:?}"));
            }
        }
        Ok(())
    }

    /// Takes in what the live watch has ready (with `wait`, everything up to the last write),
    /// resuming it where it broke, and checks it.
    async fn drain(&mut self, wait: bool) -> Result<(), String> {
        loop {
            self.check_live()?;
            if self.live.at >= self.last() {
                return Ok(());
            }
            if self.live.stream.is_none() {
                match self.open(self.live.at, None).await {
                    Ok(s) => self.live.stream = Some(s),
                    // The server is starting again.
                    Err(_) if wait => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                    Err(_) => return Ok(()),
                }
            }
            let started = Instant::now();
            let stream = self.live.stream.as_mut().unwrap();
            let next = if wait {
                tokio::time::timeout(WAIT, stream.next())
                    .await
                    .map_err(|_| {
                        format!(
                            "the live watch from {} stalled before {}",
                            self.live.at,
                            self.last()
                        )
                    })?
            } else {
                match tokio::time::timeout(Duration::ZERO, stream.next()).await {
                    Ok(n) => n,
                    Err(_) => return Ok(()),
                }
            };
            match next {
                Some(Ok(WatchEvent::Added(c))) => self.live_event("ADDED", c),
                Some(Ok(WatchEvent::Modified(c))) => self.live_event("MODIFIED", c),
                Some(Ok(WatchEvent::Deleted(c))) => self.live_event("DELETED", c),
                Some(Ok(WatchEvent::Bookmark(_))) => {}
                Some(Ok(WatchEvent::Error(s))) if s.code == 410 => {
                    if !self.may_be_gone(self.live.at, started) {
                        return Err(format!(
                            "the live watch resumed at {} got 410 Gone too early",
                            self.live.at
                        ));
                    }
                    // As an informer does: list again and watch from the list.
                    let rev = loop {
                        if let Some(r) = self.list(Instant::now(), None, None, None).await? {
                            break r;
                        }
                    };
                    self.live.at = rev;
                    self.live.stream = None;
                }
                Some(Ok(WatchEvent::Error(s))) => {
                    return Err(format!("the live watch failed: {s:?}"));
                }
                // The connection broke (a restart, or the server's watch timeout): resume.
                Some(Err(_)) | None => self.live.stream = None,
            }
        }
    }

    fn live_event(&mut self, kind: &'static str, cm: ConfigMap) {
        self.live.kinds.push(kind);
        self.live.got.push(cm);
    }

    /// Checks the live watch's events since the last check against the model, and moves its
    /// revision past them.
    fn check_live(&mut self) -> Result<(), String> {
        let got = std::mem::take(&mut self.live.got);
        let kinds = std::mem::take(&mut self.live.kinds);
        let expected = self.events(self.live.at, None);
        if got.len() > expected.len() {
            return Err(format!(
                "the live watch from {} delivered {} events; {} happened",
                self.live.at,
                got.len(),
                expected.len()
            ));
        }
        for (i, ((cm, kind), (want, e))) in got.iter().zip(&kinds).zip(&expected).enumerate() {
            if kind != want {
                return Err(format!(
                    "live watch from {}, event {i}: {kind}, expected {want} of {}",
                    self.live.at, e.name
                ));
            }
            same(cm, &e.name, e.rev, &e.value)
                .map_err(|err| format!("live watch from {}, event {i}: {err}", self.live.at))?;
        }
        if let Some(last) = got.last() {
            self.live.at = rv(last);
        }
        Ok(())
    }

    async fn catch_up(&mut self) -> Result<(), String> {
        self.drain(true).await
    }
}

async fn run(server: &mut Server, case: u64, ops: &[Op]) -> Result<(), String> {
    let client = server.client().await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    // The case's objects start empty: where their revisions start.
    let start = api
        .list(&ListParams::default().labels(&format!("case=c{case}")))
        .await
        .map_err(|e| format!("first list: {e}"))?
        .metadata
        .resource_version
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    let mut run = Run {
        server,
        client,
        api,
        case,
        log: Vec::new(),
        start,
        counter: 0,
        timeline: vec![(Instant::now(), start)],
        live: Live {
            stream: None,
            at: start,
            got: Vec::new(),
            kinds: Vec::new(),
        },
    };
    for (i, op) in ops.iter().enumerate() {
        run.step(op)
            .await
            .map_err(|e| format!("step {i} ({op:?}): {e}"))?;
        run.drain(false)
            .await
            .map_err(|e| format!("after step {i}: {e}"))?;
    }
    run.catch_up()
        .await
        .map_err(|e| format!("at the end: {e}"))?;
    run.list(Instant::now(), None, Some(2), None)
        .await
        .map_err(|e| format!("at the end: {e}"))?;
    // Every name the sequence used: what the model says, read one by one.
    for k in 0..NAMES {
        run.step(&Op::Get { k })
            .await
            .map_err(|e| format!("at the end: {e}"))?;
    }
    Ok(())
}

#[test]
fn the_api_follows_the_model_through_compaction_and_restarts() {
    let seed: u64 = std::env::var("ORRERY_MODEL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    let cases: u32 = std::env::var("ORRERY_MODEL_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(32);
    eprintln!("API model: {cases} sequences, seed {seed} (ORRERY_MODEL_SEED={seed} runs it again)");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = std::sync::Mutex::new(Server::start_with(&["--compaction-interval", "400ms"]));
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let config = Config {
        cases,
        failure_persistence: None,
        // The server's compaction runs on its own clock, so a shrunk sequence may not fail the
        // same way: a few attempts, then the original is reported.
        max_shrink_iters: 32,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes));
    let counter = std::sync::atomic::AtomicU64::new(0);
    let result = runner.run(&sequence(), |ops| {
        let case = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut server = server.lock().unwrap_or_else(|p| p.into_inner());
        rt.block_on(run(&mut server, case, &ops))
            .map_err(TestCaseError::fail)
    });
    match result {
        Ok(()) => {}
        Err(TestError::Fail(reason, ops)) => {
            let mut listing = String::new();
            for (i, op) in ops.iter().enumerate() {
                let _ = writeln!(listing, "  {i:3}: {op:?}");
            }
            let log = server.lock().unwrap_or_else(|p| p.into_inner()).log();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            panic!(
                "the API diverged from the model (seed {seed}; ORRERY_MODEL_SEED={seed} runs it again), \
                 {} steps:\n{listing}{reason}\nserver log (last lines, newest first):\n{}",
                ops.len(),
                tail.join("\n")
            );
        }
        Err(TestError::Abort(reason)) => panic!("aborted (seed {seed}): {reason}"),
    }
}
