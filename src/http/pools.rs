//! `/v1/pools`: create, read, change, scale and delete pools, and read their
//! events. A pool here is stored desired state; the reconciler acts on it.
//! Handlers parse, call `pools::service`, and answer with `http::wire` types.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::auth::{Caller, OPERATOR_PATCHABLE, Role};
use crate::db;
use crate::domain::ValidationErrors;
use crate::domain::event::SubjectKind;
use crate::domain::names::PoolName;
use crate::domain::pool::{PoolSpec, validate};
use crate::error::{ApiError, ApiResult, Problem};
use crate::http::extract::{ApiJson, ApiQuery, IfMatch, MergePatch, from_json_value};
use crate::http::pagination::{PageParams, finish_page};
use crate::http::wire::pools::{
    CreatePool, EventList, PoolList, PoolPatch, PoolSpecInput, PoolView, Scale, etag, pool_response,
};
use crate::pools::service;
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_pool, list_pools))
        .routes(routes!(get_pool, patch_pool, delete_pool))
        .routes(routes!(scale_pool))
        .routes(routes!(list_pool_events))
}

/// Splits a create body into its name and spec, reporting the rules both
/// break in one answer.
fn parse_create(state: &AppState, body: Value) -> ApiResult<(PoolName, PoolSpec)> {
    let Value::Object(mut fields) = body else {
        return Err(ApiError::invalid("body", "type", "must be a JSON object"));
    };
    let name = match fields.remove("name") {
        Some(Value::String(s)) => PoolName::parse(&s).map_err(|e| ValidationErrors::single("name", "dns_label", e)),
        Some(_) => Err(ValidationErrors::single("name", "type", "must be a string")),
        None => Err(ValidationErrors::single("name", "required", "missing field `name`")),
    };
    let spec = from_json_value::<PoolSpecInput>(Value::Object(fields))
        .and_then(|input| validate(input.into(), state.limits()).map_err(ApiError::Validation));
    match (name, spec) {
        (Ok(name), Ok(spec)) => Ok((name, spec)),
        (Err(mut errs), Err(ApiError::Validation(more))) => {
            errs.0.extend(more.0);
            Err(ApiError::Validation(errs))
        }
        (Err(errs), _) => Err(ApiError::Validation(errs)),
        (Ok(_), Err(e)) => Err(e),
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
async fn create_pool(State(state): State<AppState>, ApiJson(body): ApiJson<Value>) -> ApiResult<Response> {
    let (name, spec) = parse_create(&state, body)?;
    let pool = service::create(&state, &name, &spec).await?;
    Ok(pool_response(StatusCode::CREATED, pool, true))
}

/// List pools in name order, a page at a time.
#[utoipa::path(get, path = "/v1/pools", tag = "pools", params(PageParams),
    responses(
        (status = 200, description = "A page of pools", body = PoolList),
        (status = 422, description = "Bad `limit` or `cursor`", body = Problem, content_type = "application/problem+json"),
    ))]
async fn list_pools(State(state): State<AppState>, ApiQuery(page): ApiQuery<PageParams>) -> ApiResult<Json<PoolList>> {
    let limit = page.limit()?;
    let after = page.after()?;
    let mut rows = db::pools::list(state.db.read(), after.as_deref(), limit + 1).await?;
    let next_cursor = finish_page(&mut rows, limit, |p| p.name.clone());
    Ok(Json(PoolList { items: rows.into_iter().map(PoolView::from).collect(), next_cursor }))
}

/// Get a pool.
#[utoipa::path(get, path = "/v1/pools/{name}", tag = "pools", params(("name" = String, Path, description = "Pool name")),
    responses(
        (status = 200, description = "The pool", body = PoolView, headers(("ETag" = String, description = "Generation"))),
        (status = 404, description = "No such pool", body = Problem, content_type = "application/problem+json"),
    ))]
async fn get_pool(State(state): State<AppState>, Path(name): Path<String>) -> ApiResult<Response> {
    // The most read answer of all: rendered once per change of the pool.
    let cached = state.db.pool_shared(&name).await?.ok_or_else(|| ApiError::not_found("pool", &name))?;
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
    Path(name): Path<String>,
    caller: Option<axum::Extension<Caller>>,
    IfMatch(pinned): IfMatch,
    MergePatch(patch): MergePatch<PoolPatch>,
) -> ApiResult<Response> {
    // Operators change size, image, version and pause; the rest is admin's.
    let operator = caller.is_some_and(|c| c.role < Role::Admin);
    if operator && let Some(field) = patch.fields().into_iter().find(|f| !OPERATOR_PATCHABLE.contains(f)) {
        tracing::info!(field, "operator tried to patch an admin-only field");
        return Err(ApiError::Forbidden { need: "admin" });
    }
    let pool = service::update_spec(&state, &name, pinned.as_deref(), "SpecChanged", |current| {
        let spec = patch.to_spec(current, state.limits())?;
        // A pool with host mounts gives its image what they expose: choosing
        // that image is an admin's decision (SECURITY.md, "Roles").
        if operator && spec.image != current.image && !current.extra_mounts.is_empty() {
            tracing::info!("operator tried to change the image of a pool with host mounts");
            return Err(ApiError::Forbidden { need: "admin" });
        }
        Ok(spec)
    })
    .await?;
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
    Path(name): Path<String>,
    IfMatch(pinned): IfMatch,
    ApiJson(scale): ApiJson<Scale>,
) -> ApiResult<Response> {
    let max = state.limits().max_replicas;
    let replicas = u32::try_from(scale.replicas).ok().filter(|r| *r <= max).ok_or_else(|| {
        ApiError::invalid("replicas", "range", format!("must be between 0 and {max} (got {})", scale.replicas))
    })?;
    let pool = service::update_spec(&state, &name, pinned.as_deref(), "Scaled", |current| {
        Ok(PoolSpec { replicas, ..current.clone() })
    })
    .await?;
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
async fn delete_pool(State(state): State<AppState>, Path(name): Path<String>) -> ApiResult<Response> {
    let pool = service::delete(&state, &name).await?;
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
    Path(name): Path<String>,
    ApiQuery(page): ApiQuery<PageParams>,
) -> ApiResult<Json<EventList>> {
    let limit = page.limit()?;
    let before = page.after_id()?;
    service::load(&state, &name).await?;
    let mut rows = db::events::list(state.db.read(), SubjectKind::Pool, &name, before, limit + 1).await?;
    let next_cursor = finish_page(&mut rows, limit, |e| e.id.to_string());
    Ok(Json(EventList { items: rows, next_cursor }))
}
