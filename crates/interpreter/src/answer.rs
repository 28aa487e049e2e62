//! One operation, whoever answers it: a customization's script, else (for the kinds Orrery
//! knows) the built-in rules. The answer carries Karmada's result names, as `karmadactl
//! interpret` prints them.

use orrery_api::customization::Operation;
use orrery_api::interpret::{self, Interpreter as BuiltIn};
use orrery_api::meta::Health;
use serde_json::{Value, json};

use crate::Customizations;
use crate::ops::{Component, DependentObjectReference, ReplicaRequirements, ScriptError, Vm};

/// What an operation is given.
#[derive(Clone, Copy, Debug, Default)]
pub struct Args<'a> {
    pub desired: Option<&'a Value>,
    pub observed: Option<&'a Value>,
    /// Karmada's `AggregatedStatusItem`s (`clusterName`, `status`, `applied`, `health`);
    /// `None` is Karmada's nil slice (nil to a script), not an empty list.
    pub status: Option<&'a [Value]>,
    /// `desiredReplica` of ReviseReplica.
    pub replica: i64,
}

/// An operation's result.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    Replica {
        replica: i32,
        requires: Option<ReplicaRequirements>,
    },
    Components(Option<Vec<Component>>),
    Revised(Value),
    Retained(Value),
    Status(Value),
    Aggregated(Value),
    Healthy(bool),
    Dependencies(Vec<DependentObjectReference>),
}

impl Answer {
    /// The results under Karmada's names, in its order.
    pub fn results(&self) -> Vec<(&'static str, Value)> {
        fn j<T: serde::Serialize>(v: &T) -> Value {
            serde_json::to_value(v).unwrap_or(Value::Null)
        }
        match self {
            Answer::Replica { replica, requires } => {
                vec![("replica", json!(replica)), ("requires", j(requires))]
            }
            Answer::Components(c) => vec![("components", j(c))],
            Answer::Revised(v) => vec![("revised", v.clone())],
            Answer::Retained(v) => vec![("retained", v.clone())],
            Answer::Status(v) => vec![("status", v.clone())],
            Answer::Aggregated(v) => vec![("aggregatedStatus", v.clone())],
            Answer::Healthy(b) => vec![("healthy", json!(b))],
            Answer::Dependencies(d) => vec![("dependencies", j(d))],
        }
    }
}

/// Who answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// A ResourceInterpreterCustomization, by name.
    Customization(String),
    /// Orrery's built-in rules for the kind.
    BuiltIn,
}

/// The object an operation is about: the desired one, else the observed one.
fn subject<'a>(args: &Args<'a>) -> Option<&'a Value> {
    args.desired.or(args.observed)
}

fn gvk(obj: &Value) -> (&str, &str) {
    (
        obj.get("apiVersion").and_then(Value::as_str).unwrap_or(""),
        obj.get("kind").and_then(Value::as_str).unwrap_or(""),
    )
}

/// Runs `op` with the customization's script of the object's kind, if there is one
/// (`None` when there is none).
pub fn customized(
    vm: &Vm,
    customizations: &Customizations,
    op: Operation,
    args: &Args<'_>,
) -> Option<Result<(Answer, Source), ScriptError>> {
    let obj = subject(args)?;
    let (api_version, kind) = gvk(obj);
    let rules = customizations.rules(api_version, kind)?;
    let script = rules.script(op)?;
    let source = Source::Customization(rules.source(op).unwrap_or_default().to_string());
    let empty = Value::Null;
    let desired = args.desired.unwrap_or(&empty);
    let observed = args.observed.unwrap_or(&empty);
    let answer = match op {
        Operation::InterpretReplica => vm
            .get_replicas(script, obj)
            .map(|(replica, requires)| Answer::Replica { replica, requires }),
        Operation::InterpretComponent => vm.get_components(script, obj).map(Answer::Components),
        Operation::ReviseReplica => vm
            .revise_replica(script, obj, args.replica)
            .map(Answer::Revised),
        Operation::Retain => vm.retain(script, desired, observed).map(Answer::Retained),
        Operation::InterpretStatus => vm.reflect_status(script, obj).map(Answer::Status),
        Operation::AggregateStatus => vm
            .aggregate_status(script, obj, args.status)
            .map(Answer::Aggregated),
        Operation::InterpretHealth => vm.interpret_health(script, obj).map(Answer::Healthy),
        Operation::InterpretDependency => vm
            .get_dependencies(&rules.dependency_scripts(), obj)
            .map(Answer::Dependencies),
    };
    Some(answer.map(|a| (a, source)))
}

/// Orrery's built-in answer for the kinds it knows: the rules the control plane applies
/// (`orrery_api::interpret`), so that what this says is what a template would get.
pub fn built_in(op: Operation, args: &Args<'_>) -> Result<Answer, String> {
    let Some(obj) = subject(args) else {
        return Err("no object given".into());
    };
    let (api_version, kind) = gvk(obj);
    let none = || {
        format!(
            "Orrery has no built-in {} for {api_version} {kind}",
            op.name()
        )
    };
    let rules = BuiltIn::BuiltIn;
    let has_pods = interpret::pod_spec_pointer(kind).is_some();
    match op {
        // Kinds placed whole (a DaemonSet, a Pod) have no replicas to divide.
        Operation::InterpretReplica if interpret::has_divisible_replicas(kind) => {
            let replica = rules.replicas(obj).unwrap_or(1);
            let request = rules.requests(obj);
            Ok(Answer::Replica {
                replica: i32::try_from(replica).unwrap_or(i32::MAX),
                requires: (!request.is_empty()).then(|| ReplicaRequirements {
                    resource_request: request,
                    ..Default::default()
                }),
            })
        }
        Operation::ReviseReplica if interpret::has_divisible_replicas(kind) => {
            let mut v = obj.clone();
            rules.set_replicas(&mut v, args.replica);
            Ok(Answer::Revised(v))
        }
        Operation::InterpretStatus => Ok(Answer::Status(
            obj.get("status").cloned().unwrap_or(Value::Null),
        )),
        Operation::InterpretHealth => {
            Ok(Answer::Healthy(interpret::health(obj).0 == Health::Healthy))
        }
        Operation::AggregateStatus => {
            let parts: Vec<(&str, &Value)> = args
                .status
                .unwrap_or_default()
                .iter()
                .filter_map(|i| {
                    Some((
                        i.get("clusterName")?.as_str()?,
                        i.get("status").filter(|s| !s.is_null())?,
                    ))
                })
                .collect();
            let mut v = obj.clone();
            if let Some(s) = rules.aggregate(kind, &parts)
                && let Some(m) = v.as_object_mut()
            {
                m.insert("status".into(), s);
            }
            Ok(Answer::Aggregated(v))
        }
        Operation::InterpretDependency if has_pods => {
            let ns = obj
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or("default");
            let deps = rules
                .dependencies(obj)
                .into_iter()
                .map(|(kind, name)| DependentObjectReference {
                    api_version: interpret::DEPENDENCY_API_VERSION.to_string(),
                    kind,
                    namespace: ns.to_string(),
                    name,
                    label_selector: None,
                })
                .collect();
            Ok(Answer::Dependencies(deps))
        }
        Operation::Retain => Err(format!(
            "Orrery has no built-in Retain for {api_version} {kind}: it applies Works with \
             server-side apply, so a member keeps the fields its own controllers own"
        )),
        _ => Err(none()),
    }
}
