//! Several drover replicas on one PostgreSQL store (docs/ha.md).
//!
//! Every replica serves the whole API; each pool is driven by exactly one
//! of them, the holder of the pool's lease in the store:
//!
//! - [`keeper`]: every third of `--lease-duration`, a replica stamps its
//!   heartbeat and renews its leases (one transaction, the database's
//!   clock), spreads the pools over the replicas alive by rendezvous
//!   hashing ([`owner`]), takes the leases of its share that nobody holds
//!   and hands over, a few at a time, those that are now another's share.
//! - [`Fence`]: what a pass, or an upgrade job's run, carries. Before each
//!   engine operation or Kubernetes call it checks locally that the lease
//!   is still held (a monotonic deadline a little short of the lease's
//!   expiry: a paused or cut-off replica stops on its own), and every
//!   write transaction first proves the lease, holder and token, in the
//!   store, locking the lease row until commit: a replica that lost the
//!   lease writes nothing more, whatever its clock.
//!
//! Upgrade jobs are leased the same way ([`Kind::Job`]), with the same
//! rows, clock, tokens, renewals and fences; only who takes them differs:
//! a job is claimed by whichever replica's runner finds it free
//! ([`Leases::claim_job`]), not spread by hashing.
//! - [`notices`]: "pool X changed" published to the other replicas
//!   (LISTEN/NOTIFY), for their event streams and for the pool's driver.
//!
//! With SQLite there is one process: no leases, and the fence is
//! [`Fence::Sole`].

pub mod keeper;
pub mod notices;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use crate::db::WriteTx;

/// This process's name among the replicas: its host, its pid and a random
/// part, so that a restarted process is a new replica (its predecessor's
/// leases are taken over, not silently continued).
pub fn replica_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty() && h.len() <= 64)
        .unwrap_or_else(|| "drover".to_owned());
    format!("{host}-{}-{:04x}", std::process::id(), rand::random::<u16>())
}

pub use crate::db::leases::{Key, Kind};

/// A lease this replica holds.
struct Held {
    token: i64,
    /// When this replica stops acting on the pool unless the lease is
    /// renewed meanwhile: a little before the lease expires in the store.
    valid_until: Instant,
    /// One clone per fence in use: the lease is handed over only once no
    /// pass (nor deletion, nor start) of the pool is in flight.
    in_use: Arc<()>,
    /// Another replica's share now: no new fence, handed over when idle.
    leaving: bool,
    /// Set once a pass under this lease has read the pool's containers
    /// from the engines themselves (see [`Fence::needs_fresh_look`]).
    looked: Arc<AtomicBool>,
}

impl Held {
    fn new(token: i64, valid_until: Instant) -> Self {
        Held { token, valid_until, in_use: Arc::new(()), leaving: false, looked: Arc::default() }
    }
}

/// The leases this replica holds, shared by the keeper, the worker and
/// every fence.
pub struct Leases {
    pub me: Arc<str>,
    pub duration: Duration,
    held: Mutex<HashMap<Key, Held>>,
}

/// The share of a lease's duration a holder acts within: the rest is slack
/// for the time a renewal takes to reach the store and for clocks that run
/// at slightly different rates.
const ACT_WITHIN: f64 = 0.9;

impl Leases {
    pub fn new(me: impl Into<Arc<str>>, duration: Duration) -> Arc<Self> {
        Arc::new(Self { me: me.into(), duration, held: Mutex::new(HashMap::new()) })
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Key, Held>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How long after a renewal was sent this replica may act on it.
    fn act_for(&self) -> Duration {
        self.duration.mul_f64(ACT_WITHIN)
    }

    /// A fence for a pass of `pool`: `None` unless this replica holds its
    /// lease, unexpired and not being handed over.
    pub fn fence(self: &Arc<Self>, pool: &str) -> Option<Fence> {
        self.fence_of(Key::pool(pool))
    }

    fn fence_of(self: &Arc<Self>, key: Key) -> Option<Fence> {
        let held = self.lock();
        let h = held.get(&key).filter(|h| !h.leaving && h.valid_until > Instant::now())?;
        Some(LeaseFence::of(self, key, h))
    }

    /// Claims upgrade job `id` inside `tx` (which also moves the job to
    /// running): its lease is taken when nobody holds it unexpired, by the
    /// database's clock, with the next token. Effective once `tx` commits:
    /// then call [`Claimed::held`] to act under it.
    pub async fn claim_job(self: &Arc<Self>, tx: &mut WriteTx, id: i64) -> Result<Option<Claimed>, sqlx::Error> {
        let key = Key::job(id);
        let sent = Instant::now();
        let Some(token) = crate::db::leases::take(tx, &key, &self.me, self.duration).await? else { return Ok(None) };
        Ok(Some(Claimed { leases: Arc::clone(self), key, token, valid_until: sent + self.act_for() }))
    }

    /// Gives up the lease of `key` held with `token`, at once (for a job
    /// that ended or stopped at a safe point): the next holder need not
    /// wait for it to expire.
    pub async fn give_up(&self, tx: &mut WriteTx, key: &Key, token: i64) -> sqlx::Result<()> {
        self.forget(key, token);
        crate::db::leases::give_up(tx, key, &self.me, token).await
    }

    /// Stops renewing the lease of `key` held with `token` (its run ended):
    /// it runs out in the store unless given up.
    pub fn forget(&self, key: &Key, token: i64) {
        let mut held = self.lock();
        if held.get(key).is_some_and(|h| h.token == token) {
            held.remove(key);
        }
    }

    /// The pools this replica drives now.
    pub fn held_names(&self) -> Vec<String> {
        let now = Instant::now();
        self.lock()
            .iter()
            .filter(|(k, h)| k.kind == Kind::Pool && !h.leaving && h.valid_until > now)
            .map(|(k, _)| k.name.clone())
            .collect()
    }

    /// Pool leases held now.
    pub fn held_count(&self) -> usize {
        let now = Instant::now();
        self.lock().iter().filter(|(k, h)| k.kind == Kind::Pool && !h.leaving && h.valid_until > now).count()
    }

    /// Whether `token` is still this replica's lease of `key`, unexpired.
    fn holds(&self, key: &Key, token: i64) -> bool {
        self.lock().get(key).is_some_and(|h| h.token == token && h.valid_until > Instant::now())
    }
}

/// A job's lease taken in a transaction not yet committed.
pub struct Claimed {
    leases: Arc<Leases>,
    key: Key,
    pub token: i64,
    valid_until: Instant,
}

impl Claimed {
    /// The transaction committed: the lease is held, renewed by the
    /// keeper from now on; its fence.
    pub fn held(self) -> Fence {
        let Claimed { leases, key, token, valid_until } = self;
        let held = Held::new(token, valid_until);
        let fence = LeaseFence::of(&leases, key.clone(), &held);
        leases.lock().insert(key, held);
        fence
    }
}

/// The gauges of `/metrics` about replicas: leases held by each replica
/// alive, and how many are alive (read from the store, so every replica
/// shows all of them).
pub async fn gauges(db: &crate::db::Db, leases: &Leases) -> sqlx::Result<crate::metrics::ScrapeGauges> {
    let mut g = crate::metrics::ScrapeGauges::default();
    let Some(store) = db.shared_store() else { return Ok(g) };
    let counts = crate::db::leases::counts(store, leases.duration).await?;
    let alive = counts.len() as f64;
    let samples: Vec<_> = counts.into_iter().map(|(r, n)| (vec![r], n as f64)).collect();
    g.family("drover_leases_held", "Pool leases held now, by replica", &["replica"], &samples);
    g.family("drover_replicas_alive", "drover replicas alive on the store", &[], &[(vec![], alive)]);
    Ok(g)
}

/// Where a pass of a pool may act: what every engine operation checks and
/// every write transaction proves.
#[derive(Clone)]
pub enum Fence {
    /// One process owns the store (SQLite): nothing to prove.
    Sole,
    Lease(Arc<LeaseFence>),
}

pub struct LeaseFence {
    leases: Arc<Leases>,
    key: Key,
    token: i64,
    _in_use: Arc<()>,
    looked: Arc<AtomicBool>,
}

impl LeaseFence {
    /// The fence of `held`, the lease of `key`.
    fn of(leases: &Arc<Leases>, key: Key, held: &Held) -> Fence {
        Fence::Lease(Arc::new(LeaseFence {
            leases: Arc::clone(leases),
            key,
            token: held.token,
            _in_use: Arc::clone(&held.in_use),
            looked: Arc::clone(&held.looked),
        }))
    }
}

/// The lease of a pool or job was lost (expired, taken over, handed over)
/// while a pass or run of it went on: it stops without acting or writing.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{what} is no longer driven by this replica: its lease {why}")]
pub struct Lost {
    /// The pool or job, as people read it.
    pub what: String,
    pub why: &'static str,
}

impl Fence {
    /// Before an engine operation: the lease is still this replica's, by
    /// its own clock (no store round trip).
    pub fn check(&self) -> Result<(), Lost> {
        match self {
            Fence::Sole => Ok(()),
            Fence::Lease(f) if f.leases.holds(&f.key, f.token) => Ok(()),
            Fence::Lease(_) => Err(self.lost()),
        }
    }

    /// Whether no pass under this lease has read the pool from the engines
    /// yet. The engine caches follow events, and a replica that was paused,
    /// cut off or slow may have a backlog of them: what another replica did
    /// to the pool before the lease changed hands must be seen before this
    /// one acts, or it would create again what exists already.
    pub fn needs_fresh_look(&self) -> bool {
        match self {
            Fence::Sole => false,
            Fence::Lease(f) => !f.looked.load(Ordering::SeqCst),
        }
    }

    /// A pass under this lease has read the pool from the engines.
    pub fn looked(&self) {
        if let Fence::Lease(f) = self {
            f.looked.store(true, Ordering::SeqCst);
        }
    }

    /// The loss [`check`](Self::check) reports, for an operation whose
    /// check failed further down (an engine operation left unsent).
    pub fn lost(&self) -> Lost {
        let what = match self {
            Fence::Sole => String::new(),
            Fence::Lease(f) => f.key.to_string(),
        };
        Lost { what, why: "expired or was handed over" }
    }

    /// The token of the lease, for writes that record it (`None`: SQLite).
    pub fn token(&self) -> Option<i64> {
        match self {
            Fence::Sole => None,
            Fence::Lease(f) => Some(f.token),
        }
    }

    /// First thing in a write transaction: the lease is still this
    /// replica's, by the store, and stays so until the transaction ends.
    pub async fn prove(&self, tx: &mut WriteTx) -> Result<(), FenceError> {
        let Fence::Lease(f) = self else { return Ok(()) };
        self.check()?;
        if crate::db::leases::prove(tx, &f.key, &f.leases.me, f.token).await? {
            Ok(())
        } else {
            Err(Lost { what: f.key.to_string(), why: "is held by another replica now (the store refused the write)" }
                .into())
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    #[error(transparent)]
    Lost(#[from] Lost),
    #[error("store: {0}")]
    Store(#[from] sqlx::Error),
}

/// The replica that should drive `pool` among `alive`: the one with the
/// highest score for it (rendezvous hashing). Every replica computes the
/// same answer from the same list, and when a replica joins or leaves only
/// the pools it gains or held move.
pub fn owner<'a>(alive: &'a [String], pool: &str) -> Option<&'a str> {
    alive.iter().max_by_key(|r| (score(r, pool), r.as_str())).map(String::as_str)
}

/// A well-spread 64-bit score of (replica, pool): FNV-1a over both names,
/// then SplitMix64's finaliser. Defined here, not by the standard library's
/// hasher, so that replicas of different builds agree.
fn score(replica: &str, pool: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in replica.bytes().chain([0xff]).chain(pool.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replicas(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("host-{i}-1234-ab{i:02x}")).collect()
    }

    #[test]
    fn three_replicas_share_300_pools_with_none_above_half() {
        let alive = replicas(3);
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for p in 0..300 {
            *counts.entry(owner(&alive, &format!("pool-{p}")).unwrap()).or_default() += 1;
        }
        assert_eq!(counts.len(), 3, "{counts:?}");
        assert!(counts.values().all(|&n| (70..=130).contains(&n)), "{counts:?}");
    }

    #[test]
    fn a_replica_leaving_moves_only_its_pools_and_joining_takes_only_a_share() {
        let three = replicas(3);
        let two: Vec<String> = three[..2].to_vec();
        let pools: Vec<String> = (0..1000).map(|p| format!("p{p}")).collect();
        for p in &pools {
            let before = owner(&three, p).unwrap();
            let after = owner(&two, p).unwrap();
            if before != three[2] {
                assert_eq!(before, after, "{p} moved although its replica stayed");
            }
        }
        let moved = pools.iter().filter(|p| owner(&three, p) != owner(&two, p)).count();
        assert!((250..=420).contains(&moved), "about a third moves when the third replica joins: {moved}");
    }

    #[test]
    fn every_replica_agrees_whatever_order_it_lists_the_others_in() {
        let alive = replicas(4);
        let mut reversed = alive.clone();
        reversed.reverse();
        for p in 0..200 {
            let pool = format!("x{p}");
            assert_eq!(owner(&alive, &pool), owner(&reversed, &pool));
        }
        assert_eq!(owner(&[], "p"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_fence_holds_while_the_lease_is_renewed_and_fails_once_it_is_not() {
        let leases = Leases::new("me", Duration::from_secs(15));
        assert!(leases.fence("p").is_none(), "no lease, no fence");
        leases.lock().insert(Key::pool("p"), Held::new(3, Instant::now() + leases.act_for()));
        let fence = leases.fence("p").expect("held");
        assert!(fence.check().is_ok());
        tokio::time::advance(Duration::from_secs(14)).await;
        let lost = fence.check().expect_err("past 90% of the lease without a renewal");
        assert_eq!(lost.what, "pool \"p\"");
        assert!(leases.fence("p").is_none() && leases.held_count() == 0);
        // A renewal with the same token restores it; a new token does not
        // revive fences of the old one.
        leases.lock().get_mut(&Key::pool("p")).unwrap().valid_until = Instant::now() + leases.act_for();
        assert!(fence.check().is_ok());
        leases.lock().get_mut(&Key::pool("p")).unwrap().token = 4;
        assert!(fence.check().is_err(), "a fence of token 3 never acts under token 4");
        assert!(Fence::Sole.check().is_ok());
    }
}
