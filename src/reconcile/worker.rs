//! The reconcile worker: decides when each pool gets a pass.
//!
//! Wake-ups come from the API (a pool changed), from the engines' events (a
//! container started, died or vanished), from a pass that asked to be
//! requeued (a machine settling, a restart due), and from a periodic resync.
//! The queue is fair and bounded:
//! - a pool is never queued twice, and never has two passes at once (a
//!   wake-up during a pass is served right after it);
//! - at most `max_concurrent` passes run at once;
//! - wake-ups go before resyncs, so a change is acted on at once even while
//!   thousands of pools are due their resync;
//! - each pool's resync is its own timer, jittered, so resyncs spread over
//!   the interval instead of waking every pool in the same instant;
//! - failed passes back off exponentially, with jitter, up to a cap.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use futures_util::StreamExt;
use rand::RngExt;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::time::{DelayQueue, delay_queue};

use super::context::{Context, ReconcileError};
use super::{Outcome, reconcile_once, record_failure};
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
    /// Every pool gets a pass about this often (give or take a tenth).
    pub resync: Duration,
    /// Longest wait before retrying a failed pass.
    pub max_backoff: Duration,
    /// Passes running at once, across all pools.
    pub max_concurrent: usize,
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

/// `d` give or take a tenth.
fn jittered(d: Duration) -> Duration {
    d.mul_f64(rand::rng().random_range(0.9..=1.1))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Priority {
    /// Something changed: a wake-up or a requeue.
    Wake,
    /// Nothing is known to have changed: the periodic look.
    Resync,
}

/// Pools waiting for a pass, by priority, each at most once.
#[derive(Default)]
struct ReadyQueue {
    wakes: VecDeque<String>,
    resyncs: VecDeque<String>,
    queued: HashMap<String, Priority>,
}

impl ReadyQueue {
    fn push(&mut self, pool: String, priority: Priority) {
        match (self.queued.get(&pool), priority) {
            (Some(Priority::Wake), _) | (Some(Priority::Resync), Priority::Resync) => {}
            // Raised to a wake: the stale resync entry is skipped on pop.
            (_, Priority::Wake) => {
                self.queued.insert(pool.clone(), Priority::Wake);
                self.wakes.push_back(pool);
            }
            (None, Priority::Resync) => {
                self.queued.insert(pool.clone(), Priority::Resync);
                self.resyncs.push_back(pool);
            }
        }
    }

    fn pop(&mut self) -> Option<String> {
        if let Some(p) = self.wakes.pop_front() {
            self.queued.remove(&p);
            return Some(p);
        }
        while let Some(p) = self.resyncs.pop_front() {
            if self.queued.get(&p) == Some(&Priority::Resync) {
                self.queued.remove(&p);
                return Some(p);
            }
        }
        None
    }

    fn len(&self) -> usize {
        self.queued.len()
    }
}

/// Per-pool timers of one kind: at most one pending per pool.
struct Timers {
    queue: DelayQueue<String>,
    keys: HashMap<String, delay_queue::Key>,
}

impl Timers {
    fn new() -> Self {
        Self { queue: DelayQueue::new(), keys: HashMap::new() }
    }

    fn set(&mut self, pool: &str, after: Duration) {
        match self.keys.get(pool) {
            Some(key) => self.queue.reset(key, after),
            None => {
                let key = self.queue.insert(pool.to_owned(), after);
                self.keys.insert(pool.to_owned(), key);
            }
        }
    }

    fn cancel(&mut self, pool: &str) {
        if let Some(key) = self.keys.remove(pool) {
            self.queue.remove(&key);
        }
    }

    async fn next(&mut self) -> Option<String> {
        let expired = self.queue.next().await?;
        let pool = expired.into_inner();
        self.keys.remove(&pool);
        Some(pool)
    }
}

struct Scheduler {
    ctx: Context,
    settings: WorkerSettings,
    ready: ReadyQueue,
    running: HashSet<String>,
    /// Pools woken while their pass ran: they get another right after.
    again: HashSet<String>,
    failures: HashMap<String, u32>,
    /// Requeues and backoffs: a wake-up when they fire.
    soon: Timers,
    /// Resyncs: a low-priority look when they fire.
    resyncs: Timers,
    tasks: JoinSet<(String, Result<Outcome, ReconcileError>)>,
    task_pools: HashMap<tokio::task::Id, String>,
}

impl Scheduler {
    fn wake(&mut self, pool: String, priority: Priority) {
        if self.running.contains(&pool) {
            if priority == Priority::Wake {
                self.again.insert(pool);
            }
            return;
        }
        if priority == Priority::Wake {
            // A pool in backoff waits it out: a wake-up does not skip it.
            if self.failures.contains_key(&pool) && self.soon.keys.contains_key(&pool) {
                return;
            }
            self.soon.cancel(&pool);
        }
        self.ready.push(pool, priority);
    }

    async fn wake_all(&mut self, priority: Priority) {
        match crate::db::pools::names(self.ctx.db.background()).await {
            Ok(names) => names.into_iter().for_each(|n| self.wake(n, priority)),
            Err(e) => tracing::warn!(error = %e, "listing pools for a resync failed"),
        }
    }

    /// Starts queued passes up to the concurrency cap.
    fn dispatch(&mut self) {
        while self.running.len() < self.settings.max_concurrent {
            let Some(pool) = self.ready.pop() else { return };
            self.start(pool);
        }
    }

    fn start(&mut self, pool: String) {
        let ctx = self.ctx.clone();
        self.running.insert(pool.clone());
        let task_pool = pool.clone();
        let handle = self.tasks.spawn(async move {
            let timer = ctx.metrics.reconcile_timer(&task_pool);
            let result = reconcile_once(&ctx, &task_pool).await;
            timer.finish(match &result {
                Ok(Outcome::Idle) => PassOutcome::Converged,
                Ok(Outcome::Requeue(_)) => PassOutcome::Progressing,
                Ok(Outcome::Gone) => PassOutcome::Gone,
                Err(_) => PassOutcome::Error,
            });
            ctx.changes.pool(&task_pool);
            (task_pool, result)
        });
        self.task_pools.insert(handle.id(), pool);
    }

    async fn finished(&mut self, pool: String, result: Result<Outcome, ReconcileError>) {
        self.running.remove(&pool);
        match result {
            Ok(Outcome::Gone) => {
                self.failures.remove(&pool);
                self.soon.cancel(&pool);
                self.resyncs.cancel(&pool);
                self.again.remove(&pool);
                return;
            }
            Ok(Outcome::Idle) => {
                self.failures.remove(&pool);
            }
            Ok(Outcome::Requeue(after)) => {
                self.failures.remove(&pool);
                self.soon.set(&pool, after);
            }
            Err(e) => {
                let n = self.failures.entry(pool.clone()).or_default();
                *n += 1;
                let wait = backoff(*n, self.settings.max_backoff);
                tracing::warn!(pool = %pool, error = %crate::error::error_chain(&e), retry_in = ?wait, "reconcile failed");
                record_failure(&self.ctx, &pool, &e).await;
                self.soon.set(&pool, wait);
                // A wake-up during a failing pass does not skip the backoff.
                self.again.remove(&pool);
            }
        }
        self.resyncs.set(&pool, jittered(self.settings.resync));
        if self.again.remove(&pool) {
            self.wake(pool, Priority::Wake);
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
        ready: ReadyQueue::default(),
        running: HashSet::new(),
        again: HashSet::new(),
        failures: HashMap::new(),
        soon: Timers::new(),
        resyncs: Timers::new(),
        tasks: JoinSet::new(),
        task_pools: HashMap::new(),
    };
    // Every pool gets a first look; the engines' first lists wake them again.
    s.wake_all(Priority::Resync).await;
    loop {
        s.dispatch();
        tokio::select! {
            biased;
            _ = cancel.cancelled() => break,
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
                    s.soon.set(&pool, settings.max_backoff);
                }
            },
            wake = wakes.recv() => match wake {
                Some(Wake::Pool(pool)) => s.wake(pool, Priority::Wake),
                Some(Wake::All) => s.wake_all(Priority::Wake).await,
                Some(Wake::Engine { name, reachable, message }) => {
                    super::engine_events::record(&s.ctx, &name, reachable, message);
                    s.wake_all(Priority::Wake).await;
                }
                None => break,
            },
            Some(pool) = s.soon.next(), if !s.soon.queue.is_empty() => s.wake(pool, Priority::Wake),
            Some(pool) = s.resyncs.next(), if !s.resyncs.queue.is_empty() => s.wake(pool, Priority::Resync),
        }
    }
    tracing::info!(
        in_flight = s.running.len(),
        queued = s.ready.len(),
        "reconcile worker stopping; waiting for passes in flight"
    );
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

    #[test]
    fn the_ready_queue_holds_a_pool_once_and_serves_wakes_before_resyncs() {
        let mut q = ReadyQueue::default();
        q.push("a".into(), Priority::Resync);
        q.push("b".into(), Priority::Resync);
        q.push("a".into(), Priority::Resync);
        q.push("c".into(), Priority::Wake);
        q.push("b".into(), Priority::Wake);
        q.push("c".into(), Priority::Wake);
        assert_eq!(q.len(), 3);
        let order: Vec<String> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(order, ["c", "b", "a"], "wakes first, in order; b raised, served once");
        assert_eq!(q.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn timers_fire_once_per_pool_and_reset_moves_them() {
        let mut t = Timers::new();
        t.set("a", Duration::from_secs(5));
        t.set("b", Duration::from_secs(1));
        t.set("a", Duration::from_secs(2));
        assert_eq!(t.next().await.as_deref(), Some("b"));
        let before = tokio::time::Instant::now();
        assert_eq!(t.next().await.as_deref(), Some("a"));
        assert_eq!(tokio::time::Instant::now() - before, Duration::from_secs(1), "a fired at 2 s, not 5 s");
        assert!(t.queue.is_empty() && t.keys.is_empty());
    }
}
