//! The generic object: what every stored Kubernetes-style resource is, whatever its kind.
//!
//! `apiVersion`, `kind`, `metadata`, `spec` and `status` are typed (metadata fully, spec and
//! status as JSON); every other top-level field (`data` of a ConfigMap, `rules` of a Role, ...)
//! is kept verbatim in [`Object::other`], so a round trip through Orrery loses nothing.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use crate::time::Time;

/// A Kubernetes-style object of any kind.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Object {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: Option<Value>,
    pub status: Option<Value>,
    /// Every other top-level field, in the order it arrived.
    pub other: Map<String, Value>,
}

/// Standard object metadata (`metav1.ObjectMeta`).
///
/// Empty strings, maps and lists mean "unset" and are omitted when serialized; JSON `null` is
/// accepted for every field, as the Kubernetes API accepts it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "String::is_empty"
    )]
    pub name: String,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "String::is_empty"
    )]
    pub generate_name: String,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "String::is_empty"
    )]
    pub namespace: String,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "String::is_empty"
    )]
    pub self_link: String,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "String::is_empty"
    )]
    pub uid: String,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "String::is_empty"
    )]
    pub resource_version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_timestamp: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_timestamp: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_grace_period_seconds: Option<i64>,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub labels: BTreeMap<String, String>,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub annotations: BTreeMap<String, String>,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub owner_references: Vec<OwnerReference>,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub finalizers: Vec<String>,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub managed_fields: Vec<Value>,
}

/// A reference from a dependent to its owner (`metav1.OwnerReference`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnerReference {
    #[serde(default, deserialize_with = "nullable")]
    pub api_version: String,
    #[serde(default, deserialize_with = "nullable")]
    pub kind: String,
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    #[serde(default, deserialize_with = "nullable")]
    pub uid: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_owner_deletion: Option<bool>,
}

impl OwnerReference {
    /// `owner` as the controller of what this reference is put on (garbage collection deletes
    /// that with it, and foreground deletion waits for it).
    pub fn controller_of(owner: &Object) -> OwnerReference {
        OwnerReference {
            api_version: owner.api_version.clone(),
            kind: owner.kind.clone(),
            name: owner.name().to_string(),
            uid: owner.metadata.uid.clone(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }
}

/// Deserializes `null` as the type's default, the way Go's JSON decoder treats omitempty fields.
fn nullable<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

impl Object {
    /// A new, empty object of the given type.
    pub fn new(api_version: impl Into<String>, kind: impl Into<String>) -> Self {
        Object {
            api_version: api_version.into(),
            kind: kind.into(),
            ..Default::default()
        }
    }

    /// Builder: sets the name.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.metadata.name = name.into();
        self
    }

    /// Builder: sets the namespace.
    pub fn with_namespace(mut self, ns: impl Into<String>) -> Self {
        self.metadata.namespace = ns.into();
        self
    }

    /// Builder: adds a label.
    pub fn with_label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata.labels.insert(key.into(), value.into());
        self
    }

    /// Builder: sets the spec.
    pub fn with_spec(mut self, spec: Value) -> Self {
        self.spec = Some(spec);
        self
    }

    pub fn name(&self) -> &str {
        &self.metadata.name
    }

    pub fn namespace(&self) -> &str {
        &self.metadata.namespace
    }

    pub fn labels(&self) -> &BTreeMap<String, String> {
        &self.metadata.labels
    }

    /// The object's resourceVersion parsed as a store revision, if it has one.
    pub fn revision(&self) -> Option<i64> {
        self.metadata.resource_version.parse().ok()
    }

    /// The API group of `apiVersion` (`""` for the core group).
    pub fn group(&self) -> &str {
        match self.api_version.split_once('/') {
            Some((group, _)) => group,
            None => "",
        }
    }

    /// A top-level field by name, whether typed or kept in `other`.
    pub fn top_level(&self, field: &str) -> Option<Value> {
        match field {
            "apiVersion" => Some(Value::String(self.api_version.clone())),
            "kind" => Some(Value::String(self.kind.clone())),
            "metadata" => serde_json::to_value(&self.metadata).ok(),
            "spec" => self.spec.clone(),
            "status" => self.status.clone(),
            other => self.other.get(other).cloned(),
        }
    }

    /// The string form of the field at a dotted path (`metadata.name`, `spec.nodeName`,
    /// `involvedObject.uid`), as field selectors compare it. Missing fields are `None`.
    pub fn field_string(&self, path: &str) -> Option<String> {
        let mut parts = path.split('.');
        let first = parts.next()?;
        if first == "metadata" {
            let rest: Vec<&str> = parts.collect();
            return match rest.as_slice() {
                ["name"] => Some(self.metadata.name.clone()),
                ["namespace"] => Some(self.metadata.namespace.clone()),
                ["uid"] => Some(self.metadata.uid.clone()),
                ["resourceVersion"] => Some(self.metadata.resource_version.clone()),
                ["generateName"] => Some(self.metadata.generate_name.clone()),
                ["labels", key] => self.metadata.labels.get(*key).cloned(),
                ["annotations", key] => self.metadata.annotations.get(*key).cloned(),
                _ => None,
            };
        }
        let root = match first {
            "apiVersion" => return Some(self.api_version.clone()),
            "kind" => return Some(self.kind.clone()),
            "spec" => self.spec.as_ref()?,
            "status" => self.status.as_ref()?,
            other => self.other.get(other)?,
        };
        let mut cur = root;
        for part in parts {
            cur = cur.as_object()?.get(part)?;
        }
        match cur {
            Value::String(s) => Some(s.clone()),
            Value::Bool(b) => Some(b.to_string()),
            Value::Number(n) => Some(n.to_string()),
            Value::Null => Some(String::new()),
            _ => None,
        }
    }

    /// The whole object as a JSON value.
    pub fn to_value(&self) -> Value {
        // Serializing plain JSON data into a Value cannot fail: every field is a string, a map
        // with string keys, or already a Value.
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// Parses an object from a JSON value.
    pub fn from_value(value: Value) -> Result<Self, serde_json::Error> {
        serde_json::from_value(value)
    }
}

/// The prefix of a stored [`content_digest`] (a digest recorded by earlier versions has none).
pub const CONTENT_DIGEST_PREFIX: &str = "sha256:";

/// A digest of what a user controls in an object (labels, annotations, spec and the other
/// top-level fields; not status, not the server's bookkeeping), stable across builds and
/// toolchains (it is stored): SHA-256 of the canonical JSON (object keys sorted), the first
/// 128 bits in hex, prefixed [`CONTENT_DIGEST_PREFIX`].
pub fn content_digest(o: &Object) -> String {
    use sha2::Digest;
    fn canonical(v: &Value, out: &mut Vec<u8>) {
        match v {
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                out.push(b'{');
                for (i, k) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    // A string serializes whatever it holds.
                    out.extend(serde_json::to_vec(k).unwrap_or_default());
                    out.push(b':');
                    canonical(&m[k], out);
                }
                out.push(b'}');
            }
            Value::Array(a) => {
                out.push(b'[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    canonical(x, out);
                }
                out.push(b']');
            }
            other => out.extend(serde_json::to_vec(other).unwrap_or_default()),
        }
    }
    let doc = serde_json::json!({
        "labels": o.metadata.labels,
        "annotations": o.metadata.annotations,
        "spec": o.spec,
        "other": Value::Object(o.other.clone()),
    });
    let mut bytes = Vec::new();
    canonical(&doc, &mut bytes);
    let d = sha2::Sha256::digest(&bytes);
    let hex: String = d[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("{CONTENT_DIGEST_PREFIX}{hex}")
}

/// A digest of a value's JSON text, for telling in memory whether two values would be
/// written the same (the same text, the same digest); not stable across builds. The text is
/// fed straight into the hasher, never built.
pub fn json_digest<T: Serialize + ?Sized>(v: &T) -> u64 {
    use std::hash::Hasher;
    struct Feed<'a>(&'a mut std::collections::hash_map::DefaultHasher);
    impl std::io::Write for Feed<'_> {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.write(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    // Only a value whose Serialize fails (a map with non-string keys) can fail here; its
    // digest is then of the text written so far, which is still deterministic.
    let _ = serde_json::to_writer(Feed(&mut h), v);
    h.finish()
}

impl Serialize for Object {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        if !self.api_version.is_empty() {
            map.serialize_entry("apiVersion", &self.api_version)?;
        }
        if !self.kind.is_empty() {
            map.serialize_entry("kind", &self.kind)?;
        }
        map.serialize_entry("metadata", &self.metadata)?;
        if let Some(spec) = &self.spec {
            map.serialize_entry("spec", spec)?;
        }
        for (k, v) in &self.other {
            map.serialize_entry(k, v)?;
        }
        if let Some(status) = &self.status {
            map.serialize_entry("status", status)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Object {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ObjectVisitor;
        impl<'de> Visitor<'de> for ObjectVisitor {
            type Value = Object;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a Kubernetes object (a JSON object)")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Object, A::Error> {
                let mut obj = Object::default();
                let mut seen_meta = false;
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "apiVersion" => {
                            obj.api_version =
                                map.next_value::<Option<String>>()?.unwrap_or_default()
                        }
                        "kind" => {
                            obj.kind = map.next_value::<Option<String>>()?.unwrap_or_default()
                        }
                        "metadata" => {
                            if seen_meta {
                                return Err(de::Error::duplicate_field("metadata"));
                            }
                            seen_meta = true;
                            obj.metadata =
                                map.next_value::<Option<ObjectMeta>>()?.unwrap_or_default()
                        }
                        "spec" => obj.spec = map.next_value::<Option<Value>>()?,
                        "status" => obj.status = map.next_value::<Option<Value>>()?,
                        _ => {
                            let v: Value = map.next_value()?;
                            obj.other.insert(key, v);
                        }
                    }
                }
                Ok(obj)
            }
        }
        d.deserialize_map(ObjectVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stored digest of a template's content: the same for the same content whatever the
    /// order of its keys or the build, different for any change to what a user controls, and
    /// blind to status and bookkeeping. Pinned to a value (Python's `json.dumps(doc,
    /// sort_keys=True, separators=(",", ":"))` through SHA-256 gives it too), so a change of
    /// algorithm is seen.
    #[test]
    fn content_digests_are_stable() {
        let a: Object = serde_json::from_value(serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}, "resourceVersion": "7"},
            "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "c", "image": "nginx"}]}}},
            "status": {"readyReplicas": 1}
        }))
        .unwrap();
        let d = content_digest(&a);
        assert_eq!(d, "sha256:7d19d10e76e2afc5b00dc593bd603946");
        let mut b: Object = serde_json::from_value(serde_json::json!({
            "kind": "Deployment", "apiVersion": "apps/v1",
            "spec": {"template": {"spec": {"containers": [{"image": "nginx", "name": "c"}]}}, "replicas": 2},
            "metadata": {"labels": {"app": "web"}, "namespace": "default", "name": "web", "resourceVersion": "9"},
            "status": {"readyReplicas": 2}
        }))
        .unwrap();
        assert_eq!(
            content_digest(&b),
            d,
            "key order, status and version do not count"
        );
        b.spec.as_mut().unwrap()["replicas"] = serde_json::json!(3);
        assert_ne!(content_digest(&b), d);
    }
    use serde_json::json;

    #[test]
    fn round_trip_preserves_unknown_fields() {
        let input = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "cfg", "namespace": "default", "labels": {"a": "b"},
                          "creationTimestamp": null},
            "data": {"k": "v"},
            "binaryData": {"b": "AAE="},
            "immutable": true
        });
        let obj: Object = serde_json::from_value(input.clone()).unwrap();
        assert_eq!(obj.kind, "ConfigMap");
        assert_eq!(obj.metadata.labels["a"], "b");
        assert_eq!(obj.other["data"], json!({"k": "v"}));
        let back = serde_json::to_value(&obj).unwrap();
        let mut expected = input;
        expected["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("creationTimestamp");
        assert_eq!(back, expected);
    }

    #[test]
    fn nulls_are_unset() {
        let obj: Object = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "labels": null, "finalizers": null, "namespace": null},
            "spec": null
        }))
        .unwrap();
        assert!(obj.metadata.labels.is_empty());
        assert!(obj.spec.is_none());
        assert_eq!(obj.metadata.namespace, "");
    }

    #[test]
    fn field_strings() {
        let obj: Object = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": "e1", "namespace": "ns"},
            "involvedObject": {"kind": "Pod", "name": "p", "uid": "u1"},
            "spec": {"nodeName": "n1", "replicas": 3, "paused": false}
        }))
        .unwrap();
        let cases = [
            ("metadata.name", Some("e1")),
            ("metadata.namespace", Some("ns")),
            ("involvedObject.kind", Some("Pod")),
            ("involvedObject.uid", Some("u1")),
            ("spec.nodeName", Some("n1")),
            ("spec.replicas", Some("3")),
            ("spec.paused", Some("false")),
            ("spec.missing", None),
            ("status.phase", None),
        ];
        for (path, want) in cases {
            assert_eq!(obj.field_string(path).as_deref(), want, "{path}");
        }
    }

    #[test]
    fn non_object_is_an_error() {
        assert!(serde_json::from_str::<Object>("[1,2]").is_err());
        assert!(serde_json::from_str::<Object>("\"x\"").is_err());
        assert!(serde_json::from_str::<Object>(r#"{"metadata": 5}"#).is_err());
        assert!(serde_json::from_str::<Object>(r#"{"metadata": {}, "metadata": {}}"#).is_err());
    }

    #[test]
    fn group_of_api_version() {
        assert_eq!(Object::new("apps/v1", "Deployment").group(), "apps");
        assert_eq!(Object::new("v1", "Pod").group(), "");
    }
}
