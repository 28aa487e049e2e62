//! Deletion as the API server does it, for components that write the store directly:
//! finalizers hold an object back until each one is removed.
//!
//! A conflict (the object changed since the caller read it) is returned, never taken as done:
//! the caller decides again from the newer version, or the deletion would be lost.

use orrery_api::{Object, Time};
use serde_json::Value;

use crate::{Preconditions, Store, StoreError};

/// Deletes an object as a client with `propagationPolicy: Background` would: objects with
/// finalizers are marked for deletion, others removed. `obj` is the version the decision was
/// made from: if the stored one is newer, [`StoreError::Conflict`].
pub async fn delete_object(store: &dyn Store, key: &str, obj: &Object) -> Result<(), StoreError> {
    if obj.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let rev = obj.revision();
    if obj.metadata.finalizers.is_empty() {
        let pre = Preconditions {
            uid: Some(obj.metadata.uid.clone()),
            revision: rev,
        };
        return match store.delete(key, &pre).await {
            Ok(_) | Err(StoreError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        };
    }
    let mut next = obj.clone();
    next.metadata.deletion_timestamp = Some(Time::now());
    next.metadata.deletion_grace_period_seconds = Some(0);
    match store.update(key, next, rev).await {
        Ok(_) | Err(StoreError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Removes `finalizer` from the object at `key`; an object being deleted that is left with no
/// finalizer is removed. Conflicts are retried a few times, then returned.
pub async fn remove_finalizer(
    store: &dyn Store,
    key: &str,
    finalizer: &str,
) -> Result<(), StoreError> {
    let mut last = None;
    for _ in 0..8 {
        let obj = match store.get(key).await {
            Ok(o) => o,
            Err(StoreError::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        if !obj.metadata.finalizers.iter().any(|f| f == finalizer) {
            return Ok(());
        }
        let rev = obj.revision();
        let mut next = obj.clone();
        next.metadata.finalizers.retain(|f| f != finalizer);
        let gone = next.metadata.deletion_timestamp.is_some()
            && next.metadata.finalizers.is_empty()
            && namespace_spec_finalized(&next);
        let result = if gone {
            store
                .delete(
                    key,
                    &Preconditions {
                        uid: Some(obj.metadata.uid.clone()),
                        revision: rev,
                    },
                )
                .await
                .map(|_| ())
        } else {
            store.update(key, next, rev).await.map(|_| ())
        };
        match result {
            Ok(()) | Err(StoreError::NotFound { .. }) => return Ok(()),
            Err(e @ StoreError::Conflict { .. }) => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        StoreError::Backend(format!("removing a finalizer of {key} kept conflicting"))
    }))
}

pub fn namespace_spec_finalized(obj: &Object) -> bool {
    obj.kind != "Namespace"
        || obj
            .spec
            .as_ref()
            .and_then(|s| s.get("finalizers"))
            .and_then(Value::as_array)
            .is_none_or(|f| f.is_empty())
}
