//! Upgrades: this build starts from a data directory an earlier version wrote
//! (`tests/fixtures/format-N`, one per store format: `orrery up` with two simulated clusters,
//! a Deployment and a ConfigMap placed on both) with no operation in any member and no Work
//! rewritten; a store of a newer format is refused with a message, and left as it was.

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

/// A copy of a fixture, private as a data directory must be.
fn copy_fixture(name: &str) -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o700)).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            let target = to.join(e.file_name());
            if e.file_type().unwrap().is_dir() {
                copy(&e.path(), &target);
            } else {
                std::fs::copy(e.path(), &target).unwrap();
                std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name);
    copy(&fixture, dir.path());
    dir
}

fn kubectl(dir: &Path, args: &[&str]) -> Value {
    let o = Command::new("kubectl")
        .args(args)
        .args(["-o", "json"])
        .env("KUBECONFIG", dir.join("admin.kubeconfig"))
        .env("HOME", dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Each Work: its uid, generation and resourceVersion (a Work rewritten shows here).
fn works(dir: &Path) -> Vec<String> {
    let v = kubectl(dir, &["get", "works", "-A"]);
    let mut out: Vec<String> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            format!(
                "{}/{} uid {} generation {} rv {}",
                w["metadata"]["namespace"],
                w["metadata"]["name"],
                w["metadata"]["uid"],
                w["metadata"]["generation"],
                w["metadata"]["resourceVersion"]
            )
        })
        .collect();
    out.sort();
    out
}

#[test]
fn this_build_starts_from_format_1_with_no_member_operation() {
    let dir = copy_fixture("format-1");
    let port = common::free_port();
    let mut up = Command::new(env!("CARGO_BIN_EXE_orrery"))
        .args(["up", "--clusters", "2", "--data-dir"])
        .arg(dir.path())
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.path().join("up.log")).unwrap())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(up.stdout.take().unwrap()).lines();
    for l in lines.by_ref() {
        if l.unwrap().starts_with("Ctrl-C stops everything") {
            break;
        }
    }
    std::thread::spawn(move || for _ in lines {});
    let d = dir.path();
    let before = works(d);
    assert_eq!(before.len(), 4, "{before:?}");
    let web = kubectl(d, &["get", "deployment", "web", "-n", "default"]);
    assert_eq!(
        web["spec"]["template"]["spec"]["containers"][0]["image"],
        "nginx:1.27"
    );
    let b = kubectl(
        d,
        &["get", "resourcebinding", "web-deployment", "-n", "default"],
    );
    assert_eq!(b["spec"]["clusters"].as_array().unwrap().len(), 2, "{b}");
    common::eventually(Duration::from_secs(30), "both clusters Ready", || {
        let v = kubectl(d, &["get", "clusters"]);
        v["items"].as_array().unwrap().iter().all(|c| {
            c["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
    });
    // What the controllers would do, they have done by now.
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(works(d), before, "no Work rewritten");
    let admin = std::fs::read_to_string(d.join("sim-admin")).unwrap();
    for cluster in ["aws-us-east", "gcp-europe"] {
        let (code, body) = common::http(
            "GET",
            admin.trim(),
            &format!("/clusters/{cluster}/journal"),
            "",
        );
        assert_eq!(code, 200, "{body}");
        let j: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            j["items"].as_array().unwrap().len(),
            0,
            "no operation in {cluster}: {body}"
        );
    }
    common::signal(up.id(), "INT");
    let _ = up.wait();
    // The record still says format 1, with no migration made.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        use orrery_store::Store;
        let s = orrery_store_sqlite::SqliteStore::open_dir(d).unwrap();
        let f: orrery_store::format::Format = serde_json::from_value(
            s.get(orrery_store::format::KEY)
                .await
                .unwrap()
                .spec
                .unwrap(),
        )
        .unwrap();
        assert_eq!(f.version, 1);
        assert!(f.migrations.is_empty(), "{f:?}");
        s.close().await;
    });
}

#[test]
fn a_store_of_a_newer_format_is_refused_and_left_alone() {
    let dir = copy_fixture("format-1");
    let d = dir.path();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let written = rt.block_on(async {
        use orrery_store::Store;
        let s = orrery_store_sqlite::SqliteStore::open_dir(d).unwrap();
        let mut o = s.get(orrery_store::format::KEY).await.unwrap();
        let rev = o.revision();
        o.spec = Some(serde_json::json!({"version": 99, "writtenBy": "orrery 9.0.0"}));
        s.update(orrery_store::format::KEY, o, rev).await.unwrap();
        let r = s.current_revision().await.unwrap();
        s.close().await;
        r
    });
    let out = Command::new(env!("CARGO_BIN_EXE_orrery"))
        .args(["server", "--data-dir"])
        .arg(d)
        .args(["--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("format version 99")
            && err.contains("orrery 9.0.0")
            && err.contains("newer than this build"),
        "{err}"
    );
    rt.block_on(async {
        use orrery_store::Store;
        let s = orrery_store_sqlite::SqliteStore::open_dir(d).unwrap();
        assert_eq!(
            s.current_revision().await.unwrap(),
            written,
            "nothing written"
        );
        s.close().await;
    });
}
