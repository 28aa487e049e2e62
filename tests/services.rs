//! Multi-cluster services end to end (KEP-1645): a real server, three agents with simulated
//! members, kubectl, and `dig` (Debian's bind9-dnsutils) asking the clusterset DNS of the
//! server (`--dns-listen`) and of the agents.

use crate::common;

use std::process::Command;
use std::time::Duration;

use common::eventually;
use common::fleet::Fleet;
use serde_json::Value;

const WEB: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - name: web
        image: nginx:1.25
        ports: [{name: http, containerPort: 8080}]
        resources: {requests: {cpu: 100m, memory: 64Mi}}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: http}]
---
apiVersion: policy.karmada.io/v1alpha1
kind: PropagationPolicy
metadata: {name: web, namespace: default}
spec:
  resourceSelectors:
  - {apiVersion: apps/v1, kind: Deployment, name: web}
  - {apiVersion: v1, kind: Service, name: web}
  placement:
    clusterAffinity: {clusterNames: [a, b]}
    replicaScheduling: {replicaSchedulingType: Duplicated}
---
apiVersion: multicluster.x-k8s.io/v1alpha1
kind: ServiceExport
metadata: {name: web, namespace: default}
spec:
  exportedLabels: {tier: frontend}
"#;

const DB: &str = r#"
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db, namespace: default}
spec:
  replicas: 2
  serviceName: db
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec:
      containers:
      - name: db
        image: postgres:16
        resources: {requests: {cpu: 100m, memory: 64Mi}}
---
apiVersion: v1
kind: Service
metadata: {name: db, namespace: default}
spec:
  clusterIP: None
  selector: {app: db}
  ports: [{name: pg, port: 5432}]
---
apiVersion: policy.karmada.io/v1alpha1
kind: PropagationPolicy
metadata: {name: db, namespace: default}
spec:
  resourceSelectors:
  - {apiVersion: apps/v1, kind: StatefulSet, name: db}
  - {apiVersion: v1, kind: Service, name: db}
  placement:
    clusterAffinity: {clusterNames: [a, b]}
    replicaScheduling: {replicaSchedulingType: Duplicated}
---
apiVersion: multicluster.x-k8s.io/v1alpha1
kind: ServiceExport
metadata:
  name: db
  namespace: default
  annotations: {multicluster.orrery.io/traffic-policy: PreferLocal}
"#;

/// `dig @addr` with `args`: its output, trimmed.
fn dig(addr: &str, args: &[&str]) -> String {
    let (host, port) = addr.rsplit_once(':').unwrap();
    let out = Command::new("dig")
        .args([&format!("@{host}"), "-p", port, "+time=2", "+tries=1"])
        .args(args)
        .output()
        .expect("run dig (Debian's bind9-dnsutils)");
    assert!(
        out.status.success(),
        "dig {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The answers' data, sorted (`dig +short`).
fn short(addr: &str, name: &str, t: &str) -> Vec<String> {
    let mut v: Vec<String> = dig(addr, &["+short", name, t])
        .lines()
        .map(str::to_string)
        .collect();
    v.sort();
    v
}

/// The response code (`NOERROR`, `NXDOMAIN`...).
fn status(addr: &str, name: &str) -> String {
    let out = dig(addr, &["+noall", "+comments", name, "A"]);
    out.split("status: ")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .unwrap_or_default()
        .to_string()
}

fn condition(o: &Value, t: &str) -> Value {
    o["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == t).cloned())
        .unwrap_or(Value::Null)
}

fn server_dns(f: &Fleet) -> String {
    f.s.said
        .iter()
        .find_map(|l| l.strip_prefix("clusterset DNS at "))
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the server's DNS address")
        .to_string()
}

/// The addresses of a member's imported EndpointSlices of `svc`, from `source`.
fn imported_addresses(f: &Fleet, member: &str, svc: &str, source: &str) -> Vec<String> {
    let mut v: Vec<String> = f
        .objects(member)
        .iter()
        .filter(|o| {
            o["kind"] == "EndpointSlice"
                && o["metadata"]["labels"]["multicluster.kubernetes.io/service-name"] == svc
                && o["metadata"]["labels"]["multicluster.kubernetes.io/source-cluster"] == source
        })
        .flat_map(|o| o["endpoints"].as_array().cloned().unwrap_or_default())
        .filter(|e| e["conditions"]["ready"] != false)
        .filter_map(|e| e["addresses"][0].as_str().map(str::to_string))
        .collect();
    v.sort();
    v
}

#[test]
fn a_service_exported_from_two_members_is_imported_into_a_third_and_resolves() {
    let f = Fleet::start_with(
        &[("a", "r1"), ("b", "r1"), ("c", "r2")],
        &["--dns-listen", "127.0.0.1:0"],
    );
    f.s.apply(WEB);
    eventually(
        Duration::from_secs(60),
        "the ServiceImport from a and b",
        || {
            let i = f.s.get_json(&["serviceimports", "-A", "-o", "json"]);
            i["items"].as_array().is_some_and(|items| {
                items.iter().any(|i| {
                    i["metadata"]["name"] == "web"
                        && i["status"]["clusters"]
                            == serde_json::json!([{"cluster": "a"}, {"cluster": "b"}])
                })
            })
        },
    );
    let import =
        f.s.get_json(&["serviceimport", "web", "-n", "default", "-o", "json"]);
    assert_eq!(import["spec"]["type"], "ClusterSetIP", "{import:#}");
    // Stored and served at mcs-api's storage version; the IP's family named, as the
    // conformance suite checks.
    assert_eq!(import["apiVersion"], "multicluster.x-k8s.io/v1beta1");
    assert_eq!(
        import["spec"]["ipFamilies"],
        serde_json::json!(["IPv4"]),
        "{import:#}"
    );
    assert_eq!(
        import["spec"]["ports"],
        serde_json::json!([{"name": "http", "protocol": "TCP", "port": 80}]),
        "{import:#}"
    );
    let ip = import["spec"]["ips"][0].as_str().unwrap().to_string();
    assert!(ip.starts_with("10.254."), "{ip}");
    // Owned by its export (it goes with it), with the labels it exports.
    assert_eq!(
        import["metadata"]["ownerReferences"][0]["kind"],
        "ServiceExport"
    );
    assert_eq!(
        import["metadata"]["labels"]["tier"], "frontend",
        "{import:#}"
    );
    let export =
        f.s.get_json(&["serviceexport", "web", "-n", "default", "-o", "json"]);
    assert_eq!(condition(&export, "Valid")["status"], "True", "{export:#}");
    eventually(Duration::from_secs(30), "the export Ready", || {
        let e =
            f.s.get_json(&["serviceexport", "web", "-n", "default", "-o", "json"]);
        condition(&e, "Ready")["reason"] == "Exported"
            && condition(&e, "Conflict")["status"] == "False"
    });
    // One slice per exporting cluster in the control plane, with both pods of each, on the
    // pods' port.
    eventually(
        Duration::from_secs(30),
        "two slices of two ready endpoints",
        || {
            let l = f.s.get_json(&[
                "endpointslices",
                "-n",
                "default",
                "-l",
                "multicluster.kubernetes.io/service-name=web",
                "-o",
                "json",
            ]);
            let items = l["items"].as_array().cloned().unwrap_or_default();
            items.len() == 2
                && items.iter().all(|s| {
                    s["endpoints"].as_array().is_some_and(|e| {
                        e.len() == 2 && e.iter().all(|e| e["conditions"]["ready"] == true)
                    }) && s["ports"][0]["port"] == 8080
                        && s["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"]
                            == "orrery.io"
                })
        },
    );
    let table = f.s.ok(&["get", "serviceimports", "-n", "default"]);
    assert!(
        table.contains("ClusterSetIP") && table.contains(&ip),
        "{table}"
    );
    // The consumer c imports it: the ServiceImport and both slices, and its DNS answers.
    eventually(Duration::from_secs(30), "c imports web", || {
        f.find("c", "ServiceImport", "web").is_some()
            && imported_addresses(&f, "c", "web", "a").len() == 2
            && imported_addresses(&f, "c", "web", "b").len() == 2
    });
    let c_dns = f.dns("c");
    eventually(Duration::from_secs(10), "c's DNS answers", || {
        short(&c_dns, "web.default.svc.clusterset.local", "A") == [ip.clone()]
    });
    assert_eq!(
        short(&c_dns, "_http._tcp.web.default.svc.clusterset.local", "SRV"),
        ["0 100 80 web.default.svc.clusterset.local."]
    );
    // Over TCP too, and the server answers for the whole fleet.
    assert_eq!(
        dig(
            &c_dns,
            &["+short", "+tcp", "web.default.svc.clusterset.local", "A"]
        ),
        ip
    );
    let fleet_dns = server_dns(&f);
    eventually(Duration::from_secs(10), "the server's DNS answers", || {
        short(&fleet_dns, "web.default.svc.clusterset.local", "A") == [ip.clone()]
    });
    assert_eq!(
        status(&fleet_dns, "nope.default.svc.clusterset.local"),
        "NXDOMAIN"
    );
    assert_eq!(status(&fleet_dns, "example.com"), "REFUSED");
    // Members taking part carry the KEP-2149 properties.
    // At the newest versions the member serves (the sim serves both of each).
    let in_c = f.find("c", "ServiceImport", "web").unwrap();
    assert_eq!(
        in_c["apiVersion"], "multicluster.x-k8s.io/v1beta1",
        "{in_c:#}"
    );
    eventually(Duration::from_secs(20), "ClusterProperties in c", || {
        f.find("c", "ClusterProperty", "cluster.clusterset.k8s.io")
            .is_some_and(|p| p["spec"]["value"] == "c" && p["apiVersion"] == "about.k8s.io/v1beta1")
            && f.find("c", "ClusterProperty", "clusterset.k8s.io")
                .is_some_and(|p| p["spec"]["value"] == "orrery")
    });

    // b's Service on another port: the exports conflict, the oldest (a, by name on a tie)
    // keeps the port.
    f.s.apply(
        r#"
apiVersion: policy.karmada.io/v1alpha1
kind: OverridePolicy
metadata: {name: web-port, namespace: default}
spec:
  resourceSelectors:
  - {apiVersion: v1, kind: Service, name: web}
  overrideRules:
  - targetCluster: {clusterNames: [b]}
    overriders:
      plaintext:
      - {path: /spec/ports/0/port, operator: replace, value: 81}
"#,
    );
    eventually(Duration::from_secs(30), "a port conflict", || {
        let e =
            f.s.get_json(&["serviceexport", "web", "-n", "default", "-o", "json"]);
        let c = condition(&e, "Conflict");
        c["status"] == "True"
            && c["reason"] == "PortConflict"
            && c["message"].as_str().unwrap_or_default().contains("\"a\"")
    });
    let import =
        f.s.get_json(&["serviceimport", "web", "-n", "default", "-o", "json"]);
    assert_eq!(import["spec"]["ports"][0]["port"], 80, "{import:#}");
    assert_eq!(
        import["spec"]["ips"][0],
        ip.as_str(),
        "the ClusterSet IP is kept"
    );
    f.s.ok(&["delete", "overridepolicy", "web-port", "-n", "default"]);
    eventually(Duration::from_secs(30), "no conflict", || {
        let e =
            f.s.get_json(&["serviceexport", "web", "-n", "default", "-o", "json"]);
        condition(&e, "Conflict")["status"] == "False"
    });

    // An exporting cluster that leaves takes its export along.
    f.s.ok(&["delete", "cluster", "b", "--wait=false"]);
    eventually(Duration::from_secs(60), "b's export gone", || {
        let i =
            f.s.get_json(&["serviceimport", "web", "-n", "default", "-o", "json"]);
        i["status"]["clusters"] == serde_json::json!([{"cluster": "a"}])
            && imported_addresses(&f, "c", "web", "b").is_empty()
            && imported_addresses(&f, "c", "web", "a").len() == 2
    });

    // The export goes with its Service: no import, no slices, no name.
    f.s.ok(&["delete", "service", "web", "-n", "default"]);
    eventually(Duration::from_secs(30), "the export invalid", || {
        let e =
            f.s.get_json(&["serviceexport", "web", "-n", "default", "-o", "json"]);
        condition(&e, "Valid")["reason"] == "NoService"
    });
    eventually(
        Duration::from_secs(30),
        "the import gone everywhere",
        || {
            f.s.kubectl(&["get", "serviceimport", "web", "-n", "default"])
                .status
                .code()
                == Some(1)
                && f.find("c", "ServiceImport", "web").is_none()
                && status(&c_dns, "web.default.svc.clusterset.local") == "NXDOMAIN"
                && status(&fleet_dns, "web.default.svc.clusterset.local") == "NXDOMAIN"
        },
    );
    let slices = f.s.ok(&[
        "get",
        "endpointslices",
        "-n",
        "default",
        "-l",
        "multicluster.kubernetes.io/service-name=web",
        "-o",
        "name",
    ]);
    assert!(slices.is_empty(), "{slices}");
}

#[test]
fn a_headless_service_resolves_to_its_endpoints_and_prefer_local_keeps_traffic_home() {
    let f = Fleet::start(&[("a", "r1"), ("b", "r1"), ("c", "r2")]);
    f.s.apply(DB);
    eventually(
        Duration::from_secs(60),
        "c imports both members' db pods",
        || {
            imported_addresses(&f, "c", "db", "a").len() == 2
                && imported_addresses(&f, "c", "db", "b").len() == 2
        },
    );
    let import =
        f.s.get_json(&["serviceimport", "db", "-n", "default", "-o", "json"]);
    assert_eq!(import["spec"]["type"], "Headless", "{import:#}");
    assert!(import["spec"]["ips"].is_null(), "{import:#}");
    let from_a = imported_addresses(&f, "c", "db", "a");
    let from_b = imported_addresses(&f, "c", "db", "b");
    let mut all = [from_a.clone(), from_b.clone()].concat();
    all.sort();
    // c runs no db: every ready endpoint.
    let c_dns = f.dns("c");
    eventually(Duration::from_secs(10), "c resolves every endpoint", || {
        short(&c_dns, "db.default.svc.clusterset.local", "A") == all
    });
    // The pods' own names: <hostname>.<cluster>.<svc>.<ns>.svc.clusterset.local.
    let db0_a = f
        .objects("c")
        .iter()
        .filter(|o| {
            o["kind"] == "EndpointSlice"
                && o["metadata"]["labels"]["multicluster.kubernetes.io/source-cluster"] == "a"
                && o["metadata"]["labels"]["multicluster.kubernetes.io/service-name"] == "db"
        })
        .flat_map(|o| o["endpoints"].as_array().cloned().unwrap_or_default())
        .find(|e| e["hostname"] == "db-0")
        .map(|e| e["addresses"][0].as_str().unwrap().to_string())
        .expect("db-0 of a");
    assert_eq!(
        short(&c_dns, "db-0.a.db.default.svc.clusterset.local", "A"),
        [db0_a]
    );
    let srv = short(&c_dns, "_pg._tcp.db.default.svc.clusterset.local", "SRV");
    assert_eq!(srv.len(), 4, "{srv:?}");
    assert!(
        srv.iter()
            .any(|r| r.ends_with(" 5432 db-1.b.db.default.svc.clusterset.local.")),
        "{srv:?}"
    );
    // `<cluster>.<svc>...` is reserved.
    assert_eq!(
        status(&c_dns, "a.db.default.svc.clusterset.local"),
        "NXDOMAIN"
    );
    // PreferLocal: a, which runs db itself, is sent to its own pods only.
    let a_dns = f.dns("a");
    let mut local = imported_addresses(&f, "a", "db", "a");
    local.sort();
    assert_eq!(local.len(), 2);
    eventually(Duration::from_secs(10), "a resolves its own pods", || {
        short(&a_dns, "db.default.svc.clusterset.local", "A") == local
    });
    // The slices a imports say why: b weighs nothing for a, a everything.
    let weight = |member: &str, source: &str| {
        f.objects(member)
            .into_iter()
            .find(|o| {
                o["kind"] == "EndpointSlice"
                    && o["metadata"]["labels"]["multicluster.kubernetes.io/source-cluster"]
                        == source
            })
            .map(|o| o["metadata"]["annotations"]["multicluster.orrery.io/weight"].clone())
    };
    assert_eq!(weight("a", "b"), Some(Value::from("0")));
    assert_eq!(weight("a", "a"), Some(Value::from("100")));
    assert_eq!(weight("c", "b"), Some(Value::from("100")));

    // A member's own export (made in c, not through Orrery): its Service is imported by the
    // others, and c's export hears how it went.
    for m in [
        r#"{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "cache", "namespace": "default"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "cache"}},
                     "template": {"metadata": {"labels": {"app": "cache"}},
                                  "spec": {"containers": [{"name": "c", "image": "redis", "resources": {"requests": {"cpu": "50m"}}}]}}}}"#,
        r#"{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "cache", "namespace": "default"},
            "spec": {"selector": {"app": "cache"}, "ports": [{"name": "redis", "port": 6379}]}}"#,
        r#"{"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ServiceExport",
            "metadata": {"name": "cache", "namespace": "default"},
            "spec": {"exportedLabels": {"tier": "cache"}, "exportedAnnotations": {"owner": "c"}}}"#,
    ] {
        let (code, body) = common::http("POST", f.admin("c"), "/clusters/c/objects", m);
        assert_eq!(code, 201, "{body}");
    }
    eventually(
        Duration::from_secs(30),
        "the import of c's own export",
        || {
            let i =
                f.s.get_json(&["serviceimports", "-n", "default", "-o", "json"]);
            i["items"].as_array().is_some_and(|items| {
                items.iter().any(|i| {
                    i["metadata"]["name"] == "cache"
                        && i["status"]["clusters"] == serde_json::json!([{"cluster": "c"}])
                })
            })
        },
    );
    let cache =
        f.s.get_json(&["serviceimport", "cache", "-n", "default", "-o", "json"]);
    assert!(cache["metadata"]["ownerReferences"].is_null(), "{cache:#}");
    // The member's export's labels and annotations are the import's.
    assert_eq!(cache["metadata"]["labels"]["tier"], "cache", "{cache:#}");
    assert_eq!(cache["metadata"]["annotations"]["owner"], "c", "{cache:#}");
    let cache_ip = cache["spec"]["ips"][0].as_str().unwrap().to_string();
    eventually(Duration::from_secs(20), "a resolves c's cache", || {
        short(&a_dns, "cache.default.svc.clusterset.local", "A") == [cache_ip.clone()]
    });
    eventually(
        Duration::from_secs(20),
        "c's export says it is exported",
        || {
            f.find("c", "ServiceExport", "cache").is_some_and(|e| {
                condition(&e, "Valid")["status"] == "True"
                    && condition(&e, "Ready")["reason"] == "Exported"
                    && condition(&e, "Conflict")["reason"] == "NoConflicts"
            })
        },
    );
    // The export removed in c: its Cluster no longer lists it (the heartbeat removes what
    // the member stopped reporting), and the import that was c's alone goes.
    let (code, body) = common::http(
        "DELETE",
        f.admin("c"),
        "/clusters/c/objects",
        r#"{"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ServiceExport",
            "metadata": {"name": "cache", "namespace": "default"}}"#,
    );
    assert_eq!(code, 200, "{body}");
    eventually(
        Duration::from_secs(30),
        "c's withdrawn export gone from its Cluster and its import",
        || {
            let c = f.s.get_json(&["cluster", "c"]);
            let i = f.s.get_json(&["serviceimports", "-n", "default"]);
            c["status"].get("serviceExports").is_none()
                && !i["items"]
                    .as_array()
                    .is_some_and(|items| items.iter().any(|i| i["metadata"]["name"] == "cache"))
        },
    );
}

/// Karmada's older multi-cluster service sample: a ServiceImport the user makes in the control
/// plane and propagates with a PropagationPolicy is a template like any other (bound,
/// propagated to the member its policy names); Orrery neither overwrites nor deletes it,
/// derives nothing under its name, and the export says why. One no export matches is kept too.
#[test]
fn a_users_service_import_is_propagated_as_its_policy_says() {
    let f = Fleet::start(&[("a", "r1"), ("b", "r1")]);
    // The user's import first (in one file with the export, Orrery may derive one of the
    // name in between, and kubectl's create is told it exists; applied again, it is the
    // user's).
    f.s.apply(
        r#"
apiVersion: multicluster.x-k8s.io/v1alpha1
kind: ServiceImport
metadata: {name: serve, namespace: default}
spec:
  type: ClusterSetIP
  ports: [{port: 80, protocol: TCP}]
---
apiVersion: multicluster.x-k8s.io/v1alpha1
kind: ServiceImport
metadata: {name: lonely, namespace: default}
spec:
  type: ClusterSetIP
  ports: [{port: 81, protocol: TCP}]
---
apiVersion: policy.karmada.io/v1alpha1
kind: PropagationPolicy
metadata: {name: serve-import, namespace: default}
spec:
  resourceSelectors:
  - {apiVersion: multicluster.x-k8s.io/v1alpha1, kind: ServiceImport, name: serve}
  placement: {clusterAffinity: {clusterNames: [b]}}
"#,
    );
    f.s.apply(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: serve, namespace: default}
spec:
  replicas: 1
  selector: {matchLabels: {app: serve}}
  template:
    metadata: {labels: {app: serve}}
    spec:
      containers: [{name: serve, image: serve:1, ports: [{containerPort: 8080}]}]
---
apiVersion: v1
kind: Service
metadata: {name: serve, namespace: default}
spec:
  selector: {app: serve}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: policy.karmada.io/v1alpha1
kind: PropagationPolicy
metadata: {name: serve, namespace: default}
spec:
  resourceSelectors:
  - {apiVersion: apps/v1, kind: Deployment, name: serve}
  - {apiVersion: v1, kind: Service, name: serve}
  placement: {clusterAffinity: {clusterNames: [a]}}
---
apiVersion: multicluster.x-k8s.io/v1alpha1
kind: ServiceExport
metadata: {name: serve, namespace: default}
"#,
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while f.find("b", "ServiceImport", "serve").is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the user's import not in b: {}",
            f.s.ok(&["get", "resourcebindings", "-o", "yaml"])
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let b = f.s.get_json(&["resourcebinding", "serve-serviceimport"]);
    assert_eq!(b["spec"]["clusters"][0]["name"], "b", "{b}");
    eventually(Duration::from_secs(20), "the export says why", || {
        let e = f.s.get_json(&["serviceexport", "serve"]);
        condition(&e, "Ready")["reason"] == "ImportExists"
    });
    // The user's import as written; nothing derived under its name.
    let i = f.s.get_json(&["serviceimport", "serve"]);
    assert_eq!(i["spec"]["ports"][0]["port"], 80, "{i}");
    assert!(
        i["metadata"]["labels"]["multicluster.orrery.io/derived"].is_null(),
        "{i}"
    );
    let works = f.s.ok(&["get", "works", "-A", "-o", "name"]);
    assert!(!works.contains("orrery-mcs.default.serve"), "{works}");
    std::thread::sleep(Duration::from_secs(3));
    f.s.ok(&["get", "serviceimport", "lonely"]);
    f.s.ok(&["get", "serviceimport", "serve"]);
}
