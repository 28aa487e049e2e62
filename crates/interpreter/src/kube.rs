//! Karmada's `kube` library for scripts (`local kube = require("kube")`):
//!
//! - `resourceAdd(q1, q2, ...)`: the sum of quantities (nil counts as zero), as Kubernetes
//!   prints it;
//! - `accuratePodRequirements(podTemplate)`: what one replica of a pod template requires
//!   (`nodeClaim`, `resourceRequest`), or nil when nothing;
//! - `getPodDependencies(podTemplate, namespace)`: the ConfigMaps, Secrets, ServiceAccount
//!   and PersistentVolumeClaims it names, or nil when none;
//! - `getResourceQuantity(q)`: a quantity as a number of base units.
//!
//! [`requirements`] and [`dependencies`] are the same rules for the built-in kinds.

use mlua::{Lua, MultiValue, Table, Value as LuaValue};
use orrery_api::quantity::{Format, Quantity};
use serde_json::{Map, Value, json};

use crate::convert;

/// The library's table.
pub fn library(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.set(
        "resourceAdd",
        lua.create_function(|_, args: MultiValue| {
            let mut sum = Quantity::ZERO;
            for (i, a) in args.iter().enumerate() {
                sum = sum + quantity_arg(a, i + 1, "resourceAdd")?;
            }
            Ok(sum.to_string())
        })?,
    )?;
    t.set(
        "accuratePodRequirements",
        lua.create_function(|lua, args: MultiValue| {
            if args.len() != 1 {
                return Err(mlua::Error::runtime(
                    "getPodRequirements only accepts one argument",
                ));
            }
            let template = table_arg(&args[0], 1, "accuratePodRequirements")?;
            match requirements(&template) {
                Some(r) => convert::to_lua(lua, &r),
                None => Ok(LuaValue::Nil),
            }
        })?,
    )?;
    t.set(
        "getPodDependencies",
        lua.create_function(|lua, args: MultiValue| {
            if args.len() != 2 {
                return Err(mlua::Error::runtime(
                    "getPodDependencies only accepts two argument",
                ));
            }
            let template = table_arg(&args[0], 1, "getPodDependencies")?;
            let ns = match &args[1] {
                LuaValue::Nil => "default".to_string(),
                LuaValue::String(s) => s.to_string_lossy(),
                LuaValue::Integer(i) => i.to_string(),
                LuaValue::Number(n) => n.to_string(),
                other => return Err(type_error(2, "getPodDependencies", other)),
            };
            let deps = dependencies(&template, &ns);
            if deps.is_empty() {
                // A Go nil slice: nil, not an empty table.
                return Ok(LuaValue::Nil);
            }
            convert::to_lua(lua, &Value::Array(deps))
        })?,
    )?;
    t.set(
        "getResourceQuantity",
        lua.create_function(|_, args: MultiValue| {
            if args.len() != 1 {
                return Err(mlua::Error::runtime(
                    "getResourceQuantity only accepts one argument",
                ));
            }
            let q = quantity_arg(&args[0], 1, "getResourceQuantity")?;
            if q.is_negative() {
                return Err(mlua::Error::runtime(format!(
                    "int approximation unexpectedly returned a negative value: {q}"
                )));
            }
            Ok(q.as_f64())
        })?,
    )?;
    Ok(t)
}

fn type_error(n: usize, func: &str, got: &LuaValue) -> mlua::Error {
    mlua::Error::runtime(format!(
        "bad argument #{n} to {func} (string expected, got {})",
        convert::type_name(got)
    ))
}

fn quantity_arg(v: &LuaValue, n: usize, func: &str) -> mlua::Result<Quantity> {
    match v {
        LuaValue::Nil => Ok(Quantity::ZERO),
        LuaValue::String(s) => {
            let s = s.to_string_lossy();
            s.parse::<Quantity>()
                .map_err(|e| mlua::Error::runtime(format!("cannot parse '{s}': {e}")))
        }
        other => Err(type_error(n, func, other)),
    }
}

fn table_arg(v: &LuaValue, n: usize, func: &str) -> mlua::Result<Value> {
    if !v.is_table() {
        return Err(mlua::Error::runtime(format!(
            "bad argument #{n} to {func} (table expected, got {})",
            convert::type_name(v)
        )));
    }
    let json = convert::from_lua(v).map_err(mlua::Error::runtime)?;
    Ok(convert::fix_empty(json, &[], true))
}

fn parse_q(v: &Value) -> Option<Quantity> {
    match v {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.to_string().parse().ok(),
        _ => None,
    }
}

/// A container's requests, its limits standing in for missing ones (Kubernetes' defaulting).
fn effective(c: &Value) -> Vec<(String, Quantity)> {
    let mut out: Vec<(String, Quantity)> = Vec::new();
    for src in ["requests", "limits"] {
        if let Some(m) = c
            .pointer(&format!("/resources/{src}"))
            .and_then(Value::as_object)
        {
            for (k, v) in m {
                if out.iter().any(|(n, _)| n == k) {
                    continue;
                }
                if let Some(q) = parse_q(v) {
                    out.push((k.clone(), q));
                }
            }
        }
    }
    out
}

/// How Karmada prints a resource of the request, or `None` for a name it does not track.
fn track(name: &str, total: Quantity) -> Option<Quantity> {
    let units = || i64::try_from(total.value()).unwrap_or(i64::MAX);
    let q = match name {
        "cpu" => Quantity::from_milli(i64::try_from(total.milli_value()).unwrap_or(i64::MAX)),
        "memory" | "ephemeral-storage" => Quantity::from_int(units(), Format::BinarySI),
        "pods" => Quantity::from_int(units(), Format::DecimalSI),
        n if n.starts_with("hugepages-") => Quantity::from_int(units(), Format::BinarySI),
        n if n.starts_with("attachable-volumes-")
            || (n.contains('/') && !n.starts_with("requests.")) =>
        {
            Quantity::from_int(units(), Format::DecimalSI)
        }
        _ => return None,
    };
    (q.nanos() > 0).then_some(q)
}

/// What one replica of a pod template requires, Karmada's `ReplicaRequirements` without a
/// namespace: `nodeClaim` (node selector, tolerations, required node affinity) and
/// `resourceRequest` (its containers' requests summed, at least any one init container's,
/// plus the pod's overhead). `None` when it has neither.
pub fn requirements(template: &Value) -> Option<Value> {
    let spec = template.get("spec").cloned().unwrap_or(Value::Null);
    let mut claim = Map::new();
    if let Some(s) = spec
        .get("nodeSelector")
        .filter(|s| s.as_object().is_some_and(|m| !m.is_empty()))
    {
        claim.insert("nodeSelector".into(), s.clone());
    }
    if let Some(t) = spec
        .get("tolerations")
        .filter(|t| t.as_array().is_some_and(|a| !a.is_empty()))
    {
        claim.insert("tolerations".into(), t.clone());
    }
    if let Some(a) =
        spec.pointer("/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution")
    {
        claim.insert("hardNodeAffinity".into(), a.clone());
    }
    let list = |k: &str| {
        spec.get(k)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let mut sum: Vec<(String, Quantity)> = Vec::new();
    let add = |sum: &mut Vec<(String, Quantity)>, k: String, q: Quantity, max: bool| match sum
        .iter_mut()
        .find(|(n, _)| *n == k)
    {
        Some((_, s)) if max => *s = (*s).max(q),
        Some((_, s)) => *s = *s + q,
        None => sum.push((k, q)),
    };
    for c in list("containers") {
        for (k, q) in effective(&c) {
            add(&mut sum, k, q, false);
        }
    }
    for c in list("initContainers") {
        for (k, q) in effective(&c) {
            add(&mut sum, k, q, true);
        }
    }
    if let Some(m) = spec.get("overhead").and_then(Value::as_object) {
        for (k, v) in m {
            if let Some(q) = parse_q(v) {
                add(&mut sum, k.clone(), q, false);
            }
        }
    }
    let mut request = Map::new();
    sum.sort_by(|a, b| a.0.cmp(&b.0));
    for (k, total) in sum {
        if let Some(q) = track(&k, total) {
            request.insert(k, Value::String(q.to_string()));
        }
    }
    let mut out = Map::new();
    if !claim.is_empty() {
        out.insert("nodeClaim".into(), Value::Object(claim));
    }
    if !request.is_empty() {
        out.insert("resourceRequest".into(), Value::Object(request));
    }
    (!out.is_empty()).then_some(Value::Object(out))
}

/// What a pod template names, as Karmada's `DependentObjectReference`s: ConfigMaps, then
/// Secrets, the ServiceAccount, PersistentVolumeClaims (each kind by name).
pub fn dependencies(template: &Value, namespace: &str) -> Vec<Value> {
    let spec = template.get("spec").cloned().unwrap_or(Value::Null);
    let arr = |v: &Value, k: &str| {
        v.get(k)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let (mut cms, mut secrets, mut sas, mut pvcs) = (
        std::collections::BTreeSet::new(),
        std::collections::BTreeSet::new(),
        std::collections::BTreeSet::new(),
        std::collections::BTreeSet::new(),
    );
    let put = |set: &mut std::collections::BTreeSet<String>, v: Option<&Value>| {
        if let Some(n) = v.and_then(Value::as_str).filter(|n| !n.is_empty()) {
            set.insert(n.to_string());
        }
    };
    for key in ["initContainers", "containers", "ephemeralContainers"] {
        for c in arr(&spec, key) {
            for e in arr(&c, "envFrom") {
                put(&mut cms, e.pointer("/configMapRef/name"));
                put(&mut secrets, e.pointer("/secretRef/name"));
            }
            for e in arr(&c, "env") {
                put(&mut cms, e.pointer("/valueFrom/configMapKeyRef/name"));
                put(&mut secrets, e.pointer("/valueFrom/secretKeyRef/name"));
            }
        }
    }
    for s in arr(&spec, "imagePullSecrets") {
        put(&mut secrets, s.get("name"));
    }
    for v in arr(&spec, "volumes") {
        put(&mut cms, v.pointer("/configMap/name"));
        put(&mut pvcs, v.pointer("/persistentVolumeClaim/claimName"));
        put(&mut secrets, v.pointer("/azureFile/secretName"));
        put(&mut secrets, v.pointer("/secret/secretName"));
        for src in [
            "cephfs",
            "cinder",
            "flexVolume",
            "rbd",
            "scaleIO",
            "iscsi",
            "storageos",
        ] {
            put(&mut secrets, v.pointer(&format!("/{src}/secretRef/name")));
        }
        put(&mut secrets, v.pointer("/csi/nodePublishSecretRef/name"));
        for p in v
            .pointer("/projected/sources")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            put(&mut cms, p.pointer("/configMap/name"));
            put(&mut secrets, p.pointer("/secret/name"));
        }
    }
    if let Some(sa) = spec.get("serviceAccountName").and_then(Value::as_str)
        && sa != "default"
    {
        put(&mut sas, Some(&Value::String(sa.to_string())));
    }
    let mut out = Vec::new();
    for (kind, names) in [
        ("ConfigMap", cms),
        ("Secret", secrets),
        ("ServiceAccount", sas),
        ("PersistentVolumeClaim", pvcs),
    ] {
        for n in names {
            out.push(json!({"apiVersion": "v1", "kind": kind, "namespace": namespace, "name": n}));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval<T: mlua::FromLuaMulti>(script: &str) -> mlua::Result<T> {
        let lua = crate::sandbox::state(crate::sandbox::Limits::default()).unwrap();
        lua.load(script).eval::<T>()
    }

    #[test]
    fn resource_add_sums_as_kubernetes_prints() {
        let add = |args: &str| -> String {
            eval(&format!("return require('kube').resourceAdd({args})")).unwrap()
        };
        assert_eq!(add("'100m', '1.2'"), "1300m");
        assert_eq!(add("'100M', '1.2G'"), "1300M");
        assert_eq!(add(""), "0");
        assert_eq!(add("nil, '1Gi'"), "1Gi");
        let e = eval::<String>("return require('kube').resourceAdd('1', 2)").unwrap_err();
        assert!(e.to_string().contains("string expected, got number"), "{e}");
        let e = eval::<String>("return require('kube').resourceAdd('x')").unwrap_err();
        assert!(
            e.to_string()
                .contains("cannot parse 'x': quantities must match"),
            "{e}"
        );
    }

    #[test]
    fn resource_quantities_are_base_units() {
        let q = |s: &str| -> f64 {
            eval(&format!("return require('kube').getResourceQuantity({s})")).unwrap()
        };
        assert_eq!(q("'100m'"), 0.1);
        assert_eq!(q("'1Gi'"), 1073741824.0);
        assert_eq!(q("'2G'"), 2e9);
        assert_eq!(q("nil"), 0.0);
        assert!(eval::<f64>("return require('kube').getResourceQuantity('-1')").is_err());
        assert!(
            eval::<f64>("return require('kube').getResourceQuantity()")
                .unwrap_err()
                .to_string()
                .contains("getResourceQuantity only accepts one argument")
        );
    }

    #[test]
    fn requirements_follow_the_pods_effective_requests() {
        let t = json!({"spec": {
            "nodeSelector": {"disk": "ssd"},
            "containers": [
                {"resources": {"limits": {"cpu": "100m", "memory": "100M"}}},
                {"resources": {"requests": {"cpu": "1.2", "memory": "1.2G", "nvidia.com/gpu": 1, "storage": "1Gi"}}}
            ],
            "initContainers": [{"resources": {"requests": {"cpu": "2", "memory": "1Gi"}}}],
            "overhead": {"memory": "1Mi"}
        }});
        assert_eq!(
            requirements(&t).unwrap(),
            json!({
                "nodeClaim": {"nodeSelector": {"disk": "ssd"}},
                "resourceRequest": {"cpu": "2", "memory": "1301048576", "nvidia.com/gpu": "1"}
            })
        );
        assert_eq!(
            requirements(&json!({"spec": {"containers": [{"name": "a"}]}})),
            None
        );
        let nil: LuaValue = eval("return require('kube').accuratePodRequirements({spec = {containers = {{name = 'a'}}}})").unwrap();
        assert!(nil.is_nil());
        let e =
            eval::<LuaValue>("return require('kube').accuratePodRequirements({}, {})").unwrap_err();
        assert!(
            e.to_string()
                .contains("getPodRequirements only accepts one argument")
        );
    }

    #[test]
    fn dependencies_name_what_the_pod_needs_or_nothing() {
        let t = json!({"spec": {
            "serviceAccountName": "test",
            "imagePullSecrets": [{"name": "pull"}],
            "containers": [{"envFrom": [{"configMapRef": {"name": "b"}}], "env": [{"valueFrom": {"secretKeyRef": {"name": "s"}}}]}],
            "volumes": [{"configMap": {"name": "a"}}, {"csi": {"nodePublishSecretRef": {"name": "csi"}}},
                        {"persistentVolumeClaim": {"claimName": "data"}}]
        }});
        let names: Vec<String> = dependencies(&t, "ns")
            .iter()
            .map(|d| {
                format!(
                    "{}/{}/{}",
                    d["kind"].as_str().unwrap(),
                    d["namespace"].as_str().unwrap(),
                    d["name"].as_str().unwrap()
                )
            })
            .collect();
        assert_eq!(
            names,
            [
                "ConfigMap/ns/a",
                "ConfigMap/ns/b",
                "Secret/ns/csi",
                "Secret/ns/pull",
                "Secret/ns/s",
                "ServiceAccount/ns/test",
                "PersistentVolumeClaim/ns/data"
            ]
        );
        let (n, ns): (LuaValue, String) = eval(
            "local k = require('kube')
             local d = k.getPodDependencies({spec = {serviceAccountName = 'x'}}, nil)
             return k.getPodDependencies({spec = {}}, 'a'), d[1].namespace",
        )
        .unwrap();
        assert!(n.is_nil(), "none: nil, as Karmada's nil slice");
        assert_eq!(ns, "default");
    }
}
