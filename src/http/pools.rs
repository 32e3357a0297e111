//! `/v1/pools`: create, read, change, scale and delete pools, and read their
//! events. A pool here is stored desired state; the reconciler acts on it.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use serde_json::Value;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::app::AppState;
use crate::auth::{Caller, OPERATOR_PATCHABLE, Role};
use crate::db::{self, pools::Pool};
use crate::domain::ValidationErrors;
use crate::domain::event::{EventType, NewEvent, SubjectKind};
use crate::domain::names::PoolName;
use crate::domain::pool::{PoolSpec, validate};
use crate::error::{ApiError, ApiResult, Problem};
use crate::http::extract::{ApiJson, ApiQuery, MergePatch, from_json_value};
use crate::http::pagination::{PageParams, finish_page};
use crate::telemetry::Clipped;

mod wire;

pub use wire::{CreatePool, EventList, PoolList, PoolPhase, PoolSpecInput, PoolView, Scale, StrategyInput};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_pool, list_pools))
        .routes(routes!(get_pool, patch_pool, delete_pool))
        .routes(routes!(scale_pool))
        .routes(routes!(list_pool_events))
}

// ---- helpers ---------------------------------------------------------------

fn etag(generation: i64) -> HeaderValue {
    HeaderValue::from_str(&format!("\"{generation}\"")).unwrap_or(HeaderValue::from_static("\"0\""))
}

fn location(name: &str) -> HeaderValue {
    HeaderValue::from_str(&format!("/v1/pools/{name}")).unwrap_or(HeaderValue::from_static("/v1/pools"))
}

/// The pool answered with its ETag.
pub(crate) fn pool_response(status: StatusCode, pool: Pool, with_location: bool) -> Response {
    let mut headers = HeaderMap::new();
    headers.insert(header::ETAG, etag(pool.generation));
    if with_location {
        headers.insert(header::LOCATION, location(&pool.name));
    }
    (status, headers, Json(PoolView::from(pool))).into_response()
}

/// The generations an `If-Match` header accepts: `None` when it was not
/// sent or is `*` (any existing pool). RFC 9110 asks If-Match for the
/// strong comparison, so a weak tag (`W/"3"`) matches nothing; a list of
/// tags accepts any of its strong ones.
fn if_match(headers: &HeaderMap) -> ApiResult<Option<Vec<i64>>> {
    let Some(value) = headers.get(header::IF_MATCH) else { return Ok(None) };
    let raw = value.to_str().unwrap_or_default().trim();
    if raw == "*" {
        return Ok(None);
    }
    let shown = || crate::telemetry::truncate(raw, 100).to_owned();
    let mut strong = Vec::new();
    for tag in raw.split(',').map(str::trim) {
        if tag.starts_with("W/") {
            continue;
        }
        let generation = tag.strip_prefix('"').and_then(|t| t.strip_suffix('"')).and_then(|t| t.parse().ok());
        match generation {
            Some(g) => strong.push(g),
            None => {
                return Err(ApiError::PreconditionFailed(format!(
                    "If-Match {:?} is not an ETag this server issued (they look like \"3\")",
                    shown()
                )));
            }
        }
    }
    if strong.is_empty() {
        return Err(ApiError::PreconditionFailed(format!(
            "If-Match {:?} names only weak ETags, which never match (If-Match uses strong comparison); send the ETag as it was received",
            shown()
        )));
    }
    Ok(Some(strong))
}

pub(crate) async fn load(state: &AppState, name: &str) -> ApiResult<Pool> {
    state.db.pool(name).await?.ok_or_else(|| ApiError::not_found("pool", name))
}

/// RFC 7396 JSON merge patch.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(changes) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(serde_json::Map::new());
    }
    if let Value::Object(fields) = target {
        for (key, change) in changes {
            if change.is_null() {
                fields.remove(key);
            } else {
                merge_patch(fields.entry(key.clone()).or_insert(Value::Null), change);
            }
        }
    }
}

/// The spec a JSON merge patch makes of `current`, with every rule checked.
/// Used by PATCH and by the dry-run plan, so both read a patch alike.
pub(crate) fn patched_spec(state: &AppState, current: &PoolSpec, patch: &Value) -> ApiResult<PoolSpec> {
    if !patch.is_object() {
        return Err(ApiError::invalid("body", "type", "a merge patch must be a JSON object"));
    }
    let mut doc = serde_json::to_value(current).map_err(|e| ApiError::Internal(e.into()))?;
    merge_patch(&mut doc, patch);
    spec_from_value(state, doc)
}

/// Parses a spec document (a create body without its name, or a patched
/// spec) and checks every rule.
fn spec_from_value(state: &AppState, doc: Value) -> ApiResult<PoolSpec> {
    let input: PoolSpecInput = from_json_value(doc)?;
    validate(input.into(), state.limits()).map_err(ApiError::Validation)
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
    let spec = spec_from_value(state, Value::Object(fields));
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

/// A pool may name only a registered cluster: its machines' nodes are
/// drained through it. Checked in the writing transaction, against the
/// cluster delete that checks the other way.
async fn check_cluster(db: impl sqlx::SqliteExecutor<'_>, spec: &PoolSpec) -> ApiResult<()> {
    let Some(cluster) = spec.cluster.as_deref() else { return Ok(()) };
    if db::clusters::exists(db, cluster).await? {
        return Ok(());
    }
    Err(ApiError::invalid(
        "cluster",
        "cluster_exists",
        format!("names no registered cluster ({cluster:?}); register it with POST /v1/clusters first"),
    ))
}

/// One line naming what changed between two specs, for the event log.
fn describe_change(old: &PoolSpec, new: &PoolSpec) -> String {
    let (Ok(Value::Object(a)), Ok(Value::Object(b))) = (serde_json::to_value(old), serde_json::to_value(new)) else {
        return "spec changed".into();
    };
    let changed: Vec<String> = b
        .iter()
        .filter(|(k, v)| a.get(*k) != Some(v))
        .map(|(k, v)| match a.get(k) {
            Some(old) if !v.is_object() && !v.is_array() => format!("{k}: {old} -> {v}"),
            _ => k.clone(),
        })
        .collect();
    format!("spec changed ({})", changed.join(", "))
}

/// Applies `change` to the pool's spec with optimistic concurrency: bumps
/// the generation only if nobody else did since we read it. With `If-Match`
/// a lost race is the client's 412; without, we re-read and try again.
async fn update_spec(
    state: &AppState,
    name: &str,
    headers: &HeaderMap,
    reason: &'static str,
    change: impl Fn(&PoolSpec) -> ApiResult<PoolSpec>,
) -> ApiResult<Response> {
    let pinned = if_match(headers)?;
    const ATTEMPTS: usize = 5;
    for _ in 0..ATTEMPTS {
        let pool = load(state, name).await?;
        if let Some(tags) = &pinned
            && !tags.contains(&pool.generation)
        {
            let asked: Vec<String> = tags.iter().map(i64::to_string).collect();
            return Err(ApiError::PreconditionFailed(format!(
                "pool {name:?} is at generation {}, not {}",
                pool.generation,
                asked.join(" or ")
            )));
        }
        if pool.deleting {
            return Err(ApiError::Conflict(format!("pool {name:?} is being deleted; its spec can no longer change")));
        }
        let spec = change(&pool.spec)?;
        if spec == pool.spec {
            return Ok(pool_response(StatusCode::OK, pool, false));
        }
        let now = Utc::now();
        let mut tx = crate::db::begin_write(&state.db).await?;
        // A pool that named a cluster before checks existed can still be scaled.
        if spec.cluster != pool.spec.cluster {
            check_cluster(&mut *tx, &spec).await?;
        }
        let Some(updated) = db::pools::update_spec(&mut tx, name, pool.generation, &spec, now).await? else {
            drop(tx);
            if pinned.is_some() {
                return Err(ApiError::PreconditionFailed(format!(
                    "pool {name:?} changed while this request ran; re-read it and retry"
                )));
            }
            continue;
        };
        let ev = NewEvent::pool(name, EventType::Normal, reason, describe_change(&pool.spec, &spec));
        db::events::record(&mut tx, &ev, now).await?;
        if let Some(revision) = db::revisions::record_change(&mut tx, name, &pool.spec, &spec, now).await? {
            let message = format!("revision {revision}: machines move to {}", spec.desired_image());
            db::events::record(&mut tx, &NewEvent::pool(name, EventType::Normal, "RolloutStarted", message), now)
                .await?;
        }
        tx.commit().await?;
        // The revision and approvals may have moved in this transaction.
        let updated = state.db.pool(name).await?.unwrap_or(updated);
        state.queue.enqueue(name);
        state.changes.pool(name);
        tracing::info!(pool = name, generation = updated.generation, "spec updated");
        return Ok(pool_response(StatusCode::OK, updated, false));
    }
    Err(ApiError::Conflict(format!("pool {name:?} kept changing under this request; retry")))
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
    let now = Utc::now();
    let mut tx = crate::db::begin_write(&state.db).await?;
    check_cluster(&mut *tx, &spec).await?;
    let pool = match db::pools::insert(&mut tx, name.as_str(), &spec, now).await {
        Ok(pool) => pool,
        Err(e) if e.as_database_error().is_some_and(|d| d.is_unique_violation()) => {
            return Err(ApiError::Conflict(format!("a pool named {name:?} already exists")));
        }
        Err(e) => return Err(e.into()),
    };
    db::revisions::record_first(&mut tx, name.as_str(), &spec, now).await?;
    let message = format!("created with {} replicas of {}", spec.replicas, spec.desired_image());
    db::events::record(&mut tx, &NewEvent::pool(name.as_str(), EventType::Normal, "Created", message), now).await?;
    tx.commit().await?;
    state.queue.enqueue(name.as_str());
    state.changes.pool(name.as_str());
    tracing::info!(pool = %name, "pool created");
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
/// Any spec field may be patched; `null` resets a field to its default.
/// Send `If-Match` with the ETag you read to make the change conditional.
#[utoipa::path(patch, path = "/v1/pools/{name}", tag = "pools",
    params(("name" = String, Path, description = "Pool name"),
        ("If-Match" = Option<String>, Header, description = "ETag (generation) the change is based on")),
    request_body(content = Object, description = "Merge patch of the spec fields", content_type = "application/merge-patch+json"),
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
    headers: HeaderMap,
    MergePatch(patch): MergePatch,
) -> ApiResult<Response> {
    let Value::Object(fields) = &patch else {
        return Err(ApiError::invalid("body", "type", "a merge patch must be a JSON object"));
    };
    // Operators change size, image, version and pause; the rest is admin's.
    if caller.as_ref().is_some_and(|c| c.role < Role::Admin)
        && let Some(field) = fields.keys().find(|k| !OPERATOR_PATCHABLE.contains(&k.as_str()))
    {
        tracing::info!(field = %Clipped(field, 64), "operator tried to patch an admin-only field");
        return Err(ApiError::Forbidden { need: "admin" });
    }
    // A pool with host mounts gives its image what they expose: choosing
    // that image is an admin's decision (SECURITY.md, "Roles").
    let operator = caller.is_some_and(|c| c.role < Role::Admin);
    update_spec(&state, &name, &headers, "SpecChanged", |current| {
        let spec = patched_spec(&state, current, &patch)?;
        if operator && spec.image != current.image && !current.extra_mounts.is_empty() {
            tracing::info!("operator tried to change the image of a pool with host mounts");
            return Err(ApiError::Forbidden { need: "admin" });
        }
        Ok(spec)
    })
    .await
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
    headers: HeaderMap,
    ApiJson(scale): ApiJson<Scale>,
) -> ApiResult<Response> {
    let max = state.limits().max_replicas;
    let replicas = u32::try_from(scale.replicas).ok().filter(|r| *r <= max).ok_or_else(|| {
        ApiError::invalid("replicas", "range", format!("must be between 0 and {max} (got {})", scale.replicas))
    })?;
    update_spec(&state, &name, &headers, "Scaled", |current| Ok(PoolSpec { replicas, ..current.clone() })).await
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
    let now = Utc::now();
    let mut tx = crate::db::begin_write(&state.db).await?;
    let pool = match db::pools::mark_deleting(&mut tx, &name, now).await? {
        Some(pool) => {
            let ev = NewEvent::pool(
                &name,
                EventType::Normal,
                "DeletionRequested",
                "pool marked for deletion; removing its machines",
            );
            db::events::record(&mut tx, &ev, now).await?;
            pool
        }
        // Already deleting (a repeated call), or missing.
        None => load(&state, &name).await?,
    };
    tx.commit().await?;
    state.queue.enqueue(&name);
    state.changes.pool(&name);
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
    load(&state, &name).await?;
    let mut rows = db::events::list(state.db.read(), SubjectKind::Pool, &name, before, limit + 1).await?;
    let next_cursor = finish_page(&mut rows, limit, |e| e.id.to_string());
    Ok(Json(EventList { items: rows, next_cursor }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_follows_rfc_7396() {
        let mut doc = json!({"a": 1, "b": {"c": 2, "d": 3}, "e": [1, 2]});
        merge_patch(&mut doc, &json!({"a": null, "b": {"c": 5}, "e": [3], "f": "x"}));
        assert_eq!(doc, json!({"b": {"c": 5, "d": 3}, "e": [3], "f": "x"}));
        let mut scalar = json!(1);
        merge_patch(&mut scalar, &json!({"a": 1}));
        assert_eq!(scalar, json!({"a": 1}));
    }

    #[test]
    fn if_match_compares_strongly() {
        let tags = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(header::IF_MATCH, HeaderValue::from_static(v));
            if_match(&h)
        };
        assert_eq!(if_match(&HeaderMap::new()).unwrap(), None);
        assert_eq!(tags("\"4\"").unwrap(), Some(vec![4]));
        assert_eq!(tags("*").unwrap(), None);
        assert_eq!(tags("\"4\", W/\"5\", \"6\"").unwrap(), Some(vec![4, 6]));
        assert!(matches!(tags("W/\"4\""), Err(ApiError::PreconditionFailed(_))), "a weak tag never matches");
        assert!(tags("4").is_err());
    }
}
