//! Karmada's FederatedResourceQuotas: what each namespace's bindings use, each assigned
//! cluster's ResourceQuota, and what the members report of them ([`admission`] refuses the
//! template changes that would go over a limit; the scheduler refuses the decisions).
//!
//! For each quota, one pass makes three things what the quota says:
//! - `status.overall` is the spec's, and `status.overallUsed` the sum of what the namespace's
//!   bindings use ([`orrery_api::federated_quota::usage_of`]), for the names `overall` lists;
//! - each assignment to an existing cluster is a Work there holding a ResourceQuota of the
//!   quota's name and namespace (labelled with both, as Karmada's), changed when the
//!   assignment changes; a Work whose cluster is no longer assigned, or whose quota is gone,
//!   is deleted (also one found at start-up, for a quota deleted while Orrery was down);
//! - `status.aggregatedStatus` is each applied ResourceQuota's status in its member, by
//!   cluster name.
//!
//! Everything is written only when it differs from what is stored, so a restart writes
//! nothing and no member sees an operation.

pub mod admission;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use orrery_api::binding;
use orrery_api::cluster::{cluster_of_namespace, namespace_of};
use orrery_api::conditions;
use orrery_api::federated_quota::{
    self as fq, ClusterQuotaStatus, FederatedResourceQuotaSpec, FederatedResourceQuotaStatus,
    LABEL_NAME, LABEL_NAMESPACE,
};
use orrery_api::kinds::{FEDERATED_RESOURCE_QUOTA, RESOURCE_BINDING};
use orrery_api::meta::ResourceList;
use orrery_api::work::{self, WorkSpec, WorkStatus, Workload};
use orrery_api::{Object, keys};
use orrery_store::stamp::new_object;
use orrery_store::{Preconditions, Store, StoreError};
use serde_json::json;
use tokio::sync::watch;

use crate::runtime::cache::Cache;
use crate::runtime::controller::{Action, Controller, Keys, Origin, Reconciler, Source};
use crate::runtime::metrics::Handle;
use crate::runtime::reflector::Event;

/// A quota: namespace, name.
type Key = (String, String);

/// The Work that carries a quota's ResourceQuota to a member (named as a template's would
/// be: `<namespace>.<name>-resourcequota`).
pub fn work_name(namespace: &str, name: &str) -> String {
    binding::work_name(namespace, &binding::name_for("ResourceQuota", name))
}

/// What a stored binding uses ([`fq::usage_of`]), read in place: the scheduler and the
/// admission check sum it over a namespace's bindings, and a whole spec is not worth parsing
/// for two fields.
pub(crate) fn binding_use(b: &Object) -> ResourceList {
    let Some(spec) = b.spec.as_ref() else {
        return ResourceList::new();
    };
    let components: Vec<orrery_api::binding::Component> = (spec.get("components"))
        .and_then(|c| serde_json::from_value(c.clone()).ok())
        .unwrap_or_default();
    if components.len() > 1 {
        let sets = (spec
            .get("clusters")
            .and_then(serde_json::Value::as_array)
            .into_iter())
        .flatten()
        .filter(|c| c.get("replicas").and_then(serde_json::Value::as_i64) > Some(0))
        .count();
        return fq::whole_set_use(&components, sets as i64);
    }
    let placed: i64 = spec
        .get("clusters")
        .and_then(serde_json::Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("replicas")?.as_i64())
        .map(|n| n.max(0))
        .sum();
    let request: ResourceList = spec
        .pointer("/replicaRequirements/resourceRequest")
        .and_then(|r| serde_json::from_value(r.clone()).ok())
        .unwrap_or_default();
    fq::times(&request, placed)
}

/// Whether a stored binding's template is of `namespace` (bindings of cluster-scoped
/// templates, kept in the system namespace, count in none).
pub(crate) fn template_in(b: &Object, namespace: &str) -> bool {
    b.spec
        .as_ref()
        .and_then(|s| s.pointer("/resource/namespace"))
        .and_then(serde_json::Value::as_str)
        == Some(namespace)
}

/// What a namespace's bindings use, summed.
pub fn namespace_use<'a>(
    namespace: &str,
    bindings: impl IntoIterator<Item = &'a Object>,
) -> ResourceList {
    bindings
        .into_iter()
        .filter(|b| template_in(b, namespace))
        .fold(ResourceList::new(), |acc, b| fq::add(&acc, &binding_use(b)))
}

/// The ResourceQuota a member gets for an assignment.
fn member_quota(namespace: &str, name: &str, hard: &ResourceList) -> serde_json::Value {
    json!({
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {LABEL_NAMESPACE: namespace, LABEL_NAME: name},
        },
        "spec": {"hard": hard},
    })
}

/// Whether a stored Work may be one of a quota's: the rest are not parsed.
fn keep_work(json: &[u8]) -> bool {
    memchr::memmem::find(json, LABEL_NAME.as_bytes()).is_some()
}

/// The quota a Work was made for, from its labels.
fn quota_of(w: &Object) -> Option<Key> {
    let l = &w.metadata.labels;
    Some((l.get(LABEL_NAMESPACE)?.clone(), l.get(LABEL_NAME)?.clone()))
}

/// A member's report of its ResourceQuota, once the Work is applied there.
fn reported(w: &Object) -> Option<ClusterQuotaStatus> {
    let cluster = cluster_of_namespace(w.namespace())?;
    let status: WorkStatus = serde_json::from_value(w.status.clone()?).ok()?;
    let applied = conditions::find(&status.conditions, work::CONDITION_APPLIED)?;
    if !applied.is_true() {
        return None;
    }
    let s = status.manifest_statuses.first()?.status.clone()?;
    #[derive(serde::Deserialize, Default)]
    struct QuotaStatus {
        #[serde(default)]
        hard: ResourceList,
        #[serde(default)]
        used: ResourceList,
    }
    let q: QuotaStatus = serde_json::from_value(s).unwrap_or_default();
    Some(ClusterQuotaStatus {
        cluster_name: cluster.to_string(),
        hard: q.hard,
        used: q.used,
    })
}

struct Quotas {
    store: Arc<dyn Store>,
    quotas: Arc<Cache>,
    bindings: Arc<Cache>,
    works: Arc<Cache>,
    clusters: Arc<Cache>,
}

impl Quotas {
    fn works_of(&self, (ns, name): &Key) -> Vec<Arc<Object>> {
        self.works
            .with_label(LABEL_NAME, name)
            .into_iter()
            .filter(|w| w.metadata.labels.get(LABEL_NAMESPACE) == Some(ns))
            .collect()
    }

    /// Makes the quota's Works what its assignments say; `Err` when a write failed.
    async fn sync_works(
        &self,
        k: &Key,
        spec: Option<&FederatedResourceQuotaSpec>,
        have: &[Arc<Object>],
    ) -> Result<(), StoreError> {
        let (ns, name) = k;
        let wname = work_name(ns, name);
        let mut wanted: BTreeMap<String, WorkSpec> = BTreeMap::new();
        for a in spec.map(|s| s.static_assignments.as_slice()).unwrap_or(&[]) {
            // Karmada's: an assignment to a cluster that has not joined waits for it.
            if self.clusters.get("", &a.cluster_name).is_none() {
                continue;
            }
            wanted
                .entry(namespace_of(&a.cluster_name))
                .or_insert(WorkSpec {
                    workload: Workload {
                        manifests: vec![member_quota(ns, name, &a.hard)],
                    },
                    ..Default::default()
                });
        }
        let mut failed = None;
        for (wns, spec) in &wanted {
            let value = serde_json::to_value(spec).ok();
            let key = keys::well_known::work(wns, &wname);
            let current = have.iter().find(|w| w.namespace() == wns);
            let r = match current {
                Some(w) if w.spec == value => Ok(()),
                Some(w) => {
                    let mut next = (**w).clone();
                    next.spec = value;
                    next.metadata.generation = Some(w.metadata.generation.unwrap_or(1) + 1);
                    self.store
                        .update(&key, next, w.revision())
                        .await
                        .map(|_| ())
                }
                None => {
                    let mut w = new_object(binding::API_VERSION, "Work", Some(wns), &wname);
                    w.metadata.labels.insert(LABEL_NAMESPACE.into(), ns.clone());
                    w.metadata.labels.insert(LABEL_NAME.into(), name.clone());
                    w.spec = value;
                    match self.store.create(&key, w).await {
                        Ok(_) | Err(StoreError::AlreadyExists { .. }) => Ok(()),
                        Err(e) => Err(e),
                    }
                }
            };
            if let Err(e) = r {
                tracing::debug!(quota = %name, namespace = %ns, work = %wns, error = %e, "writing a quota's Work failed; tried again");
                failed = Some(e);
            }
        }
        for w in have.iter().filter(|w| !wanted.contains_key(w.namespace())) {
            // Conditional on the uid seen: a Work made anew meanwhile stays.
            let pre = Preconditions {
                uid: Some(w.metadata.uid.clone()),
                revision: None,
            };
            match self
                .store
                .delete(&keys::well_known::work(w.namespace(), w.name()), &pre)
                .await
            {
                Ok(_) | Err(StoreError::NotFound { .. }) | Err(StoreError::Conflict { .. }) => {
                    tracing::info!(quota = %name, namespace = %ns, cluster = cluster_of_namespace(w.namespace()).unwrap_or_default(), "a member's part of a federated quota is withdrawn");
                }
                Err(e) => failed = Some(e),
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// The status the quota should have.
    fn status_of(
        &self,
        ns: &str,
        spec: &FederatedResourceQuotaSpec,
        have: &[Arc<Object>],
    ) -> FederatedResourceQuotaStatus {
        let bindings = self.bindings.in_namespace(ns);
        let used = namespace_use(ns, bindings.iter().map(|b| b.as_ref()));
        let mut aggregated: Vec<ClusterQuotaStatus> =
            have.iter().filter_map(|w| reported(w)).collect();
        aggregated.sort_by(|a, b| a.cluster_name.cmp(&b.cluster_name));
        FederatedResourceQuotaStatus {
            overall: spec.overall.clone(),
            overall_used: fq::counted(&used, &spec.overall),
            aggregated_status: aggregated,
        }
    }
}

#[async_trait::async_trait]
impl Reconciler for Quotas {
    type Key = Key;
    type Error = StoreError;

    fn on_event(&mut self, origin: Origin, ev: Event, keys: &mut Keys<Key>) {
        let of = |o: &Object| (o.namespace().to_string(), o.name().to_string());
        match (origin.name, ev) {
            ("quotas", Event::Listed(_)) | ("clusters", _) => keys.all(),
            ("quotas", Event::Upsert(o) | Event::Delete(o)) => keys.push(of(&o)),
            // A Work of a quota gone while Orrery was down is found here, and deleted.
            ("works", Event::Listed(items)) => items
                .iter()
                .filter_map(|w| quota_of(w))
                .for_each(|k| keys.push(k)),
            ("works", Event::Upsert(w) | Event::Delete(w)) => {
                if let Some(k) = quota_of(&w) {
                    keys.push(k);
                }
            }
            ("bindings", Event::Listed(_)) => keys.all(),
            ("bindings", Event::Upsert(b) | Event::Delete(b)) => {
                for q in self.quotas.in_namespace(b.namespace()) {
                    keys.push(of(&q));
                }
            }
            _ => {}
        }
    }

    fn all_keys(&self) -> Vec<Key> {
        self.quotas
            .list()
            .iter()
            .map(|o| (o.namespace().to_string(), o.name().to_string()))
            .collect()
    }

    async fn reconcile(&self, k: &Key) -> Result<Action, StoreError> {
        let (ns, name) = k;
        let have = self.works_of(k);
        let quota = self
            .quotas
            .get(ns, name)
            .filter(|q| q.metadata.deletion_timestamp.is_none());
        let Some(q) = quota else {
            self.sync_works(k, None, &have).await?;
            return Ok(Action::Done);
        };
        let Some(spec) = q
            .spec
            .clone()
            .and_then(|s| serde_json::from_value::<FederatedResourceQuotaSpec>(s).ok())
        else {
            return Ok(Action::Done);
        };
        let synced = self.sync_works(k, Some(&spec), &have).await;
        let status = self.status_of(ns, &spec, &have);
        let current: FederatedResourceQuotaStatus = q
            .status
            .clone()
            .and_then(|s| serde_json::from_value(s).ok())
            .unwrap_or_default();
        if status != current {
            let mut next = (*q).clone();
            next.status = serde_json::to_value(&status).ok();
            match self
                .store
                .update(&FEDERATED_RESOURCE_QUOTA.key(ns, name), next, q.revision())
                .await
            {
                Ok(_) | Err(StoreError::NotFound { .. }) => {}
                // Changed meanwhile: its event brings another pass.
                Err(StoreError::Conflict { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        synced.map(|_| Action::Done)
    }
}

/// Runs the federated quotas until shutdown.
pub async fn run(store: Arc<dyn Store>, metrics: Handle, shutdown: watch::Receiver<bool>) {
    let quotas = Arc::new(Cache::new(&[]));
    let bindings = Arc::new(Cache::new(&[]));
    let works = Arc::new(Cache::new(&[LABEL_NAME]));
    let clusters = Arc::new(Cache::new(&[]));
    let q = Quotas {
        store: store.clone(),
        quotas: quotas.clone(),
        bindings: bindings.clone(),
        works: works.clone(),
        clusters: clusters.clone(),
    };
    Controller::new("federated-quota", store, q, metrics)
        .backoff(Duration::from_millis(200), Duration::from_secs(30))
        .source(Source::new("quotas", FEDERATED_RESOURCE_QUOTA.prefix(None)).cached(quotas))
        .source(Source::new("bindings", RESOURCE_BINDING.prefix(None)).cached(bindings))
        .source(
            Source::new("works", keys::well_known::works(None))
                .filtered(keep_work)
                .cached(works),
        )
        .source(Source::new("clusters", keys::well_known::clusters()).cached(clusters))
        .run(shutdown)
        .await;
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn binding(ns: &str, request: &str, placed: &[i64]) -> Object {
        let mut b = new_object(binding::API_VERSION, binding::KIND, Some(ns), "b");
        let spec = binding::BindingSpec {
            resource: binding::ObjectReference {
                api_version: "apps/v1".into(),
                kind: "Deployment".into(),
                namespace: ns.into(),
                name: "web".into(),
                ..Default::default()
            },
            replica_requirements: Some(binding::ReplicaRequirements {
                resource_request: [("cpu".to_string(), request.parse().unwrap())].into(),
            }),
            clusters: placed
                .iter()
                .enumerate()
                .map(|(i, n)| binding::TargetCluster {
                    name: format!("c{i}"),
                    replicas: *n,
                })
                .collect(),
            ..Default::default()
        };
        b.spec = Some(serde_json::to_value(spec).unwrap());
        b
    }

    #[test]
    fn a_namespace_uses_what_its_bindings_place() {
        let a = binding("team", "100m", &[2, 1]);
        let b = binding("team", "1", &[1]);
        let other = binding("elsewhere", "1", &[5]);
        let used = namespace_use("team", [&a, &b, &other]);
        assert_eq!(used.get("cpu").unwrap().to_string(), "1300m");
    }

    #[test]
    fn a_member_reports_its_quota_once_applied() {
        let mut w = new_object(
            binding::API_VERSION,
            "Work",
            Some(&namespace_of("east")),
            "w",
        );
        w.status = Some(json!({
            "conditions": [{"type": "Applied", "status": "False", "reason": "x", "message": ""}],
            "manifestStatuses": [{"identifier": {"ordinal": 0, "version": "v1", "kind": "ResourceQuota", "name": "q"},
                                  "status": {"hard": {"cpu": "1"}, "used": {"cpu": "200m"}}}],
        }));
        assert!(reported(&w).is_none(), "not applied yet");
        w.status.as_mut().unwrap()["conditions"][0]["status"] = json!("True");
        let r = reported(&w).unwrap();
        assert_eq!(r.cluster_name, "east");
        assert_eq!(r.used.get("cpu").unwrap().to_string(), "200m");
        assert!(keep_work(
            serde_json::to_vec(&member_quota("n", "q", &ResourceList::new()))
                .unwrap()
                .as_slice()
        ));
    }
}
