//! What tests and demos do to a simulated engine behind drover's back: an
//! outage, a container changed or removed. Apart from the engine's own
//! code, so that nothing in production calls them by accident; on a Docker
//! engine there is no simulation to reach.

use super::Engine;
use crate::runtime::{Backend, Container, RuntimeError};

/// A simulated engine, to act on as the world would.
pub struct Simulation<'a> {
    engine: &'a Engine,
    backend: &'a crate::runtime::simulated::SimulatedBackend,
}

impl Engine {
    /// The simulation behind a simulated engine; `None` for a Docker engine.
    pub fn simulation(&self) -> Option<Simulation<'_>> {
        match &self.backend {
            Backend::Simulated(backend) => Some(Simulation { engine: self, backend }),
            Backend::Docker(_) => None,
        }
    }
}

impl Simulation<'_> {
    /// Switches the engine off (a lost host) or back on.
    pub fn outage(&self, down: bool) {
        self.backend.set_down(down);
        if down {
            self.engine.lost_contact(&RuntimeError::Unavailable("the simulated engine is switched off".into()));
        } else {
            self.engine.reached(None);
        }
    }

    /// Makes the engine's endpoint reach another daemon, as a rebuilt host
    /// or a reused address would.
    pub fn replace_daemon(&self, id: &str) {
        self.backend.set_daemon_id(id.to_owned());
        self.engine.identified(Some(id.to_owned()));
    }

    /// Changes a container, as `docker stop`, `kill` or `pause` would.
    pub fn change(&self, id: &str, change: impl FnOnce(&mut Container)) {
        let pool = self.engine.cache.update(id, change);
        self.engine.wake(pool);
    }

    /// Removes a container (`docker rm -f`).
    pub fn remove(&self, id: &str) {
        let pool = self.engine.cache.remove(id);
        self.engine.wake(pool);
    }
}
