//! `/v1/clusters`: register, list, read and delete Kubernetes clusters, and
//! probe one's control plane. Credentials go in and never come out: no
//! response type here has a field for them.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::clusters::service::connect;
use crate::db::{self, clusters::ClusterRecord, clusters::Deleted};
use crate::domain::ValidationErrors;
use crate::domain::names::check_dns_label;
use crate::domain::server_url::{check_server_url, redact_server_url};
use crate::domain::upgrade::{Component, image_version};
use crate::error::{ApiError, ApiResult, Problem};
use crate::http::extract::{ApiJson, ApiQuery};
use crate::http::pagination::{PageParams, finish_page};
use crate::k8s::{ClusterApi, Credentials};
use crate::state::AppState;
use crate::upgrade::plan;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_cluster, list_clusters))
        .routes(routes!(get_cluster, delete_cluster))
        .routes(routes!(cluster_status))
}

/// Body of `POST /v1/clusters`: a name and either a kubeconfig, or a server
/// URL with a bearer token (and the CA certificate for `https`).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateCluster {
    /// DNS-1123 label; unique.
    #[schema(example = "prod")]
    #[schema(pattern = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", min_length = 1, max_length = 63)]
    pub name: String,
    /// A kubeconfig document (YAML or JSON) with embedded data; file paths
    /// and exec plugins are refused.
    pub kubeconfig: Option<String>,
    /// Context of `kubeconfig` to use; its current context by default.
    pub context: Option<String>,
    /// API server URL, `https://host:port` (or `http://` for tests). It is
    /// shown to every viewer, so it may hold no credential: a user name or
    /// password, or a query parameter such as `access_token`, is refused.
    #[schema(example = "https://10.0.0.1:6443")]
    pub server: Option<String>,
    /// Bearer token, with `server`. It is sent in an HTTP header, so it may
    /// not contain control characters (CR, LF, NUL, DEL).
    pub token: Option<String>,
    /// PEM CA certificate of the API server, with `server`.
    pub ca_certificate: Option<String>,
}

// Written by hand so that a derived Debug can never print a secret.
impl std::fmt::Debug for CreateCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let server = self.server.as_deref().map(redact_server_url);
        f.debug_struct("CreateCluster").field("name", &self.name).field("server", &server).finish_non_exhaustive()
    }
}

/// A registered cluster. Credentials are write-only and never shown.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ClusterView {
    pub name: String,
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
        Self { name: r.name, server, auth: r.auth_kind, created_at: r.created_at, updated_at: r.updated_at }
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ClusterList {
    pub items: Vec<ClusterView>,
    /// Pass as `cursor` to get the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

/// What `GET /v1/clusters/{name}/status` saw.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ClusterStatus {
    pub name: String,
    /// `/version` answered.
    pub reachable: bool,
    /// `gitVersion` from `/version`.
    pub version: Option<String>,
    /// `/healthz` answered `ok`.
    pub healthy: bool,
    /// Why the cluster is unreachable or unhealthy.
    pub detail: Option<String>,
    pub components: Vec<ComponentStatus>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ComponentStatus {
    pub component: Component,
    pub daemonset: String,
    /// The image the DaemonSet runs the component with.
    pub image: Option<String>,
    /// The version in the image's tag.
    pub version: Option<String>,
    pub pods: Vec<PodStatus>,
    /// Why the component could not be read.
    pub error: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PodStatus {
    pub name: String,
    pub phase: Option<String>,
    pub image: Option<String>,
}

/// Turns a create body into a name and credentials, reporting every broken rule.
fn parse_create(body: CreateCluster) -> ApiResult<(String, Credentials)> {
    let mut errs = ValidationErrors::default();
    if let Err(e) = check_dns_label(&body.name) {
        errs.push("name", "dns_label", e);
    }
    let creds = match (body.kubeconfig, body.server) {
        (Some(kubeconfig), None) => {
            for (field, set) in [("token", body.token.is_some()), ("ca_certificate", body.ca_certificate.is_some())] {
                if set {
                    errs.push(field, "exclusive", "goes with server, not with kubeconfig");
                }
            }
            Some(Credentials::Kubeconfig { kubeconfig, context: body.context })
        }
        (None, Some(server)) => match body.token {
            Some(token) => Some(Credentials::Token { server, token, ca_certificate: body.ca_certificate }),
            None => {
                errs.push("token", "required", "is required with server");
                None
            }
        },
        (Some(_), Some(_)) => {
            errs.push("kubeconfig", "exclusive", "give either kubeconfig or server, not both");
            None
        }
        (None, None) => {
            errs.push("kubeconfig", "required", "give a kubeconfig, or server and token");
            None
        }
    };
    match creds {
        Some(c) if errs.is_empty() => Ok((body.name, c)),
        _ => Err(ApiError::Validation(errs)),
    }
}

async fn load(state: &AppState, name: &str) -> ApiResult<ClusterRecord> {
    db::clusters::get(state.db.read(), name).await?.ok_or_else(|| ApiError::not_found("cluster", name))
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
#[tracing::instrument(skip_all, fields(cluster = %body.name))]
async fn create_cluster(State(state): State<AppState>, ApiJson(body): ApiJson<CreateCluster>) -> ApiResult<Response> {
    let (name, creds) = parse_create(body)?;
    let server = creds
        .validate(state.config.kube_request_timeout)
        .await
        .map_err(|e| ApiError::invalid(e.field, "credentials", e.message))?;
    // The URL is shown to viewers and logged: it may carry no credential.
    let field = if creds.kind() == "token" { "server" } else { "kubeconfig" };
    check_server_url(&server).map_err(|e| ApiError::invalid(field, "server_url_credentials", e))?;
    let mut tx = state.db.begin_write().await?;
    let inserted = db::clusters::insert(&mut tx, &name, &server, &creds, Utc::now()).await;
    let inserted = match inserted {
        Ok(r) => tx.commit().await.map(|()| r),
        Err(e) => Err(e),
    };
    let record = match inserted {
        Ok(r) => r,
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
            return Err(ApiError::Conflict(format!("cluster {name:?} already exists")));
        }
        Err(e) => return Err(e.into()),
    };
    tracing::info!(cluster = %name, server = %server, auth = creds.kind(), "cluster registered");
    let location =
        HeaderValue::from_str(&format!("/v1/clusters/{name}")).unwrap_or(HeaderValue::from_static("/v1/clusters"));
    Ok((StatusCode::CREATED, [(header::LOCATION, location)], Json(ClusterView::from(record))).into_response())
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
    ApiQuery(page): ApiQuery<PageParams>,
) -> ApiResult<Json<ClusterList>> {
    let limit = page.limit()?;
    let after = page.after()?;
    let mut rows = db::clusters::list(state.db.read(), after.as_deref(), limit + 1).await?;
    let next_cursor = finish_page(&mut rows, limit, |c| c.name.clone());
    Ok(Json(ClusterList { items: rows.into_iter().map(ClusterView::from).collect(), next_cursor }))
}

/// Read a cluster (never its credentials).
#[utoipa::path(get, path = "/v1/clusters/{name}", tag = "clusters", params(("name" = String, Path, description = "Cluster name")),
    responses(
        (status = 200, description = "The cluster", body = ClusterView),
        (status = 404, description = "No such cluster", body = Problem, content_type = "application/problem+json"),
    ))]
#[tracing::instrument(skip_all, fields(cluster = %name))]
async fn get_cluster(State(state): State<AppState>, Path(name): Path<String>) -> ApiResult<Json<ClusterView>> {
    Ok(Json(load(&state, &name).await?.into()))
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
async fn delete_cluster(State(state): State<AppState>, Path(name): Path<String>) -> ApiResult<StatusCode> {
    match db::clusters::delete_if_idle(&state.db, &name).await? {
        Deleted::Yes => Ok(StatusCode::NO_CONTENT),
        Deleted::Missing => Err(ApiError::not_found("cluster", name)),
        Deleted::Busy(id) => Err(ApiError::Conflict(format!(
            "upgrade job {id} is active on cluster {name:?}; cancel it or wait for it to end (/v1/upgrades/{id})"
        ))),
        Deleted::InUse(pools) => Err(ApiError::Conflict(format!(
            "cluster {name:?} is used by pools {}; delete them, or patch their `cluster`, first",
            pools.join(", ")
        ))),
    }
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
async fn cluster_status(State(state): State<AppState>, Path(name): Path<String>) -> ApiResult<Json<ClusterStatus>> {
    let api = connect(&state, &name, 1).await?;
    let mut status =
        ClusterStatus { name, reachable: false, version: None, healthy: false, detail: None, components: Vec::new() };
    match api.version().await {
        Ok(info) => {
            status.reachable = true;
            status.version = Some(info.git_version);
        }
        Err(e) => {
            status.detail = Some(e.to_string());
            return Ok(Json(status));
        }
    }
    match api.healthz_once().await {
        Ok(()) => status.healthy = true,
        Err(e) => status.detail = Some(e),
    }
    for c in Component::ALL {
        status.components.push(component_status(&api, c).await);
    }
    Ok(Json(status))
}

async fn component_status(api: &ClusterApi, c: Component) -> ComponentStatus {
    let mut s = ComponentStatus {
        component: c,
        daemonset: c.daemonset(),
        image: None,
        version: None,
        pods: vec![],
        error: None,
    };
    match api.get_daemonset(&c.daemonset()).await {
        Ok(Some(ds)) => {
            s.image = plan::daemonset_image(&ds, c);
            s.version = s.image.as_deref().and_then(image_version).map(|v| v.to_string());
        }
        Ok(None) => s.error = Some(format!("DaemonSet {} does not exist", c.daemonset())),
        Err(e) => s.error = Some(e.to_string()),
    }
    match api.list_pods(&c.pod_selector()).await {
        Ok(pods) => {
            s.pods = pods
                .iter()
                .map(|p| PodStatus {
                    name: p.metadata.name.clone().unwrap_or_default(),
                    phase: p.status.as_ref().and_then(|st| st.phase.clone()),
                    image: plan::pod_image(p, c),
                })
                .collect();
        }
        Err(e) => s.error = Some(e.to_string()),
    }
    s
}
