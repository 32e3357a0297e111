//! `GET /metrics`: Prometheus text format. Counters and histograms come
//! from what the server recorded; gauges are read from the store at scrape
//! time.

use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use utoipa_axum::{router::OpenApiRouter, routes};

use prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

use crate::error::{ApiError, ApiResult};
use crate::metrics::ScrapeGauges;
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(metrics))
}

/// Metrics for Prometheus (needs a viewer token; Prometheus sends it with
/// `authorization: {credentials: ...}` in its scrape config).
#[utoipa::path(get, path = "/metrics", tag = "health",
    responses((status = 200, description = "Prometheus text exposition format", body = String, content_type = "text/plain")))]
async fn metrics(State(state): State<AppState>) -> ApiResult<Response> {
    let mut out = String::new();
    let rendered = |r: std::fmt::Result| r.map_err(|e| ApiError::Internal(anyhow::anyhow!("rendering metrics: {e}")));
    rendered(state.metrics.render(&mut out))?;
    rendered(store_gauges(&state.db).await?.render(&mut out))?;
    rendered(engine_gauges(&state.engines).render(&mut out))?;
    let mut res = out.into_response();
    res.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
    Ok(res)
}

/// Each engine: does it answer, and how many machines it holds.
fn engine_gauges(engines: &crate::runtime::Engines) -> ScrapeGauges {
    let mut g = ScrapeGauges::default();
    let all = engines.all();
    let up: Vec<_> = all.iter().map(|e| (vec![e.name.clone()], f64::from(u8::from(e.reachable())))).collect();
    g.family("drover_engine_up", "1 when the engine answers, by engine", &["engine"], &up);
    let held: Vec<_> = all.iter().map(|e| (vec![e.name.clone()], e.container_count() as f64)).collect();
    g.family("drover_engine_machines", "Machines of any pool on each engine", &["engine"], &held);
    g
}

/// Gauges read from the store: they describe what exists now, so a pool's
/// series end with the pool.
async fn store_gauges(db: &crate::db::Db) -> ApiResult<ScrapeGauges> {
    let mut g = ScrapeGauges::default();
    let rows: Vec<(String, String, i64)> = sqlx::query_as(
        "select pool, case when ready then 'ready' else phase end, count(*) from machines group by 1, 2 order by 1, 2",
    )
    .fetch_all(db.read())
    .await?;
    let samples: Vec<_> = rows.into_iter().map(|(p, s, n)| (vec![p, s], n as f64)).collect();
    g.family(
        "drover_machines",
        "Machines, by pool and phase (`ready`, or the phase of those not ready)",
        &["pool", "phase"],
        &samples,
    );

    let rows: Vec<(String, i64, i64, i64)> = sqlx::query_as(
        "select name, coalesce(json_extract(spec, '$.replicas'), 0),
                coalesce(json_extract(status, '$.updated_replicas'), 0),
                coalesce(json_extract(status, '$.replicas'), 0) - coalesce(json_extract(status, '$.updated_replicas'), 0)
         from pools order by name",
    )
    .fetch_all(db.read())
    .await?;
    let per_pool = |f: fn(&(String, i64, i64, i64)) -> i64| -> Vec<_> {
        rows.iter().map(|r| (vec![r.0.clone()], f(r) as f64)).collect()
    };
    g.family("drover_pool_replicas_desired", "The replicas each pool asks for", &["pool"], &per_pool(|r| r.1));
    g.family(
        "drover_rollout_updated_machines",
        "Machines running the pool's desired image",
        &["pool"],
        &per_pool(|r| r.2),
    );
    g.family("drover_rollout_outdated_machines", "Machines still running another image", &["pool"], &per_pool(|r| r.3));

    let rows: Vec<(String, i64)> =
        sqlx::query_as("select state, count(*) from upgrade_jobs group by state order by state")
            .fetch_all(db.read())
            .await?;
    let samples: Vec<_> = rows.into_iter().map(|(s, n)| (vec![s], n as f64)).collect();
    g.family("drover_upgrade_jobs", "Upgrade jobs, by state", &["state"], &samples);

    let rows: Vec<(String, f64, i64)> = sqlx::query_as(
        "select name, sum((julianday(finished_at) - julianday(started_at)) * 86400.0), count(*)
         from upgrade_steps where finished_at is not null group by name order by name",
    )
    .fetch_all(db.read())
    .await?;
    let sums: Vec<_> = rows.iter().map(|(s, secs, _)| (vec![s.clone()], *secs)).collect();
    let counts: Vec<_> = rows.iter().map(|(s, _, n)| (vec![s.clone()], *n as f64)).collect();
    g.family(
        "drover_upgrade_step_duration_seconds_sum",
        "Total time of finished upgrade steps, by step",
        &["step"],
        &sums,
    );
    g.family("drover_upgrade_step_duration_seconds_count", "Finished upgrade steps, by step", &["step"], &counts);
    Ok(g)
}
