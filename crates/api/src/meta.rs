//! What many kinds' modules share: strict decoding with field paths, short hashes for
//! names, where built-in kinds keep their pod spec, resource lists and workload health. Kept
//! apart so that the kinds' modules depend on it, not on each other (each is re-exported
//! where it was first defined).

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::quantity::Quantity;
use crate::validation::FieldError;

/// Resource amounts by resource name (`cpu`, `memory`, `nvidia.com/gpu`, `pods`...).
pub type ResourceList = BTreeMap<String, Quantity>;

/// Decodes `value` strictly as `T`; an error names the offending field under `base`.
pub fn decode<T: DeserializeOwned>(value: &Value, base: &str) -> Result<T, FieldError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." || path.is_empty() {
            base.to_string()
        } else {
            format!("{base}.{path}")
        };
        let inner = e.into_inner().to_string();
        // serde names the unknown field itself; put it in the path as Kubernetes does.
        if let Some(rest) = inner.strip_prefix("unknown field `") {
            let name = rest.split('`').next().unwrap_or("");
            let expected = rest.split_once(", expected ").map(|x| x.1).unwrap_or("");
            return FieldError::invalid(
                field,
                name,
                format!("unknown or unsupported field; known fields: {expected}"),
            );
        }
        FieldError::invalid(field, "", inner)
    })
}

/// The first ten hex digits of a string's SHA-256: a short, stable suffix for names.
pub fn short_hash(s: &str) -> String {
    crate::token::ca_hash(s)[..10].to_string()
}

/// Where a kind keeps its pod spec (JSON pointer), for the built-in workload kinds.
pub fn pod_spec_pointer(kind: &str) -> Option<&'static str> {
    match kind {
        "Deployment" | "StatefulSet" | "ReplicaSet" | "DaemonSet" | "Job" => {
            Some("/spec/template/spec")
        }
        "CronJob" => Some("/spec/jobTemplate/spec/template/spec"),
        "Pod" => Some("/spec"),
        _ => None,
    }
}

/// How a workload is doing in its member.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum Health {
    Healthy,
    /// Still starting or rolling out.
    Progressing,
    Unhealthy,
    #[default]
    Unknown,
}

/// The own kinds served at more than one version, as (group, kind, storage version, the
/// others), in [`crate::kinds::OWN`]'s order: an object written at one reads the same at the
/// others. Kept here, not read from the descriptors, because the modules the descriptors are
/// made of ask it too (a policy's selector); a test holds the two equal.
pub const SERVED_AT_SEVERAL_VERSIONS: &[(&str, &str, &str, &[&str])] = &[
    (
        crate::services::GROUP,
        crate::services::EXPORT_KIND,
        crate::services::VERSION,
        &[crate::services::VERSION_V1ALPHA1],
    ),
    (
        crate::services::GROUP,
        crate::services::IMPORT_KIND,
        crate::services::VERSION,
        &[crate::services::VERSION_V1ALPHA1],
    ),
    ("about.k8s.io", "ClusterProperty", "v1beta1", &["v1alpha1"]),
];

/// Whether apiVersions `a` and `b` name the same schema of `kind`: equal, or two versions one
/// own kind serves (an object written at one is stored at, and reads the same at, the other).
pub fn same_schema(kind: &str, a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    let (Some((ga, va)), Some((gb, vb))) = (a.split_once('/'), b.split_once('/')) else {
        return false;
    };
    ga == gb
        && SERVED_AT_SEVERAL_VERSIONS
            .iter()
            .any(|(g, k, storage, also)| {
                let serves = |v: &str| v == *storage || also.contains(&v);
                *g == ga && *k == kind && serves(va) && serves(vb)
            })
}
