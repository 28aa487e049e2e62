//! What an agent remembers across restarts and outages, in one small JSON file under its state
//! directory: its cluster token and the server's CA (so a restart needs no bootstrap token),
//! the Works it last applied (so it keeps running them, and knows what to remove, while the
//! server is away), and where its watch left off.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One Work as last applied.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AppliedWork {
    pub uid: String,
    pub generation: i64,
    /// Digest of what was applied; an unchanged Work is not applied again.
    pub digest: String,
    pub manifests: Vec<Value>,
    #[serde(default)]
    pub preserve: bool,
    #[serde(default)]
    pub overwrite: bool,
    /// The volume transfers the Work asks for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub transfers: Vec<orrery_api::stateful::Transfer>,
    /// Manifests held back until a transfer's copy is in (`holdWorkload`); `manifests` is
    /// what the member has meanwhile.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentState {
    pub server: String,
    pub cluster: String,
    /// The cluster token from registration.
    #[serde(default)]
    pub token: String,
    #[serde(default)]
    pub ca_pem: String,
    #[serde(default)]
    pub works: BTreeMap<String, AppliedWork>,
    /// Objects Orrery removed from the member whose deletion has not succeeded yet (the
    /// member was unavailable): tried again until it does.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_deletes: Vec<PendingDelete>,
}

/// An object still to be deleted from the member, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingDelete {
    pub manifest: Value,
    pub work: String,
    pub uid: String,
    pub generation: i64,
    pub revision: String,
}

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("reading agent state {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("agent state {path} is corrupt ({source}); move it away to start afresh")]
    Corrupt {
        path: String,
        source: serde_json::Error,
    },
    #[error("writing agent state {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
}

/// The state file (or none, for agents that keep nothing).
#[derive(Debug, Clone)]
pub struct StateFile {
    path: Option<PathBuf>,
}

impl StateFile {
    pub fn at(dir: &Path) -> Self {
        StateFile {
            path: Some(dir.join("state.json")),
        }
    }

    pub fn none() -> Self {
        StateFile { path: None }
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The stored state, or an empty one if there is none yet.
    pub fn load(&self) -> Result<AgentState, StateError> {
        let Some(path) = &self.path else {
            return Ok(AgentState::default());
        };
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|source| StateError::Corrupt {
                path: path.display().to_string(),
                source,
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(AgentState::default()),
            Err(source) => Err(StateError::Read {
                path: path.display().to_string(),
                source,
            }),
        }
    }

    /// Writes the state atomically (a temporary file renamed over the old one), readable by
    /// its owner only: it holds a credential.
    pub fn save(&self, state: &AgentState) -> Result<(), StateError> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let err = |source| StateError::Write {
            path: path.display().to_string(),
            source,
        };
        if let Some(dir) = path.parent() {
            // It holds the cluster's token: the owner's alone.
            let mut b = std::fs::DirBuilder::new();
            b.recursive(true);
            #[cfg(unix)]
            {
                use std::os::unix::fs::DirBuilderExt;
                b.mode(0o700);
            }
            b.create(dir).map_err(err)?;
        }
        let tmp = path.with_extension("json.tmp");
        let bytes = serde_json::to_vec(state).map_err(|e| err(std::io::Error::other(e)))?;
        {
            let mut opts = std::fs::OpenOptions::new();
            opts.write(true).create(true).truncate(true);
            #[cfg(unix)]
            {
                use std::os::unix::fs::OpenOptionsExt;
                opts.mode(0o600);
            }
            let mut f = opts.open(&tmp).map_err(err)?;
            f.write_all(&bytes).map_err(err)?;
            f.sync_all().map_err(err)?;
        }
        std::fs::rename(&tmp, path).map_err(err)
    }

    /// Removes the state (the cluster was unregistered).
    pub fn remove(&self) {
        if let Some(p) = &self.path {
            let _ = std::fs::remove_file(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let f = StateFile::at(dir.path());
        assert_eq!(f.load().unwrap(), AgentState::default());
        let mut s = AgentState {
            server: "https://x".into(),
            cluster: "east".into(),
            token: "a.b".into(),
            ..Default::default()
        };
        s.works.insert(
            "w".into(),
            AppliedWork {
                uid: "u".into(),
                digest: "d".into(),
                manifests: vec![serde_json::json!({"kind": "ConfigMap"})],
                ..Default::default()
            },
        );
        f.save(&s).unwrap();
        assert_eq!(f.load().unwrap(), s);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(f.path().unwrap())
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        std::fs::write(f.path().unwrap(), b"{not json").unwrap();
        assert!(matches!(f.load(), Err(StateError::Corrupt { .. })));
        f.remove();
        assert_eq!(f.load().unwrap(), AgentState::default());
        assert_eq!(StateFile::none().load().unwrap(), AgentState::default());
        StateFile::none().save(&s).unwrap();
    }
}
