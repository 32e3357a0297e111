//! Control-plane upgrade jobs: start one on a cluster (or ask for its plan),
//! follow it, read its events, cancel it. The handlers parse and answer;
//! `upgrade::service` checks the request against the cluster and the
//! version policy, stores the job and cancels it; the runner does the work.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::app::AppState;
use crate::auth::{Caller, Role};
use crate::clusters::service::connect;
use crate::db::{self, upgrades::CancelOutcome, upgrades::Job};
use crate::domain::event::SubjectKind;
use crate::domain::image::check_image_reference;
use crate::domain::upgrade::{Component, DEFAULT_IMAGE_REPOSITORY, JobState, order_components};
use crate::domain::version::KubeVersion;
use crate::error::{ApiError, ApiResult, Problem};
use crate::http::extract::{ApiJson, ApiQuery};
use crate::http::pagination::{PageParams, finish_page};
use crate::http::wire::EventList;
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

/// Where a running job is.
#[derive(Debug, Serialize, ToSchema)]
pub struct Position {
    pub component: Component,
    /// 0-7.
    pub step: i64,
    pub step_name: &'static str,
}

fn step_state_schema() -> utoipa::openapi::Object {
    crate::http::openapi::string_enum(&["running", "succeeded", "failed"], "running, succeeded or failed")
}

fn component_state_schema() -> utoipa::openapi::Object {
    crate::http::openapi::string_enum(
        &["pending", "upgrading", "upgraded", "rolled_back", "cancelled", "failed", "skipped"],
        "pending, upgrading, upgraded, rolled_back, cancelled, failed or skipped (the job ended before it)",
    )
}

#[derive(Debug, Serialize, ToSchema)]
pub struct StepView {
    pub step: i64,
    pub name: String,
    /// running, succeeded or failed.
    #[schema(schema_with = step_state_schema)]
    pub state: String,
    /// Times the step was started; more than one after a restart resumed it.
    pub attempts: i64,
    /// API calls of the step that failed and were tried again.
    pub api_retries: i64,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub error: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ComponentProgress {
    #[schema(value_type = Component)]
    pub component: String,
    /// pending, upgrading, upgraded, rolled_back, cancelled, failed or skipped (the job ended before it).
    #[schema(schema_with = component_state_schema)]
    pub state: String,
    pub old_image: Option<String>,
    pub new_image: String,
    /// The pod the upgrade replaces, found by step 0.
    pub old_pod: Option<String>,
    pub steps: Vec<StepView>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct UpgradeView {
    pub id: i64,
    pub cluster: String,
    pub version: KubeVersion,
    /// The version the cluster ran when the job was accepted.
    pub from_version: Option<String>,
    pub components: Vec<Component>,
    pub image_repository: String,
    pub force: bool,
    pub state: JobState,
    /// The component and step being worked on; absent once the job ended.
    pub current: Option<Position>,
    pub cancel_requested: bool,
    /// Why the job failed, or what a cancel left; names upgraded components.
    pub error: Option<String>,
    /// Components that run the target version because of this job.
    pub upgraded_components: Vec<String>,
    pub progress: Vec<ComponentProgress>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub updated_at: DateTime<Utc>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct UpgradeList {
    /// Newest first.
    pub items: Vec<UpgradeView>,
    /// Pass as `cursor` to get the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

/// The dry-run answer: what a job would do.
#[derive(Debug, Serialize, ToSchema)]
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

pub(crate) async fn view(state: &AppState, job: Job) -> ApiResult<UpgradeView> {
    let comps = db::upgrades::components(state.db.read(), job.id).await?;
    let steps = db::upgrades::steps(state.db.read(), job.id).await?;
    let version = job.version.parse().map_err(|e| ApiError::Internal(anyhow::anyhow!("stored version: {e}")))?;
    let current = job.state.is_active().then(|| Position {
        component: job.components.get(job.component_index).copied().unwrap_or(Component::KubeApiserver),
        step: job.step.number(),
        step_name: job.step.name(),
    });
    let progress = comps
        .into_iter()
        .map(|c| ComponentProgress {
            steps: steps
                .iter()
                .filter(|s| s.position == c.position)
                .map(|s| StepView {
                    step: s.step,
                    name: s.name.clone(),
                    state: s.state.clone(),
                    attempts: s.attempts,
                    api_retries: s.api_retries,
                    started_at: s.started_at,
                    finished_at: s.finished_at,
                    error: s.error.clone(),
                })
                .collect(),
            component: c.component,
            state: c.state,
            old_image: c.old_image,
            new_image: c.new_image,
            old_pod: c.old_pod,
        })
        .collect::<Vec<_>>();
    Ok(UpgradeView {
        upgraded_components: progress.iter().filter(|p| p.state == "upgraded").map(|p| p.component.clone()).collect(),
        id: job.id,
        cluster: job.cluster,
        version,
        from_version: job.from_version,
        components: job.components,
        image_repository: job.image_repository,
        force: job.force,
        state: job.state,
        current,
        cancel_requested: job.cancel_requested,
        error: job.error,
        progress,
        created_at: job.created_at,
        started_at: job.started_at,
        finished_at: job.finished_at,
        updated_at: job.updated_at,
    })
}

fn parse_id(id: &str) -> ApiResult<i64> {
    id.parse().map_err(|_| ApiError::not_found("upgrade job", id))
}

pub(crate) async fn load(state: &AppState, id: &str) -> ApiResult<Job> {
    db::upgrades::get(state.db.read(), parse_id(id)?).await?.ok_or_else(|| ApiError::not_found("upgrade job", id))
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
