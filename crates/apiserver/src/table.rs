//! `Table` output for `kubectl get`: the columns kubectl shows for built-in kinds, declarative
//! columns for custom resources and Orrery's own kinds. All columns are returned; kubectl hides
//! those with priority above 0 unless asked for `-o wide`.

use std::collections::HashMap;
use std::sync::OnceLock;

use jsonpath_rust::JsonPath;
use orrery_api::{Object, Time};
use serde_json::{Value, json};

use crate::resources::{Column, Printer, ResourceType};

/// What each row carries besides its cells (`?includeObject=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IncludeObject {
    None,
    Metadata,
    Object,
}

impl IncludeObject {
    pub fn parse(v: Option<&str>) -> Result<Self, String> {
        match v {
            None | Some("Metadata") => Ok(IncludeObject::Metadata),
            Some("None") => Ok(IncludeObject::None),
            Some("Object") => Ok(IncludeObject::Object),
            Some(other) => Err(format!(
                "invalid includeObject {other:?}: must be None, Metadata or Object"
            )),
        }
    }
}

/// Kubernetes' `duration.HumanDuration`.
pub fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    if secs < 0 {
        return "0s".into();
    }
    if secs < 120 {
        return format!("{secs}s");
    }
    let minutes = secs / 60;
    if minutes < 10 {
        let s = secs % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = secs / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let dy = (hours / 24) % 365;
        return if dy == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{dy}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

fn since(t: Option<Time>, now: Time) -> String {
    match t {
        Some(t) => human_duration(now.unix_seconds() - t.unix_seconds()),
        None => "<unknown>".into(),
    }
}

fn since_str(v: Option<&Value>, now: Time) -> Option<String> {
    let t: Time = v?.as_str()?.parse().ok()?;
    Some(since(Some(t), now))
}

fn col(name: &str, type_: &str, priority: i32, description: &str) -> Column {
    Column::new(name, type_, "", priority, description)
}

fn name_col() -> Column {
    let mut c = col(
        "Name",
        "string",
        0,
        "Name must be unique within a namespace.",
    );
    c.format = "name".into();
    c
}

fn age_col() -> Column {
    col("Age", "string", 0, "The time since the object was created.")
}

fn int(v: Option<&Value>) -> i64 {
    v.and_then(Value::as_i64).unwrap_or(0)
}

fn s(v: Option<&Value>) -> Option<&str> {
    v.and_then(Value::as_str)
}

fn or_none(v: Option<String>) -> String {
    v.filter(|x| !x.is_empty())
        .unwrap_or_else(|| "<none>".into())
}

fn at<'a>(obj: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(obj, |cur, k| cur.get(*k))
}

fn label_selector_string(sel: Option<&Value>) -> String {
    let Some(sel) = sel else {
        return "<none>".into();
    };
    let mut parts = Vec::new();
    if let Some(m) = sel.get("matchLabels").and_then(Value::as_object) {
        for (k, v) in m {
            parts.push(format!("{k}={}", v.as_str().unwrap_or("")));
        }
    }
    if let Some(exprs) = sel.get("matchExpressions").and_then(Value::as_array) {
        for e in exprs {
            let key = s(e.get("key")).unwrap_or("");
            let values: Vec<&str> = e
                .get("values")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            parts.push(match s(e.get("operator")).unwrap_or("") {
                "In" => format!("{key} in ({})", values.join(",")),
                "NotIn" => format!("{key} notin ({})", values.join(",")),
                "Exists" => key.to_string(),
                "DoesNotExist" => format!("!{key}"),
                _ => key.to_string(),
            });
        }
    }
    if parts.is_empty() {
        "<none>".into()
    } else {
        parts.join(",")
    }
}

fn map_selector_string(sel: Option<&Value>) -> String {
    match sel.and_then(Value::as_object) {
        Some(m) if !m.is_empty() => m
            .iter()
            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
            .collect::<Vec<_>>()
            .join(","),
        _ => "<none>".into(),
    }
}

/// Containers and images of a pod template.
fn containers_images(pod_spec: Option<&Value>) -> (String, String) {
    let list = pod_spec
        .and_then(|p| p.get("containers"))
        .and_then(Value::as_array);
    let names: Vec<&str> = list
        .map(|l| l.iter().filter_map(|c| s(c.get("name"))).collect())
        .unwrap_or_default();
    let images: Vec<&str> = list
        .map(|l| l.iter().filter_map(|c| s(c.get("image"))).collect())
        .unwrap_or_default();
    (
        or_none(Some(names.join(","))),
        or_none(Some(images.join(","))),
    )
}

fn access_modes(v: Option<&Value>) -> String {
    let modes: Vec<&str> = v
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(|m| match m {
                    "ReadWriteOnce" => "RWO",
                    "ReadOnlyMany" => "ROX",
                    "ReadWriteMany" => "RWX",
                    "ReadWriteOncePod" => "RWOP",
                    other => other,
                })
                .collect()
        })
        .unwrap_or_default();
    modes.join(",")
}

/// What a built-in kind's cells are computed from.
struct Row<'a> {
    kind: &'a str,
    o: &'a Value,
    obj: &'a Object,
    now: Time,
}

impl<'a> Row<'a> {
    fn spec(&self, path: &[&str]) -> Option<&'a Value> {
        at(self.o.get("spec")?, path)
    }

    fn status(&self, path: &[&str]) -> Option<&'a Value> {
        at(self.o.get("status")?, path)
    }

    fn spec_str(&self, path: &[&str]) -> Option<&'a str> {
        s(self.spec(path))
    }

    fn status_int(&self, path: &[&str]) -> Value {
        json!(int(self.status(path)))
    }

    /// The pod spec of a workload's template.
    fn pod_spec(&self) -> Option<&'a Value> {
        match self.kind {
            "CronJob" => self.spec(&["jobTemplate", "spec", "template", "spec"]),
            _ => self.spec(&["template", "spec"]),
        }
    }

    fn selector(&self) -> Value {
        let sel = match self.kind {
            "CronJob" => self.spec(&["jobTemplate", "spec", "selector"]),
            _ => self.spec(&["selector"]),
        };
        json!(label_selector_string(sel))
    }

    fn containers(&self) -> Value {
        json!(containers_images(self.pod_spec()).0)
    }

    fn images(&self) -> Value {
        json!(containers_images(self.pod_spec()).1)
    }

    fn desired_replicas(&self) -> i64 {
        self.spec(&["replicas"])
            .and_then(Value::as_i64)
            .unwrap_or(1)
    }

    /// `ready/desired` replicas.
    fn ready_of_desired(&self) -> Value {
        json!(format!(
            "{}/{}",
            int(self.status(&["readyReplicas"])),
            self.desired_replicas()
        ))
    }
}

/// One column of a built-in kind's table: what kubectl shows, and how its cell is computed,
/// side by side so that the two cannot fall out of step.
struct Printed {
    column: Column,
    cell: fn(&Row) -> Value,
}

fn printed(
    name: &str,
    type_: &str,
    priority: i32,
    description: &str,
    cell: fn(&Row) -> Value,
) -> Printed {
    Printed {
        column: Column::new(name, type_, "", priority, description),
        cell,
    }
}

fn name_printed() -> Printed {
    Printed {
        column: name_col(),
        cell: |r| json!(r.obj.name()),
    }
}

fn age_printed() -> Printed {
    Printed {
        column: age_col(),
        cell: |r| json!(since(r.obj.metadata.creation_timestamp, r.now)),
    }
}

/// The `-o wide` columns kubectl shows for workloads.
fn template_printed(with_selector: bool) -> Vec<Printed> {
    let mut v = vec![
        printed(
            "Containers",
            "string",
            1,
            "Names of each container in the template.",
            |r| r.containers(),
        ),
        printed(
            "Images",
            "string",
            1,
            "Images referenced by each container in the template.",
            |r| r.images(),
        ),
    ];
    if with_selector {
        v.push(printed(
            "Selector",
            "string",
            1,
            "Label selector for pods.",
            |r| r.selector(),
        ));
    }
    v
}

/// A binding's subjects of one kind, as kubectl prints them (`ns/name` for ServiceAccounts).
fn subjects(r: &Row, kind: &str) -> Value {
    let names: Vec<String> =
        r.o.get("subjects")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|sub| s(sub.get("kind")) == Some(kind))
            .map(|sub| match (s(sub.get("namespace")), s(sub.get("name"))) {
                (Some(ns), Some(n)) if kind == "ServiceAccount" => format!("{ns}/{n}"),
                (_, n) => n.unwrap_or_default().to_string(),
            })
            .collect();
    json!(names.join(", "))
}

/// Kinds with a printer of their own; any other built-in kind shows its name and age.
const PRINTED_KINDS: &[&str] = &[
    "Namespace",
    "ConfigMap",
    "Secret",
    "Service",
    "ServiceAccount",
    "PersistentVolumeClaim",
    "Event",
    "Pod",
    "Deployment",
    "StatefulSet",
    "DaemonSet",
    "ReplicaSet",
    "Job",
    "CronJob",
    "Ingress",
    "Lease",
    "EndpointSlice",
    "CustomResourceDefinition",
    "Role",
    "ClusterRole",
    "RoleBinding",
    "ClusterRoleBinding",
];

/// The printer of a built-in kind, as kube-apiserver's (`pkg/printers/internalversion`): a
/// data table, an arm per kind.
fn builtin_printer(kind: &str) -> Vec<Printed> {
    let mut v = vec![name_printed()];
    match kind {
        "Namespace" => v.extend([
            printed("Status", "string", 0, "The status of the namespace", |r| {
                json!(s(r.status(&["phase"])).unwrap_or("Active"))
            }),
            age_printed(),
        ]),
        "ConfigMap" => v.extend([
            printed("Data", "string", 0, "Number of data entries", |r| {
                json!(entries(r.o, &["data", "binaryData"]))
            }),
            age_printed(),
        ]),
        "Secret" => v.extend([
            printed("Type", "string", 0, "The type of the secret", |r| {
                json!(s(r.o.get("type")).unwrap_or("Opaque"))
            }),
            printed(
                "Data",
                "string",
                0,
                "The number of entries in the secret",
                |r| json!(entries(r.o, &["data", "stringData"])),
            ),
            age_printed(),
        ]),
        "Service" => v.extend([
            printed("Type", "string", 0, "The type of the service.", |r| {
                json!(r.spec_str(&["type"]).unwrap_or("ClusterIP"))
            }),
            printed(
                "Cluster-IP",
                "string",
                0,
                "The cluster IP of the service.",
                |r| json!(or_none(r.spec_str(&["clusterIP"]).map(str::to_string))),
            ),
            printed(
                "External-IP",
                "string",
                0,
                "The external IP of the service.",
                service_external_ips,
            ),
            printed(
                "Port(s)",
                "string",
                0,
                "The ports of the service.",
                service_ports,
            ),
            age_printed(),
            printed("Selector", "string", 1, "Label selector for pods.", |r| {
                json!(map_selector_string(r.spec(&["selector"])))
            }),
        ]),
        "ServiceAccount" => v.extend([
            printed("Secrets", "string", 0, "The number of secrets", |r| {
                json!(
                    r.o.get("secrets")
                        .and_then(Value::as_array)
                        .map_or(0, Vec::len)
                )
            }),
            age_printed(),
        ]),
        "PersistentVolumeClaim" => v.extend([
            printed("Status", "string", 0, "The phase of the claim.", |r| {
                json!(s(r.status(&["phase"])).unwrap_or("Pending"))
            }),
            printed("Volume", "string", 0, "The bound volume.", |r| {
                json!(r.spec_str(&["volumeName"]).unwrap_or(""))
            }),
            printed(
                "Capacity",
                "string",
                0,
                "The capacity of the bound volume.",
                |r| json!(s(r.status(&["capacity", "storage"])).unwrap_or("")),
            ),
            printed("Access Modes", "string", 0, "The access modes.", |r| {
                json!(access_modes(r.status(&["accessModes"])))
            }),
            printed("StorageClass", "string", 0, "The storage class.", |r| {
                json!(r.spec_str(&["storageClassName"]).unwrap_or("<unset>"))
            }),
            printed(
                "VolumeAttributesClass",
                "string",
                0,
                "The volume attributes class.",
                |r| {
                    json!(
                        r.spec_str(&["volumeAttributesClassName"])
                            .unwrap_or("<unset>")
                    )
                },
            ),
            age_printed(),
            printed("VolumeMode", "string", 1, "The volume mode.", |r| {
                json!(r.spec_str(&["volumeMode"]).unwrap_or("Filesystem"))
            }),
        ]),
        // kubectl's event table starts with when, not the name (which is wide).
        "Event" => {
            v = vec![
                printed(
                    "Last Seen",
                    "string",
                    0,
                    "The last time the event was seen.",
                    |r| {
                        json!(
                            since_str(r.o.get("lastTimestamp"), r.now)
                                .or_else(|| since_str(r.o.get("eventTime"), r.now))
                                .or_else(|| since_str(
                                    at(r.o, &["series", "lastObservedTime"]),
                                    r.now
                                ))
                                .unwrap_or_else(|| "<unknown>".into())
                        )
                    },
                ),
                printed("Type", "string", 0, "The type of the event.", |r| {
                    json!(s(r.o.get("type")).unwrap_or(""))
                }),
                printed("Reason", "string", 0, "The reason for the event.", |r| {
                    json!(s(r.o.get("reason")).unwrap_or(""))
                }),
                printed(
                    "Object",
                    "string",
                    0,
                    "The object the event is about.",
                    |r| {
                        let involved = r.o.get("involvedObject");
                        json!(format!(
                            "{}/{}",
                            s(involved.and_then(|i| i.get("kind")))
                                .unwrap_or("")
                                .to_lowercase(),
                            s(involved.and_then(|i| i.get("name"))).unwrap_or("")
                        ))
                    },
                ),
                printed("Message", "string", 0, "The message of the event.", |r| {
                    json!(s(r.o.get("message")).unwrap_or(""))
                }),
                printed(
                    "Subobject",
                    "string",
                    1,
                    "The part of the object the event is about.",
                    |r| json!(s(at(r.o, &["involvedObject", "fieldPath"])).unwrap_or("")),
                ),
                printed(
                    "Source",
                    "string",
                    1,
                    "The component that reported the event.",
                    |r| {
                        json!(
                            s(at(r.o, &["source", "component"]))
                                .or_else(|| s(r.o.get("reportingComponent")))
                                .unwrap_or("")
                        )
                    },
                ),
                printed(
                    "First Seen",
                    "string",
                    1,
                    "The first time the event was seen.",
                    |r| {
                        json!(
                            since_str(r.o.get("firstTimestamp"), r.now)
                                .or_else(|| since_str(r.o.get("eventTime"), r.now))
                                .unwrap_or_else(|| "<unknown>".into())
                        )
                    },
                ),
                printed("Count", "string", 1, "How often the event happened.", |r| {
                    json!(r.o.get("count").and_then(Value::as_i64).unwrap_or(1))
                }),
                printed("Name", "string", 1, "The event's name.", |r| {
                    json!(r.obj.name())
                }),
            ];
        }
        "Pod" => v.extend([
            printed(
                "Ready",
                "string",
                0,
                "Ready containers of all containers.",
                |r| {
                    let total = r
                        .spec(&["containers"])
                        .and_then(Value::as_array)
                        .map_or(0, Vec::len);
                    let ready = container_statuses(r)
                        .filter(|c| c.get("ready") == Some(&Value::Bool(true)))
                        .count();
                    json!(format!("{ready}/{total}"))
                },
            ),
            printed(
                "Status",
                "string",
                0,
                "The phase or reason of the pod.",
                |r| {
                    if r.obj.metadata.deletion_timestamp.is_some() {
                        return json!("Terminating");
                    }
                    json!(
                        s(r.status(&["reason"]))
                            .or_else(|| s(r.status(&["phase"])))
                            .unwrap_or("Pending")
                    )
                },
            ),
            printed("Restarts", "string", 0, "Container restarts.", |r| {
                json!(
                    container_statuses(r)
                        .map(|c| int(c.get("restartCount")))
                        .sum::<i64>()
                )
            }),
            age_printed(),
            printed("IP", "string", 1, "The pod's IP address.", |r| {
                json!(or_none(s(r.status(&["podIP"])).map(str::to_string)))
            }),
            printed("Node", "string", 1, "The node the pod runs on.", |r| {
                json!(or_none(r.spec_str(&["nodeName"]).map(str::to_string)))
            }),
            printed(
                "Nominated Node",
                "string",
                1,
                "The node nominated for the pod.",
                |r| {
                    json!(or_none(
                        s(r.status(&["nominatedNodeName"])).map(str::to_string)
                    ))
                },
            ),
            printed(
                "Readiness Gates",
                "string",
                1,
                "Readiness gates that hold.",
                |_| json!("<none>"),
            ),
        ]),
        "Deployment" => {
            v.extend([
                printed(
                    "Ready",
                    "string",
                    0,
                    "Ready replicas of desired replicas.",
                    |r| r.ready_of_desired(),
                ),
                printed(
                    "Up-to-date",
                    "integer",
                    0,
                    "Replicas updated to the latest template.",
                    |r| r.status_int(&["updatedReplicas"]),
                ),
                printed("Available", "integer", 0, "Available replicas.", |r| {
                    r.status_int(&["availableReplicas"])
                }),
                age_printed(),
            ]);
            v.extend(template_printed(true));
        }
        "StatefulSet" => {
            v.extend([
                printed(
                    "Ready",
                    "string",
                    0,
                    "Ready replicas of desired replicas.",
                    |r| r.ready_of_desired(),
                ),
                age_printed(),
            ]);
            v.extend(template_printed(false));
        }
        "DaemonSet" => {
            v.extend([
                printed(
                    "Desired",
                    "integer",
                    0,
                    "Nodes that should run the daemon pod.",
                    |r| r.status_int(&["desiredNumberScheduled"]),
                ),
                printed(
                    "Current",
                    "integer",
                    0,
                    "Nodes running the daemon pod.",
                    |r| r.status_int(&["currentNumberScheduled"]),
                ),
                printed(
                    "Ready",
                    "integer",
                    0,
                    "Nodes whose daemon pod is ready.",
                    |r| r.status_int(&["numberReady"]),
                ),
                printed(
                    "Up-to-date",
                    "integer",
                    0,
                    "Nodes running the latest template.",
                    |r| r.status_int(&["updatedNumberScheduled"]),
                ),
                printed(
                    "Available",
                    "integer",
                    0,
                    "Nodes whose daemon pod is available.",
                    |r| r.status_int(&["numberAvailable"]),
                ),
                printed("Node Selector", "string", 0, "The node selector.", |r| {
                    json!(map_selector_string(
                        r.pod_spec().and_then(|t| t.get("nodeSelector"))
                    ))
                }),
                age_printed(),
            ]);
            v.extend(template_printed(true));
        }
        "ReplicaSet" => {
            v.extend([
                printed("Desired", "integer", 0, "Desired replicas.", |r| {
                    json!(r.desired_replicas())
                }),
                printed("Current", "integer", 0, "Current replicas.", |r| {
                    r.status_int(&["replicas"])
                }),
                printed("Ready", "integer", 0, "Ready replicas.", |r| {
                    r.status_int(&["readyReplicas"])
                }),
                age_printed(),
            ]);
            v.extend(template_printed(true));
        }
        "Job" => {
            v.extend([
                printed("Status", "string", 0, "The status of the job.", job_status),
                printed(
                    "Completions",
                    "string",
                    0,
                    "Successful completions of desired completions.",
                    |r| {
                        let succeeded = int(r.status(&["succeeded"]));
                        json!(match r.spec(&["completions"]).and_then(Value::as_i64) {
                            Some(c) => format!("{succeeded}/{c}"),
                            None => format!(
                                "{succeeded}/1 of {}",
                                r.spec(&["parallelism"])
                                    .and_then(Value::as_i64)
                                    .unwrap_or(1)
                            ),
                        })
                    },
                ),
                printed("Duration", "string", 0, "How long the job ran.", |r| {
                    let time = |k: &str| -> Option<Time> { s(r.status(&[k]))?.parse().ok() };
                    json!(match (time("startTime"), time("completionTime")) {
                        (Some(a), Some(b)) => human_duration(b.unix_seconds() - a.unix_seconds()),
                        (Some(a), None) => human_duration(r.now.unix_seconds() - a.unix_seconds()),
                        _ => String::new(),
                    })
                }),
                age_printed(),
            ]);
            v.extend(template_printed(true));
        }
        "CronJob" => {
            v.extend([
                printed("Schedule", "string", 0, "The schedule.", |r| {
                    json!(r.spec_str(&["schedule"]).unwrap_or(""))
                }),
                printed(
                    "Timezone",
                    "string",
                    0,
                    "The time zone of the schedule.",
                    |r| json!(or_none(r.spec_str(&["timeZone"]).map(str::to_string))),
                ),
                printed(
                    "Suspend",
                    "boolean",
                    0,
                    "Whether the cron job is suspended.",
                    |r| {
                        json!(
                            r.spec(&["suspend"])
                                .and_then(Value::as_bool)
                                .unwrap_or(false)
                        )
                    },
                ),
                printed("Active", "integer", 0, "Active jobs.", |r| {
                    json!(
                        r.status(&["active"])
                            .and_then(Value::as_array)
                            .map_or(0, Vec::len)
                    )
                }),
                printed(
                    "Last Schedule",
                    "string",
                    0,
                    "When a job was last scheduled.",
                    |r| {
                        json!(
                            since_str(r.status(&["lastScheduleTime"]), r.now)
                                .unwrap_or_else(|| "<none>".into())
                        )
                    },
                ),
                age_printed(),
            ]);
            v.extend(template_printed(true));
        }
        "EndpointSlice" => v.extend([
            printed(
                "AddressType",
                "string",
                0,
                "The type of the addresses.",
                |r| json!(s(r.o.get("addressType")).unwrap_or_default()),
            ),
            printed(
                "Ports",
                "string",
                0,
                "The ports the endpoints serve on.",
                |r| {
                    let ports: Vec<String> =
                        r.o.get("ports")
                            .and_then(Value::as_array)
                            .map(|ps| {
                                ps.iter()
                                    .filter_map(|p| p.get("port").and_then(Value::as_i64))
                                    .map(|p| p.to_string())
                                    .collect()
                            })
                            .unwrap_or_default();
                    json!(if ports.is_empty() {
                        "<unset>".to_string()
                    } else {
                        ports.join(",")
                    })
                },
            ),
            printed(
                "Endpoints",
                "string",
                0,
                "The endpoints' first addresses.",
                |r| {
                    let addrs: Vec<&str> = r
                        .o
                        .get("endpoints")
                        .and_then(Value::as_array)
                        .map(|es| {
                            es.iter()
                                .filter_map(|e| e.pointer("/addresses/0").and_then(Value::as_str))
                                .collect()
                        })
                        .unwrap_or_default();
                    json!(match addrs.len() {
                        0 => "<unset>".to_string(),
                        1..=3 => addrs.join(","),
                        n => format!("{} + {} more...", addrs[..3].join(","), n - 3),
                    })
                },
            ),
            age_printed(),
        ]),
        "Lease" => v.extend([
            printed("Holder", "string", 0, "The holder of the lease.", |r| {
                json!(r.spec_str(&["holderIdentity"]).unwrap_or_default())
            }),
            age_printed(),
        ]),
        "Ingress" => v.extend([
            printed("Class", "string", 0, "The ingress class.", |r| {
                json!(or_none(
                    r.spec_str(&["ingressClassName"]).map(str::to_string)
                ))
            }),
            printed("Hosts", "string", 0, "The hosts the ingress serves.", |r| {
                let hosts: Vec<&str> = r
                    .spec(&["rules"])
                    .and_then(Value::as_array)
                    .map(|rules| rules.iter().filter_map(|x| s(x.get("host"))).collect())
                    .unwrap_or_default();
                json!(if hosts.is_empty() {
                    "*".to_string()
                } else {
                    hosts.join(",")
                })
            }),
            printed("Address", "string", 0, "The load balancer address.", |r| {
                json!(load_balancer_addresses(r).join(","))
            }),
            printed("Ports", "string", 0, "The ports.", |r| {
                let tls = r
                    .spec(&["tls"])
                    .and_then(Value::as_array)
                    .is_some_and(|t| !t.is_empty());
                json!(if tls { "80, 443" } else { "80" })
            }),
            age_printed(),
        ]),
        "RoleBinding" | "ClusterRoleBinding" => {
            v.push(printed("Role", "string", 0, "The role bound.", |r| {
                let kind = s(at(r.o, &["roleRef", "kind"])).unwrap_or_default();
                let name = s(at(r.o, &["roleRef", "name"])).unwrap_or_default();
                json!(format!("{kind}/{name}"))
            }));
            v.push(age_printed());
            v.extend([
                printed("Users", "string", 1, "Users bound.", |r| {
                    subjects(r, "User")
                }),
                printed("Groups", "string", 1, "Groups bound.", |r| {
                    subjects(r, "Group")
                }),
                printed(
                    "ServiceAccounts",
                    "string",
                    1,
                    "ServiceAccounts bound.",
                    |r| subjects(r, "ServiceAccount"),
                ),
            ]);
        }
        "CustomResourceDefinition" | "Role" | "ClusterRole" => v.push(printed(
            "Created At",
            "date",
            0,
            "When the definition was created.",
            |r| {
                json!(
                    r.obj
                        .metadata
                        .creation_timestamp
                        .map(|t| t.to_string())
                        .unwrap_or_default()
                )
            },
        )),
        _ => v.push(age_printed()),
    }
    v
}

/// The printer of a built-in kind, built once per process.
fn printer_of(kind: &str) -> &'static [Printed] {
    static PRINTERS: OnceLock<HashMap<&'static str, Vec<Printed>>> = OnceLock::new();
    static DEFAULT: OnceLock<Vec<Printed>> = OnceLock::new();
    PRINTERS
        .get_or_init(|| {
            PRINTED_KINDS
                .iter()
                .map(|k| (*k, builtin_printer(k)))
                .collect()
        })
        .get(kind)
        .map(Vec::as_slice)
        .unwrap_or_else(|| DEFAULT.get_or_init(|| builtin_printer("")))
}

/// How many entries the maps at these keys hold together.
fn entries(o: &Value, keys: &[&str]) -> usize {
    keys.iter()
        .map(|k| o.get(*k).and_then(Value::as_object).map_or(0, |m| m.len()))
        .sum()
}

fn container_statuses<'a>(r: &Row<'a>) -> impl Iterator<Item = &'a Value> {
    r.status(&["containerStatuses"])
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

fn load_balancer_addresses<'a>(r: &Row<'a>) -> Vec<&'a str> {
    r.status(&["loadBalancer", "ingress"])
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|i| s(i.get("ip")).or_else(|| s(i.get("hostname"))))
                .collect()
        })
        .unwrap_or_default()
}

fn service_external_ips(r: &Row) -> Value {
    if r.spec_str(&["type"]) == Some("ExternalName") {
        return json!(or_none(r.spec_str(&["externalName"]).map(str::to_string)));
    }
    let mut external: Vec<&str> = r
        .spec(&["externalIPs"])
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    external.extend(load_balancer_addresses(r));
    json!(or_none(Some(external.join(","))))
}

fn service_ports(r: &Row) -> Value {
    let ports: Vec<String> = r
        .spec(&["ports"])
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|p| {
                    let proto = s(p.get("protocol")).unwrap_or("TCP");
                    match p.get("nodePort").and_then(Value::as_i64) {
                        Some(np) => format!("{}:{np}/{proto}", int(p.get("port"))),
                        None => format!("{}/{proto}", int(p.get("port"))),
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    json!(or_none(Some(ports.join(","))))
}

fn job_status(r: &Row) -> Value {
    let has = |t: &str| {
        r.status(&["conditions"])
            .and_then(Value::as_array)
            .is_some_and(|c| {
                c.iter()
                    .any(|x| s(x.get("type")) == Some(t) && s(x.get("status")) == Some("True"))
            })
    };
    json!(if has("Complete") {
        "Complete"
    } else if has("Failed") {
        "Failed"
    } else if r.spec(&["suspend"]) == Some(&Value::Bool(true)) {
        "Suspended"
    } else {
        "Running"
    })
}

/// Evaluates a Kubernetes-style JSONPath (`.status.conditions[?(@.type=="Ready")].status`).
pub fn json_path(v: &Value, path: &str) -> Option<Value> {
    let full = if path.starts_with('$') {
        path.to_string()
    } else {
        format!("${path}")
    };
    let found = v.query(&full).ok()?;
    match found.as_slice() {
        [] => None,
        [one] => Some((*one).clone()),
        many => Some(Value::String(
            many.iter()
                .map(|x| {
                    x.as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| x.to_string())
                })
                .collect::<Vec<_>>()
                .join(","),
        )),
    }
}

fn declared_cell(c: &Column, o: &Value, now: Time) -> Value {
    let v = json_path(o, &c.json_path);
    if c.render == crate::resources::Render::Level
        && let Some(level) = v.as_ref().and_then(Value::as_f64)
        && level > 1.0
    {
        return json!(format!("{level} (over 100%)"));
    }
    match (c.type_.as_str(), v) {
        ("date", Some(Value::String(t))) => match t.parse::<Time>() {
            Ok(t) => json!(since(Some(t), now)),
            Err(_) => json!(t),
        },
        (_, Some(v)) => v,
        (_, None) => Value::Null,
    }
}

/// The column definitions for a resource.
pub fn columns(rt: &ResourceType) -> Vec<Column> {
    match &rt.printer {
        Printer::BuiltIn => printer_of(&rt.kind)
            .iter()
            .map(|p| p.column.clone())
            .collect(),
        Printer::Columns(cols) => {
            let mut all = vec![name_col()];
            all.extend(cols.iter().cloned());
            all
        }
    }
}

fn column_json(c: &Column) -> Value {
    json!({
        "name": c.name,
        "type": c.type_,
        "format": c.format,
        "description": c.description,
        "priority": c.priority,
    })
}

/// One row.
pub fn row(rt: &ResourceType, obj: &Object, include: IncludeObject, now: Time) -> Value {
    row_of(rt, obj.to_value(), obj, include, now)
}

/// A row from an object's JSON (a large list is turned into rows one stored object at a time).
pub fn row_from_json(rt: &ResourceType, value: Value, include: IncludeObject, now: Time) -> Value {
    // The printers read names and times from typed metadata; the rest from the JSON.
    let obj = Object {
        metadata: value
            .get("metadata")
            .and_then(|m| serde_json::from_value(m.clone()).ok())
            .unwrap_or_default(),
        ..Default::default()
    };
    row_of(rt, value, &obj, include, now)
}

fn row_of(
    rt: &ResourceType,
    value: Value,
    obj: &Object,
    include: IncludeObject,
    now: Time,
) -> Value {
    let cells = match &rt.printer {
        Printer::BuiltIn => {
            let r = Row {
                kind: &rt.kind,
                o: &value,
                obj,
                now,
            };
            printer_of(&rt.kind).iter().map(|p| (p.cell)(&r)).collect()
        }
        Printer::Columns(cols) => {
            let mut cells = vec![json!(obj.name())];
            cells.extend(cols.iter().map(|c| declared_cell(c, &value, now)));
            cells
        }
    };
    let mut row = json!({ "cells": cells });
    match include {
        IncludeObject::None => {}
        IncludeObject::Metadata => {
            let mut value = value;
            let metadata = value
                .get_mut("metadata")
                .map(Value::take)
                .unwrap_or(json!({}));
            row["object"] = json!({
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": metadata,
            });
        }
        IncludeObject::Object => row["object"] = value,
    }
    row
}

/// A Table of objects.
pub fn table(
    rt: &ResourceType,
    objects: &[Object],
    resource_version: &str,
    continue_token: Option<&str>,
    include: IncludeObject,
) -> Value {
    let now = Time::now();
    let mut metadata = json!({ "resourceVersion": resource_version });
    if let Some(c) = continue_token {
        metadata["continue"] = json!(c);
    }
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "columnDefinitions": columns(rt).iter().map(column_json).collect::<Vec<_>>(),
        "rows": objects.iter().map(|o| row(rt, o, include, now)).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{Registry, builtin};

    #[test]
    fn durations_like_kubernetes() {
        let cases = [
            (0, "0s"),
            (59, "59s"),
            (119, "119s"),
            (120, "2m"),
            (125, "2m5s"),
            (600, "10m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 600, "3h10m"),
            (9 * 3600, "9h"),
            (50 * 3600, "2d2h"),
            (9 * 86400, "9d"),
            (3 * 365 * 86400, "3y"),
            (-5, "<invalid>"),
        ];
        for (secs, want) in cases {
            assert_eq!(human_duration(secs), want, "{secs}");
        }
    }

    #[test]
    fn deployment_row_and_wide_columns() {
        let reg = Registry::new(builtin());
        let rt = reg.get("apps", "v1", "deployments").unwrap();
        let obj: Object = serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default", "creationTimestamp": Time::now().to_string()},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]}}},
            "status": {"readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2}
        })).unwrap();
        let t = table(&rt, &[obj], "10", None, IncludeObject::Metadata);
        let names: Vec<_> = t["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "Name",
                "Ready",
                "Up-to-date",
                "Available",
                "Age",
                "Containers",
                "Images",
                "Selector"
            ]
        );
        assert_eq!(
            t["rows"][0]["cells"],
            json!(["web", "2/3", 3, 2, "0s", "web", "nginx:1.27", "app=web"])
        );
        assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
        assert_eq!(t["metadata"]["resourceVersion"], "10");
    }

    /// Job, Service and Event rows, whose cells are computed (not read at a path).
    #[test]
    fn computed_cells_of_built_in_kinds() {
        let reg = Registry::new(builtin());
        let now = Time::now();
        let cells = |plural: &str, group: &str, v: Value| {
            let rt = reg.get(group, "v1", plural).unwrap();
            let obj: Object = serde_json::from_value(v).unwrap();
            let r = row(&rt, &obj, IncludeObject::None, now);
            assert_eq!(
                r["cells"].as_array().unwrap().len(),
                columns(&rt).len(),
                "{plural}"
            );
            r["cells"].clone()
        };
        let job = cells(
            "jobs",
            "batch",
            json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
                   "spec": {"completions": 3, "template": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}},
                   "status": {"succeeded": 3, "conditions": [{"type": "Complete", "status": "True"}],
                              "startTime": "2026-01-01T00:00:00Z", "completionTime": "2026-01-01T00:02:05Z"}}),
        );
        assert_eq!(job[1], "Complete");
        assert_eq!(job[2], "3/3");
        assert_eq!(job[3], "2m5s");
        assert_eq!(job[5], "c");
        let svc = cells(
            "services",
            "",
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
                   "spec": {"type": "LoadBalancer", "clusterIP": "10.0.0.1", "selector": {"app": "web"},
                            "ports": [{"port": 80, "nodePort": 30080}]},
                   "status": {"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}]}}}),
        );
        assert_eq!(
            svc,
            json!([
                "s",
                "LoadBalancer",
                "10.0.0.1",
                "1.2.3.4",
                "80:30080/TCP",
                "<unknown>",
                "app=web"
            ])
        );
        let event = cells(
            "events",
            "",
            json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "web.1"},
                   "involvedObject": {"kind": "Deployment", "name": "web"}, "type": "Warning",
                   "reason": "NoPlacementPolicy", "message": "m", "count": 2}),
        );
        assert_eq!(event[3], "deployment/web");
        assert_eq!(event[8], 2);
        assert_eq!(event[9], "web.1");
        // A kind without a printer of its own: name and age.
        let rt = reg.get("", "v1", "nodes").unwrap();
        let names: Vec<String> = columns(&rt).iter().map(|c| c.name.clone()).collect();
        assert_eq!(names, ["Name", "Age"]);
    }

    #[test]
    fn declarative_columns_use_json_path() {
        let reg = Registry::new(builtin());
        let rt = reg.get("multicluster.io", "v1alpha1", "clusters").unwrap();
        let obj: Object = serde_json::from_value(json!({
            "apiVersion": "multicluster.io/v1alpha1", "kind": "Cluster",
            "metadata": {"name": "east"},
            "spec": {"syncMode": "Pull", "region": "us-east-1", "zones": ["a", "b"],
                     "taints": [{"key": "x", "effect": "NoSchedule"}, {"key": "y", "effect": "NoExecute"}]},
            "status": {"conditions": [{"type": "Joined", "status": "True"}, {"type": "Ready", "status": "False"}],
                       "waterLevel": {"overall": 0.42, "cpu": 0.5}, "nodeSummary": {"readyNum": 3}}
        })).unwrap();
        let r = row(&rt, &obj, IncludeObject::None, Time::now());
        // The columns of `-o wide` (priority 1) follow Age; lists of values are joined.
        assert_eq!(
            r["cells"],
            json!([
                "east",
                "Pull",
                "False",
                "us-east-1",
                0.42,
                null,
                null,
                "a,b",
                null,
                3,
                0.5,
                null,
                "x,y"
            ])
        );
        assert!(r.get("object").is_none());

        // An overcommitted cluster's level says so.
        let mut over = obj.clone();
        if let Some(st) = over.status.as_mut() {
            st["waterLevel"]["overall"] = json!(1.037);
        }
        let r = row(&rt, &over, IncludeObject::None, Time::now());
        assert_eq!(r["cells"][4], json!("1.037 (over 100%)"));
    }
}
