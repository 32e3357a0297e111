//! `GET /metrics`: Prometheus text format, or OpenMetrics (with the
//! duration histograms' exemplars) when the scraper asks for it. Counters
//! and histograms come from what the server recorded; gauges are read from
//! the store at scrape time.

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::error::{ApiError, ApiResult};
use crate::http::extract::Scope;
use crate::metrics::{Format, ScrapeGauges};
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(metrics))
}

/// Metrics for Prometheus (needs a viewer grant on `*`, every namespace; Prometheus sends it with
/// `authorization: {credentials: ...}` in its scrape config). With `Accept:
/// application/openmetrics-text` the answer is OpenMetrics text, whose duration histograms carry
/// exemplars: the trace id of a sampled request or pass in each bucket.
#[utoipa::path(get, path = "/metrics", tag = "health",
    responses((status = 200, description = "Prometheus text exposition format (or OpenMetrics, when asked)",
        content(
            (String = "text/plain"),
            (String = "application/openmetrics-text"),
        ))))]
async fn metrics(State(state): State<AppState>, scope: Scope, headers: HeaderMap) -> ApiResult<Response> {
    // Every namespace's pools are in the answer: a grant on one namespace
    // does not show the others'.
    if scope.access.caller().is_some() && scope.access.global_role().is_none() {
        return Err(ApiError::Forbidden { need: "viewer (on every namespace, `*`)" });
    }
    let format = Format::negotiate(headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()));
    let mut out = String::new();
    let rendered = |r: std::fmt::Result| r.map_err(|e| ApiError::Internal(anyhow::anyhow!("rendering metrics: {e}")));
    rendered(state.metrics.render(&mut out, format))?;
    rendered(state.db.gauges().await?.render(&mut out, format))?;
    rendered(engine_gauges(&state.engines.set).render(&mut out, format))?;
    if let Some(leases) = &state.reconcile.leases {
        rendered(crate::replicas::gauges(&state.db, leases).await?.render(&mut out, format))?;
    }
    rendered(format.finish(&mut out))?;
    let mut res = out.into_response();
    res.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(format.content_type()));
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
