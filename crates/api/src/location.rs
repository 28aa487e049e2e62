//! Locations (the Datum seed): members labelled with a city code
//! (`topology.datum.net/city-code`) grouped into one `Location` per code, with their regions,
//! zones, readiness and capacity; and a workload's replicas summarized per location.
//!
//! Pure: the grouping and the summaries. Placement by location needs nothing new: spread with
//! `spreadByLabel: topology.datum.net/city-code`, or name locations with a cluster label
//! selector on that key.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::binding::AggregatedStatusItem;
pub use crate::binding::LocationReplicas;
use crate::cluster::{ClusterSpec, ClusterStatus, ResourceList};

pub const GROUP: &str = "multicluster.io";
pub const KIND: &str = "Location";
pub const PLURAL: &str = "locations";
/// The label that places a member in a city (Datum's key).
pub const CITY_LABEL: &str = "topology.datum.net/city-code";
/// Resources a Location sums.
const SUMMED: &[&str] = &["cpu", "memory", crate::cluster::GPU_RESOURCE];

/// The Location object's name for a city code: the code in lower case, if it makes a valid
/// name (a DNS label); other codes are not grouped.
pub fn name_of(code: &str) -> Option<String> {
    let n = code.trim().to_ascii_lowercase();
    crate::validation::is_dns1123_label(&n)
        .is_empty()
        .then_some(n)
}

/// One member in a Location.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LocationCluster {
    pub name: String,
    #[serde(default)]
    pub ready: bool,
    /// Its overall Resource Water Level, to two decimals.
    #[serde(default)]
    pub water_level: f64,
}

/// What a Location is: its city's members, summed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LocationStatus {
    /// The city code, as the members' label has it.
    pub city_code: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub regions: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub zones: Vec<String>,
    #[serde(default)]
    pub clusters: Vec<LocationCluster>,
    /// The members' names, comma-separated (for `kubectl get locations`).
    #[serde(default)]
    pub cluster_names: String,
    #[serde(default)]
    pub ready_clusters: i64,
    /// What the ready members' nodes give (cpu, memory, GPUs).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub allocatable: ResourceList,
    /// What is requested of them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub allocated: ResourceList,
    /// The highest water level of its ready members, to two decimals.
    #[serde(default)]
    pub water_level: f64,
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// The city code of a member, from its labels.
pub fn city_of(labels: &BTreeMap<String, String>) -> Option<&str> {
    labels
        .get(CITY_LABEL)
        .map(String::as_str)
        .filter(|c| name_of(c).is_some())
}

/// Every Location the members make, by object name.
pub fn locations<'a>(
    clusters: impl IntoIterator<Item = &'a crate::Object>,
) -> BTreeMap<String, LocationStatus> {
    let mut out: BTreeMap<String, LocationStatus> = BTreeMap::new();
    let mut regions: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut zones: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for c in clusters {
        if c.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let Some(code) = city_of(c.labels()) else {
            continue;
        };
        let Some(name) = name_of(code) else { continue };
        let spec = ClusterSpec::of(c);
        let st = ClusterStatus::of(c);
        let ready = crate::conditions::find(&st.conditions, crate::cluster::CONDITION_READY)
            .is_some_and(|c| c.is_true());
        let level = round2(st.water_level.as_ref().map_or(0.0, |w| w.overall));
        let loc = out.entry(name.clone()).or_insert_with(|| LocationStatus {
            city_code: code.to_string(),
            ..Default::default()
        });
        loc.clusters.push(LocationCluster {
            name: c.name().to_string(),
            ready,
            water_level: level,
        });
        if !spec.region.is_empty() {
            regions.entry(name.clone()).or_default().insert(spec.region);
        }
        zones.entry(name.clone()).or_default().extend(spec.zones);
        if ready {
            loc.ready_clusters += 1;
            loc.water_level = loc.water_level.max(level);
            if let Some(r) = st.resource_summary {
                for (sum, from) in [
                    (&mut loc.allocatable, &r.allocatable),
                    (&mut loc.allocated, &r.allocated),
                ] {
                    for k in SUMMED {
                        if let Some(q) = from.get(*k) {
                            let e = sum.entry((*k).to_string()).or_default();
                            *e = *e + *q;
                        }
                    }
                }
            }
        }
    }
    for (name, loc) in &mut out {
        loc.clusters.sort_by(|a, b| a.name.cmp(&b.name));
        loc.cluster_names = loc
            .clusters
            .iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>()
            .join(",");
        loc.regions = regions
            .remove(name)
            .unwrap_or_default()
            .into_iter()
            .collect();
        loc.zones = zones.remove(name).unwrap_or_default().into_iter().collect();
    }
    out
}

/// A workload's placement summarized per location: `targets` are its clusters and their
/// replicas, `items` how it runs in each, `city` a member's city code. Empty when none of its
/// clusters is in a city.
pub fn by_location(
    targets: &[(String, i64)],
    items: &[AggregatedStatusItem],
    city: impl Fn(&str) -> Option<String>,
) -> Vec<LocationReplicas> {
    let mut out: BTreeMap<String, LocationReplicas> = BTreeMap::new();
    for (cluster, replicas) in targets {
        let Some(code) = city(cluster) else { continue };
        let l = out.entry(code.clone()).or_insert_with(|| LocationReplicas {
            location: code,
            ..Default::default()
        });
        l.clusters.push(cluster.clone());
        l.replicas += replicas;
        if let Some(i) = items.iter().find(|i| &i.cluster_name == cluster) {
            l.ready_replicas += i
                .status
                .as_ref()
                .and_then(|s| s.get("readyReplicas"))
                .and_then(Value::as_i64)
                .unwrap_or(0);
            if i.health == crate::meta::Health::Healthy {
                l.healthy_clusters += 1;
            }
        }
    }
    out.into_values().collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cluster(name: &str, code: Option<&str>, ready: bool, level: f64) -> crate::Object {
        let mut labels = serde_json::Map::new();
        if let Some(c) = code {
            labels.insert(CITY_LABEL.into(), json!(c));
        }
        crate::Object::from_value(json!({
            "apiVersion": "multicluster.io/v1alpha1", "kind": "Cluster",
            "metadata": {"name": name, "labels": labels},
            "spec": {"region": format!("r-{name}"), "zones": [format!("z-{name}")]},
            "status": {
                "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}, "reason": "x", "message": ""}],
                "waterLevel": {"overall": level, "cpu": level},
                "resourceSummary": {"allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
                                    "allocated": {"cpu": "2", "memory": "8Gi"}},
            },
        }))
        .unwrap()
    }

    #[test]
    fn members_group_by_city_code() {
        let cs = [
            cluster("dfw-1", Some("DFW"), true, 0.254),
            cluster("dfw-2", Some("DFW"), true, 0.5),
            cluster("dfw-3", Some("DFW"), false, 0.9),
            cluster("lhr-1", Some("LHR"), true, 0.1),
            cluster("nowhere", None, true, 0.1),
            cluster("bad", Some("not a code"), true, 0.1),
        ];
        let l = locations(cs.iter());
        assert_eq!(l.keys().collect::<Vec<_>>(), ["dfw", "lhr"]);
        let dfw = &l["dfw"];
        assert_eq!(dfw.city_code, "DFW");
        assert_eq!(dfw.cluster_names, "dfw-1,dfw-2,dfw-3");
        assert_eq!(dfw.ready_clusters, 2);
        // The not-ready member counts in neither capacity nor level.
        assert_eq!(dfw.allocatable["cpu"], "16".parse().unwrap());
        assert_eq!(dfw.allocated["memory"], "16Gi".parse().unwrap());
        assert!(!dfw.allocatable.contains_key("pods"));
        assert_eq!(dfw.water_level, 0.5);
        assert_eq!(dfw.clusters[0].water_level, 0.25);
        assert_eq!(dfw.regions, ["r-dfw-1", "r-dfw-2", "r-dfw-3"]);
        assert_eq!(dfw.zones.len(), 3);
        assert_eq!(l["lhr"].cluster_names, "lhr-1");
        assert_eq!(name_of("NYC"), Some("nyc".into()));
        assert_eq!(name_of("new york"), None);
    }

    #[test]
    fn a_workload_is_summarized_per_location() {
        let item = |c: &str, ready: i64, healthy: bool| AggregatedStatusItem {
            cluster_name: c.into(),
            applied: true,
            health: if healthy {
                crate::meta::Health::Healthy
            } else {
                crate::meta::Health::Progressing
            },
            status: Some(json!({"readyReplicas": ready})),
            ..Default::default()
        };
        let targets = vec![
            ("dfw-1".to_string(), 3),
            ("dfw-2".to_string(), 2),
            ("lhr-1".to_string(), 4),
            ("far".to_string(), 1),
        ];
        let items = vec![
            item("dfw-1", 3, true),
            item("dfw-2", 1, false),
            item("far", 1, true),
        ];
        let city = |c: &str| match c {
            "far" => None,
            c => Some(c[..3].to_uppercase()),
        };
        let s = by_location(&targets, &items, city);
        assert_eq!(
            s,
            vec![
                LocationReplicas {
                    location: "DFW".into(),
                    clusters: vec!["dfw-1".into(), "dfw-2".into()],
                    replicas: 5,
                    ready_replicas: 4,
                    healthy_clusters: 1,
                },
                LocationReplicas {
                    location: "LHR".into(),
                    clusters: vec!["lhr-1".into()],
                    replicas: 4,
                    ready_replicas: 0,
                    healthy_clusters: 0,
                },
            ]
        );
        assert!(by_location(&targets, &items, |_| None).is_empty());
    }
}
