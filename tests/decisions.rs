//! PlacementDecisions end to end: every ResourceBinding's clusters in OCM's shape (what Argo
//! CD's clusterDecisionResource generator reads) and in KEP-5313's, read here with kubectl
//! exactly as their consumers read them (a list by label selector, then the status list by
//! its key), following the binding as it changes and going with it.

use crate::common;

use std::time::Duration;

use common::eventually;
use common::fleet::Fleet;

const WEB: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: 4
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - {name: web, image: nginx, resources: {requests: {cpu: 100m, memory: 64Mi}}}
---
apiVersion: policy.karmada.io/v1alpha1
kind: PropagationPolicy
metadata: {name: web, namespace: default}
spec:
  resourceSelectors: [{apiVersion: apps/v1, kind: Deployment, name: web}]
  placement:
    clusterAffinity: {clusterNames: [a, b]}
    replicaScheduling: {replicaSchedulingType: Duplicated}
"#;

/// What Argo CD's generator reads: the decisions' `matchKey` values of every object the label
/// selector lists, from `status.<statusListKey>`.
fn ocm_clusters(f: &Fleet) -> Vec<String> {
    let l = f.s.get_json(&[
        "placementdecisions.cluster.open-cluster-management.io",
        "-n",
        "default",
        "-l",
        "cluster.open-cluster-management.io/placement=web-deployment",
        "-o",
        "json",
    ]);
    let mut v: Vec<String> = l["items"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|i| {
            i["status"]["decisions"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|d| d["clusterName"].as_str().unwrap().to_string())
        .collect();
    v.sort();
    v
}

/// KEP-5313's consumers: the ClusterProfiles the decisions with this placement key name.
fn sig_clusters(f: &Fleet) -> Vec<String> {
    let l = f.s.get_json(&[
        "placementdecisions.multicluster.x-k8s.io",
        "-n",
        "default",
        "-l",
        "multicluster.x-k8s.io/placement-key=web-deployment",
        "-o",
        "json",
    ]);
    let mut v: Vec<String> = l["items"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|i| i["decisions"].as_array().cloned().unwrap_or_default())
        .map(|d| {
            assert_eq!(d["clusterProfileRef"]["namespace"], "orrery-system", "{d}");
            d["clusterProfileRef"]["name"].as_str().unwrap().to_string()
        })
        .collect();
    v.sort();
    v
}

#[test]
fn placement_decisions_follow_their_binding_in_both_shapes() {
    let f = Fleet::start(&[("a", "r1"), ("b", "r1"), ("c", "r2")]);
    f.s.apply(WEB);
    eventually(Duration::from_secs(30), "decisions for a and b", || {
        ocm_clusters(&f) == ["a", "b"] && sig_clusters(&f) == ["a", "b"]
    });
    let d = f.s.get_json(&[
        "placementdecision.cluster.open-cluster-management.io",
        "web-deployment-decision-1",
        "-n",
        "default",
        "-o",
        "json",
    ]);
    assert_eq!(
        d["metadata"]["labels"]["cluster.open-cluster-management.io/decision-group-index"],
        "0"
    );
    assert_eq!(
        d["metadata"]["ownerReferences"][0]["kind"],
        "ResourceBinding"
    );
    assert!(
        d["status"]["decisions"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("replica"),
        "{d:#}"
    );
    // The clusters named by the KEP-5313 shape are ClusterProfiles that exist.
    for c in sig_clusters(&f) {
        f.s.ok(&["get", "clusterprofile", &c, "-n", "orrery-system"]);
    }
    let k = f.s.get_json(&[
        "placementdecision.multicluster.x-k8s.io",
        "web-deployment-0",
        "-n",
        "default",
        "-o",
        "json",
    ]);
    assert_eq!(
        k["metadata"]["labels"]["multicluster.x-k8s.io/decision-index"],
        "0"
    );
    assert_eq!(k["schedulerName"], "orrery");

    // The placement changes: the decisions follow.
    f.s.ok(&[
        "patch",
        "propagationpolicy",
        "web",
        "-n",
        "default",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"placement":{"clusterAffinity":{"clusterNames":["b","c"]}}}}"#,
    ]);
    eventually(Duration::from_secs(30), "decisions for b and c", || {
        ocm_clusters(&f) == ["b", "c"] && sig_clusters(&f) == ["b", "c"]
    });

    // They go with the binding.
    f.s.ok(&["delete", "deployment", "web", "-n", "default"]);
    eventually(Duration::from_secs(30), "no decisions", || {
        let gone = |kind: &str| {
            f.s.get_json(&[kind, "-n", "default", "-o", "json"])["items"]
                .as_array()
                .is_some_and(Vec::is_empty)
        };
        gone("placementdecisions.cluster.open-cluster-management.io")
            && gone("placementdecisions.multicluster.x-k8s.io")
    });
}
