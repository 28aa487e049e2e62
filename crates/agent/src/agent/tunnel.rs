//! The cluster proxy's tunnel: requests the server relays to the member.

use super::*;

/// Keeps the cluster proxy's tunnel open for as long as the session lasts: the server sends
/// requests for the member's API on it (HTTP/2, the agent answering), and the backend answers
/// them. A tunnel that fails is opened again with backoff; it never ends the session.
pub(super) async fn tunnel_loop(inner: &Arc<Inner>, t: &Transport) -> End {
    if !inner.cfg.tunnel {
        return std::future::pending().await;
    }
    let mut wait = Duration::from_secs(1);
    loop {
        match t.open_tunnel().await {
            Ok(io) => {
                wait = Duration::from_secs(1);
                let backend = inner.backend.clone();
                let service = hyper::service::service_fn(
                    move |mut req: http::Request<hyper::body::Incoming>| {
                        let backend = backend.clone();
                        async move {
                            use http_body_util::BodyExt;
                            // A WebSocket upgrade, as HTTP/2 carries it (extended CONNECT).
                            if req.method() == http::Method::CONNECT
                                && req.extensions().get::<hyper::ext::Protocol>().is_some()
                            {
                                let upgrade = hyper::upgrade::on(&mut req);
                                let (parts, _) = req.into_parts();
                                return Ok(backend.proxy_upgrade(parts, upgrade).await);
                            }
                            let (parts, body) = req.into_parts();
                            let body = match body.collect().await {
                                Ok(b) => b.to_bytes(),
                                Err(e) => {
                                    return Ok::<_, std::convert::Infallible>(
                                        crate::backend::proxy_error(
                                            http::StatusCode::BAD_REQUEST,
                                            &e.to_string(),
                                        ),
                                    );
                                }
                            };
                            Ok(backend.proxy(http::Request::from_parts(parts, body)).await)
                        }
                    },
                );
                tracing::debug!(cluster = %inner.cfg.cluster, "cluster proxy tunnel open");
                let served =
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .enable_connect_protocol()
                        .serve_connection(io, service)
                        .await;
                if let Err(e) = served {
                    tracing::debug!(cluster = %inner.cfg.cluster, error = %e, "the cluster proxy tunnel ended");
                }
            }
            // A server without the proxy: asked again now and then (it may be upgraded).
            Err(TransportError::NotRegistered(_)) => wait = Duration::from_secs(60),
            Err(e) => {
                tracing::debug!(cluster = %inner.cfg.cluster, error = %e, "opening the cluster proxy tunnel failed");
            }
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_secs(30));
    }
}
