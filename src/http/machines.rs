//! `/v1/pools/{name}/machines`: the containers of a pool, and the two ways
//! to pick which machine goes on the next scale-down.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::app::AppState;
use crate::db::{self, machines::Machine};
use crate::domain::event::{EventType, NewEvent};
use crate::error::{ApiError, ApiResult, Problem};
use crate::http::extract::ApiQuery;
use crate::http::pagination::{PageParams, finish_page};
use crate::runtime::{ContainerState, HealthState};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_machines))
        .routes(routes!(get_machine, delete_machine))
        .routes(routes!(request_machine_deletion))
}

#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum MachinePhase {
    /// Created or starting; not ready yet.
    Provisioning,
    /// Ready: running and, where the image has a health check, healthy.
    Running,
    /// Exited, dead or unhealthy.
    Failed,
    /// Being removed.
    Deleting,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct MachineView {
    /// Also the container's name.
    pub name: String,
    pub pool: String,
    pub container_id: String,
    pub image: String,
    /// Runs the pool's desired image.
    pub up_to_date: bool,
    pub failure_domain: Option<String>,
    pub ready: bool,
    pub phase: MachinePhase,
    pub state: ContainerState,
    pub health: HealthState,
    /// Goes first on the next scale-down.
    pub delete_requested: bool,
    /// When the machine was first seen ready.
    pub ready_since: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

fn phase(m: &Machine) -> MachinePhase {
    match (m.state, m.health) {
        _ if m.ready => MachinePhase::Running,
        (ContainerState::Removing, _) => MachinePhase::Deleting,
        (ContainerState::Exited | ContainerState::Dead, _) | (_, HealthState::Unhealthy) => MachinePhase::Failed,
        _ => MachinePhase::Provisioning,
    }
}

fn view(m: Machine, desired_image: &str) -> MachineView {
    MachineView {
        up_to_date: m.image == desired_image,
        phase: phase(&m),
        name: m.name,
        pool: m.pool,
        container_id: m.container_id,
        image: m.image,
        failure_domain: m.failure_domain,
        ready: m.ready,
        state: m.state,
        health: m.health,
        delete_requested: m.delete_requested,
        ready_since: m.ready_since,
        created_at: m.created_at,
        updated_at: m.updated_at,
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct MachineList {
    pub items: Vec<MachineView>,
    pub next_cursor: Option<String>,
}

async fn desired_image(state: &AppState, pool: &str) -> ApiResult<String> {
    let p = db::pools::get(&state.db, pool).await?.ok_or_else(|| ApiError::not_found("pool", pool))?;
    Ok(p.spec.desired_image())
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
    Path(name): Path<String>,
    ApiQuery(page): ApiQuery<PageParams>,
) -> ApiResult<Json<MachineList>> {
    let limit = page.limit()?;
    let after = page.after()?;
    let image = desired_image(&state, &name).await?;
    let mut rows = db::machines::page(&state.db, &name, after.as_deref(), limit + 1).await?;
    let next_cursor = finish_page(&mut rows, limit, |m| m.name.clone());
    Ok(Json(MachineList { items: rows.into_iter().map(|m| view(m, &image)).collect(), next_cursor }))
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
    Path((name, machine)): Path<(String, String)>,
) -> ApiResult<Json<MachineView>> {
    let image = desired_image(&state, &name).await?;
    let m =
        db::machines::get(&state.db, &name, &machine).await?.ok_or_else(|| ApiError::not_found("machine", &machine))?;
    Ok(Json(view(m, &image)))
}

/// Mark a machine to go first on the next scale-down (the seed's
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
    Path((name, machine)): Path<(String, String)>,
) -> ApiResult<Json<MachineView>> {
    let image = desired_image(&state, &name).await?;
    let now = Utc::now();
    let mut tx = crate::db::begin_write(&state.db).await?;
    let m = db::machines::request_delete(&mut *tx, &name, &machine, now)
        .await?
        .ok_or_else(|| ApiError::not_found("machine", &machine))?;
    let ev = NewEvent::pool(
        &name,
        EventType::Normal,
        "MachineDeleteRequested",
        format!("{machine} goes first on the next scale-down"),
    );
    db::events::record(&mut *tx, &ev, now).await?;
    tx.commit().await?;
    state.queue.enqueue(&name);
    state.changes.pool(&name);
    Ok(Json(view(m, &image)))
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
    Path((name, machine)): Path<(String, String)>,
) -> ApiResult<Response> {
    let now = Utc::now();
    let mut tx = crate::db::begin_write(&state.db).await?;
    let (m, pool) = match db::machines::mark_if_unmarked(&mut *tx, &name, &machine, now).await? {
        Some(m) => {
            let Some(pool) = db::pools::decrement_replicas(&mut *tx, &name, now).await? else {
                return Err(ApiError::Conflict(format!(
                    "pool {name:?} is being deleted or has zero replicas; there is nothing to scale down"
                )));
            };
            let message = format!("{machine} removed on request; replicas lowered to {}", pool.spec.replicas);
            db::events::record(
                &mut *tx,
                &NewEvent::pool(&name, EventType::Normal, "MachineRemovalRequested", message),
                now,
            )
            .await?;
            tx.commit().await?;
            (m, pool)
        }
        None => {
            drop(tx);
            // Marked before (a repeated call), or missing.
            let pool = db::pools::get(&state.db, &name).await?.ok_or_else(|| ApiError::not_found("pool", &name))?;
            let m = db::machines::get(&state.db, &name, &machine)
                .await?
                .ok_or_else(|| ApiError::not_found("machine", &machine))?;
            (m, pool)
        }
    };
    state.queue.enqueue(&name);
    state.changes.pool(&name);
    let mut headers = HeaderMap::new();
    if let Ok(loc) = HeaderValue::from_str(&format!("/v1/pools/{name}/machines/{machine}")) {
        headers.insert(header::LOCATION, loc);
    }
    Ok((StatusCode::ACCEPTED, headers, Json(view(m, &pool.spec.desired_image()))).into_response())
}
