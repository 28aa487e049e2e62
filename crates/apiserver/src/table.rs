//! `Table` output for `kubectl get`: the columns kubectl shows for built-in kinds, declarative
//! columns for custom resources and Orrery's own kinds. All columns are returned; kubectl hides
//! those with priority above 0 unless asked for `-o wide`.

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

/// The columns and the cells of one object, for built-in kinds.
fn builtin_columns(kind: &str) -> Vec<Column> {
    let containers = col(
        "Containers",
        "string",
        1,
        "Names of each container in the template.",
    );
    let images = col(
        "Images",
        "string",
        1,
        "Images referenced by each container in the template.",
    );
    let selector = col("Selector", "string", 1, "Label selector for pods.");
    match kind {
        "Namespace" => vec![
            name_col(),
            col("Status", "string", 0, "The status of the namespace"),
            age_col(),
        ],
        "ConfigMap" => vec![
            name_col(),
            col("Data", "string", 0, "Number of data entries"),
            age_col(),
        ],
        "Secret" => vec![
            name_col(),
            col("Type", "string", 0, "The type of the secret"),
            col("Data", "string", 0, "The number of entries in the secret"),
            age_col(),
        ],
        "Service" => vec![
            name_col(),
            col("Type", "string", 0, "The type of the service."),
            col("Cluster-IP", "string", 0, "The cluster IP of the service."),
            col(
                "External-IP",
                "string",
                0,
                "The external IP of the service.",
            ),
            col("Port(s)", "string", 0, "The ports of the service."),
            age_col(),
            selector,
        ],
        "ServiceAccount" => vec![
            name_col(),
            col("Secrets", "string", 0, "The number of secrets"),
            age_col(),
        ],
        "PersistentVolumeClaim" => vec![
            name_col(),
            col("Status", "string", 0, "The phase of the claim."),
            col("Volume", "string", 0, "The bound volume."),
            col("Capacity", "string", 0, "The capacity of the bound volume."),
            col("Access Modes", "string", 0, "The access modes."),
            col("StorageClass", "string", 0, "The storage class."),
            col(
                "VolumeAttributesClass",
                "string",
                0,
                "The volume attributes class.",
            ),
            age_col(),
            col("VolumeMode", "string", 1, "The volume mode."),
        ],
        "Event" => vec![
            col(
                "Last Seen",
                "string",
                0,
                "The last time the event was seen.",
            ),
            col("Type", "string", 0, "The type of the event."),
            col("Reason", "string", 0, "The reason for the event."),
            col("Object", "string", 0, "The object the event is about."),
            col("Message", "string", 0, "The message of the event."),
            col(
                "Subobject",
                "string",
                1,
                "The part of the object the event is about.",
            ),
            col(
                "Source",
                "string",
                1,
                "The component that reported the event.",
            ),
            col(
                "First Seen",
                "string",
                1,
                "The first time the event was seen.",
            ),
            col("Count", "string", 1, "How often the event happened."),
            col("Name", "string", 1, "The event's name."),
        ],
        "Pod" => vec![
            name_col(),
            col("Ready", "string", 0, "Ready containers of all containers."),
            col("Status", "string", 0, "The phase or reason of the pod."),
            col("Restarts", "string", 0, "Container restarts."),
            age_col(),
            col("IP", "string", 1, "The pod's IP address."),
            col("Node", "string", 1, "The node the pod runs on."),
            col(
                "Nominated Node",
                "string",
                1,
                "The node nominated for the pod.",
            ),
            col("Readiness Gates", "string", 1, "Readiness gates that hold."),
        ],
        "Deployment" => vec![
            name_col(),
            col("Ready", "string", 0, "Ready replicas of desired replicas."),
            col(
                "Up-to-date",
                "integer",
                0,
                "Replicas updated to the latest template.",
            ),
            col("Available", "integer", 0, "Available replicas."),
            age_col(),
            containers,
            images,
            selector,
        ],
        "StatefulSet" => vec![
            name_col(),
            col("Ready", "string", 0, "Ready replicas of desired replicas."),
            age_col(),
            containers,
            images,
        ],
        "DaemonSet" => vec![
            name_col(),
            col(
                "Desired",
                "integer",
                0,
                "Nodes that should run the daemon pod.",
            ),
            col("Current", "integer", 0, "Nodes running the daemon pod."),
            col("Ready", "integer", 0, "Nodes whose daemon pod is ready."),
            col(
                "Up-to-date",
                "integer",
                0,
                "Nodes running the latest template.",
            ),
            col(
                "Available",
                "integer",
                0,
                "Nodes whose daemon pod is available.",
            ),
            col("Node Selector", "string", 0, "The node selector."),
            age_col(),
            containers,
            images,
            selector,
        ],
        "ReplicaSet" => vec![
            name_col(),
            col("Desired", "integer", 0, "Desired replicas."),
            col("Current", "integer", 0, "Current replicas."),
            col("Ready", "integer", 0, "Ready replicas."),
            age_col(),
            containers,
            images,
            selector,
        ],
        "Job" => vec![
            name_col(),
            col("Status", "string", 0, "The status of the job."),
            col(
                "Completions",
                "string",
                0,
                "Successful completions of desired completions.",
            ),
            col("Duration", "string", 0, "How long the job ran."),
            age_col(),
            containers,
            images,
            selector,
        ],
        "CronJob" => vec![
            name_col(),
            col("Schedule", "string", 0, "The schedule."),
            col("Timezone", "string", 0, "The time zone of the schedule."),
            col(
                "Suspend",
                "boolean",
                0,
                "Whether the cron job is suspended.",
            ),
            col("Active", "integer", 0, "Active jobs."),
            col(
                "Last Schedule",
                "string",
                0,
                "When a job was last scheduled.",
            ),
            age_col(),
            containers,
            images,
            selector,
        ],
        "Ingress" => vec![
            name_col(),
            col("Class", "string", 0, "The ingress class."),
            col("Hosts", "string", 0, "The hosts the ingress serves."),
            col("Address", "string", 0, "The load balancer address."),
            col("Ports", "string", 0, "The ports."),
            age_col(),
        ],
        "CustomResourceDefinition" => vec![
            name_col(),
            col("Created At", "date", 0, "When the definition was created."),
        ],
        _ => vec![name_col(), age_col()],
    }
}

fn builtin_cells(kind: &str, o: &Value, obj: &Object, now: Time) -> Vec<Value> {
    let name = json!(obj.name());
    let age = json!(since(obj.metadata.creation_timestamp, now));
    let spec = o.get("spec");
    let status = o.get("status");
    let template_spec = spec.and_then(|sp| at(sp, &["template", "spec"]));
    match kind {
        "Namespace" => vec![
            name,
            json!(s(status.and_then(|st| st.get("phase"))).unwrap_or("Active")),
            age,
        ],
        "ConfigMap" => {
            let n = o
                .get("data")
                .and_then(Value::as_object)
                .map_or(0, |m| m.len())
                + o.get("binaryData")
                    .and_then(Value::as_object)
                    .map_or(0, |m| m.len());
            vec![name, json!(n), age]
        }
        "Secret" => {
            let n = o
                .get("data")
                .and_then(Value::as_object)
                .map_or(0, |m| m.len())
                + o.get("stringData")
                    .and_then(Value::as_object)
                    .map_or(0, |m| m.len());
            vec![
                name,
                json!(s(o.get("type")).unwrap_or("Opaque")),
                json!(n),
                age,
            ]
        }
        "Service" => {
            let ty = s(spec.and_then(|x| x.get("type"))).unwrap_or("ClusterIP");
            let cluster_ip = or_none(s(spec.and_then(|x| x.get("clusterIP"))).map(str::to_string));
            let mut external: Vec<String> = spec
                .and_then(|x| x.get("externalIPs"))
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default();
            if let Some(ing) = status
                .and_then(|st| at(st, &["loadBalancer", "ingress"]))
                .and_then(Value::as_array)
            {
                external.extend(
                    ing.iter()
                        .filter_map(|i| s(i.get("ip")).or_else(|| s(i.get("hostname"))))
                        .map(str::to_string),
                );
            }
            if ty == "ExternalName" {
                external = s(spec.and_then(|x| x.get("externalName")))
                    .map(|e| vec![e.to_string()])
                    .unwrap_or_default();
            }
            let ports: Vec<String> = spec
                .and_then(|x| x.get("ports"))
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
            vec![
                name,
                json!(ty),
                json!(cluster_ip),
                json!(or_none(Some(external.join(",")))),
                json!(or_none(Some(ports.join(",")))),
                age,
                json!(map_selector_string(spec.and_then(|x| x.get("selector")))),
            ]
        }
        "ServiceAccount" => vec![
            name,
            json!(
                o.get("secrets")
                    .and_then(Value::as_array)
                    .map_or(0, Vec::len)
            ),
            age,
        ],
        "PersistentVolumeClaim" => vec![
            name,
            json!(s(status.and_then(|x| x.get("phase"))).unwrap_or("Pending")),
            json!(s(spec.and_then(|x| x.get("volumeName"))).unwrap_or("")),
            json!(s(status.and_then(|x| at(x, &["capacity", "storage"]))).unwrap_or("")),
            json!(access_modes(status.and_then(|x| x.get("accessModes")))),
            json!(s(spec.and_then(|x| x.get("storageClassName"))).unwrap_or("<unset>")),
            json!(s(spec.and_then(|x| x.get("volumeAttributesClassName"))).unwrap_or("<unset>")),
            age,
            json!(s(spec.and_then(|x| x.get("volumeMode"))).unwrap_or("Filesystem")),
        ],
        "Event" => {
            let last = since_str(o.get("lastTimestamp"), now)
                .or_else(|| since_str(o.get("eventTime"), now))
                .or_else(|| since_str(at(o, &["series", "lastObservedTime"]), now))
                .unwrap_or_else(|| "<unknown>".into());
            let first = since_str(o.get("firstTimestamp"), now)
                .or_else(|| since_str(o.get("eventTime"), now))
                .unwrap_or_else(|| "<unknown>".into());
            let involved = o.get("involvedObject");
            let object = format!(
                "{}/{}",
                s(involved.and_then(|i| i.get("kind")))
                    .unwrap_or("")
                    .to_lowercase(),
                s(involved.and_then(|i| i.get("name"))).unwrap_or("")
            );
            let source = s(at(o, &["source", "component"]))
                .or_else(|| s(o.get("reportingComponent")))
                .unwrap_or("");
            vec![
                json!(last),
                json!(s(o.get("type")).unwrap_or("")),
                json!(s(o.get("reason")).unwrap_or("")),
                json!(object),
                json!(s(o.get("message")).unwrap_or("")),
                json!(s(involved.and_then(|i| i.get("fieldPath"))).unwrap_or("")),
                json!(source),
                json!(first),
                json!(o.get("count").and_then(Value::as_i64).unwrap_or(1)),
                json!(obj.name()),
            ]
        }
        "Pod" => {
            let statuses = status
                .and_then(|x| x.get("containerStatuses"))
                .and_then(Value::as_array);
            let total = spec
                .and_then(|x| x.get("containers"))
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            let ready = statuses.map_or(0, |l| {
                l.iter()
                    .filter(|c| c.get("ready") == Some(&Value::Bool(true)))
                    .count()
            });
            let restarts: i64 =
                statuses.map_or(0, |l| l.iter().map(|c| int(c.get("restartCount"))).sum());
            let phase = s(status.and_then(|x| x.get("reason")))
                .or_else(|| s(status.and_then(|x| x.get("phase"))))
                .unwrap_or("Pending");
            let phase = if o
                .get("metadata")
                .and_then(|m| m.get("deletionTimestamp"))
                .is_some()
            {
                "Terminating"
            } else {
                phase
            };
            vec![
                name,
                json!(format!("{ready}/{total}")),
                json!(phase),
                json!(restarts),
                age,
                json!(or_none(
                    s(status.and_then(|x| x.get("podIP"))).map(str::to_string)
                )),
                json!(or_none(
                    s(spec.and_then(|x| x.get("nodeName"))).map(str::to_string)
                )),
                json!(or_none(
                    s(status.and_then(|x| x.get("nominatedNodeName"))).map(str::to_string)
                )),
                json!("<none>"),
            ]
        }
        "Deployment" | "StatefulSet" | "ReplicaSet" => {
            let desired = spec
                .and_then(|x| x.get("replicas"))
                .and_then(Value::as_i64)
                .unwrap_or(1);
            let ready = int(status.and_then(|x| x.get("readyReplicas")));
            let (containers, images) = containers_images(template_spec);
            let selector = json!(label_selector_string(spec.and_then(|x| x.get("selector"))));
            match kind {
                "Deployment" => vec![
                    name,
                    json!(format!("{ready}/{desired}")),
                    json!(int(status.and_then(|x| x.get("updatedReplicas")))),
                    json!(int(status.and_then(|x| x.get("availableReplicas")))),
                    age,
                    json!(containers),
                    json!(images),
                    selector,
                ],
                "StatefulSet" => vec![
                    name,
                    json!(format!("{ready}/{desired}")),
                    age,
                    json!(containers),
                    json!(images),
                ],
                _ => vec![
                    name,
                    json!(desired),
                    json!(int(status.and_then(|x| x.get("replicas")))),
                    json!(ready),
                    age,
                    json!(containers),
                    json!(images),
                    selector,
                ],
            }
        }
        "DaemonSet" => {
            let (containers, images) = containers_images(template_spec);
            vec![
                name,
                json!(int(status.and_then(|x| x.get("desiredNumberScheduled")))),
                json!(int(status.and_then(|x| x.get("currentNumberScheduled")))),
                json!(int(status.and_then(|x| x.get("numberReady")))),
                json!(int(status.and_then(|x| x.get("updatedNumberScheduled")))),
                json!(int(status.and_then(|x| x.get("numberAvailable")))),
                json!(map_selector_string(
                    template_spec.and_then(|t| t.get("nodeSelector"))
                )),
                age,
                json!(containers),
                json!(images),
                json!(label_selector_string(spec.and_then(|x| x.get("selector")))),
            ]
        }
        "Job" => {
            let conditions = status
                .and_then(|x| x.get("conditions"))
                .and_then(Value::as_array);
            let has = |t: &str| {
                conditions.is_some_and(|c| {
                    c.iter()
                        .any(|x| s(x.get("type")) == Some(t) && s(x.get("status")) == Some("True"))
                })
            };
            let state = if has("Complete") {
                "Complete"
            } else if has("Failed") {
                "Failed"
            } else if spec.and_then(|x| x.get("suspend")) == Some(&Value::Bool(true)) {
                "Suspended"
            } else {
                "Running"
            };
            let completions = spec
                .and_then(|x| x.get("completions"))
                .and_then(Value::as_i64);
            let succeeded = int(status.and_then(|x| x.get("succeeded")));
            let completions = match completions {
                Some(c) => format!("{succeeded}/{c}"),
                None => format!(
                    "{succeeded}/1 of {}",
                    spec.and_then(|x| x.get("parallelism"))
                        .and_then(Value::as_i64)
                        .unwrap_or(1)
                ),
            };
            let start: Option<Time> =
                s(status.and_then(|x| x.get("startTime"))).and_then(|t| t.parse().ok());
            let end: Option<Time> =
                s(status.and_then(|x| x.get("completionTime"))).and_then(|t| t.parse().ok());
            let duration = match (start, end) {
                (Some(a), Some(b)) => human_duration(b.unix_seconds() - a.unix_seconds()),
                (Some(a), None) => human_duration(now.unix_seconds() - a.unix_seconds()),
                _ => String::new(),
            };
            let (containers, images) = containers_images(template_spec);
            vec![
                name,
                json!(state),
                json!(completions),
                json!(duration),
                age,
                json!(containers),
                json!(images),
                json!(label_selector_string(spec.and_then(|x| x.get("selector")))),
            ]
        }
        "CronJob" => {
            let job_template_spec =
                spec.and_then(|x| at(x, &["jobTemplate", "spec", "template", "spec"]));
            let (containers, images) = containers_images(job_template_spec);
            vec![
                name,
                json!(s(spec.and_then(|x| x.get("schedule"))).unwrap_or("")),
                json!(or_none(
                    s(spec.and_then(|x| x.get("timeZone"))).map(str::to_string)
                )),
                json!(
                    spec.and_then(|x| x.get("suspend"))
                        .and_then(Value::as_bool)
                        .unwrap_or(false)
                ),
                json!(
                    status
                        .and_then(|x| x.get("active"))
                        .and_then(Value::as_array)
                        .map_or(0, Vec::len)
                ),
                json!(
                    since_str(status.and_then(|x| x.get("lastScheduleTime")), now)
                        .unwrap_or_else(|| "<none>".into())
                ),
                age,
                json!(containers),
                json!(images),
                json!(label_selector_string(
                    spec.and_then(|x| at(x, &["jobTemplate", "spec", "selector"]))
                )),
            ]
        }
        "Ingress" => {
            let hosts: Vec<&str> = spec
                .and_then(|x| x.get("rules"))
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(|x| s(x.get("host"))).collect())
                .unwrap_or_default();
            let address: Vec<&str> = status
                .and_then(|x| at(x, &["loadBalancer", "ingress"]))
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|i| s(i.get("ip")).or_else(|| s(i.get("hostname"))))
                        .collect()
                })
                .unwrap_or_default();
            let tls = spec
                .and_then(|x| x.get("tls"))
                .and_then(Value::as_array)
                .is_some_and(|t| !t.is_empty());
            vec![
                name,
                json!(or_none(
                    s(spec.and_then(|x| x.get("ingressClassName"))).map(str::to_string)
                )),
                json!(if hosts.is_empty() {
                    "*".to_string()
                } else {
                    hosts.join(",")
                }),
                json!(address.join(",")),
                json!(if tls { "80, 443" } else { "80" }),
                age,
            ]
        }
        "CustomResourceDefinition" => {
            vec![
                name,
                json!(
                    obj.metadata
                        .creation_timestamp
                        .map(|t| t.to_string())
                        .unwrap_or_default()
                ),
            ]
        }
        _ => vec![name, age],
    }
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
        Printer::BuiltIn => builtin_columns(&rt.kind),
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
        Printer::BuiltIn => builtin_cells(&rt.kind, &value, obj, now),
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
    }
}
