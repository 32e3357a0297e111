//! CORS for web frontends on other origins: preflights answered per the
//! Fetch standard with the methods and headers drover uses, the headers a
//! page may read, nothing for origins not listed (nor when none is), and a
//! real browser on another origin calling the API and reading an event
//! stream, while a page of an origin not listed is refused.

use anyhow::ensure;
use drover::config::RuntimeKind;
use reqwest::{Method, StatusCode};
use serde_json::json;
use tempfile::TempDir;

use crate::helpers::{TestApp, config, spawn_app, start};
use crate::ui::{Browser, SCENARIO_LIMIT, Session};

const ORIGIN: &str = "https://app.example.com";

async fn app_allowing(origins: &[&str]) -> TestApp {
    let tmp = TempDir::new().expect("data dir");
    let mut cfg = config(tmp.path(), RuntimeKind::Simulated);
    cfg.cors_allowed_origins = origins.iter().map(|o| o.to_string()).collect();
    start(cfg, Some(tmp)).await
}

fn header_list(res: &reqwest::Response, name: &str) -> Vec<String> {
    res.headers()
        .get_all(name)
        .iter()
        .flat_map(|v| v.to_str().unwrap_or_default().split(',').map(|s| s.trim().to_ascii_lowercase()))
        .collect()
}

#[tokio::test]
async fn a_preflight_from_an_allowed_origin_names_the_methods_and_headers_drover_reads() {
    let app = app_allowing(&[ORIGIN]).await;
    let anonymous = reqwest::Client::new();
    let res = anonymous
        .request(Method::OPTIONS, app.url("/v1/pools/web/scale"))
        .header("origin", ORIGIN)
        .header("access-control-request-method", "PUT")
        .header("access-control-request-headers", "authorization,content-type,if-match,idempotency-key,last-event-id")
        .send()
        .await
        .expect("preflight");
    assert!(res.status().is_success(), "a preflight needs no token: {}", res.status());
    assert_eq!(res.headers()["access-control-allow-origin"], ORIGIN);
    let methods = header_list(&res, "access-control-allow-methods");
    for m in ["get", "post", "put", "patch", "delete"] {
        assert!(methods.contains(&m.to_owned()), "{m} in {methods:?}");
    }
    let headers = header_list(&res, "access-control-allow-headers");
    for h in ["authorization", "content-type", "if-match", "idempotency-key", "last-event-id"] {
        assert!(headers.contains(&h.to_owned()), "{h} in {headers:?}");
    }
    assert_eq!(res.headers()["access-control-max-age"], "600");
    assert!(!res.headers().contains_key("access-control-allow-credentials"), "tokens travel in a header, not cookies");
    assert!(header_list(&res, "vary").iter().any(|v| v == "origin"), "caches must keep answers per origin");
}

#[tokio::test]
async fn answers_to_an_allowed_origin_expose_the_headers_a_page_needs_and_others_get_none() {
    let app = app_allowing(&[ORIGIN, "http://127.0.0.1:9"]).await;
    app.create_pool_ok("web", 1, json!({"image": "sim/app:1"})).await;
    let res = app.client.get(app.url("/v1/pools/web")).header("origin", ORIGIN).send().await.expect("GET");
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["access-control-allow-origin"], ORIGIN);
    let exposed = header_list(&res, "access-control-expose-headers");
    for h in ["etag", "location", "retry-after", "x-request-id"] {
        assert!(exposed.contains(&h.to_owned()), "{h} in {exposed:?}");
    }
    // Refusals carry the headers too, so that a page can read the problem.
    let res = reqwest::Client::new().get(app.url("/v1/pools")).header("origin", ORIGIN).send().await.expect("GET");
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(res.headers()["access-control-allow-origin"], ORIGIN);
    // An origin not listed: no CORS header, so the browser keeps the answer from the page.
    for origin in ["https://evil.example.com", "https://app.example.com.evil.net", "null"] {
        let res = app.client.get(app.url("/v1/pools")).header("origin", origin).send().await.expect("GET");
        assert!(!res.headers().contains_key("access-control-allow-origin"), "{origin} was allowed");
        let res = app
            .client
            .request(Method::OPTIONS, app.url("/v1/pools"))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .send()
            .await
            .expect("preflight");
        assert!(!res.headers().contains_key("access-control-allow-origin"), "{origin}'s preflight was allowed");
    }
}

#[tokio::test]
async fn without_allowed_origins_no_cors_header_is_ever_sent() {
    let app = spawn_app().await;
    let res = app.client.get(app.url("/v1/pools")).header("origin", ORIGIN).send().await.expect("GET");
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.headers().keys().all(|k| !k.as_str().starts_with("access-control-")), "{:?}", res.headers());
}

/// A page server on its own port of 127.0.0.1: another origin than drover's.
async fn page_server() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binding the page server");
    let origin = format!("http://{}", listener.local_addr().expect("address"));
    let page = axum::Router::new().route(
        "/",
        axum::routing::get(|| async { axum::response::Html("<!doctype html><title>frontend</title><p>frontend</p>") }),
    );
    tokio::spawn(async move { axum::serve(listener, page).await });
    origin
}

#[tokio::test]
#[cfg_attr(skip_browser_tests, ignore = "DROVER_SKIP_BROWSER_TESTS is set")]
async fn a_page_on_an_allowed_origin_calls_the_api_and_reads_an_event_stream_and_another_is_refused() {
    let browser = Browser::start().await;
    let (allowed, refused) = (page_server().await, page_server().await);
    let app = app_allowing(&[&allowed]).await;
    app.create_pool_ok("web", 1, json!({"image": "sim/app:1"})).await;
    let outcome =
        tokio::time::timeout(SCENARIO_LIMIT, cross_origin_scenario(&browser.session, &app, &allowed, &refused)).await;
    browser.finish(outcome, "cors-screenshot.png").await;
    let pool = app.pool("web").await;
    assert_eq!(pool["replicas"], 2, "the page's PUT with If-Match scaled the pool");
}

/// The page's script: read the pool (and its ETag), scale it with
/// If-Match, then read the pool's event stream until its first `status`.
const CALLS: &str = "const done = arguments[arguments.length - 1];
const [api, token] = [arguments[0], arguments[1]];
(async () => {
  const auth = { Authorization: 'Bearer ' + token };
  const got = await fetch(api + '/v1/pools/web', { headers: auth });
  const etag = got.headers.get('etag');
  const requestId = got.headers.get('x-request-id');
  const pool = await got.json();
  const scaled = await fetch(api + '/v1/pools/web/scale', { method: 'PUT',
    headers: { ...auth, 'Content-Type': 'application/json', 'If-Match': etag },
    body: JSON.stringify({ replicas: 2 }) });
  const stop = new AbortController();
  const stream = await fetch(api + '/v1/pools/web/stream', { headers: auth, signal: stop.signal });
  const reader = stream.body.getReader();
  const decoder = new TextDecoder();
  let text = '';
  while (!text.includes('event: status')) {
    const { value, done: end } = await reader.read();
    if (end) break;
    text += decoder.decode(value, { stream: true });
  }
  stop.abort();
  done({ status: got.status, etag, requestId, name: pool.name, scaled: scaled.status,
         stream: stream.status, type: stream.headers.get('content-type'), text: text.slice(0, 300) });
})().catch((e) => done({ error: String(e) }));";

async fn cross_origin_scenario(s: &Session, app: &TestApp, allowed: &str, refused: &str) -> anyhow::Result<()> {
    let args = json!([app.addr, app.admin_token]);
    s.navigate(allowed).await?;
    s.wait_until("the frontend page", "return document.title === 'frontend'").await?;
    let got = s.script_async_with(CALLS, args.clone()).await?;
    ensure!(got.get("error").is_none(), "the page's calls failed: {got}");
    ensure!(got["status"] == 200 && got["name"] == "web", "GET pool through CORS: {got}");
    ensure!(got["etag"].as_str().is_some_and(|e| !e.is_empty()), "the page reads the ETag: {got}");
    ensure!(got["requestId"].as_str().is_some_and(|e| !e.is_empty()), "the page reads the request id: {got}");
    ensure!(got["scaled"] == 200, "PUT with If-Match through CORS: {got}");
    ensure!(got["stream"] == 200 && got["type"] == "text/event-stream", "the event stream: {got}");
    ensure!(got["text"].as_str().is_some_and(|t| t.contains("event: status")), "a status message: {got}");
    // The same calls from an origin not listed fail in the browser.
    s.navigate(refused).await?;
    s.wait_until("the other frontend page", "return document.title === 'frontend'").await?;
    let got = s.script_async_with(CALLS, args).await?;
    ensure!(
        got["error"].as_str().is_some_and(|e| e.contains("Failed to fetch")),
        "a page of an origin not listed reached the API: {got}"
    );
    Ok(())
}

/// The dashboard's files served by a page server of its own (another
/// origin), with `<meta name="drover-api">` pointing at `api`.
async fn dashboard_elsewhere(api: &str) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binding the page server");
    let origin = format!("http://{}", listener.local_addr().expect("address"));
    let mut page = axum::Router::new();
    for (url, content_type, file) in crate::ui::dashboard_files() {
        let mut text = std::fs::read_to_string(&file).expect("a dashboard file");
        if url == "/ui" {
            let meta = format!("<meta charset=\"utf-8\">\n  <meta name=\"drover-api\" content=\"{api}\">");
            text = text.replacen("<meta charset=\"utf-8\">", &meta, 1);
        }
        let answer = move || async move { ([(axum::http::header::CONTENT_TYPE, content_type)], text) };
        page = page.route(&url, axum::routing::get(answer));
    }
    tokio::spawn(async move { axum::serve(listener, page).await });
    origin
}

#[tokio::test]
#[cfg_attr(skip_browser_tests, ignore = "DROVER_SKIP_BROWSER_TESTS is set")]
async fn the_dashboard_served_from_another_origin_works_against_drover_over_https() {
    // Chromium trusts no test CA; the TLS itself is checked by tests/api/tls.rs.
    let browser = Browser::start_with(&["--ignore-certificate-errors"]).await;
    let ca = crate::pki::Ca::new("dashboard CA");
    // The page server's port is known only once it is bound; drover's is
    // chosen here so that the page can name it.
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("port").port();
    let origin = dashboard_elsewhere(&format!("https://127.0.0.1:{port}")).await;
    let (app, _, _files) = crate::tls::https_app_with(&ca, |cfg, _| {
        cfg.listen = format!("127.0.0.1:{port}").parse().expect("address");
        cfg.cors_allowed_origins = vec![origin.clone()];
    })
    .await;
    app.create_pool_ok("web", 1, json!({"image": "sim/app:1"})).await;
    let outcome = tokio::time::timeout(SCENARIO_LIMIT, dashboard_scenario(&browser.session, &app, &origin)).await;
    browser.finish(outcome, "cors-dashboard-screenshot.png").await;
}

async fn dashboard_scenario(s: &Session, app: &TestApp, origin: &str) -> anyhow::Result<()> {
    s.navigate(&format!("{origin}/ui")).await?;
    s.wait_until("the sign-in form", "return !document.getElementById('login').hidden").await?;
    s.type_into("#token", &app.admin_token).await?;
    s.click("#login-submit").await?;
    s.wait_until("the pool row", "return document.querySelector('[data-testid=pool-row][data-pool=web]') !== null")
        .await?;
    s.click("[data-testid=pool-row][data-pool=web] a").await?;
    let mode = s
        .wait_until(
            "the pool view following its event stream",
            "const m = document.getElementById('live-mode'); return !m.hidden && m.textContent.includes('stream') \
             && m.textContent",
        )
        .await?;
    ensure!(mode.as_str().is_some_and(|m| m.contains("Live (stream)")), "live mode: {mode}");
    Ok(())
}
