//! The retention pruner: a background task that keeps every append-only
//! table within its settings, so the store's size is bounded by them and
//! not by how long drover has run.
//!
//! | table | kept |
//! |---|---|
//! | `audit` | younger than `--audit-retention`, at most `--audit-max-rows` |
//! | `events` | younger than `--event-retention`, at most `--event-max-rows` |
//! | `upgrade_jobs` (with steps and components) | unfinished, or finished within `--job-retention` |
//! | `pool_revisions` | each pool's current revision and `--revision-history` before it |
//! | `idempotency` | keys younger than 24 hours |
//!
//! Each delete takes at most [`BATCH`] rows in its own short transaction,
//! found through an index, so the pruner never holds SQLite's write lock
//! for long and API writes interleave with it.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use tokio_util::sync::CancellationToken;

use crate::config::ServeConfig;
use crate::db::exec::{Affected, on_store};
use crate::db::{self, Db};
use crate::metrics::Metrics;

/// Rows deleted per statement.
const BATCH: u32 = 1000;
/// Statements per table and run: a run ends even if a table is far over.
const MAX_BATCHES: u32 = 1000;

#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub audit_age: Duration,
    pub audit_max_rows: u64,
    pub event_age: Duration,
    pub event_max_rows: u64,
    pub job_age: Duration,
    pub revision_history: u32,
    pub interval: Duration,
}

impl Settings {
    pub fn from_config(c: &ServeConfig) -> Self {
        Self {
            audit_age: c.audit_retention,
            audit_max_rows: c.audit_max_rows,
            event_age: c.event_retention,
            event_max_rows: c.event_max_rows,
            job_age: c.job_retention,
            revision_history: c.revision_history,
            interval: c.prune_interval,
        }
    }
}

/// Rows one run removed, per table.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pruned {
    pub audit: u64,
    pub events: u64,
    pub upgrade_jobs: u64,
    pub revisions: u64,
    pub idempotency: u64,
}

/// Prunes once at start, then every `settings.interval`, until `cancel`.
pub async fn run(db: Db, settings: Settings, metrics: Arc<Metrics>, cancel: CancellationToken) {
    loop {
        match prune_once(&db, &settings, Utc::now()).await {
            Ok(p) => {
                for (table, rows) in [
                    ("audit", p.audit),
                    ("events", p.events),
                    ("upgrade_jobs", p.upgrade_jobs),
                    ("pool_revisions", p.revisions),
                    ("idempotency", p.idempotency),
                ] {
                    metrics.pruned(table, rows);
                }
                if p != Pruned::default() {
                    tracing::info!(?p, "pruned old records");
                }
            }
            Err(e) => tracing::warn!(error = %e, "pruning old records failed; trying again at the next interval"),
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(settings.interval) => {}
        }
    }
}

fn before(now: DateTime<Utc>, age: Duration) -> DateTime<Utc> {
    now - TimeDelta::from_std(age).unwrap_or(TimeDelta::MAX)
}

/// One pass over every table.
pub async fn prune_once(db: &Db, s: &Settings, now: DateTime<Utc>) -> sqlx::Result<Pruned> {
    let keep = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    Ok(Pruned {
        audit: batched(db, AUDIT_BY_AGE, Bind::Time(before(now, s.audit_age))).await?
            + batched(db, AUDIT_BY_COUNT, Bind::Count(keep(s.audit_max_rows))).await?,
        events: batched(db, EVENTS_BY_AGE, Bind::Time(before(now, s.event_age))).await?
            + batched(db, EVENTS_BY_COUNT, Bind::Count(keep(s.event_max_rows))).await?,
        upgrade_jobs: batched(db, FINISHED_JOBS, Bind::Time(before(now, s.job_age))).await?,
        revisions: batched(db, OLD_REVISIONS, Bind::Count(i64::from(s.revision_history))).await?,
        idempotency: {
            let cutoff = now - TimeDelta::hours(db::idempotency::RETENTION_HOURS);
            let mut total = 0;
            for _ in 0..MAX_BATCHES {
                let mut tx = db.begin_background().await?;
                let n = db::idempotency::prune(&mut tx, cutoff, BATCH).await?;
                tx.commit().await?;
                total += n;
                if n < u64::from(BATCH) {
                    break;
                }
            }
            total
        },
    })
}

enum Bind {
    Time(DateTime<Utc>),
    Count(i64),
}

/// Runs `sql` (with the bound value, then the batch size) until it deletes
/// less than a batch.
async fn batched(db: &Db, sql: &'static str, value: Bind) -> sqlx::Result<u64> {
    let mut total = 0;
    for _ in 0..MAX_BATCHES {
        // One short write per batch, so that requests' writes pass between.
        let mut tx = db.begin_background().await?;
        let n = on_store!(tx.exec(), |e| {
            let query = sqlx::query(sql);
            let query = match &value {
                Bind::Time(t) => query.bind(*t),
                Bind::Count(n) => query.bind(*n),
            };
            query.bind(i64::from(BATCH)).execute(e).await.affected()
        })?;
        tx.commit().await?;
        total += n;
        if n < u64::from(BATCH) {
            break;
        }
    }
    Ok(total)
}

// Ids grow with time in both tables (autoincrement, never reused), so "the
// newest N" is "ids above the largest minus N".
const AUDIT_BY_AGE: &str =
    "delete from audit where id in (select id from audit where time < $1 order by time limit $2)";
const AUDIT_BY_COUNT: &str = "delete from audit where id in
     (select id from audit where id <= (select max(id) from audit) - $1 order by id limit $2)";
const EVENTS_BY_AGE: &str =
    "delete from events where id in (select id from events where time < $1 order by time limit $2)";
const EVENTS_BY_COUNT: &str = "delete from events where id in
     (select id from events where id <= (select max(id) from events) - $1 order by id limit $2)";
/// Steps and components go with their job (`on delete cascade`).
const FINISHED_JOBS: &str = "delete from upgrade_jobs where id in
     (select id from upgrade_jobs where finished_at is not null and finished_at < $1
        and state in ('succeeded', 'failed', 'cancelled') order by finished_at limit $2)";
/// A pool's current revision is always kept, with the given number before it.
const OLD_REVISIONS: &str = "delete from pool_revisions where (pool, revision) in
     (select r.pool, r.revision from pool_revisions r join pools p on p.name = r.pool
       where r.revision < p.revision - $1 limit $2)";
