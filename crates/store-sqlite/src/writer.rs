//! The single writer thread and its group commit.
//!
//! Callers queue write requests. The writer takes every request waiting (up to a bound),
//! applies them in one `BEGIN IMMEDIATE` transaction, each with its own revision, and commits
//! once: one fsync for the whole group. The committed group then goes to the dispatcher thread,
//! which publishes the changes to the watch cache in revision order and only then acknowledges
//! each caller. A request whose check fails (conflict, not found) writes nothing and does not
//! disturb the others; an SQLite error fails the whole group, which is rolled back.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use orrery_api::Object;
use orrery_store::{Change, ChangeKind, Preconditions, Revision, StoreError, WatchCache};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use tokio::sync::{mpsc, oneshot};

use crate::gather::Gather;
use crate::latest::Latest;
use crate::schema;

/// A queued write.
pub enum Op {
    Create {
        key: String,
        value: Vec<u8>,
        obj: Box<Object>,
    },
    Update {
        key: String,
        value: Vec<u8>,
        obj: Box<Object>,
        expected: Option<Revision>,
    },
    Delete {
        key: String,
        pre: Preconditions,
    },
    /// Raise the compacted revision (logical; physical clean-up follows in steps).
    Compact {
        target: Revision,
    },
    /// Physically remove up to `limit` versions that the compacted revision made unreachable.
    CompactStep {
        limit: usize,
    },
    /// Stop after everything queued before it; later requests fail with `Closed`.
    Shutdown,
}

/// What a request gets back.
pub enum Reply {
    Object(Arc<Object>),
    Unit,
    /// Whether physical compaction has caught up with the compacted revision.
    Stepped {
        finished: bool,
    },
}

pub struct Request {
    pub op: Op,
    pub reply: oneshot::Sender<Result<Reply, StoreError>>,
}

/// The result of applying one op inside the group's transaction.
enum Applied {
    Put {
        key: String,
        rev: Revision,
        kind: ChangeKind,
        /// With its new resourceVersion.
        obj: Arc<Object>,
        prev: Option<Vec<u8>>,
        /// The stored JSON (without `resourceVersion`), kept by the watch cache's ring in
        /// place of the parsed object once newer changes have come: without it the ring kept
        /// every one of its 4,096 changes parsed, ten times their JSON (a fleet's forecast
        /// records, 290 KB each parsed, were 620 MB of an idle server's heap).
        raw: Arc<[u8]>,
    },
    Deleted {
        key: String,
        rev: Revision,
        value: Vec<u8>,
    },
    Compacted {
        target: Revision,
    },
    Stepped {
        finished: bool,
    },
    Shutdown,
}

/// Counters for tests and metrics.
#[derive(Debug, Default)]
pub struct Stats {
    pub transactions: AtomicU64,
    pub writes: AtomicU64,
}

/// State the writer shares with the store front-end.
#[derive(Debug)]
pub struct Shared {
    pub current: AtomicI64,
    pub compacted: AtomicI64,
    /// How far physical compaction has got.
    pub compact_done: AtomicI64,
    /// Recently written objects, for point reads.
    pub latest: Latest,
    pub stats: Stats,
}

pub struct Writer {
    conn: Connection,
    rev: Revision,
    compacted: Revision,
    compact_done: Revision,
    max_batch: usize,
    shared: Arc<Shared>,
    /// Nudges the checkpoint thread; full means a nudge is already pending.
    checkpoint: std::sync::mpsc::SyncSender<()>,
    commits: u64,
    gather: Gather,
}

/// The longest sleep between looks at the queue while gathering a group.
const NAP: Duration = Duration::from_micros(100);

/// Commits between checkpoint nudges (it also runs on a timer).
const CHECKPOINT_EVERY: u64 = 32;

impl Writer {
    pub fn new(
        conn: Connection,
        rev: Revision,
        compacted: Revision,
        compact_done: Revision,
        (max_batch, commit_delay): (usize, Duration),
        shared: Arc<Shared>,
        checkpoint: std::sync::mpsc::SyncSender<()>,
    ) -> Self {
        Writer {
            conn,
            rev,
            compacted,
            compact_done,
            max_batch: max_batch.max(1),
            shared,
            checkpoint,
            commits: 0,
            gather: Gather::new(commit_delay),
        }
    }

    /// Runs until every sender is gone.
    pub fn run(
        mut self,
        mut rx: mpsc::Receiver<Request>,
        dispatch: std::sync::mpsc::Sender<Vec<Committed>>,
    ) {
        let mut batch: Vec<Request> = Vec::with_capacity(self.max_batch);
        let mut stop = None;
        while let Some(first) = rx.blocking_recv() {
            let mut next = Some(first);
            while let Some(req) = next.take() {
                if matches!(req.op, Op::Shutdown) {
                    stop = Some(req.reply);
                    break;
                }
                batch.push(req);
                if batch.len() < self.max_batch {
                    next = rx.try_recv().ok();
                }
            }
            if stop.is_none() {
                stop = self.gather_more(&mut rx, &mut batch);
            }
            let mut committed = if batch.is_empty() {
                Vec::new()
            } else {
                let n = batch.len();
                let out = self.commit_group(&mut batch);
                self.gather.committed(n, Instant::now());
                out
            };
            if let Some(reply) = stop.take() {
                committed.push(Committed {
                    reply,
                    applied: Ok(Applied::Shutdown),
                });
                let _ = dispatch.send(committed);
                break;
            }
            if dispatch.send(committed).is_err() {
                break;
            }
        }
        tracing::debug!("store writer stopped");
    }

    /// Waits a little for more writes when that has lately made groups larger (gather.rs).
    /// Returns the reply of a shutdown request met on the way.
    fn gather_more(
        &mut self,
        rx: &mut mpsc::Receiver<Request>,
        batch: &mut Vec<Request>,
    ) -> Option<oneshot::Sender<Result<Reply, StoreError>>> {
        let wait = self
            .gather
            .wait(batch.len(), self.max_batch, Instant::now())?;
        loop {
            while batch.len() < self.max_batch {
                match rx.try_recv() {
                    Ok(req) if matches!(req.op, Op::Shutdown) => return Some(req.reply),
                    Ok(req) => batch.push(req),
                    Err(_) => break,
                }
            }
            let now = Instant::now();
            if batch.len() >= wait.enough || now >= wait.until {
                return None;
            }
            // Short naps rather than one timed receive: the queue is a tokio channel, whose
            // timers tick in milliseconds.
            std::thread::sleep((wait.until - now).min(NAP));
        }
    }

    fn commit_group(&mut self, batch: &mut Vec<Request>) -> Vec<Committed> {
        let start_rev = self.rev;
        let (start_compacted, start_done) = (self.compacted, self.compact_done);
        let n = batch.len() as u64;
        // The cached versions of what this group may change go before it commits, so a read
        // never finds a version older than one already committed (latest.rs).
        self.shared
            .latest
            .forget(batch.iter().filter_map(|r| match &r.op {
                Op::Create { key, .. } | Op::Update { key, .. } | Op::Delete { key, .. } => {
                    Some(key.as_str())
                }
                _ => None,
            }));
        let result =
            (|| -> rusqlite::Result<Vec<(oneshot::Sender<_>, Result<Applied, StoreError>)>> {
                let tx = self
                    .conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)?;
                let mut out = Vec::with_capacity(batch.len());
                for req in batch.drain(..) {
                    let applied = apply(
                        &tx,
                        &mut self.rev,
                        &mut self.compacted,
                        &mut self.compact_done,
                        req.op,
                    )?;
                    out.push((req.reply, applied));
                }
                tx.commit()?;
                Ok(out)
            })();
        match result {
            Ok(out) => {
                self.shared
                    .stats
                    .transactions
                    .fetch_add(1, Ordering::Relaxed);
                self.shared.stats.writes.fetch_add(n, Ordering::Relaxed);
                self.shared.current.store(self.rev, Ordering::Release);
                self.shared
                    .compacted
                    .store(self.compacted, Ordering::Release);
                self.shared
                    .compact_done
                    .store(self.compact_done, Ordering::Release);
                self.shared
                    .latest
                    .put(out.iter().filter_map(|(_, applied)| match applied {
                        Ok(Applied::Put { key, obj, raw, .. }) => {
                            Some((key.clone(), obj.clone(), raw.len()))
                        }
                        _ => None,
                    }));
                self.commits += 1;
                if self.commits.is_multiple_of(CHECKPOINT_EVERY) {
                    let _ = self.checkpoint.try_send(());
                }
                out.into_iter()
                    .map(|(reply, applied)| Committed { reply, applied })
                    .collect()
            }
            Err(e) => {
                // Nothing of the group was written (the transaction rolled back on drop).
                tracing::error!(error = %e, "store write transaction failed");
                self.rev = start_rev;
                self.compacted = start_compacted;
                self.compact_done = start_done;
                let msg = format!("write failed: {e}");
                batch
                    .drain(..)
                    .map(|r| Committed {
                        reply: r.reply,
                        applied: Err(StoreError::Backend(msg.clone())),
                    })
                    .collect()
            }
        }
    }
}

/// The latest version of a key: (rev, deleted, value).
fn latest(
    tx: &Connection,
    key: &str,
    with_value: bool,
) -> rusqlite::Result<Option<(Revision, bool, Vec<u8>)>> {
    if with_value {
        tx.prepare_cached(
            "SELECT rev, deleted, value FROM kv WHERE key = ?1 ORDER BY rev DESC LIMIT 1",
        )?
        .query_row([key], |r| {
            Ok((r.get(0)?, r.get::<_, i64>(1)? != 0, r.get(2)?))
        })
        .optional()
    } else {
        tx.prepare_cached("SELECT rev, deleted FROM kv WHERE key = ?1 ORDER BY rev DESC LIMIT 1")?
            .query_row([key], |r| {
                Ok((r.get(0)?, r.get::<_, i64>(1)? != 0, Vec::new()))
            })
            .optional()
    }
}

fn insert(
    tx: &Connection,
    rev: Revision,
    key: &str,
    prev: Revision,
    deleted: bool,
    value: &[u8],
) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "INSERT INTO kv (rev, key, prev_rev, deleted, value) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![rev, key, prev, deleted as i64, value])?;
    Ok(())
}

fn set_meta(tx: &Connection, name: &str, value: i64) -> rusqlite::Result<()> {
    tx.prepare_cached("UPDATE meta SET value = ?2 WHERE name = ?1")?
        .execute(params![name, value])?;
    Ok(())
}

/// Applies one op. The outer error aborts the whole group; the inner one answers only this op.
fn apply(
    tx: &Connection,
    rev: &mut Revision,
    compacted: &mut Revision,
    compact_done: &mut Revision,
    op: Op,
) -> rusqlite::Result<Result<Applied, StoreError>> {
    Ok(match op {
        Op::Create { key, value, obj } => match latest(tx, &key, false)? {
            Some((_, false, _)) => Err(StoreError::AlreadyExists { key }),
            _ => {
                let next = *rev + 1;
                insert(tx, next, &key, 0, false, &value)?;
                *rev = next;
                Ok(Applied::Put {
                    key,
                    rev: next,
                    kind: ChangeKind::Create,
                    obj: stamped(obj, next),
                    prev: None,
                    raw: value.into(),
                })
            }
        },
        Op::Update {
            key,
            value,
            obj,
            expected,
        } => match latest(tx, &key, true)? {
            None | Some((_, true, _)) => Err(StoreError::NotFound { key }),
            Some((current, false, _)) if expected.is_some_and(|e| e != current) => {
                Err(StoreError::Conflict {
                    key,
                    expected: expected.unwrap_or_default(),
                    current,
                })
            }
            Some((current, false, prev)) => {
                let next = *rev + 1;
                insert(tx, next, &key, current, false, &value)?;
                *rev = next;
                Ok(Applied::Put {
                    key,
                    rev: next,
                    kind: ChangeKind::Update,
                    obj: stamped(obj, next),
                    prev: Some(prev),
                    raw: value.into(),
                })
            }
        },
        Op::Delete { key, pre } => match latest(tx, &key, true)? {
            None | Some((_, true, _)) => Err(StoreError::NotFound { key }),
            Some((current, false, _)) if pre.revision.is_some_and(|e| e != current) => {
                Err(StoreError::Conflict {
                    key,
                    expected: pre.revision.unwrap_or_default(),
                    current,
                })
            }
            Some((current, false, value)) => {
                if let Some(uid) = &pre.uid {
                    let stored = stored_uid(&value);
                    if stored.as_deref() != Some(uid.as_str()) {
                        return Ok(Err(StoreError::PreconditionFailed {
                            key,
                            message: format!(
                                "UID in precondition: {uid}, UID in object meta: {}",
                                stored.unwrap_or_default()
                            ),
                        }));
                    }
                }
                let next = *rev + 1;
                insert(tx, next, &key, current, true, &value)?;
                *rev = next;
                Ok(Applied::Deleted {
                    key,
                    rev: next,
                    value,
                })
            }
        },
        Op::Compact { target } => {
            if target > *rev {
                Err(StoreError::FutureRevision {
                    requested: target,
                    current: *rev,
                })
            } else {
                if target > *compacted {
                    set_meta(tx, "compact_rev", target)?;
                    *compacted = target;
                }
                Ok(Applied::Compacted { target: *compacted })
            }
        }
        Op::CompactStep { limit } => {
            let target = *compacted;
            let mut rows: Vec<(Revision, String, bool)> = Vec::with_capacity(limit);
            {
                let mut stmt = tx.prepare_cached(
                    "SELECT rev, key, deleted FROM kv WHERE rev > ?1 AND rev <= ?2 ORDER BY rev LIMIT ?3",
                )?;
                let mut q = stmt.query(params![*compact_done, target, limit as i64])?;
                while let Some(r) = q.next()? {
                    rows.push((r.get(0)?, r.get(1)?, r.get::<_, i64>(2)? != 0));
                }
            }
            // Each version looked at supersedes every older version of its key: no read at or
            // after the compacted revision can see those (this one is at or before it). They go
            // whatever pass kept them: a version kept by an earlier pass, because it was the
            // latest then, must not outlive the newer version or tombstone found now, or it
            // would be current again once that tombstone goes.
            let mut older = tx.prepare_cached("DELETE FROM kv WHERE key = ?1 AND rev < ?2")?;
            let mut delete = tx.prepare_cached("DELETE FROM kv WHERE rev = ?1")?;
            // In revision order, so a key's older versions go before (or with) its tombstone,
            // and a reader never sees an old version reappear.
            for (r, key, deleted) in &rows {
                older.execute(params![key, r])?;
                // A tombstone at or before the compacted revision hides nothing any more.
                if *deleted {
                    delete.execute([r])?;
                }
            }
            let finished = rows.len() < limit;
            let done = if finished {
                target
            } else {
                rows.last().map(|r| r.0).unwrap_or(target)
            };
            set_meta(tx, "compact_done", done)?;
            // The newest row may be a deleted tombstone: remember the revision independently.
            set_meta(tx, "rev_floor", *rev)?;
            *compact_done = done;
            Ok(Applied::Stepped { finished })
        }
        // Handled by the writer loop before a group is formed.
        Op::Shutdown => Ok(Applied::Shutdown),
    })
}

/// A written object with the revision of its write.
fn stamped(mut obj: Box<Object>, rev: Revision) -> Arc<Object> {
    obj.metadata.resource_version = rev.to_string();
    Arc::new(*obj)
}

/// The uid in stored object JSON, for delete preconditions.
fn stored_uid(value: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Meta {
        #[serde(default)]
        uid: Option<String>,
    }
    #[derive(serde::Deserialize)]
    struct Partial {
        metadata: Meta,
    }
    serde_json::from_slice::<Partial>(value).ok()?.metadata.uid
}

/// A committed op waiting to be published and acknowledged.
pub struct Committed {
    reply: oneshot::Sender<Result<Reply, StoreError>>,
    applied: Result<Applied, StoreError>,
}

/// Publishes committed groups to the watch cache in order, then acknowledges their writers.
pub fn dispatch(rx: std::sync::mpsc::Receiver<Vec<Committed>>, cache: WatchCache) {
    for group in rx {
        for Committed { reply, applied } in group {
            let answer = applied.map(|a| match a {
                Applied::Put { key, rev, kind, obj, prev, raw } => {
                    cache.publish(Arc::new(Change::stored(key, rev, kind, obj.clone(), raw, prev)));
                    Reply::Object(obj)
                }
                Applied::Deleted { key, rev, value } => {
                    let mut obj = serde_json::from_slice::<Object>(&value).unwrap_or_else(|e| {
                        tracing::error!(%key, error = %e, "deleted object's stored JSON does not parse");
                        Object::default()
                    });
                    obj.metadata.resource_version = rev.to_string();
                    let obj = Arc::new(obj);
                    // With its stored JSON, as a write's (and as etcd's deletions come).
                    cache.publish(Arc::new(Change::stored(key, rev, ChangeKind::Delete, obj.clone(), value.into(), None)));
                    Reply::Object(obj)
                }
                Applied::Compacted { target } => {
                    cache.set_compacted(target);
                    Reply::Unit
                }
                Applied::Stepped { finished } => Reply::Stepped { finished },
                Applied::Shutdown => Reply::Unit,
            });
            // The caller may have gone away (cancelled request); the write stands regardless.
            let _ = reply.send(answer);
        }
    }
    tracing::debug!("store dispatcher stopped");
}

/// Reads the revisions the writer starts from.
pub fn initial_revisions(conn: &Connection) -> rusqlite::Result<(Revision, Revision, Revision)> {
    let max: Revision = conn.query_row("SELECT coalesce(max(rev), 0) FROM kv", [], |r| r.get(0))?;
    let floor = schema::meta(conn, "rev_floor")?;
    Ok((
        max.max(floor),
        schema::meta(conn, "compact_rev")?,
        schema::meta(conn, "compact_done")?,
    ))
}
