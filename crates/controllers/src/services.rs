//! Multi-cluster services (KEP-1645). A `ServiceExport` beside a template Service exports
//! that Service from every member that runs it (the members its binding placed it in, as
//! their Works carry it): the controller merges what each member runs
//! ([`orrery_api::services::merge`]: the oldest export wins where they disagree), writes the
//! `ServiceImport` (a ClusterSet IP from `--clusterset-ip-range` for a ClusterSetIP service)
//! and one `EndpointSlice` per exporting cluster from the endpoints the members report, and
//! distributes both to the consuming clusters in a Work per cluster
//! (`orrery-mcs.<ns>.<svc>`), each slice weighed for that consumer by the export's traffic
//! policy. Members taking part get the KEP-2149 ClusterProperties in a Work of their own
//! (`orrery-clusterset`).
//!
//! Restart safety: what it decides comes from stored objects only (ClusterSet IPs are read
//! back from the imports), and it writes only what differs from what is stored, so a restart
//! writes nothing and no member sees an operation.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::Ipv4Addr;
use std::sync::Arc;

use orrery_api::cluster::{ClusterStatus, cluster_of_namespace, namespace_of};
use orrery_api::conditions::{self, Condition};
use orrery_api::labels::Selector;
use orrery_api::services::{
    self as mcs, ANNOTATION_CLUSTER_READY, ANNOTATION_CONSUMERS, ANNOTATION_EXPORT_STATUS,
    ANNOTATION_TRAFFIC_POLICY, ANNOTATION_WATER_LEVEL, ANNOTATION_WEIGHT, Export, Exported,
    IpRange, LABEL_MANAGED_BY, LABEL_SERVICE_NAME, LABEL_SOURCE_CLUSTER, MANAGED_BY, MemberExport,
    ServiceEndpoints, Source, TrafficPolicy,
};
use orrery_api::work::WorkStatus;
use orrery_api::{Object, OwnerReference, Time, keys};
use orrery_store::stamp::new_object;
use orrery_store::{Preconditions, Store, StoreError};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::runtime::cache::Cache;
use crate::runtime::controller::{self, Action, Controller, Keys, Origin, Reconciler};
use crate::runtime::metrics::Handle;
use crate::runtime::reflector::Event;

/// The consumer Works' names: `orrery-mcs.<namespace>.<service>`.
pub const WORK_PREFIX: &str = "orrery-mcs.";
/// The Work carrying a member's ClusterSet properties.
pub const CLUSTERSET_WORK: &str = "orrery-clusterset";
/// The ClusterSet's name (`clusterset.k8s.io`).
pub const CLUSTERSET: &str = "orrery";

#[derive(Clone, Debug, Default)]
pub struct Settings {
    pub ip_range: IpRange,
}

type Key = (String, String);

/// What one member runs of an exported Service.
#[derive(Clone, Debug)]
struct Running {
    /// When its Work was made (or the member made its export): the export's age.
    since: String,
    /// What its Service exports (`None`: it cannot be exported).
    service: Option<Exported>,
    endpoints: Option<ServiceEndpoints>,
    /// A member's own export's labels and annotations for the import (`None`: the control
    /// plane's export's).
    exported: Option<mcs::ExportedMeta>,
}

/// An export's conditions: invalid (`Valid` and `Ready` false, no `Conflict`), or valid with
/// the Service's `Ready` and `Conflict`. Times of unchanged conditions are kept.
fn export_conditions(
    conds: &mut Vec<Condition>,
    invalid: Option<&(String, String)>,
    ready: &Condition,
    conflict: Option<&Condition>,
    generation: Option<i64>,
    now: Time,
) {
    let mut set = |mut c: Condition| {
        c.observed_generation = generation;
        conditions::set(conds, c, now);
    };
    match invalid {
        Some((reason, message)) => {
            set(Condition::new(
                "Valid",
                conditions::FALSE,
                reason,
                message.clone(),
            ));
            set(Condition::new(
                "Ready",
                conditions::FALSE,
                "Failed",
                message.clone(),
            ));
            conds.retain(|c| c.type_ != "Conflict");
        }
        None => {
            set(Condition::new(
                "Valid",
                conditions::TRUE,
                "Valid",
                "the Service can be exported",
            ));
            set(ready.clone());
            match conflict {
                Some(c) => set(c.clone()),
                None => conds.retain(|c| c.type_ != "Conflict"),
            }
        }
    }
}

fn conditions_of(status: Option<&Value>) -> Vec<Condition> {
    status
        .and_then(|s| s.get("conditions"))
        .and_then(|c| serde_json::from_value(c.clone()).ok())
        .unwrap_or_default()
}

/// A cluster's routing facts, rounded so that heartbeats alone change nothing.
#[derive(Clone, Debug, PartialEq)]
struct ClusterFacts {
    ready: bool,
    /// Water level in hundredths.
    water: u32,
    latency_ms: f64,
    labels: BTreeMap<String, String>,
    deleting: bool,
    /// The group versions it serves (the MCS and About APIs' newer ones are used where
    /// served).
    served: BTreeSet<String>,
}

fn facts_of(c: &Object) -> ClusterFacts {
    let st = ClusterStatus::of(c);
    ClusterFacts {
        ready: st.ready(),
        water: st
            .water_level
            .as_ref()
            .map_or(0, |w| (w.overall * 20.0).round() as u32 * 5),
        latency_ms: st
            .network
            .as_ref()
            .and_then(|n| n.server_latency_ms)
            .map_or(0.0, |l| (l / 5.0).round() * 5.0),
        labels: c.labels().clone(),
        deleting: c.metadata.deletion_timestamp.is_some(),
        served: (st.api_enablements.iter())
            .filter(|a| {
                a.group_version.starts_with(mcs::GROUP) || a.group_version.starts_with(ABOUT_GROUP)
            })
            .map(|a| a.group_version.clone())
            .collect(),
    }
}

/// The About API's group (KEP-2149), and its versions, newest first.
const ABOUT_GROUP: &str = "about.k8s.io";
const ABOUT_VERSIONS: [&str; 2] = ["about.k8s.io/v1beta1", "about.k8s.io/v1alpha1"];

struct Services {
    store: Arc<dyn Store>,
    settings: Settings,
    exports: Arc<Cache>,
    services: Arc<Cache>,
    imports: Arc<Cache>,
    slices: Arc<Cache>,
    /// Exported-or-not, every Service a member's Work carries: by (namespace, name), by cluster.
    running: HashMap<Key, BTreeMap<String, Running>>,
    /// The Services each member Work carries, to forget them when it changes.
    work_services: HashMap<(String, String), Vec<Key>>,
    /// Orrery's own Works of multi-cluster services, by (cluster, work name).
    own_works: parking_lot::Mutex<HashMap<(String, String), Arc<Object>>>,
    clusters: BTreeMap<String, ClusterFacts>,
    /// Members' own exports, by service, by cluster.
    member_exports: HashMap<Key, BTreeMap<String, MemberExport>>,
    /// The services each cluster exports of its own (to forget them when it stops).
    exports_of: HashMap<String, Vec<Key>>,
    /// Clusters whose ClusterSet properties Work is known to be as it should.
    properties_done: parking_lot::Mutex<HashSet<String>>,
}

fn str_at<'a>(v: &'a Value, p: &str) -> &'a str {
    v.pointer(p).and_then(Value::as_str).unwrap_or("")
}

/// Whether a stored Work may carry a Service (or be one of ours): the rest are not parsed.
fn keep_work(json: &[u8]) -> bool {
    memchr::memmem::find(json, b"\"Service").is_some()
        || memchr::memmem::find(json, b"ClusterProperty").is_some()
}

impl Services {
    /// Takes in a Work (or its deletion, `None`), returning the services it concerns.
    fn observe_work(&mut self, w: &Object, present: bool) -> Vec<Key> {
        let Some(cluster) = cluster_of_namespace(w.namespace()).map(str::to_string) else {
            return Vec::new();
        };
        let wk = (w.namespace().to_string(), w.name().to_string());
        if w.name().starts_with(WORK_PREFIX) || w.name() == CLUSTERSET_WORK {
            let own = (cluster.clone(), w.name().to_string());
            if present {
                self.own_works.lock().insert(own, Arc::new(w.clone()));
            } else {
                self.own_works.lock().remove(&own);
                if w.name() == CLUSTERSET_WORK {
                    self.properties_done.lock().remove(&cluster);
                }
            }
            return w
                .name()
                .strip_prefix(WORK_PREFIX)
                .and_then(|rest| rest.split_once('.'))
                .map(|(ns, svc)| vec![(ns.to_string(), svc.to_string())])
                .unwrap_or_default();
        }
        let mut touched: Vec<Key> = self.work_services.remove(&wk).unwrap_or_default();
        for k in &touched {
            if let Some(m) = self.running.get_mut(k) {
                m.remove(&cluster);
                if m.is_empty() {
                    self.running.remove(k);
                }
            }
        }
        if !present || w.metadata.deletion_timestamp.is_some() {
            return touched;
        }
        let manifests = w
            .spec
            .as_ref()
            .and_then(|s| s.pointer("/workload/manifests"))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let status: WorkStatus = w
            .status
            .as_ref()
            .and_then(|s| serde_json::from_value(s.clone()).ok())
            .unwrap_or_default();
        let since = w
            .metadata
            .creation_timestamp
            .map(|t| t.to_string())
            .unwrap_or_default();
        let mut mine = Vec::new();
        for m in manifests {
            if str_at(&m, "/kind") != "Service" || str_at(&m, "/apiVersion") != "v1" {
                continue;
            }
            let key = (
                str_at(&m, "/metadata/namespace").to_string(),
                str_at(&m, "/metadata/name").to_string(),
            );
            let endpoints = status
                .manifest_statuses
                .iter()
                .find(|s| {
                    s.identifier.kind == "Service"
                        && s.identifier.namespace == key.0
                        && s.identifier.name == key.1
                        && s.applied
                })
                .and_then(|s| s.endpoints.clone());
            self.running.entry(key.clone()).or_default().insert(
                cluster.clone(),
                Running {
                    since: since.clone(),
                    service: Exported::of(&m).ok(),
                    endpoints,
                    exported: None,
                },
            );
            mine.push(key);
        }
        touched.extend(mine.iter().cloned());
        if !mine.is_empty() {
            self.work_services.insert(wk, mine);
        }
        touched
    }

    /// Takes in what a cluster reports of its own exports (`None`: the cluster is gone);
    /// returns the services whose exports changed.
    fn observe_member_exports(&mut self, cluster: &str, c: Option<&Object>) -> Vec<Key> {
        // Only that field: this runs on every heartbeat of every cluster.
        let reported: Vec<MemberExport> = c
            .and_then(|c| c.status.as_ref()?.get("serviceExports"))
            .and_then(|v| Vec::<MemberExport>::deserialize(v).ok())
            .unwrap_or_default();
        let before = self.exports_of.remove(cluster).unwrap_or_default();
        let mut changed = Vec::new();
        for k in &before {
            if !reported.iter().any(|e| e.namespace == k.0 && e.name == k.1)
                && let Some(m) = self.member_exports.get_mut(k)
            {
                m.remove(cluster);
                if m.is_empty() {
                    self.member_exports.remove(k);
                }
                changed.push(k.clone());
            }
        }
        let mut now = Vec::new();
        for e in reported {
            let k = (e.namespace.clone(), e.name.clone());
            now.push(k.clone());
            let m = self.member_exports.entry(k.clone()).or_default();
            if m.get(cluster) != Some(&e) {
                m.insert(cluster.to_string(), e);
                changed.push(k);
            }
        }
        if !now.is_empty() {
            self.exports_of.insert(cluster.to_string(), now);
        }
        changed
    }

    /// The consumers an export names (its selector over Clusters; every cluster without one).
    fn consumers(&self, export: &Object) -> Result<Vec<String>, String> {
        let selector = match export.metadata.annotations.get(ANNOTATION_CONSUMERS) {
            Some(s) => Selector::parse(s).map_err(|e| format!("{ANNOTATION_CONSUMERS}: {e}"))?,
            None => Selector::everything(),
        };
        Ok(self
            .clusters
            .iter()
            .filter(|(_, f)| !f.deleting && selector.matches(&f.labels))
            .map(|(n, _)| n.clone())
            .collect())
    }

    fn latency(&self, a: &str, b: &str) -> f64 {
        if a == b {
            return 0.0;
        }
        let l = |c: &str| self.clusters.get(c).map_or(0.0, |f| f.latency_ms);
        l(a) + l(b)
    }

    async fn sync(&self, key: &Key) -> Result<(), StoreError> {
        // A user's own ServiceImport of this name (Karmada's older multi-cluster service
        // sample makes one and propagates it): it is the user's, a template its policy
        // propagates; Orrery neither overwrites nor deletes it, derives nothing under its
        // name, and says so on the export.
        if let Some(user) = self
            .imports
            .get(&key.0, &key.1)
            .filter(|i| !mcs::is_derived_import(i))
        {
            return self.yield_to_user_import(key, &user).await;
        }
        let (ns, name) = key;
        let cp = self
            .exports
            .get(ns, name)
            .filter(|e| e.metadata.deletion_timestamp.is_none());
        let members = self.live_member_exports(key);
        if cp.is_none() && members.is_empty() {
            return self.withdraw(key).await;
        }
        let now = Time::now();
        let cp_invalid = cp.as_ref().and_then(|e| self.export_invalid(ns, name, e));
        // The control plane's export when it is valid: it names the consumers, its template's
        // copies export, and it owns the import.
        let valid_cp = cp.as_deref().filter(|_| cp_invalid.is_none());
        let consumers = self.consumer_set(valid_cp, &members);
        let policy = traffic_policy(cp.as_deref());
        let running = self.running_of(key, valid_cp.is_some(), &members);
        let cp_exported = mcs::ExportedMeta::of_spec(valid_cp.and_then(|e| e.spec.as_ref()));
        let merged = mcs::merge(&exports_of(&running, &cp_exported));
        let mut ready = ready_condition(&merged, consumers.len());
        let conflict = conflict_condition(&merged);
        let current = self.imports.get(ns, name);
        let ips = self.clusterset_ips(ns, name, current.as_deref(), &merged, &mut ready);
        let exporting = ready.status == conditions::TRUE;
        // The control plane export's status.
        let cp_conds = cp.as_ref().map(|e| {
            let mut conds = conditions_of(e.status.as_ref());
            export_conditions(
                &mut conds,
                cp_invalid.as_ref(),
                &ready,
                conflict.as_ref(),
                e.metadata.generation,
                now,
            );
            (e.clone(), conds)
        });
        if !exporting {
            if let Some((e, conds)) = cp_conds {
                self.write_export_status(&e, conds).await?;
            }
            return self.withdraw(key).await;
        }
        let spec = import_spec(&merged, &ips);
        let status = import_status(&merged);
        let import = self
            .put_import(
                ns,
                name,
                valid_cp,
                current,
                &merged.exported,
                (spec.clone(), status.clone()),
            )
            .await?;
        let water = self.water_levels(ns, name, &running);
        let src = SliceSource {
            ns,
            name,
            running: &running,
            merged: &merged,
            water: &water,
        };
        let sources = self.sources(&src);
        // One slice per exporting cluster, in the control plane.
        let wanted_slices: BTreeMap<String, Value> = self
            .exported_slices(&src, None)
            .into_iter()
            .map(|(c, s)| (slice_name(name, &c), s))
            .collect();
        self.put_slices(ns, name, &import, wanted_slices).await?;
        // The consumers' Works.
        let work_name = format!("{WORK_PREFIX}{ns}.{name}");
        let mut writes = Vec::new();
        for consumer in &consumers {
            let weights = mcs::weights(policy, consumer, &sources, &|c| self.latency(consumer, c));
            let mut import_manifest = json!({
                "apiVersion": self.member_version(consumer, &work_name, &mcs::API_VERSIONS),
                "kind": mcs::IMPORT_KIND,
                "metadata": {"name": name, "namespace": ns},
                "spec": self.member_import_spec(consumer, &work_name, &spec),
                "status": status,
            });
            if let Some((_, e)) = members.iter().find(|(c, _)| c == consumer) {
                import_manifest["metadata"]["annotations"] = self.member_export_annotations(
                    consumer,
                    &work_name,
                    e,
                    &ready,
                    conflict.as_ref(),
                    now,
                );
            }
            let mut manifests = vec![import_manifest];
            manifests.extend(
                self.exported_slices(&src, Some(&weights))
                    .into_iter()
                    .map(|(_, s)| s),
            );
            let spec = json!({"workload": {"manifests": manifests}});
            writes.push((consumer.clone(), spec));
        }
        let stale = self.stale_works(&work_name, &consumers);
        self.put_works(&work_name, writes, stale).await?;
        // Members taking part carry the ClusterSet properties.
        for c in merged.clusters.iter().chain(consumers.iter()) {
            self.ensure_properties(c).await?;
        }
        match cp_conds {
            Some((e, conds)) => self.write_export_status(&e, conds).await,
            None => Ok(()),
        }
    }

    /// Members' own exports of this Service, from live (not deleting) clusters only.
    fn live_member_exports(&self, key: &Key) -> Vec<(String, MemberExport)> {
        self.member_exports
            .get(key)
            .map(|m| {
                m.iter()
                    .filter(|(c, _)| self.live(c))
                    .map(|(c, e)| (c.clone(), e.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Whether a cluster is known and not being deleted.
    fn live(&self, cluster: &str) -> bool {
        self.clusters.get(cluster).is_some_and(|f| !f.deleting)
    }

    /// Why the control plane's export is invalid (reason, message), if it is: its template
    /// must exist and be exportable, and its consumer selector must parse.
    fn export_invalid(&self, ns: &str, name: &str, export: &Object) -> Option<(String, String)> {
        let template = match self.services.get(ns, name) {
            None => Some((
                "NoService".to_string(),
                format!("no Service {ns}/{name} in the control plane"),
            )),
            Some(s) => Exported::of(&serde_json::to_value(&*s).unwrap_or_default())
                .err()
                .map(|e| (e.reason.to_string(), e.message)),
        };
        template.or_else(|| {
            self.consumers(export)
                .err()
                .map(|m| ("InvalidConsumerSelector".to_string(), m))
        })
    }

    /// The clusters that import the Service: those a valid control plane export names (else
    /// every cluster not being deleted), and members that export of their own (they hear how
    /// it went through their copy).
    fn consumer_set(
        &self,
        valid_cp: Option<&Object>,
        members: &[(String, MemberExport)],
    ) -> BTreeSet<String> {
        let mut consumers: BTreeSet<String> = match valid_cp {
            Some(e) => self.consumers(e).unwrap_or_default().into_iter().collect(),
            None => self
                .clusters
                .iter()
                .filter(|(_, f)| !f.deleting)
                .map(|(n, _)| n.clone())
                .collect(),
        };
        consumers.extend(members.iter().map(|(c, _)| c.clone()));
        consumers
    }

    /// What each exporting member runs: the template's copies (for a valid export in the
    /// control plane), and members' own exports.
    fn running_of(
        &self,
        key: &Key,
        valid_cp: bool,
        members: &[(String, MemberExport)],
    ) -> BTreeMap<String, Running> {
        let mut running: BTreeMap<String, Running> = BTreeMap::new();
        if valid_cp && let Some(m) = self.running.get(key) {
            running.extend(
                m.iter()
                    .filter(|(c, _)| self.live(c))
                    .map(|(c, r)| (c.clone(), r.clone())),
            );
        }
        for (c, e) in members {
            if let Some(service) = &e.service {
                running.insert(
                    c.clone(),
                    Running {
                        since: e.created.clone(),
                        service: Some(service.clone()),
                        endpoints: e.endpoints.clone(),
                        exported: Some(e.exported.clone()),
                    },
                );
            }
        }
        running
    }

    /// The ClusterSet IP of a ClusterSetIP service that some cluster exports: the import's,
    /// else a free one; when the range is full, `ready` says so and there is none.
    fn clusterset_ips(
        &self,
        ns: &str,
        name: &str,
        current: Option<&Object>,
        merged: &mcs::Merged,
        ready: &mut Condition,
    ) -> Vec<String> {
        let mut ips: Vec<String> = Vec::new();
        if merged.headless || merged.clusters.is_empty() {
            return ips;
        }
        let kept = current
            .and_then(|i| i.spec.as_ref())
            .and_then(|s| s.pointer("/ips/0"))
            .and_then(Value::as_str)
            .and_then(|ip| ip.parse::<Ipv4Addr>().ok())
            .filter(|ip| self.settings.ip_range.contains(*ip));
        let ip = kept.or_else(|| {
            let used: BTreeSet<Ipv4Addr> = self
                .imports
                .list()
                .iter()
                .filter_map(|i| i.spec.as_ref()?.pointer("/ips/0")?.as_str()?.parse().ok())
                .collect();
            self.settings
                .ip_range
                .allocate(&format!("{ns}/{name}"), &used)
        });
        match ip {
            Some(ip) => ips.push(ip.to_string()),
            None => {
                *ready = Condition::new(
                    "Ready",
                    conditions::FALSE,
                    "Failed",
                    format!("the ClusterSet IP range {} is full", self.settings.ip_range),
                );
            }
        }
        ips
    }

    /// Each source's water level as the slices say it: the stored one while the cluster's
    /// level stays within 0.1 of it (a level wavering about a step's edge would rewrite
    /// every consumer's copy; kept in the store, so a restart keeps it too).
    fn water_levels(
        &self,
        ns: &str,
        name: &str,
        running: &BTreeMap<String, Running>,
    ) -> BTreeMap<String, f64> {
        running
            .keys()
            .map(|c| {
                let now = self
                    .clusters
                    .get(c)
                    .map_or(0.0, |f| f64::from(f.water) / 100.0);
                let stored = self.slices.get(ns, &slice_name(name, c)).and_then(|s| {
                    s.metadata
                        .annotations
                        .get(ANNOTATION_WATER_LEVEL)?
                        .parse::<f64>()
                        .ok()
                });
                let level = match stored {
                    Some(w) if (w - now).abs() < 0.1 - 1e-9 => w,
                    _ => now,
                };
                (c.clone(), level)
            })
            .collect()
    }

    /// The exporting clusters as the traffic policy weighs them.
    fn sources(&self, src: &SliceSource) -> Vec<Source> {
        src.running
            .iter()
            .filter(|(c, _)| src.merged.clusters.contains(c))
            .map(|(c, r)| Source {
                cluster: c.clone(),
                ready: self.clusters.get(c).is_some_and(|f| f.ready),
                endpoints: r.endpoints.as_ref().map_or(0, |e| e.ready().count()),
                water_level: src.water.get(c).copied().unwrap_or(0.0),
            })
            .collect()
    }

    /// The slice of each exporting cluster (by cluster, in order), weighed for a consumer
    /// when `weights` are given.
    fn exported_slices(
        &self,
        src: &SliceSource,
        weights: Option<&BTreeMap<String, u32>>,
    ) -> Vec<(String, Value)> {
        src.running
            .iter()
            .filter(|(c, _)| src.merged.clusters.contains(c))
            .map(|(c, r)| {
                let weight = weights.and_then(|w| w.get(c).copied());
                (c.clone(), self.slice_of(src, c, r, weight))
            })
            .collect()
    }

    /// The EndpointSlice of one exporting cluster.
    fn slice_of(
        &self,
        src: &SliceSource,
        cluster: &str,
        r: &Running,
        weight: Option<u32>,
    ) -> Value {
        let (ns, name) = (src.ns, src.name);
        let facts = self.clusters.get(cluster);
        let ready = facts.is_some_and(|f| f.ready);
        let eps = r.endpoints.clone().unwrap_or_default();
        let endpoints: Vec<Value> = eps
            .endpoints
            .iter()
            .map(|e| {
                let mut e = serde_json::to_value(e).unwrap_or_default();
                // A cluster that stopped reporting serves nobody until it is back.
                if !ready {
                    e["conditions"]["ready"] = json!(false);
                }
                e
            })
            .collect();
        let mut annotations = json!({
            ANNOTATION_CLUSTER_READY: ready.to_string(),
            ANNOTATION_WATER_LEVEL: format!("{:.2}", src.water.get(cluster).copied().unwrap_or(0.0)),
        });
        if let Some(w) = weight {
            annotations[ANNOTATION_WEIGHT] = json!(w.to_string());
        }
        json!({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": slice_name(name, cluster),
                "namespace": ns,
                "labels": {
                    LABEL_SERVICE_NAME: name,
                    LABEL_SOURCE_CLUSTER: cluster,
                    LABEL_MANAGED_BY: MANAGED_BY,
                },
                "annotations": annotations,
            },
            "addressType": if eps.address_type.is_empty() { "IPv4".to_string() } else { eps.address_type.clone() },
            "endpoints": endpoints,
            "ports": eps.ports,
        })
    }

    /// A member's own export: how it went, kept with the times it last changed (the
    /// annotations of the import sent to it).
    fn member_export_annotations(
        &self,
        consumer: &str,
        work_name: &str,
        export: &MemberExport,
        ready: &Condition,
        conflict: Option<&Condition>,
        now: Time,
    ) -> Value {
        let mut conds = self.member_conditions(consumer, work_name);
        export_conditions(
            &mut conds,
            export.invalid.as_ref(),
            ready,
            conflict,
            None,
            now,
        );
        json!({
            ANNOTATION_EXPORT_STATUS: json!({ "conditions": conds }).to_string(),
        })
    }

    /// The apiVersion of a Work's first manifest for `cluster`: the one its Work has now (a
    /// Work keeps its version, so that a new Orrery changes nothing in a member), else the
    /// newest of `versions` the member serves, else the oldest.
    fn member_version(
        &self,
        cluster: &str,
        work_name: &str,
        versions: &[&'static str],
    ) -> &'static str {
        let have = self
            .own_works
            .lock()
            .get(&(cluster.to_string(), work_name.to_string()))
            .and_then(|w| {
                let v = w
                    .spec
                    .as_ref()?
                    .pointer("/workload/manifests/0/apiVersion")?;
                versions.iter().copied().find(|x| Some(*x) == v.as_str())
            });
        let served = || {
            let facts = self.clusters.get(cluster)?;
            versions.iter().copied().find(|v| facts.served.contains(*v))
        };
        have.or_else(served)
            .or_else(|| versions.last().copied())
            .unwrap_or_default()
    }

    /// The import spec for `cluster`'s Work: `spec`, except that a Work from before imports
    /// named their IP family keeps its form while nothing else changes (a new Orrery changes
    /// nothing in a member; the family comes with the import's next change).
    fn member_import_spec(&self, cluster: &str, work_name: &str, spec: &Value) -> Value {
        let works = self.own_works.lock();
        let have = works
            .get(&(cluster.to_string(), work_name.to_string()))
            .and_then(|w| w.spec.as_ref()?.pointer("/workload/manifests/0/spec"));
        if let Some(have) = have
            && have.get("ipFamilies").is_none()
        {
            let mut without = spec.clone();
            if let Some(m) = without.as_object_mut() {
                m.remove("ipFamilies");
            }
            if *have == without {
                return without;
            }
        }
        spec.clone()
    }

    /// Orrery's Works of this name in clusters that no longer consume.
    fn stale_works(&self, work_name: &str, consumers: &BTreeSet<String>) -> Vec<String> {
        self.own_works
            .lock()
            .keys()
            .filter(|(c, w)| *w == work_name && !consumers.contains(c))
            .map(|(c, _)| c.clone())
            .collect()
    }

    /// The conditions last sent to `cluster` for its own export (so their times hold).
    fn member_conditions(&self, cluster: &str, work_name: &str) -> Vec<Condition> {
        self.own_works
            .lock()
            .get(&(cluster.to_string(), work_name.to_string()))
            .and_then(|w| w.spec.as_ref()?.pointer("/workload/manifests/0").cloned())
            .and_then(|i| {
                let text = i
                    .pointer("/metadata/annotations")?
                    .get(ANNOTATION_EXPORT_STATUS)?
                    .as_str()?
                    .to_string();
                serde_json::from_str::<Value>(&text).ok()
            })
            .map(|s| conditions_of(Some(&s)))
            .unwrap_or_default()
    }

    async fn write_export_status(
        &self,
        export: &Object,
        conds: Vec<Condition>,
    ) -> Result<(), StoreError> {
        let status = json!({ "conditions": conds });
        if export.status.as_ref() == Some(&status) {
            return Ok(());
        }
        let key = keys::object(
            mcs::GROUP,
            mcs::EXPORT_PLURAL,
            Some(export.namespace()),
            export.name(),
        );
        let uid = export.metadata.uid.clone();
        match orrery_store::update_with(self.store.as_ref(), &key, |mut cur| {
            if cur.metadata.uid != uid || cur.status.as_ref() == Some(&status) {
                return Ok(None);
            }
            cur.status = Some(status.clone());
            Ok(Some(cur))
        })
        .await
        {
            Ok(stored) => {
                self.exports
                    .upsert(stored.clone(), stored.revision().unwrap_or(0));
                Ok(())
            }
            Err(StoreError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn put_import(
        &self,
        ns: &str,
        name: &str,
        export: Option<&Object>,
        current: Option<Arc<Object>>,
        exported: &mcs::ExportedMeta,
        (spec, status): (Value, Value),
    ) -> Result<Arc<Object>, StoreError> {
        let key = orrery_api::kinds::SERVICE_IMPORT.key(ns, name);
        // The oldest export's `exportedLabels` and `exportedAnnotations` go on the import.
        let (mut labels, annotations) = (
            exported.exported_labels.clone(),
            exported.exported_annotations.clone(),
        );
        labels.insert(mcs::LABEL_DERIVED.into(), "true".into());
        let same = |cur: &Object| {
            cur.spec.as_ref() == Some(&spec)
                && cur.status.as_ref() == Some(&status)
                && cur.metadata.labels == labels
                && cur.metadata.annotations == annotations
        };
        if let Some(cur) = &current
            && same(cur)
        {
            return Ok(cur.clone());
        }
        let stored = match current {
            Some(_) => {
                orrery_store::update_with(self.store.as_ref(), &key, |mut cur| {
                    if same(&cur) {
                        return Ok(None);
                    }
                    if cur.spec.as_ref() != Some(&spec) {
                        cur.metadata.generation = Some(cur.metadata.generation.unwrap_or(1) + 1);
                    }
                    cur.spec = Some(spec.clone());
                    cur.status = Some(status.clone());
                    cur.metadata.labels = labels.clone();
                    cur.metadata.annotations = annotations.clone();
                    Ok(Some(cur))
                })
                .await?
            }
            None => {
                let mut i = new_object(mcs::API_VERSION, mcs::IMPORT_KIND, Some(ns), name);
                // Owned by the control plane's export (members' own exports are taken back
                // by this controller when they go).
                i.metadata.owner_references = export
                    .map(OwnerReference::controller_of)
                    .into_iter()
                    .collect();
                i.metadata.labels = labels;
                i.metadata.annotations = annotations;
                i.spec = Some(spec);
                i.status = Some(status);
                self.store.create(&key, i).await?
            }
        };
        self.imports
            .upsert(stored.clone(), stored.revision().unwrap_or(0));
        Ok(stored)
    }

    async fn put_slices(
        &self,
        ns: &str,
        service: &str,
        import: &Object,
        wanted: BTreeMap<String, Value>,
    ) -> Result<(), StoreError> {
        let current: Vec<Arc<Object>> = self
            .slices
            // By the service-name index, not a scan of the namespace's slices.
            .with_label(LABEL_SERVICE_NAME, service)
            .into_iter()
            .filter(|s| {
                s.namespace() == ns
                    && s.labels().get(LABEL_MANAGED_BY).map(String::as_str) == Some(MANAGED_BY)
            })
            .collect();
        for s in &current {
            if !wanted.contains_key(s.name()) {
                self.delete(&slice_key(ns, s.name())).await?;
            }
        }
        for (slice, value) in wanted {
            let mut o = Object::from_value(value)
                .map_err(|e| StoreError::InvalidArgument(format!("an EndpointSlice: {e}")))?;
            let key = slice_key(ns, &slice);
            match current.iter().find(|s| s.name() == slice) {
                Some(cur) if same_slice(cur, &o) => {}
                Some(cur) => {
                    let mut next = (**cur).clone();
                    next.metadata.labels = o.metadata.labels.clone();
                    next.metadata.annotations = o.metadata.annotations.clone();
                    next.other = o.other.clone();
                    match self.store.update(&key, next, cur.revision()).await {
                        Ok(stored) => self
                            .slices
                            .upsert(stored.clone(), stored.revision().unwrap_or(0)),
                        // Changed meanwhile: the event brings it, and a retry settles it.
                        Err(e) => return Err(e),
                    }
                }
                None => {
                    let mut fresh =
                        new_object("discovery.k8s.io/v1", "EndpointSlice", Some(ns), &slice);
                    fresh.metadata.labels = std::mem::take(&mut o.metadata.labels);
                    fresh.metadata.annotations = std::mem::take(&mut o.metadata.annotations);
                    fresh.metadata.owner_references = vec![OwnerReference::controller_of(import)];
                    fresh.other = o.other;
                    match self.store.create(&key, fresh).await {
                        Ok(stored) => self
                            .slices
                            .upsert(stored.clone(), stored.revision().unwrap_or(0)),
                        Err(e) => return Err(e),
                    }
                }
            }
        }
        Ok(())
    }

    /// Writes the consumers' Works (concurrently: a change reaches every consumer at once) and
    /// deletes those of clusters that no longer consume.
    async fn put_works(
        &self,
        work_name: &str,
        writes: Vec<(String, Value)>,
        stale: Vec<String>,
    ) -> Result<(), StoreError> {
        let mut jobs = Vec::new();
        for (cluster, spec) in writes {
            let current = self
                .own_works
                .lock()
                .get(&(cluster.clone(), work_name.to_string()))
                .cloned();
            if current
                .as_ref()
                .is_some_and(|w| w.spec.as_ref() == Some(&spec))
            {
                continue;
            }
            let store = self.store.clone();
            let work_name = work_name.to_string();
            jobs.push(async move {
                let key = keys::well_known::work(&namespace_of(&cluster), &work_name);
                let r = match current {
                    Some(_) => {
                        orrery_store::update_with(store.as_ref(), &key, |mut cur| {
                            if cur.spec.as_ref() == Some(&spec) {
                                return Ok(None);
                            }
                            cur.spec = Some(spec.clone());
                            cur.metadata.generation =
                                Some(cur.metadata.generation.unwrap_or(1) + 1);
                            Ok(Some(cur))
                        })
                        .await
                    }
                    None => {
                        let mut w = new_object(
                            "multicluster.io/v1alpha1",
                            "Work",
                            Some(&namespace_of(&cluster)),
                            &work_name,
                        );
                        w.spec = Some(spec);
                        store.create(&key, w).await
                    }
                };
                (cluster, work_name, r)
            });
        }
        let mut first_error = None;
        for (cluster, work_name, r) in futures_util::future::join_all(jobs).await {
            match r {
                Ok(stored) => {
                    self.own_works.lock().insert((cluster, work_name), stored);
                }
                // The cluster's namespace is going, or someone wrote it first: read it again.
                Err(StoreError::NotFound { .. }) => {}
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        for cluster in stale {
            self.delete(&keys::well_known::work(&namespace_of(&cluster), work_name))
                .await?;
            self.own_works
                .lock()
                .remove(&(cluster, work_name.to_string()));
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    async fn ensure_properties(&self, cluster: &str) -> Result<(), StoreError> {
        if self.properties_done.lock().contains(cluster) {
            return Ok(());
        }
        let version = self.member_version(cluster, CLUSTERSET_WORK, &ABOUT_VERSIONS);
        let property = |name: &str, value: &str| {
            json!({
                "apiVersion": version,
                "kind": "ClusterProperty",
                "metadata": {"name": name},
                "spec": {"value": value},
            })
        };
        let spec = json!({"workload": {"manifests": [
            property(mcs::PROPERTY_CLUSTER, cluster),
            property(mcs::PROPERTY_CLUSTERSET, CLUSTERSET),
        ]}});
        self.put_works(
            CLUSTERSET_WORK,
            vec![(cluster.to_string(), spec)],
            Vec::new(),
        )
        .await?;
        self.properties_done.lock().insert(cluster.to_string());
        Ok(())
    }

    /// A user's ServiceImport holds the name: what Orrery derived under it goes (its slices
    /// and consumer Works, never the import), and an export of the name says why it is not
    /// imported.
    async fn yield_to_user_import(&self, key: &Key, user: &Object) -> Result<(), StoreError> {
        let (ns, name) = key;
        // One a user wrote over an import Orrery derived keeps nothing that says it is
        // Orrery's (the export owning it would take it away with it).
        if user.metadata.labels.contains_key(mcs::LABEL_DERIVED)
            || user
                .metadata
                .owner_references
                .iter()
                .any(|r| r.kind == mcs::EXPORT_KIND)
        {
            let key = orrery_api::kinds::SERVICE_IMPORT.key(ns, name);
            let uid = user.metadata.uid.clone();
            match orrery_store::update_with(self.store.as_ref(), &key, |mut cur| {
                if cur.metadata.uid != uid {
                    return Ok(None);
                }
                cur.metadata.labels.remove(mcs::LABEL_DERIVED);
                cur.metadata
                    .owner_references
                    .retain(|r| r.kind != mcs::EXPORT_KIND);
                Ok(Some(cur))
            })
            .await
            {
                Ok(_) | Err(StoreError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        if let Some(e) = self
            .exports
            .get(ns, name)
            .filter(|e| e.metadata.deletion_timestamp.is_none())
        {
            let message = format!(
                "the ServiceImport {ns}/{name} was written by a user (a template, propagated as its policy says); Orrery does not overwrite it. Delete it to have Orrery import {ns}/{name} from the exporting clusters"
            );
            let mut conds = conditions_of(e.status.as_ref());
            export_conditions(
                &mut conds,
                None,
                &Condition::new("Ready", conditions::FALSE, "ImportExists", message),
                None,
                e.metadata.generation,
                Time::now(),
            );
            self.write_export_status(&e, conds).await?;
        }
        self.withdraw_derived(key, false).await
    }

    /// Takes back what an export made: its import, slices and consumer Works (and the export
    /// is gone or cannot be exported).
    async fn withdraw(&self, key: &Key) -> Result<(), StoreError> {
        self.withdraw_derived(key, true).await
    }

    /// [`Self::withdraw`]; the import too where `import` (and it is Orrery's).
    async fn withdraw_derived(&self, key: &Key, import: bool) -> Result<(), StoreError> {
        let (ns, name) = key;
        if import
            && self
                .imports
                .get(ns, name)
                .is_some_and(|i| mcs::is_derived_import(&i))
        {
            self.delete(&keys::object(
                mcs::GROUP,
                mcs::IMPORT_PLURAL,
                Some(ns),
                name,
            ))
            .await?;
            if let Some(i) = self.imports.get(ns, name) {
                self.imports.remove(&i, i.revision().unwrap_or(0));
            }
        }
        self.put_slices(ns, name, &Object::default(), BTreeMap::new())
            .await?;
        let work_name = format!("{WORK_PREFIX}{ns}.{name}");
        let stale: Vec<String> = self
            .own_works
            .lock()
            .keys()
            .filter(|(_, w)| *w == work_name)
            .map(|(c, _)| c.clone())
            .collect();
        self.put_works(&work_name, Vec::new(), stale).await
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        match self.store.delete(key, &Preconditions::default()).await {
            Ok(_) | Err(StoreError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// The exporting side of one Service, which its slices are made from.
struct SliceSource<'a> {
    ns: &'a str,
    name: &'a str,
    running: &'a BTreeMap<String, Running>,
    merged: &'a mcs::Merged,
    water: &'a BTreeMap<String, f64>,
}

/// The control plane export's traffic policy (the default when it has none or it is unknown).
fn traffic_policy(cp: Option<&Object>) -> TrafficPolicy {
    cp.and_then(|e| e.metadata.annotations.get(ANNOTATION_TRAFFIC_POLICY))
        .and_then(|p| p.parse().ok())
        .unwrap_or_default()
}

/// The exports to merge: the members that run an exportable Service.
fn exports_of(running: &BTreeMap<String, Running>, cp: &mcs::ExportedMeta) -> Vec<Export> {
    running
        .iter()
        .filter_map(|(c, r)| {
            Some(Export {
                cluster: c.clone(),
                since: r.since.clone(),
                service: r.service.clone()?,
                exported: r.exported.clone().unwrap_or_else(|| cp.clone()),
            })
        })
        .collect()
}

/// `Ready`, for every export of this Service alike (before the ClusterSet IP is known).
fn ready_condition(merged: &mcs::Merged, consumers: usize) -> Condition {
    if merged.clusters.is_empty() {
        Condition::new(
            "Ready",
            conditions::FALSE,
            "Pending",
            "no member cluster runs the Service yet",
        )
    } else {
        Condition::new(
            "Ready",
            conditions::TRUE,
            "Exported",
            format!(
                "exported from {} cluster(s) ({}), imported into {}",
                merged.clusters.len(),
                merged.clusters.join(", "),
                consumers
            ),
        )
    }
}

/// `Conflict`, for every export of this Service alike (none while no cluster exports).
fn conflict_condition(merged: &mcs::Merged) -> Option<Condition> {
    (!merged.clusters.is_empty()).then(|| {
        if merged.conflicts.is_empty() {
            Condition::new(
                "Conflict",
                conditions::FALSE,
                "NoConflicts",
                "the exports agree",
            )
        } else {
            let reasons: Vec<&str> = merged.conflicts.iter().map(|(r, _)| *r).collect();
            let messages: Vec<&str> = merged.conflicts.iter().map(|(_, m)| m.as_str()).collect();
            Condition::new(
                "Conflict",
                conditions::TRUE,
                &reasons.join(","),
                messages.join(" "),
            )
        }
    })
}

/// The import's spec: the merged type, ports, affinity and traffic settings, and its ClusterSet
/// IP if any (of the family `ipFamilies` names: the range is IPv4).
fn import_spec(merged: &mcs::Merged, ips: &[String]) -> Value {
    let mut spec = json!({
        "type": if merged.headless { "Headless" } else { "ClusterSetIP" },
        "ports": merged.ports,
        "sessionAffinity": merged.session_affinity,
    });
    if let Some(c) = &merged.session_affinity_config {
        spec["sessionAffinityConfig"] = c.clone();
    }
    if let Some(p) = &merged.internal_traffic_policy {
        spec["internalTrafficPolicy"] = json!(p);
    }
    if let Some(d) = &merged.traffic_distribution {
        spec["trafficDistribution"] = json!(d);
    }
    if !ips.is_empty() {
        spec["ips"] = json!(ips);
        spec["ipFamilies"] = json!(vec!["IPv4"; ips.len()]);
    }
    spec
}

/// The import's status: the exporting clusters, and its endpoints distributed.
fn import_status(merged: &mcs::Merged) -> Value {
    json!({
        "clusters": merged.clusters.iter().map(|c| json!({"cluster": c})).collect::<Vec<_>>(),
        "conditions": [{"type": "Ready", "status": "True", "reason": "Ready",
                        "message": "the import's endpoints are distributed"}],
    })
}

/// `<service>-<cluster>-<hash>`: the hash keeps `a-b` of `c` apart from `a` of `b-c`.
fn slice_name(service: &str, cluster: &str) -> String {
    let h = format!("{service}/{cluster}")
        .bytes()
        .fold(0x811c_9dc5u32, |h, b| {
            (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
        });
    format!("{service}-{cluster}-{:06x}", h & 0xff_ffff)
}

fn slice_key(ns: &str, name: &str) -> String {
    keys::object("discovery.k8s.io", "endpointslices", Some(ns), name)
}

fn same_slice(cur: &Object, want: &Object) -> bool {
    cur.metadata.labels == want.metadata.labels
        && cur.metadata.annotations == want.metadata.annotations
        && cur.other == want.other
}

#[async_trait::async_trait]
impl Reconciler for Services {
    /// A service's namespace and name.
    type Key = Key;
    type Error = StoreError;

    fn on_event(&mut self, source: Origin, ev: Event, keys: &mut Keys<Key>) {
        let key_of = |o: &Object| (o.namespace().to_string(), o.name().to_string());
        match (source.name, ev) {
            ("clusters", Event::Listed(items)) => {
                self.clusters = items
                    .iter()
                    .map(|o| (o.name().to_string(), facts_of(o)))
                    .collect();
                let clusters = &self.clusters;
                self.properties_done
                    .get_mut()
                    .retain(|n| clusters.contains_key(n));
                self.member_exports.clear();
                self.exports_of.clear();
                for o in &items {
                    self.observe_member_exports(o.name(), Some(o));
                }
                keys.all();
            }
            ("clusters", Event::Upsert(o)) => {
                let f = facts_of(&o);
                if self.clusters.get(o.name()) != Some(&f) {
                    self.clusters.insert(o.name().to_string(), f);
                    keys.all();
                }
                keys.extend(self.observe_member_exports(o.name(), Some(&o)));
            }
            ("clusters", Event::Delete(o)) => {
                self.clusters.remove(o.name());
                self.properties_done.get_mut().remove(o.name());
                keys.extend(self.observe_member_exports(o.name(), None));
                keys.all();
            }
            ("works", Event::Listed(items)) => {
                self.running.clear();
                self.work_services.clear();
                self.own_works.get_mut().clear();
                self.properties_done.get_mut().clear();
                for w in items {
                    self.observe_work(&w, true);
                }
                keys.all();
            }
            ("works", Event::Upsert(w)) => keys.extend(self.observe_work(&w, true)),
            ("works", Event::Delete(w)) => keys.extend(self.observe_work(&w, false)),
            (_, Event::Listed(_)) => keys.all(),
            ("slices", Event::Upsert(o) | Event::Delete(o)) => {
                if let Some(svc) = o.labels().get(LABEL_SERVICE_NAME) {
                    keys.push((o.namespace().to_string(), svc.clone()));
                }
            }
            (_, Event::Upsert(o) | Event::Delete(o)) => keys.push(key_of(&o)),
        }
    }

    fn all_keys(&self) -> Vec<Key> {
        let key_of = |o: &Object| (o.namespace().to_string(), o.name().to_string());
        let mut all: BTreeSet<Key> = self.exports.list().iter().map(|o| key_of(o)).collect();
        all.extend(self.imports.list().iter().map(|o| key_of(o)));
        all.extend(self.member_exports.keys().cloned());
        for (_, w) in self.own_works.lock().keys() {
            if let Some((ns, svc)) = w.strip_prefix(WORK_PREFIX).and_then(|r| r.split_once('.')) {
                all.insert((ns.to_string(), svc.to_string()));
            }
        }
        all.into_iter().collect()
    }

    async fn reconcile(&self, key: &Key) -> Result<Action, StoreError> {
        self.sync(key).await.map(|_| Action::Done)
    }
}

/// Runs the controller until shutdown.
pub async fn run(
    store: Arc<dyn Store>,
    settings: Settings,
    metrics: Handle,
    shutdown: watch::Receiver<bool>,
) {
    let cache = || Arc::new(Cache::new(&[]));
    let (exports, services, imports) = (cache(), cache(), cache());
    let slices = Arc::new(Cache::new(&[LABEL_SERVICE_NAME]));
    let r = Services {
        store: store.clone(),
        settings,
        exports: exports.clone(),
        services: services.clone(),
        imports: imports.clone(),
        slices: slices.clone(),
        running: HashMap::new(),
        work_services: HashMap::new(),
        own_works: Default::default(),
        clusters: BTreeMap::new(),
        member_exports: HashMap::new(),
        exports_of: HashMap::new(),
        properties_done: Default::default(),
    };
    let mcs = |plural| keys::prefix(mcs::GROUP, plural, None);
    Controller::new("services", store, r, metrics)
        .source(controller::Source::new("exports", mcs(mcs::EXPORT_PLURAL)).cached(exports))
        .source(
            controller::Source::new("services", keys::prefix("", "services", None))
                .cached(services),
        )
        .source(controller::Source::new("imports", mcs(mcs::IMPORT_PLURAL)).cached(imports))
        .source(
            controller::Source::new(
                "slices",
                keys::prefix("discovery.k8s.io", "endpointslices", None),
            )
            .cached(slices),
        )
        // What is read of a Cluster is kept as its facts: the Clusters themselves are not
        // cached (a parsed Cluster is about 25 KB; at 10,000 members a quarter of a GiB).
        .source(controller::Source::new(
            "clusters",
            keys::well_known::clusters(),
        ))
        .source(controller::Source::new("works", keys::well_known::works(None)).filtered(keep_work))
        .run(shutdown)
        .await;
}
