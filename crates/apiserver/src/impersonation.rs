//! Kubernetes' user impersonation: a request with `Impersonate-User` (and optionally
//! `Impersonate-Group`, `Impersonate-Uid`, `Impersonate-Extra-<key>`) is served as that user,
//! once the caller is authorized for the `impersonate` verb on each thing it names: `users`
//! (or `serviceaccounts` in their namespace, for `system:serviceaccount:<ns>:<name>`),
//! `groups`, `uids` and `userextras/<key>` in `authentication.k8s.io`. A caller never acts as
//! itself while asking to be someone else: what it is not allowed is 403, and a header
//! Orrery does not know, or groups without a user, is 400. The audit log records both (`user`
//! the caller, `impersonatedUser` whom it acted as).

use std::collections::BTreeMap;

use http::HeaderMap;

use crate::auth::{Attributes, Identity};
use crate::error::{ApiError, ApiResult};
use crate::rbac::Authorizer;

const USER: &str = "impersonate-user";
const GROUP: &str = "impersonate-group";
const UID: &str = "impersonate-uid";
const EXTRA: &str = "impersonate-extra-";

/// Whom a request acts as, besides its user and groups.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Impersonated {
    /// The caller, as authenticated.
    pub by: Option<Identity>,
    pub uid: String,
    pub extra: BTreeMap<String, Vec<String>>,
}

tokio::task_local! {
    /// What the request being served impersonates (for `kubectl auth whoami`).
    pub static CURRENT: Option<Impersonated>;
}

/// The identity a request acts as: `who` itself when it asks for nobody else, else whom its
/// headers name, with what was impersonated.
pub fn apply(
    authz: &Authorizer,
    who: Identity,
    headers: &HeaderMap,
) -> ApiResult<(Identity, Option<Impersonated>)> {
    let mut user: Option<String> = None;
    let mut groups: Vec<String> = Vec::new();
    let mut uid: Option<String> = None;
    let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut any = false;
    for (name, value) in headers {
        let name = name.as_str();
        if !name.starts_with("impersonate-") {
            continue;
        }
        any = true;
        let value = value
            .to_str()
            .map_err(|_| ApiError::bad_request(format!("header {name} is not text")))?
            .to_string();
        match name {
            USER => {
                if user.replace(value).is_some() {
                    return Err(ApiError::bad_request(
                        "only one Impersonate-User may be given",
                    ));
                }
            }
            GROUP => groups.push(value),
            UID => {
                if uid.replace(value).is_some() {
                    return Err(ApiError::bad_request(
                        "only one Impersonate-Uid may be given",
                    ));
                }
            }
            _ if name.len() > EXTRA.len() && name.starts_with(EXTRA) => {
                // Keys travel percent-encoded (header names are case-insensitive).
                let key = percent_decode(&name[EXTRA.len()..]);
                extra.entry(key).or_default().push(value);
            }
            _ => {
                return Err(ApiError::bad_request(format!(
                    "unknown impersonation header {name:?}: use Impersonate-User, Impersonate-Group, Impersonate-Uid or Impersonate-Extra-<key>"
                )));
            }
        }
    }
    if !any {
        return Ok((who, None));
    }
    let Some(user) = user.filter(|u| !u.is_empty()) else {
        return Err(ApiError::bad_request(
            "requested impersonation of groups, a uid or extras without impersonating a user (Impersonate-User)",
        ));
    };
    let check = |resource: &str,
                 group: &str,
                 subresource: Option<&str>,
                 namespace: Option<&str>,
                 name: &str| {
        authz.authorize(
            &who,
            &Attributes {
                verb: "impersonate",
                group,
                resource,
                subresource,
                namespace,
                name: Some(name),
            },
        )
    };
    let service_account = user
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split_once(':'))
        .filter(|(ns, name)| !ns.is_empty() && !name.is_empty() && !name.contains(':'));
    let mut as_groups = Vec::new();
    match service_account {
        Some((ns, name)) => {
            check("serviceaccounts", "", None, Some(ns), name)?;
            // As Kubernetes: an impersonated ServiceAccount is in its groups.
            as_groups.push("system:serviceaccounts".to_string());
            as_groups.push(format!("system:serviceaccounts:{ns}"));
        }
        None => check("users", "", None, None, &user)?,
    }
    for g in &groups {
        check("groups", "", None, None, g)?;
        if !as_groups.contains(g) {
            as_groups.push(g.clone());
        }
    }
    if let Some(u) = &uid {
        check("uids", "authentication.k8s.io", None, None, u)?;
    }
    for (key, values) in &extra {
        for v in values {
            check("userextras", "authentication.k8s.io", Some(key), None, v)?;
        }
    }
    let acting = Identity::User {
        name: user,
        groups: as_groups,
    };
    Ok((
        acting,
        Some(Impersonated {
            by: Some(who),
            uid: uid.unwrap_or_default(),
            extra,
        }),
    ))
}

/// Decodes `%XX` escapes (an extra's key as it travels in a header name).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len() + 1
            && let Some(hex) = s.get(i + 1..i + 3)
            && let Ok(v) = u8::from_str_radix(hex, 16)
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use orrery_api::Object;
    use serde_json::json;

    fn role_and_binding(rules: serde_json::Value, user: &str) -> Vec<Object> {
        let mut role = Object::new("rbac.authorization.k8s.io/v1", "ClusterRole").with_name("imp");
        role.other.insert("rules".into(), rules);
        let mut b =
            Object::new("rbac.authorization.k8s.io/v1", "ClusterRoleBinding").with_name("imp");
        b.other.insert(
            "roleRef".into(),
            json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "imp"}),
        );
        b.other.insert(
            "subjects".into(),
            json!([{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": user}]),
        );
        vec![role, b]
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    fn bob() -> Identity {
        Identity::User {
            name: "bob".into(),
            groups: vec![],
        }
    }

    #[test]
    fn a_caller_acts_as_whom_it_may_impersonate_and_never_as_itself_instead() {
        let authz = Authorizer::from_objects(&role_and_binding(
            json!([
                {"apiGroups": [""], "resources": ["users"], "verbs": ["impersonate"], "resourceNames": ["alice"]},
                {"apiGroups": [""], "resources": ["groups"], "verbs": ["impersonate"], "resourceNames": ["devs"]},
                {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["impersonate"]},
                {"apiGroups": ["authentication.k8s.io"], "resources": ["uids"], "verbs": ["impersonate"]},
                {"apiGroups": ["authentication.k8s.io"], "resources": ["userextras/scopes"], "verbs": ["impersonate"]},
            ]),
            "bob",
        ));
        // No headers: bob himself.
        let (who, imp) = apply(&authz, bob(), &HeaderMap::new()).unwrap();
        assert_eq!((who, imp), (bob(), None));
        // Alice in devs, with a uid and an extra.
        let (who, imp) = apply(
            &authz,
            bob(),
            &headers(&[
                ("Impersonate-User", "alice"),
                ("Impersonate-Group", "devs"),
                ("Impersonate-Uid", "u-1"),
                ("Impersonate-Extra-Scopes", "view"),
            ]),
        )
        .unwrap();
        assert_eq!(
            who,
            Identity::User {
                name: "alice".into(),
                groups: vec!["devs".into()]
            }
        );
        let imp = imp.unwrap();
        assert_eq!(imp.by, Some(bob()));
        assert_eq!(imp.uid, "u-1");
        assert_eq!(imp.extra["scopes"], ["view"]);
        // A ServiceAccount, with its groups.
        let (who, _) = apply(
            &authz,
            bob(),
            &headers(&[("Impersonate-User", "system:serviceaccount:team-a:robot")]),
        )
        .unwrap();
        assert_eq!(
            who.groups(),
            [
                "system:serviceaccounts",
                "system:serviceaccounts:team-a",
                "system:authenticated"
            ]
        );
        // What bob may not: 403 in Kubernetes' words, never bob's own rights.
        for (hs, says) in [
            (
                vec![("Impersonate-User", "carol")],
                "users \"carol\" is forbidden: User \"bob\" cannot impersonate resource \"users\" in API group \"\" at the cluster scope",
            ),
            (
                vec![
                    ("Impersonate-User", "alice"),
                    ("Impersonate-Group", "system:masters"),
                ],
                "cannot impersonate resource \"groups\"",
            ),
            (
                vec![
                    ("Impersonate-User", "alice"),
                    ("Impersonate-Extra-Other", "x"),
                ],
                "cannot impersonate resource \"userextras/other\"",
            ),
        ] {
            let e = apply(&authz, bob(), &headers(&hs)).unwrap_err();
            assert_eq!(e.code, 403, "{hs:?}: {e:?}");
            assert!(e.message.contains(says), "{hs:?}: {}", e.message);
        }
        // Groups without a user, or a header nobody knows: 400.
        for hs in [
            vec![("Impersonate-Group", "devs")],
            vec![("Impersonate-User", "alice"), ("Impersonate-Someone", "x")],
        ] {
            assert_eq!(
                apply(&authz, bob(), &headers(&hs)).unwrap_err().code,
                400,
                "{hs:?}"
            );
        }
    }

    #[test]
    fn extra_keys_are_percent_decoded() {
        assert_eq!(percent_decode("acme.com%2fproject"), "acme.com/project");
        assert_eq!(percent_decode("plain"), "plain");
        assert_eq!(percent_decode("bad%zz"), "bad%zz");
        assert_eq!(percent_decode("end%2"), "end%2");
    }
}
