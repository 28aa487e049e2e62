//! The application's shared state: the store, the served kinds and their schemas, who is
//! who and who may do what, the configuration; and what is written at start. Requests are
//! routed in `router.rs`; nothing here knows a handler.

use std::sync::Arc;
use std::time::Duration;

use orrery_api::Object;
use orrery_store::{ListOptions, Store, StoreError};
use tokio::sync::watch;

use crate::auth::Authenticator;
use crate::openapi;
use crate::resources::Resources;
use crate::schema::Schemas;

/// Tunables of the API.
#[derive(Clone, Debug)]
pub struct ApiConfig {
    /// Request bodies above this are refused with 413 (Kubernetes' limit is 3 MiB).
    pub max_body_bytes: usize,
    /// How often watches that asked for bookmarks get one.
    pub bookmark_interval: Duration,
    /// Watches without `timeoutSeconds` end after a random time between this and twice it.
    pub min_request_timeout: Duration,
    /// `host:port` clients reach the server at (for `/api`).
    pub server_address: String,
    /// The installation's CA: what `/cacerts` hands out, what signs users' certificates, and
    /// its rotation; `None` where the server holds none.
    pub authority: Option<Arc<crate::ca::Authority>>,
    /// How long a cluster token (an agent's) is good for; `None`: until its cluster is
    /// unregistered or another agent registers it. Agents renew theirs before it runs out
    /// (`POST /agent/v1/renew`).
    pub cluster_token_ttl: Option<Duration>,
    /// The metrics registry shared with the other components (`/metrics`); a fresh one when
    /// `None`.
    pub metrics_registry: Option<crate::metrics::SharedRegistry>,
    /// The audit log, when one is kept (`--audit-log-path`, `--audit-policy-file`).
    pub audit: Option<Arc<crate::audit::AuditLog>>,
    /// Requests served at once, beyond which others are told to come back (429), as
    /// kube-apiserver's `--max-requests-inflight` and `--max-mutating-requests-inflight`:
    /// (read-only, mutating); 0 is no limit. Watches and the admin are not counted.
    pub max_in_flight: (usize, usize),
    /// Requests of one user that may wait for a seat at once ([`crate::fairness`]); beyond
    /// them, 429.
    pub max_queued_per_user: usize,
    /// How long a request may wait for a seat before it is told to come back (429).
    pub queue_timeout: Duration,
    /// A request's body must have arrived this long after its headers, or the request is
    /// answered 408 and its connection closed (a slow client holds no seat meanwhile).
    pub request_body_timeout: Duration,
    /// What one connection may hold: header and idle timeouts, connections per source.
    pub connections: crate::http::ConnectionLimits,
    /// Watches one user may hold open at once (the admin is not counted); 0 is no limit.
    pub max_watches_per_user: usize,
    /// The URL other replicas reach this one at (HA installations): the cluster proxy records
    /// it as the holder of the tunnels open here, and other replicas forward to it. `None`:
    /// nothing recorded (a single server).
    pub advertise_url: Option<String>,
    /// A request that takes longer is logged with its steps ([`crate::trace`]), as
    /// kube-apiserver traces requests over half a second; zero logs none.
    pub slow_request_threshold: Duration,
    /// Checks of writes that need what is stored ([`crate::admission`]), in order.
    pub admission: Vec<Arc<dyn crate::admission::Admission>>,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            max_body_bytes: 3 * 1024 * 1024,
            bookmark_interval: Duration::from_secs(60),
            min_request_timeout: Duration::from_secs(1800),
            server_address: "127.0.0.1:6443".into(),
            authority: None,
            cluster_token_ttl: None,
            metrics_registry: None,
            audit: None,
            max_in_flight: (
                DEFAULT_MAX_REQUESTS_INFLIGHT,
                DEFAULT_MAX_MUTATING_REQUESTS_INFLIGHT,
            ),
            max_queued_per_user: crate::fairness::DEFAULT_QUEUE_LENGTH,
            queue_timeout: crate::fairness::DEFAULT_QUEUE_TIMEOUT,
            request_body_timeout: DEFAULT_REQUEST_BODY_TIMEOUT,
            connections: crate::http::ConnectionLimits::default(),
            max_watches_per_user: DEFAULT_MAX_WATCHES_PER_USER,
            advertise_url: None,
            slow_request_threshold: DEFAULT_SLOW_REQUEST_THRESHOLD,
            admission: Vec::new(),
        }
    }
}

/// Everything a request needs.
#[derive(Debug)]
pub struct App {
    pub store: Arc<dyn Store>,
    pub resources: Arc<Resources>,
    pub schemas: Arc<Schemas>,
    pub auth: Arc<Authenticator>,
    /// Who may do what: RBAC over the built-in rules (rbac.rs).
    pub authz: Arc<crate::rbac::Authorizer>,
    pub config: ApiConfig,
    /// Becomes `true` when the server is shutting down; long requests end.
    pub shutdown: watch::Receiver<bool>,
    pub(crate) openapi: openapi::Cache,
    crd_lock: tokio::sync::Mutex<()>,
    /// Registrations carried out at once; more are told to come back (429), so that a fleet
    /// registering together does not crowd out the heartbeats of clusters already in.
    pub registrations: tokio::sync::Semaphore,
    pub metrics: crate::metrics::Metrics,
    /// Seats for requests in flight, by priority level: read-only, mutating (see
    /// [`ApiConfig::max_in_flight`]); `None` where there is no limit.
    pub(crate) in_flight: (
        Option<Arc<crate::fairness::Seats>>,
        Option<Arc<crate::fairness::Seats>>,
    ),
    /// Watches open, by user (see [`ApiConfig::max_watches_per_user`]).
    pub(crate) watches: Arc<parking_lot::Mutex<std::collections::HashMap<String, usize>>>,
    /// The cluster proxy's tunnels open to this server (`proxy/`).
    pub tunnels: crate::tunnels::Tunnels,
}

/// Requests served at once by default: read-only, mutating, as kube-apiserver's defaults.
pub const DEFAULT_MAX_REQUESTS_INFLIGHT: usize = 400;
pub const DEFAULT_MAX_MUTATING_REQUESTS_INFLIGHT: usize = 200;
/// Watches one user may hold open at once by default.
pub const DEFAULT_MAX_WATCHES_PER_USER: usize = 1000;
/// How long a request's body may take to arrive by default (kube-apiserver's request
/// timeout).
pub const DEFAULT_REQUEST_BODY_TIMEOUT: Duration = Duration::from_secs(60);
/// Kubernetes logs a trace of a request that took longer than this.
pub const DEFAULT_SLOW_REQUEST_THRESHOLD: Duration = Duration::from_millis(500);

pub use crate::auth::CACHE_TOLERANCE;

/// How many registrations one server carries out at once.
pub const CONCURRENT_REGISTRATIONS: usize = 32;

/// The seats for a limit (0: no limit).
fn seats_of(n: usize, config: &ApiConfig) -> Option<Arc<crate::fairness::Seats>> {
    (n > 0)
        .then(|| crate::fairness::Seats::new(n, config.max_queued_per_user, config.queue_timeout))
}

/// Namespaces that always exist.
pub const SYSTEM_NAMESPACES: &[&str] = &[
    "default",
    "kube-system",
    "kube-public",
    "orrery-system",
    orrery_api::cluster::LEASE_NAMESPACE,
    orrery_api::cluster::PROXY_NAMESPACE,
];

impl App {
    /// The CA bundle clients are to trust (PEM; empty where the server holds no CA).
    pub fn ca_bundle(&self) -> String {
        self.config
            .authority
            .as_ref()
            .map(|a| a.current().bundle.clone())
            .unwrap_or_default()
    }

    /// What signs users' and replicas' client certificates, where the server holds a CA.
    pub fn user_issuer(&self) -> Option<Arc<crate::pki::UserIssuer>> {
        self.config
            .authority
            .as_ref()
            .map(|a| a.current().issuer.clone())
    }

    /// Builds the application over a store: loads the CRD-defined kinds.
    pub async fn new(
        store: Arc<dyn Store>,
        auth: Arc<Authenticator>,
        config: ApiConfig,
        shutdown: watch::Receiver<bool>,
    ) -> Result<Arc<App>, StoreError> {
        let metrics =
            crate::metrics::Metrics::new(config.metrics_registry.clone().unwrap_or_default());
        metrics.start(store.clone()).await?;
        let in_flight = (
            seats_of(config.max_in_flight.0, &config),
            seats_of(config.max_in_flight.1, &config),
        );
        let authz = crate::rbac::Authorizer::start(store.clone()).await?;
        let app = Arc::new(App {
            authz,
            metrics,
            store,
            resources: Arc::new(Resources::new()),
            schemas: Arc::new(Schemas::new()),
            auth,
            config,
            shutdown,
            openapi: openapi::Cache::default(),
            crd_lock: tokio::sync::Mutex::new(()),
            registrations: tokio::sync::Semaphore::new(CONCURRENT_REGISTRATIONS),
            in_flight,
            watches: Arc::default(),
            tunnels: crate::tunnels::Tunnels::default(),
        });
        app.refresh_crds().await?;
        Ok(app)
    }

    /// Serves what the stored CRDs define from now on, whichever replica wrote them: every
    /// replica runs this (a CRD written through another replica is served here once its
    /// watch brings it).
    pub fn follow_crds(
        self: &Arc<Self>,
        metrics: orrery_runtime::metrics::Handle,
        shutdown: watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        use orrery_runtime::controller::{Controller, Source};
        let prefix =
            orrery_api::keys::prefix("apiextensions.k8s.io", "customresourcedefinitions", None);
        let c = Controller::new(
            "served-kinds",
            self.store.clone(),
            ServedKinds(self.clone()),
            metrics,
        )
        .source(Source::new("crds", prefix));
        tokio::spawn(c.run(shutdown))
    }

    /// Re-reads every CRD and serves exactly the kinds they define.
    pub async fn refresh_crds(&self) -> Result<(), StoreError> {
        let _one_at_a_time = self.crd_lock.lock().await;
        let reg = self.resources.snapshot();
        let Some(crd_rt) = reg.get("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        else {
            return Ok(());
        };
        let list = self
            .store
            .list(&crd_rt.prefix(None), &ListOptions::default())
            .await?;
        let mut types = Vec::new();
        let mut components = crate::schema::Components::new();
        for crd in &list.items {
            for (rt, schema) in crate::crd::types_of(crd) {
                components.insert(rt.schema.clone(), schema);
                types.push(rt);
            }
        }
        self.resources.set_custom(types);
        self.schemas.set_custom(components);
        self.openapi.invalidate();
        Ok(())
    }

    /// Writes the default roles and bindings that are missing or out of date
    /// ([`crate::rbac::defaults`]).
    pub async fn ensure_default_roles(&self) -> Result<usize, StoreError> {
        let reg = self.resources.snapshot();
        let n = crate::rbac::defaults::ensure(self.store.as_ref(), |obj, new| {
            if new && let Some(rt) = reg.by_kind(crate::rbac::GROUP, &obj.kind) {
                crate::strategy::prepare_create(&rt, obj);
            }
        })
        .await?;
        if n > 0 {
            tracing::info!(written = n, "wrote the default RBAC roles and bindings");
        }
        Ok(n)
    }

    /// Stores the read-only CRDs describing Orrery's own kinds. One is rewritten only when
    /// what it says has changed (a new version of Orrery), so a restart writes nothing.
    pub async fn ensure_own_crds(&self) -> Result<(), StoreError> {
        let reg = self.resources.snapshot();
        let Some(crd_rt) = reg.get("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        else {
            return Ok(());
        };
        let set = self.schemas.set();
        // One CRD per kind, from its storage version (it lists the older ones too).
        let own = crate::resources::builtin()
            .into_iter()
            .filter(|t| t.origin == crate::resources::Origin::Own && t.stored_as.is_none());
        for rt in own {
            let Some(mut want) = crate::crd::for_own_kind(&rt, &set) else {
                continue;
            };
            crate::strategy::prepare_create(&crd_rt, &mut want);
            let key = crd_rt.key("", want.name());
            match self.store.get(&key).await {
                Ok(current) => {
                    if current.spec == want.spec && current.metadata.labels == want.metadata.labels
                    {
                        continue;
                    }
                    let mut next = current.clone();
                    next.spec = want.spec.take();
                    next.metadata.labels = want.metadata.labels.clone();
                    next.metadata.generation = Some(current.metadata.generation.unwrap_or(1) + 1);
                    next.status = Some(crate::crd::status(&next, current.status.as_ref()));
                    match self.store.update(&key, next, current.revision()).await {
                        // Another server wrote it first: the same content.
                        Ok(_) | Err(StoreError::Conflict { .. }) => {}
                        Err(e) => return Err(e),
                    }
                }
                Err(StoreError::NotFound { .. }) => {
                    orrery_store::stamp::stamp_new(&mut want.metadata);
                    want.status = Some(crate::crd::status(&want, None));
                    match self.store.create(&key, want).await {
                        Ok(_) | Err(StoreError::AlreadyExists { .. }) => {}
                        Err(e) => return Err(e),
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Creates the system namespaces that are missing.
    pub async fn ensure_namespaces(&self) -> Result<(), StoreError> {
        let reg = self.resources.snapshot();
        let Some(ns_rt) = reg.get("", "v1", "namespaces") else {
            return Ok(());
        };
        for name in SYSTEM_NAMESPACES {
            let mut ns = Object::new("v1", "Namespace").with_name(*name);
            orrery_store::stamp::stamp_new(&mut ns.metadata);
            crate::strategy::prepare_create(&ns_rt, &mut ns);
            match self.store.create(&ns_rt.key("", name), ns).await {
                Ok(_) | Err(StoreError::AlreadyExists { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// The one key of [`App::follow_crds`]: the kinds served.
struct ServedKinds(Arc<App>);

#[async_trait::async_trait]
impl orrery_runtime::controller::Reconciler for ServedKinds {
    type Key = ();
    type Error = StoreError;

    fn on_event(
        &mut self,
        _: orrery_runtime::controller::Origin,
        _: orrery_runtime::Event,
        keys: &mut orrery_runtime::controller::Keys<()>,
    ) {
        // Any change of a CRD may change what is served.
        keys.push(());
    }

    async fn reconcile(&self, _: &()) -> Result<orrery_runtime::controller::Action, StoreError> {
        self.0.refresh_crds().await?;
        Ok(orrery_runtime::controller::Action::Done)
    }
}
