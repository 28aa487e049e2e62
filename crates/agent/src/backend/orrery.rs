//! A member that is itself an Orrery control plane (hierarchies deeper than two levels): a
//! regional Orrery joins a global one as one member. What its agent receives is applied there
//! as templates (through the Kubernetes API, as the kube backend applies to any member), with a
//! `ClusterPropagationPolicy` of its own that its scheduler uses to divide them further among
//! its members; what it reports upward is its fleet summed: capacity and use of its Ready
//! members, their nodes, the largest free node among them. Status flows up as its templates'
//! status, which it sums from its own members.

use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};

use async_trait::async_trait;
use orrery_api::cluster::{
    CONDITION_READY, ClusterStatus, NodeSummary, ResourceList, ResourceSummary,
};
use orrery_api::stateful::{Transfer, TransferStatus};
use orrery_api::work::{MANAGED_LABEL, MANAGED_VALUE, ResourceIdentifier};
use serde_json::{Value, json};

use super::kube::KubeMember;
use super::{Backend, BackendError, Cause, MemberReport, ObjectState, ProxyBody};

/// The policy in the child that places what the parent sends.
pub const POLICY: &str = "orrery-parent";

/// A child Orrery control plane, driven through its Kubernetes API.
pub struct OrreryMember {
    kube: KubeMember,
    client: kube::Client,
    /// The kinds the child's policy selects so far (`apiVersion`, `kind`).
    selected: Mutex<BTreeSet<(String, String)>>,
}

impl std::fmt::Debug for OrreryMember {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OrreryMember")
            .field("selected", &self.selected)
            .finish_non_exhaustive()
    }
}

impl OrreryMember {
    pub fn new(client: kube::Client) -> Self {
        OrreryMember {
            kube: KubeMember::new(client.clone()),
            client,
            selected: Mutex::new(BTreeSet::new()),
        }
    }

    /// The child's policy for the kinds it is sent: every object the parent applies (they
    /// carry Orrery's managed-by label) divided among the child's members by its own
    /// scheduler (water levels, as at any level).
    fn policy(kinds: &BTreeSet<(String, String)>) -> Value {
        let selectors: Vec<Value> = kinds
            .iter()
            .map(|(api_version, kind)| {
                json!({"apiVersion": api_version, "kind": kind,
                       "labelSelector": {"matchLabels": {MANAGED_LABEL: MANAGED_VALUE}}})
            })
            .collect();
        json!({
            "apiVersion": "policy.karmada.io/v1alpha1",
            "kind": "ClusterPropagationPolicy",
            "metadata": {"name": POLICY, "labels": {MANAGED_LABEL: MANAGED_VALUE}},
            "spec": {
                "resourceSelectors": selectors,
                "placement": {"replicaScheduling": {"replicaSchedulingType": "Divided"}},
            },
        })
    }

    /// Makes sure the child's policy selects the kind of `manifest`.
    async fn select(&self, manifest: &Value, cause: &Cause) -> Result<(), BackendError> {
        let (Some(api_version), Some(kind)) = (
            manifest.get("apiVersion").and_then(Value::as_str),
            manifest.get("kind").and_then(Value::as_str),
        ) else {
            return Ok(());
        };
        let key = (api_version.to_string(), kind.to_string());
        let kinds = {
            let mut selected = self.selected.lock();
            if !selected.insert(key.clone()) {
                return Ok(());
            }
            selected.clone()
        };
        let applied = self.kube.apply(&Self::policy(&kinds), true, cause).await;
        if applied.is_err() {
            self.selected.lock().remove(&key);
        }
        applied
    }
}

/// The child's fleet summed: (Ready members, members, capacity, nodes, largest free node).
fn fleet_of(
    clusters: &[orrery_api::Object],
) -> (i64, i64, ResourceSummary, NodeSummary, ResourceList) {
    let mut sum = ResourceSummary::default();
    let mut nodes = NodeSummary::default();
    let mut largest = ResourceList::new();
    let mut ready = 0;
    let add = |to: &mut ResourceList, from: &ResourceList| {
        for (k, q) in from {
            let e = to.entry(k.clone()).or_default();
            *e = *e + *q;
        }
    };
    for c in clusters {
        let st = ClusterStatus::of(c);
        let is_ready = orrery_api::conditions::find(&st.conditions, CONDITION_READY)
            .is_some_and(|c| c.is_true());
        if !is_ready || c.metadata.deletion_timestamp.is_some() {
            continue;
        }
        ready += 1;
        if let Some(r) = &st.resource_summary {
            add(&mut sum.allocatable, &r.allocatable);
            add(&mut sum.allocated, &r.allocated);
            add(&mut sum.allocating, &r.allocating);
            add(&mut sum.usage, &r.usage);
        }
        if let Some(n) = &st.node_summary {
            nodes.total_num += n.total_num;
            nodes.ready_num += n.ready_num;
        }
        for (k, q) in &st.largest_node_free {
            let e = largest.entry(k.clone()).or_default();
            if *q > *e {
                *e = *q;
            }
        }
    }
    (ready, clusters.len() as i64, sum, nodes, largest)
}

#[async_trait]
impl Backend for OrreryMember {
    async fn apply(
        &self,
        manifest: &Value,
        overwrite: bool,
        cause: &Cause,
    ) -> Result<(), BackendError> {
        self.select(manifest, cause).await?;
        self.kube.apply(manifest, overwrite, cause).await
    }

    async fn observed(&self, id: &ResourceIdentifier) -> Result<Option<Value>, BackendError> {
        self.kube.observed(id).await
    }

    async fn delete(&self, id: &ResourceIdentifier, cause: &Cause) -> Result<(), BackendError> {
        self.kube.delete(id, cause).await
    }

    fn state_stamp(&self, id: &ResourceIdentifier) -> Option<u64> {
        self.kube.state_stamp(id)
    }

    async fn state(&self, id: &ResourceIdentifier) -> Result<Option<ObjectState>, BackendError> {
        self.kube.state(id).await
    }

    async fn report(&self) -> Result<MemberReport, BackendError> {
        let unavailable = |e: kube::Error| BackendError::Unavailable(e.to_string());
        let req = http::Request::get("/apis/multicluster.io/v1alpha1/clusters")
            .body(Vec::new())
            .map_err(|e| BackendError::Unavailable(e.to_string()))?;
        let list: Value = self.client.request(req).await.map_err(unavailable)?;
        let clusters: Vec<orrery_api::Object> = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| orrery_api::Object::from_value(c.clone()).ok())
            .collect();
        let version = self.client.apiserver_version().await.map_err(unavailable)?;
        let (ready, total, resource_summary, node_summary, largest) = fleet_of(&clusters);
        let mut properties = BTreeMap::new();
        properties.insert("hierarchy.orrery.io/members".into(), total.to_string());
        properties.insert(
            "hierarchy.orrery.io/ready-members".into(),
            ready.to_string(),
        );

        Ok(MemberReport {
            healthy: ready > 0,
            message: format!("an Orrery control plane: {ready} of {total} members ready"),
            kubernetes_version: version.git_version,
            // What the child serves is what it takes as templates.
            api_enablements: self.kube.enablements().await,
            node_summary,
            resource_summary,
            largest_node_free: largest,
            network: None,
            properties,
            storage_classes: Vec::new(),
            data_sets: Vec::new(),
            service_exports: Vec::new(),
            nodes: Vec::new(),
        })
    }

    async fn set_transfers(&self, work: &str, transfers: &[Transfer]) -> Result<(), BackendError> {
        self.kube.set_transfers(work, transfers).await
    }

    async fn transfer_statuses(&self, work: &str, transfers: &[Transfer]) -> Vec<TransferStatus> {
        self.kube.transfer_statuses(work, transfers).await
    }

    fn transfer_stamp(&self) -> Option<u64> {
        self.kube.transfer_stamp()
    }

    fn milestone(&self) -> u64 {
        self.kube.milestone()
    }

    async fn proxy(&self, req: http::Request<bytes::Bytes>) -> http::Response<ProxyBody> {
        self.kube.proxy(req).await
    }

    async fn proxy_upgrade(
        &self,
        req: http::request::Parts,
        upgrade: hyper::upgrade::OnUpgrade,
    ) -> http::Response<ProxyBody> {
        self.kube.proxy_upgrade(req, upgrade).await
    }

    fn changed(&self) -> tokio::sync::watch::Receiver<u64> {
        self.kube.changed()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn cluster(name: &str, ready: bool, cpu: &str, free: &str) -> orrery_api::Object {
        orrery_api::Object::from_value(json!({
            "apiVersion": "multicluster.io/v1alpha1", "kind": "Cluster",
            "metadata": {"name": name},
            "status": {
                "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}, "reason": "x", "message": ""}],
                "nodeSummary": {"totalNum": 4, "readyNum": 4},
                "resourceSummary": {"allocatable": {"cpu": cpu, "memory": "64Gi"}, "allocated": {"cpu": "2"}},
                "largestNodeFree": {"cpu": free},
            },
        }))
        .unwrap()
    }

    #[test]
    fn a_child_fleet_is_summed_over_its_ready_members() {
        let cs = [
            cluster("a", true, "32", "6"),
            cluster("b", true, "16", "7"),
            cluster("c", false, "64", "60"),
        ];
        let (ready, total, sum, nodes, largest) = fleet_of(&cs);
        assert_eq!((ready, total), (2, 3));
        assert_eq!(sum.allocatable["cpu"], "48".parse().unwrap());
        assert_eq!(sum.allocatable["memory"], "128Gi".parse().unwrap());
        assert_eq!(sum.allocated["cpu"], "4".parse().unwrap());
        assert_eq!((nodes.total_num, nodes.ready_num), (8, 8));
        // The largest free node of any ready member, not a sum.
        assert_eq!(largest["cpu"], "7".parse().unwrap());
    }

    #[test]
    fn the_childs_policy_selects_each_kind_sent_by_its_label() {
        let kinds = BTreeSet::from([
            ("apps/v1".to_string(), "Deployment".to_string()),
            ("v1".to_string(), "ConfigMap".to_string()),
        ]);
        let p = OrreryMember::policy(&kinds);
        assert_eq!(p["kind"], "ClusterPropagationPolicy");
        let s = p["spec"]["resourceSelectors"].as_array().unwrap();
        assert_eq!(s.len(), 2);
        assert!(
            s.iter()
                .all(|x| x["labelSelector"]["matchLabels"][MANAGED_LABEL] == MANAGED_VALUE)
        );
        assert_eq!(
            p["spec"]["placement"]["replicaScheduling"]["replicaSchedulingType"],
            "Divided"
        );
    }
}
