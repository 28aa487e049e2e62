//! The admission checks that need what is stored ([`orrery_runtime::admission`]), run on a
//! create or an update of an object's main resource (and its scale), after the kind's own
//! rules and before the write, dry runs included. The checks live with the controllers whose
//! objects they read, and the binary wires them in (`ApiConfig::admission`); the server
//! only calls them and answers their refusal.

use std::sync::Arc;

use orrery_api::Object;
pub use orrery_runtime::admission::{Admission, Refusal};

use crate::error::{ApiError, ApiResult};

/// Runs `checks` in order; the first refusal answers.
pub async fn run(
    checks: &[Arc<dyn Admission>],
    store: &dyn orrery_store::Store,
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
