//! A small HTTP endpoint, on a loopback address only, to look at simulated clusters and inject
//! faults into them:
//!
//! - `GET /clusters`, `GET /clusters/{name}`: what each simulation holds;
//! - `GET /clusters/{name}/objects`: the objects it runs, as applied, with their status;
//! - `GET /clusters/{name}/journal` (`?since=N`): every create, update and delete the member
//!   carried out for its agent after entry `N`, each with the Work (uid, generation,
//!   revision) it came from and why;
//! - `GET /clusters/{name}/data` (`?since=N`): what happened to the member's volumes: pods
//!   started and stopped on them (with the data version they started on), volumes made and
//!   removed, snapshots taken and copies started and finished for volume transfers;
//! - `PUT /clusters/{name}/faults` `{"outage": true, "latencyMs": 200, "lostNodes": 2,
//!   "dataMoverOutage": true}`: sets the faults (what is left out is cleared); `DELETE
//!   /clusters/{name}/faults` clears them;
//! - `PUT /clusters/{name}/load` `{"load": 0.8}`: the background load, a fraction of capacity;
//! - `POST /clusters/{name}/objects` with a manifest: an object made in the member by someone
//!   else than Orrery (unmanaged, unless its labels say otherwise), to test conflicts;
//!   `DELETE /clusters/{name}/objects` with one (its apiVersion, kind and metadata): the
//!   object removed there by someone else;
//! - `GET /stats` (`?reset=true` to start afresh): heartbeat and report round-trip times.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::{Faults, SimCluster};
use orrery_api::work::ResourceIdentifier;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct FaultsBody {
    #[serde(default)]
    outage: bool,
    #[serde(default)]
    latency_ms: u64,
    #[serde(default)]
    lost_nodes: usize,
    #[serde(default)]
    data_mover_outage: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LoadBody {
    load: f64,
}

fn reply(status: StatusCode, body: Value) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

fn error(status: StatusCode, message: impl Into<String>) -> Response<Full<Bytes>> {
    reply(status, json!({ "error": message.into() }))
}

async fn handle(
    sims: Arc<HashMap<String, Arc<SimCluster>>>,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    let method = req.method().clone();
    let path = req.uri().path().trim_end_matches('/').to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let body = match http_body_util::Limited::new(req.into_body(), 64 * 1024)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(e) => return error(StatusCode::PAYLOAD_TOO_LARGE, e.to_string()),
    };
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    let find = |name: &str| sims.get(name).cloned();
    match (&method, segments.as_slice()) {
        (&Method::GET, ["stats"]) => {
            let reset = query.contains("reset=true");
            reply(StatusCode::OK, orrery_agent::stats::snapshot(reset))
        }
        (&Method::GET, ["clusters"]) => {
            let mut all: Vec<_> = sims.values().map(|s| s.summary()).collect();
            all.sort_by(|a, b| a.name.cmp(&b.name));
            reply(StatusCode::OK, json!(all))
        }
        (_, ["clusters", name, rest @ ..]) => {
            let Some(sim) = find(name) else {
                return error(
                    StatusCode::NOT_FOUND,
                    format!("no simulated cluster {name:?}"),
                );
            };
            match (&method, rest) {
                (&Method::GET, []) => reply(StatusCode::OK, json!(sim.summary())),
                (&Method::GET, ["objects"]) => {
                    reply(StatusCode::OK, json!({"items": sim.objects()}))
                }
                (&Method::GET, [log @ ("journal" | "data")]) => {
                    let since = form_urlencoded::parse(query.as_bytes())
                        .find(|(k, _)| k == "since")
                        .map(|(_, v)| v.parse::<u64>());
                    match since {
                        Some(Err(_)) => {
                            error(StatusCode::BAD_REQUEST, "since must be a sequence number")
                        }
                        since => {
                            let n = since.and_then(Result::ok).unwrap_or(0);
                            let items = if *log == "journal" {
                                json!(sim.journal(n))
                            } else {
                                json!(sim.data_log(n))
                            };
                            reply(StatusCode::OK, json!({"items": items}))
                        }
                    }
                }
                (m, ["objects", ..]) if m != Method::GET => {
                    object_write(&sim, &method, rest, &body).await
                }
                (&Method::PUT, ["faults"]) => match serde_json::from_slice::<FaultsBody>(&body) {
                    Ok(f) => {
                        sim.set_faults(Faults {
                            outage: f.outage,
                            latency: Duration::from_millis(f.latency_ms),
                            lost_nodes: f.lost_nodes,
                            data_mover_outage: f.data_mover_outage,
                        });
                        tracing::info!(cluster = %name, outage = f.outage, latency_ms = f.latency_ms, lost_nodes = f.lost_nodes, data_mover_outage = f.data_mover_outage, "faults set");
                        reply(StatusCode::OK, json!(sim.summary()))
                    }
                    Err(e) => error(StatusCode::BAD_REQUEST, format!("invalid faults: {e}")),
                },
                (&Method::DELETE, ["faults"]) => {
                    sim.set_faults(Faults::default());
                    reply(StatusCode::OK, json!(sim.summary()))
                }
                (&Method::PUT, ["load"]) => match serde_json::from_slice::<LoadBody>(&body) {
                    Ok(l) if (0.0..=1.0).contains(&l.load) => {
                        sim.set_load(l.load);
                        reply(StatusCode::OK, json!(sim.summary()))
                    }
                    Ok(_) => error(StatusCode::BAD_REQUEST, "load must be between 0 and 1"),
                    Err(e) => error(StatusCode::BAD_REQUEST, format!("invalid load: {e}")),
                },
                _ => error(StatusCode::NOT_FOUND, "no such endpoint"),
            }
        }
        _ => error(StatusCode::NOT_FOUND, "no such endpoint"),
    }
}

/// The object a write names, and who it is (an error answer when the body says neither).
#[allow(clippy::result_large_err)]
fn named(body: &[u8]) -> Result<(Value, ResourceIdentifier), Response<Full<Bytes>>> {
    let o: Value = serde_json::from_slice(body)
        .map_err(|e| error(StatusCode::BAD_REQUEST, format!("invalid object: {e}")))?;
    let id = ResourceIdentifier::of(0, &o).ok_or_else(|| {
        error(
            StatusCode::BAD_REQUEST,
            "an object needs apiVersion, kind and metadata.name",
        )
    })?;
    Ok((o, id))
}

/// A write to the member's objects, as someone in the member makes it: create, delete, or
/// set an object's status or spec.
async fn object_write(
    sim: &SimCluster,
    method: &Method,
    rest: &[&str],
    body: &[u8],
) -> Response<Full<Bytes>> {
    match (method, rest) {
        (&Method::POST, ["objects"]) => match serde_json::from_slice::<Value>(body) {
            Ok(m) => match orrery_agent::backend::Backend::apply(
                sim,
                &m,
                false,
                &orrery_agent::backend::Cause {
                    reason: "made through the admin endpoint",
                    ..Default::default()
                },
            )
            .await
            {
                Ok(()) => reply(StatusCode::CREATED, m),
                Err(orrery_agent::backend::BackendError::Conflict(what)) => {
                    error(StatusCode::CONFLICT, format!("{what} exists already"))
                }
                Err(e) => error(StatusCode::BAD_REQUEST, e.to_string()),
            },
            Err(e) => error(StatusCode::BAD_REQUEST, format!("invalid manifest: {e}")),
        },
        (&Method::DELETE, ["objects"]) => match named(body) {
            Err(r) => r,
            Ok((o, id)) => match orrery_agent::backend::Backend::delete(
                sim,
                &id,
                &orrery_agent::backend::Cause {
                    reason: "removed through the admin endpoint",
                    ..Default::default()
                },
            )
            .await
            {
                Ok(()) => reply(StatusCode::OK, o),
                Err(e) => error(StatusCode::BAD_REQUEST, e.to_string()),
            },
        },
        // What a member's own controller writes into an object's status.
        (&Method::PUT, ["objects", "status"]) => match named(body) {
            Err(r) => r,
            Ok((o, id)) => {
                let status = o.get("status").cloned().unwrap_or(Value::Null);
                if sim.set_status(&id, status) {
                    reply(StatusCode::OK, o)
                } else {
                    error(StatusCode::NOT_FOUND, format!("no {}", id.describe()))
                }
            }
        },
        // What someone in the member writes into a custom object's spec.
        (&Method::PUT, ["objects", "spec"]) => match named(body) {
            Err(r) => r,
            Ok((o, id)) => {
                let spec = o.get("spec").cloned().unwrap_or(Value::Null);
                match sim.set_spec(&id, &spec) {
                    Ok(()) => reply(StatusCode::OK, o),
                    Err(why) => error(StatusCode::CONFLICT, format!("{}: {why}", id.describe())),
                }
            }
        },
        _ => error(StatusCode::NOT_FOUND, "no such endpoint"),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("the admin endpoint must listen on a loopback address, not {0}")]
    NotLoopback(SocketAddr),
    #[error("listening on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// Serves the endpoint until shutdown; returns the bound address at once.
pub async fn serve(
    addr: SocketAddr,
    sims: Vec<Arc<SimCluster>>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<SocketAddr, AdminError> {
    if !addr.ip().is_loopback() {
        return Err(AdminError::NotLoopback(addr));
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| AdminError::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| AdminError::Bind { addr, source })?;
    let sims: Arc<HashMap<String, Arc<SimCluster>>> = Arc::new(
        sims.into_iter()
            .map(|s| (s.name().to_string(), s))
            .collect(),
    );
    tokio::spawn(async move {
        loop {
            let (stream, _) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(x) => x,
                    Err(_) => continue,
                },
                _ = shutdown.changed() => return,
            };
            let sims = sims.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let sims = sims.clone();
                    async move { Ok::<_, Infallible>(handle(sims, req).await) }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Ok(bound)
}
