//! A session: registration or the stored token, the connection, and the loops that run
//! side by side until one ends it (Works, heartbeats, reports, tunnel, token renewal, CA
//! refresh); between sessions, backoff with jitter.

use super::*;

pub(super) async fn sleep_or_shutdown(d: Duration, shutdown: &mut watch::Receiver<bool>) -> bool {
    if *shutdown.borrow() {
        return true;
    }
    tokio::select! {
        _ = tokio::time::sleep(d) => false,
        _ = shutdown.changed() => true,
    }
}

/// The longest a fleet member holds its place among those setting up a session: a server
/// that never answers must not keep the rest of the fleet waiting.
pub(super) const SETTING_UP: Duration = Duration::from_secs(15);

/// Holds a fleet's permit to set up a session until the returned sender is dropped, or
/// [`SETTING_UP`] at most.
pub(super) fn hold_while_setting_up(
    permit: tokio::sync::OwnedSemaphorePermit,
) -> tokio::sync::oneshot::Sender<()> {
    let (done, set_up) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let _ = tokio::time::timeout(SETTING_UP, set_up).await;
        drop(permit);
    });
    done
}

/// Runs one agent until it is shut down, its cluster is unregistered, or it cannot go on.
pub async fn run(
    cfg: AgentConfig,
    backend: Arc<dyn Backend>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<Stopped, AgentError> {
    let mut state = cfg.state.load().await?;
    if state.cluster != cfg.cluster {
        // A state file of another cluster (or none): start afresh.
        state = AgentState {
            cluster: cfg.cluster.clone(),
            ..Default::default()
        };
    }
    state.server = cfg.server.clone();
    let inner = Arc::new(Inner::new(cfg, backend, state));
    inner.resume().await;
    inner.flush_state().await;
    let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
    let result = loop {
        if *shutdown.borrow() {
            break Ok(Stopped::Shutdown);
        }
        let setting_up = match &inner.cfg.connecting {
            Some(limit) => tokio::select! {
                p = limit.clone().acquire_owned() => p.ok().map(hold_while_setting_up),
                _ = shutdown.changed() => break Ok(Stopped::Shutdown),
            },
            None => None,
        };
        if let Some(h) = &inner.cfg.health {
            h.attempt();
        }
        let end = match connect(&inner).await {
            Ok(client) => {
                let end = session(&inner, client, &mut shutdown, &mut backoff, setting_up).await;
                if let Some(h) = &inner.cfg.health {
                    h.set_session(false);
                }
                end
            }
            Err(e) => e,
        };
        match end {
            End::Stopped(s) => break Ok(s),
            End::Renewed => {
                tracing::info!(cluster = %inner.cfg.cluster, "renewed the cluster token; connecting with it");
            }
            End::NewTrust => {
                tracing::info!(cluster = %inner.cfg.cluster, "the server's CA bundle changed; connecting with it");
            }
            End::Fatal(e) => break Err(e),
            End::Revoked => {
                if inner.cfg.bootstrap_token.is_none() || inner.cfg.cluster_token.is_some() {
                    break Err(AgentError::Revoked(inner.cfg.cluster.clone()));
                }
                tracing::warn!(cluster = %inner.cfg.cluster, "the agent token was refused; registering again with the bootstrap token");
                if let Some(h) = &inner.cfg.health {
                    h.set_registered(false);
                }
                inner.lock_state().token.clear();
                inner.mark_dirty();
            }
            End::Transient(why) => {
                let d = backoff.delay();
                let failed = inner.server();
                // Another replica, if there are several: the next attempt goes there.
                inner.current.fetch_add(1, Ordering::AcqRel);
                tracing::warn!(cluster = %inner.cfg.cluster, server = %failed, next = %inner.server(), error = %why, retry_in_ms = d.as_millis() as u64, "lost the server; the member keeps running what it has");
                if sleep_or_shutdown(d, &mut shutdown).await {
                    break Ok(Stopped::Shutdown);
                }
            }
        }
    };
    if matches!(result, Ok(Stopped::Unregistered)) {
        tracing::info!(cluster = %inner.cfg.cluster, "the cluster was unregistered; removing what it ran and stopping");
        inner.forget_everything().await;
    } else {
        inner.flush_state().await;
    }
    result
}

/// A client holding the cluster token, registering first if there is none.
pub(super) async fn connect(inner: &Inner) -> Result<kube::Client, End> {
    let cfg = &inner.cfg;
    if let Some(token) = &cfg.cluster_token {
        return orrery_client::connect(&inner.server(), token, &inner.trusted_ca())
            .await
            .map_err(|e| End::Transient(e.to_string()));
    }
    let (token, ca) = {
        let s = inner.lock_state();
        (s.token.clone(), s.ca_pem.clone())
    };
    if !token.is_empty() && !ca.is_empty() {
        if let Some(h) = &cfg.health {
            h.set_registered(true);
        }
        return orrery_client::connect(&inner.server(), &token, &ca)
            .await
            .map_err(|e| End::Transient(e.to_string()));
    }
    let fatal = |message: String| {
        End::Fatal(AgentError::Bootstrap {
            cluster: cfg.cluster.clone(),
            message,
        })
    };
    let Some(bootstrap) = cfg.bootstrap_token.clone() else {
        return Err(fatal(
            "no agent token is stored and no bootstrap token was given (--token)".into(),
        ));
    };
    let (pinned, credential) = orrery_api::token::parse(&bootstrap);
    let ca = match (&cfg.ca_pem, pinned) {
        (Some(pem), Some(hash)) if orrery_api::token::ca_hash(pem) != hash => {
            return Err(fatal(
                "the CA file does not match the CA hash in the token".into(),
            ));
        }
        (Some(pem), _) => pem.clone(),
        (None, Some(hash)) => {
            let fetched = orrery_client::fetch_ca_unverified(&inner.server())
                .await
                .map_err(|e| End::Transient(format!("fetching the server's CA: {e}")))?;
            // Only what the token pins is trusted; during a CA rotation the rest of the
            // bundle is learnt over the verified connection later.
            let Some(trusted) = orrery_api::token::trusted_part(&fetched, hash) else {
                return Err(fatal(format!(
                    "the server at {} presented a CA that does not match the token's CA hash; refusing to trust it (a token minted before a CA switch pins a CA that is gone: mint a new one)",
                    inner.server()
                )));
            };
            tracing::debug!(server = %inner.server(), "fetched the server's CA without verifying the connection; it matches the hash the token pins");
            trusted
        }
        (None, None) => {
            return Err(fatal(
                "the token carries no CA hash; pass the server's CA with --ca-file".into(),
            ));
        }
    };
    let client = orrery_client::connect(&inner.server(), credential, &ca)
        .await
        .map_err(|e| End::Transient(e.to_string()))?;
    let request = Registration {
        cluster: cfg.cluster.clone(),
        facts: cfg.info.clone(),
    };
    let reg = match transport::register(&client, &request).await {
        Ok(r) => r,
        Err(e) if e.is_transient() => return Err(End::Transient(e.to_string())),
        // Another agent runs the cluster: this one is let in once that one's heartbeat
        // lapses (a replacement started before the old one's lease ran out).
        Err(TransportError::Conflict(m)) => {
            tracing::warn!(cluster = %cfg.cluster, reason = %m, "the server refused to register this agent while another runs the cluster; trying again");
            return Err(End::Transient(m));
        }
        Err(e) => return Err(fatal(e.to_string())),
    };
    tracing::info!(cluster = %cfg.cluster, uid = %reg.uid, namespace = %reg.namespace, "registered");
    if let Some(h) = &cfg.health {
        h.set_registered(true);
    }
    {
        let mut s = inner.lock_state();
        s.token = reg.token.clone();
        s.ca_pem = ca.clone();
        s.token_issued = Some(orrery_api::Time::now());
        s.token_expires = reg.expires;
    }
    inner.mark_dirty();
    inner.flush_state().await;
    orrery_client::connect(&inner.server(), &reg.token, &ca)
        .await
        .map_err(|e| End::Transient(e.to_string()))
}

pub(super) async fn session(
    inner: &Arc<Inner>,
    client: kube::Client,
    shutdown: &mut watch::Receiver<bool>,
    backoff: &mut Backoff,
    setting_up: Option<tokio::sync::oneshot::Sender<()>>,
) -> End {
    let t = Transport::new(client, &inner.cfg.cluster);
    let mut conds: Vec<Condition> = Vec::new();
    let mut beats = Beats::default();
    // The first heartbeat writes the status: it proves the token and makes the cluster
    // Ready at once.
    match beat_in_time(inner, &t, &mut conds, &mut beats).await {
        Some(Ok(None)) => {}
        Some(Ok(Some(s))) => return End::Stopped(s),
        Some(Err(e)) => return e,
        None => {
            return End::Transient("the session's first heartbeat had no answer in time".into());
        }
    }
    drop(setting_up);
    backoff.reset();
    if let Some(h) = &inner.cfg.health {
        h.set_session(true);
    }
    tracing::info!(cluster = %inner.cfg.cluster, server = %inner.server(), "connected");
    let works = works_loop(inner, &t);
    let beats = heartbeat_loop(inner, &t, conds, beats);
    let reports = report_loop(inner, &t);
    let tunnel = tunnel_loop(inner, &t);
    let renewal = renew_loop(inner, &t);
    let trust = ca_loop(inner, &t);
    tokio::pin!(works, beats, reports, tunnel, renewal, trust);
    tokio::select! {
        e = &mut renewal => e,
        e = &mut trust => e,
        e = &mut works => e,
        e = &mut beats => e,
        e = &mut reports => e,
        e = &mut tunnel => e,
        _ = shutdown.changed() => End::Stopped(Stopped::Shutdown),
    }
}

/// Renews the cluster token a third of its life before it expires (kept in the state before
/// it is used), then ends the session so the next one connects with it. Never ends for a
/// token that does not expire.
pub(super) async fn renew_loop(inner: &Arc<Inner>, t: &Transport) -> End {
    loop {
        let due = {
            let s = inner.lock_state();
            match (s.token_issued, s.token_expires) {
                (Some(issued), Some(expires)) => {
                    let life = expires.unix_seconds() - issued.unix_seconds();
                    Some(expires.unix_seconds() - life / 3)
                }
                // Issued before its lifetime was kept: renew once less than a day is left.
                (None, Some(expires)) => Some(expires.unix_seconds() - 86_400),
                _ => None,
            }
        };
        let Some(due) = due else {
            return std::future::pending().await;
        };
        let wait = due - orrery_api::Time::now().unix_seconds();
        if wait > 0 {
            tokio::time::sleep(Duration::from_secs(wait.min(60) as u64)).await;
            continue;
        }
        match t.renew().await {
            Ok(r) => {
                {
                    let mut s = inner.lock_state();
                    s.token = r.token;
                    s.token_issued = Some(orrery_api::Time::now());
                    s.token_expires = r.expires;
                }
                inner.mark_dirty();
                inner.flush_state().await;
                return End::Renewed;
            }
            Err(TransportError::Unauthorized(_)) => return End::Revoked,
            Err(e) => {
                tracing::warn!(cluster = %inner.cfg.cluster, error = %e, "renewing the cluster token; trying again shortly");
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        }
    }
}

/// Reads the server's CA bundle every `ca_refresh` (spread over the fleet by the cluster's
/// name) and, when it changed, keeps it and ends the session so that the next one trusts it.
/// The connection it is read over was verified with the bundle held, so the new one is the
/// server's.
pub(super) async fn ca_loop(inner: &Arc<Inner>, t: &Transport) -> End {
    let every = inner.cfg.ca_refresh.max(Duration::from_millis(100));
    // A fixed offset per cluster: a fleet that connected together does not ask together.
    let spread = inner
        .cfg
        .cluster
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        });
    let first = every.mul_f64(0.5 + (spread % 1000) as f64 / 2000.0);
    tokio::time::sleep(first).await;
    loop {
        match t.ca_bundle().await {
            Ok(bundle) => {
                if bundle != inner.trusted_ca() {
                    if orrery_client::pem_certificates(&bundle).is_empty() {
                        tracing::warn!(cluster = %inner.cfg.cluster, "the server's CA bundle holds no certificate; keeping the one held");
                    } else {
                        tracing::info!(
                            cluster = %inner.cfg.cluster,
                            certificates = orrery_client::pem_certificates(&bundle).len(),
                            "the server hands out a new CA bundle; trusting it from now on"
                        );
                        inner.lock_state().ca_pem = bundle;
                        inner.mark_dirty();
                        inner.flush_state().await;
                        return End::NewTrust;
                    }
                }
            }
            Err(TransportError::Unauthorized(_)) => return End::Revoked,
            Err(e) => {
                tracing::debug!(cluster = %inner.cfg.cluster, error = %e, "reading the server's CA bundle; trying again at the next refresh");
            }
        }
        tokio::time::sleep(every).await;
    }
}
