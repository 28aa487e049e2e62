//! Step 1: what is seen of every request: its time, trace steps, metrics and log line, and
//! what every answer carries.

use std::sync::Arc;
use std::time::Instant;

use super::{Answer, Caller, Next, Req};
use crate::app::App;

pub(super) async fn observe(app: Arc<App>, req: Req, next: Next) -> Answer {
    let started = Instant::now();
    let http1 = req.version() <= http::Version::HTTP_11;
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let (mut response, steps) = crate::trace::traced(next.run(req)).await;
    // What was read may be stale: say so as Kubernetes says such things, with a warning
    // (kubectl prints it).
    if let Some(why) = app.store.degraded() {
        let text = format!("299 - \"{}\"", why.replace(['"', '\\'], "'"));
        if let Ok(v) = http::HeaderValue::from_str(&text) {
            response.headers_mut().append(http::header::WARNING, v);
        }
    }
    let status = response.status().as_u16();
    if status == 408 && http1 {
        // What is left of the body is not waited for: the connection ends with the answer.
        response.headers_mut().insert(
            http::header::CONNECTION,
            http::HeaderValue::from_static("close"),
        );
    }
    let reg = app.resources.snapshot();
    app.metrics.observe(
        method.as_str(),
        &path,
        status,
        started.elapsed().as_secs_f64(),
        |group, version, plural| reg.get(group, version, plural).is_some(),
    );
    let user = response
        .extensions_mut()
        .remove::<Caller>()
        .unwrap_or_default()
        .0;
    let threshold = app.config.slow_request_threshold;
    let elapsed_ms = started.elapsed().as_millis() as u64;
    if status >= 500 {
        tracing::warn!(%method, %path, status, user, elapsed_ms, "request failed");
    } else if !threshold.is_zero() && started.elapsed() >= threshold {
        let now = Instant::now();
        tracing::info!(%method, %path, status, user, elapsed_ms, steps = %steps.render(now), "slow request");
    } else {
        tracing::debug!(%method, %path, status, user, elapsed_ms, "request");
    }
    response
}
