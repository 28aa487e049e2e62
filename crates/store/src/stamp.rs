//! What the server writes into an object's metadata, in one place for the API server and the
//! controllers alike: a new object's uid, creation time and first generation, and the
//! generation a new version gets.

use orrery_api::{Object, ObjectMeta, Time};

/// A new uid.
pub fn new_uid() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// Stamps a new object's metadata: a fresh uid, the creation time, generation 1, and nothing
/// of a previous life (deletion marks, server-written fields).
pub fn stamp_new(meta: &mut ObjectMeta) {
    meta.uid = new_uid();
    meta.creation_timestamp = Some(Time::now());
    meta.generation = Some(1);
    meta.deletion_timestamp = None;
    meta.deletion_grace_period_seconds = None;
    meta.resource_version.clear();
    meta.self_link.clear();
}

/// A fresh object with the metadata the API server would give it.
pub fn new_object(api_version: &str, kind: &str, namespace: Option<&str>, name: &str) -> Object {
    let mut o = Object::new(api_version, kind).with_name(name);
    if let Some(ns) = namespace {
        o.metadata.namespace = ns.to_string();
    }
    stamp_new(&mut o.metadata);
    o
}

/// The generation of `next`, the version replacing `current`: one more when what users
/// control (the spec and the other top-level fields besides status) changed.
pub fn next_generation(current: &Object, next: &Object) -> i64 {
    let generation = current.metadata.generation.unwrap_or(1);
    if current.spec != next.spec || current.other != next.other {
        generation + 1
    } else {
        generation
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_objects_and_generations() {
        let a = new_object("v1", "ConfigMap", Some("ns"), "a");
        let b = new_object("v1", "ConfigMap", None, "b");
        assert!(!a.metadata.uid.is_empty() && a.metadata.uid != b.metadata.uid);
        assert_eq!((a.metadata.generation, a.namespace()), (Some(1), "ns"));
        assert!(a.metadata.creation_timestamp.is_some());
        let mut next = a.clone();
        next.metadata.labels.insert("x".into(), "y".into());
        next.status = Some(serde_json::json!({"phase": "Active"}));
        assert_eq!(
            next_generation(&a, &next),
            1,
            "metadata and status are not the spec"
        );
        next.spec = Some(serde_json::json!({"replicas": 2}));
        assert_eq!(next_generation(&a, &next), 2);
        let mut other = a.clone();
        other
            .other
            .insert("data".into(), serde_json::json!({"k": "v"}));
        assert_eq!(next_generation(&a, &other), 2, "a ConfigMap's data counts");
    }
}
