//! Writing the audit records of authenticated requests, several to a
//! transaction.
//!
//! Every change is audited before its answer leaves, so a create costs two
//! write transactions at the one writer: the change, then its record. Under
//! a burst of changes the records would queue one transaction each behind
//! one another (and behind the changes). Here one task writes them: each
//! request hands its record over and waits for the commit, and whatever
//! arrived while the previous commit ran goes into the next transaction
//! together. A lone request pays what it paid before; a burst of N pays
//! about one transaction for its N records.
//!
//! A batch that cannot be written is written again one record at a time,
//! so that one bad record costs only itself. At shutdown, once the last
//! request is answered, [`AuditLog::close`] lets the task write what is
//! still queued (a request cut short after its change committed) and end;
//! the application waits for it before closing the store.

use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::db::{self, Db, audit::NewAudit};

/// Most records written in one transaction.
const MAX_BATCH: usize = 128;
/// Records waiting for the writer task; a request past this waits for room.
const QUEUE: usize = 1024;

struct Entry {
    record: NewAudit,
    time: DateTime<Utc>,
    /// Told once the record is committed, or could not be.
    done: oneshot::Sender<()>,
}

/// The handle requests use.
#[derive(Clone)]
pub struct AuditLog {
    tx: mpsc::Sender<Entry>,
    closing: CancellationToken,
}

impl AuditLog {
    /// Starts the writer task on `tasks`: it ends after [`Self::close`],
    /// once everything queued is written (or when every handle is gone).
    pub fn start(db: Db, tasks: &TaskTracker) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        let closing = CancellationToken::new();
        tasks.spawn(write_batches(db, rx, closing.clone()));
        Self { tx, closing }
    }

    /// No record is taken any more; those queued are still written.
    pub fn close(&self) {
        self.closing.cancel();
    }

    /// Writes `record` (timed now) and returns once it is committed; a
    /// record that cannot be written is logged (by the writer task, with
    /// what it was about).
    pub async fn write(&self, record: NewAudit) {
        let (done, written) = oneshot::channel();
        let entry = Entry { record, time: crate::clock::wall(), done };
        match self.tx.send(entry).await {
            Ok(()) => {
                // Answered by the task, which writes every record it took
                // before it ends.
                let _ = written.await;
            }
            Err(lost) => {
                let r = &lost.0.record;
                tracing::error!(method = %r.method, path = %r.path, "could not write the audit record: the writer has stopped");
            }
        }
    }
}

async fn write_batches(db: Db, mut rx: mpsc::Receiver<Entry>, closing: CancellationToken) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    loop {
        let taken = tokio::select! {
            n = rx.recv_many(&mut batch, MAX_BATCH) => n,
            () = closing.cancelled() => {
                // Refuse new records, then drain the queue to its end.
                rx.close();
                rx.recv_many(&mut batch, MAX_BATCH).await
            }
        };
        if taken == 0 {
            return;
        }
        if let Err(e) = write(&db, &batch).await {
            tracing::warn!(error = %e, records = batch.len(), "a batch of audit records failed; writing them one by one");
            for entry in &batch {
                if let Err(e) = write(&db, std::slice::from_ref(entry)).await {
                    let r = &entry.record;
                    tracing::error!(error = %e, method = %r.method, path = %r.path, "could not write the audit record");
                }
            }
        }
        for entry in batch.drain(..) {
            // A request that gave up waiting no longer listens.
            let _ = entry.done.send(());
        }
    }
}

async fn write(db: &Db, batch: &[Entry]) -> sqlx::Result<()> {
    let mut tx = db.begin_write().await?;
    for entry in batch {
        db::audit::record(&mut tx, &entry.record, entry.time).await?;
    }
    tx.commit().await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(path: &str) -> NewAudit {
        NewAudit {
            token_name: Some("ci".into()),
            role: Some("operator"),
            method: "POST".into(),
            path: path.into(),
            resource: None,
            namespace: None,
            action: None,
            status: 201,
            outcome: "allowed",
        }
    }

    /// A store in a temporary directory (kept while the test runs), and a
    /// log writing to it on `tasks`.
    async fn log() -> (tempfile::TempDir, Db, TaskTracker, AuditLog) {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = db::connect(&db::Location::Sqlite(dir.path().join("d.db"))).await.expect("store");
        let tasks = TaskTracker::new();
        let log = AuditLog::start(db.clone(), &tasks);
        (dir, db, tasks, log)
    }

    #[tokio::test]
    async fn concurrent_records_are_all_committed_before_their_writers_return() {
        let (_dir, db, _tasks, log) = log().await;
        let writes = (0..300).map(|i| {
            let log = log.clone();
            tokio::spawn(async move { log.write(record(&format!("/v1/pools/p{i}"))).await })
        });
        for w in writes.collect::<Vec<_>>() {
            w.await.expect("task");
        }
        let rows = db::audit::page(db.read(), None, None, 1000).await.expect("page");
        assert_eq!(rows.len(), 300);
        let mut paths: Vec<_> = rows.iter().map(|r| r.path.clone()).collect();
        paths.sort();
        paths.dedup();
        assert_eq!(paths.len(), 300, "every record once");
    }

    #[tokio::test]
    async fn records_of_requests_cut_short_are_written_before_the_task_ends() {
        let (_dir, db, tasks, log) = log().await;
        // The writer is busy elsewhere: records queue up.
        let busy = db.begin_write().await.expect("the writer");
        for i in 0..20 {
            let write = log.write(record(&format!("/v1/pools/p{i}")));
            // The request times out after handing its record over.
            assert!(tokio::time::timeout(std::time::Duration::from_millis(5), write).await.is_err());
        }
        log.close();
        drop(busy);
        tasks.close();
        tokio::time::timeout(std::time::Duration::from_secs(10), tasks.wait()).await.expect("the task ends");
        let rows = db::audit::page(db.read(), None, None, 1000).await.expect("page");
        assert_eq!(rows.len(), 20, "every record queued before the close is written");
        // After the close a record is refused at once (and logged), never awaited.
        tokio::time::timeout(std::time::Duration::from_secs(1), log.write(record("/v1/late")))
            .await
            .expect("no wait after close");
    }
}
