//! Discovery: `/version`, `/api`, `/apis`, the per-group and per-version resource lists, and
//! the aggregated (v2) discovery document clients such as kubectl ask for first.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::resources::{Registry, ResourceType};

/// The Kubernetes API version this server implements (its schemas come from it).
pub const KUBE_MINOR: &str = "33";

pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": KUBE_MINOR,
        "gitVersion": format!("v1.{KUBE_MINOR}.0-orrery.{}", env!("CARGO_PKG_VERSION")),
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "",
        "goVersion": "",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, match std::env::consts::ARCH { "x86_64" => "amd64", "aarch64" => "arm64", a => a }),
    })
}

pub fn api_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{ "clientCIDR": "0.0.0.0/0", "serverAddress": server_address }],
    })
}

fn group_version(group: &str, version: &str) -> String {
    if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    }
}

fn group_entry(group: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({ "groupVersion": group_version(group, v), "version": v }))
        .collect();
    json!({ "name": group, "versions": vs, "preferredVersion": vs.first().cloned().unwrap_or(Value::Null) })
}

/// The groups served: the registry's, and those of the review kinds (create only, nothing
/// stored: see `reviews.rs`).
fn all_groups(reg: &Registry) -> Vec<(String, Vec<String>)> {
    let mut groups = reg.groups();
    for k in crate::reviews::KINDS {
        match groups.iter_mut().find(|(g, _)| g == k.group) {
            Some((_, vs)) if !vs.iter().any(|v| v == k.version) => vs.push(k.version.into()),
            Some(_) => {}
            None => groups.push((k.group.into(), vec![k.version.into()])),
        }
    }
    groups
}

fn reviews_in(
    group: &str,
    version: &str,
) -> impl Iterator<Item = &'static crate::reviews::ReviewKind> {
    let (group, version) = (group.to_string(), version.to_string());
    crate::reviews::KINDS
        .iter()
        .filter(move |k| k.group == group && k.version == version)
}

pub fn group_list(reg: &Registry) -> Value {
    let groups: Vec<Value> = all_groups(reg)
        .iter()
        .filter(|(g, _)| !g.is_empty())
        .map(|(g, vs)| group_entry(g, vs))
        .collect();
    json!({ "kind": "APIGroupList", "apiVersion": "v1", "groups": groups })
}

pub fn group(reg: &Registry, name: &str) -> Option<Value> {
    let (g, vs) = all_groups(reg)
        .into_iter()
        .find(|(g, _)| g == name && !g.is_empty())?;
    let mut v = group_entry(&g, &vs);
    v["kind"] = json!("APIGroup");
    v["apiVersion"] = json!("v1");
    Some(v)
}

fn storage_hash(rt: &ResourceType) -> String {
    let digest = Sha256::digest(format!("{}/{}/{}", rt.group, rt.version, rt.kind).as_bytes());
    STANDARD.encode(&digest[..8])
}

fn subresource_verbs() -> Value {
    json!(["get", "patch", "update"])
}

pub fn resource_list(reg: &Registry, group: &str, version: &str) -> Option<Value> {
    let types = reg.in_group_version(group, version);
    let mut resources = Vec::new();
    for k in reviews_in(group, version) {
        resources.push(json!({"name": k.plural, "singularName": k.kind.to_lowercase(), "namespaced": false, "kind": k.kind, "verbs": ["create"]}));
    }
    if types.is_empty() && resources.is_empty() {
        return None;
    }
    for rt in &types {
        resources.push(json!({
            "name": rt.plural,
            "singularName": rt.singular,
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": rt.verbs(),
            "shortNames": rt.short_names,
            "categories": rt.categories,
            "storageVersionHash": storage_hash(rt),
        }));
        if rt.status {
            resources.push(json!({"name": format!("{}/status", rt.plural), "singularName": "", "namespaced": rt.namespaced, "kind": rt.kind, "verbs": subresource_verbs()}));
        }
        if rt.scale.is_some() {
            resources.push(json!({"name": format!("{}/scale", rt.plural), "singularName": "", "namespaced": rt.namespaced, "group": "autoscaling", "version": "v1", "kind": "Scale", "verbs": subresource_verbs()}));
        }
        if rt.group.is_empty() && rt.kind == "ServiceAccount" {
            resources.push(json!({"name": "serviceaccounts/token", "singularName": "", "namespaced": true, "group": "authentication.k8s.io", "version": "v1", "kind": "TokenRequest", "verbs": ["create"]}));
        }
        if rt.group.is_empty() && rt.kind == "Namespace" {
            resources.push(json!({"name": "namespaces/finalize", "singularName": "", "namespaced": false, "kind": "Namespace", "verbs": ["update"]}));
        }
    }
    Some(
        json!({ "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version(group, version), "resources": resources }),
    )
}

fn aggregated_resource(rt: &ResourceType) -> Value {
    let mut subs = Vec::new();
    if rt.scale.is_some() {
        subs.push(json!({"subresource": "scale", "responseKind": {"group": "autoscaling", "version": "v1", "kind": "Scale"}, "verbs": subresource_verbs()}));
    }
    if rt.status {
        subs.push(json!({"subresource": "status", "responseKind": {"group": rt.group, "version": rt.version, "kind": rt.kind}, "verbs": subresource_verbs()}));
    }
    if rt.group.is_empty() && rt.kind == "ServiceAccount" {
        subs.push(json!({"subresource": "token", "responseKind": {"group": "authentication.k8s.io", "version": "v1", "kind": "TokenRequest"}, "verbs": ["create"]}));
    }
    if rt.group.is_empty() && rt.kind == "Namespace" {
        subs.push(json!({"subresource": "finalize", "responseKind": {"group": "", "version": "v1", "kind": "Namespace"}, "verbs": ["update"]}));
    }
    let mut r = json!({
        "resource": rt.plural,
        "responseKind": { "group": rt.group, "version": rt.version, "kind": rt.kind },
        "scope": if rt.namespaced { "Namespaced" } else { "Cluster" },
        "singularResource": rt.singular,
        "verbs": rt.verbs(),
    });
    if !rt.short_names.is_empty() {
        r["shortNames"] = json!(rt.short_names);
    }
    if !rt.categories.is_empty() {
        r["categories"] = json!(rt.categories);
    }
    if !subs.is_empty() {
        r["subresources"] = json!(subs);
    }
    r
}

/// The aggregated discovery document: the core group (`core`) or all other groups.
pub fn aggregated(reg: &Registry, core: bool, api_version: &str) -> Value {
    let items: Vec<Value> = all_groups(reg)
        .into_iter()
        .filter(|(g, _)| g.is_empty() == core)
        .map(|(g, vs)| {
            let versions: Vec<Value> = vs
                .iter()
                .map(|v| {
                    let resources: Vec<Value> = reg
                        .in_group_version(&g, v)
                        .iter()
                        .map(|rt| aggregated_resource(rt))
                        .chain(reviews_in(&g, v).map(|k| {
                            json!({
                                "resource": k.plural,
                                "responseKind": {"group": k.group, "version": k.version, "kind": k.kind},
                                "scope": "Cluster",
                                "singularResource": k.kind.to_lowercase(),
                                "verbs": ["create"],
                            })
                        }))
                        .collect();
                    json!({ "version": v, "resources": resources, "freshness": "Current" })
                })
                .collect();
            let mut meta = json!({ "creationTimestamp": null });
            if !g.is_empty() {
                meta["name"] = json!(g);
            }
            json!({ "metadata": meta, "versions": versions })
        })
        .collect();
    json!({ "kind": "APIGroupDiscoveryList", "apiVersion": api_version, "metadata": {}, "items": items })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::builtin;

    #[test]
    fn documents() {
        let reg = Registry::new(builtin());
        let groups = group_list(&reg);
        assert!(
            groups["groups"]
                .as_array()
                .unwrap()
                .iter()
                .any(|g| g["name"] == "apps" && g["preferredVersion"]["groupVersion"] == "apps/v1")
        );
        assert!(
            groups["groups"]
                .as_array()
                .unwrap()
                .iter()
                .all(|g| g["name"] != "")
        );
        let apps = resource_list(&reg, "apps", "v1").unwrap();
        let names: Vec<_> = apps["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert!(
            names.contains(&"deployments")
                && names.contains(&"deployments/scale")
                && names.contains(&"deployments/status")
        );
        let scale = apps["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "deployments/scale")
            .unwrap();
        assert_eq!(
            (scale["group"].as_str(), scale["kind"].as_str()),
            (Some("autoscaling"), Some("Scale"))
        );
        let core = aggregated(&reg, true, "apidiscovery.k8s.io/v2");
        assert_eq!(core["items"].as_array().unwrap().len(), 1);
        let pods = core["items"][0]["versions"][0]["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["resource"] == "pods")
            .unwrap();
        assert_eq!(pods["scope"], "Namespaced");
        assert_eq!(pods["shortNames"], json!(["po"]));
        let rest = aggregated(&reg, false, "apidiscovery.k8s.io/v2");
        let cl = rest["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["metadata"]["name"] == "multicluster.io")
            .unwrap();
        let clusters = cl["versions"][0]["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["resource"] == "clusters")
            .unwrap();
        assert_eq!(clusters["scope"], "Cluster");
        assert_eq!(clusters["shortNames"], json!(["cl"]));
        assert!(resource_list(&reg, "nope", "v1").is_none());
    }
}
