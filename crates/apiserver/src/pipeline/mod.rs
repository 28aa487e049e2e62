//! The request pipeline: every request to the API server passes these steps in this order,
//! each a tower layer over the rest of the pipeline ([`Step`]):
//!
//! 1. [`observe`]: times the request, records its trace steps, counts it in the metrics and
//!    logs it; adds what every answer carries (a stale-read warning, `Connection: close`
//!    after a 408).
//! 2. [`identify`](auth::identify): who the credentials say the caller is, not yet refused
//!    (the audit log records the unauthenticated too; the public routes need nobody).
//! 3. [`audit`] (when an audit log is configured): its stages, as its policy says.
//! 4. [`public`]: health, the UI page and `/cacerts`, answered before authentication.
//! 5. [`authenticate`](auth::authenticate): refuses the unauthenticated; impersonation.
//! 6. [`proxy`]: the cluster proxy and agents' tunnels, long-lived streams outside the limits.
//! 7. [`limit`](limits::limit): the body within its size and deadline (before a seat: a slow
//!    client holds its connection, never a seat), a seat among the requests in flight at the
//!    caller's priority, a count among the caller's watches.
//! 8. the router ([`crate::router`]): the fixed routes and the resource tree.
//!
//! A step that refuses answers at once (in the DRO-DS API's error shape on its paths, a
//! Kubernetes `Status` elsewhere). Steps hand later ones what they learnt in the request's
//! extensions ([`Identified`], [`Acting`]) and name the caller in the answer's ([`Caller`]),
//! for the log line.
//!
//! Architecture Invariant: no step below `authenticate` runs for a request without an
//! [`Acting`] identity, and only `public` answers before it.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;
use tower::util::BoxCloneSyncService;
use tower::{Layer, ServiceBuilder, ServiceExt};

use crate::app::App;
use crate::auth::Identity;
use crate::error::ApiError;
use crate::http::{self as h, Body};
use crate::impersonation::Impersonated;

mod audit;
mod auth;
mod limits;
mod observe;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a request's body could not be read. A concrete type, not a boxed `dyn Error`: with
/// one, the compiler cannot prove the connection's future `Send` (its lifetimes are
/// inferred for all `'a` at once).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct BodyError(BoxError);

/// A request's body, whatever served it (hyper's connection, an in-process caller).
pub type RequestBody = UnsyncBoxBody<Bytes, BodyError>;
pub type Req = Request<RequestBody>;
pub type Answer = Response<Body>;
type Rest = BoxCloneSyncService<Req, Answer, Infallible>;

/// Who the request's credentials name, or why they name nobody (step 2's finding).
#[derive(Clone, Debug)]
pub struct Identified(pub Result<Identity, ApiError>);

/// Whom the request acts as, once authenticated (impersonation applied), and who impersonated.
#[derive(Clone, Debug)]
pub struct Acting {
    pub who: Identity,
    pub impersonated: Option<Impersonated>,
}

/// Who asked, as the log line names them (empty before authentication).
#[derive(Clone, Debug, Default)]
pub struct Caller(pub String);

/// The rest of the pipeline, for a step to pass the request on.
pub struct Next(Rest);

impl Next {
    pub async fn run(self, req: Req) -> Answer {
        match self.0.oneshot(req).await {
            Ok(answer) => answer,
            Err(never) => match never {},
        }
    }
}

impl std::fmt::Debug for Next {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Next")
    }
}

impl<F> std::fmt::Debug for Step<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Step").finish_non_exhaustive()
    }
}

impl<F> std::fmt::Debug for StepLayer<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepLayer").finish_non_exhaustive()
    }
}

/// One step: `run(app, request, rest)`.
#[derive(Clone)]
pub struct Step<F> {
    app: Arc<App>,
    run: F,
    rest: Rest,
}

impl<F, Fut> tower::Service<Req> for Step<F>
where
    F: Fn(Arc<App>, Req, Next) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Answer> + Send + 'static,
{
    type Response = Answer;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Answer, Infallible>> + Send>>;

    // Always ready: the rest of the pipeline is made ready when the request is passed on.
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let answer = (self.run)(self.app.clone(), req, Next(self.rest.clone()));
        Box::pin(async move { Ok(answer.await) })
    }
}

/// The layer that puts `run` before the rest.
#[derive(Clone)]
pub struct StepLayer<F> {
    app: Arc<App>,
    run: F,
}

fn step<F>(app: &Arc<App>, run: F) -> StepLayer<F> {
    StepLayer {
        app: app.clone(),
        run,
    }
}

impl<F: Clone, S> Layer<S> for StepLayer<F>
where
    S: tower::Service<Req, Response = Answer, Error = Infallible> + Clone + Send + Sync + 'static,
    S::Future: Send + 'static,
{
    type Service = Step<F>;

    fn layer(&self, rest: S) -> Step<F> {
        Step {
            app: self.app.clone(),
            run: self.run.clone(),
            rest: BoxCloneSyncService::new(rest),
        }
    }
}

/// The whole pipeline, ending in the router.
pub fn pipeline(app: &Arc<App>) -> BoxCloneSyncService<Req, Answer, Infallible> {
    let router_app = app.clone();
    let router = tower::service_fn(move |req: Req| {
        let app = router_app.clone();
        async move {
            let path = req.uri().path().to_string();
            let Some(Acting { who, impersonated }) = req.extensions().get::<Acting>().cloned()
            else {
                return Ok::<_, Infallible>(refuse(&path, &ApiError::unauthorized()));
            };
            let answer = crate::router::serve(app, req, who, impersonated).await;
            Ok(answer.unwrap_or_else(|e| refuse(&path, &e)))
        }
    });
    let audited = app.config.audit.is_some();
    BoxCloneSyncService::new(
        ServiceBuilder::new()
            .layer(step(app, observe::observe))
            .layer(step(app, auth::identify))
            .option_layer(audited.then(|| step(app, audit::audit)))
            .layer(step(app, public))
            .layer(step(app, auth::authenticate))
            .layer(step(app, proxy))
            .layer(step(app, limits::limit))
            .service(router),
    )
}

impl App {
    /// Serves one request through the [pipeline](self).
    pub async fn handle<B>(self: &Arc<Self>, req: Request<B>) -> Answer
    where
        B: hyper::body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let req = req.map(|b| b.map_err(|e| BodyError(e.into())).boxed_unsync());
        Next(pipeline(self)).run(req).await
    }
}

/// A refusal, in the shape the request's API answers errors in.
pub fn refuse(path: &str, e: &ApiError) -> Answer {
    if crate::routes::is_dro_path(path) {
        crate::dro::error_response(e)
    } else {
        h::error(e)
    }
}

/// A body already read, to pass on.
pub(crate) fn read_body(bytes: Bytes) -> RequestBody {
    http_body_util::Full::new(bytes)
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// Step 4: the routes served before authentication.
async fn public(app: Arc<App>, req: Req, next: Next) -> Answer {
    let answered = app.public(req.uri().path(), req.method());
    match answered {
        Some(Ok(answer)) => answer,
        Some(Err(e)) => refuse(req.uri().path(), &e),
        None => next.run(req).await,
    }
}

/// Step 6: the cluster proxy and agents' tunnels.
async fn proxy(app: Arc<App>, req: Req, next: Next) -> Answer {
    let path = req.uri().path().to_string();
    let Some(target) = crate::proxy::target(&path) else {
        return next.run(req).await;
    };
    let Some(acting) = req.extensions().get::<Acting>().cloned() else {
        return refuse(&path, &ApiError::unauthorized());
    };
    match crate::proxy::serve(&app, &acting.who, target, req).await {
        Ok(answer) => answer,
        Err(e) => refuse(&path, &e),
    }
}
