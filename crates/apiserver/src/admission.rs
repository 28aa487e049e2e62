//! The admission checks that need what is stored ([`orrery_runtime::admission`]), run on a
//! create or an update of an object's main resource (and its scale), after the kind's own
//! rules and before the write, dry runs included. The checks live with the controllers whose
//! objects they read, and the binary wires them in (`ApiConfig::admission`); the server
//! only calls them and answers their refusal.

use std::sync::Arc;

use orrery_api::Object;
use orrery_api::customization::CustomizationSpec;
use orrery_api::kinds::RESOURCE_INTERPRETER_CUSTOMIZATION;
pub use orrery_runtime::admission::{Admission, Refusal};
use orrery_store::{ListOptions, Store};

use crate::error::{ApiError, ApiResult};

/// Runs `checks` in order; the first refusal answers.
pub async fn run(
    checks: &[Arc<dyn Admission>],
    store: &dyn Store,
    obj: &Object,
    old: Option<&Object>,
) -> ApiResult<()> {
    for c in checks {
        if let Err(r) = c.admit(store, obj, old).await {
            return Err(ApiError::new(r.code, r.reason, r.message));
        }
    }
    Ok(())
}

/// Karmada's admission of a ResourceInterpreterCustomization: no other customization of the
/// same target may script one of the same operations (dependencies may: they add up), so
/// which script runs is never a matter of order. Karmada's message, 403.
pub async fn customization_conflicts(store: &dyn Store, obj: &Object) -> ApiResult<()> {
    let read =
        |o: &Object| -> Option<CustomizationSpec> { serde_json::from_value(o.spec.clone()?).ok() };
    let Some(spec) = read(obj) else {
        return Ok(());
    };
    let others = store
        .list(
            &RESOURCE_INTERPRETER_CUSTOMIZATION.prefix(None),
            &ListOptions::default(),
        )
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    for other in others.items.iter().filter(|o| o.name() != obj.name()) {
        let Some(theirs) = read(other) else {
            continue;
        };
        if let Some(op) = theirs.conflicts(&spec).first() {
            return Err(ApiError::forbidden(format!(
                "conflicting with InterpreterOperation({}) of existing \
                 ResourceInterpreterCustomization({})",
                op.name(),
                other.name()
            )));
        }
    }
    Ok(())
}
