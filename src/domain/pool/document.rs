//! A pool's spec as a JSON document.
//!
//! - [`PoolSpecInput`]: what a client sends to create a pool, loosely typed
//!   so that every broken rule is reported at once with its field; also
//!   what a merge patch and a stored row are read as.
//! - [`PoolSpecView`]: every field with its default filled in: what a
//!   client is shown, what a patch is merged into, and what the store keeps
//!   (so a stored row is read back through the same rules).
//!
//! Both are the spec field for field: `PoolSpecView::from` builds every
//! field and the parse in `spec` destructures the input in full, so a field
//! missing from either does not compile; a test compares the two documents'
//! field names (and the API's patch schema's).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::spec::Mount;
use crate::domain::strategy::{IntOrPercent, ReplacementPolicy, RolloutStrategy};

/// A pool's spec as clients send it. Unknown fields are refused.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PoolSpecInput {
    /// Desired number of machines, 0 to the server's maximum (default 1000).
    #[schema(minimum = 0, maximum = 1000)]
    pub replicas: i64,
    /// Kubernetes version, `vMAJOR.MINOR.PATCH`.
    #[schema(example = "v1.29.2", pattern = r"^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$")]
    pub version: String,
    /// Custom image; overrides `kindest/node:<version>`.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 255)]
    pub image: Option<String>,
    /// Failure domains the machines are spread over, evenly (default: none).
    #[serde(default)]
    #[schema(max_items = 64)]
    pub failure_domains: Vec<String>,
    /// Host paths bind-mounted into every machine (default: none).
    #[serde(default)]
    #[schema(max_items = 64)]
    pub extra_mounts: Vec<Mount>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub strategy: Option<StrategyInput>,
    /// No rollout changes while set; status keeps updating.
    #[serde(default)]
    pub paused: bool,
    /// Registered cluster whose nodes the machines are; their nodes are
    /// cordoned and drained before they are removed.
    #[serde(default)]
    #[schema(pattern = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length = 63)]
    pub cluster: Option<String>,
    /// Engines the machines may run on, by name (default: every engine).
    #[serde(default)]
    #[schema(max_items = 64)]
    pub engines: Vec<String>,
    /// Engines the machines may run on, by label (default: every engine);
    /// not together with `engines`.
    #[serde(default)]
    pub engine_selector: BTreeMap<String, String>,
    /// Seconds a new machine must be ready before it counts as available (default 0).
    #[serde(default)]
    #[schema(minimum = 0, maximum = 86400)]
    pub min_ready_seconds: Option<i64>,
    /// Seconds without progress before a rollout is reported stalled
    /// (default 600); more than `min_ready_seconds`.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 86400)]
    pub progress_deadline_seconds: Option<i64>,
    /// Seconds after which an up-to-date machine that runs but never became ready is replaced (default 300).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 86400)]
    pub machine_ready_timeout_seconds: Option<i64>,
    /// Seconds a machine's container gets to stop when the machine is
    /// deleted, before it is killed (default: the server's `--stop-timeout`).
    #[serde(default)]
    #[schema(minimum = 0, maximum = 86400)]
    pub stop_grace_period_seconds: Option<i64>,
}

#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StrategyInput {
    /// Machines allowed above `replicas` during a rollout (default 1).
    pub max_surge: Option<IntOrPercent>,
    /// Machines allowed below `replicas` available during a rollout (default 0).
    pub max_unavailable: Option<IntOrPercent>,
    /// Pause after each batch until `POST .../rollout/continue` (default false).
    #[serde(default)]
    pub batch_approval: bool,
    /// Roll back by itself when the progress deadline passes (default false).
    #[serde(default)]
    pub auto_rollback: bool,
    /// Whether a machine being deleted counts toward `replicas + max_surge`
    /// (default `termination_started`: it does not).
    #[serde(default)]
    pub replacement: Option<ReplacementPolicy>,
}

impl StrategyInput {
    /// The strategy with every default filled in.
    pub fn resolve(self) -> RolloutStrategy {
        let defaults = RolloutStrategy::default();
        let StrategyInput { max_surge, max_unavailable, batch_approval, auto_rollback, replacement } = self;
        RolloutStrategy {
            max_surge: max_surge.unwrap_or(defaults.max_surge),
            max_unavailable: max_unavailable.unwrap_or(defaults.max_unavailable),
            batch_approval,
            auto_rollback,
            replacement: replacement.unwrap_or_default(),
        }
    }
}

impl PoolSpecInput {
    /// `replicas` machines of `version`, everything else by default.
    pub fn minimal(replicas: i64, version: &str) -> Self {
        Self { replicas, version: version.to_owned(), ..Self::default() }
    }
}

/// A pool's spec as the API shows it, every default filled in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PoolSpecView {
    pub replicas: u32,
    #[schema(value_type = String, example = "v1.29.2")]
    pub version: String,
    /// The custom image, when one is set.
    pub image: Option<String>,
    pub failure_domains: Vec<String>,
    pub extra_mounts: Vec<Mount>,
    pub labels: BTreeMap<String, String>,
    pub strategy: RolloutStrategy,
    pub paused: bool,
    pub cluster: Option<String>,
    pub engines: Vec<String>,
    pub engine_selector: BTreeMap<String, String>,
    pub min_ready_seconds: u32,
    pub progress_deadline_seconds: u32,
    pub machine_ready_timeout_seconds: u32,
    /// `null`: the server's `--stop-timeout`.
    pub stop_grace_period_seconds: Option<u32>,
}

/// The `strategy` of a spec as shown: the rollout strategy itself.
pub type StrategyView = RolloutStrategy;

impl PoolSpecView {
    /// The document as JSON, for merging and comparing.
    pub fn to_json(&self) -> Value {
        // Strings, numbers, lists and maps with string keys: serializing
        // them cannot fail.
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::domain::json::schema_properties as properties;

    /// The field-mirror test: a field added to what clients send but not
    /// to what they see (and the store keeps), or the other way, fails.
    #[test]
    fn the_view_and_the_input_name_the_same_fields() {
        assert_eq!(properties::<PoolSpecView>(), properties::<PoolSpecInput>());
        assert_eq!(properties::<StrategyView>(), properties::<StrategyInput>());
    }
}
