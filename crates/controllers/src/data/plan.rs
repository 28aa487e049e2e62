//! The data mover's plan as a function of what is stored: DataSets (spec and status), the
//! DataTransfers, what members report in the data sets' Works, and who reads what where. No
//! clock of its own and no I/O, so a restart computes the same next step from the same facts
//! and nothing is copied twice.
//!
//! - **Copies.** Each copy of a data set in a member is the claim `dataset-<name>` in the data
//!   set's namespace, carried by a Work of its own (`orrery-dataset.<namespace>.<name>`): at
//!   an authoritative location the claim Orrery adopts, elsewhere a cache the data mover fills.
//! - **Transfers.** A workload placed where its input is not, a cache falling behind its
//!   source, a region reading a data set often, or a user's DataTransfer, each make a copy
//!   round: the source snapshots the claim (`Send`), the destination copies what the snapshot
//!   says it lacks on top of the version it holds (`Receive`), at the booked rate.
//! - **Links.** Every cluster's uplink carries its outgoing and its incoming transfers; a
//!   transfer starts only with a rate both ends still have, and keeps it to the end, so the
//!   rates booked on a link never add up to more than its bandwidth.
//! - **Caches.** Copies that are not authoritative live in the cluster's cache tier
//!   (`cache.orrery.io/capacity`); beyond it, the copies no workload there reads and no
//!   transfer fills go, the coldest first (fewest reads from their region in the last hour,
//!   then least recently used). An authoritative copy is never evicted.

use std::collections::{BTreeMap, BTreeSet};

use orrery_api::Time;
use orrery_api::data::{
    CopyRole, DataAccess, DataCopy, DataReader, DataSetSpec, DataSetStatus, DataTransferSpec,
    DataTransferStatus, RegionAccess, Tier, TransferPhase,
};
use orrery_api::stateful::{Transfer, TransferRole, TransferStatus, TransferVolume, VolumeStatus};
use orrery_api::work::{ConflictResolution, WorkSpec, Workload};
use serde_json::{Value, json};

/// The data mover's knobs.
#[derive(Clone, Debug)]
pub struct Settings {
    /// How long finished DataTransfers are kept (as a record) before they are deleted.
    pub keep_done_seconds: i64,
    /// Reads from one region in the last hour that make a data set hot there: a region this
    /// hot with no copy gets a cache copy.
    pub hot_reads: u32,
    /// A transfer starts only with at least this share of the slower end's bandwidth free
    /// (else it queues rather than crawl).
    pub min_share: f64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            keep_done_seconds: 600,
            hot_reads: 2,
            min_share: 0.1,
        }
    }
}

/// What the data mover knows of a cluster.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Cluster {
    /// Ready and without the health controller's taints: it can act and report.
    pub serving: bool,
    pub region: String,
    /// Uplink bytes per second, each way.
    pub bandwidth: i64,
    /// Bytes of its cache tier.
    pub cache_bytes: i64,
    /// The best storage tier it offers.
    pub tier: Tier,
    /// The copies of data sets it holds of its own (its claims labelled `orrery.io/dataset`).
    pub held: Vec<orrery_api::data::HeldDataSet>,
    /// What the paths to other clusters carry, bytes per second, where it reports them
    /// slower than both uplinks.
    pub paths: BTreeMap<String, i64>,
}

/// What the path between clusters `a` and `b` carries: the slower uplink, or less where either
/// end reports the path slower.
fn path(clusters: &BTreeMap<String, Cluster>, a: &str, b: &str) -> i64 {
    let (Some(x), Some(y)) = (clusters.get(a), clusters.get(b)) else {
        return 0;
    };
    [x.paths.get(b), y.paths.get(a)]
        .into_iter()
        .flatten()
        .filter(|p| **p > 0)
        .fold(x.bandwidth.min(y.bandwidth).max(0), |bw, p| bw.min(*p))
}

/// What a member reports in a data set's Work.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Seen {
    /// The claim's volume.
    pub volume: Option<VolumeStatus>,
    pub transfers: Vec<TransferStatus>,
}

/// One data set and what is known of it.
#[derive(Clone, Debug, Default)]
pub struct Set {
    pub namespace: String,
    pub name: String,
    pub spec: DataSetSpec,
    pub status: DataSetStatus,
    /// What each cluster holding a Work of it reports.
    pub seen: BTreeMap<String, Seen>,
    /// The workloads placed now that read it.
    pub readers: Vec<DataReader>,
}

/// A DataTransfer.
#[derive(Clone, Debug, Default)]
pub struct Xfer {
    pub namespace: String,
    pub name: String,
    pub spec: DataTransferSpec,
    pub status: DataTransferStatus,
    pub created: Option<Time>,
}

#[derive(Debug)]
pub struct Input<'a> {
    pub now: Time,
    pub settings: &'a Settings,
    pub clusters: &'a BTreeMap<String, Cluster>,
    pub sets: &'a [Set],
    pub transfers: &'a [Xfer],
}

/// A data set's Work in one cluster: (cluster, namespace, data set).
pub type WorkKey = (String, String, String);
/// A namespaced name.
pub type NKey = (String, String);

#[derive(Debug, Default, PartialEq)]
pub struct Output {
    /// Every data set's status.
    pub statuses: BTreeMap<NKey, DataSetStatus>,
    /// Every Work the data sets want; any other data set Work goes.
    pub works: BTreeMap<WorkKey, WorkSpec>,
    /// Every DataTransfer's status.
    pub transfer_statuses: BTreeMap<NKey, DataTransferStatus>,
    /// DataTransfers to make.
    pub create: Vec<(NKey, DataTransferSpec)>,
    /// DataTransfers to delete (finished long enough ago).
    pub delete: Vec<NKey>,
}

/// The id of the copy rounds of a data set into a cluster (the Send and Receive transfers'
/// id in the members): one per copy, so each round copies what changed since the last.
pub fn transfer_id(namespace: &str, set: &str, destination: &str) -> String {
    format!("dataset-{namespace}-{set}-{destination}")
}

/// The name of a copy's DataTransfer of round `round`.
pub fn transfer_name(set: &str, destination: &str, round: u32) -> String {
    let full = format!("{set}-{destination}-{round}");
    if full.len() <= 253 {
        full
    } else {
        format!(
            "{}-{}",
            &full[..240],
            orrery_api::binding::short_hash(&full)
        )
    }
}

/// The name of a data set's Work in a cluster's namespace.
pub fn work_name(namespace: &str, set: &str) -> String {
    let full = format!("{WORK_PREFIX}{namespace}.{set}");
    if full.len() <= 253 {
        full
    } else {
        format!(
            "{}-{}",
            &full[..240],
            orrery_api::binding::short_hash(&full)
        )
    }
}

/// What the reason of a transfer to a relay begins with.
pub const RELAY_REASON: &str = "relay:";

/// What the names of data set Works begin with.
pub const WORK_PREFIX: &str = "orrery-dataset.";

const HOUR: i64 = 3600;
const DAY: i64 = 24 * HOUR;
/// Reads kept per cluster and data set.
const MAX_TIMES: usize = 64;

/// Bytes per second booked on each cluster's uplink, each way, and on each path between two.
#[derive(Debug, Default)]
struct Links {
    out: BTreeMap<String, i64>,
    inn: BTreeMap<String, i64>,
    paths: BTreeMap<(String, String), i64>,
}

impl Links {
    fn pair(s: &str, d: &str) -> (String, String) {
        if s <= d {
            (s.to_string(), d.to_string())
        } else {
            (d.to_string(), s.to_string())
        }
    }

    /// What a transfer from `s` to `d` may book now, and what the path carries at most.
    fn free(&self, clusters: &BTreeMap<String, Cluster>, s: &str, d: &str) -> (i64, i64) {
        let bw = |c: &str| clusters.get(c).map_or(0, |c| c.bandwidth.max(0));
        let most = path(clusters, s, d);
        let out = bw(s) - self.out.get(s).copied().unwrap_or(0);
        let inn = bw(d) - self.inn.get(d).copied().unwrap_or(0);
        let on_path = most - self.paths.get(&Self::pair(s, d)).copied().unwrap_or(0);
        (out.min(inn).min(on_path).max(0), most)
    }

    fn book(&mut self, s: &str, d: &str, rate: i64) {
        *self.out.entry(s.to_string()).or_default() += rate;
        *self.inn.entry(d.to_string()).or_default() += rate;
        *self.paths.entry(Self::pair(s, d)).or_default() += rate;
    }
}

pub fn step(i: &Input<'_>) -> Output {
    let mut out = Output::default();
    let mut links = Links::default();
    for t in i.transfers.iter().filter(|t| t.status.phase.books()) {
        links.book(&t.status.source, &t.spec.destination, t.status.rate);
    }
    // Each data set's transfers, oldest first: the first asked is the first booked.
    let mut by_set: BTreeMap<NKey, Vec<&Xfer>> = BTreeMap::new();
    let mut ordered: Vec<&Xfer> = i.transfers.iter().collect();
    ordered.sort_by_key(|t| (t.created.map(|c| c.unix_seconds()), t.name.clone()));
    let sets: BTreeSet<NKey> = i
        .sets
        .iter()
        .map(|s| (s.namespace.clone(), s.name.clone()))
        .collect();
    for t in ordered {
        let k = (t.namespace.clone(), t.spec.data_set.clone());
        if sets.contains(&k) {
            by_set.entry(k).or_default().push(t);
        } else {
            // A transfer of a data set that does not exist fails (and is kept a while).
            let mut st = t.status.clone();
            if !st.phase.is_done() {
                st.phase = TransferPhase::Failed;
                st.message = format!("data set {} not found", t.spec.data_set);
                st.completion_time = Some(i.now);
            }
            finish(i, t, st, &mut out);
        }
    }
    // Every transfer's name: a new one takes a name no other has (two data sets' names and
    // destinations can run together: `a-b` to `c`, `a` to `b-c`).
    let mut names: BTreeSet<NKey> = i
        .transfers
        .iter()
        .map(|t| (t.namespace.clone(), t.name.clone()))
        .collect();
    // The cache bytes each cluster's readers hold now (copies no eviction may take).
    let mut held: BTreeMap<String, i64> = BTreeMap::new();
    for set in i.sets {
        for c in &set.status.copies {
            if c.role == CopyRole::Cache && set.readers.iter().any(|r| r.cluster == c.cluster) {
                *held.entry(c.cluster.clone()).or_default() += set.spec.bytes();
            }
        }
    }
    let mut states: Vec<SetState> = Vec::new();
    for set in i.sets {
        let k = (set.namespace.clone(), set.name.clone());
        let mut s = SetState::new(i, set);
        let transfers = by_set.remove(&k).unwrap_or_default();
        for t in &transfers {
            let st = s.advance(i, t, &mut links);
            finish(i, t, st, &mut out);
        }
        s.ask(i, &transfers, &mut names, &held, &mut out);
        states.push(s);
    }
    evict(i, &mut states);
    for mut s in states {
        let SetState { status, .. } = &mut s;
        status.rounds.retain(|c, _| i.clusters.contains_key(c));
        for c in &status.copies {
            if c.round > 0 {
                let r = status.rounds.entry(c.cluster.clone()).or_default();
                *r = (*r).max(c.round);
            }
        }
        s.works(i, &mut out);
        out.statuses
            .insert((s.set.namespace.clone(), s.set.name.clone()), s.status);
    }
    out
}

/// Ends a transfer that cannot go on: failed, with why; it books no bandwidth any more.
fn fail(i: &Input<'_>, st: &mut DataTransferStatus, message: String) {
    st.phase = TransferPhase::Failed;
    st.message = message;
    st.completion_time = Some(i.now);
    st.rate = 0;
}

/// Records a transfer's status, and deletes it once finished long enough ago.
fn finish(i: &Input<'_>, t: &Xfer, st: DataTransferStatus, out: &mut Output) {
    let k = (t.namespace.clone(), t.name.clone());
    let expired = st.phase.is_done()
        && st.completion_time.is_some_and(|c| {
            i.now.unix_seconds() - c.unix_seconds() >= i.settings.keep_done_seconds
        });
    if expired {
        out.delete.push(k);
    } else {
        out.transfer_statuses.insert(k, st);
    }
}

/// One data set while it is planned.
struct SetState<'a> {
    set: &'a Set,
    status: DataSetStatus,
    /// The Send round each source is asked for, by destination.
    sending: BTreeMap<String, u32>,
    /// Clusters a transfer is filling (they are pinned).
    filling: BTreeSet<String>,
    /// Regions a copy is arriving in (from a transfer under way or queued).
    arriving: BTreeMap<String, String>,
    /// Relays to fill, each with the destination it passes the copy on to.
    relays: BTreeMap<String, String>,
}

impl<'a> SetState<'a> {
    fn new(i: &Input<'_>, set: &'a Set) -> Self {
        let now = i.now;
        let mut st = set.status.clone();
        let size = set.spec.bytes();
        // Authoritative copies are the spec's; a cache where one is now named becomes it.
        st.copies.retain(|c| {
            i.clusters.contains_key(&c.cluster)
                && (c.role != CopyRole::Authoritative
                    || set.spec.locations.iter().any(|l| l.cluster == c.cluster))
        });
        for l in &set.spec.locations {
            let version = set
                .seen
                .get(&l.cluster)
                .and_then(|s| s.volume.as_ref())
                .map(|v| v.data_version);
            match st.copies.iter_mut().find(|c| c.cluster == l.cluster) {
                Some(c) => {
                    c.role = CopyRole::Authoritative;
                    c.tier = l.tier;
                    c.present = true;
                    c.bytes = size;
                    c.source.clear();
                    c.round = 0;
                    c.round_bytes = 0;
                    c.round_version = 0;
                    c.round_base = 0;
                    c.round_used = 0;
                    if let Some(v) = version {
                        c.data_version = v;
                    }
                }
                None => st.copies.push(DataCopy {
                    cluster: l.cluster.clone(),
                    role: CopyRole::Authoritative,
                    tier: l.tier,
                    present: true,
                    bytes: size,
                    data_version: version.unwrap_or(0),
                    last_used: Some(now),
                    ..Default::default()
                }),
            }
        }
        // Copies members report of their own, where Orrery has none.
        st.copies.retain(|c| {
            c.role != CopyRole::Reported || Self::reported(i, set, &c.cluster).is_some()
        });
        for name in i.clusters.keys() {
            let Some(h) = Self::reported(i, set, name) else {
                continue;
            };
            match st.copies.iter_mut().find(|c| c.cluster == *name) {
                Some(c) if c.role == CopyRole::Reported => {
                    c.bytes = h.bytes;
                    c.data_version = h.data_version;
                }
                Some(_) => {}
                None => st.copies.push(DataCopy {
                    cluster: name.clone(),
                    role: CopyRole::Reported,
                    tier: i.clusters.get(name).map_or(Tier::Warm, |c| c.tier),
                    present: true,
                    bytes: h.bytes,
                    data_version: h.data_version,
                    last_used: Some(now),
                    ..Default::default()
                }),
            }
        }
        st.copies.sort_by(|a, b| a.cluster.cmp(&b.cluster));
        // Reads: every workload newly placed somewhere is a read there.
        let mut readers = set.readers.clone();
        readers.sort_by(|a, b| (&a.cluster, &a.workload).cmp(&(&b.cluster, &b.workload)));
        readers.dedup();
        for r in &readers {
            if st.readers.contains(r) {
                continue;
            }
            let region = i
                .clusters
                .get(&r.cluster)
                .map(|c| c.region.clone())
                .unwrap_or_default();
            match st.accesses.iter_mut().find(|a| a.cluster == r.cluster) {
                Some(a) => {
                    a.times.push(now);
                    a.region = region;
                }
                None => st.accesses.push(DataAccess {
                    cluster: r.cluster.clone(),
                    region,
                    times: vec![now],
                }),
            }
            if let Some(c) = st.copies.iter_mut().find(|c| c.cluster == r.cluster) {
                c.last_used = Some(now);
            }
        }
        st.readers = readers;
        for a in st.accesses.iter_mut() {
            a.times
                .retain(|t| now.unix_seconds() - t.unix_seconds() < DAY);
            let extra = a.times.len().saturating_sub(MAX_TIMES);
            a.times.drain(..extra);
        }
        st.accesses.retain(|a| !a.times.is_empty());
        st.accesses.sort_by(|a, b| a.cluster.cmp(&b.cluster));
        let mut regions: BTreeMap<String, RegionAccess> = BTreeMap::new();
        for a in &st.accesses {
            let r = regions.entry(a.region.clone()).or_insert(RegionAccess {
                region: a.region.clone(),
                ..Default::default()
            });
            for t in &a.times {
                let age = now.unix_seconds() - t.unix_seconds();
                r.last_day += 1;
                if age < HOUR {
                    r.last_hour += 1;
                }
            }
        }
        st.regions = regions.into_values().collect();
        st.transfers.clear();
        SetState {
            set,
            status: st,
            sending: BTreeMap::new(),
            filling: BTreeSet::new(),
            arriving: BTreeMap::new(),
            relays: BTreeMap::new(),
        }
    }

    /// What cluster `c` reports holding of the data set, of its own.
    fn reported<'i>(
        i: &'i Input<'_>,
        set: &Set,
        c: &str,
    ) -> Option<&'i orrery_api::data::HeldDataSet> {
        i.clusters
            .get(c)?
            .held
            .iter()
            .find(|h| h.namespace == set.namespace && h.name == set.name)
    }

    fn region(i: &Input<'_>, c: &str) -> String {
        i.clusters
            .get(c)
            .map(|c| c.region.clone())
            .unwrap_or_default()
    }

    fn serving(i: &Input<'_>, c: &str) -> bool {
        i.clusters.get(c).is_some_and(|c| c.serving)
    }

    /// The copy a transfer to `dest` should come from: a readable copy of the newest data in
    /// a serving cluster, in the destination's region first, then over the fastest link. (A
    /// cache behind the newest is no source: two stale caches would refresh each other for
    /// ever.)
    fn source_for(&self, i: &Input<'_>, dest: &str, wanted: &str) -> Option<String> {
        let region = Self::region(i, dest);
        let bw = |c: &str| path(i.clusters, c, dest);
        let readable = |c: &&DataCopy| {
            c.present
                && c.cluster != dest
                && Self::serving(i, &c.cluster)
                && (wanted.is_empty() || c.cluster == wanted)
        };
        let newest = self
            .status
            .copies
            .iter()
            .filter(readable)
            .map(|c| c.data_version)
            .max()?;
        self.status
            .copies
            .iter()
            .filter(readable)
            .filter(|c| c.data_version >= newest)
            .min_by_key(|c| {
                (
                    Self::region(i, &c.cluster) != region,
                    std::cmp::Reverse(bw(&c.cluster)),
                    c.role != CopyRole::Authoritative,
                    c.cluster.clone(),
                )
            })
            .map(|c| c.cluster.clone())
    }

    /// The cluster a copy from `source` to `dest` should pass through, when the path between
    /// them is slower than both uplinks and two hops through a serving cluster whose cache
    /// tier can hold the copy beat it (the hops one after the other: the relay holds the whole
    /// copy before it passes it on).
    fn relay_for(&self, i: &Input<'_>, source: &str, dest: &str) -> Option<String> {
        let direct = path(i.clusters, source, dest);
        let up = |c: &str| i.clusters.get(c).map_or(0, |c| c.bandwidth);
        if direct <= 0 || direct >= up(source).min(up(dest)) {
            return None;
        }
        let size = self.set.spec.bytes();
        let secs = |bw: i64| {
            if bw > 0 {
                1.0 / bw as f64
            } else {
                f64::INFINITY
            }
        };
        i.clusters
            .iter()
            .filter(|(n, c)| {
                n.as_str() != source
                    && n.as_str() != dest
                    && c.serving
                    && (c.cache_bytes >= size
                        || self
                            .status
                            .copy(n)
                            .is_some_and(|c| c.role == CopyRole::Cache))
            })
            .map(|(n, _)| {
                (
                    secs(path(i.clusters, source, n)) + secs(path(i.clusters, n, dest)),
                    n,
                )
            })
            .filter(|(two, _)| *two < secs(direct))
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(b.1)))
            .map(|(_, n)| n.clone())
    }

    /// One transfer's next step: a queued one starts ([`Self::start`]); one under way ends
    /// early when its source copy went, `dest` got a copy of its own or a later round replaced
    /// it, else waits for its snapshot ([`Self::await_snapshot`]) and then its copy
    /// ([`Self::await_copy`]).
    fn advance(&mut self, i: &Input<'_>, t: &Xfer, links: &mut Links) -> DataTransferStatus {
        let mut st = t.status.clone();
        let dest = t.spec.destination.clone();
        if st.phase.is_done() {
            if st.phase == TransferPhase::Succeeded {
                self.done(&dest, &st);
            }
            return st;
        }
        if !i.clusters.contains_key(&dest) {
            fail(i, &mut st, format!("no cluster {dest}"));
            return st;
        }
        let id = transfer_id(&self.set.namespace, &self.set.name, &dest);
        match st.phase {
            TransferPhase::Queued => self.start(i, t, &dest, links, &mut st),
            TransferPhase::Snapshot | TransferPhase::Copying
                if !self.status.copy(&st.source).is_some_and(|c| c.present) =>
            {
                let message = format!("the copy at {} it was taken from is gone", st.source);
                fail(i, &mut st, message);
            }
            TransferPhase::Snapshot | TransferPhase::Copying
                if self
                    .status
                    .copy(&dest)
                    .is_some_and(|c| c.role != CopyRole::Cache) =>
            {
                st.phase = TransferPhase::Succeeded;
                st.message = format!("{dest} holds a copy of its own");
                st.completion_time = Some(i.now);
                st.rate = 0;
            }
            TransferPhase::Snapshot | TransferPhase::Copying
                if self
                    .status
                    .copy(&dest)
                    .is_some_and(|c| c.role == CopyRole::Cache && c.round > st.round) =>
            {
                fail(i, &mut st, format!("a later round into {dest} replaced it"));
            }
            TransferPhase::Snapshot => self.await_snapshot(i, &id, &dest, &mut st),
            TransferPhase::Copying => self.await_copy(i, &id, &dest, &mut st),
            TransferPhase::Succeeded | TransferPhase::Failed => {}
        }
        st
    }

    /// A queued transfer into `dest`: it succeeds at once where `dest` needs nothing copied,
    /// waits while a copy into `dest` is under way, for a source ([`Self::pick_source`]) or
    /// for bandwidth, and otherwise starts a round from the source.
    fn start(
        &mut self,
        i: &Input<'_>,
        t: &Xfer,
        dest: &str,
        links: &mut Links,
        st: &mut DataTransferStatus,
    ) {
        let copy = self.status.copy(dest).cloned();
        if copy.as_ref().is_some_and(|c| c.role != CopyRole::Cache) {
            st.phase = TransferPhase::Succeeded;
            st.message = format!("{dest} holds a copy of its own");
            st.completion_time = Some(i.now);
            return;
        }
        // One copy into a cluster at a time (a user's DataTransfer may ask for one that is
        // under way already).
        if self.filling.contains(dest) {
            st.message = format!("waiting for the copy under way into {dest}");
            return;
        }
        let Some(source) = self.pick_source(i, t, dest, st) else {
            return;
        };
        // A refresh of a copy holding what the source holds has nothing to copy.
        if let (Some(c), Some(s)) = (copy.as_ref(), self.status.copy(&source))
            && c.present
            && c.data_version >= s.data_version
        {
            st.phase = TransferPhase::Succeeded;
            st.message = format!("{dest} holds version {} already", c.data_version);
            st.completion_time = Some(i.now);
            return;
        }
        self.arriving
            .entry(Self::region(i, dest))
            .or_insert(dest.to_string());
        let (free, slower) = links.free(i.clusters, &source, dest);
        if slower <= 0 || (free as f64) < slower as f64 * i.settings.min_share {
            st.message = format!(
                "waiting for bandwidth between {source} and {dest} ({} MiB/s free of {} MiB/s)",
                free >> 20,
                slower >> 20
            );
            return;
        }
        links.book(&source, dest, free);
        self.begin_round(i, dest, source, free, copy.as_ref(), st);
    }

    /// The cluster a queued transfer into `dest` copies from: the best source
    /// ([`Self::source_for`]), or the relay between it and `dest` once the relay holds its
    /// data. `None` while the transfer waits (for a source, for the copy arriving in the
    /// region first, for a relay to fill), with `st.message` saying why.
    fn pick_source(
        &mut self,
        i: &Input<'_>,
        t: &Xfer,
        dest: &str,
        st: &mut DataTransferStatus,
    ) -> Option<String> {
        let Some(mut source) = self.source_for(i, dest, &t.spec.source) else {
            st.message = if t.spec.source.is_empty() {
                "waiting for a serving cluster holding a copy".into()
            } else {
                format!("waiting for {} to serve a copy", t.spec.source)
            };
            self.arriving
                .entry(Self::region(i, dest))
                .or_insert(dest.to_string());
            return None;
        };
        let region = Self::region(i, dest);
        // One copy crosses into a region at a time; the others follow from it.
        if Self::region(i, &source) != region
            && t.spec.source.is_empty()
            && let Some(other) = self.arriving.get(&region).filter(|o| **o != dest)
        {
            st.message = format!(
                "waiting for the copy arriving at {other} in region {region}, to copy from there"
            );
            return None;
        }
        // Where the path from the source is slow and two hops through a relay are faster, the
        // copy goes to the relay first and on from there.
        if t.spec.source.is_empty()
            && !t.spec.reason.starts_with(RELAY_REASON)
            && let Some(relay) = self.relay_for(i, &source, dest)
        {
            let relayed = self.status.copy(&relay).is_some_and(|c| {
                c.present
                    && Self::serving(i, &relay)
                    && self
                        .status
                        .copy(&source)
                        .is_some_and(|s| c.data_version >= s.data_version)
            });
            if relayed {
                // In already (the source ranked first by region, not by speed).
                source = relay;
            } else {
                st.message = format!(
                    "waiting for the copy arriving at {relay}, to relay it: the path from {source} carries {} MiB/s",
                    path(i.clusters, &source, dest) >> 20
                );
                self.relays.entry(relay).or_insert(dest.to_string());
                return None;
            }
        }
        Some(source)
    }

    /// Starts a round into `dest` from `source` at the booked `rate`: its number and the
    /// version it copies on top of (what `dest` holds of the same source, else nothing), the
    /// copy it fills (a new cache copy where `dest` has none); the source takes a snapshot
    /// next.
    fn begin_round(
        &mut self,
        i: &Input<'_>,
        dest: &str,
        source: String,
        rate: i64,
        copy: Option<&DataCopy>,
        st: &mut DataTransferStatus,
    ) {
        let last = self.status.rounds.get(dest).copied().unwrap_or(0);
        let (round, base) = match copy {
            Some(c) => (
                c.round.max(last) + 1,
                if c.present && c.source == source {
                    c.data_version
                } else {
                    0
                },
            ),
            None => (last + 1, 0),
        };
        match self.status.copies.iter_mut().find(|c| c.cluster == dest) {
            Some(c) => c.source = source.clone(),
            None => {
                self.status.copies.push(DataCopy {
                    cluster: dest.to_string(),
                    role: CopyRole::Cache,
                    tier: i.clusters.get(dest).map_or(Tier::Warm, |c| c.tier),
                    source: source.clone(),
                    last_used: Some(i.now),
                    ..Default::default()
                });
                self.status.copies.sort_by(|a, b| a.cluster.cmp(&b.cluster));
            }
        }
        st.phase = TransferPhase::Snapshot;
        st.source = source.clone();
        // A copy from a relay: the path the bytes took.
        st.path = match self.status.copy(&source) {
            Some(c) if c.role == CopyRole::Cache && !c.source.is_empty() => {
                vec![c.source.clone(), source.clone(), dest.to_string()]
            }
            _ => vec![source.clone(), dest.to_string()],
        };
        st.round = round;
        st.base_version = base;
        st.rate = rate;
        st.start_time = Some(i.now);
        st.message = format!("{source} takes a snapshot");
        self.sending.insert(dest.to_string(), round);
        self.filling.insert(dest.to_string());
    }

    /// Snapshot: waits for the source's snapshot of the round (transfer `id`), then takes in
    /// its figures and copies.
    fn await_snapshot(&mut self, i: &Input<'_>, id: &str, dest: &str, st: &mut DataTransferStatus) {
        self.under_way(i, dest, st.round);
        let snap = self
            .set
            .seen
            .get(&st.source)
            .and_then(|s| s.transfers.iter().find(|x| x.id == id))
            .filter(|x| x.round == st.round && x.complete);
        let Some(snap) = snap else {
            st.message = match self
                .set
                .seen
                .get(&st.source)
                .and_then(|s| s.transfers.iter().find(|x| x.id == id))
                .filter(|x| !x.message.is_empty())
            {
                Some(x) => format!("the snapshot is stuck at {}: {}", st.source, x.message),
                None if !Self::serving(i, &st.source) => {
                    format!("waiting for {} to serve", st.source)
                }
                None => format!("{} takes a snapshot", st.source),
            };
            return;
        };
        let v = snap.volumes.first().cloned().unwrap_or_default();
        st.bytes = v.bytes;
        st.data_version = v.data_version;
        st.used_bytes = v.used_bytes;
        st.phase = TransferPhase::Copying;
        st.message = format!("{dest} copies from {}", st.source);
        self.copying(i, dest, st);
    }

    /// Copying: follows what `dest` reports of the round (transfer `id`) until its copy is in.
    fn await_copy(&mut self, i: &Input<'_>, id: &str, dest: &str, st: &mut DataTransferStatus) {
        // The copy's round is the transfer's (also when the data set's status that said so
        // was not written).
        self.copying(i, dest, st);
        self.under_way(i, dest, st.round);
        let got = self
            .set
            .seen
            .get(dest)
            .and_then(|s| s.transfers.iter().find(|x| x.id == id))
            .filter(|x| x.round == st.round);
        if let Some(g) = got {
            st.copied_bytes = g.volumes.iter().map(|v| v.copied).sum::<i64>();
            if g.complete {
                // What the member copied: a round applies on top of the version the
                // destination holds, else it takes everything.
                st.copied_bytes = g.volumes.iter().map(|v| v.bytes).sum::<i64>();
                st.phase = TransferPhase::Succeeded;
                st.completion_time = Some(i.now);
                st.message = format!("{dest} holds version {}", st.data_version);
                self.done(dest, st);
                self.filling.remove(dest);
                return;
            }
            if !g.message.is_empty() {
                st.message = format!("the copy is stuck at {dest}: {}", g.message);
            }
        } else if !Self::serving(i, dest) {
            st.message = format!("waiting for {dest} to serve");
        }
    }

    /// A round into `dest` is under way: its source is asked for the round's snapshot,
    /// `dest` is pinned, and its region has a copy arriving.
    fn under_way(&mut self, i: &Input<'_>, dest: &str, round: u32) {
        self.sending.insert(dest.to_string(), round);
        self.filling.insert(dest.to_string());
        self.arriving
            .entry(Self::region(i, dest))
            .or_insert(dest.to_string());
    }

    /// A copy round under way into `dest`: the copy, with the round's figures.
    fn copying(&mut self, i: &Input<'_>, dest: &str, st: &DataTransferStatus) {
        let c = match self
            .status
            .copies
            .iter_mut()
            .position(|c| c.cluster == dest)
        {
            Some(p) => &mut self.status.copies[p],
            None => {
                self.status.copies.push(DataCopy {
                    cluster: dest.to_string(),
                    role: CopyRole::Cache,
                    tier: i.clusters.get(dest).map_or(Tier::Warm, |c| c.tier),
                    last_used: Some(i.now),
                    ..Default::default()
                });
                self.status.copies.sort_by(|a, b| a.cluster.cmp(&b.cluster));
                let Some(c) = self.status.copies.iter_mut().find(|c| c.cluster == dest) else {
                    return;
                };
                c
            }
        };
        if c.role != CopyRole::Cache || c.round > st.round {
            return;
        }
        c.source = st.source.clone();
        c.round = st.round;
        c.round_bytes = st.bytes;
        c.round_version = st.data_version;
        c.round_used = st.used_bytes;
        c.round_base = st.base_version;
        c.round_rate = st.rate;
    }

    /// A round that succeeded: the copy holds its data (also when the data set's status that
    /// said so was not written). A copy evicted since is not brought back.
    fn done(&mut self, dest: &str, st: &DataTransferStatus) {
        if let Some(c) = self.status.copies.iter_mut().find(|c| c.cluster == dest)
            && c.role == CopyRole::Cache
            && c.round == st.round
            && c.source == st.source
        {
            c.present = true;
            c.data_version = c.round_version;
            c.bytes = c.round_used;
        }
    }

    /// Transfers the data set needs and has not got: its readers' inputs, refreshes of caches
    /// behind their source, and a cache copy in a region that reads it often.
    fn ask(
        &mut self,
        i: &Input<'_>,
        transfers: &[&Xfer],
        names: &mut BTreeSet<NKey>,
        held: &BTreeMap<String, i64>,
        out: &mut Output,
    ) {
        let ns = self.set.namespace.clone();
        let open: BTreeSet<&str> = transfers
            .iter()
            .filter(|t| out_pending(out, t))
            .map(|t| t.spec.destination.as_str())
            .collect();
        let mut wanted: Vec<(String, String)> = Vec::new();
        for r in &self.status.readers {
            let has = self
                .status
                .copy(&r.cluster)
                .is_some_and(|c| c.present || c.role == CopyRole::Authoritative);
            if !has {
                wanted.push((r.cluster.clone(), r.workload.clone()));
            }
        }
        // The newest data is the authoritative copies' (and those members hold of their own)
        // that can be read now: a cache is not refreshed towards a copy no transfer can reach.
        let newest = self
            .status
            .copies
            .iter()
            .filter(|c| c.role != CopyRole::Cache && c.present && Self::serving(i, &c.cluster))
            .map(|c| c.data_version)
            .max()
            .unwrap_or(0);
        for c in &self.status.copies {
            if c.role != CopyRole::Cache || !c.present {
                continue;
            }
            if newest > c.data_version {
                wanted.push((c.cluster.clone(), "refresh".into()));
            }
        }
        for (relay, dest) in &self.relays {
            // A relay whose copy came in this step has it already.
            if !self.status.copy(relay).is_some_and(|c| c.present) {
                wanted.push((relay.clone(), format!("{RELAY_REASON} on to {dest}")));
            }
        }
        let size = self.set.spec.bytes();
        for r in &self.status.regions {
            if r.last_hour < i.settings.hot_reads || r.region.is_empty() {
                continue;
            }
            let has = self
                .status
                .copies
                .iter()
                .any(|c| Self::region(i, &c.cluster) == r.region)
                || open.iter().any(|d| Self::region(i, d) == r.region);
            if has {
                continue;
            }
            // The cluster with the most cache room left once the copies read there now are
            // counted: a copy put where readers' copies fill the cache would go again at once
            // (and the region, still hot, ask for it again).
            let free = |n: &str, c: &Cluster| c.cache_bytes - held.get(n).copied().unwrap_or(0);
            let best = i
                .clusters
                .iter()
                .filter(|(n, c)| c.serving && c.region == r.region && free(n, c) >= size)
                .max_by_key(|(n, c)| (free(n, c), std::cmp::Reverse((*n).clone())))
                .map(|(n, _)| n.clone());
            if let Some(dest) = best {
                wanted.push((
                    dest,
                    format!(
                        "cache: read {} times from {} in the last hour",
                        r.last_hour, r.region
                    ),
                ));
            }
        }
        let mut asked = BTreeSet::new();
        for (dest, reason) in wanted {
            if open.contains(dest.as_str()) || !asked.insert(dest.clone()) {
                continue;
            }
            // A copy whose last try failed is tried again once that record goes.
            let failed = transfers.iter().any(|t| {
                t.spec.destination == dest
                    && out
                        .transfer_statuses
                        .get(&(t.namespace.clone(), t.name.clone()))
                        .is_some_and(|s| s.phase == TransferPhase::Failed)
            });
            if failed {
                continue;
            }
            let last = self.status.rounds.get(&dest).copied().unwrap_or(0);
            let mut n = self.status.copy(&dest).map_or(0, |c| c.round).max(last) + 1;
            let name = loop {
                let name = transfer_name(&self.set.name, &dest, n);
                if names.insert((ns.clone(), name.clone())) {
                    break name;
                }
                n += 1;
            };
            out.create.push((
                (ns.clone(), name),
                DataTransferSpec {
                    data_set: self.set.name.clone(),
                    destination: dest.clone(),
                    source: String::new(),
                    reason,
                },
            ));
            self.filling.insert(dest);
        }
        self.status.transfers = transfers
            .iter()
            .filter(|t| {
                out.transfer_statuses
                    .get(&(t.namespace.clone(), t.name.clone()))
                    .is_some_and(|s| !s.phase.is_done())
            })
            .map(|t| t.name.clone())
            .collect();
        // Caches whose first copy failed and that nothing fills go.
        let filling = &self.filling;
        let pinned: BTreeSet<&str> = self
            .status
            .readers
            .iter()
            .map(|r| r.cluster.as_str())
            .collect();
        self.status.copies.retain(|c| {
            c.role == CopyRole::Authoritative
                || c.present
                || filling.contains(&c.cluster)
                || pinned.contains(c.cluster.as_str())
        });
    }

    /// Whether the copy in `cluster` must stay: read there, being filled, or the source of a
    /// copy being filled.
    fn pinned(&self, cluster: &str) -> bool {
        self.filling.contains(cluster)
            || self.relays.contains_key(cluster)
            || self.status.readers.iter().any(|r| r.cluster == cluster)
            || self
                .status
                .copies
                .iter()
                .any(|d| d.source == cluster && self.filling.contains(&d.cluster))
    }

    /// The Works this data set wants.
    fn works(&self, i: &Input<'_>, out: &mut Output) {
        let set = self.set;
        let ns = &set.namespace;
        let claim = orrery_api::data::claim_name(&set.name);
        let size = set.spec.bytes();
        for c in &self.status.copies {
            if !i.clusters.contains_key(&c.cluster) {
                continue;
            }
            // The claim this copy's snapshots are taken of: a member's own keeps its name.
            let own_claim = match c.role {
                CopyRole::Reported => match Self::reported(i, set, &c.cluster) {
                    Some(h) => h.claim.clone(),
                    None => continue,
                },
                _ => claim.clone(),
            };
            let mut transfers = Vec::new();
            // Sends to every cache this copy is the source of.
            for d in &self.status.copies {
                if d.role != CopyRole::Cache || d.source != c.cluster {
                    continue;
                }
                let round = self.sending.get(&d.cluster).copied().unwrap_or(d.round);
                if round == 0 {
                    continue;
                }
                transfers.push(Transfer {
                    id: transfer_id(ns, &set.name, &d.cluster),
                    role: TransferRole::Send,
                    namespace: ns.clone(),
                    peer: d.cluster.clone(),
                    round,
                    volumes: vec![TransferVolume {
                        name: own_claim.clone(),
                        ..Default::default()
                    }],
                    ..Default::default()
                });
            }
            let spec = match c.role {
                // The claim Orrery adopts: it stays when the data set goes.
                CopyRole::Authoritative => WorkSpec {
                    workload: Workload {
                        manifests: vec![claim_manifest(ns, &set.name, &claim, size, true)],
                    },
                    conflict_resolution: ConflictResolution::Overwrite,
                    preserve_resources_on_deletion: true,
                    transfers,
                    retention: Vec::new(),
                },
                // Nothing to copy into until the first snapshot is in.
                CopyRole::Cache if c.round == 0 => continue,
                CopyRole::Cache => {
                    transfers.push(Transfer {
                        id: transfer_id(ns, &set.name, &c.cluster),
                        role: TransferRole::Receive,
                        namespace: ns.clone(),
                        peer: c.source.clone(),
                        round: c.round,
                        volumes: vec![TransferVolume {
                            name: claim.clone(),
                            capacity: Some(set.spec.size),
                            bytes: c.round_bytes,
                            data_version: c.round_version,
                            used_bytes: c.round_used,
                            base_version: c.round_base,
                            ..Default::default()
                        }],
                        rate: c.round_rate,
                        // The claim appears once the first copy is in: its readers' pods wait.
                        hold_workload: !c.present,
                        ..Default::default()
                    });
                    WorkSpec {
                        workload: Workload {
                            manifests: vec![claim_manifest(ns, &set.name, &claim, size, false)],
                        },
                        transfers,
                        ..Default::default()
                    }
                }
                // A member's own claim is never touched: a Work only while it is copied from.
                CopyRole::Reported if transfers.is_empty() => continue,
                CopyRole::Reported => WorkSpec {
                    transfers,
                    ..Default::default()
                },
            };
            out.works
                .insert((c.cluster.clone(), ns.clone(), set.name.clone()), spec);
        }
    }
}

fn out_pending(out: &Output, t: &Xfer) -> bool {
    out.transfer_statuses
        .get(&(t.namespace.clone(), t.name.clone()))
        .is_some_and(|s| !s.phase.is_done())
}

/// The claim holding a copy in a member. A simulated member fills an authoritative one with
/// the data set's bytes (`sim.orrery.io/volume-used`); a real one holds whatever the claim
/// Orrery adopts holds.
fn claim_manifest(ns: &str, set: &str, claim: &str, size: i64, authoritative: bool) -> Value {
    let role = if authoritative {
        "authoritative"
    } else {
        "cache"
    };
    let mut annotations = serde_json::Map::new();
    if authoritative {
        annotations.insert("sim.orrery.io/volume-used".into(), json!(size.to_string()));
    }
    json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": claim,
            "namespace": ns,
            "labels": {
                orrery_api::data::DATASET_LABEL: set,
                orrery_api::data::COPY_LABEL: role,
            },
            "annotations": annotations,
        },
        "spec": {
            "accessModes": ["ReadOnlyMany"],
            "resources": {"requests": {"storage": size.to_string()}},
        },
    })
}

/// Keeps every cluster's cache copies within its cache tier: the coldest copies no workload
/// there reads and no transfer fills go first. Authoritative copies are never evicted.
fn evict(i: &Input<'_>, states: &mut [SetState<'_>]) {
    for (name, cluster) in i.clusters {
        // (hot reads from the region, last used, set index) of each evictable copy.
        let mut used = 0i64;
        let mut candidates: Vec<(u32, i64, usize)> = Vec::new();
        for (idx, s) in states.iter().enumerate() {
            let Some(c) = s.status.copy(name) else {
                continue;
            };
            if c.role != CopyRole::Cache {
                continue;
            }
            used += s.set.spec.bytes();
            if s.pinned(name) || !c.present {
                continue;
            }
            let hot = s
                .status
                .regions
                .iter()
                .find(|r| r.region == cluster.region)
                .map_or(0, |r| r.last_hour);
            candidates.push((hot, c.last_used.map_or(0, |t| t.unix_seconds()), idx));
        }
        candidates.sort();
        for (_, _, idx) in candidates {
            if used <= cluster.cache_bytes {
                break;
            }
            let s = &mut states[idx];
            used -= s.set.spec.bytes();
            s.status.copies.retain(|c| c.cluster != *name);
        }
    }
}

#[cfg(test)]
mod tests;
