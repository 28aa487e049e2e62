//! Multi-cluster services: EndpointSlice propagation latency. A Service runs in two of N
//! simulated members and is exported to all N; each round starts a pod in one exporting
//! member (its Deployment scaled there directly, as a member's own controller would) and
//! times until every consuming member has applied its copy of that member's slice (from the
//! members' journals, which stamp each operation the agent carries out).

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::members::admin_get;
use crate::propagation::post;
use crate::stats::{emit, percentile, progress, round};

pub struct Args {
    pub clusters: usize,
    pub rounds: usize,
    pub server_bin: Option<PathBuf>,
    pub dir: Option<PathBuf>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn deployment(replicas: i64) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "nginx:1.27",
                    "ports": [{"name": "http", "containerPort": 8080}],
                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}}}})
}

/// Ready endpoints in `member`'s imported slice from `source`.
fn imported(admin: &str, member: &str, source: &str) -> anyhow::Result<usize> {
    let objects = admin_get(admin, &format!("/clusters/{member}/objects"))?;
    Ok(objects["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|o| {
            o["kind"] == "EndpointSlice"
                && o["metadata"]["labels"]["multicluster.kubernetes.io/source-cluster"] == source
        })
        .flat_map(|o| o["endpoints"].as_array().cloned().unwrap_or_default())
        .filter(|e| e["conditions"]["ready"] == true)
        .count())
}

/// When `member` last applied the slice from `source` after journal entry `since`: (ms, seq).
fn slice_applied(
    admin: &str,
    member: &str,
    source: &str,
    since: u64,
) -> anyhow::Result<Option<(u64, u64)>> {
    let j = admin_get(admin, &format!("/clusters/{member}/journal?since={since}"))?;
    Ok(j["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| {
            e["kind"] == "EndpointSlice"
                && e["changed"] == true
                && e["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with(&format!("web-{source}-")))
        })
        .filter_map(|e| Some((e["timeMs"].as_u64()?, e["seq"].as_u64()?)))
        .next())
}

fn last_seq(admin: &str, member: &str) -> anyhow::Result<u64> {
    let j = admin_get(admin, &format!("/clusters/{member}/journal"))?;
    Ok(j["items"]
        .as_array()
        .and_then(|a| a.last())
        .and_then(|e| e["seq"].as_u64())
        .unwrap_or(0))
}

pub async fn propagation(args: Args) -> anyhow::Result<()> {
    let fleet_args = crate::propagation::Args {
        clusters: args.clusters,
        templates: 0,
        server_bin: args.server_bin.clone(),
        dir: args.dir.clone(),
    };
    let (_server, client, agent) = crate::propagation::fleet(&fleet_args, "100ms").await?;
    let admin = agent.admin.clone();
    let members: Vec<String> = (0..args.clusters).map(|i| format!("m-{i}")).collect();
    let source = "m-0";
    post(
        &client,
        "/apis/apps/v1/namespaces/default/deployments",
        &deployment(2),
    )
    .await?;
    post(
        &client,
        "/api/v1/namespaces/default/services",
        &json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "default"},
                "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}),
    )
    .await?;
    post(
        &client,
        "/apis/policy.karmada.io/v1alpha1/namespaces/default/propagationpolicies",
        &json!({"apiVersion": "policy.karmada.io/v1alpha1", "kind": "PropagationPolicy",
                "metadata": {"name": "web", "namespace": "default"},
                "spec": {"resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                                               {"apiVersion": "v1", "kind": "Service", "name": "web"}],
                         "placement": {"clusterAffinity": {"clusterNames": ["m-0", "m-1"]},
                                       "replicaScheduling": {"replicaSchedulingType": "Duplicated"}}}}),
    )
    .await?;
    post(
        &client,
        "/apis/multicluster.x-k8s.io/v1alpha1/namespaces/default/serviceexports",
        &json!({"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ServiceExport",
                "metadata": {"name": "web", "namespace": "default"}}),
    )
    .await?;
    let started = Instant::now();
    loop {
        let mut ready = 0;
        for m in &members {
            if imported(&admin, m, source)? == 2 {
                ready += 1;
            }
        }
        if ready == members.len() {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(300),
            "only {ready} of {} members import web",
            members.len()
        );
        progress(format!("{ready}/{} members import web", members.len()));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    progress(format!(
        "every member imports web after {:.1} s",
        started.elapsed().as_secs_f64()
    ));
    let mut latencies = Vec::new();
    let mut replicas = 2;
    for round in 0..args.rounds {
        let mut since: HashMap<&str, u64> = HashMap::new();
        for m in &members {
            since.insert(m, last_seq(&admin, m)?);
        }
        replicas = if replicas == 2 { 3 } else { 2 };
        let t0 = now_ms();
        // The member's Deployment changes (still Orrery's): a pod starts there (or stops).
        let mut d = deployment(replicas);
        d["metadata"]["labels"][orrery_api::work::MANAGED_LABEL] =
            json!(orrery_api::work::MANAGED_VALUE);
        crate::members::admin_send("POST", &admin, &format!("/clusters/{source}/objects"), &d)?;
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut last = 0u64;
        let mut pending: Vec<&str> = members.iter().map(String::as_str).collect();
        while !pending.is_empty() {
            anyhow::ensure!(
                Instant::now() < deadline,
                "round {round}: {} members never applied the change",
                pending.len()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
            let mut still = Vec::new();
            for m in pending {
                match slice_applied(&admin, m, source, since[m])? {
                    Some((t, _)) => last = last.max(t),
                    None => still.push(m),
                }
            }
            pending = still;
        }
        // What arrived is the change: the last member holds as many ready pods as run now
        // (a later report may still be on its way).
        let far = members.last().map(String::as_str).unwrap_or(source);
        let settle = Instant::now() + Duration::from_secs(10);
        while imported(&admin, far, source)? != replicas as usize {
            anyhow::ensure!(
                Instant::now() < settle,
                "round {round}: {far} holds another number of endpoints than {replicas}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let latency = last.saturating_sub(t0) as f64;
        progress(format!(
            "round {}: every member has the new slice {latency} ms after the pod changed",
            round + 1
        ));
        latencies.push(latency);
        // The next round after the member settles.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    emit(json!({
        "scenario": "mcs-endpointslice-propagation",
        "clusters": args.clusters,
        "rounds": args.rounds,
        "latency_ms_p50": round(percentile(&latencies, 50.0), 1),
        "latency_ms_p99": round(percentile(&latencies, 99.0), 1),
        "latency_ms_max": round(latencies.iter().cloned().fold(0.0, f64::max), 1),
        "goal_p99_ms": 200,
    }));
    Ok(())
}
