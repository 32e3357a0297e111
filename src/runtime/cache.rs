//! One engine's pool-labelled containers, as last reported by the engine,
//! indexed by pool so that a reconcile pass reads its own machines without
//! scanning the others. Writes come from the engine's list and event
//! stream, and from drover's own calls (a create is visible to the next pass
//! before its event arrives).
//!
//! Those reads race: the inspect a start makes and the one its `die` event
//! causes may answer in either order. Each read therefore takes a
//! [`Ticket`] before it is sent, and a container's entry is only replaced
//! by a read sent after the one it came from: the later question sees
//! every change that happened before it was asked, so a container that
//! died as it started cannot be left looking alive by the slower answer.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::container::Container;
use crate::domain::object::PoolRef;

#[derive(Default)]
pub struct ContainerCache {
    inner: Mutex<Inner>,
    tickets: AtomicU64,
}

/// When a read of the engine was sent, in the cache's own order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ticket(u64);

#[derive(Default)]
struct Inner {
    by_id: HashMap<String, Entry>,
    /// Pool -> ids of its containers.
    by_pool: HashMap<PoolRef, BTreeSet<String>>,
    /// Container name -> id: names are unique on one engine.
    by_name: HashMap<String, String>,
    /// Containers removed (by drover or reported gone), and when. The
    /// engine's events of their last moments (`die`, then `destroy`) may
    /// still be in flight, and a read made before the removal must not
    /// bring them back: an id is never used again.
    removed: HashMap<String, Instant>,
}

/// A container as last reported, and the read it came from.
struct Entry {
    container: Container,
    as_of: Ticket,
}

/// How long a removal outweighs late reports of the container.
const TOMBSTONE: Duration = Duration::from_secs(60);

impl Inner {
    /// Holds `c`, as read at `as_of`, in place of what was held of it.
    fn insert(&mut self, c: Container, as_of: Ticket) {
        self.take(&c.id);
        self.by_name.insert(c.name.clone(), c.id.clone());
        if let Some(pool) = c.pool() {
            self.by_pool.entry(pool).or_default().insert(c.id.clone());
        }
        self.by_id.insert(c.id.clone(), Entry { container: c, as_of });
    }

    /// Drops what is held of container `id`, and answers it.
    fn take(&mut self, id: &str) -> Option<Container> {
        let c = self.by_id.remove(id)?.container;
        if self.by_name.get(&c.name).is_some_and(|named| named == id) {
            self.by_name.remove(&c.name);
        }
        if let Some(pool) = c.pool()
            && let Some(ids) = self.by_pool.get_mut(&pool)
        {
            ids.remove(id);
            if ids.is_empty() {
                self.by_pool.remove(&pool);
            }
        }
        Some(c)
    }

    /// What is held of container `id` came from a read sent after `ticket`.
    fn told_since(&self, id: &str, ticket: Ticket) -> bool {
        self.by_id.get(id).is_some_and(|e| e.as_of > ticket)
    }

    /// Holds what a read sent at `ticket` answered of `c`, unless the
    /// container is gone or a later read told more; answers its pool when
    /// anything changed.
    fn put(&mut self, c: Container, ticket: Ticket) -> Option<PoolRef> {
        if self.removed.contains_key(&c.id) || self.told_since(&c.id, ticket) {
            return None;
        }
        if let Some(held) = self.by_id.get_mut(&c.id)
            && held.container == c
        {
            held.as_of = ticket;
            return None;
        }
        let pool = c.pool();
        self.insert(c, ticket);
        pool
    }

    /// Drops the entries of `ids` that no read sent after `ticket` told of
    /// (a list from `ticket` on lacks them: they are gone); answers their
    /// pools.
    fn drop_unless_told_since(&mut self, ids: Vec<String>, ticket: Ticket) -> HashSet<PoolRef> {
        let mut pools = HashSet::new();
        for id in ids {
            if !self.told_since(&id, ticket) {
                pools.extend(self.take(&id).as_ref().and_then(Container::pool));
            }
        }
        pools
    }

    fn forget_old_removals(&mut self) {
        let now = Instant::now();
        self.removed.retain(|_, at| now.duration_since(*at) < TOMBSTONE);
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

    /// A ticket for a read about to be sent to the engine.
    pub fn ticket(&self) -> Ticket {
        Ticket(self.tickets.fetch_add(1, Ordering::Relaxed))
    }

    /// Inserts or replaces a container with what drover knows of it now
    /// (its own call answered); answers its pool when anything changed.
    pub fn upsert(&self, c: Container) -> Option<PoolRef> {
        self.upsert_as_of(c, self.ticket())
    }

    /// Inserts or replaces a container with what a read sent at `ticket`
    /// answered, unless a later read already told more; answers its pool
    /// when anything changed.
    pub fn upsert_as_of(&self, c: Container, ticket: Ticket) -> Option<PoolRef> {
        self.lock().put(c, ticket)
    }

    /// Changes one container in place, as drover's own call just did;
    /// answers its pool when it exists.
    pub fn update(&self, id: &str, change: impl FnOnce(&mut Container)) -> Option<PoolRef> {
        let ticket = self.ticket();
        let mut inner = self.lock();
        let held = inner.by_id.get_mut(id)?;
        change(&mut held.container);
        held.as_of = ticket;
        held.container.pool()
    }

    /// Forgets a container that is gone (drover removed it, or the engine
    /// says so), and ignores late reports of it for a while; answers its
    /// pool when it was known.
    pub fn remove(&self, id: &str) -> Option<PoolRef> {
        let mut inner = self.lock();
        inner.forget_old_removals();
        inner.removed.insert(id.to_owned(), Instant::now());
        inner.take(id)?.pool()
    }

    /// Replaces everything with a fresh list, read from `ticket` on;
    /// entries a later read wrote are kept. Answers the pools whose
    /// containers changed.
    pub fn replace_all(&self, containers: Vec<Container>, ticket: Ticket) -> HashSet<PoolRef> {
        let mut inner = self.lock();
        inner.forget_old_removals();
        let listed: HashSet<&str> = containers.iter().map(|c| c.id.as_str()).collect();
        let unlisted: Vec<String> = inner.by_id.keys().filter(|id| !listed.contains(id.as_str())).cloned().collect();
        let mut changed = inner.drop_unless_told_since(unlisted, ticket);
        for c in containers {
            changed.extend(inner.put(c, ticket));
        }
        changed
    }

    /// Replaces one pool's containers with a fresh list of them, read from
    /// `ticket` on; entries a later read wrote are kept.
    pub fn replace_pool(&self, pool: &PoolRef, containers: Vec<Container>, ticket: Ticket) {
        let mut inner = self.lock();
        inner.forget_old_removals();
        let containers: Vec<Container> = containers.into_iter().filter(|c| c.pool().as_ref() == Some(pool)).collect();
        let listed: HashSet<&str> = containers.iter().map(|c| c.id.as_str()).collect();
        let unlisted: Vec<String> = inner
            .by_pool
            .get(pool)
            .map(|ids| ids.iter().filter(|id| !listed.contains(id.as_str())).cloned().collect())
            .unwrap_or_default();
        inner.drop_unless_told_since(unlisted, ticket);
        for c in containers {
            inner.put(c, ticket);
        }
    }

    /// The containers of one pool.
    pub fn pool(&self, pool: &PoolRef) -> Vec<Container> {
        let inner = self.lock();
        let Some(ids) = inner.by_pool.get(pool) else { return Vec::new() };
        ids.iter().filter_map(|id| inner.by_id.get(id).map(|e| e.container.clone())).collect()
    }

    pub fn get(&self, id: &str) -> Option<Container> {
        self.lock().by_id.get(id).map(|e| e.container.clone())
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
        let mut names: Vec<String> = inner.by_id.values().map(|e| e.container.name.clone()).collect();
        names.sort();
        names.truncate(limit);
        names
    }

    /// Every pool with a container here.
    pub fn pools(&self) -> Vec<PoolRef> {
        self.lock().by_pool.keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{ContainerState, HealthState, labels};

    fn p(name: &str) -> PoolRef {
        PoolRef::in_default(name)
    }

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
        assert_eq!(cache.upsert(c("1", "a")), Some(p("a")));
        assert_eq!(cache.upsert(c("2", "b")), Some(p("b")));
        assert_eq!(cache.upsert(c("1", "a")), None, "an unchanged container is no change");
        assert_eq!(cache.pool(&p("a")).len(), 1);
        assert_eq!(cache.update("1", |c| c.state = ContainerState::Exited), Some(p("a")));
        assert_eq!(cache.pool(&p("a"))[0].state, ContainerState::Exited);
        assert_eq!(cache.remove("1"), Some(p("a")));
        assert!(cache.pool(&p("a")).is_empty());
        assert_eq!(cache.pools(), vec![p("b")]);
    }

    #[test]
    fn one_pool_name_in_two_namespaces_is_two_pools_and_no_label_means_default() {
        let cache = ContainerCache::default();
        let mut of_a = c("1", "web");
        of_a.labels.insert(labels::NAMESPACE.to_owned(), "team-a".to_owned());
        let mut of_b = c("2", "web");
        of_b.labels.insert(labels::NAMESPACE.to_owned(), "team-b".to_owned());
        let old = c("3", "web");
        let mut forged = c("4", "web");
        forged.labels.insert(labels::NAMESPACE.to_owned(), "Not A Namespace".to_owned());
        for container in [of_a, of_b, old, forged] {
            cache.upsert(container);
        }
        let web = |ns: &str| PoolRef::new(crate::domain::object::Namespace::parse(ns).unwrap(), "web");
        let ids = |pool: &PoolRef| cache.pool(pool).into_iter().map(|c| c.id).collect::<Vec<_>>();
        assert_eq!(ids(&web("team-a")), ["1"]);
        assert_eq!(ids(&web("team-b")), ["2"]);
        assert_eq!(ids(&p("web")), ["3"], "a container from before namespaces is default's");
        assert_eq!(cache.pools().len(), 3, "a namespace label that names none ties to no pool");
    }

    #[test]
    fn a_fresh_list_of_one_pool_replaces_that_pool_only() {
        let cache = ContainerCache::default();
        cache.upsert(c("1", "a"));
        cache.upsert(c("2", "b"));
        let mut exited = c("1", "a");
        exited.state = ContainerState::Exited;
        // What a paused replica's cache lacks: the other replica's machines.
        cache.replace_pool(&p("a"), vec![exited, c("3", "a"), c("4", "b")], cache.ticket());
        let mut a: Vec<(String, ContainerState)> = cache.pool(&p("a")).into_iter().map(|c| (c.id, c.state)).collect();
        a.sort_by(|x, y| x.0.cmp(&y.0));
        assert_eq!(a, vec![("1".into(), ContainerState::Exited), ("3".into(), ContainerState::Running)]);
        assert_eq!(cache.pool(&p("b")).len(), 1, "another pool's entries are neither dropped nor added");
        assert!(cache.has_name("worker-3"));
        cache.replace_pool(&p("a"), Vec::new(), cache.ticket());
        assert!(cache.pool(&p("a")).is_empty() && !cache.has_name("worker-1"));
    }

    #[test]
    fn a_late_report_of_a_container_drover_removed_does_not_bring_it_back() {
        let cache = ContainerCache::default();
        cache.upsert(c("1", "a"));
        let listed = cache.ticket();
        assert_eq!(cache.remove("1"), Some(p("a")));
        let mut exited = c("1", "a");
        exited.state = ContainerState::Exited;
        assert_eq!(cache.upsert(exited.clone()), None, "the inspect made before the removal is ignored");
        assert!(cache.replace_all(vec![exited], listed).is_empty(), "and so is a list taken before it");
        assert!(cache.pool(&p("a")).is_empty());
    }

    #[test]
    fn names_are_known_whatever_the_pool_until_the_container_goes() {
        let cache = ContainerCache::default();
        cache.upsert(c("1", "a"));
        assert!(cache.has_name("worker-1"), "a name in use blocks every pool, as on Docker");
        cache.replace_all(vec![c("1", "a"), c("2", "b")], cache.ticket());
        assert!(cache.has_name("worker-1") && cache.has_name("worker-2"));
        cache.remove("1");
        assert!(!cache.has_name("worker-1"));
        cache.remove("2");
        assert!(!cache.has_name("worker-2"));
    }

    #[test]
    fn a_fresh_list_reports_exactly_the_pools_that_changed() {
        let cache = ContainerCache::default();
        cache.replace_all(vec![c("1", "a"), c("2", "b"), c("3", "c")], cache.ticket());
        let mut gone = c("3", "c");
        gone.state = ContainerState::Exited;
        let changed = cache.replace_all(vec![c("1", "a"), gone, c("4", "d")], cache.ticket());
        assert_eq!(changed, HashSet::from(["b".into(), "c".into(), "d".into()]));
        assert_eq!(cache.len(), 3);
    }

    #[test]
    fn a_slower_answer_to_an_earlier_read_does_not_undo_a_later_one() {
        // A start's inspect is sent while the process still runs; the one
        // its `die` event causes is sent later and answers first.
        let cache = ContainerCache::default();
        cache.upsert(c("1", "a"));
        let at_start = cache.ticket();
        let at_death = cache.ticket();
        let mut exited = c("1", "a");
        exited.state = ContainerState::Exited;
        assert_eq!(cache.upsert_as_of(exited, at_death), Some(p("a")));
        assert_eq!(cache.upsert_as_of(c("1", "a"), at_start), None, "the late answer that it runs is stale");
        assert_eq!(cache.pool(&p("a"))[0].state, ContainerState::Exited);
    }

    #[test]
    fn a_list_keeps_what_reads_sent_after_it_told() {
        let cache = ContainerCache::default();
        let listed = cache.ticket();
        // Created, and seen exiting, while the list was under way.
        let mut exited = c("2", "a");
        exited.state = ContainerState::Exited;
        cache.upsert(exited);
        let mut running = c("3", "a");
        running.state = ContainerState::Running;
        cache.upsert(running.clone());
        let mut old = running;
        old.state = ContainerState::Created;
        let changed = cache.replace_all(vec![c("1", "a"), old.clone()], listed);
        assert_eq!(changed, HashSet::from(["a".into()]));
        let mut a: Vec<(String, ContainerState)> = cache.pool(&p("a")).into_iter().map(|c| (c.id, c.state)).collect();
        a.sort_by(|x, y| x.0.cmp(&y.0));
        let expected = vec![
            ("1".into(), ContainerState::Running),
            ("2".into(), ContainerState::Exited),
            ("3".into(), ContainerState::Running),
        ];
        assert_eq!(a, expected);
        cache.replace_pool(&p("a"), vec![old], listed);
        assert_eq!(cache.pool(&p("a")).len(), 2, "one pool's list keeps the later reads too, and drops what it lacks");
    }
}
