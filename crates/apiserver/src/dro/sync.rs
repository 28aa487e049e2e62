//! Status synchronization (draft 6.3.2): `POST /api/v1/sync/batch` sets the status of up to
//! 1,000 objects in one request, each applied atomically on its own. Agents send their Work
//! and Cluster reports this way.
//!
//! ```json
//! {"items": [{"kind": "Work", "namespace": "orrery-cluster-east", "name": "web",
//!             "status": {...}, "resourceVersion": "42"}]}
//! ```
//!
//! `apiVersion` defaults to `multicluster.io/v1alpha1`. The whole request is refused, with
//! nothing applied, when it is malformed, too large, or names an object the caller may not
//! write; otherwise each item succeeds or fails alone and the answer lists every outcome.

use std::sync::Arc;

use bytes::Bytes;
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};

use super::answers::{BatchResult, ItemResult};
use super::{DroError, MAX_BATCH};
use crate::app::App;
use crate::auth::Identity;
use crate::registry;
use crate::registry::write::StatusCheck;

/// Status of up to 1,000 objects, each applied atomically.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct Batch {
    #[schemars(length(max = MAX_BATCH))]
    items: Vec<Item>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(rename = "BatchItem")]
struct Item {
    #[serde(default)]
    api_version: Option<String>,
    kind: String,
    #[serde(default)]
    namespace: Option<String>,
    name: String,
    #[schemars(with = "serde_json::Map<String, Value>")]
    status: Value,
    #[serde(default)]
    resource_version: Option<String>,
}

/// How many items are written at once (the store commits concurrent writes together).
const PARALLEL: usize = 1000;

pub async fn batch(
    app: &Arc<App>,
    who: &Identity,
    body: &Bytes,
) -> Result<http::Response<crate::http::Body>, DroError> {
    // Count first, so that an oversized batch is refused as such whatever else is wrong.
    let raw: Value = serde_json::from_slice(body)
        .map_err(|e| DroError::validation(format!("the body is not valid JSON: {e}")))?;
    if let Some(n) = raw.get("items").and_then(Value::as_array).map(Vec::len)
        && n > MAX_BATCH
    {
        return Err(DroError::new(
            413,
            "BATCH_TOO_LARGE",
            format!("a batch carries at most {MAX_BATCH} objects; this one has {n}"),
        )
        .with_details(json!({ "maxItems": MAX_BATCH, "items": n })));
    }
    let batch: Batch = serde_json::from_value(raw)
        .map_err(|e| DroError::validation(format!("the body is not a valid batch: {e}")))?;
    let reg = app.resources.snapshot();
    // Resolve and authorize every item before writing any.
    let mut targets = Vec::with_capacity(batch.items.len());
    for (i, item) in batch.items.iter().enumerate() {
        let api_version = item
            .api_version
            .as_deref()
            .unwrap_or("multicluster.io/v1alpha1");
        let group = api_version.split_once('/').map(|(g, _)| g).unwrap_or("");
        let rt = reg
            .by_kind(group, &item.kind)
            .filter(|rt| rt.status)
            .ok_or_else(|| {
                DroError::validation(format!(
                    "items[{i}]: {} {api_version} is not a kind with a status",
                    item.kind
                ))
                .with_details(json!({ "index": i }))
            })?;
        let namespace = item.namespace.as_deref().filter(|n| !n.is_empty());
        if rt.namespaced != namespace.is_some() {
            return Err(DroError::validation(format!(
                "items[{i}]: {} is {}namespaced",
                item.kind,
                if rt.namespaced { "" } else { "not " }
            ))
            .with_details(json!({ "index": i })));
        }
        if !item.status.is_object() {
            return Err(
                DroError::validation(format!("items[{i}].status must be an object"))
                    .with_details(json!({ "index": i })),
            );
        }
        let expected = match item.resource_version.as_deref().filter(|r| !r.is_empty()) {
            Some(rv) => Some(rv.parse::<i64>().map_err(|_| {
                DroError::validation(format!(
                    "items[{i}].resourceVersion {rv:?} is not a resourceVersion"
                ))
            })?),
            None => None,
        };
        let authorized = registry::authorize_status(app, who, &rt, namespace, &item.name)
            .map_err(|e| DroError::from(e).with_details(json!({ "index": i })))?;
        targets.push((expected, authorized));
    }
    // Each item is a task of its own, so that decoding, validating and encoding use every
    // core; results stay in the request's order.
    // Spawned tasks do not inherit the request's origin, which their audit Events show.
    let origin = registry::ORIGIN.try_with(Clone::clone).unwrap_or_default();
    let results: Vec<ItemResult> = futures_util::stream::iter(batch.items.into_iter().zip(targets))
        .map(|(item, (expected, authorized))| {
            let app = app.clone();
            tokio::spawn(registry::ORIGIN.scope(origin.clone(), async move {
                let ns = item.namespace.as_deref().filter(|n| !n.is_empty());
                let mut out = ItemResult {
                    kind: item.kind.clone(),
                    name: item.name.clone(),
                    namespace: ns.map(str::to_string),
                    ..Default::default()
                };
                let status = item.status;
                let written = registry::update_status(
                    &app,
                    &authorized,
                    expected,
                    StatusCheck::Validate,
                    |_| Ok(status.clone()),
                )
                .await;
                match written {
                    Ok(o) => {
                        out.code = "OK".into();
                        out.resource_version = Some(o.metadata.resource_version.clone());
                    }
                    Err(e) => {
                        let e = DroError::from(e);
                        out.code = e.code.into();
                        out.message = Some(e.message);
                    }
                }
                out
            }))
        })
        .buffered(PARALLEL)
        .map(|joined| {
            joined.unwrap_or_else(|e| ItemResult {
                code: "INTERNAL".into(),
                message: Some(e.to_string()),
                ..Default::default()
            })
        })
        .collect()
        .await;
    let failed = results.iter().filter(|r| r.code != "OK").count();
    Ok(super::answers::send(
        http::StatusCode::OK,
        &BatchResult {
            applied: results.len() - failed,
            failed,
            results,
        },
    ))
}
