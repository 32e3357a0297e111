//! Builders the reconciler's unit tests share: pools and engines (machines
//! as observed: `Observed::for_test`).

use chrono::{DateTime, Utc};

use super::observe::EngineView;
use crate::domain::pool::Pool;
use crate::domain::pool::{PoolSpec, SpecLimits};
use crate::domain::status::PoolStatus;

/// A pool named `p` at generation 1 and revision 1, with `spec` (a JSON
/// document of the spec's fields) and an empty status.
pub fn pool(spec: serde_json::Value) -> Pool {
    let spec = crate::domain::json::document(spec).and_then(|s| PoolSpec::parse(s, &SpecLimits::unrestricted()));
    Pool {
        id: "p".into(),
        generation: 1,
        version: 1,
        spec: spec.expect("a valid test spec"),
        status: PoolStatus::default(),
        deleting: false,
        revision: 1,
        batches_approved: 0,
        created_at: t0(),
        updated_at: t0(),
    }
}

/// An engine that answers and takes new machines.
pub fn engine(name: &str) -> EngineView {
    EngineView {
        name: name.into(),
        reachable: true,
        lost: false,
        lost_at: None,
        error: None,
        allowed: true,
        fenced: false,
        unplaceable: None,
        failing: false,
        first_list: false,
    }
}

pub fn t0() -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000, 0).unwrap_or_default()
}
