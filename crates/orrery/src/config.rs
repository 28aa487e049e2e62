//! `--config FILE` for `orrery server` and `orrery agent`: a YAML mapping whose keys are the
//! command's flags, by the same names (`listen: 0.0.0.0:6443`, `tls-san: [a, b]`). A flag on
//! the command line wins over `ORRERY_<FLAG>` in the environment (`ORRERY_LISTEN`), which wins
//! over the file; a key that is no flag of the command is an error naming it.
//!
//! The file and the environment are turned into command-line arguments ahead of clap, so that
//! every flag's parser, default and conflicts apply to them as to the command line.
//! `--print-config` prints the effective configuration (with where each value came from),
//! secrets redacted.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;

use clap::ArgAction;
use serde_json::Value;

/// The commands that read a configuration file.
pub const COMMANDS: &[&str] = &["server", "agent"];

/// Flags that are not configuration.
const NOT_KEYS: &[&str] = &["config", "print-config", "help", "version", "log-format"];

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("--config needs a file")]
    NoFile,
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
    #[error("{path}: {keys} {verb} no flag of `orrery {command}` (see `orrery {command} --help`)")]
    Unknown {
        path: String,
        keys: String,
        verb: &'static str,
        command: String,
    },
    #[error("{origin} {key}: {message}")]
    Value {
        origin: String,
        key: String,
        message: String,
    },
}

/// Where a flag's value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Flag,
    Env,
    File,
    Default,
}

impl Source {
    fn word(self) -> &'static str {
        match self {
            Source::Flag => "flag",
            Source::Env => "environment",
            Source::File => "config file",
            Source::Default => "default",
        }
    }
}

/// The arguments to give clap, and where each flag set by the file or the environment came
/// from.
#[derive(Debug)]
pub struct Expanded {
    pub args: Vec<OsString>,
    pub sources: BTreeMap<String, Source>,
}

/// The index of the subcommand in `argv`, if it is one of [`COMMANDS`].
fn subcommand(argv: &[OsString]) -> Option<usize> {
    let mut i = 1;
    while i < argv.len() {
        let a = argv[i].to_string_lossy();
        if a == "--log-format" {
            i += 2;
            continue;
        }
        if a.starts_with('-') {
            i += 1;
            continue;
        }
        return COMMANDS.contains(&a.as_ref()).then_some(i);
    }
    None
}

/// The environment variable of a flag.
pub fn env_name(long: &str) -> String {
    format!("ORRERY_{}", long.replace('-', "_").to_uppercase())
}

/// Adds the file's and the environment's values to `argv` for the flags the command line does
/// not set. `env` reads the environment (a parameter, for tests).
pub fn expand(
    argv: Vec<OsString>,
    cli: &clap::Command,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Expanded, ConfigError> {
    let mut sources = BTreeMap::new();
    let found = subcommand(&argv).and_then(|at| {
        let name = argv[at].to_string_lossy().to_string();
        cli.find_subcommand(&name).map(|cmd| (at, name, cmd))
    });
    let Some((at, name, cmd)) = found else {
        return Ok(Expanded {
            args: argv,
            sources,
        });
    };
    let rest: Vec<String> = argv[at + 1..]
        .iter()
        .map(|a| a.to_string_lossy().to_string())
        .collect();
    // The flags given on the command line (`--x v`, `--x=v`, `--x`).
    let given: BTreeSet<String> = rest
        .iter()
        .take_while(|a| *a != "--")
        .filter_map(|a| a.strip_prefix("--"))
        .map(|a| a.split('=').next().unwrap_or(a).to_string())
        .collect();
    let file = match rest.iter().position(|a| a == "--config") {
        Some(i) => Some(rest.get(i + 1).cloned().ok_or(ConfigError::NoFile)?),
        None => rest
            .iter()
            .find_map(|a| a.strip_prefix("--config=").map(str::to_string))
            .or_else(|| env("ORRERY_CONFIG")),
    };
    let doc = match &file {
        Some(path) => load(path)?,
        None => BTreeMap::new(),
    };
    let flags: BTreeMap<String, &clap::Arg> = cmd
        .get_arguments()
        .filter_map(|a| a.get_long().map(|l| (l.to_string(), a)))
        .filter(|(l, _)| !NOT_KEYS.contains(&l.as_str()))
        .collect();
    let unknown: Vec<&String> = doc.keys().filter(|k| !flags.contains_key(*k)).collect();
    if !unknown.is_empty() {
        return Err(ConfigError::Unknown {
            path: file.unwrap_or_default(),
            keys: unknown
                .iter()
                .map(|k| format!("{k:?}"))
                .collect::<Vec<_>>()
                .join(", "),
            verb: if unknown.len() == 1 { "is" } else { "are" },
            command: name,
        });
    }
    let mut added: Vec<OsString> = Vec::new();
    for (long, arg) in &flags {
        if given.contains(long) {
            sources.insert(long.clone(), Source::Flag);
            continue;
        }
        // A flag clap reads from a variable of its own (ORRERY_TOKEN, ORRERY_DATA_DIR) is
        // read there, by clap, ahead of the file.
        let own = arg.get_env().map(|e| e.to_string_lossy().to_string());
        let var = own.clone().unwrap_or_else(|| env_name(long));
        if let Some(v) = env(&var) {
            if own.is_none() {
                push(&mut added, long, arg, &[v], &format!("${var}"))?;
            }
            sources.insert(long.clone(), Source::Env);
            continue;
        }
        if let Some(v) = doc.get(long) {
            let origin = file.clone().unwrap_or_default();
            let values = scalars(v).map_err(|message| ConfigError::Value {
                origin: origin.clone(),
                key: long.clone(),
                message,
            })?;
            push(&mut added, long, arg, &values, &origin)?;
            sources.insert(long.clone(), Source::File);
        }
    }
    let mut args = argv;
    // After the subcommand's own arguments would put them after a `--`; before them is as
    // good for clap.
    let tail = args.split_off(at + 1);
    args.extend(added);
    args.extend(tail);
    Ok(Expanded { args, sources })
}

fn load(path: &str) -> Result<BTreeMap<String, Value>, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_string(),
        source,
    })?;
    let invalid = |message: String| ConfigError::Invalid {
        path: path.to_string(),
        message,
    };
    if text.trim().is_empty() {
        return Ok(BTreeMap::new());
    }
    let v: Value = serde_saphyr::from_str(&text).map_err(|e| invalid(e.to_string()))?;
    match v {
        Value::Null => Ok(BTreeMap::new()),
        Value::Object(m) => Ok(m.into_iter().collect()),
        _ => Err(invalid(
            "a mapping of flags to values is expected (listen: 127.0.0.1:6443)".into(),
        )),
    }
}

/// A value of the file as the strings of a command line.
fn scalars(v: &Value) -> Result<Vec<String>, String> {
    let one = |v: &Value| match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        Value::Null => Err("has no value".to_string()),
        _ => Err("a value, or a list of values, is expected".to_string()),
    };
    match v {
        Value::Array(items) => items.iter().map(one).collect(),
        v => one(v).map(|s| vec![s]),
    }
}

fn push(
    out: &mut Vec<OsString>,
    long: &str,
    arg: &clap::Arg,
    values: &[String],
    origin: &str,
) -> Result<(), ConfigError> {
    let bad = |message: String| ConfigError::Value {
        origin: origin.to_string(),
        key: long.to_string(),
        message,
    };
    match arg.get_action() {
        ArgAction::SetTrue | ArgAction::SetFalse => {
            let [v] = values else {
                return Err(bad("one true or false".into()));
            };
            match v.as_str() {
                "true" | "1" => out.push(format!("--{long}").into()),
                "false" | "0" | "" => {}
                _ => return Err(bad(format!("{v:?} is not true or false"))),
            }
        }
        ArgAction::Append => {
            for v in values {
                out.push(format!("--{long}={v}").into());
            }
        }
        _ => {
            // One value; a list is given as the flag's own delimiter would (tls-san: [a, b]).
            let joined = match (values, arg.get_value_delimiter()) {
                ([v], _) => v.clone(),
                (vs, Some(d)) => vs.join(&d.to_string()),
                _ => return Err(bad("takes one value, not a list".into())),
            };
            out.push(format!("--{long}={joined}").into());
        }
    }
    Ok(())
}

/// The effective configuration of `cmd` as YAML: every flag with its value and where it came
/// from; secrets (flags whose environment values clap hides) redacted.
pub fn print(
    cmd: &clap::Command,
    m: &clap::ArgMatches,
    sources: &BTreeMap<String, Source>,
) -> String {
    let mut out =
        String::from("# the effective configuration: flag > environment > config file > default\n");
    for arg in cmd.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if NOT_KEYS.contains(&long) {
            continue;
        }
        let id = arg.get_id().as_str();
        let raw: Vec<String> = m
            .get_raw(id)
            .map(|vs| vs.map(|v| v.to_string_lossy().to_string()).collect())
            .unwrap_or_default();
        let source = match m.value_source(id) {
            Some(clap::parser::ValueSource::DefaultValue) => Source::Default,
            Some(clap::parser::ValueSource::EnvVariable) => Source::Env,
            None => Source::Default,
            Some(_) => sources.get(long).copied().unwrap_or(Source::Flag),
        };
        let value = if matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse) {
            raw.first().cloned().unwrap_or_else(|| "false".into())
        } else if raw.is_empty() {
            "null".to_string()
        } else if arg.is_hide_env_values_set() {
            "\"(redacted)\"".to_string()
        } else if raw.len() == 1 && !matches!(arg.get_action(), ArgAction::Append) {
            yaml_scalar(&raw[0])
        } else {
            format!(
                "[{}]",
                raw.iter()
                    .map(|v| yaml_scalar(v))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        out.push_str(&format!("{long}: {value}  # {}\n", source.word()));
    }
    out
}

/// A string as a YAML scalar: quoted when YAML would read it as something else.
fn yaml_scalar(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "./-_:@".contains(c))
        && !s.starts_with(['-', ':', '@'])
        && !s.contains(": ")
        && !matches!(s, "null" | "~");
    if plain {
        s.to_string()
    } else {
        serde_json::to_string(s).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches};
    use std::path::PathBuf;

    #[derive(clap::Parser, Debug)]
    struct Cli {
        #[command(subcommand)]
        cmd: Cmd,
    }
    #[derive(clap::Subcommand, Debug)]
    enum Cmd {
        Server(Args),
    }
    #[derive(clap::Args, Debug)]
    struct Args {
        #[arg(long)]
        config: Option<PathBuf>,
        #[arg(long)]
        print_config: bool,
        #[arg(long, default_value = "127.0.0.1:6443")]
        listen: String,
        #[arg(long = "tls-san")]
        tls_san: Vec<String>,
        #[arg(long, value_delimiter = ',', default_value = "http://a")]
        etcd_endpoints: Vec<String>,
        #[arg(long)]
        verbose: bool,
        #[arg(long, default_value_t = 5)]
        count: u32,
        #[arg(long, env = "ORRERY_SECRET_THING", hide_env_values = true)]
        secret_thing: Option<String>,
    }

    fn parse(argv: &[&str], file: &str, env: &[(&str, &str)]) -> Result<(Args, String), String> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.yaml");
        std::fs::write(&path, file).unwrap();
        let mut args: Vec<OsString> = argv.iter().map(OsString::from).collect();
        args.push("--config".into());
        args.push(path.clone().into());
        let env: BTreeMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let cli = Cli::command();
        let e = expand(args, &cli, &|k| env.get(k).cloned()).map_err(|e| e.to_string())?;
        let m = cli
            .clone()
            .try_get_matches_from(e.args)
            .map_err(|e| e.to_string())?;
        let sub = m.subcommand_matches("server").unwrap();
        let printed = print(cli.find_subcommand("server").unwrap(), sub, &e.sources);
        let Cmd::Server(a) = Cli::from_arg_matches(&m).unwrap().cmd;
        Ok((a, printed))
    }

    #[test]
    fn flag_over_environment_over_file_over_default() {
        let file = "listen: 0.0.0.0:1\ntls-san: [a.example, b.example]\netcd-endpoints: [http://x, http://y]\nverbose: true\ncount: 7\nsecret-thing: hush\n";
        let (a, printed) = parse(&["orrery", "server"], file, &[]).unwrap();
        assert_eq!(a.listen, "0.0.0.0:1");
        assert_eq!(a.tls_san, ["a.example", "b.example"]);
        assert_eq!(a.etcd_endpoints, ["http://x", "http://y"]);
        assert!(a.verbose);
        assert_eq!(a.count, 7);
        assert_eq!(a.secret_thing.as_deref(), Some("hush"));
        assert!(
            printed.contains("listen: 0.0.0.0:1  # config file"),
            "{printed}"
        );
        assert!(
            printed.contains("secret-thing: \"(redacted)\""),
            "{printed}"
        );
        assert!(!printed.contains("hush"), "{printed}");
        assert!(
            printed.contains("tls-san: [a.example, b.example]"),
            "{printed}"
        );

        let (a, printed) = parse(
            &["orrery", "server"],
            file,
            &[("ORRERY_LISTEN", "0.0.0.0:2"), ("ORRERY_COUNT", "8")],
        )
        .unwrap();
        assert_eq!((a.listen.as_str(), a.count), ("0.0.0.0:2", 8));
        assert!(
            printed.contains("listen: 0.0.0.0:2  # environment"),
            "{printed}"
        );

        let (a, printed) = parse(
            &["orrery", "server", "--listen", "0.0.0.0:3", "--count=9"],
            file,
            &[("ORRERY_LISTEN", "0.0.0.0:2")],
        )
        .unwrap();
        assert_eq!((a.listen.as_str(), a.count), ("0.0.0.0:3", 9));
        assert!(printed.contains("listen: 0.0.0.0:3  # flag"), "{printed}");

        let (a, printed) = parse(&["orrery", "server"], "", &[]).unwrap();
        assert_eq!(a.listen, "127.0.0.1:6443");
        assert!(!a.verbose);
        assert!(
            printed.contains("listen: 127.0.0.1:6443  # default"),
            "{printed}"
        );
        assert!(printed.contains("verbose: false  # default"), "{printed}");
    }

    #[test]
    fn bad_files_are_refused_with_the_key() {
        let e = parse(&["orrery", "server"], "listen: x\nlisten-addr: y\n", &[]).unwrap_err();
        assert!(
            e.contains("\"listen-addr\" is no flag of `orrery server`"),
            "{e}"
        );
        let e = parse(&["orrery", "server"], "verbose: maybe\n", &[]).unwrap_err();
        assert!(
            e.contains("verbose") && e.contains("not true or false"),
            "{e}"
        );
        let e = parse(&["orrery", "server"], "listen: {a: 1}\n", &[]).unwrap_err();
        assert!(e.contains("listen"), "{e}");
        let e = parse(&["orrery", "server"], "- listen\n", &[]).unwrap_err();
        assert!(e.contains("a mapping"), "{e}");
        // A value clap refuses is refused as a flag's would be.
        let e = parse(&["orrery", "server"], "count: many\n", &[]).unwrap_err();
        assert!(e.contains("many"), "{e}");
        let e = parse(&["orrery", "server"], "listen: [a, b]\n", &[]).unwrap_err();
        assert!(e.contains("not a list"), "{e}");
    }
}
