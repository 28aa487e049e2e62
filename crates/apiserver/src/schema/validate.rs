//! Checks an object against its schema: JSON types, required fields, enums and bounds, and
//! fields the schema does not declare (which are removed, and reported as the request's
//! `fieldValidation` says). Also parses JSON while noting duplicate keys, which a plain parse
//! would silently collapse.

use std::cell::RefCell;
use std::fmt;
use std::ops::ControlFlow;

use orrery_api::Quantity;
use orrery_api::validation::FieldError;
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

use super::{QUANTITY, SchemaSet};

/// What a check found.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Findings {
    /// Fields the schema does not declare (already removed from the object).
    pub unknown: Vec<String>,
    /// Keys that appeared twice in the same JSON object (the last one was kept).
    pub duplicates: Vec<String>,
    /// Values that break the schema.
    pub errors: Vec<FieldError>,
}

/// How strictly undeclared fields are treated in objects without declared properties.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Built-in schemas: an object schema without properties accepts anything (RawExtension).
    Open,
    /// CRD structural schemas: an object without properties or `x-kubernetes-preserve-unknown-fields`
    /// keeps nothing.
    Structural,
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn render(v: &Value) -> String {
    match v {
        Value::String(s) => format!("\"{s}\""),
        Value::Object(_) => "\"object\"".to_string(),
        Value::Array(_) => "\"array\"".to_string(),
        other => other.to_string(),
    }
}

/// Checks `value` against `schema`, removing undeclared fields.
pub fn check(set: &SchemaSet, schema: &Value, value: &mut Value, mode: Mode) -> Findings {
    let mut f = Findings::default();
    walk(set, schema, value, "", mode, &mut f);
    f
}

/// Checks `value` against `schema` at `path`: references and the special types first, then
/// `oneOf`/`anyOf`, `allOf`, the type, and the enum.
fn walk(
    set: &SchemaSet,
    schema: &Value,
    value: &mut Value,
    path: &str,
    mode: Mode,
    f: &mut Findings,
) {
    let (schema, name) = set.resolve(schema);
    if schema.is_null() || value.is_null() {
        // An unknown reference accepts anything; `null` means "unset" for optional fields.
        return;
    }
    if name == Some(QUANTITY) {
        check_quantity(value, path, f);
        return;
    }
    if schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        check_int_or_string(value, path, f);
        return;
    }
    if let Some(alternatives) = schema
        .get("oneOf")
        .or_else(|| schema.get("anyOf"))
        .and_then(Value::as_array)
    {
        walk_alternatives(set, alternatives, value, path, mode, f);
        return;
    }
    if let Some(Value::Array(all)) = schema.get("allOf") {
        for part in all {
            walk(set, part, value, path, mode, f);
        }
    }
    if check_type(set, schema, value, path, mode, f).is_break() {
        return;
    }
    check_enum(schema, value, path, f);
}

/// A `Quantity`: a string (or a bare number) that parses as one.
fn check_quantity(value: &Value, path: &str, f: &mut Findings) {
    let text = match value {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        other => {
            f.errors
                .push(FieldError::type_invalid(path, render(other), "string"));
            return;
        }
    };
    if let Err(e) = text.parse::<Quantity>() {
        f.errors
            .push(FieldError::invalid(path, &text, e.to_string()));
    }
}

/// `x-kubernetes-int-or-string`: an integer or a string, nothing more is checked.
fn check_int_or_string(value: &Value, path: &str, f: &mut Findings) {
    if !(value.is_i64() || value.is_u64() || value.is_string()) {
        f.errors.push(FieldError::type_invalid(
            path,
            render(value),
            "integer or string",
        ));
    }
}

/// `oneOf`/`anyOf`: accepts the first alternative the value fits, keeping what that walk
/// changed; otherwise reports against the first.
fn walk_alternatives(
    set: &SchemaSet,
    alternatives: &[Value],
    value: &mut Value,
    path: &str,
    mode: Mode,
    f: &mut Findings,
) {
    for alt in alternatives {
        let mut probe = value.clone();
        let mut trial = Findings::default();
        walk(set, alt, &mut probe, path, mode, &mut trial);
        if trial.errors.is_empty() {
            *value = probe;
            f.unknown.extend(trial.unknown);
            return;
        }
    }
    if let Some(first) = alternatives.first() {
        walk(set, first, value, path, mode, f);
    }
}

/// Checks the schema's `type` (an object if it only declares properties). `Break` means the
/// walk stops before the enum check, as after a non-array or a re-encoded base64 string.
fn check_type(
    set: &SchemaSet,
    schema: &Value,
    value: &mut Value,
    path: &str,
    mode: Mode,
    f: &mut Findings,
) -> ControlFlow<()> {
    let declared = schema.get("type").and_then(Value::as_str);
    let ty = declared.or(if schema.get("properties").is_some() {
        Some("object")
    } else {
        None
    });
    match ty {
        Some("object") => {
            let preserve =
                schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
            check_object(set, schema, value, path, mode, preserve, f);
        }
        Some("array") => return check_array(set, schema, value, path, mode, f),
        Some("string") => return check_string(schema, value, path, f),
        Some("integer") => check_integer(schema, value, path, f),
        Some("number") => {
            if !value.is_number() {
                f.errors
                    .push(FieldError::type_invalid(path, render(value), "number"));
            } else {
                check_bounds(schema, value, path, f);
            }
        }
        Some("boolean") if !value.is_boolean() => {
            f.errors
                .push(FieldError::type_invalid(path, render(value), "boolean"));
        }
        _ => {}
    }
    ControlFlow::Continue(())
}

/// An array: `minItems`, `maxItems`, then each item against `items`. A non-array stops the
/// walk.
fn check_array(
    set: &SchemaSet,
    schema: &Value,
    value: &mut Value,
    path: &str,
    mode: Mode,
    f: &mut Findings,
) -> ControlFlow<()> {
    let Value::Array(items) = value else {
        f.errors
            .push(FieldError::type_invalid(path, render(value), "array"));
        return ControlFlow::Break(());
    };
    if let Some(n) = schema.get("minItems").and_then(Value::as_u64)
        && (items.len() as u64) < n
    {
        f.errors.push(FieldError::invalid(
            path,
            items.len(),
            format!("must have at least {n} items"),
        ));
    }
    if let Some(n) = schema.get("maxItems").and_then(Value::as_u64)
        && (items.len() as u64) > n
    {
        f.errors.push(FieldError {
            kind: orrery_api::validation::ErrorType::TooLong,
            field: path.to_string(),
            value: String::new(),
            detail: format!("must have at most {n} items"),
        });
    }
    if let Some(item_schema) = schema.get("items") {
        for (i, item) in items.iter_mut().enumerate() {
            walk(set, item_schema, item, &format!("{path}[{i}]"), mode, f);
        }
    }
    ControlFlow::Continue(())
}

/// A string: `format: byte` (base64), then `minLength` and `maxLength` in characters.
fn check_string(
    schema: &Value,
    value: &mut Value,
    path: &str,
    f: &mut Findings,
) -> ControlFlow<()> {
    if !value.is_string() {
        f.errors
            .push(FieldError::type_invalid(path, render(value), "string"));
        return ControlFlow::Continue(());
    }
    if schema.get("format").and_then(Value::as_str) == Some("byte") {
        check_base64(value, path, f)?;
    }
    let Value::String(s) = &*value else {
        return ControlFlow::Break(());
    };
    let len = s.chars().count() as u64;
    if let Some(n) = schema.get("minLength").and_then(Value::as_u64)
        && len < n
    {
        f.errors.push(FieldError::invalid(
            path,
            render(value),
            format!("must be at least {n} characters long"),
        ));
    }
    if let Some(n) = schema.get("maxLength").and_then(Value::as_u64)
        && len > n
    {
        f.errors.push(FieldError::too_long(path, n as usize));
    }
    ControlFlow::Continue(())
}

/// Bytes travel as base64 (a Secret's data, a ConfigMap's binaryData). Line breaks are
/// skipped, as Go's decoder (and so Kubernetes) skips them (kustomize wraps long values), and
/// the value is stored in its one-line form, as Kubernetes stores the bytes it decoded; a
/// value so re-encoded stops the walk.
fn check_base64(value: &mut Value, path: &str, f: &mut Findings) -> ControlFlow<()> {
    use base64::Engine;
    // Only called on a string; anything else has nothing to decode.
    let Value::String(s) = &*value else {
        return ControlFlow::Continue(());
    };
    let b64 = base64::engine::general_purpose::STANDARD;
    let wrapped = s.contains(['\n', '\r']);
    let decoded = if wrapped {
        let flat: String = s.chars().filter(|c| !matches!(c, '\n' | '\r')).collect();
        b64.decode(flat)
    } else {
        b64.decode(s)
    };
    match decoded {
        Err(e) => f.errors.push(FieldError::invalid(
            path,
            "",
            format!("illegal base64 data: {e}"),
        )),
        Ok(bytes) if wrapped => {
            *value = Value::String(b64.encode(bytes));
            return ControlFlow::Break(());
        }
        Ok(_) => {}
    }
    ControlFlow::Continue(())
}

/// An integer, within its `format` (int32 or int64), then within its bounds.
fn check_integer(schema: &Value, value: &Value, path: &str, f: &mut Findings) {
    if !(value.is_i64() || value.is_u64()) {
        f.errors
            .push(FieldError::type_invalid(path, render(value), "integer"));
        return;
    }
    // Kubernetes' fields are int32 or int64: a typed client cannot decode more.
    let fits = match schema.get("format").and_then(Value::as_str) {
        Some("int32") => value.as_i64().is_some_and(|n| i32::try_from(n).is_ok()),
        Some("int64") => value.is_i64(),
        _ => true,
    };
    if fits {
        check_bounds(schema, value, path, f);
    } else {
        let bits = if schema.get("format").and_then(Value::as_str) == Some("int32") {
            32
        } else {
            64
        };
        f.errors.push(FieldError::invalid(
            path,
            value,
            format!("must be a {bits}-bit integer"),
        ));
    }
}

/// `enum`: the value must be one of those listed.
fn check_enum(schema: &Value, value: &Value, path: &str, f: &mut Findings) {
    if let Some(Value::Array(allowed)) = schema.get("enum")
        && !allowed.contains(value)
    {
        let shown: Vec<String> = allowed
            .iter()
            .map(|a| {
                a.as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| a.to_string())
            })
            .collect();
        let shown: Vec<&str> = shown.iter().map(String::as_str).collect();
        f.errors.push(FieldError::not_supported(
            path,
            value
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| value.to_string()),
            &shown,
        ));
    }
}

fn check_bounds(schema: &Value, value: &Value, path: &str, f: &mut Findings) {
    let Some(v) = value.as_f64() else { return };
    if let Some(min) = schema.get("minimum").and_then(Value::as_f64) {
        let exclusive = schema.get("exclusiveMinimum") == Some(&Value::Bool(true));
        if v < min || (exclusive && v == min) {
            let rel = if exclusive {
                "greater than"
            } else {
                "greater than or equal to"
            };
            f.errors.push(FieldError::invalid(
                path,
                value,
                format!("must be {rel} {min}"),
            ));
        }
    }
    if let Some(max) = schema.get("maximum").and_then(Value::as_f64) {
        let exclusive = schema.get("exclusiveMaximum") == Some(&Value::Bool(true));
        if v > max || (exclusive && v == max) {
            let rel = if exclusive {
                "less than"
            } else {
                "less than or equal to"
            };
            f.errors.push(FieldError::invalid(
                path,
                value,
                format!("must be {rel} {max}"),
            ));
        }
    }
}

fn check_object(
    set: &SchemaSet,
    schema: &Value,
    value: &mut Value,
    path: &str,
    mode: Mode,
    preserve: bool,
    f: &mut Findings,
) {
    let Value::Object(map) = value else {
        f.errors
            .push(FieldError::type_invalid(path, render(value), "object"));
        return;
    };
    let props = schema.get("properties").and_then(Value::as_object);
    let additional = schema.get("additionalProperties");
    let open = match mode {
        Mode::Open => props.is_none() && additional.is_none(),
        Mode::Structural => false,
    };
    let mut remove = Vec::new();
    for (k, v) in map.iter_mut() {
        let child = join(path, k);
        if let Some(ps) = props.and_then(|p| p.get(k)) {
            walk(set, ps, v, &child, mode, f);
        } else if let Some(extra) = additional {
            match extra {
                Value::Bool(true) => {}
                Value::Bool(false) => {
                    f.unknown.push(child);
                    remove.push(k.clone());
                }
                s => walk(set, s, v, &child, mode, f),
            }
        } else if !(preserve || open) {
            f.unknown.push(child);
            remove.push(k.clone());
        }
    }
    for k in remove {
        map.remove(&k);
    }
    if let Some(Value::Array(required)) = schema.get("required") {
        for r in required.iter().filter_map(Value::as_str) {
            if map.get(r).is_none_or(Value::is_null) {
                f.errors.push(FieldError::required(join(path, r), ""));
            }
        }
    }
}

/// Parses JSON into a value, collecting the paths of duplicate keys.
pub fn parse_json(bytes: &[u8]) -> Result<(Value, Vec<String>), serde_json::Error> {
    let dups = RefCell::new(Vec::new());
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = Seed {
        path: String::new(),
        dups: &dups,
    }
    .deserialize(&mut de)?;
    de.end()?;
    Ok((value, dups.into_inner()))
}

struct Seed<'a> {
    path: String,
    dups: &'a RefCell<Vec<String>>,
}

impl<'de> DeserializeSeed<'de> for Seed<'_> {
    type Value = Value;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Seed<'_> {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom("not a finite number"))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        loop {
            let seed = Seed {
                path: format!("{}[{}]", self.path, out.len()),
                dups: self.dups,
            };
            match seq.next_element_seed(seed)? {
                Some(v) => out.push(v),
                None => return Ok(Value::Array(out)),
            }
        }
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let path = join(&self.path, &key);
            let v = map.next_value_seed(Seed {
                path: path.clone(),
                dups: self.dups,
            })?;
            if out.insert(key, v).is_some() {
                self.dups.borrow_mut().push(path);
            }
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::Schemas;
    use serde_json::json;

    fn deploy() -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "labels": {"app": "web"}},
            "spec": {
                "replicas": 3,
                "selector": {"matchLabels": {"app": "web"}},
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 1}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{
                        "name": "web", "image": "nginx:1.27",
                        "ports": [{"containerPort": 80}],
                        "resources": {"requests": {"cpu": "250m", "memory": "64Mi"}, "limits": {"cpu": 1}}
                    }]}
                }
            }
        })
    }

    fn run(mut v: Value) -> (Value, Findings) {
        let set = Schemas::new().set();
        let schema = set.get("io.k8s.api.apps.v1.Deployment").unwrap().clone();
        let f = check(&set, &schema, &mut v, Mode::Open);
        (v, f)
    }

    #[test]
    fn a_valid_deployment_passes_untouched() {
        let (v, f) = run(deploy());
        assert_eq!(f, Findings::default());
        assert_eq!(v, deploy());
    }

    #[test]
    fn unknown_fields_are_found_and_removed() {
        let mut d = deploy();
        d["spec"]["replicass"] = json!(3);
        d["spec"]["template"]["spec"]["containers"][0]["imagee"] = json!("x");
        d["metadata"]["lables"] = json!({});
        let (v, f) = run(d);
        let mut unknown = f.unknown.clone();
        unknown.sort();
        assert_eq!(
            unknown,
            [
                "metadata.lables",
                "spec.replicass",
                "spec.template.spec.containers[0].imagee"
            ]
        );
        assert!(f.errors.is_empty());
        assert_eq!(v, deploy(), "undeclared fields are pruned");
    }

    #[test]
    fn type_and_required_errors() {
        let mut d = deploy();
        d["spec"]["replicas"] = json!("three");
        d["spec"]["template"]["spec"]["containers"][0]
            .as_object_mut()
            .unwrap()
            .remove("name");
        d["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["memory"] =
            json!("64MB");
        d["spec"]["strategy"]["rollingUpdate"]["maxSurge"] = json!(true);
        let (_, f) = run(d);
        let fields: Vec<_> = f.errors.iter().map(|e| e.to_string()).collect();
        assert!(
            fields.contains(
                &"spec.replicas: Invalid value: \"three\": must be of type integer".to_string()
            ),
            "{fields:?}"
        );
        assert!(
            fields
                .iter()
                .any(|e| e.starts_with("spec.template.spec.containers[0].name: Required value")),
            "{fields:?}"
        );
        assert!(fields.iter().any(|e| e.starts_with("spec.template.spec.containers[0].resources.requests.memory: Invalid value: \"64MB\"")), "{fields:?}");
        assert!(
            fields
                .iter()
                .any(|e| e.starts_with("spec.strategy.rollingUpdate.maxSurge")),
            "{fields:?}"
        );
    }

    #[test]
    fn structural_schemas_prune_and_bound() {
        let set = Schemas::new().set();
        let schema = json!({
            "type": "object",
            "properties": {
                "spec": {"type": "object", "required": ["size"], "properties": {
                    "size": {"type": "integer", "minimum": 1, "maximum": 10},
                    "mode": {"type": "string", "enum": ["fast", "slow"]},
                    "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "closed": {"type": "object"},
                    "tags": {"type": "object", "additionalProperties": {"type": "string"}}
                }}
            }
        });
        let mut v = json!({"spec": {"size": 11, "mode": "medium", "free": {"a": {"b": 1}}, "closed": {"x": 1}, "tags": {"a": "b", "c": 2}, "extra": 1}});
        let f = check(&set, &schema, &mut v, Mode::Structural);
        let mut unknown = f.unknown.clone();
        unknown.sort();
        assert_eq!(unknown, ["spec.closed.x", "spec.extra"]);
        let errs: Vec<_> = f.errors.iter().map(|e| e.to_string()).collect();
        assert!(
            errs.iter()
                .any(|e| e.contains("spec.size") && e.contains("less than or equal to 10")),
            "{errs:?}"
        );
        assert!(
            errs.iter()
                .any(|e| e.contains("spec.mode: Unsupported value: \"medium\"")),
            "{errs:?}"
        );
        assert!(errs.iter().any(|e| e.contains("spec.tags.c")), "{errs:?}");
        assert_eq!(v["spec"]["free"], json!({"a": {"b": 1}}));
        let mut missing = json!({"spec": {}});
        assert!(
            check(&set, &schema, &mut missing, Mode::Structural).errors[0]
                .to_string()
                .starts_with("spec.size: Required value")
        );
    }

    #[test]
    fn duplicate_keys_are_reported() {
        let (v, dups) =
            parse_json(br#"{"a": 1, "b": {"c": 1, "c": 2}, "a": 3, "l": [{"x": 1, "x": 1}]}"#)
                .unwrap();
        assert_eq!(v, json!({"a": 3, "b": {"c": 2}, "l": [{"x": 1}]}));
        assert_eq!(dups, ["b.c", "a", "l[0].x"]);
        assert!(parse_json(b"{\"a\": }").is_err());
        assert!(parse_json(b"{} {}").is_err());
    }
}
