//! Field ownership (`metadata.managedFields`) and server-side apply.
//!
//! Every write is attributed to a field manager (the `fieldManager` parameter, else the
//! client's user agent up to its first `/`): an *Update* takes ownership of the fields it
//! changed, away from other managers. An *Apply* (`application/apply-patch+yaml`) declares the
//! complete set of fields its manager wants: fields it applies are merged into the object
//! (lists by their merge keys); fields it applied before and no longer does are removed unless
//! another manager owns them; and a field another manager owns with a different value is a
//! conflict (409) unless the apply is forced, which takes the field over.
//!
//! Field sets are kept in Kubernetes' `FieldsV1` form: `f:<field>`, `k:<json keys>` for list
//! elements with keys, `v:<json value>` for set elements, and `.` for a node owned itself.
//! Status is not tracked (writes to the status subresource are not attributed).

use std::collections::BTreeMap;

use orrery_api::{Object, Time};
use serde_json::{Map, Value, json};

use crate::patch::{ListKind, Meta};

/// A set of field paths.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSet {
    children: BTreeMap<String, FieldSet>,
    /// The node itself is owned (a leaf, or `.` of an inner node).
    member: bool,
}

/// A path: `FieldsV1` elements from the root.
pub type Path = Vec<String>;

impl FieldSet {
    pub fn is_empty(&self) -> bool {
        !self.member && self.children.values().all(FieldSet::is_empty)
    }

    fn child(&mut self, pe: String) -> &mut FieldSet {
        self.children.entry(pe).or_default()
    }

    /// Parses `FieldsV1` JSON.
    pub fn from_fields_v1(v: &Value) -> FieldSet {
        let mut s = FieldSet::default();
        if let Value::Object(m) = v {
            if m.is_empty() {
                s.member = true;
            }
            for (k, c) in m {
                if k == "." {
                    s.member = true;
                } else {
                    s.children.insert(k.clone(), FieldSet::from_fields_v1(c));
                }
            }
        }
        s
    }

    pub fn to_fields_v1(&self) -> Value {
        let mut m = Map::new();
        for (k, c) in &self.children {
            if !c.is_empty() {
                m.insert(k.clone(), c.to_fields_v1());
            }
        }
        if self.member && !m.is_empty() {
            m.insert(".".into(), json!({}));
        }
        Value::Object(m)
    }

    /// Every owned path.
    pub fn members(&self) -> Vec<Path> {
        let mut out = Vec::new();
        self.walk(&mut Vec::new(), &mut out);
        out
    }

    fn walk(&self, at: &mut Path, out: &mut Vec<Path>) {
        if self.member || (self.children.is_empty() && !at.is_empty()) {
            out.push(at.clone());
        }
        for (k, c) in &self.children {
            at.push(k.clone());
            c.walk(at, out);
            at.pop();
        }
    }

    pub fn contains(&self, path: &[String]) -> bool {
        let mut node = self;
        for pe in path {
            match node.children.get(pe) {
                Some(n) => node = n,
                None => return false,
            }
        }
        node.member || node.children.is_empty()
    }

    pub fn insert(&mut self, path: &[String]) {
        let mut node = self;
        for pe in path {
            node = node.child(pe.clone());
        }
        node.member = true;
    }

    pub fn remove(&mut self, path: &[String]) {
        fn go(n: &mut FieldSet, path: &[String]) {
            match path.split_first() {
                None => n.member = false,
                Some((pe, rest)) => {
                    if let Some(c) = n.children.get_mut(pe) {
                        go(c, rest);
                        if c.is_empty() {
                            n.children.remove(pe);
                        }
                    }
                }
            }
        }
        go(self, path);
    }
}

/// Fields that belong to the server, not to any manager.
fn excluded(at_top: bool, in_metadata: bool, key: &str) -> bool {
    (at_top && matches!(key, "apiVersion" | "kind" | "status"))
        || (in_metadata
            && !matches!(
                key,
                "labels" | "annotations" | "finalizers" | "ownerReferences"
            ))
}

fn key_element(item: &Value, keys: &[String]) -> Option<String> {
    let mut m = Map::new();
    for k in keys {
        m.insert(k.clone(), item.get(k)?.clone());
    }
    Some(format!("k:{}", Value::Object(m)))
}

/// The fields an object sets, with the schema deciding how lists are owned.
pub fn fields_of(v: &Value, meta: Meta<'_>) -> FieldSet {
    let mut s = FieldSet::default();
    collect_object(v, meta, &mut s, true, false);
    s
}

fn collect_object(v: &Value, meta: Meta<'_>, out: &mut FieldSet, top: bool, in_metadata: bool) {
    let Value::Object(m) = v else { return };
    for (k, child) in m {
        if excluded(top, in_metadata, k) {
            continue;
        }
        let (list, atomic_map, child_meta) = meta.shape(k);
        let node = out.child(format!("f:{k}"));
        collect_value(
            child,
            &list,
            atomic_map,
            child_meta,
            node,
            top && k == "metadata",
        );
    }
}

fn collect_value(
    v: &Value,
    list: &ListKind,
    atomic_map: bool,
    meta: Meta<'_>,
    node: &mut FieldSet,
    metadata: bool,
) {
    match v {
        Value::Object(m) if !m.is_empty() && !atomic_map => {
            collect_object(v, meta, node, false, metadata);
            if node.children.is_empty() {
                node.member = true;
            }
        }
        Value::Array(items) if !items.is_empty() => match list {
            ListKind::Atomic => node.member = true,
            ListKind::Set => {
                for it in items {
                    node.child(format!("v:{it}")).member = true;
                }
            }
            ListKind::Map(keys) => {
                let item_meta = meta.element();
                for it in items {
                    match key_element(it, keys) {
                        Some(pe) => {
                            let c = node.child(pe);
                            c.member = true;
                            collect_object(it, item_meta, c, false, false);
                        }
                        // An element without its keys cannot be told apart: own the list.
                        None => node.member = true,
                    }
                }
            }
        },
        _ => node.member = true,
    }
}

/// The value at a path, if present.
pub fn value_at<'v>(v: &'v Value, path: &[String]) -> Option<&'v Value> {
    let mut cur = v;
    for pe in path {
        cur = step(cur, pe)?;
    }
    Some(cur)
}

fn matches_element(item: &Value, pe: &str) -> bool {
    if let Some(keys) = pe.strip_prefix("k:") {
        let Ok(Value::Object(want)) = serde_json::from_str::<Value>(keys) else {
            return false;
        };
        want.iter().all(|(k, wv)| item.get(k) == Some(wv))
    } else if let Some(val) = pe.strip_prefix("v:") {
        serde_json::from_str::<Value>(val).is_ok_and(|x| &x == item)
    } else {
        false
    }
}

fn step<'v>(v: &'v Value, pe: &str) -> Option<&'v Value> {
    if let Some(f) = pe.strip_prefix("f:") {
        return v.get(f);
    }
    if let Some(i) = pe.strip_prefix("i:") {
        return v.get(i.parse::<usize>().ok()?);
    }
    v.as_array()?.iter().find(|it| matches_element(it, pe))
}

/// Removes the field at a path (a list element for `k:`/`v:`/`i:` paths).
pub fn remove_at(v: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = v;
    for pe in parents {
        let next = if let Some(f) = pe.strip_prefix("f:") {
            cur.get_mut(f)
        } else if let Some(i) = pe.strip_prefix("i:") {
            i.parse::<usize>().ok().and_then(|i| cur.get_mut(i))
        } else {
            cur.as_array_mut()
                .and_then(|a| a.iter_mut().find(|it| matches_element(it, pe)))
        };
        match next {
            Some(n) => cur = n,
            None => return,
        }
    }
    if let Some(f) = last.strip_prefix("f:") {
        if let Some(m) = cur.as_object_mut() {
            m.remove(f);
        }
    } else if let Some(a) = cur.as_array_mut() {
        if let Some(i) = last
            .strip_prefix("i:")
            .and_then(|i| i.parse::<usize>().ok())
        {
            if i < a.len() {
                a.remove(i);
            }
        } else {
            a.retain(|it| !matches_element(it, last));
        }
    }
}

/// `.spec.template.spec.containers[name="web"].image`, for messages.
pub fn describe(path: &[String]) -> String {
    let mut out = String::new();
    for pe in path {
        if let Some(f) = pe.strip_prefix("f:") {
            out.push('.');
            out.push_str(f);
        } else if let Some(k) = pe.strip_prefix("k:") {
            let inner = serde_json::from_str::<Value>(k)
                .ok()
                .and_then(|v| v.as_object().cloned())
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_default();
            out.push_str(&format!("[{inner}]"));
        } else if let Some(v) = pe.strip_prefix("v:") {
            out.push_str(&format!("[={v}]"));
        } else if let Some(i) = pe.strip_prefix("i:") {
            out.push_str(&format!("[{i}]"));
        }
    }
    out
}

/// One `managedFields` entry.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub manager: String,
    pub operation: String,
    pub api_version: String,
    pub time: Option<String>,
    pub subresource: String,
    pub fields: FieldSet,
}

pub fn entries(obj: &Object) -> Vec<Entry> {
    obj.metadata
        .managed_fields
        .iter()
        .filter_map(|e| {
            Some(Entry {
                manager: e.get("manager")?.as_str()?.to_string(),
                operation: e
                    .get("operation")
                    .and_then(Value::as_str)
                    .unwrap_or("Update")
                    .to_string(),
                api_version: e
                    .get("apiVersion")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                time: e.get("time").and_then(Value::as_str).map(str::to_string),
                subresource: e
                    .get("subresource")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                fields: FieldSet::from_fields_v1(e.get("fieldsV1").unwrap_or(&Value::Null)),
            })
        })
        .collect()
}

fn set_entries(obj: &mut Object, es: Vec<Entry>) {
    obj.metadata.managed_fields = es
        .into_iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            let mut v = json!({
                "manager": e.manager,
                "operation": e.operation,
                "apiVersion": e.api_version,
                "fieldsType": "FieldsV1",
                "fieldsV1": e.fields.to_fields_v1(),
            });
            if let Some(t) = e.time {
                v["time"] = json!(t);
            }
            if !e.subresource.is_empty() {
                v["subresource"] = json!(e.subresource);
            }
            v
        })
        .collect();
}

fn entry_for<'e>(
    es: &'e mut Vec<Entry>,
    manager: &str,
    operation: &str,
    subresource: &str,
    api_version: &str,
) -> &'e mut Entry {
    let pos = es.iter().position(|e| {
        e.manager == manager && e.operation == operation && e.subresource == subresource
    });
    let i = match pos {
        Some(i) => i,
        None => {
            es.push(Entry {
                manager: manager.to_string(),
                operation: operation.to_string(),
                api_version: api_version.to_string(),
                time: None,
                subresource: subresource.to_string(),
                fields: FieldSet::default(),
            });
            es.len() - 1
        }
    };
    let e = &mut es[i];
    e.api_version = api_version.to_string();
    e.time = Some(Time::now().to_string());
    e
}

/// Attributes an Update (create, update, non-apply patch; `subresource` for writes through
/// one, like `scale`): `manager` takes the fields of `new` whose values differ from `old`;
/// fields `old` had and `new` lacks are nobody's. `new.metadata.managedFields` is rewritten
/// from `old`'s. Managers are told apart by name, operation and subresource, as Kubernetes
/// does: `kubectl` applying and `kubectl` scaling are two owners.
pub fn track_update(
    old: Option<&Object>,
    new: &mut Object,
    manager: &str,
    subresource: &str,
    meta: Meta<'_>,
) {
    let old_v = old.map(Object::to_value).unwrap_or(Value::Null);
    let mut es = old.map(entries).unwrap_or_default();
    let new_v = new.to_value();
    let new_set = fields_of(&new_v, meta);
    let changed: Vec<Path> = new_set
        .members()
        .into_iter()
        .filter(|p| value_at(&old_v, p) != value_at(&new_v, p))
        .collect();
    let gone: Vec<Path> = match old {
        Some(_) => fields_of(&old_v, meta)
            .members()
            .into_iter()
            .filter(|p| !new_set.contains(p))
            .collect(),
        None => Vec::new(),
    };
    let is_mine =
        |e: &Entry| e.manager == manager && e.operation == "Update" && e.subresource == subresource;
    for e in es.iter_mut() {
        for p in changed.iter().chain(gone.iter()) {
            if !is_mine(e) {
                e.fields.remove(p);
            }
        }
    }
    if !changed.is_empty() {
        let api_version = new.api_version.clone();
        let mine = entry_for(&mut es, manager, "Update", subresource, &api_version);
        for p in &changed {
            mine.fields.insert(p);
        }
        for p in &gone {
            mine.fields.remove(p);
        }
    }
    set_entries(new, es);
}

/// A field another manager owns with another value.
#[derive(Clone, Debug, PartialEq)]
pub struct Conflict {
    pub manager: String,
    pub api_version: String,
    pub field: String,
}

/// The outcome of an apply: the object to store (before defaults), or the conflicts.
pub fn apply(
    live: Option<&Object>,
    applied: &Value,
    manager: &str,
    force: bool,
    meta: Meta<'_>,
    merge: impl FnOnce(&Value, &Value) -> Result<Value, String>,
) -> Result<Result<Value, Vec<Conflict>>, String> {
    let new_set = fields_of(applied, meta);
    let live_v = live.map(Object::to_value).unwrap_or(Value::Null);
    let mut es = live.map(entries).unwrap_or_default();
    let is_mine =
        |e: &Entry| e.manager == manager && e.operation == "Apply" && e.subresource.is_empty();
    // Conflicts: leaves another owner holds where the applied value differs.
    let mut conflicts = Vec::new();
    for e in es.iter_mut().filter(|e| !is_mine(e)) {
        for p in new_set.members() {
            if !e.fields.contains(&p) {
                continue;
            }
            let (a, l) = (value_at(applied, &p), value_at(&live_v, &p));
            let leaf = !a.is_some_and(|v| v.is_object())
                && !p.last().is_some_and(|pe| pe.starts_with("k:"));
            if leaf && a != l {
                if force {
                    e.fields.remove(&p);
                } else {
                    conflicts.push(Conflict {
                        manager: if e.subresource.is_empty() {
                            format!("\"{}\"", e.manager)
                        } else {
                            format!("\"{}\" with subresource \"{}\"", e.manager, e.subresource)
                        },
                        api_version: e.api_version.clone(),
                        field: describe(&p),
                    });
                }
            }
        }
    }
    if !conflicts.is_empty() {
        return Ok(Err(conflicts));
    }
    let previous = es
        .iter()
        .find(|e| is_mine(e))
        .map(|e| e.fields.clone())
        .unwrap_or_default();
    let mut merged = match live {
        Some(_) => merge(&live_v, applied)?,
        None => applied.clone(),
    };
    // What this manager applied before and no longer does, and no one else owns, goes.
    let mut dropped: Vec<Path> = previous
        .members()
        .into_iter()
        .filter(|p| !new_set.contains(p))
        .filter(|p| !es.iter().any(|e| !is_mine(e) && e.fields.contains(p)))
        .collect();
    // Shallowest first: a removed element takes its fields with it (removing the fields
    // first would remove the keys that find the element).
    dropped.sort_by_key(Vec::len);
    let mut removed: Vec<&Path> = Vec::new();
    for p in &dropped {
        if removed.iter().any(|r| p.starts_with(r)) {
            continue;
        }
        remove_at(&mut merged, p);
        removed.push(p);
        // A list or map emptied by the removal goes too (as Go's omitempty drops it).
        let mut parent = &p[..p.len() - 1];
        while !parent.is_empty()
            && value_at(&merged, parent).is_some_and(|v| {
                v.as_array().is_some_and(Vec::is_empty) || v.as_object().is_some_and(Map::is_empty)
            })
        {
            remove_at(&mut merged, parent);
            parent = &parent[..parent.len() - 1];
        }
    }
    let api_version = applied
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let mine = entry_for(&mut es, manager, "Apply", "", &api_version);
    mine.fields = new_set;
    let mut holder = Object::default();
    set_entries(&mut holder, es);
    if let Some(m) = merged.get_mut("metadata").and_then(Value::as_object_mut) {
        m.insert(
            "managedFields".into(),
            Value::Array(holder.metadata.managed_fields),
        );
    } else if let Some(m) = merged.as_object_mut() {
        m.insert(
            "metadata".into(),
            json!({ "managedFields": holder.metadata.managed_fields }),
        );
    }
    Ok(Ok(merged))
}

/// The manager of a non-apply write: `fieldManager`, else the user agent up to its first `/`.
pub fn manager_of(field_manager: Option<&str>, user_agent: Option<&str>) -> String {
    if let Some(m) = field_manager.filter(|m| !m.is_empty()) {
        return m.to_string();
    }
    user_agent
        .and_then(|ua| ua.split('/').next())
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .unwrap_or("unknown")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::Schemas;

    fn deploy(v: Value) -> Object {
        serde_json::from_value(v).unwrap()
    }

    fn with_meta<R>(f: impl FnOnce(Meta<'_>) -> R) -> R {
        let set = Schemas::new().set();
        let schema = set.get("io.k8s.api.apps.v1.Deployment").cloned();
        f(Meta::new(&set, schema.as_ref()))
    }

    fn smp(live: &Value, applied: &Value) -> Result<Value, String> {
        let set = Schemas::new().set();
        let schema = set.get("io.k8s.api.apps.v1.Deployment").cloned();
        crate::patch::strategic_merge(live, applied, Meta::new(&set, schema.as_ref()))
            .map_err(|e| e.0)
    }

    fn applied(image: &str, replicas: Option<i64>, sidecar: bool) -> Value {
        let mut containers = vec![json!({"name": "web", "image": image})];
        if sidecar {
            containers.push(json!({"name": "log", "image": "fluent"}));
        }
        let mut spec = json!({"selector": {"matchLabels": {"app": "w"}},
            "template": {"metadata": {"labels": {"app": "w"}}, "spec": {"containers": containers}}});
        if let Some(r) = replicas {
            spec["replicas"] = json!(r);
        }
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "w", "labels": {"team": "a"}}, "spec": spec})
    }

    #[test]
    fn field_sets_follow_the_schema() {
        let fs = with_meta(|m| fields_of(&applied("nginx", Some(2), true), m));
        let v1 = fs.to_fields_v1();
        assert_eq!(
            v1["f:metadata"],
            json!({"f:labels": {"f:team": {}}}),
            "name is not a field anyone owns"
        );
        assert_eq!(v1["f:spec"]["f:replicas"], json!({}));
        let cs = &v1["f:spec"]["f:template"]["f:spec"]["f:containers"];
        assert_eq!(
            cs[r#"k:{"name":"web"}"#],
            json!({".": {}, "f:image": {}, "f:name": {}})
        );
        assert!(cs.get(r#"k:{"name":"log"}"#).is_some());
        assert_eq!(FieldSet::from_fields_v1(&v1), fs, "FieldsV1 round-trips");
        let p: Path = vec![
            "f:spec".into(),
            "f:template".into(),
            "f:spec".into(),
            "f:containers".into(),
            r#"k:{"name":"web"}"#.into(),
            "f:image".into(),
        ];
        assert!(fs.contains(&p));
        assert_eq!(
            describe(&p),
            r#".spec.template.spec.containers[name="web"].image"#
        );
        assert_eq!(
            value_at(&applied("nginx", None, false), &p),
            Some(&json!("nginx"))
        );
    }

    #[test]
    fn apply_merges_removes_and_detects_conflicts() {
        with_meta(|meta| {
            // First apply creates.
            let first = apply(
                None,
                &applied("nginx:1", Some(2), true),
                "ci",
                false,
                meta,
                smp,
            )
            .unwrap()
            .unwrap();
            let mut live = deploy(first.clone());
            assert_eq!(entries(&live)[0].manager, "ci");
            assert_eq!(entries(&live)[0].operation, "Apply");
            // Another manager scales: it now owns replicas.
            let mut scaled = live.clone();
            scaled.spec.as_mut().unwrap()["replicas"] = json!(5);
            track_update(Some(&live), &mut scaled, "kubectl", "scale", meta);
            let es = entries(&scaled);
            let replicas: Path = vec!["f:spec".into(), "f:replicas".into()];
            assert!(
                es.iter()
                    .any(|e| e.manager == "kubectl" && e.fields.contains(&replicas))
            );
            assert!(
                !es.iter()
                    .any(|e| e.manager == "ci" && e.fields.contains(&replicas))
            );
            live = scaled;
            // Re-applying replicas=2 conflicts with kubectl...
            let conflicts = apply(
                Some(&live),
                &applied("nginx:2", Some(2), true),
                "ci",
                false,
                meta,
                smp,
            )
            .unwrap()
            .unwrap_err();
            assert_eq!(
                conflicts,
                vec![Conflict {
                    manager: r#""kubectl" with subresource "scale""#.into(),
                    api_version: "apps/v1".into(),
                    field: ".spec.replicas".into()
                }]
            );
            // ...unless it leaves replicas out: then kubectl's 5 stays, and the sidecar it
            // no longer applies goes.
            let next = apply(
                Some(&live),
                &applied("nginx:2", None, false),
                "ci",
                false,
                meta,
                smp,
            )
            .unwrap()
            .unwrap();
            assert_eq!(next["spec"]["replicas"], 5);
            let containers = next["spec"]["template"]["spec"]["containers"]
                .as_array()
                .unwrap();
            assert_eq!(containers.len(), 1);
            assert_eq!(containers[0]["image"], "nginx:2");
            // Forcing takes the field over.
            let forced = apply(
                Some(&live),
                &applied("nginx:2", Some(3), true),
                "ci",
                true,
                meta,
                smp,
            )
            .unwrap()
            .unwrap();
            assert_eq!(forced["spec"]["replicas"], 3);
            let es = entries(&deploy(forced));
            assert!(
                !es.iter().any(|e| e.manager == "kubectl"),
                "kubectl owned only replicas: its entry goes"
            );
        });
    }

    #[test]
    fn updates_take_what_they_change() {
        with_meta(|meta| {
            let mut created = deploy(applied("a", Some(1), false));
            track_update(None, &mut created, "kubectl-create", "", meta);
            let es = entries(&created);
            assert_eq!(es.len(), 1);
            assert_eq!(es[0].operation, "Update");
            let mut edited = created.clone();
            edited.metadata.labels.insert("extra".into(), "x".into());
            edited.metadata.labels.remove("team");
            track_update(Some(&created), &mut edited, "kubectl-edit", "", meta);
            let es = entries(&edited);
            let team: Path = vec!["f:metadata".into(), "f:labels".into(), "f:team".into()];
            let extra: Path = vec!["f:metadata".into(), "f:labels".into(), "f:extra".into()];
            assert!(
                !es.iter().any(|e| e.fields.contains(&team)),
                "a removed field is no one's"
            );
            assert!(
                es.iter()
                    .any(|e| e.manager == "kubectl-edit" && e.fields.contains(&extra))
            );
        });
    }

    #[test]
    fn removing_list_elements_and_managers() {
        let mut v = json!({"spec": {"c": [{"name": "a", "x": 1}, {"name": "b"}], "s": ["p", "q"]}});
        remove_at(
            &mut v,
            &[
                "f:spec".into(),
                "f:c".into(),
                r#"k:{"name":"a"}"#.into(),
                "f:x".into(),
            ],
        );
        assert_eq!(v["spec"]["c"][0], json!({"name": "a"}));
        remove_at(
            &mut v,
            &["f:spec".into(), "f:c".into(), r#"k:{"name":"b"}"#.into()],
        );
        remove_at(&mut v, &["f:spec".into(), "f:s".into(), r#"v:"p""#.into()]);
        assert_eq!(v, json!({"spec": {"c": [{"name": "a"}], "s": ["q"]}}));
        assert_eq!(manager_of(Some("ci"), Some("kubectl/v1.32")), "ci");
        assert_eq!(manager_of(None, Some("kubectl/v1.32 (linux)")), "kubectl");
        assert_eq!(manager_of(None, None), "unknown");
    }
}
