//! The kube crate (kube-rs) against `orrery server`: typed CRUD with k8s-openapi types, and
//! the runtime's watcher and reflector through churn, watch timeouts and a server restart.

use crate::common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::Server;
use futures_util::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};

fn cm(name: &str, value: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {"app": "soak"}},
        "data": {"value": value}
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_crud_with_k8s_openapi_types() {
    let s = Server::start();
    let client = s.client().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let created = cms
        .create(&PostParams::default(), &cm("a", "1"))
        .await
        .unwrap();
    assert!(created.metadata.uid.is_some() && created.metadata.resource_version.is_some());
    assert_eq!(cms.get("a").await.unwrap().data.unwrap()["value"], "1");
    let err = cms
        .create(&PostParams::default(), &cm("a", "1"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 409 && s.reason == "AlreadyExists"),
        "{err:?}"
    );

    let merged = cms
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"data": {"other": "x"}})),
        )
        .await
        .unwrap();
    assert_eq!(merged.data.unwrap().len(), 2);
    for i in 0..25 {
        cms.create(&PostParams::default(), &cm(&format!("n{i:02}"), "v"))
            .await
            .unwrap();
    }
    // Pagination with kube's ListParams.
    let mut names = Vec::new();
    let mut lp = ListParams::default().limit(10).labels("app=soak");
    loop {
        let page = cms.list(&lp).await.unwrap();
        names.extend(page.items.iter().map(|c| c.metadata.name.clone().unwrap()));
        match page.metadata.continue_ {
            Some(t) if !t.is_empty() => lp = lp.continue_token(&t),
            _ => break,
        }
    }
    assert_eq!(names.len(), 26);

    let deploys: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let d: Deployment = serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "web", "image": "nginx", "env": [{"name": "A", "value": "1"}]}]}}}
    }))
    .unwrap();
    deploys.create(&PostParams::default(), &d).await.unwrap();
    let patch = serde_json::json!({"spec": {"template": {"spec": {"containers": [{"name": "web", "env": [{"name": "B", "value": "2"}]}]}}}});
    let patched = deploys
        .patch("web", &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .unwrap();
    let env = patched.spec.unwrap().template.spec.unwrap().containers[0]
        .env
        .clone()
        .unwrap();
    assert_eq!(env.len(), 2, "strategic merge keeps the existing env var");
    let scale = deploys.get_scale("web").await.unwrap();
    assert_eq!(scale.spec.unwrap().replicas, Some(1));
    deploys
        .patch_scale(
            "web",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"replicas": 4}})),
        )
        .await
        .unwrap();
    assert_eq!(
        deploys.get("web").await.unwrap().spec.unwrap().replicas,
        Some(4)
    );
    let status = deploys
        .patch_status(
            "web",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"readyReplicas": 3, "replicas": 4}})),
        )
        .await
        .unwrap();
    assert_eq!(status.status.unwrap().ready_replicas, Some(3));
    assert_eq!(
        deploys.get("web").await.unwrap().spec.unwrap().replicas,
        Some(4),
        "a status patch leaves the spec"
    );

    cms.delete("a", &DeleteParams::default()).await.unwrap();
    let err = cms.get("a").await.unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 404),
        "{err:?}"
    );
}

/// Seconds of churn for the soak test (`ORRERY_SOAK_SECS`, default 120).
fn soak_secs() -> u64 {
    std::env::var("ORRERY_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(120)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_and_reflector_see_every_change_through_cuts_and_restarts() {
    let mut server = Server::start();
    let client = server.client().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    cms.create(&PostParams::default(), &cm("counter", "0"))
        .await
        .unwrap();

    // The reflector, fed by a watcher whose watches the server ends every 5 s.
    let (reader, writer) = reflector::store::<ConfigMap>();
    let seen_counter: Arc<Mutex<Vec<u64>>> = Arc::default();
    let relists = Arc::new(Mutex::new(0usize));
    let stream = watcher(
        cms.clone(),
        watcher::Config::default().timeout(5).labels("app=soak"),
    )
    .default_backoff();
    let (seen, inits) = (seen_counter.clone(), relists.clone());
    let follower = tokio::spawn(async move {
        let mut stream = std::pin::pin!(reflector(writer, stream));
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(watcher::Event::Apply(c)) | Ok(watcher::Event::InitApply(c))
                    if c.metadata.name.as_deref() == Some("counter") =>
                {
                    let v: u64 = c.data.unwrap()["value"].parse().unwrap();
                    seen.lock().unwrap().push(v);
                }
                Ok(watcher::Event::Init) => *inits.lock().unwrap() += 1,
                _ => {}
            }
        }
    });

    // Churn: random-ish creates, updates and deletes over 40 names, and a counter updated
    // in sequence; halfway through, the server is killed and restarted.
    let deadline = Instant::now() + Duration::from_secs(soak_secs());
    let halfway = Instant::now() + Duration::from_secs(soak_secs() / 2);
    let mut restarted = false;
    let mut counter = 0u64;
    let mut step = 0u64;
    let mut model: BTreeMap<String, String> = BTreeMap::new();
    while Instant::now() < deadline {
        if !restarted && Instant::now() > halfway {
            server.kill9();
            tokio::time::sleep(Duration::from_millis(500)).await;
            server.restart();
            restarted = true;
        }
        step += 1;
        let name = format!("c{}", (step * 7919) % 40);
        let op = (step * 31) % 3;
        let result = match (op, model.contains_key(&name)) {
            (0, false) | (1, false) => cms
                .create(&PostParams::default(), &cm(&name, &step.to_string()))
                .await
                .map(|_| Some(step.to_string())),
            (0, true) | (1, true) => cms
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({"data": {"value": step.to_string()}})),
                )
                .await
                .map(|_| Some(step.to_string())),
            _ => {
                if model.contains_key(&name) {
                    cms.delete(&name, &DeleteParams::default())
                        .await
                        .map(|_| None)
                } else {
                    continue;
                }
            }
        };
        match result {
            Ok(Some(v)) => {
                model.insert(name, v);
            }
            Ok(None) => {
                model.remove(&name);
            }
            // The server is down or restarting: try again later.
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
        // The counter only moves forward once its write is acknowledged; a write whose answer
        // was lost is simply repeated (an identical patch changes nothing).
        let next = counter + 1;
        let bump = Patch::Merge(serde_json::json!({"data": {"value": next.to_string()}}));
        if cms
            .patch("counter", &PatchParams::default(), &bump)
            .await
            .is_ok()
        {
            counter = next;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        restarted && counter > 100,
        "the churn ran ({counter} counter updates)"
    );

    // The reflector converges to exactly what the server has.
    let converge = Instant::now() + Duration::from_secs(30);
    loop {
        let want: BTreeMap<String, String> = cms
            .list(&ListParams::default().labels("app=soak"))
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|c| {
                (
                    c.metadata.name.unwrap(),
                    c.metadata.resource_version.unwrap(),
                )
            })
            .collect();
        let have: BTreeMap<String, String> = reader
            .state()
            .iter()
            .map(|c| {
                (
                    c.metadata.name.clone().unwrap(),
                    c.metadata.resource_version.clone().unwrap(),
                )
            })
            .collect();
        if want == have {
            break;
        }
        assert!(
            Instant::now() < converge,
            "the reflector did not converge:\nserver {want:?}\nreflector {have:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    follower.abort();

    // Every committed counter value was seen, in order, despite the cuts and the restart.
    let seen = seen_counter.lock().unwrap().clone();
    let mut expected: Vec<u64> = (0..=counter).collect();
    let mut got = seen.clone();
    got.dedup();
    // A re-list (after a 410) would legitimately skip values; there should be none here.
    assert_eq!(
        *relists.lock().unwrap(),
        1,
        "the watcher resumed rather than re-listed"
    );
    expected.retain(|v| *v >= got[0]);
    assert_eq!(got, expected, "the counter values the watcher saw");
}

fn owned_cm(name: &str, owner: &ConfigMap) -> ConfigMap {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "ownerReferences": [{
            "apiVersion": "v1", "kind": "ConfigMap",
            "name": owner.metadata.name, "uid": owner.metadata.uid, "blockOwnerDeletion": true
        }]},
        "data": {"k": "v"}
    }))
    .unwrap()
}

async fn gone(cms: &Api<ConfigMap>, name: &str) -> bool {
    matches!(cms.get(name).await, Err(kube::Error::Api(ref s)) if s.code == 404)
}

async fn wait_until<F: std::future::Future<Output = bool>>(what: &str, mut f: impl FnMut() -> F) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_collection_follows_the_propagation_policy() {
    let s = Server::start();
    let cms: Api<ConfigMap> = Api::namespaced(s.client().await, "default");
    let pp = PostParams::default();

    // Background: the owner goes at once, its dependents follow.
    let owner = cms.create(&pp, &cm("owner-bg", "x")).await.unwrap();
    cms.create(&pp, &owned_cm("dep-bg", &owner)).await.unwrap();
    cms.delete("owner-bg", &DeleteParams::background())
        .await
        .unwrap();
    wait_until("the background dependent to be collected", || {
        gone(&cms, "dep-bg")
    })
    .await;

    // Orphan: the dependent stays, without the reference.
    let owner = cms.create(&pp, &cm("owner-or", "x")).await.unwrap();
    cms.create(&pp, &owned_cm("dep-or", &owner)).await.unwrap();
    cms.delete("owner-or", &DeleteParams::orphan())
        .await
        .unwrap();
    wait_until("the orphaning owner to go", || gone(&cms, "owner-or")).await;
    let dep = cms.get("dep-or").await.unwrap();
    assert!(
        dep.metadata.owner_references.unwrap_or_default().is_empty(),
        "the reference to the deleted owner is removed"
    );

    // Foreground: the owner waits, marked for deletion, until its dependents are gone; a
    // finalizer on the dependent holds both.
    let owner = cms.create(&pp, &cm("owner-fg", "x")).await.unwrap();
    let mut dep = owned_cm("dep-fg", &owner);
    dep.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    cms.create(&pp, &dep).await.unwrap();
    cms.delete("owner-fg", &DeleteParams::foreground())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let waiting = cms.get("owner-fg").await.unwrap();
    assert!(waiting.metadata.deletion_timestamp.is_some());
    assert!(
        waiting
            .metadata
            .finalizers
            .unwrap_or_default()
            .contains(&"foregroundDeletion".to_string())
    );
    assert!(
        cms.get("dep-fg")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some(),
        "the dependent is being deleted"
    );
    cms.patch(
        "dep-fg",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    wait_until("the dependent to go", || gone(&cms, "dep-fg")).await;
    wait_until("the foreground owner to go after it", || {
        gone(&cms, "owner-fg")
    })
    .await;

    // deletecollection by label.
    for i in 0..5 {
        cms.create(&pp, &cm(&format!("batch-{i}"), "x"))
            .await
            .unwrap();
    }
    cms.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels("app=soak"),
    )
    .await
    .unwrap();
    assert!(
        cms.list(&ListParams::default().labels("app=soak"))
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_errors_and_expired_watches() {
    let s = Server::start_with(&["--compaction-interval", "1s"]);
    let client = s.client().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let first = cms
        .create(&PostParams::default(), &cm("a", "1"))
        .await
        .unwrap();
    let old_rv = first.metadata.resource_version.clone().unwrap();

    let send = |method: &str, path: &str, content_type: &str, body: &str| {
        http::Request::builder()
            .method(method)
            .uri(path)
            .header("Content-Type", content_type)
            .body(body.as_bytes().to_vec())
            .unwrap()
    };
    let status = |r: Result<String, kube::Error>| match r {
        Err(kube::Error::Api(s)) => (s.code, s.reason),
        other => panic!("expected a Status error, got {other:?}"),
    };
    // POST on a named object: 405.
    let r = client
        .request_text(send(
            "POST",
            "/api/v1/namespaces/default/configmaps/a",
            "application/json",
            "{}",
        ))
        .await;
    assert_eq!(status(r), (405, "MethodNotAllowed".into()));
    // PATCH with a type no one speaks: 415.
    let r = client
        .request_text(send(
            "PATCH",
            "/api/v1/namespaces/default/configmaps/a",
            "text/plain",
            "x",
        ))
        .await;
    assert_eq!(status(r), (415, "UnsupportedMediaType".into()));
    // Server-side apply needs a field manager, and a configuration of the right kind.
    let r = client
        .request_text(send(
            "PATCH",
            "/api/v1/namespaces/default/configmaps/a",
            "application/apply-patch+yaml",
            "{}",
        ))
        .await;
    assert_eq!(status(r), (400, "BadRequest".into()));
    let r = client
        .request_text(send(
            "PATCH",
            "/api/v1/namespaces/default/configmaps/a?fieldManager=t",
            "application/apply-patch+yaml",
            "apiVersion: v1\nkind: Secret\nmetadata: {name: a}\n",
        ))
        .await;
    assert_eq!(status(r), (400, "BadRequest".into()));
    // A JSON patch that does not decode: 400. One whose operation fails on the object (a
    // missing path, a `test` that does not hold): 422 Invalid, as kube-apiserver answers.
    let r = client
        .request_text(send(
            "PATCH",
            "/api/v1/namespaces/default/configmaps/a",
            "application/json-patch+json",
            r#"[{"op":"remove"}]"#,
        ))
        .await;
    assert_eq!(status(r), (400, "BadRequest".into()));
    let r = client
        .request_text(send(
            "PATCH",
            "/api/v1/namespaces/default/configmaps/a",
            "application/json-patch+json",
            r#"[{"op":"remove","path":"/nope"}]"#,
        ))
        .await;
    assert_eq!(status(r), (422, "Invalid".into()));
    let r = client
        .request_text(send(
            "PATCH",
            "/api/v1/namespaces/default/configmaps/a",
            "application/json-patch+json",
            r#"[{"op":"test","path":"/metadata/name","value":"b"}]"#,
        ))
        .await;
    assert_eq!(status(r), (422, "Invalid".into()));
    // Unknown fields with fieldValidation=Warn: accepted, dropped, and warned about.
    let r = client
        .request_text(send(
            "POST",
            "/api/v1/namespaces/default/configmaps?fieldValidation=Warn",
            "application/json",
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"w"},"bogus":1}"#,
        ))
        .await
        .unwrap();
    assert!(!r.contains("bogus"));
    let r = client
        .request_text(send(
            "POST",
            "/api/v1/namespaces/default/configmaps?fieldValidation=Strict",
            "application/json",
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"s"},"bogus":1}"#,
        ))
        .await;
    assert_eq!(status(r), (400, "BadRequest".into()));

    // History expires: a watch from before the compacted revision gets a 410 event.
    for i in 0..5 {
        cms.patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"data": {"value": i.to_string()}})),
        )
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    let mut events = cms
        .watch(&kube::api::WatchParams::default().timeout(5), &old_rv)
        .await
        .unwrap()
        .boxed();
    match events.next().await {
        Some(Ok(kube::core::WatchEvent::Error(e))) => {
            assert_eq!((e.code, e.reason.as_str()), (410, "Expired"))
        }
        other => panic!("expected a 410 watch event, got {other:?}"),
    }
}
