//! `GET /metrics`: Prometheus text format. Counters and histograms come
//! from what the server recorded; gauges are read from the store at scrape
//! time.

use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use utoipa_axum::{router::OpenApiRouter, routes};

use prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

use crate::error::{ApiError, ApiResult};
use crate::http::extract::Scope;
use crate::metrics::ScrapeGauges;
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(metrics))
}

/// Metrics for Prometheus (needs a viewer grant on `*`, every namespace; Prometheus sends it with
/// `authorization: {credentials: ...}` in its scrape config).
#[utoipa::path(get, path = "/metrics", tag = "health",
    responses((status = 200, description = "Prometheus text exposition format", body = String, content_type = "text/plain")))]
async fn metrics(State(state): State<AppState>, scope: Scope) -> ApiResult<Response> {
    // Every namespace's pools are in the answer: a grant on one namespace
    // does not show the others'.
    if scope.access.caller().is_some() && scope.access.global_role().is_none() {
        return Err(ApiError::Forbidden { need: "viewer (on every namespace, `*`)" });
    }
    let mut out = String::new();
    let rendered = |r: std::fmt::Result| r.map_err(|e| ApiError::Internal(anyhow::anyhow!("rendering metrics: {e}")));
    rendered(state.metrics.render(&mut out))?;
    rendered(state.db.gauges().await?.render(&mut out))?;
    rendered(engine_gauges(&state.engines.set).render(&mut out))?;
    if let Some(leases) = &state.reconcile.leases {
        rendered(crate::replicas::gauges(&state.db, leases).await?.render(&mut out))?;
    }
    let mut res = out.into_response();
    res.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
    Ok(res)
}

/// Each engine: does it answer, and how many machines it holds.
fn engine_gauges(engines: &crate::engines::EngineSet) -> ScrapeGauges {
    let mut g = ScrapeGauges::default();
    let all = engines.all();
    let up: Vec<_> = all.iter().map(|e| (vec![e.name.clone()], f64::from(u8::from(e.reachable())))).collect();
    g.family("drover_engine_up", "1 when the engine answers, by engine", &["engine"], &up);
    let held: Vec<_> = all.iter().map(|e| (vec![e.name.clone()], e.container_count() as f64)).collect();
    g.family("drover_engine_machines", "Machines of any pool on each engine", &["engine"], &held);
    g
}
