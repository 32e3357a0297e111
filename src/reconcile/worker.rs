//! The reconcile worker: decides when each pool gets a pass.
//!
//! Wake-ups come from the API (a pool changed), from the runtime's event
//! stream (a container started, died or vanished), and from a periodic
//! resync. A pool never has two passes at once: a wake-up during a pass is
//! remembered and served right after it. Failed passes back off
//! exponentially, with jitter, up to a cap.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use futures_util::StreamExt;
use rand::Rng;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::time::{DelayQueue, delay_queue};

use super::{Context, Outcome, ReconcileError, reconcile_once, record_failure};
use crate::metrics::PassOutcome;
use crate::runtime::Wake;

/// Asks the worker for a pass. Cheap to clone; sending never blocks.
#[derive(Clone)]
pub struct PoolQueue {
    tx: mpsc::UnboundedSender<Wake>,
}

impl PoolQueue {
    pub fn channel() -> (Self, mpsc::UnboundedReceiver<Wake>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Self { tx }, rx)
    }

    pub fn enqueue(&self, pool: &str) {
        // Only fails once the worker has stopped, when nothing is left to do.
        let _ = self.tx.send(Wake::Pool(pool.to_owned()));
    }

    pub fn sender(&self) -> mpsc::UnboundedSender<Wake> {
        self.tx.clone()
    }
}

#[derive(Debug, Clone, Copy)]
pub struct WorkerSettings {
    /// Every pool gets a pass at least this often.
    pub resync: Duration,
    /// Longest wait before retrying a failed pass.
    pub max_backoff: Duration,
    /// When a pass left work in flight (machines starting), look again
    /// after this long even if no event arrives.
    pub recheck: Duration,
}

const BASE_BACKOFF: Duration = Duration::from_millis(500);

/// Exponential backoff for the `failures`-th consecutive failure, with
/// jitter in [d/2, d] so that many failing pools do not retry in lockstep.
pub fn backoff(failures: u32, cap: Duration) -> Duration {
    let exp = BASE_BACKOFF.saturating_mul(1u32 << failures.saturating_sub(1).min(20));
    let d = exp.min(cap);
    let half = d / 2;
    half + half.mul_f64(rand::rng().random::<f64>())
}

struct Scheduler {
    ctx: Context,
    settings: WorkerSettings,
    running: HashSet<String>,
    /// Pools woken while their pass ran: they get another right after.
    again: HashSet<String>,
    failures: HashMap<String, u32>,
    delayed: DelayQueue<String>,
    delay_keys: HashMap<String, delay_queue::Key>,
    tasks: JoinSet<(String, Result<Outcome, ReconcileError>)>,
    task_pools: HashMap<tokio::task::Id, String>,
}

impl Scheduler {
    fn start(&mut self, pool: String) {
        if self.running.contains(&pool) {
            self.again.insert(pool);
            return;
        }
        if let Some(key) = self.delay_keys.remove(&pool) {
            self.delayed.remove(&key);
        }
        let ctx = self.ctx.clone();
        self.running.insert(pool.clone());
        let task_pool = pool.clone();
        let handle = self.tasks.spawn(async move {
            let timer = ctx.metrics.reconcile_timer(&task_pool);
            let result = reconcile_once(&ctx, &task_pool).await;
            timer.finish(match &result {
                Ok(Outcome::Converged) => PassOutcome::Converged,
                Ok(Outcome::Progressing) => PassOutcome::Progressing,
                Ok(Outcome::Gone) => PassOutcome::Gone,
                Err(_) => PassOutcome::Error,
            });
            ctx.changes.pool(&task_pool);
            (task_pool, result)
        });
        self.task_pools.insert(handle.id(), pool);
    }

    fn later(&mut self, pool: String, after: Duration) {
        if let Some(key) = self.delay_keys.get(&pool) {
            self.delayed.reset(key, after);
        } else {
            let key = self.delayed.insert(pool.clone(), after);
            self.delay_keys.insert(pool, key);
        }
    }

    async fn start_all(&mut self) {
        match crate::db::pools::names(&self.ctx.db).await {
            Ok(names) => names.into_iter().for_each(|n| self.start(n)),
            Err(e) => tracing::warn!(error = %e, "listing pools for a resync failed"),
        }
    }

    async fn finished(&mut self, pool: String, result: Result<Outcome, ReconcileError>) {
        self.running.remove(&pool);
        match result {
            Ok(Outcome::Gone) | Ok(Outcome::Converged) => {
                self.failures.remove(&pool);
            }
            Ok(Outcome::Progressing) => {
                self.failures.remove(&pool);
                self.later(pool.clone(), self.settings.recheck);
            }
            Err(e) => {
                let n = self.failures.entry(pool.clone()).or_default();
                *n += 1;
                let wait = backoff(*n, self.settings.max_backoff);
                tracing::warn!(pool = %pool, error = %crate::error::error_chain(&e), retry_in = ?wait, "reconcile failed");
                record_failure(&self.ctx, &pool, &e).await;
                self.later(pool.clone(), wait);
                // A wake-up during a failing pass does not skip the backoff.
                self.again.remove(&pool);
                return;
            }
        }
        if self.again.remove(&pool) {
            self.start(pool);
        }
    }
}

/// Runs until `cancel`, then waits for passes in flight to finish.
pub async fn run(
    ctx: Context,
    settings: WorkerSettings,
    mut wakes: mpsc::UnboundedReceiver<Wake>,
    cancel: CancellationToken,
) {
    let mut s = Scheduler {
        ctx,
        settings,
        running: HashSet::new(),
        again: HashSet::new(),
        failures: HashMap::new(),
        delayed: DelayQueue::new(),
        delay_keys: HashMap::new(),
        tasks: JoinSet::new(),
        task_pools: HashMap::new(),
    };
    let mut resync = tokio::time::interval(settings.resync);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            wake = wakes.recv() => match wake {
                Some(Wake::Pool(pool)) => s.start(pool),
                Some(Wake::All) => s.start_all().await,
                None => break,
            },
            _ = resync.tick() => s.start_all().await,
            Some(joined) = s.tasks.join_next_with_id() => match joined {
                Ok((id, (pool, result))) => {
                    s.task_pools.remove(&id);
                    s.finished(pool, result).await;
                }
                Err(e) => {
                    // A panicking pass is a bug; keep the pool going anyway.
                    let pool = s.task_pools.remove(&e.id()).unwrap_or_default();
                    tracing::error!(pool = %pool, error = %e, "reconcile pass panicked");
                    s.running.remove(&pool);
                    s.later(pool, settings.max_backoff);
                }
            },
            Some(expired) = s.delayed.next(), if !s.delayed.is_empty() => {
                let pool = expired.into_inner();
                s.delay_keys.remove(&pool);
                s.start(pool);
            }
        }
    }
    tracing::info!(in_flight = s.running.len(), "reconcile worker stopping; waiting for passes in flight");
    while s.tasks.join_next().await.is_some() {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped_with_jitter() {
        let cap = Duration::from_secs(60);
        for _ in 0..100 {
            let first = backoff(1, cap);
            assert!(first >= Duration::from_millis(250) && first <= Duration::from_millis(500), "{first:?}");
            let fourth = backoff(4, cap);
            assert!(fourth >= Duration::from_secs(2) && fourth <= Duration::from_secs(4), "{fourth:?}");
            let many = backoff(40, cap);
            assert!(many >= Duration::from_secs(30) && many <= cap, "{many:?}");
        }
    }
}
