//! watch: a chunked stream of newline-delimited JSON events (`{"type": "ADDED", "object": …}`).
//!
//! Where it starts: with no resourceVersion (or `0`), the current objects first, as ADDED
//! events; with `sendInitialEvents=true`, the same followed by a bookmark annotated
//! `k8s.io/initial-events-end`; with a resourceVersion, exactly the changes after it. A start
//! the store no longer has history for, or a client too slow to keep up, gets an ERROR event
//! carrying a 410 `Status`, and the stream ends (the client re-lists).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use orrery_api::{Object, fields, labels};
use orrery_store::{ListOptions, Revision, StoreError, WatchEvent, WatchOptions, WatchStream};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::Call;
use super::Outcome;
use super::read::{present, selectors, wait_for_revision};
use crate::error::{ApiError, ApiResult};
use crate::http::Representation;
use crate::resources::ResourceType;
use crate::table::{self, IncludeObject};

/// How one event's object is rendered.
#[derive(Clone)]
struct Renderer {
    rt: Arc<ResourceType>,
    representation: Representation,
    include: IncludeObject,
}

impl Renderer {
    fn object(&self, obj: &Object) -> Value {
        match self.representation {
            Representation::Json => obj.to_value(),
            Representation::Metadata => json!({
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": serde_json::to_value(&obj.metadata).unwrap_or_default(),
            }),
            Representation::Table => {
                let mut t = table::table(
                    &self.rt,
                    std::slice::from_ref(obj),
                    &obj.metadata.resource_version,
                    None,
                    self.include,
                );
                t["rows"][0]["object"] = match self.include {
                    IncludeObject::None => Value::Null,
                    _ => t["rows"][0]["object"].take(),
                };
                t
            }
        }
    }

    /// One event's line. Plain JSON is written straight from the stored object (no copy and
    /// no intermediate JSON tree): every watcher of a busy kind pays this per event.
    fn event(&self, kind: &str, obj: &Object) -> Bytes {
        #[derive(serde::Serialize)]
        struct Line<'a> {
            #[serde(rename = "type")]
            kind: &'a str,
            object: &'a Object,
        }
        if matches!(self.representation, Representation::Json)
            && obj.kind == self.rt.kind
            && obj.api_version == self.rt.api_version()
        {
            let mut out = serde_json::to_vec(&Line { kind, object: obj }).unwrap_or_default();
            out.push(b'\n');
            return Bytes::from(out);
        }
        line(kind, self.object(&present(&self.rt, obj.clone())))
    }

    fn bookmark(&self, rv: Revision, initial_end: bool) -> Value {
        let mut meta = json!({ "resourceVersion": rv.to_string() });
        if initial_end {
            meta["annotations"] = json!({ "k8s.io/initial-events-end": "true" });
        }
        json!({ "kind": self.rt.kind, "apiVersion": self.rt.api_version(), "metadata": meta })
    }
}

/// One event of a JSON watch stream.
pub(crate) fn line(kind: &str, object: Value) -> Bytes {
    let mut out =
        serde_json::to_vec(&json!({ "type": kind, "object": object })).unwrap_or_default();
    out.push(b'\n');
    Bytes::from(out)
}

fn random_between(lo: Duration, hi: Duration) -> Duration {
    let mut b = [0u8; 4];
    let r = getrandom::fill(&mut b)
        .map(|_| u32::from_le_bytes(b))
        .unwrap_or(0);
    let span = hi.saturating_sub(lo).as_millis() as u64;
    lo + Duration::from_millis(if span == 0 { 0 } else { r as u64 % span })
}

/// Serves a watch: checks its parameters, finds where it starts, and streams its events from
/// a task of their own.
pub async fn watch(call: Call<'_>) -> ApiResult<Outcome> {
    let rt = call.target.rt.clone();
    let (label, mut field) = selectors(&call)?;
    if let Some(name) = &call.target.name {
        // The legacy single-object form: .../pods/<name>?watch=true.
        field = with_name(&field, name)?;
    }
    let bookmarks = call.options.list.allow_watch_bookmarks;
    let send_initial_param = call.options.list.send_initial_events;
    let rv = call.options.list.resource_version.as_deref();
    let rv_match = call.options.list.resource_version_match.as_deref();
    check_initial_events(send_initial_param, rv_match, bookmarks)?;
    let timeout = watch_timeout(&call)?;
    let prefix = rt.prefix(call.target.namespace.as_deref());
    let renderer = Renderer {
        rt: rt.clone(),
        representation: call.representation,
        include: call.options.include_object,
    };

    // Where to start, and what to send first.
    let given = given_revision(rv)?;
    let initial_state = match (send_initial_param, given) {
        (Some(explicit), _) => explicit,
        (None, None) => true,
        (None, Some(_)) => false,
    };
    let (initial, from) = start(&call, &prefix, given, initial_state, &label, &field).await?;
    let opts = WatchOptions {
        labels: label,
        fields: field,
        bookmark_interval: bookmarks.then_some(call.app.config.bookmark_interval),
        // A client's queue is sized by its prefix: a fleet's agents each watch a namespace.
        wide: false,
    };
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let stream = match call.app.store.watch(&prefix, from, opts).await {
        Ok(w) => Some(w),
        Err(e @ StoreError::Expired { .. }) => {
            // As Kubernetes does: a 200 stream whose only event is the 410.
            let _ = tx.try_send(line("ERROR", ApiError::from(e).to_status()));
            None
        }
        Err(e) => return Err(e.into()),
    };
    let feed = Feed {
        renderer,
        tx,
        shutdown: call.app.shutdown.clone(),
        bookmarks,
        timeout,
    };
    let send_initial_end = send_initial_param == Some(true);
    tokio::spawn(async move {
        let Some(w) = stream else { return };
        if feed
            .send_initial(initial, from, send_initial_end)
            .await
            .is_err()
        {
            return;
        }
        feed.follow(w).await;
    });
    Ok(Outcome::encoded(stream_response(rx)))
}

/// `field` narrowed to the object named `name`.
fn with_name(field: &fields::Selector, name: &str) -> ApiResult<fields::Selector> {
    let mut terms: Vec<String> = field
        .terms()
        .iter()
        .map(|t| {
            format!(
                "{}{}{}",
                t.field,
                if t.negated { "!=" } else { "=" },
                t.value
            )
        })
        .collect();
    terms.push(format!("metadata.name={name}"));
    fields::Selector::parse(&terms.join(",")).map_err(|e| ApiError::bad_request(e.to_string()))
}

/// `sendInitialEvents=true` needs `resourceVersionMatch=NotOlderThan` and bookmarks;
/// `resourceVersionMatch` is allowed with nothing else.
fn check_initial_events(
    send_initial_param: Option<bool>,
    rv_match: Option<&str>,
    bookmarks: bool,
) -> ApiResult<()> {
    if send_initial_param == Some(true) {
        if rv_match != Some("NotOlderThan") {
            return Err(ApiError::bad_request(
                "sendInitialEvents requires resourceVersionMatch=NotOlderThan",
            ));
        }
        if !bookmarks {
            return Err(ApiError::bad_request(
                "sendInitialEvents requires allowWatchBookmarks=true",
            ));
        }
    } else if rv_match.is_some() {
        return Err(ApiError::bad_request(
            "resourceVersionMatch is only allowed for watch with sendInitialEvents=true",
        ));
    }
    Ok(())
}

/// How long the watch lasts: `timeoutSeconds`, or a random time between the minimum request
/// timeout and twice it (so a fleet's watches do not all end together).
fn watch_timeout(call: &Call<'_>) -> ApiResult<Duration> {
    Ok(match call.options.list.timeout_seconds {
        Some(s) => Duration::from_secs(s),
        None => random_between(
            call.app.config.min_request_timeout,
            call.app.config.min_request_timeout * 2,
        ),
    })
}

/// The `resourceVersion` the client gave: none for no value or `0`, else a positive revision.
fn given_revision(rv: Option<&str>) -> ApiResult<Option<Revision>> {
    Ok(match rv {
        None | Some("0") => None,
        Some(r) => Some(
            r.parse::<Revision>()
                .ok()
                .filter(|r| *r > 0)
                .ok_or_else(|| ApiError::bad_request(format!("invalid resource version {r:?}")))?,
        ),
    })
}

/// What to send first and the revision the changes follow: with an initial state, the
/// objects there now (once the store has reached `given`); otherwise none, from `given` or
/// from now.
async fn start(
    call: &Call<'_>,
    prefix: &str,
    given: Option<Revision>,
    initial_state: bool,
    label: &labels::Selector,
    field: &fields::Selector,
) -> ApiResult<(Vec<Object>, Revision)> {
    if initial_state {
        if let Some(r) = given {
            wait_for_revision(call, r).await?;
        }
        let opts = ListOptions {
            labels: label.clone(),
            fields: field.clone(),
            ..Default::default()
        };
        let list = call.app.store.list(prefix, &opts).await?;
        return Ok((list.items, list.revision));
    }
    Ok(match given {
        // A revision the store has not reached: waited for a moment, then "Too large
        // resource version" (504, as kube-apiserver), never a watch that hangs silently.
        Some(r) => {
            wait_for_revision(call, r).await?;
            (Vec::new(), r)
        }
        None => (Vec::new(), call.app.store.current_revision().await?),
    })
}

/// What the task that feeds one watch's stream holds.
struct Feed {
    renderer: Renderer,
    tx: mpsc::Sender<Bytes>,
    shutdown: tokio::sync::watch::Receiver<bool>,
    bookmarks: bool,
    timeout: Duration,
}

impl Feed {
    /// The objects there at the start as ADDED events, then, if asked for, the bookmark that
    /// ends them. An error means the client has gone.
    async fn send_initial(
        &self,
        initial: Vec<Object>,
        from: Revision,
        send_initial_end: bool,
    ) -> Result<(), mpsc::error::SendError<Bytes>> {
        for obj in initial {
            self.tx.send(self.renderer.event("ADDED", &obj)).await?;
        }
        if send_initial_end {
            self.tx
                .send(line("BOOKMARK", self.renderer.bookmark(from, true)))
                .await?;
        }
        Ok(())
    }

    /// The changes, until the timeout (ending with a bookmark if the client takes them),
    /// shutdown, the client leaving, or the store's error (sent as an ERROR event).
    async fn follow(mut self, mut w: WatchStream) {
        let deadline = tokio::time::sleep(self.timeout);
        tokio::pin!(deadline);
        loop {
            let ev = tokio::select! {
                ev = w.next() => ev,
                _ = &mut deadline => {
                    if self.bookmarks && let Some(rv) = w.bookmark_now() {
                        let _ = self
                            .tx
                            .send(line("BOOKMARK", self.renderer.bookmark(rv, false)))
                            .await;
                    }
                    return;
                }
                _ = self.shutdown.changed() => return,
                _ = self.tx.closed() => return,
            };
            let out = match ev {
                Some(Ok(WatchEvent::Bookmark(rv))) => {
                    line("BOOKMARK", self.renderer.bookmark(rv, false))
                }
                Some(Ok(ev)) => {
                    let kind = ev.type_name();
                    let Some(obj) = ev.object() else { continue };
                    self.renderer.event(kind, obj)
                }
                Some(Err(e)) => {
                    let _ = self
                        .tx
                        .send(line("ERROR", ApiError::from(e).to_status()))
                        .await;
                    return;
                }
                None => return,
            };
            if self.tx.send(out).await.is_err() {
                return;
            }
        }
    }
}

/// The 200 response whose body is the events as the task sends them.
fn stream_response(rx: mpsc::Receiver<Bytes>) -> Response<crate::http::Body> {
    let body = StreamBody::new(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    }));
    let mut response = Response::new(BodyExt::boxed(body));
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response.headers_mut().insert(
        "Cache-Control",
        http::HeaderValue::from_static("no-cache, private"),
    );
    response
}
