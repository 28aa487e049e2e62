//! The registry: one operation on the served resources (get, list, watch, create, update,
//! patch, delete, delete a collection, write status, scale, a ServiceAccount's token) on
//! behalf of an identity, with a typed answer. Authorization happens here, once, for every
//! surface; admission (defaulting, validation, escalation checks, finalizers) and storage
//! happen in the operations (`rest::{read, write, watch, subresource}`).
//!
//! The surfaces are adapters: the Kubernetes REST API (`rest::serve`) decodes an HTTP request
//! into an [`Operation`] and encodes the [`Outcome`] as the client asked (JSON, a Table,
//! metadata only); the DRO-DS API (`dro::forward`) builds operations from its own requests and
//! maps an [`ApiError`] to its error codes, with no HTTP round trip in between.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, Response, StatusCode};
use orrery_api::Object;
use serde_json::Value;

use crate::app::App;
use crate::auth::{Attributes, Identity};
use crate::error::{ApiError, ApiResult};
use crate::http::{Body, Query, Representation};
use crate::resources::ResourceType;
use crate::rest::{self, Call, Target, Verb, read, subresource, watch, write};

/// One operation: who asks, on what, with which options and body.
#[derive(Debug)]
pub struct Operation<'a> {
    pub who: &'a Identity,
    pub target: Target,
    pub verb: Verb,
    /// Options as Kubernetes takes them in the query (`dryRun`, `fieldManager`, selectors...).
    pub query: Query,
    /// The body's content type.
    pub headers: &'a HeaderMap,
    /// How lists and watches are encoded (they are encoded while they are read).
    pub representation: Representation,
    pub body: Bytes,
}

/// What an operation answers, before a surface encodes it.
#[derive(Debug)]
pub struct Outcome {
    pub status: StatusCode,
    pub payload: Payload,
    /// Warnings for the client (Kubernetes' `Warning: 299` headers).
    pub warnings: Vec<String>,
}

#[derive(Debug)]
pub enum Payload {
    /// One object (get, create, update, patch, delete, status), shared with the store's cache
    /// where it came from there.
    Object(Arc<Object>),
    /// A value that is not a stored object: a Scale, a TokenRequest, what a deleted
    /// collection held.
    Value(Value),
    /// Lists and watches, encoded as the client asked while they are read from the store (a
    /// large list never exists parsed all at once; a watch streams).
    Encoded(Response<Body>),
}

impl Outcome {
    pub fn object(call: &Call<'_>, status: StatusCode, obj: Arc<Object>) -> Self {
        Outcome {
            status,
            payload: Payload::Object(obj),
            warnings: call.warnings.clone(),
        }
    }

    pub fn value(call: &Call<'_>, status: StatusCode, value: Value) -> Self {
        Outcome {
            status,
            payload: Payload::Value(value),
            warnings: call.warnings.clone(),
        }
    }

    pub fn encoded(response: Response<Body>) -> Self {
        Outcome {
            status: response.status(),
            payload: Payload::Encoded(response),
            warnings: Vec::new(),
        }
    }

    /// The answer as JSON (`Encoded` lists are read back; only in-process callers that list
    /// ask for this).
    pub fn into_value(self) -> Value {
        match self.payload {
            Payload::Object(o) => o.to_value(),
            Payload::Value(v) => v,
            Payload::Encoded(_) => Value::Null,
        }
    }
}

/// Whether a verb takes a body.
pub fn needs_body(verb: Verb) -> bool {
    matches!(
        verb,
        Verb::Create | Verb::Update | Verb::Patch | Verb::Delete | Verb::DeleteCollection
    )
}

/// Proof that an operation was authorized: [`operate`] takes one, and only [`authorize`]
/// makes one, so no operation runs unauthorized and none is authorized twice.
#[derive(Debug)]
pub struct Authorized(());

/// Whether `who` may run `verb` on `target` (before its body is even read).
pub fn authorize(app: &App, who: &Identity, target: &Target, verb: Verb) -> ApiResult<Authorized> {
    app.authz.authorize(
        who,
        &Attributes {
            verb: verb.as_str(),
            group: &target.rt.group,
            resource: &target.rt.plural,
            subresource: target.subresource.as_deref(),
            namespace: target.namespace.as_deref(),
            name: target.name.as_deref(),
        },
    )?;
    Ok(Authorized(()))
}

/// Leave to write the status of one object, and of that object only.
#[derive(Debug)]
pub struct StatusGrant {
    who: Identity,
    rt: Arc<ResourceType>,
    namespace: Option<String>,
    name: String,
}

/// Whether `who` may write the status of one object (`update` on `<plural>/status`): for the
/// status writes that are not REST requests (the DRO-DS status sync and metrics reports).
pub fn authorize_status(
    app: &App,
    who: &Identity,
    rt: &Arc<ResourceType>,
    namespace: Option<&str>,
    name: &str,
) -> ApiResult<StatusGrant> {
    let target = Target {
        rt: rt.clone(),
        namespace: namespace.map(str::to_string),
        name: Some(name.to_string()),
        subresource: Some("status".into()),
    };
    authorize(app, who, &target, Verb::Update)?;
    Ok(StatusGrant {
        who: who.clone(),
        rt: rt.clone(),
        namespace: namespace.map(str::to_string),
        name: name.to_string(),
    })
}

/// Writes the status of the object `grant` names (see [`write::update_status`]: `f` computes
/// the status from the stored object, again on each retry after a conflict).
pub async fn update_status(
    app: &App,
    grant: &StatusGrant,
    expected: Option<orrery_store::Revision>,
    check: write::StatusCheck,
    f: impl FnMut(&Object) -> ApiResult<Value>,
) -> ApiResult<Arc<Object>> {
    let written = write::update_status(
        app,
        &grant.rt,
        grant.namespace.as_deref(),
        &grant.name,
        expected,
        check,
        f,
    )
    .await;
    if app.config.audit.is_some() {
        let target = Target {
            rt: grant.rt.clone(),
            namespace: grant.namespace.clone(),
            name: Some(grant.name.clone()),
            subresource: Some("status".into()),
        };
        let code = written.as_ref().map_or_else(|e| e.code, |_| 200);
        let response = written.as_ref().ok().map(|o| o.to_value());
        audit(
            app,
            &grant.who,
            "update",
            &target,
            code,
            None,
            response.as_ref(),
        )
        .await;
    }
    written
}

/// Carries out an authorized operation.
pub async fn operate(app: &Arc<App>, op: Operation<'_>, _: Authorized) -> ApiResult<Outcome> {
    let call = Call {
        app,
        who: op.who,
        target: op.target,
        query: op.query,
        headers: op.headers,
        representation: op.representation,
        warnings: Vec::new(),
    };
    let body = &op.body;
    match (op.verb, call.target.subresource.as_deref()) {
        (Verb::Get, None) => read::get(call).await,
        (Verb::List, _) => read::list(call).await,
        (Verb::Watch, _) => watch::watch(call).await,
        (Verb::Create, Some("token")) => subresource::create_token(call, body).await,
        (Verb::Create, _) => write::create(call, body).await,
        (Verb::Update, None) => write::update(call, body).await,
        (Verb::Patch, None) => write::patch(call, body).await,
        (Verb::Delete, _) => write::delete(call, body).await,
        (Verb::DeleteCollection, _) => write::delete_collection(call, body).await,
        (Verb::Get, Some("status")) => read::get(call).await,
        (Verb::Update, Some("status")) => write::update(call, body).await,
        (Verb::Patch, Some("status")) => write::patch(call, body).await,
        (Verb::Get, Some("scale")) => subresource::get_scale(call).await,
        (Verb::Update, Some("scale")) => subresource::update_scale(call, body).await,
        (Verb::Patch, Some("scale")) => subresource::patch_scale(call, body).await,
        (Verb::Update, Some("finalize")) => subresource::finalize(call, body).await,
        _ => Err(ApiError::method_not_allowed(
            "the server does not allow this method on the requested resource",
        )),
    }
}

/// Lists the objects `target` names (`query`: selectors), authorized as `list`; parsed, for
/// in-process callers (a REST list is encoded as it is read instead).
pub async fn list(
    app: &Arc<App>,
    who: &Identity,
    target: Target,
    query: Query,
) -> ApiResult<Vec<Object>> {
    authorize(app, who, &target, Verb::List)?;
    let headers = HeaderMap::new();
    let call = Call {
        app,
        who,
        target,
        query,
        headers: &headers,
        representation: Representation::Json,
        warnings: Vec::new(),
    };
    read::objects(&call).await
}

/// The Kubernetes API path of a target (what an audit Event shows as its `requestURI`).
fn path_of(t: &Target) -> String {
    let rt = &t.rt;
    let mut p = if rt.group.is_empty() {
        format!("/api/{}", rt.version)
    } else {
        format!("/apis/{}/{}", rt.group, rt.version)
    };
    if let Some(ns) = &t.namespace {
        p.push_str(&format!("/namespaces/{ns}"));
    }
    p.push('/');
    p.push_str(&rt.plural);
    for part in [&t.name, &t.subresource].into_iter().flatten() {
        p.push('/');
        p.push_str(part);
    }
    p
}

/// Where the request that runs operations in process came from (for their audit Events).
#[derive(Clone, Debug, Default)]
pub struct Origin {
    pub source_ips: Vec<String>,
    pub user_agent: String,
}

tokio::task_local! {
    /// The origin of the DRO-DS request being served, set around it by the router.
    pub static ORIGIN: Origin;
}

/// Records an operation that a surface other than the Kubernetes REST API ran (the DRO-DS
/// API: its own HTTP request is logged by its path) as the registry operation it was, with
/// its user, verb, object and answer's code, at the level the audit policy gives it.
pub async fn audit(
    app: &App,
    who: &Identity,
    verb: &str,
    target: &Target,
    code: u16,
    request: Option<&Value>,
    response: Option<&Value>,
) {
    use crate::audit::{Level, ObjectRef, Record, RequestInfo, Stage};
    let Some(log) = &app.config.audit else {
        return;
    };
    let rt = &target.rt;
    let info = RequestInfo {
        verb: verb.to_string(),
        path: path_of(target),
        object: Some(ObjectRef {
            resource: rt.plural.clone(),
            namespace: target.namespace.clone().unwrap_or_default(),
            name: target.name.clone().unwrap_or_default(),
            api_group: rt.group.clone(),
            api_version: rt.version.clone(),
            subresource: target.subresource.clone().unwrap_or_default(),
        }),
    };
    let decision = log.policy.decide(Some(who), &info);
    if decision.level == Level::None {
        return;
    }
    let uri = info.path.clone();
    let origin = ORIGIN.try_with(Origin::clone).unwrap_or_default();
    let mut rec = Record::new(
        decision,
        info,
        Some(who),
        uri,
        origin.user_agent,
        origin.source_ips,
    );
    rec.request_object = request.cloned();
    rec.response_object = response.cloned();
    if let Some(line) = rec.line(Stage::ResponseComplete, Some(code)) {
        log.write(line).await;
    }
}

/// The operation a path of the Kubernetes API names (`/api/v1/...`, `/apis/G/V/...`), for
/// in-process callers that address resources as Kubernetes paths do.
pub fn target_of(app: &App, path: &str) -> ApiResult<Target> {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let reg = app.resources.snapshot();
    match segments.as_slice() {
        ["api", "v1", rest @ ..] => rest::parse_target(&reg, "", "v1", rest),
        ["apis", group, version, rest @ ..] => rest::parse_target(&reg, group, version, rest),
        _ => Err(ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )),
    }
}
