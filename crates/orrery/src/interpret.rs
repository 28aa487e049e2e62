//! `orrery interpret`: runs one operation of Karmada's resource interpreter on local files,
//! as `karmadactl interpret` does: with `--customization`, that file's customizations only;
//! without, what the control plane would use for the object's kind (Orrery's bundled
//! customization of a third-party kind, else the built-in rules). `--check` compiles the
//! scripts and runs nothing.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use orrery_api::customization::{CustomizationSpec, Operation};
use orrery_interpreter::{Answer, Args, Customizations, Vm, answer, bundled};
use serde_json::Value;

#[derive(clap::Args, Debug)]
pub struct InterpretArgs {
    /// A file of ResourceInterpreterCustomizations (YAML, several documents, or JSON);
    /// without it, Orrery's bundled customization of the kind, else its built-in rules.
    #[arg(long, short = 'f', visible_alias = "filename")]
    customization: Option<PathBuf>,
    /// The operation: Retain, InterpretReplica, InterpretComponent, ReviseReplica,
    /// InterpretStatus, AggregateStatus, InterpretHealth or InterpretDependency (any case).
    #[arg(long)]
    operation: Option<String>,
    /// The desired object (the template), YAML or JSON.
    #[arg(long)]
    desired_file: Option<PathBuf>,
    /// The observed object (as a member has it).
    #[arg(long)]
    observed_file: Option<PathBuf>,
    /// Karmada's AggregatedStatusItems: a YAML stream or list, or a JSON list, of
    /// `{clusterName, status, applied, health}`.
    #[arg(long)]
    status_file: Option<PathBuf>,
    /// The replicas ReviseReplica is given.
    #[arg(long, default_value_t = 0)]
    desired_replica: i64,
    /// Only compile the customizations' scripts.
    #[arg(long)]
    check: bool,
    /// `yaml` (karmadactl's layout) or `json` (one object of the results).
    #[arg(long, short = 'o', default_value = "yaml")]
    output: Format,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq)]
enum Format {
    Yaml,
    Json,
}

/// Every document of a YAML or JSON file (a JSON list or a YAML list is its items).
fn documents(path: &Path) -> anyhow::Result<Vec<Value>> {
    let text = if path == Path::new("-") {
        std::io::read_to_string(std::io::stdin())?
    } else {
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?
    };
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
        .with_context(|| format!("{} is not YAML or JSON", path.display()))?;
    Ok(docs
        .into_iter()
        .flat_map(|d| match d {
            Value::Array(items) => items,
            Value::Null => Vec::new(),
            other => vec![other],
        })
        .collect())
}

fn one(path: &Option<PathBuf>) -> anyhow::Result<Option<Value>> {
    let Some(p) = path else { return Ok(None) };
    let mut docs = documents(p)?;
    if docs.len() > 1 {
        bail!("get {} objects, expect one at most", docs.len());
    }
    Ok(docs.pop())
}

/// The customizations of a file, each `(name, spec)`.
fn customizations(path: &Path) -> anyhow::Result<Vec<(String, CustomizationSpec)>> {
    let mut out = Vec::new();
    for (i, d) in documents(path)?.into_iter().enumerate() {
        let kind = d.get("kind").and_then(Value::as_str).unwrap_or("");
        let api_version = d.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        if kind != "ResourceInterpreterCustomization" || api_version != "config.karmada.io/v1alpha1"
        {
            bail!("not a ResourceInterpreterCustomization, got {api_version}, Kind={kind}");
        }
        let name = d
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .map_or_else(|| format!("{}#{i}", path.display()), str::to_string);
        let spec: CustomizationSpec =
            serde_json::from_value(d.get("spec").cloned().unwrap_or(Value::Null))
                .with_context(|| format!("the spec of {name}"))?;
        out.push((name, spec));
    }
    Ok(out)
}

/// `--check`: each customization's target and each rule compiled, as `karmadactl`.
fn check(items: &[(String, CustomizationSpec)]) -> (String, bool) {
    let vm = Vm::default();
    let mut out = String::new();
    let mut ok = true;
    for (name, spec) in items {
        out.push_str("-----------------------------------\n");
        out.push_str(&format!("SOURCE: {name}\n"));
        if spec.target.kind.is_empty() {
            out.push_str("target.kind no set\n");
            ok = false;
            continue;
        }
        if spec.target.api_version.is_empty() {
            out.push_str("target.apiVersion no set\n");
            ok = false;
            continue;
        }
        let target = format!("TARGET: {} {}", spec.target.api_version, spec.target.kind);
        let width = Operation::ALL
            .iter()
            .map(|o| o.name().len() + 5)
            .chain([target.len()])
            .max()
            .unwrap_or(0)
            + 3;
        out.push_str(&format!("{target:width$}\nRULERS:\n"));
        for op in Operation::ALL {
            let label = format!("    {}:", op.name());
            let state = match spec.customizations.script(op) {
                None => "UNSET".to_string(),
                Some(s) => match vm.check(s) {
                    Ok(()) => "PASS".to_string(),
                    Err(e) => {
                        ok = false;
                        format!("ERROR: {}", e.trim())
                    }
                },
            };
            out.push_str(&format!("{label:width$}{state}\n"));
        }
    }
    (out, ok)
}

/// The results as `karmadactl` prints them: a YAML document per result.
fn print_yaml(results: &[(&str, Value)]) -> String {
    let n = results.len();
    let mut out = String::new();
    for (i, (name, v)) in results.iter().enumerate() {
        out.push_str(&format!("---\n# [{}/{n}] {name}:\n", i + 1));
        let y = serde_saphyr::to_string(v).unwrap_or_default();
        out.push_str(y.strip_prefix("---\n").unwrap_or(&y));
        if !out.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

/// Runs the operation; the results, or why there are none.
fn execute(
    a: &InterpretArgs,
    items: Option<&[(String, CustomizationSpec)]>,
) -> anyhow::Result<Result<Answer, String>> {
    let Some(op) = &a.operation else {
        bail!("operation is not set for executing");
    };
    let Some(op) = Operation::parse(op) else {
        bail!(
            "operation {op} is not supported. Use one of: {}",
            Operation::ALL.map(Operation::name).join(", ")
        );
    };
    let desired = one(&a.desired_file)?;
    let observed = one(&a.observed_file)?;
    match op {
        Operation::Retain => {
            if desired.is_none() {
                bail!("desired, desired-file options are not set");
            }
            if observed.is_none() {
                bail!("observed, observed-file options are not set");
            }
        }
        _ if desired.is_none() && observed.is_none() => {
            bail!("desired-file, observed-file options are not set")
        }
        _ if desired.is_some() && observed.is_some() => {
            bail!("you can not specify both desired-file and observed-file options")
        }
        _ => {}
    }
    // No file is Karmada's nil slice; a file of no items an empty list.
    let status = a.status_file.as_deref().map(documents).transpose()?;
    let args = Args {
        desired: desired.as_ref(),
        observed: observed.as_ref(),
        status: status.as_deref(),
        replica: a.desired_replica,
    };
    let answer = match items {
        Some(items) => {
            let c = Customizations::load(items.iter().map(|(n, s)| (n.as_str(), s)));
            match answer::customized(&Vm::default(), &c, op, &args) {
                None => Err("rule is not enabled".to_string()),
                Some(r) => r.map(|(a, _)| a).map_err(|e| e.message),
            }
        }
        // Without a file, as the control plane answers: Orrery's bundled customization of a
        // third-party kind, else the built-in rules.
        None => match answer::customized(&Vm::default(), bundled::customizations(), op, &args) {
            Some(r) => r.map(|(a, _)| a).map_err(|e| e.message),
            None => answer::built_in(op, &args),
        },
    };
    Ok(answer.map_err(|e| format!("Execute {} error: {e}", op.name())))
}

pub fn run(a: InterpretArgs) -> anyhow::Result<()> {
    let items = a.customization.as_deref().map(customizations).transpose()?;
    if a.check {
        let Some(items) = &items else {
            bail!("--check needs --customization");
        };
        let (text, ok) = check(items);
        print!("{text}");
        if !ok {
            std::process::exit(1);
        }
        return Ok(());
    }
    match execute(&a, items.as_deref())? {
        Ok(answer) => {
            let results = answer.results();
            match a.output {
                Format::Yaml => print!("{}", print_yaml(&results)),
                Format::Json => {
                    let m: serde_json::Map<String, Value> = results
                        .into_iter()
                        .map(|(k, v)| (k.to_string(), v))
                        .collect();
                    println!("{}", serde_json::to_string_pretty(&Value::Object(m))?);
                }
            }
            Ok(())
        }
        Err(e) => {
            // karmadactl prints this and exits 0; a script that fails is a failure here.
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_print_as_karmadactl_prints_them() {
        let out = print_yaml(&[
            ("replica", serde_json::json!(3)),
            (
                "requires",
                serde_json::json!({"resourceRequest": {"cpu": "100m"}}),
            ),
        ]);
        assert_eq!(
            out,
            "---\n# [1/2] replica:\n3\n---\n# [2/2] requires:\nresourceRequest:\n  cpu: 100m\n"
        );
    }

    #[test]
    fn check_passes_unset_and_failing_rules() {
        let spec: CustomizationSpec = serde_json::from_value(serde_json::json!({
            "target": {"apiVersion": "apps/v1", "kind": "Deployment"},
            "customizations": {
                "retention": {"luaScript": "function Retain(d, o) return d end"},
                "replicaResource": {"luaScript": "function GetReplicas(o) return format(( end"}
            }
        }))
        .unwrap();
        let (text, ok) = check(&[("customization-check".into(), spec)]);
        assert!(!ok);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[1], "SOURCE: customization-check");
        assert_eq!(lines[2].trim_end(), "TARGET: apps/v1 Deployment");
        assert_eq!(lines[3], "RULERS:");
        assert_eq!(lines[4], "    Retain:                  PASS");
        assert!(
            lines[5].starts_with("    InterpretReplica:        ERROR: "),
            "{}",
            lines[5]
        );
        assert_eq!(lines[6], "    InterpretComponent:      UNSET");
        assert_eq!(lines.len(), 12);
    }
}
