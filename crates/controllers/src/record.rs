//! What controllers leave behind for people: Kubernetes Events on the objects they act on
//! (`kubectl describe`, `kubectl get events`), and the failure history the DRO-DS API serves
//! (`/api/v1/history/failures`).

use std::sync::Arc;

use orrery_api::{Object, Time, keys};
use orrery_store::stamp::new_object;
use orrery_store::{ListOptions, Store, StoreError};
use serde_json::{Value, json};

/// Where failure records live (a key space the REST API does not expose as objects).
pub use orrery_api::history::FAILURES_PREFIX;

/// Records a Kubernetes Event about `about` (in `default` for cluster-scoped objects).
pub async fn event(
    store: &dyn Store,
    about: &Object,
    type_: &str,
    reason: &str,
    message: &str,
    component: &str,
) -> Result<(), StoreError> {
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    create_event(
        store,
        about,
        &suffix[..16],
        type_,
        reason,
        message,
        component,
    )
    .await
}

/// Records an Event about `about` that is told once for its `reason`: named after the
/// object's uid and the reason, so that one already stored (before a restart) stays the only one.
pub async fn event_once(
    store: &dyn Store,
    about: &Object,
    type_: &str,
    reason: &str,
    message: &str,
    component: &str,
) -> Result<(), StoreError> {
    event_once_for(
        store,
        about,
        &about.metadata.uid,
        type_,
        reason,
        message,
        component,
    )
    .await
    .map(|_| ())
}

/// Like [`event_once`], told once for `key` (another object's uid, say: a migration's start is
/// told on its workload once per migration). Whether it was told now (false: it had been).
pub async fn event_once_for(
    store: &dyn Store,
    about: &Object,
    key: &str,
    type_: &str,
    reason: &str,
    message: &str,
    component: &str,
) -> Result<bool, StoreError> {
    let key: String = key
        .chars()
        .filter(char::is_ascii_hexdigit)
        .take(16)
        .collect();
    let suffix = format!("{key}.{}", reason.to_lowercase());
    match create_event(store, about, &suffix, type_, reason, message, component).await {
        Err(StoreError::AlreadyExists { .. }) => Ok(false),
        other => other.map(|_| true),
    }
}

/// Removes the Event [`event_once`] recorded about `about` for `reason`, if there is one (what
/// it said is no longer so).
pub async fn forget_once(
    store: &dyn Store,
    about: &Object,
    reason: &str,
) -> Result<(), StoreError> {
    let uid: String = about
        .metadata
        .uid
        .chars()
        .filter(char::is_ascii_hexdigit)
        .take(16)
        .collect();
    let ns = if about.namespace().is_empty() {
        "default"
    } else {
        about.namespace()
    };
    let name = format!("{}.{uid}.{}", about.name(), reason.to_lowercase());
    match store
        .delete(&keys::well_known::event(ns, &name), &Default::default())
        .await
    {
        Ok(_) | Err(StoreError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

async fn create_event(
    store: &dyn Store,
    about: &Object,
    suffix: &str,
    type_: &str,
    reason: &str,
    message: &str,
    component: &str,
) -> Result<(), StoreError> {
    let ns = if about.namespace().is_empty() {
        "default"
    } else {
        about.namespace()
    };
    let now = Time::now();
    let name = format!("{}.{suffix}", about.name());
    let mut e = new_object("v1", "Event", Some(ns), &name);
    // As kube-apiserver: an Event has no generation.
    e.metadata.generation = None;
    let fields = [
        (
            "involvedObject",
            json!({
                "apiVersion": about.api_version, "kind": about.kind, "name": about.name(),
                "namespace": if about.namespace().is_empty() { Value::Null } else { json!(about.namespace()) },
                "uid": about.metadata.uid,
            }),
        ),
        ("reason", json!(reason)),
        ("message", json!(message)),
        ("type", json!(type_)),
        ("source", json!({ "component": component })),
        ("reportingComponent", json!(component)),
        ("firstTimestamp", json!(now.to_string())),
        ("lastTimestamp", json!(now.to_string())),
        ("count", json!(1)),
    ];
    for (k, v) in fields {
        e.other.insert(k.into(), v);
    }
    store
        .create(&keys::well_known::event(ns, &name), e)
        .await
        .map(|_| ())
}

pub use orrery_api::history::FailureRecord;

/// Appends a record to the failure history (keys sort by time).
pub async fn failure(store: &dyn Store, rec: &FailureRecord) -> Result<(), StoreError> {
    let unique = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let (key, o) = orrery_api::history::failure_entry(rec, unique);
    store.create(&key, o).await.map(|_| ())
}

/// The failure history, oldest first.
pub async fn failures(store: &dyn Store) -> Result<Vec<FailureRecord>, StoreError> {
    let list = store.list(FAILURES_PREFIX, &ListOptions::default()).await?;
    Ok(list
        .items
        .into_iter()
        .filter_map(|o| o.spec.and_then(|s| serde_json::from_value(s).ok()))
        .collect())
}

/// Deletes failure records older than `keep_seconds`.
pub async fn prune_failures(
    store: &Arc<dyn Store>,
    keep_seconds: i64,
) -> Result<usize, StoreError> {
    let cutoff = Time::now().unix_seconds() - keep_seconds;
    let list = store
        .list(FAILURES_PREFIX, &ListOptions::default().with_limit(1000))
        .await?;
    let mut n = 0;
    for o in list.items {
        let old = o
            .metadata
            .creation_timestamp
            .is_some_and(|t| t.unix_seconds() < cutoff);
        if !old {
            break;
        }
        match store
            .delete(
                &format!("{FAILURES_PREFIX}{}", o.name()),
                &Default::default(),
            )
            .await
        {
            Ok(_) | Err(StoreError::NotFound { .. }) => n += 1,
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}
