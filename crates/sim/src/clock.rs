//! The simulated cluster's clock: what happens between two looks at it (pods bin-packed,
//! started, finished; volumes made and released; transfers stepped), and the ticker that
//! keeps a simulated fleet going.

use crate::spec::SimSpec;
use crate::workload::is_managed;

use crate::Key;
use crate::Node;
use crate::Phase;
use crate::Pod;
use crate::SimCluster;
use crate::SimObject;
use crate::State;
use crate::data;
use crate::new_uid;
use crate::workload::Res;
use crate::workload::Shape;
use crate::workload::WorkloadKind;
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::time::Instant;

/// The volumes a workload's pods use: a StatefulSet's (every ordinal's, kept ones too), then
/// the claims its pod template mounts.
pub(crate) fn workload_volumes(
    st: &State,
    key: &Key,
    shape: &Shape,
) -> Vec<orrery_api::stateful::VolumeStatus> {
    if shape.claims.is_empty() {
        return Vec::new();
    }
    let owner = format!("{}/{}", key.1, key.3);
    let mut out: Vec<orrery_api::stateful::VolumeStatus> = st
        .data
        .volumes()
        .filter(|v| v.namespace == key.2 && v.owner.as_deref() == Some(owner.as_str()))
        .map(data::Volume::status)
        .collect();
    out.sort_by(|a, b| (a.ordinal, &a.name).cmp(&(b.ordinal, &b.name)));
    for c in shape.claims.iter().filter(|c| !c.per_ordinal) {
        if let Some(v) = st.data.volume(&key.2, &c.name) {
            out.push(v.status());
        }
    }
    out
}

/// The claims in the member labelled `orrery.io/dataset` (namespace, claim, data set), and
/// whether Orrery made them.
pub(crate) fn data_set_claims(
    objects: &BTreeMap<Key, SimObject>,
) -> impl Iterator<Item = (&str, &str, &str, bool)> {
    objects.iter().filter_map(|(key, o)| {
        if key.1 != "PersistentVolumeClaim" || !key.0.is_empty() {
            return None;
        }
        let set = o
            .manifest
            .pointer("/metadata/labels")?
            .get(orrery_api::data::DATASET_LABEL)?
            .as_str()?;
        Some((key.2.as_str(), key.3.as_str(), set, is_managed(&o.manifest)))
    })
}

/// The copies of data sets the member holds of its own: its claims labelled
/// `orrery.io/dataset` that Orrery did not make, with data in.
pub(crate) fn held_data_sets(st: &State) -> Vec<orrery_api::data::HeldDataSet> {
    let mut out = Vec::new();
    // Orrery's own copies are known to it; the member reports those it holds of its own.
    for (ns, claim, set, managed) in data_set_claims(&st.objects) {
        if managed {
            continue;
        }
        if let Some(v) = st.data.volume(ns, claim).filter(|v| v.version > 0) {
            out.push(orrery_api::data::HeldDataSet {
                namespace: ns.to_string(),
                name: set.to_string(),
                claim: claim.to_string(),
                bytes: v.used as i64,
                data_version: v.version,
            });
        }
    }
    out
}

/// Moves the simulations along (pods start, Jobs finish) five times a second, until shutdown.
pub fn spawn_clock(
    sims: Vec<std::sync::Arc<SimCluster>>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_millis(200));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = every.tick() => sims.iter().for_each(|s| { s.tick(); }),
                _ = shutdown.changed() => return,
            }
        }
    })
}

/// Background requests held on one node: the base load of its cpu and memory.
pub(crate) fn background(node: &Node, load: f64) -> Res {
    node.allocatable.scale(load)
}

/// Creates and removes pods so each workload has what its spec asks for. A StatefulSet's
/// pods have ordinals (the lowest missing ones are made, the highest go first, as Kubernetes
/// does) and each new ordinal gets its claim templates' volumes, unless the member has them
/// already (a scale back up, or volumes copied in by a migration).
pub(crate) fn reconcile_pods(st: &mut State, key: &Key, now: Instant) {
    let Some(obj) = st.objects.get(key) else {
        // Gone: its pods go too.
        st.pods.retain(|_, p| &p.owner != key);
        st.stuck.remove(key);
        return;
    };
    let Some(shape) = obj.shape.clone() else {
        return;
    };
    let stateful = key.1 == "StatefulSet";
    let succeeded = obj.succeeded;
    // Pods of an older template are replaced (the simulation does not stage rollouts).
    let before = st.pods.len();
    st.pods
        .retain(|_, p| &p.owner != key || p.template == shape.template);
    let mut changed = st.pods.len() != before;
    let mine: Vec<u64> = st
        .pods
        .iter()
        .filter(|(_, p)| &p.owner == key && p.phase != Phase::Succeeded)
        .map(|(id, _)| *id)
        .collect();
    let want = match shape.kind {
        WorkloadKind::Replicated => shape.replicas,
        WorkloadKind::DaemonSet => st.nodes.iter().filter(|n| n.ready).count() as i64,
        WorkloadKind::Job => (shape.completions - succeeded).clamp(0, shape.parallelism),
        WorkloadKind::Pod => i64::from(succeeded == 0),
    };
    let have = mine.len() as i64;
    if have > want {
        let mut order = mine.clone();
        if stateful {
            // The highest ordinals go first.
            order.sort_by_key(|id| std::cmp::Reverse(st.pods.get(id).and_then(|p| p.ordinal)));
        } else {
            // Pending pods first, then the newest.
            order.sort_by_key(|id| {
                (
                    st.pods.get(id).map(|p| p.phase != Phase::Pending),
                    std::cmp::Reverse(*id),
                )
            });
        }
        for id in order.into_iter().take((have - want) as usize) {
            st.pods.remove(&id);
        }
        changed = true;
    }
    if want > have {
        changed = true;
    }
    let taken: std::collections::BTreeSet<i64> = st
        .pods
        .values()
        .filter(|p| &p.owner == key && p.phase != Phase::Succeeded)
        .filter_map(|p| p.ordinal)
        .collect();
    let mut free_ordinals = (0..).filter(|o| !taken.contains(o));
    for _ in have..want {
        let id = st.next_pod;
        st.next_pod += 1;
        let ordinal = if stateful { free_ordinals.next() } else { None };
        st.pods.insert(
            id,
            Pod {
                owner: key.clone(),
                ordinal,
                template: shape.template,
                request: shape.request,
                node: None,
                phase: Phase::Pending,
                since: now,
                uid: new_uid(),
                created: orrery_api::Time::now(),
                started: None,
                restarts: 0,
            },
        );
        st.busy = true;
    }
    if stateful {
        // Every ordinal below the replica count has its volumes; those above it keep theirs
        // unless the retention policy says otherwise.
        let owner = format!("StatefulSet/{}", key.3);
        for c in shape.claims.iter().filter(|c| c.per_ordinal) {
            let capacity = c.capacity.map_or(1 << 30, |q| q.value() as i64);
            let class = if c.storage_class.is_empty() {
                st.storage_default.clone()
            } else {
                c.storage_class.clone()
            };
            let used = shape.volume_used.unwrap_or(capacity / 2) as f64;
            for ordinal in 0..want {
                let name = orrery_api::stateful::ordinal_volume(&c.name, &key.3, ordinal);
                st.data.ensure_volume(
                    &key.2,
                    &name,
                    Some(ordinal),
                    Some(&owner),
                    capacity,
                    &class,
                    used,
                );
            }
            if shape.delete_when_scaled {
                let gone: Vec<String> = st
                    .data
                    .volumes()
                    .filter(|v| {
                        v.namespace == key.2
                            && v.owner.as_deref() == Some(owner.as_str())
                            && v.ordinal.is_some_and(|o| o >= want)
                    })
                    .map(|v| v.name.clone())
                    .collect();
                for n in gone {
                    st.data.delete_volume(&key.2, &n);
                }
            }
        }
    }
    if changed {
        st.touch(key);
    }
}

/// Attaches the volumes of pods that run and detaches those of pods that stopped (or went),
/// so that volumes are written only while a pod runs on them.
pub(crate) fn sync_volumes(st: &mut State) {
    let mut want: BTreeMap<u64, (Key, Vec<data::VolumeKey>, f64)> = BTreeMap::new();
    for (id, p) in &st.pods {
        if p.phase != Phase::Running {
            continue;
        }
        let Some(shape) = st.objects.get(&p.owner).and_then(|o| o.shape.as_ref()) else {
            continue;
        };
        if shape.claims.is_empty() {
            continue;
        }
        let vols = shape.volumes_of(&p.owner.2, &p.owner.3, p.ordinal);
        want.insert(*id, (p.owner.clone(), vols, shape.write_rate));
    }
    let had = std::mem::take(&mut st.attached);
    for (id, (owner, vols, rate)) in &had {
        if want.get(id).is_some_and(|w| w.1 == *vols) {
            continue;
        }
        let workload = format!("{}/{}", owner.1, owner.3);
        for (ns, name) in vols {
            st.data.detach(ns, name, &workload, *rate);
        }
        st.touch(owner);
    }
    for (id, (owner, vols, rate)) in &want {
        if had.get(id).is_some_and(|h| h.1 == *vols) {
            continue;
        }
        let workload = format!("{}/{}", owner.1, owner.3);
        for (ns, name) in vols {
            st.data.attach(ns, name, &workload, *rate);
        }
        st.touch(owner);
    }
    st.attached = want;
}

/// Whether every pod of `workload` (`Kind/name`) in `namespace` has gone: the fence holds.
pub(crate) fn no_pods(pods: &BTreeMap<u64, Pod>, namespace: &str, workload: &str) -> bool {
    let Some((kind, name)) = workload.split_once('/') else {
        return true;
    };
    !pods.values().any(|p| {
        p.owner.1 == kind
            && p.owner.2 == namespace
            && p.owner.3 == name
            && p.phase != Phase::Succeeded
    })
}

/// Lets the data move on to `now` (writes, copies), so that what changes next starts from
/// the right moment. Returns whether anything changed.
pub(crate) fn catch_up(st: &mut State, now: Instant) -> bool {
    let dt = now.duration_since(st.data_clock).as_secs_f64();
    st.data_clock = now;
    if !st.data.busy() {
        return false;
    }
    let (volumes, _) = st.data.advance(dt);
    touch_volume_users(st, &volumes);
    true
}

/// Starts what transfers wait for (a snapshot once the fence holds, a copy of a new round);
/// returns whether anything changed.
pub(crate) fn step_transfers(st: &mut State) -> bool {
    if !st.data.has_transfers() {
        return false;
    }
    let pods = &st.pods;
    let changed = st.data.step(&|ns, w| no_pods(pods, ns, w));
    if changed {
        st.data.transfer_stamp += 1;
    }
    changed
}

/// Marks the workloads whose volumes' data changed (their states show the volumes).
pub(crate) fn touch_volume_users(st: &mut State, volumes: &[data::VolumeKey]) {
    if volumes.is_empty() {
        return;
    }
    let mut owners: Vec<Key> = st
        .attached
        .values()
        .filter(|(_, vols, _)| vols.iter().any(|v| volumes.contains(v)))
        .map(|(k, _, _)| k.clone())
        .collect();
    for (ns, name) in volumes {
        if let Some(owner) = st.data.volume(ns, name).and_then(|v| v.owner.clone())
            && let Some((kind, wname)) = owner.split_once('/')
        {
            owners.extend(
                st.objects
                    .keys()
                    .filter(|k| k.1 == kind && k.2 == *ns && k.3 == wname)
                    .cloned(),
            );
        }
    }
    owners.sort();
    owners.dedup();
    for k in &owners {
        st.touch(k);
    }
}

/// Places pending pods, starts scheduled ones, completes Job pods. Returns whether anything
/// changed.
pub(crate) fn advance(st: &mut State, spec: &SimSpec, now: Instant) -> bool {
    let mut free = node_free(st);
    let PodPass {
        mut changed,
        mut busy,
        unschedulable,
        blocked,
        finished_jobs,
        mut moved,
    } = pass_pods(st, spec, now, &mut free);
    changed |= update_unschedulable(st, &unschedulable, &mut moved);
    changed |= update_volume_blocks(st, &blocked, &mut moved);
    moved.sort();
    moved.dedup();
    for key in &moved {
        st.touch(key);
    }
    if !finished_jobs.is_empty() {
        finish_jobs(st, finished_jobs, now);
        busy = true;
    }
    st.busy = busy;
    sync_volumes(st);
    changed
}

/// What each node has left: nothing if it is not ready, else what its background load and
/// its unfinished pods leave.
fn node_free(st: &State) -> Vec<Res> {
    let load = st.load;
    let mut free: Vec<Res> = st
        .nodes
        .iter()
        .map(|n| {
            if n.ready {
                n.allocatable.sub(background(n, load))
            } else {
                Res::default()
            }
        })
        .collect();
    for p in st.pods.values() {
        if let Some(i) = p.node
            && p.phase != Phase::Succeeded
        {
            free[i] = free[i].sub(p.request);
        }
    }
    free
}

/// What one pass over the pods did and found.
struct PodPass {
    changed: bool,
    /// Whether anything is still under way (a later tick has work to do).
    busy: bool,
    /// Pods that fit on no node, by workload.
    unschedulable: BTreeMap<Key, i64>,
    /// Pods waiting for a volume: why, by workload.
    blocked: BTreeMap<Key, String>,
    /// A workload for each of its Job pods that completed.
    finished_jobs: Vec<Key>,
    /// Owners whose pods moved (placed, started): their states changed.
    moved: Vec<Key>,
}

/// Moves each pod on a phase: places pending ones (best fit into `free`), starts scheduled
/// ones after the start delay, completes Job pods after the job's duration.
fn pass_pods(st: &mut State, spec: &SimSpec, now: Instant, free: &mut [Res]) -> PodPass {
    let mut changed = false;
    let mut unschedulable: BTreeMap<Key, i64> = BTreeMap::new();
    let mut blocked: BTreeMap<Key, String> = BTreeMap::new();
    let mut busy = false;
    let mut finished_jobs: Vec<Key> = Vec::new();
    let mut moved: Vec<Key> = Vec::new();
    for p in st.pods.values_mut() {
        match p.phase {
            Phase::Pending => {
                if let Some(why) = st
                    .objects
                    .get(&p.owner)
                    .and_then(|o| o.shape.as_ref())
                    .and_then(|shape| {
                        volume_block(shape, p, &st.data, &st.storage_classes, &st.objects)
                    })
                {
                    blocked.entry(p.owner.clone()).or_insert(why);
                    busy = true;
                    continue;
                }
                // Best fit: the node left with the least cpu, so large holes stay open.
                let best = free
                    .iter()
                    .enumerate()
                    .filter(|(_, f)| f.fits(p.request))
                    .min_by_key(|(i, f)| (f.cpu_m - p.request.cpu_m, *i))
                    .map(|(i, _)| i);
                match best {
                    Some(i) => {
                        free[i] = free[i].sub(p.request);
                        p.node = Some(i);
                        p.phase = Phase::Starting;
                        p.since = now;
                        changed = true;
                        busy = true;
                        moved.push(p.owner.clone());
                    }
                    None => {
                        *unschedulable.entry(p.owner.clone()).or_default() += 1;
                        busy = true;
                    }
                }
            }
            Phase::Starting => {
                let never_ready = st
                    .objects
                    .get(&p.owner)
                    .and_then(|o| o.shape.as_ref())
                    .is_some_and(|s| s.never_ready);
                if never_ready {
                    // A crash loop: it starts again and again, never ready (at most once a
                    // second, so that a start delay of 0 does not spin).
                    if now.duration_since(p.since) >= spec.start_delay.max(Duration::from_secs(1)) {
                        p.since = now;
                        p.restarts += 1;
                        changed = true;
                    }
                } else if now.duration_since(p.since) >= spec.start_delay {
                    p.phase = Phase::Running;
                    p.since = now;
                    p.started = Some(orrery_api::Time::now());
                    changed = true;
                    moved.push(p.owner.clone());
                }
                busy = true;
            }
            Phase::Running if p.owner.1 == "Job" => {
                if now.duration_since(p.since) >= spec.job_duration {
                    p.phase = Phase::Succeeded;
                    finished_jobs.push(p.owner.clone());
                    changed = true;
                }
                busy = true;
            }
            Phase::Running => {
                let every = st
                    .objects
                    .get(&p.owner)
                    .and_then(|o| o.shape.as_ref())
                    .and_then(|s| s.restart_every);
                if let Some(every) = every {
                    // A crash after running that long: it starts again, counted, and is
                    // ready again after the start delay.
                    if now.duration_since(p.since) >= every {
                        p.phase = Phase::Starting;
                        p.since = now;
                        p.restarts += 1;
                        changed = true;
                        moved.push(p.owner.clone());
                    }
                    busy = true;
                }
            }
            _ => {}
        }
    }
    PodPass {
        changed,
        busy,
        unschedulable,
        blocked,
        finished_jobs,
        moved,
    }
}

/// Records on each object how many of its pods cannot be scheduled (and which are stuck);
/// whether any count changed (those objects go to `moved`).
fn update_unschedulable(
    st: &mut State,
    unschedulable: &BTreeMap<Key, i64>,
    moved: &mut Vec<Key>,
) -> bool {
    let mut changed = false;
    // Only objects stuck before or now can have a count to change.
    let candidates: std::collections::BTreeSet<Key> = st
        .stuck
        .iter()
        .chain(unschedulable.keys())
        .cloned()
        .collect();
    for key in candidates {
        let n = unschedulable.get(&key).copied().unwrap_or(0);
        if let Some(obj) = st.objects.get_mut(&key)
            && obj.unschedulable != n
        {
            obj.unschedulable = n;
            changed = true;
            moved.push(key.clone());
        }
        if n > 0 {
            st.stuck.insert(key);
        } else {
            st.stuck.remove(&key);
        }
    }
    changed
}

/// Records on each object why its pods wait for a volume, if they do; whether any reason
/// changed (those objects go to `moved`).
fn update_volume_blocks(
    st: &mut State,
    blocked: &BTreeMap<Key, String>,
    moved: &mut Vec<Key>,
) -> bool {
    let mut changed = false;
    // Objects whose pods wait for a volume, or waited until now.
    let waiting: Vec<Key> = st
        .objects
        .iter()
        .filter(|(k, o)| o.volume_block.is_some() || blocked.contains_key(*k))
        .map(|(k, _)| k.clone())
        .collect();
    for key in waiting {
        let why = blocked.get(&key).cloned();
        if let Some(obj) = st.objects.get_mut(&key)
            && obj.volume_block != why
        {
            obj.volume_block = why;
            changed = true;
            moved.push(key);
        }
    }
    changed
}

/// Drops the completed Job pods and counts them on their Jobs (a Job completes at its
/// completions), then lets each Job make its next pods.
fn finish_jobs(st: &mut State, finished_jobs: Vec<Key>, now: Instant) {
    st.pods.retain(|_, p| p.phase != Phase::Succeeded);
    for key in finished_jobs {
        if let Some(o) = st.objects.get_mut(&key) {
            o.succeeded += 1;
            if o.completed.is_none()
                && o.shape
                    .as_ref()
                    .is_some_and(|sh| o.succeeded >= sh.completions)
            {
                o.completed = Some(orrery_api::Time::now().to_string());
            }
        }
        st.touch(&key);
        reconcile_pods(st, &key, now);
    }
}

/// Why a pending pod cannot start for want of a volume: a claim it mounts does not exist, or
/// its volume's storage class is not offered here.
pub(crate) fn volume_block(
    shape: &Shape,
    p: &Pod,
    data: &data::DataPlane,
    classes: &[String],
    objects: &BTreeMap<Key, SimObject>,
) -> Option<String> {
    for c in &shape.claims {
        if !c.storage_class.is_empty() && !classes.contains(&c.storage_class) {
            return Some(format!(
                "storageclass.storage.k8s.io {:?} not found (this cluster offers {})",
                c.storage_class,
                classes.join(", ")
            ));
        }
    }
    for (ns, name) in shape.volumes_of(&p.owner.2, &p.owner.3, p.ordinal) {
        if data.volume(&ns, &name).is_none() {
            return Some(format!("persistentvolumeclaim {name:?} not found"));
        }
    }
    for set in &shape.datasets {
        let claim = orrery_api::data::claim_name(set);
        // A copy being filled for the first time has no data version yet; a claim of the
        // member's own labelled with the data set holds it too.
        let has = |name: &str| data.volume(&p.owner.2, name).is_some_and(|v| v.version > 0);
        let own = data_set_claims(objects)
            .any(|(ns, c, s, managed)| !managed && ns == p.owner.2 && s == set && has(c));
        if !has(&claim) && !own {
            return Some(format!(
                "waiting for data set {set:?}: its copy (persistentvolumeclaim {claim:?}) is not in this cluster yet"
            ));
        }
    }
    None
}
