//! The store's handle: SQLite (the embedded default) or PostgreSQL (for
//! several replicas, docs/ha.md), its connection pools, and opening it.
//! Apart from `mod.rs` so that the table modules can use it without
//! depending on the module that declares them.
//!
//! **SQLite** has one write lock. Two writers on two connections would meet
//! at that lock and wait it out with sleeps (the busy handler), and a
//! request could sleep behind a worker for tens of milliseconds; one
//! connection behind an in-process gate serialises writers without
//! sleeping, and lets a request's write go before any waiting worker's. In
//! WAL mode readers never wait for the writer, so reads have pools of their
//! own: the API's are never all taken by workers, whose reads are bounded
//! by their own. Pools as last committed are kept in memory (`PoolCache`):
//! every write goes through this process's one writer, so the cache knows
//! when a pool changes.
//!
//! **PostgreSQL** takes concurrent writers itself; requests and workers
//! have pools of connections of their own, so that workers never take all
//! of the API's. Other replicas write the same rows: pools are cached too,
//! kept current by the change notices every write sends, and a read first
//! makes sure the cache has caught up with the store ([`super::freshness`]).

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use anyhow::Context as _;
use sqlx::migrate::{MigrateError, Migrator};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{ConnectOptions, Connection};

use super::exec::{Dialect, Exec};
use super::freshness::Freshness;
use super::gate::{self, Priority, WriteTx};
use super::pool_cache::PoolCache;
use crate::config::Location;
use crate::config::location::redact;

/// The store: readers for the API, readers for the background workers, and
/// the writers (see the module's documentation).
#[derive(Clone)]
pub struct Db {
    pub(super) stores: std::sync::Arc<Stores>,
    /// Pools as last committed; `pools` reads through it.
    pub(super) pools: std::sync::Arc<PoolCache>,
    /// When the cache may serve a read (PostgreSQL only: on SQLite every
    /// write goes through this process, and the cache is always current).
    pub(super) freshness: Option<std::sync::Arc<Freshness>>,
}

/// A connection checked out of a pool of the store ([`Db::background_connection`]).
pub enum Conn {
    Sqlite(sqlx::pool::PoolConnection<sqlx::Sqlite>),
    Pg(sqlx::pool::PoolConnection<sqlx::Postgres>),
}

impl Conn {
    pub fn exec(&mut self) -> Exec<'_> {
        match self {
            Conn::Sqlite(c) => Exec::Sqlite(c),
            Conn::Pg(c) => Exec::Pg(c),
        }
    }
}

pub(super) enum Stores {
    Sqlite {
        api: SqlitePool,
        background: SqlitePool,
        writer: SqlitePool,
        /// Copies the WAL into the database file, beside the writer: see
        /// [`Db::checkpoint`].
        checkpointer: SqlitePool,
        gate: std::sync::Arc<gate::WriteGate>,
    },
    Postgres {
        api: PgPool,
        background: PgPool,
        /// The lease keeper's and the change hints'.
        leases: PgPool,
        /// How to open the change listener's own connection.
        options: Box<PgConnectOptions>,
        /// This replica's id: the origin of the notices its writes send.
        replica: std::sync::Arc<str>,
    },
}

/// How a writer waits for SQLite's lock before giving up with `busy`:
/// only another process (a backup, a person with `sqlite3`) can hold it.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);
/// Read connections of requests and of workers (SQLite).
const API_READERS: u32 = 8;
const BACKGROUND_READERS: u32 = 4;
/// Connections of requests and of workers (PostgreSQL: reads and writes).
const PG_API_CONNECTIONS: u32 = 16;
const PG_BACKGROUND_CONNECTIONS: u32 = 8;
/// The lease keeper's own (renewals must not queue behind busy passes).
const PG_LEASE_CONNECTIONS: u32 = 2;
/// How long a request or a pass waits for a PostgreSQL connection (the
/// server restarting, say) before it fails.
const PG_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);
/// A pooled PostgreSQL connection idle for this long is pinged before use.
const PING_IDLE_AFTER: Duration = Duration::from_secs(1);
/// How long opening the store may take at start.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

impl Db {
    pub fn dialect(&self) -> Dialect {
        match *self.stores {
            Stores::Sqlite { .. } => Dialect::Sqlite,
            Stores::Postgres { .. } => Dialect::Postgres,
        }
    }

    /// Reads of requests.
    pub fn read(&self) -> Exec<'_> {
        match &*self.stores {
            Stores::Sqlite { api, .. } => Exec::SqlitePool(api),
            Stores::Postgres { api, .. } => Exec::PgPool(api),
        }
    }

    /// Reads of background workers (reconcile passes, upgrade runner, pruner).
    pub fn background(&self) -> Exec<'_> {
        match &*self.stores {
            Stores::Sqlite { background, .. } => Exec::SqlitePool(background),
            Stores::Postgres { background, .. } => Exec::PgPool(background),
        }
    }

    /// One connection of the background workers', for reads in a row: one
    /// checkout of the pool (and, on PostgreSQL, one check of the
    /// connection as it comes back) for all of them.
    pub async fn background_connection(&self) -> sqlx::Result<Conn> {
        Ok(match &*self.stores {
            Stores::Sqlite { background, .. } => Conn::Sqlite(background.acquire().await?),
            Stores::Postgres { background, .. } => Conn::Pg(background.acquire().await?),
        })
    }

    /// The connections of the lease keeper and of the change notices, which
    /// must never wait behind busy passes: PostgreSQL only (one SQLite
    /// process needs no leases).
    pub fn shared_store(&self) -> Option<&sqlx::PgPool> {
        match &*self.stores {
            Stores::Sqlite { .. } => None,
            Stores::Postgres { leases, .. } => Some(leases),
        }
    }

    /// A new connection pool of one, for the change listener: its own
    /// connection, never taken from (nor waiting behind) another pool's.
    /// PostgreSQL only.
    pub fn listener_pool(&self) -> Option<PgPool> {
        match &*self.stores {
            Stores::Sqlite { .. } => None,
            Stores::Postgres { options, .. } => Some(
                PgPoolOptions::new()
                    .max_connections(1)
                    .acquire_timeout(PG_ACQUIRE_TIMEOUT)
                    .connect_lazy_with((**options).clone()),
            ),
        }
    }

    /// A new connection for the read barriers ([`super::freshness`]):
    /// its commits do not wait for the disk. `None` on SQLite.
    pub async fn barrier_connection(&self) -> Option<sqlx::Result<sqlx::PgConnection>> {
        let Stores::Postgres { options, .. } = &*self.stores else { return None };
        let options = (**options).clone().options([("synchronous_commit", "off")]);
        Some(
            tokio::time::timeout(PG_ACQUIRE_TIMEOUT, options.connect()).await.unwrap_or(Err(sqlx::Error::PoolTimedOut)),
        )
    }

    /// The cache of pools, for the change listener.
    pub fn pool_cache(&self) -> &PoolCache {
        &self.pools
    }

    /// When the cache may serve reads (PostgreSQL only).
    pub fn freshness(&self) -> Option<&std::sync::Arc<Freshness>> {
        self.freshness.as_ref()
    }

    /// A write transaction of a request: ahead of every waiting worker.
    pub async fn begin_write(&self) -> sqlx::Result<WriteTx> {
        self.begin(Priority::Request).await
    }

    /// A write transaction of a background worker.
    pub async fn begin_background(&self) -> sqlx::Result<WriteTx> {
        self.begin(Priority::Background).await
    }

    /// A write transaction in a span of its own (a child of the request's
    /// or the pass's), so a trace shows the wait for the writer and the
    /// commit; rolled back (dropped) ones end without an outcome.
    /// Outside any span, none.
    async fn begin(&self, priority: Priority) -> sqlx::Result<WriteTx> {
        let system = match &*self.stores {
            Stores::Sqlite { .. } => "sqlite",
            Stores::Postgres { .. } => "postgresql",
        };
        // Only inside other work: a background writer's transaction
        // (leases, audit, retention) alone would be a trace of its own
        // every few seconds, noise in every tracing UI.
        let current = tracing::Span::current();
        if current.is_none() {
            return self.begin_untraced(priority).await;
        }
        let by = {
            use opentelemetry::trace::TraceContextExt as _;
            use tracing_opentelemetry::OpenTelemetrySpanExt as _;
            let sc = current.context().span().span_context().clone();
            sc.is_valid().then_some(sc)
        };
        let span = tracing::info_span!(
            "db",
            otel.name = "db transaction",
            otel.kind = "client",
            db.system.name = system,
            outcome = tracing::field::Empty,
        );
        let tx = tracing::Instrument::instrument(self.begin_untraced(priority), span.clone()).await?;
        Ok(tx.in_span(span, by))
    }

    async fn begin_untraced(&self, priority: Priority) -> sqlx::Result<WriteTx> {
        match &*self.stores {
            Stores::Sqlite { writer, gate, .. } => gate::begin(gate, writer, self.pools.clone(), priority).await,
            Stores::Postgres { api, background, replica, .. } => {
                let pool = if priority == Priority::Request { api } else { background };
                Ok(WriteTx::postgres(pool.begin().await?, replica.clone(), self.pools.clone()))
            }
        }
    }

    /// Copies what the WAL holds into the database file without waiting
    /// for (or holding up) the writer or any reader: a passive checkpoint
    /// on a connection of its own. Run every [`CHECKPOINT_EVERY`] by
    /// [`run_checkpoints`], so that no commit pays for one. Nothing to do
    /// on PostgreSQL.
    async fn checkpoint(&self) -> sqlx::Result<()> {
        match &*self.stores {
            Stores::Sqlite { checkpointer, .. } => {
                sqlx::query("pragma wal_checkpoint(passive)").execute(checkpointer).await.map(drop)
            }
            Stores::Postgres { .. } => Ok(()),
        }
    }

    /// Whether the store answers a query now (readiness).
    pub async fn ping(&self) -> sqlx::Result<()> {
        super::exec::on_store!(self.read(), |e| sqlx::query("select 1").execute(e).await.map(drop))
    }

    pub async fn close(&self) {
        match &*self.stores {
            Stores::Sqlite { api, background, writer, checkpointer, .. } => {
                api.close().await;
                background.close().await;
                checkpointer.close().await;
                writer.close().await;
            }
            Stores::Postgres { api, background, leases, .. } => {
                api.close().await;
                background.close().await;
                leases.close().await;
            }
        }
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
    if db.dialect() != Dialect::Sqlite {
        return;
    }
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

/// Opens the store (creating a SQLite file when missing) and applies every
/// pending migration. A database written by a newer drover (a migration
/// this binary does not know) is refused, untouched.
pub async fn connect(location: &Location) -> anyhow::Result<Db> {
    connect_with_leases(location, DEFAULT_LEASE, "drover").await
}

/// [`connect`] for replicas whose leases last `lease`: on PostgreSQL, a
/// session left idle inside a transaction (its replica paused or cut off
/// after it began) is ended by the server within half a lease, so that
/// the row locks it holds (a lease proven `for share`, a pool's row) never
/// keep another replica from taking the pool over when the lease expires.
/// Its sessions are named after `replica` (`application_name`
/// `drover/<replica>`), so that `pg_stat_activity` says which replica
/// holds each one.
pub async fn connect_with_leases(location: &Location, lease: Duration, replica: &str) -> anyhow::Result<Db> {
    match location {
        Location::Sqlite(path) => connect_sqlite(path).await,
        Location::Postgres(url) => connect_postgres(url, lease / 2, replica).await,
    }
}

/// The `application_name` of a replica's sessions: PostgreSQL keeps 63
/// bytes of it, so a long host name is cut (the pid and the random part of
/// the replica id come last, and are kept).
pub fn session_name(replica: &str) -> String {
    let name = format!("drover/{replica}");
    if name.len() <= 63 {
        return name;
    }
    let tail_start = replica.len() - (63 - "drover/".len());
    let tail_start = (tail_start..=replica.len()).find(|&i| replica.is_char_boundary(i)).unwrap_or(replica.len());
    format!("drover/{}", &replica[tail_start..])
}

/// `--lease-duration`'s default.
const DEFAULT_LEASE: Duration = Duration::from_secs(15);

/// What applying the migrations failed on, for people.
fn migration_error(e: MigrateError, shown: &str) -> anyhow::Error {
    match e {
        MigrateError::VersionMissing(version) => anyhow::anyhow!(
            "the database {shown} (--database-url) has migration {version}, which this drover does not know: it \
             was written by a newer drover; run that version (or a newer one) against it. Nothing was changed."
        ),
        MigrateError::VersionMismatch(version) => anyhow::anyhow!(
            "migration {version} of the database {shown} (--database-url) differs from this drover's: the \
             database was migrated by another build. Nothing was changed."
        ),
        other => anyhow::Error::new(other).context(format!("applying migrations to {shown}")),
    }
}

async fn connect_sqlite(path: &Path) -> anyhow::Result<Db> {
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
        // below for the writer's.
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
    let shown = format!("sqlite://{}", path.display());
    SQLITE_MIGRATIONS.run(&writer).await.map_err(|e| migration_error(e, &shown))?;
    let readers = |n: u32| SqlitePoolOptions::new().max_connections(n).connect_with(opts.clone().read_only(true));
    let api = readers(API_READERS).await.context("opening the readers of requests")?;
    let background = readers(BACKGROUND_READERS).await.context("opening the readers of workers")?;
    let checkpointer =
        SqlitePoolOptions::new().max_connections(1).connect_with(opts).await.context("opening the checkpointer")?;
    let stores = Stores::Sqlite { api, background, writer, checkpointer, gate: Default::default() };
    Ok(Db { stores: std::sync::Arc::new(stores), pools: Default::default(), freshness: None })
}

static SQLITE_MIGRATIONS: Migrator = sqlx::migrate!("./migrations/sqlite");
static POSTGRES_MIGRATIONS: Migrator = sqlx::migrate!("./migrations/postgres");

async fn connect_postgres(url: &str, idle_in_transaction: Duration, replica: &str) -> anyhow::Result<Db> {
    let shown = redact(url);
    let opts = PgConnectOptions::from_str(url)
        .map_err(|e| anyhow::anyhow!("--database-url {shown} is not a PostgreSQL URL: {}", redact(&e.to_string())))?
        .application_name(&session_name(replica))
        .options([("idle_in_transaction_session_timeout", format!("{}ms", idle_in_transaction.as_millis().max(1)))]);
    // One connection first, so that a refusal says why (a pool would only
    // say it timed out): the server down, a wrong password, a missing
    // database.
    let mut probe = tokio::time::timeout(CONNECT_TIMEOUT, opts.connect())
        .await
        .map_err(|_| {
            anyhow::anyhow!("PostgreSQL at {shown} did not answer within {CONNECT_TIMEOUT:?} (--database-url)")
        })?
        .map_err(|e| {
            anyhow::anyhow!("cannot connect to PostgreSQL at {shown} (--database-url): {}", redact(&e.to_string()))
        })?;
    let version: String = sqlx::query_scalar("show server_version_num")
        .fetch_one(&mut probe)
        .await
        .with_context(|| format!("reading the server version of {shown}"))?;
    if version.trim().parse::<u32>().unwrap_or(0) < 130000 {
        anyhow::bail!("PostgreSQL at {shown} is version {version}; drover needs 13 or newer (--database-url)");
    }
    POSTGRES_MIGRATIONS.run(&mut probe).await.map_err(|e| migration_error(e, &shown))?;
    probe.close().await.ok();
    let pool = |n: u32| {
        PgPoolOptions::new()
            .max_connections(n)
            .acquire_timeout(PG_ACQUIRE_TIMEOUT)
            // A connection cut by a server restart is found broken before
            // use, not by the statement that needed it: one that sat idle
            // is pinged first. One in use a moment ago is not (sqlx pings
            // every connection as it comes back, so it was answering
            // then): a ping on every acquire was a third of a periodic
            // pass's round trips.
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= PING_IDLE_AFTER {
                        sqlx::Connection::ping(conn).await?;
                    }
                    Ok(true)
                })
            })
            .connect_lazy_with(opts.clone())
    };
    let stores = Stores::Postgres {
        api: pool(PG_API_CONNECTIONS),
        background: pool(PG_BACKGROUND_CONNECTIONS),
        leases: pool(PG_LEASE_CONNECTIONS),
        options: Box::new(opts),
        replica: replica.into(),
    };
    Ok(Db { stores: std::sync::Arc::new(stores), pools: Default::default(), freshness: Some(Default::default()) })
}

#[cfg(test)]
mod tests {
    use super::session_name;

    #[test]
    fn a_session_is_named_after_its_replica_and_a_long_host_keeps_the_pid_and_random_part() {
        assert_eq!(session_name("web-1-12-ab09"), "drover/web-1-12-ab09");
        let long = format!("{}-4242-beef", "h".repeat(80));
        let name = session_name(&long);
        assert_eq!(name.len(), 63);
        assert!(name.starts_with("drover/") && name.ends_with("-4242-beef"), "{name}");
    }
}
