//! The cluster inventory for the ecosystem (SIG-Multicluster KEP-4322): each Cluster is
//! mirrored into a `ClusterProfile` in `orrery-system`, owned by the Cluster (so it goes with
//! it), carrying the Kubernetes version, the member's ClusterProperty values (KEP-2149) and
//! location facts as properties, and the conditions ControlPlaneHealthy and Joined.

use std::collections::HashMap;
use std::sync::Arc;

use orrery_api::cluster::{CONDITION_JOINED, CONDITION_READY, ClusterSpec, ClusterStatus};
use orrery_api::conditions::{self, Condition};
use orrery_api::{Object, OwnerReference, Time, keys};
use orrery_store::{Preconditions, Store, StoreError};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::runtime::controller::{Action, Controller, Keys, Origin, Reconciler, Source};
use crate::runtime::metrics::Handle;
use crate::runtime::reflector::Event;
use orrery_store::stamp::new_object;

/// Where ClusterProfiles live.
pub const NAMESPACE: &str = "orrery-system";
pub const MANAGER_LABEL: &str = "x-k8s.io/cluster-manager";
pub const MANAGER: &str = "orrery";

/// Where each cluster's proxy identity lives. `orrery credentials` (a KEP-5339 credentials
/// plugin) mints its short-lived tokens: whoever may create `serviceaccounts/token` in this
/// namespace (which holds nothing else) may reach the clusters, one token per cluster.
pub use orrery_api::cluster::PROXY_NAMESPACE;

/// The kubeconfig extension a KEP-5339 plugin receives as `spec.cluster.config`.
pub const EXEC_EXTENSION: &str = "client.authentication.k8s.io/exec";

/// The ClusterRole (and its binding) that lets cluster `c`'s proxy identity reach its proxy.
pub fn proxy_role_name(cluster: &str) -> String {
    format!("orrery:cluster-proxy:{cluster}")
}

/// How consumers reach members through Orrery: the server's URL and CA, for the profiles'
/// access providers (the cluster proxy).
#[derive(Debug, Clone, Default)]
pub struct Settings {
    pub access: Option<Access>,
    /// Members' namespaces where a copy of every profile is kept too.
    pub publish: Vec<Publication>,
}

/// A copy of the profiles kept outside the control plane, in a member's namespace, for a
/// consumer that reads them from the cluster it runs in (Kueue's MultiKueue reads them in its
/// own namespace): one Work per profile, status included, applied by the member's agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publication {
    pub cluster: String,
    pub namespace: String,
}

impl std::str::FromStr for Publication {
    type Err = String;

    /// `CLUSTER/NAMESPACE`, both DNS labels.
    fn from_str(s: &str) -> Result<Self, String> {
        let (cluster, namespace) = s
            .split_once('/')
            .ok_or_else(|| format!("{s:?} is not CLUSTER/NAMESPACE"))?;
        for (what, v) in [("cluster", cluster), ("namespace", namespace)] {
            let errors = orrery_api::validation::is_dns1123_label(v);
            if !errors.is_empty() {
                return Err(format!("{s:?}: the {what} {v:?}: {}", errors.join("; ")));
            }
        }
        Ok(Publication {
            cluster: cluster.to_string(),
            namespace: namespace.to_string(),
        })
    }
}

/// The label of a Work that keeps a profile in a member: the profile's cluster.
pub const PUBLISHED_LABEL: &str = "inventory.multicluster.io/profile-of";

impl Publication {
    /// The Work keeping cluster `profiled`'s profile here.
    fn work_key(&self, profiled: &str) -> String {
        keys::well_known::work(
            &orrery_api::cluster::namespace_of(&self.cluster),
            &format!("clusterprofile.{}.{profiled}", self.namespace),
        )
    }
}

/// The spec of the Work that keeps `profile` in `to`: the profile as the control plane has
/// it, its status too (what a consumer reads), in `to`'s namespace.
fn published_spec(profile: &Object, to: &Publication) -> Value {
    let labels: serde_json::Map<String, Value> = [MANAGER_LABEL, "multicluster.io/cluster"]
        .into_iter()
        .filter_map(|k| Some((k.to_string(), json!(profile.labels().get(k)?))))
        .collect();
    json!({ "workload": { "manifests": [{
        "apiVersion": "multicluster.x-k8s.io/v1alpha1",
        "kind": "ClusterProfile",
        "metadata": { "name": profile.name(), "namespace": to.namespace, "labels": labels },
        "spec": profile.spec,
        "status": profile.status,
    }]}})
}

/// Keeps `profile` in each of the places `to` names, as the store has it now. The Works are
/// owned by the profile's Cluster, so they go with it.
async fn publish(
    store: &dyn Store,
    to: &[Publication],
    profile: &Object,
) -> Result<(), StoreError> {
    for p in to {
        let key = p.work_key(profile.name());
        let spec = published_spec(profile, p);
        match store.get_recent(&key).await {
            Ok(w) if w.spec.as_ref() == Some(&spec) => {}
            Ok(w) => {
                let revision = w.revision();
                let mut next = Arc::unwrap_or_clone(w);
                next.spec = Some(spec);
                next.metadata.generation = Some(next.metadata.generation.unwrap_or(1) + 1);
                match store.update(&key, next, revision).await {
                    // A copy behind the latest: written again at the next look.
                    Ok(_) | Err(StoreError::Conflict { .. }) | Err(StoreError::NotFound { .. }) => {
                    }
                    Err(e) => return Err(e),
                }
            }
            Err(StoreError::NotFound { .. }) => {
                let ns = orrery_api::cluster::namespace_of(&p.cluster);
                let name = key.rsplit('/').next().unwrap_or_default();
                let mut w = new_object("multicluster.io/v1alpha1", "Work", Some(&ns), name);
                w.metadata
                    .labels
                    .insert(PUBLISHED_LABEL.to_string(), profile.name().to_string());
                w.metadata.owner_references = profile.metadata.owner_references.clone();
                w.spec = Some(spec);
                match store.create(&key, w).await {
                    Ok(_)
                    | Err(StoreError::AlreadyExists { .. })
                    | Err(StoreError::NotFound { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Keeps cluster `name`'s profile, if there is one, where `to` says.
async fn publish_one(store: &dyn Store, to: &[Publication], name: &str) -> Result<(), StoreError> {
    if to.is_empty() {
        return Ok(());
    }
    match store
        .get_recent(&keys::well_known::cluster_profile(NAMESPACE, name))
        .await
    {
        Ok(p) => publish(store, to, &p).await,
        Err(StoreError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Removes the published Works that no longer should be: of a cluster gone, or in a place no
/// longer named (the settings changed between runs).
async fn unpublish_stale(
    store: &dyn Store,
    to: &[Publication],
    names: &std::collections::HashSet<String>,
) -> Result<(), StoreError> {
    let selector = orrery_api::labels::Selector::parse(PUBLISHED_LABEL)
        .map_err(|e| StoreError::InvalidArgument(e.to_string()))?;
    let works = store
        .list(
            &keys::well_known::works(None),
            &orrery_store::ListOptions::default().with_labels(selector),
        )
        .await?;
    for w in &works.items {
        let profiled = w
            .labels()
            .get(PUBLISHED_LABEL)
            .map(String::as_str)
            .unwrap_or("");
        let key = keys::well_known::work(w.namespace(), w.name());
        let wanted = names.contains(profiled) && to.iter().any(|p| p.work_key(profiled) == key);
        if !wanted {
            match store.delete(&key, &Preconditions::default()).await {
                Ok(_) | Err(StoreError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

#[derive(Debug, Clone)]
pub struct Access {
    /// The server's URL, e.g. `https://orrery.example:6443`.
    pub server: String,
    /// Its CA, PEM.
    pub ca_pem: String,
}

impl Access {
    /// The access provider of one cluster (KEP-4322: a name and a kubeconfig `cluster`): the
    /// cluster proxy's endpoint, the server's CA, and for an exec plugin (`orrery
    /// credentials`, or any that reads it) the cluster's name in the reserved extension.
    pub fn provider(&self, cluster: &str) -> Value {
        use base64::Engine;
        json!({
            "name": MANAGER,
            "cluster": {
                "server": format!(
                    "{}/apis/multicluster.io/v1alpha1/clusters/{cluster}/proxy",
                    self.server.trim_end_matches('/')
                ),
                "certificate-authority-data":
                    base64::engine::general_purpose::STANDARD.encode(&self.ca_pem),
                "extensions": [{ "name": EXEC_EXTENSION, "extension": { "clusterName": cluster } }],
            },
        })
    }
}

/// The ClusterProfile a Cluster calls for: (labels, spec, status).
pub fn profile_of(
    c: &Object,
    previous: Option<&Object>,
    access: Option<&Access>,
) -> (Value, Value, Value) {
    let spec = ClusterSpec::of(c);
    let st = ClusterStatus::of(c);
    let mut props: Vec<(String, String)> = st.properties.clone().into_iter().collect();
    for (k, v) in [
        ("region.multicluster.io", spec.region.clone()),
        ("provider.multicluster.io", spec.provider.clone()),
        ("zones.multicluster.io", spec.zones.join(",")),
    ] {
        if !v.is_empty() {
            props.push((k.to_string(), v));
        }
    }
    props.sort();
    // A property keeps the time it was first seen with its current value.
    let before: HashMap<String, (String, Value)> = previous
        .and_then(|p| p.status.as_ref())
        .and_then(|s| s.get("properties"))
        .and_then(Value::as_array)
        .map(|ps| {
            ps.iter()
                .filter_map(|p| {
                    Some((
                        p.get("name")?.as_str()?.to_string(),
                        (
                            p.get("value")?.as_str()?.to_string(),
                            p.get("lastObservedTime").cloned().unwrap_or(Value::Null),
                        ),
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    let now = Time::now().to_string();
    let properties: Vec<Value> = props
        .into_iter()
        .map(|(name, value)| {
            let t = match before.get(&name) {
                Some((v, t)) if *v == value && !t.is_null() => t.clone(),
                _ => json!(now),
            };
            json!({ "name": name, "value": value, "lastObservedTime": t })
        })
        .collect();
    let mut conds: Vec<Condition> = previous
        .and_then(|p| p.status.as_ref())
        .and_then(|s| s.get("conditions"))
        .and_then(|c| serde_json::from_value(c.clone()).ok())
        .unwrap_or_default();
    let t = Time::now();
    let healthy = match conditions::find(&st.conditions, CONDITION_READY) {
        Some(r) => Condition::new(
            "ControlPlaneHealthy",
            &r.status,
            &r.reason,
            r.message.clone(),
        ),
        None => Condition::new(
            "ControlPlaneHealthy",
            conditions::UNKNOWN,
            "NoReport",
            "the cluster has not reported yet",
        ),
    };
    conditions::set(&mut conds, healthy, t);
    let joined = match conditions::find(&st.conditions, CONDITION_JOINED) {
        Some(j) => Condition::new("Joined", &j.status, &j.reason, j.message.clone()),
        None => Condition::new(
            "Joined",
            conditions::FALSE,
            "NotJoined",
            "no agent has registered the cluster",
        ),
    };
    conditions::set(&mut conds, joined, t);
    let labels = json!({ MANAGER_LABEL: MANAGER, "multicluster.io/cluster": c.name() });
    let spec = json!({ "displayName": c.name(), "clusterManager": { "name": MANAGER } });
    let mut status = json!({
        "version": { "kubernetes": st.kubernetes_version },
        "properties": properties,
        "conditions": conds,
    });
    if let Some(a) = access {
        // `accessProviders` (the KEP's name now) and `credentialProviders` (its name before,
        // which consumers of earlier releases read).
        let providers = json!([a.provider(c.name())]);
        status["accessProviders"] = providers.clone();
        status["credentialProviders"] = providers;
    }
    (labels, spec, status)
}

/// Whether two condition lists say the same, transition times aside.
fn same_conditions(a: &Value, b: &Value) -> bool {
    let strip = |v: &Value| -> Vec<Value> {
        v.as_array()
            .map(|cs| {
                cs.iter()
                    .map(|c| {
                        let mut c = c.clone();
                        if let Some(m) = c.as_object_mut() {
                            m.remove("lastTransitionTime");
                        }
                        c
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    strip(a) == strip(b)
}

/// Profiles as last read or written, by cluster, as the hash of what is compared of them
/// ([`profile_digest`]): a Cluster changes with every heartbeat, its profile rarely, so most
/// events are settled without touching the store, and a parsed profile (about 14 KB) is not
/// kept for each of a fleet's members.
type Known = HashMap<String, u64>;

/// A hash of what of a profile the controller writes and compares, its times aside (when a
/// condition or property last changed).
fn profile_digest(spec: Option<&Value>, status: Option<&Value>) -> u64 {
    use std::hash::{Hash, Hasher};
    let text = |v: Option<&Value>| v.map(|v| v.to_string());
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text(spec).hash(&mut h);
    let st = status.unwrap_or(&Value::Null);
    for field in ["version", "accessProviders", "credentialProviders"] {
        text(st.get(field)).hash(&mut h);
    }
    for (list, fields) in [
        ("properties", &["name", "value"][..]),
        ("conditions", &["type", "status", "reason", "message"][..]),
    ] {
        for item in st.get(list).and_then(Value::as_array).into_iter().flatten() {
            for f in fields {
                text(item.get(*f)).hash(&mut h);
            }
        }
        // Where one list ends and the next begins.
        0xffu8.hash(&mut h);
    }
    h.finish()
}

async fn sync_one(
    store: &dyn Store,
    c: &Object,
    known: &parking_lot::Mutex<Known>,
    access: Option<&Access>,
) -> Result<(), StoreError> {
    let key = keys::well_known::cluster_profile(NAMESPACE, c.name());
    let (_, spec, status) = profile_of(c, None, access);
    let want = profile_digest(Some(&spec), Some(&status));
    if known.lock().get(c.name()) == Some(&want) {
        return Ok(());
    }
    // The store's own copy (most often the profile as this controller wrote it): no round
    // trip to etcd per change of a fleet's registration. A copy behind the latest fails the
    // write as a conflict, and is read again at the next change; one found unchanged is what
    // this replica last saw, as the parsed profile kept before was.
    let current = match store.get_recent(&key).await {
        Ok(o) => Some(Arc::unwrap_or_clone(o)),
        Err(StoreError::NotFound { .. }) => None,
        Err(e) => return Err(e),
    };
    let (labels, spec, status) = profile_of(c, current.as_ref(), access);
    match current {
        Some(cur) => {
            let cur_status = cur.status.as_ref().unwrap_or(&Value::Null);
            let unchanged = cur.spec.as_ref() == Some(&spec)
                && cur_status.get("version") == status.get("version")
                && cur_status.get("properties") == status.get("properties")
                && cur_status.get("accessProviders") == status.get("accessProviders")
                && same_conditions(
                    cur_status.get("conditions").unwrap_or(&Value::Null),
                    status.get("conditions").unwrap_or(&Value::Null),
                );
            if unchanged {
                known.lock().insert(c.name().to_string(), want);
                return Ok(());
            }
            let revision = cur.revision();
            let mut next = cur;
            next.spec = Some(spec);
            next.status = Some(status);
            match store.update(&key, next, revision).await {
                Ok(_) => {
                    known.lock().insert(c.name().to_string(), want);
                    Ok(())
                }
                // Changed by someone else: read it afresh next time.
                Err(StoreError::Conflict { .. }) | Err(StoreError::NotFound { .. }) => {
                    known.lock().remove(c.name());
                    Ok(())
                }
                Err(e) => Err(e),
            }
        }
        None => {
            let mut p = new_object(
                "multicluster.x-k8s.io/v1alpha1",
                "ClusterProfile",
                Some(NAMESPACE),
                c.name(),
            );
            p.metadata.labels = serde_json::from_value(labels).unwrap_or_default();
            p.metadata.owner_references = vec![OwnerReference::controller_of(c)];
            p.spec = Some(spec);
            p.status = Some(status);
            match store.create(&key, p).await {
                Ok(_) => {
                    known.lock().insert(c.name().to_string(), want);
                    Ok(())
                }
                Err(StoreError::AlreadyExists { .. }) => {
                    known.lock().remove(c.name());
                    Ok(())
                }
                Err(e) => Err(e),
            }
        }
    }
}

/// Cluster `c`'s proxy identity: its ServiceAccount, the ClusterRole allowing
/// `clusters/proxy` of `c` alone, and the binding between them; all owned by the Cluster.
fn proxy_identity(c: &Object) -> Vec<(String, Object)> {
    let name = c.name();
    let role = proxy_role_name(name);
    let own = |mut o: Object| {
        o.metadata.owner_references = vec![OwnerReference::controller_of(c)];
        o.metadata
            .labels
            .insert(MANAGER_LABEL.to_string(), MANAGER.to_string());
        o
    };
    let sa = own(new_object(
        "v1",
        "ServiceAccount",
        Some(PROXY_NAMESPACE),
        name,
    ));
    let mut cr = own(new_object(
        "rbac.authorization.k8s.io/v1",
        "ClusterRole",
        None,
        &role,
    ));
    cr.other.insert(
        "rules".into(),
        json!([{ "apiGroups": [orrery_api::cluster::GROUP], "resources": ["clusters/proxy"],
                 "resourceNames": [name],
                 "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"] }]),
    );
    let mut crb = own(new_object(
        "rbac.authorization.k8s.io/v1",
        "ClusterRoleBinding",
        None,
        &role,
    ));
    crb.other.insert(
        "roleRef".into(),
        json!({ "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role }),
    );
    crb.other.insert(
        "subjects".into(),
        json!([{ "kind": "ServiceAccount", "name": name, "namespace": PROXY_NAMESPACE }]),
    );
    vec![
        (
            keys::object("", "serviceaccounts", Some(PROXY_NAMESPACE), name),
            sa,
        ),
        (
            keys::object("rbac.authorization.k8s.io", "clusterroles", None, &role),
            cr,
        ),
        (
            keys::object(
                "rbac.authorization.k8s.io",
                "clusterrolebindings",
                None,
                &role,
            ),
            crb,
        ),
    ]
}

/// Makes cluster `c`'s proxy identity where it is missing (an edit of it is the
/// administrator's to make).
async fn ensure_proxy_identity(store: &dyn Store, c: &Object) -> Result<(), StoreError> {
    for (key, o) in proxy_identity(c) {
        match store.get_recent(&key).await {
            Ok(_) => continue,
            Err(StoreError::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
        match store.create(&key, o).await {
            Ok(_) | Err(StoreError::AlreadyExists { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

async fn remove(store: &dyn Store, to: &[Publication], name: &str) {
    // Decided from the Cluster as stored now: a profile goes only with its Cluster.
    match store.get(&keys::well_known::cluster(name)).await {
        Err(StoreError::NotFound { .. }) => {}
        Ok(_) => return,
        Err(e) => {
            tracing::warn!(cluster = name, error = %e, "reading the Cluster of a profile failed");
            return;
        }
    }
    let key = keys::well_known::cluster_profile(NAMESPACE, name);
    match store.delete(&key, &Preconditions::default()).await {
        Ok(_) | Err(StoreError::NotFound { .. }) => {}
        Err(e) => tracing::warn!(cluster = name, error = %e, "removing the ClusterProfile failed"),
    }
    // Its proxy identity goes with it (a token minted before stops working with its account),
    // and its copies.
    let role = proxy_role_name(name);
    let copies = to.iter().map(|p| p.work_key(name));
    for key in [
        keys::object("", "serviceaccounts", Some(PROXY_NAMESPACE), name),
        keys::object(
            "rbac.authorization.k8s.io",
            "clusterrolebindings",
            None,
            &role,
        ),
        keys::object("rbac.authorization.k8s.io", "clusterroles", None, &role),
    ]
    .into_iter()
    .chain(copies)
    {
        match store.delete(&key, &Preconditions::default()).await {
            Ok(_) | Err(StoreError::NotFound { .. }) => {}
            Err(e) => {
                tracing::warn!(cluster = name, error = %e, "removing the proxy identity failed")
            }
        }
    }
}

/// A hash of what a Cluster's profile is made of, read from the raw object: its identity,
/// labels, spec, and from its status the version, properties and conditions (without their
/// times).
fn profile_input(c: &Object) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    c.metadata.uid.hash(&mut h);
    c.metadata.labels.hash(&mut h);
    c.spec.as_ref().map(|s| s.to_string()).hash(&mut h);
    if let Some(st) = &c.status {
        st.get("kubernetesVersion")
            .map(|v| v.to_string())
            .hash(&mut h);
        st.get("properties").map(|v| v.to_string()).hash(&mut h);
        if let Some(cs) = st.get("conditions").and_then(Value::as_array) {
            for cond in cs {
                for k in ["type", "status", "reason", "message"] {
                    cond.get(k).map(|v| v.to_string()).hash(&mut h);
                }
            }
        }
    }
    h.finish()
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Key {
    /// After a listing: profiles of clusters that no longer exist go, the rest are known.
    Sweep,
    /// A cluster whose profile may have changed.
    Cluster(String),
    /// A deleted cluster: its profile goes.
    Gone(String),
}

struct Inventory {
    store: Arc<dyn Store>,
    settings: Settings,
    known: parking_lot::Mutex<Known>,
    /// The clusters there are.
    names: std::collections::HashSet<String>,
    /// What each cluster's profile was last made of, and when.
    last: HashMap<String, (u64, std::time::Instant)>,
    /// The clusters (by uid) whose proxy identity this replica has made or found.
    proxied: parking_lot::Mutex<std::collections::HashSet<String>>,
    /// Clusters whose profile waits to be looked at, as last seen (kept only until then: a
    /// parsed Cluster is about 25 KB).
    pending: parking_lot::Mutex<HashMap<String, Arc<Object>>>,
}

impl Inventory {
    fn consider(&mut self, c: Arc<Object>, keys: &mut Keys<Key>) {
        if c.metadata.deletion_timestamp.is_some() {
            return;
        }
        // Heartbeats and figures do not change a profile: skip the work unless what it is
        // made of changed, or a minute passed (which also repairs edits to the profile).
        let input = profile_input(&c);
        let now = std::time::Instant::now();
        if let Some((seen, at)) = self.last.get(c.name())
            && *seen == input
            && now.duration_since(*at) < std::time::Duration::from_secs(60)
        {
            return;
        }
        self.last.insert(c.name().to_string(), (input, now));
        keys.push(Key::Cluster(c.name().to_string()));
        self.pending.get_mut().insert(c.name().to_string(), c);
    }
}

#[async_trait::async_trait]
impl Reconciler for Inventory {
    type Key = Key;
    type Error = StoreError;

    fn on_event(&mut self, _: Origin, ev: Event, keys: &mut Keys<Key>) {
        match ev {
            Event::Listed(items) => {
                self.known.get_mut().clear();
                self.names = items.iter().map(|o| o.name().to_string()).collect();
                keys.push(Key::Sweep);
                for c in items {
                    self.consider(c, keys);
                }
            }
            Event::Upsert(c) => {
                // A member the profiles are kept in, seen for the first time: all of them
                // are written there (its namespace is new).
                if self.names.insert(c.name().to_string())
                    && self.settings.publish.iter().any(|p| p.cluster == c.name())
                {
                    keys.push(Key::Sweep);
                }
                self.consider(c, keys);
            }
            Event::Delete(c) => {
                self.names.remove(c.name());
                self.known.get_mut().remove(c.name());
                self.last.remove(c.name());
                self.pending.get_mut().remove(c.name());
                keys.push(Key::Gone(c.name().to_string()));
            }
        }
    }

    async fn reconcile(&self, key: &Key) -> Result<Action, StoreError> {
        match key {
            Key::Sweep => {
                let list = self
                    .store
                    .list(
                        &keys::well_known::cluster_profiles(Some(NAMESPACE)),
                        &Default::default(),
                    )
                    .await?;
                for p in list
                    .items
                    .iter()
                    .filter(|p| p.labels().get(MANAGER_LABEL).map(String::as_str) == Some(MANAGER))
                {
                    if self.names.contains(p.name()) {
                        let digest = profile_digest(p.spec.as_ref(), p.status.as_ref());
                        self.known
                            .lock()
                            .entry(p.name().to_string())
                            .or_insert(digest);
                    } else {
                        remove(self.store.as_ref(), &self.settings.publish, p.name()).await;
                    }
                }
                if !self.settings.publish.is_empty() {
                    unpublish_stale(self.store.as_ref(), &self.settings.publish, &self.names)
                        .await?;
                    for p in list.items.iter().filter(|p| self.names.contains(p.name())) {
                        publish(self.store.as_ref(), &self.settings.publish, p).await?;
                    }
                }
            }
            Key::Cluster(name) => {
                let Some(c) = self.pending.lock().remove(name) else {
                    return Ok(Action::Done);
                };
                let synced = sync_one(
                    self.store.as_ref(),
                    &c,
                    &self.known,
                    self.settings.access.as_ref(),
                )
                .await;
                let identity = match &synced {
                    Ok(())
                        if self.settings.access.is_some()
                            && self.proxied.lock().insert(c.metadata.uid.clone()) =>
                    {
                        ensure_proxy_identity(self.store.as_ref(), &c)
                            .await
                            .inspect_err(|_| {
                                self.proxied.lock().remove(&c.metadata.uid);
                            })
                    }
                    _ => Ok(()),
                };
                let published = match (&synced, &identity) {
                    (Ok(()), Ok(())) => {
                        publish_one(self.store.as_ref(), &self.settings.publish, name).await
                    }
                    _ => Ok(()),
                };
                if let Err(e) = synced.and(identity).and(published) {
                    // Tried again with what was seen, unless something newer came meanwhile.
                    self.pending.lock().entry(name.clone()).or_insert(c);
                    return Err(e);
                }
            }
            Key::Gone(name) => remove(self.store.as_ref(), &self.settings.publish, name).await,
        }
        Ok(Action::Done)
    }
}

/// Runs the controller until shutdown.
pub async fn run(
    store: Arc<dyn Store>,
    settings: Settings,
    metrics: Handle,
    shutdown: watch::Receiver<bool>,
) {
    let r = Inventory {
        store: store.clone(),
        settings,
        known: Default::default(),
        names: Default::default(),
        last: HashMap::new(),
        proxied: Default::default(),
        pending: Default::default(),
    };
    Controller::new("inventory", store, r, metrics)
        .source(Source::new("clusters", keys::well_known::clusters()))
        .run(shutdown)
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profile_is_known_by_what_it_says_not_by_when() {
        let status = |value: &str, ready: &str, at: &str| {
            json!({"version": {"kubernetes": "v1.32.0"},
                   "properties": [{"name": "region.multicluster.io", "value": value, "lastObservedTime": at}],
                   "conditions": [{"type": "ControlPlaneHealthy", "status": ready, "reason": "MemberHealthy",
                                   "lastTransitionTime": at}]})
        };
        let spec = json!({"displayName": "east", "clusterManager": {"name": "orrery"}});
        let d = |st: &Value| profile_digest(Some(&spec), Some(st));
        let base = d(&status("us-east", "True", "2026-01-01T00:00:00Z"));
        assert_eq!(
            base,
            d(&status("us-east", "True", "2026-02-02T00:00:00Z")),
            "times aside"
        );
        assert_ne!(
            base,
            d(&status("us-west", "True", "2026-01-01T00:00:00Z")),
            "a property"
        );
        assert_ne!(
            base,
            d(&status("us-east", "False", "2026-01-01T00:00:00Z")),
            "a condition"
        );
        let other_spec = json!({"displayName": "west", "clusterManager": {"name": "orrery"}});
        let st = status("us-east", "True", "2026-01-01T00:00:00Z");
        assert_ne!(
            base,
            profile_digest(Some(&other_spec), Some(&st)),
            "the spec"
        );
        let mut with_access = st.clone();
        with_access["accessProviders"] = json!([{"name": "orrery"}]);
        assert_ne!(base, d(&with_access), "access providers");
    }

    #[test]
    fn a_publication_is_a_member_and_a_namespace() {
        assert_eq!(
            "manager/kueue-system".parse::<Publication>().unwrap(),
            Publication {
                cluster: "manager".into(),
                namespace: "kueue-system".into()
            }
        );
        for (bad, says) in [
            ("manager", "CLUSTER/NAMESPACE"),
            ("manager/", "the namespace"),
            ("/kueue-system", "the cluster"),
            ("Manager/kueue-system", "the cluster"),
            ("manager/kueue/system", "the namespace"),
        ] {
            let e = bad.parse::<Publication>().unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn a_published_profile_is_the_profile_in_the_place_named_status_and_all() {
        let mut profile = new_object(
            "multicluster.x-k8s.io/v1alpha1",
            "ClusterProfile",
            Some(NAMESPACE),
            "east",
        );
        profile
            .metadata
            .labels
            .insert(MANAGER_LABEL.into(), MANAGER.into());
        profile
            .metadata
            .labels
            .insert("multicluster.io/cluster".into(), "east".into());
        profile
            .metadata
            .labels
            .insert("someone".into(), "else".into());
        profile.metadata.uid = "u".into();
        profile.spec = Some(json!({"displayName": "east", "clusterManager": {"name": "orrery"}}));
        profile.status = Some(json!({"accessProviders": [{"name": "orrery"}],
                                     "version": {"kubernetes": "v1.32.0"}}));
        let to: Publication = "manager/kueue-system".parse().unwrap();
        let spec = published_spec(&profile, &to);
        let m = &spec["workload"]["manifests"][0];
        assert_eq!(spec["workload"]["manifests"].as_array().unwrap().len(), 1);
        assert_eq!(m["kind"], "ClusterProfile");
        assert_eq!(
            m["metadata"],
            json!({"name": "east", "namespace": "kueue-system",
                   "labels": {MANAGER_LABEL: MANAGER, "multicluster.io/cluster": "east"}}),
            "no uid, no control-plane labels of others"
        );
        assert_eq!(m["spec"], profile.spec.clone().unwrap());
        assert_eq!(m["status"], profile.status.clone().unwrap());
        assert_eq!(
            to.work_key("east"),
            keys::well_known::work(
                &orrery_api::cluster::namespace_of("manager"),
                "clusterprofile.kueue-system.east"
            )
        );
    }

    #[test]
    fn profiles_mirror_clusters() {
        let c: Object = serde_json::from_value(json!({
            "apiVersion": "multicluster.io/v1alpha1", "kind": "Cluster", "metadata": {"name": "east", "uid": "u"},
            "spec": {"region": "us-east", "provider": "aws", "zones": ["a", "b"]},
            "status": {"kubernetesVersion": "v1.32.0",
                       "properties": {"cluster.clusterset.k8s.io": "east"},
                       "conditions": [{"type": "Ready", "status": "True", "reason": "MemberHealthy"},
                                      {"type": "Joined", "status": "True", "reason": "AgentRegistered"}]}
        }))
        .unwrap();
        let (labels, spec, status) = profile_of(&c, None, None);
        assert_eq!(labels[MANAGER_LABEL], "orrery");
        assert_eq!(spec["clusterManager"]["name"], "orrery");
        assert_eq!(status["version"]["kubernetes"], "v1.32.0");
        let names: Vec<&str> = status["properties"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "cluster.clusterset.k8s.io",
                "provider.multicluster.io",
                "region.multicluster.io",
                "zones.multicluster.io"
            ]
        );
        assert_eq!(status["conditions"][0]["type"], "ControlPlaneHealthy");
        assert_eq!(status["conditions"][0]["status"], "True");
        assert_eq!(status["conditions"][1]["status"], "True");
        // Unchanged values keep their observation time.
        let mut prev = new_object(
            "multicluster.x-k8s.io/v1alpha1",
            "ClusterProfile",
            Some(NAMESPACE),
            "east",
        );
        let mut old_status = status.clone();
        old_status["properties"][0]["lastObservedTime"] = json!("2020-01-01T00:00:00Z");
        prev.status = Some(old_status);
        let (_, _, again) = profile_of(&c, Some(&prev), None);
        assert_eq!(
            again["properties"][0]["lastObservedTime"],
            "2020-01-01T00:00:00Z"
        );
        assert!(same_conditions(&again["conditions"], &status["conditions"]));
    }
}
