//! The Docker Engine runtime, through bollard.
//!
//! The engine on a host may speak an older API than bollard's default, so
//! the client negotiates the version on first use; until the engine answers,
//! every call fails with `RuntimeError::Unavailable` and is retried by the
//! worker's backoff. Nothing here panics when Docker is missing.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bollard::Docker;
use bollard::errors::Error as BollardError;
use bollard::models::{ContainerCreateBody, ContainerSummary, ContainerSummaryStateEnum, HostConfig, MountType};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, EventsOptionsBuilder, ListContainersOptionsBuilder, RemoveContainerOptionsBuilder,
    StopContainerOptionsBuilder,
};
use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use tokio::sync::{Mutex, mpsc};
use tokio_util::sync::CancellationToken;

use super::{Container, ContainerState, CreateContainer, HealthState, RuntimeError, Wake, labels};

/// Longest wait for the engine to answer the version handshake.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait for one engine call; stop/remove add the stop timeout.
const CALL_TIMEOUT: u64 = 60;

#[derive(Clone)]
pub struct DockerRuntime {
    inner: Arc<Inner>,
}

struct Inner {
    /// `unix:///...` or `tcp://...`; `None` means `DOCKER_HOST`, then the
    /// local socket.
    host: Option<String>,
    /// The client, once the engine answered the version handshake.
    client: Mutex<Option<Docker>>,
}

impl DockerRuntime {
    pub fn new(host: Option<String>) -> Self {
        Self { inner: Arc::new(Inner { host, client: Mutex::new(None) }) }
    }

    /// The engine's address, for logs and readiness reports.
    pub fn endpoint(&self) -> String {
        self.inner
            .host
            .clone()
            .or_else(|| std::env::var("DOCKER_HOST").ok())
            .unwrap_or_else(|| "unix:///var/run/docker.sock".into())
    }

    async fn client(&self) -> Result<Docker, RuntimeError> {
        let mut slot = self.inner.client.lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let unavailable = |e: BollardError| RuntimeError::Unavailable(format!("{}: {e}", self.endpoint()));
        let base = match &self.inner.host {
            Some(h) => Docker::connect_with_host(h),
            None => Docker::connect_with_defaults(),
        }
        .map_err(unavailable)?
        .with_timeout(Duration::from_secs(CALL_TIMEOUT));
        let negotiated = tokio::time::timeout(CONNECT_TIMEOUT, base.negotiate_version())
            .await
            .map_err(|_| {
                RuntimeError::Unavailable(format!("{}: no answer within {CONNECT_TIMEOUT:?}", self.endpoint()))
            })?
            .map_err(unavailable)?;
        *slot = Some(negotiated.clone());
        Ok(negotiated)
    }

    pub async fn ping(&self) -> Result<(), RuntimeError> {
        let client = self.client().await?;
        client.ping().await.map(|_| ()).map_err(map_err)
    }

    pub async fn list_pool(&self, pool: &str) -> Result<Vec<Container>, RuntimeError> {
        let client = self.client().await?;
        let filters = HashMap::from([("label".to_owned(), vec![format!("{}={pool}", labels::POOL)])]);
        let opts = ListContainersOptionsBuilder::default().all(true).filters(&filters).build();
        let summaries = client.list_containers(Some(opts)).await.map_err(map_err)?;
        Ok(summaries.into_iter().filter_map(from_summary).collect())
    }

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
        if let Err(e) = client.start_container(&created.id, None).await {
            // A container that cannot start would only be counted as a
            // broken machine forever; take it away and report why.
            let _ = self.remove(&created.id, 0).await;
            return Err(RuntimeError::Api(format!("starting {}: {}", spec.name, map_err(e))));
        }
        Ok(Container {
            id: created.id,
            name: spec.name.clone(),
            image: spec.image.clone(),
            labels: spec.labels.clone(),
            state: ContainerState::Running,
            health: HealthState::None,
            created_at: Utc::now(),
        })
    }

    pub async fn remove(&self, id: &str, stop_timeout_secs: i64) -> Result<(), RuntimeError> {
        let client = self.client().await?;
        let t = i32::try_from(stop_timeout_secs).unwrap_or(i32::MAX);
        match client.stop_container(id, Some(StopContainerOptionsBuilder::default().t(t).build())).await {
            // 304: already stopped. 404: already gone.
            Ok(()) | Err(BollardError::DockerResponseServerError { status_code: 304 | 404, .. }) => {}
            Err(e) => return Err(map_err(e)),
        }
        let opts = RemoveContainerOptionsBuilder::default().force(true).v(true).build();
        match client.remove_container(id, Some(opts)).await {
            // 404: gone. 409: removal already in progress.
            Ok(()) | Err(BollardError::DockerResponseServerError { status_code: 404 | 409, .. }) => Ok(()),
            Err(e) => Err(map_err(e)),
        }
    }

    pub async fn watch(&self, tx: mpsc::UnboundedSender<Wake>, cancel: CancellationToken) {
        let mut backoff = Duration::from_millis(250);
        loop {
            let connected = match self.client().await {
                Ok(client) => {
                    let filters = HashMap::from([
                        ("type".to_owned(), vec!["container".to_owned()]),
                        ("label".to_owned(), vec![labels::POOL.to_owned()]),
                    ]);
                    let mut events = client.events(Some(EventsOptionsBuilder::default().filters(&filters).build()));
                    // Whatever happened while we were not listening is unknown.
                    if tx.send(Wake::All).is_err() {
                        return;
                    }
                    backoff = Duration::from_millis(250);
                    loop {
                        tokio::select! {
                            _ = cancel.cancelled() => return,
                            next = events.next() => match next {
                                Some(Ok(ev)) => {
                                    let pool = ev.actor.and_then(|a| a.attributes).and_then(|mut a| a.remove(labels::POOL));
                                    if let Some(pool) = pool
                                        && tx.send(Wake::Pool(pool)).is_err()
                                    {
                                        return;
                                    }
                                }
                                Some(Err(e)) => {
                                    tracing::warn!(error = %e, "docker event stream broke; reconnecting");
                                    break;
                                }
                                None => break,
                            }
                        }
                    }
                    true
                }
                Err(e) => {
                    tracing::debug!(error = %e, "docker unavailable for events");
                    false
                }
            };
            if !connected {
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(backoff) => {}
            }
        }
    }
}

fn map_err(e: BollardError) -> RuntimeError {
    match e {
        BollardError::DockerResponseServerError { status_code, message } => {
            RuntimeError::Api(format!("engine answered {status_code}: {message}"))
        }
        BollardError::JsonDataError { .. } | BollardError::JsonSerdeError { .. } => RuntimeError::Api(e.to_string()),
        // Everything else is about reaching the engine: sockets, timeouts, HTTP.
        other => RuntimeError::Unavailable(other.to_string()),
    }
}

fn from_summary(s: ContainerSummary) -> Option<Container> {
    let name = s.names?.into_iter().next()?.trim_start_matches('/').to_owned();
    let state = match s.state {
        Some(ContainerSummaryStateEnum::CREATED) => ContainerState::Created,
        Some(ContainerSummaryStateEnum::RUNNING) => ContainerState::Running,
        Some(ContainerSummaryStateEnum::PAUSED) => ContainerState::Paused,
        Some(ContainerSummaryStateEnum::RESTARTING) => ContainerState::Restarting,
        Some(ContainerSummaryStateEnum::EXITED) => ContainerState::Exited,
        Some(ContainerSummaryStateEnum::REMOVING) => ContainerState::Removing,
        Some(ContainerSummaryStateEnum::DEAD) => ContainerState::Dead,
        _ => ContainerState::Unknown,
    };
    Some(Container {
        id: s.id?,
        name,
        image: s.image.unwrap_or_default(),
        labels: s.labels.unwrap_or_default(),
        state,
        health: health_from_status(s.status.as_deref().unwrap_or_default()),
        created_at: s.created.and_then(|t| DateTime::from_timestamp(t, 0)).unwrap_or_else(Utc::now),
    })
}

/// The list endpoint of older engines reports health only inside the
/// human-readable status: `Up 3 seconds (healthy)`.
fn health_from_status(status: &str) -> HealthState {
    if status.contains("(healthy)") {
        HealthState::Healthy
    } else if status.contains("(unhealthy)") {
        HealthState::Unhealthy
    } else if status.contains("(health: starting)") {
        HealthState::Starting
    } else {
        HealthState::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_is_read_from_the_status_text() {
        assert_eq!(health_from_status("Up 3 seconds (healthy)"), HealthState::Healthy);
        assert_eq!(health_from_status("Up 3 seconds (unhealthy)"), HealthState::Unhealthy);
        assert_eq!(health_from_status("Up 1 second (health: starting)"), HealthState::Starting);
        assert_eq!(health_from_status("Up 2 minutes"), HealthState::None);
        assert_eq!(health_from_status("Exited (0) 1 second ago"), HealthState::None);
    }
}
