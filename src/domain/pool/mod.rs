//! A pool's desired state.
//!
//! - [`spec`]: `PoolSpec`, built only by its rules (`parse`, `with_replicas`,
//!   `patched`), so every spec in drover has passed them.
//! - [`document`]: the spec as a JSON document: what clients send
//!   (`PoolSpecInput`), what they are shown and the store keeps
//!   (`PoolSpecView`). A patch is merged into the shown document and read
//!   back as input, so one set of rules covers create, patch and scale.
//! - [`patch`]: the shape of a merge patch (`PoolPatch`), declared to
//!   clients and checked before a patch is merged.
//! - [`host`]: what the server's settings let machines mount and run.
//!
//! Adding a field to a pool means: the field and its rule in `spec`, the
//! field in the two documents (a test fails until it is in both, and in
//! the API's patch schema), and nothing else; the store keeps the document.

pub mod document;
pub mod host;
pub mod patch;
pub mod spec;

pub use document::{PoolSpecInput, PoolSpecView, StrategyInput, StrategyView};
pub use host::{DOCKER_SOCKETS, HostPolicy, SpecLimits, normalize_host_path};
pub use patch::{PoolPatch, StrategyPatch};
pub use spec::{
    DEFAULT_MACHINE_READY_TIMEOUT_SECONDS, DEFAULT_PROGRESS_DEADLINE_SECONDS, MAX_FAILURE_DOMAINS, MAX_MOUNTS,
    MAX_SECONDS, Mount, PoolSpec, RESERVED_LABEL_PREFIX, describe_change,
};
