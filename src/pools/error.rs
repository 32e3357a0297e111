//! What can go wrong with a pool request.

use crate::domain::ValidationErrors;

#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("no pool named {0:?}")]
    NotFound(String),
    #[error("no namespace named {0:?}")]
    NamespaceNotFound(String),
    /// The authorizer's refusal.
    #[error(transparent)]
    Denied(#[from] crate::identity::Denied),
    #[error("no machine named {machine:?} in pool {pool:?}")]
    MachineNotFound { pool: String, machine: String },
    #[error("a pool named {0:?} already exists")]
    Exists(String),
    /// Fields that break a rule, each named.
    #[error("{0}")]
    Invalid(ValidationErrors),
    /// `If-Match` named another generation, or the pool changed meanwhile.
    #[error("{0}")]
    Precondition(String),
    /// The pool's state refuses the request (being deleted, no rollout).
    #[error("{0}")]
    Conflict(String),
    /// The engines could not be read (a dry run).
    #[error("{0}")]
    Unavailable(String),
    #[error("store: {0}")]
    Store(#[from] sqlx::Error),
    #[error(transparent)]
    Internal(anyhow::Error),
}

impl From<ValidationErrors> for PoolError {
    fn from(e: ValidationErrors) -> Self {
        Self::Invalid(e)
    }
}
