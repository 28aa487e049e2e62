//! The registry: one operation on the served resources (get, list, watch, create, update,
//! patch, delete, delete a collection, write status, scale, a ServiceAccount's token) on
//! behalf of an identity, with a typed answer. Authorization happens here, once, for every
//! surface; admission (defaulting, validation, escalation checks, finalizers) and storage
//! happen in the operations (`read`, `write`, `watch`, `subresource`), with the admission
//! steps (`admit`, `validate`) they share.
//!
//! The surfaces are adapters: the Kubernetes REST API (`rest::serve`) decodes an HTTP request
//! into an [`Operation`] and encodes the [`Outcome`] as the client asked (JSON, a Table,
//! metadata only); the DRO-DS API (`dro::forward`) builds operations from its own requests and
//! maps an [`ApiError`] to its error codes, with no HTTP round trip in between.

use std::sync::Arc;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, Response, StatusCode};
use orrery_api::Object;
use orrery_api::validation::{FieldError, validate_object_meta};
use serde_json::Value;

use crate::app::App;
use crate::auth::{Attributes, Identity};
use crate::error::{ApiError, ApiResult};
use crate::http::{Body, Representation};
use crate::resources::{self, Registry, ResourceType};
use crate::schema::validate::{self as schema_check, Mode};
pub use options::{FieldValidation, Options};

pub mod options;
pub(crate) mod read;
pub mod register;
pub(crate) mod subresource;
pub(crate) mod watch;
pub(crate) mod write;

/// What a resource request addresses.
#[derive(Clone, Debug)]
pub struct Target {
    pub rt: Arc<ResourceType>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub subresource: Option<String>,
}

impl Target {
    pub fn key(&self) -> String {
        self.rt.key(
            self.namespace.as_deref().unwrap_or(""),
            self.name.as_deref().unwrap_or(""),
        )
    }
    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or("")
    }
}

/// The verb of a resource request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
    DeleteCollection,
}

impl Verb {
    pub fn as_str(&self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::DeleteCollection => "deletecollection",
        }
    }
}

fn not_found_path() -> ApiError {
    ApiError::new(
        404,
        "NotFound",
        "the server could not find the requested resource",
    )
}

/// Parses the path segments after `/api/v1` or `/apis/<group>/<version>`.
pub fn parse_target(reg: &Registry, group: &str, version: &str, seg: &[&str]) -> ApiResult<Target> {
    if seg.is_empty() || seg.iter().any(|s| s.is_empty()) {
        return Err(not_found_path());
    }
    let core_ns_sub = group.is_empty()
        && seg[0] == "namespaces"
        && seg.len() == 3
        && matches!(seg[2], "status" | "finalize");
    let (namespace, rest) = if seg[0] == "namespaces" && seg.len() >= 3 && !core_ns_sub {
        (Some(seg[1].to_string()), &seg[2..])
    } else {
        (None, seg)
    };
    if rest.len() > 3 {
        return Err(not_found_path());
    }
    let rt = reg
        .get(group, version, rest[0])
        .ok_or_else(not_found_path)?;
    if namespace.is_some() && !rt.namespaced {
        return Err(not_found_path());
    }
    let name = rest.get(1).map(|s| s.to_string());
    let subresource = rest.get(2).map(|s| s.to_string());
    if let Some(sub) = &subresource {
        let ok = match sub.as_str() {
            "status" => rt.status,
            "scale" => rt.scale.is_some(),
            "finalize" => rt.group.is_empty() && rt.kind == "Namespace",
            "token" => rt.group.is_empty() && rt.kind == "ServiceAccount",
            _ => false,
        };
        if !ok {
            return Err(not_found_path());
        }
    }
    // A named namespaced object needs its namespace in the path.
    if rt.namespaced && name.is_some() && namespace.is_none() {
        return Err(not_found_path());
    }
    Ok(Target {
        rt,
        namespace,
        name,
        subresource,
    })
}

/// The parts of a request the handlers need.
#[derive(Debug)]
pub struct Call<'a> {
    pub app: &'a Arc<App>,
    /// Who asks (authorized already; RBAC writes are checked for escalation with it).
    pub who: &'a crate::auth::Identity,
    pub target: Target,
    pub options: Options,
    pub envelope: Envelope,
    pub representation: Representation,
    pub warnings: Vec<String>,
}

/// What the registry reads of a request's HTTP headers, and nothing else: how its body is
/// encoded and which client wrote it (a field manager's default name). The HTTP layer
/// makes it; in-process callers name it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Envelope {
    /// The body's media type, as given (a body without one is read as JSON; a patch without
    /// one is refused).
    pub content_type: Option<String>,
    pub user_agent: Option<String>,
}

impl Envelope {
    /// A body of `content_type` from Orrery itself.
    pub fn of_type(content_type: &str) -> Self {
        Envelope {
            content_type: Some(content_type.to_string()),
            user_agent: None,
        }
    }

    /// What a request's headers say.
    pub fn of(headers: &HeaderMap) -> Self {
        let text = |name| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        Envelope {
            content_type: text(CONTENT_TYPE),
            user_agent: text(http::header::USER_AGENT),
        }
    }
}

/// A request body (JSON, YAML, or the protobuf of a built-in kind whose OpenAPI component is
/// `component`): parsed, with the paths of duplicate keys.
pub fn decode_body(
    envelope: &Envelope,
    body: &Bytes,
    component: &str,
) -> ApiResult<(Value, Vec<String>)> {
    let ct = envelope
        .content_type
        .as_deref()
        .unwrap_or("application/json");
    let base = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    match base.as_str() {
        "application/json" | "" => schema_check::parse_json(body)
            .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}"))),
        "application/vnd.kubernetes.protobuf" => crate::protobuf::decode(body, component)
            .map(|v| (v, Vec::new()))
            .map_err(|e| match e {
                crate::protobuf::ProtobufError::Unknown(_) => ApiError::unsupported_media_type(ct),
                other => ApiError::bad_request(format!(
                    "the request body is not valid protobuf: {other}"
                )),
            }),
        "application/yaml" | "application/x-yaml" | "text/yaml" => {
            let v: Value = serde_saphyr::from_slice(body).map_err(|e| {
                ApiError::bad_request(format!("the request body is not valid YAML: {e}"))
            })?;
            Ok((v, Vec::new()))
        }
        _ => Err(ApiError::unsupported_media_type(ct)),
    }
}

/// Everything done to an incoming object before it is stored: type and schema checks,
/// undeclared fields per `fieldValidation`, metadata rules, and the kind's own rules.
pub fn admit(
    call: &mut Call<'_>,
    raw: &mut Value,
    dups: &[String],
    validation: FieldValidation,
) -> ApiResult<Object> {
    let rt = call.target.rt.clone();
    let Value::Object(map) = &*raw else {
        return Err(ApiError::bad_request(format!(
            "the body must be a {} object",
            rt.kind
        )));
    };
    // apiVersion and kind, if given, must be this resource's.
    if let Some(v) = map.get("apiVersion").and_then(Value::as_str)
        && !v.is_empty()
        && v != rt.api_version()
    {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({v}) does not match the expected API version ({})",
            rt.api_version()
        )));
    }
    if let Some(k) = map.get("kind").and_then(Value::as_str)
        && !k.is_empty()
        && k != rt.kind
    {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({k}) does not match the expected kind ({})",
            rt.kind
        )));
    }
    let set = call.app.schemas.set();
    let findings = match set.get(&rt.schema) {
        Some(schema) => {
            let schema = schema.clone();
            let mode = if rt.is_crd() {
                Mode::Structural
            } else {
                Mode::Open
            };
            schema_check::check(&set, &schema, raw, mode)
        }
        None => Default::default(),
    };
    let name = raw
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or(call.target.name())
        .to_string();
    let field_errors = findings.errors;
    match validation {
        // As kube-apiserver: a decoding error (400), found before validation, whatever
        // else is wrong (clients such as kopf and the Python client tell the two apart).
        FieldValidation::Strict if !findings.unknown.is_empty() || !dups.is_empty() => {
            let mut what: Vec<String> = findings
                .unknown
                .iter()
                .map(|u| format!("unknown field \"{u}\""))
                .collect();
            what.extend(dups.iter().map(|d| format!("duplicate field \"{d}\"")));
            return Err(ApiError::bad_request(format!(
                "{} in version \"{}\" cannot be handled as a {}: strict decoding error: {}",
                rt.kind,
                rt.version,
                rt.kind,
                what.join(", ")
            )));
        }
        FieldValidation::Strict => {}
        // The spec of Orrery's own kinds (Karmada's policies among them) loses a field only when
        // the client says so (Ignore): a policy stored without a field Orrery does not know
        // would place differently than its author meant. Kubernetes would prune it with a
        // warning, as is done here for the rest of the object.
        FieldValidation::Warn
            if rt.origin == resources::Origin::Own
                && findings.unknown.iter().any(|u| u.starts_with("spec.")) =>
        {
            let errs: Vec<FieldError> = findings
                .unknown
                .iter()
                .filter(|u| u.starts_with("spec."))
                .map(|u| FieldError::forbidden(u, "field not declared in the schema"))
                .collect();
            return Err(ApiError::invalid(&rt, &name, &errs));
        }
        FieldValidation::Warn => {
            call.warnings.extend(
                findings
                    .unknown
                    .iter()
                    .map(|u| format!("unknown field \"{u}\"")),
            );
            call.warnings
                .extend(dups.iter().map(|d| format!("duplicate field \"{d}\"")));
        }
        FieldValidation::Ignore => {}
    }
    if !field_errors.is_empty() {
        return Err(ApiError::invalid(&rt, &name, &field_errors));
    }
    let mut obj: Object = serde_json::from_value(raw.clone()).map_err(|e| {
        ApiError::bad_request(format!(
            "{} in version \"{}\" cannot be handled as a {}: {e}",
            rt.kind, rt.version, rt.kind
        ))
    })?;
    // Stored at the storage version (an older version's object reads the same at it).
    obj.api_version = rt.storage_api_version();
    obj.kind = rt.kind.clone();
    call.warnings.extend(orrery_api::policy::warnings(
        &obj.api_version,
        &obj.kind,
        obj.spec.as_ref(),
    ));
    Ok(obj)
}

/// Metadata and kind validation of an object about to be stored.
pub fn validate(call: &Call<'_>, obj: &Object, old: Option<&Object>) -> ApiResult<()> {
    validate_object(call.app, &call.target.rt, obj, old)?;
    if call.target.rt.group == crate::rbac::GROUP {
        // Nobody grants what they do not hold.
        call.app.authz.admit(call.who, obj)?;
    }
    Ok(())
}

/// The admission checks that read the store ([`crate::admission`]) on a write of the call's
/// target; status writes are not checked (they change no one's intent).
pub async fn check_admission(call: &Call<'_>, obj: &Object, old: Option<&Object>) -> ApiResult<()> {
    if call.target.subresource.as_deref() == Some("status") {
        return Ok(());
    }
    let ric = &orrery_api::kinds::RESOURCE_INTERPRETER_CUSTOMIZATION;
    if call.target.rt.group == ric.group && call.target.rt.plural == ric.plural {
        crate::admission::customization_conflicts(call.app.store.as_ref(), obj).await?;
    }
    crate::admission::run(
        &call.app.config.admission,
        call.app.store.as_ref(),
        obj,
        old,
    )
    .await
}

/// The same, for writes made outside a resource request (agent registration, batch status).
pub fn validate_object(
    app: &App,
    rt: &ResourceType,
    obj: &Object,
    old: Option<&Object>,
) -> ApiResult<()> {
    let mut errs = validate_object_meta(&obj.metadata, rt.namespaced, rt.name_rule);
    errs.extend(crate::strategy::validate(rt, obj, old));
    if let Some(old) = old
        && crate::crd::is_own_crd(rt, old)
    {
        return Err(read_only(rt, old.name()));
    }
    if rt.group == "apiextensions.k8s.io" {
        let resources = app.resources.clone();
        let reserved = move |g: &str| resources.is_builtin_group(g);
        errs.extend(crate::crd::validate(obj, old, &reserved));
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(rt, obj.name(), &errs))
    }
}

/// The refusal to change a CRD describing one of Orrery's own kinds.
pub fn read_only(rt: &ResourceType, name: &str) -> ApiError {
    ApiError::method_not_allowed(format!(
        "{} \"{name}\" describes one of Orrery's own kinds and is read-only",
        rt.plural
    ))
}

/// One object, as an operation's answer.
pub fn respond_object(
    call: &Call<'_>,
    status: StatusCode,
    obj: impl Into<Arc<Object>>,
) -> ApiResult<Outcome> {
    let obj: Arc<Object> = obj.into();
    let rt = &call.target.rt;
    // Answered at the version asked for (it may be stored at another).
    let obj = if obj.kind == rt.kind && obj.api_version != rt.api_version() {
        Arc::new(read::present(rt, (*obj).clone()))
    } else {
        obj
    };
    Ok(Outcome::object(call, status, obj))
}

/// How an authorized operation arrives: its options and body as the REST surface received
/// them (in-process callers give an [`Input`] instead).
#[derive(Debug)]
pub struct Operation {
    /// What Kubernetes takes in the query (`dryRun`, `fieldManager`, selectors...), typed.
    pub options: Options,
    /// How the body is encoded, and who wrote it.
    pub envelope: Envelope,
    /// How lists and watches are encoded (they are encoded while they are read).
    pub representation: Representation,
    pub body: Bytes,
}

/// What an in-process caller (the DRO-DS API) asks of one object, typed: the verb and what it
/// takes. No Kubernetes path, method or content type is built to ask it.
#[derive(Clone, Debug)]
pub enum Input {
    Get,
    Create(Value),
    /// A whole object, guarded by the `resourceVersion` it carries.
    Update(Value),
    /// A JSON merge patch (RFC 7386).
    MergePatch(Value),
    /// A delete, of this incarnation only when `uid` is given.
    Delete {
        uid: Option<String>,
    },
}

impl Input {
    pub fn verb(&self) -> Verb {
        match self {
            Input::Get => Verb::Get,
            Input::Create(_) => Verb::Create,
            Input::Update(_) => Verb::Update,
            Input::MergePatch(_) => Verb::Patch,
            Input::Delete { .. } => Verb::Delete,
        }
    }

    /// The body the registry's verbs read, and its content type.
    fn encode(&self) -> (Option<Value>, &'static str) {
        match self {
            Input::Get => (None, "application/json"),
            Input::Create(v) | Input::Update(v) => (Some(v.clone()), "application/json"),
            Input::MergePatch(v) => (Some(v.clone()), "application/merge-patch+json"),
            Input::Delete { uid } => (
                uid.as_ref().map(|uid| {
                    serde_json::json!({
                        "apiVersion": "v1", "kind": "DeleteOptions",
                        "preconditions": { "uid": uid },
                    })
                }),
                "application/json",
            ),
        }
    }
}

impl Target {
    /// One object of an own kind (`namespace` is ignored for cluster-scoped kinds), or its
    /// collection when `name` is `None`.
    pub fn own(
        app: &App,
        kind: &orrery_api::kinds::Descriptor,
        namespace: Option<&str>,
        name: Option<&str>,
    ) -> ApiResult<Target> {
        let rt = app
            .resources
            .snapshot()
            .get(kind.group, kind.version, kind.plural)
            .ok_or_else(not_found_path)?;
        Ok(Target {
            namespace: namespace.filter(|_| rt.namespaced).map(str::to_string),
            rt,
            name: name.map(str::to_string),
            subresource: None,
        })
    }
}

/// Runs `input` on `target` as `who`: authorized, admitted, validated and stored as a REST
/// request is. The request body the caller gave, if any, is returned with the answer (for
/// its audit record).
pub async fn run(
    app: &Arc<App>,
    who: &Identity,
    target: Target,
    input: Input,
) -> (Option<Value>, ApiResult<Outcome>) {
    let (body, content_type) = input.encode();
    let result = async {
        let authorized = authorize(app, who, &target, input.verb())?;
        let bytes = match &body {
            Some(v) => {
                Bytes::from(serde_json::to_vec(v).map_err(|e| ApiError::internal(e.to_string()))?)
            }
            None => Bytes::new(),
        };
        let op = Operation {
            options: Options::default(),
            envelope: Envelope::of_type(content_type),
            representation: Representation::Json,
            body: bytes,
        };
        operate(app, authorized, op).await
    }
    .await;
    (body, result)
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

/// Proof that `who` may run `verb` on `target`: only [`authorize`] makes one, and
/// [`operate`] runs exactly the verb on the target it names, so no operation runs
/// unauthorized and an authorization for one object cannot be spent on another.
#[derive(Debug)]
pub struct Authorized<'a> {
    who: &'a Identity,
    target: Target,
    verb: Verb,
}

impl Authorized<'_> {
    pub fn target(&self) -> &Target {
        &self.target
    }

    pub fn verb(&self) -> Verb {
        self.verb
    }
}

/// Whether `who` may run `verb` on `target` (before its body is even read).
pub fn authorize<'a>(
    app: &App,
    who: &'a Identity,
    target: &Target,
    verb: Verb,
) -> ApiResult<Authorized<'a>> {
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
    Ok(Authorized {
        who,
        target: target.clone(),
        verb,
    })
}

/// Leave to write the status of one object, and of that object only.
#[derive(Debug)]
pub struct StatusGrant {
    who: Identity,
    /// The object's `status` subresource.
    target: Target,
}

impl StatusGrant {
    /// The name of the object whose status may be written.
    pub fn name(&self) -> &str {
        self.target.name.as_deref().unwrap_or_default()
    }
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
    let authorized = authorize(app, who, &target, Verb::Update)?;
    Ok(StatusGrant {
        who: who.clone(),
        target: authorized.target,
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
    let t = &grant.target;
    let written = write::update_status(
        app,
        &t.rt,
        t.namespace.as_deref(),
        grant.name(),
        expected,
        check,
        f,
    )
    .await;
    if app.config.audit.is_some() {
        let code = written.as_ref().map_or_else(|e| e.code, |_| 200);
        let response = written.as_ref().ok().map(|o| o.to_value());
        audit(app, &grant.who, "update", t, code, None, response.as_ref()).await;
    }
    written
}

/// Carries out the operation `authorized` names.
pub async fn operate(
    app: &Arc<App>,
    authorized: Authorized<'_>,
    op: Operation,
) -> ApiResult<Outcome> {
    let Authorized { who, target, verb } = authorized;
    let call = Call {
        app,
        who,
        target,
        options: op.options,
        envelope: op.envelope,
        representation: op.representation,
        warnings: Vec::new(),
    };
    let body = &op.body;
    match (verb, call.target.subresource.as_deref()) {
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

/// Lists the objects `target` names (`options`: selectors), authorized as `list`; parsed,
/// for in-process callers (a REST list is encoded as it is read instead).
pub async fn list(
    app: &Arc<App>,
    who: &Identity,
    target: Target,
    options: Options,
) -> ApiResult<Vec<Object>> {
    authorize(app, who, &target, Verb::List)?;
    let call = Call {
        app,
        who,
        target,
        options,
        envelope: Envelope::default(),
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
pub struct RequestOrigin {
    pub source_ips: Vec<String>,
    pub user_agent: String,
}

tokio::task_local! {
    /// The origin of the DRO-DS request being served, set around it by the router.
    pub static ORIGIN: RequestOrigin;
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
    let origin = ORIGIN.try_with(RequestOrigin::clone).unwrap_or_default();
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
