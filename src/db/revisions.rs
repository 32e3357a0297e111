//! The `pool_revisions` table: each desired image a pool has had.

use super::exec::{Affected, Exec, on_store};
use super::gate::WriteTx;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::domain::object::PoolRef;
use crate::domain::pool::PoolSpec;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct Revision {
    pub revision: i64,
    pub version: String,
    /// The custom image, when the spec had one.
    pub image: Option<String>,
    /// What machines of this revision run.
    pub desired_image: String,
    pub created_at: DateTime<Utc>,
}

/// Records the first revision of a new pool.
pub async fn record_first(db: &mut WriteTx, pool: &PoolRef, spec: &PoolSpec, now: DateTime<Utc>) -> sqlx::Result<()> {
    insert(db.exec(), pool, 1, spec, now).await
}

async fn insert(db: Exec<'_>, pool: &PoolRef, revision: i64, spec: &PoolSpec, now: DateTime<Utc>) -> sqlx::Result<()> {
    on_store!(db, |e| {
        sqlx::query(
            "insert into pool_revisions (pool, revision, version, image, desired_image, created_at, namespace)
         values ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(&pool.name)
        .bind(revision)
        .bind(spec.version().to_string())
        .bind(spec.image())
        .bind(spec.desired_image())
        .bind(now)
        .bind(pool.namespace.as_str())
        .execute(e)
        .await
        .affected()
    })?;
    Ok(())
}

/// When a spec change moves the desired image, starts a new revision (and
/// a new rollout, whose first batch is approved by the change itself).
/// Returns the new revision number, if any.
pub async fn record_change(
    tx: &mut WriteTx,
    pool: &PoolRef,
    old: &PoolSpec,
    new: &PoolSpec,
    now: DateTime<Utc>,
) -> sqlx::Result<Option<i64>> {
    if old.desired_image() == new.desired_image() {
        return Ok(None);
    }
    let revision: i64 = on_store!(tx.exec(), |e| {
        sqlx::query_scalar(
            "update pools set revision = revision + 1, batches_approved = 1, version = version + 1
         where namespace = $2 and name = $1 returning revision",
        )
        .bind(&pool.name)
        .bind(pool.namespace.as_str())
        .fetch_one(e)
        .await
    })?;
    insert(tx.exec(), pool, revision, new, now).await?;
    Ok(Some(revision))
}

/// Every revision of a pool, newest first.
pub async fn list(db: Exec<'_>, pool: &PoolRef) -> sqlx::Result<Vec<Revision>> {
    on_store!(db, |e| sqlx::query_as(
        "select revision, version, image, desired_image, created_at from pool_revisions
         where namespace = $2 and pool = $1 order by revision desc",
    )
    .bind(&pool.name)
    .bind(pool.namespace.as_str())
    .fetch_all(e)
    .await)
}

pub async fn get(db: Exec<'_>, pool: &PoolRef, revision: i64) -> sqlx::Result<Option<Revision>> {
    on_store!(db, |e| {
        sqlx::query_as(
        "select revision, version, image, desired_image, created_at from pool_revisions where namespace = $3 and pool = $1 and revision = $2",
    )
    .bind(&pool.name)
    .bind(revision)
    .bind(pool.namespace.as_str())
    .fetch_optional(e).await
    })
}

/// The newest revision before `current` whose image differs from it: what
/// "roll back" means when no revision is named.
pub async fn previous(db: Exec<'_>, pool: &PoolRef, current: i64) -> sqlx::Result<Option<Revision>> {
    on_store!(db, |e| sqlx::query_as(
        "select r.revision, r.version, r.image, r.desired_image, r.created_at from pool_revisions r
         where r.namespace = $3 and pool = $1 and r.revision < $2
           and r.desired_image != (select desired_image from pool_revisions
                                   where namespace = $3 and pool = $1 and revision = $2)
         order by r.revision desc limit 1",
    )
    .bind(&pool.name)
    .bind(current)
    .bind(pool.namespace.as_str())
    .fetch_optional(e)
    .await)
}
