//! PlacementDecisions: every ResourceBinding's clusters, kept in step with it in the two shapes
//! the ecosystem reads placement results in:
//!
//! - OCM's `cluster.open-cluster-management.io/v1beta1` (what Argo CD's
//!   `clusterDecisionResource` generator reads): `<binding>-decision-<n>` from 1, the
//!   decisions in `status.decisions[{clusterName, reason}]`, labelled
//!   `cluster.open-cluster-management.io/placement=<binding>` and `decision-group-index=0`;
//!   at least one object, even with no decision, as OCM does;
//! - SIG-Multicluster's KEP-5313 `multicluster.x-k8s.io/v1alpha1`: `<binding>-<n>` from 0,
//!   top-level `decisions[{clusterProfileRef: {name, namespace}, reason}]` pointing at the
//!   clusters' ClusterProfiles, labelled `multicluster.x-k8s.io/placement-key`,
//!   `decision-key` and `decision-index`.
//!
//! At most 100 decisions per object, split across objects beyond that. Each object is owned by
//! its binding (it goes with it). Written only when it differs from what is stored, so a
//! restart writes nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use orrery_api::{Object, OwnerReference, keys};
use orrery_store::stamp::new_object;
use orrery_store::{Preconditions, Store, StoreError};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::runtime::cache::Cache;
use crate::runtime::controller::{Action, Controller, Keys, Origin, Reconciler, Source};
use crate::runtime::metrics::Handle;
use crate::runtime::reflector::Event;

pub const OCM_GROUP: &str = "cluster.open-cluster-management.io";
pub const OCM_API_VERSION: &str = "cluster.open-cluster-management.io/v1beta1";
pub const OCM_PLACEMENT_LABEL: &str = "cluster.open-cluster-management.io/placement";
pub const OCM_GROUP_INDEX_LABEL: &str = "cluster.open-cluster-management.io/decision-group-index";
pub const OCM_GROUP_NAME_LABEL: &str = "cluster.open-cluster-management.io/decision-group-name";
pub const SIG_GROUP: &str = "multicluster.x-k8s.io";
pub const SIG_API_VERSION: &str = "multicluster.x-k8s.io/v1alpha1";
pub const SIG_PLACEMENT_KEY: &str = "multicluster.x-k8s.io/placement-key";
pub const SIG_DECISION_KEY: &str = "multicluster.x-k8s.io/decision-key";
pub const SIG_DECISION_INDEX: &str = "multicluster.x-k8s.io/decision-index";
pub const KIND: &str = "PlacementDecision";
pub const PLURAL: &str = "placementdecisions";
/// Decisions per object (both APIs' limit).
pub const MAX_DECISIONS: usize = 100;
/// Where the ClusterProfiles the KEP-5313 decisions point at live.
pub const PROFILE_NAMESPACE: &str = crate::inventory::NAMESPACE;

/// One cluster a binding placed its template in, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub cluster: String,
    pub reason: String,
}

/// A binding's decisions: its clusters, by name.
pub fn decisions_of(binding: &Object) -> Vec<Decision> {
    let mut v: Vec<Decision> = binding
        .spec
        .as_ref()
        .and_then(|s| s.get("clusters"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| {
            let cluster = c.get("name")?.as_str()?.to_string();
            let reason = match c.get("replicas").and_then(Value::as_i64) {
                Some(n) => format!("scheduled by orrery: {n} replica(s)"),
                None => "scheduled by orrery".to_string(),
            };
            Some(Decision { cluster, reason })
        })
        .collect();
    v.sort_by(|a, b| a.cluster.cmp(&b.cluster));
    v
}

/// A label value naming `name`: itself when it is a valid label value, else a prefix and a
/// hash (names may be 253 characters, label values 63).
pub fn label_value(name: &str) -> String {
    if name.len() <= 63 {
        return name.to_string();
    }
    let h = name.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    let prefix: String = name.chars().take(54).collect();
    format!("{}-{h:08x}", prefix.trim_end_matches(['-', '.', '_']))
}

/// One object wanted: (group, name, labels, the object's content besides metadata).
#[derive(Clone, Debug, PartialEq)]
pub struct Wanted {
    pub group: &'static str,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// `status` for OCM's, the top-level fields for KEP-5313's.
    pub body: Value,
}

/// Every PlacementDecision a binding named `binding` calls for, in both shapes.
pub fn wanted(binding: &str, decisions: &[Decision]) -> Vec<Wanted> {
    let chunks: Vec<&[Decision]> = if decisions.is_empty() {
        vec![&[]]
    } else {
        decisions.chunks(MAX_DECISIONS).collect()
    };
    let key = label_value(binding);
    let mut out = Vec::new();
    for (i, chunk) in chunks.iter().enumerate() {
        out.push(Wanted {
            group: OCM_GROUP,
            name: format!("{binding}-decision-{}", i + 1),
            labels: BTreeMap::from([
                (OCM_PLACEMENT_LABEL.to_string(), key.clone()),
                (OCM_GROUP_INDEX_LABEL.to_string(), "0".to_string()),
                (OCM_GROUP_NAME_LABEL.to_string(), String::new()),
            ]),
            body: json!({ "status": { "decisions": chunk.iter().map(|d| json!({
                "clusterName": d.cluster, "reason": d.reason,
            })).collect::<Vec<_>>() } }),
        });
        out.push(Wanted {
            group: SIG_GROUP,
            name: format!("{binding}-{i}"),
            labels: BTreeMap::from([
                (SIG_PLACEMENT_KEY.to_string(), key.clone()),
                (SIG_DECISION_KEY.to_string(), key.clone()),
                (SIG_DECISION_INDEX.to_string(), i.to_string()),
            ]),
            body: json!({
                "decisions": chunk.iter().map(|d| json!({
                    "clusterProfileRef": {"name": d.cluster, "namespace": PROFILE_NAMESPACE},
                    "reason": d.reason,
                })).collect::<Vec<_>>(),
                "schedulerName": "orrery",
            }),
        });
    }
    out
}

fn api_version(group: &str) -> &'static str {
    if group == OCM_GROUP {
        OCM_API_VERSION
    } else {
        SIG_API_VERSION
    }
}

fn key_of(group: &str, ns: &str, name: &str) -> String {
    let kind = if group == OCM_GROUP {
        &orrery_api::kinds::OCM_PLACEMENT_DECISION
    } else {
        &orrery_api::kinds::SIG_PLACEMENT_DECISION
    };
    kind.key(ns, name)
}

/// Whether a stored object already says what `w` does.
fn same(cur: &Object, w: &Wanted) -> bool {
    if cur.metadata.labels != w.labels {
        return false;
    }
    if w.group == OCM_GROUP {
        cur.status.as_ref() == w.body.get("status")
    } else {
        w.body
            .as_object()
            .is_some_and(|b| b.iter().all(|(k, v)| cur.other.get(k) == Some(v)))
    }
}

/// The decisions' owner label of a stored PlacementDecision, of either shape.
fn owner_label(o: &Object) -> Option<&String> {
    o.labels()
        .get(OCM_PLACEMENT_LABEL)
        .or_else(|| o.labels().get(SIG_DECISION_KEY))
}

struct Decisions {
    store: Arc<dyn Store>,
    bindings: Arc<Cache>,
    ocm: Arc<Cache>,
    sig: Arc<Cache>,
}

impl Decisions {
    /// Brings the decisions of binding `ns/name` in step with it.
    async fn decide(&self, ns: &str, name: &str) -> Result<(), StoreError> {
        let binding = self
            .bindings
            .get(ns, name)
            .filter(|b| b.metadata.deletion_timestamp.is_none());
        let wanted = binding
            .as_ref()
            .map(|b| wanted(name, &decisions_of(b)))
            .unwrap_or_default();
        let key = label_value(name);
        for (group, cache) in [(OCM_GROUP, &self.ocm), (SIG_GROUP, &self.sig)] {
            // By the owner label's index: scanning the namespace made each decision cost as
            // much as the namespace's bindings (quadratic over a policy selecting thousands).
            let mut current: Vec<Arc<Object>> = [OCM_PLACEMENT_LABEL, SIG_DECISION_KEY]
                .into_iter()
                .flat_map(|l| cache.with_label(l, &key))
                .filter(|o| o.namespace() == ns && owner_label(o) == Some(&key))
                .collect();
            current.sort_by(|a, b| a.name().cmp(b.name()));
            current.dedup_by(|a, b| a.name() == b.name());
            let names: BTreeSet<&str> = wanted
                .iter()
                .filter(|w| w.group == group)
                .map(|w| w.name.as_str())
                .collect();
            for o in &current {
                // Another binding's whose name makes the same label (a long name's hash) is
                // told apart by the owner.
                let ours = binding.as_ref().is_none_or(|b| {
                    o.metadata
                        .owner_references
                        .iter()
                        .any(|r| r.uid == b.metadata.uid)
                });
                if ours && !names.contains(o.name()) {
                    match self
                        .store
                        .delete(&key_of(group, ns, o.name()), &Preconditions::default())
                        .await
                    {
                        Ok(_) | Err(StoreError::NotFound { .. }) => {}
                        Err(e) => return Err(e),
                    }
                }
            }
            let Some(b) = &binding else { continue };
            for w in wanted.iter().filter(|w| w.group == group) {
                let k = key_of(group, ns, &w.name);
                let stored = match current.iter().find(|o| o.name() == w.name) {
                    Some(cur) if same(cur, w) => continue,
                    Some(_) => {
                        orrery_store::update_with(self.store.as_ref(), &k, |mut cur| {
                            if same(&cur, w) {
                                return Ok(None);
                            }
                            cur.metadata.labels = w.labels.clone();
                            put_body(&mut cur, w);
                            Ok(Some(cur))
                        })
                        .await
                    }
                    None => {
                        let mut o = new_object(api_version(group), KIND, Some(ns), &w.name);
                        o.metadata.labels = w.labels.clone();
                        o.metadata.owner_references = vec![OwnerReference::controller_of(b)];
                        put_body(&mut o, w);
                        self.store.create(&k, o).await
                    }
                };
                match stored {
                    Ok(o) => cache.upsert(o.clone(), o.revision().unwrap_or(0)),
                    // Its binding is going, or someone wrote it first: the event brings it.
                    Err(StoreError::NotFound { .. }) | Err(StoreError::AlreadyExists { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }
}

fn put_body(o: &mut Object, w: &Wanted) {
    if w.group == OCM_GROUP {
        o.status = w.body.get("status").cloned();
    } else if let Some(b) = w.body.as_object() {
        for (k, v) in b {
            o.other.insert(k.clone(), v.clone());
        }
    }
}

#[async_trait::async_trait]
impl Reconciler for Decisions {
    /// A binding's namespace and name.
    type Key = (String, String);
    type Error = StoreError;

    fn on_event(&mut self, source: Origin, ev: Event, keys: &mut Keys<Self::Key>) {
        match (source.name, ev) {
            // Everything again, decisions whose binding is gone too.
            (_, Event::Listed(_)) => keys.all(),
            ("bindings", Event::Upsert(o) | Event::Delete(o)) => {
                keys.push((o.namespace().to_string(), o.name().to_string()))
            }
            (_, Event::Upsert(o) | Event::Delete(o)) => keys.extend(owner_of(&o)),
        }
    }

    fn all_keys(&self) -> Vec<Self::Key> {
        let mut all: BTreeSet<Self::Key> = self
            .bindings
            .list()
            .iter()
            .map(|b| (b.namespace().to_string(), b.name().to_string()))
            .collect();
        // Decisions whose binding is gone.
        for o in self.ocm.list().iter().chain(self.sig.list().iter()) {
            all.extend(owner_of(o));
        }
        all.into_iter().collect()
    }

    async fn reconcile(&self, (ns, name): &Self::Key) -> Result<Action, StoreError> {
        self.decide(ns, name).await.map(|_| Action::Done)
    }
}

/// Runs the controller until shutdown.
pub async fn run(store: Arc<dyn Store>, metrics: Handle, shutdown: watch::Receiver<bool>) {
    let cache = |labels: &[&str]| Arc::new(Cache::new(labels));
    let owners = [OCM_PLACEMENT_LABEL, SIG_DECISION_KEY];
    let (bindings, ocm, sig) = (cache(&[]), cache(&owners), cache(&owners));
    let r = Decisions {
        store: store.clone(),
        bindings: bindings.clone(),
        ocm: ocm.clone(),
        sig: sig.clone(),
    };
    Controller::new("decisions", store, r, metrics)
        .source(Source::new("bindings", keys::well_known::bindings(None)).cached(bindings))
        .source(
            Source::new(
                "ocm",
                orrery_api::kinds::OCM_PLACEMENT_DECISION.prefix(None),
            )
            .cached(ocm),
        )
        .source(
            Source::new(
                "sig",
                orrery_api::kinds::SIG_PLACEMENT_DECISION.prefix(None),
            )
            .cached(sig),
        )
        // Bindings apart, concurrently: a listing of thousands writes as fast as the store
        // commits groups, not one write and one fsync at a time.
        .concurrency(64)
        .resync(std::time::Duration::from_secs(3600))
        .run(shutdown)
        .await;
}

/// The binding a stored decision belongs to (by its owner reference).
fn owner_of(o: &Object) -> Option<(String, String)> {
    o.metadata
        .owner_references
        .iter()
        .find(|r| r.kind == "ResourceBinding")
        .map(|r| (o.namespace().to_string(), r.name.clone()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn binding(clusters: Value) -> Object {
        Object::from_value(json!({
            "apiVersion": "multicluster.io/v1alpha1", "kind": "ResourceBinding",
            "metadata": {"name": "web-deployment", "namespace": "default"},
            "spec": {"clusters": clusters},
        }))
        .unwrap()
    }

    #[test]
    fn a_binding_decides_its_clusters_by_name() {
        let b = binding(
            json!([{"name": "b", "replicas": 2}, {"name": "a", "replicas": 3}, {"name": "c"}]),
        );
        assert_eq!(
            decisions_of(&b),
            vec![
                Decision {
                    cluster: "a".into(),
                    reason: "scheduled by orrery: 3 replica(s)".into()
                },
                Decision {
                    cluster: "b".into(),
                    reason: "scheduled by orrery: 2 replica(s)".into()
                },
                Decision {
                    cluster: "c".into(),
                    reason: "scheduled by orrery".into()
                },
            ]
        );
        assert!(decisions_of(&binding(json!([]))).is_empty());
    }

    #[test]
    fn decisions_split_at_a_hundred_in_both_shapes() {
        let cases = [(0, 1), (1, 1), (100, 1), (101, 2), (250, 3)];
        for (n, objects) in cases {
            let ds: Vec<Decision> = (0..n)
                .map(|i| Decision {
                    cluster: format!("c{i:03}"),
                    reason: "r".into(),
                })
                .collect();
            let w = wanted("web-deployment", &ds);
            let ocm: Vec<&Wanted> = w.iter().filter(|w| w.group == OCM_GROUP).collect();
            let sig: Vec<&Wanted> = w.iter().filter(|w| w.group == SIG_GROUP).collect();
            assert_eq!((ocm.len(), sig.len()), (objects, objects), "{n} decisions");
            let count = |w: &[&Wanted], at: &str| -> usize {
                w.iter()
                    .map(|w| w.body.pointer(at).unwrap().as_array().unwrap().len())
                    .sum()
            };
            assert_eq!(count(&ocm, "/status/decisions"), n);
            assert_eq!(count(&sig, "/decisions"), n);
            assert!(ocm.iter().chain(sig.iter()).all(|w| {
                w.body
                    .pointer("/status/decisions")
                    .or_else(|| w.body.pointer("/decisions"))
                    .unwrap()
                    .as_array()
                    .unwrap()
                    .len()
                    <= MAX_DECISIONS
            }));
            assert_eq!(ocm[0].name, "web-deployment-decision-1");
            assert_eq!(sig[0].name, "web-deployment-0");
            assert_eq!(
                sig[objects - 1].labels[SIG_DECISION_INDEX],
                (objects - 1).to_string()
            );
            assert_eq!(ocm[0].labels[OCM_PLACEMENT_LABEL], "web-deployment");
        }
        let w = wanted(
            "web-deployment",
            &[Decision {
                cluster: "east".into(),
                reason: "r".into(),
            }],
        );
        assert_eq!(
            w[0].body,
            json!({"status": {"decisions": [{"clusterName": "east", "reason": "r"}]}})
        );
        assert_eq!(
            w[1].body,
            json!({"decisions": [{"clusterProfileRef": {"name": "east", "namespace": "orrery-system"}, "reason": "r"}],
                   "schedulerName": "orrery"})
        );
    }

    #[test]
    fn long_names_make_valid_label_values() {
        assert_eq!(label_value("web-deployment"), "web-deployment");
        let long = "a".repeat(200);
        let v = label_value(&long);
        assert!(v.len() <= 63, "{v}");
        assert_ne!(v, label_value(&"a".repeat(199)));
        assert_eq!(v, label_value(&long), "stable");
    }
}
