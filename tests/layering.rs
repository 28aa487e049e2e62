//! The layering, checked: each crate depends only on the crates ARCHITECTURE.md allows it
//! (the block under "Dependencies point down"), and no crate's top-level modules depend on
//! each other in a cycle (an edge is a `crate::<module>` path outside comments and test
//! modules). Reads the sources; starts nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `crate: allowed, allowed` lines of ARCHITECTURE.md's `crate-edges` block.
fn allowed() -> BTreeMap<String, BTreeSet<String>> {
    let doc = std::fs::read_to_string(repo().join("ARCHITECTURE.md")).unwrap();
    let block = doc
        .split("```crate-edges\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("ARCHITECTURE.md has a ```crate-edges block");
    block
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (name, deps) = l.split_once(':').expect("`crate: deps`");
            (
                name.trim().to_string(),
                deps.split_whitespace().map(String::from).collect(),
            )
        })
        .collect()
}

/// Each workspace crate's directory and its `orrery-*` dependencies (not dev-dependencies).
fn crates() -> BTreeMap<String, (PathBuf, BTreeSet<String>)> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(repo().join("crates")).unwrap() {
        let dir = e.unwrap().path();
        let Ok(toml) = std::fs::read_to_string(dir.join("Cargo.toml")) else {
            continue;
        };
        let name = toml
            .lines()
            .find_map(|l| l.strip_prefix("name = \""))
            .and_then(|l| l.strip_suffix('"'))
            .unwrap()
            .to_string();
        let deps = toml
            .split("\n[dependencies]\n")
            .nth(1)
            .map(|d| d.split("\n[").next().unwrap_or(""))
            .unwrap_or("")
            .lines()
            .filter_map(|l| l.split(['.', ' ', '=']).next())
            .filter(|d| d.starts_with("orrery"))
            .map(String::from)
            .collect();
        out.insert(name, (dir, deps));
    }
    out
}

/// Without comments and without what follows the first `#[cfg(test)]` (test modules sit at
/// the end of a file here).
fn code(src: &str) -> String {
    let src = src.split("#[cfg(test)]").next().unwrap_or("");
    src.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every `.rs` file below `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// A crate's top-level modules and the `crate::` modules each refers to.
fn module_edges(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut of: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(src).unwrap();
        let top = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        if top == "lib" || top == "main" || top == "bin" {
            continue;
        }
        of.entry(top).or_default().push(f);
    }
    // `crate::Item` where the root re-exports `pub use m::Item` is an edge to `m` too.
    let mut reexported: BTreeMap<String, String> = BTreeMap::new();
    for root in ["lib.rs", "main.rs"] {
        let Ok(text) = std::fs::read_to_string(src.join(root)) else {
            continue;
        };
        for item in code(&text).split(';') {
            let Some(rest) = item.trim().strip_prefix("pub use ") else {
                continue;
            };
            let Some((m, names)) = rest.split_once("::") else {
                continue;
            };
            for n in names.split(|c: char| !(c.is_alphanumeric() || c == '_')) {
                if !n.is_empty() && n != "self" {
                    reexported.insert(n.to_string(), m.trim().to_string());
                }
            }
        }
    }
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, files) in &of {
        let e = edges.entry(m.clone()).or_default();
        for f in files {
            let c = code(&std::fs::read_to_string(f).unwrap());
            for (i, _) in c.match_indices("crate::") {
                if i > 0 && c[..i].ends_with(|ch: char| ch.is_alphanumeric() || ch == '_') {
                    continue;
                }
                let t: String = c[i + 7..]
                    .chars()
                    .take_while(|ch| ch.is_alphanumeric() || *ch == '_')
                    .collect();
                let t = match reexported.get(&t) {
                    Some(module) if !of.contains_key(&t) => module.clone(),
                    _ => t,
                };
                if of.contains_key(&t) && t != *m {
                    e.insert(t);
                }
            }
        }
    }
    edges
}

/// The strongly connected components of more than one module (Tarjan).
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        e: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let n = t.index.len();
        t.index.insert(v, n);
        t.low.insert(v, n);
        t.stack.push(v);
        t.on.insert(v);
        for w in t.e.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !t.index.contains_key(w) {
                visit(t, w);
                let l = t.low[v].min(t.low[w]);
                t.low.insert(v, l);
            } else if t.on.contains(w) {
                let l = t.low[v].min(t.index[w]);
                t.low.insert(v, l);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        e: edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

#[test]
fn every_crate_depends_only_on_what_architecture_md_allows() {
    let allowed = allowed();
    let mut wrong = Vec::new();
    for (name, (_, deps)) in crates() {
        let Some(ok) = allowed.get(&name) else {
            wrong.push(format!(
                "{name} is not in ARCHITECTURE.md's crate-edges block"
            ));
            continue;
        };
        for d in deps.difference(ok) {
            wrong.push(format!(
                "{name} depends on {d}, which ARCHITECTURE.md does not allow"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn no_crate_has_a_module_cycle() {
    let mut found = Vec::new();
    for (name, (dir, _)) in crates() {
        for c in cycles(&module_edges(&dir.join("src"))) {
            found.push(format!("{name}: {}", c.join(" <-> ")));
        }
    }
    assert!(found.is_empty(), "module cycles:\n{}", found.join("\n"));
}

/// The check finds a cycle when there is one (so that it cannot pass by finding nothing).
#[test]
fn the_cycle_check_finds_a_cycle() {
    let e: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(cycles(&e), vec![vec!["a", "b", "c"]]);
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path();
    std::fs::write(src.join("lib.rs"), "mod x; mod y;").unwrap();
    std::fs::write(
        src.join("x.rs"),
        "use crate::y::B; // crate::z in a comment\n",
    )
    .unwrap();
    std::fs::write(src.join("y.rs"), "pub struct B; fn f() { crate::x::g() }").unwrap();
    assert_eq!(cycles(&module_edges(src)), vec![vec!["x", "y"]]);
    // Through an item the root re-exports.
    std::fs::write(src.join("lib.rs"), "mod x; mod y; pub use x::{G, H};").unwrap();
    std::fs::write(
        src.join("y.rs"),
        "pub struct B; fn f() -> crate::G { todo() }",
    )
    .unwrap();
    assert_eq!(cycles(&module_edges(src)), vec![vec!["x", "y"]]);
}

/// The longest function (in lines) that needs no word of why: ARCHITECTURE.md's "no function
/// over ~150 lines".
const LONGEST_FN: usize = 160;
/// The most lines of non-test code in one file.
const LONGEST_FILE: usize = 1500;
/// What a long function's doc comment says to be let off: it is a data table, or why it is
/// long.
const WHY_LONG: &[&str] = &["a data table", "is long because"];

/// Where a function starts on this line: its indentation, if the line opens a function body
/// that ends on a later line.
fn fn_start(line: &str) -> Option<&str> {
    let t = line.trim_start();
    let indent = &line[..line.len() - t.len()];
    let mut rest = t;
    for p in [
        "pub(crate) ",
        "pub(super) ",
        "pub ",
        "const ",
        "async ",
        "unsafe ",
    ] {
        rest = rest.strip_prefix(p).unwrap_or(rest);
    }
    let rest = rest.strip_prefix("async ").unwrap_or(rest);
    (rest.starts_with("fn ") && !t.ends_with(';') && !t.ends_with('}')).then_some(indent)
}

/// Files over [`LONGEST_FILE`] lines of non-test code, and functions over [`LONGEST_FN`]
/// lines whose doc comment does not say why (see [`WHY_LONG`]), in `src` (generated files and
/// test modules aside).
fn too_long(src: &Path) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let mut wrong = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let rel = f.strip_prefix(repo()).unwrap_or(&f).display().to_string();
        if text.starts_with("// This file is @generated") || f.ends_with("tests.rs") {
            continue;
        }
        let lines: Vec<&str> = text.lines().collect();
        let end = lines
            .iter()
            .position(|l| l.starts_with("#[cfg(test)]"))
            .unwrap_or(lines.len());
        if end > LONGEST_FILE {
            wrong.push(format!("{rel}: {end} lines of non-test code"));
        }
        let mut i = 0;
        while i < end {
            let Some(indent) = fn_start(lines[i]) else {
                i += 1;
                continue;
            };
            let close = format!("{indent}}}");
            let Some(j) = (i + 1..end).find(|&j| lines[j] == close) else {
                break;
            };
            let len = j - i + 1;
            let doc: String = lines[..i]
                .iter()
                .rev()
                .take_while(|l| {
                    let t = l.trim_start();
                    t.starts_with("///") || t.starts_with("#[")
                })
                .map(|l| l.to_string() + " ")
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            let doc = doc.split_whitespace().collect::<Vec<_>>().join(" ");
            let doc = doc.replace("/// ", "");
            if len > LONGEST_FN && !WHY_LONG.iter().any(|w| doc.contains(w)) {
                let name = lines[i].trim();
                wrong.push(format!("{rel}:{}: {len} lines: {name}", i + 1));
            }
            i += 1;
        }
    }
    wrong
}

#[test]
fn files_and_functions_stay_short_unless_they_say_why() {
    let mut wrong = Vec::new();
    for (_, (dir, _)) in crates() {
        wrong.extend(too_long(&dir.join("src")));
    }
    assert!(wrong.is_empty(), "too long:\n{}", wrong.join("\n"));
}

/// The length check finds a long function, and lets one off that says why.
#[test]
fn the_length_check_finds_a_long_function() {
    let tmp = tempfile::tempdir().unwrap();
    let body = "    let x = 1;\n".repeat(LONGEST_FN);
    let src = format!(
        "fn short() {{\n}}\n\nfn long() {{\n{body}}}\n\n/// A map: a data table.\nfn table() {{\n{body}}}\n\nimpl A {{\n    pub async fn method(&self) {{\n    {body}    }}\n}}\n"
    );
    std::fs::write(tmp.path().join("lib.rs"), src).unwrap();
    let found = too_long(tmp.path());
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].contains("fn long()"), "{found:?}");
    assert!(found[1].contains("pub async fn method"), "{found:?}");
}
