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
use crate::db::retention::Prune;
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
        match prune_once(&db, &settings, crate::clock::wall()).await {
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
        audit: batched(db, Prune::AuditBefore(before(now, s.audit_age))).await?
            + batched(db, Prune::AuditOver(keep(s.audit_max_rows))).await?,
        events: batched(db, Prune::EventsBefore(before(now, s.event_age))).await?
            + batched(db, Prune::EventsOver(keep(s.event_max_rows))).await?,
        upgrade_jobs: batched(db, Prune::JobsFinishedBefore(before(now, s.job_age))).await?,
        revisions: batched(db, Prune::RevisionsOver(i64::from(s.revision_history))).await?,
        idempotency: batched(db, Prune::KeysBefore(now - TimeDelta::hours(db::idempotency::RETENTION_HOURS))).await?,
    })
}

/// Prunes past `bound` a batch at a time, until a batch deletes less than
/// [`BATCH`] (or [`MAX_BATCHES`] ran).
async fn batched(db: &Db, bound: Prune) -> sqlx::Result<u64> {
    let mut total = 0;
    for _ in 0..MAX_BATCHES {
        // One short write per batch, so that requests' writes pass between.
        let mut tx = db.begin_background().await?;
        let n = db::retention::prune(&mut tx, bound, BATCH).await?;
        tx.commit().await?;
        total += n;
        if n < u64::from(BATCH) {
            break;
        }
    }
    Ok(total)
}
