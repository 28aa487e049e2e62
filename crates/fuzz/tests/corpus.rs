//! The fuzz targets without a fuzzer: every input of the checked-in corpus
//! (`fuzz/corpus/<target>/`) and every crash found (`fuzz/regressions/<target>/`) is run
//! through its target, then a few hundred mutations of each seed, drawn from a fixed seed.
//! A regression that comes back fails here, in the ordinary test run.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

fn inputs(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<(PathBuf, Vec<u8>)> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect();
    out.sort();
    out
}

/// Runs `f` on `data`, naming the input if it panics.
fn run(name: &str, what: &str, f: fn(&[u8]), data: &[u8]) {
    if std::panic::catch_unwind(|| f(data)).is_err() {
        panic!(
            "{name}: {what} fails ({} bytes: {:?})",
            data.len(),
            String::from_utf8_lossy(data)
        );
    }
}

#[test]
fn every_target_has_a_corpus_and_a_fuzz_target_file() {
    let listed: Vec<&str> = orrery_fuzz::TARGETS.iter().map(|(n, _)| *n).collect();
    for name in &listed {
        assert!(
            !inputs(&fuzz_dir().join("corpus").join(name)).is_empty(),
            "{name} has no seed corpus"
        );
        let file = fuzz_dir().join("fuzz_targets").join(format!("{name}.rs"));
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        assert!(
            text.contains(&format!("orrery_fuzz::{name}(")),
            "{} does not call orrery_fuzz::{name}",
            file.display()
        );
    }
    // And nothing under fuzz_targets/ that is not a target here.
    for (p, _) in inputs(&fuzz_dir().join("fuzz_targets")) {
        let stem = p.file_stem().unwrap().to_string_lossy().to_string();
        assert!(listed.contains(&stem.as_str()), "{stem} is not in TARGETS");
    }
}

#[test]
fn the_corpus_and_every_crash_found_run_clean() {
    for (name, f) in orrery_fuzz::TARGETS {
        for sub in ["corpus", "regressions"] {
            for (p, data) in inputs(&fuzz_dir().join(sub).join(name)) {
                run(name, &p.display().to_string(), *f, &data);
            }
        }
    }
}

/// A fixed sequence (SplitMix64): the same mutations every run.
struct Rng(u64);

impl Rng {
    fn new() -> Self {
        Rng(0x5eed)
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let z = (self.0 ^ (self.0 >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        let z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Bytes worth putting in: the syntax the parsers split on.
const TOKENS: &[&[u8]] = &[
    b",",
    b"=",
    b"!=",
    b"(",
    b")",
    b"in",
    b"notin",
    b"!",
    b"{",
    b"}",
    b"[",
    b"]",
    b":",
    b"\"",
    b"null",
    b"$patch",
    b"delete",
    b"f:",
    b"k:",
    b"\x00",
    b"\xff",
    b"e9",
    b"Ki",
    b"-",
    b".",
    b"end",
    b"function",
    b"&a",
    b"*a",
];

fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(v.len() + 1);
        match rng.below(5) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let end = (at + 1 + rng.below(8)).min(v.len());
                v.drain(at.min(end)..end);
            }
            2 => {
                let t = TOKENS[rng.below(TOKENS.len())];
                v.splice(at..at, t.iter().copied());
            }
            3 if !v.is_empty() => {
                // A piece of itself again (nesting, repeats).
                let from = rng.below(v.len());
                let piece: Vec<u8> = v[from..(from + 1 + rng.below(16)).min(v.len())].to_vec();
                v.splice(at..at, piece);
            }
            _ => v.insert(at, rng.next() as u8),
        }
    }
    v
}

#[test]
fn mutations_of_the_corpus_run_clean() {
    let mut rng = Rng::new();
    for (name, f) in orrery_fuzz::TARGETS {
        // Lua's bound is time: a mutated loop runs to it.
        let n = if *name == "lua" { 20 } else { 300 };
        for (_, seed) in inputs(&fuzz_dir().join("corpus").join(name)) {
            for _ in 0..n {
                let m = mutate(&mut rng, &seed);
                run(name, "a mutation of its corpus", *f, &m);
            }
        }
    }
}
