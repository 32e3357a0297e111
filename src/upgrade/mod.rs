//! Control-plane upgrade jobs: the runner that drives each job through its
//! persisted steps against a cluster, and the pure planning it relies on.
//!
//! - [`plan`]: the objects an upgrade writes, and the dry-run plan (pure).
//! - [`steps`]: one step of one component against the cluster; each is safe
//!   to run again after an interruption.
//! - [`job`]: a job from its stored position to its end, including the
//!   rollback or cleanup that ends a failed or cancelled job.
//! - [`runner`]: the background worker that finds jobs to drive.

pub mod job;
pub mod plan;
pub mod runner;
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
    /// Tells event streams that a job changed.
    pub changes: crate::changes::Changes,
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
            retry: RetryPolicy {
                tries: c.upgrade_api_tries,
                backoff: c.upgrade_retry_backoff,
                call_timeout: c.kube_request_timeout,
            },
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
