//! Change notices between replicas, through PostgreSQL's LISTEN/NOTIFY
//! (what they say: [`crate::db::notify`]).
//!
//! The listener has a connection of its own, never one the lease keeper
//! or a request needs. What it hears it applies in order:
//! - a row notice from another replica drops the pool from this
//!   replica's cache (unless the cache holds that version already), then
//!   wakes the pool's event streams and its driver (whose pass links to
//!   the span that wrote the row, when the notice names one);
//! - a hint wakes the streams and the driver (a pass of a pool this
//!   replica does not drive ends at once);
//! - this replica's own barriers mark how far the cache has caught up,
//!   for consistent reads ([`crate::db::freshness`]).
//!
//! What [`Changes`] publishes here goes out as hints, batched.
//!
//! Any failure (the first listen included) drops the connection: reads
//! go to the store meanwhile, and the listener connects again after a
//! backoff. Notices sent while it was away are lost, so once it listens
//! again it clears the cache, wakes every pool (a pass of a pool held
//! elsewhere ends at once) and every event stream.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgListener, PgPool};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::db::Db;
use crate::db::freshness::Freshness;
use crate::db::notify::{self, CHANNEL, Notice};
use crate::events::changes::{Changes, Subject};
use crate::runtime::Wake;

/// Hints sent in one statement, at most.
const BATCH: usize = 512;
/// The wait before connecting again, by `domain::backoff` (the one formula
/// of every retry): from this, doubled at each failure, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// A barrier sent this long ago and still unheard means the connection
/// is dead without saying so (a network that drops packets): connect again.
const SILENT_DEATH: Duration = Duration::from_secs(3);

/// What the listener works with.
pub struct Listener {
    pub me: Arc<str>,
    pub db: Db,
    pub changes: Changes,
    pub wakes: mpsc::UnboundedSender<Wake>,
}

/// Runs the listener and sends this replica's hints until `cancel`.
pub async fn run(l: Listener, mut outgoing: mpsc::UnboundedReceiver<Subject>, cancel: CancellationToken) {
    let (Some(store), Some(fresh)) = (l.db.shared_store().cloned(), l.db.freshness().cloned()) else { return };
    // Failed tries since the listener last worked: the wait before the next.
    let mut failures = 0u32;
    let mut batch = Vec::new();
    loop {
        let Some(pool) = l.db.listener_pool() else { return };
        let listening = tokio::select! {
            () = cancel.cancelled() => return,
            listening = listen(&pool, &l.me) => listening,
        };
        match listening {
            Ok(listener) => {
                failures = 0;
                // Notices sent before the LISTEN were lost: nothing cached
                // may be trusted, and every pool may have changed.
                l.db.pool_cache().invalidate_all();
                fresh.connected();
                tracing::info!(replica = %l.me, "listening for other replicas' changes");
                let _ = l.wakes.send(Wake::All);
                l.changes.heard_everything();
                let ended = serve(&l, &fresh, listener, &store, &mut outgoing, &mut batch, &cancel).await;
                fresh.disconnected();
                match ended {
                    Ended::Cancelled | Ended::NoMoreHints => {
                        pool.close().await;
                        return;
                    }
                    Ended::Lost(why) => {
                        tracing::warn!(replica = %l.me, error = %why,
                            "the change listener lost its connection; reading the store until it is back");
                    }
                }
            }
            Err(e) => {
                tracing::warn!(replica = %l.me, error = %e, failures = failures + 1,
                    "listening for other replicas' changes failed; reading the store until it works");
            }
        }
        pool.close().await;
        failures = failures.saturating_add(1);
        let wait = crate::domain::backoff::jittered(FIRST_BACKOFF, failures, MAX_BACKOFF);
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// A listener on the change channel and on this replica's barriers.
async fn listen(pool: &PgPool, me: &str) -> sqlx::Result<PgListener> {
    let mut listener = PgListener::connect_with(pool).await?;
    // A lost connection is this module's to handle (the cache must be
    // cleared before reads trust it again), not sqlx's to hide.
    listener.eager_reconnect(false);
    listener.ignore_pool_close_event(true);
    listener.listen_all([CHANNEL, notify::barrier_channel(me).as_str()]).await?;
    Ok(listener)
}

enum Ended {
    Cancelled,
    /// Every sender of hints is gone: the app is stopping.
    NoMoreHints,
    Lost(sqlx::Error),
}

async fn serve(
    l: &Listener,
    fresh: &Arc<Freshness>,
    mut listener: PgListener,
    store: &PgPool,
    outgoing: &mut mpsc::UnboundedReceiver<Subject>,
    batch: &mut Vec<Subject>,
    cancel: &CancellationToken,
) -> Ended {
    let barriers = notify::barrier_channel(&l.me);
    let mut watchdog = tokio::time::interval(SILENT_DEATH);
    watchdog.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut issued = fresh.barriers_issued();
    loop {
        tokio::select! {
            () = cancel.cancelled() => return Ended::Cancelled,
            n = outgoing.recv_many(batch, BATCH) => {
                if n == 0 {
                    return Ended::NoMoreHints;
                }
                send_hints(store, &l.me, batch).await;
            }
            _ = watchdog.tick() => {
                if fresh.overdue(SILENT_DEATH) {
                    return Ended::Lost(sqlx::Error::Protocol(format!(
                        "a read barrier went unanswered for {SILENT_DEATH:?}"
                    )));
                }
                // Passes read without barriers: when no request asked for
                // one since the last tick, this one keeps the check above
                // meaningful.
                let now = fresh.barriers_issued();
                if now == issued {
                    fresh.probe();
                }
                issued = now;
            }
            heard = listener.try_recv() => match heard {
                Ok(Some(n)) if n.channel() == barriers => {
                    if let Ok(seq) = n.payload().parse() {
                        fresh.barrier_seen(seq);
                    }
                }
                Ok(Some(n)) => apply(l, n.payload()),
                Ok(None) => return Ended::Lost(sqlx::Error::Protocol("the connection was closed".into())),
                Err(e) => return Ended::Lost(e),
            },
        }
    }
}

/// One notice from the change channel.
fn apply(l: &Listener, payload: &str) {
    let Some((origin, notice)) = notify::parse(payload) else { return };
    // This replica's own writes invalidated its cache as they committed,
    // and woke its own streams and passes.
    if origin == &*l.me {
        return;
    }
    let (pool, by) = match notice {
        Notice::Row { pool, version, by } => {
            l.db.pool_cache().invalidate_older(&pool, version.unwrap_or(i64::MAX));
            (pool, by)
        }
        Notice::Pool(pool) => (pool, None),
        Notice::Job(id) => {
            l.changes.heard(&Subject::Job(id));
            return;
        }
    };
    l.changes.heard(&Subject::Pool(pool.clone()));
    // The pass (here, if this replica drives the pool) links to the work
    // on the other replica that wrote the row: one story in the traces.
    let wake = match by {
        Some(by) => Wake::Traced { pool, by },
        None => Wake::Pool(pool),
    };
    let _ = l.wakes.send(wake);
}

async fn send_hints(store: &PgPool, me: &str, batch: &mut Vec<Subject>) {
    let unique: HashSet<Subject> = batch.drain(..).collect();
    let payloads: Vec<String> = unique
        .into_iter()
        .filter_map(|s| match s {
            Subject::Pool(pool) => Some(notify::format(me, &Notice::Pool(pool))),
            Subject::Job(id) => Some(notify::format(me, &Notice::Job(id))),
            Subject::Engine(_) => None,
        })
        .collect();
    if let Err(e) = notify::send_hints(store, &payloads).await {
        tracing::debug!(error = %e, notices = payloads.len(), "telling other replicas of changes failed");
    }
}

/// Sends this replica's read barriers (see [`crate::db::freshness`]) on a
/// connection of their own: no wait for a pooled connection, nor a check
/// of it, between a read and its barrier; and commits that do not wait for
/// the disk, since a barrier is worth nothing after a crash.
pub async fn send_barriers(db: Db, me: Arc<str>, cancel: CancellationToken) {
    let Some(fresh) = db.freshness().cloned() else { return };
    let channel = notify::barrier_channel(&me);
    let senders = (0..BARRIER_SENDERS).map(|_| send_on_one_connection(&db, &fresh, &channel, &cancel));
    futures_util::future::join_all(senders).await;
}

/// Barriers in flight at once, each on a connection of its own: while one
/// is on its way, reads that arrive take the next, which another connection
/// sends at once rather than after the first one's answer (measured: one
/// sender 33k reads/s, two 38k, three 40k, against 56k on SQLite; each
/// barrier costs the store a commit). A barrier heard covers every lower
/// number, since it was issued after all of them.
const BARRIER_SENDERS: usize = 3;

async fn send_on_one_connection(db: &Db, fresh: &Freshness, channel: &str, cancel: &CancellationToken) {
    let mut conn: Option<sqlx::PgConnection> = None;
    loop {
        let n = tokio::select! {
            () = cancel.cancelled() => break,
            n = fresh.wanted() => n,
        };
        if conn.is_none() {
            match db.barrier_connection().await {
                Some(Ok(c)) => conn = Some(c),
                Some(Err(e)) => tracing::debug!(error = %e, "connecting to send read barriers failed"),
                None => return,
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        if let Err(e) = notify::send_barrier(c, channel, n).await {
            // The reads waiting for it give up after CATCH_UP and read the
            // store; the next barrier connects again.
            tracing::debug!(error = %e, barrier = n, "sending a read barrier failed");
            conn = None;
        }
    }
    if let Some(c) = conn {
        let _ = sqlx::Connection::close(c).await;
    }
}
