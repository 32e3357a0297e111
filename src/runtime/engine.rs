//! One engine: its backend (Docker or simulated), the cache of its
//! containers, whether it can be reached, and the informer that keeps the
//! cache current.
//!
//! The informer lists once, then follows the event stream, and pings while
//! the stream is quiet. When the engine goes away it reconnects with capped
//! exponential backoff and jitter, one loop per engine; pools are woken once
//! when the engine is lost and once when it is back, not on every attempt.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use rand::RngExt;
use serde::{Deserialize, Serialize};
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use utoipa::ToSchema;

use super::cache::ContainerCache;
use super::container::{Container, ContainerState, CreateContainer, RuntimeError, Wake};
use super::docker::{ContainerEvent, DockerBackend};
use super::simulated::SimulatedBackend;

/// How a quiet event stream is checked: the engine must answer a ping.
const PING_EVERY: Duration = Duration::from_secs(5);
const FIRST_RETRY: Duration = Duration::from_millis(250);
const MAX_RETRY: Duration = Duration::from_secs(15);

pub enum Backend {
    Docker(DockerBackend),
    Simulated(SimulatedBackend),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Reachability {
    /// Not listed yet: what it holds is unknown.
    Syncing,
    Reachable,
    Unreachable,
}

/// What drover knows of an engine's health.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineHealth {
    pub reachability: Reachability,
    /// When `reachability` last changed.
    pub since: DateTime<Utc>,
    pub version: Option<String>,
    pub last_error: Option<String>,
    /// Last time the engine answered.
    pub last_seen: Option<DateTime<Utc>>,
}

pub struct Engine {
    pub name: String,
    /// For pools' engine selectors.
    pub labels: BTreeMap<String, String>,
    /// No new machine goes here, and the machines here move away.
    draining: AtomicBool,
    backend: Backend,
    cache: ContainerCache,
    health: Mutex<EngineHealth>,
    /// Container operations in flight at once on this engine, so that one
    /// slow engine never holds the permits of the others.
    ops: Semaphore,
    wakes: mpsc::UnboundedSender<Wake>,
}

impl Engine {
    pub fn new(
        name: String,
        labels: BTreeMap<String, String>,
        backend: Backend,
        max_parallel: usize,
        wakes: mpsc::UnboundedSender<Wake>,
    ) -> Self {
        let simulated = matches!(backend, Backend::Simulated(_));
        let now = Utc::now();
        Self {
            name,
            labels,
            draining: AtomicBool::new(false),
            backend,
            cache: ContainerCache::default(),
            health: Mutex::new(EngineHealth {
                // A simulated engine holds nothing it has not created.
                reachability: if simulated { Reachability::Reachable } else { Reachability::Syncing },
                since: now,
                version: simulated.then(|| "simulated".to_owned()),
                last_error: None,
                last_seen: simulated.then_some(now),
            }),
            ops: Semaphore::new(max_parallel.max(1)),
            wakes,
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
    pub fn pools(&self) -> Vec<String> {
        self.cache.pools()
    }

    pub fn health(&self) -> EngineHealth {
        self.health.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Unreachable, or never listed, for at least `after`: its machines are
    /// given up for lost and replaced elsewhere.
    pub fn lost(&self, now: DateTime<Utc>, after: Duration) -> bool {
        let h = self.health();
        h.reachability != Reachability::Reachable
            && now.signed_duration_since(h.since).to_std().is_ok_and(|d| d >= after)
    }

    pub fn reachable(&self) -> bool {
        self.health().reachability == Reachability::Reachable
    }

    pub fn containers(&self, pool: &str) -> Vec<Container> {
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

    fn set_health(&self, change: impl FnOnce(&mut EngineHealth)) -> (Reachability, Reachability) {
        let mut h = self.health.lock().unwrap_or_else(|p| p.into_inner());
        let before = h.reachability;
        change(&mut h);
        if h.reachability != before {
            h.since = Utc::now();
        }
        (before, h.reachability)
    }

    fn wake(&self, pool: Option<String>) {
        if let Some(pool) = pool {
            // Fails only once the worker has stopped.
            let _ = self.wakes.send(Wake::Pool(pool));
        }
    }

    fn reached(&self, version: Option<String>) {
        let (before, _) = self.set_health(|h| {
            h.reachability = Reachability::Reachable;
            h.last_error = None;
            h.last_seen = Some(Utc::now());
            if version.is_some() {
                h.version = version;
            }
        });
        if before != Reachability::Reachable {
            tracing::info!(engine = %self.name, address = %self.address(), "engine reachable");
            let message = format!("{} answers again", self.address());
            let _ = self.wakes.send(Wake::Engine { name: self.name.clone(), reachable: true, message });
        }
    }

    fn lost_contact(&self, error: &RuntimeError) {
        let message = error.to_string();
        let (before, _) = self.set_health(|h| {
            h.reachability = match h.reachability {
                Reachability::Syncing => Reachability::Syncing,
                _ => Reachability::Unreachable,
            };
            h.last_error = Some(message.clone());
        });
        if before == Reachability::Reachable {
            tracing::warn!(engine = %self.name, error = %message, "engine unreachable; reconnecting with backoff");
            let message = format!("{} does not answer: {message}", self.address());
            let _ = self.wakes.send(Wake::Engine { name: self.name.clone(), reachable: false, message });
        } else {
            tracing::debug!(engine = %self.name, error = %message, "engine still unreachable");
        }
    }

    /// Runs one engine call under this engine's parallelism limit.
    async fn op<T>(&self, call: impl Future<Output = Result<T, RuntimeError>>) -> Result<T, RuntimeError> {
        let _permit =
            self.ops.acquire().await.map_err(|_| RuntimeError::Unavailable("the engine was removed".into()))?;
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
    pub async fn create(&self, spec: &CreateContainer) -> Result<Container, RuntimeError> {
        self.op(async {
            match &self.backend {
                Backend::Docker(d) => {
                    let c = d.create(spec).await?;
                    self.cache.upsert(c.clone());
                    Ok(c)
                }
                Backend::Simulated(s) => s.create(&self.cache, spec),
            }
        })
        .await
    }

    /// Starts a created or exited container: a restart in place.
    pub async fn start(&self, id: &str) -> Result<(), RuntimeError> {
        match &self.backend {
            Backend::Docker(d) => {
                self.op(d.start(id)).await?;
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
            Backend::Simulated(s) => self.op(async { s.start(&self.cache, id) }).await,
        }
    }

    pub async fn unpause(&self, id: &str) -> Result<(), RuntimeError> {
        self.op(async {
            match &self.backend {
                Backend::Docker(d) => {
                    d.unpause(id).await?;
                    self.cache.update(id, |c| c.state = ContainerState::Running);
                    Ok(())
                }
                Backend::Simulated(s) => s.unpause(&self.cache, id),
            }
        })
        .await
    }

    /// Stops (grace period first) and removes a container. The stop runs
    /// outside the parallelism limit: a machine taking its whole grace
    /// period must not hold up creations.
    pub async fn remove(&self, id: &str, stop_timeout_secs: i64) -> Result<(), RuntimeError> {
        match &self.backend {
            Backend::Docker(d) => {
                d.remove(id, stop_timeout_secs).await?;
                if let Some(pool) = self.cache.forget(id) {
                    tracing::debug!(engine = %self.name, pool, container = id, "container removed");
                }
                Ok(())
            }
            Backend::Simulated(s) => s.remove(&self.cache, id),
        }
    }

    /// Keeps the cache current until `cancel`: the informer.
    pub async fn watch(&self, cancel: CancellationToken) {
        let Backend::Docker(docker) = &self.backend else { return };
        let mut retry = FIRST_RETRY;
        loop {
            let broke = tokio::select! {
                _ = cancel.cancelled() => return,
                e = self.follow(docker) => e,
            };
            self.lost_contact(&broke);
            docker.reset().await;
            if self.reachable() {
                retry = FIRST_RETRY;
            }
            let jittered = retry.mul_f64(rand::rng().random_range(0.5..=1.0));
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(jittered) => {}
            }
            retry = (retry * 2).min(MAX_RETRY);
        }
    }

    /// Lists, then follows events until the engine stops answering.
    async fn follow(&self, docker: &DockerBackend) -> RuntimeError {
        // Subscribe from a second before the list, so that no change falls
        // between the two; replayed events only cause a fresh inspect.
        let since = Utc::now().timestamp() - 1;
        let mut events = match docker.events(since).await {
            Ok(e) => Box::pin(e),
            Err(e) => return e,
        };
        let version = match docker.version().await {
            Ok(v) => v,
            Err(e) => return e,
        };
        let listed = match docker.list_all().await {
            Ok(l) => l,
            Err(e) => return e,
        };
        for pool in self.cache.replace_all(listed) {
            self.wake(Some(pool));
        }
        self.reached(Some(version));
        let mut ping = tokio::time::interval(PING_EVERY);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                next = events.next() => match next {
                    Some(Ok(Some(ev))) => {
                        if let Err(e) = self.apply(docker, ev).await {
                            return e;
                        }
                        self.reached(None);
                    }
                    Some(Ok(None)) => {}
                    Some(Err(e)) => return e,
                    None => return RuntimeError::Unavailable("the engine closed its event stream".into()),
                },
                _ = ping.tick() => {
                    if let Err(e) = docker.ping().await {
                        return e;
                    }
                    self.reached(None);
                }
            }
        }
    }

    async fn apply(&self, docker: &DockerBackend, ev: ContainerEvent) -> Result<(), RuntimeError> {
        let pool = if ev.destroyed { self.cache.remove(&ev.id) } else { self.refresh(docker, &ev.id).await? };
        self.wake(pool);
        Ok(())
    }

    /// Puts in the cache what the engine reports of container `id` now (or
    /// drops it, if the engine no longer has it); answers the pool it
    /// belongs to.
    async fn refresh(&self, docker: &DockerBackend, id: &str) -> Result<Option<String>, RuntimeError> {
        Ok(match docker.inspect(id.to_owned()).await? {
            Some(c) => self.cache.upsert(c),
            None => self.cache.remove(id),
        })
    }

    // ---- simulated engines: what tests and demos do to them ---------------

    fn simulated(&self) -> Option<&SimulatedBackend> {
        match &self.backend {
            Backend::Simulated(s) => Some(s),
            Backend::Docker(_) => None,
        }
    }

    /// Switches a simulated engine off (a lost host) or back on.
    pub fn simulate_outage(&self, down: bool) {
        let Some(sim) = self.simulated() else { return };
        sim.set_down(down);
        if down {
            self.lost_contact(&RuntimeError::Unavailable("the simulated engine is switched off".into()));
        } else {
            self.reached(None);
        }
    }

    /// Changes a simulated container behind drover's back, as `docker
    /// stop`, `kill` or `pause` would.
    pub fn simulate_change(&self, id: &str, change: impl FnOnce(&mut Container)) {
        if self.simulated().is_some() {
            let pool = self.cache.update(id, change);
            self.wake(pool);
        }
    }

    /// Removes a simulated container behind drover's back (`docker rm -f`).
    pub fn simulate_removal(&self, id: &str) {
        if self.simulated().is_some() {
            let pool = self.cache.remove(id);
            self.wake(pool);
        }
    }
}
