//! What the scheduler knows of workloads' relations to one another and of stateful moves:
//! which binding follows which (follow-up scheduling, `placement.followUp`), Karmada's
//! affinity groups (`placement.workloadAffinity`), where a workload serves while it moves
//! (the source until the target serves), and the `Migration` that carries a stateful
//! workload's data when a decision moves it.
//!
//! A dependency graph, kept from the bindings as they change: edges from a follower to its
//! leader and between members of a group. Latency to the other end of each edge is what the
//! proximity score and the choice of a move's target weigh.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use orrery_api::Object;
use orrery_api::binding::{self, BindingSpec};
use orrery_api::stateful::{MigrationPhase, MigrationStatus};

/// A binding: namespace and name.
pub(super) type BKey = (String, String);

/// What the scheduler keeps of a Migration.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct MoveState {
    pub binding: String,
    pub phase: MigrationPhase,
    pub source: String,
    pub target: String,
    /// Unix seconds it ended, if it did.
    pub ended: Option<i64>,
    /// Whether the scheduler has to choose its target (a user's Migration, not yet chosen).
    pub needs_target: bool,
}

impl MoveState {
    pub fn of(m: &Object) -> MoveState {
        let st = MigrationStatus::of(m);
        let spec = orrery_api::stateful::migration_spec(m.spec.as_ref()).ok();
        MoveState {
            binding: st.binding.clone(),
            phase: st.phase,
            needs_target: st.target.is_empty()
                && !st.phase.is_done()
                && m.metadata.deletion_timestamp.is_none()
                && spec.is_some(),
            source: st.source,
            target: st.target,
            ended: st.completion_time.map(|t| t.unix_seconds()),
        }
    }
}

/// Follow-up and group relations between bindings, and the migrations under way.
#[derive(Debug, Default)]
pub(super) struct Graph {
    leader_of: HashMap<BKey, BKey>,
    followers: HashMap<BKey, BTreeSet<BKey>>,
    /// (namespace, group) → members, for affinity and anti-affinity groups.
    together: HashMap<(String, String), BTreeSet<BKey>>,
    apart: HashMap<(String, String), BTreeSet<BKey>>,
    groups_of: HashMap<BKey, (String, String)>,
    pub migrations: HashMap<BKey, MoveState>,
}

/// A binding's leader, read without parsing the whole spec.
fn leader_key(ns: &str, b: &Object) -> Option<BKey> {
    let f = b.spec.as_ref()?.pointer("/placement/followUp")?;
    let kind = f.get("kind")?.as_str()?;
    let name = f.get("name")?.as_str()?;
    Some((ns.to_string(), binding::name_for(kind, name)))
}

fn groups(b: &Object) -> (String, String) {
    let g = b.spec.as_ref().and_then(|s| s.get("affinityGroups"));
    let get = |k: &str| {
        g.and_then(|g| g.get(k))
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    (get("affinityGroup"), get("antiAffinityGroup"))
}

impl Graph {
    /// Forgets every binding (a listing replaces them); migrations stay.
    pub fn clear_bindings(&mut self) {
        let migrations = std::mem::take(&mut self.migrations);
        *self = Graph {
            migrations,
            ..Default::default()
        };
    }

    /// Takes in a binding as it is now (`None`: gone).
    pub fn put(&mut self, k: &BKey, b: Option<&Object>) {
        if let Some(old) = self.leader_of.remove(k)
            && let Some(f) = self.followers.get_mut(&old)
        {
            f.remove(k);
        }
        if let Some((a, n)) = self.groups_of.remove(k) {
            for (map, g) in [(&mut self.together, a), (&mut self.apart, n)] {
                if let Some(m) = map.get_mut(&(k.0.clone(), g)) {
                    m.remove(k);
                }
            }
        }
        let Some(b) = b else { return };
        if let Some(l) = leader_key(&k.0, b) {
            self.followers
                .entry(l.clone())
                .or_default()
                .insert(k.clone());
            self.leader_of.insert(k.clone(), l);
        }
        let (a, n) = groups(b);
        if !a.is_empty() {
            self.together
                .entry((k.0.clone(), a.clone()))
                .or_default()
                .insert(k.clone());
        }
        if !n.is_empty() {
            self.apart
                .entry((k.0.clone(), n.clone()))
                .or_default()
                .insert(k.clone());
        }
        if !a.is_empty() || !n.is_empty() {
            self.groups_of.insert(k.clone(), (a, n));
        }
    }

    /// Bindings whose decisions depend on where `k` runs: its followers and the other
    /// members of its groups.
    pub fn dependents(&self, k: &BKey) -> Vec<BKey> {
        let mut out: BTreeSet<BKey> = self.followers.get(k).cloned().unwrap_or_default();
        if let Some((a, n)) = self.groups_of.get(k) {
            for (map, g) in [(&self.together, a), (&self.apart, n)] {
                if let Some(m) = map.get(&(k.0.clone(), g.clone())) {
                    out.extend(m.iter().filter(|x| *x != k).cloned());
                }
            }
        }
        out.into_iter().collect()
    }

    /// The name of the migration a binding says moves it, whether or not it is known.
    pub fn named(b: &Object) -> Option<&str> {
        b.spec
            .as_ref()?
            .get("migration")?
            .as_str()
            .filter(|n| !n.is_empty())
    }

    /// Whether the binding names a migration this graph has not seen (just written, its
    /// watch event not here yet; or never written).
    pub fn names_unknown(&self, b: &Object) -> bool {
        Self::named(b).is_some_and(|n| {
            !self
                .migrations
                .contains_key(&(b.namespace().to_string(), n.to_string()))
        })
    }

    /// The migration moving a binding now, if one is under way.
    pub fn moving(&self, b: &Object) -> Option<&MoveState> {
        let name = b.spec.as_ref()?.get("migration")?.as_str()?;
        self.migrations
            .get(&(b.namespace().to_string(), name.to_string()))
            .filter(|m| !m.phase.is_done())
    }

    /// Where a binding's workload serves: its clusters, except that a move counts from its
    /// source until the target serves (`Switching`).
    pub fn serving(&self, b: &Object) -> Vec<String> {
        let mut clusters: Vec<String> = b
            .spec
            .as_ref()
            .and_then(|s| s.get("clusters"))
            .and_then(serde_json::Value::as_array)
            .into_iter()
            .flatten()
            .filter(|c| c.get("replicas").and_then(serde_json::Value::as_i64) != Some(0))
            .filter_map(|c| c.get("name")?.as_str().map(str::to_string))
            .collect();
        if let Some(m) = self.moving(b)
            && m.phase < MigrationPhase::Switching
            && !m.source.is_empty()
        {
            clusters.retain(|c| *c != m.target);
            if !clusters.contains(&m.source) {
                clusters.push(m.source.clone());
            }
        }
        clusters.sort();
        clusters
    }
}

/// What ties one binding to its data and to other workloads, owned (the engine's
/// [`orrery_scheduler::Relations`] borrows it).
#[derive(Debug, Default)]
pub(super) struct Ties {
    pub storage_classes: Vec<String>,
    pub within: Option<(Vec<String>, String)>,
    pub avoid: Option<(Vec<String>, String)>,
    pub near: Vec<String>,
    /// It follows a leader: when the leader's clusters cannot hold it, the nearest can.
    pub follows: bool,
    /// The data sets it reads and its work.
    pub data: Option<orrery_scheduler::data::DataNeeds>,
}

impl Ties {
    pub fn relations(&self) -> orrery_scheduler::Relations<'_> {
        orrery_scheduler::Relations {
            storage_classes: &self.storage_classes,
            within: self
                .within
                .as_ref()
                .map(|(w, r)| (w.as_slice(), r.as_str())),
            avoid: self.avoid.as_ref().map(|(a, r)| (a.as_slice(), r.as_str())),
            near: &self.near,
            data: self.data.as_ref(),
        }
    }
}

/// The data sets the scheduler knows of: size and copies, by namespace and name.
#[derive(Debug, Default)]
pub(super) struct DataSets(HashMap<(String, String), orrery_scheduler::data::Input>);

impl DataSets {
    pub fn clear(&mut self) {
        self.0.clear();
    }

    /// Takes a DataSet in: its authoritative copies and the caches holding its data; one
    /// whose spec does not parse is as if it did not exist (admission refuses such specs).
    /// Whether what the scheduler sees of it changed (a status write that only moves a
    /// transfer's progress does not).
    pub fn put(&mut self, d: &Object) -> bool {
        let k = (d.namespace().to_string(), d.name().to_string());
        let next = orrery_api::data::DataSetSpec::parse(d.spec.as_ref())
            .ok()
            .map(|spec| {
                let mut holders: Vec<(String, orrery_api::data::Tier)> = spec
                    .locations
                    .iter()
                    .map(|l| (l.cluster.clone(), l.tier))
                    .collect();
                let status = orrery_api::data::DataSetStatus::of(d);
                for c in &status.copies {
                    if c.present && !holders.iter().any(|(h, _)| *h == c.cluster) {
                        holders.push((c.cluster.clone(), c.tier));
                    }
                }
                orrery_scheduler::data::Input {
                    name: k.1.clone(),
                    bytes: spec.bytes(),
                    holders,
                }
            });
        let changed = self.0.get(&k) != next.as_ref();
        match next {
            Some(input) => {
                self.0.insert(k, input);
            }
            None => {
                self.0.remove(&k);
            }
        }
        changed
    }

    pub fn remove(&mut self, k: &(String, String)) {
        self.0.remove(k);
    }

    /// What a binding's template reads and asks for, resolved against the data sets.
    fn needs(
        &self,
        namespace: &str,
        spec: &BindingSpec,
    ) -> Option<orrery_scheduler::data::DataNeeds> {
        let d = &spec.data;
        if d.is_empty() {
            return None;
        }
        let policy = spec.placement.data_policy.clone().unwrap_or_default();
        let mut needs = orrery_scheduler::data::DataNeeds {
            gpu_hours: d.gpu_hours.unwrap_or(0.0),
            cost_first: policy.cost_first(),
            max_transfer: policy
                .max_transfer
                .map(|q| i64::try_from(q.value()).unwrap_or(i64::MAX)),
            tier: d.storage_tier,
            network: d.network.clone(),
            ..Default::default()
        };
        for name in &d.datasets {
            match self.0.get(&(namespace.to_string(), name.clone())) {
                Some(i) => needs.inputs.push(i.clone()),
                None => needs.missing.push(name.clone()),
            }
        }
        Some(needs)
    }
}

/// The ties of binding `k`, from the graph and where the others run.
pub(super) fn ties(
    graph: &Graph,
    bindings: &HashMap<BKey, Arc<Object>>,
    datasets: &DataSets,
    k: &BKey,
    spec: &BindingSpec,
) -> Ties {
    let mut t = Ties {
        data: datasets.needs(&k.0, spec),
        ..Default::default()
    };
    let mut classes: BTreeSet<String> = BTreeSet::new();
    for v in &spec.volumes {
        classes.insert(v.storage_class.clone());
    }
    t.storage_classes = classes.into_iter().collect();
    let mut near: BTreeSet<String> = BTreeSet::new();
    if let Some(f) = &spec.placement.follow_up {
        t.follows = true;
        let who = format!("{}/{}", f.kind, f.name);
        // Walk up the leaders: a chain back to this binding is a cycle.
        let mut chain = vec![k.1.clone()];
        let mut at = graph.leader_of.get(k).cloned();
        let mut cycle = false;
        while let Some(l) = at {
            if &l == k {
                cycle = true;
                break;
            }
            if chain.len() > 32 {
                break;
            }
            chain.push(l.1.clone());
            at = graph.leader_of.get(&l).cloned();
        }
        let leader = bindings.get(&(k.0.clone(), binding::name_for(&f.kind, &f.name)));
        t.within = Some(if cycle {
            chain.push(k.1.clone());
            (
                Vec::new(),
                format!("follow-up cycle: {}", chain.join(" follows ")),
            )
        } else {
            match leader.map(|b| graph.serving(b)) {
                Some(c) if !c.is_empty() => {
                    near.extend(c.iter().cloned());
                    let why = format!("its leader {who} runs in {}", c.join(", "));
                    (c, why)
                }
                Some(_) => (Vec::new(), format!("its leader {who} is not placed yet")),
                None => (
                    Vec::new(),
                    format!("its leader {who} has no binding (no policy places it)"),
                ),
            }
        });
    }
    for f in graph.followers.get(k).into_iter().flatten() {
        if let Some(b) = bindings.get(f) {
            near.extend(graph.serving(b));
        }
    }
    if let Some((a, n)) = graph.groups_of.get(k) {
        let peers = |map: &HashMap<(String, String), BTreeSet<BKey>>, g: &str| -> Vec<String> {
            let mut out: BTreeSet<String> = BTreeSet::new();
            for p in map.get(&(k.0.clone(), g.to_string())).into_iter().flatten() {
                if p == k {
                    continue;
                }
                if let Some(b) = bindings.get(p) {
                    out.extend(graph.serving(b));
                }
            }
            out.into_iter().collect()
        };
        if !a.is_empty() {
            let with = peers(&graph.together, a);
            // The first of a group goes anywhere (Karmada's bootstrap).
            if !with.is_empty() {
                near.extend(with.iter().cloned());
                let why = format!("its affinity group {a} runs in {}", with.join(", "));
                t.within = Some(match t.within.take() {
                    Some((w, r)) => (
                        w.into_iter().filter(|c| with.contains(c)).collect(),
                        format!("{r}, and {why}"),
                    ),
                    None => (with, why),
                });
            }
        }
        if !n.is_empty() {
            let away = peers(&graph.apart, n);
            if !away.is_empty() {
                let why = format!("its anti-affinity group {n} runs there");
                t.avoid = Some((away, why));
            }
        }
    }
    t.near = near.into_iter().collect();
    t
}

/// A new Migration, as the scheduler starts one.
#[allow(clippy::too_many_arguments)]
pub(super) fn new_migration(
    namespace: &str,
    resource: &binding::ObjectReference,
    binding_name: &str,
    source: &str,
    target: &str,
    replicas: i64,
    reason: &str,
    estimate: orrery_api::stateful::Estimate,
    message: String,
) -> Object {
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let mut base = resource.name.clone();
    base.truncate(240);
    let name = format!("{base}-{}", &suffix[..8]);
    let mut m = orrery_store::stamp::new_object(
        orrery_api::binding::API_VERSION,
        orrery_api::stateful::MIGRATION_KIND,
        Some(namespace),
        &name,
    );
    m.metadata.labels.insert(
        "multicluster.io/binding".into(),
        binding_name.chars().take(63).collect(),
    );
    m.spec = Some(serde_json::json!({
        "resource": {"apiVersion": resource.api_version, "kind": resource.kind, "name": resource.name},
        "targetClusters": [target],
        "sourceCluster": source,
        "reason": reason,
    }));
    let now = orrery_api::Time::now();
    m.status = serde_json::to_value(MigrationStatus {
        phase: MigrationPhase::Pending,
        source: source.to_string(),
        target: target.to_string(),
        replicas,
        binding: binding_name.to_string(),
        estimate: Some(estimate),
        message,
        start_time: Some(now),
        ..Default::default()
    })
    .ok();
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn b(ns: &str, name: &str, spec: serde_json::Value) -> Arc<Object> {
        let mut o = Object::new(binding::API_VERSION, binding::KIND)
            .with_name(name)
            .with_namespace(ns);
        o.spec = Some(spec);
        Arc::new(o)
    }

    fn spec_of(o: &Object) -> BindingSpec {
        BindingSpec::of(o).unwrap()
    }

    fn base(extra: serde_json::Value) -> serde_json::Value {
        let mut s = json!({"resource": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "x"},
                           "policy": {"apiVersion": "v1", "kind": "P", "name": "p"}});
        for (k, v) in extra.as_object().unwrap() {
            s[k] = v.clone();
        }
        s
    }

    #[test]
    fn followers_run_where_their_leader_serves_and_cycles_are_named() {
        let mut g = Graph::default();
        let mut all: HashMap<BKey, Arc<Object>> = HashMap::new();
        let leader = b(
            "ns",
            "db-statefulset",
            base(json!({"clusters": [{"name": "a", "replicas": 3}],
            "volumes": [{"name": "data", "perOrdinal": true, "storageClass": "fast"}]})),
        );
        let app = b(
            "ns",
            "app-deployment",
            base(json!({
            "placement": {"followUp": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db"}},
            "clusters": [{"name": "c", "replicas": 2}]})),
        );
        for o in [&leader, &app] {
            let k = (o.namespace().to_string(), o.name().to_string());
            g.put(&k, Some(o));
            all.insert(k, (*o).clone());
        }
        let ak = ("ns".to_string(), "app-deployment".to_string());
        let lk = ("ns".to_string(), "db-statefulset".to_string());
        assert_eq!(g.dependents(&lk), vec![ak.clone()]);
        let t = ties(&g, &all, &DataSets::default(), &ak, &spec_of(&app));
        assert!(t.follows);
        assert_eq!(
            t.within,
            Some((
                vec!["a".to_string()],
                "its leader StatefulSet/db runs in a".to_string()
            ))
        );
        assert_eq!(t.near, vec!["a".to_string()]);
        // The leader sees its follower's cluster as one to be near, and its storage class.
        let t = ties(&g, &all, &DataSets::default(), &lk, &spec_of(&leader));
        assert_eq!(
            (t.near.clone(), t.storage_classes.clone()),
            (vec!["c".to_string()], vec!["fast".to_string()])
        );
        // While the leader moves to b, it serves from a until the target serves.
        let mut moving = (*leader).clone();
        moving.spec.as_mut().unwrap()["clusters"] = json!([{"name": "b", "replicas": 3}]);
        moving.spec.as_mut().unwrap()["migration"] = json!("db-1");
        g.migrations.insert(
            ("ns".into(), "db-1".into()),
            MoveState {
                binding: "db-statefulset".into(),
                phase: MigrationPhase::FinalSync,
                source: "a".into(),
                target: "b".into(),
                ended: None,
                needs_target: false,
            },
        );
        assert_eq!(g.serving(&moving), vec!["a".to_string()]);
        g.migrations
            .get_mut(&("ns".into(), "db-1".into()))
            .unwrap()
            .phase = MigrationPhase::Switching;
        assert_eq!(g.serving(&moving), vec!["b".to_string()]);
        // A leader without a binding, and a cycle.
        all.remove(&lk);
        let t = ties(&g, &all, &DataSets::default(), &ak, &spec_of(&app));
        assert_eq!(
            t.within.unwrap().1,
            "its leader StatefulSet/db has no binding (no policy places it)"
        );
        let looped = b(
            "ns",
            "db-statefulset",
            base(json!({
            "placement": {"followUp": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "app"}}})),
        );
        g.put(&lk, Some(&looped));
        all.insert(lk.clone(), looped);
        let t = ties(&g, &all, &DataSets::default(), &ak, &spec_of(&app));
        assert_eq!(
            t.within,
            Some((
                vec![],
                "follow-up cycle: app-deployment follows db-statefulset follows app-deployment"
                    .to_string()
            ))
        );
    }

    #[test]
    fn affinity_groups_keep_together_and_apart_with_bootstrap() {
        let mut g = Graph::default();
        let mut all: HashMap<BKey, Arc<Object>> = HashMap::new();
        let mk = |name: &str, clusters: serde_json::Value, groups: serde_json::Value| {
            b(
                "ns",
                name,
                base(json!({"clusters": clusters, "affinityGroups": groups})),
            )
        };
        let first = mk(
            "a-deployment",
            json!([]),
            json!({"affinityGroup": "app=shop", "antiAffinityGroup": "ha=1"}),
        );
        let k1 = ("ns".to_string(), "a-deployment".to_string());
        g.put(&k1, Some(&first));
        all.insert(k1.clone(), first.clone());
        // Alone in its groups: anywhere.
        let t = ties(&g, &all, &DataSets::default(), &k1, &spec_of(&first));
        assert!(t.within.is_none() && t.avoid.is_none());
        let second = mk(
            "b-deployment",
            json!([{"name": "x", "replicas": 1}]),
            json!({"affinityGroup": "app=shop", "antiAffinityGroup": "ha=1"}),
        );
        let other_ns = b(
            "other",
            "b-deployment",
            base(json!({"clusters": [{"name": "y", "replicas": 1}],
            "affinityGroups": {"affinityGroup": "app=shop"}})),
        );
        let k2 = ("ns".to_string(), "b-deployment".to_string());
        g.put(&k2, Some(&second));
        all.insert(k2.clone(), second);
        let k3 = ("other".to_string(), "b-deployment".to_string());
        g.put(&k3, Some(&other_ns));
        all.insert(k3, other_ns);
        let t = ties(&g, &all, &DataSets::default(), &k1, &spec_of(&first));
        assert_eq!(
            t.within,
            Some((
                vec!["x".to_string()],
                "its affinity group app=shop runs in x".to_string()
            ))
        );
        assert_eq!(
            t.avoid,
            Some((
                vec!["x".to_string()],
                "its anti-affinity group ha=1 runs there".to_string()
            ))
        );
        assert_eq!(
            g.dependents(&k1),
            vec![k2.clone()],
            "groups are per namespace"
        );
        g.put(&k2, None);
        assert!(g.dependents(&k1).is_empty());
    }

    /// A binding's data needs resolve its data sets in its own namespace; one not there (or
    /// whose spec does not parse) is missing, and a binding that says nothing has none.
    #[test]
    fn data_needs_resolve_data_sets_of_the_namespace() {
        let mut ds = DataSets::default();
        let set = |ns: &str, name: &str, spec: serde_json::Value| {
            let mut o = Object::new("multicluster.io/v1alpha1", "DataSet")
                .with_name(name)
                .with_namespace(ns);
            o.spec = Some(spec);
            o
        };
        ds.put(&set(
            "ml",
            "tokens",
            json!({"size": "10Gi", "locations": [{"cluster": "a", "tier": "hot"}]}),
        ));
        ds.put(&set(
            "other",
            "images",
            json!({"size": "1Gi", "locations": [{"cluster": "b"}]}),
        ));
        ds.put(&set("ml", "broken", json!({"size": "0"})));
        let k = ("ml".to_string(), "job-job".to_string());
        let spec = spec_of(&b(
            "ml",
            "job-job",
            base(
                json!({"data": {"datasets": ["tokens", "images", "broken"], "gpuHours": 2.0},
                        "placement": {"dataPolicy": {"optimizeFor": "TransferCost", "maxTransfer": "5Gi"}}}),
            ),
        ));
        let t = ties(&Graph::default(), &HashMap::new(), &ds, &k, &spec);
        let n = t.data.unwrap();
        assert_eq!(n.inputs.len(), 1);
        assert_eq!(n.inputs[0].bytes, 10 << 30);
        assert_eq!(
            n.inputs[0].holders,
            vec![("a".to_string(), orrery_api::data::Tier::Hot)]
        );
        assert_eq!(n.missing, ["images", "broken"]);
        assert_eq!(
            (n.gpu_hours, n.cost_first, n.max_transfer),
            (2.0, true, Some(5 << 30))
        );
        let plain = spec_of(&b("ml", "x", base(json!({}))));
        assert!(
            ties(&Graph::default(), &HashMap::new(), &ds, &k, &plain)
                .data
                .is_none()
        );
        ds.remove(&("ml".to_string(), "tokens".to_string()));
        let t = ties(&Graph::default(), &HashMap::new(), &ds, &k, &spec);
        assert!(t.data.unwrap().missing.contains(&"tokens".to_string()));
    }
}
