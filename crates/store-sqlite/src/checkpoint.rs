//! WAL checkpoints on their own thread and connection.
//!
//! SQLite would otherwise copy the WAL back into the database file inside some unlucky
//! writer's commit, stalling every write in that group. A passive checkpoint runs beside the
//! writer instead: it never blocks it, and the WAL is reused from the start once a checkpoint
//! has caught up.
//!
//! After a burst the WAL file can be hundreds of MB. SQLite truncates it to
//! `journal_size_limit` in the first commit after the WAL restarts, and freeing that much page
//! cache took ~300 ms, stalling every write of that commit group. So when the writer has been
//! idle for a moment, this thread truncates an oversized WAL itself.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

/// WAL pages beyond which a passive checkpoint that cannot finish is followed by a blocking
/// one (readers holding old snapshots can keep a passive one from catching up forever).
const WAL_PAGES_LIMIT: i64 = 64 * 1024;

pub fn run(path: PathBuf, wake: Receiver<()>) {
    let conn = match Connection::open_with_flags(
        &path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .and_then(|c| crate::schema::configure(&c).map(|_| c))
    {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot open the checkpoint connection; the WAL will grow until restart");
            return;
        }
    };
    let wal = {
        let mut p = path.clone().into_os_string();
        p.push("-wal");
        PathBuf::from(p)
    };
    loop {
        let idle = match wake.recv_timeout(Duration::from_millis(500)) {
            Ok(()) => false,
            Err(RecvTimeoutError::Timeout) => true,
            Err(RecvTimeoutError::Disconnected) => break,
        };
        if idle {
            match truncate_if_oversized(&conn, &wal, crate::schema::JOURNAL_SIZE_LIMIT as u64) {
                Ok(true) => tracing::debug!("idle store: oversized WAL truncated"),
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "truncating the WAL failed"),
            }
        }
        match checkpoint(&conn, "PASSIVE") {
            Ok((_, log, done)) if log > WAL_PAGES_LIMIT && done < log => {
                tracing::warn!(
                    wal_pages = log,
                    "WAL is large and a passive checkpoint could not finish; forcing one"
                );
                if let Err(e) = checkpoint(&conn, "RESTART") {
                    tracing::warn!(error = %e, "forced checkpoint failed");
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "checkpoint failed"),
        }
    }
    // The writer is gone: fold the WAL into the database and truncate it.
    if let Err(e) = checkpoint(&conn, "TRUNCATE") {
        tracing::debug!(error = %e, "final checkpoint failed");
    }
}

/// Truncates the WAL file when it is larger than `limit` bytes and a passive checkpoint
/// catches up completely (nothing left that a reader still needs): `TRUNCATE` then only waits
/// for the write lock, which an idle writer does not hold. Returns whether it truncated.
fn truncate_if_oversized(conn: &Connection, wal: &Path, limit: u64) -> rusqlite::Result<bool> {
    if std::fs::metadata(wal).map(|m| m.len()).unwrap_or(0) <= limit {
        return Ok(false);
    }
    let (busy, log, done) = checkpoint(conn, "PASSIVE")?;
    if busy != 0 || done < log {
        return Ok(false);
    }
    checkpoint(conn, "TRUNCATE")?;
    Ok(true)
}

/// Runs `PRAGMA wal_checkpoint(mode)`: (busy, WAL pages, pages checkpointed).
fn checkpoint(conn: &Connection, mode: &str) -> rusqlite::Result<(i64, i64, i64)> {
    conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get(2)?))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An oversized WAL is truncated once a checkpoint has caught up, not while a reader still
    /// needs it, and a WAL within the limit is left alone.
    #[test]
    fn an_oversized_wal_is_truncated_when_nothing_needs_it() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("t.db");
        let wal = dir.path().join("t.db-wal");
        let writer = Connection::open(&db).unwrap();
        writer
            .execute_batch(
                "PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=0;
                 CREATE TABLE t (v BLOB);",
            )
            .unwrap();
        let reader = Connection::open(&db).unwrap();
        let checkpointer = Connection::open(&db).unwrap();
        // A reader holding an old snapshot keeps the WAL from being reused: it grows.
        reader.execute_batch("BEGIN").unwrap();
        let _: i64 = reader
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        for _ in 0..40 {
            writer
                .execute("INSERT INTO t VALUES (zeroblob(65536))", [])
                .unwrap();
        }
        let size = || std::fs::metadata(&wal).unwrap().len();
        assert!(size() > 2 << 20, "{}", size());
        assert!(!truncate_if_oversized(&checkpointer, &wal, 1 << 20).unwrap());
        assert!(size() > 2 << 20, "kept while the reader needs it");
        reader.execute_batch("COMMIT").unwrap();
        assert!(!truncate_if_oversized(&checkpointer, &wal, 64 << 20).unwrap());
        assert!(size() > 2 << 20, "kept within the limit");
        assert!(truncate_if_oversized(&checkpointer, &wal, 1 << 20).unwrap());
        assert_eq!(size(), 0);
        // Nothing was lost.
        let n: i64 = writer
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 40);
    }
}
