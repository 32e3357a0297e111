//! The lease keeper: one task per replica (PostgreSQL only) that keeps the
//! replica's share of the pools leased to it.
//!
//! Each round, every third of the lease duration (sooner when a lease it
//! wants expires sooner):
//! 1. renewal, one transaction: the replica's own row, whose lease every
//!    pool lease it holds shares (one row written, whatever the pools; see
//!    [`db::leases`]), and its upgrade jobs' leases. A replica that finds
//!    its row expired has lost every pool: it joins again, with a new
//!    incarnation, and takes its share anew;
//! 2. the rows of replicas that expired are buried, which frees their
//!    pools;
//! 3. the replicas alive and the pools: each pool's share is its
//!    rendezvous owner among the replicas alive; the pools are kept in
//!    memory, from the pools written since the last round (`Spread`),
//!    not read in full each round;
//! 4. leases of this replica's share that nobody holds are taken (each
//!    gained pool is woken for a pass); a dead replica's pools are free
//!    once its row is buried, and the round is timed to that moment;
//! 5. leases that are now another replica's share are handed over, at most
//!    [`HANDOVER_SHARE`] of them per round and only while no pass of the
//!    pool is in flight, so a replica that joins takes its share over a few
//!    rounds instead of every pool moving at once.
//!
//! A round that fails (the store unreachable) is retried; meanwhile the
//! replica's row runs out on its own and every fence fails with it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::lease::{Held, Key, Kind, Leases};
use super::owner;
use crate::db::pool_cache::Written;
use crate::db::{self, Db};
use crate::domain::object::PoolRef;
use crate::runtime::Wake;

/// The largest share of its leases a replica hands over in one round (at
/// least [`HANDOVER_MIN`]).
const HANDOVER_SHARE: f64 = 0.25;
const HANDOVER_MIN: usize = 32;
/// How long a stopping replica waits for its passes in flight before it
/// gives its leases up anyway.
const LEAVE_WAIT: Duration = Duration::from_secs(5);

/// What one round did, for the log and the tests.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Round {
    pub alive: usize,
    pub held: usize,
    pub gained: usize,
    pub lost: usize,
    pub handed_over: usize,
}

/// Kept from round to round: the pools that exist and this replica's
/// share of them, kept current from the pools written (the cache's
/// journal, fed by this replica's commits and the other replicas' row
/// notices), so that a round reads only the pools written since the last
/// one, never the whole fleet. Every pool is read again only when writes
/// may have gone unheard (the first round, a listener that reconnected, a
/// round that failed) and every [`RESYNC`], as a safety net.
#[derive(Default)]
struct Spread {
    alive: Vec<String>,
    pools: HashSet<PoolRef>,
    /// The pools whose rendezvous owner is this replica.
    share: HashSet<PoolRef>,
    rounds: u64,
    /// When every pool was last read; `None`: read them at the next round.
    read_all_at: Option<Instant>,
}

/// How often every pool is read again although the journal says what
/// changed: a safety net against a notice lost without a reconnect, not
/// the way changes are noticed. Costs one scan of the pools' keys.
const RESYNC: Duration = Duration::from_secs(300);
/// More pools written than this in one round: reading them all is as
/// cheap as looking each up.
const LOOKUP_AT_MOST: usize = 10_000;

/// Every this many rounds the renewal reads every pool lease this replica
/// holds in the store, to give up strays (a hand-over whose release did
/// not reach the store) and notice any it lost.
const LIST_EVERY: u64 = 16;

pub async fn run(leases: Arc<Leases>, db: Db, wakes: mpsc::UnboundedSender<Wake>, cancel: CancellationToken) {
    let Some(store) = db.shared_store().cloned() else { return };
    db.pool_cache().journal_writes();
    let tick = leases.duration / 3;
    let mut failing = false;
    let mut spread = Spread::default();
    let mut incarnation = None;
    loop {
        let next = match round(&leases, &db, &store, &wakes, &mut spread, &mut incarnation).await {
            Ok((r, next)) => {
                if failing || r.gained + r.lost + r.handed_over > 0 {
                    tracing::info!(replica = %leases.me, alive = r.alive, held = r.held, gained = r.gained,
                        lost = r.lost, handed_over = r.handed_over, "leases");
                }
                failing = false;
                next.map_or(tick, |n| n.min(tick))
            }
            Err(e) => {
                // The pools written that this round took from the journal
                // may not have been applied: read them all next time.
                spread.read_all_at = None;
                if !failing {
                    tracing::warn!(replica = %leases.me, error = %e,
                        "renewing the leases failed; this replica stops acting on its pools when they run out");
                }
                failing = true;
                tick / 3
            }
        };
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep(next) => {}
        }
    }
    leave(&leases, &store).await;
}

/// One round; answers when the next should come, if sooner than a tick:
/// renew what this replica holds, bury the replicas that expired, follow
/// the pools and this replica's share, hand over what is no longer its
/// share, take what is.
async fn round(
    leases: &Leases,
    db: &Db,
    store: &sqlx::PgPool,
    wakes: &mpsc::UnboundedSender<Wake>,
    spread: &mut Spread,
    incarnation: &mut Option<i64>,
) -> sqlx::Result<(Round, Option<Duration>)> {
    spread.rounds += 1;
    let renewed = renew(leases, store, incarnation, spread.rounds.is_multiple_of(LIST_EVERY)).await?;
    let mut r = Round { alive: renewed.alive.len(), lost: renewed.lost, ..Round::default() };
    db::leases::bury(store, leases.duration).await?;
    if rand::random::<u8>() == 0 {
        // Now and then (every ~256 rounds of each replica) is plenty.
        db::leases::forget_deleted(store).await?;
    }
    spread.follow(db, store, &renewed.alive, &leases.me).await?;
    let (wanted, leaving) = hand_over(leases, &spread.share);
    if !leaving.is_empty() {
        r.handed_over = db::leases::release(store, &leases.me, &leaving).await? as usize;
    }
    let (gained, held, next_expiry) = take(leases, store, &renewed, wakes, &wanted).await?;
    (r.gained, r.held) = (gained, held);
    // A lease another holds, or another replica's life, that ends before
    // the next tick: look again just after, to take over at once if its
    // holder is gone.
    let next_death = renewed.next_death.map(|s| Duration::from_secs_f64(s.max(0.0)));
    let next = [next_expiry, next_death].into_iter().flatten().min();
    Ok((r, next.map(|d| d + Duration::from_millis(50))))
}

/// What a renewal left: the replicas alive, this replica's incarnation,
/// how many leases were lost, and when the first other replica dies
/// unless it renews (seconds).
struct Renewed {
    alive: Vec<String>,
    incarnation: i64,
    /// Until when this replica may act on what it holds: a little before
    /// its row expires (leases taken this round included, since they last
    /// as long as the row).
    valid_until: Instant,
    lost: usize,
    next_death: Option<f64>,
}

/// Renews this replica's row (joining first, with a new incarnation, when
/// it has none yet or its row had expired: then every pool lease held is
/// lost) and its jobs' leases; every [`LIST_EVERY`] rounds (`list`) reads
/// the pool leases it holds in the store, drops those it no longer holds
/// and gives up those held in the store but not here.
async fn renew(
    leases: &Leases,
    store: &sqlx::PgPool,
    incarnation: &mut Option<i64>,
    list: bool,
) -> sqlx::Result<Renewed> {
    let (jobs, pool_count, pool_tokens) = {
        let held = leases.lock();
        let jobs: Vec<i64> = held
            .keys()
            .filter_map(|k| match k {
                Key::Job(id) => Some(*id),
                Key::Pool(_) => None,
            })
            .collect();
        let pools = held.iter().filter(|(k, _)| k.kind() == Kind::Pool);
        let (count, tokens) = pools.fold((0i64, 0i64), |(n, t), (_, h)| (n + 1, t.wrapping_add(h.token)));
        (jobs, count, tokens)
    };
    let mut lost = 0;
    let (sent, renewal, alive, inc) = loop {
        let (inc, joined) = match *incarnation {
            Some(inc) => (inc, false),
            None => {
                let inc = db::leases::join(store, &leases.me, leases.duration).await?;
                *incarnation = Some(inc);
                (inc, true)
            }
        };
        let sent = Instant::now();
        let (mut renewal, mut alive) = db::leases::renew(store, &leases.me, inc, leases.duration, &jobs, list).await?;
        // The pool leases held in the store are the ones held here, unless
        // their count or tokens differ (one lost, or one held in the store
        // only): then they are read in full.
        if renewal.alive
            && renewal.pools.is_none()
            && (renewal.pool_count, renewal.pool_tokens) != (pool_count, pool_tokens)
        {
            (renewal, alive) = db::leases::renew(store, &leases.me, inc, leases.duration, &jobs, true).await?;
        }
        if renewal.alive {
            break (sent, renewal, alive, inc);
        }
        if joined {
            // Expired between joining and renewing: the store is too slow
            // for the lease; the round fails and is tried again.
            *incarnation = None;
            return Err(sqlx::Error::Protocol(format!(
                "this replica's row expired as soon as it joined (lease {:?}): the store answers too slowly",
                leases.duration
            )));
        }
        // This replica's row expired (it was paused, or cut off from the
        // store, past its lease): others may drive its pools already.
        let mut held = leases.lock();
        let before = held.len();
        held.retain(|key, _| key.kind() == Kind::Job);
        lost += before - held.len();
        tracing::warn!(replica = %leases.me, incarnation = inc, lost = before - held.len(),
            "this replica's lease expired: every pool it drove is lost; joining again");
        *incarnation = None;
    };
    let valid_until = sent + leases.act_for();
    let next_death = alive.iter().filter(|a| *a.id != *leases.me).map(|a| a.remaining).reduce(f64::min);
    let alive: Vec<String> = alive.into_iter().map(|a| a.id).collect();
    let pools: Option<HashMap<Key, i64>> =
        renewal.pools.map(|pools| pools.into_iter().map(|h| (h.key, h.token)).collect());
    let jobs: HashMap<Key, i64> = renewal.jobs.into_iter().map(|h| (h.key, h.token)).collect();
    let stray: Vec<PoolRef> = {
        let mut held = leases.lock();
        held.retain(|key, h| {
            let renewed = match (key.kind(), &pools) {
                (Kind::Pool, None) => Some(h.token),
                (Kind::Pool, Some(pools)) => pools.get(key).copied(),
                (Kind::Job, _) => jobs.get(key).copied(),
            };
            if renewed == Some(h.token) {
                h.valid_until = valid_until;
                return true;
            }
            lost += 1;
            tracing::warn!(lease = %key, "lease lost: another replica drives it now");
            false
        });
        // Pools held in the store but not here (a hand-over whose release
        // did not reach the store): given up now, or nobody could take
        // them. (Only the jobs held here were renewed.)
        pools
            .iter()
            .flatten()
            .filter(|(key, _)| !held.contains_key(key))
            .filter_map(|(key, _)| match key {
                Key::Pool(pool) => Some(pool.clone()),
                Key::Job(_) => None,
            })
            .collect()
    };
    if !stray.is_empty() {
        db::leases::release(store, &leases.me, &stray).await?;
    }
    Ok(Renewed { alive, incarnation: inc, valid_until, lost, next_death })
}

/// The pools of `share` not held yet, and the idle ones held outside it,
/// a bounded number a round, given up here (the caller releases them in
/// the store). Jobs are not spread: the replica that claimed one keeps it.
fn hand_over(leases: &Leases, share: &HashSet<PoolRef>) -> (Vec<PoolRef>, Vec<PoolRef>) {
    let mut held = leases.lock();
    let wanted: Vec<PoolRef> = share.iter().filter(|p| !held.contains_key(&Key::pool(p))).cloned().collect();
    let pools = held.keys().filter(|k| k.kind() == Kind::Pool).count();
    let cap = ((pools as f64 * HANDOVER_SHARE) as usize).max(HANDOVER_MIN);
    let mut leaving = Vec::new();
    for (key, h) in held.iter_mut() {
        let Key::Pool(pool) = key else { continue };
        if share.contains(pool) {
            h.leaving = false;
            continue;
        }
        h.leaving = true;
        // Idle: no fence of it is in use, so no pass is in flight.
        if Arc::strong_count(&h.in_use) == 1 && leaving.len() < cap {
            leaving.push(pool.clone());
        }
    }
    for pool in &leaving {
        held.remove(&Key::pool(pool));
    }
    (wanted, leaving)
}

/// Takes the leases of `wanted` that nobody holds, and wakes their pools:
/// how many were taken, how many pools are held now, and when the first
/// lease another holds expires.
async fn take(
    leases: &Leases,
    store: &sqlx::PgPool,
    renewed: &Renewed,
    wakes: &mpsc::UnboundedSender<Wake>,
    wanted: &[PoolRef],
) -> sqlx::Result<(usize, usize, Option<Duration>)> {
    let (taken, next_expiry) =
        db::leases::acquire(store, &leases.me, renewed.incarnation, wanted, leases.duration).await?;
    // A pool lease lasts as long as this replica's row: the renewal's
    // deadline, not one counted from now.
    let valid_until = renewed.valid_until;
    let gained = taken.len();
    let held = {
        let mut held = leases.lock();
        for t in &taken {
            held.insert(t.key.clone(), Held::new(t.token, valid_until));
        }
        held.keys().filter(|k| k.kind() == Kind::Pool).count()
    };
    for t in taken {
        if let Key::Pool(pool) = t.key {
            let _ = wakes.send(Wake::Pool(pool));
        }
    }
    Ok((gained, held, next_expiry))
}

impl Spread {
    /// Brings the pools and this replica's share up to date with the pools
    /// written since the last round and the replicas `alive` now.
    async fn follow(&mut self, db: &Db, store: &sqlx::PgPool, alive: &[String], me: &str) -> sqlx::Result<()> {
        let written = db.pool_cache().take_written();
        let due = self.read_all_at.is_none_or(|at| at.elapsed() >= RESYNC);
        let written = match written {
            Written::Pools(written) if !due && written.len() <= LOOKUP_AT_MOST => written,
            _ => {
                let started = Instant::now();
                self.pools = db::leases::pools(store).await?.into_iter().collect();
                self.read_all_at = Some(started);
                self.alive.clear();
                Vec::new()
            }
        };
        if !written.is_empty() {
            let existing: HashSet<PoolRef> = db::leases::existing(store, &written).await?.into_iter().collect();
            for pool in written {
                if existing.contains(&pool) {
                    self.pools.insert(pool);
                } else {
                    self.pools.remove(&pool);
                    self.share.remove(&pool);
                }
            }
            // Spread below, with the others, when the replicas changed.
            if self.alive == alive {
                for pool in &existing {
                    if owner(alive, pool) == Some(me) {
                        self.share.insert(pool.clone());
                    } else {
                        self.share.remove(pool);
                    }
                }
            }
        }
        if self.alive != alive {
            self.share = self.pools.iter().filter(|p| owner(alive, p) == Some(me)).cloned().collect();
            self.alive = alive.to_vec();
        }
        Ok(())
    }
}

/// Stopping: waits (briefly) for passes in flight, then gives every lease
/// up and leaves the replicas alive, so the others take over at once.
async fn leave(leases: &Leases, store: &sqlx::PgPool) {
    let deadline = Instant::now() + LEAVE_WAIT;
    {
        let mut held = leases.lock();
        held.values_mut().for_each(|h| h.leaving = true);
    }
    while Instant::now() < deadline && leases.lock().values().any(|h| Arc::strong_count(&h.in_use) > 1) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    leases.lock().clear();
    match db::leases::leave(store, &leases.me).await {
        Ok(()) => tracing::info!(replica = %leases.me, "left: leases handed over"),
        Err(e) => tracing::warn!(replica = %leases.me, error = %e, "leaving failed; the leases run out on their own"),
    }
}
