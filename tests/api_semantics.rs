//! Finer points of the Kubernetes API contract, over HTTPS against a real `orrery server`:
//! content types, field validation modes, names and generations, resourceVersion semantics
//! of lists, bookmarks, CRD clean-up, and the serving certificate's names.

use crate::common;

use std::time::Duration;

use common::{Server, eventually, req, send};
use futures_util::StreamExt;
use serde_json::{Value, json};

fn cm(name: &str, extra: Value) -> Value {
    let mut v = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}});
    if let (Value::Object(m), Value::Object(e)) = (&mut v, extra) {
        m.extend(e);
    }
    v
}

const CMS: &str = "/api/v1/namespaces/default/configmaps";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_content_types_and_field_validation_modes() {
    let s = Server::start();
    let c = s.client().await;
    let aggregated =
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json";
    let (code, headers, body) = send(
        &c,
        req("GET", "/apis", "application/json", Value::Null),
        Some(aggregated),
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(
        headers["content-type"],
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
        "the exact content type client-go checks"
    );
    assert_eq!(body["kind"], "APIGroupDiscoveryList");
    let (_, headers, body) = send(
        &c,
        req("GET", "/apis", "application/json", Value::Null),
        Some("application/json"),
    )
    .await;
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(body["kind"], "APIGroupList");

    // Warn (the default): stored without the unknown field, with a Warning header.
    let (code, headers, body) = send(
        &c,
        req(
            "POST",
            CMS,
            "application/json",
            cm("warned", json!({"bogus": 1})),
        ),
        None,
    )
    .await;
    assert_eq!(code, 201);
    let warning = headers
        .get("warning")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    assert!(
        warning.starts_with("299 - ") && warning.contains("unknown field \\\"bogus\\\""),
        "{warning}"
    );
    assert!(body.get("bogus").is_none());
    // Ignore: no warning either.
    let (code, headers, _) = send(
        &c,
        req(
            "POST",
            &format!("{CMS}?fieldValidation=Ignore"),
            "application/json",
            cm("ignored", json!({"bogus": 1})),
        ),
        None,
    )
    .await;
    assert_eq!(code, 201);
    assert!(headers.get("warning").is_none());
    // Strict: refused as kube-apiserver does, a decoding error (400), not an invalid
    // object (422).
    let (code, _, body) = send(
        &c,
        req(
            "POST",
            &format!("{CMS}?fieldValidation=Strict"),
            "application/json",
            cm("strict", json!({"bogus": 1})),
        ),
        None,
    )
    .await;
    assert_eq!((code, body["reason"].as_str()), (400, Some("BadRequest")));
    assert_eq!(
        body["message"],
        "ConfigMap in version \"v1\" cannot be handled as a ConfigMap: strict decoding error: unknown field \"bogus\""
    );
    let (code, _, _) = send(
        &c,
        req(
            "POST",
            &format!("{CMS}?fieldValidation=Sometimes"),
            "application/json",
            cm("x", json!({})),
        ),
        None,
    )
    .await;
    assert_eq!(code, 400);
    // Malformed YAML bodies are a BadRequest.
    let r = http::Request::builder()
        .method("POST")
        .uri(CMS)
        .header("Content-Type", "application/yaml")
        .body(b"metadata: {name: [unclosed".to_vec())
        .unwrap();
    let (code, _, body) = send(&c, r, None).await;
    assert_eq!((code, body["reason"].as_str()), (400, Some("BadRequest")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_names_and_generations() {
    let s = Server::start();
    let c = s.client().await;
    let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "job-"}, "data": {}});
    let (code, _, made) = send(&c, req("POST", CMS, "application/json", body), None).await;
    assert_eq!(code, 201);
    let name = made["metadata"]["name"].as_str().unwrap();
    assert!(name.starts_with("job-") && name.len() == 9, "{name}");
    assert!(
        made["metadata"]["generation"].is_null(),
        "kube-apiserver gives a ConfigMap no generation: {made}"
    );
    assert!(
        made["metadata"]["uid"]
            .as_str()
            .is_some_and(|u| u.len() == 36)
    );

    s.apply("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: g}\nspec:\n  selector: {matchLabels: {app: g}}\n  template:\n    metadata: {labels: {app: g}}\n    spec: {containers: [{name: c, image: x}]}\n");
    s.ok(&["label", "deploy", "g", "extra=yes"]);
    assert_eq!(
        s.ok(&[
            "get",
            "deploy",
            "g",
            "-o",
            "jsonpath={.metadata.generation}"
        ]),
        "1",
        "metadata changes keep the generation"
    );
    s.ok(&["set", "image", "deploy/g", "c=y"]);
    assert_eq!(
        s.ok(&[
            "get",
            "deploy",
            "g",
            "-o",
            "jsonpath={.metadata.generation}"
        ]),
        "2",
        "spec changes bump it"
    );
}

/// As kube-apiserver: a terminating namespace's conditions say what it waits for, and a
/// Namespace has no generation.
#[test]
fn a_terminating_namespace_says_what_it_waits_for() {
    let s = Server::start();
    s.ok(&["create", "namespace", "going"]);
    assert_eq!(
        s.ok(&[
            "get",
            "ns",
            "going",
            "-o",
            "jsonpath={.metadata.generation}"
        ]),
        ""
    );
    s.apply("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: kept, namespace: going, finalizers: [example.com/keep]}\n");
    s.ok(&["delete", "ns", "going", "--wait=false"]);
    eventually(
        Duration::from_secs(10),
        "the conditions of a terminating namespace",
        || {
            let ns = s.get_json(&["ns", "going"]);
            let conds = ns["status"]["conditions"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let by = |t: &str| {
                conds
                    .iter()
                    .find(|c| c["type"] == t)
                    .cloned()
                    .unwrap_or(Value::Null)
            };
            ns["status"]["phase"] == "Terminating"
                && by("NamespaceContentRemaining")["status"] == "True"
                && by("NamespaceContentRemaining")["message"]
                    == "Some resources are remaining: configmaps. has 1 resource instances"
                && by("NamespaceFinalizersRemaining")["message"]
                    == "Some content in the namespace has finalizers remaining: example.com/keep in 1 resource instances"
                && by("NamespaceDeletionDiscoveryFailure")["status"] == "False"
        },
    );
    s.ok(&[
        "patch",
        "cm",
        "kept",
        "-n",
        "going",
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":null}}"#,
    ]);
    eventually(Duration::from_secs(10), "the namespace gone", || {
        !s.kubectl(&["get", "ns", "going"]).status.success()
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_at_exact_revisions_and_expired_history() {
    let s = Server::start_with(&["--compaction-interval", "1s"]);
    let c = s.client().await;
    for i in 0..3 {
        send(
            &c,
            req(
                "POST",
                CMS,
                "application/json",
                cm(&format!("a{i}"), json!({})),
            ),
            None,
        )
        .await;
    }
    let (_, _, list) = send(&c, req("GET", CMS, "", Value::Null), None).await;
    let at = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    send(
        &c,
        req("POST", CMS, "application/json", cm("later", json!({}))),
        None,
    )
    .await;
    // Exact: the list as it was then.
    let (code, _, then) = send(
        &c,
        req(
            "GET",
            &format!("{CMS}?resourceVersion={at}&resourceVersionMatch=Exact"),
            "",
            Value::Null,
        ),
        None,
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(then["items"].as_array().unwrap().len(), 3);
    assert_eq!(then["metadata"]["resourceVersion"], at.as_str());
    // A page and its continue token, then history moves on.
    let (_, _, page) = send(
        &c,
        req("GET", &format!("{CMS}?limit=2"), "", Value::Null),
        None,
    )
    .await;
    let token = page["metadata"]["continue"].as_str().unwrap().to_string();
    for i in 0..4 {
        send(
            &c,
            req(
                "PATCH",
                &format!("{CMS}/later"),
                "application/merge-patch+json",
                json!({"data": {"n": i.to_string()}}),
            ),
            None,
        )
        .await;
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    let (code, _, body) = send(
        &c,
        req(
            "GET",
            &format!("{CMS}?resourceVersion={at}&resourceVersionMatch=Exact"),
            "",
            Value::Null,
        ),
        None,
    )
    .await;
    assert_eq!((code, body["reason"].as_str()), (410, Some("Expired")));
    let (code, _, body) = send(
        &c,
        req(
            "GET",
            &format!("{CMS}?limit=2&continue={token}"),
            "",
            Value::Null,
        ),
        None,
    )
    .await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (410, Some("Expired")),
        "{body}"
    );
    // Bad combinations are refused.
    let (code, _, _) = send(
        &c,
        req(
            "GET",
            &format!("{CMS}?resourceVersionMatch=Exact"),
            "",
            Value::Null,
        ),
        None,
    )
    .await;
    assert_eq!(code, 400);
    let (code, _, _) = send(
        &c,
        req("GET", &format!("{CMS}?continue=garbage"), "", Value::Null),
        None,
    )
    .await;
    assert_eq!(code, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_get_bookmarks() {
    let s = Server::start_with(&["--watch-bookmark-interval", "1s"]);
    let c = s.client().await;
    let cms: kube::Api<k8s_openapi::api::core::v1::ConfigMap> = kube::Api::namespaced(c, "default");
    let mut w = cms
        .watch(&kube::api::WatchParams::default().timeout(10), "0")
        .await
        .unwrap()
        .boxed();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(8);
    let mut bookmark = None;
    while let Ok(Some(ev)) = tokio::time::timeout_at(deadline, w.next()).await {
        if let Ok(kube::core::WatchEvent::Bookmark(b)) = ev {
            bookmark = Some(b);
            break;
        }
    }
    let b = bookmark.expect("a bookmark within the interval");
    assert!(b.metadata.resource_version.parse::<i64>().is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_ending_for_its_timeout_leaves_its_client_a_fresh_bookmark() {
    // The periodic bookmark is a minute away: the one seen is the watch's last word.
    let s = Server::start();
    let c = s.client().await;
    let cms: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(c.clone(), "default");
    let w = cms
        .watch(&kube::api::WatchParams::default().timeout(2), "0")
        .await
        .unwrap();
    // Written elsewhere (a Secret) while the watch runs: nothing for this watcher, but its
    // next watch may start after it.
    let other: kube::Api<k8s_openapi::api::core::v1::Secret> = kube::Api::namespaced(c, "default");
    let secret: k8s_openapi::api::core::v1::Secret =
        serde_json::from_value(json!({"metadata": {"name": "elsewhere"}})).unwrap();
    let written = other
        .create(&Default::default(), &secret)
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap()
        .parse::<i64>()
        .unwrap();
    let events: Vec<_> = tokio::time::timeout(Duration::from_secs(10), w.collect::<Vec<_>>())
        .await
        .expect("the watch ends at its timeout");
    match events.last() {
        Some(Ok(kube::core::WatchEvent::Bookmark(b))) => {
            let rv = b.metadata.resource_version.parse::<i64>().unwrap();
            assert!(rv >= written, "bookmark at {rv}, written at {written}");
        }
        other => panic!("the watch's last event is not a bookmark: {other:?}"),
    }
}

#[test]
fn deleting_a_crd_deletes_its_objects() {
    let s = Server::start();
    let crd = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
spec:
  group: example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, x-kubernetes-preserve-unknown-fields: true}
"#;
    s.apply(crd);
    eventually(Duration::from_secs(10), "the kind to be served", || {
        s.kubectl(&["get", "widgets"]).status.success()
    });
    for i in 0..3 {
        s.apply(&format!("apiVersion: example.com/v1\nkind: Widget\nmetadata: {{name: w{i}}}\nspec: {{size: {i}}}\n"));
    }
    s.ok(&["delete", "crd", "widgets.example.com"]);
    // Defined again, the kind starts empty: the objects went with the old definition.
    s.apply(crd);
    eventually(
        Duration::from_secs(20),
        "the kind to be served again, empty",
        || {
            let out = s.kubectl(&["get", "widgets", "-o", "name"]);
            out.status.success() && String::from_utf8_lossy(&out.stdout).trim().is_empty()
        },
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_serving_certificate_carries_extra_names() {
    let s = Server::start_with(&["--tls-san", "orrery.example.test"]);
    let token = std::fs::read_to_string(&s.kubeconfig)
        .unwrap()
        .lines()
        .find_map(|l| l.trim().strip_prefix("token: ").map(str::to_string))
        .unwrap();
    let ca = std::fs::read_to_string(s.dir.join("tls/ca.crt")).unwrap();
    let check = |name: &str| {
        let (url, token, ca, name) = (s.url.clone(), token.clone(), ca.clone(), name.to_string());
        async move {
            let mut cfg = orrery_client::config_for(&url, &token, Some(&ca))
                .await
                .unwrap();
            cfg.tls_server_name = Some(name);
            let c = kube::Client::try_from(cfg).unwrap();
            c.request_text(req("GET", "/version", "", Value::Null))
                .await
        }
    };
    assert!(
        check("orrery.example.test").await.is_ok(),
        "the extra name is in the certificate"
    );
    assert!(check("localhost").await.is_ok());
    assert!(
        check("elsewhere.example.test").await.is_err(),
        "other names are not"
    );
}

/// A watch from a resourceVersion the server has not reached is answered as kube-apiserver
/// answers it ("Too large resource version", 504, a `ResourceVersionTooLarge` cause) after a
/// short wait, as a list is; a watch from the current one streams what follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_from_a_future_resource_version_is_told_so() {
    let s = Server::start();
    // A client that does not try again (kube-rs and client-go do, as Retry-After says: each
    // try is told the same).
    let kubeconfig = kube::config::Kubeconfig::read_from(&s.kubeconfig).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    config.default_retry = false;
    let c = kube::Client::try_from(config).unwrap();
    let started = std::time::Instant::now();
    let (code, _, body) = tokio::time::timeout(
        Duration::from_secs(30),
        send(
            &c,
            req(
                "GET",
                &format!("{CMS}?watch=true&resourceVersion=999999999"),
                "",
                Value::Null,
            ),
            None,
        ),
    )
    .await
    .expect("answered, not left hanging");
    assert_eq!(code, 504, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with("Too large resource version: 999999999, current: "),
        "{body}"
    );
    assert_eq!(
        body["details"]["causes"][0]["reason"], "ResourceVersionTooLarge",
        "{body}"
    );
    // After a short wait for the revision to come, as kube-apiserver waits.
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
}

/// What Kubernetes refuses, refused: counts beyond an int32 (typed clients could not read them
/// back), bytes that are not base64; a Secret without a type is Opaque; and the namespaces the
/// server lives in cannot be deleted.
#[test]
fn out_of_range_counts_bad_base64_untyped_secrets_and_system_namespaces() {
    let s = Server::start();
    s.apply(
        r#"{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "w", "image": "w"}]}}}}"#,
    );
    for kind in ["Deployment", "StatefulSet", "ReplicaSet"] {
        let err = s.fails_stdin(
            &["apply", "-f", "-"],
            &format!(
                r#"{{"apiVersion": "apps/v1", "kind": "{kind}", "metadata": {{"name": "huge"}},
                    "spec": {{"replicas": 3000000000, "selector": {{"matchLabels": {{"app": "h"}}}},
                             "template": {{"metadata": {{"labels": {{"app": "h"}}}}, "spec": {{"containers": [{{"name": "w", "image": "w"}}]}}}}}}}}"#
            ),
        );
        assert!(
            err.contains("spec.replicas") && err.contains("32-bit integer"),
            "{kind}: {err}"
        );
    }
    let err = s.fails(&[
        "patch",
        "deployment",
        "web",
        "--subresource=scale",
        "--type=merge",
        "-p",
        r#"{"spec": {"replicas": 3000000000}}"#,
    ]);
    assert!(err.contains("32-bit integer"), "{err}");
    assert_eq!(
        s.ok(&[
            "get",
            "deployment",
            "web",
            "-o",
            "jsonpath={.spec.replicas}"
        ]),
        "1"
    );
    for (manifest, field) in [
        (
            r#"{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "bad"}, "data": {"k": "not base64!"}}"#,
            "data.k",
        ),
        (
            r#"{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "bad"}, "binaryData": {"k": "%%%"}}"#,
            "binaryData.k",
        ),
    ] {
        let err = s.fails_stdin(&["create", "-f", "-"], manifest);
        assert!(err.contains("illegal base64"), "{manifest}: {err}");
        assert!(err.contains(field), "{manifest}: {err}");
    }
    s.stdin(
        &["create", "-f", "-"],
        r#"{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "untyped"}, "data": {"k": "dg=="}}"#,
    );
    assert_eq!(
        s.ok(&["get", "secret", "untyped", "-o", "jsonpath={.type}"]),
        "Opaque"
    );
    assert!(
        s.ok(&[
            "get",
            "secrets",
            "--field-selector",
            "type=Opaque",
            "-o",
            "name"
        ])
        .contains("secret/untyped")
    );
    for ns in ["default", "kube-system", "kube-public", "orrery-system"] {
        let err = s.fails(&["delete", "namespace", ns]);
        assert!(
            err.contains(&format!(
                "namespaces \"{ns}\" is forbidden: this namespace may not be deleted"
            )),
            "{ns}: {err}"
        );
        s.ok(&["get", "namespace", ns]);
    }
}
