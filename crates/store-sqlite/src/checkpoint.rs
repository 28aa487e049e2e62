//! WAL checkpoints on their own thread and connection.
//!
//! SQLite would otherwise copy the WAL back into the database file inside some unlucky
//! writer's commit, stalling every write in that group. A passive checkpoint runs beside the
//! writer instead: it never blocks it, and the WAL is reused from the start once a checkpoint
//! has caught up.

use std::path::PathBuf;
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
    while let Ok(()) | Err(RecvTimeoutError::Timeout) =
        wake.recv_timeout(Duration::from_millis(500))
    {
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

/// Runs `PRAGMA wal_checkpoint(mode)`: (busy, WAL pages, pages checkpointed).
fn checkpoint(conn: &Connection, mode: &str) -> rusqlite::Result<(i64, i64, i64)> {
    conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get(2)?))
    })
}
