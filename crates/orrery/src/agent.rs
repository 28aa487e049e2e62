//! `orrery agent`: a member's agent (pull mode), for a real cluster (`--kubeconfig`), one
//! simulated cluster (`--simulate SPEC`), or a simulated fleet (`--simulate-fleet FILE`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use orrery_agent::backend::Backend;
use orrery_agent::backend::kube::KubeMember;
use orrery_agent::backend::sim::{SimCluster, SimSpec};
use orrery_agent::fleet::{Fleet, FleetConfig, FleetFile};
use orrery_agent::state::StateFile;
use orrery_agent::{AgentConfig, ClusterFacts, Stopped};

use crate::server::parse_duration;

/// The kind of member an agent with --kubeconfig drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MemberBackend {
    Kube,
    Orrery,
}

#[derive(Debug, clap::Args)]
pub struct AgentArgs {
    /// The server's URL, e.g. https://orrery.example:6443; several replicas' URLs separated by
    /// commas (or the flag repeated): the agent moves to the next when the one it uses fails,
    /// with backoff and jitter, without applying anything again.
    #[arg(long, value_delimiter = ',', required = true)]
    pub server: Vec<String>,
    /// A bootstrap token from `orrery token create` (needed to register; a restarted agent
    /// uses the token it stored).
    #[arg(long, env = "ORRERY_TOKEN")]
    pub token: Option<String>,
    /// The member cluster's name (not with --simulate-fleet).
    #[arg(long)]
    pub cluster: Option<String>,
    /// A real member: the kubeconfig of its API.
    #[arg(long, conflicts_with_all = ["simulate", "simulate_fleet"])]
    pub kubeconfig: Option<PathBuf>,
    /// What the member behind --kubeconfig is: a Kubernetes cluster (kube), or an Orrery
    /// control plane of its own (orrery: it takes what it is sent as templates and divides
    /// them among its members, and reports its fleet summed).
    #[arg(long, value_enum, default_value_t = MemberBackend::Kube, requires = "kubeconfig")]
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
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub heartbeat_interval: Duration,
    /// Least time between two status reports.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub report_interval: Duration,
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
            // Here the simulated members live and die with the agent process (a restart of
            // it is a member that lost everything); `orrery up` keeps them.
            keep_members: false,
        };
        let fleet = Fleet::start(members, &cfg, shutdown.clone());
        if let Some(addr) = args.admin_listen {
            let bound =
                orrery_agent::admin::serve(addr, fleet.sims.clone(), shutdown.clone()).await?;
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
        return Ok(());
    }

    let Some(cluster) = args.cluster.clone() else {
        bail!("--cluster is required (or --simulate-fleet)");
    };
    let mut sims = Vec::new();
    let backend: Arc<dyn Backend> = match (&args.kubeconfig, &args.simulate) {
        (Some(path), None) => {
            let client = orrery_client::from_kubeconfig(path).await?;
            match args.backend {
                MemberBackend::Kube => Arc::new(KubeMember::new(client)),
                MemberBackend::Orrery => {
                    Arc::new(orrery_agent::backend::orrery::OrreryMember::new(client))
                }
            }
        }
        (None, Some(spec)) => {
            let spec: SimSpec = spec
                .parse()
                .map_err(|e: String| anyhow::anyhow!("--simulate: {e}"))?;
            let sim = Arc::new(SimCluster::new(&cluster, &args.facts.region, spec));
            sims.push(sim.clone());
            orrery_agent::backend::sim::spawn_clock(vec![sim.clone()], shutdown.clone());
            sim
        }
        _ => bail!(
            "choose the member: --kubeconfig PATH (a real cluster) or --simulate SPEC (a simulated one)"
        ),
    };
    if let Some(addr) = args.admin_listen {
        if sims.is_empty() {
            bail!("--admin-listen serves simulated clusters only");
        }
        let bound = orrery_agent::admin::serve(addr, sims, shutdown.clone()).await?;
        println!("admin endpoint at http://{bound}");
    }
    let mut cfg = AgentConfig::new(&args.server.join(","), &cluster);
    cfg.bootstrap_token = args.token.clone();
    cfg.ca_pem = ca_pem;
    cfg.info = args.facts.info()?;
    let dir = args
        .state_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("./orrery-agent-state").join(&cluster));
    cfg.state = StateFile::at(&dir);
    cfg.heartbeat_interval = args.heartbeat_interval;
    cfg.report_interval = args.report_interval;
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
        dir.display()
    );
    match orrery_agent::run(cfg, backend, shutdown).await? {
        Stopped::Shutdown => Ok(()),
        Stopped::Unregistered => {
            println!("cluster {cluster} was unregistered; the agent removed what it ran and stops");
            Ok(())
        }
    }
}
