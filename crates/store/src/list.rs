//! List options, results, and the continue token of paginated lists.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use orrery_api::{Object, fields, labels};
use serde::{Deserialize, Serialize};

use crate::{Revision, StoreError};

/// What to list under a key prefix.
#[derive(Clone, Debug, Default)]
pub struct ListOptions {
    pub labels: labels::Selector,
    pub fields: fields::Selector,
    /// At most this many items (after filtering); `None` or 0 lists everything.
    pub limit: Option<usize>,
    /// Resume a paginated list; the token fixes the revision.
    pub continue_token: Option<String>,
    /// List the state at exactly this revision instead of the latest.
    pub revision: Option<Revision>,
}

impl ListOptions {
    pub fn with_limit(mut self, limit: usize) -> Self {
        self.limit = Some(limit);
        self
    }
    pub fn with_labels(mut self, sel: labels::Selector) -> Self {
        self.labels = sel;
        self
    }
    pub fn with_fields(mut self, sel: fields::Selector) -> Self {
        self.fields = sel;
        self
    }
    pub fn with_continue(mut self, token: impl Into<String>) -> Self {
        self.continue_token = Some(token.into());
        self
    }
    pub fn at_revision(mut self, rev: Revision) -> Self {
        self.revision = Some(rev);
        self
    }

    /// Whether an object passes both selectors.
    pub fn matches(&self, obj: &Object) -> bool {
        self.labels.matches(obj.labels()) && self.fields.matches(obj)
    }

    /// The effective page size.
    pub fn page_limit(&self) -> Option<usize> {
        self.limit.filter(|&l| l > 0)
    }
}

/// One page of a list.
#[derive(Clone, Debug, Default)]
pub struct ListResult {
    pub items: Vec<Object>,
    /// The revision the whole list (all its pages) reflects.
    pub revision: Revision,
    /// Present when more items may follow.
    pub continue_token: Option<String>,
}

/// A listed object as stored JSON, with its `metadata.resourceVersion` in place.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RawObject {
    pub revision: Revision,
    pub json: Vec<u8>,
}

/// One page of a list, as stored JSON (for serving lists without parsing every object).
#[derive(Clone, Debug, Default)]
pub struct RawListResult {
    pub items: Vec<RawObject>,
    pub revision: Revision,
    pub continue_token: Option<String>,
}

/// Stored JSON (written without a resourceVersion) with `metadata.resourceVersion` set to
/// `revision`. Objects are serialized with `metadata` right after `apiVersion` and `kind`, so
/// its first occurrence is the object's own; anything else is parsed and rewritten.
pub fn with_resource_version(stored: &[u8], revision: Revision) -> Vec<u8> {
    const META: &[u8] = b"\"metadata\":{";
    let head = &stored[..stored.len().min(512)];
    if let Some(i) = head.windows(META.len()).position(|w| w == META) {
        let at = i + META.len();
        let rv = format!("\"resourceVersion\":\"{revision}\"");
        let mut out = Vec::with_capacity(stored.len() + rv.len() + 1);
        out.extend_from_slice(&stored[..at]);
        out.extend_from_slice(rv.as_bytes());
        if stored.get(at) != Some(&b'}') {
            out.push(b',');
        }
        out.extend_from_slice(&stored[at..]);
        return out;
    }
    match serde_json::from_slice::<Object>(stored) {
        Ok(mut o) => {
            o.metadata.resource_version = revision.to_string();
            serde_json::to_vec(&o).unwrap_or_default()
        }
        Err(_) => stored.to_vec(),
    }
}

/// The continue token, in the same shape the Kubernetes API server uses, so that clients that
/// peek into it (none should) see what they expect.
#[derive(Debug, Serialize, Deserialize)]
struct ContinueToken {
    v: String,
    rv: Revision,
    /// The key to start at, relative to the list prefix.
    start: String,
}

const TOKEN_VERSION: &str = "meta.k8s.io/v1";

/// Encodes where the next page starts: strictly after `last_key`, at `revision`.
pub fn encode_continue(prefix: &str, last_key: &str, revision: Revision) -> String {
    let rel = last_key.strip_prefix(prefix).unwrap_or(last_key);
    let token = ContinueToken {
        v: TOKEN_VERSION.into(),
        rv: revision,
        start: format!("{rel}\u{0}"),
    };
    // Serializing a struct of strings and an integer cannot fail.
    let json = serde_json::to_vec(&token).unwrap_or_default();
    URL_SAFE_NO_PAD.encode(json)
}

/// Decodes a continue token into (absolute start key, revision).
pub fn decode_continue(prefix: &str, token: &str) -> Result<(String, Revision), StoreError> {
    let bad = |why: &str| StoreError::InvalidContinue(why.to_string());
    let bytes = URL_SAFE_NO_PAD
        .decode(token.trim_end_matches('='))
        .map_err(|_| bad("not base64"))?;
    let t: ContinueToken =
        serde_json::from_slice(&bytes).map_err(|_| bad("not a continue token"))?;
    if t.v != TOKEN_VERSION {
        return Err(bad("unknown version"));
    }
    if t.rv <= 0 {
        return Err(bad("invalid resource version"));
    }
    // The start key must stay inside the listed prefix.
    if t.start.is_empty() || t.start.starts_with('/') || t.start.split('/').any(|s| s == "..") {
        return Err(bad("invalid start key"));
    }
    Ok((format!("{prefix}{}", t.start), t.rv))
}

/// The smallest key greater than every key with this prefix (the end of a prefix range).
pub fn prefix_end(prefix: &str) -> Option<String> {
    let mut bytes = prefix.as_bytes().to_vec();
    while let Some(last) = bytes.pop() {
        if last < 0x7f {
            bytes.push(last + 1);
            return String::from_utf8(bytes).ok();
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_round_trip() {
        let t = encode_continue("/registry/pods/", "/registry/pods/ns/a", 42);
        let (start, rv) = decode_continue("/registry/pods/", &t).unwrap();
        assert_eq!(start, "/registry/pods/ns/a\u{0}");
        assert_eq!(rv, 42);
    }

    #[test]
    fn continue_rejects_garbage() {
        let escape =
            URL_SAFE_NO_PAD.encode(br#"{"v":"meta.k8s.io/v1","rv":3,"start":"../secrets/x"}"#);
        let absolute = URL_SAFE_NO_PAD.encode(br#"{"v":"meta.k8s.io/v1","rv":3,"start":"/x"}"#);
        let zero = URL_SAFE_NO_PAD.encode(br#"{"v":"meta.k8s.io/v1","rv":0,"start":"x"}"#);
        for bad in [
            "",
            "!!!",
            "e30",
            escape.as_str(),
            absolute.as_str(),
            zero.as_str(),
        ] {
            assert!(decode_continue("/p/", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn resource_versions_are_spliced_in() {
        let mut o = Object::new("v1", "ConfigMap")
            .with_name("a")
            .with_label("x", "y");
        o.other
            .insert("data".into(), serde_json::json!({"metadata": {"x": 1}}));
        let stored = serde_json::to_vec(&o).unwrap();
        let out: Object = serde_json::from_slice(&with_resource_version(&stored, 42)).unwrap();
        o.metadata.resource_version = "42".into();
        assert_eq!(out, o);
        let empty = br#"{"apiVersion":"v1","kind":"X","metadata":{}}"#;
        let out: serde_json::Value =
            serde_json::from_slice(&with_resource_version(empty, 7)).unwrap();
        assert_eq!(out["metadata"], serde_json::json!({"resourceVersion": "7"}));
        let odd = br#"{"metadata": {"name": "spaced"}}"#;
        let out: serde_json::Value =
            serde_json::from_slice(&with_resource_version(odd, 9)).unwrap();
        assert_eq!(out["metadata"]["resourceVersion"], "9");
    }

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_end("/a/").as_deref(), Some("/a0"));
        assert_eq!(prefix_end("").as_deref(), None);
    }
}
