//! Karmada's CronFederatedHPA end to end: the real server and kubectl, two simulated members.
//! A rule scales a Deployment at its schedule and the scheduler divides the new replicas; a
//! suspended rule never runs; each execution is recorded once, also across a `kill -9` of the
//! server; bad rules are refused at admission.

#![allow(clippy::unwrap_used)]

mod common;

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
