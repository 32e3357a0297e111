//! The `idempotency` table: first responses of keyed POST requests.

use chrono::{DateTime, Utc};
use sqlx::SqliteExecutor;

/// How long a key is remembered.
pub const RETENTION_HOURS: i64 = 24;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Entry {
    pub method: String,
    pub path: String,
    pub body_hash: String,
    /// `None` while the first request is still being served.
    pub status: Option<i64>,
    pub content_type: Option<String>,
    pub location: Option<String>,
    pub etag: Option<String>,
    pub body: Option<Vec<u8>>,
}

/// Claims a key for a request about to run. `Ok(None)`: claimed, go on.
/// `Ok(Some(entry))`: the key was used before (within retention).
pub async fn claim(
    tx: &mut sqlx::SqliteConnection,
    token: &str,
    key: &str,
    method: &str,
    path: &str,
    body_hash: &str,
    now: DateTime<Utc>,
) -> sqlx::Result<Option<Entry>> {
    // Forget expired keys first, so that a key may be reused after a day.
    // The cutoff is bound as a timestamp in the stored encoding: SQLite's
    // datetime() writes a space where ours has a 'T', so comparing against
    // it as text would be off by up to a day.
    let cutoff = now - chrono::TimeDelta::hours(RETENTION_HOURS);
    sqlx::query("delete from idempotency where created_at < ?").bind(cutoff).execute(&mut *tx).await?;
    let existing: Option<Entry> = sqlx::query_as(
        "select method, path, body_hash, status, content_type, location, etag, body
         from idempotency where token_name = ? and key = ?",
    )
    .bind(token)
    .bind(key)
    .fetch_optional(&mut *tx)
    .await?;
    if existing.is_some() {
        return Ok(existing);
    }
    sqlx::query(
        "insert into idempotency (token_name, key, method, path, body_hash, created_at) values (?, ?, ?, ?, ?, ?)",
    )
    .bind(token)
    .bind(key)
    .bind(method)
    .bind(path)
    .bind(body_hash)
    .bind(now)
    .execute(&mut *tx)
    .await?;
    Ok(None)
}

pub struct Stored<'a> {
    pub status: u16,
    pub content_type: Option<&'a str>,
    pub location: Option<&'a str>,
    pub etag: Option<&'a str>,
    pub body: &'a [u8],
}

pub async fn complete(db: impl SqliteExecutor<'_>, token: &str, key: &str, r: &Stored<'_>) -> sqlx::Result<()> {
    sqlx::query(
        "update idempotency set status = ?, content_type = ?, location = ?, etag = ?, body = ?
         where token_name = ? and key = ?",
    )
    .bind(i64::from(r.status))
    .bind(r.content_type)
    .bind(r.location)
    .bind(r.etag)
    .bind(r.body)
    .bind(token)
    .bind(key)
    .execute(db)
    .await?;
    Ok(())
}

/// Releases a claim whose request failed on the server's side, so that a
/// retry with the same key runs again.
pub async fn release(db: impl SqliteExecutor<'_>, token: &str, key: &str) -> sqlx::Result<()> {
    sqlx::query("delete from idempotency where token_name = ? and key = ?").bind(token).bind(key).execute(db).await?;
    Ok(())
}
