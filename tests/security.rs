//! Security end to end, with real servers, the real kubectl and simulated members' agents:
//! the audit log (every mutation with its user, verb, object and answer, at the policy's
//! levels), `kubectl auth whoami` and `can-i`, and a flood beyond the in-flight limits.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{Agent, Server, eventually};
use serde_json::Value;

const POLICY: &str = r#"
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: None
  userGroups: ["system:clusters"]
  verbs: [get, list, watch]
- level: RequestResponse
  resources: [{group: "", resources: [secrets]}]
- level: Request
  resources: [{group: apps, resources: [deployments]}]
  verbs: [create, update, patch]
- level: Metadata
"#;

fn events(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn find<'a>(evs: &'a [Value], verb: &str, resource: &str, name: &str) -> Option<&'a Value> {
    evs.iter().find(|e| {
        e["verb"] == verb
            && e["objectRef"]["resource"] == resource
            && e["objectRef"]["name"] == name
    })
}

#[test]
fn mutations_are_logged_with_their_user_at_the_policys_level() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, POLICY).unwrap();
    let log = dir.path().join("logs/audit.log");
    let s = Server::start_with(&[
        "--audit-policy-file",
        policy.to_str().unwrap(),
        "--audit-log-path",
        log.to_str().unwrap(),
    ]);
    let _member = Agent::sim_member(&s, "m1");
    s.ok(&["create", "namespace", "shop"]);
    s.apply(&common::divided_deployment(
        "web",
        2,
        "{cpu: 100m, memory: 64Mi}",
        "",
    ));
    s.ok(&["scale", "deployment", "web", "--replicas", "3"]);
    s.ok(&[
        "create",
        "secret",
        "generic",
        "db",
        "--from-literal=password=audited-4711",
    ]);
    s.ok(&["delete", "deployment", "web"]);
    s.ok(&["get", "--raw", "/api/v1/clusters"]);
    s.stdin(
        &["create", "--raw", "/api/v1/clusters", "-f", "-"],
        r#"{"name": "audited-dro", "endpoint": "https://k8s.example"}"#,
    );
    // Without a valid token: refused, and logged as anonymous.
    let out = std::process::Command::new("kubectl")
        .args(["--kubeconfig"])
        .arg(&s.kubeconfig)
        .args(["--token", "not-a-token", "get", "pods"])
        .output()
        .unwrap();
    assert!(!out.status.success());

    let mut evs = Vec::new();
    eventually(Duration::from_secs(10), "the events written", || {
        evs = events(&log);
        find(&evs, "delete", "deployments", "web").is_some()
            && evs
                .iter()
                .any(|e| e["user"]["username"] == "system:anonymous")
    });
    // No stage the policy omits; a watch (kubectl delete waits with one) when it starts.
    assert!(
        evs.iter().all(|e| e["stage"] == "ResponseComplete"
            || (e["stage"] == "ResponseStarted" && e["verb"] == "watch")),
        "{evs:#?}"
    );
    for e in &evs {
        assert_eq!(e["apiVersion"], "audit.k8s.io/v1");
        assert!(e["auditID"].as_str().is_some_and(|id| !id.is_empty()));
        assert!(e["requestReceivedTimestamp"].is_string() && e["stageTimestamp"].is_string());
        assert_eq!(e["sourceIPs"][0], "127.0.0.1");
    }
    // Every mutation of the admin's: user, verb, object, answer.
    for (verb, resource, name, code) in [
        ("create", "namespaces", "", 201),
        ("create", "secrets", "", 201),
        ("delete", "deployments", "web", 200),
    ] {
        let e = evs
            .iter()
            .find(|e| {
                e["verb"] == verb
                    && e["objectRef"]["resource"] == resource
                    && (name.is_empty() || e["objectRef"]["name"] == name)
            })
            .unwrap_or_else(|| panic!("no {verb} {resource}: {evs:#?}"));
        assert_eq!(e["user"]["username"], "admin", "{e}");
        assert_eq!(e["responseStatus"]["code"], code, "{e}");
    }
    let apply = evs
        .iter()
        .find(|e| {
            e["objectRef"]["resource"] == "deployments"
                && (e["verb"] == "patch" || e["verb"] == "create")
        })
        .unwrap();
    assert_eq!(apply["level"], "Request");
    assert_eq!(apply["objectRef"]["apiGroup"], "apps");
    assert!(apply["requestObject"].is_object(), "{apply}");
    assert!(apply.get("responseObject").is_none());
    let scale = find(&evs, "patch", "deployments", "web")
        .into_iter()
        .chain(
            evs.iter()
                .filter(|e| e["objectRef"]["subresource"] == "scale"),
        )
        .next();
    assert!(scale.is_some(), "the scale is logged: {evs:#?}");
    // Secrets at RequestResponse: the request and the answer.
    let secret = evs
        .iter()
        .find(|e| e["verb"] == "create" && e["objectRef"]["resource"] == "secrets")
        .unwrap();
    assert_eq!(secret["level"], "RequestResponse");
    assert_eq!(secret["responseObject"]["metadata"]["name"], "db");
    assert!(secret["requestObject"].is_object());
    // The DRO-DS API: its request by its path, and each registry operation it ran as
    // that operation (user, verb, object, code), from where the request came.
    assert!(
        evs.iter()
            .any(|e| e["requestURI"] == "/api/v1/clusters" && e["verb"] == "get"),
        "{evs:#?}"
    );
    let listed = evs
        .iter()
        .find(|e| {
            e["verb"] == "list"
                && e["objectRef"]["resource"] == "clusters"
                && e["requestURI"] == "/apis/multicluster.io/v1alpha1/clusters"
        })
        .unwrap_or_else(|| panic!("no list of clusters from the DRO-DS call: {evs:#?}"));
    assert_eq!(listed["user"]["username"], "admin");
    assert_eq!(listed["responseStatus"]["code"], 200);
    assert!(
        listed["userAgent"].as_str().unwrap().contains("kubectl"),
        "{listed}"
    );
    let created = evs
        .iter()
        .find(|e| {
            e["verb"] == "create"
                && e["objectRef"]["resource"] == "clusters"
                && e["objectRef"]["apiGroup"] == "multicluster.io"
                // Not an agent's proxy tunnel (create on clusters/tunnel).
                && e["objectRef"]["subresource"].is_null()
        })
        .unwrap_or_else(|| panic!("no create of a cluster from the DRO-DS call: {evs:#?}"));
    assert_eq!(created["user"]["username"], "admin");
    assert_eq!(created["responseStatus"]["code"], 201);
    // The agent: its status writes are logged (Metadata), its reads are not.
    let agent: Vec<&Value> = evs
        .iter()
        .filter(|e| e["user"]["username"] == "system:cluster:m1")
        .collect();
    assert!(
        agent
            .iter()
            .any(|e| e["verb"] == "patch" && e["objectRef"]["subresource"] == "status"),
        "{agent:#?}"
    );
    assert!(
        agent
            .iter()
            .all(|e| !matches!(e["verb"].as_str(), Some("get" | "list" | "watch"))),
        "{agent:#?}"
    );
    let anonymous: Vec<&Value> = evs
        .iter()
        .filter(|e| e["user"]["username"] == "system:anonymous")
        .collect();
    assert!(
        anonymous.iter().any(|e| e["responseStatus"]["code"] == 401),
        "{anonymous:#?}"
    );
}

#[test]
fn an_audit_log_without_a_policy_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_orrery"))
        .args(["server", "--data-dir"])
        .arg(dir.path().join("data"))
        .args(["--listen", "127.0.0.1:0", "--audit-log-path"])
        .arg(dir.path().join("audit.log"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--audit-policy-file"), "{err}");
}

/// `kubectl auth whoami` and `kubectl auth can-i` (with `--list`) for the admin and a member
/// cluster's agent: answered as their requests are authorized.
#[test]
fn kubectl_auth_whoami_and_can_i_answer_as_requests_are_authorized() {
    let s = Server::start();
    let member = Agent::sim_member(&s, "m1");
    let agent = member.cluster_token();
    let as_token = |token: Option<&str>, args: &[&str]| {
        let mut a: Vec<&str> = Vec::new();
        if let Some(t) = token {
            a.extend(["--token", t]);
        }
        a.extend_from_slice(args);
        let out = s.kubectl(&a);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    // whoami
    let (ok, out, err) = as_token(None, &["auth", "whoami", "-o", "json"]);
    assert!(ok, "{err}");
    let me: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(me["status"]["userInfo"]["username"], "admin");
    let (ok, out, err) = as_token(Some(&agent), &["auth", "whoami", "-o", "json"]);
    assert!(ok, "{err}");
    let me: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(me["status"]["userInfo"]["username"], "system:cluster:m1");
    assert_eq!(me["status"]["userInfo"]["groups"][0], "system:clusters");
    // can-i: yes (exit 0) and no (exit 1), as the requests themselves would be answered.
    let can = |token: Option<&str>, args: &[&str]| {
        let mut a = vec!["auth", "can-i"];
        a.extend_from_slice(args);
        let (ok, out, err) = as_token(token, &a);
        // RBAC gives no reason for a refusal (as in Kubernetes): a bare "no".
        assert!(out == "yes" || out == "no", "{out} {err}");
        assert_eq!(ok, out == "yes", "{out} {err}");
        ok
    };
    assert!(can(None, &["create", "deployments", "-n", "shop"]));
    assert!(can(None, &["delete", "clusters.multicluster.io/m1"]));
    assert!(can(
        Some(&agent),
        &["list", "works.multicluster.io", "-n", "orrery-cluster-m1"]
    ));
    assert!(!can(
        Some(&agent),
        &["list", "works.multicluster.io", "-n", "orrery-cluster-m2"]
    ));
    assert!(!can(
        Some(&agent),
        &["create", "deployments", "-n", "default"]
    ));
    assert!(can(
        Some(&agent),
        &[
            "patch",
            "clusters.multicluster.io/m1",
            "--subresource",
            "status"
        ]
    ));
    assert!(!can(
        Some(&agent),
        &[
            "patch",
            "clusters.multicluster.io/m2",
            "--subresource",
            "status"
        ]
    ));
    // And what the agent's token would be told if it tried: the same.
    let (ok, _, err) = as_token(Some(&agent), &["create", "namespace", "nope"]);
    assert!(!ok && err.contains("forbidden"), "{err}");
    // --list: the rules of the namespace.
    let (ok, out, err) = as_token(
        Some(&agent),
        &["auth", "can-i", "--list", "-n", "orrery-cluster-m1"],
    );
    assert!(ok, "{err}");
    assert!(out.contains("works.multicluster.io"), "{out}");
    assert!(out.contains("clusters.multicluster.io/status"), "{out}");
    let (ok, out, err) = as_token(None, &["auth", "can-i", "--list"]);
    assert!(ok, "{err}");
    assert!(out.lines().any(|l| l.starts_with("*.*")), "{out}");
    // The review kinds are discovered, create only.
    let (ok, out, err) = as_token(
        None,
        &["api-resources", "--api-group", "authorization.k8s.io"],
    );
    assert!(ok, "{err}");
    assert!(out.contains("selfsubjectaccessreviews"), "{out}");
}

/// A flood of an agent's writes beyond the in-flight limit: some are told to come back (429
/// with Retry-After), a client that waits and retries gets through, and the server keeps
/// answering the admin.
#[test]
fn a_flood_beyond_the_in_flight_limit_is_told_to_come_back_and_the_server_stays_responsive() {
    // Writes wait up to 50 ms to share a commit: they overlap, as a busy server's do.
    let s = Server::start_with(&[
        "--max-mutating-requests-inflight",
        "2",
        "--max-requests-inflight",
        "4",
        "--commit-delay",
        "50ms",
    ]);
    let member = Agent::sim_member(&s, "m1");
    let token = member.cluster_token();
    let ca = std::fs::read_to_string(s.dir.join("tls/ca.crt")).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let codes: Vec<(u16, bool)> = rt.block_on(async {
        // Connected first, then all at once: the writes overlap.
        let mut clients = Vec::new();
        for _ in 0..40 {
            clients.push(orrery_client::connect(&s.url, &token, &ca).await.unwrap());
        }
        let start = std::sync::Arc::new(tokio::sync::Barrier::new(clients.len()));
        let mut tasks = Vec::new();
        for (i, c) in clients.into_iter().enumerate() {
            let start = start.clone();
            tasks.push(tokio::spawn(async move {
                start.wait().await;
                let mut out = Vec::new();
                for j in 0..5 {
                    let body = serde_json::to_vec(&serde_json::json!({"status": {"properties": {"flood": format!("{i}-{j}")}}})).unwrap();
                    let req = http::Request::patch("/apis/multicluster.io/v1alpha1/clusters/m1/status")
                        .header("Content-Type", "application/merge-patch+json")
                        .body(body)
                        .unwrap();
                    let (code, headers, _) = common::send(&c, req, None).await;
                    out.push((code, headers.get("retry-after").is_some()));
                }
                out
            }));
        }
        let mut out = Vec::new();
        for t in tasks {
            out.extend(t.await.unwrap());
        }
        out
    });
    // kube-rs, as client-go, waits as Retry-After says and tries again: every write got
    // through in the end.
    assert!(codes.iter().all(|(c, _)| *c == 200), "{codes:?}");
    // The server refused some at first: its metrics count the 429s.
    let metrics = s.ok(&["get", "--raw", "/metrics"]);
    let refused: f64 = metrics
        .lines()
        .filter(|l| {
            l.starts_with("orrery_http_request_duration_seconds_count")
                && l.contains("code=\"429\"")
                && l.contains("resource=\"clusters\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(refused > 0.0, "no 429 counted:\n{metrics}");
    // The admin is not counted: answered at once, during a flood as after it.
    s.ok(&["get", "clusters"]);
    // And the member is still Ready: skipped heartbeats, not a lost session.
    assert_eq!(s.cluster_condition("m1", "Ready"), "True");
}

/// A user from `orrery user create` (a client certificate) bound to `view` in one namespace:
/// reads there, is refused (403, Kubernetes' words) on writes and elsewhere, on the DRO-DS
/// REST API too, and `kubectl auth can-i --list` says so. A ServiceAccount's token from
/// `kubectl create token` acts as the account until the account is deleted. Nobody grants
/// what they do not hold.
#[test]
fn a_user_bound_to_view_in_one_namespace_reads_there_and_nothing_more() {
    let s = Server::start();
    s.ok(&["create", "namespace", "team-a"]);
    s.ok(&["create", "namespace", "team-b"]);
    for ns in ["team-a", "team-b"] {
        s.ok(&["-n", ns, "create", "deployment", "web", "--image=nginx"]);
        s.ok(&[
            "-n",
            ns,
            "create",
            "secret",
            "generic",
            "db",
            "--from-literal=p=s3cret",
        ]);
    }
    // A user nobody has bound yet may do nothing but ask about itself.
    let alice = s.dir.join("alice.kubeconfig");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_orrery"))
        .args(["user", "create", "alice", "--group", "devs", "--ttl", "1h"])
        .arg("--kubeconfig")
        .arg(&s.kubeconfig)
        .arg("-o")
        .arg(&alice)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let as_alice = |args: &[&str]| {
        let mut a = vec!["--kubeconfig", alice.to_str().unwrap()];
        a.extend_from_slice(args);
        let out = s.kubectl(&a);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (ok, out, err) = as_alice(&["auth", "whoami", "-o", "json"]);
    assert!(ok, "{err}");
    let me: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(me["status"]["userInfo"]["username"], "alice");
    assert_eq!(me["status"]["userInfo"]["groups"][0], "devs");
    let (ok, _, err) = as_alice(&["-n", "team-a", "get", "deployments"]);
    assert!(!ok && err.contains("forbidden"), "{err}");

    s.ok(&[
        "-n",
        "team-a",
        "create",
        "rolebinding",
        "alice-view",
        "--clusterrole=view",
        "--user=alice",
    ]);
    // The aggregated role shows the rules it grants, as in Kubernetes.
    eventually(
        Duration::from_secs(10),
        "view's aggregated rules written",
        || {
            let view = s.get_json(&["clusterrole", "view"]);
            view["rules"].as_array().is_some_and(|rules| {
                rules.iter().any(|r| {
                    r["resources"]
                        .as_array()
                        .is_some_and(|v| v.contains(&"deployments".into()))
                })
            })
        },
    );
    let (ok, out, err) = as_alice(&["-n", "team-a", "get", "deployments", "-o", "name"]);
    assert!(ok, "{err}");
    assert_eq!(out, "deployment.apps/web");
    let (ok, _, err) = as_alice(&["-n", "team-a", "get", "deployment", "web"]);
    assert!(ok, "{err}");
    // Refused: a write, Secrets (view does not read them), another namespace, the cluster.
    let refusals: &[(&[&str], &str)] = &[
        (
            &[
                "-n",
                "team-a",
                "create",
                "configmap",
                "x",
                "--from-literal=a=b",
            ],
            "configmaps is forbidden: User \"alice\" cannot create resource \"configmaps\" in API group \"\" in the namespace \"team-a\"",
        ),
        (
            &["-n", "team-a", "scale", "deployment", "web", "--replicas=3"],
            "User \"alice\" cannot patch resource \"deployments/scale\" in API group \"apps\" in the namespace \"team-a\"",
        ),
        (
            &["-n", "team-a", "get", "secret", "db"],
            "secrets \"db\" is forbidden: User \"alice\" cannot get resource \"secrets\" in API group \"\" in the namespace \"team-a\"",
        ),
        (
            &["-n", "team-b", "get", "deployments"],
            "deployments.apps is forbidden: User \"alice\" cannot list resource \"deployments\" in API group \"apps\" in the namespace \"team-b\"",
        ),
        (
            &["get", "namespaces"],
            "namespaces is forbidden: User \"alice\" cannot list resource \"namespaces\" in API group \"\" at the cluster scope",
        ),
    ];
    for (args, message) in refusals {
        let (ok, _, err) = as_alice(args);
        assert!(!ok, "{args:?} was allowed");
        assert!(
            err.contains("(Forbidden)") || err.contains("forbidden"),
            "{args:?}: {err}"
        );
        assert!(err.contains(message), "{args:?}: {err}");
    }
    // can-i and can-i --list say the same.
    let (ok, out, _) = as_alice(&["auth", "can-i", "list", "deployments", "-n", "team-a"]);
    assert!(ok && out == "yes", "{out}");
    let (ok, out, _) = as_alice(&["auth", "can-i", "create", "deployments", "-n", "team-a"]);
    assert!(!ok && out.starts_with("no"), "{out}");
    let (ok, out, _) = as_alice(&["auth", "can-i", "list", "deployments", "-n", "team-b"]);
    assert!(!ok && out.starts_with("no"), "{out}");
    let (ok, out, err) = as_alice(&["auth", "can-i", "--list", "-n", "team-a"]);
    assert!(ok, "{err}");
    let line = |name: &str| {
        out.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no {name} in\n{out}"))
            .to_string()
    };
    assert!(
        line("deployments.apps").ends_with("[get list watch]"),
        "{out}"
    );
    assert!(
        line("propagationpolicies.policy.karmada.io").ends_with("[get list watch]"),
        "{out}"
    );
    assert!(!out.contains("secrets "), "{out}");
    let (_, out_b, _) = as_alice(&["auth", "can-i", "--list", "-n", "team-b"]);
    assert!(!out_b.contains("deployments.apps"), "{out_b}");

    // The DRO-DS REST API: the same verbs on the same resources.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let c = orrery_client::from_kubeconfig(&alice).await.unwrap();
        let (code, _, body) = common::send(
            &c,
            common::req("GET", "/api/v1/bindings/team-b.web-deployment/status", "application/json", Value::Null),
            None,
        )
        .await;
        assert_eq!(code, 403, "{body}");
        assert_eq!(body["code"], "FORBIDDEN", "{body}");
        assert!(
            body["message"].as_str().unwrap().contains("User \"alice\" cannot get resource \"resourcebindings\" in API group \"multicluster.io\" in the namespace \"team-b\""),
            "{body}"
        );
        let task = serde_json::json!({"resource": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "team-a", "name": "web"}});
        let (code, _, body) = common::send(&c, common::req("POST", "/api/v1/bindings", "application/json", task), None).await;
        assert_eq!(code, 403, "{body}");
        let (code, _, body) = common::send(&c, common::req("GET", "/api/v1/clusters", "application/json", Value::Null), None).await;
        assert_eq!(code, 403, "{body}");
        let (code, _, body) = common::send(&c, common::req("GET", "/api/v1/monitor/realtime", "application/json", Value::Null), None).await;
        assert_eq!(code, 403, "{body}");
    });

    // Alice cannot hand herself more, even with rights to write bindings in team-a...
    s.apply(
        r#"{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "binder", "namespace": "team-a"},
            "rules": [{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["rolebindings", "roles"], "verbs": ["create", "get", "list"]}]}"#,
    );
    s.ok(&[
        "-n",
        "team-a",
        "create",
        "rolebinding",
        "alice-binder",
        "--role=binder",
        "--user=alice",
    ]);
    let (ok, _, err) = as_alice(&[
        "-n",
        "team-a",
        "create",
        "rolebinding",
        "mine",
        "--clusterrole=admin",
        "--user=alice",
    ]);
    assert!(!ok, "alice bound admin to herself");
    assert!(
        err.contains("is attempting to grant RBAC permissions not currently held"),
        "{err}"
    );
    let (ok, _, err) = as_alice(&[
        "-n",
        "team-a",
        "create",
        "role",
        "more",
        "--verb=get",
        "--resource=secrets",
    ]);
    assert!(!ok && err.contains("not currently held"), "{err}");
    // ...but may grant what she holds.
    let (ok, _, err) = as_alice(&[
        "-n",
        "team-a",
        "create",
        "rolebinding",
        "bob-view",
        "--clusterrole=view",
        "--user=bob",
    ]);
    assert!(ok, "{err}");

    // A ServiceAccount's token acts as the account, and stops with it.
    s.ok(&["-n", "team-a", "create", "serviceaccount", "robot"]);
    s.ok(&[
        "-n",
        "team-a",
        "create",
        "rolebinding",
        "robot-edit",
        "--clusterrole=edit",
        "--serviceaccount=team-a:robot",
    ]);
    let token = s.ok(&["-n", "team-a", "create", "token", "robot", "--duration=15m"]);
    let token = token.trim();
    let as_robot = |args: &[&str]| {
        let mut a = vec!["--token", token];
        a.extend_from_slice(args);
        s.kubectl(&a)
    };
    let out = as_robot(&[
        "auth",
        "whoami",
        "-o",
        "jsonpath={.status.userInfo.username}",
    ]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "system:serviceaccount:team-a:robot"
    );
    let out = as_robot(&[
        "-n",
        "team-a",
        "create",
        "configmap",
        "made-by-robot",
        "--from-literal=a=b",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = as_robot(&["-n", "team-b", "get", "configmaps"]);
    assert!(!out.status.success());
    let err = s.fails(&["-n", "team-a", "create", "token", "robot", "--duration=5m"]);
    assert!(
        err.contains("may not specify a duration less than 10 minutes"),
        "{err}"
    );
    s.ok(&["-n", "team-a", "delete", "serviceaccount", "robot"]);
    eventually(
        Duration::from_secs(10),
        "the deleted account's token refused",
        || {
            let out = as_robot(&["-n", "team-a", "get", "configmaps"]);
            let err = String::from_utf8_lossy(&out.stderr);
            !out.status.success() && err.contains("Unauthorized")
        },
    );
}
