//! The Kubernetes REST verbs over the store: request parsing, admission (schema, metadata and
//! kind rules, `fieldValidation`), and dispatch to the handlers in the submodules.

use std::sync::Arc;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{HeaderMap, Method, Response, StatusCode};
use orrery_api::Object;
use orrery_api::validation::{FieldError, validate_object_meta};
use serde_json::Value;

use crate::app::App;
use crate::error::{ApiError, ApiResult};
use crate::http::{self as h, Body, Query, Representation};
use crate::registry::{self, Operation, Outcome, Payload};
use crate::resources::{Origin, Registry, ResourceType};
use crate::schema::validate::{self as schema_check, Mode};
use crate::table::{self, IncludeObject};

pub(crate) mod read;
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

/// How undeclared and duplicate fields are treated (`?fieldValidation=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldValidation {
    Ignore,
    Warn,
    Strict,
}

impl FieldValidation {
    pub fn parse(q: &Query) -> ApiResult<Self> {
        match q.get("fieldValidation") {
            None | Some("Warn") => Ok(FieldValidation::Warn),
            Some("Strict") => Ok(FieldValidation::Strict),
            Some("Ignore") => Ok(FieldValidation::Ignore),
            Some(other) => Err(ApiError::bad_request(format!(
                "fieldValidation must be one of \"Ignore\", \"Warn\" or \"Strict\", got {other:?}"
            ))),
        }
    }
}

/// Whether the request only pretends to write (`?dryRun=All`).
pub fn dry_run(q: &Query) -> ApiResult<bool> {
    match q.get("dryRun") {
        None => Ok(false),
        Some("All") => Ok(true),
        Some(other) => Err(ApiError::bad_request(format!(
            "dryRun must be \"All\", got {other:?}"
        ))),
    }
}

/// The parts of a request the handlers need.
#[derive(Debug)]
pub struct Call<'a> {
    pub app: &'a Arc<App>,
    /// Who asks (authorized already; RBAC writes are checked for escalation with it).
    pub who: &'a crate::auth::Identity,
    pub target: Target,
    pub query: Query,
    pub headers: &'a HeaderMap,
    pub representation: Representation,
    pub warnings: Vec<String>,
}

/// A request body (JSON, YAML, or the protobuf of a built-in kind whose OpenAPI component is
/// `component`): parsed, with the paths of duplicate keys.
pub fn decode_body(
    headers: &HeaderMap,
    body: &Bytes,
    component: &str,
) -> ApiResult<(Value, Vec<String>)> {
    let ct = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
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
            if rt.origin == Origin::Own
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
    obj.api_version = rt.api_version();
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
    Ok(Outcome::object(call, status, obj.into()))
}

/// An operation's answer in the representation the client asked for.
pub fn encode(
    rt: &ResourceType,
    representation: Representation,
    include_object: Option<&str>,
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
            Representation::Table => {
                let include =
                    IncludeObject::parse(include_object).map_err(ApiError::bad_request)?;
                table::table(
                    rt,
                    std::slice::from_ref(&*obj),
                    &obj.metadata.resource_version,
                    None,
                    include,
                )
            }
        },
    };
    Ok(with_warnings(h::json(out.status, &value), &out.warnings))
}

/// Adds `Warning: 299` headers.
pub fn with_warnings(mut r: Response<Body>, warnings: &[String]) -> Response<Body> {
    for w in warnings {
        let text = format!("299 - \"{}\"", w.replace('"', "\\\""));
        if let Ok(v) = HeaderValue::from_str(&text) {
            r.headers_mut().append("Warning", v);
        }
    }
    r
}

/// Serves one resource request: the Kubernetes REST surface of the registry.
pub async fn serve<B>(call: Call<'_>, method: &Method, body: B) -> ApiResult<Response<Body>>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let verb = verb(method, &call.target, &call.query)?;
    // Authorized before the body is read: a refused caller uploads nothing.
    let authorized = registry::authorize(call.app, call.who, &call.target, verb)?;
    let body = if registry::needs_body(verb) {
        h::read_body(body, call.app.config.max_body_bytes).await?
    } else {
        Bytes::new()
    };
    let rt = call.target.rt.clone();
    let include = call.query.get("includeObject").map(str::to_string);
    let representation = call.representation;
    let op = Operation {
        who: call.who,
        target: call.target,
        verb,
        query: call.query,
        headers: call.headers,
        representation,
        body,
    };
    let out = registry::operate(call.app, op, authorized).await?;
    encode(&rt, representation, include.as_deref(), out)
}
