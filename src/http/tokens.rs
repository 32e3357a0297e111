//! `/v1/tokens` and `/v1/audit`: token management and the audit trail
//! (admins: a namespace's, of its tokens and records; `*`'s, of all).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::db::{audit::AuditRecord, tokens::TokenInfo};
use crate::domain::grant::{Grant, Grants};
use crate::domain::object::Namespace;
use crate::error::{ApiError, ApiResult, Problem};
use crate::http::extract::{ApiJson, ApiQuery, Scope};
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

/// A token to create: its name and its grants, or (as before grants) one
/// role, which means that role on `*`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    /// Unique, a DNS-1123 label: what the audit trail will name.
    #[schema(example = "ci-pipeline")]
    pub name: crate::domain::names::DnsLabel,
    /// The token's grants: a role in a namespace, or on `*`. Each must be
    /// one the caller holds and is an admin of. Give this or `role`.
    #[serde(default)]
    #[schema(min_items = 1, max_items = 64)]
    pub grants: Option<Vec<Grant>>,
    /// Shorthand for `grants: [{"namespace": "*", "role": ROLE}]`: a `*`
    /// admin's to give.
    #[serde(default)]
    pub role: Option<Role>,
}

impl CreateToken {
    fn grants(&self) -> Result<Grants, ApiError> {
        match (&self.grants, self.role) {
            (Some(grants), None) => Ok(Grants(grants.clone())),
            (None, Some(role)) => Ok(Grants::everywhere(role)),
            (Some(_), Some(_)) => Err(ApiError::invalid(
                "role",
                "one_of",
                "give `grants` or `role` (which means that role on `*`), not both",
            )),
            (None, None) => Err(ApiError::invalid(
                "grants",
                "required",
                "missing field `grants` (e.g. [{\"namespace\": \"team-a\", \"role\": \"operator\"}])",
            )),
        }
    }
}

/// A token as listed: never its secret.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TokenView {
    pub name: String,
    /// The namespace whose admins manage the token (all its grants are
    /// there); `null`: a global token, a `*` admin's.
    pub namespace: Option<Namespace>,
    pub grants: Vec<Grant>,
    /// The token's role on `*`, if it has one (what `role` meant before
    /// grants).
    pub role: Option<Role>,
    pub created_at: DateTime<Utc>,
    pub last_used_at: Option<DateTime<Utc>>,
}

impl From<TokenInfo> for TokenView {
    fn from(t: TokenInfo) -> Self {
        Self {
            role: t.grants.global_role(),
            name: t.name,
            namespace: t.namespace,
            grants: t.grants.0,
            created_at: t.created_at,
            last_used_at: t.last_used_at,
        }
    }
}

/// A token just created, with its secret.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct NewToken {
    #[serde(flatten)]
    pub info: TokenView,
    /// The secret. It is shown this once and stored only as a hash.
    pub token: String,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TokenList {
    pub items: Vec<TokenView>,
}

/// `GET /v1/audit`'s filter.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AuditParams {
    /// Only the records of this namespace (its admins may read them);
    /// absent or `*`: the whole trail, a `*` admin's.
    #[param(pattern = r"^(\*|[a-z0-9]([-a-z0-9]*[a-z0-9])?)$", max_length = 63)]
    pub namespace: Option<String>,
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
            TokenError::Denied(denied) => denied.into(),
            TokenError::Store(e) => ApiError::Database(e),
        }
    }
}

/// Create a token; the response is the only time the secret is shown.
///
/// A token holds grants (a role in a namespace, or on `*`). A caller gives
/// only grants it holds, in namespaces it is an admin of: a namespace's
/// admin makes tokens of that namespace, a `*` admin any. A grant in a
/// namespace the caller cannot see answers 404, like a missing one.
///
/// `Idempotency-Key` is refused here (422): replaying this answer would
/// mean keeping the secret. Retry without the key; if the first request
/// got through, the retry answers 409 and the token can be revoked.
#[utoipa::path(post, path = "/v1/tokens", tag = "access",
    request_body(content = CreateToken, content_type = "application/json"),
    responses(
        (status = 201, description = "Created; keep the token, it is not shown again", body = NewToken),
        (status = 400, description = "Body is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A grant is above what the caller holds, or on `*` from a namespace's admin", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "A grant names a namespace the caller cannot see", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A token of that name exists", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Body is not declared as JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Bad name or grants (or both `grants` and `role`), or an `Idempotency-Key` was sent", body = Problem, content_type = "application/problem+json"),
    ))]
#[tracing::instrument(skip_all, fields(token = %req.name))]
async fn create_token(
    State(state): State<AppState>,
    scope: Scope,
    ApiJson(req): ApiJson<CreateToken>,
) -> ApiResult<Response> {
    let grants = req.grants()?;
    let created = state.token_service.create(&scope.access, &req.name, grants).await?;
    let body = NewToken { info: created.info.into(), token: created.secret };
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// List the tokens the caller manages (names and grants; never the
/// secrets): every token for a `*` admin, else those of the namespaces it
/// is an admin of.
#[utoipa::path(get, path = "/v1/tokens", tag = "access",
    responses((status = 200, description = "The tokens the caller manages", body = TokenList)))]
async fn list_tokens(State(state): State<AppState>, scope: Scope) -> ApiResult<Json<TokenList>> {
    let items = state.token_service.list(&scope.access).await?;
    Ok(Json(TokenList { items: items.into_iter().map(TokenView::from).collect() }))
}

/// Revoke a token the caller manages. The last token with the admin role
/// on `*` cannot be revoked.
#[utoipa::path(delete, path = "/v1/tokens/{name}", tag = "access",
    params(("name" = String, Path, description = "Token name")),
    responses(
        (status = 204, description = "Revoked"),
        (status = 403, description = "The caller sees the token but does not manage it", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such token (or one of a namespace the caller cannot see)", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "It is the last admin token on `*`", body = Problem, content_type = "application/problem+json"),
    ))]
#[tracing::instrument(skip(state, scope))]
async fn delete_token(State(state): State<AppState>, scope: Scope, Path(name): Path<String>) -> ApiResult<StatusCode> {
    state.token_service.delete(&scope.access, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The audit trail, newest first: every mutating request and every
/// refusal, with caller, action, namespace and object. A namespace's
/// admin reads its namespace's records (`namespace=team-a`); the whole
/// trail is a `*` admin's.
#[utoipa::path(get, path = "/v1/audit", tag = "access", params(AuditParams, PageParams),
    responses(
        (status = 200, description = "A page of audit records", body = AuditList),
        (status = 403, description = "The caller is not an admin of the namespace (or of `*`)", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "A namespace the caller cannot see", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Bad `limit`, `cursor` or `namespace`", body = Problem, content_type = "application/problem+json"),
    ))]
async fn list_audit(
    State(state): State<AppState>,
    scope: Scope,
    ApiQuery(params): ApiQuery<AuditParams>,
    ApiQuery(page): ApiQuery<PageParams>,
) -> ApiResult<Json<AuditList>> {
    let namespace = match params.namespace.as_deref() {
        None | Some("*") => None,
        Some(_) => Some(scope.access.namespace.clone()),
    };
    let page = state.token_service.audit(&scope.access, namespace.as_ref(), &page.request_by_id()?).await?;
    Ok(Json(AuditList { items: page.items, next_cursor: page.next_cursor }))
}
