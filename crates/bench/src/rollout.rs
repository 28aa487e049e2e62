//! Progressive rollouts on a simulated fleet: a healthy revision's time through four stages
//! against its floor (`minSuccessTime` × stages), and a bad revision (its pods never ready)
//! that fails stage 1 within `maxFailures`, halts in stage 2 with no cluster of stages 3–4
//! touched, and is rolled back.

use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};

use crate::api::request;
use crate::propagation::{Args, fleet, post};
use crate::stateful::get;
use crate::stats::{emit, progress, round};

/// Seconds each cluster soaks before its stage may pass.
const SOAK: u64 = 5;

fn deployment(image: &str, bad: bool) -> Value {
    let ann = if bad {
        json!({"sim.orrery.io/never-ready": "true"})
    } else {
        json!({})
    };
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}, "annotations": ann},
                "spec": {"containers": [{"name": "web", "image": image,
                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}}}})
}

/// The four stages over `n` clusters `m-<i>`: 5 %, 20 %, 35 % by name, the rest by share.
fn stages(n: usize) -> (Value, Vec<Vec<String>>) {
    let cut = |p: usize| (n * p).div_ceil(100);
    let bounds = [0, cut(5), cut(25), cut(60), n];
    let groups: Vec<Vec<String>> = bounds
        .windows(2)
        .map(|w| (w[0]..w[1]).map(|i| format!("m-{i}")).collect())
        .collect();
    let soak = format!("{SOAK}s");
    let stages = json!([
        {"name": "s1", "clusters": groups[0], "minSuccessTime": soak},
        {"name": "s2", "clusters": groups[1], "minSuccessTime": soak},
        {"name": "s3", "clusters": groups[2], "minSuccessTime": soak},
        {"name": "s4", "percent": 100, "minSuccessTime": soak},
    ]);
    (stages, groups)
}

async fn apply_deployment(c: &kube::Client, d: &Value) -> anyhow::Result<()> {
    let body = serde_json::to_vec(d)?;
    c.request_text(request(
        "PUT",
        "/apis/apps/v1/namespaces/default/deployments/web",
        "application/json",
        body,
    ))
    .await?;
    Ok(())
}

async fn rollout(c: &kube::Client) -> anyhow::Result<Value> {
    let b = get(
        c,
        "/apis/multicluster.io/v1alpha1/namespaces/default/resourcebindings/web-deployment",
    )
    .await?;
    Ok(b["status"]["rollout"].clone())
}

/// Waits until the rollout says `done`; the time it took.
async fn until(
    c: &kube::Client,
    what: &str,
    limit: Duration,
    done: impl Fn(&Value) -> bool,
) -> anyhow::Result<Duration> {
    let t0 = Instant::now();
    loop {
        // The binding comes a moment after its policy: not found yet is not done yet.
        let r = rollout(c).await.unwrap_or(Value::Null);
        if done(&r) {
            return Ok(t0.elapsed());
        }
        anyhow::ensure!(t0.elapsed() < limit, "{what}: not within {limit:?}: {r}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every cluster whose Work was ever stamped with `revision`, from a watch of the Works.
fn stamped(client: kube::Client, revision: &'static str) -> Arc<Mutex<BTreeSet<String>>> {
    let seen: Arc<Mutex<BTreeSet<String>>> = Default::default();
    let api: Api<DynamicObject> = orrery_client::api(&client, &orrery_client::kinds::WORK, None);
    let out = seen.clone();
    tokio::spawn(async move {
        let mut s = watcher::watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        while let Some(ev) = s.next().await {
            let o = match ev {
                Ok(watcher::Event::Apply(o)) | Ok(watcher::Event::InitApply(o)) => o,
                _ => continue,
            };
            let rev = o
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(orrery_api::rollout::WORK_REVISION_ANNOTATION));
            if rev.map(String::as_str) == Some(revision)
                && let Some(ns) = o.metadata.namespace.as_deref()
                && let Some(c) = orrery_api::cluster::cluster_of_namespace(ns)
            {
                out.lock().insert(c.to_string());
            }
        }
    });
    seen
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let n = args.clusters;
    progress(format!("rollout: starting {n} simulated clusters"));
    let (_server, admin, _agent) = fleet(&args, "200ms").await?;
    let (stage_list, groups) = stages(n);
    let first_two = groups[0].len() + groups[1].len();
    post(
        &admin,
        "/apis/apps/v1/namespaces/default/deployments",
        &deployment("web:1", false),
    )
    .await?;
    let all: Vec<&String> = groups.iter().flatten().collect();
    // Stage 1's clusters may all fail (maxFailures): a revision bad everywhere passes it and
    // halts in stage 2.
    post(&admin, "/apis/policy.karmada.io/v1alpha1/namespaces/default/propagationpolicies", &json!({
        "apiVersion": "policy.karmada.io/v1alpha1", "kind": "PropagationPolicy",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}],
            "placement": {"clusterAffinity": {"clusterNames": all},
                "rollout": {"stages": stage_list, "maxFailures": groups[0].len(),
                    "progressDeadline": "20s", "rollback": "Automatic"}}}})).await?;
    let everywhere = |rev: i64| {
        move |r: &Value| {
            r["phase"] == "Complete"
                && r["revision"] == rev
                && r["clusters"].as_array().is_some_and(|c| c.len() == n)
        }
    };
    until(
        &admin,
        "revision 1 everywhere",
        Duration::from_secs(120),
        everywhere(1),
    )
    .await?;
    progress("rollout: revision 2 (healthy)");
    apply_deployment(&admin, &deployment("web:2", false)).await?;
    let healthy = until(
        &admin,
        "revision 2 everywhere",
        Duration::from_secs(300),
        everywhere(2),
    )
    .await?;
    let floor = Duration::from_secs(SOAK * 4);
    progress(format!(
        "rollout: revision 2 took {healthy:?}; revision 3 (never ready)"
    ));

    let got3 = stamped(admin.clone(), "3");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t0 = Instant::now();
    apply_deployment(&admin, &deployment("web:3", true)).await?;
    let halted = until(
        &admin,
        "revision 3 rolled back",
        Duration::from_secs(300),
        |r| r["revision"] == 3 && r["phase"] == "RolledBack",
    )
    .await?;
    let r = rollout(&admin).await?;
    let halted_in = r["stages"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["state"] == "Halted"))
        .map(|s| s["name"].as_str().unwrap_or("").to_string())
        .unwrap_or_default();
    // Restored: every cluster of stages 1–2 runs revision 2 again, healthy.
    let t_rb = Instant::now();
    let restored = loop {
        let works = get(&admin, "/apis/multicluster.io/v1alpha1/works").await?;
        let back = works["items"]
            .as_array()
            .map(|ws| {
                ws.iter()
                    .filter(|w| w["metadata"]["name"] == "default.web-deployment")
                    .filter(|w| {
                        w["metadata"]["annotations"][orrery_api::rollout::WORK_REVISION_ANNOTATION]
                            == "2"
                            && w["status"]["observedGeneration"] == w["metadata"]["generation"]
                            && w["status"]["manifestStatuses"][0]["health"] == "Healthy"
                    })
                    .count()
            })
            .unwrap_or(0);
        if back >= n {
            break t_rb.elapsed();
        }
        anyhow::ensure!(
            t_rb.elapsed() < Duration::from_secs(120),
            "only {back} of {n} back on revision 2"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let touched: Vec<String> = {
        let s = got3.lock();
        let late: BTreeSet<&String> = groups[2].iter().chain(groups[3].iter()).collect();
        s.iter().filter(|c| late.contains(c)).cloned().collect()
    };
    emit(json!({
        "scenario": "rollout.stages",
        "clusters": n,
        "stages": groups.iter().map(Vec::len).collect::<Vec<_>>(),
        "min_success_time_s": SOAK,
        "healthy_rollout_s": round(healthy.as_secs_f64(), 2),
        "healthy_floor_s": floor.as_secs(),
        "healthy_over_floor": round(healthy.as_secs_f64() / floor.as_secs_f64(), 2),
        "bad_revision_halted_in": halted_in,
        "bad_revision_to_rolled_back_s": round(halted.as_secs_f64(), 2),
        "bad_revision_clusters_given_it": got3.lock().len(),
        "bad_revision_clusters_of_stages_1_2": first_two,
        "bad_revision_touched_in_stages_3_4": touched,
        "rollback_to_all_healthy_s": round(restored.as_secs_f64(), 2),
        "since_bad_change_s": round(t0.elapsed().as_secs_f64(), 2),
        "measures": "one Duplicated Deployment on every cluster; stages of 5/20/35/40 % of the clusters, minSuccessTime 5s each, progressDeadline 20s, maxFailures = stage 1's size, rollback Automatic; times from the template's write, read from the binding's status.rollout and the Works (polled every 100 ms)",
    }));
    Ok(())
}
