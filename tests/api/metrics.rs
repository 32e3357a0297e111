//! `/metrics` after real work: the counters move.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::spawn_app;

/// The value of the sample whose line starts with `prefix`, or 0.
fn sample(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn metrics_count_requests_passes_runtime_calls_and_machines_after_a_scale() {
    let app = spawn_app().await;
    let scrape = || async {
        let res = app.get("/metrics").await;
        assert_eq!(res.status(), StatusCode::OK);
        assert!(res.headers()["content-type"].to_str().unwrap().starts_with("text/plain"));
        res.text().await.unwrap()
    };
    let before = scrape().await;
    app.create_pool_ok("metered", 0, json!({"image": "sim/app:1"})).await;
    app.scale("metered", 3).await;
    app.wait_converged("metered", 3, Duration::from_secs(20)).await;
    let after = scrape().await;

    let scale = "drover_http_requests_total{method=\"PUT\",route=\"/v1/pools/{name}/scale\",status=\"200\"}";
    assert_eq!(sample(&before, scale), 0.0);
    assert_eq!(sample(&after, scale), 1.0, "{after}");
    assert!(
        sample(&after, "drover_runtime_calls_total{engine=\"local\",op=\"create\",result=\"ok\"}") >= 3.0,
        "{after}"
    );
    assert!(sample(&after, "drover_reconcile_passes_total{outcome=\"converged\"}") >= 1.0, "{after}");
    assert_eq!(
        sample(&after, "drover_machines{namespace=\"default\",pool=\"metered\",phase=\"ready\"}"),
        3.0,
        "{after}"
    );
    assert_eq!(sample(&after, "drover_pool_replicas_desired{namespace=\"default\",pool=\"metered\"}"), 3.0);
    assert!(after.contains("# TYPE drover_http_request_duration_seconds histogram"));
    assert!(after.contains("drover_reconcile_duration_seconds_count{outcome=\"converged\"}"), "{after}");
    assert_eq!(sample(&after, "drover_engine_up{engine=\"local\"}"), 1.0, "{after}");
    assert_eq!(sample(&after, "drover_engine_machines{engine=\"local\"}"), 3.0, "{after}");

    // Like every route but the probes, it needs a token.
    let anon = reqwest::Client::new().get(app.url("/metrics")).send().await.unwrap();
    assert_eq!(anon.status(), StatusCode::UNAUTHORIZED);
}

/// Metric labels come from closed sets (SECURITY.md): no series may grow
/// with every pool or outlive it, and a path is never a label.
#[tokio::test]
async fn no_series_names_a_pool_once_it_is_gone_and_paths_never_become_labels() {
    let app = spawn_app().await;
    app.create_pool_ok("short-lived", 2, json!({"image": "sim/app:1"})).await;
    app.wait_converged("short-lived", 2, Duration::from_secs(20)).await;
    app.get("/v1/pools/short-lived/machines").await;
    let during = app.get("/metrics").await.text().await.unwrap();
    assert!(during.contains("pool=\"short-lived\""), "the pool's gauges while it exists: {during}");
    assert_eq!(app.delete_pool("short-lived").await.status(), StatusCode::ACCEPTED);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while app.get_pool("short-lived").await.status() != StatusCode::NOT_FOUND {
        assert!(tokio::time::Instant::now() < deadline, "the pool was not deleted within 20 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = app.get("/metrics").await.text().await.unwrap();
    assert!(!after.contains("short-lived"), "a series outlived its pool: {after}");
    assert!(after.contains("route=\"/v1/pools/{name}/machines\""), "routes are patterns: {after}");
}
