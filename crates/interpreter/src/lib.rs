//! Karmada's resource interpreter, as a Karmada user's customizations expect it.
//!
//! A `ResourceInterpreterCustomization` says, in Lua, how a kind's replicas, requirements,
//! revision, retained fields, status, health, dependencies and components are read. This
//! crate runs those scripts:
//!
//! - [`sandbox`]: the Lua 5.1 state (Karmada's libraries and no others, a deadline and a
//!   memory limit per call);
//! - [`convert`]: objects into Lua tables and back, with Karmada's rules for empty tables,
//!   numbers and shared tables;
//! - [`kube`]: Karmada's `kube` library for scripts;
//! - [`ops`]: each operation, its arguments and the checks on its results;
//! - [`Customizations`]: the customizations stored, merged per kind as Karmada merges them;
//! - [`bundled`]: Orrery's own customizations of the third-party kinds Karmada interprets by
//!   default, under the user's ([`Customizations::over`]);
//! - [`answer`]: an operation answered by a customization, else by the built-in rules.
//!
//! Invariants: no I/O; every call gets a fresh state, so no script sees another's globals;
//! a script that fails says why (one line) and never panics the caller.

pub mod answer;
pub mod bundled;
pub mod convert;
pub mod kube;
pub mod ops;
pub mod sandbox;

use std::collections::BTreeMap;

use orrery_api::customization::{CustomizationSpec, Operation};

pub use answer::{Answer, Args, Source};
pub use ops::{Component, DependentObjectReference, ReplicaRequirements, ScriptError, Vm};
pub use sandbox::Limits;

/// The scripts one kind has, from every customization of it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rules {
    /// Per operation, the script and the customization it came from.
    scripts: BTreeMap<Operation, (String, String)>,
    /// Dependency scripts add up.
    dependencies: Vec<(String, String)>,
}

impl Rules {
    /// The script of an operation (for dependencies, the first), if any.
    pub fn script(&self, op: Operation) -> Option<&str> {
        if op == Operation::InterpretDependency {
            return self.dependencies.first().map(|(_, s)| s.as_str());
        }
        self.scripts.get(&op).map(|(_, s)| s.as_str())
    }

    /// The customization a script came from.
    pub fn source(&self, op: Operation) -> Option<&str> {
        if op == Operation::InterpretDependency {
            return self.dependencies.first().map(|(n, _)| n.as_str());
        }
        self.scripts.get(&op).map(|(n, _)| n.as_str())
    }

    /// Every dependency script.
    pub fn dependency_scripts(&self) -> Vec<&str> {
        self.dependencies.iter().map(|(_, s)| s.as_str()).collect()
    }
}

/// The customizations stored, per kind `(apiVersion, kind)`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Customizations {
    by_kind: BTreeMap<(String, String), Rules>,
}

impl Customizations {
    /// Merges customizations as Karmada does: in name order, the first script of an
    /// operation wins; dependency scripts add up.
    pub fn load<'a>(items: impl IntoIterator<Item = (&'a str, &'a CustomizationSpec)>) -> Self {
        let mut items: Vec<(&str, &CustomizationSpec)> = items.into_iter().collect();
        items.sort_by(|a, b| a.0.cmp(b.0));
        let mut by_kind: BTreeMap<(String, String), Rules> = BTreeMap::new();
        for (name, spec) in items {
            let key = (spec.target.api_version.clone(), spec.target.kind.clone());
            let rules = by_kind.entry(key).or_default();
            for op in Operation::ALL {
                let Some(s) = spec.customizations.script(op) else {
                    continue;
                };
                if op == Operation::InterpretDependency {
                    rules.dependencies.push((name.to_string(), s.to_string()));
                } else {
                    rules
                        .scripts
                        .entry(op)
                        .or_insert_with(|| (name.to_string(), s.to_string()));
                }
            }
        }
        Customizations { by_kind }
    }

    /// These customizations over `lower`, per kind and operation: an operation this has no
    /// script for is answered by `lower`'s (Karmada's declarative layer over its third-party
    /// one). Dependency scripts are taken whole from the first layer that has any.
    pub fn over(&self, lower: &Customizations) -> Customizations {
        let mut by_kind = lower.by_kind.clone();
        for (key, upper) in &self.by_kind {
            let rules = by_kind.entry(key.clone()).or_default();
            for (op, script) in &upper.scripts {
                rules.scripts.insert(*op, script.clone());
            }
            if !upper.dependencies.is_empty() {
                rules.dependencies = upper.dependencies.clone();
            }
        }
        Customizations { by_kind }
    }

    /// Whether a customization targets the kind.
    pub fn has(&self, api_version: &str, kind: &str) -> bool {
        self.rules(api_version, kind).is_some()
    }

    /// The scripts of a kind, if any customization targets it.
    pub fn rules(&self, api_version: &str, kind: &str) -> Option<&Rules> {
        self.by_kind
            .get(&(api_version.to_string(), kind.to_string()))
    }

    /// Each kind's scripts, `((apiVersion, kind), rules)`.
    pub fn into_kinds(self) -> impl Iterator<Item = ((String, String), Rules)> {
        self.by_kind.into_iter()
    }
}

#[cfg(test)]
mod golden;
#[cfg(test)]
mod tests;
