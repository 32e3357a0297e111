//! A simulated engine: containers are records in the engine's cache that
//! start running at once. It lets people try drover without Docker and lets
//! scale tests run a hundred thousand machines; it is chosen only by
//! `--runtime simulated` (and `sim://` engines on such a server).
//!
//! Rules that make failures reproducible without Docker:
//! - a container whose image name contains `crash` exits at once with
//!   code 1, every time it is started (see [`CRASHING_IMAGE_MARK`]);
//! - the engine can be switched off and on, as a lost host would be;
//! - its daemon ID is its endpoint (`sim://name`) until a test changes it,
//!   as if the endpoint now reached another host.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use chrono::{DateTime, Utc};

use crate::clock::Clock;

use super::cache::ContainerCache;
use super::container::{Container, ContainerState, CreateContainer, Daemon, RuntimeError};

/// Images whose name contains this create containers that exit at once:
/// how tests (and demos) get a rollout that never becomes ready.
pub const CRASHING_IMAGE_MARK: &str = "crash";

#[derive(Default)]
pub struct SimulatedBackend {
    /// Switched off: every call fails as if the host were gone.
    down: AtomicBool,
    /// Container ids are a counter: unique, short, cheap to hold by the 100,000.
    next_id: AtomicU64,
    /// What time the engine says it is (tests move it by hand).
    clock: Clock,
    /// The ID it reports for its daemon; `None` until set.
    daemon_id: std::sync::Mutex<Option<String>>,
}

impl SimulatedBackend {
    pub fn with_clock(clock: Clock) -> Self {
        Self { clock, ..Self::default() }
    }

    /// An engine reached at `endpoint`, which is also its daemon's ID.
    pub fn at(endpoint: &str) -> Self {
        let backend = Self::default();
        backend.set_daemon_id(endpoint.to_owned());
        backend
    }

    /// Makes the engine report another daemon ID, as an endpoint that now
    /// reaches another host would.
    pub fn set_daemon_id(&self, id: String) {
        *self.daemon_id.lock().unwrap_or_else(|p| p.into_inner()) = Some(id);
    }

    pub fn daemon_id(&self) -> Option<String> {
        self.daemon_id.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn daemon(&self) -> Result<Daemon, RuntimeError> {
        self.check()?;
        Ok(Daemon { id: self.daemon_id(), version: "simulated".into() })
    }

    fn check(&self) -> Result<(), RuntimeError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(RuntimeError::Unavailable("the simulated engine is switched off".into()));
        }
        Ok(())
    }

    pub fn is_down(&self) -> bool {
        self.down.load(Ordering::SeqCst)
    }

    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    pub fn ping(&self) -> Result<(), RuntimeError> {
        self.check()
    }

    pub fn create(&self, cache: &ContainerCache, spec: &CreateContainer) -> Result<Container, RuntimeError> {
        self.check()?;
        // As Docker: a name is unique on its engine, whatever the pool.
        if cache.has_name(&spec.name) {
            return Err(RuntimeError::NameInUse(spec.name.clone()));
        }
        let id = format!("sim{:013x}", self.next_id.fetch_add(1, Ordering::Relaxed));
        let now = self.clock.now();
        let mut c = Container::created(id, spec, now);
        run(&mut c, now);
        cache.upsert(c.clone());
        Ok(c)
    }

    pub fn start(&self, cache: &ContainerCache, id: &str) -> Result<(), RuntimeError> {
        self.check()?;
        let now = self.clock.now();
        cache.update(id, |c| {
            if c.state != ContainerState::Running {
                run(c, now);
            }
        });
        Ok(())
    }

    pub fn unpause(&self, cache: &ContainerCache, id: &str) -> Result<(), RuntimeError> {
        self.check()?;
        cache.update(id, |c| {
            if c.state == ContainerState::Paused {
                c.state = ContainerState::Running;
            }
        });
        Ok(())
    }

    pub fn remove(&self, cache: &ContainerCache, id: &str) -> Result<(), RuntimeError> {
        self.check()?;
        cache.remove(id);
        Ok(())
    }
}

/// Starts a container's process: it runs, unless its image crashes.
fn run(c: &mut Container, now: DateTime<Utc>) {
    c.started_at = Some(now);
    if c.image.contains(CRASHING_IMAGE_MARK) {
        c.state = ContainerState::Exited;
        c.exit_code = Some(1);
        c.finished_at = Some(now);
    } else {
        c.state = ContainerState::Running;
    }
}
