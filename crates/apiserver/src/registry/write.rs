//! create, update, patch, delete, deletecollection.

use bytes::Bytes;
use http::StatusCode;
use orrery_api::{Object, Time};
use orrery_store::{ListOptions, Preconditions, Revision, StoreError};
use serde_json::{Value, json};

use super::Outcome;
use super::read::{present, selectors};
use super::{Call, FieldValidation, admit, decode_body, respond_object, validate};
use crate::error::{ApiError, ApiResult};
use crate::patch::{self, Meta, PatchType};
use crate::resources::ResourceType;
use crate::strategy;

/// Attempts at a read-modify-write before giving up on a busy object.
const RETRIES: usize = 8;
/// How long a write without a precondition keeps trying a busy object after [`RETRIES`]
/// (many writers of one object at once: a patch that asked for no particular version is not
/// refused for another's, as kube-apiserver's `GuaranteedUpdate` retries until its deadline).
const CONFLICT_BUDGET: std::time::Duration = std::time::Duration::from_secs(10);

/// Whether a write that met a newer version after its first attempts tries once more: when it
/// asked for no version, after a short random pause, until [`CONFLICT_BUDGET`] is spent.
async fn keep_trying(unconditional: bool, started: std::time::Instant) -> bool {
    if !unconditional || started.elapsed() >= CONFLICT_BUDGET {
        return false;
    }
    let mut b = [0u8; 1];
    let _ = getrandom::fill(&mut b);
    tokio::time::sleep(std::time::Duration::from_millis(1 + u64::from(b[0] % 20))).await;
    true
}

fn random_suffix() -> String {
    // The alphabet of Kubernetes' generated names: no vowels, no look-alikes.
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut b = [0u8; 5];
    let _ = getrandom::fill(&mut b);
    b.iter()
        .map(|x| ALPHABET[*x as usize % ALPHABET.len()] as char)
        .collect()
}

fn set_meta_string(raw: &mut Value, field: &str, value: &str) {
    if let Value::Object(m) = raw {
        let meta = m.entry("metadata").or_insert_with(|| json!({}));
        if let Value::Object(meta) = meta {
            meta.insert(field.into(), json!(value));
        }
    }
}

/// Makes the body's namespace agree with the URL's.
fn reconcile_namespace(call: &Call<'_>, raw: &mut Value) -> ApiResult<()> {
    let rt = &call.target.rt;
    let in_body = raw
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if rt.namespaced {
        let Some(ns) = call.target.namespace.clone() else {
            return Err(ApiError::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            ));
        };
        if !in_body.is_empty() && in_body != ns {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        set_meta_string(raw, "namespace", &ns);
    } else if !in_body.is_empty() {
        // Cluster-scoped objects have no namespace.
        if let Some(Value::Object(meta)) = raw.get_mut("metadata") {
            meta.remove("namespace");
        }
    }
    Ok(())
}

/// The namespace must exist and not be going away.
async fn check_namespace(call: &Call<'_>, ns: &str) -> ApiResult<()> {
    let reg = call.app.resources.snapshot();
    let Some(ns_rt) = reg.get("", "v1", "namespaces") else {
        return Ok(());
    };
    match call.app.store.get(&ns_rt.key("", ns)).await {
        Ok(n) if n.metadata.deletion_timestamp.is_some() => Err(ApiError::forbidden(format!(
            "unable to create new content in namespace {ns} because it is being terminated"
        ))),
        Ok(_) => Ok(()),
        Err(StoreError::NotFound { .. }) => Err(ApiError::not_found(&ns_rt, ns)),
        Err(e) => Err(e.into()),
    }
}

async fn after_write(call: &Call<'_>, written: Option<(&Object, bool)>) {
    // A role, binding or ServiceAccount written here counts for the writer's next request at
    // once (other replicas learn of it from their watch).
    if let Some((obj, deleted)) = written
        && crate::rbac::Kind::of(&obj.kind).is_some()
        && matches!(call.target.rt.group.as_str(), crate::rbac::GROUP | "")
        && !call.options.dry_run
    {
        call.app.authz.observe(obj, deleted);
    }
    if call.target.rt.group == "apiextensions.k8s.io" {
        // Serve (or stop serving) the defined kinds at once, before answering.
        if let Err(e) = call.app.refresh_crds().await {
            tracing::warn!(error = %e, "refreshing custom resource definitions failed");
        }
    }
}

pub async fn create(mut call: Call<'_>, body: &Bytes) -> ApiResult<Outcome> {
    let rt = call.target.rt.clone();
    if rt.terminating {
        return Err(ApiError::method_not_allowed(format!(
            "create not allowed while custom resource definition is terminating ({})",
            rt.qualified()
        )));
    }
    let validation = call.options.field_validation;
    let dry = call.options.dry_run;
    let (mut raw, dups) = decode_body(&call.envelope, body, &call.target.rt.schema)?;
    reconcile_namespace(&call, &mut raw)?;
    let mut obj = admit(&mut call, &mut raw, &dups, validation)?;
    if !obj.metadata.resource_version.is_empty() {
        return Err(ApiError::bad_request(
            "resourceVersion should not be set on objects to be created",
        ));
    }
    if rt.namespaced {
        check_namespace(&call, &obj.metadata.namespace.clone()).await?;
    }
    let meta = &mut obj.metadata;
    orrery_store::stamp::stamp_new(meta);
    meta.managed_fields.clear();
    if rt.status {
        // Status belongs to the server and the controllers, not to the creator.
        obj.status = None;
    }
    track(&call, None, &mut obj);
    strategy::prepare_create(&rt, &mut obj);
    if rt.group == "apiextensions.k8s.io" {
        obj.status = Some(crate::crd::status(&obj, None));
    }
    validate(&call, &obj, None)?;
    super::check_admission(&call, &obj, None).await?;
    let generate = obj.metadata.name.is_empty();
    for attempt in 0..RETRIES {
        if generate {
            obj.metadata.name = format!("{}{}", obj.metadata.generate_name, random_suffix());
        }
        if dry {
            return respond_object(&call, StatusCode::CREATED, obj);
        }
        let key = rt.key(&obj.metadata.namespace, &obj.metadata.name);
        crate::trace::step("prepared");
        let created = call.app.store.create(&key, obj.clone()).await;
        crate::trace::step("committed");
        match created {
            Ok(stored) => {
                after_write(&call, Some((&stored, false))).await;
                return respond_object(&call, StatusCode::CREATED, stored);
            }
            Err(StoreError::AlreadyExists { .. }) if generate && attempt + 1 < RETRIES => continue,
            Err(e) => return Err(ApiError::from_store(e, &rt, &obj.metadata.name)),
        }
    }
    Err(ApiError::already_exists(&rt, &obj.metadata.name))
}

/// The object to store when `incoming` replaces `current`: server-owned metadata comes from
/// the stored object; a status update changes only status; a main update never changes status.
fn merge_for_update(
    call: &Call<'_>,
    current: &Object,
    mut incoming: Object,
    tracked: bool,
) -> ApiResult<Object> {
    let rt = &call.target.rt;
    let subresource = call.target.subresource.as_deref();
    if subresource == Some("status") {
        let mut next = current.clone();
        next.status = incoming.status;
        strategy::prepare_status(rt, current.status.as_ref(), &mut next.status);
        return Ok(next);
    }
    if !incoming.metadata.uid.is_empty() && incoming.metadata.uid != current.metadata.uid {
        let e = orrery_api::validation::FieldError::invalid(
            "metadata.uid",
            &incoming.metadata.uid,
            "field is immutable",
        );
        return Err(ApiError::invalid(rt, current.name(), &[e]));
    }
    let meta = &mut incoming.metadata;
    meta.uid = current.metadata.uid.clone();
    meta.name = current.metadata.name.clone();
    meta.namespace = current.metadata.namespace.clone();
    meta.creation_timestamp = current.metadata.creation_timestamp;
    meta.deletion_timestamp = current.metadata.deletion_timestamp;
    meta.deletion_grace_period_seconds = current.metadata.deletion_grace_period_seconds;
    meta.self_link.clear();
    if tracked {
        // Field ownership: the server's record, updated with what this write changed.
        track(call, Some(current), &mut incoming);
    }
    incoming.metadata.generation = Some(orrery_store::stamp::next_generation(current, &incoming));
    if rt.status {
        incoming.status = current.status.clone();
    }
    strategy::prepare_update(rt, current, &mut incoming);
    if rt.group == "apiextensions.k8s.io" {
        incoming.status = Some(crate::crd::status(&incoming, current.status.as_ref()));
    }
    Ok(incoming)
}

/// Stores `next` over `current` (revision `expected`), or deletes it when that update removes
/// the last finalizer of an object being deleted.
async fn commit_update(
    call: &Call<'_>,
    current: &Object,
    next: Object,
    expected: Revision,
    dry: bool,
) -> Result<Object, StoreError> {
    let key = call.target.key();
    let finished = next.metadata.deletion_timestamp.is_some()
        && next.metadata.finalizers.is_empty()
        && namespace_finalized(&call.target.rt, &next);
    if dry {
        return Ok(next);
    }
    if finished {
        let pre = Preconditions {
            uid: Some(current.metadata.uid.clone()),
            revision: Some(expected),
        };
        return call
            .app
            .store
            .delete(&key, &pre)
            .await
            .map(|o| (*o).clone());
    }
    call.app
        .store
        .update(&key, next, Some(expected))
        .await
        .map(|o| (*o).clone())
}

fn namespace_finalized(rt: &ResourceType, obj: &Object) -> bool {
    !(rt.group.is_empty() && rt.kind == "Namespace")
        || obj
            .spec
            .as_ref()
            .and_then(|s| s.get("finalizers"))
            .and_then(Value::as_array)
            .is_none_or(|f| f.is_empty())
}

fn parse_rv(s: &str) -> ApiResult<Option<Revision>> {
    if s.is_empty() {
        return Ok(None);
    }
    s.parse()
        .map(Some)
        .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {s:?}")))
}

pub async fn update(mut call: Call<'_>, body: &Bytes) -> ApiResult<Outcome> {
    let rt = call.target.rt.clone();
    let validation = call.options.field_validation;
    let dry = call.options.dry_run;
    let (mut raw, dups) = decode_body(&call.envelope, body, &call.target.rt.schema)?;
    let url_name = call.target.name().to_string();
    match raw.pointer("/metadata/name").and_then(Value::as_str) {
        Some(n) if !n.is_empty() && n != url_name => {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({n}) does not match the name on the URL ({url_name})"
            )));
        }
        _ => set_meta_string(&mut raw, "name", &url_name),
    }
    reconcile_namespace(&call, &mut raw)?;
    let incoming = admit(&mut call, &mut raw, &dups, validation)?;
    crate::trace::step("decoded");
    let precondition = parse_rv(&incoming.metadata.resource_version)?;
    let key = call.target.key();
    for attempt in 0..RETRIES {
        // A PUT that requires the revision its client read (a member's Lease renewal, every
        // beat) starts on the store's nearest copy when that copy is at the revision: the
        // write, conditional on it, then succeeds exactly when the copy is the object as it
        // is, and fails as a linearizable read would have it fail (on etcd the copy costs no
        // round of consensus, which waits for the leader's apply under load). A copy at any
        // other revision is not trusted with the answer: the object is read as it is.
        let copy = match precondition {
            Some(p) if attempt == 0 && !dry => call
                .app
                .store
                .get_copy(&key)
                .await
                .ok()
                .filter(|c| c.revision() == Some(p)),
            _ => None,
        };
        if precondition.is_some() && attempt == 0 {
            crate::trace::step("copy");
        }
        let current = match copy {
            Some(c) => std::sync::Arc::unwrap_or_clone(c),
            None => call
                .app
                .store
                .get(&key)
                .await
                .map_err(|e| ApiError::from_store(e, &rt, &url_name))?,
        };
        crate::trace::step("read");
        let current_rv = current.revision().unwrap_or(0);
        if precondition.is_some_and(|p| p != current_rv) {
            return Err(ApiError::stale(&rt, &url_name));
        }
        let next = merge_for_update(&call, &current, incoming.clone(), true)?;
        validate(&call, &next, Some(&current))?;
        super::check_admission(&call, &next, Some(&current)).await?;
        crate::trace::step("merged");
        let committed = commit_update(&call, &current, next, current_rv, dry).await;
        crate::trace::step("committed");
        match committed {
            Ok(stored) => {
                after_write(&call, Some((&stored, false))).await;
                return respond_object(&call, StatusCode::OK, present(&rt, stored));
            }
            Err(StoreError::Conflict { .. }) if precondition.is_none() => continue,
            Err(e) => return Err(ApiError::from_store(e, &rt, &url_name)),
        }
    }
    Err(ApiError::stale(&rt, &url_name))
}

/// Applies a patch document of the given type to an object's JSON.
pub fn apply_patch(
    call: &Call<'_>,
    ptype: PatchType,
    doc: &Value,
    patch_doc: &Value,
    schema: &str,
) -> ApiResult<Value> {
    let mut out = doc.clone();
    match ptype {
        PatchType::Json => patch::json_patch(&mut out, patch_doc).map_err(|e| match e {
            patch::JsonPatchError::Decode(_) => ApiError::bad_request(e.to_string()),
            patch::JsonPatchError::Failed(_) => ApiError::unprocessable(e.to_string()),
        })?,
        PatchType::Merge => {
            patch::merge_patch(&mut out, patch_doc).map_err(|e| ApiError::bad_request(e.0))?
        }
        PatchType::Strategic => {
            let set = call.app.schemas.set();
            let meta = Meta::new(&set, set.get(schema));
            out = patch::strategic_merge(doc, patch_doc, meta)
                .map_err(|e| ApiError::bad_request(e.0))?;
        }
        PatchType::Apply => {
            return Err(ApiError::internal(
                "server-side apply is not a patch of the live object",
            ));
        }
    }
    Ok(out)
}

/// Records the fields a (non-apply) write changed as its manager's.
pub(crate) fn track(call: &Call<'_>, old: Option<&Object>, new: &mut Object) {
    let manager = crate::managed::manager_of(
        call.options.field_manager.as_deref(),
        call.envelope.user_agent.as_deref(),
    );
    let set = call.app.schemas.set();
    let meta = Meta::new(&set, set.get(&call.target.rt.schema));
    let sub = call.target.subresource.as_deref().unwrap_or("");
    crate::managed::track_update(old, new, &manager, sub, meta);
}

/// The patch type of a request, refused where it does not apply.
pub fn patch_type(call: &Call<'_>) -> ApiResult<PatchType> {
    let ct = call.envelope.content_type.as_deref().unwrap_or("");
    let ptype = PatchType::from_content_type(ct).ok_or_else(|| {
        ApiError::new(
            415,
            "UnsupportedMediaType",
            format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json (got {ct:?})"),
        )
    })?;
    match ptype {
        PatchType::Strategic if !call.target.rt.strategic_merge => Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "strategic merge patch is not supported for {}; use a JSON merge patch (--type=merge) or a JSON patch",
                call.target.rt.qualified()
            ),
        )),
        t => Ok(t),
    }
}

pub async fn patch(mut call: Call<'_>, body: &Bytes) -> ApiResult<Outcome> {
    let rt = call.target.rt.clone();
    let ptype = patch_type(&call)?;
    if ptype == PatchType::Apply {
        return server_side_apply(call, body).await;
    }
    let validation = call.options.field_validation;
    let dry = call.options.dry_run;
    let (patch_doc, dups) = crate::schema::validate::parse_json(body)
        .map_err(|e| ApiError::bad_request(format!("the patch is not valid JSON: {e}")))?;
    let name = call.target.name().to_string();
    // The first attempt reads the store's recent copy (no round of consensus on etcd); any
    // outcome decided on that copy but a successful write conditional on its revision is tried
    // again on a current read (`Store::get_recent`). A write that failed otherwise is not: it
    // may have been carried out, and a JSON patch applied twice is not the patch asked for.
    let warned = call.warnings.len();
    let key = call.target.key();
    let started = std::time::Instant::now();
    let mut unconditional = false;
    let attempts = RETRIES + usize::from(!dry);
    let mut attempt = 0;
    loop {
        if attempt >= attempts && !keep_trying(unconditional, started).await {
            break;
        }
        let recent = !dry && attempt == 0;
        attempt += 1;
        call.warnings.truncate(warned);
        let current =
            match orrery_store::read_for_write(call.app.store.as_ref(), &key, recent).await {
                Err(_) if recent => continue,
                r => std::sync::Arc::unwrap_or_clone(
                    r.map_err(|e| ApiError::from_store(e, &rt, &name))?,
                ),
            };
        crate::trace::step("read");
        let (next, precondition) =
            match prepare_patch(&mut call, ptype, &patch_doc, &dups, validation, &current) {
                Ok(prepared) => prepared,
                // Decided on a copy that may be old: decided again on the object as it is.
                Err(_) if recent => continue,
                Err(e) => return Err(e),
            };
        let retry = precondition.is_none();
        unconditional = retry;
        crate::trace::step("patched");
        if let Some(done) = store_update(&call, current, next, dry, retry, recent).await? {
            return Ok(done);
        }
    }
    Err(ApiError::stale(&rt, &name))
}

/// The object a patch makes of `current`, and the revision the patch requires (its
/// `metadata.resourceVersion`, when that is not `current`'s).
fn prepare_patch(
    call: &mut Call<'_>,
    ptype: PatchType,
    patch_doc: &Value,
    dups: &[String],
    validation: FieldValidation,
    current: &Object,
) -> ApiResult<(Object, Option<Revision>)> {
    let rt = call.target.rt.clone();
    let name = call.target.name().to_string();
    let current_rv = current.revision().unwrap_or(0);
    // Patched at the version asked for (it may be stored at another).
    let mut base = current.to_value();
    if current.kind == rt.kind && current.api_version != rt.api_version() {
        base["apiVersion"] = Value::String(rt.api_version());
    }
    let mut doc = apply_patch(call, ptype, &base, patch_doc, &rt.schema)?;
    let patched_rv = doc
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let precondition = parse_rv(&patched_rv)?.filter(|r| *r != current_rv);
    if let Some(p) = precondition
        && p != current_rv
    {
        return Err(ApiError::stale(&rt, &name));
    }
    for (field, was) in [("name", current.name()), ("namespace", current.namespace())] {
        let now = doc
            .pointer(&format!("/metadata/{field}"))
            .and_then(Value::as_str)
            .unwrap_or("");
        if now != was {
            let e = orrery_api::validation::FieldError::invalid(
                format!("metadata.{field}"),
                now,
                "field is immutable",
            );
            return Err(ApiError::invalid(&rt, &name, &[e]));
        }
    }
    let incoming = admit(call, &mut doc, dups, validation)?;
    let next = merge_for_update(call, current, incoming, true)?;
    Ok((next, precondition))
}

/// Validates and stores `next` over `current` and answers; `None` when another writer got
/// there first and `retry` allows reading again, or when `current` is a recent copy
/// (`Store::get_recent`, which may not be the object as it is) and what was decided on it was
/// not a write: nothing changed, `next` is not valid, the store refused the write's compare.
/// Other failures of the write are the answer: the write may have been carried out.
async fn store_update(
    call: &Call<'_>,
    current: Object,
    next: Object,
    dry: bool,
    retry: bool,
    recent: bool,
) -> ApiResult<Option<Outcome>> {
    let rt = &call.target.rt;
    if same_object(&current, &next) {
        if recent {
            return Ok(None);
        }
        // Nothing changed: no write, no new revision.
        return respond_object(call, StatusCode::OK, present(rt, current)).map(Some);
    }
    match validate(call, &next, Some(&current)) {
        Err(_) if recent => return Ok(None),
        r => r?,
    }
    super::check_admission(call, &next, Some(&current)).await?;
    let current_rv = current.revision().unwrap_or(0);
    let committed = commit_update(call, &current, next, current_rv, dry).await;
    crate::trace::step("committed");
    match committed {
        Ok(stored) => {
            after_write(call, Some((&stored, false))).await;
            respond_object(call, StatusCode::OK, present(rt, stored)).map(Some)
        }
        Err(StoreError::Conflict { .. }) if retry || recent => Ok(None),
        // Refused by the store's compare, so nothing was written: the copy was old.
        Err(StoreError::NotFound { .. } | StoreError::PreconditionFailed { .. }) if recent => {
            Ok(None)
        }
        Err(e) => Err(ApiError::from_store(e, rt, call.target.name())),
    }
}

fn same_object(a: &Object, b: &Object) -> bool {
    if a.metadata.resource_version == b.metadata.resource_version {
        return a == b;
    }
    // Only the metadata is copied to set the revision aside: copying whole objects cost a
    // tenth of a status batch.
    let (mut am, mut bm) = (a.metadata.clone(), b.metadata.clone());
    am.resource_version.clear();
    bm.resource_version.clear();
    am == bm
        && a.api_version == b.api_version
        && a.kind == b.kind
        && a.spec == b.spec
        && a.status == b.status
        && a.other == b.other
}

/// `DeleteOptions` from the body and the query.
#[derive(Debug, Default)]
struct DeleteOptions {
    policy: Option<String>,
    uid: Option<String>,
    revision: Option<Revision>,
    dry: bool,
}

fn delete_options(call: &Call<'_>, body: &Bytes) -> ApiResult<DeleteOptions> {
    let mut o = DeleteOptions::default();
    let trimmed = body.iter().any(|b| !b.is_ascii_whitespace());
    if trimmed {
        let (v, _) = decode_body(&call.envelope, body, crate::schema::DELETE_OPTIONS)?;
        if !v.is_object() {
            return Err(ApiError::bad_request("DeleteOptions must be a JSON object"));
        }
        o.policy = v
            .get("propagationPolicy")
            .and_then(Value::as_str)
            .map(str::to_string);
        if v.get("orphanDependents") == Some(&Value::Bool(true)) {
            o.policy = Some("Orphan".into());
        }
        o.uid = v
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
            .map(str::to_string);
        if let Some(rv) = v
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
        {
            o.revision = parse_rv(rv)?;
        }
        if let Some(Value::Array(d)) = v.get("dryRun") {
            o.dry = d.iter().any(|x| x == "All");
        }
    }
    if let Some(p) = &call.options.propagation_policy {
        o.policy = Some(p.clone());
    }
    if call.options.orphan_dependents {
        o.policy = Some("Orphan".into());
    }
    o.dry |= call.options.dry_run;
    match o.policy.as_deref() {
        None | Some("Background" | "Foreground" | "Orphan") => Ok(o),
        Some(other) => Err(ApiError::bad_request(format!(
            "propagationPolicy must be Orphan, Background or Foreground, got {other:?}"
        ))),
    }
}

/// Deletes one object per the options; returns the HTTP status and the object's final state.
/// Whether `name` is a namespace that always exists ([`crate::app::SYSTEM_NAMESPACES`]).
fn is_protected_namespace(rt: &ResourceType, name: &str) -> bool {
    rt.group.is_empty() && rt.kind == "Namespace" && crate::app::SYSTEM_NAMESPACES.contains(&name)
}

async fn delete_one(
    call: &Call<'_>,
    key: &str,
    name: &str,
    opts: &DeleteOptions,
) -> ApiResult<(StatusCode, Object)> {
    let rt = &call.target.rt;
    if is_protected_namespace(rt, name) {
        // As kube-apiserver protects its own: what Orrery's standalone tasks, leases and
        // system objects live in stays.
        return Err(ApiError::forbidden(format!(
            "namespaces \"{name}\" is forbidden: this namespace may not be deleted"
        )));
    }
    for _ in 0..RETRIES {
        let current = call
            .app
            .store
            .get(key)
            .await
            .map_err(|e| ApiError::from_store(e, rt, name))?;
        if crate::crd::is_own_crd(rt, &current) {
            return Err(super::read_only(rt, name));
        }
        if let Some(uid) = &opts.uid
            && uid != &current.metadata.uid
        {
            return Err(ApiError::conflict(
                rt,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    current.metadata.uid
                ),
            ));
        }
        let current_rv = current.revision().unwrap_or(0);
        if let Some(rv) = opts.revision
            && rv != current_rv
        {
            return Err(ApiError::conflict(
                rt,
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in meta: {current_rv}"
                ),
            ));
        }
        let mut finalizers = current.metadata.finalizers.clone();
        let wanted = match opts.policy.as_deref() {
            Some("Orphan") => Some("orphan"),
            Some("Foreground") => Some("foregroundDeletion"),
            _ => None,
        };
        if let Some(f) = wanted
            && !finalizers.iter().any(|x| x == f)
        {
            finalizers.retain(|x| x != "orphan" && x != "foregroundDeletion");
            finalizers.push(f.to_string());
        }
        let is_namespace = rt.group.is_empty() && rt.kind == "Namespace";
        let graceful =
            !finalizers.is_empty() || (is_namespace && !namespace_finalized(rt, &current));
        if graceful {
            if current.metadata.deletion_timestamp.is_some()
                && finalizers == current.metadata.finalizers
            {
                return Ok((StatusCode::OK, present(rt, current)));
            }
            let mut next = current.clone();
            next.metadata
                .deletion_timestamp
                .get_or_insert_with(Time::now);
            next.metadata.deletion_grace_period_seconds = Some(0);
            next.metadata.finalizers = finalizers;
            if is_namespace {
                next.status = Some(json!({ "phase": "Terminating" }));
            }
            if rt.group == "apiextensions.k8s.io" {
                next.status = Some(crate::crd::status(&next, current.status.as_ref()));
            }
            if opts.dry {
                return Ok((StatusCode::OK, next));
            }
            match call.app.store.update(key, next, Some(current_rv)).await {
                Ok(o) => {
                    let status = if wanted == Some("foregroundDeletion") {
                        StatusCode::ACCEPTED
                    } else {
                        StatusCode::OK
                    };
                    return Ok((status, present(rt, (*o).clone())));
                }
                Err(StoreError::Conflict { .. }) => continue,
                Err(e) => return Err(ApiError::from_store(e, rt, name)),
            }
        }
        if opts.dry {
            return Ok((StatusCode::OK, current));
        }
        let pre = Preconditions {
            uid: Some(current.metadata.uid.clone()),
            revision: Some(current_rv),
        };
        match call.app.store.delete(key, &pre).await {
            Ok(o) => return Ok((StatusCode::OK, present(rt, (*o).clone()))),
            Err(StoreError::Conflict { .. }) => continue,
            Err(e) => return Err(ApiError::from_store(e, rt, name)),
        }
    }
    Err(ApiError::stale(rt, name))
}

pub async fn delete(call: Call<'_>, body: &Bytes) -> ApiResult<Outcome> {
    let opts = delete_options(&call, body)?;
    let (status, obj) = delete_one(&call, &call.target.key(), call.target.name(), &opts).await?;
    after_write(&call, Some((&obj, status == StatusCode::OK))).await;
    respond_object(&call, status, obj)
}

pub async fn delete_collection(mut call: Call<'_>, body: &Bytes) -> ApiResult<Outcome> {
    let rt = call.target.rt.clone();
    let opts = delete_options(&call, body)?;
    let (labels, fields) = selectors(&call)?;
    let list = call
        .app
        .store
        .list(
            &rt.prefix(call.target.namespace.as_deref()),
            &ListOptions {
                labels,
                fields,
                ..Default::default()
            },
        )
        .await?;
    let mut items = Vec::new();
    for o in list.items {
        // "Delete them all" leaves what cannot be deleted, and says so.
        if crate::crd::is_own_crd(&rt, &o) {
            call.warnings.push(format!(
                "{} \"{}\" describes one of Orrery's own kinds and was kept",
                rt.plural,
                o.name()
            ));
            continue;
        }
        if is_protected_namespace(&rt, o.name()) {
            call.warnings.push(format!(
                "namespace \"{}\" may not be deleted and was kept",
                o.name()
            ));
            continue;
        }
        let key = rt.key(o.namespace(), o.name());
        match delete_one(&call, &key, o.name(), &opts).await {
            Ok((_, obj)) => items.push(obj.to_value()),
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    after_write(&call, None).await;
    let out = json!({ "kind": rt.list_kind, "apiVersion": rt.api_version(), "metadata": {}, "items": items });
    Ok(Outcome::value(&call, StatusCode::OK, out))
}

/// Whether a status write is validated against the kind's rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusCheck {
    Validate,
    /// The server built the status from values it checked itself, on top of the stored,
    /// already valid one.
    Trusted,
}

/// Replaces the status of one object outside an HTTP request (through the registry: see
/// `registry::update_status`), with the new status computed from the stored object by `f`
/// (again on each retry after a conflict).
pub async fn update_status(
    app: &crate::app::App,
    rt: &ResourceType,
    namespace: Option<&str>,
    name: &str,
    expected: Option<Revision>,
    check: StatusCheck,
    mut f: impl FnMut(&Object) -> ApiResult<Value>,
) -> ApiResult<std::sync::Arc<Object>> {
    let key = rt.key(namespace.unwrap_or(""), name);
    // As in `patch`: the first attempt on the store's recent copy; what was decided on it, but
    // a write, decided again on a current read (a failed write is the answer). A report that
    // asked for no version is not refused for another writer's (an agent's status report of
    // a Work the controllers are rewriting): it keeps trying within the budget.
    let started = std::time::Instant::now();
    let mut attempt = 0;
    loop {
        if attempt > RETRIES && !keep_trying(expected.is_none(), started).await {
            break;
        }
        let recent = attempt == 0;
        attempt += 1;
        let current = match orrery_store::read_for_write(app.store.as_ref(), &key, recent).await {
            Err(_) if recent => continue,
            r => r.map_err(|e| ApiError::from_store(e, rt, name))?,
        };
        crate::trace::step("read");
        let current_rv = current.revision().unwrap_or(0);
        let next = match prepare_status(app, rt, name, expected, check, &mut f, &current) {
            Ok(Some(next)) => next,
            // Decided on a copy that may be old (a change of nothing, a refusal): decided
            // again on the object as it is.
            Ok(None) | Err(_) if recent => continue,
            Ok(None) => return Ok(std::sync::Arc::new(present(rt, (*current).clone()))),
            Err(e) => return Err(e),
        };
        crate::trace::step("prepared");
        let written = app.store.update(&key, next, Some(current_rv)).await;
        crate::trace::step("committed");
        match written {
            // As stored: the caller reads the revision, not the type.
            Ok(stored) => return Ok(stored),
            Err(StoreError::Conflict { .. }) if expected.is_none() || recent => continue,
            // Refused by the store's compare, so nothing was written: the copy was old.
            Err(StoreError::NotFound { .. }) if recent => continue,
            // Any other failure is the answer: the write may have been carried out.
            Err(e) => return Err(ApiError::from_store(e, rt, name)),
        }
    }
    Err(ApiError::stale(rt, name))
}

/// The object `update_status` makes of `current`: its status computed by `f`; `None` when
/// that is the status it has.
fn prepare_status(
    app: &crate::app::App,
    rt: &ResourceType,
    name: &str,
    expected: Option<Revision>,
    check: StatusCheck,
    f: &mut impl FnMut(&Object) -> ApiResult<Value>,
    current: &Object,
) -> ApiResult<Option<Object>> {
    if expected.is_some_and(|p| p != current.revision().unwrap_or(0)) {
        return Err(ApiError::stale(rt, name));
    }
    let mut status = Some(f(current)?);
    // The new object is the stored one with a new status: everything but the status is
    // copied, the status never.
    strategy::prepare_status(rt, current.status.as_ref(), &mut status);
    if status == current.status {
        return Ok(None);
    }
    let next = Object {
        api_version: current.api_version.clone(),
        kind: current.kind.clone(),
        metadata: current.metadata.clone(),
        spec: current.spec.clone(),
        status,
        other: current.other.clone(),
    };
    // Validation reads the old object's spec and other fields, never its status, and those
    // are the new object's: it stands in for the old one.
    if check == StatusCheck::Validate {
        super::validate_object(app, rt, &next, Some(&next))?;
    }
    Ok(Some(next))
}

/// The applied configuration of a server-side apply request (YAML or JSON).
fn applied_config(call: &Call<'_>, body: &Bytes) -> ApiResult<Value> {
    let v: Value = serde_saphyr::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!(
            "the applied configuration is not valid YAML or JSON: {e}"
        ))
    })?;
    let rt = &call.target.rt;
    if !v.is_object() {
        return Err(ApiError::bad_request(
            "the applied configuration must be an object",
        ));
    }
    for (field, want) in [("apiVersion", rt.api_version()), ("kind", rt.kind.clone())] {
        match v.get(field).and_then(Value::as_str) {
            Some(x) if x == want => {}
            Some(x) => {
                return Err(ApiError::bad_request(format!(
                    "the {field} of the applied configuration ({x}) is not {want}"
                )));
            }
            None => {
                return Err(ApiError::bad_request(format!(
                    "an applied configuration must name its {field}"
                )));
            }
        }
    }
    match v.pointer("/metadata/name").and_then(Value::as_str) {
        Some(n) if n == call.target.name() => Ok(v),
        Some(n) => Err(ApiError::bad_request(format!(
            "the name of the applied configuration ({n}) does not match the name on the URL ({})",
            call.target.name()
        ))),
        None => Err(ApiError::bad_request(
            "an applied configuration must name its object",
        )),
    }
}

/// Server-side apply (`application/apply-patch+yaml`): see [`crate::managed`].
async fn server_side_apply(mut call: Call<'_>, body: &Bytes) -> ApiResult<Outcome> {
    let rt = call.target.rt.clone();
    let name = call.target.name().to_string();
    let manager = call
        .options
        .field_manager
        .clone()
        .filter(|m| !m.is_empty())
        .ok_or_else(|| ApiError::bad_request("fieldManager is required for apply requests"))?;
    if manager.len() > 128 || manager.chars().any(|c| c.is_control()) {
        return Err(ApiError::bad_request(
            "fieldManager must be at most 128 printable characters",
        ));
    }
    if call.target.subresource.is_some() {
        return Err(ApiError::method_not_allowed(
            "server-side apply is served for whole objects only",
        ));
    }
    let force = call.options.force;
    let validation = call.options.field_validation;
    let dry = call.options.dry_run;
    let mut applied = applied_config(&call, body)?;
    reconcile_namespace(&call, &mut applied)?;
    for _ in 0..RETRIES {
        let current = match call.app.store.get(&call.target.key()).await {
            // Applied at the version asked for (it may be stored at another).
            Ok(o) => Some(present(&rt, o)),
            Err(StoreError::NotFound { .. }) => None,
            Err(e) => return Err(ApiError::from_store(e, &rt, &name)),
        };
        let set = call.app.schemas.set();
        let meta = Meta::new(&set, set.get(&rt.schema));
        let strategic = rt.strategic_merge;
        let outcome = crate::managed::apply(
            current.as_ref(),
            &applied,
            &manager,
            force,
            meta,
            |live, cfg| {
                if strategic {
                    patch::strategic_merge(live, cfg, meta).map_err(|e| e.0)
                } else {
                    let mut out = live.clone();
                    patch::merge_patch(&mut out, cfg)
                        .map(|_| out)
                        .map_err(|e| e.0)
                }
            },
        )
        .map_err(ApiError::bad_request)?;
        let mut merged = match outcome {
            Ok(v) => v,
            Err(conflicts) => return Err(ApiError::apply_conflicts(&rt, &name, &conflicts)),
        };
        let Some(current) = current else {
            // Apply of a new object creates it.
            let mut obj = admit(&mut call, &mut merged, &[], validation)?;
            if rt.namespaced {
                check_namespace(&call, &obj.metadata.namespace.clone()).await?;
            }
            orrery_store::stamp::stamp_new(&mut obj.metadata);
            if rt.status {
                obj.status = None;
            }
            strategy::prepare_create(&rt, &mut obj);
            validate(&call, &obj, None)?;
            super::check_admission(&call, &obj, None).await?;
            if dry {
                return respond_object(&call, StatusCode::CREATED, obj);
            }
            match call.app.store.create(&call.target.key(), obj).await {
                Ok(stored) => {
                    after_write(&call, Some((&stored, false))).await;
                    return respond_object(&call, StatusCode::CREATED, stored);
                }
                Err(StoreError::AlreadyExists { .. }) => continue,
                Err(e) => return Err(ApiError::from_store(e, &rt, &name)),
            }
        };
        let incoming = admit(&mut call, &mut merged, &[], validation)?;
        let next = merge_for_update(&call, &current, incoming, false)?;
        if let Some(r) = store_update(&call, current, next, dry, true, false).await? {
            return Ok(r);
        }
    }
    Err(ApiError::stale(&rt, &name))
}
