//! The assume cache: replicas just assigned count as used in their clusters until the member
//! reports them (or a timeout passes), so a burst of decisions cannot overcommit a cluster
//! that has not reported yet.
//!
//! Times are milliseconds passed in by the caller; nothing here reads a clock.

use std::collections::HashMap;

use orrery_api::binding::TargetCluster;

use crate::Vector;

#[derive(Clone, Debug)]
struct Entry {
    demand: Vector,
    replicas: i64,
    at: u64,
}

/// Assumed replicas by binding and cluster.
#[derive(Clone, Debug, Default)]
pub struct AssumeCache {
    /// binding -> cluster -> entry
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

    /// Records a decision: in each cluster, the replicas beyond what ran before are assumed
    /// (added to what is still assumed there for this binding). Replicas taken away are not
    /// given back until the member reports it. Returns the clusters whose totals changed.
    pub fn assume(
        &mut self,
        binding: &str,
        demand: Vector,
        previous: &[TargetCluster],
        next: &[TargetCluster],
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
            let extra = t.replicas - before;
            if extra <= 0 {
                continue;
            }
            let e = entries.entry(t.name.clone()).or_insert(Entry {
                demand,
                replicas: 0,
                at: now,
            });
            // Re-priced at the new demand: take the old amount out, put the new one in.
            add(&mut self.totals, &t.name, &e.demand, -(e.replicas as f64));
            e.demand = demand;
            e.replicas += extra;
            e.at = now;
            add(&mut self.totals, &t.name, &e.demand, e.replicas as f64);
            changed.push(t.name.clone());
        }
        if entries.is_empty() {
            self.entries.remove(binding);
        }
        changed
    }

    /// The member of `cluster` reported figures measured at `reported_at`: assumptions made
    /// at or before `reported_at - settle` are in them now and are dropped.
    /// Returns the clusters whose totals changed.
    pub fn confirm(&mut self, cluster: &str, reported_at: u64, settle: u64) -> Vec<String> {
        let cutoff = reported_at.saturating_sub(settle);
        self.retain(|c, e| !(c == cluster && e.at <= cutoff))
    }

    /// Drops assumptions older than `ttl`; returns the clusters whose totals changed.
    pub fn expire(&mut self, now: u64, ttl: u64) -> Vec<String> {
        self.retain(|_, e| now.saturating_sub(e.at) < ttl)
    }

    /// Drops a binding's assumptions (it was deleted); returns the clusters concerned.
    pub fn forget(&mut self, binding: &str) -> Vec<String> {
        let Some(m) = self.entries.remove(binding) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (c, e) in m {
            add(&mut self.totals, &c, &e.demand, -(e.replicas as f64));
            out.push(c);
        }
        out
    }

    fn retain(&mut self, mut keep: impl FnMut(&str, &Entry) -> bool) -> Vec<String> {
        let mut changed = Vec::new();
        let totals = &mut self.totals;
        self.entries.retain(|_, m| {
            m.retain(|c, e| {
                let k = keep(c, e);
                if !k {
                    add(totals, c, &e.demand, -(e.replicas as f64));
                    if !changed.contains(c) {
                        changed.push(c.clone());
                    }
                }
                k
            });
            !m.is_empty()
        });
        changed
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

    #[test]
    fn growth_is_assumed_until_reported() {
        let mut c = AssumeCache::new();
        let d = [1.0, 0.0, 0.0, 1.0, 0.0];
        // 0 -> a:3, b:1
        let changed = c.assume("ns/web", d, &[], &[t("a", 3), t("b", 1)], 1000);
        assert_eq!(changed, ["a", "b"]);
        assert_eq!(c.totals()["a"][0], 3.0);
        // Scale to a:5, b:0: two more in a (still unreported), b is not given back.
        c.assume("ns/web", d, &[t("a", 3), t("b", 1)], &[t("a", 5)], 2000);
        assert_eq!(c.totals()["a"][0], 5.0);
        assert_eq!(c.totals()["b"][0], 1.0);
        // A report from a measured long enough after the decisions confirms them.
        assert!(c.confirm("a", 2500, 1000).is_empty());
        assert_eq!(c.confirm("a", 3000, 1000), ["a"]);
        assert!(!c.totals().contains_key("a"));
        assert_eq!(c.total("a"), [0.0; 5]);
        // b's assumption times out.
        assert!(c.expire(10_000, 10_000).is_empty());
        assert_eq!(c.expire(11_000, 10_000), ["b"]);
        assert!(c.is_empty() && c.totals().is_empty());
        c.assume("ns/x", d, &[], &[t("a", 1)], 0);
        assert_eq!(c.forget("ns/x"), ["a"]);
        assert!(c.is_empty() && c.totals().is_empty());
    }
}
