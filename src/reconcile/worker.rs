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

use crate::domain::object::PoolRef;
use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use futures_util::StreamExt;
use opentelemetry::trace::SpanContext;
use rand::RngExt;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::time::{DelayQueue, delay_queue};
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use super::context::{Context, ReconcileError};
use super::{Outcome, reconcile_once, record_failure};
use crate::metrics::PassOutcome;
use crate::runtime::{EngineChange, Wake};

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

    pub fn enqueue(&self, pool: &PoolRef) {
        let pool = pool.clone();
        let wake = match crate::telemetry::context::span_context(&tracing::Span::current()) {
            Some(by) => Wake::Traced { pool, by },
            None => Wake::Pool(pool),
        };
        // Only fails once the worker has stopped, when nothing is left to do.
        let _ = self.tx.send(wake);
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

/// The wait after the `failures`-th consecutive failure of a pool's pass.
pub fn backoff(failures: u32, cap: Duration) -> Duration {
    crate::domain::backoff::jittered(BASE_BACKOFF, failures, cap)
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
    wakes: VecDeque<PoolRef>,
    resyncs: VecDeque<PoolRef>,
    queued: HashMap<PoolRef, Priority>,
}

impl ReadyQueue {
    fn push(&mut self, pool: PoolRef, priority: Priority) {
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

    fn pop(&mut self) -> Option<PoolRef> {
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
    queue: DelayQueue<PoolRef>,
    keys: HashMap<PoolRef, delay_queue::Key>,
}

impl Timers {
    fn new() -> Self {
        Self { queue: DelayQueue::new(), keys: HashMap::new() }
    }

    fn set(&mut self, pool: &PoolRef, after: Duration) {
        match self.keys.get(pool) {
            Some(key) => self.queue.reset(key, after),
            None => {
                let key = self.queue.insert(pool.to_owned(), after);
                self.keys.insert(pool.to_owned(), key);
            }
        }
    }

    fn cancel(&mut self, pool: &PoolRef) {
        if let Some(key) = self.keys.remove(pool) {
            self.queue.remove(&key);
        }
    }

    async fn next(&mut self) -> Option<PoolRef> {
        let expired = self.queue.next().await?;
        let pool = expired.into_inner();
        self.keys.remove(&pool);
        Some(pool)
    }
}

/// What the scheduler asks of the pools: a pass of one, the record of a
/// pass that failed, every pool's name, and the story of an engine. The
/// reconciler's [`Context`] is the real one; tests drive the scheduler with
/// one of their own under paused time.
pub trait Passes: Clone + Send + Sync + 'static {
    fn pass(&self, pool: &PoolRef) -> impl Future<Output = Result<Outcome, ReconcileError>> + Send;
    /// Whether this process drives `pool` now (with replicas: holds its
    /// lease). A pass of a pool it does not drive does nothing, and leaves
    /// the spans that woke the pool to the pass that will.
    fn drives(&self, _pool: &PoolRef) -> bool {
        true
    }
    fn failed(&self, pool: &PoolRef, error: &ReconcileError) -> impl Future<Output = ()> + Send;
    fn pools(&self) -> impl Future<Output = sqlx::Result<Vec<PoolRef>>> + Send;
    fn engine_changed(&self, engine: &str, change: EngineChange, message: String);
}

impl Passes for Context {
    fn drives(&self, pool: &PoolRef) -> bool {
        self.for_pool(pool).is_some()
    }

    async fn pass(&self, pool: &PoolRef) -> Result<Outcome, ReconcileError> {
        // Another replica drives the pool: nothing to do here, and no
        // timers to keep for it (the keeper wakes it if it comes back).
        let Some(ctx) = self.for_pool(pool) else { return Ok(Outcome::Gone) };
        let timer = self.metrics.reconcile_timer(pool);
        let result = reconcile_once(&ctx, pool).await;
        timer.finish(match &result {
            Ok(Outcome::Idle) => PassOutcome::Converged,
            Ok(Outcome::Requeue(_)) => PassOutcome::Progressing,
            Ok(Outcome::Gone) => PassOutcome::Gone,
            Err(_) => PassOutcome::Error,
        });
        // Event streams, here and through the other replicas' listeners,
        // hear of a pass that wrote; one that found everything as it was
        // (nearly every periodic pass) tells nobody.
        if ctx.wrote() {
            self.changes.pool(pool);
        }
        result
    }

    async fn failed(&self, pool: &PoolRef, error: &ReconcileError) {
        if let Some(ctx) = self.for_pool(pool) {
            record_failure(&ctx, pool, error).await;
            if ctx.wrote() {
                self.changes.pool(pool);
            }
        }
    }

    async fn pools(&self) -> sqlx::Result<Vec<PoolRef>> {
        match &self.leases {
            Some(leases) => Ok(leases.held_pools()),
            None => crate::db::pools::all_refs(self.db.background()).await,
        }
    }

    fn engine_changed(&self, engine: &str, change: EngineChange, message: String) {
        let (ctx, ev) = (self.clone(), crate::engines::events::event(engine, change, message));
        self.tasks.clone().spawn(async move { ctx.record(&ev).await });
    }
}

struct Scheduler<P: Passes> {
    passes: P,
    settings: WorkerSettings,
    ready: ReadyQueue,
    running: HashSet<PoolRef>,
    /// Pools woken while their pass ran: they get another right after.
    again: HashSet<PoolRef>,
    failures: HashMap<PoolRef, u32>,
    /// Requeues and backoffs: a wake-up when they fire.
    soon: Timers,
    /// Resyncs: a low-priority look when they fire.
    resyncs: Timers,
    tasks: JoinSet<(PoolRef, Result<Outcome, ReconcileError>)>,
    task_pools: HashMap<tokio::task::Id, PoolRef>,
    /// The spans (requests) that woke a pool since its last pass driving
    /// it began: that pass links to them.
    woken_by: HashMap<PoolRef, Woken>,
}

/// The spans that woke a pool, since when.
struct Woken {
    since: tokio::time::Instant,
    links: Vec<SpanContext>,
}

/// Most links one pass keeps; a pool woken by a burst of requests links
/// to the first ones.
const MAX_LINKS: usize = 16;
/// How long the spans that woke a pool this process does not drive (yet:
/// the keeper takes a new pool's lease on its next round) wait for the
/// pass that will; the links of a pool another replica drives are dropped
/// after it, once [`PRUNE_LINKS_AT`] pools hold some.
const KEEP_LINKS: Duration = Duration::from_secs(60);
const PRUNE_LINKS_AT: usize = 4096;

impl<P: Passes> Scheduler<P> {
    fn wake(&mut self, pool: PoolRef, priority: Priority) {
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
        match self.passes.pools().await {
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

    fn woken_by(&mut self, pool: PoolRef, by: SpanContext) {
        let now = tokio::time::Instant::now();
        if self.woken_by.len() >= PRUNE_LINKS_AT {
            self.woken_by.retain(|_, w| now.duration_since(w.since) < KEEP_LINKS);
        }
        let woken = self.woken_by.entry(pool.clone()).or_insert_with(|| Woken { since: now, links: Vec::new() });
        if woken.links.len() < MAX_LINKS {
            woken.links.push(by);
        }
        self.wake(pool, Priority::Wake);
    }

    fn start(&mut self, pool: PoolRef) {
        let passes = self.passes.clone();
        self.running.insert(pool.clone());
        let task_pool = pool.clone();
        let links = if self.passes.drives(&pool) {
            self.woken_by.remove(&pool).map(|w| w.links).unwrap_or_default()
        } else {
            Vec::new()
        };
        let span = pass_span(&pool, links);
        let handle = self.tasks.spawn(
            async move {
                let result = passes.pass(&task_pool).await;
                (task_pool, result)
            }
            .instrument(span),
        );
        self.task_pools.insert(handle.id(), pool);
    }

    async fn finished(&mut self, pool: PoolRef, result: Result<Outcome, ReconcileError>) {
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
            Err(ReconcileError::Lost(lost)) => {
                // Handed over or lost mid-pass: the new driver carries on.
                tracing::info!(%lost, "pass stopped");
                self.failures.remove(&pool);
                self.soon.cancel(&pool);
                self.resyncs.cancel(&pool);
                self.again.remove(&pool);
                return;
            }
            Err(e) => {
                let n = self.failures.entry(pool.clone()).or_default();
                *n += 1;
                let wait = backoff(*n, self.settings.max_backoff);
                tracing::warn!(pool = %pool, error = %crate::error::error_chain(&e), retry_in = ?wait, "reconcile failed");
                self.passes.failed(&pool, &e).await;
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

/// The root span of one pass: a trace of its own (a pass is not part of
/// the request that woke it, which has long answered), linked to the spans
/// of the requests that woke it.
fn pass_span(pool: &PoolRef, links: Vec<SpanContext>) -> tracing::Span {
    let span = tracing::info_span!(
        parent: None,
        "reconcile pass",
        namespace = %pool.namespace,
        pool = %pool.name,
        woken_by = i64::try_from(links.len()).unwrap_or(i64::MAX),
        trace_id = tracing::field::Empty,
    );
    for link in links {
        span.add_link(link);
    }
    crate::telemetry::context::record_trace_id(&span);
    span
}

/// Runs until `cancel`, then waits for passes in flight to finish.
pub async fn run<P: Passes>(
    passes: P,
    settings: WorkerSettings,
    mut wakes: mpsc::UnboundedReceiver<Wake>,
    cancel: CancellationToken,
) {
    let mut s = Scheduler {
        passes,
        settings,
        ready: ReadyQueue::default(),
        running: HashSet::new(),
        again: HashSet::new(),
        failures: HashMap::new(),
        soon: Timers::new(),
        resyncs: Timers::new(),
        tasks: JoinSet::new(),
        task_pools: HashMap::new(),
        woken_by: HashMap::new(),
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
                    let Some(pool) = s.task_pools.remove(&e.id()) else { continue };
                    tracing::error!(pool = %pool, error = %e, "reconcile pass panicked");
                    s.running.remove(&pool);
                    s.soon.set(&pool, settings.max_backoff);
                }
            },
            wake = wakes.recv() => match wake {
                Some(Wake::Pool(pool)) => s.wake(pool, Priority::Wake),
                Some(Wake::Traced { pool, by }) => s.woken_by(pool, by),
                Some(Wake::All) => s.wake_all(Priority::Wake).await,
                Some(Wake::Engine { name, change, message }) => {
                    s.passes.engine_changed(&name, change, message);
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
        let order: Vec<String> = std::iter::from_fn(|| q.pop()).map(|p| p.name).collect();
        assert_eq!(order, ["c", "b", "a"], "wakes first, in order; b raised, served once");
        assert_eq!(q.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn timers_fire_once_per_pool_and_reset_moves_them() {
        let mut t = Timers::new();
        t.set(&"a".into(), Duration::from_secs(5));
        t.set(&"b".into(), Duration::from_secs(1));
        t.set(&"a".into(), Duration::from_secs(2));
        assert_eq!(t.next().await, Some("b".into()));
        let before = tokio::time::Instant::now();
        assert_eq!(t.next().await, Some("a".into()));
        assert_eq!(tokio::time::Instant::now() - before, Duration::from_secs(1), "a fired at 2 s, not 5 s");
        assert!(t.queue.is_empty() && t.keys.is_empty());
    }

    // ---- the scheduler under paused time ----------------------------------

    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    use tokio::time::Instant;

    use crate::runtime::RuntimeError;

    /// Passes that take `pass_time`, answer what their pool's script says
    /// (then `Idle`), and log when each began.
    #[derive(Clone)]
    struct Fake {
        started: Instant,
        pools: Vec<PoolRef>,
        pass_time: Duration,
        script: Arc<Mutex<HashMap<String, VecDeque<Option<Outcome>>>>>,
        log: Arc<Mutex<Vec<(String, Duration)>>>,
        running: Arc<AtomicUsize>,
        most_running: Arc<AtomicUsize>,
    }

    impl Fake {
        /// `script`: per pool, the outcomes of its passes in order; `None`
        /// is a failed pass.
        fn new(pools: &[&str], pass_time: Duration, script: &[(&str, Vec<Option<Outcome>>)]) -> Self {
            Self {
                started: Instant::now(),
                pools: pools.iter().map(|p| PoolRef::in_default(*p)).collect(),
                pass_time,
                script: Arc::new(Mutex::new(
                    script.iter().map(|(p, o)| ((*p).to_owned(), o.iter().cloned().collect())).collect(),
                )),
                log: Arc::default(),
                running: Arc::default(),
                most_running: Arc::default(),
            }
        }

        fn log(&self) -> Vec<(String, Duration)> {
            self.log.lock().unwrap().clone()
        }

        /// When each pass of `pool` began.
        fn times(&self, pool: &str) -> Vec<Duration> {
            self.log().into_iter().filter(|(p, _)| p == pool).map(|(_, t)| t).collect()
        }
    }

    impl Passes for Fake {
        async fn pass(&self, pool: &PoolRef) -> Result<Outcome, ReconcileError> {
            self.log.lock().unwrap().push((pool.name.clone(), self.started.elapsed()));
            let now_running = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.most_running.fetch_max(now_running, Ordering::SeqCst);
            tokio::time::sleep(self.pass_time).await;
            self.running.fetch_sub(1, Ordering::SeqCst);
            let next = self.script.lock().unwrap().get_mut(&pool.name).and_then(VecDeque::pop_front);
            match next {
                Some(None) => Err(RuntimeError::Api("scripted failure".into()).into()),
                Some(Some(outcome)) => Ok(outcome),
                None => Ok(Outcome::Idle),
            }
        }

        async fn failed(&self, _: &PoolRef, _: &ReconcileError) {}

        async fn pools(&self) -> sqlx::Result<Vec<PoolRef>> {
            Ok(self.pools.clone())
        }

        fn engine_changed(&self, _: &str, _: EngineChange, _: String) {}
    }

    struct Running {
        wakes: mpsc::UnboundedSender<Wake>,
        cancel: CancellationToken,
        worker: tokio::task::JoinHandle<()>,
    }

    fn start(fake: &Fake, max_concurrent: usize, resync: Duration) -> Running {
        let (wakes, rx) = mpsc::unbounded_channel();
        let cancel = CancellationToken::new();
        let settings = WorkerSettings { resync, max_backoff: Duration::from_secs(60), max_concurrent };
        let worker = tokio::spawn(run(fake.clone(), settings, rx, cancel.clone()));
        Running { wakes, cancel, worker }
    }

    impl Running {
        async fn stop(self) {
            self.cancel.cancel();
            self.worker.await.expect("the worker ended cleanly");
        }
    }

    const HOUR: Duration = Duration::from_secs(3600);

    #[tokio::test(start_paused = true)]
    async fn a_requeued_pool_gets_its_next_pass_after_the_delay_it_asked_for() {
        let fake = Fake::new(&["a"], Duration::ZERO, &[("a", vec![Some(Outcome::Requeue(Duration::from_secs(3)))])]);
        let w = start(&fake, 4, HOUR);
        tokio::time::sleep(Duration::from_secs(10)).await;
        w.stop().await;
        assert_eq!(fake.times("a"), [Duration::ZERO, Duration::from_secs(3)], "then idle until the resync");
    }

    #[tokio::test(start_paused = true)]
    async fn failures_back_off_exponentially_and_a_wake_does_not_cut_the_backoff_short() {
        let fake = Fake::new(&["a"], Duration::ZERO, &[("a", vec![None, None, None])]);
        let w = start(&fake, 4, HOUR);
        tokio::time::sleep(Duration::from_millis(100)).await;
        // A wake during the first backoff (250-500 ms) waits for it.
        w.wakes.send(Wake::Pool(PoolRef::in_default("a"))).expect("worker alive");
        tokio::time::sleep(Duration::from_secs(20)).await;
        w.stop().await;
        let t = fake.times("a");
        assert_eq!(t.len(), 4, "three failures, then a good pass: {t:?}");
        let gaps: Vec<Duration> = t.windows(2).map(|w| w[1] - w[0]).collect();
        let bounds = [(250, 500), (500, 1000), (1000, 2000)];
        for (gap, (lo, hi)) in gaps.iter().zip(bounds) {
            assert!(
                *gap >= Duration::from_millis(lo) && *gap <= Duration::from_millis(hi),
                "backoff {gap:?} not in [{lo}, {hi}] ms: {t:?}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn at_most_max_concurrent_passes_run_and_wakes_go_before_resyncs() {
        let fake = Fake::new(&["r1", "r2", "r3"], Duration::from_secs(1), &[]);
        let w = start(&fake, 1, HOUR);
        tokio::time::sleep(Duration::from_millis(10)).await;
        w.wakes.send(Wake::Pool(PoolRef::in_default("w"))).expect("worker alive");
        tokio::time::sleep(Duration::from_secs(10)).await;
        w.stop().await;
        let order: Vec<String> = fake.log().into_iter().map(|(p, _)| p).collect();
        assert_eq!(order, ["r1", "w", "r2", "r3"], "the wake goes before the resyncs queued ahead of it");
        assert_eq!(fake.most_running.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_wake_during_a_pass_gets_one_more_pass_right_after_never_two_at_once() {
        let fake = Fake::new(&["a"], Duration::from_secs(1), &[]);
        let w = start(&fake, 4, HOUR);
        tokio::time::sleep(Duration::from_millis(100)).await;
        for _ in 0..3 {
            w.wakes.send(Wake::Pool(PoolRef::in_default("a"))).expect("worker alive");
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
        w.stop().await;
        assert_eq!(fake.times("a"), [Duration::ZERO, Duration::from_secs(1)], "three wakes, one more pass");
        assert_eq!(fake.most_running.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn every_pool_gets_a_resync_within_a_tenth_of_the_interval() {
        let fake = Fake::new(&["a", "b"], Duration::ZERO, &[]);
        let w = start(&fake, 4, Duration::from_secs(100));
        tokio::time::sleep(Duration::from_secs(150)).await;
        w.stop().await;
        for pool in ["a", "b"] {
            let t = fake.times(pool);
            assert_eq!(t.len(), 2, "{pool}: the first look and one resync: {t:?}");
            assert!(t[1] >= Duration::from_secs(90) && t[1] <= Duration::from_secs(110), "{pool}: {t:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_pool_that_is_gone_is_forgotten() {
        let fake = Fake::new(&["a"], Duration::ZERO, &[("a", vec![Some(Outcome::Gone)])]);
        let w = start(&fake, 4, Duration::from_secs(10));
        tokio::time::sleep(Duration::from_secs(60)).await;
        w.stop().await;
        assert_eq!(fake.times("a"), [Duration::ZERO], "no resync of a pool that is gone");
    }
}
