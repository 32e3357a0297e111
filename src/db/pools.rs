//! The `pools` table.

use chrono::{DateTime, Utc};
use sqlx::AssertSqlSafe;

use super::exec::{Affected, Exec, on_store};
use super::freshness::ReadSource;
use super::gate::WriteTx;
use super::pool_cache::Cached;
pub use super::pool_row::Pool;
use super::pool_row::PoolRow;
use super::store::Db;
use crate::domain::event::{EventType, NewEvent};
use crate::domain::object::{Namespace, PoolRef};
use crate::domain::pool::PoolSpec;
use crate::domain::status::PoolStatus;

/// Pool reads through the cache of pools as last committed: on
/// PostgreSQL once the cache has caught up with the store, or straight
/// from the store when it cannot ([`super::freshness`]).
impl Db {
    /// A pool as last committed, from memory when it can be.
    pub async fn pool(&self, pool: &PoolRef) -> sqlx::Result<Option<Pool>> {
        Ok(self.cached_pool(false, pool).await?.map(|c| c.pool.clone()))
    }

    /// The same, for a background worker (its misses use its own readers).
    pub async fn pool_for_worker(&self, pool: &PoolRef) -> sqlx::Result<Option<Pool>> {
        Ok(self.cached_pool(true, pool).await?.map(|c| c.pool.clone()))
    }

    /// A pool as last committed, shared, with room for its rendered answer.
    pub async fn pool_shared(&self, pool: &PoolRef) -> sqlx::Result<Option<std::sync::Arc<Cached>>> {
        self.cached_pool(false, pool).await
    }

    async fn cached_pool(&self, worker: bool, name: &PoolRef) -> sqlx::Result<Option<std::sync::Arc<Cached>>> {
        let readers = || if worker { self.background() } else { self.read() };
        let stats = self.freshness.as_deref().map(|f| &f.stats);
        if let Some(fresh) = &self.freshness
            && let Err(why) = if worker { fresh.heard() } else { fresh.catch_up().await }
        {
            fresh.stats.read(why.into());
            return Ok(get(readers(), name).await?.map(Cached::new));
        }
        match self.pools.get(name) {
            Ok(cached) => {
                stats.inspect(|s| s.read(ReadSource::Cache));
                Ok(Some(cached))
            }
            Err(miss) => {
                stats.inspect(|s| s.read(ReadSource::Store));
                let pool = get(readers(), name).await?;
                Ok(self.pools.fill(miss, pool.as_ref()))
            }
        }
    }
}

const COLUMNS: &str =
    "namespace, name, generation, version, spec, status, deleting, revision, batches_approved, created_at, updated_at";

fn to_json<T: serde::Serialize>(v: &T) -> sqlx::Result<String> {
    serde_json::to_string(v).map_err(|e| sqlx::Error::Encode(e.into()))
}

/// Inserts a new pool; a duplicate name fails with a unique violation.
pub async fn insert(tx: &mut WriteTx, pool: &PoolRef, spec: &PoolSpec, now: DateTime<Utc>) -> sqlx::Result<Pool> {
    tx.touched_pool(pool);
    let spec = to_json(&spec.view())?;
    let row: PoolRow = on_store!(tx.exec(), |e| sqlx::query_as(AssertSqlSafe(format!(
        "insert into pools (name, generation, spec, status, deleting, created_at, updated_at, namespace)
         values ($1, 1, $2, '{{}}', false, $3, $3, $4) returning {COLUMNS}"
    )))
    .bind(&pool.name)
    .bind(&spec)
    .bind(now)
    .bind(pool.namespace.as_str())
    .fetch_one(e)
    .await?);
    row.try_into()
}

pub async fn get(db: Exec<'_>, pool: &PoolRef) -> sqlx::Result<Option<Pool>> {
    let row: Option<PoolRow> = on_store!(db, |e| sqlx::query_as(AssertSqlSafe(format!(
        "select {COLUMNS} from pools where namespace = $1 and name = $2"
    )))
    .bind(pool.namespace.as_str())
    .bind(&pool.name)
    .fetch_optional(e)
    .await?);
    row.map(Pool::try_from).transpose()
}

/// Up to `limit` pools of `namespace` with names after `after`, in name
/// order.
pub async fn list(db: Exec<'_>, namespace: &Namespace, after: Option<&str>, limit: u32) -> sqlx::Result<Vec<Pool>> {
    let rows: Vec<PoolRow> = on_store!(db, |e| sqlx::query_as(AssertSqlSafe(format!(
        "select {COLUMNS} from pools where namespace = $3 and name > $1 order by name limit $2"
    )))
    .bind(after.unwrap_or(""))
    .bind(i64::from(limit))
    .bind(namespace.as_str())
    .fetch_all(e)
    .await?);
    rows.into_iter().map(Pool::try_from).collect()
}

/// Up to `limit` pools of any of `namespaces` (of every namespace: `None`)
/// after `after`, in (namespace, name) order.
pub async fn list_across(
    db: Exec<'_>,
    namespaces: Option<&[Namespace]>,
    after: Option<&PoolRef>,
    limit: u32,
) -> sqlx::Result<Vec<Pool>> {
    let (after_ns, after_name) = after.map_or(("", ""), |p| (p.namespace.as_str(), p.name.as_str()));
    // One parameter a namespace: both stores read `in ($4, $5, ...)`.
    let filter = match namespaces {
        None => String::new(),
        Some([]) => return Ok(Vec::new()),
        Some(list) => {
            let params: Vec<String> = (4..4 + list.len()).map(|n| format!("${n}")).collect();
            format!("and namespace in ({})", params.join(", "))
        }
    };
    let sql = format!(
        "select {COLUMNS} from pools where (namespace > $1 or (namespace = $1 and name > $2)) {filter}
         order by namespace, name limit $3"
    );
    let rows: Vec<PoolRow> = on_store!(db, |e| {
        let mut q = sqlx::query_as(AssertSqlSafe(sql)).bind(after_ns).bind(after_name).bind(i64::from(limit));
        for namespace in namespaces.unwrap_or_default() {
            q = q.bind(namespace.as_str());
        }
        q.fetch_all(e).await?
    });
    rows.into_iter().map(Pool::try_from).collect()
}

/// Every pool, for the worker's resync.
pub async fn all_refs(db: Exec<'_>) -> sqlx::Result<Vec<PoolRef>> {
    let rows: Vec<(String, String)> =
        on_store!(db, |e| sqlx::query_as("select namespace, name from pools order by namespace, name")
            .fetch_all(e)
            .await?);
    Ok(rows.into_iter().map(|(namespace, name)| PoolRef::new(Namespace::stored(namespace), name)).collect())
}

/// Replaces the spec and bumps the generation, but only if the stored
/// generation is still `expected`: a compare-and-swap, so that of two
/// concurrent writers that read the same generation exactly one wins.
/// `None` means the generation moved on (or the pool is gone).
pub async fn update_spec(
    tx: &mut WriteTx,
    pool: &PoolRef,
    expected: i64,
    spec: &PoolSpec,
    now: DateTime<Utc>,
) -> sqlx::Result<Option<Pool>> {
    tx.touched_pool(pool);
    let spec = to_json(&spec.view())?;
    let row: Option<PoolRow> = on_store!(tx.exec(), |e| sqlx::query_as(AssertSqlSafe(format!(
        "update pools set spec = $1, generation = generation + 1, version = version + 1, updated_at = $2
         where namespace = $5 and name = $3 and generation = $4 and deleting = false
         returning {COLUMNS}"
    )))
    .bind(&spec)
    .bind(now)
    .bind(&pool.name)
    .bind(expected)
    .bind(pool.namespace.as_str())
    .fetch_optional(e)
    .await?);
    row.map(Pool::try_from).transpose()
}

/// Flags the pool for deletion; `None` when it does not exist or was
/// flagged already. A write first, so the transaction takes the lock at once.
pub async fn mark_deleting(tx: &mut WriteTx, pool: &PoolRef, now: DateTime<Utc>) -> sqlx::Result<Option<Pool>> {
    tx.touched_pool(pool);
    let row: Option<PoolRow> = on_store!(tx.exec(), |e| {
        sqlx::query_as(AssertSqlSafe(format!(
            "update pools set deleting = true, version = version + 1, updated_at = $1
             where namespace = $3 and name = $2 and deleting = false returning {COLUMNS}"
        )))
        .bind(now)
        .bind(&pool.name)
        .bind(pool.namespace.as_str())
        .fetch_optional(e)
        .await?
    });
    row.map(Pool::try_from).transpose()
}

/// Lowers `replicas` by one in a single statement (no read-modify-write
/// race); `None` when the pool is missing, deleting, or already at zero.
pub async fn decrement_replicas(tx: &mut WriteTx, pool: &PoolRef, now: DateTime<Utc>) -> sqlx::Result<Option<Pool>> {
    tx.touched_pool(pool);
    let exec = tx.exec();
    let sql = exec.dialect().pick(
        "update pools set spec = json_set(spec, '$.replicas', json_extract(spec, '$.replicas') - 1),
                          generation = generation + 1, version = version + 1, updated_at = $1
         where namespace = $3 and name = $2 and deleting = false and json_extract(spec, '$.replicas') > 0",
        "update pools set spec = jsonb_set(spec::jsonb, '{replicas}', to_jsonb((spec::jsonb->>'replicas')::bigint - 1))::text,
                          generation = generation + 1, version = version + 1, updated_at = $1
         where namespace = $3 and name = $2 and deleting = false and (spec::jsonb->>'replicas')::bigint > 0",
    );
    let row: Option<PoolRow> = on_store!(exec, |e| sqlx::query_as(AssertSqlSafe(format!("{sql} returning {COLUMNS}")))
        .bind(now)
        .bind(&pool.name)
        .bind(pool.namespace.as_str())
        .fetch_optional(e)
        .await?);
    row.map(Pool::try_from).transpose()
}

pub async fn write_status(tx: &mut WriteTx, pool: &PoolRef, status: &PoolStatus) -> sqlx::Result<()> {
    tx.touched_pool(pool);
    let status = to_json(status)?;
    on_store!(tx.exec(), |e| sqlx::query(
        "update pools set status = $1, version = version + 1 where namespace = $3 and name = $2"
    )
    .bind(&status)
    .bind(&pool.name)
    .bind(pool.namespace.as_str())
    .execute(e)
    .await
    .affected())?;
    Ok(())
}

/// Approves one more batch of the current rollout.
pub async fn approve_batch(tx: &mut WriteTx, pool: &PoolRef) -> sqlx::Result<Option<Pool>> {
    tx.touched_pool(pool);
    let row: Option<PoolRow> = on_store!(tx.exec(), |e| {
        sqlx::query_as(AssertSqlSafe(format!(
            "update pools set batches_approved = batches_approved + 1, version = version + 1
             where namespace = $2 and name = $1 returning {COLUMNS}"
        )))
        .bind(&pool.name)
        .bind(pool.namespace.as_str())
        .fetch_optional(e)
        .await?
    });
    row.map(Pool::try_from).transpose()
}

/// Removes the row of a pool whose machines are all gone.
pub async fn remove(tx: &mut WriteTx, pool: &PoolRef) -> sqlx::Result<bool> {
    tx.touched_pool(pool);
    let done = on_store!(tx.exec(), |e| sqlx::query(
        "delete from pools where namespace = $2 and name = $1 and deleting = true"
    )
    .bind(&pool.name)
    .bind(pool.namespace.as_str())
    .execute(e)
    .await
    .affected())?;
    Ok(done == 1)
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
    let Some(updated) = update_spec(tx, &pool.id, pool.generation, spec, now).await? else {
        return Ok(None);
    };
    let revision = super::revisions::record_change(tx, &pool.id, &pool.spec, spec, now).await?;
    super::events::record(tx, &event(revision), now).await?;
    if let Some(revision) = revision {
        let message = format!("revision {revision}: machines move to {}", spec.desired_image());
        super::events::record(tx, &NewEvent::pool(&pool.id, EventType::Normal, "RolloutStarted", message), now).await?;
    }
    Ok(Some(SpecWritten { pool: updated, revision }))
}
