//! The `pools` table.

use chrono::{DateTime, Utc};
use sqlx::{AssertSqlSafe, SqliteExecutor};

use super::pool_spec::StoredSpec;
use crate::domain::event::{EventType, NewEvent};
use crate::domain::pool::PoolSpec;
use crate::domain::status::PoolStatus;

/// A stored pool: its spec, what was last observed, and bookkeeping.
#[derive(Debug, Clone)]
pub struct Pool {
    pub name: String,
    pub generation: i64,
    pub spec: PoolSpec,
    pub status: PoolStatus,
    pub deleting: bool,
    /// Current revision of the desired image.
    pub revision: i64,
    /// Batches of the current rollout approved so far.
    pub batches_approved: i64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

#[derive(sqlx::FromRow)]
struct PoolRow {
    name: String,
    generation: i64,
    spec: String,
    status: String,
    deleting: bool,
    revision: i64,
    batches_approved: i64,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

impl TryFrom<PoolRow> for Pool {
    type Error = sqlx::Error;

    fn try_from(r: PoolRow) -> Result<Self, Self::Error> {
        let decode = |what: &str, e: serde_json::Error| {
            sqlx::Error::Decode(format!("pool {:?}: stored {what} is not valid: {e}", r.name).into())
        };
        let spec = serde_json::from_str::<StoredSpec>(&r.spec).map_err(|e| decode("spec", e))?.into();
        let status = serde_json::from_str(&r.status).map_err(|e| decode("status", e))?;
        Ok(Pool {
            name: r.name,
            generation: r.generation,
            spec,
            status,
            deleting: r.deleting,
            revision: r.revision,
            batches_approved: r.batches_approved,
            created_at: r.created_at,
            updated_at: r.updated_at,
        })
    }
}

const COLUMNS: &str = "name, generation, spec, status, deleting, revision, batches_approved, created_at, updated_at";

fn to_json<T: serde::Serialize>(v: &T) -> sqlx::Result<String> {
    serde_json::to_string(v).map_err(|e| sqlx::Error::Encode(e.into()))
}

/// Inserts a new pool; a duplicate name fails with a unique violation.
pub async fn insert(tx: &mut super::WriteTx, name: &str, spec: &PoolSpec, now: DateTime<Utc>) -> sqlx::Result<Pool> {
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
    tx: &mut super::WriteTx,
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
pub async fn mark_deleting(tx: &mut super::WriteTx, name: &str, now: DateTime<Utc>) -> sqlx::Result<Option<Pool>> {
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
pub async fn decrement_replicas(tx: &mut super::WriteTx, name: &str, now: DateTime<Utc>) -> sqlx::Result<Option<Pool>> {
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

pub async fn write_status(tx: &mut super::WriteTx, name: &str, status: &PoolStatus) -> sqlx::Result<()> {
    tx.touched_pool(name);
    sqlx::query("update pools set status = ? where name = ?")
        .bind(to_json(status)?)
        .bind(name)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Approves one more batch of the current rollout.
pub async fn approve_batch(tx: &mut super::WriteTx, name: &str) -> sqlx::Result<Option<Pool>> {
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
pub async fn remove(tx: &mut super::WriteTx, name: &str) -> sqlx::Result<bool> {
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
    tx: &mut super::WriteTx,
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
