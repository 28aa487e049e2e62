//! Karmada's autoscalers end to end: the real server and kubectl, two simulated members.
//!
//! CronFederatedHPA: a rule scales a Deployment at its schedule and the scheduler divides the
//! new replicas; a suspended rule never runs; each execution is recorded once, also across a
//! `kill -9` of the server; bad rules are refused at admission; a rule for a FederatedHPA sets
//! its bounds.
//!
//! FederatedHPA: the members report the usage of the workload's pods (the sim's load profile,
//! a 40-second "day"); the replicas follow it up and down, divided among the members; a
//! predictive one, once it has recorded a season and a quarter of usage, runs more replicas
//! than the reactive one while the demand rises toward its peak.

use crate::common;

use std::time::Duration;

use common::eventually;
use common::fleet::Fleet;
use serde_json::Value;

const CRON: &str = r#"
apiVersion: autoscaling.karmada.io/v1alpha1
kind: CronFederatedHPA
metadata: {name: web-cron, namespace: default}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: web}
  rules:
  - name: every-minute
    schedule: "* * * * *"
    targetReplicas: 6
    timeZone: Europe/Berlin
  - name: asleep
    schedule: "* * * * *"
    targetReplicas: 1
    suspend: true
"#;

fn history<'a>(cron: &'a Value, rule: &str) -> &'a Value {
    cron["status"]["executionHistories"]
        .as_array()
        .and_then(|h| h.iter().find(|h| h["ruleName"] == rule))
        .unwrap_or(&Value::Null)
}

fn schedule_times(cron: &Value) -> Vec<String> {
    history(cron, "every-minute")["successfulExecutions"]
        .as_array()
        .map(|e| {
            e.iter()
                .map(|x| x["scheduleTime"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_cron_federated_hpa_scales_at_its_schedule_once_per_time() {
    let mut f = Fleet::start(&[("east", "us-east"), ("west", "eu-west")]);
    f.s.apply(&common::divided_deployment(
        "web",
        2,
        r#"{cpu: 100m, memory: 64Mi}"#,
        "",
    ));
    eventually(Duration::from_secs(30), "web placed", || {
        f.clusters_of("web-deployment")
            .iter()
            .map(|(_, n)| n)
            .sum::<i64>()
            == 2
    });

    // Bad rules are refused, with the field.
    for (bad, field) in [
        (CRON.replace("Europe/Berlin", "Mars/Olympus"), "timeZone"),
        (
            CRON.replace("\"* * * * *\"", "\"every minute\""),
            "schedule",
        ),
        (
            CRON.replace(
                "targetReplicas: 6",
                "targetReplicas: 6\n    targetMinReplicas: 2",
            ),
            "targetMinReplicas",
        ),
        (CRON.replace("name: asleep", "name: every-minute"), "name"),
    ] {
        let e = f.s.fails_stdin(&["apply", "-f", "-"], &bad);
        assert!(e.contains(field), "{field}: {e}");
    }

    f.s.apply(CRON);
    // Its rules get their next times (the suspended one none), to the minute.
    eventually(Duration::from_secs(10), "next times", || {
        let c = f.s.get_json(&["cronfhpa", "web-cron"]);
        history(&c, "every-minute")["nextExecutionTime"]
            .as_str()
            .is_some_and(|t| t.ends_with(":00Z"))
    });
    let c = f.s.get_json(&["cronfederatedhpa", "web-cron"]);
    assert!(history(&c, "asleep")["nextExecutionTime"].is_null(), "{c}");

    // At the next minute, 6 replicas, divided among the members.
    eventually(
        Duration::from_secs(75),
        "scaled to 6 at the schedule",
        || {
            let d = f.s.get_json(&["deployment", "web"]);
            d["spec"]["replicas"] == 6
        },
    );
    eventually(Duration::from_secs(30), "6 placed", || {
        f.clusters_of("web-deployment")
            .iter()
            .map(|(_, n)| n)
            .sum::<i64>()
            == 6
    });
    eventually(Duration::from_secs(10), "the execution recorded", || {
        schedule_times(&f.s.get_json(&["cronfhpa", "web-cron"])).len() == 1
    });
    let c = f.s.get_json(&["cronfhpa", "web-cron"]);
    let first = schedule_times(&c)[0].clone();
    let e = &history(&c, "every-minute")["successfulExecutions"][0];
    assert_eq!(e["appliedReplicas"], 6, "{c}");
    assert!(
        e["executionTime"].as_str().unwrap() >= first.as_str(),
        "{c}"
    );
    let asleep = history(&c, "asleep");
    assert!(
        asleep["successfulExecutions"].is_null() && asleep["failedExecutions"].is_null(),
        "{c}"
    );

    // Someone scales it down by hand; the server is killed and comes back. The time that ran
    // does not run again; the next one does, once.
    f.s.ok(&["scale", "deployment", "web", "--replicas", "3"]);
    f.s.kill9();
    f.s.restart();
    std::thread::sleep(Duration::from_secs(2));
    let c = f.s.get_json(&["cronfhpa", "web-cron"]);
    assert_eq!(schedule_times(&c), std::slice::from_ref(&first), "{c}");
    eventually(Duration::from_secs(75), "the next time ran", || {
        schedule_times(&f.s.get_json(&["cronfhpa", "web-cron"])).len() == 2
    });
    let c = f.s.get_json(&["cronfhpa", "web-cron"]);
    let times = schedule_times(&c);
    assert_eq!(times[1], first, "newest first: {c}");
    let seconds = |t: &str| {
        serde_json::from_value::<orrery_api::Time>(Value::String(t.to_string()))
            .unwrap()
            .unix_seconds()
    };
    assert_eq!(seconds(&times[0]) - seconds(&times[1]), 60, "{c}");
    let d = f.s.get_json(&["deployment", "web"]);
    assert_eq!(d["spec"]["replicas"], 6);
}

/// A Deployment whose pods see a diurnal demand over a 40 s "day" in each member (trough at
/// the start of each period, peak halfway), kept in both members.
fn loaded(name: &str) -> String {
    format!(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: default}}
spec:
  replicas: 2
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata:
      labels: {{app: {name}}}
      annotations: {{sim.orrery.io/load-profile: diurnal, sim.orrery.io/load-period: 40s,
                    sim.orrery.io/load-peak: 1500m, sim.orrery.io/load-base: 100m}}
    spec:
      containers:
      - name: app
        image: nginx:1.25
        resources: {{requests: {{cpu: 500m, memory: 64Mi}}}}
---
apiVersion: multicluster.io/v1alpha1
kind: ResourcePlacementPolicy
metadata: {{name: {name}, namespace: default}}
spec:
  resourceSelector: {{apiVersion: apps/v1, kind: Deployment, name: {name}, namespace: default}}
  placement:
    replicaScheduling: {{replicaSchedulingType: Divided}}
    spreadConstraints: [{{spreadByField: cluster, minGroups: 2, maxGroups: 2}}]
"#
    )
}

fn fhpa(name: &str, predictive: &str) -> String {
    format!(
        r#"
apiVersion: autoscaling.karmada.io/v1alpha1
kind: FederatedHPA
metadata: {{name: {name}, namespace: default}}
spec:
  scaleTargetRef: {{apiVersion: apps/v1, kind: Deployment, name: {name}}}
  minReplicas: 2
  maxReplicas: 12
  metrics:
  - type: Resource
    resource: {{name: cpu, target: {{type: Utilization, averageUtilization: 50}}}}
{predictive}
"#
    )
}

/// Where in its 40 s period the demand is now: 0 at the trough, 0.5 at the peak.
fn phase() -> f64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    (t % 40.0) / 40.0
}

fn replicas(f: &Fleet, name: &str) -> i64 {
    f.s.get_json(&["deployment", name])["spec"]["replicas"]
        .as_i64()
        .unwrap()
}

fn condition<'a>(o: &'a Value, type_: &str) -> &'a Value {
    o["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_))
        .unwrap_or(&Value::Null)
}

#[test]
fn a_federated_hpa_follows_its_members_usage_and_a_predictive_one_scales_ahead() {
    let f = Fleet::start_with(
        &[("east", "us-east"), ("west", "eu-west")],
        &[
            "--hpa-sync-period",
            "1s",
            "--hpa-downscale-stabilization",
            "4s",
            "--forecast-season",
            "40s",
        ],
    );
    // Refused at admission, with the field.
    for (bad, field) in [
        (
            fhpa("react", "").replace("maxReplicas: 12", "maxReplicas: 1"),
            "spec.maxReplicas",
        ),
        (
            fhpa("react", "").replace("name: cpu", "name: gpu"),
            "spec.metrics[0].resource.name",
        ),
        (
            fhpa("react", "  predictive: {horizon: 2d}"),
            "spec.predictive.horizon",
        ),
    ] {
        let e = f.s.fails_stdin(&["apply", "-f", "-"], &bad);
        assert!(e.contains(field), "{field}: {e}");
    }
    f.s.apply(&loaded("react"));
    f.s.apply(&loaded("ahead"));
    f.s.apply(&fhpa("react", ""));
    f.s.apply(&fhpa(
        "ahead",
        "  predictive: {horizon: 8s, bound: Upper80}",
    ));
    // A rule raises the reactive one's floor at the next minute.
    f.s.apply(
        r#"
apiVersion: autoscaling.karmada.io/v1alpha1
kind: CronFederatedHPA
metadata: {name: floor, namespace: default}
spec:
  scaleTargetRef: {apiVersion: autoscaling.karmada.io/v1alpha1, kind: FederatedHPA, name: react}
  rules:
  - {name: raise, schedule: "* * * * *", targetMinReplicas: 3}
"#,
    );
    let started = std::time::Instant::now();

    // One period and a half: the reactive one rises toward the peak and falls after it.
    let mut samples: Vec<(f64, i64)> = Vec::new();
    while started.elapsed() < Duration::from_secs(62) {
        samples.push((phase(), replicas(&f, "react")));
        std::thread::sleep(Duration::from_millis(700));
    }
    let near_peak = samples
        .iter()
        .filter(|(p, _)| (0.45..0.7).contains(p))
        .map(|s| s.1)
        .max()
        .unwrap_or(0);
    let near_trough = samples
        .iter()
        .filter(|(p, _)| *p > 0.95 || *p < 0.15)
        .map(|s| s.1)
        .min()
        .unwrap_or(99);
    eprintln!("reactive (phase, replicas): {samples:?}");
    assert!(near_peak >= 8, "up toward the peak: {samples:?}");
    assert!(near_trough <= 4, "down at the trough: {samples:?}");
    // The usage is read again every pass; while replicas move to a member whose Work has not
    // reported yet, none may be at hand for a pass (FailedGetResourceMetric, as Kubernetes'
    // HPA says it), and the next that has one says so again.
    let mut h = Value::Null;
    eventually(Duration::from_secs(30), "a valid metric", || {
        h = f.s.get_json(&["fhpa", "react"]);
        condition(&h, "ScalingActive")["reason"] == "ValidMetricFound"
    });
    assert!(
        h["status"]["currentMetrics"][0]["resource"]["current"]["averageUtilization"].is_i64(),
        "{h:#}"
    );
    assert!(
        condition(&h, "ScalingLimited")["status"].is_string(),
        "{h:#}"
    );
    assert!(h["status"]["lastScaleTime"].is_string(), "{h:#}");
    // Divided among the members as the template says. The template changes with every pass
    // while the load moves (each second here), so the division is compared with the count the
    // binding carries, and that count with the template's just before or after.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let before = replicas(&f, "react");
        let seen =
            f.s.get_json(&["resourcebinding", "react-deployment", "-n", "default"]);
        let after = replicas(&f, "react");
        let bound = seen["spec"]["replicas"].as_i64().unwrap_or(-1);
        let placed = f.clusters_of("react-deployment");
        if placed.len() == 2
            && placed.iter().map(|(_, n)| n).sum::<i64>() == bound
            && (bound == before || bound == after)
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the replicas placed: the template's {before} then {after}, the binding's {bound} on {placed:?}; its status: {:#}",
            seen["status"]
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // Once the predictive one forecasts, it runs more replicas than the reactive one on the
    // way up to the peak (its forecast sees 8 s ahead).
    eventually(Duration::from_secs(120), "a forecast", || {
        let a = f.s.get_json(&["fhpa", "ahead"]);
        a["status"]["prediction"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("forecast by"))
    });
    let mut ahead_of = Vec::new();
    let until = std::time::Instant::now() + Duration::from_secs(42);
    while std::time::Instant::now() < until {
        let p = phase();
        let (r, a) = (replicas(&f, "react"), replicas(&f, "ahead"));
        if (0.2..0.45).contains(&p) {
            ahead_of.push((p, r, a));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!("rising (phase, reactive, predictive): {ahead_of:?}");
    assert!(
        ahead_of.iter().any(|(_, r, a)| *a >= r + 2),
        "the predictive one ahead while the demand rises: {ahead_of:?}"
    );
    let a = f.s.get_json(&["fhpa", "ahead"]);
    assert!(
        a["status"]["prediction"]["replicas"].as_i64().unwrap() > 0,
        "{a:#}"
    );

    // The rule ran at its minute: the floor is 3.
    eventually(Duration::from_secs(90), "the floor raised", || {
        f.s.get_json(&["fhpa", "react"])["spec"]["minReplicas"] == 3
    });
    let c = f.s.get_json(&["cronfhpa", "floor"]);
    assert_eq!(
        history(&c, "raise")["successfulExecutions"][0]["appliedMinReplicas"],
        3,
        "{c:#}"
    );
}

/// Kubernetes' order: a FederatedHPA first brings the replicas within its bounds, whether or
/// not any member reports usage (10 replicas and `maxReplicas: 4`: 4), and says why; a
/// CronFederatedHPA that raises the bounds raises the replicas with them.
#[test]
fn a_federated_hpa_keeps_the_replicas_within_its_bounds_without_usage() {
    let f = Fleet::start_with(
        &[("east", "us-east"), ("west", "eu-west")],
        &["--hpa-sync-period", "1s"],
    );
    // No load profile: the members report no usage of its pods.
    f.s.apply(&common::divided_deployment(
        "capped",
        10,
        "{cpu: 100m, memory: 64Mi}",
        "",
    ));
    eventually(Duration::from_secs(30), "10 placed", || {
        f.clusters_of("capped-deployment")
            .iter()
            .map(|(_, n)| n)
            .sum::<i64>()
            == 10
    });
    f.s.apply(
        r#"
apiVersion: autoscaling.karmada.io/v1alpha1
kind: FederatedHPA
metadata: {name: capped, namespace: default}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: capped}
  minReplicas: 1
  maxReplicas: 4
  metrics:
  - type: Resource
    resource: {name: cpu, target: {type: Utilization, averageUtilization: 50}}
"#,
    );
    eventually(Duration::from_secs(30), "down to the maximum", || {
        replicas(&f, "capped") == 4
    });
    eventually(Duration::from_secs(30), "4 placed", || {
        f.clusters_of("capped-deployment")
            .iter()
            .map(|(_, n)| n)
            .sum::<i64>()
            == 4
    });
    let h = f.s.get_json(&["fhpa", "capped"]);
    assert!(h["status"]["lastScaleTime"].is_string(), "{h:#}");
    assert_eq!(h["status"]["desiredReplicas"], 4, "{h:#}");
    // Without usage, the metrics still say so.
    eventually(Duration::from_secs(10), "no metric", || {
        let h = f.s.get_json(&["fhpa", "capped"]);
        condition(&h, "ScalingActive")["reason"] == "FailedGetResourceMetric"
    });
    // A rule raises the bounds: the replicas follow at the next pass.
    f.s.apply(
        r#"
apiVersion: autoscaling.karmada.io/v1alpha1
kind: CronFederatedHPA
metadata: {name: raise, namespace: default}
spec:
  scaleTargetRef: {apiVersion: autoscaling.karmada.io/v1alpha1, kind: FederatedHPA, name: capped}
  rules:
  - {name: raise, schedule: "* * * * *", targetMinReplicas: 6, targetMaxReplicas: 8}
"#,
    );
    eventually(Duration::from_secs(90), "up to the new minimum", || {
        replicas(&f, "capped") == 6
    });
}
