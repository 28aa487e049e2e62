//! `metav1.Condition`: the status conditions every kind reports, and the one rule of keeping
//! them: a condition's `lastTransitionTime` moves only when its status changes.

use serde::{Deserialize, Serialize};

use crate::time::Time;

/// One condition (`type`, `status` True/False/Unknown, why, since when).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// The condition's type, e.g. Ready.
    #[serde(rename = "type")]
    pub type_: String,
    /// True, False or Unknown.
    pub status: String,
    /// Why, in one CamelCase word.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Why, for people.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// When the status last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// The generation the condition was set for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

pub const TRUE: &str = "True";
pub const FALSE: &str = "False";
pub const UNKNOWN: &str = "Unknown";

impl Condition {
    pub fn new(type_: &str, status: &str, reason: &str, message: impl Into<String>) -> Self {
        Condition {
            type_: type_.to_string(),
            status: status.to_string(),
            reason: reason.to_string(),
            message: message.into(),
            last_transition_time: None,
            observed_generation: None,
        }
    }

    pub fn is_true(&self) -> bool {
        self.status == TRUE
    }
}

/// The condition of a type, if present.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Sets `new` in `conditions`: a changed status stamps `now` as the transition time, an
/// unchanged one keeps the old time. Returns whether anything changed.
pub fn set(conditions: &mut Vec<Condition>, mut new: Condition, now: Time) -> bool {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(old) => {
            new.last_transition_time = if old.status == new.status {
                old.last_transition_time.or(Some(now))
            } else {
                Some(now)
            };
            if *old == new {
                return false;
            }
            *old = new;
            true
        }
        None => {
            new.last_transition_time = Some(now);
            conditions.push(new);
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_time_moves_only_with_status() {
        let t1 = Time::from_unix_seconds(1_000).unwrap();
        let t2 = Time::from_unix_seconds(2_000).unwrap();
        let t3 = Time::from_unix_seconds(3_000).unwrap();
        let mut cs = Vec::new();
        assert!(set(
            &mut cs,
            Condition::new("Ready", TRUE, "Up", "fine"),
            t1
        ));
        assert_eq!(cs[0].last_transition_time, Some(t1));
        // Same status, new message: changed, but the transition time stays.
        assert!(set(
            &mut cs,
            Condition::new("Ready", TRUE, "Up", "still fine"),
            t2
        ));
        assert_eq!(cs[0].last_transition_time, Some(t1));
        assert_eq!(cs[0].message, "still fine");
        // Identical: nothing changes.
        assert!(!set(
            &mut cs,
            Condition::new("Ready", TRUE, "Up", "still fine"),
            t3
        ));
        // New status: new transition time.
        assert!(set(
            &mut cs,
            Condition::new("Ready", UNKNOWN, "Silent", ""),
            t3
        ));
        assert_eq!(cs[0].last_transition_time, Some(t3));
        assert_eq!(cs.len(), 1);
        assert!(find(&cs, "Ready").is_some_and(|c| !c.is_true()));
        assert!(find(&cs, "Joined").is_none());
    }
}
