//! The one error type of the HTTP API and its RFC 9457 problem documents.
//!
//! Every variant is an HTTP status with a stable `type` URI that clients may
//! match on. Server-side failures are logged with their whole cause chain and
//! answered with a generic detail, so internals never leak to clients.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::domain::{FieldError, ValidationErrors};

pub const PROBLEM_JSON: &str = "application/problem+json";
const TYPE_BASE: &str = "https://drover.dev/problems/";

/// An RFC 9457 problem document: answered by the server, read by the CLI
/// (leniently: a proxy's error page or an older server may lack fields).
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
pub struct Problem {
    /// Stable URI naming the kind of problem; match on this, not on `title`.
    #[serde(rename = "type", default)]
    pub type_: String,
    /// Short summary of the kind of problem.
    #[serde(default)]
    pub title: String,
    /// The HTTP status code.
    #[serde(default)]
    pub status: u16,
    /// What went wrong in this occurrence, naming the field or resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Each broken rule, for validation problems.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldError>,
    /// The W3C trace id of the request (32 hex digits), when drover exports
    /// traces: paste it into a bug report, or look the trace up.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::telemetry::context::lenient_trace_id"
    )]
    #[schema(value_type = Option<String>, pattern = "^[0-9a-f]{32}$")]
    pub trace_id: Option<crate::telemetry::context::TraceId>,
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("invalid request: {0}")]
    Validation(ValidationErrors),
    #[error("malformed request: {0}")]
    Malformed(String),
    #[error("unsupported media type: {0}")]
    UnsupportedMediaType(String),
    #[error("request body too large")]
    PayloadTooLarge { limit: usize },
    #[error("{kind} {name:?} not found")]
    NotFound { kind: &'static str, name: String },
    #[error("no route for {0}")]
    NoRoute(String),
    #[error("method not allowed")]
    MethodNotAllowed,
    #[error("missing or unknown bearer token")]
    Unauthenticated,
    #[error("this needs the {need} role")]
    Forbidden { need: &'static str },
    /// A valid OIDC token that no rule of its issuer maps to a role.
    #[error("no access rule matches the token")]
    NoAccessRule,
    #[error("conflict: {0}")]
    Conflict(String),
    #[error("precondition failed: {0}")]
    PreconditionFailed(String),
    #[error("request timed out")]
    Timeout,
    #[error("service unavailable: {0}")]
    Unavailable(String),
    #[error("database error")]
    Database(#[from] sqlx::Error),
    #[error("internal error")]
    Internal(#[from] anyhow::Error),
}

impl From<ValidationErrors> for ApiError {
    fn from(errs: ValidationErrors) -> Self {
        Self::Validation(errs)
    }
}

impl ApiError {
    pub fn not_found(kind: &'static str, name: impl Into<String>) -> Self {
        Self::NotFound { kind, name: name.into() }
    }

    pub fn invalid(field: impl Into<String>, rule: &'static str, message: impl std::fmt::Display) -> Self {
        Self::Validation(ValidationErrors::single(field, rule, message))
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Self::Validation(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Self::Malformed(_) => StatusCode::BAD_REQUEST,
            Self::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::NotFound { .. } | Self::NoRoute(_) => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::Unauthenticated => StatusCode::UNAUTHORIZED,
            Self::Forbidden { .. } | Self::NoAccessRule => StatusCode::FORBIDDEN,
            Self::Conflict(_) => StatusCode::CONFLICT,
            Self::PreconditionFailed(_) => StatusCode::PRECONDITION_FAILED,
            Self::Timeout | Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Database(e) if store_unreachable(e) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Database(_) | Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// Worth a retry: answered 503 with `Retry-After`.
    fn transient(&self) -> bool {
        match self {
            Self::Timeout | Self::Unavailable(_) => true,
            Self::Database(e) => store_unreachable(e),
            _ => false,
        }
    }

    /// The stable slug of the problem `type`.
    fn slug(&self) -> &'static str {
        match self {
            Self::Validation(_) => "validation",
            Self::Malformed(_) => "malformed-request",
            Self::UnsupportedMediaType(_) => "unsupported-media-type",
            Self::PayloadTooLarge { .. } => "payload-too-large",
            Self::NotFound { .. } => "not-found",
            Self::NoRoute(_) => "no-route",
            Self::MethodNotAllowed => "method-not-allowed",
            Self::Unauthenticated => "unauthenticated",
            Self::Forbidden { .. } => "forbidden",
            Self::NoAccessRule => "no-access-rule",
            Self::Conflict(_) => "conflict",
            Self::PreconditionFailed(_) => "precondition-failed",
            Self::Timeout => "timeout",
            Self::Unavailable(_) => "unavailable",
            Self::Database(e) if store_unreachable(e) => "unavailable",
            Self::Database(_) | Self::Internal(_) => "internal",
        }
    }

    fn title(&self) -> &'static str {
        match self {
            Self::Validation(_) => "The request broke a validation rule",
            Self::Malformed(_) => "The request body is not valid JSON",
            Self::UnsupportedMediaType(_) => "Unsupported media type",
            Self::PayloadTooLarge { .. } => "The request body is too large",
            Self::NotFound { .. } => "Resource not found",
            Self::NoRoute(_) => "No such route",
            Self::MethodNotAllowed => "Method not allowed on this route",
            Self::Unauthenticated => "Authentication required",
            Self::Forbidden { .. } => "Not allowed for this token's role",
            Self::NoAccessRule => "No access rule matches this token",
            Self::Conflict(_) => "The request conflicts with the current state",
            Self::PreconditionFailed(_) => "Precondition failed",
            Self::Timeout => "The request took too long",
            Self::Unavailable(_) => "Service unavailable",
            Self::Database(e) if store_unreachable(e) => "Service unavailable",
            Self::Database(_) | Self::Internal(_) => "Internal server error",
        }
    }

    pub fn to_problem(&self) -> Problem {
        let detail = match self {
            Self::Validation(e) => Some(e.to_string()),
            Self::Malformed(d)
            | Self::UnsupportedMediaType(d)
            | Self::Conflict(d)
            | Self::PreconditionFailed(d)
            | Self::Unavailable(d) => Some(d.clone()),
            Self::PayloadTooLarge { limit } => Some(format!("the body must be at most {limit} bytes")),
            Self::NotFound { kind, name } => Some(format!("{kind} {name:?} does not exist")),
            Self::NoRoute(path) => Some(format!("{path} is not an endpoint of this API; see /openapi.json")),
            Self::MethodNotAllowed => None,
            Self::Unauthenticated => {
                Some("send Authorization: Bearer <token>: a token from POST /v1/tokens, or a JWT of a configured OIDC issuer".into())
            }
            Self::Forbidden { need } => Some(format!("this request needs the {need} role")),
            Self::NoAccessRule => Some(
                "the token is valid, but no rule of its issuer in drover's access config gives it a role".into(),
            ),
            Self::Timeout => Some("the server gave up on this request; it may be retried".into()),
            Self::Database(e) if store_unreachable(e) => {
                Some("the store (database) cannot be reached right now; retry shortly".into())
            }
            Self::Database(_) | Self::Internal(_) => Some("the error was logged; retry later or report it".into()),
        };
        let errors = match self {
            Self::Validation(e) => e.0.clone(),
            _ => Vec::new(),
        };
        Problem {
            type_: format!("{TYPE_BASE}{}", self.slug()),
            title: self.title().into(),
            status: self.status().as_u16(),
            detail,
            errors,
            trace_id: crate::telemetry::context::current_trace_id(),
        }
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.title, self.status)?;
        if let Some(detail) = &self.detail {
            write!(f, ": {detail}")?;
        }
        for e in &self.errors {
            write!(f, "\n  {}: {}", e.field, e.message)?;
        }
        Ok(())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            // The whole chain goes to the log; the client sees a generic detail.
            tracing::error!(error = %error_chain(&self), "request failed");
        }
        let body = serde_json::to_vec(&self.to_problem()).unwrap_or_default();
        let mut res = (status, body).into_response();
        res.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if self.transient() {
            res.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        res
    }
}

/// Whether a store error means the store cannot be reached (a PostgreSQL
/// server restarting or cut off), not that the request or drover is wrong.
pub fn store_unreachable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) | sqlx::Error::Tls(_) => true,
        // SQLSTATE class 08 (connection exception), 57P01-57P03 (the
        // server shutting down or starting), 25P03 (the server ended a
        // session left idle inside a transaction: the process stalled;
        // a retry runs on a fresh connection).
        sqlx::Error::Database(d) => {
            d.code().is_some_and(|c| c.starts_with("08") || matches!(c.as_ref(), "57P01" | "57P02" | "57P03" | "25P03"))
        }
        _ => false,
    }
}

/// `error: cause: cause ...`, for one log field.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        next = cause.source();
    }
    out
}

pub type ApiResult<T> = Result<T, ApiError>;
