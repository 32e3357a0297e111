//! The client commands, end to end: the real `drover` binary against a live
//! server on 127.0.0.1 (simulated runtime, Kubernetes API simulator), or
//! against a small fake server where the test needs to see what was sent.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, put};
use serde_json::{Value, json};

use crate::helpers::{TestApp, spawn_app};
use crate::upgrade_env::{CLUSTER, SIM_TOKEN, TO, spawn_env};

/// Longest any one CLI run may take; `--wait` runs carry a shorter `--timeout`.
const RUN_LIMIT: Duration = Duration::from_secs(90);

pub(crate) struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("-o json printed something that is not JSON ({e}):\n{}", self.stdout))
    }

    pub fn ok(self) -> Run {
        assert_eq!(self.code, 0, "exit {}\nstdout: {}\nstderr: {}", self.code, self.stdout, self.stderr);
        self
    }
}

/// Runs `drover <args>` against `server`, with no token unless `token`.
pub(crate) async fn drover_at(server: &str, token: Option<&str>, args: &[&str]) -> Run {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_drover"));
    cmd.args(args).env("DROVER_SERVER", server).env_remove("DROVER_TOKEN").kill_on_drop(true);
    if let Some(t) = token {
        cmd.env("DROVER_TOKEN", t);
    }
    let out = tokio::time::timeout(RUN_LIMIT, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("drover {args:?} ran over {RUN_LIMIT:?}: a --wait ignores its --timeout"))
        .expect("running the drover binary");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs `drover <args>` against `app` with its admin token.
async fn drover(app: &TestApp, args: &[&str]) -> Run {
    drover_at(&app.addr, Some(&app.admin_token), args).await
}

#[tokio::test]
async fn pool_and_machine_commands_create_list_get_scale_set_image_and_delete() {
    let app = spawn_app().await;
    let created =
        drover(&app, &["pools", "create", "web", "--replicas", "2", "--version", "v1.29.2", "--wait", "-o", "json"])
            .await
            .ok()
            .json();
    assert_eq!((created["name"].as_str(), created["status"]["ready_replicas"].as_u64()), (Some("web"), Some(2)));

    let table = drover(&app, &["pools", "list"]).await.ok().stdout;
    assert!(table.starts_with("NAME") && table.contains("web"), "{table}");
    let list = drover(&app, &["pools", "list", "-o", "json", "--limit", "10"]).await.ok().json();
    assert_eq!(list["items"][0]["name"], "web");
    assert_eq!(drover(&app, &["pools", "get", "web", "-o", "json"]).await.ok().json()["replicas"], 2);
    assert!(drover(&app, &["pools", "get", "web"]).await.ok().stdout.contains("AllReady"));

    let scaled =
        drover(&app, &["-o", "json", "pools", "scale", "web", "4", "--wait", "--timeout", "30s"]).await.ok().json();
    assert_eq!(scaled["status"]["ready_replicas"], 4);
    let imaged = drover(&app, &["pools", "set-image", "web", "--image", "example/node:2", "--wait", "-o", "json"])
        .await
        .ok()
        .json();
    assert_eq!(
        (imaged["desired_image"].as_str(), imaged["status"]["updated_replicas"].as_u64()),
        (Some("example/node:2"), Some(4))
    );

    let machines = drover(&app, &["machines", "list", "web", "-o", "json"]).await.ok().json();
    let name = machines["items"][0]["name"].as_str().expect("a machine").to_owned();
    assert!(drover(&app, &["machines", "list", "web"]).await.ok().stdout.contains(&name));
    let removed = drover(&app, &["machines", "delete", "web", &name, "-o", "json"]).await.ok().json();
    assert_eq!(removed["name"], name.as_str());
    assert_eq!(app.pool("web").await["replicas"], 3, "deleting a machine lowers replicas");
    let versioned =
        drover(&app, &["pools", "set-image", "web", "--version", "v1.30.0", "-o", "json"]).await.ok().json();
    assert_eq!(versioned["desired_image"], "kindest/node:v1.30.0", "--version clears the custom image");

    let deleted = drover(&app, &["pools", "delete", "web", "-o", "json"]).await.ok().json();
    assert_eq!(deleted["phase"], "deleting");
}

#[tokio::test]
async fn the_namespace_flag_and_variable_pick_the_namespace_and_star_lists_every_one() {
    let app = spawn_app().await;
    drover(&app, &["namespaces", "create", "team-a", "--engine-selector", "zone=a"]).await.ok();
    drover(&app, &["-n", "team-a", "pools", "create", "web", "--replicas", "0", "--version", "v1.29.2"]).await.ok();
    drover(&app, &["pools", "create", "web", "--replicas", "0", "--version", "v1.29.2"]).await.ok();

    let listed = drover(&app, &["namespaces", "list"]).await.ok().stdout;
    assert!(listed.contains("team-a") && listed.contains("zone=a") && listed.contains("default"), "{listed}");
    let scaled = drover(&app, &["pools", "scale", "web", "2", "-n", "team-a", "-o", "json"]).await.ok().json();
    assert_eq!((scaled["namespace"].as_str(), scaled["replicas"].as_i64()), (Some("team-a"), Some(2)));
    assert_eq!(app.pool("web").await["replicas"], 0, "default's web is another pool");

    // DROVER_NAMESPACE, as a CI job sets it.
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_drover"));
    cmd.args(["pools", "get", "web", "-o", "json"])
        .env("DROVER_SERVER", &app.addr)
        .env("DROVER_TOKEN", &app.admin_token)
        .env("DROVER_NAMESPACE", "team-a")
        .kill_on_drop(true);
    let out = tokio::time::timeout(RUN_LIMIT, cmd.output()).await.expect("in time").expect("ran");
    let pool: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(pool["namespace"], "team-a", "{}", String::from_utf8_lossy(&out.stderr));

    let all = drover(&app, &["-n", "*", "pools", "list"]).await.ok().stdout;
    let header = all.lines().next().unwrap_or_default();
    assert!(header.starts_with("NAMESPACE") && header.contains("NAME"), "{all}");
    assert!(all.lines().any(|l| l.starts_with("team-a")) && all.lines().any(|l| l.starts_with("default")), "{all}");
    let one = drover(&app, &["pools", "list"]).await.ok().stdout;
    assert!(!one.contains("NAMESPACE"), "one namespace's list has no NAMESPACE column: {one}");

    let gone = drover(&app, &["-n", "nowhere", "pools", "list"]).await;
    assert_eq!(gone.code, 1, "{}", gone.stderr);
    assert!(gone.stderr.contains("nowhere"), "the missing namespace is named: {}", gone.stderr);
    let busy = drover(&app, &["namespaces", "delete", "team-a"]).await;
    assert_eq!(busy.code, 1);
    assert!(busy.stderr.contains("pool"), "what keeps it is said: {}", busy.stderr);
}

#[tokio::test]
async fn rollout_commands_pause_resume_roll_back_continue_and_report_status() {
    let app = spawn_app().await;
    drover(&app, &["pools", "create", "web", "--replicas", "2", "--version", "v1.29.2", "--wait"]).await.ok();
    let paused = drover(&app, &["rollout", "pause", "web", "-o", "json"]).await.ok().json();
    assert_eq!(paused["paused"], true);
    drover(&app, &["pools", "set-image", "web", "--image", "example/node:2"]).await.ok();
    let status = drover(&app, &["rollout", "status", "web", "-o", "json"]).await.ok().json();
    assert_eq!(status["state"], "paused", "{status:#}");
    assert!(drover(&app, &["rollout", "status", "web"]).await.ok().stdout.contains("paused"));
    let resumed =
        drover(&app, &["rollout", "resume", "web", "--wait", "--timeout", "30s", "-o", "json"]).await.ok().json();
    assert_eq!((resumed["paused"].as_bool(), resumed["status"]["updated_replicas"].as_u64()), (Some(false), Some(2)));
    let back =
        drover(&app, &["rollout", "rollback", "web", "--wait", "--timeout", "30s", "-o", "json"]).await.ok().json();
    assert_eq!(back["desired_image"], "kindest/node:v1.29.2", "{back:#}");

    // Batch approval: the rollout waits after each batch of one machine.
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(file.path(), json!({"strategy": {"batch_approval": true, "max_surge": 1}}).to_string()).unwrap();
    let path = file.path().to_str().expect("utf-8 path");
    drover(&app, &["pools", "create", "batched", "--version", "v1.29.2", "--replicas", "2", "-f", path, "--wait"])
        .await
        .ok();
    drover(&app, &["pools", "set-image", "batched", "--image", "example/node:2"]).await.ok();
    app.wait_pool("batched", Duration::from_secs(15), "the first batch to finish", |p| {
        p["status"]["updated_replicas"] == 1
    })
    .await;
    let done =
        drover(&app, &["rollout", "continue", "batched", "--wait", "--timeout", "30s", "-o", "json"]).await.ok().json();
    assert_eq!(done["status"]["updated_replicas"], 2, "{done:#}");
}

#[tokio::test]
async fn wait_exits_3_when_the_rollout_stalls() {
    let app = spawn_app().await;
    let started = Instant::now();
    let run = drover(
        &app,
        &[
            "pools",
            "create",
            "doomed",
            "--version",
            "v1.29.2",
            "--image",
            "example/crash:1",
            "--progress-deadline-seconds",
            "1",
            "--wait",
            "--timeout",
            "60s",
        ],
    )
    .await;
    assert_eq!(run.code, 3, "a stalled rollout must fail the wait\nstderr: {}", run.stderr);
    assert!(run.stderr.contains("stalled"), "{}", run.stderr);
    assert!(started.elapsed() < Duration::from_secs(30), "the stall took {:?} to be noticed", started.elapsed());
}

#[tokio::test]
async fn wait_exits_4_when_the_timeout_passes_first() {
    let app = spawn_app().await;
    drover(&app, &["pools", "create", "held", "--version", "v1.29.2", "--replicas", "1", "--paused"]).await.ok();
    let started = Instant::now();
    let run = drover(&app, &["pools", "scale", "held", "3", "--wait", "--timeout", "1s"]).await;
    assert_eq!(run.code, 4, "stderr: {}", run.stderr);
    assert!(run.stderr.contains("gave up waiting after 1s"), "{}", run.stderr);
    assert!(started.elapsed() < Duration::from_secs(10), "--timeout 1s took {:?}", started.elapsed());
}

#[tokio::test]
async fn server_errors_show_title_detail_and_fields_and_exit_1() {
    let app = spawn_app().await;
    let run = drover(&app, &["pools", "create", "Bad_Name", "--version", "1.29"]).await;
    assert_eq!(run.code, 1);
    assert!(run.stderr.contains("The request broke a validation rule (422)"), "{}", run.stderr);
    assert!(run.stderr.contains("\n  name: ") && run.stderr.contains("\n  version: "), "{}", run.stderr);
    let run = drover(&app, &["pools", "get", "nope"]).await;
    assert_eq!(run.code, 1);
    assert!(run.stderr.contains("Resource not found (404): pool \"nope\" does not exist"), "{}", run.stderr);
}

#[tokio::test]
async fn an_unreachable_server_is_named_and_exits_1() {
    // Bind then drop a listener: a loopback port that nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("port").port();
    let server = format!("http://127.0.0.1:{port}");
    let run = drover_at(&server, None, &["pools", "list"]).await;
    assert_eq!(run.code, 1);
    assert!(run.stderr.contains(&format!("cannot reach drover at {server}")), "{}", run.stderr);
}

/// Pool `p` as the real server answers it once its 3 machines have converged.
async fn a_real_pool() -> Value {
    let app = spawn_app().await;
    app.create_pool_ok("p", 3, json!({})).await;
    app.wait_converged("p", 3, Duration::from_secs(30)).await
}

/// A stand-in server: records the `Authorization` headers it gets, has no
/// stream endpoint, and answers `pool` as pool `p`.
async fn fake_server(seen: Arc<Mutex<Vec<String>>>, pool: Value) -> String {
    let record = move |headers: HeaderMap| {
        let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("-").to_owned();
        seen.lock().unwrap_or_else(|p| p.into_inner()).push(auth);
    };
    let (r1, r2, r3) = (record.clone(), record.clone(), record);
    let (p1, p2) = (pool.clone(), pool);
    let app = axum::Router::new()
        .route(
            "/v1/pools",
            get(move |h: HeaderMap| async move {
                r1(h);
                Json(json!({"items": [], "next_cursor": null}))
            }),
        )
        .route(
            "/v1/pools/p",
            get(move |h: HeaderMap| async move {
                r2(h);
                Json(p1)
            }),
        )
        .route(
            "/v1/pools/p/scale",
            put(move |h: HeaderMap| async move {
                r3(h);
                Json(p2)
            }),
        )
        .route("/v1/pools/p/stream", get(|| async { StatusCode::NOT_FOUND }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binding the fake server");
    let addr = listener.local_addr().expect("fake server address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

#[tokio::test]
async fn the_token_is_sent_as_a_bearer_header() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let server = fake_server(Arc::clone(&seen), Value::Null).await;
    drover_at(&server, Some("s3cret"), &["pools", "list"]).await.ok();
    drover_at(&server, None, &["--token", "other", "pools", "list"]).await.ok();
    drover_at(&server, None, &["pools", "list"]).await.ok();
    let seen = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert_eq!(seen, vec!["Bearer s3cret", "Bearer other", "-"]);
}

#[tokio::test]
async fn wait_falls_back_to_polling_when_the_stream_is_unavailable() {
    let server = fake_server(Arc::new(Mutex::new(Vec::new())), a_real_pool().await).await;
    let run =
        drover_at(&server, None, &["pools", "scale", "p", "3", "--wait", "--timeout", "20s", "-o", "json"]).await.ok();
    assert!(run.stderr.contains("polling"), "{}", run.stderr);
    assert_eq!(run.json()["status"]["ready_replicas"], 3);
}

/// The client reads answers into the server's own view types: a field it
/// prints that the answer lacks (renamed, say) is an error naming the field,
/// never a `-` in the table.
#[tokio::test]
async fn an_answer_missing_a_field_the_cli_shows_is_an_error_that_names_it() {
    let mut pool = a_real_pool().await;
    let removed = pool["status"].as_object_mut().and_then(|s| s.remove("ready_replicas"));
    assert!(removed.is_some(), "the server sends status.ready_replicas: {pool:#}");
    let server = fake_server(Arc::new(Mutex::new(Vec::new())), pool).await;
    let missing = "unexpected answer to GET /v1/pools/p: missing field `status.ready_replicas`";
    for args in [&["pools", "get", "p"][..], &["pools", "scale", "p", "3", "--wait", "--timeout", "20s"]] {
        let run = drover_at(&server, None, args).await;
        assert_eq!(run.code, 1, "drover {args:?}\nstdout: {}\nstderr: {}", run.stdout, run.stderr);
        assert!(run.stderr.contains(missing), "drover {args:?}: {}", run.stderr);
        assert!(run.stdout.is_empty(), "drover {args:?} printed half a pool: {}", run.stdout);
    }
    let raw = drover_at(&server, None, &["pools", "get", "p", "-o", "json"]).await.ok().json();
    assert_eq!(raw["name"], "p", "-o json prints the server's JSON as it came");
}

#[tokio::test]
async fn cluster_and_upgrade_commands_register_probe_upgrade_and_list() {
    let env = spawn_env(|_| {}).await;
    let app = &env.app;
    assert!(drover(app, &["clusters", "list"]).await.ok().stdout.contains(CLUSTER));
    assert_eq!(drover(app, &["clusters", "get", CLUSTER, "-o", "json"]).await.ok().json()["name"], CLUSTER);
    let status = drover(app, &["clusters", "status", CLUSTER, "-o", "json"]).await.ok().json();
    assert_eq!(status["reachable"], true, "{status:#}");
    let url = env.sim.url();
    let other =
        drover(app, &["clusters", "create", "other", "--api-server", &url, "--api-token", SIM_TOKEN, "-o", "json"])
            .await
            .ok()
            .json();
    assert_eq!(other["auth"], "token");
    assert!(!other.to_string().contains(SIM_TOKEN), "credentials are write-only");
    assert_eq!(drover(app, &["clusters", "delete", "other", "-o", "json"]).await.ok().json()["deleted"], true);

    // The tables read the real answers into the server's views, which fails on any field missing.
    assert!(drover(app, &["clusters", "get", CLUSTER]).await.ok().stdout.contains(CLUSTER));
    assert!(drover(app, &["clusters", "status", CLUSTER]).await.ok().stdout.contains("kube-apiserver"));
    assert!(drover(app, &["upgrade", "start", CLUSTER, "--version", TO, "--dry-run"]).await.ok().stdout.contains(TO));
    let plan =
        drover(app, &["upgrade", "start", CLUSTER, "--version", TO, "--dry-run", "-o", "json"]).await.ok().json();
    assert_eq!(plan["target_version"], TO);
    let job = drover(app, &["upgrade", "start", CLUSTER, "--version", TO, "--wait", "--timeout", "60s", "-o", "json"])
        .await
        .ok()
        .json();
    assert_eq!(job["state"], "succeeded", "{job:#}");
    let id = job["id"].to_string();
    let list =
        drover(app, &["upgrade", "list", "--cluster", CLUSTER, "--state", "succeeded", "-o", "json"]).await.ok().json();
    assert_eq!(list["items"][0]["id"], job["id"]);
    assert!(drover(app, &["upgrade", "list"]).await.ok().stdout.contains("succeeded"));
    assert!(drover(app, &["upgrade", "status", &id]).await.ok().stdout.contains("succeeded"));
    let cancel = drover(app, &["upgrade", "cancel", &id]).await;
    assert_eq!(cancel.code, 1, "an ended job cannot be cancelled: {}", cancel.stderr);
    assert!(cancel.stderr.contains("(409)"), "{}", cancel.stderr);
}

#[tokio::test]
async fn upgrade_wait_exits_3_when_the_job_fails() {
    let env = spawn_env(|c| c.upgrade_wait_timeout = Duration::from_millis(1500)).await;
    env.sim.break_image(&format!("registry.k8s.io/kube-apiserver:{TO}"));
    let run = drover(&env.app, &["upgrade", "start", CLUSTER, "--version", TO, "--wait", "--timeout", "60s"]).await;
    assert_eq!(run.code, 3, "a failed upgrade must fail the CI step\nstderr: {}", run.stderr);
    assert!(run.stderr.contains("failed"), "{}", run.stderr);
    let pending = drover(&env.app, &["upgrade", "start", CLUSTER, "--version", TO, "-o", "json"]).await.ok().json();
    let id = pending["id"].to_string();
    let cancelled = drover(&env.app, &["upgrade", "cancel", &id, "-o", "json"]).await.ok().json();
    assert_eq!(cancelled["cancel_requested"], true, "{cancelled:#}");
}

#[tokio::test]
async fn engines_commands_add_list_drain_and_remove_an_engine() {
    let app = spawn_app().await;
    let added =
        drover(&app, &["engines", "add", "west", "--endpoint", "sim://west", "--label", "zone=west"]).await.ok();
    assert!(added.stdout.contains("zone=west"), "{}", added.stdout);
    let list = drover(&app, &["engines", "list"]).await.ok();
    assert!(list.stdout.contains("local") && list.stdout.contains("west"), "{}", list.stdout);
    let json = drover(&app, &["-o", "json", "engines", "get", "west"]).await.ok().json();
    assert_eq!(json["labels"]["zone"], "west");
    let drained = drover(&app, &["engines", "drain", "west"]).await.ok();
    assert!(drained.stdout.contains("draining:") && drained.stdout.contains("true"), "{}", drained.stdout);
    drover(&app, &["engines", "undrain", "west"]).await.ok();
    let refused = drover(&app, &["engines", "add", "far", "--endpoint", "tcp://10.9.9.9:2375"]).await;
    assert_eq!(refused.code, 1, "a refused registration exits 1: {}", refused.stderr);
    assert!(refused.stderr.contains("tls"), "{}", refused.stderr);
    drover(&app, &["engines", "remove", "west"]).await.ok();
    let gone = drover(&app, &["engines", "get", "west"]).await;
    assert_eq!(gone.code, 1);
}
