//! CustomResourceDefinitions: validating them, and turning each served version into a
//! resource type with its schema, so that creating a CRD starts serving its kind. Orrery's
//! own kinds are described by read-only CRDs too ([`for_own_kind`]), for tools that discover
//! Karmada's API through them; those never define a served type.

use orrery_api::validation::{
    ErrorList, FieldError, NameRule, is_dns1123_label, is_dns1123_subdomain,
};
use orrery_api::{Object, Time};
use serde_json::{Value, json};

use crate::resources::{Column, Origin, Printer, ResourceType, ScaleSpec, own_schema_name};
use crate::schema::{self, OBJECT_META, QUANTITY, SchemaSet, ref_name};

/// Label on the CRDs describing Orrery's own kinds.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "orrery");

/// Whether a CRD is one of those describing Orrery's own kinds: users cannot create CRDs in
/// their groups, so the group alone tells.
pub fn is_own(crd: &Object) -> bool {
    let group = crd
        .spec
        .as_ref()
        .and_then(|s| s.get("group"))
        .and_then(Value::as_str)
        .unwrap_or("");
    crate::resources::is_own_group(group)
}

/// Whether `obj`, of resource type `rt`, is one of those read-only CRDs.
pub fn is_own_crd(rt: &ResourceType, obj: &Object) -> bool {
    rt.group == "apiextensions.k8s.io" && is_own(obj)
}

/// The read-only CRD describing one of Orrery's own kinds (`rt`: its storage version): its
/// names, scope, printer columns and the schema of each version it serves (references
/// inlined, as a CRD's schema must be).
pub fn for_own_kind(rt: &ResourceType, set: &SchemaSet) -> Option<Object> {
    let older = orrery_api::kinds::own(&rt.group, &rt.kind).map_or(&[][..], |d| d.also_served);
    let mut versions = vec![own_version(rt, &rt.version, &rt.schema, true, set)?];
    for v in older {
        let name = crate::resources::own_schema_name(&rt.group, v, &rt.kind);
        versions.push(own_version(rt, v, &name, false, set)?);
    }
    let spec = json!({
        "group": rt.group,
        "names": { "plural": rt.plural, "singular": rt.singular, "kind": rt.kind,
                   "listKind": rt.list_kind, "shortNames": rt.short_names, "categories": rt.categories },
        "scope": if rt.namespaced { "Namespaced" } else { "Cluster" },
        "versions": versions,
    });
    let mut crd = Object::new("apiextensions.k8s.io/v1", "CustomResourceDefinition")
        .with_name(format!("{}.{}", rt.plural, rt.group));
    crd.metadata
        .labels
        .insert(MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string());
    crd.spec = Some(spec);
    Some(crd)
}

/// One served version of an own kind's CRD.
fn own_version(
    rt: &ResourceType,
    version: &str,
    schema_name: &str,
    storage: bool,
    set: &SchemaSet,
) -> Option<Value> {
    let component = set.get(schema_name)?;
    let mut schema = inline_refs(component, set, 0);
    if let Value::Object(m) = &mut schema {
        m.remove("x-kubernetes-group-version-kind");
        if let Some(Value::Object(p)) = m.get_mut("properties") {
            p.insert("metadata".into(), json!({ "type": "object" }));
        }
    }
    let columns: Vec<Value> = match &rt.printer {
        Printer::Columns(cols) => cols
            .iter()
            .filter(|c| !c.json_path.is_empty() && c.name != "Name")
            .map(|c| {
                let mut col = json!({ "name": c.name, "type": c.type_, "jsonPath": c.json_path,
                                      "description": c.description, "priority": c.priority });
                if !c.format.is_empty() {
                    col["format"] = json!(c.format);
                }
                col
            })
            .collect(),
        Printer::BuiltIn => Vec::new(),
    };
    let mut out = json!({
        "name": version, "served": true, "storage": storage,
        "schema": { "openAPIV3Schema": schema },
        "additionalPrinterColumns": columns,
    });
    if rt.status {
        out["subresources"] = json!({ "status": {} });
    }
    Some(out)
}

/// A schema with its `$ref`s replaced by what they name: Quantity by Kubernetes' int-or-string
/// form, ObjectMeta by an object (as CRD schemas declare them).
fn inline_refs(v: &Value, set: &SchemaSet, depth: usize) -> Value {
    match v {
        Value::Object(m) => {
            let single_ref = match (m.get("$ref"), m.get("allOf")) {
                (Some(Value::String(r)), _) => Some(r.as_str()),
                (None, Some(Value::Array(all))) if all.len() == 1 => {
                    all[0].get("$ref").and_then(Value::as_str)
                }
                _ => None,
            };
            if let Some(r) = single_ref {
                let name = ref_name(r);
                let mut out = match name {
                    QUANTITY => json!({
                        "anyOf": [{ "type": "integer" }, { "type": "string" }],
                        "x-kubernetes-int-or-string": true,
                    }),
                    OBJECT_META => json!({ "type": "object" }),
                    _ if depth < 16 => set
                        .get(name)
                        .map(|s| inline_refs(s, set, depth + 1))
                        .unwrap_or_else(|| json!({ "x-kubernetes-preserve-unknown-fields": true })),
                    _ => json!({ "x-kubernetes-preserve-unknown-fields": true }),
                };
                if let (Value::Object(o), Some(d)) = (&mut out, m.get("description")) {
                    o.insert("description".into(), d.clone());
                }
                return out;
            }
            Value::Object(
                m.iter()
                    .map(|(k, x)| (k.clone(), inline_refs(x, set, depth)))
                    .collect(),
            )
        }
        Value::Array(a) => Value::Array(a.iter().map(|x| inline_refs(x, set, depth)).collect()),
        other => other.clone(),
    }
}

fn s<'a>(v: &'a Value, path: &str) -> Option<&'a str> {
    v.pointer(path).and_then(Value::as_str)
}

/// `.spec.replicas` → `/spec/replicas`.
fn json_path_to_pointer(p: &str) -> String {
    p.trim_start_matches('.')
        .split('.')
        .fold(String::new(), |mut acc, part| {
            acc.push('/');
            acc.push_str(part);
            acc
        })
}

/// Validates a CRD on create (`old` is `None`) or update. `reserved` tells whether a group is
/// one the server itself serves.
pub fn validate(crd: &Object, old: Option<&Object>, reserved: &dyn Fn(&str) -> bool) -> ErrorList {
    let mut errs = ErrorList::new();
    let spec = crd.spec.clone().unwrap_or(Value::Null);
    let group = s(&spec, "/group").unwrap_or("");
    let plural = s(&spec, "/names/plural").unwrap_or("");
    let kind = s(&spec, "/names/kind").unwrap_or("");
    if group.is_empty() {
        errs.push(FieldError::required("spec.group", ""));
    } else {
        for m in is_dns1123_subdomain(group) {
            errs.push(FieldError::invalid("spec.group", group, m));
        }
        if !group.contains('.') {
            errs.push(FieldError::invalid(
                "spec.group",
                group,
                "should be a domain with at least one dot",
            ));
        }
        if reserved(group) {
            errs.push(FieldError::invalid(
                "spec.group",
                group,
                "is served by Orrery itself and cannot be redefined",
            ));
        }
    }
    if plural.is_empty() {
        errs.push(FieldError::required("spec.names.plural", ""));
    } else {
        for m in is_dns1123_label(plural) {
            errs.push(FieldError::invalid("spec.names.plural", plural, m));
        }
    }
    if let Some(singular) = s(&spec, "/names/singular") {
        for m in is_dns1123_label(singular) {
            errs.push(FieldError::invalid("spec.names.singular", singular, m));
        }
    }
    if kind.is_empty() {
        errs.push(FieldError::required("spec.names.kind", ""));
    } else if !kind.starts_with(|c: char| c.is_ascii_uppercase())
        || !kind.chars().all(|c| c.is_ascii_alphanumeric())
    {
        errs.push(FieldError::invalid(
            "spec.names.kind",
            kind,
            "must be an upper-case alphanumeric name (e.g. 'CronTab')",
        ));
    }
    if !plural.is_empty() && !group.is_empty() && crd.name() != format!("{plural}.{group}") {
        errs.push(FieldError::invalid(
            "metadata.name",
            crd.name(),
            format!("must be spec.names.plural+\".\"+spec.group ({plural}.{group})"),
        ));
    }
    match s(&spec, "/scope") {
        Some("Namespaced" | "Cluster") => {}
        Some(other) => errs.push(FieldError::not_supported(
            "spec.scope",
            other,
            &["Cluster", "Namespaced"],
        )),
        None => errs.push(FieldError::required("spec.scope", "")),
    }
    let versions = spec
        .get("versions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if versions.is_empty() {
        errs.push(FieldError::required(
            "spec.versions",
            "must have exactly one version marked as storage version",
        ));
    }
    let mut storage = 0;
    let mut names = std::collections::HashSet::new();
    for (i, v) in versions.iter().enumerate() {
        let p = format!("spec.versions[{i}]");
        let name = s(v, "/name").unwrap_or("");
        if name.is_empty() {
            errs.push(FieldError::required(format!("{p}.name"), ""));
        } else {
            for m in is_dns1123_label(name) {
                errs.push(FieldError::invalid(format!("{p}.name"), name, m));
            }
            if !names.insert(name.to_string()) {
                errs.push(FieldError::duplicate(format!("{p}.name"), name));
            }
        }
        if v.get("storage") == Some(&Value::Bool(true)) {
            storage += 1;
        }
        match v.pointer("/schema/openAPIV3Schema") {
            None => errs.push(FieldError::required(
                format!("{p}.schema.openAPIV3Schema"),
                "schemas are required",
            )),
            Some(root) => {
                if root.get("type").and_then(Value::as_str) != Some("object") {
                    errs.push(FieldError::invalid(
                        format!("{p}.schema.openAPIV3Schema.type"),
                        root.get("type").cloned().unwrap_or(Value::Null),
                        "must be object at the root",
                    ));
                }
            }
        }
        for (j, c) in v
            .get("additionalPrinterColumns")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
            .iter()
            .enumerate()
        {
            let cp = format!("{p}.additionalPrinterColumns[{j}]");
            if s(c, "/name").is_none_or(str::is_empty) {
                errs.push(FieldError::required(format!("{cp}.name"), ""));
            }
            if s(c, "/jsonPath").is_none_or(|j| !j.starts_with('.')) {
                errs.push(FieldError::invalid(
                    format!("{cp}.jsonPath"),
                    s(c, "/jsonPath").unwrap_or(""),
                    "must be a simple json path starting with .",
                ));
            }
            match s(c, "/type") {
                Some("integer" | "number" | "string" | "boolean" | "date") => {}
                other => errs.push(FieldError::not_supported(
                    format!("{cp}.type"),
                    other.unwrap_or(""),
                    &["integer", "number", "string", "boolean", "date"],
                )),
            }
        }
    }
    if !versions.is_empty() && storage != 1 {
        errs.push(FieldError::invalid(
            "spec.versions",
            storage,
            "must have exactly one version marked as storage version",
        ));
    }
    if let Some(old) = old {
        let before = old.spec.clone().unwrap_or(Value::Null);
        for field in ["group", "scope"] {
            if before.get(field) != spec.get(field) {
                errs.push(FieldError::invalid(
                    format!("spec.{field}"),
                    spec.get(field).cloned().unwrap_or(Value::Null),
                    "field is immutable",
                ));
            }
        }
    }
    errs
}

/// The status a new or changed CRD gets: names accepted, established.
pub fn status(crd: &Object, old_status: Option<&Value>) -> Value {
    let now = Time::now().to_string();
    let spec = crd.spec.clone().unwrap_or(Value::Null);
    let storage: Vec<Value> = spec
        .get("versions")
        .and_then(Value::as_array)
        .map(|vs| {
            vs.iter()
                .filter(|v| v.get("storage") == Some(&Value::Bool(true)))
                .filter_map(|v| v.get("name").cloned())
                .collect()
        })
        .unwrap_or_default();
    let mut stored: Vec<Value> = old_status
        .and_then(|s| s.get("storedVersions"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for v in storage {
        if !stored.contains(&v) {
            stored.push(v);
        }
    }
    let since = |t: &str| {
        old_status
            .and_then(|s| s.get("conditions"))
            .and_then(Value::as_array)
            .and_then(|cs| {
                cs.iter()
                    .find(|c| c.get("type").and_then(Value::as_str) == Some(t))
            })
            .and_then(|c| c.get("lastTransitionTime").cloned())
            .unwrap_or(json!(now))
    };
    let mut names = spec.get("names").cloned().unwrap_or(json!({}));
    if let Value::Object(n) = &mut names {
        if !n.contains_key("singular")
            && let Some(kind) = n.get("kind").and_then(Value::as_str)
        {
            n.insert("singular".into(), json!(kind.to_lowercase()));
        }
        if !n.contains_key("listKind")
            && let Some(kind) = n.get("kind").and_then(Value::as_str)
        {
            n.insert("listKind".into(), json!(format!("{kind}List")));
        }
    }
    let mut conditions = vec![
        json!({"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": since("NamesAccepted")}),
        json!({"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": since("Established")}),
    ];
    if crd.metadata.deletion_timestamp.is_some() {
        conditions.push(json!({"type": "Terminating", "status": "True", "reason": "InstanceDeletionInProgress", "message": "CustomResource deletion is in progress", "lastTransitionTime": since("Terminating")}));
    }
    json!({ "acceptedNames": names, "storedVersions": stored, "conditions": conditions })
}

/// Resource types and schema components for the served versions of a CRD.
pub fn types_of(crd: &Object) -> Vec<(ResourceType, Value)> {
    let Some(spec) = crd.spec.as_ref() else {
        return Vec::new();
    };
    // Orrery serves its own kinds itself; their CRDs only describe them.
    if is_own(crd) {
        return Vec::new();
    }
    let (Some(group), Some(plural), Some(kind)) = (
        s(spec, "/group"),
        s(spec, "/names/plural"),
        s(spec, "/names/kind"),
    ) else {
        return Vec::new();
    };
    let strings = |p: &str| -> Vec<String> {
        spec.pointer(p)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    };
    let versions = spec
        .get("versions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    versions
        .iter()
        .filter(|v| v.get("served") != Some(&Value::Bool(false)))
        .filter_map(|v| {
            let version = s(v, "/name")?.to_string();
            let scale = v.pointer("/subresources/scale").map(|sc| ScaleSpec {
                spec_replicas: json_path_to_pointer(
                    s(sc, "/specReplicasPath").unwrap_or(".spec.replicas"),
                ),
                status_replicas: json_path_to_pointer(
                    s(sc, "/statusReplicasPath").unwrap_or(".status.replicas"),
                ),
                label_selector: s(sc, "/labelSelectorPath").map(json_path_to_pointer),
            });
            let age = Column::new(
                "Age",
                "date",
                ".metadata.creationTimestamp",
                0,
                "Time since creation",
            );
            let columns = match v.get("additionalPrinterColumns").and_then(Value::as_array) {
                Some(cols) if !cols.is_empty() => cols
                    .iter()
                    .map(|c| Column {
                        name: s(c, "/name").unwrap_or("").to_string(),
                        type_: s(c, "/type").unwrap_or("string").to_string(),
                        format: s(c, "/format").unwrap_or("").to_string(),
                        description: s(c, "/description").unwrap_or("").to_string(),
                        priority: c.get("priority").and_then(Value::as_i64).unwrap_or(0) as i32,
                        json_path: s(c, "/jsonPath").unwrap_or("").to_string(),
                        render: crate::resources::Render::Plain,
                    })
                    .collect(),
                _ => vec![age],
            };
            let rt = ResourceType {
                group: group.to_string(),
                version: version.clone(),
                kind: kind.to_string(),
                plural: plural.to_string(),
                singular: s(spec, "/names/singular")
                    .map(str::to_string)
                    .unwrap_or_else(|| kind.to_lowercase()),
                list_kind: s(spec, "/names/listKind")
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("{kind}List")),
                namespaced: s(spec, "/scope") != Some("Cluster"),
                short_names: strings("/names/shortNames"),
                categories: strings("/names/categories"),
                name_rule: NameRule::Subdomain,
                status: v.pointer("/subresources/status").is_some(),
                scale,
                origin: Origin::Crd {
                    crd: crd.name().to_string(),
                },
                schema: own_schema_name(group, &version, kind),
                strategic_merge: false,
                printer: Printer::Columns(columns),
                storage: v.get("storage") == Some(&Value::Bool(true)),
                stored_as: None,
                terminating: crd.metadata.deletion_timestamp.is_some(),
            };
            let component = schema::crd_component(&rt, v.pointer("/schema/openAPIV3Schema"));
            Some((rt, component))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crontab() -> Object {
        serde_json::from_value(json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "crontabs.stable.example.com"},
            "spec": {
                "group": "stable.example.com", "scope": "Namespaced",
                "names": {"plural": "crontabs", "singular": "crontab", "kind": "CronTab", "shortNames": ["ct"]},
                "versions": [{
                    "name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {"type": "object",
                        "properties": {"cronSpec": {"type": "string"}, "replicas": {"type": "integer"}}}}}},
                    "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}},
                    "additionalPrinterColumns": [{"name": "Spec", "type": "string", "jsonPath": ".spec.cronSpec"}]
                }]
            }
        })).unwrap()
    }

    #[test]
    fn a_good_crd_serves_its_kind() {
        let crd = crontab();
        assert!(
            validate(&crd, None, &|_| false).is_empty(),
            "{:?}",
            validate(&crd, None, &|_| false)
        );
        let types = types_of(&crd);
        assert_eq!(types.len(), 1);
        let (rt, schema) = &types[0];
        assert_eq!(
            (
                rt.group.as_str(),
                rt.version.as_str(),
                rt.plural.as_str(),
                rt.kind.as_str()
            ),
            ("stable.example.com", "v1", "crontabs", "CronTab")
        );
        assert!(rt.namespaced && rt.status);
        assert_eq!(rt.scale.as_ref().unwrap().spec_replicas, "/spec/replicas");
        assert_eq!(rt.short_names, ["ct"]);
        assert_eq!(rt.schema, "com.example.stable.v1.CronTab");
        assert!(schema["properties"]["metadata"].is_object());
        assert_eq!(
            schema["x-kubernetes-group-version-kind"][0]["kind"],
            "CronTab"
        );
        let st = status(&crd, None);
        assert_eq!(st["storedVersions"], json!(["v1"]));
        assert_eq!(st["conditions"][1]["type"], "Established");
    }

    #[test]
    fn bad_crds_are_refused() {
        let mut crd = crontab();
        crd.metadata.name = "wrong".into();
        crd.spec.as_mut().unwrap()["scope"] = json!("Galaxy");
        crd.spec.as_mut().unwrap()["versions"][0]["storage"] = json!(false);
        let fields: Vec<_> = validate(&crd, None, &|_| false)
            .into_iter()
            .map(|e| e.field)
            .collect();
        assert!(fields.contains(&"metadata.name".to_string()), "{fields:?}");
        assert!(fields.contains(&"spec.scope".to_string()));
        assert!(fields.contains(&"spec.versions".to_string()));
        let errs = validate(&crontab(), None, &|g| g == "stable.example.com");
        assert_eq!(errs[0].field, "spec.group");
        let mut changed = crontab();
        changed.spec.as_mut().unwrap()["scope"] = json!("Cluster");
        assert_eq!(
            validate(&changed, Some(&crontab()), &|_| false)[0].field,
            "spec.scope"
        );
    }
}
