//! A pool's desired state.
//!
//! - [`spec`]: `PoolSpec`, built only by its rules (`parse`, `with_replicas`,
//!   `patched`), so every spec in drover has passed them.
//! - [`document`]: the spec as a JSON document: what clients send
//!   (`PoolSpecInput`), what they are shown and the store keeps
//!   (`PoolSpecView`). A patch is merged into the shown document and read
//!   back as input, so one set of rules covers create, patch and scale.
//! - [`patch`]: a merge patch (`PoolPatch`): its schema is made from the
//!   input's, and its types are checked before the pool is read.
//! - [`host`]: what the server's settings let machines mount and run.
//!
//! Adding a field to a pool means: the field in the two documents of
//! `document` (what clients send, what they see; a test fails until it is
//! in both), its rule in `spec`'s `parse`, and nothing else here: the
//! patch's schema and checks, the store (which keeps the shown document)
//! and `drover apply` (whose documents are the input) follow.

pub mod change;
pub mod document;
pub mod host;
pub mod patch;
pub mod spec;

use chrono::{DateTime, Utc};

pub use change::{OPERATOR_FIELDS, change_role};
pub use document::{PoolSpecInput, PoolSpecView, StrategyInput, StrategyView};
pub use host::{DOCKER_SOCKETS, HostPolicy, SpecLimits, normalize_host_path};
pub use patch::PoolPatch;
pub use spec::{
    DEFAULT_MACHINE_READY_TIMEOUT_SECONDS, DEFAULT_PROGRESS_DEADLINE_SECONDS, MAX_FAILURE_DOMAINS, MAX_MOUNTS,
    MAX_SECONDS, Mount, PoolSpec, RESERVED_LABEL_PREFIX, describe_change,
};

/// A pool as stored: its spec, what its last pass observed, and
/// bookkeeping. What the reconciler decides from and the API shows.
#[derive(Debug, Clone)]
pub struct Pool {
    /// Its namespace and name.
    pub id: crate::domain::object::PoolRef,
    pub generation: i64,
    /// Bumped by every write of the row (spec, status, deletion, approvals):
    /// which of two reads of the pool is the newer.
    pub version: i64,
    pub spec: PoolSpec,
    pub status: crate::domain::status::PoolStatus,
    pub deleting: bool,
    /// Current revision of the desired image.
    pub revision: i64,
    /// Batches of the current rollout approved so far.
    pub batches_approved: i64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl Pool {
    /// The cluster its machines join, if any: one of its own namespace.
    pub fn cluster(&self) -> Option<crate::domain::object::ClusterRef> {
        let name = self.spec.cluster()?;
        Some(crate::domain::object::ClusterRef::new(self.id.namespace.clone(), name))
    }
}
