//! The Kubernetes REST surface of the registry: an HTTP request becomes a registry
//! [`Operation`] (its verb from the method and query), and the [`Outcome`] is encoded as the
//! client asked (JSON, a Table, metadata only), with warnings as `Warning` headers.

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Response};

use crate::app::App;
use crate::auth::Identity;
use crate::error::{ApiError, ApiResult};
use crate::http::{self as h, Body, Query, Representation, with_warnings};
use crate::registry::{self, Envelope, Operation, Options, Outcome, Payload, Target, Verb};
use crate::resources::ResourceType;
use crate::table::{self, IncludeObject};

/// What the HTTP layer read of a resource request: its target (from the path), the options
/// in its query, how its body is encoded and how it wants its answer.
#[derive(Debug)]
pub struct Request {
    pub target: Target,
    pub query: Query,
    pub envelope: Envelope,
    pub representation: Representation,
}

/// Maps method and target to a verb.
pub fn verb(method: &Method, target: &Target, query: &Query) -> ApiResult<Verb> {
    let named = target.name.is_some();
    let sub = target.subresource.is_some();
    let v = match (method, named) {
        (&Method::GET, false) => {
            if query.flag("watch")? {
                Verb::Watch
            } else {
                Verb::List
            }
        }
        (&Method::GET, true) => {
            if query.flag("watch")? && !sub {
                Verb::Watch
            } else {
                Verb::Get
            }
        }
        (&Method::POST, false) if !sub => Verb::Create,
        (&Method::POST, true) if target.subresource.as_deref() == Some("token") => Verb::Create,
        (&Method::PUT, true) => Verb::Update,
        (&Method::PATCH, true) => Verb::Patch,
        (&Method::DELETE, true) if !sub => Verb::Delete,
        (&Method::DELETE, false) => Verb::DeleteCollection,
        _ => {
            return Err(ApiError::method_not_allowed(format!(
                "the server does not allow this method on the requested resource ({method} {})",
                target.rt.qualified()
            )));
        }
    };
    Ok(v)
}

/// An operation's answer in the representation the client asked for.
pub fn encode(
    rt: &ResourceType,
    representation: Representation,
    include: IncludeObject,
    out: Outcome,
) -> ApiResult<Response<Body>> {
    let value = match out.payload {
        Payload::Encoded(r) => return Ok(r),
        Payload::Value(v) => v,
        Payload::Object(obj) => match representation {
            Representation::Json => obj.to_value(),
            Representation::Metadata => serde_json::json!({
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": serde_json::to_value(&obj.metadata).unwrap_or_default(),
            }),
            Representation::Table => table::table(
                rt,
                std::slice::from_ref(&*obj),
                &obj.metadata.resource_version,
                None,
                include,
            ),
        },
    };
    Ok(with_warnings(h::json(out.status, &value), &out.warnings))
}

/// Serves one resource request: the Kubernetes REST surface of the registry.
pub async fn serve<B>(
    app: &Arc<App>,
    who: &Identity,
    request: Request,
    method: &Method,
    body: B,
) -> ApiResult<Response<Body>>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let Request {
        target,
        query,
        envelope,
        representation,
    } = request;
    let verb = verb(method, &target, &query)?;
    // Authorized before the body is read: a refused caller uploads nothing.
    let authorized = registry::authorize(app, who, &target, verb)?;
    crate::trace::step("authorized");
    let options = Options::parse(verb, representation, &query)?;
    let body = if registry::needs_body(verb) {
        let b = h::read_body(body, app.config.max_body_bytes).await?;
        crate::trace::step("body");
        b
    } else {
        Bytes::new()
    };
    let rt = target.rt.clone();
    let include = options.include_object;
    let op = Operation {
        options,
        envelope,
        representation,
        body,
    };
    // Boxed: the operation's future holds the largest of every verb's states, and a request's
    // future (on its connection's task, in flight by the thousand) should not.
    let out = Box::pin(registry::operate(app, authorized, op)).await?;
    let answer = encode(&rt, representation, include, out);
    crate::trace::step("encoded");
    answer
}
