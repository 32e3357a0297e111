//! Returning a pool to an earlier revision: by request, or by itself when
//! a rollout stalls and `strategy.auto_rollback` is set.

use crate::domain::object::PoolRef;
use chrono::{DateTime, Utc};

use crate::db::revisions::Revision;
use crate::db::{self, Db, pools::Pool};
use crate::domain::event::{EventType, NewEvent};
use crate::domain::pool::{PoolSpec, SpecLimits};
use crate::replicas::Fence;

#[derive(Debug, thiserror::Error)]
pub enum RollbackError {
    #[error("pool {0} has no earlier revision with another image to return to")]
    NoPrevious(PoolRef),
    #[error("pool {pool} has no revision {revision}")]
    UnknownRevision { pool: PoolRef, revision: i64 },
    #[error("revision {0} runs the image the pool already runs")]
    SameImage(i64),
    #[error("pool {0} changed while rolling back; read it again")]
    Conflict(PoolRef),
    #[error("stored revision {revision} has a bad version {version:?}")]
    BadRevision { revision: i64, version: String },
    #[error("store: {0}")]
    Store(#[from] sqlx::Error),
    /// The reconciler's rollback, by a replica that no longer drives the pool.
    #[error(transparent)]
    Lost(#[from] crate::replicas::Lost),
}

impl From<crate::replicas::FenceError> for RollbackError {
    fn from(e: crate::replicas::FenceError) -> Self {
        match e {
            crate::replicas::FenceError::Lost(lost) => Self::Lost(lost),
            crate::replicas::FenceError::Store(e) => Self::Store(e),
        }
    }
}

/// The pool after a rollback, at the new revision that restores the old image.
pub struct RolledBack {
    pub pool: Pool,
    /// Revision whose image the pool returned to.
    pub to: i64,
    /// The new revision recording the return.
    pub revision: i64,
}

/// Sets the pool's `version` and `image` to those of `target` (default: the
/// newest earlier revision with another image), only if the pool is still
/// at the generation it was read at. Makes a new revision and an event.
/// `fence` is the reconciler's ([`Fence::Sole`] for a request's).
/// `current` with revision `rev`'s version and image, by the spec's rules;
/// today's settings are checked on every pass, as for any stored spec.
pub fn spec_of(current: &PoolSpec, rev: &Revision) -> Result<PoolSpec, RollbackError> {
    let back = serde_json::json!({ "version": rev.version, "image": rev.image });
    current
        .patched(&back, &SpecLimits::unrestricted())
        .map_err(|_| RollbackError::BadRevision { revision: rev.revision, version: rev.version.clone() })
}

pub async fn rollback(
    db: &Db,
    fence: &Fence,
    pool: &Pool,
    target: Option<i64>,
    why: &str,
    now: DateTime<Utc>,
) -> Result<RolledBack, RollbackError> {
    let rev = match target {
        Some(revision) => db::revisions::get(db.read(), &pool.id, revision)
            .await?
            .ok_or_else(|| RollbackError::UnknownRevision { pool: pool.id.clone(), revision })?,
        None => db::revisions::previous(db.read(), &pool.id, pool.revision)
            .await?
            .ok_or_else(|| RollbackError::NoPrevious(pool.id.clone()))?,
    };
    let spec = spec_of(&pool.spec, &rev)?;
    if spec.desired_image() == pool.spec.desired_image() {
        return Err(RollbackError::SameImage(rev.revision));
    }
    // A request's rollback, or the reconciler's when a rollout stalls: rare
    // either way, and someone waits for it.
    let mut tx = db.begin_write().await?;
    fence.prove(&mut tx).await?;
    let event = |revision: Option<i64>| {
        let revision = revision.unwrap_or(pool.revision);
        let message =
            format!("{why}: rolling back to revision {} ({}) as revision {revision}", rev.revision, rev.desired_image);
        NewEvent::pool(&pool.id, EventType::Warning, "RolledBack", message)
    };
    let Some(written) = db::pools::change_spec(&mut tx, pool, &spec, now, event).await? else {
        return Err(RollbackError::Conflict(pool.id.clone()));
    };
    let updated = written.pool;
    let revision = written.revision.unwrap_or(updated.revision);
    tx.commit().await?;
    let pool = db.pool(&pool.id).await?.unwrap_or(updated);
    tracing::warn!(pool = %pool.id, to = rev.revision, revision, "rolled back");
    Ok(RolledBack { pool, to: rev.revision, revision })
}
