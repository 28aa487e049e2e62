//! The installation's certificate authority, live: the CA that signs (the serving
//! certificate, users' and replicas' client certificates), the one staged to replace it
//! during a rotation, and the TLS configuration made of them, replaced in place as they
//! change (the next handshake has it; connections already made keep theirs).
//!
//! A rotation takes two steps, each a request to a running server (`orrery ca stage`,
//! `orrery ca switch`):
//!
//! ```text
//!   signing A ───stage───▶ signing A, staged B ───switch───▶ signing B
//!   trusted {A}            trusted {A, B}                    trusted {B}
//! ```
//!
//! - **stage**: a new CA B is made. `/cacerts` and the admin kubeconfig hand out A+B, client
//!   certificates signed by either are accepted, the serving certificate is still A's. Agents
//!   fetch the bundle every `--ca-refresh-interval` over their verified connection and report
//!   its hash in their Cluster's `status.caBundleHash`.
//! - **switch**: refused while a cluster's agent does not trust A+B (unless forced); B signs
//!   the serving certificate (issued again at once) and whatever is issued from then on; A is
//!   trusted no more. Agents holding A+B keep their sessions and learn {B} at their next
//!   refresh; bootstrap tokens minted before the switch pin a CA that is gone.
//!
//! Where it is kept: `DATA_DIR/tls/` ([`crate::pki`]); on a shared store (HA) the
//! installation's identity ([`crate::identity`]) holds both CAs, the replica asked changes it,
//! and every replica adopts it at its next [`Authority::refresh`].
//!
//! Invariants: the serving certificate is always signed by the signing CA, and what is
//! trusted always includes the signing CA; a switch a crash interrupts is finished at the next
//! start; nothing here touches a member.

use parking_lot::RwLock;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use orrery_store::Store;

use crate::identity::{self, IdentityError, Shared};
use crate::pki::{self, Pki, PkiError, ServingCert, UserIssuer};
use crate::seal::Sealer;

#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error(transparent)]
    Pki(#[from] PkiError),
    #[error(transparent)]
    Identity(#[from] IdentityError),
    #[error("the TLS configuration: {0}")]
    Tls(String),
    #[error("the CA key: {0}")]
    Key(#[from] rcgen::Error),
    #[error("no CA is staged: run `orrery ca stage` first")]
    NothingStaged,
    #[error("the installation's identity is not in the store")]
    NoIdentity,
    #[error("{0}")]
    Blocking(String),
}

/// What the CA is now.
#[derive(Debug)]
pub struct Current {
    /// Bumped by every change of what is trusted or served.
    pub generation: u64,
    /// The CA staged to replace it (PEM), during a rotation.
    pub staged: Option<String>,
    /// What clients are to trust: the signing CA, then the staged one. Served at `/cacerts`.
    pub bundle: String,
    /// The serving certificate and its CA.
    pub serving: Pki,
    pub issuer: Arc<UserIssuer>,
}

impl Current {
    /// The CA that signs (PEM): the serving certificate's.
    pub fn signing(&self) -> &str {
        &self.serving.ca_pem
    }

    /// The hash agents report once they trust [`Current::bundle`].
    pub fn bundle_hash(&self) -> String {
        orrery_api::token::ca_hash(&self.bundle)
    }
}

/// The installation's CA on one replica.
pub struct Authority {
    data_dir: PathBuf,
    sans: Vec<String>,
    validity: Duration,
    shared: Option<(Arc<dyn Store>, Arc<Sealer>)>,
    current: RwLock<Arc<Current>>,
    serving: Arc<ServingCert>,
    tls: RwLock<Arc<rustls::ServerConfig>>,
    changed: tokio::sync::watch::Sender<u64>,
    /// One change at a time (a stage racing a refresh would install a stale identity).
    changing: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority")
            .field("data_dir", &self.data_dir)
            .finish_non_exhaustive()
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, CaError> + Send + 'static,
) -> Result<T, CaError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| CaError::Blocking(e.to_string()))?
}

/// Reads what `data_dir` holds, issuing the serving certificate anew where it is due.
fn read(
    data_dir: &Path,
    sans: &[String],
    validity: Duration,
) -> Result<(Pki, Option<String>, Arc<UserIssuer>), CaError> {
    let serving = pki::ensure_valid_for(data_dir, sans, validity)?;
    let staged = pki::read_staged(data_dir)?.map(|(crt, _)| crt);
    let (_, key) = pki::read_ca(data_dir)?;
    Ok((serving, staged, Arc::new(UserIssuer::new(&key)?)))
}

impl Authority {
    /// The CA as `data_dir` holds it (made there if it holds none; on a shared store, the
    /// caller has installed the installation's identity first).
    pub async fn open(
        data_dir: PathBuf,
        sans: Vec<String>,
        validity: Duration,
        shared: Option<(Arc<dyn Store>, Arc<Sealer>)>,
    ) -> Result<Arc<Authority>, CaError> {
        let (dir, names) = (data_dir.clone(), sans.clone());
        let (serving, staged, issuer) = blocking(move || read(&dir, &names, validity)).await?;
        let current = current(0, serving, staged, issuer);
        let cert = Arc::new(ServingCert::new(&current.serving).map_err(CaError::Tls)?);
        let tls = pki::server_config(&current.bundle, cert.clone()).map_err(CaError::Tls)?;
        Ok(Arc::new(Authority {
            data_dir,
            sans,
            validity,
            shared,
            current: RwLock::new(Arc::new(current)),
            serving: cert,
            tls: RwLock::new(Arc::new(tls)),
            changed: tokio::sync::watch::channel(0).0,
            changing: tokio::sync::Mutex::new(()),
        }))
    }

    pub fn current(&self) -> Arc<Current> {
        self.current.read().clone()
    }

    /// The TLS configuration for the next handshake.
    pub fn tls(&self) -> Arc<rustls::ServerConfig> {
        self.tls.read().clone()
    }

    /// Wakes on every change (its value is the generation).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Stages a new CA (the first step of a rotation); a CA already staged is kept. Returns
    /// whether one was made.
    pub async fn stage(&self) -> Result<bool, CaError> {
        let _one = self.changing.lock().await;
        let made = match &self.shared {
            Some((store, sealer)) => {
                let mut id = identity::load(&**store, sealer)
                    .await?
                    .ok_or(CaError::NoIdentity)?;
                let made = id.next_ca_cert.is_none();
                if made {
                    let (crt, key) = blocking(|| Ok(pki::generate_ca()?)).await?;
                    id.next_ca_cert = Some(crt);
                    id.next_ca_key = Some(key);
                    identity::replace(&**store, sealer, &id).await?;
                }
                self.install(id).await?;
                made
            }
            None => {
                let dir = self.data_dir.clone();
                blocking(move || {
                    if pki::read_staged(&dir)?.is_some() {
                        return Ok(false);
                    }
                    let (crt, key) = pki::generate_ca()?;
                    pki::install_staged(&dir, Some((&crt, &key)))?;
                    Ok(true)
                })
                .await?
            }
        };
        if made {
            tracing::info!(
                "staged a new certificate authority: trusted beside the current one, not signing yet"
            );
        }
        self.reload().await?;
        Ok(made)
    }

    /// Makes the staged CA the signing one (the second step). The caller has checked that
    /// the clients that matter trust it.
    pub async fn switch(&self) -> Result<(), CaError> {
        let _one = self.changing.lock().await;
        match &self.shared {
            Some((store, sealer)) => {
                let mut id = identity::load(&**store, sealer)
                    .await?
                    .ok_or(CaError::NoIdentity)?;
                let (Some(crt), Some(key)) = (id.next_ca_cert.take(), id.next_ca_key.take()) else {
                    return Err(CaError::NothingStaged);
                };
                id.ca_cert = crt;
                id.ca_key = key;
                identity::replace(&**store, sealer, &id).await?;
                self.install(id).await?;
            }
            None => {
                let dir = self.data_dir.clone();
                if !blocking(move || Ok(pki::switch_to_staged(&dir)?)).await? {
                    return Err(CaError::NothingStaged);
                }
            }
        }
        self.reload().await?;
        tracing::info!("switched to the staged certificate authority");
        Ok(())
    }

    /// Adopts what another replica changed (on a shared store) and renews the serving
    /// certificate when it is due; called periodically.
    pub async fn refresh(&self) -> Result<(), CaError> {
        let _one = self.changing.lock().await;
        if let Some((store, sealer)) = &self.shared
            && let Some(id) = identity::load(&**store, sealer).await?
        {
            self.install(id).await?;
        }
        self.reload().await
    }

    async fn install(&self, id: Shared) -> Result<(), CaError> {
        let dir = self.data_dir.clone();
        blocking(move || {
            if identity::adopt(&dir, &id)? {
                tracing::info!("adopted the installation's certificate authority");
            }
            Ok(())
        })
        .await
    }

    /// Reads the files again and serves what changed.
    async fn reload(&self) -> Result<(), CaError> {
        let (dir, names, validity) = (self.data_dir.clone(), self.sans.clone(), self.validity);
        let (serving, staged, issuer) = blocking(move || read(&dir, &names, validity)).await?;
        let old = self.current();
        let cert_changed = serving.cert_pem != old.serving.cert_pem;
        let trust_changed = serving.ca_pem != old.signing() || staged != old.staged;
        if !cert_changed && !trust_changed {
            return Ok(());
        }
        let next = current(old.generation + 1, serving, staged, issuer);
        if cert_changed {
            self.serving.set(&next.serving).map_err(CaError::Tls)?;
            if old.signing() != next.signing() {
                tracing::info!("serving a certificate issued by the CA that signs now");
            } else {
                tracing::info!("renewed the serving certificate");
            }
        }
        if trust_changed {
            let tls =
                pki::server_config(&next.bundle, self.serving.clone()).map_err(CaError::Tls)?;
            *self.tls.write() = Arc::new(tls);
        }
        let generation = next.generation;
        *self.current.write() = Arc::new(next);
        self.changed.send_replace(generation);
        Ok(())
    }
}

fn current(
    generation: u64,
    serving: Pki,
    staged: Option<String>,
    issuer: Arc<UserIssuer>,
) -> Current {
    let bundle = match &staged {
        Some(s) => format!("{}{}", serving.ca_pem, s),
        None => serving.ca_pem.clone(),
    };
    Current {
        generation,
        staged,
        bundle,
        serving,
        issuer,
    }
}

/// Renews and adopts every `every` until `shutdown`: the serving certificate before it
/// expires, and what another replica changed of the CA.
pub async fn keep_fresh(
    authority: Arc<Authority>,
    every: Duration,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.changed() => return,
        }
        if let Err(e) = authority.refresh().await {
            tracing::warn!(error = %e, "refreshing the certificate authority and serving certificate; retrying");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn open(dir: &tempfile::TempDir) -> Arc<Authority> {
        let sans = vec!["localhost".into(), "127.0.0.1".into()];
        Authority::open(dir.path().into(), sans, pki::DEFAULT_SERVING_VALIDITY, None)
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn stage_then_switch_trusts_both_then_the_new_one() {
        let dir = tempfile::tempdir().unwrap();
        let ca = open(&dir).await;
        let a = ca.current();
        assert_eq!(a.bundle, a.signing());
        let mut changes = ca.subscribe();

        assert!(ca.stage().await.unwrap());
        assert!(!ca.stage().await.unwrap(), "a staged CA is kept");
        let staged = ca.current();
        let b = staged.staged.clone().unwrap();
        assert_eq!(staged.signing(), a.signing(), "still signing with A");
        assert_eq!(staged.bundle, format!("{}{b}", a.signing()));
        assert_eq!(
            staged.serving.cert_pem, a.serving.cert_pem,
            "the serving certificate stays"
        );
        assert!(changes.has_changed().unwrap());
        changes.mark_unchanged();

        ca.switch().await.unwrap();
        let switched = ca.current();
        assert_eq!(switched.signing(), b);
        assert_eq!(switched.bundle, b, "A is trusted no more");
        assert_ne!(switched.serving.cert_pem, a.serving.cert_pem, "issued by B");
        assert!(changes.has_changed().unwrap());
        assert!(matches!(ca.switch().await, Err(CaError::NothingStaged)));

        // A restart reads the same.
        let again = open(&dir).await;
        assert_eq!(again.current().bundle, b);
        assert_eq!(again.current().serving.cert_pem, switched.serving.cert_pem);
    }

    /// A crash after the signing key was replaced but before its certificate was: the next
    /// start finishes the switch, and the serving certificate is B's.
    #[tokio::test]
    async fn a_switch_a_crash_interrupted_is_finished_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let ca = open(&dir).await;
        let a_serving = ca.current().serving.cert_pem.clone();
        ca.stage().await.unwrap();
        let b = ca.current().staged.clone().unwrap();
        let tls = dir.path().join("tls");
        std::fs::copy(tls.join("ca-next.key"), tls.join("ca.key")).unwrap();
        drop(ca);
        let ca = open(&dir).await;
        let now = ca.current();
        assert_eq!(now.signing(), b);
        assert_eq!(now.staged, None);
        assert_ne!(now.serving.cert_pem, a_serving, "issued again, by B");
        assert!(!tls.join("ca-next.crt").exists() && !tls.join("ca-next.key").exists());
    }
}
