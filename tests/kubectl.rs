//! The real kubectl against a real `orrery server`, with the kubeconfig the server writes:
//! discovery, apply (strategic merge and merge patch paths), CRDs, output formats, watch,
//! label/annotate/patch/scale, delete, namespaces, bad input, restart.

use crate::common;

use std::time::Duration;

use common::{Server, eventually};

const DEPLOYMENT: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels: {app: web}
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: nginx:1.27
        env:
        - {name: A, value: "1"}
        - {name: B, value: "2"}
        ports:
        - containerPort: 80
"#;

const CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: crontabs.stable.example.com
spec:
  group: stable.example.com
  scope: Namespaced
  names: {plural: crontabs, singular: crontab, kind: CronTab, shortNames: [ct]}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              cronSpec: {type: string}
              image: {type: string}
              replicas: {type: integer, minimum: 0}
    additionalPrinterColumns:
    - {name: Spec, type: string, jsonPath: .spec.cronSpec}
    - {name: Replicas, type: integer, jsonPath: .spec.replicas}
"#;

fn crontab(replicas: u32) -> String {
    format!(
        "apiVersion: stable.example.com/v1\nkind: CronTab\nmetadata: {{name: my-cron}}\nspec: {{cronSpec: '* * * * */5', image: my-cron-image, replicas: {replicas}}}\n"
    )
}

#[test]
fn discovery_and_versions() {
    let s = Server::start();
    let version = s.ok(&["version", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&version).unwrap();
    assert_eq!(v["serverVersion"]["major"], "1");
    let resources = s.ok(&["api-resources"]);
    for line in [
        "deployments",
        "configmaps",
        "customresourcedefinitions",
        "clusters",
    ] {
        assert!(
            resources.contains(line),
            "api-resources lacks {line}:\n{resources}"
        );
    }
    let clusters = resources
        .lines()
        .find(|l| l.starts_with("clusters "))
        .unwrap();
    assert!(
        clusters.contains(" cl ")
            && clusters.contains("multicluster.io/v1alpha1")
            && clusters.contains("false"),
        "{clusters}"
    );
    let deploy = resources
        .lines()
        .find(|l| l.starts_with("deployments "))
        .unwrap();
    assert!(
        deploy.contains("deploy") && deploy.contains("apps/v1") && deploy.contains("true"),
        "{deploy}"
    );
    // kubectl learns server-side validation from the OpenAPI v3 PATCH operations.
    let doc = s.ok(&["get", "--raw", "/openapi/v3/apis/apps/v1"]);
    assert!(doc.contains("fieldValidation") && doc.contains("x-kubernetes-group-version-kind"));
    let groups = s.ok(&["get", "--raw", "/apis"]);
    assert!(groups.contains("\"APIGroupList\""));
    assert!(s.ok(&["get", "--raw", "/api"]).contains("\"APIVersions\""));
    assert_eq!(
        s.ok(&["get", "ns", "-o", "name"])
            .lines()
            .filter(|l| *l == "namespace/default")
            .count(),
        1
    );
}

/// `kubectl explain` documents the policy kinds field by field, and Orrery's own kinds are
/// described by CustomResourceDefinitions that tools can read but nobody can change.
#[test]
fn own_kinds_are_explained_and_described_by_read_only_crds() {
    let s = Server::start();
    let explained = s.ok(&[
        "explain",
        "propagationpolicy.spec.placement.replicaScheduling",
    ]);
    for text in [
        "KIND:       PropagationPolicy",
        "replicaDivisionPreference\t<string>",
        "Weighted (by weightPreference)",
        "weightPreference\t<Object>",
    ] {
        assert!(explained.contains(text), "{text}:\n{explained}");
    }
    let recursive = s.ok(&["explain", "resourceplacementpolicies.spec", "--recursive"]);
    for text in [
        "targetClusters\t<[]Object>",
        "selectorType\t<string>",
        "waterLevelLimit\t<number>",
        "clusterTolerations\t<[]Object>",
    ] {
        assert!(recursive.contains(text), "{text}:\n{recursive}");
    }
    let overrides = s.ok(&[
        "explain",
        "clusteroverridepolicies.spec.overrideRules.overriders",
        "--api-version=policy.karmada.io/v1alpha1",
    ]);
    assert!(
        overrides.contains("imageOverrider\t<[]Object>")
            && overrides.contains("Changes of container images."),
        "{overrides}"
    );

    // Read-only CRDs: listed, with schemas and printer columns, and refused every change.
    let crds = s.ok(&["get", "crd", "-o", "name"]);
    for name in [
        "propagationpolicies.policy.karmada.io",
        "clusteroverridepolicies.policy.karmada.io",
        "clusteroverridepolicies.multicluster.io",
        "clusters.multicluster.io",
        "resourcebindings.multicluster.io",
    ] {
        assert!(
            crds.lines()
                .any(|l| l == format!("customresourcedefinition.apiextensions.k8s.io/{name}")),
            "{name}:\n{crds}"
        );
    }
    let crd: serde_json::Value = serde_json::from_str(&s.ok(&[
        "get",
        "crd",
        "propagationpolicies.policy.karmada.io",
        "-o",
        "json",
    ]))
    .unwrap();
    assert_eq!(crd["spec"]["scope"], "Namespaced");
    assert_eq!(
        crd["spec"]["names"]["shortNames"],
        serde_json::json!(["pp"])
    );
    let version = &crd["spec"]["versions"][0];
    let spec = &version["schema"]["openAPIV3Schema"]["properties"]["spec"];
    assert_eq!(
        spec["properties"]["placement"]["properties"]["clusterTolerations"]["type"],
        "array"
    );
    assert!(
        !version.to_string().contains("$ref"),
        "a CRD schema inlines everything"
    );
    assert!(
        version["additionalPrinterColumns"]
            .as_array()
            .is_some_and(|c| !c.is_empty())
    );
    assert!(
        crd["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "Established" && c["status"] == "True")
    );
    let err = s.fails(&["delete", "crd", "propagationpolicies.policy.karmada.io"]);
    assert!(err.contains("read-only"), "{err}");
    let err = s.fails(&["label", "crd", "clusters.multicluster.io", "team=x"]);
    assert!(err.contains("read-only"), "{err}");
    // The kind is still served, and policies work as before.
    s.apply("apiVersion: policy.karmada.io/v1alpha1\nkind: PropagationPolicy\nmetadata: {name: p}\nspec:\n  resourceSelectors: [{apiVersion: apps/v1, kind: Deployment}]\n");
    assert_eq!(
        s.ok(&["get", "pp", "p", "-o", "name"]).trim(),
        "propagationpolicy.policy.karmada.io/p"
    );
    // Deleting every CRD (kubectl deletes one by one) keeps these, and says why; the
    // user's own CRD goes.
    s.apply(CRD);
    let out = s.kubectl(&["delete", "crd", "--all"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("propagationpolicies.policy.karmada.io\" describes one of Orrery's own kinds and is read-only"), "{stderr}");
    // A delete-collection call (client libraries) keeps them too, with a warning.
    let out = s.kubectl(&[
        "delete",
        "--raw",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "clusters.multicluster.io\" describes one of Orrery's own kinds and was kept"
        ),
        "{stderr}"
    );
    let left = s.ok(&["get", "crd", "-o", "name"]);
    assert!(
        left.contains("propagationpolicies.policy.karmada.io"),
        "{left}"
    );
    assert!(!left.contains("crontabs"), "{left}");
    // Kinds of features not built yet are not advertised.
    let resources = s.ok(&["api-resources"]);
    assert!(resources.contains("serviceexports"), "{resources}");
    assert!(resources.contains("clusterresourceclaims"), "{resources}");
}

#[test]
fn apply_deployment_then_change_image_and_env() {
    let s = Server::start();
    assert!(s.apply(DEPLOYMENT).contains("deployment.apps/web created"));
    assert!(
        s.apply(DEPLOYMENT).contains("unchanged"),
        "re-applying the same file changes nothing"
    );
    let changed = DEPLOYMENT
        .replace("nginx:1.27", "nginx:1.28")
        .replace(r#"{name: B, value: "2"}"#, r#"{name: C, value: "3"}"#);
    assert!(s.apply(&changed).contains("configured"));
    let got = s.ok(&[
        "get",
        "deploy",
        "web",
        "-o",
        "jsonpath={.spec.template.spec.containers[0].image}|{.spec.template.spec.containers[0].env}|{.metadata.generation}|{.spec.template.spec.containers[0].ports[0].containerPort}",
    ]);
    assert_eq!(
        got,
        r#"nginx:1.28|[{"name":"A","value":"1"},{"name":"C","value":"3"}]|2|80"#
    );
    // Removing the env list entirely through apply removes it on the server too.
    let no_env = changed.replace(
        "        env:\n        - {name: A, value: \"1\"}\n        - {name: C, value: \"3\"}\n",
        "",
    );
    s.apply(&no_env);
    assert_eq!(
        s.ok(&[
            "get",
            "deploy",
            "web",
            "-o",
            "jsonpath={.spec.template.spec.containers[0].env}"
        ]),
        ""
    );
}

#[test]
fn crd_then_instance_then_change_then_delete() {
    let s = Server::start();
    assert!(s.apply(CRD).contains("created"));
    assert!(
        s.ok(&[
            "get",
            "crd",
            "crontabs.stable.example.com",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Established\")].status}"
        ])
        .contains("True")
    );
    assert!(
        s.apply(&crontab(1))
            .contains("crontab.stable.example.com/my-cron created")
    );
    assert!(s.apply(&crontab(3)).contains("configured"));
    assert_eq!(
        s.ok(&[
            "get",
            "ct",
            "my-cron",
            "-o",
            "jsonpath={.spec.replicas}/{.metadata.generation}"
        ]),
        "3/2"
    );
    let table = s.ok(&["get", "crontabs"]);
    assert!(
        table.contains("SPEC") && table.contains("REPLICAS") && table.contains("* * * * */5"),
        "{table}"
    );
    // The CRD's schema is enforced.
    let bad = crontab(1).replace("replicas: 1", "replicas: -1");
    let out = s.kubectl(&[
        "apply",
        "-f",
        &common::write(&s.dir, "bad-ct.yaml", &bad)
            .display()
            .to_string(),
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("spec.replicas"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Deleting the CRD deletes its objects and stops serving the kind.
    s.ok(&["delete", "crd", "crontabs.stable.example.com"]);
    eventually(
        Duration::from_secs(20),
        "the kind to stop being served",
        || {
            let out = s.kubectl(&["get", "crontabs"]);
            let err = String::from_utf8_lossy(&out.stderr);
            // Which message depends on whether kubectl's discovery cache already forgot the kind.
            !out.status.success()
                && (err.contains("the server doesn't have a resource type")
                    || err.contains("the server could not find the requested resource"))
        },
    );
}

#[test]
fn output_formats_describe_and_watch() {
    let s = Server::start();
    s.apply(DEPLOYMENT);
    let yaml = s.ok(&["get", "deploy", "web", "-o", "yaml"]);
    assert!(
        yaml.contains("kind: Deployment")
            && yaml.contains("resourceVersion:")
            && yaml.contains("uid:")
    );
    let json: serde_json::Value =
        serde_json::from_str(&s.ok(&["get", "deploy", "web", "-o", "json"])).unwrap();
    assert_eq!(json["spec"]["replicas"], 2);
    let wide = s.ok(&["get", "deploy", "-o", "wide"]);
    assert!(
        wide.contains("CONTAINERS") && wide.contains("nginx:1.27") && wide.contains("app=web"),
        "{wide}"
    );
    let plain = s.ok(&["get", "deploy"]);
    assert!(
        plain.contains("READY") && plain.contains("0/2") && !plain.contains("IMAGES"),
        "{plain}"
    );
    // Orrery's own kinds have -o wide columns too.
    s.apply("apiVersion: multicluster.io/v1alpha1\nkind: Cluster\nmetadata: {name: edge-1}\nspec: {provider: aws, region: eu-west-1, zones: [eu-west-1a, eu-west-1b]}\n");
    s.apply("apiVersion: multicluster.io/v1alpha1\nkind: ResourcePlacementPolicy\nmetadata: {name: lonely, namespace: default}\nspec:\n  priority: 5\n  resourceSelector: {apiVersion: apps/v1, kind: Deployment, name: nothing-here}\n");
    let wide = s.ok(&["get", "clusters", "-o", "wide"]);
    let header = wide.lines().next().unwrap_or("");
    for c in [
        "PROVIDER", "ZONES", "VERSION", "NODES", "CPU", "MEMORY", "TAINTS",
    ] {
        assert!(header.contains(c), "{wide}");
    }
    assert!(wide.contains("eu-west-1a,eu-west-1b"), "{wide}");
    assert!(!s.ok(&["get", "clusters"]).contains("PROVIDER"));
    eventually(Duration::from_secs(10), "the policy's wide columns", || {
        let wide = s.ok(&["get", "resourceplacementpolicies", "-o", "wide"]);
        wide.lines()
            .next()
            .is_some_and(|h| h.contains("PRIORITY") && h.contains("REASON"))
            && wide.lines().any(|l| {
                l.starts_with("lonely") && l.contains(" 5 ") && l.trim_end().ends_with("NoMatch")
            })
    });
    let described = s.ok(&["describe", "deploy", "web"]);
    assert!(
        described.contains("Name:")
            && described.contains("nginx:1.27")
            && described.contains("Replicas:"),
        "{described}"
    );

    // get -w sees a later change.
    let mut watch = std::process::Command::new("kubectl")
        .args([
            "get",
            "deploy",
            "web",
            "-w",
            "-o",
            "custom-columns=NAME:.metadata.name,REPLICAS:.spec.replicas",
            "--no-headers",
        ])
        .env("KUBECONFIG", &s.kubeconfig)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    s.ok(&["scale", "deploy", "web", "--replicas=7"]);
    std::thread::sleep(Duration::from_millis(800));
    let _ = watch.kill();
    let out = watch.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["web", "7"]),
        "watch output:\n{text}"
    );
}

#[test]
fn label_annotate_patch_scale() {
    let s = Server::start();
    s.apply(DEPLOYMENT);
    s.ok(&["label", "deploy", "web", "tier=frontend"]);
    s.ok(&["annotate", "deploy", "web", "owner=team-a"]);
    s.ok(&[
        "patch",
        "deploy",
        "web",
        "--type=json",
        "-p",
        r#"[{"op":"replace","path":"/spec/replicas","value":4}]"#,
    ]);
    s.ok(&[
        "patch",
        "deploy",
        "web",
        "--type=merge",
        "-p",
        r#"{"spec":{"template":{"metadata":{"labels":{"app":"web","v":"2"}}}}}"#,
    ]);
    assert_eq!(
        s.ok(&["get", "deploy", "web", "-o", "jsonpath={.spec.replicas}"]),
        "4"
    );
    s.ok(&["scale", "deploy", "web", "--replicas=5"]);
    let got = s.ok(&["get", "deploy", "web", "-o", "jsonpath={.metadata.labels.tier} {.metadata.annotations.owner} {.spec.replicas} {.spec.template.metadata.labels.v}"]);
    assert_eq!(got, "frontend team-a 5 2");
    assert_eq!(
        s.ok(&["get", "deploy", "-l", "tier=frontend", "-o", "name"])
            .trim(),
        "deployment.apps/web"
    );
    assert_eq!(
        s.ok(&["get", "deploy", "-l", "tier!=frontend", "-o", "name"])
            .trim(),
        ""
    );
    s.ok(&["label", "deploy", "web", "tier-"]);
    assert_eq!(
        s.ok(&[
            "get",
            "deploy",
            "web",
            "-o",
            "jsonpath={.metadata.labels.tier}"
        ]),
        ""
    );
}

#[test]
fn delete_waits_and_namespaces_take_their_contents() {
    let s = Server::start();
    s.apply(DEPLOYMENT);
    let out = s.ok(&["delete", "deploy", "web"]);
    assert!(out.contains("deleted"));
    assert!(s.fails(&["get", "deploy", "web"]).contains("NotFound"));

    s.apply("apiVersion: v1\nkind: Namespace\nmetadata: {name: team-a}\n");
    s.ok(&[
        "-n",
        "team-a",
        "apply",
        "-f",
        &common::write(&s.dir, "d.yaml", DEPLOYMENT)
            .display()
            .to_string(),
    ]);
    s.apply(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cfg, namespace: team-a}\ndata: {a: b}\n",
    );
    s.ok(&["delete", "namespace", "team-a"]);
    assert!(s.fails(&["get", "ns", "team-a"]).contains("NotFound"));
    // Nothing of it is left, and it can be created again, empty.
    s.apply("apiVersion: v1\nkind: Namespace\nmetadata: {name: team-a}\n");
    assert_eq!(
        s.ok(&["-n", "team-a", "get", "deploy,cm", "-o", "name"])
            .trim(),
        ""
    );
}

#[test]
fn bad_input_is_refused_with_kubectls_messages() {
    let s = Server::start();
    // A malformed body reaches the server only through --raw (kubectl parses files itself).
    let malformed = common::write(
        &s.dir,
        "malformed.json",
        r#"{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"},"#,
    );
    let err = s.fails(&[
        "create",
        "--raw",
        "/api/v1/namespaces/default/configmaps",
        "-f",
        &malformed.display().to_string(),
    ]);
    assert!(err.contains("Error from server (BadRequest)"), "{err}");
    let broken_yaml = common::write(
        &s.dir,
        "broken.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: bad\n",
    );
    assert!(
        s.fails(&["apply", "-f", &broken_yaml.display().to_string()])
            .contains("error")
    );

    // Unknown field, under kubectl's default (strict) validation.
    let typo = common::write(
        &s.dir,
        "typo.yaml",
        &DEPLOYMENT.replace("replicas: 2", "replicass: 2"),
    );
    let err = s.fails(&["apply", "-f", &typo.display().to_string()]);
    assert!(err.contains("unknown field \"spec.replicass\""), "{err}");
    assert!(
        s.fails(&["get", "deploy", "web"]).contains("NotFound"),
        "nothing was stored"
    );
    // With --validate=false the field is dropped and the object stored.
    s.ok(&[
        "apply",
        "--validate=false",
        "-f",
        &typo.display().to_string(),
    ]);

    // A stale update.
    let stale = common::write(
        &s.dir,
        "stale.json",
        &s.ok(&["get", "deploy", "web", "-o", "json"]),
    );
    s.ok(&["scale", "deploy", "web", "--replicas=3"]);
    let err = s.fails(&["replace", "-f", &stale.display().to_string()]);
    assert!(
        err.contains("Error from server (Conflict)")
            && err.contains("the object has been modified"),
        "{err}"
    );

    // Bad selectors, missing namespaces, and bad tokens.
    assert!(
        s.fails(&["get", "pods", "-l", "a in (b"])
            .contains("Error from server (BadRequest)")
    );
    assert!(
        s.fails(&["get", "pods", "--field-selector", "spec.bogus=1"])
            .contains("field label not supported")
    );
    let err = s.fails(&[
        "-n",
        "nowhere",
        "apply",
        "-f",
        &common::write(
            &s.dir,
            "cm.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n",
        )
        .display()
        .to_string(),
    ]);
    assert!(
        err.contains("Error from server (NotFound)")
            && err.contains("namespaces \"nowhere\" not found"),
        "{err}"
    );
    assert!(
        s.fails(&["--token", "bogus.token", "get", "pods"])
            .contains("Unauthorized")
    );
    let big = format!(
        r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"big"}},"data":{{"a":"{}"}}}}"#,
        "x".repeat(3_200_000)
    );
    let err = s.fails(&[
        "create",
        "-f",
        &common::write(&s.dir, "big.json", &big)
            .display()
            .to_string(),
    ]);
    assert!(err.contains("RequestEntityTooLarge"), "{err}");
}

#[test]
fn restart_keeps_objects_credentials_and_certificates() {
    let mut s = Server::start();
    s.apply(DEPLOYMENT);
    let kubeconfig_before = std::fs::read_to_string(&s.kubeconfig).unwrap();
    let crd_version = |s: &Server| {
        s.ok(&[
            "get",
            "crd",
            "propagationpolicies.policy.karmada.io",
            "-o",
            "jsonpath={.metadata.resourceVersion}",
        ])
    };
    let crd_before = crd_version(&s);
    assert!(s.terminate(), "SIGTERM ends the server cleanly");
    s.restart();
    assert_eq!(
        std::fs::read_to_string(&s.kubeconfig).unwrap(),
        kubeconfig_before,
        "same token, same CA"
    );
    assert_eq!(crd_version(&s), crd_before, "a restart rewrites no own CRD");
    assert_eq!(
        s.ok(&["get", "deploy", "web", "-o", "jsonpath={.spec.replicas}"]),
        "2"
    );
}

#[test]
fn sigterm_ends_watches_cleanly() {
    let mut s = Server::start();
    s.apply(DEPLOYMENT);
    let watch = std::process::Command::new("kubectl")
        .args(["get", "deploy", "-w"])
        .env("KUBECONFIG", &s.kubeconfig)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    let started = std::time::Instant::now();
    assert!(s.terminate(), "the server exits 0 after SIGTERM");
    assert!(
        started.elapsed() < Duration::from_secs(9),
        "open watches do not hold up shutdown"
    );
    let out = watch.wait_with_output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("web"));
}

#[test]
fn imperative_commands_send_protobuf_and_work() {
    // client-go's typed clients (kubectl create, run) send built-in objects as protobuf.
    let s = Server::start();
    s.ok(&["create", "namespace", "team-b"]);
    let ns = ["-n", "team-b"];
    let run = |args: &[&str]| s.ok(&[&ns[..], args].concat());
    run(&[
        "create",
        "configmap",
        "cfg",
        "--from-literal=a=b",
        "--from-literal=c=d",
    ]);
    run(&[
        "create",
        "secret",
        "generic",
        "creds",
        "--from-literal=password=hunter2",
    ]);
    run(&[
        "create",
        "deployment",
        "nginx",
        "--image=nginx:1.27",
        "--replicas=3",
        "--port=80",
    ]);
    run(&[
        "create",
        "job",
        "once",
        "--image=busybox",
        "--",
        "echo",
        "hi",
    ]);
    run(&[
        "create",
        "cronjob",
        "often",
        "--image=busybox",
        "--schedule=*/5 * * * *",
    ]);
    run(&["create", "serviceaccount", "robot"]);
    run(&["create", "service", "clusterip", "web", "--tcp=80:8080"]);
    run(&["create", "ingress", "front", "--rule=a.example/x=web:80"]);
    run(&[
        "run",
        "pod1",
        "--image=nginx",
        "--labels=app=x",
        "--env=A=1",
    ]);

    assert_eq!(
        run(&["get", "cm", "cfg", "-o", "jsonpath={.data.a}{.data.c}"]),
        "bd"
    );
    let secret = run(&["get", "secret", "creds", "-o", "jsonpath={.data.password}"]);
    assert_eq!(
        secret, "aHVudGVyMg==",
        "bytes arrive base64-encoded as in JSON"
    );
    assert_eq!(
        run(&[
            "get",
            "deploy",
            "nginx",
            "-o",
            "jsonpath={.spec.replicas} {.spec.template.spec.containers[0].image} {.spec.template.spec.containers[0].ports[0].containerPort}"
        ]),
        "3 nginx:1.27 80"
    );
    assert_eq!(
        run(&[
            "get",
            "job",
            "once",
            "-o",
            "jsonpath={.spec.template.spec.containers[0].command}"
        ]),
        r#"["echo","hi"]"#
    );
    assert_eq!(
        run(&["get", "cronjob", "often", "-o", "jsonpath={.spec.schedule}"]),
        "*/5 * * * *"
    );
    assert_eq!(
        run(&[
            "get",
            "svc",
            "web",
            "-o",
            "jsonpath={.spec.ports[0].port}:{.spec.ports[0].targetPort}"
        ]),
        "80:8080"
    );
    // IngressRule inlines its IngressRuleValue in JSON; protobuf nests it.
    assert_eq!(
        run(&[
            "get",
            "ing",
            "front",
            "-o",
            "jsonpath={.spec.rules[0].host} {.spec.rules[0].http.paths[0].backend.service.name}"
        ]),
        "a.example web"
    );
    assert_eq!(
        run(&[
            "get",
            "pod",
            "pod1",
            "-o",
            "jsonpath={.metadata.labels.app} {.spec.containers[0].env[0].value}"
        ]),
        "x 1"
    );
    // Typed deletes send DeleteOptions as protobuf too.
    s.ok(&["delete", "namespace", "team-b"]);
    assert!(s.fails(&["get", "ns", "team-b"]).contains("NotFound"));
}

#[test]
fn list_files_and_backups_round_trip() {
    // `kubectl get -o yaml` of several objects writes `kind: List`; validating such a file makes
    // kubectl read the OpenAPI v2 document (as protobuf).
    let s = Server::start();
    s.apply(DEPLOYMENT);
    s.apply("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings}\ndata: {mode: fast}\n");
    let backup = s.ok(&["get", "deploy/web", "cm/settings", "-o", "yaml"]);
    assert!(backup.contains("kind: List"));
    let file = common::write(&s.dir, "backup.yaml", &backup);
    s.ok(&["delete", "deploy/web", "cm/settings"]);
    s.ok(&["apply", "-f", &file.display().to_string()]);
    assert_eq!(
        s.ok(&["get", "cm", "settings", "-o", "jsonpath={.data.mode}"]),
        "fast"
    );
    assert_eq!(
        s.ok(&[
            "get",
            "deploy",
            "web",
            "-o",
            "jsonpath={.spec.template.spec.containers[0].image}"
        ]),
        "nginx:1.27"
    );
    // And the typo inside a List is still caught.
    let bad = backup.replace("replicas: 2", "replicass: 2");
    let err = s.fails(&[
        "apply",
        "-f",
        &common::write(&s.dir, "bad.yaml", &bad)
            .display()
            .to_string(),
    ]);
    assert!(err.contains("replicass"), "{err}");
    assert!(
        s.ok(&["get", "--raw", "/openapi/v2"])
            .contains("\"swagger\":\"2.0\"")
    );
}

#[test]
fn server_side_apply_owns_fields_and_reports_conflicts() {
    let s = Server::start();
    let file = common::write(&s.dir, "web.yaml", DEPLOYMENT);
    let f = file.display().to_string();
    let out = s.ok(&["apply", "--server-side", "-f", &f]);
    assert!(out.contains("serverside-applied"), "{out}");
    let managed = s.ok(&[
        "get",
        "deploy",
        "web",
        "--show-managed-fields",
        "-o",
        "json",
    ]);
    assert!(
        managed.contains("\"manager\": \"kubectl\"")
            && managed.contains("\"operation\": \"Apply\""),
        "{managed}"
    );
    // Another manager takes replicas; re-applying a different count is a conflict...
    s.ok(&["scale", "deploy", "web", "--replicas=5"]);
    let with_three = DEPLOYMENT.replace("replicas: 2", "replicas: 3");
    let three = common::write(&s.dir, "web3.yaml", &with_three);
    let err = s.fails(&["apply", "--server-side", "-f", &three.display().to_string()]);
    assert!(
        err.contains("conflict") && err.contains(".spec.replicas"),
        "{err}"
    );
    assert_eq!(
        s.ok(&["get", "deploy", "web", "-o", "jsonpath={.spec.replicas}"]),
        "5"
    );
    // ...which forcing settles.
    s.ok(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        &three.display().to_string(),
    ]);
    assert_eq!(
        s.ok(&["get", "deploy", "web", "-o", "jsonpath={.spec.replicas}"]),
        "3"
    );
    // A field the applier no longer sets goes; fields others set stay.
    s.ok(&["label", "deploy", "web", "owner=ops"]);
    let without_env = with_three.replace(
        "        env:\n        - {name: A, value: \"1\"}\n        - {name: B, value: \"2\"}\n",
        "",
    );
    let trimmed = common::write(&s.dir, "web-trimmed.yaml", &without_env);
    s.ok(&[
        "apply",
        "--server-side",
        "-f",
        &trimmed.display().to_string(),
    ]);
    let d: serde_json::Value =
        serde_json::from_str(&s.ok(&["get", "deploy", "web", "-o", "json"])).unwrap();
    assert!(
        d["spec"]["template"]["spec"]["containers"][0]
            .get("env")
            .is_none(),
        "{d}"
    );
    assert_eq!(d["metadata"]["labels"]["owner"], "ops");
    // A new object is created by apply, and a kind's own schema still checks it.
    let cm = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: applied}\ndata: {a: b}\n";
    s.stdin(&["apply", "--server-side", "-f", "-"], cm);
    assert_eq!(
        s.ok(&["get", "cm", "applied", "-o", "jsonpath={.data.a}"]),
        "b"
    );
}
