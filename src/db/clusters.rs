//! The `clusters` table. Credentials go in through `insert` and come out
//! only through `credentials`, which the job runner and the probes call;
//! the row type the API shows has no field for them.

use super::exec::{Affected, Dialect, Exec, on_store};
use super::gate::WriteTx;
use chrono::{DateTime, Utc};
use sqlx::AssertSqlSafe;

use crate::domain::object::{ClusterRef, Namespace};
use crate::k8s::{CredentialError, Credentials};

/// A registered cluster, without its credentials.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ClusterRecord {
    #[sqlx(try_from = "String")]
    pub namespace: Namespace,
    pub name: String,
    pub server: String,
    pub auth_kind: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

const COLUMNS: &str = "namespace, name, server, auth_kind, created_at, updated_at";

/// Inserts a cluster; a duplicate name fails with a unique violation.
pub async fn insert(
    db: &mut WriteTx,
    cluster: &ClusterRef,
    server: &str,
    credentials: &Credentials,
    now: DateTime<Utc>,
) -> sqlx::Result<ClusterRecord> {
    let secret = serde_json::to_string(credentials).map_err(|e| sqlx::Error::Encode(e.into()))?;
    on_store!(db.exec(), |e| sqlx::query_as(AssertSqlSafe(format!(
        "insert into clusters (name, server, auth_kind, credentials, created_at, updated_at, namespace)
         values ($1, $2, $3, $4, $5, $6, $7) returning {COLUMNS}"
    )))
    .bind(&cluster.name)
    .bind(server)
    .bind(credentials.kind())
    .bind(secret)
    .bind(now)
    .bind(now)
    .bind(cluster.namespace.as_str())
    .fetch_one(e)
    .await)
}

/// Replaces a cluster's server and credentials (a rotation); `None` when
/// it is not registered.
pub async fn update(
    db: &mut WriteTx,
    cluster: &ClusterRef,
    server: &str,
    credentials: &Credentials,
    now: DateTime<Utc>,
) -> sqlx::Result<Option<ClusterRecord>> {
    let secret = serde_json::to_string(credentials).map_err(|e| sqlx::Error::Encode(e.into()))?;
    on_store!(db.exec(), |e| sqlx::query_as(AssertSqlSafe(format!(
        "update clusters set server = $1, auth_kind = $2, credentials = $3, updated_at = $4
         where namespace = $6 and name = $5 returning {COLUMNS}"
    )))
    .bind(server)
    .bind(credentials.kind())
    .bind(secret)
    .bind(now)
    .bind(&cluster.name)
    .bind(cluster.namespace.as_str())
    .fetch_optional(e)
    .await)
}

pub async fn get(db: Exec<'_>, cluster: &ClusterRef) -> sqlx::Result<Option<ClusterRecord>> {
    on_store!(db, |e| sqlx::query_as(AssertSqlSafe(format!(
        "select {COLUMNS} from clusters where namespace = $2 and name = $1"
    )))
    .bind(&cluster.name)
    .bind(cluster.namespace.as_str())
    .fetch_optional(e)
    .await)
}

/// Up to `limit` clusters of `namespace` with names after `after`, in name
/// order.
pub async fn list(
    db: Exec<'_>,
    namespace: &Namespace,
    after: Option<&str>,
    limit: u32,
) -> sqlx::Result<Vec<ClusterRecord>> {
    on_store!(db, |e| sqlx::query_as(AssertSqlSafe(format!(
        "select {COLUMNS} from clusters where namespace = $3 and name > $1 order by name limit $2"
    )))
    .bind(after.unwrap_or(""))
    .bind(i64::from(limit))
    .bind(namespace.as_str())
    .fetch_all(e)
    .await)
}

/// Inside a write that depends on cluster `name` existing (a pool naming
/// it, a job on it): whether it exists, and, on PostgreSQL, its row locked
/// for share until the transaction ends, so that a concurrent delete
/// ([`delete_if_idle`]) waits for this write and then sees it. (SQLite's
/// one writer runs the two one after the other anyway.)
pub async fn hold(tx: &mut WriteTx, cluster: &ClusterRef) -> sqlx::Result<bool> {
    let exec = tx.exec();
    let sql = exec.dialect().pick(
        "select 1 from clusters where namespace = $2 and name = $1",
        "select 1 from clusters where namespace = $2 and name = $1 for share",
    );
    let row: Option<i32> = on_store!(exec, |e| sqlx::query_scalar(sql)
        .bind(&cluster.name)
        .bind(cluster.namespace.as_str())
        .fetch_optional(e)
        .await)?;
    Ok(row.is_some())
}

/// The pools whose spec names the cluster, deleting ones included (they
/// still drain their nodes), in name order.
pub async fn pools_using(db: Exec<'_>, cluster: &ClusterRef) -> sqlx::Result<Vec<String>> {
    let sql =
        format!("select name from pools where namespace = $2 and {} = $1 order by name", spec_cluster(db.dialect()));
    on_store!(db, |e| sqlx::query_scalar(AssertSqlSafe(sql))
        .bind(&cluster.name)
        .bind(cluster.namespace.as_str())
        .fetch_all(e)
        .await)
}

/// The cluster a stored pool spec names, as SQL.
fn spec_cluster(dialect: Dialect) -> &'static str {
    dialect.pick("json_extract(spec, '$.cluster')", "(spec::jsonb ->> 'cluster')")
}

/// The stored credentials, `None` when the cluster is not registered. A
/// stored document that does not read as credentials is the inner error:
/// the caller fails its request or job with it, like any other unusable
/// credentials. The error names the cluster, never the content.
pub async fn credentials(
    db: Exec<'_>,
    cluster: &ClusterRef,
) -> sqlx::Result<Option<Result<Credentials, CredentialError>>> {
    let raw: Option<String> =
        on_store!(db, |e| sqlx::query_scalar("select credentials from clusters where namespace = $2 and name = $1")
            .bind(&cluster.name)
            .bind(cluster.namespace.as_str())
            .fetch_optional(e)
            .await)?;
    Ok(raw.map(|r| {
        serde_json::from_str(&r).map_err(|_| CredentialError {
            field: "credentials",
            message: format!("the stored credentials of cluster {cluster} are not a valid document"),
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
/// or a pool names it. The cluster's row is locked first (on PostgreSQL):
/// a pool or job being written that names it holds the row for share
/// ([`hold`]), so the delete waits for it to commit, and the checks that
/// follow, each a statement of its own, see it. Nothing accepted meanwhile
/// can be orphaned.
pub async fn delete_if_idle(db: &super::store::Db, cluster: &ClusterRef) -> sqlx::Result<Deleted> {
    let mut tx = db.begin_write().await?;
    let outcome = delete_if_idle_in(&mut tx, cluster).await?;
    tx.commit().await?;
    Ok(outcome)
}

/// [`delete_if_idle`] in the caller's transaction (an apply's).
pub async fn delete_if_idle_in(tx: &mut WriteTx, cluster: &ClusterRef) -> sqlx::Result<Deleted> {
    let exec = tx.exec();
    let lock = exec.dialect().pick(
        "select 1 from clusters where namespace = $2 and name = $1",
        "select 1 from clusters where namespace = $2 and name = $1 for update",
    );
    let found: Option<i32> = on_store!(exec, |e| sqlx::query_scalar(lock)
        .bind(&cluster.name)
        .bind(cluster.namespace.as_str())
        .fetch_optional(e)
        .await)?;
    if found.is_none() {
        return Ok(Deleted::Missing);
    }
    if let Some(id) = crate::db::upgrades::active_for_cluster(tx.exec(), cluster).await? {
        return Ok(Deleted::Busy(id));
    }
    let pools = pools_using(tx.exec(), cluster).await?;
    if !pools.is_empty() {
        return Ok(Deleted::InUse(pools));
    }
    on_store!(tx.exec(), |e| sqlx::query("delete from clusters where namespace = $2 and name = $1")
        .bind(&cluster.name)
        .bind(cluster.namespace.as_str())
        .execute(e)
        .await
        .affected())?;
    // Job events are not tied to the table by a key; drop them with the jobs.
    on_store!(tx.exec(), |e| sqlx::query(
        "delete from events where subject_kind = 'job'
         and subject not in (select cast(id as text) from upgrade_jobs)",
    )
    .execute(e)
    .await
    .affected())?;
    Ok(Deleted::Yes)
}
