//! The global service directory: every imported Service, its ClusterSet IPs, ports and the
//! endpoints of each exporting cluster (with the weight the consumer gives that cluster), and
//! the clusterset DNS names they answer to. Pure.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use orrery_api::services::{
    ANNOTATION_WEIGHT, LABEL_SERVICE_NAME, LABEL_SOURCE_CLUSTER, Port, ServiceEndpoints, ZONE,
};
use serde_json::Value;

/// The record types the directory answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QType {
    A,
    Aaaa,
    Srv,
    Txt,
    Any,
    /// Any other type: the name may exist, with no such records.
    Other,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    Ip(IpAddr),
    Srv {
        priority: u16,
        weight: u16,
        port: u16,
        /// A name in the zone, without the final dot.
        target: String,
    },
    Txt(String),
}

/// What a name has: `exists` false is NXDOMAIN; true with no records, NODATA.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lookup {
    pub exists: bool,
    pub records: Vec<Record>,
}

/// The DNS schema version the responder follows (the KEP's `dns-version` TXT record).
pub const SCHEMA_VERSION: &str = "1.0.0";

#[derive(Clone, Debug, Default)]
struct Endpoint {
    cluster: String,
    /// The endpoint's hostname, or its first address with dashes for dots (as cluster DNS
    /// names endpoints without one).
    hostname: String,
    addresses: Vec<IpAddr>,
    weight: u32,
}

#[derive(Clone, Debug, Default)]
struct Service {
    ips: Vec<IpAddr>,
    headless: bool,
    ports: Vec<Port>,
    /// Ready endpoints, the heaviest cluster first.
    endpoints: Vec<Endpoint>,
    /// Target ports by port name, from the slices.
    target_ports: HashMap<String, i32>,
}

/// Every imported Service by (namespace, name).
#[derive(Clone, Debug, Default)]
pub struct Directory {
    services: HashMap<(String, String), Service>,
    namespaces: BTreeSet<String>,
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

impl Directory {
    /// The directory of these ServiceImports and EndpointSlices (slices that name no import
    /// are left out). A slice's `multicluster.orrery.io/weight` annotation weighs its cluster
    /// (100 without one; 0 leaves it out of the answers while another cluster weighs more).
    pub fn build(imports: &[Value], slices: &[Value]) -> Directory {
        let mut services: HashMap<(String, String), Service> = HashMap::new();
        for i in imports {
            let key = (
                str_at(i, "/metadata/namespace").to_string(),
                str_at(i, "/metadata/name").to_string(),
            );
            let headless = str_at(i, "/spec/type") == "Headless";
            let ips = i
                .pointer("/spec/ips")
                .and_then(Value::as_array)
                .map(|ips| {
                    ips.iter()
                        .filter_map(|ip| ip.as_str()?.parse().ok())
                        .collect()
                })
                .unwrap_or_default();
            let ports = i
                .pointer("/spec/ports")
                .and_then(|p| serde_json::from_value(p.clone()).ok())
                .unwrap_or_default();
            services.insert(
                key,
                Service {
                    ips,
                    headless,
                    ports,
                    ..Default::default()
                },
            );
        }
        let mut by_service: BTreeMap<(String, String), Vec<Endpoint>> = BTreeMap::new();
        for s in slices {
            let key = (
                str_at(s, "/metadata/namespace").to_string(),
                str_at(
                    s,
                    &format!("/metadata/labels/{}", escape(LABEL_SERVICE_NAME)),
                )
                .to_string(),
            );
            let Some(service) = services.get_mut(&key) else {
                continue;
            };
            let cluster = str_at(
                s,
                &format!("/metadata/labels/{}", escape(LABEL_SOURCE_CLUSTER)),
            )
            .to_string();
            let weight = match s
                .pointer(&format!(
                    "/metadata/annotations/{}",
                    escape(ANNOTATION_WEIGHT)
                ))
                .and_then(Value::as_str)
            {
                Some(w) => w.parse().unwrap_or(0),
                None => 100,
            };
            let Ok(eps) = serde_json::from_value::<ServiceEndpoints>(json_slice(s)) else {
                continue;
            };
            for p in &eps.ports {
                service.target_ports.insert(p.name.clone(), p.port);
            }
            let list = by_service.entry(key).or_default();
            for e in eps.ready() {
                let addresses: Vec<IpAddr> =
                    e.addresses.iter().filter_map(|a| a.parse().ok()).collect();
                let Some(first) = e.addresses.first() else {
                    continue;
                };
                let hostname = e
                    .hostname
                    .clone()
                    .unwrap_or_else(|| first.replace(['.', ':'], "-"))
                    .to_ascii_lowercase();
                list.push(Endpoint {
                    cluster: cluster.to_ascii_lowercase(),
                    hostname,
                    addresses,
                    weight,
                });
            }
        }
        for (key, mut eps) in by_service {
            // The weighed clusters alone while any weighs more than nothing.
            if eps.iter().any(|e| e.weight > 0) {
                eps.retain(|e| e.weight > 0);
            }
            eps.sort_by(|a, b| {
                (b.weight, &a.cluster, &a.hostname).cmp(&(a.weight, &b.cluster, &b.hostname))
            });
            if let Some(s) = services.get_mut(&key) {
                s.endpoints = eps;
            }
        }
        let namespaces = services.keys().map(|(ns, _)| ns.clone()).collect();
        Directory {
            services,
            namespaces,
        }
    }

    pub fn len(&self) -> usize {
        self.services.len()
    }

    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
    }

    /// What `name` (any case, with or without the final dot) has of `qtype`; `None` if the
    /// name is outside `clusterset.local`.
    pub fn lookup(&self, name: &str, qtype: QType) -> Option<Lookup> {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        let rest = if name == ZONE {
            ""
        } else {
            name.strip_suffix(ZONE)?.strip_suffix('.')?
        };
        let labels: Vec<&str> = if rest.is_empty() {
            Vec::new()
        } else {
            rest.split('.').collect()
        };
        let exists = |records: Vec<Record>| {
            Some(Lookup {
                exists: true,
                records,
            })
        };
        let none = Some(Lookup::default());
        let wants = |t: QType| qtype == t || qtype == QType::Any;
        let ips = |addrs: &mut dyn Iterator<Item = IpAddr>| -> Vec<Record> {
            addrs
                .filter(|ip| match ip {
                    IpAddr::V4(_) => wants(QType::A),
                    IpAddr::V6(_) => wants(QType::Aaaa),
                })
                .map(Record::Ip)
                .collect()
        };
        match labels.as_slice() {
            [] | ["svc"] => exists(Vec::new()),
            ["dns-version"] => exists(if wants(QType::Txt) {
                vec![Record::Txt(SCHEMA_VERSION.into())]
            } else {
                Vec::new()
            }),
            [ns, "svc"] => {
                if self.namespaces.contains(*ns) {
                    exists(Vec::new())
                } else {
                    none
                }
            }
            [svc, ns, "svc"] => {
                let Some(s) = self.service(ns, svc) else {
                    return none;
                };
                if s.headless {
                    // A headless Service without ready endpoints has no name.
                    if s.endpoints.is_empty() {
                        return none;
                    }
                    exists(ips(&mut s
                        .endpoints
                        .iter()
                        .flat_map(|e| e.addresses.clone())))
                } else {
                    exists(ips(&mut s.ips.iter().copied()))
                }
            }
            [port, proto, svc, ns, "svc"] if port.starts_with('_') && proto.starts_with('_') => {
                let Some(s) = self.service(ns, svc) else {
                    return none;
                };
                let (port, proto) = (&port[1..], &proto[1..]);
                let Some(p) = s.ports.iter().find(|p| {
                    !p.name.is_empty()
                        && p.name.eq_ignore_ascii_case(port)
                        && p.protocol.eq_ignore_ascii_case(proto)
                }) else {
                    return none;
                };
                if !wants(QType::Srv) {
                    return exists(Vec::new());
                }
                let base = format!("{svc}.{ns}.svc.{ZONE}");
                if s.headless {
                    let target = s.target_ports.get(&p.name).copied().unwrap_or(p.port);
                    exists(
                        s.endpoints
                            .iter()
                            .map(|e| Record::Srv {
                                priority: 0,
                                weight: e.weight.min(u32::from(u16::MAX)) as u16,
                                port: u16::try_from(target).unwrap_or(0),
                                target: format!("{}.{}.{base}", e.hostname, e.cluster),
                            })
                            .collect(),
                    )
                } else {
                    exists(vec![Record::Srv {
                        priority: 0,
                        weight: 100,
                        port: u16::try_from(p.port).unwrap_or(0),
                        target: base,
                    }])
                }
            }
            [host, cluster, svc, ns, "svc"] => {
                let Some(s) = self.service(ns, svc) else {
                    return none;
                };
                let found: Vec<&Endpoint> = s
                    .endpoints
                    .iter()
                    .filter(|e| e.hostname == *host && e.cluster == *cluster)
                    .collect();
                if !s.headless || found.is_empty() {
                    return none;
                }
                exists(ips(&mut found.iter().flat_map(|e| e.addresses.clone())))
            }
            _ => none,
        }
    }

    fn service(&self, ns: &str, name: &str) -> Option<&Service> {
        self.services.get(&(ns.to_string(), name.to_string()))
    }
}

/// A JSON pointer's escaping of one token (`/` in label keys).
fn escape(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

/// The endpoint fields of an EndpointSlice object (which keeps them at the top level).
fn json_slice(s: &Value) -> Value {
    serde_json::json!({
        "addressType": s.get("addressType").cloned().unwrap_or(Value::Null),
        "endpoints": s.get("endpoints").cloned().unwrap_or_else(|| serde_json::json!([])),
        "ports": s.get("ports").cloned().unwrap_or_else(|| serde_json::json!([])),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn import(name: &str, type_: &str, ips: &[&str]) -> Value {
        json!({
            "apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ServiceImport",
            "metadata": {"namespace": "shop", "name": name},
            "spec": {"type": type_, "ips": ips,
                     "ports": [{"name": "http", "protocol": "TCP", "port": 80}, {"protocol": "TCP", "port": 81}]},
        })
    }

    fn slice(svc: &str, cluster: &str, weight: Option<u32>, eps: Value) -> Value {
        let mut s = json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"namespace": "shop", "name": format!("{svc}-{cluster}"),
                         "labels": {LABEL_SERVICE_NAME: svc, LABEL_SOURCE_CLUSTER: cluster}},
            "addressType": "IPv4",
            "endpoints": eps,
            "ports": [{"name": "http", "protocol": "TCP", "port": 8080}],
        });
        if let Some(w) = weight {
            s["metadata"]["annotations"] = json!({ANNOTATION_WEIGHT: w.to_string()});
        }
        s
    }

    fn ips(l: &Lookup) -> Vec<String> {
        l.records
            .iter()
            .filter_map(|r| match r {
                Record::Ip(ip) => Some(ip.to_string()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn names_answer_as_the_dns_specification_says() {
        let d = Directory::build(
            &[
                import("web", "ClusterSetIP", &["10.254.0.7"]),
                import("db", "Headless", &[]),
                import("empty", "Headless", &[]),
            ],
            &[
                slice(
                    "web",
                    "a",
                    None,
                    json!([{"addresses": ["10.1.0.1"], "conditions": {"ready": true}}]),
                ),
                slice(
                    "db",
                    "a",
                    Some(100),
                    json!([
                    {"addresses": ["10.1.0.2"], "hostname": "db-0", "conditions": {"ready": true}},
                    {"addresses": ["10.1.0.3"], "hostname": "db-1", "conditions": {"ready": false}}]),
                ),
                slice(
                    "db",
                    "b",
                    Some(50),
                    json!([{"addresses": ["10.2.0.2"], "conditions": {}}]),
                ),
                slice("orphan", "a", None, json!([{"addresses": ["10.9.9.9"]}])),
            ],
        );
        let l = |n: &str, t| d.lookup(n, t).unwrap();
        // A ClusterSetIP service: its ClusterSet IP, any case, with or without the dot.
        assert_eq!(
            ips(&l("web.shop.svc.clusterset.local", QType::A)),
            ["10.254.0.7"]
        );
        assert_eq!(
            ips(&l("WEB.Shop.svc.clusterset.local.", QType::A)),
            ["10.254.0.7"]
        );
        // No AAAA: the name exists with no such records.
        let aaaa = l("web.shop.svc.clusterset.local", QType::Aaaa);
        assert!(aaaa.exists && aaaa.records.is_empty());
        // SRV for named ports only, to the service's name and port.
        assert_eq!(
            l("_http._tcp.web.shop.svc.clusterset.local", QType::Srv).records,
            vec![Record::Srv {
                priority: 0,
                weight: 100,
                port: 80,
                target: "web.shop.svc.clusterset.local".into()
            }]
        );
        assert!(!l("_81._tcp.web.shop.svc.clusterset.local", QType::Srv).exists);
        assert!(!l("_http._udp.web.shop.svc.clusterset.local", QType::Srv).exists);
        // A headless service: its ready endpoints, the heavier cluster first; a name for each.
        assert_eq!(
            ips(&l("db.shop.svc.clusterset.local", QType::A)),
            ["10.1.0.2", "10.2.0.2"]
        );
        assert_eq!(
            ips(&l("db-0.a.db.shop.svc.clusterset.local", QType::A)),
            ["10.1.0.2"]
        );
        assert_eq!(
            ips(&l("10-2-0-2.b.db.shop.svc.clusterset.local", QType::A)),
            ["10.2.0.2"]
        );
        assert!(
            !l("db-1.a.db.shop.svc.clusterset.local", QType::A).exists,
            "not ready"
        );
        assert_eq!(
            l("_http._tcp.db.shop.svc.clusterset.local", QType::Srv).records,
            vec![
                Record::Srv {
                    priority: 0,
                    weight: 100,
                    port: 8080,
                    target: "db-0.a.db.shop.svc.clusterset.local".into()
                },
                Record::Srv {
                    priority: 0,
                    weight: 50,
                    port: 8080,
                    target: "10-2-0-2.b.db.shop.svc.clusterset.local".into()
                },
            ]
        );
        // `<cluster>.<svc>...` is reserved and never exists; neither does a headless service
        // without ready endpoints, an unknown service or namespace.
        assert!(!l("a.db.shop.svc.clusterset.local", QType::A).exists);
        assert!(!l("empty.shop.svc.clusterset.local", QType::A).exists);
        assert!(!l("nope.shop.svc.clusterset.local", QType::A).exists);
        assert!(!l("web.other.svc.clusterset.local", QType::A).exists);
        assert!(!l("orphan.shop.svc.clusterset.local", QType::A).exists);
        assert!(l("shop.svc.clusterset.local", QType::A).exists);
        assert!(l("clusterset.local", QType::A).exists);
        assert_eq!(
            l("dns-version.clusterset.local", QType::Txt).records,
            vec![Record::Txt("1.0.0".into())]
        );
        assert_eq!(d.lookup("web.shop.svc.cluster.local", QType::A), None);
        assert_eq!(d.lookup("xclusterset.local", QType::A), None);
    }

    #[test]
    fn a_cluster_weighed_nothing_is_left_out_while_another_weighs() {
        let eps = |ip: &str| json!([{"addresses": [ip]}]);
        let imports = [import("db", "Headless", &[])];
        let d = Directory::build(
            &imports,
            &[
                slice("db", "a", Some(100), eps("10.1.0.1")),
                slice("db", "b", Some(0), eps("10.2.0.1")),
            ],
        );
        assert_eq!(
            ips(&d.lookup("db.shop.svc.clusterset.local", QType::A).unwrap()),
            ["10.1.0.1"]
        );
        let d = Directory::build(
            &imports,
            &[
                slice("db", "a", Some(0), eps("10.1.0.1")),
                slice("db", "b", Some(0), eps("10.2.0.1")),
            ],
        );
        assert_eq!(
            ips(&d.lookup("db.shop.svc.clusterset.local", QType::A).unwrap()),
            ["10.1.0.1", "10.2.0.1"]
        );
    }
}
