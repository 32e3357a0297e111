//! Whether the store answers, as this process last saw it: a probe every
//! [`PROBE_EVERY`], each bounded by [`PROBE_TIMEOUT`], so that `/readyz`
//! answers at once from what is known instead of waiting, probe after
//! probe, on a connect to a store that is down (a load balancer's probe
//! would time out instead of reading the answer).

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Db;

pub const PROBE_EVERY: Duration = Duration::from_secs(1);
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// A probe result older than this (the prober itself stuck) is not trusted:
/// three probes' time.
pub const STALE_AFTER: Duration = Duration::from_secs(3);

/// The last probe's outcome.
pub struct StoreHealth {
    last: Mutex<(Instant, Result<(), String>)>,
}

impl Default for StoreHealth {
    /// The store has just answered: the process does not start without it.
    fn default() -> Self {
        Self { last: Mutex::new((Instant::now(), Ok(()))) }
    }
}

impl StoreHealth {
    fn lock(&self) -> std::sync::MutexGuard<'_, (Instant, Result<(), String>)> {
        self.last.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn note(&self, at: Instant, outcome: Result<(), String>) {
        *self.lock() = (at, outcome);
    }

    /// Whether the store answered its last probe, and that probe is recent.
    pub fn check(&self, now: Instant) -> Result<(), String> {
        let (at, outcome) = self.lock().clone();
        let age = now.saturating_duration_since(at);
        if age > STALE_AFTER {
            return Err(format!("no probe of the store has ended for {age:.1?}"));
        }
        outcome
    }

    /// One probe of `db`.
    pub async fn probe(&self, db: &Db) {
        let outcome = match tokio::time::timeout(PROBE_TIMEOUT, db.ping()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(crate::error::error_chain(&e)),
            Err(_) => Err(format!("the store did not answer within {PROBE_TIMEOUT:?}")),
        };
        self.note(Instant::now(), outcome);
    }
}

/// Probes the store every [`PROBE_EVERY`] until `cancel`.
pub async fn run(health: std::sync::Arc<StoreHealth>, db: Db, cancel: CancellationToken) {
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(PROBE_EVERY) => {}
        }
        health.probe(&db).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_last_probe_tells_until_it_is_stale() {
        let health = StoreHealth::default();
        assert_eq!(health.check(Instant::now()), Ok(()));
        health.note(Instant::now(), Err("connection refused".into()));
        assert_eq!(health.check(Instant::now()), Err("connection refused".into()));
        health.note(Instant::now(), Ok(()));
        tokio::time::advance(STALE_AFTER + Duration::from_millis(1)).await;
        let stale = health.check(Instant::now()).expect_err("a probe that never ended is no answer");
        assert!(stale.starts_with("no probe of the store has ended for 3.0"), "{stale}");
    }
}
