//! `orrery server`: wires the store, the API server, its lifecycle controllers and TLS together.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use orrery_apiserver::auth::{Authenticator, Identity};
use orrery_apiserver::{ApiConfig, App, pki};
use orrery_store::Store;

/// Which store to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum StoreKind {
    Sqlite,
    Etcd,
}

#[derive(Clone, Debug, clap::Args)]
pub struct ServerArgs {
    /// A YAML file of flags (`listen: 0.0.0.0:6443`; every flag by its name); flags and
    /// ORRERY_<FLAG> variables override it (also ORRERY_CONFIG).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Print the effective configuration (flags, environment, file, defaults; secrets
    /// redacted) and exit.
    #[arg(long)]
    pub print_config: bool,
    /// Where the store, certificates and the admin kubeconfig live.
    #[arg(long, default_value = "./orrery-data", env = "ORRERY_DATA_DIR")]
    pub data_dir: PathBuf,
    /// Address to serve HTTPS on.
    #[arg(long, default_value = "127.0.0.1:6443")]
    pub listen: SocketAddr,
    /// Storage backend.
    #[arg(long, value_enum, default_value = "sqlite")]
    pub store: StoreKind,
    /// etcd endpoints (comma-separated URLs), with --store etcd.
    #[arg(long, value_delimiter = ',', default_value = "http://127.0.0.1:2379")]
    pub etcd_endpoints: Vec<String>,
    /// Key prefix in etcd, so installations can share one etcd.
    #[arg(long, default_value = "/orrery")]
    pub etcd_prefix: String,
    /// Extra names or addresses for the serving certificate (repeatable).
    #[arg(long = "tls-san")]
    pub tls_san: Vec<String>,
    /// How long a serving certificate is valid. It is issued again, without a restart, once a
    /// third of that (at most 30 days) is left; connections already made keep theirs.
    #[arg(long, default_value = "365d", value_parser = parse_duration)]
    pub tls_cert_validity: std::time::Duration,
    /// How long an agent's cluster token is good for (0: until the cluster is unregistered).
    /// Agents renew theirs a third of it ahead; an agent away for longer joins again with a
    /// bootstrap token.
    #[arg(long, default_value = "0", value_parser = parse_duration)]
    pub cluster_token_ttl: std::time::Duration,
    /// Export the admin kubeconfig as this Secret (NAMESPACE/NAME, key `kubeconfig`) of the
    /// cluster the server runs in, through its in-cluster configuration (a Pod's
    /// ServiceAccount, see --service-account-dir); written again when the CA bundle changes.
    #[arg(long)]
    pub kubeconfig_secret: Option<String>,
    /// The server URL the exported kubeconfig names (default --advertise-url, else the
    /// address the server listens on).
    #[arg(long, requires = "kubeconfig_secret")]
    pub kubeconfig_secret_server: Option<String>,
    /// Where the in-cluster configuration's token, ca.crt and namespace are (for
    /// --kubeconfig-secret).
    #[arg(long, default_value = orrery_client::SERVICE_ACCOUNT_DIR)]
    pub service_account_dir: PathBuf,
    /// The URL other replicas reach this one at (HA, with --cluster-secret): the cluster
    /// proxy forwards a request for a member whose agent is connected here to it. Default:
    /// https://<--listen> when that names an address. Its host joins the certificate's names.
    #[arg(long)]
    pub advertise_url: Option<String>,
    /// An EncryptionConfiguration (apiserver.config.k8s.io/v1): which resources are
    /// encrypted in the store, and with which keys (docs/security.md).
    #[arg(long)]
    pub encryption_provider_config: Option<PathBuf>,
    /// Where the audit log goes (audit.k8s.io/v1 Events, one JSON line each); needs
    /// --audit-policy-file.
    #[arg(long)]
    pub audit_log_path: Option<PathBuf>,
    /// An audit Policy (audit.k8s.io/v1): which requests are logged, at which level.
    #[arg(long)]
    pub audit_policy_file: Option<PathBuf>,
    /// The audit log is rotated once it would pass this many MiB (0: never).
    #[arg(long, default_value_t = orrery_apiserver::audit::DEFAULT_LOG_MAX_MIB)]
    pub audit_log_maxsize: u64,
    /// Rotated audit logs kept (0: all).
    #[arg(long, default_value_t = orrery_apiserver::audit::DEFAULT_LOG_MAX_BACKUPS)]
    pub audit_log_maxbackup: usize,
    /// Read-only requests served at once, shared among priority levels (agents 50 %, leader
    /// election 10 %, users 40 %; docs/security.md); more wait in their user's queue, then are
    /// told to come back (429, Retry-After). Watches and system:masters are not counted (0:
    /// no limit).
    #[arg(long, default_value_t = orrery_apiserver::app::DEFAULT_MAX_REQUESTS_INFLIGHT)]
    pub max_requests_inflight: usize,
    /// Mutating requests served at once, likewise.
    #[arg(long, default_value_t = orrery_apiserver::app::DEFAULT_MAX_MUTATING_REQUESTS_INFLIGHT)]
    pub max_mutating_requests_inflight: usize,
    /// Requests of one user that may wait for a seat at once; more are told to come back.
    #[arg(long, default_value_t = orrery_apiserver::fairness::DEFAULT_QUEUE_LENGTH)]
    pub max_queued_requests_per_user: usize,
    /// How long a request may wait for a seat before it is told to come back.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub request_queue_timeout: Duration,
    /// A request's body must arrive within this after its headers, or it is answered 408 and
    /// its connection closed.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub request_body_timeout: Duration,
    /// A connection's TLS handshake, and each request's headers, must arrive within this.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub request_header_timeout: Duration,
    /// A connection with no request in progress (watches count as in progress) is closed
    /// after this.
    #[arg(long, default_value = "90s", value_parser = parse_duration)]
    pub idle_connection_timeout: Duration,
    /// Connections one source address may hold open; more are closed at once (0: no limit).
    #[arg(long, default_value_t = orrery_apiserver::server::DEFAULT_MAX_CONNECTIONS_PER_SOURCE)]
    pub max_connections_per_source: usize,
    /// Watches one user may hold open at once; more are told to come back (429). The admin
    /// is not counted (0: no limit).
    #[arg(long, default_value_t = orrery_apiserver::app::DEFAULT_MAX_WATCHES_PER_USER)]
    pub max_watches_per_user: usize,
    /// A request that takes longer than this is logged ("slow request") with the time each of
    /// its steps took (authentication, the body, the store's read and write, ...), as
    /// kube-apiserver's traces; 0 logs none.
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    pub slow_request_threshold: Duration,
    /// How long a member cluster that stops reporting stays Ready.
    #[arg(long, default_value = "40s", value_parser = parse_duration)]
    pub cluster_grace_period: Duration,
    /// How long a cluster is not Ready before it is tainted NoExecute (its workloads may then
    /// be moved).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub cluster_eviction_timeout: Duration,
    /// The fleet's pace of evictions, in clusters per minute: a wide outage moves the
    /// workloads of this many clusters a minute (after a burst of --eviction-burst), the
    /// longest not Ready first; unset, every cluster due at once.
    #[arg(long, value_parser = parse_rate)]
    pub eviction_rate: Option<f64>,
    /// Clusters evicted at once before --eviction-rate paces the rest.
    #[arg(long, default_value_t = 1, requires = "eviction_rate")]
    pub eviction_burst: u32,
    /// How often watches that ask for bookmarks get one.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub watch_bookmark_interval: Duration,
    /// No cluster is filled beyond this Resource Water Level (0-1), unless a policy sets its
    /// own `waterLevelLimit`.
    #[arg(long, default_value_t = orrery_scheduler::DEFAULT_WATER_LEVEL_LIMIT, value_parser = parse_level)]
    pub water_level_limit: f64,
    /// How long a cluster stays above the shed mark before it sheds replicas.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub shed_window: Duration,
    /// Water level (0-1, at least the limit) a cluster must stay above for the shed window
    /// before replicas move off it; between the limit and this mark nothing moves.
    #[arg(long, default_value_t = orrery_scheduler::DEFAULT_SHED_MARK, value_parser = parse_level)]
    pub shed_mark: f64,
    /// How often workloads whose placement consolidates (`cost.consolidate`) are decided
    /// again to move replicas to clusters where they cost at least a tenth less (up to 1,000
    /// workloads a round, in turn).
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub consolidate_interval: Duration,
    /// Weights of the score plugins, e.g. `balance=3,locality=0.5`: comma-separated
    /// PLUGIN=WEIGHT for headroom, balance, locality, priority, network, proximity and
    /// completion; those not named keep their default (headroom 1, balance 2, locality 1,
    /// priority 1, network 1, proximity 4: closeness to what a workload follows, completion
    /// 6: when a workload reading data sets would finish). Monitoring raises the network
    /// weight when traffic surges.
    #[arg(long)]
    pub score_weights: Option<orrery_scheduler::Weights>,
    /// How long the old copy of replicas moved off a cluster stays while the new ones start.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub move_grace_period: Duration,
    /// How long the fenced copy of a migrated stateful workload (and its volumes) stays in
    /// the cluster it left once the target serves.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub migration_cleanup_grace: Duration,
    /// How long a migration waits, once the target serves, for what follows it (followers,
    /// Services selecting its pods) to be there too before it cleans up anyway, with a
    /// warning naming what did not follow.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub migration_switch_timeout: Duration,
    /// How often the monitoring system samples the fleet's figures (kept 6 h raw, 17 days as
    /// 5-minute averages).
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub monitoring_interval: Duration,
    /// The season of the fleet's load that forecasts look for (a day; shorter for tests and
    /// demonstrations).
    #[arg(long, default_value = "24h", value_parser = parse_duration)]
    pub forecast_season: Duration,
    /// How far ahead the monitoring system forecasts each cluster's water levels and traffic.
    #[arg(long, default_value = "6h", value_parser = parse_duration)]
    pub forecast_horizon: Duration,
    /// MiB the forecaster's history of every series may take in the leader: each series
    /// keeps 17 seasons while the fleet's fit (about 2,000 members at the default), fewer
    /// beyond, never under three.
    #[arg(long, default_value_t = orrery_controllers::forecasting::DEFAULT_HISTORY_BYTES >> 20)]
    pub forecast_history_mib: usize,
    /// Where each cluster's past usage is read from when a term of leadership starts and
    /// when a cluster joins, so its forecasts start from weeks of history:
    /// `prometheus=http://host:port[/path]` (range queries over the 17 days kept).
    #[arg(long, value_name = "prometheus=URL")]
    pub forecast_history_from: Option<crate::history_from::HistoryFrom>,
    /// The PromQL read for one series instead of the default, as SERIES=QUERY (series: cpu,
    /// memory, gpu, pods as levels 0-1, traffic in bytes per second; `{cluster}` stands for
    /// the cluster's name). Repeatable.
    #[arg(long, value_name = "SERIES=PROMQL", value_parser = crate::history_from::parse_query, requires = "forecast_history_from")]
    pub forecast_history_query: Vec<(String, String)>,
    /// How far ahead the scheduler judges clusters by their forecast water level when a
    /// placement's `prediction` does not say (30m; 0s judges them by their present level),
    /// and how far ahead proactive rebalancing looks for a crossing of the shed mark.
    #[arg(long, default_value = "30m", value_parser = parse_prediction_horizon)]
    pub prediction_horizon: i64,
    /// Which forecast the scheduler judges clusters by when a placement does not say: Mean,
    /// Upper80 (the upper end of the 80 % interval) or Upper95.
    #[arg(long, default_value = "Upper80", value_parser = parse_bound)]
    pub prediction_bound: orrery_api::prediction::Bound,
    /// How often each FederatedHPA is looked at (Karmada's default: 15s).
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub hpa_sync_period: Duration,
    /// How long a FederatedHPA looks back before scaling down, unless its behavior says
    /// (the highest recommendation of the window wins).
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub hpa_downscale_stabilization: Duration,
    /// Where ClusterSet IPs of multi-cluster services (ServiceImports of type ClusterSetIP)
    /// come from.
    #[arg(long, default_value = orrery_api::services::DEFAULT_IP_RANGE)]
    pub clusterset_ip_range: orrery_api::services::IpRange,
    /// The least time between two changes of a member's capacity that Kueue quotas follow
    /// (ClusterResourceClaims); changes under 5 % of a member's nominal resources are not
    /// followed at all.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub quota_interval: Duration,
    /// The member cluster where Kueue runs, when not the control plane: the ResourceFlavors,
    /// ClusterQueues and LocalQueues defined here (with the quotas ClusterResourceClaims
    /// assign) are propagated to it, and the usage its Kueue admits comes back.
    #[arg(long)]
    pub kueue_cluster: Option<String>,
    /// A member's namespace where a copy of every ClusterProfile is kept too, as
    /// CLUSTER/NAMESPACE (repeatable), for consumers that read them from the cluster they
    /// run in: Kueue's MultiKueue, in its own namespace (`manager/kueue-system`).
    #[arg(long = "publish-cluster-profiles", value_name = "CLUSTER/NAMESPACE")]
    pub publish_cluster_profiles: Vec<orrery_controllers::inventory::Publication>,
    /// Where the server answers clusterset DNS for the whole fleet (`<svc>.<ns>.svc.
    /// clusterset.local`, UDP and TCP), e.g. 127.0.0.1:5353; off by default.
    #[arg(long)]
    pub dns_listen: Option<SocketAddr>,
    /// How long the SQLite store may wait for more writes to commit with one, while writes
    /// arrive in a steady stream of separate requests (one fsync for several; 0 commits each
    /// at once).
    #[arg(long, default_value = "2ms", value_parser = parse_duration)]
    pub commit_delay: Duration,
    /// How much history the store keeps before compacting (watch resumption window).
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub compaction_interval: Duration,
    /// The installation's secret, the same for every server replica on one etcd: the first
    /// replica keeps the CA and the admin token in the store sealed with a key derived from
    /// it, the others load them (one kubeconfig, every agent's token, against any replica).
    #[arg(
        long,
        env = "ORRERY_CLUSTER_SECRET",
        hide_env_values = true,
        conflicts_with = "cluster_secret_file"
    )]
    pub cluster_secret: Option<String>,
    /// A file holding the installation's secret (see --cluster-secret).
    #[arg(long)]
    pub cluster_secret_file: Option<PathBuf>,
    /// Whether this server runs the controllers only while it holds the leader Lease
    /// (orrery-system/orrery-controllers); on by default with --store etcd, where several
    /// servers may share the store.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub leader_elect: Option<bool>,
    /// How long a leader's Lease is honoured by the others without a renewal.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub leader_elect_lease_duration: Duration,
    /// How long a leader keeps leading while its renewals fail.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub leader_elect_renew_deadline: Duration,
    /// How often the Lease is renewed, and how often followers try to take it.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub leader_elect_retry_period: Duration,
}

impl ServerArgs {
    /// The cluster secret, from the flag or its file (trailing newline removed).
    fn cluster_secret(&self) -> anyhow::Result<Option<Vec<u8>>> {
        let secret = match (&self.cluster_secret, &self.cluster_secret_file) {
            (Some(s), _) => s.clone().into_bytes(),
            (None, Some(path)) => {
                let mut s = std::fs::read(path)
                    .with_context(|| format!("reading --cluster-secret-file {}", path.display()))?;
                while s.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                    s.pop();
                }
                s
            }
            (None, None) => return Ok(None),
        };
        if secret.len() < 16 {
            anyhow::bail!("the cluster secret must be at least 16 bytes long");
        }
        Ok(Some(secret))
    }

    fn elects(&self) -> bool {
        self.leader_elect.unwrap_or(self.store == StoreKind::Etcd)
    }
}

fn parse_level(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x > 0.0 && x <= 1.0 => Ok(x),
        _ => Err(format!(
            "invalid water level {s:?}: expected a number in (0, 1]"
        )),
    }
}

/// Clusters per minute: a positive number.
fn parse_rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x > 0.0 && x.is_finite() => Ok(x),
        _ => Err(format!(
            "invalid eviction rate {s:?}: expected clusters per minute, a number above 0"
        )),
    }
}

fn parse_prediction_horizon(s: &str) -> Result<i64, String> {
    orrery_api::prediction::parse_horizon(s).map_err(|e| format!("invalid horizon {s:?}: {e}"))
}

fn parse_bound(s: &str) -> Result<orrery_api::prediction::Bound, String> {
    s.parse()
}

/// Durations as every flag takes them (`orrery_api::duration`).
pub use orrery_api::duration::parse_arg as parse_duration;

async fn open_store(args: &ServerArgs) -> anyhow::Result<Arc<dyn Store>> {
    match args.store {
        StoreKind::Sqlite => {
            let mut config =
                orrery_store_sqlite::SqliteConfig::new(args.data_dir.join("orrery.db"));
            config.commit_delay = args.commit_delay;
            let store = orrery_store_sqlite::SqliteStore::open(config)
                .with_context(|| format!("opening the store in {}", args.data_dir.display()))?;
            Ok(Arc::new(store))
        }
        StoreKind::Etcd => {
            let config = orrery_store_etcd::EtcdConfig::new(args.etcd_endpoints.clone())
                .with_prefix(args.etcd_prefix.clone());
            Ok(Arc::new(
                orrery_store_etcd::EtcdStore::connect(config).await?,
            ))
        }
    }
}

/// The admin token: the one in an existing kubeconfig if it is still valid, else a new one.
async fn admin_token(auth: &Authenticator, kubeconfig: &Path) -> anyhow::Result<String> {
    if let Ok(text) = std::fs::read_to_string(kubeconfig)
        && let Some(token) = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("token: "))
            .map(str::to_string)
        && auth
            .verify(&token)
            .is_some_and(|id| matches!(id, Identity::Admin { .. }))
    {
        return Ok(token);
    }
    let token = auth
        .issue(
            &Identity::Admin {
                name: "admin".into(),
            },
            "created by orrery server for admin.kubeconfig",
            None,
        )
        .await
        .map_err(|e| anyhow::anyhow!("creating the admin token: {}", e.message))?;
    Ok(token)
}

/// The installation's identity on a shared store: the one another replica stored (its CA
/// replaces this data directory's), or this replica's own, stored for the others. Two replicas
/// starting at once on an empty store: the one stored first wins, the other adopts it.
/// Returns the admin token.
async fn shared_identity(
    store: &dyn Store,
    sealer: &orrery_apiserver::seal::Sealer,
    data_dir: &Path,
    sans: &[String],
    auth: &Authenticator,
    kubeconfig: &Path,
) -> anyhow::Result<String> {
    use orrery_apiserver::identity;
    let adopt = |id: identity::Shared| -> anyhow::Result<String> {
        identity::adopt(data_dir, &id).context("installing the installation's CA")?;
        Ok(id.admin_token)
    };
    let stored = identity::load(store, sealer).await.context(
        "loading the installation's identity (is --cluster-secret the one the other replicas use?)",
    )?;
    if let Some(id) = stored {
        return adopt(id);
    }
    // This replica's own CA, made now if it has none.
    pki::ensure(data_dir, sans).context("preparing TLS certificates")?;
    let (ca_cert, ca_key) = pki::read_ca(data_dir)?;
    let staged = pki::read_staged(data_dir)?;
    let mine = identity::Shared {
        ca_cert,
        ca_key,
        admin_token: admin_token(auth, kubeconfig).await?,
        next_ca_cert: staged.as_ref().map(|(c, _)| c.clone()),
        next_ca_key: staged.map(|(_, k)| k),
    };
    match identity::publish(store, sealer, &mine)
        .await
        .context("storing the installation's identity")?
    {
        None => Ok(mine.admin_token),
        Some(theirs) => adopt(theirs),
    }
}

/// The URL other replicas forward the cluster proxy to: `--advertise-url`, else the listen
/// address when it names one; none for a single server (no --cluster-secret).
fn advertise_url(args: &ServerArgs, replicated: bool, listen: &SocketAddr) -> Option<String> {
    if !replicated {
        return None;
    }
    if let Some(url) = &args.advertise_url {
        return Some(url.trim_end_matches('/').to_string());
    }
    if listen.ip().is_unspecified() {
        tracing::warn!(
            "--listen names no address and --advertise-url is not set: other replicas answer 503 for members whose agents are connected here, instead of forwarding the cluster proxy"
        );
        return None;
    }
    Some(client_url(listen))
}

/// The URL clients use to reach `listen`.
pub fn client_url(listen: &SocketAddr) -> String {
    let host = if listen.ip().is_unspecified() {
        "127.0.0.1".to_string()
    } else {
        listen.ip().to_string()
    };
    if host.contains(':') {
        format!("https://[{host}]:{}", listen.port())
    } else {
        format!("https://{host}:{}", listen.port())
    }
}

/// A running server, for `orrery server` and `orrery up`.
pub struct Running {
    pub url: String,
    pub kubeconfig: PathBuf,
    shutdown: tokio::sync::watch::Sender<bool>,
    serving: tokio::task::JoinHandle<()>,
    controllers: Vec<tokio::task::JoinHandle<()>>,
    store: Arc<dyn Store>,
}

impl Running {
    /// Stops serving (watches end, in-flight requests finish), lets the controllers finish
    /// the writes they have begun (they take no new work), and closes the store.
    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
        let _ = self.serving.await;
        let controllers = futures_util::future::join_all(self.controllers);
        if tokio::time::timeout(Duration::from_secs(10), controllers)
            .await
            .is_err()
        {
            tracing::warn!("controllers did not stop within 10 s; closing the store anyway");
        }
        self.store.close().await;
    }
}

/// The controllers find template kinds where the API serves them (built-in kinds and CRDs).
#[derive(Debug)]
struct RegistryKinds(Arc<orrery_apiserver::resources::Resources>);

impl orrery_controllers::propagation::Kinds for RegistryKinds {
    fn resolve(
        &self,
        api_version: &str,
        kind: &str,
    ) -> Option<orrery_controllers::propagation::KindInfo> {
        let group = api_version.split_once('/').map(|(g, _)| g).unwrap_or("");
        let rt = self.0.snapshot().by_kind(group, kind)?;
        Some(orrery_controllers::propagation::KindInfo {
            group: rt.group.clone(),
            plural: rt.plural.clone(),
            namespaced: rt.namespaced,
        })
    }
}

/// What the lifecycle controllers need of the API server: its registry of kinds, its CRDs,
/// its tokens and each cluster's namespace.
#[derive(Debug)]
struct LifecycleApi {
    app: Arc<App>,
    /// The term's store: fenced under leader election, so a former leader writes nothing.
    store: Arc<dyn Store>,
}

fn kind_info(
    rt: &orrery_apiserver::resources::ResourceType,
) -> orrery_controllers::propagation::KindInfo {
    orrery_controllers::propagation::KindInfo {
        group: rt.group.clone(),
        plural: rt.plural.clone(),
        namespaced: rt.namespaced,
    }
}

#[async_trait::async_trait]
impl orrery_controllers::lifecycle::Api for LifecycleApi {
    fn kind(&self, group: &str, kind: &str) -> Option<orrery_controllers::propagation::KindInfo> {
        let rt = self.app.resources.snapshot().by_kind(group, kind)?;
        Some(kind_info(&rt))
    }

    fn namespaced_kinds(&self) -> Vec<orrery_controllers::propagation::KindInfo> {
        self.app
            .resources
            .snapshot()
            .stored()
            .iter()
            .filter(|t| t.namespaced)
            .map(|t| kind_info(t))
            .collect()
    }

    fn crd_kind(
        &self,
        crd: &orrery_api::Object,
    ) -> Option<orrery_controllers::propagation::KindInfo> {
        orrery_apiserver::crd::types_of(crd)
            .into_iter()
            .find(|(rt, _)| rt.storage)
            .map(|(rt, _)| kind_info(&rt))
    }

    async fn refresh_crds(&self) -> Result<(), orrery_store::StoreError> {
        self.app.refresh_crds().await
    }

    async fn revoke_cluster(&self, cluster: &str) -> Result<usize, orrery_store::StoreError> {
        self.app
            .auth
            .writing_through(self.store.clone())
            .revoke_cluster(cluster, orrery_apiserver::auth::Revoke::Unregister)
            .await
    }

    async fn ensure_cluster_namespace(&self, cluster: &str) -> Result<(), String> {
        orrery_apiserver::agent_api::ensure_cluster_namespace(
            &self.app,
            self.store.as_ref(),
            cluster,
        )
        .await
        .map_err(|e| e.message)
    }
}

/// What every term's controllers share (the metrics outlive a term).
struct TermShared {
    controllers: Arc<orrery_controllers::runtime::metrics::ControllerMetrics>,
    evictions: orrery_controllers::health::EvictionMetrics,
    scheduler: Arc<orrery_controllers::propagation::scheduling::SchedulerMetrics>,
    cost: Arc<orrery_controllers::monitoring::CostMetrics>,
    url: String,
    ca_pem: String,
}

/// Starts the controllers, the scheduler, monitoring and push-mode agents on `store` until
/// `shutdown`: one term of leadership (or the server's whole life without election).
fn spawn_controllers(
    args: &ServerArgs,
    store: Arc<dyn Store>,
    app: &Arc<App>,
    m: &TermShared,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut controllers = vec![tokio::spawn(
        orrery_apiserver::rbac::write_aggregated_rules(
            app.authz.clone(),
            store.clone(),
            m.controllers.of("aggregation"),
            shutdown.clone(),
        ),
    )];
    controllers.extend(orrery_controllers::lifecycle::spawn(
        store.clone(),
        Arc::new(LifecycleApi {
            app: app.clone(),
            store: store.clone(),
        }),
        m.controllers.clone(),
        shutdown.clone(),
    ));
    controllers.extend(orrery_controllers::spawn(
        store.clone(),
        orrery_controllers::Config {
            health: orrery_controllers::health::HealthConfig {
                grace_period: args.cluster_grace_period,
                eviction_timeout: args.cluster_eviction_timeout,
                eviction_rate: args.eviction_rate.map(|per_minute| {
                    orrery_controllers::health::EvictionRate {
                        per_minute,
                        burst: args.eviction_burst,
                    }
                }),
                eviction_metrics: m.evictions.clone(),
            },
            kinds: Some(Arc::new(RegistryKinds(app.resources.clone()))),
            scheduler: orrery_controllers::propagation::scheduling::Settings {
                water_level_limit: args.water_level_limit,
                shed_window: args.shed_window,
                shed_mark: args.shed_mark,
                consolidate_every: args.consolidate_interval,
                move_grace: args.move_grace_period,
                weights: args.score_weights.unwrap_or_default(),
                prediction: orrery_api::prediction::Ahead {
                    horizon_seconds: args.prediction_horizon,
                    bound: args.prediction_bound,
                },
                metrics: m.scheduler.clone(),
                ..Default::default()
            },
            monitoring: orrery_controllers::monitoring::MonitoringConfig {
                interval: args.monitoring_interval,
                cost_metrics: Some(m.cost.clone()),
                ..Default::default()
            },
            forecast: orrery_controllers::forecasting::ForecastConfig {
                season: args.forecast_season,
                horizon: args.forecast_horizon,
                history_bytes: args.forecast_history_mib.saturating_mul(1 << 20),
                // Forecasts are checked at the lead the scheduler reads them at.
                check_lead: Duration::from_secs(args.prediction_horizon.max(0) as u64)
                    .max(Duration::from_secs(1)),
                ..Default::default()
            },
            migration: orrery_controllers::migration::Settings {
                cleanup_grace_seconds: args.migration_cleanup_grace.as_secs() as i64,
                switch_timeout_seconds: args.migration_switch_timeout.as_secs() as i64,
                ..Default::default()
            },
            data: orrery_controllers::data::Settings::default(),
            autoscaling: orrery_controllers::autoscaling::federated::Settings {
                sync_period: args.hpa_sync_period,
                downscale_window: args.hpa_downscale_stabilization,
                season: args.forecast_season,
                ahead: orrery_api::prediction::Ahead {
                    horizon_seconds: args.prediction_horizon,
                    bound: args.prediction_bound,
                },
                ..Default::default()
            },
            services: orrery_controllers::services::Settings {
                ip_range: args.clusterset_ip_range,
            },
            quotas: orrery_controllers::quotas::Settings {
                interval: args.quota_interval,
                kueue_cluster: args.kueue_cluster.clone(),
            },
            inventory: orrery_controllers::inventory::Settings {
                access: Some(orrery_controllers::inventory::Access {
                    server: m.url.clone(),
                    ca_pem: m.ca_pem.clone(),
                }),
                publish: args.publish_cluster_profiles.clone(),
            },
            metrics: m.controllers.clone(),
        },
        shutdown.clone(),
    ));
    if let Some(from) = &args.forecast_history_from {
        let mut from = from.clone();
        from.queries
            .extend(args.forecast_history_query.iter().cloned());
        controllers.push(crate::history_from::spawn(
            from,
            store.clone(),
            m.controllers.of("history-import"),
            shutdown.clone(),
        ));
    }
    controllers.push(crate::push::spawn(
        app.clone(),
        store.clone(),
        m.url.clone(),
        m.ca_pem.clone(),
        m.controllers.of("push"),
        shutdown,
    ));
    controllers
}

/// Runs the controllers while this server leads (each term on a fenced store, see
/// `orrery_runtime::terms`).
async fn lead(
    args: ServerArgs,
    store: Arc<dyn Store>,
    app: Arc<App>,
    m: TermShared,
    leading: orrery_controllers::leader::Leading,
    leader: orrery_controllers::leader::LeaderMetric,
    shutdown: tokio::sync::watch::Receiver<bool>,
) {
    orrery_controllers::runtime::terms::run(
        store,
        leading,
        shutdown,
        |leads| leader.set(leads),
        |term_store, term_rx| spawn_controllers(&args, term_store, &app, &m, term_rx),
    )
    .await;
}

/// Creates `dir` if missing and makes it its owner's alone (0700), whatever the umask: it
/// holds the store, keys and kubeconfigs.
pub fn private_dir(dir: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("making {} private", dir.display()))
}

/// Starts everything and returns once the server accepts connections.
pub async fn start(args: &ServerArgs) -> anyhow::Result<Running> {
    check_args(args)?;
    private_dir(&args.data_dir)?;
    let secret = args.cluster_secret()?;
    // Read before the store opens: a bad configuration stops the server before it serves.
    let encryption = args
        .encryption_provider_config
        .as_deref()
        .map(orrery_apiserver::encryption::EncryptionConfig::load)
        .transpose()
        .context("--encryption-provider-config")?;
    let audit = open_audit_log(args)?;
    let mut store = open_store(args).await?;
    ensure_store_format(store.as_ref()).await?;
    if let Some(config) = encryption {
        tracing::info!(?config, "encrypting at rest");
        store = orrery_apiserver::encryption::EncryptingStore::wrap(store, Arc::new(config));
    }
    let sealer = secret
        .map(|s| {
            orrery_apiserver::seal::Sealer::new(&s, orrery_apiserver::identity::PURPOSE)
                .map(Arc::new)
        })
        .transpose()
        .map_err(|e| anyhow::anyhow!("--cluster-secret: {e}"))?;
    let sans = serving_names(args)?;
    let auth = Authenticator::start(store.clone())
        .await
        .context("loading tokens")?;
    let kubeconfig = args.data_dir.join("admin.kubeconfig");
    let token = match &sealer {
        Some(sealer) => {
            shared_identity(&*store, sealer, &args.data_dir, &sans, &auth, &kubeconfig).await?
        }
        None => admin_token(&auth, &kubeconfig).await?,
    };
    let authority = orrery_apiserver::ca::Authority::open(
        args.data_dir.clone(),
        sans.clone(),
        args.tls_cert_validity,
        sealer.clone().map(|s| (store.clone(), s)),
    )
    .await
    .context("preparing TLS certificates")?;

    // Bound now, so that port 0 means a free port and the address clients are given (the
    // kubeconfig, discovery) is the one bound.
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    let listen = listener
        .local_addr()
        .with_context(|| format!("listening on {}", args.listen))?;

    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    // Often enough to renew the serving certificate well inside its window and to adopt
    // another replica's CA rotation soon, at most once every 10 seconds.
    let every =
        (args.tls_cert_validity / 10).clamp(Duration::from_secs(1), Duration::from_secs(10));
    tokio::spawn(orrery_apiserver::ca::keep_fresh(
        authority.clone(),
        every,
        shutdown_rx.clone(),
    ));
    let registry: orrery_apiserver::metrics::SharedRegistry = Default::default();
    let scheduler_metrics =
        Arc::new(orrery_controllers::propagation::scheduling::SchedulerMetrics::new(&registry));
    let controller_metrics =
        Arc::new(orrery_controllers::runtime::metrics::ControllerMetrics::new(&registry));
    let cost_metrics = Arc::new(orrery_controllers::monitoring::CostMetrics::new(&registry));
    let eviction_metrics = orrery_controllers::health::EvictionMetrics::new(&registry);
    let leader_metric = orrery_controllers::leader::LeaderMetric::register(&registry);
    let mut config = api_config(args, registry, &listen, &authority, audit, sealer.is_some());
    // Every replica checks template changes against the federated quotas it follows.
    let quota_admission = orrery_controllers::propagation::quota::admission::QuotaAdmission::new();
    quota_admission.follow(
        store.clone(),
        controller_metrics.of("quota-admission"),
        shutdown_rx.clone(),
    );
    config.admission.push(quota_admission);
    let app = App::new(store.clone(), auth.clone(), config, shutdown_rx.clone())
        .await
        .context("starting the API")?;
    ensure_defaults(&app).await?;
    orrery_store::spawn_compactor(store.clone(), args.compaction_interval);
    // Every replica serves the kinds the stored CRDs define, whoever wrote them.
    app.follow_crds(controller_metrics.of("served-kinds"), shutdown_rx.clone());

    let url = client_url(&listen);
    pki::write_kubeconfig(
        &kubeconfig,
        &pki::kubeconfig(&url, &authority.current().bundle, "admin", &token),
    )
    .with_context(|| format!("writing {}", kubeconfig.display()))?;
    tokio::spawn(rewrite_kubeconfig(
        authority.clone(),
        kubeconfig.clone(),
        url.clone(),
        token.clone(),
        shutdown_rx.clone(),
    ));
    export_kubeconfig(args, &url, &authority, &token, &shutdown_rx)?;

    if let Some(addr) = args.dns_listen {
        let bound = crate::dns::serve_fleet(
            store.clone(),
            addr,
            shutdown_rx.clone(),
            controller_metrics.of("dns"),
        )
        .await
        .with_context(|| format!("serving clusterset DNS on {addr}"))?;
        println!("clusterset DNS at {bound} (udp and tcp)");
    }
    let serving = tokio::spawn(orrery_apiserver::server::serve(
        app.clone(),
        listener,
        orrery_apiserver::server::Tls::Authority(authority.clone()),
        shutdown_rx.clone(),
    ));
    let term = TermShared {
        controllers: controller_metrics,
        scheduler: scheduler_metrics,
        cost: cost_metrics,
        evictions: eviction_metrics,
        url: url.clone(),
        ca_pem: authority.current().bundle.clone(),
    };
    let controllers = start_controllers(args, &store, &app, term, leader_metric, shutdown_rx);
    tracing::info!(url = %url, kubeconfig = %kubeconfig.display(), "serving");
    Ok(Running {
        url,
        kubeconfig,
        shutdown: shutdown_tx,
        serving,
        controllers,
        store,
    })
}

/// Refuses settings that contradict each other.
fn check_args(args: &ServerArgs) -> anyhow::Result<()> {
    if args.shed_mark < args.water_level_limit {
        anyhow::bail!(
            "--shed-mark {} is below --water-level-limit {}: a cluster filled to the limit would shed at once",
            args.shed_mark,
            args.water_level_limit
        );
    }
    if args.consolidate_interval.is_zero() {
        anyhow::bail!(
            "--consolidate-interval 0: a round of consolidation needs time between rounds (e.g. 5m)"
        );
    }
    Ok(())
}

/// The audit log `--audit-log-path` and `--audit-policy-file` ask for (both or neither).
fn open_audit_log(
    args: &ServerArgs,
) -> anyhow::Result<Option<Arc<orrery_apiserver::audit::AuditLog>>> {
    let audit = match (&args.audit_log_path, &args.audit_policy_file) {
        (Some(path), Some(policy)) => {
            let policy =
                orrery_apiserver::audit::Policy::load(policy).context("--audit-policy-file")?;
            let log = orrery_apiserver::audit::AuditLog::open(
                policy,
                orrery_apiserver::audit::LogFile {
                    path: path.clone(),
                    max_bytes: args.audit_log_maxsize * 1024 * 1024,
                    max_backups: args.audit_log_maxbackup,
                },
            )
            .context("--audit-log-path")?;
            tracing::info!(path = %path.display(), "keeping an audit log");
            Some(Arc::new(log))
        }
        (None, None) => None,
        (Some(_), None) => anyhow::bail!(
            "--audit-log-path needs --audit-policy-file (which requests to log, at which level)"
        ),
        (None, Some(_)) => anyhow::bail!("--audit-policy-file needs --audit-log-path"),
    };
    Ok(audit)
}

/// Before anything reads or writes the objects: a later build's store is refused, an
/// earlier one's brought up to date (crates/store/src/format.rs).
async fn ensure_store_format(store: &dyn Store) -> anyhow::Result<()> {
    match orrery_store::format::ensure(store, concat!("orrery ", env!("CARGO_PKG_VERSION")))
        .await
        .context("checking the store's format")?
    {
        orrery_store::format::Outcome::Created => {
            tracing::info!(
                version = orrery_store::format::CURRENT,
                "recorded the store's format"
            )
        }
        orrery_store::format::Outcome::Current => {}
        orrery_store::format::Outcome::Migrated(steps) => {
            tracing::info!(
                steps = steps.len(),
                version = orrery_store::format::CURRENT,
                "the store's format was brought up to date"
            )
        }
    }
    Ok(())
}

/// The names the serving certificate is for: localhost, the address listened on, the
/// `--tls-san`s and `--advertise-url`'s host.
fn serving_names(args: &ServerArgs) -> anyhow::Result<Vec<String>> {
    let mut sans = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    if !args.listen.ip().is_unspecified() {
        sans.push(args.listen.ip().to_string());
    }
    sans.extend(args.tls_san.iter().cloned());
    if let Some(url) = &args.advertise_url {
        let uri: http::Uri = url
            .parse()
            .with_context(|| format!("--advertise-url {url}"))?;
        let host = uri
            .host()
            .filter(|_| uri.scheme_str() == Some("https"))
            .with_context(|| format!("--advertise-url {url}: not an https:// URL"))?;
        sans.push(
            host.trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
        );
    }
    Ok(sans)
}

/// The API's configuration from the flags, for the address bound.
fn api_config(
    args: &ServerArgs,
    registry: orrery_apiserver::metrics::SharedRegistry,
    listen: &SocketAddr,
    authority: &Arc<orrery_apiserver::ca::Authority>,
    audit: Option<Arc<orrery_apiserver::audit::AuditLog>>,
    replicated: bool,
) -> ApiConfig {
    ApiConfig {
        metrics_registry: Some(registry),
        server_address: listen.to_string(),
        authority: Some(authority.clone()),
        cluster_token_ttl: (!args.cluster_token_ttl.is_zero()).then_some(args.cluster_token_ttl),
        bookmark_interval: args.watch_bookmark_interval,
        audit,
        max_in_flight: (
            args.max_requests_inflight,
            args.max_mutating_requests_inflight,
        ),
        max_watches_per_user: args.max_watches_per_user,
        max_queued_per_user: args.max_queued_requests_per_user,
        queue_timeout: args.request_queue_timeout,
        request_body_timeout: args.request_body_timeout,
        connections: orrery_apiserver::server::ConnectionLimits {
            header_timeout: args.request_header_timeout,
            idle_timeout: args.idle_connection_timeout,
            max_per_source: args.max_connections_per_source,
        },
        slow_request_threshold: args.slow_request_threshold,
        advertise_url: advertise_url(args, replicated, listen),
        ..ApiConfig::default()
    }
}

/// The objects every server has: the default namespaces, Orrery's own CRDs, the default
/// RBAC roles and bindings.
async fn ensure_defaults(app: &App) -> anyhow::Result<()> {
    app.ensure_namespaces()
        .await
        .context("creating the default namespaces")?;
    app.ensure_own_crds()
        .await
        .context("describing Orrery's own kinds as CustomResourceDefinitions")?;
    app.ensure_default_roles()
        .await
        .context("writing the default RBAC roles and bindings")?;
    Ok(())
}

/// With `--kubeconfig-secret`, keeps the admin kubeconfig in that Secret.
fn export_kubeconfig(
    args: &ServerArgs,
    url: &str,
    authority: &Arc<orrery_apiserver::ca::Authority>,
    token: &str,
    shutdown_rx: &tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    if let Some(spec) = &args.kubeconfig_secret {
        let server_url = args
            .kubeconfig_secret_server
            .clone()
            .or_else(|| args.advertise_url.clone())
            .unwrap_or_else(|| url.to_string());
        let target = crate::export::Target::new(spec, &args.service_account_dir, server_url)?;
        tokio::spawn(crate::export::keep_exported(
            target,
            authority.clone(),
            token.to_string(),
            shutdown_rx.clone(),
        ));
    }
    Ok(())
}

/// The controllers: run under the leader Lease when the server elects (their terms and the
/// elector), else at once.
fn start_controllers(
    args: &ServerArgs,
    store: &Arc<dyn Store>,
    app: &Arc<App>,
    term: TermShared,
    leader_metric: orrery_controllers::leader::LeaderMetric,
    shutdown_rx: tokio::sync::watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    if args.elects() {
        let identity = orrery_controllers::leader::process_identity();
        let mut election = orrery_controllers::leader::ElectionConfig::new(identity.clone());
        election.lease_duration = args.leader_elect_lease_duration;
        election.renew_deadline = args.leader_elect_renew_deadline;
        election.retry_period = args.leader_elect_retry_period;
        let (leading, elector) =
            orrery_controllers::leader::spawn(store.clone(), election, shutdown_rx.clone());
        tracing::info!(%identity, "campaigning for the leader Lease orrery-system/orrery-controllers");
        let terms = tokio::spawn(lead(
            args.clone(),
            store.clone(),
            app.clone(),
            term,
            leading,
            leader_metric,
            shutdown_rx,
        ));
        vec![terms, elector]
    } else {
        leader_metric.set(true);
        spawn_controllers(args, store.clone(), app, &term, shutdown_rx)
    }
}

/// Writes the admin kubeconfig again whenever what clients are to trust changes (a CA
/// rotation's steps), so that kubectl keeps working across the switch.
async fn rewrite_kubeconfig(
    authority: Arc<orrery_apiserver::ca::Authority>,
    path: PathBuf,
    url: String,
    token: String,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut changes = authority.subscribe();
    let mut written = authority.current().bundle.clone();
    loop {
        tokio::select! {
            r = changes.changed() => if r.is_err() { return },
            _ = shutdown.changed() => return,
        }
        let bundle = authority.current().bundle.clone();
        if bundle == written {
            continue;
        }
        match pki::write_kubeconfig(&path, &pki::kubeconfig(&url, &bundle, "admin", &token)) {
            Ok(()) => {
                tracing::info!(path = %path.display(), "wrote the admin kubeconfig with the CA bundle now trusted");
                written = bundle;
            }
            Err(e) => tracing::warn!(error = %e, "writing the admin kubeconfig"),
        }
    }
}

/// Waits for SIGTERM or Ctrl-C.
pub async fn terminated() {
    match signals() {
        Some(s) => s.await,
        None => std::future::pending::<()>().await,
    }
}

/// Installs the SIGTERM and Ctrl-C handlers now (so that a signal arriving right after start
/// is not lost) and returns the future that waits for them.
pub fn signals() -> Option<impl std::future::Future<Output = ()>> {
    let mut term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok()?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).ok()?;
    Some(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}

pub async fn run(args: ServerArgs) -> anyhow::Result<()> {
    let stop = signals().context("installing signal handlers")?;
    let running = start(&args).await?;
    println!(
        "orrery server ready at {} (kubeconfig: {})",
        running.url,
        running.kubeconfig.display()
    );
    let kc =
        std::fs::canonicalize(&running.kubeconfig).unwrap_or_else(|_| running.kubeconfig.clone());
    println!("  export KUBECONFIG={}", kc.display());
    stop.await;
    tracing::info!("shutting down");
    running.stop().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("40s").unwrap(), Duration::from_secs(40));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("7").unwrap(), Duration::from_secs(7));
        assert_eq!(
            parse_duration("5 minutes").unwrap(),
            Duration::from_secs(300)
        );
        assert_eq!(parse_duration("40 ").unwrap(), Duration::from_secs(40));
        assert!(parse_duration("x").is_err());
    }

    #[test]
    fn the_commit_delay_flag_defaults_to_the_stores_default() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            server: ServerArgs,
        }
        let cli = <Cli as clap::Parser>::try_parse_from(["orrery"]).unwrap();
        assert_eq!(
            cli.server.commit_delay,
            orrery_store_sqlite::DEFAULT_COMMIT_DELAY
        );
    }

    #[test]
    fn urls() {
        assert_eq!(
            client_url(&"0.0.0.0:6443".parse().unwrap()),
            "https://127.0.0.1:6443"
        );
        assert_eq!(
            client_url(&"127.0.0.2:1".parse().unwrap()),
            "https://127.0.0.2:1"
        );
        assert_eq!(
            client_url(&"[::1]:6443".parse().unwrap()),
            "https://[::1]:6443"
        );
    }
}
