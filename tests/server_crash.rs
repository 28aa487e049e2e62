//! Crash test over HTTP: concurrent clients create objects through `orrery server`, the server
//! is killed with SIGKILL in mid-stream, and after a restart every create it acknowledged is
//! there. Two rounds.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::Server;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_write_survives_kill_9() {
    let mut server = Server::start();
    let acked: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    for round in 0..2 {
        let client = server.client().await;
        let cms: Api<ConfigMap> = Api::namespaced(client, "default");
        let mut writers = Vec::new();
        for w in 0..32 {
            let (cms, acked) = (cms.clone(), acked.clone());
            writers.push(tokio::spawn(async move {
                for i in 0.. {
                    let name = format!("r{round}-w{w}-{i}");
                    let obj: ConfigMap = serde_json::from_value(serde_json::json!({
                        "metadata": {"name": name}, "data": {"payload": "x".repeat(256)}
                    }))
                    .unwrap();
                    match cms.create(&PostParams::default(), &obj).await {
                        Ok(c) => acked
                            .lock()
                            .unwrap()
                            .push((name, c.metadata.resource_version.unwrap())),
                        // The server died: whatever was not acknowledged may or may not exist.
                        Err(_) => return,
                    }
                }
            }));
        }
        let target = (round + 1) * 800;
        let deadline = Instant::now() + Duration::from_secs(120);
        while acked.lock().unwrap().len() < target {
            assert!(
                Instant::now() < deadline,
                "the writers made too little progress"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        server.kill9();
        for w in writers {
            let _ = w.await;
        }
        server.restart();
        let client = server.client().await;
        let cms: Api<ConfigMap> = Api::namespaced(client, "default");
        let all = acked.lock().unwrap().clone();
        let stored: std::collections::HashMap<String, String> = cms
            .list(&Default::default())
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
        for (name, rv) in &all {
            assert_eq!(
                stored.get(name),
                Some(rv),
                "acknowledged create {name} (rv {rv}) after kill -9 in round {round}"
            );
        }
    }
}
