//! `orrery backup` and `orrery restore`: a consistent snapshot of a running server's store,
//! and a store a server starts from (docs/operating.md, "Backups").
//!
//! - SQLite: the store file copied in one read transaction while the server writes, with the
//!   certificate authority (`tls/ca.crt`, `tls/ca.key`, which agents trust) kept in the same
//!   file; restored into a data directory with no store, its revisions moved past any the old
//!   server gave out (clients list again instead of resuming a watch across the restore).
//! - etcd: etcd's own snapshot through its Maintenance API; `etcdutl snapshot restore` (or
//!   etcdctl's) makes an etcd data directory from it.

use std::path::PathBuf;

use anyhow::{Context, bail};

use crate::server::StoreKind;

/// Revisions a restored SQLite store moves on by: more writes than a server makes between a
/// backup and its restore, so no resourceVersion names two versions (etcd's advice for
/// Kubernetes is the same figure).
const DEFAULT_BUMP: i64 = 1_000_000_000;

/// The CA's files, kept with a SQLite backup.
const CA_FILES: [&str; 2] = ["tls/ca.crt", "tls/ca.key"];

#[derive(clap::Args, Debug)]
pub struct BackupArgs {
    /// The file to write; it must not exist. It holds every object, Secrets and the CA's key
    /// included: keep it as safely as those.
    #[arg(long)]
    pub to: PathBuf,
    /// Storage backend of the server backed up.
    #[arg(long, value_enum, default_value = "sqlite")]
    pub store: StoreKind,
    /// The server's data directory (SQLite): read while the server runs.
    #[arg(long, default_value = "./orrery-data", env = "ORRERY_DATA_DIR")]
    pub data_dir: PathBuf,
    /// etcd endpoints (comma-separated URLs), with --store etcd: the snapshot comes from the
    /// first that answers.
    #[arg(long, value_delimiter = ',', default_value = "http://127.0.0.1:2379")]
    pub etcd_endpoints: Vec<String>,
}

#[derive(clap::Args, Debug)]
pub struct RestoreArgs {
    /// A backup made by `orrery backup` of a SQLite store.
    #[arg(long)]
    pub from: PathBuf,
    /// The data directory to make; it must hold no store.
    #[arg(long)]
    pub data_dir: PathBuf,
    /// How far the restored store's revisions move on past the backup's.
    #[arg(long, default_value_t = DEFAULT_BUMP)]
    pub bump_revision: i64,
}

pub async fn backup(args: BackupArgs) -> anyhow::Result<()> {
    match args.store {
        StoreKind::Sqlite => {
            let db = args.data_dir.join("orrery.db");
            let mut kept = Vec::new();
            for name in CA_FILES {
                let path = args.data_dir.join(name);
                match std::fs::read(&path) {
                    Ok(data) => kept.push((name.to_string(), data)),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
                }
            }
            let to = args.to.clone();
            let b =
                tokio::task::spawn_blocking(move || orrery_store_sqlite::backup(&db, &to, &kept))
                    .await?
                    .with_context(|| format!("backing up {}", args.data_dir.display()))?;
            restrict(&args.to)?;
            println!(
                "orrery backup: {} ({} bytes) holds the store at revision {} and its certificate authority",
                args.to.display(),
                b.bytes,
                b.revision
            );
        }
        StoreKind::Etcd => {
            let mut last = None;
            for e in &args.etcd_endpoints {
                match orrery_store_etcd::snapshot(e, &args.to).await {
                    Ok(s) => {
                        restrict(&args.to)?;
                        println!(
                            "orrery backup: {} ({} bytes) is etcd {}'s snapshot at revision {}; \
                             `etcdutl snapshot restore` makes an etcd data directory from it",
                            args.to.display(),
                            s.bytes,
                            s.etcd_version,
                            s.revision
                        );
                        return Ok(());
                    }
                    Err(err) => {
                        tracing::warn!(endpoint = %e, error = %err, "no snapshot from this member");
                        last = Some(err);
                    }
                }
            }
            match last {
                Some(e) => return Err(e).context("taking an etcd snapshot"),
                None => bail!("no etcd endpoint given"),
            }
        }
    }
    Ok(())
}

/// The backup is readable by its owner only (it holds Secrets and the CA's key).
fn restrict(path: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("restricting {}", path.display()))
}

pub async fn restore(args: RestoreArgs) -> anyhow::Result<()> {
    let head = std::fs::read(&args.from)
        .map(|b| b.into_iter().take(16).collect::<Vec<u8>>())
        .with_context(|| format!("reading {}", args.from.display()))?;
    if !head.starts_with(b"SQLite format 3\0") {
        bail!(
            "{} is not a backup of a SQLite store; an etcd snapshot is restored with \
             `etcdutl snapshot restore {} --data-dir DIR --bump-revision 1000000000 --mark-compacted` \
             and etcd started on DIR (docs/operating.md)",
            args.from.display(),
            args.from.display()
        );
    }
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("creating {}", args.data_dir.display()))?;
    let tls = args.data_dir.join("tls");
    if tls.join("ca.key").exists() {
        bail!(
            "{} already holds a certificate authority: restore into a new data directory",
            args.data_dir.display()
        );
    }
    let (from, to, bump) = (
        args.from.clone(),
        args.data_dir.join("orrery.db"),
        args.bump_revision,
    );
    let (r, kept) =
        tokio::task::spawn_blocking(move || orrery_store_sqlite::restore(&from, &to, bump))
            .await?
            .with_context(|| format!("restoring {}", args.from.display()))?;
    let file = |name: &str| {
        kept.iter()
            .find(|(n, _)| n == name)
            .map(|(_, d)| String::from_utf8_lossy(d).into_owned())
    };
    let ca = match (file(CA_FILES[0]), file(CA_FILES[1])) {
        (Some(crt), Some(key)) => {
            orrery_apiserver::pki::install_ca(&args.data_dir, &crt, &key)
                .context("installing the certificate authority")?;
            "and its certificate authority"
        }
        _ => {
            "(it held no certificate authority: the server makes a new one, which agents do not trust)"
        }
    };
    println!(
        "orrery restore: {} holds the store at revision {} {ca}; it continues at revision {}. \
         Start the server on it (`orrery server --data-dir {}`)",
        args.data_dir.display(),
        r.revision,
        r.continues_at,
        args.data_dir.display()
    );
    Ok(())
}
