//! The `pools` table.

use chrono::{DateTime, Utc};
use sqlx::{AssertSqlSafe, SqliteExecutor, SqlitePool};

use super::gate::WriteTx;
use super::pool_cache::Cached;
pub use super::pool_row::Pool;
use super::pool_row::PoolRow;
use super::pool_spec::StoredSpec;
use super::store::Db;
use crate::domain::event::{EventType, NewEvent};
use crate::domain::pool::PoolSpec;
use crate::domain::status::PoolStatus;

/// Pool reads through the cache of pools as last committed.
impl Db {
    /// A pool as last committed, from memory when it can be.
    pub async fn pool(&self, name: &str) -> sqlx::Result<Option<Pool>> {
        self.cached_pool(&self.api, name).await
    }

    /// The same, for a background worker (its misses use its own readers).
    pub async fn pool_for_worker(&self, name: &str) -> sqlx::Result<Option<Pool>> {
        self.cached_pool(&self.background, name).await
    }

    /// A pool as last committed, shared, with room for its rendered answer.
    pub async fn pool_shared(&self, name: &str) -> sqlx::Result<Option<std::sync::Arc<Cached>>> {
        match self.pools.get(name) {
            Ok(cached) => Ok(Some(cached)),
            Err(miss) => {
                let pool = get(&self.api, name).await?;
                Ok(self.pools.fill(miss, pool.as_ref()))
            }
        }
    }

    async fn cached_pool(&self, readers: &SqlitePool, name: &str) -> sqlx::Result<Option<Pool>> {
        match self.pools.get(name) {
            Ok(cached) => Ok(Some(cached.pool.clone())),
            Err(miss) => {
                let pool = get(readers, name).await?;
                self.pools.fill(miss, pool.as_ref());
                Ok(pool)
            }
        }
    }
}

const COLUMNS: &str = "name, generation, spec, status, deleting, revision, batches_approved, created_at, updated_at";

fn to_json<T: serde::Serialize>(v: &T) -> sqlx::Result<String> {
    serde_json::to_string(v).map_err(|e| sqlx::Error::Encode(e.into()))
}

/// Inserts a new pool; a duplicate name fails with a unique violation.
pub async fn insert(tx: &mut WriteTx, name: &str, spec: &PoolSpec, now: DateTime<Utc>) -> sqlx::Result<Pool> {
    tx.touched_pool(name);
    let row: PoolRow = sqlx::query_as(AssertSqlSafe(format!(
        "insert into pools (name, generation, spec, status, deleting, created_at, updated_at)
         values (?, 1, ?, '{{}}', 0, ?, ?) returning {COLUMNS}"
    )))
    .bind(name)
    .bind(to_json(&StoredSpec::from(spec))?)
    .bind(now)
    .bind(now)
    .fetch_one(&mut **tx)
    .await?;
    row.try_into()
}

pub async fn get(db: impl SqliteExecutor<'_>, name: &str) -> sqlx::Result<Option<Pool>> {
    let row: Option<PoolRow> = sqlx::query_as(AssertSqlSafe(format!("select {COLUMNS} from pools where name = ?")))
        .bind(name)
        .fetch_optional(db)
        .await?;
    row.map(Pool::try_from).transpose()
}

/// Up to `limit` pools with names after `after`, in name order.
pub async fn list(db: impl SqliteExecutor<'_>, after: Option<&str>, limit: u32) -> sqlx::Result<Vec<Pool>> {
    let rows: Vec<PoolRow> =
        sqlx::query_as(AssertSqlSafe(format!("select {COLUMNS} from pools where name > ? order by name limit ?")))
            .bind(after.unwrap_or(""))
            .bind(limit)
            .fetch_all(db)
            .await?;
    rows.into_iter().map(Pool::try_from).collect()
}

/// Every pool name, for the worker's resync.
pub async fn names(db: impl SqliteExecutor<'_>) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar("select name from pools order by name").fetch_all(db).await
}

/// Replaces the spec and bumps the generation, but only if the stored
/// generation is still `expected`: a compare-and-swap, so that of two
/// concurrent writers that read the same generation exactly one wins.
/// `None` means the generation moved on (or the pool is gone).
pub async fn update_spec(
    tx: &mut WriteTx,
    name: &str,
    expected: i64,
    spec: &PoolSpec,
    now: DateTime<Utc>,
) -> sqlx::Result<Option<Pool>> {
    tx.touched_pool(name);
    let row: Option<PoolRow> = sqlx::query_as(AssertSqlSafe(format!(
        "update pools set spec = ?, generation = generation + 1, updated_at = ?
         where name = ? and generation = ? and deleting = 0
         returning {COLUMNS}"
    )))
    .bind(to_json(&StoredSpec::from(spec))?)
    .bind(now)
    .bind(name)
    .bind(expected)
    .fetch_optional(&mut **tx)
    .await?;
    row.map(Pool::try_from).transpose()
}

/// Flags the pool for deletion; `None` when it does not exist or was
/// flagged already. A write first, so the transaction takes the lock at once.
pub async fn mark_deleting(tx: &mut WriteTx, name: &str, now: DateTime<Utc>) -> sqlx::Result<Option<Pool>> {
    tx.touched_pool(name);
    let row: Option<PoolRow> = sqlx::query_as(AssertSqlSafe(format!(
        "update pools set deleting = 1, updated_at = ? where name = ? and deleting = 0 returning {COLUMNS}"
    )))
    .bind(now)
    .bind(name)
    .fetch_optional(&mut **tx)
    .await?;
    row.map(Pool::try_from).transpose()
}

/// Lowers `replicas` by one in a single statement (no read-modify-write
/// race); `None` when the pool is missing, deleting, or already at zero.
pub async fn decrement_replicas(tx: &mut WriteTx, name: &str, now: DateTime<Utc>) -> sqlx::Result<Option<Pool>> {
    tx.touched_pool(name);
    let row: Option<PoolRow> = sqlx::query_as(AssertSqlSafe(format!(
        "update pools set spec = json_set(spec, '$.replicas', json_extract(spec, '$.replicas') - 1),
                          generation = generation + 1, updated_at = ?
         where name = ? and deleting = 0 and json_extract(spec, '$.replicas') > 0
         returning {COLUMNS}"
    )))
    .bind(now)
    .bind(name)
    .fetch_optional(&mut **tx)
    .await?;
    row.map(Pool::try_from).transpose()
}

pub async fn write_status(tx: &mut WriteTx, name: &str, status: &PoolStatus) -> sqlx::Result<()> {
    tx.touched_pool(name);
    sqlx::query("update pools set status = ? where name = ?")
        .bind(to_json(status)?)
        .bind(name)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Approves one more batch of the current rollout.
pub async fn approve_batch(tx: &mut WriteTx, name: &str) -> sqlx::Result<Option<Pool>> {
    tx.touched_pool(name);
    let row: Option<PoolRow> = sqlx::query_as(AssertSqlSafe(format!(
        "update pools set batches_approved = batches_approved + 1 where name = ? returning {COLUMNS}"
    )))
    .bind(name)
    .fetch_optional(&mut **tx)
    .await?;
    row.map(Pool::try_from).transpose()
}

/// Removes the row of a pool whose machines are all gone.
pub async fn remove(tx: &mut WriteTx, name: &str) -> sqlx::Result<bool> {
    tx.touched_pool(name);
    let done = sqlx::query("delete from pools where name = ? and deleting = 1").bind(name).execute(&mut **tx).await?;
    Ok(done.rows_affected() == 1)
}

/// A spec change as written: the pool after it, and the revision it
/// started when it moved the desired image.
pub struct SpecWritten {
    pub pool: Pool,
    pub revision: Option<i64>,
}

/// The one way a spec changes, in the caller's transaction: the
/// compare-and-swap of the generation (from `pool.generation`), a new
/// revision when the desired image moves, the caller's event (given the new
/// revision, if any), and `RolloutStarted` when a revision began. `None`
/// when the generation moved on meanwhile; nothing is written then.
pub async fn change_spec(
    tx: &mut WriteTx,
    pool: &Pool,
    spec: &PoolSpec,
    now: DateTime<Utc>,
    event: impl FnOnce(Option<i64>) -> NewEvent,
) -> sqlx::Result<Option<SpecWritten>> {
    let Some(updated) = update_spec(tx, &pool.name, pool.generation, spec, now).await? else {
        return Ok(None);
    };
    let revision = super::revisions::record_change(tx, &pool.name, &pool.spec, spec, now).await?;
    super::events::record(tx, &event(revision), now).await?;
    if let Some(revision) = revision {
        let message = format!("revision {revision}: machines move to {}", spec.desired_image());
        super::events::record(tx, &NewEvent::pool(&pool.name, EventType::Normal, "RolloutStarted", message), now)
            .await?;
    }
    Ok(Some(SpecWritten { pool: updated, revision }))
}
