//! `Work` (multicluster.io/v1alpha1): what one member cluster must run, as a list of manifests,
//! and what the member reports back about each of them.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::conditions::Condition;
use crate::validation::{self, ErrorList, FieldError};

pub use crate::meta::Health;

/// Label put on every object an agent applies to a member, so it can tell its own objects from
/// ones it must not touch.
pub const MANAGED_LABEL: &str = "multicluster.io/managed-by";
pub const MANAGED_VALUE: &str = "orrery";
/// Annotation naming the Work (`namespace/name`) an applied object comes from.
pub const WORK_ANNOTATION: &str = "multicluster.io/work";

pub const CONDITION_APPLIED: &str = "Applied";
/// The reason of `Applied=False` when the member refused a manifest (or the Work's transfer
/// failed): a move takes it for the target refusing the workload.
pub const REASON_APPLIED_FAILED: &str = "AppliedFailed";
/// The reason of `Applied=False` when the member did not answer: the agent applies the Work
/// again once it does, and what the member ran before may still run there.
pub const REASON_MEMBER_UNAVAILABLE: &str = "MemberUnavailable";
pub const CONDITION_AVAILABLE: &str = "Available";
/// `False` while a Retain script of the Work failed at its last apply (reason
/// [`REASON_INTERPRET_FAILED`], the message says which and why): the object was applied
/// without it. Absent when no script failed.
pub const CONDITION_RETAINED: &str = "Retained";
pub const REASON_INTERPRET_FAILED: &str = "InterpretFailed";

/// Most manifests one Work may carry.
pub const MAX_MANIFESTS: usize = 1000;

#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum ConflictResolution {
    /// Leave an object the member already has, and that Orrery does not manage, alone.
    #[default]
    Abort,
    /// Take it over.
    Overwrite,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    #[serde(default)]
    pub manifests: Vec<Value>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkSpec {
    #[serde(default)]
    pub workload: Workload,
    #[serde(default)]
    pub conflict_resolution: ConflictResolution,
    /// Keep the objects in the member when the Work is deleted.
    #[serde(default)]
    pub preserve_resources_on_deletion: bool,
    /// Volume transfers the member takes part in (Orrery's data mover): carried out by the
    /// agent, never applied as objects.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub transfers: Vec<crate::stateful::Transfer>,
    /// Karmada's `Retain` scripts for the Work's manifests: on each update of an object the
    /// member has, the agent applies `Retain(desired, observed)` in place of the manifest.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retention: Vec<Retention>,
}

/// A `Retain` script (a ResourceInterpreterCustomization's `retention`) for the manifests of
/// one kind.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Retention {
    pub api_version: String,
    pub kind: String,
    /// The customization it comes from (named in a failure).
    #[serde(default)]
    pub customization: String,
    pub lua_script: String,
}

impl Retention {
    /// Whether it is for `manifest`'s kind.
    pub fn applies_to(&self, manifest: &Value) -> bool {
        manifest.get("apiVersion").and_then(Value::as_str) == Some(self.api_version.as_str())
            && manifest.get("kind").and_then(Value::as_str) == Some(self.kind.as_str())
    }
}

/// Which object of a Work a status is about.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceIdentifier {
    pub ordinal: usize,
    #[serde(default)]
    pub group: String,
    pub version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    pub name: String,
}

impl ResourceIdentifier {
    /// The identifier of a manifest, if it names its apiVersion, kind and name.
    pub fn of(ordinal: usize, manifest: &Value) -> Option<Self> {
        let api_version = manifest.get("apiVersion")?.as_str()?;
        let (group, version) = match api_version.split_once('/') {
            Some((g, v)) => (g.to_string(), v.to_string()),
            None => (String::new(), api_version.to_string()),
        };
        let kind = manifest.get("kind")?.as_str()?.to_string();
        let meta = manifest.get("metadata")?;
        let name = meta.get("name")?.as_str()?.to_string();
        let namespace = meta
            .get("namespace")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        Some(ResourceIdentifier {
            ordinal,
            group,
            version,
            kind,
            namespace,
            name,
        })
    }

    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `Deployment apps/v1 ns/name`, for messages.
    pub fn describe(&self) -> String {
        let at = if self.namespace.is_empty() {
            self.name.clone()
        } else {
            format!("{}/{}", self.namespace, self.name)
        };
        format!("{} {} {at}", self.kind, self.api_version())
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManifestStatus {
    pub identifier: ResourceIdentifier,
    #[serde(default)]
    pub applied: bool,
    #[serde(default)]
    pub health: Health,
    /// The object's own status in the member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Value>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The object's `metadata.generation` in the member (what its controller's
    /// `status.observedGeneration` is compared with).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// The persistent volumes the object's pods use, for workloads.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<crate::stateful::VolumeStatus>,
    /// What a workload's pods use, for members that measure it (their metrics server): what
    /// a FederatedHPA scales on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<WorkloadUsage>,
    /// A Service's endpoints in the member (what multi-cluster services export).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<crate::services::ServiceEndpoints>,
    /// How many times the containers of a workload's pods have restarted, summed (a crash
    /// loop shows here before readiness does): what a rollout's `maxRestarts` gates on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarts: Option<i64>,
}

/// The usage of a workload's ready pods in one member, summed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadUsage {
    /// Pods running and ready: their usage is counted.
    pub ready_pods: i64,
    /// Pods not ready yet (starting): no usage of theirs is known.
    #[serde(default)]
    pub unready_pods: i64,
    pub cpu_milli: i64,
    pub cpu_request_milli: i64,
    pub memory_bytes: i64,
    pub memory_request_bytes: i64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub manifest_statuses: Vec<ManifestStatus>,
    /// The Work generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Where each of the spec's transfers stands.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub transfers: Vec<crate::stateful::TransferStatus>,
}

/// Validates a Work's spec: every manifest names its apiVersion, kind and a valid name, the
/// same object does not appear twice, and the Work is not too large.
pub fn validate_spec(spec: Option<&Value>) -> ErrorList {
    let mut errs = Vec::new();
    let Some(spec) = spec.filter(|s| !s.is_null()) else {
        return errs;
    };
    if let Some(c) = spec.get("conflictResolution").and_then(Value::as_str)
        && !matches!(c, "Abort" | "Overwrite")
    {
        errs.push(FieldError::not_supported(
            "spec.conflictResolution",
            c,
            &["Abort", "Overwrite"],
        ));
    }
    let Some(manifests) = spec.pointer("/workload/manifests") else {
        return errs;
    };
    let Value::Array(manifests) = manifests else {
        errs.push(FieldError::type_invalid(
            "spec.workload.manifests",
            manifests,
            "array",
        ));
        return errs;
    };
    if manifests.len() > MAX_MANIFESTS {
        errs.push(FieldError::too_long(
            "spec.workload.manifests",
            MAX_MANIFESTS,
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for (i, m) in manifests.iter().enumerate() {
        let path = format!("spec.workload.manifests[{i}]");
        if !m.is_object() {
            errs.push(FieldError::type_invalid(&path, "", "object"));
            continue;
        }
        for f in ["apiVersion", "kind"] {
            if m.get(f).and_then(Value::as_str).unwrap_or("").is_empty() {
                errs.push(FieldError::required(format!("{path}.{f}"), ""));
            }
        }
        let name = m
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("");
        if name.is_empty() {
            errs.push(FieldError::required(format!("{path}.metadata.name"), ""));
        } else {
            for msg in validation::is_valid_path_segment_name(name) {
                errs.push(FieldError::invalid(
                    format!("{path}.metadata.name"),
                    name,
                    msg,
                ));
            }
        }
        if let Some(id) = ResourceIdentifier::of(i, m) {
            let key = (id.group, id.kind, id.namespace, id.name);
            if !seen.insert(key.clone()) {
                errs.push(FieldError::duplicate(
                    path,
                    format!("{} {}/{}", key.1, key.2, key.3),
                ));
            }
        }
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn identifiers() {
        let m = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "prod"}});
        let id = ResourceIdentifier::of(3, &m).unwrap();
        assert_eq!(
            (id.group.as_str(), id.version.as_str(), id.ordinal),
            ("apps", "v1", 3)
        );
        assert_eq!(id.api_version(), "apps/v1");
        assert_eq!(id.describe(), "Deployment apps/v1 prod/web");
        let core = ResourceIdentifier::of(
            0,
            &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}}),
        )
        .unwrap();
        assert_eq!(core.api_version(), "v1");
        assert_eq!(core.describe(), "Namespace v1 x");
        assert!(ResourceIdentifier::of(0, &json!({"kind": "X"})).is_none());
    }

    #[test]
    fn spec_validation() {
        let cm = |name: &str| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "d"}});
        let cases: Vec<(Value, Vec<&str>)> = vec![
            (
                json!({"workload": {"manifests": [cm("a"), cm("b")]}}),
                vec![],
            ),
            (
                json!({"workload": {"manifests": "x"}}),
                vec!["spec.workload.manifests"],
            ),
            (
                json!({"workload": {"manifests": [1]}}),
                vec!["spec.workload.manifests[0]"],
            ),
            (
                json!({"workload": {"manifests": [{"metadata": {"name": "a"}}]}}),
                vec![
                    "spec.workload.manifests[0].apiVersion",
                    "spec.workload.manifests[0].kind",
                ],
            ),
            (
                json!({"workload": {"manifests": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {}}]}}),
                vec!["spec.workload.manifests[0].metadata.name"],
            ),
            (
                json!({"workload": {"manifests": [cm("a"), cm("a")]}}),
                vec!["spec.workload.manifests[1]"],
            ),
            (
                json!({"conflictResolution": "Maybe"}),
                vec!["spec.conflictResolution"],
            ),
        ];
        for (spec, fields) in cases {
            let got: Vec<String> = validate_spec(Some(&spec))
                .into_iter()
                .map(|e| e.field)
                .collect();
            assert_eq!(got, fields, "{spec}");
        }
    }

    #[test]
    fn status_round_trip() {
        let s = WorkStatus {
            manifest_statuses: vec![ManifestStatus {
                identifier: ResourceIdentifier::of(
                    0,
                    &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}}),
                )
                .unwrap(),
                applied: true,
                health: Health::Healthy,
                ..Default::default()
            }],
            ..Default::default()
        };
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["manifestStatuses"][0]["health"], "Healthy");
        assert_eq!(serde_json::from_value::<WorkStatus>(v).unwrap(), s);
    }
}
