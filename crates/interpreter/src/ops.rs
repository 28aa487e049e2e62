//! Each operation of a customization: the script runs in a fresh sandbox (its whole chunk, then
//! its function, as Karmada does), and the result is checked as strictly as Karmada checks it:
//! a replica count must be a number (truncated), health a boolean (nil is an error, not
//! false), objects tables that keep their `kind`; requirements, components and dependencies
//! are read into Karmada's types.

use std::collections::BTreeMap;

use mlua::{Lua, MultiValue, Value as LuaValue};
use orrery_api::customization::Operation;
use orrery_api::quantity::Quantity;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::convert;
use crate::sandbox::{self, Limits};

/// Why an operation's script gave no answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ScriptError {
    pub operation: Operation,
    pub message: String,
}

/// Karmada's `NodeClaim`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeClaim {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hard_node_affinity: Option<Value>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Value>,
}

/// Karmada's `ReplicaRequirements`: what one replica requires.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaRequirements {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_claim: Option<NodeClaim>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resource_request: BTreeMap<String, Quantity>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub priority_class_name: String,
}

/// Karmada's `ComponentReplicaRequirements` (no namespace).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ComponentRequirements {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_claim: Option<NodeClaim>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resource_request: BTreeMap<String, Quantity>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub priority_class_name: String,
}

/// Karmada's `Component`: one part of a multi-template workload.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Component {
    pub name: String,
    pub replicas: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_requirements: Option<ComponentRequirements>,
}

/// Karmada's `DependentObjectReference`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DependentObjectReference {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<Value>,
}

/// Runs scripts within limits.
#[derive(Clone, Copy, Debug, Default)]
pub struct Vm {
    pub limits: Limits,
}

/// gopher-lua's number of a Lua type, which Karmada's messages print.
fn type_number(v: &LuaValue) -> u8 {
    match v {
        LuaValue::Nil => 0,
        LuaValue::Boolean(_) => 1,
        LuaValue::Integer(_) | LuaValue::Number(_) => 2,
        LuaValue::String(_) => 3,
        LuaValue::Function(_) => 4,
        LuaValue::Table(_) => 7,
        LuaValue::Thread(_) => 6,
        _ => 5,
    }
}

/// An mlua error as the one line (and no traceback) a status can carry.
pub fn message(e: &mlua::Error) -> String {
    let text = match e {
        mlua::Error::CallbackError { cause, .. } => return message(cause),
        mlua::Error::RuntimeError(s) | mlua::Error::MemoryError(s) => s.clone(),
        mlua::Error::SyntaxError { message, .. } => message.clone(),
        other => other.to_string(),
    };
    text.split("\nstack traceback:")
        .next()
        .unwrap_or_default()
        .trim()
        .to_string()
}

fn table_or(what: &str, v: &LuaValue) -> Result<Value, String> {
    if !v.is_table() {
        return Err(format!(
            "expect the returned {what} type is table but got {}",
            convert::type_name(v)
        ));
    }
    convert::from_lua(v).map_err(|e| format!("encode lua result to json failed: {e}"))
}

fn has_kind(v: Value) -> Result<Value, String> {
    if v.get("kind")
        .and_then(Value::as_str)
        .is_some_and(|k| !k.is_empty())
    {
        Ok(v)
    } else {
        Err(format!("Object 'Kind' is missing in '{v}'"))
    }
}

impl Vm {
    /// Runs `function` of `script` with the arguments `args` builds; `take` reads the first
    /// `n` results (missing ones are nil).
    fn call<T>(
        &self,
        op: Operation,
        script: &str,
        args: impl FnOnce(&Lua) -> mlua::Result<Vec<LuaValue>>,
        n: usize,
        take: impl FnOnce(&[LuaValue]) -> Result<T, String>,
    ) -> Result<T, ScriptError> {
        let err = |message: String| ScriptError {
            operation: op,
            message,
        };
        let lua = sandbox::state(self.limits).map_err(|e| err(message(&e)))?;
        lua.load(script)
            .set_name("customization")
            .exec()
            .map_err(|e| err(message(&e)))?;
        let name = op.function();
        let f = match lua.globals().get::<LuaValue>(name) {
            Ok(LuaValue::Function(f)) => f,
            Ok(LuaValue::Nil) | Err(_) => return Err(err(format!("not found function {name}"))),
            Ok(other) => {
                return Err(err(format!(
                    "{name} is not a function: {}",
                    convert::type_name(&other)
                )));
            }
        };
        let args = args(&lua).map_err(|e| err(message(&e)))?;
        let out = f
            .call::<MultiValue>(MultiValue::from_iter(args))
            .map_err(|e| err(message(&e)))?;
        let mut rets: Vec<LuaValue> = out.into_iter().take(n).collect();
        rets.resize(n, LuaValue::Nil);
        take(&rets).map_err(err)
    }

    /// Compiles a script without running it (`--check`, admission).
    pub fn check(&self, script: &str) -> Result<(), String> {
        let lua = sandbox::state(self.limits).map_err(|e| message(&e))?;
        lua.load(script)
            .set_name("customization")
            .into_function()
            .map(|_| ())
            .map_err(|e| message(&e))
    }

    /// `GetReplicas(desiredObj)`: the replicas, truncated as Go's `int32(float64)`, and what
    /// one requires (nil: nothing said).
    pub fn get_replicas(
        &self,
        script: &str,
        desired: &Value,
    ) -> Result<(i32, Option<ReplicaRequirements>), ScriptError> {
        self.call(
            Operation::InterpretReplica,
            script,
            |lua| Ok(vec![convert::to_lua(lua, desired)?]),
            2,
            |r| {
                let replica = match &r[0] {
                    LuaValue::Integer(i) => *i as i32,
                    LuaValue::Number(f) => f.trunc() as i32,
                    other => {
                        return Err(format!("result type {} is not number", type_number(other)));
                    }
                };
                let requires = match &r[1] {
                    LuaValue::Nil => None,
                    t @ LuaValue::Table(_) => {
                        let v = convert::fix_empty(table_or("requires", t)?, &[], true);
                        Some(
                            serde_json::from_value(v)
                                .map_err(|e| format!("json unmarshal obj failed: {e}"))?,
                        )
                    }
                    other => {
                        return Err(format!(
                            "expect the returned requires type is table but got {}",
                            convert::type_name(other)
                        ));
                    }
                };
                Ok((replica, requires))
            },
        )
    }

    /// `GetComponents(desiredObj)`: the components (nil: none).
    pub fn get_components(
        &self,
        script: &str,
        desired: &Value,
    ) -> Result<Option<Vec<Component>>, ScriptError> {
        self.call(
            Operation::InterpretComponent,
            script,
            |lua| Ok(vec![convert::to_lua(lua, desired)?]),
            1,
            |r| match &r[0] {
                LuaValue::Nil => Ok(None),
                t @ LuaValue::Table(_) => {
                    let v = convert::from_lua(t)
                        .map_err(|e| format!("failed to convert lua table for components: {e}"))?;
                    let v = convert::fix_empty(v, &[], false);
                    serde_json::from_value(v)
                        .map(Some)
                        .map_err(|e| format!("failed to convert lua table for components: {e}"))
                }
                other => Err(format!(
                    "expected result type 'table' or 'nil' from GetComponents, but got '{}'",
                    convert::type_name(other)
                )),
            },
        )
    }

    /// `ReviseReplica(desiredObj, desiredReplica)`: the object with those replicas.
    pub fn revise_replica(
        &self,
        script: &str,
        desired: &Value,
        replica: i64,
    ) -> Result<Value, ScriptError> {
        self.call(
            Operation::ReviseReplica,
            script,
            |lua| {
                Ok(vec![
                    convert::to_lua(lua, desired)?,
                    LuaValue::Number(replica as f64),
                ])
            },
            1,
            |r| {
                has_kind(convert::fix_empty(
                    table_or("requires", &r[0])?,
                    &[desired],
                    true,
                ))
            },
        )
    }

    /// `Retain(desiredObj, observedObj)`: the object to apply, with what the member keeps.
    pub fn retain(
        &self,
        script: &str,
        desired: &Value,
        observed: &Value,
    ) -> Result<Value, ScriptError> {
        self.call(
            Operation::Retain,
            script,
            |lua| {
                Ok(vec![
                    convert::to_lua(lua, desired)?,
                    convert::to_lua(lua, observed)?,
                ])
            },
            1,
            |r| {
                has_kind(convert::fix_empty(
                    table_or("requires", &r[0])?,
                    &[desired, observed],
                    true,
                ))
            },
        )
    }

    /// `ReflectStatus(observedObj)`: the status a member's object reports.
    pub fn reflect_status(&self, script: &str, observed: &Value) -> Result<Value, ScriptError> {
        self.call(
            Operation::InterpretStatus,
            script,
            |lua| Ok(vec![convert::to_lua(lua, observed)?]),
            1,
            |r| Ok(convert::fix_empty(table_or("replica", &r[0])?, &[], true)),
        )
    }

    /// `AggregateStatus(desiredObj, statusItems)`: the object with the members' statuses
    /// aggregated. `items` are Karmada's `AggregatedStatusItem`s: `None` is nil to the script
    /// (Karmada's nil slice), an empty list an empty table.
    pub fn aggregate_status(
        &self,
        script: &str,
        desired: &Value,
        items: Option<&[Value]>,
    ) -> Result<Value, ScriptError> {
        self.call(
            Operation::AggregateStatus,
            script,
            |lua| {
                let items = match items {
                    None => LuaValue::Nil,
                    Some(items) => convert::to_lua(lua, &Value::Array(items.to_vec()))?,
                };
                Ok(vec![convert::to_lua(lua, desired)?, items])
            },
            1,
            |r| has_kind(convert::fix_empty(table_or("requires", &r[0])?, &[], true)),
        )
    }

    /// `InterpretHealth(observedObj)`: a boolean; anything else (nil too) is an error.
    pub fn interpret_health(&self, script: &str, observed: &Value) -> Result<bool, ScriptError> {
        self.call(
            Operation::InterpretHealth,
            script,
            |lua| Ok(vec![convert::to_lua(lua, observed)?]),
            1,
            |r| match &r[0] {
                LuaValue::Boolean(b) => Ok(*b),
                other => Err(format!("result type {} is not bool", type_number(other))),
            },
        )
    }

    /// `GetDependencies(desiredObj)` of every script, each checked, merged, without duplicates
    /// and sorted by apiVersion, kind, namespace and name.
    pub fn get_dependencies(
        &self,
        scripts: &[&str],
        desired: &Value,
    ) -> Result<Vec<DependentObjectReference>, ScriptError> {
        let mut all: Vec<DependentObjectReference> = Vec::new();
        for script in scripts {
            let refs: Vec<DependentObjectReference> = self.call(
                Operation::InterpretDependency,
                script,
                |lua| Ok(vec![convert::to_lua(lua, desired)?]),
                1,
                |r| {
                    let v = convert::fix_empty(table_or("requires", &r[0])?, &[], false);
                    serde_json::from_value(v).map_err(|e| format!("json unmarshal obj failed: {e}"))
                },
            )?;
            verify(&refs).map_err(|message| ScriptError {
                operation: Operation::InterpretDependency,
                message,
            })?;
            for r in refs {
                // Karmada's set compares selectors by pointer: only those without one merge.
                if r.label_selector.is_some() || !all.contains(&r) {
                    all.push(r);
                }
            }
        }
        all.sort_by(|a, b| {
            (&a.api_version, &a.kind, &a.namespace, &a.name).cmp(&(
                &b.api_version,
                &b.kind,
                &b.namespace,
                &b.name,
            ))
        });
        Ok(all)
    }
}

/// Karmada's `VerifyDependencies`.
fn verify(refs: &[DependentObjectReference]) -> Result<(), String> {
    let mut errs = Vec::new();
    for (i, r) in refs.iter().enumerate() {
        if r.api_version.is_empty() {
            errs.push(format!(
                "dependencies[{i}].apiVersion: Required value: missing required apiVersion"
            ));
        }
        if r.kind.is_empty() {
            errs.push(format!(
                "dependencies[{i}].kind: Required value: missing required kind"
            ));
        }
        if r.name.is_empty() && r.label_selector.is_none() {
            errs.push(format!(
                "dependencies[{i}]: Invalid value: \"\": dependency can not leave name and labelSelector all empty"
            ));
        }
        if let Some(sel) = &r.label_selector
            && serde_json::from_value::<orrery_api::labels::LabelSelector>(sel.clone()).is_err()
        {
            errs.push(format!(
                "dependencies[{i}].labelSelector: Invalid value: {sel}"
            ));
        }
    }
    if errs.is_empty() {
        Ok(())
    } else if errs.len() == 1 {
        Err(errs.remove(0))
    } else {
        Err(format!("[{}]", errs.join(", ")))
    }
}
