//! `/v1/engines`: the Docker engines pools may use, each a failure domain.
//! Registration, draining and removal are admin's; the credentials of an
//! engine are write-only.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::db;
use crate::domain::engine::{self as rules, RawEngine, Tls};
use crate::domain::event::SubjectKind;
use crate::engines::{EngineError, Registry};
use crate::error::{ApiError, ApiResult, Problem};
use crate::http::extract::{ApiJson, ApiQuery};
use crate::http::pagination::{PageParams, finish_page};
use crate::http::wire::EventList;
use crate::runtime::{Engine, Reachability};
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(register_engine, list_engines))
        .routes(routes!(get_engine, delete_engine))
        .routes(routes!(drain_engine, undrain_engine))
        .routes(routes!(list_engine_events))
}

/// A TLS client identity for a `tcp://` engine: PEM documents. Write-only.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TlsInput {
    /// Client certificate (PEM).
    pub cert: String,
    /// Client private key (PEM).
    pub key: String,
    /// CA certificate that signed the engine's server certificate (PEM).
    pub ca: String,
}

/// Body of `POST /v1/engines`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RegisterEngine {
    /// DNS-1123 label; `local` is the server's own engine.
    #[schema(example = "host-b")]
    #[schema(pattern = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", min_length = 1, max_length = 63)]
    pub name: String,
    /// `unix:///path/docker.sock` or `tcp://host:port` (with `tls` unless
    /// the host is loopback). `ssh://` is not supported (see docs/engines.md).
    #[schema(example = "tcp://10.0.0.12:2376")]
    pub endpoint: String,
    /// Labels for pools' `engine_selector`.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub tls: Option<TlsInput>,
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
    /// Machines of any pool on it.
    pub machines: u32,
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

fn registry(state: &AppState) -> Registry {
    Registry {
        metrics: state.metrics.clone(),
        db: state.db.clone(),
        engines: state.engines.clone(),
        data_dir: state.config.data_dir.clone(),
        simulated: state.config.runtime == crate::config::RuntimeKind::Simulated,
        lost_after: state.config.engine_lost_after,
    }
}

fn view(e: &Engine, tls: bool) -> EngineView {
    let h = e.health();
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
            machines: u32::try_from(e.container_count()).unwrap_or(u32::MAX),
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
            EngineError::Store(e) => e.into(),
            other @ EngineError::Files { .. } => ApiError::Internal(anyhow::Error::new(other)),
        }
    }
}

async fn has_tls(state: &AppState, name: &str) -> ApiResult<bool> {
    Ok(db::engines::list(state.db.read()).await?.iter().any(|e| e.name == name && e.tls.is_some()))
}

fn with_location(status: StatusCode, name: &str, body: EngineView) -> Response {
    let mut headers = HeaderMap::new();
    if let Ok(loc) = HeaderValue::from_str(&format!("/v1/engines/{name}")) {
        headers.insert(header::LOCATION, loc);
    }
    (status, headers, Json(body)).into_response()
}

/// Register an engine (admin). Its informer starts at once; the answer
/// shows it `syncing` until its first list.
#[utoipa::path(post, path = "/v1/engines", tag = "engines", request_body = RegisterEngine,
    responses(
        (status = 201, description = "Registered", body = EngineView, headers(("Location" = String, description = "URL of the engine"))),
        (status = 409, description = "An engine of that name exists", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A field breaks a rule (endpoint scheme, TLS for remote tcp://, PEM)", body = Problem, content_type = "application/problem+json"),
    ))]
#[tracing::instrument(skip_all, fields(engine = %body.name))]
async fn register_engine(State(state): State<AppState>, ApiJson(body): ApiJson<RegisterEngine>) -> ApiResult<Response> {
    let tls = body.tls.map(|t| Tls { cert: t.cert, key: t.key, ca: t.ca });
    let raw = RawEngine { name: body.name, endpoint: body.endpoint, labels: body.labels, tls };
    let reg = registry(&state);
    let spec = rules::validate(raw, reg.simulated).map_err(ApiError::Validation)?;
    let tls = spec.tls.is_some();
    let engine = crate::engines::register(&reg, spec).await?;
    Ok(with_location(StatusCode::CREATED, &engine.name, view(&engine, tls)))
}

/// List engines in name order, `local` among them.
#[utoipa::path(get, path = "/v1/engines", tag = "engines", params(PageParams),
    responses(
        (status = 200, description = "A page of engines", body = EngineList),
        (status = 422, description = "Bad `limit` or `cursor`", body = Problem, content_type = "application/problem+json"),
    ))]
async fn list_engines(
    State(state): State<AppState>,
    ApiQuery(page): ApiQuery<PageParams>,
) -> ApiResult<Json<EngineList>> {
    let limit = page.limit()?;
    let after = page.after()?.unwrap_or_default();
    let with_tls: Vec<String> =
        db::engines::list(state.db.read()).await?.into_iter().filter(|e| e.tls.is_some()).map(|e| e.name).collect();
    let mut rows: Vec<EngineView> = state
        .engines
        .all()
        .iter()
        .filter(|e| e.name > after)
        .take(limit as usize + 1)
        .map(|e| view(e, with_tls.contains(&e.name)))
        .collect();
    let next_cursor = finish_page(&mut rows, limit, |e| e.name.clone());
    Ok(Json(EngineList { items: rows, next_cursor }))
}

/// Get an engine: reachability, version, machines, last error.
#[utoipa::path(get, path = "/v1/engines/{name}", tag = "engines", params(("name" = String, Path, description = "Engine name")),
    responses(
        (status = 200, description = "The engine", body = EngineView),
        (status = 404, description = "No such engine", body = Problem, content_type = "application/problem+json"),
    ))]
async fn get_engine(State(state): State<AppState>, Path(name): Path<String>) -> ApiResult<Json<EngineView>> {
    let engine = state.engines.get(&name).ok_or_else(|| ApiError::not_found("engine", &name))?;
    Ok(Json(view(&engine, has_tls(&state, &name).await?)))
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
#[tracing::instrument(skip(state))]
async fn delete_engine(State(state): State<AppState>, Path(name): Path<String>) -> ApiResult<StatusCode> {
    crate::engines::remove(&registry(&state), &name).await?;
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
#[tracing::instrument(skip(state))]
async fn drain_engine(State(state): State<AppState>, Path(name): Path<String>) -> ApiResult<Response> {
    let engine = crate::engines::drain(&registry(&state), &name, true).await?;
    Ok(with_location(StatusCode::ACCEPTED, &name, view(&engine, has_tls(&state, &name).await?)))
}

/// Stop draining an engine (admin): pools may place machines there again.
#[utoipa::path(delete, path = "/v1/engines/{name}/drain", tag = "engines", params(("name" = String, Path, description = "Engine name")),
    responses(
        (status = 200, description = "No longer draining", body = EngineView),
        (status = 404, description = "No such engine", body = Problem, content_type = "application/problem+json"),
    ))]
#[tracing::instrument(skip(state))]
async fn undrain_engine(State(state): State<AppState>, Path(name): Path<String>) -> ApiResult<Json<EngineView>> {
    let engine = crate::engines::drain(&registry(&state), &name, false).await?;
    Ok(Json(view(&engine, has_tls(&state, &name).await?)))
}

/// The engine's events, newest first: registered, unreachable, lost, back, drained.
#[utoipa::path(get, path = "/v1/engines/{name}/events", tag = "engines",
    params(("name" = String, Path, description = "Engine name"), PageParams),
    responses(
        (status = 200, description = "A page of events", body = EventList),
        (status = 404, description = "No such engine", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Bad `limit` or `cursor`", body = Problem, content_type = "application/problem+json"),
    ))]
async fn list_engine_events(
    State(state): State<AppState>,
    Path(name): Path<String>,
    ApiQuery(page): ApiQuery<PageParams>,
) -> ApiResult<Json<EventList>> {
    let limit = page.limit()?;
    let before = page.after_id()?;
    state.engines.get(&name).ok_or_else(|| ApiError::not_found("engine", &name))?;
    let mut rows = db::events::list(state.db.read(), SubjectKind::Engine, &name, before, limit + 1).await?;
    let next_cursor = finish_page(&mut rows, limit, |e| e.id.to_string());
    Ok(Json(EventList { items: rows, next_cursor }))
}
