//! OpenAPI v3 (`/openapi/v3`, one document per group/version) and v2 (`/openapi/v2`).
//!
//! Every PATCH operation names its kind (`x-kubernetes-group-version-kind`) and declares the
//! `fieldValidation` parameter: that is how kubectl learns that validation happens on the
//! server, so `kubectl apply` works with its default validation. The strategic merge patch
//! content type is listed only for kinds that support it, so kubectl computes strategic
//! patches exactly where the server applies them (from the same schemas' patch tags).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Map, Value, json};
use sha2::{Digest, Sha512};

use crate::resources::{Registry, ResourceType};
use crate::schema::{self, Components, SchemaSet, reference};

/// A rendered document and its hash.
#[derive(Debug)]
pub struct Doc {
    pub bytes: Vec<u8>,
    pub hash: String,
}

/// Rendered documents, dropped whenever the set of served resources changes.
#[derive(Debug, Default)]
pub struct Cache {
    docs: Mutex<HashMap<String, Arc<Doc>>>,
}

impl Cache {
    pub fn invalidate(&self) {
        self.docs.lock().clear();
    }

    pub fn get_or_build(&self, key: &str, build: impl FnOnce() -> Value) -> Arc<Doc> {
        self.get_or_build_bytes(key, || serde_json::to_vec(&build()).unwrap_or_default())
    }

    pub fn get_or_build_bytes(&self, key: &str, build: impl FnOnce() -> Vec<u8>) -> Arc<Doc> {
        if let Some(d) = self.docs.lock().get(key) {
            return d.clone();
        }
        let bytes = build();
        let hash: String = Sha512::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02X}"))
            .collect();
        let doc = Arc::new(Doc { bytes, hash });
        self.docs.lock().insert(key.to_string(), doc.clone());
        doc
    }
}

/// `api/v1` or `apis/<group>/<version>`.
pub fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

fn camel(s: &str) -> String {
    s.split(['.', '-'])
        .map(|p| {
            let mut c = p.chars();
            match c.next() {
                Some(f) => f.to_uppercase().collect::<String>() + c.as_str(),
                None => String::new(),
            }
        })
        .collect()
}

fn param(name: &str, location: &str, ty: &str, description: &str) -> Value {
    let mut p = json!({ "name": name, "in": location, "description": description, "schema": { "type": ty, "uniqueItems": true } });
    if location == "path" {
        p["required"] = json!(true);
    }
    p
}

fn list_params() -> Vec<Value> {
    vec![
        param(
            "allowWatchBookmarks",
            "query",
            "boolean",
            "allowWatchBookmarks requests watch events with type \"BOOKMARK\".",
        ),
        param(
            "continue",
            "query",
            "string",
            "The continue option should be set when retrieving more results from the server.",
        ),
        param(
            "fieldSelector",
            "query",
            "string",
            "A selector to restrict the list of returned objects by their fields.",
        ),
        param(
            "labelSelector",
            "query",
            "string",
            "A selector to restrict the list of returned objects by their labels.",
        ),
        param(
            "limit",
            "query",
            "integer",
            "limit is a maximum number of responses to return for a list call.",
        ),
        param(
            "resourceVersion",
            "query",
            "string",
            "resourceVersion sets a constraint on what resource versions a request may be served from.",
        ),
        param(
            "resourceVersionMatch",
            "query",
            "string",
            "resourceVersionMatch determines how resourceVersion is applied to list calls.",
        ),
        param(
            "sendInitialEvents",
            "query",
            "boolean",
            "`sendInitialEvents=true` may be set together with `watch=true`.",
        ),
        param(
            "timeoutSeconds",
            "query",
            "integer",
            "Timeout for the list/watch call.",
        ),
        param(
            "watch",
            "query",
            "boolean",
            "Watch for changes to the described resources and return them as a stream of add, update, and remove notifications.",
        ),
    ]
}

fn write_params(patch: bool) -> Vec<Value> {
    let mut v = vec![
        param(
            "dryRun",
            "query",
            "string",
            "When present, indicates that modifications should not be persisted. Valid value: All.",
        ),
        param(
            "fieldManager",
            "query",
            "string",
            "fieldManager is a name associated with the actor or entity that is making these changes.",
        ),
        param(
            "fieldValidation",
            "query",
            "string",
            "fieldValidation instructs the server on how to handle objects in the request containing unknown or duplicate fields. Valid values are: Ignore, Warn (the default), Strict.",
        ),
    ];
    if patch {
        v.push(param(
            "force",
            "query",
            "boolean",
            "Force is going to \"force\" Apply requests (server-side apply is not supported yet).",
        ));
    }
    v
}

fn delete_params() -> Vec<Value> {
    vec![
        param(
            "dryRun",
            "query",
            "string",
            "When present, indicates that modifications should not be persisted. Valid value: All.",
        ),
        param(
            "gracePeriodSeconds",
            "query",
            "integer",
            "The duration in seconds before the object should be deleted.",
        ),
        param(
            "orphanDependents",
            "query",
            "boolean",
            "Deprecated: use propagationPolicy.",
        ),
        param(
            "propagationPolicy",
            "query",
            "string",
            "Whether and how garbage collection will be performed: Orphan, Background or Foreground.",
        ),
    ]
}

fn json_body(schema: Value) -> Value {
    json!({ "content": { "application/json": { "schema": schema }, "application/yaml": { "schema": schema } }, "required": true })
}

fn ok(schema: Value) -> Value {
    json!({
        "200": { "description": "OK", "content": { "application/json": { "schema": schema } } },
        "401": { "description": "Unauthorized" },
    })
}

fn gvk(group: &str, version: &str, kind: &str) -> Value {
    json!({ "group": group, "version": version, "kind": kind })
}

struct OpBuilder<'a> {
    rt: &'a ResourceType,
    tag: String,
}

impl OpBuilder<'_> {
    #[allow(clippy::too_many_arguments)] // One operation object has that many parts.
    fn op(
        &self,
        action: &str,
        verb: &str,
        scope: &str,
        suffix: &str,
        params: Vec<Value>,
        body: Option<Value>,
        response: Value,
        kind: (&str, &str, &str),
    ) -> Value {
        let id = format!(
            "{verb}{}{}{scope}{}{suffix}",
            camel(if self.rt.group.is_empty() {
                "core"
            } else {
                &self.rt.group
            }),
            camel(&self.rt.version),
            self.rt.kind
        );
        let mut op = json!({
            "tags": [self.tag],
            "description": format!("{action} {}", self.rt.kind),
            "operationId": id,
            "parameters": params,
            "responses": ok(response),
            "x-kubernetes-action": action,
            "x-kubernetes-group-version-kind": gvk(kind.0, kind.1, kind.2),
        });
        if let Some(b) = body {
            op["requestBody"] = b;
        }
        op
    }
}

fn list_component(rt: &ResourceType) -> String {
    format!("{}List", rt.schema)
}

/// The OpenAPI v3 document of one group/version.
pub fn v3_document(reg: &Registry, set: &SchemaSet, group: &str, version: &str) -> Option<Value> {
    let types = reg.in_group_version(group, version);
    if types.is_empty() {
        return None;
    }
    let mut paths = Map::new();
    let mut roots: Vec<String> = vec![
        schema::STATUS.into(),
        schema::DELETE_OPTIONS.into(),
        schema::PATCH_COMPONENT.into(),
        schema::LIST_META.into(),
    ];
    let mut extra = Components::new();
    let base = if group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{group}/{version}")
    };
    for rt in &types {
        roots.push(rt.schema.clone());
        extra.insert(
            list_component(rt),
            json!({
                "description": format!("{} is a list of {}.", rt.list_kind, rt.kind),
                "type": "object",
                "required": ["items"],
                "properties": {
                    "apiVersion": { "type": "string" },
                    "kind": { "type": "string" },
                    "items": { "type": "array", "items": reference(&rt.schema) },
                    "metadata": { "allOf": [reference(schema::LIST_META)], "default": {} },
                },
                "x-kubernetes-group-version-kind": [gvk(&rt.group, &rt.version, &rt.list_kind)],
            }),
        );
        let kind = (rt.group.as_str(), rt.version.as_str(), rt.kind.as_str());
        let b = OpBuilder {
            rt,
            tag: format!(
                "{}_{}",
                camel(if group.is_empty() { "core" } else { group }),
                version
            ),
        };
        let obj = reference(&rt.schema);
        let list = reference(&list_component(rt));
        let status = reference(schema::STATUS);
        let mut patch_types = Map::new();
        patch_types.insert(
            "application/json-patch+json".into(),
            json!({ "schema": reference(schema::PATCH_COMPONENT) }),
        );
        patch_types.insert(
            "application/merge-patch+json".into(),
            json!({ "schema": reference(schema::PATCH_COMPONENT) }),
        );
        if rt.strategic_merge {
            patch_types.insert(
                "application/strategic-merge-patch+json".into(),
                json!({ "schema": reference(schema::PATCH_COMPONENT) }),
            );
        }
        let patch_body = json!({ "content": patch_types, "required": true });
        let name_param = param(
            "name",
            "path",
            "string",
            &format!("name of the {}", rt.kind),
        );
        let ns_param = param(
            "namespace",
            "path",
            "string",
            "object name and auth scope, such as for teams and projects",
        );
        let (collection, item, scope) = if rt.namespaced {
            (
                format!("{base}/namespaces/{{namespace}}/{}", rt.plural),
                format!("{base}/namespaces/{{namespace}}/{}/{{name}}", rt.plural),
                "Namespaced",
            )
        } else {
            (
                format!("{base}/{}", rt.plural),
                format!("{base}/{}/{{name}}", rt.plural),
                "",
            )
        };
        let scope_params = |mut v: Vec<Value>, named: bool| {
            if rt.namespaced {
                v.insert(0, ns_param.clone());
            }
            if named {
                v.insert(0, name_param.clone());
            }
            v
        };
        let mut del_coll = delete_params();
        del_coll.extend(list_params());
        paths.insert(
            collection,
            json!({
                "get": b.op("list", "list", scope, "", scope_params(list_params(), false), None, list.clone(), kind),
                "post": b.op("post", "create", scope, "", scope_params(write_params(false), false), Some(json_body(obj.clone())), obj.clone(), kind),
                "delete": b.op("deletecollection", "deleteCollection", scope, "", scope_params(del_coll, false), Some(json_body(reference(schema::DELETE_OPTIONS))), status.clone(), kind),
            }),
        );
        paths.insert(
            item.clone(),
            json!({
                "get": b.op("get", "read", scope, "", scope_params(vec![], true), None, obj.clone(), kind),
                "put": b.op("put", "replace", scope, "", scope_params(write_params(false), true), Some(json_body(obj.clone())), obj.clone(), kind),
                "patch": b.op("patch", "patch", scope, "", scope_params(write_params(true), true), Some(patch_body.clone()), obj.clone(), kind),
                "delete": b.op("delete", "delete", scope, "", scope_params(delete_params(), true), Some(json_body(reference(schema::DELETE_OPTIONS))), obj.clone(), kind),
            }),
        );
        if rt.namespaced {
            paths.insert(
                format!("{base}/{}", rt.plural),
                json!({ "get": b.op("list", "list", "ForAllNamespaces", "", list_params(), None, list.clone(), kind) }),
            );
        }
        if rt.status {
            paths.insert(
                format!("{item}/status"),
                json!({
                    "get": b.op("get", "read", scope, "Status", scope_params(vec![], true), None, obj.clone(), kind),
                    "put": b.op("put", "replace", scope, "Status", scope_params(write_params(false), true), Some(json_body(obj.clone())), obj.clone(), kind),
                    "patch": b.op("patch", "patch", scope, "Status", scope_params(write_params(true), true), Some(patch_body.clone()), obj.clone(), kind),
                }),
            );
        }
        if rt.scale.is_some() {
            roots.push(schema::SCALE.into());
            let scale = reference(schema::SCALE);
            let skind = ("autoscaling", "v1", "Scale");
            paths.insert(
                format!("{item}/scale"),
                json!({
                    "get": b.op("get", "read", scope, "Scale", scope_params(vec![], true), None, scale.clone(), skind),
                    "put": b.op("put", "replace", scope, "Scale", scope_params(write_params(false), true), Some(json_body(scale.clone())), scale.clone(), skind),
                    "patch": b.op("patch", "patch", scope, "Scale", scope_params(write_params(true), true), Some(patch_body.clone()), scale, skind),
                }),
            );
        }
    }
    let root_refs: Vec<&str> = roots.iter().map(String::as_str).collect();
    let mut components = set.closure(&root_refs);
    components.extend(extra);
    Some(json!({
        "openapi": "3.0.0",
        "info": { "title": "Orrery", "version": crate::discovery::version()["gitVersion"] },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": { "BearerToken": { "type": "apiKey", "description": "Bearer Token authentication", "name": "authorization", "in": "header" } },
        },
        "security": [{ "BearerToken": [] }],
    }))
}

/// `/openapi/v3`: where each group/version's document is, with its hash.
pub fn v3_index(reg: &Registry, set: &SchemaSet, cache: &Cache) -> Value {
    let mut paths = Map::new();
    for (g, versions) in reg.groups() {
        for v in versions {
            let key = gv_path(&g, &v);
            let doc = cache.get_or_build(&key, || {
                v3_document(reg, set, &g, &v).unwrap_or(Value::Null)
            });
            paths.insert(
                key.clone(),
                json!({ "serverRelativeURL": format!("/openapi/v3/{key}?hash={}", doc.hash) }),
            );
        }
    }
    json!({ "paths": paths })
}

/// `/openapi/v2`: the v3 documents merged and rewritten as Swagger 2.0.
pub fn v2_document(reg: &Registry, set: &SchemaSet) -> Value {
    let mut paths = Map::new();
    let mut definitions = Map::new();
    for (g, versions) in reg.groups() {
        for v in versions {
            let Some(doc) = v3_document(reg, set, &g, &v) else {
                continue;
            };
            if let Some(Value::Object(schemas)) = doc.pointer("/components/schemas") {
                definitions.extend(schemas.clone());
            }
            if let Some(Value::Object(p)) = doc.get("paths") {
                for (path, ops) in p {
                    let mut converted = Map::new();
                    for (method, op) in ops.as_object().into_iter().flatten() {
                        let mut op = op.clone();
                        if let Some(Value::Object(body)) =
                            op.as_object_mut().and_then(|o| o.remove("requestBody"))
                        {
                            let schema = body
                                .get("content")
                                .and_then(Value::as_object)
                                .and_then(|c| c.values().next())
                                .and_then(|m| m.get("schema"))
                                .cloned()
                                .unwrap_or(json!({}));
                            if let Some(Value::Array(params)) = op.get_mut("parameters") {
                                params.push(json!({ "name": "body", "in": "body", "required": true, "schema": schema }));
                            }
                        }
                        if let Some(Value::Array(params)) = op.get_mut("parameters") {
                            for p in params.iter_mut() {
                                if let Some(Value::Object(s)) = p.as_object_mut().and_then(|m| {
                                    m.remove("schema")
                                        .filter(|_| m.get("in") != Some(&json!("body")))
                                }) && let Some(t) = s.get("type")
                                {
                                    p["type"] = t.clone();
                                }
                            }
                        }
                        if let Some(schema) = op
                            .pointer("/responses/200/content/application~1json/schema")
                            .cloned()
                        {
                            op["responses"]["200"] =
                                json!({ "description": "OK", "schema": schema });
                        }
                        converted.insert(method.clone(), op);
                    }
                    paths.insert(path.clone(), Value::Object(converted));
                }
            }
        }
    }
    let doc = json!({
        "swagger": "2.0",
        "info": { "title": "Orrery", "version": crate::discovery::version()["gitVersion"] },
        "paths": paths,
        "definitions": definitions,
        "securityDefinitions": { "BearerToken": { "type": "apiKey", "name": "authorization", "in": "header" } },
        "security": [{ "BearerToken": [] }],
    });
    // Swagger 2.0 keeps its schemas under #/definitions.
    let text = serde_json::to_string(&doc)
        .unwrap_or_default()
        .replace("#/components/schemas/", "#/definitions/");
    serde_json::from_str(&text).unwrap_or(doc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::builtin;
    use crate::schema::Schemas;

    #[test]
    fn patch_operations_advertise_field_validation_and_gvk() {
        let reg = Registry::new(builtin());
        let set = Schemas::new().set();
        let doc = v3_document(&reg, &set, "apps", "v1").unwrap();
        let patch =
            &doc["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"];
        assert_eq!(
            patch["x-kubernetes-group-version-kind"],
            json!({"group": "apps", "version": "v1", "kind": "Deployment"})
        );
        let names: Vec<_> = patch["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert!(names.contains(&"fieldValidation"), "{names:?}");
        assert!(
            patch["requestBody"]["content"]
                .get("application/strategic-merge-patch+json")
                .is_some()
        );
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        assert!(schemas.contains_key("io.k8s.api.apps.v1.Deployment"));
        assert!(
            schemas.contains_key("io.k8s.api.core.v1.PodSpec"),
            "referenced schemas are included"
        );
        assert!(schemas.contains_key("io.k8s.api.autoscaling.v1.Scale"));
        assert_eq!(
            schemas["io.k8s.api.core.v1.PodSpec"]["properties"]["containers"]["x-kubernetes-patch-merge-key"],
            "name"
        );
        // Own kinds: merge patches only.
        let own = v3_document(&reg, &set, "multicluster.io", "v1alpha1").unwrap();
        let p = &own["paths"]["/apis/multicluster.io/v1alpha1/clusters/{name}"]["patch"];
        assert!(
            p["requestBody"]["content"]
                .get("application/strategic-merge-patch+json")
                .is_none()
        );
        assert!(
            p["requestBody"]["content"]
                .get("application/merge-patch+json")
                .is_some()
        );
    }

    #[test]
    fn index_and_v2() {
        let reg = Registry::new(builtin());
        let set = Schemas::new().set();
        let cache = Cache::default();
        let idx = v3_index(&reg, &set, &cache);
        let url = idx["paths"]["apis/apps/v1"]["serverRelativeURL"]
            .as_str()
            .unwrap();
        assert!(url.starts_with("/openapi/v3/apis/apps/v1?hash="));
        assert!(idx["paths"]["api/v1"].is_object());
        let v2 = v2_document(&reg, &set);
        assert_eq!(v2["swagger"], "2.0");
        assert!(v2["definitions"]["io.k8s.api.apps.v1.Deployment"].is_object());
        assert!(
            !serde_json::to_string(&v2)
                .unwrap()
                .contains("#/components/")
        );
    }
}
