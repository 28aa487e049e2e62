//! Security end to end, with real servers, the real kubectl and simulated members' agents:
//! the audit log (every mutation with its user, verb, object and answer, at the policy's
//! levels), `kubectl auth whoami` and `can-i`, and a flood beyond the in-flight limits.

use crate::common;

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
    // A request beyond the seats waits in its user's queue (5 long here), beyond that it is
    // told to come back.
    let s = Server::start_with(&[
        "--max-mutating-requests-inflight",
        "2",
        "--max-requests-inflight",
        "4",
        "--max-queued-requests-per-user",
        "5",
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

/// A tenant's rights end at its namespace: a ServiceAccount with `edit` in team-a places its
/// own templates, and nothing of team-b's: a policy, a Karmada policy or override, an
/// autoscaler or a Migration naming team-b is refused with a message, ResourceBindings are
/// not its to write (and one an admin writes naming team-b is refused too), and team-b's own
/// policy places team-b's Deployment without a rival. No Work carries team-b's Secret to a
/// cluster the tenant chose.
#[test]
fn a_tenant_with_edit_in_one_namespace_places_nothing_of_another() {
    let f = common::fleet::Fleet::start(&[("c1", "us-east"), ("c2", "us-west")]);
    let s = &f.s;
    for ns in ["team-a", "team-b"] {
        s.ok(&["create", "namespace", ns]);
    }
    s.apply(
        r#"
apiVersion: v1
kind: Secret
metadata: {name: s2, namespace: team-b}
stringData: {password: team-b-only}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: api, namespace: team-b}
spec:
  replicas: 1
  selector: {matchLabels: {app: api}}
  template:
    metadata: {labels: {app: api}}
    spec:
      containers:
      - name: api
        image: api:1
        env: [{name: P, valueFrom: {secretKeyRef: {name: s2, key: password}}}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: team-a}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: web, image: web:1}]}
"#,
    );
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
    let token = s.ok(&["-n", "team-a", "create", "token", "robot", "--duration=1h"]);
    let token = token.trim().to_string();
    let as_robot = |args: &[&str], stdin: Option<&str>| {
        let mut a = vec!["--token", token.as_str()];
        a.extend_from_slice(args);
        let out = match stdin {
            Some(input) => s.run_stdin(&a, input),
            None => s.kubectl(&a),
        };
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (_, out, _) = as_robot(&["auth", "can-i", "get", "secrets", "-n", "team-b"], None);
    assert_eq!(out, "no");

    // Every kind that names another object, aimed at team-b from team-a: refused, saying why.
    let attempts: &[(&str, &str)] = &[
        (
            r#"{"apiVersion": "multicluster.io/v1alpha1", "kind": "ResourcePlacementPolicy",
                "metadata": {"name": "grab", "namespace": "team-a"},
                "spec": {"resourceSelector": {"apiVersion": "v1", "kind": "Secret", "name": "s2", "namespace": "team-b"},
                         "placement": {"clusterAffinity": {"clusterNames": ["c2"]}}}}"#,
            "selects resources in its own namespace (team-a) only",
        ),
        (
            r#"{"apiVersion": "multicluster.io/v1alpha1", "kind": "ResourcePlacementPolicy",
                "metadata": {"name": "grab-deps", "namespace": "team-a"},
                "spec": {"resourceSelector": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "api", "namespace": "team-b"},
                         "propagateDeps": true, "priority": 1000,
                         "placement": {"clusterAffinity": {"clusterNames": ["c2"]}}}}"#,
            "selects resources in its own namespace (team-a) only",
        ),
        (
            r#"{"apiVersion": "policy.karmada.io/v1alpha1", "kind": "PropagationPolicy",
                "metadata": {"name": "grab-pp", "namespace": "team-a"},
                "spec": {"resourceSelectors": [{"apiVersion": "v1", "kind": "Secret", "namespace": "team-b"}],
                         "placement": {"clusterAffinity": {"clusterNames": ["c2"]}}}}"#,
            "a PropagationPolicy selects resources in its own namespace only",
        ),
        (
            r#"{"apiVersion": "policy.karmada.io/v1alpha1", "kind": "OverridePolicy",
                "metadata": {"name": "grab-op", "namespace": "team-a"},
                "spec": {"resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "team-b"}],
                         "overrideRules": [{"overriders": {"imageOverrider": [{"component": "Tag", "operator": "replace", "value": "evil"}]}}]}}"#,
            "an OverridePolicy selects resources in its own namespace only",
        ),
        (
            r#"{"apiVersion": "autoscaling.karmada.io/v1alpha1", "kind": "FederatedHPA",
                "metadata": {"name": "grab-hpa", "namespace": "team-a"},
                "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "api", "namespace": "team-b"},
                         "minReplicas": 1, "maxReplicas": 100}}"#,
            "namespace",
        ),
        (
            r#"{"apiVersion": "multicluster.io/v1alpha1", "kind": "Migration",
                "metadata": {"name": "grab-move", "namespace": "team-a"},
                "spec": {"resource": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "api", "namespace": "team-b"},
                         "targetClusters": ["c2"]}}"#,
            "namespace",
        ),
    ];
    for (manifest, why) in attempts {
        let (ok, _, err) = as_robot(&["apply", "-f", "-"], Some(manifest));
        assert!(!ok, "allowed: {manifest}");
        assert!(err.contains(why), "{manifest}:\n{err}");
    }
    // Bindings are the controllers': a tenant writes none, even in its own namespace.
    let hand_written = r#"{"apiVersion": "multicluster.io/v1alpha1", "kind": "ResourceBinding",
        "metadata": {"name": "grab-rb", "namespace": "team-a"},
        "spec": {"resource": {"apiVersion": "v1", "kind": "Secret", "namespace": "team-b", "name": "s2"},
                 "dependencies": [{"apiVersion": "v1", "kind": "Secret", "namespace": "team-b", "name": "s2"}],
                 "placement": {}, "schedulerName": "mine", "clusters": [{"name": "c2"}],
                 "policy": {"apiVersion": "multicluster.io/v1alpha1", "kind": "ResourcePlacementPolicy", "namespace": "team-a", "name": "x"}}}"#;
    let (ok, _, err) = as_robot(&["create", "-f", "-"], Some(hand_written));
    assert!(!ok);
    assert!(
        err.contains("cannot create resource \"resourcebindings\""),
        "{err}"
    );
    // Not even an admin's binding reaches another namespace.
    let err = s.fails_stdin(&["create", "-f", "-"], hand_written);
    assert!(
        err.contains("spec.resource.namespace") && err.contains("refers to objects there only"),
        "{err}"
    );
    // The tenant still places its own templates.
    let (ok, _, err) = as_robot(
        &["apply", "-f", "-"],
        Some(
            r#"{"apiVersion": "multicluster.io/v1alpha1", "kind": "ResourcePlacementPolicy",
                "metadata": {"name": "web", "namespace": "team-a"},
                "spec": {"resourceSelector": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                         "placement": {"clusterAffinity": {"clusterNames": ["c2"]}}}}"#,
        ),
    );
    assert!(ok, "{err}");
    // team-b's own policy places its Deployment, and nothing of the attacker's rivals it.
    s.apply(
        r#"{"apiVersion": "multicluster.io/v1alpha1", "kind": "ResourcePlacementPolicy",
            "metadata": {"name": "api", "namespace": "team-b"},
            "spec": {"resourceSelector": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "api"},
                     "propagateDeps": true, "placement": {"clusterAffinity": {"clusterNames": ["c1"]}}}}"#,
    );
    eventually(
        Duration::from_secs(30),
        "team-b's api on c1 and team-a's web on c2",
        || {
            f.find("c1", "Deployment", "api").is_some()
                && f.find("c2", "Deployment", "web").is_some()
        },
    );
    let b = s.get_json(&["resourcebinding", "api-deployment", "-n", "team-b"]);
    assert_eq!(b["spec"]["policy"]["namespace"], "team-b", "{b}");
    assert_eq!(b["spec"]["policy"]["name"], "api", "{b}");
    // s2 went where team-b put it (with its Deployment), and nowhere else.
    assert!(f.find("c1", "Secret", "s2").is_some());
    assert!(f.find("c2", "Secret", "s2").is_none());
    let works = s.ok(&["get", "works", "-n", "orrery-cluster-c2", "-o", "name"]);
    assert!(!works.contains("team-b"), "{works}");
    // The tenant reads its own bindings (view's rights), and only those.
    let (ok, out, err) = as_robot(
        &["-n", "team-a", "get", "resourcebindings", "-o", "name"],
        None,
    );
    assert!(ok, "{err}");
    assert!(out.contains("web-deployment"), "{out}");
    let (ok, _, _) = as_robot(&["-n", "team-b", "get", "resourcebindings"], None);
    assert!(!ok);
}

/// A TLS connection to the server from `source` (another loopback address, so that the limit
/// per source is the attacker's alone), speaking HTTP/1.1.
async fn raw_tls(
    s: &Server,
    source: &str,
    ca_pem: &str,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(format!("{source}:0").parse().unwrap())?;
    let tcp = socket
        .connect(format!("127.0.0.1:{}", s.port).parse().unwrap())
        .await?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await
}

/// Reads until the peer closes (or `within` passes): what it sent, and whether it closed.
async fn read_to_close<R: tokio::io::AsyncRead + Unpin>(
    r: &mut R,
    within: Duration,
) -> (String, bool) {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, r.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&got).into_owned(), true),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => return (String::from_utf8_lossy(&got).into_owned(), false),
        }
    }
}

/// One user's slow bodies, half-sent headers and silent connections cost the others nothing:
/// another user's writes and the admin's are served throughout, both members stay Ready with
/// their heartbeats renewed, every slow body is answered 408 and its connection closed,
/// connections that never finish their headers are closed after the header timeout, and a
/// source past its connection limit is turned away at once while other sources are not.
#[test]
fn slow_and_idle_clients_hold_connections_never_the_fleet() {
    let s = Server::start_with(&[
        "--max-mutating-requests-inflight",
        "20",
        "--request-body-timeout",
        "8s",
        "--request-header-timeout",
        "2s",
        "--max-connections-per-source",
        "150",
    ]);
    let m1 = Agent::sim_member(&s, "m1");
    let m2 = Agent::sim_member(&s, "m2");
    for ns in ["team-a", "team-b"] {
        s.ok(&["create", "namespace", ns]);
        s.ok(&["-n", ns, "create", "serviceaccount", "robot"]);
        s.ok(&[
            "-n",
            ns,
            "create",
            "rolebinding",
            "robot-edit",
            "--clusterrole=edit",
            &format!("--serviceaccount={ns}:robot"),
        ]);
    }
    let attacker = s.ok(&["-n", "team-a", "create", "token", "robot", "--duration=1h"]);
    let bystander = s.ok(&["-n", "team-b", "create", "token", "robot", "--duration=1h"]);
    let (attacker, bystander) = (attacker.trim().to_string(), bystander.trim().to_string());
    let ca = std::fs::read_to_string(s.dir.join("tls/ca.crt")).unwrap();
    let renewed = |m: &str| {
        s.get_json(&["lease", m, "-n", "orrery-member-lease"])["spec"]["renewTime"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let before = (renewed("m1"), renewed("m2"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        use tokio::io::AsyncWriteExt;
        // 50 POSTs announcing 100,000 bytes and sending one every half second.
        let mut slow = Vec::new();
        for i in 0..50 {
            let mut c = raw_tls(&s, "127.0.0.2", &ca).await.unwrap();
            let head = format!(
                "POST /api/v1/namespaces/team-a/configmaps HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {attacker}\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{{"
            );
            c.write_all(head.as_bytes()).await.unwrap();
            c.flush().await.unwrap();
            slow.push(tokio::spawn(async move {
                let started = tokio::time::Instant::now();
                let (mut rd, mut wr) = tokio::io::split(c);
                let trickle = tokio::spawn(async move {
                    for _ in 0..1000 {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        if wr.write_all(b" ").await.is_err() || wr.flush().await.is_err() {
                            return;
                        }
                    }
                });
                let (answer, closed) = read_to_close(&mut rd, Duration::from_secs(20)).await;
                trickle.abort();
                (i, answer, closed, started.elapsed())
            }));
        }
        // 60 that stop halfway through their headers, and 39 that say nothing at all: with the
        // 50 above, 149 of the source's 150.
        let mut half = Vec::new();
        for _ in 0..60 {
            let mut c = raw_tls(&s, "127.0.0.2", &ca).await.unwrap();
            c.write_all(b"POST /api/v1/namespaces/team-a/configmaps HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-")
                .await
                .unwrap();
            c.flush().await.unwrap();
            half.push(c);
        }
        let mut silent = Vec::new();
        for _ in 0..39 {
            silent.push(raw_tls(&s, "127.0.0.2", &ca).await.unwrap());
        }
        let opened = tokio::time::Instant::now();
        let last = raw_tls(&s, "127.0.0.2", &ca).await;
        assert!(last.is_ok(), "the 150th connection: {:?}", last.err());
        // The 151st is turned away at once; another source is not.
        let refused = raw_tls(&s, "127.0.0.2", &ca).await;
        assert!(refused.is_err(), "a connection beyond the source's limit was served");
        raw_tls(&s, "127.0.0.3", &ca).await.unwrap();
        drop(last);

        // Meanwhile another user writes, and so does the admin.
        let other = orrery_client::connect(&s.url, &bystander, &ca).await.unwrap();
        for i in 0..10 {
            let (code, _, body) = common::send(
                &other,
                common::req(
                    "POST",
                    "/api/v1/namespaces/team-b/configmaps",
                    "application/json",
                    serde_json::json!({"metadata": {"name": format!("cm-{i}")}, "data": {"a": "b"}}),
                ),
                None,
            )
            .await;
            assert_eq!(code, 201, "the bystander's write {i}: {body}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        s.ok(&["-n", "default", "create", "configmap", "by-admin", "--from-literal=a=b"]);

        // Half-sent headers and silence end with the header timeout.
        for (what, conns) in [("half-sent headers", half), ("silent", silent)] {
            for mut c in conns {
                let left = Duration::from_secs(10).saturating_sub(opened.elapsed());
                let (_, closed) = read_to_close(&mut c, left).await;
                assert!(closed, "a connection with {what} was held past the header timeout");
            }
        }
        // Every slow body is answered 408, and its connection closed.
        for t in slow {
            let (i, answer, closed, took) = t.await.unwrap();
            assert!(answer.starts_with("HTTP/1.1 408"), "slow body {i}: {answer:?}");
            assert!(closed, "slow body {i}: the connection stayed open");
            assert!(took < Duration::from_secs(15), "slow body {i} took {took:?}");
        }
        // The source's connections are its own again.
        raw_tls(&s, "127.0.0.2", &ca).await.unwrap();
    });
    // The members kept their sessions and renewed their heartbeats throughout.
    assert_eq!(s.cluster_condition("m1", "Ready"), "True");
    assert_eq!(s.cluster_condition("m2", "Ready"), "True");
    let after = (renewed("m1"), renewed("m2"));
    assert!(
        after.0 > before.0 && after.1 > before.1,
        "{before:?} -> {after:?}"
    );
    for m in [&m1, &m2] {
        let log = m.log();
        assert!(!log.contains("lost the server"), "{log}");
    }
}

/// Kubernetes' impersonation: `kubectl --as` acts as the user named, with that user's rights
/// (never the caller's), once the caller may impersonate them; whom it may not is 403, and the
/// audit log names both.
#[test]
fn kubectl_as_acts_as_the_user_named_when_the_caller_may_impersonate() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n",
    )
    .unwrap();
    let log = dir.path().join("audit.log");
    let s = Server::start_with(&[
        "--audit-policy-file",
        policy.to_str().unwrap(),
        "--audit-log-path",
        log.to_str().unwrap(),
    ]);
    s.ok(&["create", "namespace", "team-a"]);
    s.ok(&[
        "-n",
        "team-a",
        "create",
        "secret",
        "generic",
        "db",
        "--from-literal=p=s3cret",
    ]);
    s.ok(&[
        "-n",
        "team-a",
        "create",
        "rolebinding",
        "alice-view",
        "--clusterrole=view",
        "--user=alice",
    ]);
    // The admin asks as alice: alice's answers, not the admin's.
    let out = s.kubectl(&[
        "auth",
        "can-i",
        "get",
        "secrets",
        "-n",
        "team-a",
        "--as=alice",
    ]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "no");
    let err = s.fails(&["-n", "team-a", "get", "secrets", "--as=alice"]);
    assert!(
        err.contains("User \"alice\" cannot list resource \"secrets\""),
        "{err}"
    );
    s.ok(&["-n", "team-a", "get", "deployments", "--as=alice"]);
    let out = s.ok(&[
        "auth",
        "whoami",
        "--as=alice",
        "--as-group=devs",
        "-o",
        "json",
    ]);
    let me: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(me["status"]["userInfo"]["username"], "alice", "{me}");
    assert_eq!(me["status"]["userInfo"]["groups"][0], "devs", "{me}");
    // A ServiceAccount that may impersonate one user, and nobody else.
    s.ok(&["-n", "team-a", "create", "serviceaccount", "support"]);
    s.apply(
        r#"{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "impersonate-alice"},
            "rules": [{"apiGroups": [""], "resources": ["users"], "verbs": ["impersonate"], "resourceNames": ["alice"]}]}"#,
    );
    s.ok(&[
        "create",
        "clusterrolebinding",
        "support-impersonates-alice",
        "--clusterrole=impersonate-alice",
        "--serviceaccount=team-a:support",
    ]);
    let token = s.ok(&[
        "-n",
        "team-a",
        "create",
        "token",
        "support",
        "--duration=1h",
    ]);
    let as_support = |args: &[&str]| {
        let mut a = vec!["--token", token.trim()];
        a.extend_from_slice(args);
        s.kubectl(&a)
    };
    // Alone it may read nothing; as alice, what alice reads.
    assert!(
        !as_support(&["-n", "team-a", "get", "deployments"])
            .status
            .success()
    );
    let out = as_support(&["-n", "team-a", "get", "deployments", "--as=alice"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (args, says) in [
        (
            vec!["-n", "team-a", "get", "deployments", "--as=bob"],
            "users \"bob\" is forbidden: User \"system:serviceaccount:team-a:support\" cannot impersonate resource \"users\"",
        ),
        (
            vec![
                "-n",
                "team-a",
                "get",
                "secrets",
                "--as=alice",
                "--as-group=system:masters",
            ],
            "cannot impersonate resource \"groups\"",
        ),
    ] {
        let out = as_support(&args);
        assert!(!out.status.success(), "{args:?} was allowed");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
    // The audit log names the caller and whom it acted as.
    eventually(
        Duration::from_secs(10),
        "the impersonated read logged",
        || {
            events(&log).iter().any(|e| {
                e["user"]["username"] == "system:serviceaccount:team-a:support"
                    && e["impersonatedUser"]["username"] == "alice"
                    && e["objectRef"]["resource"] == "deployments"
                    && e["responseStatus"]["code"] == 200
            })
        },
    );
}

/// What the server keeps on disk (the store, which holds Secrets; the audit log, which may
/// hold what requests carried) is its owner's alone, whatever the umask.
#[test]
fn the_data_directory_its_files_and_the_audit_log_are_the_owners_alone() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: RequestResponse\n",
    )
    .unwrap();
    let log = dir.path().join("logs/audit.log");
    // A data directory anyone may read, as a umask of 022 makes them: the server narrows it.
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    let s = Server::start_in(
        data,
        &[
            "--audit-policy-file",
            policy.to_str().unwrap(),
            "--audit-log-path",
            log.to_str().unwrap(),
        ],
    );
    s.ok(&[
        "create",
        "secret",
        "generic",
        "db",
        "--from-literal=p=s3cret",
    ]);
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&s.dir), 0o700, "the data directory");
    for f in [
        "orrery.db",
        "orrery.db-wal",
        "orrery.db-shm",
        "admin.kubeconfig",
        "tls/ca.key",
    ] {
        assert_eq!(mode(&s.dir.join(f)), 0o600, "{f}");
    }
    eventually(Duration::from_secs(5), "the audit log written", || {
        log.exists()
    });
    assert_eq!(mode(&log), 0o600, "the audit log");
    assert_eq!(
        mode(log.parent().unwrap()),
        0o700,
        "the audit log's directory"
    );
}

/// A bootstrap token joins a cluster once its agent is not running: a second agent given the
/// same token while the first runs is refused (and tries again), the first keeps its identity
/// and its session; once the first is gone and its heartbeat lapses, the second takes over.
#[test]
fn a_bootstrap_token_takes_no_cluster_from_a_running_agent() {
    let s = Server::start_with(&["--cluster-grace-period", "4s"]);
    let token = s.token("c1");
    let args = [
        "--cluster",
        "c1",
        "--token",
        token.as_str(),
        "--simulate",
        "nodes=1,cpu=4,memory=8Gi",
        "--heartbeat-interval",
        "1s",
    ];
    let mut first = Agent::start(&s, "first", &args);
    eventually(Duration::from_secs(30), "c1 Ready", || {
        s.cluster_condition("c1", "Ready") == "True"
    });
    let first_token = first.cluster_token();
    let second = Agent::start(&s, "second", &args);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !second
        .log()
        .contains("refused to register this agent while another runs the cluster")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the second agent was not refused:\n{}",
            second.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        second.log().contains("its agent is connected"),
        "{}",
        second.log()
    );
    // The first keeps its token and its session.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(first.cluster_token(), first_token);
    assert!(
        !first.log().contains("the agent token was refused"),
        "{}",
        first.log()
    );
    assert_eq!(s.cluster_condition("c1", "Ready"), "True");
    // The first gone, its heartbeat lapses, and the second joins in its place.
    first.kill9();
    eventually(
        Duration::from_secs(60),
        "the second agent registered",
        || {
            second.output().iter().any(|l| l.contains("registered"))
                || second.log().contains("\"registered\"")
                || second.log().contains(" registered")
        },
    );
    eventually(Duration::from_secs(30), "c1 Ready again", || {
        s.cluster_condition("c1", "Ready") == "True"
    });
    assert_ne!(second.cluster_token(), first_token);
}
