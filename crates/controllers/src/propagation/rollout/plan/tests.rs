#![allow(clippy::unwrap_used)]

use super::*;
use serde_json::json;

fn strategy(v: serde_json::Value) -> RolloutStrategy {
    serde_json::from_value(v).unwrap()
}

/// A simulated fleet: clusters with labels and levels; each runs what the status decided,
/// healthily unless its revision is bad.
struct Fleet {
    names: Vec<String>,
    labels: Vec<BTreeMap<String, String>>,
    levels: Vec<Option<f64>>,
    bad: BTreeSet<i64>,
    /// Restarts each revision's pods report (none: not counted).
    restarts: BTreeMap<i64, i64>,
    /// Whether members report at all (false: nothing is running what it was given yet).
    reporting: bool,
}

impl Fleet {
    fn new(spec: &[(&str, &str)]) -> Fleet {
        Fleet {
            names: spec.iter().map(|(n, _)| n.to_string()).collect(),
            labels: spec
                .iter()
                .map(|(_, ring)| BTreeMap::from([("ring".to_string(), ring.to_string())]))
                .collect(),
            levels: spec.iter().map(|_| Some(0.5)).collect(),
            bad: BTreeSet::new(),
            restarts: BTreeMap::new(),
            reporting: true,
        }
    }

    fn members<'a>(&'a self, st: Option<&RolloutStatus>) -> Vec<Member<'a>> {
        self.names
            .iter()
            .enumerate()
            .map(|(i, n)| Member {
                name: n,
                labels: &self.labels[i],
                level: self.levels[i],
                peak_time: None,
                runs: st
                    .filter(|_| self.reporting)
                    .and_then(|s| s.revision_of(n))
                    .map(|r| Running {
                        revision: r,
                        healthy: !self.bad.contains(&r),
                        restarts: self.restarts.get(&r).copied(),
                    }),
            })
            .collect()
    }
}

fn t(secs: i64) -> Time {
    Time::from_unix_seconds(1_800_000_000 + secs).unwrap()
}

fn go(
    s: &RolloutStrategy,
    f: &Fleet,
    old: Option<&RolloutStatus>,
    latest: i64,
    c: &Controls<'_>,
    at: i64,
) -> Step {
    step(s, old, latest, &f.members(old), c, t(at))
}

fn revisions(st: &RolloutStatus) -> Vec<(String, i64)> {
    st.clusters
        .iter()
        .map(|c| (c.name.clone(), c.revision))
        .collect()
}

fn at(st: &RolloutStatus, r: i64) -> Vec<String> {
    st.clusters
        .iter()
        .filter(|c| c.revision == r)
        .map(|c| c.name.clone())
        .collect()
}

fn rings() -> RolloutStrategy {
    strategy(json!({"stages": [
        {"name": "canary", "clusterSelector": {"matchLabels": {"ring": "canary"}}, "minSuccessTime": "60s"},
        {"name": "main", "clusterSelector": {"matchLabels": {"ring": "main"}}, "maxConcurrency": 1}
    ], "progressDeadline": "5m"}))
}

fn fleet() -> Fleet {
    Fleet::new(&[
        ("a", "canary"),
        ("b", "main"),
        ("c", "main"),
        ("d", "other"),
    ])
}

#[test]
fn the_first_placement_is_not_rolled_out() {
    let (s, f) = (rings(), fleet());
    let c = Controls::default();
    let st = go(&s, &f, None, 1, &c, 0).status;
    assert_eq!(st.phase, RolloutPhase::Complete);
    assert_eq!(at(&st, 1).len(), 4);
    // The same inputs again change nothing (a restart decides nothing new).
    let again = go(&s, &f, Some(&st), 1, &c, 10);
    assert_eq!(again.status, st);
    assert!(again.notes.is_empty());
    assert_eq!(again.after, None);
}

#[test]
fn stages_by_label_go_in_order_each_gated() {
    let (s, f) = (rings(), fleet());
    let c = Controls::default();
    let st = go(&s, &f, None, 1, &c, 0).status;
    // Revision 2: the canary first, the others keep revision 1.
    let st = go(&s, &f, Some(&st), 2, &c, 10).status;
    assert_eq!(st.phase, RolloutPhase::Progressing);
    assert_eq!(st.stage, "canary");
    assert_eq!(at(&st, 2), vec!["a"]);
    let d = st.clusters.iter().find(|c| c.name == "d").unwrap();
    assert_eq!(d.stage, REMAINING_STAGE);
    // Healthy, but not for a minute yet: nothing else moves.
    let st = go(&s, &f, Some(&st), 2, &c, 20).status;
    let st2 = go(&s, &f, Some(&st), 2, &c, 50).status;
    assert_eq!(at(&st2, 2), vec!["a"]);
    // A minute healthy: the canary passes, `main` starts one at a time.
    let st = go(&s, &f, Some(&st2), 2, &c, 80).status;
    assert_eq!(
        st.stage, "canary",
        "a soak of exactly its length is not over yet"
    );
    let st = go(&s, &f, Some(&st), 2, &c, 81).status;
    assert_eq!(st.stage, "main");
    assert_eq!(at(&st, 2), vec!["a", "b"]);
    let waiting = st.clusters.iter().find(|c| c.name == "c").unwrap();
    assert_eq!(waiting.state, ClusterState::Waiting);
    assert!(
        waiting.message.contains("maxConcurrency"),
        "{}",
        waiting.message
    );
    let st = go(&s, &f, Some(&st), 2, &c, 81).status;
    assert_eq!(at(&st, 2), vec!["a", "b", "c"]);
    assert_eq!(at(&st, 1), vec!["d"], "the last stage waits for `main`");
    // Then the clusters no stage selected, then complete.
    let mut st = st;
    for i in 0..4 {
        st = go(&s, &f, Some(&st), 2, &c, 83 + i).status;
    }
    assert_eq!(st.phase, RolloutPhase::Complete, "{st:?}");
    assert_eq!(st.stable, 2);
    assert_eq!(at(&st, 2).len(), 4);
    let names: Vec<&str> = st.stages.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["canary", "main", REMAINING_STAGE]);
    assert!(st.stages.iter().all(|s| s.state == StageState::Succeeded));
}

#[test]
fn a_bad_revision_halts_and_touches_no_later_stage() {
    let (s, mut f) = (rings(), fleet());
    f.bad.insert(2);
    let c = Controls::default();
    let st = go(&s, &f, None, 1, &c, 0).status;
    let mut st = go(&s, &f, Some(&st), 2, &c, 10).status;
    for i in 1..=30 {
        st = go(&s, &f, Some(&st), 2, &c, 10 + i * 10).status;
        assert_eq!(at(&st, 2), vec!["a"], "only the canary runs revision 2");
    }
    assert_eq!(st.phase, RolloutPhase::Halted);
    assert!(
        st.message.contains("halted in stage canary"),
        "{}",
        st.message
    );
    assert!(
        st.message
            .contains("a (not healthy at revision 2 within 5m)"),
        "{}",
        st.message
    );
    // Halted, nothing moves however long it waits.
    let later = go(&s, &f, Some(&st), 2, &c, 10_000);
    assert_eq!(revisions(&later.status), revisions(&st));
    assert_eq!(later.after, None);
    // Resumed: the failed cluster gets another deadline.
    let resume = Controls {
        resume: Some("r1"),
        ..Default::default()
    };
    let st = go(&s, &f, Some(&st), 2, &resume, 10_010).status;
    assert_eq!(st.phase, RolloutPhase::Progressing);
    assert_eq!(st.failures, 0);
    // Aborted: revision 1 everywhere again.
    let abort = Controls {
        resume: Some("r1"),
        abort: Some("x"),
        ..Default::default()
    };
    let st = go(&s, &f, Some(&st), 2, &abort, 10_020).status;
    assert_eq!(st.phase, RolloutPhase::Aborted);
    assert_eq!(at(&st, 1).len(), 4);
}

#[test]
fn restarts_beyond_the_count_fail_a_ready_cluster() {
    let mut s = rings();
    s.max_restarts = Some(2);
    let mut f = fleet();
    let c = Controls::default();
    let st = go(&s, &f, None, 1, &c, 0).status;
    // Revision 2 is ready but its pods restarted 3 times: the canary fails at once, well
    // before its soak or deadline, and the rollout halts there.
    f.restarts.insert(2, 3);
    let st = go(&s, &f, Some(&st), 2, &c, 10).status;
    let st = go(&s, &f, Some(&st), 2, &c, 20).status;
    assert_eq!(st.phase, RolloutPhase::Halted, "{st:?}");
    assert_eq!(at(&st, 2), vec!["a"]);
    let a = st.clusters.iter().find(|c| c.name == "a").unwrap();
    assert_eq!(a.state, ClusterState::Failed);
    assert!(a.message.contains("restarted 3 times"), "{}", a.message);
    // Within the count it passes as before.
    let mut f = fleet();
    f.restarts.insert(2, 2);
    let st = go(&s, &f, None, 1, &c, 0).status;
    let mut st = go(&s, &f, Some(&st), 2, &c, 10).status;
    for i in 1..=20 {
        st = go(&s, &f, Some(&st), 2, &c, 10 + i * 10).status;
    }
    assert_eq!(st.phase, RolloutPhase::Complete, "{st:?}");
}

#[test]
fn automatic_rollback_restores_the_stable_revision_at_once() {
    let mut s = rings();
    s.rollback = orrery_api::rollout::Rollback::Automatic;
    s.stages[0].max_concurrency = None;
    let mut f = Fleet::new(&[("a", "canary"), ("a2", "canary"), ("b", "main")]);
    f.bad.insert(2);
    let c = Controls::default();
    let st = go(&s, &f, None, 1, &c, 0).status;
    let st = go(&s, &f, Some(&st), 2, &c, 0).status;
    assert_eq!(at(&st, 2), vec!["a", "a2"]);
    let halted = go(&s, &f, Some(&st), 2, &c, 301);
    assert_eq!(halted.status.phase, RolloutPhase::RolledBack);
    assert_eq!(at(&halted.status, 1).len(), 3);
    assert!(halted.notes.iter().any(|n| n.reason == "RolloutHalted"));
    assert!(halted.notes.iter().any(|n| n.reason == "RolledBack"));
    // Over: nothing more to look at.
    assert_eq!(halted.after, None);
}

#[test]
fn max_failures_lets_a_stage_pass_with_failures() {
    let mut s = rings();
    s.max_failures = 1;
    let mut f = fleet();
    f.bad.insert(2);
    let c = Controls::default();
    let st = go(&s, &f, None, 1, &c, 0).status;
    let st = go(&s, &f, Some(&st), 2, &c, 0).status;
    let st = go(&s, &f, Some(&st), 2, &c, 300).status;
    // One failure is allowed: the canary failed, the next stage goes on.
    assert_eq!(st.failures, 1);
    assert_eq!(st.stage, "main");
    let st = go(&s, &f, Some(&st), 2, &c, 600).status;
    assert_eq!(st.phase, RolloutPhase::Halted);
    assert_eq!(at(&st, 2), vec!["a", "b"]);
}

#[test]
fn an_approval_gates_its_stage() {
    let mut s = rings();
    s.stages[1].approval = true;
    let f = fleet();
    let mut approved = BTreeSet::new();
    let st = {
        let c = Controls {
            approved: approved.clone(),
            ..Default::default()
        };
        let st = go(&s, &f, None, 1, &c, 0).status;
        let st = go(&s, &f, Some(&st), 2, &c, 0).status;
        let st = go(&s, &f, Some(&st), 2, &c, 1).status;
        let st = go(&s, &f, Some(&st), 2, &c, 100).status;
        assert_eq!(st.phase, RolloutPhase::WaitingForApproval);
        assert_eq!(st.stage, "main");
        assert_eq!(at(&st, 2), vec!["a"]);
        // An approval of another revision does not count.
        st
    };
    approved.insert((3, "main".to_string()));
    let c = Controls {
        approved: approved.clone(),
        ..Default::default()
    };
    let st = go(&s, &f, Some(&st), 2, &c, 200).status;
    assert_eq!(st.phase, RolloutPhase::WaitingForApproval);
    approved.insert((2, "main".to_string()));
    let c = Controls {
        approved: approved.clone(),
        ..Default::default()
    };
    let st = go(&s, &f, Some(&st), 2, &c, 201).status;
    assert_eq!(st.phase, RolloutPhase::Progressing);
    assert_eq!(at(&st, 2), vec!["a", "b"]);
}

#[test]
fn a_change_while_rolling_supersedes_it_from_the_first_stage() {
    let (s, f) = (rings(), fleet());
    let c = Controls::default();
    let st = go(&s, &f, None, 1, &c, 0).status;
    let st = go(&s, &f, Some(&st), 2, &c, 0).status;
    let st = go(&s, &f, Some(&st), 2, &c, 1).status;
    let st = go(&s, &f, Some(&st), 2, &c, 100).status;
    assert_eq!(at(&st, 2), vec!["a", "b"]);
    // Revision 3 while 2 is in stage `main`: what ran 2 takes 3; the rest keeps 1.
    let st = go(&s, &f, Some(&st), 3, &c, 101).status;
    assert_eq!(st.stable, 1);
    assert_eq!(at(&st, 3), vec!["a", "b"]);
    assert_eq!(at(&st, 1), vec!["c", "d"]);
    assert_eq!(st.stage, "canary");
    assert!(at(&st, 2).is_empty(), "at most two revisions");
}

#[test]
fn a_newcomer_takes_what_its_stage_has_reached() {
    let (s, mut f) = (rings(), fleet());
    let c = Controls::default();
    let st = go(&s, &f, None, 1, &c, 0).status;
    let st = go(&s, &f, Some(&st), 2, &c, 0).status;
    let st = go(&s, &f, Some(&st), 2, &c, 1).status;
    let st = go(&s, &f, Some(&st), 2, &c, 100).status;
    assert_eq!(st.stage, "main");
    // The canary's cluster failed over to another canary, and a main cluster was added.
    f.names[0] = "a-new".into();
    f.names.push("e".into());
    f.labels
        .push(BTreeMap::from([("ring".into(), "main".into())]));
    f.levels.push(Some(0.1));
    let st = go(&s, &f, Some(&st), 2, &c, 101).status;
    let of = |n: &str| st.clusters.iter().find(|c| c.name == n).unwrap().clone();
    assert_eq!(
        of("a-new").revision,
        2,
        "its stage is done: the new revision"
    );
    assert_eq!(of("a-new").stage, "canary");
    assert_eq!(of("e").stage, "main");
    assert!(st.clusters.iter().all(|c| c.name != "a"));
}

#[test]
fn the_least_loaded_go_first_and_a_level_holds_a_cluster() {
    let s = strategy(json!({"stages": [
        {"name": "all", "percent": 100, "maxConcurrency": 1, "waitForLevelBelow": 0.7}
    ]}));
    let mut f = Fleet::new(&[("hot", "x"), ("cool", "x"), ("warm", "x")]);
    f.levels = vec![Some(0.9), Some(0.2), Some(0.5)];
    let c = Controls::default();
    let st = go(&s, &f, None, 1, &c, 0).status;
    let st = go(&s, &f, Some(&st), 2, &c, 0).status;
    assert_eq!(at(&st, 2), vec!["cool"]);
    let st = go(&s, &f, Some(&st), 2, &c, 1).status;
    let st = go(&s, &f, Some(&st), 2, &c, 2).status;
    assert_eq!(at(&st, 2), vec!["cool", "warm"]);
    let mut st = st;
    for i in 3..10 {
        st = go(&s, &f, Some(&st), 2, &c, i).status;
    }
    let hot = st.clusters.iter().find(|c| c.name == "hot").unwrap();
    assert_eq!(hot.state, ClusterState::Waiting);
    assert!(
        hot.message.contains("0.90 is not below 0.70"),
        "{}",
        hot.message
    );
    assert_eq!(st.phase, RolloutPhase::Progressing);
    // Its load falls: it goes.
    f.levels[0] = Some(0.6);
    let st = go(&s, &f, Some(&st), 2, &c, 11).status;
    assert_eq!(at(&st, 2).len(), 3);
}

#[test]
fn percent_stages_take_their_share_least_loaded_first() {
    let s = strategy(json!({"stages": [
        {"name": "first", "percent": 25},
        {"name": "second", "percent": 50}
    ]}));
    let spec: Vec<(String, &str)> = (0..8).map(|i| (format!("c{i}"), "x")).collect();
    let refs: Vec<(&str, &str)> = spec.iter().map(|(n, r)| (n.as_str(), *r)).collect();
    let mut f = Fleet::new(&refs);
    f.levels = (0..8).map(|i| Some(0.9 - i as f64 * 0.1)).collect();
    let c = Controls::default();
    let st = go(&s, &f, None, 1, &c, 0).status;
    let st = go(&s, &f, Some(&st), 2, &c, 0).status;
    let stage = |n: &str| {
        st.clusters
            .iter()
            .find(|c| c.name == n)
            .unwrap()
            .stage
            .clone()
    };
    assert_eq!(stage("c7"), "first");
    assert_eq!(stage("c6"), "first");
    assert_eq!(stage("c5"), "second");
    assert_eq!(stage("c2"), "second");
    assert_eq!(stage("c1"), REMAINING_STAGE);
    assert_eq!(at(&st, 2), vec!["c6", "c7"]);
}

#[test]
fn paused_updates_no_further_cluster() {
    let (s, f) = (rings(), fleet());
    let c = Controls::default();
    let paused = Controls {
        paused: true,
        ..Default::default()
    };
    let st = go(&s, &f, None, 1, &c, 0).status;
    let st = go(&s, &f, Some(&st), 2, &c, 0).status;
    let mut p = st.clone();
    for i in 1..10 {
        p = go(&s, &f, Some(&p), 2, &paused, i * 60).status;
    }
    assert_eq!(p.phase, RolloutPhase::Paused);
    assert_eq!(at(&p, 2), vec!["a"]);
    let st = go(&s, &f, Some(&p), 2, &c, 601).status;
    assert_eq!(st.phase, RolloutPhase::Progressing);
    assert_eq!(at(&st, 2), vec!["a", "b"]);
}

#[test]
fn an_unreported_update_counts_against_its_deadline_only() {
    let (s, mut f) = (rings(), fleet());
    let c = Controls::default();
    let st = go(&s, &f, None, 1, &c, 0).status;
    f.reporting = false;
    let st = go(&s, &f, Some(&st), 2, &c, 0).status;
    let step1 = go(&s, &f, Some(&st), 2, &c, 100);
    assert_eq!(step1.status.phase, RolloutPhase::Progressing);
    // The gate looks again when the deadline ends.
    assert_eq!(step1.after, Some(Duration::from_secs(200)));
}
