//! Structural OpenAPI v3 schemas generated from the Rust types the server parses an own
//! kind's spec with, so what `kubectl explain` shows and what admission checks cannot drift
//! from what the controllers read. Field descriptions are the types' doc comments.

use orrery_api::kinds::Root;
use schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};

/// The schema a [`Root`] makes, every subschema inlined, in the structural form Kubernetes
/// publishes: no `$schema`, titles, `nullable` or defaults; enums of strings as `enum`;
/// untyped values as `x-kubernetes-preserve-unknown-fields`.
pub fn normalized(root: Root) -> Value {
    let generator = SchemaSettings::openapi3()
        .with(|s| s.inline_subschemas = true)
        .into_generator();
    let mut v = root(generator).to_value();
    if let Value::Object(m) = &mut v {
        // The root's own definitions are inlined already; what is left of them is noise.
        for k in ["$schema", "title", "definitions", "$defs", "components"] {
            m.remove(k);
        }
    }
    normalize(&mut v);
    v
}

/// Open to fields the type does not declare: for objects Orrery itself writes and reads
/// leniently (a binding's spec and status), so an edit through kubectl never loses a field
/// an older or newer server wrote.
pub fn open(v: &mut Value) {
    if let Value::Object(m) = v {
        m.insert("x-kubernetes-preserve-unknown-fields".into(), json!(true));
    }
}

fn normalize(v: &mut Value) {
    let Value::Object(m) = v else {
        if *v == Value::Bool(true) {
            *v = json!({ "x-kubernetes-preserve-unknown-fields": true });
        }
        return;
    };
    // Doc comments are wrapped at 100 columns; kubectl wraps descriptions itself.
    if let Some(Value::String(d)) = m.get_mut("description") {
        *d = d
            .split("\n\n")
            .map(|p| p.split('\n').map(str::trim).collect::<Vec<_>>().join(" "))
            .collect::<Vec<_>>()
            .join("\n\n");
    }
    m.remove("title");
    m.remove("nullable");
    m.remove("default");
    m.remove("$schema");
    // Kubernetes forbids `additionalProperties: false` in structural schemas: an object's
    // undeclared fields are unknown by virtue of `properties` alone.
    if m.get("additionalProperties") == Some(&Value::Bool(false)) {
        m.remove("additionalProperties");
    }
    if let Some(c) = m.remove("const") {
        m.insert("enum".into(), json!([c]));
    }
    for key in ["oneOf", "anyOf"] {
        if let Some(Value::Array(alts)) = m.get_mut(key) {
            alts.iter_mut().for_each(normalize);
            // `Option<T>` of a referenced `T`: T or null. Absent is how an object says none.
            alts.retain(|a| a != &json!({ "enum": [null] }) && a != &json!({ "type": "null" }));
            if alts.len() == 1 {
                let one = alts.pop().unwrap_or_default();
                m.remove(key);
                if one.get("$ref").is_some() {
                    m.insert("allOf".into(), json!([one]));
                } else if let Value::Object(inner) = one {
                    for (k, x) in inner {
                        m.entry(k).or_insert(x);
                    }
                }
                continue;
            }
            if let Some(merged) = string_enum(alts) {
                m.remove(key);
                merge_enum(m, merged);
            }
        }
    }
    if let Some(Value::Array(all)) = m.get_mut("allOf") {
        all.iter_mut().for_each(normalize);
        // `allOf` of one inlined schema (schemars' way of adding a description): the schema.
        if all.len() == 1
            && all[0].get("$ref").is_none()
            && let Some(Value::Object(inner)) = all.pop()
        {
            m.remove("allOf");
            for (k, x) in inner {
                m.entry(k).or_insert(x);
            }
        }
    }
    if let Some(Value::Object(props)) = m.get_mut("properties") {
        props.values_mut().for_each(normalize);
    }
    for key in ["items", "additionalProperties"] {
        if let Some(x) = m.get_mut(key)
            && !x.is_boolean()
        {
            normalize(x);
        }
    }
    let untyped = [
        "type",
        "properties",
        "$ref",
        "allOf",
        "oneOf",
        "anyOf",
        "enum",
    ]
    .iter()
    .all(|k| !m.contains_key(*k));
    if untyped {
        m.insert("x-kubernetes-preserve-unknown-fields".into(), json!(true));
    }
}

/// A choice between string constants, merged: the values, and each one's description.
fn string_enum(alts: &[Value]) -> Option<(Vec<Value>, Vec<String>)> {
    let mut values = Vec::new();
    let mut notes = Vec::new();
    for a in alts {
        if a.get("type").and_then(Value::as_str) != Some("string") {
            return None;
        }
        let Some(Value::Array(e)) = a.get("enum") else {
            return None;
        };
        values.extend(e.iter().cloned());
        if let (Some(d), [Value::String(one)]) =
            (a.get("description").and_then(Value::as_str), e.as_slice())
        {
            notes.push(format!("{one}: {d}"));
        }
    }
    Some((values, notes))
}

fn merge_enum(m: &mut Map<String, Value>, (values, notes): (Vec<Value>, Vec<String>)) {
    m.insert("type".into(), json!("string"));
    m.insert("enum".into(), Value::Array(values));
    if !notes.is_empty() {
        let mut d = m
            .get("description")
            .and_then(Value::as_str)
            .map(|s| format!("{s}\n\n"))
            .unwrap_or_default();
        d.push_str(&notes.join("\n"));
        m.insert("description".into(), json!(d));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, schemars::JsonSchema)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    #[allow(dead_code)]
    struct Sample {
        /// Which way.
        mode: Mode,
        /// Anything at all.
        #[serde(default)]
        value: Value,
        /// Maybe a count.
        #[serde(default)]
        count: Option<i64>,
        /// An inner object.
        #[serde(default)]
        inner: Option<Inner>,
    }

    #[derive(serde::Deserialize, schemars::JsonSchema)]
    #[allow(dead_code)]
    enum Mode {
        /// Pulled by the member.
        Pull,
        /// Pushed by the server.
        Push,
    }

    #[derive(serde::Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        /// A name, described
        /// over two lines.
        name: String,
    }

    #[test]
    fn schemas_come_out_structural_with_descriptions() {
        let s = normalized(orrery_api::kinds::root::<Sample>);
        assert_eq!(s["type"], "object");
        assert_eq!(s["required"], json!(["mode"]));
        assert!(s.get("additionalProperties").is_none(), "{s:#}");
        let p = &s["properties"];
        assert_eq!(p["mode"]["type"], "string");
        assert_eq!(p["mode"]["enum"], json!(["Pull", "Push"]));
        let d = p["mode"]["description"].as_str().unwrap();
        assert!(d.starts_with("Which way."), "{d}");
        assert!(d.contains("Push: Pushed by the server."), "{d}");
        assert_eq!(p["value"]["x-kubernetes-preserve-unknown-fields"], true);
        assert_eq!(p["value"]["description"], "Anything at all.");
        assert_eq!(p["count"]["type"], "integer");
        assert!(p["count"].get("nullable").is_none());
        assert_eq!(p["inner"]["type"], "object", "{s:#}");
        assert_eq!(p["inner"]["properties"]["name"]["type"], "string");
        assert_eq!(
            p["inner"]["properties"]["name"]["description"],
            "A name, described over two lines."
        );
        assert_eq!(p["inner"]["description"], "An inner object.");
        assert!(!s.to_string().contains("$ref"), "{s:#}");
    }
}
