//! The container engines drover drives: Docker Engines (through bollard) in
//! production, in-memory simulated engines for trying drover out and for
//! scale tests.
//!
//! Each engine keeps a [`cache::ContainerCache`] of the pool-labelled
//! containers it holds, filled by one list and then kept current by the
//! engine's event stream (an informer, as kube-runtime's reflector is for
//! Kubernetes). Reconcile passes read the cache, never the engine, so a pass
//! costs no engine call unless it acts; and they decide from what the engine
//! reported, not from what drover last did.

pub mod cache;
mod container;
pub mod docker;
pub mod simulated;

pub use container::{
    Container, ContainerState, CreateContainer, Daemon, EngineChange, Gate, HealthState, RuntimeError, Wake, labels,
};

/// How an engine is reached: a Docker Engine, or the simulation.
pub enum Backend {
    Docker(docker::DockerBackend),
    Simulated(simulated::SimulatedBackend),
}

impl Backend {
    /// Asks the endpoint which daemon answers there.
    pub async fn daemon(&self) -> Result<Daemon, RuntimeError> {
        match self {
            Self::Docker(d) => d.daemon().await,
            Self::Simulated(s) => s.daemon(),
        }
    }
}
