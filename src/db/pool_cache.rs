//! Pools as last committed, in memory: the one row every pool read and
//! every reconcile pass starts from, served without a trip to the store.
//!
//! Coherent because every write of a pool is followed by an invalidation:
//!
//! - on SQLite, every write goes through this process's one writer: a
//!   write transaction notes the pools it touched and, once it has
//!   committed, invalidates them;
//! - on PostgreSQL, other replicas write too: a write transaction also
//!   sends a change notice with each touched pool's row version before it
//!   commits, which every replica's listener applies here
//!   ([`PoolCache::invalidate_older`]) in commit order, and reads first
//!   wait until the listener has caught up with the store
//!   ([`super::freshness`]). A listener that reconnects may have missed
//!   notices: it clears everything ([`PoolCache::invalidate_all`]).
//!
//! A read that missed fills the entry only if no invalidation happened
//! while it read the store (a count per pool, and one for the whole
//! cache), so a fill can never put back what a commit made stale.
//!
//! Bounded by the pools that exist: an entry is kept while it holds a pool
//! or a read of it is under way, and dropped otherwise, so a deleted pool,
//! a name nobody has, or a read cut short leaves nothing behind.
//!
//! The same invalidations feed a journal of the pools written, when the
//! lease keeper asks for one ([`PoolCache::journal_writes`]): it keeps its
//! set of pools current from them instead of reading every pool each
//! round ([`PoolCache::take_written`]).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use super::pool_row::Pool;
use crate::domain::object::PoolRef;

#[derive(Default)]
pub struct PoolCache {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<PoolRef, Entry>,
    /// Bumped by [`PoolCache::invalidate_all`]: a read that began before
    /// keeps nothing.
    epoch: u64,
    /// Pools written since the journal was last taken; `None`: nobody
    /// keeps a journal (SQLite, or a replica before its keeper started).
    written: Option<HashSet<PoolRef>>,
    /// Writes may have gone unheard since the journal was last taken.
    unheard: bool,
}

/// The pools written since the journal was last taken.
#[derive(Debug, PartialEq, Eq)]
pub enum Written {
    /// Writes may have gone unheard (the journal has just started, or the
    /// listener reconnected): every pool must be read again.
    Unknown,
    /// Exactly these pools' rows were written (created, changed, deleted).
    Pools(Vec<PoolRef>),
}

#[derive(Default)]
struct Entry {
    /// Bumped by every invalidation while a read is under way.
    invalidations: u64,
    /// Reads of the store under way ([`Miss`]es not yet dropped).
    reading: u32,
    pool: Option<Arc<Cached>>,
}

/// A pool as committed, and its API answer once someone rendered it: the
/// answer changes exactly when the row does.
pub struct Cached {
    pub pool: Pool,
    pub rendered: std::sync::OnceLock<bytes::Bytes>,
}

impl Cached {
    pub fn new(pool: Pool) -> Arc<Self> {
        Arc::new(Self { pool, rendered: Default::default() })
    }
}

/// A miss: what to fill once the store has been read. Dropping it (filled
/// or not) ends the read.
pub struct Miss<'a> {
    cache: &'a PoolCache,
    pool: PoolRef,
    invalidations: u64,
    epoch: u64,
}

impl PoolCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, pool: &PoolRef) -> Result<Arc<Cached>, Miss<'_>> {
        let mut inner = self.lock();
        if let Some(cached) = inner.entries.get(pool).and_then(|e| e.pool.as_ref()) {
            return Ok(Arc::clone(cached));
        }
        let epoch = inner.epoch;
        let entry = inner.entries.entry(pool.clone()).or_default();
        entry.reading += 1;
        Err(Miss { cache: self, pool: pool.clone(), invalidations: entry.invalidations, epoch })
    }

    /// Keeps what the store answered after a miss, unless it is stale.
    pub fn fill(&self, miss: Miss<'_>, pool: Option<&Pool>) -> Option<Arc<Cached>> {
        let cached = pool.map(|p| Cached::new(p.clone()));
        let mut inner = self.lock();
        let current = inner.epoch == miss.epoch;
        if let Some(cached) = &cached
            && current
            && let Some(entry) = inner.entries.get_mut(&miss.pool)
            && entry.invalidations == miss.invalidations
        {
            entry.pool = Some(Arc::clone(cached));
        }
        cached
    }

    pub fn invalidate(&self, pools: &[PoolRef]) {
        let mut inner = self.lock();
        for pool in pools {
            invalidate(&mut inner.entries, pool);
            inner.journal(pool);
        }
    }

    /// Starts a journal of the pools written (every invalidation notes its
    /// pool); the first [`take_written`](Self::take_written) answers
    /// [`Written::Unknown`].
    pub fn journal_writes(&self) {
        let mut inner = self.lock();
        inner.written = Some(HashSet::new());
        inner.unheard = true;
    }

    /// The pools written since the last call, and a fresh journal.
    pub fn take_written(&self) -> Written {
        let mut inner = self.lock();
        let Some(written) = inner.written.as_mut().map(std::mem::take) else { return Written::Unknown };
        if std::mem::take(&mut inner.unheard) {
            return Written::Unknown;
        }
        Written::Pools(written.into_iter().collect())
    }

    /// A notice that `pool` was written at row version `version`: the
    /// entry goes unless it already holds that version or a later one (a
    /// read made after the write, or this replica's own write).
    pub fn invalidate_older(&self, pool: &PoolRef, version: i64) {
        let mut inner = self.lock();
        let current = inner.entries.get(pool).and_then(|e| e.pool.as_ref()).is_some_and(|c| c.pool.version >= version);
        if !current {
            invalidate(&mut inner.entries, pool);
        }
        inner.journal(pool);
    }

    /// Forgets every pool, and every read under way keeps nothing: for a
    /// listener that may have missed notices.
    pub fn invalidate_all(&self) {
        let mut inner = self.lock();
        inner.epoch += 1;
        inner.unheard = true;
        inner.entries.retain(|_, entry| {
            entry.pool = None;
            entry.reading > 0
        });
    }

    /// Pools held or being read.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().entries.len()
    }
}

impl Inner {
    fn journal(&mut self, pool: &PoolRef) {
        if let Some(written) = &mut self.written {
            written.insert(pool.clone());
        }
    }
}

fn invalidate(entries: &mut HashMap<PoolRef, Entry>, pool: &PoolRef) {
    // No entry: nothing cached and no read to warn.
    let Some(entry) = entries.get_mut(pool) else { return };
    if entry.reading == 0 {
        entries.remove(pool);
    } else {
        entry.invalidations += 1;
        entry.pool = None;
    }
}

impl Drop for Miss<'_> {
    fn drop(&mut self) {
        let mut inner = self.cache.lock();
        let Some(entry) = inner.entries.get_mut(&self.pool) else { return };
        entry.reading = entry.reading.saturating_sub(1);
        if entry.reading == 0 && entry.pool.is_none() {
            inner.entries.remove(&self.pool);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(name: &str, generation: i64) -> Pool {
        let spec = crate::domain::pool::PoolSpec::parse(
            crate::domain::pool::PoolSpecInput::minimal(1, "v1.29.2"),
            &crate::domain::pool::SpecLimits::default(),
        )
        .unwrap();
        Pool {
            id: PoolRef::in_default(name),
            generation,
            version: generation,
            spec,
            status: Default::default(),
            deleting: false,
            revision: 1,
            batches_approved: 0,
            created_at: chrono::DateTime::UNIX_EPOCH,
            updated_at: chrono::DateTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn a_fill_after_an_invalidation_is_dropped() {
        let cache = PoolCache::default();
        let Err(miss) = cache.get(&"a".into()) else { panic!("empty cache hit") };
        // A commit lands while the reader reads the old row.
        cache.invalidate(&["a".into()]);
        cache.fill(miss, Some(&pool("a", 1)));
        assert!(cache.get(&"a".into()).is_err(), "the stale row was not kept");
        let Err(miss) = cache.get(&"a".into()) else { panic!() };
        cache.fill(miss, Some(&pool("a", 2)));
        assert_eq!(cache.get(&"a".into()).map(|c| c.pool.generation).ok(), Some(2));
    }

    #[test]
    fn names_without_a_pool_leave_no_entry_behind() {
        let cache = PoolCache::default();
        // A name nobody has.
        let Err(miss) = cache.get(&"ghost".into()) else { panic!("empty cache hit") };
        cache.fill(miss, None);
        // A read cut short (its request dropped before the store answered).
        let Err(miss) = cache.get(&"cut".into()) else { panic!() };
        drop(miss);
        // A pool cached, then deleted (its last write invalidates it).
        let Err(miss) = cache.get(&"gone".into()) else { panic!() };
        cache.fill(miss, Some(&pool("gone", 1)));
        assert_eq!(cache.len(), 1);
        cache.invalidate(&["gone".into(), "never-read".into()]);
        assert_eq!(cache.len(), 0, "only pools held or being read have entries");
    }

    #[test]
    fn an_invalidation_during_one_of_two_reads_drops_both_fills() {
        let cache = PoolCache::default();
        let Err(first) = cache.get(&"a".into()) else { panic!() };
        let Err(second) = cache.get(&"a".into()) else { panic!() };
        cache.invalidate(&["a".into()]);
        cache.fill(first, Some(&pool("a", 1)));
        cache.fill(second, Some(&pool("a", 1)));
        assert!(cache.get(&"a".into()).is_err(), "both reads began before the commit");
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn a_notice_drops_an_older_row_and_keeps_a_newer_one() {
        let cache = PoolCache::default();
        let Err(miss) = cache.get(&"a".into()) else { panic!() };
        cache.fill(miss, Some(&pool("a", 3)));
        cache.invalidate_older(&"a".into(), 3);
        assert!(cache.get(&"a".into()).is_ok(), "the cache holds the notice's version already");
        cache.invalidate_older(&"a".into(), 4);
        assert!(cache.get(&"a".into()).is_err(), "a later write drops it");
    }

    #[test]
    fn clearing_everything_drops_fills_of_reads_begun_before() {
        let cache = PoolCache::default();
        let Err(miss) = cache.get(&"a".into()) else { panic!() };
        cache.fill(miss, Some(&pool("a", 1)));
        let Err(reading) = cache.get(&"b".into()) else { panic!() };
        cache.invalidate_all();
        assert!(cache.get(&"a".into()).is_err(), "a cached pool is gone");
        cache.fill(reading, Some(&pool("b", 1)));
        assert!(cache.get(&"b".into()).is_err(), "a read begun before the clearing keeps nothing");
        assert_eq!(cache.len(), 0, "and leaves no entry");
    }

    #[test]
    fn the_journal_names_each_pool_written_once_and_starts_unknown_and_after_a_reconnect() {
        let cache = PoolCache::default();
        cache.invalidate(&["before".into()]);
        assert_eq!(cache.take_written(), Written::Unknown, "no journal kept: nothing is known");
        cache.journal_writes();
        cache.invalidate(&["a".into()]);
        assert_eq!(cache.take_written(), Written::Unknown, "the first take reads everything");
        cache.invalidate(&["a".into(), "b".into()]);
        cache.invalidate_older(&"b".into(), 3);
        let Written::Pools(mut written) = cache.take_written() else { panic!("a journal was kept") };
        written.sort_by(|x, y| x.name.cmp(&y.name));
        assert_eq!(written, [PoolRef::in_default("a"), PoolRef::in_default("b")]);
        assert_eq!(cache.take_written(), Written::Pools(vec![]), "taken: empty again");
        cache.invalidate_all();
        assert_eq!(cache.take_written(), Written::Unknown, "notices may have been missed");
    }
}
