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

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use orrery_api::{Object, Time};
use orrery_store::{ListOptions, Store, StoreError, WatchEvent, WatchOptions};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::error::ApiError;

const PREFIX: &str = "/internal/tokens/";

/// Who is calling.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Identity {
    /// Full access.
    Admin { name: String },
    /// A member cluster's agent: its own Works, its own status.
    Cluster { name: String },
    /// May register cluster `name` (and nothing else).
    Bootstrap { name: String },
}

impl Identity {
    /// The user name shown in logs and Forbidden messages.
    pub fn user(&self) -> String {
        match self {
            Identity::Admin { name } => name.clone(),
            Identity::Cluster { name } => format!("system:cluster:{name}"),
            Identity::Bootstrap { name } => format!("system:bootstrap:{name}"),
        }
    }
}

#[derive(Clone, Debug)]
struct Record {
    hash: [u8; 32],
    identity: Identity,
    expires: Option<Time>,
}

/// Verifies tokens against the stored hashes.
#[derive(Debug)]
pub struct Authenticator {
    store: Arc<dyn Store>,
    tokens: Arc<RwLock<HashMap<String, Record>>>,
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
        },
    ))
}

impl Authenticator {
    /// Loads the tokens and starts following changes to them.
    pub async fn start(store: Arc<dyn Store>) -> Result<Arc<Self>, StoreError> {
        let auth = Arc::new(Authenticator {
            store,
            tokens: Arc::new(RwLock::new(HashMap::new())),
        });
        let from = auth.reload().await?;
        let tokens = auth.tokens.clone();
        let store = auth.store.clone();
        tokio::spawn(async move {
            let mut from = from;
            loop {
                match store.watch(PREFIX, from, WatchOptions::default()).await {
                    Ok(mut w) => {
                        while let Some(ev) = w.next().await {
                            match ev {
                                Ok(WatchEvent::Added(o)) | Ok(WatchEvent::Modified(o)) => {
                                    from = o.revision().unwrap_or(from);
                                    if let Some((id, r)) = record_of(&o) {
                                        tokens
                                            .write()
                                            .unwrap_or_else(|p| p.into_inner())
                                            .insert(id, r);
                                    }
                                }
                                Ok(WatchEvent::Deleted(o)) => {
                                    from = o.revision().unwrap_or(from);
                                    tokens
                                        .write()
                                        .unwrap_or_else(|p| p.into_inner())
                                        .remove(o.name());
                                }
                                Ok(WatchEvent::Bookmark(r)) => from = r,
                                Err(_) => break,
                            }
                        }
                    }
                    Err(StoreError::Closed) => return,
                    Err(_) => {}
                }
                // Re-list after a broken or expired watch.
                tokio::time::sleep(Duration::from_millis(200)).await;
                match store.list(PREFIX, &ListOptions::default()).await {
                    Ok(list) => {
                        let fresh: HashMap<_, _> =
                            list.items.iter().filter_map(record_of).collect();
                        *tokens.write().unwrap_or_else(|p| p.into_inner()) = fresh;
                        from = list.revision;
                    }
                    Err(StoreError::Closed) => return,
                    Err(e) => tracing::warn!(error = %e, "re-reading tokens failed"),
                }
            }
        });
        Ok(auth)
    }

    async fn reload(&self) -> Result<i64, StoreError> {
        let list = self.store.list(PREFIX, &ListOptions::default()).await?;
        let fresh: HashMap<_, _> = list.items.iter().filter_map(record_of).collect();
        *self.tokens.write().unwrap_or_else(|p| p.into_inner()) = fresh;
        Ok(list.revision)
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
        self.verify(token).ok_or_else(ApiError::unauthorized)
    }

    /// The identity a raw token grants, if it is valid.
    pub fn verify(&self, token: &str) -> Option<Identity> {
        let (id, secret) = token.split_once('.')?;
        let tokens = self.tokens.read().unwrap_or_else(|p| p.into_inner());
        let rec = tokens.get(id)?;
        if !same(&rec.hash, &digest(secret)) {
            return None;
        }
        if rec.expires.is_some_and(|e| e <= Time::now()) {
            return None;
        }
        Some(rec.identity.clone())
    }

    /// Creates a token for `identity` and returns it; only its hash is stored.
    pub async fn issue(
        &self,
        identity: &Identity,
        description: &str,
        ttl: Option<Duration>,
    ) -> Result<String, ApiError> {
        let id = random_hex(4)?;
        let secret = random_hex(16)?;
        let hash: String = digest(&secret).iter().map(|b| format!("{b:02x}")).collect();
        let (role, extra) = match identity {
            Identity::Admin { name } => ("admin", json!({ "user": name })),
            Identity::Cluster { name } => ("cluster", json!({ "cluster": name })),
            Identity::Bootstrap { name } => ("bootstrap", json!({ "cluster": name })),
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
        let stored = self.store.create(&format!("{PREFIX}{id}"), obj).await?;
        // Make the token usable at once, before the watch delivers it.
        if let Some((id, r)) = record_of(&stored) {
            self.tokens
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id, r);
        }
        Ok(format!("{id}.{secret}"))
    }

    /// Removes the tokens of a cluster: its agents' (`bootstrap_too` = false, when an agent
    /// registers anew), or all of them (when the cluster is unregistered).
    pub async fn revoke_cluster(
        &self,
        cluster: &str,
        bootstrap_too: bool,
    ) -> Result<usize, StoreError> {
        let list = self.store.list(PREFIX, &ListOptions::default()).await?;
        let mut n = 0;
        for o in &list.items {
            let hit = match record_of(o).map(|(_, r)| r.identity) {
                Some(Identity::Cluster { name }) => name == cluster,
                Some(Identity::Bootstrap { name }) => bootstrap_too && name == cluster,
                _ => false,
            };
            if hit {
                self.store
                    .delete(&format!("{PREFIX}{}", o.name()), &Default::default())
                    .await?;
                self.tokens
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(o.name());
                n += 1;
            }
        }
        Ok(n)
    }

    /// Whether any admin token exists (first start creates one).
    pub fn has_admin(&self) -> bool {
        self.tokens
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .any(|r| matches!(r.identity, Identity::Admin { .. }))
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

/// Decides whether `who` may do `what`; a Forbidden error worded as Kubernetes words it if not.
pub fn authorize(who: &Identity, what: &Attributes<'_>) -> Result<(), ApiError> {
    let allowed = match who {
        Identity::Admin { .. } => true,
        // Bootstrap tokens only register (see `agent_api`); the resource API is closed to them.
        Identity::Bootstrap { .. } => false,
        Identity::Cluster { name } => {
            let own_ns = cluster_namespace(name);
            let reading = matches!(what.verb, "get" | "list" | "watch");
            let writing_status = matches!(what.verb, "get" | "update" | "patch")
                && what.subresource == Some("status");
            match (what.group, what.resource) {
                ("multicluster.io", "works") => {
                    what.namespace == Some(own_ns.as_str())
                        && ((reading && what.subresource.is_none()) || writing_status)
                }
                ("multicluster.io", "clusters") => {
                    what.name == Some(name.as_str())
                        && ((what.verb == "get" && what.subresource.is_none()) || writing_status)
                }
                _ => false,
            }
        }
    };
    if allowed {
        return Ok(());
    }
    let resource = if what.group.is_empty() {
        what.resource.to_string()
    } else {
        format!("{}.{}", what.resource, what.group)
    };
    let target = match what.name {
        Some(n) => format!("{resource} \"{n}\""),
        None => resource,
    };
    let full = match what.subresource {
        Some(s) => format!("{}/{s}", what.resource),
        None => what.resource.to_string(),
    };
    let scope = match what.namespace {
        Some(ns) => format!(" in the namespace \"{ns}\""),
        None => " at the cluster scope".to_string(),
    };
    Err(ApiError::forbidden(format!(
        "{target} is forbidden: User \"{}\" cannot {} resource \"{full}\" in API group \"{}\"{scope}",
        who.user(),
        what.verb,
        what.group
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs<'a>(
        verb: &'a str,
        resource: &'a str,
        sub: Option<&'a str>,
        ns: Option<&'a str>,
        name: Option<&'a str>,
    ) -> Attributes<'a> {
        Attributes {
            verb,
            group: "multicluster.io",
            resource,
            subresource: sub,
            namespace: ns,
            name,
        }
    }

    #[test]
    fn cluster_tokens_stay_in_their_lane() {
        let east = Identity::Cluster {
            name: "east".into(),
        };
        let ok = [
            attrs("list", "works", None, Some("orrery-cluster-east"), None),
            attrs("watch", "works", None, Some("orrery-cluster-east"), None),
            attrs("get", "works", None, Some("orrery-cluster-east"), Some("w")),
            attrs(
                "patch",
                "works",
                Some("status"),
                Some("orrery-cluster-east"),
                Some("w"),
            ),
            attrs("update", "clusters", Some("status"), None, Some("east")),
            attrs("get", "clusters", None, None, Some("east")),
        ];
        for a in &ok {
            assert!(authorize(&east, a).is_ok(), "{a:?}");
        }
        let denied = [
            attrs("list", "works", None, Some("orrery-cluster-west"), None),
            attrs(
                "patch",
                "works",
                Some("status"),
                Some("orrery-cluster-west"),
                Some("w"),
            ),
            attrs(
                "update",
                "works",
                None,
                Some("orrery-cluster-east"),
                Some("w"),
            ),
            attrs("create", "works", None, Some("orrery-cluster-east"), None),
            attrs("update", "clusters", Some("status"), None, Some("west")),
            attrs("update", "clusters", None, None, Some("east")),
            attrs("delete", "clusters", None, None, Some("east")),
            attrs("list", "clusters", None, None, None),
        ];
        for a in &denied {
            assert_eq!(authorize(&east, a).unwrap_err().code, 403, "{a:?}");
        }
        let e = authorize(
            &east,
            &attrs("list", "works", None, Some("orrery-cluster-west"), None),
        )
        .unwrap_err();
        assert_eq!(
            e.message,
            "works.multicluster.io is forbidden: User \"system:cluster:east\" cannot list resource \"works\" in API group \"multicluster.io\" in the namespace \"orrery-cluster-west\""
        );
        assert!(
            authorize(
                &Identity::Admin {
                    name: "admin".into()
                },
                &attrs("delete", "clusters", None, None, Some("x"))
            )
            .is_ok()
        );
    }

    #[test]
    fn digests_compare_fully() {
        assert!(same(&digest("a"), &digest("a")));
        assert!(!same(&digest("a"), &digest("b")));
    }
}
