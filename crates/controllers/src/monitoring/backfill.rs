//! History reported afterwards, merged into the 5-minute averages: a cluster's inbox
//! (`orrery_api::history::backfill`) is read, averaged per window, each window set into the
//! stored average of its time (or a record of its own where there is none), and the inbox
//! deleted at the revision read, so samples that came meanwhile are merged next time. A
//! window the monitoring loop measured keeps what it measured; merging the same inbox twice
//! (a crash between the writes and the delete) writes nothing the second time.

use std::collections::BTreeSet;

use orrery_api::history::backfill::{self, Inbox};
use orrery_api::history::series::{self, ClusterSample, FleetSample};
use orrery_api::{Object, Time};
use orrery_store::{Preconditions, Store, StoreError};
use serde::Deserialize;

use super::Kept;

/// What a merge did.
#[derive(Debug, Default)]
pub(super) struct Merged {
    /// The windows merged, oldest first, as the forecaster takes them.
    pub windows: Vec<(i64, ClusterSample)>,
    /// Records written.
    pub written: usize,
    /// Samples came while merging: the inbox is there still, to be merged again.
    pub again: bool,
}

/// Merges `cluster`'s inbox into the averages under [`series::AVERAGE_PREFIX`], whose windows
/// are `every` seconds.
pub(super) async fn merge(
    store: &dyn Store,
    cluster: &str,
    every: i64,
    kept: &mut Kept,
) -> Result<Merged, StoreError> {
    let key = backfill::key(cluster);
    let o = match store.get(&key).await {
        Ok(o) => o,
        Err(StoreError::NotFound { .. }) => return Ok(Merged::default()),
        Err(e) => return Err(e),
    };
    let mut inbox: Inbox = match o.spec.as_ref().map(Inbox::deserialize) {
        Some(Ok(i)) => i,
        _ => {
            tracing::warn!(cluster, "an unreadable history inbox; dropped");
            Inbox::default()
        }
    };
    inbox.expire(Time::now().unix_seconds());
    let windows = backfill::windows(&inbox.points, every);
    let prefix = series::AVERAGE_PREFIX;
    let mut stored: BTreeSet<i64> = kept
        .records(store, prefix)
        .await?
        .keys()
        .filter_map(|k| k.strip_prefix(prefix)?.parse().ok())
        .collect();
    let mut written = 0;
    for (end, sample) in &windows {
        let at = backfill::target(&stored, *end, every).unwrap_or(*end);
        if let Some(size) = put(store, cluster, at, sample).await? {
            kept.wrote(series::key(prefix, at), size);
            stored.insert(at);
            written += 1;
        }
    }
    let gone = store
        .delete(
            &key,
            &Preconditions {
                revision: o.revision(),
                ..Default::default()
            },
        )
        .await;
    let again = match gone {
        Ok(_) | Err(StoreError::NotFound { .. }) => false,
        Err(StoreError::Conflict { .. }) => true,
        Err(e) => return Err(e),
    };
    Ok(Merged {
        windows,
        written,
        again,
    })
}

/// Sets `sample` of `cluster` into the average at `at` (made when there is none); its size
/// when written, `None` when it was there already or the cluster was measured there.
async fn put(
    store: &dyn Store,
    cluster: &str,
    at: i64,
    sample: &ClusterSample,
) -> Result<Option<u64>, StoreError> {
    let key = series::key(series::AVERAGE_PREFIX, at);
    for _ in 0..5 {
        let (mut s, old) = match store.get(&key).await {
            Ok(o) => match o.spec.as_ref().map(FleetSample::deserialize) {
                Some(Ok(s)) => (s, Some(o)),
                // Not a sample: left as it is.
                _ => return Ok(None),
            },
            Err(StoreError::NotFound { .. }) => (
                FleetSample {
                    time: Time::from_unix_seconds(at).unwrap_or_else(Time::now),
                    clusters: Default::default(),
                },
                None,
            ),
            Err(e) => return Err(e),
        };
        if !backfill::merge_into(&mut s, cluster, sample) {
            return Ok(None);
        }
        let spec = serde_json::to_value(&s).ok();
        let written = match old {
            Some(mut o) => {
                let revision = o.revision();
                o.spec = spec;
                store.update(&key, o, revision).await
            }
            None => {
                let name = key.trim_start_matches(series::AVERAGE_PREFIX).to_string();
                let mut o = Object::new("internal.orrery.io/v1", "FleetSample").with_name(&name);
                o.metadata.creation_timestamp = Some(s.time);
                o.spec = spec;
                store.create(&key, o).await
            }
        };
        match written {
            Ok(o) => return Ok(Some(serde_json::to_vec(&*o).map_or(0, |v| v.len() as u64))),
            // The monitoring loop or a pruning got there first: read again.
            Err(StoreError::Conflict { .. } | StoreError::AlreadyExists { .. }) => continue,
            Err(StoreError::NotFound { .. }) => continue,
            Err(e) => return Err(e),
        }
    }
    tracing::warn!(
        cluster,
        at,
        "a monitoring average kept changing; its backfill left out"
    );
    Ok(None)
}
