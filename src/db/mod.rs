//! SQLite storage: the connection pool, migrations, and one module of
//! queries per table. Every state change and the event that explains it are
//! written in one transaction.

pub mod audit;
pub mod clusters;
pub mod engines;
pub mod events;
pub mod idempotency;
pub mod machines;
pub mod pools;
pub mod revisions;
pub mod tokens;
pub mod upgrades;

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use anyhow::Context as _;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};

pub type Db = SqlitePool;

/// How long a writer waits for SQLite's lock before giving up with `busy`.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Opens (creating when missing) the database at `path` and applies every
/// pending migration.
pub async fn connect(path: &Path) -> anyhow::Result<Db> {
    let opts = SqliteConnectOptions::from_str("sqlite://")
        .context("building SQLite options")?
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        // WAL + NORMAL is durable across process crashes; only an OS crash
        // can lose the last transactions.
        .synchronous(SqliteSynchronous::Normal)
        .foreign_keys(true)
        .busy_timeout(BUSY_TIMEOUT);
    let pool = SqlitePoolOptions::new()
        .max_connections(8)
        .connect_with(opts)
        .await
        .with_context(|| format!("opening SQLite database {}", path.display()))?;
    sqlx::migrate!("./migrations")
        .run(&pool)
        .await
        .with_context(|| format!("applying migrations to {}", path.display()))?;
    Ok(pool)
}

/// A transaction that will write. It takes SQLite's write lock at once
/// (`BEGIN IMMEDIATE`), waiting up to the busy timeout: a deferred
/// transaction that reads first and writes later fails at once with
/// `SQLITE_BUSY` if another connection committed in between, and the
/// busy timeout does not help there.
pub async fn begin_write(db: &Db) -> sqlx::Result<sqlx::Transaction<'static, sqlx::Sqlite>> {
    db.begin_with("BEGIN IMMEDIATE").await
}

/// Opaque page cursors: base64url of the last key a page returned.
pub mod cursor {
    use base64::Engine as _;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;

    pub fn encode(key: &str) -> String {
        URL_SAFE_NO_PAD.encode(key)
    }

    pub fn decode(cursor: &str) -> Option<String> {
        URL_SAFE_NO_PAD.decode(cursor).ok().and_then(|b| String::from_utf8(b).ok())
    }
}
