//! Data-aware scheduling (draft 4.2 item 4, 5.1 and 7.3.1): data sets and where their copies
//! live, what a workload reads and how much work it is, and the facts of clusters the
//! scheduler weighs against them (GPU performance, links, egress price).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::quantity::Quantity;
use crate::validation::{ErrorList, FieldError, is_dns1123_subdomain};

pub const DATASET_KIND: &str = "DataSet";
pub const DATASETS_PLURAL: &str = "datasets";

/// Pod template annotation: the data sets a workload reads (comma-separated names in its
/// namespace).
pub const DATASETS_ANNOTATION: &str = "orrery.io/datasets";
/// Pod template annotation: how much work the workload is, in hours of the reference GPU.
pub const GPU_HOURS_ANNOTATION: &str = "orrery.io/gpu-hours";
/// Pod template annotation of the tier the workload's storage needs, and the Cluster label
/// of the best tier a cluster offers (`hot` > `warm` > `cold`).
pub const STORAGE_TIER_KEY: &str = "orrery.io/storage-tier";
/// Pod template annotation of the network the workload must be on, and the Cluster label
/// naming a cluster's network.
pub const NETWORK_KEY: &str = "orrery.io/network";
/// Cluster property (KEP-2149): the GPU model of the member's nodes.
pub const GPU_MODEL_PROPERTY: &str = "gpu.orrery.io/model";
/// Cluster property: the GPU performance, a factor against the reference GPU (1.0).
pub const GPU_PERFORMANCE_PROPERTY: &str = "gpu.orrery.io/performance";
/// Cluster property: the price of a GiB leaving the cluster.
pub const EGRESS_PRICE_PROPERTY: &str = "cost.orrery.io/egress-per-gib";

/// GPU performance against the reference GPU (an NVIDIA A100 is 1.0), by the product name
/// nodes carry in `nvidia.com/gpu.product`. Relative FP16 tensor throughput, rounded; a model
/// not listed counts as the reference.
pub const GPU_PERFORMANCE: &[(&str, f64)] = &[
    ("NVIDIA-H200", 3.2),
    ("NVIDIA-H100-80GB-HBM3", 3.0),
    ("NVIDIA-H100-PCIe", 2.4),
    ("NVIDIA-L40S", 1.2),
    ("NVIDIA-A100-SXM4-80GB", 1.0),
    ("NVIDIA-A100-SXM4-40GB", 1.0),
    ("NVIDIA-A100-PCIE-40GB", 1.0),
    ("NVIDIA-A10G", 0.4),
    ("NVIDIA-L4", 0.4),
    ("Tesla-V100-SXM2-16GB", 0.4),
    ("Tesla-T4", 0.2),
];

/// The performance factor of a GPU model (1.0 when the model is not in the table).
pub fn gpu_performance(model: &str) -> f64 {
    GPU_PERFORMANCE
        .iter()
        .find(|(m, _)| m.eq_ignore_ascii_case(model))
        .map_or(1.0, |(_, p)| *p)
}

/// A storage tier: how fast the storage holding a copy is.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// Archive storage: cheap, slow to read.
    Cold,
    /// Standard storage.
    #[default]
    Warm,
    /// Fast local or NVMe storage.
    Hot,
}

impl Tier {
    pub fn parse(s: &str) -> Option<Tier> {
        match s {
            "hot" => Some(Tier::Hot),
            "warm" => Some(Tier::Warm),
            "cold" => Some(Tier::Cold),
            _ => None,
        }
    }

    /// Whether storage of this tier serves a need for `wanted` (a faster tier does).
    pub fn serves(self, wanted: Tier) -> bool {
        self >= wanted
    }
}

pub const TIERS: &[&str] = &["hot", "warm", "cold"];

/// Where an authoritative copy of a data set lives.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DataLocation {
    /// The cluster holding the copy.
    pub cluster: String,
    /// The tier of the storage holding it (warm by default).
    #[serde(default)]
    pub tier: Tier,
}

/// A data set workloads read: its size and where its authoritative copies are.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DataSetSpec {
    /// How big it is (bytes, e.g. 2Ti).
    pub size: Quantity,
    /// The clusters holding an authoritative copy. None for a data set that only members
    /// report holding (claims labelled `orrery.io/dataset=<name>`).
    #[serde(default)]
    pub locations: Vec<DataLocation>,
}

impl DataSetSpec {
    /// A DataSet's spec, checked; errors name the field.
    pub fn parse(spec: Option<&Value>) -> Result<DataSetSpec, ErrorList> {
        let v = spec.cloned().unwrap_or(Value::Null);
        let s: DataSetSpec = crate::meta::decode(&v, "spec").map_err(|e| vec![e])?;
        let mut errs = ErrorList::new();
        if s.size.is_negative() || s.size.is_zero() {
            errs.push(FieldError::invalid("spec.size", s.size, "must be positive"));
        }
        let mut seen = Vec::new();
        for (i, l) in s.locations.iter().enumerate() {
            let p = format!("spec.locations[{i}].cluster");
            if l.cluster.is_empty() {
                errs.push(FieldError::required(&p, ""));
            } else if seen.contains(&&l.cluster) {
                errs.push(FieldError::invalid(&p, &l.cluster, "named twice"));
            }
            seen.push(&l.cluster);
        }
        if errs.is_empty() { Ok(s) } else { Err(errs) }
    }

    pub fn bytes(&self) -> i64 {
        i64::try_from(self.size.value()).unwrap_or(i64::MAX)
    }
}

/// A DataSet's status: every copy, who reads it where, and the transfers under way.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataSetStatus {
    /// Every copy: the authoritative ones of the spec and the caches Orrery made.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub copies: Vec<DataCopy>,
    /// The workloads reading it now, and where.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub readers: Vec<DataReader>,
    /// Reads per cluster over the last day (the hotspot signal).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accesses: Vec<DataAccess>,
    /// Reads per region over the last hour and day.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub regions: Vec<RegionAccess>,
    /// The DataTransfers of this data set not finished yet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub transfers: Vec<String>,
    /// The last copy round into each cluster, kept when its copy goes: a copy made there
    /// again goes on from it, so a member never takes a new round for one it finished.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub rounds: std::collections::BTreeMap<String, u32>,
}

impl DataSetStatus {
    pub fn of(o: &crate::Object) -> DataSetStatus {
        o.status
            .as_ref()
            .and_then(|s| serde_json::from_value(s.clone()).ok())
            .unwrap_or_default()
    }

    pub fn copy(&self, cluster: &str) -> Option<&DataCopy> {
        self.copies.iter().find(|c| c.cluster == cluster)
    }
}

/// What a copy is to Orrery.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum CopyRole {
    /// Named in `spec.locations`: never evicted, the source of every cache.
    #[default]
    Authoritative,
    /// Made by Orrery for a workload reading it there, or because its region reads it often;
    /// held in the cluster's cache tier and evicted least recently used first.
    Cache,
    /// A member's own claim labelled `orrery.io/dataset`, which it reports: read and copied
    /// from, never changed or evicted by Orrery.
    Reported,
}

/// One copy of a data set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataCopy {
    /// The cluster holding it.
    pub cluster: String,
    /// Authoritative or Cache.
    pub role: CopyRole,
    /// The tier of the storage holding it.
    #[serde(default)]
    pub tier: Tier,
    /// Whether it holds data workloads can read (a cache's first copy is in).
    #[serde(default)]
    pub present: bool,
    /// Bytes it holds.
    #[serde(default)]
    pub bytes: i64,
    /// The version of the data it holds (the source's at the last copy).
    #[serde(default)]
    pub data_version: u64,
    /// Cache: the copy it was made from.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
    /// Cache: the copy rounds started (the first copies everything, the next what changed).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub round: u32,
    /// Cache: the latest round's figures: bytes it copies, the version it brings and the
    /// one it applies on top of, and the data's size at the source.
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub round_bytes: i64,
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub round_version: u64,
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub round_base: u64,
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub round_used: i64,
    /// The latest round's rate, bytes per second.
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub round_rate: i64,
    /// When a workload last read it (or it was made).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_used: Option<crate::Time>,
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

fn is_zero_i64(n: &i64) -> bool {
    *n == 0
}

/// A workload reading a data set in a cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataReader {
    /// `Kind/name`.
    pub workload: String,
    pub cluster: String,
}

/// Reads of a data set from one cluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataAccess {
    pub cluster: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub region: String,
    /// When each read of the last day began (a workload placed there), newest last.
    #[serde(default)]
    pub times: Vec<crate::Time>,
}

/// Reads of a data set from one region.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RegionAccess {
    pub region: String,
    pub last_hour: u32,
    pub last_day: u32,
}

pub const DATATRANSFER_KIND: &str = "DataTransfer";
pub const DATATRANSFERS_PLURAL: &str = "datatransfers";
/// Label of a data set's claim in a member: the data set it holds.
pub const DATASET_LABEL: &str = "orrery.io/dataset";
/// Label of a data set's claim in a member: `authoritative` or `cache`.
pub const COPY_LABEL: &str = "orrery.io/dataset-copy";
/// Cluster property: the bytes of its cache tier (for copies of data sets read there).
pub const CACHE_PROPERTY: &str = "cache.orrery.io/capacity";

/// The PersistentVolumeClaim holding a copy of data set `name` in a member (in the data set's
/// namespace): what its readers' pods mount.
pub fn claim_name(name: &str) -> String {
    let full = format!("dataset-{name}");
    if full.len() <= 253 {
        full
    } else {
        format!("{}-{}", &full[..240], crate::meta::short_hash(&full))
    }
}

/// A copy of a data set a member holds and reports: a claim labelled `orrery.io/dataset`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HeldDataSet {
    pub namespace: String,
    /// The data set (the label's value).
    pub name: String,
    /// The claim holding it.
    pub claim: String,
    #[serde(default)]
    pub bytes: i64,
    /// The version of its data, when the member knows it (the `orrery.io/data-version`
    /// annotation on a real member's claim).
    #[serde(default)]
    pub data_version: u64,
}

/// Annotation on a member's claim: the version of the data set it holds.
pub const DATA_VERSION_ANNOTATION: &str = "orrery.io/data-version";

/// A copy of a data set to a cluster: made by Orrery for a workload placed there that reads
/// it, to refresh a cache, or to cache it in a region that reads it often; or asked by a user
/// (a prefetch).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DataTransferSpec {
    /// The data set, in the transfer's namespace.
    pub data_set: String,
    /// The cluster receiving the copy.
    pub destination: String,
    /// The cluster it comes from; empty: Orrery picks the copy it arrives from first.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
    /// Why it is made: the workload that reads it, `refresh`, `cache`, or a user's words.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

impl DataTransferSpec {
    pub fn parse(spec: Option<&Value>) -> Result<DataTransferSpec, ErrorList> {
        let v = spec.cloned().unwrap_or(Value::Null);
        let s: DataTransferSpec = crate::meta::decode(&v, "spec").map_err(|e| vec![e])?;
        let mut errs = ErrorList::new();
        for (field, value) in [
            ("spec.dataSet", &s.data_set),
            ("spec.destination", &s.destination),
        ] {
            if value.is_empty() {
                errs.push(FieldError::required(field, ""));
            } else if let Some(m) = is_dns1123_subdomain(value).first() {
                errs.push(FieldError::invalid(field, value, m));
            }
        }
        if !s.source.is_empty() && s.source == s.destination {
            errs.push(FieldError::invalid(
                "spec.source",
                &s.source,
                "is the destination",
            ));
        }
        if errs.is_empty() { Ok(s) } else { Err(errs) }
    }
}

/// Where a DataTransfer stands.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
pub enum TransferPhase {
    /// Waiting for bandwidth on its links, for a source, or for a copy arriving in its region.
    #[default]
    Queued,
    /// The source takes a snapshot of the data.
    Snapshot,
    /// The destination copies what the snapshot says it lacks, at the booked rate.
    Copying,
    Succeeded,
    Failed,
}

impl TransferPhase {
    pub fn is_done(self) -> bool {
        matches!(self, TransferPhase::Succeeded | TransferPhase::Failed)
    }

    /// Whether it holds bandwidth on its links.
    pub fn books(self) -> bool {
        matches!(self, TransferPhase::Snapshot | TransferPhase::Copying)
    }
}

/// A DataTransfer's status.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataTransferStatus {
    pub phase: TransferPhase,
    /// The cluster it comes from.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
    /// The clusters the data passes through, source first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub path: Vec<String>,
    /// The copy round it is (1: the first copy, everything; then what changed).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub round: u32,
    /// Bytes it sends: all of the data for a first copy, what changed since the
    /// destination's version for a refresh.
    #[serde(default)]
    pub bytes: i64,
    #[serde(default)]
    pub copied_bytes: i64,
    /// The data's size at the source's snapshot.
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub used_bytes: i64,
    /// Bytes per second booked on the source's uplink and the destination's downlink.
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub rate: i64,
    /// The version the destination held before (0: none) and the one it gets.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub base_version: u64,
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub data_version: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<crate::Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<crate::Time>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

impl DataTransferStatus {
    pub fn of(o: &crate::Object) -> DataTransferStatus {
        o.status
            .as_ref()
            .and_then(|s| serde_json::from_value(s.clone()).ok())
            .unwrap_or_default()
    }
}

/// What a placement's `dataPolicy` optimizes when the workload reads data sets.
pub const COMPLETION_TIME: &str = "CompletionTime";
pub const TRANSFER_COST: &str = "TransferCost";

/// A placement's `dataPolicy` (Orrery): what to optimize when the workload reads data sets.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DataPolicy {
    /// CompletionTime (the default): the cluster where the workload would finish first, its
    /// inputs' transfer included; TransferCost: the cheapest in egress, then the fastest.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub optimize_for: String,
    /// No cluster is chosen that would need more than this copied to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_transfer: Option<Quantity>,
}

impl DataPolicy {
    pub fn validate(&self, path: &str, errs: &mut ErrorList) {
        if !["", COMPLETION_TIME, TRANSFER_COST].contains(&self.optimize_for.as_str()) {
            errs.push(FieldError::not_supported(
                format!("{path}.optimizeFor"),
                &self.optimize_for,
                &[COMPLETION_TIME, TRANSFER_COST],
            ));
        }
        if let Some(m) = &self.max_transfer
            && m.is_negative()
        {
            errs.push(FieldError::invalid(
                format!("{path}.maxTransfer"),
                m,
                "must not be negative",
            ));
        }
    }

    pub fn cost_first(&self) -> bool {
        self.optimize_for == TRANSFER_COST
    }
}

/// What a workload's template says of its data and work (from its pod template's
/// annotations), carried in its binding.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadData {
    /// The data sets it reads, in its namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub datasets: Vec<String>,
    /// Its work, in hours of the reference GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_hours: Option<f64>,
    /// The storage tier every chosen cluster must offer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_tier: Option<Tier>,
    /// The network every chosen cluster must be on.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub network: String,
}

impl WorkloadData {
    pub fn is_empty(&self) -> bool {
        *self == WorkloadData::default()
    }

    /// Read from a pod template's annotations; errors name the annotation.
    pub fn of_annotations(a: &BTreeMap<String, String>) -> Result<WorkloadData, String> {
        let mut d = WorkloadData::default();
        if let Some(list) = a.get(DATASETS_ANNOTATION) {
            for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                if let Some(m) = is_dns1123_subdomain(name).first() {
                    return Err(format!("{DATASETS_ANNOTATION}: {name:?}: {m}"));
                }
                if !d.datasets.iter().any(|x| x == name) {
                    d.datasets.push(name.to_string());
                }
            }
        }
        if let Some(h) = a.get(GPU_HOURS_ANNOTATION) {
            let v: f64 = h
                .trim()
                .parse()
                .ok()
                .filter(|v: &f64| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| {
                    format!("{GPU_HOURS_ANNOTATION}: {h:?} is not a number of hours of at least 0")
                })?;
            d.gpu_hours = Some(v);
        }
        if let Some(t) = a.get(STORAGE_TIER_KEY) {
            d.storage_tier = Some(Tier::parse(t.trim()).ok_or_else(|| {
                format!("{STORAGE_TIER_KEY}: {t:?} is not one of hot, warm, cold")
            })?);
        }
        if let Some(n) = a.get(NETWORK_KEY) {
            d.network = n.trim().to_string();
        }
        Ok(d)
    }
}

/// Where a built-in workload kind keeps its pod template's annotations (a JSON pointer), and
/// the field path of that map for errors.
pub fn template_annotations(kind: &str) -> Option<(String, String)> {
    let spec = crate::meta::pod_spec_pointer(kind)?;
    let template = spec.strip_suffix("/spec").unwrap_or("");
    let pointer = format!("{template}/metadata/annotations");
    let path = pointer.trim_start_matches('/').replace('/', ".");
    Some((pointer, path))
}

/// What a template says of its data and work, from its annotations and those of its pod
/// template in its spec (which win).
pub fn of_parts(
    kind: &str,
    annotations: &BTreeMap<String, String>,
    spec: Option<&Value>,
) -> Result<WorkloadData, String> {
    let mut a: BTreeMap<String, String> = annotations
        .iter()
        .filter(|(k, _)| k.starts_with("orrery.io/"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if let Some((pointer, _)) = template_annotations(kind)
        && let Some(rest) = pointer.strip_prefix("/spec")
        && let Some(Value::Object(m)) = spec.and_then(|s| s.pointer(rest))
    {
        for (k, x) in m {
            if let (true, Some(v)) = (k.starts_with("orrery.io/"), x.as_str()) {
                a.insert(k.clone(), v.to_string());
            }
        }
    }
    WorkloadData::of_annotations(&a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tiers_serve_slower_needs() {
        assert!(Tier::Hot.serves(Tier::Warm));
        assert!(Tier::Warm.serves(Tier::Warm));
        assert!(!Tier::Cold.serves(Tier::Warm));
        assert_eq!(Tier::parse("cold"), Some(Tier::Cold));
        assert_eq!(Tier::parse("lukewarm"), None);
    }

    #[test]
    fn data_sets_are_checked() {
        let ok = DataSetSpec::parse(Some(
            &json!({"size": "2Ti", "locations": [{"cluster": "east", "tier": "hot"}]}),
        ))
        .unwrap();
        assert_eq!(ok.bytes(), 2 << 40);
        assert_eq!(ok.locations[0].tier, Tier::Hot);
        // A data set only members report holding names no location.
        let reported = DataSetSpec::parse(Some(&json!({"size": "1Gi"}))).unwrap();
        assert!(reported.locations.is_empty());
        let cases = [
            (
                json!({"size": "0", "locations": [{"cluster": "a"}]}),
                "spec.size",
            ),
            (
                json!({"size": "1Gi", "locations": [{"cluster": "a"}, {"cluster": "a"}]}),
                "spec.locations[1].cluster",
            ),
            (
                json!({"size": "1Gi", "locations": [{"cluster": "a", "tier": "lukewarm"}]}),
                "spec.locations[0].tier",
            ),
            (
                json!({"size": "1Gi", "locations": [], "extra": 1}),
                "spec.extra",
            ),
        ];
        for (spec, field) in cases {
            let errs = DataSetSpec::parse(Some(&spec)).unwrap_err();
            assert!(errs.iter().any(|e| e.field == field), "{field}: {errs:?}");
        }
    }

    #[test]
    fn workload_data_from_annotations() {
        let a: BTreeMap<String, String> = [
            (DATASETS_ANNOTATION, "imagenet, tokens,imagenet"),
            (GPU_HOURS_ANNOTATION, "12.5"),
            (STORAGE_TIER_KEY, "hot"),
            (NETWORK_KEY, "research"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let d = WorkloadData::of_annotations(&a).unwrap();
        assert_eq!(d.datasets, ["imagenet", "tokens"]);
        assert_eq!(d.gpu_hours, Some(12.5));
        assert_eq!(d.storage_tier, Some(Tier::Hot));
        assert_eq!(d.network, "research");
        for (k, v) in [
            (GPU_HOURS_ANNOTATION, "-1"),
            (GPU_HOURS_ANNOTATION, "lots"),
            (STORAGE_TIER_KEY, "tepid"),
            (DATASETS_ANNOTATION, "Not_A_Name"),
        ] {
            let a = BTreeMap::from([(k.to_string(), v.to_string())]);
            let e = WorkloadData::of_annotations(&a).unwrap_err();
            assert!(e.starts_with(k), "{e}");
        }
        let own = BTreeMap::from([(GPU_HOURS_ANNOTATION.to_string(), "1".to_string())]);
        let spec = json!({"template": {"metadata": {"annotations": {GPU_HOURS_ANNOTATION: "2", DATASETS_ANNOTATION: "a"}}}});
        let d = of_parts("Job", &own, Some(&spec)).unwrap();
        assert_eq!(
            (d.gpu_hours, d.datasets),
            (Some(2.0), vec!["a".to_string()])
        );
        assert_eq!(
            template_annotations("CronJob").unwrap().1,
            "spec.jobTemplate.spec.template.metadata.annotations"
        );
        assert_eq!(gpu_performance("NVIDIA-H100-80GB-HBM3"), 3.0);
        assert_eq!(gpu_performance("unknown"), 1.0);
    }
}
