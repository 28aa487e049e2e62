//! A simulated member cluster, in the spirit of KWOK: it stands in for a real Kubernetes
//! cluster where none can run (tests, benchmarks, `orrery up`), and says so in its version
//! (`+orrery-sim`). Nothing is executed.
//!
//! - Nodes with allocatable cpu, memory, gpu and pods (`--simulate nodes=8,cpu=32,...`).
//! - Applied Deployments, StatefulSets, ReplicaSets, DaemonSets, Jobs and Pods become pods,
//!   bin-packed onto nodes by their requests (best fit); Pending when no node has room;
//!   Running after a start-up delay; Job pods succeed after a run time.
//! - Background load: a base fraction of each node is held by other workloads (it counts as
//!   requested), and actual use follows a profile: `flat`, `diurnal` (a sine over `period`),
//!   or `spikes` (short bursts at deterministic, pseudo-random times).
//! - Faults: node loss (pods on lost nodes go Pending and are rescheduled), an outage (the
//!   member's API stops answering), added latency.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::time::Duration;

use orrery_api::work::{Health, ResourceIdentifier};
use serde_json::{Value, json};
use tokio::time::Instant;

use orrery_agent::backend::{BackendError, Cause, ObjectState};

pub mod admin;
mod api;
mod backend;
mod clock;
pub mod data;
pub mod fleet;
mod portforward;
mod shell;
mod spdy;
/// SPDY/3.1 frames read as the port-forward server reads them (for the fuzz targets).
pub use spdy::read_frames as read_spdy_frames;
mod spec;
mod workload;

pub use clock::spawn_clock;
use clock::*;
pub use spec::*;
use workload::*;
pub use workload::{VOLUME_USED_ANNOTATION, WRITE_RATE_ANNOTATION};

fn hash_value(v: &Value) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    v.to_string().hash(&mut h);
    h.finish()
}

/// Wall-clock time since the Unix epoch (what members agree on; the journals' times).
fn unix_now() -> Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

type Key = (String, String, String, String);

fn key_of(id: &ResourceIdentifier) -> Key {
    (
        id.group.clone(),
        id.kind.clone(),
        id.namespace.clone(),
        id.name.clone(),
    )
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Pending,
    Starting,
    Running,
    Succeeded,
}

#[derive(Debug, Clone)]
struct Pod {
    owner: Key,
    /// A StatefulSet pod's ordinal.
    ordinal: Option<i64>,
    template: u64,
    request: Res,
    node: Option<usize>,
    phase: Phase,
    /// When its phase last changed (the simulation's timers: start delay, job duration).
    since: Instant,
    /// Its identity, kept across the member's restarts as a real cluster keeps its pods'.
    uid: String,
    created: orrery_api::Time,
    /// When it began running.
    started: Option<orrery_api::Time>,
    restarts: u32,
}

/// A new uid, as an API server makes one.
fn new_uid() -> String {
    let mut b = [0u8; 16];
    // Without randomness (never seen), a uid from the clock: unique enough for one member.
    if getrandom::fill(&mut b).is_err() {
        b[..16].copy_from_slice(&unix_now().as_nanos().to_le_bytes());
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

#[derive(Debug, Clone)]
struct SimObject {
    manifest: Value,
    generation: i64,
    shape: Option<Shape>,
    /// Job pods that have succeeded (they leave the pod table).
    succeeded: i64,
    /// Pods that could not be placed at the last scheduling pass.
    unschedulable: i64,
    /// Why its pods wait for a volume, if they do.
    volume_block: Option<String>,
    /// Changes whenever the object's state (as [`SimCluster::object_state`] renders it) may
    /// have: the agent re-reads only objects whose stamp moved.
    stamp: u64,
    /// The load profile's window its usage was last rendered for.
    load_window: u64,
    /// When it was made (its creationTimestamp, had the member an API server), and its uid.
    created: String,
    uid: String,
    /// When a Job reached its completions (its status.completionTime).
    completed: Option<String>,
}

#[derive(Debug, Clone)]
struct Node {
    name: String,
    allocatable: Res,
    ready: bool,
}

#[derive(Debug, Default, Clone, PartialEq)]
pub struct Faults {
    pub outage: bool,
    pub latency: Duration,
    pub lost_nodes: usize,
    /// The member's data mover (its volume snapshots and copies) does not answer, while its
    /// API does: the transfers a Work asks for are refused as unavailable.
    pub data_mover_outage: bool,
}

/// One operation the simulated member carried out for its agent: what, on which object, and
/// why (the Work and the version of it the agent was carrying out).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JournalEntry {
    /// Numbers every operation of this member, from 1.
    pub seq: u64,
    /// Milliseconds since the Unix epoch.
    pub time_ms: u64,
    /// `create`, `update` or `delete`.
    pub op: &'static str,
    pub api_version: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// Whether the object changed: an update that applies what the member has already
    /// changes nothing, but is an operation all the same.
    pub changed: bool,
    pub cause: Cause,
}

/// Journal entries kept per member (the oldest go first).
const JOURNAL_LIMIT: usize = 100_000;

#[derive(Debug)]
struct State {
    nodes: Vec<Node>,
    objects: BTreeMap<Key, SimObject>,
    pods: BTreeMap<u64, Pod>,
    next_pod: u64,
    faults: Faults,
    load: f64,
    /// Whether any pod is Pending or Starting (ticks have work to do).
    busy: bool,
    peers: Vec<(String, String)>,
    /// The next object stamp (never 0, which stands for an absent object).
    next_stamp: u64,
    /// Objects with pods that found no node at the last pass (so a pass visits only these,
    /// not every object).
    stuck: std::collections::BTreeSet<Key>,
    journal: std::collections::VecDeque<JournalEntry>,
    journal_seq: u64,
    /// Pods put back by [`SimCluster::restore`] (not created: they were running already).
    restored_pods: u64,
    /// Volumes and transfers.
    data: data::DataPlane,
    /// The storage classes offered, and the default one.
    storage_classes: Vec<String>,
    storage_default: String,
    /// Running pods and the volumes they are attached to (with their write rate).
    attached: BTreeMap<u64, (Key, Vec<data::VolumeKey>, f64)>,
    /// When the data last moved on.
    data_clock: Instant,
    /// Latency to other clusters set by a fleet file.
    latency_overrides: BTreeMap<String, f64>,
    /// Moves whenever a workload of the namespace may have changed its pods: the endpoints of
    /// the namespace's Services follow its pods.
    pod_epochs: BTreeMap<String, u64>,
    /// When the member was made (its nodes' and system namespaces' creation).
    born: orrery_api::Time,
}

impl State {
    fn record(&mut self, op: &'static str, id: &ResourceIdentifier, changed: bool, cause: &Cause) {
        self.journal_seq += 1;
        if self.journal.len() >= JOURNAL_LIMIT {
            self.journal.pop_front();
        }
        let time_ms = unix_now().as_millis() as u64;
        let api_version = if id.group.is_empty() {
            id.version.clone()
        } else {
            format!("{}/{}", id.group, id.version)
        };
        self.journal.push_back(JournalEntry {
            seq: self.journal_seq,
            time_ms,
            op,
            api_version,
            kind: id.kind.clone(),
            namespace: id.namespace.clone(),
            name: id.name.clone(),
            changed,
            cause: cause.clone(),
        });
    }

    /// Marks an object's state as changed.
    fn touch(&mut self, key: &Key) {
        if let Some(o) = self.objects.get_mut(key) {
            self.next_stamp += 1;
            o.stamp = self.next_stamp;
            if o.shape.is_some() {
                *self.pod_epochs.entry(key.2.clone()).or_default() += 1;
            }
        }
    }
}

/// One simulated member cluster.
#[derive(Debug)]
pub struct SimCluster {
    name: String,
    region: String,
    spec: SimSpec,
    seed: u64,
    started: Instant,
    /// Shared with the streams of followed logs (they end with their pod).
    state: std::sync::Arc<Mutex<State>>,
    changed: tokio::sync::watch::Sender<u64>,
}

/// What a simulated member holds, kept across restarts of the process that simulates it
/// (`orrery up`): a real cluster keeps its objects and running pods when its agent or the
/// control plane stops.
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
pub struct SimSnapshot {
    pub objects: Vec<SnapshotObject>,
    /// Volumes (with their data's size and version) and transfers under way.
    #[serde(default)]
    pub data: data::DataSnapshot,
    /// Its pods, with their identities (`None` in a file of an earlier version: made anew).
    #[serde(default)]
    pub pods: Option<Vec<SnapshotPod>>,
    #[serde(default)]
    pub next_pod: u64,
    #[serde(default)]
    pub born: Option<orrery_api::Time>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SnapshotObject {
    pub manifest: Value,
    pub generation: i64,
    /// Completed pods of a Job.
    #[serde(default)]
    pub succeeded: i64,
    #[serde(default)]
    pub uid: Option<String>,
    #[serde(default)]
    pub created: Option<String>,
    /// When a Job completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed: Option<String>,
}

/// A pod as a snapshot keeps it: its owner, where it ran, and who it is.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotPod {
    pub id: u64,
    /// The owner's key: group, kind, namespace, name.
    pub owner: (String, String, String, String),
    #[serde(default)]
    pub ordinal: Option<i64>,
    /// Its node's name.
    #[serde(default)]
    pub node: Option<String>,
    pub phase: String,
    pub uid: String,
    pub created: orrery_api::Time,
    #[serde(default)]
    pub started: Option<orrery_api::Time>,
    #[serde(default)]
    pub restarts: u32,
}

/// A snapshot of a simulated cluster, for the admin endpoint and tests.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SimSummary {
    pub name: String,
    pub nodes: usize,
    pub ready_nodes: usize,
    pub pods_running: usize,
    pub pods_pending: usize,
    pub objects: usize,
    /// Pods created since the simulation started (a workload recreated shows here).
    pub pods_created: u64,
    /// Operations carried out for the agent so far (the journal's last sequence number).
    pub operations: u64,
    pub load: f64,
    pub outage: bool,
    pub latency_ms: u64,
}

impl SimCluster {
    pub fn new(name: &str, region: &str, spec: SimSpec) -> Self {
        let per_node = Res {
            cpu_m: spec.cpu.milli_value() as i64,
            mem: spec.memory.value() as i64,
            gpu: spec.gpu,
            pods: spec.pods,
        };
        let nodes = (0..spec.nodes)
            .map(|i| Node {
                name: format!("{name}-node-{i}"),
                allocatable: per_node,
                ready: true,
            })
            .collect();
        let seed = hash_value(&json!(name));
        let (tx, _) = tokio::sync::watch::channel(0);
        SimCluster {
            name: name.to_string(),
            region: region.to_string(),
            seed,
            started: Instant::now(),
            state: std::sync::Arc::new(Mutex::new(State {
                nodes,
                objects: BTreeMap::new(),
                pods: BTreeMap::new(),
                next_pod: 0,
                faults: Faults::default(),
                load: spec.load,
                busy: false,
                peers: Vec::new(),
                next_stamp: 0,
                stuck: Default::default(),
                journal: Default::default(),
                journal_seq: 0,
                restored_pods: 0,
                data: data::DataPlane::new(spec.bandwidth as f64),
                storage_default: spec.storage_classes.first().cloned().unwrap_or_default(),
                storage_classes: spec.storage_classes.clone(),
                attached: BTreeMap::new(),
                data_clock: Instant::now(),
                latency_overrides: BTreeMap::new(),
                pod_epochs: BTreeMap::new(),
                born: orrery_api::Time::now(),
            })),
            spec,
            changed: tx,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, State> {
        self.state.lock()
    }

    /// Writes an object's status as the member's own controller of its kind would (Kueue
    /// writing a ClusterQueue's usage, say); `false` if the member has no such object.
    pub fn set_status(&self, id: &ResourceIdentifier, status: Value) -> bool {
        let key = key_of(id);
        {
            let mut st = self.lock();
            let Some(o) = st.objects.get_mut(&key) else {
                return false;
            };
            if let Some(m) = o.manifest.as_object_mut() {
                m.insert("status".into(), status);
            }
            st.touch(&key);
        }
        self.bump();
        true
    }

    /// What someone in the member writes into a custom object's spec (`kubectl edit`
    /// there): each field of `spec` set, the others kept. `Err` names why not: no such object,
    /// or a workload the simulator runs pods for (its controller's spec, not edited here).
    pub fn set_spec(&self, id: &ResourceIdentifier, spec: &Value) -> Result<(), &'static str> {
        let key = key_of(id);
        {
            let mut st = self.lock();
            let Some(o) = st.objects.get_mut(&key) else {
                return Err("no such object");
            };
            if o.shape.is_some() {
                return Err("the simulator runs its pods: its spec is not edited here");
            }
            let fields = spec.as_object().cloned().unwrap_or_default();
            if let Some(m) = o.manifest.as_object_mut() {
                let have = m.entry("spec").or_insert_with(|| json!({}));
                if let Some(have) = have.as_object_mut() {
                    have.extend(fields);
                }
            }
            o.generation += 1;
            st.touch(&key);
        }
        self.bump();
        Ok(())
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Other clusters of the fleet (name, region), for the network figures.
    pub fn set_peers(&self, peers: Vec<(String, String)>) {
        self.lock().peers = peers;
    }

    /// Latency to other clusters, milliseconds, as a fleet file sets it (instead of what the
    /// regions would give).
    pub fn set_latency(&self, latency: BTreeMap<String, f64>) {
        self.lock().latency_overrides = latency;
    }

    /// The multiplier of the base load at `elapsed` (1.0 for flat).
    fn profile_factor(&self, elapsed: Duration) -> f64 {
        profile_factor(&self.spec, self.seed, elapsed)
    }

    /// Applies the current faults and moves pods along; returns whether anything changed.
    pub fn tick(&self) -> bool {
        let now = Instant::now();
        let mut st = self.lock();
        let mut changed = catch_up(&mut st, now);
        changed |= step_transfers(&mut st);
        if st.busy {
            changed |= advance(&mut st, &self.spec, now);
        }
        // A workload's usage follows its demand: read again when its window moves.
        let unix = unix_now();
        let moved: Vec<Key> = st
            .objects
            .iter_mut()
            .filter_map(|(k, o)| {
                let w = o.shape.as_ref()?.load?.window_at(unix);
                (w != o.load_window).then(|| {
                    o.load_window = w;
                    k.clone()
                })
            })
            .collect();
        for k in &moved {
            st.touch(k);
        }
        changed |= !moved.is_empty();
        drop(st);
        if changed {
            self.bump();
        }
        changed
    }

    pub fn set_faults(&self, f: Faults) {
        let mut st = self.lock();
        catch_up(&mut st, Instant::now());
        let n = st.nodes.len();
        let lost = f.lost_nodes.min(n);
        let mut moved = false;
        for (i, node) in st.nodes.iter_mut().enumerate() {
            let ready = i < n - lost;
            moved |= node.ready != ready;
            node.ready = ready;
        }
        if moved {
            // Pods on lost nodes go back to Pending, to be placed elsewhere.
            let lost_idx: Vec<usize> = (n - lost..n).collect();
            let now = Instant::now();
            for p in st.pods.values_mut() {
                if p.node.is_some_and(|i| lost_idx.contains(&i)) && p.phase != Phase::Succeeded {
                    p.node = None;
                    p.phase = Phase::Pending;
                    p.since = now;
                    p.started = None;
                }
            }
            st.busy = true;
        }
        let outage_flips = st.faults.outage != f.outage;
        st.faults = Faults {
            lost_nodes: lost,
            ..f
        };
        if moved || outage_flips {
            // Node readiness shows in DaemonSets and pods; an outage in every state read.
            let keys: Vec<Key> = st.objects.keys().cloned().collect();
            for k in &keys {
                st.touch(k);
            }
        }
        advance(&mut st, &self.spec, Instant::now());
        drop(st);
        self.bump();
    }

    pub fn faults(&self) -> Faults {
        self.lock().faults.clone()
    }

    /// Changes the base background load (a fraction of capacity).
    pub fn set_load(&self, load: f64) {
        self.lock().load = load.clamp(0.0, 1.0);
        self.bump();
    }

    pub fn summary(&self) -> SimSummary {
        let st = self.lock();
        SimSummary {
            name: self.name.clone(),
            nodes: st.nodes.len(),
            ready_nodes: st.nodes.iter().filter(|n| n.ready).count(),
            pods_running: st
                .pods
                .values()
                .filter(|p| p.phase == Phase::Running)
                .count(),
            pods_pending: st
                .pods
                .values()
                .filter(|p| p.phase == Phase::Pending)
                .count(),
            objects: st.objects.len(),
            pods_created: st.next_pod - st.restored_pods,
            operations: st.journal_seq,
            load: st.load,
            outage: st.faults.outage,
            latency_ms: st.faults.latency.as_millis() as u64,
        }
    }

    /// A counter that moves whenever the member's state may have changed.
    pub fn version(&self) -> u64 {
        *self.changed.borrow()
    }

    /// The objects the member holds, to start it again where it was.
    pub fn snapshot(&self) -> SimSnapshot {
        let st = self.lock();
        SimSnapshot {
            objects: st
                .objects
                .values()
                .map(|o| SnapshotObject {
                    manifest: o.manifest.clone(),
                    generation: o.generation,
                    succeeded: o.succeeded,
                    uid: Some(o.uid.clone()),
                    created: Some(o.created.clone()),
                    completed: o.completed.clone(),
                })
                .collect(),
            data: st.data.snapshot_state(),
            pods: Some(
                st.pods
                    .iter()
                    .map(|(id, p)| SnapshotPod {
                        id: *id,
                        owner: p.owner.clone(),
                        ordinal: p.ordinal,
                        node: p.node.and_then(|i| st.nodes.get(i)).map(|n| n.name.clone()),
                        phase: match p.phase {
                            Phase::Pending => "Pending",
                            Phase::Starting => "Starting",
                            Phase::Running => "Running",
                            Phase::Succeeded => "Succeeded",
                        }
                        .into(),
                        uid: p.uid.clone(),
                        created: p.created,
                        started: p.started,
                        restarts: p.restarts,
                    })
                    .collect(),
            ),
            next_pod: st.next_pod,
            born: Some(st.born),
        }
    }

    /// Puts back what a snapshot holds, as it was: the objects, their pods placed and running
    /// at once. Nothing is journaled and no pod counts as created: nothing was done to the
    /// member. Meant for a member that holds nothing yet.
    pub fn restore(&self, snap: SimSnapshot) {
        let now = Instant::now();
        let wall = orrery_api::Time::now();
        let mut st = self.lock();
        st.data.restore(snap.data);
        if let Some(b) = snap.born {
            st.born = b;
        }
        for o in snap.objects {
            let Some(id) = ResourceIdentifier::of(0, &o.manifest) else {
                continue;
            };
            let key = key_of(&id);
            let shape = shape_of(&o.manifest);
            // A snapshot from before completions were timed: done as of now.
            let completed = o.completed.or_else(|| {
                shape
                    .as_ref()
                    .is_some_and(|sh| sh.kind == WorkloadKind::Job && o.succeeded >= sh.completions)
                    .then(|| wall.to_string())
            });
            st.objects.insert(
                key.clone(),
                SimObject {
                    manifest: o.manifest,
                    generation: o.generation,
                    shape,
                    succeeded: o.succeeded,
                    unschedulable: 0,
                    volume_block: None,
                    stamp: 0,
                    load_window: 0,
                    created: o.created.unwrap_or_else(|| wall.to_string()),
                    uid: o.uid.unwrap_or_else(new_uid),
                    completed,
                },
            );
        }
        // The pods as they were: the same names, uids, times and nodes (a pod whose node is
        // gone waits for another, as a real cluster's would).
        let mut max_id = None;
        for p in snap.pods.into_iter().flatten() {
            let owner: Key = p.owner.clone();
            let Some(shape) = st.objects.get(&owner).and_then(|o| o.shape.clone()) else {
                continue;
            };
            let node = p
                .node
                .as_ref()
                .and_then(|n| st.nodes.iter().position(|x| x.name == *n && x.ready));
            let phase = match (p.phase.as_str(), node) {
                ("Succeeded", _) => Phase::Succeeded,
                (_, None) => Phase::Pending,
                ("Pending", _) => Phase::Pending,
                _ => Phase::Running,
            };
            // Its timers from when it started, as far as this clock can go back.
            let since = p
                .started
                .and_then(|t| {
                    now.checked_sub(Duration::from_secs(wall.seconds_since(t).max(0) as u64))
                })
                .unwrap_or(now);
            max_id = max_id.max(Some(p.id));
            st.pods.insert(
                p.id,
                Pod {
                    owner,
                    ordinal: p.ordinal,
                    template: shape.template,
                    request: shape.request,
                    node,
                    phase,
                    since,
                    uid: p.uid,
                    created: p.created,
                    started: p.started.filter(|_| phase == Phase::Running),
                    restarts: p.restarts,
                },
            );
        }
        st.next_pod = snap.next_pod.max(max_id.map_or(0, |m| m + 1));
        let keys: Vec<Key> = st.objects.keys().cloned().collect();
        for key in keys {
            st.touch(&key);
            // Fills what the snapshot did not have (a file of an earlier version) and trims
            // what the spec no longer asks for.
            reconcile_pods(&mut st, &key, now);
        }
        advance(&mut st, &self.spec, now);
        for p in st.pods.values_mut() {
            if p.phase == Phase::Starting {
                p.phase = Phase::Running;
                p.started.get_or_insert(wall);
            }
        }
        let owners: Vec<Key> = st.objects.keys().cloned().collect();
        for k in &owners {
            st.touch(k);
        }
        st.restored_pods = st.next_pod;
        drop(st);
        self.bump();
    }

    /// What happened to the member's data after `since` (a sequence number), oldest first.
    pub fn data_log(&self, since: u64) -> Vec<data::DataEvent> {
        self.lock().data.log(since)
    }

    /// The operations carried out after `since` (a journal sequence number), oldest first.
    pub fn journal(&self, since: u64) -> Vec<JournalEntry> {
        let st = self.lock();
        st.journal
            .iter()
            .filter(|e| e.seq > since)
            .cloned()
            .collect()
    }

    /// Every object the member holds, as applied, with its current status (sorted by kind,
    /// namespace and name).
    pub fn objects(&self) -> Vec<Value> {
        let st = self.lock();
        let mut keys: Vec<&Key> = st.objects.keys().collect();
        keys.sort();
        keys.into_iter()
            .map(|k| {
                let o = &st.objects[k];
                let mut m = o.manifest.clone();
                let state = self.object_state(&st, k, o);
                if let Some(status) = state.status {
                    m["status"] = status;
                }
                if !state.volumes.is_empty() {
                    m["status"]["volumes"] = json!(state.volumes);
                }
                m
            })
            .collect()
    }

    async fn gate(&self) -> Result<(), BackendError> {
        let (outage, latency) = {
            let st = self.lock();
            (st.faults.outage, st.faults.latency)
        };
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        if outage {
            return Err(BackendError::Unavailable(format!(
                "simulated outage of {}",
                self.name
            )));
        }
        Ok(())
    }

    /// The status of an object that is no workload: a claim's volume, a Service's
    /// endpoints, or what the member's own controllers wrote.
    fn plain_object_state(&self, st: &State, key: &Key, obj: &SimObject) -> ObjectState {
        // A claim shows its volume, as a bound PersistentVolumeClaim's status shows its
        // capacity.
        let volumes = if key.1 == "PersistentVolumeClaim" {
            st.data
                .volume(&key.2, &key.3)
                .map(|v| vec![v.status()])
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        // Other kinds show what the member's own controllers wrote (an operator's
        // custom resource; set through the admin endpoint here).
        let status = volumes
            .first()
            .map(|v| json!({"phase": "Bound", "capacity": {"storage": v.capacity}}))
            .or_else(|| {
                (key.0.is_empty() && key.1 == "ResourceQuota")
                    .then(|| quota_status(st, &key.2, &obj.manifest))
            })
            .or_else(|| obj.manifest.get("status").cloned());
        let endpoints = (key.0.is_empty() && key.1 == "Service")
            .then(|| self.service_endpoints(st, &key.2, &obj.manifest))
            .flatten();
        ObjectState {
            health: Health::Healthy,
            status,
            generation: Some(obj.generation),
            message: String::new(),
            volumes,
            usage: None,
            endpoints,
            restarts: None,
        }
    }

    /// The object's status in the style of its kind's controller.
    fn object_state(&self, st: &State, key: &Key, obj: &SimObject) -> ObjectState {
        let Some(shape) = &obj.shape else {
            return self.plain_object_state(st, key, obj);
        };
        let pods: Vec<&Pod> = st.pods.values().filter(|p| &p.owner == key).collect();
        let current: Vec<&&Pod> = pods
            .iter()
            .filter(|p| p.template == shape.template)
            .collect();
        let ready = current.iter().filter(|p| p.phase == Phase::Running).count() as i64;
        let status = workload_status(st, key, obj, shape, &pods, &current, ready);
        let mut with_status = obj.manifest.clone();
        with_status["status"] = status.clone();
        let (health, message) = workload_health(obj, shape, &with_status);
        let usage = workload_usage(shape, ready, pods.len());
        // The restarts of its current pods: the revision a rollout gates.
        let restarts = current.iter().map(|p| i64::from(p.restarts)).sum();
        ObjectState {
            health,
            status: Some(status),
            generation: Some(obj.generation),
            message,
            volumes: workload_volumes(st, key, shape),
            usage,
            endpoints: None,
            restarts: Some(restarts),
        }
    }

    /// A pod's address: each member has a /16 of its own in 10.0.0.0/8 (from its name), and
    /// each pod an address in it for as long as it lives.
    fn pod_address(&self, pod: u64) -> String {
        let net = 1 + (self.seed % 250);
        let host = (pod % 65_534) + 1;
        format!("10.{net}.{}.{}", host >> 8, host & 0xff)
    }

    /// A Service's endpoints, as the member's EndpointSlice controller would make them: the
    /// pods of the namespace whose labels its selector matches, ready while they run.
    fn service_endpoints(
        &self,
        st: &State,
        namespace: &str,
        service: &Value,
    ) -> Option<orrery_api::services::ServiceEndpoints> {
        use orrery_api::services::{Endpoint, EndpointConditions, Port, ServiceEndpoints};
        let selector = service.pointer("/spec/selector")?.as_object()?;
        if selector.is_empty() {
            return None;
        }
        let matches = |labels: Option<&Value>| {
            selector
                .iter()
                .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
        };
        let mut endpoints = Vec::new();
        let mut template = None;
        for (id, pod) in &st.pods {
            if pod.owner.2 != namespace {
                continue;
            }
            let Some(owner) = st.objects.get(&pod.owner) else {
                continue;
            };
            let pod_template = if pod.owner.1 == "Pod" {
                &owner.manifest
            } else {
                match owner.manifest.pointer("/spec/template") {
                    Some(t) => t,
                    None => continue,
                }
            };
            if !matches(pod_template.pointer("/metadata/labels")) {
                continue;
            }
            template.get_or_insert(pod_template);
            if pod.phase == Phase::Succeeded {
                continue;
            }
            endpoints.push(Endpoint {
                addresses: vec![self.pod_address(*id)],
                // StatefulSet pods have stable host names, as their DNS records do.
                hostname: pod.ordinal.map(|o| format!("{}-{o}", pod.owner.3)),
                conditions: EndpointConditions {
                    ready: Some(pod.phase == Phase::Running),
                },
                zone: None,
            });
        }
        // Target ports: a number, or a container port's name in the pods' template.
        let container_port = |name: &str| -> Option<i64> {
            template?
                .pointer("/spec/containers")?
                .as_array()?
                .iter()
                .flat_map(|c| {
                    c.get("ports")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                })
                .find(|p| p.get("name").and_then(Value::as_str) == Some(name))?
                .get("containerPort")?
                .as_i64()
        };
        let ports = service
            .pointer("/spec/ports")
            .and_then(Value::as_array)
            .map(|ps| {
                ps.iter()
                    .filter_map(|p| {
                        let mut port = Port::of_service_port(p)?;
                        // The endpoints serve on the target port.
                        match p.get("targetPort") {
                            Some(Value::Number(n)) => {
                                port.port = i32::try_from(n.as_i64()?).ok()?
                            }
                            Some(Value::String(name)) => {
                                port.port = i32::try_from(container_port(name)?).ok()?;
                            }
                            _ => {}
                        }
                        Some(port)
                    })
                    .collect()
            })
            .unwrap_or_default();
        Some(ServiceEndpoints {
            address_type: "IPv4".into(),
            endpoints,
            ports,
        })
    }
}

/// A ResourceQuota's status as the member's quota controller writes it: its hard limits, and
/// what the namespace's pods that have not finished request, for the limits it names.
fn quota_status(st: &State, namespace: &str, manifest: &Value) -> Value {
    let hard = manifest
        .pointer("/spec/hard")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let live = st
        .pods
        .values()
        .filter(|p| p.owner.2 == namespace && p.phase != Phase::Succeeded);
    let sum = live.fold(workload::Res::default(), |a, p| {
        a.add(p.request).add(workload::Res {
            pods: 1,
            ..Default::default()
        })
    });
    let all = sum.to_list(true);
    let mut used = serde_json::Map::new();
    for name in hard.as_object().into_iter().flat_map(|h| h.keys()) {
        let base = name.strip_prefix("requests.").unwrap_or(name);
        let q = all
            .get(base)
            .cloned()
            .unwrap_or_else(|| orrery_api::Quantity::from_int(0, orrery_api::Format::DecimalSI));
        used.insert(name.clone(), json!(q.to_string()));
    }
    json!({"hard": hard, "used": used})
}

/// A workload's status as its kind's controller writes it, from its pods (`current`:
/// those of its current template; `ready`: of those, the running).
fn workload_status(
    st: &State,
    key: &Key,
    obj: &SimObject,
    shape: &Shape,
    pods: &[&Pod],
    current: &[&&Pod],
    ready: i64,
) -> Value {
    let generation = obj.generation;
    match (key.1.as_str(), shape.kind) {
        ("Deployment", _) => {
            let available = ready >= shape.replicas;
            json!({
                "observedGeneration": generation,
                "replicas": pods.len(),
                "updatedReplicas": current.len(),
                "readyReplicas": ready,
                "availableReplicas": ready,
                "unavailableReplicas": (shape.replicas - ready).max(0),
                "conditions": [
                    {"type": "Available", "status": if available { "True" } else { "False" },
                     "reason": if available { "MinimumReplicasAvailable" } else { "MinimumReplicasUnavailable" }},
                    {"type": "Progressing", "status": "True",
                     "reason": if current.len() as i64 == shape.replicas && available { "NewReplicaSetAvailable" } else { "ReplicaSetUpdated" }},
                ],
            })
        }
        ("StatefulSet", _) => json!({
            "observedGeneration": generation, "replicas": pods.len(), "readyReplicas": ready,
            "currentReplicas": current.len(), "updatedReplicas": current.len(), "availableReplicas": ready,
        }),
        (_, WorkloadKind::Replicated) => json!({
            "observedGeneration": generation, "replicas": pods.len(), "readyReplicas": ready,
            "availableReplicas": ready, "fullyLabeledReplicas": pods.len(),
        }),
        (_, WorkloadKind::DaemonSet) => {
            let want = st.nodes.iter().filter(|n| n.ready).count();
            json!({
                "observedGeneration": generation, "desiredNumberScheduled": want,
                "currentNumberScheduled": pods.iter().filter(|p| p.node.is_some()).count(),
                "numberReady": ready, "updatedNumberScheduled": current.len(), "numberAvailable": ready,
                "numberMisscheduled": 0,
            })
        }
        (_, WorkloadKind::Job) => {
            let active = pods.iter().filter(|p| p.phase != Phase::Succeeded).count();
            // As the Job controller: started when the member took it, completed when the
            // last completion was reached.
            let mut s = json!({"active": active, "succeeded": obj.succeeded, "failed": 0,
                               "startTime": obj.created});
            if obj.succeeded >= shape.completions {
                s["conditions"] =
                    json!([{"type": "Complete", "status": "True", "reason": "CompletionsReached"}]);
                s["active"] = json!(0);
                if let Some(t) = &obj.completed {
                    s["completionTime"] = json!(t);
                }
            }
            s
        }
        (_, WorkloadKind::Pod) => {
            let phase = match pods.first().map(|p| p.phase) {
                Some(Phase::Running) => "Running",
                Some(Phase::Succeeded) => "Succeeded",
                _ => "Pending",
            };
            let node = pods
                .first()
                .and_then(|p| p.node)
                .and_then(|i| st.nodes.get(i))
                .map(|n| n.name.clone());
            json!({"phase": phase, "nodeName": node})
        }
    }
}

/// A workload's health as its status reads, unless pods cannot be scheduled or wait
/// for a volume.
fn workload_health(obj: &SimObject, shape: &Shape, with_status: &Value) -> (Health, String) {
    let (mut health, mut message) = orrery_api::interpret::health(with_status);
    if obj.unschedulable > 0 {
        health = Health::Unhealthy;
        message = format!(
            "{} pod(s) cannot be scheduled: no node has room for {}m cpu, {} bytes of memory{}",
            obj.unschedulable,
            shape.request.cpu_m,
            shape.request.mem,
            if shape.request.gpu > 0 {
                format!(", {} gpu", shape.request.gpu)
            } else {
                String::new()
            }
        );
    }
    if let Some(why) = &obj.volume_block {
        health = Health::Unhealthy;
        message = format!("pods wait for a volume: {why}");
    }
    (health, message)
}

/// What a workload's `ready` pods use of what they ask (of `pods` in all), under its
/// load profile if it has one.
fn workload_usage(
    shape: &Shape,
    ready: i64,
    pods: usize,
) -> Option<orrery_api::work::WorkloadUsage> {
    shape.load.map(|l| {
        // The demand spreads over the ready pods, each using up to BURST times its request;
        // memory follows the cpu a little (caches, buffers).
        let cpu_request = ready * shape.request.cpu_m;
        let used = if ready == 0 {
            0
        } else {
            l.demand_m(unix_now())
                .min((cpu_request as f64 * BURST) as i64)
        };
        let busy = if cpu_request > 0 {
            (used as f64 / cpu_request as f64).min(1.0)
        } else {
            0.0
        };
        let memory_request = ready * shape.request.mem;
        orrery_api::work::WorkloadUsage {
            ready_pods: ready,
            unready_pods: (pods as i64 - ready).max(0),
            cpu_milli: used,
            cpu_request_milli: cpu_request,
            memory_bytes: (memory_request as f64 * (0.4 + 0.4 * busy)) as i64,
            memory_request_bytes: memory_request,
        }
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn applied_crds_are_served() {
        let crd = serde_json::json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "databases.example.com"},
            "spec": {"group": "example.com", "names": {"plural": "databases", "kind": "Database"},
                "versions": [{"name": "v1", "served": true}, {"name": "v0", "served": false}]},
        });
        let cm =
            serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}});
        let served = |objs: &[Value]| -> Vec<String> {
            api_enablements(objs.iter())
                .into_iter()
                .flat_map(|e| {
                    e.resources
                        .into_iter()
                        .map(move |r| format!("{}/{}", e.group_version, r.kind))
                })
                .collect()
        };
        let before = served(std::slice::from_ref(&cm));
        assert!(before.contains(&"apps/v1/Deployment".to_string()));
        assert!(!before.iter().any(|k| k.contains("Database")));
        let after = served(&[cm, crd]);
        assert!(
            after.contains(&"example.com/v1/Database".to_string()),
            "{after:?}"
        );
        assert!(
            !after.contains(&"example.com/v0/Database".to_string()),
            "{after:?}"
        );
    }

    use super::*;
    use crate::backend::api_enablements;
    use orrery_agent::backend::Backend;
    use orrery_api::Quantity;
    use orrery_api::work::{MANAGED_LABEL, MANAGED_VALUE};

    fn deployment(name: &str, replicas: i64, cpu: &str, mem: &str) -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": "default", "labels": {MANAGED_LABEL: MANAGED_VALUE}},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [
                        {"name": "c", "image": "x", "resources": {"requests": {"cpu": cpu, "memory": mem}}}]}}}
        })
    }

    fn id(m: &Value) -> ResourceIdentifier {
        ResourceIdentifier::of(0, m).unwrap()
    }

    fn spec(s: &str) -> SimSpec {
        s.parse().unwrap()
    }

    #[test]
    fn specs_parse_and_refuse_nonsense() {
        let s = spec("nodes=8,cpu=32,memory=128Gi,gpu=0,pods=110,load=0.3,profile=flat");
        assert_eq!(s.nodes, 8);
        assert_eq!(s.cpu.milli_value(), 32_000);
        assert_eq!(s.memory.value(), 128 << 30);
        assert_eq!(s.profile, Profile::Flat);
        assert_eq!(
            spec("profile=diurnal,period=60s").period,
            Duration::from_secs(60)
        );
        let paths = spec("bandwidth=1Gi,path.archive=20Mi,path.w-2=100Mi").paths;
        assert_eq!(paths["archive"], 20 << 20);
        assert_eq!(paths["w-2"], 100 << 20);
        let priced =
            spec("cpuCoreHour=0.04,memoryGiBHour=0.005,capacityType=spot,interruptionRate=0.05");
        assert_eq!(priced.prices[orrery_api::cost::CPU_CORE_HOUR], "0.04");
        assert_eq!(priced.prices[orrery_api::cost::CAPACITY_TYPE], "spot");
        // In any order.
        spec("interruptionRate=0.05,capacityType=spot");
        for bad in [
            "cpuCoreHour=cheap",
            "gpuHour=-2",
            "capacityType=reserved",
            "interruptionRate=0.1",
            "interruptionRate=0.1,capacityType=on-demand",
            "capacityType=spot,interruptionRate=3",
            "nodes=0",
            "cpu=-1",
            "load=1.5",
            "profile=wavy",
            "color=blue",
            "nodes",
            "memory=lots",
            "start=5 years",
            "path.Bad_Name=1Gi",
            "path.archive=0",
        ] {
            assert!(bad.parse::<SimSpec>().is_err(), "{bad}");
        }
    }

    #[test]
    fn requests_sum_containers_and_take_the_larger_init() {
        let r = pod_request(&json!({
            "containers": [{"resources": {"requests": {"cpu": "250m", "memory": "64Mi"}}},
                           {"resources": {"requests": {"cpu": "1"}}}],
            "initContainers": [{"resources": {"requests": {"cpu": "2", "memory": "1Mi"}}}]
        }));
        assert_eq!((r.cpu_m, r.mem, r.pods), (2000, 64 << 20, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_restored_member_holds_what_it_held_with_nothing_done() {
        let sim = SimCluster::new("c", "r", spec("nodes=2,cpu=4,memory=8Gi,load=0,start=1s"));
        let d = deployment("web", 3, "1500m", "1Gi");
        sim.apply(&d, false, &Cause::default()).await.unwrap();
        sim.apply(&deployment("web", 3, "1", "1Gi"), false, &Cause::default())
            .await
            .unwrap();
        tokio::time::advance(Duration::from_millis(1100)).await;
        sim.tick();
        let before = sim.state(&id(&d)).await.unwrap().unwrap();
        let snap: SimSnapshot =
            serde_json::from_value(serde_json::to_value(sim.snapshot()).unwrap()).unwrap();

        let again = SimCluster::new("c", "r", spec("nodes=2,cpu=4,memory=8Gi,load=0,start=1s"));
        again.restore(snap);
        let after = again.state(&id(&d)).await.unwrap().unwrap();
        assert_eq!(after.health, Health::Healthy, "running at once: {after:?}");
        assert_eq!(after.status, before.status);
        let s = again.summary();
        assert_eq!((s.objects, s.pods_running), (1, 3));
        assert_eq!(s.pods_created, 0, "restored pods were not created");
        assert_eq!(s.operations, 0, "a restore is no operation");
        assert!(again.journal(0).is_empty());
        // The generation carries on: the next change of the spec is the third.
        again
            .apply(&deployment("web", 4, "1", "1Gi"), false, &Cause::default())
            .await
            .unwrap();
        assert_eq!(again.snapshot().objects[0].generation, 3);
        assert_eq!(again.summary().pods_created, 1);
    }

    /// A member restarted from its snapshot keeps its pods as a real cluster does: the same
    /// ids (so names), uids, creation and start times and nodes, and its objects' uids and
    /// creation times; a new pod after it takes a new id.
    #[tokio::test(start_paused = true)]
    async fn a_restored_member_keeps_its_pods_identities() {
        let sim = SimCluster::new("c", "r", spec("nodes=2,cpu=4,memory=8Gi,load=0,start=1s"));
        for n in [3, 1, 3] {
            sim.apply(
                &deployment("web", n, "100m", "64Mi"),
                false,
                &Cause::default(),
            )
            .await
            .unwrap();
            tokio::time::advance(Duration::from_millis(1100)).await;
            sim.tick();
        }
        let before = sim.snapshot();
        let pods = before.pods.clone().unwrap();
        assert_eq!(pods.len(), 3);
        assert!(
            pods.iter().any(|p| p.id > 2),
            "ids skip after churn: {pods:?}"
        );
        assert!(
            pods.iter()
                .all(|p| p.phase == "Running" && p.started.is_some() && p.node.is_some())
        );
        // Through a file, with one creation time far in the past (a restore that made pods
        // anew, now, could not keep it).
        let mut v = serde_json::to_value(&before).unwrap();
        v["pods"][0]["created"] = json!("2020-01-01T00:00:00Z");
        let snap: SimSnapshot = serde_json::from_value(v).unwrap();
        let want = snap.clone();
        let again = SimCluster::new("c", "r", spec("nodes=2,cpu=4,memory=8Gi,load=0,start=1s"));
        tokio::time::advance(Duration::from_secs(5)).await;
        again.restore(snap);
        let after = again.snapshot();
        let key = |p: &SnapshotPod| {
            (
                p.id,
                p.uid.clone(),
                p.created,
                p.started,
                p.node.clone(),
                p.phase.clone(),
            )
        };
        let mut a: Vec<_> = after.pods.clone().unwrap().iter().map(key).collect();
        let mut b: Vec<_> = want.pods.clone().unwrap().iter().map(key).collect();
        a.sort();
        b.sort();
        assert_eq!(a, b);
        assert_eq!(after.objects[0].uid, before.objects[0].uid);
        assert_eq!(after.objects[0].created, before.objects[0].created);
        assert_eq!(again.summary().pods_created, 0);
        // Scaled up: a new id, not one reused.
        again
            .apply(
                &deployment("web", 4, "100m", "64Mi"),
                false,
                &Cause::default(),
            )
            .await
            .unwrap();
        let ids: Vec<u64> = again
            .snapshot()
            .pods
            .unwrap()
            .iter()
            .map(|p| p.id)
            .collect();
        let newest = ids.iter().max().unwrap();
        assert_eq!(*newest, before.next_pod, "{ids:?}");
        // A file of an earlier version (no pods) still restores, its pods made anew.
        let mut old = serde_json::to_value(&before).unwrap();
        old.as_object_mut().unwrap().remove("pods");
        let third = SimCluster::new("c", "r", spec("nodes=2,cpu=4,memory=8Gi,load=0,start=1s"));
        third.restore(serde_json::from_value(old).unwrap());
        assert_eq!(third.summary().pods_running, 3);
    }

    fn statefulset(name: &str, replicas: i64, extra: Value) -> Value {
        let mut s = json!({
            "apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": name, "namespace": "default", "labels": {MANAGED_LABEL: MANAGED_VALUE}},
            "spec": {"replicas": replicas, "serviceName": name, "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}, "annotations": {
                        VOLUME_USED_ANNOTATION: "100Mi", WRITE_RATE_ANNOTATION: "1Mi"}},
                    "spec": {"containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "100m"}}}]}},
                "volumeClaimTemplates": [{"metadata": {"name": "data"},
                    "spec": {"resources": {"requests": {"storage": "1Gi"}}}}]}
        });
        if let (Some(spec), Some(extra)) = (s["spec"].as_object_mut(), extra.as_object()) {
            for (k, v) in extra {
                spec.insert(k.clone(), v.clone());
            }
        }
        s
    }

    const MI: i64 = 1 << 20;

    #[tokio::test(start_paused = true)]
    async fn statefulsets_own_a_volume_per_ordinal_written_while_their_pods_run() {
        let sim = SimCluster::new("c", "r", spec("nodes=2,cpu=4,memory=8Gi,load=0,start=1s"));
        let db = statefulset("db", 2, json!({}));
        sim.apply(&db, false, &Cause::default()).await.unwrap();
        let vols = sim.state(&id(&db)).await.unwrap().unwrap().volumes;
        let names: Vec<(&str, Option<i64>)> =
            vols.iter().map(|v| (v.name.as_str(), v.ordinal)).collect();
        assert_eq!(names, [("data-db-0", Some(0)), ("data-db-1", Some(1))]);
        assert_eq!(vols[0].used_bytes, 100 * MI);
        assert_eq!(
            vols[0].storage_class, "standard",
            "the member's default class"
        );
        assert_eq!(vols[0].started_version, None, "no pod runs yet");
        tokio::time::advance(Duration::from_millis(1100)).await;
        sim.tick();
        let v = &sim.state(&id(&db)).await.unwrap().unwrap().volumes[0];
        assert_eq!(v.started_version, Some(1));
        // Two seconds of writing at 1 MiB/s.
        tokio::time::advance(Duration::from_secs(2)).await;
        sim.tick();
        let v = &sim.state(&id(&db)).await.unwrap().unwrap().volumes[0];
        assert_eq!(v.used_bytes, 102 * MI);
        assert!(v.data_version > 1);
        // A scale-down removes the highest ordinal; its volume stays, unwritten.
        sim.apply(&statefulset("db", 1, json!({})), false, &Cause::default())
            .await
            .unwrap();
        let kept = sim.state(&id(&db)).await.unwrap().unwrap().volumes;
        assert_eq!(kept.len(), 2);
        assert_eq!(kept[1].started_version, None);
        let frozen = kept[1].data_version;
        tokio::time::advance(Duration::from_secs(1)).await;
        sim.tick();
        let kept = sim.state(&id(&db)).await.unwrap().unwrap().volumes;
        assert_eq!(kept[1].data_version, frozen, "no pod, no writes");
        assert!(kept[0].data_version > frozen);
        // Deleting the StatefulSet keeps its volumes (Kubernetes' default retention).
        sim.delete(&id(&db), &Cause::default()).await.unwrap();
        assert!(sim.lock().data.volume("default", "data-db-0").is_some());
        // With `whenDeleted: Delete` they go with it.
        let owned = statefulset(
            "db",
            1,
            json!({"persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete"}}),
        );
        sim.apply(&owned, false, &Cause::default()).await.unwrap();
        sim.delete(&id(&owned), &Cause::default()).await.unwrap();
        let left: Vec<String> = sim.lock().data.volumes().map(|v| v.name.clone()).collect();
        assert_eq!(left, ["data-db-1"], "ordinal 0 went with it; 1 was not its");
        let events: Vec<&str> = sim.data_log(0).iter().map(|e| e.event).collect();
        assert!(events.contains(&"pod-started") && events.contains(&"pod-stopped"));
    }

    #[tokio::test]
    async fn latency_comes_from_regions_or_what_the_fleet_file_says() {
        let sim = SimCluster::new("a", "eu", spec("nodes=1"));
        sim.set_peers(vec![
            ("a".into(), "eu".into()),
            ("b".into(), "eu".into()),
            ("c".into(), "us".into()),
        ]);
        let l = sim.report().await.unwrap().network.unwrap().latency_ms;
        assert_eq!(l["b"], 2.0);
        assert!((30.0..150.0).contains(&l["c"]), "{l:?}");
        assert_eq!(
            l["c"],
            region_latency("c", "us", "a", "eu"),
            "the same both ways"
        );
        assert!(!l.contains_key("a"));
        sim.set_latency([("c".to_string(), 7.5), ("far".to_string(), 300.0)].into());
        let l = sim.report().await.unwrap().network.unwrap().latency_ms;
        assert_eq!((l["c"], l["far"], l["b"]), (7.5, 300.0, 2.0));
        let fleet = crate::fleet::FleetFile::parse(
            "clusters:\n- {name: x, region: eu, simulate: nodes=1, latency: {y: 12}}\n",
        )
        .unwrap();
        assert_eq!(fleet[0].latency["y"], 12.0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_missing_storage_class_or_claim_keeps_pods_waiting() {
        let sim = SimCluster::new(
            "c",
            "r",
            spec("nodes=2,cpu=4,memory=8Gi,load=0,storageclasses=standard:fast"),
        );
        assert_eq!(
            sim.report().await.unwrap().storage_classes,
            ["standard", "fast"]
        );
        let mut db = statefulset("db", 1, json!({}));
        db["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"] = json!("ultra");
        sim.apply(&db, false, &Cause::default()).await.unwrap();
        let s = sim.state(&id(&db)).await.unwrap().unwrap();
        assert_eq!(s.health, Health::Unhealthy);
        assert!(s.message.contains("\"ultra\" not found"), "{}", s.message);
        // A Deployment mounting a claim waits for the claim, and starts once it exists.
        let mut d = deployment("files", 1, "100m", "64Mi");
        d["spec"]["template"]["spec"]["volumes"] =
            json!([{"name": "v", "persistentVolumeClaim": {"claimName": "shared"}}]);
        sim.apply(&d, false, &Cause::default()).await.unwrap();
        let s = sim.state(&id(&d)).await.unwrap().unwrap();
        assert!(s.message.contains("\"shared\" not found"), "{}", s.message);
        let pvc = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "shared", "namespace": "default", "labels": {MANAGED_LABEL: MANAGED_VALUE}},
            "spec": {"storageClassName": "fast", "resources": {"requests": {"storage": "10Gi"}}}});
        sim.apply(&pvc, false, &Cause::default()).await.unwrap();
        tokio::time::advance(Duration::from_millis(600)).await;
        sim.tick();
        let s = sim.state(&id(&d)).await.unwrap().unwrap();
        assert_eq!(s.health, Health::Healthy, "{s:?}");
        assert_eq!(s.volumes[0].storage_class, "fast");
        assert_eq!(
            s.volumes[0].used_bytes,
            5 << 30,
            "half the claim by default"
        );
        let claim = sim.state(&id(&pvc)).await.unwrap().unwrap();
        assert_eq!(claim.status.unwrap()["phase"], "Bound");
    }

    #[tokio::test(start_paused = true)]
    async fn a_statefulset_moves_with_its_data_between_two_members() {
        use orrery_api::stateful::{Transfer, TransferRole, TransferVolume};
        let a = SimCluster::new(
            "a",
            "r",
            spec("nodes=2,cpu=4,memory=8Gi,load=0,start=1s,bandwidth=50Mi"),
        );
        let b = SimCluster::new(
            "b",
            "r",
            spec("nodes=2,cpu=4,memory=8Gi,load=0,start=1s,bandwidth=100Mi"),
        );
        let db = statefulset("db", 1, json!({}));
        a.apply(&db, false, &Cause::default()).await.unwrap();
        tokio::time::advance(Duration::from_millis(1100)).await;
        a.tick();
        let vol = |tv: &TransferVolume| TransferVolume { ..tv.clone() };
        let base = TransferVolume {
            name: "data-db-0".into(),
            ordinal: Some(0),
            capacity: Some(Quantity::from_int(1 << 30, orrery_api::Format::BinarySI)),
            ..Default::default()
        };
        let send = |round: u32, after_fence: bool| Transfer {
            id: "m".into(),
            role: TransferRole::Send,
            namespace: "default".into(),
            peer: "b".into(),
            round,
            after_fence,
            workload: "StatefulSet/db".into(),
            volumes: vec![vol(&base)],
            ..Default::default()
        };
        a.set_transfers("w", &[send(1, false)]).await.unwrap();
        let s1 = a.transfer_statuses("w", &[send(1, false)]).await[0].clone();
        assert_eq!(s1.volumes[0].bytes, 100 * MI, "everything it held");
        // The fence: replicas 0; the final snapshot is taken once the pod is gone.
        a.set_transfers("w", &[send(2, true)]).await.unwrap();
        assert_eq!(a.transfer_statuses("w", &[send(2, true)]).await[0].round, 1);
        a.apply(&statefulset("db", 0, json!({})), false, &Cause::default())
            .await
            .unwrap();
        let s2 = a.transfer_statuses("w", &[send(2, true)]).await[0].clone();
        assert!(s2.complete && s2.fenced, "{s2:?}");
        let fenced = s2.volumes[0].data_version;
        // The target copies the final state in one go and then runs the workload on it.
        let receive = Transfer {
            id: "m".into(),
            role: TransferRole::Receive,
            namespace: "default".into(),
            peer: "a".into(),
            round: 2,
            volumes: vec![TransferVolume {
                bytes: s2.volumes[0].used_bytes,
                data_version: fenced,
                used_bytes: s2.volumes[0].used_bytes,
                ..vol(&base)
            }],
            rate: 50 * MI,
            hold_workload: true,
            ..Default::default()
        };
        b.set_transfers("w", std::slice::from_ref(&receive))
            .await
            .unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
        b.tick();
        let r = b
            .transfer_statuses("w", std::slice::from_ref(&receive))
            .await[0]
            .clone();
        assert!(!r.complete, "100 MiB at 50 MiB/s takes two seconds");
        assert_eq!(r.volumes[0].copied, 50 * MI);
        tokio::time::advance(Duration::from_millis(1100)).await;
        b.tick();
        assert!(b.transfer_statuses("w", &[receive]).await[0].complete);
        b.apply(&statefulset("db", 1, json!({})), false, &Cause::default())
            .await
            .unwrap();
        tokio::time::advance(Duration::from_millis(1100)).await;
        b.tick();
        let v = &b.state(&id(&db)).await.unwrap().unwrap().volumes[0];
        assert_eq!(
            v.started_version,
            Some(fenced),
            "the target starts on the fenced data"
        );
        let created = b
            .data_log(0)
            .iter()
            .filter(|e| e.event == "volume-created")
            .count();
        assert_eq!(
            created, 1,
            "the StatefulSet took the copied volume, made none"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn pods_bin_pack_wait_and_start() {
        let sim = SimCluster::new("c", "r", spec("nodes=2,cpu=4,memory=8Gi,load=0,start=1s"));
        let d = deployment("web", 3, "1500m", "1Gi");
        sim.apply(&d, false, &Cause::default()).await.unwrap();
        // 2 nodes x 4 cpu: two 1.5-cpu pods fit on each node.
        let s = sim.state(&id(&d)).await.unwrap().unwrap();
        assert_eq!(s.health, Health::Progressing);
        assert_eq!(s.status.as_ref().unwrap()["readyReplicas"], 0);
        tokio::time::advance(Duration::from_millis(1100)).await;
        sim.tick();
        let s = sim.state(&id(&d)).await.unwrap().unwrap();
        assert_eq!(s.status.as_ref().unwrap()["readyReplicas"], 3);
        assert_eq!(s.health, Health::Healthy, "{s:?}");
        // Scale beyond capacity: one pod fits (4 pods of 1.5 cpu), the fifth waits.
        sim.apply(
            &deployment("web", 5, "1500m", "1Gi"),
            false,
            &Cause::default(),
        )
        .await
        .unwrap();
        tokio::time::advance(Duration::from_millis(1100)).await;
        sim.tick();
        let s = sim.state(&id(&d)).await.unwrap().unwrap();
        assert_eq!(s.status.as_ref().unwrap()["readyReplicas"], 4);
        assert_eq!(s.health, Health::Unhealthy);
        assert!(
            s.message.contains("1 pod(s) cannot be scheduled"),
            "{}",
            s.message
        );
        let r = sim.report().await.unwrap();
        assert_eq!(r.resource_summary.allocating["cpu"].milli_value(), 1500);
        assert_eq!(r.resource_summary.allocated["cpu"].milli_value(), 6000);
        assert_eq!(r.largest_node_free["cpu"].milli_value(), 1000);
        // Deleting frees the room.
        sim.delete(&id(&d), &Cause::default()).await.unwrap();
        let r = sim.report().await.unwrap();
        assert_eq!(r.resource_summary.allocated["cpu"].milli_value(), 0);
        assert!(sim.state(&id(&d)).await.unwrap().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn background_load_holds_room_and_shows_in_usage() {
        let sim = SimCluster::new(
            "c",
            "r",
            spec("nodes=1,cpu=10,memory=10Gi,load=0.5,start=0s"),
        );
        let d = deployment("big", 1, "6", "1Gi");
        sim.apply(&d, false, &Cause::default()).await.unwrap();
        let s = sim.state(&id(&d)).await.unwrap().unwrap();
        assert_eq!(
            s.health,
            Health::Unhealthy,
            "half the node is held by background load"
        );
        let r = sim.report().await.unwrap();
        assert_eq!(r.resource_summary.allocated["cpu"].milli_value(), 5000);
        assert_eq!(r.resource_summary.usage["cpu"].milli_value(), 5000);
        let wl = orrery_api::cluster::water_level(&r.resource_summary);
        assert_eq!(wl.dimensions["cpu"], 0.5);
        sim.set_load(0.2);
        sim.apply(&d, false, &Cause::default()).await.unwrap();
        tokio::time::advance(Duration::from_millis(10)).await;
        sim.tick();
        assert_eq!(
            sim.state(&id(&d)).await.unwrap().unwrap().health,
            Health::Healthy
        );
    }

    #[tokio::test(start_paused = true)]
    async fn jobs_complete_and_daemonsets_follow_nodes() {
        let sim = SimCluster::new(
            "c",
            "r",
            spec("nodes=3,cpu=4,memory=4Gi,load=0,start=0s,job=2s"),
        );
        let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "d"},
            "spec": {"completions": 3, "parallelism": 2, "template": {"spec": {"containers": [{"name": "c"}]}}}});
        sim.apply(&job, false, &Cause::default()).await.unwrap();
        // Two rounds of 2 s each, plus a tick per transition.
        for _ in 0..16 {
            tokio::time::advance(Duration::from_millis(500)).await;
            sim.tick();
        }
        let s = sim.state(&id(&job)).await.unwrap().unwrap();
        assert_eq!(s.status.as_ref().unwrap()["succeeded"], 3, "{s:?}");
        assert_eq!(s.health, Health::Healthy);
        // Its start and completion, as a Job controller writes them (kubectl's DURATION),
        // and the same after the member starts again.
        let times = |st: &Value| {
            (
                st["startTime"].as_str().map(str::to_string),
                st["completionTime"].as_str().map(str::to_string),
            )
        };
        let (start, done) = times(s.status.as_ref().unwrap());
        assert!(start.is_some() && done >= start, "{s:?}");
        let again = SimCluster::new(
            "c",
            "r",
            spec("nodes=3,cpu=4,memory=4Gi,load=0,start=0s,job=2s"),
        );
        again.restore(sim.snapshot());
        let after = again.state(&id(&job)).await.unwrap().unwrap();
        assert_eq!(times(after.status.as_ref().unwrap()), (start, done));

        let ds = json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "ds", "namespace": "d"},
            "spec": {"template": {"spec": {"containers": [{"name": "c"}]}}}});
        sim.apply(&ds, false, &Cause::default()).await.unwrap();
        tokio::time::advance(Duration::from_millis(10)).await;
        sim.tick();
        let st = sim.state(&id(&ds)).await.unwrap().unwrap().status.unwrap();
        assert_eq!(
            (
                st["desiredNumberScheduled"].as_i64(),
                st["numberReady"].as_i64()
            ),
            (Some(3), Some(3))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn faults_lose_nodes_stop_the_api_and_add_latency() {
        let sim = SimCluster::new("c", "r", spec("nodes=2,cpu=4,memory=4Gi,load=0,start=0s"));
        let d = deployment("web", 2, "3", "1Gi");
        sim.apply(&d, false, &Cause::default()).await.unwrap();
        tokio::time::advance(Duration::from_millis(10)).await;
        sim.tick();
        assert_eq!(
            sim.state(&id(&d)).await.unwrap().unwrap().health,
            Health::Healthy
        );
        sim.set_faults(Faults {
            lost_nodes: 1,
            ..Default::default()
        });
        let s = sim.state(&id(&d)).await.unwrap().unwrap();
        assert_eq!(
            s.health,
            Health::Unhealthy,
            "the lost node's pod has nowhere to go"
        );
        assert_eq!(sim.report().await.unwrap().node_summary.ready_num, 1);
        sim.set_faults(Faults {
            outage: true,
            ..Default::default()
        });
        assert!(matches!(
            sim.report().await,
            Err(BackendError::Unavailable(_))
        ));
        assert!(matches!(
            sim.apply(&d, false, &Cause::default()).await,
            Err(BackendError::Unavailable(_))
        ));
        sim.set_faults(Faults {
            latency: Duration::from_millis(300),
            ..Default::default()
        });
        let t = Instant::now();
        sim.report().await.unwrap();
        assert!(t.elapsed() >= Duration::from_millis(300));
        tokio::time::advance(Duration::from_millis(10)).await;
        sim.tick();
        assert_eq!(
            sim.state(&id(&d)).await.unwrap().unwrap().health,
            Health::Healthy,
            "nodes came back"
        );
    }

    /// The stamp contract: whenever an object's state reads differently, its stamp moved
    /// (the agent trusts an unchanged stamp and reports nothing); a tick that changes nothing
    /// leaves every stamp alone.
    #[tokio::test(start_paused = true)]
    async fn a_state_never_changes_under_the_same_stamp() {
        let sim = SimCluster::new(
            "c",
            "r",
            spec("nodes=2,cpu=4,memory=8Gi,load=0,start=1s,job=2s"),
        );
        let web = deployment("web", 3, "1500m", "1Gi");
        let big = deployment("big", 2, "3", "1Gi");
        let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "default",
            "labels": {MANAGED_LABEL: MANAGED_VALUE}},
            "spec": {"completions": 2, "parallelism": 1, "template": {"spec": {"containers": [{"name": "c"}]}}}});
        let ds = json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "ds", "namespace": "default",
            "labels": {MANAGED_LABEL: MANAGED_VALUE}},
            "spec": {"template": {"spec": {"containers": [{"name": "c"}]}}}});
        let ids = [id(&web), id(&big), id(&job), id(&ds)];
        let mut seen: Vec<Option<(u64, Option<ObjectState>)>> = vec![None; ids.len()];
        // Checks every object against what was seen last; returns how many stamps moved.
        async fn check(
            sim: &SimCluster,
            ids: &[ResourceIdentifier],
            seen: &mut [Option<(u64, Option<ObjectState>)>],
            step: &str,
        ) -> usize {
            let mut moved = 0;
            for (i, id) in ids.iter().enumerate() {
                let Some(stamp) = sim.state_stamp(id) else {
                    seen[i] = None;
                    continue;
                };
                let state = sim.state(id).await.unwrap();
                match &seen[i] {
                    Some((s, old)) if *s == stamp => assert_eq!(
                        old, &state,
                        "{step}: {} changed under stamp {stamp}",
                        id.name
                    ),
                    _ => moved += 1,
                }
                seen[i] = Some((stamp, state));
            }
            moved
        }
        check(&sim, &ids, &mut seen, "start").await;
        sim.apply(&web, false, &Cause::default()).await.unwrap();
        check(&sim, &ids, &mut seen, "web applied").await;
        for m in [&big, &job, &ds] {
            sim.apply(m, false, &Cause::default()).await.unwrap();
            check(&sim, &ids, &mut seen, "applied").await;
        }
        for step in 0..12 {
            tokio::time::advance(Duration::from_millis(500)).await;
            sim.tick();
            check(&sim, &ids, &mut seen, &format!("tick {step}")).await;
        }
        // Settled (the Job is done, big waits for room): a tick changes nothing, and no
        // stamp moves.
        sim.tick();
        assert_eq!(check(&sim, &ids, &mut seen, "quiet tick").await, 0);
        sim.set_faults(Faults {
            lost_nodes: 1,
            ..Default::default()
        });
        check(&sim, &ids, &mut seen, "a node lost").await;
        sim.set_faults(Faults {
            outage: true,
            lost_nodes: 1,
            ..Default::default()
        });
        assert_eq!(sim.state_stamp(&ids[0]), None, "no stamp in an outage");
        sim.set_faults(Faults::default());
        for step in 0..4 {
            tokio::time::advance(Duration::from_millis(500)).await;
            sim.tick();
            check(&sim, &ids, &mut seen, &format!("recovery {step}")).await;
        }
        sim.apply(
            &deployment("web", 1, "1500m", "1Gi"),
            false,
            &Cause::default(),
        )
        .await
        .unwrap();
        assert!(check(&sim, &ids, &mut seen, "web scaled down").await >= 1);
        sim.delete(&ids[1], &Cause::default()).await.unwrap();
        check(&sim, &ids, &mut seen, "big deleted").await;
        assert_eq!(
            sim.state_stamp(&ids[1]),
            Some(0),
            "an absent object's stamp"
        );
    }

    #[tokio::test]
    async fn unmanaged_objects_are_not_taken_over_unless_asked() {
        let sim = SimCluster::new("c", "r", SimSpec::default());
        let mut theirs = deployment("web", 1, "1", "1Gi");
        theirs["metadata"]["labels"] = json!({});
        sim.apply(&theirs, true, &Cause::default()).await.unwrap();
        let ours = deployment("web", 2, "1", "1Gi");
        assert!(matches!(
            sim.apply(&ours, false, &Cause::default()).await,
            Err(BackendError::Conflict(_))
        ));
        sim.apply(&ours, true, &Cause::default()).await.unwrap();
        sim.apply(&ours, false, &Cause::default()).await.unwrap();
    }

    #[test]
    fn profiles_vary_as_described() {
        let flat = SimCluster::new("a", "r", spec("profile=flat"));
        assert_eq!(flat.profile_factor(Duration::from_secs(1000)), 1.0);
        let d = SimCluster::new("a", "r", spec("profile=diurnal,period=100s"));
        assert!((d.profile_factor(Duration::from_secs(25)) - 1.6).abs() < 1e-9);
        assert!((d.profile_factor(Duration::from_secs(75)) - 0.4).abs() < 1e-9);
        let s = SimCluster::new("a", "r", spec("profile=spikes,period=240s"));
        let factors: Vec<f64> = (0..240)
            .map(|w| s.profile_factor(Duration::from_secs(w * 10)))
            .collect();
        assert!(factors.iter().any(|f| *f > 1.0) && factors.contains(&1.0));
        // A trend adds its share each period; noise is the same for the same seed and time.
        let t = spec("profile=flat,period=100s,trend=0.2");
        assert!((profile_factor(&t, 1, Duration::from_secs(250)) - 1.5).abs() < 1e-9);
        let n = spec("profile=diurnal,period=100s,noise=0.1");
        let at = |seed, s| profile_factor(&n, seed, Duration::from_secs(s));
        assert_eq!(at(7, 33), at(7, 33));
        let spread: Vec<f64> = (0..96)
            .map(|w| {
                at(7, w)
                    - profile_factor(
                        &spec("profile=diurnal,period=100s"),
                        7,
                        Duration::from_secs(w),
                    )
            })
            .collect();
        assert!(spread.iter().any(|d| d.abs() > 0.01), "{spread:?}");
        // Persistent noise: windows next to each other are alike, far apart they are not;
        // without persistence they are independent. Unit variance either way.
        let corr = |rho: f64, lag: u64| {
            let xs: Vec<f64> = (0..20_000).map(|w| persistent_noise(3, w, rho)).collect();
            let var = xs.iter().map(|x| x * x).sum::<f64>() / xs.len() as f64;
            let c = (lag as usize..xs.len())
                .map(|w| xs[w] * xs[w - lag as usize])
                .sum::<f64>()
                / (xs.len() - lag as usize) as f64;
            (var, c / var)
        };
        let (var, c1) = corr(0.9, 1);
        assert!(
            (var - 1.0).abs() < 0.1 && (c1 - 0.9).abs() < 0.05,
            "{var} {c1}"
        );
        let (_, c20) = corr(0.9, 20);
        assert!(c20.abs() < 0.25, "{c20}");
        let (var, c1) = corr(0.0, 1);
        assert!((var - 1.0).abs() < 0.1 && c1.abs() < 0.05, "{var} {c1}");
        assert_eq!(spec("persistence=0.5").persistence, 0.5);
        for bad in [
            "trend=2",
            "noise=-0.1",
            "noise=lots",
            "persistence=1",
            "persistence=-0.2",
        ] {
            assert!(bad.parse::<SimSpec>().is_err(), "{bad}");
        }
    }
}
