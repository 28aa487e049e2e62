//! How an agent runs (its configuration), and how it stops.

use super::*;

/// How one agent runs.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The server's URL, or several replicas' URLs separated by commas: the agent moves to
    /// the next when the one it uses fails.
    pub server: String,
    pub cluster: String,
    /// A bootstrap token (`ORR1<ca hash>::<id>.<secret>`), needed when no cluster token is
    /// stored yet, and to re-register if the stored one is revoked.
    pub bootstrap_token: Option<String>,
    /// The server's CA, when given as a file rather than pinned by the token.
    pub ca_pem: Option<String>,
    /// A cluster token to use as is, without registering (push mode: the server runs the
    /// agent for a member it reaches itself; needs `ca_pem`).
    pub cluster_token: Option<String>,
    pub info: ClusterFacts,
    pub state: StateFile,
    pub heartbeat_interval: Duration,
    /// Least time between two status reports.
    pub report_interval: Duration,
    /// How often every object is read again, whatever the backend's stamps say (what differs
    /// from the server's copy is sent, as always).
    pub resync_interval: Duration,
    /// Where the agent publishes the multi-cluster services its member imports (the
    /// ServiceImports and EndpointSlices of Orrery's `orrery-mcs.*` Works), for its clusterset
    /// DNS.
    pub services: Option<watch::Sender<Vec<Value>>>,
    /// Whether the agent keeps the cluster proxy's tunnel open to the server (a simulated
    /// fleet of thousands does not).
    pub tunnel: bool,
    /// Shared by the members of a simulated fleet, which share one process: how many of them
    /// may be setting up a session at once (fetching the CA, registering, the first heartbeat,
    /// each a TLS handshake). Thousands starting at once on a few cores otherwise make every
    /// handshake so slow that the server's handshake timeout ends them all, and they try again
    /// together. `None` for an agent of its own.
    pub connecting: Option<Arc<tokio::sync::Semaphore>>,
    /// What the agent's probes and metrics read (`--health-listen`).
    pub health: Option<Arc<crate::health::Health>>,
    /// How often the agent reads the server's CA bundle again (a CA rotation's new CA is
    /// trusted from then on, without registering again).
    pub ca_refresh: Duration,
}

impl AgentConfig {
    /// The servers' URLs, in the order they are tried.
    pub fn servers(&self) -> Vec<&str> {
        self.server
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect()
    }

    pub fn new(server: &str, cluster: &str) -> Self {
        AgentConfig {
            server: server.to_string(),
            cluster: cluster.to_string(),
            bootstrap_token: None,
            ca_pem: None,
            cluster_token: None,
            info: ClusterFacts::default(),
            state: StateFile::none(),
            heartbeat_interval: Duration::from_secs(10),
            report_interval: Duration::from_secs(1),
            resync_interval: Duration::from_secs(60),
            services: None,
            tunnel: true,
            connecting: None,
            health: None,
            ca_refresh: Duration::from_secs(600),
        }
    }
}

/// The Works of multi-cluster services a member imports.
pub(super) const SERVICES_WORK_PREFIX: &str = "orrery-mcs.";

/// Why an agent stopped without an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// Asked to.
    Shutdown,
    /// Its cluster was unregistered; what it applied has been removed.
    Unregistered,
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    State(#[from] StateError),
    #[error("cannot register cluster {cluster}: {message}")]
    Bootstrap { cluster: String, message: String },
    #[error(
        "the server no longer accepts this agent's token for cluster {0} (the cluster was unregistered or another agent registered it); give a new bootstrap token with --token"
    )]
    Revoked(String),
    #[error("connecting to the server: {0}")]
    Client(String),
}
