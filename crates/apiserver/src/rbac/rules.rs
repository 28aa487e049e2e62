//! RBAC policy rules: what one rule allows, and whether one set of rules covers another (the
//! escalation check). Pure; the matching follows Kubernetes' `rbac/v1` evaluation helpers and
//! `ruleCovers` to the letter, so a role means here what it means there.

use serde::{Deserialize, Serialize};

use crate::auth::Attributes;

/// `rbacv1.PolicyRule`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    #[serde(default)]
    pub verbs: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub api_groups: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resource_names: Vec<String>,
    #[serde(
        default,
        rename = "nonResourceURLs",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub non_resource_urls: Vec<String>,
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// `list` holds `"*"` or `v`.
fn has(list: &[String], v: &str) -> bool {
    list.iter().any(|x| x == "*" || x == v)
}

fn url_matches(rule_url: &str, path: &str) -> bool {
    rule_url == "*"
        || rule_url == path
        || rule_url
            .strip_suffix('*')
            .is_some_and(|prefix| path.starts_with(prefix))
}

impl Rule {
    /// A rule on resources.
    pub fn on(verbs: &[&str], groups: &[&str], resources: &[&str]) -> Self {
        Rule {
            verbs: strings(verbs),
            api_groups: strings(groups),
            resources: strings(resources),
            ..Rule::default()
        }
    }

    /// A rule on non-resource URLs.
    pub fn urls(verbs: &[&str], urls: &[&str]) -> Self {
        Rule {
            verbs: strings(verbs),
            non_resource_urls: strings(urls),
            ..Rule::default()
        }
    }

    /// The same rule, limited to the named objects.
    pub fn named(mut self, names: &[&str]) -> Self {
        self.resource_names = strings(names);
        self
    }

    /// Whether the rule allows a request on a resource.
    pub fn allows(&self, a: &Attributes<'_>) -> bool {
        has(&self.verbs, a.verb)
            && has(&self.api_groups, a.group)
            && self.resource_matches(a.resource, a.subresource)
            && (self.resource_names.is_empty()
                || a.name
                    .is_some_and(|n| self.resource_names.iter().any(|x| x == n)))
    }

    fn resource_matches(&self, resource: &str, sub: Option<&str>) -> bool {
        self.resources.iter().any(|r| {
            if r == "*" {
                return true;
            }
            match sub {
                None => r == resource,
                Some(s) => {
                    r.strip_prefix("*/") == Some(s) || r.split_once('/') == Some((resource, s))
                }
            }
        })
    }

    /// Whether the rule allows `verb` (a lower-case HTTP verb) on a non-resource path.
    pub fn allows_url(&self, verb: &str, path: &str) -> bool {
        has(&self.verbs, verb) && self.non_resource_urls.iter().any(|u| url_matches(u, path))
    }

    /// The rule broken into rules of one verb, group, resource (and name) or URL each.
    fn atoms(&self) -> Vec<Rule> {
        let mut out = Vec::new();
        for group in &self.api_groups {
            for resource in &self.resources {
                for verb in &self.verbs {
                    let one = Rule {
                        verbs: vec![verb.clone()],
                        api_groups: vec![group.clone()],
                        resources: vec![resource.clone()],
                        ..Rule::default()
                    };
                    if self.resource_names.is_empty() {
                        out.push(one);
                    } else {
                        for name in &self.resource_names {
                            out.push(Rule {
                                resource_names: vec![name.clone()],
                                ..one.clone()
                            });
                        }
                    }
                }
            }
        }
        for url in &self.non_resource_urls {
            for verb in &self.verbs {
                out.push(Rule {
                    verbs: vec![verb.clone()],
                    non_resource_urls: vec![url.clone()],
                    ..Rule::default()
                });
            }
        }
        out
    }

    /// Whether this (owner's) rule grants everything `sub` does (Kubernetes' `ruleCovers`).
    fn covers(&self, sub: &Rule) -> bool {
        let has_all = |owner: &[String], wanted: &[String]| {
            owner.iter().any(|o| o == "*") || wanted.iter().all(|w| owner.contains(w))
        };
        let resources = self.resources.iter().any(|r| r == "*")
            || sub.resources.iter().all(|w| {
                self.resources.contains(w)
                    || w.split_once('/').is_some_and(|(res, s)| {
                        self.resources
                            .iter()
                            .any(|r| r.strip_prefix("*/") == Some(s) || *r == format!("{res}/*"))
                    })
            });
        let urls = sub
            .non_resource_urls
            .iter()
            .all(|w| self.non_resource_urls.iter().any(|o| url_matches(o, w)));
        let names = if sub.resource_names.is_empty() {
            self.resource_names.is_empty()
        } else {
            self.resource_names.is_empty()
                || sub
                    .resource_names
                    .iter()
                    .all(|n| self.resource_names.contains(n))
        };
        has_all(&self.verbs, &sub.verbs)
            && has_all(&self.api_groups, &sub.api_groups)
            && resources
            && urls
            && names
    }
}

/// What of `wanted` no rule of `owner` grants, one verb/resource/name each (empty: covered).
pub fn uncovered(owner: &[Rule], wanted: &[Rule]) -> Vec<Rule> {
    wanted
        .iter()
        .flat_map(Rule::atoms)
        .filter(|atom| !owner.iter().any(|o| o.covers(atom)))
        .collect()
}

/// A rule as Kubernetes prints it in a Forbidden message (`{APIGroups:["apps"], ...}`).
pub fn describe(r: &Rule) -> String {
    let list = |v: &[String]| {
        v.iter()
            .map(|s| format!("{s:?}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    if !r.non_resource_urls.is_empty() {
        return format!(
            "{{NonResourceURLs:[{}], Verbs:[{}]}}",
            list(&r.non_resource_urls),
            list(&r.verbs)
        );
    }
    let names = if r.resource_names.is_empty() {
        String::new()
    } else {
        format!(", ResourceNames:[{}]", list(&r.resource_names))
    };
    format!(
        "{{APIGroups:[{}], Resources:[{}]{names}, Verbs:[{}]}}",
        list(&r.api_groups),
        list(&r.resources),
        list(&r.verbs)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req<'a>(
        verb: &'a str,
        group: &'a str,
        resource: &'a str,
        sub: Option<&'a str>,
        name: Option<&'a str>,
    ) -> Attributes<'a> {
        Attributes {
            verb,
            group,
            resource,
            subresource: sub,
            namespace: Some("ns"),
            name,
        }
    }

    #[test]
    fn a_rule_allows_what_kubernetes_would() {
        let pods = Rule::on(&["get", "list"], &[""], &["pods"]);
        let status = Rule::on(&["update"], &["apps"], &["*/status"]);
        let any = Rule::on(&["*"], &["*"], &["*"]);
        let named = Rule::on(&["get"], &[""], &["configmaps"]).named(&["app"]);
        let scale = Rule::on(&["patch"], &["apps"], &["deployments/scale"]);
        let table: &[(&Rule, Attributes<'_>, bool)] = &[
            (&pods, req("get", "", "pods", None, Some("p")), true),
            (&pods, req("list", "", "pods", None, None), true),
            (&pods, req("delete", "", "pods", None, Some("p")), false),
            (&pods, req("get", "apps", "pods", None, Some("p")), false),
            // A resource's rule does not reach its subresources.
            (
                &pods,
                req("get", "", "pods", Some("status"), Some("p")),
                false,
            ),
            (
                &status,
                req("update", "apps", "deployments", Some("status"), Some("d")),
                true,
            ),
            (
                &status,
                req("update", "apps", "deployments", None, Some("d")),
                false,
            ),
            (
                &scale,
                req("patch", "apps", "deployments", Some("scale"), Some("d")),
                true,
            ),
            (
                &scale,
                req("patch", "apps", "statefulsets", Some("scale"), Some("d")),
                false,
            ),
            (
                &any,
                req("deletecollection", "x.io", "things", Some("status"), None),
                true,
            ),
            (
                &named,
                req("get", "", "configmaps", None, Some("app")),
                true,
            ),
            (
                &named,
                req("get", "", "configmaps", None, Some("other")),
                false,
            ),
            // A named rule never allows a list (no name to match).
            (&named, req("get", "", "configmaps", None, None), false),
        ];
        for (rule, a, want) in table {
            assert_eq!(rule.allows(a), *want, "{rule:?} {a:?}");
        }
        let urls = Rule::urls(&["get"], &["/healthz", "/apis/*"]);
        assert!(urls.allows_url("get", "/healthz"));
        assert!(urls.allows_url("get", "/apis/apps/v1"));
        assert!(!urls.allows_url("get", "/api"));
        assert!(!urls.allows_url("post", "/healthz"));
        // A non-resource rule allows no resource request, and the reverse.
        assert!(!urls.allows(&req("get", "", "pods", None, None)));
        assert!(!pods.allows_url("get", "/healthz"));
    }

    #[test]
    fn coverage_is_checked_per_verb_resource_and_name() {
        let owner = vec![
            Rule::on(
                &["get", "list", "watch"],
                &["", "apps"],
                &["pods", "deployments", "statefulsets"],
            ),
            Rule::on(&["*"], &[""], &["configmaps"]),
            Rule::on(&["update"], &["apps"], &["*/status"]),
            Rule::on(&["patch"], &["apps"], &["deployments/*"]),
            Rule::on(&["get"], &[""], &["secrets"]).named(&["mine"]),
            Rule::urls(&["get"], &["/healthz", "/metrics/*"]),
        ];
        let covered = [
            Rule::on(&["get"], &[""], &["pods"]),
            Rule::on(
                &["list", "watch"],
                &["apps"],
                &["deployments", "statefulsets"],
            ),
            Rule::on(&["create", "delete"], &[""], &["configmaps"]),
            Rule::on(&["update"], &["apps"], &["deployments/status"]),
            Rule::on(&["patch"], &["apps"], &["deployments/scale"]),
            Rule::on(&["get"], &[""], &["secrets"]).named(&["mine"]),
            Rule::urls(&["get"], &["/healthz", "/metrics/cadvisor"]),
        ];
        for r in &covered {
            assert!(
                uncovered(&owner, std::slice::from_ref(r)).is_empty(),
                "{r:?}"
            );
        }
        let not = [
            // A wildcard is covered only by a wildcard.
            Rule::on(&["*"], &[""], &["pods"]),
            Rule::on(&["get"], &["*"], &["pods"]),
            Rule::on(&["create"], &[""], &["pods"]),
            Rule::on(&["update"], &["apps"], &["deployments"]),
            Rule::on(&["patch"], &["apps"], &["statefulsets/scale"]),
            // Every secret is more than one named secret.
            Rule::on(&["get"], &[""], &["secrets"]),
            Rule::on(&["get"], &[""], &["secrets"]).named(&["yours"]),
            Rule::urls(&["get"], &["/metrics"]),
            Rule::urls(&["post"], &["/healthz"]),
        ];
        for r in &not {
            assert!(
                !uncovered(&owner, std::slice::from_ref(r)).is_empty(),
                "{r:?}"
            );
        }
        // What is missing, one atom each.
        let missing = uncovered(
            &owner,
            &[Rule::on(&["get", "create"], &[""], &["pods", "configmaps"])],
        );
        assert_eq!(missing, vec![Rule::on(&["create"], &[""], &["pods"])]);
        assert_eq!(
            describe(&missing[0]),
            r#"{APIGroups:[""], Resources:["pods"], Verbs:["create"]}"#
        );
    }
}
