//! get and list.

use std::io::Write;
use std::time::Duration;

use http::{Response, StatusCode};
use orrery_api::{Object, fields, labels};
use orrery_store::{ListOptions, Revision};
use serde_json::{Value, json};

use super::Outcome;
use super::{Call, respond_object};
use crate::error::{ApiError, ApiResult};
use crate::http::{self as h, Representation};
use crate::resources::ResourceType;
use crate::table;

/// Objects are stored at one version; they are served at the version asked for.
pub fn present(rt: &ResourceType, mut obj: Object) -> Object {
    obj.api_version = rt.api_version();
    obj.kind = rt.kind.clone();
    obj
}

pub async fn get(call: Call<'_>) -> ApiResult<Outcome> {
    let rt = call.target.rt.clone();
    let obj = call
        .app
        .store
        .get(&call.target.key())
        .await
        .map_err(|e| ApiError::from_store(e, &rt, call.target.name()))?;
    respond_object(&call, StatusCode::OK, present(&rt, obj))
}

/// Field selectors a kind supports beyond `metadata.name` and `metadata.namespace`, with the
/// object path each one reads.
fn field_alias(rt: &ResourceType, field: &str) -> Option<String> {
    if matches!(field, "metadata.name" | "metadata.namespace") {
        return Some(field.to_string());
    }
    let ok = match (rt.group.as_str(), rt.kind.as_str()) {
        ("", "Event") => {
            if field == "source" {
                return Some("source.component".into());
            }
            matches!(
                field,
                "involvedObject.kind"
                    | "involvedObject.namespace"
                    | "involvedObject.name"
                    | "involvedObject.uid"
                    | "involvedObject.apiVersion"
                    | "involvedObject.resourceVersion"
                    | "involvedObject.fieldPath"
                    | "reason"
                    | "reportingComponent"
                    | "type"
            )
        }
        ("", "Pod") => matches!(
            field,
            "spec.nodeName"
                | "spec.restartPolicy"
                | "spec.schedulerName"
                | "spec.serviceAccountName"
                | "spec.hostNetwork"
                | "status.phase"
                | "status.podIP"
                | "status.nominatedNodeName"
        ),
        ("", "Secret") => field == "type",
        ("", "Namespace") => field == "status.phase",
        ("batch", "Job") => field == "status.successful",
        _ => false,
    };
    ok.then(|| field.to_string())
}

/// Label and field selectors from the query.
pub fn selectors(call: &Call<'_>) -> ApiResult<(labels::Selector, fields::Selector)> {
    let label = match call.options.list.label_selector.as_deref() {
        Some(s) => labels::Selector::parse(s).map_err(|e| ApiError::bad_request(e.to_string()))?,
        None => labels::Selector::everything(),
    };
    let field = match call.options.list.field_selector.as_deref() {
        Some(s) => {
            let parsed =
                fields::Selector::parse(s).map_err(|e| ApiError::bad_request(e.to_string()))?;
            let mut terms = Vec::new();
            for t in parsed.terms() {
                let path = field_alias(&call.target.rt, &t.field).ok_or_else(|| {
                    ApiError::bad_request(format!("field label not supported: {}", t.field))
                })?;
                let op = if t.negated { "!=" } else { "=" };
                terms.push(format!(
                    "{path}{op}{}",
                    t.value
                        .replace('\\', "\\\\")
                        .replace(',', "\\,")
                        .replace('=', "\\=")
                ));
            }
            fields::Selector::parse(&terms.join(","))
                .map_err(|e| ApiError::bad_request(e.to_string()))?
        }
        None => fields::Selector::everything(),
    };
    Ok((label, field))
}

fn parse_rv(v: &str) -> ApiResult<Revision> {
    v.parse::<Revision>()
        .ok()
        .filter(|r| *r >= 0)
        .ok_or_else(|| ApiError::bad_request(format!("invalid resource version {v:?}")))
}

/// Waits (up to 3 s, as Kubernetes does) until the store has reached `rv`.
pub async fn wait_for_revision(call: &Call<'_>, rv: Revision) -> ApiResult<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    loop {
        let current = call.app.store.current_revision().await?;
        if current >= rv {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(ApiError::from(orrery_store::StoreError::FutureRevision {
                requested: rv,
                current,
            }));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// List options from the query, with the resourceVersion rules of the API conventions.
pub async fn list_options(call: &Call<'_>) -> ApiResult<ListOptions> {
    let (label, field) = selectors(call)?;
    let mut opts = ListOptions {
        labels: label,
        fields: field,
        ..Default::default()
    };
    opts.limit = call.options.list.limit;
    opts.continue_token = call.options.list.continue_token.clone();
    let rv = call.options.list.resource_version.as_deref();
    let rv_match = call.options.list.resource_version_match.as_deref();
    if opts.continue_token.is_some() && rv.is_some_and(|r| r != "0") {
        return Err(ApiError::bad_request(
            "specifying resource version is not allowed when using continue",
        ));
    }
    match (rv, rv_match) {
        (None, Some(_)) => {
            return Err(ApiError::bad_request(
                "resourceVersionMatch is forbidden unless resourceVersion is provided",
            ));
        }
        (Some(r), Some("Exact")) => {
            let r = parse_rv(r)?;
            if r == 0 {
                return Err(ApiError::bad_request(
                    "resourceVersionMatch \"Exact\" is forbidden for resourceVersion \"0\"",
                ));
            }
            opts.revision = Some(r);
        }
        (Some(r), Some("NotOlderThan") | None) => {
            let r = parse_rv(r)?;
            if r > 0 {
                wait_for_revision(call, r).await?;
            }
        }
        (Some(_), Some(other)) => {
            return Err(ApiError::bad_request(format!(
                "resourceVersionMatch must be \"Exact\" or \"NotOlderThan\", got {other:?}"
            )));
        }
        (None, None) => {}
    }
    Ok(opts)
}

/// The objects a list names, parsed (for in-process callers: the DRO-DS API).
pub async fn objects(call: &Call<'_>) -> ApiResult<Vec<Object>> {
    let rt = &call.target.rt;
    let opts = list_options(call).await?;
    let list = call
        .app
        .store
        .list(&rt.prefix(call.target.namespace.as_deref()), &opts)
        .await?;
    Ok(list.items.into_iter().map(|o| present(rt, o)).collect())
}

pub async fn list(call: Call<'_>) -> ApiResult<Outcome> {
    let rt = call.target.rt.clone();
    let opts = list_options(&call).await?;
    let prefix = rt.prefix(call.target.namespace.as_deref());
    let response = match call.representation {
        Representation::Table => {
            // Row by row from the stored JSON: a large list never exists parsed all at once.
            let include = call.options.include_object;
            let result = call.app.store.list_raw(&prefix, &opts).await?;
            let rv = result.revision.to_string();
            let head = table::table(&rt, &[], &rv, result.continue_token.as_deref(), include);
            let head = serde_json::to_vec(&head).map_err(|e| ApiError::internal(e.to_string()))?;
            // The head ends with `"rows":[]}`; the rows go in between.
            let cut = head.len() - 2;
            let mut out = Vec::with_capacity(result.items.len() * 256 + head.len());
            out.extend_from_slice(&head[..cut]);
            let now = orrery_api::Time::now();
            let api_version = rt.api_version();
            for (i, item) in result.items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                let mut value: Value = serde_json::from_slice(&item.json)
                    .map_err(|e| ApiError::internal(e.to_string()))?;
                if value.get("apiVersion").and_then(Value::as_str) != Some(api_version.as_str()) {
                    let obj =
                        Object::from_value(value).map_err(|e| ApiError::internal(e.to_string()))?;
                    value = present(&rt, obj).to_value();
                }
                let row = table::row_from_json(&rt, value, include, now);
                serde_json::to_writer(&mut out, &row)
                    .map_err(|e| ApiError::internal(e.to_string()))?;
            }
            out.extend_from_slice(b"]}");
            let mut r = Response::new(h::full(out));
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static(h::JSON),
            );
            r
        }
        Representation::Metadata => {
            let result = call.app.store.list(&prefix, &opts).await?;
            let items: Vec<_> = result
                .items
                .iter()
                .map(|o| json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o.metadata}))
                .collect();
            let mut meta = json!({ "resourceVersion": result.revision.to_string() });
            if let Some(c) = &result.continue_token {
                meta["continue"] = json!(c);
            }
            h::json(
                StatusCode::OK,
                &json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "items": items}),
            )
        }
        Representation::Json => {
            // Stored JSON goes out as it is: no parsing and re-serializing of every object.
            let result = call.app.store.list_raw(&prefix, &opts).await?;
            let expected = format!(
                "{{\"apiVersion\":\"{}\",\"kind\":\"{}\",",
                rt.api_version(),
                rt.kind
            );
            let size: usize = result.items.iter().map(|i| i.json.len() + 1).sum();
            let mut out = Vec::with_capacity(size + 256);
            let mut meta = json!({ "resourceVersion": result.revision.to_string() });
            if let Some(c) = &result.continue_token {
                meta["continue"] = json!(c);
            }
            let head =
                json!({ "kind": rt.list_kind, "apiVersion": rt.api_version(), "metadata": meta });
            let head = serde_json::to_vec(&head).map_err(|e| ApiError::internal(e.to_string()))?;
            out.extend_from_slice(&head[..head.len() - 1]);
            out.extend_from_slice(b",\"items\":[");
            for (i, item) in result.items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                if item.json.starts_with(expected.as_bytes()) {
                    out.extend_from_slice(&item.json);
                } else {
                    // Stored at another version of the kind: served at the one asked for.
                    let obj: Object = serde_json::from_slice(&item.json)
                        .map_err(|e| ApiError::internal(e.to_string()))?;
                    serde_json::to_writer(&mut out, &present(&rt, obj))
                        .map_err(|e| ApiError::internal(e.to_string()))?;
                }
            }
            let _ = out.write_all(b"]}");
            let mut r = Response::new(h::full(out));
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static(h::JSON),
            );
            r
        }
    };
    Ok(Outcome::encoded(crate::http::with_warnings(
        response,
        &call.warnings,
    )))
}
