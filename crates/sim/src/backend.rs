//! The simulated cluster as the agent drives it: [`Backend`] over its state.

use async_trait::async_trait;

use crate::clock::held_data_sets;
use crate::clock::no_pods;
use crate::clock::step_transfers;
use crate::spec::region_latency;
use crate::workload::VOLUME_USED_ANNOTATION;
use crate::workload::is_managed;
use crate::workload::shape_of;

use crate::Node;
use crate::Phase;
use crate::SimCluster;
use crate::SimObject;
use crate::State;
use crate::clock::advance;
use crate::clock::background;
use crate::clock::catch_up;
use crate::clock::reconcile_pods;
use crate::key_of;
use crate::new_uid;
use crate::workload::Res;
use orrery_agent::backend::Backend;
use orrery_agent::backend::BackendError;
use orrery_agent::backend::Cause;
use orrery_agent::backend::MemberReport;
use orrery_agent::backend::ObjectState;
use orrery_agent::backend::ProxyBody;
use orrery_api::Quantity;
use orrery_api::cluster::ApiEnablement;
use orrery_api::cluster::ApiResourceRef;
use orrery_api::cluster::GPU_RESOURCE;
use orrery_api::cluster::NetworkStatus;
use orrery_api::cluster::NodeSummary;
use orrery_api::cluster::ResourceSummary;
use orrery_api::work::ResourceIdentifier;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use tokio::time::Instant;

/// What the simulated API serves: the built-in kinds, and the kinds of the
/// CustomResourceDefinitions applied to it (as a real API server starts serving them).
pub(crate) fn api_enablements<'a>(objects: impl Iterator<Item = &'a Value>) -> Vec<ApiEnablement> {
    let mut all = builtin_enablements();
    for crd in objects.filter(|o| {
        o["kind"] == "CustomResourceDefinition"
            && o["apiVersion"]
                .as_str()
                .is_some_and(|v| v.starts_with("apiextensions.k8s.io/"))
    }) {
        let spec = &crd["spec"];
        let (Some(group), Some(plural), Some(kind)) = (
            spec["group"].as_str(),
            spec["names"]["plural"].as_str(),
            spec["names"]["kind"].as_str(),
        ) else {
            continue;
        };
        for v in spec["versions"].as_array().into_iter().flatten() {
            if v["served"] == false {
                continue;
            }
            let Some(version) = v["name"].as_str() else {
                continue;
            };
            all.push(ApiEnablement {
                group_version: format!("{group}/{version}"),
                resources: vec![ApiResourceRef {
                    name: plural.into(),
                    kind: kind.into(),
                }],
            });
        }
    }
    all
}

pub(crate) fn builtin_enablements() -> Vec<ApiEnablement> {
    let gv = |gv: &str, rs: &[(&str, &str)]| ApiEnablement {
        group_version: gv.into(),
        resources: rs
            .iter()
            .map(|(n, k)| ApiResourceRef {
                name: (*n).into(),
                kind: (*k).into(),
            })
            .collect(),
    };
    vec![
        gv(
            "v1",
            &[
                ("configmaps", "ConfigMap"),
                ("secrets", "Secret"),
                ("services", "Service"),
                ("serviceaccounts", "ServiceAccount"),
                ("persistentvolumeclaims", "PersistentVolumeClaim"),
                ("pods", "Pod"),
                ("namespaces", "Namespace"),
            ],
        ),
        gv(
            "apps/v1",
            &[
                ("deployments", "Deployment"),
                ("statefulsets", "StatefulSet"),
                ("daemonsets", "DaemonSet"),
                ("replicasets", "ReplicaSet"),
            ],
        ),
        gv("batch/v1", &[("jobs", "Job"), ("cronjobs", "CronJob")]),
        gv("networking.k8s.io/v1", &[("ingresses", "Ingress")]),
        gv(
            "policy/v1",
            &[("poddisruptionbudgets", "PodDisruptionBudget")],
        ),
        gv(
            "discovery.k8s.io/v1",
            &[("endpointslices", "EndpointSlice")],
        ),
        // A member where Orrery's multi-cluster services work has the MCS API (its own
        // exports are read from it, imports written to it).
        gv(
            orrery_api::services::API_VERSION,
            &[
                ("serviceexports", orrery_api::services::EXPORT_KIND),
                ("serviceimports", orrery_api::services::IMPORT_KIND),
            ],
        ),
        gv(
            orrery_api::services::API_VERSION_V1ALPHA1,
            &[
                ("serviceexports", orrery_api::services::EXPORT_KIND),
                ("serviceimports", orrery_api::services::IMPORT_KIND),
            ],
        ),
        // And the About API (about-api v0.2: v1beta1 stored, v1alpha1 served).
        gv(
            "about.k8s.io/v1beta1",
            &[("clusterproperties", "ClusterProperty")],
        ),
        gv(
            "about.k8s.io/v1alpha1",
            &[("clusterproperties", "ClusterProperty")],
        ),
        gv(
            "apiextensions.k8s.io/v1",
            &[("customresourcedefinitions", "CustomResourceDefinition")],
        ),
    ]
}

#[async_trait]
impl Backend for SimCluster {
    async fn proxy(&self, req: http::Request<bytes::Bytes>) -> http::Response<ProxyBody> {
        self.answer(&self.state, &req)
    }

    async fn proxy_upgrade(
        &self,
        req: http::request::Parts,
        upgrade: hyper::upgrade::OnUpgrade,
    ) -> http::Response<ProxyBody> {
        self.upgrade(&req, upgrade)
    }

    async fn apply(
        &self,
        manifest: &Value,
        overwrite: bool,
        cause: &Cause,
    ) -> Result<(), BackendError> {
        self.gate().await?;
        let id = ResourceIdentifier::of(0, manifest).ok_or_else(|| BackendError::Rejected {
            what: "a manifest".into(),
            message: "it has no apiVersion, kind or name".into(),
        })?;
        let key = key_of(&id);
        let now = Instant::now();
        {
            let mut st = self.lock();
            catch_up(&mut st, now);
            let shape = shape_of(manifest);
            let (op, changed) = match st.objects.get_mut(&key) {
                Some(existing) => {
                    if !is_managed(&existing.manifest) && !overwrite {
                        return Err(BackendError::Conflict(id.describe()));
                    }
                    if existing.manifest.get("spec") != manifest.get("spec") {
                        existing.generation += 1;
                    }
                    // An apply leaves the status alone, as an API server's does: what the
                    // member's own controllers wrote there stays.
                    let mut next = manifest.clone();
                    if next.get("status").is_none()
                        && let Some(s) = existing.manifest.get("status")
                        && let Some(m) = next.as_object_mut()
                    {
                        m.insert("status".into(), s.clone());
                    }
                    let changed = existing.manifest != next;
                    existing.manifest = next;
                    existing.shape = shape;
                    ("update", changed)
                }
                None => {
                    st.objects.insert(
                        key.clone(),
                        SimObject {
                            manifest: manifest.clone(),
                            generation: 1,
                            shape,
                            succeeded: 0,
                            unschedulable: 0,
                            volume_block: None,
                            stamp: 0,
                            load_window: 0,
                            created: orrery_api::Time::now().to_string(),
                            uid: new_uid(),
                            completed: None,
                        },
                    );
                    ("create", true)
                }
            };
            st.record(op, &id, changed, cause);
            if id.kind == "PersistentVolumeClaim" && id.group.is_empty() {
                // A claim is bound at once to a volume of its size and class.
                let capacity = orrery_api::stateful::storage_request(manifest.get("spec"))
                    .map_or(1 << 30, |q| q.value() as i64);
                let class = manifest
                    .pointer("/spec/storageClassName")
                    .and_then(Value::as_str)
                    .map_or_else(|| st.storage_default.clone(), str::to_string);
                let used = manifest
                    .pointer("/metadata/annotations")
                    .and_then(|a| a.get(VOLUME_USED_ANNOTATION))
                    .and_then(Value::as_str)
                    .and_then(|q| q.parse::<Quantity>().ok())
                    .map_or(capacity / 2, |q| q.value() as i64);
                st.data.ensure_volume(
                    &id.namespace,
                    &id.name,
                    None,
                    None,
                    capacity,
                    &class,
                    used as f64,
                );
            }
            st.touch(&key);
            reconcile_pods(&mut st, &key, now);
            advance(&mut st, &self.spec, now);
            step_transfers(&mut st);
        }
        self.bump();
        Ok(())
    }

    async fn observed(&self, id: &ResourceIdentifier) -> Result<Option<Value>, BackendError> {
        self.gate().await?;
        let key = key_of(id);
        let st = self.lock();
        Ok(st.objects.get(&key).map(|o| {
            // The manifest as applied, with its generation and the status its controller
            // writes.
            let mut v = o.manifest.clone();
            if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
                meta.insert("generation".into(), json!(o.generation));
            }
            if let Some(status) = self.object_state(&st, &key, o).status {
                v["status"] = status;
            }
            v
        }))
    }

    async fn delete(&self, id: &ResourceIdentifier, cause: &Cause) -> Result<(), BackendError> {
        self.gate().await?;
        let key = key_of(id);
        {
            let mut st = self.lock();
            catch_up(&mut st, Instant::now());
            let Some(gone) = st.objects.remove(&key) else {
                return Ok(());
            };
            st.record("delete", id, true, cause);
            if id.kind == "StatefulSet" {
                // The claim templates' volumes stay unless the retention policy says they go.
                let owner = format!("StatefulSet/{}", id.name);
                if gone.shape.is_some_and(|s| s.delete_when_deleted) {
                    st.data.delete_owned(&id.namespace, &owner);
                } else {
                    st.data.release_owned(&id.namespace, &owner);
                }
            } else if id.kind == "PersistentVolumeClaim" && id.group.is_empty() {
                st.data.delete_volume(&id.namespace, &id.name);
            }
            reconcile_pods(&mut st, &key, Instant::now());
            // Freed room may let pending pods of others in.
            st.busy = true;
            advance(&mut st, &self.spec, Instant::now());
        }
        self.bump();
        Ok(())
    }

    async fn state(&self, id: &ResourceIdentifier) -> Result<Option<ObjectState>, BackendError> {
        self.gate().await?;
        let key = key_of(id);
        let st = self.lock();
        Ok(st
            .objects
            .get(&key)
            .map(|o| self.object_state(&st, &key, o)))
    }

    fn state_stamp(&self, id: &ResourceIdentifier) -> Option<u64> {
        let st = self.lock();
        if st.faults.outage {
            // Every read fails now; the outage's end touches every object.
            return None;
        }
        let key = key_of(id);
        Some(st.objects.get(&key).map_or(0, |o| {
            if key.0.is_empty() && key.1 == "Service" {
                // Its endpoints follow the namespace's pods.
                let epoch = st.pod_epochs.get(&key.2).copied().unwrap_or(0);
                (o.stamp.rotate_left(32) ^ epoch).max(1)
            } else {
                o.stamp
            }
        }))
    }

    async fn report(&self) -> Result<MemberReport, BackendError> {
        self.gate().await?;
        let factor = self.profile_factor(self.started.elapsed());
        let st = self.lock();
        let ready: Vec<(usize, &Node)> = st
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.ready)
            .collect();
        let mut allocatable = Res::default();
        let mut bg = Res::default();
        for (_, n) in &ready {
            allocatable = allocatable.add(n.allocatable);
            bg = bg.add(background(n, st.load));
        }
        let mut placed = Res::default();
        let mut pending = Res::default();
        let mut per_node: Vec<Res> = st
            .nodes
            .iter()
            .map(|n| n.allocatable.sub(background(n, st.load)))
            .collect();
        for p in st.pods.values().filter(|p| p.phase != Phase::Succeeded) {
            match p.node {
                Some(i) => {
                    placed = placed.add(p.request);
                    per_node[i] = per_node[i].sub(p.request);
                }
                None => pending = pending.add(p.request),
            }
        }
        let allocated = bg.add(placed);
        let nodes = node_infos(&st);
        let usage_bg = Res {
            cpu_m: ((bg.cpu_m as f64) * factor).min(allocatable.cpu_m as f64) as i64,
            mem: ((bg.mem as f64) * factor).min(allocatable.mem as f64) as i64,
            gpu: 0,
            pods: 0,
        };
        let usage = usage_bg.add(placed);
        let largest = largest_free(&ready, &per_node);
        let running = st
            .pods
            .values()
            .filter(|p| p.phase == Phase::Running)
            .count() as f64;
        let latency_ms = self.latency_ms(&st);
        let properties = self.properties();
        let service_exports = self.own_service_exports(&st);
        Ok(MemberReport {
            nodes,
            healthy: true,
            message: format!(
                "simulated cluster: {} of {} nodes ready",
                ready.len(),
                st.nodes.len()
            ),
            kubernetes_version: "v1.32.0+orrery-sim".into(),
            api_enablements: api_enablements(st.objects.values().map(|o| &o.manifest)),
            node_summary: NodeSummary {
                total_num: st.nodes.len() as i64,
                ready_num: ready.len() as i64,
            },
            resource_summary: ResourceSummary {
                allocatable: allocatable.to_list(true),
                allocated: allocated.to_list(true),
                allocating: pending.to_list(true),
                usage: usage.to_list(false),
            },
            largest_node_free: {
                let mut l = largest.to_list(false);
                if self.spec.gpu == 0 {
                    l.remove(GPU_RESOURCE);
                }
                l
            },
            network: Some(NetworkStatus {
                latency_ms,
                ingress_bytes_per_second: running * 12_000.0 * factor,
                egress_bytes_per_second: running * 8_000.0 * factor,
                bandwidth_bytes_per_second: Some(self.spec.bandwidth),
                path_bandwidth_bytes_per_second: self.spec.paths.clone(),
                ..Default::default()
            }),
            properties,
            storage_classes: st.storage_classes.clone(),
            data_sets: held_data_sets(&st),
            service_exports,
        })
    }

    async fn set_export_status(
        &self,
        namespace: &str,
        name: &str,
        status: &Value,
    ) -> Result<(), BackendError> {
        self.gate().await?;
        let key = (
            orrery_api::services::GROUP.to_string(),
            orrery_api::services::EXPORT_KIND.to_string(),
            namespace.to_string(),
            name.to_string(),
        );
        let mut st = self.lock();
        if let Some(o) = st.objects.get_mut(&key)
            && o.manifest.get("status") != Some(status)
        {
            o.manifest["status"] = status.clone();
            st.touch(&key);
        }
        Ok(())
    }

    fn changed(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    async fn set_transfers(
        &self,
        work: &str,
        transfers: &[orrery_api::stateful::Transfer],
    ) -> Result<(), BackendError> {
        self.gate().await?;
        let changed = {
            let mut st = self.lock();
            if st.faults.data_mover_outage {
                return Err(BackendError::Unavailable(format!(
                    "simulated outage of {}'s data mover",
                    self.name
                )));
            }
            catch_up(&mut st, Instant::now());
            let State { data, pods, .. } = &mut *st;
            if transfers.is_empty() {
                data.drop_work(work)
            } else {
                data.set_transfers(work, transfers, &|ns, w| no_pods(pods, ns, w))
            }
        };
        if changed {
            self.bump();
        }
        Ok(())
    }

    async fn transfer_statuses(
        &self,
        work: &str,
        transfers: &[orrery_api::stateful::Transfer],
    ) -> Vec<orrery_api::stateful::TransferStatus> {
        self.lock().data.statuses(work, transfers)
    }

    fn transfer_stamp(&self) -> Option<u64> {
        let st = self.lock();
        (!st.faults.outage).then_some(st.data.transfer_stamp)
    }

    fn milestone(&self) -> u64 {
        self.lock().data.milestone
    }
}

impl SimCluster {
    /// Its peers' latencies, by region, with what a fleet file sets over them.
    fn latency_ms(&self, st: &State) -> BTreeMap<String, f64> {
        let mut latency_ms: BTreeMap<String, f64> = st
            .peers
            .iter()
            .filter(|(n, _)| *n != self.name)
            .map(|(n, region)| {
                (
                    n.clone(),
                    region_latency(&self.name, &self.region, n, region),
                )
            })
            .collect();
        // What a fleet file sets stands for a measurement (also of peers elsewhere).
        latency_ms.extend(st.latency_overrides.iter().map(|(k, v)| (k.clone(), *v)));
        latency_ms
    }

    /// The KEP-2149 ClusterProperties it reports: its name, GPU, cache and prices.
    fn properties(&self) -> BTreeMap<String, String> {
        let mut properties = BTreeMap::new();
        properties.insert("cluster.clusterset.k8s.io".into(), self.name.clone());
        properties.insert("clusterset.k8s.io".into(), "orrery".into());
        if !self.spec.gpu_model.is_empty() {
            properties.insert(
                orrery_api::data::GPU_MODEL_PROPERTY.into(),
                self.spec.gpu_model.clone(),
            );
        }
        if let Some(p) = self.spec.gpu_performance {
            properties.insert(
                orrery_api::data::GPU_PERFORMANCE_PROPERTY.into(),
                p.to_string(),
            );
        }
        if let Some(p) = self.spec.egress_per_gib {
            properties.insert(
                orrery_api::data::EGRESS_PRICE_PROPERTY.into(),
                p.to_string(),
            );
        }
        if let Some(q) = &self.spec.cache {
            properties.insert(orrery_api::data::CACHE_PROPERTY.into(), q.to_string());
        }
        for (k, v) in &self.spec.prices {
            properties.insert((*k).to_string(), v.clone());
        }
        properties
    }

    /// The member's own ServiceExports (Orrery's are applied copies, not the member's),
    /// with their Services' endpoints.
    fn own_service_exports(&self, st: &State) -> Vec<orrery_api::services::MemberExport> {
        st.objects
            .iter()
            .filter(|((g, k, _, _), o)| {
                g == orrery_api::services::GROUP
                    && k == orrery_api::services::EXPORT_KIND
                    && !is_managed(&o.manifest)
            })
            .map(|((_, _, ns, name), o)| {
                let service =
                    st.objects
                        .get(&(String::new(), "Service".into(), ns.clone(), name.clone()));
                orrery_api::services::MemberExport::of(
                    ns,
                    name,
                    &o.created,
                    o.manifest.get("spec"),
                    service.map(|s| &s.manifest),
                    service.and_then(|s| self.service_endpoints(st, ns, &s.manifest)),
                )
            })
            .collect()
    }
}

/// Each node as the agent writes it into ClusterMetrics: what it gives, and what is
/// asked of it (its background load counts).
fn node_infos(st: &State) -> Vec<orrery_api::quota::NodeInfo> {
    let mut requested: Vec<Res> = st.nodes.iter().map(|n| background(n, st.load)).collect();
    for p in st.pods.values().filter(|p| p.phase != Phase::Succeeded) {
        if let Some(i) = p.node {
            requested[i] = requested[i].add(p.request);
        }
    }
    st.nodes
        .iter()
        .zip(&requested)
        .map(|(n, r)| orrery_api::quota::NodeInfo {
            name: n.name.clone(),
            allocatable_resources: n.allocatable.to_list(true),
            allocated_resource_requests: r.to_list(false),
            allocated_resource_limits: Default::default(),
            labels: BTreeMap::from([("kubernetes.io/hostname".to_string(), n.name.clone())]),
            unschedulable: !n.ready,
        })
        .collect()
}

/// The most any one ready node has free, per resource (`per_node`: what each has left).
fn largest_free(ready: &[(usize, &Node)], per_node: &[Res]) -> Res {
    let mut largest = Res::default();
    for (i, _) in ready {
        let f = per_node[*i];
        largest.cpu_m = largest.cpu_m.max(f.cpu_m);
        largest.mem = largest.mem.max(f.mem);
        largest.gpu = largest.gpu.max(f.gpu);
    }
    largest
}
