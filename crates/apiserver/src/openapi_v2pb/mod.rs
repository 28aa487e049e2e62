//! The OpenAPI v2 document as protobuf (`application/com.github.proto-openapi.spec.v2@v1.0+protobuf`),
//! the gnostic `openapi.v2.Document` that client-go asks for. kubectl falls back to it where
//! OpenAPI v3 has no answer (validating a file of `kind: List`, for one), and accepts nothing
//! else there. Converted here from the JSON document into the messages generated from
//! gnostic's `OpenAPIv2.proto` (`proto/openapiv2/`; `tools/proto-gen` regenerates
//! `openapi.v2.rs` and `google.protobuf.rs`, checked in so that no build needs `protoc`).
//! Only the parts clients read are converted: paths and operations with their parameters,
//! responses and vendor extensions, and the schema definitions.

use prost::Message;
use serde_json::Value;

#[allow(
    clippy::all,
    clippy::pedantic,
    missing_debug_implementations,
    dead_code
)]
pub mod google {
    pub mod protobuf {
        include!("google.protobuf.rs");
    }
}

#[allow(
    clippy::all,
    clippy::pedantic,
    missing_debug_implementations,
    dead_code
)]
pub mod openapi {
    pub mod v2 {
        include!("openapi.v2.rs");
    }
}

use openapi::v2 as pb;

/// The media type client-go requests.
pub const MEDIA_TYPE: &str = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";
/// The content type answered: Go's MIME parser refuses the `@` of the requested one, so
/// Kubernetes (kube-openapi) answers with this spelling.
pub const CONTENT_TYPE: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";

fn str_of(v: &Value, k: &str) -> String {
    v.get(k).and_then(Value::as_str).unwrap_or("").to_string()
}

fn flag(v: &Value, k: &str) -> bool {
    v.get(k) == Some(&Value::Bool(true))
}

/// The members of the array at `k`, if there is one.
fn items_of<'a>(v: &'a Value, k: &str) -> impl Iterator<Item = &'a Value> {
    v.get(k).and_then(Value::as_array).into_iter().flatten()
}

/// The strings of the array at `k`.
fn strings_of(v: &Value, k: &str) -> Vec<String> {
    items_of(v, k)
        .filter_map(Value::as_str)
        .map(String::from)
        .collect()
}

/// An object of schemas by name (properties, definitions) as `NamedSchema`s.
fn named_schemas(m: &serde_json::Map<String, Value>) -> Vec<pb::NamedSchema> {
    m.iter()
        .map(|(name, s)| pb::NamedSchema {
            name: name.clone(),
            value: Some(schema(s)),
        })
        .collect()
}

/// `Any{yaml}`: the value as JSON (which YAML parsers read).
fn any(v: &Value) -> pb::Any {
    pb::Any {
        value: None,
        yaml: serde_json::to_string(v).unwrap_or_default(),
    }
}

/// The `x-...` members of an object as `NamedAny`s.
fn extensions(obj: &Value) -> Vec<pb::NamedAny> {
    obj.as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| k.starts_with("x-"))
        .map(|(k, v)| pb::NamedAny {
            name: k.clone(),
            value: Some(any(v)),
        })
        .collect()
}

fn schema(s: &Value) -> pb::Schema {
    // A `$ref` wrapped in a single-element allOf is written as a plain reference.
    let target = match s.get("allOf").and_then(Value::as_array) {
        Some(all) if all.len() == 1 && all[0].get("$ref").is_some() => &all[0],
        _ => s,
    };
    let f64_of = |k| s.get(k).and_then(Value::as_f64).unwrap_or_default();
    let i64_of = |k| s.get(k).and_then(Value::as_i64).unwrap_or_default();
    use pb::additional_properties_item::Oneof as Extra;
    pb::Schema {
        r#ref: str_of(target, "$ref"),
        format: str_of(s, "format"),
        title: str_of(s, "title"),
        description: str_of(s, "description"),
        default: s.get("default").map(any),
        maximum: f64_of("maximum"),
        exclusive_maximum: flag(s, "exclusiveMaximum"),
        minimum: f64_of("minimum"),
        exclusive_minimum: flag(s, "exclusiveMinimum"),
        max_length: i64_of("maxLength"),
        min_length: i64_of("minLength"),
        pattern: str_of(s, "pattern"),
        max_items: i64_of("maxItems"),
        min_items: i64_of("minItems"),
        required: strings_of(s, "required"),
        r#enum: items_of(s, "enum").map(any).collect(),
        additional_properties: match s.get("additionalProperties") {
            Some(Value::Bool(b)) => Some(Box::new(pb::AdditionalPropertiesItem {
                oneof: Some(Extra::Boolean(*b)),
            })),
            Some(extra @ Value::Object(_)) => Some(Box::new(pb::AdditionalPropertiesItem {
                oneof: Some(Extra::Schema(Box::new(schema(extra)))),
            })),
            _ => None,
        },
        r#type: s.get("type").and_then(Value::as_str).map(|t| pb::TypeItem {
            value: vec![t.to_string()],
        }),
        items: s.get("items").map(|items| pb::ItemsItem {
            schema: vec![schema(items)],
        }),
        properties: s
            .get("properties")
            .and_then(Value::as_object)
            .map(|props| pb::Properties {
                additional_properties: named_schemas(props),
            }),
        vendor_extension: extensions(s),
        ..Default::default()
    }
}

fn parameter(p: &Value) -> pb::ParametersItem {
    use pb::non_body_parameter::Oneof as NonBody;
    use pb::parameter::Oneof as Kind;
    let kind = if str_of(p, "in") == "body" {
        Kind::BodyParameter(pb::BodyParameter {
            description: str_of(p, "description"),
            name: str_of(p, "name"),
            r#in: "body".into(),
            required: flag(p, "required"),
            schema: p.get("schema").map(schema),
            ..Default::default()
        })
    } else {
        let (required, r#in, description, name, r#type) = (
            flag(p, "required"),
            str_of(p, "in"),
            str_of(p, "description"),
            str_of(p, "name"),
            str_of(p, "type"),
        );
        let sub = if r#in == "path" {
            NonBody::PathParameterSubSchema(pb::PathParameterSubSchema {
                required,
                r#in,
                description,
                name,
                r#type,
                ..Default::default()
            })
        } else {
            NonBody::QueryParameterSubSchema(pb::QueryParameterSubSchema {
                required,
                r#in,
                description,
                name,
                r#type,
                ..Default::default()
            })
        };
        Kind::NonBodyParameter(pb::NonBodyParameter { oneof: Some(sub) })
    };
    pb::ParametersItem {
        oneof: Some(pb::parameters_item::Oneof::Parameter(pb::Parameter {
            oneof: Some(kind),
        })),
    }
}

fn response(r: &Value) -> pb::ResponseValue {
    pb::ResponseValue {
        oneof: Some(pb::response_value::Oneof::Response(pb::Response {
            description: str_of(r, "description"),
            schema: r.get("schema").map(|s| pb::SchemaItem {
                oneof: Some(pb::schema_item::Oneof::Schema(schema(s))),
            }),
            ..Default::default()
        })),
    }
}

fn operation(op: &Value) -> pb::Operation {
    pb::Operation {
        tags: strings_of(op, "tags"),
        description: str_of(op, "description"),
        operation_id: str_of(op, "operationId"),
        produces: vec!["application/json".into(), "application/yaml".into()],
        parameters: items_of(op, "parameters").map(parameter).collect(),
        responses: op
            .get("responses")
            .and_then(Value::as_object)
            .map(|responses| pb::Responses {
                response_code: responses
                    .iter()
                    .map(|(code, r)| pb::NamedResponseValue {
                        name: code.clone(),
                        value: Some(response(r)),
                    })
                    .collect(),
                ..Default::default()
            }),
        vendor_extension: extensions(op),
        ..Default::default()
    }
}

/// The gnostic document of a Swagger 2.0 JSON document.
pub fn document(doc: &Value) -> pb::Document {
    pb::Document {
        swagger: str_of(doc, "swagger"),
        info: doc.get("info").map(|info| pb::Info {
            title: str_of(info, "title"),
            version: str_of(info, "version"),
            ..Default::default()
        }),
        paths: doc
            .get("paths")
            .and_then(Value::as_object)
            .map(|paths| pb::Paths {
                path: paths
                    .iter()
                    .map(|(path, item)| {
                        let op = |m| item.get(m).map(operation);
                        pb::NamedPathItem {
                            name: path.clone(),
                            value: Some(pb::PathItem {
                                get: op("get"),
                                put: op("put"),
                                post: op("post"),
                                delete: op("delete"),
                                patch: op("patch"),
                                ..Default::default()
                            }),
                        }
                    })
                    .collect(),
                ..Default::default()
            }),
        definitions: doc
            .get("definitions")
            .and_then(Value::as_object)
            .map(|defs| pb::Definitions {
                additional_properties: named_schemas(defs),
            }),
        ..Default::default()
    }
}

/// Encodes a Swagger 2.0 JSON document.
pub fn encode(doc: &Value) -> Vec<u8> {
    document(doc).encode_to_vec()
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
        // And the whole reads back as the gnostic document (what client-go decodes).
        let back = pb::Document::decode(encode(&doc).as_slice()).unwrap();
        assert_eq!(back, document(&doc));
        let spec = &back.definitions.unwrap().additional_properties[0];
        let props = spec.value.as_ref().unwrap().properties.as_ref().unwrap();
        assert_eq!(
            props.additional_properties[0].value.as_ref().unwrap().r#ref,
            "#/definitions/S"
        );
    }
}
