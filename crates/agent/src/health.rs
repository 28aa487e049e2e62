//! An agent's probes and metrics (`--health-listen`): what a kubelet and a Prometheus ask of
//! an agent run as a Deployment in its member.
//!
//! - `GET /livez`: 200 while the agent's loop makes progress (it tried the server, or beat,
//!   within [`STUCK`]); a wedged agent is restarted by its kubelet, which is safe: a restarted
//!   agent resumes from its state and applies nothing again;
//! - `GET /readyz`: 200 when registered, in a session with the server, and its member's API
//!   answered the last report; else 503. Each check on a line, as Kubernetes' own `/readyz?verbose`
//!   writes them (`[+]registered ok`, `[-]session failed: ...`);
//! - `GET /metrics`: the same in Prometheus' text format, with heartbeats and Works applied.

use parking_lot::Mutex;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

/// How long the agent's loop may go without trying anything before `/livez` fails: well past
/// the longest wait of its backoff (30 s) and any sane heartbeat interval.
pub const STUCK: Duration = Duration::from_secs(300);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

/// What the probes read; the agent writes it as it goes. The gauges are the state: `/readyz`
/// reads the same values `/metrics` shows.
#[derive(Debug)]
pub struct Health {
    backend_error: Mutex<String>,
    progress: Mutex<Instant>,
    registered: Gauge,
    session: Gauge,
    backend: Gauge,
    works: Gauge,
    heartbeats: Family<ResultLabel, Counter>,
    sessions: Counter,
    registry: Registry,
}

impl Default for Health {
    fn default() -> Self {
        Health::new()
    }
}

impl Health {
    pub fn new() -> Health {
        let mut h = Health {
            backend_error: Mutex::new("no report yet".into()),
            progress: Mutex::new(Instant::now()),
            registered: Gauge::default(),
            session: Gauge::default(),
            backend: Gauge::default(),
            works: Gauge::default(),
            heartbeats: Family::default(),
            sessions: Counter::default(),
            registry: Registry::default(),
        };
        let r = &mut h.registry;
        r.register(
            "orrery_agent_registered",
            "1 once the agent holds its cluster's token",
            h.registered.clone(),
        );
        r.register(
            "orrery_agent_session_up",
            "1 while the agent is in a session with the server",
            h.session.clone(),
        );
        r.register(
            "orrery_agent_member_reachable",
            "1 when the member's API answered the last report",
            h.backend.clone(),
        );
        r.register(
            "orrery_agent_works",
            "Works the agent runs in its member",
            h.works.clone(),
        );
        r.register(
            "orrery_agent_heartbeats",
            "Heartbeats sent, by result",
            h.heartbeats.clone(),
        );
        r.register(
            "orrery_agent_sessions",
            "Sessions begun with the server",
            h.sessions.clone(),
        );
        h
    }

    fn tick(&self) {
        *self.progress.lock() = Instant::now();
    }

    pub(crate) fn set_registered(&self, yes: bool) {
        self.registered.set(i64::from(yes));
    }

    /// A session began (its first heartbeat answered) or ended.
    pub(crate) fn set_session(&self, up: bool) {
        self.tick();
        if self.session.set(i64::from(up)) == 0 && up {
            self.sessions.inc();
        }
    }

    /// The member answered a report (or did not, and why).
    pub(crate) fn member(&self, answered: Result<(), String>) {
        self.tick();
        self.backend.set(i64::from(answered.is_ok()));
        *self.backend_error.lock() = answered.err().unwrap_or_default();
    }

    pub(crate) fn heartbeat(&self, ok: bool) {
        self.tick();
        let result = if ok { "ok" } else { "failed" };
        self.heartbeats.get_or_create(&ResultLabel { result }).inc();
    }

    /// The loop tried the server (connecting, registering).
    pub(crate) fn attempt(&self) {
        self.tick();
    }

    pub(crate) fn set_works(&self, n: usize) {
        self.works.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// `/readyz`'s checks: (name, None when it passes, else why not).
    pub fn checks(&self) -> Vec<(&'static str, Option<String>)> {
        let pass = |ok: bool, why: String| if ok { None } else { Some(why) };
        vec![
            (
                "registered",
                pass(self.registered.get() == 1, "no cluster token yet".into()),
            ),
            (
                "session",
                pass(
                    self.session.get() == 1,
                    "not connected to the server".into(),
                ),
            ),
            (
                "member",
                pass(self.backend.get() == 1, self.backend_error.lock().clone()),
            ),
        ]
    }

    /// Whether the loop is stuck: nothing tried for [`STUCK`].
    pub fn stuck(&self) -> bool {
        self.progress.lock().elapsed() > STUCK
    }

    fn metrics_text(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            out = format!("# encoding failed: {e}\n");
        }
        out
    }
}

// The probes are served from other tasks than the agent's own.
const _: fn() = || {
    fn is<T: Send + Sync>() {}
    is::<Health>();
};

fn reply(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    r
}

fn handle<B>(health: &Health, req: &Request<B>) -> Response<Full<Bytes>> {
    const TEXT: &str = "text/plain; charset=utf-8";
    if req.method() != http::Method::GET && req.method() != http::Method::HEAD {
        return reply(StatusCode::METHOD_NOT_ALLOWED, TEXT, "GET only\n".into());
    }
    match req.uri().path() {
        "/livez" | "/healthz" => {
            if health.stuck() {
                reply(
                    StatusCode::SERVICE_UNAVAILABLE,
                    TEXT,
                    format!(
                        "[-]loop failed: nothing tried for {} s\nlivez check failed\n",
                        STUCK.as_secs()
                    ),
                )
            } else {
                reply(StatusCode::OK, TEXT, "ok\n".into())
            }
        }
        "/readyz" => {
            let checks = health.checks();
            let mut body = String::new();
            for (name, failed) in &checks {
                match failed {
                    None => body.push_str(&format!("[+]{name} ok\n")),
                    Some(why) => body.push_str(&format!("[-]{name} failed: {why}\n")),
                }
            }
            if checks.iter().all(|(_, f)| f.is_none()) {
                body.push_str("readyz check passed\n");
                reply(StatusCode::OK, TEXT, body)
            } else {
                body.push_str("readyz check failed\n");
                reply(StatusCode::SERVICE_UNAVAILABLE, TEXT, body)
            }
        }
        "/metrics" => reply(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            health.metrics_text(),
        ),
        _ => reply(
            StatusCode::NOT_FOUND,
            TEXT,
            "not found: /livez, /readyz and /metrics are served\n".into(),
        ),
    }
}

/// Serves the probes on `listener` until shutdown.
pub fn serve(
    listener: tokio::net::TcpListener,
    health: Arc<Health>,
    mut shutdown: watch::Receiver<bool>,
) {
    tokio::spawn(async move {
        loop {
            let stream = tokio::select! {
                r = listener.accept() => match r {
                    Ok((s, _)) => s,
                    Err(e) => {
                        // Out of descriptors, say: wait rather than spin.
                        tracing::warn!(error = %e, "accepting a probe's connection failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                _ = shutdown.changed() => return,
            };
            let health = health.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let r = handle(&health, &req);
                    async move { Ok::<_, Infallible>(r) }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
}

/// Binds `addr` for [`serve`].
pub async fn bind(addr: SocketAddr) -> std::io::Result<(tokio::net::TcpListener, SocketAddr)> {
    let l = tokio::net::TcpListener::bind(addr).await?;
    let bound = l.local_addr()?;
    Ok((l, bound))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_every_check_passes() {
        let h = Health::new();
        let get = |p: &str| {
            let req = Request::get(p).body(()).unwrap();
            handle(&h, &req)
        };
        assert_eq!(get("/livez").status(), StatusCode::OK);
        assert_eq!(get("/readyz").status(), StatusCode::SERVICE_UNAVAILABLE);
        h.set_registered(true);
        h.set_session(true);
        assert_eq!(get("/readyz").status(), StatusCode::SERVICE_UNAVAILABLE);
        h.member(Err("connection refused".into()));
        let failed = h.checks();
        assert_eq!(failed[2].1.as_deref(), Some("connection refused"));
        h.member(Ok(()));
        assert_eq!(get("/readyz").status(), StatusCode::OK);
        h.set_session(false);
        assert_eq!(get("/readyz").status(), StatusCode::SERVICE_UNAVAILABLE);
        h.set_session(true);
        h.heartbeat(true);
        h.heartbeat(false);
        let m = h.metrics_text();
        assert!(m.contains("orrery_agent_sessions_total 2"), "{m}");
        assert!(
            m.contains("orrery_agent_heartbeats_total{result=\"failed\"} 1"),
            "{m}"
        );
        assert!(m.contains("orrery_agent_session_up 1"), "{m}");
        assert_eq!(get("/nothing").status(), StatusCode::NOT_FOUND);
    }
}
