//! The SIG-Multicluster APIs at their current versions: mcs-api v0.5.0's ServiceExport and
//! ServiceImport and about-api's ClusterProperty, served at v1beta1 (stored) beside v1alpha1,
//! through kubectl and a typed kube client per version.

use crate::common;

use std::borrow::Cow;
use std::time::Duration;

use common::{Server, eventually};
use futures_util::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// A typed ServiceExport of one version: the same fields at both (mcs-api's versions differ
/// in name only).
macro_rules! service_export {
    ($name:ident, $version:literal) => {
        #[derive(Clone, Debug, Serialize, Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct $name {
            api_version: String,
            kind: String,
            #[serde(default)]
            metadata: ObjectMeta,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            spec: Option<ExportSpec>,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            status: Option<Value>,
        }
        impl kube::Resource for $name {
            type DynamicType = ();
            type Scope = k8s_openapi::NamespaceResourceScope;
            fn kind(_: &()) -> Cow<'_, str> {
                "ServiceExport".into()
            }
            fn group(_: &()) -> Cow<'_, str> {
                "multicluster.x-k8s.io".into()
            }
            fn version(_: &()) -> Cow<'_, str> {
                $version.into()
            }
            fn plural(_: &()) -> Cow<'_, str> {
                "serviceexports".into()
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
        impl $name {
            fn new(name: &str, spec: ExportSpec) -> Self {
                $name {
                    api_version: format!("multicluster.x-k8s.io/{}", $version),
                    kind: "ServiceExport".into(),
                    metadata: ObjectMeta {
                        name: Some(name.into()),
                        namespace: Some("default".into()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(spec),
                    status: None,
                }
            }
        }
    };
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ExportSpec {
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    exported_labels: std::collections::BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    exported_annotations: std::collections::BTreeMap<String, String>,
}

service_export!(ExportV1Alpha1, "v1alpha1");
service_export!(ExportV1Beta1, "v1beta1");

/// `kubectl get --raw path`, as JSON.
fn raw(s: &Server, path: &str) -> Value {
    serde_json::from_str(&s.ok(&["get", "--raw", path])).unwrap()
}

fn spec(label: &str) -> ExportSpec {
    ExportSpec {
        exported_labels: [("tier".to_string(), label.to_string())].into(),
        exported_annotations: [("note".to_string(), format!("{label}-note"))].into(),
    }
}

#[test]
fn mcs_and_about_apis_are_served_at_v1beta1_and_v1alpha1_with_kubectl() {
    let s = Server::start();
    let g = "multicluster.x-k8s.io";
    // Written at either version, read at both: every field kept, one object.
    s.apply(
        "apiVersion: multicluster.x-k8s.io/v1alpha1\nkind: ServiceExport\nmetadata: {name: old, namespace: default, labels: {team: blue}}\nspec: {exportedLabels: {tier: a}, exportedAnnotations: {note: hello}}\n",
    );
    s.apply(
        "apiVersion: multicluster.x-k8s.io/v1beta1\nkind: ServiceExport\nmetadata: {name: new, namespace: default}\nspec: {exportedLabels: {tier: b}}\n",
    );
    s.ok(&[
        "patch",
        &format!("serviceexports.v1alpha1.{g}"),
        "old",
        "-n",
        "default",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"conditions":[{"type":"Valid","status":"True","reason":"Valid","message":"ok","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}"#,
    ]);
    for name in ["old", "new"] {
        let at = |v: &str| s.get_json(&[&format!("serviceexports.{v}.{g}"), name, "-n", "default"]);
        let strip = |mut o: Value| {
            o.as_object_mut().unwrap().remove("apiVersion");
            o["metadata"]
                .as_object_mut()
                .unwrap()
                .remove("managedFields");
            o
        };
        // The same object at both (once the export controller has said it has no Service).
        let mut b = Value::Null;
        eventually(
            Duration::from_secs(10),
            "the same object at both versions",
            || {
                let a = at("v1alpha1");
                b = at("v1beta1");
                assert_eq!(a["apiVersion"], format!("{g}/v1alpha1"));
                assert_eq!(b["apiVersion"], format!("{g}/v1beta1"));
                strip(a) == strip(b.clone())
            },
        );
        if name == "old" {
            assert_eq!(b["spec"]["exportedAnnotations"]["note"], "hello");
            assert_eq!(b["metadata"]["labels"]["team"], "blue");
            assert!(b["status"]["conditions"][0]["reason"].is_string(), "{b:#}");
        }
    }
    // The preferred version is v1beta1: kubectl without one reads it.
    let plain = s.get_json(&["serviceexport", "new", "-n", "default"]);
    assert_eq!(plain["apiVersion"], format!("{g}/v1beta1"));
    let list = s.get_json(&[&format!("serviceexports.v1alpha1.{g}"), "-A"]);
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 2);
    assert!(
        items
            .iter()
            .all(|i| i["apiVersion"] == format!("{g}/v1alpha1")),
        "{list:#}"
    );

    // Unknown fields are refused at both versions, and nothing is written.
    for v in ["v1alpha1", "v1beta1"] {
        let err = s.fails_stdin(
            &["apply", "-f", "-"],
            &format!("apiVersion: {g}/{v}\nkind: ServiceExport\nmetadata: {{name: bad, namespace: default}}\nspec: {{exportedLabel: {{a: b}}}}\n"),
        );
        assert!(
            err.contains("unknown field") && err.contains("exportedLabel"),
            "{v}: {err}"
        );
    }
    s.fails(&["get", "serviceexport", "bad", "-n", "default"]);

    // Discovery: both versions, v1beta1 preferred; the group's v1alpha1-only kinds stay there.
    let group = raw(&s, &format!("/apis/{g}"));
    assert_eq!(group["preferredVersion"]["version"], "v1beta1", "{group:#}");
    let versions: Vec<&str> = group["versions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["version"].as_str())
        .collect();
    assert_eq!(versions, ["v1beta1", "v1alpha1"]);
    let names = |v: &str| -> Vec<String> {
        let l = raw(&s, &format!("/apis/{g}/{v}"));
        l["resources"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|r| r["name"].as_str().map(str::to_string))
            .collect()
    };
    let beta = names("v1beta1");
    assert!(
        beta.contains(&"serviceexports".to_string())
            && beta.contains(&"serviceimports/status".to_string()),
        "{beta:?}"
    );
    assert!(
        !beta.iter().any(|n| n.starts_with("clusterprofiles")),
        "{beta:?}"
    );
    assert!(names("v1alpha1").contains(&"clusterprofiles".to_string()));
    let api_versions = s.ok(&["api-versions"]);
    for v in [
        "multicluster.x-k8s.io/v1beta1",
        "multicluster.x-k8s.io/v1alpha1",
        "about.k8s.io/v1beta1",
        "about.k8s.io/v1alpha1",
    ] {
        assert!(api_versions.lines().any(|l| l == v), "{v}: {api_versions}");
    }
    // OpenAPI v3 describes each version under its own name.
    for v in ["v1alpha1", "v1beta1"] {
        let doc = raw(&s, &format!("/openapi/v3/apis/{g}/{v}"));
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        let export = schemas
            .values()
            .find(|c| {
                c["x-kubernetes-group-version-kind"][0]
                    == json!({"group": g, "version": v, "kind": "ServiceExport"})
            })
            .unwrap_or_else(|| panic!("{v}: no ServiceExport schema"));
        assert!(export["properties"]["spec"].is_object(), "{v}: {export:#}");
    }
    // The CRD lists both, v1beta1 stored.
    let crd = s.get_json(&["crd", &format!("serviceexports.{g}")]);
    let vs: Vec<(String, bool)> = crd["spec"]["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["name"].as_str().unwrap().to_string(),
                v["storage"] == true,
            )
        })
        .collect();
    assert_eq!(
        vs,
        [
            ("v1beta1".to_string(), true),
            ("v1alpha1".to_string(), false)
        ]
    );
    assert_eq!(crd["status"]["storedVersions"], json!(["v1beta1"]));

    // ClusterProperty the same way, with its value required and shown.
    s.apply("apiVersion: about.k8s.io/v1alpha1\nkind: ClusterProperty\nmetadata: {name: cluster.clusterset.k8s.io}\nspec: {value: hub}\n");
    let p = s.get_json(&[
        "clusterproperties.v1beta1.about.k8s.io",
        "cluster.clusterset.k8s.io",
    ]);
    assert_eq!(
        (p["apiVersion"].as_str(), p["spec"]["value"].as_str()),
        (Some("about.k8s.io/v1beta1"), Some("hub"))
    );
    let table = s.ok(&["get", "clusterproperties"]);
    assert!(table.contains("VALUE") && table.contains("hub"), "{table}");
    let err = s.fails_stdin(
        &["apply", "-f", "-"],
        "apiVersion: about.k8s.io/v1beta1\nkind: ClusterProperty\nmetadata: {name: clusterset.k8s.io}\nspec: {value: \"\"}\n",
    );
    assert!(err.contains("spec.value"), "{err}");
    let crd = s.get_json(&["crd", "clusterproperties.about.k8s.io"]);
    assert_eq!(
        crd["spec"]["versions"][0]["subresources"],
        json!({"status": {}})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typed_client_per_version_reads_what_the_other_wrote() {
    let s = Server::start();
    let client = s.client().await;
    let alpha: Api<ExportV1Alpha1> = Api::namespaced(client.clone(), "default");
    let beta: Api<ExportV1Beta1> = Api::namespaced(client.clone(), "default");
    let watch_from = alpha.list(&ListParams::default()).await.unwrap();
    let rv = watch_from.metadata.resource_version.unwrap();

    // v1alpha1 → v1beta1.
    let made = alpha
        .create(
            &PostParams::default(),
            &ExportV1Alpha1::new("web", spec("a")),
        )
        .await
        .unwrap();
    assert_eq!(made.api_version, "multicluster.x-k8s.io/v1alpha1");
    let read = beta.get("web").await.unwrap();
    assert_eq!(read.api_version, "multicluster.x-k8s.io/v1beta1");
    assert_eq!(read.spec, Some(spec("a")));
    assert_eq!(read.metadata.uid, made.metadata.uid);
    // v1beta1 → v1alpha1, by a replace at the version read (read again while the export
    // controller writes the export's status).
    let replaced = loop {
        let mut read = beta.get("web").await.unwrap();
        read.spec = Some(spec("b"));
        match beta.replace("web", &PostParams::default(), &read).await {
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            r => break r.unwrap(),
        }
    };
    assert_eq!(replaced.api_version, "multicluster.x-k8s.io/v1beta1");
    let back = alpha.get("web").await.unwrap();
    assert_eq!(back.spec, Some(spec("b")));
    assert_eq!(back.metadata.uid, made.metadata.uid);
    // A stale write at the other version conflicts as at the same one.
    let mut stale = made.clone();
    stale.spec = Some(spec("c"));
    let err = alpha
        .replace("web", &PostParams::default(), &stale)
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref e) if e.code == 409),
        "{err:?}"
    );
    beta.create(
        &PostParams::default(),
        &ExportV1Beta1::new("api", spec("z")),
    )
    .await
    .unwrap();

    // A watch at v1alpha1 sees every change at v1alpha1, whoever wrote it.
    let mut events = alpha
        .watch(&WatchParams::default().timeout(10), &rv)
        .await
        .unwrap()
        .boxed();
    // (The export controller's status writes come between: each change is kept once.)
    let mut seen: Vec<(String, String)> = Vec::new();
    while seen.len() < 3 {
        match events.next().await.unwrap().unwrap() {
            WatchEvent::Added(o) | WatchEvent::Modified(o) => {
                assert_eq!(o.api_version, "multicluster.x-k8s.io/v1alpha1", "{o:?}");
                let change = (
                    o.metadata.name.unwrap(),
                    o.spec.unwrap().exported_labels["tier"].clone(),
                );
                if !seen.contains(&change) {
                    seen.push(change);
                }
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        seen,
        [
            ("web".into(), "a".into()),
            ("web".into(), "b".into()),
            ("api".into(), "z".into())
        ]
    );
}

/// Kueue's Workload CRD as a worker cluster has it (trimmed: the fields this test writes).
const WORKLOAD_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: workloads.kueue.x-k8s.io}
spec:
  group: kueue.x-k8s.io
  scope: Namespaced
  names: {plural: workloads, singular: workload, kind: Workload, listKind: WorkloadList}
  versions:
  - name: v1beta2
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, x-kubernetes-preserve-unknown-fields: true}
          status: {type: object, x-kubernetes-preserve-unknown-fields: true}
"#;

/// One access provider of a consumer's configuration (Kueue's
/// `multiKueue.clusterProfile.accessProviders[]`, cluster-inventory-api's `access.Provider`).
struct Provider {
    name: String,
    exec: Value,
}

/// cluster-inventory-api's `BuildConfigFromCP` (pkg/access, v0.1.2), rule for rule: the
/// profile's providers are `credentialProviders` overlaid by `accessProviders` (by name); the
/// first of the consumer's providers, in its order, that the profile has is used; the config
/// takes that provider's server, CA data and proxy URL, and its exec plugin from the
/// consumer's provider with interactiveMode Never, the reserved
/// `client.authentication.k8s.io/exec` extension passed to the plugin as the cluster's config.
async fn build_config_from_cp(profile: &Value, providers: &[Provider]) -> kube::Config {
    let mut by_name: std::collections::BTreeMap<String, Value> = Default::default();
    for field in ["credentialProviders", "accessProviders"] {
        for p in profile["status"][field].as_array().into_iter().flatten() {
            by_name.insert(p["name"].as_str().unwrap().to_string(), p.clone());
        }
    }
    let (provider, access) = providers
        .iter()
        .find_map(|p| Some((p, by_name.get(&p.name)?)))
        .unwrap_or_else(|| {
            panic!(
                "no matching cluster accessor found for cluster profile {}",
                profile["metadata"]["name"]
            )
        });
    let cluster = &access["cluster"];
    let mut exec = provider.exec.clone();
    exec["interactiveMode"] = json!("Never");
    let kubeconfig: kube::config::Kubeconfig = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "cp",
        "clusters": [{"name": "cp", "cluster": {
            "server": cluster["server"],
            "certificate-authority-data": cluster["certificate-authority-data"],
            "proxy-url": cluster.get("proxy-url"),
            "extensions": cluster.get("extensions"),
        }}],
        "contexts": [{"name": "cp", "context": {"cluster": "cp", "user": "cp"}}],
        "users": [{"name": "cp", "user": {"exec": exec}}],
    }))
    .unwrap();
    kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multikueue_manager_reaches_members_through_orrerys_cluster_profiles() {
    use k8s_openapi::api::batch::v1::Job;
    use kube::api::{DeleteParams, DynamicObject};
    use kube::core::{ApiResource, GroupVersionKind};

    // Two workers and the manager's own cluster: Orrery servers standing in for the members'
    // APIs, each behind an agent that dials out (nothing dials in to a member), the workers
    // with Kueue's Workload CRD. Orrery keeps the profiles in Kueue's namespace of the manager.
    let s = Server::start_with(&["--publish-cluster-profiles", "manager/kueue-system"]);
    let members: Vec<Server> = (0..3).map(|_| Server::start()).collect();
    let mut agents = Vec::new();
    for (i, m) in members.iter().enumerate() {
        let name = match i {
            2 => "manager".to_string(),
            _ => {
                m.apply(WORKLOAD_CRD);
                format!("worker{}", i + 1)
            }
        };
        let token = s.token(&name);
        let mk = m.kubeconfig.display().to_string();
        agents.push(common::Agent::start(
            &s,
            &name,
            &[
                "--cluster",
                &name,
                "--token",
                &token,
                "--kubeconfig",
                &mk,
                "--heartbeat-interval",
                "1s",
            ],
        ));
    }
    eventually(Duration::from_secs(30), "the members Ready", || {
        ["worker1", "worker2", "manager"]
            .iter()
            .all(|c| s.cluster_condition(c, "Ready") == "True")
    });

    // Kueue's manager has its own identity in Orrery: it may mint the proxy identities'
    // tokens, nothing else (it reads the profiles in its own cluster).
    s.apply(
        r#"
apiVersion: v1
kind: Namespace
metadata: {name: kueue-system}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: kueue-controller-manager, namespace: kueue-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: kueue-proxy-tokens, namespace: orrery-cluster-proxy}
rules:
- {apiGroups: [""], resources: [serviceaccounts/token], verbs: [create]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: kueue-proxy-tokens, namespace: orrery-cluster-proxy}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: kueue-proxy-tokens}
subjects: [{kind: ServiceAccount, name: kueue-controller-manager, namespace: kueue-system}]
"#,
    );
    let manager_token = s
        .ok(&[
            "create",
            "token",
            "kueue-controller-manager",
            "-n",
            "kueue-system",
        ])
        .trim()
        .to_string();
    let admin: Value =
        serde_json::from_str(&s.ok(&["config", "view", "--raw", "-o", "json"])).unwrap();
    let manager_kubeconfig = s.dir.join("kueue-manager.kubeconfig");
    std::fs::write(
        &manager_kubeconfig,
        json!({
            "apiVersion": "v1", "kind": "Config", "current-context": "orrery",
            "clusters": [{"name": "orrery", "cluster": admin["clusters"][0]["cluster"]}],
            "contexts": [{"name": "orrery", "context": {"cluster": "orrery", "user": "kueue"}}],
            "users": [{"name": "kueue", "user": {"token": manager_token}}],
        })
        .to_string(),
    )
    .unwrap();
    let manager = orrery_client::from_kubeconfig(&manager_kubeconfig)
        .await
        .unwrap();
    let in_orrery: Api<DynamicObject> = Api::namespaced_with(
        manager,
        "orrery-system",
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("multicluster.x-k8s.io", "v1alpha1", "ClusterProfile"),
            "clusterprofiles",
        ),
    );
    match in_orrery.list(&ListParams::default()).await {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 403),
        other => panic!("the manager read Orrery's profiles: {other:?}"),
    }
    // The provider as Kueue's configuration names it (multiKueue.clusterProfile.accessProviders).
    let providers = [
        Provider {
            name: "someone-else".into(),
            exec: json!({"command": "/bin/false"}),
        },
        Provider {
            name: "orrery".into(),
            exec: json!({
                "apiVersion": "client.authentication.k8s.io/v1",
                "command": env!("CARGO_BIN_EXE_orrery"),
                "args": ["credentials", "--kubeconfig", manager_kubeconfig.display().to_string()],
                "provideClusterInfo": true,
            }),
        },
    ];
    // Kueue reads the profiles in its own namespace of the cluster it runs in.
    let in_manager = orrery_client::from_kubeconfig(&members[2].kubeconfig)
        .await
        .unwrap();
    let profiles: Api<DynamicObject> = Api::namespaced_with(
        in_manager,
        "kueue-system",
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("multicluster.x-k8s.io", "v1alpha1", "ClusterProfile"),
            "clusterprofiles",
        ),
    );
    // The profiles say how to reach each worker, and its proxy identity exists.
    let mut profile = Value::Null;
    for _ in 0..100 {
        profile = match profiles.get_opt("worker1").await.unwrap() {
            Some(p) => serde_json::to_value(p).unwrap(),
            None => Value::Null,
        };
        if profile["status"]["accessProviders"][0]["cluster"]["extensions"].is_array()
            && s.kubectl(&["get", "sa", "worker1", "-n", "orrery-cluster-proxy"])
                .status
                .success()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let provider = &profile["status"]["accessProviders"][0];
    assert_eq!(
        provider["cluster"]["extensions"][0]["name"], "client.authentication.k8s.io/exec",
        "{profile:#}"
    );
    assert_eq!(
        provider["cluster"]["extensions"][0]["extension"],
        json!({"clusterName": "worker1"})
    );
    assert_eq!(
        profile["status"]["credentialProviders"],
        profile["status"]["accessProviders"]
    );
    // The copy says what the control plane's profile says.
    let own: Value = serde_json::from_str(&s.ok(&[
        "get",
        "clusterprofile",
        "worker1",
        "-n",
        "orrery-system",
        "-o",
        "json",
    ]))
    .unwrap();
    assert_eq!(profile["spec"], own["spec"]);
    for field in ["version", "properties", "conditions", "accessProviders"] {
        assert_eq!(profile["status"][field], own["status"][field], "{field}");
    }

    // A Job and its Workload in worker1, made, watched and deleted through the proxy.
    let config = build_config_from_cp(&profile, &providers).await;
    let worker = kube::Client::try_from(config).unwrap();
    let jobs: Api<Job> = Api::namespaced(worker.clone(), "default");
    let workloads: Api<DynamicObject> = Api::namespaced_with(
        worker.clone(),
        "default",
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta2", "Workload"),
            "workloads",
        ),
    );
    let rv = jobs
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut watch = jobs
        .watch(&WatchParams::default().timeout(20), &rv)
        .await
        .unwrap()
        .boxed();
    let job: Job = serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "sample-job", "namespace": "default",
                     "labels": {"kueue.x-k8s.io/multikueue-origin": "manager"}},
        "spec": {"template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "c", "image": "busybox", "args": ["sleep", "1"]}]}}}
    }))
    .unwrap();
    jobs.create(&PostParams::default(), &job).await.unwrap();
    let wl: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": {"name": "job-sample-job", "namespace": "default",
                     "labels": {"kueue.x-k8s.io/multikueue-origin": "manager"}},
        "spec": {"queueName": "user-queue", "podSets": [{"name": "main", "count": 1}]}
    }))
    .unwrap();
    workloads.create(&PostParams::default(), &wl).await.unwrap();
    match watch.next().await.unwrap().unwrap() {
        WatchEvent::Added(j) => assert_eq!(j.metadata.name.as_deref(), Some("sample-job")),
        other => panic!("{other:?}"),
    }
    // They are in the member itself.
    members[0].ok(&["get", "job", "sample-job", "-n", "default"]);
    members[0].ok(&[
        "get",
        "workloads.kueue.x-k8s.io",
        "job-sample-job",
        "-n",
        "default",
    ]);
    assert!(
        !members[1]
            .kubectl(&["get", "job", "sample-job", "-n", "default"])
            .status
            .success()
    );
    jobs.delete("sample-job", &DeleteParams::background())
        .await
        .unwrap();
    workloads
        .delete("job-sample-job", &DeleteParams::default())
        .await
        .unwrap();
    loop {
        match watch.next().await.unwrap().unwrap() {
            WatchEvent::Deleted(j) => {
                assert_eq!(j.metadata.name.as_deref(), Some("sample-job"));
                break;
            }
            WatchEvent::Modified(_) | WatchEvent::Bookmark(_) => {}
            other => panic!("{other:?}"),
        }
    }
    assert!(
        !members[0]
            .kubectl(&[
                "get",
                "workloads.kueue.x-k8s.io",
                "job-sample-job",
                "-n",
                "default"
            ])
            .status
            .success()
    );

    // A token is good for its own cluster's proxy only, and the manager's own credentials
    // reach no proxy at all.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_orrery"))
        .args(["credentials", "--cluster", "worker1", "--kubeconfig"])
        .arg(&manager_kubeconfig)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cred: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(cred["kind"], "ExecCredential");
    let token = cred["status"]["token"].as_str().unwrap();
    let expires = cred["status"]["expirationTimestamp"].as_str().unwrap();
    assert!(
        expires > orrery_api::Time::now().to_string().as_str(),
        "{expires}"
    );
    let get = |cluster: &str, bearer: &str| {
        let url = format!(
            "{}/apis/multicluster.io/v1alpha1/clusters/{cluster}/proxy/api/v1/namespaces",
            s.url
        );
        let out = std::process::Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--cacert"])
            .arg(s.dir.join("tls/ca.crt"))
            .args(["-H", &format!("Authorization: Bearer {bearer}"), &url])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(get("worker1", token), "200");
    assert_eq!(get("worker2", token), "403");
    assert_eq!(get("worker1", &manager_token), "403");
    // The manager cannot mint a token of another account, nor read the control plane's
    // Secrets.
    let err = s.fails(&[
        "create",
        "token",
        "default",
        "-n",
        "default",
        "--token",
        &manager_token,
    ]);
    assert!(err.contains("forbidden"), "{err}");

    // A worker that leaves takes its copy with it.
    s.ok(&["delete", "cluster", "worker2", "--wait=false"]);
    for _ in 0..150 {
        if profiles.get_opt("worker2").await.unwrap().is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(profiles.get_opt("worker2").await.unwrap().is_none());
    assert!(profiles.get_opt("worker1").await.unwrap().is_some());
}
