//! The `idempotency` table: first responses of keyed POST requests, and
//! the claims of those still running.

use super::exec::{Affected, on_store};
use super::gate::WriteTx;
use chrono::{DateTime, Utc};

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
    /// When the key was claimed.
    pub created_at: DateTime<Utc>,
}

/// A keyed request about to run.
pub struct Request<'a> {
    pub token: &'a str,
    pub key: &'a str,
    pub method: &'a str,
    pub path: &'a str,
    pub body_hash: &'a str,
}

/// Claims a key for a request about to run. `Ok(None)`: claimed, go on.
/// `Ok(Some(entry))`: the key was used before (within retention) and its
/// claim still stands. A claim older than `stale` whose request never
/// finished is taken over; a key older than the retention is reused.
pub async fn claim(
    tx: &mut WriteTx,
    r: &Request<'_>,
    now: DateTime<Utc>,
    stale: DateTime<Utc>,
) -> sqlx::Result<Option<Entry>> {
    let expired = now - chrono::TimeDelta::hours(RETENTION_HOURS);
    if let Some(entry) = find(tx, r).await? {
        let live = entry.created_at >= expired && (entry.status.is_some() || entry.created_at >= stale);
        if live {
            return Ok(Some(entry));
        }
        // Expired, or a claim its request abandoned: the key is free again.
        on_store!(tx.exec(), |e| sqlx::query("delete from idempotency where token_name = $1 and key = $2")
            .bind(r.token)
            .bind(r.key)
            .execute(e)
            .await
            .affected())?;
    }
    // Another replica may claim the same key at the same moment: the
    // insert that comes second waits for the first to commit and inserts
    // nothing, and this request then finds the other's claim (or, should
    // that claim have been released meanwhile, tries again).
    for _ in 0..3 {
        let inserted = on_store!(tx.exec(), |e| {
            sqlx::query(
                "insert into idempotency (token_name, key, method, path, body_hash, created_at)
                 values ($1, $2, $3, $4, $5, $6) on conflict (token_name, key) do nothing",
            )
            .bind(r.token)
            .bind(r.key)
            .bind(r.method)
            .bind(r.path)
            .bind(r.body_hash)
            .bind(now)
            .execute(e)
            .await
            .affected()
        })?;
        if inserted == 1 {
            return Ok(None);
        }
        if let Some(entry) = find(tx, r).await? {
            return Ok(Some(entry));
        }
    }
    Err(sqlx::Error::Protocol(format!("idempotency key {:?} kept changing hands while it was claimed", r.key)))
}

async fn find(tx: &mut WriteTx, r: &Request<'_>) -> sqlx::Result<Option<Entry>> {
    on_store!(tx.exec(), |e| sqlx::query_as(
        "select method, path, body_hash, status, content_type, location, etag, body, created_at
         from idempotency where token_name = $1 and key = $2",
    )
    .bind(r.token)
    .bind(r.key)
    .fetch_optional(e)
    .await)
}

pub struct Stored<'a> {
    pub status: u16,
    pub content_type: Option<&'a str>,
    pub location: Option<&'a str>,
    pub etag: Option<&'a str>,
    pub body: &'a [u8],
}

pub async fn complete(db: &mut WriteTx, token: &str, key: &str, r: &Stored<'_>) -> sqlx::Result<()> {
    on_store!(db.exec(), |e| sqlx::query(
        "update idempotency set status = $1, content_type = $2, location = $3, etag = $4, body = $5
         where token_name = $6 and key = $7",
    )
    .bind(i64::from(r.status))
    .bind(r.content_type)
    .bind(r.location)
    .bind(r.etag)
    .bind(r.body)
    .bind(token)
    .bind(key)
    .execute(e)
    .await
    .affected())?;
    Ok(())
}

/// Releases a claim whose request ended without an answer worth keeping
/// (a server error, a dropped request), so that a retry with the same key
/// runs again. A stored answer is never released.
pub async fn release(db: &mut WriteTx, token: &str, key: &str) -> sqlx::Result<()> {
    on_store!(db.exec(), |e| sqlx::query(
        "delete from idempotency where token_name = $1 and key = $2 and status is null"
    )
    .bind(token)
    .bind(key)
    .execute(e)
    .await
    .affected())?;
    Ok(())
}
