//! `orrery scrub`: removes from a stopped server's SQLite store everything that is no longer
//! current (superseded versions, deleted objects, freed pages, the WAL's old frames), so that
//! what was overwritten cannot be read from the files: the last step of turning encryption at
//! rest on (docs/security.md).

use std::path::PathBuf;

use anyhow::Context;

#[derive(clap::Args, Debug)]
pub struct ScrubArgs {
    /// The server's data directory (the server must be stopped).
    #[arg(long, default_value = "./orrery-data", env = "ORRERY_DATA_DIR")]
    pub data_dir: PathBuf,
}

pub async fn run(args: ScrubArgs) -> anyhow::Result<()> {
    let path = args.data_dir.join("orrery.db");
    let done = orrery_store_sqlite::scrub(&path)
        .await
        .with_context(|| format!("scrubbing {}", path.display()))?;
    println!(
        "scrubbed {}: history compacted to revision {}, the file rewritten ({} bytes before, {} after)",
        path.display(),
        done.revision,
        done.bytes_before,
        done.bytes_after
    );
    Ok(())
}
