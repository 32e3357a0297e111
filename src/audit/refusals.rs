//! Auditing refusals, at a bounded cost and without ever holding up the
//! answer.
//!
//! A refusal is answered at once: its record is handed over here, kept in
//! memory, and written by a background task ([`run`]) within a second, or
//! once the store answers again when it is down (a 401 must not wait on a
//! store that does not answer). At most [`MAX_PENDING`] records wait; past
//! that, and for those still unwritten when the process stops, each lost
//! record is counted in `drover_audit_refusals_unwritten_total`.
//!
//! Anyone who reaches the listener can send requests without a token, as
//! fast as the network allows. Writing one row per such refusal would let
//! them grow the database at will, so they come in bursts: the first
//! refusal of a burst makes a row (with its method, path and status), the
//! ones that follow within the window are only counted, and the row's
//! `repeats` is raised by that count. Token-less clients therefore add at
//! most one row per window, whatever they send. Refusals of a known caller
//! (a role too low, an OIDC token no rule maps) are one row each.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::db::{self, Db, audit::NewAudit};

/// Most records waiting to be written: a few minutes of a store outage
/// under a steady stream of refused callers, in a few megabytes.
pub const MAX_PENDING: usize = 10_000;
/// How often pending records are written (and a burst's count with them).
const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// How long the last flush at shutdown may take.
const LAST_FLUSH: Duration = Duration::from_secs(2);

/// One row of the audit trail to be: its record, and for a burst of
/// token-less refusals, how many more it stands for.
struct Pending {
    record: NewAudit,
    time: DateTime<Utc>,
    /// When its burst started (token-less refusals only).
    burst: Option<Instant>,
    /// The row, once written.
    row: Option<i64>,
    /// Refusals counted into the burst and not yet into its row.
    more: i64,
}

/// A flush's writes, by position among the pending records.
struct Work {
    /// Records to insert, with their time.
    inserts: Vec<(usize, NewAudit, DateTime<Utc>)>,
    /// Counts to add to rows already written: (position, row, count).
    counts: Vec<(usize, i64, i64)>,
}

pub struct RefusalAudit {
    window: Duration,
    pending: Mutex<VecDeque<Pending>>,
    written: Notify,
    unwritten: Counter,
}

impl RefusalAudit {
    pub fn new(window: Duration) -> Self {
        Self { window, pending: Mutex::default(), written: Notify::new(), unwritten: Counter::default() }
    }

    /// Adds `drover_audit_refusals_unwritten_total` to `r`.
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "drover_audit_refusals_unwritten",
            "Audit records of refused requests lost: more than could wait for the store, or still waiting at shutdown",
            self.unwritten.clone(),
        );
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Pending>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Audits a refusal of a request without a valid token: counted into
    /// the open burst, or the first record of a new one. Never waits.
    pub fn record_anonymous(&self, record: NewAudit) {
        let now = Instant::now();
        let mut pending = self.lock();
        let open = pending.iter_mut().rev().find(|p| p.burst.is_some_and(|b| now.duration_since(b) < self.window));
        match open {
            Some(burst) => burst.more += 1,
            None => self.push(
                &mut pending,
                Pending { record, time: crate::clock::wall(), burst: Some(now), row: None, more: 0 },
            ),
        }
    }

    /// Audits a refusal of a known caller: one record. Never waits.
    pub fn record(&self, record: NewAudit) {
        let mut pending = self.lock();
        self.push(&mut pending, Pending { record, time: crate::clock::wall(), burst: None, row: None, more: 0 });
    }

    fn push(&self, pending: &mut VecDeque<Pending>, p: Pending) {
        if pending.len() >= MAX_PENDING {
            self.unwritten.inc();
            return;
        }
        pending.push_back(p);
        self.written.notify_one();
    }

    /// Writes what is pending, in one transaction; on failure everything
    /// stays pending for the next try. A burst whose window has passed and
    /// whose count is written is done.
    async fn flush(&self, db: &Db, now: Instant) -> sqlx::Result<()> {
        let Work { inserts, counts } = self.work();
        if inserts.is_empty() && counts.is_empty() {
            self.retire(now);
            return Ok(());
        }
        let mut tx = db.begin_background().await?;
        let mut rows = Vec::with_capacity(inserts.len());
        for (i, record, time) in &inserts {
            rows.push((*i, db::audit::record(&mut tx, record, *time).await?));
        }
        for (_, row, more) in &counts {
            db::audit::add_repeats(&mut tx, *row, *more).await?;
        }
        tx.commit().await?;
        // Only this task removes entries, so positions still hold.
        let mut pending = self.lock();
        for (i, row) in rows {
            if let Some(p) = pending.get_mut(i) {
                p.row = Some(row);
            }
        }
        for (i, _, more) in counts {
            if let Some(p) = pending.get_mut(i) {
                p.more -= more;
            }
        }
        drop(pending);
        self.retire(now);
        Ok(())
    }

    /// What to write now, taken apart from the lock.
    fn work(&self) -> Work {
        let pending = self.lock();
        let indexed = || pending.iter().enumerate();
        Work {
            inserts: indexed().filter(|(_, p)| p.row.is_none()).map(|(i, p)| (i, p.record.clone(), p.time)).collect(),
            counts: indexed().filter_map(|(i, p)| p.row.filter(|_| p.more > 0).map(|row| (i, row, p.more))).collect(),
        }
    }

    /// Drops what is written for good: single records, and bursts whose
    /// window has passed with their whole count written.
    fn retire(&self, now: Instant) {
        self.lock().retain(|p| {
            let open = p.burst.is_some_and(|b| now.duration_since(b) < self.window);
            p.row.is_none() || open || p.more > 0
        });
    }

    /// Records not written yet (a test's view).
    pub fn waiting(&self) -> usize {
        self.lock().iter().filter(|p| p.row.is_none() || p.more > 0).count()
    }
}

/// Writes refusals' records as they come, at most every [`FLUSH_EVERY`],
/// retrying while the store is down, until `cancel`; then once more, and
/// counts what could still not be written.
pub async fn run(refusals: std::sync::Arc<RefusalAudit>, db: Db, cancel: CancellationToken) {
    let mut failing = false;
    loop {
        tokio::select! {
            () = cancel.cancelled() => break,
            () = refusals.written.notified(), if !failing => {}
            () = tokio::time::sleep(FLUSH_EVERY) => {}
        }
        match refusals.flush(&db, Instant::now()).await {
            Ok(()) if failing => {
                failing = false;
                tracing::info!("the audit records of refused requests are written again");
            }
            Ok(()) => {}
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(error = %e, waiting = refusals.waiting(), "could not write the audit records of refused requests; they wait in memory for the store");
            }
            Err(_) => {}
        }
        // A burst of refusals makes one write a second, not one each.
        tokio::time::sleep(FLUSH_EVERY / 10).await;
    }
    let last = tokio::time::timeout(LAST_FLUSH, refusals.flush(&db, Instant::now() + refusals.window)).await;
    if !matches!(last, Ok(Ok(()))) {
        let lost = refusals.waiting();
        refusals.unwritten.inc_by(lost as u64);
        if lost > 0 {
            tracing::error!(lost, "audit records of refused requests could not be written before the stop");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(path: &str) -> NewAudit {
        NewAudit {
            token_name: None,
            role: None,
            method: "PATCH".into(),
            path: path.into(),
            resource: None,
            namespace: None,
            action: None,
            status: 401,
            outcome: "unauthenticated",
        }
    }

    #[test]
    fn a_burst_of_token_less_refusals_is_one_record_and_known_callers_one_each() {
        let audit = RefusalAudit::new(Duration::from_secs(10));
        for i in 0..100 {
            audit.record_anonymous(refusal(&format!("/v1/pools/p{i}")));
        }
        for _ in 0..3 {
            audit.record(NewAudit { token_name: Some("ci".into()), status: 403, ..refusal("/v1/engines") });
        }
        let pending = audit.lock();
        assert_eq!(pending.len(), 4);
        assert_eq!(pending[0].more, 99);
    }

    #[test]
    fn past_the_limit_refusals_are_counted_as_unwritten_not_kept() {
        let audit = RefusalAudit::new(Duration::from_secs(10));
        for _ in 0..MAX_PENDING + 5 {
            audit.record(NewAudit { token_name: Some("ci".into()), ..refusal("/v1/x") });
        }
        assert_eq!((audit.waiting(), audit.unwritten.get()), (MAX_PENDING, 5));
    }

    #[tokio::test]
    async fn records_wait_for_the_store_and_bursts_are_written_with_their_count() {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = db::connect(&db::Location::Sqlite(dir.path().join("d.db"))).await.expect("store");
        let audit = RefusalAudit::new(Duration::from_secs(1));
        let busy = db.begin_write().await.expect("the writer, held as a store that does not answer would be");
        audit.record_anonymous(refusal("/v1/a"));
        audit.record_anonymous(refusal("/v1/b"));
        let started = Instant::now();
        let stuck = tokio::time::timeout(Duration::from_millis(200), audit.flush(&db, Instant::now())).await;
        assert!(stuck.is_err(), "the flush waits for the store, not the request");
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(audit.waiting(), 1, "kept until written");
        drop(busy);
        audit.record_anonymous(refusal("/v1/c"));
        audit.flush(&db, Instant::now()).await.expect("written");
        audit.flush(&db, Instant::now() + Duration::from_secs(1)).await.expect("retired once its window passed");
        assert_eq!(audit.waiting(), 0);
        let rows = db::audit::page(db.read(), None, None, 10).await.expect("page");
        assert_eq!(rows.len(), 1, "one burst, one row");
        assert_eq!((rows[0].path.as_str(), rows[0].repeats), ("/v1/a", 3));
    }
}
