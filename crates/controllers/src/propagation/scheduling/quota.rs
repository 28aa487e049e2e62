//! The scheduler's side of FederatedResourceQuotas (Karmada's binding admission, where its
//! scheduler's write is refused): a decision that would take its namespace's use over a
//! quota's `overall` is not written; the binding keeps its placement, says
//! `Scheduled=False` with reason `QuotaExceeded` and the quota's message, and is decided again
//! when a quota of its namespace or another binding there changes.
//!
//! A namespace's use is what its bindings place ([`fq::usage_of`], read from the bindings the
//! scheduler holds), with the decisions written but not seen back yet counted as decided, so
//! that one chunk of decisions cannot pass a limit together.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use orrery_api::Object;
use orrery_api::binding::TargetCluster;
use orrery_api::federated_quota::{
    self as fq, FederatedResourceQuotaSpec, FederatedResourceQuotaStatus,
};
use orrery_api::meta::ResourceList;
use orrery_scheduler::components::QuotaRoom;

use super::BKey;
use crate::propagation::quota::{binding_use, template_in};
use crate::runtime::Event;

#[derive(Debug, Default)]
pub(super) struct QuotaBook {
    /// Limits by namespace, by quota name.
    limits: HashMap<String, BTreeMap<String, ResourceList>>,
    /// What decisions written and not seen back yet use.
    decided: HashMap<BKey, ResourceList>,
    /// Bindings whose decision was refused.
    refused: HashSet<BKey>,
    /// What each quota's ResourceQuotas leave free in the members that report them, by
    /// namespace, by quota name (a whole set of components must fit it).
    rooms: HashMap<String, BTreeMap<String, Vec<QuotaRoom>>>,
}

impl QuotaBook {
    /// Takes a quota's event; returns the refused bindings to decide again.
    pub(super) fn on_quota(&mut self, ev: Event) -> Vec<BKey> {
        match &ev {
            Event::Listed(items) => {
                self.rooms.clear();
                for o in items {
                    self.note_rooms(o);
                }
            }
            Event::Upsert(o) => self.note_rooms(o),
            Event::Delete(o) => {
                if let Some(ns) = self.rooms.get_mut(o.namespace()) {
                    ns.remove(o.name());
                }
            }
        }
        let read = |o: &Object| -> Option<ResourceList> {
            let s: FederatedResourceQuotaSpec = serde_json::from_value(o.spec.clone()?).ok()?;
            Some(s.overall).filter(|o| !o.is_empty())
        };
        match ev {
            Event::Listed(items) => {
                self.limits.clear();
                for o in &items {
                    if let Some(l) = read(o) {
                        self.limits
                            .entry(o.namespace().to_string())
                            .or_default()
                            .insert(o.name().to_string(), l);
                    }
                }
                self.refused.iter().cloned().collect()
            }
            Event::Upsert(o) => {
                let ns = self.limits.entry(o.namespace().to_string()).or_default();
                match read(&o) {
                    Some(l) => ns.insert(o.name().to_string(), l),
                    None => ns.remove(o.name()),
                };
                self.woken(o.namespace())
            }
            Event::Delete(o) => {
                if let Some(ns) = self.limits.get_mut(o.namespace()) {
                    ns.remove(o.name());
                }
                self.woken(o.namespace())
            }
        }
    }

    /// A binding changed or went (`None`); returns the refused bindings of its namespace to
    /// decide again.
    pub(super) fn on_binding(&mut self, k: &BKey, b: Option<&Object>) -> Vec<BKey> {
        match b {
            Some(b) => {
                if self.decided.get(k).is_some_and(|d| *d == binding_use(b)) {
                    self.decided.remove(k);
                }
            }
            None => {
                self.decided.remove(k);
                self.refused.remove(k);
            }
        }
        if self.limits.get(&k.0).is_none_or(BTreeMap::is_empty) {
            return Vec::new();
        }
        let mut wake = self.woken(&k.0);
        wake.retain(|w| w != k);
        wake
    }

    /// Keeps what a quota's members report of their ResourceQuotas.
    fn note_rooms(&mut self, o: &Object) {
        let status: FederatedResourceQuotaStatus = (o.status.clone())
            .and_then(|s| serde_json::from_value(s).ok())
            .unwrap_or_default();
        let rooms: Vec<QuotaRoom> = (status.aggregated_status.iter())
            .filter(|c| !c.hard.is_empty())
            .map(|c| QuotaRoom::of(&c.cluster_name, o.name(), &c.hard, &c.used))
            .collect();
        let ns = self.rooms.entry(o.namespace().to_string()).or_default();
        if rooms.is_empty() {
            ns.remove(o.name());
        } else {
            ns.insert(o.name().to_string(), rooms);
        }
    }

    /// What the members' ResourceQuotas of `ns` leave free, where reported.
    pub(super) fn rooms(&self, ns: &str) -> Vec<QuotaRoom> {
        (self.rooms.get(ns).into_iter())
            .flat_map(|q| q.values().flatten().cloned())
            .collect()
    }

    fn woken(&self, ns: &str) -> Vec<BKey> {
        self.refused.iter().filter(|k| k.0 == ns).cloned().collect()
    }

    /// Whether the decision placing `new` for binding `k` (of a template in `template_ns`,
    /// `request` per replica, placed on `old` now) is refused, and Karmada's message; a
    /// decision let through counts from now on.
    pub(super) fn check(
        &mut self,
        k: &BKey,
        template_ns: &str,
        request: &ResourceList,
        old: &[TargetCluster],
        new: &[TargetCluster],
        bindings: &HashMap<BKey, Arc<Object>>,
    ) -> Option<String> {
        let limits = self.limits.get(&k.0).filter(|l| !l.is_empty());
        let Some(limits) = limits.filter(|_| template_ns == k.0) else {
            self.refused.remove(k);
            return None;
        };
        let placed = |c: &[TargetCluster]| c.iter().map(|c| c.replicas.max(0)).sum::<i64>();
        let old_use = self
            .decided
            .get(k)
            .cloned()
            .unwrap_or_else(|| fq::times(request, placed(old)));
        let new_use = fq::times(request, placed(new));
        if !fq::changes_use(&old_use, &new_use) {
            self.refused.remove(k);
            return None;
        }
        let before = bindings
            .iter()
            .filter(|(bk, b)| bk.0 == k.0 && *bk != k && template_in(b, &k.0))
            .map(|(bk, b)| {
                self.decided
                    .get(bk)
                    .cloned()
                    .unwrap_or_else(|| binding_use(b))
            })
            .fold(old_use.clone(), |acc, u| fq::add(&acc, &u));
        let after = fq::add(&fq::sub(&before, &old_use), &new_use);
        for (name, overall) in limits {
            if let Some(m) = fq::refusal(&k.0, name, overall, &before, &after) {
                self.refused.insert(k.clone());
                return Some(m);
            }
        }
        self.refused.remove(k);
        self.decided.insert(k.clone(), new_use);
        None
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use orrery_store::stamp::new_object;
    use serde_json::json;

    fn quota(ns: &str, cpu: &str) -> Arc<Object> {
        let mut q = new_object(fq::API_VERSION, fq::KIND, Some(ns), "q");
        q.spec = Some(json!({"overall": {"cpu": cpu}}));
        Arc::new(q)
    }

    fn binding(ns: &str, name: &str, placed: i64) -> (BKey, Arc<Object>) {
        let mut b = new_object(
            "multicluster.io/v1alpha1",
            "ResourceBinding",
            Some(ns),
            name,
        );
        b.spec = Some(json!({
            "resource": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": ns, "name": name},
            "replicaRequirements": {"resourceRequest": {"cpu": "100m"}},
            "clusters": [{"name": "a", "replicas": placed}],
        }));
        ((ns.to_string(), name.to_string()), Arc::new(b))
    }

    fn on(n: i64) -> Vec<TargetCluster> {
        vec![TargetCluster {
            name: "a".into(),
            replicas: n,
        }]
    }

    #[test]
    fn decisions_count_until_seen_and_a_refused_one_is_woken_by_room() {
        let mut book = QuotaBook::default();
        book.on_quota(Event::Listed(vec![quota("team", "1")]));
        let (ka, a) = binding("team", "a", 4);
        let (kb, b) = binding("team", "b", 0);
        let all: HashMap<BKey, Arc<Object>> = [(ka.clone(), a.clone()), (kb.clone(), b)].into();
        let req: ResourceList = [("cpu".to_string(), "100m".parse().unwrap())].into();
        // 400m used by a; b may take 600m, and then nothing more.
        assert_eq!(book.check(&kb, "team", &req, &on(0), &on(6), &all), None);
        let m = book.check(&ka, "team", &req, &on(4), &on(5), &all).unwrap();
        assert_eq!(
            m,
            "FederatedResourceQuota(team/q) exceeded for resource cpu: requested sum 1100m, limit 1."
        );
        // Shrinking is never refused; a refused binding wakes when another binding changes.
        assert_eq!(book.check(&ka, "team", &req, &on(4), &on(3), &all), None);
        book.refused.insert(ka.clone());
        assert_eq!(book.on_binding(&kb, Some(&all[&kb])), vec![ka.clone()]);
        // A raised limit wakes it too.
        assert_eq!(
            book.on_quota(Event::Upsert(quota("team", "2"))),
            vec![ka.clone()]
        );
        // Elsewhere, nothing is limited.
        assert_eq!(
            book.check(&("x".into(), "y".into()), "x", &req, &on(0), &on(100), &all),
            None
        );
    }
}
