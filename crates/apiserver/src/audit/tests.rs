use super::*;
use http::Method;

fn info(method: Method, path: &str, query: Option<&str>) -> RequestInfo {
    request_info(&method, path, query)
}

fn obj(resource: &str, ns: &str, name: &str, group: &str, sub: &str) -> Option<ObjectRef> {
    Some(ObjectRef {
        resource: resource.into(),
        namespace: ns.into(),
        name: name.into(),
        api_group: group.into(),
        api_version: "v1".into(),
        subresource: sub.into(),
    })
}

#[test]
fn requests_are_read_as_kubernetes_reads_them() {
    let cases = [
        (
            Method::GET,
            "/api/v1/namespaces/default/pods",
            None,
            "list",
            obj("pods", "default", "", "", ""),
        ),
        (
            Method::GET,
            "/api/v1/namespaces/default/pods",
            Some("watch=true&resourceVersion=5"),
            "watch",
            obj("pods", "default", "", "", ""),
        ),
        (
            Method::GET,
            "/api/v1/watch/namespaces/default/pods",
            None,
            "watch",
            obj("pods", "default", "", "", ""),
        ),
        (
            Method::GET,
            "/api/v1/namespaces/default/pods/web",
            None,
            "get",
            obj("pods", "default", "web", "", ""),
        ),
        (
            Method::PUT,
            "/apis/apps/v1/namespaces/a/deployments/web/scale",
            None,
            "update",
            obj("deployments", "a", "web", "apps", "scale"),
        ),
        (
            Method::POST,
            "/api/v1/namespaces",
            None,
            "create",
            obj("namespaces", "", "", "", ""),
        ),
        (
            Method::GET,
            "/api/v1/namespaces/x",
            None,
            "get",
            obj("namespaces", "x", "x", "", ""),
        ),
        (
            Method::PUT,
            "/api/v1/namespaces/x/finalize",
            None,
            "update",
            obj("namespaces", "x", "x", "", "finalize"),
        ),
        (
            Method::DELETE,
            "/apis/apps/v1/namespaces/a/deployments",
            None,
            "deletecollection",
            obj("deployments", "a", "", "apps", ""),
        ),
        (
            Method::PATCH,
            "/apis/multicluster.io/v1/clusters/east/status",
            None,
            "patch",
            obj("clusters", "", "east", "multicluster.io", "status"),
        ),
    ];
    for (m, path, q, verb, object) in cases {
        let i = info(m, path, q);
        assert_eq!(i.verb, verb, "{path}");
        assert_eq!(i.object, object, "{path}");
    }
    // Discovery, the DRO-DS API and the rest: non-resource requests, verb the method.
    for (m, path, verb) in [
        (Method::GET, "/apis/apps/v1", "get"),
        (Method::GET, "/version", "get"),
        (Method::POST, "/api/v1/clusters", "post"),
        (Method::PUT, "/api/v1/metrics", "put"),
        (Method::GET, "/healthz", "get"),
    ] {
        let i = info(m, path, None);
        assert_eq!(
            (i.verb.as_str(), i.object.is_none()),
            (verb, true),
            "{path}"
        );
    }
}

fn policy(rules: &str) -> Policy {
    Policy::parse(&format!(
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n{rules}"
    ))
    .unwrap()
}

#[test]
fn the_first_matching_rule_decides() {
    let p = policy(
        "- level: None\n  users: ['system:cluster:east']\n  verbs: [get, list, watch]\n\
         - level: RequestResponse\n  resources: [{group: '', resources: [secrets]}]\n\
         - level: Request\n  resources: [{group: apps, resources: ['*/scale']}]\n  namespaces: [prod]\n\
         - level: Metadata\n  resources: [{group: multicluster.io, resources: ['clusters/*']}]\n\
         - level: Metadata\n  nonResourceURLs: ['/api/v1/clusters*', /version]\n\
         - level: None\n  userGroups: ['system:clusters']\n\
         - level: Metadata\n  omitStages: [ResponseComplete]\n",
    );
    let admin = Identity::Admin {
        name: "admin".into(),
    };
    let east = Identity::Cluster {
        name: "east".into(),
    };
    let west = Identity::Cluster {
        name: "west".into(),
    };
    let level = |who: Option<&Identity>, m: Method, path: &str| {
        p.decide(who, &info(m, path, Option::None)).level
    };
    use Level::*;
    assert_eq!(
        level(
            Some(&east),
            Method::GET,
            "/apis/multicluster.io/v1alpha1/namespaces/orrery-cluster-east/works"
        ),
        None
    );
    assert_eq!(
        level(Some(&admin), Method::GET, "/api/v1/namespaces/a/secrets/s"),
        RequestResponse
    );
    assert_eq!(
        level(
            Some(&admin),
            Method::PUT,
            "/apis/apps/v1/namespaces/prod/deployments/web/scale"
        ),
        Request
    );
    // Another namespace: on to the rules below.
    assert_eq!(
        level(
            Some(&admin),
            Method::PUT,
            "/apis/apps/v1/namespaces/dev/deployments/web/scale"
        ),
        Metadata
    );
    assert_eq!(
        level(
            Some(&west),
            Method::PATCH,
            "/apis/multicluster.io/v1alpha1/clusters/west/status"
        ),
        Metadata
    );
    assert_eq!(
        level(Some(&admin), Method::POST, "/api/v1/clusters"),
        Metadata
    );
    assert_eq!(
        level(Some(&admin), Method::GET, "/api/v1/clusters/east/status"),
        Metadata
    );
    assert_eq!(
        level(
            Some(&west),
            Method::GET,
            "/apis/multicluster.io/v1alpha1/namespaces/orrery-cluster-west/works"
        ),
        None
    );
    assert_eq!(
        level(Option::None, Method::GET, "/api/v1/namespaces"),
        Metadata
    );
    // Stages: the policy's and the rule's omissions together.
    let d = p.decide(Some(&admin), &info(Method::GET, "/healthz", Option::None));
    assert!(!d.logs(Stage::RequestReceived) && !d.logs(Stage::ResponseComplete));
    let d = p.decide(
        Some(&admin),
        &info(Method::GET, "/api/v1/namespaces/a/secrets/s", Option::None),
    );
    assert!(!d.logs(Stage::RequestReceived) && d.logs(Stage::ResponseComplete));
    // No rule matches: not logged.
    let empty = policy("- level: Metadata\n  verbs: [create]\n");
    assert_eq!(
        empty
            .decide(Some(&admin), &info(Method::GET, "/version", Option::None))
            .level,
        None
    );
}

#[test]
fn events_say_who_what_and_how_it_ended_at_their_level() {
    let admin = Identity::Admin {
        name: "admin".into(),
    };
    let mk = |level: Level, omit_managed_fields: bool| {
        let mut r = Record::new(
            Decision {
                level,
                omit_stages: vec![],
                omit_managed_fields,
            },
            info(Method::POST, "/api/v1/namespaces/a/secrets", Option::None),
            Some(&admin),
            "/api/v1/namespaces/a/secrets?fieldManager=kubectl".into(),
            "kubectl/v1.32".into(),
            vec!["127.0.0.1".into()],
        );
        r.request_object = Some(
            serde_json::json!({"kind": "Secret", "metadata": {"name": "s", "managedFields": [{"manager": "kubectl"}]}}),
        );
        r.response_object = Some(serde_json::json!({"kind": "Secret", "metadata": {"name": "s"}}));
        r
    };
    let ev: Value = serde_json::from_str(
        &mk(Level::Metadata, false)
            .line(Stage::ResponseComplete, Some(201))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(ev["apiVersion"], "audit.k8s.io/v1");
    assert_eq!(ev["kind"], "Event");
    assert_eq!(ev["level"], "Metadata");
    assert_eq!(ev["stage"], "ResponseComplete");
    assert_eq!(ev["verb"], "create");
    assert_eq!(ev["user"]["username"], "admin");
    assert_eq!(
        ev["user"]["groups"],
        serde_json::json!(["system:masters", "system:authenticated"])
    );
    assert_eq!(ev["objectRef"]["resource"], "secrets");
    assert_eq!(ev["objectRef"]["namespace"], "a");
    assert_eq!(ev["responseStatus"]["code"], 201);
    assert_eq!(ev["sourceIPs"], serde_json::json!(["127.0.0.1"]));
    assert_eq!(
        ev["requestURI"],
        "/api/v1/namespaces/a/secrets?fieldManager=kubectl"
    );
    assert!(ev.get("requestObject").is_none() && ev.get("responseObject").is_none());
    assert!(ev["auditID"].as_str().is_some_and(|s| s.len() == 36));
    let ev: Value = serde_json::from_str(
        &mk(Level::Request, true)
            .line(Stage::ResponseComplete, Some(201))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(ev["requestObject"]["metadata"]["name"], "s");
    assert!(
        ev["requestObject"]["metadata"]
            .get("managedFields")
            .is_none()
    );
    assert!(ev.get("responseObject").is_none());
    let r = mk(Level::RequestResponse, false);
    let ev: Value =
        serde_json::from_str(&r.line(Stage::ResponseComplete, Some(201)).unwrap()).unwrap();
    assert_eq!(ev["responseObject"]["kind"], "Secret");
    assert!(
        ev["requestObject"]["metadata"]
            .get("managedFields")
            .is_some()
    );
    // The received stage carries no answer yet.
    let ev: Value =
        serde_json::from_str(&r.line(Stage::RequestReceived, Option::None).unwrap()).unwrap();
    assert!(ev.get("responseStatus").is_none() && ev.get("responseObject").is_none());
    assert!(
        mk(Level::None, false)
            .line(Stage::ResponseComplete, Some(200))
            .is_none()
    );
}

#[test]
fn bad_policies_are_refused_with_the_reason() {
    for (text, want) in [
        ("apiVersion: v1\nkind: ConfigMap\n", "audit.k8s.io/v1"),
        (
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Loud\n",
            "Loud",
        ),
        (
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: None\n  verb: [get]\n",
            "verb",
        ),
        (
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [Sometimes]\n",
            "Sometimes",
        ),
    ] {
        let e = Policy::parse(text).unwrap_err().to_string();
        assert!(e.contains(want), "{text}: {e}");
    }
}

#[test]
fn the_log_rotates_by_size_and_keeps_so_many_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.log");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let log = AuditLog::open(
        policy("- level: Metadata\n"),
        LogFile {
            path: path.clone(),
            max_bytes: 1000,
            max_backups: 2,
        },
    )
    .unwrap();
    rt.block_on(async {
        for i in 0..60 {
            log.write(format!("{{\"n\":{i},\"pad\":\"{}\"}}", "x".repeat(80)))
                .await;
            if i % 10 == 9 {
                // Rotated names are stamped to the millisecond.
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        }
    });
    drop(log);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let files = loop {
        let mut files: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().to_string())
            .collect();
        files.sort();
        let last = std::fs::read_to_string(&path).unwrap_or_default();
        if last.contains("\"n\":59") || std::time::Instant::now() > deadline {
            break files;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(files.len(), 3, "{files:?}");
    assert!(
        files
            .iter()
            .filter(|f| f.starts_with("audit-") && f.ends_with(".log"))
            .count()
            == 2,
        "{files:?}"
    );
    for f in &files {
        let len = std::fs::metadata(dir.path().join(f)).unwrap().len();
        assert!(len <= 1000, "{f}: {len} bytes");
        // Whole lines only.
        let text = std::fs::read_to_string(dir.path().join(f)).unwrap();
        assert!(
            text.lines()
                .all(|l| serde_json::from_str::<Value>(l).is_ok()),
            "{f}"
        );
    }
}
