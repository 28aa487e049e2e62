//! The server's identity: a CA, a serving certificate signed by it, and the admin kubeconfig.
//! Created on first start under `DATA_DIR/tls/`, reused afterwards; the serving certificate is
//! re-issued when the requested names change, it nears expiry, or another CA signs now.
//!
//! Files: `ca.crt`/`ca.key` (the CA that signs), `ca-next.crt`/`ca-next.key` (the CA staged
//! to replace it during a rotation, see [`crate::ca`]), `server.crt`/`server.key`/`server.json`.

use std::io::Write;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("certificate generation failed: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("{path} is not a valid PEM file: {reason}")]
    Pem { path: PathBuf, reason: String },
}

/// The PEM material the server serves with.
#[derive(Clone, Debug)]
pub struct Pki {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
    /// SHA-256 of the CA certificate (DER), hex: what bootstrap tokens pin.
    pub ca_hash: String,
}

#[derive(Serialize, Deserialize, PartialEq, Eq, Debug)]
#[serde(rename_all = "camelCase")]
struct ServingInfo {
    sans: Vec<String>,
    not_after: i64,
    /// The hash of the CA that signed it; absent in certificates issued before CA rotation
    /// existed (their CA could not change without them being removed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ca: Option<String>,
}

/// How long a serving certificate is valid by default.
pub const DEFAULT_SERVING_VALIDITY: std::time::Duration =
    std::time::Duration::from_secs(365 * 86400);

/// A serving certificate is issued again once less than this is left of its validity: a
/// third of it, at most 30 days.
pub fn renew_before(validity: std::time::Duration) -> i64 {
    (validity.as_secs() as i64 / 3).min(30 * 86400)
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> PkiError + '_ {
    move |source| PkiError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes a file readable only by its owner.
fn write_private(path: &Path, contents: &str) -> Result<(), PkiError> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io(path))?;
    f.write_all(contents.as_bytes()).map_err(io(path))?;
    f.sync_all().map_err(io(path))
}

/// Writes a file readable only by its owner in one step: a crash leaves the old contents or
/// the new, never a mix.
fn write_atomic(path: &Path, contents: &str) -> Result<(), PkiError> {
    let tmp = path.with_extension("tmp");
    write_private(&tmp, contents)?;
    std::fs::rename(&tmp, path).map_err(io(path))?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io(dir))?;
    }
    Ok(())
}

fn remove_if_there(path: &Path) -> Result<(), PkiError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(PkiError::Io {
            path: path.to_path_buf(),
            source: e,
        }),
    }
}

/// A new self-signed CA: (certificate PEM, key PEM).
pub fn generate_ca() -> Result<(String, String), PkiError> {
    let key = KeyPair::generate()?;
    let mut params = ca_params();
    params.not_before = rcgen::date_time_ymd(2024, 1, 1);
    params.not_after = rcgen::date_time_ymd(2124, 1, 1);
    let cert = params.self_signed(&key)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// The CA staged to replace the signing one, if a rotation is under way: (certificate PEM,
/// key PEM).
pub fn read_staged(data_dir: &Path) -> Result<Option<(String, String)>, PkiError> {
    let dir = data_dir.join("tls");
    let (crt, key) = (dir.join("ca-next.crt"), dir.join("ca-next.key"));
    if !crt.exists() || !key.exists() {
        return Ok(None);
    }
    Ok(Some((
        std::fs::read_to_string(&crt).map_err(io(&crt))?,
        std::fs::read_to_string(&key).map_err(io(&key))?,
    )))
}

/// Makes `data_dir` hold `staged` as the CA staged to replace the signing one (or none).
/// Returns whether anything changed.
pub fn install_staged(data_dir: &Path, staged: Option<(&str, &str)>) -> Result<bool, PkiError> {
    let dir = data_dir.join("tls");
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    let now = read_staged(data_dir)?;
    if now.as_ref().map(|(c, k)| (c.as_str(), k.as_str())) == staged {
        return Ok(false);
    }
    match staged {
        Some((crt, key)) => {
            KeyPair::from_pem(key).map_err(|e| PkiError::Pem {
                path: dir.join("ca-next.key"),
                reason: e.to_string(),
            })?;
            // The key first: a certificate without its key is not a staged CA (read_staged).
            write_atomic(&dir.join("ca-next.key"), key)?;
            write_atomic(&dir.join("ca-next.crt"), crt)?;
        }
        None => {
            remove_if_there(&dir.join("ca-next.crt"))?;
            remove_if_there(&dir.join("ca-next.key"))?;
        }
    }
    Ok(true)
}

/// The switch of a rotation: the staged CA becomes the signing one and the old one is
/// dropped. Crash-safe: the staged files go only once both signing files hold the new CA, and
/// [`recover`] finishes a switch a crash interrupted. Returns false when nothing was staged.
pub fn switch_to_staged(data_dir: &Path) -> Result<bool, PkiError> {
    let Some((crt, key)) = read_staged(data_dir)? else {
        return Ok(false);
    };
    let dir = data_dir.join("tls");
    write_atomic(&dir.join("ca.key"), &key)?;
    write_atomic(&dir.join("ca.crt"), &crt)?;
    remove_if_there(&dir.join("ca-next.key"))?;
    remove_if_there(&dir.join("ca-next.crt"))?;
    tracing::info!(path = %dir.display(), "the staged certificate authority signs from now on");
    Ok(true)
}

/// Finishes a switch that a crash interrupted: the signing key is already the staged one
/// (its certificate may not be yet), or the staged files outlived a complete switch.
fn recover(dir: &Path) -> Result<(), PkiError> {
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
    let (key, next_key, next_crt) = (read("ca.key"), read("ca-next.key"), read("ca-next.crt"));
    if let (Some(k), Some(nk), Some(nc)) = (&key, &next_key, &next_crt)
        && k == nk
    {
        if read("ca.crt").as_ref() != Some(nc) {
            write_atomic(&dir.join("ca.crt"), nc)?;
        }
        remove_if_there(&dir.join("ca-next.key"))?;
        remove_if_there(&dir.join("ca-next.crt"))?;
        tracing::info!(path = %dir.display(), "finished a CA switch a crash interrupted");
    } else if next_key.is_none()
        && let Some(nc) = &next_crt
        && read("ca.crt").as_ref() == Some(nc)
    {
        remove_if_there(&dir.join("ca-next.crt"))?;
    }
    Ok(())
}

fn ca_params() -> CertificateParams {
    let mut p = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "orrery-ca");
    dn.push(DnType::OrganizationName, "orrery");
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    p
}

fn now_unix() -> i64 {
    jiff::Timestamp::now().as_second()
}

/// Loads or creates the CA and the serving certificate for `sans`.
pub fn ensure(data_dir: &Path, sans: &[String]) -> Result<Pki, PkiError> {
    ensure_valid_for(data_dir, sans, DEFAULT_SERVING_VALIDITY)
}

/// [`ensure`], a serving certificate issued anew when less than [`renew_before`] of
/// `validity` is left (or its names changed).
pub fn ensure_valid_for(
    data_dir: &Path,
    sans: &[String],
    validity: std::time::Duration,
) -> Result<Pki, PkiError> {
    let dir = data_dir.join("tls");
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    recover(&dir)?;
    let (ca_crt, ca_key) = (dir.join("ca.crt"), dir.join("ca.key"));
    let (srv_crt, srv_key, srv_info) = (
        dir.join("server.crt"),
        dir.join("server.key"),
        dir.join("server.json"),
    );

    let (ca_pem, ca_key_pair) = if ca_crt.exists() && ca_key.exists() {
        let key_pem = std::fs::read_to_string(&ca_key).map_err(io(&ca_key))?;
        let key = KeyPair::from_pem(&key_pem).map_err(|e| PkiError::Pem {
            path: ca_key.clone(),
            reason: e.to_string(),
        })?;
        (std::fs::read_to_string(&ca_crt).map_err(io(&ca_crt))?, key)
    } else {
        let (cert, key_pem) = generate_ca()?;
        write_private(&ca_key, &key_pem)?;
        write_private(&ca_crt, &cert)?;
        tracing::info!(path = %ca_crt.display(), "created a certificate authority");
        let key = KeyPair::from_pem(&key_pem).map_err(|e| PkiError::Pem {
            path: ca_key.clone(),
            reason: e.to_string(),
        })?;
        (cert, key)
    };
    let ca_der = CertificateDer::from_pem_slice(ca_pem.as_bytes()).map_err(|e| PkiError::Pem {
        path: ca_crt.clone(),
        reason: e.to_string(),
    })?;
    let ca_hash: String = Sha256::digest(ca_der.as_ref())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();

    let mut wanted: Vec<String> = sans.to_vec();
    wanted.sort();
    wanted.dedup();
    let current: Option<ServingInfo> = std::fs::read_to_string(&srv_info)
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok());
    let signer = orrery_api::token::ca_hash(&ca_pem);
    let fresh = current.as_ref().is_some_and(|c| {
        c.sans == wanted
            && c.not_after - now_unix() > renew_before(validity)
            && c.ca.as_ref().is_none_or(|h| *h == signer)
    });
    let (cert_pem, key_pem) = if fresh && srv_crt.exists() && srv_key.exists() {
        (
            std::fs::read_to_string(&srv_crt).map_err(io(&srv_crt))?,
            std::fs::read_to_string(&srv_key).map_err(io(&srv_key))?,
        )
    } else {
        let issuer = Issuer::new(ca_params(), &ca_key_pair);
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(wanted.clone())?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "orrery");
        params.distinguished_name = dn;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let not_after = now_unix() + validity.as_secs() as i64;
        // A day back allows for clients whose clocks are behind.
        let (y, m, d) = ymd(now_unix() - 86400);
        params.not_before = rcgen::date_time_ymd(y, m, d);
        params.not_after =
            time::OffsetDateTime::from_unix_timestamp(not_after).map_err(|e| PkiError::Pem {
                path: srv_crt.clone(),
                reason: format!("validity: {e}"),
            })?;
        let cert = params.signed_by(&key, &issuer)?;
        write_private(&srv_key, &key.serialize_pem())?;
        write_private(&srv_crt, &cert.pem())?;
        let info = ServingInfo {
            sans: wanted.clone(),
            not_after,
            ca: Some(signer),
        };
        write_private(&srv_info, &serde_json::to_string(&info).unwrap_or_default())?;
        tracing::info!(sans = ?wanted, "issued a serving certificate");
        (cert.pem(), key.serialize_pem())
    };
    Ok(Pki {
        ca_pem,
        cert_pem,
        key_pem,
        ca_hash,
    })
}

/// The CA's certificate and key as kept under `data_dir` (after [`ensure`]).
pub fn read_ca(data_dir: &Path) -> Result<(String, String), PkiError> {
    let dir = data_dir.join("tls");
    let (crt, key) = (dir.join("ca.crt"), dir.join("ca.key"));
    Ok((
        std::fs::read_to_string(&crt).map_err(io(&crt))?,
        std::fs::read_to_string(&key).map_err(io(&key))?,
    ))
}

/// Makes `data_dir` hold the given CA (the installation's, shared by its replicas). A serving
/// certificate issued by another CA is dropped, so [`ensure`] issues one from this CA.
/// Returns whether anything changed.
pub fn install_ca(data_dir: &Path, ca_pem: &str, key_pem: &str) -> Result<bool, PkiError> {
    let dir = data_dir.join("tls");
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    KeyPair::from_pem(key_pem).map_err(|e| PkiError::Pem {
        path: dir.join("ca.key"),
        reason: e.to_string(),
    })?;
    if read_ca(data_dir).is_ok_and(|(c, k)| c == ca_pem && k == key_pem) {
        return Ok(false);
    }
    write_atomic(&dir.join("ca.key"), key_pem)?;
    write_atomic(&dir.join("ca.crt"), ca_pem)?;
    for stale in ["server.crt", "server.key", "server.json"] {
        let path = dir.join(stale);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(PkiError::Io { path, source: e }),
        }
    }
    tracing::info!(path = %dir.display(), "installed the installation's certificate authority");
    Ok(true)
}

fn ymd(unix: i64) -> (i32, u8, u8) {
    let date = jiff::Timestamp::from_second(unix)
        .unwrap_or(jiff::Timestamp::UNIX_EPOCH)
        .to_zoned(jiff::tz::TimeZone::UTC)
        .date();
    (date.year() as i32, date.month() as u8, date.day() as u8)
}

/// The serving certificate handshakes are answered with; [`ServingCert::set`] replaces it
/// for the handshakes that follow (connections already made keep theirs).
#[derive(Debug)]
pub struct ServingCert(parking_lot::RwLock<std::sync::Arc<rustls::sign::CertifiedKey>>);

impl ServingCert {
    pub fn new(pki: &Pki) -> Result<Self, String> {
        Ok(ServingCert(parking_lot::RwLock::new(std::sync::Arc::new(
            certified(pki)?,
        ))))
    }

    /// Serves `pki`'s certificate from the next handshake on.
    pub fn set(&self, pki: &Pki) -> Result<(), String> {
        let c = std::sync::Arc::new(certified(pki)?);
        *self.0.write() = c;
        Ok(())
    }
}

impl rustls::server::ResolvesServerCert for ServingCert {
    fn resolve(
        &self,
        _hello: rustls::server::ClientHello<'_>,
    ) -> Option<std::sync::Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.read().clone())
    }
}

fn certified(pki: &Pki) -> Result<rustls::sign::CertifiedKey, String> {
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(pki.cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| format!("serving certificate: {e}"))?;
    let key = PrivateKeyDer::from_pem_slice(pki.key_pem.as_bytes())
        .map_err(|e| format!("serving key: {e}"))?;
    let provider = rustls::crypto::ring::default_provider();
    rustls::sign::CertifiedKey::from_der(certs, key, &provider)
        .map_err(|e| format!("serving certificate: {e}"))
}

/// A rustls server configuration for the serving certificate (HTTP/2 and HTTP/1.1). Clients
/// may present a certificate signed by a CA of `trusted` (PEM) (a user's, see [`issue_user_cert`]); those who
/// do not authenticate with a token instead. The serving certificate comes from `serving`,
/// renewed in place.
pub fn server_config(
    trusted: &str,
    serving: std::sync::Arc<ServingCert>,
) -> Result<rustls::ServerConfig, String> {
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(trusted.as_bytes()) {
        roots
            .add(ca.map_err(|e| format!("CA certificate: {e}"))?)
            .map_err(|e| format!("CA certificate: {e}"))?;
    }
    let clients = rustls::server::WebPkiClientVerifier::builder_with_provider(
        std::sync::Arc::new(roots),
        provider.clone(),
    )
    .allow_unauthenticated()
    .build()
    .map_err(|e| format!("client certificate verifier: {e}"))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_client_cert_verifier(clients)
        .with_cert_resolver(serving);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// Signs users' client certificates with the CA; the key stays out of `Debug` output.
pub struct UserIssuer {
    key: KeyPair,
}

impl std::fmt::Debug for UserIssuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UserIssuer { .. }")
    }
}

/// Why a user's certificate was not issued.
#[derive(Debug, thiserror::Error)]
pub enum IssueError {
    #[error("the certificate signing request is not valid: {0}")]
    Csr(rcgen::Error),
    #[error("signing failed: {0}")]
    Sign(rcgen::Error),
}

impl UserIssuer {
    /// The issuer for the CA whose key is `ca_key_pem`.
    pub fn new(ca_key_pem: &str) -> Result<Self, rcgen::Error> {
        Ok(UserIssuer {
            key: KeyPair::from_pem(ca_key_pem)?,
        })
    }

    /// A client certificate for the key in `csr_pem`, naming `user` (CN) in `groups` (O),
    /// valid for `ttl`. What the request itself names is ignored: the caller decides.
    pub fn issue(
        &self,
        csr_pem: &str,
        user: &str,
        groups: &[String],
        ttl: std::time::Duration,
    ) -> Result<String, IssueError> {
        let mut csr =
            rcgen::CertificateSigningRequestParams::from_pem(csr_pem).map_err(IssueError::Csr)?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, user);
        for g in groups {
            dn.push(DnType::OrganizationName, g.as_str());
        }
        params.distinguished_name = dn;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let epoch = rcgen::date_time_ymd(1970, 1, 1);
        let now = now_unix().max(0) as u64;
        // A little slack for clocks that run behind.
        params.not_before = epoch + std::time::Duration::from_secs(now.saturating_sub(300));
        params.not_after = epoch + std::time::Duration::from_secs(now) + ttl;
        csr.params = params;
        let issuer = Issuer::new(ca_params(), &self.key);
        Ok(csr.signed_by(&issuer).map_err(IssueError::Sign)?.pem())
    }
}

/// A new key pair and a certificate signing request for it: (key PEM, CSR PEM).
pub fn key_and_csr() -> Result<(String, String), rcgen::Error> {
    let key = KeyPair::generate()?;
    let csr = CertificateParams::default().serialize_request(&key)?;
    Ok((key.serialize_pem(), csr.pem()?))
}

/// A kubeconfig for a user with a client certificate.
pub fn cert_kubeconfig(
    server_url: &str,
    ca_pem: &str,
    user: &str,
    cert_pem: &str,
    key_pem: &str,
) -> String {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: orrery\n  cluster:\n    server: {server_url}\n    certificate-authority-data: {}\nusers:\n- name: {user}\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\ncontexts:\n- name: {user}@orrery\n  context:\n    cluster: orrery\n    user: {user}\ncurrent-context: {user}@orrery\n",
        b64(ca_pem),
        b64(cert_pem),
        b64(key_pem)
    )
}

/// A kubeconfig that kubectl uses as is.
pub fn kubeconfig(server_url: &str, ca_pem: &str, user: &str, token: &str) -> String {
    use base64::Engine;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem.as_bytes());
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: orrery\n  cluster:\n    server: {server_url}\n    certificate-authority-data: {ca}\nusers:\n- name: {user}\n  user:\n    token: {token}\ncontexts:\n- name: orrery\n  context:\n    cluster: orrery\n    user: {user}\ncurrent-context: orrery\n"
    )
}

/// Writes a kubeconfig with owner-only permissions.
pub fn write_kubeconfig(path: &Path, contents: &str) -> Result<(), PkiError> {
    write_private(path, contents)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_then_reuses_and_reissues_on_new_names() {
        let dir = tempfile::tempdir().unwrap();
        let sans = vec!["localhost".to_string(), "127.0.0.1".to_string()];
        let a = ensure(dir.path(), &sans).unwrap();
        let b = ensure(dir.path(), &sans).unwrap();
        assert_eq!(a.cert_pem, b.cert_pem, "reused");
        assert_eq!(a.ca_hash, b.ca_hash);
        let c = ensure(
            dir.path(),
            &[sans.clone(), vec!["orrery.example".into()]].concat(),
        )
        .unwrap();
        assert_ne!(a.cert_pem, c.cert_pem, "re-issued for the new name");
        assert_eq!(a.ca_pem, c.ca_pem, "same CA");
        let serving = std::sync::Arc::new(ServingCert::new(&c).unwrap());
        assert!(server_config(&c.ca_pem, serving).is_ok());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("tls/ca.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let kc = kubeconfig("https://127.0.0.1:6443", &a.ca_pem, "admin", "abc.def");
        assert!(kc.contains("token: abc.def") && kc.contains("certificate-authority-data: "));
    }
}
