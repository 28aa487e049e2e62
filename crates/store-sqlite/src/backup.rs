//! Backups and restores of the store file.
//!
//! - Backup: `VACUUM INTO` on a read-only connection copies one consistent snapshot of the
//!   database (one read transaction: every write committed before it, none after) while the
//!   server keeps writing; WAL readers never block the writer. The copy is a store file itself.
//! - Restore: the copy is checked (ours, a schema this build reads, SQLite's integrity check),
//!   written next to the target and renamed into place, then its revisions are moved past
//!   anything the old server may have handed out after the snapshot, and history before them
//!   is marked compacted: a client's resourceVersion from before the restore can never name a
//!   different version, and watches from it are told to list again (`410 Gone`), as etcd's
//!   `snapshot restore --bump-revision --mark-compacted` does for Kubernetes.
//!
//! A restore never overwrites a store: the target must not exist. Files kept with the
//! backup (the server's certificate authority, which the store does not hold) travel in an
//! `attachments` table of the copy, which the restore hands back and drops.

use std::path::{Path, PathBuf};

use orrery_store::{Revision, StoreError};
use rusqlite::{Connection, OpenFlags};

use crate::schema;

/// What a backup holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backup {
    /// The store's revision in the snapshot: every write acknowledged at or before it is in.
    pub revision: Revision,
    pub bytes: u64,
}

/// What a restore made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Restored {
    /// The snapshot's revision.
    pub revision: Revision,
    /// The revision the restored store continues from (and is compacted to).
    pub continues_at: Revision,
}

fn backend(what: &str, path: &Path) -> impl Fn(rusqlite::Error) -> StoreError {
    let at = format!("{what} {}", path.display());
    move |e| StoreError::Backend(format!("{at}: {e}"))
}

/// Opens `path` read-only and checks it is a store this build reads (its schema version).
fn open_ours(path: &Path) -> Result<Connection, StoreError> {
    if !path.exists() {
        return Err(StoreError::Backend(format!(
            "{}: no store there",
            path.display()
        )));
    }
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| schema::open_error(path, e))?;
    conn.busy_timeout(std::time::Duration::from_secs(10))
        .map_err(|e| schema::open_error(path, e))?;
    let app_id: i64 = conn
        .pragma_query_value(None, "application_id", |r| r.get(0))
        .map_err(|e| schema::open_error(path, e))?;
    if app_id != schema::APPLICATION_ID {
        return Err(StoreError::Corrupt(format!(
            "{} is not an Orrery store (application id {app_id:#x})",
            path.display()
        )));
    }
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(|e| schema::open_error(path, e))?;
    schema::readable_version(path, version)?;
    Ok(conn)
}

fn revision_of(conn: &Connection) -> rusqlite::Result<Revision> {
    let max: Revision = conn.query_row("SELECT coalesce(max(rev), 0) FROM kv", [], |r| r.get(0))?;
    Ok(max.max(schema::meta(conn, "rev_floor")?))
}

fn sync_dir(path: &Path) -> Result<(), StoreError> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
    let dir = dir.unwrap_or(Path::new("."));
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StoreError::Backend(format!("syncing {}: {e}", dir.display())))
}

/// Files kept with a backup: (name, contents).
pub type Attachments = Vec<(String, Vec<u8>)>;

/// Copies a consistent snapshot of the store at `path` (open in a running server or not) into
/// `to`, which must not exist, with `attachments`. Blocking.
pub fn backup(
    path: &Path,
    to: &Path,
    attachments: &[(String, Vec<u8>)],
) -> Result<Backup, StoreError> {
    if to.exists() {
        return Err(StoreError::Backend(format!(
            "{} exists; a backup is written to a new file",
            to.display()
        )));
    }
    let conn = open_ours(path)?;
    let Some(target) = to.to_str() else {
        return Err(StoreError::Backend(format!(
            "{}: the backup's path must be UTF-8",
            to.display()
        )));
    };
    conn.execute("VACUUM INTO ?1", [target])
        .map_err(backend("backing up", path))?;
    drop(conn);
    let mut copy = Connection::open(to).map_err(backend("writing the backup", to))?;
    let revision = revision_of(&copy).map_err(backend("reading the backup", to))?;
    let tx = copy
        .transaction()
        .map_err(backend("writing the backup", to))?;
    tx.execute_batch("CREATE TABLE attachments (name TEXT PRIMARY KEY, data BLOB NOT NULL)")
        .map_err(backend("writing the backup", to))?;
    for (name, data) in attachments {
        tx.execute(
            "INSERT INTO attachments (name, data) VALUES (?1, ?2)",
            rusqlite::params![name, data],
        )
        .map_err(backend("writing the backup", to))?;
    }
    tx.commit().map_err(backend("writing the backup", to))?;
    drop(copy);
    let f = std::fs::File::open(to)
        .map_err(|e| StoreError::Backend(format!("{}: {e}", to.display())))?;
    f.sync_all()
        .map_err(|e| StoreError::Backend(format!("syncing {}: {e}", to.display())))?;
    let bytes = f.metadata().map(|m| m.len()).unwrap_or(0);
    sync_dir(to)?;
    Ok(Backup { revision, bytes })
}

/// Makes the store file `to` (which must not exist) from the backup `from`, its revisions
/// moved on by `bump` and marked compacted there; returns the files kept with it. Blocking.
pub fn restore(
    from: &Path,
    to: &Path,
    bump: Revision,
) -> Result<(Restored, Attachments), StoreError> {
    let wal = {
        let mut n = to.as_os_str().to_owned();
        n.push("-wal");
        PathBuf::from(n)
    };
    if to.exists() || wal.exists() {
        return Err(StoreError::Backend(format!(
            "{} exists: a restore never overwrites a store (move it away first)",
            to.display()
        )));
    }
    let conn = open_ours(from)?;
    let problems: Vec<String> = conn
        .prepare("PRAGMA integrity_check")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .map_err(backend("checking", from))?;
    if problems != ["ok"] {
        let shown: Vec<_> = problems.iter().take(5).cloned().collect();
        return Err(StoreError::Corrupt(format!(
            "{} failed its integrity check: {}",
            from.display(),
            shown.join("; ")
        )));
    }
    let revision = revision_of(&conn).map_err(backend("reading", from))?;
    drop(conn);
    let mut part = to.as_os_str().to_owned();
    part.push(".restoring");
    let part = PathBuf::from(part);
    let _ = std::fs::remove_file(&part);
    std::fs::copy(from, &part).map_err(|e| {
        StoreError::Backend(format!(
            "copying {} to {}: {e}",
            from.display(),
            part.display()
        ))
    })?;
    let continues_at = revision.saturating_add(bump.max(0));
    let attachments = {
        let mut c = Connection::open(&part).map_err(backend("restoring", &part))?;
        let tx = c.transaction().map_err(backend("restoring", &part))?;
        let has: i64 = tx
            .query_row(
                "SELECT count(*) FROM sqlite_schema WHERE name = 'attachments'",
                [],
                |r| r.get(0),
            )
            .map_err(backend("restoring", &part))?;
        let mut attachments = Vec::new();
        if has > 0 {
            let mut st = tx
                .prepare("SELECT name, data FROM attachments ORDER BY name")
                .map_err(backend("restoring", &part))?;
            attachments = st
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
                .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
                .map_err(backend("restoring", &part))?;
            drop(st);
            tx.execute_batch("DROP TABLE attachments")
                .map_err(backend("restoring", &part))?;
        }
        for (name, value) in [("rev_floor", continues_at), ("compact_rev", continues_at)] {
            tx.execute(
                "UPDATE meta SET value = ?2 WHERE name = ?1",
                rusqlite::params![name, value],
            )
            .map_err(backend("restoring", &part))?;
        }
        tx.commit().map_err(backend("restoring", &part))?;
        attachments
    };
    std::fs::File::open(&part)
        .and_then(|f| f.sync_all())
        .map_err(|e| StoreError::Backend(format!("syncing {}: {e}", part.display())))?;
    std::fs::rename(&part, to).map_err(|e| {
        StoreError::Backend(format!(
            "renaming {} to {}: {e}",
            part.display(),
            to.display()
        ))
    })?;
    sync_dir(to)?;
    Ok((
        Restored {
            revision,
            continues_at,
        },
        attachments,
    ))
}
