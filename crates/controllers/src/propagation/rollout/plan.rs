//! The rollout's pure core: from the binding's `status.rollout` as stored, what its clusters
//! run, and the user's controls, the next `status.rollout`. No clock and no I/O: the time is
//! passed in, and the same inputs give the same status, so a restart resumes where the
//! stored status says and touches no cluster the status had not decided.
//!
//! ```text
//!   rollout:  Complete ──new revision──▶ Progressing ──last stage done──▶ Complete
//!                                         │  ▲   │ ▲
//!                     stage needs approval│  │   │ │unpaused
//!                                         ▼  │   ▼ │
//!                           WaitingForApproval   Paused
//!             Progressing ──failures > maxFailures──▶ Halted ──rollback: Automatic──▶ RolledBack
//!             Halted ──resume──▶ Progressing          any ──abort──▶ Aborted
//!             RolledBack, Aborted ──resume──▶ Progressing (from the first stage)
//!
//!   cluster:  Pending ──its turn──▶ Updating ──healthy for minSuccessTime──▶ Succeeded
//!             Pending ──no slot, or its level too high──▶ Waiting ──▶ Updating
//!             Updating ──not healthy within progressDeadline──▶ Failed
//! ```
//!
//! A change while a rollout runs supersedes it: the clusters that ran the superseded revision
//! take the new one at once (the fleet keeps two revisions: the stable one and the newest),
//! and the stages start again from the first, each gated again.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use orrery_api::Time;
use orrery_api::rollout::{
    ClusterRollout, ClusterState, REMAINING_STAGE, RolloutPhase, RolloutStage, RolloutStatus,
    RolloutStrategy, StageState, StageStatus,
};

/// A target cluster of the binding, as the rollout sees it.
#[derive(Debug, Clone)]
pub struct Member<'a> {
    pub name: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    /// Its water level: the larger of the present one and its forecast peak (`None`:
    /// unknown).
    pub level: Option<f64>,
    /// When its forecast peak comes (later peaks go first among equal levels).
    pub peak_time: Option<Time>,
    /// What its member reports running now, if its report is of the current Work.
    pub runs: Option<Running>,
}

/// What a member runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Running {
    pub revision: i64,
    pub healthy: bool,
    /// Its pods' restarts, when the member counts them.
    pub restarts: Option<i64>,
}

/// What the user says beside the strategy.
#[derive(Debug, Clone, Default)]
pub struct Controls<'a> {
    pub paused: bool,
    pub resume: Option<&'a str>,
    pub abort: Option<&'a str>,
    /// (revision, stage) pairs a RolloutApproval grants.
    pub approved: BTreeSet<(i64, String)>,
}

/// Something worth an Event.
#[derive(Debug, Clone, PartialEq)]
pub struct Note {
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
    /// The stage it is about (empty: the rollout as a whole).
    pub stage: String,
}

/// The next status, when to look again (a gate's clock), and what to announce.
#[derive(Debug, Clone)]
pub struct Step {
    pub status: RolloutStatus,
    pub after: Option<Duration>,
    pub notes: Vec<Note>,
}

/// The next rollout status of a binding whose template is at revision `latest`.
pub fn step(
    strategy: &RolloutStrategy,
    old: Option<&RolloutStatus>,
    latest: i64,
    members: &[Member<'_>],
    controls: &Controls<'_>,
    now: Time,
) -> Step {
    let mut p = Planner {
        strategy,
        members,
        now,
        notes: Vec::new(),
        st: old.cloned().unwrap_or_else(|| RolloutStatus {
            revision: latest,
            stable: latest,
            ..Default::default()
        }),
    };
    if old.is_some() && latest != p.st.revision {
        p.start(latest);
    }
    p.take_controls(controls);
    p.sync_members();
    if !p.st.phase.is_over() {
        p.observe();
        if !p.halt() && p.st.phase != RolloutPhase::Halted {
            p.advance(controls);
        }
    }
    let after = p.after();
    Step {
        status: p.st,
        after,
        notes: p.notes,
    }
}

struct Planner<'a> {
    strategy: &'a RolloutStrategy,
    members: &'a [Member<'a>],
    now: Time,
    st: RolloutStatus,
    notes: Vec<Note>,
}

impl Planner<'_> {
    /// A note about the stage under way.
    fn note(&mut self, warning: bool, reason: &'static str, message: String) {
        let stage = self.st.stage.clone();
        self.note_in(stage, warning, reason, message);
    }

    fn note_in(&mut self, stage: String, warning: bool, reason: &'static str, message: String) {
        self.notes.push(Note {
            warning,
            reason,
            message,
            stage,
        });
    }

    fn member(&self, name: &str) -> Option<&Member<'_>> {
        self.members.iter().find(|m| m.name == name)
    }

    /// The stage named, from the strategy (`remaining` takes the defaults).
    fn stage_spec(&self, name: &str) -> Option<&RolloutStage> {
        self.strategy.stages.iter().find(|s| s.name == name)
    }

    /// How long a cluster of the stage runs healthily before it passes (`remaining`: 0).
    fn soak(&self, stage: &str) -> Duration {
        self.stage_spec(stage)
            .map(RolloutStage::min_success_time)
            .unwrap_or_default()
    }

    /// Revision `latest` starts rolling out: stages from the first; what ran the superseded
    /// revision takes the new one at once.
    fn start(&mut self, latest: i64) {
        let superseded = (!self.st.phase.is_over()).then_some(self.st.revision);
        // From Complete, the stable is what ran everywhere; superseded, rolled back or
        // aborted, it stays what it was.
        if self.st.phase == RolloutPhase::Complete {
            self.st.stable = self.st.revision;
        }
        let old = self.st.revision;
        self.st.revision = latest;
        self.st.phase = RolloutPhase::Progressing;
        self.st.started = Some(self.now);
        self.st.failures = 0;
        self.st.stage.clear();
        self.st.message.clear();
        self.st.stages.clear();
        let now = self.now;
        let stable = self.st.stable;
        for c in &mut self.st.clusters {
            c.healthy_since = None;
            c.message.clear();
            c.since = Some(now);
            if superseded == Some(c.revision) && c.revision != stable {
                c.revision = latest;
                c.state = ClusterState::Updating;
            } else {
                c.revision = stable;
                c.state = ClusterState::Pending;
            }
        }
        // Stages are chosen afresh for the new revision.
        let names: Vec<String> = self.st.clusters.iter().map(|c| c.name.clone()).collect();
        let stages = self.assign_stages(&names);
        for c in &mut self.st.clusters {
            if let Some(s) = stages.get(&c.name) {
                c.stage = s.clone();
            }
        }
        self.note(
            false,
            "RolloutStarted",
            match superseded {
                Some(r) if r != stable => {
                    format!("revision {latest} supersedes revision {r}; from the first stage")
                }
                _ => format!("revision {latest} rolls out (from revision {old})"),
            },
        );
    }

    /// The stage of each named cluster: the first stage selecting it; `percent` stages take
    /// their share, least loaded first, of those no earlier stage took; the rest
    /// `remaining`.
    fn assign_stages(&self, names: &[String]) -> BTreeMap<String, String> {
        let total = self.members.len() as i64;
        let mut left: Vec<&Member<'_>> = self
            .members
            .iter()
            .filter(|m| names.iter().any(|n| n == m.name))
            .collect();
        sort_by_load(&mut left);
        let mut out = BTreeMap::new();
        for s in &self.strategy.stages {
            let take: Vec<usize> = match s.percent {
                Some(pc) => {
                    let n = ((pc * total + 99) / 100) as usize;
                    (0..left.len().min(n)).collect()
                }
                None => (0..left.len())
                    .filter(|&i| s.selects(left[i].name, left[i].labels))
                    .collect(),
            };
            for &i in take.iter().rev() {
                out.insert(left.remove(i).name.to_string(), s.name.clone());
            }
        }
        for m in left {
            out.insert(m.name.to_string(), REMAINING_STAGE.to_string());
        }
        out
    }

    /// The stages in order, `remaining` last when any cluster is in it.
    fn stage_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .strategy
            .stages
            .iter()
            .map(|s| s.name.clone())
            .collect();
        if self.st.clusters.iter().any(|c| c.stage == REMAINING_STAGE) {
            v.push(REMAINING_STAGE.to_string());
        }
        v
    }

    fn take_controls(&mut self, c: &Controls<'_>) {
        if let Some(a) = c.abort
            && a != self.st.abort_observed
        {
            self.st.abort_observed = a.to_string();
            if !self.st.phase.is_over() {
                self.restore_stable(
                    RolloutPhase::Aborted,
                    "aborted: the stable revision is restored",
                );
                self.note(
                    true,
                    "RolloutAborted",
                    format!(
                        "revision {} aborted; revision {} restored",
                        self.st.revision, self.st.stable
                    ),
                );
            }
        }
        if let Some(r) = c.resume
            && r != self.st.resume_observed
        {
            self.st.resume_observed = r.to_string();
            match self.st.phase {
                RolloutPhase::Halted => {
                    self.st.failures = 0;
                    let now = self.now;
                    for cl in &mut self.st.clusters {
                        if cl.state == ClusterState::Failed {
                            cl.state = ClusterState::Updating;
                            cl.since = Some(now);
                            cl.message.clear();
                        }
                    }
                    for s in &mut self.st.stages {
                        if s.state == StageState::Halted {
                            s.state = StageState::Progressing;
                        }
                    }
                    self.st.phase = RolloutPhase::Progressing;
                    self.st.message.clear();
                    self.note(
                        false,
                        "RolloutResumed",
                        "resumed; its failures forgiven".into(),
                    );
                }
                RolloutPhase::RolledBack | RolloutPhase::Aborted => {
                    let r = self.st.revision;
                    self.st.phase = RolloutPhase::Complete;
                    self.st.revision = self.st.stable;
                    self.start(r);
                }
                _ => {}
            }
        }
    }

    /// Every cluster back on the stable revision.
    fn restore_stable(&mut self, phase: RolloutPhase, message: &str) {
        let (stable, now) = (self.st.stable, self.now);
        for c in &mut self.st.clusters {
            if c.revision != stable {
                c.revision = stable;
                c.since = Some(now);
            }
            c.healthy_since = None;
        }
        self.st.phase = phase;
        self.st.message = message.to_string();
    }

    /// Clusters leave with the placement and join with it: a newcomer takes the revision its
    /// stage has reached (a failover places what the cluster would have had).
    fn sync_members(&mut self) {
        self.st
            .clusters
            .retain(|c| self.members.iter().any(|m| m.name == c.name));
        // Those whose stage the strategy no longer has (it was edited) are given one again,
        // keeping what they run.
        let known: Vec<&str> = self
            .strategy
            .stages
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        let lost: Vec<String> = self
            .st
            .clusters
            .iter()
            .filter(|c| c.stage != REMAINING_STAGE && !known.contains(&c.stage.as_str()))
            .map(|c| c.name.clone())
            .collect();
        if !lost.is_empty() {
            let stages = self.assign_stages(&lost);
            for c in &mut self.st.clusters {
                if let Some(s) = stages.get(&c.name) {
                    c.stage = s.clone();
                }
            }
        }
        let new: Vec<String> = self
            .members
            .iter()
            .filter(|m| !self.st.clusters.iter().any(|c| c.name == m.name))
            .map(|m| m.name.to_string())
            .collect();
        if new.is_empty() {
            return;
        }
        let stages = self.assign_stages(&new);
        let order = self.stage_names();
        let current = order.iter().position(|s| *s == self.st.stage);
        for name in new {
            let stage = stages
                .get(&name)
                .cloned()
                .unwrap_or_else(|| REMAINING_STAGE.to_string());
            let reached = match self.st.phase {
                RolloutPhase::Complete => true,
                RolloutPhase::RolledBack | RolloutPhase::Aborted => false,
                _ => {
                    let at = order.iter().position(|s| *s == stage);
                    matches!((at, current), (Some(a), Some(c)) if a < c)
                }
            };
            let (revision, state) = if reached && self.st.phase == RolloutPhase::Complete {
                (self.st.revision, ClusterState::Succeeded)
            } else if reached {
                (self.st.revision, ClusterState::Updating)
            } else {
                (self.st.stable, ClusterState::Pending)
            };
            self.st.clusters.push(ClusterRollout {
                name,
                stage,
                revision,
                state,
                since: Some(self.now),
                ..Default::default()
            });
        }
        self.st.clusters.sort_by(|a, b| a.name.cmp(&b.name));
    }

    /// The gates' clocks: an updating cluster that runs its revision healthily for its
    /// stage's `minSuccessTime` succeeds; one not healthy within the deadline fails.
    fn observe(&mut self) {
        let deadline = self.strategy.progress_deadline();
        let now = self.now;
        let mut failed = Vec::new();
        for i in 0..self.st.clusters.len() {
            let c = &self.st.clusters[i];
            if c.state != ClusterState::Updating {
                continue;
            }
            let soak = self.soak(&c.stage);
            let runs = self.member(&c.name).and_then(|m| m.runs);
            let c = &mut self.st.clusters[i];
            let restarts = runs
                .filter(|r| r.revision == c.revision)
                .and_then(|r| r.restarts)
                .zip(self.strategy.max_restarts)
                .filter(|(n, max)| n > max);
            if let Some((n, max)) = restarts {
                c.state = ClusterState::Failed;
                c.since = Some(now);
                c.healthy_since = None;
                c.message = format!(
                    "its pods restarted {n} times at revision {}, more than maxRestarts {max}",
                    c.revision
                );
                failed.push(format!("{}: {}", c.name, c.message));
                continue;
            }
            let healthy = runs.is_some_and(|r| r.revision == c.revision && r.healthy);
            if healthy {
                let since = *c.healthy_since.get_or_insert(now);
                // Times are whole seconds: a soak counts as done only once more than it has
                // passed, so that it is never cut short by the truncation.
                if soak.is_zero() || elapsed(since, now) > soak {
                    c.state = ClusterState::Succeeded;
                    c.since = Some(now);
                    c.message.clear();
                }
                continue;
            }
            c.healthy_since = None;
            if c.since.is_some_and(|s| elapsed(s, now) >= deadline) {
                c.state = ClusterState::Failed;
                c.since = Some(now);
                c.message = format!(
                    "not healthy at revision {} within {}",
                    c.revision,
                    orrery_api::prediction::format_seconds(deadline.as_secs() as i64)
                );
                failed.push(format!("{}: {}", c.name, c.message));
            }
        }
        for msg in failed {
            self.st.failures += 1;
            self.note(true, "RolloutClusterFailed", msg);
        }
    }

    /// More failures than allowed halt the rollout (and, automatic, roll it back); true if it
    /// halted now.
    fn halt(&mut self) -> bool {
        if self.st.failures <= self.strategy.max_failures || self.st.phase == RolloutPhase::Halted {
            return false;
        }
        let failing: Vec<String> = self
            .st
            .clusters
            .iter()
            .filter(|c| c.state == ClusterState::Failed)
            .map(|c| format!("{} ({})", c.name, c.message))
            .collect();
        let stage = self.st.stage.clone();
        let now = self.now;
        for s in &mut self.st.stages {
            if s.name == stage {
                s.state = StageState::Halted;
                s.finished = Some(now);
            }
        }
        let message = format!(
            "halted in stage {stage}: {} failed (at most {} may): {}",
            self.st.failures,
            self.strategy.max_failures,
            failing.join(", ")
        );
        self.st.phase = RolloutPhase::Halted;
        self.st.message = message.clone();
        self.note(true, "RolloutHalted", message);
        if self.strategy.rollback == orrery_api::rollout::Rollback::Automatic {
            let m = format!(
                "rolled back to revision {}: {}",
                self.st.stable, self.st.message
            );
            let stage = self.st.stage.clone();
            self.restore_stable(RolloutPhase::RolledBack, &m);
            self.note_in(
                stage,
                true,
                "RolledBack",
                format!("revision {} restored", self.st.stable),
            );
        }
        true
    }

    /// Starts stages and clusters as far as the gates allow.
    fn advance(&mut self, controls: &Controls<'_>) {
        let order = self.stage_names();
        for name in &order {
            let idx = match self.st.stages.iter().position(|s| s.name == *name) {
                Some(i) => i,
                None => {
                    self.st.stages.push(StageStatus {
                        name: name.clone(),
                        ..Default::default()
                    });
                    self.st.stages.len() - 1
                }
            };
            let n = self.st.clusters.iter().filter(|c| c.stage == *name).count() as i64;
            self.st.stages[idx].clusters = n;
            match self.st.stages[idx].state {
                StageState::Succeeded => continue,
                StageState::Halted => return,
                StageState::Pending | StageState::WaitingForApproval => {
                    if controls.paused {
                        self.pause(name);
                        return;
                    }
                    let needs = self.stage_spec(name).is_some_and(|s| s.approval);
                    if needs
                        && !controls
                            .approved
                            .contains(&(self.st.revision, name.clone()))
                    {
                        let s = &mut self.st.stages[idx];
                        if s.state != StageState::WaitingForApproval {
                            s.state = StageState::WaitingForApproval;
                            let m = format!(
                                "stage {name} of revision {} waits for a RolloutApproval",
                                self.st.revision
                            );
                            self.note_in(name.clone(), false, "WaitingForApproval", m);
                        }
                        self.st.stage = name.clone();
                        self.st.phase = RolloutPhase::WaitingForApproval;
                        self.st.message = format!(
                            "stage {name} waits for a RolloutApproval of revision {}",
                            self.st.revision
                        );
                        return;
                    }
                    let s = &mut self.st.stages[idx];
                    s.state = StageState::Progressing;
                    s.started = Some(self.now);
                    let m = format!("stage {name} of revision {} started", self.st.revision);
                    self.note_in(name.clone(), false, "StageStarted", m);
                }
                StageState::Progressing => {}
            }
            self.st.stage = name.clone();
            let done = self
                .st
                .clusters
                .iter()
                .filter(|c| c.stage == *name)
                .all(|c| matches!(c.state, ClusterState::Succeeded | ClusterState::Failed));
            if done {
                let s = &mut self.st.stages[idx];
                s.state = StageState::Succeeded;
                s.finished = Some(self.now);
                let m = format!("stage {name} of revision {} succeeded", self.st.revision);
                self.note_in(name.clone(), false, "StageSucceeded", m);
                continue;
            }
            if controls.paused {
                self.pause(name);
                return;
            }
            self.st.phase = RolloutPhase::Progressing;
            self.st.message.clear();
            self.update_clusters(name, n);
            return;
        }
        // Every stage is done.
        self.st.phase = RolloutPhase::Complete;
        self.st.stable = self.st.revision;
        self.st.stage.clear();
        self.st.message = format!("revision {} runs in every cluster", self.st.revision);
        for c in &mut self.st.clusters {
            c.healthy_since = None;
        }
        let m = self.st.message.clone();
        self.note(false, "RolloutComplete", m);
    }

    fn pause(&mut self, stage: &str) {
        self.st.stage = stage.to_string();
        self.st.phase = RolloutPhase::Paused;
        self.st.message = "paused: no further cluster is updated".into();
    }

    /// Gives the stage's next clusters the revision, least loaded first, as many as its
    /// `maxConcurrency` lets update at once and whose level is below its `waitForLevelBelow`.
    fn update_clusters(&mut self, stage: &str, n: i64) {
        let spec = self.stage_spec(stage).cloned().unwrap_or_default();
        let limit = spec
            .max_concurrency
            .as_ref()
            .and_then(|m| m.of(n))
            .unwrap_or(n)
            .max(1);
        let mut updating = self
            .st
            .clusters
            .iter()
            .filter(|c| c.stage == stage && c.state == ClusterState::Updating)
            .count() as i64;
        let mut next: Vec<&Member<'_>> = self
            .members
            .iter()
            .filter(|m| {
                self.st.clusters.iter().any(|c| {
                    c.name == m.name
                        && c.stage == stage
                        && matches!(c.state, ClusterState::Pending | ClusterState::Waiting)
                })
            })
            .collect();
        sort_by_load(&mut next);
        let picks: Vec<(String, Option<f64>)> =
            next.iter().map(|m| (m.name.to_string(), m.level)).collect();
        let (now, revision) = (self.now, self.st.revision);
        for (name, level) in picks {
            let Some(c) = self.st.clusters.iter_mut().find(|c| c.name == name) else {
                continue;
            };
            let held = spec.wait_for_level_below.and_then(|limit| match level {
                Some(l) if l < limit => None,
                Some(l) => Some(format!(
                    "its water level {l:.2} is not below {limit:.2} (waitForLevelBelow)"
                )),
                None => Some("its water level is not known yet (waitForLevelBelow)".into()),
            });
            let why = match held {
                Some(w) => w,
                None if updating >= limit => {
                    format!("waiting for a slot: {limit} update at once (maxConcurrency)")
                }
                None => {
                    c.revision = revision;
                    c.state = ClusterState::Updating;
                    c.since = Some(now);
                    c.healthy_since = None;
                    c.message.clear();
                    updating += 1;
                    continue;
                }
            };
            if c.state != ClusterState::Waiting || c.message != why {
                c.state = ClusterState::Waiting;
                c.since = Some(now);
                c.message = why;
            }
        }
    }

    /// When the gates next need a look: the nearest end of a soak or of a deadline, and a
    /// short while when clusters wait for their levels to fall.
    fn after(&self) -> Option<Duration> {
        if self.st.phase.is_over() {
            return None;
        }
        let deadline = self.strategy.progress_deadline();
        let mut next: Option<Duration> = None;
        let mut at = |d: Duration| next = Some(next.map_or(d, |n| n.min(d)));
        for c in &self.st.clusters {
            match c.state {
                ClusterState::Updating => {
                    if let Some(h) = c.healthy_since {
                        let soak = self.soak(&c.stage);
                        at((soak + Duration::from_secs(1)).saturating_sub(elapsed(h, self.now)));
                    } else if let Some(s) = c.since {
                        at(deadline.saturating_sub(elapsed(s, self.now)));
                    }
                }
                ClusterState::Waiting => at(Duration::from_secs(5)),
                _ => {}
            }
        }
        next.map(|d| d.max(Duration::from_millis(500)))
    }
}

fn elapsed(since: Time, now: Time) -> Duration {
    Duration::from_secs(now.seconds_since(since).max(0) as u64)
}

/// Least loaded first; among equal levels, the furthest peak first; unknown levels last.
fn sort_by_load(v: &mut [&Member<'_>]) {
    v.sort_by(|a, b| {
        let key = |m: &Member<'_>| m.level.map(|l| (l * 1000.0).round() as i64);
        match (key(a), key(b)) {
            (Some(x), Some(y)) if x != y => x.cmp(&y),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            _ => b
                .peak_time
                .cmp(&a.peak_time)
                .then_with(|| a.name.cmp(b.name)),
        }
    });
}

#[cfg(test)]
mod tests;
