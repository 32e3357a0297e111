//! How a pool's spec is stored: the JSON document in `pools.spec`.
//!
//! Its own type, so that the domain's `PoolSpec` and the API's views can
//! change without changing what is on disk. Fields added after the first
//! release carry a serde default, so that rows written before them still
//! read; `replicas` stays at the top level, where `decrement_replicas`
//! edits it in SQL.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::domain::pool::{DEFAULT_MACHINE_READY_TIMEOUT_SECONDS, DEFAULT_PROGRESS_DEADLINE_SECONDS, Mount, PoolSpec};
use crate::domain::strategy::{IntOrPercent, ReplacementPolicy, RolloutStrategy};
use crate::domain::version::KubeVersion;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredSpec {
    replicas: u32,
    version: KubeVersion,
    image: Option<String>,
    failure_domains: Vec<String>,
    extra_mounts: Vec<Mount>,
    labels: BTreeMap<String, String>,
    strategy: StoredStrategy,
    paused: bool,
    cluster: Option<String>,
    #[serde(default)]
    engines: Vec<String>,
    #[serde(default)]
    engine_selector: BTreeMap<String, String>,
    #[serde(default)]
    min_ready_seconds: u32,
    #[serde(default = "default_progress_deadline")]
    progress_deadline_seconds: u32,
    /// `null` in rows from before the default existed: the default.
    #[serde(default)]
    machine_ready_timeout_seconds: Option<u32>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct StoredStrategy {
    max_surge: IntOrPercent,
    max_unavailable: IntOrPercent,
    #[serde(default)]
    batch_approval: bool,
    #[serde(default)]
    auto_rollback: bool,
    #[serde(default)]
    replacement: ReplacementPolicy,
}

fn default_progress_deadline() -> u32 {
    DEFAULT_PROGRESS_DEADLINE_SECONDS
}

impl From<&PoolSpec> for StoredSpec {
    fn from(s: &PoolSpec) -> Self {
        let RolloutStrategy { max_surge, max_unavailable, batch_approval, auto_rollback, replacement } = s.strategy;
        StoredSpec {
            replicas: s.replicas,
            version: s.version,
            image: s.image.clone(),
            failure_domains: s.failure_domains.clone(),
            extra_mounts: s.extra_mounts.clone(),
            labels: s.labels.clone(),
            strategy: StoredStrategy { max_surge, max_unavailable, batch_approval, auto_rollback, replacement },
            paused: s.paused,
            cluster: s.cluster.clone(),
            engines: s.engines.clone(),
            engine_selector: s.engine_selector.clone(),
            min_ready_seconds: s.min_ready_seconds,
            progress_deadline_seconds: s.progress_deadline_seconds,
            machine_ready_timeout_seconds: Some(s.machine_ready_timeout_seconds),
        }
    }
}

impl From<StoredSpec> for PoolSpec {
    fn from(s: StoredSpec) -> Self {
        let StoredStrategy { max_surge, max_unavailable, batch_approval, auto_rollback, replacement } = s.strategy;
        PoolSpec {
            replicas: s.replicas,
            version: s.version,
            image: s.image,
            failure_domains: s.failure_domains,
            extra_mounts: s.extra_mounts,
            labels: s.labels,
            strategy: RolloutStrategy { max_surge, max_unavailable, batch_approval, auto_rollback, replacement },
            paused: s.paused,
            cluster: s.cluster,
            engines: s.engines,
            engine_selector: s.engine_selector,
            min_ready_seconds: s.min_ready_seconds,
            progress_deadline_seconds: s.progress_deadline_seconds,
            machine_ready_timeout_seconds: s
                .machine_ready_timeout_seconds
                .unwrap_or(DEFAULT_MACHINE_READY_TIMEOUT_SECONDS),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_from_the_first_release_still_reads() {
        let old = r#"{"replicas": 2, "version": "v1.29.2", "image": null, "failure_domains": [],
            "extra_mounts": [], "labels": {}, "strategy": {"max_surge": 1, "max_unavailable": 0}, "paused": false,
            "cluster": null}"#;
        let spec = PoolSpec::from(serde_json::from_str::<StoredSpec>(old).unwrap());
        assert_eq!(spec.progress_deadline_seconds, DEFAULT_PROGRESS_DEADLINE_SECONDS);
        assert_eq!(spec.machine_ready_timeout_seconds, DEFAULT_MACHINE_READY_TIMEOUT_SECONDS);
        assert_eq!(spec.strategy, RolloutStrategy::default());
    }
}
