//! The DRO-DS API against its own OpenAPI description: schemathesis (from PyPI; the test
//! command installs it) generates requests from `/api/v1/openapi.json` and checks that no
//! response is a 5xx, an undocumented status, or a body that breaks its schema.

use crate::common;

use std::process::Command;

use common::Server;

/// Where schemathesis is: `ORRERY_SCHEMATHESIS`, else on the PATH.
fn schemathesis() -> String {
    std::env::var("ORRERY_SCHEMATHESIS").unwrap_or_else(|_| "schemathesis".into())
}

#[test]
fn the_openapi_description_holds_under_fuzzing() {
    let s = Server::start();
    let kubeconfig = std::fs::read_to_string(&s.kubeconfig).unwrap();
    let token = kubeconfig
        .lines()
        .find_map(|l| l.trim().strip_prefix("token:"))
        .map(|t| t.trim().to_string())
        .unwrap();
    let ca = s.dir.join("tls/ca.crt");
    let work = tempfile::tempdir().unwrap();
    let out = Command::new(schemathesis())
        .current_dir(work.path())
        .args([
            "run",
            &format!("{}/api/v1/openapi.json", s.url),
            "-H",
            &format!("Authorization: Bearer {token}"),
            "--tls-verify",
            ca.to_str().unwrap(),
            "-n",
            "30",
            "--generation-deterministic",
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,response_headers_conformance,unsupported_method",
        ])
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {} ({e}); ./scripts/test installs it, or set ORRERY_SCHEMATHESIS",
                schemathesis()
            )
        });
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "schemathesis found problems:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // It did test every operation.
    assert!(stdout.contains("Tested: 21"), "{stdout}");
}
