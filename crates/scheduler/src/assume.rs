//! The assume cache: replicas a decision assigned to a cluster count as taken there until the
//! member's figures are known to include them, so neither a burst of decisions nor a retry can
//! fill a cluster beyond its limit before its pods exist.
//!
//! Per binding and cluster it keeps the replicas assigned and how many of them the member's
//! figures are known to include ("confirmed"); the difference is assumed. For kinds whose
//! member status counts their pods (Deployments, StatefulSets, ReplicaSets, Jobs), replicas are
//! confirmed only as the member reports pods for them ([`AssumeCache::observe`]) and then a
//! resource report measured after that ([`AssumeCache::confirm`]): a report that merely comes
//! after the decision proves nothing while the Work is still on its way or its pods are being
//! created. For other kinds a report measured long enough after the decision confirms it, and
//! an assumption nobody confirmed expires.
//!
//! The engine subtracts a binding's own previous replicas from what is taken in a cluster;
//! with this, what it subtracts is always either in the member's figures or assumed.
//!
//! A decision is assumed before its binding is written; one whose write is lost (another
//! writer changed the binding first) is taken back with [`AssumeCache::save`] and
//! [`AssumeCache::restore`], or its replicas would hold room nobody uses until a member
//! reported pods that never come.
//!
//! Times are milliseconds passed in by the caller; nothing here reads a clock.

use std::collections::HashMap;

use orrery_api::binding::TargetCluster;

use crate::Vector;

#[derive(Clone, Debug)]
struct Entry {
    demand: Vector,
    assigned: i64,
    /// Replicas the member's figures are known to include.
    confirmed: i64,
    /// Whether the member's status of the workload counts its pods.
    tracked: bool,
    /// The pods the member last reported for it, and when that was seen.
    seen: Option<(i64, u64)>,
    /// When it was last assigned.
    at: u64,
}

impl Entry {
    fn assumed(&self) -> i64 {
        (self.assigned - self.confirmed).max(0)
    }
}

/// A binding's assumptions as they were before a decision ([`AssumeCache::save`]).
#[derive(Clone, Debug, Default)]
pub struct Saved(Option<HashMap<String, Entry>>);

/// Assumed replicas by binding and cluster.
#[derive(Clone, Debug, Default)]
pub struct AssumeCache {
    /// binding -> cluster -> entry (only entries with something assumed).
    entries: HashMap<String, HashMap<String, Entry>>,
    /// cluster -> the sum of its entries, kept as entries come and go.
    totals: HashMap<String, Vector>,
}

fn add(totals: &mut HashMap<String, Vector>, cluster: &str, demand: &Vector, replicas: f64) {
    let t = totals.entry(cluster.to_string()).or_insert([0.0; 5]);
    for d in 0..5 {
        t[d] = (t[d] + demand[d] * replicas).max(0.0);
    }
    if t.iter().all(|x| *x < 1e-9) {
        totals.remove(cluster);
    }
}

impl AssumeCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a decision: the binding has `next` in place of `previous`. Replicas beyond those
    /// already confirmed are assumed (a cluster without an entry had `previous` confirmed).
    /// Replicas taken away are not given back until the member's figures show it. `tracked`:
    /// the workload's member status counts its pods. Returns the clusters whose totals changed.
    pub fn assume(
        &mut self,
        binding: &str,
        demand: Vector,
        previous: &[TargetCluster],
        next: &[TargetCluster],
        tracked: bool,
        now: u64,
    ) -> Vec<String> {
        let mut changed = Vec::new();
        let entries = self.entries.entry(binding.to_string()).or_default();
        for t in next {
            let before = previous
                .iter()
                .find(|p| p.name == t.name)
                .map(|p| p.replicas)
                .unwrap_or(0);
            if t.replicas <= before && !entries.contains_key(&t.name) {
                continue;
            }
            let e = entries.entry(t.name.clone()).or_insert(Entry {
                demand,
                assigned: before,
                confirmed: before,
                tracked,
                seen: None,
                at: now,
            });
            // Re-priced at the new demand: take the old amount out, put the new one in.
            add(&mut self.totals, &t.name, &e.demand, -(e.assumed() as f64));
            e.demand = demand;
            if t.replicas > e.assigned {
                e.at = now;
            }
            e.assigned = t.replicas;
            e.tracked = tracked;
            add(&mut self.totals, &t.name, &e.demand, e.assumed() as f64);
            changed.push(t.name.clone());
        }
        // Clusters it left: what was assumed there is no longer coming.
        let gone: Vec<String> = entries
            .keys()
            .filter(|c| !next.iter().any(|t| &t.name == *c))
            .cloned()
            .collect();
        for c in gone {
            if let Some(e) = entries.remove(&c) {
                add(&mut self.totals, &c, &e.demand, -(e.assumed() as f64));
                changed.push(c);
            }
        }
        entries.retain(|_, e| e.assumed() > 0);
        if entries.is_empty() {
            self.entries.remove(binding);
        }
        changed
    }

    /// Loads what a binding has in place (at start, when nothing is known of what the members'
    /// figures include): all of it is assumed until confirmed.
    pub fn load(
        &mut self,
        binding: &str,
        demand: Vector,
        placed: &[TargetCluster],
        tracked: bool,
        now: u64,
    ) -> Vec<String> {
        self.forget(binding);
        let zero: Vec<TargetCluster> = placed
            .iter()
            .map(|t| TargetCluster {
                name: t.name.clone(),
                replicas: 0,
            })
            .collect();
        self.assume(binding, demand, &zero, placed, tracked, now)
    }

    /// The binding's assumptions now, to put back should the decision about to be assumed not
    /// be written.
    pub fn save(&self, binding: &str) -> Saved {
        Saved(self.entries.get(binding).cloned())
    }

    /// Puts back what [`AssumeCache::save`] took (the decision assumed since was not
    /// written); returns the clusters whose totals changed.
    pub fn restore(&mut self, binding: &str, saved: Saved) -> Vec<String> {
        let mut changed = self.forget(binding);
        if let Some(m) = saved.0 {
            for (c, e) in &m {
                add(&mut self.totals, c, &e.demand, e.assumed() as f64);
                if !changed.contains(c) {
                    changed.push(c.clone());
                }
            }
            if !m.is_empty() {
                self.entries.insert(binding.to_string(), m);
            }
        }
        changed.sort();
        changed
    }

    /// Whether anything is assumed for `binding`.
    pub fn has(&self, binding: &str) -> bool {
        self.entries.contains_key(binding)
    }

    /// The member of `cluster` reports `pods` for the binding's workload, seen at `now`.
    pub fn observe(&mut self, binding: &str, cluster: &str, pods: i64, now: u64) {
        if let Some(e) = self
            .entries
            .get_mut(binding)
            .and_then(|m| m.get_mut(cluster))
            && e.tracked
        {
            e.seen = Some((pods, now));
        }
    }

    /// The member of `cluster` reported figures measured at `reported_at`: they include the
    /// pods seen reported at least `margin` before, and, for kinds not tracked, the decisions
    /// made at least `settle` before. Returns the clusters whose totals changed.
    pub fn confirm(
        &mut self,
        cluster: &str,
        reported_at: u64,
        margin: u64,
        settle: u64,
    ) -> Vec<String> {
        let mut changed = false;
        let totals = &mut self.totals;
        self.entries.retain(|_, m| {
            if let Some(e) = m.get_mut(cluster) {
                let confirmed = if e.tracked {
                    match e.seen {
                        Some((pods, at)) if at + margin <= reported_at => pods,
                        _ => e.confirmed,
                    }
                } else if e.at + settle <= reported_at {
                    e.assigned
                } else {
                    e.confirmed
                };
                if confirmed != e.confirmed {
                    add(totals, cluster, &e.demand, -(e.assumed() as f64));
                    e.confirmed = confirmed;
                    add(totals, cluster, &e.demand, e.assumed() as f64);
                    changed = true;
                }
                if e.assumed() == 0 {
                    m.remove(cluster);
                }
            }
            !m.is_empty()
        });
        if changed {
            vec![cluster.to_string()]
        } else {
            Vec::new()
        }
    }

    /// Drops assumptions of untracked kinds older than `ttl` (the member never reported
    /// figures after them); returns the clusters whose totals changed. Tracked ones stay until
    /// the member reports their pods: the decision stands whether or not the member is slow.
    pub fn expire(&mut self, now: u64, ttl: u64) -> Vec<String> {
        let mut changed = Vec::new();
        let totals = &mut self.totals;
        self.entries.retain(|_, m| {
            m.retain(|c, e| {
                let keep = e.tracked || now.saturating_sub(e.at) < ttl;
                if !keep {
                    add(totals, c, &e.demand, -(e.assumed() as f64));
                    if !changed.contains(c) {
                        changed.push(c.clone());
                    }
                }
                keep
            });
            !m.is_empty()
        });
        changed
    }

    /// Drops a binding's assumptions (it was deleted); returns the clusters concerned.
    pub fn forget(&mut self, binding: &str) -> Vec<String> {
        let Some(m) = self.entries.remove(binding) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (c, e) in m {
            add(&mut self.totals, &c, &e.demand, -(e.assumed() as f64));
            out.push(c);
        }
        out
    }

    /// What is assumed in a cluster.
    pub fn total(&self, cluster: &str) -> Vector {
        self.totals.get(cluster).copied().unwrap_or([0.0; 5])
    }

    /// What is assumed in each cluster.
    pub fn totals(&self) -> &HashMap<String, Vector> {
        &self.totals
    }

    pub fn len(&self) -> usize {
        self.entries.values().map(HashMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str, replicas: i64) -> TargetCluster {
        TargetCluster {
            name: name.into(),
            replicas,
        }
    }

    const D: Vector = [1.0, 0.0, 0.0, 1.0, 0.0];

    #[test]
    fn untracked_growth_is_assumed_until_a_later_report_or_expiry() {
        let mut c = AssumeCache::new();
        // 0 -> a:3, b:1
        let changed = c.assume("ns/web", D, &[], &[t("a", 3), t("b", 1)], false, 1000);
        assert_eq!(changed, ["a", "b"]);
        assert_eq!(c.totals()["a"][0], 3.0);
        // a:5, b stays: two more in a.
        c.assume(
            "ns/web",
            D,
            &[t("a", 3), t("b", 1)],
            &[t("a", 5), t("b", 1)],
            false,
            2000,
        );
        assert_eq!(c.totals()["a"][0], 5.0);
        assert_eq!(c.totals()["b"][0], 1.0);
        // A report from a measured long enough after the decisions confirms them.
        assert!(c.confirm("a", 2500, 0, 1000).is_empty());
        assert_eq!(c.confirm("a", 3000, 0, 1000), ["a"]);
        assert_eq!(c.total("a"), [0.0; 5]);
        // b's assumption times out.
        assert!(c.expire(10_000, 10_000).is_empty());
        assert_eq!(c.expire(11_000, 10_000), ["b"]);
        assert!(c.is_empty() && c.totals().is_empty());
        c.assume("ns/x", D, &[], &[t("a", 1)], false, 0);
        assert_eq!(c.forget("ns/x"), ["a"]);
        assert!(c.is_empty() && c.totals().is_empty());
    }

    #[test]
    fn tracked_replicas_stay_assumed_until_their_pods_are_reported_and_measured() {
        let mut c = AssumeCache::new();
        c.assume("ns/db", D, &[], &[t("a", 600)], true, 0);
        // Reports measured long after the decision prove nothing while no pod exists.
        assert!(c.confirm("a", 60_000, 500, 5000).is_empty());
        assert!(
            c.expire(600_000, 60_000).is_empty(),
            "tracked ones never expire"
        );
        assert_eq!(c.total("a")[0], 600.0);
        // The member reports 450 pods; a report measured after that sees them.
        c.observe("ns/db", "a", 450, 70_000);
        assert!(
            c.confirm("a", 70_100, 500, 5000).is_empty(),
            "measured too soon after"
        );
        assert_eq!(c.confirm("a", 71_000, 500, 5000), ["a"]);
        assert_eq!(c.total("a")[0], 150.0, "the 150 still to come stay assumed");
        // A retry adds 100 more: 250 assumed, the 450 confirmed are not assumed again.
        c.assume("ns/db", D, &[t("a", 600)], &[t("a", 700)], true, 72_000);
        assert_eq!(c.total("a")[0], 250.0);
        c.observe("ns/db", "a", 700, 80_000);
        c.confirm("a", 81_000, 500, 5000);
        assert!(c.is_empty() && c.totals().is_empty());
        // Scaled down, nothing is assumed; moved away, nothing stays assumed where it left.
        assert!(
            c.assume("ns/db", D, &[t("a", 700)], &[t("a", 300)], true, 90_000)
                .is_empty()
        );
        c.assume(
            "ns/db",
            D,
            &[t("a", 300)],
            &[t("a", 300), t("b", 50)],
            true,
            91_000,
        );
        assert_eq!(c.total("b")[0], 50.0);
        assert_eq!(
            c.assume(
                "ns/db",
                D,
                &[t("a", 300), t("b", 50)],
                &[t("a", 300)],
                true,
                92_000
            ),
            ["b"]
        );
        assert!(c.is_empty());
    }

    #[test]
    fn a_decision_not_written_is_taken_back() {
        let mut c = AssumeCache::new();
        // 2 of a's 4 still assumed from an earlier decision.
        c.assume("ns/web", D, &[t("a", 2)], &[t("a", 4)], true, 0);
        c.assume("ns/other", D, &[], &[t("b", 1)], true, 0);
        let saved = c.save("ns/web");
        c.assume(
            "ns/web",
            D,
            &[t("a", 4)],
            &[t("a", 1), t("b", 30)],
            true,
            10,
        );
        assert_eq!((c.total("a")[0], c.total("b")[0]), (0.0, 31.0));
        // Its write lost a race: back to 2 assumed in a, and b holds only the other's one.
        assert_eq!(c.restore("ns/web", saved), ["a", "b"]);
        assert_eq!((c.total("a")[0], c.total("b")[0]), (2.0, 1.0));
        // A binding that had nothing assumed goes back to nothing.
        let saved = c.save("ns/new");
        c.assume("ns/new", D, &[], &[t("a", 5)], true, 20);
        assert_eq!(c.restore("ns/new", saved), ["a"]);
        assert!(!c.has("ns/new"));
        assert_eq!(c.total("a")[0], 2.0);
    }

    #[test]
    fn a_load_at_start_assumes_everything_until_confirmed() {
        let mut c = AssumeCache::new();
        c.load("ns/web", D, &[t("a", 4), t("b", 2)], true, 0);
        assert_eq!((c.total("a")[0], c.total("b")[0]), (4.0, 2.0));
        c.observe("ns/web", "a", 4, 100);
        c.observe("ns/web", "b", 1, 100);
        c.confirm("a", 1000, 500, 5000);
        c.confirm("b", 1000, 500, 5000);
        assert_eq!((c.total("a")[0], c.total("b")[0]), (0.0, 1.0));
        // Loading again starts afresh.
        c.load("ns/web", D, &[t("a", 4)], true, 2000);
        assert_eq!((c.total("a")[0], c.total("b")[0]), (4.0, 0.0));
    }
}
