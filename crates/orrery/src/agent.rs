//! `orrery agent`: a member's agent (pull mode), for a real cluster (`--kubeconfig`, or as a
//! Pod in it: the in-cluster configuration), one simulated cluster (`--simulate SPEC`), or a
//! simulated fleet (`--simulate-fleet FILE`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use orrery_agent::backend::Backend;
use orrery_agent::backend::kube::KubeMember;
use orrery_agent::state::StateFile;
use orrery_agent::{AgentConfig, ClusterFacts, Stopped};
use orrery_sim::fleet::{Fleet, FleetConfig, FleetFile};
use orrery_sim::{SimCluster, SimSpec};

use crate::server::parse_duration;

/// The kind of member an agent with --kubeconfig drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MemberBackend {
    Kube,
    Orrery,
}

#[derive(Debug, clap::Args)]
pub struct AgentArgs {
    /// A YAML file of flags (`server: https://...`; every flag by its name); flags and
    /// ORRERY_<FLAG> variables override it (also ORRERY_CONFIG).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Print the effective configuration (secrets redacted) and exit.
    #[arg(long)]
    pub print_config: bool,
    /// The server's URL, e.g. https://orrery.example:6443; several replicas' URLs separated by
    /// commas (or the flag repeated): the agent moves to the next when the one it uses fails,
    /// with backoff and jitter, without applying anything again.
    #[arg(long, value_delimiter = ',', required = true)]
    pub server: Vec<String>,
    /// A bootstrap token from `orrery token create` (needed to register; a restarted agent
    /// uses the token it stored).
    #[arg(long, env = "ORRERY_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The member cluster's name (not with --simulate-fleet).
    #[arg(long)]
    pub cluster: Option<String>,
    /// A real member: the kubeconfig of its API. Without it (nor --simulate), the agent runs
    /// in its member as a Pod: the API at KUBERNETES_SERVICE_HOST:KUBERNETES_SERVICE_PORT,
    /// the ServiceAccount's token and CA under --service-account-dir.
    #[arg(long, conflicts_with_all = ["simulate", "simulate_fleet"])]
    pub kubeconfig: Option<PathBuf>,
    /// Where the in-cluster configuration's token, ca.crt and namespace are (the token is
    /// read again as the kubelet rotates it).
    #[arg(long, default_value = orrery_client::SERVICE_ACCOUNT_DIR)]
    pub service_account_dir: PathBuf,
    /// What the member behind --kubeconfig is: a Kubernetes cluster (kube), or an Orrery
    /// control plane of its own (orrery: it takes what it is sent as templates and divides
    /// them among its members, and reports its fleet summed).
    #[arg(long, value_enum, default_value_t = MemberBackend::Kube, conflicts_with_all = ["simulate", "simulate_fleet"])]
    pub backend: MemberBackend,
    /// A simulated member: nodes=8,cpu=32,memory=128Gi,gpu=0,pods=110,load=0.3,profile=flat.
    #[arg(long, conflicts_with = "simulate_fleet")]
    pub simulate: Option<String>,
    /// Many simulated members described in a YAML file.
    #[arg(long)]
    pub simulate_fleet: Option<PathBuf>,
    #[command(flatten)]
    pub facts: ClusterFlags,
    /// The server's CA bundle, when the token carries no CA hash.
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
    /// Where the agent keeps its token and the Works it applied
    /// (default ./orrery-agent-state/<cluster>).
    #[arg(long, conflicts_with = "state_secret")]
    pub state_dir: Option<PathBuf>,
    /// Keep the state in this Secret of the member (NAMESPACE/NAME) instead of a directory:
    /// a Deployment of the agent then needs no volume.
    #[arg(long, conflicts_with_all = ["simulate", "simulate_fleet"])]
    pub state_secret: Option<String>,
    /// Serve /livez, /readyz and /metrics here (default 0.0.0.0:10358 in a Pod, 127.0.0.1:10358
    /// elsewhere; `off` for none).
    #[arg(long)]
    pub health_listen: Option<String>,
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub heartbeat_interval: Duration,
    /// Least time between two status reports.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub report_interval: Duration,
    /// How often the agent reads the server's CA bundle again, so that it follows a CA
    /// rotation (`orrery ca stage`, then `orrery ca switch`) without registering again.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub ca_refresh_interval: Duration,
    /// Serve the fault-injection endpoint of simulated clusters here (loopback only).
    #[arg(long)]
    pub admin_listen: Option<SocketAddr>,
    /// Answer clusterset DNS here (`<svc>.<ns>.svc.clusterset.local`, UDP and TCP) for the
    /// multi-cluster services the member imports, e.g. 127.0.0.1:5353 (not with
    /// --simulate-fleet).
    #[arg(long, conflicts_with = "simulate_fleet")]
    pub dns_listen: Option<SocketAddr>,
}

/// What a member says about itself: `orrery agent` and `orrery join` take the same flags.
#[derive(Debug, Clone, clap::Args)]
pub struct ClusterFlags {
    #[arg(long, default_value = "")]
    pub region: String,
    /// Zones the member spans (repeatable, or comma-separated).
    #[arg(long = "zone", value_delimiter = ',')]
    pub zones: Vec<String>,
    #[arg(long, default_value = "")]
    pub provider: String,
    /// Labels of the Cluster: k=v,k2=v2.
    #[arg(long, value_delimiter = ',')]
    pub labels: Vec<String>,
    /// What the member offers workloads: gpu,tls-encryption.
    #[arg(long, value_delimiter = ',')]
    pub capabilities: Vec<String>,
}

impl ClusterFlags {
    pub fn info(&self) -> anyhow::Result<ClusterFacts> {
        let labels: BTreeMap<String, String> = self
            .labels
            .iter()
            .filter(|p| !p.is_empty())
            .map(|p| {
                p.split_once('=')
                    .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                    .with_context(|| format!("label {p:?} is not key=value"))
            })
            .collect::<anyhow::Result<_>>()?;
        let nonempty = |v: &[String]| v.iter().filter(|x| !x.is_empty()).cloned().collect();
        Ok(ClusterFacts {
            provider: self.provider.clone(),
            region: self.region.clone(),
            zones: nonempty(&self.zones),
            capabilities: nonempty(&self.capabilities),
            labels,
            api_endpoint: String::new(),
        })
    }
}

pub async fn run(args: AgentArgs) -> anyhow::Result<()> {
    let ca_pem = match &args.ca_file {
        Some(f) => {
            Some(std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?)
        }
        None => None,
    };
    let (shutdown_tx, shutdown) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        crate::server::terminated().await;
        let _ = shutdown_tx.send(true);
    });

    if let Some(file) = &args.simulate_fleet {
        return run_fleet(&args, file, ca_pem, shutdown).await;
    }

    let Some(cluster) = args.cluster.clone() else {
        bail!("--cluster is required (or --simulate-fleet)");
    };
    let mut sims = Vec::new();
    let in_pod = args.kubeconfig.is_none()
        && args.simulate.is_none()
        && std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
    // A real member's API: from the kubeconfig, or the Pod's own.
    let member_client = match (&args.kubeconfig, &args.simulate) {
        (Some(path), None) => Some(orrery_client::from_kubeconfig(path).await?),
        (None, None) if in_pod => Some(kube::Client::try_from(orrery_client::in_cluster(
            &args.service_account_dir,
        )?)?),
        _ => None,
    };
    let backend = member_backend(&args, &cluster, member_client.clone(), &mut sims, &shutdown)?;
    if let Some(addr) = args.admin_listen {
        if sims.is_empty() {
            bail!("--admin-listen serves simulated clusters only");
        }
        let bound = orrery_sim::admin::serve(addr, sims, shutdown.clone()).await?;
        println!("admin endpoint at http://{bound}");
    }
    let mut cfg = AgentConfig::new(&args.server.join(","), &cluster);
    cfg.bootstrap_token = args.token.clone();
    cfg.ca_pem = ca_pem;
    cfg.info = args.facts.info()?;
    cfg.state = state_file(&args, &cluster, member_client)?;
    let health = Arc::new(orrery_agent::health::Health::new());
    cfg.health = Some(health.clone());
    serve_health(
        args.health_listen.as_deref(),
        in_pod,
        health,
        shutdown.clone(),
    )
    .await?;
    cfg.heartbeat_interval = args.heartbeat_interval;
    cfg.report_interval = args.report_interval;
    cfg.ca_refresh = args.ca_refresh_interval;
    if let Some(addr) = args.dns_listen {
        let (tx, rx) = tokio::sync::watch::channel(Vec::new());
        cfg.services = Some(tx);
        let bound = crate::dns::serve_imports(addr, rx, shutdown.clone())
            .await
            .with_context(|| format!("serving clusterset DNS on {addr}"))?;
        println!("clusterset DNS at {bound} (udp and tcp)");
    }
    println!(
        "orrery agent for cluster {cluster} connecting to {} (state in {})",
        args.server.join(","),
        cfg.state.describe()
    );
    match orrery_agent::run(cfg, backend, shutdown).await? {
        Stopped::Shutdown => Ok(()),
        Stopped::Unregistered => {
            println!("cluster {cluster} was unregistered; the agent removed what it ran and stops");
            Ok(())
        }
    }
}

/// `--simulate-fleet`: the fleet file's simulated clusters, each with its agent, until they
/// all stop.
async fn run_fleet(
    args: &AgentArgs,
    file: &std::path::Path,
    ca_pem: Option<String>,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    if args.cluster.is_some() {
        bail!("--cluster names one cluster; a fleet file names its own");
    }
    let members = FleetFile::load(file)?;
    let n = members.len();
    let cfg = FleetConfig {
        server: args.server.join(","),
        token: args.token.clone(),
        ca_pem,
        state_dir: Some(
            args.state_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from("./orrery-agent-state")),
        ),
        heartbeat_interval: args.heartbeat_interval,
        report_interval: args.report_interval,
        ca_refresh: args.ca_refresh_interval,
        // Here the simulated members live and die with the agent process (a restart of
        // it is a member that lost everything); `orrery up` keeps them.
        keep_members: false,
    };
    let fleet = Fleet::start(members, &cfg, shutdown.clone());
    if let Some(addr) = args.admin_listen {
        let bound = orrery_sim::admin::serve(addr, fleet.sims.clone(), shutdown.clone()).await?;
        println!("admin endpoint at http://{bound}");
    }
    println!(
        "orrery agent running {n} simulated clusters against {}",
        args.server.join(",")
    );
    let failed = fleet.wait().await;
    for (name, e) in &failed {
        eprintln!("agent of {name}: {e}");
    }
    if !failed.is_empty() {
        bail!(
            "{} of {n} simulated clusters stopped with an error",
            failed.len()
        );
    }
    Ok(())
}

/// The member the agent works on: a real cluster's API (`--kubeconfig` or the Pod's own),
/// or a simulated one (`--simulate`, also added to `sims`, its clock running).
fn member_backend(
    args: &AgentArgs,
    cluster: &str,
    member_client: Option<kube::Client>,
    sims: &mut Vec<Arc<SimCluster>>,
    shutdown: &tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<Arc<dyn Backend>> {
    let backend: Arc<dyn Backend> = match (member_client, &args.simulate) {
        (Some(client), None) => match args.backend {
            MemberBackend::Kube => Arc::new(KubeMember::new(client)),
            MemberBackend::Orrery => {
                Arc::new(orrery_agent::backend::orrery::OrreryMember::new(client))
            }
        },
        (None, Some(spec)) => {
            let spec: SimSpec = spec
                .parse()
                .map_err(|e: String| anyhow::anyhow!("--simulate: {e}"))?;
            let sim = Arc::new(SimCluster::new(cluster, &args.facts.region, spec));
            sims.push(sim.clone());
            orrery_sim::spawn_clock(vec![sim.clone()], shutdown.clone());
            sim
        }
        _ => bail!(
            "choose the member: --kubeconfig PATH (a real cluster), --simulate SPEC (a simulated one), or run the agent as a Pod in its member (KUBERNETES_SERVICE_HOST is not set)"
        ),
    };
    Ok(backend)
}

/// Where the agent keeps its state: a Secret in the member (`--state-secret`), or a
/// directory (`--state-dir`, by default one per cluster).
fn state_file(
    args: &AgentArgs,
    cluster: &str,
    member_client: Option<kube::Client>,
) -> anyhow::Result<StateFile> {
    let state = match (&args.state_secret, member_client) {
        (Some(at), Some(client)) => {
            let Some((ns, name)) = at
                .split_once('/')
                .filter(|(n, m)| !n.is_empty() && !m.is_empty())
            else {
                bail!("--state-secret {at:?}: NAMESPACE/NAME");
            };
            StateFile::secret(client, ns, name)
        }
        (Some(_), None) => bail!("--state-secret needs a member API (not with --simulate)"),
        (None, _) => StateFile::at(
            &args
                .state_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from("./orrery-agent-state").join(cluster)),
        ),
    };
    Ok(state)
}

/// The port of the agent's probes when --health-listen names none.
const HEALTH_PORT: u16 = 10358;

/// Serves the probes where --health-listen says. The default address is taken only if free
/// outside a Pod (several agents on one machine, as in tests and demos, would otherwise fail
/// at the second); an address given, or the default in a Pod, must be bound.
async fn serve_health(
    listen: Option<&str>,
    in_pod: bool,
    health: Arc<orrery_agent::health::Health>,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let (addr, explicit) = match listen {
        Some("off") => return Ok(()),
        Some(a) => (
            a.parse::<SocketAddr>()
                .with_context(|| format!("--health-listen {a:?}: an address:port, or off"))?,
            true,
        ),
        None if in_pod => (SocketAddr::from(([0, 0, 0, 0], HEALTH_PORT)), false),
        None => (SocketAddr::from(([127, 0, 0, 1], HEALTH_PORT)), false),
    };
    match orrery_agent::health::bind(addr).await {
        Ok((listener, bound)) => {
            orrery_agent::health::serve(listener, health, shutdown);
            println!("probes at http://{bound} (/livez, /readyz, /metrics)");
            Ok(())
        }
        Err(e) if !explicit && !in_pod => {
            tracing::warn!(%addr, error = %e, "not serving the probes: the default address is taken (--health-listen to choose one)");
            Ok(())
        }
        Err(e) => Err(anyhow::anyhow!("serving the probes on {addr}: {e}")),
    }
}
