//! What Orrery knows about the built-in workload kinds: how healthy an object is from its own
//! status (the rules Karmada's default interpreter uses).

use serde_json::Value;

use crate::work::Health;

fn int(v: &Value, path: &str) -> i64 {
    v.pointer(path).and_then(Value::as_i64).unwrap_or(0)
}

fn condition<'a>(obj: &'a Value, type_: &str) -> Option<&'a str> {
    obj.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(type_))?
        .get("status")?
        .as_str()
}

/// The generation the status describes has caught up with the spec.
fn observed(obj: &Value) -> bool {
    match obj.pointer("/metadata/generation").and_then(Value::as_i64) {
        Some(g) => int(obj, "/status/observedGeneration") >= g,
        None => true,
    }
}

/// How healthy an object (as its member stores it, status included) is, and why not.
pub fn health(obj: &Value) -> (Health, String) {
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
    let desired = obj
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    let progressing = |why: String| (Health::Progressing, why);
    match kind {
        "Deployment" => {
            if condition(obj, "Progressing") == Some("False") {
                return (
                    Health::Unhealthy,
                    "the rollout exceeded its progress deadline".into(),
                );
            }
            let updated = int(obj, "/status/updatedReplicas");
            let available = int(obj, "/status/availableReplicas");
            if !observed(obj) {
                progressing("the rollout has not been observed yet".into())
            } else if updated < desired || available < desired {
                progressing(format!("{available} of {desired} replicas available"))
            } else {
                (Health::Healthy, String::new())
            }
        }
        "StatefulSet" | "ReplicaSet" => {
            let ready = int(obj, "/status/readyReplicas");
            let updated = if kind == "StatefulSet" {
                obj.pointer("/status/updatedReplicas")
                    .and_then(Value::as_i64)
                    .unwrap_or(ready)
            } else {
                ready
            };
            if !observed(obj) {
                progressing("the change has not been observed yet".into())
            } else if ready < desired || updated < desired {
                progressing(format!("{ready} of {desired} replicas ready"))
            } else {
                (Health::Healthy, String::new())
            }
        }
        "DaemonSet" => {
            let want = int(obj, "/status/desiredNumberScheduled");
            let ready = int(obj, "/status/numberReady");
            let updated = obj
                .pointer("/status/updatedNumberScheduled")
                .and_then(Value::as_i64)
                .unwrap_or(ready);
            if !observed(obj) || ready < want || updated < want {
                progressing(format!("{ready} of {want} daemon pods ready"))
            } else {
                (Health::Healthy, String::new())
            }
        }
        "Job" => {
            if condition(obj, "Failed") == Some("True") {
                (Health::Unhealthy, "the job failed".into())
            } else if condition(obj, "Complete") == Some("True") {
                (Health::Healthy, String::new())
            } else {
                progressing(format!(
                    "{} active, {} succeeded",
                    int(obj, "/status/active"),
                    int(obj, "/status/succeeded")
                ))
            }
        }
        "Pod" => match obj.pointer("/status/phase").and_then(Value::as_str) {
            Some("Succeeded") => (Health::Healthy, String::new()),
            Some("Running") if condition(obj, "Ready") != Some("False") => {
                (Health::Healthy, String::new())
            }
            Some("Failed") => (Health::Unhealthy, "the pod failed".into()),
            Some(p) => progressing(format!("the pod is {p}")),
            None => progressing("the pod has no phase yet".into()),
        },
        "PersistentVolumeClaim" => match obj.pointer("/status/phase").and_then(Value::as_str) {
            Some("Bound") => (Health::Healthy, String::new()),
            Some("Lost") => (Health::Unhealthy, "the claim lost its volume".into()),
            _ => progressing("the claim is not bound yet".into()),
        },
        "Service" if obj.pointer("/spec/type").and_then(Value::as_str) == Some("LoadBalancer") => {
            let ingress = obj
                .pointer("/status/loadBalancer/ingress")
                .and_then(Value::as_array)
                .is_some_and(|a| !a.is_empty());
            if ingress {
                (Health::Healthy, String::new())
            } else {
                progressing("the load balancer has no address yet".into())
            }
        }
        // Objects without a status to judge are healthy once they exist.
        _ => (Health::Healthy, String::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn health_by_kind() {
        let cases = [
            (
                json!({"kind": "Deployment", "metadata": {"generation": 2}, "spec": {"replicas": 3},
                    "status": {"observedGeneration": 2, "updatedReplicas": 3, "availableReplicas": 3}}),
                Health::Healthy,
            ),
            (
                json!({"kind": "Deployment", "metadata": {"generation": 3}, "spec": {"replicas": 3},
                    "status": {"observedGeneration": 2, "updatedReplicas": 3, "availableReplicas": 3}}),
                Health::Progressing,
            ),
            (
                json!({"kind": "Deployment", "spec": {"replicas": 3}, "status": {"updatedReplicas": 3, "availableReplicas": 1}}),
                Health::Progressing,
            ),
            (
                json!({"kind": "Deployment", "spec": {"replicas": 1}, "status": {"conditions": [{"type": "Progressing", "status": "False"}]}}),
                Health::Unhealthy,
            ),
            (
                json!({"kind": "Deployment", "spec": {"replicas": 0}, "status": {}}),
                Health::Healthy,
            ),
            (
                json!({"kind": "StatefulSet", "spec": {"replicas": 2}, "status": {"readyReplicas": 2, "updatedReplicas": 2}}),
                Health::Healthy,
            ),
            (
                json!({"kind": "StatefulSet", "spec": {"replicas": 2}, "status": {"readyReplicas": 2, "updatedReplicas": 1}}),
                Health::Progressing,
            ),
            (
                json!({"kind": "ReplicaSet", "spec": {"replicas": 2}, "status": {"readyReplicas": 1}}),
                Health::Progressing,
            ),
            (
                json!({"kind": "DaemonSet", "status": {"desiredNumberScheduled": 4, "numberReady": 4}}),
                Health::Healthy,
            ),
            (
                json!({"kind": "DaemonSet", "status": {"desiredNumberScheduled": 4, "numberReady": 3}}),
                Health::Progressing,
            ),
            (
                json!({"kind": "Job", "status": {"conditions": [{"type": "Complete", "status": "True"}]}}),
                Health::Healthy,
            ),
            (
                json!({"kind": "Job", "status": {"conditions": [{"type": "Failed", "status": "True"}]}}),
                Health::Unhealthy,
            ),
            (
                json!({"kind": "Job", "status": {"active": 1}}),
                Health::Progressing,
            ),
            (
                json!({"kind": "Pod", "status": {"phase": "Running"}}),
                Health::Healthy,
            ),
            (
                json!({"kind": "Pod", "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]}}),
                Health::Progressing,
            ),
            (
                json!({"kind": "Pod", "status": {"phase": "Failed"}}),
                Health::Unhealthy,
            ),
            (
                json!({"kind": "PersistentVolumeClaim", "status": {"phase": "Pending"}}),
                Health::Progressing,
            ),
            (
                json!({"kind": "Service", "spec": {"type": "LoadBalancer"}, "status": {}}),
                Health::Progressing,
            ),
            (
                json!({"kind": "Service", "spec": {"type": "ClusterIP"}}),
                Health::Healthy,
            ),
            (json!({"kind": "ConfigMap"}), Health::Healthy),
        ];
        for (obj, want) in cases {
            assert_eq!(health(&obj).0, want, "{obj}");
        }
        assert_eq!(health(&json!({"kind": "ReplicaSet", "spec": {"replicas": 2}, "status": {"readyReplicas": 1}})).1, "1 of 2 replicas ready");
    }
}
