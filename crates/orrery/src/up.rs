//! `orrery up`: the one-command start on one machine. A control plane (embedded SQLite) and a
//! fleet of simulated member clusters of varied regions, providers, sizes and background
//! load, all in this process; it waits until every cluster is Ready, then says how to reach
//! it. A second `orrery up` on the same data directory resumes where the first stopped.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use orrery_agent::ClusterFacts;
use orrery_sim::fleet::{Fleet, FleetConfig, Member};
use serde_json::{Value, json};

use crate::server::{ServerArgs, StoreKind, parse_duration};

#[derive(Debug, clap::Args)]
pub struct UpArgs {
    /// How many simulated member clusters to run.
    #[arg(long, default_value_t = 5)]
    pub clusters: usize,
    #[arg(long, default_value = "./orrery-data", env = "ORRERY_DATA_DIR")]
    pub data_dir: PathBuf,
    /// Where the control plane serves (with --ha, the three replicas serve on this port and
    /// the next two). Port 0 picks free ports.
    #[arg(long, default_value = "127.0.0.1:6443")]
    pub listen: SocketAddr,
    /// A highly available control plane: a local three-member etcd cluster (Debian's
    /// etcd-server must be installed) and three server replicas on it, one leading.
    #[arg(long)]
    pub ha: bool,
}

/// The control plane `orrery up` started.
enum Plane {
    One(crate::server::Running),
    Ha(crate::up_ha::HaPlane),
}

impl Plane {
    fn urls(&self) -> Vec<String> {
        match self {
            Plane::One(r) => vec![r.url.clone()],
            Plane::Ha(h) => h.urls.clone(),
        }
    }

    fn kubeconfig(&self) -> PathBuf {
        match self {
            Plane::One(r) => r.kubeconfig.clone(),
            Plane::Ha(h) => h.kubeconfig.clone(),
        }
    }

    async fn stop(self) {
        match self {
            Plane::One(r) => r.stop().await,
            Plane::Ha(h) => h.stop().await,
        }
    }
}

/// A member of the demo fleet: (name, provider, region, zone, city code, simulate spec,
/// capabilities).
type Preset = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static [&'static str],
);

const PRESETS: &[Preset] = &[
    (
        "aws-us-east",
        "aws",
        "us-east-1",
        "us-east-1a",
        "nyc",
        "nodes=8,cpu=32,memory=128Gi,load=0.35,profile=diurnal,period=10m,bandwidth=125Mi,cpuCoreHour=0.048,memoryGiBHour=0.0064,egressPerGiB=0.09,currency=USD",
        &["tls-encryption"],
    ),
    (
        "gcp-europe",
        "gcp",
        "europe-west1",
        "europe-west1-b",
        "bru",
        "nodes=6,cpu=16,memory=64Gi,load=0.2,profile=flat,bandwidth=250Mi,cpuCoreHour=0.0356,memoryGiBHour=0.0048,egressPerGiB=0.085,currency=USD",
        &["tls-encryption"],
    ),
    (
        "azure-asia",
        "azure",
        "southeastasia",
        "southeastasia-1",
        "sin",
        "nodes=10,cpu=32,memory=128Gi,load=0.55,profile=spikes,period=10m,bandwidth=125Mi,cpuCoreHour=0.052,memoryGiBHour=0.0069,egressPerGiB=0.12,currency=USD",
        &[],
    ),
    (
        "onprem-gpu",
        "on-prem",
        "us-west",
        "dc-1",
        "sjc",
        "nodes=4,cpu=64,memory=256Gi,gpu=8,load=0.4,profile=flat,bandwidth=1Gi,cpuCoreHour=0.021,memoryGiBHour=0.0028,gpuHour=1.2,egressPerGiB=0,currency=USD",
        &["gpu"],
    ),
    (
        "edge-berlin",
        "edge",
        "eu-central",
        "ber-1",
        "ber",
        "nodes=3,cpu=8,memory=32Gi,load=0.15,profile=diurnal,period=10m,bandwidth=12Mi,cpuCoreHour=0.062,memoryGiBHour=0.0083,egressPerGiB=0.05,currency=USD",
        &[],
    ),
    (
        "aws-us-west",
        "aws",
        "us-west-2",
        "us-west-2b",
        "sea",
        "nodes=12,cpu=16,memory=64Gi,load=0.6,profile=diurnal,period=10m,bandwidth=125Mi,cpuCoreHour=0.0162,memoryGiBHour=0.0022,capacityType=spot,interruptionRate=0.05,egressPerGiB=0.09,currency=USD",
        &["tls-encryption"],
    ),
    (
        "gcp-asia",
        "gcp",
        "asia-northeast1",
        "asia-northeast1-a",
        "tyo",
        "nodes=8,cpu=32,memory=128Gi,load=0.25,profile=flat,cpuCoreHour=0.042,memoryGiBHour=0.0056,gpuHour=2.48,egressPerGiB=0.12,currency=USD",
        &["gpu", "tls-encryption"],
    ),
    (
        "edge-saopaulo",
        "edge",
        "sa-east",
        "gru-1",
        "gru",
        "nodes=2,cpu=8,memory=16Gi,load=0.3,profile=spikes,period=10m,cpuCoreHour=0.071,memoryGiBHour=0.0095,egressPerGiB=0.05,currency=USD",
        &[],
    ),
];

/// The fleet of `orrery up`: the presets, then numbered copies of them.
pub fn members(n: usize) -> anyhow::Result<Vec<Member>> {
    (0..n)
        .map(|i| {
            let (name, provider, region, zone, city, sim, caps) = PRESETS[i % PRESETS.len()];
            let round = i / PRESETS.len();
            let name = if round == 0 {
                name.to_string()
            } else {
                format!("{name}-{}", round + 1)
            };
            let mut labels = std::collections::BTreeMap::new();
            labels.insert("topology.datum.net/city-code".to_string(), city.to_string());
            labels.insert("orrery.io/simulated".to_string(), "true".to_string());
            Ok(Member {
                name,
                info: ClusterFacts {
                    provider: provider.into(),
                    region: region.into(),
                    zones: vec![zone.into()],
                    capabilities: caps.iter().map(|c| c.to_string()).collect(),
                    labels,
                    api_endpoint: String::new(),
                },
                spec: sim.parse().map_err(|e: String| anyhow::anyhow!(e))?,
                token: None,
                latency: Default::default(),
            })
        })
        .collect()
}

pub async fn run(args: UpArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.clusters <= 5000,
        "--clusters: at most 5000 simulated clusters"
    );
    let stop = crate::server::signals().context("installing signal handlers")?;
    let server_args = server_args(&args)?;
    let started = Instant::now();
    let running = start_plane(&args, &server_args).await?;
    let urls = running.urls();
    let url = urls[0].clone();
    let admin = orrery_client::from_kubeconfig(&running.kubeconfig()).await?;
    let token = bootstrap_token(&admin).await?;
    let members = members(args.clusters)?;
    let n = members.len();
    let (shutdown_tx, shutdown) = tokio::sync::watch::channel(false);
    let admin_shutdown = shutdown.clone();
    let fleet = Fleet::start(
        members,
        &FleetConfig {
            // Each agent knows every replica and moves to another when its own fails.
            server: urls.join(","),
            token: Some(token),
            ca_pem: None,
            state_dir: Some(args.data_dir.join("agents")),
            heartbeat_interval: Duration::from_secs(5),
            report_interval: Duration::from_millis(500),
            ca_refresh: orrery_agent::AgentConfig::new("", "").ca_refresh,
            keep_members: true,
        },
        shutdown,
    );
    // The simulated clusters' fault injection, on loopback, for `orrery sim`.
    let admin_addr =
        orrery_sim::admin::serve("127.0.0.1:0".parse()?, fleet.sims.clone(), admin_shutdown)
            .await?;
    let admin_file = args.data_dir.join(crate::sim::ADMIN_FILE);
    std::fs::write(&admin_file, format!("{admin_addr}\n"))
        .with_context(|| format!("writing {}", admin_file.display()))?;
    wait_ready(&admin, n, started).await?;
    print_welcome(&args, &running, &url, &urls, n, started);
    stop.await;
    println!("stopping");
    let _ = std::fs::remove_file(&admin_file);
    let _ = shutdown_tx.send(true);
    for (name, e) in fleet.wait().await {
        eprintln!("agent of {name}: {e}");
    }
    running.stop().await;
    Ok(())
}

/// The server's settings for a local fleet: the defaults, scaled to the simulated day and
/// fleet where they say so.
fn server_args(args: &UpArgs) -> anyhow::Result<ServerArgs> {
    Ok(ServerArgs {
        config: None,
        print_config: false,
        data_dir: args.data_dir.clone(),
        listen: args.listen,
        store: StoreKind::Sqlite,
        etcd_endpoints: Vec::new(),
        etcd_prefix: "/orrery".into(),
        tls_san: Vec::new(),
        tls_cert_validity: orrery_apiserver::pki::DEFAULT_SERVING_VALIDITY,
        cluster_token_ttl: Duration::ZERO,
        advertise_url: None,
        kubeconfig_secret: None,
        kubeconfig_secret_server: None,
        service_account_dir: orrery_client::SERVICE_ACCOUNT_DIR.into(),
        encryption_provider_config: None,
        audit_log_path: None,
        audit_policy_file: None,
        audit_log_maxsize: orrery_apiserver::audit::DEFAULT_LOG_MAX_MIB,
        audit_log_maxbackup: orrery_apiserver::audit::DEFAULT_LOG_MAX_BACKUPS,
        max_requests_inflight: orrery_apiserver::app::DEFAULT_MAX_REQUESTS_INFLIGHT,
        max_mutating_requests_inflight:
            orrery_apiserver::app::DEFAULT_MAX_MUTATING_REQUESTS_INFLIGHT,
        max_watches_per_user: orrery_apiserver::app::DEFAULT_MAX_WATCHES_PER_USER,
        max_queued_requests_per_user: orrery_apiserver::fairness::DEFAULT_QUEUE_LENGTH,
        request_queue_timeout: orrery_apiserver::fairness::DEFAULT_QUEUE_TIMEOUT,
        request_body_timeout: orrery_apiserver::app::DEFAULT_REQUEST_BODY_TIMEOUT,
        request_header_timeout: orrery_apiserver::server::DEFAULT_HEADER_TIMEOUT,
        idle_connection_timeout: orrery_apiserver::server::DEFAULT_IDLE_TIMEOUT,
        // Every simulated member connects from loopback.
        max_connections_per_source: orrery_apiserver::server::DEFAULT_MAX_CONNECTIONS_PER_SOURCE
            + 4 * args.clusters,
        slow_request_threshold: orrery_apiserver::app::DEFAULT_SLOW_REQUEST_THRESHOLD,
        cluster_grace_period: parse_duration("40s").map_err(anyhow::Error::msg)?,
        cluster_eviction_timeout: parse_duration("30s").map_err(anyhow::Error::msg)?,
        eviction_rate: None,
        eviction_burst: 1,
        watch_bookmark_interval: Duration::from_secs(60),
        compaction_interval: Duration::from_secs(300),
        water_level_limit: orrery_scheduler::DEFAULT_WATER_LEVEL_LIMIT,
        shed_window: Duration::from_secs(60),
        shed_mark: orrery_scheduler::DEFAULT_SHED_MARK,
        // The simulated day is 10 minutes: consolidation rounds keep pace with it.
        consolidate_interval: Duration::from_secs(60),
        move_grace_period: Duration::from_secs(300),
        migration_cleanup_grace: Duration::from_secs(30),
        migration_switch_timeout: Duration::from_secs(60),
        score_weights: None,
        monitoring_interval: Duration::from_secs(15),
        // The simulated fleet's load cycles every 10 minutes: the forecasts look for that
        // season, a season ahead.
        forecast_season: Duration::from_secs(600),
        forecast_horizon: Duration::from_secs(600),
        forecast_history_mib: orrery_controllers::forecasting::DEFAULT_HISTORY_BYTES >> 20,
        forecast_history_from: None,
        forecast_history_query: Vec::new(),
        // Scaled like the season: two minutes of a ten-minute day, as 30 minutes is of a
        // day, a little more.
        prediction_horizon: 120,
        prediction_bound: orrery_api::prediction::Bound::Upper80,
        commit_delay: orrery_store_sqlite::DEFAULT_COMMIT_DELAY,
        clusterset_ip_range: orrery_api::services::DEFAULT_IP_RANGE
            .parse()
            .map_err(anyhow::Error::msg)?,
        dns_listen: None,
        hpa_sync_period: Duration::from_secs(15),
        quota_interval: Duration::from_secs(30),
        kueue_cluster: None,
        publish_cluster_profiles: Vec::new(),
        hpa_downscale_stabilization: Duration::from_secs(300),
        cluster_secret: None,
        cluster_secret_file: None,
        leader_elect: None,
        leader_elect_lease_duration: Duration::from_secs(15),
        leader_elect_renew_deadline: Duration::from_secs(10),
        leader_elect_retry_period: Duration::from_secs(2),
    })
}

/// The control plane: one server, or with `--ha` three replicas on a three-member etcd.
async fn start_plane(args: &UpArgs, server_args: &ServerArgs) -> anyhow::Result<Plane> {
    let running = if args.ha {
        crate::server::private_dir(&args.data_dir)?;
        let plane = crate::up_ha::start(&args.data_dir, args.listen).await?;
        println!(
            "control plane: 3 replicas at {} on etcd {}",
            plane.urls.join(", "),
            plane.etcd_endpoints.join(",")
        );
        Plane::Ha(plane)
    } else {
        let r = crate::server::start(server_args).await?;
        println!("control plane serving at {}", r.url);
        Plane::One(r)
    };
    Ok(running)
}

/// One bootstrap token for the whole local fleet.
async fn bootstrap_token(admin: &kube::Client) -> anyhow::Result<String> {
    let body = serde_json::to_vec(&json!({ "cluster": "*", "ttl": "1h" }))?;
    let req = http::Request::post("/agent/v1/tokens")
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body)?;
    let token: Value = serde_json::from_str(&admin.request_text(req).await?)?;
    let token = token["token"]
        .as_str()
        .context("no bootstrap token")?
        .to_string();
    Ok(token)
}

/// Waits for all `n` simulated clusters to be Ready (printing the count as it changes), at
/// most 5 minutes from `started`.
async fn wait_ready(admin: &kube::Client, n: usize, started: Instant) -> anyhow::Result<()> {
    let mut last = usize::MAX;
    loop {
        let ready = orrery_client::ready_clusters(admin).await.unwrap_or(0);
        if ready != last {
            println!("  {ready}/{n} simulated clusters Ready");
            last = ready;
        }
        if ready >= n {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(300),
            "the clusters did not all become Ready in 5 minutes"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}

/// What is up and how to use it: the kubeconfig, the dashboard's login link, commands to try.
fn print_welcome(
    args: &UpArgs,
    running: &Plane,
    url: &str,
    urls: &[String],
    n: usize,
    started: Instant,
) {
    // Absolute, so that the export line works from any directory.
    let kc_path =
        std::fs::canonicalize(running.kubeconfig()).unwrap_or_else(|_| running.kubeconfig());
    let kc = kc_path.display();
    println!(
        "orrery is up: {} and {n} simulated clusters, ready in {:.1} s",
        if args.ha {
            "three control-plane replicas on a three-member etcd"
        } else {
            "a control plane"
        },
        started.elapsed().as_secs_f64()
    );
    println!();
    println!("  kubeconfig: {kc}");
    println!("  export KUBECONFIG={kc}");
    // The login link carries the admin token in the fragment, which browsers never send.
    let token = std::fs::read_to_string(&kc_path)
        .ok()
        .and_then(|k| {
            k.lines().find_map(|l| {
                l.trim()
                    .strip_prefix("token:")
                    .map(|t| t.trim().to_string())
            })
        })
        .unwrap_or_default();
    println!("  dashboard: {url}/ui");
    println!("  sign in:   {url}/ui#token={token}");
    if args.ha {
        println!("  replicas:  {}", urls.join(" "));
        println!("  kubectl get lease -n orrery-system     # which replica leads");
    }
    println!();
    println!("  kubectl get clusters");
    println!("  kubectl apply -f examples/web.yaml        # a web app placed by water level");
    println!("  kubectl describe resourcebinding web-deployment");
    println!("  orrery sim fault aws-us-east outage       # a cluster goes dark (recover: undo)");
    println!();
    println!("Ctrl-C stops everything; `orrery up` on the same data directory resumes.");
}
