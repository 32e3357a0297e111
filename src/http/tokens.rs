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

use crate::auth::{Role, hash_token, new_token};
use crate::db::{
    self,
    audit::AuditRecord,
    tokens::{DeleteOutcome, TokenInfo},
};
use crate::domain::names::check_dns_label;
use crate::error::{ApiError, ApiResult, Problem};
use crate::http::extract::{ApiJson, ApiQuery};
use crate::http::pagination::{PageParams, finish_page};
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
    #[schema(pattern = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", min_length = 1, max_length = 63)]
    pub name: String,
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
    check_dns_label(&req.name).map_err(|e| ApiError::invalid("name", "dns_label", e))?;
    let token = new_token();
    let hash = hash_token(&token);
    let mut tx = state.db.begin_write().await?;
    let inserted = db::tokens::insert(&mut tx, &req.name, req.role.as_str(), &hash, Utc::now()).await;
    let inserted = match inserted {
        Ok(r) => tx.commit().await.map(|()| r),
        Err(e) => Err(e),
    };
    let info = match inserted {
        Ok(info) => info,
        Err(e) if e.as_database_error().is_some_and(|d| d.is_unique_violation()) => {
            return Err(ApiError::Conflict(format!("a token named {:?} already exists", req.name)));
        }
        Err(e) => return Err(e.into()),
    };
    state.tokens.insert(&info.name, req.role, &hash);
    tracing::info!(role = req.role.as_str(), "token created");
    let body = NewToken { name: info.name, role: req.role, token, created_at: info.created_at };
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// List tokens (names and roles; never the secrets).
#[utoipa::path(get, path = "/v1/tokens", tag = "access",
    responses((status = 200, description = "Every token", body = TokenList)))]
async fn list_tokens(State(state): State<AppState>) -> ApiResult<Json<TokenList>> {
    let mut items = db::tokens::list(state.db.read()).await?;
    // Uses are stamped in memory and stored about once a minute.
    for t in &mut items {
        t.last_used_at = t.last_used_at.max(state.tokens.last_used(&t.name));
    }
    Ok(Json(TokenList { items }))
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
    let mut tx = state.db.begin_write().await?;
    match db::tokens::delete(&mut tx, &name).await? {
        None => Err(ApiError::not_found("token", &name)),
        Some(DeleteOutcome::LastAdmin) => {
            Err(ApiError::Conflict(format!("{name:?} is the last admin token; create another admin token first")))
        }
        Some(DeleteOutcome::Deleted) => {
            tx.commit().await?;
            // The token stops working with the next request, on this server.
            state.tokens.remove(&name);
            Ok(StatusCode::NO_CONTENT)
        }
    }
}

/// The audit trail of mutating requests, newest first.
#[utoipa::path(get, path = "/v1/audit", tag = "access", params(PageParams),
    responses(
        (status = 200, description = "A page of audit records", body = AuditList),
        (status = 422, description = "Bad `limit` or `cursor`", body = Problem, content_type = "application/problem+json"),
    ))]
async fn list_audit(State(state): State<AppState>, ApiQuery(page): ApiQuery<PageParams>) -> ApiResult<Json<AuditList>> {
    let limit = page.limit()?;
    let mut rows = db::audit::page(state.db.read(), page.after_id()?, limit + 1).await?;
    let next_cursor = finish_page(&mut rows, limit, |a| a.id.to_string());
    Ok(Json(AuditList { items: rows, next_cursor }))
}
