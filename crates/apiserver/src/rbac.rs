//! Authorization: Kubernetes RBAC (`rbac.authorization.k8s.io/v1`) over built-in rules.
//!
//! Every surface asks [`Authorizer::authorize`] with the same [`Attributes`]: the REST
//! handlers, the DRO-DS endpoints (a DRO-DS call is the Kubernetes verb on the resource it
//! reads or writes) and the agent API. In order:
//! - `system:masters` (the admin) may do everything, as in Kubernetes, whatever the roles say;
//! - a member cluster's agent has built-in rules ([`agent_rules`]): its own Works and its own
//!   Cluster's status, nothing else;
//! - everyone's RBAC bindings, by user name and by group (`system:authenticated` included).
//!
//! Roles and bindings live in the store like any object; the authorizer keeps an index of
//! them in memory (bindings by subject, roles by name), kept current by watches and updated
//! in place, so a decision reads a few hash maps and never the store. Aggregated ClusterRoles
//! (`aggregationRule`) take the rules of the ClusterRoles their selectors match, computed
//! here as the index changes (Kubernetes writes them into the object; the decision is the
//! same). It also follows ServiceAccounts: a ServiceAccount token is good only while the
//! account it was issued for (same uid) exists.

pub mod defaults;
pub mod rules;

use parking_lot::RwLock;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use orrery_api::Object;
use orrery_api::labels::{LabelSelector, Selector};
use orrery_store::{Store, StoreError};
use serde_json::Value;

use crate::auth::{Attributes, Identity, cluster_namespace};
use crate::error::ApiError;
pub use rules::Rule;

pub const GROUP: &str = "rbac.authorization.k8s.io";

/// What the authorizer follows: the four RBAC kinds and ServiceAccounts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    ClusterRole,
    Role,
    ClusterRoleBinding,
    RoleBinding,
    ServiceAccount,
}

impl Kind {
    const ALL: [Kind; 5] = [
        Kind::ClusterRole,
        Kind::Role,
        Kind::ClusterRoleBinding,
        Kind::RoleBinding,
        Kind::ServiceAccount,
    ];

    fn prefix(self) -> String {
        let (group, plural) = match self {
            Kind::ClusterRole => (GROUP, "clusterroles"),
            Kind::Role => (GROUP, "roles"),
            Kind::ClusterRoleBinding => (GROUP, "clusterrolebindings"),
            Kind::RoleBinding => (GROUP, "rolebindings"),
            Kind::ServiceAccount => ("", "serviceaccounts"),
        };
        orrery_api::keys::prefix(group, plural, None)
    }

    /// The kind of an RBAC object by its `kind` field.
    pub fn of(kind: &str) -> Option<Kind> {
        Some(match kind {
            "ClusterRole" => Kind::ClusterRole,
            "Role" => Kind::Role,
            "ClusterRoleBinding" => Kind::ClusterRoleBinding,
            "RoleBinding" => Kind::RoleBinding,
            "ServiceAccount" => Kind::ServiceAccount,
            _ => return None,
        })
    }
}

/// The role a binding grants.
#[derive(Clone, Debug, PartialEq, Eq)]
enum RoleRef {
    ClusterRole(String),
    /// A Role in the binding's namespace.
    Role(String),
}

impl RoleRef {
    fn of(obj: &Object) -> Option<RoleRef> {
        let r = obj.other.get("roleRef")?;
        let name = r.get("name")?.as_str()?.to_string();
        match r.get("kind")?.as_str()? {
            "ClusterRole" => Some(RoleRef::ClusterRole(name)),
            "Role" => Some(RoleRef::Role(name)),
            _ => None,
        }
    }
}

/// One binding's grant to one subject.
#[derive(Clone, Debug)]
struct Grant {
    /// The binding's store key (to remove its grants when it changes).
    key: String,
    binding: String,
    role: RoleRef,
}

/// Grants by subject.
#[derive(Debug, Default)]
struct Subjects {
    users: HashMap<String, Vec<Grant>>,
    groups: HashMap<String, Vec<Grant>>,
}

impl Subjects {
    fn map(&mut self, group: bool) -> &mut HashMap<String, Vec<Grant>> {
        if group {
            &mut self.groups
        } else {
            &mut self.users
        }
    }

    /// The grants to `user` or any of `groups`, with the subject each was made to.
    fn of<'a>(
        &'a self,
        user: &'a str,
        groups: &'a [String],
    ) -> impl Iterator<Item = (&'a Grant, &'static str, &'a str)> + 'a {
        let users = self
            .users
            .get(user)
            .into_iter()
            .flatten()
            .map(move |g| (g, "User", user));
        let groups = groups.iter().flat_map(move |name| {
            self.groups
                .get(name.as_str())
                .into_iter()
                .flatten()
                .map(move |g| (g, "Group", name.as_str()))
        });
        users.chain(groups)
    }
}

/// A ClusterRole as stored: its own rules and, if aggregated, its selectors.
#[derive(Clone, Debug)]
struct ClusterRoleDef {
    labels: BTreeMap<String, String>,
    rules: Vec<Rule>,
    aggregation: Option<Vec<Selector>>,
}

/// Where one subject of a binding is indexed: the namespace (None: cluster-wide), group or
/// user, name.
type Slot = (Option<String>, bool, String);

/// The index decisions read.
#[derive(Debug, Default)]
struct Policy {
    cluster_role_defs: HashMap<String, ClusterRoleDef>,
    /// Effective rules: aggregation resolved.
    cluster_roles: HashMap<String, Arc<Vec<Rule>>>,
    roles: HashMap<String, HashMap<String, Arc<Vec<Rule>>>>,
    cluster_grants: Subjects,
    grants: HashMap<String, Subjects>,
    slots: HashMap<String, Vec<Slot>>,
    service_accounts: HashMap<(String, String), String>,
    /// The revision each key was last applied at: an older event (a watch catching up with a
    /// write already applied) is skipped.
    revisions: HashMap<String, i64>,
}

fn rules_of(obj: &Object) -> Vec<Rule> {
    obj.other
        .get("rules")
        .and_then(|r| serde_json::from_value(r.clone()).ok())
        .unwrap_or_default()
}

fn selectors_of(obj: &Object) -> Option<Vec<Selector>> {
    let sels = obj
        .other
        .get("aggregationRule")?
        .get("clusterRoleSelectors")?;
    let sels: Vec<LabelSelector> = serde_json::from_value(sels.clone()).ok()?;
    Some(sels.iter().filter_map(|s| s.to_selector().ok()).collect())
}

/// A binding's subjects as (group?, name): ServiceAccounts by the user name they act as.
fn subjects_of(obj: &Object) -> Vec<(bool, String)> {
    let Some(Value::Array(subjects)) = obj.other.get("subjects") else {
        return Vec::new();
    };
    subjects
        .iter()
        .filter_map(|s| {
            let name = s.get("name")?.as_str()?;
            match s.get("kind")?.as_str()? {
                "User" => Some((false, name.to_string())),
                "Group" => Some((true, name.to_string())),
                "ServiceAccount" => {
                    let ns = s
                        .get("namespace")
                        .and_then(Value::as_str)
                        .filter(|n| !n.is_empty())
                        .unwrap_or(&obj.metadata.namespace);
                    Some((false, format!("system:serviceaccount:{ns}:{name}")))
                }
                _ => None,
            }
        })
        .collect()
}

impl Policy {
    fn apply(&mut self, kind: Kind, key: &str, obj: Option<&Object>, revision: Option<i64>) {
        if let Some(r) = revision {
            if self.revisions.get(key).is_some_and(|seen| *seen > r) {
                return;
            }
            self.revisions.insert(key.to_string(), r);
        }
        match kind {
            Kind::ClusterRole => {
                let name = key.rsplit('/').next().unwrap_or_default().to_string();
                match obj {
                    Some(o) => {
                        self.cluster_role_defs.insert(
                            name,
                            ClusterRoleDef {
                                labels: o.metadata.labels.clone(),
                                rules: rules_of(o),
                                aggregation: selectors_of(o),
                            },
                        );
                    }
                    None => {
                        self.cluster_role_defs.remove(&name);
                    }
                }
                self.resolve_cluster_roles();
            }
            Kind::Role => {
                let mut parts = key.rsplit('/');
                let (name, ns) = (
                    parts.next().unwrap_or_default(),
                    parts.next().unwrap_or_default(),
                );
                match obj {
                    Some(o) => {
                        self.roles
                            .entry(ns.to_string())
                            .or_default()
                            .insert(name.to_string(), Arc::new(rules_of(o)));
                    }
                    None => {
                        if let Some(m) = self.roles.get_mut(ns) {
                            m.remove(name);
                        }
                    }
                }
            }
            Kind::ClusterRoleBinding | Kind::RoleBinding => {
                self.unbind(key);
                if let Some(o) = obj {
                    self.bind(kind, key, o);
                }
            }
            Kind::ServiceAccount => {
                let mut parts = key.rsplit('/');
                let (name, ns) = (
                    parts.next().unwrap_or_default(),
                    parts.next().unwrap_or_default(),
                );
                let id = (ns.to_string(), name.to_string());
                match obj {
                    Some(o) => {
                        self.service_accounts.insert(id, o.metadata.uid.clone());
                    }
                    None => {
                        self.service_accounts.remove(&id);
                    }
                }
            }
        }
    }

    fn bind(&mut self, kind: Kind, key: &str, obj: &Object) {
        let Some(role) = RoleRef::of(obj) else {
            return;
        };
        // A ClusterRoleBinding grants ClusterRoles only.
        let ns = match kind {
            Kind::RoleBinding => Some(obj.metadata.namespace.clone()),
            _ if matches!(role, RoleRef::Role(_)) => return,
            _ => None,
        };
        let mut slots = Vec::new();
        for (group, name) in subjects_of(obj) {
            let grant = Grant {
                key: key.to_string(),
                binding: obj.metadata.name.clone(),
                role: role.clone(),
            };
            let subjects = match &ns {
                Some(ns) => self.grants.entry(ns.clone()).or_default(),
                None => &mut self.cluster_grants,
            };
            subjects
                .map(group)
                .entry(name.clone())
                .or_default()
                .push(grant);
            slots.push((ns.clone(), group, name));
        }
        self.slots.insert(key.to_string(), slots);
    }

    fn unbind(&mut self, key: &str) {
        for (ns, group, name) in self.slots.remove(key).unwrap_or_default() {
            let subjects = match &ns {
                Some(ns) => match self.grants.get_mut(ns) {
                    Some(s) => s,
                    None => continue,
                },
                None => &mut self.cluster_grants,
            };
            let map = subjects.map(group);
            if let Some(v) = map.get_mut(&name) {
                v.retain(|g| g.key != key);
                if v.is_empty() {
                    map.remove(&name);
                }
            }
        }
    }

    /// Recomputes every ClusterRole's effective rules (aggregation through any depth; a cycle
    /// contributes nothing twice).
    fn resolve_cluster_roles(&mut self) {
        fn effective(
            name: &str,
            defs: &HashMap<String, ClusterRoleDef>,
            done: &mut HashMap<String, Arc<Vec<Rule>>>,
            visiting: &mut HashSet<String>,
        ) -> Arc<Vec<Rule>> {
            if let Some(r) = done.get(name) {
                return r.clone();
            }
            let Some(def) = defs.get(name) else {
                return Arc::default();
            };
            let Some(selectors) = &def.aggregation else {
                let r = Arc::new(def.rules.clone());
                done.insert(name.to_string(), r.clone());
                return r;
            };
            if !visiting.insert(name.to_string()) {
                return Arc::default();
            }
            let mut names: Vec<&String> = defs
                .iter()
                .filter(|(n, d)| *n != name && selectors.iter().any(|s| s.matches(&d.labels)))
                .map(|(n, _)| n)
                .collect();
            names.sort();
            let mut rules: Vec<Rule> = Vec::new();
            for n in names {
                for r in effective(n, defs, done, visiting).iter() {
                    if !rules.contains(r) {
                        rules.push(r.clone());
                    }
                }
            }
            visiting.remove(name);
            let r = Arc::new(rules);
            done.insert(name.to_string(), r.clone());
            r
        }
        let mut done = HashMap::new();
        for name in self.cluster_role_defs.keys() {
            effective(
                name,
                &self.cluster_role_defs,
                &mut done,
                &mut HashSet::new(),
            );
        }
        self.cluster_roles = done;
    }

    fn role_rules(&self, ns: Option<&str>, role: &RoleRef) -> Option<&Arc<Vec<Rule>>> {
        match role {
            RoleRef::ClusterRole(n) => self.cluster_roles.get(n),
            RoleRef::Role(n) => self.roles.get(ns?)?.get(n),
        }
    }

    /// The grants that apply in `ns` (cluster-wide ones first), with their scope.
    fn applicable<'a>(
        &'a self,
        user: &'a str,
        groups: &'a [String],
        ns: Option<&'a str>,
    ) -> impl Iterator<Item = (Option<&'a str>, &'a Grant, &'static str, &'a str)> + 'a {
        let cluster = self
            .cluster_grants
            .of(user, groups)
            .map(|(g, k, s)| (None, g, k, s));
        let local = ns
            .and_then(|ns| self.grants.get(ns).map(|s| (ns, s)))
            .into_iter()
            .flat_map(move |(ns, s)| {
                s.of(user, groups)
                    .map(move |(g, k, sub)| (Some(ns), g, k, sub))
            });
        cluster.chain(local)
    }

    /// Why `user` may do `what`, if a binding allows it.
    fn allowed(
        &self,
        user: &str,
        groups: &[String],
        allows: impl Fn(&Rule) -> bool,
        ns: Option<&str>,
    ) -> Option<String> {
        for (scope, grant, kind, subject) in self.applicable(user, groups, ns) {
            let Some(rules) = self.role_rules(scope, &grant.role) else {
                continue;
            };
            if rules.iter().any(&allows) {
                let (binding_kind, role_kind, role) = match (&grant.role, scope) {
                    (RoleRef::ClusterRole(r), None) => ("ClusterRoleBinding", "ClusterRole", r),
                    (RoleRef::ClusterRole(r), Some(_)) => ("RoleBinding", "ClusterRole", r),
                    (RoleRef::Role(r), _) => ("RoleBinding", "Role", r),
                };
                let place = scope
                    .map(|ns| format!(" in namespace \"{ns}\""))
                    .unwrap_or_default();
                return Some(format!(
                    "RBAC: allowed by {binding_kind} \"{}/{}\"{place} of {role_kind} \"{role}\" to {kind} \"{subject}\"",
                    grant.binding, role
                ));
            }
        }
        None
    }

    fn rules_for(&self, user: &str, groups: &[String], ns: Option<&str>) -> Vec<Rule> {
        let mut out: Vec<Rule> = Vec::new();
        for (scope, grant, _, _) in self.applicable(user, groups, ns) {
            if let Some(rules) = self.role_rules(scope, &grant.role) {
                for r in rules.iter() {
                    if !out.contains(r) {
                        out.push(r.clone());
                    }
                }
            }
        }
        out
    }
}

/// A member cluster agent's built-in rules in `namespace` (None: cluster-wide): read its own
/// Works, write their status, read its own Cluster and write its status and that of its
/// ClusterMetrics, renew its heartbeat Lease.
pub fn agent_rules(cluster: &str, namespace: Option<&str>) -> Vec<Rule> {
    let mut rules = vec![
        Rule::on(&["get"], &["multicluster.io"], &["clusters"]).named(&[cluster]),
        Rule::on(
            &["get", "update", "patch"],
            &["multicluster.io"],
            &["clusters/status"],
        )
        .named(&[cluster]),
        // Its nodes, for Kueue quotas (galaxy's ClusterMetrics, made by the server).
        Rule::on(
            &["get", "update", "patch"],
            &[orrery_api::quota::GROUP],
            &["clustermetrics/status"],
        )
        .named(&[cluster]),
    ];
    // Its heartbeat Lease, which the server makes (so no create: a name cannot limit one).
    if namespace == Some(orrery_api::cluster::LEASE_NAMESPACE) {
        rules.push(
            Rule::on(
                &["get", "update", "patch"],
                &["coordination.k8s.io"],
                &["leases"],
            )
            .named(&[cluster]),
        );
    }
    if namespace == Some(cluster_namespace(cluster).as_str()) {
        rules.push(Rule::on(
            &["get", "list", "watch"],
            &["multicluster.io"],
            &["works"],
        ));
        rules.push(Rule::on(
            &["get", "update", "patch"],
            &["multicluster.io"],
            &["works/status"],
        ));
    }
    rules
}

/// The cluster whose agent `who` is, if it is one.
fn agent_of(who: &Identity) -> Option<&str> {
    match who {
        Identity::Cluster { name } => Some(name),
        _ => None,
    }
}

fn superuser() -> Decision {
    Decision {
        allowed: true,
        reason: "system:masters may do everything".into(),
    }
}

/// A decision and its reason (as SubjectAccessReview reports them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub reason: String,
}

/// Decides who may do what; follows roles, bindings and ServiceAccounts in the store.
#[derive(Debug, Default)]
pub struct Authorizer {
    policy: RwLock<Policy>,
    /// Told when a ClusterRole changed (the aggregation writer waits on it).
    cluster_roles_changed: tokio::sync::Notify,
    /// The reflectors keeping the policy in step with the store, one a kind, and the handle
    /// that stops them (dropped with the Authorizer).
    health: Vec<(Kind, orrery_runtime::reflector::Health)>,
    _following: Option<tokio::sync::watch::Sender<bool>>,
}

impl Authorizer {
    /// An authorizer over the given roles, bindings and ServiceAccounts (tests, benchmarks).
    pub fn from_objects(objects: &[Object]) -> Arc<Self> {
        let authz = Authorizer::default();
        for o in objects {
            authz.observe(o, false);
        }
        Arc::new(authz)
    }

    /// Reads every role, binding and ServiceAccount, and follows their changes (the project's
    /// reflector, one a kind: resumed after a broken watch, listed again only when the
    /// history is gone). Returns once every kind's first listing is in.
    pub async fn start(store: Arc<dyn Store>) -> Result<Arc<Self>, StoreError> {
        use orrery_runtime::reflector::{self, Event};
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let mut authz = Authorizer {
            _following: Some(stop),
            ..Authorizer::default()
        };
        let mut sources = Vec::new();
        for kind in Kind::ALL {
            let mut events = reflector::spawn(store.clone(), kind.prefix(), stopped.clone());
            let first = match events.recv().await {
                Some(Event::Listed(items)) => items,
                _ => return Err(StoreError::Closed),
            };
            authz.relisted(kind, &first);
            authz.health.push((kind, events.health()));
            sources.push((kind, events));
        }
        let authz = Arc::new(authz);
        for (kind, mut events) in sources {
            let authz = authz.clone();
            tokio::spawn(async move {
                while let Some(ev) = events.recv().await {
                    match ev {
                        Event::Listed(items) => authz.relisted(kind, &items),
                        Event::Upsert(o) => authz.observe(&o, false),
                        Event::Delete(o) => authz.observe(&o, true),
                    }
                }
            });
        }
        Ok(authz)
    }

    /// Takes in a fresh listing of one kind: what it no longer holds goes.
    fn relisted(&self, kind: Kind, items: &[Arc<Object>]) {
        let prefix = kind.prefix();
        let mut p = self.policy.write();
        let listed: HashSet<String> = items.iter().map(|o| key_of(kind, o)).collect();
        let gone: Vec<String> = p
            .revisions
            .keys()
            .filter(|k| k.starts_with(&prefix) && !listed.contains(*k))
            .cloned()
            .collect();
        for key in gone {
            p.revisions.remove(&key);
            p.apply(kind, &key, None, None);
        }
        for o in items {
            p.apply(kind, &key_of(kind, o), Some(o), o.revision());
        }
        drop(p);
        if kind == Kind::ClusterRole {
            self.cluster_roles_changed.notify_one();
        }
    }

    /// Why the roles and bindings held here are out of step with the store, if they are (for
    /// `/readyz`).
    pub fn out_of_step(&self) -> Option<String> {
        self.health.iter().find_map(|(kind, h)| {
            h.out_of_step(crate::auth::CACHE_TOLERANCE).map(|why| {
                format!("the RBAC cache of {kind:?}s is out of step with the store: {why}")
            })
        })
    }

    /// The reflectors behind the RBAC cache (for `/metrics`): failures and listings again.
    pub fn health_counts(&self) -> (u64, u64) {
        self.health.iter().fold((0, 0), |(e, r), (_, h)| {
            let (e2, r2) = h.counts();
            (e + e2, r + r2)
        })
    }

    /// Takes in a role, binding or ServiceAccount as stored (or deleted): the watch calls it,
    /// and so does a write through this server, so that the writer's next request already
    /// sees it.
    pub fn observe(&self, obj: &Object, deleted: bool) {
        let Some(kind) = Kind::of(&obj.kind) else {
            return;
        };
        let key = key_of(kind, obj);
        {
            let mut p = self.policy.write();
            p.apply(kind, &key, (!deleted).then_some(obj), obj.revision());
        }
        if kind == Kind::ClusterRole {
            self.cluster_roles_changed.notify_one();
        }
    }

    /// The aggregated ClusterRoles whose stored `rules` are not what they aggregate now, with
    /// what they aggregate.
    fn stale_aggregations(&self) -> Vec<(String, Vec<Rule>)> {
        let p = self.policy.read();
        p.cluster_role_defs
            .iter()
            .filter(|(_, d)| d.aggregation.is_some())
            .filter_map(|(name, d)| {
                let now = p.cluster_roles.get(name)?;
                (d.rules != **now).then(|| (name.clone(), now.to_vec()))
            })
            .collect()
    }

    /// Whether the ServiceAccount a token was issued for still exists, as the same account.
    pub fn service_account_is(&self, namespace: &str, name: &str, uid: &str) -> bool {
        let p = self.policy.read();
        p.service_accounts
            .get(&(namespace.to_string(), name.to_string()))
            .is_some_and(|u| u == uid)
    }

    /// Whether `who` may do `what`, and why.
    pub fn decide(&self, who: &Identity, what: &Attributes<'_>) -> Decision {
        if who.is_superuser() {
            return superuser();
        }
        self.decide_as(&who.user(), &who.groups(), agent_of(who), what)
    }

    /// Whether the user `user` in exactly `groups` may do `what` (a SubjectAccessReview's
    /// question); `agent_of` names the cluster whose agent it is, if it is one.
    pub fn decide_as(
        &self,
        user: &str,
        groups: &[String],
        agent_of: Option<&str>,
        what: &Attributes<'_>,
    ) -> Decision {
        self.decide_by(
            user,
            groups,
            |r| r.allows(what),
            what.namespace,
            || {
                agent_of.is_some_and(|name| {
                    agent_rules(name, what.namespace)
                        .iter()
                        .any(|r| r.allows(what))
                })
            },
        )
    }

    /// Whether `who` may `verb` (a lower-case HTTP verb) the non-resource `path`, and why.
    pub fn decide_path(&self, who: &Identity, verb: &str, path: &str) -> Decision {
        if who.is_superuser() {
            return superuser();
        }
        self.decide_path_as(&who.user(), &who.groups(), verb, path)
    }

    /// [`Self::decide_path`] for a user in exactly `groups`.
    pub fn decide_path_as(
        &self,
        user: &str,
        groups: &[String],
        verb: &str,
        path: &str,
    ) -> Decision {
        self.decide_by(user, groups, |r| r.allows_url(verb, path), None, || false)
    }

    fn decide_by(
        &self,
        user: &str,
        groups: &[String],
        allows: impl Fn(&Rule) -> bool,
        ns: Option<&str>,
        built_in: impl FnOnce() -> bool,
    ) -> Decision {
        if groups.iter().any(|g| g == "system:masters") {
            return superuser();
        }
        if built_in() {
            return Decision {
                allowed: true,
                reason: "a member cluster's agent reads its own Works and writes its own status"
                    .into(),
            };
        }
        let p = self.policy.read();
        match p.allowed(user, groups, allows, ns) {
            Some(reason) => Decision {
                allowed: true,
                reason,
            },
            None => Decision {
                allowed: false,
                reason: String::new(),
            },
        }
    }

    /// [`Self::decide`], as the Forbidden error Kubernetes answers with when it says no.
    pub fn authorize(&self, who: &Identity, what: &Attributes<'_>) -> Result<(), ApiError> {
        if self.decide(who, what).allowed {
            Ok(())
        } else {
            Err(forbidden(who, what))
        }
    }

    /// [`Self::decide_path`], as a Forbidden error when it says no.
    pub fn authorize_path(&self, who: &Identity, verb: &str, path: &str) -> Result<(), ApiError> {
        if self.decide_path(who, verb, path).allowed {
            Ok(())
        } else {
            Err(ApiError::forbidden(format!(
                "forbidden: User \"{}\" cannot {verb} path \"{path}\"",
                who.user()
            )))
        }
    }

    /// Every rule `who` holds in `namespace` (None: cluster-wide only): resource rules, then
    /// non-resource rules (`SelfSubjectRulesReview`).
    pub fn rules_for(&self, who: &Identity, namespace: Option<&str>) -> (Vec<Rule>, Vec<Rule>) {
        let groups = who.groups();
        let mut all = if who.is_superuser() {
            vec![Rule::on(&["*"], &["*"], &["*"]), Rule::urls(&["*"], &["*"])]
        } else {
            match who {
                Identity::Cluster { name } => agent_rules(name, namespace),
                _ => Vec::new(),
            }
        };
        let p = self.policy.read();
        for r in p.rules_for(&who.user(), &groups, namespace) {
            if !all.contains(&r) {
                all.push(r);
            }
        }
        all.into_iter()
            .partition(|r| r.non_resource_urls.is_empty())
    }

    /// The effective rules of a role a binding refers to (aggregation resolved).
    fn referenced_rules(&self, namespace: Option<&str>, role: &RoleRef) -> Option<Vec<Rule>> {
        let p = self.policy.read();
        p.role_rules(namespace, role).map(|r| r.to_vec())
    }

    /// Escalation prevention, for a write of an RBAC object by `who`: a role may hold only
    /// rules its writer holds (or the writer may `escalate` roles); a binding may grant only a
    /// role whose rules its writer holds (or the writer may `bind` that role). As Kubernetes.
    pub fn admit(&self, who: &Identity, obj: &Object) -> Result<(), ApiError> {
        let Some(kind) = Kind::of(&obj.kind) else {
            return Ok(());
        };
        if who.is_superuser() {
            return Ok(());
        }
        let ns = (!obj.metadata.namespace.is_empty()).then_some(obj.metadata.namespace.as_str());
        let (plural, wanted) = match kind {
            Kind::ClusterRole | Kind::Role => {
                let plural = if kind == Kind::Role {
                    "roles"
                } else {
                    "clusterroles"
                };
                let rules =
                    if kind == Kind::ClusterRole && obj.other.contains_key("aggregationRule") {
                        // What it will aggregate (as far as this server knows now).
                        let mut p = Policy::default();
                        {
                            let current = self.policy.read();
                            p.cluster_role_defs = current.cluster_role_defs.clone();
                        }
                        p.cluster_role_defs.insert(
                            obj.metadata.name.clone(),
                            ClusterRoleDef {
                                labels: obj.metadata.labels.clone(),
                                rules: rules_of(obj),
                                aggregation: selectors_of(obj),
                            },
                        );
                        p.resolve_cluster_roles();
                        p.cluster_roles
                            .get(&obj.metadata.name)
                            .map(|r| r.to_vec())
                            .unwrap_or_default()
                    } else {
                        rules_of(obj)
                    };
                let escalate = Attributes {
                    verb: "escalate",
                    group: GROUP,
                    resource: plural,
                    subresource: None,
                    namespace: ns,
                    name: Some(&obj.metadata.name),
                };
                if self.decide(who, &escalate).allowed {
                    return Ok(());
                }
                (plural, rules)
            }
            Kind::ClusterRoleBinding | Kind::RoleBinding => {
                let plural = if kind == Kind::RoleBinding {
                    "rolebindings"
                } else {
                    "clusterrolebindings"
                };
                let Some(role) = RoleRef::of(obj) else {
                    return Ok(()); // validation refuses it
                };
                let (role_plural, role_name) = match &role {
                    RoleRef::ClusterRole(n) => ("clusterroles", n.as_str()),
                    RoleRef::Role(n) => ("roles", n.as_str()),
                };
                let bind = Attributes {
                    verb: "bind",
                    group: GROUP,
                    resource: role_plural,
                    subresource: None,
                    namespace: ns,
                    name: Some(role_name),
                };
                if self.decide(who, &bind).allowed {
                    return Ok(());
                }
                let Some(rules) = self.referenced_rules(ns, &role) else {
                    return Err(ApiError::forbidden(format!(
                        "{plural}.{GROUP} \"{}\" is forbidden: user \"{}\" (groups={:?}) is attempting to grant RBAC permissions not currently held: the {role_plural} \"{role_name}\" does not exist and the user may not bind it",
                        obj.metadata.name,
                        who.user(),
                        who.groups()
                    )));
                };
                (plural, rules)
            }
            Kind::ServiceAccount => return Ok(()),
        };
        let (mut owner, urls) = self.rules_for(who, ns);
        owner.extend(urls);
        let missing = rules::uncovered(&owner, &wanted);
        if missing.is_empty() {
            return Ok(());
        }
        let list: Vec<String> = missing.iter().map(rules::describe).collect();
        Err(ApiError::forbidden(format!(
            "{plural}.{GROUP} \"{}\" is forbidden: user \"{}\" (groups={:?}) is attempting to grant RBAC permissions not currently held:\n{}",
            obj.metadata.name,
            who.user(),
            who.groups(),
            list.join("\n")
        )))
    }
}

/// Writes each aggregated ClusterRole's rules into the object, as Kubernetes' aggregation
/// controller does, so that what `kubectl get clusterrole view -o yaml` shows is what the
/// authorizer decides with (it resolves aggregation itself and never reads these rules). The
/// leader runs it through its fenced store; it runs until `shutdown`. Woken by the
/// authorizer's cache of roles (which has taken in the change by then), and every 30 s.
pub async fn write_aggregated_rules(
    authz: Arc<Authorizer>,
    store: Arc<dyn Store>,
    metrics: orrery_runtime::metrics::Handle,
    shutdown: tokio::sync::watch::Receiver<bool>,
) {
    use orrery_runtime::controller::Controller;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let changed = authz.clone();
    let mut stopped = shutdown.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = changed.cluster_roles_changed.notified() => {}
                _ = stopped.changed() => return,
            }
            if tx.send(()).is_err() {
                return;
            }
        }
    });
    Controller::new(
        "aggregation",
        store.clone(),
        Aggregation { authz, store },
        metrics,
    )
    .trigger(rx)
    .run(shutdown)
    .await;
}

/// The one key of [`write_aggregated_rules`]: every aggregated role.
struct Aggregation {
    authz: Arc<Authorizer>,
    store: Arc<dyn Store>,
}

#[async_trait::async_trait]
impl orrery_runtime::controller::Reconciler for Aggregation {
    type Key = ();
    type Error = StoreError;

    fn on_event(
        &mut self,
        _: orrery_runtime::controller::Origin,
        _: orrery_runtime::Event,
        _: &mut orrery_runtime::controller::Keys<()>,
    ) {
    }

    fn all_keys(&self) -> Vec<()> {
        vec![()]
    }

    async fn reconcile(&self, _: &()) -> Result<orrery_runtime::controller::Action, StoreError> {
        for (name, rules) in self.authz.stale_aggregations() {
            let key = orrery_api::keys::object(GROUP, "clusterroles", None, &name);
            let current = match self.store.get(&key).await {
                Ok(o) => o,
                Err(StoreError::NotFound { .. }) => continue,
                Err(StoreError::Closed) => return Err(StoreError::Closed),
                Err(e) => {
                    tracing::warn!(error = %e, role = %name, "reading an aggregated role failed");
                    continue;
                }
            };
            if rules_of(&current) == rules {
                continue;
            }
            let mut next = current.clone();
            next.other.insert(
                "rules".into(),
                serde_json::to_value(&rules).unwrap_or_default(),
            );
            match self.store.update(&key, next, current.revision()).await {
                Ok(o) => self.authz.observe(&o, false),
                // Changed meanwhile (or no longer leading): the next round sees it.
                Err(e) => tracing::debug!(error = %e, role = %name, "aggregated rules not written"),
            }
        }
        Ok(orrery_runtime::controller::Action::After(
            Duration::from_secs(30),
        ))
    }
}

fn key_of(kind: Kind, obj: &Object) -> String {
    let prefix = kind.prefix();
    match kind {
        Kind::ClusterRole | Kind::ClusterRoleBinding => format!("{prefix}{}", obj.metadata.name),
        _ => format!("{prefix}{}/{}", obj.metadata.namespace, obj.metadata.name),
    }
}

/// The Forbidden error for a resource request, worded as Kubernetes words it.
pub fn forbidden(who: &Identity, what: &Attributes<'_>) -> ApiError {
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
    ApiError::forbidden(format!(
        "{target} is forbidden: User \"{}\" cannot {} resource \"{full}\" in API group \"{}\"{scope}",
        who.user(),
        what.verb,
        what.group
    ))
}

#[cfg(test)]
mod tests;
