//! Multi-cluster services (SIG-Multicluster KEP-1645): what a member reports of a Service it
//! runs (its endpoints), how the exports of one Service from several clusters merge into one
//! `ServiceImport` (the oldest export wins where they disagree, ports are a union), and
//! ClusterSet IP allocation. Pure: the controller reads and writes the objects.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The MCS API group, the version Orrery stores (mcs-api v0.5.0's storage version) and the
/// older one it serves too (the same schema).
pub const GROUP: &str = "multicluster.x-k8s.io";
pub const VERSION: &str = "v1beta1";
pub const API_VERSION: &str = "multicluster.x-k8s.io/v1beta1";
pub const VERSION_V1ALPHA1: &str = "v1alpha1";
pub const API_VERSION_V1ALPHA1: &str = "multicluster.x-k8s.io/v1alpha1";
/// The versions a member may serve, newest first.
pub const API_VERSIONS: [&str; 2] = [API_VERSION, API_VERSION_V1ALPHA1];
pub const EXPORT_KIND: &str = "ServiceExport";
pub const EXPORT_PLURAL: &str = "serviceexports";
pub const IMPORT_KIND: &str = "ServiceImport";
pub const IMPORT_PLURAL: &str = "serviceimports";

/// The labels of an imported EndpointSlice (the KEP's well-known labels).
pub const LABEL_SERVICE_NAME: &str = "multicluster.kubernetes.io/service-name";
pub const LABEL_SOURCE_CLUSTER: &str = "multicluster.kubernetes.io/source-cluster";
/// EndpointSlices Orrery manages say so (never the default controller's value).
pub const LABEL_MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
/// On a ServiceImport Orrery derived from exports (a user's own ServiceImport has none: it is
/// a template like any other, propagated by its policy).
pub const LABEL_DERIVED: &str = "multicluster.orrery.io/derived";

/// Whether a ServiceImport in the control plane is Orrery's, derived from exports: Orrery
/// writes its imports straight to the store, so they carry no `managedFields`; one written
/// through the API (created, applied or edited by a user, even over one Orrery derived) is
/// the user's: propagated by its policy, never overwritten or deleted by Orrery.
pub fn is_derived_import(o: &crate::Object) -> bool {
    o.metadata.managed_fields.is_empty()
}

/// Whether an object in the control plane is one Orrery's multi-cluster services make (a
/// derived ServiceImport, an EndpointSlice it distributes): never a template of its own.
pub fn is_orrerys_own(o: &crate::Object) -> bool {
    match (o.api_version.as_str(), o.kind.as_str()) {
        (API_VERSION | API_VERSION_V1ALPHA1, IMPORT_KIND) => is_derived_import(o),
        ("discovery.k8s.io/v1", "EndpointSlice") => {
            o.metadata.labels.get(LABEL_MANAGED_BY).map(String::as_str) == Some(MANAGED_BY)
        }
        _ => false,
    }
}
pub const MANAGED_BY: &str = "orrery.io";

/// What a slice says of its source cluster and of the consumer it was written for: routing
/// facts for meshes and gateways.
pub const ANNOTATION_CLUSTER_READY: &str = "multicluster.orrery.io/cluster-ready";
pub const ANNOTATION_WATER_LEVEL: &str = "multicluster.orrery.io/water-level";
pub const ANNOTATION_LATENCY: &str = "multicluster.orrery.io/latency-ms";
pub const ANNOTATION_WEIGHT: &str = "multicluster.orrery.io/weight";
/// On a ServiceExport: how consumers weigh the exporting clusters.
pub const ANNOTATION_TRAFFIC_POLICY: &str = "multicluster.orrery.io/traffic-policy";
/// On a ServiceExport: a label selector over Clusters; only those import it (all by default).
pub const ANNOTATION_CONSUMERS: &str = "multicluster.orrery.io/consumer-selector";

/// The KEP-2149 properties every member carries.
pub const PROPERTY_CLUSTER: &str = "cluster.clusterset.k8s.io";
pub const PROPERTY_CLUSTERSET: &str = "clusterset.k8s.io";

/// The DNS zone of multi-cluster services.
pub const ZONE: &str = "clusterset.local";

/// The ClusterSet IP range by default.
pub const DEFAULT_IP_RANGE: &str = "10.254.0.0/16";

/// One endpoint of a Service in a member (an EndpointSlice endpoint, trimmed).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    pub addresses: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default)]
    pub conditions: EndpointConditions,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointConditions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
}

/// A port of an EndpointSlice or a ServiceImport.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Port {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default = "tcp")]
    pub protocol: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_protocol: Option<String>,
    pub port: i32,
}

fn tcp() -> String {
    "TCP".into()
}

impl Port {
    /// A port of a Service's `spec.ports` (its `port`; `targetPort` is the member's business).
    pub fn of_service_port(p: &Value) -> Option<Port> {
        Some(Port {
            name: p
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            protocol: p
                .get("protocol")
                .and_then(Value::as_str)
                .unwrap_or("TCP")
                .to_string(),
            app_protocol: p
                .get("appProtocol")
                .and_then(Value::as_str)
                .map(str::to_string),
            port: i32::try_from(p.get("port")?.as_i64()?).ok()?,
        })
    }
}

/// What a member reports of a Service it runs: its endpoints there, in the Work's status.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceEndpoints {
    /// `IPv4` or `IPv6`.
    pub address_type: String,
    pub endpoints: Vec<Endpoint>,
    /// The ports the endpoints serve on (the Service's target ports).
    pub ports: Vec<Port>,
}

impl ServiceEndpoints {
    pub fn ready(&self) -> impl Iterator<Item = &Endpoint> {
        self.endpoints
            .iter()
            .filter(|e| e.conditions.ready != Some(false))
    }
}

/// What of a Service an export carries (the properties that may conflict).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Exported {
    #[serde(default)]
    pub ports: Vec<Port>,
    #[serde(default)]
    pub headless: bool,
    #[serde(default)]
    pub session_affinity: String,
    /// The Service's `sessionAffinityConfig`, `internalTrafficPolicy` and
    /// `trafficDistribution`, which the import carries as they are (mcs-api v0.4.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_affinity_config: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub internal_traffic_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_distribution: Option<String>,
}

/// What an export asks its ServiceImport to carry: its `exportedLabels` and
/// `exportedAnnotations` (the oldest export's are the import's).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExportedMeta {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub exported_labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub exported_annotations: BTreeMap<String, String>,
}

impl ExportedMeta {
    /// Read from a ServiceExport's spec (what is not a map of strings there is nothing).
    pub fn of_spec(spec: Option<&Value>) -> ExportedMeta {
        let map = |field: &str| {
            spec.and_then(|s| s.get(field))
                .and_then(|v| serde_json::from_value(v.clone()).ok())
                .unwrap_or_default()
        };
        ExportedMeta {
            exported_labels: map("exportedLabels"),
            exported_annotations: map("exportedAnnotations"),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.exported_labels.is_empty() && self.exported_annotations.is_empty()
    }
}

/// A ServiceExport a member cluster made of its own (not one Orrery applied), as its agent
/// reports it: it exports that member's Service of the same name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberExport {
    pub namespace: String,
    pub name: String,
    /// The ServiceExport's creationTimestamp in the member (the export's age).
    #[serde(default)]
    pub created: String,
    /// The Service it exports; absent when the export is not valid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<Exported>,
    /// Why not (`NoService`, `InvalidServiceType`), with a message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invalid: Option<(String, String)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<ServiceEndpoints>,
    /// The labels and annotations the export asks its import to carry.
    #[serde(default, skip_serializing_if = "ExportedMeta::is_empty")]
    pub exported: ExportedMeta,
}

/// On the ServiceImport a member imports: the conditions of the member's own ServiceExport
/// of it (JSON), which the agent writes into that export's status.
pub const ANNOTATION_EXPORT_STATUS: &str = "multicluster.orrery.io/export-status";

impl MemberExport {
    /// The report of a member's ServiceExport `namespace/name` (its spec), given its Service
    /// there.
    pub fn of(
        namespace: &str,
        name: &str,
        created: &str,
        export_spec: Option<&Value>,
        service: Option<&Value>,
        endpoints: Option<ServiceEndpoints>,
    ) -> MemberExport {
        let (service, invalid) = match service.map(Exported::of) {
            None => (
                None,
                Some((
                    "NoService".to_string(),
                    format!("no Service {namespace}/{name} in the cluster"),
                )),
            ),
            Some(Err(e)) => (None, Some((e.reason.to_string(), e.message))),
            Some(Ok(s)) => (Some(s), None),
        };
        MemberExport {
            namespace: namespace.to_string(),
            name: name.to_string(),
            created: created.to_string(),
            endpoints: service.as_ref().and(endpoints),
            service,
            invalid,
            exported: ExportedMeta::of_spec(export_spec),
        }
    }
}

/// Why a Service cannot be exported.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Invalid {
    /// The KEP's reason: `NoService` or `InvalidServiceType`.
    pub reason: &'static str,
    pub message: String,
}

impl Exported {
    /// The exported properties of a Service manifest.
    pub fn of(service: &Value) -> Result<Exported, Invalid> {
        let spec = service.get("spec").cloned().unwrap_or(Value::Null);
        let type_ = spec
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("ClusterIP");
        if type_ == "ExternalName" {
            return Err(Invalid {
                reason: "InvalidServiceType",
                message: "an ExternalName Service cannot be exported".into(),
            });
        }
        let ports = spec
            .get("ports")
            .and_then(Value::as_array)
            .map(|ps| ps.iter().filter_map(Port::of_service_port).collect())
            .unwrap_or_default();
        Ok(Exported {
            ports,
            headless: spec.get("clusterIP").and_then(Value::as_str) == Some("None"),
            session_affinity: spec
                .get("sessionAffinity")
                .and_then(Value::as_str)
                .unwrap_or("None")
                .to_string(),
            session_affinity_config: spec.get("sessionAffinityConfig").cloned(),
            internal_traffic_policy: spec
                .get("internalTrafficPolicy")
                .and_then(Value::as_str)
                .map(str::to_string),
            traffic_distribution: spec
                .get("trafficDistribution")
                .and_then(Value::as_str)
                .map(str::to_string),
        })
    }
}

/// One cluster's export of a Service.
#[derive(Clone, Debug, PartialEq)]
pub struct Export {
    pub cluster: String,
    /// When the cluster began exporting it (RFC 3339, so that strings order as times).
    pub since: String,
    pub service: Exported,
    pub exported: ExportedMeta,
}

/// The ServiceImport the exports of one Service make.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Merged {
    pub headless: bool,
    pub ports: Vec<Port>,
    pub session_affinity: String,
    pub session_affinity_config: Option<Value>,
    pub internal_traffic_policy: Option<String>,
    pub traffic_distribution: Option<String>,
    /// The oldest export's labels and annotations for the import.
    pub exported: ExportedMeta,
    /// The exporting clusters, by name.
    pub clusters: Vec<String>,
    /// The KEP's conflict reasons (`PortConflict`, `TypeConflict`...), with a message each.
    pub conflicts: Vec<(&'static str, String)>,
}

/// Merges the exports of one Service (KEP-1645 "Constraints and Conflict Resolution"): the
/// oldest export (then the cluster name) decides the type, session affinity (and its config),
/// internal traffic policy and traffic distribution; ports are
/// the union, merged by name and then by (protocol, port), the older export keeping a name or
/// number two ports both claim.
pub fn merge(exports: &[Export]) -> Merged {
    let mut order: Vec<&Export> = exports.iter().collect();
    order.sort_by(|a, b| (&a.since, &a.cluster).cmp(&(&b.since, &b.cluster)));
    let Some(oldest) = order.first() else {
        return Merged::default();
    };
    let total = order.len();
    let mut conflicts = Vec::new();
    let disagree = |f: &dyn Fn(&Export) -> bool| order.iter().filter(|e| f(e)).count();
    let n = disagree(&|e| e.service.headless != oldest.service.headless);
    if n > 0 {
        conflicts.push((
            "TypeConflict",
            format!(
                "Conflicting type. Using \"{}\" from oldest service export in \"{}\". {n}/{total} clusters disagree.",
                if oldest.service.headless { "Headless" } else { "ClusterSetIP" },
                oldest.cluster
            ),
        ));
    }
    let n = disagree(&|e| e.service.session_affinity != oldest.service.session_affinity);
    if n > 0 {
        conflicts.push((
            "SessionAffinityConflict",
            format!(
                "Conflicting session affinity. Using \"{}\" from oldest service export in \"{}\". {n}/{total} clusters disagree.",
                oldest.service.session_affinity, oldest.cluster
            ),
        ));
    }
    // The properties the import copies from the oldest export, each its own conflict, each
    // rendered as the message shows it.
    type Property<'a> = (&'a str, &'a str, &'a dyn Fn(&Export) -> String);
    let copied: [Property; 5] = [
        (
            "SessionAffinityConfigConflict",
            "session affinity config",
            &|e| {
                let config = e.service.session_affinity_config.as_ref();
                format!("{:?}", config.map_or_else(String::new, Value::to_string))
            },
        ),
        (
            "InternalTrafficPolicyConflict",
            "internal traffic policy",
            &|e| {
                format!(
                    "{:?}",
                    e.service
                        .internal_traffic_policy
                        .as_deref()
                        .unwrap_or_default()
                )
            },
        ),
        (
            "TrafficDistributionConflict",
            "traffic distribution",
            &|e| {
                format!(
                    "{:?}",
                    e.service
                        .traffic_distribution
                        .as_deref()
                        .unwrap_or_default()
                )
            },
        ),
        ("LabelsConflict", "exported labels", &|e| {
            format!("{:?}", e.exported.exported_labels)
        }),
        ("AnnotationsConflict", "exported annotations", &|e| {
            format!("{:?}", e.exported.exported_annotations)
        }),
    ];
    for (reason, what, get) in copied {
        let want = get(oldest);
        let n = disagree(&|e| get(e) != want);
        if n > 0 {
            conflicts.push((
                reason,
                format!(
                    "Conflicting {what}. Using {want} from oldest service export in \"{}\". {n}/{total} clusters disagree.",
                    oldest.cluster
                ),
            ));
        }
    }
    let mut ports: Vec<Port> = Vec::new();
    let mut port_conflicts: BTreeSet<String> = BTreeSet::new();
    for e in &order {
        for p in &e.service.ports {
            let by_name = ports.iter().find(|q| q.name == p.name);
            let by_number = ports
                .iter()
                .find(|q| q.protocol == p.protocol && q.port == p.port);
            match (by_name, by_number) {
                (Some(q), _) if q == p => {}
                (None, None) => ports.push(p.clone()),
                _ => {
                    port_conflicts.insert(e.cluster.clone());
                }
            }
        }
    }
    // A cluster that lacks a port others export conflicts too: traffic to that port reaches
    // only the clusters that expose it.
    for e in &order {
        if ports.iter().any(|p| !e.service.ports.contains(p)) {
            port_conflicts.insert(e.cluster.clone());
        }
    }
    if !port_conflicts.is_empty() {
        conflicts.push((
            "PortConflict",
            format!(
                "Conflicting ports. The union of the exported ports is imported, the oldest service export (in \"{}\") keeping a name or number two claim. {}/{total} clusters disagree: {}.",
                oldest.cluster,
                port_conflicts.len(),
                port_conflicts.into_iter().collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    let mut clusters: Vec<String> = order.iter().map(|e| e.cluster.clone()).collect();
    clusters.sort();
    Merged {
        headless: oldest.service.headless,
        ports,
        session_affinity: oldest.service.session_affinity.clone(),
        session_affinity_config: oldest.service.session_affinity_config.clone(),
        internal_traffic_policy: oldest.service.internal_traffic_policy.clone(),
        traffic_distribution: oldest.service.traffic_distribution.clone(),
        exported: oldest.exported.clone(),
        clusters,
        conflicts,
    }
}

/// An IPv4 range (`a.b.c.d/len`) ClusterSet IPs come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpRange {
    base: u32,
    len: u8,
}

impl std::str::FromStr for IpRange {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (ip, len) = s
            .split_once('/')
            .ok_or_else(|| format!("{s:?}: an IPv4 range is written a.b.c.d/len"))?;
        let ip: Ipv4Addr = ip.parse().map_err(|e| format!("{s:?}: {e}"))?;
        let len: u8 = len
            .parse()
            .ok()
            .filter(|l| (8..=30).contains(l))
            .ok_or_else(|| format!("{s:?}: the prefix length must be 8 to 30"))?;
        let mask = u32::MAX << (32 - len);
        Ok(IpRange {
            base: u32::from(ip) & mask,
            len,
        })
    }
}

impl std::fmt::Display for IpRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", Ipv4Addr::from(self.base), self.len)
    }
}

impl Default for IpRange {
    /// [`DEFAULT_IP_RANGE`].
    fn default() -> Self {
        IpRange {
            base: u32::from(Ipv4Addr::new(10, 254, 0, 0)),
            len: 16,
        }
    }
}

impl IpRange {
    fn size(&self) -> u32 {
        1u32 << (32 - self.len)
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip).wrapping_sub(self.base) < self.size()
    }

    /// A free address for `key` (`namespace/name`): the same key starts its search at the same
    /// place, so an import deleted and made again tends to get its address back. The range's
    /// first and last addresses are never given. `None` when the range is full.
    pub fn allocate(&self, key: &str, used: &BTreeSet<Ipv4Addr>) -> Option<Ipv4Addr> {
        let usable = self.size() - 2;
        let start = fnv(key) % usable;
        (0..usable)
            .map(|i| Ipv4Addr::from(self.base + 1 + (start + i) % usable))
            .find(|ip| !used.contains(ip))
    }
}

/// FNV-1a: stable across builds and platforms (the standard hasher is not).
fn fnv(s: &str) -> u32 {
    s.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// How consumers weigh the clusters a Service is exported from
/// (`multicluster.orrery.io/traffic-policy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TrafficPolicy {
    /// Every ready cluster alike.
    #[default]
    Even,
    /// The consumer's own endpoints alone while it has ready ones; the others otherwise.
    PreferLocal,
    /// Clusters by their latency from the consumer: the nearest weighs most.
    LowestLatency,
    /// Clusters by their room: weight falls as the water level rises.
    Weighted,
}

impl std::str::FromStr for TrafficPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "" | "Even" => Ok(TrafficPolicy::Even),
            "PreferLocal" => Ok(TrafficPolicy::PreferLocal),
            "LowestLatency" => Ok(TrafficPolicy::LowestLatency),
            "Weighted" => Ok(TrafficPolicy::Weighted),
            other => Err(format!(
                "{other:?}: the traffic policy is PreferLocal, LowestLatency, Weighted or Even"
            )),
        }
    }
}

/// What the routing weights are made of, per exporting cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct Source {
    pub cluster: String,
    pub ready: bool,
    /// Ready endpoints there.
    pub endpoints: usize,
    pub water_level: f64,
}

/// Each source's weight (0 to 100) for one consumer. Not-ready clusters and clusters without
/// ready endpoints weigh 0; `latency` gives the consumer's latency to a cluster in ms.
pub fn weights(
    policy: TrafficPolicy,
    consumer: &str,
    sources: &[Source],
    latency: &dyn Fn(&str) -> f64,
) -> BTreeMap<String, u32> {
    let live = |s: &Source| s.ready && s.endpoints > 0;
    let local_live = sources.iter().any(|s| s.cluster == consumer && live(s));
    sources
        .iter()
        .map(|s| {
            let w = if !live(s) {
                0
            } else {
                match policy {
                    TrafficPolicy::Even => 100,
                    TrafficPolicy::PreferLocal => {
                        if !local_live || s.cluster == consumer {
                            100
                        } else {
                            0
                        }
                    }
                    TrafficPolicy::LowestLatency => {
                        // 1 ms or less: 100; 100 ms: about 10.
                        let ms = latency(&s.cluster).max(1.0);
                        ((1000.0 / (ms + 9.0)).round() as u32).clamp(1, 100)
                    }
                    TrafficPolicy::Weighted => {
                        (((1.0 - s.water_level).clamp(0.0, 1.0) * 100.0).round() as u32).max(1)
                    }
                }
            };
            (s.cluster.clone(), w)
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn port(name: &str, n: i32) -> Port {
        Port {
            name: name.into(),
            protocol: "TCP".into(),
            app_protocol: None,
            port: n,
        }
    }

    fn export(cluster: &str, since: &str, ports: Vec<Port>, headless: bool) -> Export {
        Export {
            cluster: cluster.into(),
            since: since.into(),
            service: Exported {
                ports,
                headless,
                session_affinity: "None".into(),
                ..Exported::default()
            },
            exported: ExportedMeta::default(),
        }
    }

    #[test]
    fn services_read_as_exports_and_external_names_are_refused() {
        let s = json!({"spec": {"clusterIP": "None", "ports": [{"name": "web", "port": 80}, {"port": 53, "protocol": "UDP"}]}});
        let e = Exported::of(&s).unwrap();
        assert!(e.headless);
        assert_eq!(
            e.ports,
            vec![
                port("web", 80),
                Port {
                    name: String::new(),
                    protocol: "UDP".into(),
                    app_protocol: None,
                    port: 53
                }
            ]
        );
        assert_eq!(e.session_affinity, "None");
        let err = Exported::of(&json!({"spec": {"type": "ExternalName", "externalName": "x"}}))
            .unwrap_err();
        assert_eq!(err.reason, "InvalidServiceType");
    }

    #[test]
    fn merges_follow_the_oldest_export() {
        let t1 = "2026-01-01T00:00:00Z";
        let t2 = "2026-01-02T00:00:00Z";
        type Case<'a> = (&'a str, Vec<Export>, bool, Vec<Port>, Vec<&'a str>);
        let cases: Vec<Case> = vec![
            (
                "agreeing exports: no conflict",
                vec![
                    export("b", t1, vec![port("web", 80)], false),
                    export("a", t1, vec![port("web", 80)], false),
                ],
                false,
                vec![port("web", 80)],
                vec![],
            ),
            (
                "the oldest decides the type",
                vec![
                    export("a", t2, vec![port("web", 80)], false),
                    export("b", t1, vec![port("web", 80)], true),
                ],
                true,
                vec![port("web", 80)],
                vec!["TypeConflict"],
            ),
            (
                "the same name on another number: the oldest keeps it",
                vec![
                    export("a", t1, vec![port("web", 80)], false),
                    export("b", t2, vec![port("web", 8080)], false),
                ],
                false,
                vec![port("web", 80)],
                vec!["PortConflict"],
            ),
            (
                "different ports: the union, a conflict",
                vec![
                    export("a", t1, vec![port("web", 80)], false),
                    export("b", t2, vec![port("web", 80), port("metrics", 9090)], false),
                ],
                false,
                vec![port("web", 80), port("metrics", 9090)],
                vec!["PortConflict"],
            ),
            (
                "ties in time go by cluster name",
                vec![
                    export("b", t1, vec![port("web", 81)], false),
                    export("a", t1, vec![port("web", 80)], false),
                ],
                false,
                vec![port("web", 80)],
                vec!["PortConflict"],
            ),
        ];
        for (what, exports, headless, ports, reasons) in cases {
            let m = merge(&exports);
            assert_eq!(m.headless, headless, "{what}");
            assert_eq!(m.ports, ports, "{what}");
            let got: Vec<&str> = m.conflicts.iter().map(|(r, _)| *r).collect();
            assert_eq!(got, reasons, "{what}: {:?}", m.conflicts);
            assert_eq!(m.clusters, vec!["a", "b"], "{what}");
        }
        let m = merge(&[
            export("a", t2, vec![port("web", 80)], false),
            export("b", t1, vec![port("web", 80)], true),
        ]);
        assert!(
            m.conflicts[0]
                .1
                .contains("\"Headless\" from oldest service export in \"b\". 1/2"),
            "{:?}",
            m.conflicts
        );
        assert_eq!(merge(&[]), Merged::default());
    }

    #[test]
    fn the_import_copies_affinity_config_traffic_policy_and_distribution_from_the_oldest() {
        let svc = json!({"spec": {"ports": [{"name": "tcp", "port": 42}],
            "sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 10}},
            "internalTrafficPolicy": "Cluster", "trafficDistribution": "PreferClose"}});
        let old = Exported::of(&svc).unwrap();
        assert_eq!(old.session_affinity, "ClientIP");
        assert_eq!(
            old.session_affinity_config,
            Some(json!({"clientIP": {"timeoutSeconds": 10}}))
        );
        assert_eq!(old.internal_traffic_policy.as_deref(), Some("Cluster"));
        assert_eq!(old.traffic_distribution.as_deref(), Some("PreferClose"));
        let mut newer = old.clone();
        newer.session_affinity_config = Some(json!({"clientIP": {"timeoutSeconds": 99}}));
        newer.internal_traffic_policy = Some("Local".into());
        newer.traffic_distribution = None;
        let at = |cluster: &str, since: &str, service: &Exported| Export {
            cluster: cluster.into(),
            since: since.into(),
            service: service.clone(),
            exported: ExportedMeta::default(),
        };
        let m = merge(&[
            at("b", "2026-01-02T00:00:00Z", &newer),
            at("a", "2026-01-01T00:00:00Z", &old),
        ]);
        assert_eq!(m.session_affinity_config, old.session_affinity_config);
        assert_eq!(m.internal_traffic_policy.as_deref(), Some("Cluster"));
        assert_eq!(m.traffic_distribution.as_deref(), Some("PreferClose"));
        let got: Vec<&str> = m.conflicts.iter().map(|(r, _)| *r).collect();
        assert_eq!(
            got,
            [
                "SessionAffinityConfigConflict",
                "InternalTrafficPolicyConflict",
                "TrafficDistributionConflict"
            ]
        );
        assert!(
            m.conflicts[1]
                .1
                .contains("\"Cluster\" from oldest service export in \"a\". 1/2")
        );
        // Agreeing exports: nothing to say; an older agent's report (no such fields) reads.
        assert!(
            merge(&[at("a", "t", &old), at("b", "t", &old)])
                .conflicts
                .is_empty()
        );
        let legacy: Exported =
            serde_json::from_value(json!({"ports": [], "sessionAffinity": "None"})).unwrap();
        assert_eq!(legacy.traffic_distribution, None);
    }

    #[test]
    fn the_import_carries_the_oldest_exports_labels_and_annotations() {
        let meta = |l: &str, a: &str| {
            ExportedMeta::of_spec(Some(&json!({
                "exportedLabels": {"tier": l}, "exportedAnnotations": {"note": a}
            })))
        };
        let at = |cluster: &str, since: &str, exported: ExportedMeta| Export {
            exported,
            ..export(cluster, since, vec![port("http", 80)], false)
        };
        let m = merge(&[
            at("b", "2026-01-02T00:00:00Z", meta("web", "x")),
            at("a", "2026-01-01T00:00:00Z", meta("api", "x")),
            at("c", "2026-01-03T00:00:00Z", meta("api", "y")),
        ]);
        assert_eq!(m.exported, meta("api", "x"));
        assert_eq!(
            m.conflicts,
            [
                (
                    "LabelsConflict",
                    "Conflicting exported labels. Using {\"tier\": \"api\"} from oldest service export in \"a\". 1/3 clusters disagree.".to_string()
                ),
                (
                    "AnnotationsConflict",
                    "Conflicting exported annotations. Using {\"note\": \"x\"} from oldest service export in \"a\". 1/3 clusters disagree.".to_string()
                ),
            ]
        );
        // An export without either, and an older agent's report without the field, read as
        // asking for none.
        assert!(ExportedMeta::of_spec(Some(&json!({}))).is_empty());
        assert!(ExportedMeta::of_spec(Some(&json!({"exportedLabels": 3}))).is_empty());
        let legacy: MemberExport =
            serde_json::from_value(json!({"namespace": "n", "name": "s"})).unwrap();
        assert!(legacy.exported.is_empty());
        let same = merge(&[
            at("a", "t", meta("api", "x")),
            at("b", "t", meta("api", "x")),
        ]);
        assert!(same.conflicts.is_empty());
    }

    #[test]
    fn clusterset_ips_come_from_the_range_stably_and_never_twice() {
        let r: IpRange = DEFAULT_IP_RANGE.parse().unwrap();
        assert_eq!(r, IpRange::default());
        assert_eq!(r.to_string(), "10.254.0.0/16");
        let mut used = BTreeSet::new();
        let a = r.allocate("default/web", &used).unwrap();
        assert!(r.contains(a));
        assert_eq!(r.allocate("default/web", &used), Some(a), "stable");
        used.insert(a);
        let b = r.allocate("default/web", &used).unwrap();
        assert_ne!(a, b);
        // A small range fills up, never giving its first or last address.
        let small: IpRange = "192.168.0.0/30".parse().unwrap();
        let mut used = BTreeSet::new();
        for i in 0..2 {
            let ip = small.allocate(&format!("ns/s{i}"), &used).unwrap();
            assert!(ip != Ipv4Addr::new(192, 168, 0, 0) && ip != Ipv4Addr::new(192, 168, 0, 3));
            used.insert(ip);
        }
        assert_eq!(small.allocate("ns/more", &used), None);
        for bad in ["10.0.0.0", "10.0.0.0/33", "10.0.0.0/4", "x/16"] {
            assert!(bad.parse::<IpRange>().is_err(), "{bad}");
        }
    }

    #[test]
    fn weights_follow_the_traffic_policy() {
        let src = |c: &str, ready: bool, endpoints: usize, wl: f64| Source {
            cluster: c.into(),
            ready,
            endpoints,
            water_level: wl,
        };
        let sources = vec![
            src("a", true, 2, 0.2),
            src("b", true, 1, 0.8),
            src("c", false, 3, 0.1),
        ];
        let lat = |c: &str| if c == "a" { 1.0 } else { 91.0 };
        let w = |p, consumer| weights(p, consumer, &sources, &lat);
        let get = |m: BTreeMap<String, u32>| (m["a"], m["b"], m["c"]);
        assert_eq!(get(w(TrafficPolicy::Even, "a")), (100, 100, 0));
        assert_eq!(get(w(TrafficPolicy::PreferLocal, "a")), (100, 0, 0));
        // A consumer without endpoints of its own (or whose own are not ready) uses the rest.
        assert_eq!(get(w(TrafficPolicy::PreferLocal, "c")), (100, 100, 0));
        assert_eq!(get(w(TrafficPolicy::PreferLocal, "z")), (100, 100, 0));
        assert_eq!(get(w(TrafficPolicy::LowestLatency, "z")), (100, 10, 0));
        assert_eq!(get(w(TrafficPolicy::Weighted, "z")), (80, 20, 0));
        assert!("Nearest".parse::<TrafficPolicy>().is_err());
    }
}
