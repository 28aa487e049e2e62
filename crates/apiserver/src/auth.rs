//! Bearer tokens and what each may do.
//!
//! A token is `<id>.<secret>`. The store keeps, under `/internal/tokens/<id>` (a key space the
//! REST API does not expose), the SHA-256 of the secret and the identity it grants; never the
//! secret. Tokens are cached in memory and kept current by a watch, so authentication does not
//! touch the store.
//!
//! Identities: *admin* may do everything; *cluster* tokens (used by member agents) are scoped
//! to one member cluster; *bootstrap* tokens (what `orrery token create` prints) may only
//! register their one cluster, which trades them for a cluster token.
//!
//! A member cluster's tokens (its agents' and its bootstrap tokens) are kept under
//! `/internal/tokens/clusters/<cluster>/<id>`, so that revoking them reads that cluster's
//! tokens only: a fleet registering at once no longer reads every token once per cluster.
//! Tokens stored directly under `/internal/tokens/<id>` (admin tokens, and every token of
//! earlier versions) are found through the in-memory copy.
//!
//! When a cluster is unregistered its agent tokens are not deleted but kept as tombstones for
//! [`TOMBSTONE_TTL`]: a request with one gets 404 "cluster ... was unregistered" instead of a bare
//! 401, so an agent that missed the Cluster's deletion still learns why it was cut off (and
//! stops and cleans up) rather than taking itself for a retired agent. Re-registering the
//! name removes them.

use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use orrery_api::{Object, Time};
use orrery_store::{ListOptions, Store, StoreError};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::error::ApiError;

/// How long a security cache (tokens, RBAC) may fail to follow the store before `/readyz` says
/// so: a watch that breaks and resumes at once is in step.
pub const CACHE_TOLERANCE: Duration = Duration::from_secs(5);

const PREFIX: &str = "/internal/tokens/";

/// A token's key and what is stored there.
type Stored = (String, Object);

/// Where a member cluster's tokens are kept.
fn cluster_prefix(cluster: &str) -> String {
    format!("{PREFIX}clusters/{cluster}/")
}

/// The keys a token may be stored under, the likeliest first: a member cluster's under the
/// cluster, anything else (and tokens of earlier versions) directly under [`PREFIX`].
fn keys_of(id: &str, identity: &Identity) -> Vec<String> {
    match identity {
        Identity::Cluster { name } | Identity::Bootstrap { name } => {
            vec![
                format!("{}{id}", cluster_prefix(name)),
                format!("{PREFIX}{id}"),
            ]
        }
        _ => vec![format!("{PREFIX}{id}")],
    }
}

/// How long an unregistered cluster's agent tokens keep answering "unregistered".
pub const TOMBSTONE_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// Who is calling.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Identity {
    /// Full access.
    Admin { name: String },
    /// A member cluster's agent: its own Works, its own status.
    Cluster { name: String },
    /// May register cluster `name` (and nothing else).
    Bootstrap { name: String },
    /// A user: a client certificate's subject (CN = name, O = groups) or a user token; RBAC
    /// decides what it may do.
    User { name: String, groups: Vec<String> },
    /// A ServiceAccount's token (TokenRequest, `kubectl create token`): good while the account
    /// with this uid exists.
    ServiceAccount {
        namespace: String,
        name: String,
        uid: String,
    },
}

impl Identity {
    /// The user name shown in logs and Forbidden messages.
    pub fn user(&self) -> String {
        match self {
            Identity::Admin { name } => name.clone(),
            Identity::Cluster { name } => format!("system:cluster:{name}"),
            Identity::Bootstrap { name } => format!("system:bootstrap:{name}"),
            Identity::User { name, .. } => name.clone(),
            Identity::ServiceAccount {
                namespace, name, ..
            } => format!("system:serviceaccount:{namespace}:{name}"),
        }
    }

    /// The groups it is in, as Kubernetes names such groups (audit Events, `whoami`).
    pub fn groups(&self) -> Vec<String> {
        let mut groups: Vec<String> = match self {
            Identity::Admin { .. } => vec!["system:masters".into()],
            Identity::Cluster { .. } => vec!["system:clusters".into()],
            Identity::Bootstrap { .. } => vec!["system:bootstrappers".into()],
            Identity::User { groups, .. } => groups
                .iter()
                .filter(|g| *g != "system:authenticated")
                .cloned()
                .collect(),
            Identity::ServiceAccount { namespace, .. } => vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{namespace}"),
            ],
        };
        groups.push("system:authenticated".into());
        groups
    }

    /// Whether it may do everything (`system:masters`, as in Kubernetes).
    pub fn is_superuser(&self) -> bool {
        match self {
            Identity::Admin { .. } => true,
            Identity::User { groups, .. } => groups.iter().any(|g| g == "system:masters"),
            _ => false,
        }
    }
}

#[derive(Clone, Debug)]
struct Record {
    hash: [u8; 32],
    identity: Identity,
    expires: Option<Time>,
    /// A tombstone: the token of an agent whose cluster was unregistered.
    unregistered: bool,
}

impl Record {
    fn expired(&self, now: Time) -> bool {
        self.expires.is_some_and(|e| e <= now)
    }
}

/// Verifies tokens against the stored hashes.
#[derive(Debug)]
pub struct Authenticator {
    store: Arc<dyn Store>,
    tokens: Arc<RwLock<HashMap<String, Record>>>,
    /// The reflector keeping `tokens` in step with the store, and the handle that stops it
    /// (the last copy of the Authenticator dropped).
    health: orrery_runtime::reflector::Health,
    _following: Arc<tokio::sync::watch::Sender<bool>>,
}

fn digest(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// Compares two digests in time independent of where they differ.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn random_hex(bytes: usize) -> Result<String, ApiError> {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf).map_err(|e| ApiError::internal(format!("no randomness: {e}")))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

fn record_of(obj: &Object) -> Option<(String, Record)> {
    let spec = obj.spec.as_ref()?;
    let hex = spec.get("secretHash")?.as_str()?;
    let mut hash = [0u8; 32];
    if hex.len() != 64 {
        return None;
    }
    for (i, h) in hash.iter_mut().enumerate() {
        *h = u8::from_str_radix(hex.get(i * 2..i * 2 + 2)?, 16).ok()?;
    }
    let identity = match spec.get("role")?.as_str()? {
        "admin" => Identity::Admin {
            name: spec
                .get("user")
                .and_then(|u| u.as_str())
                .unwrap_or("admin")
                .to_string(),
        },
        "cluster" => Identity::Cluster {
            name: spec.get("cluster")?.as_str()?.to_string(),
        },
        "bootstrap" => Identity::Bootstrap {
            name: spec.get("cluster")?.as_str()?.to_string(),
        },
        "user" => Identity::User {
            name: spec.get("user")?.as_str()?.to_string(),
            groups: spec
                .get("groups")
                .and_then(|g| g.as_array())
                .into_iter()
                .flatten()
                .filter_map(|g| g.as_str().map(str::to_string))
                .collect(),
        },
        "serviceaccount" => {
            let sa = spec.get("serviceAccount")?;
            let field = |k: &str| sa.get(k).and_then(|v| v.as_str()).map(str::to_string);
            Identity::ServiceAccount {
                namespace: field("namespace")?,
                name: field("name")?,
                uid: field("uid")?,
            }
        }
        _ => return None,
    };
    let expires = spec
        .get("expires")
        .and_then(|e| e.as_str())
        .and_then(|e| e.parse().ok());
    Some((
        obj.name().to_string(),
        Record {
            hash,
            identity,
            expires,
            unregistered: spec.get("unregistered").is_some(),
        },
    ))
}

impl Authenticator {
    /// Loads the tokens and starts following changes to them (the project's reflector:
    /// resumed after a broken watch, listed again only when the history is gone). Returns
    /// once the first listing is in, so no request meets an empty cache.
    pub async fn start(store: Arc<dyn Store>) -> Result<Arc<Self>, StoreError> {
        use orrery_runtime::reflector::{self, Event};
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let mut events = reflector::spawn(store.clone(), PREFIX.to_string(), stopped);
        let tokens: Arc<RwLock<HashMap<String, Record>>> = Arc::default();
        let apply = |tokens: &RwLock<HashMap<String, Record>>, ev: Event| {
            let mut t = tokens.write();
            match ev {
                Event::Listed(items) => {
                    *t = items.iter().filter_map(|o| record_of(o)).collect();
                }
                Event::Upsert(o) => {
                    if let Some((id, r)) = record_of(&o) {
                        t.insert(id, r);
                    }
                }
                Event::Delete(o) => {
                    t.remove(o.name());
                }
            }
        };
        match events.recv().await {
            Some(first @ Event::Listed(_)) => apply(&tokens, first),
            _ => return Err(StoreError::Closed),
        }
        let auth = Arc::new(Authenticator {
            store,
            tokens: tokens.clone(),
            health: events.health(),
            _following: Arc::new(stop),
        });
        tokio::spawn(async move {
            while let Some(ev) = events.recv().await {
                apply(&tokens, ev);
            }
        });
        Ok(auth)
    }

    /// Why the token cache is not in step with the store, if it is not (for `/readyz`).
    pub fn out_of_step(&self) -> Option<String> {
        self.health
            .out_of_step(CACHE_TOLERANCE)
            .map(|why| format!("the token cache is out of step with the store: {why}"))
    }

    /// The reflector behind the token cache (for `/metrics`).
    pub fn health(&self) -> &orrery_runtime::reflector::Health {
        &self.health
    }

    /// The same tokens, with writes (issuing, revoking) made through `store`: the leader's
    /// controllers pass their fenced store, so a former leader revokes nothing.
    pub fn writing_through(&self, store: Arc<dyn Store>) -> Authenticator {
        Authenticator {
            store,
            tokens: self.tokens.clone(),
            health: self.health.clone(),
            _following: self._following.clone(),
        }
    }

    /// The identity behind an `Authorization` header value.
    pub fn authenticate(&self, header: Option<&str>) -> Result<Identity, ApiError> {
        let token = header
            .and_then(|h| {
                h.strip_prefix("Bearer ")
                    .or_else(|| h.strip_prefix("bearer "))
            })
            .map(str::trim)
            .ok_or_else(ApiError::unauthorized)?;
        match self.lookup(token) {
            Some(Record {
                unregistered: true,
                identity: Identity::Cluster { name },
                ..
            }) => Err(ApiError::new(
                404,
                "NotFound",
                format!("cluster \"{name}\" was unregistered; this agent token no longer works"),
            )),
            Some(r) if !r.unregistered => Ok(r.identity),
            _ => Err(ApiError::unauthorized()),
        }
    }

    /// The identity a raw token grants, if it is valid.
    pub fn verify(&self, token: &str) -> Option<Identity> {
        self.lookup(token)
            .filter(|r| !r.unregistered)
            .map(|r| r.identity)
    }

    /// The unexpired record a raw token matches (a tombstone included).
    fn lookup(&self, token: &str) -> Option<Record> {
        let (id, secret) = token.split_once('.')?;
        let tokens = self.tokens.read();
        let rec = tokens.get(id)?;
        if !same(&rec.hash, &digest(secret)) || rec.expired(Time::now()) {
            return None;
        }
        Some(rec.clone())
    }

    /// Creates a token for `identity` and returns it; only its hash is stored.
    pub async fn issue(
        &self,
        identity: &Identity,
        description: &str,
        ttl: Option<Duration>,
    ) -> Result<String, ApiError> {
        // Ids are unique across every key a token may live under (the store's create only
        // refuses a duplicate under the same key): one not in use, as far as this server
        // knows.
        let mut id = random_hex(4)?;
        while self.tokens.read().contains_key(&id) {
            id = random_hex(4)?;
        }
        let secret = random_hex(16)?;
        let hash: String = digest(&secret).iter().map(|b| format!("{b:02x}")).collect();
        let (role, extra) = match identity {
            Identity::Admin { name } => ("admin", json!({ "user": name })),
            Identity::Cluster { name } => ("cluster", json!({ "cluster": name })),
            Identity::Bootstrap { name } => ("bootstrap", json!({ "cluster": name })),
            Identity::User { name, groups } => ("user", json!({ "user": name, "groups": groups })),
            Identity::ServiceAccount {
                namespace,
                name,
                uid,
            } => (
                "serviceaccount",
                json!({ "serviceAccount": {"namespace": namespace, "name": name, "uid": uid} }),
            ),
        };
        let mut spec = json!({ "secretHash": hash, "role": role, "description": description });
        if let (Some(m), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
            m.extend(e.clone());
        }
        if let Some(ttl) = ttl
            && let Some(at) =
                Time::from_unix_seconds(Time::now().unix_seconds() + ttl.as_secs() as i64)
        {
            spec["expires"] = json!(at.to_string());
        }
        let mut obj = Object::new("internal.orrery.io/v1", "Token")
            .with_name(&id)
            .with_spec(spec);
        obj.metadata.creation_timestamp = Some(Time::now());
        let key = keys_of(&id, identity).swap_remove(0);
        let stored = self.store.create(&key, obj).await?;
        // Make the token usable at once, before the watch delivers it.
        if let Some((id, r)) = record_of(&stored) {
            self.tokens.write().insert(id, r);
        }
        Ok(format!("{id}.{secret}"))
    }

    /// Revokes the tokens of a cluster. `Revoke::Retire` (an agent registers anew) deletes its
    /// earlier agents' tokens; `Revoke::Unregister` deletes its bootstrap tokens and turns its
    /// agent tokens into tombstones. Either way, expired records of any cluster are swept.
    /// Returns how many of the cluster's tokens stopped working.
    pub async fn revoke_cluster(&self, cluster: &str, how: Revoke) -> Result<usize, StoreError> {
        let now = Time::now();
        // The cluster's own tokens as the store has them now (one issued a moment ago through
        // another replica included); then, from the in-memory copy, its tokens stored where
        // earlier versions kept them, and expired tokens of any cluster.
        let mut targets: Vec<(String, Record, Option<Stored>)> = Vec::new();
        let prefix = cluster_prefix(cluster);
        let own = self.store.list(&prefix, &ListOptions::default()).await?;
        for o in own.items {
            if let Some((id, rec)) = record_of(&o) {
                let key = format!("{prefix}{id}");
                targets.push((id, rec, Some((key, o))));
            }
        }
        {
            let tokens = self.tokens.read();
            for (id, rec) in tokens.iter() {
                let mine = matches!(&rec.identity,
                    Identity::Cluster { name } | Identity::Bootstrap { name } if name == cluster);
                if (mine || rec.expired(now)) && !targets.iter().any(|(t, _, _)| t == id) {
                    targets.push((id.clone(), rec.clone(), None));
                }
            }
        }
        let mut n = 0;
        for (id, rec, found) in targets {
            let action = match (&rec.identity, how) {
                _ if rec.expired(now) => Action::Delete,
                (Identity::Cluster { name }, Revoke::Retire) if name == cluster => Action::Delete,
                (Identity::Cluster { name }, Revoke::Unregister) if name == cluster => {
                    if rec.unregistered {
                        continue;
                    }
                    Action::Tombstone
                }
                (Identity::Bootstrap { name }, Revoke::Unregister) if name == cluster => {
                    Action::Delete
                }
                _ => continue,
            };
            let found = match found {
                Some(f) => Some(f),
                None => self.locate(&id, &rec.identity).await?,
            };
            let Some((key, o)) = found else {
                // Gone from the store already (deleted through another replica).
                self.forget(&id);
                continue;
            };
            if !rec.unregistered && !rec.expired(now) {
                n += 1;
            }
            match action {
                Action::Delete => {
                    match self.store.delete(&key, &Default::default()).await {
                        Ok(_) | Err(StoreError::NotFound { .. }) => {}
                        Err(e) => return Err(e),
                    }
                    self.forget(&id);
                }
                Action::Tombstone => {
                    let mut t = o.clone();
                    if let Some(spec) = t.spec.as_mut().and_then(|s| s.as_object_mut()) {
                        spec.insert("unregistered".into(), json!(now.to_string()));
                        if let Some(at) = Time::from_unix_seconds(
                            now.unix_seconds() + TOMBSTONE_TTL.as_secs() as i64,
                        ) {
                            spec.insert("expires".into(), json!(at.to_string()));
                        }
                    }
                    let stored = self.store.update(&key, t, o.revision()).await?;
                    if let Some((id, r)) = record_of(&stored) {
                        self.tokens.write().insert(id, r);
                    }
                }
            }
        }
        Ok(n)
    }

    /// When the newest agent token of `cluster` still in force was issued (its agent's
    /// registration), as the store has it.
    pub async fn newest_agent_token(&self, cluster: &str) -> Result<Option<Time>, StoreError> {
        let now = Time::now();
        let own = self
            .store
            .list(&cluster_prefix(cluster), &ListOptions::default())
            .await?;
        Ok(own
            .items
            .iter()
            .filter(|o| {
                record_of(o).is_some_and(|(_, r)| {
                    matches!(&r.identity, Identity::Cluster { name } if name == cluster)
                        && !r.unregistered
                        && !r.expired(now)
                })
            })
            .filter_map(|o| o.metadata.creation_timestamp)
            .max())
    }

    /// Where a token is stored, and what is stored there.
    async fn locate(&self, id: &str, identity: &Identity) -> Result<Option<Stored>, StoreError> {
        for key in keys_of(id, identity) {
            match self.store.get(&key).await {
                Ok(o) => return Ok(Some((key, o))),
                Err(StoreError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }

    fn forget(&self, id: &str) {
        self.tokens.write().remove(id);
    }

    /// Whether any admin token exists (first start creates one).
    pub fn has_admin(&self) -> bool {
        self.tokens
            .read()
            .values()
            .any(|r| matches!(r.identity, Identity::Admin { .. }))
    }
}

/// Why a cluster's tokens are revoked (see [`Authenticator::revoke_cluster`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Revoke {
    /// A new agent registered: the earlier agents' tokens go.
    Retire,
    /// The cluster was unregistered: every token goes; agent tokens leave tombstones.
    Unregister,
}

enum Action {
    Delete,
    Tombstone,
}

/// The subject of a client certificate the TLS layer verified against Orrery's CA, put on
/// the request for [`crate::App::authenticate`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientCert {
    /// The certificate's CommonName.
    pub user: String,
    /// Its Organization values.
    pub groups: Vec<String>,
}

impl ClientCert {
    /// The subject of a DER certificate (already verified), if it names a user.
    pub fn of_der(der: &[u8]) -> Option<ClientCert> {
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let subject = cert.subject();
        let user = subject
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())?
            .to_string();
        if user.is_empty() {
            return None;
        }
        let groups = subject
            .iter_organization()
            .filter_map(|o| o.as_str().ok().map(str::to_string))
            .collect();
        Some(ClientCert { user, groups })
    }
}

/// What a request asks to do, for authorization.
#[derive(Clone, Debug, Default)]
pub struct Attributes<'a> {
    pub verb: &'a str,
    pub group: &'a str,
    pub resource: &'a str,
    pub subresource: Option<&'a str>,
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
}

/// The namespace that holds a member cluster's Works.
pub fn cluster_namespace(cluster: &str) -> String {
    format!("orrery-cluster-{cluster}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn unregistering_leaves_tombstones_that_say_why_and_reregistering_clears_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store: Arc<dyn Store> = Arc::new(
            orrery_store_sqlite::SqliteStore::open_dir(dir.path()).expect("open the store"),
        );
        let auth = Authenticator::start(store.clone()).await.expect("start");
        let east = Identity::Cluster {
            name: "east".into(),
        };
        let agent = auth.issue(&east, "agent", None).await.expect("issue");
        let boot = Identity::Bootstrap {
            name: "east".into(),
        };
        let bootstrap = auth.issue(&boot, "boot", None).await.expect("issue");
        let west = Identity::Cluster {
            name: "west".into(),
        };
        let other = auth.issue(&west, "west agent", None).await.expect("issue");
        let header = |t: &str| format!("Bearer {t}");
        // The status a refused token gets.
        let refused = |a: &Authenticator, t: &str| {
            a.authenticate(Some(&header(t)))
                .expect_err("the token is refused")
                .code
        };

        assert_eq!(
            auth.revoke_cluster("east", Revoke::Unregister)
                .await
                .expect("revoke"),
            2
        );
        let err = auth
            .authenticate(Some(&header(&agent)))
            .expect_err("the agent token is refused");
        assert_eq!(err.code, 404, "{err:?}");
        assert!(err.message.contains("\"east\" was unregistered"), "{err:?}");
        assert!(auth.verify(&agent).is_none(), "a tombstone grants nothing");
        assert_eq!(refused(&auth, &bootstrap), 401, "bootstrap gone");
        // A wrong secret with the tombstone's id learns nothing.
        let (id, _) = agent.split_once('.').expect("id.secret");
        assert_eq!(refused(&auth, &format!("{id}.00")), 401, "wrong secret");
        assert_eq!(
            auth.verify(&other),
            Some(west.clone()),
            "other clusters keep theirs"
        );
        // Unregistering again revokes nothing more and keeps the tombstone.
        assert_eq!(
            auth.revoke_cluster("east", Revoke::Unregister)
                .await
                .expect("revoke"),
            0
        );
        assert_eq!(refused(&auth, &agent), 404, "still refused");
        // A fresh Authenticator over the same store reads the tombstone back.
        let again = Authenticator::start(store.clone()).await.expect("restart");
        assert_eq!(refused(&again, &agent), 404);
        // Registering the name again retires the tombstone: a plain 401 from then on.
        assert_eq!(
            auth.revoke_cluster("east", Revoke::Retire)
                .await
                .expect("retire"),
            0
        );
        assert_eq!(refused(&auth, &agent), 401);
        assert_eq!(auth.verify(&other), Some(west));
    }

    /// Tokens stored where earlier versions kept them (directly under the prefix) are still
    /// retired and tombstoned; a new token goes under its cluster; expired tokens of any
    /// cluster are swept.
    #[tokio::test]
    async fn tokens_kept_by_earlier_versions_are_revoked_too() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store: Arc<dyn Store> = Arc::new(
            orrery_store_sqlite::SqliteStore::open_dir(dir.path()).expect("open the store"),
        );
        let stored = |id: &str, cluster: &str, expires: Option<&str>| {
            let hash: String = digest("s3cret")
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            let mut spec = json!({"secretHash": hash, "role": "cluster", "cluster": cluster});
            if let Some(e) = expires {
                spec["expires"] = json!(e);
            }
            Object::new("internal.orrery.io/v1", "Token")
                .with_name(id)
                .with_spec(spec)
        };
        store
            .create(
                "/internal/tokens/0ld0ld00",
                stored("0ld0ld00", "east", None),
            )
            .await
            .expect("create");
        store
            .create(
                "/internal/tokens/ex0ired0",
                stored("ex0ired0", "west", Some("2020-01-01T00:00:00Z")),
            )
            .await
            .expect("create");
        let auth = Authenticator::start(store.clone()).await.expect("start");
        let east = Identity::Cluster {
            name: "east".into(),
        };
        assert_eq!(auth.verify("0ld0ld00.s3cret"), Some(east.clone()));
        let new = auth.issue(&east, "agent", None).await.expect("issue");
        let (new_id, _) = new.split_once('.').expect("id.secret");
        store
            .get(&format!("/internal/tokens/clusters/east/{new_id}"))
            .await
            .expect("stored under its cluster");
        assert_eq!(
            auth.revoke_cluster("east", Revoke::Unregister)
                .await
                .expect("revoke"),
            2
        );
        assert_eq!(
            auth.authenticate(Some("Bearer 0ld0ld00.s3cret"))
                .expect_err("refused")
                .code,
            404,
            "the old token is a tombstone"
        );
        assert!(matches!(
            store.get("/internal/tokens/ex0ired0").await,
            Err(StoreError::NotFound { .. })
        ));
        assert_eq!(
            auth.revoke_cluster("east", Revoke::Retire)
                .await
                .expect("retire"),
            0
        );
        let left = store
            .list("/internal/tokens/", &ListOptions::default())
            .await
            .expect("list");
        assert!(left.items.is_empty(), "{:?}", left.items);
    }

    #[test]
    fn digests_compare_fully() {
        assert!(same(&digest("a"), &digest("a")));
        assert!(!same(&digest("a"), &digest("b")));
    }
}
