//! `stateful-migration`: what a planned move of a StatefulSet costs, with Orrery's pre-copy
//! migration against stop-and-copy and against Karmada's behaviour (the workload re-created
//! elsewhere, its data left behind).
//!
//! Two parts, in one run:
//!
//! 1. **End to end**: a server and an agent process simulating two members on one link; a
//!    small StatefulSet moved back and forth by Migrations. This measures what a move takes
//!    in the real system: its downtime, and from that the latency of one control hop (a
//!    write reaching a member, or a member's report reaching the controller).
//! 2. **Model**: moves of 10 GiB, 100 GiB and 1 TiB over 1 Gbit/s cannot run in real time,
//!    so they run in virtual time through the same code: the migration's phase machine
//!    (`orrery_controllers::migration::plan`) and the simulated members' data plane
//!    (`orrery_sim::data`), with each control hop taking what part 1
//!    measured, and pods taking `--pod-start` to start.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use orrery_api::binding::BindingSpec;
use orrery_api::stateful::{MigrationPhase, MigrationStatus, TransferRole};
use orrery_api::work::{Health, ManifestStatus};
use orrery_api::{MicroTime, Time};
use orrery_controllers::migration::plan::{self, End, Settings, WorkSeen};
use orrery_sim::data::DataPlane;
use serde_json::{Value, json};

use crate::api::{ServerProcess, request};
use crate::members::{bootstrap_token, orrery_bin, start_agent};
use crate::stats::{emit, median, progress, round};

pub struct Args {
    pub runs: usize,
    pub sizes_gib: Vec<u64>,
    pub write_percents: Vec<f64>,
    /// Bytes per second of the link.
    pub link: f64,
    /// Seconds a pod takes to start, in the model.
    pub pod_start: f64,
    pub server_bin: Option<PathBuf>,
    pub dir: Option<PathBuf>,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let (hop, e2e) = match end_to_end(&args).await {
        Ok(x) => x,
        Err(e) => {
            progress(format!("end to end: {e:#}"));
            return Err(e);
        }
    };
    emit(e2e);
    for &gib in &args.sizes_gib {
        for &pct in &args.write_percents {
            emit(model(&args, gib, pct, hop));
        }
    }
    Ok(())
}

fn sts(bandwidth_note: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "db", "namespace": "default", "annotations": {"note": bandwidth_note}},
        "spec": {"replicas": 1, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
            "template": {"metadata": {"labels": {"app": "db"},
                    "annotations": {"sim.orrery.io/volume-used": "512Mi", "sim.orrery.io/write-rate": "1Mi"}},
                "spec": {"containers": [{"name": "pg", "image": "postgres:16",
                    "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}}}]}},
            "volumeClaimTemplates": [{"metadata": {"name": "data"},
                "spec": {"resources": {"requests": {"storage": "2Gi"}}}}]}
    })
}

async fn post(client: &kube::Client, path: &str, body: &Value) -> anyhow::Result<Value> {
    let text = client
        .request_text(request(
            "POST",
            path,
            "application/json",
            serde_json::to_vec(body)?,
        ))
        .await?;
    Ok(serde_json::from_str(&text)?)
}

pub(crate) async fn get(client: &kube::Client, path: &str) -> anyhow::Result<Value> {
    let text = client
        .request_text(request("GET", path, "application/json", Vec::new()))
        .await?;
    Ok(serde_json::from_str(&text)?)
}

const MIGRATIONS: &str = "/apis/multicluster.io/v1alpha1/namespaces/default/migrations";

/// Part 1: moves in the real system. Returns the latency of one control hop (seconds) and
/// the figures.
async fn end_to_end(args: &Args) -> anyhow::Result<(f64, Value)> {
    let bin = orrery_bin(&args.server_bin)?;
    let server = ServerProcess::start_with(
        &args.server_bin,
        &args.dir,
        &["--migration-cleanup-grace", "1s"],
    )?;
    let admin = orrery_client::from_kubeconfig(&server.kubeconfig).await?;
    let token = bootstrap_token(&admin, "*").await?;
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("fleet.yaml");
    let start = 0.5;
    std::fs::write(
        &file,
        format!(
            "clusters:\n  - name: left\n    region: eu\n    simulate: nodes=4,cpu=16,memory=64Gi,load=0.1,start={}ms,bandwidth={}\n  - name: right\n    region: eu\n    simulate: nodes=4,cpu=16,memory=64Gi,load=0.1,start={}ms,bandwidth={}\n",
            (start * 1000.0) as u64,
            args.link as u64,
            (start * 1000.0) as u64,
            args.link as u64
        ),
    )?;
    let _agent = start_agent(
        &bin,
        &server.url,
        &[
            "--simulate-fleet".into(),
            file.display().to_string(),
            "--token".into(),
            token,
            "--heartbeat-interval".into(),
            "1s".into(),
        ],
        true,
    )?;
    let ready = Instant::now();
    while orrery_client::ready_clusters(&admin).await? < 2 {
        anyhow::ensure!(
            ready.elapsed() < Duration::from_secs(60),
            "members not Ready"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut at = place_db(&admin).await?;
    let mut downtimes = Vec::new();
    let mut totals = Vec::new();
    let mut hops = Vec::new();
    let mut rounds = Vec::new();
    let mut lost = 0i64;
    for run in 0..args.runs {
        let target = if at == "left" { "right" } else { "left" };
        at = target.to_string();
        let name = format!("move-{run}");
        post(
            &admin,
            MIGRATIONS,
            &json!({"apiVersion": "multicluster.io/v1alpha1", "kind": "Migration",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"resource": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db"},
                    "targetClusters": [target]}}),
        )
        .await?;
        let m = wait_migration(&admin, &name).await?;
        let st: MigrationStatus = serde_json::from_value(m["status"].clone())?;
        let downtime = st.downtime_seconds.unwrap_or_default();
        let until_switch: i64 = st
            .phases
            .iter()
            .filter(|p| p.phase < MigrationPhase::Switching)
            .filter_map(|p| p.duration_ms)
            .sum();
        // The downtime's control part: what is not the last copy nor the pods' start, over
        // the three hops it waits on (the fence to the source, its snapshot back, the copy's
        // end and the pods' readiness back).
        let last_copy: i64 = st.volumes.iter().map(|v| v.round_bytes).sum();
        let control = downtime - start - last_copy as f64 / args.link;
        hops.push((control / 3.0).max(0.0));
        for v in &st.volumes {
            if v.started_version != v.fenced_version {
                lost += 1;
            }
        }
        progress(format!(
            "{name}: down {downtime:.2}s, {until_switch} ms to the switch, {} rounds",
            st.rounds
        ));
        downtimes.push(downtime);
        totals.push(until_switch as f64 / 1000.0);
        rounds.push(st.rounds as f64);
        // The next move waits for this one's clean-up.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let hop = median(&hops);
    Ok((
        hop,
        json!({
            "scenario": "stateful-migration-e2e",
            "volume_bytes": 512u64 << 20,
            "write_bytes_per_second": 1u64 << 20,
            "link_bytes_per_second": args.link,
            "pod_start_seconds": start,
            "runs": args.runs,
            "downtime_seconds_median": round(median(&downtimes), 3),
            "downtime_seconds_runs": downtimes.iter().map(|d| round(*d, 3)).collect::<Vec<_>>(),
            "downtime_beyond_pod_start_median": round(median(&downtimes) - start, 3),
            "time_to_switch_seconds_median": round(median(&totals), 2),
            "rounds_median": median(&rounds),
            "control_hop_seconds": round(hop, 3),
            "volumes_started_on_other_than_fenced_data": lost,
        }),
    ))
}

/// The StatefulSet `db` and a policy placing it on one of the two members; the member it
/// runs on once Healthy.
async fn place_db(admin: &kube::Client) -> anyhow::Result<String> {
    post(
        admin,
        "/apis/apps/v1/namespaces/default/statefulsets",
        &sts(""),
    )
    .await?;
    post(
        admin,
        "/apis/multicluster.io/v1alpha1/namespaces/default/resourceplacementpolicies",
        &json!({"apiVersion": "multicluster.io/v1alpha1", "kind": "ResourcePlacementPolicy",
            "metadata": {"name": "db", "namespace": "default"},
            "spec": {"resourceSelector": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "namespace": "default"},
                "placement": {"clusterAffinity": {"clusterNames": ["left", "right"]},
                    "spreadConstraints": [{"spreadByField": "cluster", "maxGroups": 1}]}}}),
    )
    .await?;
    let placed = Instant::now();
    let at = loop {
        let b = get(
            admin,
            "/apis/multicluster.io/v1alpha1/namespaces/default/resourcebindings/db-statefulset",
        )
        .await;
        if let Ok(b) = b
            && b["status"]["aggregatedStatus"][0]["health"] == "Healthy"
        {
            break b["spec"]["clusters"][0]["name"]
                .as_str()
                .unwrap_or("left")
                .to_string();
        }
        anyhow::ensure!(placed.elapsed() < Duration::from_secs(60), "db never ran");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    Ok(at)
}

/// Waits (2 minutes at most) for the Migration `name` to succeed; the Migration then.
async fn wait_migration(admin: &kube::Client, name: &str) -> anyhow::Result<Value> {
    let began = Instant::now();
    let m = loop {
        let m = get(admin, &format!("{MIGRATIONS}/{name}")).await?;
        match m["status"]["phase"].as_str() {
            Some("Succeeded") => break m,
            Some("Failed") => anyhow::bail!("{name} failed: {}", m["status"]["message"]),
            _ => {}
        }
        anyhow::ensure!(
            began.elapsed() < Duration::from_secs(120),
            "{name} did not finish"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    Ok(m)
}

/// One member as the model runs it: its data, what it has applied, its pods.
struct Member {
    data: DataPlane,
    applied: Option<BindingSpec>,
    running: bool,
    /// The pods start at this time (virtual seconds).
    starting_at: Option<f64>,
}

const VOLUME: &str = "data-db-0";

fn workload_status(m: &Member, ns: &str) -> ManifestStatus {
    let v = m.data.volume(ns, VOLUME).map(|v| v.status());
    ManifestStatus {
        applied: true,
        health: if m.running {
            Health::Healthy
        } else {
            Health::Progressing
        },
        status: Some(json!({"replicas": i64::from(m.running)})),
        volumes: v.into_iter().collect(),
        ..Default::default()
    }
}

fn seen(m: &Member, cluster: &str, id: &str, spec: &BindingSpec) -> WorkSeen {
    let transfers: Vec<_> = spec
        .transfers
        .iter()
        .filter(|t| t.cluster == cluster)
        .map(|t| t.transfer.clone())
        .collect();
    let in_plan =
        spec.clusters.iter().any(|c| c.name == cluster) || spec.fenced.iter().any(|c| c == cluster);
    WorkSeen {
        current: true,
        transfer: m
            .data
            .statuses("w", &transfers)
            .into_iter()
            .find(|t| t.id == id),
        workload: in_plan.then(|| workload_status(m, "default")),
        error: None,
    }
}

/// The outcome of one strategy at one size and write rate.
struct Outcome {
    downtime: f64,
    total: f64,
    rounds: u32,
    bytes_lost: f64,
}

/// Part 2, Orrery's pre-copy: the phase machine and two members' data planes in virtual
/// time, every control hop taking `hop` seconds.
fn precopy(size: f64, write: f64, link: f64, hop: f64, pod_start: f64) -> Outcome {
    let id = "uid-1";
    let mut spec: BindingSpec = serde_json::from_value(json!({
        "resource": {"apiVersion": "apps/v1", "kind": "StatefulSet", "namespace": "default", "name": "db"},
        "policy": {"apiVersion": "multicluster.io/v1alpha1", "kind": "ResourcePlacementPolicy", "name": "db"},
        "replicas": 1, "clusters": [{"name": "a", "replicas": 1}],
        "volumes": [{"name": "data", "perOrdinal": true}], "migration": "m",
    }))
    .unwrap_or_default();
    let mut status = MigrationStatus {
        source: "a".into(),
        target: "b".into(),
        replicas: 1,
        ..Default::default()
    };
    let mut a = Member {
        data: DataPlane::new(link),
        applied: None,
        running: true,
        starting_at: None,
    };
    let mut b = Member {
        data: DataPlane::new(link),
        applied: None,
        running: false,
        starting_at: None,
    };
    a.data.ensure_volume(
        "default",
        VOLUME,
        Some(0),
        Some("StatefulSet/db"),
        (size * 2.0) as i64,
        "",
        size,
    );
    a.data.attach("default", VOLUME, "StatefulSet/db", write);
    let settings = Settings::default();
    let epoch = MicroTime::from(Time::from_unix_seconds(1_700_000_000).unwrap_or_else(Time::now));
    // What the controller wrote, reaching the members a hop later; what they report,
    // reaching the controller a hop later.
    let mut to_members: VecDeque<(f64, BindingSpec)> = VecDeque::new();
    let mut to_controller: VecDeque<(f64, (End, End))> = VecDeque::new();
    let mut t = 0.0;
    let mut fenced_at = None;
    let mut seen_views = (
        End {
            serving: true,
            work: None,
        },
        End {
            serving: true,
            work: None,
        },
    );
    let mut last_spec = spec.clone();
    to_members.push_back((hop, spec.clone()));
    loop {
        // Coarse while copying in bulk, fine from the fence on (the downtime's part).
        let dt = if status.phase >= MigrationPhase::Fencing {
            0.01
        } else {
            0.1
        };
        t += dt;
        // Members act on what reached them.
        while to_members.front().is_some_and(|(at, _)| *at <= t) {
            if let Some((_, s)) = to_members.pop_front() {
                for (name, m) in [("a", &mut a), ("b", &mut b)] {
                    apply_spec(m, name, &s, write);
                }
            }
        }
        start_target(&mut b, id, t, pod_start, write);
        a.data.advance(dt);
        b.data.advance(dt);
        let stopped_a = !a.running;
        a.data.step(&|_, _| stopped_a);
        let stopped_b = !b.running;
        b.data.step(&|_, _| stopped_b);
        // Their reports, a hop away.
        let views = reports(&a, &b, id);
        to_controller.push_back((t + hop, views));
        while to_controller.front().is_some_and(|(at, _)| *at <= t) {
            if let Some((_, v)) = to_controller.pop_front() {
                seen_views = v;
            }
        }
        let now = epoch.add_millis((t * 1000.0) as i64);
        let out = plan::step(&plan::Input {
            now,
            name: "m",
            id,
            namespace: "default",
            workload: "StatefulSet/db",
            deleting: false,
            status: &status,
            binding: Some(&spec),
            source: seen_views.0.clone(),
            target: seen_views.1.clone(),
            rate: link as i64,
            switch_waits: Vec::new(),
            starts_empty: false,
            standby: None,
            source_written: Vec::new(),
            source_last_heard: None,
            budget: None,
            settings: &settings,
        });
        status = out.status;
        if let Some(s) = out.binding {
            spec = s;
        }
        if spec != last_spec {
            to_members.push_back((t + hop, spec.clone()));
            last_spec = spec.clone();
        }
        if fenced_at.is_none() && status.phase >= MigrationPhase::Fencing {
            fenced_at = Some(t);
        }
        if status.phase >= MigrationPhase::Switching
            || status.phase == MigrationPhase::Failed
            || t > 1e6
        {
            break;
        }
    }
    let fenced = status.volumes.first().and_then(|v| v.fenced_version);
    let started = status.volumes.first().and_then(|v| v.started_version);
    Outcome {
        downtime: t - fenced_at.unwrap_or(t),
        total: t,
        rounds: status.rounds,
        // Nothing is lost when the target started on exactly what was fenced.
        bytes_lost: if status.phase >= MigrationPhase::Switching
            && status.phase != MigrationPhase::Failed
            && fenced.is_some()
            && fenced == started
        {
            0.0
        } else {
            f64::NAN
        },
    }
}

/// A member acts on the binding that reached it: it stops its pods once fenced or no longer
/// placed, and takes up its transfers.
fn apply_spec(m: &mut Member, name: &str, s: &BindingSpec, write: f64) {
    let transfers: Vec<_> = s
        .transfers
        .iter()
        .filter(|x| x.cluster == name)
        .map(|x| x.transfer.clone())
        .collect();
    let fenced = s.fenced.iter().any(|c| c == name);
    let placed = s.clusters.iter().any(|c| c.name == name);
    if m.running && (fenced || !placed) {
        m.data.detach("default", VOLUME, "StatefulSet/db", write);
        m.running = false;
    }
    let stopped = !m.running;
    m.data.set_transfers("w", &transfers, &|_, _| stopped);
    m.applied = Some(s.clone());
}

/// The target starts once its held copy is in (its pods up `pod_start` seconds later).
fn start_target(b: &mut Member, id: &str, t: f64, pod_start: f64, write: f64) {
    if let Some(s) = &b.applied
        && !b.running
        && b.starting_at.is_none()
        && s.clusters.iter().any(|c| c.name == "b")
        && s.transfers.iter().any(|x| {
            x.cluster == "b" && x.transfer.role == TransferRole::Receive && x.transfer.hold_workload
        })
        && b.data.received(id)
    {
        b.starting_at = Some(t + pod_start);
    }
    if let Some(at) = b.starting_at
        && at <= t
        && !b.running
    {
        b.running = true;
        b.data.attach("default", VOLUME, "StatefulSet/db", write);
    }
}

/// What the two members report of the Work, as the controller will see it.
fn reports(a: &Member, b: &Member, id: &str) -> (End, End) {
    (
        End {
            serving: true,
            work: a.applied.as_ref().map(|s| seen(a, "a", id, s)),
        },
        End {
            serving: true,
            work: b.applied.as_ref().map(|s| seen(b, "b", id, s)),
        },
    )
}

fn model(args: &Args, gib: u64, pct: f64, hop: f64) -> Value {
    let size = gib as f64 * (1u64 << 30) as f64;
    let link = args.link;
    let write = link * pct / 100.0;
    let pod = args.pod_start;
    let began = Instant::now();
    let pre = precopy(size, write, link, hop, pod);
    // Stop-and-copy: the fence reaches the source, everything is copied, the target starts
    // and says so.
    let stop = hop + size / link + hop + pod + hop;
    // Karmada: the workload is re-created elsewhere: up as soon as its pods start, empty.
    let karmada = hop + pod + hop;
    let over_link = size / link;
    progress(format!(
        "{gib} GiB at {pct}% writes: pre-copy down {:.2}s in {:.0}s ({} rounds), stop-and-copy down {stop:.0}s ({:.1}s to model)",
        pre.downtime,
        pre.total,
        pre.rounds,
        began.elapsed().as_secs_f64()
    ));
    json!({
        "scenario": "stateful-migration",
        "volume_gib": gib,
        "write_percent_of_link": pct,
        "link_bytes_per_second": link,
        "pod_start_seconds": pod,
        "control_hop_seconds": round(hop, 3),
        "orrery_downtime_seconds": round(pre.downtime, 2),
        "orrery_downtime_beyond_pod_start": round(pre.downtime - pod, 2),
        "orrery_total_seconds": round(pre.total, 1),
        "orrery_total_over_size_on_link": round(pre.total / over_link, 3),
        "orrery_rounds": pre.rounds,
        "orrery_bytes_lost": pre.bytes_lost,
        "stop_and_copy_downtime_seconds": round(stop, 1),
        "stop_and_copy_total_seconds": round(stop, 1),
        "karmada_downtime_seconds": round(karmada, 2),
        "karmada_bytes_lost": size,
        "goal_downtime_under_2s_plus_pod_start": pct >= 50.0 || pre.downtime - pod < 2.0,
        "goal_total_within_1_2x": pre.total / over_link <= 1.2,
    })
}
