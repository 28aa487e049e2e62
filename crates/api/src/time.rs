//! `metav1.Time`: an RFC 3339 instant, serialized to whole seconds in UTC as Kubernetes does.

use std::fmt;
use std::str::FromStr;

use jiff::Timestamp;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A point in time with Kubernetes' wire format (`2006-01-02T15:04:05Z`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Time(pub Timestamp);

impl Time {
    /// The current time. The api crate does no I/O; reading the clock is the one exception,
    /// and callers that need determinism pass times in instead.
    pub fn now() -> Self {
        Time(Timestamp::now())
    }

    pub fn from_unix_seconds(secs: i64) -> Option<Self> {
        Timestamp::from_second(secs).ok().map(Time)
    }

    pub fn unix_seconds(&self) -> i64 {
        self.0.as_second()
    }

    pub fn timestamp(&self) -> Timestamp {
        self.0
    }

    /// `secs` seconds later (saturating at the end of representable time).
    pub fn add_seconds(&self, secs: i64) -> Self {
        Time::from_unix_seconds(self.unix_seconds().saturating_add(secs)).unwrap_or(*self)
    }

    /// Whole seconds from `earlier` to this time.
    pub fn seconds_since(&self, earlier: Time) -> i64 {
        self.unix_seconds() - earlier.unix_seconds()
    }
}

impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Whole seconds in UTC: what Go's metav1.Time marshals.
        let secs = Timestamp::from_second(self.0.as_second()).unwrap_or(self.0);
        write!(f, "{}", secs.strftime("%Y-%m-%dT%H:%M:%SZ"))
    }
}

/// A timestamp that does not parse as RFC 3339.
#[derive(Debug, thiserror::Error)]
#[error("invalid RFC 3339 time {input:?}: {reason}")]
pub struct TimeParseError {
    pub input: String,
    pub reason: String,
}

impl FromStr for Time {
    type Err = TimeParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse::<Timestamp>()
            .map(Time)
            .map_err(|e| TimeParseError {
                input: s.to_string(),
                reason: e.to_string(),
            })
    }
}

impl schemars::JsonSchema for MicroTime {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "MicroTime".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": "string", "format": "date-time" })
    }
}

impl schemars::JsonSchema for Time {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Time".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": "string", "format": "date-time" })
    }
}

impl Serialize for Time {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Time {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// `metav1.MicroTime`: an instant to the microsecond (`2006-01-02T15:04:05.000000Z`), for
/// what whole seconds cannot tell apart (a migration's phases, its downtime).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MicroTime(pub Timestamp);

impl MicroTime {
    pub fn now() -> Self {
        MicroTime(Timestamp::now())
    }

    /// Milliseconds from `earlier` to this time.
    pub fn millis_since(&self, earlier: MicroTime) -> i64 {
        self.0.as_millisecond() - earlier.0.as_millisecond()
    }

    /// Whole seconds from `earlier` to this time (rounded down).
    pub fn seconds_since(&self, earlier: MicroTime) -> i64 {
        self.millis_since(earlier).div_euclid(1000)
    }

    /// `ms` milliseconds later.
    pub fn add_millis(&self, ms: i64) -> Self {
        self.0
            .checked_add(jiff::SignedDuration::from_millis(ms))
            .map(MicroTime)
            .unwrap_or(*self)
    }

    /// To the second, as a `Time`.
    pub fn time(&self) -> Time {
        Time(self.0)
    }
}

impl From<Time> for MicroTime {
    fn from(t: Time) -> Self {
        MicroTime(t.0)
    }
}

impl fmt::Display for MicroTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let micros = self.0.as_microsecond();
        let t = Timestamp::from_microsecond(micros).unwrap_or(self.0);
        write!(f, "{}", t.strftime("%Y-%m-%dT%H:%M:%S%.6fZ"))
    }
}

impl FromStr for MicroTime {
    type Err = TimeParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse::<Time>().map(|t| MicroTime(t.0))
    }
}

impl Serialize for MicroTime {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MicroTime {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn micro_times_keep_microseconds() {
        let t: MicroTime = "2024-03-01T10:20:30.987654321+02:00".parse().unwrap();
        assert_eq!(t.to_string(), "2024-03-01T08:20:30.987654Z");
        let whole: MicroTime = "2024-03-01T08:20:31Z".parse().unwrap();
        assert_eq!(whole.to_string(), "2024-03-01T08:20:31.000000Z");
        assert_eq!(whole.millis_since(t), 13);
        assert_eq!(whole.seconds_since(t), 0);
        assert_eq!(
            t.add_millis(1500).to_string(),
            "2024-03-01T08:20:32.487654Z"
        );
        let back: MicroTime = serde_json::from_str(&serde_json::to_string(&t).unwrap()).unwrap();
        assert_eq!(back, "2024-03-01T08:20:30.987654Z".parse().unwrap());
    }

    #[test]
    fn formats_whole_seconds_utc() {
        let t: Time = "2024-03-01T10:20:30.987654+02:00".parse().unwrap();
        assert_eq!(t.to_string(), "2024-03-01T08:20:30Z");
        assert_eq!(
            serde_json::to_string(&t).unwrap(),
            "\"2024-03-01T08:20:30Z\""
        );
    }

    #[test]
    fn rejects_garbage() {
        assert!("yesterday".parse::<Time>().is_err());
        assert!(serde_json::from_str::<Time>("\"2024-13-01T00:00:00Z\"").is_err());
    }
}
