//! OpenAPI schemas of everything served, in one place: they are published at `/openapi/v3`,
//! drive unknown-field detection and type checks at admission, and carry the strategic merge
//! patch tags that both kubectl (computing a patch) and this server (applying it) read, so the
//! two always agree on how each list merges.
//!
//! - Built-in kinds: generated from `k8s-openapi` (the upstream API definitions) with
//!   `schemars`, then annotated with the upstream patch tags of [`patch_tags::PATCH_TAGS`].
//! - CustomResourceDefinitions: their `openAPIV3Schema`, with standard metadata added.
//! - Orrery's own kinds ([`own`]): generated from the Rust types users' objects are read with
//!   ([`generated`]), or written out.

use parking_lot::RwLock;
use std::sync::{Arc, OnceLock};

use serde_json::{Map, Value, json};

mod generated;
mod own;
pub mod patch_tags;
pub mod validate;

use crate::resources::ResourceType;

use orrery_api::kinds::openapi::gvk;
pub use orrery_api::kinds::openapi::{OBJECT_META, QUANTITY, reference};
pub const LIST_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta";
pub const PATCH_COMPONENT: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Patch";
pub const STATUS: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Status";
pub const DELETE_OPTIONS: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions";
pub const SCALE: &str = "io.k8s.api.autoscaling.v1.Scale";

/// Component schemas, by name.
pub type Components = Map<String, Value>;

/// The name a `$ref` points at.
pub fn ref_name(r: &str) -> &str {
    r.rsplit('/').next().unwrap_or(r)
}

/// Built-in kinds and their group/version, for schema generation: a data table.
fn builtin_components() -> Components {
    use k8s_openapi::api::{apps, batch, coordination, core, networking, rbac};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1 as apiext;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;

    let mut generator = schemars::generate::SchemaSettings::openapi3().into_generator();
    let mut kinds: Vec<(&str, &str, &str, String)> = Vec::new();
    macro_rules! kind {
        ($ty:ty, $group:expr, $version:expr, $kind:expr) => {{
            generator.subschema_for::<$ty>();
            kinds.push((
                $group,
                $version,
                $kind,
                <$ty as schemars::JsonSchema>::schema_name().into_owned(),
            ));
        }};
    }
    kind!(core::v1::Namespace, "", "v1", "Namespace");
    kind!(core::v1::ConfigMap, "", "v1", "ConfigMap");
    kind!(core::v1::Secret, "", "v1", "Secret");
    kind!(core::v1::Service, "", "v1", "Service");
    kind!(core::v1::ServiceAccount, "", "v1", "ServiceAccount");
    kind!(
        core::v1::PersistentVolumeClaim,
        "",
        "v1",
        "PersistentVolumeClaim"
    );
    kind!(core::v1::Event, "", "v1", "Event");
    kind!(core::v1::Pod, "", "v1", "Pod");
    kind!(core::v1::Node, "", "v1", "Node");
    kind!(apps::v1::Deployment, "apps", "v1", "Deployment");
    kind!(apps::v1::StatefulSet, "apps", "v1", "StatefulSet");
    kind!(apps::v1::DaemonSet, "apps", "v1", "DaemonSet");
    kind!(apps::v1::ReplicaSet, "apps", "v1", "ReplicaSet");
    kind!(
        apps::v1::ControllerRevision,
        "apps",
        "v1",
        "ControllerRevision"
    );
    kind!(batch::v1::Job, "batch", "v1", "Job");
    kind!(batch::v1::CronJob, "batch", "v1", "CronJob");
    kind!(
        networking::v1::Ingress,
        "networking.k8s.io",
        "v1",
        "Ingress"
    );
    kind!(
        k8s_openapi::api::policy::v1::PodDisruptionBudget,
        "policy",
        "v1",
        "PodDisruptionBudget"
    );
    kind!(
        k8s_openapi::api::scheduling::v1::PriorityClass,
        "scheduling.k8s.io",
        "v1",
        "PriorityClass"
    );
    kind!(
        k8s_openapi::api::discovery::v1::EndpointSlice,
        "discovery.k8s.io",
        "v1",
        "EndpointSlice"
    );
    kind!(
        coordination::v1::Lease,
        "coordination.k8s.io",
        "v1",
        "Lease"
    );
    kind!(
        rbac::v1::ClusterRole,
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRole"
    );
    kind!(
        rbac::v1::ClusterRoleBinding,
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRoleBinding"
    );
    kind!(rbac::v1::Role, "rbac.authorization.k8s.io", "v1", "Role");
    kind!(
        rbac::v1::RoleBinding,
        "rbac.authorization.k8s.io",
        "v1",
        "RoleBinding"
    );
    // The ServiceAccount token subresource (`kubectl create token`).
    kind!(
        k8s_openapi::api::authentication::v1::TokenRequest,
        "authentication.k8s.io",
        "v1",
        "TokenRequest"
    );
    kind!(
        apiext::CustomResourceDefinition,
        "apiextensions.k8s.io",
        "v1",
        "CustomResourceDefinition"
    );
    kind!(
        k8s_openapi::api::autoscaling::v1::Scale,
        "autoscaling",
        "v1",
        "Scale"
    );
    // The reviews (create only, never stored: reviews.rs); their schemas let protobuf bodies
    // be decoded and `kubectl explain` describe them.
    kind!(
        k8s_openapi::api::authentication::v1::SelfSubjectReview,
        "authentication.k8s.io",
        "v1",
        "SelfSubjectReview"
    );
    kind!(
        k8s_openapi::api::authorization::v1::SelfSubjectAccessReview,
        "authorization.k8s.io",
        "v1",
        "SelfSubjectAccessReview"
    );
    kind!(
        k8s_openapi::api::authorization::v1::SelfSubjectRulesReview,
        "authorization.k8s.io",
        "v1",
        "SelfSubjectRulesReview"
    );
    kind!(
        k8s_openapi::api::authorization::v1::SubjectAccessReview,
        "authorization.k8s.io",
        "v1",
        "SubjectAccessReview"
    );
    kind!(meta::Status, "", "v1", "Status");
    kind!(meta::DeleteOptions, "", "v1", "DeleteOptions");
    kind!(meta::APIResourceList, "", "v1", "APIResourceList");
    generator.subschema_for::<meta::ListMeta>();

    let mut components = generator.take_definitions(true);
    for (group, version, kind, name) in kinds {
        if let Some(Value::Object(schema)) = components.get_mut(&name) {
            schema.insert(
                "x-kubernetes-group-version-kind".into(),
                gvk(group, version, kind),
            );
        }
    }
    // `JSON` holds any JSON value (CRD defaults, enums, examples), not only objects.
    components.insert(
        "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.JSON".into(),
        json!({
            "description": "JSON represents any valid JSON value.",
            "x-kubernetes-preserve-unknown-fields": true,
        }),
    );
    // Field sets (managedFields) are opaque to validation, as they are to Kubernetes.
    components.insert(
        "io.k8s.apimachinery.pkg.apis.meta.v1.FieldsV1".into(),
        json!({
            "description": "FieldsV1 stores a set of fields in a data structure like a Trie, in JSON format.",
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": true,
        }),
    );
    components.insert(
        PATCH_COMPONENT.into(),
        json!({
            "description": "Patch is provided to give a concrete name and type to the Kubernetes PATCH request body.",
            "type": "object",
        }),
    );
    patch_tags::annotate(&mut components);
    components
}

static BUILTIN: OnceLock<Arc<Components>> = OnceLock::new();

/// The built-in components, generated once per process.
pub fn builtin() -> Arc<Components> {
    BUILTIN
        .get_or_init(|| {
            let mut c = builtin_components();
            for (d, schema) in own::schemas() {
                // Each older version it serves has the same schema, under its own name.
                for v in d.also_served {
                    let mut older = schema.clone();
                    older["x-kubernetes-group-version-kind"] =
                        serde_json::json!([{ "group": d.group, "version": v, "kind": d.kind }]);
                    c.insert(crate::resources::own_schema_name(d.group, v, d.kind), older);
                }
                c.insert(
                    crate::resources::own_schema_name(d.group, d.version, d.kind),
                    schema,
                );
            }
            Arc::new(c)
        })
        .clone()
}

/// A consistent view of all schemas: built-ins plus the CRD-defined ones.
#[derive(Clone, Debug)]
pub struct SchemaSet {
    builtin: Arc<Components>,
    custom: Arc<Components>,
}

impl SchemaSet {
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.custom.get(name).or_else(|| self.builtin.get(name))
    }

    /// Follows `$ref` and single-element `allOf: [{$ref}]` wrappers to the schema they name,
    /// returning it with the name of the last component passed through.
    pub fn resolve<'a>(&'a self, mut schema: &'a Value) -> (&'a Value, Option<&'a str>) {
        let mut name = None;
        for _ in 0..32 {
            if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
                let n = ref_name(r);
                match self.get(n) {
                    Some(s) => {
                        name = Some(n);
                        schema = s;
                        continue;
                    }
                    None => return (&Value::Null, name),
                }
            }
            if let Some(Value::Array(all)) = schema.get("allOf")
                && all.len() == 1
                && schema.get("type").is_none()
                && schema.get("properties").is_none()
            {
                schema = &all[0];
                continue;
            }
            break;
        }
        (schema, name)
    }

    /// The components relevant to a set of kinds: their schemas and everything they reference.
    pub fn closure(&self, roots: &[&str]) -> Components {
        let mut out = Components::new();
        let mut todo: Vec<String> = roots.iter().map(|s| s.to_string()).collect();
        while let Some(name) = todo.pop() {
            if out.contains_key(&name) {
                continue;
            }
            let Some(schema) = self.get(&name) else {
                continue;
            };
            collect_refs(schema, &mut todo);
            out.insert(name, schema.clone());
        }
        out
    }
}

fn collect_refs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(r)) = m.get("$ref") {
                out.push(ref_name(r).to_string());
            }
            for x in m.values() {
                collect_refs(x, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| collect_refs(x, out)),
        _ => {}
    }
}

/// All schemas, with the CRD part replaceable.
#[derive(Debug)]
pub struct Schemas {
    builtin: Arc<Components>,
    custom: RwLock<Arc<Components>>,
}

impl Default for Schemas {
    fn default() -> Self {
        Self::new()
    }
}

impl Schemas {
    pub fn new() -> Self {
        Schemas {
            builtin: builtin(),
            custom: RwLock::new(Arc::new(Components::new())),
        }
    }

    pub fn set(&self) -> SchemaSet {
        SchemaSet {
            builtin: self.builtin.clone(),
            custom: self.custom.read().clone(),
        }
    }

    pub fn set_custom(&self, custom: Components) {
        *self.custom.write() = Arc::new(custom);
    }
}

/// The schema of a custom resource version: its `openAPIV3Schema` with `apiVersion`, `kind`
/// and standard `metadata` declared, as Kubernetes publishes it.
pub fn crd_component(rt: &ResourceType, open_api_v3: Option<&Value>) -> Value {
    let mut schema = match open_api_v3 {
        Some(Value::Object(m)) => Value::Object(m.clone()),
        // No schema: anything goes (only allowed for CRDs that preserve unknown fields).
        _ => json!({ "type": "object", "x-kubernetes-preserve-unknown-fields": true }),
    };
    if let Value::Object(m) = &mut schema {
        m.entry("type").or_insert(json!("object"));
        let props = m.entry("properties").or_insert_with(|| json!({}));
        if let Value::Object(p) = props {
            p.insert("apiVersion".into(), json!({ "type": "string" }));
            p.insert("kind".into(), json!({ "type": "string" }));
            p.insert(
                "metadata".into(),
                json!({ "allOf": [reference(OBJECT_META)] }),
            );
        }
        m.insert(
            "x-kubernetes-group-version-kind".into(),
            gvk(&rt.group, &rt.version, &rt.kind),
        );
    }
    schema
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_kinds_have_schemas_with_gvk() {
        let set = Schemas::new().set();
        for rt in crate::resources::builtin() {
            let s = set
                .get(&rt.schema)
                .unwrap_or_else(|| panic!("no schema for {}", rt.schema));
            let gvk = &s["x-kubernetes-group-version-kind"][0];
            assert_eq!(gvk["kind"], rt.kind.as_str(), "{}", rt.schema);
            assert_eq!(gvk["group"], rt.group.as_str());
        }
        assert!(set.get(OBJECT_META).is_some());
    }

    /// Every own kind documents its spec field by field (what `kubectl explain` shows), and
    /// every object node of it is structural: typed, with declared fields or explicitly open.
    #[test]
    fn own_kinds_have_structural_schemas_with_descriptions() {
        fn check(path: &str, s: &Value, undocumented: &mut Vec<String>) {
            let Value::Object(m) = s else { return };
            if m.contains_key("$ref") || m.contains_key("allOf") {
                return;
            }
            assert!(
                m.contains_key("type")
                    || m.contains_key("x-kubernetes-preserve-unknown-fields")
                    || m.contains_key("x-kubernetes-int-or-string"),
                "{path} has no type: {s}"
            );
            for bad in ["nullable", "$schema", "$defs", "definitions"] {
                assert!(!m.contains_key(bad), "{path} has {bad}");
            }
            assert_ne!(
                m.get("additionalProperties"),
                Some(&Value::Bool(false)),
                "{path}"
            );
            if let Some(Value::Object(props)) = m.get("properties") {
                for (k, p) in props {
                    let child = format!("{path}.{k}");
                    if p.get("description").is_none() && p.get("$ref").is_none() {
                        undocumented.push(child.clone());
                    }
                    check(&child, p, undocumented);
                }
            }
            if let Some(items) = m.get("items") {
                check(&format!("{path}[]"), items, undocumented);
            }
        }
        let set = Schemas::new().set();
        let mut undocumented = Vec::new();
        for rt in crate::resources::builtin() {
            if rt.origin != crate::resources::Origin::Own {
                continue;
            }
            let s = set.get(&rt.schema).unwrap();
            if s["properties"].get("spec").is_none() {
                // A kind without a spec (PlacementDecision): its own top-level fields.
                for (k, p) in s["properties"].as_object().unwrap() {
                    if matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                        continue;
                    }
                    let path = format!("{}.{k}", rt.kind);
                    if p.get("description").is_none() && k != "status" {
                        undocumented.push(path.clone());
                    }
                    check(&path, p, &mut undocumented);
                }
                continue;
            }
            assert!(
                s["properties"]["spec"]["properties"].is_object(),
                "{}: an open spec",
                rt.kind
            );
            check(
                &format!("{}.spec", rt.kind),
                &s["properties"]["spec"],
                &mut undocumented,
            );
        }
        assert!(
            undocumented.is_empty(),
            "fields without a description: {undocumented:#?}"
        );
    }

    #[test]
    fn resolve_follows_refs_and_allof() {
        let set = Schemas::new().set();
        let deploy = set.get("io.k8s.api.apps.v1.Deployment").unwrap();
        let (spec, name) = set.resolve(&deploy["properties"]["spec"]);
        assert_eq!(name, Some("io.k8s.api.apps.v1.DeploymentSpec"));
        assert!(spec["properties"]["replicas"].is_object());
        let (meta, name) = set.resolve(&deploy["properties"]["metadata"]);
        assert_eq!(name, Some(OBJECT_META));
        assert!(meta["properties"]["labels"].is_object());
    }

    #[test]
    fn closure_collects_referenced_components() {
        let set = Schemas::new().set();
        let c = set.closure(&["io.k8s.api.apps.v1.Deployment"]);
        assert!(c.contains_key("io.k8s.api.core.v1.PodSpec"));
        assert!(c.contains_key("io.k8s.api.core.v1.Container"));
        assert!(!c.contains_key("io.k8s.api.batch.v1.Job"));
    }
}
