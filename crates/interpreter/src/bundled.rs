//! Orrery's own customizations of the third-party kinds Karmada interprets by default
//! (OpenKruise, Argo, Flux, Kyverno, Kubeflow, Ray, Spark, Flink, Volcano): one
//! `ResourceInterpreterCustomization` per kind under `bundled/<group>/<version>/<Kind>/`, with
//! its golden cases in `testdata/<operation>-test.yaml` (Karmada's test layout).
//!
//! They answer after a user's customizations and before the built-in rules, per operation, as
//! Karmada's third-party layer does: a user's script of an operation wins, the bundled one
//! answers the operations the user left out.
//!
//! Invariant: the files are compiled into the binary and every one of them parses and passes
//! its cases (`tests::every_bundled_kind_gives_its_answers`), so loading cannot fail at run
//! time; a file that did not parse would be left out, never panic.

use std::sync::OnceLock;

use orrery_api::customization::CustomizationSpec;
use serde_json::Value;

use crate::Customizations;

macro_rules! kinds {
    ($($path:literal),* $(,)?) => {
        &[$(($path, include_str!(concat!("../bundled/", $path, "/customizations.yaml")))),*]
    };
}

/// Each kind's folder (`group/version/Kind`) and its customization's text.
pub const FILES: &[(&str, &str)] = kinds![
    "apps.kruise.io/v1alpha1/AdvancedCronJob",
    "apps.kruise.io/v1alpha1/BroadcastJob",
    "apps.kruise.io/v1alpha1/CloneSet",
    "apps.kruise.io/v1alpha1/DaemonSet",
    "apps.kruise.io/v1alpha1/SidecarSet",
    "apps.kruise.io/v1alpha1/UnitedDeployment",
    "apps.kruise.io/v1beta1/StatefulSet",
    "argoproj.io/v1alpha1/Rollout",
    "argoproj.io/v1alpha1/Workflow",
    "batch.volcano.sh/v1alpha1/Job",
    "flink.apache.org/v1beta1/FlinkDeployment",
    "helm.toolkit.fluxcd.io/v2beta1/HelmRelease",
    "kubeflow.org/v1/Notebook",
    "kubeflow.org/v1/PyTorchJob",
    "kubeflow.org/v1/TFJob",
    "kubeflow.org/v2beta1/MPIJob",
    "kustomize.toolkit.fluxcd.io/v1/Kustomization",
    "kyverno.io/v1/ClusterPolicy",
    "kyverno.io/v1/Policy",
    "ray.io/v1/RayCluster",
    "ray.io/v1/RayJob",
    "ray.io/v1/RayService",
    "source.toolkit.fluxcd.io/v1/GitRepository",
    "source.toolkit.fluxcd.io/v1beta2/Bucket",
    "source.toolkit.fluxcd.io/v1beta2/HelmChart",
    "source.toolkit.fluxcd.io/v1beta2/HelmRepository",
    "source.toolkit.fluxcd.io/v1beta2/OCIRepository",
    "sparkoperator.k8s.io/v1beta2/SparkApplication",
];

/// Why a bundled file did not load.
#[derive(Debug, thiserror::Error)]
pub enum BundledError {
    #[error("{path}: not YAML: {message}")]
    Yaml { path: String, message: String },
    #[error("{path}: {message}")]
    Shape { path: String, message: String },
}

/// One kind's customization, `(name, spec)`.
pub fn parse(path: &str, text: &str) -> Result<(String, CustomizationSpec), BundledError> {
    let doc: Value = serde_saphyr::from_str(text).map_err(|e| BundledError::Yaml {
        path: path.into(),
        message: e.to_string(),
    })?;
    let shape = |message: String| BundledError::Shape {
        path: path.into(),
        message,
    };
    let name = doc
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .ok_or_else(|| shape("no metadata.name".into()))?
        .to_string();
    let spec: CustomizationSpec =
        serde_json::from_value(doc.get("spec").cloned().unwrap_or(Value::Null))
            .map_err(|e| shape(e.to_string()))?;
    let want = path.rsplit_once('/');
    if want != Some((spec.target.api_version.as_str(), spec.target.kind.as_str())) {
        return Err(shape(format!(
            "targets {} {}, not its folder's kind",
            spec.target.api_version, spec.target.kind
        )));
    }
    Ok((name, spec))
}

/// Every bundled customization, `(name, spec)`.
pub fn specs() -> Result<Vec<(String, CustomizationSpec)>, BundledError> {
    FILES.iter().map(|(p, t)| parse(p, t)).collect()
}

/// The bundled customizations, merged per kind (loaded once).
pub fn customizations() -> &'static Customizations {
    static LOADED: OnceLock<Customizations> = OnceLock::new();
    LOADED.get_or_init(|| {
        // See the module's invariant: tests prove every file parses.
        let specs: Vec<(String, CustomizationSpec)> =
            FILES.iter().filter_map(|(p, t)| parse(p, t).ok()).collect();
        Customizations::load(specs.iter().map(|(n, s)| (n.as_str(), s)))
    })
}
