//! Control-plane upgrade jobs: ask for the plan of one on a cluster, start
//! one, follow it, read its events, cancel it. The handlers parse and answer;
//! `upgrade::service` checks the request against the cluster and the
//! version policy, stores the job and cancels it; the runner does the work.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::db::upgrades::Job;
use crate::domain::upgrade::JobState;
use crate::error::{ApiError, ApiResult, Problem};
use crate::http::extract::{ApiJson, ApiQuery, Scope};
use crate::http::pagination::PageParams;
use crate::http::wire::upgrades::UpgradeView;
use crate::http::wire::{EventList, in_namespace, location};
use crate::state::AppState;
use crate::upgrade::service::UpgradeError;
pub use crate::upgrade::service::{NewUpgrade, UpgradePlan};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_upgrade))
        .routes(routes!(plan_upgrade))
        .routes(routes!(list_upgrades))
        .routes(routes!(get_upgrade))
        .routes(routes!(list_upgrade_events))
        .routes(routes!(cancel_upgrade))
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct UpgradeList {
    /// Newest first.
    pub items: Vec<UpgradeView>,
    /// Pass as `cursor` to get the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UpgradeFilter {
    /// Only jobs of this cluster.
    pub cluster: Option<String>,
    /// Only jobs in this state.
    #[param(inline)]
    pub state: Option<JobState>,
}

impl From<UpgradeError> for ApiError {
    fn from(e: UpgradeError) -> Self {
        match e {
            UpgradeError::NotFound(id) => ApiError::not_found("upgrade job", id),
            UpgradeError::Cluster(e) => e.into(),
            UpgradeError::Invalid(errs) => ApiError::Validation(errs),
            UpgradeError::Denied(denied) => denied.into(),
            UpgradeError::Active { .. } | UpgradeError::Ended { .. } => ApiError::Conflict(e.to_string()),
            UpgradeError::Unreachable(why) => ApiError::Unavailable(why),
            UpgradeError::Store(e) => ApiError::Database(e),
        }
    }
}

fn job_location(job: &Job) -> [(header::HeaderName, HeaderValue); 1] {
    [(header::LOCATION, location(&in_namespace(&format!("/v1/upgrades/{}", job.id), &job.cluster.namespace)))]
}

/// Start an upgrade of a cluster's control plane: a job, which a runner
/// carries out one component at a time. kubeadm's version policy applies
/// unless `force` is set. `image_repository` (other than the default) and
/// `force` need the admin role. `POST .../upgrades/plan` answers what the
/// same body would do, without starting anything.
#[utoipa::path(post, path = "/v1/clusters/{name}/upgrades", tag = "upgrades",
    params(("name" = String, Path, description = "Cluster name")),
    request_body(content = NewUpgrade, content_type = "application/json"),
    responses(
        (status = 202, description = "Job accepted; poll `Location`", body = UpgradeView,
            headers(("Location" = String, description = "URL of the job"))),
        (status = 400, description = "Body is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "`image_repository` or `force` asked for without the admin role", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such cluster", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A job is already active on the cluster; `detail` names it", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Body is not declared as JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid field, a version policy rule broken (`errors[].rule`: version_format, no_downgrade, major_version, minor_skip), or `dry_run: true` (a dry run is `POST .../upgrades/plan`; nothing is started)", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The cluster did not answer, or its stored credentials cannot be used", body = Problem, content_type = "application/problem+json"),
    ))]
#[tracing::instrument(skip_all, fields(cluster = %name, version = %body.version))]
async fn create_upgrade(
    State(state): State<AppState>,
    scope: Scope,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<NewUpgrade>,
) -> ApiResult<Response> {
    let job = state.upgrades.create(&scope.single()?, &name, &body).await?;
    let location = job_location(&job.job);
    Ok((StatusCode::ACCEPTED, location, Json(UpgradeView::from(job))).into_response())
}

/// The plan of an upgrade of a cluster's control plane: what a job started
/// with the same body would do, read from what the cluster runs now (each
/// component's current and new image, and the steps it would take).
/// Stores and changes nothing. The checks are a start's: the version
/// policy, and the admin role for `image_repository` and `force`.
#[utoipa::path(post, path = "/v1/clusters/{name}/upgrades/plan", tag = "upgrades",
    params(("name" = String, Path, description = "Cluster name")),
    request_body(content = NewUpgrade, content_type = "application/json"),
    responses(
        (status = 200, description = "The plan", body = UpgradePlan),
        (status = 403, description = "`image_repository` or `force` asked for without the admin role", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such cluster", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid field, a version policy rule broken (`errors[].rule`: version_format, no_downgrade, major_version, minor_skip), or `dry_run: false`", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The cluster did not answer, or its stored credentials cannot be used", body = Problem, content_type = "application/problem+json"),
    ))]
#[tracing::instrument(skip_all, fields(cluster = %name, version = %body.version))]
async fn plan_upgrade(
    State(state): State<AppState>,
    scope: Scope,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<NewUpgrade>,
) -> ApiResult<Json<UpgradePlan>> {
    Ok(Json(state.upgrades.plan(&scope.single()?, &name, &body).await?))
}

/// List upgrade jobs, newest first.
#[utoipa::path(get, path = "/v1/upgrades", tag = "upgrades", params(UpgradeFilter, PageParams),
    responses(
        (status = 200, description = "A page of jobs", body = UpgradeList),
        (status = 422, description = "Bad `state`, `limit` or `cursor`", body = Problem, content_type = "application/problem+json"),
    ))]
#[tracing::instrument(skip_all)]
async fn list_upgrades(
    State(state): State<AppState>,
    scope: Scope,
    ApiQuery(filter): ApiQuery<UpgradeFilter>,
    ApiQuery(page): ApiQuery<PageParams>,
) -> ApiResult<Json<UpgradeList>> {
    let access = scope.single()?;
    let page = state.upgrades.list(&access, filter.cluster.as_deref(), filter.state, &page.request_by_id()?).await?;
    Ok(Json(UpgradeList {
        items: page.items.into_iter().map(UpgradeView::from).collect(),
        next_cursor: page.next_cursor,
    }))
}

/// Read a job: its state, where it is, and every step so far.
#[utoipa::path(get, path = "/v1/upgrades/{id}", tag = "upgrades", params(("id" = i64, Path, description = "Job id")),
    responses(
        (status = 200, description = "The job", body = UpgradeView),
        (status = 404, description = "No such job", body = Problem, content_type = "application/problem+json"),
    ))]
#[tracing::instrument(skip_all, fields(job = %id))]
async fn get_upgrade(
    State(state): State<AppState>,
    scope: Scope,
    Path(id): Path<String>,
) -> ApiResult<Json<UpgradeView>> {
    Ok(Json(state.upgrades.get(&scope.single()?, &id).await?.into()))
}

/// The job's events, newest first.
#[utoipa::path(get, path = "/v1/upgrades/{id}/events", tag = "upgrades",
    params(("id" = i64, Path, description = "Job id"), PageParams),
    responses(
        (status = 200, description = "A page of events", body = EventList),
        (status = 404, description = "No such job", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Bad `limit` or `cursor`", body = Problem, content_type = "application/problem+json"),
    ))]
#[tracing::instrument(skip_all, fields(job = %id))]
async fn list_upgrade_events(
    State(state): State<AppState>,
    scope: Scope,
    Path(id): Path<String>,
    ApiQuery(page): ApiQuery<PageParams>,
) -> ApiResult<Json<EventList>> {
    Ok(Json(state.upgrades.events(&scope.single()?, &id, &page.request_by_id()?).await?.into()))
}

/// Cancel a job. A pending job is cancelled at once (200); a running one
/// stops at its next safe point (202), leaving no temporary DaemonSet and
/// each component at its old or its new spec, as the job then reports.
#[utoipa::path(post, path = "/v1/upgrades/{id}/cancel", tag = "upgrades", params(("id" = i64, Path, description = "Job id")),
    responses(
        (status = 200, description = "The job is cancelled", body = UpgradeView),
        (status = 202, description = "The job stops at its next safe point; poll `Location`", body = UpgradeView,
            headers(("Location" = String, description = "URL of the job"))),
        (status = 404, description = "No such job", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The job already ended", body = Problem, content_type = "application/problem+json"),
    ))]
#[tracing::instrument(skip_all, fields(job = %id))]
async fn cancel_upgrade(State(state): State<AppState>, scope: Scope, Path(id): Path<String>) -> ApiResult<Response> {
    let job = state.upgrades.cancel(&scope.single()?, &id).await?;
    let running = job.job.state == JobState::Running;
    let status = if running { StatusCode::ACCEPTED } else { StatusCode::OK };
    let location = job_location(&job.job);
    Ok((status, location, Json(UpgradeView::from(job))).into_response())
}
