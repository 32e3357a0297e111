//! Changes inside one process: "pool X changed", "job Y changed", published by whoever
//! commits a change to what `GET` shows for it (a handler, a reconcile
//! pass, an upgrade step), for the event streams that follow it.
//!
//! A notice carries no data: a woken stream reads the store, which stays
//! the only source of truth, so a lost or merged notice costs latency, not
//! correctness. Only subjects someone is watching have a channel; a notice
//! about any other subject is one map lookup.
//!
//! With several replicas (PostgreSQL), every change is also handed to
//! [`crate::replicas::listener`], which tells the other replicas through
//! PostgreSQL's `NOTIFY` (the wire form: [`crate::db::notify`]); what it
//! hears back is published here with [`Changes::heard`], never forwarded.
//! Three modules, three names: `events::changes` (in this process),
//! `db::notify` (what a `NOTIFY` between replicas says),
//! `replicas::listener` (the task that sends and hears them).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{mpsc, watch};

use crate::domain::object::{ObjectRef, PoolRef};

/// What a notice is about: a pool or an upgrade job (engines have no
/// streams of their own).
pub type Subject = ObjectRef;

/// Cheap to clone; every clone publishes to the same watchers.
#[derive(Clone, Default)]
pub struct Changes {
    watched: Arc<Mutex<HashMap<Subject, watch::Sender<u64>>>>,
    /// The other replicas, when there are any.
    peers: Option<mpsc::UnboundedSender<Subject>>,
}

impl Changes {
    fn lock(&self) -> MutexGuard<'_, HashMap<Subject, watch::Sender<u64>>> {
        self.watched.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Call after committing a change to a pool (its spec, status,
    /// machines or events).
    pub fn pool(&self, pool: &PoolRef) {
        self.publish(&Subject::Pool(pool.clone()));
    }

    /// Call after committing a change to upgrade job `id`.
    pub fn job(&self, id: i64) {
        self.publish(&Subject::Job(id));
    }

    /// Notices also go to `peers` from now on; answers the receiving end.
    pub fn with_peers(mut self) -> (Self, mpsc::UnboundedReceiver<Subject>) {
        let (tx, rx) = mpsc::unbounded_channel();
        self.peers = Some(tx);
        (self, rx)
    }

    fn publish(&self, subject: &Subject) {
        self.heard(subject);
        if let Some(peers) = &self.peers {
            let _ = peers.send(subject.clone());
        }
    }

    /// A notice from another replica: for this replica's watchers only.
    pub fn heard(&self, subject: &Subject) {
        if let Some(tx) = self.lock().get(subject) {
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Notices may have been lost (the listener was away): every watcher
    /// reads its subject again.
    pub fn heard_everything(&self) {
        for tx in self.lock().values() {
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    pub fn watch_pool(&self, pool: &PoolRef) -> Watcher {
        self.watch(Subject::Pool(pool.clone()))
    }

    pub fn watch_job(&self, id: i64) -> Watcher {
        self.watch(Subject::Job(id))
    }

    fn watch(&self, subject: Subject) -> Watcher {
        let rx = self.lock().entry(subject.clone()).or_insert_with(|| watch::channel(0).0).subscribe();
        Watcher { rx, subject, changes: self.clone() }
    }
}

/// Notices about one subject, from the time it was created.
pub struct Watcher {
    rx: watch::Receiver<u64>,
    subject: Subject,
    changes: Changes,
}

impl Watcher {
    /// Resolves when a change was published since the last call (or since
    /// the watcher was made); several changes in between resolve it once.
    pub async fn changed(&mut self) {
        if self.rx.changed().await.is_err() {
            // The sender lives in the map as long as a watcher does, so
            // this does not happen; never wake in a loop if it ever did.
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let mut watched = self.changes.lock();
        // This watcher's receiver is still alive here: it is the last one
        // when the count is 1.
        if watched.get(&self.subject).is_some_and(|tx| tx.receiver_count() <= 1) {
            watched.remove(&self.subject);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_watcher_wakes_on_its_subject_only_and_leaves_no_trace() {
        let changes = Changes::default();
        let mut web = changes.watch_pool(&"web".into());
        changes.pool(&"db".into());
        changes.job(1);
        let early = tokio::time::timeout(Duration::from_millis(20), web.changed()).await;
        assert!(early.is_err(), "woken by another subject");
        changes.pool(&"web".into());
        changes.pool(&"web".into());
        tokio::time::timeout(Duration::from_secs(1), web.changed()).await.expect("woken by its own subject");
        let again = tokio::time::timeout(Duration::from_millis(20), web.changed()).await;
        assert!(again.is_err(), "two notices before a read wake once");
        let second = changes.watch_pool(&"web".into());
        drop(web);
        assert_eq!(changes.lock().len(), 1, "kept while a watcher remains");
        drop(second);
        assert!(changes.lock().is_empty(), "the last watcher removes the channel");
    }
}
