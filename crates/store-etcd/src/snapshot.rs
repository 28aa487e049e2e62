//! Backups of an etcd-backed store: etcd's own snapshot of its whole keyspace, taken from one
//! member through the Maintenance API while it serves, the file `etcdutl snapshot restore`
//! (or etcdctl's, before 3.5) makes a new etcd data directory from.

use std::io::Write;
use std::path::{Path, PathBuf};

use orrery_store::{Revision, StoreError};

use crate::rpc::etcdserverpb::SnapshotRequest;
use crate::rpc::etcdserverpb::maintenance_client::MaintenanceClient;

/// What a snapshot holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// The revision of the snapshot (its stream's first header).
    pub revision: Revision,
    pub bytes: u64,
    /// The member's etcd version, which restores it.
    pub etcd_version: String,
}

fn backend(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(e.to_string())
}

/// Streams a snapshot from the member at `endpoint` into `to`, which must not exist (written
/// next to it and renamed once complete and synced).
pub async fn snapshot(endpoint: &str, to: &Path) -> Result<Snapshot, StoreError> {
    if to.exists() {
        return Err(backend(format!(
            "{} exists; a backup is written to a new file",
            to.display()
        )));
    }
    let url = if endpoint.contains("://") {
        endpoint.to_string()
    } else {
        format!("http://{endpoint}")
    };
    let channel = tonic::transport::Endpoint::from_shared(url.clone())
        .map_err(|e| backend(format!("{url}: {e}")))?
        .connect_timeout(std::time::Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| StoreError::Unavailable(format!("connecting to etcd at {url}: {e}")))?;
    let mut client = MaintenanceClient::new(channel);
    let mut stream = client
        .snapshot(SnapshotRequest {})
        .await
        .map_err(|e| StoreError::Unavailable(format!("etcd at {url}: {}", e.message())))?
        .into_inner();
    let mut part = to.as_os_str().to_owned();
    part.push(".part");
    let part = PathBuf::from(part);
    let mut file = std::fs::File::create(&part)
        .map_err(|e| backend(format!("creating {}: {e}", part.display())))?;
    let mut out = Snapshot {
        revision: 0,
        bytes: 0,
        etcd_version: String::new(),
    };
    let mut first = true;
    let streamed = async {
        while let Some(msg) = stream
            .message()
            .await
            .map_err(|e| StoreError::Unavailable(format!("etcd snapshot: {}", e.message())))?
        {
            if first {
                out.revision = crate::client::revision(msg.header.as_ref());
                first = false;
            }
            if !msg.version.is_empty() {
                out.etcd_version = msg.version.clone();
            }
            file.write_all(&msg.blob)
                .map_err(|e| backend(format!("writing {}: {e}", part.display())))?;
            out.bytes += msg.blob.len() as u64;
        }
        file.sync_all()
            .map_err(|e| backend(format!("syncing {}: {e}", part.display())))?;
        Ok::<(), StoreError>(())
    };
    if let Err(e) = streamed.await {
        let _ = std::fs::remove_file(&part);
        return Err(e);
    }
    if out.bytes == 0 {
        let _ = std::fs::remove_file(&part);
        return Err(StoreError::Unavailable(format!(
            "etcd at {url} sent an empty snapshot"
        )));
    }
    std::fs::rename(&part, to)
        .map_err(|e| backend(format!("renaming to {}: {e}", to.display())))?;
    let dir = to
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(out)
}
