//! The Kubernetes side of drover: turning stored credentials into a
//! `kube::Client`, and the few DaemonSet, Pod and probe operations the
//! upgrade runner and the cluster status need, and the cordon and drain of
//! a machine's node before the machine goes, each bounded in time and
//! retried on transient failures. (Named `k8s` so that it never shadows the
//! `kube` crate.)

pub mod credentials;
pub mod drain;
pub mod images;
pub mod ops;

pub use credentials::{CredentialError, Credentials};
pub use drain::{DrainError, DrainSettings, Drained, NodeSettings};
pub use images::{daemonset_image, pod_image};
pub use ops::{CallError, ClusterApi, Deletion, RetryPolicy};
