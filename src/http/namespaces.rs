//! `/v1/namespaces`: the namespaces pools, clusters, upgrade jobs, apply
//! sets and tokens belong to. Anyone sees the namespaces they hold a role
//! in; only a `*` admin creates, fences or deletes one.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::db::namespaces::NamespaceRecord;
use crate::domain::names::DnsLabel;
use crate::domain::object::Namespace;
use crate::error::{ApiError, ApiResult, Problem};
use crate::http::extract::{ApiJson, MergePatch, Scope};
use crate::http::wire::location;
use crate::namespaces::NamespaceError;
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(create_namespace, list_namespaces)).routes(routes!(
        get_namespace,
        patch_namespace,
        delete_namespace
    ))
}

/// A namespace to create.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateNamespace {
    /// A DNS-1123 label, unique.
    #[schema(example = "team-a")]
    pub name: DnsLabel,
    /// Labels every engine the namespace's pools use must carry (besides
    /// the pools' own placement); empty or absent: any engine.
    #[serde(default)]
    pub engine_selector: BTreeMap<String, String>,
}

/// A change of a namespace (JSON merge patch).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NamespacePatch {
    /// Replaces the engine selector; `{}` lets the namespace's pools use
    /// any engine again.
    pub engine_selector: BTreeMap<String, String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct NamespaceView {
    pub name: Namespace,
    /// Labels every engine the namespace's pools use must carry; `{}`: any
    /// engine.
    pub engine_selector: BTreeMap<String, String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<NamespaceRecord> for NamespaceView {
    fn from(r: NamespaceRecord) -> Self {
        Self { name: r.name, engine_selector: r.engine_selector, created_at: r.created_at, updated_at: r.updated_at }
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct NamespaceList {
    /// By name: the namespaces the caller holds a role in.
    pub items: Vec<NamespaceView>,
}

impl From<NamespaceError> for ApiError {
    fn from(e: NamespaceError) -> Self {
        match e {
            NamespaceError::Invalid(errs) => ApiError::Validation(errs),
            NamespaceError::Exists(_) | NamespaceError::Busy(_) => ApiError::Conflict(e.to_string()),
            NamespaceError::NotFound(name) => ApiError::not_found("namespace", name),
            NamespaceError::Denied(denied) => denied.into(),
            NamespaceError::Store(e) => ApiError::Database(e),
        }
    }
}

fn namespace(name: &str) -> Result<Namespace, ApiError> {
    // A name that is no DNS label names no namespace: answered as missing.
    Namespace::parse(name).map_err(|_| ApiError::not_found("namespace", name))
}

/// Create a namespace (a `*` admin's).
#[utoipa::path(post, path = "/v1/namespaces", tag = "namespaces",
    request_body(content = CreateNamespace, content_type = "application/json"),
    responses(
        (status = 201, description = "Created", body = NamespaceView, headers(("Location" = String, description = "URL of the namespace"))),
        (status = 400, description = "Body is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Only a `*` admin creates namespaces", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A namespace of that name exists", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Body is not declared as JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Bad name or selector; `errors` names each", body = Problem, content_type = "application/problem+json"),
    ))]
#[tracing::instrument(skip_all, fields(namespace = %body.name))]
async fn create_namespace(
    State(state): State<AppState>,
    scope: Scope,
    ApiJson(body): ApiJson<CreateNamespace>,
) -> ApiResult<Response> {
    let name = Namespace::stored(body.name.into_string());
    let record = state.namespaces.create(&scope.access, name, body.engine_selector).await?;
    let headers = [(header::LOCATION, location(&format!("/v1/namespaces/{}", record.name)))];
    Ok((StatusCode::CREATED, headers, Json(NamespaceView::from(record))).into_response())
}

/// List the namespaces the caller holds a role in (every one for `*`).
#[utoipa::path(get, path = "/v1/namespaces", tag = "namespaces",
    responses((status = 200, description = "The caller's namespaces, by name", body = NamespaceList)))]
async fn list_namespaces(State(state): State<AppState>, scope: Scope) -> ApiResult<Json<NamespaceList>> {
    let items = state.namespaces.list(&scope.access).await?;
    Ok(Json(NamespaceList { items: items.into_iter().map(NamespaceView::from).collect() }))
}

/// Get a namespace.
#[utoipa::path(get, path = "/v1/namespaces/{name}", tag = "namespaces",
    params(("name" = String, Path, description = "Namespace name")),
    responses(
        (status = 200, description = "The namespace", body = NamespaceView),
        (status = 404, description = "No such namespace (or one the caller holds no role in)", body = Problem, content_type = "application/problem+json"),
    ))]
async fn get_namespace(
    State(state): State<AppState>,
    scope: Scope,
    Path(name): Path<String>,
) -> ApiResult<Json<NamespaceView>> {
    Ok(Json(state.namespaces.get(&scope.access, &namespace(&name)?).await?.into()))
}

/// Fence a namespace's pools to some engines (a `*` admin's).
///
/// Its pools then place machines only on engines whose labels match
/// `engine_selector` (as well as their own placement); machines on other
/// engines are replaced as a rollout replaces them. A pool whose namespace
/// matches no live engine says so in its conditions.
#[utoipa::path(patch, path = "/v1/namespaces/{name}", tag = "namespaces",
    params(("name" = String, Path, description = "Namespace name")),
    request_body(content = NamespacePatch, content_type = "application/merge-patch+json"),
    responses(
        (status = 200, description = "Changed", body = NamespaceView),
        (status = 400, description = "Body is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Only a `*` admin changes namespaces", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such namespace", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Body is not declared as JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Bad selector; `errors` names each label", body = Problem, content_type = "application/problem+json"),
    ))]
#[tracing::instrument(skip(state, scope, patch))]
async fn patch_namespace(
    State(state): State<AppState>,
    scope: Scope,
    Path(name): Path<String>,
    MergePatch(patch): MergePatch<NamespacePatch>,
) -> ApiResult<Json<NamespaceView>> {
    let record = state.namespaces.set_engine_selector(&scope.access, &namespace(&name)?, patch.engine_selector).await?;
    Ok(Json(record.into()))
}

/// Delete an empty namespace (a `*` admin's); `default` always exists.
#[utoipa::path(delete, path = "/v1/namespaces/{name}", tag = "namespaces",
    params(("name" = String, Path, description = "Namespace name")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 403, description = "Only a `*` admin deletes namespaces", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such namespace", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "It still holds pools, clusters, apply sets or tokens (the answer says which), or it is `default`", body = Problem, content_type = "application/problem+json"),
    ))]
#[tracing::instrument(skip(state, scope))]
async fn delete_namespace(
    State(state): State<AppState>,
    scope: Scope,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    state.namespaces.delete(&scope.access, &namespace(&name)?).await?;
    Ok(StatusCode::NO_CONTENT)
}
