//! Karmada's `autoscaling.karmada.io/v1alpha1` CronFederatedHPA, accepted unchanged: rules
//! that set a workload template's replicas on a cron schedule, in a time zone, with their
//! executions recorded in status.
//!
//! The schedule is the standard five-field cron of Kubernetes CronJobs and Karmada (minute,
//! hour, day of month, month, day of week; `*`, lists, ranges, steps, month and day names, and
//! the `@hourly`-style descriptors), evaluated in the rule's time zone. It is parsed here: the
//! crates that do it tie it to another date library than Orrery's (jiff).

use serde::{Deserialize, Serialize};

pub mod federated;

use crate::time::Time;
use crate::validation::{ErrorList, FieldError};

pub const GROUP: &str = "autoscaling.karmada.io";
pub const API_VERSION: &str = "autoscaling.karmada.io/v1alpha1";
pub const CRON_KIND: &str = "CronFederatedHPA";
pub const CRON_PLURAL: &str = "cronfederatedhpas";
/// How many executions of each outcome a rule keeps when it says nothing.
pub const DEFAULT_HISTORY_LIMIT: i32 = 3;
/// The kinds whose replicas a rule sets (their templates have `spec.replicas`).
pub const SCALABLE: [(&str, &str); 3] = [
    ("apps/v1", "Deployment"),
    ("apps/v1", "StatefulSet"),
    ("apps/v1", "ReplicaSet"),
];

/// A stored spec decoded strictly (an error names its field) and then validated.
fn parse_spec<T: serde::de::DeserializeOwned>(
    spec: Option<&serde_json::Value>,
    validate: impl Fn(&T) -> ErrorList,
) -> Result<T, ErrorList> {
    let spec = spec.cloned().unwrap_or(serde_json::Value::Null);
    let s: T = crate::meta::decode(&spec, "spec").map_err(|e| vec![e])?;
    let errs = validate(&s);
    if errs.is_empty() { Ok(s) } else { Err(errs) }
}

/// autoscaling/v2 `CrossVersionObjectReference`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CrossVersionObjectReference {
    /// The kind of the referent, e.g. Deployment.
    pub kind: String,
    /// The name of the referent, in the autoscaler's namespace.
    pub name: String,
    /// The API version of the referent, e.g. apps/v1.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CronFederatedHPASpec {
    /// What the rules scale: a workload template (a Deployment, StatefulSet or ReplicaSet in this namespace), or a FederatedHPA (its minReplicas and maxReplicas).
    pub scale_target_ref: CrossVersionObjectReference,
    /// When to set how many replicas.
    pub rules: Vec<CronFederatedHPARule>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CronFederatedHPARule {
    /// The rule's name, unique in the object, 1 to 32 characters.
    pub name: String,
    /// When the rule runs: a five-field cron schedule (minute hour day-of-month month day-of-week) or @hourly, @daily, @weekly, @monthly, @yearly.
    pub schedule: String,
    /// The replicas the workload template is set to (ignored for a FederatedHPA target).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_replicas: Option<i32>,
    /// For a FederatedHPA target: the minReplicas it is set to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_min_replicas: Option<i32>,
    /// For a FederatedHPA target: the maxReplicas it is set to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_max_replicas: Option<i32>,
    /// A suspended rule does not run (its nextExecutionTime is empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<bool>,
    /// The IANA time zone the schedule is read in, e.g. Europe/Berlin. Default: UTC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_zone: Option<String>,
    /// How many successful executions status keeps, 1 to 32. Default: 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub successful_history_limit: Option<i32>,
    /// How many failed executions status keeps, 0 to 32. Default: 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_history_limit: Option<i32>,
}

impl CronFederatedHPARule {
    pub fn suspended(&self) -> bool {
        self.suspend.unwrap_or(false)
    }

    /// The rule's time zone (UTC when it names none); the name was checked at admission.
    pub fn zone(&self) -> Result<jiff::tz::TimeZone, String> {
        match self.time_zone.as_deref() {
            None | Some("") => Ok(jiff::tz::TimeZone::UTC),
            Some(z) => {
                jiff::tz::TimeZone::get(z).map_err(|e| format!("unknown time zone {z:?}: {e}"))
            }
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CronFederatedHPAStatus {
    /// Per rule: when it runs next, and its last executions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub execution_histories: Vec<ExecutionHistory>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExecutionHistory {
    pub rule_name: String,
    /// When the rule runs next; empty while it is suspended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_execution_time: Option<Time>,
    /// Newest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub successful_executions: Vec<SuccessfulExecution>,
    /// Newest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_executions: Vec<FailedExecution>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SuccessfulExecution {
    /// The time the schedule named.
    pub schedule_time: Time,
    /// When it ran.
    pub execution_time: Time,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_max_replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_min_replicas: Option<i32>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailedExecution {
    pub schedule_time: Time,
    pub execution_time: Time,
    pub message: String,
}

impl CronFederatedHPASpec {
    /// The spec of a stored object, when it reads as one.
    pub fn parse(spec: Option<&serde_json::Value>) -> Result<CronFederatedHPASpec, ErrorList> {
        parse_spec(spec, Self::validate)
    }

    /// Karmada's rules (its webhook's).
    pub fn validate(&self) -> ErrorList {
        let mut errs = ErrorList::new();
        let r = &self.scale_target_ref;
        let path = "spec.scaleTargetRef";
        if r.name.is_empty() {
            errs.push(FieldError::required(format!("{path}.name"), ""));
        }
        let to_hpa = federated::is_reference(r);
        if !to_hpa
            && !SCALABLE
                .iter()
                .any(|(v, k)| *k == r.kind && (r.api_version.is_empty() || r.api_version == *v))
        {
            errs.push(FieldError::not_supported(
                format!("{path}.kind"),
                format!("{} {}", r.api_version, r.kind).trim(),
                &SCALABLE.map(|(_, k)| k),
            ));
        }
        if self.rules.is_empty() {
            errs.push(FieldError::required("spec.rules", "at least one rule"));
        }
        let mut names = std::collections::BTreeSet::new();
        for (i, rule) in self.rules.iter().enumerate() {
            let p = format!("spec.rules[{i}]");
            if rule.name.is_empty() || rule.name.len() > 32 {
                errs.push(FieldError::invalid(
                    format!("{p}.name"),
                    &rule.name,
                    "must be 1 to 32 characters",
                ));
            } else if !names.insert(rule.name.as_str()) {
                errs.push(FieldError::duplicate(format!("{p}.name"), &rule.name));
            }
            if let Err(e) = Schedule::parse(&rule.schedule) {
                errs.push(FieldError::invalid(
                    format!("{p}.schedule"),
                    &rule.schedule,
                    e,
                ));
            }
            if let Err(e) = rule.zone() {
                errs.push(FieldError::invalid(
                    format!("{p}.timeZone"),
                    rule.time_zone.as_deref().unwrap_or(""),
                    e,
                ));
            }
            if to_hpa {
                let (min, max) = (rule.target_min_replicas, rule.target_max_replicas);
                if min.unwrap_or(0) <= 0 && max.unwrap_or(0) <= 0 {
                    errs.push(FieldError::required(
                        format!("{p}.targetMinReplicas"),
                        "a rule for a FederatedHPA sets targetMinReplicas or targetMaxReplicas, greater than 0",
                    ));
                }
                for (f, v) in [("targetMinReplicas", min), ("targetMaxReplicas", max)] {
                    if let Some(v) = v
                        && v < 1
                    {
                        errs.push(FieldError::invalid(
                            format!("{p}.{f}"),
                            v,
                            "must be greater than or equal to 1",
                        ));
                    }
                }
                if let (Some(lo), Some(hi)) = (min, max)
                    && hi >= 1
                    && lo > hi
                {
                    errs.push(FieldError::invalid(
                        format!("{p}.targetMaxReplicas"),
                        hi,
                        "must be greater than or equal to targetMinReplicas",
                    ));
                }
            } else {
                match rule.target_replicas {
                    None => errs.push(FieldError::required(
                        format!("{p}.targetReplicas"),
                        "a rule for a workload sets its replicas",
                    )),
                    Some(n) if n < 0 => errs.push(FieldError::invalid(
                        format!("{p}.targetReplicas"),
                        n,
                        "must be greater than or equal to 0",
                    )),
                    Some(_) => {}
                }
                for (f, v) in [
                    ("targetMinReplicas", rule.target_min_replicas),
                    ("targetMaxReplicas", rule.target_max_replicas),
                ] {
                    if v.is_some() {
                        errs.push(FieldError::forbidden(
                            format!("{p}.{f}"),
                            "is for a FederatedHPA target; a workload's rule sets targetReplicas",
                        ));
                    }
                }
            }
            for (f, v, min) in [
                ("successfulHistoryLimit", rule.successful_history_limit, 1),
                ("failedHistoryLimit", rule.failed_history_limit, 0),
            ] {
                if let Some(v) = v
                    && !(min..=32).contains(&v)
                {
                    errs.push(FieldError::invalid(
                        format!("{p}.{f}"),
                        v,
                        format!("must be from {min} to 32"),
                    ));
                }
            }
        }
        errs
    }
}

/// A five-field cron schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    minutes: u64,
    hours: u32,
    /// Days of the month, bit 1..=31.
    days: u32,
    /// Months, bit 1..=12.
    months: u16,
    /// Days of the week, bit 0 (Sunday)..=6.
    weekdays: u8,
    /// Whether the day-of-month and day-of-week fields were both restricted: then a day
    /// matches when either does (as Vixie cron and Kubernetes read it).
    either_day: bool,
}

const MONTHS: [&str; 12] = [
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
];
const WEEKDAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

/// The values a field allows, as bits: `*`, `a`, `a-b`, `*/n`, `a-b/n`, `a/n` and lists of
/// them; `names` are read as `lo`, `lo + 1`...
fn field(text: &str, lo: u32, hi: u32, names: &[&str], what: &str) -> Result<u64, String> {
    let value = |s: &str| -> Result<u32, String> {
        if let Some(i) = names.iter().position(|n| n.eq_ignore_ascii_case(s)) {
            return Ok(lo + i as u32);
        }
        s.parse::<u32>()
            .map_err(|_| format!("{what}: {s:?} is not a number"))
    };
    let mut bits = 0u64;
    for part in text.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => {
                let step: u32 = s
                    .parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| format!("{what}: step {s:?} is not a number above 0"))?;
                (r, step)
            }
            None => (part, 1),
        };
        let (a, b) = if range == "*" {
            (lo, hi)
        } else if let Some((a, b)) = range.split_once('-') {
            (value(a)?, value(b)?)
        } else {
            let a = value(range)?;
            // `a/n`: from a to the end.
            (
                a,
                if step > 1 || part.contains('/') {
                    hi
                } else {
                    a
                },
            )
        };
        if a < lo || b > hi || a > b {
            return Err(format!("{what}: {part:?} is outside {lo}-{hi}"));
        }
        // In u64: a step near u32::MAX must end the loop, not wrap.
        let mut v = u64::from(a);
        while v <= u64::from(b) {
            bits |= 1 << v;
            v += u64::from(step);
        }
    }
    Ok(bits)
}

impl Schedule {
    pub fn parse(text: &str) -> Result<Schedule, String> {
        let text = text.trim();
        let expanded = match text {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            t if t.starts_with('@') => return Err(format!("unknown descriptor {t:?}")),
            t => t,
        };
        let f: Vec<&str> = expanded.split_whitespace().collect();
        if f.len() != 5 {
            return Err(format!(
                "a schedule has five fields (minute hour day-of-month month day-of-week), not {}",
                f.len()
            ));
        }
        // `*/1` is every value, as `*` (robfig's cron, which Kubernetes and Karmada use).
        let star = |s: &str| s == "*" || s == "?" || s == "*/1";
        let dom = if f[2] == "?" { "*" } else { f[2] };
        let dow = if f[4] == "?" { "*" } else { f[4] };
        Ok(Schedule {
            minutes: field(f[0], 0, 59, &[], "minute")?,
            hours: field(f[1], 0, 23, &[], "hour")? as u32,
            days: field(dom, 1, 31, &[], "day of month")? as u32,
            months: field(f[3], 1, 12, &MONTHS, "month")? as u16,
            // Sunday is 0 or 7.
            weekdays: {
                let w = field(dow, 0, 7, &WEEKDAYS, "day of week")?;
                ((w | (w >> 7)) & 0x7f) as u8
            },
            either_day: !star(f[2]) && !star(f[4]),
        })
    }

    fn day_matches(&self, d: jiff::civil::Date) -> bool {
        let dom = self.days & (1 << d.day()) != 0;
        let dow = self.weekdays & (1 << d.weekday().to_sunday_zero_offset()) != 0;
        if self.either_day {
            dom || dow
        } else {
            dom && dow
        }
    }

    /// The first time after `after` (to the minute) the schedule names, read in `tz`; `None`
    /// if it names none within five years (e.g. the 30th of February).
    pub fn next_after(
        &self,
        after: jiff::Timestamp,
        tz: &jiff::tz::TimeZone,
    ) -> Option<jiff::Timestamp> {
        use jiff::ToSpan;
        // The scan starts a few hours early in local time: a local time a DST gap skipped runs
        // at the instant after the gap, which may be just after `after` while its local time
        // is well before `after`'s (times not after `after` are passed over below).
        let start = after.to_zoned(tz.clone()).datetime();
        let from = (after - jiff::SignedDuration::from_hours(3))
            .to_zoned(tz.clone())
            .datetime();
        let mut t = from
            .with()
            .second(0)
            .subsec_nanosecond(0)
            .build()
            .ok()?
            .checked_add(1.minute())
            .ok()?;
        let end = start.checked_add(5.years()).ok()?;
        while t < end {
            if self.months & (1 << t.month()) == 0 {
                // The first minute of the next month.
                t = t
                    .first_of_month()
                    .checked_add(1.month())
                    .ok()?
                    .with()
                    .hour(0)
                    .minute(0)
                    .build()
                    .ok()?;
                continue;
            }
            if !self.day_matches(t.date()) {
                t = t
                    .date()
                    .checked_add(1.day())
                    .ok()?
                    .to_datetime(jiff::civil::Time::midnight());
                continue;
            }
            if self.hours & (1 << t.hour()) == 0 {
                t = t
                    .with()
                    .minute(0)
                    .build()
                    .ok()?
                    .checked_add(1.hour())
                    .ok()?;
                continue;
            }
            if self.minutes & (1 << t.minute()) == 0 {
                t = t.checked_add(1.minute()).ok()?;
                continue;
            }
            // A local time a DST gap skips runs at the instant after the gap; one a fold
            // repeats runs once, at its first.
            let at = tz.to_ambiguous_timestamp(t).compatible().ok()?;
            if at > after {
                return Some(at);
            }
            t = t.checked_add(1.minute()).ok()?;
        }
        None
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn at(s: &str) -> jiff::Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn schedules_name_the_times_cron_names() {
        // (schedule, zone, after) -> the next three times (UTC)
        let cases: &[(&str, &str, &str, [&str; 3])] = &[
            (
                "*/15 * * * *",
                "UTC",
                "2026-11-26T10:07:30Z",
                [
                    "2026-11-26T10:15:00Z",
                    "2026-11-26T10:30:00Z",
                    "2026-11-26T10:45:00Z",
                ],
            ),
            (
                "0 8 * * 1-5",
                "UTC",
                "2026-11-27T09:00:00Z",
                [
                    "2026-11-30T08:00:00Z",
                    "2026-12-01T08:00:00Z",
                    "2026-12-02T08:00:00Z",
                ],
            ),
            (
                "30 6 * * MON,fri",
                "UTC",
                "2026-11-26T00:00:00Z",
                [
                    "2026-11-27T06:30:00Z",
                    "2026-11-30T06:30:00Z",
                    "2026-12-04T06:30:00Z",
                ],
            ),
            // In a zone: 08:00 in Berlin is 07:00 UTC in winter, 06:00 in summer.
            (
                "0 8 * * *",
                "Europe/Berlin",
                "2026-03-27T12:00:00Z",
                [
                    "2026-03-28T07:00:00Z",
                    "2026-03-29T06:00:00Z",
                    "2026-03-30T06:00:00Z",
                ],
            ),
            // Day of month or day of week when both are restricted.
            (
                "0 0 13 * 5",
                "UTC",
                "2026-11-01T00:00:00Z",
                [
                    "2026-11-06T00:00:00Z",
                    "2026-11-13T00:00:00Z",
                    "2026-11-20T00:00:00Z",
                ],
            ),
            (
                "@monthly",
                "UTC",
                "2026-11-26T00:00:00Z",
                [
                    "2026-12-01T00:00:00Z",
                    "2027-01-01T00:00:00Z",
                    "2027-02-01T00:00:00Z",
                ],
            ),
            (
                "0 0 29 2 *",
                "UTC",
                "2026-01-01T00:00:00Z",
                [
                    "2028-02-29T00:00:00Z",
                    "2032-02-29T00:00:00Z",
                    "2036-02-29T00:00:00Z",
                ],
            ),
            (
                "5 4 * DEC 7",
                "UTC",
                "2026-11-26T00:00:00Z",
                [
                    "2026-12-06T04:05:00Z",
                    "2026-12-13T04:05:00Z",
                    "2026-12-20T04:05:00Z",
                ],
            ),
            (
                "0 22-23/1 1/10 * *",
                "UTC",
                "2026-11-26T00:00:00Z",
                [
                    "2026-12-01T22:00:00Z",
                    "2026-12-01T23:00:00Z",
                    "2026-12-11T22:00:00Z",
                ],
            ),
            // 02:30 does not exist in Berlin on 29 March 2026: it runs when the gap ends.
            (
                "30 2 * * *",
                "Europe/Berlin",
                "2026-03-28T12:00:00Z",
                [
                    "2026-03-29T01:30:00Z",
                    "2026-03-30T00:30:00Z",
                    "2026-03-31T00:30:00Z",
                ],
            ),
            // ...and is found again from just before it (as the controller checks a stored
            // time).
            (
                "30 2 * * *",
                "Europe/Berlin",
                "2026-03-29T01:29:59Z",
                [
                    "2026-03-29T01:30:00Z",
                    "2026-03-30T00:30:00Z",
                    "2026-03-31T00:30:00Z",
                ],
            ),
            // `*/1` in a day field is every day: the other day field alone decides.
            (
                "0 0 */1 * 1",
                "UTC",
                "2026-11-26T00:00:00Z",
                [
                    "2026-11-30T00:00:00Z",
                    "2026-12-07T00:00:00Z",
                    "2026-12-14T00:00:00Z",
                ],
            ),
            // A step far beyond the field is just its start.
            (
                "10/4294967290 * * * *",
                "UTC",
                "2026-11-26T00:00:00Z",
                [
                    "2026-11-26T00:10:00Z",
                    "2026-11-26T01:10:00Z",
                    "2026-11-26T02:10:00Z",
                ],
            ),
        ];
        for (sched, zone, after, want) in cases {
            let s = Schedule::parse(sched).unwrap();
            let tz = jiff::tz::TimeZone::get(zone).unwrap();
            let mut t = at(after);
            for w in want {
                t = s
                    .next_after(t, &tz)
                    .unwrap_or_else(|| panic!("{sched}: none after {t}"));
                assert_eq!(t, at(w), "{sched} in {zone} after {after}");
            }
        }
        assert_eq!(
            Schedule::parse("0 0 30 2 *")
                .unwrap()
                .next_after(at("2026-01-01T00:00:00Z"), &jiff::tz::TimeZone::UTC),
            None
        );
    }

    #[test]
    fn bad_schedules_say_why() {
        for (bad, says) in [
            ("* * * *", "five fields"),
            ("60 * * * *", "minute"),
            ("* 24 * * *", "hour"),
            ("* * 0 * *", "day of month"),
            ("* * * 13 *", "month"),
            ("* * * * 8", "day of week"),
            ("*/0 * * * *", "step"),
            ("5-1 * * * *", "outside"),
            ("@fortnightly", "descriptor"),
            ("a * * * *", "not a number"),
        ] {
            let e = Schedule::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn rules_are_checked_as_karmada_checks_them() {
        let ok = serde_json::json!({
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
            "rules": [{"name": "morning", "schedule": "0 8 * * 1-5", "targetReplicas": 10, "timeZone": "Asia/Tokyo"},
                      {"name": "night", "schedule": "0 20 * * *", "targetReplicas": 2, "suspend": true}]
        });
        assert!(CronFederatedHPASpec::parse(Some(&ok)).is_ok());
        let fields = |v: serde_json::Value| -> Vec<String> {
            CronFederatedHPASpec::parse(Some(&v))
                .unwrap_err()
                .iter()
                .map(|e| e.field.clone())
                .collect()
        };
        let mut v = ok.clone();
        v["rules"][1]["name"] = "morning".into();
        v["rules"][0]["timeZone"] = "Mars/Olympus".into();
        v["rules"][1]["schedule"] = "daily".into();
        v["rules"][1]["successfulHistoryLimit"] = 0.into();
        assert_eq!(
            fields(v),
            [
                "spec.rules[0].timeZone",
                "spec.rules[1].name",
                "spec.rules[1].schedule",
                "spec.rules[1].successfulHistoryLimit"
            ]
        );
        let mut v = ok.clone();
        v["rules"][0]
            .as_object_mut()
            .unwrap()
            .remove("targetReplicas");
        v["rules"][1]["targetMinReplicas"] = 1.into();
        assert_eq!(
            fields(v),
            [
                "spec.rules[0].targetReplicas",
                "spec.rules[1].targetMinReplicas"
            ]
        );
        // A FederatedHPA's rules set its bounds: one of them at least, min no more than max.
        let mut v = ok.clone();
        v["scaleTargetRef"] = serde_json::json!({"apiVersion": "autoscaling.karmada.io/v1alpha1", "kind": "FederatedHPA", "name": "x"});
        v["rules"][0]["targetMaxReplicas"] = 8.into();
        assert!(CronFederatedHPASpec::parse(Some(&v)).is_err());
        v["rules"][1]["targetMinReplicas"] = 9.into();
        v["rules"][1]["targetMaxReplicas"] = 3.into();
        assert_eq!(fields(v.clone()), ["spec.rules[1].targetMaxReplicas"]);
        v["rules"][1]["targetMaxReplicas"] = 0.into();
        assert_eq!(fields(v.clone()), ["spec.rules[1].targetMaxReplicas"]);
        v["rules"][1]["targetMaxReplicas"] = 12.into();
        assert!(CronFederatedHPASpec::parse(Some(&v)).is_ok());
        v["rules"][0]
            .as_object_mut()
            .unwrap()
            .remove("targetMaxReplicas");
        assert_eq!(fields(v), ["spec.rules[0].targetMinReplicas"]);
        let mut v = ok;
        v["rules"] = serde_json::json!([]);
        assert_eq!(fields(v), ["spec.rules"]);
        assert!(CronFederatedHPASpec::parse(Some(&serde_json::json!({"scaleTargetRef": {"kind": "Deployment", "name": "w"}, "rules": [], "colour": 1}))).is_err());
    }
}
