//! Registered Kubernetes clusters as an application.
//!
//! - [`connect`]: the one way from a cluster's stored credentials to a
//!   client of its API, for the API's probes and plans, the upgrade runner
//!   and the drains of pools' nodes.
//! - [`Clusters`]: register (credentials checked, never shown again),
//!   list, read, delete, probe.
//! - [`probe`]: what a probe of the control plane saw.

mod connect;
mod input;
pub mod probe;
mod service;

pub use connect::{ConnectError, check, connect};
pub use input::{ClusterSpecInput, NewCluster};
pub use service::{ClusterError, Clusters, Prepared, target};
