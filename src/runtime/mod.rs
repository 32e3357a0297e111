//! The container runtime drover drives: the Docker Engine in production, an
//! in-memory simulation for trying drover out and for scale tests.
//!
//! Dispatch is an enum rather than a trait object: there are exactly two
//! runtimes and both are known at compile time.

pub mod docker;
pub mod simulated;

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use tokio::sync::mpsc;

use crate::domain::pool::Mount;

/// Labels drover puts on every container it creates. The pool label makes
/// Docker, not SQLite, the source of truth for which machines exist.
pub mod labels {
    /// Name of the pool a container belongs to.
    pub const POOL: &str = "drover.dev/pool";
    /// Failure domain the container was placed in.
    pub const FAILURE_DOMAIN: &str = "drover.dev/failure-domain";
    /// Marks containers drover created itself (adopted ones lack it).
    pub const MANAGED_BY: &str = "drover.dev/managed-by";
    pub const MANAGED_BY_VALUE: &str = "drover";
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ContainerState {
    Created,
    Running,
    Paused,
    Restarting,
    Exited,
    Removing,
    Dead,
    Unknown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum HealthState {
    /// The image has no health check.
    None,
    Starting,
    Healthy,
    Unhealthy,
}

/// A container as the runtime reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Container {
    pub id: String,
    pub name: String,
    pub image: String,
    pub labels: HashMap<String, String>,
    pub state: ContainerState,
    pub health: HealthState,
    pub created_at: DateTime<Utc>,
}

impl Container {
    /// Running and, where the image has a health check, healthy.
    pub fn ready(&self) -> bool {
        self.state == ContainerState::Running && matches!(self.health, HealthState::None | HealthState::Healthy)
    }

    pub fn pool(&self) -> Option<&str> {
        self.labels.get(labels::POOL).map(String::as_str)
    }

    pub fn failure_domain(&self) -> Option<&str> {
        self.labels.get(labels::FAILURE_DOMAIN).map(String::as_str)
    }
}

/// Everything needed to create one machine's container.
#[derive(Debug, Clone)]
pub struct CreateContainer {
    pub name: String,
    pub image: String,
    pub labels: HashMap<String, String>,
    pub mounts: Vec<Mount>,
    pub stop_timeout_secs: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The runtime cannot be reached at all; retry later.
    #[error("container runtime unavailable: {0}")]
    Unavailable(String),
    #[error("image {0:?} is not available to the engine (no registry can be reached to pull it)")]
    ImageMissing(String),
    /// A container of that name exists already.
    #[error("container name {0:?} is already in use")]
    NameInUse(String),
    #[error("container runtime error: {0}")]
    Api(String),
}

/// What a runtime event asks the reconciler to look at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wake {
    Pool(String),
    /// Events may have been missed: look at every pool.
    All,
}

#[derive(Clone)]
pub enum Runtime {
    Docker(docker::DockerRuntime),
    Simulated(simulated::SimulatedRuntime),
}

impl Runtime {
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Docker(_) => "docker",
            Self::Simulated(_) => "simulated",
        }
    }

    /// Is the runtime reachable?
    pub async fn ping(&self) -> Result<(), RuntimeError> {
        match self {
            Self::Docker(d) => d.ping().await,
            Self::Simulated(s) => s.ping(),
        }
    }

    /// Every container, running or not, that carries `pool`'s label.
    pub async fn list_pool(&self, pool: &str) -> Result<Vec<Container>, RuntimeError> {
        match self {
            Self::Docker(d) => d.list_pool(pool).await,
            Self::Simulated(s) => s.list_pool(pool),
        }
    }

    /// Creates and starts a container.
    pub async fn create(&self, spec: &CreateContainer) -> Result<Container, RuntimeError> {
        match self {
            Self::Docker(d) => d.create(spec).await,
            Self::Simulated(s) => s.create(spec),
        }
    }

    /// Starts a created container; when it cannot start, removes it so that
    /// it is replaced rather than left half-made.
    pub async fn start(&self, id: &str, stop_timeout_secs: i64) -> Result<(), RuntimeError> {
        match self {
            Self::Docker(d) => d.start(id, stop_timeout_secs).await,
            Self::Simulated(s) => s.start(id),
        }
    }

    /// Stops and removes a container; one already gone counts as removed.
    pub async fn remove(&self, id: &str, stop_timeout_secs: i64) -> Result<(), RuntimeError> {
        match self {
            Self::Docker(d) => d.remove(id, stop_timeout_secs).await,
            Self::Simulated(s) => s.remove(id),
        }
    }

    /// Reports every container event of a labelled container (start, die,
    /// destroy, health change) to `tx` as the pool to look at, until `cancel`.
    /// Reconnects by itself when the runtime goes away and comes back, and
    /// then asks for every pool to be looked at, since events were missed.
    pub async fn watch(&self, tx: mpsc::UnboundedSender<Wake>, cancel: tokio_util::sync::CancellationToken) {
        match self {
            Self::Docker(d) => d.watch(tx, cancel).await,
            Self::Simulated(s) => s.watch(tx, cancel).await,
        }
    }
}
