//! The `tokens` table: API tokens, stored as hashes only.

use super::exec::{Affected, Exec, on_store};
use super::gate::WriteTx;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::domain::role::Role;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct TokenInfo {
    pub name: String,
    /// `viewer`, `operator` or `admin`.
    #[schema(value_type = crate::domain::role::Role)]
    pub role: String,
    pub created_at: DateTime<Utc>,
    pub last_used_at: Option<DateTime<Utc>>,
}

/// A stored token with its hash.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Stored {
    pub name: String,
    pub role: Role,
    pub hash: String,
    pub last_used_at: Option<DateTime<Utc>>,
}

pub async fn insert(
    db: &mut WriteTx,
    name: &str,
    role: &str,
    hash: &str,
    now: DateTime<Utc>,
) -> sqlx::Result<TokenInfo> {
    on_store!(db.exec(), |e| sqlx::query_as(
        "insert into tokens (name, role, hash, created_at) values ($1, $2, $3, $4)
         returning name, role, created_at, last_used_at",
    )
    .bind(name)
    .bind(role)
    .bind(hash)
    .bind(now)
    .fetch_one(e)
    .await)
}

/// Every token with its hash: what the in-memory token cache holds.
pub async fn all(db: Exec<'_>) -> sqlx::Result<Vec<Stored>> {
    on_store!(db, |e| sqlx::query_as("select name, role, hash, last_used_at from tokens").fetch_all(e).await)
}

/// Stamps the last use of a token.
pub async fn touch(db: &mut WriteTx, name: &str, now: DateTime<Utc>) -> sqlx::Result<()> {
    on_store!(db.exec(), |e| sqlx::query("update tokens set last_used_at = $1 where name = $2")
        .bind(now)
        .bind(name)
        .execute(e)
        .await
        .affected())?;
    Ok(())
}

/// Inside a write transaction: whether any token exists, with the table
/// locked against other writers (PostgreSQL) until the transaction ends:
/// replicas starting together on an empty store agree on which of them
/// makes the first admin token. (SQLite's writer is one already.)
pub async fn any_locked(tx: &mut WriteTx) -> sqlx::Result<bool> {
    if let Exec::Pg(c) = tx.exec() {
        sqlx::query("lock table tokens in share row exclusive mode").execute(c).await?;
    }
    on_store!(tx.exec(), |e| sqlx::query_scalar("select exists (select 1 from tokens)").fetch_one(e).await)
}

/// A token by the hash of its secret.
pub async fn by_hash(db: Exec<'_>, hash: &str) -> sqlx::Result<Option<Stored>> {
    on_store!(db, |e| sqlx::query_as("select name, role, hash, last_used_at from tokens where hash = $1")
        .bind(hash)
        .fetch_optional(e)
        .await)
}

pub async fn list(db: Exec<'_>) -> sqlx::Result<Vec<TokenInfo>> {
    on_store!(db, |e| sqlx::query_as("select name, role, created_at, last_used_at from tokens order by name")
        .fetch_all(e)
        .await)
}

/// Deletes a token unless it is the last admin token, which would lock
/// everyone out. `Ok(None)`: no such token.
pub async fn delete(tx: &mut WriteTx, name: &str) -> sqlx::Result<Option<DeleteOutcome>> {
    let role: Option<Role> = on_store!(tx.exec(), |e| sqlx::query_scalar("select role from tokens where name = $1")
        .bind(name)
        .fetch_optional(e)
        .await)?;
    let Some(role) = role else { return Ok(None) };
    if role == Role::Admin {
        // Every admin token's row is locked (PostgreSQL) before they are
        // counted: two revocations at once, through two replicas, count one
        // after the other, and the second sees the first one's delete.
        let exec = tx.exec();
        let sql = exec
            .dialect()
            .pick("select name from tokens where role = $1", "select name from tokens where role = $1 for update");
        let admins: Vec<String> = on_store!(exec, |e| sqlx::query_scalar(sql).bind(Role::Admin).fetch_all(e).await)?;
        if !admins.iter().any(|a| a == name) {
            // Revoked meanwhile, by another request.
            return Ok(None);
        }
        if admins.len() <= 1 {
            return Ok(Some(DeleteOutcome::LastAdmin));
        }
    }
    on_store!(tx.exec(), |e| sqlx::query("delete from tokens where name = $1").bind(name).execute(e).await.affected())?;
    Ok(Some(DeleteOutcome::Deleted))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteOutcome {
    Deleted,
    LastAdmin,
}
