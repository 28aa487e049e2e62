//! Serving HTTPS (HTTP/2 and HTTP/1.1) and shutting down gracefully: on shutdown the listener
//! closes, watches end cleanly, and in-flight requests get time to finish.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::app::App;

/// How long in-flight requests may take to finish after shutdown begins.
pub const DRAIN: Duration = Duration::from_secs(10);

/// Serves `app` on `listener` until `shutdown` turns true.
pub async fn serve(
    app: Arc<App>,
    listener: TcpListener,
    tls: rustls::ServerConfig,
    mut shutdown: watch::Receiver<bool>,
) {
    let acceptor = TlsAcceptor::from(Arc::new(tls));
    let graceful = GracefulShutdown::new();
    let builder = auto::Builder::new(TokioExecutor::new());
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
                let _ = stream.set_nodelay(true);
                let (acceptor, app, builder, watcher) = (acceptor.clone(), app.clone(), builder.clone(), graceful.watcher());
                tokio::spawn(async move {
                    let tls = match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream)).await {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "TLS handshake failed");
                            return;
                        }
                        Err(_) => return,
                    };
                    // A client certificate was verified against the CA in the handshake.
                    let cert = tls
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .and_then(|c| crate::auth::ClientCert::of_der(c.as_ref()));
                    let service = service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
                        req.extensions_mut().insert(crate::audit::Peer(peer));
                        if let Some(c) = &cert {
                            req.extensions_mut().insert(c.clone());
                        }
                        let app = app.clone();
                        // Boxed: hyper keeps room for this future in every connection, in
                        // use or idle, and the whole request's state machine is tens of KiB
                        // (86 MiB over a replica's connections from 1,000 members, measured
                        // with heaptrack); boxed, an idle connection keeps a pointer.
                        async move { Ok::<_, Infallible>(Box::pin(app.handle(req)).await) }
                    });
                    let conn = builder
                        .serve_connection_with_upgrades(TokioIo::new(tls), service)
                        .into_owned();
                    if let Err(e) = watcher.watch(conn).await {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                });
            }
            _ = shutdown.changed() => break,
        }
    }
    drop(listener);
    tracing::info!(
        connections = graceful.count(),
        "shutting down: draining in-flight requests"
    );
    tokio::select! {
        _ = graceful.shutdown() => tracing::info!("all connections closed"),
        _ = tokio::time::sleep(DRAIN) => tracing::warn!("connections still open after the drain period; closing"),
    }
}
