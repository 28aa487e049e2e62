//! Protobuf request bodies (`application/vnd.kubernetes.protobuf`).
//!
//! client-go's typed clients send built-in objects as protobuf (since Kubernetes 1.31), so
//! `kubectl create namespace`, `kubectl create deployment` and friends do. This decodes such a
//! body into the same JSON the object would have been sent as: the Kubernetes envelope
//! (`k8s\0` + `runtime.Unknown`) and the wire format of the upstream messages, described by
//! `protobuf/k8s-messages.txt` (extracted from the k8s-pb crate by
//! `scripts/gen-protobuf-table.py`). Field numbers come from that table; JSON names come from
//! the served OpenAPI schemas. Responses are always JSON, which these clients accept.
//!
//! Go writes every non-pointer scalar field, so zero scalars are dropped as Go's JSON encoder
//! would drop them (`omitempty`), except required fields and a few pointer fields whose zero
//! means something (`replicas: 0`).

use std::collections::HashMap;
use std::sync::OnceLock;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, Value, json};

const TABLE: &str = include_str!("protobuf/k8s-messages.txt");
const MAGIC: &[u8] = b"k8s\x00";

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProtobufError {
    #[error("not a Kubernetes protobuf body (missing the k8s\\0 prefix)")]
    Magic,
    #[error("truncated or malformed protobuf")]
    Malformed,
    #[error("no protobuf definition for {0}")]
    Unknown(String),
    #[error("invalid protobuf content: {0}")]
    Invalid(String),
}

#[derive(Clone, Debug)]
enum Kind {
    String,
    Bool,
    Int32,
    Int64,
    Double,
    Bytes,
    Message(String),
    MapString,
    MapBytes,
    MapMessage(String),
}

#[derive(Clone, Debug)]
struct Field {
    json: String,
    kind: Kind,
    repeated: bool,
    keep_zero: bool,
    /// An embedded struct that JSON inlines (`json:",inline"`): its fields belong to the parent.
    inline: bool,
}

#[derive(Debug, Default)]
struct Message {
    name: String,
    fields: HashMap<u64, Field>,
}

#[derive(Debug, Default)]
struct Table {
    /// By lower-cased name (prost writes `JsonSchemaProps` for `JSONSchemaProps`).
    messages: HashMap<String, Message>,
}

/// Pointer fields whose zero is meaningful (Go sends them only when set).
const KEEP_ZERO: &[(&str, &str)] = &[
    ("io.k8s.api.apps.v1.DeploymentSpec", "replicas"),
    ("io.k8s.api.apps.v1.StatefulSetSpec", "replicas"),
    ("io.k8s.api.apps.v1.ReplicaSetSpec", "replicas"),
    ("io.k8s.api.batch.v1.JobSpec", "parallelism"),
    ("io.k8s.api.batch.v1.JobSpec", "completions"),
    ("io.k8s.api.batch.v1.JobSpec", "backoffLimit"),
    ("io.k8s.api.batch.v1.JobSpec", "ttlSecondsAfterFinished"),
    (
        "io.k8s.api.core.v1.PodSpec",
        "terminationGracePeriodSeconds",
    ),
    ("io.k8s.api.core.v1.PodSpec", "automountServiceAccountToken"),
    (
        "io.k8s.api.core.v1.ServiceAccount",
        "automountServiceAccountToken",
    ),
    (
        "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions",
        "gracePeriodSeconds",
    ),
];

fn normalized(s: &str) -> String {
    s.chars()
        .filter(|c| *c != '_')
        .flat_map(char::to_lowercase)
        .collect()
}

fn lower_camel(snake: &str) -> String {
    let mut out = String::new();
    let mut upper = false;
    for c in snake.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

fn table() -> &'static Table {
    static T: OnceLock<Table> = OnceLock::new();
    T.get_or_init(|| {
        let schemas = crate::schema::builtin();
        let by_lower: HashMap<String, &String> =
            schemas.keys().map(|k| (k.to_lowercase(), k)).collect();
        let mut t = Table::default();
        let mut current: Option<Message> = None;
        let mut props: Vec<String> = Vec::new();
        let mut required: Vec<String> = Vec::new();
        for line in TABLE.lines() {
            let parts: Vec<&str> = line.split_whitespace().collect();
            match parts.as_slice() {
                ["M", name] => {
                    if let Some(m) = current.take() {
                        t.messages.insert(m.name.to_lowercase(), m);
                    }
                    let canonical = by_lower
                        .get(&name.to_lowercase())
                        .map(|s| s.to_string())
                        .unwrap_or_else(|| name.to_string());
                    let schema = schemas.get(&canonical);
                    props = schema
                        .and_then(|s| s.get("properties"))
                        .and_then(Value::as_object)
                        .map(|p| p.keys().cloned().collect())
                        .unwrap_or_default();
                    required = schema
                        .and_then(|s| s.get("required"))
                        .and_then(Value::as_array)
                        .map(|r| {
                            r.iter()
                                .filter_map(Value::as_str)
                                .map(str::to_string)
                                .collect()
                        })
                        .unwrap_or_default();
                    current = Some(Message {
                        name: canonical,
                        fields: HashMap::new(),
                    });
                }
                ["F", tag, name, kind, rest @ ..] => {
                    let Some(m) = current.as_mut() else { continue };
                    let Ok(tag) = tag.parse::<u64>() else {
                        continue;
                    };
                    let repeated = kind.starts_with('*');
                    let kind = kind.trim_start_matches('*');
                    let target = rest.first().map(|s| s.to_lowercase()).unwrap_or_default();
                    let kind = match kind {
                        "string" => Kind::String,
                        "bool" => Kind::Bool,
                        "int32" => Kind::Int32,
                        "int64" => Kind::Int64,
                        "double" => Kind::Double,
                        "bytes" => Kind::Bytes,
                        "message" => Kind::Message(target),
                        "map:string" => Kind::MapString,
                        "map:bytes" => Kind::MapBytes,
                        "map:message" => Kind::MapMessage(target),
                        _ => continue,
                    };
                    let n = normalized(name);
                    let declared = props.iter().find(|p| normalized(p) == n).cloned();
                    // A message field the parent's schema does not declare is an inlined struct
                    // (Volume.volumeSource, IngressRule.ingressRuleValue, ...).
                    let inline = declared.is_none()
                        && !props.is_empty()
                        && matches!(kind, Kind::Message(_))
                        && !repeated;
                    let json = declared.unwrap_or_else(|| lower_camel(name));
                    let keep_zero = required.contains(&json)
                        || KEEP_ZERO
                            .iter()
                            .any(|(msg, f)| *msg == m.name && *f == json);
                    m.fields.insert(
                        tag,
                        Field {
                            json,
                            kind,
                            repeated,
                            keep_zero,
                            inline,
                        },
                    );
                }
                _ => {}
            }
        }
        if let Some(m) = current.take() {
            t.messages.insert(m.name.to_lowercase(), m);
        }
        t
    })
}

/// One field as it appears on the wire.
enum Wire<'a> {
    Varint(u64),
    Fixed64(u64),
    Bytes(&'a [u8]),
    Fixed32,
}

fn varint(buf: &[u8], pos: &mut usize) -> Result<u64, ProtobufError> {
    let mut out = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*pos).ok_or(ProtobufError::Malformed)?;
        *pos += 1;
        out |= ((b & 0x7f) as u64) << shift;
        if b & 0x80 == 0 {
            return Ok(out);
        }
    }
    Err(ProtobufError::Malformed)
}

fn fields(buf: &[u8]) -> Result<Vec<(u64, Wire<'_>)>, ProtobufError> {
    let mut pos = 0;
    let mut out = Vec::new();
    while pos < buf.len() {
        let key = varint(buf, &mut pos)?;
        let (num, wt) = (key >> 3, key & 7);
        let w = match wt {
            0 => Wire::Varint(varint(buf, &mut pos)?),
            1 => {
                let b = buf.get(pos..pos + 8).ok_or(ProtobufError::Malformed)?;
                pos += 8;
                Wire::Fixed64(u64::from_le_bytes(
                    b.try_into().map_err(|_| ProtobufError::Malformed)?,
                ))
            }
            2 => {
                let len = varint(buf, &mut pos)? as usize;
                let b = buf
                    .get(pos..pos.checked_add(len).ok_or(ProtobufError::Malformed)?)
                    .ok_or(ProtobufError::Malformed)?;
                pos += len;
                Wire::Bytes(b)
            }
            5 => {
                // No field of these messages is a fixed32; skip its four bytes.
                buf.get(pos..pos + 4).ok_or(ProtobufError::Malformed)?;
                pos += 4;
                Wire::Fixed32
            }
            _ => return Err(ProtobufError::Malformed),
        };
        out.push((num, w));
    }
    Ok(out)
}

fn text(b: &[u8]) -> Result<String, ProtobufError> {
    String::from_utf8(b.to_vec())
        .map_err(|_| ProtobufError::Invalid("a string is not UTF-8".into()))
}

/// Decodes a protobuf request body whose object is expected to be the `component` schema
/// (e.g. `io.k8s.api.core.v1.Namespace`), into its JSON form.
pub fn decode(body: &[u8], component: &str) -> Result<Value, ProtobufError> {
    let rest = body.strip_prefix(MAGIC).ok_or(ProtobufError::Magic)?;
    let mut api_version = String::new();
    let mut kind = String::new();
    let mut raw: &[u8] = &[];
    for (num, w) in fields(rest)? {
        match (num, w) {
            (1, Wire::Bytes(tm)) => {
                for (n, w) in fields(tm)? {
                    match (n, w) {
                        (1, Wire::Bytes(b)) => api_version = text(b)?,
                        (2, Wire::Bytes(b)) => kind = text(b)?,
                        _ => {}
                    }
                }
            }
            (2, Wire::Bytes(b)) => raw = b,
            (3, Wire::Bytes(enc)) if !enc.is_empty() => {
                return Err(ProtobufError::Invalid(
                    "content encodings are not supported".into(),
                ));
            }
            _ => {}
        }
    }
    let mut v = message(raw, &component.to_lowercase())?;
    if let Value::Object(m) = &mut v {
        if !api_version.is_empty() {
            m.insert("apiVersion".into(), json!(api_version));
        }
        if !kind.is_empty() {
            m.insert("kind".into(), json!(kind));
        }
    }
    Ok(v)
}

fn format_time(seconds: i64, nanos: i64, micro: bool) -> Value {
    if seconds == 0 && nanos == 0 {
        return Value::Null;
    }
    let Ok(ts) = jiff::Timestamp::new(seconds, if micro { nanos as i32 } else { 0 }) else {
        return Value::Null;
    };
    let fmt = if micro {
        "%Y-%m-%dT%H:%M:%S%.6fZ"
    } else {
        "%Y-%m-%dT%H:%M:%SZ"
    };
    json!(ts.strftime(fmt).to_string())
}

/// Go's `time.Duration.String()`.
pub fn go_duration(ns: i64) -> String {
    if ns == 0 {
        return "0s".into();
    }
    let neg = ns < 0;
    let ns = ns.unsigned_abs();
    let s = if ns < 1_000 {
        format!("{ns}ns")
    } else if ns < 1_000_000 {
        format!("{}µs", trim(ns as f64 / 1e3))
    } else if ns < 1_000_000_000 {
        format!("{}ms", trim(ns as f64 / 1e6))
    } else {
        let total = ns as f64 / 1e9;
        let h = ns / 3_600_000_000_000;
        let m = (ns / 60_000_000_000) % 60;
        let secs = total - (h * 3600 + m * 60) as f64;
        let mut out = String::new();
        if h > 0 {
            out.push_str(&format!("{h}h"));
        }
        if h > 0 || m > 0 {
            out.push_str(&format!("{m}m"));
        }
        out.push_str(&format!("{}s", trim(secs)));
        out
    };
    if neg { format!("-{s}") } else { s }
}

fn trim(v: f64) -> String {
    let s = format!("{v:.9}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// The message every JSONSchemaProps union holds.
const JSON_SCHEMA_PROPS: &str =
    "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.jsonschemaprops";

/// Decodes one message of the type `name` (lower-cased) into its JSON form.
fn message(buf: &[u8], name: &str) -> Result<Value, ProtobufError> {
    let wire = fields(buf)?;
    if let Some(v) = special_form(&wire, name)? {
        return Ok(v);
    }
    let m = table()
        .messages
        .get(name)
        .ok_or_else(|| ProtobufError::Unknown(name.to_string()))?;
    let mut out = Map::new();
    for (num, w) in &wire {
        let Some(f) = m.fields.get(num) else { continue };
        match &f.kind {
            Kind::MapString | Kind::MapBytes | Kind::MapMessage(_) => map_entry(w, f, &mut out)?,
            Kind::Message(t) if f.inline => inline_message(w, t, &mut out)?,
            _ => plain_field(w, f, &mut out)?,
        }
    }
    drop_zero_scalars(m, &mut out);
    Ok(Value::Object(out))
}

/// The first varint field numbered `n`, or 0 (protobuf's default) if there is none.
fn varint_of(wire: &[(u64, Wire<'_>)], n: u64) -> i64 {
    wire.iter()
        .find_map(|(k, w)| match w {
            Wire::Varint(v) if *k == n => Some(*v as i64),
            _ => None,
        })
        .unwrap_or(0)
}

/// The first length-delimited field numbered `n`.
fn bytes_of<'a>(wire: &[(u64, Wire<'a>)], n: u64) -> Option<&'a [u8]> {
    wire.iter().find_map(|(k, w)| match w {
        Wire::Bytes(b) if *k == n => Some(*b),
        _ => None,
    })
}

/// Every length-delimited field numbered `n`, in order.
fn all_bytes_of<'a>(wire: &[(u64, Wire<'a>)], n: u64) -> impl Iterator<Item = &'a [u8]> {
    wire.iter().filter_map(move |(k, w)| match w {
        Wire::Bytes(b) if *k == n => Some(*b),
        _ => None,
    })
}

/// The JSON of the types whose JSON form is not their message form (times, durations,
/// quantities, int-or-strings, embedded JSON, the JSONSchemaProps unions); `None` for the
/// others.
fn special_form(wire: &[(u64, Wire<'_>)], name: &str) -> Result<Option<Value>, ProtobufError> {
    Ok(Some(match name {
        "io.k8s.apimachinery.pkg.apis.meta.v1.time" => format_time(varint_of(wire, 1), 0, false),
        "io.k8s.apimachinery.pkg.apis.meta.v1.microtime" => {
            format_time(varint_of(wire, 1), varint_of(wire, 2), true)
        }
        "io.k8s.apimachinery.pkg.apis.meta.v1.duration" => {
            json!(go_duration(varint_of(wire, 1)))
        }
        "io.k8s.apimachinery.pkg.api.resource.quantity" => {
            json!(text(bytes_of(wire, 1).unwrap_or_default())?)
        }
        "io.k8s.apimachinery.pkg.util.intstr.intorstring" => {
            if varint_of(wire, 1) == 1 {
                json!(text(bytes_of(wire, 3).unwrap_or_default())?)
            } else {
                json!(varint_of(wire, 2) as i32)
            }
        }
        "io.k8s.apimachinery.pkg.runtime.rawextension"
        | "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.json"
        | "io.k8s.apimachinery.pkg.apis.meta.v1.fieldsv1" => {
            let raw = bytes_of(wire, 1).unwrap_or_default();
            if raw.is_empty() {
                Value::Null
            } else {
                serde_json::from_slice(raw)
                    .map_err(|e| ProtobufError::Invalid(format!("embedded JSON: {e}")))?
            }
        }
        "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.jsonschemapropsorbool" => {
            match bytes_of(wire, 2) {
                Some(s) => message(s, JSON_SCHEMA_PROPS)?,
                None => json!(varint_of(wire, 1) != 0),
            }
        }
        "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.jsonschemapropsorarray" => {
            match bytes_of(wire, 1) {
                Some(s) => message(s, JSON_SCHEMA_PROPS)?,
                None => Value::Array(
                    all_bytes_of(wire, 2)
                        .map(|b| message(b, JSON_SCHEMA_PROPS))
                        .collect::<Result<_, _>>()?,
                ),
            }
        }
        "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.jsonschemapropsorstringarray" => {
            match bytes_of(wire, 1) {
                Some(s) => message(s, JSON_SCHEMA_PROPS)?,
                None => Value::Array(
                    all_bytes_of(wire, 2)
                        .map(|b| text(b).map(Value::String))
                        .collect::<Result<_, _>>()?,
                ),
            }
        }
        _ => return Ok(None),
    }))
}

/// One entry (key 1, value 2) of a map field, added to the map under the field's JSON name.
/// A string map's entry without a value maps to "".
fn map_entry(w: &Wire<'_>, f: &Field, out: &mut Map<String, Value>) -> Result<(), ProtobufError> {
    let Wire::Bytes(entry) = w else {
        return Err(ProtobufError::Malformed);
    };
    let (mut key, mut val) = (String::new(), Value::Null);
    for (n, ew) in fields(entry)? {
        match (n, ew, &f.kind) {
            (1, Wire::Bytes(b), _) => key = text(b)?,
            (2, Wire::Bytes(b), Kind::MapString) => val = json!(text(b)?),
            (2, Wire::Bytes(b), Kind::MapBytes) => val = json!(STANDARD.encode(b)),
            (2, Wire::Bytes(b), Kind::MapMessage(t)) => val = message(b, t)?,
            _ => {}
        }
    }
    if matches!(f.kind, Kind::MapString) && val.is_null() {
        val = json!("");
    }
    if let Value::Object(map) = out.entry(f.json.clone()).or_insert_with(|| json!({})) {
        map.insert(key, val);
    }
    Ok(())
}

/// An inlined message field: its fields join the parent's.
fn inline_message(
    w: &Wire<'_>,
    t: &str,
    out: &mut Map<String, Value>,
) -> Result<(), ProtobufError> {
    let Wire::Bytes(b) = w else {
        return Err(ProtobufError::Malformed);
    };
    if let Value::Object(inner) = message(b, t)? {
        out.extend(inner);
    }
    Ok(())
}

/// A scalar or message field: a repeated one appends its values, another keeps its last.
fn plain_field(w: &Wire<'_>, f: &Field, out: &mut Map<String, Value>) -> Result<(), ProtobufError> {
    let values = scalar(w, &f.kind)?;
    if f.repeated {
        if let Value::Array(list) = out.entry(f.json.clone()).or_insert_with(|| json!([])) {
            list.extend(values);
        }
    } else if let Some(v) = values.into_iter().last() {
        out.insert(f.json.clone(), v);
    }
    Ok(())
}

/// Drops the zero scalars Go writes for unset non-pointer fields (inlined ones included).
fn drop_zero_scalars(m: &Message, out: &mut Map<String, Value>) {
    out.retain(|k, v| {
        let keep = m
            .fields
            .values()
            .find(|f| &f.json == k)
            .is_some_and(|f| f.keep_zero || f.repeated);
        keep || !matches!(v, Value::Null) && !is_zero_scalar(v)
    });
}

fn is_zero_scalar(v: &Value) -> bool {
    match v {
        Value::String(s) => s.is_empty(),
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        _ => false,
    }
}

/// The value(s) of one wire field (several for a packed repeated scalar).
fn scalar(w: &Wire<'_>, kind: &Kind) -> Result<Vec<Value>, ProtobufError> {
    Ok(match (kind, w) {
        (Kind::String, Wire::Bytes(b)) => vec![json!(text(b)?)],
        (Kind::Bytes, Wire::Bytes(b)) => vec![json!(STANDARD.encode(b))],
        (Kind::Message(t), Wire::Bytes(b)) => vec![message(b, t)?],
        (Kind::Bool, Wire::Varint(v)) => vec![json!(*v != 0)],
        (Kind::Int32, Wire::Varint(v)) => vec![json!(*v as i64 as i32)],
        (Kind::Int64, Wire::Varint(v)) => vec![json!(*v as i64)],
        (Kind::Double, Wire::Fixed64(v)) => vec![json!(f64::from_bits(*v))],
        (Kind::Int32 | Kind::Int64 | Kind::Bool, Wire::Bytes(packed)) => {
            let mut pos = 0;
            let mut out = Vec::new();
            while pos < packed.len() {
                let v = varint(packed, &mut pos)?;
                out.push(match kind {
                    Kind::Bool => json!(v != 0),
                    Kind::Int32 => json!(v as i64 as i32),
                    _ => json!(v as i64),
                });
            }
            out
        }
        _ => return Err(ProtobufError::Malformed),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vi(mut v: u64, out: &mut Vec<u8>) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }
    fn field_bytes(n: u64, b: &[u8], out: &mut Vec<u8>) {
        vi(n << 3 | 2, out);
        vi(b.len() as u64, out);
        out.extend_from_slice(b);
    }
    fn field_varint(n: u64, v: u64, out: &mut Vec<u8>) {
        vi(n << 3, out);
        vi(v, out);
    }
    fn envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
        let mut tm = Vec::new();
        field_bytes(1, api_version.as_bytes(), &mut tm);
        field_bytes(2, kind.as_bytes(), &mut tm);
        let mut unknown = Vec::new();
        field_bytes(1, &tm, &mut unknown);
        field_bytes(2, raw, &mut unknown);
        field_bytes(3, b"", &mut unknown);
        field_bytes(4, b"", &mut unknown);
        [MAGIC, &unknown].concat()
    }
    fn meta(name: &str) -> Vec<u8> {
        // As Go writes it: every scalar, empty or not.
        let mut m = Vec::new();
        field_bytes(1, name.as_bytes(), &mut m);
        field_bytes(2, b"", &mut m);
        field_bytes(3, b"", &mut m);
        field_bytes(5, b"", &mut m);
        field_varint(7, 0, &mut m);
        field_bytes(8, &[], &mut m); // creationTimestamp: zero Time
        m
    }

    #[test]
    fn namespace_as_kubectl_create_sends_it() {
        let mut ns = Vec::new();
        field_bytes(1, &meta("team-a"), &mut ns);
        field_bytes(2, &[], &mut ns); // spec {}
        field_bytes(3, &[], &mut ns); // status {}
        let v = decode(
            &envelope("v1", "Namespace", &ns),
            "io.k8s.api.core.v1.Namespace",
        )
        .unwrap();
        assert_eq!(
            v,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}, "spec": {}, "status": {}})
        );
    }

    #[test]
    fn maps_bytes_quantities_and_int_or_string() {
        let mut entry = Vec::new();
        field_bytes(1, b"key", &mut entry);
        field_bytes(2, b"\x00\xff", &mut entry);
        let mut secret = Vec::new();
        field_bytes(1, &meta("s"), &mut secret);
        field_bytes(2, &entry, &mut secret);
        field_bytes(3, b"Opaque", &mut secret);
        let v = decode(
            &envelope("v1", "Secret", &secret),
            "io.k8s.api.core.v1.Secret",
        )
        .unwrap();
        assert_eq!(v["data"], json!({"key": "AP8="}));
        assert_eq!(v["type"], "Opaque");

        // A container port with an IntOrString target and resources with quantities.
        let mut q = Vec::new();
        field_bytes(1, b"250m", &mut q);
        let mut req = Vec::new();
        field_bytes(1, b"cpu", &mut req);
        field_bytes(2, &q, &mut req);
        let mut resources = Vec::new();
        field_bytes(2, &req, &mut resources);
        let mut container = Vec::new();
        field_bytes(1, b"web", &mut container);
        field_bytes(2, b"nginx", &mut container);
        field_bytes(8, &resources, &mut container);
        let mut pod_spec = Vec::new();
        field_bytes(2, &container, &mut pod_spec);
        let v = message(&pod_spec, "io.k8s.api.core.v1.podspec").unwrap();
        assert_eq!(
            v,
            json!({"containers": [{"name": "web", "image": "nginx", "resources": {"requests": {"cpu": "250m"}}}]})
        );

        let mut ios = Vec::new();
        field_varint(1, 1, &mut ios);
        field_varint(2, 0, &mut ios);
        field_bytes(3, b"http", &mut ios);
        assert_eq!(
            message(&ios, "io.k8s.apimachinery.pkg.util.intstr.intorstring").unwrap(),
            json!("http")
        );
        let mut ioi = Vec::new();
        field_varint(1, 0, &mut ioi);
        field_varint(2, 8080, &mut ioi);
        assert_eq!(
            message(&ioi, "io.k8s.apimachinery.pkg.util.intstr.intorstring").unwrap(),
            json!(8080)
        );
    }

    #[test]
    fn replicas_zero_survives_and_names_resolve() {
        let mut spec = Vec::new();
        field_varint(1, 0, &mut spec); // replicas: 0, explicitly
        field_varint(5, 0, &mut spec); // minReadySeconds: Go's zero, dropped
        let v = message(&spec, "io.k8s.api.apps.v1.deploymentspec").unwrap();
        assert_eq!(v, json!({"replicas": 0}));
        let mut status = Vec::new();
        field_bytes(6, b"10.0.0.1", &mut status); // podIP
        let v = message(&status, "io.k8s.api.core.v1.podstatus").unwrap();
        assert_eq!(
            v,
            json!({"podIP": "10.0.0.1"}),
            "acronyms map to their JSON names"
        );
    }

    #[test]
    fn inlined_structs_merge_into_their_parent() {
        // Volume{name, VolumeSource{configMap{LocalObjectReference{name}}}}, as Go writes it.
        let mut lor = Vec::new();
        field_bytes(1, b"cfg", &mut lor);
        let mut cm = Vec::new();
        field_bytes(1, &lor, &mut cm);
        let mut source = Vec::new();
        field_bytes(19, &cm, &mut source);
        let mut volume = Vec::new();
        field_bytes(1, b"config", &mut volume);
        field_bytes(2, &source, &mut volume);
        let v = message(&volume, "io.k8s.api.core.v1.volume").unwrap();
        assert_eq!(v, json!({"name": "config", "configMap": {"name": "cfg"}}));
    }

    #[test]
    fn bad_input() {
        assert_eq!(
            decode(b"{}", "io.k8s.api.core.v1.Namespace").unwrap_err(),
            ProtobufError::Magic
        );
        assert_eq!(
            decode(b"k8s\x00\x0a\xff", "io.k8s.api.core.v1.Namespace").unwrap_err(),
            ProtobufError::Malformed
        );
        assert!(matches!(
            decode(&envelope("v1", "X", b""), "io.nope.X").unwrap_err(),
            ProtobufError::Unknown(_)
        ));
        assert_eq!(go_duration(90_000_000_000), "1m30s");
        assert_eq!(go_duration(1_500_000_000), "1.5s");
        assert_eq!(go_duration(2_000_000), "2ms");
        assert_eq!(go_duration(3_600_000_000_000), "1h0m0s");
    }
}
