//! What every engine and its callers share: a container as drover sees it,
//! what creating one takes, the errors of an engine, and the labels that
//! tie a container to its pool.

use std::collections::HashMap;

use chrono::{DateTime, Utc};

use crate::domain::object::{Namespace, PoolRef};
use crate::domain::pool::Mount;

/// Labels drover puts on every container it creates. The pool label makes
/// the engines, not SQLite, the source of truth for which machines exist.
pub mod labels {
    /// Name of the pool a container belongs to.
    pub const POOL: &str = "drover.dev/pool";
    /// Namespace of that pool. A container without it is of `default`:
    /// machines created before namespaces keep running as they are.
    pub const NAMESPACE: &str = "drover.dev/namespace";
    /// Name of the engine that created it: two registrations of one Docker
    /// daemon (a socket and a TCP address, say) each own only theirs.
    pub const ENGINE: &str = "drover.dev/engine";
    /// Failure domain the container was placed in.
    pub const FAILURE_DOMAIN: &str = "drover.dev/failure-domain";
    /// Marks containers drover created itself (adopted ones lack it).
    pub const MANAGED_BY: &str = "drover.dev/managed-by";
    pub const MANAGED_BY_VALUE: &str = "drover";
}

/// The daemon that answers at an engine's endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Daemon {
    /// Its unique ID (the `ID` of Docker's `GET /info`); `None` from an
    /// engine that does not report one.
    pub id: Option<String>,
    pub version: String,
}

/// A container's state as the engine reports it.
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

/// A container as its engine last reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Container {
    pub id: String,
    pub name: String,
    pub image: String,
    pub labels: HashMap<String, String>,
    pub state: ContainerState,
    pub health: HealthState,
    /// Exit code of the last run, once it has exited.
    pub exit_code: Option<i64>,
    /// The kernel killed the last run for lack of memory.
    pub oom_killed: bool,
    pub created_at: DateTime<Utc>,
    /// When the current (or last) run started; `None` if it never did.
    pub started_at: Option<DateTime<Utc>>,
    /// When the last run ended; `None` while the first run goes on.
    pub finished_at: Option<DateTime<Utc>>,
}

impl Container {
    /// A container just created from `spec`, not started yet.
    pub fn created(id: String, spec: &CreateContainer, now: DateTime<Utc>) -> Self {
        Self {
            id,
            name: spec.name.clone(),
            image: spec.image.clone(),
            labels: spec.labels.clone(),
            state: ContainerState::Created,
            health: HealthState::None,
            exit_code: None,
            oom_killed: false,
            created_at: now,
            started_at: None,
            finished_at: None,
        }
    }

    /// The pool it belongs to: its namespace and pool labels (no namespace
    /// label: `default`). A namespace label that is no namespace's name
    /// (written by hand) ties the container to no pool.
    pub fn pool(&self) -> Option<PoolRef> {
        let name = self.labels.get(labels::POOL)?;
        let namespace = match self.labels.get(labels::NAMESPACE) {
            None => Namespace::default(),
            Some(ns) => Namespace::parse(ns).ok()?,
        };
        Some(PoolRef::new(namespace, name.clone()))
    }

    pub fn failure_domain(&self) -> Option<&str> {
        self.labels.get(labels::FAILURE_DOMAIN).map(String::as_str)
    }

    pub fn managed_by_drover(&self) -> bool {
        self.labels.get(labels::MANAGED_BY).map(String::as_str) == Some(labels::MANAGED_BY_VALUE)
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

/// Asked by every operation that changes an engine once the operation has
/// its turn (after any wait for one of the engine's slots) and right before
/// it is sent: whether the caller may still act. A pass holds its pool
/// through a lease that can end while it waits; `false` leaves the
/// operation unsent, as [`RuntimeError::Fenced`].
pub type Gate<'a> = &'a (dyn Fn() -> bool + Sync);

#[derive(Debug, Clone, thiserror::Error)]
pub enum RuntimeError {
    /// The engine cannot be reached at all; retry later.
    #[error("container engine unavailable: {0}")]
    Unavailable(String),
    #[error("image {0:?} is not available to the engine (no registry can be reached to pull it)")]
    ImageMissing(String),
    /// A container of that name exists already.
    #[error("container name {0:?} is already in use")]
    NameInUse(String),
    #[error("container engine error: {0}")]
    Api(String),
    /// Not sent: the caller's right to act ended while the operation
    /// waited for its turn (see [`Gate`]).
    #[error("not sent: the caller may no longer act on this pool")]
    Fenced,
}

/// What an engine's events ask the reconciler to look at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wake {
    Pool(PoolRef),
    /// A pool, woken by the work of a traced span (a request): its next
    /// pass links to that span, so the trace shows what the change led to.
    Traced {
        pool: PoolRef,
        by: opentelemetry::trace::SpanContext,
    },
    /// Look at every pool (the engines or their settings changed).
    All,
    /// An engine's reachability changed: every pool is looked at, and the
    /// engine's events tell it.
    Engine {
        name: String,
        change: EngineChange,
        message: String,
    },
}

/// What happened to an engine, as its events tell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineChange {
    /// It answers (again).
    Reachable,
    /// It stopped answering, or never answered.
    Unreachable,
    /// It has not answered for `--engine-lost-after`.
    Lost,
}

/// Parses the engine's RFC 3339 timestamps; Docker writes the zero time
/// (`0001-01-01T00:00:00Z`) for "never", which reads as `None`.
pub(crate) fn parse_engine_time(s: Option<&str>) -> Option<DateTime<Utc>> {
    let t = DateTime::parse_from_rfc3339(s?).ok()?.with_timezone(&Utc);
    (t.timestamp() > 0).then_some(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_times_parse_and_the_zero_time_means_never() {
        let t = parse_engine_time(Some("2026-12-03T09:23:00.123456789Z")).unwrap();
        assert_eq!(t.timestamp(), 1796289780);
        assert_eq!(parse_engine_time(Some("0001-01-01T00:00:00Z")), None);
        assert_eq!(parse_engine_time(Some("garbage")), None);
        assert_eq!(parse_engine_time(None), None);
    }
}
