//! Kind-specific rules applied on create and update ("strategies" in the Kubernetes API server):
//! defaults, values the server owns, and validation beyond what the schema says.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use orrery_api::Object;
use orrery_api::customization::{CustomizationSpec, Operation};
use orrery_api::labels::{LabelSelector, Selector};
use orrery_api::validation::{ErrorList, FieldError};
use serde_json::{Value, json};

use crate::resources::{Origin, ResourceType};

/// Finalizer that keeps a namespace until its contents are gone.
pub const NAMESPACE_FINALIZER: &str = "kubernetes";
/// Finalizer that keeps a CRD until its custom resources are gone.
pub const CRD_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

fn spec_mut(obj: &mut Object) -> &mut serde_json::Map<String, Value> {
    if !matches!(obj.spec, Some(Value::Object(_))) {
        obj.spec = Some(json!({}));
    }
    // Invariant: spec was made an object just above.
    #[allow(clippy::expect_used)]
    obj.spec
        .as_mut()
        .and_then(Value::as_object_mut)
        .expect("spec is an object")
}

/// Defaults and server-owned fields for a new object.
/// Kinds kube-apiserver gives no `metadata.generation`: nothing in them is a spec that a
/// controller observes (clients such as kopf tell changes apart by it).
pub fn without_generation(group: &str, kind: &str) -> bool {
    matches!(
        (group, kind),
        (
            "",
            "ConfigMap"
                | "Secret"
                | "Event"
                | "Namespace"
                | "ServiceAccount"
                | "Endpoints"
                | "Service"
                | "PersistentVolumeClaim"
        ) | ("events.k8s.io", "Event")
            | ("coordination.k8s.io", "Lease")
            | ("discovery.k8s.io", "EndpointSlice")
    )
}

pub fn prepare_create(rt: &ResourceType, obj: &mut Object) {
    apply_defaults(rt, obj);
    if let Some(f) = own(rt).and_then(|d| d.finalizer)
        && !obj.metadata.finalizers.iter().any(|x| x == f)
    {
        obj.metadata.finalizers.push(f.to_string());
    }
    if without_generation(&rt.group, &rt.kind) {
        obj.metadata.generation = None;
    }
    match (rt.group.as_str(), rt.kind.as_str()) {
        ("", "Namespace") => {
            let spec = spec_mut(obj);
            let finalizers = spec.entry("finalizers").or_insert_with(|| json!([]));
            if let Value::Array(f) = finalizers
                && !f.iter().any(|x| x == NAMESPACE_FINALIZER)
            {
                f.push(json!(NAMESPACE_FINALIZER));
            }
            obj.status = Some(json!({ "phase": "Active" }));
        }
        ("", "Secret") => fold_string_data(obj),
        ("apiextensions.k8s.io", "CustomResourceDefinition")
            if !obj.metadata.finalizers.iter().any(|f| f == CRD_FINALIZER) =>
        {
            obj.metadata.finalizers.push(CRD_FINALIZER.to_string());
        }
        _ => {}
    }
}

/// Server-owned parts of a status write (a Cluster's water levels and heartbeat, for one),
/// as the kind's descriptor says.
pub fn prepare_status(
    rt: &ResourceType,
    old_status: Option<&Value>,
    new_status: &mut Option<Value>,
) {
    if let Some(f) = own(rt).and_then(|d| d.on_status) {
        f(old_status, new_status);
    }
}

/// The descriptor of an own kind.
fn own(rt: &ResourceType) -> Option<&'static orrery_api::kinds::Descriptor> {
    (rt.origin == Origin::Own)
        .then(|| orrery_api::kinds::own(&rt.group, &rt.kind))
        .flatten()
}

fn set_default(m: &mut serde_json::Map<String, Value>, key: &str, value: Value) {
    if m.get(key).is_none_or(Value::is_null) {
        m.insert(key.to_string(), value);
    }
}

/// Defaults of a container (Kubernetes' `SetDefaults_Container` and its ports').
fn default_container(c: &mut Value) {
    let Some(c) = c.as_object_mut() else { return };
    let image = c
        .get("image")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let tag = image
        .rsplit('/')
        .next()
        .and_then(|last| last.split_once(':'))
        .map(|(_, t)| t.to_string());
    let latest = !image.contains('@') && tag.as_deref().is_none_or(|t| t == "latest");
    set_default(
        c,
        "imagePullPolicy",
        json!(if latest { "Always" } else { "IfNotPresent" }),
    );
    set_default(c, "terminationMessagePath", json!("/dev/termination-log"));
    set_default(c, "terminationMessagePolicy", json!("File"));
    if let Some(Value::Array(ports)) = c.get_mut("ports") {
        for p in ports.iter_mut().filter_map(Value::as_object_mut) {
            set_default(p, "protocol", json!("TCP"));
        }
    }
}

/// Defaults of a pod spec (`SetDefaults_PodSpec`).
fn default_pod_spec(spec: &mut Value, restart_policy: bool) {
    let Some(s) = spec.as_object_mut() else {
        return;
    };
    for list in ["containers", "initContainers"] {
        if let Some(Value::Array(cs)) = s.get_mut(list) {
            cs.iter_mut().for_each(default_container);
        }
    }
    if restart_policy {
        set_default(s, "restartPolicy", json!("Always"));
    }
    set_default(s, "dnsPolicy", json!("ClusterFirst"));
    set_default(s, "schedulerName", json!("default-scheduler"));
    set_default(s, "terminationGracePeriodSeconds", json!(30));
    set_default(s, "securityContext", json!({}));
}

fn template_spec(spec: &mut serde_json::Map<String, Value>) -> Option<&mut Value> {
    spec.get_mut("template").and_then(|t| t.get_mut("spec"))
}

/// The defaults Kubernetes applies to the kinds served here, on every write.
pub fn apply_defaults(rt: &ResourceType, obj: &mut Object) {
    if rt.origin != crate::resources::Origin::BuiltIn {
        return;
    }
    match (rt.group.as_str(), rt.kind.as_str()) {
        ("", "Pod") => {
            if let Some(spec) = obj.spec.as_mut() {
                default_pod_spec(spec, true);
            }
        }
        (crate::rbac::GROUP, "RoleBinding" | "ClusterRoleBinding") => {
            // A subject's apiGroup: "" for a ServiceAccount, RBAC's for users and groups.
            if let Some(Value::Array(subjects)) = obj.other.get_mut("subjects") {
                for s in subjects.iter_mut().filter_map(Value::as_object_mut) {
                    let group = match s.get("kind").and_then(Value::as_str) {
                        Some("ServiceAccount") => "",
                        Some("User" | "Group") => crate::rbac::GROUP,
                        _ => continue,
                    };
                    if s.get("apiGroup")
                        .and_then(Value::as_str)
                        .is_none_or(str::is_empty)
                    {
                        s.insert("apiGroup".into(), json!(group));
                    }
                }
            }
        }
        // As Kubernetes: a PriorityClass preempts lower priorities unless it says Never.
        ("scheduling.k8s.io", "PriorityClass")
            if obj
                .other
                .get("preemptionPolicy")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty) =>
        {
            obj.other
                .insert("preemptionPolicy".into(), json!(PREEMPTION_POLICIES[0]));
        }
        // As Kubernetes: a Secret without a type is Opaque (`--field-selector type=Opaque`
        // finds it).
        ("", "Secret")
            if obj
                .other
                .get("type")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty) =>
        {
            obj.other.insert("type".into(), json!(SECRET_DEFAULT_TYPE));
        }
        ("", "Service") => {
            let spec = spec_mut(obj);
            set_default(spec, "type", json!("ClusterIP"));
            set_default(spec, "sessionAffinity", json!("None"));
            set_default(spec, "internalTrafficPolicy", json!("Cluster"));
            if let Some(Value::Array(ports)) = spec.get_mut("ports") {
                for p in ports.iter_mut().filter_map(Value::as_object_mut) {
                    set_default(p, "protocol", json!("TCP"));
                    if let Some(port) = p.get("port").cloned() {
                        set_default(p, "targetPort", port);
                    }
                }
            }
        }
        ("apps", "Deployment") => {
            let spec = spec_mut(obj);
            set_default(spec, "replicas", json!(1));
            set_default(
                spec,
                "strategy",
                json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}),
            );
            set_default(spec, "revisionHistoryLimit", json!(10));
            set_default(spec, "progressDeadlineSeconds", json!(600));
            if let Some(t) = template_spec(spec) {
                default_pod_spec(t, true);
            }
        }
        ("apps", "ReplicaSet") => {
            let spec = spec_mut(obj);
            set_default(spec, "replicas", json!(1));
            if let Some(t) = template_spec(spec) {
                default_pod_spec(t, true);
            }
        }
        ("apps", "StatefulSet") => {
            let spec = spec_mut(obj);
            set_default(spec, "replicas", json!(1));
            set_default(spec, "podManagementPolicy", json!("OrderedReady"));
            set_default(
                spec,
                "updateStrategy",
                json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}),
            );
            set_default(spec, "revisionHistoryLimit", json!(10));
            if let Some(t) = template_spec(spec) {
                default_pod_spec(t, true);
            }
        }
        ("apps", "DaemonSet") => {
            let spec = spec_mut(obj);
            set_default(
                spec,
                "updateStrategy",
                json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}),
            );
            set_default(spec, "revisionHistoryLimit", json!(10));
            if let Some(t) = template_spec(spec) {
                default_pod_spec(t, true);
            }
        }
        ("batch", "Job") => {
            let spec = spec_mut(obj);
            set_default(spec, "backoffLimit", json!(6));
            set_default(spec, "completionMode", json!("NonIndexed"));
            set_default(spec, "suspend", json!(false));
            if spec.get("completions").is_none_or(Value::is_null)
                && spec.get("parallelism").is_none_or(Value::is_null)
            {
                spec.insert("completions".into(), json!(1));
                spec.insert("parallelism".into(), json!(1));
            }
            set_default(spec, "parallelism", json!(1));
            if let Some(t) = template_spec(spec) {
                default_pod_spec(t, false);
            }
        }
        ("batch", "CronJob") => {
            let spec = spec_mut(obj);
            set_default(spec, "concurrencyPolicy", json!("Allow"));
            set_default(spec, "suspend", json!(false));
            set_default(spec, "successfulJobsHistoryLimit", json!(3));
            set_default(spec, "failedJobsHistoryLimit", json!(1));
            if let Some(t) = spec
                .get_mut("jobTemplate")
                .and_then(|j| j.get_mut("spec"))
                .and_then(|s| s.get_mut("template"))
                .and_then(|t| t.get_mut("spec"))
            {
                default_pod_spec(t, false);
            }
        }
        _ => {}
    }
}

/// Carries server-owned values from the stored object into an update.
pub fn prepare_update(rt: &ResourceType, old: &Object, new: &mut Object) {
    apply_defaults(rt, new);
    if without_generation(&rt.group, &rt.kind) {
        new.metadata.generation = None;
    }
    match (rt.group.as_str(), rt.kind.as_str()) {
        ("", "Namespace") => {
            // spec.finalizers change only through the finalize subresource.
            let finalizers = old
                .spec
                .as_ref()
                .and_then(|s| s.get("finalizers"))
                .cloned()
                .unwrap_or(json!([]));
            spec_mut(new).insert("finalizers".into(), finalizers);
        }
        ("", "Secret") => fold_string_data(new),
        _ => {}
    }
}

/// `stringData` is write-only: it is merged into `data` (base64) when stored.
fn fold_string_data(obj: &mut Object) {
    let Some(Value::Object(string_data)) = obj.other.remove("stringData") else {
        return;
    };
    let data = obj.other.entry("data").or_insert_with(|| json!({}));
    if let Value::Object(d) = data {
        for (k, v) in string_data {
            if let Value::String(s) = v {
                d.insert(k, json!(STANDARD.encode(s.as_bytes())));
            }
        }
    }
}

fn config_key_ok(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 253
        && k != "."
        && k != ".."
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

/// The type of a Secret that names none.
const SECRET_DEFAULT_TYPE: &str = "Opaque";

/// Validation beyond the schema, for a new or updated object.
pub fn validate(rt: &ResourceType, obj: &Object, old: Option<&Object>) -> ErrorList {
    let mut errs = ErrorList::new();
    let spec = obj.spec.as_ref();
    validate_data_annotations(rt, obj, &mut errs);
    if let Some(d) = own(rt) {
        errs.extend(d.check(obj, old));
    }
    match (rt.group.as_str(), rt.kind.as_str()) {
        ("apps", "Deployment" | "ReplicaSet" | "StatefulSet" | "DaemonSet") => {
            validate_workload(spec, old, &mut errs)
        }
        ("batch", "Job") => validate_job(spec, &mut errs),
        (crate::rbac::GROUP, "Role" | "ClusterRole") => validate_rules(obj, &mut errs),
        (crate::rbac::GROUP, "RoleBinding" | "ClusterRoleBinding") => {
            validate_binding(obj, old, &mut errs)
        }
        ("config.karmada.io", "ResourceInterpreterCustomization") => {
            validate_customization_scripts(obj, &mut errs)
        }
        ("scheduling.k8s.io", "PriorityClass") => validate_priority_class(obj, old, &mut errs),
        ("", "ConfigMap" | "Secret") => {
            validate_config_data(obj, &mut errs);
            validate_config_immutable(obj, old, &mut errs);
            if rt.kind == "Secret" {
                validate_secret_type(obj, old, &mut errs);
            }
        }
        _ => {}
    }
    errs
}

/// Each script of a ResourceInterpreterCustomization compiles (as Karmada's admission checks
/// them): a script that cannot run is refused when it is written, not when it is needed.
fn validate_customization_scripts(obj: &Object, errs: &mut ErrorList) {
    let Some(spec) = obj
        .spec
        .as_ref()
        .and_then(|s| serde_json::from_value::<CustomizationSpec>(s.clone()).ok())
    else {
        return;
    };
    let vm = orrery_interpreter::Vm::default();
    for op in Operation::ALL {
        if let Some(script) = spec.customizations.script(op)
            && let Err(e) = vm.check(script)
        {
            errs.push(FieldError::invalid(
                format!("spec.customizations.{}.luaScript", op.field()),
                "",
                format!("InterpreterOperation({}) Lua script error: {e}", op.name()),
            ));
        }
    }
}

/// What a built-in workload says of its data and work (data-aware scheduling), checked here
/// so a bad annotation is an error to its author, not a silent default.
fn validate_data_annotations(rt: &ResourceType, obj: &Object, errs: &mut ErrorList) {
    if rt.origin == Origin::BuiltIn
        && let Some((_, path)) = orrery_api::data::template_annotations(&rt.kind)
        && let Err(e) =
            orrery_api::data::of_parts(&rt.kind, &obj.metadata.annotations, obj.spec.as_ref())
    {
        errs.push(FieldError::invalid(path, "", e));
    }
}

/// A Deployment's, ReplicaSet's, StatefulSet's or DaemonSet's replicas (not negative) and
/// selector (valid, selecting its template, immutable once set).
fn validate_workload(spec: Option<&Value>, old: Option<&Object>, errs: &mut ErrorList) {
    if let Some(r) = spec.and_then(|s| s.get("replicas")).and_then(Value::as_i64)
        && r < 0
    {
        errs.push(FieldError::invalid(
            "spec.replicas",
            r,
            "must be greater than or equal to 0",
        ));
    }
    check_selector(
        spec,
        "spec.selector",
        "spec.template.metadata.labels",
        &["template", "metadata", "labels"],
        errs,
    );
    if let Some(old) = old {
        let before = old.spec.as_ref().and_then(|s| s.get("selector"));
        let after = spec.and_then(|s| s.get("selector"));
        if before.is_some() && before != after {
            errs.push(FieldError::invalid(
                "spec.selector",
                after.map(|v| v.to_string()).unwrap_or_default(),
                "field is immutable",
            ));
        }
    }
}

/// A Job's pods restart on failure or never.
fn validate_job(spec: Option<&Value>, errs: &mut ErrorList) {
    let policy = spec
        .and_then(|s| s.pointer("/template/spec/restartPolicy"))
        .and_then(Value::as_str);
    if let Some(p) = policy
        && p != "OnFailure"
        && p != "Never"
    {
        errs.push(FieldError::not_supported(
            "spec.template.spec.restartPolicy",
            p,
            &["OnFailure", "Never"],
        ));
    }
}

/// A ConfigMap's or Secret's `data` and `binaryData`: valid keys, at most 1 MiB in all.
fn validate_config_data(obj: &Object, errs: &mut ErrorList) {
    let mut size = 0usize;
    for field in ["data", "binaryData"] {
        if let Some(Value::Object(m)) = obj.other.get(field) {
            for (k, v) in m {
                if !config_key_ok(k) {
                    errs.push(FieldError::invalid(format!("{field}[{k}]"), k, "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')"));
                }
                size += k.len() + v.as_str().map_or(0, str::len);
            }
        }
    }
    if size > 1024 * 1024 {
        errs.push(FieldError::too_long("data", 1024 * 1024));
    }
}

/// A ConfigMap or Secret stored `immutable` keeps its data and stays immutable.
fn validate_config_immutable(obj: &Object, old: Option<&Object>, errs: &mut ErrorList) {
    if let Some(old) = old
        && old.other.get("immutable") == Some(&Value::Bool(true))
    {
        for field in ["data", "binaryData", "immutable"] {
            if old.other.get(field) != obj.other.get(field) {
                errs.push(FieldError::forbidden(
                    field,
                    "field is immutable when `immutable` is set",
                ));
            }
        }
    }
}

/// The most a PriorityClass outside `system-` may be worth (Kubernetes'
/// `HighestUserDefinablePriority`).
const HIGHEST_USER_PRIORITY: i64 = 1_000_000_000;
const PREEMPTION_POLICIES: &[&str] = &["PreemptLowerPriority", "Never"];

/// Kubernetes' PriorityClass checks: a user's value is at most a billion, the `system-`
/// names are reserved, and neither the value nor the preemption policy changes.
fn validate_priority_class(obj: &Object, old: Option<&Object>, errs: &mut ErrorList) {
    if obj.name().starts_with("system-") {
        errs.push(FieldError::forbidden(
            "metadata.name",
            "priority class names with 'system-' prefix are reserved",
        ));
    }
    if let Some(v) = obj.other.get("value").and_then(Value::as_i64)
        && v > HIGHEST_USER_PRIORITY
    {
        errs.push(FieldError::forbidden(
            "value",
            format!("maximum allowed value of a user defined priority is {HIGHEST_USER_PRIORITY}"),
        ));
    }
    if let Some(p) = obj.other.get("preemptionPolicy").and_then(Value::as_str)
        && !PREEMPTION_POLICIES.contains(&p)
    {
        errs.push(FieldError::not_supported(
            "preemptionPolicy",
            p,
            PREEMPTION_POLICIES,
        ));
    }
    if let Some(old) = old {
        if old.other.get("value") != obj.other.get("value") {
            errs.push(FieldError::forbidden(
                "value",
                "may not be changed in an update.",
            ));
        }
        if old.other.get("preemptionPolicy") != obj.other.get("preemptionPolicy") {
            errs.push(FieldError::invalid(
                "preemptionPolicy",
                obj.other
                    .get("preemptionPolicy")
                    .and_then(Value::as_str)
                    .unwrap_or(""),
                "field is immutable",
            ));
        }
    }
}

/// A Secret's type does not change.
fn validate_secret_type(obj: &Object, old: Option<&Object>, errs: &mut ErrorList) {
    // (One stored without a type, by an earlier version, was Opaque.)
    let type_of = |o: &Object| {
        o.other
            .get("type")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .unwrap_or(SECRET_DEFAULT_TYPE)
            .to_string()
    };
    if let Some(old) = old
        && type_of(old) != type_of(obj)
    {
        errs.push(FieldError::invalid(
            "type",
            obj.other
                .get("type")
                .map(|t| t.to_string())
                .unwrap_or_default(),
            "field is immutable",
        ));
    }
}

/// A workload's selector must be valid and select its own pod template.
fn check_selector(
    spec: Option<&Value>,
    sel_path: &str,
    labels_path: &str,
    labels_at: &[&str],
    errs: &mut ErrorList,
) {
    let Some(sel_value) = spec.and_then(|s| s.get("selector")) else {
        return;
    };
    let parsed: Result<LabelSelector, _> = serde_json::from_value(sel_value.clone());
    let selector: Selector = match parsed
        .map_err(|e| e.to_string())
        .and_then(|s| s.to_selector().map_err(|e| e.to_string()))
    {
        Ok(s) => s,
        Err(e) => {
            errs.push(FieldError::invalid(sel_path, sel_value, e));
            return;
        }
    };
    if selector.is_everything() {
        errs.push(FieldError::invalid(
            sel_path,
            sel_value,
            "empty selector is invalid for deployment",
        ));
        return;
    }
    let labels = labels_at
        .iter()
        .try_fold(spec.unwrap_or(&Value::Null), |v, k| v.get(*k))
        .and_then(|l| serde_json::from_value(l.clone()).ok())
        .unwrap_or_default();
    if !selector.matches(&labels) {
        errs.push(FieldError::invalid(
            labels_path,
            format!("{labels:?}"),
            "`selector` does not match template `labels`",
        ));
    }
}

/// A Role's or ClusterRole's rules, as Kubernetes' `ValidatePolicyRule` checks them.
fn validate_rules(obj: &Object, errs: &mut ErrorList) {
    let namespaced = obj.kind == "Role";
    let Some(Value::Array(rules)) = obj.other.get("rules") else {
        return;
    };
    let len = |r: &Value, k: &str| r.get(k).and_then(Value::as_array).map_or(0, Vec::len);
    for (i, r) in rules.iter().enumerate() {
        let at = |f: &str| format!("rules[{i}].{f}");
        if len(r, "verbs") == 0 {
            errs.push(FieldError::required(
                at("verbs"),
                "verbs must contain at least one value",
            ));
        }
        if len(r, "nonResourceURLs") > 0 {
            if namespaced {
                errs.push(FieldError::invalid(
                    at("nonResourceURLs"),
                    r["nonResourceURLs"].to_string(),
                    "namespaced rules cannot apply to non-resource URLs",
                ));
            }
            if len(r, "apiGroups") > 0 || len(r, "resources") > 0 {
                errs.push(FieldError::invalid(
                    at("nonResourceURLs"),
                    r["nonResourceURLs"].to_string(),
                    "rules cannot apply to both regular resources and non-resource URLs",
                ));
            }
            continue;
        }
        if len(r, "apiGroups") == 0 {
            errs.push(FieldError::required(
                at("apiGroups"),
                "resource rules must supply at least one api group",
            ));
        }
        if len(r, "resources") == 0 {
            errs.push(FieldError::required(
                at("resources"),
                "resource rules must supply at least one resource",
            ));
        }
    }
}

/// A RoleBinding's or ClusterRoleBinding's roleRef (immutable) and subjects.
fn validate_binding(obj: &Object, old: Option<&Object>, errs: &mut ErrorList) {
    let cluster = obj.kind == "ClusterRoleBinding";
    let role_ref = obj.other.get("roleRef");
    let field = |v: Option<&Value>, k: &str| {
        v.and_then(|v| v.get(k))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    match role_ref {
        None | Some(Value::Null) => errs.push(FieldError::required("roleRef", "")),
        Some(r) => {
            let kind = field(Some(r), "kind");
            let allowed: &[&str] = if cluster {
                &["ClusterRole"]
            } else {
                &["Role", "ClusterRole"]
            };
            if !allowed.contains(&kind.as_str()) {
                errs.push(FieldError::not_supported("roleRef.kind", &kind, allowed));
            }
            if field(Some(r), "apiGroup") != crate::rbac::GROUP {
                errs.push(FieldError::not_supported(
                    "roleRef.apiGroup",
                    field(Some(r), "apiGroup"),
                    &[crate::rbac::GROUP],
                ));
            }
            if field(Some(r), "name").is_empty() {
                errs.push(FieldError::required("roleRef.name", ""));
            }
        }
    }
    if let Some(old) = old
        && old.other.get("roleRef") != role_ref
    {
        errs.push(FieldError::invalid(
            "roleRef",
            role_ref.map(Value::to_string).unwrap_or_default(),
            "cannot change roleRef",
        ));
    }
    let Some(Value::Array(subjects)) = obj.other.get("subjects") else {
        return;
    };
    for (i, s) in subjects.iter().enumerate() {
        let at = |f: &str| format!("subjects[{i}].{f}");
        if field(Some(s), "name").is_empty() {
            errs.push(FieldError::required(at("name"), ""));
        }
        let group = field(Some(s), "apiGroup");
        match field(Some(s), "kind").as_str() {
            "ServiceAccount" => {
                if !group.is_empty() {
                    errs.push(FieldError::not_supported(at("apiGroup"), &group, &[""]));
                }
                if cluster && field(Some(s), "namespace").is_empty() {
                    errs.push(FieldError::required(at("namespace"), ""));
                }
            }
            "User" | "Group" => {
                if group != crate::rbac::GROUP {
                    errs.push(FieldError::not_supported(
                        at("apiGroup"),
                        &group,
                        &[crate::rbac::GROUP],
                    ));
                }
            }
            other => errs.push(FieldError::not_supported(
                at("kind"),
                other,
                &["ServiceAccount", "User", "Group"],
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{Registry, builtin};

    fn rt(group: &str, plural: &str) -> std::sync::Arc<ResourceType> {
        let version = if group.is_empty()
            || group == "apps"
            || group == "batch"
            || group == "apiextensions.k8s.io"
            || group == crate::rbac::GROUP
        {
            "v1"
        } else {
            "v1alpha1"
        };
        Registry::new(builtin())
            .get(group, version, plural)
            .unwrap()
    }

    /// Roles and bindings are checked as Kubernetes checks them; subjects' apiGroup is
    /// defaulted first.
    #[test]
    fn rbac_objects_are_validated_and_defaulted() {
        let object = |kind: &str, ns: &str, rest: Value| {
            let mut v = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": {"name": "x", "namespace": ns}});
            if let (Some(m), Value::Object(r)) = (v.as_object_mut(), rest) {
                m.extend(r);
            }
            Object::from_value(v).unwrap()
        };
        let errors = |plural: &str, obj: &Object, old: Option<&Object>| -> Vec<String> {
            validate(&rt(crate::rbac::GROUP, plural), obj, old)
                .iter()
                .map(|e| e.to_string())
                .collect()
        };
        let good = object(
            "Role",
            "a",
            json!({"rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}),
        );
        assert!(errors("roles", &good, None).is_empty());
        let cases = [
            (
                json!([{"apiGroups": [""], "resources": ["pods"], "verbs": []}]),
                "rules[0].verbs",
            ),
            (
                json!([{"resources": ["pods"], "verbs": ["get"]}]),
                "rules[0].apiGroups",
            ),
            (
                json!([{"apiGroups": [""], "verbs": ["get"]}]),
                "rules[0].resources",
            ),
            (
                json!([{"nonResourceURLs": ["/x"], "verbs": ["get"]}]),
                "namespaced rules cannot apply to non-resource URLs",
            ),
        ];
        for (rules, want) in cases {
            let errs = errors("roles", &object("Role", "a", json!({"rules": rules})), None);
            assert!(errs.iter().any(|e| e.contains(want)), "{want}: {errs:?}");
        }
        let both = object(
            "ClusterRole",
            "",
            json!({"rules": [{"nonResourceURLs": ["/x"], "apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}),
        );
        assert!(
            errors("clusterroles", &both, None)
                .iter()
                .any(|e| e.contains("both regular resources and non-resource URLs"))
        );
        // Bindings: the roleRef's kind and group, immutable; subjects defaulted, then checked.
        let brt = rt(crate::rbac::GROUP, "clusterrolebindings");
        let mut b = object(
            "ClusterRoleBinding",
            "",
            json!({"roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"}, "subjects": [{"kind": "User", "name": "u"}, {"kind": "ServiceAccount", "name": "s"}]}),
        );
        apply_defaults(&brt, &mut b);
        assert_eq!(
            b.other["subjects"][0]["apiGroup"],
            "rbac.authorization.k8s.io"
        );
        assert_eq!(b.other["subjects"][1]["apiGroup"], "");
        let errs = errors("clusterrolebindings", &b, None);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(errs[0].contains("subjects[1].namespace"), "{errs:?}");
        let mut to_role = b.clone();
        to_role.other["roleRef"]["kind"] = json!("Role");
        to_role.other["subjects"][1]["namespace"] = json!("n");
        assert!(
            errors("clusterrolebindings", &to_role, None)
                .iter()
                .any(|e| e.contains("roleRef.kind"))
        );
        let mut fixed = b.clone();
        fixed.other["subjects"][1]["namespace"] = json!("n");
        assert!(errors("clusterrolebindings", &fixed, None).is_empty());
        let mut changed = fixed.clone();
        changed.other["roleRef"]["name"] = json!("edit");
        assert!(
            errors("clusterrolebindings", &changed, Some(&fixed))
                .iter()
                .any(|e| e.contains("cannot change roleRef"))
        );
    }

    /// Every heartbeat is stamped anew, two in the same second too (each must move the
    /// member's last-heard time, or a silent member is declared Unknown early).
    #[test]
    fn heartbeats_in_one_second_are_told_apart() {
        let r = rt("multicluster.io", "clusters");
        let beat = |old: Option<&Value>| {
            let mut st = Some(json!({"lastHeartbeatTime": "2026-01-01T00:00:00Z"}));
            prepare_status(&r, old, &mut st);
            st.unwrap()
        };
        let first = beat(None);
        std::thread::sleep(std::time::Duration::from_millis(2));
        let second = beat(Some(&first));
        assert_ne!(first["lastHeartbeatTime"], second["lastHeartbeatTime"]);
        let stamped: orrery_api::MicroTime = second["lastHeartbeatTime"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(orrery_api::MicroTime::now().millis_since(stamped) < 1_000);
    }

    #[test]
    fn namespaces_get_finalizer_and_phase() {
        let mut ns = Object::new("v1", "Namespace").with_name("a");
        prepare_create(&rt("", "namespaces"), &mut ns);
        assert_eq!(ns.spec.unwrap()["finalizers"], json!(["kubernetes"]));
        assert_eq!(ns.status.unwrap()["phase"], "Active");
    }

    #[test]
    fn secrets_fold_string_data() {
        let mut s = Object::new("v1", "Secret").with_name("s");
        s.other
            .insert("stringData".into(), json!({"user": "admin"}));
        s.other.insert("data".into(), json!({"old": "eA=="}));
        prepare_create(&rt("", "secrets"), &mut s);
        assert_eq!(s.other["data"], json!({"old": "eA==", "user": "YWRtaW4="}));
        assert!(!s.other.contains_key("stringData"));
    }

    #[test]
    fn workload_rules() {
        let d = |replicas: i64, sel: &str, label: &str| -> Object {
            serde_json::from_value(json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "w"},
                "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": sel}},
                         "template": {"metadata": {"labels": {"app": label}}, "spec": {"containers": []}}}})).unwrap()
        };
        let r = rt("apps", "deployments");
        assert!(validate(&r, &d(1, "web", "web"), None).is_empty());
        let errs = validate(&r, &d(-1, "web", "db"), None);
        let fields: Vec<_> = errs.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["spec.replicas", "spec.template.metadata.labels"]);
        let errs = validate(&r, &d(1, "db", "db"), Some(&d(1, "web", "web")));
        assert_eq!(errs[0].field, "spec.selector");
        assert!(errs[0].detail.contains("immutable"));
    }

    #[test]
    fn config_maps_and_immutability() {
        let r = rt("", "configmaps");
        let mut cm = Object::new("v1", "ConfigMap").with_name("c");
        cm.other
            .insert("data".into(), json!({"ok.key": "v", "bad key": "v"}));
        let errs = validate(&r, &cm, None);
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].field, "data[bad key]");
        let mut old = Object::new("v1", "ConfigMap").with_name("c");
        old.other.insert("immutable".into(), json!(true));
        old.other.insert("data".into(), json!({"a": "1"}));
        let mut new = old.clone();
        new.other.insert("data".into(), json!({"a": "2"}));
        assert_eq!(validate(&r, &new, Some(&old))[0].field, "data");
    }

    #[test]
    fn defaults_like_kubernetes() {
        let mut d: Object = serde_json::from_value(json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "w"},
            "spec": {"selector": {"matchLabels": {"app": "w"}}, "template": {"spec": {"containers": [
                {"name": "a", "image": "nginx:1.27", "ports": [{"containerPort": 80}]},
                {"name": "b", "image": "busybox"}]}}}})).unwrap();
        prepare_create(&rt("apps", "deployments"), &mut d);
        let spec = d.spec.unwrap();
        assert_eq!(spec["replicas"], 1);
        assert_eq!(spec["strategy"]["type"], "RollingUpdate");
        let c = &spec["template"]["spec"]["containers"];
        assert_eq!(c[0]["ports"][0]["protocol"], "TCP");
        assert_eq!(c[0]["imagePullPolicy"], "IfNotPresent");
        assert_eq!(c[1]["imagePullPolicy"], "Always", "no tag means latest");
        assert_eq!(spec["template"]["spec"]["restartPolicy"], "Always");

        let mut svc: Object = serde_json::from_value(
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
            "spec": {"ports": [{"port": 80}], "type": "NodePort"}}),
        )
        .unwrap();
        prepare_create(&rt("", "services"), &mut svc);
        let spec = svc.spec.unwrap();
        assert_eq!(spec["type"], "NodePort", "given values stay");
        assert_eq!(spec["ports"][0]["targetPort"], 80);
        assert_eq!(spec["ports"][0]["protocol"], "TCP");
    }

    #[test]
    fn jobs_need_a_restartable_policy() {
        let r = rt("batch", "jobs");
        let job: Object = serde_json::from_value(
            json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
            "spec": {"template": {"spec": {"restartPolicy": "Always", "containers": []}}}}),
        )
        .unwrap();
        assert_eq!(
            validate(&r, &job, None)[0].field,
            "spec.template.spec.restartPolicy"
        );
    }
}
