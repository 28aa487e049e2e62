//! Karmada's ResourceInterpreterCustomizations as the propagation controllers use them: each
//! kind's merged scripts behind the api's [`Scripted`], so that replicas, requests, revision,
//! health, reflected and aggregated status and dependencies come from the scripts wherever
//! they are read. A script that fails answers nothing (the interpreter underneath answers),
//! and its failure is kept until the controller reports it (an Event on the template and on
//! its binding).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use orrery_api::Object;
use orrery_api::customization::{CustomizationSpec, Operation};
use orrery_api::interpret::{
    DEPENDENCY_API_VERSION, DEPENDENCY_KINDS, Interpreter, InterpreterSpec, Scripted,
};
use orrery_api::meta::ResourceList;
use orrery_interpreter::{Customizations, Rules, Vm};
use orrery_store::Store;
use parking_lot::Mutex;
use serde_json::Value;

use super::Event;

type Key = (String, String);

/// The customizations stored, and each customized kind's scripts: the user's over Orrery's
/// bundled ones (Karmada's declarative layer over its third-party one).
#[derive(Debug)]
pub(crate) struct Customized {
    specs: BTreeMap<String, CustomizationSpec>,
    /// The user's scripts over the bundled ones, per kind.
    kinds: HashMap<Key, KindScripts>,
    /// The user's alone, for kinds the user also describes with a `ResourceInterpreter`: an
    /// explicit description is not overridden by a bundled guess.
    own: HashMap<Key, KindScripts>,
}

impl Default for Customized {
    fn default() -> Self {
        let mut c = Customized {
            specs: BTreeMap::new(),
            kinds: HashMap::new(),
            own: HashMap::new(),
        };
        c.merge();
        c
    }
}

impl Customized {
    /// Takes a customization's event; the kinds' scripts are merged again.
    pub(crate) fn follow(&mut self, ev: Event) {
        let read = |o: &Object| -> Option<CustomizationSpec> {
            serde::Deserialize::deserialize(o.spec.as_ref()?).ok()
        };
        match ev {
            Event::Listed(items) => {
                self.specs = items
                    .iter()
                    .filter_map(|o| Some((o.name().to_string(), read(o)?)))
                    .collect();
            }
            Event::Upsert(o) => match read(&o) {
                Some(s) => {
                    self.specs.insert(o.name().to_string(), s);
                }
                None => {
                    self.specs.remove(o.name());
                }
            },
            Event::Delete(o) => {
                self.specs.remove(o.name());
            }
        }
        self.merge();
    }

    fn merge(&mut self) {
        let own = Customizations::load(self.specs.iter().map(|(n, s)| (n.as_str(), s)));
        let scripts = |c: Customizations| -> HashMap<Key, KindScripts> {
            c.into_kinds()
                .map(|(k, rules)| (k, KindScripts::new(rules)))
                .collect()
        };
        self.kinds = scripts(own.over(orrery_interpreter::bundled::customizations()));
        self.own = scripts(own);
    }

    /// How a template is interpreted: its kind's customizations over its `ResourceInterpreter`
    /// (from `specs`) or the built-in rules.
    pub(crate) fn interpreter<'a>(
        &'a self,
        specs: &'a HashMap<Key, InterpreterSpec>,
        t: &Object,
    ) -> Interpreter<'a> {
        let custom = specs.get(&(t.api_version.clone(), t.kind.clone()));
        match self.of(specs, &t.api_version, &t.kind) {
            Some(s) => Interpreter::Customized(s, custom),
            None => custom
                .map(Interpreter::Custom)
                .unwrap_or(Interpreter::BuiltIn),
        }
    }

    /// The scripts a kind is interpreted with, if any (given the `ResourceInterpreter`s).
    pub(crate) fn of(
        &self,
        specs: &HashMap<Key, InterpreterSpec>,
        api_version: &str,
        kind: &str,
    ) -> Option<&KindScripts> {
        let key = (api_version.to_string(), kind.to_string());
        if specs.contains_key(&key) {
            self.own.get(&key)
        } else {
            self.kinds.get(&key)
        }
    }
}

/// A failed script: the operation, the customization it came from, and why.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Failure {
    pub(crate) operation: Operation,
    pub(crate) customization: String,
    pub(crate) message: String,
}

impl Failure {
    /// What the Events say.
    pub(crate) fn text(&self) -> String {
        format!(
            "{} of ResourceInterpreterCustomization {} failed: {}; the built-in answer is used",
            self.operation.name(),
            self.customization,
            self.message
        )
    }
}

/// One kind's merged scripts.
#[derive(Debug)]
pub(crate) struct KindScripts {
    rules: Rules,
    vm: Vm,
    failures: Mutex<Vec<Failure>>,
}

impl KindScripts {
    fn new(rules: Rules) -> Self {
        KindScripts {
            rules,
            vm: Vm::default(),
            failures: Mutex::new(Vec::new()),
        }
    }

    /// The failures since the last call.
    pub(crate) fn take_failures(&self) -> Vec<Failure> {
        std::mem::take(&mut *self.failures.lock())
    }

    fn failed(&self, operation: Operation, message: String) {
        let f = Failure {
            operation,
            customization: self.rules.source(operation).unwrap_or_default().to_string(),
            message,
        };
        let mut all = self.failures.lock();
        if !all.contains(&f) {
            all.push(f);
        }
    }

    /// The script's answer, or `None` (no script, or it failed and the failure is kept).
    fn answer<T>(
        &self,
        op: Operation,
        run: impl FnOnce(&Vm, &str) -> Result<T, orrery_interpreter::ScriptError>,
    ) -> Option<T> {
        let script = self.rules.script(op)?;
        match run(&self.vm, script) {
            Ok(v) => Some(v),
            Err(e) => {
                self.failed(op, e.message);
                None
            }
        }
    }
}

impl Scripted for KindScripts {
    fn replicas(&self, obj: &Value) -> Option<(i64, ResourceList)> {
        self.answer(Operation::InterpretReplica, |vm, s| vm.get_replicas(s, obj))
            .map(|(n, req)| {
                let requests = req.map(|r| r.resource_request).unwrap_or_default();
                (i64::from(n), requests)
            })
    }

    fn revise(&self, obj: &Value, replicas: i64) -> Option<Value> {
        self.answer(Operation::ReviseReplica, |vm, s| {
            vm.revise_replica(s, obj, replicas)
        })
    }

    fn healthy(&self, observed: &Value) -> Option<bool> {
        self.answer(Operation::InterpretHealth, |vm, s| {
            vm.interpret_health(s, observed)
        })
    }

    fn reflect(&self, observed: &Value) -> Option<Value> {
        self.answer(Operation::InterpretStatus, |vm, s| {
            vm.reflect_status(s, observed)
        })
    }

    fn aggregate(&self, desired: &Value, items: &[Value]) -> Option<Value> {
        self.answer(Operation::AggregateStatus, |vm, s| {
            // A binding with no items has none (Karmada's nil slice), not an empty list.
            vm.aggregate_status(s, desired, (!items.is_empty()).then_some(items))
        })
    }

    fn components(&self, obj: &Value) -> Option<Vec<orrery_api::binding::Component>> {
        let found = self.answer(Operation::InterpretComponent, |vm, s| {
            vm.get_components(s, obj)
        })??;
        Some(
            found
                .into_iter()
                .map(|c| orrery_api::binding::Component {
                    name: c.name,
                    replicas: i64::from(c.replicas),
                    replica_requirements: c
                        .replica_requirements
                        .filter(|r| !r.resource_request.is_empty())
                        .map(|r| orrery_api::binding::ReplicaRequirements {
                            resource_request: r.resource_request.into_iter().collect(),
                        }),
                })
                .collect(),
        )
    }

    fn retain_script(&self) -> Option<(String, String)> {
        let script = self.rules.script(Operation::Retain)?;
        let source = self.rules.source(Operation::Retain).unwrap_or_default();
        Some((source.to_string(), script.to_string()))
    }

    fn dependencies(&self, obj: &Value) -> Option<Vec<(String, String)>> {
        let scripts = self.rules.dependency_scripts();
        if scripts.is_empty() {
            return None;
        }
        let refs = match self.vm.get_dependencies(&scripts, obj) {
            Ok(r) => r,
            Err(e) => {
                self.failed(Operation::InterpretDependency, e.message);
                return None;
            }
        };
        let ns = obj
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("");
        let mut out = Vec::new();
        for r in refs {
            let core = r.api_version == DEPENDENCY_API_VERSION
                && DEPENDENCY_KINDS.iter().any(|(k, _)| *k == r.kind);
            if core && !r.name.is_empty() && (r.namespace.is_empty() || r.namespace == ns) {
                out.push((r.kind, r.name));
            } else {
                // Said, not dropped in silence.
                self.failed(
                    Operation::InterpretDependency,
                    format!(
                        "{} {} {}/{}: Orrery propagates only ConfigMaps, Secrets, \
                         ServiceAccounts and PersistentVolumeClaims named in the template's \
                         namespace",
                        r.api_version,
                        r.kind,
                        r.namespace,
                        if r.name.is_empty() {
                            "(by selector)"
                        } else {
                            &r.name
                        }
                    ),
                );
            }
        }
        Some(out)
    }
}

/// A job that tells each failure ([`Failure::text`], or a member's) once, on the template
/// and on its binding.
pub(crate) fn report<K: Send + 'static>(
    store: Arc<dyn Store>,
    failures: Vec<String>,
    template: Arc<Object>,
    binding: Option<Arc<Object>>,
) -> super::Job<K> {
    Box::pin(async move {
        for text in failures {
            for about in std::iter::once(&template).chain(binding.iter()) {
                // Once per object and message (the Event's name is made of 16 hex digits).
                let mut h = std::collections::hash_map::DefaultHasher::new();
                std::hash::Hash::hash(&(&about.metadata.uid, &text), &mut h);
                let key = format!("{:016x}", std::hash::Hasher::finish(&h));
                // An Event that cannot be written is not worth retrying the binding for.
                let _ = crate::record::event_once_for(
                    store.as_ref(),
                    about,
                    &key,
                    "Warning",
                    "InterpretFailed",
                    &text,
                    "orrery-propagation",
                )
                .await;
            }
        }
        Ok(())
    })
}
