//! Reads: a pool of read-only connections, each read in its own WAL snapshot, so reads never
//! wait for the writer and the writer never waits for them.

use parking_lot::Mutex;
use std::path::PathBuf;
use std::sync::Arc;

use orrery_api::Object;
use orrery_store::{
    Change, ChangeKind, ListOptions, ListResult, RawListResult, RawObject, Revision, StoreError,
    decode_continue, encode_continue, prefix_end, with_resource_version,
};
use rusqlite::{Connection, OptionalExtension, params};

use crate::schema;

/// Reads running at once. Each runs on a blocking thread with a connection of its own (and its
/// page cache): unbounded, a thousand agents registering at once had the runtime start
/// hundreds of threads and connections, and the server peaked at 2 GiB. More cannot run on a
/// machine's cores anyway; the rest wait their turn without a thread.
const MAX_READERS: usize = 16;
/// Connections kept idle at most (as many as may run, so none is opened twice under load).
const MAX_IDLE: usize = MAX_READERS;

#[derive(Debug)]
pub struct Readers {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
    permits: Arc<tokio::sync::Semaphore>,
}

fn sql(e: rusqlite::Error) -> StoreError {
    StoreError::Backend(format!("read failed: {e}"))
}

/// Parses stored JSON and stamps the revision into it.
pub fn decode(key: &str, rev: Revision, value: &[u8]) -> Result<Object, StoreError> {
    let mut obj: Object = serde_json::from_slice(value).map_err(|e| {
        StoreError::Corrupt(format!(
            "stored object {key} at revision {rev} does not parse: {e}"
        ))
    })?;
    obj.metadata.resource_version = rev.to_string();
    Ok(obj)
}

impl Readers {
    pub fn new(path: PathBuf) -> Self {
        Readers {
            path,
            idle: Mutex::new(Vec::new()),
            permits: Arc::new(tokio::sync::Semaphore::new(MAX_READERS)),
        }
    }

    /// Runs `f` on a pooled connection in a blocking thread, inside one read transaction.
    pub async fn with<T, F>(self: &Arc<Self>, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        self.run(true, f).await
    }

    /// Runs one statement's read `f` without an explicit transaction: SQLite reads each
    /// statement from one snapshot anyway, and the `BEGIN`/`COMMIT` pair cost as much as a
    /// point read.
    pub async fn with_statement<T, F>(self: &Arc<Self>, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        self.run(false, f).await
    }

    async fn run<T, F>(self: &Arc<Self>, transaction: bool, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let this = self.clone();
        // The semaphore is never closed, so acquiring fails only if it were.
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| StoreError::Closed)?;
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let conn = match this.idle.lock().pop() {
                Some(c) => c,
                None => schema::open_reader(&this.path)?,
            };
            // One snapshot for the whole read, so multi-statement reads are consistent.
            if transaction {
                conn.execute_batch("BEGIN").map_err(sql)?;
            }
            let out = f(&conn);
            let ended = if transaction {
                conn.execute_batch("COMMIT")
            } else {
                Ok(())
            };
            if ended.is_ok() {
                let mut idle = this.idle.lock();
                if idle.len() < MAX_IDLE {
                    idle.push(conn);
                }
            }
            out
        })
        .await
        .map_err(|e| StoreError::Backend(format!("read task failed: {e}")))?
    }
}

pub fn get(conn: &Connection, key: &str) -> Result<Object, StoreError> {
    let row: Option<(Revision, i64, Vec<u8>)> = conn
        .prepare_cached(
            "SELECT rev, deleted, value FROM kv WHERE key = ?1 ORDER BY rev DESC LIMIT 1",
        )
        .map_err(sql)?
        .query_row([key], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()
        .map_err(sql)?;
    match row {
        Some((rev, 0, value)) => decode(key, rev, &value),
        _ => Err(StoreError::NotFound {
            key: key.to_string(),
        }),
    }
}

/// The compacted and current revisions as of this snapshot.
fn snapshot_revisions(conn: &Connection) -> Result<(Revision, Revision), StoreError> {
    let compacted = schema::meta(conn, "compact_rev").map_err(sql)?;
    let current = conn
        .query_row("SELECT coalesce(max(rev), 0) FROM kv", [], |r| {
            r.get::<_, Revision>(0)
        })
        .map_err(sql)?
        .max(schema::meta(conn, "rev_floor").map_err(sql)?);
    Ok((compacted, current))
}

/// The end of a key range; keys are UTF-8, so U+10FFFF sorts after every real key.
fn range_end(prefix: &str) -> String {
    prefix_end(prefix).unwrap_or_else(|| "\u{10FFFF}".to_string())
}

/// One page of matching stored rows: (key, revision, stored JSON), the list revision and
/// whether more follow.
struct Scanned {
    rows: Vec<(String, Revision, Vec<u8>)>,
    revision: Revision,
    continue_token: Option<String>,
}

fn scan(conn: &Connection, prefix: &str, opts: &ListOptions) -> Result<Scanned, StoreError> {
    let (start, requested) = match &opts.continue_token {
        Some(token) => {
            let (start, rev) = decode_continue(prefix, token)?;
            (start, Some(rev))
        }
        None => (prefix.to_string(), opts.revision),
    };
    let (compacted, current) = snapshot_revisions(conn)?;
    let revision = match requested {
        Some(r) if r < compacted => {
            return Err(StoreError::Expired {
                requested: r,
                compacted,
            });
        }
        Some(r) if r > current => {
            return Err(StoreError::FutureRevision {
                requested: r,
                current,
            });
        }
        Some(r) => r,
        None => current,
    };
    let limit = opts.page_limit();
    let end = range_end(prefix);
    // Without selectors nothing needs parsing here.
    let filtered = !(opts.labels.is_everything() && opts.fields.is_everything());

    let mut scan = conn
        .prepare_cached(
            "SELECT rev, key, deleted FROM kv INDEXED BY kv_key \
             WHERE key >= ?1 AND key < ?2 AND rev <= ?3 ORDER BY key, rev",
        )
        .map_err(sql)?;
    let mut value_of = conn
        .prepare_cached("SELECT value FROM kv WHERE rev = ?1")
        .map_err(sql)?;
    let mut rows = scan.query(params![start, end, revision]).map_err(sql)?;

    let mut out: Vec<(String, Revision, Vec<u8>)> = Vec::new();
    let mut more = false;
    // The scan yields each key's versions in order; the last one at or before `revision` wins.
    let mut pending: Option<(String, Revision, bool)> = None;
    let mut finish = |entry: (String, Revision, bool),
                      out: &mut Vec<(String, Revision, Vec<u8>)>,
                      more: &mut bool|
     -> Result<bool, StoreError> {
        let (key, rev, deleted) = entry;
        if deleted {
            return Ok(false);
        }
        if limit.is_some_and(|l| out.len() >= l) {
            *more = true;
            return Ok(true);
        }
        let value: Vec<u8> = value_of.query_row([rev], |r| r.get(0)).map_err(sql)?;
        if !filtered || opts.matches(&decode(&key, rev, &value)?) {
            out.push((key, rev, value));
        }
        Ok(false)
    };
    while let Some(row) = rows.next().map_err(sql)? {
        let (rev, key, deleted): (Revision, String, bool) = (
            row.get(0).map_err(sql)?,
            row.get(1).map_err(sql)?,
            row.get::<_, i64>(2).map_err(sql)? != 0,
        );
        match &mut pending {
            Some((k, r, d)) if *k == key => {
                *r = rev;
                *d = deleted;
            }
            _ => {
                if let Some(prev) = pending.replace((key, rev, deleted))
                    && finish(prev, &mut out, &mut more)?
                {
                    break;
                }
            }
        }
    }
    if !more && let Some(prev) = pending.take() {
        finish(prev, &mut out, &mut more)?;
    }
    drop(rows);
    let continue_token = match (more, out.last()) {
        (true, Some((k, _, _))) => Some(encode_continue(prefix, k, revision)),
        _ => None,
    };
    Ok(Scanned {
        rows: out,
        revision,
        continue_token,
    })
}

pub fn list(conn: &Connection, prefix: &str, opts: &ListOptions) -> Result<ListResult, StoreError> {
    let s = scan(conn, prefix, opts)?;
    let items = s
        .rows
        .iter()
        .map(|(k, rev, v)| decode(k, *rev, v))
        .collect::<Result<_, _>>()?;
    Ok(ListResult {
        items,
        revision: s.revision,
        continue_token: s.continue_token,
    })
}

pub fn list_raw(
    conn: &Connection,
    prefix: &str,
    opts: &ListOptions,
) -> Result<RawListResult, StoreError> {
    let s = scan(conn, prefix, opts)?;
    let items = s
        .rows
        .iter()
        .map(|(_, rev, v)| RawObject {
            revision: *rev,
            json: with_resource_version(v, *rev),
        })
        .collect();
    Ok(RawListResult {
        items,
        revision: s.revision,
        continue_token: s.continue_token,
    })
}

/// Changes under `prefix` with `after < rev <= until`, for watches that start before the cache.
pub fn history(
    conn: &Connection,
    prefix: &str,
    after: Revision,
    until: Revision,
) -> Result<Vec<Arc<Change>>, StoreError> {
    let compacted = schema::meta(conn, "compact_rev").map_err(sql)?;
    if after < compacted {
        return Err(StoreError::Expired {
            requested: after,
            compacted,
        });
    }
    let mut stmt = conn
        .prepare_cached(
            "SELECT a.rev, a.key, a.prev_rev, a.deleted, a.value, b.value FROM kv a \
             LEFT JOIN kv b ON b.rev = a.prev_rev \
             WHERE a.rev > ?1 AND a.rev <= ?2 AND a.key >= ?3 AND a.key < ?4 ORDER BY a.rev",
        )
        .map_err(sql)?;
    let mut rows = stmt
        .query(params![after, until, prefix, range_end(prefix)])
        .map_err(sql)?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(sql)? {
        let rev: Revision = row.get(0).map_err(sql)?;
        let key: String = row.get(1).map_err(sql)?;
        let prev_rev: Revision = row.get(2).map_err(sql)?;
        let deleted = row.get::<_, i64>(3).map_err(sql)? != 0;
        let value: Vec<u8> = row.get(4).map_err(sql)?;
        let prev: Option<Vec<u8>> = row.get(5).map_err(sql)?;
        let obj = Arc::new(decode(&key, rev, &value)?);
        let kind = if deleted {
            ChangeKind::Delete
        } else if prev_rev == 0 {
            ChangeKind::Create
        } else {
            ChangeKind::Update
        };
        out.push(Arc::new(Change::new(key, rev, kind, obj, prev)));
    }
    Ok(out)
}
