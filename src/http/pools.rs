//! `/v1/pools`: create, read, change, scale and delete pools, and read their
//! events. A pool here is stored desired state; the reconciler acts on it.
//! Handlers parse, call `pools::Pools`, and answer with `http::wire` types.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::error::{ApiError, ApiResult, Problem};
use crate::http::extract::{ApiJson, ApiQuery, IfMatch, MergePatch, Scope};
use crate::http::pagination::PageParams;
use crate::http::wire::EventList;
use crate::http::wire::pools::{CreatePool, PoolList, PoolPatch, PoolView, Scale, etag, pool_response};
use crate::pools::PoolError;
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_pool, list_pools))
        .routes(routes!(get_pool, patch_pool, delete_pool))
        .routes(routes!(scale_pool))
        .routes(routes!(list_pool_events))
}

impl From<PoolError> for ApiError {
    fn from(e: PoolError) -> Self {
        match e {
            PoolError::NotFound(name) => ApiError::not_found("pool", name),
            PoolError::NamespaceNotFound(name) => ApiError::not_found("namespace", name),
            PoolError::Denied(denied) => denied.into(),
            PoolError::MachineNotFound { machine, .. } => ApiError::not_found("machine", machine),
            PoolError::Exists(name) => ApiError::Conflict(format!("a pool named {name:?} already exists")),
            PoolError::Invalid(errs) => ApiError::Validation(errs),
            PoolError::Precondition(why) => ApiError::PreconditionFailed(why),
            PoolError::Conflict(why) => ApiError::Conflict(why),
            PoolError::Unavailable(why) => ApiError::Unavailable(why),
            PoolError::Store(e) => ApiError::Database(e),
            PoolError::Internal(e) => ApiError::Internal(e),
        }
    }
}

// ---- handlers --------------------------------------------------------------

/// Create a pool.
#[utoipa::path(post, path = "/v1/pools", tag = "pools",
    request_body(content = CreatePool, content_type = "application/json"),
    responses(
        (status = 201, description = "Created; `Location` names the pool", body = PoolView,
            headers(("Location" = String, description = "URL of the new pool"), ("ETag" = String, description = "Generation"))),
        (status = 400, description = "Body is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A pool of that name exists", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body over 1 MiB", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Body is not declared as JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A field breaks a rule (`cluster` must name a registered cluster: rule `cluster_exists`); `errors` lists each", body = Problem, content_type = "application/problem+json"),
    ))]
#[tracing::instrument(skip_all)]
async fn create_pool(
    State(state): State<AppState>,
    scope: Scope,
    ApiJson(body): ApiJson<Value>,
) -> ApiResult<Response> {
    let pool = state.pools.create(&scope.single()?, body).await?;
    Ok(pool_response(StatusCode::CREATED, pool, true))
}

/// List a namespace's pools in name order, a page at a time; with
/// `namespace=*`, the pools of every namespace the caller may see, by
/// namespace and name.
#[utoipa::path(get, path = "/v1/pools", tag = "pools", params(PageParams),
    responses(
        (status = 200, description = "A page of pools", body = PoolList),
        (status = 404, description = "No such namespace", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Bad `limit` or `cursor`", body = Problem, content_type = "application/problem+json"),
    ))]
async fn list_pools(
    State(state): State<AppState>,
    scope: Scope,
    ApiQuery(page): ApiQuery<PageParams>,
) -> ApiResult<Json<PoolList>> {
    let page = state.pools.list(&scope.access, scope.across, &page.request()?).await?;
    Ok(Json(PoolList { items: page.items.into_iter().map(PoolView::from).collect(), next_cursor: page.next_cursor }))
}

/// Get a pool.
#[utoipa::path(get, path = "/v1/pools/{name}", tag = "pools", params(("name" = String, Path, description = "Pool name")),
    responses(
        (status = 200, description = "The pool", body = PoolView, headers(("ETag" = String, description = "Generation"))),
        (status = 404, description = "No such pool", body = Problem, content_type = "application/problem+json"),
    ))]
async fn get_pool(State(state): State<AppState>, scope: Scope, Path(name): Path<String>) -> ApiResult<Response> {
    // The most read answer of all: rendered once per change of the pool.
    let cached = state.pools.shared(&scope.single()?, &name).await?;
    let body = match cached.rendered.get() {
        Some(body) => body.clone(),
        None => {
            let json =
                serde_json::to_vec(&PoolView::from(cached.pool.clone())).map_err(|e| ApiError::Internal(e.into()))?;
            cached.rendered.get_or_init(|| json.into()).clone()
        }
    };
    let headers = [
        (header::ETAG, etag(cached.pool.generation)),
        (header::CONTENT_TYPE, HeaderValue::from_static("application/json")),
    ];
    Ok((StatusCode::OK, headers, body).into_response())
}

/// Change a pool's spec with a JSON merge patch (RFC 7396).
///
/// Any spec field may be patched; `null` resets a field to its default,
/// maps merge key by key and lists are replaced (see `PoolPatch`).
/// Send `If-Match` with the ETag you read to make the change conditional.
#[utoipa::path(patch, path = "/v1/pools/{name}", tag = "pools",
    params(("name" = String, Path, description = "Pool name"),
        ("If-Match" = Option<String>, Header, description = "ETag (generation) the change is based on")),
    request_body(content = PoolPatch, description = "Merge patch of the spec fields", content_type = "application/merge-patch+json"),
    responses(
        (status = 200, description = "The updated pool", body = PoolView, headers(("ETag" = String, description = "New generation"))),
        (status = 400, description = "Body is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such pool", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The pool is being deleted", body = Problem, content_type = "application/problem+json"),
        (status = 412, description = "`If-Match` names another generation", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body over 1 MiB", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Body is not declared as JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The patched spec breaks a rule (a changed `cluster` must name a registered cluster: rule `cluster_exists`)", body = Problem, content_type = "application/problem+json"),
    ))]
#[tracing::instrument(skip_all, fields(pool = %name))]
async fn patch_pool(
    State(state): State<AppState>,
    scope: Scope,
    Path(name): Path<String>,
    IfMatch(pinned): IfMatch,
    MergePatch(patch): MergePatch<Value>,
) -> ApiResult<Response> {
    let pool = state.pools.patch(&scope.single()?, &name, &patch, pinned.as_deref()).await?;
    Ok(pool_response(StatusCode::OK, pool, false))
}

/// Set only `replicas`.
#[utoipa::path(put, path = "/v1/pools/{name}/scale", tag = "pools",
    params(("name" = String, Path, description = "Pool name"),
        ("If-Match" = Option<String>, Header, description = "ETag (generation) the change is based on")),
    request_body(content = Scale, content_type = "application/json"),
    responses(
        (status = 200, description = "The updated pool", body = PoolView, headers(("ETag" = String, description = "New generation"))),
        (status = 400, description = "Body is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such pool", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The pool is being deleted", body = Problem, content_type = "application/problem+json"),
        (status = 412, description = "`If-Match` names another generation", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Body is not declared as JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`replicas` out of range", body = Problem, content_type = "application/problem+json"),
    ))]
#[tracing::instrument(skip_all, fields(pool = %name))]
async fn scale_pool(
    State(state): State<AppState>,
    scope: Scope,
    Path(name): Path<String>,
    IfMatch(pinned): IfMatch,
    ApiJson(scale): ApiJson<Scale>,
) -> ApiResult<Response> {
    let pool = state.pools.scale(&scope.single()?, &name, scale.replicas, pinned.as_deref()).await?;
    Ok(pool_response(StatusCode::OK, pool, false))
}

/// Delete a pool: it turns `deleting`, the reconciler removes its machines,
/// then the pool disappears. Repeating the call is harmless.
#[utoipa::path(delete, path = "/v1/pools/{name}", tag = "pools", params(("name" = String, Path, description = "Pool name")),
    responses(
        (status = 202, description = "Deletion under way; poll `Location` until it answers 404", body = PoolView,
            headers(("Location" = String, description = "URL of the pool"))),
        (status = 404, description = "No such pool", body = Problem, content_type = "application/problem+json"),
    ))]
#[tracing::instrument(skip_all, fields(pool = %name))]
async fn delete_pool(State(state): State<AppState>, scope: Scope, Path(name): Path<String>) -> ApiResult<Response> {
    let pool = state.pools.delete(&scope.single()?, &name).await?;
    Ok(pool_response(StatusCode::ACCEPTED, pool, true))
}

/// The pool's events, newest first.
#[utoipa::path(get, path = "/v1/pools/{name}/events", tag = "pools",
    params(("name" = String, Path, description = "Pool name"), PageParams),
    responses(
        (status = 200, description = "A page of events", body = EventList),
        (status = 404, description = "No such pool", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Bad `limit` or `cursor`", body = Problem, content_type = "application/problem+json"),
    ))]
async fn list_pool_events(
    State(state): State<AppState>,
    scope: Scope,
    Path(name): Path<String>,
    ApiQuery(page): ApiQuery<PageParams>,
) -> ApiResult<Json<EventList>> {
    Ok(Json(state.pools.events(&scope.single()?, &name, &page.request_by_id()?).await?.into()))
}
