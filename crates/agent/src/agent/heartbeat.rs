//! Heartbeats: the member Lease renewed, the Cluster's status written when it says something
//! new, the member's figures (ClusterMetrics), and the cluster token renewed ahead of expiry.

use super::*;

pub(super) fn cluster_status(
    report: &Result<MemberReport, BackendError>,
    conds: &mut Vec<Condition>,
    now: Time,
    push: bool,
    server_latency: Option<f64>,
    ca_bundle_hash: &str,
) -> Value {
    let ready = match report {
        Ok(r) if r.healthy => Condition::new(
            CONDITION_READY,
            conditions::TRUE,
            "MemberHealthy",
            r.message.clone(),
        ),
        Ok(r) => Condition::new(
            CONDITION_READY,
            conditions::FALSE,
            "MemberUnhealthy",
            r.message.clone(),
        ),
        Err(e) => Condition::new(
            CONDITION_READY,
            conditions::FALSE,
            "MemberUnreachable",
            e.to_string(),
        ),
    };
    conditions::set(conds, ready, now);
    let joined = if push {
        Condition::new(
            CONDITION_JOINED,
            conditions::TRUE,
            "PushConnected",
            "the server reaches the cluster's API",
        )
    } else {
        Condition::new(
            CONDITION_JOINED,
            conditions::TRUE,
            "AgentRegistered",
            "the cluster's agent is connected",
        )
    };
    conditions::set(conds, joined, now);
    let mut status = json!({
        "conditions": conds,
        "lastHeartbeatTime": now.to_string(),
        "caBundleHash": ca_bundle_hash,
    });
    if let Ok(r) = report {
        let s = &mut status;
        s["kubernetesVersion"] = json!(r.kubernetes_version);
        s["apiEnablements"] = json!(r.api_enablements);
        s["nodeSummary"] = json!(r.node_summary);
        s["resourceSummary"] = json!(r.resource_summary);
        s["largestNodeFree"] = json!(r.largest_node_free);
        if let Some(n) = &r.network {
            s["network"] = json!(n);
        }
        if let Some(l) = server_latency {
            if !s["network"].is_object() {
                s["network"] = json!({});
            }
            s["network"]["serverLatencyMs"] = json!(l);
        }
        s["properties"] = json!(r.properties);
        // A list the member no longer holds anything in is removed (`null` in the merge
        // patch): its last ServiceExport withdrawn, its last data set gone. A member that
        // could not be read sends none of these, and its last figures stay.
        let listed = |v: Value| {
            if v.as_array().is_some_and(|a| !a.is_empty()) {
                v
            } else {
                Value::Null
            }
        };
        s["storageClasses"] = listed(json!(r.storage_classes));
        s["dataSets"] = listed(json!(r.data_sets));
        s["serviceExports"] = listed(json!(r.service_exports));
        if s.get("network").is_none() {
            s["network"] = Value::Null;
        }
    }
    status
}

/// How long heartbeats go sending only what differs from the server's answer before one
/// writes every field of the agent's again (mends what another writer changed unseen).
pub(super) const FULL_STATUS_EVERY: Duration = Duration::from_secs(60);

/// The merge patch (RFC 7386) of the status that makes the server's `has` say `want`: as
/// kubelet patches a Node's status with the difference, a beat where only the usage moved
/// sends the usage, not the API list and properties that did not change (a Cluster's status
/// is several KB, parsed, validated and merged at every beat). Without `has`, `want` whole.
/// A field `want` holds as `null` (a list the member emptied) is removed; one it leaves out
/// is left as it is (the server's own, and the last figures of a member that could not be
/// read). The conditions and the beat's time are always sent: the server changes conditions
/// too (a member gone quiet is made Unknown), and a beat answered from a stale `has` must
/// still set them.
pub(super) fn status_patch(has: Option<&Value>, want: &Value) -> Value {
    let (Some(h), Some(w)) = (has.and_then(Value::as_object), want.as_object()) else {
        return want.clone();
    };
    let mut out = serde_json::Map::new();
    for (k, wv) in w {
        let always = k == "conditions" || k == "lastHeartbeatTime";
        match h.get(k) {
            _ if wv.is_null() => {
                if h.contains_key(k) {
                    out.insert(k.clone(), Value::Null);
                }
            }
            Some(hv) if !always => {
                if let Some(d) = merge_diff(hv, wv) {
                    out.insert(k.clone(), d);
                }
            }
            _ => {
                out.insert(k.clone(), wv.clone());
            }
        }
    }
    Value::Object(out)
}

/// The merge patch that takes `has` to `want` (`None`: they are the same). Objects are
/// compared member by member, anything else whole (a merge patch replaces arrays).
fn merge_diff(has: &Value, want: &Value) -> Option<Value> {
    match (has, want) {
        (Value::Object(h), Value::Object(w)) => {
            let mut out = serde_json::Map::new();
            for (k, wv) in w {
                match h.get(k) {
                    _ if wv.is_null() => {
                        if h.contains_key(k) {
                            out.insert(k.clone(), Value::Null);
                        }
                    }
                    Some(hv) => {
                        if let Some(d) = merge_diff(hv, wv) {
                            out.insert(k.clone(), d);
                        }
                    }
                    None => {
                        out.insert(k.clone(), wv.clone());
                    }
                }
            }
            for k in h.keys() {
                if !w.contains_key(k) {
                    out.insert(k.clone(), Value::Null);
                }
            }
            (!out.is_empty()).then_some(Value::Object(out))
        }
        _ => (has != want).then(|| want.clone()),
    }
}

/// How long a status that has not changed goes unwritten at most: the Lease's renewals stand
/// for it meanwhile (Kubernetes' kubelet waits 5 minutes; a Cluster's figures are read by
/// more, so a minute).
pub(super) const STATUS_REFRESH: Duration = Duration::from_secs(60);

/// How long an agent whose server has no Lease for it (an older server, or one not done
/// making it) writes its status with every beat before it asks again.
pub(super) const LEASE_RECHECK: Duration = Duration::from_secs(30);

/// What a session's heartbeats remember: the status last written, and the Lease.
#[derive(Debug, Default)]
pub(super) struct Beats {
    /// The status last written (as [`comparable`] makes it), when, and the Cluster's
    /// resourceVersion after it.
    pub(super) written: Option<(Value, Instant, String)>,
    /// The Cluster's status as the server last answered it, and when the agent last wrote
    /// all of its fields: a heartbeat in between sends only what differs from it.
    pub(super) has: Option<(Value, Instant)>,
    /// The Lease as last read or renewed.
    pub(super) lease: Option<Object>,
    /// When the server last had no Lease for us (or forbade it).
    pub(super) no_lease: Option<Instant>,
}

/// How far a measured figure may drift before the status is written ahead of
/// [`STATUS_REFRESH`], as a share of the capacity it is measured against (usage against
/// allocatable, traffic against bandwidth): background load and traffic move a little at
/// every beat, and placement reads water levels to the percent (Orrery's own replicas are in
/// `allocated`, compared exactly).
pub(super) const DRIFT: f64 = 0.01;

/// The measured figures of a status: (where the figure is, where its capacity is).
pub(super) const MEASURED: &[(&str, &str)] = &[
    (
        "/resourceSummary/usage/cpu",
        "/resourceSummary/allocatable/cpu",
    ),
    (
        "/resourceSummary/usage/memory",
        "/resourceSummary/allocatable/memory",
    ),
    (
        "/resourceSummary/usage/nvidia.com~1gpu",
        "/resourceSummary/allocatable/nvidia.com~1gpu",
    ),
    (
        "/network/egressBytesPerSecond",
        "/network/bandwidthBytesPerSecond",
    ),
    (
        "/network/ingressBytesPerSecond",
        "/network/bandwidthBytesPerSecond",
    ),
];

/// What [`same_status`] leaves out of the exact comparison: the beat's time, the round trip
/// (compared by [`same_latency`]) and the measured figures (compared within [`DRIFT`]).
pub(super) static UNCOMPARED: std::sync::LazyLock<Vec<&'static str>> =
    std::sync::LazyLock::new(|| {
        ["/lastHeartbeatTime", "/network/serverLatencyMs"]
            .into_iter()
            .chain(MEASURED.iter().map(|(at, _)| *at))
            .collect()
    });

/// Whether `a` and `b` are equal but for the values at the JSON pointers `skip`, `at` being
/// where both are. Compared in place: a heartbeat used to copy both statuses to strip them
/// (a tenth of a simulating process's CPU at 3,000 members).
pub(super) fn equal_except(a: &Value, b: &Value, at: &mut String, skip: &[&str]) -> bool {
    let within = |p: &&str| {
        p.len() > at.len() && p.starts_with(at.as_str()) && p.as_bytes()[at.len()] == b'/'
    };
    if !skip.iter().any(within) {
        return a == b;
    }
    let depth = at.len();
    // The pointer of the member `key` of the value at `at` (RFC 6901 escapes).
    let enter = |at: &mut String, key: &str| {
        at.truncate(depth);
        at.push('/');
        for c in key.chars() {
            match c {
                '~' => at.push_str("~0"),
                '/' => at.push_str("~1"),
                c => at.push(c),
            }
        }
    };
    let same = match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            x.iter().all(|(k, va)| {
                enter(at, k);
                skip.contains(&at.as_str())
                    || y.get(k).is_some_and(|vb| equal_except(va, vb, at, skip))
            }) && y.keys().all(|k| {
                enter(at, k);
                x.contains_key(k) || skip.contains(&at.as_str())
            })
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len()
                && x.iter().zip(y).enumerate().all(|(i, (va, vb))| {
                    enter(at, &i.to_string());
                    skip.contains(&at.as_str()) || equal_except(va, vb, at, skip)
                })
        }
        _ => a == b,
    };
    at.truncate(depth);
    same
}

/// Whether two round trips to the server (`network.serverLatencyMs`) tell the same: both
/// absent, or within 5 ms or a factor of 2 of each other (a round trip varies from beat to
/// beat with the server's load; placement reads it to tell near from far).
pub(super) fn same_latency(a: Option<f64>, b: Option<f64>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => (a - b).abs() <= 5.0 || (a.max(b) <= 2.0 * a.min(b)),
        _ => false,
    }
}

/// A figure as a number (a JSON number or a quantity).
pub(super) fn figure(v: Option<&Value>) -> Option<f64> {
    match v? {
        Value::Number(n) => n.as_f64(),
        Value::String(q) => q.parse::<orrery_api::Quantity>().ok().map(|q| q.as_f64()),
        _ => None,
    }
}

/// Whether `now` says what `written` said: equal but for the beat's time and the measured
/// figures, each of those within [`DRIFT`] of its capacity, and the round trip to the server
/// as [`same_latency`] says.
pub(super) fn same_status(written: &Value, now: &Value) -> bool {
    let latency = |v: &Value| {
        v.pointer("/network/serverLatencyMs")
            .and_then(Value::as_f64)
    };
    if !same_latency(latency(written), latency(now)) {
        return false;
    }
    if !equal_except(written, now, &mut String::new(), &UNCOMPARED) {
        return false;
    }
    MEASURED.iter().all(|(at, capacity)| {
        let (a, b) = (written.pointer(at), now.pointer(at));
        match (figure(a), figure(b), figure(now.pointer(capacity))) {
            (Some(a), Some(b), Some(cap)) if cap > 0.0 => (a - b).abs() <= DRIFT * cap,
            _ => a == b,
        }
    })
}

/// How long a heartbeat may take: the interval, 10 s at least.
pub(super) fn beat_limit(interval: Duration) -> Duration {
    interval.max(Duration::from_secs(10))
}

/// A [`heartbeat`] given up after [`beat_limit`] (`None`). A request may hang on a connection
/// that died without a word, and a silent member is declared Unknown after the grace period:
/// kubelet bounds its heartbeats and drops their connections the same way. Giving up drops
/// the request's connection (the agent's client speaks HTTP/1.1, a connection per request
/// in flight), so the next beat makes a new one.
pub(super) async fn beat_in_time(
    inner: &Inner,
    t: &Transport,
    conds: &mut Vec<Condition>,
    beats: &mut Beats,
) -> Option<Result<Option<Stopped>, End>> {
    tokio::time::timeout(
        beat_limit(inner.cfg.heartbeat_interval),
        heartbeat(inner, t, conds, beats),
    )
    .await
    .ok()
}

/// What the session does when a beat was given up: a first one is skipped (its connection
/// is gone, the next beat makes another); a second in a row ends the session, so that the
/// agent tries the next replica (a server that takes requests and never answers, as a
/// stopped one does).
pub(super) fn unanswered(inner: &Inner, in_a_row: &mut u32) -> Option<End> {
    *in_a_row += 1;
    let limit = beat_limit(inner.cfg.heartbeat_interval);
    if *in_a_row >= 2 {
        return Some(End::Transient(format!(
            "two heartbeats in a row had no answer within {limit:?}"
        )));
    }
    tracing::warn!(cluster = %inner.cfg.cluster, server = %inner.server(), ?limit, "a heartbeat had no answer in time; the next goes on a new connection");
    None
}

/// One heartbeat: the Lease renewed when the member's status is what was last written (and
/// not too long ago), else the status written. `Some` when the cluster turned out to be
/// unregistered.
pub(super) async fn heartbeat(
    inner: &Inner,
    t: &Transport,
    conds: &mut Vec<Condition>,
    beats: &mut Beats,
) -> Result<Option<Stopped>, End> {
    let report = inner.backend.report().await;
    if let Some(h) = &inner.cfg.health {
        h.member(report.as_ref().map(|_| ()).map_err(|e| e.to_string()));
    }
    let measured = MicroTime::now();
    // The lowest recent round trip: the network's share, without the server's work.
    let server_latency = inner.round_trips.lock().iter().copied().reduce(f64::min);
    let trusted = orrery_api::token::ca_hash(&inner.trusted_ca());
    let status = cluster_status(
        &report,
        conds,
        measured.time(),
        inner.cfg.cluster_token.is_some(),
        server_latency,
        &trusted,
    );
    let nodes = report.as_ref().ok().map(|r| r.nodes.clone());
    let unchanged = beats
        .written
        .as_ref()
        .is_some_and(|(w, at, _)| at.elapsed() < STATUS_REFRESH && same_status(w, &status));
    let mut status = status;
    if unchanged
        && beats
            .no_lease
            .is_none_or(|at| at.elapsed() >= LEASE_RECHECK)
    {
        match renew(inner, t, beats, measured).await {
            Ok(Renewal::Renewed) => {
                if let Some(h) = &inner.cfg.health {
                    h.heartbeat(true);
                }
                if let Some(nodes) = nodes {
                    write_metrics(inner, t, nodes).await;
                }
                return Ok(None);
            }
            Ok(Renewal::WriteStatus) => {}
            // The server changed the Cluster's conditions: the status is written over what
            // it has, so that a condition's transition time is the server's.
            Ok(Renewal::ReadFirst) => match t.get_cluster().await {
                Ok(c) if c.metadata.deletion_timestamp.is_some() => {
                    return Ok(Some(Stopped::Unregistered));
                }
                Ok(c) => {
                    *conds = cluster::ClusterStatus::of(&c).conditions;
                    // What the server has now is what the beat's patch is made against.
                    let full_at = beats.has.take().map(|(_, at)| at);
                    beats.has = c.status.clone().zip(full_at);
                    status = cluster_status(
                        &report,
                        conds,
                        measured.time(),
                        inner.cfg.cluster_token.is_some(),
                        server_latency,
                        &trusted,
                    );
                }
                Err(e) => return failed_beat(inner, e),
            },
            Err(e) => return failed_beat(inner, e),
        }
    }
    let sent = Instant::now();
    // Taken out while the write is under way: a beat that fails or is given up leaves no
    // answer to make the next patch against, and the next one writes every field.
    let has = beats
        .has
        .take()
        .filter(|(_, full)| full.elapsed() < FULL_STATUS_EVERY);
    let patch = status_patch(has.as_ref().map(|(v, _)| v), &status);
    let full_at = has.map_or(sent, |(_, at)| at);
    let written = status;
    let answer = t.heartbeat(patch).await;
    timed(inner, sent.elapsed());
    if let (Some(h), true) = (&inner.cfg.health, answer.is_ok()) {
        h.heartbeat(true);
    }
    match answer {
        Ok(c) if c.metadata.deletion_timestamp.is_some() => Ok(Some(Stopped::Unregistered)),
        Ok(c) => {
            beats.written = Some((written, sent, c.metadata.resource_version.clone()));
            beats.has = c.status.clone().map(|s| (s, full_at));
            if let Some(s) = c
                .status
                .and_then(|s| serde_json::from_value::<cluster::ClusterStatus>(s).ok())
            {
                *conds = s.conditions;
            }
            if let Some(nodes) = nodes {
                write_metrics(inner, t, nodes).await;
            }
            Ok(None)
        }
        Err(e) => failed_beat(inner, e),
    }
}

/// What a heartbeat whose request failed comes to.
pub(super) fn failed_beat(inner: &Inner, e: TransportError) -> Result<Option<Stopped>, End> {
    if let Some(h) = &inner.cfg.health {
        h.heartbeat(false);
    }
    match e {
        TransportError::NotRegistered(_) => Ok(Some(Stopped::Unregistered)),
        // An overloaded server: this beat is skipped, the session kept (ending it would add
        // a reconnection to the load); the next beat comes at the usual time.
        TransportError::Busy(why) => {
            tracing::debug!(cluster = %inner.cfg.cluster, %why, "the server is busy; skipping a heartbeat");
            Ok(None)
        }
        e => Err(e.into()),
    }
}

/// A heartbeat's round trip, for the stats and the latency reported to the server.
pub(super) fn timed(inner: &Inner, took: Duration) {
    crate::stats::heartbeat(took);
    let mut rt = inner.round_trips.lock();
    rt.push_back((took.as_secs_f64() * 10_000.0).round() / 10.0);
    while rt.len() > ROUND_TRIPS {
        rt.pop_front();
    }
}

/// What became of a Lease renewal.
pub(super) enum Renewal {
    Renewed,
    /// The status is to be written instead: there is no Lease (yet).
    WriteStatus,
    /// The server changed the Lease or asks for the status: the Cluster is read, and the
    /// status written over it.
    ReadFirst,
}

/// Renews the Lease, vouching that the status last written describes the member at
/// `measured`.
pub(super) async fn renew(
    inner: &Inner,
    t: &Transport,
    beats: &mut Beats,
    measured: MicroTime,
) -> Result<Renewal, TransportError> {
    let Some(revision) = beats.written.as_ref().map(|(_, _, rv)| rv.clone()) else {
        return Ok(Renewal::WriteStatus);
    };
    let mut lease = match beats.lease.take() {
        Some(l) => l,
        None => match t.get_lease().await {
            Ok(l) => l,
            Err(TransportError::NotRegistered(_) | TransportError::Forbidden(_)) => {
                beats.no_lease = Some(Instant::now());
                return Ok(Renewal::WriteStatus);
            }
            Err(e) => return Err(e),
        },
    };
    beats.no_lease = None;
    let ann = &mut lease.metadata.annotations;
    // The server asks for the status (it changed the Cluster's conditions): written now,
    // the mark dropped with the next renewal.
    if ann.remove(cluster::LEASE_STATUS_WANTED).is_some() {
        beats.lease = Some(lease);
        return Ok(Renewal::ReadFirst);
    }
    ann.insert(cluster::LEASE_STATUS_REVISION.to_string(), revision);
    let spec = lease.spec.get_or_insert_with(|| json!({}));
    if let Some(m) = spec.as_object_mut() {
        m.insert("holderIdentity".into(), json!(inner.cfg.cluster));
        m.insert("renewTime".into(), json!(measured.to_string()));
    }
    let sent = Instant::now();
    let answer = t.renew_lease(&lease).await;
    timed(inner, sent.elapsed());
    match answer {
        Ok(l) => {
            beats.lease = Some(l);
            Ok(Renewal::Renewed)
        }
        // Changed by the server (a mark, or made again), or gone (the cluster is being
        // unregistered): read again next time; the Cluster read now says what happened.
        Err(TransportError::Conflict(_) | TransportError::NotRegistered(_)) => {
            Ok(Renewal::ReadFirst)
        }
        Err(e) => Err(e),
    }
}

/// How long nodes unchanged go without being written again (repairs a ClusterMetrics made
/// afresh, or edited, on the server).
pub(super) const METRICS_REFRESH: Duration = Duration::from_secs(300);

/// How many heartbeat intervals a member whose ClusterMetrics the server has not made yet
/// waits before writing again (every third beat). Each refused write costs the server a
/// linearizable read (a 404 is never answered from a copy): at 10,000 members registering
/// together, tens of thousands of them took over a second each while the objects were made.
pub(super) const METRICS_MISSING_BEATS: f64 = 2.5;

/// Writes the member's nodes into its ClusterMetrics when they changed since last written.
/// Failures wait for the next heartbeat (a missing object, for a few): the object may not be
/// made yet, or the server may be older than this agent; the session goes on either way.
pub(super) async fn write_metrics(
    inner: &Inner,
    t: &Transport,
    nodes: Vec<orrery_api::quota::NodeInfo>,
) {
    {
        let sent = inner.metrics_sent.lock();
        if let Some((last, at)) = &*sent
            && *last == nodes
            && at.elapsed() < METRICS_REFRESH
        {
            return;
        }
    }
    let missing = || inner.metrics_missing.lock();
    let wait = inner.cfg.heartbeat_interval.mul_f64(METRICS_MISSING_BEATS);
    if missing().is_some_and(|at| at.elapsed() < wait) {
        return;
    }
    let status = json!({ "nodes": nodes });
    match t.write_metrics(status).await {
        Ok(()) => {
            *inner.metrics_sent.lock() = Some((nodes, Instant::now()));
        }
        Err(TransportError::NotRegistered(why)) => {
            tracing::debug!(cluster = %inner.cfg.cluster, %why, "the server has not made the member's ClusterMetrics yet; writing again in {wait:?}");
            *missing() = Some(Instant::now());
        }
        Err(e) => {
            tracing::debug!(cluster = %inner.cfg.cluster, error = %e, "writing the member's ClusterMetrics failed; trying again with the next heartbeat");
        }
    }
}

pub(super) async fn heartbeat_loop(
    inner: &Inner,
    t: &Transport,
    mut conds: Vec<Condition>,
    mut beats: Beats,
) -> End {
    let mut unanswered_in_a_row = 0;
    loop {
        // ±10% so that agents started together spread out.
        let base = inner.cfg.heartbeat_interval;
        let d = base.mul_f64(0.9 + crate::backoff::random_fraction() * 0.2);
        tokio::time::sleep(d).await;
        match beat_in_time(inner, t, &mut conds, &mut beats).await {
            Some(Ok(None)) => unanswered_in_a_row = 0,
            Some(Ok(Some(s))) => return End::Stopped(s),
            Some(Err(e)) => return e,
            None => {
                if let Some(end) = unanswered(inner, &mut unanswered_in_a_row) {
                    return end;
                }
            }
        }
    }
}
