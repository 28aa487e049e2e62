//! Step 7: what a request may hold: its body within its size and deadline, a seat among the
//! requests served at once, a count among its caller's watches.

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::BodyExt;

use super::{Acting, Answer, Next, Req, read_body, refuse};
use crate::app::App;
use crate::auth::Identity;
use crate::error::{ApiError, ApiResult};
use crate::http as h;

pub(super) async fn limit(app: Arc<App>, req: Req, next: Next) -> Answer {
    let path = req.uri().path().to_string();
    let Some(Acting { who, .. }) = req.extensions().get::<Acting>().cloned() else {
        return refuse(&path, &ApiError::unauthorized());
    };
    let is_watch = h::asks_to_watch(req.uri().query());
    // The body first, within its deadline and before a seat is taken: a slow client holds
    // its connection, never a seat others need.
    let (parts, body) = req.into_parts();
    let body = if matches!(
        parts.method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    ) {
        match app.read_request_body(body).await {
            Ok(b) => b,
            Err(e) => return refuse(&path, &e),
        }
    } else {
        Bytes::new()
    };
    let req = Request::from_parts(parts, read_body(body));
    // Held until the answer is ready (a long list's body may still be on its way).
    let _seat = match app.seat(&who, req.method(), &path, is_watch).await {
        Ok(seat) => seat,
        Err(e) => return refuse(&path, &e),
    };
    crate::trace::step("seated");
    // A watch is counted as long as its stream is open.
    let watch = match app.watch_slot(&who, is_watch) {
        Ok(w) => w,
        Err(e) => return refuse(&path, &e),
    };
    let answer = next.run(req).await;
    match watch {
        Some(w) => answer.map(|b| {
            b.map_frame(move |f| {
                let _open = &w;
                f
            })
            .boxed()
        }),
        None => answer,
    }
}

/// One open watch of a user's, counted until its response body is dropped.
struct WatchSlot {
    watches: Arc<parking_lot::Mutex<std::collections::HashMap<String, usize>>>,
    user: String,
}

impl Drop for WatchSlot {
    fn drop(&mut self) {
        let mut w = self.watches.lock();
        if let Some(n) = w.get_mut(&self.user) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                w.remove(&self.user);
            }
        }
    }
}

impl App {
    /// A count among the user's open watches, for a watch; 429 beyond the limit.
    fn watch_slot(&self, who: &Identity, is_watch: bool) -> ApiResult<Option<WatchSlot>> {
        let limit = self.config.max_watches_per_user;
        if limit == 0 || matches!(who, Identity::Admin { .. }) || !is_watch {
            return Ok(None);
        }
        let user = who.user();
        let mut w = self.watches.lock();
        let n = w.entry(user.clone()).or_default();
        if *n >= limit {
            return Err(ApiError::too_many_requests(format!(
                "{user} holds {limit} watches already (--max-watches-per-user)"
            )));
        }
        *n += 1;
        Ok(Some(WatchSlot {
            watches: self.watches.clone(),
            user,
        }))
    }

    /// A request's body, up to the size limit (413) and within the body timeout: a body that
    /// has not arrived by then is answered 408 and its connection closed.
    pub(crate) async fn read_request_body<B>(&self, body: B) -> ApiResult<Bytes>
    where
        B: hyper::body::Body<Data = Bytes>,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let wait = self.config.request_body_timeout;
        match tokio::time::timeout(wait, h::read_body(body, self.config.max_body_bytes)).await {
            Ok(read) => read,
            Err(_) => {
                self.metrics.slow_body();
                Err(ApiError::new(
                    408,
                    "Timeout",
                    format!(
                        "the request body did not arrive within {}s (--request-body-timeout)",
                        wait.as_secs_f64()
                    ),
                ))
            }
        }
    }

    /// A seat among the requests served at once, at the caller's priority level
    /// ([`crate::fairness`]), waiting in the caller's queue if none is free; `None` for what
    /// is not counted (`system:masters`, who must always get an answer, and watches, which
    /// last); 429 when the queue is full or the wait too long.
    async fn seat(
        &self,
        who: &Identity,
        method: &Method,
        path: &str,
        is_watch: bool,
    ) -> ApiResult<Option<crate::fairness::Seat>> {
        use crate::fairness::Level;
        if who.is_superuser() || is_watch {
            return Ok(None);
        }
        let mutating = !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
        let seats = if mutating {
            &self.in_flight.1
        } else {
            &self.in_flight.0
        };
        let Some(seats) = seats else {
            return Ok(None);
        };
        let level = match who {
            Identity::Cluster { .. } | Identity::Bootstrap { .. } => Level::System,
            _ if path.starts_with("/apis/coordination.k8s.io/") => Level::LeaderElection,
            _ => Level::Workload,
        };
        match seats.acquire(level, &who.user()).await {
            Ok(seat) => Ok(Some(seat)),
            Err(why) => {
                self.metrics.refused(level.name(), why.reason());
                Err(ApiError::too_many_requests(format!(
                    "Too many requests, please try again later ({} level: {}).",
                    level.name(),
                    match why {
                        crate::fairness::Refused::QueueFull =>
                            "this user's queue is full (--max-queued-requests-per-user)",
                        crate::fairness::Refused::TimedOut =>
                            "no seat came free within --request-queue-timeout",
                    }
                )))
            }
        }
    }
}
