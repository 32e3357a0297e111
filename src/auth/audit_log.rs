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
//! about one transaction instead of N.

use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, oneshot};

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

/// The handle requests use; the task ends when every handle is dropped.
#[derive(Clone)]
pub struct AuditLog {
    tx: mpsc::Sender<Entry>,
}

impl AuditLog {
    /// Starts the writer task on the current runtime.
    pub fn start(db: Db) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(write_batches(db, rx));
        Self { tx }
    }

    /// Writes `record` (timed now) and returns once it is committed; a
    /// record that cannot be written is logged (by the writer task, with
    /// what it was about).
    pub async fn write(&self, record: NewAudit) {
        let (done, written) = oneshot::channel();
        let entry = Entry { record, time: Utc::now(), done };
        match self.tx.send(entry).await {
            Ok(()) => {
                // Only a panicking writer task drops the sender unanswered.
                let _ = written.await;
            }
            Err(lost) => {
                let r = &lost.0.record;
                tracing::error!(method = %r.method, path = %r.path, "could not write the audit record: the writer has stopped");
            }
        }
    }
}

async fn write_batches(db: Db, mut rx: mpsc::Receiver<Entry>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
        if let Err(e) = write(&db, &batch).await {
            for Entry { record: r, .. } in &batch {
                tracing::error!(error = %e, method = %r.method, path = %r.path, "could not write the audit record");
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
            status: 201,
            outcome: "allowed",
        }
    }

    #[tokio::test]
    async fn concurrent_records_are_all_committed_before_their_writers_return() {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = db::connect(&dir.path().join("d.db")).await.expect("store");
        let log = AuditLog::start(db.clone());
        let writes = (0..300).map(|i| {
            let log = log.clone();
            tokio::spawn(async move { log.write(record(&format!("/v1/pools/p{i}"))).await })
        });
        for w in writes.collect::<Vec<_>>() {
            w.await.expect("task");
        }
        let rows = db::audit::page(db.read(), None, 1000).await.expect("page");
        assert_eq!(rows.len(), 300);
        let mut paths: Vec<_> = rows.iter().map(|r| r.path.clone()).collect();
        paths.sort();
        paths.dedup();
        assert_eq!(paths.len(), 300, "every record once");
    }
}
