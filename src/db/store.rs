//! The store's handle: the connection pools, the write gate in front of the
//! one writer, and opening the database. Apart from `mod.rs` so that the
//! table modules can use it without depending on the module that declares
//! them.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use anyhow::Context as _;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};

use super::gate::{self, Priority, WriteTx};
use super::pool_cache::PoolCache;

/// The store: readers for the API, readers for the background workers, and
/// one writer behind a gate that serves the API before the workers.
///
/// SQLite has one write lock. Two writers on two connections would meet at
/// that lock and wait it out with sleeps (the busy handler), and a request
/// could sleep behind a worker for tens of milliseconds; one connection
/// behind an in-process gate serialises writers without sleeping, and lets
/// a request's write go before any waiting worker's. In WAL mode readers
/// never wait for the writer, so reads have pools of their own: the API's
/// are never all taken by workers, whose reads are bounded by their own.
#[derive(Clone)]
pub struct Db {
    pub(super) api: SqlitePool,
    pub(super) background: SqlitePool,
    writer: SqlitePool,
    /// Copies the WAL into the database file, beside the writer: see
    /// [`Db::checkpoint`].
    checkpointer: SqlitePool,
    gate: std::sync::Arc<gate::WriteGate>,
    /// Pools as last committed; `pools` reads through it.
    pub(super) pools: std::sync::Arc<PoolCache>,
}

/// How long a writer waits for SQLite's lock before giving up with `busy`:
/// only another process (a backup, a person with `sqlite3`) can hold it.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);
/// Read connections of requests and of workers.
const API_READERS: u32 = 8;
const BACKGROUND_READERS: u32 = 4;

impl Db {
    /// Reads of requests.
    pub fn read(&self) -> &SqlitePool {
        &self.api
    }

    /// Reads of background workers (reconcile passes, upgrade runner, pruner).
    pub fn background(&self) -> &SqlitePool {
        &self.background
    }

    /// A write transaction of a request: ahead of every waiting worker.
    pub async fn begin_write(&self) -> sqlx::Result<WriteTx> {
        gate::begin(&self.gate, &self.writer, &self.pools, Priority::Request).await
    }

    /// A write transaction of a background worker.
    pub async fn begin_background(&self) -> sqlx::Result<WriteTx> {
        gate::begin(&self.gate, &self.writer, &self.pools, Priority::Background).await
    }

    /// Copies what the WAL holds into the database file without waiting
    /// for (or holding up) the writer or any reader: a passive checkpoint
    /// on a connection of its own. Run every [`CHECKPOINT_EVERY`] by
    /// [`run_checkpoints`], so that no commit pays for one.
    async fn checkpoint(&self) -> sqlx::Result<()> {
        sqlx::query("pragma wal_checkpoint(passive)").execute(&self.checkpointer).await.map(drop)
    }

    pub async fn close(&self) {
        self.api.close().await;
        self.background.close().await;
        self.checkpointer.close().await;
        self.writer.close().await;
    }
}

/// How often [`run_checkpoints`] copies the WAL into the database file.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);

/// The WAL's checkpoints, off the commit path. SQLite's own (automatic)
/// checkpoint runs inside the commit that crosses its threshold: that
/// commit copies thousands of pages and syncs the file while every other
/// writer, requests included, waits behind it. Here a task does it every
/// second beside the writer; the automatic one stays as a backstop, at a
/// threshold only a stalled task lets the WAL reach.
pub async fn run_checkpoints(db: Db, cancel: tokio_util::sync::CancellationToken) {
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(CHECKPOINT_EVERY) => {}
        }
        if let Err(e) = db.checkpoint().await {
            tracing::warn!(error = %e, "WAL checkpoint failed; the next commit past the backstop will do it");
        }
    }
}

/// Opens (creating when missing) the database at `path` and applies every
/// pending migration.
pub async fn connect(path: &Path) -> anyhow::Result<Db> {
    let opts = SqliteConnectOptions::from_str("sqlite://")
        .context("building SQLite options")?
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        // WAL + NORMAL is durable across process crashes (a committed
        // transaction is in the WAL file); only an OS crash or power loss
        // can lose the last few, which the engines' labels then restore.
        // FULL would add an fsync to every commit.
        .synchronous(SqliteSynchronous::Normal)
        .foreign_keys(true)
        .busy_timeout(BUSY_TIMEOUT)
        // No memory map (SQLite's default): a map is per connection, and a
        // page read through thirteen maps is counted thirteen times in the
        // resident size. Reads go through the OS page cache instead, with
        // a small cache of SQLite's own per connection (negative: KiB); see
        // `connect` for the writer's.
        .pragma("mmap_size", "0")
        .pragma("cache_size", "-2048")
        // The backstop of `run_checkpoints` (which does them every second):
        // 16,000 pages (64 MiB at 4 KiB), far more than a second of writes
        // adds at the rates measured in BENCHMARKS.md.
        .pragma("wal_autocheckpoint", "16000")
        // After a checkpoint has emptied it, the WAL file is cut back to
        // this size rather than kept at its high-water mark.
        .pragma("journal_size_limit", "67108864");
    // The writer's cache is larger: every pass and request writes through
    // it, and the pages it dirties stay there until the commit.
    let writer = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(opts.clone().pragma("cache_size", "-8192"))
        .await
        .with_context(|| format!("opening SQLite database {}", path.display()))?;
    sqlx::migrate!("./migrations")
        .run(&writer)
        .await
        .with_context(|| format!("applying migrations to {}", path.display()))?;
    let readers = |n: u32| SqlitePoolOptions::new().max_connections(n).connect_with(opts.clone().read_only(true));
    let api = readers(API_READERS).await.context("opening the readers of requests")?;
    let background = readers(BACKGROUND_READERS).await.context("opening the readers of workers")?;
    let checkpointer =
        SqlitePoolOptions::new().max_connections(1).connect_with(opts).await.context("opening the checkpointer")?;
    Ok(Db { api, background, writer, checkpointer, gate: Default::default(), pools: Default::default() })
}
