//! Consistent reads from the cache of pools on PostgreSQL, where other
//! replicas write the same rows.
//!
//! A read must never be older than a write acknowledged before the read
//! began, whichever replica took the write. Every write of a pool sends a
//! change notice inside its transaction, and PostgreSQL delivers the
//! notices of different transactions in the order they committed. So, as
//! Kubernetes' watch cache does with etcd's revision (KEP-2340,
//! "consistent reads from cache"), a read asks the store for a point in
//! that order and waits until the listener has passed it:
//!
//! 1. the read takes a ticket for the next *barrier*: a notice carrying a
//!    sequence number, sent to this replica's own channel by one statement
//!    that starts after the read began;
//! 2. the listener ([`crate::replicas::listener`]) applies every notice in
//!    order (dropping cached pools written since) and, when it reaches the
//!    barrier, marks its number seen;
//! 3. once the barrier is seen, every write committed before it has been
//!    applied to the cache: the read is served from memory.
//!
//! One barrier serves every read that took a ticket before it was sent:
//! 64 concurrent reads cost one round trip, not 64. A read whose barrier
//! is not seen within [`CATCH_UP`], or that arrives while the listener is
//! down, reads the store directly and counts why.

use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::Notify;
use tokio::time::Instant;

/// How long a read waits for the listener to catch up before it reads
/// the store instead: a few round trips on a healthy store, short enough
/// that a stalled listener costs a read little more than the store itself.
pub const CATCH_UP: Duration = Duration::from_millis(500);

/// What the listener has applied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Seen {
    /// Whether the listener is connected and caught up with the cache
    /// cleared: reads may use the cache.
    connected: bool,
    /// Bumped at each connection: barriers sent on an earlier one are lost.
    connection: u64,
    /// The highest barrier received.
    barrier: u64,
}

/// Why a read went to the store rather than the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stale {
    /// The listener is not connected: notices may be missed.
    ListenerDown,
    /// The barrier was not seen within [`CATCH_UP`].
    Slow,
}

#[derive(Default)]
struct Tickets {
    /// The number the next barrier will carry.
    next: u64,
    /// A read holds a ticket for `next`: it must be sent.
    wanted: bool,
}

/// Reads waiting for barrier `n` sleep on `slots[n % SLOTS]`: a barrier
/// heard wakes the reads it serves, not those waiting for the next ones
/// (several barriers are on their way at once; waking every read at each
/// cost a fifth of the reads per second on two cores).
const SLOTS: usize = 8;

/// How many times a barrier sender lets the runtime run other tasks before
/// it issues a barrier (each a few microseconds when nothing else runs).
/// Measured at 64 connections: none 5.5 reads a barrier and 35k reads/s,
/// 2 yields 13.6 and 42k, 4 yields 24 and 45k, 8 yields 37 and 46k
/// (SQLite: 63k on the same machine).
const GATHER_YIELDS: usize = 8;

/// The barriers of one replica, shared by its reads, the task that sends
/// barriers and the listener.
pub struct Freshness {
    tickets: Mutex<Tickets>,
    /// The oldest barrier sent and not yet heard, and when it was sent:
    /// how the listener finds out that its connection died silently.
    unheard: Mutex<Option<(u64, Instant)>>,
    /// Wakes the sender when a read wants a barrier.
    wanted: Notify,
    /// What the listener has applied; reads wait on [`Self::slots`].
    seen: Mutex<Seen>,
    /// Where reads wait for their barrier (see [`SLOTS`]).
    slots: [Notify; SLOTS],
    pub stats: ReadStats,
}

impl Default for Freshness {
    fn default() -> Self {
        Self {
            tickets: Mutex::new(Tickets { next: 1, wanted: false }),
            unheard: Mutex::new(None),
            wanted: Notify::new(),
            seen: Mutex::new(Seen::default()),
            slots: std::array::from_fn(|_| Notify::new()),
            stats: ReadStats::default(),
        }
    }
}

/// Where a pool read was answered from: the `source` label of
/// `drover_pool_reads_total`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum ReadSource {
    /// The cache: current as of a barrier after the read began (requests),
    /// or as of the notices heard (passes, [`Freshness::heard`]).
    Cache,
    /// The store: the pool was not cached.
    Store,
    /// The store: the change listener is down.
    StoreListenerDown,
    /// The store: the barrier took too long.
    StoreSlow,
}

impl ReadSource {
    const ALL: [ReadSource; 4] = [Self::Cache, Self::Store, Self::StoreListenerDown, Self::StoreSlow];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cache => "cache",
            Self::Store => "store",
            Self::StoreListenerDown => "store_listener_down",
            Self::StoreSlow => "store_slow",
        }
    }
}

impl EncodeLabelValue for ReadSource {
    fn encode(&self, encoder: &mut prometheus_client::encoding::LabelValueEncoder) -> std::fmt::Result {
        std::fmt::Write::write_str(encoder, self.as_str())
    }
}

impl From<Stale> for ReadSource {
    fn from(why: Stale) -> Self {
        match why {
            Stale::ListenerDown => Self::StoreListenerDown,
            Stale::Slow => Self::StoreSlow,
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabels {
    source: ReadSource,
}

/// Counted for `/metrics`.
pub struct ReadStats {
    /// Pool reads by where they were answered from: `cache`, `store`
    /// (a miss), `store_listener_down`, `store_slow`.
    pub reads: Family<SourceLabels, Counter>,
    /// The counters of `reads`, one per source (in [`ReadSource::ALL`]'s
    /// order), looked up once.
    by_source: [Counter; 4],
    /// 1 while the change listener is connected.
    pub listener_connected: Gauge,
    /// Connections of the listener made since start (the first included).
    pub listener_connections: Counter,
    /// Barriers sent: each serves every read that wanted it.
    pub barriers: Counter,
}

impl Default for ReadStats {
    fn default() -> Self {
        let reads: Family<SourceLabels, Counter> = Family::default();
        let by_source = ReadSource::ALL.map(|source| reads.get_or_create(&SourceLabels { source }).clone());
        Self {
            reads,
            by_source,
            listener_connected: Gauge::default(),
            listener_connections: Counter::default(),
            barriers: Counter::default(),
        }
    }
}

impl ReadStats {
    pub fn read(&self, source: ReadSource) {
        self.by_source[source as usize].inc();
    }

    /// Registers these in a replica's metrics.
    pub fn register(&self, r: &mut prometheus_client::registry::Registry) {
        r.register(
            "drover_pool_reads",
            "Pool reads by where they were answered: cache, store (not cached), store_listener_down, store_slow",
            self.reads.clone(),
        );
        r.register(
            "drover_change_listener_connected",
            "1 while this replica listens for other replicas' changes (else reads go to the store)",
            self.listener_connected.clone(),
        );
        r.register(
            "drover_read_barriers",
            "Read barriers sent (each serves every read waiting for it)",
            self.barriers.clone(),
        );
        r.register(
            "drover_change_listener_connections",
            "Connections the change listener made (the first included)",
            self.listener_connections.clone(),
        );
    }
}

impl Freshness {
    fn lock(&self) -> std::sync::MutexGuard<'_, Tickets> {
        self.tickets.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn seen(&self) -> Seen {
        *self.seen_mut()
    }

    fn seen_mut(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until the cache holds every write committed before this call,
    /// or says why it cannot be trusted for this read.
    pub async fn catch_up(&self) -> Result<(), Stale> {
        let at = self.seen();
        if !at.connected {
            return Err(Stale::ListenerDown);
        }
        let ticket = {
            let mut t = self.lock();
            t.wanted = true;
            t.next
        };
        self.wanted.notify_one();
        let slot = &self.slots[slot(ticket)];
        let reached = async {
            loop {
                // Listening before looking, so that no wake-up falls between.
                let woken = slot.notified();
                tokio::pin!(woken);
                woken.as_mut().enable();
                let s = self.seen();
                if !s.connected || s.connection != at.connection || s.barrier >= ticket {
                    return s;
                }
                woken.await;
            }
        };
        match tokio::time::timeout(CATCH_UP, reached).await {
            Ok(s) if s.connected && s.connection == at.connection => Ok(()),
            Ok(_) => Err(Stale::ListenerDown),
            Err(_) => Err(Stale::Slow),
        }
    }

    /// Wakes the reads waiting for barriers `from..=to`.
    fn wake(&self, from: u64, to: u64) {
        if to.saturating_sub(from) >= SLOTS as u64 {
            self.slots.iter().for_each(Notify::notify_waiters);
        } else {
            (from..=to).for_each(|n| self.slots[slot(n)].notify_waiters());
        }
    }

    /// Wakes every read: the listener's state changed.
    fn wake_all(&self) {
        self.slots.iter().for_each(Notify::notify_waiters);
    }

    fn unheard(&self) -> std::sync::MutexGuard<'_, Option<(u64, Instant)>> {
        self.unheard.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a barrier sent over `limit` ago is still unheard.
    pub fn overdue(&self, limit: Duration) -> bool {
        self.unheard().is_some_and(|(_, sent)| sent.elapsed() > limit)
    }

    /// The listener is connected, its cache cleared: reads may use it.
    pub fn connected(&self) {
        *self.unheard() = None;
        {
            let mut s = self.seen_mut();
            s.connected = true;
            s.connection += 1;
        }
        self.wake_all();
        self.stats.listener_connected.set(1);
        self.stats.listener_connections.inc();
    }

    /// The listener lost its connection: reads go to the store until it
    /// is back.
    pub fn disconnected(&self) {
        self.seen_mut().connected = false;
        self.wake_all();
        self.stats.listener_connected.set(0);
    }

    /// The listener received barrier `n` (this replica's).
    pub fn barrier_seen(&self, n: u64) {
        {
            let mut unheard = self.unheard();
            if unheard.is_some_and(|(oldest, _)| n >= oldest) {
                *unheard = None;
            }
        }
        let before = {
            let mut s = self.seen_mut();
            let before = s.barrier;
            s.barrier = before.max(n);
            before
        };
        if n > before {
            self.wake(before + 1, n);
        }
    }

    /// Whether reads may use the cache now.
    pub fn is_connected(&self) -> bool {
        self.seen().connected
    }

    /// For the reconcile passes: whether the cache holds every notice heard
    /// so far, without a barrier. A pass needs no more: its own writes
    /// dropped their pools from the cache as they committed, and another
    /// replica's write not heard yet wakes a pass of its own once it is
    /// (the listener drops the pool, then wakes its driver), so a pass
    /// that read the pool a moment too early is followed by one that reads
    /// it again. A barrier per periodic pass was a commit and a wake-up of
    /// every listener, per pool, every resync interval.
    pub fn heard(&self) -> Result<(), Stale> {
        if self.is_connected() { Ok(()) } else { Err(Stale::ListenerDown) }
    }

    /// How many barriers were issued so far.
    pub fn barriers_issued(&self) -> u64 {
        self.stats.barriers.get()
    }

    /// Sends a barrier unless one is on its way, without waiting for it:
    /// the listener's proof of life when no read asked for one for a while
    /// (a barrier unheard for too long is how a silently dead connection
    /// is found).
    pub fn probe(&self) {
        if self.unheard().is_some() {
            return;
        }
        self.lock().wanted = true;
        self.wanted.notify_one();
    }

    /// Waits until a read wants a barrier; then the number to send. Reads
    /// that arrive while it is on its way take the next number: a barrier
    /// serves every read that arrived since the last one was issued.
    pub async fn wanted(&self) -> u64 {
        loop {
            self.wanted.notified().await;
            // Reads already woken on this runtime take their tickets first,
            // so that one barrier serves them too: fewer barriers, each a
            // commit on the store, for the same reads.
            for _ in 0..GATHER_YIELDS {
                tokio::task::yield_now().await;
            }
            let mut t = self.lock();
            if !t.wanted {
                continue;
            }
            t.wanted = false;
            t.next += 1;
            let n = t.next - 1;
            drop(t);
            self.unheard().get_or_insert((n, Instant::now()));
            self.stats.barriers.inc();
            return n;
        }
    }
}

fn slot(barrier: u64) -> usize {
    (barrier % SLOTS as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use tokio_util::sync::CancellationToken;

    /// A listener that hears every barrier at once, counting them.
    fn echoing(f: &Arc<Freshness>, sent: &Arc<AtomicU64>) -> CancellationToken {
        let cancel = CancellationToken::new();
        let (f, sent, stop) = (f.clone(), sent.clone(), cancel.clone());
        tokio::spawn(async move {
            loop {
                let n = tokio::select! {
                    () = stop.cancelled() => return,
                    n = f.wanted() => n,
                };
                sent.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
                f.barrier_seen(n);
            }
        });
        cancel
    }

    #[tokio::test]
    async fn sixty_four_concurrent_reads_share_a_couple_of_barriers() {
        let f = Arc::new(Freshness::default());
        f.connected();
        let sent = Arc::new(AtomicU64::new(0));
        let stop = echoing(&f, &sent);
        let reads: Vec<_> = (0..64)
            .map(|_| {
                let f = f.clone();
                tokio::spawn(async move { f.catch_up().await })
            })
            .collect();
        for r in reads {
            assert_eq!(r.await.unwrap(), Ok(()));
        }
        let n = sent.load(Ordering::SeqCst);
        assert!((1..=2).contains(&n), "64 reads arriving together cost {n} barriers");
        stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_never_rides_on_a_barrier_sent_before_it_began() {
        let f = Arc::new(Freshness::default());
        f.connected();
        // Barrier 1 is sent but not yet heard when the read begins: the
        // read needs barrier 2.
        f.lock().next = 2;
        f.barrier_seen(1);
        let read = {
            let f = f.clone();
            tokio::spawn(async move { f.catch_up().await })
        };
        // Paused time: 20 ms pass as soon as nothing else can run.
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!read.is_finished(), "barrier 1 does not cover a read that began after it was sent");
        f.barrier_seen(2);
        assert_eq!(read.await.unwrap(), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_barrier_heard_serves_every_read_with_a_lower_ticket_whatever_their_slots() {
        let f = Arc::new(Freshness::default());
        f.connected();
        let mut reads = Vec::new();
        // Reads holding tickets 1 to 12, over every slot and some twice.
        for next in 1..=12 {
            f.lock().next = next;
            let f = f.clone();
            reads.push(tokio::spawn(async move { f.catch_up().await }));
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(reads.iter().all(|r| !r.is_finished()), "no barrier heard yet");
        f.barrier_seen(3);
        f.barrier_seen(12);
        for r in reads {
            assert_eq!(r.await.unwrap(), Ok(()));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_listener_or_an_answer_a_read_goes_to_the_store() {
        let f = Arc::new(Freshness::default());
        assert_eq!(f.catch_up().await, Err(Stale::ListenerDown), "never connected");
        f.connected();
        assert_eq!(f.catch_up().await, Err(Stale::Slow), "no barrier ever heard");
        let waiting = {
            let f = f.clone();
            tokio::spawn(async move { f.catch_up().await })
        };
        tokio::task::yield_now().await;
        f.disconnected();
        assert_eq!(waiting.await.unwrap(), Err(Stale::ListenerDown), "a lost listener ends the wait at once");
        f.connected();
        let read = {
            let f = f.clone();
            tokio::spawn(async move { f.catch_up().await })
        };
        tokio::task::yield_now().await;
        // Nothing sends barriers here: the read's is still the next one.
        let ticket = f.lock().next;
        f.barrier_seen(ticket);
        assert_eq!(read.await.unwrap(), Ok(()), "connected again, a barrier heard serves the read");
    }

    #[tokio::test(start_paused = true)]
    async fn a_pass_reads_the_cache_as_heard_while_connected_and_a_probe_sends_one_barrier() {
        let f = Arc::new(Freshness::default());
        assert_eq!(f.heard(), Err(Stale::ListenerDown), "never connected");
        f.connected();
        assert_eq!(f.heard(), Ok(()), "no barrier needed");
        assert_eq!(f.barriers_issued(), 0, "and none was asked for");
        let sent = Arc::new(AtomicU64::new(0));
        let stop = echoing(&f, &sent);
        f.probe();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!((sent.load(Ordering::SeqCst), f.barriers_issued()), (1, 1), "a probe sends one barrier");
        assert!(!f.overdue(Duration::ZERO), "and it was heard");
        f.disconnected();
        assert_eq!(f.heard(), Err(Stale::ListenerDown), "a lost listener sends passes to the store");
        stop.cancel();
    }
}
