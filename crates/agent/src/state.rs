//! What an agent remembers across restarts and outages, in one small JSON document (a file
//! under its state directory, or a Secret in its member): its cluster token and the server's CA (so a restart needs no bootstrap token),
//! the Works it last applied (so it keeps running them, and knows what to remove, while the
//! server is away), and where its watch left off.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Secret;
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
    /// The Work's Retain scripts, for applying it again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retention: Vec<orrery_api::work::Retention>,
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
    /// When the cluster token was issued and when it expires (the server's
    /// `--cluster-token-ttl`): it is renewed a third of its life ahead. None: it does not
    /// expire.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_issued: Option<orrery_api::Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_expires: Option<orrery_api::Time>,
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

/// Where the state is kept: a file, a Secret in the member (an agent run as a Deployment
/// needs no volume), or nowhere (agents that keep nothing).
#[derive(Clone)]
pub struct StateFile {
    at: Where,
}

#[derive(Clone)]
enum Where {
    None,
    File(PathBuf),
    // Boxed: an Api holds a whole client.
    Secret(Box<SecretAt>),
}

#[derive(Clone)]
struct SecretAt {
    api: kube::Api<Secret>,
    namespace: String,
    name: String,
}

impl std::fmt::Debug for StateFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

/// The key of the state in a state Secret's data.
const SECRET_KEY: &str = "state.json";

impl StateFile {
    pub fn at(dir: &Path) -> Self {
        StateFile {
            at: Where::File(dir.join("state.json")),
        }
    }

    /// The state in the Secret `namespace`/`name` of the member `client` reaches (made on the
    /// first save).
    pub fn secret(client: kube::Client, namespace: &str, name: &str) -> Self {
        StateFile {
            at: Where::Secret(Box::new(SecretAt {
                api: kube::Api::namespaced(client, namespace),
                namespace: namespace.to_string(),
                name: name.to_string(),
            })),
        }
    }

    pub fn none() -> Self {
        StateFile { at: Where::None }
    }

    /// The file, when the state is kept in one.
    pub fn path(&self) -> Option<&Path> {
        match &self.at {
            Where::File(p) => Some(p),
            _ => None,
        }
    }

    /// Where the state is, for messages.
    pub fn describe(&self) -> String {
        match &self.at {
            Where::None => "nowhere".into(),
            Where::File(p) => p.display().to_string(),
            Where::Secret(at) => format!("Secret {}/{}", at.namespace, at.name),
        }
    }

    /// The stored state, or an empty one if there is none yet.
    pub async fn load(&self) -> Result<AgentState, StateError> {
        let path = self.describe();
        let bytes = match &self.at {
            Where::None => return Ok(AgentState::default()),
            Where::File(p) => match std::fs::read(p) {
                Ok(bytes) => bytes,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Ok(AgentState::default());
                }
                Err(source) => return Err(StateError::Read { path, source }),
            },
            Where::Secret(at) => match at.api.get_opt(&at.name).await {
                Ok(None) => return Ok(AgentState::default()),
                Ok(Some(secret)) => match secret.data.and_then(|mut d| d.remove(SECRET_KEY)) {
                    Some(b) => b.0,
                    None => return Ok(AgentState::default()),
                },
                Err(e) => {
                    return Err(StateError::Read {
                        path,
                        source: std::io::Error::other(e),
                    });
                }
            },
        };
        serde_json::from_slice(&bytes).map_err(|source| StateError::Corrupt { path, source })
    }

    /// Writes the state: a file atomically (a temporary file renamed over the old one),
    /// readable by its owner only, for it holds a credential; a Secret by server-side apply.
    pub async fn save(&self, state: &AgentState) -> Result<(), StateError> {
        let err = |source| StateError::Write {
            path: self.describe(),
            source,
        };
        let bytes = serde_json::to_vec(state).map_err(|e| err(std::io::Error::other(e)))?;
        match &self.at {
            Where::None => Ok(()),
            Where::File(path) => save_file(path, &bytes).map_err(err),
            Where::Secret(at) => {
                let (api, namespace, name) = (&at.api, &at.namespace, &at.name);
                let secret = serde_json::json!({
                    "apiVersion": "v1", "kind": "Secret",
                    "metadata": {"name": name, "namespace": namespace,
                        "labels": {"app.kubernetes.io/managed-by": "orrery-agent"}},
                    "type": "Opaque",
                    "data": {SECRET_KEY: base64_encode(&bytes)},
                });
                let params = kube::api::PatchParams::apply("orrery-agent").force();
                api.patch(name, &params, &kube::api::Patch::Apply(&secret))
                    .await
                    .map(|_| ())
                    .map_err(|e| err(std::io::Error::other(e)))
            }
        }
    }

    /// Removes the state (the cluster was unregistered).
    pub async fn remove(&self) {
        match &self.at {
            Where::None => {}
            Where::File(p) => {
                let _ = std::fs::remove_file(p);
            }
            Where::Secret(at) => {
                if let Err(e) = at.api.delete(&at.name, &Default::default()).await {
                    tracing::warn!(secret = %self.describe(), error = %e, "removing the agent's state failed");
                }
            }
        }
    }
}

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn save_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        // It holds the cluster's token: the owner's alone.
        let mut b = std::fs::DirBuilder::new();
        b.recursive(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::DirBuilderExt;
            b.mode(0o700);
        }
        b.create(dir)?;
    }
    let tmp = path.with_extension("json.tmp");
    {
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        let mut f = opts.open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn round_trip_and_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let f = StateFile::at(dir.path());
        assert_eq!(f.load().await.unwrap(), AgentState::default());
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
        f.save(&s).await.unwrap();
        assert_eq!(f.load().await.unwrap(), s);
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
        assert!(matches!(f.load().await, Err(StateError::Corrupt { .. })));
        f.remove().await;
        assert_eq!(f.load().await.unwrap(), AgentState::default());
        assert_eq!(
            StateFile::none().load().await.unwrap(),
            AgentState::default()
        );
        StateFile::none().save(&s).await.unwrap();
    }
}
