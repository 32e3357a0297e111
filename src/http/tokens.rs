//! `/v1/tokens` and `/v1/audit`: token management and the audit trail
//! (admin only).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::db::{audit::AuditRecord, tokens::TokenInfo};
use crate::error::{ApiError, ApiResult, Problem};
use crate::http::extract::{ApiJson, ApiQuery};
use crate::http::pagination::PageParams;
use crate::identity::Role;
use crate::identity::tokens::TokenError;
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_token, list_tokens))
        .routes(routes!(delete_token))
        .routes(routes!(list_audit))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    /// Unique, a DNS-1123 label: what the audit trail will name.
    #[schema(example = "ci-pipeline")]
    pub name: crate::domain::names::DnsLabel,
    pub role: Role,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct NewToken {
    pub name: String,
    pub role: Role,
    /// The secret. It is shown this once and stored only as a hash.
    pub token: String,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TokenList {
    pub items: Vec<TokenInfo>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AuditList {
    /// Newest first.
    pub items: Vec<AuditRecord>,
    /// Pass as `cursor` to get the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

impl From<TokenError> for ApiError {
    fn from(e: TokenError) -> Self {
        match e {
            TokenError::Invalid(errs) => ApiError::Validation(errs),
            TokenError::Exists(_) | TokenError::LastAdmin(_) => ApiError::Conflict(e.to_string()),
            TokenError::NotFound(name) => ApiError::not_found("token", name),
            TokenError::Store(e) => ApiError::Database(e),
        }
    }
}

/// Create a token; the response is the only time the secret is shown.
///
/// `Idempotency-Key` is refused here (422): replaying this answer would
/// mean keeping the secret. Retry without the key; if the first request
/// got through, the retry answers 409 and the token can be revoked.
#[utoipa::path(post, path = "/v1/tokens", tag = "access",
    request_body(content = CreateToken, content_type = "application/json"),
    responses(
        (status = 201, description = "Created; keep the token, it is not shown again", body = NewToken),
        (status = 400, description = "Body is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A token of that name exists", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Body is not declared as JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Bad name or role, or an `Idempotency-Key` was sent", body = Problem, content_type = "application/problem+json"),
    ))]
#[tracing::instrument(skip_all, fields(token = %req.name))]
async fn create_token(State(state): State<AppState>, ApiJson(req): ApiJson<CreateToken>) -> ApiResult<Response> {
    let created = state.token_service.create(&req.name, req.role).await?;
    let body = NewToken {
        name: created.info.name,
        role: req.role,
        token: created.secret,
        created_at: created.info.created_at,
    };
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// List tokens (names and roles; never the secrets).
#[utoipa::path(get, path = "/v1/tokens", tag = "access",
    responses((status = 200, description = "Every token", body = TokenList)))]
async fn list_tokens(State(state): State<AppState>) -> ApiResult<Json<TokenList>> {
    Ok(Json(TokenList { items: state.token_service.list().await? }))
}

/// Revoke a token. The last admin token cannot be revoked.
#[utoipa::path(delete, path = "/v1/tokens/{name}", tag = "access",
    params(("name" = String, Path, description = "Token name")),
    responses(
        (status = 204, description = "Revoked"),
        (status = 404, description = "No such token", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "It is the last admin token", body = Problem, content_type = "application/problem+json"),
    ))]
#[tracing::instrument(skip(state))]
async fn delete_token(State(state): State<AppState>, Path(name): Path<String>) -> ApiResult<StatusCode> {
    state.token_service.delete(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The audit trail of mutating requests, newest first.
#[utoipa::path(get, path = "/v1/audit", tag = "access", params(PageParams),
    responses(
        (status = 200, description = "A page of audit records", body = AuditList),
        (status = 422, description = "Bad `limit` or `cursor`", body = Problem, content_type = "application/problem+json"),
    ))]
async fn list_audit(State(state): State<AppState>, ApiQuery(page): ApiQuery<PageParams>) -> ApiResult<Json<AuditList>> {
    let page = state.token_service.audit(&page.request_by_id()?).await?;
    Ok(Json(AuditList { items: page.items, next_cursor: page.next_cursor }))
}
