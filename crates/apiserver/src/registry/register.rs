//! Registering a member cluster: the agent API's one write, as a typed operation. The
//! registration is authorized by the token's scope (a bootstrap token names the clusters it
//! may register, an agent's token its own), not by RBAC; the Cluster goes through the same
//! admission as any write (`validate_object`), its namespace is made, and the cluster's
//! earlier agent tokens are retired for a new one.

use orrery_api::cluster::{self, CONDITION_JOINED, Registration};
use orrery_api::conditions::{self, Condition};
use orrery_api::{Object, Time, keys};
use orrery_store::{Store, StoreError};
use serde_json::{Value, json};

use crate::app::App;
use crate::auth::Identity;
use crate::error::{ApiError, ApiResult};
use crate::resources::ResourceType;
use crate::strategy;

/// Leave to register one cluster.
#[derive(Debug)]
pub struct RegistrationGrant {
    cluster: String,
    by: String,
    /// Granted by a bootstrap token: it takes no cluster from an agent that is connected.
    bootstrap: bool,
}

/// Whether a bootstrap token for `pattern` (a name, or a prefix ending in `*`) may register
/// `cluster`.
pub fn token_covers(pattern: &str, cluster: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => cluster.starts_with(prefix),
        None => pattern == cluster,
    }
}

/// Whether `who` may register `cluster`: the admin, that cluster's agent, or a bootstrap token
/// whose pattern covers it.
pub fn authorize(who: &Identity, cluster: &str) -> ApiResult<RegistrationGrant> {
    let allowed = match who {
        _ if who.is_superuser() => true,
        Identity::Cluster { name } => name == cluster,
        Identity::Bootstrap { name } => token_covers(name, cluster),
        _ => false,
    };
    if !allowed {
        return Err(ApiError::forbidden(format!(
            "User \"{}\" cannot register cluster \"{cluster}\": the token is for another cluster",
            who.user()
        )));
    }
    Ok(RegistrationGrant {
        cluster: cluster.to_string(),
        by: who.user(),
        bootstrap: matches!(who, Identity::Bootstrap { .. }),
    })
}

/// How long ago the cluster's agent was last heard from, if that is within its heartbeat
/// Lease's duration (its agent is connected): its last renewal of the Lease, or its
/// registration (a new agent's first renewal is a heartbeat away).
async fn connected_agent(app: &App, cluster: &str) -> ApiResult<Option<std::time::Duration>> {
    let lease = match app
        .store
        .get(&keys::well_known::cluster_lease(cluster))
        .await
    {
        Ok(l) => Some(l),
        Err(StoreError::NotFound { .. }) => None,
        Err(e) => return Err(e.into()),
    };
    let window_ms = 1000
        * lease
            .as_ref()
            .and_then(|l| l.spec.as_ref())
            .and_then(|s| s.get("leaseDurationSeconds"))
            .and_then(Value::as_u64)
            .unwrap_or(40);
    let now = orrery_api::MicroTime::from(Time::now());
    let renewed = lease
        .as_ref()
        .and_then(|l| cluster::LeaseBeat::of(l).renew_time);
    let registered = app
        .auth
        .newest_agent_token(cluster)
        .await?
        .map(orrery_api::MicroTime::from);
    let heard = match (renewed, registered) {
        (Some(a), Some(b)) => a.max(b),
        (a, b) => match a.or(b) {
            Some(t) => t,
            None => return Ok(None),
        },
    };
    let ago = now.millis_since(heard).max(0) as u64;
    Ok((ago < window_ms).then(|| std::time::Duration::from_millis(ago)))
}

/// What a registration made: the Cluster as stored and the new agent's token.
#[derive(Debug)]
pub struct Registered {
    pub cluster: Object,
    pub token: String,
    /// When the token stops working (`--cluster-token-ttl`); `None`: it does not expire.
    pub expires: Option<Time>,
}

/// When a token made now for `ttl` expires.
pub fn expiry(ttl: Option<std::time::Duration>) -> Option<Time> {
    ttl.and_then(|t| Time::from_unix_seconds(Time::now().unix_seconds() + t.as_secs() as i64))
}

/// Registers the cluster `grant` names, as `req` describes it.
pub async fn register(
    app: &App,
    grant: RegistrationGrant,
    req: &Registration,
) -> ApiResult<Registered> {
    if req.cluster != grant.cluster {
        return Err(ApiError::forbidden(format!(
            "the registration is for cluster {:?}, the grant for {:?}",
            req.cluster, grant.cluster
        )));
    }
    let rt = app
        .resources
        .snapshot()
        .get(cluster::GROUP, cluster::VERSION, "clusters")
        .ok_or_else(|| ApiError::internal("the Cluster kind is not registered"))?;
    let errs = cluster::validate_name(&req.cluster);
    if !errs.is_empty() {
        return Err(ApiError::invalid(&rt, &req.cluster, &errs));
    }
    // A Push cluster is refused for good (the agent stops), ahead of the connected check: the
    // server's own driving of it beats like an agent.
    if let Ok(current) = app
        .store
        .get(&keys::well_known::cluster(&req.cluster))
        .await
        && current
            .spec
            .as_ref()
            .and_then(|s| s.get("syncMode"))
            .and_then(Value::as_str)
            == Some("Push")
    {
        return Err(push_refused(&req.cluster));
    }
    // A bootstrap token joins a cluster; it does not take one from an agent that runs it (two
    // agents would take the identity back and forth until the token expired).
    if grant.bootstrap
        && let Some(ago) = connected_agent(app, &req.cluster).await?
    {
        let mut e = ApiError::conflict(
            &rt,
            &req.cluster,
            &format!(
                "its agent is connected (last heartbeat {:.0}s ago): a bootstrap token registers a cluster whose agent is not running; stop that agent (this one is let in once its heartbeat lapses), or unregister the cluster first",
                ago.as_secs_f64()
            ),
        );
        e.details_mut().retry_after_seconds = Some(5);
        return Err(e);
    }
    let obj = upsert_cluster(app, &rt, req).await?;
    ensure_cluster_namespace(app, app.store.as_ref(), &req.cluster).await?;
    // One agent per cluster: a new registration retires the tokens of the previous one.
    app.auth
        .revoke_cluster(&req.cluster, crate::auth::Revoke::Retire)
        .await?;
    let token = app
        .auth
        .issue(
            &Identity::Cluster {
                name: req.cluster.clone(),
            },
            &format!("agent token for cluster {}", req.cluster),
            app.config.cluster_token_ttl,
        )
        .await?;
    tracing::info!(cluster = %req.cluster, by = %grant.by, "cluster registered");
    Ok(Registered {
        cluster: obj,
        token,
        expires: expiry(app.config.cluster_token_ttl),
    })
}

/// An agent may not register a Push cluster: not a conflict to wait out (the agent would try
/// again for ever), a refusal.
fn push_refused(cluster: &str) -> ApiError {
    ApiError::forbidden(format!(
        "cluster {cluster:?} is a Push cluster, which the server drives itself; agents serve Pull clusters"
    ))
}

/// A Pull Cluster's spec fields from what its agent says.
fn agent_spec(req: &Registration) -> serde_json::Map<String, Value> {
    let mut spec = serde_json::Map::new();
    spec.insert("syncMode".into(), json!("Pull"));
    req.facts.apply_to_spec(&mut spec);
    spec
}

fn joined(now: Time) -> Vec<Condition> {
    let mut cs = Vec::new();
    conditions::set(
        &mut cs,
        Condition::new(
            CONDITION_JOINED,
            conditions::TRUE,
            "AgentRegistered",
            "the cluster's agent registered",
        ),
        now,
    );
    cs
}

/// Creates the Cluster, or refreshes what the agent reports about it.
async fn upsert_cluster(app: &App, rt: &ResourceType, req: &Registration) -> ApiResult<Object> {
    let key = keys::well_known::cluster(&req.cluster);
    let now = Time::now();
    for _ in 0..8 {
        match app.store.get(&key).await {
            Ok(current) => {
                if current.metadata.deletion_timestamp.is_some() {
                    return Err(ApiError::conflict(
                        rt,
                        &req.cluster,
                        "the cluster is being unregistered; register it again once it is gone",
                    ));
                }
                let mode = current
                    .spec
                    .as_ref()
                    .and_then(|s| s.get("syncMode"))
                    .and_then(Value::as_str)
                    .unwrap_or("Pull");
                if mode == "Push" {
                    return Err(push_refused(&req.cluster));
                }
                let mut next = current.clone();
                let spec = next
                    .spec
                    .get_or_insert_with(|| json!({}))
                    .as_object_mut()
                    .ok_or_else(|| {
                        ApiError::internal("the stored Cluster spec is not an object")
                    })?;
                for (k, v) in agent_spec(req) {
                    spec.insert(k, v);
                }
                next.metadata.labels.extend(req.facts.labels.clone());
                let mut status: cluster::ClusterStatus = next
                    .status
                    .clone()
                    .and_then(|s| serde_json::from_value(s).ok())
                    .unwrap_or_default();
                for c in joined(now) {
                    conditions::set(&mut status.conditions, c, now);
                }
                next.status = serde_json::to_value(&status).ok();
                next.metadata.generation =
                    Some(orrery_store::stamp::next_generation(&current, &next));
                super::validate_object(app, rt, &next, Some(&current))?;
                match app.store.update(&key, next, current.revision()).await {
                    Ok(o) => return Ok((*o).clone()),
                    Err(StoreError::Conflict { .. }) => continue,
                    Err(e) => return Err(ApiError::from_store(e, rt, &req.cluster)),
                }
            }
            Err(StoreError::NotFound { .. }) => {
                let mut obj = Object::new(cluster::API_VERSION, "Cluster")
                    .with_name(&req.cluster)
                    .with_spec(Value::Object(agent_spec(req)));
                obj.metadata.labels = req.facts.labels.clone();
                orrery_store::stamp::stamp_new(&mut obj.metadata);
                strategy::prepare_create(rt, &mut obj);
                obj.status = serde_json::to_value(cluster::ClusterStatus {
                    conditions: joined(now),
                    ..Default::default()
                })
                .ok();
                super::validate_object(app, rt, &obj, None)?;
                match app.store.create(&key, obj).await {
                    Ok(o) => return Ok((*o).clone()),
                    Err(StoreError::AlreadyExists { .. }) => continue,
                    Err(e) => return Err(ApiError::from_store(e, rt, &req.cluster)),
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(ApiError::stale(rt, &req.cluster))
}

/// Creates the namespace that holds a cluster's Works, if it is missing.
/// Writes through `store` (the leader's fenced store, when a controller asks).
pub async fn ensure_cluster_namespace(
    app: &App,
    store: &dyn Store,
    cluster_name: &str,
) -> ApiResult<()> {
    let reg = app.resources.snapshot();
    let ns_rt = reg
        .get("", "v1", "namespaces")
        .ok_or_else(|| ApiError::internal("the Namespace kind is not registered"))?;
    let name = cluster::namespace_of(cluster_name);
    let key = keys::well_known::namespace(&name);
    match store.get(&key).await {
        Ok(ns) if ns.metadata.deletion_timestamp.is_some() => Err(ApiError::conflict(
            &ns_rt,
            &name,
            "the namespace of the cluster's Works is still being deleted; retry shortly",
        )),
        Ok(_) => Ok(()),
        Err(StoreError::NotFound { .. }) => {
            let mut ns = Object::new("v1", "Namespace")
                .with_name(&name)
                .with_label("multicluster.io/cluster", cluster_name);
            orrery_store::stamp::stamp_new(&mut ns.metadata);
            strategy::prepare_create(&ns_rt, &mut ns);
            match store.create(&key, ns).await {
                Ok(_) | Err(StoreError::AlreadyExists { .. }) => Ok(()),
                Err(e) => Err(e.into()),
            }
        }
        Err(e) => Err(e.into()),
    }
}
