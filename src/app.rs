//! Building and running the service: storage, runtime, workers, HTTP.
//! There is one shutdown path: the shutdown future resolves, HTTP stops
//! taking requests and finishes those in flight, a cancellation signal
//! reaches every background task, and `run_until_stopped` returns once
//! they have all drained. The data directory is locked for as long as the
//! service lives ([`lock`]): one drover process per data directory.

pub mod lock;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{RuntimeKind, ServeConfig};
use crate::db;
use crate::domain::pool::{HostPolicy, SpecLimits};
use crate::reconcile::{
    self,
    observe::Timing,
    starter::Starter,
    terminator::Terminator,
    worker::{PoolQueue, WorkerSettings},
};
use crate::runtime::docker::{DockerBackend, Endpoint};
use crate::runtime::engine::Backend;
use crate::runtime::engines::LOCAL_ENGINE;
use crate::runtime::{Engines, Wake};
pub use crate::state::{AppState, Shared};

/// The host-safety policy from the settings: besides the built-in
/// protected paths, the Docker endpoint drover itself uses (when it is a
/// socket) and drover's own data directory.
fn host_policy(config: &ServeConfig) -> HostPolicy {
    let mut protect = Vec::new();
    let endpoint = config.docker_host.clone().or_else(|| std::env::var("DOCKER_HOST").ok());
    if let Some(socket) = endpoint.as_deref().and_then(|e| e.strip_prefix("unix://")) {
        protect.push(socket.to_owned());
    }
    let data = std::fs::canonicalize(&config.data_dir)
        .or_else(|_| std::env::current_dir().map(|cwd| cwd.join(&config.data_dir)))
        .unwrap_or_else(|_| config.data_dir.clone());
    protect.push(data.display().to_string());
    HostPolicy::new(&config.allowed_mount_paths, &config.allowed_images, &protect)
}

pub struct Application {
    listener: TcpListener,
    state: AppState,
    wakes: mpsc::UnboundedReceiver<Wake>,
    /// Every background task, so that shutdown can wait for them all.
    tasks: TaskTracker,
    /// Held until `run_until_stopped` has drained everything.
    lock: lock::DataDirLock,
}

/// How long background tasks get to finish after the cancellation signal.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

impl Application {
    /// Opens the store (creating the data directory and applying
    /// migrations), picks the runtime and binds the listener. Docker being
    /// unreachable is not an error here: readiness reports it and the worker
    /// retries.
    pub async fn build(config: ServeConfig) -> anyhow::Result<Self> {
        create_private_dir(&config.data_dir)?;
        let lock = lock::DataDirLock::acquire(&config.data_dir)?;
        let db_path = config.database_path();
        let db = db::connect(&db_path).await?;
        restrict_database_files(&db_path)?;
        crate::auth::bootstrap(&db, &config.data_dir).await?;
        let tokens = Arc::new(crate::auth::cache::TokenCache::load(&db).await.context("loading the tokens")?);
        let (queue, wakes) = PoolQueue::channel();
        let engines = Engines::new(queue.sender(), config.max_parallel as usize);
        let local = match config.runtime {
            RuntimeKind::Docker => {
                let endpoint = config.docker_host.clone().map_or(Endpoint::Default, Endpoint::Plain);
                Backend::Docker(DockerBackend::new(endpoint))
            }
            RuntimeKind::Simulated => Backend::Simulated(Default::default()),
        };
        let local = engines.add(LOCAL_ENGINE, Default::default(), local);
        let metrics = Arc::new(crate::metrics::Metrics::default());
        let registry = crate::engines::Registry {
            metrics: metrics.clone(),
            db: db.clone(),
            engines: engines.clone(),
            data_dir: config.data_dir.clone(),
            simulated: config.runtime == RuntimeKind::Simulated,
            lost_after: config.engine_lost_after,
        };
        crate::engines::load(&registry).await.context("loading the registered engines")?;
        let listener = TcpListener::bind(config.listen).await.with_context(|| format!("binding {}", config.listen))?;
        let addr = listener.local_addr().context("reading the bound address")?;
        tracing::info!(%addr, "drover listening on http://{addr} (API docs at http://{addr}/docs)");
        tracing::info!(database = %db_path.display(), "data stored in {}", db_path.display());
        match local.kind() {
            "docker" => tracing::info!(endpoint = %local.address(), "local engine: docker"),
            _ => tracing::warn!("local engine: simulated (machines are not real containers)"),
        }
        let shutdown = CancellationToken::new();
        let tasks = TaskTracker::new();
        let changes = crate::changes::Changes::default();
        let reconcile = reconcile::Context {
            metrics: metrics.clone(),
            changes: changes.clone(),
            db: db.clone(),
            engines: engines.clone(),
            timing: Timing {
                settle: config.machine_settle_time,
                lost_after: config.engine_lost_after,
                ..Timing::default()
            },
            stop_timeout_secs: i64::try_from(config.stop_timeout.as_secs()).unwrap_or(i64::MAX),
            nodes: reconcile::NodeSettings::from_config(&config),
            terminator: Arc::new(Terminator::new(tasks.clone(), shutdown.clone())),
            starter: Arc::new(Starter::new(tasks.clone(), shutdown.clone())),
            wakes: queue.sender(),
            clock: crate::clock::Clock::System,
            limits: Arc::new(SpecLimits { max_replicas: config.max_replicas, host: host_policy(&config) }),
        };
        let inflight = Arc::new(Semaphore::new(config.max_concurrent_requests as usize));
        let audit = crate::auth::audit_log::AuditLog::start(db.clone(), &tasks);
        let state = AppState::new(Shared {
            db,
            engines,
            queue,
            reconcile,
            upgrades: Default::default(),
            inflight,
            streams: Arc::new(Semaphore::new(config.max_streams as usize)),
            tokens,
            refusals: Arc::new(crate::auth::refusals::RefusalAudit::new(config.audit_burst_window)),
            audit,
            changes,
            config: Arc::new(config),
            metrics,
            shutdown,
        });
        Ok(Self { listener, state, wakes, tasks, lock })
    }

    pub fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        self.listener.local_addr().context("reading the bound address")
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Serves until `shutdown` resolves, then drains everything.
    pub async fn run_until_stopped(self, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
        let Self { listener, state, wakes, tasks, lock } = self;
        let cancel = state.shutdown.clone();
        let config = Arc::clone(&state.config);

        let ctx = state.reconcile.clone();
        let settings = WorkerSettings {
            resync: config.resync_interval,
            max_backoff: config.max_backoff,
            max_concurrent: config.max_concurrent_reconciles as usize,
        };
        tasks.spawn(reconcile::worker::run(ctx, settings, wakes, cancel.clone()));
        state.engines.start(&cancel, &tasks);

        let upgrades = crate::upgrade::Context::new(
            state.db.clone(),
            crate::upgrade::Settings::from_config(&config),
            state.metrics.clone(),
            state.changes.clone(),
        );
        tasks.spawn(crate::upgrade::runner::run(upgrades, state.upgrades.clone(), cancel.clone()));
        tasks.spawn(crate::auth::cache::run(
            state.tokens.clone(),
            state.db.clone(),
            state.refusals.clone(),
            cancel.clone(),
        ));
        let retention = crate::retention::Settings::from_config(&config);
        tasks.spawn(crate::retention::run(state.db.clone(), retention, state.metrics.clone(), cancel.clone()));
        tasks.spawn(db::run_checkpoints(state.db.clone(), cancel.clone()));

        let router = crate::http::router(state.clone())?;
        let stop = cancel.clone();
        tokio::spawn(async move {
            shutdown.await;
            tracing::info!("shutting down: finishing requests in flight");
            stop.cancel();
        });
        let limits = crate::http::serve::Limits::from_config(&config);
        crate::http::serve::serve(listener, router, limits, state.metrics.clone(), cancel.clone()).await;
        cancel.cancel();
        // Every request is answered: the audit writer writes what is still
        // queued and ends, and `tasks` waits for it.
        state.audit.close();
        tasks.close();
        if tokio::time::timeout(DRAIN_TIMEOUT, tasks.wait()).await.is_err() {
            tracing::warn!("background tasks did not stop within {DRAIN_TIMEOUT:?}; exiting anyway");
        }
        state.db.close().await;
        drop(lock);
        tracing::info!("stopped");
        Ok(())
    }
}

/// The data directory holds the store (and, later, secrets): owner only.
fn create_private_dir(dir: &std::path::Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating data directory {}", dir.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("restricting permissions of {}", dir.display()))?;
    }
    Ok(())
}

/// The database holds credentials and token hashes: owner only, including
/// SQLite's write-ahead log and shared-memory files.
fn restrict_database_files(db_path: &std::path::Path) -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        for suffix in ["", "-wal", "-shm"] {
            let path = std::path::PathBuf::from(format!("{}{suffix}", db_path.display()));
            if path.exists() {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                    .with_context(|| format!("restricting permissions of {}", path.display()))?;
            }
        }
    }
    Ok(())
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
