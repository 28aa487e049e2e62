//! Serving HTTPS (HTTP/2 and HTTP/1.1) and shutting down gracefully: on shutdown the listener
//! closes, watches end cleanly, and in-flight requests get time to finish.
//!
//! A connection costs the server a task, buffers and a TLS session whether or not it sends
//! anything, so what it may hold is bounded, as kube-apiserver bounds it:
//! - a source address may hold `--max-connections-per-source` connections; beyond that a new
//!   one is closed at once;
//! - the TLS handshake, and then a request's headers, must arrive within
//!   `--request-header-timeout` (half-sent headers, or nothing at all, end the connection);
//! - a connection with no request in progress is closed after `--idle-connection-timeout`
//!   (long-lived streams such as watches count as in progress);
//! - a request's body has its own deadline (`--request-body-timeout`, `router.rs`).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use crate::app::App;

/// How long in-flight requests may take to finish after shutdown begins.
pub const DRAIN: Duration = Duration::from_secs(10);
pub use crate::http::{
    ConnectionLimits, DEFAULT_HEADER_TIMEOUT, DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS_PER_SOURCE,
};

/// Connections open, by source address.
#[derive(Debug, Default)]
struct Sources(Mutex<HashMap<IpAddr, usize>>);

/// One connection counted against its source until dropped.
struct SourceSlot {
    sources: Arc<Sources>,
    ip: IpAddr,
}

impl Sources {
    fn take(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<SourceSlot> {
        let mut m = self.0.lock();
        let n = m.entry(ip).or_default();
        if max > 0 && *n >= max {
            return None;
        }
        *n += 1;
        Some(SourceSlot {
            sources: self.clone(),
            ip,
        })
    }
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut m = self.sources.0.lock();
        if let Some(n) = m.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                m.remove(&self.ip);
            }
        }
    }
}

/// Whether a connection is serving a request, and since when it has not been.
struct Activity {
    state: Mutex<(usize, Instant, bool)>,
    changed: Notify,
}

/// One request in progress on its connection, until its response body is dropped.
struct InProgress(Arc<Activity>);

impl Activity {
    fn new() -> Arc<Activity> {
        Arc::new(Activity {
            state: Mutex::new((0, Instant::now(), false)),
            changed: Notify::new(),
        })
    }

    fn begin(self: &Arc<Self>) -> InProgress {
        let mut s = self.state.lock();
        s.0 += 1;
        s.2 = true;
        drop(s);
        self.changed.notify_waiters();
        InProgress(self.clone())
    }

    /// Returns once the connection has been idle too long: no request for `first` after it
    /// opened, or none in progress for `idle` since the last ended.
    async fn idle_for(&self, first: Duration, idle: Duration) {
        loop {
            let changed = self.changed.notified();
            let (active, since, served) = *self.state.lock();
            if active > 0 {
                changed.await;
                continue;
            }
            let deadline = since + if served { idle } else { first };
            if Instant::now() >= deadline {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => {}
                _ = changed => {}
            }
        }
    }
}

impl Drop for InProgress {
    fn drop(&mut self) {
        let mut s = self.0.state.lock();
        s.0 = s.0.saturating_sub(1);
        s.1 = Instant::now();
        drop(s);
        self.0.changed.notify_waiters();
    }
}

/// Connections open, for the drain at shutdown.
#[derive(Default)]
struct Open {
    count: AtomicUsize,
    none: Notify,
}

struct OpenSlot(Arc<Open>);

impl Open {
    fn enter(self: &Arc<Self>) -> OpenSlot {
        self.count.fetch_add(1, Ordering::AcqRel);
        OpenSlot(self.clone())
    }

    async fn all_closed(&self) {
        loop {
            let none = self.none.notified();
            if self.count.load(Ordering::Acquire) == 0 {
                return;
            }
            none.await;
        }
    }
}

impl Drop for OpenSlot {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.none.notify_waiters();
        }
    }
}

/// Where a connection's TLS configuration comes from: fixed, or the installation's CA as it
/// is at the handshake (a rotation changes what is trusted).
#[derive(Clone, Debug)]
pub enum Tls {
    Fixed(Arc<rustls::ServerConfig>),
    Authority(Arc<crate::ca::Authority>),
}

impl Tls {
    fn acceptor(&self) -> TlsAcceptor {
        match self {
            Tls::Fixed(c) => TlsAcceptor::from(c.clone()),
            Tls::Authority(a) => TlsAcceptor::from(a.tls()),
        }
    }
}

impl From<rustls::ServerConfig> for Tls {
    fn from(c: rustls::ServerConfig) -> Self {
        Tls::Fixed(Arc::new(c))
    }
}

/// Serves `app` on `listener` until `shutdown` turns true.
pub async fn serve(
    app: Arc<App>,
    listener: TcpListener,
    tls: impl Into<Tls>,
    mut shutdown: watch::Receiver<bool>,
) {
    let limits = app.config.connections;
    let tls: Tls = tls.into();
    let sources = Arc::new(Sources::default());
    let open = Arc::new(Open::default());
    let (closing_tx, closing) = watch::channel(false);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    builder.http2().timer(TokioTimer::new());
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Some(source) = sources.take(peer.ip(), limits.max_per_source) else {
                    app.metrics.connection_refused();
                    tracing::debug!(%peer, limit = limits.max_per_source, "closing a connection: its source holds the most it may");
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let (acceptor, app, builder) = (tls.acceptor(), app.clone(), builder.clone());
                let (open, mut closing) = (open.enter(), closing.clone());
                tokio::spawn(async move {
                    let _counted = (source, open);
                    let tls = match tokio::time::timeout(limits.header_timeout, acceptor.accept(stream)).await {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "TLS handshake timed out");
                            return;
                        }
                    };
                    // A client certificate was verified against the CA in the handshake.
                    let cert = tls
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .and_then(|c| crate::auth::ClientCert::of_der(c.as_ref()));
                    let activity = Activity::new();
                    let serving = activity.clone();
                    let service = service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
                        let in_progress = serving.begin();
                        req.extensions_mut().insert(crate::audit::Peer(peer));
                        if let Some(c) = &cert {
                            req.extensions_mut().insert(c.clone());
                        }
                        let app = app.clone();
                        // Boxed: hyper keeps room for this future in every connection, in
                        // use or idle, and the whole request's state machine is tens of KiB
                        // (86 MiB over a replica's connections from 1,000 members, measured
                        // with heaptrack); boxed, an idle connection keeps a pointer.
                        async move {
                            let response = Box::pin(app.handle(req)).await;
                            // In progress until its body is sent (or the client goes).
                            Ok::<_, Infallible>(response.map(|b| {
                                b.map_frame(move |f| {
                                    let _held = &in_progress;
                                    f
                                })
                                .boxed()
                            }))
                        }
                    });
                    let conn = builder
                        .serve_connection_with_upgrades(TokioIo::new(tls), service)
                        .into_owned();
                    tokio::pin!(conn);
                    let mut ending = false;
                    loop {
                        tokio::select! {
                            done = conn.as_mut() => {
                                if let Err(e) = done {
                                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                                }
                                break;
                            }
                            _ = activity.idle_for(limits.header_timeout, limits.idle_timeout), if !ending => {
                                tracing::debug!(%peer, "closing an idle connection");
                                conn.as_mut().graceful_shutdown();
                                ending = true;
                            }
                            _ = closing.changed(), if !ending => {
                                conn.as_mut().graceful_shutdown();
                                ending = true;
                            }
                        }
                    }
                });
            }
            _ = shutdown.changed() => break,
        }
    }
    drop(listener);
    tracing::info!(
        connections = open.count.load(Ordering::Acquire),
        "shutting down: draining in-flight requests"
    );
    let _ = closing_tx.send(true);
    tokio::select! {
        _ = open.all_closed() => tracing::info!("all connections closed"),
        _ = tokio::time::sleep(DRAIN) => tracing::warn!("connections still open after the drain period; closing"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_holds_at_most_its_limit() {
        let sources = Arc::new(Sources::default());
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let other: IpAddr = "127.0.0.2".parse().unwrap();
        let held: Vec<SourceSlot> = (0..3).map(|_| sources.take(ip, 3).unwrap()).collect();
        assert!(sources.take(ip, 3).is_none());
        assert!(sources.take(other, 3).is_some());
        drop(held);
        assert!(sources.take(ip, 3).is_some());
        assert!(sources.0.lock().get(&ip).is_none());
        // 0 is no limit.
        let many: Vec<SourceSlot> = (0..10).map(|_| sources.take(ip, 0).unwrap()).collect();
        assert_eq!(many.len(), 10);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_is_idle_after_its_first_request_is_late_or_its_last_long_done() {
        let a = Activity::new();
        let start = Instant::now();
        a.idle_for(Duration::from_secs(10), Duration::from_secs(90))
            .await;
        assert_eq!(start.elapsed(), Duration::from_secs(10));
        // A request in progress holds it open however long it lasts; after it, the idle
        // timeout counts from when it ended.
        let a = Activity::new();
        let r = a.begin();
        let watcher = a.clone();
        let idle = tokio::spawn(async move {
            watcher
                .idle_for(Duration::from_secs(10), Duration::from_secs(90))
                .await;
            Instant::now()
        });
        tokio::time::sleep(Duration::from_secs(500)).await;
        assert!(!idle.is_finished());
        let ended = Instant::now();
        drop(r);
        let at = idle.await.unwrap();
        assert_eq!(at - ended, Duration::from_secs(90));
    }
}
