//! A real member cluster, through its Kubernetes API (the `kube` crate).
//!
//! - Objects are applied with server-side apply as field manager `orrery`, so fields other
//!   managers own (an HPA's replicas, say) are left alone; a missing namespace is created.
//! - Applied kinds are watched (label `multicluster.io/managed-by=orrery`), so status changes
//!   reach the agent without polling, and states are read from that cache.
//! - Capacity comes from Nodes (allocatable, readiness) and Pods (requests of placed and of
//!   pending pods); the largest free node is computed per node. Usage, without a metrics API,
//!   is what is requested.
//! - Volume data moves between members through [`mover`] (CSI snapshots and restic Jobs).

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use kube::discovery::Scope;
use kube::runtime::watcher;
use orrery_api::Quantity;
use orrery_api::cluster::{
    ApiEnablement, ApiResourceRef, GPU_RESOURCE, NodeSummary, ResourceList, ResourceSummary,
};
use orrery_api::work::{MANAGED_LABEL, MANAGED_VALUE, ResourceIdentifier};
use serde_json::{Value, json};
use tokio::time::Instant;

use super::{Backend, BackendError, Cause, MemberReport, ObjectState};
use orrery_api::stateful::{Transfer, TransferStatus};

pub mod mover;

const FIELD_MANAGER: &str = "orrery";
/// Items per page when listing nodes and pods: small pages keep the agent's memory flat.
const PAGE: usize = 200;

type Gvk = (String, String, String);
type Key = (String, String, String, String);

/// A member cluster's Kubernetes API.
pub struct KubeMember {
    client: kube::Client,
    resources: Mutex<HashMap<Gvk, (ApiResource, bool)>>,
    watched: Mutex<HashSet<Gvk>>,
    cache: Arc<Mutex<HashMap<Key, Value>>>,
    enablements: Mutex<Option<(Instant, Vec<ApiEnablement>)>>,
    changed: Arc<tokio::sync::watch::Sender<u64>>,
    mover: Arc<mover::Mover>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// The data sets last listed: a list that fails reports these, so that a passing error
    /// does not make a copy vanish (and a reader there ask for another).
    held: Mutex<Vec<orrery_api::data::HeldDataSet>>,
}

impl std::fmt::Debug for KubeMember {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeMember").finish_non_exhaustive()
    }
}

impl Drop for KubeMember {
    fn drop(&mut self) {
        for t in self.tasks.lock().drain(..) {
            t.abort();
        }
    }
}

fn unavailable(e: impl std::fmt::Display) -> BackendError {
    BackendError::Unavailable(e.to_string())
}

/// Maps a member's answer to a backend error.
fn member_error(what: &str, e: kube::Error) -> BackendError {
    match e {
        // The agent's own credentials refused (a token being rotated, say): the member is
        // out of reach until they are good again, and what failed is retried then. A 403 is
        // an answer about the object (RBAC): reported, not retried in a loop.
        kube::Error::Api(s) if s.code == 401 => unavailable(format!(
            "the member refused the agent's credentials: {}",
            s.message
        )),
        kube::Error::Api(s) if (400..500).contains(&s.code) && s.code != 429 => {
            BackendError::Rejected {
                what: what.to_string(),
                message: s.message,
            }
        }
        other => unavailable(other),
    }
}

fn key_of(id: &ResourceIdentifier) -> Key {
    (
        id.group.clone(),
        id.kind.clone(),
        id.namespace.clone(),
        id.name.clone(),
    )
}

fn key_of_value(v: &Value) -> Option<Key> {
    let id = ResourceIdentifier::of(0, v)?;
    Some(key_of(&id))
}

fn managed(v: &Value) -> bool {
    v.pointer("/metadata/labels")
        .and_then(|l| l.get(MANAGED_LABEL))
        .and_then(Value::as_str)
        == Some(MANAGED_VALUE)
}

fn add_to(list: &mut ResourceList, name: &str, q: Quantity) {
    let slot = list.entry(name.to_string()).or_default();
    *slot = slot.checked_add(&q).unwrap_or(*slot);
}

/// The label selector query of a workload's pods (`None`: not a workload with pods and a
/// selector).
fn pods_query(obj: &Value) -> Option<String> {
    let kind = obj.get("kind")?.as_str()?;
    if !matches!(
        kind,
        "Deployment" | "StatefulSet" | "ReplicaSet" | "DaemonSet"
    ) {
        return None;
    }
    let sel: orrery_api::labels::LabelSelector =
        serde_json::from_value(obj.pointer("/spec/selector")?.clone()).ok()?;
    let selector = sel.to_selector().ok()?.to_string();
    if selector.is_empty() {
        return None;
    }
    Some(
        form_urlencoded::Serializer::new(String::new())
            .append_pair("labelSelector", &selector)
            .finish(),
    )
}

/// A pod as the usage of a workload needs it.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct UsagePod {
    #[serde(default)]
    metadata: UsageMeta,
    #[serde(default)]
    spec: UsagePodSpec,
    #[serde(default)]
    status: UsagePodStatus,
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct UsageMeta {
    #[serde(default)]
    name: String,
    #[serde(default)]
    deletion_timestamp: Option<String>,
}

#[derive(Debug, Default, serde::Deserialize)]
struct UsagePodSpec {
    #[serde(default)]
    containers: Vec<UsageContainer>,
}

#[derive(Debug, Default, serde::Deserialize)]
struct UsageContainer {
    #[serde(default)]
    resources: UsageResources,
    /// In a PodMetrics: what the container uses.
    #[serde(default)]
    usage: BTreeMap<String, String>,
}

#[derive(Debug, Default, serde::Deserialize)]
struct UsageResources {
    #[serde(default)]
    requests: BTreeMap<String, String>,
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct UsagePodStatus {
    #[serde(default)]
    conditions: Vec<UsageCondition>,
    #[serde(default)]
    container_statuses: Vec<UsageContainerStatus>,
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct UsageContainerStatus {
    #[serde(default)]
    restart_count: i64,
}

#[derive(Debug, Default, serde::Deserialize)]
struct UsageCondition {
    #[serde(rename = "type", default)]
    type_: String,
    #[serde(default)]
    status: String,
}

/// A PodMetrics (metrics.k8s.io/v1beta1).
#[derive(Debug, Default, serde::Deserialize)]
struct PodMetrics {
    #[serde(default)]
    metadata: UsageMeta,
    #[serde(default)]
    containers: Vec<UsageContainer>,
}

/// Millicores of cpu and bytes of memory, summed over resource lists (requests or usage).
fn sum_of<'a>(containers: impl Iterator<Item = &'a BTreeMap<String, String>>) -> (i64, i64) {
    let mut cpu = 0;
    let mut memory = 0;
    for m in containers {
        let q = |k: &str| m.get(k).and_then(|v| v.parse::<Quantity>().ok());
        if let Some(c) = q("cpu") {
            cpu += c.milli_value() as i64;
        }
        if let Some(b) = q("memory") {
            memory += b.value() as i64;
        }
    }
    (cpu, memory)
}

/// A page of a list, with only what the capacity figures need (serde skips the rest).
#[derive(Debug, Default, serde::Deserialize)]
struct Page<T> {
    #[serde(default = "Vec::new")]
    items: Vec<T>,
    #[serde(default)]
    metadata: PageMeta,
}

#[derive(Debug, Default, serde::Deserialize)]
struct PageMeta {
    #[serde(rename = "continue", default)]
    next: Option<String>,
}

#[derive(Debug, serde::Deserialize)]
struct MiniNode {
    #[serde(default)]
    metadata: MiniNodeMeta,
    #[serde(default)]
    spec: MiniNodeSpec,
    #[serde(default)]
    status: MiniNodeStatus,
}

/// A node's name, and the one label read (the GPU product NVIDIA's feature discovery sets).
#[derive(Debug, Default, serde::Deserialize)]
struct MiniNodeMeta {
    #[serde(default)]
    name: String,
    #[serde(default, deserialize_with = "gpu_product_only")]
    labels: Option<String>,
}

/// The label `nvidia.com/gpu.product` of a node's labels, the rest skipped.
fn gpu_product_only<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let labels: BTreeMap<String, String> = serde::Deserialize::deserialize(d)?;
    Ok(labels.get(GPU_PRODUCT_LABEL).cloned())
}

/// The member's GPU facts for data-aware scheduling: the model most of its GPUs are (from
/// the nodes' labels) and its performance from Orrery's table, unless the member's own
/// ClusterProperty objects already say.
fn with_gpu_facts(
    mut properties: BTreeMap<String, String>,
    models: &BTreeMap<String, i128>,
) -> BTreeMap<String, String> {
    let Some((model, _)) = models.iter().max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0))) else {
        return properties;
    };
    let model = properties
        .entry(orrery_api::data::GPU_MODEL_PROPERTY.to_string())
        .or_insert_with(|| model.clone())
        .clone();
    properties
        .entry(orrery_api::data::GPU_PERFORMANCE_PROPERTY.to_string())
        .or_insert_with(|| orrery_api::data::gpu_performance(&model).to_string());
    properties
}

/// Where NVIDIA's GPU feature discovery names a node's GPU model.
const GPU_PRODUCT_LABEL: &str = "nvidia.com/gpu.product";

#[derive(Debug, Default, serde::Deserialize)]
struct MiniNodeSpec {
    #[serde(default)]
    unschedulable: bool,
}

#[derive(Debug, Default, serde::Deserialize)]
struct MiniNodeStatus {
    #[serde(default)]
    allocatable: BTreeMap<String, Value>,
    #[serde(default)]
    conditions: Vec<MiniCondition>,
}

#[derive(Debug, serde::Deserialize)]
struct MiniCondition {
    #[serde(rename = "type")]
    type_: String,
    #[serde(default)]
    status: String,
}

#[derive(Debug, serde::Deserialize)]
struct MiniPod {
    #[serde(default)]
    spec: MiniPodSpec,
    #[serde(default)]
    status: MiniPodStatus,
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct MiniPodSpec {
    #[serde(default)]
    node_name: Option<String>,
    #[serde(default)]
    containers: Vec<MiniContainer>,
    #[serde(default)]
    init_containers: Vec<MiniContainer>,
}

#[derive(Debug, Default, serde::Deserialize)]
struct MiniContainer {
    #[serde(default)]
    resources: MiniResources,
}

#[derive(Debug, Default, serde::Deserialize)]
struct MiniResources {
    #[serde(default)]
    requests: BTreeMap<String, Value>,
}

#[derive(Debug, Default, serde::Deserialize)]
struct MiniPodStatus {
    #[serde(default)]
    phase: Option<String>,
}

/// A quantity as the API writes it (a string, or a bare number).
fn quantity_of(v: &Value) -> Quantity {
    match v {
        Value::String(s) => s.parse().unwrap_or_default(),
        Value::Number(n) => n.to_string().parse().unwrap_or_default(),
        _ => Quantity::default(),
    }
}

/// A pod's requests: the sum over containers, the larger of that and any init container.
fn pod_requests(spec: &MiniPodSpec) -> ResourceList {
    let mut sum = ResourceList::new();
    for c in &spec.containers {
        for (k, v) in &c.resources.requests {
            add_to(&mut sum, k, quantity_of(v));
        }
    }
    for c in &spec.init_containers {
        for (k, v) in &c.resources.requests {
            let q = quantity_of(v);
            let slot = sum.entry(k.clone()).or_default();
            if q > *slot {
                *slot = q;
            }
        }
    }
    sum
}

impl KubeMember {
    pub fn new(client: kube::Client) -> Self {
        let (tx, _) = tokio::sync::watch::channel(0);
        let changed = Arc::new(tx);
        let cache = Arc::new(Mutex::new(HashMap::new()));
        KubeMember {
            mover: Arc::new(mover::Mover::new(
                client.clone(),
                cache.clone(),
                changed.clone(),
            )),
            client,
            resources: Mutex::new(HashMap::new()),
            watched: Mutex::new(HashSet::new()),
            cache,
            enablements: Mutex::new(None),
            changed,
            tasks: Mutex::new(Vec::new()),
            held: Mutex::new(Vec::new()),
        }
    }

    /// Lists `path` a page at a time, handing each item to `f`.
    async fn each_page<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        mut f: impl FnMut(T),
    ) -> Result<(), BackendError> {
        let mut next: Option<String> = None;
        loop {
            let sep = if path.contains('?') { '&' } else { '?' };
            let uri = match &next {
                Some(c) => format!("{path}{sep}limit={PAGE}&continue={c}"),
                None => format!("{path}{sep}limit={PAGE}"),
            };
            let req = http::Request::get(uri)
                .body(Vec::new())
                .map_err(unavailable)?;
            let page: Page<T> = self.client.request(req).await.map_err(unavailable)?;
            page.items.into_iter().for_each(&mut f);
            match page.metadata.next.filter(|c| !c.is_empty()) {
                Some(c) => next = Some(c),
                None => return Ok(()),
            }
        }
    }

    async fn resolve(
        &self,
        group: &str,
        version: &str,
        kind: &str,
    ) -> Result<(ApiResource, bool), BackendError> {
        let gvk: Gvk = (group.into(), version.into(), kind.into());
        if let Some(r) = self.resources.lock().get(&gvk) {
            return Ok(r.clone());
        }
        let (ar, caps) = kube::discovery::pinned_kind(
            &self.client,
            &GroupVersionKind::gvk(group, version, kind),
        )
        .await
        .map_err(|e| match e {
            kube::Error::Api(s) if s.code != 404 && s.code < 500 => {
                member_error(kind, kube::Error::Api(s))
            }
            kube::Error::Discovery(d) => BackendError::Rejected {
                what: format!("{kind} {group}/{version}"),
                message: format!("the member does not serve it: {d}"),
            },
            other => unavailable(other),
        })?;
        let r = (ar, caps.scope == Scope::Namespaced);
        self.resources.lock().insert(gvk, r.clone());
        Ok(r)
    }

    /// The usage of a workload's ready pods, from the member's metrics server (its
    /// metrics.k8s.io PodMetrics) and the pods' requests: what a FederatedHPA scales on.
    /// `None` for other kinds, and when the member serves no metrics API (or it fails: the
    /// workload's status is reported all the same).
    /// A Service's endpoints: the member's EndpointSlices of it, merged (their address type is
    /// the first slice's; Orrery's multi-cluster slices are not the Service's own).
    async fn service_endpoints(
        &self,
        obj: &Value,
        ns: &str,
    ) -> Option<orrery_api::services::ServiceEndpoints> {
        if obj.get("kind")?.as_str()? != "Service" || obj.get("apiVersion")?.as_str()? != "v1" {
            return None;
        }
        let name = obj.pointer("/metadata/name")?.as_str()?;
        let q: String = form_urlencoded::Serializer::new(String::new())
            .append_pair(
                "labelSelector",
                &format!("kubernetes.io/service-name={name}"),
            )
            .finish();
        let mut merged = orrery_api::services::ServiceEndpoints::default();
        self.each_page::<orrery_api::services::ServiceEndpoints>(
            &format!("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices?{q}"),
            |slice| {
                if merged.address_type.is_empty() {
                    merged.address_type = slice.address_type.clone();
                }
                if slice.address_type == merged.address_type {
                    merged.endpoints.extend(slice.endpoints);
                    for p in slice.ports {
                        if !merged.ports.contains(&p) {
                            merged.ports.push(p);
                        }
                    }
                }
            },
        )
        .await
        .ok()?;
        Some(merged)
    }

    /// A workload's pods: what they use (when the member has a metrics server) and how
    /// many times their containers restarted.
    async fn workload_pods(
        &self,
        obj: &Value,
        ns: &str,
    ) -> (Option<orrery_api::work::WorkloadUsage>, Option<i64>) {
        let Some(q) = pods_query(obj) else {
            return (None, None);
        };
        let mut pods: Vec<UsagePod> = Vec::new();
        let listed = self
            .each_page::<UsagePod>(&format!("/api/v1/namespaces/{ns}/pods?{q}"), |p| {
                if p.metadata.deletion_timestamp.is_none() {
                    pods.push(p);
                }
            })
            .await;
        if listed.is_err() {
            return (None, None);
        }
        let restarts = pods
            .iter()
            .flat_map(|p| &p.status.container_statuses)
            .map(|c| c.restart_count)
            .sum();
        let mut metrics: HashMap<String, (i64, i64)> = HashMap::new();
        let measured = self
            .each_page::<PodMetrics>(
                &format!("/apis/metrics.k8s.io/v1beta1/namespaces/{ns}/pods?{q}"),
                |m| {
                    metrics.insert(
                        m.metadata.name,
                        sum_of(m.containers.iter().map(|c| &c.usage)),
                    );
                },
            )
            .await;
        // A member without a metrics server reports no usage.
        let usage = measured.is_ok().then(|| {
            let mut u = orrery_api::work::WorkloadUsage::default();
            for p in &pods {
                let ready = p
                    .status
                    .conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                match metrics.get(&p.metadata.name) {
                    Some((cpu, memory)) if ready => {
                        let (cpu_req, mem_req) =
                            sum_of(p.spec.containers.iter().map(|c| &c.resources.requests));
                        u.ready_pods += 1;
                        u.cpu_milli += cpu;
                        u.memory_bytes += memory;
                        u.cpu_request_milli += cpu_req;
                        u.memory_request_bytes += mem_req;
                    }
                    // Ready without metrics yet counts as starting, as the HPA reads it.
                    _ => u.unready_pods += 1,
                }
            }
            u
        });
        (usage, Some(restarts))
    }

    fn api(&self, ar: &ApiResource, namespaced: bool, ns: &str) -> Api<DynamicObject> {
        if namespaced {
            Api::namespaced_with(self.client.clone(), ns, ar)
        } else {
            Api::all_with(self.client.clone(), ar)
        }
    }

    /// Follows the managed objects of one kind into the cache.
    fn watch_kind(&self, gvk: Gvk, ar: ApiResource) {
        if !self.watched.lock().insert(gvk) {
            return;
        }
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &ar);
        let cache = self.cache.clone();
        let changed = self.changed.clone();
        let cfg = watcher::Config::default().labels(&format!("{MANAGED_LABEL}={MANAGED_VALUE}"));
        let task = tokio::spawn(async move {
            let mut stream = watcher::watcher(api, cfg).boxed();
            while let Some(ev) = stream.next().await {
                let mut c = cache.lock();
                match ev {
                    Ok(watcher::Event::Apply(o)) | Ok(watcher::Event::InitApply(o)) => {
                        if let Ok(v) = serde_json::to_value(&o)
                            && let Some(k) = key_of_value(&v)
                        {
                            c.insert(k, v);
                        }
                    }
                    Ok(watcher::Event::Delete(o)) => {
                        if let Ok(v) = serde_json::to_value(&o)
                            && let Some(k) = key_of_value(&v)
                        {
                            c.remove(&k);
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        drop(c);
                        tracing::debug!(error = %e, "watching the member failed; the watcher retries");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                }
                drop(c);
                changed.send_modify(|v| *v = v.wrapping_add(1));
            }
        });
        self.tasks.lock().push(task);
    }

    async fn ensure_namespace(&self, ns: &str) -> Result<(), BackendError> {
        let api: Api<DynamicObject> = Api::all_with(
            self.client.clone(),
            &ApiResource::erase::<k8s_openapi::api::core::v1::Namespace>(&()),
        );
        let obj = json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": ns, "labels": {MANAGED_LABEL: MANAGED_VALUE}},
        });
        api.patch(ns, &PatchParams::apply(FIELD_MANAGER), &Patch::Apply(&obj))
            .await
            .map(|_| ())
            .map_err(|e| member_error(&format!("namespace {ns}"), e))
    }

    pub(crate) async fn enablements(&self) -> Vec<ApiEnablement> {
        if let Some((at, e)) = &*self.enablements.lock()
            && at.elapsed() < Duration::from_secs(300)
        {
            return e.clone();
        }
        let mut out = Vec::new();
        let mut versions: Vec<String> = Vec::new();
        if let Ok(core) = self.client.list_core_api_versions().await {
            versions.extend(core.versions);
        }
        if let Ok(groups) = self.client.list_api_groups().await {
            for g in groups.groups {
                if let Some(p) = g.preferred_version {
                    versions.push(p.group_version);
                }
            }
        }
        for gv in versions {
            let list = if gv.contains('/') {
                self.client.list_api_group_resources(&gv).await
            } else {
                self.client.list_core_api_resources(&gv).await
            };
            if let Ok(l) = list {
                out.push(ApiEnablement {
                    group_version: gv,
                    resources: l
                        .resources
                        .into_iter()
                        .filter(|r| !r.name.contains('/'))
                        .map(|r| ApiResourceRef {
                            name: r.name,
                            kind: r.kind,
                        })
                        .collect(),
                });
            }
        }
        *self.enablements.lock() = Some((Instant::now(), out.clone()));
        out
    }

    /// The newest of `versions` of `group` the member serves, else the oldest.
    async fn served(&self, group: &str, versions: &[&'static str]) -> &'static str {
        let have = self.enablements().await;
        versions
            .iter()
            .copied()
            .find(|v| {
                have.iter()
                    .any(|a| a.group_version == format!("{group}/{v}"))
            })
            .or_else(|| versions.last().copied())
            .unwrap_or_default()
    }

    async fn properties(&self) -> BTreeMap<String, String> {
        let version = self.served("about.k8s.io", &["v1beta1", "v1alpha1"]).await;
        let ar = ApiResource {
            group: "about.k8s.io".into(),
            version: version.into(),
            api_version: format!("about.k8s.io/{version}"),
            kind: "ClusterProperty".into(),
            plural: "clusterproperties".into(),
        };
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &ar);
        match api.list(&ListParams::default()).await {
            Ok(l) => l
                .items
                .into_iter()
                .filter_map(|p| {
                    let value = p.data.pointer("/spec/value")?.as_str()?.to_string();
                    Some((p.metadata.name?, value))
                })
                .collect(),
            // Members without KEP-2149 have no properties to report.
            Err(_) => BTreeMap::new(),
        }
    }

    /// The member's ServiceExports, at the newest MCS version it serves.
    async fn service_export_resource(&self) -> ApiResource {
        use orrery_api::services::{GROUP, VERSION, VERSION_V1ALPHA1};
        let version = self.served(GROUP, &[VERSION, VERSION_V1ALPHA1]).await;
        ApiResource {
            group: GROUP.into(),
            version: version.into(),
            api_version: format!("{GROUP}/{version}"),
            kind: orrery_api::services::EXPORT_KIND.into(),
            plural: orrery_api::services::EXPORT_PLURAL.into(),
        }
    }

    /// The member's own ServiceExports (not Orrery's copies), each with its Service's
    /// exported properties and endpoints. A member without the MCS API has none.
    async fn service_exports(&self) -> Vec<orrery_api::services::MemberExport> {
        let api: Api<DynamicObject> =
            Api::all_with(self.client.clone(), &self.service_export_resource().await);
        let Ok(list) = api.list(&ListParams::default()).await else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for e in list.items {
            let labels = e.metadata.labels.clone().unwrap_or_default();
            if labels.get(MANAGED_LABEL).map(String::as_str) == Some(MANAGED_VALUE) {
                continue;
            }
            let (Some(ns), Some(name)) = (e.metadata.namespace.clone(), e.metadata.name.clone())
            else {
                continue;
            };
            let services: Api<k8s_openapi::api::core::v1::Service> =
                Api::namespaced(self.client.clone(), &ns);
            let service = services
                .get_opt(&name)
                .await
                .ok()
                .flatten()
                .and_then(|s| serde_json::to_value(s).ok());
            let endpoints = match &service {
                Some(s) => self.service_endpoints(s, &ns).await,
                None => None,
            };
            let created = e
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.to_string())
                .unwrap_or_default();
            out.push(orrery_api::services::MemberExport::of(
                &ns,
                &name,
                &created,
                e.data.get("spec"),
                service.as_ref(),
                endpoints,
            ));
        }
        out
    }

    /// The copies of data sets the member holds of its own: its bound claims labelled
    /// `orrery.io/dataset` that Orrery did not make, their capacity as their size.
    async fn data_sets(&self) -> Vec<orrery_api::data::HeldDataSet> {
        let mut out = Vec::new();
        let path = format!(
            "/api/v1/persistentvolumeclaims?labelSelector={}",
            orrery_api::data::DATASET_LABEL.replace('/', "%2F")
        );
        let listed = self
            .each_page(&path, |c: MiniClaim| {
                let Some(set) = c.metadata.labels.get(orrery_api::data::DATASET_LABEL) else {
                    return;
                };
                // Orrery's own copies are known to it.
                if c.status.phase != "Bound"
                    || c.metadata
                        .labels
                        .contains_key(orrery_api::work::MANAGED_LABEL)
                {
                    return;
                }
                out.push(orrery_api::data::HeldDataSet {
                    namespace: c.metadata.namespace,
                    name: set.clone(),
                    claim: c.metadata.name,
                    bytes: c.status.capacity.get("storage").map_or(0, |q| {
                        i64::try_from(quantity_of(q).value()).unwrap_or(i64::MAX)
                    }),
                    data_version: c
                        .metadata
                        .annotations
                        .get(orrery_api::data::DATA_VERSION_ANNOTATION)
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0),
                });
            })
            .await;
        let mut held = self.held.lock();
        if let Err(e) = listed {
            tracing::warn!(error = %e, "listing the claims labelled orrery.io/dataset failed; reporting the last list");
            return held.clone();
        }
        out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        *held = out.clone();
        out
    }

    /// The member's StorageClasses, the default one (annotated
    /// `storageclass.kubernetes.io/is-default-class`) first.
    async fn storage_classes(&self) -> Vec<String> {
        let mut classes: Vec<(bool, String)> = Vec::new();
        let listed = self
            .each_page(
                "/apis/storage.k8s.io/v1/storageclasses",
                |c: MiniStorageClass| {
                    let default = c
                        .metadata
                        .annotations
                        .get("storageclass.kubernetes.io/is-default-class")
                        .is_some_and(|v| v == "true");
                    classes.push((!default, c.metadata.name));
                },
            )
            .await;
        if listed.is_err() {
            // A member that serves no StorageClasses has none to offer.
            return Vec::new();
        }
        classes.sort();
        classes.into_iter().map(|(_, n)| n).collect()
    }
}

/// A claim: where it is, what it holds and how big it is.
#[derive(Debug, serde::Deserialize)]
struct MiniClaim {
    #[serde(default)]
    metadata: ClaimMeta,
    #[serde(default)]
    status: ClaimStatus,
}

#[derive(Debug, Default, serde::Deserialize)]
struct ClaimMeta {
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

#[derive(Debug, Default, serde::Deserialize)]
struct ClaimStatus {
    #[serde(default)]
    phase: String,
    #[serde(default)]
    capacity: BTreeMap<String, Value>,
}

/// A StorageClass: its name and annotations.
#[derive(Debug, serde::Deserialize)]
struct MiniStorageClass {
    #[serde(default)]
    metadata: ClassMeta,
}

#[derive(Debug, Default, serde::Deserialize)]
struct ClassMeta {
    #[serde(default)]
    name: String,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

#[async_trait]
impl Backend for KubeMember {
    async fn apply(
        &self,
        manifest: &Value,
        overwrite: bool,
        _cause: &Cause,
    ) -> Result<(), BackendError> {
        let id = ResourceIdentifier::of(0, manifest).ok_or_else(|| BackendError::Rejected {
            what: "a manifest".into(),
            message: "it has no apiVersion, kind or name".into(),
        })?;
        let (ar, namespaced) = self.resolve(&id.group, &id.version, &id.kind).await?;
        let ns = if namespaced && id.namespace.is_empty() {
            "default".to_string()
        } else {
            id.namespace.clone()
        };
        let api = self.api(&ar, namespaced, &ns);
        let what = id.describe();
        if !overwrite
            && let Some(existing) = api
                .get_opt(&id.name)
                .await
                .map_err(|e| member_error(&what, e))?
            && !managed(&serde_json::to_value(&existing).unwrap_or_default())
        {
            return Err(BackendError::Conflict(what));
        }
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let mut result = api.patch(&id.name, &params, &Patch::Apply(manifest)).await;
        if let Err(kube::Error::Api(s)) = &result
            && s.code == 404
            && namespaced
        {
            // The namespace is missing in the member: create it, then try again.
            self.ensure_namespace(&ns).await?;
            result = api.patch(&id.name, &params, &Patch::Apply(manifest)).await;
        }
        let mut applied = result.map_err(|e| member_error(&what, e))?;
        // A status in a manifest is the control plane's word (a ClusterProfile's, a
        // ServiceImport's: workloads' templates go without theirs). An apply of the object
        // leaves a status subresource alone, so it is written there too, when it differs.
        if let Some(want) = manifest
            .get("status")
            .and_then(Value::as_object)
            .filter(|m| !m.is_empty())
            && applied.data.get("status").and_then(Value::as_object) != Some(want)
        {
            let mut status = want.clone();
            // What the member's status has beyond it goes (a merge patch keeps what it does
            // not name).
            for k in applied
                .data
                .get("status")
                .and_then(Value::as_object)
                .into_iter()
                .flat_map(|m| m.keys())
            {
                status.entry(k.clone()).or_insert(Value::Null);
            }
            let params = PatchParams {
                field_manager: Some(FIELD_MANAGER.to_string()),
                ..Default::default()
            };
            match api
                .patch_status(
                    &id.name,
                    &params,
                    &Patch::Merge(json!({ "status": status })),
                )
                .await
            {
                Ok(o) => applied = o,
                // No status subresource: the apply wrote it with the object.
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 405 => {}
                Err(e) => return Err(member_error(&format!("the status of {what}"), e)),
            }
        }
        if let Ok(v) = serde_json::to_value(&applied)
            && let Some(k) = key_of_value(&v)
        {
            self.cache.lock().insert(k, v);
        }
        self.watch_kind((id.group, id.version, id.kind), ar);
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
        Ok(())
    }

    async fn observed(&self, id: &ResourceIdentifier) -> Result<Option<Value>, BackendError> {
        let (ar, namespaced) = self.resolve(&id.group, &id.version, &id.kind).await?;
        let api = self.api(&ar, namespaced, &id.namespace);
        let found = api
            .get_opt(&id.name)
            .await
            .map_err(|e| member_error(&id.describe(), e))?;
        Ok(found.map(|o| serde_json::to_value(&o).unwrap_or_default()))
    }

    async fn delete(&self, id: &ResourceIdentifier, _cause: &Cause) -> Result<(), BackendError> {
        let (ar, namespaced) = self.resolve(&id.group, &id.version, &id.kind).await?;
        let api = self.api(&ar, namespaced, &id.namespace);
        let what = id.describe();
        match api
            .get_opt(&id.name)
            .await
            .map_err(|e| member_error(&what, e))?
        {
            Some(o) if managed(&serde_json::to_value(&o).unwrap_or_default()) => {}
            // Absent, or not ours to delete.
            _ => return Ok(()),
        }
        match api.delete(&id.name, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(member_error(&what, e)),
        }
        self.cache.lock().remove(&key_of(id));
        Ok(())
    }

    /// A watched object's `resourceVersion` (any change of it is a new one); `None` for an
    /// object not in the cache, which `state` reads from the member.
    fn state_stamp(&self, id: &ResourceIdentifier) -> Option<u64> {
        use std::hash::{Hash, Hasher};
        let cache = self.cache.lock();
        let rv = cache
            .get(&key_of(id))?
            .pointer("/metadata/resourceVersion")?
            .as_str()?;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        rv.hash(&mut h);
        // A workload's volumes change when the mover writes their claims.
        if id.kind == "StatefulSet" || id.kind == "Deployment" {
            self.mover
                .volumes_epoch
                .load(std::sync::atomic::Ordering::Relaxed)
                .hash(&mut h);
        }
        // 0 stands for an absent object elsewhere; keep clear of it.
        Some(h.finish().max(1))
    }

    async fn state(&self, id: &ResourceIdentifier) -> Result<Option<ObjectState>, BackendError> {
        let cached = self.cache.lock().get(&key_of(id)).cloned();
        let obj = match cached {
            Some(v) => v,
            None => {
                let (ar, namespaced) = self.resolve(&id.group, &id.version, &id.kind).await?;
                let api = self.api(&ar, namespaced, &id.namespace);
                match api
                    .get_opt(&id.name)
                    .await
                    .map_err(|e| member_error(&id.describe(), e))?
                {
                    Some(o) => serde_json::to_value(&o).unwrap_or_default(),
                    None => return Ok(None),
                }
            }
        };
        let (health, message) = orrery_api::interpret::health(&obj);
        let volumes = if orrery_api::stateful::claims_of(&obj).is_empty() {
            Vec::new()
        } else {
            self.mover
                .volumes_of(&obj, &id.namespace)
                .await
                .map_err(|e| member_error(&format!("the volumes of {}", id.describe()), e))?
        };
        let (usage, restarts) = self.workload_pods(&obj, &id.namespace).await;
        let endpoints = self.service_endpoints(&obj, &id.namespace).await;
        Ok(Some(ObjectState {
            health,
            status: obj.get("status").cloned(),
            generation: obj.pointer("/metadata/generation").and_then(Value::as_i64),
            message,
            volumes,
            usage,
            endpoints,
            restarts,
        }))
    }

    async fn proxy_upgrade(
        &self,
        parts: http::request::Parts,
        upgrade: hyper::upgrade::OnUpgrade,
    ) -> http::Response<super::ProxyBody> {
        use tokio_tungstenite::tungstenite::handshake::client::generate_key;
        // The member's API is asked over HTTP/1.1 (Upgrade: websocket, a key of our own);
        // once it switches, the two streams are joined.
        let mut req = http::Request::get(parts.uri.clone())
            .header(http::header::CONNECTION, "Upgrade")
            .header(http::header::UPGRADE, "websocket")
            .header(http::header::SEC_WEBSOCKET_VERSION, "13")
            .header(http::header::SEC_WEBSOCKET_KEY, generate_key());
        if let Some(p) = parts.headers.get(http::header::SEC_WEBSOCKET_PROTOCOL) {
            req = req.header(http::header::SEC_WEBSOCKET_PROTOCOL, p);
        }
        let req = match req.body(kube::client::Body::empty()) {
            Ok(r) => r,
            Err(e) => return super::proxy_error(http::StatusCode::BAD_REQUEST, &e.to_string()),
        };
        let mut answer = match self.client.send(req).await {
            Ok(a) => a,
            Err(e) => {
                return super::proxy_error(
                    http::StatusCode::BAD_GATEWAY,
                    &format!("the member's API: {e}"),
                );
            }
        };
        if answer.status() != http::StatusCode::SWITCHING_PROTOCOLS {
            use http_body_util::BodyExt;
            return answer.map(|b| b.map_err(std::io::Error::other).boxed_unsync());
        }
        let member = hyper::upgrade::on(&mut answer);
        tokio::spawn(async move {
            if let (Ok(a), Ok(b)) = (upgrade.await, member.await) {
                let (mut a, mut b) = (
                    hyper_util::rt::TokioIo::new(a),
                    hyper_util::rt::TokioIo::new(b),
                );
                let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
            }
        });
        let mut r = super::proxy_answer(http::StatusCode::OK, "application/octet-stream", "");
        if let Some(p) = answer.headers().get(http::header::SEC_WEBSOCKET_PROTOCOL) {
            r.headers_mut()
                .insert(http::header::SEC_WEBSOCKET_PROTOCOL, p.clone());
        }
        r
    }

    async fn proxy(&self, req: http::Request<bytes::Bytes>) -> http::Response<super::ProxyBody> {
        use http_body_util::BodyExt;
        // The member's API with the agent's own credentials there, over the client's own
        // HTTP version (the request came over the tunnel's HTTP/2).
        let mut req = req.map(kube::client::Body::from);
        *req.version_mut() = http::Version::default();
        match self.client.send(req).await {
            Ok(r) => r.map(|b| b.map_err(std::io::Error::other).boxed_unsync()),
            Err(e) => super::proxy_error(
                http::StatusCode::BAD_GATEWAY,
                &format!("the member's API: {e}"),
            ),
        }
    }

    async fn report(&self) -> Result<MemberReport, BackendError> {
        let req = http::Request::get("/readyz")
            .body(Vec::new())
            .map_err(unavailable)?;
        let ready = self.client.request_text(req).await;
        let version = self.client.apiserver_version().await.map_err(unavailable)?;
        // Nodes and pods a page at a time, into the few fields needed: a member of thousands
        // of nodes never sits in memory whole.
        let mut allocatable = ResourceList::new();
        // Per node only the free cpu, memory and gpu (in nano-units): a map entry apiece.
        let mut per_node: HashMap<String, [i128; 3]> = HashMap::new();
        const LARGEST: [&str; 3] = ["cpu", "memory", GPU_RESOURCE];
        let (mut total_nodes, mut ready_nodes) = (0i64, 0i64);
        // GPUs per model, over the ready nodes: the model with the most is the member's.
        let mut gpu_models: BTreeMap<String, i128> = BTreeMap::new();
        // Every node, for the member's ClusterMetrics: what it gives, and (below) what is
        // requested of it.
        let mut nodes: Vec<orrery_api::quota::NodeInfo> = Vec::new();
        self.each_page("/api/v1/nodes", |n: MiniNode| {
            total_nodes += 1;
            let is_ready = n
                .status
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            nodes.push(orrery_api::quota::NodeInfo {
                name: n.metadata.name.clone(),
                allocatable_resources: n
                    .status
                    .allocatable
                    .iter()
                    .map(|(k, v)| (k.clone(), quantity_of(v)))
                    .collect(),
                unschedulable: !is_ready || n.spec.unschedulable,
                ..Default::default()
            });
            if !is_ready || n.spec.unschedulable {
                return;
            }
            ready_nodes += 1;
            let mut mine = [0i128; 3];
            for (k, v) in &n.status.allocatable {
                let q = quantity_of(v);
                add_to(&mut allocatable, k, q);
                if let Some(i) = LARGEST.iter().position(|r| r == k) {
                    mine[i] = q.nanos();
                }
            }
            if let Some(model) = n.metadata.labels
                && mine[2] > 0
            {
                *gpu_models.entry(model).or_default() += mine[2];
            }
            per_node.insert(n.metadata.name, mine);
        })
        .await?;
        let mut allocated = ResourceList::new();
        let mut allocating = ResourceList::new();
        let (mut placed_pods, mut pending_pods) = (0i64, 0i64);
        let mut requested: HashMap<String, ResourceList> = HashMap::new();
        self.each_page("/api/v1/pods", |p: MiniPod| {
            let phase = p.status.phase.as_deref().unwrap_or("Pending");
            if phase == "Succeeded" || phase == "Failed" {
                return;
            }
            let req = pod_requests(&p.spec);
            match &p.spec.node_name {
                Some(node) => {
                    placed_pods += 1;
                    let on_node = requested.entry(node.clone()).or_default();
                    for (k, v) in &req {
                        add_to(&mut allocated, k, *v);
                        add_to(on_node, k, *v);
                        if let Some(free) = per_node.get_mut(node)
                            && let Some(i) = LARGEST.iter().position(|r| r == k)
                        {
                            free[i] -= v.nanos();
                        }
                    }
                }
                None => {
                    pending_pods += 1;
                    for (k, v) in &req {
                        add_to(&mut allocating, k, *v);
                    }
                }
            }
        })
        .await?;
        allocated.insert(
            "pods".into(),
            Quantity::from_int(placed_pods, orrery_api::Format::DecimalSI),
        );
        allocating.insert(
            "pods".into(),
            Quantity::from_int(pending_pods, orrery_api::Format::DecimalSI),
        );
        let mut largest = ResourceList::new();
        for (i, r) in LARGEST.iter().enumerate() {
            let formats = [
                orrery_api::Format::DecimalSI,
                orrery_api::Format::BinarySI,
                orrery_api::Format::DecimalSI,
            ];
            if let Some(most) = per_node.values().map(|f| f[i]).max()
                && allocatable.contains_key(*r)
                && let Ok(q) = Quantity::from_nanos(most.max(0), formats[i])
            {
                largest.insert(r.to_string(), q);
            }
        }
        let mut usage = allocated.clone();
        usage.remove("pods");
        for n in &mut nodes {
            n.allocated_resource_requests = requested.remove(&n.name).unwrap_or_default();
        }
        Ok(MemberReport {
            nodes,
            healthy: ready.is_ok(),
            message: match &ready {
                Ok(_) => format!("{ready_nodes} of {total_nodes} nodes ready"),
                Err(e) => format!("the member's API is not ready: {e}"),
            },
            kubernetes_version: version.git_version,
            api_enablements: self.enablements().await,
            node_summary: NodeSummary {
                total_num: total_nodes,
                ready_num: ready_nodes,
            },
            resource_summary: ResourceSummary {
                allocatable,
                allocated,
                allocating,
                usage,
            },
            largest_node_free: largest,
            network: None,
            properties: with_gpu_facts(self.properties().await, &gpu_models),
            storage_classes: self.storage_classes().await,
            data_sets: self.data_sets().await,
            service_exports: self.service_exports().await,
        })
    }

    async fn set_export_status(
        &self,
        namespace: &str,
        name: &str,
        status: &Value,
    ) -> Result<(), BackendError> {
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            namespace,
            &self.service_export_resource().await,
        );
        api.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await
        .map(|_| ())
        .map_err(|e| {
            member_error(
                &format!("the status of ServiceExport {namespace}/{name}"),
                e,
            )
        })
    }

    /// Volume transfers run as snapshots and restic Jobs in the member ([`mover`]).
    async fn set_transfers(&self, work: &str, transfers: &[Transfer]) -> Result<(), BackendError> {
        self.mover.set(work, transfers).await;
        Ok(())
    }

    async fn transfer_statuses(&self, _work: &str, transfers: &[Transfer]) -> Vec<TransferStatus> {
        self.mover.statuses(transfers)
    }

    fn transfer_stamp(&self) -> Option<u64> {
        Some(self.mover.stamp())
    }

    fn milestone(&self) -> u64 {
        self.mover.milestone()
    }

    fn changed(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workloads_pods_are_found_by_its_selector_and_restarts_are_read() {
        let d = serde_json::json!({"kind": "Deployment",
            "spec": {"selector": {"matchLabels": {"app": "web", "tier": "front"}}}});
        assert_eq!(
            pods_query(&d).as_deref(),
            Some("labelSelector=app%3Dweb%2Ctier%3Dfront")
        );
        let ds = serde_json::json!({"kind": "DaemonSet",
            "spec": {"selector": {"matchExpressions": [{"key": "app", "operator": "Exists"}]}}});
        assert_eq!(pods_query(&ds).as_deref(), Some("labelSelector=app"));
        // Not a workload, or one selecting nothing: no pods are listed.
        assert_eq!(pods_query(&serde_json::json!({"kind": "ConfigMap"})), None);
        let open = serde_json::json!({"kind": "Deployment", "spec": {"selector": {}}});
        assert_eq!(pods_query(&open), None);
        let p: UsagePod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-1"},
            "status": {"containerStatuses": [{"restartCount": 2}, {"restartCount": 1}]}}))
        .unwrap();
        let restarts: i64 = p
            .status
            .container_statuses
            .iter()
            .map(|c| c.restart_count)
            .sum();
        assert_eq!(restarts, 3);
    }
}
