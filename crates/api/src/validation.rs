//! Name, label and metadata validation with Kubernetes' rules and messages
//! (`k8s.io/apimachinery/pkg/util/validation`).

use std::fmt;

use serde::Serialize;

use crate::object::ObjectMeta;

pub const DNS1123_LABEL_MAX: usize = 63;
pub const DNS1123_SUBDOMAIN_MAX: usize = 253;
pub const LABEL_VALUE_MAX: usize = 63;
pub const QUALIFIED_NAME_MAX: usize = 63;
/// The total size of all annotations of one object.
pub const ANNOTATIONS_MAX_BYTES: usize = 256 * 1024;

/// What kind of field error (`field.ErrorType`), with the reason string the API reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum ErrorType {
    #[serde(rename = "FieldValueRequired")]
    Required,
    #[serde(rename = "FieldValueInvalid")]
    Invalid,
    #[serde(rename = "FieldValueNotSupported")]
    NotSupported,
    #[serde(rename = "FieldValueDuplicate")]
    Duplicate,
    #[serde(rename = "FieldValueTooLong")]
    TooLong,
    #[serde(rename = "FieldValueForbidden")]
    Forbidden,
    /// The value has the wrong JSON type.
    #[serde(rename = "FieldValueTypeInvalid")]
    TypeInvalid,
    /// A field the schema does not declare (reported with the `FieldValueInvalid` cause type,
    /// the closest Kubernetes has).
    #[serde(rename = "FieldValueInvalid")]
    Unknown,
}

impl ErrorType {
    pub fn reason(&self) -> &'static str {
        match self {
            ErrorType::Required => "FieldValueRequired",
            ErrorType::Invalid => "FieldValueInvalid",
            ErrorType::NotSupported => "FieldValueNotSupported",
            ErrorType::Duplicate => "FieldValueDuplicate",
            ErrorType::TooLong => "FieldValueTooLong",
            ErrorType::Forbidden => "FieldValueForbidden",
            ErrorType::TypeInvalid => "FieldValueTypeInvalid",
            ErrorType::Unknown => "FieldValueInvalid",
        }
    }
}

/// One invalid field: its path (`metadata.labels`), what is wrong, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    pub kind: ErrorType,
    pub field: String,
    /// The offending value, rendered for the message (empty when not shown).
    pub value: String,
    pub detail: String,
}

impl FieldError {
    pub fn required(field: impl Into<String>, detail: impl Into<String>) -> Self {
        FieldError {
            kind: ErrorType::Required,
            field: field.into(),
            value: String::new(),
            detail: detail.into(),
        }
    }
    pub fn invalid(
        field: impl Into<String>,
        value: impl fmt::Display,
        detail: impl Into<String>,
    ) -> Self {
        FieldError {
            kind: ErrorType::Invalid,
            field: field.into(),
            value: value.to_string(),
            detail: detail.into(),
        }
    }
    pub fn not_supported(
        field: impl Into<String>,
        value: impl fmt::Display,
        supported: &[&str],
    ) -> Self {
        let list = supported
            .iter()
            .map(|s| format!("\"{s}\""))
            .collect::<Vec<_>>()
            .join(", ");
        FieldError {
            kind: ErrorType::NotSupported,
            field: field.into(),
            value: value.to_string(),
            detail: format!("supported values: {list}"),
        }
    }
    pub fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> Self {
        FieldError {
            kind: ErrorType::Forbidden,
            field: field.into(),
            value: String::new(),
            detail: detail.into(),
        }
    }
    pub fn duplicate(field: impl Into<String>, value: impl fmt::Display) -> Self {
        FieldError {
            kind: ErrorType::Duplicate,
            field: field.into(),
            value: value.to_string(),
            detail: String::new(),
        }
    }
    pub fn type_invalid(
        field: impl Into<String>,
        value: impl fmt::Display,
        expected: &str,
    ) -> Self {
        FieldError {
            kind: ErrorType::TypeInvalid,
            field: field.into(),
            value: value.to_string(),
            detail: format!("must be of type {expected}"),
        }
    }
    pub fn unknown(field: impl Into<String>) -> Self {
        FieldError {
            kind: ErrorType::Unknown,
            field: field.into(),
            value: String::new(),
            detail: String::new(),
        }
    }
    pub fn too_long(field: impl Into<String>, max: usize) -> Self {
        FieldError {
            kind: ErrorType::TooLong,
            field: field.into(),
            value: String::new(),
            detail: format!("must have at most {max} bytes"),
        }
    }
}

impl FieldError {
    /// The message without the field path (what a `StatusCause` carries; clients print the
    /// field themselves).
    pub fn body(&self) -> String {
        let full = self.to_string();
        full.strip_prefix(&format!("{}: ", self.field))
            .map(str::to_string)
            .unwrap_or(full)
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The same shape as Go's field.Error.Error().
        match self.kind {
            ErrorType::Required => write!(f, "{}: Required value", self.field)?,
            ErrorType::Forbidden => write!(f, "{}: Forbidden", self.field)?,
            ErrorType::TooLong => write!(f, "{}: Too long", self.field)?,
            ErrorType::Invalid => write!(f, "{}: Invalid value: \"{}\"", self.field, self.value)?,
            ErrorType::NotSupported => {
                write!(f, "{}: Unsupported value: \"{}\"", self.field, self.value)?
            }
            ErrorType::Duplicate => {
                write!(f, "{}: Duplicate value: \"{}\"", self.field, self.value)?
            }
            ErrorType::TypeInvalid => write!(f, "{}: Invalid value: {}", self.field, self.value)?,
            ErrorType::Unknown => write!(f, "{}: unknown field \"{}\"", self.field, self.field)?,
        }
        if !self.detail.is_empty() {
            write!(f, ": {}", self.detail)?;
        }
        Ok(())
    }
}

/// A list of field errors; empty means valid.
pub type ErrorList = Vec<FieldError>;

fn is_alnum_lower(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

fn dns1123_label_chars(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && is_alnum_lower(b[0])
        && is_alnum_lower(b[b.len() - 1])
        && b.iter().all(|&c| is_alnum_lower(c) || c == b'-')
}

const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const DNS1035_LABEL_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";
const QUALIFIED_NAME_MSG: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

/// RFC 1123 label (namespace names, most name parts): `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, ≤ 63.
pub fn is_dns1123_label(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > DNS1123_LABEL_MAX {
        errs.push(format!(
            "must be no more than {DNS1123_LABEL_MAX} characters"
        ));
    }
    if !dns1123_label_chars(s) {
        errs.push(DNS1123_LABEL_MSG.to_string());
    }
    errs
}

/// RFC 1123 subdomain (most object names): dot-separated labels, ≤ 253.
pub fn is_dns1123_subdomain(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > DNS1123_SUBDOMAIN_MAX {
        errs.push(format!(
            "must be no more than {DNS1123_SUBDOMAIN_MAX} characters"
        ));
    }
    if s.is_empty() || !s.split('.').all(dns1123_label_chars) {
        errs.push(DNS1123_SUBDOMAIN_MSG.to_string());
    }
    errs
}

/// RFC 1035 label (Service names): starts with a letter.
pub fn is_dns1035_label(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > DNS1123_LABEL_MAX {
        errs.push(format!(
            "must be no more than {DNS1123_LABEL_MAX} characters"
        ));
    }
    if !dns1123_label_chars(s) || !s.as_bytes()[0].is_ascii_lowercase() {
        errs.push(DNS1035_LABEL_MSG.to_string());
    }
    errs
}

fn qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'.')
}

/// A qualified name (label and annotation keys, finalizers): `[prefix/]name`, where prefix is a
/// DNS subdomain and name is ≤ 63 alphanumerics, `-`, `_`, `.`.
pub fn is_qualified_name(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            errs.push("prefix part must be non-empty".to_string());
        } else {
            errs.extend(
                is_dns1123_subdomain(prefix)
                    .into_iter()
                    .map(|m| format!("prefix part {m}")),
            );
        }
        if name.contains('/') {
            errs.push(format!("a qualified name {QUALIFIED_NAME_MSG} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"));
            return errs;
        }
    }
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else {
        if name.len() > QUALIFIED_NAME_MAX {
            errs.push(format!(
                "name part must be no more than {QUALIFIED_NAME_MAX} characters"
            ));
        }
        if !qualified_name_part(name) {
            errs.push(QUALIFIED_NAME_MSG.to_string());
        }
    }
    errs
}

/// A label value: empty, or ≤ 63 alphanumerics, `-`, `_`, `.` starting and ending alphanumeric.
pub fn is_valid_label_value(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > LABEL_VALUE_MAX {
        errs.push(format!("must be no more than {LABEL_VALUE_MAX} characters"));
    }
    if !s.is_empty() && !qualified_name_part(s) {
        errs.push(LABEL_VALUE_MSG.to_string());
    }
    errs
}

/// Names used as a path segment may not be `.`/`..` or contain `/` or `%`.
pub fn is_valid_path_segment_name(s: &str) -> Vec<String> {
    if s == "." || s == ".." {
        return vec![format!("may not be '{s}'")];
    }
    let mut errs = Vec::new();
    for c in ['/', '%'] {
        if s.contains(c) {
            errs.push(format!("may not contain '{c}'"));
        }
    }
    errs
}

/// Which rule an object's name follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameRule {
    /// Most kinds.
    Subdomain,
    /// Namespaces and a few others.
    Label,
    /// Services.
    Dns1035,
    /// Kinds with free-form names (still a valid path segment).
    PathSegment,
}

impl NameRule {
    pub fn check(&self, name: &str) -> Vec<String> {
        let mut errs = is_valid_path_segment_name(name);
        if !errs.is_empty() {
            return errs;
        }
        errs = match self {
            NameRule::Subdomain => is_dns1123_subdomain(name),
            NameRule::Label => is_dns1123_label(name),
            NameRule::Dns1035 => is_dns1035_label(name),
            NameRule::PathSegment => Vec::new(),
        };
        errs
    }
}

/// Checks labels: keys are qualified names, values are label values.
pub fn validate_labels<'a>(
    labels: impl IntoIterator<Item = (&'a String, &'a String)>,
    path: &str,
) -> ErrorList {
    let mut errs = ErrorList::new();
    for (k, v) in labels {
        for m in is_qualified_name(k) {
            errs.push(FieldError::invalid(path, k, m));
        }
        for m in is_valid_label_value(v) {
            errs.push(FieldError::invalid(format!("{path}[{k}]"), v, m));
        }
    }
    errs
}

/// Validates standard metadata for create and update. `namespaced` says whether the kind lives
/// in a namespace; `rule` is the kind's name rule.
pub fn validate_object_meta(meta: &ObjectMeta, namespaced: bool, rule: NameRule) -> ErrorList {
    let mut errs = ErrorList::new();
    if meta.name.is_empty() {
        if meta.generate_name.is_empty() {
            errs.push(FieldError::required(
                "metadata.name",
                "name or generateName is required",
            ));
        }
    } else {
        for m in rule.check(&meta.name) {
            errs.push(FieldError::invalid("metadata.name", &meta.name, m));
        }
    }
    if !meta.generate_name.is_empty() {
        // The generated suffix is 5 characters; the prefix must leave room for it and be a
        // valid name start.
        let probe = format!("{}abcde", meta.generate_name);
        for m in rule.check(&probe) {
            errs.push(FieldError::invalid(
                "metadata.generateName",
                &meta.generate_name,
                m,
            ));
        }
    }
    if namespaced {
        if meta.namespace.is_empty() {
            errs.push(FieldError::required("metadata.namespace", ""));
        } else {
            for m in is_dns1123_label(&meta.namespace) {
                errs.push(FieldError::invalid(
                    "metadata.namespace",
                    &meta.namespace,
                    m,
                ));
            }
        }
    } else if !meta.namespace.is_empty() {
        errs.push(FieldError::forbidden(
            "metadata.namespace",
            "not allowed on this type",
        ));
    }
    errs.extend(validate_labels(&meta.labels, "metadata.labels"));
    let mut total = 0usize;
    for (k, v) in &meta.annotations {
        for m in is_qualified_name(&k.to_lowercase()) {
            errs.push(FieldError::invalid("metadata.annotations", k, m));
        }
        total += k.len() + v.len();
    }
    if total > ANNOTATIONS_MAX_BYTES {
        errs.push(FieldError::too_long(
            "metadata.annotations",
            ANNOTATIONS_MAX_BYTES,
        ));
    }
    for (i, f) in meta.finalizers.iter().enumerate() {
        for m in is_qualified_name(f) {
            errs.push(FieldError::invalid(
                format!("metadata.finalizers[{i}]"),
                f,
                m,
            ));
        }
    }
    let mut controllers = 0;
    for (i, r) in meta.owner_references.iter().enumerate() {
        let p = format!("metadata.ownerReferences[{i}]");
        if r.api_version.is_empty() {
            errs.push(FieldError::invalid(
                format!("{p}.apiVersion"),
                "",
                "version must not be empty",
            ));
        }
        if r.kind.is_empty() {
            errs.push(FieldError::invalid(
                format!("{p}.kind"),
                "",
                "kind must not be empty",
            ));
        }
        if r.name.is_empty() {
            errs.push(FieldError::invalid(
                format!("{p}.name"),
                "",
                "name must not be empty",
            ));
        }
        if r.uid.is_empty() {
            errs.push(FieldError::invalid(
                format!("{p}.uid"),
                "",
                "uid must not be empty",
            ));
        }
        if r.controller == Some(true) {
            controllers += 1;
        }
    }
    if controllers > 1 {
        errs.push(FieldError::invalid(
            "metadata.ownerReferences",
            controllers,
            "Only one reference can have Controller set to true",
        ));
    }
    if let Some(g) = meta.generation
        && g < 0
    {
        errs.push(FieldError::invalid(
            "metadata.generation",
            g,
            "must be greater than or equal to 0",
        ));
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_names() {
        let ok = ["a", "abc", "a-b", "a1", "1a", "my-name", "0"];
        let bad = ["", "A", "-a", "a-", "a_b", "a.b", "a b", &"a".repeat(64)];
        for s in ok {
            assert!(is_dns1123_label(s).is_empty(), "{s}");
        }
        for s in bad {
            assert!(!is_dns1123_label(s).is_empty(), "{s}");
        }
        let ok_sub = [
            "a.b",
            "example.com",
            "a-b.c-d",
            "a",
            &format!("{}.{}", "a".repeat(63), "b".repeat(63)),
        ];
        let bad_sub = ["", "a..b", ".a", "a.", "A.b", "a_b", &"a".repeat(254)];
        for s in ok_sub {
            assert!(is_dns1123_subdomain(s).is_empty(), "{s}");
        }
        for s in bad_sub {
            assert!(!is_dns1123_subdomain(s).is_empty(), "{s}");
        }
        assert!(is_dns1035_label("web").is_empty());
        assert!(!is_dns1035_label("1web").is_empty());
    }

    #[test]
    fn qualified_names_and_label_values() {
        let ok = [
            "a",
            "A",
            "a.b",
            "a_b",
            "example.com/name",
            "k8s.io/x-Y_z.1",
            "topology.datum.net/city-code",
        ];
        let bad = [
            "",
            "/a",
            "a/",
            "-a",
            "a-",
            "Example.com/a",
            "a/b/c",
            &"a".repeat(64),
            "a b",
        ];
        for s in ok {
            assert!(
                is_qualified_name(s).is_empty(),
                "{s}: {:?}",
                is_qualified_name(s)
            );
        }
        for s in bad {
            assert!(!is_qualified_name(s).is_empty(), "{s}");
        }
        for s in ["", "a", "A-b_c.d", "123"] {
            assert!(is_valid_label_value(s).is_empty(), "{s}");
        }
        for s in ["-a", "a-", "a/b", "a b", &"a".repeat(64)] {
            assert!(!is_valid_label_value(s).is_empty(), "{s}");
        }
    }

    #[test]
    fn object_meta() {
        let mut meta = ObjectMeta {
            name: "web".into(),
            namespace: "default".into(),
            ..Default::default()
        };
        assert!(validate_object_meta(&meta, true, NameRule::Subdomain).is_empty());
        let errs = validate_object_meta(&meta, false, NameRule::Subdomain);
        assert_eq!(errs[0].field, "metadata.namespace");
        assert_eq!(errs[0].kind, ErrorType::Forbidden);

        meta.name = "Web".into();
        meta.labels.insert("bad key!".into(), "v".into());
        meta.labels.insert("ok".into(), "-bad".into());
        let errs = validate_object_meta(&meta, true, NameRule::Subdomain);
        let fields: Vec<_> = errs.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            ["metadata.name", "metadata.labels", "metadata.labels[ok]"]
        );
        assert!(
            errs[0].to_string().starts_with(
                "metadata.name: Invalid value: \"Web\": a lowercase RFC 1123 subdomain"
            )
        );

        let meta = ObjectMeta {
            generate_name: "web-".into(),
            namespace: "ns".into(),
            ..Default::default()
        };
        assert!(validate_object_meta(&meta, true, NameRule::Subdomain).is_empty());
        let meta = ObjectMeta {
            namespace: "ns".into(),
            ..Default::default()
        };
        assert_eq!(
            validate_object_meta(&meta, true, NameRule::Subdomain)[0].kind,
            ErrorType::Required
        );
        let meta = ObjectMeta {
            name: "..".into(),
            ..Default::default()
        };
        assert!(!validate_object_meta(&meta, false, NameRule::PathSegment).is_empty());
    }
}
