//! Writes that start on a store's recent copy (`Store::get_recent`: on etcd, a member's own
//! copy, read without consensus) act on the object as it is. The store underneath is SQLite
//! with recent reads held back on demand (`Lagging`): a real follower's lag cannot be made to
//! order.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::Ordering;

use http::{Request, StatusCode};
use http_body_util::BodyExt;
use orrery_apiserver::app::{ApiConfig, App};
use orrery_apiserver::auth::Authenticator;
use orrery_apiserver::auth::Identity;
use orrery_apiserver::router::json_body;
use orrery_store::Store;
use orrery_store_testkit::Harness;
use orrery_store_testkit::lagging::Lagging;
use serde_json::{Value, json};

struct Server {
    app: Arc<App>,
    lag: Arc<Lagging>,
    token: String,
    _shutdown: tokio::sync::watch::Sender<bool>,
}

impl Server {
    async fn start(h: &orrery_store_testkit::SqliteHarness) -> Server {
        let lag = Arc::new(Lagging::new(h.open().await));
        let store: Arc<dyn Store> = lag.clone();
        let auth = Authenticator::start(store.clone()).await.unwrap();
        let (tx, shutdown) = tokio::sync::watch::channel(false);
        let app = App::new(store, auth.clone(), ApiConfig::default(), shutdown)
            .await
            .unwrap();
        let token = auth
            .issue(
                &Identity::Admin {
                    name: "admin".into(),
                },
                "admin",
                None,
            )
            .await
            .unwrap();
        let s = Server {
            app,
            lag,
            token,
            _shutdown: tx,
        };
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}});
        let (code, o) = s
            .call("POST", "/api/v1/namespaces", "application/json", ns)
            .await;
        assert_eq!(code, StatusCode::CREATED, "{o}");
        s
    }

    async fn call(&self, method: &str, uri: &str, ctype: &str, body: Value) -> (StatusCode, Value) {
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .header(
                http::header::AUTHORIZATION,
                format!("Bearer {}", self.token),
            )
            .header(http::header::CONTENT_TYPE, ctype)
            .body(json_body(body))
            .unwrap();
        let res = self.app.handle(req).await;
        let status = res.status();
        let bytes = res.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    fn lagged(&self) -> usize {
        self.lag.lagged_reads.load(Ordering::Relaxed)
    }
}

const CM: &str = "/api/v1/namespaces/default/configmaps";
const KEY: &str = "/registry/core/configmaps/default/web";
const MERGE: &str = "application/merge-patch+json";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_patch_on_a_lagging_copy_patches_the_object_as_it_is() {
    let h = orrery_store_testkit::SqliteHarness::new();
    let s = Server::start(&h).await;
    let (code, _) = s
        .call(
            "POST",
            CM,
            "application/json",
            json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "web"}, "data": {"a": "1"}}),
        )
        .await;
    assert_eq!(code, StatusCode::CREATED);
    s.lag.hold(KEY).await;
    let (code, _) = s
        .call(
            "PATCH",
            &format!("{CM}/web"),
            MERGE,
            json!({"data": {"a": "2"}}),
        )
        .await;
    assert_eq!(code, StatusCode::OK);
    let before = s.lagged();
    assert!(before >= 1, "the patch read the held copy");

    // A patch that changes nothing on the held copy (a is 1 there) but does on the object:
    // written, with a new revision.
    let was = s.lag.get(KEY).await.unwrap().metadata.resource_version;
    let (code, o) = s
        .call(
            "PATCH",
            &format!("{CM}/web"),
            MERGE,
            json!({"data": {"a": "1"}}),
        )
        .await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(o["data"], json!({"a": "1"}), "{o}");
    assert_ne!(o["metadata"]["resourceVersion"], json!(was), "{o}");
    assert_eq!(
        s.lag.get(KEY).await.unwrap().other["data"],
        json!({"a": "1"})
    );
    // A patch of another field: merged into the object as it is, not into the held copy.
    let (code, o) = s
        .call(
            "PATCH",
            &format!("{CM}/web"),
            MERGE,
            json!({"data": {"b": "x"}}),
        )
        .await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(o["data"], json!({"a": "1", "b": "x"}), "{o}");
    // A precondition on the current revision holds though the held copy is older.
    let rv = o["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let (code, o) = s
        .call(
            "PATCH",
            &format!("{CM}/web"),
            MERGE,
            json!({"metadata": {"resourceVersion": rv}, "data": {"c": "y"}}),
        )
        .await;
    assert_eq!(code, StatusCode::OK, "{o}");
    assert_eq!(s.lagged(), before + 3);
    let stored = s.lag.get(KEY).await.unwrap();
    assert_eq!(stored.other["data"], json!({"a": "1", "b": "x", "c": "y"}));

    // An object the copy does not have yet is found.
    s.lag.hold("/registry/core/configmaps/default/late").await;
    let (code, _) = s
        .call(
            "POST",
            CM,
            "application/json",
            json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "late"}}),
        )
        .await;
    assert_eq!(code, StatusCode::CREATED);
    let (code, o) = s
        .call(
            "PATCH",
            &format!("{CM}/late"),
            MERGE,
            json!({"data": {"d": "z"}}),
        )
        .await;
    assert_eq!(code, StatusCode::OK, "{o}");
    assert_eq!(o["data"], json!({"d": "z"}));
}

/// A PUT that requires a revision starts on the copy only when the copy is at that revision;
/// whatever the copy says, the answer is the one a current read gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_requiring_a_revision_answers_as_the_object_is() {
    let h = orrery_store_testkit::SqliteHarness::new();
    let s = Server::start(&h).await;
    let cm = |data: Value, rv: Option<&str>| {
        let mut o = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "web"}, "data": data});
        if let Some(rv) = rv {
            o["metadata"]["resourceVersion"] = json!(rv);
        }
        o
    };
    let rv_of = |o: &Value| {
        o["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let url = format!("{CM}/web");
    let put = |body: Value| s.call("PUT", &url, "application/json", body);
    let (code, o) = s
        .call("POST", CM, "application/json", cm(json!({"a": "1"}), None))
        .await;
    assert_eq!(code, StatusCode::CREATED);
    let first = rv_of(&o);

    // The copy is the object as it is: the PUT starts on it and is written.
    s.lag.hold(KEY).await;
    let (code, o) = put(cm(json!({"a": "2"}), Some(&first))).await;
    assert_eq!(code, StatusCode::OK, "{o}");
    assert_eq!(s.lagged(), 1, "the PUT started on the copy");
    let second = rv_of(&o);
    assert_ne!(second, first);

    // The copy (still at the first revision) is behind now. A PUT requiring that revision
    // starts on the copy, and its write, conditional on it, is refused: the object moved on.
    let (code, o) = put(cm(json!({"a": "stale"}), Some(&first))).await;
    assert_eq!(code, StatusCode::CONFLICT, "{o}");
    assert_eq!(s.lagged(), 2);
    // A PUT requiring the current revision is not answered from the copy (at another
    // revision): the object is read as it is, and written.
    let (code, o) = put(cm(json!({"a": "3"}), Some(&second))).await;
    assert_eq!(code, StatusCode::OK, "{o}");
    assert_eq!(s.lagged(), 3, "the copy was looked at, and left");
    let stored = s.lag.get(KEY).await.unwrap();
    assert_eq!(stored.other["data"], json!({"a": "3"}));
    assert_eq!(stored.metadata.resource_version, rv_of(&o));
    // Server-owned metadata comes from the object as it is, not from the body.
    assert_eq!(o["metadata"]["uid"], json!(stored.metadata.uid));

    // Without a required revision, the object is read as it is (the copy is not looked at).
    let (code, o) = put(cm(json!({"a": "4"}), None)).await;
    assert_eq!(code, StatusCode::OK, "{o}");
    assert_eq!(s.lagged(), 3);
    assert_eq!(
        s.lag.get(KEY).await.unwrap().other["data"],
        json!({"a": "4"})
    );

    // Gone from the store though the copy still has it: not found, nothing written.
    s.lag.release(KEY);
    s.lag.hold(KEY).await;
    let held = rv_of(&o);
    let (code, _) = s.call("DELETE", &url, "application/json", json!({})).await;
    assert_eq!(code, StatusCode::OK);
    let (code, o) = put(cm(json!({"a": "5"}), Some(&held))).await;
    assert!(
        code == StatusCode::NOT_FOUND || code == StatusCode::CONFLICT,
        "{code} {o}"
    );
    assert!(s.lag.get(KEY).await.is_err(), "nothing was written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_report_on_a_lagging_copy_writes_the_status_reported() {
    let h = orrery_store_testkit::SqliteHarness::new();
    let s = Server::start(&h).await;
    let deploy = "/apis/apps/v1/namespaces/default/deployments";
    let key = "/registry/apps/deployments/default/web";
    let (code, o) = s
        .call(
            "POST",
            deploy,
            "application/json",
            json!({
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web"}},
                                  "spec": {"containers": [{"name": "web", "image": "nginx"}]}}}}),
        )
        .await;
    assert_eq!(code, StatusCode::CREATED, "{o}");
    let report = |replicas: u32| {
        json!({"items": [{"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "default",
                          "name": "web", "status": {"replicas": replicas, "readyReplicas": replicas}}]})
    };
    let (code, o) = s
        .call("POST", "/api/v1/sync/batch", "application/json", report(1))
        .await;
    assert_eq!(code, StatusCode::OK, "{o}");
    s.lag.hold(key).await;
    let (code, o) = s
        .call("POST", "/api/v1/sync/batch", "application/json", report(2))
        .await;
    assert_eq!(code, StatusCode::OK, "{o}");
    let before = s.lagged();
    assert!(before >= 1);
    // 1 again: the held copy says 1 already, the object says 2.
    let (code, o) = s
        .call("POST", "/api/v1/sync/batch", "application/json", report(1))
        .await;
    assert_eq!(code, StatusCode::OK, "{o}");
    assert_eq!(o["results"][0]["code"], "OK", "{o}");
    assert_eq!(s.lagged(), before + 1);
    let stored = s.lag.get(key).await.unwrap();
    assert_eq!(
        stored.status.as_ref().unwrap()["readyReplicas"],
        1,
        "{stored:?}"
    );
}

/// A write on a recent copy whose answer is lost (it may have been carried out) is answered as
/// failed, not tried again: a JSON patch applied twice is not the patch asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_answer_is_lost_is_not_applied_twice() {
    let h = orrery_store_testkit::SqliteHarness::new();
    let s = Server::start(&h).await;
    let (code, _) = s
        .call(
            "POST",
            CM,
            "application/json",
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "web", "finalizers": ["example.com/a"]}}),
        )
        .await;
    assert_eq!(code, StatusCode::CREATED);
    s.lag.hold(KEY).await;
    s.lag.lose_next_answer.store(true, Ordering::Release);
    let (code, o) = s
        .call(
            "PATCH",
            &format!("{CM}/web"),
            "application/json-patch+json",
            json!([{"op": "add", "path": "/metadata/finalizers/-", "value": "example.com/x"}]),
        )
        .await;
    assert_eq!(code, StatusCode::INTERNAL_SERVER_ERROR, "{o}");
    assert_eq!(s.lagged(), 1, "the patch started on the held copy");
    let stored = s.lag.get(KEY).await.unwrap();
    assert_eq!(
        stored.metadata.finalizers,
        ["example.com/a", "example.com/x"]
    );
}
