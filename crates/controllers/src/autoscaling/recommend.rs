//! The replicas a FederatedHPA asks for: Kubernetes' HPA algorithm (the replica calculator,
//! stabilization and scaling policies of `pkg/controller/podautoscaler`), over the usage its
//! members report. Pure: the controller gathers the usage, keeps the recommendations and
//! scale events, and writes what this decides.

use orrery_api::autoscaling::federated::{Behavior, FederatedHPASpec, ScalingRules, Target};
use orrery_api::work::WorkloadUsage;

/// Ratios this close to 1 change nothing (Kubernetes' default tolerance).
pub const TOLERANCE: f64 = 0.1;
/// Without a behavior, a scale-up goes at most to twice the replicas, or 4.
const SCALE_UP_FACTOR: i32 = 2;
const SCALE_UP_MINIMUM: i32 = 4;

/// A past recommendation, or a past change of replicas, at a time in unix seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamped {
    pub at: i64,
    pub replicas: i32,
}

#[derive(Debug)]
pub struct Input<'a> {
    pub spec: &'a FederatedHPASpec,
    /// The template's replicas now.
    pub current: i32,
    /// What the members report, summed; `None` when none does.
    pub usage: Option<&'a WorkloadUsage>,
    /// The replicas the forecast of the workload's usage asks for, when there is one.
    pub predicted: Option<i32>,
    /// Recommendations of the last passes (oldest first).
    pub recommendations: &'a [Stamped],
    /// Replicas added and removed by past scalings (each with its time).
    pub scaled_up: &'a [Stamped],
    pub scaled_down: &'a [Stamped],
    pub now: i64,
    /// The scale-down stabilization window when a behavior says none (the server's).
    pub downscale_window: i64,
}

/// One metric's reading.
#[derive(Clone, Debug, PartialEq)]
pub struct Reading {
    pub resource: String,
    /// Average utilization, percent of requests (for Utilization targets).
    pub utilization: Option<i32>,
    /// Average usage per pod, in the resource's base unit.
    pub average: f64,
    pub proposal: i32,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The replicas to set.
    pub desired: i32,
    /// What the metrics (and the forecast) asked for, before the limits.
    pub recommendation: Option<i32>,
    pub readings: Vec<Reading>,
    /// Why no replica count came from the metrics (ScalingActive False), if none did.
    pub inactive: Option<(&'static str, String)>,
    /// The limit that held the replicas back (ScalingLimited True), if one did.
    pub limited: Option<(&'static str, String)>,
    /// The replicas were outside minReplicas..maxReplicas and go to the nearest bound before
    /// any metric is read (Kubernetes' rescale reason); no metric was consulted.
    pub out_of_range: Option<&'static str>,
}

/// Kubernetes' rescale reasons when the replicas are outside the bounds.
pub const ABOVE_MAX: &str = "Current number of replicas above Spec.MaxReplicas";
pub const BELOW_MIN: &str = "Current number of replicas below Spec.MinReplicas";

/// The proposal of one metric, or why there is none.
fn propose(
    target: &Target,
    current: i32,
    u: &WorkloadUsage,
) -> Result<Reading, (&'static str, String)> {
    let resource = target.resource().to_string();
    let (used, requested) = match resource.as_str() {
        "cpu" => (
            u.cpu_milli as f64 / 1000.0,
            u.cpu_request_milli as f64 / 1000.0,
        ),
        _ => (u.memory_bytes as f64, u.memory_request_bytes as f64),
    };
    if u.ready_pods <= 0 {
        return Err((
            "FailedGetResourceMetric",
            format!("no ready pod of the workload reports its {resource} usage"),
        ));
    }
    let ready = u.ready_pods as f64;
    let average = used / ready;
    let (ratio, utilization) = match target {
        Target::Utilization { percent, .. } => {
            if requested <= 0.0 {
                return Err((
                    "FailedGetResourceMetric",
                    format!(
                        "the workload's pods request no {resource}: its utilization has no base"
                    ),
                ));
            }
            let util = (used * 100.0 / requested) as i32;
            (f64::from(util) / f64::from(*percent), Some(util))
        }
        Target::AverageValue { value, .. } => (average / value, None),
    };
    // Pods not ready use nothing when scaling up; pods not there yet (the template asks more
    // than the members run) use nothing up, and their target down: Kubernetes' reading.
    let unready = u.unready_pods.max(0) as f64;
    let missing = (f64::from(current) - ready - unready).max(0.0);
    let proposal = if ratio > 1.0 {
        let counted = ready + unready + missing;
        let r = ratio * ready / counted;
        if r <= 1.0 + TOLERANCE {
            current
        } else {
            (r * counted).ceil() as i32
        }
    } else if ratio < 1.0 {
        let counted = ready + missing;
        let r = (ratio * ready + missing) / counted;
        if r >= 1.0 - TOLERANCE {
            current
        } else {
            (r * counted).ceil() as i32
        }
    } else {
        current
    };
    Ok(Reading {
        resource,
        utilization,
        average,
        proposal,
    })
}

/// What a pass decides.
pub fn decide(i: &Input<'_>) -> Decision {
    let spec = i.spec;
    let (min, max) = (spec.min(), spec.max_replicas);
    let mut d = Decision {
        desired: i.current,
        recommendation: None,
        readings: Vec::new(),
        inactive: None,
        limited: None,
        out_of_range: None,
    };
    if i.current == 0 {
        // Kubernetes: a workload scaled to 0 by hand is left alone.
        d.inactive = Some((
            "ScalingDisabled",
            "scaling is disabled since the replica count of the target is zero".into(),
        ));
        return d;
    }
    // Kubernetes clamps first: outside the bounds, the nearest bound, whatever the metrics
    // say and whether or not any member reports usage.
    if i.current > max {
        d.desired = max;
        d.out_of_range = Some(ABOVE_MAX);
        d.limited = Some((
            "TooManyReplicas",
            format!(
                "the current replica count ({}) is more than the maximum replica count ({max})",
                i.current
            ),
        ));
        return d;
    }
    if i.current < min {
        d.desired = min;
        d.out_of_range = Some(BELOW_MIN);
        d.limited = Some((
            "TooFewReplicas",
            format!(
                "the current replica count ({}) is less than the minimum replica count ({min})",
                i.current
            ),
        ));
        return d;
    }
    let mut proposal: Option<i32> = None;
    let mut first_error = None;
    for t in spec.targets() {
        match i.usage.ok_or((
            "FailedGetResourceMetric",
            "no member reports the usage of the workload's pods".to_string(),
        )) {
            Ok(u) => match propose(&t, i.current, u) {
                Ok(r) => {
                    proposal = Some(proposal.map_or(r.proposal, |p| p.max(r.proposal)));
                    d.readings.push(r);
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            },
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    // The forecast counts only beside a reading: it raises, it never stands alone.
    if let (Some(p), Some(f)) = (proposal, i.predicted) {
        proposal = Some(p.max(f));
    }
    let Some(proposal) = proposal else {
        d.inactive = first_error;
        return d;
    };
    d.recommendation = Some(proposal);
    let (desired, limited) = match &spec.behavior {
        None => plain(i, proposal, min, max),
        Some(b) => with_behavior(i, b, proposal, min, max),
    };
    d.desired = desired;
    d.limited = limited;
    d
}

/// Without a behavior: the highest recommendation of the downscale window, at most twice the
/// replicas (or 4) up, within min and max.
fn plain(
    i: &Input<'_>,
    proposal: i32,
    min: i32,
    max: i32,
) -> (i32, Option<(&'static str, String)>) {
    let cutoff = i.now - i.downscale_window;
    let stabilized = i
        .recommendations
        .iter()
        .filter(|r| r.at > cutoff)
        .map(|r| r.replicas)
        .fold(proposal, i32::max);
    let up_limit = (SCALE_UP_FACTOR * i.current).max(SCALE_UP_MINIMUM);
    if stabilized < min {
        (
            min,
            Some((
                "TooFewReplicas",
                format!("the desired replica count is less than the minimum replica count ({min})"),
            )),
        )
    } else if stabilized > max.min(up_limit) {
        if max <= up_limit {
            (
                max,
                Some((
                    "TooManyReplicas",
                    format!(
                        "the desired replica count is more than the maximum replica count ({max})"
                    ),
                )),
            )
        } else {
            (
                up_limit,
                Some((
                    "ScaleUpLimit",
                    format!(
                        "the desired replica count is increasing faster than the maximum scale rate ({up_limit})"
                    ),
                )),
            )
        }
    } else {
        (stabilized, None)
    }
}

fn rules_or_default(r: Option<&ScalingRules>, up: bool, downscale_window: i64) -> ScalingRules {
    use orrery_api::autoscaling::federated::ScalingPolicy;
    let mut rules = r.cloned().unwrap_or_default();
    if rules.stabilization_window_seconds.is_none() {
        rules.stabilization_window_seconds = Some(if up { 0 } else { downscale_window as i32 });
    }
    if rules.select_policy.is_none() {
        rules.select_policy = Some("Max".into());
    }
    if rules.policies.is_empty() {
        rules.policies = if up {
            vec![
                ScalingPolicy {
                    type_: "Pods".into(),
                    value: 4,
                    period_seconds: 15,
                },
                ScalingPolicy {
                    type_: "Percent".into(),
                    value: 100,
                    period_seconds: 15,
                },
            ]
        } else {
            vec![ScalingPolicy {
                type_: "Percent".into(),
                value: 100,
                period_seconds: 15,
            }]
        };
    }
    rules
}

/// Replicas changed within `period` seconds before `now`.
fn changed_within(events: &[Stamped], now: i64, period: i32) -> i32 {
    events
        .iter()
        .filter(|e| e.at > now - i64::from(period))
        .map(|e| e.replicas)
        .sum()
}

/// With a behavior: each way's stabilization window, then its policies' rate.
fn with_behavior(
    i: &Input<'_>,
    b: &Behavior,
    proposal: i32,
    min: i32,
    max: i32,
) -> (i32, Option<(&'static str, String)>) {
    let up = rules_or_default(b.scale_up.as_ref(), true, i.downscale_window);
    let down = rules_or_default(b.scale_down.as_ref(), false, i.downscale_window);
    let window = |r: &ScalingRules| i64::from(r.stabilization_window_seconds.unwrap_or(0));
    let (mut up_rec, mut down_rec) = (proposal, proposal);
    for r in i.recommendations {
        if r.at > i.now - window(&up) {
            up_rec = up_rec.min(r.replicas);
        }
        if r.at > i.now - window(&down) {
            down_rec = down_rec.max(r.replicas);
        }
    }
    let mut stabilized = i.current;
    if stabilized < up_rec {
        stabilized = up_rec;
    }
    if stabilized > down_rec {
        stabilized = down_rec;
    }
    if stabilized > i.current {
        let limit = if up.select_policy.as_deref() == Some("Disabled") {
            i.current
        } else {
            let limits = up.policies.iter().map(|p| {
                let start = i.current - changed_within(i.scaled_up, i.now, p.period_seconds);
                match p.type_.as_str() {
                    "Pods" => start + p.value,
                    _ => (f64::from(start) * (1.0 + f64::from(p.value) / 100.0)).ceil() as i32,
                }
            });
            let l = if up.select_policy.as_deref() == Some("Min") {
                limits.min()
            } else {
                limits.max()
            };
            l.unwrap_or(i.current).max(i.current)
        };
        let allowed = max.min(limit);
        if stabilized > allowed {
            let why = if allowed == max && max <= limit {
                (
                    "TooManyReplicas",
                    format!(
                        "the desired replica count is more than the maximum replica count ({max})"
                    ),
                )
            } else {
                (
                    "ScaleUpLimit",
                    format!(
                        "the desired replica count is increasing faster than the maximum scale rate ({allowed})"
                    ),
                )
            };
            return (allowed.max(min), Some(why));
        }
    } else if stabilized < i.current {
        let limit = if down.select_policy.as_deref() == Some("Disabled") {
            i.current
        } else {
            let limits = down.policies.iter().map(|p| {
                let start = i.current + changed_within(i.scaled_down, i.now, p.period_seconds);
                match p.type_.as_str() {
                    "Pods" => start - p.value,
                    _ => (f64::from(start) * (1.0 - f64::from(p.value) / 100.0)).floor() as i32,
                }
            });
            // The policy allowing the most change: the lowest limit.
            let l = if down.select_policy.as_deref() == Some("Min") {
                limits.max()
            } else {
                limits.min()
            };
            l.unwrap_or(i.current).min(i.current)
        };
        let allowed = min.max(limit);
        if stabilized < allowed {
            let why = if allowed == min && min >= limit {
                (
                    "TooFewReplicas",
                    format!(
                        "the desired replica count is less than the minimum replica count ({min})"
                    ),
                )
            } else {
                (
                    "ScaleDownLimit",
                    format!(
                        "the desired replica count is decreasing faster than the maximum scale rate ({allowed})"
                    ),
                )
            };
            return (allowed.min(max), Some(why));
        }
    }
    if stabilized < min {
        return (
            min,
            Some((
                "TooFewReplicas",
                format!("the desired replica count is less than the minimum replica count ({min})"),
            )),
        );
    }
    if stabilized > max {
        return (
            max,
            Some((
                "TooManyReplicas",
                format!("the desired replica count is more than the maximum replica count ({max})"),
            )),
        );
    }
    (stabilized, None)
}

/// What an autoscaler remembers between passes: its recommendations (for the stabilization
/// windows) and its changes of replicas (for the policies' rates).
#[derive(Debug, Default, Clone)]
pub struct History {
    recommendations: std::collections::VecDeque<Stamped>,
    scaled_up: std::collections::VecDeque<Stamped>,
    scaled_down: std::collections::VecDeque<Stamped>,
}

impl History {
    /// One pass: what to set, remembering the recommendation. A history that starts (a new
    /// autoscaler, or a restarted controller) starts as if `current` had been recommended all
    /// along, so a restart never shortens a window.
    pub fn decide(
        &mut self,
        spec: &FederatedHPASpec,
        current: i32,
        usage: Option<&WorkloadUsage>,
        predicted: Option<i32>,
        now: i64,
        downscale_window: i64,
    ) -> Decision {
        if self.recommendations.is_empty() {
            self.recommendations.push_back(Stamped {
                at: now,
                replicas: current,
            });
        }
        let longest = spec
            .behavior
            .iter()
            .flat_map(|b| [&b.scale_up, &b.scale_down])
            .flatten()
            .filter_map(|r| r.stabilization_window_seconds)
            .map(i64::from)
            .chain([downscale_window, POLICY_PERIOD_MAX])
            .max()
            .unwrap_or(downscale_window);
        // The newest stays: it stands for what was recommended since.
        while self.recommendations.len() > 1
            && self
                .recommendations
                .front()
                .is_some_and(|r| r.at <= now - longest)
        {
            self.recommendations.pop_front();
        }
        for q in [&mut self.scaled_up, &mut self.scaled_down] {
            while q.front().is_some_and(|r| r.at <= now - POLICY_PERIOD_MAX) {
                q.pop_front();
            }
        }
        self.recommendations.make_contiguous();
        self.scaled_up.make_contiguous();
        self.scaled_down.make_contiguous();
        let d = decide(&Input {
            spec,
            current,
            usage,
            predicted,
            recommendations: self.recommendations.as_slices().0,
            scaled_up: self.scaled_up.as_slices().0,
            scaled_down: self.scaled_down.as_slices().0,
            now,
            downscale_window,
        });
        if let Some(r) = d.recommendation {
            self.recommendations.push_back(Stamped {
                at: now,
                replicas: r,
            });
        }
        d
    }

    /// The replicas were changed from `from` to `to` at `now`.
    pub fn scaled(&mut self, from: i32, to: i32, now: i64) {
        let delta = Stamped {
            at: now,
            replicas: (to - from).abs(),
        };
        if to > from {
            self.scaled_up.push_back(delta);
        } else if to < from {
            self.scaled_down.push_back(delta);
        }
    }
}

/// The longest period a scaling policy may have (autoscaling/v2: 1800 s).
const POLICY_PERIOD_MAX: i64 = 1800;

/// The replicas that serve `usage` (the forecast's, in the resource's base unit summed over
/// the pods) at the metric's target, with pods requesting `request_per_pod` each.
pub fn replicas_for(target: &Target, usage: f64, request_per_pod: f64) -> Option<i32> {
    let per_pod = match target {
        Target::Utilization { percent, .. } => request_per_pod * f64::from(*percent) / 100.0,
        Target::AverageValue { value, .. } => *value,
    };
    (per_pod > 0.0 && usage.is_finite()).then(|| (usage / per_pod).ceil().max(0.0) as i32)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(v: serde_json::Value) -> FederatedHPASpec {
        let mut base = json!({"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                              "minReplicas": 1, "maxReplicas": 20});
        for (k, x) in v.as_object().unwrap() {
            base[k] = x.clone();
        }
        FederatedHPASpec::parse(Some(&base)).unwrap()
    }

    /// `ready` pods each requesting 1 core, using `cpu` cores in all.
    fn usage(ready: i64, unready: i64, cpu: f64) -> WorkloadUsage {
        WorkloadUsage {
            ready_pods: ready,
            unready_pods: unready,
            cpu_milli: (cpu * 1000.0) as i64,
            cpu_request_milli: ready * 1000,
            memory_bytes: ready << 29,
            memory_request_bytes: ready << 30,
        }
    }

    fn run(
        s: &FederatedHPASpec,
        current: i32,
        u: Option<WorkloadUsage>,
        recs: &[Stamped],
    ) -> Decision {
        decide(&Input {
            spec: s,
            current,
            usage: u.as_ref(),
            predicted: None,
            recommendations: recs,
            scaled_up: &[],
            scaled_down: &[],
            now: 1000,
            downscale_window: 300,
        })
    }

    /// Kubernetes' replica calculator, case by case (target: cpu at 80 %, the default).
    #[test]
    fn the_replica_calculator() {
        let s = spec(json!({}));
        // (current, ready, unready, cpu used) → desired
        let cases: &[(i32, i64, i64, f64, i32, &str)] = &[
            (4, 4, 0, 3.2, 4, "at target"),
            (4, 4, 0, 3.4, 4, "within the tolerance (85 %)"),
            (4, 4, 0, 4.8, 6, "120 %: ceil(1.5 x 4)"),
            (4, 4, 0, 1.6, 2, "40 %: half"),
            (4, 4, 0, 3.0, 4, "75 %: within the tolerance down"),
            (
                4,
                2,
                2,
                3.2,
                4,
                "starting pods use nothing up: 160 % of 2 is 80 % of 4",
            ),
            (4, 2, 2, 4.0, 5, "200 % of 2 ready, 2 starting: ceil(5)"),
            (
                6,
                4,
                0,
                1.6,
                4,
                "2 missing count at target down: (0.5x4+2)/6",
            ),
            (
                6,
                4,
                0,
                6.4,
                8,
                "2 missing count as nothing up: 200 % of 4 over 6 pods",
            ),
            (10, 10, 0, 40.0, 20, "far beyond: capped by max"),
        ];
        for &(current, ready, unready, cpu, want, why) in cases {
            let d = run(&s, current, Some(usage(ready, unready, cpu)), &[]);
            assert_eq!(d.recommendation.unwrap().min(20), want, "{why}: {d:?}");
        }
    }

    #[test]
    fn no_usage_or_no_requests_keep_the_replicas_and_say_why() {
        let s = spec(json!({}));
        let d = run(&s, 3, None, &[]);
        assert_eq!(d.desired, 3);
        assert_eq!(d.inactive.as_ref().unwrap().0, "FailedGetResourceMetric");
        let mut u = usage(3, 0, 2.0);
        u.cpu_request_milli = 0;
        let d = run(&s, 3, Some(u), &[]);
        assert!(d.inactive.unwrap().1.contains("request no cpu"));
        let d = run(&s, 0, Some(usage(3, 0, 9.0)), &[]);
        assert_eq!((d.desired, d.inactive.unwrap().0), (0, "ScalingDisabled"));
        // Memory as an average value: 512 MiB used a pod against 256 MiB wanted: double.
        let m = spec(
            json!({"metrics": [{"type": "Resource", "resource": {"name": "memory",
            "target": {"type": "AverageValue", "averageValue": "256Mi"}}}]}),
        );
        assert_eq!(run(&m, 3, Some(usage(3, 0, 1.0)), &[]).desired, 6);
    }

    /// Kubernetes' order: replicas outside the bounds go to the nearest bound first, with or
    /// without usage and whatever the metrics or the rates say; no metric is read then.
    #[test]
    fn replicas_outside_the_bounds_go_to_the_nearest_bound_first() {
        let s = spec(json!({"minReplicas": 2, "maxReplicas": 4}));
        for usage_now in [None, Some(usage(10, 0, 40.0))] {
            let d = run(&s, 10, usage_now, &[]);
            assert_eq!(d.desired, 4);
            assert_eq!(d.out_of_range, Some(ABOVE_MAX));
            assert_eq!(d.limited.as_ref().unwrap().0, "TooManyReplicas");
            assert!(d.inactive.is_none() && d.recommendation.is_none());
            assert!(d.readings.is_empty());
        }
        let d = run(&s, 1, None, &[]);
        assert_eq!((d.desired, d.out_of_range), (2, Some(BELOW_MIN)));
        assert_eq!(d.limited.unwrap().0, "TooFewReplicas");
        // Scaled to 0 by hand: left alone. Within the bounds: the metrics decide.
        assert_eq!(run(&s, 0, None, &[]).inactive.unwrap().0, "ScalingDisabled");
        let d = run(&s, 3, None, &[]);
        assert_eq!((d.desired, d.out_of_range), (3, None));
        assert_eq!(d.inactive.unwrap().0, "FailedGetResourceMetric");
        assert!(d.limited.is_none());
        // A rate limit does not hold the bound back.
        let slow = spec(json!({"minReplicas": 2, "maxReplicas": 4, "behavior": {
            "scaleDown": {"policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]}}}));
        assert_eq!(run(&slow, 10, None, &[]).desired, 4);
    }

    /// Without a behavior: down only to the highest recommendation of the last 5 minutes, up
    /// at most to double (or 4), within min and max.
    #[test]
    fn plain_stabilization_and_limits() {
        let s = spec(json!({"minReplicas": 2, "maxReplicas": 12}));
        let recs = [
            Stamped {
                at: 650,
                replicas: 9,
            },
            Stamped {
                at: 800,
                replicas: 6,
            },
        ];
        // Wants 2 (20 %); 6 seen 200 s ago holds (9 is older than the window).
        let d = run(&s, 8, Some(usage(8, 0, 1.6)), &recs);
        assert_eq!((d.recommendation, d.desired), (Some(2), 6));
        // Up from 2 to at most 4, then from 4 to at most 8, and never beyond 12.
        let d = run(&s, 2, Some(usage(2, 0, 8.0)), &[]);
        assert_eq!((d.desired, d.limited.unwrap().0), (4, "ScaleUpLimit"));
        let d = run(&s, 8, Some(usage(8, 0, 40.0)), &[]);
        assert_eq!((d.desired, d.limited.unwrap().0), (12, "TooManyReplicas"));
        let d = run(&s, 3, Some(usage(3, 0, 0.3)), &[]);
        assert_eq!((d.desired, d.limited.unwrap().0), (2, "TooFewReplicas"));
    }

    /// With a behavior: Kubernetes' defaults for what it leaves out, the windows each way,
    /// and the policies' rate over their periods.
    #[test]
    fn behavior_windows_and_policies() {
        let s = spec(json!({"behavior": {
            "scaleUp": {"stabilizationWindowSeconds": 60, "policies": [{"type": "Pods", "value": 2, "periodSeconds": 60}]},
            "scaleDown": {"stabilizationWindowSeconds": 0, "policies": [{"type": "Percent", "value": 50, "periodSeconds": 60}]}
        }}));
        // Up: the lowest recommendation of the last minute (5) caps it, then 2 pods a minute.
        let recs = [Stamped {
            at: 970,
            replicas: 5,
        }];
        let d = run(&s, 4, Some(usage(4, 0, 8.0)), &recs);
        assert_eq!((d.recommendation, d.desired), (Some(10), 5));
        let d = run(&s, 4, Some(usage(4, 0, 8.0)), &[]);
        assert_eq!((d.desired, d.limited.unwrap().0), (6, "ScaleUpLimit"));
        // 2 added 30 s ago count against the minute: none more now.
        let up = [Stamped {
            at: 970,
            replicas: 2,
        }];
        let d = decide(&Input {
            spec: &s,
            current: 6,
            usage: Some(&usage(6, 0, 12.0)),
            predicted: None,
            recommendations: &[],
            scaled_up: &up,
            scaled_down: &[],
            now: 1000,
            downscale_window: 300,
        });
        assert_eq!(d.desired, 6);
        // Down: no window, half a minute at most.
        let d = run(&s, 10, Some(usage(10, 0, 0.8)), &[]);
        assert_eq!((d.desired, d.limited.unwrap().0), (5, "ScaleDownLimit"));
        // Disabled one way: never that way.
        let off = spec(json!({"behavior": {"scaleDown": {"selectPolicy": "Disabled"}}}));
        assert_eq!(run(&off, 10, Some(usage(10, 0, 0.8)), &[]).desired, 10);
        // Defaults: up 4 pods or 100 % in 15 s, whichever is more (4 pods from 3), down after
        // 300 s.
        let dflt = spec(json!({"behavior": {}}));
        assert_eq!(run(&dflt, 3, Some(usage(3, 0, 12.0)), &[]).desired, 7);
        assert_eq!(run(&dflt, 8, Some(usage(8, 0, 32.0)), &[]).desired, 16);
        let recs = [Stamped {
            at: 900,
            replicas: 10,
        }];
        assert_eq!(run(&dflt, 10, Some(usage(10, 0, 0.8)), &recs).desired, 10);
    }

    /// The forecast raises the recommendation, never lowers it, and needs a reading.
    #[test]
    fn the_forecast_raises() {
        let s = spec(json!({}));
        let i = |predicted, u: Option<WorkloadUsage>| {
            decide(&Input {
                spec: &s,
                current: 4,
                usage: u.as_ref(),
                predicted,
                recommendations: &[],
                scaled_up: &[],
                scaled_down: &[],
                now: 1000,
                downscale_window: 300,
            })
            .desired
        };
        assert_eq!(i(Some(7), Some(usage(4, 0, 3.2))), 7);
        assert_eq!(i(Some(2), Some(usage(4, 0, 3.2))), 4);
        assert_eq!(i(Some(7), None), 4);
        let t = Target::Utilization {
            resource: "cpu".into(),
            percent: 80,
        };
        assert_eq!(replicas_for(&t, 6.5, 1.0), Some(9));
    }
}
