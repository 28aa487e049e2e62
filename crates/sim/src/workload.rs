//! What an applied workload asks of the simulated cluster: its kind, its replicas, and what
//! each of its pods requests.

use crate::hash_value;
use crate::spec::LoadProfile;

use crate::data;
use orrery_api::Quantity;
use orrery_api::cluster::GPU_RESOURCE;
use orrery_api::cluster::ResourceList;
use serde_json::Value;

/// Resources as plain integers (milli-cpu, bytes, gpus, pods): the simulation's hot path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Res {
    pub(crate) cpu_m: i64,
    pub(crate) mem: i64,
    pub(crate) gpu: i64,
    pub(crate) pods: i64,
}

impl Res {
    pub(crate) fn add(self, o: Res) -> Res {
        Res {
            cpu_m: self.cpu_m + o.cpu_m,
            mem: self.mem + o.mem,
            gpu: self.gpu + o.gpu,
            pods: self.pods + o.pods,
        }
    }
    pub(crate) fn sub(self, o: Res) -> Res {
        Res {
            cpu_m: self.cpu_m - o.cpu_m,
            mem: self.mem - o.mem,
            gpu: self.gpu - o.gpu,
            pods: self.pods - o.pods,
        }
    }
    pub(crate) fn fits(self, need: Res) -> bool {
        self.cpu_m >= need.cpu_m
            && self.mem >= need.mem
            && self.gpu >= need.gpu
            && self.pods >= need.pods
    }
    pub(crate) fn scale(self, f: f64) -> Res {
        Res {
            cpu_m: (self.cpu_m as f64 * f) as i64,
            mem: (self.mem as f64 * f) as i64,
            gpu: 0,
            pods: 0,
        }
    }
    pub(crate) fn to_list(self, with_pods: bool) -> ResourceList {
        let mut l = ResourceList::new();
        l.insert("cpu".into(), Quantity::from_milli(self.cpu_m.max(0)));
        l.insert(
            "memory".into(),
            Quantity::from_int(self.mem.max(0), orrery_api::Format::BinarySI),
        );
        if self.gpu > 0 {
            l.insert(
                GPU_RESOURCE.into(),
                Quantity::from_int(self.gpu, orrery_api::Format::DecimalSI),
            );
        }
        if with_pods {
            l.insert(
                "pods".into(),
                Quantity::from_int(self.pods.max(0), orrery_api::Format::DecimalSI),
            );
        }
        l
    }
}

pub(crate) fn quantity_at(v: &Value, key: &str) -> Option<Quantity> {
    match v.get(key)? {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.to_string().parse().ok(),
        _ => None,
    }
}

/// The per-pod request of a pod spec: sum of containers, max with any init container.
pub(crate) fn pod_request(pod_spec: &Value) -> Res {
    let of = |c: &Value| -> Res {
        let r = c
            .pointer("/resources/requests")
            .cloned()
            .unwrap_or(Value::Null);
        Res {
            cpu_m: quantity_at(&r, "cpu")
                .map(|q| q.milli_value() as i64)
                .unwrap_or(0),
            mem: quantity_at(&r, "memory")
                .map(|q| q.value() as i64)
                .unwrap_or(0),
            gpu: quantity_at(&r, GPU_RESOURCE)
                .map(|q| q.value() as i64)
                .unwrap_or(0),
            pods: 0,
        }
    };
    let list = |k: &str| -> Vec<Value> {
        pod_spec
            .get(k)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let mut sum = list("containers")
        .iter()
        .map(of)
        .fold(Res::default(), Res::add);
    for init in list("initContainers").iter().map(of) {
        sum.cpu_m = sum.cpu_m.max(init.cpu_m);
        sum.mem = sum.mem.max(init.mem);
        sum.gpu = sum.gpu.max(init.gpu);
    }
    sum.pods = 1;
    sum
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WorkloadKind {
    Replicated,
    DaemonSet,
    Job,
    Pod,
}

#[derive(Debug, Clone)]
pub(crate) struct Shape {
    pub(crate) kind: WorkloadKind,
    pub(crate) replicas: i64,
    pub(crate) completions: i64,
    pub(crate) parallelism: i64,
    pub(crate) request: Res,
    /// Changes when the pod template changes (pods are replaced).
    pub(crate) template: u64,
    /// The persistent volumes its pods own (a StatefulSet's claim templates) or mount.
    pub(crate) claims: Vec<orrery_api::stateful::VolumeClaim>,
    /// Bytes a new volume starts with (`sim.orrery.io/volume-used`; half its capacity by
    /// default).
    pub(crate) volume_used: Option<i64>,
    /// Bytes a second each running pod writes to each of its volumes
    /// (`sim.orrery.io/write-rate`).
    pub(crate) write_rate: f64,
    /// `persistentVolumeClaimRetentionPolicy`: volumes go with the workload, and with the
    /// ordinals a scale-down removes (both kept by default, as in Kubernetes).
    pub(crate) delete_when_deleted: bool,
    pub(crate) delete_when_scaled: bool,
    /// The data sets its pods read (`orrery.io/datasets`): they start once the claim holding
    /// each one's copy is here with its data, as a pod mounting that claim would.
    pub(crate) datasets: Vec<String>,
    /// The demand on its pods over time (`sim.orrery.io/load-profile`...): their usage, as a
    /// metrics server would report it.
    pub(crate) load: Option<LoadProfile>,
    /// Its pods start and never become ready, restarting as a crash loop does
    /// (`sim.orrery.io/never-ready: "true"`): a bad revision.
    pub(crate) never_ready: bool,
    /// Its pods become ready, then crash and start again after running this long
    /// (`sim.orrery.io/restart-every: 2s`): a revision that passes readiness and fails later.
    pub(crate) restart_every: Option<std::time::Duration>,
}

/// Pod template annotation: the bytes a new volume holds.
pub const VOLUME_USED_ANNOTATION: &str = "sim.orrery.io/volume-used";
/// Pod template annotation: bytes a second a running pod writes to each of its volumes.
pub const WRITE_RATE_ANNOTATION: &str = "sim.orrery.io/write-rate";
/// Pod template annotation: `"true"`, its pods never become ready.
pub const NEVER_READY_ANNOTATION: &str = "sim.orrery.io/never-ready";
/// Pod template annotation: a duration; its pods crash after running that long, and start
/// again.
pub const RESTART_EVERY_ANNOTATION: &str = "sim.orrery.io/restart-every";

pub(crate) fn shape_of(obj: &Value) -> Option<Shape> {
    let kind = obj.get("kind")?.as_str()?;
    let spec = obj.get("spec")?;
    let (wk, template) = match kind {
        "Deployment" | "StatefulSet" | "ReplicaSet" => {
            (WorkloadKind::Replicated, spec.get("template")?)
        }
        "DaemonSet" => (WorkloadKind::DaemonSet, spec.get("template")?),
        "Job" => (WorkloadKind::Job, spec.get("template")?),
        "Pod" => (WorkloadKind::Pod, obj.get("spec")?),
        _ => return None,
    };
    let pod_spec = if wk == WorkloadKind::Pod {
        spec
    } else {
        template.get("spec")?
    };
    let int = |k: &str, d: i64| spec.get(k).and_then(Value::as_i64).unwrap_or(d).max(0);
    let annotation = |name: &str| -> Option<Quantity> {
        let a = if wk == WorkloadKind::Pod {
            obj.pointer("/metadata/annotations")
        } else {
            template.pointer("/metadata/annotations")
        };
        a?.get(name)?.as_str()?.parse().ok()
    };
    let retention = |when: &str| {
        spec.pointer(&format!("/persistentVolumeClaimRetentionPolicy/{when}"))
            .and_then(Value::as_str)
            == Some("Delete")
    };
    let load = LoadProfile::of(if wk == WorkloadKind::Pod {
        obj.pointer("/metadata/annotations")
    } else {
        template.pointer("/metadata/annotations")
    });
    let annotations = if wk == WorkloadKind::Pod {
        obj.pointer("/metadata/annotations")
    } else {
        template.pointer("/metadata/annotations")
    };
    let never_ready = annotations
        .and_then(|a| a.get(NEVER_READY_ANNOTATION))
        .and_then(Value::as_str)
        == Some("true");
    let restart_every = annotations
        .and_then(|a| a.get(RESTART_EVERY_ANNOTATION))
        .and_then(Value::as_str)
        .and_then(|d| crate::spec::parse_duration(d).ok())
        .filter(|d| !d.is_zero());
    Some(Shape {
        never_ready,
        restart_every,
        load,
        kind: wk,
        replicas: int("replicas", 1),
        completions: int("completions", 1),
        parallelism: int("parallelism", 1),
        request: pod_request(pod_spec),
        template: hash_value(template),
        claims: orrery_api::stateful::claims_of(obj),
        volume_used: annotation(VOLUME_USED_ANNOTATION).map(|q| q.value() as i64),
        write_rate: annotation(WRITE_RATE_ANNOTATION).map_or(0.0, |q| q.value() as f64),
        delete_when_deleted: retention("whenDeleted"),
        delete_when_scaled: retention("whenScaled"),
        datasets: {
            let a = if wk == WorkloadKind::Pod {
                obj.pointer("/metadata/annotations")
            } else {
                template.pointer("/metadata/annotations")
            };
            a.and_then(|a| a.get(orrery_api::data::DATASETS_ANNOTATION))
                .and_then(Value::as_str)
                .map(|l| {
                    l.split(',')
                        .map(str::trim)
                        .filter(|n| !n.is_empty())
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default()
        },
    })
}

impl Shape {
    /// The volumes a pod of `workload` (at `ordinal`, for a StatefulSet) runs on: namespace
    /// and claim name.
    pub(crate) fn volumes_of(
        &self,
        namespace: &str,
        workload: &str,
        ordinal: Option<i64>,
    ) -> Vec<data::VolumeKey> {
        self.claims
            .iter()
            .filter_map(|c| {
                let name = if c.per_ordinal {
                    orrery_api::stateful::ordinal_volume(&c.name, workload, ordinal?)
                } else {
                    c.name.clone()
                };
                Some((namespace.to_string(), name))
            })
            .collect()
    }
}

pub(crate) fn is_managed(obj: &Value) -> bool {
    obj.pointer("/metadata/labels")
        .and_then(|l| l.get(orrery_api::work::MANAGED_LABEL))
        .and_then(Value::as_str)
        == Some(orrery_api::work::MANAGED_VALUE)
}
