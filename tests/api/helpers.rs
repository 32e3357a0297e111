//! `spawn_app`: a real drover server on 127.0.0.1:0 with a fresh store,
//! and a client with one method per endpoint.
//!
//! The store is a SQLite file in the server's data directory, or, when the
//! run selects PostgreSQL (`DROVER_TEST_DATABASE=postgres`, see
//! `tests/support/postgres.rs`), a fresh database on the test server. A
//! test about SQLite itself (its files, its locking) says so with
//! [`sqlite_config`] and keeps SQLite either way.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use drover::app::Application;
use drover::config::{RuntimeKind, ServeConfig};
use drover::db::Location;
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
    /// Where the server keeps its data; a restart reopens it.
    pub store: Location,
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

/// Settings that keep the store in SQLite whichever store the run selected:
/// for tests of SQLite itself (its files, its locks, its recovery).
pub fn sqlite_config(data_dir: &Path, runtime: RuntimeKind) -> ServeConfig {
    let mut cfg = config(data_dir, runtime);
    cfg.database_url = Some(Location::Sqlite(data_dir.join("drover.db")));
    cfg
}

/// The store of the data directory `data_dir` (what a server started on it
/// uses), opened by the test itself.
pub async fn test_store(data_dir: &Path) -> drover::db::Db {
    let location =
        crate::postgres::store_for_data_dir(data_dir).unwrap_or_else(|| Location::Sqlite(data_dir.join("drover.db")));
    drover::db::connect(&location).await.expect("opening the test store")
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

/// A server with explicit settings; without a `database_url`, on the
/// store the run selected.
pub async fn start(mut cfg: ServeConfig, tmp: Option<TempDir>) -> TestApp {
    if cfg.database_url.is_none() {
        cfg.database_url = crate::postgres::store_for_data_dir(&cfg.data_dir);
    }
    let store = cfg.database();
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
    TestApp { addr, client, admin_token, data_dir, store, state, _tmp: tmp, stop: Some(stop), handle: Some(handle) }
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

    /// Stops and starts again on the same store.
    pub async fn restart(mut self, runtime: RuntimeKind) -> TestApp {
        self.stop().await;
        let tmp = self._tmp.take();
        start(config(&self.data_dir, runtime), tmp).await
    }

    /// Stops and starts again with `cfg`.
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

    /// This server's metrics in Prometheus text, read in-process: it needs
    /// no connection, so it works while a test holds every slot.
    pub fn metrics_text(&self) -> String {
        let mut out = String::new();
        self.state
            .metrics
            .render(&mut out, drover::metrics::Format::Prometheus)
            .expect("rendering the metrics into a String");
        out
    }

    /// Reconcile passes this server has finished, whatever their outcome.
    pub fn passes_finished(&self) -> f64 {
        metric(&self.metrics_text(), "drover_reconcile_passes_total")
    }

    /// Waits until a reconcile pass that began after this call has
    /// finished: two more passes than now, since one may have been under
    /// way (a pool's passes never overlap). It counts every pool's passes,
    /// so it is for servers with one pool; `what` says what that pass proves.
    pub async fn wait_pass_after_now(&self, limit: Duration, what: &str) {
        let now = self.passes_finished();
        wait_for(limit, what, async || self.passes_finished() >= now + 2.0).await;
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
    /// Stops the server and, on a multi-threaded runtime (every Docker
    /// test's), waits until it has stopped, passes in flight included: so
    /// that no container it creates outlives the test's `Cleanup`, which is
    /// declared before the app and so dropped after it. A current-thread
    /// runtime cannot block here; its tests use no engine.
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let Some(handle) = self.handle.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        if runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread {
            let stopped =
                tokio::task::block_in_place(|| runtime.block_on(tokio::time::timeout(Duration::from_secs(40), handle)));
            if stopped.is_err() && !std::thread::panicking() {
                panic!("server did not stop within 40 s: a background task ignores cancellation");
            }
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

/// Polls `found` every 50 ms until it finds something, and answers it;
/// fails naming `what` after `limit`.
pub async fn wait_some<T>(limit: Duration, what: &str, mut found: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(value) = found().await {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out after {limit:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The sum of the samples whose line starts with `prefix` (a family's
/// name, with some of its labels if need be); 0 when there is none.
pub fn metric(text: &str, prefix: &str) -> f64 {
    text.lines().filter(|l| l.starts_with(prefix)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
}

/// Checks `check` every 200 ms for all of `window`, failing at the first
/// poll where it fails. An observation, not a wait: for a property that is
/// a rate or an absence over time, which no later event can show (say why
/// at the call).
pub async fn hold_for(window: Duration, what: &str, mut check: impl AsyncFnMut() -> Result<(), String>) {
    let started = tokio::time::Instant::now();
    loop {
        if let Err(broken) = check().await {
            panic!("{what}: {broken} (after {:?} of {window:?})", started.elapsed());
        }
        if started.elapsed() >= window {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A connection of a test's own to a server's store, for looking or
/// reaching behind the API. Statements are written once for both stores:
/// `$1`-style parameters, `true`/`false` flags.
pub enum RawStore {
    Sqlite(sqlx::SqliteConnection),
    Postgres(sqlx::PgConnection),
}

/// A value bound to a [`RawStore`] statement.
pub enum Param {
    Time(chrono::DateTime<chrono::Utc>),
    Text(String),
}

macro_rules! on_raw {
    ($store:expr, $make:path, $sql:expr, $params:expr, |$q:ident, $c:ident| $body:expr) => {{
        let sql: String = $sql;
        match $store {
            RawStore::Sqlite($c) => {
                let mut $q = $make(sqlx::AssertSqlSafe(sql));
                for p in $params {
                    $q = match p {
                        Param::Time(t) => $q.bind(*t),
                        Param::Text(s) => $q.bind(s.clone()),
                    };
                }
                $body
            }
            RawStore::Postgres($c) => {
                let mut $q = $make(sqlx::AssertSqlSafe(sql));
                for p in $params {
                    $q = match p {
                        Param::Time(t) => $q.bind(*t),
                        Param::Text(s) => $q.bind(s.clone()),
                    };
                }
                $body
            }
        }
    }};
}

impl RawStore {
    /// Runs `sql`; the rows it changed.
    pub async fn execute(&mut self, sql: &str, params: &[Param]) -> u64 {
        on_raw!(self, sqlx::query, sql.to_owned(), params, |q, c| q.execute(&mut *c).await.map(|d| d.rows_affected()))
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// The integers `sql` selects (one column), as `i64` whatever their
    /// type in the store.
    pub async fn integers(&mut self, sql: &str) -> Vec<i64> {
        let rows = match self {
            // SQLite's integers are 64-bit already.
            RawStore::Sqlite(c) => sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned())).fetch_all(c).await,
            RawStore::Postgres(c) => {
                let wrapped = format!("select cast(v as bigint) from ({sql}) as q(v)");
                sqlx::query_scalar(sqlx::AssertSqlSafe(wrapped)).fetch_all(c).await
            }
        };
        rows.unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// The one integer `sql` selects.
    pub async fn integer(&mut self, sql: &str) -> i64 {
        let all = self.integers(sql).await;
        assert_eq!(all.len(), 1, "{sql}: expected one row, got {all:?}");
        all[0]
    }
}

impl TestApp {
    /// A connection of the test's own to this server's store.
    pub async fn raw_store(&self) -> RawStore {
        RawStore::open(&self.store).await
    }
}

/// A connection to the store of data directory `data_dir` (a server's that
/// is not running, or a process's).
pub async fn test_raw_store(data_dir: &Path) -> RawStore {
    let location =
        crate::postgres::store_for_data_dir(data_dir).unwrap_or_else(|| Location::Sqlite(data_dir.join("drover.db")));
    RawStore::open(&location).await
}

impl RawStore {
    pub async fn open(location: &Location) -> RawStore {
        use sqlx::Connection;
        match location {
            Location::Sqlite(path) => RawStore::Sqlite(
                sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
                    .await
                    .expect("opening the store"),
            ),
            Location::Postgres(url) => {
                RawStore::Postgres(sqlx::PgConnection::connect(url).await.expect("connecting to the store"))
            }
        }
    }
}

/// The store holds each of `secrets` only as its SHA-256: the hash is
/// there, the secret is nowhere (for SQLite, in no byte of the file).
pub async fn assert_only_hashes_stored(app: &TestApp, secrets: &[&str]) {
    use sha2::Digest;
    let mut db = app.raw_store().await;
    for secret in secrets {
        let hash: String = sha2::Sha256::digest(secret.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
        let sql = format!("select count(*) from tokens where hash = '{hash}'");
        assert_eq!(db.integer(&sql).await, 1, "the token's hash is stored");
        let sql = format!("select count(*) from tokens where hash = '{secret}' or name = '{secret}'");
        assert_eq!(db.integer(&sql).await, 0, "the secret itself is not");
    }
    if let Location::Sqlite(path) = &app.store {
        let bytes = std::fs::read(path).expect("reading the database file");
        let text = String::from_utf8_lossy(&bytes);
        assert!(secrets.iter().all(|s| !text.contains(s)), "no secret appears in the database file");
    }
}
