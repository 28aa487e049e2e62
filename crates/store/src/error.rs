use crate::Revision;

/// Everything a store operation can fail with. The API server maps each variant to one HTTP
/// status (`NotFound` 404, `AlreadyExists` 409, `Conflict` 409, `Expired` 410, ...).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("{key} not found")]
    NotFound { key: String },

    #[error("{key} already exists")]
    AlreadyExists { key: String },

    /// A compare-and-swap lost: the object changed since the caller read it.
    #[error("conflict on {key}: expected revision {expected}, current revision {current}")]
    Conflict {
        key: String,
        expected: Revision,
        current: Revision,
    },

    /// A delete precondition (uid or resourceVersion) does not hold.
    #[error("precondition failed for {key}: {message}")]
    PreconditionFailed { key: String, message: String },

    /// The requested revision has been compacted away; the client must re-list.
    #[error("revision {requested} has been compacted (oldest available revision is {compacted})")]
    Expired {
        requested: Revision,
        compacted: Revision,
    },

    /// The requested revision has not happened yet.
    #[error("revision {requested} is newer than the current revision {current}")]
    FutureRevision {
        requested: Revision,
        current: Revision,
    },

    #[error("invalid continue token: {0}")]
    InvalidContinue(String),

    #[error("invalid request: {0}")]
    InvalidArgument(String),

    /// The data on disk cannot be trusted; the store refuses to use it.
    #[error("corrupt store: {0}")]
    Corrupt(String),

    /// An I/O or backend failure (disk full, etcd unreachable...).
    #[error("store backend error: {0}")]
    Backend(String),

    #[error("store is closed")]
    Closed,

    /// The backend cannot commit now (etcd without quorum): nothing was written; try again.
    #[error("store unavailable: {0}")]
    Unavailable(String),

    /// The backend is overloaded and refused the request before carrying it out (etcd's
    /// "too many requests": its apply falls behind its log). Nothing was written; try again
    /// shortly.
    #[error("store busy: {0}")]
    Busy(String),

    /// A fenced write found its fence gone: the leader lease it was made under is held by
    /// another server, or by another term of this one. Nothing was written.
    #[error("fenced: {key} is no longer held by {holder}")]
    Fenced { key: String, holder: String },
}

impl StoreError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, StoreError::NotFound { .. })
    }
    pub fn is_conflict(&self) -> bool {
        matches!(self, StoreError::Conflict { .. })
    }
    pub fn is_expired(&self) -> bool {
        matches!(self, StoreError::Expired { .. })
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;
