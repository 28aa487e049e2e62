//! What Orrery knows about the built-in workload kinds: how healthy an object is from its own
//! status (the rules Karmada's default interpreter uses).

use serde_json::Value;

use crate::fieldpath::FieldPath;
use crate::meta::Health;
use crate::meta::ResourceList;
use crate::quantity::Quantity;

pub use crate::meta::pod_spec_pointer;

fn int(v: &Value, path: &str) -> i64 {
    v.pointer(path).and_then(Value::as_i64).unwrap_or(0)
}

fn condition<'a>(obj: &'a Value, type_: &str) -> Option<&'a str> {
    obj.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(type_))?
        .get("status")?
        .as_str()
}

/// The generation the status describes has caught up with the spec.
fn observed(obj: &Value) -> bool {
    match obj.pointer("/metadata/generation").and_then(Value::as_i64) {
        Some(g) => int(obj, "/status/observedGeneration") >= g,
        None => true,
    }
}

/// How healthy an object (as its member stores it, status included) is, and why not.
pub fn health(obj: &Value) -> (Health, String) {
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
    let desired = obj
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    let progressing = |why: String| (Health::Progressing, why);
    match kind {
        "Deployment" => {
            if condition(obj, "Progressing") == Some("False") {
                return (
                    Health::Unhealthy,
                    "the rollout exceeded its progress deadline".into(),
                );
            }
            let updated = int(obj, "/status/updatedReplicas");
            let available = int(obj, "/status/availableReplicas");
            if !observed(obj) {
                progressing("the rollout has not been observed yet".into())
            } else if updated < desired || available < desired {
                progressing(format!("{available} of {desired} replicas available"))
            } else {
                (Health::Healthy, String::new())
            }
        }
        "StatefulSet" | "ReplicaSet" => {
            let ready = int(obj, "/status/readyReplicas");
            let updated = if kind == "StatefulSet" {
                obj.pointer("/status/updatedReplicas")
                    .and_then(Value::as_i64)
                    .unwrap_or(ready)
            } else {
                ready
            };
            if !observed(obj) {
                progressing("the change has not been observed yet".into())
            } else if ready < desired || updated < desired {
                progressing(format!("{ready} of {desired} replicas ready"))
            } else {
                (Health::Healthy, String::new())
            }
        }
        "DaemonSet" => {
            let want = int(obj, "/status/desiredNumberScheduled");
            let ready = int(obj, "/status/numberReady");
            let updated = obj
                .pointer("/status/updatedNumberScheduled")
                .and_then(Value::as_i64)
                .unwrap_or(ready);
            if !observed(obj) || ready < want || updated < want {
                progressing(format!("{ready} of {want} daemon pods ready"))
            } else {
                (Health::Healthy, String::new())
            }
        }
        "Job" => {
            if condition(obj, "Failed") == Some("True") {
                (Health::Unhealthy, "the job failed".into())
            } else if condition(obj, "Complete") == Some("True") {
                (Health::Healthy, String::new())
            } else {
                progressing(format!(
                    "{} active, {} succeeded",
                    int(obj, "/status/active"),
                    int(obj, "/status/succeeded")
                ))
            }
        }
        // A CronJob's runs are Jobs of their own, judged as Jobs; the CronJob itself is
        // healthy once its member has it, suspended or not (Karmada judges it the same way).
        "CronJob" => (Health::Healthy, String::new()),
        "Pod" => match obj.pointer("/status/phase").and_then(Value::as_str) {
            Some("Succeeded") => (Health::Healthy, String::new()),
            Some("Running") if condition(obj, "Ready") != Some("False") => {
                (Health::Healthy, String::new())
            }
            Some("Failed") => (Health::Unhealthy, "the pod failed".into()),
            Some(p) => progressing(format!("the pod is {p}")),
            None => progressing("the pod has no phase yet".into()),
        },
        "PersistentVolumeClaim" => match obj.pointer("/status/phase").and_then(Value::as_str) {
            Some("Bound") => (Health::Healthy, String::new()),
            Some("Lost") => (Health::Unhealthy, "the claim lost its volume".into()),
            _ => progressing("the claim is not bound yet".into()),
        },
        "Service" if obj.pointer("/spec/type").and_then(Value::as_str) == Some("LoadBalancer") => {
            let ingress = obj
                .pointer("/status/loadBalancer/ingress")
                .and_then(Value::as_array)
                .is_some_and(|a| !a.is_empty());
            if ingress {
                (Health::Healthy, String::new())
            } else {
                progressing("the load balancer has no address yet".into())
            }
        }
        // Objects without a status to judge are healthy once they exist.
        _ => (Health::Healthy, String::new()),
    }
}

/// Where a built-in kind keeps a replica count that can be divided among clusters.
fn replica_pointer(kind: &str) -> Option<&'static str> {
    match kind {
        "Deployment" | "StatefulSet" | "ReplicaSet" => Some("/spec/replicas"),
        // As Karmada: a Job's parallelism is what is divided.
        "Job" => Some("/spec/parallelism"),
        _ => None,
    }
}

/// Whether a built-in kind's replicas can be divided among clusters.
pub fn has_divisible_replicas(kind: &str) -> bool {
    replica_pointer(kind).is_some()
}

/// Whether a member's status of this kind counts the pods it has (see [`pods_reported`]).
pub fn counts_pods(kind: &str) -> bool {
    matches!(kind, "Deployment" | "StatefulSet" | "ReplicaSet" | "Job")
}

/// The pods a member reports a workload has created (running or waiting for a node; a Job's
/// finished ones included, which take nothing any more), from the workload's status there.
/// `None` for kinds whose status does not say.
pub fn pods_reported(kind: &str, status: &Value) -> Option<i64> {
    let n = |k: &str| status.get(k).and_then(Value::as_i64).unwrap_or(0);
    match kind {
        "Deployment" | "StatefulSet" | "ReplicaSet" => Some(n("replicas")),
        "Job" => Some(n("active") + n("succeeded") + n("failed")),
        _ => None,
    }
}

/// What one replica asks for: the sum of its containers' requests (a limit stands in for a
/// missing request, as Kubernetes defaults it), and at least the largest init container's.
pub fn pod_requests(pod_spec: &Value) -> ResourceList {
    let of = |c: &Value| -> ResourceList {
        let mut out = ResourceList::new();
        for src in ["/resources/limits", "/resources/requests"] {
            if let Some(m) = c.pointer(src).and_then(Value::as_object) {
                for (k, v) in m {
                    let q = match v {
                        Value::String(s) => s.parse::<Quantity>().ok(),
                        Value::Number(n) => n.to_string().parse::<Quantity>().ok(),
                        _ => None,
                    };
                    if let Some(q) = q {
                        out.insert(k.clone(), q);
                    }
                }
            }
        }
        out
    };
    let list = |k: &str| {
        pod_spec
            .get(k)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let mut sum = ResourceList::new();
    for c in list("containers") {
        for (k, q) in of(&c) {
            let total = match sum.get(&k) {
                Some(s) => *s + q,
                None => q,
            };
            sum.insert(k, total);
        }
    }
    for c in list("initContainers") {
        for (k, q) in of(&c) {
            if sum.get(&k).is_none_or(|s| s.nanos() < q.nanos()) {
                sum.insert(k, q);
            }
        }
    }
    sum
}

/// The names of ConfigMaps, Secrets, PersistentVolumeClaims and the ServiceAccount a pod spec
/// refers to, as `(kind, name)`, sorted and without duplicates.
pub fn pod_dependencies(pod_spec: &Value) -> Vec<(&'static str, String)> {
    let mut out = std::collections::BTreeSet::new();
    let mut add = |kind: &'static str, v: Option<&Value>| {
        if let Some(n) = v.and_then(Value::as_str).filter(|n| !n.is_empty()) {
            out.insert((kind, n.to_string()));
        }
    };
    for vol in pod_spec
        .get("volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        add("ConfigMap", vol.pointer("/configMap/name"));
        add("Secret", vol.pointer("/secret/secretName"));
        add(
            "PersistentVolumeClaim",
            vol.pointer("/persistentVolumeClaim/claimName"),
        );
        for src in vol
            .pointer("/projected/sources")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            add("ConfigMap", src.pointer("/configMap/name"));
            add("Secret", src.pointer("/secret/name"));
        }
    }
    for key in ["containers", "initContainers", "ephemeralContainers"] {
        for c in pod_spec
            .get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            for e in c.get("env").and_then(Value::as_array).into_iter().flatten() {
                add("ConfigMap", e.pointer("/valueFrom/configMapKeyRef/name"));
                add("Secret", e.pointer("/valueFrom/secretKeyRef/name"));
            }
            for e in c
                .get("envFrom")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                add("ConfigMap", e.pointer("/configMapRef/name"));
                add("Secret", e.pointer("/secretRef/name"));
            }
        }
    }
    for s in pod_spec
        .get("imagePullSecrets")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        add("Secret", s.get("name"));
    }
    let sa = pod_spec
        .get("serviceAccountName")
        .or_else(|| pod_spec.get("serviceAccount"));
    if sa.and_then(Value::as_str) != Some("default") {
        add("ServiceAccount", sa);
    }
    out.into_iter().collect()
}

/// The API version of every dependency kind (all are core/v1).
pub const DEPENDENCY_API_VERSION: &str = "v1";

/// How a custom kind is interpreted (`ResourceInterpreter`, multicluster.io/v1alpha1):
/// JSONPath-like field paths instead of code.
#[derive(
    Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InterpreterSpec {
    /// The kind interpreted.
    pub target: InterpreterTarget,
    /// Path of the replica count that may be divided among clusters (`.spec.replicas`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub replicas: String,
    /// Path of a pod spec: requests and dependencies are read from it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod_template: String,
    /// Path of a per-replica resource list, when there is no pod spec.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub requests: String,
    /// When an object of the kind is healthy; absent: when it exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<HealthRule>,
    /// Status fields summed over clusters (the rest comes from the first cluster).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub status_sum: Vec<String>,
    /// Fields naming other objects it needs, propagated with it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dependencies: Vec<DependencyRule>,
}

#[derive(
    Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InterpreterTarget {
    /// The kind's API version, e.g. example.com/v1.
    pub api_version: String,
    /// The kind's name.
    pub kind: String,
}

/// Healthy when the number at `readyPath` reaches the replica count, or when the condition
/// of type `condition` is True.
#[derive(
    Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HealthRule {
    /// Path of the number of ready replicas (.status.readyReplicas).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ready_path: String,
    /// Type of a status condition that is True when healthy.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub condition: String,
}

/// A field naming another object the custom resource needs.
#[derive(
    Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DependencyRule {
    /// The kind named: ConfigMap, Secret, ServiceAccount or PersistentVolumeClaim.
    pub kind: String,
    /// Path of the field holding the name (.spec.configName).
    pub name_path: String,
}

/// The kinds a template may depend on, `(kind, plural)`, all in the core group.
pub const DEPENDENCY_KINDS: &[(&str, &str)] = &[
    ("ConfigMap", "configmaps"),
    ("Secret", "secrets"),
    ("ServiceAccount", "serviceaccounts"),
    ("PersistentVolumeClaim", "persistentvolumeclaims"),
];

impl InterpreterSpec {
    /// Validates paths and kinds; errors name the field.
    pub fn validate(&self) -> crate::validation::ErrorList {
        use crate::validation::FieldError;
        let mut errs = Vec::new();
        if self.target.api_version.is_empty() {
            errs.push(FieldError::required("spec.target.apiVersion", ""));
        }
        if self.target.kind.is_empty() {
            errs.push(FieldError::required("spec.target.kind", ""));
        }
        let mut path = |field: &str, p: &str| {
            if !p.is_empty()
                && let Err(e) = FieldPath::parse(p)
            {
                errs.push(FieldError::invalid(field, p, e));
            }
        };
        path("spec.replicas", &self.replicas);
        path("spec.podTemplate", &self.pod_template);
        path("spec.requests", &self.requests);
        if let Some(h) = &self.health {
            path("spec.health.readyPath", &h.ready_path);
        }
        for (i, p) in self.status_sum.iter().enumerate() {
            path(&format!("spec.statusSum[{i}]"), p);
        }
        for (i, d) in self.dependencies.iter().enumerate() {
            path(&format!("spec.dependencies[{i}].namePath"), &d.name_path);
        }
        let kinds: Vec<&str> = DEPENDENCY_KINDS.iter().map(|(k, _)| *k).collect();
        for (i, d) in self.dependencies.iter().enumerate() {
            if !kinds.contains(&d.kind.as_str()) {
                errs.push(FieldError::not_supported(
                    format!("spec.dependencies[{i}].kind"),
                    &d.kind,
                    &kinds,
                ));
            }
        }
        if let Some(h) = &self.health
            && h.ready_path.is_empty() == h.condition.is_empty()
        {
            errs.push(FieldError::invalid(
                "spec.health",
                "",
                "exactly one of readyPath or condition is required",
            ));
        }
        errs
    }
}

fn at<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    FieldPath::parse(path).ok()?.get(obj)
}

/// A kind's customization (Karmada's ResourceInterpreterCustomization), its scripts run by
/// the interpreter crate. Each answer is `None` when the customization has no script for the
/// operation or its script failed (the implementor keeps the failure to report): the
/// interpreter underneath answers then.
pub trait Scripted: std::fmt::Debug + Send + Sync {
    /// `GetReplicas`: the replicas, and what one requests.
    fn replicas(&self, obj: &Value) -> Option<(i64, ResourceList)>;
    /// `ReviseReplica`: the object with `replicas`.
    fn revise(&self, obj: &Value, replicas: i64) -> Option<Value>;
    /// `InterpretHealth` of a member's object.
    fn healthy(&self, observed: &Value) -> Option<bool>;
    /// `ReflectStatus`: the status a member's object reports.
    fn reflect(&self, observed: &Value) -> Option<Value>;
    /// `AggregateStatus`: the template with its members' statuses (Karmada's
    /// `AggregatedStatusItem`s) aggregated.
    fn aggregate(&self, desired: &Value, items: &[Value]) -> Option<Value>;
    /// `GetDependencies`, as `(kind, name)` in the template's namespace.
    fn dependencies(&self, obj: &Value) -> Option<Vec<(String, String)>>;
    /// `GetComponents`: the workload's components (Karmada's `InterpretComponent`).
    fn components(&self, obj: &Value) -> Option<Vec<crate::binding::Component>>;
    /// The `Retain` script and the customization it comes from: the agent runs it in the
    /// member, where the observed object is.
    fn retain_script(&self) -> Option<(String, String)>;
}

/// What Orrery knows about one kind: built-in rules, a ResourceInterpreter's, or a
/// customization's scripts over either.
#[derive(Clone, Copy, Debug)]
pub enum Interpreter<'a> {
    BuiltIn,
    Custom(&'a InterpreterSpec),
    Customized(&'a dyn Scripted, Option<&'a InterpreterSpec>),
}

impl<'a> Interpreter<'a> {
    /// What answers where a customization has no script (or its script failed).
    fn under(&self) -> Interpreter<'a> {
        match *self {
            Interpreter::Customized(_, Some(s)) => Interpreter::Custom(s),
            Interpreter::Customized(_, None) => Interpreter::BuiltIn,
            other => other,
        }
    }

    /// The customization's scripts, if the kind has a customization.
    pub fn scripts(&self) -> Option<&'a dyn Scripted> {
        match *self {
            Interpreter::Customized(s, _) => Some(s),
            _ => None,
        }
    }

    /// The divisible replica count, if the kind has one.
    pub fn replicas(&self, obj: &Value) -> Option<i64> {
        if let Interpreter::Customized(s, _) = self {
            return s
                .replicas(obj)
                .map(|(n, _)| n)
                .or_else(|| self.under().replicas(obj));
        }
        // A customization answered above; what is under it answers here.
        match self.under() {
            Interpreter::BuiltIn | Interpreter::Customized(..) => {
                let kind = obj.get("kind").and_then(Value::as_str)?;
                let p = replica_pointer(kind)?;
                Some(obj.pointer(p).and_then(Value::as_i64).unwrap_or(1))
            }
            Interpreter::Custom(s) if !s.replicas.is_empty() => {
                Some(at(obj, &s.replicas).and_then(Value::as_i64).unwrap_or(1))
            }
            Interpreter::Custom(_) => None,
        }
    }

    /// The workload's components, by its customization's `GetComponents` (none otherwise).
    pub fn components(&self, obj: &Value) -> Vec<crate::binding::Component> {
        self.scripts()
            .and_then(|s| s.components(obj))
            .unwrap_or_default()
    }

    /// The `Retain` script of the template's kind for its Works, if a customization has one.
    pub fn retention(&self, api_version: &str, kind: &str) -> Vec<crate::work::Retention> {
        let Some((customization, lua_script)) = self.scripts().and_then(|s| s.retain_script())
        else {
            return Vec::new();
        };
        vec![crate::work::Retention {
            api_version: api_version.into(),
            kind: kind.into(),
            customization,
            lua_script,
        }]
    }

    /// Sets the replica count of one cluster's copy.
    pub fn set_replicas(&self, obj: &mut Value, n: i64) {
        if let Interpreter::Customized(s, _) = self {
            match s.revise(obj, n) {
                Some(v) => *obj = v,
                None => self.under().set_replicas(obj, n),
            }
            return;
        }
        // A customization answered above; what is under it answers here.
        match self.under() {
            Interpreter::BuiltIn | Interpreter::Customized(..) => {
                let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
                if let Some(p) = replica_pointer(kind) {
                    let field = p.rsplit('/').next().unwrap_or("replicas").to_string();
                    if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
                        spec.insert(field, Value::from(n));
                    }
                }
            }
            Interpreter::Custom(s) => {
                if let Ok(p) = FieldPath::parse(&s.replicas) {
                    let _ = p.set(obj, Value::from(n));
                }
            }
        }
    }

    fn pod_spec<'v>(&self, obj: &'v Value) -> Option<&'v Value> {
        // A customization has no pod spec path: what is under it answers.
        match self.under() {
            Interpreter::BuiltIn | Interpreter::Customized(..) => {
                obj.pointer(pod_spec_pointer(obj.get("kind").and_then(Value::as_str)?)?)
            }
            Interpreter::Custom(s) if !s.pod_template.is_empty() => at(obj, &s.pod_template),
            Interpreter::Custom(_) => None,
        }
    }

    /// What one replica asks for.
    pub fn requests(&self, obj: &Value) -> ResourceList {
        if let Interpreter::Customized(s, _) = self {
            return s
                .replicas(obj)
                .map(|(_, r)| r)
                .unwrap_or_else(|| self.under().requests(obj));
        }
        if let Interpreter::Custom(s) = self
            && !s.requests.is_empty()
        {
            let mut out = ResourceList::new();
            if let Some(m) = at(obj, &s.requests).and_then(Value::as_object) {
                for (k, v) in m {
                    if let Some(q) = v.as_str().and_then(|s| s.parse::<Quantity>().ok()) {
                        out.insert(k.clone(), q);
                    }
                }
            }
            return out;
        }
        self.pod_spec(obj).map(pod_requests).unwrap_or_default()
    }

    /// Objects the template needs in the same namespace, as `(kind, name)`.
    pub fn dependencies(&self, obj: &Value) -> Vec<(String, String)> {
        if let Interpreter::Customized(s, _) = self {
            return match s.dependencies(obj) {
                Some(mut d) => {
                    d.sort();
                    d.dedup();
                    d
                }
                None => self.under().dependencies(obj),
            };
        }
        let mut out: Vec<(String, String)> = self
            .pod_spec(obj)
            .map(pod_dependencies)
            .unwrap_or_default()
            .into_iter()
            .map(|(k, n)| (k.to_string(), n))
            .collect();
        if let Interpreter::Custom(s) = self {
            for d in &s.dependencies {
                if let Some(n) = at(obj, &d.name_path).and_then(Value::as_str) {
                    out.push((d.kind.clone(), n.to_string()));
                }
            }
        }
        out.sort();
        out.dedup();
        out
    }

    /// How healthy an object (as a member reports it) is; custom kinds without a rule take
    /// what the member said.
    pub fn health(&self, obj: &Value, reported: Health) -> Health {
        match self {
            Interpreter::Customized(s, _) => match s.healthy(obj) {
                Some(true) => Health::Healthy,
                Some(false) => Health::Unhealthy,
                None => self.under().health(obj, reported),
            },
            Interpreter::BuiltIn => reported,
            Interpreter::Custom(s) => match &s.health {
                None => reported,
                Some(h) if !h.condition.is_empty() => match condition(obj, &h.condition) {
                    Some("True") => Health::Healthy,
                    Some("False") => Health::Progressing,
                    _ => Health::Unknown,
                },
                Some(h) => {
                    let want = self.replicas(obj).unwrap_or(1);
                    match at(obj, &h.ready_path).and_then(Value::as_i64) {
                        Some(r) if r >= want => Health::Healthy,
                        Some(_) => Health::Progressing,
                        None => Health::Unknown,
                    }
                }
            },
        }
    }

    /// The template's status from its members' statuses, `(cluster, status)` in cluster order.
    /// One cluster: its status exactly. Several: counts summed (workloads), conditions of the
    /// first cluster, the rest as the kind's rules say.
    pub fn aggregate(&self, kind: &str, parts: &[(&str, &Value)]) -> Option<Value> {
        if let Interpreter::Customized(..) = self {
            return self.under().aggregate(kind, parts);
        }
        match parts {
            [] => None,
            [(_, only)] => Some((*only).clone()),
            _ => {
                let sum_fields: Vec<String> = match self {
                    Interpreter::Custom(s) => s.status_sum.clone(),
                    // (A customization's kind was handed to what is under it above.)
                    Interpreter::BuiltIn | Interpreter::Customized(..) => {
                        builtin_sums(kind).iter().map(|f| format!(".{f}")).collect()
                    }
                };
                if sum_fields.is_empty()
                    && matches!(self, Interpreter::BuiltIn)
                    && !is_summable(kind)
                    && kind != "CronJob"
                {
                    return None;
                }
                let mut out = parts[0].1.clone();
                for f in &sum_fields {
                    let Ok(p) = FieldPath::parse(f) else { continue };
                    let total: i64 = parts
                        .iter()
                        .filter_map(|(_, s)| p.get(s).and_then(Value::as_i64))
                        .sum();
                    let _ = p.set(&mut out, Value::from(total));
                }
                if let Some(m) = out.as_object_mut() {
                    // Generations of members mean nothing in the control plane.
                    m.remove("observedGeneration");
                    if kind == "Job" {
                        job_times(m, parts);
                    }
                    if kind == "CronJob" && matches!(self, Interpreter::BuiltIn) {
                        cron_job_status(m, parts);
                    }
                }
                Some(out)
            }
        }
    }
}

fn is_summable(kind: &str) -> bool {
    !builtin_sums(kind).is_empty()
}

/// Status counters of the built-in kinds that add up across clusters.
fn builtin_sums(kind: &str) -> &'static [&'static str] {
    match kind {
        "Deployment" => &[
            "replicas",
            "readyReplicas",
            "availableReplicas",
            "updatedReplicas",
            "unavailableReplicas",
        ],
        "StatefulSet" => &[
            "replicas",
            "readyReplicas",
            "currentReplicas",
            "updatedReplicas",
            "availableReplicas",
        ],
        "ReplicaSet" => &[
            "replicas",
            "readyReplicas",
            "availableReplicas",
            "fullyLabeledReplicas",
        ],
        "DaemonSet" => &[
            "currentNumberScheduled",
            "desiredNumberScheduled",
            "numberAvailable",
            "numberMisscheduled",
            "numberReady",
            "updatedNumberScheduled",
            "numberUnavailable",
        ],
        "Job" => &["active", "succeeded", "failed", "ready"],
        _ => &[],
    }
}

/// The status of a long-running workload that runs in no cluster (no policy places it, or it
/// is placed nowhere): its pod counts at 0 (`unavailableReplicas` its desired replicas), its
/// generation observed, and an `Available=False` condition saying why. `None` for kinds
/// whose status is not counts of running pods (a Job's history, a ConfigMap's nothing).
pub fn unplaced_status(t: &crate::Object, reason: &str, message: &str) -> Option<Value> {
    let sums = builtin_sums(&t.kind);
    if sums.is_empty() || t.kind == "Job" {
        return None;
    }
    let mut m = serde_json::Map::new();
    for f in sums {
        m.insert((*f).to_string(), Value::from(0));
    }
    let desired = t
        .spec
        .as_ref()
        .and_then(|s| s.get("replicas"))
        .and_then(Value::as_i64)
        .unwrap_or(1);
    if m.contains_key("unavailableReplicas") {
        m.insert("unavailableReplicas".into(), Value::from(desired));
    }
    if let Some(g) = t.metadata.generation {
        m.insert("observedGeneration".into(), Value::from(g));
    }
    // The condition's time is kept while the reason stays, so the same status is written once.
    let since = t
        .status
        .as_ref()
        .and_then(|s| s.get("conditions"))
        .and_then(Value::as_array)
        .and_then(|cs| {
            cs.iter()
                .find(|c| c["type"] == "Available" && c["reason"] == reason)
        })
        .and_then(|c| c.get("lastTransitionTime").cloned())
        .unwrap_or_else(|| Value::from(crate::Time::now().to_string()));
    m.insert(
        "conditions".into(),
        serde_json::json!([{"type": "Available", "status": "False", "reason": reason,
            "message": message, "lastTransitionTime": since, "lastUpdateTime": since}]),
    );
    Some(Value::Object(m))
}

/// Whether `t`'s status still tells of pods running, where [`unplaced_status`] would say none
/// run for `reason`.
pub fn shows_running(t: &crate::Object, reason: &str) -> bool {
    let Some(want) = unplaced_status(t, reason, "") else {
        return false;
    };
    // A template that never ran anywhere has no status to correct.
    let Some(st) = t
        .status
        .as_ref()
        .filter(|s| s.as_object().is_some_and(|m| !m.is_empty()))
    else {
        return false;
    };
    let counts_differ = builtin_sums(&t.kind).iter().any(|f| {
        st.get(*f).and_then(Value::as_i64).unwrap_or(0)
            != want.get(*f).and_then(Value::as_i64).unwrap_or(0)
    });
    let said = st
        .get("conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Available" && c["reason"] == reason)
        });
    counts_differ || !said
}

/// A Job over several clusters started when the first started, and completed when the last
/// completed (only if all did).
fn job_times(m: &mut serde_json::Map<String, Value>, parts: &[(&str, &Value)]) {
    let times = |f: &str| -> Vec<Option<String>> {
        parts
            .iter()
            .map(|(_, s)| s.get(f).and_then(Value::as_str).map(str::to_string))
            .collect()
    };
    if let Some(first) = times("startTime").into_iter().flatten().min() {
        m.insert("startTime".into(), Value::from(first));
    }
    let done = times("completionTime");
    if done.iter().all(Option::is_some) {
        if let Some(last) = done.into_iter().flatten().max() {
            m.insert("completionTime".into(), Value::from(last));
        }
    } else {
        m.remove("completionTime");
        if let Some(Value::Array(conds)) = m.get_mut("conditions") {
            conds.retain(|c| c.get("type").and_then(Value::as_str) != Some("Complete"));
        }
    }
}

/// A CronJob over several clusters: the Jobs running in any of them, and its latest
/// scheduled and successful times across them.
fn cron_job_status(m: &mut serde_json::Map<String, Value>, parts: &[(&str, &Value)]) {
    let active: Vec<Value> = parts
        .iter()
        .filter_map(|(_, s)| s.get("active").and_then(Value::as_array))
        .flatten()
        .cloned()
        .collect();
    if active.is_empty() {
        m.remove("active");
    } else {
        m.insert("active".into(), Value::Array(active));
    }
    for f in ["lastScheduleTime", "lastSuccessfulTime"] {
        // RFC 3339 times in UTC, as the API writes them, order as text.
        match parts
            .iter()
            .filter_map(|(_, s)| s.get(f).and_then(Value::as_str))
            .max()
        {
            Some(t) => m.insert(f.into(), Value::from(t)),
            None => m.remove(f),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_workload_placed_nowhere_says_nothing_runs() {
        let mut d: crate::Object = serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "api", "generation": 3},
            "spec": {"replicas": 6},
            "status": {"replicas": 6, "readyReplicas": 6, "availableReplicas": 6, "updatedReplicas": 6},
        }))
        .unwrap();
        assert!(shows_running(&d, "NoPlacementPolicy"));
        let st = unplaced_status(&d, "NoPlacementPolicy", "no policy").unwrap();
        assert_eq!(st["readyReplicas"], 0);
        assert_eq!(st["availableReplicas"], 0);
        assert_eq!(st["unavailableReplicas"], 6);
        assert_eq!(st["observedGeneration"], 3);
        assert_eq!(st["conditions"][0]["reason"], "NoPlacementPolicy");
        d.status = Some(st.clone());
        // Written once: as it is now, nothing more to say (the same time kept).
        assert!(!shows_running(&d, "NoPlacementPolicy"));
        assert_eq!(
            unplaced_status(&d, "NoPlacementPolicy", "no policy"),
            Some(st)
        );
        // Another reason is said anew.
        assert!(shows_running(&d, "NotScheduled"));
        // Never-run templates and kinds without pod counts are left alone.
        d.status = None;
        assert!(!shows_running(&d, "NoPlacementPolicy"));
        d.kind = "Job".into();
        assert!(unplaced_status(&d, "NoPlacementPolicy", "").is_none());
    }

    #[test]
    fn requests_dependencies_and_replicas() {
        let d = json!({"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"replicas": 5, "template": {"spec": {
            "serviceAccountName": "runner",
            "imagePullSecrets": [{"name": "pull"}],
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "250m", "memory": "64Mi"}},
                 "envFrom": [{"configMapRef": {"name": "env"}}],
                 "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "k"}}}]},
                {"name": "b", "resources": {"limits": {"cpu": "1", "nvidia.com/gpu": "1"}}}
            ],
            "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "2", "memory": "16Mi"}}}],
            "volumes": [{"name": "c", "configMap": {"name": "web-config"}},
                        {"name": "d", "persistentVolumeClaim": {"claimName": "data"}},
                        {"name": "p", "projected": {"sources": [{"secret": {"name": "tls"}}]}}]
        }}}});
        let i = Interpreter::BuiltIn;
        assert_eq!(i.replicas(&d), Some(5));
        let r = i.requests(&d);
        assert_eq!(
            r["cpu"].milli_value(),
            2000,
            "the init container's 2 cores beat 1.25"
        );
        assert_eq!(r["memory"].value(), 64 * 1024 * 1024);
        assert_eq!(r["nvidia.com/gpu"].value(), 1);
        let deps = i.dependencies(&d);
        let want: Vec<(String, String)> = [
            ("ConfigMap", "env"),
            ("ConfigMap", "web-config"),
            ("PersistentVolumeClaim", "data"),
            ("Secret", "creds"),
            ("Secret", "pull"),
            ("Secret", "tls"),
            ("ServiceAccount", "runner"),
        ]
        .iter()
        .map(|(k, n)| (k.to_string(), n.to_string()))
        .collect();
        assert_eq!(deps, want);
        let mut copy = d.clone();
        i.set_replicas(&mut copy, 2);
        assert_eq!(copy["spec"]["replicas"], 2);
        let job = json!({"kind": "Job", "spec": {"parallelism": 4}});
        assert_eq!(i.replicas(&job), Some(4));
        assert_eq!(i.replicas(&json!({"kind": "DaemonSet", "spec": {}})), None);
        assert_eq!(
            i.replicas(&json!({"kind": "Deployment", "spec": {}})),
            Some(1)
        );
    }

    #[test]
    fn status_is_summed_or_copied() {
        let i = Interpreter::BuiltIn;
        let a = json!({"replicas": 2, "readyReplicas": 2, "observedGeneration": 7, "conditions": [{"type": "Available"}]});
        let b = json!({"replicas": 3, "readyReplicas": 1, "observedGeneration": 2});
        let sum = i.aggregate("Deployment", &[("a", &a), ("b", &b)]).unwrap();
        assert_eq!(sum["replicas"], 5);
        assert_eq!(sum["readyReplicas"], 3);
        assert!(sum.get("observedGeneration").is_none());
        assert_eq!(
            i.aggregate("Deployment", &[("a", &a)]).unwrap(),
            a,
            "a singleton is copied exactly"
        );
        assert!(i.aggregate("ConfigMap", &[("a", &a), ("b", &b)]).is_none());
        let j1 = json!({"succeeded": 1, "startTime": "2026-01-01T00:00:05Z", "completionTime": "2026-01-01T00:01:00Z",
            "conditions": [{"type": "Complete", "status": "True"}]});
        let j2 = json!({"active": 1, "startTime": "2026-01-01T00:00:01Z"});
        let s = i.aggregate("Job", &[("a", &j1), ("b", &j2)]).unwrap();
        assert_eq!(s["startTime"], "2026-01-01T00:00:01Z");
        assert!(
            s.get("completionTime").is_none() && s["conditions"].as_array().unwrap().is_empty(),
            "{s}"
        );
        assert_eq!(s["active"], 1);
        let c1 = json!({"active": [{"kind": "Job", "namespace": "ns", "name": "backup-1"}],
            "lastScheduleTime": "2026-01-01T01:00:00Z", "lastSuccessfulTime": "2026-01-01T00:00:40Z"});
        let c2 = json!({"active": [{"kind": "Job", "namespace": "ns", "name": "backup-2"}],
            "lastScheduleTime": "2026-01-01T02:00:00Z"});
        let c3 = json!({});
        let s = i
            .aggregate("CronJob", &[("a", &c1), ("b", &c2), ("c", &c3)])
            .unwrap();
        assert_eq!(
            s["active"],
            json!([{"kind": "Job", "namespace": "ns", "name": "backup-1"},
                   {"kind": "Job", "namespace": "ns", "name": "backup-2"}])
        );
        assert_eq!(s["lastScheduleTime"], "2026-01-01T02:00:00Z");
        assert_eq!(s["lastSuccessfulTime"], "2026-01-01T00:00:40Z");
        let idle = i.aggregate("CronJob", &[("b", &c3), ("a", &c3)]).unwrap();
        assert_eq!(idle, json!({}), "nothing running anywhere: no active list");
    }

    #[test]
    fn custom_interpreters() {
        let spec: InterpreterSpec = serde_json::from_value(json!({
            "target": {"apiVersion": "example.com/v1", "kind": "Database"},
            "replicas": ".spec.size", "requests": ".spec.resources",
            "health": {"readyPath": ".status.ready"}, "statusSum": [".status.ready"],
            "dependencies": [{"kind": "Secret", "namePath": ".spec.credentials"}]
        }))
        .unwrap();
        assert!(spec.validate().is_empty());
        let i = Interpreter::Custom(&spec);
        let db = json!({"kind": "Database", "spec": {"size": 3, "resources": {"cpu": "1"}, "credentials": "db-pw"}, "status": {"ready": 3}});
        assert_eq!(i.replicas(&db), Some(3));
        assert_eq!(i.requests(&db)["cpu"].milli_value(), 1000);
        assert_eq!(
            i.dependencies(&db),
            vec![("Secret".to_string(), "db-pw".to_string())]
        );
        assert_eq!(i.health(&db, Health::Unknown), Health::Healthy);
        let mut two = db.clone();
        i.set_replicas(&mut two, 2);
        assert_eq!(two["spec"]["size"], 2);
        assert_eq!(i.health(&db.clone(), Health::Unknown), Health::Healthy);
        let s = i
            .aggregate(
                "Database",
                &[
                    ("a", &json!({"status": {"ready": 1}})),
                    ("b", &json!({"status": {"ready": 2}})),
                ],
            )
            .unwrap();
        assert_eq!(s["status"]["ready"], 3);
        let bad: InterpreterSpec =
            serde_json::from_value(json!({"target": {"apiVersion": "", "kind": "X"},
            "replicas": "spec..size", "dependencies": [{"kind": "Pod", "namePath": ".a"}]}))
            .unwrap();
        let fields: Vec<String> = bad.validate().into_iter().map(|e| e.field).collect();
        assert_eq!(
            fields,
            [
                "spec.target.apiVersion",
                "spec.replicas",
                "spec.dependencies[0].kind"
            ]
        );
    }

    #[test]
    fn health_by_kind() {
        let cases = [
            (
                json!({"kind": "Deployment", "metadata": {"generation": 2}, "spec": {"replicas": 3},
                    "status": {"observedGeneration": 2, "updatedReplicas": 3, "availableReplicas": 3}}),
                Health::Healthy,
            ),
            (
                json!({"kind": "Deployment", "metadata": {"generation": 3}, "spec": {"replicas": 3},
                    "status": {"observedGeneration": 2, "updatedReplicas": 3, "availableReplicas": 3}}),
                Health::Progressing,
            ),
            (
                json!({"kind": "Deployment", "spec": {"replicas": 3}, "status": {"updatedReplicas": 3, "availableReplicas": 1}}),
                Health::Progressing,
            ),
            (
                json!({"kind": "Deployment", "spec": {"replicas": 1}, "status": {"conditions": [{"type": "Progressing", "status": "False"}]}}),
                Health::Unhealthy,
            ),
            (
                json!({"kind": "Deployment", "spec": {"replicas": 0}, "status": {}}),
                Health::Healthy,
            ),
            (
                json!({"kind": "StatefulSet", "spec": {"replicas": 2}, "status": {"readyReplicas": 2, "updatedReplicas": 2}}),
                Health::Healthy,
            ),
            (
                json!({"kind": "StatefulSet", "spec": {"replicas": 2}, "status": {"readyReplicas": 2, "updatedReplicas": 1}}),
                Health::Progressing,
            ),
            (
                json!({"kind": "ReplicaSet", "spec": {"replicas": 2}, "status": {"readyReplicas": 1}}),
                Health::Progressing,
            ),
            (
                json!({"kind": "DaemonSet", "status": {"desiredNumberScheduled": 4, "numberReady": 4}}),
                Health::Healthy,
            ),
            (
                json!({"kind": "DaemonSet", "status": {"desiredNumberScheduled": 4, "numberReady": 3}}),
                Health::Progressing,
            ),
            (
                json!({"kind": "Job", "status": {"conditions": [{"type": "Complete", "status": "True"}]}}),
                Health::Healthy,
            ),
            (
                json!({"kind": "Job", "status": {"conditions": [{"type": "Failed", "status": "True"}]}}),
                Health::Unhealthy,
            ),
            (
                json!({"kind": "Job", "status": {"active": 1}}),
                Health::Progressing,
            ),
            (
                json!({"kind": "CronJob", "spec": {"suspend": true}, "status": {}}),
                Health::Healthy,
            ),
            (
                json!({"kind": "Pod", "status": {"phase": "Running"}}),
                Health::Healthy,
            ),
            (
                json!({"kind": "Pod", "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]}}),
                Health::Progressing,
            ),
            (
                json!({"kind": "Pod", "status": {"phase": "Failed"}}),
                Health::Unhealthy,
            ),
            (
                json!({"kind": "PersistentVolumeClaim", "status": {"phase": "Pending"}}),
                Health::Progressing,
            ),
            (
                json!({"kind": "Service", "spec": {"type": "LoadBalancer"}, "status": {}}),
                Health::Progressing,
            ),
            (
                json!({"kind": "Service", "spec": {"type": "ClusterIP"}}),
                Health::Healthy,
            ),
            (json!({"kind": "ConfigMap"}), Health::Healthy),
        ];
        for (obj, want) in cases {
            assert_eq!(health(&obj).0, want, "{obj}");
        }
        assert_eq!(health(&json!({"kind": "ReplicaSet", "spec": {"replicas": 2}, "status": {"readyReplicas": 1}})).1, "1 of 2 replicas ready");
    }
}
