//! The bundled customizations against their golden cases (Karmada's test layout: a case's
//! `output` names each result; dependencies and components compare sorted, quantities by
//! value, and `"{{EXCLUDE}}"` drops a path from both sides), and the folders against
//! [`bundled::FILES`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use orrery_api::customization::Operation;
use serde::Deserialize;
use serde_json::Value;

use crate::ops::{Component, DependentObjectReference, ReplicaRequirements};
use crate::{Args, Customizations, Vm, answer, bundled};

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Case {
    name: String,
    #[serde(default)]
    description: Option<String>,
    desired_obj: Option<Value>,
    observed_obj: Option<Value>,
    status_items: Option<Vec<Value>>,
    input_replicas: Option<i64>,
    operation: String,
    output: BTreeMap<String, Value>,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("bundled")
}

/// `group/version/Kind` of every folder holding a `customizations.yaml`.
fn folders() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let list = |p: &Path| -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_dir())
            .collect();
        v.sort();
        v
    };
    for g in list(&root()) {
        for v in list(&g) {
            for k in list(&v) {
                assert!(
                    k.join("customizations.yaml").is_file(),
                    "{} has no customizations.yaml",
                    k.display()
                );
                out.insert(k.strip_prefix(root()).unwrap().display().to_string());
            }
        }
    }
    out
}

fn sorted_deps(v: &Value) -> Vec<DependentObjectReference> {
    let mut d: Vec<DependentObjectReference> = serde_json::from_value(v.clone()).unwrap();
    d.sort_by(|a, b| {
        (&a.api_version, &a.kind, &a.namespace, &a.name).cmp(&(
            &b.api_version,
            &b.kind,
            &b.namespace,
            &b.name,
        ))
    });
    d
}

fn sorted_components(v: &Value) -> Vec<Component> {
    let mut c: Vec<Component> = serde_json::from_value(v.clone()).unwrap();
    c.sort_by(|a, b| a.name.cmp(&b.name));
    c
}

/// Drops from both the paths `want` marks `{{EXCLUDE}}`.
fn exclude(want: &Value, got: &Value) -> (Value, Value) {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            let (mut w2, mut g2) = (serde_json::Map::new(), g.clone());
            for (k, v) in w {
                if v == "{{EXCLUDE}}" {
                    g2.remove(k);
                    continue;
                }
                let (a, b) = exclude(v, g.get(k).unwrap_or(&Value::Null));
                w2.insert(k.clone(), a);
                if g.contains_key(k) {
                    g2.insert(k.clone(), b);
                }
            }
            (Value::Object(w2), Value::Object(g2))
        }
        (Value::Array(w), Value::Array(g)) if w.len() == g.len() => {
            let (a, b): (Vec<Value>, Vec<Value>) =
                w.iter().zip(g).map(|(w, g)| exclude(w, g)).unzip();
            (Value::Array(a), Value::Array(b))
        }
        _ => (want.clone(), got.clone()),
    }
}

/// Whether a result is what the case wants, compared as Karmada's harness compares it.
fn same(key: &str, want: &Value, got: &Value) -> bool {
    match key {
        "requires" => {
            let w: Option<ReplicaRequirements> = serde_json::from_value(want.clone()).unwrap();
            let g: Option<ReplicaRequirements> = serde_json::from_value(got.clone()).unwrap();
            w == g
        }
        "dependencies" => sorted_deps(want) == sorted_deps(got),
        "components" => sorted_components(want) == sorted_components(got),
        _ => {
            let (w, g) = exclude(want, got);
            w == g
        }
    }
}

#[test]
fn every_bundled_folder_is_compiled_in() {
    let listed: BTreeSet<String> = bundled::FILES.iter().map(|(p, _)| p.to_string()).collect();
    assert_eq!(folders(), listed);
    let specs = bundled::specs().unwrap();
    let names: BTreeSet<&str> = specs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.len(), specs.len(), "bundled names are unique");
    for (name, spec) in &specs {
        for op in Operation::ALL {
            if let Some(s) = spec.customizations.script(op) {
                Vm::default()
                    .check(s)
                    .unwrap_or_else(|e| panic!("{name} {}: {e}", op.name()));
            }
        }
    }
}

#[test]
fn every_bundled_kind_gives_its_answers() {
    let mut failures = Vec::new();
    let mut cases = 0;
    for (path, text) in bundled::FILES {
        let (name, spec) = bundled::parse(path, text).unwrap();
        let one = Customizations::load([(name.as_str(), &spec)]);
        let dir = root().join(path).join("testdata");
        let mut tested = BTreeSet::new();
        for op in Operation::ALL {
            if spec.customizations.script(op).is_none() {
                continue;
            }
            let file = dir.join(format!("{}-test.yaml", op.name().to_lowercase()));
            let text = std::fs::read_to_string(&file)
                .unwrap_or_else(|e| panic!("{path}: {} has no cases: {e}", op.name()));
            let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            for doc in docs.into_iter().filter(|d| !d.is_null()) {
                let case: Case = serde_json::from_value(doc)
                    .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
                let _ = &case.description;
                assert_eq!(
                    Operation::parse(&case.operation),
                    Some(op),
                    "{}: {}",
                    file.display(),
                    case.name
                );
                cases += 1;
                tested.insert(op);
                let args = Args {
                    desired: case.desired_obj.as_ref(),
                    observed: case.observed_obj.as_ref(),
                    status: case.status_items.as_deref(),
                    replica: case.input_replicas.unwrap_or(0),
                };
                let at = format!("{path} {} '{}'", op.name(), case.name);
                let (a, _) = match answer::customized(&Vm::default(), &one, op, &args) {
                    Some(Ok(a)) => a,
                    Some(Err(e)) => {
                        failures.push(format!("{at}: {e}"));
                        continue;
                    }
                    None => {
                        failures.push(format!("{at}: not answered"));
                        continue;
                    }
                };
                let results: BTreeMap<&str, Value> = a.results().into_iter().collect();
                for (key, want) in &case.output {
                    match results.get(key.as_str()) {
                        None => failures.push(format!("{at}: no result '{key}'")),
                        Some(got) if !same(key, want, got) => {
                            failures.push(format!("{at}: {key}\n  want {want}\n  got  {got}"))
                        }
                        Some(_) => {}
                    }
                }
            }
        }
        let defined: BTreeSet<Operation> = Operation::ALL
            .into_iter()
            .filter(|op| spec.customizations.script(*op).is_some())
            .collect();
        assert_eq!(
            tested, defined,
            "{path}: every operation it defines has cases"
        );
        // No case file for an operation it does not define.
        for e in std::fs::read_dir(&dir).unwrap() {
            let f = e.unwrap().file_name().to_string_lossy().to_string();
            let op = f.strip_suffix("-test.yaml").and_then(Operation::parse);
            assert!(
                op.is_some_and(|op| defined.contains(&op)),
                "{path}: {f} is not a case file of an operation it defines"
            );
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(cases >= 2 * bundled::FILES.len(), "{cases} cases");
}

#[test]
fn bundled_answers_come_after_a_users() {
    let user: orrery_api::customization::CustomizationSpec = serde_json::from_value(serde_json::json!({
        "target": {"apiVersion": "apps.kruise.io/v1alpha1", "kind": "CloneSet"},
        "customizations": {"healthInterpretation": {"luaScript": "function InterpretHealth(o) return false end"}}
    }))
    .unwrap();
    let mine = Customizations::load([("mine", &user)]);
    let both = mine.over(bundled::customizations());
    let rules = both.rules("apps.kruise.io/v1alpha1", "CloneSet").unwrap();
    assert_eq!(rules.source(Operation::InterpretHealth), Some("mine"));
    assert_eq!(
        rules.source(Operation::InterpretReplica),
        Some("bundled-cloneset.apps.kruise.io")
    );
    // A kind the user did not customize keeps every bundled script.
    assert_eq!(
        both.rules("kyverno.io/v1", "Policy"),
        bundled::customizations().rules("kyverno.io/v1", "Policy")
    );
}
