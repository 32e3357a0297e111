//! The `clusters` table. Credentials go in through `insert` and come out
//! only through `credentials`, which the job runner and the probes call;
//! the row type the API shows has no field for them.

use chrono::{DateTime, Utc};
use sqlx::SqliteConnection;
use sqlx::{AssertSqlSafe, SqliteExecutor};

use crate::k8s::{CredentialError, Credentials};

/// A registered cluster, without its credentials.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ClusterRecord {
    pub name: String,
    pub server: String,
    pub auth_kind: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

const COLUMNS: &str = "name, server, auth_kind, created_at, updated_at";

/// Inserts a cluster; a duplicate name fails with a unique violation.
pub async fn insert(
    db: &mut SqliteConnection,
    name: &str,
    server: &str,
    credentials: &Credentials,
    now: DateTime<Utc>,
) -> sqlx::Result<ClusterRecord> {
    let secret = serde_json::to_string(credentials).map_err(|e| sqlx::Error::Encode(e.into()))?;
    sqlx::query_as(AssertSqlSafe(format!(
        "insert into clusters (name, server, auth_kind, credentials, created_at, updated_at)
         values (?, ?, ?, ?, ?, ?) returning {COLUMNS}"
    )))
    .bind(name)
    .bind(server)
    .bind(credentials.kind())
    .bind(secret)
    .bind(now)
    .bind(now)
    .fetch_one(db)
    .await
}

pub async fn get(db: impl SqliteExecutor<'_>, name: &str) -> sqlx::Result<Option<ClusterRecord>> {
    sqlx::query_as(AssertSqlSafe(format!("select {COLUMNS} from clusters where name = ?")))
        .bind(name)
        .fetch_optional(db)
        .await
}

/// Up to `limit` clusters with names after `after`, in name order.
pub async fn list(db: impl SqliteExecutor<'_>, after: Option<&str>, limit: u32) -> sqlx::Result<Vec<ClusterRecord>> {
    sqlx::query_as(AssertSqlSafe(format!("select {COLUMNS} from clusters where name > ? order by name limit ?")))
        .bind(after.unwrap_or(""))
        .bind(limit)
        .fetch_all(db)
        .await
}

pub async fn exists(db: impl SqliteExecutor<'_>, name: &str) -> sqlx::Result<bool> {
    sqlx::query_scalar("select exists (select 1 from clusters where name = ?)").bind(name).fetch_one(db).await
}

/// The pools whose spec names the cluster, deleting ones included (they
/// still drain their nodes), in name order.
pub async fn pools_using(db: impl SqliteExecutor<'_>, name: &str) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar("select name from pools where json_extract(spec, '$.cluster') = ? order by name")
        .bind(name)
        .fetch_all(db)
        .await
}

/// The stored credentials, `None` when the cluster is not registered. A
/// stored document that does not read as credentials is the inner error:
/// the caller fails its request or job with it, like any other unusable
/// credentials. The error names the cluster, never the content.
pub async fn credentials(
    db: impl SqliteExecutor<'_>,
    name: &str,
) -> sqlx::Result<Option<Result<Credentials, CredentialError>>> {
    let raw: Option<String> =
        sqlx::query_scalar("select credentials from clusters where name = ?").bind(name).fetch_optional(db).await?;
    Ok(raw.map(|r| {
        serde_json::from_str(&r).map_err(|_| CredentialError {
            field: "credentials",
            message: format!("the stored credentials of cluster {name:?} are not a valid document"),
        })
    }))
}

/// What a delete did.
#[derive(Debug, PartialEq, Eq)]
pub enum Deleted {
    Yes,
    Missing,
    /// A job is pending or running on the cluster; its id.
    Busy(i64),
    /// Pools name the cluster; their names.
    InUse(Vec<String>),
}

/// Deletes the cluster (and its job history) unless a job is active on it
/// or a pool names it; the checks and the delete are one statement, so a
/// job or pool accepted meanwhile cannot be orphaned.
pub async fn delete_if_idle(db: &super::store::Db, name: &str) -> sqlx::Result<Deleted> {
    let mut tx = db.begin_write().await?;
    let deleted = sqlx::query(
        "delete from clusters where name = ?1 and not exists
         (select 1 from upgrade_jobs where cluster = ?1 and state in ('pending', 'running'))
         and not exists (select 1 from pools where json_extract(spec, '$.cluster') = ?1)",
    )
    .bind(name)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    let outcome = if deleted > 0 {
        // Job events are not tied to the table by a key; drop them with the jobs.
        sqlx::query(
            "delete from events where subject_kind = 'job'
             and subject not in (select cast(id as text) from upgrade_jobs)",
        )
        .execute(&mut *tx)
        .await?;
        Deleted::Yes
    } else {
        match crate::db::upgrades::active_for_cluster(&mut *tx, name).await? {
            Some(id) => Deleted::Busy(id),
            None => match pools_using(&mut *tx, name).await? {
                pools if pools.is_empty() => Deleted::Missing,
                pools => Deleted::InUse(pools),
            },
        }
    };
    tx.commit().await?;
    Ok(outcome)
}
