//! Auditing refusals of requests that carry no valid token, at a bounded
//! cost.
//!
//! Anyone who reaches the listener can send such requests, as fast as the
//! network allows. Writing one audit row per refusal would let them grow
//! the database at will, so refusals come in bursts: the first refusal of a
//! burst writes a row (with its method, path and status), the ones that
//! follow within [`RefusalAudit::window`] are only counted in memory, and
//! when the burst ends its row's `repeats` is set to the number of refusals
//! it stands for. Token-less clients therefore add at most one row per
//! window, whatever they send.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::Utc;

use crate::db::{self, Db, audit::NewAudit};

/// The burst being counted.
struct Burst {
    started: Instant,
    /// The row written for its first refusal; `None` until written (or if
    /// writing it failed).
    row: Option<i64>,
    /// Refusals after the first.
    more: i64,
}

pub struct RefusalAudit {
    window: Duration,
    burst: Mutex<Option<Burst>>,
}

impl RefusalAudit {
    pub fn new(window: Duration) -> Self {
        Self { window, burst: Mutex::new(None) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Burst>> {
        self.burst.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Audits one refusal of a request without a valid token: counted in
    /// the open burst, or written as the first row of a new one.
    pub async fn record(&self, db: &Db, audit: &NewAudit) {
        let now = Instant::now();
        let ended = {
            let mut burst = self.lock();
            match burst.as_mut() {
                Some(b) if now.duration_since(b.started) < self.window => {
                    b.more += 1;
                    return;
                }
                _ => burst.replace(Burst { started: now, row: None, more: 0 }),
            }
        };
        if let Some(ended) = ended {
            close(db, ended).await;
        }
        let written = async {
            let mut tx = db.begin_background().await?;
            let id = db::audit::record(&mut tx, audit, Utc::now()).await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(id)
        };
        match written.await {
            Ok(id) => {
                let mut burst = self.lock();
                match burst.as_mut() {
                    Some(b) if b.started == now => b.row = Some(id),
                    // The burst ended while its first row was being written.
                    _ => {}
                }
            }
            Err(e) => tracing::error!(error = %e, "could not write the audit record of a refused request"),
        }
    }

    /// Ends the open burst if its window has passed, writing its count.
    pub async fn close_expired(&self, db: &Db, now: Instant) {
        let ended = {
            let mut burst = self.lock();
            match burst.as_ref() {
                Some(b) if now.duration_since(b.started) >= self.window && b.row.is_some() => burst.take(),
                _ => None,
            }
        };
        if let Some(b) = ended {
            close(db, b).await;
        }
    }

    /// Ends the open burst, whatever its age (at shutdown).
    pub async fn close_all(&self, db: &Db) {
        let ended = self.lock().take();
        if let Some(b) = ended {
            close(db, b).await;
        }
    }
}

async fn close(db: &Db, burst: Burst) {
    let Some(row) = burst.row else { return };
    if burst.more > 0
        && let Err(e) = add_repeats(db, row, burst.more).await
    {
        tracing::error!(error = %e, row, repeats = burst.more, "could not count refused requests in the audit trail");
    }
}

async fn add_repeats(db: &Db, row: i64, more: i64) -> sqlx::Result<()> {
    let mut tx = db.begin_background().await?;
    db::audit::add_repeats(&mut tx, row, more).await?;
    tx.commit().await
}
