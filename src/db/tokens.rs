//! The `tokens` table: API tokens, stored as hashes only.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::SqliteConnection;
use sqlx::SqliteExecutor;
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
    db: &mut SqliteConnection,
    name: &str,
    role: &str,
    hash: &str,
    now: DateTime<Utc>,
) -> sqlx::Result<TokenInfo> {
    sqlx::query_as(
        "insert into tokens (name, role, hash, created_at) values (?, ?, ?, ?)
         returning name, role, created_at, last_used_at",
    )
    .bind(name)
    .bind(role)
    .bind(hash)
    .bind(now)
    .fetch_one(db)
    .await
}

/// Every token with its hash: what the in-memory token cache holds.
pub async fn all(db: impl SqliteExecutor<'_>) -> sqlx::Result<Vec<Stored>> {
    sqlx::query_as("select name, role, hash, last_used_at from tokens").fetch_all(db).await
}

/// Stamps the last use of a token.
pub async fn touch(db: &mut SqliteConnection, name: &str, now: DateTime<Utc>) -> sqlx::Result<()> {
    sqlx::query("update tokens set last_used_at = ? where name = ?").bind(now).bind(name).execute(db).await?;
    Ok(())
}

pub async fn count(db: impl SqliteExecutor<'_>) -> sqlx::Result<i64> {
    sqlx::query_scalar("select count(*) from tokens").fetch_one(db).await
}

pub async fn list(db: impl SqliteExecutor<'_>) -> sqlx::Result<Vec<TokenInfo>> {
    sqlx::query_as("select name, role, created_at, last_used_at from tokens order by name").fetch_all(db).await
}

/// Deletes a token unless it is the last admin token, which would lock
/// everyone out. `Ok(None)`: no such token.
pub async fn delete(tx: &mut sqlx::SqliteConnection, name: &str) -> sqlx::Result<Option<DeleteOutcome>> {
    let role: Option<Role> =
        sqlx::query_scalar("select role from tokens where name = ?").bind(name).fetch_optional(&mut *tx).await?;
    let Some(role) = role else { return Ok(None) };
    if role == Role::Admin {
        let admins: i64 = sqlx::query_scalar("select count(*) from tokens where role = ?")
            .bind(Role::Admin)
            .fetch_one(&mut *tx)
            .await?;
        if admins <= 1 {
            return Ok(Some(DeleteOutcome::LastAdmin));
        }
    }
    sqlx::query("delete from tokens where name = ?").bind(name).execute(&mut *tx).await?;
    Ok(Some(DeleteOutcome::Deleted))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteOutcome {
    Deleted,
    LastAdmin,
}
