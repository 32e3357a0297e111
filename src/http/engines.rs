//! `/v1/engines`: the Docker engines pools may use, each a failure domain.
//! Registration, draining and removal are admin's; the credentials of an
//! engine are write-only.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

pub use crate::engines::TlsInput;
use crate::engines::breaker::Block;
use crate::engines::spec as rules;
use crate::engines::{Engine, Reachability};
use crate::engines::{EngineError, EngineInfo, EngineSpecInput};
use crate::error::{ApiError, ApiResult, Problem};
use crate::http::extract::{ApiJson, ApiQuery, Scope};
use crate::http::pagination::PageParams;
use crate::http::wire::named::RegisterEngine;
use crate::http::wire::{EventList, location};
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(register_engine, list_engines))
        .routes(routes!(get_engine, delete_engine))
        .routes(routes!(drain_engine, undrain_engine))
        .routes(routes!(confirm_identity))
        .routes(routes!(list_engine_events))
}

/// What drover last saw of an engine.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct EngineStatus {
    pub reachability: Reachability,
    /// When `reachability` last changed.
    pub since: DateTime<Utc>,
    /// The engine's version, once it answered.
    pub version: Option<String>,
    /// Why it does not answer, while it does not.
    pub last_error: Option<String>,
    /// Last time it answered.
    pub last_seen: Option<DateTime<Utc>>,
    /// The Docker daemon its endpoint reaches.
    pub daemon: DaemonView,
    /// Machines of any pool on it.
    pub machines: u32,
    /// Whether new machines go here, and why not when they do not.
    pub placement: PlacementView,
}

/// The Docker daemon an engine reaches: one daemon is one failure domain,
/// so it is one engine.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DaemonView {
    /// The daemon the engine is registered as (the `ID` of Docker's
    /// `GET /info`): learned at registration, or at its first answer when
    /// it did not answer then; changed only by
    /// `POST /v1/engines/{name}/confirm-identity`.
    pub id: Option<String>,
    /// The daemon its endpoint reported last. When it differs from `id`,
    /// the endpoint reaches another host than the one registered, and the
    /// engine takes no new machine (`daemon_changed`) until an admin
    /// confirms it.
    pub reported_id: Option<String>,
    /// Another engine that reaches the same daemon and keeps it; this one
    /// takes no new machine (`duplicate_daemon`).
    pub duplicate_of: Option<String>,
}

/// Whether new machines go to an engine. Placement is a preference: an
/// engine that takes no new machine keeps the machines it has.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PlacementView {
    /// New machines may go here now (of any image not in `refused_images`).
    pub eligible: bool,
    /// Why not, while not eligible.
    pub blocked: Option<Block>,
    /// What is wrong, for people.
    pub message: Option<String>,
    /// When placement here is tried again, for a backed-off engine.
    pub retry_at: Option<DateTime<Utc>>,
    /// Images this engine lacks, each backed off on its own: other images
    /// still go here.
    pub refused_images: Vec<RefusedImage>,
}

/// An image an engine refused to create a container of. It stays listed
/// until a machine of it is placed there.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RefusedImage {
    pub image: String,
    pub error: String,
    /// When it may be tried here again; once past, the next machine of
    /// the image that a pool places here is the trial.
    pub retry_at: DateTime<Utc>,
}

fn kind_schema() -> utoipa::openapi::Object {
    crate::http::openapi::string_enum(&["docker", "simulated"], "`docker` or `simulated`")
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct EngineView {
    pub name: String,
    /// The endpoint; never a credential.
    pub endpoint: String,
    /// `docker` or `simulated`.
    #[schema(schema_with = kind_schema)]
    pub kind: String,
    /// The server's own engine (`--docker-host`), not registered through the API.
    pub builtin: bool,
    pub labels: BTreeMap<String, String>,
    /// A TLS client identity is registered (it is never shown).
    pub tls: bool,
    /// No new machine goes here; machines here move to other engines.
    pub draining: bool,
    pub status: EngineStatus,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct EngineList {
    pub items: Vec<EngineView>,
    /// Pass as `cursor` to get the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

fn placement(e: &Engine, now: DateTime<Utc>) -> PlacementView {
    let blocked = e.unplaceable(None, now);
    let refused_images = e
        .refused_images()
        .into_iter()
        .map(|(image, error, retry_at)| RefusedImage { image, error, retry_at })
        .collect();
    PlacementView {
        eligible: blocked.is_none(),
        blocked: blocked.as_ref().map(|b| b.block),
        retry_at: blocked.as_ref().and_then(|b| b.retry_at),
        message: blocked.map(|b| b.message),
        refused_images,
    }
}

impl From<EngineInfo> for EngineView {
    fn from(i: EngineInfo) -> Self {
        view(&i.engine, i.tls)
    }
}

fn view(e: &Engine, tls: bool) -> EngineView {
    let h = e.health();
    let identity = e.identity();
    EngineView {
        name: e.name.clone(),
        endpoint: e.address(),
        kind: e.kind().to_owned(),
        builtin: e.name == rules::LOCAL,
        labels: e.labels.clone(),
        tls,
        draining: e.draining(),
        status: EngineStatus {
            reachability: h.reachability,
            since: h.since,
            version: h.version,
            last_error: h.last_error,
            last_seen: h.last_seen,
            daemon: DaemonView {
                id: identity.registered,
                reported_id: identity.reported,
                duplicate_of: identity.duplicate_of,
            },
            machines: u32::try_from(e.container_count()).unwrap_or(u32::MAX),
            placement: placement(e, crate::clock::wall()),
        },
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Invalid(errs) => ApiError::Validation(errs),
            EngineError::Exists(name) => ApiError::Conflict(format!("an engine named {name:?} already exists")),
            EngineError::NotFound(name) => ApiError::not_found("engine", &name),
            EngineError::Conflict(why) => ApiError::Conflict(why),
            same @ EngineError::SameDaemon { .. } => ApiError::Conflict(same.to_string()),
            EngineError::Denied(denied) => denied.into(),
            EngineError::Store(e) => e.into(),
            other @ EngineError::Files { .. } => ApiError::Internal(anyhow::Error::new(other)),
        }
    }
}

fn engine_response(status: StatusCode, info: EngineInfo) -> Response {
    let headers = [(header::LOCATION, location(&format!("/v1/engines/{}", info.engine.name)))];
    (status, headers, Json(EngineView::from(info))).into_response()
}

/// Register an engine (admin). Its informer starts at once; the answer
/// shows it `syncing` until its first list.
#[utoipa::path(post, path = "/v1/engines", tag = "engines", request_body = RegisterEngine,
    responses(
        (status = 201, description = "Registered", body = EngineView, headers(("Location" = String, description = "URL of the engine"))),
        (status = 409, description = "An engine of that name exists, or the Docker daemon at the endpoint is registered already (as the engine the problem names)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A field breaks a rule (endpoint scheme, TLS for remote tcp://, PEM)", body = Problem, content_type = "application/problem+json"),
    ))]
#[tracing::instrument(skip_all, fields(engine))]
async fn register_engine(
    State(state): State<AppState>,
    scope: Scope,
    ApiJson(body): ApiJson<Value>,
) -> ApiResult<Response> {
    let (name, spec) = crate::domain::json::named::<EngineSpecInput>(body)?.both()?;
    tracing::Span::current().record("engine", name.as_str());
    Ok(engine_response(StatusCode::CREATED, state.engines.register(&scope.access, spec.into_raw(name)).await?))
}

/// List engines in name order, `local` among them.
#[utoipa::path(get, path = "/v1/engines", tag = "engines", params(PageParams),
    responses(
        (status = 200, description = "A page of engines", body = EngineList),
        (status = 422, description = "Bad `limit` or `cursor`", body = Problem, content_type = "application/problem+json"),
    ))]
async fn list_engines(
    State(state): State<AppState>,
    scope: Scope,
    ApiQuery(page): ApiQuery<PageParams>,
) -> ApiResult<Json<EngineList>> {
    let page = state.engines.list(&scope.access, &page.request()?).await?;
    Ok(Json(EngineList {
        items: page.items.into_iter().map(EngineView::from).collect(),
        next_cursor: page.next_cursor,
    }))
}

/// Get an engine: reachability, version, machines, last error.
#[utoipa::path(get, path = "/v1/engines/{name}", tag = "engines", params(("name" = String, Path, description = "Engine name")),
    responses(
        (status = 200, description = "The engine", body = EngineView),
        (status = 404, description = "No such engine", body = Problem, content_type = "application/problem+json"),
    ))]
async fn get_engine(
    State(state): State<AppState>,
    scope: Scope,
    Path(name): Path<String>,
) -> ApiResult<Json<EngineView>> {
    Ok(Json(state.engines.get(&scope.access, &name).await?.into()))
}

/// Forget an engine (admin). Refused while machines live there: drain it
/// first, then delete it once it is empty. An engine given up for lost
/// (unreachable for `--engine-lost-after`) can be removed with its machines:
/// they are forgotten, as their host is gone.
#[utoipa::path(delete, path = "/v1/engines/{name}", tag = "engines", params(("name" = String, Path, description = "Engine name")),
    responses(
        (status = 204, description = "Removed"),
        (status = 404, description = "No such engine", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Machines live there (they are named) and it is not lost, or it is `local`", body = Problem, content_type = "application/problem+json"),
    ))]
#[tracing::instrument(skip(state, scope))]
async fn delete_engine(State(state): State<AppState>, scope: Scope, Path(name): Path<String>) -> ApiResult<StatusCode> {
    state.engines.remove(&scope.access, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Drain an engine (admin): no new machine goes there, and every pool moves
/// its machines away within its rollout bounds. Watch `status.machines`
/// fall to 0, then delete the engine.
#[utoipa::path(post, path = "/v1/engines/{name}/drain", tag = "engines", params(("name" = String, Path, description = "Engine name")),
    responses(
        (status = 202, description = "Draining; poll `Location`", body = EngineView, headers(("Location" = String, description = "URL of the engine"))),
        (status = 404, description = "No such engine", body = Problem, content_type = "application/problem+json"),
    ))]
#[tracing::instrument(skip(state, scope))]
async fn drain_engine(State(state): State<AppState>, scope: Scope, Path(name): Path<String>) -> ApiResult<Response> {
    Ok(engine_response(StatusCode::ACCEPTED, state.engines.drain(&scope.access, &name, true).await?))
}

/// Stop draining an engine (admin): pools may place machines there again.
#[utoipa::path(delete, path = "/v1/engines/{name}/drain", tag = "engines", params(("name" = String, Path, description = "Engine name")),
    responses(
        (status = 200, description = "No longer draining", body = EngineView),
        (status = 404, description = "No such engine", body = Problem, content_type = "application/problem+json"),
    ))]
#[tracing::instrument(skip(state, scope))]
async fn undrain_engine(
    State(state): State<AppState>,
    scope: Scope,
    Path(name): Path<String>,
) -> ApiResult<Json<EngineView>> {
    Ok(Json(state.engines.drain(&scope.access, &name, false).await?.into()))
}

/// Confirm the daemon an engine now reaches (admin). An engine whose
/// endpoint reaches another Docker daemon than the one it was registered
/// as (a rebuilt host, a reused address) takes no new machine until then;
/// confirming registers it as the daemon it reaches now, unless another
/// engine has that daemon.
#[utoipa::path(post, path = "/v1/engines/{name}/confirm-identity", tag = "engines", params(("name" = String, Path, description = "Engine name")),
    responses(
        (status = 200, description = "Registered as the daemon it reaches now", body = EngineView),
        (status = 404, description = "No such engine", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "It has not answered yet, or its daemon is another engine's (named)", body = Problem, content_type = "application/problem+json"),
    ))]
#[tracing::instrument(skip(state, scope))]
async fn confirm_identity(
    State(state): State<AppState>,
    scope: Scope,
    Path(name): Path<String>,
) -> ApiResult<Json<EngineView>> {
    Ok(Json(state.engines.confirm_identity(&scope.access, &name).await?.into()))
}

/// The engine's events, newest first: registered, unreachable, lost, back,
/// drained, its daemon identified, changed or confirmed.
#[utoipa::path(get, path = "/v1/engines/{name}/events", tag = "engines",
    params(("name" = String, Path, description = "Engine name"), PageParams),
    responses(
        (status = 200, description = "A page of events", body = EventList),
        (status = 404, description = "No such engine", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Bad `limit` or `cursor`", body = Problem, content_type = "application/problem+json"),
    ))]
async fn list_engine_events(
    State(state): State<AppState>,
    scope: Scope,
    Path(name): Path<String>,
    ApiQuery(page): ApiQuery<PageParams>,
) -> ApiResult<Json<EventList>> {
    Ok(Json(state.engines.events(&scope.access, &name, &page.request_by_id()?).await?.into()))
}
