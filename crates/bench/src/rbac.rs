//! The cost of one RBAC decision with many bindings: the authorizer the API server asks on
//! every request, in process, over the default roles plus `bindings` RoleBindings spread over
//! namespaces, users and groups (a large multi-tenant fleet's worth).

use std::hint::black_box;
use std::time::Instant;

use orrery_api::Object;
use orrery_apiserver::auth::{Attributes, Identity};
use orrery_apiserver::rbac::{Authorizer, defaults};
use serde_json::json;

use crate::stats::{emit, median, progress, round};

fn binding(ns: &str, name: &str, role: &str, subject: (&str, &str)) -> Object {
    let mut o = Object::new("rbac.authorization.k8s.io/v1", "RoleBinding").with_name(name);
    o.metadata.namespace = ns.into();
    o.other.insert(
        "roleRef".into(),
        json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role}),
    );
    o.other.insert(
        "subjects".into(),
        json!([{"apiGroup": "rbac.authorization.k8s.io", "kind": subject.0, "name": subject.1}]),
    );
    o
}

pub fn decisions(bindings: usize, checks: usize, runs: usize) -> anyhow::Result<()> {
    let namespaces = (bindings / 10).max(1);
    let mut objects = defaults::objects();
    let roles = ["view", "edit", "admin"];
    for i in 0..bindings {
        let ns = format!("team-{}", i % namespaces);
        // Half to users, half to groups; every user is in two groups.
        let subject = if i % 2 == 0 {
            ("User", format!("user-{}", i % 5000))
        } else {
            ("Group", format!("group-{}", i % 500))
        };
        objects.push(binding(
            &ns,
            &format!("b-{i}"),
            roles[i % roles.len()],
            (subject.0, &subject.1),
        ));
    }
    let build = Instant::now();
    let authz = Authorizer::from_objects(&objects);
    let build_ms = build.elapsed().as_secs_f64() * 1000.0;
    let users: Vec<Identity> = (0..1000)
        .map(|u| Identity::User {
            name: format!("user-{}", u * 5 % 5000),
            groups: vec![
                format!("group-{}", u % 500),
                format!("group-{}", (u + 7) % 500),
            ],
        })
        .collect();
    // Each user's own binding is in this namespace: half the checks are asked there (where
    // rules must be read), half elsewhere (where the index has to say no).
    let homes: Vec<String> = (0..1000)
        .map(|u| format!("team-{}", (u * 5 % 5000) % namespaces))
        .collect();
    let verbs = ["get", "list", "create", "delete", "watch"];
    let resources = [
        ("apps", "deployments"),
        ("", "configmaps"),
        ("", "secrets"),
        ("", "pods"),
    ];
    let mut per_check = Vec::new();
    let mut allowed_share = Vec::new();
    for run in 0..runs {
        progress(format!(
            "rbac decisions: run {}/{runs} ({bindings} bindings)",
            run + 1
        ));
        let nss: Vec<String> = (0..64)
            .map(|i| format!("team-{}", (i * 37 + run) % namespaces))
            .collect();
        let started = Instant::now();
        let mut allowed = 0usize;
        for i in 0..checks {
            let (group, resource) = resources[i % resources.len()];
            let a = Attributes {
                verb: verbs[i % verbs.len()],
                group,
                resource,
                subresource: None,
                namespace: Some(if i % 2 == 0 {
                    &homes[i % users.len()]
                } else {
                    &nss[i % nss.len()]
                }),
                name: None,
            };
            if black_box(authz.decide(&users[i % users.len()], &a)).allowed {
                allowed += 1;
            }
        }
        per_check.push(started.elapsed().as_secs_f64() * 1e6 / checks as f64);
        allowed_share.push(allowed as f64 / checks as f64);
    }
    emit(json!({
        "scenario": "rbac.decision",
        "bindings": bindings,
        "namespaces": namespaces,
        "checks_per_run": checks,
        "decision_us": round(median(&per_check), 3),
        "decision_us_samples": per_check.iter().map(|v| round(*v, 3)).collect::<Vec<_>>(),
        "allowed_share": round(median(&allowed_share), 3),
        "index_build_ms": round(build_ms, 1),
        "runs": runs,
    }));
    Ok(())
}
