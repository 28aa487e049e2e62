//! Writes the schedule history: one record per scheduling round (split when large), oldest
//! records pruned beyond a count and an age.

use std::collections::VecDeque;
use std::sync::Arc;

use orrery_api::history::{self, ScheduleEntry};
use orrery_api::{Object, Time};
use orrery_store::{ListOptions, Store, StoreError};
use tokio::sync::mpsc;

/// Entries per record.
const CHUNK: usize = 500;
/// Records kept; older ones go.
const MAX_RECORDS: usize = 2000;
/// And none older than a week.
const MAX_AGE_SECONDS: i64 = 7 * 86400;

/// Where the scheduler and the binding controller send history entries: one writer, so that
/// one count and one age bound every record.
#[derive(Clone, Debug)]
pub struct History(mpsc::UnboundedSender<Vec<ScheduleEntry>>);

impl History {
    /// Starts the writer; it ends when every handle is gone.
    pub fn spawn(store: Arc<dyn Store>) -> History {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(write(store, rx));
        History(tx)
    }

    /// Queues entries (none is lost to a full queue; a writer gone takes none).
    pub fn send(&self, entries: Vec<ScheduleEntry>) {
        if !entries.is_empty() {
            let _ = self.0.send(entries);
        }
    }
}

/// Writes batches of entries until the sender goes away.
async fn write(store: Arc<dyn Store>, mut rx: mpsc::UnboundedReceiver<Vec<ScheduleEntry>>) {
    let mut names: VecDeque<(String, i64)> = match existing(store.as_ref()).await {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(error = %e, "reading the schedule history");
            VecDeque::new()
        }
    };
    let mut seq = 0u64;
    while let Some(mut batch) = rx.recv().await {
        // Whatever else queued up goes into the same records.
        while let Ok(more) = rx.try_recv() {
            batch.extend(more);
        }
        for chunk in batch.chunks(CHUNK) {
            seq += 1;
            let now = Time::now();
            let name = history::record_name(now.timestamp().as_nanosecond(), seq % 1_000_000);
            let mut o = Object::new(history::API_VERSION, history::KIND).with_name(&name);
            o.metadata.creation_timestamp = Some(now);
            o.spec = match history::record_spec(chunk) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!(error = %e, "encoding the schedule history");
                    continue;
                }
            };
            match store.create(&history::key(&name), o).await {
                Ok(_) => names.push_back((name, now.unix_seconds())),
                Err(e) => tracing::warn!(error = %e, "writing the schedule history"),
            }
        }
        let cutoff = Time::now().unix_seconds() - MAX_AGE_SECONDS;
        while names.len() > MAX_RECORDS || names.front().is_some_and(|(_, t)| *t < cutoff) {
            let Some((old, _)) = names.pop_front() else {
                break;
            };
            if let Err(e) = store.delete(&history::key(&old), &Default::default()).await
                && !matches!(e, StoreError::NotFound { .. })
            {
                tracing::warn!(error = %e, "pruning the schedule history");
            }
        }
    }
}

async fn existing(store: &dyn Store) -> Result<VecDeque<(String, i64)>, StoreError> {
    let mut out = VecDeque::new();
    let mut opts = ListOptions::default().with_limit(1000);
    loop {
        let page = store.list(history::PREFIX, &opts).await?;
        for o in &page.items {
            let t = o
                .metadata
                .creation_timestamp
                .map(|t| t.unix_seconds())
                .unwrap_or(0);
            out.push_back((o.name().to_string(), t));
        }
        match page.continue_token {
            Some(c) if !c.is_empty() => {
                opts = ListOptions::default().with_limit(1000).with_continue(c)
            }
            _ => return Ok(out),
        }
    }
}
