//! The store's key layout, below both the kinds' descriptors and the well-known keys built
//! from them (see [`crate::keys`]).
//!
//! `/registry/<group or "core">/<plural>/<namespace>/<name>` for namespaced kinds,
//! `/registry/<group or "core">/<plural>/<name>` for cluster-scoped ones.

fn group_segment(group: &str) -> &str {
    if group.is_empty() { "core" } else { group }
}

/// The key of one object (`namespace` is `None` for cluster-scoped kinds).
pub fn object(group: &str, plural: &str, namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(ns) => format!("/registry/{}/{plural}/{ns}/{name}", group_segment(group)),
        None => format!("/registry/{}/{plural}/{name}", group_segment(group)),
    }
}

/// The prefix of a list: one namespace's objects, or all of the kind.
pub fn prefix(group: &str, plural: &str, namespace: Option<&str>) -> String {
    match namespace {
        Some(ns) => format!("/registry/{}/{plural}/{ns}/", group_segment(group)),
        None => format!("/registry/{}/{plural}/", group_segment(group)),
    }
}
