//! The OpenAPI v2 document as protobuf (`application/com.github.proto-openapi.spec.v2@v1.0+protobuf`),
//! the gnostic `openapi.v2.Document` that client-go asks for. kubectl falls back to it where
//! OpenAPI v3 has no answer (validating a file of `kind: List`, for one), and accepts nothing
//! else there. Encoded here from the JSON document; only the parts clients read are written:
//! paths and operations with their parameters, responses and vendor extensions, and the
//! schema definitions.

use serde_json::Value;

/// The media type client-go requests.
pub const MEDIA_TYPE: &str = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";
/// The content type answered: Go's MIME parser refuses the `@` of the requested one, so
/// Kubernetes (kube-openapi) answers with this spelling.
pub const CONTENT_TYPE: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";

#[derive(Default)]
struct Writer(Vec<u8>);

impl Writer {
    fn varint(&mut self, mut v: u64) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                self.0.push(b);
                return;
            }
            self.0.push(b | 0x80);
        }
    }
    fn key(&mut self, field: u32, wire: u8) {
        self.varint(((field as u64) << 3) | wire as u64);
    }
    fn bytes(&mut self, field: u32, b: &[u8]) {
        self.key(field, 2);
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
    }
    fn string(&mut self, field: u32, s: &str) {
        if !s.is_empty() {
            self.bytes(field, s.as_bytes());
        }
    }
    fn message(&mut self, field: u32, w: Writer) {
        self.bytes(field, &w.0);
    }
    fn boolean(&mut self, field: u32, v: bool) {
        if v {
            self.key(field, 0);
            self.varint(1);
        }
    }
    fn int(&mut self, field: u32, v: i64) {
        self.key(field, 0);
        self.varint(v as u64);
    }
    fn double(&mut self, field: u32, v: f64) {
        self.key(field, 1);
        self.0.extend_from_slice(&v.to_le_bytes());
    }
}

fn str_of<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or("")
}

/// `Any{yaml}`: the value as JSON (which YAML parsers read).
fn any(v: &Value) -> Writer {
    let mut w = Writer::default();
    w.string(2, &serde_json::to_string(v).unwrap_or_default());
    w
}

/// The `x-...` members of an object as `NamedAny`s.
fn extensions(w: &mut Writer, field: u32, obj: &Value) {
    if let Some(m) = obj.as_object() {
        for (k, v) in m.iter().filter(|(k, _)| k.starts_with("x-")) {
            let mut named = Writer::default();
            named.string(1, k);
            named.message(2, any(v));
            w.message(field, named);
        }
    }
}

fn schema(s: &Value) -> Writer {
    let mut w = Writer::default();
    // A `$ref` wrapped in a single-element allOf is written as a plain reference.
    let target = match s.get("allOf").and_then(Value::as_array) {
        Some(all) if all.len() == 1 && all[0].get("$ref").is_some() => &all[0],
        _ => s,
    };
    w.string(1, str_of(target, "$ref"));
    w.string(2, str_of(s, "format"));
    w.string(3, str_of(s, "title"));
    w.string(4, str_of(s, "description"));
    if let Some(d) = s.get("default") {
        w.message(5, any(d));
    }
    for (field, key) in [(7, "maximum"), (9, "minimum")] {
        if let Some(n) = s.get(key).and_then(Value::as_f64) {
            w.double(field, n);
        }
    }
    w.boolean(8, s.get("exclusiveMaximum") == Some(&Value::Bool(true)));
    w.boolean(10, s.get("exclusiveMinimum") == Some(&Value::Bool(true)));
    for (field, key) in [
        (11, "maxLength"),
        (12, "minLength"),
        (14, "maxItems"),
        (15, "minItems"),
    ] {
        if let Some(n) = s.get(key).and_then(Value::as_i64) {
            w.int(field, n);
        }
    }
    w.string(13, str_of(s, "pattern"));
    if let Some(Value::Array(req)) = s.get("required") {
        for r in req.iter().filter_map(Value::as_str) {
            w.string(19, r);
        }
    }
    if let Some(Value::Array(values)) = s.get("enum") {
        for v in values {
            w.message(20, any(v));
        }
    }
    match s.get("additionalProperties") {
        Some(Value::Bool(b)) => {
            let mut a = Writer::default();
            a.key(2, 0);
            a.varint(*b as u64);
            w.message(21, a);
        }
        Some(extra @ Value::Object(_)) => {
            let mut a = Writer::default();
            a.message(1, schema(extra));
            w.message(21, a);
        }
        _ => {}
    }
    if let Some(t) = s.get("type").and_then(Value::as_str) {
        let mut ty = Writer::default();
        ty.string(1, t);
        w.message(22, ty);
    }
    if let Some(items) = s.get("items") {
        let mut it = Writer::default();
        it.message(1, schema(items));
        w.message(23, it);
    }
    if let Some(Value::Object(props)) = s.get("properties") {
        let mut p = Writer::default();
        for (name, ps) in props {
            let mut named = Writer::default();
            named.string(1, name);
            named.message(2, schema(ps));
            p.message(1, named);
        }
        w.message(25, p);
    }
    extensions(&mut w, 31, s);
    w
}

fn parameter(p: &Value) -> Writer {
    let mut param = Writer::default();
    if str_of(p, "in") == "body" {
        let mut body = Writer::default();
        body.string(1, str_of(p, "description"));
        body.string(2, str_of(p, "name"));
        body.string(3, "body");
        body.boolean(4, p.get("required") == Some(&Value::Bool(true)));
        if let Some(s) = p.get("schema") {
            body.message(5, schema(s));
        }
        param.message(1, body);
    } else {
        let mut sub = Writer::default();
        sub.boolean(1, p.get("required") == Some(&Value::Bool(true)));
        sub.string(2, str_of(p, "in"));
        sub.string(3, str_of(p, "description"));
        sub.string(4, str_of(p, "name"));
        let mut non_body = Writer::default();
        if str_of(p, "in") == "path" {
            sub.string(5, str_of(p, "type"));
            non_body.message(4, sub);
        } else {
            sub.string(6, str_of(p, "type"));
            non_body.message(3, sub);
        }
        param.message(2, non_body);
    }
    let mut item = Writer::default();
    item.message(1, param);
    item
}

fn operation(op: &Value) -> Writer {
    let mut w = Writer::default();
    if let Some(Value::Array(tags)) = op.get("tags") {
        for t in tags.iter().filter_map(Value::as_str) {
            w.string(1, t);
        }
    }
    w.string(3, str_of(op, "description"));
    w.string(5, str_of(op, "operationId"));
    for t in ["application/json", "application/yaml"] {
        w.string(6, t);
    }
    if let Some(Value::Array(params)) = op.get("parameters") {
        for p in params {
            w.message(8, parameter(p));
        }
    }
    if let Some(Value::Object(responses)) = op.get("responses") {
        let mut rs = Writer::default();
        for (code, r) in responses {
            let mut resp = Writer::default();
            resp.string(1, str_of(r, "description"));
            if let Some(s) = r.get("schema") {
                let mut item = Writer::default();
                item.message(1, schema(s));
                resp.message(2, item);
            }
            let mut value = Writer::default();
            value.message(1, resp);
            let mut named = Writer::default();
            named.string(1, code);
            named.message(2, value);
            rs.message(1, named);
        }
        w.message(9, rs);
    }
    extensions(&mut w, 13, op);
    w
}

/// Encodes a Swagger 2.0 JSON document.
pub fn encode(doc: &Value) -> Vec<u8> {
    let mut w = Writer::default();
    w.string(1, str_of(doc, "swagger"));
    if let Some(info) = doc.get("info") {
        let mut i = Writer::default();
        i.string(1, str_of(info, "title"));
        i.string(2, str_of(info, "version"));
        w.message(2, i);
    }
    if let Some(Value::Object(paths)) = doc.get("paths") {
        let mut ps = Writer::default();
        for (path, item) in paths {
            let mut pi = Writer::default();
            for (field, method) in [
                (2, "get"),
                (3, "put"),
                (4, "post"),
                (5, "delete"),
                (8, "patch"),
            ] {
                if let Some(op) = item.get(method) {
                    pi.message(field, operation(op));
                }
            }
            let mut named = Writer::default();
            named.string(1, path);
            named.message(2, pi);
            ps.message(2, named);
        }
        w.message(8, ps);
    }
    if let Some(Value::Object(defs)) = doc.get("definitions") {
        let mut d = Writer::default();
        for (name, s) in defs {
            let mut named = Writer::default();
            named.string(1, name);
            named.message(2, schema(s));
            d.message(1, named);
        }
        w.message(9, d);
    }
    w.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A minimal protobuf reader for the assertions.
    fn fields(mut b: &[u8]) -> Vec<(u64, Vec<u8>)> {
        let mut out = Vec::new();
        let read = |b: &mut &[u8]| -> u64 {
            let mut v = 0u64;
            let mut shift = 0;
            loop {
                let x = b[0];
                *b = &b[1..];
                v |= ((x & 0x7f) as u64) << shift;
                if x & 0x80 == 0 {
                    return v;
                }
                shift += 7;
            }
        };
        while !b.is_empty() {
            let key = read(&mut b);
            match key & 7 {
                2 => {
                    let len = read(&mut b) as usize;
                    out.push((key >> 3, b[..len].to_vec()));
                    b = &b[len..];
                }
                0 => {
                    let v = read(&mut b);
                    out.push((key >> 3, v.to_le_bytes().to_vec()));
                }
                1 => {
                    out.push((key >> 3, b[..8].to_vec()));
                    b = &b[8..];
                }
                _ => panic!("unexpected wire type"),
            }
        }
        out
    }

    #[test]
    fn patch_operations_carry_gvk_and_field_validation() {
        let doc = json!({
            "swagger": "2.0",
            "info": {"title": "Orrery", "version": "v1"},
            "paths": {"/apis/apps/v1/namespaces/{namespace}/deployments/{name}": {"patch": {
                "operationId": "patch",
                "parameters": [
                    {"name": "name", "in": "path", "required": true, "type": "string"},
                    {"name": "fieldValidation", "in": "query", "type": "string"},
                    {"name": "body", "in": "body", "required": true, "schema": {"$ref": "#/definitions/P"}}
                ],
                "responses": {"200": {"description": "OK", "schema": {"$ref": "#/definitions/D"}}},
                "x-kubernetes-group-version-kind": {"group": "apps", "version": "v1", "kind": "Deployment"}
            }}},
            "definitions": {"D": {"type": "object", "properties": {"spec": {"allOf": [{"$ref": "#/definitions/S"}], "description": "x"}}}}
        });
        let top = fields(&encode(&doc));
        assert_eq!(top[0], (1, b"2.0".to_vec()));
        let paths = &top.iter().find(|(f, _)| *f == 8).unwrap().1;
        let named_path = &fields(paths)[0].1;
        let path_item = &fields(named_path)
            .iter()
            .find(|(f, _)| *f == 2)
            .unwrap()
            .1
            .clone();
        let patch = &fields(path_item)
            .iter()
            .find(|(f, _)| *f == 8)
            .unwrap()
            .1
            .clone();
        let op = fields(patch);
        // The GVK vendor extension, as YAML-readable JSON.
        let ext = &op.iter().find(|(f, _)| *f == 13).unwrap().1;
        let ext = fields(ext);
        assert_eq!(ext[0].1, b"x-kubernetes-group-version-kind");
        assert!(String::from_utf8_lossy(&fields(&ext[1].1)[0].1).contains("\"Deployment\""));
        // The query parameter, as a QueryParameterSubSchema named fieldValidation.
        let params: Vec<_> = op.iter().filter(|(f, _)| *f == 8).collect();
        assert_eq!(params.len(), 3);
        let query = fields(&fields(&fields(&params[1].1)[0].1)[0].1);
        assert_eq!(query[0].0, 3, "a query parameter sub-schema");
        assert!(
            fields(&query[0].1)
                .iter()
                .any(|(f, v)| *f == 4 && v == b"fieldValidation")
        );
        // allOf-wrapped references become plain references.
        let defs = &top.iter().find(|(f, _)| *f == 9).unwrap().1;
        assert!(String::from_utf8_lossy(defs).contains("#/definitions/S"));
    }
}
