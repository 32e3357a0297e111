//! One Docker Engine, through bollard: the calls drover makes, each mapped
//! to [`RuntimeError`], and what the engine reports turned into
//! [`Container`]s. Keeping the engine's view current (list, then events) is
//! the informer's job in `engine.rs`.
//!
//! The engine on a host may speak an older API than bollard's default, so
//! the client negotiates the version on first use; until the engine answers,
//! every call fails with `RuntimeError::Unavailable`. Nothing here panics
//! when the engine is missing.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bollard::Docker;
use bollard::errors::Error as BollardError;
use bollard::models::{
    ContainerCreateBody, ContainerInspectResponse, ContainerStateStatusEnum, EventMessage, HealthStatusEnum,
    HostConfig, MountType,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, EventsOptionsBuilder, ListContainersOptionsBuilder, RemoveContainerOptionsBuilder,
    StopContainerOptionsBuilder,
};
use chrono::DateTime;
use futures_util::{Stream, StreamExt};
use tokio::sync::Mutex;

use super::container::{
    Container, ContainerState, CreateContainer, Daemon, Gate, HealthState, RuntimeError, labels, parse_engine_time,
};

/// Longest wait for the engine to answer the version handshake.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait for one engine call; stop adds the stop timeout.
const CALL_TIMEOUT: u64 = 60;

/// How to reach an engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// `DOCKER_HOST`, then the local socket.
    Default,
    /// `unix:///path` or `tcp://host:port` without TLS.
    Plain(String),
    /// `tcp://host:port` with a client certificate; the files hold PEM.
    Tls { address: String, key: PathBuf, cert: PathBuf, ca: PathBuf },
}

impl Endpoint {
    /// The address, for logs and status (never a credential).
    pub fn address(&self) -> String {
        match self {
            Self::Default => std::env::var("DOCKER_HOST").unwrap_or_else(|_| "unix:///var/run/docker.sock".into()),
            Self::Plain(a) | Self::Tls { address: a, .. } => a.clone(),
        }
    }
}

#[derive(Clone)]
pub struct DockerBackend {
    endpoint: Endpoint,
    /// The client, once the engine answered the version handshake.
    client: Arc<Mutex<Option<Docker>>>,
}

/// A container event: which container, and whether it is gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerEvent {
    pub id: String,
    pub destroyed: bool,
}

impl DockerBackend {
    pub fn new(endpoint: Endpoint) -> Self {
        Self { endpoint, client: Arc::new(Mutex::new(None)) }
    }

    pub fn address(&self) -> String {
        self.endpoint.address()
    }

    async fn client(&self) -> Result<Docker, RuntimeError> {
        let mut slot = self.client.lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let address = self.address();
        let unavailable = |e: BollardError| RuntimeError::Unavailable(format!("{address}: {e}"));
        let base = match &self.endpoint {
            Endpoint::Default => Docker::connect_with_defaults(),
            Endpoint::Plain(h) => Docker::connect_with_host(h),
            Endpoint::Tls { address, key, cert, ca } => {
                Docker::connect_with_ssl(address, key, cert, ca, CALL_TIMEOUT, bollard::API_DEFAULT_VERSION)
            }
        }
        .map_err(unavailable)?
        .with_timeout(Duration::from_secs(CALL_TIMEOUT));
        let negotiated = tokio::time::timeout(CONNECT_TIMEOUT, base.negotiate_version())
            .await
            .map_err(|_| RuntimeError::Unavailable(format!("{address}: no answer within {CONNECT_TIMEOUT:?}")))?
            .map_err(unavailable)?;
        *slot = Some(negotiated.clone());
        Ok(negotiated)
    }

    /// Forgets the negotiated client, so that the next call connects anew
    /// (after the engine was restarted or upgraded).
    pub async fn reset(&self) {
        *self.client.lock().await = None;
    }

    pub async fn ping(&self) -> Result<(), RuntimeError> {
        let client = self.client().await?;
        tokio::time::timeout(CONNECT_TIMEOUT, client.ping())
            .await
            .map_err(|_| RuntimeError::Unavailable(format!("{}: no answer to ping", self.address())))?
            .map(|_| ())
            .map_err(map_err)
    }

    /// Which daemon answers at this endpoint (`GET /info`): its ID and
    /// version.
    pub async fn daemon(&self) -> Result<Daemon, RuntimeError> {
        let client = self.client().await?;
        let info = client.info().await.map_err(map_err)?;
        Ok(Daemon {
            id: info.id.filter(|id| !id.is_empty()),
            version: info.server_version.unwrap_or_else(|| "unknown".into()),
        })
    }

    /// Every container carrying a pool label, inspected.
    pub async fn list_all(&self) -> Result<Vec<Container>, RuntimeError> {
        self.list_labelled(labels::POOL.to_owned()).await
    }

    /// The containers of one pool, as the engine sees them now.
    pub async fn list_pool(&self, pool: &str) -> Result<Vec<Container>, RuntimeError> {
        self.list_labelled(format!("{}={pool}", labels::POOL)).await
    }

    /// Containers with `label` (`key` or `key=value`), each inspected.
    async fn list_labelled(&self, label: String) -> Result<Vec<Container>, RuntimeError> {
        let client = self.client().await?;
        let filters = HashMap::from([("label".to_owned(), vec![label])]);
        let opts = ListContainersOptionsBuilder::default().all(true).filters(&filters).build();
        let ids: Vec<String> =
            client.list_containers(Some(opts)).await.map_err(map_err)?.into_iter().filter_map(|s| s.id).collect();
        let inspected: Vec<Result<Option<Container>, RuntimeError>> =
            futures_util::stream::iter(ids).map(|id| self.inspect(id)).buffer_unordered(8).collect().await;
        let mut containers = Vec::with_capacity(inspected.len());
        for c in inspected {
            containers.extend(c?);
        }
        Ok(containers)
    }

    /// One container as the engine sees it now; `None` when it is gone.
    pub async fn inspect(&self, id: String) -> Result<Option<Container>, RuntimeError> {
        let client = self.client().await?;
        match client.inspect_container(&id, None).await {
            Ok(c) => Ok(from_inspect(c)),
            Err(BollardError::DockerResponseServerError { status_code: 404, .. }) => Ok(None),
            Err(e) => Err(map_err(e)),
        }
    }

    /// Container events of pool-labelled containers from `since` (seconds),
    /// the ones that change what drover sees.
    pub async fn events(
        &self,
        since: i64,
    ) -> Result<impl Stream<Item = Result<Option<ContainerEvent>, RuntimeError>> + use<>, RuntimeError> {
        let client = self.client().await?;
        let filters = HashMap::from([
            ("type".to_owned(), vec!["container".to_owned()]),
            ("label".to_owned(), vec![labels::POOL.to_owned()]),
        ]);
        let opts = EventsOptionsBuilder::default().since(&since.to_string()).filters(&filters).build();
        Ok(client.events(Some(opts)).map(|ev| ev.map(container_event).map_err(map_err)))
    }

    /// Creates a container, without starting it.
    pub async fn create(&self, spec: &CreateContainer) -> Result<Container, RuntimeError> {
        let client = self.client().await?;
        let mounts = spec
            .mounts
            .iter()
            .map(|m| bollard::models::Mount {
                target: Some(m.container_path.clone()),
                source: Some(m.host_path.clone()),
                typ: Some(MountType::BIND),
                read_only: Some(m.read_only),
                ..Default::default()
            })
            .collect();
        let body = ContainerCreateBody {
            image: Some(spec.image.clone()),
            hostname: Some(spec.name.clone()),
            labels: Some(spec.labels.clone()),
            stop_timeout: Some(spec.stop_timeout_secs),
            host_config: Some(HostConfig { mounts: Some(mounts), init: Some(false), ..Default::default() }),
            ..Default::default()
        };
        let opts = CreateContainerOptionsBuilder::default().name(&spec.name).build();
        let created = client.create_container(Some(opts), body).await.map_err(|e| match e {
            BollardError::DockerResponseServerError { status_code: 404, .. } => {
                RuntimeError::ImageMissing(spec.image.clone())
            }
            BollardError::DockerResponseServerError { status_code: 409, .. } => {
                RuntimeError::NameInUse(spec.name.clone())
            }
            other => map_err(other),
        })?;
        Ok(Container::created(created.id, spec, crate::clock::wall()))
    }

    /// Starts a created or exited container (a restart in place).
    pub async fn start(&self, id: &str) -> Result<(), RuntimeError> {
        let client = self.client().await?;
        match client.start_container(id, None).await {
            // 304: already started.
            Ok(()) | Err(BollardError::DockerResponseServerError { status_code: 304, .. }) => Ok(()),
            Err(e) => Err(map_err(e)),
        }
    }

    pub async fn unpause(&self, id: &str) -> Result<(), RuntimeError> {
        let client = self.client().await?;
        match client.unpause_container(id).await {
            // 409: not paused (any more).
            Ok(()) | Err(BollardError::DockerResponseServerError { status_code: 409, .. }) => Ok(()),
            Err(e) => Err(map_err(e)),
        }
    }

    /// Stops (with the grace period) and removes a container; one already
    /// gone counts as removed. `gate` is asked again between the two, as
    /// the stop may take the whole grace period. The stop has a span of its
    /// own under the removal's: a trace shows the grace period apart.
    pub async fn remove(&self, id: &str, stop_timeout_secs: i64, gate: Gate<'_>) -> Result<(), RuntimeError> {
        let client = self.client().await?;
        let t = i32::try_from(stop_timeout_secs).unwrap_or(i32::MAX);
        let stopping =
            tracing::info_span!("engine", otel.name = "engine stop", otel.kind = "client", grace_period_s = t);
        let stop = client.stop_container(id, Some(StopContainerOptionsBuilder::default().t(t).build()));
        match tracing::Instrument::instrument(stop, stopping).await {
            // 304: already stopped. 404: already gone.
            Ok(()) | Err(BollardError::DockerResponseServerError { status_code: 304 | 404, .. }) => {}
            Err(e) => return Err(map_err(e)),
        }
        if !gate() {
            return Err(RuntimeError::Fenced);
        }
        let opts = RemoveContainerOptionsBuilder::default().force(true).v(true).build();
        match client.remove_container(id, Some(opts)).await {
            // 404: gone. 409: removal already in progress.
            Ok(()) | Err(BollardError::DockerResponseServerError { status_code: 404 | 409, .. }) => Ok(()),
            Err(e) => Err(map_err(e)),
        }
    }
}

/// The actions after which a container may look different; the rest
/// (exec, attach, top, ...) change nothing drover sees.
fn container_event(ev: EventMessage) -> Option<ContainerEvent> {
    let action = ev.action?;
    let action = action.split(':').next().unwrap_or_default();
    let relevant = matches!(
        action,
        "create" | "start" | "restart" | "die" | "oom" | "pause" | "unpause" | "destroy" | "health_status" | "rename"
    );
    let id = ev.actor?.id?;
    relevant.then(|| ContainerEvent { id, destroyed: action == "destroy" })
}

pub(crate) fn map_err(e: BollardError) -> RuntimeError {
    match e {
        BollardError::DockerResponseServerError { status_code, message } => {
            RuntimeError::Api(format!("engine answered {status_code}: {message}"))
        }
        BollardError::JsonDataError { .. } | BollardError::JsonSerdeError { .. } => RuntimeError::Api(e.to_string()),
        // Everything else is about reaching the engine: sockets, timeouts, HTTP.
        other => RuntimeError::Unavailable(other.to_string()),
    }
}

fn from_inspect(c: ContainerInspectResponse) -> Option<Container> {
    let config = c.config.unwrap_or_default();
    let labels = config.labels.unwrap_or_default();
    labels.get(labels::POOL)?;
    let state = c.state.unwrap_or_default();
    let status = match state.status {
        Some(ContainerStateStatusEnum::CREATED) => ContainerState::Created,
        Some(ContainerStateStatusEnum::RUNNING) => ContainerState::Running,
        Some(ContainerStateStatusEnum::PAUSED) => ContainerState::Paused,
        Some(ContainerStateStatusEnum::RESTARTING) => ContainerState::Restarting,
        Some(ContainerStateStatusEnum::EXITED) => ContainerState::Exited,
        Some(ContainerStateStatusEnum::REMOVING) => ContainerState::Removing,
        Some(ContainerStateStatusEnum::DEAD) => ContainerState::Dead,
        _ => ContainerState::Unknown,
    };
    let health = match state.health.and_then(|h| h.status) {
        Some(HealthStatusEnum::STARTING) => HealthState::Starting,
        Some(HealthStatusEnum::HEALTHY) => HealthState::Healthy,
        Some(HealthStatusEnum::UNHEALTHY) => HealthState::Unhealthy,
        _ => HealthState::None,
    };
    let finished_at = parse_engine_time(state.finished_at.as_deref());
    Some(Container {
        id: c.id?,
        name: c.name?.trim_start_matches('/').to_owned(),
        image: config.image.unwrap_or_default(),
        labels,
        state: status,
        health,
        exit_code: finished_at.and(state.exit_code),
        oom_killed: state.oom_killed.unwrap_or(false),
        created_at: c.created.as_deref().and_then(|t| parse_engine_time(Some(t))).unwrap_or(DateTime::UNIX_EPOCH),
        started_at: parse_engine_time(state.started_at.as_deref()),
        finished_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bollard::models::{ContainerConfig, EventActor};

    fn event(action: &str) -> EventMessage {
        EventMessage {
            action: Some(action.into()),
            actor: Some(EventActor { id: Some("abc".into()), attributes: None }),
            ..Default::default()
        }
    }

    #[test]
    fn only_events_that_change_a_container_are_kept() {
        assert_eq!(container_event(event("die")), Some(ContainerEvent { id: "abc".into(), destroyed: false }));
        assert_eq!(container_event(event("destroy")), Some(ContainerEvent { id: "abc".into(), destroyed: true }));
        assert!(container_event(event("health_status: healthy")).is_some());
        assert_eq!(container_event(event("exec_start: sh")), None);
        assert_eq!(container_event(event("attach")), None);
    }

    #[test]
    fn an_inspected_exited_container_keeps_its_exit_code_and_times() {
        let c = ContainerInspectResponse {
            id: Some("abc".into()),
            name: Some("/worker-abcdef".into()),
            created: Some("2026-12-03T09:00:00Z".into()),
            config: Some(ContainerConfig {
                image: Some("app:1".into()),
                labels: Some([(labels::POOL.to_owned(), "p".to_owned())].into()),
                ..Default::default()
            }),
            state: Some(bollard::models::ContainerState {
                status: Some(ContainerStateStatusEnum::EXITED),
                exit_code: Some(137),
                oom_killed: Some(true),
                started_at: Some("2026-12-03T09:00:01Z".into()),
                finished_at: Some("2026-12-03T09:00:05Z".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let c = from_inspect(c).unwrap();
        assert_eq!(
            (c.name.as_str(), c.state, c.exit_code, c.oom_killed),
            ("worker-abcdef", ContainerState::Exited, Some(137), true)
        );
        assert!(c.started_at.is_some() && c.finished_at.is_some());
    }

    #[test]
    fn containers_without_a_pool_label_are_not_ours() {
        let c = ContainerInspectResponse { id: Some("x".into()), name: Some("/x".into()), ..Default::default() };
        assert_eq!(from_inspect(c), None);
    }
}
