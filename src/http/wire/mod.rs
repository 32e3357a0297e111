//! Wire types shared by more than one resource module: what clients send
//! and receive. Resource modules import these, never each other.

pub mod apply;
pub mod events;
pub mod named;
pub mod pools;
pub mod upgrades;

pub use events::EventList;
pub use pools::{PlanView, PoolView};

use axum::http::HeaderValue;

/// `path` of an object of `namespace`: as is in `default` (what clients that
/// never name a namespace see), else with its `namespace` parameter.
pub fn in_namespace(path: &str, namespace: &crate::domain::object::Namespace) -> String {
    if namespace.is_default() { path.to_owned() } else { format!("{path}?namespace={namespace}") }
}

/// The `Location` of a resource at `path` (`/v1/pools/web`). Paths are
/// built from names that passed their rules (DNS labels, numbers), so they
/// are always valid header values; a path that is not falls back to the
/// API's root rather than failing an answer whose change has committed.
pub fn location(path: &str) -> HeaderValue {
    HeaderValue::from_str(path).unwrap_or(HeaderValue::from_static("/v1"))
}
