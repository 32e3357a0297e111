//! Pools as last committed, in memory: the one row every pool read and
//! every reconcile pass starts from, served without a trip to SQLite.
//!
//! Coherent because every write of a pool goes through this process's one
//! writer: a write transaction notes the pools it touched and, once it has
//! committed, invalidates them. A read that missed fills the entry only if
//! no invalidation happened while it read the store (a version per pool),
//! so a fill can never put back what a commit made stale.
//!
//! Bounded by the pools that exist: an entry is kept while it holds a pool
//! or a read of it is under way, and dropped otherwise, so a deleted pool,
//! a name nobody has, or a read cut short leaves nothing behind.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::pool_row::Pool;

#[derive(Default)]
pub struct PoolCache {
    entries: Mutex<HashMap<String, Entry>>,
}

#[derive(Default)]
struct Entry {
    /// Bumped by every invalidation while a read is under way.
    version: u64,
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

/// A miss: what to fill once the store has been read. Dropping it (filled
/// or not) ends the read.
pub struct Miss<'a> {
    cache: &'a PoolCache,
    name: String,
    version: u64,
}

impl PoolCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, name: &str) -> Result<Arc<Cached>, Miss<'_>> {
        let mut entries = self.lock();
        if let Some(pool) = entries.get(name).and_then(|e| e.pool.as_ref()) {
            return Ok(Arc::clone(pool));
        }
        let entry = entries.entry(name.to_owned()).or_default();
        entry.reading += 1;
        Err(Miss { cache: self, name: name.to_owned(), version: entry.version })
    }

    /// Keeps what the store answered after a miss, unless it is stale.
    pub fn fill(&self, miss: Miss<'_>, pool: Option<&Pool>) -> Option<Arc<Cached>> {
        let cached = pool.map(|p| Arc::new(Cached { pool: p.clone(), rendered: Default::default() }));
        if let Some(cached) = &cached
            && let Some(entry) = self.lock().get_mut(&miss.name)
            && entry.version == miss.version
        {
            entry.pool = Some(Arc::clone(cached));
        }
        cached
    }

    pub fn invalidate(&self, names: &[String]) {
        let mut entries = self.lock();
        for name in names {
            // No entry: nothing cached and no read to warn.
            let Some(entry) = entries.get_mut(name) else { continue };
            if entry.reading == 0 {
                entries.remove(name);
            } else {
                entry.version += 1;
                entry.pool = None;
            }
        }
    }

    /// Pools held or being read.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

impl Drop for Miss<'_> {
    fn drop(&mut self) {
        let mut entries = self.cache.lock();
        let Some(entry) = entries.get_mut(&self.name) else { return };
        entry.reading = entry.reading.saturating_sub(1);
        if entry.reading == 0 && entry.pool.is_none() {
            entries.remove(&self.name);
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
            name: name.into(),
            generation,
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
        let Err(miss) = cache.get("a") else { panic!("empty cache hit") };
        // A commit lands while the reader reads the old row.
        cache.invalidate(&["a".into()]);
        cache.fill(miss, Some(&pool("a", 1)));
        assert!(cache.get("a").is_err(), "the stale row was not kept");
        let Err(miss) = cache.get("a") else { panic!() };
        cache.fill(miss, Some(&pool("a", 2)));
        assert_eq!(cache.get("a").map(|c| c.pool.generation).ok(), Some(2));
    }

    #[test]
    fn names_without_a_pool_leave_no_entry_behind() {
        let cache = PoolCache::default();
        // A name nobody has.
        let Err(miss) = cache.get("ghost") else { panic!("empty cache hit") };
        cache.fill(miss, None);
        // A read cut short (its request dropped before the store answered).
        let Err(miss) = cache.get("cut") else { panic!() };
        drop(miss);
        // A pool cached, then deleted (its last write invalidates it).
        let Err(miss) = cache.get("gone") else { panic!() };
        cache.fill(miss, Some(&pool("gone", 1)));
        assert_eq!(cache.len(), 1);
        cache.invalidate(&["gone".into(), "never-read".into()]);
        assert_eq!(cache.len(), 0, "only pools held or being read have entries");
    }

    #[test]
    fn an_invalidation_during_one_of_two_reads_drops_both_fills() {
        let cache = PoolCache::default();
        let Err(first) = cache.get("a") else { panic!() };
        let Err(second) = cache.get("a") else { panic!() };
        cache.invalidate(&["a".into()]);
        cache.fill(first, Some(&pool("a", 1)));
        cache.fill(second, Some(&pool("a", 1)));
        assert!(cache.get("a").is_err(), "both reads began before the commit");
        assert_eq!(cache.len(), 0);
    }
}
