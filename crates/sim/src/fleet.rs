//! Many simulated member clusters in one agent process (`orrery agent --simulate-fleet FILE`),
//! so that a laptop can run a fleet of a thousand for tests and benchmarks.
//!
//! ```yaml
//! clusters:
//!   - name: edge-{i}          # {i} is replaced by 0..count-1
//!     count: 100
//!     regions: [us-east, eu-west, ap-south]   # cluster i gets regions[i % 3]
//!     provider: aws
//!     labels: {tier: edge}
//!     capabilities: [tls-encryption]
//!     simulate: nodes=10,cpu=16,memory=64Gi,load=0.3,profile=diurnal
//!   - name: gpu-west
//!     region: us-west
//!     zones: [us-west-1a]
//!     simulate: nodes=4,cpu=64,memory=256Gi,gpu=8,bandwidth=1Gi
//!     latency: {edge-0: 12}    # optional: round trips in ms (else from the regions)
//!     token: ORR1...           # optional: this cluster's own bootstrap token
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::{SimCluster, SimSpec};
use orrery_agent::state::StateFile;
use orrery_agent::{AgentConfig, AgentError, Stopped, run};
use orrery_api::cluster::ClusterFacts;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetFile {
    pub clusters: Vec<FleetEntry>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FleetEntry {
    pub name: String,
    #[serde(default)]
    pub count: Option<usize>,
    #[serde(default)]
    pub region: String,
    #[serde(default)]
    pub regions: Vec<String>,
    #[serde(default)]
    pub zones: Vec<String>,
    #[serde(default)]
    pub provider: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub capabilities: Vec<String>,
    #[serde(default)]
    pub simulate: String,
    #[serde(default)]
    pub token: Option<String>,
    /// Round-trip latency to other clusters, milliseconds (instead of what the regions give).
    #[serde(default)]
    pub latency: BTreeMap<String, f64>,
}

/// One simulated cluster of a fleet, ready to run.
#[derive(Debug, Clone)]
pub struct Member {
    pub name: String,
    pub info: ClusterFacts,
    pub spec: SimSpec,
    pub token: Option<String>,
    pub latency: BTreeMap<String, f64>,
}

#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("reading fleet file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("fleet file {path}: {message}")]
    Invalid { path: String, message: String },
}

impl FleetFile {
    pub fn load(path: &Path) -> Result<Vec<Member>, FleetError> {
        let text = std::fs::read_to_string(path).map_err(|source| FleetError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text).map_err(|message| FleetError::Invalid {
            path: path.display().to_string(),
            message,
        })
    }

    /// The clusters a fleet description stands for, expanded and checked.
    pub fn parse(text: &str) -> Result<Vec<Member>, String> {
        let file: FleetFile = serde_saphyr::from_str(text).map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (n, e) in file.clusters.iter().enumerate() {
            let spec: SimSpec = e
                .simulate
                .parse()
                .map_err(|m| format!("clusters[{n}] ({}): simulate: {m}", e.name))?;
            let count = e.count.unwrap_or(1);
            if e.count.is_some() && !e.name.contains("{i}") {
                return Err(format!(
                    "clusters[{n}]: a name with count needs {{i}} in it"
                ));
            }
            for i in 0..count {
                let name = e.name.replace("{i}", &i.to_string());
                let errs = orrery_api::cluster::validate_name(&name);
                if let Some(err) = errs.first() {
                    return Err(format!("clusters[{n}]: {err}"));
                }
                if !seen.insert(name.clone()) {
                    return Err(format!("cluster {name} appears twice"));
                }
                let region = if e.regions.is_empty() {
                    e.region.clone()
                } else {
                    e.regions[i % e.regions.len()].clone()
                };
                out.push(Member {
                    name,
                    info: ClusterFacts {
                        provider: e.provider.clone(),
                        region,
                        zones: e.zones.clone(),
                        capabilities: e.capabilities.clone(),
                        labels: e.labels.clone(),
                        api_endpoint: String::new(),
                    },
                    spec: spec.clone(),
                    token: e.token.clone(),
                    latency: e.latency.clone(),
                });
            }
        }
        if out.is_empty() {
            return Err("the fleet has no clusters".into());
        }
        Ok(out)
    }
}

/// How a fleet's agents reach the server and behave.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    pub server: String,
    /// The token of clusters that have none of their own (a bootstrap token for a name
    /// pattern such as `edge-*`, or one per cluster).
    pub token: Option<String>,
    pub ca_pem: Option<String>,
    /// Each cluster keeps its state in `<dir>/<name>/`; `None` keeps nothing.
    pub state_dir: Option<PathBuf>,
    pub heartbeat_interval: Duration,
    pub report_interval: Duration,
    /// How often each member's agent reads the server's CA bundle again.
    pub ca_refresh: Duration,
    /// Whether the simulated members keep their objects across restarts of this process, in
    /// `<state_dir>/<name>/member.json` (`orrery up`, whose members stop and start with the
    /// control plane: real members would not lose their workloads when it stops).
    pub keep_members: bool,
}

/// Where a simulated member's objects are kept.
fn member_file(dir: &Path, name: &str) -> PathBuf {
    dir.join(name).join("member.json")
}

/// The objects a simulated member held when it last stopped. A file that cannot be read is
/// set aside (`member.json.unreadable`), not overwritten, and the member starts empty.
fn load_member(file: &Path) -> Option<crate::SimSnapshot> {
    let bytes = match std::fs::read(file) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!(file = %file.display(), error = %e, "a simulated member's objects cannot be read; it starts empty");
            return None;
        }
    };
    match serde_json::from_slice(&bytes) {
        Ok(s) => Some(s),
        Err(e) => {
            let aside = file.with_extension("json.unreadable");
            let _ = std::fs::rename(file, &aside);
            tracing::warn!(file = %file.display(), set_aside = %aside.display(), error = %e, "a simulated member's objects are unreadable; it starts empty");
            None
        }
    }
}

/// Writes a member's objects whole (a new file renamed over the old: a crash midway leaves
/// the previous one).
fn save_member(file: &Path, sim: &SimCluster) -> std::io::Result<()> {
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let json = serde_json::to_vec(&sim.snapshot()).map_err(std::io::Error::other)?;
    let tmp = file.with_extension("json.tmp");
    std::fs::write(&tmp, json)?;
    std::fs::rename(&tmp, file)
}

/// Keeps the members' files current: each one written again once a second while it changes.
fn spawn_keeper(
    dir: PathBuf,
    sims: Vec<Arc<SimCluster>>,
    mut shutdown: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut saved: Vec<Option<u64>> = vec![None; sims.len()];
        loop {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = shutdown.changed() => return,
            }
            for (sim, last) in sims.iter().zip(saved.iter_mut()) {
                let v = sim.version();
                if *last == Some(v) {
                    continue;
                }
                match save_member(&member_file(&dir, sim.name()), sim) {
                    Ok(()) => *last = Some(v),
                    Err(e) => {
                        tracing::warn!(cluster = sim.name(), error = %e, "keeping a simulated member's objects failed")
                    }
                }
            }
        }
    })
}

/// A running fleet.
#[derive(Debug)]
pub struct Fleet {
    pub sims: Vec<Arc<SimCluster>>,
    pub agents: Vec<(String, JoinHandle<Result<Stopped, AgentError>>)>,
    ticker: JoinHandle<()>,
    /// Where the members' objects are kept, and the task keeping them.
    keeper: Option<(PathBuf, JoinHandle<()>)>,
}

/// How many members of a simulated fleet set up their sessions at once: as many as a server
/// registers at once (`orrery_apiserver::app::CONCURRENT_REGISTRATIONS`).
const FLEET_CONNECTING: usize = 32;

impl Fleet {
    /// Starts one agent per member, and the clock of the simulations.
    pub fn start(
        members: Vec<Member>,
        cfg: &FleetConfig,
        shutdown: watch::Receiver<bool>,
    ) -> Fleet {
        let peers: Vec<(String, String)> = members
            .iter()
            .map(|m| (m.name.clone(), m.info.region.clone()))
            .collect();
        // At most this many members set up a session at once (see `AgentConfig::connecting`).
        let connecting = Arc::new(tokio::sync::Semaphore::new(FLEET_CONNECTING));
        let mut sims = Vec::with_capacity(members.len());
        let mut agents = Vec::with_capacity(members.len());
        for m in members {
            let sim = Arc::new(SimCluster::new(&m.name, &m.info.region, m.spec.clone()));
            if cfg.keep_members
                && let Some(dir) = &cfg.state_dir
                && let Some(snap) = load_member(&member_file(dir, &m.name))
            {
                sim.restore(snap);
            }
            if peers.len() <= 64 {
                // Latency figures to every peer; large fleets leave them out (they grow as n²).
                sim.set_peers(peers.clone());
            }
            if !m.latency.is_empty() {
                sim.set_latency(m.latency.clone());
            }
            let mut ac = AgentConfig::new(&cfg.server, &m.name);
            ac.bootstrap_token = m.token.clone().or_else(|| cfg.token.clone());
            ac.ca_pem = cfg.ca_pem.clone();
            ac.info = m.info.clone();
            ac.state = match &cfg.state_dir {
                Some(d) => StateFile::at(&d.join(&m.name)),
                None => StateFile::none(),
            };
            ac.heartbeat_interval = cfg.heartbeat_interval;
            ac.report_interval = cfg.report_interval;
            ac.ca_refresh = cfg.ca_refresh;
            // The cluster proxy's tunnels, one connection each: for a fleet to work with, not
            // for thousands simulated to load the server.
            ac.tunnel = peers.len() <= 64;
            ac.connecting = Some(connecting.clone());
            let backend: Arc<dyn orrery_agent::backend::Backend> = sim.clone();
            let name = m.name.clone();
            let handle = tokio::spawn(run(ac, backend, shutdown.clone()));
            agents.push((name, handle));
            sims.push(sim);
        }
        let keeper = match &cfg.state_dir {
            Some(dir) if cfg.keep_members => Some((
                dir.clone(),
                spawn_keeper(dir.clone(), sims.clone(), shutdown.clone()),
            )),
            _ => None,
        };
        let ticker = crate::spawn_clock(sims.clone(), shutdown.clone());
        Fleet {
            sims,
            agents,
            ticker,
            keeper,
        }
    }

    /// Waits for every agent to stop; returns the errors of those that failed.
    pub async fn wait(self) -> Vec<(String, AgentError)> {
        let mut failed = Vec::new();
        for (name, h) in self.agents {
            match h.await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => failed.push((name, e)),
                Err(e) => failed.push((
                    name.clone(),
                    AgentError::Client(format!("the agent task of {name} failed: {e}")),
                )),
            }
        }
        self.ticker.abort();
        // What the members hold once their agents have stopped.
        if let Some((dir, keeper)) = self.keeper {
            let _ = keeper.await;
            for sim in &self.sims {
                if let Err(e) = save_member(&member_file(&dir, sim.name()), sim) {
                    tracing::warn!(cluster = sim.name(), error = %e, "keeping a simulated member's objects failed");
                }
            }
        }
        failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fleet_files_expand_and_check() {
        let members = FleetFile::parse(
            r#"
clusters:
  - name: edge-{i}
    count: 4
    regions: [us-east, eu-west]
    labels: {tier: edge}
    simulate: nodes=2,cpu=4,memory=8Gi
  - name: core
    region: us-west
    simulate: nodes=8,gpu=2
    token: abc.def
"#,
        )
        .unwrap();
        let names: Vec<&str> = members.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["edge-0", "edge-1", "edge-2", "edge-3", "core"]);
        assert_eq!(members[1].info.region, "eu-west");
        assert_eq!(members[2].info.region, "us-east");
        assert_eq!(members[0].spec.nodes, 2);
        assert_eq!(members[4].spec.gpu, 2);
        assert_eq!(members[4].token.as_deref(), Some("abc.def"));
        for (bad, why) in [
            ("clusters: []", "no clusters"),
            ("clusters: [{name: a, simulate: 'nodes=x'}]", "simulate"),
            ("clusters: [{name: a, count: 2}]", "{i}"),
            ("clusters: [{name: a}, {name: a}]", "twice"),
            ("clusters: [{name: Bad_Name}]", "metadata.name"),
            ("clusters: [{name: a, colour: red}]", "colour"),
        ] {
            let e = FleetFile::parse(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
