//! Control-plane upgrade jobs: the runner that drives each job through its
//! persisted steps against a cluster, and the pure planning it relies on.
//!
//! - [`plan`]: the objects an upgrade writes, and the dry-run plan (pure).
//! - [`service`]: what the HTTP handlers call: check a request against the
//!   cluster and the version policy, store a job, cancel one.
//! - [`lease`]: one runner's claim on one job; every write of the job
//!   proves the claim first.
//! - [`steps`]: one step of one component against the cluster; each looks
//!   before it acts, so it is safe to run again after an interruption.
//! - [`job`]: a job from its stored position to its end, including the
//!   rollback or cleanup that ends a failed or cancelled job.
//! - [`runner`]: the background worker that finds jobs to drive.

pub mod job;
pub mod lease;
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
    /// This runner's id, recorded on the jobs it claims: `<pid>-<random>`,
    /// so that no two runners, in this process or another, share one.
    pub owner: Arc<str>,
    /// Tells event streams that a job changed.
    pub changes: crate::changes::Changes,
}

impl Context {
    pub fn new(
        db: Db,
        settings: Settings,
        metrics: Arc<crate::metrics::Metrics>,
        changes: crate::changes::Changes,
    ) -> Self {
        let owner = format!("{}-{:08x}", std::process::id(), rand::random::<u32>());
        Self { db, settings, metrics, owner: owner.into(), changes }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub retry: RetryPolicy,
    /// Longest time each wait may take (the seed: 2 minutes).
    pub wait_timeout: Duration,
    /// How often a wait looks again.
    pub poll_interval: Duration,
}

impl Settings {
    pub fn from_config(c: &ServeConfig) -> Self {
        Self {
            retry: RetryPolicy::from_config(c),
            wait_timeout: c.upgrade_wait_timeout,
            poll_interval: c.upgrade_poll_interval,
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
