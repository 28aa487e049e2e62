//! A stateful workload's standby copy (`placement.stateful.standby`): the volumes replicated
//! asynchronously to another cluster, a round whenever the copy would fall half its
//! `maxLagSeconds` behind, so that when the cluster running the workload is lost it starts
//! there with what was written up to the last round (the recovery point).
//!
//! Like [`super::plan`], a pure function of stored state: the binding's `status.standby`,
//! and what the two members report of the standby transfer in their Works.

use orrery_api::MicroTime;
use orrery_api::binding::{BindingSpec, ClusterTransfer};
use orrery_api::stateful::{
    MigrationPhase, StandbyStatus, StandbyVolume, Transfer, TransferRole, TransferVolume,
};

use super::plan::End;

/// The standby transfer's id for a binding.
pub fn transfer_id(binding_uid: &str) -> String {
    format!("standby-{binding_uid}")
}

#[derive(Debug)]
pub struct Input<'a> {
    pub now: MicroTime,
    pub id: &'a str,
    pub namespace: &'a str,
    /// The template, `Kind/name`.
    pub workload: &'a str,
    pub spec: &'a BindingSpec,
    /// The phase of the move under way, if one is.
    pub moving: Option<MigrationPhase>,
    pub status: Option<&'a StandbyStatus>,
    pub max_lag_seconds: i64,
    pub source: End,
    pub standby: End,
    /// Bytes per second the path allows.
    pub rate: i64,
}

#[derive(Debug, PartialEq)]
pub struct Output {
    pub status: Option<StandbyStatus>,
    /// The standby's transfers (replacing those of this id in the binding).
    pub transfers: Vec<ClusterTransfer>,
}

/// The cluster a standby copies from: the one cluster the workload runs in.
pub fn source_of(spec: &BindingSpec) -> Option<&str> {
    let mut placed = spec.clusters.iter().filter(|c| c.replicas > 0);
    let one = placed.next()?;
    placed.next().is_none().then_some(one.name.as_str())
}

/// The standby copy's next step: its status, and the transfers the two members' Works carry.
pub fn step(i: &Input<'_>) -> Output {
    let spec = i.spec;
    let none = |status: Option<StandbyStatus>| Output {
        status,
        transfers: Vec::new(),
    };
    if spec.standby.is_empty() {
        return none(None);
    }
    // A move under way carries the data itself; the standby waits, as it is, until the
    // workload serves at its target (a failover starts on the standby's volumes: their copy
    // must not go before the workload has them).
    if !spec.migration.is_empty() && i.moving.is_none_or(|p| p < MigrationPhase::Switching) {
        return Output {
            status: i.status.cloned(),
            transfers: spec
                .transfers
                .iter()
                .filter(|t| t.transfer.id == i.id)
                .cloned()
                .collect(),
        };
    }
    let Some(source) = source_of(spec) else {
        return none(Some(StandbyStatus {
            cluster: spec.standby.clone(),
            message: "a standby copy is kept of a workload running in one cluster".into(),
            ..Default::default()
        }));
    };
    if source == spec.standby {
        return none(i.status.cloned());
    }
    let mut st = status_for(i, source);
    if st.volumes.is_empty() {
        take_volumes(i, source, &mut st);
    }
    if st.volumes.is_empty() {
        st.message = format!("waiting for {source} to report the workload's volumes");
        return none(Some(st));
    }
    take_snapshot(i, &mut st);
    take_copy(i, &mut st);
    let send_round = next_send_round(i, &mut st);
    describe(i, source, &mut st);
    let mut transfers = Vec::new();
    if send_round >= 1 {
        transfers.push(send(i, source, &st, send_round));
    }
    if st.snapshot_round >= 1 {
        transfers.push(receive(i, source, &st));
    }
    Output {
        status: Some(st),
        transfers,
    }
}

/// The stored status, while it is of the same standby and source; else a new one (a copy
/// from another source starts again).
fn status_for(i: &Input<'_>, source: &str) -> StandbyStatus {
    let spec = i.spec;
    match i.status {
        Some(s) if s.cluster == spec.standby && s.source == source => s.clone(),
        _ => StandbyStatus {
            cluster: spec.standby.clone(),
            source: source.to_string(),
            ..Default::default()
        },
    }
}

/// Takes in the volumes the standby copies, once the source reports the workload: those of
/// the ordinals it runs.
fn take_volumes(i: &Input<'_>, source: &str, st: &mut StandbyStatus) {
    let Some(m) = i.source.work.as_ref().and_then(|w| w.workload.as_ref()) else {
        return;
    };
    let replicas = i
        .spec
        .clusters
        .iter()
        .find(|c| c.name == source)
        .map_or(0, |c| c.replicas);
    st.volumes = m
        .volumes
        .iter()
        .filter(|v| v.ordinal.is_none_or(|o| o < replicas))
        .map(|v| StandbyVolume {
            name: v.name.clone(),
            ordinal: v.ordinal,
            capacity: v.capacity,
            storage_class: v.storage_class.clone(),
            ..Default::default()
        })
        .collect();
}

/// Takes in the source's snapshot of the round in flight, if it is there and new.
fn take_snapshot(i: &Input<'_>, st: &mut StandbyStatus) {
    let round = st.rounds + 1;
    if st.snapshot_round < round
        && let Some(t) = i.source.work.as_ref().and_then(|w| w.transfer.as_ref())
        && t.round == round
        && t.complete
    {
        for v in st.volumes.iter_mut() {
            if let Some(s) = t.volumes.iter().find(|s| s.name == v.name) {
                v.round_base = v.synced_version;
                v.round_bytes = s.bytes;
                v.snapshot_version = s.data_version;
                v.snapshot_written = s.written_bytes;
                v.snapshot_used = s.used_bytes;
            }
        }
        st.snapshot_round = round;
        st.snapshot_at = Some(i.now);
        st.rate = i.rate.max(1);
    }
}

/// Takes in the standby's copy of the round in flight, once it is complete: the standby
/// then holds the data as of the round's snapshot.
fn take_copy(i: &Input<'_>, st: &mut StandbyStatus) {
    let round = st.rounds + 1;
    if st.snapshot_round == round
        && let Some(t) = i.standby.work.as_ref().and_then(|w| w.transfer.as_ref())
        && t.round == round
        && t.complete
    {
        for v in st.volumes.iter_mut() {
            v.synced_version = v.snapshot_version;
            v.synced_written = v.snapshot_written;
        }
        st.rounds = round;
        st.synced_at = st.snapshot_at;
    }
}

/// The copy's lag (into `st`), and the round the source is asked to snapshot: a new round
/// once the copy is half its allowed lag behind (at once for the first) and the source
/// serves, else the one in flight.
fn next_send_round(i: &Input<'_>, st: &mut StandbyStatus) -> u32 {
    st.lag_seconds = st
        .synced_at
        .map(|s| (i.now.millis_since(s) as f64 / 1000.0).max(0.0));
    let due = st.snapshot_round == st.rounds
        && st
            .synced_at
            .is_none_or(|s| i.now.millis_since(s) >= i.max_lag_seconds * 500);
    if due && i.source.serving {
        st.rounds + 1
    } else {
        st.snapshot_round
    }
}

/// The status message: how far behind the copy is, or why it is stuck.
fn describe(i: &Input<'_>, source: &str, st: &mut StandbyStatus) {
    st.message = match st.synced_at {
        Some(_) => format!(
            "{} holds the data of {source} as of {:.1}s ago ({} round(s))",
            st.cluster,
            st.lag_seconds.unwrap_or_default(),
            st.rounds
        ),
        None => format!(
            "copying the data of {source} to {} for the first time",
            st.cluster
        ),
    };
    // A member that cannot take part says why; the copy goes on once it can.
    for (cluster, end) in [(source, &i.source), (i.spec.standby.as_str(), &i.standby)] {
        if let Some(t) = end.work.as_ref().and_then(|w| w.transfer.as_ref())
            && !t.complete
            && !t.message.is_empty()
        {
            st.message = format!("the copy is stuck at {cluster}: {}", t.message);
        }
    }
}

/// The source's part: a snapshot of `round`.
fn send(i: &Input<'_>, source: &str, st: &StandbyStatus, round: u32) -> ClusterTransfer {
    ClusterTransfer {
        cluster: source.to_string(),
        transfer: Transfer {
            id: i.id.to_string(),
            role: TransferRole::Send,
            namespace: i.namespace.to_string(),
            peer: st.cluster.clone(),
            round,
            workload: i.workload.to_string(),
            volumes: st
                .volumes
                .iter()
                .map(|v| TransferVolume {
                    name: v.name.clone(),
                    ordinal: v.ordinal,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        },
    }
}

/// The standby's part: the copy of the last snapshot's round.
fn receive(i: &Input<'_>, source: &str, st: &StandbyStatus) -> ClusterTransfer {
    ClusterTransfer {
        cluster: st.cluster.clone(),
        transfer: Transfer {
            id: i.id.to_string(),
            role: TransferRole::Receive,
            namespace: i.namespace.to_string(),
            peer: source.to_string(),
            round: st.snapshot_round,
            volumes: st
                .volumes
                .iter()
                .map(|v| TransferVolume {
                    name: v.name.clone(),
                    ordinal: v.ordinal,
                    capacity: v.capacity,
                    storage_class: v.storage_class.clone(),
                    bytes: v.round_bytes,
                    data_version: v.snapshot_version,
                    used_bytes: v.snapshot_used,
                    base_version: v.round_base,
                })
                .collect(),
            rate: st.rate,
            ..Default::default()
        },
    }
}

/// The binding with `transfers` as the standby's (those of `id` replaced).
pub fn with_transfers(
    spec: &BindingSpec,
    id: &str,
    transfers: Vec<ClusterTransfer>,
) -> BindingSpec {
    let mut s = spec.clone();
    s.transfers.retain(|t| t.transfer.id != id);
    s.transfers.extend(transfers);
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::migration::plan::WorkSeen;
    use orrery_api::stateful::{TransferStatus, TransferVolumeStatus, VolumeStatus};
    use orrery_api::work::ManifestStatus;
    use serde_json::json;

    fn spec() -> BindingSpec {
        serde_json::from_value(json!({
            "resource": {"apiVersion": "apps/v1", "kind": "StatefulSet", "namespace": "ns", "name": "db"},
            "policy": {"apiVersion": "v1", "kind": "P", "name": "p"},
            "clusters": [{"name": "a", "replicas": 1}],
            "standby": "b",
        }))
        .unwrap()
    }

    fn t(ms: i64) -> MicroTime {
        MicroTime::from(orrery_api::Time::from_unix_seconds(1_700_000_000).unwrap()).add_millis(ms)
    }

    fn source(round: Option<(u32, u64, i64, i64)>) -> End {
        End {
            serving: true,
            work: Some(WorkSeen {
                current: true,
                transfer: round.map(|(r, v, written, bytes)| TransferStatus {
                    id: "standby-u".into(),
                    role: TransferRole::Send,
                    round: r,
                    complete: true,
                    volumes: vec![TransferVolumeStatus {
                        name: "data-db-0".into(),
                        data_version: v,
                        used_bytes: 500,
                        bytes,
                        copied: 0,
                        written_bytes: written,
                    }],
                    ..Default::default()
                }),
                workload: Some(ManifestStatus {
                    volumes: vec![VolumeStatus {
                        name: "data-db-0".into(),
                        ordinal: Some(0),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                error: None,
            }),
        }
    }

    fn standby(round: Option<u32>) -> End {
        End {
            serving: true,
            work: Some(WorkSeen {
                current: true,
                transfer: round.map(|r| TransferStatus {
                    id: "standby-u".into(),
                    role: TransferRole::Receive,
                    round: r,
                    complete: true,
                    ..Default::default()
                }),
                ..Default::default()
            }),
        }
    }

    fn run(status: Option<&StandbyStatus>, now: i64, src: End, sb: End) -> Output {
        step(&Input {
            now: t(now),
            id: "standby-u",
            namespace: "ns",
            workload: "StatefulSet/db",
            spec: &spec(),
            moving: None,
            status,
            max_lag_seconds: 10,
            source: src,
            standby: sb,
            rate: 100,
        })
    }

    #[test]
    fn a_member_that_cannot_copy_says_why_and_the_copy_is_asked_again() {
        let mut src = source(None);
        if let Some(w) = src.work.as_mut() {
            w.transfer = Some(TransferStatus {
                id: "standby-u".into(),
                role: TransferRole::Send,
                round: 1,
                message: "this member has no data mover".into(),
                ..Default::default()
            });
        }
        let o = run(None, 0, src, standby(None));
        let st = o.status.unwrap();
        assert_eq!(
            st.message,
            "the copy is stuck at a: this member has no data mover"
        );
        assert_eq!(
            o.transfers.len(),
            1,
            "still asked for: it goes on once it can"
        );
    }

    #[test]
    fn rounds_keep_the_copy_within_its_lag() {
        // First: a snapshot is asked for at once.
        let o = run(None, 0, source(None), standby(None));
        let st = o.status.unwrap();
        assert_eq!((st.rounds, st.snapshot_round), (0, 0));
        assert_eq!(o.transfers.len(), 1);
        assert_eq!(
            (
                o.transfers[0].cluster.as_str(),
                o.transfers[0].transfer.round
            ),
            ("a", 1)
        );
        // The snapshot: the standby copies it (everything, the first time).
        let o = run(
            Some(&st),
            100,
            source(Some((1, 7, 500, 500))),
            standby(None),
        );
        let st = o.status.unwrap();
        let recv = &o
            .transfers
            .iter()
            .find(|x| x.cluster == "b")
            .unwrap()
            .transfer;
        assert_eq!(
            (
                recv.round,
                recv.volumes[0].bytes,
                recv.volumes[0].base_version
            ),
            (1, 500, 0)
        );
        // In: synced; no new round until half the lag (5 s) has passed.
        let o = run(
            Some(&st),
            900,
            source(Some((1, 7, 500, 500))),
            standby(Some(1)),
        );
        let st = o.status.unwrap();
        assert_eq!(
            (
                st.rounds,
                st.volumes[0].synced_version,
                st.volumes[0].synced_written
            ),
            (1, 7, 500)
        );
        assert_eq!(
            st.synced_at,
            Some(t(100)),
            "as of the snapshot, not of the copy"
        );
        let send = &o
            .transfers
            .iter()
            .find(|x| x.cluster == "a")
            .unwrap()
            .transfer;
        assert_eq!(send.round, 1, "{st:?}");
        let o = run(
            Some(&st),
            5_200,
            source(Some((1, 7, 500, 500))),
            standby(Some(1)),
        );
        let send = &o
            .transfers
            .iter()
            .find(|x| x.cluster == "a")
            .unwrap()
            .transfer;
        assert_eq!(send.round, 2);
        assert!((o.status.unwrap().lag_seconds.unwrap() - 5.1).abs() < 1e-9);
        // A move under way holds it as it is until the workload serves at its target; a
        // workload in two clusters has none.
        let mut moving = spec();
        moving.migration = "m".into();
        moving.transfers = vec![ClusterTransfer {
            cluster: "b".into(),
            transfer: Transfer {
                id: "standby-u".into(),
                round: 1,
                ..Default::default()
            },
        }];
        let input = |spec: &BindingSpec, phase: Option<MigrationPhase>| {
            step(&Input {
                spec,
                moving: phase,
                status: Some(&st),
                now: t(0),
                id: "standby-u",
                namespace: "ns",
                workload: "StatefulSet/db",
                max_lag_seconds: 10,
                source: source(None),
                standby: standby(None),
                rate: 1,
            })
        };
        let o = input(&moving, Some(MigrationPhase::Starting));
        assert_eq!(o.transfers, moving.transfers, "left as they are");
        assert_eq!(o.status, Some(st.clone()));
        // Failed over to b: b runs it now, and keeps no standby of itself.
        moving.clusters = vec![orrery_api::binding::TargetCluster {
            name: "b".into(),
            replicas: 1,
        }];
        let o = input(&moving, Some(MigrationPhase::Switching));
        assert!(o.transfers.is_empty(), "{:?}", o.transfers);
        let mut two = spec();
        two.clusters.push(orrery_api::binding::TargetCluster {
            name: "c".into(),
            replicas: 1,
        });
        let o = input(&two, None);
        assert!(o.transfers.is_empty());
        assert!(o.status.unwrap().message.contains("one cluster"));
    }
}
