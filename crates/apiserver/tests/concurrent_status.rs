//! A status report that names no version is never refused for another writer's change: an
//! agent's reports of a Work the controllers keep rewriting (as during a migration's switch)
//! are all taken, however busy the object. (Refused, the agent held the Work's next report
//! back for ten seconds each time: a migration's target waited a minute to be seen Ready.)

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use http::{Request, StatusCode};
use http_body_util::BodyExt;
use orrery_apiserver::app::{ApiConfig, App};
use orrery_apiserver::auth::{Authenticator, Identity};
use orrery_apiserver::router::json_body;
use orrery_store::Store;
use orrery_store_testkit::Harness;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reports_without_a_version_are_taken_while_the_spec_is_rewritten() {
    let h = orrery_store_testkit::SqliteHarness::new();
    let store: Arc<dyn Store> = h.open().await;
    let auth = Authenticator::start(store.clone()).await.unwrap();
    let (_tx, shutdown) = tokio::sync::watch::channel(false);
    let app = App::new(store.clone(), auth.clone(), ApiConfig::default(), shutdown)
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
    let call = |method: &str, uri: &str, body: Value| {
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .header(http::header::AUTHORIZATION, format!("Bearer {token}"))
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(json_body(body))
            .unwrap();
        let app = app.clone();
        async move {
            let r = app.handle(req).await;
            let code = r.status();
            let bytes = r.into_body().collect().await.unwrap().to_bytes();
            (
                code,
                serde_json::from_slice::<Value>(&bytes).unwrap_or(Value::Null),
            )
        }
    };
    let (code, v) = call(
        "POST",
        "/api/v1/namespaces",
        json!({"metadata": {"name": "orrery-cluster-c1"}}),
    )
    .await;
    assert_eq!(code, StatusCode::CREATED, "{v}");
    let (code, v) = call(
        "POST",
        "/apis/multicluster.io/v1alpha1/namespaces/orrery-cluster-c1/works",
        json!({"apiVersion": "multicluster.io/v1alpha1", "kind": "Work",
               "metadata": {"name": "web"}, "spec": {"workload": {"manifests": []}}}),
    )
    .await;
    assert_eq!(code, StatusCode::CREATED, "{v}");
    let key = orrery_api::keys::well_known::work("orrery-cluster-c1", "web");
    // The controllers rewrite the Work as fast as the store takes it...
    let writer = {
        let (store, key) = (store.clone(), key.clone());
        tokio::spawn(async move {
            for i in 0..300 {
                orrery_store::update_with(store.as_ref(), &key, |mut o| {
                    o.metadata
                        .annotations
                        .insert("rewrite".into(), i.to_string());
                    Ok(Some(o))
                })
                .await
                .unwrap();
            }
        })
    };
    // ...while its member reports its status, a hundred times at once.
    let reports = futures_util::future::join_all((0..100).map(|i| {
        call(
            "POST",
            "/api/v1/sync/batch",
            json!({"items": [{"kind": "Work", "namespace": "orrery-cluster-c1", "name": "web",
                "status": {"conditions": [{"type": "Applied", "status": "True", "reason": "Applied",
                    "message": format!("report {i}"), "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}]}),
        )
    }))
    .await;
    writer.await.unwrap();
    for (code, v) in &reports {
        assert_eq!(*code, StatusCode::OK, "{v}");
        assert_eq!(v["results"][0]["code"], "OK", "{v}");
    }
    let stored = store.get(&key).await.unwrap();
    assert!(
        stored.status.as_ref().unwrap()["conditions"][0]["message"]
            .as_str()
            .unwrap()
            .starts_with("report "),
        "{:?}",
        stored.status
    );
}
