//! The audit log, as Kubernetes keeps it: `audit.k8s.io/v1` Events, one JSON line each, chosen
//! and detailed by an audit `Policy` (`--audit-policy-file`), written to `--audit-log-path`
//! and rotated by size (`--audit-log-maxsize` MiB, `--audit-log-maxbackup` files kept, named
//! as Kubernetes names them: `audit-2026-11-26T22-50-01.123.log`).
//!
//! The first rule that matches a request decides its level: `None` (nothing), `Metadata`
//! (who did what to which object, the answer's code, when), `Request` (and the request's
//! body), `RequestResponse` (and the response's, except a watch's stream). A request no rule
//! matches is not logged. Stages: `RequestReceived`, `ResponseComplete`, and for watches
//! `ResponseStarted` (when the stream begins); `omitStages` leaves some out.
//!
//! Lines are written by a thread of their own, in the order requests finish; a request waits
//! for room in the writer's queue rather than drop its event (Kubernetes' blocking mode).

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::auth::Identity;

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("the audit policy cannot be read: {0}")]
    Policy(String),
    #[error("the audit log {path}: {message}")]
    Log { path: String, message: String },
}

/// How much of a request an Event records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Level {
    None,
    Metadata,
    Request,
    RequestResponse,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Stage {
    RequestReceived,
    ResponseStarted,
    ResponseComplete,
    Panic,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct GroupResources {
    #[serde(default)]
    group: String,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    resource_names: Vec<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Rule {
    level: Level,
    #[serde(default)]
    users: Vec<String>,
    #[serde(default)]
    user_groups: Vec<String>,
    #[serde(default)]
    verbs: Vec<String>,
    #[serde(default)]
    resources: Vec<GroupResources>,
    #[serde(default)]
    namespaces: Vec<String>,
    #[serde(rename = "nonResourceURLs", default)]
    non_resource_urls: Vec<String>,
    #[serde(default)]
    omit_stages: Vec<Stage>,
    omit_managed_fields: Option<bool>,
}

/// An audit `Policy` (`audit.k8s.io/v1`).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Policy {
    api_version: String,
    kind: String,
    /// Accepted, as Kubernetes accepts it; nothing in it is used.
    #[serde(default, rename = "metadata")]
    _metadata: serde::de::IgnoredAny,
    #[serde(default)]
    rules: Vec<Rule>,
    #[serde(default)]
    omit_stages: Vec<Stage>,
    #[serde(default)]
    omit_managed_fields: bool,
}

/// What a request is, as the policy and the Event see it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RequestInfo {
    pub verb: String,
    pub path: String,
    /// Present for a request on a resource.
    pub object: Option<ObjectRef>,
}

/// `objectRef` of an Event.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub resource: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub api_group: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub subresource: String,
}

/// What the policy decided for one request.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub level: Level,
    pub omit_stages: Vec<Stage>,
    pub omit_managed_fields: bool,
}

impl Decision {
    pub fn none() -> Self {
        Decision {
            level: Level::None,
            omit_stages: Vec::new(),
            omit_managed_fields: false,
        }
    }

    pub fn logs(&self, stage: Stage) -> bool {
        self.level > Level::None && !self.omit_stages.contains(&stage)
    }
}

/// The address a request came from (the server puts it in the request's extensions).
#[derive(Clone, Copy, Debug)]
pub struct Peer(pub std::net::SocketAddr);

/// The user name and groups an Event shows for an identity (`None`: not authenticated).
pub fn user_of(who: Option<&Identity>) -> (String, Vec<String>) {
    match who {
        None => (
            "system:anonymous".into(),
            vec!["system:unauthenticated".into()],
        ),
        Some(id) => (id.user(), id.groups()),
    }
}

fn matches_path(path: &str, spec: &str) -> bool {
    spec == "*"
        || spec == path
        || spec
            .strip_suffix('*')
            .is_some_and(|prefix| path.starts_with(prefix))
}

impl Rule {
    fn matches(&self, user: &str, groups: &[String], info: &RequestInfo) -> bool {
        if !self.users.is_empty() && !self.users.iter().any(|u| u == user) {
            return false;
        }
        if !self.user_groups.is_empty() && !groups.iter().any(|g| self.user_groups.contains(g)) {
            return false;
        }
        if !self.verbs.is_empty() && !self.verbs.contains(&info.verb) {
            return false;
        }
        if !self.namespaces.is_empty() || !self.resources.is_empty() {
            let Some(o) = &info.object else {
                return false;
            };
            if !self.namespaces.is_empty() && !self.namespaces.contains(&o.namespace) {
                return false;
            }
            if self.resources.is_empty() {
                return true;
            }
            let combined = if o.subresource.is_empty() {
                o.resource.clone()
            } else {
                format!("{}/{}", o.resource, o.subresource)
            };
            return self.resources.iter().any(|gr| {
                gr.group == o.api_group
                    && (gr.resources.is_empty()
                        || gr.resources.iter().any(|r| {
                            (gr.resource_names.is_empty() || gr.resource_names.contains(&o.name))
                                && (*r == combined
                                    || r == "*"
                                    || (!o.subresource.is_empty()
                                        && r.strip_prefix("*/") == Some(o.subresource.as_str()))
                                    || r.strip_suffix("/*") == Some(o.resource.as_str()))
                        }))
            });
        }
        if !self.non_resource_urls.is_empty() {
            return info.object.is_none()
                && self
                    .non_resource_urls
                    .iter()
                    .any(|spec| matches_path(&info.path, spec));
        }
        true
    }
}

impl Policy {
    /// Reads a Policy (YAML or JSON).
    pub fn parse(text: &str) -> Result<Policy, AuditError> {
        let p: Policy =
            serde_saphyr::from_str(text).map_err(|e| AuditError::Policy(e.to_string()))?;
        if p.kind != "Policy" || p.api_version != "audit.k8s.io/v1" {
            return Err(AuditError::Policy(format!(
                "expected apiVersion audit.k8s.io/v1, kind Policy; found {}, {}",
                p.api_version, p.kind
            )));
        }
        Ok(p)
    }

    pub fn load(path: &Path) -> Result<Policy, AuditError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| AuditError::Policy(format!("{}: {e}", path.display())))?;
        Self::parse(&text)
    }

    /// The first matching rule's level; no rule matching: not logged.
    pub fn decide(&self, who: Option<&Identity>, info: &RequestInfo) -> Decision {
        let (user, groups) = user_of(who);
        let Some(rule) = self.rules.iter().find(|r| r.matches(&user, &groups, info)) else {
            return Decision::none();
        };
        let mut omit = self.omit_stages.clone();
        omit.extend(rule.omit_stages.iter().copied());
        Decision {
            level: rule.level,
            omit_stages: omit,
            omit_managed_fields: rule.omit_managed_fields.unwrap_or(self.omit_managed_fields),
        }
    }
}

/// What a request is, from its method, path and query (as Kubernetes' RequestInfo reads it):
/// `/api/v1/...` and `/apis/<group>/<version>/...` name resources (but the DRO-DS API under
/// `/api/v1/`); everything else is a non-resource request whose verb is the method.
pub fn request_info(method: &http::Method, path: &str, query: Option<&str>) -> RequestInfo {
    let non_resource = || RequestInfo {
        verb: method.as_str().to_ascii_lowercase(),
        path: path.to_string(),
        object: None,
    };
    if crate::routes::is_dro_path(path) {
        return non_resource();
    }
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] if !rest.is_empty() => ("", *v, rest),
        ["apis", g, v, rest @ ..] if !rest.is_empty() => (*g, *v, rest),
        _ => return non_resource(),
    };
    let watch_param = crate::http::asks_to_watch(query);
    let (legacy_watch, rest) = match rest {
        ["watch", r @ ..] => (true, r),
        r => (false, r),
    };
    // As Kubernetes reads it: `namespaces/<ns>/<resource>...` is in the namespace; the
    // namespace object itself (and its status or finalize) is too.
    let (namespace, rest): (&str, &[&str]) = match rest {
        ["namespaces", ns, r, ..] if !matches!(*r, "status" | "finalize") => (ns, &rest[2..]),
        ["namespaces", ns, ..] => (ns, rest),
        _ => ("", rest),
    };
    let (resource, name, subresource) = match rest {
        [r] => (*r, "", ""),
        [r, n] => (*r, *n, ""),
        [r, n, s, ..] => (*r, *n, *s),
        [] => return non_resource(),
    };
    let verb = match *method {
        http::Method::GET | http::Method::HEAD => {
            if legacy_watch || watch_param {
                "watch"
            } else if name.is_empty() {
                "list"
            } else {
                "get"
            }
        }
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::PATCH => "patch",
        http::Method::DELETE => {
            if name.is_empty() {
                "deletecollection"
            } else {
                "delete"
            }
        }
        _ => return non_resource(),
    };
    RequestInfo {
        verb: verb.into(),
        path: path.to_string(),
        object: Some(ObjectRef {
            resource: resource.into(),
            namespace: namespace.into(),
            name: name.into(),
            api_group: group.into(),
            api_version: version.into(),
            subresource: subresource.into(),
        }),
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct UserInfo {
    username: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    uid: String,
    groups: Vec<String>,
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    extra: std::collections::BTreeMap<String, Vec<String>>,
}

#[derive(Serialize)]
struct ResponseStatus {
    metadata: Value,
    code: u16,
}

/// One `audit.k8s.io/v1` Event.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Event<'a> {
    kind: &'static str,
    api_version: &'static str,
    level: Level,
    #[serde(rename = "auditID")]
    audit_id: &'a str,
    stage: Stage,
    #[serde(rename = "requestURI")]
    request_uri: &'a str,
    verb: &'a str,
    user: &'a UserInfo,
    #[serde(skip_serializing_if = "Option::is_none")]
    impersonated_user: Option<&'a UserInfo>,
    #[serde(rename = "sourceIPs")]
    source_ips: &'a [String],
    #[serde(skip_serializing_if = "str::is_empty")]
    user_agent: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    object_ref: Option<&'a ObjectRef>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_status: Option<ResponseStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    request_object: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_object: Option<&'a Value>,
    request_received_timestamp: &'a str,
    stage_timestamp: String,
}

/// One request's audit record, filled in as the request goes.
#[derive(Debug)]
pub struct Record {
    pub decision: Decision,
    pub info: RequestInfo,
    pub id: String,
    pub uri: String,
    pub user_agent: String,
    pub source_ips: Vec<String>,
    user: UserInfo,
    /// Whom the request acted as, when it impersonated someone.
    impersonated: Option<UserInfo>,
    received: String,
    pub request_object: Option<Value>,
    pub response_object: Option<Value>,
}

fn now_text() -> String {
    orrery_api::MicroTime::now().to_string()
}

/// Drops `metadata.managedFields` from an object, or from each item of a list.
fn without_managed_fields(v: &mut Value) {
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
    }
    if let Some(items) = v.get_mut("items").and_then(Value::as_array_mut) {
        items.iter_mut().for_each(without_managed_fields);
    }
}

impl Record {
    pub fn new(
        decision: Decision,
        info: RequestInfo,
        who: Option<&Identity>,
        uri: String,
        user_agent: String,
        source_ips: Vec<String>,
    ) -> Record {
        let (username, groups) = user_of(who);
        Record {
            decision,
            info,
            id: uuid::Uuid::new_v4().to_string(),
            uri,
            user_agent,
            source_ips,
            user: UserInfo {
                username,
                uid: String::new(),
                groups,
                extra: Default::default(),
            },
            impersonated: None,
            received: now_text(),
            request_object: None,
            response_object: None,
        }
    }

    /// Records whom the request acts as (it impersonates `who`).
    pub fn impersonating(&mut self, who: &Identity, how: &crate::impersonation::Impersonated) {
        self.impersonated = Some(UserInfo {
            username: who.user(),
            uid: how.uid.clone(),
            groups: who.groups(),
            extra: how.extra.clone(),
        });
    }

    /// The Event of `stage` as a JSON line, if the decision logs that stage.
    pub fn line(&self, stage: Stage, code: Option<u16>) -> Option<String> {
        if !self.decision.logs(stage) {
            return None;
        }
        let strip = |v: &Option<Value>| -> Option<Value> {
            let mut v = v.clone()?;
            if self.decision.omit_managed_fields {
                without_managed_fields(&mut v);
            }
            Some(v)
        };
        let request_object = (self.decision.level >= Level::Request)
            .then(|| strip(&self.request_object))
            .flatten();
        let response_object = (self.decision.level >= Level::RequestResponse
            && stage == Stage::ResponseComplete)
            .then(|| strip(&self.response_object))
            .flatten();
        let ev = Event {
            kind: "Event",
            api_version: "audit.k8s.io/v1",
            level: self.decision.level,
            audit_id: &self.id,
            stage,
            request_uri: &self.uri,
            verb: &self.info.verb,
            user: &self.user,
            impersonated_user: self.impersonated.as_ref(),
            source_ips: &self.source_ips,
            user_agent: &self.user_agent,
            object_ref: self.info.object.as_ref(),
            response_status: code.map(|code| ResponseStatus {
                metadata: Value::Object(Default::default()),
                code,
            }),
            request_object: request_object.as_ref(),
            response_object: response_object.as_ref(),
            request_received_timestamp: &self.received,
            stage_timestamp: now_text(),
        };
        serde_json::to_string(&ev).ok()
    }
}

/// The log: its policy, and the queue to the thread that writes and rotates the file.
#[derive(Debug)]
pub struct AuditLog {
    pub policy: Policy,
    tx: tokio::sync::mpsc::Sender<String>,
}

/// The size (MiB) past which the log rotates, and the rotated files kept, by default.
pub const DEFAULT_LOG_MAX_MIB: u64 = 100;
pub const DEFAULT_LOG_MAX_BACKUPS: usize = 10;

/// Where the log goes and when it rotates.
#[derive(Clone, Debug)]
pub struct LogFile {
    pub path: PathBuf,
    /// Rotate once the file would pass this many bytes (0: never).
    pub max_bytes: u64,
    /// Rotated files kept (0: all).
    pub max_backups: usize,
}

impl AuditLog {
    /// Opens (appends to) the log file and starts its writer thread.
    pub fn open(policy: Policy, file: LogFile) -> Result<AuditLog, AuditError> {
        let shown = file.path.display().to_string();
        let err = |e: std::io::Error| AuditError::Log {
            path: shown.clone(),
            message: e.to_string(),
        };
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
        if let Some(dir) = file.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(err)?;
        }
        // The log may hold what requests carried (Secrets, at RequestResponse): its owner's
        // alone, whatever the umask.
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&file.path)
            .map_err(err)?;
        out.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(err)?;
        let size = out.metadata().map_err(err)?.len();
        let (tx, rx) = tokio::sync::mpsc::channel::<String>(4096);
        std::thread::Builder::new()
            .name("audit-log".into())
            .spawn({
                let file = file.clone();
                move || write_loop(rx, out, size, file)
            })
            .map_err(err)?;
        Ok(AuditLog { policy, tx })
    }

    /// Queues a line; waits while the writer's queue is full.
    pub async fn write(&self, line: String) {
        if self.tx.send(line).await.is_err() {
            tracing::error!("the audit log's writer stopped; an event was not written");
        }
    }
}

fn write_loop(
    mut rx: tokio::sync::mpsc::Receiver<String>,
    out: std::fs::File,
    mut size: u64,
    file: LogFile,
) {
    let mut out = std::io::BufWriter::new(out);
    while let Some(line) = rx.blocking_recv() {
        let mut batch = vec![line];
        while let Ok(l) = rx.try_recv() {
            batch.push(l);
        }
        for line in batch {
            let len = line.len() as u64 + 1;
            if file.max_bytes > 0 && size > 0 && size + len > file.max_bytes {
                match rotate(&mut out, &file) {
                    Ok(f) => {
                        out = std::io::BufWriter::new(f);
                        size = 0;
                    }
                    Err(e) => {
                        tracing::error!(error = %e, path = %file.path.display(), "rotating the audit log failed")
                    }
                }
            }
            if let Err(e) = writeln!(out, "{line}") {
                tracing::error!(error = %e, path = %file.path.display(), "writing the audit log failed");
            }
            size += len;
        }
        if let Err(e) = out.flush() {
            tracing::error!(error = %e, "flushing the audit log failed");
        }
    }
}

/// Renames the full file to `<stem>-<time><ext>`, removes the oldest beyond `max_backups`,
/// and starts a new file.
fn rotate(
    out: &mut std::io::BufWriter<std::fs::File>,
    file: &LogFile,
) -> std::io::Result<std::fs::File> {
    out.flush()?;
    let stem = file
        .path
        .file_stem()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_else(|| "audit".into());
    let ext = file
        .path
        .extension()
        .map(|e| format!(".{}", e.to_string_lossy()))
        .unwrap_or_default();
    let dir = file
        .path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_path_buf();
    let stamp = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H-%M-%S%.3f")
        .to_string();
    let mut target = dir.join(format!("{stem}-{stamp}{ext}"));
    let mut n = 1;
    while target.exists() {
        target = dir.join(format!("{stem}-{stamp}.{n}{ext}"));
        n += 1;
    }
    std::fs::rename(&file.path, &target)?;
    if file.max_backups > 0 {
        let prefix = format!("{stem}-");
        let mut backups: Vec<PathBuf> = std::fs::read_dir(&dir)?
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .map(|n| n.to_string_lossy().to_string())
                    .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(&ext))
            })
            .collect();
        // Names sort by time.
        backups.sort();
        while backups.len() > file.max_backups {
            let old = backups.remove(0);
            let _ = std::fs::remove_file(old);
        }
    }
    std::os::unix::fs::OpenOptionsExt::mode(
        std::fs::OpenOptions::new().create(true).append(true),
        0o600,
    )
    .open(&file.path)
}

#[cfg(test)]
mod tests;
