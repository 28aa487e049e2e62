//! Who am I, and what may I do: `SelfSubjectReview` (`kubectl auth whoami`),
//! `SelfSubjectAccessReview` (`kubectl auth can-i`), `SelfSubjectRulesReview`
//! (`kubectl auth can-i --list`) and, for the admin, `SubjectAccessReview` (may someone else).
//! Answered by the same authorizer every request passes ([`crate::rbac::Authorizer`]); nothing
//! is stored (create is the only verb, as in Kubernetes).

use serde_json::{Value, json};

use crate::auth::{Attributes, Identity};
use crate::error::{ApiError, ApiResult};
use crate::rbac::{Authorizer, Decision};

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

fn user_info(who: &Identity) -> Value {
    let mut info = json!({"username": who.user(), "groups": who.groups()});
    // What an impersonating request named besides the user and groups.
    if let Ok(Some(how)) = crate::impersonation::CURRENT.try_with(Clone::clone) {
        if !how.uid.is_empty() {
            info["uid"] = json!(how.uid);
        }
        if !how.extra.is_empty() {
            info["extra"] = json!(how.extra);
        }
    }
    info
}

fn field<'a>(v: &'a Value, name: &str) -> &'a str {
    v.get(name).and_then(Value::as_str).unwrap_or_default()
}

/// Whom a review asks about: oneself, or (a SubjectAccessReview) the user and groups it names.
enum About<'a> {
    Me(&'a Identity),
    Named { user: &'a str, groups: Vec<String> },
}

/// Whether the subject may do what `spec` asks (resourceAttributes or
/// nonResourceAttributes), and why.
fn decide(authz: &Authorizer, about: &About<'_>, spec: &Value) -> ApiResult<Decision> {
    if let Some(r) = spec.get("resourceAttributes").filter(|r| r.is_object()) {
        let namespace = field(r, "namespace");
        let name = field(r, "name");
        let subresource = field(r, "subresource");
        let what = Attributes {
            verb: field(r, "verb"),
            group: field(r, "group"),
            resource: field(r, "resource"),
            subresource: (!subresource.is_empty()).then_some(subresource),
            namespace: (!namespace.is_empty()).then_some(namespace),
            name: (!name.is_empty()).then_some(name),
        };
        return Ok(match about {
            About::Me(who) => authz.decide(who, &what),
            // An agent's user name carries its built-in rules, as its token does.
            About::Named { user, groups } => {
                authz.decide_as(user, groups, user.strip_prefix("system:cluster:"), &what)
            }
        });
    }
    if let Some(n) = spec.get("nonResourceAttributes").filter(|r| r.is_object()) {
        let (verb, path) = (field(n, "verb"), field(n, "path"));
        return Ok(match about {
            About::Me(who) => authz.decide_path(who, verb, path),
            About::Named { user, groups } => authz.decide_path_as(user, groups, verb, path),
        });
    }
    Err(ApiError::unprocessable(
        "spec: one of resourceAttributes and nonResourceAttributes is required",
    ))
}

fn answer(d: Decision) -> Value {
    let mut v = json!({"allowed": d.allowed});
    if !d.reason.is_empty() {
        v["reason"] = json!(d.reason);
    }
    v
}

/// Answers a review posted to `kind` by `who` (`req`: the decoded body).
pub fn review(
    authz: &Authorizer,
    kind: &ReviewKind,
    who: &Identity,
    req: &Value,
) -> ApiResult<Value> {
    let api_version = format!("{}/{}", kind.group, kind.version);
    let spec = req.get("spec").cloned().unwrap_or_else(|| json!({}));
    let status = match kind.kind {
        "SelfSubjectReview" => json!({"userInfo": user_info(who)}),
        "SelfSubjectAccessReview" => answer(decide(authz, &About::Me(who), &spec)?),
        "SelfSubjectRulesReview" => {
            let namespace = field(&spec, "namespace");
            let (resource, non_resource) =
                authz.rules_for(who, (!namespace.is_empty()).then_some(namespace));
            json!({"resourceRules": resource, "nonResourceRules": non_resource, "incomplete": false})
        }
        "SubjectAccessReview" => {
            // Who may ask was decided by RBAC (create subjectaccessreviews) before. The
            // subject's groups are taken as given, as Kubernetes takes them.
            let groups: Vec<String> = spec
                .get("groups")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|g| g.as_str().map(str::to_string))
                .collect();
            let about = About::Named {
                user: field(&spec, "user"),
                groups,
            };
            answer(decide(authz, &about, &spec)?)
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

    fn authz() -> std::sync::Arc<Authorizer> {
        Authorizer::from_objects(&crate::rbac::defaults::objects())
    }

    fn can(who: &Identity, attrs: Value) -> bool {
        let body = json!({"spec": attrs});
        review(&authz(), kind("selfsubjectaccessreviews"), who, &body).unwrap()["status"]["allowed"]
            == true
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
        // An approval says what allowed it.
        let alice = Identity::User {
            name: "alice".into(),
            groups: vec![],
        };
        let body = json!({"spec": {"resourceAttributes": {"verb": "create", "group": "authorization.k8s.io", "resource": "selfsubjectaccessreviews"}}});
        let r = review(&authz(), kind("selfsubjectaccessreviews"), &alice, &body).unwrap();
        assert_eq!(
            r["status"]["reason"],
            "RBAC: allowed by ClusterRoleBinding \"system:basic-user/system:basic-user\" of ClusterRole \"system:basic-user\" to Group \"system:authenticated\"",
            "{r}"
        );
        assert!(
            review(
                &authz(),
                kind("selfsubjectaccessreviews"),
                &east,
                &json!({"spec": {}})
            )
            .is_err()
        );
    }

    #[test]
    fn whoami_rules_and_reviews_of_others() {
        let authz = authz();
        let east = Identity::Cluster {
            name: "east".into(),
        };
        let me = review(&authz, kind("selfsubjectreviews"), &east, &json!({})).unwrap();
        assert_eq!(me["status"]["userInfo"]["username"], "system:cluster:east");
        assert_eq!(
            me["status"]["userInfo"]["groups"],
            json!(["system:clusters", "system:authenticated"])
        );
        let rules = |ns: &str| {
            let body = json!({"spec": {"namespace": ns}});
            review(&authz, kind("selfsubjectrulesreviews"), &east, &body).unwrap()["status"]
                ["resourceRules"]
                .as_array()
                .unwrap()
                .len()
        };
        // Its own three rules (its Cluster, the Cluster's status, its ClusterMetrics' status),
        // its Works' two where they are, and the basic user's two self-review rules.
        assert_eq!(rules("orrery-cluster-east"), 7);
        assert_eq!(rules("default"), 5);
        let admin = Identity::Admin {
            name: "admin".into(),
        };
        let sar = |user: &str| {
            let body = json!({"spec": {"user": user, "resourceAttributes": {"verb": "list", "group": "multicluster.io", "resource": "works", "namespace": "orrery-cluster-east"}}});
            review(&authz, kind("subjectaccessreviews"), &admin, &body).unwrap()["status"]
                ["allowed"]
                .clone()
        };
        assert_eq!(sar("system:cluster:east"), json!(true));
        assert_eq!(sar("system:cluster:west"), json!(false));
        assert_eq!(sar("mallory"), json!(false));
        // The subject's groups are what the review says, nothing added.
        let basic = |groups: Value| {
            let body = json!({"spec": {"user": "bob", "groups": groups, "resourceAttributes": {"verb": "create", "group": "authorization.k8s.io", "resource": "selfsubjectaccessreviews"}}});
            review(&authz, kind("subjectaccessreviews"), &admin, &body).unwrap()["status"]
                ["allowed"]
                .clone()
        };
        assert_eq!(basic(json!(["system:authenticated"])), json!(true));
        assert_eq!(basic(json!([])), json!(false));
        assert_eq!(basic(json!(["system:masters"])), json!(true));
    }
}
