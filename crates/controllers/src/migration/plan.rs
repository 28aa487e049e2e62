//! A migration's phases as a function of what is stored: the Migration's status, the
//! template's binding, what each member reports in its Work, and whether each cluster
//! serves. No clock of its own and no I/O: a server that restarts in any phase computes the
//! same next step from the same stored facts, so a copy is never started again from zero
//! and a fence is never lost.
//!
//! The binding overlay each phase wants (where the workload runs, which copy is fenced,
//! which transfers each Work carries) is rebuilt from the status every time, so what is
//! written is the same whoever writes it and however often.
//!
//! ```text
//! Pending ─► Replicating ─(a round short enough)─► Fencing ─► FinalSync ─► Starting ─► Switching ─► Cleaning ─► Succeeded
//!               │ rounds: snapshot at the source,      │ the source's pods stop;   │ the target   │ followers     │ after a grace,
//!               │ copy of what changed to the target   │ last snapshot after that  │ runs the same│ move to the   │ the source's copy
//!               ▼                                      ▼                           │ ordinals on  │ target        │ and its volumes go
//!             Failed (the workload stays at the source, which is started again) ◄─┘ the copy      │               │
//! ```
//!
//! The fence waits in Replicating, copying nothing more, while stopping the source's ready
//! replicas would break the placement's disruption budget ([`FenceBudget`], `BudgetWaits`).
//!
//! [`step`] dispatches on the phase: each phase of the diagram has its own function (`pending`,
//! `replicating`, ... `failed`), which either moves on, when the next phase may act at once in
//! the same step, or waits.

use orrery_api::MicroTime;
use orrery_api::binding::{BindingSpec, ClusterTransfer, Eviction, TargetCluster};
use orrery_api::conditions::{self, Condition};
use orrery_api::stateful::{
    DataLoss, MigrationPhase as Phase, MigrationStatus, MigrationVolume, PhaseTime, StandbyStatus,
    Transfer, TransferRole, TransferStatus, TransferVolume, VolumeStatus, ordinal_volume,
};
use orrery_api::work::{Health, ManifestStatus};

/// The condition a Migration carries: Unknown while it runs, then True or False.
pub const CONDITION: &str = "Migrated";

/// The migration controller's knobs.
#[derive(Clone, Debug)]
pub struct Settings {
    /// A round whose copy took at most this long (at the path's rate) is the last before the
    /// fence: what is written meanwhile is copied while the workload is stopped.
    pub final_round_seconds: f64,
    /// The fence comes after this many rounds at the latest (writes faster than the path).
    pub max_rounds: u32,
    /// How long the target may take to run the workload once its data is in.
    pub start_timeout_seconds: i64,
    /// How long the source may take to confirm its pods stopped.
    pub fence_timeout_seconds: i64,
    /// How long followers have to move to the target before cleaning starts anyway.
    pub switch_timeout_seconds: i64,
    /// How long the source's (fenced) copy and its volumes stay after the switch.
    pub cleanup_grace_seconds: i64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            final_round_seconds: 1.0,
            max_rounds: 10,
            start_timeout_seconds: 300,
            fence_timeout_seconds: 120,
            switch_timeout_seconds: 60,
            cleanup_grace_seconds: 30,
        }
    }
}

/// What a member reports in the binding's Work there.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorkSeen {
    /// The member reported the Work's current generation.
    pub current: bool,
    /// This migration's transfer there.
    pub transfer: Option<TransferStatus>,
    /// The template's status there.
    pub workload: Option<ManifestStatus>,
    /// Why the Work is not applied, if it is not.
    pub error: Option<String>,
}

/// One end of the move.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct End {
    /// Ready and without the health controller's taints: it can act and report.
    pub serving: bool,
    /// The binding's Work there, if there is one.
    pub work: Option<WorkSeen>,
}

#[derive(Debug)]
pub struct Input<'a> {
    pub now: MicroTime,
    pub name: &'a str,
    /// Names the migration's transfers (its uid).
    pub id: &'a str,
    pub namespace: &'a str,
    /// The template, `Kind/name`.
    pub workload: &'a str,
    /// The Migration is being deleted.
    pub deleting: bool,
    pub status: &'a MigrationStatus,
    pub binding: Option<&'a BindingSpec>,
    pub source: End,
    pub target: End,
    /// Bytes per second the path allows this migration now.
    pub rate: i64,
    /// In `Switching`: what does not serve at the target yet (followers, Services selecting
    /// the workload's pods), as `Kind name`; empty when everything does.
    pub switch_waits: Vec<String>,
    /// `placement.stateful.onDataLoss: StartEmpty`.
    pub starts_empty: bool,
    /// The workload's standby copy, if it keeps one.
    pub standby: Option<&'a StandbyStatus>,
    /// What the source last said of its volumes (name, written bytes), and when it was last
    /// heard from: the recovery point of a failover is measured against them.
    pub source_written: Vec<(String, i64)>,
    pub source_last_heard: Option<MicroTime>,
    /// The workload's disruption budget, when its placement has one.
    pub budget: Option<FenceBudget>,
    pub settings: &'a Settings,
}

/// A disruption budget where the move stands. The fence stops the source's ready replicas,
/// so it waits while that would leave fewer than `min_available` ready in the fleet.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FenceBudget {
    pub min_available: i64,
    /// Replicas ready now in the binding's clusters that serve, the source's among them.
    pub ready: i64,
    pub ready_at_source: i64,
}

/// The reason of the condition of a move that waits for its budget.
pub const BUDGET_WAITS: &str = "BudgetWaits";

/// An Event to record on the template.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub type_: &'static str,
    pub reason: &'static str,
    pub message: String,
}

#[derive(Debug, PartialEq)]
pub struct Output {
    pub status: MigrationStatus,
    /// The binding's spec, when the overlay must change.
    pub binding: Option<BindingSpec>,
    pub events: Vec<Event>,
    /// Nothing of the migration is left in the binding (its finalizer may go).
    pub released: bool,
}

fn started(st: &MigrationStatus, phase: Phase) -> Option<MicroTime> {
    st.phases
        .iter()
        .rev()
        .find(|p| p.phase == phase)
        .map(|p| p.started)
}

/// Moves to `phase`, closing the time of the one before.
fn enter(st: &mut MigrationStatus, phase: Phase, now: MicroTime) {
    if st.phase == phase && !st.phases.is_empty() {
        return;
    }
    if let Some(last) = st.phases.last_mut()
        && last.finished.is_none()
    {
        last.finished = Some(now);
        last.duration_ms = Some(now.millis_since(last.started));
    }
    st.phase = phase;
    if !phase.is_done() {
        st.phases.push(PhaseTime {
            phase,
            started: now,
            finished: None,
            duration_ms: None,
        });
    }
}

fn condition(status: &str, reason: &str, message: &str, now: MicroTime, st: &mut MigrationStatus) {
    conditions::set(
        &mut st.conditions,
        Condition::new(CONDITION, status, reason, message),
        now.time(),
    );
    st.message = message.to_string();
}

/// Fails the move; the rollback is the Failed phase's overlay.
fn fail(message: String, now: MicroTime, ev: &mut Vec<Event>, st: &mut MigrationStatus) {
    enter(st, Phase::Failed, now);
    st.completion_time = Some(now.time());
    condition(conditions::FALSE, "Failed", &message, now, st);
    ev.push(Event {
        type_: "Warning",
        reason: "MigrationFailed",
        message,
    });
}

fn volumes_of(st: &MigrationStatus) -> impl Iterator<Item = &MigrationVolume> {
    st.volumes.iter()
}

/// The source's part: a snapshot of `round` (after the fence, for the final one).
fn send(i: &Input<'_>, st: &MigrationStatus, round: u32, after_fence: bool) -> Transfer {
    Transfer {
        id: i.id.to_string(),
        role: TransferRole::Send,
        namespace: i.namespace.to_string(),
        peer: st.target.clone(),
        round,
        after_fence,
        workload: i.workload.to_string(),
        volumes: volumes_of(st)
            .map(|v| TransferVolume {
                name: v.name.clone(),
                ordinal: v.ordinal,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// The target's part: the copy of the last snapshot's round (held workload for the final).
fn receive(
    i: &Input<'_>,
    st: &MigrationStatus,
    capacity: &[(String, TransferVolume)],
    hold: bool,
) -> Transfer {
    Transfer {
        id: i.id.to_string(),
        role: TransferRole::Receive,
        namespace: i.namespace.to_string(),
        peer: st.source.clone(),
        round: st.snapshot_round,
        volumes: volumes_of(st)
            .map(|v| {
                let base = capacity
                    .iter()
                    .find(|(n, _)| *n == v.name)
                    .map(|(_, t)| t.clone())
                    .unwrap_or_default();
                TransferVolume {
                    name: v.name.clone(),
                    ordinal: v.ordinal,
                    capacity: base.capacity,
                    storage_class: base.storage_class,
                    bytes: v.round_bytes,
                    data_version: v.source_version,
                    used_bytes: v.bytes,
                    base_version: v.round_base,
                }
            })
            .collect(),
        rate: st.rate,
        hold_workload: hold,
        ..Default::default()
    }
}

/// The moved volumes' capacity and class, as the source reports them.
fn capacities(i: &Input<'_>) -> Vec<(String, TransferVolume)> {
    i.source
        .work
        .as_ref()
        .and_then(|w| w.workload.as_ref())
        .map(|m| {
            m.volumes
                .iter()
                .map(|v| {
                    (
                        v.name.clone(),
                        TransferVolume {
                            capacity: v.capacity,
                            storage_class: v.storage_class.clone(),
                            ..Default::default()
                        },
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Takes in the source's snapshot of the round in flight, if it is there and new.
fn take_snapshot(i: &Input<'_>, st: &mut MigrationStatus) -> bool {
    let round = st.rounds + 1;
    if st.snapshot_round >= round {
        return false;
    }
    let Some(t) = i.source.work.as_ref().and_then(|w| w.transfer.as_ref()) else {
        return false;
    };
    if t.round != round || !t.complete {
        return false;
    }
    for v in st.volumes.iter_mut() {
        if let Some(s) = t.volumes.iter().find(|s| s.name == v.name) {
            v.round_base = v.target_version;
            v.round_bytes = s.bytes;
            v.round_copied = 0;
            v.source_version = s.data_version;
            v.bytes = s.used_bytes;
        }
    }
    st.snapshot_round = round;
    st.rate = i.rate.max(1);
    true
}

/// Takes in the target's copy of the round in flight; `true` once it is in.
fn take_copy(i: &Input<'_>, st: &mut MigrationStatus) -> bool {
    let round = st.rounds + 1;
    if st.snapshot_round != round {
        return false;
    }
    let Some(t) = i.target.work.as_ref().and_then(|w| w.transfer.as_ref()) else {
        return false;
    };
    if t.round != round {
        return false;
    }
    for v in st.volumes.iter_mut() {
        if let Some(s) = t.volumes.iter().find(|s| s.name == v.name) {
            v.round_copied = s.copied.min(v.round_bytes.max(s.bytes));
        }
    }
    if !t.complete {
        return false;
    }
    for v in st.volumes.iter_mut() {
        if let Some(s) = t.volumes.iter().find(|s| s.name == v.name) {
            // A target that held another version copied the whole volume.
            v.copied += s.bytes;
            v.round_copied = s.bytes;
            v.target_version = s.data_version;
        }
    }
    st.rounds = round;
    true
}

/// How long the last round's copy took at the path's rate.
fn last_round_seconds(st: &MigrationStatus) -> f64 {
    let bytes: i64 = st.volumes.iter().map(|v| v.round_bytes).sum();
    bytes as f64 / st.rate.max(1) as f64
}

/// The binding as the phase wants it. `fence_target`: the target's copy runs no pods (a
/// rollback after it started); `release`: the migration lets go of the binding.
fn overlay(
    i: &Input<'_>,
    spec: &BindingSpec,
    st: &MigrationStatus,
    transfers: (Option<Transfer>, Option<Transfer>),
    fence_target: bool,
    release: bool,
) -> BindingSpec {
    let (a, t) = (st.source.as_str(), st.target.as_str());
    let mut s = spec.clone();
    let at_target = matches!(
        st.phase,
        Phase::FinalSync | Phase::Starting | Phase::Switching | Phase::Cleaning | Phase::Succeeded
    );
    s.clusters.retain(|c| c.name != a && c.name != t);
    s.clusters.push(TargetCluster {
        name: if at_target { t } else { a }.to_string(),
        replicas: st.replicas,
    });
    s.clusters.sort_by(|x, y| x.name.cmp(&y.name));
    // The source's copy stays fenced from the fence until cleaning lets it go.
    let cleaned = st.phase == Phase::Succeeded
        || (st.phase == Phase::Cleaning
            && started(st, Phase::Cleaning).is_some_and(|c| {
                i.deleting || i.now.seconds_since(c) >= i.settings.cleanup_grace_seconds
            }));
    // A rolled-back move whose target is still fenced keeps the source fenced as well: until
    // the target confirms, two writers could run.
    let fence_source = (matches!(
        st.phase,
        Phase::Fencing | Phase::FinalSync | Phase::Starting | Phase::Switching | Phase::Cleaning
    ) && !cleaned)
        || (st.phase == Phase::Failed && fence_target);
    s.fenced.retain(|c| c != a && c != t);
    if fence_source {
        s.fenced.push(a.to_string());
    }
    if fence_target {
        s.fenced.push(t.to_string());
    }
    s.fenced.sort();
    let marker = format!("migration {}", i.name);
    s.evictions
        .retain(|e| !(e.cluster == a && e.keep && e.reason.starts_with(&marker)));
    if at_target && fence_source {
        s.evictions.push(Eviction {
            cluster: a.to_string(),
            reason: format!("{marker}: its data moved to {t}"),
            since: st.fenced_at.unwrap_or(i.now).time(),
            keep_until: None,
            keep: true,
            rescheduled: false,
        });
    }
    s.transfers.retain(|x| x.transfer.id != i.id);
    if let Some(x) = transfers.0 {
        s.transfers.push(ClusterTransfer {
            cluster: a.to_string(),
            transfer: x,
        });
    }
    if let Some(x) = transfers.1 {
        s.transfers.push(ClusterTransfer {
            cluster: t.to_string(),
            transfer: x,
        });
    }
    s.migration = if release {
        String::new()
    } else {
        i.name.to_string()
    };
    s
}

/// What the phase a step stops in wants of the binding (besides where the workload runs,
/// which the status says).
#[derive(Debug, Default)]
struct Wants {
    /// The transfers of the source's and the target's Works.
    transfers: (Option<Transfer>, Option<Transfer>),
    /// The target's copy runs no pods (a rollback after it started).
    fence_target: bool,
    /// The migration lets go of the binding.
    release: bool,
}

/// Whether a phase's step moved on (to a phase that may act at once) or waits.
#[derive(Debug, PartialEq)]
enum Flow {
    Next,
    Wait,
}

/// The next step of one migration.
pub fn step(i: &Input<'_>) -> Output {
    let mut st = i.status.clone();
    let mut ev = Vec::new();
    let Some(spec) = binding_to_act_on(i, &mut st, &mut ev) else {
        return Output {
            status: st,
            binding: None,
            events: ev,
            released: true,
        };
    };
    begin(i, &mut st, &mut ev);
    let caps = capacities(i);
    let mut want = Wants::default();
    // Each phase may lead to the next in the same step when nothing needs waiting for.
    for _ in 0..8 {
        // What the phase reached last wants, not what a phase passed through wanted.
        want = Wants::default();
        let flow = match st.phase {
            Phase::Pending => pending(i, &mut st, &mut ev),
            Phase::Replicating => replicating(i, &caps, &mut st, &mut ev, &mut want),
            Phase::Fencing => fencing(i, &caps, &mut st, &mut ev, &mut want),
            Phase::FinalSync => final_sync(i, &caps, &mut st, &mut ev, &mut want),
            Phase::Starting => starting(i, &caps, &mut st, &mut ev, &mut want),
            Phase::Switching => switching(i, &mut st, &mut ev),
            Phase::Cleaning => cleaning(i, &mut st, &mut ev, &mut want),
            Phase::Succeeded => {
                // Nothing of the move is left to do: the binding is let go.
                want.release = true;
                Flow::Wait
            }
            Phase::Failed => failed(i, &mut st, &mut want),
        };
        if flow == Flow::Wait {
            break;
        }
    }
    let release = want.release;
    let next = next_binding(i, spec, &st, want);
    let binding = (next != *spec).then_some(next);
    Output {
        status: st,
        binding,
        events: ev,
        released: release,
    }
}

/// The binding this migration acts on: `None` while it has no ends yet (a user's Migration
/// waits for the scheduler to choose its target), or when the binding is gone or follows
/// another migration (then the move fails, if it still runs).
fn binding_to_act_on<'a>(
    i: &Input<'a>,
    st: &mut MigrationStatus,
    ev: &mut Vec<Event>,
) -> Option<&'a BindingSpec> {
    let now = i.now;
    if st.target.is_empty() || st.source.is_empty() {
        return None;
    }
    let Some(spec) = i.binding else {
        if !st.phase.is_done() {
            fail("the template's ResourceBinding is gone".into(), now, ev, st);
        }
        return None;
    };
    if spec.migration != i.name {
        // The binding follows another migration, or none: this one has nothing to act on.
        if !st.phase.is_done() {
            fail(
                format!(
                    "the binding no longer names this migration (it names {:?})",
                    spec.migration
                ),
                now,
                ev,
                st,
            );
        }
        return None;
    }
    Some(spec)
}

/// A migration's first step enters Pending; a Migration deleted before it switched is called
/// off.
fn begin(i: &Input<'_>, st: &mut MigrationStatus, ev: &mut Vec<Event>) {
    let now = i.now;
    if st.phases.is_empty() {
        enter(st, Phase::Pending, now);
        st.start_time.get_or_insert(now.time());
        condition(
            conditions::UNKNOWN,
            "Pending",
            &format!("moving from {} to {}", st.source, st.target),
            now,
            st,
        );
    }
    // Deleted before it switched: the move is called off; after: it finishes at once.
    if i.deleting && st.phase < Phase::Switching {
        fail(
            format!(
                "the Migration was deleted: the workload stays in {}",
                st.source
            ),
            now,
            ev,
            st,
        );
    }
}

/// Pending: waits for both ends to serve and for the source to report every volume that
/// moves, then takes in those volumes and starts replicating.
fn pending(i: &Input<'_>, st: &mut MigrationStatus, ev: &mut Vec<Event>) -> Flow {
    let now = i.now;
    if !i.source.serving {
        return if unplanned(i, st, ev) {
            Flow::Next
        } else {
            Flow::Wait
        };
    }
    let Some(w) = i.source.work.as_ref().and_then(|w| w.workload.as_ref()) else {
        condition(
            conditions::UNKNOWN,
            "WaitingForSource",
            &format!("waiting for {} to report the workload", st.source),
            now,
            st,
        );
        return Flow::Wait;
    };
    if !i.target.serving {
        condition(
            conditions::UNKNOWN,
            "WaitingForTarget",
            &format!("waiting for {} to be ready", st.target),
            now,
            st,
        );
        return Flow::Wait;
    }
    // Nothing is copied before the source has reported every volume that moves: a report
    // without them (a member back from an outage, its volumes not read yet) would leave
    // nothing to copy, and the target would start on empty ones.
    let missing = unreported_volumes(i, &w.volumes, st.replicas);
    if !missing.is_empty() {
        condition(
            conditions::UNKNOWN,
            "WaitingForSource",
            &format!(
                "waiting for {} to report the volumes {}",
                st.source,
                missing.join(", ")
            ),
            now,
            st,
        );
        return Flow::Wait;
    }
    // The volumes of the ordinals that move (kept volumes of ordinals beyond the replica
    // count stay behind with the source's copy).
    st.volumes = w
        .volumes
        .iter()
        .filter(|v| v.ordinal.is_none_or(|o| o < st.replicas))
        .map(|v| MigrationVolume {
            name: v.name.clone(),
            ordinal: v.ordinal,
            bytes: v.used_bytes,
            ..Default::default()
        })
        .collect();
    enter(st, Phase::Replicating, now);
    condition(
        conditions::UNKNOWN,
        "Replicating",
        &format!(
            "copying {} volume(s) from {} to {} while the workload runs",
            st.volumes.len(),
            st.source,
            st.target
        ),
        now,
        st,
    );
    ev.push(Event {
        type_: "Normal",
        reason: "Replicating",
        message: format!(
            "copying {} bytes of {} from {} to {}",
            st.volumes.iter().map(|v| v.bytes).sum::<i64>(),
            i.workload,
            st.source,
            st.target
        ),
    });
    Flow::Next
}

/// Replicating: copy rounds while the workload runs, until one is short enough (or the
/// rounds run out); then the fence.
fn replicating(
    i: &Input<'_>,
    caps: &[(String, TransferVolume)],
    st: &mut MigrationStatus,
    ev: &mut Vec<Event>,
    want: &mut Wants,
) -> Flow {
    let now = i.now;
    if !i.source.serving {
        if unplanned(i, st, ev) {
            return Flow::Next;
        }
        // The target keeps its round while the source is away: dropped from its Work, the
        // round would start again from nothing when the source is back.
        want.transfers = (
            Some(send(i, st, st.rounds + 1, false)),
            (st.snapshot_round >= 1).then(|| receive(i, st, caps, false)),
        );
        return Flow::Wait;
    }
    if !i.target.serving {
        fail(
            format!(
                "the target {} stopped serving while the data was copied",
                st.target
            ),
            now,
            ev,
            st,
        );
        return Flow::Next;
    }
    if let Some(e) = target_error(i).or_else(|| source_error(i, st)) {
        fail(e, now, ev, st);
        return Flow::Next;
    }
    take_snapshot(i, st);
    // Whether the move waited for its budget is in the status, so a restart waits on.
    let waited =
        conditions::find(&st.conditions, CONDITION).is_some_and(|c| c.reason == BUDGET_WAITS);
    let caught_up = take_copy(i, st)
        && (last_round_seconds(st) <= i.settings.final_round_seconds
            || st.rounds >= i.settings.max_rounds);
    if (caught_up || waited)
        && let Some(msg) = budget_holds(i, st)
    {
        if !waited {
            ev.push(Event {
                type_: "Normal",
                reason: "MigrationWaits",
                message: msg.clone(),
            });
        }
        condition(conditions::UNKNOWN, BUDGET_WAITS, &msg, now, st);
        // The last round stays in both Works: nothing more is copied while the move waits,
        // and nothing is copied again from zero when it goes on.
        want.transfers = (
            Some(send(i, st, st.rounds, false)),
            Some(receive(i, st, caps, false)),
        );
        return Flow::Wait;
    }
    if waited {
        // Let go: one more round first, for what was written while it waited.
        condition(
            conditions::UNKNOWN,
            "Replicating",
            &format!(
                "the disruption budget allows the fence: copying what {} wrote meanwhile",
                st.source
            ),
            now,
            st,
        );
    } else if caught_up {
        st.fenced_at = Some(now);
        enter(st, Phase::Fencing, now);
        condition(
            conditions::UNKNOWN,
            "Fencing",
            &format!(
                "after {} round(s), stopping the workload in {} for the last copy",
                st.rounds, st.source
            ),
            now,
            st,
        );
        return Flow::Next;
    }
    let round = st.rounds + 1;
    let recv = (st.snapshot_round >= 1).then(|| receive(i, st, caps, false));
    want.transfers = (Some(send(i, st, round, false)), recv);
    Flow::Wait
}

/// Why the fence must wait for the workload's disruption budget, if it must: stopping the
/// source's ready replicas would leave fewer ready than the budget keeps.
fn budget_holds(i: &Input<'_>, st: &MigrationStatus) -> Option<String> {
    let b = i.budget?;
    let left = b.ready - b.ready_at_source;
    if b.ready_at_source <= 0 || left >= b.min_available {
        return None;
    }
    Some(format!(
        "the fence waits for the disruption budget: stopping the {} ready replica(s) in {} \
         would leave {left} ready, and at least {} must stay so; copying stopped after round {} \
         and goes on when replicas elsewhere are ready or the budget allows it",
        b.ready_at_source, st.source, b.min_available, st.rounds
    ))
}

/// Fencing: the source's pods stop; once its snapshot taken after that is in, the final
/// sync. A source that does not confirm in time fails the move.
fn fencing(
    i: &Input<'_>,
    caps: &[(String, TransferVolume)],
    st: &mut MigrationStatus,
    ev: &mut Vec<Event>,
    want: &mut Wants,
) -> Flow {
    let now = i.now;
    want.transfers = (
        Some(send(i, st, st.rounds + 1, true)),
        (st.snapshot_round >= 1).then(|| receive(i, st, caps, false)),
    );
    if let Some(e) = source_error(i, st) {
        fail(e, now, ev, st);
        return Flow::Next;
    }
    if take_snapshot(i, st) {
        for v in st.volumes.iter_mut() {
            v.fenced_version = Some(v.source_version);
        }
        enter(st, Phase::FinalSync, now);
        condition(
            conditions::UNKNOWN,
            "FinalSync",
            &format!(
                "the workload stopped in {}; copying the last {} bytes",
                st.source,
                st.volumes.iter().map(|v| v.round_bytes).sum::<i64>()
            ),
            now,
            st,
        );
        return Flow::Next;
    }
    if !i.source.serving && unplanned(i, st, ev) {
        return Flow::Next;
    }
    if started(st, Phase::Fencing)
        .is_some_and(|t| now.seconds_since(t) >= i.settings.fence_timeout_seconds)
        && i.source.serving
    {
        fail(
            format!(
                "{} did not confirm within {}s that the workload stopped",
                st.source, i.settings.fence_timeout_seconds
            ),
            now,
            ev,
            st,
        );
        return Flow::Next;
    }
    Flow::Wait
}

/// FinalSync: the target copies the last snapshot, its workload held; once the copy is in,
/// the workload starts there.
fn final_sync(
    i: &Input<'_>,
    caps: &[(String, TransferVolume)],
    st: &mut MigrationStatus,
    ev: &mut Vec<Event>,
    want: &mut Wants,
) -> Flow {
    let now = i.now;
    want.transfers = (
        Some(send(i, st, st.snapshot_round, true)),
        Some(receive(i, st, caps, true)),
    );
    if let Some(e) = target_error(i) {
        fail(e, now, ev, st);
        return Flow::Next;
    }
    if take_copy(i, st) {
        enter(st, Phase::Starting, now);
        condition(
            conditions::UNKNOWN,
            "Starting",
            &format!("the data is in {}: starting the workload there", st.target),
            now,
            st,
        );
        return Flow::Next;
    }
    if !i.target.serving {
        // The source stays fenced: with the target out of reach nobody can tell whether it
        // started, and two writers must never run.
        condition(
            conditions::UNKNOWN,
            "WaitingForTarget",
            &format!(
                "{} is unreachable; the workload stays stopped in {} until it answers",
                st.target, st.source
            ),
            now,
            st,
        );
    }
    Flow::Wait
}

/// Starting: the target runs the same ordinals on the copy; once it reports them healthy on
/// exactly the fenced data, the switch. One that does not in time fails the move.
fn starting(
    i: &Input<'_>,
    caps: &[(String, TransferVolume)],
    st: &mut MigrationStatus,
    ev: &mut Vec<Event>,
    want: &mut Wants,
) -> Flow {
    let now = i.now;
    // The copy is in and the workload applied: its Work keeps the last receive (without
    // holding: nothing waits any more).
    if !st.started_empty && !st.standby_failover {
        want.transfers = (
            Some(send(i, st, st.snapshot_round, true)),
            Some(receive(i, st, caps, true)),
        );
    }
    if let Some(e) = target_error(i) {
        fail(e, now, ev, st);
        return Flow::Next;
    }
    // Waits on nothing but the target's own report of the workload running; one that never
    // comes fails the move after the start timeout like one that says it is not running.
    let timed_out = started(st, Phase::Starting)
        .is_some_and(|t| now.seconds_since(t) >= i.settings.start_timeout_seconds)
        && i.target.serving;
    let Some(m) = i
        .target
        .work
        .as_ref()
        .and_then(|w| w.workload.as_ref().filter(|_| w.current))
    else {
        if timed_out {
            fail(
                format!(
                    "{} did not report the workload within {}s",
                    st.target, i.settings.start_timeout_seconds
                ),
                now,
                ev,
                st,
            );
            return Flow::Next;
        }
        return Flow::Wait;
    };
    let (all_started, wrong) = started_versions(st, m);
    if let Some(e) = wrong {
        fail(e, now, ev, st);
        return Flow::Next;
    }
    if m.health == Health::Healthy && all_started {
        let downtime = st.fenced_at.map(|f| now.millis_since(f) as f64 / 1000.0);
        st.downtime_seconds = downtime;
        enter(st, Phase::Switching, now);
        condition(
            conditions::UNKNOWN,
            "Switching",
            &format!(
                "running in {} on the copied data; what follows it moves there",
                st.target
            ),
            now,
            st,
        );
        ev.push(Event {
            type_: "Normal",
            reason: "MigrationSwitched",
            message: format!(
                "{} runs in {} (down {:.1}s)",
                i.workload,
                st.target,
                downtime.unwrap_or_default()
            ),
        });
        return Flow::Next;
    }
    if timed_out {
        fail(
            format!(
                "{} did not run the workload within {}s: {}",
                st.target, i.settings.start_timeout_seconds, m.message
            ),
            now,
            ev,
            st,
        );
        return Flow::Next;
    }
    Flow::Wait
}

/// Takes in the data version each moved volume started on at the target, as `m` reports
/// it: whether every one has started, and why one must not run if it started on other
/// data than was fenced at the source.
fn started_versions(st: &mut MigrationStatus, m: &ManifestStatus) -> (bool, Option<String>) {
    // Every moved volume must run on exactly the data fenced at the source.
    let mut wrong = None;
    let mut all_started = true;
    for v in st.volumes.iter_mut() {
        match m
            .volumes
            .iter()
            .find(|x| x.name == v.name)
            .and_then(|x| x.started_version)
        {
            Some(s) => {
                v.started_version = Some(s);
                if !st.started_empty && Some(s) != v.fenced_version {
                    wrong = Some(format!(
                        "{} started on data version {s}, not the fenced {}",
                        v.name,
                        v.fenced_version.unwrap_or_default()
                    ));
                }
            }
            None => all_started = false,
        }
    }
    (all_started, wrong)
}

/// Switching: what follows the workload (followers, Services) moves to the target; once it
/// serves there, or after the switch timeout, or when the Migration is deleted, cleaning.
fn switching(i: &Input<'_>, st: &mut MigrationStatus, ev: &mut Vec<Event>) -> Flow {
    let now = i.now;
    let waited = started(st, Phase::Switching)
        .is_some_and(|t| now.seconds_since(t) >= i.settings.switch_timeout_seconds);
    if i.switch_waits.is_empty() || waited || i.deleting {
        enter(st, Phase::Cleaning, now);
        let mut msg = format!(
            "the copy in {} and its volumes go in {}s",
            st.source, i.settings.cleanup_grace_seconds
        );
        if !i.switch_waits.is_empty() && !i.deleting {
            msg.push_str(&format!(
                "; {} still not serving in {} after {}s (give its policy followUp to {}, or admit {})",
                i.switch_waits.join(", "),
                st.target,
                i.settings.switch_timeout_seconds,
                i.workload,
                st.target
            ));
            ev.push(Event {
                type_: "Warning",
                reason: "MigrationSwitchIncomplete",
                message: msg.clone(),
            });
        }
        condition(conditions::UNKNOWN, "Cleaning", &msg, now, st);
        return Flow::Next;
    }
    // Say what the switch waits for (once it changes: the status is level-based).
    let msg = format!(
        "running in {} on the copied data; waiting for {} to serve there",
        st.target,
        i.switch_waits.join(", ")
    );
    condition(conditions::UNKNOWN, "Switching", &msg, now, st);
    Flow::Wait
}

/// Cleaning: after the grace (at once when deleted) the source's copy and its volumes go;
/// once its Work is gone, the move has succeeded.
fn cleaning(
    i: &Input<'_>,
    st: &mut MigrationStatus,
    ev: &mut Vec<Event>,
    want: &mut Wants,
) -> Flow {
    let now = i.now;
    let due = started(st, Phase::Cleaning)
        .is_some_and(|c| i.deleting || now.seconds_since(c) >= i.settings.cleanup_grace_seconds);
    // Once the source's Work is gone (with its volumes), nothing is left to do.
    if due && i.source.work.is_none() {
        enter(st, Phase::Succeeded, now);
        st.completion_time = Some(now.time());
        let msg = format!(
            "moved to {} in {} round(s), {} bytes copied, down {:.1}s",
            st.target,
            st.rounds,
            st.volumes.iter().map(|v| v.copied).sum::<i64>(),
            st.downtime_seconds.unwrap_or_default()
        );
        condition(conditions::TRUE, "Succeeded", &msg, now, st);
        ev.push(Event {
            type_: "Normal",
            reason: "Migrated",
            message: msg,
        });
        want.release = true;
    }
    Flow::Wait
}

/// Failed: rolled back, the workload runs at the source again. A target that may have
/// started is fenced until its member confirms that nothing runs there; until then the
/// source stays fenced too (a target out of reach, or one whose member does not answer, may
/// still run it: two writers must never run).
fn failed(i: &Input<'_>, st: &mut MigrationStatus, want: &mut Wants) -> Flow {
    let had_workload = st
        .phases
        .iter()
        .any(|p| p.phase >= Phase::FinalSync && p.phase < Phase::Failed);
    let confirmed = !had_workload
        || match i.target.work.as_ref() {
            // Its Work is gone (the cluster was removed): nothing is asked there.
            None => true,
            // The member applied the fence and reads back no pods: a status it could not
            // read (an outage) confirms nothing.
            Some(w) => {
                i.target.serving
                    && w.current
                    && w.error.is_none()
                    && w.workload.as_ref().is_some_and(|m| {
                        m.applied
                            && m.status
                                .as_ref()
                                .and_then(|s| s.get("replicas"))
                                .and_then(serde_json::Value::as_i64)
                                == Some(0)
                    })
            }
        };
    want.fence_target = had_workload && !confirmed;
    want.release = !want.fence_target;
    const HELD: &str = "; the workload stays stopped in ";
    let base = st.message.split(HELD).next().unwrap_or("").to_string();
    st.message = if want.fence_target {
        format!(
            "{base}{HELD}{} until {} confirms it runs nothing there",
            st.source, st.target
        )
    } else {
        base
    };
    Flow::Wait
}

/// The binding as the phase the step stopped in wants it; a failed move puts the workload
/// back where it was.
fn next_binding(
    i: &Input<'_>,
    spec: &BindingSpec,
    st: &MigrationStatus,
    want: Wants,
) -> BindingSpec {
    let mut next = overlay(i, spec, st, want.transfers, want.fence_target, want.release);
    // A failed move puts the workload back where it was.
    if st.phase == Phase::Failed {
        next.clusters.retain(|c| c.name != st.target);
        if !next.clusters.iter().any(|c| c.name == st.source) {
            next.clusters.push(TargetCluster {
                name: st.source.clone(),
                replicas: st.replicas,
            });
            next.clusters.sort_by(|x, y| x.name.cmp(&y.name));
        }
    }
    next
}

/// Why the target's Work is not applied, if it is not (a storage class it lacks...).
fn target_error(i: &Input<'_>) -> Option<String> {
    let w = i.target.work.as_ref()?;
    if let Some(e) = &w.error {
        return Some(format!("the target cannot take the workload: {e}"));
    }
    let t = w.transfer.as_ref()?;
    (!t.message.is_empty() && !t.complete).then(|| format!("the copy failed: {}", t.message))
}

/// Why the source cannot take the snapshot the round needs, if it says so (a member with no
/// data mover, a snapshot or backup that failed).
fn source_error(i: &Input<'_>, st: &MigrationStatus) -> Option<String> {
    let t = i.source.work.as_ref()?.transfer.as_ref()?;
    (!t.message.is_empty() && !t.complete)
        .then(|| format!("the snapshot at {} failed: {}", st.source, t.message))
}

/// The volumes the binding's template owns for the ordinals that move (a StatefulSet's claim
/// templates, `<claim>-<name>-<ordinal>`; claims the pods mount by name) that `reported`
/// does not hold.
fn unreported_volumes(i: &Input<'_>, reported: &[VolumeStatus], replicas: i64) -> Vec<String> {
    let Some(binding) = i.binding else {
        return Vec::new();
    };
    let name = i.workload.rsplit_once('/').map_or(i.workload, |(_, n)| n);
    binding
        .volumes
        .iter()
        .flat_map(|c| {
            if c.per_ordinal {
                (0..replicas)
                    .map(|o| ordinal_volume(&c.name, name, o))
                    .collect::<Vec<_>>()
            } else {
                vec![c.name.clone()]
            }
        })
        .filter(|v| !reported.iter().any(|r| &r.name == v))
        .collect()
}

/// The source is lost: fail over to the standby copy if the target keeps one, start empty
/// elsewhere if the placement says so, else wait for it. Returns whether the phase changed.
fn unplanned(i: &Input<'_>, st: &mut MigrationStatus, ev: &mut Vec<Event>) -> bool {
    let now = i.now;
    if let Some(sb) = i
        .standby
        .filter(|s| s.cluster == st.target && s.rounds >= 1)
        && i.target.serving
    {
        // What was written after the last round the standby holds is lost.
        let lost: i64 = sb
            .volumes
            .iter()
            .map(|v| {
                let last = i
                    .source_written
                    .iter()
                    .find(|(n, _)| *n == v.name)
                    .map_or(v.synced_written, |(_, w)| *w);
                (last - v.synced_written).max(0)
            })
            .sum();
        let seconds = match (i.source_last_heard, sb.synced_at) {
            (Some(heard), Some(synced)) => {
                Some((heard.millis_since(synced) as f64 / 1000.0).max(0.0))
            }
            _ => None,
        };
        st.volumes = sb
            .volumes
            .iter()
            .map(|v| MigrationVolume {
                name: v.name.clone(),
                ordinal: v.ordinal,
                bytes: v.snapshot_used,
                target_version: v.synced_version,
                source_version: v.synced_version,
                fenced_version: Some(v.synced_version),
                ..Default::default()
            })
            .collect();
        st.rounds = sb.rounds;
        st.data_loss = Some(DataLoss {
            bytes: lost,
            seconds,
        });
        st.fenced_at = Some(now);
        st.standby_failover = true;
        enter(st, Phase::Starting, now);
        let msg = format!(
            "{} is lost: starting in {} on its standby copy ({} bytes written in the last {:.1}s before it was lost are not in it)",
            st.source,
            st.target,
            lost,
            seconds.unwrap_or_default()
        );
        condition(conditions::UNKNOWN, "FailingOver", &msg, now, st);
        ev.push(Event {
            type_: "Warning",
            reason: "FailedOver",
            message: msg,
        });
        return true;
    }
    if i.starts_empty && i.target.serving {
        let lost: i64 = i
            .source
            .work
            .as_ref()
            .and_then(|w| w.workload.as_ref())
            .map(|m| m.volumes.iter().map(|v| v.used_bytes).sum())
            .unwrap_or_else(|| st.volumes.iter().map(|v| v.bytes).sum());
        st.started_empty = true;
        st.data_loss = Some(DataLoss {
            bytes: lost,
            seconds: None,
        });
        st.fenced_at = Some(now);
        // Nothing of the source's data reaches the target.
        for v in st.volumes.iter_mut() {
            v.round_bytes = 0;
        }
        enter(st, Phase::Starting, now);
        let msg = format!(
            "{} is lost and the placement says StartEmpty: starting in {} without its data ({lost} bytes lost)",
            st.source, st.target
        );
        condition(conditions::UNKNOWN, "StartingEmpty", &msg, now, st);
        ev.push(Event {
            type_: "Warning",
            reason: "DataLost",
            message: msg,
        });
        return true;
    }
    condition(
        conditions::UNKNOWN,
        "WaitingForSource",
        &format!(
            "{} is unreachable and no standby copy exists: waiting for it to come back (placement.stateful.onDataLoss: StartEmpty would start {} elsewhere without its data)",
            st.source, i.workload
        ),
        now,
        st,
    );
    false
}

#[cfg(test)]
mod tests;
