//! An in-memory runtime: containers are records that start running at
//! once. It lets people try drover without Docker and lets scale tests run
//! thousands of machines; it is chosen only by `--runtime simulated`.
//!
//! One rule makes failures reproducible without Docker: a container whose
//! image name contains `crash` is created `Exited`, as if its process died
//! at once, so its machine never becomes ready (see [`CRASHING_IMAGE_MARK`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use chrono::Utc;
use rand::Rng;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use super::{Container, ContainerState, CreateContainer, HealthState, RuntimeError, Wake};

/// Images whose name contains this create containers that have exited:
/// how tests (and demos) get a rollout that never becomes ready.
pub const CRASHING_IMAGE_MARK: &str = "crash";

#[derive(Clone)]
pub struct SimulatedRuntime {
    inner: Arc<Inner>,
}

struct Inner {
    containers: Mutex<HashMap<String, Container>>,
    /// Pool names of container changes, for `watch`.
    events: broadcast::Sender<String>,
}

impl Default for SimulatedRuntime {
    fn default() -> Self {
        Self { inner: Arc::new(Inner { containers: Mutex::new(HashMap::new()), events: broadcast::channel(1024).0 }) }
    }
}

impl SimulatedRuntime {
    fn containers(&self) -> MutexGuard<'_, HashMap<String, Container>> {
        // A poisoned lock only means a panic elsewhere mid-update of a plain
        // map; the map itself is still usable.
        self.inner.containers.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn notify(&self, c: &Container) {
        if let Some(pool) = c.pool() {
            let _ = self.inner.events.send(pool.to_owned());
        }
    }

    pub fn ping(&self) -> Result<(), RuntimeError> {
        Ok(())
    }

    pub fn list_pool(&self, pool: &str) -> Result<Vec<Container>, RuntimeError> {
        Ok(self.containers().values().filter(|c| c.pool() == Some(pool)).cloned().collect())
    }

    pub fn create(&self, spec: &CreateContainer) -> Result<Container, RuntimeError> {
        let mut all = self.containers();
        if all.values().any(|c| c.name == spec.name) {
            return Err(RuntimeError::NameInUse(spec.name.clone()));
        }
        let id: String =
            (0..64).map(|_| char::from_digit(rand::rng().random_range(0..16), 16).unwrap_or('0')).collect();
        let c = Container {
            id: id.clone(),
            name: spec.name.clone(),
            image: spec.image.clone(),
            labels: spec.labels.clone(),
            state: if spec.image.contains(CRASHING_IMAGE_MARK) {
                ContainerState::Exited
            } else {
                ContainerState::Running
            },
            health: HealthState::None,
            created_at: Utc::now(),
        };
        all.insert(id, c.clone());
        drop(all);
        self.notify(&c);
        Ok(c)
    }

    pub fn start(&self, id: &str) -> Result<(), RuntimeError> {
        self.set_state(id, ContainerState::Running);
        Ok(())
    }

    pub fn remove(&self, id: &str) -> Result<(), RuntimeError> {
        let removed = self.containers().remove(id);
        if let Some(c) = removed {
            self.notify(&c);
        }
        Ok(())
    }

    /// Sets a container's state, as a crash or a health check would.
    pub fn set_state(&self, id: &str, state: ContainerState) {
        let changed = self.containers().get_mut(id).map(|c| {
            c.state = state;
            c.clone()
        });
        if let Some(c) = changed {
            self.notify(&c);
        }
    }

    pub async fn watch(&self, tx: mpsc::UnboundedSender<Wake>, cancel: CancellationToken) {
        let mut rx = self.inner.events.subscribe();
        loop {
            let wake = tokio::select! {
                _ = cancel.cancelled() => return,
                ev = rx.recv() => match ev {
                    Ok(pool) => Wake::Pool(pool),
                    Err(broadcast::error::RecvError::Lagged(_)) => Wake::All,
                    Err(broadcast::error::RecvError::Closed) => return,
                },
            };
            if tx.send(wake).is_err() {
                return;
            }
        }
    }
}
