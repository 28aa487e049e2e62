//! Karmada's `ResourceInterpreterCustomization` (config.karmada.io/v1alpha1): how a kind is
//! interpreted, as Lua scripts per operation. The types only; the scripts run in
//! `orrery-interpreter`.

use serde::{Deserialize, Serialize};

use crate::validation::{ErrorList, FieldError};

/// The spec of a ResourceInterpreterCustomization.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CustomizationSpec {
    /// The kind the scripts interpret (an exact apiVersion and kind).
    pub target: CustomizationTarget,
    /// The scripts, one per operation.
    pub customizations: CustomizationRules,
}

/// The kind a customization interprets.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CustomizationTarget {
    /// e.g. `apps.kruise.io/v1alpha1`.
    #[serde(default)]
    pub api_version: String,
    /// e.g. `CloneSet`.
    #[serde(default)]
    pub kind: String,
}

/// A Lua script.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LuaScript {
    /// The script: it defines the operation's function (`GetReplicas`, `Retain`, ...).
    #[serde(default)]
    pub lua_script: String,
}

/// The scripts of a customization, Karmada's field names.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CustomizationRules {
    /// `Retain(desiredObj, observedObj)`: the member's fields kept when the Work is applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<LuaScript>,
    /// `GetReplicas(desiredObj)`: replicas and what one of them requires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_resource: Option<LuaScript>,
    /// `GetComponents(desiredObj)`: the components of a multi-template workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub component_resource: Option<LuaScript>,
    /// `ReviseReplica(desiredObj, desiredReplica)`: the object with a cluster's replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_revision: Option<LuaScript>,
    /// `ReflectStatus(observedObj)`: the status a member reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_reflection: Option<LuaScript>,
    /// `AggregateStatus(desiredObj, statusItems)`: the template's status from its members'.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_aggregation: Option<LuaScript>,
    /// `InterpretHealth(observedObj)`: whether a member's object is healthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_interpretation: Option<LuaScript>,
    /// `GetDependencies(desiredObj)`: the objects it needs, propagated with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dependency_interpretation: Option<LuaScript>,
}

/// The operations Karmada's interpreter defines for a customization, in `karmadactl`'s order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Operation {
    Retain,
    InterpretReplica,
    InterpretComponent,
    ReviseReplica,
    InterpretStatus,
    AggregateStatus,
    InterpretHealth,
    InterpretDependency,
}

impl Operation {
    pub const ALL: [Operation; 8] = [
        Operation::Retain,
        Operation::InterpretReplica,
        Operation::InterpretComponent,
        Operation::ReviseReplica,
        Operation::InterpretStatus,
        Operation::AggregateStatus,
        Operation::InterpretHealth,
        Operation::InterpretDependency,
    ];

    /// Karmada's name of the operation.
    pub fn name(self) -> &'static str {
        match self {
            Operation::Retain => "Retain",
            Operation::InterpretReplica => "InterpretReplica",
            Operation::InterpretComponent => "InterpretComponent",
            Operation::ReviseReplica => "ReviseReplica",
            Operation::InterpretStatus => "InterpretStatus",
            Operation::AggregateStatus => "AggregateStatus",
            Operation::InterpretHealth => "InterpretHealth",
            Operation::InterpretDependency => "InterpretDependency",
        }
    }

    /// The Lua function the operation's script defines.
    pub fn function(self) -> &'static str {
        match self {
            Operation::Retain => "Retain",
            Operation::InterpretReplica => "GetReplicas",
            Operation::InterpretComponent => "GetComponents",
            Operation::ReviseReplica => "ReviseReplica",
            Operation::InterpretStatus => "ReflectStatus",
            Operation::AggregateStatus => "AggregateStatus",
            Operation::InterpretHealth => "InterpretHealth",
            Operation::InterpretDependency => "GetDependencies",
        }
    }

    /// The field of `spec.customizations` holding its script.
    pub fn field(self) -> &'static str {
        match self {
            Operation::Retain => "retention",
            Operation::InterpretReplica => "replicaResource",
            Operation::InterpretComponent => "componentResource",
            Operation::ReviseReplica => "replicaRevision",
            Operation::InterpretStatus => "statusReflection",
            Operation::AggregateStatus => "statusAggregation",
            Operation::InterpretHealth => "healthInterpretation",
            Operation::InterpretDependency => "dependencyInterpretation",
        }
    }

    /// An operation by its name, in any case (as `karmadactl interpret --operation`).
    pub fn parse(s: &str) -> Option<Operation> {
        Operation::ALL
            .into_iter()
            .find(|o| o.name().eq_ignore_ascii_case(s))
    }
}

impl CustomizationRules {
    /// The script of an operation, if it has a non-empty one.
    pub fn script(&self, op: Operation) -> Option<&str> {
        let s = match op {
            Operation::Retain => &self.retention,
            Operation::InterpretReplica => &self.replica_resource,
            Operation::InterpretComponent => &self.component_resource,
            Operation::ReviseReplica => &self.replica_revision,
            Operation::InterpretStatus => &self.status_reflection,
            Operation::AggregateStatus => &self.status_aggregation,
            Operation::InterpretHealth => &self.health_interpretation,
            Operation::InterpretDependency => &self.dependency_interpretation,
        };
        s.as_ref()
            .map(|s| s.lua_script.as_str())
            .filter(|s| !s.trim().is_empty())
    }
}

impl CustomizationSpec {
    /// The errors of the spec's shape (the scripts are compiled by the API server).
    pub fn validate(&self) -> ErrorList {
        let mut errs = Vec::new();
        if self.target.api_version.is_empty() {
            errs.push(FieldError::required("spec.target.apiVersion", ""));
        }
        if self.target.kind.is_empty() {
            errs.push(FieldError::required("spec.target.kind", ""));
        }
        errs
    }

    /// The operations both this customization and `other` script, for the same target: two
    /// customizations may not both say how one kind's operation goes (dependencies may: they
    /// add up), as Karmada's admission refuses.
    pub fn conflicts(&self, other: &CustomizationSpec) -> Vec<Operation> {
        if self.target != other.target {
            return Vec::new();
        }
        Operation::ALL
            .into_iter()
            .filter(|op| *op != Operation::InterpretDependency)
            .filter(|op| {
                self.customizations.script(*op).is_some()
                    && other.customizations.script(*op).is_some()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_read_karmadas_names_in_any_case() {
        assert_eq!(
            Operation::parse("interpretreplica"),
            Some(Operation::InterpretReplica)
        );
        assert_eq!(Operation::parse("RETAIN"), Some(Operation::Retain));
        assert_eq!(Operation::parse("Prune"), None);
        assert_eq!(Operation::InterpretStatus.function(), "ReflectStatus");
        assert_eq!(Operation::InterpretComponent.field(), "componentResource");
    }

    #[test]
    fn two_customizations_of_a_kind_conflict_on_an_operation_both_script() {
        let spec = |json: serde_json::Value| -> CustomizationSpec {
            serde_json::from_value(json).unwrap()
        };
        let a = spec(serde_json::json!({
            "target": {"apiVersion": "x.io/v1", "kind": "A"},
            "customizations": {
                "replicaResource": {"luaScript": "function GetReplicas(o) return 1 end"},
                "dependencyInterpretation": {"luaScript": "function GetDependencies(o) return {} end"}
            }
        }));
        let mut b = a.clone();
        b.customizations.replica_resource = Some(LuaScript {
            lua_script: "  ".into(),
        });
        assert!(
            a.conflicts(&b).is_empty(),
            "blank scripts and dependencies add up"
        );
        assert_eq!(a.conflicts(&a), vec![Operation::InterpretReplica]);
        let mut other = a.clone();
        other.target.kind = "B".into();
        assert!(a.conflicts(&other).is_empty());
        assert!(
            spec(serde_json::json!({"target": {}, "customizations": {}}))
                .validate()
                .len()
                == 2
        );
    }
}
