//! One engine: its backend (Docker or simulated), the cache of its
//! containers, and the container operations pools ask of it, each within
//! the engine's own limit of operations in flight. The rest of what an
//! engine is lives beside this:
//! - [`health`]: whether it can be reached, and its announcements;
//! - [`identity`]: which Docker daemon it reaches;
//! - [`placement`]: whether it takes new machines, and why not;
//! - `informer`: the loop that keeps its cache current;
//! - [`simulation`]: what tests do to a simulated engine.

pub mod health;
pub mod identity;
mod informer;
pub mod placement;
pub mod simulation;
mod span;

use crate::domain::object::PoolRef;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{Notify, Semaphore, mpsc};

use super::breaker::Breaker;
use crate::runtime::cache::ContainerCache;
use crate::runtime::{Backend, Container, ContainerState, CreateContainer, Gate, RuntimeError, Wake, labels};
use health::{EngineHealth, Reachability};
use identity::Identity;
use span::{EngineOp, traced};

/// Settings every engine shares.
#[derive(Debug, Clone, Copy)]
pub struct EngineSettings {
    /// Container operations in flight at once, per engine.
    pub max_parallel: usize,
    /// How long an engine may not answer before it is given up for lost.
    pub lost_after: Duration,
}

pub struct Engine {
    pub name: String,
    /// For pools' engine selectors.
    pub labels: BTreeMap<String, String>,
    /// No new machine goes here, and the machines here move away.
    draining: AtomicBool,
    backend: Backend,
    cache: ContainerCache,
    /// A watch channel, so that the lost announcer sleeps until the health
    /// changes or the lost deadline comes, instead of polling.
    health: tokio::sync::watch::Sender<EngineHealth>,
    /// Placement failures (creates, first starts) back the engine off.
    breaker: Mutex<Breaker>,
    lost_after: Duration,
    /// Container operations in flight at once on this engine, so that one
    /// slow engine never holds the permits of the others.
    ops: Semaphore,
    wakes: mpsc::UnboundedSender<Wake>,
    /// The daemon it reaches.
    identity: Mutex<Identity>,
    /// Told when what an engine's endpoint reports changes, for the
    /// daemons' check (shared by the set's engines).
    identities: Arc<Notify>,
}

/// Where an engine tells of its changes.
#[derive(Clone)]
pub struct Signals {
    /// The reconciler's wake-ups.
    pub wakes: mpsc::UnboundedSender<Wake>,
    /// The daemons' check.
    pub identities: Arc<Notify>,
}

impl Engine {
    pub fn new(
        name: String,
        labels: BTreeMap<String, String>,
        backend: Backend,
        settings: EngineSettings,
        signals: Signals,
    ) -> Self {
        let simulated = matches!(backend, Backend::Simulated(_));
        let now = crate::clock::wall();
        // A simulated engine answers at once, as its endpoint's daemon.
        let reported = match &backend {
            Backend::Simulated(s) => Some(s.daemon_id().unwrap_or_else(|| format!("sim://{name}"))),
            Backend::Docker(_) => None,
        };
        Self {
            name,
            labels,
            draining: AtomicBool::new(false),
            backend,
            cache: ContainerCache::default(),
            breaker: Mutex::default(),
            lost_after: settings.lost_after,
            health: tokio::sync::watch::Sender::new(EngineHealth {
                // A simulated engine holds nothing it has not created.
                reachability: if simulated { Reachability::Reachable } else { Reachability::Syncing },
                since: now,
                version: simulated.then(|| "simulated".to_owned()),
                last_error: None,
                last_seen: simulated.then_some(now),
            }),
            ops: Semaphore::new(settings.max_parallel.max(1)),
            wakes: signals.wakes,
            identity: Mutex::new(Identity { reported, ..Identity::default() }),
            identities: signals.identities,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self.backend {
            Backend::Docker(_) => "docker",
            Backend::Simulated(_) => "simulated",
        }
    }

    /// The address, for status and logs; never a credential.
    pub fn address(&self) -> String {
        match &self.backend {
            Backend::Docker(d) => d.address(),
            Backend::Simulated(_) => format!("sim://{}", self.name),
        }
    }

    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    pub fn set_draining(&self, draining: bool) {
        self.draining.store(draining, Ordering::SeqCst);
        self.wake_all();
    }

    /// Wakes every pool: where machines may go (or be) has changed.
    pub fn wake_all(&self) {
        let _ = self.wakes.send(Wake::All);
    }

    /// Pools with machines here.
    pub fn pools(&self) -> Vec<PoolRef> {
        self.cache.pools()
    }

    /// Whether a container is this engine's: it carries this engine's name,
    /// or no engine name at all (made before containers carried one). Two
    /// registrations of one Docker daemon each see only their own machines,
    /// so no machine is counted twice.
    pub fn owns(&self, c: &Container) -> bool {
        c.labels.get(labels::ENGINE).is_none_or(|e| *e == self.name)
    }

    pub fn containers(&self, pool: &PoolRef) -> Vec<Container> {
        self.cache.pool(pool)
    }

    pub fn container(&self, id: &str) -> Option<Container> {
        self.cache.get(id)
    }

    /// True when a container of that name is on this engine, in any pool.
    pub fn has_container_named(&self, name: &str) -> bool {
        self.cache.has_name(name)
    }

    pub fn container_count(&self) -> usize {
        self.cache.len()
    }

    /// Names of the machines held here (at most `limit`), for messages.
    pub fn machine_names(&self, limit: usize) -> Vec<String> {
        self.cache.names(limit)
    }

    /// Runs one engine call under this engine's parallelism limit, asking
    /// `gate` once the call has its turn, right before it is sent.
    async fn op<T>(
        &self,
        gate: Gate<'_>,
        call: impl Future<Output = Result<T, RuntimeError>>,
    ) -> Result<T, RuntimeError> {
        let _permit =
            self.ops.acquire().await.map_err(|_| RuntimeError::Unavailable("the engine was removed".into()))?;
        if !gate() {
            return Err(RuntimeError::Fenced);
        }
        call.await
    }

    pub async fn ping(&self) -> Result<(), RuntimeError> {
        match &self.backend {
            Backend::Docker(d) => d.ping().await,
            Backend::Simulated(s) => s.ping(),
        }
    }

    /// Creates a machine's container; the cache shows it at once. A Docker
    /// engine answers it created, for the caller to [`start`](Self::start)
    /// (the slow half, which a pass hands over); the simulated engine
    /// starts it at once.
    pub async fn create(&self, spec: &CreateContainer, gate: Gate<'_>) -> Result<Container, RuntimeError> {
        let call = self.op(gate, async {
            match &self.backend {
                Backend::Docker(d) => {
                    let ticket = self.cache.ticket();
                    let c = d.create(spec).await?;
                    self.cache.upsert_as_of(c.clone(), ticket);
                    Ok(c)
                }
                Backend::Simulated(s) => s.create(&self.cache, spec),
            }
        });
        traced(EngineOp::Create, &self.name, self.kind(), &spec.name, call).await
    }

    /// The name of a container, for spans; its id when the cache has none.
    fn name_of(&self, id: &str) -> String {
        self.cache.get(id).map_or_else(|| id.to_owned(), |c| c.name)
    }

    /// Reads one pool's containers from the engine again, so that what the
    /// cache holds of the pool is no older than this call; nothing to do
    /// for a simulated engine (its cache is the engine).
    pub async fn relist_pool(&self, pool: &PoolRef) -> Result<(), RuntimeError> {
        if let Backend::Docker(d) = &self.backend {
            let ticket = self.cache.ticket();
            // Listed by the pool's name; the cache keeps its namespace's.
            let fresh = d.list_pool(&pool.name).await?;
            self.cache.replace_pool(pool, fresh, ticket);
        }
        Ok(())
    }

    /// Reads one container from the engine again, so that what the cache
    /// holds of it is no older than this call; nothing to do for a
    /// simulated engine (its cache is the engine).
    pub async fn reread(&self, id: &str) -> Result<(), RuntimeError> {
        match &self.backend {
            Backend::Docker(d) => {
                traced(EngineOp::Inspect, &self.name, self.kind(), &self.name_of(id), self.refresh(d, id))
                    .await
                    .map(drop)
            }
            Backend::Simulated(_) => Ok(()),
        }
    }

    /// Starts a created or exited container: a restart in place.
    pub async fn start(&self, id: &str, gate: Gate<'_>) -> Result<(), RuntimeError> {
        traced(EngineOp::Start, &self.name, self.kind(), &self.name_of(id), self.start_untraced(id, gate)).await
    }

    async fn start_untraced(&self, id: &str, gate: Gate<'_>) -> Result<(), RuntimeError> {
        match &self.backend {
            Backend::Docker(d) => {
                self.op(gate, d.start(id)).await?;
                // What the engine says now, not what was asked: a process
                // that died as it started is exited already, and the event
                // of its death may have been handled before this call
                // returned, so assuming `running` here could leave a dead
                // machine looking alive (and, once settled, ready). Until
                // the inspect answers, the events keep the cache.
                if let Err(e) = self.refresh(d, id).await {
                    tracing::debug!(engine = %self.name, container = id, error = %e,
                        "inspecting a started container failed; its events will tell");
                }
                Ok(())
            }
            Backend::Simulated(s) => self.op(gate, async { s.start(&self.cache, id) }).await,
        }
    }

    pub async fn unpause(&self, id: &str, gate: Gate<'_>) -> Result<(), RuntimeError> {
        let name = self.name_of(id);
        let call = self.op(gate, async {
            match &self.backend {
                Backend::Docker(d) => {
                    d.unpause(id).await?;
                    self.cache.update(id, |c| c.state = ContainerState::Running);
                    Ok(())
                }
                Backend::Simulated(s) => s.unpause(&self.cache, id),
            }
        });
        traced(EngineOp::Unpause, &self.name, self.kind(), &name, call).await
    }

    /// Stops (grace period first) and removes a container. The stop runs
    /// outside the parallelism limit: a machine taking its whole grace
    /// period must not hold up creations.
    pub async fn remove(&self, id: &str, stop_timeout_secs: i64, gate: Gate<'_>) -> Result<(), RuntimeError> {
        let name = self.name_of(id);
        traced(EngineOp::Remove, &self.name, self.kind(), &name, self.remove_untraced(id, stop_timeout_secs, gate))
            .await
    }

    async fn remove_untraced(&self, id: &str, stop_timeout_secs: i64, gate: Gate<'_>) -> Result<(), RuntimeError> {
        if !gate() {
            return Err(RuntimeError::Fenced);
        }
        match &self.backend {
            Backend::Docker(d) => {
                d.remove(id, stop_timeout_secs, gate).await?;
                if let Some(pool) = self.cache.remove(id) {
                    tracing::debug!(engine = %self.name, %pool, container = id, "container removed");
                }
                Ok(())
            }
            Backend::Simulated(s) => s.remove(&self.cache, id),
        }
    }
}

fn after(t: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    t + chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use crate::runtime::simulated::SimulatedBackend;

    fn engine() -> Engine {
        let settings = EngineSettings { max_parallel: 1, lost_after: Duration::from_secs(60) };
        let (wakes, _) = mpsc::unbounded_channel();
        let signals = Signals { wakes, identities: Arc::default() };
        Engine::new("e".into(), BTreeMap::new(), Backend::Simulated(SimulatedBackend::default()), settings, signals)
    }

    fn spec() -> CreateContainer {
        CreateContainer {
            name: "m1".into(),
            image: "img:1".into(),
            labels: [(labels::POOL.to_owned(), "p".to_owned())].into(),
            mounts: Vec::new(),
            stop_timeout_secs: 1,
        }
    }

    #[tokio::test]
    async fn an_operation_asks_its_gate_after_waiting_for_its_turn_and_is_left_unsent_when_refused() {
        let engine = Arc::new(engine());
        let allowed = Arc::new(AtomicBool::new(true));
        // Every slot taken: the create waits for its turn.
        let slot = engine.ops.acquire().await.unwrap();
        let (e, a) = (engine.clone(), allowed.clone());
        let create = tokio::spawn(async move { e.create(&spec(), &|| a.load(Ordering::SeqCst)).await });
        tokio::task::yield_now().await;
        // The right to act ends while it waits (a lease expiring).
        allowed.store(false, Ordering::SeqCst);
        drop(slot);
        let r = create.await.unwrap();
        assert!(matches!(r, Err(RuntimeError::Fenced)), "{r:?}");
        assert_eq!(engine.container_count(), 0, "nothing was created");

        engine.create(&spec(), &|| true).await.unwrap();
        assert_eq!(engine.machine_names(2), vec!["m1".to_owned()], "allowed, it is sent");
    }
}
