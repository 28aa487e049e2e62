use super::*;
use orrery_api::stateful::{TransferVolumeStatus, VolumeStatus};
use serde_json::json;

/// Two members as the plan sees them: what each reports, driven by the binding it writes.
struct Fleet {
    /// The source's volume: (version, used bytes, bytes written since its last snapshot).
    src_version: u64,
    src_used: i64,
    written_since: i64,
    /// What the target holds.
    tgt_version: u64,
    /// Rounds the target copies in one step (0: copies do not finish).
    copy_speed: u32,
    copy_progress: u32,
    /// Snapshots taken, by round.
    last_snapshot: Option<TransferStatus>,
    target_started_on: Option<u64>,
    target_serving: bool,
    source_serving: bool,
    source_work: bool,
    /// Whether the target's pods ever start.
    target_starts: bool,
    /// Whether the target's member reports the workload at all once it is applied.
    target_reports: bool,
    /// Every byte the source wrote.
    src_written: i64,
    /// The source cannot take snapshots: its transfer says why.
    snapshot_error: Option<String>,
    /// The target's member refuses the Work: its Work says why.
    target_error: Option<String>,
    /// The target's member does not answer its agent (which still heartbeats): its Work
    /// reports the workload neither applied nor read, with no refusal.
    target_unreadable: bool,
    /// The source reports its workload without its volumes (not read yet, say after an
    /// outage of its member).
    source_volumes_unread: bool,
}

fn base_spec() -> BindingSpec {
    serde_json::from_value(json!({
        "resource": {"apiVersion": "apps/v1", "kind": "StatefulSet", "namespace": "ns", "name": "db"},
        "policy": {"apiVersion": "multicluster.io/v1alpha1", "kind": "ResourcePlacementPolicy", "name": "p"},
        "replicas": 1,
        "clusters": [{"name": "a", "replicas": 1}],
        "volumes": [{"name": "data", "perOrdinal": true}],
        "migration": "db-1",
    }))
    .unwrap()
}

fn started_status() -> MigrationStatus {
    MigrationStatus {
        source: "a".into(),
        target: "b".into(),
        replicas: 1,
        binding: "db-statefulset".into(),
        ..Default::default()
    }
}

fn t(s: i64) -> MicroTime {
    orrery_api::Time::from_unix_seconds(1_700_000_000 + s)
        .unwrap()
        .into()
}

impl Fleet {
    fn new() -> Fleet {
        Fleet {
            src_version: 10,
            src_used: 1000,
            written_since: 0,
            tgt_version: 0,
            copy_speed: 1,
            copy_progress: 0,
            last_snapshot: None,
            target_started_on: None,
            target_serving: true,
            source_serving: true,
            source_work: true,
            target_starts: true,
            target_reports: true,
            src_written: 1000,
            snapshot_error: None,
            target_error: None,
            target_unreadable: false,
            source_volumes_unread: false,
        }
    }

    /// The source writes `bytes` between two steps.
    fn write(&mut self, bytes: i64) {
        self.src_written += bytes;
        self.src_version += 1;
        self.src_used += bytes;
        self.written_since += bytes;
    }

    fn transfer_of<'a>(spec: &'a BindingSpec, cluster: &str) -> Option<&'a Transfer> {
        spec.transfers
            .iter()
            .find(|x| x.cluster == cluster)
            .map(|x| &x.transfer)
    }

    /// What each member reports now, after acting on `spec`.
    fn report(&mut self, spec: &BindingSpec) -> (End, End) {
        let fenced = spec.fenced.contains(&"a".to_string());
        // The source: a snapshot for each round asked (after the fence only once fenced).
        let mut src_transfer = self.last_snapshot.clone();
        if let Some(x) = Self::transfer_of(spec, "a")
            && self
                .last_snapshot
                .as_ref()
                .is_none_or(|s| s.round < x.round)
            && (!x.after_fence || fenced)
        {
            let first = self.last_snapshot.is_none();
            let snap = TransferStatus {
                id: x.id.clone(),
                role: TransferRole::Send,
                round: x.round,
                complete: true,
                fenced,
                volumes: vec![TransferVolumeStatus {
                    name: "data-db-0".into(),
                    data_version: self.src_version,
                    used_bytes: self.src_used,
                    bytes: if first {
                        self.src_used
                    } else {
                        self.written_since
                    },
                    copied: 0,
                    written_bytes: self.src_written,
                }],
                ..Default::default()
            };
            self.written_since = 0;
            self.last_snapshot = Some(snap.clone());
            src_transfer = Some(snap);
        }
        let workload = |started: Option<u64>, version: u64, replicas: i64| ManifestStatus {
            applied: true,
            health: if replicas > 0 && started.is_some() {
                Health::Healthy
            } else {
                Health::Progressing
            },
            status: Some(json!({"replicas": replicas})),
            volumes: vec![VolumeStatus {
                name: "data-db-0".into(),
                ordinal: Some(0),
                used_bytes: 1000,
                data_version: version,
                started_version: started,
                ..Default::default()
            }],
            ..Default::default()
        };
        if let (Some(e), Some(x)) = (&self.snapshot_error, Self::transfer_of(spec, "a"))
            && (!x.after_fence || fenced)
        {
            src_transfer = Some(TransferStatus {
                id: x.id.clone(),
                role: TransferRole::Send,
                round: x.round,
                fenced,
                message: e.clone(),
                ..Default::default()
            });
        }
        let src_running = spec.clusters.iter().any(|c| c.name == "a") && !fenced;
        let source = End {
            serving: self.source_serving,
            work: self.source_work.then(|| WorkSeen {
                current: true,
                transfer: src_transfer,
                workload: Some({
                    let mut w = workload(
                        src_running.then_some(10),
                        self.src_version,
                        i64::from(src_running),
                    );
                    if self.source_volumes_unread {
                        w.volumes.clear();
                    }
                    w
                }),
                error: None,
            }),
        };
        // The target: copies each round asked; runs the workload once it is in, if held.
        let recv = Self::transfer_of(spec, "b");
        let in_plan = spec.clusters.iter().any(|c| c.name == "b");
        let target_fenced = spec.fenced.contains(&"b".to_string());
        let mut tgt_transfer = None;
        if let Some(x) = recv {
            let done = self.copy_speed > 0 && {
                self.copy_progress += 1;
                self.copy_progress >= self.copy_speed
            };
            if done {
                self.tgt_version = x.volumes[0].data_version;
                self.copy_progress = 0;
            }
            tgt_transfer = Some(TransferStatus {
                id: x.id.clone(),
                role: TransferRole::Receive,
                round: x.round,
                complete: done,
                volumes: vec![TransferVolumeStatus {
                    name: "data-db-0".into(),
                    data_version: self.tgt_version,
                    used_bytes: x.volumes[0].used_bytes,
                    bytes: x.volumes[0].bytes,
                    copied: if done { x.volumes[0].bytes } else { 0 },
                    written_bytes: 0,
                }],
                ..Default::default()
            });
            if done
                && x.hold_workload
                && in_plan
                && self.target_started_on.is_none()
                && self.target_starts
            {
                self.target_started_on = Some(self.tgt_version);
            }
        }
        if in_plan && recv.is_none() && self.target_started_on.is_none() {
            // Started without a copy: on what it holds (a standby's data, or nothing).
            self.target_started_on = Some(self.tgt_version);
        }
        let target = End {
            serving: self.target_serving,
            work: (recv.is_some() || in_plan || target_fenced).then(|| WorkSeen {
                current: true,
                transfer: tgt_transfer,
                workload: ((in_plan && self.target_reports) || target_fenced).then(|| {
                    let running = in_plan && !target_fenced;
                    if self.target_unreadable {
                        return ManifestStatus {
                            message: "the member cluster is unavailable".into(),
                            ..Default::default()
                        };
                    }
                    workload(
                        self.target_started_on.filter(|_| running),
                        self.tgt_version,
                        i64::from(running && self.target_started_on.is_some()),
                    )
                }),
                error: self.target_error.clone(),
            }),
        };
        (source, target)
    }
}

struct Run {
    fleet: Fleet,
    spec: BindingSpec,
    status: MigrationStatus,
    settings: Settings,
    now: i64,
    events: Vec<Event>,
    deleting: bool,
    starts_empty: bool,
    standby: Option<StandbyStatus>,
    heard_at: i64,
    /// What does not serve at the target yet, as the controller would find it.
    waits: Vec<String>,
    budget: Option<FenceBudget>,
}

impl Run {
    fn new() -> Run {
        Run {
            fleet: Fleet::new(),
            spec: base_spec(),
            status: started_status(),
            settings: Settings::default(),
            now: 0,
            events: Vec::new(),
            deleting: false,
            starts_empty: false,
            standby: None,
            heard_at: 0,
            waits: Vec::new(),
            budget: None,
        }
    }

    /// One step of the controller, one second later; what it writes is what the members see.
    fn step(&mut self) -> bool {
        self.now += 1;
        let (source, target) = self.fleet.report(&self.spec);
        let input = Input {
            now: t(self.now),
            name: "db-1",
            id: "uid-1",
            namespace: "ns",
            workload: "StatefulSet/db",
            deleting: self.deleting,
            status: &self.status,
            binding: Some(&self.spec),
            source: source.clone(),
            target: target.clone(),
            rate: 100,
            switch_waits: self.waits.clone(),
            starts_empty: self.starts_empty,
            standby: self.standby.as_ref(),
            source_written: vec![("data-db-0".to_string(), self.fleet.src_written)],
            source_last_heard: Some(t(self.heard_at)),
            budget: self.budget,
            settings: &self.settings,
        };
        let out = step(&input);
        // A restart right after computes the same again from what is stored.
        let stored_spec = out.binding.clone().unwrap_or_else(|| self.spec.clone());
        let again = step(&Input {
            status: &out.status,
            binding: Some(&stored_spec),
            ..input
        });
        if let Some(b) = &again.binding {
            panic!(
                "a second look changes the binding again:\n{}\n{}\nphases {:?} then {:?}",
                serde_json::to_string(&stored_spec).unwrap(),
                serde_json::to_string(b).unwrap(),
                out.status.phase,
                again.status.phase
            );
        }
        let changed = out.binding.is_some() || out.status != self.status;
        if let Some(b) = out.binding {
            self.spec = b;
        }
        self.status = out.status;
        self.events.extend(out.events);
        changed
    }

    /// Steps until `phase` is reached or passed (several may pass in one step).
    fn until(&mut self, phase: Phase, max: usize) {
        for _ in 0..max {
            if self.status.phase >= phase && self.status.phase != Phase::Failed {
                return;
            }
            self.step();
        }
        panic!("not {phase:?} after {max} steps: {:?}", self.status);
    }
}

#[test]
fn a_planned_move_copies_in_rounds_fences_and_starts_on_the_fenced_data() {
    let mut r = Run::new();
    r.fleet.copy_speed = 3;
    r.step();
    assert_eq!(r.status.phase, Phase::Replicating);
    assert_eq!(r.status.volumes.len(), 1);
    // Round 1: a snapshot of everything at the source, then the copy to the target.
    let send = Fleet::transfer_of(&r.spec, "a").unwrap().clone();
    assert_eq!(
        (send.role, send.round, send.after_fence),
        (TransferRole::Send, 1, false)
    );
    assert!(
        Fleet::transfer_of(&r.spec, "b").is_none(),
        "no copy before the snapshot"
    );
    r.step();
    let recv = Fleet::transfer_of(&r.spec, "b").unwrap().clone();
    assert_eq!(
        (
            recv.round,
            recv.volumes[0].bytes,
            recv.volumes[0].base_version
        ),
        (1, 1000, 0)
    );
    assert_eq!(recv.rate, 100);
    assert!(r.spec.fenced.is_empty(), "it runs while copied");
    // 10 s at 100 bytes/s: not short enough; the workload writes meanwhile.
    r.fleet.write(40);
    r.until(Phase::Replicating, 1);
    for _ in 0..3 {
        r.step();
    }
    assert_eq!(r.status.rounds, 1);
    // Round 2: only what was written (40 bytes, 0.4 s): the last before the fence.
    r.until(Phase::Fencing, 10);
    assert_eq!(r.status.rounds, 2);
    let v = &r.status.volumes[0];
    assert_eq!((v.copied, v.round_bytes, v.round_base), (1040, 40, 10));
    assert_eq!(r.spec.fenced, vec!["a".to_string()]);
    let send = Fleet::transfer_of(&r.spec, "a").unwrap();
    assert!(send.after_fence && send.round == 3);
    assert!(r.status.fenced_at.is_some());
    // The last write before the pods stop.
    r.fleet.write(5);
    r.until(Phase::FinalSync, 3);
    let fenced = r.status.volumes[0].fenced_version.unwrap();
    assert_eq!(fenced, r.fleet.src_version);
    // The target now runs it, holding the workload until the last copy is in; the source's
    // copy is kept (fenced) by an eviction until the migration lets it go.
    assert_eq!(
        r.spec.clusters,
        vec![TargetCluster {
            name: "b".into(),
            replicas: 1
        }]
    );
    let recv = Fleet::transfer_of(&r.spec, "b").unwrap();
    assert!(recv.hold_workload && recv.round == 3 && recv.volumes[0].bytes == 5);
    assert!(r.spec.evictions.iter().any(|e| e.cluster == "a" && e.keep));
    r.until(Phase::Switching, 10);
    assert_eq!(r.status.volumes[0].started_version, Some(fenced));
    assert!(r.status.downtime_seconds.unwrap() > 0.0);
    assert!(r.spec.transfers.is_empty(), "the copy is done");
    r.until(Phase::Cleaning, 3);
    // The source's copy stays for the grace period, then goes.
    r.step();
    assert!(r.spec.fenced.contains(&"a".to_string()));
    r.now += r.settings.cleanup_grace_seconds;
    r.step();
    assert!(r.spec.fenced.is_empty() && r.spec.evictions.is_empty());
    assert_eq!(
        r.status.phase,
        Phase::Cleaning,
        "until the source's Work is gone"
    );
    r.fleet.source_work = false;
    r.step();
    assert_eq!(r.status.phase, Phase::Succeeded);
    assert!(r.spec.migration.is_empty(), "the binding is let go");
    assert_eq!(
        r.spec.clusters,
        vec![TargetCluster {
            name: "b".into(),
            replicas: 1
        }]
    );
    let phases: Vec<Phase> = r.status.phases.iter().map(|p| p.phase).collect();
    use Phase::*;
    assert_eq!(
        phases,
        [
            Pending,
            Replicating,
            Fencing,
            FinalSync,
            Starting,
            Switching,
            Cleaning
        ]
    );
    assert!(r.status.phases.iter().all(|p| p.duration_ms.is_some()));
    let reasons: Vec<&str> = r.events.iter().map(|e| e.reason).collect();
    assert_eq!(reasons, ["Replicating", "MigrationSwitched", "Migrated"]);
    assert_eq!(
        conditions::find(&r.status.conditions, CONDITION)
            .unwrap()
            .status,
        "True"
    );
}

#[test]
fn a_fence_that_would_break_the_disruption_budget_waits_copying_nothing_more() {
    let mut r = Run::new();
    // Three ready: two in the source, one elsewhere; two must stay ready.
    r.budget = Some(FenceBudget {
        min_available: 2,
        ready: 3,
        ready_at_source: 2,
    });
    r.until(Phase::Replicating, 2);
    for _ in 0..6 {
        r.step();
    }
    assert_eq!(r.status.phase, Phase::Replicating, "{:?}", r.status);
    let c = conditions::find(&r.status.conditions, CONDITION)
        .unwrap()
        .clone();
    assert_eq!(c.reason, BUDGET_WAITS, "{c:?}");
    assert!(
        c.message
            .contains("2 ready replica(s) in a would leave 1 ready")
            && c.message.contains("at least 2"),
        "{c:?}"
    );
    assert!(
        r.spec.fenced.is_empty(),
        "nothing stopped: {:?}",
        r.spec.fenced
    );
    // Waiting copies nothing more: the Works keep the last round, whatever is written.
    let rounds = r.status.rounds;
    let before = r.spec.transfers.clone();
    r.fleet.write(40);
    for _ in 0..5 {
        assert!(!r.step(), "a waiting move writes nothing");
    }
    assert_eq!((r.status.rounds, &r.spec.transfers), (rounds, &before));
    let waits = r
        .events
        .iter()
        .filter(|e| e.reason == "MigrationWaits")
        .count();
    assert_eq!(waits, 1, "said once: {:?}", r.events);
    // A replica ready elsewhere lets it go: one more round for the 40 bytes, then the fence.
    r.budget = Some(FenceBudget {
        min_available: 2,
        ready: 4,
        ready_at_source: 2,
    });
    r.until(Phase::Fencing, 10);
    assert_eq!(r.status.rounds, rounds + 1);
    assert_eq!(r.status.volumes[0].round_bytes, 40);
    r.until(Phase::Cleaning, 30);
    assert_eq!(r.fleet.target_started_on, Some(r.fleet.src_version));
}

#[test]
fn a_budget_the_fence_keeps_or_that_counts_nothing_ready_at_the_source_does_not_hold_it() {
    for budget in [
        FenceBudget {
            min_available: 2,
            ready: 4,
            ready_at_source: 2,
        },
        // Nothing ready at the source: the fence takes nothing down.
        FenceBudget {
            min_available: 2,
            ready: 1,
            ready_at_source: 0,
        },
    ] {
        let mut r = Run::new();
        r.budget = Some(budget);
        r.until(Phase::Fencing, 10);
        assert_eq!(r.status.phase, Phase::Fencing, "{budget:?}");
        assert!(!r.events.iter().any(|e| e.reason == "MigrationWaits"));
    }
}

#[test]
fn nothing_is_copied_before_the_source_reports_the_volumes_that_move() {
    let mut r = Run::new();
    r.fleet.source_volumes_unread = true;
    for _ in 0..5 {
        r.step();
    }
    assert_eq!(r.status.phase, Phase::Pending, "{:?}", r.status);
    assert!(r.spec.transfers.is_empty(), "{:?}", r.spec.transfers);
    let waiting = r
        .status
        .conditions
        .iter()
        .any(|c| c.reason == "WaitingForSource" && c.message.contains("data-db-0"));
    assert!(waiting, "{:?}", r.status.conditions);
    // Reported: the move goes on, and the target starts on the source's data.
    r.fleet.source_volumes_unread = false;
    r.until(Phase::Cleaning, 60);
    assert_eq!(r.fleet.target_started_on, Some(r.fleet.src_version));
    assert_eq!(r.status.volumes.len(), 1);
}

#[test]
fn writes_faster_than_the_path_fence_after_the_last_round_allowed() {
    let mut r = Run::new();
    r.settings.max_rounds = 3;
    r.fleet.src_used = 100_000;
    for _ in 0..40 {
        r.fleet.write(50_000);
        r.step();
        if r.status.phase == Phase::Fencing {
            break;
        }
    }
    assert_eq!((r.status.phase, r.status.rounds), (Phase::Fencing, 3));
}

#[test]
fn a_target_that_fails_to_start_rolls_back_and_the_source_runs_again() {
    let mut r = Run::new();
    // The target never runs the workload.
    r.fleet.target_starts = false;
    r.until(Phase::Starting, 20);
    r.step();
    assert_eq!(r.status.phase, Phase::Starting);
    r.now += r.settings.start_timeout_seconds;
    r.step();
    assert_eq!(r.status.phase, Phase::Failed);
    assert_eq!(
        r.spec.clusters,
        vec![TargetCluster {
            name: "a".into(),
            replicas: 1
        }]
    );
    assert!(
        !r.spec.fenced.contains(&"a".to_string()),
        "the source runs again"
    );
    assert!(r.spec.transfers.is_empty());
    // Let go once the target's copy is fenced (its member reports no pods).
    for _ in 0..3 {
        r.step();
    }
    assert!(
        r.spec.migration.is_empty() && r.spec.fenced.is_empty(),
        "{:?}",
        r.spec
    );
    assert_eq!(r.events.last().unwrap().reason, "MigrationFailed");
}

/// Starting waits on the target's report of the workload alone; one that never comes fails
/// the move after the start timeout, as one that says the workload does not run does.
#[test]
fn a_target_that_never_reports_its_workload_fails_the_move_after_the_start_timeout() {
    let mut r = Run::new();
    r.fleet.target_reports = false;
    r.until(Phase::Starting, 20);
    r.step();
    assert_eq!(r.status.phase, Phase::Starting);
    r.now += r.settings.start_timeout_seconds;
    r.step();
    assert_eq!(r.status.phase, Phase::Failed, "{:?}", r.status);
    assert!(
        r.events
            .iter()
            .any(|e| e.message.contains("did not report the workload within")),
        "{:?}",
        r.events
    );
}

#[test]
fn a_snapshot_the_source_cannot_take_fails_the_move_and_the_source_runs_on() {
    for fencing in [false, true] {
        let mut r = Run::new();
        if fencing {
            r.until(Phase::Fencing, 20);
        } else {
            r.until(Phase::Replicating, 5);
        }
        r.fleet.snapshot_error = Some("this member has no data mover".into());
        for _ in 0..3 {
            r.step();
        }
        assert_eq!(r.status.phase, Phase::Failed, "fencing: {fencing}");
        assert!(
            r.status
                .message
                .contains("the snapshot at a failed: this member has no data mover"),
            "{}",
            r.status.message
        );
        assert!(
            !r.spec.fenced.contains(&"a".to_string()),
            "the source runs again"
        );
        assert!(r.spec.transfers.is_empty());
    }
}

#[test]
fn a_failed_move_keeps_the_source_stopped_until_the_target_confirms_it_runs_nothing() {
    let mut r = Run::new();
    r.fleet.target_starts = false;
    r.until(Phase::Starting, 20);
    // The target started, then its member stopped answering.
    r.fleet.target_started_on = Some(r.fleet.tgt_version);
    r.fleet.target_error = Some("the member cluster is unavailable".into());
    r.fleet.target_serving = false;
    for _ in 0..5 {
        r.step();
        assert_eq!(r.status.phase, Phase::Failed);
        assert_eq!(
            r.spec.fenced,
            vec!["a".to_string(), "b".to_string()],
            "neither runs while b cannot say"
        );
        assert_eq!(r.spec.migration, "db-1", "not let go");
    }
    assert!(
        r.status
            .message
            .contains("stays stopped in a until b confirms"),
        "{}",
        r.status.message
    );
    // Back: b applies its fence and reports nothing running; then a runs again.
    r.fleet.target_serving = true;
    r.fleet.target_error = None;
    for _ in 0..3 {
        r.step();
    }
    assert!(r.spec.fenced.is_empty(), "{:?}", r.spec);
    assert!(r.spec.migration.is_empty());
    assert_eq!(
        r.spec.clusters,
        vec![TargetCluster {
            name: "a".into(),
            replicas: 1
        }]
    );
    assert!(
        !r.status.message.contains("stays stopped"),
        "{}",
        r.status.message
    );
}

#[test]
fn a_target_that_does_not_answer_neither_fails_the_move_nor_confirms_a_fence() {
    // Released at the target, whose member then stops answering: the move waits for it
    // (failing back would start the source while the target may run the workload).
    let mut r = Run::new();
    r.fleet.target_starts = false;
    r.until(Phase::Starting, 20);
    r.fleet.target_unreadable = true;
    r.fleet.target_started_on = Some(r.fleet.tgt_version);
    for _ in 0..5 {
        r.step();
        assert_eq!(r.status.phase, Phase::Starting);
        assert_eq!(r.spec.fenced, vec!["a".to_string()]);
        assert_eq!(r.spec.clusters[0].name, "b");
    }
    r.fleet.target_unreadable = false;
    r.until(Phase::Switching, 5);

    // A move the target refused: its fence holds until the target reads back no pods; a
    // status it could not read confirms nothing.
    let mut r = Run::new();
    r.fleet.target_starts = false;
    r.until(Phase::Starting, 20);
    r.fleet.target_started_on = Some(r.fleet.tgt_version);
    r.fleet.target_error = Some("no storage class fast".into());
    r.step();
    assert_eq!(r.status.phase, Phase::Failed);
    r.fleet.target_error = None;
    r.fleet.target_unreadable = true;
    for _ in 0..5 {
        r.step();
        assert_eq!(r.spec.fenced, vec!["a".to_string(), "b".to_string()]);
        assert_eq!(r.spec.migration, "db-1", "not let go");
    }
    r.fleet.target_unreadable = false;
    r.step();
    assert!(r.spec.fenced.is_empty(), "{:?}", r.spec);
    assert_eq!(r.spec.clusters[0].name, "a");
}

#[test]
fn a_lost_source_waits_unless_the_placement_starts_empty_and_a_lost_target_keeps_the_fence() {
    let mut r = Run::new();
    r.fleet.source_serving = false;
    r.step();
    assert_eq!(r.status.phase, Phase::Pending);
    assert!(
        r.status
            .message
            .contains("a is unreachable and no standby copy exists"),
        "{}",
        r.status.message
    );
    assert!(r.spec.fenced.is_empty());

    let mut r = Run::new();
    r.starts_empty = true;
    r.fleet.source_serving = false;
    r.until(Phase::Cleaning, 5);
    assert!(r.status.started_empty);
    assert_eq!(r.status.data_loss.as_ref().unwrap().bytes, 1000);
    assert_eq!(
        r.spec.fenced,
        vec!["a".to_string()],
        "fenced for when it comes back"
    );
    assert!(r.spec.transfers.is_empty());

    // The target goes dark after the fence: the source stays fenced, the move waits.
    let mut r = Run::new();
    r.until(Phase::FinalSync, 10);
    r.fleet.target_serving = false;
    r.fleet.copy_speed = 0;
    for _ in 0..5 {
        r.step();
    }
    assert_eq!(r.status.phase, Phase::FinalSync);
    assert!(r.spec.fenced.contains(&"a".to_string()));
    assert!(
        r.status.message.contains("b is unreachable"),
        "{}",
        r.status.message
    );
}

/// A source that stops serving for a while during the copy (a missed heartbeat, a restart of
/// the control plane) takes nothing from the target: its round stays in its Work, so it goes
/// on where it was instead of starting again.
#[test]
fn a_source_away_for_a_while_leaves_the_targets_round_in_place() {
    let mut r = Run::new();
    r.fleet.copy_speed = 0;
    for _ in 0..20 {
        r.step();
        if Fleet::transfer_of(&r.spec, "b").is_some() {
            break;
        }
    }
    let before = Fleet::transfer_of(&r.spec, "b")
        .cloned()
        .expect("the target copies a round");
    assert_eq!(r.status.phase, Phase::Replicating);
    r.fleet.source_serving = false;
    r.step();
    assert_eq!(r.status.phase, Phase::Replicating);
    assert_eq!(
        Fleet::transfer_of(&r.spec, "b"),
        Some(&before),
        "the target's round is kept while the source is away"
    );
    r.fleet.source_serving = true;
    r.fleet.copy_speed = 1;
    r.until(Phase::Cleaning, 40);
    assert_eq!(r.status.rounds, 3, "no round was copied twice");
}

#[test]
fn deleting_a_migration_before_the_switch_calls_it_off() {
    let mut r = Run::new();
    r.until(Phase::Fencing, 10);
    r.deleting = true;
    r.step();
    assert_eq!(r.status.phase, Phase::Failed);
    assert!(r.spec.migration.is_empty());
    assert!(r.spec.fenced.is_empty() && r.spec.transfers.is_empty());
    assert_eq!(
        r.spec.clusters,
        vec![TargetCluster {
            name: "a".into(),
            replicas: 1
        }]
    );
}

#[test]
fn a_binding_that_names_another_migration_fails_this_one_untouched() {
    let mut r = Run::new();
    r.spec.migration = "db-2".into();
    let before = r.spec.clone();
    r.step();
    assert_eq!(r.status.phase, Phase::Failed);
    assert_eq!(r.spec, before);
}

#[test]
fn a_lost_source_fails_over_to_the_standby_and_reports_what_is_lost() {
    let mut r = Run::new();
    r.fleet.source_serving = false;
    // The standby holds version 9 of the volume, taken at second -4 when 900 bytes had
    // been written; the source was last heard at second 1 with 1000 written.
    r.fleet.tgt_version = 9;
    r.fleet.src_written = 1000;
    r.heard_at = 1;
    r.standby = Some(StandbyStatus {
        cluster: "b".into(),
        source: "a".into(),
        rounds: 3,
        synced_at: Some(t(-4)),
        volumes: vec![orrery_api::stateful::StandbyVolume {
            name: "data-db-0".into(),
            ordinal: Some(0),
            synced_version: 9,
            synced_written: 900,
            snapshot_version: 9,
            snapshot_used: 800,
            ..Default::default()
        }],
        ..Default::default()
    });
    r.until(Phase::Cleaning, 5);
    assert!(r.status.standby_failover && !r.status.started_empty);
    let loss = r.status.data_loss.clone().unwrap();
    assert_eq!((loss.bytes, loss.seconds), (100, Some(5.0)));
    assert_eq!(r.status.volumes[0].started_version, Some(9));
    assert_eq!(r.status.volumes[0].fenced_version, Some(9));
    assert!(
        r.spec.transfers.is_empty(),
        "nothing is copied: the data is there"
    );
    assert_eq!(
        r.spec.fenced,
        vec!["a".to_string()],
        "fenced for when it comes back"
    );
    assert!(r.events.iter().any(|e| e.reason == "FailedOver"));
    // A standby elsewhere than the target is no help: the move waits for the source.
    let mut r = Run::new();
    r.fleet.source_serving = false;
    r.standby = Some(StandbyStatus {
        cluster: "c".into(),
        rounds: 2,
        ..Default::default()
    });
    r.step();
    assert_eq!(r.status.phase, Phase::Pending);
}

#[test]
fn the_switch_waits_for_what_serves_the_workload_then_cleans_up_anyway() {
    let mut r = Run::new();
    r.fleet.copy_speed = 3;
    r.waits = vec!["Service db".to_string(), "Deployment api".to_string()];
    r.until(Phase::Switching, 40);
    let at = r.now;
    // Waiting, and saying for what.
    for _ in 0..10 {
        r.step();
    }
    assert_eq!(r.status.phase, Phase::Switching);
    assert!(
        r.status
            .message
            .contains("waiting for Service db, Deployment api"),
        "{}",
        r.status.message
    );
    // The follower moves; the Service never does: cleaning starts after the timeout, with a
    // warning naming it.
    r.waits = vec!["Service db".to_string()];
    r.until(Phase::Cleaning, 100);
    assert!(
        r.now - at >= r.settings.switch_timeout_seconds,
        "{}",
        r.now - at
    );
    assert!(
        r.events
            .iter()
            .any(|e| e.reason == "MigrationSwitchIncomplete" && e.message.contains("Service db")),
        "{:?}",
        r.events.iter().map(|e| e.reason).collect::<Vec<_>>()
    );
    // Nothing to wait for: straight on.
    let mut r = Run::new();
    r.fleet.copy_speed = 3;
    r.until(Phase::Switching, 40);
    r.step();
    assert!(r.status.phase >= Phase::Cleaning, "{:?}", r.status.phase);
}
