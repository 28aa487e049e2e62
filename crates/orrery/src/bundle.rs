//! The agent's bundle: the objects that run `orrery agent` as a Deployment in its member.
//! `orrery join NAME --pull` applies them to the member, `--print` writes them for GitOps,
//! and `deploy/agent` holds the same as kustomize files (a test keeps the two the same).
//!
//! The agent reads its flags from a ConfigMap (`agent.yaml`, the config file) and its
//! bootstrap token from a Secret (`ORRERY_TOKEN`); it keeps its state in a Secret of its
//! namespace, so the Pod needs no volume but its configuration.

use serde_json::{Value, json};

/// The namespace of the agent in its member.
pub const NAMESPACE: &str = "orrery-agent";
/// The name of the agent's objects.
pub const NAME: &str = "orrery-agent";
/// The ClusterRole that lets the agent manage any kind.
pub const ROLE_ANY: &str = "orrery-agent";
/// The ClusterRole for listed kinds only.
pub const ROLE_RESTRICTED: &str = "orrery-agent-restricted";
/// The image the bundles run (built from the repository's Dockerfile).
pub const IMAGE: &str = concat!("ghcr.io/orrery-io/orrery:", env!("CARGO_PKG_VERSION"));
/// Where the probes are served in the Pod.
pub const HEALTH_PORT: u16 = 10358;
/// The Secret that holds the agent's state.
pub const STATE_SECRET: &str = "orrery-agent-state";

/// What the agent may touch in its member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// Any kind (what propagating arbitrary templates needs).
    Any,
    /// These kinds only, as `resource.group` (`deployments.apps`, `configmaps`).
    Kinds(Vec<String>),
}

/// What the bundle is made of.
#[derive(Debug, Clone)]
pub struct AgentBundle {
    pub cluster: String,
    pub servers: Vec<String>,
    pub token: String,
    pub image: String,
    pub facts: orrery_api::cluster::ClusterFacts,
    pub access: Access,
}

fn labels() -> Value {
    json!({"app.kubernetes.io/name": NAME, "app.kubernetes.io/part-of": "orrery"})
}

fn yaml_list(items: &[String]) -> String {
    format!(
        "[{}]",
        items
            .iter()
            .map(|s| serde_json::to_string(s).unwrap_or_default())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// The agent's config file (`agent.yaml` in its ConfigMap).
pub fn config_file(b: &AgentBundle) -> String {
    let q = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let mut out =
        String::from("# orrery agent --config: every flag of `orrery agent` by its name\n");
    out.push_str(&format!("server: {}\n", yaml_list(&b.servers)));
    out.push_str(&format!("cluster: {}\n", q(&b.cluster)));
    out.push_str(&format!("state-secret: {NAMESPACE}/{STATE_SECRET}\n"));
    out.push_str(&format!("health-listen: 0.0.0.0:{HEALTH_PORT}\n"));
    let f = &b.facts;
    if !f.region.is_empty() {
        out.push_str(&format!("region: {}\n", q(&f.region)));
    }
    if !f.provider.is_empty() {
        out.push_str(&format!("provider: {}\n", q(&f.provider)));
    }
    if !f.zones.is_empty() {
        out.push_str(&format!("zone: {}\n", yaml_list(&f.zones)));
    }
    if !f.labels.is_empty() {
        let l: Vec<String> = f.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        out.push_str(&format!("labels: {}\n", yaml_list(&l)));
    }
    if !f.capabilities.is_empty() {
        out.push_str(&format!("capabilities: {}\n", yaml_list(&f.capabilities)));
    }
    out
}

/// The rules of the restricted role: what every agent reads (nodes and pods for the
/// capacity, namespaces it creates, the member's ClusterProperties, metrics, discovery),
/// and the kinds listed.
fn restricted_rules(kinds: &[String]) -> Vec<Value> {
    let all = json!([
        "get", "list", "watch", "create", "update", "patch", "delete"
    ]);
    let mut rules = vec![
        json!({"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["get", "list", "watch"]}),
        json!({"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch", "create"]}),
        json!({"apiGroups": ["about.k8s.io"], "resources": ["clusterproperties"], "verbs": ["get", "list", "watch"]}),
        json!({"apiGroups": ["metrics.k8s.io"], "resources": ["nodes", "pods"], "verbs": ["get", "list"]}),
        // Multi-cluster services: the member's endpoints and its own ServiceExports.
        json!({"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]}),
        json!({"apiGroups": ["multicluster.x-k8s.io"], "resources": ["serviceexports"], "verbs": ["get", "list", "watch"]}),
        json!({"apiGroups": ["multicluster.x-k8s.io"], "resources": ["serviceexports/status"], "verbs": ["get", "update", "patch"]}),
        json!({"nonResourceURLs": ["/version", "/api", "/api/*", "/apis", "/apis/*"], "verbs": ["get"]}),
    ];
    let mut by_group: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for k in kinds {
        let (resource, group) = k.split_once('.').unwrap_or((k.as_str(), ""));
        by_group
            .entry(group.to_string())
            .or_default()
            .push(resource.to_string());
    }
    for (group, resources) in by_group {
        rules.push(json!({"apiGroups": [group], "resources": resources, "verbs": all}));
    }
    rules
}

/// The bundle's objects, in the order they are applied.
pub fn objects(b: &AgentBundle) -> Vec<Value> {
    use base64::Engine;
    let meta = |name: &str| json!({"name": name, "namespace": NAMESPACE, "labels": labels()});
    let role = match &b.access {
        Access::Any => json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": ROLE_ANY, "labels": labels()},
            "rules": [
                {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                {"nonResourceURLs": ["*"], "verbs": ["get"]},
            ],
        }),
        Access::Kinds(kinds) => json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": ROLE_RESTRICTED, "labels": labels()},
            "rules": restricted_rules(kinds),
        }),
    };
    let role_name = role["metadata"]["name"].clone();
    vec![
        json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": NAMESPACE, "labels": labels()}}),
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(NAME)}),
        role,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": NAME, "labels": labels()},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
            "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]}),
        // Its state: a Secret of its own namespace (create cannot be limited to a name).
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": meta("orrery-agent-state"),
        "rules": [
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
            {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [STATE_SECRET],
             "verbs": ["get", "update", "patch", "delete"]},
        ]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": meta("orrery-agent-state"),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "orrery-agent-state"},
            "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": meta("orrery-agent-token"),
            "type": "Opaque",
            "data": {"token": base64::engine::general_purpose::STANDARD.encode(&b.token)}}),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta("orrery-agent-config"),
            "data": {"agent.yaml": config_file(b)}}),
        deployment(&b.image),
        // One agent a cluster (a second waits for the first's lease): a drain may evict it,
        // it resumes from its Secret on another node.
        json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": meta(NAME),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app.kubernetes.io/name": NAME}}}}),
    ]
}

fn deployment(image: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": labels()},
        "spec": {
            "replicas": 1,
            // Never two at once: the second would wait out the first's lease.
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {"app.kubernetes.io/name": NAME}},
            "template": {
                "metadata": {"labels": labels()},
                "spec": {
                    "serviceAccountName": NAME,
                    "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "agent",
                        "image": image,
                        "args": ["agent", "--config", "/etc/orrery/agent.yaml"],
                        "env": [{"name": "ORRERY_TOKEN", "valueFrom": {"secretKeyRef":
                            {"name": "orrery-agent-token", "key": "token"}}}],
                        "ports": [{"name": "health", "containerPort": HEALTH_PORT}],
                        "livenessProbe": {"httpGet": {"path": "/livez", "port": "health"},
                            "periodSeconds": 20, "failureThreshold": 3},
                        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "health"},
                            "periodSeconds": 10},
                        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"},
                            "limits": {"cpu": "1", "memory": "512Mi"}},
                        "securityContext": {"allowPrivilegeEscalation": false,
                            "readOnlyRootFilesystem": true, "capabilities": {"drop": ["ALL"]}},
                        "volumeMounts": [{"name": "config", "mountPath": "/etc/orrery", "readOnly": true}],
                    }],
                    "volumes": [{"name": "config", "configMap": {"name": "orrery-agent-config"}}],
                },
            },
        },
    })
}

/// The bundle as YAML documents.
pub fn to_yaml(objects: &[Value]) -> String {
    serde_saphyr::to_string_multiple(objects).unwrap_or_default()
}

/// The REST path of one of the bundle's objects (its kinds only).
pub fn path_of(o: &Value) -> Option<String> {
    let kind = o["kind"].as_str()?;
    let name = o["metadata"]["name"].as_str()?;
    let ns = o["metadata"]["namespace"].as_str().unwrap_or("");
    let (prefix, plural, namespaced) = match kind {
        "Namespace" => ("/api/v1", "namespaces", false),
        "ServiceAccount" => ("/api/v1", "serviceaccounts", true),
        "Secret" => ("/api/v1", "secrets", true),
        "ConfigMap" => ("/api/v1", "configmaps", true),
        "ClusterRole" => ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", false),
        "ClusterRoleBinding" => (
            "/apis/rbac.authorization.k8s.io/v1",
            "clusterrolebindings",
            false,
        ),
        "Role" => ("/apis/rbac.authorization.k8s.io/v1", "roles", true),
        "RoleBinding" => ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", true),
        "Deployment" => ("/apis/apps/v1", "deployments", true),
        "PodDisruptionBudget" => ("/apis/policy/v1", "poddisruptionbudgets", true),
        _ => return None,
    };
    Some(if namespaced {
        format!("{prefix}/namespaces/{ns}/{plural}/{name}")
    } else {
        format!("{prefix}/{plural}/{name}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundle(access: Access) -> AgentBundle {
        AgentBundle {
            cluster: "edge-1".into(),
            servers: vec!["https://cp.example:6443".into()],
            token: "ORR1abc::id.secret".into(),
            image: IMAGE.into(),
            facts: orrery_api::cluster::ClusterFacts {
                region: "eu-central".into(),
                zones: vec!["a".into(), "b".into()],
                ..Default::default()
            },
            access,
        }
    }

    #[test]
    fn every_object_has_a_path_and_the_config_names_the_cluster() {
        let objs = objects(&bundle(Access::Any));
        for o in &objs {
            assert!(path_of(o).is_some(), "{o}");
        }
        let cfg = config_file(&bundle(Access::Any));
        assert!(cfg.contains("cluster: \"edge-1\"\n"), "{cfg}");
        assert!(cfg.contains("zone: [\"a\", \"b\"]\n"), "{cfg}");
        assert!(
            cfg.contains("state-secret: orrery-agent/orrery-agent-state\n"),
            "{cfg}"
        );
        let yaml = to_yaml(&objs);
        assert_eq!(yaml.matches("apiVersion: ").count(), objs.len(), "{yaml}");
    }

    #[test]
    fn the_restricted_role_lists_the_kinds_by_group() {
        let objs = objects(&bundle(Access::Kinds(vec![
            "deployments.apps".into(),
            "configmaps".into(),
            "statefulsets.apps".into(),
        ])));
        let role = objs.iter().find(|o| o["kind"] == "ClusterRole").unwrap();
        assert_eq!(role["metadata"]["name"], ROLE_RESTRICTED);
        let rules = role["rules"].as_array().unwrap();
        assert!(rules.iter().any(|r| r["apiGroups"] == json!(["apps"])
            && r["resources"] == json!(["deployments", "statefulsets"])));
        assert!(
            rules
                .iter()
                .any(|r| r["apiGroups"] == json!([""]) && r["resources"] == json!(["configmaps"]))
        );
        assert!(!rules.iter().any(|r| r["resources"] == json!(["*"])));
        let binding = objs
            .iter()
            .find(|o| o["kind"] == "ClusterRoleBinding")
            .unwrap();
        assert_eq!(binding["roleRef"]["name"], ROLE_RESTRICTED);
    }
}
