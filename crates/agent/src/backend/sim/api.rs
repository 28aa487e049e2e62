//! What a simulated member answers through the cluster proxy: a slice of the Kubernetes API
//! over its pods — discovery, pods listed or read (as JSON, or as the Table kubectl asks
//! for) and their logs, generated lines that a follow keeps streaming while the pod lives —
//! so that `kubectl get pods` and `kubectl logs` work against it; the workloads it runs
//! (apps/v1, batch/v1), read, so that `logs deploy/web` finds its pods; label selectors on
//! lists; and the upgraded requests of
//! `kubectl exec` (a small shell) and `kubectl port-forward` (`portforward`). It stands in for a real
//! member's API, which the kube backend forwards to.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use orrery_api::Time;
use serde_json::{Value, json};

use super::{Key, Phase, Pod, SimCluster, State};
use crate::backend::{ProxyBody, proxy_answer, proxy_error};

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
        pod.since.elapsed().as_secs() as i64
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
        let started = Time::now().add_seconds(-Self::pod_age(pod));
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
                    "restartCount": 0,
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
                "uid": format!("{:08x}-0000-4000-8000-{:012x}", self.seed as u32, id),
                "creationTimestamp": started.to_string(),
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
                "resources": [
                    {"name": "pods", "singularName": "pod", "namespaced": true, "kind": "Pod",
                     "verbs": ["get", "list"], "shortNames": ["po"], "categories": ["all"]},
                    {"name": "pods/log", "singularName": "", "namespaced": true, "kind": "Pod",
                     "verbs": ["get"]},
                    {"name": "pods/exec", "singularName": "", "namespaced": true,
                     "kind": "PodExecOptions", "verbs": ["create", "get"]},
                    {"name": "pods/portforward", "singularName": "", "namespaced": true,
                     "kind": "PodPortForwardOptions", "verbs": ["create", "get"]},
                ],
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
            .map(|(k, o)| {
                let mut m = o.manifest.clone();
                if let Some(status) = self.object_state(&st, k, o).status {
                    m["status"] = status;
                }
                if m["metadata"]["creationTimestamp"].is_null() && m["metadata"].is_object() {
                    m["metadata"]["creationTimestamp"] = json!(o.created);
                }
                m
            })
            .collect()
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
                let started = p["status"]["startTime"]
                    .as_str()
                    .and_then(|t| t.parse::<Time>().ok())
                    .map(|t| Time::now().seconds_since(t))
                    .unwrap_or(0);
                json!({
                    "cells": [
                        p["metadata"]["name"], format!("{ready}/{}", statuses.len()),
                        p["status"]["phase"], "0", age(started), p["status"]["podIP"],
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
                    .unwrap_or_else(|p| p.into_inner())
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

/// What one command of the simulated shell prints, and its exit code.
fn builtin(words: &[String], pod: &str) -> (String, String, i32) {
    let Some(cmd) = words.first() else {
        return (String::new(), String::new(), 0);
    };
    let args = &words[1..];
    match cmd.as_str() {
        "echo" => (format!("{}\n", args.join(" ")), String::new(), 0),
        "hostname" => (format!("{pod}\n"), String::new(), 0),
        "pwd" => ("/\n".into(), String::new(), 0),
        "true" | ":" => (String::new(), String::new(), 0),
        "false" => (String::new(), String::new(), 1),
        "env" => (
            format!(
                "HOSTNAME={pod}\nPATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
            ),
            String::new(),
            0,
        ),
        other => (String::new(), format!("sh: {other}: not found\n"), 127),
    }
}

/// The Status that ends an exec, as the kubelet sends it on the error channel.
fn exit_status(code: i32) -> String {
    if code == 0 {
        return json!({"metadata": {}, "status": "Success"}).to_string();
    }
    json!({
        "metadata": {}, "status": "Failure",
        "message": format!("command terminated with non-zero exit code: error executing command [sh], exit code {code}"),
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
    })
    .to_string()
}

impl SimCluster {
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
            Box::pin(async move {
                let Ok(io) = upgrade.await else { return };
                shell(websocket(io).await, argv, &pod_name).await;
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

/// One message of a stream: its channel's number, then the bytes.
fn frame(ch: u8, data: &str) -> tokio_tungstenite::tungstenite::Message {
    let mut b = Vec::with_capacity(data.len() + 1);
    b.push(ch);
    b.extend_from_slice(data.as_bytes());
    tokio_tungstenite::tungstenite::Message::Binary(b.into())
}

/// Sends what a command printed; `false` once the client is gone.
async fn say<S>(tx: &mut S, out: &str, err: &str) -> bool
where
    S: futures_util::Sink<tokio_tungstenite::tungstenite::Message> + Unpin,
{
    use futures_util::SinkExt;
    for (ch, text) in [(channel::STDOUT, out), (channel::STDERR, err)] {
        if !text.is_empty() && tx.send(frame(ch, text)).await.is_err() {
            return false;
        }
    }
    true
}

/// Runs the simulated shell on an exec's WebSocket.
async fn shell<S>(ws: tokio_tungstenite::WebSocketStream<S>, argv: Vec<String>, pod: &str)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let (mut tx, mut rx) = ws.split();
    // Stdin as it comes; `None` once it is closed.
    let mut pending = String::new();
    let mut stdin_open = true;
    let mut code = 0;
    let interactive = matches!(argv.as_slice(), [sh] if sh == "sh" || sh == "bash");
    let one_line = match argv.as_slice() {
        [sh, c, line] if (sh == "sh" || sh == "bash") && c == "-c" => Some(line.clone()),
        _ => None,
    };
    if interactive || argv.first().is_some_and(|c| c == "cat") {
        loop {
            // Whole lines first (the shell), or whatever came (cat).
            while let Some(i) = pending.find('\n').filter(|_| interactive) {
                let line: String = pending.drain(..=i).collect();
                let words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
                if words.first().is_some_and(|w| w == "exit") {
                    code = words.get(1).and_then(|c| c.parse().ok()).unwrap_or(0);
                    stdin_open = false;
                    pending.clear();
                    break;
                }
                let (out, err, c) = builtin(&words, pod);
                code = c;
                if !say(&mut tx, &out, &err).await {
                    return;
                }
            }
            if !interactive && !pending.is_empty() {
                let out = std::mem::take(&mut pending);
                if tx.send(frame(channel::STDOUT, &out)).await.is_err() {
                    return;
                }
            }
            if !stdin_open {
                break;
            }
            match rx.next().await {
                Some(Ok(Message::Binary(b))) => match b.first() {
                    Some(&channel::STDIN) => pending.push_str(&String::from_utf8_lossy(&b[1..])),
                    Some(&channel::CLOSE) if b.get(1) == Some(&channel::STDIN) => {
                        stdin_open = false
                    }
                    _ => {}
                },
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => stdin_open = false,
                Some(Ok(_)) => {}
            }
        }
    } else {
        let words = match one_line {
            Some(line) => line.split_whitespace().map(str::to_string).collect(),
            None => argv.clone(),
        };
        let (out, err, c) = builtin(&words, pod);
        code = c;
        if !say(&mut tx, &out, &err).await {
            return;
        }
    }
    let _ = tx.send(frame(channel::ERROR, &exit_status(code))).await;
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
    fn the_shell_knows_a_few_commands() {
        let w = |s: &str| s.split_whitespace().map(str::to_string).collect::<Vec<_>>();
        assert_eq!(builtin(&w("echo hello  world"), "p").0, "hello world\n");
        assert_eq!(builtin(&w("hostname"), "web-0").0, "web-0\n");
        assert_eq!(builtin(&w("false"), "p").2, 1);
        let (out, err, code) = builtin(&w("rm -rf /"), "p");
        assert_eq!(
            (out.as_str(), err.as_str(), code),
            ("", "sh: rm: not found\n", 127)
        );
        assert!(exit_status(0).contains("Success"));
        assert!(exit_status(3).contains("\"message\":\"3\""));
    }
}
