//! The retention pruner's statements: each deletes at most a batch of the
//! oldest rows past a table's bound, found through an index
//! (`crate::retention` runs them, a short transaction a batch).

use chrono::{DateTime, Utc};

use super::WriteTx;
use super::exec::{Affected, on_store};

/// A bound of a table, past which rows go.
#[derive(Debug, Clone, Copy)]
pub enum Prune {
    /// Audit records older than this.
    AuditBefore(DateTime<Utc>),
    /// Audit records but the newest this many.
    AuditOver(i64),
    EventsBefore(DateTime<Utc>),
    EventsOver(i64),
    /// Upgrade jobs finished before this (their steps and components go
    /// with them: `on delete cascade`).
    JobsFinishedBefore(DateTime<Utc>),
    /// Revisions more than this many before their pool's current one.
    RevisionsOver(i64),
    /// Idempotency keys made before this.
    KeysBefore(DateTime<Utc>),
}

// Ids grow with time in audit and events (autoincrement, never reused), so
// "the newest N" is "ids above the largest minus N".
const AUDIT_BEFORE: &str =
    "delete from audit where id in (select id from audit where time < $1 order by time limit $2)";
const AUDIT_OVER: &str = "delete from audit where id in
     (select id from audit where id <= (select max(id) from audit) - $1 order by id limit $2)";
const EVENTS_BEFORE: &str =
    "delete from events where id in (select id from events where time < $1 order by time limit $2)";
const EVENTS_OVER: &str = "delete from events where id in
     (select id from events where id <= (select max(id) from events) - $1 order by id limit $2)";
const JOBS_FINISHED_BEFORE: &str = "delete from upgrade_jobs where id in
     (select id from upgrade_jobs where finished_at is not null and finished_at < $1
        and state in ('succeeded', 'failed', 'cancelled') order by finished_at limit $2)";
/// A pool's current revision is always kept, with the given number before it.
/// Joined by the pools' key (namespace and name): by name alone a pool's
/// revisions went by another namespace's pool of that name, and the join
/// could not use the key, a scan of every pool for each revision.
const REVISIONS_OVER: &str = "delete from pool_revisions where (namespace, pool, revision) in
     (select r.namespace, r.pool, r.revision from pool_revisions r
        join pools p on p.namespace = r.namespace and p.name = r.pool
       where r.revision < p.revision - $1 limit $2)";
const KEYS_BEFORE: &str = "delete from idempotency where (token_name, key) in
     (select token_name, key from idempotency where created_at < $1 order by created_at limit $2)";

/// Deletes at most `batch` rows past `bound`; how many it deleted.
pub async fn prune(tx: &mut WriteTx, bound: Prune, batch: u32) -> sqlx::Result<u64> {
    enum Bind {
        Time(DateTime<Utc>),
        Count(i64),
    }
    let (sql, value) = match bound {
        Prune::AuditBefore(t) => (AUDIT_BEFORE, Bind::Time(t)),
        Prune::AuditOver(n) => (AUDIT_OVER, Bind::Count(n)),
        Prune::EventsBefore(t) => (EVENTS_BEFORE, Bind::Time(t)),
        Prune::EventsOver(n) => (EVENTS_OVER, Bind::Count(n)),
        Prune::JobsFinishedBefore(t) => (JOBS_FINISHED_BEFORE, Bind::Time(t)),
        Prune::RevisionsOver(n) => (REVISIONS_OVER, Bind::Count(n)),
        Prune::KeysBefore(t) => (KEYS_BEFORE, Bind::Time(t)),
    };
    on_store!(tx.exec(), |e| {
        let query = sqlx::query(sql);
        let query = match &value {
            Bind::Time(t) => query.bind(*t),
            Bind::Count(n) => query.bind(*n),
        };
        query.bind(i64::from(batch)).execute(e).await.affected()
    })
}
