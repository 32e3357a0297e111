//! The `pool_revisions` table: each desired image a pool has had.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::SqliteConnection;
use sqlx::SqliteExecutor;
use utoipa::ToSchema;

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
pub async fn record_first(
    db: &mut SqliteConnection,
    pool: &str,
    spec: &PoolSpec,
    now: DateTime<Utc>,
) -> sqlx::Result<()> {
    insert(db, pool, 1, spec, now).await
}

async fn insert(
    db: impl SqliteExecutor<'_>,
    pool: &str,
    revision: i64,
    spec: &PoolSpec,
    now: DateTime<Utc>,
) -> sqlx::Result<()> {
    sqlx::query(
        "insert into pool_revisions (pool, revision, version, image, desired_image, created_at) values (?, ?, ?, ?, ?, ?)",
    )
    .bind(pool)
    .bind(revision)
    .bind(spec.version.to_string())
    .bind(&spec.image)
    .bind(spec.desired_image())
    .bind(now)
    .execute(db)
    .await?;
    Ok(())
}

/// When a spec change moves the desired image, starts a new revision (and
/// a new rollout, whose first batch is approved by the change itself).
/// Returns the new revision number, if any.
pub async fn record_change(
    tx: &mut sqlx::SqliteConnection,
    pool: &str,
    old: &PoolSpec,
    new: &PoolSpec,
    now: DateTime<Utc>,
) -> sqlx::Result<Option<i64>> {
    if old.desired_image() == new.desired_image() {
        return Ok(None);
    }
    let revision: i64 = sqlx::query_scalar(
        "update pools set revision = revision + 1, batches_approved = 1 where name = ? returning revision",
    )
    .bind(pool)
    .fetch_one(&mut *tx)
    .await?;
    insert(&mut *tx, pool, revision, new, now).await?;
    Ok(Some(revision))
}

/// Every revision of a pool, newest first.
pub async fn list(db: impl SqliteExecutor<'_>, pool: &str) -> sqlx::Result<Vec<Revision>> {
    sqlx::query_as(
        "select revision, version, image, desired_image, created_at from pool_revisions
         where pool = ? order by revision desc",
    )
    .bind(pool)
    .fetch_all(db)
    .await
}

pub async fn get(db: impl SqliteExecutor<'_>, pool: &str, revision: i64) -> sqlx::Result<Option<Revision>> {
    sqlx::query_as(
        "select revision, version, image, desired_image, created_at from pool_revisions where pool = ? and revision = ?",
    )
    .bind(pool)
    .bind(revision)
    .fetch_optional(db)
    .await
}

/// The newest revision before `current` whose image differs from it: what
/// "roll back" means when no revision is named.
pub async fn previous(db: impl SqliteExecutor<'_>, pool: &str, current: i64) -> sqlx::Result<Option<Revision>> {
    sqlx::query_as(
        "select r.revision, r.version, r.image, r.desired_image, r.created_at from pool_revisions r
         where r.pool = ?1 and r.revision < ?2
           and r.desired_image != (select desired_image from pool_revisions where pool = ?1 and revision = ?2)
         order by r.revision desc limit 1",
    )
    .bind(pool)
    .bind(current)
    .fetch_optional(db)
    .await
}
