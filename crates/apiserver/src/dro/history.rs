//! The historical data interface (draft 6.4.2): `GET /api/v1/history/schedules`.

use orrery_api::Time;
use orrery_api::history::{self, ScheduleEntry};
use orrery_store::ListOptions;
use serde_json::json;

use super::DroError;
use crate::app::App;
use crate::auth::Identity;
use crate::http::Body;

/// Entries returned when `maxEntries` is not given (the draft's default).
pub const DEFAULT_ENTRIES: usize = 100;
/// The most one request may ask for.
pub const MAX_ENTRIES: usize = 10_000;

/// `startTime`, `endTime` (ISO 8601) and `maxEntries` from a query string.
pub(super) fn parse_query(query: &str) -> Result<(Option<i64>, Option<i64>, usize), DroError> {
    let (mut start, mut end, mut max) = (None, None, DEFAULT_ENTRIES);
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        let time = |v: &str| {
            v.parse::<Time>().map(|t| t.unix_seconds()).map_err(|_| {
                DroError::validation(format!(
                    "{k} must be an ISO 8601 time such as 2025-04-01T08:30:00Z, got {v:?}"
                ))
                .with_details(json!({ "parameter": k }))
            })
        };
        match k.as_ref() {
            "startTime" => start = Some(time(&v)?),
            "endTime" => end = Some(time(&v)?),
            "maxEntries" => {
                max = match v.parse::<usize>() {
                    Ok(n) if (1..=MAX_ENTRIES).contains(&n) => n,
                    _ => {
                        return Err(DroError::validation(format!(
                            "maxEntries must be a whole number from 1 to {MAX_ENTRIES}, got {v:?}"
                        ))
                        .with_details(json!({ "parameter": "maxEntries" })));
                    }
                }
            }
            _ => {
                return Err(DroError::validation(format!("unknown parameter {k:?}"))
                    .with_details(json!({ "parameter": k })));
            }
        }
    }
    if let (Some(s), Some(e)) = (start, end)
        && s > e
    {
        return Err(DroError::validation("startTime is after endTime"));
    }
    Ok((start, end, max))
}

/// Scheduling decisions, newest first.
pub async fn schedules(
    app: &App,
    who: &Identity,
    query: &str,
) -> Result<http::Response<Body>, DroError> {
    // Scheduling decisions are the history of the fleet's bindings.
    app.authz
        .authorize(
            who,
            &crate::auth::Attributes {
                verb: "list",
                group: "multicluster.io",
                resource: "resourcebindings",
                ..Default::default()
            },
        )
        .map_err(DroError::from)?;
    let (start, end, max) = parse_query(query)?;
    let list = app
        .store
        .list(history::PREFIX, &ListOptions::default())
        .await
        .map_err(DroError::internal)?;
    let mut out: Vec<ScheduleEntry> = Vec::new();
    'records: for o in list.items.iter().rev() {
        let entries = match o.spec.as_ref().map(history::record_entries) {
            Some(Ok(entries)) => entries,
            Some(Err(e)) => {
                tracing::warn!(record = %o.name(), error = %e, "an unreadable schedule record is skipped");
                continue;
            }
            None => continue,
        };
        for e in entries.into_iter().rev() {
            let t = e.time.unix_seconds();
            if start.is_some_and(|s| t < s) || end.is_some_and(|x| t > x) {
                continue;
            }
            out.push(e);
            if out.len() >= max {
                break 'records;
            }
        }
    }
    Ok(super::answers::send(
        http::StatusCode::OK,
        &super::answers::ScheduleHistory {
            count: out.len(),
            entries: out,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_parameters() {
        assert_eq!(parse_query("").unwrap(), (None, None, 100));
        let (s, e, m) =
            parse_query("startTime=2025-04-01T00:00:00Z&endTime=2025-04-02T00:00:00Z&maxEntries=5")
                .unwrap();
        assert_eq!((e.unwrap() - s.unwrap(), m), (86400, 5));
        for bad in [
            "startTime=yesterday",
            "maxEntries=0",
            "maxEntries=100001",
            "maxEntries=-1",
            "limit=3",
            "startTime=2025-04-02T00:00:00Z&endTime=2025-04-01T00:00:00Z",
        ] {
            let e = parse_query(bad).unwrap_err();
            assert_eq!((e.status, e.code), (400, "VALIDATION_FAILED"), "{bad}");
        }
    }
}
