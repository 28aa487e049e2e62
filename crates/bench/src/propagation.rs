//! Propagation benchmarks: how fast a template and its policy reach a member, and how many
//! templates the controllers turn into Works per second.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};

use crate::api::{ServerProcess, request};
use crate::members::{bootstrap_token, orrery_bin, start_agent};
use crate::stats::{emit, percentile, progress, round};

pub struct Args {
    pub clusters: usize,
    pub templates: usize,
    pub server_bin: Option<PathBuf>,
    pub dir: Option<PathBuf>,
}

/// Starts a server and one agent process simulating `clusters` members; waits until Ready.
pub(crate) async fn fleet(
    args: &Args,
    report: &str,
) -> anyhow::Result<(ServerProcess, kube::Client, crate::members::AgentProcess)> {
    let server = ServerProcess::start(&args.server_bin, &args.dir)?;
    let (admin, agent) = fleet_on(&server, &args.server_bin, args.clusters, report).await?;
    Ok((server, admin, agent))
}

/// `clusters` simulated members `m-<i>` in one agent process connected to `server`, all Ready.
pub(crate) async fn fleet_on(
    server: &ServerProcess,
    server_bin: &Option<std::path::PathBuf>,
    clusters: usize,
    report: &str,
) -> anyhow::Result<(kube::Client, crate::members::AgentProcess)> {
    let bin = orrery_bin(server_bin)?;
    let admin = orrery_client::from_kubeconfig(&server.kubeconfig).await?;
    let token = bootstrap_token(&admin, "m-*").await?;
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("fleet.yaml");
    std::fs::write(
        &file,
        format!(
            "clusters:\n  - name: m-{{i}}\n    count: {clusters}\n    regions: [us-east, eu-central, ap-south]\n    provider: sim\n    simulate: nodes=10,cpu=64,memory=256Gi,load=0.1,start=0s\n",
        ),
    )?;
    let agent = start_agent(
        &bin,
        &server.url,
        &[
            "--simulate-fleet".into(),
            file.display().to_string(),
            "--token".into(),
            token,
            "--heartbeat-interval".into(),
            "5s".into(),
            "--report-interval".into(),
            report.into(),
        ],
        true,
    )?;
    let started = Instant::now();
    loop {
        let n = orrery_client::ready_clusters(&admin).await?;
        if n >= clusters {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(300),
            "only {n} clusters Ready"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok((admin, agent))
}

pub(crate) fn deployment(name: &str, replicas: i64) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "web", "image": "nginx:1.27",
                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}}}})
}

pub(crate) async fn post(c: &kube::Client, path: &str, body: &Value) -> anyhow::Result<()> {
    c.request_text(request(
        "POST",
        path,
        "application/json",
        serde_json::to_vec(body)?,
    ))
    .await?;
    Ok(())
}

type Seen = Arc<Mutex<HashMap<(&'static str, String), Instant>>>;

/// Watches bindings and Works; records when each stage is first seen: `bound` (binding
/// created), `scheduled` (clusters chosen), `work` (Work created), `applied` (the member
/// reported it applied). Works are keyed by their name (`default.<binding>`).
fn stage_times(client: kube::Client) -> Seen {
    let seen: Seen = Default::default();
    for kind in [
        &orrery_client::kinds::WORK,
        &orrery_client::kinds::RESOURCE_BINDING,
    ] {
        let api: Api<DynamicObject> = orrery_client::api(&client, kind, None);
        let seen = seen.clone();
        let is_work = kind.kind == "Work";
        tokio::spawn(async move {
            let mut s = watcher::watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(ev) = s.next().await {
                let o = match ev {
                    Ok(watcher::Event::Apply(o)) | Ok(watcher::Event::InitApply(o)) => o,
                    _ => continue,
                };
                let Some(name) = o.metadata.name.clone() else {
                    continue;
                };
                let now = Instant::now();
                let mut m = seen.lock();
                if is_work {
                    m.entry(("work", name.clone())).or_insert(now);
                    let applied = o
                        .data
                        .pointer("/status/conditions")
                        .and_then(Value::as_array)
                        .is_some_and(|cs| {
                            cs.iter()
                                .any(|c| c["type"] == "Applied" && c["status"] == "True")
                        });
                    if applied {
                        m.entry(("applied", name)).or_insert(now);
                    }
                } else {
                    let key = format!("default.{name}");
                    m.entry(("bound", key.clone())).or_insert(now);
                    if o.data.pointer("/spec/clusters/0").is_some() {
                        m.entry(("scheduled", key)).or_insert(now);
                    }
                }
            }
        });
    }
    seen
}

/// Template + policy to applied in the member: for each template, a Deployment and a
/// PropagationPolicy naming it and one cluster are created; the clock stops when a watcher of
/// the control plane sees the member report the Work applied.
pub async fn latency(args: Args) -> anyhow::Result<()> {
    progress(format!(
        "propagation latency: starting {} simulated clusters",
        args.clusters
    ));
    let (_server, admin, _agent) = fleet(&args, "20ms").await?;
    let seen = stage_times(admin.clone());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut lat = Vec::new();
    let mut stages: HashMap<&'static str, Vec<f64>> = HashMap::new();
    for i in 0..args.templates {
        let name = format!("lat-{i}");
        let cluster = format!("m-{}", i % args.clusters);
        let t0 = Instant::now();
        post(
            &admin,
            "/apis/apps/v1/namespaces/default/deployments",
            &deployment(&name, 1),
        )
        .await?;
        post(&admin, "/apis/policy.karmada.io/v1alpha1/namespaces/default/propagationpolicies", &json!({
            "apiVersion": "policy.karmada.io/v1alpha1", "kind": "PropagationPolicy",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": name}],
                "placement": {"clusterAffinity": {"clusterNames": [cluster]}}}})).await?;
        stages
            .entry("posted")
            .or_default()
            .push(t0.elapsed().as_secs_f64() * 1000.0);
        let work = format!("default.{name}-deployment");
        loop {
            let done = {
                let m = seen.lock();
                m.get(&("applied", work.clone())).map(|t| {
                    let at =
                        |s: &'static str| m.get(&(s, work.clone())).map(|x| x.duration_since(t0));
                    (
                        t.duration_since(t0),
                        ["bound", "scheduled", "work"].map(|s| (s, at(s))),
                    )
                })
            };
            if let Some((t, steps)) = done {
                lat.push(t.as_secs_f64() * 1000.0);
                for (stage, d) in steps {
                    if let Some(d) = d {
                        stages
                            .entry(stage)
                            .or_default()
                            .push(d.as_secs_f64() * 1000.0);
                    }
                }
                break;
            }
            anyhow::ensure!(
                t0.elapsed() < Duration::from_secs(30),
                "{work} not applied in 30 s"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        if (i + 1) % 50 == 0 {
            progress(format!("propagation latency: {}/{}", i + 1, args.templates));
        }
    }
    emit(json!({
        "scenario": "propagation.template_to_applied",
        "clusters": args.clusters,
        "templates": args.templates,
        "p50_ms": round(percentile(&lat, 50.0), 1),
        "p99_ms": round(percentile(&lat, 99.0), 1),
        "max_ms": round(percentile(&lat, 100.0), 1),
        "stages_p50_ms": stages.iter().map(|(k, v)| (k.to_string(), json!(round(percentile(v, 50.0), 1)))).collect::<serde_json::Map<_, _>>(),
        "stages_p99_ms": stages.iter().map(|(k, v)| (k.to_string(), json!(round(percentile(v, 99.0), 1)))).collect::<serde_json::Map<_, _>>(),
        "measures": "from creating a Deployment and a PropagationPolicy for it (two API calls) to a control-plane watcher seeing the member report its Work applied (agent report interval 20 ms)",
        "karmada_p99_ms_at_100_clusters": "989-1298",
        "goal_p99_ms": 100,
    }));
    Ok(())
}

/// Binding to Works throughput: `templates` Deployments exist; one PropagationPolicy selects
/// them all for every cluster (Duplicated). Measured: Works created per second, and the time
/// until every binding is FullyApplied.
pub async fn throughput(args: Args) -> anyhow::Result<()> {
    progress(format!(
        "propagation throughput: {} simulated clusters",
        args.clusters
    ));
    let (server, admin, _agent) = fleet(&args, "200ms").await?;
    progress(format!(
        "propagation throughput: creating {} Deployments",
        args.templates
    ));
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let (c, next, total) = (admin.clone(), next.clone(), args.templates);
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= total {
                    return Ok::<_, anyhow::Error>(());
                }
                // No pods: this measures the control plane's path, not the simulated kubelets.
                post(
                    &c,
                    "/apis/apps/v1/namespaces/default/deployments",
                    &deployment(&format!("t-{i}"), 0),
                )
                .await?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    let works_seen = Arc::new(Mutex::new(HashMap::<String, Instant>::new()));
    let applied = Arc::new(Mutex::new(0usize));
    {
        let api: Api<DynamicObject> =
            orrery_client::api(&admin, &orrery_client::kinds::RESOURCE_BINDING, None);
        let applied = applied.clone();
        tokio::spawn(async move {
            let mut done = std::collections::HashSet::new();
            let mut s = watcher::watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(ev) = s.next().await {
                let Ok(watcher::Event::Apply(o)) = ev else {
                    continue;
                };
                let ok = o
                    .data
                    .pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c["type"] == "FullyApplied" && c["status"] == "True")
                    });
                if ok
                    && let Some(n) = o.metadata.name
                    && done.insert(n)
                {
                    *applied.lock() = done.len();
                }
            }
        });
        let api: Api<DynamicObject> = orrery_client::api(&admin, &orrery_client::kinds::WORK, None);
        let seen = works_seen.clone();
        tokio::spawn(async move {
            let mut s = watcher::watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(ev) = s.next().await {
                let Ok(watcher::Event::Apply(o)) = ev else {
                    continue;
                };
                let key = format!(
                    "{}/{}",
                    o.metadata.namespace.unwrap_or_default(),
                    o.metadata.name.unwrap_or_default()
                );
                seen.lock().entry(key).or_insert_with(Instant::now);
            }
        });
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (_, _, cpu0) = server.usage_full();
    let want_works = args.templates * args.clusters;
    progress(format!(
        "propagation throughput: the policy; waiting for {want_works} Works"
    ));
    let t0 = Instant::now();
    post(
        &admin,
        "/apis/policy.karmada.io/v1alpha1/namespaces/default/propagationpolicies",
        &json!({
        "apiVersion": "policy.karmada.io/v1alpha1", "kind": "PropagationPolicy",
        "metadata": {"name": "all", "namespace": "default"},
        "spec": {"resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment"}]}}),
    )
    .await?;
    let mut works_done = None;
    let all_applied;
    loop {
        let works = works_seen.lock().len();
        if works >= want_works && works_done.is_none() {
            let last = works_seen.lock().values().max().copied();
            works_done = last.map(|l| l.duration_since(t0).as_secs_f64());
        }
        let n = *applied.lock();
        if n >= args.templates {
            all_applied = t0.elapsed().as_secs_f64();
            break;
        }
        anyhow::ensure!(
            t0.elapsed() < Duration::from_secs(600),
            "{works} Works, {n} bindings FullyApplied after 10 minutes"
        );
        progress(format!(
            "propagation throughput: {works} Works, {n} bindings FullyApplied"
        ));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let (rss, peak, cpu1) = server.usage_full();
    let works_secs = works_done.unwrap_or(all_applied);
    emit(json!({
        "scenario": "propagation.throughput",
        "clusters": args.clusters,
        "templates": args.templates,
        "works": want_works,
        "seconds_to_all_works": round(works_secs, 2),
        "works_per_second": round(want_works as f64 / works_secs, 0),
        "seconds_to_all_fully_applied": round(all_applied, 2),
        "server_cpu_cores": round((cpu1 - cpu0) / all_applied, 2),
        "server_rss_mib": round(rss, 1),
        "server_peak_rss_mib": round(peak, 1),
        "measures": "one PropagationPolicy selecting every existing Deployment (replicas 0) for every cluster: time from the policy's creation until every Work exists, and until every binding is FullyApplied (members applied and reported)",
        "karmada_works_per_second": 200,
        "goals": {"works_per_second": 10000, "seconds_to_all_fully_applied": 30},
    }));
    Ok(())
}

pub struct WorksArgs {
    pub clusters: usize,
    pub templates: usize,
    pub runs: usize,
    pub dir: Option<PathBuf>,
}

/// Where the bench's templates live (the server resolves kinds through its API registry).
#[derive(Debug)]
struct Deployments;

impl orrery_controllers::propagation::Kinds for Deployments {
    fn resolve(
        &self,
        api_version: &str,
        kind: &str,
    ) -> Option<orrery_controllers::propagation::KindInfo> {
        (api_version == "apps/v1" && kind == "Deployment").then(|| {
            orrery_controllers::propagation::KindInfo {
                group: "apps".into(),
                plural: "deployments".into(),
                namespaced: true,
            }
        })
    }
}

/// Binding to Works: `templates` Deployments and their bindings, scheduled onto every one of
/// `clusters` Ready clusters, are stored; then the binding controller starts. Measured: Works
/// written per second from its start until every Work exists (its status writes to the
/// bindings run in the same time), through a SQLite store in a temporary directory.
pub async fn works(args: WorksArgs) -> anyhow::Result<()> {
    use orrery_api::{Object, keys};
    let mut rates = Vec::new();
    let mut firsts = Vec::new();
    for run in 0..args.runs {
        let (_tmp, store) = crate::inproc::store(&args.dir)?;
        let names: Vec<String> = (0..args.clusters).map(|i| format!("m-{i}")).collect();
        for n in &names {
            let mut c = Object::new("multicluster.io/v1alpha1", "Cluster").with_name(n);
            c.metadata.labels.insert("region".into(), "r".into());
            c.spec = Some(json!({"provider": "sim", "region": "r"}));
            c.status = Some(json!({"conditions": [{"type": "Ready", "status": "True",
                "reason": "Bench", "lastTransitionTime": orrery_api::Time::now().to_string()}]}));
            store.create(&keys::well_known::cluster(n), c).await?;
        }
        progress(format!(
            "propagation works, run {}: storing {} templates and bindings",
            run + 1,
            args.templates
        ));
        let targets: Vec<Value> = names
            .iter()
            .map(|n| json!({"name": n, "replicas": 0}))
            .collect();
        let mut pending = Vec::new();
        for i in 0..args.templates {
            let name = format!("t-{i}");
            let uid = format!("00000000-0000-0000-0000-{i:012}");
            let mut t: Object = serde_json::from_value(deployment(&name, 0))?;
            t.metadata.uid = uid.clone();
            t.metadata.generation = Some(1);
            let mut b = Object::new("multicluster.io/v1alpha1", "ResourceBinding")
                .with_name(format!("{name}-deployment"));
            b.metadata.namespace = "default".into();
            b.metadata.generation = Some(1);
            b.metadata
                .finalizers
                .push(orrery_api::binding::FINALIZER.into());
            b.spec = Some(json!({
                "resource": {"apiVersion": "apps/v1", "kind": "Deployment",
                    "namespace": "default", "name": name, "uid": uid},
                "replicas": 0,
                "placement": {"replicaScheduling": {"replicaSchedulingType": "Duplicated"}},
                "policy": {"apiVersion": "policy.karmada.io/v1alpha1", "kind": "PropagationPolicy",
                    "namespace": "default", "name": "all"},
                "clusters": targets,
            }));
            let st = store.clone();
            let (tkey, bkey) = (
                keys::object("apps", "deployments", Some("default"), &name),
                keys::object(
                    "multicluster.io",
                    "resourcebindings",
                    Some("default"),
                    &format!("{name}-deployment"),
                ),
            );
            pending.push(async move {
                st.create(&tkey, t).await?;
                st.create(&bkey, b).await.map(|_| ())
            });
            if pending.len() == 512 {
                for r in futures_util::future::join_all(std::mem::take(&mut pending)).await {
                    r?;
                }
            }
        }
        for r in futures_util::future::join_all(pending).await {
            r?;
        }
        let want = args.templates * args.clusters;
        let from = store.current_revision().await?;
        let mut watch = store
            .watch(&keys::well_known::works(None), from, Default::default())
            .await?;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let started = Instant::now();
        let ctl = tokio::spawn(orrery_controllers::propagation::binding::run(
            store.clone(),
            Arc::new(Deployments),
            Arc::default(),
            None,
            stop_rx,
        ));
        let mut seen = std::collections::HashSet::new();
        let mut first = None;
        let mut last_report = Instant::now();
        while seen.len() < want {
            let ev = tokio::time::timeout(Duration::from_secs(120), watch.next())
                .await
                .map_err(|_| anyhow::anyhow!("no Work for 120 s ({} of {want})", seen.len()))?;
            let Some(ev) = ev else {
                anyhow::bail!("the store's watch ended at {} of {want} Works", seen.len());
            };
            if let orrery_store::WatchEvent::Added(o) = ev?
                && seen.insert(format!("{}/{}", o.namespace(), o.name()))
                && first.is_none()
            {
                first = Some(started.elapsed().as_secs_f64());
            }
            if last_report.elapsed() >= Duration::from_secs(2) {
                last_report = Instant::now();
                progress(format!("{} of {want} Works", seen.len()));
            }
        }
        let secs = crate::inproc::finish(started, stop_tx, ctl, &store).await;
        rates.push(seen.len() as f64 / secs);
        firsts.push(first.unwrap_or(f64::NAN));
        progress(format!(
            "propagation works, run {}: {:.0} Works/s ({} in {secs:.2} s)",
            run + 1,
            seen.len() as f64 / secs,
            seen.len()
        ));
    }
    emit(json!({
        "scenario": "propagation.binding_to_works",
        "store": "sqlite",
        "clusters": args.clusters,
        "templates": args.templates,
        "works": args.templates * args.clusters,
        "runs": args.runs,
        "works_per_second_median": round(crate::stats::median(&rates), 0),
        "works_per_second_runs": rates.iter().map(|r| round(*r, 0)).collect::<Vec<_>>(),
        "first_work_seconds_median": round(crate::stats::median(&firsts), 2),
        "measures": "the binding controller alone, from its start over stored, scheduled bindings until every Work exists (Works and the bindings' status written through a SQLite store)",
        "karmada_works_per_second": 200,
        "goal_works_per_second": 10000,
    }));
    Ok(())
}

pub struct RestartArgs {
    pub clusters: usize,
    pub templates: usize,
    pub runs: usize,
    pub server_bin: Option<PathBuf>,
    pub dir: Option<PathBuf>,
}

/// Every controller's figures on `/metrics`: whether all are synced and all queues empty.
async fn controllers_idle(c: &kube::Client) -> anyhow::Result<bool> {
    let text = c
        .request_text(request("GET", "/metrics", "text/plain", Vec::new()))
        .await?;
    let mut synced = 0;
    let mut idle = true;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let v: f64 = value.parse().unwrap_or(0.0);
        if name.starts_with("orrery_controller_synced{") {
            if v < 1.0 {
                return Ok(false);
            }
            synced += 1;
        }
        if (name.starts_with("orrery_controller_queue_depth{")
            || name == "orrery_scheduler_queue_depth")
            && v > 0.0
        {
            idle = false;
        }
    }
    // The policy, binding, scheduling, health and four lifecycle controllers.
    Ok(synced >= 8 && idle)
}

/// Operations the members carried out so far, and pods they created.
fn member_totals(admin: &str) -> anyhow::Result<(u64, u64)> {
    let all = crate::members::admin_get(admin, "/clusters")?;
    let mut ops = 0;
    let mut pods = 0;
    for c in all.as_array().into_iter().flatten() {
        ops += c["operations"].as_u64().unwrap_or(0);
        pods += c["podsCreated"].as_u64().unwrap_or(0);
    }
    Ok((ops, pods))
}

/// A restart of a control plane holding `templates` Deployments placed over `clusters`
/// members: time until it serves again, until every controller is synced and idle, and what
/// the members did because of it (the goal: nothing).
pub async fn restart(args: RestartArgs) -> anyhow::Result<()> {
    let base = Args {
        clusters: args.clusters,
        templates: args.templates,
        server_bin: args.server_bin.clone(),
        dir: args.dir.clone(),
    };
    progress(format!("restart: {} simulated clusters", args.clusters));
    let (mut server, admin, agent) = fleet(&base, "1s").await?;
    progress(format!("restart: creating {} Deployments", args.templates));
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let (c, next, total) = (admin.clone(), next.clone(), args.templates);
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= total {
                    return Ok::<_, anyhow::Error>(());
                }
                post(
                    &c,
                    "/apis/apps/v1/namespaces/default/deployments",
                    &deployment(&format!("t-{i}"), 2),
                )
                .await?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    post(
        &admin,
        "/apis/policy.karmada.io/v1alpha1/namespaces/default/propagationpolicies",
        &json!({
        "apiVersion": "policy.karmada.io/v1alpha1", "kind": "PropagationPolicy",
        "metadata": {"name": "all", "namespace": "default"},
        "spec": {"resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment"}],
            "placement": {"replicaScheduling": {"replicaSchedulingType": "Divided"}}}}),
    )
    .await?;
    // Settled: every binding FullyApplied, members quiet.
    let started = Instant::now();
    loop {
        let list = admin
            .request_text(request(
                "GET",
                "/apis/multicluster.io/v1alpha1/resourcebindings",
                "application/json",
                Vec::new(),
            ))
            .await?;
        let v: Value = serde_json::from_str(&list)?;
        let applied = v["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|b| {
                b.pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c["type"] == "FullyApplied" && c["status"] == "True")
                    })
            })
            .count();
        if applied >= args.templates {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(900),
            "only {applied} bindings FullyApplied after 15 minutes"
        );
        progress(format!(
            "restart: {applied} of {} bindings FullyApplied",
            args.templates
        ));
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    for run in 1..=args.runs {
        let (ops0, pods0) = member_totals(&agent.admin)?;
        let t0 = Instant::now();
        server.restart()?;
        let ready = t0.elapsed().as_secs_f64();
        let client = orrery_client::from_kubeconfig(&server.kubeconfig).await?;
        let converged = loop {
            if controllers_idle(&client).await.unwrap_or(false) {
                break t0.elapsed().as_secs_f64();
            }
            anyhow::ensure!(
                t0.elapsed() < Duration::from_secs(300),
                "the controllers were not synced and idle 5 minutes after the restart"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        // Whatever a restart would make the members do happens within seconds.
        tokio::time::sleep(Duration::from_secs(15)).await;
        let (ops1, pods1) = member_totals(&agent.admin)?;
        let (rss, _) = server.usage();
        emit(json!({
            "scenario": "restart.converge",
            "run": run,
            "clusters": args.clusters,
            "templates": args.templates,
            "seconds_to_ready": round(ready, 2),
            "seconds_to_converged": round(converged, 2),
            "member_operations": ops1 - ops0,
            "pods_created": pods1 - pods0,
            "server_rss_mib": round(rss, 1),
            "measures": "SIGTERM and start again with every template placed and applied: time until the server serves, until every controller has listed its sources and emptied its queue (/metrics), and the operations the members carried out in the 15 s after",
            "goals": {"seconds_to_converged": 5, "member_operations": 0},
        }));
    }
    Ok(())
}
