//! The one parser of durations that flags and fields take: `250ms`, `40s`, `5m`, `1h30m`,
//! `30d`, a bare number of seconds, or ISO 8601 (`PT1H`). Parsed by jiff (its "friendly"
//! format), with days of 24 hours; never negative.

use std::time::Duration;

/// Why a duration does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {text:?}: {why} (e.g. 250ms, 40s, 5m, 1h30m, 30d)")]
pub struct DurationError {
    pub text: String,
    pub why: String,
}

/// Parses a duration.
pub fn parse(s: &str) -> Result<Duration, DurationError> {
    let text = s.trim();
    let err = |why: String| DurationError {
        text: s.to_string(),
        why,
    };
    if text.is_empty() {
        return Err(err("empty".into()));
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse::<u64>()
            .map(Duration::from_secs)
            .map_err(|e| err(e.to_string()));
    }
    let span: jiff::Span = text.parse().map_err(|e: jiff::Error| err(e.to_string()))?;
    let signed = span
        .to_duration(jiff::SpanRelativeTo::days_are_24_hours())
        .map_err(|e| err(e.to_string()))?;
    Duration::try_from(signed).map_err(|_| err("negative".into()))
}

/// [`parse`], for clap's `value_parser` (a `String` error).
pub fn parse_arg(s: &str) -> Result<Duration, String> {
    parse(s).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let ok = [
            ("250ms", Duration::from_millis(250)),
            ("40s", Duration::from_secs(40)),
            ("40", Duration::from_secs(40)),
            ("40 ", Duration::from_secs(40)),
            (" 5m", Duration::from_secs(300)),
            ("1h30m", Duration::from_secs(5400)),
            ("1h 30m", Duration::from_secs(5400)),
            ("24h", Duration::from_secs(86400)),
            ("30d", Duration::from_secs(30 * 86400)),
            ("0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("PT1H", Duration::from_secs(3600)),
        ];
        for (s, want) in ok {
            assert_eq!(parse(s), Ok(want), "{s:?}");
        }
        for bad in [
            "",
            " ",
            "soon",
            "5y",
            "-5s",
            "5x",
            "1.5.5h",
            "40 s s",
            "999999999999999999d",
            "18446744073709551616",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}: {:?}", parse(bad));
        }
        assert!(
            parse("soon")
                .unwrap_err()
                .to_string()
                .contains("e.g. 250ms")
        );
    }
}
