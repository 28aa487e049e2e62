//! Encryption at rest, configured as Kubernetes configures it: an `EncryptionConfiguration`
//! (`apiserver.config.k8s.io/v1`, `--encryption-provider-config`) lists resources and, for
//! each, providers in order: the first encrypts what is written, every one of them is tried
//! for what is read (so keys rotate as in Kubernetes: add the new key first, rewrite the
//! objects, remove the old key).
//!
//! Providers: `aesgcm` (AES-GCM, 16/24/32-byte keys, a random 12-byte nonce, the object's
//! identity as additional data), `aescbc` (AES-CBC with PKCS#7 padding, a random IV),
//! `secretbox` (XSalsa20-Poly1305, a 32-byte key, a random 24-byte nonce), and `identity`
//! (written as is). `kms` is refused: no key service is reachable here.
//!
//! [`EncryptingStore`] sits between the API server (and the controllers) and the store. What
//! it encrypts is everything of an object but `apiVersion`, `kind`, `metadata` (save its
//! annotations, which may hold the whole object) and `type`: selectors and the store's own
//! bookkeeping read those. The rest is replaced by one field, `sealed`, holding
//! `k8s:enc:<provider>:v1:<key name>:` and the base64 of the ciphertext. A Work that carries a
//! Secret to a member is sealed as Secrets are.
//! Objects written before encryption was configured stay readable; rewriting them (`kubectl
//! get secrets -A -o json | kubectl replace -f -`) encrypts them. Leases are never encrypted:
//! the store checks the leader's Lease inside its own transactions.

use std::sync::Arc;

use aes_gcm::aead::consts::U12;
use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes128Gcm, Aes256Gcm, AesGcm};
use base64::Engine;
use cbc::cipher::block_padding::Pkcs7;
use cbc::cipher::{BlockCipher, BlockDecryptMut, BlockEncryptMut, KeyIvInit};
use orrery_api::Object;
use orrery_store::{
    Fence, ListOptions, ListResult, Preconditions, RawListResult, RawObject, Revision, Store,
    StoreError, WatchOptions, WatchStream,
};
use serde::Deserialize;
use serde_json::{Map, Value};

/// The field that holds an encrypted object's sealed part.
pub const SEALED: &str = "sealed";
const PREFIX: &str = "k8s:enc:";
/// Fields left in the clear: what selectors and the store read.
const CLEAR: &[&str] = &["type"];
/// Where the sealed part keeps the object's annotations (no top-level field is named so).
const ANNOTATIONS: &str = "$annotations";
const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EncryptionError {
    #[error("the encryption configuration cannot be read: {0}")]
    Config(String),
    #[error("no randomness: {0}")]
    Random(String),
    #[error("{0}")]
    Seal(String),
    #[error("{key}: {message}")]
    Open { key: String, message: String },
}

impl From<EncryptionError> for StoreError {
    fn from(e: EncryptionError) -> Self {
        StoreError::Backend(e.to_string())
    }
}

/// One key of a provider.
#[derive(Clone)]
struct NamedKey {
    name: String,
    secret: Vec<u8>,
}

#[derive(Clone)]
enum Provider {
    AesGcm(Vec<NamedKey>),
    AesCbc(Vec<NamedKey>),
    Secretbox(Vec<NamedKey>),
    Identity,
}

impl Provider {
    fn tag(&self) -> &'static str {
        match self {
            Provider::AesGcm(_) => "aesgcm",
            Provider::AesCbc(_) => "aescbc",
            Provider::Secretbox(_) => "secretbox",
            Provider::Identity => "identity",
        }
    }

    fn keys(&self) -> &[NamedKey] {
        match self {
            Provider::AesGcm(k) | Provider::AesCbc(k) | Provider::Secretbox(k) => k,
            Provider::Identity => &[],
        }
    }
}

/// Which stored keys a rule covers.
#[derive(Clone, Debug, PartialEq)]
enum Target {
    /// One resource: its store prefix (`/registry/core/secrets/`).
    Prefix(String),
    /// Every resource of a group (`*.apps`): `/registry/apps/`.
    Group(String),
    /// Everything (`*.*`).
    All,
}

impl Target {
    fn covers(&self, key: &str) -> bool {
        match self {
            Target::Prefix(p) | Target::Group(p) => key.starts_with(p.as_str()),
            Target::All => key.starts_with("/registry/"),
        }
    }
}

#[derive(Clone)]
struct Rule {
    targets: Vec<Target>,
    providers: Vec<Provider>,
}

/// A parsed `EncryptionConfiguration`.
#[derive(Clone)]
pub struct EncryptionConfig {
    rules: Vec<Rule>,
}

impl std::fmt::Debug for EncryptionConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the keys.
        let rules: Vec<(Vec<Target>, Vec<&str>)> = self
            .rules
            .iter()
            .map(|r| {
                (
                    r.targets.clone(),
                    r.providers.iter().map(Provider::tag).collect(),
                )
            })
            .collect();
        f.debug_struct("EncryptionConfig")
            .field("rules", &rules)
            .finish()
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ConfigFile {
    api_version: String,
    kind: String,
    #[serde(default)]
    resources: Vec<ResourcesFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResourcesFile {
    resources: Vec<String>,
    providers: Vec<ProviderFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProviderFile {
    aesgcm: Option<KeysFile>,
    aescbc: Option<KeysFile>,
    secretbox: Option<KeysFile>,
    identity: Option<Value>,
    kms: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeysFile {
    keys: Vec<KeyFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyFile {
    name: String,
    secret: String,
}

fn config_err(m: impl Into<String>) -> EncryptionError {
    EncryptionError::Config(m.into())
}

fn keys_of(
    at: &str,
    provider: &str,
    file: KeysFile,
    sizes: &[usize],
) -> Result<Vec<NamedKey>, EncryptionError> {
    if file.keys.is_empty() {
        return Err(config_err(format!(
            "{at}.{provider}.keys: at least one key"
        )));
    }
    let mut out: Vec<NamedKey> = Vec::new();
    for (i, k) in file.keys.into_iter().enumerate() {
        let kat = format!("{at}.{provider}.keys[{i}]");
        if k.name.is_empty() || k.name.contains(':') {
            return Err(config_err(format!(
                "{kat}.name: a non-empty name without ':'"
            )));
        }
        if out.iter().any(|o| o.name == k.name) {
            return Err(config_err(format!("{kat}.name: {:?} twice", k.name)));
        }
        let secret = B64
            .decode(k.secret.trim())
            .map_err(|e| config_err(format!("{kat}.secret: not base64 ({e})")))?;
        if !sizes.contains(&secret.len()) {
            return Err(config_err(format!(
                "{kat}.secret: {} bytes; {provider} takes keys of {sizes:?} bytes",
                secret.len()
            )));
        }
        out.push(NamedKey {
            name: k.name,
            secret,
        });
    }
    Ok(out)
}

fn target_of(at: &str, resource: &str) -> Result<Target, EncryptionError> {
    let (plural, group) = resource.split_once('.').unwrap_or((resource, ""));
    let ok = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
    };
    match (plural, group) {
        ("*", "*") => Ok(Target::All),
        ("*", g) => Ok(Target::Group(
            orrery_api::keys::prefix(g, "", None)
                .trim_end_matches('/')
                .to_string()
                + "/",
        )),
        (p, g) if ok(p) && (g.is_empty() || ok(g)) => {
            Ok(Target::Prefix(orrery_api::keys::prefix(g, p, None)))
        }
        _ => Err(config_err(format!(
            "{at}: {resource:?} is not a resource (plural[.group], *.group or *.*)"
        ))),
    }
}

impl EncryptionConfig {
    /// Reads an `EncryptionConfiguration` (YAML or JSON).
    pub fn parse(text: &str) -> Result<EncryptionConfig, EncryptionError> {
        let file: ConfigFile =
            serde_saphyr::from_str(text).map_err(|e| config_err(e.to_string()))?;
        if file.api_version != "apiserver.config.k8s.io/v1"
            || file.kind != "EncryptionConfiguration"
        {
            return Err(config_err(format!(
                "expected apiVersion apiserver.config.k8s.io/v1, kind EncryptionConfiguration; found {}, {}",
                file.api_version, file.kind
            )));
        }
        let mut rules = Vec::new();
        for (i, r) in file.resources.into_iter().enumerate() {
            let at = format!("resources[{i}]");
            if r.resources.is_empty() {
                return Err(config_err(format!("{at}.resources: at least one resource")));
            }
            if r.providers.is_empty() {
                return Err(config_err(format!("{at}.providers: at least one provider")));
            }
            let targets = r
                .resources
                .iter()
                .enumerate()
                .map(|(j, res)| target_of(&format!("{at}.resources[{j}]"), res))
                .collect::<Result<Vec<_>, _>>()?;
            let mut providers = Vec::new();
            for (j, p) in r.providers.into_iter().enumerate() {
                let pat = format!("{at}.providers[{j}]");
                let named = [
                    p.aesgcm.is_some(),
                    p.aescbc.is_some(),
                    p.secretbox.is_some(),
                    p.identity.is_some(),
                    p.kms.is_some(),
                ]
                .iter()
                .filter(|x| **x)
                .count();
                if named != 1 {
                    return Err(config_err(format!(
                        "{pat}: exactly one of aesgcm, aescbc, secretbox, identity"
                    )));
                }
                let provider = if let Some(k) = p.aesgcm {
                    Provider::AesGcm(keys_of(&pat, "aesgcm", k, &[16, 24, 32])?)
                } else if let Some(k) = p.aescbc {
                    Provider::AesCbc(keys_of(&pat, "aescbc", k, &[16, 24, 32])?)
                } else if let Some(k) = p.secretbox {
                    Provider::Secretbox(keys_of(&pat, "secretbox", k, &[32])?)
                } else if p.identity.is_some() {
                    Provider::Identity
                } else {
                    return Err(config_err(format!(
                        "{pat}.kms: not supported (no key management service is reachable); use aesgcm, aescbc or secretbox"
                    )));
                };
                providers.push(provider);
            }
            rules.push(Rule { targets, providers });
        }
        Ok(EncryptionConfig { rules })
    }

    /// Reads the file at `path`.
    pub fn load(path: &std::path::Path) -> Result<EncryptionConfig, EncryptionError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| config_err(format!("{}: {e}", path.display())))?;
        Self::parse(&text)
    }

    /// This configuration with its first rule covering every key under `prefix` too (for
    /// running the store's conformance suite, whose keys lie outside `/registry/`).
    #[doc(hidden)]
    pub fn also_covering(mut self, prefix: &str) -> Self {
        if let Some(r) = self.rules.first_mut() {
            r.targets.push(Target::Prefix(prefix.to_string()));
        }
        self
    }

    /// The rule for a stored key: the first that covers it (Leases: none).
    fn rule(&self, key: &str) -> Option<&Rule> {
        if key.starts_with("/registry/coordination.k8s.io/leases/") {
            return None;
        }
        self.rules
            .iter()
            .find(|r| r.targets.iter().any(|t| t.covers(key)))
    }

    /// The rule for `obj` at `key`: a Work carrying a Secret to a member is sealed as Secrets
    /// are, if its own kind is not covered (its manifests hold the Secret's data).
    fn rule_for(&self, key: &str, obj: &Object) -> Option<&Rule> {
        self.rule(key).or_else(|| {
            (key.starts_with(&orrery_api::keys::well_known::works(None)) && carries_secret(obj))
                .then(|| self.rule(&orrery_api::keys::prefix("", "secrets", None)))
                .flatten()
        })
    }

    /// The providers tried for opening what was sealed: those of every rule (a resource may
    /// have moved between rules).
    fn all_providers(&self) -> impl Iterator<Item = &Provider> {
        self.rules.iter().flat_map(|r| r.providers.iter())
    }

    /// `obj`, to be stored at `key`: sealed by the first provider of the rule covering the
    /// key, if that is not `identity`.
    pub fn seal(&self, key: &str, mut obj: Object) -> Result<Object, EncryptionError> {
        let Some(provider) = self.rule_for(key, &obj).and_then(|r| r.providers.first()) else {
            return Ok(obj);
        };
        let Some(k) = provider.keys().first() else {
            return Ok(obj);
        };
        // Everything but what stays in the clear, as one JSON object. Annotations too: they
        // may hold the whole object (kubectl's last-applied-configuration).
        let mut hidden = Map::new();
        if !obj.metadata.annotations.is_empty() {
            let a = std::mem::take(&mut obj.metadata.annotations);
            hidden.insert(
                ANNOTATIONS.into(),
                serde_json::to_value(a).map_err(|e| EncryptionError::Seal(e.to_string()))?,
            );
        }
        if let Some(spec) = obj.spec.take() {
            hidden.insert("spec".into(), spec);
        }
        if let Some(status) = obj.status.take() {
            hidden.insert("status".into(), status);
        }
        for (f, v) in std::mem::take(&mut obj.other) {
            if CLEAR.contains(&f.as_str()) {
                obj.other.insert(f, v);
            } else {
                hidden.insert(f, v);
            }
        }
        let plain = serde_json::to_vec(&Value::Object(hidden))
            .map_err(|e| EncryptionError::Seal(e.to_string()))?;
        let aad = identity_of(&obj);
        let sealed = encrypt(provider, k, &plain, aad.as_bytes())?;
        obj.other.insert(
            SEALED.into(),
            Value::String(format!(
                "{PREFIX}{}:v1:{}:{}",
                provider.tag(),
                k.name,
                B64.encode(sealed)
            )),
        );
        Ok(obj)
    }

    /// Whether `obj` holds a sealed part.
    pub fn is_sealed(obj: &Object) -> bool {
        obj.other
            .get(SEALED)
            .and_then(Value::as_str)
            .is_some_and(|s| s.starts_with(PREFIX))
    }

    /// `obj` as it was before [`Self::seal`]; objects never sealed are returned as they are.
    pub fn open(&self, obj: Object) -> Result<Object, EncryptionError> {
        if !Self::is_sealed(&obj) {
            return Ok(obj);
        }
        let mut obj = obj;
        let Some(Value::String(text)) = obj.other.remove(SEALED) else {
            return Ok(obj);
        };
        let who = identity_of(&obj);
        let fail = |message: String| EncryptionError::Open {
            key: who.clone(),
            message,
        };
        let rest = &text[PREFIX.len()..];
        let mut parts = rest.splitn(4, ':');
        let (Some(tag), Some("v1"), Some(name), Some(data)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(fail("the sealed data is malformed".into()));
        };
        let sealed = B64
            .decode(data)
            .map_err(|_| fail("the sealed data is not base64".into()))?;
        let Some((provider, key)) = self.all_providers().find_map(|p| {
            (p.tag() == tag)
                .then(|| p.keys().iter().find(|k| k.name == name).map(|k| (p, k)))
                .flatten()
        }) else {
            return Err(fail(format!(
                "encrypted with {tag} key {name:?}, which the encryption configuration no longer holds"
            )));
        };
        let plain = decrypt(provider, key, &sealed, who.as_bytes()).ok_or_else(|| {
            fail(format!(
                "{tag} key {name:?} does not open it (altered data, or another key of that name)"
            ))
        })?;
        let Value::Object(hidden) = serde_json::from_slice::<Value>(&plain)
            .map_err(|e| fail(format!("the opened data is not JSON: {e}")))?
        else {
            return Err(fail("the opened data is not a JSON object".into()));
        };
        for (f, v) in hidden {
            match f.as_str() {
                ANNOTATIONS => {
                    obj.metadata.annotations = serde_json::from_value(v)
                        .map_err(|e| fail(format!("the opened annotations: {e}")))?;
                }
                "spec" => obj.spec = Some(v),
                "status" => obj.status = Some(v),
                _ => {
                    obj.other.insert(f, v);
                }
            }
        }
        Ok(obj)
    }
}

/// Whether a Work's manifests include a Secret.
fn carries_secret(work: &Object) -> bool {
    work.spec
        .as_ref()
        .and_then(|s| s.pointer("/workload/manifests"))
        .and_then(Value::as_array)
        .is_some_and(|ms| {
            ms.iter().any(|m| {
                m.get("kind").and_then(Value::as_str) == Some("Secret")
                    && m.get("apiVersion").and_then(Value::as_str) == Some("v1")
            })
        })
}

/// What binds a sealed part to its object: another object's sealed part does not open as it.
fn identity_of(obj: &Object) -> String {
    format!(
        "{}/{}/{}/{}",
        obj.api_version, obj.kind, obj.metadata.namespace, obj.metadata.name
    )
}

type Aes192Gcm = AesGcm<aes::Aes192, U12>;

/// Seals (or opens) `data` with the AEAD cipher `C`.
fn aead<C: KeyInit + Aead>(
    key: &[u8],
    nonce: &[u8],
    data: &[u8],
    aad: &[u8],
    seal: bool,
) -> Option<Vec<u8>> {
    let c = C::new_from_slice(key).ok()?;
    let nonce = aes_gcm::aead::Nonce::<C>::from_slice(nonce);
    let p = Payload { msg: data, aad };
    if seal {
        c.encrypt(nonce, p).ok()
    } else {
        c.decrypt(nonce, p).ok()
    }
}

/// Seals (or opens) `data` with the block cipher `C` in CBC mode, PKCS#7 padded.
fn cbc<C>(key: &[u8], iv: &[u8], data: &[u8], seal: bool) -> Option<Vec<u8>>
where
    C: BlockCipher + BlockEncryptMut + BlockDecryptMut + KeyInit,
{
    if seal {
        let e = cbc::Encryptor::<C>::new_from_slices(key, iv).ok()?;
        Some(e.encrypt_padded_vec_mut::<Pkcs7>(data))
    } else {
        let d = cbc::Decryptor::<C>::new_from_slices(key, iv).ok()?;
        d.decrypt_padded_vec_mut::<Pkcs7>(data).ok()
    }
}

/// The nonce (or IV) a provider writes before its ciphertext.
fn nonce_len(provider: &Provider) -> usize {
    match provider {
        Provider::AesGcm(_) => 12,
        Provider::AesCbc(_) => 16,
        Provider::Secretbox(_) => 24,
        Provider::Identity => 0,
    }
}

/// Seals (or opens) `data` as `provider` does with `key`. AES-GCM binds it to `aad`;
/// secretbox (as Kubernetes uses it) and CBC take none.
fn cipher(
    provider: &Provider,
    key: &[u8],
    nonce: &[u8],
    data: &[u8],
    aad: &[u8],
    seal: bool,
) -> Option<Vec<u8>> {
    match (provider, key.len()) {
        (Provider::AesGcm(_), 16) => aead::<Aes128Gcm>(key, nonce, data, aad, seal),
        (Provider::AesGcm(_), 24) => aead::<Aes192Gcm>(key, nonce, data, aad, seal),
        (Provider::AesGcm(_), 32) => aead::<Aes256Gcm>(key, nonce, data, aad, seal),
        (Provider::AesCbc(_), 16) => cbc::<aes::Aes128>(key, nonce, data, seal),
        (Provider::AesCbc(_), 24) => cbc::<aes::Aes192>(key, nonce, data, seal),
        (Provider::AesCbc(_), 32) => cbc::<aes::Aes256>(key, nonce, data, seal),
        (Provider::Secretbox(_), _) => {
            aead::<crypto_secretbox::XSalsa20Poly1305>(key, nonce, data, b"", seal)
        }
        _ => None,
    }
}

/// Nonce (or IV) ‖ ciphertext.
fn encrypt(
    provider: &Provider,
    key: &NamedKey,
    plain: &[u8],
    aad: &[u8],
) -> Result<Vec<u8>, EncryptionError> {
    let mut out = vec![0u8; nonce_len(provider)];
    getrandom::fill(&mut out).map_err(|e| EncryptionError::Random(e.to_string()))?;
    let ct = cipher(provider, &key.secret, &out, plain, aad, true)
        .ok_or_else(|| EncryptionError::Seal(format!("{} could not encrypt", provider.tag())))?;
    out.extend(ct);
    Ok(out)
}

fn decrypt(provider: &Provider, key: &NamedKey, sealed: &[u8], aad: &[u8]) -> Option<Vec<u8>> {
    let (nonce, ct) = sealed.split_at_checked(nonce_len(provider))?;
    cipher(provider, &key.secret, nonce, ct, aad, false)
}

/// A store that seals what its configuration covers on the way in and opens it on the way
/// out; everything else passes through.
#[derive(Debug)]
pub struct EncryptingStore {
    inner: Arc<dyn Store>,
    config: Arc<EncryptionConfig>,
}

impl EncryptingStore {
    pub fn wrap(inner: Arc<dyn Store>, config: Arc<EncryptionConfig>) -> Arc<dyn Store> {
        Arc::new(EncryptingStore { inner, config })
    }

    fn open(&self, obj: Object) -> Result<Object, StoreError> {
        Ok(self.config.open(obj)?)
    }
}

#[async_trait::async_trait]
impl Store for EncryptingStore {
    async fn get(&self, key: &str) -> Result<Object, StoreError> {
        let o = self.inner.get(key).await?;
        self.open(o)
    }

    async fn get_recent(&self, key: &str) -> Result<Arc<Object>, StoreError> {
        let o = self.inner.get_recent(key).await?;
        open_shared(&self.config, o)
    }

    async fn get_shared(&self, key: &str) -> Result<Arc<Object>, StoreError> {
        let o = self.inner.get_shared(key).await?;
        open_shared(&self.config, o)
    }

    async fn get_copy(&self, key: &str) -> Result<Arc<Object>, StoreError> {
        let o = self.inner.get_copy(key).await?;
        open_shared(&self.config, o)
    }

    async fn list(&self, prefix: &str, opts: &ListOptions) -> Result<ListResult, StoreError> {
        let mut page = self.inner.list(prefix, opts).await?;
        page.items = page
            .items
            .into_iter()
            .map(|o| self.open(o))
            .collect::<Result<_, _>>()?;
        Ok(page)
    }

    async fn list_raw(
        &self,
        prefix: &str,
        opts: &ListOptions,
    ) -> Result<RawListResult, StoreError> {
        let mut page = self.inner.list_raw(prefix, opts).await?;
        let marker = format!("\"{SEALED}\":\"{PREFIX}");
        for item in page.items.iter_mut() {
            // Only sealed objects are parsed again.
            if !contains(&item.json, marker.as_bytes()) {
                continue;
            }
            let o: Object = serde_json::from_slice(&item.json)
                .map_err(|e| StoreError::Corrupt(format!("an object under {prefix}: {e}")))?;
            let o = self.open(o)?;
            *item = RawObject {
                revision: item.revision,
                json: serde_json::to_vec(&o).map_err(|e| StoreError::Backend(e.to_string()))?,
            };
        }
        Ok(page)
    }

    async fn create(&self, key: &str, obj: Object) -> Result<Arc<Object>, StoreError> {
        let sealed = self.config.seal(key, obj)?;
        let o = self.inner.create(key, sealed).await?;
        open_shared(&self.config, o)
    }

    async fn update(
        &self,
        key: &str,
        obj: Object,
        expected: Option<Revision>,
    ) -> Result<Arc<Object>, StoreError> {
        let sealed = self.config.seal(key, obj)?;
        let o = self.inner.update(key, sealed, expected).await?;
        open_shared(&self.config, o)
    }

    async fn delete(
        &self,
        key: &str,
        preconditions: &Preconditions,
    ) -> Result<Arc<Object>, StoreError> {
        let o = self.inner.delete(key, preconditions).await?;
        open_shared(&self.config, o)
    }

    async fn watch(
        &self,
        prefix: &str,
        from: Revision,
        opts: WatchOptions,
    ) -> Result<WatchStream, StoreError> {
        let w = self.inner.watch(prefix, from, opts).await?;
        let config = self.config.clone();
        Ok(w.map_objects(Arc::new(move |o| open_shared(&config, o))))
    }

    async fn current_revision(&self) -> Result<Revision, StoreError> {
        self.inner.current_revision().await
    }

    async fn compact(&self, revision: Revision) -> Result<(), StoreError> {
        self.inner.compact(revision).await
    }

    async fn compacted_revision(&self) -> Result<Revision, StoreError> {
        self.inner.compacted_revision().await
    }

    async fn close(&self) {
        self.inner.close().await
    }

    fn degraded(&self) -> Option<String> {
        self.inner.degraded()
    }

    fn watch_stats(&self) -> Option<orrery_store::WatchStats> {
        self.inner.watch_stats()
    }

    fn fenced(&self, fence: Fence) -> Option<Arc<dyn Store>> {
        let inner = self.inner.fenced(fence)?;
        Some(EncryptingStore::wrap(inner, self.config.clone()))
    }
}

/// A shared object opened (a copy only when it was sealed).
fn open_shared(config: &EncryptionConfig, obj: Arc<Object>) -> Result<Arc<Object>, StoreError> {
    if !EncryptionConfig::is_sealed(&obj) {
        return Ok(obj);
    }
    Ok(Arc::new(config.open(Object::clone(&obj))?))
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    memchr::memmem::find(hay, needle).is_some()
}

#[cfg(test)]
mod tests;
