//! Control-plane upgrade jobs: the runner that drives each job through its
//! persisted steps against a cluster, and the pure planning it relies on.
//!
//! - [`plan`]: the objects an upgrade writes, and the dry-run plan (pure).
//! - [`service`]: what the HTTP handlers call: check a request against the
//!   cluster and the version policy, store a job, cancel one.
//! - [`claim`]: one runner's claim on one job (a lease, with several
//!   replicas); every write of the job proves the claim first.
//! - [`steps`]: one step of one component against the cluster; each looks
//!   before it acts, so it is safe to run again after an interruption.
//! - [`job`]: a job from its stored position to its end, including the
//!   rollback or cleanup that ends a failed or cancelled job.
//! - [`runner`]: the background worker that finds jobs to drive.

pub mod claim;
pub mod job;
pub mod plan;
pub mod runner;
pub mod service;
pub mod steps;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::config::ServeConfig;
use crate::db::Db;
use crate::k8s::RetryPolicy;

/// What the runner needs: the store and its settings. Cheap to clone.
#[derive(Clone)]
pub struct Context {
    pub db: Db,
    pub settings: Settings,
    /// Counts Kubernetes API calls.
    pub metrics: std::sync::Arc<crate::metrics::Metrics>,
    /// This runner's id, recorded on the jobs it claims: the replica's
    /// ([`crate::replicas::replica_id`]), so that no two runners, in this
    /// process or another, share one.
    pub owner: Arc<str>,
    /// Tells event streams that a job changed.
    pub changes: crate::events::changes::Changes,
    /// The replica's leases (several replicas): a job is claimed by taking
    /// its lease. `None` with SQLite.
    pub leases: Option<Arc<crate::replicas::Leases>>,
}

impl Context {
    pub fn new(
        db: Db,
        settings: Settings,
        metrics: Arc<crate::metrics::Metrics>,
        changes: crate::events::changes::Changes,
        owner: Arc<str>,
    ) -> Self {
        Self { db, settings, metrics, owner, changes, leases: None }
    }

    /// Jobs are claimed through `leases` (several replicas).
    pub fn with_leases(mut self, leases: Option<Arc<crate::replicas::Leases>>) -> Self {
        self.leases = leases;
        self
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub retry: RetryPolicy,
    /// Longest time each wait may take (kubeadm's: 2 minutes).
    pub wait_timeout: Duration,
    /// How often a wait looks again.
    pub poll_interval: Duration,
    /// How claims on jobs are kept alive and taken over.
    pub claims: Claims,
}

/// A runner's claim on a job is refreshed every `heartbeat` and may be
/// taken over by another runner once it was not for `stale_after`.
#[derive(Debug, Clone, Copy)]
pub struct Claims {
    pub heartbeat: Duration,
    pub stale_after: Duration,
    /// Other replicas share the store: claims of other owners are theirs,
    /// never released at start.
    pub shared: bool,
}

impl Default for Claims {
    /// One process per store (SQLite): a claim only goes stale when two
    /// processes share the store despite the data directory's lock (a file
    /// system without working locks), since a restart releases claims at once.
    fn default() -> Self {
        Self { heartbeat: Duration::from_secs(5), stale_after: Duration::from_secs(60), shared: false }
    }
}

impl Claims {
    /// Several replicas (PostgreSQL): a job's claim is a lease like a
    /// pool's, taken over `--lease-duration` after its holder stopped.
    pub fn leases(duration: Duration) -> Self {
        Self { heartbeat: duration / 3, stale_after: duration, shared: true }
    }
}

impl Settings {
    pub fn from_config(c: &ServeConfig) -> Self {
        let claims = match c.database() {
            crate::db::Location::Postgres(_) => Claims::leases(c.lease_duration),
            crate::db::Location::Sqlite(_) => Claims::default(),
        };
        Self {
            retry: RetryPolicy::from_config(c),
            wait_timeout: c.upgrade_wait_timeout,
            poll_interval: c.upgrade_poll_interval,
            claims,
        }
    }
}

/// Wakes the runner when a job is created, so it need not wait for its
/// next scan. Cheap to clone.
#[derive(Clone, Default)]
pub struct UpgradeQueue {
    notify: Arc<Notify>,
}

impl UpgradeQueue {
    pub fn wake(&self) {
        // notify_one keeps a permit when the runner is busy, so no wake-up is lost.
        self.notify.notify_one();
    }

    pub async fn woken(&self) {
        self.notify.notified().await;
    }
}
