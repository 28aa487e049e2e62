//! The strategic merge patch tags of the built-in kinds we serve, transcribed from the
//! `patchStrategy`/`patchMergeKey` struct tags of the upstream Go types (k8s.io/api v1.33).
//! A list without an entry here is atomic: a patch replaces it whole.
//!
//! They are written into the published OpenAPI v3 schemas as `x-kubernetes-patch-strategy` and
//! `x-kubernetes-patch-merge-key`, exactly where Kubernetes publishes them, so kubectl computes
//! patches with the same knowledge this server applies them with.

use serde_json::{Value, json};

use super::Components;

/// (component, field, strategy, merge key).
pub const PATCH_TAGS: &[(&str, &str, &str, &str)] = &[
    (
        "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
        "finalizers",
        "merge",
        "",
    ),
    (
        "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
        "ownerReferences",
        "merge",
        "uid",
    ),
    (
        "io.k8s.api.core.v1.PodSpec",
        "volumes",
        "merge,retainKeys",
        "name",
    ),
    (
        "io.k8s.api.core.v1.PodSpec",
        "initContainers",
        "merge",
        "name",
    ),
    ("io.k8s.api.core.v1.PodSpec", "containers", "merge", "name"),
    (
        "io.k8s.api.core.v1.PodSpec",
        "ephemeralContainers",
        "merge",
        "name",
    ),
    (
        "io.k8s.api.core.v1.PodSpec",
        "imagePullSecrets",
        "merge",
        "name",
    ),
    ("io.k8s.api.core.v1.PodSpec", "hostAliases", "merge", "ip"),
    (
        "io.k8s.api.core.v1.PodSpec",
        "topologySpreadConstraints",
        "merge",
        "topologyKey",
    ),
    (
        "io.k8s.api.core.v1.PodSpec",
        "schedulingGates",
        "merge",
        "name",
    ),
    (
        "io.k8s.api.core.v1.PodSpec",
        "resourceClaims",
        "merge,retainKeys",
        "name",
    ),
    (
        "io.k8s.api.core.v1.Container",
        "ports",
        "merge",
        "containerPort",
    ),
    ("io.k8s.api.core.v1.Container", "env", "merge", "name"),
    (
        "io.k8s.api.core.v1.Container",
        "volumeMounts",
        "merge",
        "mountPath",
    ),
    (
        "io.k8s.api.core.v1.Container",
        "volumeDevices",
        "merge",
        "devicePath",
    ),
    (
        "io.k8s.api.core.v1.EphemeralContainer",
        "ports",
        "merge",
        "containerPort",
    ),
    (
        "io.k8s.api.core.v1.EphemeralContainer",
        "env",
        "merge",
        "name",
    ),
    (
        "io.k8s.api.core.v1.EphemeralContainer",
        "volumeMounts",
        "merge",
        "mountPath",
    ),
    (
        "io.k8s.api.core.v1.EphemeralContainer",
        "volumeDevices",
        "merge",
        "devicePath",
    ),
    (
        "io.k8s.api.core.v1.PodStatus",
        "conditions",
        "merge",
        "type",
    ),
    ("io.k8s.api.core.v1.PodStatus", "podIPs", "merge", "ip"),
    ("io.k8s.api.core.v1.PodStatus", "hostIPs", "merge", "ip"),
    (
        "io.k8s.api.core.v1.PodStatus",
        "resourceClaimStatuses",
        "merge,retainKeys",
        "name",
    ),
    ("io.k8s.api.core.v1.ServiceSpec", "ports", "merge", "port"),
    (
        "io.k8s.api.core.v1.ServiceStatus",
        "conditions",
        "merge",
        "type",
    ),
    (
        "io.k8s.api.core.v1.ServiceAccount",
        "secrets",
        "merge",
        "name",
    ),
    (
        "io.k8s.api.core.v1.NamespaceStatus",
        "conditions",
        "merge",
        "type",
    ),
    (
        "io.k8s.api.core.v1.PersistentVolumeClaimStatus",
        "conditions",
        "merge",
        "type",
    ),
    (
        "io.k8s.api.apps.v1.DeploymentSpec",
        "strategy",
        "retainKeys",
        "",
    ),
    (
        "io.k8s.api.apps.v1.DeploymentStatus",
        "conditions",
        "merge",
        "type",
    ),
    (
        "io.k8s.api.apps.v1.StatefulSetStatus",
        "conditions",
        "merge",
        "type",
    ),
    (
        "io.k8s.api.apps.v1.DaemonSetStatus",
        "conditions",
        "merge",
        "type",
    ),
    (
        "io.k8s.api.apps.v1.ReplicaSetStatus",
        "conditions",
        "merge",
        "type",
    ),
    (
        "io.k8s.api.batch.v1.JobStatus",
        "conditions",
        "merge",
        "type",
    ),
];

/// Writes the tags into the components' property schemas.
pub fn annotate(components: &mut Components) {
    for (component, field, strategy, key) in PATCH_TAGS {
        let Some(prop) = components
            .get_mut(*component)
            .and_then(|c| c.get_mut("properties"))
            .and_then(|p| p.get_mut(*field))
            .and_then(Value::as_object_mut)
        else {
            // The upstream definitions changed under us; a test catches this.
            continue;
        };
        prop.insert("x-kubernetes-patch-strategy".into(), json!(strategy));
        if !key.is_empty() {
            prop.insert("x-kubernetes-patch-merge-key".into(), json!(key));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tag_lands_on_a_real_field() {
        let components = super::super::builtin();
        for (component, field, strategy, _) in PATCH_TAGS {
            let prop = &components[*component]["properties"][*field];
            assert_eq!(
                prop["x-kubernetes-patch-strategy"], *strategy,
                "{component}.{field}"
            );
        }
        // Tolerations are atomic upstream, not merged.
        assert!(
            components["io.k8s.api.core.v1.PodSpec"]["properties"]["tolerations"]
                .get("x-kubernetes-patch-strategy")
                .is_none()
        );
    }
}
