//! Control-plane upgrade jobs: start one on a cluster (or ask for its plan),
//! follow it, read its events, cancel it. The handlers parse and answer;
//! `upgrade::service` checks the request against the cluster and the
//! version policy, stores the job and cancels it; the runner does the work.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::auth::{Caller, Role};
use crate::clusters::service::connect;
use crate::db::{self, upgrades::CancelOutcome};
use crate::domain::event::SubjectKind;
use crate::domain::image::check_image_reference;
use crate::domain::upgrade::{Component, DEFAULT_IMAGE_REPOSITORY, JobState, order_components};
use crate::domain::version::KubeVersion;
use crate::error::{ApiError, ApiResult, Problem};
use crate::http::extract::{ApiJson, ApiQuery};
use crate::http::pagination::{PageParams, finish_page};
use crate::http::wire::EventList;
use crate::http::wire::upgrades::{UpgradeView, load, parse_id, view};
use crate::state::AppState;
use crate::upgrade::plan::ComponentPlan;
use crate::upgrade::service::{self, PrepareError, StartError, UpgradeRequest};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_upgrade))
        .routes(routes!(list_upgrades))
        .routes(routes!(get_upgrade))
        .routes(routes!(list_upgrade_events))
        .routes(routes!(cancel_upgrade))
}

/// Body of `POST /v1/clusters/{name}/upgrades`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateUpgrade {
    /// Target version, `vMAJOR.MINOR.PATCH`.
    #[schema(example = "v1.30.0", pattern = r"^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$")]
    pub version: String,
    /// Components to upgrade; all three by default. They are always
    /// upgraded in the order kube-apiserver, kube-controller-manager, kube-scheduler.
    pub components: Option<Vec<Component>>,
    /// Registry the images come from (`<repository>/<component>:<version>`).
    /// Any value but the default (`registry.k8s.io`) needs the admin role.
    #[schema(example = "registry.k8s.io")]
    pub image_repository: Option<String>,
    /// Bypass the version policy (downgrades, skipped minor versions).
    /// Needs the admin role.
    #[serde(default)]
    pub force: bool,
    /// Answer the plan instead of starting a job.
    #[serde(default)]
    pub dry_run: bool,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct UpgradeList {
    /// Newest first.
    pub items: Vec<UpgradeView>,
    /// Pass as `cursor` to get the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

/// The dry-run answer: what a job would do.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct UpgradePlan {
    pub cluster: String,
    pub current_version: Option<String>,
    pub target_version: KubeVersion,
    pub components: Vec<ComponentPlan>,
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

fn location(id: i64) -> HeaderValue {
    HeaderValue::from_str(&format!("/v1/upgrades/{id}")).unwrap_or(HeaderValue::from_static("/v1/upgrades"))
}

fn active_conflict(cluster: &str, id: i64) -> ApiError {
    ApiError::Conflict(format!(
        "upgrade job {id} is already active on cluster {cluster:?}; follow /v1/upgrades/{id} or cancel it first"
    ))
}

/// Whether the caller may choose this: a registry other than the default,
/// or `force`, decide what runs as the control plane, so they are the
/// admin's (SECURITY.md).
fn check_admin_only(body: &CreateUpgrade, caller: Option<&Caller>) -> ApiResult<()> {
    if caller.is_some_and(|c| c.role >= Role::Admin) {
        return Ok(());
    }
    let repository = body.image_repository.as_deref().is_some_and(|r| r != DEFAULT_IMAGE_REPOSITORY);
    if repository || body.force {
        let field = if repository { "image_repository" } else { "force" };
        tracing::info!(field, "a non-admin asked for an admin-only upgrade parameter");
        return Err(ApiError::Forbidden { need: "admin" });
    }
    Ok(())
}

/// Start an upgrade of a cluster's control plane, or with `dry_run` answer
/// its plan. kubeadm's version policy applies unless `force` is set.
/// `image_repository` (other than the default) and `force` need the admin
/// role.
#[utoipa::path(post, path = "/v1/clusters/{name}/upgrades", tag = "upgrades",
    params(("name" = String, Path, description = "Cluster name")),
    request_body(content = CreateUpgrade, content_type = "application/json"),
    responses(
        (status = 200, description = "`dry_run`: the plan", body = UpgradePlan),
        (status = 202, description = "Job accepted; poll `Location`", body = UpgradeView,
            headers(("Location" = String, description = "URL of the job"))),
        (status = 400, description = "Body is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "`image_repository` or `force` asked for without the admin role", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such cluster", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A job is already active on the cluster; `detail` names it", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Body is not declared as JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid field, or a version policy rule broken (`errors[].rule`: version_format, no_downgrade, major_version, minor_skip)", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The cluster did not answer, or its stored credentials cannot be used", body = Problem, content_type = "application/problem+json"),
    ))]
#[tracing::instrument(skip_all, fields(cluster = %name, version = %body.version))]
async fn create_upgrade(
    State(state): State<AppState>,
    Path(name): Path<String>,
    caller: Option<axum::Extension<Caller>>,
    ApiJson(body): ApiJson<CreateUpgrade>,
) -> ApiResult<Response> {
    let request = parse_create(&name, &body, caller.as_deref())?;
    let target = request.target;
    db::clusters::get(state.db.read(), &name).await?.ok_or_else(|| ApiError::not_found("cluster", &name))?;
    if !body.dry_run
        && let Some(id) = db::upgrades::active_for_cluster(state.db.read(), &name).await?
    {
        return Err(active_conflict(&name, id));
    }

    let api = connect(&state, &name, 2).await?;
    let prepared = service::prepare(&api, request).await.map_err(|e| match e {
        PrepareError::Unreachable { .. } => ApiError::Unavailable(e.to_string()),
        PrepareError::Policy(v) => ApiError::invalid("version", v.rule, v.message),
    })?;
    if body.dry_run {
        let p = UpgradePlan {
            cluster: name,
            current_version: prepared.current.map(|v| v.to_string()),
            target_version: target,
            components: prepared.components,
        };
        return Ok((StatusCode::OK, Json(p)).into_response());
    }
    let job = service::start(&state.db, &prepared).await.map_err(|e| match e {
        StartError::Active(id) => active_conflict(&name, id),
        StartError::Store(e) => e.into(),
    })?;
    state.upgrades.wake();
    let id = job.id;
    let body = view(&state, job).await?;
    Ok((StatusCode::ACCEPTED, [(header::LOCATION, location(id))], Json(body)).into_response())
}

/// The upgrade a create body asks for, with every field checked.
fn parse_create(cluster: &str, body: &CreateUpgrade, caller: Option<&Caller>) -> ApiResult<UpgradeRequest> {
    let target: KubeVersion = body.version.parse().map_err(|e| ApiError::invalid("version", "version_format", e))?;
    let components = order_components(body.components.as_deref().unwrap_or(&Component::ALL))
        .map_err(|e| ApiError::invalid("components", "components", e))?;
    check_admin_only(body, caller)?;
    let repo = body.image_repository.clone().unwrap_or_else(|| DEFAULT_IMAGE_REPOSITORY.to_owned());
    check_image_reference(&format!("{repo}/kube-apiserver:{target}"))
        .map_err(|e| ApiError::invalid("image_repository", "image_repository", e))?;
    Ok(UpgradeRequest { cluster: cluster.to_owned(), target, components, image_repository: repo, force: body.force })
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
    ApiQuery(filter): ApiQuery<UpgradeFilter>,
    ApiQuery(page): ApiQuery<PageParams>,
) -> ApiResult<Json<UpgradeList>> {
    let limit = page.limit()?;
    let before = page.after_id()?;
    let mut jobs =
        db::upgrades::list(state.db.read(), filter.cluster.as_deref(), filter.state, before, limit + 1).await?;
    let next_cursor = finish_page(&mut jobs, limit, |j| j.id.to_string());
    let mut items = Vec::with_capacity(jobs.len());
    for job in jobs {
        items.push(view(&state, job).await?);
    }
    Ok(Json(UpgradeList { items, next_cursor }))
}

/// Read a job: its state, where it is, and every step so far.
#[utoipa::path(get, path = "/v1/upgrades/{id}", tag = "upgrades", params(("id" = i64, Path, description = "Job id")),
    responses(
        (status = 200, description = "The job", body = UpgradeView),
        (status = 404, description = "No such job", body = Problem, content_type = "application/problem+json"),
    ))]
#[tracing::instrument(skip_all, fields(job = %id))]
async fn get_upgrade(State(state): State<AppState>, Path(id): Path<String>) -> ApiResult<Json<UpgradeView>> {
    let job = load(&state, &id).await?;
    Ok(Json(view(&state, job).await?))
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
    Path(id): Path<String>,
    ApiQuery(page): ApiQuery<PageParams>,
) -> ApiResult<Json<EventList>> {
    let limit = page.limit()?;
    let before = page.after_id()?;
    let job = load(&state, &id).await?;
    let mut rows = db::events::list(state.db.read(), SubjectKind::Job, &job.id.to_string(), before, limit + 1).await?;
    let next_cursor = finish_page(&mut rows, limit, |e| e.id.to_string());
    Ok(Json(EventList { items: rows, next_cursor }))
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
async fn cancel_upgrade(State(state): State<AppState>, Path(id): Path<String>) -> ApiResult<Response> {
    let job_id = parse_id(&id)?;
    let (job, outcome) =
        service::cancel(&state.db, job_id).await?.ok_or_else(|| ApiError::not_found("upgrade job", &id))?;
    if outcome == CancelOutcome::Ended {
        return Err(ApiError::Conflict(format!("upgrade job {id} already ended ({})", job.state.as_str())));
    }
    let status = if job.state == JobState::Running { StatusCode::ACCEPTED } else { StatusCode::OK };
    let body = view(&state, job).await?;
    Ok((status, [(header::LOCATION, location(job_id))], Json(body)).into_response())
}
