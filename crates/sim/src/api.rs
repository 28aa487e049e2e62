//! What a simulated member answers through the cluster proxy: a slice of the Kubernetes API
//! over its pods — discovery, pods listed or read (as JSON, or as the Table kubectl asks
//! for) and their logs, generated lines that a follow keeps streaming while the pod lives —
//! so that `kubectl get pods` and `kubectl logs` work against it; the workloads it runs
//! (apps/v1, batch/v1), read, so that `logs deploy/web` finds its pods; label selectors on
//! lists; and the upgraded requests of
//! `kubectl exec` (a small shell) and `kubectl port-forward` (`portforward`). It stands in for a real
//! member's API, which the kube backend forwards to.

use parking_lot::Mutex;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use orrery_api::Time;
use serde_json::{Value, json};

use super::{Key, Phase, Pod, SimCluster, State};
use orrery_agent::backend::{ProxyBody, proxy_answer, proxy_error};

/// The most log lines a pod has (one a second since it started).
const MAX_LINES: i64 = 1000;

/// A pod's name: a StatefulSet's `<name>-<ordinal>`, a bare Pod's own, else its owner's name
/// and the pod's number.
pub(super) fn pod_name(id: u64, pod: &Pod) -> String {
    match (pod.owner.1.as_str(), pod.ordinal) {
        ("Pod", _) => pod.owner.3.clone(),
        (_, Some(o)) => format!("{}-{o}", pod.owner.3),
        _ => format!("{}-{id:05x}", pod.owner.3),
    }
}

/// The pod template of a pod's owner (a bare Pod is its own).
fn template<'a>(st: &'a State, owner: &Key) -> Option<&'a Value> {
    let o = st.objects.get(owner)?;
    if owner.1 == "Pod" {
        Some(&o.manifest)
    } else {
        o.manifest.pointer("/spec/template")
    }
}

fn age(secs: i64) -> String {
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// The workload kinds a simulated member serves to read: (group, plural, kind, short names),
/// all `v1`.
const WORKLOADS: &[(&str, &str, &str, &[&str])] = &[
    ("apps", "deployments", "Deployment", &["deploy"]),
    ("apps", "statefulsets", "StatefulSet", &["sts"]),
    ("apps", "daemonsets", "DaemonSet", &["ds"]),
    ("apps", "replicasets", "ReplicaSet", &["rs"]),
    ("batch", "jobs", "Job", &[]),
];

/// The core kinds a simulated member serves to read besides pods: (plural, kind, namespaced,
/// short names). What the agent applied is there, and what a cluster has of its own (its
/// nodes, its system namespaces, the `kubernetes` Service, each namespace's `default`
/// ServiceAccount and `kube-root-ca.crt` ConfigMap).
const CORE: &[(&str, &str, bool, &[&str])] = &[
    ("nodes", "Node", false, &["no"]),
    ("namespaces", "Namespace", false, &["ns"]),
    ("services", "Service", true, &["svc"]),
    ("configmaps", "ConfigMap", true, &["cm"]),
    ("secrets", "Secret", true, &[]),
    ("serviceaccounts", "ServiceAccount", true, &["sa"]),
    (
        "persistentvolumeclaims",
        "PersistentVolumeClaim",
        true,
        &["pvc"],
    ),
    ("endpoints", "Endpoints", true, &["ep"]),
    ("events", "Event", true, &["ev"]),
];

/// The namespaces a cluster always has.
const SYSTEM_NAMESPACES: &[&str] = &["default", "kube-node-lease", "kube-public", "kube-system"];

/// A Table of `columns` (name, type) over objects, each row's cells from `cells`.
fn core_table(
    columns: &[&str],
    items: Vec<Value>,
    cells: impl Fn(&Value) -> Vec<Value>,
) -> http::Response<ProxyBody> {
    let col = |name: &&str| {
        json!({"name": name, "type": "string", "format": if *name == "Name" {"name"} else {""},
               "description": "", "priority": 0})
    };
    let rows: Vec<Value> = items
        .iter()
        .map(|o| {
            json!({
                "cells": cells(o),
                "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                           "metadata": o["metadata"]},
            })
        })
        .collect();
    let body = json!({
        "kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": ""},
        "columnDefinitions": columns.iter().map(col).collect::<Vec<_>>(),
        "rows": rows,
    });
    proxy_answer(StatusCode::OK, "application/json", body.to_string())
}

/// An object's age, as kubectl prints it.
fn age_of(o: &Value) -> String {
    o["metadata"]["creationTimestamp"]
        .as_str()
        .and_then(|t| t.parse::<Time>().ok())
        .map(|t| age(Time::now().seconds_since(t)))
        .unwrap_or_else(|| "<unknown>".into())
}

/// Workloads as kubectl's server-side printing asks for them: name, ready of desired, age.
fn workload_table(items: Vec<Value>) -> http::Response<ProxyBody> {
    let col = |name: &str| {
        json!({"name": name, "type": "string", "format": if name == "Name" {"name"} else {""},
               "description": "", "priority": 0})
    };
    let rows: Vec<Value> = items
        .into_iter()
        .map(|o| {
            let st = &o["status"];
            let ready = st["readyReplicas"]
                .as_i64()
                .or(st["numberReady"].as_i64())
                .or(st["succeeded"].as_i64())
                .unwrap_or(0);
            let want = o["spec"]["replicas"]
                .as_i64()
                .or(st["desiredNumberScheduled"].as_i64())
                .or(o["spec"]["completions"].as_i64())
                .unwrap_or(1);
            let created = o["metadata"]["creationTimestamp"]
                .as_str()
                .and_then(|t| t.parse::<Time>().ok())
                .map(|t| age(Time::now().seconds_since(t)))
                .unwrap_or_else(|| "<unknown>".into());
            json!({
                "cells": [o["metadata"]["name"], format!("{ready}/{want}"), created],
                "object": {
                    "kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                    "metadata": o["metadata"],
                },
            })
        })
        .collect();
    let body = json!({
        "kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": ""},
        "columnDefinitions": [col("Name"), col("Ready"), col("Age")],
        "rows": rows,
    });
    proxy_answer(StatusCode::OK, "application/json", body.to_string())
}

impl SimCluster {
    /// How long ago a pod started, in seconds.
    fn pod_age(pod: &Pod) -> i64 {
        match pod.started {
            Some(t) => Time::now().seconds_since(t).max(0),
            None => pod.since.elapsed().as_secs() as i64,
        }
    }

    fn pod_json(&self, st: &State, id: u64, pod: &Pod) -> Value {
        let t = template(st, &pod.owner);
        let labels = t
            .and_then(|t| t.pointer("/metadata/labels"))
            .cloned()
            .unwrap_or_else(|| json!({}));
        let containers = t
            .and_then(|t| t.pointer("/spec/containers"))
            .cloned()
            .unwrap_or_else(|| json!([]));
        let started = pod.started.unwrap_or(pod.created);
        let phase = match pod.phase {
            Phase::Pending | Phase::Starting => "Pending",
            Phase::Running => "Running",
            Phase::Succeeded => "Succeeded",
        };
        let ready = pod.phase == Phase::Running;
        let statuses: Vec<Value> = containers
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                json!({
                    "name": c.get("name"), "image": c.get("image"), "ready": ready,
                    "restartCount": pod.restarts,
                    "state": if ready { json!({"running": {"startedAt": started.to_string()}}) }
                             else { json!({"waiting": {"reason": "ContainerCreating"}}) },
                })
            })
            .collect();
        let node = pod
            .node
            .and_then(|i| st.nodes.get(i))
            .map(|n| n.name.clone());
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name(id, pod),
                "namespace": pod.owner.2,
                "uid": pod.uid,
                "creationTimestamp": pod.created.to_string(),
                "labels": labels,
            },
            "spec": {"nodeName": node, "containers": containers},
            "status": {
                "phase": phase,
                "podIP": (pod.phase != Phase::Pending).then(|| self.pod_address(id)),
                "startTime": started.to_string(),
                "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}],
                "containerStatuses": statuses,
            },
        })
    }

    /// The pods of `namespace` (all with `None`), as the member's API shows them.
    fn pods_of(&self, namespace: Option<&str>) -> Vec<Value> {
        let st = self.lock();
        st.pods
            .iter()
            .filter(|(_, p)| namespace.is_none_or(|ns| p.owner.2 == ns))
            .map(|(id, p)| self.pod_json(&st, *id, p))
            .collect()
    }

    fn find_pod(&self, namespace: &str, name: &str) -> Option<(u64, Value)> {
        let st = self.lock();
        st.pods
            .iter()
            .find(|(id, p)| p.owner.2 == namespace && pod_name(**id, p) == name)
            .map(|(id, p)| (*id, self.pod_json(&st, *id, p)))
    }

    /// Answers one request of the proxy.
    pub(super) fn answer(
        &self,
        state: &Arc<Mutex<State>>,
        req: &http::Request<Bytes>,
    ) -> http::Response<ProxyBody> {
        if req.method() != Method::GET && req.method() != Method::HEAD {
            return proxy_error(
                StatusCode::METHOD_NOT_ALLOWED,
                "the simulated member answers reads only",
            );
        }
        let path = req.uri().path().trim_end_matches('/');
        let query: Vec<(String, String)> =
            form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
                .into_owned()
                .collect();
        let param = |k: &str| query.iter().find(|(q, _)| q == k).map(|(_, v)| v.as_str());
        let as_table = req
            .headers()
            .get(http::header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|a| a.contains("as=Table"));
        let segments: Vec<&str> = path.split('/').skip(1).collect();
        let json_ok = |v: Value| proxy_answer(StatusCode::OK, "application/json", v.to_string());
        let selector =
            match orrery_api::labels::Selector::parse(param("labelSelector").unwrap_or("")) {
                Ok(s) => s,
                Err(e) => {
                    return proxy_error(
                        StatusCode::BAD_REQUEST,
                        &format!("unable to parse requirement: {e}"),
                    );
                }
            };
        let selected = |items: Vec<Value>| -> Vec<Value> {
            items
                .into_iter()
                .filter(|o| {
                    let labels: std::collections::BTreeMap<String, String> =
                        serde_json::from_value(o["metadata"]["labels"].clone()).unwrap_or_default();
                    selector.matches(&labels)
                })
                .collect()
        };
        if let Some(answer) = self.answer_workloads(&segments, as_table, &selected) {
            return answer;
        }
        if let Some(answer) = self.answer_core(&segments, as_table, &selected) {
            return answer;
        }
        match segments.as_slice() {
            ["version"] => json_ok(json!({
                "major": "1", "minor": "32", "gitVersion": "v1.32.0+orrery-sim",
                "platform": "linux/amd64",
            })),
            ["api"] => json_ok(json!({
                "kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}],
            })),
            ["apis"] => {
                let groups: Vec<Value> = ["apps", "batch"]
                    .iter()
                    .map(|g| {
                        let gv = json!({"groupVersion": format!("{g}/v1"), "version": "v1"});
                        json!({"name": g, "versions": [gv.clone()], "preferredVersion": gv})
                    })
                    .collect();
                json_ok(json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}))
            }
            ["api", "v1"] => json_ok(json!({
                "kind": "APIResourceList", "groupVersion": "v1",
                "resources": CORE.iter().map(|(plural, kind, namespaced, short)| json!({
                    "name": plural, "singularName": kind.to_lowercase(), "namespaced": namespaced,
                    "kind": kind, "verbs": ["get", "list"], "shortNames": short,
                    "categories": if *plural == "services" { json!(["all"]) } else { json!([]) },
                })).chain([
                    json!({"name": "pods", "singularName": "pod", "namespaced": true, "kind": "Pod",
                     "verbs": ["get", "list"], "shortNames": ["po"], "categories": ["all"]}),
                    json!({"name": "pods/log", "singularName": "", "namespaced": true, "kind": "Pod",
                     "verbs": ["get"]}),
                    json!({"name": "pods/exec", "singularName": "", "namespaced": true,
                     "kind": "PodExecOptions", "verbs": ["create", "get"]}),
                    json!({"name": "pods/portforward", "singularName": "", "namespaced": true,
                     "kind": "PodPortForwardOptions", "verbs": ["create", "get"]}),
                ]).collect::<Vec<_>>(),
            })),
            ["api", "v1", "pods"] => self.list(selected(self.pods_of(None)), as_table),
            ["api", "v1", "namespaces", ns, "pods"] => {
                self.list(selected(self.pods_of(Some(ns))), as_table)
            }
            ["api", "v1", "namespaces", ns, "pods", name] => match self.find_pod(ns, name) {
                Some((_, p)) if as_table => self.table(vec![p]),
                Some((_, p)) => json_ok(p),
                None => proxy_error(StatusCode::NOT_FOUND, &format!("pods \"{name}\" not found")),
            },
            ["api", "v1", "namespaces", ns, "pods", name, "log"] => {
                let Some((id, pod)) = self.find_pod(ns, name) else {
                    return proxy_error(
                        StatusCode::NOT_FOUND,
                        &format!("pods \"{name}\" not found"),
                    );
                };
                let containers: Vec<String> = pod["spec"]["containers"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|c| c["name"].as_str().map(str::to_string))
                    .collect();
                let container = match (param("container"), containers.as_slice()) {
                    (Some(c), _) if containers.iter().any(|x| x == c) => c.to_string(),
                    (Some(c), _) => {
                        return proxy_error(
                            StatusCode::BAD_REQUEST,
                            &format!("container {c} is not valid for pod {name}"),
                        );
                    }
                    (None, [one]) => one.clone(),
                    (None, _) => {
                        return proxy_error(
                            StatusCode::BAD_REQUEST,
                            &format!(
                                "a container name must be specified for pod {name}, choose one of: {containers:?}"
                            ),
                        );
                    }
                };
                self.logs(
                    state,
                    id,
                    name,
                    &container,
                    param("follow") == Some("true"),
                    param("tailLines").and_then(|n| n.parse().ok()),
                )
            }
            _ => proxy_error(
                StatusCode::NOT_FOUND,
                &format!("the simulated member does not serve {path}"),
            ),
        }
    }

    /// The core objects of one kind, as the member's API serves them (all namespaces with
    /// `None`).
    fn core_of(&self, kind: &str, namespace: Option<&str>) -> Vec<Value> {
        let st = self.lock();
        let born = st.born.to_string();
        let in_ns = |ns: &str| namespace.is_none_or(|n| n == ns);
        let stored = |kind: &str| -> Vec<Value> {
            st.objects
                .iter()
                .filter(|(k, _)| k.0.is_empty() && k.1 == kind && in_ns(&k.2))
                .map(|(k, o)| self.served(&st, k, o, false))
                .collect()
        };
        let namespaces: std::collections::BTreeSet<String> = SYSTEM_NAMESPACES
            .iter()
            .map(|s| s.to_string())
            .chain(
                st.objects
                    .keys()
                    .filter(|k| !k.2.is_empty())
                    .map(|k| k.2.clone()),
            )
            .chain(
                st.objects
                    .keys()
                    .filter(|k| k.0.is_empty() && k.1 == "Namespace")
                    .map(|k| k.3.clone()),
            )
            .collect();
        let meta = |ns: Option<&str>, name: &str| {
            let mut m = json!({"name": name, "creationTimestamp": born,
                "uid": format!("{:08x}-0000-4000-8000-{:012x}", self.seed as u32, orrery_api::object::json_digest(&(ns, name)) & 0xffff_ffff_ffff)});
            if let Some(ns) = ns {
                m["namespace"] = json!(ns);
            }
            m
        };
        let mut out: Vec<Value> = match kind {
            "Node" => st
                .nodes
                .iter()
                .map(|n| {
                    let alloc = n.allocatable.to_list(true);
                    json!({
                        "apiVersion": "v1", "kind": "Node",
                        "metadata": {
                            "name": n.name, "creationTimestamp": born,
                            "labels": {"kubernetes.io/hostname": n.name, "kubernetes.io/os": "linux",
                                       "kubernetes.io/arch": "amd64",
                                       "topology.kubernetes.io/region": self.region},
                        },
                        "spec": if n.ready { json!({}) } else {
                            json!({"taints": [{"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}]})
                        },
                        "status": {
                            "capacity": alloc, "allocatable": alloc,
                            "conditions": [{"type": "Ready", "status": if n.ready {"True"} else {"Unknown"}}],
                            "nodeInfo": {"kubeletVersion": "v1.32.0+orrery-sim", "osImage": "Orrery simulated node",
                                         "containerRuntimeVersion": "sim://1", "kernelVersion": "6.1.0-orrery-sim"},
                        },
                    })
                })
                .collect(),
            "Namespace" => namespaces
                .iter()
                .filter(|_| namespace.is_none())
                .map(|n| {
                    let stored = st
                        .objects
                        .get(&(String::new(), "Namespace".into(), String::new(), n.clone()));
                    let mut m = meta(None, n);
                    if let Some(o) = stored {
                        m["creationTimestamp"] = json!(o.created);
                        m["uid"] = json!(o.uid);
                        m["labels"] = o.manifest["metadata"]["labels"].clone();
                    }
                    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": m,
                           "status": {"phase": "Active"}})
                })
                .collect(),
            "Endpoints" | "Event" => Vec::new(),
            other => stored(other),
        };
        // What a cluster has of its own.
        let have = |out: &[Value], ns: &str, name: &str| {
            out.iter()
                .any(|o| o["metadata"]["namespace"] == ns && o["metadata"]["name"] == name)
        };
        match kind {
            "Service" if in_ns("default") && !have(&out, "default", "kubernetes") => {
                out.push(json!({"apiVersion": "v1", "kind": "Service",
                    "metadata": meta(Some("default"), "kubernetes"),
                    "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.1",
                             "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}]}}));
            }
            "ServiceAccount" | "ConfigMap" => {
                let name = if kind == "ServiceAccount" {
                    "default"
                } else {
                    "kube-root-ca.crt"
                };
                for ns in namespaces.iter().filter(|n| in_ns(n)) {
                    if !have(&out, ns, name) {
                        let mut o = json!({"apiVersion": "v1", "kind": kind, "metadata": meta(Some(ns), name)});
                        if kind == "ConfigMap" {
                            o["data"] = json!({"ca.crt": "-----BEGIN CERTIFICATE-----\n(simulated)\n-----END CERTIFICATE-----\n"});
                        }
                        out.push(o);
                    }
                }
            }
            _ => {}
        }
        // A Service's cluster IP, as a cluster would give it (headless ones keep None).
        if kind == "Service" {
            for o in out.iter_mut() {
                if o["spec"]["clusterIP"].is_null() {
                    let h = orrery_api::object::json_digest(&(
                        &o["metadata"]["namespace"],
                        &o["metadata"]["name"],
                    ));
                    o["spec"]["clusterIP"] =
                        json!(format!("10.96.{}.{}", (h >> 8) % 256, (h % 254) + 1));
                }
            }
        }
        out.sort_by(|a, b| {
            (
                a["metadata"]["namespace"].as_str(),
                a["metadata"]["name"].as_str(),
            )
                .cmp(&(
                    b["metadata"]["namespace"].as_str(),
                    b["metadata"]["name"].as_str(),
                ))
        });
        out
    }

    /// The core kinds besides pods ([`CORE`]): lists (all namespaces or one) and single
    /// objects, as JSON or the Table kubectl prints. `None` for paths that are not theirs.
    fn answer_core(
        &self,
        segments: &[&str],
        as_table: bool,
        selected: &dyn Fn(Vec<Value>) -> Vec<Value>,
    ) -> Option<http::Response<ProxyBody>> {
        let (plural, ns, name) = match segments {
            ["api", "v1", plural] => (*plural, None, None),
            ["api", "v1", plural @ ("namespaces" | "nodes"), name] => (*plural, None, Some(*name)),
            ["api", "v1", "namespaces", ns, plural] => (*plural, Some(*ns), None),
            ["api", "v1", "namespaces", ns, plural, name] => (*plural, Some(*ns), Some(*name)),
            _ => return None,
        };
        let (_, kind, namespaced, _) = CORE.iter().find(|(p, ..)| *p == plural)?;
        if ns.is_some() && !namespaced {
            return None;
        }
        let mut items = selected(self.core_of(kind, ns));
        if let Some(n) = name {
            items.retain(|o| o["metadata"]["name"] == n);
            let Some(one) = items.pop() else {
                return Some(proxy_error(
                    StatusCode::NOT_FOUND,
                    &format!("{plural} \"{n}\" not found"),
                ));
            };
            items = vec![one];
            if !as_table {
                return Some(proxy_answer(
                    StatusCode::OK,
                    "application/json",
                    items[0].to_string(),
                ));
            }
        }
        if !as_table {
            let body = json!({"kind": format!("{kind}List"), "apiVersion": "v1",
                              "metadata": {"resourceVersion": ""}, "items": items});
            return Some(proxy_answer(
                StatusCode::OK,
                "application/json",
                body.to_string(),
            ));
        }
        let count = |o: &Value, f: &str| o[f].as_object().map_or(0, |m| m.len());
        Some(match *kind {
            "Node" => core_table(&["Name", "Status", "Roles", "Age", "Version"], items, |o| {
                let ready = o["status"]["conditions"][0]["status"] == "True";
                vec![
                    o["metadata"]["name"].clone(),
                    json!(if ready { "Ready" } else { "NotReady" }),
                    json!("<none>"),
                    json!(age_of(o)),
                    json!("v1.32.0+orrery-sim"),
                ]
            }),
            "Namespace" => core_table(&["Name", "Status", "Age"], items, |o| {
                vec![
                    o["metadata"]["name"].clone(),
                    json!("Active"),
                    json!(age_of(o)),
                ]
            }),
            "Service" => core_table(
                &[
                    "Name",
                    "Type",
                    "Cluster-IP",
                    "External-IP",
                    "Port(s)",
                    "Age",
                ],
                items,
                |o| {
                    let ports: Vec<String> = o["spec"]["ports"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|p| {
                            format!("{}/{}", p["port"], p["protocol"].as_str().unwrap_or("TCP"))
                        })
                        .collect();
                    vec![
                        o["metadata"]["name"].clone(),
                        json!(o["spec"]["type"].as_str().unwrap_or("ClusterIP")),
                        o["spec"]["clusterIP"].clone(),
                        json!("<none>"),
                        json!(if ports.is_empty() {
                            "<none>".to_string()
                        } else {
                            ports.join(",")
                        }),
                        json!(age_of(o)),
                    ]
                },
            ),
            "ConfigMap" => core_table(&["Name", "Data", "Age"], items, |o| {
                vec![
                    o["metadata"]["name"].clone(),
                    json!(count(o, "data") + count(o, "binaryData")),
                    json!(age_of(o)),
                ]
            }),
            "Secret" => core_table(&["Name", "Type", "Data", "Age"], items, |o| {
                vec![
                    o["metadata"]["name"].clone(),
                    json!(o["type"].as_str().unwrap_or("Opaque")),
                    json!(count(o, "data") + count(o, "stringData")),
                    json!(age_of(o)),
                ]
            }),
            "PersistentVolumeClaim" => core_table(
                &[
                    "Name",
                    "Status",
                    "Volume",
                    "Capacity",
                    "Access Modes",
                    "StorageClass",
                    "Age",
                ],
                items,
                |o| {
                    vec![
                        o["metadata"]["name"].clone(),
                        json!(o["status"]["phase"].as_str().unwrap_or("Pending")),
                        json!(format!(
                            "pvc-{}",
                            o["metadata"]["name"].as_str().unwrap_or_default()
                        )),
                        o["status"]["capacity"]["storage"].clone(),
                        json!("RWO"),
                        o["spec"]["storageClassName"].clone(),
                        json!(age_of(o)),
                    ]
                },
            ),
            _ => core_table(&["Name", "Age"], items, |o| {
                vec![o["metadata"]["name"].clone(), json!(age_of(o))]
            }),
        })
    }

    /// The workloads the member runs, as its API serves them to read (what `kubectl logs
    /// deploy/web` and `port-forward deploy/web` look up before they choose a pod): discovery
    /// of their groups, lists (all namespaces or one) and single objects with their status.
    /// `None` for paths that are not theirs.
    fn answer_workloads(
        &self,
        segments: &[&str],
        as_table: bool,
        selected: &dyn Fn(Vec<Value>) -> Vec<Value>,
    ) -> Option<http::Response<ProxyBody>> {
        let json_ok = |v: Value| proxy_answer(StatusCode::OK, "application/json", v.to_string());
        let kind_of = |group: &str, plural: &str| {
            WORKLOADS
                .iter()
                .find(|(g, p, _, _)| *g == group && *p == plural)
                .map(|(_, _, k, _)| *k)
        };
        let list = |group: &str, kind: &str, ns: Option<&str>| {
            let items = selected(self.workloads_of(group, kind, ns));
            if as_table {
                return workload_table(items);
            }
            json_ok(json!({
                "kind": format!("{kind}List"), "apiVersion": format!("{group}/v1"),
                "metadata": {"resourceVersion": ""}, "items": items,
            }))
        };
        Some(match segments {
            ["apis", group, "v1"] if WORKLOADS.iter().any(|(g, _, _, _)| g == group) => {
                let resources: Vec<Value> = WORKLOADS
                    .iter()
                    .filter(|(g, _, _, _)| g == group)
                    .map(|(_, plural, kind, short)| {
                        json!({"name": plural, "singularName": kind.to_lowercase(), "namespaced": true,
                               "kind": kind, "verbs": ["get", "list"], "shortNames": short,
                               "categories": ["all"]})
                    })
                    .collect();
                json_ok(json!({
                    "kind": "APIResourceList", "apiVersion": "v1",
                    "groupVersion": format!("{group}/v1"), "resources": resources,
                }))
            }
            ["apis", group, "v1", plural] => list(group, kind_of(group, plural)?, None),
            ["apis", group, "v1", "namespaces", ns, plural] => {
                list(group, kind_of(group, plural)?, Some(ns))
            }
            ["apis", group, "v1", "namespaces", ns, plural, name] => {
                let kind = kind_of(group, plural)?;
                match self
                    .workloads_of(group, kind, Some(ns))
                    .into_iter()
                    .find(|o| o["metadata"]["name"] == *name)
                {
                    Some(o) if as_table => workload_table(vec![o]),
                    Some(o) => json_ok(o),
                    None => proxy_error(
                        StatusCode::NOT_FOUND,
                        &format!("{plural}.{group} \"{name}\" not found"),
                    ),
                }
            }
            _ => return None,
        })
    }

    /// The objects of a workload kind, each with the status the member gives it.
    fn workloads_of(&self, group: &str, kind: &str, namespace: Option<&str>) -> Vec<Value> {
        let st = self.lock();
        st.objects
            .iter()
            .filter(|(k, _)| k.0 == group && k.1 == kind && namespace.is_none_or(|ns| k.2 == ns))
            .map(|(k, o)| self.served(&st, k, o, true))
            .collect()
    }

    /// An object as the member's API serves it: with the status the member gives it, and
    /// the member's own creation time and uid (and generation, for kinds with a spec that
    /// Kubernetes counts).
    fn served(&self, st: &State, k: &Key, o: &super::SimObject, generation: bool) -> Value {
        let mut m = o.manifest.clone();
        if let Some(status) = self.object_state(st, k, o).status {
            m["status"] = status;
        }
        if m["metadata"].is_object() {
            m["metadata"]["creationTimestamp"] = json!(o.created);
            m["metadata"]["uid"] = json!(o.uid);
            if generation {
                m["metadata"]["generation"] = json!(o.generation);
            }
        }
        m
    }

    fn list(&self, pods: Vec<Value>, as_table: bool) -> http::Response<ProxyBody> {
        if as_table {
            return self.table(pods);
        }
        let body = json!({
            "kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": ""},
            "items": pods,
        });
        proxy_answer(StatusCode::OK, "application/json", body.to_string())
    }

    /// Pods as kubectl's server-side printing asks for them.
    fn table(&self, pods: Vec<Value>) -> http::Response<ProxyBody> {
        let col = |name: &str, priority: i64| {
            json!({"name": name, "type": "string", "format": if name == "Name" {"name"} else {""},
                   "description": "", "priority": priority})
        };
        let rows: Vec<Value> = pods
            .into_iter()
            .map(|p| {
                let statuses = p["status"]["containerStatuses"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                let ready = statuses.iter().filter(|s| s["ready"] == true).count();
                let created = p["metadata"]["creationTimestamp"]
                    .as_str()
                    .and_then(|t| t.parse::<Time>().ok())
                    .map(|t| Time::now().seconds_since(t))
                    .unwrap_or(0);
                let restarts: i64 = statuses
                    .iter()
                    .filter_map(|s| s["restartCount"].as_i64())
                    .sum();
                json!({
                    "cells": [
                        p["metadata"]["name"], format!("{ready}/{}", statuses.len()),
                        p["status"]["phase"], restarts.to_string(), age(created), p["status"]["podIP"],
                        p["spec"]["nodeName"],
                    ],
                    "object": {
                        "kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                        "metadata": p["metadata"],
                    },
                })
            })
            .collect();
        let body = json!({
            "kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": ""},
            "columnDefinitions": [col("Name", 0), col("Ready", 0), col("Status", 0),
                col("Restarts", 0), col("Age", 0), col("IP", 1), col("Node", 1)],
            "rows": rows,
        });
        proxy_answer(StatusCode::OK, "application/json", body.to_string())
    }

    /// A pod's log: a line for each second it has lived (the last `tail` of them), then, when
    /// followed, a line a second for as long as it lives.
    fn logs(
        &self,
        state: &Arc<Mutex<State>>,
        id: u64,
        pod: &str,
        container: &str,
        follow: bool,
        tail: Option<i64>,
    ) -> http::Response<ProxyBody> {
        let lived = {
            let st = self.lock();
            st.pods.get(&id).map(Self::pod_age).unwrap_or(0)
        };
        let start = Time::now().add_seconds(-lived);
        let (pod, container) = (pod.to_string(), container.to_string());
        let line = move |n: i64| {
            format!(
                "{} {container} {pod}: simulated log line {n}\n",
                start.add_seconds(n)
            )
        };
        let count = (lived + 1).min(MAX_LINES);
        let first = (lived + 1 - tail.unwrap_or(count).clamp(0, count)).max(0);
        let past: String = (first..=lived).map(&line).collect();
        if !follow {
            return proxy_answer(StatusCode::OK, "text/plain", past);
        }
        let state = state.clone();
        let next = lived + 1;
        let later = futures_util::stream::unfold(next, move |n| {
            let state = state.clone();
            let line = line.clone();
            async move {
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                // The stream ends with the pod, as a member's does.
                let alive = state
                    .lock()
                    .pods
                    .get(&id)
                    .is_some_and(|p| p.phase != Phase::Succeeded);
                alive.then(|| {
                    (
                        Ok::<_, std::io::Error>(Frame::data(Bytes::from(line(n)))),
                        n + 1,
                    )
                })
            }
        });
        let first = futures_util::stream::once(async move {
            Ok::<_, std::io::Error>(Frame::data(Bytes::from(past)))
        });
        let mut r = http::Response::new(
            StreamBody::new(futures_util::StreamExt::chain(first, later)).boxed_unsync(),
        );
        r.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/plain"),
        );
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_as_kubectl_prints_them() {
        for (s, want) in [
            (5, "5s"),
            (119, "119s"),
            (600, "10m"),
            (7200, "2h"),
            (200_000, "2d"),
        ] {
            assert_eq!(age(s), want);
        }
    }
}

/// The channels of Kubernetes' WebSocket streaming protocol (`v4`/`v5.channel.k8s.io`): each
/// binary message starts with its stream's number.
mod channel {
    pub const STDIN: u8 = 0;
    pub const STDOUT: u8 = 1;
    pub const STDERR: u8 = 2;
    pub const ERROR: u8 = 3;
    /// v5: a stream closed (the next byte says which).
    pub const CLOSE: u8 = 255;
}

/// The Status that ends an exec, as the kubelet sends it on the error channel.
fn exit_status(code: i32, argv: &[String]) -> String {
    if code == 0 {
        return json!({"metadata": {}, "status": "Success"}).to_string();
    }
    json!({
        "metadata": {}, "status": "Failure",
        "message": format!("command terminated with non-zero exit code: error executing command [{}], exit code {code}", argv.join(" ")),
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
    })
    .to_string()
}

/// The bytes of a ConfigMap's or Secret's keys (`data`, and `binaryData`/base64 `data` as
/// their kinds keep them).
fn keys_of(o: &Value, secret: bool) -> Vec<(String, Vec<u8>)> {
    use base64::Engine;
    let b64 = |v: &str| {
        base64::engine::general_purpose::STANDARD
            .decode(v)
            .unwrap_or_default()
    };
    let mut out = Vec::new();
    let map = |f: &str| {
        o.get(f)
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default()
    };
    for (k, v) in map("data") {
        let v = v.as_str().unwrap_or_default();
        out.push((
            k,
            if secret {
                b64(v)
            } else {
                v.as_bytes().to_vec()
            },
        ));
    }
    for (k, v) in map(if secret { "stringData" } else { "binaryData" }) {
        let v = v.as_str().unwrap_or_default();
        out.push((
            k,
            if secret {
                v.as_bytes().to_vec()
            } else {
                b64(v)
            },
        ));
    }
    out
}

/// A downward API field of a pod (`metadata.name`, `metadata.labels['app']`...).
fn field_of(pod: &Value, path: &str) -> Option<String> {
    if let Some(rest) = path
        .strip_prefix("metadata.labels['")
        .or_else(|| path.strip_prefix("metadata.annotations['"))
    {
        let which = if path.starts_with("metadata.labels") {
            "labels"
        } else {
            "annotations"
        };
        let key = rest.strip_suffix("']")?;
        return pod["metadata"][which][key].as_str().map(str::to_string);
    }
    let v = match path {
        "metadata.labels" | "metadata.annotations" => {
            let which = path.trim_start_matches("metadata.");
            let m = pod["metadata"][which].as_object()?;
            return Some(
                m.iter()
                    .map(|(k, v)| format!("{k}=\"{}\"", v.as_str().unwrap_or_default()))
                    .collect::<Vec<_>>()
                    .join("\n"),
            );
        }
        "metadata.name" => &pod["metadata"]["name"],
        "metadata.namespace" => &pod["metadata"]["namespace"],
        "metadata.uid" => &pod["metadata"]["uid"],
        "spec.nodeName" => &pod["spec"]["nodeName"],
        "spec.serviceAccountName" => &pod["spec"]["serviceAccountName"],
        "status.podIP" | "status.hostIP" => &pod["status"]["podIP"],
        _ => return None,
    };
    v.as_str().map(str::to_string)
}

impl SimCluster {
    /// What a pod's container is, for its shell: its files (ConfigMap, Secret and downward API
    /// volumes at their mount paths, and what every container has) and its environment, as
    /// the kubelet builds them.
    fn container_of(
        &self,
        namespace: &str,
        name: &str,
        wanted: Option<&str>,
    ) -> Result<super::shell::Container, String> {
        let Some((_, pod)) = self.find_pod(namespace, name) else {
            return Err(format!("pods \"{name}\" not found"));
        };
        let st = self.lock();
        let owner = st
            .pods
            .iter()
            .find(|(id, p)| p.owner.2 == namespace && pod_name(**id, p) == name)
            .map(|(_, p)| p.owner.clone());
        let tpl = owner
            .as_ref()
            .and_then(|o| template(&st, o))
            .cloned()
            .unwrap_or(Value::Null);
        let spec = &tpl["spec"];
        let containers = spec["containers"].as_array().cloned().unwrap_or_default();
        let default = tpl["metadata"]["annotations"]["kubectl.kubernetes.io/default-container"]
            .as_str()
            .map(str::to_string);
        let chosen = wanted.map(str::to_string).or(default);
        let c = match &chosen {
            Some(n) => containers
                .iter()
                .find(|c| c["name"] == n.as_str())
                .cloned()
                .ok_or_else(|| format!("container {n} is not valid for pod {name}"))?,
            None => containers.first().cloned().unwrap_or(Value::Null),
        };
        let object = |kind: &str, n: &str| {
            st.objects
                .get(&(
                    String::new(),
                    kind.to_string(),
                    namespace.to_string(),
                    n.to_string(),
                ))
                .map(|o| o.manifest.clone())
        };
        let mut files = std::collections::BTreeMap::new();
        let mut dirs = std::collections::BTreeSet::new();
        let volumes = spec["volumes"].as_array().cloned().unwrap_or_default();
        for m in c["volumeMounts"].as_array().into_iter().flatten() {
            let (Some(vname), Some(at)) = (m["name"].as_str(), m["mountPath"].as_str()) else {
                continue;
            };
            let at = at.trim_end_matches('/').to_string();
            let Some(v) = volumes.iter().find(|v| v["name"] == vname) else {
                continue;
            };
            // The keys it holds (name → bytes), and any renames its items give.
            let mut keys: Vec<(String, Vec<u8>)> = Vec::new();
            let mut items: Vec<(String, String)> = Vec::new();
            let mut take = |src: &Value, kind: &str, name_field: &str| {
                if let Some(n) = src[name_field].as_str()
                    && let Some(o) = object(kind, n)
                {
                    keys.extend(keys_of(&o, kind == "Secret"));
                }
                for it in src["items"].as_array().into_iter().flatten() {
                    if let (Some(k), Some(p)) = (it["key"].as_str(), it["path"].as_str()) {
                        items.push((k.to_string(), p.to_string()));
                    }
                }
            };
            if v.get("configMap").is_some() {
                take(&v["configMap"], "ConfigMap", "name");
            } else if v.get("secret").is_some() {
                take(&v["secret"], "Secret", "secretName");
            } else if let Some(sources) = v["projected"]["sources"].as_array() {
                for src in sources {
                    if src.get("configMap").is_some() {
                        take(&src["configMap"], "ConfigMap", "name");
                    } else if src.get("secret").is_some() {
                        take(&src["secret"], "Secret", "name");
                    }
                }
            } else if let Some(list) = v["downwardAPI"]["items"].as_array() {
                for it in list {
                    if let (Some(p), Some(f)) =
                        (it["path"].as_str(), it["fieldRef"]["fieldPath"].as_str())
                    {
                        keys.push((
                            p.to_string(),
                            field_of(&pod, f).unwrap_or_default().into_bytes(),
                        ));
                    }
                }
            }
            let files_of: Vec<(String, Vec<u8>)> = if items.is_empty() {
                keys
            } else {
                items
                    .into_iter()
                    .filter_map(|(k, p)| {
                        keys.iter()
                            .find(|(n, _)| *n == k)
                            .map(|(_, b)| (p, b.clone()))
                    })
                    .collect()
            };
            match m["subPath"].as_str().filter(|s| !s.is_empty()) {
                Some(sub) => {
                    if let Some((_, b)) = files_of.iter().find(|(n, _)| n == sub) {
                        files.insert(at, b.clone());
                    }
                }
                None => {
                    dirs.insert(at.clone());
                    for (n, b) in files_of {
                        files.insert(format!("{at}/{n}"), b);
                    }
                }
            }
        }
        // The environment, in the kubelet's order.
        let mut env: Vec<(String, String)> = vec![
            (
                "PATH".into(),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            ),
            ("HOSTNAME".into(), name.to_string()),
        ];
        let set = |env: &mut Vec<(String, String)>, k: String, v: String| {
            env.retain(|(n, _)| *n != k);
            env.push((k, v));
        };
        for from in c["envFrom"].as_array().into_iter().flatten() {
            let prefix = from["prefix"].as_str().unwrap_or_default();
            let (kind, src) = if from.get("secretRef").is_some() {
                ("Secret", &from["secretRef"])
            } else {
                ("ConfigMap", &from["configMapRef"])
            };
            if let Some(o) = src["name"].as_str().and_then(|n| object(kind, n)) {
                for (k, b) in keys_of(&o, kind == "Secret") {
                    set(
                        &mut env,
                        format!("{prefix}{k}"),
                        String::from_utf8_lossy(&b).into_owned(),
                    );
                }
            }
        }
        for e in c["env"].as_array().into_iter().flatten() {
            let Some(k) = e["name"].as_str() else {
                continue;
            };
            let value = if let Some(v) = e["value"].as_str() {
                // `$(VAR)` of an earlier variable.
                let mut v = v.to_string();
                for (n, val) in env.clone() {
                    v = v.replace(&format!("$({n})"), &val);
                }
                Some(v)
            } else {
                let vf = &e["valueFrom"];
                let key_ref = |kind: &str, r: &Value| -> Option<String> {
                    let o = object(kind, r["name"].as_str()?)?;
                    let k = r["key"].as_str()?;
                    keys_of(&o, kind == "Secret")
                        .into_iter()
                        .find(|(n, _)| n == k)
                        .map(|(_, b)| String::from_utf8_lossy(&b).into_owned())
                };
                if vf.get("configMapKeyRef").is_some() {
                    key_ref("ConfigMap", &vf["configMapKeyRef"])
                } else if vf.get("secretKeyRef").is_some() {
                    key_ref("Secret", &vf["secretKeyRef"])
                } else if let Some(f) = vf["fieldRef"]["fieldPath"].as_str() {
                    field_of(&pod, f)
                } else if let Some(r) = vf["resourceFieldRef"]["resource"].as_str() {
                    c["resources"][if r.starts_with("limits") {
                        "limits"
                    } else {
                        "requests"
                    }][r.split('.').nth(1).unwrap_or_default()]
                    .as_str()
                    .map(str::to_string)
                    .or(Some("0".into()))
                } else {
                    None
                }
            };
            if let Some(v) = value {
                set(&mut env, k.to_string(), v);
            }
        }
        for (k, v) in [
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
            ("KUBERNETES_PORT", "tcp://10.96.0.1:443"),
            ("HOME", "/root"),
        ] {
            if !env.iter().any(|(n, _)| n == k) {
                env.push((k.into(), v.into()));
            }
        }
        let mut command: Vec<String> = c["command"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|x| x.as_str().map(str::to_string))
            .collect();
        command.extend(
            c["args"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|x| x.as_str().map(str::to_string)),
        );
        if command.is_empty() {
            command.push(c["image"].as_str().unwrap_or("/pause").to_string());
        }
        let run_as = |f: &str| {
            c["securityContext"][f]
                .as_u64()
                .or_else(|| spec["securityContext"][f].as_u64())
                .unwrap_or(0) as u32
        };
        Ok(super::shell::Container {
            pod: name.to_string(),
            namespace: namespace.to_string(),
            ip: pod["status"]["podIP"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            command,
            env,
            files,
            dirs,
            uid: run_as("runAsUser"),
            gid: run_as("runAsGroup"),
        }
        .with_base_files())
    }

    /// Answers an upgraded request: an exec into a pod with a small shell on the WebSocket
    /// (`echo`, `hostname`, `pwd`, `env`, `true`, `false`, `cat` (stdin back on stdout),
    /// `sh -c "<line>"`, and `sh` reading lines from stdin until `exit`), or a port-forward
    /// into it (see `portforward`).
    pub(super) fn upgrade(
        &self,
        parts: &http::request::Parts,
        upgrade: hyper::upgrade::OnUpgrade,
    ) -> http::Response<ProxyBody> {
        let path = parts.uri.path().trim_end_matches('/');
        let segments: Vec<&str> = path.split('/').skip(1).collect();
        let (ns, name, exec) = match segments.as_slice() {
            ["api", "v1", "namespaces", ns, "pods", name, "exec"] => (*ns, *name, true),
            ["api", "v1", "namespaces", ns, "pods", name, "portforward"] => (*ns, *name, false),
            _ => {
                return proxy_error(
                    StatusCode::NOT_FOUND,
                    &format!(
                        "the simulated member does not serve {path} (exec and portforward only)"
                    ),
                );
            }
        };
        let Some((_, pod)) = self.find_pod(ns, name) else {
            return proxy_error(StatusCode::NOT_FOUND, &format!("pods \"{name}\" not found"));
        };
        if pod["status"]["phase"] != "Running" {
            return proxy_error(
                StatusCode::BAD_REQUEST,
                &format!("pod {name} is not running"),
            );
        }
        let offered = parts
            .headers
            .get(http::header::SEC_WEBSOCKET_PROTOCOL)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let offered: Vec<&str> = offered.split(',').map(str::trim).collect();
        let speaks: &[&'static str] = match exec {
            true => &["v5.channel.k8s.io", "v4.channel.k8s.io"],
            false => &["SPDY/3.1+portforward.k8s.io"],
        };
        let Some(protocol) = speaks.iter().copied().find(|p| offered.contains(p)) else {
            return proxy_error(
                StatusCode::BAD_REQUEST,
                &format!("the simulated member speaks {}", speaks.join(" and ")),
            );
        };
        let pod_name = name.to_string();
        let session: std::pin::Pin<Box<dyn Future<Output = ()> + Send>> = if exec {
            let query: Vec<(String, String)> =
                form_urlencoded::parse(parts.uri.query().unwrap_or("").as_bytes())
                    .into_owned()
                    .collect();
            let argv: Vec<String> = query
                .iter()
                .filter(|(k, _)| k == "command")
                .map(|(_, v)| v.clone())
                .collect();
            let flag = |k: &str| {
                query
                    .iter()
                    .any(|(q, v)| q == k && (v == "true" || v == "1"))
            };
            let (stdin, tty) = (flag("stdin"), flag("tty"));
            let wanted = query
                .iter()
                .find(|(k, _)| k == "container")
                .map(|(_, v)| v.clone());
            let container = match self.container_of(ns, name, wanted.as_deref()) {
                Ok(c) => c,
                Err(e) => return proxy_error(StatusCode::BAD_REQUEST, &e),
            };
            Box::pin(async move {
                let Ok(io) = upgrade.await else { return };
                shell(websocket(io).await, argv, container, stdin, tty).await;
            })
        } else {
            let target = super::portforward::Target {
                pod: pod_name,
                cluster: self.name.clone(),
                ports: declared_ports(&pod),
            };
            Box::pin(async move {
                let Ok(io) = upgrade.await else { return };
                super::portforward::serve(websocket(io).await, target).await;
            })
        };
        tokio::spawn(session);
        let mut r = proxy_answer(StatusCode::OK, "application/octet-stream", "");
        r.headers_mut().insert(
            http::header::SEC_WEBSOCKET_PROTOCOL,
            http::HeaderValue::from_static(protocol),
        );
        r
    }
}

/// The server's side of a WebSocket the proxy upgraded.
async fn websocket(
    io: hyper::upgrade::Upgraded,
) -> tokio_tungstenite::WebSocketStream<hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>> {
    tokio_tungstenite::WebSocketStream::from_raw_socket(
        hyper_util::rt::TokioIo::new(io),
        tokio_tungstenite::tungstenite::protocol::Role::Server,
        None,
    )
    .await
}

/// The TCP ports a pod's containers declare (what a simulated pod listens on).
fn declared_ports(pod: &Value) -> Vec<u16> {
    let mut ports: Vec<u16> = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| c["ports"].as_array().into_iter().flatten())
        .filter(|p| p["protocol"].as_str().is_none_or(|p| p == "TCP"))
        .filter_map(|p| p["containerPort"].as_u64())
        .filter_map(|p| u16::try_from(p).ok())
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// How long a simulated exec's process takes to start (see [`shell`]).
const PROCESS_START: std::time::Duration = std::time::Duration::from_millis(100);

/// One message of a stream: its channel's number, then the bytes.
fn frame(ch: u8, data: &str) -> tokio_tungstenite::tungstenite::Message {
    let mut b = Vec::with_capacity(data.len() + 1);
    b.push(ch);
    b.extend_from_slice(data.as_bytes());
    tokio_tungstenite::tungstenite::Message::Binary(b.into())
}

/// Runs the simulated shell on an exec's WebSocket: a command (or `sh -c`) runs once, with
/// what arrives on stdin before it closes if stdin was asked for (none otherwise: it never
/// waits); a shell alone reads its lines (echoed on a terminal) until `exit` or stdin ends.
/// Every exec ends with its exit status on the error channel.
async fn shell<S>(
    ws: tokio_tungstenite::WebSocketStream<S>,
    argv: Vec<String>,
    container: super::shell::Container,
    stdin: bool,
    tty: bool,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    // A process takes a moment to start, and client-go depends on it: kubectl's WebSocket
    // executor reads the connection while it is still creating its streams, and drops what
    // arrives for a stream not yet created ("Unknown stream id 1, discarding message"). A
    // real member's answer comes through its API server, a translator and the kubelet; this
    // double answered within microseconds of the upgrade and lost a command's output under
    // load.
    tokio::time::sleep(PROCESS_START).await;
    let (mut tx, mut rx) = ws.split();
    // What the client sends on stdin, until it closes it (or goes).
    let mut next_input = async || -> Option<Vec<u8>> {
        loop {
            match rx.next().await {
                Some(Ok(Message::Binary(b))) => match b.first() {
                    Some(&channel::STDIN) => return Some(b[1..].to_vec()),
                    Some(&channel::CLOSE) if b.get(1) == Some(&channel::STDIN) => return None,
                    _ => {}
                },
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return None,
                Some(Ok(_)) => {}
            }
        }
    };
    // Plays a run's steps; `false` once the client is gone.
    async fn play<T>(tx: &mut T, ran: &super::shell::Ran, tty: bool) -> bool
    where
        T: futures_util::Sink<tokio_tungstenite::tungstenite::Message> + Unpin,
    {
        use futures_util::SinkExt;
        for step in &ran.steps {
            let (ch, bytes) = match step {
                super::shell::Step::Sleep(d) => {
                    tokio::time::sleep(*d).await;
                    continue;
                }
                super::shell::Step::Out(b) => (channel::STDOUT, b),
                // A terminal has one stream.
                super::shell::Step::Err(b) if tty => (channel::STDOUT, b),
                super::shell::Step::Err(b) => (channel::STDERR, b),
            };
            let text = String::from_utf8_lossy(bytes);
            let text = if tty {
                text.replace('\n', "\r\n")
            } else {
                text.into_owned()
            };
            if tx.send(frame(ch, &text)).await.is_err() {
                return false;
            }
        }
        true
    }
    let mut sh = super::shell::Shell::new(&container);
    let interactive = argv.len() == 1 && super::shell::is_shell(&argv[0]) || argv.is_empty();
    let code = if interactive {
        // Line by line, a prompt on a terminal.
        let prompt = "/ # ";
        if tty && tx.send(frame(channel::STDOUT, prompt)).await.is_err() {
            return;
        }
        let mut pending: Vec<u8> = Vec::new();
        let mut code = 0;
        'session: loop {
            if !stdin {
                break;
            }
            let Some(chunk) = next_input().await else {
                break;
            };
            for b in chunk {
                match b {
                    b'\r' | b'\n' => {
                        if tty && tx.send(frame(channel::STDOUT, "\r\n")).await.is_err() {
                            return;
                        }
                        let line =
                            String::from_utf8_lossy(&std::mem::take(&mut pending)).into_owned();
                        let ran = sh.run_script(&line, b"");
                        code = ran.code;
                        if !play(&mut tx, &ran, tty).await {
                            return;
                        }
                        if ran.exit {
                            break 'session;
                        }
                        if tty && tx.send(frame(channel::STDOUT, prompt)).await.is_err() {
                            return;
                        }
                    }
                    // Backspace, Ctrl-C, Ctrl-D on an empty line.
                    0x7f | 0x08 => {
                        if pending.pop().is_some()
                            && tty
                            && tx
                                .send(frame(channel::STDOUT, "\u{8} \u{8}"))
                                .await
                                .is_err()
                        {
                            return;
                        }
                    }
                    0x03 => {
                        pending.clear();
                        if tty && tx.send(frame(channel::STDOUT, "^C\r\n/ # ")).await.is_err() {
                            return;
                        }
                    }
                    0x04 if pending.is_empty() => break 'session,
                    b => {
                        pending.push(b);
                        if tty
                            && tx
                                .send(frame(channel::STDOUT, &String::from_utf8_lossy(&[b])))
                                .await
                                .is_err()
                        {
                            return;
                        }
                    }
                }
            }
        }
        code
    } else {
        let mut input = Vec::new();
        if stdin {
            while let Some(chunk) = next_input().await {
                input.extend(chunk);
            }
        }
        let ran = sh.run_argv(&argv, &input);
        if !play(&mut tx, &ran, tty).await {
            return;
        }
        ran.code
    };
    let _ = tx
        .send(frame(channel::ERROR, &exit_status(code, &argv)))
        .await;
    // A normal closure: kubectl reads an abnormal one (no code) as an error of every stream.
    let _ = tx
        .send(Message::Close(Some(
            tokio_tungstenite::tungstenite::protocol::CloseFrame {
                code: tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode::Normal,
                reason: "".into(),
            },
        )))
        .await;
    // The closing handshake: the connection goes once the client has answered (dropped at
    // once, what was still on its way through the tunnel could be lost).
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        while let Some(Ok(m)) = rx.next().await {
            if m.is_close() {
                break;
            }
        }
    })
    .await;
    let _ = tx.close().await;
}

#[cfg(test)]
mod shell_tests {
    use super::*;

    #[test]
    fn an_exec_ends_with_its_status() {
        assert!(exit_status(0, &[]).contains("Success"));
        let failed = exit_status(3, &["cat".into(), "/nope".into()]);
        assert!(failed.contains("\"message\":\"3\""), "{failed}");
        assert!(failed.contains("executing command [cat /nope]"), "{failed}");
    }
}
