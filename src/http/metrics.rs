//! `GET /metrics`: Prometheus text format. Counters and histograms come
//! from what the server recorded; gauges are read from the store at scrape
//! time.

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::app::AppState;
use crate::error::ApiResult;
use crate::metrics::{gauge, pairs};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(metrics))
}

/// Counts and times every routed request by its route pattern (not its
/// path, which would make one series per pool).
pub async fn track(State(state): State<AppState>, matched: Option<MatchedPath>, req: Request, next: Next) -> Response {
    let started = std::time::Instant::now();
    let method = req.method().as_str().to_owned();
    let route = matched.as_ref().map_or("unmatched", |m| m.as_str()).to_owned();
    let res = next.run(req).await;
    let status = res.status().as_u16().to_string();
    state.metrics.inc("drover_http_requests_total", &[("method", &method), ("route", &route), ("status", &status)]);
    state.metrics.observe(
        "drover_http_request_duration_seconds",
        &[("method", &method), ("route", &route)],
        started.elapsed(),
    );
    res
}

/// Metrics for Prometheus (needs a viewer token; Prometheus sends it with
/// `authorization: {credentials: ...}` in its scrape config).
#[utoipa::path(get, path = "/metrics", tag = "health",
    responses((status = 200, description = "Prometheus text exposition format", body = String, content_type = "text/plain")))]
async fn metrics(State(state): State<AppState>) -> ApiResult<Response> {
    let mut out = String::new();
    state.metrics.render(&mut out);
    let db = &state.db;

    let rows: Vec<(String, String, i64)> = sqlx::query_as(
        "select pool, case when ready then 'ready' else state end, count(*) from machines group by 1, 2 order by 1, 2",
    )
    .fetch_all(db)
    .await?;
    let samples: Vec<_> = rows.iter().map(|(p, s, n)| (pairs(&[("pool", p), ("state", s)]), *n as f64)).collect();
    gauge(&mut out, "drover_machines", &samples);

    let rows: Vec<(String, i64, i64, i64)> = sqlx::query_as(
        "select name, coalesce(json_extract(spec, '$.replicas'), 0),
                coalesce(json_extract(status, '$.updated_replicas'), 0),
                coalesce(json_extract(status, '$.replicas'), 0) - coalesce(json_extract(status, '$.updated_replicas'), 0)
         from pools order by name",
    )
    .fetch_all(db)
    .await?;
    let per_pool = |f: fn(&(String, i64, i64, i64)) -> i64| -> Vec<_> {
        rows.iter().map(|r| (pairs(&[("pool", &r.0)]), f(r) as f64)).collect()
    };
    gauge(&mut out, "drover_pool_replicas_desired", &per_pool(|r| r.1));
    gauge(&mut out, "drover_rollout_updated_machines", &per_pool(|r| r.2));
    gauge(&mut out, "drover_rollout_outdated_machines", &per_pool(|r| r.3));

    let rows: Vec<(String, i64)> =
        sqlx::query_as("select state, count(*) from upgrade_jobs group by state order by state").fetch_all(db).await?;
    let samples: Vec<_> = rows.iter().map(|(s, n)| (pairs(&[("state", s)]), *n as f64)).collect();
    gauge(&mut out, "drover_upgrade_jobs", &samples);

    let rows: Vec<(String, f64, i64)> = sqlx::query_as(
        "select name, sum((julianday(finished_at) - julianday(started_at)) * 86400.0), count(*)
         from upgrade_steps where finished_at is not null group by name order by name",
    )
    .fetch_all(db)
    .await?;
    let sums: Vec<_> = rows.iter().map(|(s, secs, _)| (pairs(&[("step", s)]), *secs)).collect();
    let counts: Vec<_> = rows.iter().map(|(s, _, n)| (pairs(&[("step", s)]), *n as f64)).collect();
    gauge(&mut out, "drover_upgrade_step_duration_seconds_sum", &sums);
    gauge(&mut out, "drover_upgrade_step_duration_seconds_count", &counts);

    let mut res = out.into_response();
    res.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"));
    Ok(res)
}
