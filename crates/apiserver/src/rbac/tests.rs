use serde_json::json;

use super::*;

fn obj(kind: &str, ns: &str, name: &str, rest: Value) -> Object {
    let mut o = Object::new(format!("{GROUP}/v1"), kind).with_name(name);
    if kind == "ServiceAccount" {
        o.api_version = "v1".into();
    }
    o.metadata.namespace = ns.into();
    if let Value::Object(m) = rest {
        for (k, v) in m {
            if k == "labels" {
                o.metadata.labels = serde_json::from_value(v).unwrap();
            } else {
                o.other.insert(k, v);
            }
        }
    }
    o
}

fn role(ns: &str, name: &str, rules: Value) -> Object {
    let kind = if ns.is_empty() { "ClusterRole" } else { "Role" };
    obj(kind, ns, name, json!({ "rules": rules }))
}

fn bind(ns: &str, name: &str, role_kind: &str, role: &str, subjects: Value) -> Object {
    let kind = if ns.is_empty() {
        "ClusterRoleBinding"
    } else {
        "RoleBinding"
    };
    obj(
        kind,
        ns,
        name,
        json!({"roleRef": {"apiGroup": GROUP, "kind": role_kind, "name": role}, "subjects": subjects}),
    )
}

fn user(name: &str, groups: &[&str]) -> Identity {
    Identity::User {
        name: name.into(),
        groups: groups.iter().map(|g| g.to_string()).collect(),
    }
}

fn attrs<'a>(
    verb: &'a str,
    group: &'a str,
    resource: &'a str,
    ns: Option<&'a str>,
    name: Option<&'a str>,
) -> Attributes<'a> {
    Attributes {
        verb,
        group,
        resource,
        subresource: None,
        namespace: ns,
        name,
    }
}

fn with_defaults(more: Vec<Object>) -> Arc<Authorizer> {
    let mut all = defaults::objects();
    all.extend(more);
    Authorizer::from_objects(&all)
}

#[test]
fn view_in_one_namespace_reads_there_only() {
    let authz = with_defaults(vec![bind(
        "team-a",
        "alice-view",
        "ClusterRole",
        "view",
        json!([{"kind": "User", "apiGroup": GROUP, "name": "alice"}]),
    )]);
    let alice = user("alice", &[]);
    let table = [
        (
            attrs("get", "apps", "deployments", Some("team-a"), Some("web")),
            true,
        ),
        (attrs("list", "", "configmaps", Some("team-a"), None), true),
        (attrs("watch", "", "pods", Some("team-a"), None), true),
        // Orrery's own kinds are in view through the aggregation labels.
        (
            attrs(
                "list",
                "policy.karmada.io",
                "propagationpolicies",
                Some("team-a"),
                None,
            ),
            true,
        ),
        // view reads no Secrets, writes nothing, and holds only where it is bound.
        (
            attrs("get", "", "secrets", Some("team-a"), Some("s")),
            false,
        ),
        (
            attrs("create", "apps", "deployments", Some("team-a"), None),
            false,
        ),
        (
            attrs("delete", "", "configmaps", Some("team-a"), Some("c")),
            false,
        ),
        (
            attrs("list", "apps", "deployments", Some("team-b"), None),
            false,
        ),
        (attrs("list", "apps", "deployments", None, None), false),
        (
            attrs("list", "multicluster.io", "works", Some("team-a"), None),
            false,
        ),
    ];
    for (a, want) in &table {
        assert_eq!(authz.decide(&alice, a).allowed, *want, "{a:?}");
    }
    let e = authz
        .authorize(
            &alice,
            &attrs("create", "apps", "deployments", Some("team-a"), None),
        )
        .unwrap_err();
    assert_eq!(e.code, 403);
    assert_eq!(
        e.message,
        "deployments.apps is forbidden: User \"alice\" cannot create resource \"deployments\" in API group \"apps\" in the namespace \"team-a\""
    );
    // Everyone authenticated may ask about themselves and read discovery.
    let bob = user("bob", &[]);
    assert!(
        authz
            .decide(
                &bob,
                &attrs(
                    "create",
                    "authorization.k8s.io",
                    "selfsubjectaccessreviews",
                    None,
                    None
                )
            )
            .allowed
    );
    assert!(authz.decide_path(&bob, "get", "/apis/apps/v1").allowed);
    assert!(!authz.decide_path(&bob, "get", "/metrics").allowed);
    assert!(
        !authz
            .decide(
                &bob,
                &attrs("get", "apps", "deployments", Some("team-a"), None)
            )
            .allowed
    );
}

#[test]
fn groups_service_accounts_and_role_kinds_are_matched_as_kubernetes_does() {
    let authz = Authorizer::from_objects(&[
        role(
            "ops",
            "cm-writer",
            json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]}]),
        ),
        role(
            "",
            "node-reader",
            json!([{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]),
        ),
        bind(
            "ops",
            "devs",
            "Role",
            "cm-writer",
            json!([{"kind": "Group", "name": "devs"}]),
        ),
        // A ServiceAccount subject without a namespace is the binding's namespace's.
        bind(
            "ops",
            "robot",
            "Role",
            "cm-writer",
            json!([{"kind": "ServiceAccount", "name": "robot"}]),
        ),
        bind(
            "",
            "nodes",
            "ClusterRole",
            "node-reader",
            json!([{"kind": "Group", "name": "system:serviceaccounts:ops"}]),
        ),
        // A ClusterRoleBinding to a Role grants nothing.
        bind(
            "",
            "bogus",
            "Role",
            "cm-writer",
            json!([{"kind": "User", "name": "eve"}]),
        ),
        // A binding to a role that does not exist grants nothing (until it exists).
        bind(
            "ops",
            "later",
            "Role",
            "not-yet",
            json!([{"kind": "User", "name": "carol"}]),
        ),
    ]);
    let dev = user("dave", &["devs"]);
    let cm = attrs("update", "", "configmaps", Some("ops"), Some("x"));
    assert!(authz.decide(&dev, &cm).allowed);
    assert!(
        !authz
            .decide(
                &dev,
                &attrs("update", "", "configmaps", Some("dev"), Some("x"))
            )
            .allowed
    );
    let robot = Identity::ServiceAccount {
        namespace: "ops".into(),
        name: "robot".into(),
        uid: "u1".into(),
    };
    assert!(authz.decide(&robot, &cm).allowed);
    assert!(
        authz
            .decide(&robot, &attrs("get", "", "nodes", None, Some("n1")))
            .allowed
    );
    let other_robot = Identity::ServiceAccount {
        namespace: "dev".into(),
        name: "robot".into(),
        uid: "u2".into(),
    };
    assert!(!authz.decide(&other_robot, &cm).allowed);
    assert!(!authz.decide(&user("eve", &[]), &cm).allowed);
    let carol = user("carol", &[]);
    let pods = attrs("list", "", "pods", Some("ops"), None);
    assert!(!authz.decide(&carol, &pods).allowed);
    authz.observe(
        &role(
            "ops",
            "not-yet",
            json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]),
        ),
        false,
    );
    assert!(authz.decide(&carol, &pods).allowed);
}

#[test]
fn changes_to_bindings_and_roles_take_effect_in_place() {
    let authz = Authorizer::from_objects(&[role(
        "",
        "reader",
        json!([{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get"]}]),
    )]);
    let frank = user("frank", &[]);
    let get = attrs("get", "apps", "deployments", Some("x"), Some("d"));
    let mut b = bind(
        "",
        "frank",
        "ClusterRole",
        "reader",
        json!([{"kind": "User", "name": "frank"}]),
    );
    b.metadata.resource_version = "5".into();
    authz.observe(&b, false);
    assert!(authz.decide(&frank, &get).allowed);
    // An older version of the binding (a watch catching up) changes nothing.
    let mut older = bind(
        "",
        "frank",
        "ClusterRole",
        "reader",
        json!([{"kind": "User", "name": "george"}]),
    );
    older.metadata.resource_version = "4".into();
    authz.observe(&older, false);
    assert!(authz.decide(&frank, &get).allowed);
    // A newer one moves the grant.
    older.metadata.resource_version = "6".into();
    authz.observe(&older, false);
    assert!(!authz.decide(&frank, &get).allowed);
    assert!(authz.decide(&user("george", &[]), &get).allowed);
    // Deleting the role takes the grant away; so does deleting the binding.
    let mut r = role("", "reader", json!([]));
    r.metadata.resource_version = "7".into();
    authz.observe(&r, true);
    assert!(!authz.decide(&user("george", &[]), &get).allowed);
}

#[test]
fn aggregated_roles_take_the_rules_of_what_they_select_at_any_depth() {
    let authz = Authorizer::from_objects(&[
        obj(
            "ClusterRole",
            "",
            "top",
            json!({"aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"to-top": "true"}}]}}),
        ),
        obj(
            "ClusterRole",
            "",
            "middle",
            json!({"labels": {"to-top": "true"}, "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"to-middle": "true"}}]}}),
        ),
        obj(
            "ClusterRole",
            "",
            "leaf",
            json!({"labels": {"to-middle": "true"}, "rules": [{"apiGroups": ["x.io"], "resources": ["things"], "verbs": ["get"]}]}),
        ),
        bind(
            "",
            "h",
            "ClusterRole",
            "top",
            json!([{"kind": "User", "name": "h"}]),
        ),
        // Two aggregated roles that select each other do not loop.
        obj(
            "ClusterRole",
            "",
            "a",
            json!({"labels": {"ring": "true"}, "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"ring": "true"}}]}}),
        ),
        obj(
            "ClusterRole",
            "",
            "b",
            json!({"labels": {"ring": "true"}, "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"ring": "true"}}]}}),
        ),
    ]);
    let h = user("h", &[]);
    let get = attrs("get", "x.io", "things", None, Some("t"));
    assert!(authz.decide(&h, &get).allowed);
    // A new role labelled into the leaf's level reaches the top.
    authz.observe(
        &obj("ClusterRole", "", "more", json!({"labels": {"to-middle": "true"}, "rules": [{"apiGroups": ["x.io"], "resources": ["things"], "verbs": ["list"]}]})),
        false,
    );
    assert!(
        authz
            .decide(&h, &attrs("list", "x.io", "things", None, None))
            .allowed
    );
    // The default admin holds edit's and view's rules.
    let defaults = with_defaults(vec![bind(
        "t",
        "ad",
        "ClusterRole",
        "admin",
        json!([{"kind": "User", "name": "ann"}]),
    )]);
    let ann = user("ann", &[]);
    for a in [
        attrs("create", "apps", "deployments", Some("t"), None),
        attrs("get", "", "secrets", Some("t"), Some("s")),
        attrs("create", GROUP, "rolebindings", Some("t"), None),
        attrs("list", "", "pods", Some("t"), None),
        attrs(
            "create",
            "policy.karmada.io",
            "propagationpolicies",
            Some("t"),
            None,
        ),
    ] {
        assert!(defaults.decide(&ann, &a).allowed, "{a:?}");
    }
}

/// Bindings and Works are the controllers': `edit` writes neither (a binding names what is
/// sent to members), nor cluster-scoped kinds even when bound cluster-wide; `view` reads
/// bindings.
#[test]
fn edit_writes_policies_but_not_bindings_works_or_cluster_scoped_kinds() {
    let authz = with_defaults(vec![
        bind(
            "team-a",
            "robot-edit",
            "ClusterRole",
            "edit",
            json!([{"kind": "User", "name": "robot"}]),
        ),
        bind(
            "team-a",
            "viewer",
            "ClusterRole",
            "view",
            json!([{"kind": "User", "name": "viewer"}]),
        ),
    ]);
    let robot = user("robot", &[]);
    let viewer = user("viewer", &[]);
    let mc = "multicluster.io";
    for (a, want) in [
        (
            attrs(
                "create",
                mc,
                "resourceplacementpolicies",
                Some("team-a"),
                None,
            ),
            true,
        ),
        (
            attrs("create", mc, "migrations", Some("team-a"), None),
            true,
        ),
        (
            attrs("get", mc, "resourcebindings", Some("team-a"), Some("b")),
            true,
        ),
        (
            attrs("create", mc, "resourcebindings", Some("team-a"), None),
            false,
        ),
        (
            attrs("patch", mc, "resourcebindings", Some("team-a"), Some("b")),
            false,
        ),
        (
            attrs("update", mc, "resourcebindings", Some("team-a"), Some("b")),
            false,
        ),
        (
            attrs("delete", mc, "resourcebindings", Some("team-a"), Some("b")),
            false,
        ),
        (attrs("create", mc, "works", Some("team-a"), None), false),
        (attrs("get", mc, "works", Some("team-a"), Some("w")), false),
    ] {
        assert_eq!(authz.decide(&robot, &a).allowed, want, "robot {a:?}");
    }
    assert!(
        authz
            .decide(
                &viewer,
                &attrs("list", mc, "resourcebindings", Some("team-a"), None)
            )
            .allowed
    );
    // Bound cluster-wide, edit still writes no cluster-scoped kind of Orrery's.
    let wide = Authorizer::from_objects(&{
        let mut all = defaults::objects();
        all.push(bind(
            "",
            "wide-edit",
            "ClusterRole",
            "edit",
            json!([{"kind": "User", "name": "robot"}]),
        ));
        all
    });
    for a in [
        attrs("create", mc, "clusters", None, None),
        attrs("update", mc, "clusters", None, Some("c1")),
        attrs(
            "create",
            "policy.karmada.io",
            "clusterpropagationpolicies",
            None,
            None,
        ),
    ] {
        assert!(!wide.decide(&robot, &a).allowed, "{a:?}");
    }
    assert!(
        wide.decide(
            &robot,
            &attrs(
                "create",
                "policy.karmada.io",
                "propagationpolicies",
                Some("x"),
                None
            )
        )
        .allowed
    );
}

#[test]
fn agents_keep_to_their_own_cluster() {
    let authz = with_defaults(Vec::new());
    let east = Identity::Cluster {
        name: "east".into(),
    };
    let mc = |verb: &'static str,
              resource: &'static str,
              sub: Option<&'static str>,
              ns: Option<&'static str>,
              name: Option<&'static str>| Attributes {
        verb,
        group: "multicluster.io",
        resource,
        subresource: sub,
        namespace: ns,
        name,
    };
    let ok = [
        mc("list", "works", None, Some("orrery-cluster-east"), None),
        mc("watch", "works", None, Some("orrery-cluster-east"), None),
        mc("get", "works", None, Some("orrery-cluster-east"), Some("w")),
        mc(
            "patch",
            "works",
            Some("status"),
            Some("orrery-cluster-east"),
            Some("w"),
        ),
        mc("update", "clusters", Some("status"), None, Some("east")),
        mc("get", "clusters", None, None, Some("east")),
    ];
    for a in &ok {
        assert!(authz.authorize(&east, a).is_ok(), "{a:?}");
    }
    let denied = [
        mc("list", "works", None, Some("orrery-cluster-west"), None),
        mc(
            "patch",
            "works",
            Some("status"),
            Some("orrery-cluster-west"),
            Some("w"),
        ),
        mc(
            "update",
            "works",
            None,
            Some("orrery-cluster-east"),
            Some("w"),
        ),
        mc("create", "works", None, Some("orrery-cluster-east"), None),
        mc("update", "clusters", Some("status"), None, Some("west")),
        mc("update", "clusters", None, None, Some("east")),
        mc("delete", "clusters", None, None, Some("east")),
        mc("list", "clusters", None, None, None),
    ];
    for a in &denied {
        assert_eq!(authz.authorize(&east, a).unwrap_err().code, 403, "{a:?}");
    }
    let e = authz
        .authorize(
            &east,
            &mc("list", "works", None, Some("orrery-cluster-west"), None),
        )
        .unwrap_err();
    assert_eq!(
        e.message,
        "works.multicluster.io is forbidden: User \"system:cluster:east\" cannot list resource \"works\" in API group \"multicluster.io\" in the namespace \"orrery-cluster-west\""
    );
    // A bootstrap token reads nothing.
    let boot = Identity::Bootstrap {
        name: "east".into(),
    };
    assert!(
        authz
            .authorize(&boot, &mc("get", "clusters", None, None, Some("east")))
            .is_err()
    );
    let admin = Identity::Admin {
        name: "admin".into(),
    };
    assert!(
        authz
            .authorize(&admin, &mc("delete", "clusters", None, None, Some("x")))
            .is_ok()
    );
}

#[test]
fn nobody_grants_what_they_do_not_hold() {
    let authz = with_defaults(vec![
        bind(
            "t",
            "ann-admin",
            "ClusterRole",
            "admin",
            json!([{"kind": "User", "name": "ann"}]),
        ),
        bind(
            "t",
            "ed-edit",
            "ClusterRole",
            "edit",
            json!([{"kind": "User", "name": "ed"}]),
        ),
        role(
            "",
            "escalator",
            json!([{"apiGroups": [GROUP], "resources": ["roles"], "verbs": ["escalate"]}]),
        ),
        bind(
            "t",
            "esc",
            "ClusterRole",
            "escalator",
            json!([{"kind": "User", "name": "ed"}]),
        ),
        role(
            "",
            "binder",
            json!([{"apiGroups": [GROUP], "resources": ["clusterroles"], "verbs": ["bind"], "resourceNames": ["cluster-admin"]}]),
        ),
        bind(
            "t",
            "bnd",
            "ClusterRole",
            "binder",
            json!([{"kind": "User", "name": "ann"}]),
        ),
    ]);
    let ann = user("ann", &[]);
    // A namespace admin may hand out edit and view there, and write roles within its rights.
    assert!(
        authz
            .admit(
                &ann,
                &bind(
                    "t",
                    "x",
                    "ClusterRole",
                    "edit",
                    json!([{"kind": "User", "name": "z"}])
                )
            )
            .is_ok()
    );
    assert!(authz.admit(&ann, &role("t", "r", json!([{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "create"]}]))).is_ok());
    // Not a role with more than it holds, nor in another namespace.
    let e = authz
        .admit(
            &ann,
            &role(
                "t",
                "r",
                json!([{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]),
            ),
        )
        .unwrap_err();
    assert_eq!(e.code, 403);
    assert!(
        e.message
            .contains("attempting to grant RBAC permissions not currently held"),
        "{}",
        e.message
    );
    assert!(
        e.message
            .contains(r#"{APIGroups:[""], Resources:["nodes"], Verbs:["get"]}"#),
        "{}",
        e.message
    );
    assert!(
        authz
            .admit(
                &ann,
                &role(
                    "u",
                    "r",
                    json!([{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get"]}])
                )
            )
            .is_err()
    );
    // Binding cluster-admin in its namespace: allowed by the `bind` verb on that one role.
    assert!(
        authz
            .admit(
                &ann,
                &bind(
                    "t",
                    "y",
                    "ClusterRole",
                    "cluster-admin",
                    json!([{"kind": "User", "name": "z"}])
                )
            )
            .is_ok()
    );
    // An editor may hand out view (it holds all of it) but not admin.
    let ed = user("ed", &[]);
    assert!(
        authz
            .admit(
                &ed,
                &bind(
                    "t",
                    "x",
                    "ClusterRole",
                    "admin",
                    json!([{"kind": "User", "name": "z"}])
                )
            )
            .is_err()
    );
    assert!(
        authz
            .admit(
                &ed,
                &bind(
                    "t",
                    "x",
                    "ClusterRole",
                    "view",
                    json!([{"kind": "User", "name": "z"}])
                )
            )
            .is_ok()
    );
    // ...but with `escalate` on roles it may write any Role there.
    assert!(
        authz
            .admit(
                &ed,
                &role(
                    "t",
                    "r",
                    json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}])
                )
            )
            .is_ok()
    );
    // A binding to a role that does not exist is refused (nothing to compare with).
    assert!(
        authz
            .admit(&ann, &bind("t", "x", "Role", "ghost", json!([])))
            .is_err()
    );
    // The admin may do anything.
    let admin = Identity::Admin {
        name: "admin".into(),
    };
    assert!(
        authz
            .admit(
                &admin,
                &role(
                    "",
                    "all",
                    json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}])
                )
            )
            .is_ok()
    );
}

#[test]
fn service_accounts_are_known_by_uid() {
    let mut sa = obj("ServiceAccount", "ops", "robot", json!({}));
    sa.metadata.uid = "u1".into();
    sa.metadata.resource_version = "3".into();
    let authz = Authorizer::from_objects(std::slice::from_ref(&sa));
    assert!(authz.service_account_is("ops", "robot", "u1"));
    assert!(!authz.service_account_is("ops", "robot", "u0"));
    assert!(!authz.service_account_is("dev", "robot", "u1"));
    sa.metadata.resource_version = "4".into();
    authz.observe(&sa, true);
    assert!(!authz.service_account_is("ops", "robot", "u1"));
}

/// The aggregation writer fills aggregated roles' `rules` as Kubernetes' controller does, and
/// writing the defaults again at the next start leaves them be.
#[tokio::test]
async fn aggregated_rules_are_written_into_the_roles() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store: Arc<dyn Store> =
        Arc::new(orrery_store_sqlite::SqliteStore::open_dir(dir.path()).expect("open the store"));
    assert!(
        defaults::ensure(store.as_ref(), |_, _| {})
            .await
            .expect("defaults")
            > 0
    );
    let authz = Authorizer::start(store.clone()).await.expect("start");
    let (stop, shutdown) = tokio::sync::watch::channel(false);
    let writer = tokio::spawn(write_aggregated_rules(
        authz.clone(),
        store.clone(),
        orrery_runtime::metrics::ControllerMetrics::default().of("aggregation"),
        shutdown,
    ));
    let key = orrery_api::keys::object(GROUP, "clusterroles", None, "view");
    let mut rules = Vec::new();
    for _ in 0..100 {
        rules = rules_of(&store.get(&key).await.expect("view"));
        if !rules.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(
        rules
            .iter()
            .any(|r| r.resources.contains(&"configmaps".to_string())
                && r.verbs.contains(&"list".to_string())),
        "{rules:?}"
    );
    let admin_key = orrery_api::keys::object(GROUP, "clusterroles", None, "admin");
    for _ in 0..100 {
        if rules_of(&store.get(&admin_key).await.expect("admin")).len() > rules.len() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let before = store.get(&key).await.expect("view").revision();
    assert_eq!(
        defaults::ensure(store.as_ref(), |_, _| {})
            .await
            .expect("again"),
        0
    );
    assert_eq!(store.get(&key).await.expect("view").revision(), before);
    let _ = stop.send(true);
    writer.await.expect("the writer stops");
}
