//! The state every handler and middleware shares, in a module of its own:
//! `app` builds it and `http` reads it, and neither needs the other for it.

use std::sync::Arc;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::config::ServeConfig;
use crate::db::Db;
use crate::domain::pool::SpecLimits;
use crate::reconcile::{self, worker::PoolQueue};

/// Shared by every handler; cheap to clone.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

/// What every handler shares. Behind one `Arc`: each request clones the
/// state once per middleware layer and handler, and one counter is cheaper
/// than a dozen.
pub struct Shared {
    /// Pools and their rollouts, for the API.
    pub pools: crate::pools::Pools,
    /// Pools' machines, for the API.
    pub machines: crate::pools::Machines,
    /// Registered clusters, for the API.
    pub clusters: crate::clusters::Clusters,
    /// Upgrade jobs, for the API.
    pub upgrades: crate::upgrade::service::Upgrades,
    /// The engines: registered ones for the API, and the live set (with
    /// what each holds) that the reconciler drives (`engines.set`).
    pub engines: crate::engines::Engines,
    /// Namespaces, for the API.
    pub namespaces: crate::namespaces::Namespaces,
    /// Declarative fleets (`POST /v1/apply`).
    pub apply: crate::apply::Apply,
    /// Tokens and the audit trail, for the API.
    pub token_service: crate::identity::tokens::Tokens,
    /// What event streams read of subjects' histories.
    pub events: crate::events::history::Events,
    /// Idempotency keys of keyed POSTs.
    pub keys: crate::idempotency::Keys,
    /// Wakes the upgrade runner (the upgrades service wakes it on a new job).
    pub upgrade_queue: crate::upgrade::UpgradeQueue,
    pub db: Db,
    /// Whether the store answered its last probe (`/readyz`).
    pub store_health: Arc<crate::db::health::StoreHealth>,
    /// Wakes the reconcile worker for a pool.
    pub queue: PoolQueue,
    pub config: Arc<ServeConfig>,
    /// What reconcile passes (and the API's dry runs) work with.
    pub reconcile: reconcile::Context,
    /// Requests being served; `max_concurrent_requests` permits.
    pub inflight: Arc<Semaphore>,
    /// Event streams open; `max_streams` permits.
    pub streams: Arc<Semaphore>,
    /// Every token, so that authenticating reads no store.
    pub tokens: Arc<crate::identity::cache::TokenCache>,
    /// Audits refusals of token-less requests once per burst.
    pub refusals: Arc<crate::audit::refusals::RefusalAudit>,
    /// Writes the audit records of authenticated changes, batched.
    pub audit: crate::audit::log::AuditLog,
    /// "Pool X / job Y changed", for event streams.
    pub changes: crate::events::changes::Changes,
    /// This process's name among drover's replicas (the holder of its
    /// leases, the owner of the upgrade jobs it runs).
    pub replica: Arc<str>,
    pub metrics: Arc<crate::metrics::Metrics>,
    /// The listener's TLS configuration (reloaded when its files change),
    /// when `--tls-cert` is given.
    pub tls: Option<Arc<crate::tls::Tls>>,
    /// The access config (`--access-config`), reloaded when its file
    /// changes: OIDC issuers and their rules, client-certificate subjects.
    pub access: Option<Arc<crate::identity::reload::AccessRules>>,
    /// Fires when shutdown begins: long-lived responses (event streams)
    /// end on it, since a graceful shutdown waits for every open response.
    pub shutdown: CancellationToken,
}

impl std::ops::Deref for AppState {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl AppState {
    pub fn new(shared: Shared) -> Self {
        Self(Arc::new(shared))
    }
}

impl Shared {
    /// Rules of pool specs that come from settings (the reconciler's).
    pub fn limits(&self) -> &SpecLimits {
        &self.reconcile.limits
    }

    /// What the authentication middleware needs, borrowed.
    pub fn gate(&self) -> crate::identity::Gate<'_> {
        crate::identity::Gate {
            db: &self.db,
            tokens: &self.tokens,
            refusals: &self.refusals,
            audit: &self.audit,
            metrics: &self.metrics,
            access: self.access.as_ref().map(|a| a.current()),
        }
    }
}
