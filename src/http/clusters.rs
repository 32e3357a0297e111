//! `/v1/clusters`: register, list, read and delete Kubernetes clusters, and
//! probe one's control plane. Credentials go in and never come out: no
//! response type here has a field for them.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

pub use crate::clusters::probe::{ClusterStatus, ComponentStatus, PodStatus};
use crate::clusters::{ClusterError, ClusterSpecInput};
use crate::db::clusters::ClusterRecord;
use crate::domain::object::Namespace;
use crate::domain::server_url::redact_server_url;
use crate::error::{ApiError, ApiResult, Problem};
use crate::http::extract::{ApiJson, ApiQuery, Scope};
use crate::http::pagination::PageParams;
use crate::http::wire::named::CreateCluster;
use crate::http::wire::{in_namespace, location};
use crate::identity::Action;
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_cluster, list_clusters))
        .routes(routes!(get_cluster, delete_cluster))
        .routes(routes!(cluster_status))
}

/// A registered cluster. Credentials are write-only and never shown.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ClusterView {
    pub name: String,
    /// The namespace the cluster belongs to.
    pub namespace: Namespace,
    /// The API server URL.
    pub server: String,
    /// How drover authenticates: `kubeconfig` or `token`.
    #[schema(schema_with = auth_schema)]
    pub auth: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

fn auth_schema() -> utoipa::openapi::Object {
    crate::http::openapi::string_enum(&["kubeconfig", "token"], "How drover authenticates: `kubeconfig` or `token`")
}

impl From<ClusterRecord> for ClusterView {
    fn from(r: ClusterRecord) -> Self {
        // Redacted in case the row predates the check at registration.
        let server = redact_server_url(&r.server);
        Self {
            name: r.name,
            namespace: r.namespace,
            server,
            auth: r.auth_kind,
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ClusterList {
    pub items: Vec<ClusterView>,
    /// Pass as `cursor` to get the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

impl From<ClusterError> for ApiError {
    fn from(e: ClusterError) -> Self {
        match e {
            ClusterError::NotFound(name) => ApiError::not_found("cluster", name),
            ClusterError::NamespaceNotFound(name) => ApiError::not_found("namespace", name),
            ClusterError::Denied(denied) => denied.into(),
            ClusterError::Exists(_) | ClusterError::Busy { .. } | ClusterError::InUse { .. } => {
                ApiError::Conflict(e.to_string())
            }
            ClusterError::Invalid(errs) => ApiError::Validation(errs),
            ClusterError::Unusable { .. } => ApiError::Unavailable(e.to_string()),
            ClusterError::Store(e) => ApiError::Database(e),
        }
    }
}

/// Register a cluster.
#[utoipa::path(post, path = "/v1/clusters", tag = "clusters",
    request_body(content = CreateCluster, content_type = "application/json"),
    responses(
        (status = 201, description = "Registered", body = ClusterView, headers(("Location" = String, description = "URL of the cluster"))),
        (status = 400, description = "Body is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A cluster of that name exists", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Body is not declared as JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A field is missing or invalid; `errors` names it", body = Problem, content_type = "application/problem+json"),
    ))]
#[tracing::instrument(skip_all, fields(cluster))]
async fn create_cluster(
    State(state): State<AppState>,
    scope: Scope,
    ApiJson(body): ApiJson<Value>,
) -> ApiResult<Response> {
    let (name, spec) = crate::domain::json::named::<ClusterSpecInput>(body)?.both()?;
    tracing::Span::current().record("cluster", name.as_str());
    let record = state.clusters.register(&scope.single()?, spec.into_new(name)).await?;
    let headers =
        [(header::LOCATION, location(&in_namespace(&format!("/v1/clusters/{}", record.name), &record.namespace)))];
    Ok((StatusCode::CREATED, headers, Json(ClusterView::from(record))).into_response())
}

/// List clusters by name.
#[utoipa::path(get, path = "/v1/clusters", tag = "clusters", params(PageParams),
    responses(
        (status = 200, description = "A page of clusters", body = ClusterList),
        (status = 422, description = "Bad `limit` or `cursor`", body = Problem, content_type = "application/problem+json"),
    ))]
#[tracing::instrument(skip_all)]
async fn list_clusters(
    State(state): State<AppState>,
    scope: Scope,
    ApiQuery(page): ApiQuery<PageParams>,
) -> ApiResult<Json<ClusterList>> {
    let page = state.clusters.list(&scope.single()?, &page.request()?).await?;
    let items = page.items.into_iter().map(ClusterView::from).collect();
    Ok(Json(ClusterList { items, next_cursor: page.next_cursor }))
}

/// Read a cluster (never its credentials).
#[utoipa::path(get, path = "/v1/clusters/{name}", tag = "clusters", params(("name" = String, Path, description = "Cluster name")),
    responses(
        (status = 200, description = "The cluster", body = ClusterView),
        (status = 404, description = "No such cluster", body = Problem, content_type = "application/problem+json"),
    ))]
#[tracing::instrument(skip_all, fields(cluster = %name))]
async fn get_cluster(
    State(state): State<AppState>,
    scope: Scope,
    Path(name): Path<String>,
) -> ApiResult<Json<ClusterView>> {
    Ok(Json(state.clusters.get(&scope.single()?, Action::READ, &name).await?.into()))
}

/// Forget a cluster and its job history. Refused while a job runs on it or
/// a pool names it.
#[utoipa::path(delete, path = "/v1/clusters/{name}", tag = "clusters", params(("name" = String, Path, description = "Cluster name")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 404, description = "No such cluster", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "An upgrade job is pending or running on the cluster, or pools name it (`detail` lists them)", body = Problem, content_type = "application/problem+json"),
    ))]
#[tracing::instrument(skip_all, fields(cluster = %name))]
async fn delete_cluster(
    State(state): State<AppState>,
    scope: Scope,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    state.clusters.delete(&scope.single()?, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Probe the cluster: `/version`, `/healthz`, and each control-plane
/// component's DaemonSet image and pods.
#[utoipa::path(get, path = "/v1/clusters/{name}/status", tag = "clusters", params(("name" = String, Path, description = "Cluster name")),
    responses(
        (status = 200, description = "What the probes saw; `reachable` is false when the API server did not answer", body = ClusterStatus),
        (status = 404, description = "No such cluster", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The stored credentials cannot be used", body = Problem, content_type = "application/problem+json"),
    ))]
#[tracing::instrument(skip_all, fields(cluster = %name))]
async fn cluster_status(
    State(state): State<AppState>,
    scope: Scope,
    Path(name): Path<String>,
) -> ApiResult<Json<ClusterStatus>> {
    Ok(Json(state.clusters.status(&scope.single()?, &name).await?))
}
