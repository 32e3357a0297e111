//! The `engines` table: registered engines, their labels, their TLS
//! identity (write-only), whether they are being drained, and the Docker
//! daemon each is registered as (unique).

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
    /// The daemon it is registered as, once known.
    pub daemon_id: Option<String>,
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
    daemon_id: Option<String>,
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
            daemon_id: r.daemon_id,
            created_at: r.created_at,
        })
    }
}

const COLUMNS: &str = "name, endpoint, labels, tls_cert, tls_key, tls_ca, draining, daemon_id, created_at";

pub async fn list(db: Exec<'_>) -> sqlx::Result<Vec<StoredEngine>> {
    let rows: Vec<Row> =
        on_store!(db, |e| sqlx::query_as(sqlx::AssertSqlSafe(format!("select {COLUMNS} from engines order by name")))
            .fetch_all(e)
            .await)?;
    rows.into_iter().map(StoredEngine::try_from).collect()
}

/// A new engine's registration.
pub struct NewEngine<'a> {
    pub name: &'a str,
    pub endpoint: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    pub tls: Option<&'a Tls>,
    /// The daemon it reached at registration, if it answered.
    pub daemon_id: Option<&'a str>,
    /// What its events have told of that daemon (serialized), if anything.
    pub daemon_told: Option<&'a str>,
}

/// Inserts a new engine; a name or a daemon already registered fails with
/// a unique violation ([`is_daemon_taken`] tells which).
pub async fn insert(db: &mut WriteTx, new: &NewEngine<'_>, now: DateTime<Utc>) -> sqlx::Result<()> {
    let labels = serde_json::to_string(new.labels).map_err(|e| sqlx::Error::Encode(e.into()))?;
    let tls = new.tls;
    on_store!(db.exec(), |e| sqlx::query(
        "insert into engines
             (name, endpoint, labels, tls_cert, tls_key, tls_ca, draining, daemon_id, daemon_told,
              created_at, updated_at)
         values ($1, $2, $3, $4, $5, $6, false, $7, $9, $8, $8)",
    )
    .bind(new.name)
    .bind(new.endpoint)
    .bind(labels)
    .bind(tls.map(|t| t.cert.as_str()))
    .bind(tls.map(|t| t.key.as_str()))
    .bind(tls.map(|t| t.ca.as_str()))
    .bind(new.daemon_id)
    .bind(now)
    .bind(new.daemon_told)
    .execute(e)
    .await
    .affected())?;
    Ok(())
}

/// Whether a unique violation is the daemon's (another engine is
/// registered as it) rather than the name's.
pub fn is_daemon_taken(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(d) if d.is_unique_violation() => {
            d.constraint() == Some("engines_by_daemon") || d.message().contains("daemon_id")
        }
        _ => false,
    }
}

/// The engine registered as daemon `id`.
pub async fn holding_daemon(db: Exec<'_>, id: &str) -> sqlx::Result<Option<String>> {
    on_store!(db, |e| sqlx::query_scalar("select name from engines where daemon_id = $1")
        .bind(id)
        .fetch_optional(e)
        .await)
}

/// The daemon the engine is registered as.
pub async fn registered_daemon(db: Exec<'_>, name: &str) -> sqlx::Result<Option<String>> {
    let found: Option<Option<String>> =
        on_store!(db, |e| sqlx::query_scalar("select daemon_id from engines where name = $1")
            .bind(name)
            .fetch_optional(e)
            .await)?;
    Ok(found.flatten())
}

/// Registers the engine as daemon `id` at its first answer, unless it is
/// registered as one already; `false` then. A daemon registered as another
/// engine fails with a unique violation.
pub async fn adopt_daemon(db: &mut WriteTx, name: &str, id: &str) -> sqlx::Result<bool> {
    let done = on_store!(db.exec(), |e| sqlx::query(
        "update engines set daemon_id = $1 where name = $2 and daemon_id is null"
    )
    .bind(id)
    .bind(name)
    .execute(e)
    .await
    .affected())?;
    Ok(done == 1)
}

/// Records `news` (serialized) as the last thing told of the engine's daemon; `false`
/// when it was told already (by this replica or another), so that each is
/// told once.
pub async fn tell_daemon(db: &mut WriteTx, name: &str, news: &str) -> sqlx::Result<bool> {
    let done = on_store!(db.exec(), |e| sqlx::query(
        "update engines set daemon_told = $1 where name = $2 and (daemon_told is null or daemon_told <> $1)"
    )
    .bind(news)
    .bind(name)
    .execute(e)
    .await
    .affected())?;
    Ok(done == 1)
}

/// Registers the engine as daemon `id` (an admin's confirmation); `false`
/// when the engine does not exist. A daemon registered as another engine
/// fails with a unique violation.
pub async fn confirm_daemon(
    db: &mut WriteTx,
    name: &str,
    id: &str,
    told: &str,
    now: DateTime<Utc>,
) -> sqlx::Result<bool> {
    let done = on_store!(db.exec(), |e| sqlx::query(
        "update engines set daemon_id = $1, daemon_told = $4, updated_at = $2 where name = $3",
    )
    .bind(id)
    .bind(now)
    .bind(name)
    .bind(told)
    .execute(e)
    .await
    .affected())?;
    Ok(done == 1)
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
