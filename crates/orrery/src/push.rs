//! Push mode: for every Cluster with `syncMode: Push`, the server runs that cluster's agent
//! itself, in-process, against the member's API (credentials from the Secret the Cluster
//! names). It is the same agent as in pull mode, holding a cluster token the server issues,
//! so Works, status, heartbeats and health behave alike; readiness comes from probing the
//! member's API.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use orrery_agent::AgentConfig;
use orrery_agent::backend::kube::KubeMember;
use orrery_api::cluster::{self, ClusterSpec, SyncMode};
use orrery_api::conditions::{self, Condition};
use orrery_api::{Object, Time, keys};
use orrery_apiserver::App;
use orrery_apiserver::auth::{Identity, Revoke};
use orrery_controllers::runtime::controller::{
    Action, Controller, Keys, Origin, Reconciler, Source,
};
use orrery_controllers::runtime::reflector::Event;
use orrery_store::{Store, StoreError, update_with};
use serde_json::Value;
use tokio::sync::watch;

/// What a running push agent was started with; a change restarts it.
#[derive(Debug, Clone, PartialEq)]
struct Wanted {
    endpoint: String,
    secret: (String, String),
    secret_version: String,
}

struct Running {
    wanted: Wanted,
    stop: watch::Sender<bool>,
}

/// The member's client configuration from the Cluster's Secret.
async fn member_client(app: &App, c: &ClusterSpec) -> Result<(kube::Client, String), String> {
    let r = c.secret_ref.clone().unwrap_or_default();
    let secret = app
        .store
        .get(&keys::well_known::secret(&r.namespace, &r.name))
        .await
        .map_err(|e| format!("reading Secret {}/{}: {e}", r.namespace, r.name))?;
    let encoded = secret
        .other
        .get("data")
        .and_then(|d| d.get("kubeconfig"))
        .and_then(Value::as_str)
        .ok_or_else(|| format!("Secret {}/{} has no `kubeconfig` key", r.namespace, r.name))?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|e| {
            format!(
                "the kubeconfig in Secret {}/{} is not base64: {e}",
                r.namespace, r.name
            )
        })?;
    let text = String::from_utf8(bytes).map_err(|_| "the kubeconfig is not UTF-8".to_string())?;
    let kc = kube::config::Kubeconfig::from_yaml(&text)
        .map_err(|e| format!("the kubeconfig does not parse: {e}"))?;
    let mut config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| format!("the kubeconfig is not usable: {e}"))?;
    if !c.api_endpoint.is_empty() {
        config.cluster_url = c
            .api_endpoint
            .parse()
            .map_err(|_| format!("invalid apiEndpoint {}", c.api_endpoint))?;
    }
    let version = secret.metadata.resource_version.clone();
    kube::Client::try_from(config)
        .map(|cl| (cl, version))
        .map_err(|e| format!("building the member's client: {e}"))
}

/// Marks a Push cluster not Ready with why its agent cannot run.
async fn report_failure(store: &dyn Store, name: &str, why: &str) {
    let key = keys::well_known::cluster(name);
    let r = update_with(store, &key, |mut o| {
        let mut st: cluster::ClusterStatus = o
            .status
            .clone()
            .and_then(|s| serde_json::from_value(s).ok())
            .unwrap_or_default();
        let changed = conditions::set(
            &mut st.conditions,
            Condition::new(
                cluster::CONDITION_READY,
                conditions::FALSE,
                "PushCredentialsInvalid",
                why,
            ),
            Time::now(),
        );
        if !changed {
            return Ok(None);
        }
        o.status = serde_json::to_value(&st).ok();
        Ok(Some(o))
    })
    .await;
    if let Err(e) = r
        && !matches!(e, StoreError::NotFound { .. })
    {
        tracing::warn!(cluster = name, error = %e, "recording a push failure failed");
    }
}

async fn start(
    app: &Arc<App>,
    store: &Arc<dyn Store>,
    url: &str,
    ca_pem: &str,
    c: &Object,
    wanted: Wanted,
    shutdown: &watch::Receiver<bool>,
) -> Option<Running> {
    let spec = ClusterSpec::of(c);
    let (client, _) = match member_client(app, &spec).await {
        Ok(x) => x,
        Err(why) => {
            tracing::warn!(cluster = c.name(), error = %why, "cannot drive the Push cluster");
            report_failure(store.as_ref(), c.name(), &why).await;
            return None;
        }
    };
    // One token per running push agent: a restart retires the previous one. Through the
    // term's store: a former leader neither revokes nor issues.
    let auth = app.auth.writing_through(store.clone());
    if let Err(e) = auth.revoke_cluster(c.name(), Revoke::Retire).await {
        tracing::warn!(cluster = c.name(), error = %e, "revoking old push tokens failed");
    }
    let token = match auth
        .issue(
            &Identity::Cluster {
                name: c.name().to_string(),
            },
            "push-mode agent run by the server",
            None,
        )
        .await
    {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(cluster = c.name(), error = %e.message, "issuing a push token failed");
            return None;
        }
    };
    let mut cfg = AgentConfig::new(url, c.name());
    cfg.cluster_token = Some(token);
    cfg.ca_pem = Some(ca_pem.to_string());
    let (stop, mut stopped) = watch::channel(false);
    let mut server_down = shutdown.clone();
    let (inner_tx, inner_rx) = watch::channel(false);
    // Stop when the server stops or this cluster's agent is no longer wanted.
    tokio::spawn(async move {
        tokio::select! {
            _ = stopped.changed() => {}
            _ = server_down.changed() => {}
        }
        let _ = inner_tx.send(true);
    });
    let name = c.name().to_string();
    tokio::spawn(async move {
        tracing::info!(cluster = %name, "driving the Push cluster");
        match orrery_agent::run(cfg, Arc::new(KubeMember::new(client)), inner_rx).await {
            Ok(s) => tracing::info!(cluster = %name, stopped = ?s, "push agent stopped"),
            Err(e) => tracing::warn!(cluster = %name, error = %e, "push agent failed"),
        }
    });
    Some(Running { wanted, stop })
}

async fn wanted_of(app: &App, c: &Object) -> Option<Wanted> {
    let spec = ClusterSpec::of(c);
    if spec.sync_mode != SyncMode::Push || c.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let r = spec.secret_ref.unwrap_or_default();
    let version = app
        .store
        .get(&keys::well_known::secret(&r.namespace, &r.name))
        .await
        .map(|s| s.metadata.resource_version)
        .unwrap_or_default();
    Some(Wanted {
        endpoint: spec.api_endpoint,
        secret: (r.namespace, r.name),
        secret_version: version,
    })
}

/// A Cluster as the push agents' supervisor last saw it.
struct Known {
    /// A digest of its spec, and whether it is being deleted: a change of either is looked at.
    spec: u64,
    deleting: bool,
    /// The Cluster, when it is a Push one (looked at again now and then: its Secret may change).
    push: Option<Arc<Object>>,
}

impl Known {
    fn of(o: &Arc<Object>) -> Known {
        let push = ClusterSpec::of(o).sync_mode == SyncMode::Push;
        Known {
            spec: orrery_api::object::json_digest(&o.spec),
            deleting: o.metadata.deletion_timestamp.is_some(),
            push: push.then(|| o.clone()),
        }
    }

    fn same(&self, other: &Known) -> bool {
        self.spec == other.spec && self.deleting == other.deleting
    }
}

/// The push agents' supervisor: a key per Cluster.
struct Supervisor {
    app: Arc<App>,
    store: Arc<dyn Store>,
    url: String,
    ca_pem: String,
    shutdown: watch::Receiver<bool>,
    /// What each Cluster was last seen as; the object itself only for Push clusters (a
    /// parsed Cluster is about 25 KB, and a large fleet's are nearly all Pull).
    known: HashMap<String, Known>,
    /// The agents running, by cluster (dropping one stops it).
    running: parking_lot::Mutex<HashMap<String, Running>>,
}

#[async_trait::async_trait]
impl Reconciler for Supervisor {
    type Key = String;
    type Error = String;

    fn on_event(&mut self, _: Origin, ev: Event, keys: &mut Keys<String>) {
        match ev {
            Event::Listed(items) => {
                self.known = items
                    .iter()
                    .map(|o| (o.name().to_string(), Known::of(o)))
                    .collect();
                keys.all();
            }
            Event::Upsert(o) => {
                // Heartbeats change only the status: nothing to look at again.
                let now = Known::of(&o);
                let same = self.known.get(o.name()).is_some_and(|k| k.same(&now));
                self.known.insert(o.name().to_string(), now);
                if !same {
                    keys.push(o.name().to_string());
                }
            }
            Event::Delete(o) => {
                self.known.remove(o.name());
                keys.push(o.name().to_string());
            }
        }
    }

    /// Every Cluster known and every agent running (one whose Cluster went while nobody
    /// looked is stopped).
    fn all_keys(&self) -> Vec<String> {
        let mut all: Vec<String> = self.known.keys().cloned().collect();
        all.extend(
            self.running
                .lock()
                .keys()
                .filter(|n| !self.known.contains_key(*n))
                .cloned(),
        );
        all
    }

    /// Secrets change without the Cluster changing: the Push clusters are looked at again
    /// now and then.
    fn tick(&mut self, keys: &mut Keys<String>) {
        keys.extend(
            self.known
                .iter()
                .filter(|(_, k)| k.push.is_some())
                .map(|(n, _)| n.clone()),
        );
    }

    async fn reconcile(&self, name: &String) -> Result<Action, String> {
        let c = self.known.get(name).and_then(|k| k.push.clone());
        let wanted = match &c {
            Some(c) => wanted_of(&self.app, c).await,
            None => None,
        };
        let current = self.running.lock().get(name).map(|r| r.wanted.clone());
        match (wanted, current, c) {
            (Some(w), Some(r), _) if r == w => {}
            (Some(w), _, Some(c)) => {
                if let Some(r) = self.running.lock().remove(name) {
                    let _ = r.stop.send(true);
                }
                let started = start(
                    &self.app,
                    &self.store,
                    &self.url,
                    &self.ca_pem,
                    &c,
                    w,
                    &self.shutdown,
                )
                .await;
                if let Some(r) = started {
                    self.running.lock().insert(name.clone(), r);
                }
            }
            (_, _, _) => {
                if let Some(r) = self.running.lock().remove(name) {
                    let _ = r.stop.send(true);
                }
            }
        }
        Ok(Action::Done)
    }
}

/// Runs the push agents of all Push clusters until shutdown.
pub fn spawn(
    app: Arc<App>,
    store: Arc<dyn Store>,
    url: String,
    ca_pem: String,
    metrics: orrery_controllers::runtime::metrics::Handle,
    shutdown: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let s = Supervisor {
        app: app.clone(),
        store,
        url,
        ca_pem,
        shutdown: shutdown.clone(),
        known: HashMap::new(),
        running: Default::default(),
    };
    // The Clusters are read from the server's own store, the writes go through the term's.
    let c = Controller::new("push", app.store.clone(), s, metrics)
        .source(Source::new("clusters", keys::well_known::clusters()))
        .every(Duration::from_secs(15));
    tokio::spawn(c.run(shutdown))
}
