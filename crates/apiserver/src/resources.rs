//! What the server serves: one [`ResourceType`] per group/version/resource, from the built-in
//! table or from a CustomResourceDefinition. The registry is swapped atomically when CRDs
//! change, so requests always see one consistent set.

use parking_lot::RwLock;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use orrery_api::validation::NameRule;

/// Where a resource type comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A Kubernetes kind stored as a template.
    BuiltIn,
    /// One of Orrery's own kinds.
    Own,
    /// Defined by a CustomResourceDefinition (`crd` is its name).
    Crd { crd: String },
}

/// Where the scale subresource finds its figures (JSON pointers into the object).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScaleSpec {
    pub spec_replicas: String,
    pub status_replicas: String,
    /// A `metav1.LabelSelector` (object) or a selector string, whichever the path holds.
    pub label_selector: Option<String>,
}

impl ScaleSpec {
    fn workload() -> Self {
        ScaleSpec {
            spec_replicas: "/spec/replicas".into(),
            status_replicas: "/status/replicas".into(),
            label_selector: Some("/spec/selector".into()),
        }
    }
}

/// A printed column for `kubectl get` (`metav1.TableColumnDefinition`), with the JSONPath of
/// its value for kinds whose columns are declarative.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Column {
    pub name: String,
    pub type_: String,
    pub format: String,
    pub description: String,
    pub priority: i32,
    /// Simple JSONPath (`.spec.replicas`); empty for computed columns.
    pub json_path: String,
    /// How the value found is shown.
    pub render: Render,
}

/// How a declared column shows its value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Render {
    /// As found.
    #[default]
    Plain,
    /// A water level, a fraction of capacity: past 1 it says so (`1.037 (over 100%)`), so
    /// an overcommitted cluster does not read as a typo.
    Level,
}

impl Column {
    pub fn new(name: &str, type_: &str, json_path: &str, priority: i32, description: &str) -> Self {
        Column {
            name: name.into(),
            type_: type_.into(),
            format: String::new(),
            description: description.into(),
            priority,
            json_path: json_path.into(),
            render: Render::Plain,
        }
    }

    pub fn rendered(mut self, render: Render) -> Self {
        self.render = render;
        self
    }
}

/// How rows are printed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Printer {
    /// A built-in printer named after its kind (see `table.rs`).
    BuiltIn,
    /// Declarative columns (CRDs' additionalPrinterColumns; our own kinds).
    Columns(Vec<Column>),
}

/// One served resource.
#[derive(Clone, Debug, PartialEq)]
pub struct ResourceType {
    pub group: String,
    pub version: String,
    pub kind: String,
    pub plural: String,
    pub singular: String,
    pub list_kind: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    pub name_rule: NameRule,
    pub status: bool,
    pub scale: Option<ScaleSpec>,
    pub origin: Origin,
    /// The OpenAPI component that describes the kind.
    pub schema: String,
    /// Whether strategic merge patch applies (built-in kinds only, as in Kubernetes).
    pub strategic_merge: bool,
    pub printer: Printer,
    /// Whether this version is the one stored and preferred for its group.
    pub storage: bool,
    /// The version objects written at this one are stored at, when it is another (an own
    /// kind's older version: the same schema, stored at the newer).
    pub stored_as: Option<String>,
    /// The defining CRD is being deleted: no new objects.
    pub terminating: bool,
}

impl ResourceType {
    /// The apiVersion objects written through this version are stored with.
    pub fn storage_api_version(&self) -> String {
        match &self.stored_as {
            Some(v) => format!("{}/{v}", self.group),
            None => self.api_version(),
        }
    }

    /// `apps/v1`, or `v1` for the core group.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `deployments.apps` (or `pods` in the core group), as error messages name resources.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// `Deployment.apps`, as validation errors name kinds.
    pub fn kind_qualified(&self) -> String {
        if self.group.is_empty() {
            self.kind.clone()
        } else {
            format!("{}.{}", self.kind, self.group)
        }
    }

    /// The store key of one object.
    pub fn key(&self, namespace: &str, name: &str) -> String {
        let ns = self.namespaced.then_some(namespace);
        orrery_api::keys::object(&self.group, &self.plural, ns, name)
    }

    /// The store prefix of a list: one namespace, or all of them.
    pub fn prefix(&self, namespace: Option<&str>) -> String {
        let ns = namespace.filter(|_| self.namespaced);
        orrery_api::keys::prefix(&self.group, &self.plural, ns)
    }

    pub fn is_crd(&self) -> bool {
        matches!(self.origin, Origin::Crd { .. })
    }

    /// Verbs for discovery.
    pub fn verbs(&self) -> Vec<&'static str> {
        vec![
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch",
        ]
    }
}

struct Def {
    group: &'static str,
    kind: &'static str,
    plural: &'static str,
    namespaced: bool,
    short: &'static [&'static str],
    categories: &'static [&'static str],
    status: bool,
    scale: bool,
    schema: &'static str,
}

fn def(
    group: &'static str,
    kind: &'static str,
    plural: &'static str,
    namespaced: bool,
    short: &'static [&'static str],
    status: bool,
    schema: &'static str,
) -> Def {
    Def {
        group,
        kind,
        plural,
        namespaced,
        short,
        categories: &[],
        status,
        scale: false,
        schema,
    }
}

/// Whether `group` is one of Orrery's own groups.
pub fn is_own_group(group: &str) -> bool {
    orrery_api::kinds::OWN.iter().any(|d| d.group == group)
}

/// Every built-in kind's definition: a data table, an entry per kind.
fn builtin_defs() -> Vec<Def> {
    let all: &'static [&'static str] = &["all"];
    vec![
        def(
            "",
            "Namespace",
            "namespaces",
            false,
            &["ns"],
            true,
            "io.k8s.api.core.v1.Namespace",
        ),
        def(
            "",
            "ConfigMap",
            "configmaps",
            true,
            &["cm"],
            false,
            "io.k8s.api.core.v1.ConfigMap",
        ),
        def(
            "",
            "Secret",
            "secrets",
            true,
            &[],
            false,
            "io.k8s.api.core.v1.Secret",
        ),
        Def {
            categories: all,
            ..def(
                "",
                "Service",
                "services",
                true,
                &["svc"],
                true,
                "io.k8s.api.core.v1.Service",
            )
        },
        def(
            "",
            "ServiceAccount",
            "serviceaccounts",
            true,
            &["sa"],
            false,
            "io.k8s.api.core.v1.ServiceAccount",
        ),
        def(
            "",
            "PersistentVolumeClaim",
            "persistentvolumeclaims",
            true,
            &["pvc"],
            true,
            "io.k8s.api.core.v1.PersistentVolumeClaim",
        ),
        def(
            "",
            "Event",
            "events",
            true,
            &["ev"],
            false,
            "io.k8s.api.core.v1.Event",
        ),
        Def {
            categories: all,
            ..def(
                "",
                "Pod",
                "pods",
                true,
                &["po"],
                true,
                "io.k8s.api.core.v1.Pod",
            )
        },
        // Members' nodes: what an Orrery API standing in for a member serves, and what the
        // kube backend reads capacity from.
        def(
            "",
            "Node",
            "nodes",
            false,
            &["no"],
            true,
            "io.k8s.api.core.v1.Node",
        ),
        Def {
            categories: all,
            scale: true,
            ..def(
                "apps",
                "Deployment",
                "deployments",
                true,
                &["deploy"],
                true,
                "io.k8s.api.apps.v1.Deployment",
            )
        },
        Def {
            categories: all,
            scale: true,
            ..def(
                "apps",
                "StatefulSet",
                "statefulsets",
                true,
                &["sts"],
                true,
                "io.k8s.api.apps.v1.StatefulSet",
            )
        },
        Def {
            categories: all,
            ..def(
                "apps",
                "DaemonSet",
                "daemonsets",
                true,
                &["ds"],
                true,
                "io.k8s.api.apps.v1.DaemonSet",
            )
        },
        Def {
            categories: all,
            scale: true,
            ..def(
                "apps",
                "ReplicaSet",
                "replicasets",
                true,
                &["rs"],
                true,
                "io.k8s.api.apps.v1.ReplicaSet",
            )
        },
        // A template's revisions under a rollout (`rollout.orrery.io/binding`), owned by
        // its binding.
        def(
            "apps",
            "ControllerRevision",
            "controllerrevisions",
            true,
            &[],
            false,
            "io.k8s.api.apps.v1.ControllerRevision",
        ),
        Def {
            categories: all,
            ..def(
                "batch",
                "Job",
                "jobs",
                true,
                &[],
                true,
                "io.k8s.api.batch.v1.Job",
            )
        },
        Def {
            categories: all,
            ..def(
                "batch",
                "CronJob",
                "cronjobs",
                true,
                &["cj"],
                true,
                "io.k8s.api.batch.v1.CronJob",
            )
        },
        def(
            "networking.k8s.io",
            "Ingress",
            "ingresses",
            true,
            &["ing"],
            true,
            "io.k8s.api.networking.v1.Ingress",
        ),
        def(
            "policy",
            "PodDisruptionBudget",
            "poddisruptionbudgets",
            true,
            &["pdb"],
            true,
            "io.k8s.api.policy.v1.PodDisruptionBudget",
        ),
        // Karmada's `schedulePriority` reads a PriorityClass's value.
        def(
            "scheduling.k8s.io",
            "PriorityClass",
            "priorityclasses",
            false,
            &["pc"],
            false,
            "io.k8s.api.scheduling.v1.PriorityClass",
        ),
        // The leader Lease of the server replicas (orrery-system/orrery-controllers).
        def(
            "discovery.k8s.io",
            "EndpointSlice",
            "endpointslices",
            true,
            &[],
            false,
            "io.k8s.api.discovery.v1.EndpointSlice",
        ),
        def(
            "coordination.k8s.io",
            "Lease",
            "leases",
            true,
            &[],
            false,
            "io.k8s.api.coordination.v1.Lease",
        ),
        def(
            "rbac.authorization.k8s.io",
            "ClusterRole",
            "clusterroles",
            false,
            &[],
            false,
            "io.k8s.api.rbac.v1.ClusterRole",
        ),
        def(
            "rbac.authorization.k8s.io",
            "ClusterRoleBinding",
            "clusterrolebindings",
            false,
            &[],
            false,
            "io.k8s.api.rbac.v1.ClusterRoleBinding",
        ),
        def(
            "rbac.authorization.k8s.io",
            "Role",
            "roles",
            true,
            &[],
            false,
            "io.k8s.api.rbac.v1.Role",
        ),
        def(
            "rbac.authorization.k8s.io",
            "RoleBinding",
            "rolebindings",
            true,
            &[],
            false,
            "io.k8s.api.rbac.v1.RoleBinding",
        ),
        def(
            "apiextensions.k8s.io",
            "CustomResourceDefinition",
            "customresourcedefinitions",
            false,
            &["crd", "crds"],
            true,
            "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.CustomResourceDefinition",
        ),
    ]
}

/// The version of a Kubernetes group served (own kinds name theirs).
fn version_of(group: &str) -> &'static str {
    match group {
        ""
        | "apps"
        | "batch"
        | "networking.k8s.io"
        | "policy"
        | "coordination.k8s.io"
        | "rbac.authorization.k8s.io"
        | "discovery.k8s.io"
        | "scheduling.k8s.io"
        | "apiextensions.k8s.io" => "v1",
        _ => "v1alpha1",
    }
}

/// The built-in resource types: Kubernetes' kinds, then Orrery's own.
pub fn builtin() -> Vec<ResourceType> {
    let kubernetes = builtin_defs().into_iter().map(|d| {
        let version = version_of(d.group).to_string();
        let schema = d.schema.to_string();
        let name_rule = match d.kind {
            "Namespace" => NameRule::Label,
            "Service" => NameRule::Dns1035,
            // Events are named `<object>.<hash>`, which may contain upper case in Kubernetes.
            "Event" => NameRule::PathSegment,
            // RBAC names may hold colons (`system:basic-user`), as in Kubernetes.
            "Role" | "ClusterRole" | "RoleBinding" | "ClusterRoleBinding" => NameRule::PathSegment,
            _ => NameRule::Subdomain,
        };
        ResourceType {
            group: d.group.to_string(),
            version,
            kind: d.kind.to_string(),
            plural: d.plural.to_string(),
            singular: d.kind.to_lowercase(),
            list_kind: format!("{}List", d.kind),
            namespaced: d.namespaced,
            short_names: d.short.iter().map(|s| s.to_string()).collect(),
            categories: d.categories.iter().map(|s| s.to_string()).collect(),
            name_rule,
            status: d.status,
            scale: d.scale.then(ScaleSpec::workload),
            strategic_merge: true,
            origin: Origin::BuiltIn,
            schema,
            printer: Printer::BuiltIn,
            storage: true,
            stored_as: None,
            terminating: false,
        }
    });
    let own = orrery_api::kinds::OWN.iter().flat_map(|d| own_types(d));
    kubernetes.chain(own).collect()
}

/// The component name of one of our own kinds' schemas (`io.multicluster.v1alpha1.Cluster`).
pub fn own_schema_name(group: &str, version: &str, kind: &str) -> String {
    let reversed: Vec<&str> = group.split('.').rev().collect();
    format!("{}.{version}.{kind}", reversed.join("."))
}

/// The resource types of one of Orrery's own kinds: its storage version, then each older
/// version it serves (stored at the storage version).
fn own_types(d: &orrery_api::kinds::Descriptor) -> Vec<ResourceType> {
    let stored = own_type(d);
    let older = d.also_served.iter().map(|v| ResourceType {
        version: v.to_string(),
        schema: own_schema_name(d.group, v, d.kind),
        storage: false,
        stored_as: Some(d.version.to_string()),
        ..stored.clone()
    });
    let mut out: Vec<ResourceType> = older.collect();
    out.insert(0, stored);
    out
}

/// The resource type of one of Orrery's own kinds, at its storage version.
fn own_type(d: &orrery_api::kinds::Descriptor) -> ResourceType {
    let column = |c: &orrery_api::kinds::Column| Column {
        render: if c.level {
            Render::Level
        } else {
            Render::Plain
        },
        ..Column::new(c.name, c.type_, c.json_path, c.priority, c.description)
    };
    ResourceType {
        group: d.group.to_string(),
        version: d.version.to_string(),
        kind: d.kind.to_string(),
        plural: d.plural.to_string(),
        singular: d.kind.to_lowercase(),
        list_kind: format!("{}List", d.kind),
        namespaced: d.namespaced,
        short_names: d.short_names.iter().map(|s| s.to_string()).collect(),
        categories: vec![orrery_api::kinds::CATEGORY.to_string()],
        name_rule: NameRule::Subdomain,
        status: d.status,
        scale: None,
        strategic_merge: false,
        origin: Origin::Own,
        schema: own_schema_name(d.group, d.version, d.kind),
        printer: Printer::Columns(d.columns.iter().map(column).collect()),
        storage: true,
        stored_as: None,
        terminating: false,
    }
}

/// An immutable set of served resources.
#[derive(Debug, Default)]
pub struct Registry {
    types: Vec<Arc<ResourceType>>,
    by_resource: HashMap<(String, String, String), Arc<ResourceType>>,
}

impl Registry {
    pub fn new(types: Vec<ResourceType>) -> Self {
        let types: Vec<Arc<ResourceType>> = types.into_iter().map(Arc::new).collect();
        let by_resource = types
            .iter()
            .map(|t| {
                (
                    (t.group.clone(), t.version.clone(), t.plural.clone()),
                    t.clone(),
                )
            })
            .collect();
        Registry { types, by_resource }
    }

    pub fn get(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceType>> {
        self.by_resource
            .get(&(group.to_string(), version.to_string(), plural.to_string()))
            .cloned()
    }

    /// The storage version of a group's kind.
    pub fn by_kind(&self, group: &str, kind: &str) -> Option<Arc<ResourceType>> {
        let mut found = self
            .types
            .iter()
            .filter(|t| t.group == group && t.kind == kind);
        let first = found.next()?;
        if first.storage {
            return Some(first.clone());
        }
        found
            .find(|t| t.storage)
            .cloned()
            .or_else(|| Some(first.clone()))
    }

    pub fn all(&self) -> &[Arc<ResourceType>] {
        &self.types
    }

    /// One entry per stored resource (each group/plural once, at its storage version).
    pub fn stored(&self) -> Vec<Arc<ResourceType>> {
        let mut seen = std::collections::HashSet::new();
        self.types
            .iter()
            .filter(|t| t.storage && seen.insert((t.group.clone(), t.plural.clone())))
            .cloned()
            .collect()
    }

    pub fn in_group_version(&self, group: &str, version: &str) -> Vec<Arc<ResourceType>> {
        self.types
            .iter()
            .filter(|t| t.group == group && t.version == version)
            .cloned()
            .collect()
    }

    /// Groups in discovery order, each with its versions (preferred first).
    pub fn groups(&self) -> Vec<(String, Vec<String>)> {
        let mut order: Vec<String> = Vec::new();
        let mut versions: BTreeMap<String, Vec<(bool, String)>> = BTreeMap::new();
        for t in &self.types {
            if !versions.contains_key(&t.group) {
                order.push(t.group.clone());
            }
            let vs = versions.entry(t.group.clone()).or_default();
            if !vs.iter().any(|(_, v)| *v == t.version) {
                vs.push((t.storage, t.version.clone()));
            }
        }
        order
            .into_iter()
            .map(|g| {
                let mut vs = versions.remove(&g).unwrap_or_default();
                // Preferred (storage) version first, the rest in Kubernetes version priority.
                vs.sort_by(|a, b| {
                    b.0.cmp(&a.0)
                        .then_with(|| version_priority(&b.1).cmp(&version_priority(&a.1)))
                });
                (g, vs.into_iter().map(|(_, v)| v).collect())
            })
            .collect()
    }
}

/// Kubernetes version ordering: GA > beta > alpha, higher numbers first.
pub fn version_priority(v: &str) -> (u8, u32, u32) {
    let Some(rest) = v.strip_prefix('v') else {
        return (0, 0, 0);
    };
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    let major: u32 = digits.parse().unwrap_or(0);
    let tail = &rest[digits.len()..];
    if tail.is_empty() {
        (3, major, 0)
    } else if let Some(n) = tail.strip_prefix("beta") {
        (2, major, n.parse().unwrap_or(0))
    } else if let Some(n) = tail.strip_prefix("alpha") {
        (1, major, n.parse().unwrap_or(0))
    } else {
        (0, major, 0)
    }
}

/// The live registry: built-ins plus whatever the CRDs define now.
#[derive(Debug)]
pub struct Resources {
    builtin: Vec<ResourceType>,
    current: RwLock<Arc<Registry>>,
}

impl Default for Resources {
    fn default() -> Self {
        Self::new()
    }
}

impl Resources {
    pub fn new() -> Self {
        let builtin = builtin();
        Resources {
            current: RwLock::new(Arc::new(Registry::new(builtin.clone()))),
            builtin,
        }
    }

    pub fn snapshot(&self) -> Arc<Registry> {
        self.current.read().clone()
    }

    /// Replaces the CRD-defined part of the registry.
    pub fn set_custom(&self, custom: Vec<ResourceType>) {
        let mut types = self.builtin.clone();
        for c in custom {
            // A CRD may not shadow a built-in resource.
            if !types
                .iter()
                .any(|t| t.group == c.group && t.plural == c.plural)
            {
                types.push(c);
            }
        }
        *self.current.write() = Arc::new(Registry::new(types));
    }

    pub fn is_builtin_group(&self, group: &str) -> bool {
        self.builtin.iter().any(|t| t.group == group)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Everything served about Orrery's own kinds, as one document: their resource types,
    /// schemas, CRD objects, discovery and OpenAPI. Kept in a fixture so that moving where
    /// a kind is declared cannot change what clients see (`ORRERY_BLESS=1` rewrites it).
    #[test]
    fn own_kinds_are_served_as_the_fixture_says() {
        let reg = Registry::new(builtin());
        let schemas = crate::schema::Schemas::new();
        let set = schemas.set();
        let own: Vec<&Arc<ResourceType>> = reg
            .all()
            .iter()
            .filter(|t| t.origin == Origin::Own)
            .collect();
        let mut doc = serde_json::Map::new();
        doc.insert(
            "types".into(),
            own.iter()
                .map(|t| serde_json::json!(format!("{t:?}")))
                .collect(),
        );
        let mut groups = orrery_api::kinds::own_groups();
        groups.sort();
        doc.insert("groups".into(), serde_json::json!(format!("{groups:?}")));
        let mut per_kind = serde_json::Map::new();
        // A kind's older versions have its schema (under their own names) and its CRD.
        for t in own.iter().filter(|t| t.stored_as.is_none()) {
            per_kind.insert(
                format!("{}/{}", t.group, t.kind),
                serde_json::json!({
                    "schema": set.get(&t.schema),
                    // Its schema is the one above, inlined.
                    "crd": crate::crd::for_own_kind(t, &set).map(|o| {
                        let mut v = o.to_value();
                        for ver in v.pointer_mut("/spec/versions").and_then(|v| v.as_array_mut()).into_iter().flatten() {
                            ver.as_object_mut().map(|m| m.remove("schema"));
                        }
                        v
                    }),
                }),
            );
        }
        doc.insert("kinds".into(), per_kind.into());
        let mut served = serde_json::Map::new();
        for (g, v) in orrery_api::kinds::own_groups() {
            served.insert(
                format!("{g}/{v}"),
                serde_json::json!({
                    "group": crate::discovery::group(&reg, g),
                    "resources": crate::discovery::resource_list(&reg, g, v),
                    // What the document holds (the schemas themselves are above).
                    "openapi": crate::openapi::v3_document(&reg, &set, g, v).map(|d| {
                        serde_json::json!({
                            "paths": d["paths"].as_object().map(|ps| {
                                ps.iter()
                                    .map(|(p, ops)| {
                                        let ids: Vec<&serde_json::Value> = ops
                                            .as_object()
                                            .into_iter()
                                            .flatten()
                                            .filter_map(|(_, op)| op.get("operationId"))
                                            .collect();
                                        (p.clone(), serde_json::json!(ids))
                                    })
                                    .collect::<serde_json::Map<_, _>>()
                            }),
                            "components": d["components"]["schemas"].as_object().map(|m| m.keys().cloned().collect::<Vec<_>>()),
                        })
                    }),
                }),
            );
        }
        doc.insert("served".into(), served.into());
        doc.insert(
            "aggregated".into(),
            crate::discovery::aggregated(&reg, false, "apidiscovery.k8s.io/v2"),
        );
        let got = serde_json::to_string_pretty(&serde_json::Value::Object(doc)).unwrap() + "\n";
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/own_kinds.json");
        if std::env::var_os("ORRERY_BLESS").is_some() {
            std::fs::write(path, &got).unwrap();
        }
        let want = std::fs::read_to_string(path).unwrap();
        assert!(
            got == want,
            "own kinds differ from {path} (ORRERY_BLESS=1 to accept)"
        );
    }

    #[test]
    fn keys_and_prefixes() {
        let reg = Registry::new(builtin());
        let deploy = reg.get("apps", "v1", "deployments").unwrap();
        assert_eq!(deploy.key("ns", "web"), "/registry/apps/deployments/ns/web");
        assert_eq!(deploy.prefix(Some("ns")), "/registry/apps/deployments/ns/");
        assert_eq!(deploy.prefix(None), "/registry/apps/deployments/");
        let ns = reg.get("", "v1", "namespaces").unwrap();
        assert_eq!(ns.key("", "default"), "/registry/core/namespaces/default");
        assert_eq!(ns.qualified(), "namespaces");
        assert_eq!(deploy.qualified(), "deployments.apps");
        assert_eq!(deploy.kind_qualified(), "Deployment.apps");
        let cl = reg.get("multicluster.io", "v1alpha1", "clusters").unwrap();
        assert_eq!(cl.schema, "io.multicluster.v1alpha1.Cluster");
        assert!(cl.short_names.contains(&"cl".to_string()));
    }

    #[test]
    fn groups_in_order_with_preferred_versions() {
        let reg = Registry::new(builtin());
        let groups = reg.groups();
        assert_eq!(groups[0].0, "");
        assert_eq!(groups[1].0, "apps");
        assert!(
            groups
                .iter()
                .any(|(g, v)| g == "multicluster.io" && v == &["v1alpha1"])
        );
        let mut vs = vec!["v1alpha1", "v2", "v1", "v1beta2", "v1beta1", "v10"];
        vs.sort_by_key(|v| std::cmp::Reverse(version_priority(v)));
        assert_eq!(vs, ["v10", "v2", "v1", "v1beta2", "v1beta1", "v1alpha1"]);
    }

    #[test]
    fn custom_types_cannot_shadow_builtins() {
        let res = Resources::new();
        let mut fake = builtin()
            .into_iter()
            .find(|t| t.plural == "configmaps")
            .unwrap();
        fake.origin = Origin::Crd {
            crd: "configmaps.".into(),
        };
        res.set_custom(vec![fake]);
        assert_eq!(
            res.snapshot().get("", "v1", "configmaps").unwrap().origin,
            Origin::BuiltIn
        );
    }
}
