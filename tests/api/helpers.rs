//! `spawn_app`: a real drover server on 127.0.0.1:0 with a fresh database
//! file, and a client with one method per endpoint.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use drover::app::Application;
use drover::config::{RuntimeKind, ServeConfig};
use reqwest::{Method, Response, StatusCode};
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub struct TestApp {
    pub addr: String,
    /// Sends the admin token on every request.
    pub client: reqwest::Client,
    pub admin_token: String,
    pub data_dir: PathBuf,
    /// The server's state: its engines, for tests that act on them.
    pub state: drover::state::AppState,
    /// Keeps the temporary data directory alive as long as the app.
    _tmp: Option<TempDir>,
    stop: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<anyhow::Result<()>>>,
}

pub fn config(data_dir: &Path, runtime: RuntimeKind) -> ServeConfig {
    let mut cfg = ServeConfig::for_data_dir(data_dir.to_path_buf());
    cfg.runtime = runtime;
    cfg.stop_timeout = Duration::from_secs(2);
    cfg.resync_interval = Duration::from_secs(5);
    cfg.max_backoff = Duration::from_secs(2);
    cfg
}

/// A server on the simulated runtime: for API tests that need no Docker.
pub async fn spawn_app() -> TestApp {
    let tmp = TempDir::new().expect("temporary directory");
    let cfg = config(tmp.path(), RuntimeKind::Simulated);
    start(cfg, Some(tmp)).await
}

/// A server on the real Docker engine, for the reconciler's tests.
pub async fn spawn_docker_app() -> TestApp {
    let tmp = TempDir::new().expect("temporary directory");
    let cfg = config(tmp.path(), RuntimeKind::Docker);
    start(cfg, Some(tmp)).await
}

/// A server with explicit settings.
pub async fn start(cfg: ServeConfig, tmp: Option<TempDir>) -> TestApp {
    let data_dir = cfg.data_dir.clone();
    let app = Application::build(cfg).await.expect("building the app");
    let addr = format!("http://{}", app.local_addr().expect("bound address"));
    let state = app.state().clone();
    let (stop, stopped) = oneshot::channel();
    let handle = tokio::spawn(app.run_until_stopped(async move {
        let _ = stopped.await;
    }));
    let admin_token = admin_token(&data_dir);
    let client = client_with_token(&admin_token);
    TestApp { addr, client, admin_token, data_dir, state, _tmp: tmp, stop: Some(stop), handle: Some(handle) }
}

/// The admin token drover wrote on first start.
pub fn admin_token(data_dir: &Path) -> String {
    let path = data_dir.join("admin.token");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display())).trim().to_owned()
}

/// A client that sends `token` on every request.
pub fn client_with_token(token: &str) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    let value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}")).expect("token is a valid header");
    headers.insert(reqwest::header::AUTHORIZATION, value);
    reqwest::Client::builder().default_headers(headers).build().expect("HTTP client")
}

impl TestApp {
    /// Graceful stop, as SIGTERM would do.
    pub async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(handle) = self.handle.take() {
            tokio::time::timeout(Duration::from_secs(40), handle)
                .await
                .expect("server did not stop within 40 s: a background task ignores cancellation")
                .expect("server task panicked")
                .expect("server returned an error");
        }
    }

    /// Stops and starts again on the same database file.
    pub async fn restart(mut self, runtime: RuntimeKind) -> TestApp {
        self.stop().await;
        let tmp = self._tmp.take();
        start(config(&self.data_dir, runtime), tmp).await
    }

    /// Stops and starts again on the same database file with `cfg`.
    pub async fn restart_with(mut self, cfg: ServeConfig) -> TestApp {
        self.stop().await;
        let tmp = self._tmp.take();
        start(cfg, tmp).await
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.addr)
    }

    pub async fn request(&self, method: Method, path: &str, body: Option<Value>) -> Response {
        let mut req = self.client.request(method, self.url(path));
        if let Some(b) = body {
            req = req.json(&b);
        }
        req.send().await.expect("request failed to send")
    }

    pub async fn get(&self, path: &str) -> Response {
        self.request(Method::GET, path, None).await
    }

    pub async fn create_pool(&self, body: Value) -> Response {
        self.request(Method::POST, "/v1/pools", Some(body)).await
    }

    pub async fn create_pool_ok(&self, name: &str, replicas: u32, extra: Value) -> Value {
        let mut body = json!({"name": name, "replicas": replicas, "version": "v1.29.2"});
        if let (Some(b), Value::Object(more)) = (body.as_object_mut(), extra) {
            b.extend(more);
        }
        let res = self.create_pool(body).await;
        assert_eq!(res.status(), StatusCode::CREATED, "create {name}: {}", res.text().await.unwrap_or_default());
        res.json().await.expect("pool JSON")
    }

    pub async fn get_pool(&self, name: &str) -> Response {
        self.get(&format!("/v1/pools/{name}")).await
    }

    pub async fn pool(&self, name: &str) -> Value {
        let res = self.get_pool(name).await;
        assert_eq!(res.status(), StatusCode::OK);
        res.json().await.expect("pool JSON")
    }

    pub async fn patch_pool(&self, name: &str, patch: Value, if_match: Option<&str>) -> Response {
        let mut req = self
            .client
            .patch(self.url(&format!("/v1/pools/{name}")))
            .header("content-type", "application/merge-patch+json")
            .body(patch.to_string());
        if let Some(tag) = if_match {
            req = req.header("if-match", tag);
        }
        req.send().await.expect("request failed to send")
    }

    pub async fn scale(&self, name: &str, replicas: i64) -> Response {
        self.request(Method::PUT, &format!("/v1/pools/{name}/scale"), Some(json!({ "replicas": replicas }))).await
    }

    pub async fn delete_pool(&self, name: &str) -> Response {
        self.request(Method::DELETE, &format!("/v1/pools/{name}"), None).await
    }

    pub async fn events(&self, name: &str) -> Vec<Value> {
        let res = self.get(&format!("/v1/pools/{name}/events?limit=500")).await;
        assert_eq!(res.status(), StatusCode::OK);
        let body: Value = res.json().await.expect("events JSON");
        body["items"].as_array().cloned().unwrap_or_default()
    }

    #[allow(dead_code)] // Used by the Docker-backed tests.
    /// The names of a pool's machine records.
    pub async fn machine_names(&self, name: &str) -> HashSet<String> {
        names(&self.machines(name).await)
    }

    pub async fn machines(&self, name: &str) -> Vec<Value> {
        let res = self.get(&format!("/v1/pools/{name}/machines?limit=500")).await;
        assert_eq!(res.status(), StatusCode::OK);
        let body: Value = res.json().await.expect("machines JSON");
        body["items"].as_array().cloned().unwrap_or_default()
    }

    /// Polls the pool until `done` holds or `timeout` passes; the message
    /// names what was awaited and the last state seen.
    pub async fn wait_pool(&self, name: &str, timeout: Duration, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let res = self.get_pool(name).await;
            let body: Value =
                if res.status() == StatusCode::OK { res.json().await.unwrap_or(Value::Null) } else { Value::Null };
            if done(&body) {
                return body;
            }
            if tokio::time::Instant::now() > deadline {
                panic!("timed out after {timeout:?} waiting for {what}; pool is now: {body:#}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the pool reports `replicas` machines, all ready and up to date.
    pub async fn wait_converged(&self, name: &str, replicas: u64, timeout: Duration) -> Value {
        self.wait_pool(name, timeout, &format!("{name} to converge on {replicas} ready machines"), |p| {
            let s = &p["status"];
            p["generation"] == s["observed_generation"]
                && s["terminating_replicas"].as_u64().unwrap_or(0) == 0
                && s["replicas"] == replicas
                && s["ready_replicas"] == replicas
                && s["updated_replicas"] == replicas
        })
        .await
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// The `name` of each item of a list answer.
pub fn names(items: &[Value]) -> HashSet<String> {
    items.iter().map(|m| m["name"].as_str().unwrap_or_default().to_owned()).collect()
}

/// Asserts a problem response: status, content type, and the field named.
pub async fn assert_problem(res: Response, status: u16, field: Option<&str>) -> Value {
    assert_eq!(res.status().as_u16(), status, "unexpected status");
    let ct = res.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    assert_eq!(ct, "application/problem+json", "problem responses carry the problem content type");
    let body: Value = res.json().await.expect("problem JSON");
    assert_eq!(body["status"], status);
    assert!(body["type"].as_str().is_some_and(|t| t.starts_with("https://drover.dev/problems/")), "{body}");
    if let Some(f) = field {
        let named = body["errors"].as_array().is_some_and(|errs| errs.iter().any(|e| e["field"] == f));
        assert!(named, "expected field {f:?} to be named in {body:#}");
        assert!(body["detail"].as_str().is_some_and(|d| d.contains(f)), "detail should name {f}: {body:#}");
    }
    body
}

/// A short random suffix, so that tests sharing one Docker engine never
/// share pool names.
#[allow(dead_code)] // Used by the Docker-backed tests.
pub fn unique(prefix: &str) -> String {
    use rand::RngExt;
    let suffix: String = (0..5).map(|_| char::from(b'a' + rand::rng().random_range(0..26u8))).collect();
    format!("{prefix}-{suffix}")
}

/// Polls `done` every 50 ms until it holds; `what` names it on timeout.
pub async fn wait_for(limit: Duration, what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !done().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out after {limit:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
