//! One identity for every server replica of an installation on a shared store: the CA (its
//! certificate and key) and the admin token, kept in the store sealed with the cluster secret
//! ([`crate::seal`]). The first replica to start stores its own; the others adopt it, so one
//! kubeconfig and every agent's pinned CA work against any replica. Each replica still issues
//! its own serving certificate (its own addresses) from the shared CA.

use std::path::Path;

use orrery_api::Object;
use orrery_store::{Store, StoreError};
use serde::{Deserialize, Serialize};

use crate::seal::{SealError, Sealer};

/// Where the sealed identity lives (a key space the API does not serve).
pub const KEY: &str = "/internal/cluster/identity";
/// The sealing key's purpose (HKDF info).
pub const PURPOSE: &str = "orrery cluster identity v1";

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("the installation's identity in the store: {0}")]
    Seal(#[from] SealError),
    #[error("the installation's identity in the store: {0}")]
    Store(#[from] StoreError),
    #[error("the installation's identity in the store does not parse: {0}")]
    Format(String),
}

/// What the replicas share.
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Shared {
    pub ca_cert: String,
    pub ca_key: String,
    pub admin_token: String,
    /// The CA staged to replace `ca_cert` during a rotation ([`crate::ca`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_ca_cert: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_ca_key: Option<String>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

/// The stored identity, opened; `None` when no replica has stored one yet.
pub async fn load(store: &dyn Store, sealer: &Sealer) -> Result<Option<Shared>, IdentityError> {
    let obj = match store.get(KEY).await {
        Ok(o) => o,
        Err(StoreError::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let sealed = obj
        .other
        .get("sealed")
        .and_then(|v| v.as_str())
        .ok_or_else(|| IdentityError::Format("no sealed field".into()))?;
    let plain = sealer.open(sealed)?;
    let shared =
        serde_json::from_slice(&plain).map_err(|e| IdentityError::Format(e.to_string()))?;
    Ok(Some(shared))
}

/// Stores `shared` unless another replica stored one first: then that one is returned and
/// this replica must adopt it.
pub async fn publish(
    store: &dyn Store,
    sealer: &Sealer,
    shared: &Shared,
) -> Result<Option<Shared>, IdentityError> {
    let plain = serde_json::to_vec(shared).map_err(|e| IdentityError::Format(e.to_string()))?;
    let mut obj = Object::new("orrery.io/v1", "ClusterIdentity").with_name("identity");
    obj.other
        .insert("sealed".into(), serde_json::json!(sealer.seal(&plain)?));
    match store.create(KEY, obj).await {
        Ok(_) => {
            tracing::info!("stored the installation's identity for other replicas");
            Ok(None)
        }
        Err(StoreError::AlreadyExists { .. }) => load(store, sealer).await,
        Err(e) => Err(e.into()),
    }
}

/// Replaces the stored identity with `shared` (a CA rotation's step).
pub async fn replace(
    store: &dyn Store,
    sealer: &Sealer,
    shared: &Shared,
) -> Result<(), IdentityError> {
    let plain = serde_json::to_vec(shared).map_err(|e| IdentityError::Format(e.to_string()))?;
    let sealed = sealer.seal(&plain)?;
    orrery_store::update_with(store, KEY, |mut obj| {
        obj.other
            .insert("sealed".into(), serde_json::json!(sealed.clone()));
        Ok(Some(obj))
    })
    .await?;
    Ok(())
}

/// Makes `data_dir` hold the shared CA (and the one staged to replace it, or none).
pub fn adopt(data_dir: &Path, shared: &Shared) -> Result<bool, crate::pki::PkiError> {
    let staged = match (&shared.next_ca_cert, &shared.next_ca_key) {
        (Some(c), Some(k)) => Some((c.as_str(), k.as_str())),
        _ => None,
    };
    // In the order a switch on one replica writes its files, so that a crash in between
    // leaves what `pki::ensure` knows how to finish.
    let mut changed = false;
    if staged.is_some() {
        changed |= crate::pki::install_staged(data_dir, staged)?;
    }
    changed |= crate::pki::install_ca(data_dir, &shared.ca_cert, &shared.ca_key)?;
    if staged.is_none() {
        changed |= crate::pki::install_staged(data_dir, None)?;
    }
    Ok(changed)
}
