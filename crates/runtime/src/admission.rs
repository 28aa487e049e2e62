//! Admission that needs what is stored (Kubernetes' validating admission plugins), as the API
//! server calls it and the controllers implement it: a check of a create or an update of an
//! object's main resource, run after the kind's own rules and before the write. Here so that
//! a check lives with the controller whose objects it reads, and the API server knows only
//! this trait.

use orrery_api::Object;
use orrery_store::Store;

/// A refusal: the HTTP status, the `Status` reason and the message the client is told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
}

/// One admission check.
#[async_trait::async_trait]
pub trait Admission: Send + Sync + std::fmt::Debug {
    /// Whether `obj` may be stored in place of `old` (`None`: a create).
    async fn admit(
        &self,
        store: &dyn Store,
        obj: &Object,
        old: Option<&Object>,
    ) -> Result<(), Refusal>;
}
