//! The default roles and bindings, as Kubernetes bootstraps them: `cluster-admin`, the
//! aggregated `admin`, `edit` and `view` and the roles aggregated into them, the basic user's
//! self-reviews and discovery for every authenticated user; and Orrery's own kinds added to
//! `view` and `edit` through the same aggregation labels a CRD's author would use.
//!
//! Written at start when missing; rewritten when they differ and still carry
//! `rbac.authorization.kubernetes.io/autoupdate: "true"` (set it to "false" to keep an edit).

use orrery_api::Object;
use orrery_store::{Store, StoreError};
use serde_json::{Value, json};

use super::{GROUP, Rule};
use crate::resources::Origin;

const AUTOUPDATE: &str = "rbac.authorization.kubernetes.io/autoupdate";
const AGGREGATE: &str = "rbac.authorization.k8s.io/aggregate-to-";

const READ: &[&str] = &["get", "list", "watch"];
const WRITE: &[&str] = &["create", "delete", "deletecollection", "patch", "update"];

fn cluster_role(name: &str, labels: &[&str], rules: Vec<Rule>) -> Object {
    let mut o = Object::new(format!("{GROUP}/v1"), "ClusterRole").with_name(name);
    o.metadata
        .labels
        .insert("kubernetes.io/bootstrapping".into(), "rbac-defaults".into());
    for to in labels {
        o.metadata
            .labels
            .insert(format!("{AGGREGATE}{to}"), "true".into());
    }
    o.metadata
        .annotations
        .insert(AUTOUPDATE.into(), "true".into());
    o.other.insert(
        "rules".into(),
        serde_json::to_value(rules).unwrap_or_default(),
    );
    o
}

fn aggregated(name: &str, labels: &[&str], of: &str) -> Object {
    let mut o = cluster_role(name, labels, Vec::new());
    o.other.insert(
        "aggregationRule".into(),
        json!({"clusterRoleSelectors": [{"matchLabels": {format!("{AGGREGATE}{of}"): "true"}}]}),
    );
    o
}

fn binding(name: &str, role: &str, groups: &[&str]) -> Object {
    let mut o = Object::new(format!("{GROUP}/v1"), "ClusterRoleBinding").with_name(name);
    o.metadata
        .labels
        .insert("kubernetes.io/bootstrapping".into(), "rbac-defaults".into());
    o.metadata
        .annotations
        .insert(AUTOUPDATE.into(), "true".into());
    o.other.insert(
        "roleRef".into(),
        json!({"apiGroup": GROUP, "kind": "ClusterRole", "name": role}),
    );
    let subjects: Vec<Value> = groups
        .iter()
        .map(|g| json!({"apiGroup": GROUP, "kind": "Group", "name": g}))
        .collect();
    o.other.insert("subjects".into(), Value::Array(subjects));
    o
}

/// Which of Orrery's kinds a default role covers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Own {
    /// Everything users may read.
    Readable,
    /// What a namespace's `edit` may write: namespaced kinds a user makes. Not
    /// ResourceBindings (the controllers write them, and a binding names what is sent to a
    /// member), nor cluster-scoped kinds (cluster-wide rights are cluster-admin's, as
    /// Kubernetes' `edit` holds none).
    Writable,
}

/// The plurals of Orrery's own kinds, with `<plural>/status` where they have status; Works
/// left out (they carry whole workloads, Secrets included, and only agents and controllers
/// handle them).
fn own_resources(which: Own) -> Vec<(String, Vec<String>)> {
    let mut by_group: Vec<(String, Vec<String>)> = Vec::new();
    for rt in crate::resources::builtin() {
        if rt.origin != Origin::Own || rt.plural == "works" {
            continue;
        }
        if which == Own::Writable && (!rt.namespaced || rt.plural == "resourcebindings") {
            continue;
        }
        let mut names = vec![rt.plural.clone()];
        if rt.status {
            names.push(format!("{}/status", rt.plural));
        }
        match by_group.iter_mut().find(|(g, _)| *g == rt.group) {
            Some((_, v)) => v.extend(names),
            None => by_group.push((rt.group.clone(), names)),
        }
    }
    by_group
}

fn own_rules(verbs: &[&str], which: Own, status: bool) -> Vec<Rule> {
    own_resources(which)
        .into_iter()
        .map(|(group, resources)| {
            let resources: Vec<&str> = resources
                .iter()
                .map(String::as_str)
                .filter(|r| status || !r.contains('/'))
                .collect();
            Rule::on(verbs, &[group.as_str()], &resources)
        })
        .collect()
}

/// Every default object: a data table of the default roles and their bindings.
pub fn objects() -> Vec<Object> {
    let view = vec![
        Rule::on(
            READ,
            &[""],
            &[
                "configmaps",
                "endpoints",
                "persistentvolumeclaims",
                "persistentvolumeclaims/status",
                "pods",
                "replicationcontrollers",
                "replicationcontrollers/scale",
                "serviceaccounts",
                "services",
                "services/status",
            ],
        ),
        Rule::on(
            READ,
            &[""],
            &[
                "bindings",
                "events",
                "limitranges",
                "namespaces/status",
                "pods/log",
                "pods/status",
                "replicationcontrollers/status",
                "resourcequotas",
                "resourcequotas/status",
            ],
        ),
        Rule::on(READ, &[""], &["namespaces"]),
        Rule::on(
            READ,
            &["apps"],
            &[
                "controllerrevisions",
                "daemonsets",
                "daemonsets/status",
                "deployments",
                "deployments/scale",
                "deployments/status",
                "replicasets",
                "replicasets/scale",
                "replicasets/status",
                "statefulsets",
                "statefulsets/scale",
                "statefulsets/status",
            ],
        ),
        Rule::on(
            READ,
            &["autoscaling"],
            &[
                "horizontalpodautoscalers",
                "horizontalpodautoscalers/status",
            ],
        ),
        Rule::on(
            READ,
            &["batch"],
            &["cronjobs", "cronjobs/status", "jobs", "jobs/status"],
        ),
        Rule::on(
            READ,
            &["networking.k8s.io"],
            &["ingresses", "ingresses/status", "networkpolicies"],
        ),
        Rule::on(
            READ,
            &["policy"],
            &["poddisruptionbudgets", "poddisruptionbudgets/status"],
        ),
        Rule::on(READ, &["discovery.k8s.io"], &["endpointslices"]),
    ];
    let edit = vec![
        Rule::on(
            WRITE,
            &[""],
            &[
                "pods",
                "pods/attach",
                "pods/exec",
                "pods/portforward",
                "pods/proxy",
            ],
        ),
        Rule::on(
            WRITE,
            &[""],
            &[
                "configmaps",
                "events",
                "persistentvolumeclaims",
                "replicationcontrollers",
                "replicationcontrollers/scale",
                "secrets",
                "serviceaccounts",
                "services",
                "services/proxy",
            ],
        ),
        Rule::on(&["create"], &[""], &["serviceaccounts/token"]),
        Rule::on(READ, &[""], &["secrets"]),
        Rule::on(&["impersonate"], &[""], &["serviceaccounts"]),
        Rule::on(
            WRITE,
            &["apps"],
            &[
                "daemonsets",
                "deployments",
                "deployments/rollback",
                "deployments/scale",
                "replicasets",
                "replicasets/scale",
                "statefulsets",
                "statefulsets/scale",
            ],
        ),
        Rule::on(WRITE, &["autoscaling"], &["horizontalpodautoscalers"]),
        Rule::on(WRITE, &["batch"], &["cronjobs", "jobs"]),
        Rule::on(
            WRITE,
            &["networking.k8s.io"],
            &["ingresses", "networkpolicies"],
        ),
        Rule::on(WRITE, &["policy"], &["poddisruptionbudgets"]),
    ];
    let mut every_verb = [WRITE, READ].concat();
    every_verb.sort_unstable();
    let admin = vec![
        Rule::on(&every_verb, &[GROUP], &["rolebindings", "roles"]),
        Rule::on(
            &["create"],
            &["authorization.k8s.io"],
            &["localsubjectaccessreviews"],
        ),
    ];
    let everyone = ["system:authenticated"];
    vec![
        cluster_role(
            "cluster-admin",
            &[],
            vec![Rule::on(&["*"], &["*"], &["*"]), Rule::urls(&["*"], &["*"])],
        ),
        aggregated("admin", &[], "admin"),
        aggregated("edit", &["admin"], "edit"),
        aggregated("view", &["admin", "edit"], "view"),
        cluster_role("system:aggregate-to-admin", &["admin"], admin),
        cluster_role("system:aggregate-to-edit", &["edit"], edit),
        cluster_role("system:aggregate-to-view", &["view"], view),
        cluster_role(
            "orrery:aggregate-to-view",
            &["view"],
            own_rules(READ, Own::Readable, true),
        ),
        cluster_role(
            "orrery:aggregate-to-edit",
            &["edit"],
            own_rules(WRITE, Own::Writable, false),
        ),
        cluster_role(
            "system:basic-user",
            &[],
            vec![
                Rule::on(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                ),
                Rule::on(
                    &["create"],
                    &["authentication.k8s.io"],
                    &["selfsubjectreviews"],
                ),
            ],
        ),
        cluster_role(
            "system:discovery",
            &[],
            vec![Rule::urls(
                &["get"],
                &[
                    "/api",
                    "/api/*",
                    "/apis",
                    "/apis/*",
                    "/healthz",
                    "/livez",
                    "/openapi",
                    "/openapi/*",
                    "/readyz",
                    "/version",
                    "/version/",
                ],
            )],
        ),
        binding("cluster-admin", "cluster-admin", &["system:masters"]),
        binding("system:basic-user", "system:basic-user", &everyone),
        binding("system:discovery", "system:discovery", &everyone),
    ]
}

/// What of an object the defaults decide (the rest is the store's or the user's; an
/// aggregated role's rules are the aggregation writer's).
fn substance(o: &Object) -> (Value, Value, Value, Value, Value) {
    let get = |k: &str| o.other.get(k).cloned().unwrap_or(Value::Null);
    let rules = if o.other.contains_key("aggregationRule") {
        Value::Null
    } else {
        get("rules")
    };
    (
        serde_json::to_value(&o.metadata.labels).unwrap_or_default(),
        rules,
        get("aggregationRule"),
        get("roleRef"),
        get("subjects"),
    )
}

/// Writes the defaults that are missing or out of date (see the module's note). Returns how
/// many were written.
pub async fn ensure(
    store: &dyn Store,
    prepare: impl Fn(&mut Object, bool),
) -> Result<usize, StoreError> {
    let mut n = 0;
    for mut want in objects() {
        let plural = if want.kind == "ClusterRole" {
            "clusterroles"
        } else {
            "clusterrolebindings"
        };
        let key = orrery_api::keys::object(GROUP, plural, None, want.name());
        match store.get(&key).await {
            Ok(have) => {
                let keep = have
                    .metadata
                    .annotations
                    .get(AUTOUPDATE)
                    .is_some_and(|v| v == "false");
                if keep || substance(&have) == substance(&want) {
                    continue;
                }
                let mut next = have.clone();
                next.metadata.labels = want.metadata.labels.clone();
                let aggregated = want.other.contains_key("aggregationRule");
                for k in ["rules", "aggregationRule", "roleRef", "subjects"] {
                    if k == "rules" && aggregated {
                        continue;
                    }
                    match want.other.remove(k) {
                        Some(v) => next.other.insert(k.into(), v),
                        None => next.other.remove(k),
                    };
                }
                prepare(&mut next, false);
                match store.update(&key, next, have.revision()).await {
                    Ok(_) | Err(StoreError::Conflict { .. }) => n += 1,
                    Err(e) => return Err(e),
                }
            }
            Err(StoreError::NotFound { .. }) => {
                orrery_store::stamp::stamp_new(&mut want.metadata);
                prepare(&mut want, true);
                match store.create(&key, want).await {
                    Ok(_) => n += 1,
                    Err(StoreError::AlreadyExists { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}
