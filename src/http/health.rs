//! Liveness and readiness probes; both are open to unauthenticated callers.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::state::AppState;

fn ok_schema() -> utoipa::openapi::Object {
    crate::http::openapi::string_enum(&["ok"], "Always `ok` when the process answers")
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// Always `ok` when the process answers.
    #[schema(schema_with = ok_schema)]
    pub status: &'static str,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Check {
    pub name: &'static str,
    pub ok: bool,
    /// Why the check failed, when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Readiness {
    pub ready: bool,
    pub checks: Vec<Check>,
}

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(healthz)).routes(routes!(readyz))
}

/// The process is up and serving HTTP.
#[utoipa::path(get, path = "/healthz", tag = "health", security(()),
    responses((status = 200, description = "Alive", body = Health)))]
async fn healthz() -> Json<Health> {
    Json(Health { status: "ok" })
}

/// Longest wait for the local engine's answer: a probe answers within a
/// second whatever its dependencies do.
const RUNTIME_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(800);

/// The database answers and the local container engine is reachable. The
/// database's health is its last probe's (one a second, in the
/// background), so that this answers at once even when the store does not.
#[utoipa::path(get, path = "/readyz", tag = "health", security(()),
    responses(
        (status = 200, description = "Ready to serve", body = Readiness),
        (status = 503, description = "A dependency is unreachable; `checks` says which and why", body = Readiness),
    ))]
#[tracing::instrument(skip_all)]
async fn readyz(State(state): State<AppState>) -> (StatusCode, Json<Readiness>) {
    let db = match state.store_health.check(tokio::time::Instant::now()) {
        Ok(()) => Check { name: "database", ok: true, detail: None },
        Err(why) => Check { name: "database", ok: false, detail: Some(why) },
    };
    let ping = match state.engines.set.local() {
        Some(local) => tokio::time::timeout(RUNTIME_TIMEOUT, local.ping()).await.unwrap_or_else(|_| {
            Err(crate::runtime::RuntimeError::Unavailable(format!("no answer within {RUNTIME_TIMEOUT:?}")))
        }),
        None => Err(crate::runtime::RuntimeError::Unavailable("no local engine".into())),
    };
    let runtime = match ping {
        Ok(()) => Check { name: "runtime", ok: true, detail: None },
        Err(e) => Check { name: "runtime", ok: false, detail: Some(crate::error::error_chain(&e)) },
    };
    let checks = vec![db, runtime];
    let ready = checks.iter().all(|c| c.ok);
    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(Readiness { ready, checks }))
}
