//! Encryption at rest end to end: a real server given an EncryptionConfiguration, the real
//! kubectl, a simulated member the Secret is placed on. The Secret's value is nowhere in the
//! SQLite files (not in the Secret, not in kubectl's last-applied annotation, not in the Work
//! that carries it to the member), every reader sees it in the clear, and keys rotate as in
//! Kubernetes: the new key first, rewrite, the old key removed.

use crate::common;

use std::path::Path;
use std::time::Duration;

use base64::Engine;
use common::{Agent, Server, eventually};

const VALUE: &str = "orrery-known-secret-4711";
const KEY_1: &str = "c2VjcmV0IGlzIHNlY3VyZSwgaXMgaXQgbm90ID8hISE=";
const KEY_2: &str = "MTIzNDU2Nzg5MDEyMzQ1Njc4OTAxMjM0NTY3ODkwMTI=";

fn write_config(path: &Path, keys: &[(&str, &str)]) {
    let keys: Vec<String> = keys
        .iter()
        .map(|(n, k)| format!("{{name: {n}, secret: {k}}}"))
        .collect();
    std::fs::write(
        path,
        format!(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets]\n  providers:\n  - aesgcm: {{keys: [{}]}}\n  - identity: {{}}\n",
            keys.join(", ")
        ),
    )
    .unwrap();
}

/// Whether any of the store's files holds `needle`.
fn store_holds(dir: &Path, needle: &str) -> bool {
    ["orrery.db", "orrery.db-wal"].iter().any(|f| {
        std::fs::read(dir.join(f))
            .is_ok_and(|bytes| bytes.windows(needle.len()).any(|w| w == needle.as_bytes()))
    })
}

fn password(s: &Server) -> String {
    s.ok(&["get", "secret", "db", "-o", "jsonpath={.data.password}"])
}

#[test]
fn secrets_are_unreadable_in_the_store_files_and_keys_rotate() {
    let cfg_dir = tempfile::tempdir().unwrap();
    let cfg = cfg_dir.path().join("encryption.yaml");
    write_config(&cfg, &[("k1", KEY_1)]);
    let mut s = Server::start_with(&["--encryption-provider-config", cfg.to_str().unwrap()]);
    let _member = Agent::sim_member(&s, "m1");
    // Applied with kubectl apply: its last-applied annotation holds the value as well.
    s.apply(&format!(
        r#"
apiVersion: v1
kind: Secret
metadata: {{name: db, namespace: default}}
stringData: {{password: {VALUE}}}
---
apiVersion: multicluster.io/v1alpha1
kind: ResourcePlacementPolicy
metadata: {{name: db, namespace: default}}
spec:
  resourceSelector: {{apiVersion: v1, kind: Secret, name: db, namespace: default}}
  placement: {{clusterAffinity: {{clusterNames: [m1]}}}}
"#
    ));
    let b64 = base64::engine::general_purpose::STANDARD.encode(VALUE);
    assert_eq!(password(&s), b64);
    let last_applied = s.ok(&[
        "get",
        "secret",
        "db",
        "-o",
        r#"jsonpath={.metadata.annotations.kubectl\.kubernetes\.io/last-applied-configuration}"#,
    ]);
    assert!(last_applied.contains(VALUE), "{last_applied}");
    // The member got it: the Work carries it, readable through the API.
    eventually(Duration::from_secs(30), "the Secret in the member", || {
        s.ok(&["get", "works", "-n", "orrery-cluster-m1", "-o", "json"])
            .contains(&b64)
    });
    assert!(!store_holds(&s.dir, VALUE), "the value in the clear");
    assert!(
        !store_holds(&s.dir, &b64),
        "the value's base64 in the clear"
    );
    // The check can fail: a ConfigMap (not covered) is there in the clear.
    s.apply("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: plain, namespace: default}\ndata: {note: orrery-plain-4711}\n");
    assert!(store_holds(&s.dir, "orrery-plain-4711"));

    // Rotation: the new key first, the old one kept; everything rewritten.
    write_config(&cfg, &[("k2", KEY_2), ("k1", KEY_1)]);
    assert!(s.terminate());
    s.restart();
    assert_eq!(password(&s), b64);
    for kind in ["secrets", "works"] {
        let all = s.ok(&["get", kind, "-A", "-o", "json"]);
        s.stdin(&["replace", "-f", "-"], &all);
    }
    // The old key gone: everything opens with the new one.
    write_config(&cfg, &[("k2", KEY_2)]);
    assert!(s.terminate());
    s.restart();
    assert_eq!(password(&s), b64);
    assert!(
        s.ok(&["get", "works", "-n", "orrery-cluster-m1", "-o", "json"])
            .contains(&b64)
    );
    // A change still reaches the member.
    s.apply(&format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: db, namespace: default}}\nstringData: {{password: {VALUE}-2}}\n"
    ));
    let b64_2 = base64::engine::general_purpose::STANDARD.encode(format!("{VALUE}-2"));
    eventually(
        Duration::from_secs(30),
        "the new value in the member",
        || {
            s.ok(&["get", "works", "-n", "orrery-cluster-m1", "-o", "json"])
                .contains(&b64_2)
        },
    );
    assert!(!store_holds(&s.dir, &format!("{VALUE}-2")));
    assert!(!store_holds(&s.dir, &b64_2));
}

/// Every file under `dir` (etcd's write-ahead log and database), whether any holds `needle`.
fn files_hold(dir: &Path, needle: &[u8]) -> bool {
    std::fs::read_dir(dir).unwrap().flatten().any(|e| {
        let p = e.path();
        if p.is_dir() {
            files_hold(&p, needle)
        } else {
            std::fs::read(&p).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle))
        }
    })
}

#[test]
fn on_etcd_too_the_value_is_nowhere_in_its_files() {
    let etcd = orrery_store_testkit::etcd::EtcdServer::start().unwrap();
    let cfg_dir = tempfile::tempdir().unwrap();
    let cfg = cfg_dir.path().join("encryption.yaml");
    write_config(&cfg, &[("k1", KEY_1)]);
    let s = Server::start_with(&[
        "--store",
        "etcd",
        "--etcd-endpoints",
        &etcd.endpoint,
        "--encryption-provider-config",
        cfg.to_str().unwrap(),
    ]);
    s.apply(&format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: db, namespace: default}}\nstringData: {{password: {VALUE}}}\n"
    ));
    let b64 = base64::engine::general_purpose::STANDARD.encode(VALUE);
    assert_eq!(password(&s), b64);
    // The check can fail: a ConfigMap (not covered) is there in the clear.
    s.apply("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: plain, namespace: default}\ndata: {note: orrery-plain-4711}\n");
    assert!(files_hold(&etcd.data_dir(), b"orrery-plain-4711"));
    assert!(!files_hold(&etcd.data_dir(), VALUE.as_bytes()));
    assert!(!files_hold(&etcd.data_dir(), b64.as_bytes()));
}

#[test]
fn a_bad_encryption_configuration_stops_the_server_before_it_serves() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("encryption.yaml");
    std::fs::write(
        &cfg,
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets]\n  providers:\n  - aesgcm: {keys: [{name: k1, secret: c2hvcnQ=}]}\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_orrery"))
        .args(["server", "--data-dir"])
        .arg(dir.path().join("data"))
        .args(["--listen", "127.0.0.1:0", "--encryption-provider-config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--encryption-provider-config") && err.contains("5 bytes"),
        "{err}"
    );
}

/// Turning encryption on after Secrets were stored in the clear: rewriting them encrypts what
/// is current, but the old versions, freed pages and WAL frames still hold the plaintext until
/// `orrery scrub` (the server stopped) removes them; then nothing of it is in the files, and
/// the server starts again with every object as it was.
#[test]
fn scrubbing_after_encryption_is_turned_on_leaves_no_plaintext_in_the_files() {
    const OLD: &str = "orrery-plaintext-before-4711";
    let cfg_dir = tempfile::tempdir().unwrap();
    let cfg = cfg_dir.path().join("encryption.yaml");
    let mut s = Server::start();
    s.apply(&format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: db, namespace: default}}\nstringData: {{password: {OLD}}}\n"
    ));
    // Rewritten a few times, and one deleted: each version was stored in the clear.
    for i in 0..3 {
        s.ok(&[
            "annotate",
            "secret",
            "db",
            &format!("round={i}"),
            "--overwrite",
        ]);
    }
    s.stdin(
        &["create", "-f", "-"],
        &format!("apiVersion: v1\nkind: Secret\nmetadata: {{name: gone, namespace: default}}\nstringData: {{p: {OLD}-gone}}\n"),
    );
    s.ok(&["delete", "secret", "gone"]);
    assert!(s.terminate());
    assert!(
        store_holds(&s.dir, OLD),
        "the check can fail: the plaintext was there"
    );
    // Encryption on, and every Secret rewritten.
    write_config(&cfg, &[("k1", KEY_1)]);
    s.restart_with(&["--encryption-provider-config", cfg.to_str().unwrap()]);
    let all = s.ok(&["get", "secrets", "-A", "-o", "json"]);
    s.stdin(&["replace", "-f", "-"], &all);
    assert!(s.terminate());
    assert!(
        store_holds(&s.dir, OLD),
        "rewriting alone leaves the old versions in the file"
    );
    // Scrubbed: nothing of it left.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_orrery"))
        .args(["scrub", "--data-dir"])
        .arg(&s.dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("history compacted"));
    for f in ["orrery.db", "orrery.db-wal", "orrery.db-shm"] {
        let p = s.dir.join(f);
        if let Ok(bytes) = std::fs::read(&p) {
            assert!(
                !bytes.windows(OLD.len()).any(|w| w == OLD.as_bytes()),
                "{f} still holds the plaintext"
            );
        }
    }
    // And the server starts from it with the Secret as it is now.
    s.restart_with(&["--encryption-provider-config", cfg.to_str().unwrap()]);
    let b64 = base64::engine::general_purpose::STANDARD.encode(OLD);
    assert_eq!(password(&s), b64);
    assert!(!s.kubectl(&["get", "secret", "gone"]).status.success());
    // Scrubbing a store in use is refused.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_orrery"))
        .args(["scrub", "--data-dir"])
        .arg(&s.dir)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("in use by another process"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
