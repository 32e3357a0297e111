//! The set of engines drover drives, each with its own informer task, so
//! that listing, events and container operations of one slow or lost engine
//! never stall the others.

use crate::domain::object::PoolRef;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::engine::{Engine, EngineSettings, Signals};
use crate::runtime::{Backend, Container, RuntimeError, Wake};

/// The engine of `--docker-host` (or the simulated one): always there.
pub const LOCAL_ENGINE: &str = "local";

#[derive(Clone)]
pub struct EngineSet {
    inner: Arc<Inner>,
}

struct Inner {
    engines: RwLock<BTreeMap<String, Arc<Engine>>>,
    signals: Signals,
    settings: EngineSettings,
    /// Set once the service runs: informers of engines added later start at once.
    running: Mutex<Option<(CancellationToken, TaskTracker)>>,
    /// Stops one engine's informer when the engine is removed.
    informers: Mutex<HashMap<String, CancellationToken>>,
}

impl EngineSet {
    pub fn new(wakes: mpsc::UnboundedSender<Wake>, settings: EngineSettings) -> Self {
        Self {
            inner: Arc::new(Inner {
                engines: RwLock::new(BTreeMap::new()),
                signals: Signals { wakes, identities: Arc::default() },
                settings,
                running: Mutex::new(None),
                informers: Mutex::new(HashMap::new()),
            }),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Arc<Engine>>> {
        self.inner.engines.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds (or replaces) an engine and starts its informer when the
    /// service already runs.
    pub fn add(&self, name: &str, labels: BTreeMap<String, String>, backend: Backend) -> Arc<Engine> {
        let signals = self.inner.signals.clone();
        let engine = Arc::new(Engine::new(name.to_owned(), labels, backend, self.inner.settings, signals));
        let replaced =
            self.inner.engines.write().unwrap_or_else(|p| p.into_inner()).insert(name.to_owned(), engine.clone());
        if replaced.is_some() {
            self.stop_informer(name);
        }
        let running = self.inner.running.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some((cancel, tasks)) = running {
            self.spawn_informer(&engine, &cancel, &tasks);
        }
        engine
    }

    /// Forgets an engine and stops its informer.
    pub fn remove(&self, name: &str) -> Option<Arc<Engine>> {
        let removed = self.inner.engines.write().unwrap_or_else(|p| p.into_inner()).remove(name);
        self.stop_informer(name);
        removed
    }

    fn stop_informer(&self, name: &str) {
        if let Some(token) = self.inner.informers.lock().unwrap_or_else(|p| p.into_inner()).remove(name) {
            token.cancel();
        }
    }

    fn spawn_informer(&self, engine: &Arc<Engine>, cancel: &CancellationToken, tasks: &TaskTracker) {
        let token = cancel.child_token();
        self.inner.informers.lock().unwrap_or_else(|p| p.into_inner()).insert(engine.name.clone(), token.clone());
        let engine = engine.clone();
        tasks.spawn(async move { engine.watch(token).await });
    }

    /// Starts every informer; they stop on `cancel`.
    pub fn start(&self, cancel: &CancellationToken, tasks: &TaskTracker) {
        *self.inner.running.lock().unwrap_or_else(|p| p.into_inner()) = Some((cancel.clone(), tasks.clone()));
        for engine in self.all() {
            self.spawn_informer(&engine, cancel, tasks);
        }
    }

    /// Notified when an engine's endpoint reports another daemon.
    pub fn identities(&self) -> Arc<tokio::sync::Notify> {
        self.inner.signals.identities.clone()
    }

    pub fn get(&self, name: &str) -> Option<Arc<Engine>> {
        self.read().get(name).cloned()
    }

    pub fn all(&self) -> Vec<Arc<Engine>> {
        self.read().values().cloned().collect()
    }

    pub fn local(&self) -> Option<Arc<Engine>> {
        self.get(LOCAL_ENGINE)
    }

    /// Reads `pool`'s containers again from every engine that answers (an
    /// engine that does not is not looked at by a pass anyway).
    pub async fn relist_pool(&self, pool: &PoolRef) -> Result<(), RuntimeError> {
        let engines: Vec<Arc<Engine>> = self.all().into_iter().filter(|e| e.reachable()).collect();
        let lists = futures_util::future::join_all(engines.iter().map(|e| e.relist_pool(pool))).await;
        lists.into_iter().collect()
    }

    /// Every container of `pool`, on every engine, with its engine.
    pub fn containers_of(&self, pool: &PoolRef) -> Vec<(Arc<Engine>, Container)> {
        self.all().into_iter().flat_map(|e| e.containers(pool).into_iter().map(move |c| (e.clone(), c))).collect()
    }
}
