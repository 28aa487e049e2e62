//! Who am I, and what may I do: `SelfSubjectReview` (`kubectl auth whoami`),
//! `SelfSubjectAccessReview` (`kubectl auth can-i`), `SelfSubjectRulesReview`
//! (`kubectl auth can-i --list`) and, for the admin, `SubjectAccessReview` (may someone else).
//! Answered by the same authorizer every request passes ([`crate::auth::authorize`]); nothing is
//! stored (create is the only verb, as in Kubernetes).

use serde_json::{Value, json};

use crate::auth::{Attributes, Identity, authorize, cluster_namespace};
use crate::error::{ApiError, ApiResult};

/// A review kind: group, version, plural, kind.
#[derive(Debug)]
pub struct ReviewKind {
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub kind: &'static str,
}

pub const KINDS: &[ReviewKind] = &[
    ReviewKind {
        group: "authentication.k8s.io",
        version: "v1",
        plural: "selfsubjectreviews",
        kind: "SelfSubjectReview",
    },
    ReviewKind {
        group: "authorization.k8s.io",
        version: "v1",
        plural: "selfsubjectaccessreviews",
        kind: "SelfSubjectAccessReview",
    },
    ReviewKind {
        group: "authorization.k8s.io",
        version: "v1",
        plural: "selfsubjectrulesreviews",
        kind: "SelfSubjectRulesReview",
    },
    ReviewKind {
        group: "authorization.k8s.io",
        version: "v1",
        plural: "subjectaccessreviews",
        kind: "SubjectAccessReview",
    },
];

impl ReviewKind {
    /// Its OpenAPI component (`io.k8s.api.authorization.v1.SelfSubjectAccessReview`).
    pub fn schema(&self) -> String {
        format!(
            "io.k8s.api.{}.{}.{}",
            self.group.trim_end_matches(".k8s.io"),
            self.version,
            self.kind
        )
    }
}

/// The review kind at `group/version/plural`, if it is one.
pub fn kind_at(group: &str, version: &str, plural: &str) -> Option<&'static ReviewKind> {
    KINDS
        .iter()
        .find(|k| k.group == group && k.version == version && k.plural == plural)
}

/// Paths any authenticated identity may read: discovery, the version, health, OpenAPI.
fn public_path(path: &str) -> bool {
    matches!(
        path,
        "/api" | "/apis" | "/version" | "/healthz" | "/livez" | "/readyz"
    ) || path.starts_with("/api/v1") && path.trim_start_matches("/api/v1").is_empty()
        || path.starts_with("/apis/") && path.split('/').filter(|s| !s.is_empty()).count() <= 3
        || path.starts_with("/openapi/")
}

fn user_info(who: &Identity) -> Value {
    json!({"username": who.user(), "groups": who.groups()})
}

/// The identity a SubjectAccessReview names (`user`, else its groups), as this server's
/// identities are named.
fn identity_named(user: &str, groups: &[String]) -> Option<Identity> {
    if let Some(name) = user.strip_prefix("system:cluster:") {
        return Some(Identity::Cluster { name: name.into() });
    }
    if let Some(name) = user.strip_prefix("system:bootstrap:") {
        return Some(Identity::Bootstrap { name: name.into() });
    }
    (user == "admin" || groups.iter().any(|g| g == "system:masters")).then(|| Identity::Admin {
        name: user.to_string(),
    })
}

fn field<'a>(v: &'a Value, name: &str) -> &'a str {
    v.get(name).and_then(Value::as_str).unwrap_or_default()
}

/// Whether `who` may do what `spec` asks (resourceAttributes or nonResourceAttributes), and
/// why.
fn decide(who: &Identity, spec: &Value) -> ApiResult<(bool, String)> {
    if let Some(r) = spec.get("resourceAttributes").filter(|r| r.is_object()) {
        let verb = field(r, "verb");
        let namespace = field(r, "namespace");
        let name = field(r, "name");
        let subresource = field(r, "subresource");
        let what = Attributes {
            verb,
            group: field(r, "group"),
            resource: field(r, "resource"),
            subresource: (!subresource.is_empty()).then_some(subresource),
            namespace: (!namespace.is_empty()).then_some(namespace),
            name: (!name.is_empty()).then_some(name),
        };
        return Ok(match authorize(who, &what) {
            Ok(()) => (true, allowed_because(who)),
            Err(e) => (false, e.message),
        });
    }
    if let Some(n) = spec.get("nonResourceAttributes").filter(|r| r.is_object()) {
        let path = field(n, "path");
        let verb = field(n, "verb");
        return Ok(match who {
            Identity::Admin { .. } => (true, allowed_because(who)),
            Identity::Bootstrap { .. } => (
                false,
                "a bootstrap token may only register its cluster".into(),
            ),
            Identity::Cluster { .. } if verb == "get" && public_path(path) => (
                true,
                "discovery, version and health are open to every identity".into(),
            ),
            Identity::Cluster { .. } => (false, format!("{} may not {verb} {path}", who.user())),
        });
    }
    Err(ApiError::unprocessable(
        "spec: one of resourceAttributes and nonResourceAttributes is required",
    ))
}

fn allowed_because(who: &Identity) -> String {
    match who {
        Identity::Admin { .. } => "the admin token may do everything".into(),
        Identity::Cluster { name } => format!(
            "a member cluster's agent reads its own Works (in {}) and writes its own status",
            cluster_namespace(name)
        ),
        Identity::Bootstrap { .. } => String::new(),
    }
}

/// What `who` may do in `namespace`, as rules (`SelfSubjectRulesReview`'s status).
fn rules(who: &Identity, namespace: &str) -> (Vec<Value>, Vec<Value>) {
    match who {
        Identity::Admin { .. } => (
            vec![json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]})],
            vec![json!({"verbs": ["*"], "nonResourceURLs": ["*"]})],
        ),
        Identity::Bootstrap { .. } => (Vec::new(), Vec::new()),
        Identity::Cluster { name } => {
            let mut resource = vec![
                json!({"verbs": ["get"], "apiGroups": ["multicluster.io"], "resources": ["clusters"], "resourceNames": [name]}),
                json!({"verbs": ["get", "update", "patch"], "apiGroups": ["multicluster.io"], "resources": ["clusters/status"], "resourceNames": [name]}),
            ];
            if namespace == cluster_namespace(name) {
                resource.push(json!({"verbs": ["get", "list", "watch"], "apiGroups": ["multicluster.io"], "resources": ["works"]}));
                resource.push(json!({"verbs": ["get", "update", "patch"], "apiGroups": ["multicluster.io"], "resources": ["works/status"]}));
            }
            let non_resource = vec![json!({"verbs": ["get"], "nonResourceURLs": [
                "/api", "/api/*", "/apis", "/apis/*", "/version", "/healthz", "/livez", "/readyz", "/openapi/*"
            ]})];
            (resource, non_resource)
        }
    }
}

/// Answers a review posted to `kind` by `who` (`req`: the decoded body).
pub fn review(kind: &ReviewKind, who: &Identity, req: &Value) -> ApiResult<Value> {
    let api_version = format!("{}/{}", kind.group, kind.version);
    let spec = req.get("spec").cloned().unwrap_or_else(|| json!({}));
    let status = match kind.kind {
        "SelfSubjectReview" => json!({"userInfo": user_info(who)}),
        "SelfSubjectAccessReview" => {
            let (allowed, reason) = decide(who, &spec)?;
            json!({"allowed": allowed, "reason": reason})
        }
        "SelfSubjectRulesReview" => {
            let (resource, non_resource) = rules(who, field(&spec, "namespace"));
            json!({"resourceRules": resource, "nonResourceRules": non_resource, "incomplete": false})
        }
        "SubjectAccessReview" => {
            if !matches!(who, Identity::Admin { .. }) {
                return Err(ApiError::forbidden(format!(
                    "subjectaccessreviews.authorization.k8s.io is forbidden: User \"{}\" cannot create resource \"subjectaccessreviews\" in API group \"authorization.k8s.io\" at the cluster scope",
                    who.user()
                )));
            }
            let user = field(&spec, "user");
            let groups: Vec<String> = spec
                .get("groups")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|g| g.as_str().map(str::to_string))
                .collect();
            match identity_named(user, &groups) {
                Some(subject) => {
                    let (allowed, reason) = decide(&subject, &spec)?;
                    json!({"allowed": allowed, "reason": reason})
                }
                None => {
                    // Still a bad spec is refused as such.
                    decide(
                        &Identity::Bootstrap {
                            name: String::new(),
                        },
                        &spec,
                    )?;
                    json!({"allowed": false, "reason": format!("no identity named {user:?} exists here (the admin, system:cluster:<name>, system:bootstrap:<name>)")})
                }
            }
        }
        other => {
            return Err(ApiError::internal(format!("no review named {other}")));
        }
    };
    let mut out = json!({
        "apiVersion": api_version,
        "kind": kind.kind,
        "metadata": {"creationTimestamp": null},
        "status": status,
    });
    if kind.kind != "SelfSubjectReview" {
        out["spec"] = spec;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(plural: &str) -> &'static ReviewKind {
        KINDS.iter().find(|k| k.plural == plural).unwrap()
    }

    fn can(who: &Identity, attrs: Value) -> bool {
        let body = json!({"spec": attrs});
        review(kind("selfsubjectaccessreviews"), who, &body).unwrap()["status"]["allowed"] == true
    }

    #[test]
    fn access_reviews_answer_as_requests_are_authorized() {
        let admin = Identity::Admin {
            name: "admin".into(),
        };
        let east = Identity::Cluster {
            name: "east".into(),
        };
        let boot = Identity::Bootstrap {
            name: "east".into(),
        };
        let works = |ns: &str, verb: &str| json!({"resourceAttributes": {"verb": verb, "group": "multicluster.io", "resource": "works", "namespace": ns}});
        assert!(can(
            &admin,
            json!({"resourceAttributes": {"verb": "create", "group": "apps", "resource": "deployments", "namespace": "a"}})
        ));
        assert!(can(&east, works("orrery-cluster-east", "list")));
        assert!(!can(&east, works("orrery-cluster-west", "list")));
        assert!(!can(&east, works("orrery-cluster-east", "delete")));
        assert!(can(
            &east,
            json!({"resourceAttributes": {"verb": "patch", "group": "multicluster.io", "resource": "clusters", "subresource": "status", "name": "east"}})
        ));
        assert!(!can(
            &east,
            json!({"resourceAttributes": {"verb": "patch", "group": "multicluster.io", "resource": "clusters", "subresource": "status", "name": "west"}})
        ));
        assert!(!can(&boot, works("orrery-cluster-east", "list")));
        assert!(can(
            &east,
            json!({"nonResourceAttributes": {"verb": "get", "path": "/apis"}})
        ));
        assert!(!can(
            &east,
            json!({"nonResourceAttributes": {"verb": "get", "path": "/metrics"}})
        ));
        assert!(can(
            &admin,
            json!({"nonResourceAttributes": {"verb": "get", "path": "/metrics"}})
        ));
        // A refusal says why, as a Forbidden would.
        let body = json!({"spec": works("default", "get")});
        let r = review(kind("selfsubjectaccessreviews"), &east, &body).unwrap();
        assert!(
            r["status"]["reason"]
                .as_str()
                .unwrap()
                .contains("cannot get resource \"works\""),
            "{r}"
        );
        assert!(
            review(
                kind("selfsubjectaccessreviews"),
                &east,
                &json!({"spec": {}})
            )
            .is_err()
        );
    }

    #[test]
    fn whoami_rules_and_reviews_of_others() {
        let east = Identity::Cluster {
            name: "east".into(),
        };
        let me = review(kind("selfsubjectreviews"), &east, &json!({})).unwrap();
        assert_eq!(me["status"]["userInfo"]["username"], "system:cluster:east");
        assert_eq!(
            me["status"]["userInfo"]["groups"],
            json!(["system:clusters", "system:authenticated"])
        );
        let rules = |ns: &str| {
            let body = json!({"spec": {"namespace": ns}});
            review(kind("selfsubjectrulesreviews"), &east, &body).unwrap()["status"]
                ["resourceRules"]
                .as_array()
                .unwrap()
                .len()
        };
        assert_eq!(rules("orrery-cluster-east"), 4);
        assert_eq!(rules("default"), 2);
        let admin = Identity::Admin {
            name: "admin".into(),
        };
        let sar = |user: &str| {
            let body = json!({"spec": {"user": user, "resourceAttributes": {"verb": "list", "group": "multicluster.io", "resource": "works", "namespace": "orrery-cluster-east"}}});
            review(kind("subjectaccessreviews"), &admin, &body).unwrap()["status"]["allowed"]
                .clone()
        };
        assert_eq!(sar("system:cluster:east"), json!(true));
        assert_eq!(sar("system:cluster:west"), json!(false));
        assert_eq!(sar("mallory"), json!(false));
        // Only the admin asks about others.
        assert_eq!(
            review(kind("subjectaccessreviews"), &east, &json!({}))
                .unwrap_err()
                .code,
            403
        );
    }
}
