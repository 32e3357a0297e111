//! Rollouts of a pool: progress, revisions, rollback, batch approval and
//! the dry-run plan.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::db::{pools::Pool, revisions::Revision};
use crate::domain::rollout::{self, Counts, RolloutState};
use crate::error::{ApiResult, Problem};
use crate::http::extract::{OptionalJson, OptionalMergePatch, Scope};
use crate::http::wire::PlanView;
use crate::http::wire::pools::{PoolPatch, PoolView, pool_response};
use crate::pools::Rollout;
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(get_rollout))
        .routes(routes!(continue_rollout))
        .routes(routes!(list_revisions))
        .routes(routes!(rollback_pool))
        .routes(routes!(plan_pool))
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Bounds {
    /// `max_surge` resolved against `replicas` (percentages round up).
    pub max_surge: u32,
    /// `max_unavailable` resolved against `replicas` (percentages round down).
    pub max_unavailable: u32,
    /// Both bounds rounded to zero, so unavailability was raised to 1 so
    /// that the rollout can move (Cluster API's rule).
    pub unavailable_raised_to_one: bool,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BatchStatus {
    pub approved_batches: i64,
    /// Machines one batch converts to the new image.
    pub batch_size: u32,
    /// The rollout waits for `POST .../rollout/continue`.
    pub awaiting_approval: bool,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RolloutView {
    pub pool: String,
    pub desired_image: String,
    pub revision: i64,
    pub state: RolloutState,
    /// Why the rollout is paused or stalled, when it is.
    pub reason: Option<String>,
    pub counts: Counts,
    pub replicas: u32,
    pub bounds: Bounds,
    pub batch: Option<BatchStatus>,
    pub started_at: Option<DateTime<Utc>>,
    pub last_progress_at: Option<DateTime<Utc>>,
    pub completed_at: Option<DateTime<Utc>>,
    /// Machines still to replace or create.
    pub remaining: u32,
    /// At the pace so far; absent until a machine has been replaced.
    pub estimated_seconds_remaining: Option<f64>,
}

impl From<Rollout> for RolloutView {
    fn from(r: Rollout) -> Self {
        rollout_view(&r.pool, r.counts)
    }
}

/// The rollout as it stands: counts observed now (so that they agree with
/// each other and with the spec just changed), progress from the last pass.
fn rollout_view(pool: &Pool, counts: Counts) -> RolloutView {
    let spec = &pool.spec;
    let s = &pool.status;
    let bounds = spec.strategy().resolve(spec.replicas());
    let progress = s.rollout.clone().filter(|p| p.revision == pool.revision);
    // Derived from the approvals (fresh) rather than the last pass's
    // condition, so that a continue shows at once.
    let allowed = u32::try_from(pool.batches_approved.max(1)).unwrap_or(u32::MAX).saturating_mul(bounds.batch_size());
    let awaiting = spec.strategy().batch_approval
        && counts.outdated > 0
        && counts.updated >= allowed.min(spec.replicas())
        && counts.total == spec.replicas();
    let fresh = s.observed_generation == pool.generation;
    let state = match &progress {
        Some(p) if fresh => rollout::state(p, &counts, spec.replicas(), spec.paused(), awaiting),
        _ if spec.paused() => RolloutState::Paused,
        _ => RolloutState::Progressing,
    };
    let reason = match state {
        RolloutState::Paused if spec.paused() => Some("the pool is paused (spec.paused)".to_owned()),
        RolloutState::Paused => {
            Some("batch done; waiting for POST /v1/pools/{name}/rollout/continue".replace("{name}", &pool.id.name))
        }
        RolloutState::Stalled => {
            let why = s
                .condition(crate::domain::status::ConditionType::MachinesHealthy)
                .filter(|c| c.status == crate::domain::status::ConditionStatus::False)
                .map(|c| format!("; {}: {}", c.reason, c.message))
                .unwrap_or_default();
            Some(format!("no progress for {} s (ProgressDeadlineExceeded){why}", spec.progress_deadline_seconds()))
        }
        _ => None,
    };
    let remaining = counts.outdated.max(spec.replicas().saturating_sub(counts.updated_available));
    let estimated_seconds_remaining = progress.as_ref().and_then(|p| {
        let elapsed = (crate::clock::wall() - p.started_at).num_milliseconds() as f64 / 1000.0;
        let done = f64::from(p.updated_available);
        (done > 0.0 && remaining > 0).then(|| elapsed / done * f64::from(remaining))
    });
    RolloutView {
        pool: pool.id.name.clone(),
        desired_image: spec.desired_image(),
        revision: pool.revision,
        state,
        reason,
        counts,
        replicas: spec.replicas(),
        bounds: Bounds {
            max_surge: bounds.max_surge,
            max_unavailable: bounds.max_unavailable,
            unavailable_raised_to_one: bounds.unavailable_raised,
        },
        batch: spec.strategy().batch_approval.then(|| BatchStatus {
            approved_batches: pool.batches_approved,
            batch_size: bounds.batch_size(),
            awaiting_approval: awaiting,
        }),
        started_at: progress.as_ref().map(|p| p.started_at),
        last_progress_at: progress.as_ref().map(|p| p.last_progress_at),
        completed_at: progress.as_ref().and_then(|p| p.completed_at),
        remaining,
        estimated_seconds_remaining,
    }
}

/// Progress of the pool's current rollout.
#[utoipa::path(get, path = "/v1/pools/{name}/rollout", tag = "rollouts",
    params(("name" = String, Path, description = "Pool name")),
    responses(
        (status = 200, description = "Rollout progress", body = RolloutView),
        (status = 404, description = "No such pool", body = Problem, content_type = "application/problem+json"),
    ))]
async fn get_rollout(
    State(state): State<AppState>,
    scope: Scope,
    Path(name): Path<String>,
) -> ApiResult<Json<RolloutView>> {
    Ok(Json(state.pools.rollout(&scope.single()?, &name).await?.into()))
}

/// Approve the next batch of a rollout with `strategy.batch_approval`.
#[utoipa::path(post, path = "/v1/pools/{name}/rollout/continue", tag = "rollouts",
    params(("name" = String, Path, description = "Pool name")),
    responses(
        (status = 200, description = "Next batch approved", body = RolloutView),
        (status = 404, description = "No such pool", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The pool has no batch approval or no rollout waiting", body = Problem, content_type = "application/problem+json"),
    ))]
#[tracing::instrument(skip(state))]
async fn continue_rollout(
    State(state): State<AppState>,
    scope: Scope,
    Path(name): Path<String>,
) -> ApiResult<Json<RolloutView>> {
    Ok(Json(state.pools.approve_batch(&scope.single()?, &name).await?.into()))
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RevisionList {
    /// The pool's current revision.
    pub current: i64,
    /// Newest first.
    pub items: Vec<Revision>,
}

/// Every desired image the pool has had.
#[utoipa::path(get, path = "/v1/pools/{name}/revisions", tag = "rollouts",
    params(("name" = String, Path, description = "Pool name")),
    responses(
        (status = 200, description = "Revisions, newest first", body = RevisionList),
        (status = 404, description = "No such pool", body = Problem, content_type = "application/problem+json"),
    ))]
async fn list_revisions(
    State(state): State<AppState>,
    scope: Scope,
    Path(name): Path<String>,
) -> ApiResult<Json<RevisionList>> {
    let (current, items) = state.pools.revisions(&scope.single()?, &name).await?;
    Ok(Json(RevisionList { current, items }))
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RollbackRequest {
    /// Revision to return to; default: the newest earlier one with another image.
    pub revision: Option<i64>,
}

/// Return the pool to an earlier revision's version and image. The body
/// may be omitted.
#[utoipa::path(post, path = "/v1/pools/{name}/rollback", tag = "rollouts",
    params(("name" = String, Path, description = "Pool name")),
    request_body(content = RollbackRequest, description = "Optional; leave the body out to return to the previous revision", content_type = "application/json"),
    responses(
        (status = 202, description = "Rolling back; follow `GET .../rollout`", body = PoolView),
        (status = 404, description = "No such pool", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Nothing to roll back to, or the pool changed meanwhile", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "No such revision", body = Problem, content_type = "application/problem+json"),
    ))]
#[tracing::instrument(skip(state, body))]
async fn rollback_pool(
    State(state): State<AppState>,
    scope: Scope,
    Path(name): Path<String>,
    OptionalJson(body): OptionalJson<RollbackRequest>,
) -> ApiResult<Response> {
    let req = body.unwrap_or_default();
    let pool = state.pools.rollback(&scope.single()?, &name, req.revision).await?;
    Ok(pool_response(StatusCode::ACCEPTED, pool, true))
}

/// Dry run: the actions the reconciler would take now, for the pool as it
/// is or with a proposed change (a JSON merge patch of the spec). Nothing
/// is changed.
#[utoipa::path(post, path = "/v1/pools/{name}/plan", tag = "rollouts",
    params(("name" = String, Path, description = "Pool name")),
    request_body(content = PoolPatch, description = "Optional merge patch of the spec to try; leave the body out to plan the pool as it is", content_type = "application/merge-patch+json"),
    responses(
        (status = 200, description = "The plan", body = PlanView),
        (status = 400, description = "Body is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such pool", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The proposed spec breaks a rule", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The container runtime is unreachable", body = Problem, content_type = "application/problem+json"),
    ))]
async fn plan_pool(
    State(state): State<AppState>,
    scope: Scope,
    Path(name): Path<String>,
    OptionalMergePatch(patch): OptionalMergePatch<serde_json::Value>,
) -> ApiResult<Json<PlanView>> {
    let planned = state.pools.plan(&scope.single()?, &name, patch.as_ref()).await?;
    let desired_image = planned.pool.spec.desired_image();
    Ok(Json(PlanView { pool: name, desired_image, plan: planned.plan, observed: planned.observed }))
}
