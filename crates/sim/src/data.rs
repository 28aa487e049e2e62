//! The simulated member's data: persistent volumes that fill while their pods write, and the
//! data mover's transfers (snapshots at a source, copies at a target at the speed of the
//! path). Plain data driven with elapsed time, so it is tested (and benchmarked) without a
//! clock; no bytes exist, only their counts and versions.
//!
//! A volume's `dataVersion` moves on every write; `written` counts every byte ever written
//! (overwrites included), so a snapshot knows how much changed since the previous one. A
//! copy applies a round on top of the version it was taken after (`baseVersion`); a target
//! holding anything else gets the whole volume instead.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use orrery_api::Quantity;
use orrery_api::stateful::{
    Transfer, TransferRole, TransferStatus, TransferVolume, TransferVolumeStatus, VolumeStatus,
};
use serde::{Deserialize, Serialize};

/// Names a volume: namespace and claim name.
pub type VolumeKey = (String, String);

/// A persistent volume (a PersistentVolumeClaim and its data).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Volume {
    pub namespace: String,
    pub name: String,
    #[serde(default)]
    pub ordinal: Option<i64>,
    /// The StatefulSet whose claim template made it (`None`: a claim object, or a copy that
    /// no workload has taken yet).
    #[serde(default)]
    pub owner: Option<String>,
    pub capacity: i64,
    #[serde(default)]
    pub storage_class: String,
    pub used: f64,
    /// Every byte ever written to it, overwrites included.
    pub written: f64,
    pub version: u64,
    /// The version it had when the pod now running on it started.
    #[serde(default)]
    pub started_version: Option<u64>,
    /// Bytes per second its running pod writes (0 while none runs).
    #[serde(default)]
    pub write_rate: f64,
    /// Pods running on it (a claim object may be shared).
    #[serde(default)]
    pub users: u32,
    /// What of a byte its pod has written but not yet counted: writes are counted in whole
    /// bytes, so sizes and the rounds' bytes add up exactly.
    #[serde(default)]
    pub partial: f64,
}

impl Volume {
    pub fn status(&self) -> VolumeStatus {
        VolumeStatus {
            name: self.name.clone(),
            ordinal: self.ordinal,
            capacity: Some(Quantity::from_int(
                self.capacity,
                orrery_api::Format::BinarySI,
            )),
            storage_class: self.storage_class.clone(),
            used_bytes: self.used as i64,
            data_version: self.version,
            started_version: self.started_version,
            written_bytes: self.written as i64,
        }
    }
}

/// Something that happened to the member's data, for the checkers of tests (`GET
/// /clusters/{name}/data` on the agent's admin endpoint).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DataEvent {
    pub seq: u64,
    pub time_ms: u64,
    /// `pod-started`, `pod-stopped`, `volume-created`, `volume-deleted`, `snapshot`,
    /// `copy-started`, `copy-done`.
    pub event: &'static str,
    pub namespace: String,
    pub volume: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ordinal: Option<i64>,
    /// The workload (`Kind/name`) a pod event is about.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub workload: String,
    pub data_version: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub bytes: i64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub transfer: String,
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub round: u32,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

/// Data events kept (the oldest go first).
const LOG_LIMIT: usize = 100_000;

/// The copy of one volume in a round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Copying {
    pub bytes: i64,
    pub copied: f64,
}

/// One transfer the member takes part in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SimTransfer {
    /// The Work that asked for it.
    pub work: String,
    pub spec: Transfer,
    pub status: TransferStatus,
    /// Send: each volume's `written` at the last snapshot.
    #[serde(default)]
    pub last_written: BTreeMap<String, f64>,
    /// Receive: the round being copied, by volume.
    #[serde(default)]
    pub copying: BTreeMap<String, Copying>,
    /// Receive: the volumes it made (they go with it unless a workload took them).
    #[serde(default)]
    pub created: Vec<String>,
}

/// What a member keeps of its data across restarts of the process that simulates it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct DataSnapshot {
    #[serde(default)]
    pub volumes: Vec<Volume>,
    #[serde(default)]
    pub transfers: Vec<SimTransfer>,
}

/// The member's volumes and transfers.
#[derive(Debug, Clone)]
pub struct DataPlane {
    /// The member's uplink, bytes per second, shared by its transfers.
    pub bandwidth: f64,
    volumes: BTreeMap<VolumeKey, Volume>,
    transfers: BTreeMap<String, SimTransfer>,
    log: VecDeque<DataEvent>,
    seq: u64,
    /// Moves when a transfer's status may have changed.
    pub transfer_stamp: u64,
    /// Moves when a transfer reaches a milestone (a snapshot taken, a copy in, a fence
    /// confirmed): what the control plane waits for, reported at once.
    pub milestone: u64,
}

fn now_ms() -> u64 {
    super::unix_now().as_millis() as u64
}

impl DataPlane {
    pub fn new(bandwidth: f64) -> Self {
        DataPlane {
            bandwidth,
            volumes: BTreeMap::new(),
            transfers: BTreeMap::new(),
            log: VecDeque::new(),
            seq: 0,
            transfer_stamp: 0,
            milestone: 0,
        }
    }

    fn event(&mut self, event: &'static str, v: &Volume, f: impl FnOnce(&mut DataEvent)) {
        self.seq += 1;
        let mut e = DataEvent {
            seq: self.seq,
            time_ms: now_ms(),
            event,
            namespace: v.namespace.clone(),
            volume: v.name.clone(),
            ordinal: v.ordinal,
            workload: String::new(),
            data_version: v.version,
            bytes: 0,
            transfer: String::new(),
            round: 0,
        };
        f(&mut e);
        if self.log.len() >= LOG_LIMIT {
            self.log.pop_front();
        }
        self.log.push_back(e);
    }

    /// The data events after `since`, oldest first.
    pub fn log(&self, since: u64) -> Vec<DataEvent> {
        self.log.iter().filter(|e| e.seq > since).cloned().collect()
    }

    pub fn volume(&self, namespace: &str, name: &str) -> Option<&Volume> {
        self.volumes.get(&(namespace.to_string(), name.to_string()))
    }

    pub fn volumes(&self) -> impl Iterator<Item = &Volume> {
        self.volumes.values()
    }

    /// The volume of that name, created (holding `used` bytes) if the member has none; an
    /// existing one is taken as it is, as a StatefulSet adopts a claim of its volume's name.
    #[allow(clippy::too_many_arguments)]
    pub fn ensure_volume(
        &mut self,
        namespace: &str,
        name: &str,
        ordinal: Option<i64>,
        owner: Option<&str>,
        capacity: i64,
        storage_class: &str,
        used: f64,
    ) {
        let key = (namespace.to_string(), name.to_string());
        if let Some(v) = self.volumes.get_mut(&key) {
            if v.owner.is_none() {
                v.owner = owner.map(str::to_string);
            }
            return;
        }
        let v = Volume {
            namespace: namespace.to_string(),
            name: name.to_string(),
            ordinal,
            owner: owner.map(str::to_string),
            capacity: capacity.max(0),
            storage_class: storage_class.to_string(),
            used: used.clamp(0.0, capacity.max(0) as f64).floor(),
            written: used.max(0.0).floor(),
            version: 1,
            started_version: None,
            write_rate: 0.0,
            users: 0,
            partial: 0.0,
        };
        self.event("volume-created", &v, |e| e.bytes = v.used as i64);
        self.volumes.insert(key, v);
    }

    /// Removes a volume and its data.
    pub fn delete_volume(&mut self, namespace: &str, name: &str) -> bool {
        match self
            .volumes
            .remove(&(namespace.to_string(), name.to_string()))
        {
            Some(v) => {
                self.event("volume-deleted", &v, |_| {});
                true
            }
            None => false,
        }
    }

    /// Removes the volumes a workload's claim templates made.
    pub fn delete_owned(&mut self, namespace: &str, owner: &str) {
        let gone: Vec<VolumeKey> = self
            .volumes
            .iter()
            .filter(|(k, v)| k.0 == namespace && v.owner.as_deref() == Some(owner))
            .map(|(k, _)| k.clone())
            .collect();
        for k in gone {
            self.delete_volume(&k.0, &k.1);
        }
    }

    /// Forgets which workload owns a workload's volumes (it went; they stay, as Kubernetes
    /// keeps a deleted StatefulSet's claims).
    pub fn release_owned(&mut self, namespace: &str, owner: &str) {
        for (k, v) in self.volumes.iter_mut() {
            if k.0 == namespace && v.owner.as_deref() == Some(owner) {
                v.owner = None;
            }
        }
    }

    /// A pod of `workload` started running on the volume, writing `write_rate` bytes a second.
    pub fn attach(&mut self, namespace: &str, name: &str, workload: &str, write_rate: f64) {
        let key = (namespace.to_string(), name.to_string());
        let Some(v) = self.volumes.get_mut(&key) else {
            return;
        };
        v.users += 1;
        if v.users == 1 {
            v.started_version = Some(v.version);
        }
        v.write_rate += write_rate.max(0.0);
        let v = v.clone();
        self.event("pod-started", &v, |e| e.workload = workload.to_string());
    }

    /// A pod of `workload` on the volume stopped.
    pub fn detach(&mut self, namespace: &str, name: &str, workload: &str, write_rate: f64) {
        let key = (namespace.to_string(), name.to_string());
        let Some(v) = self.volumes.get_mut(&key) else {
            return;
        };
        v.users = v.users.saturating_sub(1);
        v.write_rate = (v.write_rate - write_rate.max(0.0)).max(0.0);
        if v.users == 0 {
            v.started_version = None;
            v.write_rate = 0.0;
        }
        let v = v.clone();
        self.event("pod-stopped", &v, |e| e.workload = workload.to_string());
    }

    /// Whether the member takes part in any transfer.
    pub fn has_transfers(&self) -> bool {
        !self.transfers.is_empty()
    }

    /// Whether time passing changes anything (writes or copies under way).
    pub fn busy(&self) -> bool {
        self.volumes.values().any(|v| v.write_rate > 0.0)
            || self.transfers.values().any(|t| !t.copying.is_empty())
    }

    /// Lets `dt` seconds pass: pods write, copies progress. Returns the volumes whose data
    /// changed (their workloads' states changed) and whether a transfer's status did.
    pub fn advance(&mut self, dt: f64) -> (Vec<VolumeKey>, bool) {
        let mut changed = Vec::new();
        if dt <= 0.0 {
            return (changed, false);
        }
        for (k, v) in self.volumes.iter_mut() {
            if v.write_rate > 0.0 {
                let due = v.write_rate * dt + v.partial;
                let bytes = due.floor();
                v.partial = due - bytes;
                v.written += bytes;
                v.used = (v.used + bytes).min(v.capacity as f64);
                v.version += 1;
                changed.push(k.clone());
            }
        }
        // The uplink is shared by every copy under way here; each also has the rate its
        // path allows (set by the control plane from the sender's side).
        let active = self
            .transfers
            .values()
            .filter(|t| !t.copying.is_empty())
            .count();
        let mut moved = false;
        let ids: Vec<String> = self
            .transfers
            .iter()
            .filter(|(_, t)| !t.copying.is_empty())
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            let Some(t) = self.transfers.get_mut(&id) else {
                continue;
            };
            let mut rate = self.bandwidth / active.max(1) as f64;
            if t.spec.rate > 0 {
                rate = rate.min(t.spec.rate as f64);
            }
            // Volumes of one transfer are copied side by side.
            let left: Vec<String> = t
                .copying
                .iter()
                .filter(|(_, c)| c.copied < c.bytes as f64)
                .map(|(n, _)| n.clone())
                .collect();
            let share = rate * dt / left.len().max(1) as f64;
            for n in &left {
                if let Some(c) = t.copying.get_mut(n) {
                    c.copied = (c.copied + share).min(c.bytes as f64);
                }
            }
            moved = true;
            for vs in t.status.volumes.iter_mut() {
                if let Some(c) = t.copying.get(&vs.name) {
                    vs.copied = c.copied as i64;
                }
            }
            if t.copying.values().all(|c| c.copied >= c.bytes as f64) {
                self.finish_copy(&id, &mut changed);
            }
        }
        if moved {
            self.transfer_stamp += 1;
        }
        (changed, moved)
    }

    /// A round's copy is in: the volumes hold the source's data as of its snapshot.
    fn finish_copy(&mut self, id: &str, changed: &mut Vec<VolumeKey>) {
        let Some(t) = self.transfers.get_mut(id) else {
            return;
        };
        t.copying.clear();
        t.status.complete = true;
        self.milestone += 1;
        let (ns, round, spec_volumes) = (
            t.spec.namespace.clone(),
            t.spec.round,
            t.spec.volumes.clone(),
        );
        let mut statuses = Vec::new();
        for tv in &spec_volumes {
            let key = (ns.clone(), tv.name.clone());
            if let Some(v) = self.volumes.get_mut(&key) {
                v.version = tv.data_version;
                v.used = tv.used_bytes as f64;
                v.written = v.used;
                changed.push(key.clone());
                let v = v.clone();
                statuses.push(v.clone());
            }
        }
        for v in statuses {
            self.event("copy-done", &v, |e| {
                e.transfer = id.to_string();
                e.round = round;
            });
        }
        if let Some(t) = self.transfers.get_mut(id) {
            for vs in t.status.volumes.iter_mut() {
                if let Some(v) = self.volumes.get(&(ns.clone(), vs.name.clone())) {
                    vs.data_version = v.version;
                    vs.used_bytes = v.used as i64;
                    vs.copied = vs.bytes;
                }
            }
        }
    }

    /// The transfers a Work asks for, replacing what it asked before; `fenced(namespace,
    /// workload)` tells whether a workload's pods have all stopped. Returns whether anything changed.
    pub fn set_transfers(
        &mut self,
        work: &str,
        wanted: &[Transfer],
        fenced: &dyn Fn(&str, &str) -> bool,
    ) -> bool {
        let ids: BTreeSet<&str> = wanted.iter().map(|t| t.id.as_str()).collect();
        let gone: Vec<String> = self
            .transfers
            .iter()
            .filter(|(id, t)| t.work == work && !ids.contains(id.as_str()))
            .map(|(id, _)| id.clone())
            .collect();
        let mut changed = !gone.is_empty();
        for id in gone {
            self.end_transfer(&id);
        }
        for t in wanted {
            match self.transfers.get_mut(&t.id) {
                Some(cur) if cur.spec == *t && cur.work == work => {}
                Some(cur) => {
                    cur.work = work.to_string();
                    cur.spec = t.clone();
                    changed = true;
                }
                None => {
                    self.transfers.insert(
                        t.id.clone(),
                        SimTransfer {
                            work: work.to_string(),
                            spec: t.clone(),
                            status: TransferStatus {
                                id: t.id.clone(),
                                role: t.role,
                                ..Default::default()
                            },
                            last_written: BTreeMap::new(),
                            copying: BTreeMap::new(),
                            created: Vec::new(),
                        },
                    );
                    changed = true;
                }
            }
        }
        changed |= self.step(fenced);
        if changed {
            self.transfer_stamp += 1;
        }
        changed
    }

    /// Starts what the transfers' wanted rounds call for: snapshots (at once, or once the
    /// fence holds) and copies. Returns whether anything changed.
    pub fn step(&mut self, fenced: &dyn Fn(&str, &str) -> bool) -> bool {
        let ids: Vec<String> = self.transfers.keys().cloned().collect();
        let mut changed = false;
        for id in ids {
            let Some(t) = self.transfers.get(&id) else {
                continue;
            };
            let (wanted, done) = (t.spec.round, t.status.round);
            match t.spec.role {
                TransferRole::Send => {
                    let f = t.spec.after_fence && fenced(&t.spec.namespace, &t.spec.workload);
                    if wanted > done && (f || !t.spec.after_fence) {
                        self.snapshot(&id, f);
                        changed = true;
                    } else if f != t.status.fenced
                        && let Some(t) = self.transfers.get_mut(&id)
                    {
                        t.status.fenced = f;
                        self.milestone += 1;
                        changed = true;
                    }
                }
                TransferRole::Receive => {
                    // A round under way (also one restored after a restart) goes on where
                    // it was; only a round not yet started starts.
                    if done != wanted || (!t.status.complete && t.copying.is_empty()) {
                        self.start_copy(&id);
                        changed = true;
                    }
                }
            }
        }
        changed
    }

    /// Takes a Send transfer's snapshot for its wanted round.
    fn snapshot(&mut self, id: &str, fenced: bool) {
        let Some(t) = self.transfers.get(id) else {
            return;
        };
        let ns = t.spec.namespace.clone();
        let round = t.spec.round;
        let mut statuses = Vec::new();
        let mut last_written = t.last_written.clone();
        let mut events = Vec::new();
        for tv in &t.spec.volumes {
            let Some(v) = self.volumes.get(&(ns.clone(), tv.name.clone())) else {
                statuses.push(TransferVolumeStatus {
                    name: tv.name.clone(),
                    ..Default::default()
                });
                continue;
            };
            let bytes = match last_written.get(&tv.name) {
                // What changed since the last snapshot, but never more than the volume holds.
                Some(w) => (v.written - w).max(0.0).min(v.used.max(0.0)),
                None => v.used,
            };
            last_written.insert(tv.name.clone(), v.written);
            statuses.push(TransferVolumeStatus {
                name: tv.name.clone(),
                data_version: v.version,
                used_bytes: v.used as i64,
                bytes: bytes.ceil() as i64,
                copied: 0,
                written_bytes: v.written as i64,
            });
            events.push((v.clone(), bytes.ceil() as i64));
        }
        self.milestone += 1;
        if let Some(t) = self.transfers.get_mut(id) {
            t.last_written = last_written;
            t.status.round = round;
            t.status.complete = true;
            t.status.fenced = fenced && t.spec.after_fence;
            t.status.volumes = statuses;
            t.status.message.clear();
        }
        for (v, bytes) in events {
            self.event("snapshot", &v, |e| {
                e.transfer = id.to_string();
                e.round = round;
                e.bytes = bytes;
            });
        }
    }

    /// Starts (or resumes) copying a Receive transfer's wanted round.
    fn start_copy(&mut self, id: &str) {
        let Some(t) = self.transfers.get(id) else {
            return;
        };
        let ns = t.spec.namespace.clone();
        let round = t.spec.round;
        let spec_volumes: Vec<TransferVolume> = t.spec.volumes.clone();
        let mut copying = BTreeMap::new();
        let mut statuses = Vec::new();
        let mut events = Vec::new();
        let mut created = Vec::new();
        for tv in &spec_volumes {
            let key = (ns.clone(), tv.name.clone());
            let have = self.volumes.get(&key).map(|v| v.version);
            // A round applies only on top of the version it was taken after; anything else
            // (no volume, another version) needs the whole volume.
            let bytes = if tv.base_version != 0 && have == Some(tv.base_version) {
                tv.bytes
            } else if tv.base_version == 0 && have.is_none() {
                tv.bytes.max(tv.used_bytes)
            } else if have == Some(tv.data_version) {
                0
            } else {
                tv.used_bytes
            };
            if have.is_none() {
                created.push(tv.name.clone());
                let capacity = tv
                    .capacity
                    .map(|q| q.value() as i64)
                    .unwrap_or(tv.used_bytes);
                self.ensure_volume(
                    &ns,
                    &tv.name,
                    tv.ordinal,
                    None,
                    capacity,
                    &tv.storage_class,
                    0.0,
                );
                // An empty volume awaiting its first copy has no data version yet.
                if let Some(v) = self.volumes.get_mut(&key) {
                    v.version = 0;
                    v.written = 0.0;
                }
            }
            copying.insert(
                tv.name.clone(),
                Copying {
                    bytes: bytes.max(0),
                    copied: 0.0,
                },
            );
            statuses.push(TransferVolumeStatus {
                name: tv.name.clone(),
                data_version: self.volumes.get(&key).map_or(0, |v| v.version),
                used_bytes: self.volumes.get(&key).map_or(0, |v| v.used as i64),
                bytes: bytes.max(0),
                copied: 0,
                written_bytes: 0,
            });
            if let Some(v) = self.volumes.get(&key) {
                events.push((v.clone(), bytes.max(0)));
            }
        }
        let all_done = copying.values().all(|c| c.bytes == 0);
        if let Some(t) = self.transfers.get_mut(id) {
            t.status.round = round;
            t.status.complete = false;
            t.status.volumes = statuses;
            t.status.message.clear();
            t.copying = copying;
            t.created.extend(created);
        }
        for (v, bytes) in events {
            self.event("copy-started", &v, |e| {
                e.transfer = id.to_string();
                e.round = round;
                e.bytes = bytes;
            });
        }
        if all_done {
            let mut changed = Vec::new();
            self.finish_copy(id, &mut changed);
        }
    }

    /// Where each transfer a Work asked for stands, in the order it asked.
    pub fn statuses(&self, work: &str, order: &[Transfer]) -> Vec<TransferStatus> {
        order
            .iter()
            .filter_map(|t| self.transfers.get(&t.id).filter(|s| s.work == work))
            .map(|t| t.status.clone())
            .collect()
    }

    /// Whether a Receive transfer has its wanted round in.
    pub fn received(&self, id: &str) -> bool {
        self.transfers.get(id).is_some_and(|t| {
            t.spec.role == TransferRole::Receive
                && t.status.complete
                && t.status.round >= t.spec.round
        })
    }

    /// Forgets the transfers of a Work that is gone.
    pub fn drop_work(&mut self, work: &str) -> bool {
        let gone: Vec<String> = self
            .transfers
            .iter()
            .filter(|(_, t)| t.work == work)
            .map(|(id, _)| id.clone())
            .collect();
        let changed = !gone.is_empty();
        for id in gone {
            self.end_transfer(&id);
        }
        if changed {
            self.transfer_stamp += 1;
        }
        changed
    }

    /// Ends a transfer; a Receive's volumes that no workload took go with it (a copy
    /// abandoned, a standby replaced), as a data mover removes its scratch claims.
    fn end_transfer(&mut self, id: &str) {
        let Some(t) = self.transfers.remove(id) else {
            return;
        };
        for name in &t.created {
            let unused = self
                .volume(&t.spec.namespace, name)
                .is_some_and(|v| v.owner.is_none() && v.users == 0);
            if unused {
                self.delete_volume(&t.spec.namespace, name);
            }
        }
    }

    pub fn snapshot_state(&self) -> DataSnapshot {
        DataSnapshot {
            volumes: self.volumes.values().cloned().collect(),
            transfers: self.transfers.values().cloned().collect(),
        }
    }

    /// Puts back what a snapshot holds. Running pods come back attached by their workloads.
    pub fn restore(&mut self, snap: DataSnapshot) {
        for mut v in snap.volumes {
            v.users = 0;
            v.write_rate = 0.0;
            v.started_version = None;
            self.volumes
                .insert((v.namespace.clone(), v.name.clone()), v);
        }
        for t in snap.transfers {
            self.transfers.insert(t.spec.id.clone(), t);
        }
        self.transfer_stamp += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: i64 = 1 << 30;

    fn tv(name: &str) -> TransferVolume {
        TransferVolume {
            name: name.into(),
            ordinal: Some(0),
            capacity: Some(Quantity::from_int(10 * GIB, orrery_api::Format::BinarySI)),
            storage_class: "standard".into(),
            ..Default::default()
        }
    }

    fn send(round: u32, after_fence: bool) -> Transfer {
        Transfer {
            id: "m1".into(),
            role: TransferRole::Send,
            namespace: "ns".into(),
            peer: "b".into(),
            round,
            after_fence,
            workload: "StatefulSet/db".into(),
            volumes: vec![tv("data-db-0")],
            ..Default::default()
        }
    }

    /// The Receive for a Send's snapshot, as the control plane writes it.
    fn receive(snap: &TransferStatus, base: u64, rate: i64) -> Transfer {
        let s = &snap.volumes[0];
        Transfer {
            id: "m1".into(),
            role: TransferRole::Receive,
            namespace: "ns".into(),
            peer: "a".into(),
            round: snap.round,
            volumes: vec![TransferVolume {
                bytes: s.bytes,
                data_version: s.data_version,
                used_bytes: s.used_bytes,
                base_version: base,
                ..tv("data-db-0")
            }],
            rate,
            ..Default::default()
        }
    }

    #[test]
    fn pods_write_and_versions_move() {
        let mut d = DataPlane::new(100.0);
        d.ensure_volume("ns", "v", Some(0), Some("StatefulSet/db"), 1000, "", 400.0);
        assert!(!d.busy());
        d.attach("ns", "v", "StatefulSet/db", 10.0);
        let v = d.volume("ns", "v").unwrap();
        assert_eq!((v.version, v.started_version), (1, Some(1)));
        let (changed, _) = d.advance(2.0);
        assert_eq!(changed.len(), 1);
        let v = d.volume("ns", "v").unwrap();
        assert_eq!((v.used, v.written, v.version), (420.0, 420.0, 2));
        // Full disks stop growing but every write is a new version and counts as written.
        d.advance(100.0);
        let v = d.volume("ns", "v").unwrap();
        assert_eq!((v.used, v.written, v.version), (1000.0, 1420.0, 3));
        d.detach("ns", "v", "StatefulSet/db", 10.0);
        assert!(!d.busy());
        assert_eq!(d.volume("ns", "v").unwrap().started_version, None);
        assert_eq!(d.advance(5.0).0.len(), 0, "no pod, no write");
        let events: Vec<&str> = d.log(0).iter().map(|e| e.event).collect();
        assert_eq!(events, ["volume-created", "pod-started", "pod-stopped"]);
    }

    /// Writes are counted in whole bytes however the time is sliced: a volume's size and
    /// what was written stay whole, so the rounds' bytes (what changed since the last
    /// snapshot) add up to the volume's size, never a byte past it.
    #[test]
    fn writes_count_whole_bytes() {
        let mut d = DataPlane::new(100.0);
        d.ensure_volume(
            "ns",
            "v",
            Some(0),
            Some("StatefulSet/db"),
            1 << 20,
            "",
            10.5,
        );
        d.attach("ns", "v", "StatefulSet/db", 3.3);
        for _ in 0..97 {
            d.advance(0.7);
        }
        let v = d.volume("ns", "v").unwrap();
        assert_eq!(v.used, v.used.floor());
        assert_eq!(v.written, v.written.floor());
        assert_eq!(v.used, v.written);
        // 10 to start, then 3.3 bytes/s for 67.9 s: 224 whole bytes, the rest carried.
        assert_eq!(v.used, 10.0 + (3.3f64 * 0.7 * 97.0 + 1e-9).floor());
    }

    #[test]
    fn rounds_copy_what_changed_and_the_target_holds_the_fenced_version() {
        let never = |_: &str, _: &str| false;
        let (mut a, mut b) = (DataPlane::new(100.0), DataPlane::new(50.0));
        a.ensure_volume(
            "ns",
            "data-db-0",
            Some(0),
            Some("StatefulSet/db"),
            10_000,
            "standard",
            1000.0,
        );
        a.attach("ns", "data-db-0", "StatefulSet/db", 10.0);
        // Round 1: everything.
        a.set_transfers("w", &[send(1, false)], &never);
        let s1 = a.statuses("w", &[send(1, false)])[0].clone();
        assert!(s1.complete);
        assert_eq!(
            (s1.round, s1.volumes[0].bytes, s1.volumes[0].data_version),
            (1, 1000, 1)
        );
        let r1 = receive(&s1, 0, 0);
        b.set_transfers("w", std::slice::from_ref(&r1), &never);
        assert!(!b.received("m1"));
        // 50 bytes a second (the smaller uplink): 20 seconds.
        a.advance(10.0);
        b.advance(10.0);
        assert_eq!(
            b.statuses("w", std::slice::from_ref(&r1))[0].volumes[0].copied,
            500
        );
        a.advance(10.0);
        b.advance(10.0);
        assert!(b.received("m1"));
        assert_eq!(b.volume("ns", "data-db-0").unwrap().version, 1);
        // Round 2: what was written in the meantime (20 s at 10 bytes/s), on top of round 1.
        a.set_transfers("w", &[send(2, false)], &never);
        let s2 = a.statuses("w", &[send(2, false)])[0].clone();
        assert_eq!((s2.round, s2.volumes[0].bytes), (2, 200));
        let v_before_fence = s2.volumes[0].data_version;
        assert!(v_before_fence > 1);
        b.set_transfers("w", &[receive(&s2, 1, 0)], &never);
        b.advance(4.0);
        assert!(b.received("m1"));
        assert_eq!(b.volume("ns", "data-db-0").unwrap().version, v_before_fence);
        // The fence: the final snapshot waits until the pods have stopped.
        a.set_transfers("w", &[send(3, true)], &never);
        let waiting = a.statuses("w", &[send(3, true)])[0].clone();
        assert_eq!(waiting.round, 2, "no snapshot before the fence");
        a.advance(1.0);
        a.detach("ns", "data-db-0", "StatefulSet/db", 10.0);
        let fenced = |_: &str, w: &str| w == "StatefulSet/db";
        assert!(a.step(&fenced));
        let s3 = a.statuses("w", &[send(3, true)])[0].clone();
        assert!(s3.complete && s3.fenced);
        let fenced_version = s3.volumes[0].data_version;
        assert_eq!(s3.volumes[0].bytes, 10);
        b.set_transfers("w", &[receive(&s3, v_before_fence, 0)], &never);
        b.advance(1.0);
        assert!(b.received("m1"));
        let v = b.volume("ns", "data-db-0").unwrap();
        assert_eq!(
            (v.version, v.used as i64),
            (
                fenced_version,
                a.volume("ns", "data-db-0").unwrap().used as i64
            )
        );
    }

    #[test]
    fn a_target_holding_another_version_gets_everything() {
        let never = |_: &str, _: &str| false;
        let mut b = DataPlane::new(1000.0);
        b.ensure_volume("ns", "data-db-0", Some(0), None, 10_000, "", 300.0);
        let snap = TransferStatus {
            id: "m1".into(),
            role: TransferRole::Send,
            round: 4,
            complete: true,
            volumes: vec![TransferVolumeStatus {
                name: "data-db-0".into(),
                data_version: 9,
                used_bytes: 2000,
                bytes: 50,
                copied: 0,
                written_bytes: 0,
            }],
            ..Default::default()
        };
        // Round 4 was taken after version 7; this volume holds version 1.
        b.set_transfers("w", &[receive(&snap, 7, 0)], &never);
        let st = b.statuses("w", &[receive(&snap, 7, 0)])[0].clone();
        assert_eq!(st.volumes[0].bytes, 2000);
        // Resending the same round neither restarts nor duplicates the copy.
        b.advance(1.0);
        b.set_transfers("w", &[receive(&snap, 7, 0)], &never);
        assert_eq!(
            b.statuses("w", &[receive(&snap, 7, 0)])[0].volumes[0].copied,
            1000
        );
        b.advance(1.0);
        assert!(b.received("m1"));
        assert_eq!(b.volume("ns", "data-db-0").unwrap().version, 9);
    }

    #[test]
    fn concurrent_copies_share_the_uplink_and_the_path_caps_each() {
        let never = |_: &str, _: &str| false;
        let mut b = DataPlane::new(100.0);
        let snap = |id: &str, name: &str| TransferStatus {
            id: id.into(),
            round: 1,
            complete: true,
            volumes: vec![TransferVolumeStatus {
                name: name.into(),
                data_version: 3,
                used_bytes: 1000,
                bytes: 1000,
                copied: 0,
                written_bytes: 0,
            }],
            ..Default::default()
        };
        let mut t1 = receive(&snap("x", "v1"), 0, 0);
        t1.id = "x".into();
        t1.volumes[0].name = "v1".into();
        let mut t2 = receive(&snap("y", "v2"), 0, 20);
        t2.id = "y".into();
        t2.volumes[0].name = "v2".into();
        b.set_transfers("w", &[t1.clone(), t2.clone()], &never);
        b.advance(1.0);
        let st = b.statuses("w", &[t1, t2]);
        // Half the uplink each, and the second's path allows only 20.
        assert_eq!((st[0].volumes[0].copied, st[1].volumes[0].copied), (50, 20));
    }

    #[test]
    fn dropping_a_work_forgets_its_transfers_and_state_survives_a_restart() {
        let never = |_: &str, _: &str| false;
        let mut a = DataPlane::new(100.0);
        a.ensure_volume(
            "ns",
            "data-db-0",
            Some(0),
            Some("StatefulSet/db"),
            10_000,
            "",
            500.0,
        );
        a.set_transfers("w", &[send(1, false)], &never);
        let snap = a.snapshot_state();
        let mut again = DataPlane::new(100.0);
        again.restore(serde_json::from_value(serde_json::to_value(&snap).unwrap()).unwrap());
        assert_eq!(
            again.statuses("w", &[send(1, false)]),
            a.statuses("w", &[send(1, false)])
        );
        // The next round after the restart copies only what changed, not everything again.
        again.attach("ns", "data-db-0", "StatefulSet/db", 5.0);
        again.advance(2.0);
        again.set_transfers("w", &[send(2, false)], &never);
        assert_eq!(
            again.statuses("w", &[send(2, false)])[0].volumes[0].bytes,
            10
        );
        assert!(again.drop_work("w"));
        assert!(again.statuses("w", &[send(2, false)]).is_empty());
        // An abandoned copy's volumes go with it; a copy a workload took stays.
        let mut b = DataPlane::new(100.0);
        let snap = a.statuses("w", &[send(1, false)])[0].clone();
        b.set_transfers("w", &[receive(&snap, 0, 0)], &never);
        assert!(b.volume("ns", "data-db-0").is_some());
        b.drop_work("w");
        assert!(b.volume("ns", "data-db-0").is_none(), "nobody took it");
        b.set_transfers("w", &[receive(&snap, 0, 0)], &never);
        b.ensure_volume(
            "ns",
            "data-db-0",
            Some(0),
            Some("StatefulSet/db"),
            0,
            "",
            0.0,
        );
        b.set_transfers("w", &[], &never);
        assert!(
            b.volume("ns", "data-db-0").is_some(),
            "the StatefulSet took it"
        );
        a.delete_owned("ns", "StatefulSet/db");
        assert!(a.volume("ns", "data-db-0").is_none());
    }
}
