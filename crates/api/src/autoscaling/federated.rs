//! Karmada's `FederatedHPA` (autoscaling.karmada.io/v1alpha1), accepted unchanged: the
//! replicas of a workload template follow the utilization its pods report from every member
//! they run in, within min and max, with Kubernetes' `autoscaling/v2` metrics, behavior and
//! status. Orrery adds `predictive`: the desired total also covers the forecast of the
//! workload's own usage over a horizon.

use serde::{Deserialize, Serialize};

use super::{API_VERSION, CrossVersionObjectReference, SCALABLE};
use crate::conditions::Condition;
use crate::prediction::Prediction;
use crate::time::Time;
use crate::validation::{ErrorList, FieldError};

pub const KIND: &str = "FederatedHPA";
pub const PLURAL: &str = "federatedhpas";
/// The utilization a FederatedHPA without metrics aims at (Karmada's and Kubernetes' default).
pub const DEFAULT_CPU_UTILIZATION: i32 = 80;

/// The resources whose usage members report.
pub const RESOURCES: [&str; 2] = ["cpu", "memory"];

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FederatedHPASpec {
    /// The workload template whose replicas are set (a Deployment, StatefulSet or ReplicaSet in this namespace).
    pub scale_target_ref: CrossVersionObjectReference,
    /// The fewest replicas, at least 1. Default: 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_replicas: Option<i32>,
    /// The most replicas, at least minReplicas.
    pub max_replicas: i32,
    /// What the replicas follow; the largest proposal wins. Default: cpu at 80 % average utilization. Orrery serves Resource metrics (cpu, memory) with Utilization or AverageValue targets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub metrics: Vec<MetricSpec>,
    /// How fast replicas may change each way (autoscaling/v2 HorizontalPodAutoscalerBehavior).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub behavior: Option<Behavior>,
    /// Orrery's: also cover the forecast of the workload's own usage over this horizon, so replicas run before a daily peak rather than after it (once a season of its usage is recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predictive: Option<Prediction>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MetricSpec {
    /// Resource, ContainerResource, Pods, Object or External; Orrery serves Resource.
    #[serde(rename = "type")]
    pub type_: String,
    /// A resource of the pods (cpu or memory), averaged over them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<ResourceMetricSource>,
    /// A resource of one container of the pods: not served (members report per workload).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<serde_json::Map<String, serde_json::Value>>")]
    pub container_resource: Option<serde_json::Value>,
    /// A custom metric of the pods: not served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<serde_json::Map<String, serde_json::Value>>")]
    pub pods: Option<serde_json::Value>,
    /// A metric of another object: not served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<serde_json::Map<String, serde_json::Value>>")]
    pub object: Option<serde_json::Value>,
    /// A metric from outside the cluster: not served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<serde_json::Map<String, serde_json::Value>>")]
    pub external: Option<serde_json::Value>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResourceMetricSource {
    /// cpu or memory.
    pub name: String,
    /// What the replicas aim at.
    pub target: MetricTarget,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MetricTarget {
    /// Utilization (averageUtilization, a percentage of the pods' requests) or AverageValue (averageValue per pod, a quantity).
    #[serde(rename = "type")]
    pub type_: String,
    /// A total value (Value targets, which Resource metrics do not take).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// The usage per pod aimed at, a quantity (AverageValue targets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub average_value: Option<String>,
    /// The usage aimed at, a percentage of the pods' requests (Utilization targets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub average_utilization: Option<i32>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Behavior {
    /// How replicas are added.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_up: Option<ScalingRules>,
    /// How replicas are removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_down: Option<ScalingRules>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScalingRules {
    /// Seconds of past recommendations looked at (0 to 3600): scaling up takes the lowest of them, down the highest. Default: 0 up, the server's down (300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stabilization_window_seconds: Option<i32>,
    /// Max (the policy allowing the most change), Min, or Disabled. Default: Max.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub select_policy: Option<String>,
    /// How much may change within a period.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policies: Vec<ScalingPolicy>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScalingPolicy {
    /// Pods or Percent.
    #[serde(rename = "type")]
    pub type_: String,
    /// More than 0.
    pub value: i32,
    /// 1 to 1800.
    pub period_seconds: i32,
}

/// autoscaling/v2 HorizontalPodAutoscalerStatus, with Orrery's forecast.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FederatedHPAStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// When the replicas were last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale_time: Option<Time>,
    /// The template's replicas when last looked at.
    #[serde(default)]
    pub current_replicas: i32,
    /// What the autoscaler last wanted.
    #[serde(default)]
    pub desired_replicas: i32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub current_metrics: Vec<MetricStatus>,
    /// AbleToScale, ScalingActive, ScalingLimited.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Orrery's: what the forecast of the workload's usage asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prediction: Option<PredictionStatus>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetricStatus {
    #[serde(rename = "type")]
    pub type_: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<ResourceMetricStatus>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceMetricStatus {
    pub name: String,
    pub current: MetricValueStatus,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetricValueStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub average_value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub average_utilization: Option<i32>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PredictionStatus {
    /// The horizon and bound used.
    pub horizon: String,
    pub bound: String,
    /// The replicas the forecast asks for (0 while there is none).
    #[serde(default)]
    pub replicas: i32,
    /// Why there is no forecast, or the model it came from.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// A metric as the autoscaler reads it.
#[derive(Clone, Debug, PartialEq)]
pub enum Target {
    /// A percentage of the pods' requests.
    Utilization { resource: String, percent: i32 },
    /// Per pod, in the resource's base unit (cores for cpu, bytes for memory).
    AverageValue { resource: String, value: f64 },
}

impl Target {
    pub fn resource(&self) -> &str {
        match self {
            Target::Utilization { resource, .. } | Target::AverageValue { resource, .. } => {
                resource
            }
        }
    }
}

impl FederatedHPASpec {
    /// The spec of a stored object, when it reads as one.
    pub fn parse(spec: Option<&serde_json::Value>) -> Result<FederatedHPASpec, ErrorList> {
        super::parse_spec(spec, Self::validate)
    }

    pub fn min(&self) -> i32 {
        self.min_replicas.unwrap_or(1)
    }

    /// The metrics as targets (admission made sure each reads); cpu at 80 % when none.
    pub fn targets(&self) -> Vec<Target> {
        if self.metrics.is_empty() {
            return vec![Target::Utilization {
                resource: "cpu".into(),
                percent: DEFAULT_CPU_UTILIZATION,
            }];
        }
        self.metrics
            .iter()
            .filter_map(|m| target_of(m).ok())
            .collect()
    }

    /// Karmada's rules (its webhook's, and autoscaling/v2's), and what Orrery serves.
    pub fn validate(&self) -> ErrorList {
        let mut errs = ErrorList::new();
        let r = &self.scale_target_ref;
        let path = "spec.scaleTargetRef";
        if r.name.is_empty() {
            errs.push(FieldError::required(format!("{path}.name"), ""));
        }
        if !SCALABLE
            .iter()
            .any(|(v, k)| *k == r.kind && (r.api_version.is_empty() || r.api_version == *v))
        {
            errs.push(FieldError::not_supported(
                format!("{path}.kind"),
                format!("{} {}", r.api_version, r.kind).trim(),
                &SCALABLE.map(|(_, k)| k),
            ));
        }
        if let Some(min) = self.min_replicas
            && min < 1
        {
            errs.push(FieldError::invalid(
                "spec.minReplicas",
                min,
                "must be greater than or equal to 1",
            ));
        }
        if self.max_replicas < 1 {
            errs.push(FieldError::invalid(
                "spec.maxReplicas",
                self.max_replicas,
                "must be greater than or equal to 1",
            ));
        } else if self.max_replicas < self.min() {
            errs.push(FieldError::invalid(
                "spec.maxReplicas",
                self.max_replicas,
                "must be greater than or equal to minReplicas",
            ));
        }
        for (i, m) in self.metrics.iter().enumerate() {
            if let Err(e) = target_of(m) {
                errs.push(e(format!("spec.metrics[{i}]")));
            }
        }
        if let Some(b) = &self.behavior {
            for (name, rules) in [("scaleUp", &b.scale_up), ("scaleDown", &b.scale_down)] {
                if let Some(r) = rules {
                    validate_rules(r, &format!("spec.behavior.{name}"), &mut errs);
                }
            }
        }
        if let Some(p) = &self.predictive {
            p.validate("spec.predictive", &mut errs);
        }
        errs
    }
}

type PathError = Box<dyn FnOnce(String) -> FieldError>;

fn target_of(m: &MetricSpec) -> Result<Target, PathError> {
    if m.type_ != "Resource" {
        let t = m.type_.clone();
        return Err(Box::new(move |p| {
            FieldError::not_supported(
                format!("{p}.type"),
                &t,
                &[
                    "Resource (ContainerResource, Pods, Object and External metrics are not served: members report the usage of a workload's pods, per resource)",
                ],
            )
        }));
    }
    let Some(r) = &m.resource else {
        return Err(Box::new(|p| {
            FieldError::required(
                format!("{p}.resource"),
                "a Resource metric names its resource",
            )
        }));
    };
    if !RESOURCES.contains(&r.name.as_str()) {
        let n = r.name.clone();
        return Err(Box::new(move |p| {
            FieldError::not_supported(format!("{p}.resource.name"), &n, &RESOURCES)
        }));
    }
    let t = &r.target;
    match t.type_.as_str() {
        "Utilization" => match t.average_utilization {
            Some(u) if u > 0 => Ok(Target::Utilization {
                resource: r.name.clone(),
                percent: u,
            }),
            Some(u) => Err(Box::new(move |p| {
                FieldError::invalid(
                    format!("{p}.resource.target.averageUtilization"),
                    u,
                    "must be greater than 0",
                )
            })),
            None => Err(Box::new(|p| {
                FieldError::required(
                    format!("{p}.resource.target.averageUtilization"),
                    "a Utilization target sets it",
                )
            })),
        },
        "AverageValue" => {
            let Some(v) = &t.average_value else {
                return Err(Box::new(|p| {
                    FieldError::required(
                        format!("{p}.resource.target.averageValue"),
                        "an AverageValue target sets it",
                    )
                }));
            };
            match v.parse::<crate::quantity::Quantity>() {
                Ok(q) if q.as_f64() > 0.0 => Ok(Target::AverageValue {
                    resource: r.name.clone(),
                    value: q.as_f64(),
                }),
                _ => {
                    let v = v.clone();
                    Err(Box::new(move |p| {
                        FieldError::invalid(
                            format!("{p}.resource.target.averageValue"),
                            &v,
                            "must be a quantity greater than 0",
                        )
                    }))
                }
            }
        }
        other => {
            let o = other.to_string();
            Err(Box::new(move |p| {
                FieldError::not_supported(
                    format!("{p}.resource.target.type"),
                    &o,
                    &["Utilization", "AverageValue"],
                )
            }))
        }
    }
}

fn validate_rules(r: &ScalingRules, path: &str, errs: &mut ErrorList) {
    if let Some(w) = r.stabilization_window_seconds
        && !(0..=3600).contains(&w)
    {
        errs.push(FieldError::invalid(
            format!("{path}.stabilizationWindowSeconds"),
            w,
            "must be from 0 to 3600",
        ));
    }
    if let Some(s) = &r.select_policy
        && !["Max", "Min", "Disabled"].contains(&s.as_str())
    {
        errs.push(FieldError::not_supported(
            format!("{path}.selectPolicy"),
            s,
            &["Max", "Min", "Disabled"],
        ));
    }
    for (i, p) in r.policies.iter().enumerate() {
        let pp = format!("{path}.policies[{i}]");
        if !["Pods", "Percent"].contains(&p.type_.as_str()) {
            errs.push(FieldError::not_supported(
                format!("{pp}.type"),
                &p.type_,
                &["Pods", "Percent"],
            ));
        }
        if p.value <= 0 {
            errs.push(FieldError::invalid(
                format!("{pp}.value"),
                p.value,
                "must be greater than 0",
            ));
        }
        if !(1..=1800).contains(&p.period_seconds) {
            errs.push(FieldError::invalid(
                format!("{pp}.periodSeconds"),
                p.period_seconds,
                "must be from 1 to 1800",
            ));
        }
    }
}

/// Whether a CronFederatedHPA's scale target is a FederatedHPA.
pub fn is_reference(r: &CrossVersionObjectReference) -> bool {
    r.kind == KIND && (r.api_version.is_empty() || r.api_version == API_VERSION)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn errors(spec: serde_json::Value) -> Vec<String> {
        match FederatedHPASpec::parse(Some(&spec)) {
            Ok(_) => Vec::new(),
            Err(e) => e.iter().map(|e| e.to_string()).collect(),
        }
    }

    #[test]
    fn karmadas_rules_are_kept() {
        let ok = json!({"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                        "minReplicas": 2, "maxReplicas": 10,
                        "metrics": [{"type": "Resource", "resource": {"name": "cpu",
                            "target": {"type": "Utilization", "averageUtilization": 60}}},
                            {"type": "Resource", "resource": {"name": "memory",
                            "target": {"type": "AverageValue", "averageValue": "512Mi"}}}],
                        "behavior": {"scaleDown": {"stabilizationWindowSeconds": 60,
                            "policies": [{"type": "Percent", "value": 50, "periodSeconds": 30}]}},
                        "predictive": {"horizon": "30m", "bound": "Upper80"}});
        assert!(errors(ok.clone()).is_empty(), "{:?}", errors(ok.clone()));
        let s = FederatedHPASpec::parse(Some(&ok)).unwrap();
        assert_eq!(
            s.targets(),
            vec![
                Target::Utilization {
                    resource: "cpu".into(),
                    percent: 60
                },
                Target::AverageValue {
                    resource: "memory".into(),
                    value: 512.0 * 1024.0 * 1024.0
                }
            ]
        );
        let cases: Vec<(serde_json::Value, &str)> = vec![
            (
                json!({"scaleTargetRef": {"kind": "Deployment", "name": "web"}, "minReplicas": 0, "maxReplicas": 3}),
                "spec.minReplicas",
            ),
            (
                json!({"scaleTargetRef": {"kind": "Deployment", "name": "web"}, "minReplicas": 4, "maxReplicas": 3}),
                "spec.maxReplicas",
            ),
            (
                json!({"scaleTargetRef": {"kind": "Service", "name": "web"}, "maxReplicas": 3}),
                "spec.scaleTargetRef.kind",
            ),
            (
                json!({"scaleTargetRef": {"kind": "Deployment", "name": "web"}, "maxReplicas": 3,
                    "metrics": [{"type": "External", "external": {"metric": {"name": "q"}}}]}),
                "spec.metrics[0].type",
            ),
            (
                json!({"scaleTargetRef": {"kind": "Deployment", "name": "web"}, "maxReplicas": 3,
                    "metrics": [{"type": "Resource", "resource": {"name": "gpu", "target": {"type": "Utilization", "averageUtilization": 50}}}]}),
                "spec.metrics[0].resource.name",
            ),
            (
                json!({"scaleTargetRef": {"kind": "Deployment", "name": "web"}, "maxReplicas": 3,
                    "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization"}}}]}),
                "averageUtilization",
            ),
            (
                json!({"scaleTargetRef": {"kind": "Deployment", "name": "web"}, "maxReplicas": 3,
                    "behavior": {"scaleUp": {"stabilizationWindowSeconds": 4000}}}),
                "spec.behavior.scaleUp.stabilizationWindowSeconds",
            ),
            (
                json!({"scaleTargetRef": {"kind": "Deployment", "name": "web"}, "maxReplicas": 3,
                    "behavior": {"scaleDown": {"selectPolicy": "Fastest"}}}),
                "spec.behavior.scaleDown.selectPolicy",
            ),
            (
                json!({"scaleTargetRef": {"kind": "Deployment", "name": "web"}, "maxReplicas": 3,
                    "behavior": {"scaleDown": {"policies": [{"type": "Pods", "value": 0, "periodSeconds": 2000}]}}}),
                "periodSeconds",
            ),
            (
                json!({"scaleTargetRef": {"kind": "Deployment", "name": "web"}, "maxReplicas": 3,
                    "predictive": {"horizon": "forever"}}),
                "spec.predictive.horizon",
            ),
            (
                json!({"scaleTargetRef": {"kind": "Deployment", "name": "web"}, "maxReplicas": 3, "unknown": 1}),
                "unknown",
            ),
        ];
        for (spec, field) in cases {
            let e = errors(spec.clone());
            assert!(
                e.iter().any(|e| e.contains(field)),
                "{spec}: {e:?} should name {field}"
            );
        }
    }

    #[test]
    fn no_metrics_means_cpu_at_80_percent() {
        let s = FederatedHPASpec::parse(Some(&json!({
            "scaleTargetRef": {"kind": "Deployment", "name": "web"}, "maxReplicas": 3})))
        .unwrap();
        assert_eq!(s.min(), 1);
        assert_eq!(
            s.targets(),
            vec![Target::Utilization {
                resource: "cpu".into(),
                percent: 80
            }]
        );
    }
}
