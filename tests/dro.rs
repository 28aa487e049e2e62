//! The DRO-DS REST API (draft section 6) end to end: a real server, the draft's own request
//! examples, and kubectl to check that the REST calls and the Kubernetes view are one store.

use crate::common;

use std::time::Duration;

use common::{Agent, Server, eventually, req, send};
use serde_json::{Value, json};

const JSON: &str = "application/json";

async fn call(c: &kube::Client, method: &str, path: &str, body: Value) -> (u16, Value) {
    let (code, _, v) = send(c, req(method, path, JSON, body), None).await;
    (code, v)
}

/// Every error has the draft's shape.
fn assert_error(code: u16, v: &Value, want_status: u16, want_code: &str) {
    assert_eq!(code, want_status, "{v}");
    assert_eq!(v["code"], want_code, "{v}");
    assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(v["details"].is_object(), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusters_and_policies_through_the_drafts_examples() {
    let s = Server::start();
    let c = s.client().await;

    // 6.2.1: the draft's registration example, verbatim.
    let gcp = json!({"name": "gcp-production", "endpoint": "https://k8s.gcp.example", "capabilities": ["gpu", "tls-encryption"]});
    let (code, v) = call(&c, "POST", "/api/v1/clusters", gcp.clone()).await;
    assert_eq!(code, 201, "{v}");
    assert_eq!(v["name"], "gcp-production");
    assert_eq!(v["capabilities"], json!(["gpu", "tls-encryption"]));
    // kubectl sees the same Cluster.
    let k = s.get_json(&["cluster", "gcp-production"]);
    assert_eq!(k["spec"]["apiEndpoint"], "https://k8s.gcp.example");
    assert_eq!(k["spec"]["capabilities"], json!(["gpu", "tls-encryption"]));
    // And the reverse: one made with kubectl is listed.
    s.apply("apiVersion: multicluster.io/v1alpha1\nkind: Cluster\nmetadata: {name: aws-us-east}\nspec: {region: us-east-1}\n");
    let (code, v) = call(&c, "GET", "/api/v1/clusters", Value::Null).await;
    assert_eq!(code, 200, "{v}");
    let names: Vec<&str> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["aws-us-east", "gcp-production"]);
    // Twice: CLUSTER_EXISTS, with the name.
    let (code, v) = call(&c, "POST", "/api/v1/clusters", gcp).await;
    assert_error(code, &v, 409, "CLUSTER_EXISTS");
    assert_eq!(v["details"]["clusterName"], "gcp-production");
    // Bad input: each a documented code, nothing stored.
    for (body, field) in [
        (
            json!({"name": "Bad_Name", "endpoint": "https://x.example"}),
            "name",
        ),
        (
            json!({"name": "ok-name", "endpoint": "ftp://x.example"}),
            "endpoint",
        ),
    ] {
        let (code, v) = call(&c, "POST", "/api/v1/clusters", body).await;
        assert_error(code, &v, 400, "VALIDATION_FAILED");
        assert_eq!(v["details"]["fields"][0]["field"], field, "{v}");
    }
    for body in [
        json!({"name": 42}),
        json!({"endpoint": "https://x.example"}),
        json!({"name": "x", "colour": "blue"}),
    ] {
        let (code, v) = call(&c, "POST", "/api/v1/clusters", body).await;
        assert_error(code, &v, 400, "VALIDATION_FAILED");
    }
    assert!(!s.kubectl(&["get", "cluster", "ok-name"]).status.success());
    let (code, _, v) = send(
        &c,
        req(
            "POST",
            "/api/v1/clusters",
            "text/plain",
            json!({"name": "x"}),
        ),
        None,
    )
    .await;
    assert_error(code, &v, 415, "UNSUPPORTED_MEDIA_TYPE");

    // 6.2.2: the draft's policy example, verbatim.
    let policy = json!({"name": "cross-region-policy", "resourceType": "Deployment", "targetClusters": ["aws-us-east", "azure-europe"]});
    let (code, v) = call(&c, "POST", "/api/v1/propagationpolicies", policy.clone()).await;
    assert_eq!(code, 201, "{v}");
    assert_eq!(v["targetClusters"], json!(["aws-us-east", "azure-europe"]));
    let k = s.get_json(&["clusterpropagationpolicy", "cross-region-policy"]);
    assert_eq!(
        k["spec"]["resourceSelectors"][0],
        json!({"apiVersion": "apps/v1", "kind": "Deployment"})
    );
    assert_eq!(
        k["spec"]["placement"]["clusterAffinity"]["clusterNames"],
        json!(["aws-us-east", "azure-europe"])
    );
    // The draft's conflict example.
    let (code, v) = call(&c, "POST", "/api/v1/propagationpolicies", policy).await;
    assert_error(code, &v, 409, "POLICY_CONFLICT");
    assert_eq!(v["message"], "Policy name already exists");
    assert_eq!(v["details"], json!({"policyName": "cross-region-policy"}));
    // PATCH with merge-patch+json.
    let patch_targets = |to: &'static str| {
        send(
            &c,
            req(
                "PATCH",
                "/api/v1/propagationpolicies/cross-region-policy",
                "application/merge-patch+json",
                json!({"targetClusters": [to]}),
            ),
            None,
        )
    };
    let (code, _, v) = patch_targets("gcp-production").await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["targetClusters"], json!(["gcp-production"]));
    let k = s.get_json(&["clusterpropagationpolicy", "cross-region-policy"]);
    assert_eq!(
        k["spec"]["placement"]["clusterAffinity"]["clusterNames"],
        json!(["gcp-production"])
    );
    // A merge patch names no resourceVersion: another writer changing the policy meanwhile
    // (here kubectl, labelling it as fast as it can) makes it apply again, never a 409.
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let (stop, labelled) = (
        std::sync::Arc::new(AtomicBool::new(false)),
        std::sync::Arc::new(AtomicUsize::new(0)),
    );
    let writer = {
        let (stop, labelled, kubeconfig) = (stop.clone(), labelled.clone(), s.kubeconfig.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let n = labelled.load(Ordering::Relaxed) + 1;
                let out = std::process::Command::new("kubectl")
                    .env("KUBECONFIG", &kubeconfig)
                    .args(["label", "--overwrite"])
                    .args(["clusterpropagationpolicy", "cross-region-policy"])
                    .arg(format!("writer={n}"))
                    .output()
                    .unwrap();
                assert!(out.status.success(), "{out:?}");
                labelled.store(n, Ordering::Relaxed);
            }
        })
    };
    let mut i = 0;
    while i < 20 || labelled.load(Ordering::Relaxed) < 10 {
        let to = ["aws-us-east", "gcp-production"][i % 2];
        let (code, _, v) = patch_targets(to).await;
        assert_eq!(code, 200, "patch {i} with a concurrent writer: {v}");
        assert_eq!(v["targetClusters"], json!([to]));
        i += 1;
    }
    if i % 2 == 1 {
        // The last patch named aws-us-east: one more, so the policy ends as before.
        let (code, _, v) = patch_targets("gcp-production").await;
        assert_eq!(code, 200, "{v}");
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    eprintln!(
        "{i} patches while kubectl labelled the policy {} times",
        labelled.load(Ordering::Relaxed)
    );
    let k = s.get_json(&["clusterpropagationpolicy", "cross-region-policy"]);
    assert_eq!(
        k["spec"]["placement"]["clusterAffinity"]["clusterNames"],
        json!(["gcp-production"])
    );
    // Other patch types are refused.
    let (code, _, v) = send(
        &c,
        req(
            "PATCH",
            "/api/v1/propagationpolicies/cross-region-policy",
            JSON,
            json!({"targetClusters": []}),
        ),
        None,
    )
    .await;
    assert_error(code, &v, 415, "UNSUPPORTED_MEDIA_TYPE");
    // A kind that does not exist, a missing policy.
    let (code, v) = call(
        &c,
        "POST",
        "/api/v1/propagationpolicies",
        json!({"name": "p2", "resourceType": "Spaceship"}),
    )
    .await;
    assert_error(code, &v, 400, "VALIDATION_FAILED");
    let (code, v) = call(&c, "GET", "/api/v1/propagationpolicies/nope", Value::Null).await;
    assert_error(code, &v, 404, "POLICY_NOT_FOUND");
    let (code, v) = call(&c, "GET", "/api/v1/propagationpolicies", Value::Null).await;
    assert_eq!((code, v["count"].as_u64()), (200, Some(1)), "{v}");
    let (code, v) = call(
        &c,
        "DELETE",
        "/api/v1/propagationpolicies/cross-region-policy",
        Value::Null,
    )
    .await;
    assert_eq!(code, 200, "{v}");
    eventually(Duration::from_secs(10), "the policy gone", || {
        !s.kubectl(&["get", "clusterpropagationpolicy", "cross-region-policy"])
            .status
            .success()
    });

    // 6.2.5: a task for a template no policy places, a status nobody asked for.
    let task = json!({"resource": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "default", "name": "nobody"}});
    let (code, v) = call(&c, "POST", "/api/v1/bindings", task).await;
    assert_error(code, &v, 404, "BINDING_NOT_FOUND");
    assert_eq!(v["details"]["bindingId"], "default.nobody-deployment");
    let (code, v) = call(
        &c,
        "POST",
        "/api/v1/bindings",
        json!({"resource": {"kind": "Deployment"}}),
    )
    .await;
    assert_error(code, &v, 400, "VALIDATION_FAILED");
    for id in ["default.nobody-deployment", "no-dot-here"] {
        let (code, v) = call(
            &c,
            "GET",
            &format!("/api/v1/bindings/{id}/status"),
            Value::Null,
        )
        .await;
        assert_error(code, &v, 404, "BINDING_NOT_FOUND");
    }

    // DELETE a cluster; an unknown one is CLUSTER_NOT_FOUND.
    let (code, v) = call(&c, "DELETE", "/api/v1/clusters/gcp-production", Value::Null).await;
    assert_eq!(code, 200, "{v}");
    eventually(Duration::from_secs(20), "the cluster gone", || {
        !s.kubectl(&["get", "cluster", "gcp-production"])
            .status
            .success()
    });
    let (code, v) = call(&c, "DELETE", "/api/v1/clusters/nowhere", Value::Null).await;
    assert_error(code, &v, 404, "CLUSTER_NOT_FOUND");
    // A bad token: 401 in the draft's shape.
    let ca = std::fs::read_to_string(s.dir.join("tls/ca.crt")).unwrap();
    let stranger = orrery_client::connect(&s.url, "not-a-token", &ca)
        .await
        .unwrap();
    let (code, v) = call(&stranger, "GET", "/api/v1/clusters", Value::Null).await;
    assert_error(code, &v, 401, "UNAUTHORIZED");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_events_configs_and_the_monitoring_view() {
    let s = Server::start_with(&["--monitoring-interval", "1s"]);
    let token = s.token("aws-us-east");
    let _a = Agent::start(
        &s,
        "aws-us-east",
        &[
            "--cluster",
            "aws-us-east",
            "--token",
            &token,
            "--simulate",
            "nodes=2,cpu=8,memory=32Gi,load=0.1",
            "--heartbeat-interval",
            "1s",
        ],
    );
    eventually(Duration::from_secs(20), "Ready", || {
        s.cluster_condition("aws-us-east", "Ready") == "True"
    });
    s.apply("apiVersion: multicluster.io/v1alpha1\nkind: Cluster\nmetadata: {name: azure-europe}\nspec: {region: westeurope}\n");
    let c = s.client().await;

    // 6.3.1: the draft's metrics example. Its time is honoured: verbatim, it is older than
    // the history kept, and refused as such; at the present time it is the cluster's present.
    let report = json!({"cluster": "aws-us-east", "timestamp": "2023-07-20T08:30:00Z", "cpuUsage": 72.4, "memoryAvailable": 15.2});
    let (code, v) = call(&c, "PUT", "/api/v1/metrics", report).await;
    assert_error(code, &v, 400, "VALIDATION_FAILED");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("older than the 17 days"),
        "{v}"
    );
    let at = orrery_api::Time::now().to_string();
    let report = json!({"cluster": "aws-us-east", "timestamp": at, "cpuUsage": 72.4, "memoryAvailable": 15.2});
    let (code, v) = call(&c, "PUT", "/api/v1/metrics", report).await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["backfilled"], false, "{v}");
    let k = s.get_json(&["cluster", "aws-us-east"]);
    assert_eq!(k["status"]["metrics"]["cpuUsage"], 72.4, "{k}");
    assert_eq!(k["status"]["metrics"]["timestamp"], at.as_str());
    // Bad reports: documented codes, nothing stored.
    for (body, status, code_name) in [
        (
            json!({"cluster": "aws-us-east", "timestamp": "yesterday", "cpuUsage": 1.0, "memoryAvailable": 1.0}),
            400,
            "VALIDATION_FAILED",
        ),
        (
            json!({"cluster": "aws-us-east", "timestamp": at, "cpuUsage": "high", "memoryAvailable": 1.0}),
            400,
            "VALIDATION_FAILED",
        ),
        (
            json!({"cluster": "aws-us-east", "timestamp": at, "cpuUsage": 140.0, "memoryAvailable": 1.0}),
            400,
            "VALIDATION_FAILED",
        ),
        (
            json!({"cluster": "aws-us-east", "cpuUsage": 1.0, "memoryAvailable": 1.0}),
            400,
            "VALIDATION_FAILED",
        ),
        (
            json!({"cluster": "nowhere", "timestamp": at, "cpuUsage": 1.0, "memoryAvailable": 1.0}),
            404,
            "CLUSTER_NOT_FOUND",
        ),
    ] {
        let (code, v) = call(&c, "PUT", "/api/v1/metrics", body.clone()).await;
        assert_error(code, &v, status, code_name);
    }
    let k = s.get_json(&["cluster", "aws-us-east"]);
    assert_eq!(
        k["status"]["metrics"]["cpuUsage"], 72.4,
        "nothing stored: {k}"
    );

    // An agent reports only for its own cluster.
    let state: Value = serde_json::from_str(
        &std::fs::read_to_string(s.dir.join("agents/aws-us-east/state/state.json")).unwrap(),
    )
    .unwrap();
    let ca = std::fs::read_to_string(s.dir.join("tls/ca.crt")).unwrap();
    let agent = orrery_client::connect(&s.url, state["token"].as_str().unwrap(), &ca)
        .await
        .unwrap();
    let theirs = json!({"cluster": "azure-europe", "timestamp": at, "cpuUsage": 1.0, "memoryAvailable": 1.0});
    let (code, v) = call(&agent, "PUT", "/api/v1/metrics", theirs).await;
    assert_error(code, &v, 403, "FORBIDDEN");
    let mine = json!({"cluster": "aws-us-east", "timestamp": orrery_api::Time::now().to_string(), "cpuUsage": 10.0, "memoryAvailable": 20.0, "networkTraffic": 150000000.0, "pods": 12});
    let (code, v) = call(&agent, "PUT", "/api/v1/metrics", mine).await;
    assert_eq!(code, 200, "{v}");

    // Domain events: a failure lands in the failure history and as an Event.
    let ev = json!({"cluster": "aws-us-east", "type": "Failure", "reason": "StorageDegraded", "message": "disk array rebuilding"});
    let (code, v) = call(&c, "POST", "/api/v1/metrics/events", ev).await;
    assert_eq!(code, 201, "{v}");
    let (code, v) = call(
        &c,
        "GET",
        "/api/v1/history/failures?maxEntries=10",
        Value::Null,
    )
    .await;
    assert_eq!(code, 200, "{v}");
    assert!(
        v["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["reason"] == "StorageDegraded" && e["cluster"] == "aws-us-east"),
        "{v}"
    );
    let events = s.ok(&["get", "events", "-n", "default", "-o", "json"]);
    assert!(events.contains("StorageDegraded"), "{events}");
    let (code, v) = call(
        &c,
        "POST",
        "/api/v1/metrics/events",
        json!({"cluster": "aws-us-east", "type": "Mystery", "reason": "x"}),
    )
    .await;
    assert_error(code, &v, 400, "VALIDATION_FAILED");

    // 6.3.2: a domain's configuration.
    let cfg = json!({"cluster": "azure-europe", "labels": {"tier": "gold"}, "capabilities": ["gpu"],
        "taints": [{"key": "maintenance", "effect": "NoSchedule"}]});
    let (code, v) = call(&c, "PUT", "/api/v1/sync/configs", cfg).await;
    assert_eq!(code, 200, "{v}");
    let k = s.get_json(&["cluster", "azure-europe"]);
    assert_eq!(k["metadata"]["labels"]["tier"], "gold");
    assert_eq!(k["spec"]["capabilities"], json!(["gpu"]));
    assert_eq!(k["spec"]["taints"][0]["key"], "maintenance");
    let bad = json!({"cluster": "azure-europe", "taints": [{"key": "x", "effect": "Sometimes"}]});
    let (code, v) = call(&c, "PUT", "/api/v1/sync/configs", bad).await;
    assert_error(code, &v, 400, "VALIDATION_FAILED");
    let (code, v) = call(
        &agent,
        "PUT",
        "/api/v1/sync/configs",
        json!({"cluster": "azure-europe", "capabilities": []}),
    )
    .await;
    assert_error(code, &v, 403, "FORBIDDEN");
    // Nor its own cluster's labels, taints or capabilities (a compromised member must not
    // attract workloads): the admin's taint and label stay. Its own properties it reports.
    s.ok(&["label", "cluster", "aws-us-east", "tier=standard"]);
    s.ok(&[
        "patch",
        "cluster",
        "aws-us-east",
        "--type=merge",
        "-p",
        r#"{"spec": {"taints": [{"key": "audit", "value": "true", "effect": "NoSchedule"}]}}"#,
    ]);
    for grab in [
        json!({"cluster": "aws-us-east", "labels": {"tier": "secure"}}),
        json!({"cluster": "aws-us-east", "taints": []}),
        json!({"cluster": "aws-us-east", "capabilities": ["gpu"]}),
    ] {
        let (code, v) = call(&agent, "PUT", "/api/v1/sync/configs", grab.clone()).await;
        assert_error(code, &v, 403, "FORBIDDEN");
        assert!(
            v["message"]
                .as_str()
                .unwrap()
                .contains("an agent reports properties only"),
            "{grab}: {v}"
        );
    }
    let k = s.get_json(&["cluster", "aws-us-east"]);
    assert_eq!(k["metadata"]["labels"]["tier"], "standard", "{k}");
    assert!(
        k["spec"]["taints"]
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t["key"] == "audit")),
        "{k}"
    );
    let (code, v) = call(
        &agent,
        "PUT",
        "/api/v1/sync/configs",
        json!({"cluster": "aws-us-east", "properties": {"rack": "r7"}}),
    )
    .await;
    // (The agent's next report replaces them with what it measures.)
    assert_eq!(code, 200, "{v}");

    // 6.4.1: the realtime view has the draft's fields.
    let (code, v) = call(&c, "GET", "/api/v1/monitor/realtime", Value::Null).await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["activeClusters"], 1, "{v}");
    assert!(v["totalPods"].is_number(), "{v}");
    assert!(
        v["networkTraffic"]
            .as_str()
            .is_some_and(|t| t.ends_with("bps")),
        "{v}"
    );
    assert_eq!(v["clusters"].as_array().unwrap().len(), 2, "{v}");
    // Each reporting cluster with its water levels.
    assert!(
        v["clusters"].as_array().unwrap().iter().any(|c| {
            c["waterLevel"]["overall"].as_f64().is_some_and(|l| l > 0.0)
                && c["waterLevel"]["cpu"].is_number()
        }),
        "{v}"
    );
    // Requests for paths and methods made up by clients (without a token, and with the
    // admin's): they must not make series of their own.
    let ca = std::fs::read_to_string(s.dir.join("tls/ca.crt")).unwrap();
    let stranger = orrery_client::connect(&s.url, "not-a-token", &ca)
        .await
        .unwrap();
    for i in 0..20 {
        for client in [&stranger, &c] {
            let (code, _, _) = send(
                client,
                req("GET", &format!("/madeup{i}/x"), JSON, Value::Null),
                None,
            )
            .await;
            assert!(code == 401 || code == 404, "{code}");
            let (code, _, _) = send(
                client,
                req("GET", &format!("/api/v1/madeup{i}"), JSON, Value::Null),
                None,
            )
            .await;
            assert!(code == 401 || code == 404, "{code}");
        }
    }
    // Prometheus exposition: request latencies, water levels, the scheduler. OpenMetrics for
    // a scraper that asks for it (Prometheus does), the classic text format otherwise.
    let mut om = req("GET", "/metrics", JSON, Value::Null);
    om.headers_mut().insert(
        "Accept",
        "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
            .parse()
            .unwrap(),
    );
    let (code, headers, _) = send(&c, om.clone(), None).await;
    assert_eq!(code, 200);
    assert!(
        headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text"),
        "{headers:?}"
    );
    let openmetrics = c.request_text(om).await.unwrap();
    assert!(openmetrics.trim_end().ends_with("# EOF"), "{openmetrics}");
    assert!(
        openmetrics.contains("# TYPE orrery_scheduler_decisions counter"),
        "{openmetrics}"
    );
    let (code, headers, _) = send(&c, req("GET", "/metrics", JSON, Value::Null), None).await;
    assert_eq!(code, 200);
    assert!(
        headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain; version=0.0.4"),
        "{headers:?}"
    );
    let text = c
        .request_text(req("GET", "/metrics", JSON, Value::Null))
        .await
        .unwrap();
    assert!(
        text.contains("# TYPE orrery_scheduler_decisions_total counter"),
        "{text}"
    );
    assert!(!text.contains("madeup"), "{text}");
    assert!(text.contains("resource=\"other\""), "{text}");
    for family in [
        "orrery_http_request_duration_seconds_bucket{",
        "orrery_cluster_water_level{cluster=\"aws-us-east\",dimension=\"cpu\"}",
        "orrery_cluster_heartbeat_age_seconds{cluster=\"aws-us-east\"}",
        "orrery_clusters_ready 1",
        "orrery_works_pending ",
        "orrery_scheduler_queue_depth ",
        "orrery_scheduler_decision_duration_seconds_bucket{",
    ] {
        assert!(text.contains(family), "{family} missing:\n{text}");
    }
    // Every sample line is `name{labels} value`.
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line.rsplit_once(' ').unwrap();
        assert!(
            value.parse::<f64>().is_ok() || ["NaN", "+Inf", "-Inf"].contains(&value),
            "{line}"
        );
        let name = series.split('{').next().unwrap();
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == ':'),
            "{line}"
        );
    }
    // Prometheus' own linter accepts it (`./scripts/test` provides promtool).
    let promtool = std::env::var("ORRERY_PROMTOOL").unwrap_or_else(|_| "promtool".into());
    let mut child = std::process::Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {promtool} ({e}); ./scripts/test provides it, or set ORRERY_PROMTOOL"
            )
        });
    {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let (code, _, _) = send(&agent, req("GET", "/metrics", JSON, Value::Null), None).await;
    assert_eq!(code, 403);

    // The time series: samples every second here, the last report in the newest.
    let mut last = Value::Null;
    for _ in 0..50 {
        let (code, v) = call(
            &c,
            "GET",
            "/api/v1/monitor/history?cluster=aws-us-east",
            Value::Null,
        )
        .await;
        assert_eq!(code, 200, "{v}");
        last = v;
        let points = last["points"].as_array().unwrap();
        if points.len() >= 2
            && points.last().unwrap()["clusters"]["aws-us-east"]["cpuUsage"] == 10.0
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let points = last["points"].as_array().unwrap();
    assert!(points.len() >= 2, "{last}");
    let newest = points.last().unwrap();
    assert_eq!(
        newest["clusters"]["aws-us-east"]["cpuUsage"], 10.0,
        "{last}"
    );
    assert!(
        newest["clusters"].get("azure-europe").is_none(),
        "filtered to one cluster"
    );
    assert!(
        points[0]["time"].as_str() <= newest["time"].as_str(),
        "oldest first"
    );
    let (code, v) = call(
        &c,
        "GET",
        "/api/v1/monitor/history?resolution=hourly",
        Value::Null,
    )
    .await;
    assert_error(code, &v, 400, "VALIDATION_FAILED");

    // Agents do not read the fleet's monitoring view.
    let (code, v) = call(&agent, "GET", "/api/v1/monitor/realtime", Value::Null).await;
    assert_error(code, &v, 403, "FORBIDDEN");
}

/// The monitoring system forecasts every cluster's water levels and traffic from its history
/// (a 20-second season here, samples every second), serves them with their intervals and
/// model, and keeps them through a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forecasts_of_every_cluster_are_served_and_kept_through_a_restart() {
    let mut s = Server::start_with(&[
        "--monitoring-interval",
        "1s",
        "--forecast-season",
        "20s",
        "--forecast-horizon",
        "10s",
    ]);
    let token = s.token("edge");
    let _a = Agent::start(
        &s,
        "edge",
        &[
            "--cluster",
            "edge",
            "--token",
            &token,
            "--simulate",
            "nodes=2,cpu=8,memory=32Gi,load=0.3,profile=diurnal,period=20s,noise=0.05",
            "--heartbeat-interval",
            "1s",
        ],
    );
    eventually(Duration::from_secs(20), "Ready", || {
        s.cluster_condition("edge", "Ready") == "True"
    });
    let c = s.client().await;
    let mut last = Value::Null;
    for _ in 0..150 {
        let (code, v) = call(
            &c,
            "GET",
            "/api/v1/monitor/forecast?cluster=edge",
            Value::Null,
        )
        .await;
        assert_eq!(code, 200, "{v}");
        last = v;
        if last["clusters"][0]["series"]["cpu"]["points"]
            .as_array()
            .is_some_and(|p| p.len() == 10)
            && last["clusters"][0]["series"]["cpu"]["backtestMase"].is_number()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let edge = &last["clusters"][0];
    assert_eq!(edge["cluster"], "edge", "{last}");
    assert_eq!(
        (edge["stepSeconds"].as_u64(), edge["seasonSeconds"].as_u64()),
        (Some(1), Some(20)),
        "{last}"
    );
    for name in ["cpu", "memory", "pods", "traffic"] {
        let series = &edge["series"][name];
        assert!(
            ["naive", "seasonal-naive", "ets", "mstl-ets", "mstl-ar"]
                .contains(&series["model"].as_str().unwrap_or("")),
            "{name}: {last}"
        );
        for p in series["points"].as_array().unwrap() {
            let f = |k: &str| p[k].as_f64().unwrap();
            assert!(
                f("lower95") <= f("lower80") && f("lower80") <= f("mean"),
                "{p}"
            );
            assert!(
                f("mean") <= f("upper80") && f("upper80") <= f("upper95"),
                "{p}"
            );
        }
    }
    assert!(
        edge["series"]["cpu"]["backtestMase"].as_f64().is_some(),
        "{last}"
    );
    let first = edge["series"]["cpu"]["points"][0]["time"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        first.as_str() > edge["time"].as_str().unwrap(),
        "points come after the sample"
    );

    // A horizon cuts the points; bad parameters and unknown clusters get the draft's errors.
    let (code, v) = call(
        &c,
        "GET",
        "/api/v1/monitor/forecast?horizon=5s",
        Value::Null,
    )
    .await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(
        v["clusters"][0]["series"]["cpu"]["points"]
            .as_array()
            .unwrap()
            .len(),
        5,
        "{v}"
    );
    let (code, v) = call(
        &c,
        "GET",
        "/api/v1/monitor/forecast?horizon=soon",
        Value::Null,
    )
    .await;
    assert_error(code, &v, 400, "VALIDATION_FAILED");
    let (code, v) = call(
        &c,
        "GET",
        "/api/v1/monitor/forecast?cluster=nowhere",
        Value::Null,
    )
    .await;
    assert_error(code, &v, 404, "CLUSTER_NOT_FOUND");

    // Stored: a restarted server serves them before it has sampled anything.
    s.kill9();
    s.restart();
    let c = s.client().await;
    let (code, v) = call(
        &c,
        "GET",
        "/api/v1/monitor/forecast?cluster=edge",
        Value::Null,
    )
    .await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["clusters"][0]["cluster"], "edge", "{v}");
}

/// 6.2.5, a standalone task (draft 7.1: requirements and priority, no template): placed like
/// any binding, shown by kubectl, never rendered into Works, ended by DELETE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_tasks_are_placed_and_ended() {
    let sim = "nodes=2,cpu=8,memory=32Gi,load=0.2,start=100ms";
    let f = common::fleet::Fleet::start_sims(
        &[("east", "us-east", sim), ("west", "eu-west", sim)],
        &[],
    );
    let c = f.s.client().await;
    let task = json!({"task": {"name": "train", "replicas": 4, "priority": 5,
        "requirements": {"cpu": "1", "memory": "1Gi"}}});
    let (code, v) = call(&c, "POST", "/api/v1/bindings", task.clone()).await;
    assert_eq!(code, 202, "{v}");
    let id = v["bindingId"].as_str().unwrap().to_string();
    assert_eq!(id, "orrery-system.train-task");
    let status = format!("/api/v1/bindings/{id}/status");
    let mut st = Value::Null;
    for _ in 0..100 {
        let (code, v) = call(&c, "GET", &status, Value::Null).await;
        assert_eq!(code, 200, "{v}");
        st = v;
        if st["state"] == "Scheduled" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(st["state"], "Scheduled", "{st}");
    assert_eq!(
        (st["standalone"].as_bool(), st["priority"].as_i64()),
        (Some(true), Some(5))
    );
    let placed: i64 = st["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["replicas"].as_i64().unwrap())
        .sum();
    assert_eq!(placed, 4, "{st}");
    assert_eq!(st["reasons"].as_array().map(Vec::len), Some(2), "{st}");
    // kubectl sees the binding; no Work was rendered for it, and the controller that binds
    // templates has left it alone.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rb =
        f.s.get_json(&["resourcebinding", "-n", "orrery-system", "train-task"]);
    assert_eq!(
        rb["metadata"]["labels"]["multicluster.io/task"], "standalone",
        "{rb}"
    );
    assert_eq!(
        rb["spec"]["replicaRequirements"]["resourceRequest"]["cpu"], "1",
        "{rb}"
    );
    let works = f.s.get_json(&["works", "-A"]);
    assert!(
        !works.to_string().contains("train-task"),
        "a standalone task got a Work: {works}"
    );
    // The same name twice; bad input.
    let (code, v) = call(&c, "POST", "/api/v1/bindings", task).await;
    assert_error(code, &v, 409, "BINDING_EXISTS");
    assert_eq!(v["details"]["bindingId"], id.as_str());
    for (body, field) in [
        (
            json!({"task": {"name": "x", "replicas": 0}}),
            "task.replicas",
        ),
        (
            json!({"task": {"name": "x", "requirements": {"cpu": "-2"}}}),
            "task.requirements[cpu]",
        ),
        (
            json!({"task": {"name": "x", "namespace": "nowhere"}}),
            "task.namespace",
        ),
        (
            json!({"task": {"name": "x", "placement": {"waterLevelLimit": 7}}}),
            "task.placement.waterLevelLimit",
        ),
        (
            json!({"task": {"name": "x"}, "resource": {"apiVersion": "v1", "kind": "ConfigMap", "name": "c"}}),
            "task",
        ),
    ] {
        let (code, v) = call(&c, "POST", "/api/v1/bindings", body.clone()).await;
        assert_error(code, &v, 400, "VALIDATION_FAILED");
        assert!(
            v["details"]["fields"]
                .as_array()
                .is_some_and(|f| f.iter().any(|e| e["field"] == field)),
            "{body}: {v}"
        );
    }
    let (code, v) = call(
        &c,
        "POST",
        "/api/v1/bindings",
        json!({"task": {"name": "x", "gpus": 1}}),
    )
    .await;
    assert_error(code, &v, 400, "VALIDATION_FAILED");
    // More than the fleet has: unschedulable, and why.
    let huge = json!({"task": {"name": "huge", "requirements": {"cpu": "64"}}});
    let (code, v) = call(&c, "POST", "/api/v1/bindings", huge).await;
    assert_eq!(code, 202, "{v}");
    let huge_status = "/api/v1/bindings/orrery-system.huge-task/status";
    let mut st = Value::Null;
    for _ in 0..100 {
        st = call(&c, "GET", huge_status, Value::Null).await.1;
        if st["state"] != "Pending" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(st["state"], "Unschedulable", "{st}");
    assert!(
        st["filtered"].as_object().is_some_and(|f| !f.is_empty()),
        "{st}"
    );
    assert!(st["clusters"].as_array().unwrap().is_empty(), "{st}");

    // A template's binding is not a task to end.
    f.s.apply(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cfg, namespace: default}\ndata: {a: b}\n---\n\
         apiVersion: policy.karmada.io/v1alpha1\nkind: PropagationPolicy\nmetadata: {name: cfg, namespace: default}\n\
         spec:\n  resourceSelectors: [{apiVersion: v1, kind: ConfigMap, name: cfg}]\n  placement: {clusterAffinity: {clusterNames: [east]}}\n",
    );
    let mut code = 0;
    for _ in 0..100 {
        code = call(
            &c,
            "GET",
            "/api/v1/bindings/default.cfg-configmap/status",
            Value::Null,
        )
        .await
        .0;
        if code == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(code, 200);
    let (code, v) = call(
        &c,
        "DELETE",
        "/api/v1/bindings/default.cfg-configmap",
        Value::Null,
    )
    .await;
    assert_error(code, &v, 409, "CONFLICT");
    assert!(
        f.s.kubectl(&["get", "resourcebinding", "-n", "default", "cfg-configmap"])
            .status
            .success()
    );

    // DELETE ends the task; then it is gone, and a second DELETE finds nothing.
    let (code, v) = call(&c, "DELETE", &format!("/api/v1/bindings/{id}"), Value::Null).await;
    assert_eq!((code, &v["state"]), (200, &json!("Deleted")), "{v}");
    let (code, v) = call(&c, "GET", &status, Value::Null).await;
    assert_error(code, &v, 404, "BINDING_NOT_FOUND");
    let (code, v) = call(&c, "DELETE", &format!("/api/v1/bindings/{id}"), Value::Null).await;
    assert_error(code, &v, 404, "BINDING_NOT_FOUND");
}
