//! Idempotency keys in the store: a keyed POST claims its key before it
//! runs, its first answer is kept for a day, and a claim never outlives its
//! request. The HTTP middleware (`http::idempotency`) reads the request and
//! replays answers; this module owns what is stored and when.

use std::time::Duration;

use tokio_util::task::TaskTracker;

pub use crate::db::idempotency::{Entry, Request, Stored};
use crate::db::{self, Db};

/// The keys of keyed requests.
#[derive(Clone)]
pub struct Keys {
    db: Db,
    /// How long a claim whose request never finished blocks its key: no
    /// request runs longer than the request timeout, so an older claim was
    /// left by a process that stopped.
    claim_deadline: Duration,
    /// Releases of claims dropped with their request run here, so that
    /// shutdown waits for them.
    tasks: TaskTracker,
}

/// What claiming a key found.
pub enum Claimed {
    /// The key is this request's until its answer is stored.
    First(Claim),
    /// The key was used before: its first answer, or a claim still running.
    Seen(Entry),
}

impl Keys {
    pub fn new(db: Db, request_timeout: Duration, tasks: TaskTracker) -> Self {
        Self { db, claim_deadline: request_timeout + Duration::from_secs(5), tasks }
    }

    /// Claims the key of a request about to run.
    pub async fn claim(&self, request: &Request<'_>) -> sqlx::Result<Claimed> {
        let mut tx = self.db.begin_write().await?;
        // Claims are compared across replicas: by the store's clock.
        let now = tx.now().await?;
        let stale = now - chrono::TimeDelta::from_std(self.claim_deadline).unwrap_or(chrono::TimeDelta::MAX);
        let found = db::idempotency::claim(&mut tx, request, now, stale).await?;
        tx.commit().await?;
        Ok(match found {
            Some(entry) => Claimed::Seen(entry),
            None => Claimed::First(Claim {
                keys: self.clone(),
                token: request.token.to_owned(),
                key: request.key.to_owned(),
                held: true,
            }),
        })
    }
}

/// A claimed key whose answer is not stored yet; released when dropped
/// (the request was cut short), so that a retry is not blocked.
pub struct Claim {
    keys: Keys,
    token: String,
    key: String,
    held: bool,
}

impl Claim {
    /// Stores the request's answer under its key.
    pub async fn complete(mut self, answer: &Stored<'_>) -> sqlx::Result<()> {
        let mut tx = self.keys.db.begin_write().await?;
        db::idempotency::complete(&mut tx, &self.token, &self.key, answer).await?;
        tx.commit().await?;
        self.held = false;
        Ok(())
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if !self.held {
            return;
        }
        let db = self.keys.db.clone();
        let (token, key) = (std::mem::take(&mut self.token), std::mem::take(&mut self.key));
        // Drop cannot wait; the release is one short write of its own, on
        // the tracker that shutdown waits for.
        self.keys.tasks.spawn(async move {
            let released = async {
                let mut tx = db.begin_write().await?;
                db::idempotency::release(&mut tx, &token, &key).await?;
                tx.commit().await
            };
            if let Err(e) = released.await {
                tracing::warn!(error = %e, "could not release an idempotency key; it expires with the request timeout");
            }
        });
    }
}
