//! `/v1/pools/{name}/machines`: the containers of a pool, and the two ways
//! to pick which machine goes on the next scale-down.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::db::machines::Machine;
use crate::domain::machine::MachinePhase;
use crate::error::{ApiResult, Problem};
use crate::http::extract::{ApiQuery, Scope};
use crate::http::pagination::PageParams;
use crate::http::wire::{in_namespace, location};
use crate::pools::PoolMachine;
use crate::runtime::{ContainerState, HealthState};
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_machines))
        .routes(routes!(get_machine, delete_machine))
        .routes(routes!(request_machine_deletion))
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct MachineView {
    /// Also the container's name.
    pub name: String,
    pub pool: String,
    /// The engine the container runs on.
    pub engine: String,
    pub container_id: String,
    pub image: String,
    /// Runs the pool's desired image.
    pub up_to_date: bool,
    pub failure_domain: Option<String>,
    /// What the machine is doing, from its container's observed state.
    pub phase: MachinePhase,
    /// Running, settled, and healthy where the image has a health check.
    pub ready: bool,
    /// The container's state as its engine last reported it.
    pub state: ContainerState,
    pub health: HealthState,
    /// Exit code of the last run, once it has ended.
    pub exit_code: Option<i64>,
    /// The last run was killed for lack of memory.
    pub oom_killed: bool,
    /// Restarts in place (and unpauses) so far.
    pub restarts: u32,
    /// Restarts since the machine was last ready; after a few it is replaced.
    pub failed_restarts: u32,
    pub last_restart_at: Option<DateTime<Utc>>,
    /// Goes first on the next scale-down.
    pub delete_requested: bool,
    /// When drover began to delete it (phase `terminating`).
    pub terminating_since: Option<DateTime<Utc>>,
    /// Why it is being deleted: `outdated`, `excess`, `broken`, ...
    pub terminating_reason: Option<String>,
    /// When it last became ready.
    pub ready_since: Option<DateTime<Utc>>,
    /// Start and end of the current (or last) run, as the engine reports them.
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<PoolMachine> for MachineView {
    fn from(m: PoolMachine) -> Self {
        view(m.machine, &m.desired_image)
    }
}

fn view(m: Machine, desired_image: &str) -> MachineView {
    MachineView {
        up_to_date: m.image == desired_image,
        name: m.name,
        pool: m.pool.name,
        engine: m.engine,
        container_id: m.container_id,
        image: m.image,
        failure_domain: m.failure_domain,
        phase: m.phase,
        ready: m.ready,
        state: m.state,
        health: m.health,
        exit_code: m.exit_code,
        oom_killed: m.oom_killed,
        restarts: m.restarts,
        failed_restarts: m.failed_restarts,
        last_restart_at: m.last_restart_at,
        delete_requested: m.delete_requested,
        terminating_since: m.terminating_since,
        terminating_reason: m.terminating_reason,
        ready_since: m.ready_since,
        started_at: m.started_at,
        finished_at: m.finished_at,
        created_at: m.created_at,
        updated_at: m.updated_at,
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct MachineList {
    pub items: Vec<MachineView>,
    /// Pass as `cursor` to get the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

/// List a pool's machines in name order.
#[utoipa::path(get, path = "/v1/pools/{name}/machines", tag = "machines",
    params(("name" = String, Path, description = "Pool name"), PageParams),
    responses(
        (status = 200, description = "A page of machines", body = MachineList),
        (status = 404, description = "No such pool", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Bad `limit` or `cursor`", body = Problem, content_type = "application/problem+json"),
    ))]
async fn list_machines(
    State(state): State<AppState>,
    scope: Scope,
    Path(name): Path<String>,
    ApiQuery(page): ApiQuery<PageParams>,
) -> ApiResult<Json<MachineList>> {
    let listed = state.machines.list(&scope.single()?, &name, &page.request()?).await?;
    let image = listed.desired_image;
    let items = listed.page.items.into_iter().map(|m| view(m, &image)).collect();
    Ok(Json(MachineList { items, next_cursor: listed.page.next_cursor }))
}

/// Get one machine.
#[utoipa::path(get, path = "/v1/pools/{name}/machines/{machine}", tag = "machines",
    params(("name" = String, Path, description = "Pool name"), ("machine" = String, Path, description = "Machine name")),
    responses(
        (status = 200, description = "The machine", body = MachineView),
        (status = 404, description = "No such pool or machine", body = Problem, content_type = "application/problem+json"),
    ))]
async fn get_machine(
    State(state): State<AppState>,
    scope: Scope,
    Path((name, machine)): Path<(String, String)>,
) -> ApiResult<Json<MachineView>> {
    Ok(Json(state.machines.get(&scope.single()?, &name, &machine).await?.into()))
}

/// Mark a machine to go first on the next scale-down (Cluster API's
/// delete-machine annotation). `replicas` is unchanged; repeating is harmless.
#[utoipa::path(post, path = "/v1/pools/{name}/machines/{machine}/delete-request", tag = "machines",
    params(("name" = String, Path, description = "Pool name"), ("machine" = String, Path, description = "Machine name")),
    responses(
        (status = 200, description = "The marked machine", body = MachineView),
        (status = 404, description = "No such pool or machine", body = Problem, content_type = "application/problem+json"),
    ))]
#[tracing::instrument(skip(state))]
async fn request_machine_deletion(
    State(state): State<AppState>,
    scope: Scope,
    Path((name, machine)): Path<(String, String)>,
) -> ApiResult<Json<MachineView>> {
    Ok(Json(state.machines.request_deletion(&scope.single()?, &name, &machine).await?.into()))
}

/// Remove a chosen machine: marks it and lowers `replicas` by one, in one
/// transaction (how an autoscaler removes a specific machine). Repeating the
/// call for a machine already marked does not lower `replicas` again.
#[utoipa::path(delete, path = "/v1/pools/{name}/machines/{machine}", tag = "machines",
    params(("name" = String, Path, description = "Pool name"), ("machine" = String, Path, description = "Machine name")),
    responses(
        (status = 202, description = "Marked; the reconciler removes it", body = MachineView,
            headers(("Location" = String, description = "URL of the machine; it answers 404 once removed"))),
        (status = 404, description = "No such pool or machine", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The pool is being deleted or already has zero replicas", body = Problem, content_type = "application/problem+json"),
    ))]
#[tracing::instrument(skip(state))]
async fn delete_machine(
    State(state): State<AppState>,
    scope: Scope,
    Path((name, machine)): Path<(String, String)>,
) -> ApiResult<Response> {
    let access = scope.single()?;
    let removed = state.machines.remove(&access, &name, &machine).await?;
    let path = in_namespace(&format!("/v1/pools/{name}/machines/{machine}"), &access.namespace);
    let headers = [(header::LOCATION, location(&path))];
    Ok((StatusCode::ACCEPTED, headers, Json(MachineView::from(removed))).into_response())
}
