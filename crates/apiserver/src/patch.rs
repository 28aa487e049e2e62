//! PATCH: JSON patch (RFC 6902), JSON merge patch (RFC 7386), and the strategic merge patch
//! of Kubernetes, written here because no crate does it.
//!
//! The strategic merge patch follows `k8s.io/apimachinery/pkg/util/strategicpatch`: maps merge
//! key by key (`null` deletes); lists follow their schema's `x-kubernetes-patch-strategy` (atomic
//! lists are replaced; `merge` lists of objects merge element-wise by
//! `x-kubernetes-patch-merge-key`; `merge` lists of scalars are unioned); and the directives
//! `$patch` (replace, delete, merge), `$retainKeys`, `$setElementOrder/<field>` and
//! `$deleteFromPrimitiveList/<field>` are honoured. The patch metadata comes from the same
//! OpenAPI schemas the server publishes.

use serde_json::{Map, Value};

use crate::schema::SchemaSet;

/// The patch formats a PATCH request may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchType {
    Json,
    Merge,
    Strategic,
    Apply,
}

impl PatchType {
    pub fn from_content_type(ct: &str) -> Option<Self> {
        let base = ct.split(';').next().unwrap_or("").trim();
        match base {
            "application/json-patch+json" => Some(PatchType::Json),
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => {
                Some(PatchType::Apply)
            }
            _ => None,
        }
    }
}

/// Why a patch could not be applied.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct PatchError(pub String);

fn err(msg: impl Into<String>) -> PatchError {
    PatchError(msg.into())
}

/// Why a JSON patch was not applied: it does not decode (a bad request), or one of its
/// operations fails on this object (a `test` that does not hold, a path that is not there),
/// which kube-apiserver answers 422 and clients such as kopf retry on.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum JsonPatchError {
    #[error("invalid JSON patch: {0}")]
    Decode(String),
    #[error("the JSON patch failed: {0}")]
    Failed(String),
}

/// Applies an RFC 6902 JSON patch.
pub fn json_patch(doc: &mut Value, patch: &Value) -> Result<(), JsonPatchError> {
    let ops: json_patch::Patch =
        serde_json::from_value(patch.clone()).map_err(|e| JsonPatchError::Decode(e.to_string()))?;
    // Not `json_patch::patch`: it undoes the operations applied before a failing one, and
    // panics where an undo fails (a move of `/a/0` to `/a`, undone, is a move into its own
    // child: found by fuzzing, `fuzz/regressions/json_patch/`). Applied to a copy instead,
    // kept only whole.
    let mut out = doc.clone();
    json_patch::patch_unsafe(&mut out, &ops).map_err(|e| JsonPatchError::Failed(e.to_string()))?;
    *doc = out;
    Ok(())
}

/// Applies an RFC 7386 merge patch.
pub fn merge_patch(doc: &mut Value, patch: &Value) -> Result<(), PatchError> {
    if !patch.is_object() {
        return Err(err("a merge patch must be a JSON object"));
    }
    json_patch::merge(doc, patch);
    Ok(())
}

/// Where in the schema a patch is being applied, for looking up list strategies.
#[derive(Clone, Copy, Debug)]
pub struct Meta<'a> {
    set: &'a SchemaSet,
    schema: Option<&'a Value>,
}

/// A field's patch strategy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Tags {
    merge: bool,
    retain_keys: bool,
    key: Option<String>,
}

impl<'a> Meta<'a> {
    pub fn new(set: &'a SchemaSet, schema: Option<&'a Value>) -> Self {
        Meta { set, schema }
    }

    fn resolved(&self) -> Option<&'a Value> {
        let s = self.schema?;
        let (r, _) = self.set.resolve(s);
        (!r.is_null()).then_some(r)
    }

    /// The tags and the schema of field `name` of this object.
    fn field(&self, name: &str) -> (Tags, Meta<'a>) {
        let Some(schema) = self.resolved() else {
            return (
                Tags::default(),
                Meta {
                    set: self.set,
                    schema: None,
                },
            );
        };
        let prop = schema
            .get("properties")
            .and_then(|p| p.get(name))
            .or_else(|| schema.get("additionalProperties").filter(|a| a.is_object()));
        let Some(prop) = prop else {
            return (
                Tags::default(),
                Meta {
                    set: self.set,
                    schema: None,
                },
            );
        };
        let strategy = prop
            .get("x-kubernetes-patch-strategy")
            .and_then(Value::as_str)
            .unwrap_or("");
        let tags = Tags {
            merge: strategy.split(',').any(|s| s == "merge"),
            retain_keys: strategy.split(',').any(|s| s == "retainKeys"),
            key: prop
                .get("x-kubernetes-patch-merge-key")
                .and_then(Value::as_str)
                .map(str::to_string),
        };
        (
            tags,
            Meta {
                set: self.set,
                schema: Some(prop),
            },
        )
    }

    fn items(&self) -> Meta<'a> {
        let items = self.resolved().and_then(|s| s.get("items"));
        Meta {
            set: self.set,
            schema: items,
        }
    }
}

/// How a list's elements are owned and merged by server-side apply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ListKind {
    /// One value, replaced whole.
    Atomic,
    /// Scalars, each element its own field (`v:` paths).
    Set,
    /// Objects identified by these keys (`k:` paths).
    Map(Vec<String>),
}

impl<'a> Meta<'a> {
    /// The schema of field `name`, and how it merges when it is a list, and whether it is a
    /// map owned as a whole.
    pub(crate) fn shape(&self, name: &str) -> (ListKind, bool, Meta<'a>) {
        let (tags, child) = self.field(name);
        let raw = child.resolved();
        let get = |k: &str| {
            child
                .schema
                .and_then(|s| s.get(k))
                .or_else(|| raw.and_then(|r| r.get(k)))
        };
        let atomic_map = get("x-kubernetes-map-type").and_then(Value::as_str) == Some("atomic");
        let list = match get("x-kubernetes-list-type").and_then(Value::as_str) {
            Some("map") => ListKind::Map(
                get("x-kubernetes-list-map-keys")
                    .and_then(Value::as_array)
                    .map(|ks| {
                        ks.iter()
                            .filter_map(Value::as_str)
                            .map(str::to_string)
                            .collect()
                    })
                    .unwrap_or_default(),
            ),
            Some("set") => ListKind::Set,
            Some(_) => ListKind::Atomic,
            None if tags.merge => match tags.key {
                Some(k) => ListKind::Map(vec![k]),
                None => ListKind::Set,
            },
            None => ListKind::Atomic,
        };
        (list, atomic_map, child)
    }

    /// The schema of a list's elements.
    pub(crate) fn element(&self) -> Meta<'a> {
        self.items()
    }
}

const PATCH: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const SET_ORDER: &str = "$setElementOrder/";
const DELETE_PRIMITIVE: &str = "$deleteFromPrimitiveList/";

/// Applies a strategic merge patch to `original`.
pub fn strategic_merge(
    original: &Value,
    patch: &Value,
    meta: Meta<'_>,
) -> Result<Value, PatchError> {
    let (Value::Object(orig), Value::Object(p)) = (original, patch) else {
        return Err(err("a strategic merge patch must be a JSON object"));
    };
    match merge_map(orig.clone(), p, meta)? {
        Some(m) => Ok(Value::Object(m)),
        None => Err(err(
            "a strategic merge patch may not delete the whole object",
        )),
    }
}

/// Merges `patch` into `original`; `None` means "$patch: delete".
fn merge_map(
    mut original: Map<String, Value>,
    patch: &Map<String, Value>,
    meta: Meta<'_>,
) -> Result<Option<Map<String, Value>>, PatchError> {
    match patch.get(PATCH) {
        None => {}
        Some(Value::String(d)) if d == "replace" => return Ok(Some(strip_directives(patch)?)),
        Some(Value::String(d)) if d == "delete" => return Ok(None),
        Some(Value::String(d)) if d == "merge" => {}
        Some(other) => return Err(err(format!("unknown patch directive {PATCH}: {other}"))),
    }
    if let Some(retain) = patch.get(RETAIN_KEYS) {
        let Value::Array(keys) = retain else {
            return Err(err(format!("{RETAIN_KEYS} must be a list of field names")));
        };
        let keep: Vec<&str> = keys.iter().filter_map(Value::as_str).collect();
        if keep.len() != keys.len() {
            return Err(err(format!("{RETAIN_KEYS} must be a list of field names")));
        }
        original.retain(|k, _| keep.contains(&k.as_str()));
    }
    // Deletions from primitive lists first, so that a list both trimmed and extended works.
    for (k, v) in patch {
        if let Some(field) = k.strip_prefix(DELETE_PRIMITIVE) {
            let Value::Array(remove) = v else {
                return Err(err(format!("{k} must be a list")));
            };
            if let Some(Value::Array(list)) = original.get_mut(field) {
                list.retain(|x| !remove.contains(x));
            }
        }
    }
    for (k, pv) in patch {
        if k.starts_with('$') {
            if !(k == PATCH
                || k == RETAIN_KEYS
                || k.starts_with(SET_ORDER)
                || k.starts_with(DELETE_PRIMITIVE))
            {
                return Err(err(format!("unknown patch directive {k}")));
            }
            continue;
        }
        let (tags, child) = meta.field(k);
        if pv.is_null() {
            original.remove(k);
            continue;
        }
        let order = patch.get(&format!("{SET_ORDER}{k}"));
        let merged = match (original.remove(k), pv) {
            (Some(Value::Object(o)), Value::Object(p)) => {
                merge_map(o, p, child)?.map(Value::Object)
            }
            (Some(Value::Array(o)), Value::Array(p)) => {
                Some(Value::Array(merge_list(o, p, &tags, child, order)?))
            }
            (None, Value::Object(p)) => merge_map(Map::new(), p, child)?.map(Value::Object),
            (None, Value::Array(p)) => Some(Value::Array(merge_list(
                Vec::new(),
                p,
                &tags,
                child,
                order,
            )?)),
            (_, other) => Some(other.clone()),
        };
        if let Some(v) = merged {
            original.insert(k.clone(), v);
        }
    }
    // An order directive may name a list the patch does not otherwise touch.
    for (k, order) in patch {
        if let Some(field) = k.strip_prefix(SET_ORDER)
            && !patch.contains_key(field)
            && let Some(Value::Array(list)) = original.remove(field)
        {
            let (tags, _) = meta.field(field);
            let ordered = apply_order(list, &[], Some(order), tags.key.as_deref())?;
            original.insert(field.to_string(), Value::Array(ordered));
        }
    }
    Ok(Some(original))
}

fn strip_directives(m: &Map<String, Value>) -> Result<Map<String, Value>, PatchError> {
    let mut out = Map::new();
    for (k, v) in m {
        if k.starts_with('$') {
            continue;
        }
        out.insert(k.clone(), strip_value(v)?);
    }
    Ok(out)
}

fn strip_value(v: &Value) -> Result<Value, PatchError> {
    Ok(match v {
        Value::Object(m) => Value::Object(strip_directives(m)?),
        Value::Array(a) => Value::Array(
            a.iter()
                .filter(|x| !x.as_object().is_some_and(|m| m.contains_key(PATCH)))
                .map(strip_value)
                .collect::<Result<_, _>>()?,
        ),
        other => other.clone(),
    })
}

fn key_of<'v>(item: &'v Value, key: &str) -> Option<&'v Value> {
    item.as_object().and_then(|m| m.get(key))
}

fn merge_list(
    original: Vec<Value>,
    patch: &[Value],
    tags: &Tags,
    meta: Meta<'_>,
    order: Option<&Value>,
) -> Result<Vec<Value>, PatchError> {
    // `{"$patch": "replace"}` as an element replaces the whole list with the rest.
    if patch
        .iter()
        .any(|x| x.get(PATCH).and_then(Value::as_str) == Some("replace"))
    {
        return patch
            .iter()
            .filter(|x| x.get(PATCH).is_none())
            .map(strip_value)
            .collect();
    }
    if !tags.merge {
        // Atomic: the patch's list is the new list.
        return patch.iter().map(strip_value).collect();
    }
    let item_meta = meta.items();
    let maps = original.iter().chain(patch.iter()).any(Value::is_object);
    let merged = if !maps {
        let mut out = original.clone();
        for v in patch {
            if !out.contains(v) {
                out.push(v.clone());
            }
        }
        out
    } else {
        let key = tags
            .key
            .as_deref()
            .ok_or_else(|| err("cannot merge lists of objects without a merge key"))?;
        let mut out = original.clone();
        for p in patch {
            let Value::Object(pm) = p else {
                return Err(err(format!(
                    "a merge list keyed by {key} may only hold objects"
                )));
            };
            let Some(kv) = pm.get(key) else {
                return Err(err(format!(
                    "an element of a list merged by {key} lacks {key}"
                )));
            };
            let pos = out.iter().position(|o| key_of(o, key) == Some(kv));
            match pm.get(PATCH).and_then(Value::as_str) {
                Some("delete") => {
                    out.retain(|o| key_of(o, key) != Some(kv));
                    continue;
                }
                Some("replace") | Some("merge") | None => {}
                Some(other) => {
                    return Err(err(format!("unknown patch directive {PATCH}: {other}")));
                }
            }
            match pos {
                Some(i) => {
                    let base = out[i].as_object().cloned().unwrap_or_default();
                    match merge_map(base, pm, item_meta)? {
                        Some(m) => out[i] = Value::Object(m),
                        None => {
                            out.remove(i);
                        }
                    }
                }
                None => {
                    if let Some(m) = merge_map(Map::new(), pm, item_meta)? {
                        out.push(Value::Object(m));
                    }
                }
            }
        }
        out
    };
    let live: Vec<Value> = original;
    let patch_order: Vec<Value> = patch
        .iter()
        .filter(|p| p.get(PATCH).and_then(Value::as_str) != Some("delete"))
        .cloned()
        .collect();
    apply_order_with_live(merged, &patch_order, order, tags.key.as_deref(), &live)
}

fn identity<'v>(v: &'v Value, key: Option<&str>) -> Option<&'v Value> {
    match key {
        Some(k) => key_of(v, k),
        None => Some(v),
    }
}

fn apply_order(
    list: Vec<Value>,
    patch: &[Value],
    order: Option<&Value>,
    key: Option<&str>,
) -> Result<Vec<Value>, PatchError> {
    let live = list.clone();
    apply_order_with_live(list, patch, order, key, &live)
}

/// Orders a merged list as Kubernetes does: elements the patch mentions follow
/// `$setElementOrder` (or the patch's own order); the others keep their live order and are
/// interleaved by their positions in the live list.
fn apply_order_with_live(
    merged: Vec<Value>,
    patch: &[Value],
    order: Option<&Value>,
    key: Option<&str>,
    live: &[Value],
) -> Result<Vec<Value>, PatchError> {
    let wanted: Vec<Value> = match order {
        Some(Value::Array(o)) => o.clone(),
        Some(_) => return Err(err("$setElementOrder must be a list")),
        None => patch.to_vec(),
    };
    let wanted_ids: Vec<&Value> = wanted.iter().filter_map(|w| identity(w, key)).collect();
    let pos_in = |ids: &[&Value], v: &Value| {
        identity(v, key).and_then(|id| ids.iter().position(|x| *x == id))
    };
    let live_ids: Vec<&Value> = live.iter().filter_map(|l| identity(l, key)).collect();
    let (mut mentioned, mut server_only): (Vec<Value>, Vec<Value>) = merged
        .into_iter()
        .partition(|v| pos_in(&wanted_ids, v).is_some());
    mentioned.sort_by_key(|v| pos_in(&wanted_ids, v));
    server_only.sort_by_key(|v| pos_in(&live_ids, v).unwrap_or(usize::MAX));
    // mergeSortedSlice: insert server-only elements before the first mentioned element that
    // comes after them in the live list.
    let mut out = Vec::with_capacity(mentioned.len() + server_only.len());
    let (mut i, mut j) = (0, 0);
    while i < server_only.len() || j < mentioned.len() {
        if i >= server_only.len() {
            out.push(mentioned[j].clone());
            j += 1;
        } else if j >= mentioned.len() {
            out.push(server_only[i].clone());
            i += 1;
        } else {
            let (li, ri) = (
                pos_in(&live_ids, &server_only[i]),
                pos_in(&live_ids, &mentioned[j]),
            );
            if let (Some(l), Some(r)) = (li, ri)
                && l < r
            {
                out.push(server_only[i].clone());
                i += 1;
            } else {
                out.push(mentioned[j].clone());
                j += 1;
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::Schemas;
    use serde_json::json;

    fn smp(kind: &str, original: Value, patch: Value) -> Result<Value, PatchError> {
        let set = Schemas::new().set();
        let schema = set.get(kind).cloned();
        strategic_merge(&original, &patch, Meta::new(&set, schema.as_ref()))
    }

    fn deploy(containers: Value) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "labels": {"app": "web"}},
               "spec": {"replicas": 1, "template": {"spec": {"containers": containers}}}})
    }

    const DEPLOY: &str = "io.k8s.api.apps.v1.Deployment";

    #[test]
    fn containers_merge_by_name() {
        let orig = deploy(
            json!([{"name": "web", "image": "nginx:1", "env": [{"name": "A", "value": "1"}]},
                                 {"name": "side", "image": "busybox"}]),
        );
        let patch = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "web", "image": "nginx:2", "env": [{"name": "B", "value": "2"}]}]}}}});
        let out = smp(DEPLOY, orig, patch).unwrap();
        let c = &out["spec"]["template"]["spec"]["containers"];
        assert_eq!(c.as_array().unwrap().len(), 2, "the sidecar stays");
        assert_eq!(c[0]["image"], "nginx:2");
        // As in Kubernetes, elements new to the live list come before the server-only ones
        // unless a $setElementOrder says otherwise.
        assert_eq!(
            c[0]["env"],
            json!([{"name": "B", "value": "2"}, {"name": "A", "value": "1"}])
        );
        assert_eq!(c[1]["name"], "side");
    }

    #[test]
    fn kubectl_style_patch_with_order_and_deletes() {
        // What kubectl sends when apply changes the image, drops env A and adds env C.
        let orig = deploy(json!([{"name": "web", "image": "nginx:1",
            "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]}]));
        let patch = json!({"spec": {"template": {"spec": {
            "$setElementOrder/containers": [{"name": "web"}],
            "containers": [{"name": "web", "image": "nginx:2",
                "$setElementOrder/env": [{"name": "B"}, {"name": "C"}],
                "env": [{"name": "A", "$patch": "delete"}, {"name": "C", "value": "3"}]}]}}}});
        let out = smp(DEPLOY, orig, patch).unwrap();
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"][0]["env"],
            json!([{"name": "B", "value": "2"}, {"name": "C", "value": "3"}])
        );
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"][0]["image"],
            "nginx:2"
        );
        assert!(
            !out.to_string().contains('$'),
            "no directive survives: {out}"
        );
    }

    #[test]
    fn set_element_order_interleaves_server_only_items() {
        let orig = deploy(json!([{"name": "a"}, {"name": "x"}, {"name": "b"}, {"name": "y"}]));
        let patch = json!({"spec": {"template": {"spec": {
            "$setElementOrder/containers": [{"name": "b"}, {"name": "a"}],
            "containers": [{"name": "a", "image": "i"}]}}}});
        let out = smp(DEPLOY, orig, patch).unwrap();
        let names: Vec<_> = out["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        // What apimachinery's mergeSortedSlice gives: "x" precedes "b" in the live list.
        assert_eq!(names, ["x", "b", "a", "y"]);
    }

    #[test]
    fn atomic_lists_replace_and_maps_merge() {
        let mut orig = deploy(json!([{"name": "web"}]));
        orig["spec"]["template"]["spec"]["tolerations"] = json!([{"key": "a"}, {"key": "b"}]);
        let patch = json!({"metadata": {"labels": {"tier": "fe", "app": null}},
                           "spec": {"replicas": 3, "template": {"spec": {"tolerations": [{"key": "c"}]}}}});
        let out = smp(DEPLOY, orig, patch).unwrap();
        assert_eq!(
            out["spec"]["template"]["spec"]["tolerations"],
            json!([{"key": "c"}])
        );
        assert_eq!(out["metadata"]["labels"], json!({"tier": "fe"}));
        assert_eq!(out["spec"]["replicas"], 3);
    }

    #[test]
    fn primitive_lists_and_directives() {
        let orig = json!({"metadata": {"name": "x", "finalizers": ["a", "b"]}, "spec": {}});
        let patch = json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"], "finalizers": ["c"]}});
        let out = smp(DEPLOY, orig.clone(), patch).unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["c", "b"]));

        let replace = json!({"spec": {"template": {"spec": {"containers": [{"$patch": "replace"}, {"name": "only"}]}}}});
        let out = smp(
            DEPLOY,
            deploy(json!([{"name": "a"}, {"name": "b"}])),
            replace,
        )
        .unwrap();
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"],
            json!([{"name": "only"}])
        );

        let map_replace = json!({"metadata": {"labels": {"$patch": "replace", "new": "1"}}});
        let out = smp(DEPLOY, deploy(json!([])), map_replace).unwrap();
        assert_eq!(out["metadata"]["labels"], json!({"new": "1"}));

        let map_delete = json!({"spec": {"template": {"$patch": "delete"}}});
        let out = smp(DEPLOY, deploy(json!([])), map_delete).unwrap();
        assert!(out["spec"].get("template").is_none());
    }

    #[test]
    fn retain_keys_clears_other_union_members() {
        let orig = json!({"spec": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}}});
        let patch = json!({"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}}});
        let out = smp(DEPLOY, orig, patch).unwrap();
        assert_eq!(out["spec"]["strategy"], json!({"type": "Recreate"}));

        let pod = json!({"spec": {"volumes": [{"name": "v", "emptyDir": {}}]}});
        let patch = json!({"spec": {"volumes": [{"name": "v", "$retainKeys": ["configMap", "name"], "configMap": {"name": "c"}}]}});
        let out = smp("io.k8s.api.core.v1.Pod", pod, patch).unwrap();
        assert_eq!(
            out["spec"]["volumes"],
            json!([{"name": "v", "configMap": {"name": "c"}}])
        );
    }

    #[test]
    fn bad_patches_are_errors() {
        let orig = deploy(json!([{"name": "a"}]));
        for bad in [
            json!({"$patch": "explode"}),
            json!({"spec": {"template": {"spec": {"containers": [{"image": "no-name"}]}}}}),
            json!({"metadata": {"$retainKeys": "name"}}),
            json!({"metadata": {"$bogus": 1}}),
            json!({"spec": {"template": {"spec": {"$setElementOrder/containers": "x", "containers": []}}}}),
        ] {
            assert!(smp(DEPLOY, orig.clone(), bad.clone()).is_err(), "{bad}");
        }
        assert!(smp(DEPLOY, orig.clone(), json!({"$patch": "delete"})).is_err());
        assert!(smp(DEPLOY, orig, json!([1])).is_err());
    }

    #[test]
    fn json_and_merge_patches() {
        let mut doc = json!({"a": {"b": 1, "c": [1, 2]}});
        json_patch(&mut doc, &json!([{"op": "replace", "path": "/a/b", "value": 2}, {"op": "add", "path": "/a/c/-", "value": 3}])).unwrap();
        assert_eq!(doc, json!({"a": {"b": 2, "c": [1, 2, 3]}}));
        assert!(matches!(
            json_patch(&mut doc, &json!([{"op": "remove", "path": "/missing"}])),
            Err(JsonPatchError::Failed(_))
        ));
        assert!(matches!(
            json_patch(
                &mut doc,
                &json!([{"op": "test", "path": "/a/b", "value": 7}])
            ),
            Err(JsonPatchError::Failed(_))
        ));
        assert!(matches!(
            json_patch(&mut doc, &json!({"op": "add"})),
            Err(JsonPatchError::Decode(_))
        ));
        merge_patch(&mut doc, &json!({"a": {"b": null, "c": [9]}})).unwrap();
        assert_eq!(doc, json!({"a": {"c": [9]}}));
        assert!(merge_patch(&mut doc, &json!([1])).is_err());
    }

    /// A patch whose later operation fails leaves the object as it was, whatever the earlier
    /// ones did: a move into what was the moved value's parent, then a failing test, made
    /// json-patch's own undo panic.
    #[test]
    fn a_failing_json_patch_changes_nothing_and_does_not_panic() {
        let mut doc = json!({"a": [1, 2]});
        let p = json!([{"op": "move", "from": "/a/0", "path": "/a"},
                       {"op": "test", "path": "/b", "value": 0}]);
        assert!(matches!(
            json_patch(&mut doc, &p),
            Err(JsonPatchError::Failed(_))
        ));
        assert_eq!(doc, json!({"a": [1, 2]}));
        let p = json!([{"op": "move", "from": "/a/0", "path": "/a"}]);
        json_patch(&mut doc, &p).unwrap();
        assert_eq!(doc, json!({"a": 1}));
    }
}
