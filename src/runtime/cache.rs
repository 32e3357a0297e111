//! One engine's pool-labelled containers, as last reported by the engine,
//! indexed by pool so that a reconcile pass reads its own machines without
//! scanning the others. Writes come from the engine's list and event
//! stream, and from drover's own calls (a create is visible to the next pass
//! before its event arrives).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::container::Container;

#[derive(Default)]
pub struct ContainerCache {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    by_id: HashMap<String, Container>,
    /// Pool name -> ids of its containers.
    by_pool: HashMap<String, BTreeSet<String>>,
    /// Container name -> id: names are unique on one engine.
    by_name: HashMap<String, String>,
    /// Containers drover removed itself, and when. The engine's events of
    /// their last moments (`die`, then `destroy`) may still be in flight,
    /// and an inspect made before the removal must not bring them back.
    removed: HashMap<String, Instant>,
}

/// How long a removal outweighs late reports of the container.
const TOMBSTONE: Duration = Duration::from_secs(60);

impl Inner {
    fn unindex(&mut self, c: &Container) {
        if self.by_name.get(&c.name).is_some_and(|id| *id == c.id) {
            self.by_name.remove(&c.name);
        }
        if let Some(pool) = c.pool()
            && let Some(ids) = self.by_pool.get_mut(pool)
        {
            ids.remove(&c.id);
            if ids.is_empty() {
                self.by_pool.remove(pool);
            }
        }
    }

    fn index(&mut self, c: &Container) {
        self.by_name.insert(c.name.clone(), c.id.clone());
        if let Some(pool) = c.pool() {
            self.by_pool.entry(pool.to_owned()).or_default().insert(c.id.clone());
        }
    }
}

impl ContainerCache {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A poisoned lock only means a panic elsewhere mid-update of plain
        // maps; they are still consistent enough to be corrected by the
        // next list.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// True when a container of that name is here, whatever its pool.
    pub fn has_name(&self, name: &str) -> bool {
        self.lock().by_name.contains_key(name)
    }

    /// Inserts or replaces a container; answers its pool when anything changed.
    pub fn upsert(&self, c: Container) -> Option<String> {
        let mut inner = self.lock();
        if inner.by_id.get(&c.id) == Some(&c) || inner.removed.contains_key(&c.id) {
            return None;
        }
        if let Some(old) = inner.by_id.remove(&c.id) {
            inner.unindex(&old);
        }
        inner.index(&c);
        let pool = c.pool().map(str::to_owned);
        inner.by_id.insert(c.id.clone(), c);
        pool
    }

    /// Changes one container in place; answers its pool when it exists.
    pub fn update(&self, id: &str, change: impl FnOnce(&mut Container)) -> Option<String> {
        let mut inner = self.lock();
        let c = inner.by_id.get_mut(id)?;
        change(c);
        c.pool().map(str::to_owned)
    }

    /// Forgets a container the engine says is gone; answers its pool when
    /// it was known.
    pub fn remove(&self, id: &str) -> Option<String> {
        let mut inner = self.lock();
        inner.removed.remove(id);
        let old = inner.by_id.remove(id)?;
        inner.unindex(&old);
        old.pool().map(str::to_owned)
    }

    /// Forgets a container drover has just removed, and ignores late
    /// reports of it for a while.
    pub fn forget(&self, id: &str) -> Option<String> {
        let mut inner = self.lock();
        let now = Instant::now();
        inner.removed.retain(|_, at| now.duration_since(*at) < TOMBSTONE);
        inner.removed.insert(id.to_owned(), now);
        let old = inner.by_id.remove(id)?;
        inner.unindex(&old);
        old.pool().map(str::to_owned)
    }

    /// Replaces everything with a fresh list; answers the pools whose
    /// containers changed.
    pub fn replace_all(&self, containers: Vec<Container>) -> HashSet<String> {
        let mut inner = self.lock();
        let mut changed = HashSet::new();
        let now = Instant::now();
        inner.removed.retain(|_, at| now.duration_since(*at) < TOMBSTONE);
        let fresh: HashMap<String, Container> =
            containers.into_iter().filter(|c| !inner.removed.contains_key(&c.id)).map(|c| (c.id.clone(), c)).collect();
        for (id, old) in &inner.by_id {
            if fresh.get(id) != Some(old) {
                changed.extend(old.pool().map(str::to_owned));
            }
        }
        for (id, c) in &fresh {
            if !inner.by_id.contains_key(id) {
                changed.extend(c.pool().map(str::to_owned));
            }
        }
        inner.by_id = HashMap::new();
        inner.by_pool = HashMap::new();
        inner.by_name = HashMap::new();
        for (_, c) in fresh {
            inner.index(&c);
            inner.by_id.insert(c.id.clone(), c);
        }
        changed
    }

    /// The containers of one pool.
    pub fn pool(&self, pool: &str) -> Vec<Container> {
        let inner = self.lock();
        let Some(ids) = inner.by_pool.get(pool) else { return Vec::new() };
        ids.iter().filter_map(|id| inner.by_id.get(id).cloned()).collect()
    }

    pub fn get(&self, id: &str) -> Option<Container> {
        self.lock().by_id.get(id).cloned()
    }

    /// Containers of every pool, and how many.
    pub fn len(&self) -> usize {
        self.lock().by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Names of the containers held, for messages (at most `limit`).
    pub fn names(&self, limit: usize) -> Vec<String> {
        let inner = self.lock();
        let mut names: Vec<String> = inner.by_id.values().map(|c| c.name.clone()).collect();
        names.sort();
        names.truncate(limit);
        names
    }

    /// Every pool with a container here.
    pub fn pools(&self) -> Vec<String> {
        self.lock().by_pool.keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{ContainerState, HealthState, labels};

    fn c(id: &str, pool: &str) -> Container {
        Container {
            id: id.into(),
            name: format!("worker-{id}"),
            image: "img".into(),
            labels: [(labels::POOL.to_owned(), pool.to_owned())].into(),
            state: ContainerState::Running,
            health: HealthState::None,
            exit_code: None,
            oom_killed: false,
            created_at: chrono::DateTime::UNIX_EPOCH,
            started_at: None,
            finished_at: None,
        }
    }

    #[test]
    fn containers_are_found_by_pool_and_changes_name_their_pool() {
        let cache = ContainerCache::default();
        assert_eq!(cache.upsert(c("1", "a")), Some("a".into()));
        assert_eq!(cache.upsert(c("2", "b")), Some("b".into()));
        assert_eq!(cache.upsert(c("1", "a")), None, "an unchanged container is no change");
        assert_eq!(cache.pool("a").len(), 1);
        assert_eq!(cache.update("1", |c| c.state = ContainerState::Exited), Some("a".into()));
        assert_eq!(cache.pool("a")[0].state, ContainerState::Exited);
        assert_eq!(cache.remove("1"), Some("a".into()));
        assert!(cache.pool("a").is_empty());
        assert_eq!(cache.pools(), vec!["b".to_owned()]);
    }

    #[test]
    fn a_late_report_of_a_container_drover_removed_does_not_bring_it_back() {
        let cache = ContainerCache::default();
        cache.upsert(c("1", "a"));
        assert_eq!(cache.forget("1"), Some("a".into()));
        let mut exited = c("1", "a");
        exited.state = ContainerState::Exited;
        assert_eq!(cache.upsert(exited.clone()), None, "the inspect made before the removal is ignored");
        assert!(cache.replace_all(vec![exited]).is_empty(), "and so is a list taken before it");
        assert!(cache.pool("a").is_empty());
    }

    #[test]
    fn names_are_known_whatever_the_pool_until_the_container_goes() {
        let cache = ContainerCache::default();
        cache.upsert(c("1", "a"));
        assert!(cache.has_name("worker-1"), "a name in use blocks every pool, as on Docker");
        cache.replace_all(vec![c("1", "a"), c("2", "b")]);
        assert!(cache.has_name("worker-1") && cache.has_name("worker-2"));
        cache.forget("1");
        assert!(!cache.has_name("worker-1"));
        cache.remove("2");
        assert!(!cache.has_name("worker-2"));
    }

    #[test]
    fn a_fresh_list_reports_exactly_the_pools_that_changed() {
        let cache = ContainerCache::default();
        cache.replace_all(vec![c("1", "a"), c("2", "b"), c("3", "c")]);
        let mut gone = c("3", "c");
        gone.state = ContainerState::Exited;
        let changed = cache.replace_all(vec![c("1", "a"), gone, c("4", "d")]);
        assert_eq!(changed, HashSet::from(["b".to_owned(), "c".to_owned(), "d".to_owned()]));
        assert_eq!(cache.len(), 3);
    }
}
