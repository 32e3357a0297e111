//! Pools as last committed, in memory: the one row every pool read and
//! every reconcile pass starts from, served without a trip to SQLite.
//!
//! Coherent because every write of a pool goes through this process's one
//! writer: a write transaction notes the pools it touched and, once it has
//! committed, invalidates them. A read that missed fills the entry only if
//! no invalidation happened while it read the store (a version per pool),
//! so a fill can never put back what a commit made stale.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::pool_row::Pool;

#[derive(Default)]
pub struct PoolCache {
    entries: Mutex<HashMap<String, Entry>>,
}

#[derive(Default)]
struct Entry {
    /// Bumped by every invalidation.
    version: u64,
    pool: Option<Arc<Cached>>,
}

/// A pool as committed, and its API answer once someone rendered it: the
/// answer changes exactly when the row does.
pub struct Cached {
    pub pool: Pool,
    pub rendered: std::sync::OnceLock<bytes::Bytes>,
}

/// A miss: what to fill once the store has been read.
pub struct Miss {
    name: String,
    version: u64,
}

impl PoolCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, name: &str) -> Result<Arc<Cached>, Miss> {
        let mut entries = self.lock();
        let entry = entries.entry(name.to_owned()).or_default();
        match &entry.pool {
            Some(pool) => Ok(Arc::clone(pool)),
            None => Err(Miss { name: name.to_owned(), version: entry.version }),
        }
    }

    /// Keeps what the store answered after a miss, unless it is stale.
    pub fn fill(&self, miss: Miss, pool: Option<&Pool>) -> Option<Arc<Cached>> {
        let cached = pool.map(|p| Arc::new(Cached { pool: p.clone(), rendered: Default::default() }));
        let mut entries = self.lock();
        match (entries.get_mut(&miss.name), &cached) {
            (Some(entry), Some(cached)) if entry.version == miss.version => entry.pool = Some(Arc::clone(cached)),
            // Gone from the store: forget the name too.
            (Some(entry), None) if entry.version == miss.version => {
                entries.remove(&miss.name);
            }
            _ => {}
        }
        cached
    }

    pub fn invalidate(&self, names: &[String]) {
        let mut entries = self.lock();
        for name in names {
            let entry = entries.entry(name.clone()).or_default();
            entry.version += 1;
            entry.pool = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(name: &str, generation: i64) -> Pool {
        let spec = crate::domain::pool::validate(
            crate::domain::pool::RawSpec { replicas: 1, version: "v1.29.2".into(), ..Default::default() },
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
}
