//! Leases: which replica drives a pool or runs an upgrade job, on the
//! database's clock (the rows: [`crate::db::leases`]; the rules:
//! docs/ha.md). One type for pools and jobs alike: [`Leases`] holds what
//! this replica holds, the keeper ([`super::keeper`]) renews them, and a
//! [`Fence`] is what a pass or a job's run carries.
//!
//! A fence checks locally, before every engine operation or Kubernetes
//! call, that its lease is still held (a monotonic deadline a little short
//! of the lease's expiry: a paused or cut-off replica stops on its own),
//! and every write transaction first proves the lease, holder and token,
//! in the store, locking the lease row until commit: a replica that lost
//! the lease writes nothing more, whatever its clock. With SQLite there is
//! one process: no leases, and the fence is [`Fence::Sole`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use crate::db::WriteTx;
pub use crate::db::leases::{Key, Kind};
use crate::domain::object::PoolRef;

/// A lease this replica holds.
pub(super) struct Held {
    pub(super) token: i64,
    /// When this replica stops acting on the pool unless the lease is
    /// renewed meanwhile: a little before the lease expires in the store.
    pub(super) valid_until: Instant,
    /// One clone per fence in use: the lease is handed over only once no
    /// pass (nor deletion, nor start) of the pool is in flight.
    pub(super) in_use: Arc<()>,
    /// Another replica's share now: no new fence, handed over when idle.
    pub(super) leaving: bool,
    /// Set once a pass under this lease has read the pool's containers
    /// from the engines themselves (see [`Fence::needs_fresh_look`]).
    pub(super) looked: Arc<AtomicBool>,
}

impl Held {
    pub(super) fn new(token: i64, valid_until: Instant) -> Self {
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

    pub(super) fn lock(&self) -> MutexGuard<'_, HashMap<Key, Held>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How long after a renewal was sent this replica may act on it.
    pub(super) fn act_for(&self) -> Duration {
        self.duration.mul_f64(ACT_WITHIN)
    }

    /// A fence for a pass of `pool`: `None` unless this replica holds its
    /// lease, unexpired and not being handed over.
    pub fn fence(self: &Arc<Self>, pool: &PoolRef) -> Option<Fence> {
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
    pub fn held_pools(&self) -> Vec<PoolRef> {
        let now = Instant::now();
        self.lock()
            .iter()
            .filter(|(_, h)| !h.leaving && h.valid_until > now)
            .filter_map(|(k, _)| match k {
                Key::Pool(pool) => Some(pool.clone()),
                Key::Job(_) => None,
            })
            .collect()
    }

    /// Pool leases held now.
    pub fn held_count(&self) -> usize {
        let now = Instant::now();
        self.lock().iter().filter(|(k, h)| k.kind() == Kind::Pool && !h.leaving && h.valid_until > now).count()
    }

    /// Whether the lease a fence was made from (`token`, and its `in_use`
    /// marker) is still this replica's lease of `key`, unexpired. The
    /// marker tells a lease taken again with the same token (a pool
    /// deleted, its lease row forgotten, and the pool made again) from the
    /// one the fence came from: an older fence never acts under a newer
    /// lease.
    fn holds(&self, key: &Key, token: i64, in_use: &Arc<()>) -> bool {
        self.lock()
            .get(key)
            .is_some_and(|h| h.token == token && Arc::ptr_eq(&h.in_use, in_use) && h.valid_until > Instant::now())
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

/// Where a pass of a pool, or a run of a job, may act: what every engine
/// operation or Kubernetes call checks and every write transaction proves.
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
    in_use: Arc<()>,
    looked: Arc<AtomicBool>,
}

impl LeaseFence {
    /// The fence of `held`, the lease of `key`.
    fn of(leases: &Arc<Leases>, key: Key, held: &Held) -> Fence {
        Fence::Lease(Arc::new(LeaseFence {
            leases: Arc::clone(leases),
            key,
            token: held.token,
            in_use: Arc::clone(&held.in_use),
            looked: Arc::clone(&held.looked),
        }))
    }
}

/// The lease of a pool or job was lost (expired, taken over, handed over)
/// while a pass or run of it went on: it stops without acting or writing.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{} is no longer driven by this replica: its lease {why}", of.as_ref().map_or_else(|| "the object".to_owned(), Key::to_string))]
pub struct Lost {
    /// The pool or job (`None` with one process, which holds no leases).
    pub of: Option<Key>,
    pub why: &'static str,
}

impl Fence {
    /// Before an engine operation: the lease is still this replica's, by
    /// its own clock (no store round trip).
    pub fn check(&self) -> Result<(), Lost> {
        match self {
            Fence::Sole => Ok(()),
            Fence::Lease(f) if f.leases.holds(&f.key, f.token, &f.in_use) => Ok(()),
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
        let of = match self {
            Fence::Sole => None,
            Fence::Lease(f) => Some(f.key.clone()),
        };
        Lost { of, why: "expired or was handed over" }
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
            Err(Lost { of: Some(f.key.clone()), why: "is held by another replica now (the store refused the write)" }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_fence_holds_while_the_lease_is_renewed_and_fails_once_it_is_not() {
        let leases = Leases::new("me", Duration::from_secs(15));
        assert!(leases.fence(&"p".into()).is_none(), "no lease, no fence");
        leases.lock().insert(Key::pool(&PoolRef::in_default("p")), Held::new(3, Instant::now() + leases.act_for()));
        let fence = leases.fence(&"p".into()).expect("held");
        assert!(fence.check().is_ok());
        tokio::time::advance(Duration::from_secs(14)).await;
        let lost = fence.check().expect_err("past 90% of the lease without a renewal");
        assert_eq!(lost.of, Some(Key::pool(&"p".into())));
        assert!(leases.fence(&"p".into()).is_none() && leases.held_count() == 0);
        // A renewal with the same token restores it; a new token does not
        // revive fences of the old one.
        leases.lock().get_mut(&Key::pool(&PoolRef::in_default("p"))).unwrap().valid_until =
            Instant::now() + leases.act_for();
        assert!(fence.check().is_ok());
        leases.lock().get_mut(&Key::pool(&PoolRef::in_default("p"))).unwrap().token = 4;
        assert!(fence.check().is_err(), "a fence of token 3 never acts under token 4");
        // The lease taken again with token 3 (its row forgotten and made
        // anew): the old fence stays dead, a new one acts.
        let key = Key::pool(&PoolRef::in_default("p"));
        leases.lock().insert(key.clone(), Held::new(3, Instant::now() + leases.act_for()));
        assert!(fence.check().is_err(), "a fence of an earlier lease never acts under a later one");
        assert!(leases.fence(&"p".into()).is_some_and(|f| f.check().is_ok()));
        assert!(Fence::Sole.check().is_ok());
    }
}
