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
use orrery_api::{Object, fields};
use orrery_store::{ListOptions, Revision, StoreError, WatchEvent, WatchOptions};
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

pub async fn watch(call: Call<'_>) -> ApiResult<Outcome> {
    let rt = call.target.rt.clone();
    let (label, mut field) = selectors(&call)?;
    if let Some(name) = &call.target.name {
        // The legacy single-object form: .../pods/<name>?watch=true.
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
        field = fields::Selector::parse(&terms.join(","))
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
    }
    let bookmarks = call.query.flag("allowWatchBookmarks")?;
    let send_initial_param = call
        .query
        .get("sendInitialEvents")
        .map(|v| v == "true" || v == "1");
    let rv = call.query.get("resourceVersion");
    let rv_match = call.query.get("resourceVersionMatch");
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
    let timeout = match call.query.number::<u64>("timeoutSeconds")? {
        Some(s) => Duration::from_secs(s),
        None => random_between(
            call.app.config.min_request_timeout,
            call.app.config.min_request_timeout * 2,
        ),
    };
    let prefix = rt.prefix(call.target.namespace.as_deref());
    let renderer = Renderer {
        rt: rt.clone(),
        representation: call.representation,
        include: IncludeObject::parse(call.query.get("includeObject"))
            .map_err(ApiError::bad_request)?,
    };

    // Where to start, and what to send first.
    let given: Option<Revision> = match rv {
        None | Some("0") => None,
        Some(r) => Some(
            r.parse::<Revision>()
                .ok()
                .filter(|r| *r > 0)
                .ok_or_else(|| ApiError::bad_request(format!("invalid resource version {r:?}")))?,
        ),
    };
    let initial_state = match (send_initial_param, given) {
        (Some(explicit), _) => explicit,
        (None, None) => true,
        (None, Some(_)) => false,
    };
    let (initial, from) = if initial_state {
        if let Some(r) = given {
            wait_for_revision(&call, r).await?;
        }
        let opts = ListOptions {
            labels: label.clone(),
            fields: field.clone(),
            ..Default::default()
        };
        let list = call.app.store.list(&prefix, &opts).await?;
        (list.items, list.revision)
    } else {
        match given {
            // A revision the store has not reached: waited for a moment, then "Too large
            // resource version" (504, as kube-apiserver), never a watch that hangs silently.
            Some(r) => {
                wait_for_revision(&call, r).await?;
                (Vec::new(), r)
            }
            None => (Vec::new(), call.app.store.current_revision().await?),
        }
    };
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
    let mut shutdown = call.app.shutdown.clone();
    let send_initial_end = send_initial_param == Some(true);
    tokio::spawn(async move {
        let Some(mut w) = stream else { return };
        for obj in initial {
            if tx.send(renderer.event("ADDED", &obj)).await.is_err() {
                return;
            }
        }
        if send_initial_end
            && tx
                .send(line("BOOKMARK", renderer.bookmark(from, true)))
                .await
                .is_err()
        {
            return;
        }
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        loop {
            let ev = tokio::select! {
                ev = w.next() => ev,
                _ = &mut deadline => {
                    if bookmarks && let Some(rv) = w.bookmark_now() {
                        let _ = tx.send(line("BOOKMARK", renderer.bookmark(rv, false))).await;
                    }
                    return;
                }
                _ = shutdown.changed() => return,
                _ = tx.closed() => return,
            };
            let out = match ev {
                Some(Ok(WatchEvent::Bookmark(rv))) => {
                    line("BOOKMARK", renderer.bookmark(rv, false))
                }
                Some(Ok(ev)) => {
                    let kind = ev.type_name();
                    let Some(obj) = ev.object() else { continue };
                    renderer.event(kind, obj)
                }
                Some(Err(e)) => {
                    let _ = tx.send(line("ERROR", ApiError::from(e).to_status())).await;
                    return;
                }
                None => return,
            };
            if tx.send(out).await.is_err() {
                return;
            }
        }
    });
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
    Ok(Outcome::encoded(response))
}
