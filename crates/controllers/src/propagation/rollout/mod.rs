//! Progressive rollouts (a placement's `rollout`): the binding controller renders each
//! cluster's Work from the revision [`plan`] decided for it, and keeps the template's
//! revisions as ControllerRevisions.
//!
//! Decision first: what [`plan::step`] decides is written into the binding's
//! `status.rollout`, and Works are rendered only from what is stored there, so a restart,
//! a retry or a lost write never moves a cluster the stored decision did not.

pub mod plan;

use orrery_api::Object;
use orrery_api::interpret::Interpreter;
use serde_json::Value;

/// What a revision holds of a template: what is rendered from it (no status, no server
/// fields), without its replica count (scaling is not a revision, as in Kubernetes).
pub fn content_of(t: &Object, interp: Interpreter<'_>) -> Value {
    let mut v = orrery_api::overrides::strip(t);
    if interp.replicas(&v).is_some() {
        interp.set_replicas(&mut v, 0);
    }
    v
}

/// The template as revision `rev` held it, with the current template's replica count:
/// what a cluster still on that revision renders.
pub fn template_at(rev: &Object, current: &Object, interp: Interpreter<'_>) -> Option<Object> {
    let mut v = rev.other.get("data")?.clone();
    let now = serde_json::to_value(current).ok()?;
    if let Some(n) = interp.replicas(&now) {
        interp.set_replicas(&mut v, n);
    }
    let mut t: Object = serde_json::from_value(v).ok()?;
    t.metadata.uid = current.metadata.uid.clone();
    Some(t)
}
