//! The pools API's wire types. The spec's documents (`PoolSpecInput` sent,
//! `PoolSpecView` shown, `PoolPatch` the shape of a merge patch) live with
//! the spec in `domain::pool`; here are the rest:
//! - [`create`]: the scale body (the create body is `named::CreatePool`);
//! - [`view`]: a pool as answered, with its status, and its `ETag`.

pub mod create;
pub mod view;

pub use super::named::CreatePool;
pub use crate::domain::pool::{PoolPatch, PoolSpecInput, PoolSpecView, StrategyInput, StrategyView};
pub use create::Scale;
pub use view::{PoolList, PoolPhase, PoolView, etag, pool_response};

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::domain::rollout::Counts;
use crate::reconcile::plan::Plan;

/// What the reconciler would do next for a pool (a dry run).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PlanView {
    pub pool: String,
    /// The image the plan converges to.
    pub desired_image: String,
    /// What the next pass would do now, in order: deletions, starts, creations.
    pub plan: Plan,
    /// Machine counts as observed now.
    pub observed: Counts,
}
