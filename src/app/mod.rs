//! Building and running the service: storage, runtime, workers, HTTP.
//! There is one shutdown path: the shutdown future resolves, HTTP stops
//! taking requests and finishes those in flight, a cancellation signal
//! reaches every background task, and `run_until_stopped` returns once
//! they have all drained. On SQLite the data directory is locked for as
//! long as the service lives ([`lock`]): one drover process per store. On
//! PostgreSQL several replicas share the store, each driving the pools it
//! holds leases of ([`crate::replicas`]).

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
use crate::engines::{EngineSet, LOCAL_ENGINE};
use crate::reconcile::{
    self,
    observe::Timing,
    starter::Starter,
    terminator::Terminator,
    worker::{PoolQueue, WorkerSettings},
};
use crate::runtime::Backend;
use crate::runtime::Wake;
use crate::runtime::docker::{DockerBackend, Endpoint};
use crate::runtime::simulated::SimulatedBackend;
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
    /// Held until `run_until_stopped` has drained everything (SQLite).
    lock: Option<lock::DataDirLock>,
    /// Notices for the other replicas (PostgreSQL).
    notices: Option<mpsc::UnboundedReceiver<crate::events::changes::Subject>>,
}

/// How long background tasks get to finish after the cancellation signal.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

impl Application {
    /// Opens the store (creating the data directory and applying
    /// migrations), picks the runtime and binds the listener. Docker being
    /// unreachable is not an error here: readiness reports it and the worker
    /// retries.
    pub async fn build(config: ServeConfig) -> anyhow::Result<Self> {
        let store = Store::open(&config).await?;
        crate::identity::bootstrap(&store.db, &config.data_dir).await?;
        let tokens = Arc::new(crate::identity::cache::TokenCache::load(&store.db).await.context("loading the tokens")?);
        let (queue, wakes) = PoolQueue::channel();
        let engine_settings = crate::engines::EngineSettings {
            max_parallel: config.max_parallel as usize,
            lost_after: config.engine_lost_after,
        };
        let set = EngineSet::new(queue.sender(), engine_settings);
        let local = set.add(LOCAL_ENGINE, Default::default(), local_backend(&config));
        let refusals = Arc::new(crate::audit::refusals::RefusalAudit::new(config.audit_burst_window));
        let access = load_access(&config).await?;
        let metrics = Arc::new(crate::metrics::Metrics::default().with(|r| {
            if let Some(fresh) = store.db.freshness() {
                fresh.stats.register(r);
            }
            refusals.register(r);
            if let Some(access) = &access {
                access.register(r);
            }
        }));
        let engines = crate::engines::Engines {
            metrics: metrics.clone(),
            db: store.db.clone(),
            set: set.clone(),
            data_dir: config.data_dir.clone(),
            simulated: config.runtime == RuntimeKind::Simulated,
        };
        engines.load().await.context("loading the registered engines")?;
        let tls = load_tls(&config)?;
        let listener = listen(&config, tls.is_some()).await?;
        tracing::info!(database = %store.location.shown(), "data stored in {}", store.location.shown());
        match local.kind() {
            "docker" => tracing::info!(endpoint = %local.address(), "local engine: docker"),
            _ => tracing::warn!("local engine: simulated (machines are not real containers)"),
        }
        let shutdown = CancellationToken::new();
        let tasks = TaskTracker::new();
        let (changes, notices) = if store.shared {
            let (changes, notices) = crate::events::changes::Changes::default().with_peers();
            (changes, Some(notices))
        } else {
            (crate::events::changes::Changes::default(), None)
        };
        let reconcile = reconcile::Context {
            metrics: metrics.clone(),
            changes: changes.clone(),
            db: store.db.clone(),
            engines: set.clone(),
            timing: Timing { settle: config.machine_settle_time, ..Timing::default() },
            stop_timeout_secs: i64::try_from(config.stop_timeout.as_secs()).unwrap_or(i64::MAX),
            nodes: reconcile::NodeSettings::from_config(&config),
            terminator: Arc::new(Terminator::new(tasks.clone(), shutdown.clone())),
            starter: Arc::new(Starter::new(tasks.clone(), shutdown.clone())),
            wakes: queue.sender(),
            clock: crate::clock::Clock::System,
            limits: Arc::new(SpecLimits { max_replicas: config.max_replicas, host: host_policy(&config) }),
            tasks: tasks.clone(),
            leases: store.leases,
            fence: crate::replicas::Fence::Sole,
            writes_began: Default::default(),
        };
        let parts = Parts { db: store.db, engines, reconcile, queue, changes, tokens, refusals, metrics, tls, access };
        let state = AppState::new(services(parts, store.replica, config, &tasks, shutdown));
        Ok(Self { listener, state, wakes, tasks, lock: store.lock, notices })
    }

    pub fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        self.listener.local_addr().context("reading the bound address")
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Serves until `shutdown` resolves, then drains everything.
    pub async fn run_until_stopped(self, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
        let Self { listener, state, wakes, tasks, lock, notices } = self;
        let cancel = state.shutdown.clone();
        let config = Arc::clone(&state.config);

        let ctx = state.reconcile.clone();
        let settings = WorkerSettings {
            resync: config.resync_interval,
            max_backoff: config.max_backoff,
            max_concurrent: config.max_concurrent_reconciles as usize,
        };
        tasks.spawn(reconcile::worker::run(ctx, settings, wakes, cancel.clone()));
        if let Some(leases) = &state.reconcile.leases {
            let (leases, db, queue) = (leases.clone(), state.db.clone(), state.queue.sender());
            tasks.spawn(crate::replicas::keeper::run(leases, db, queue, cancel.clone()));
        }
        if let Some(notices) = notices {
            let listener = crate::replicas::listener::Listener {
                me: state.replica.clone(),
                db: state.db.clone(),
                changes: state.changes.clone(),
                wakes: state.queue.sender(),
            };
            tasks.spawn(crate::replicas::listener::run(listener, notices, cancel.clone()));
            tasks.spawn(crate::replicas::listener::send_barriers(
                state.db.clone(),
                state.replica.clone(),
                cancel.clone(),
            ));
            tasks.spawn(crate::engines::follow(state.engines.clone(), cancel.clone()));
        }
        state.engines.set.start(&cancel, &tasks);
        tasks.spawn(crate::engines::daemons::watch(state.engines.clone(), cancel.clone()));
        if let Some(access) = &state.access {
            access.keep_fresh(&tasks);
            let every = config.access_reload_interval;
            tasks.spawn(crate::identity::reload::watch(access.clone(), every, tasks.clone(), cancel.clone()));
        }

        let upgrades = crate::upgrade::Context::new(
            state.db.clone(),
            crate::upgrade::Settings::from_config(&config),
            state.metrics.clone(),
            state.changes.clone(),
            state.replica.clone(),
        )
        .with_leases(state.reconcile.leases.clone());
        tasks.spawn(crate::upgrade::runner::run(upgrades, state.upgrade_queue.clone(), cancel.clone()));
        tasks.spawn(crate::identity::cache::run(state.tokens.clone(), state.db.clone(), cancel.clone()));
        tasks.spawn(crate::audit::refusals::run(state.refusals.clone(), state.db.clone(), cancel.clone()));
        let retention = crate::retention::Settings::from_config(&config);
        tasks.spawn(crate::retention::run(state.db.clone(), retention, state.metrics.clone(), cancel.clone()));
        tasks.spawn(db::run_checkpoints(state.db.clone(), cancel.clone()));
        tasks.spawn(db::health::run(state.store_health.clone(), state.db.clone(), cancel.clone()));
        if let Some(tls) = &state.tls {
            tasks.spawn(crate::tls::watch(tls.clone(), config.tls_reload_interval, cancel.clone()));
        }

        let router = crate::http::router(state.clone())?;
        let stop = cancel.clone();
        tasks.spawn(async move {
            tokio::select! {
                () = shutdown => {
                    tracing::info!("shutting down: finishing requests in flight");
                    stop.cancel();
                }
                // The server stopped by itself: nothing to forward.
                () = stop.cancelled() => {}
            }
        });
        let limits = crate::http::serve::Limits::from_config(&config);
        crate::http::serve::serve(listener, router, limits, state.metrics.clone(), state.tls.clone(), cancel.clone())
            .await;
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

/// The access config and the OIDC verifier it asks for; a file that
/// cannot be used stops the start, naming it.
/// The store as `build` opens it: where it is, whether replicas share
/// it, this process's lock on it (SQLite) and its replica identity.
struct Store {
    location: db::Location,
    shared: bool,
    lock: Option<lock::DataDirLock>,
    replica: Arc<str>,
    db: db::Db,
    leases: Option<Arc<crate::replicas::Leases>>,
}

impl Store {
    /// Creates the data directory, takes its lock (one process per SQLite
    /// store; replicas share a PostgreSQL one) and opens the store,
    /// migrations applied.
    async fn open(config: &ServeConfig) -> anyhow::Result<Self> {
        create_private_dir(&config.data_dir)?;
        let location = config.database();
        let shared = matches!(location, db::Location::Postgres(_));
        let lock = if shared { None } else { Some(lock::DataDirLock::acquire(&config.data_dir)?) };
        let replica: Arc<str> = crate::replicas::replica_id().into();
        let db = db::connect_with_leases(&location, config.lease_duration, &replica).await?;
        if let db::Location::Sqlite(path) = &location {
            restrict_database_files(path)?;
        }
        let leases = shared.then(|| crate::replicas::Leases::new(replica.clone(), config.lease_duration));
        Ok(Self { location, shared, lock, replica, db, leases })
    }
}

/// The engine drover's own machines run on: Docker at its endpoint, or
/// the simulation.
fn local_backend(config: &ServeConfig) -> Backend {
    match config.runtime {
        RuntimeKind::Docker => {
            let endpoint = config.docker_host.clone().map_or(Endpoint::Default, Endpoint::Plain);
            Backend::Docker(DockerBackend::new(endpoint))
        }
        RuntimeKind::Simulated => Backend::Simulated(SimulatedBackend::at("sim://local")),
    }
}

/// Binds the listener, and says where it listens (and whether that is
/// plain HTTP on an address others reach).
async fn listen(config: &ServeConfig, tls: bool) -> anyhow::Result<TcpListener> {
    let listener = TcpListener::bind(config.listen).await.with_context(|| format!("binding {}", config.listen))?;
    let addr = listener.local_addr().context("reading the bound address")?;
    let scheme = if tls { "https" } else { "http" };
    tracing::info!(%addr, "drover listening on {scheme}://{addr} (API docs at {scheme}://{addr}/docs)");
    if let Some(warning) = plain_http_warning(addr, tls) {
        tracing::warn!(%addr, "{warning}");
    }
    Ok(listener)
}

/// What the services are made of, once the store, the engines and the
/// reconciler's context exist.
struct Parts {
    db: db::Db,
    engines: crate::engines::Engines,
    reconcile: reconcile::Context,
    queue: PoolQueue,
    changes: crate::events::changes::Changes,
    tokens: Arc<crate::identity::cache::TokenCache>,
    refusals: Arc<crate::audit::refusals::RefusalAudit>,
    metrics: Arc<crate::metrics::Metrics>,
    tls: Option<Arc<crate::tls::Tls>>,
    access: Option<Arc<crate::identity::reload::AccessRules>>,
}

/// The services the handlers share, each over the store.
fn services(
    parts: Parts,
    replica: Arc<str>,
    config: ServeConfig,
    tasks: &TaskTracker,
    shutdown: CancellationToken,
) -> Shared {
    let Parts { db, engines, reconcile, queue, changes, tokens, refusals, metrics, tls, access } = parts;
    let audit = crate::audit::log::AuditLog::start(db.clone(), tasks);
    let wake = crate::pools::Wake { queue: queue.clone(), changes: changes.clone() };
    let pools = crate::pools::Pools::new(db.clone(), reconcile.limits.clone(), wake.clone(), reconcile.clone());
    let machines = crate::pools::Machines::new(db.clone(), wake);
    let clusters = crate::clusters::Clusters::new(db.clone(), crate::k8s::RetryPolicy::from_config(&config));
    let upgrade_queue = crate::upgrade::UpgradeQueue::default();
    let upgrades = crate::upgrade::service::Upgrades::new(db.clone(), clusters.clone(), upgrade_queue.clone());
    Shared {
        apply: crate::apply::Apply::new(db.clone(), pools.clone(), engines.clone(), clusters.clone()),
        namespaces: crate::namespaces::Namespaces::new(db.clone(), pools.clone()),
        pools,
        machines,
        clusters,
        upgrades,
        token_service: crate::identity::tokens::Tokens::new(db.clone(), tokens.clone()),
        events: crate::events::history::Events::new(db.clone()),
        keys: crate::idempotency::Keys::new(db.clone(), config.request_timeout, tasks.clone()),
        upgrade_queue,
        db,
        store_health: Arc::default(),
        engines,
        queue,
        reconcile,
        inflight: Arc::new(Semaphore::new(config.max_concurrent_requests as usize)),
        streams: Arc::new(Semaphore::new(config.max_streams as usize)),
        tokens,
        refusals,
        audit,
        changes,
        replica,
        config: Arc::new(config),
        metrics,
        tls,
        access,
        shutdown,
    }
}

async fn load_access(config: &ServeConfig) -> anyhow::Result<Option<Arc<crate::identity::reload::AccessRules>>> {
    let Some(path) = &config.access_config else { return Ok(None) };
    Ok(Some(Arc::new(crate::identity::reload::AccessRules::load(path).await?)))
}

/// The listener's TLS setup from `--tls-cert`, `--tls-key` and
/// `--tls-client-ca`; a file that cannot be used stops the start.
fn load_tls(config: &ServeConfig) -> anyhow::Result<Option<Arc<crate::tls::Tls>>> {
    let (Some(cert), Some(key)) = (&config.tls_cert, &config.tls_key) else {
        anyhow::ensure!(config.tls_client_ca.is_none(), "--tls-client-ca needs --tls-cert and --tls-key");
        return Ok(None);
    };
    let files = crate::tls::TlsFiles { cert: cert.clone(), key: key.clone(), client_ca: config.tls_client_ca.clone() };
    Ok(Some(Arc::new(crate::tls::Tls::load(files)?)))
}

/// Why serving plain HTTP on `addr` deserves a warning: tokens would cross
/// the network in clear text, unless a proxy on the same host ends TLS.
pub fn plain_http_warning(addr: SocketAddr, tls: bool) -> Option<String> {
    (!tls && !addr.ip().is_loopback()).then(|| {
        format!(
            "serving plain HTTP on {addr}, which is not a loopback address: bearer tokens cross the network \
             unencrypted; use --tls-cert/--tls-key, or a TLS proxy on this host"
        )
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_is_warned_about_off_loopback_only() {
        let addr = |s: &str| s.parse::<SocketAddr>().expect("an address");
        assert!(plain_http_warning(addr("127.0.0.1:8080"), false).is_none());
        assert!(plain_http_warning(addr("[::1]:8080"), false).is_none());
        let warning = plain_http_warning(addr("0.0.0.0:8080"), false).expect("a warning");
        assert!(warning.contains("0.0.0.0:8080") && warning.contains("--tls-cert"), "{warning}");
        assert!(plain_http_warning(addr("10.0.0.5:8080"), false).is_some());
        assert!(plain_http_warning(addr("0.0.0.0:8443"), true).is_none());
    }
}
