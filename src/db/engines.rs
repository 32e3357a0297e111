//! The `engines` table: registered engines, their labels, their TLS
//! identity (write-only) and whether they are being drained.

use super::exec::{Affected, Exec, on_store};
use super::gate::WriteTx;
use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

/// A TLS client identity and the CA that signed the engine's certificate,
/// all PEM. Secret: never shown, never logged.
#[derive(Clone, PartialEq, Eq)]
pub struct Tls {
    pub cert: String,
    pub key: String,
    pub ca: String,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls { <redacted> }")
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEngine {
    pub name: String,
    pub endpoint: String,
    pub labels: BTreeMap<String, String>,
    pub tls: Option<Tls>,
    pub draining: bool,
    pub created_at: DateTime<Utc>,
}

#[derive(sqlx::FromRow)]
struct Row {
    name: String,
    endpoint: String,
    labels: String,
    tls_cert: Option<String>,
    tls_key: Option<String>,
    tls_ca: Option<String>,
    draining: bool,
    created_at: DateTime<Utc>,
}

impl TryFrom<Row> for StoredEngine {
    type Error = sqlx::Error;

    fn try_from(r: Row) -> Result<Self, Self::Error> {
        let labels = serde_json::from_str(&r.labels).map_err(|e| {
            sqlx::Error::Decode(format!("engine {:?}: stored labels are not valid: {e}", r.name).into())
        })?;
        let tls = match (r.tls_cert, r.tls_key, r.tls_ca) {
            (Some(cert), Some(key), Some(ca)) => Some(Tls { cert, key, ca }),
            _ => None,
        };
        Ok(StoredEngine {
            name: r.name,
            endpoint: r.endpoint,
            labels,
            tls,
            draining: r.draining,
            created_at: r.created_at,
        })
    }
}

const COLUMNS: &str = "name, endpoint, labels, tls_cert, tls_key, tls_ca, draining, created_at";

pub async fn list(db: Exec<'_>) -> sqlx::Result<Vec<StoredEngine>> {
    let rows: Vec<Row> =
        on_store!(db, |e| sqlx::query_as(sqlx::AssertSqlSafe(format!("select {COLUMNS} from engines order by name")))
            .fetch_all(e)
            .await)?;
    rows.into_iter().map(StoredEngine::try_from).collect()
}

/// Inserts a new engine; a duplicate name fails with a unique violation.
pub async fn insert(
    db: &mut WriteTx,
    name: &str,
    endpoint: &str,
    labels: &BTreeMap<String, String>,
    tls: Option<&Tls>,
    now: DateTime<Utc>,
) -> sqlx::Result<()> {
    let labels = serde_json::to_string(labels).map_err(|e| sqlx::Error::Encode(e.into()))?;
    on_store!(db.exec(), |e| sqlx::query(
        "insert into engines (name, endpoint, labels, tls_cert, tls_key, tls_ca, draining, created_at, updated_at)
         values ($1, $2, $3, $4, $5, $6, false, $7, $7)",
    )
    .bind(name)
    .bind(endpoint)
    .bind(labels)
    .bind(tls.map(|t| t.cert.as_str()))
    .bind(tls.map(|t| t.key.as_str()))
    .bind(tls.map(|t| t.ca.as_str()))
    .bind(now)
    .execute(e)
    .await
    .affected())?;
    Ok(())
}

/// Sets or clears `draining`; `false` when the engine does not exist.
pub async fn set_draining(db: &mut WriteTx, name: &str, draining: bool, now: DateTime<Utc>) -> sqlx::Result<bool> {
    let done =
        on_store!(db.exec(), |e| sqlx::query("update engines set draining = $1, updated_at = $2 where name = $3")
            .bind(draining)
            .bind(now)
            .bind(name)
            .execute(e)
            .await
            .affected())?;
    Ok(done == 1)
}

pub async fn delete(db: &mut WriteTx, name: &str) -> sqlx::Result<bool> {
    let done = on_store!(db.exec(), |e| sqlx::query("delete from engines where name = $1")
        .bind(name)
        .execute(e)
        .await
        .affected())?;
    Ok(done == 1)
}

/// Names of machines whose records say they run on `engine` (at most `limit`).
pub async fn machines_on(db: Exec<'_>, engine: &str, limit: u32) -> sqlx::Result<Vec<String>> {
    on_store!(db, |e| sqlx::query_scalar("select name from machines where engine = $1 order by name limit $2")
        .bind(engine)
        .bind(i64::from(limit))
        .fetch_all(e)
        .await)
}
