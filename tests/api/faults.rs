//! Outages and crashes: Docker going away and coming back, SQLite lock
//! contention, and drover killed with SIGKILL in the middle of a rollout.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use drover::config::RuntimeKind;
use rand::RngExt;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

use crate::docker::{self, Cleanup, V1, V2, require_docker};
use crate::helpers::{admin_token, client_with_token, config, spawn_app, start, unique};
use crate::process::Process;

const LIMIT: Duration = Duration::from_secs(120);

/// A Unix socket that forwards to the Docker socket and can be cut off and
/// restored, as an engine restart or a socket proxy failure would.
pub struct SocketProxy {
    pub path: PathBuf,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl SocketProxy {
    pub fn new(path: PathBuf) -> Arc<Self> {
        Arc::new(Self { path, task: Mutex::new(None) })
    }

    pub async fn up(&self) {
        let _ = std::fs::remove_file(&self.path);
        let listener = UnixListener::bind(&self.path).expect("binding the proxy socket");
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((mut client, _)) = listener.accept().await {
                conns.spawn(async move {
                    if let Ok(mut engine) = UnixStream::connect("/var/run/docker.sock").await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut engine).await;
                    }
                });
            }
        });
        *self.task.lock().await = Some(task);
    }

    /// Drops the listener and every open connection.
    pub async fn down(&self) {
        if let Some(task) = self.task.lock().await.take() {
            task.abort();
            let _ = task.await;
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_docker_outage_gives_conditions_and_events_then_recovers_without_duplicates() {
    if !require_docker("a_docker_outage_gives_conditions_and_events_then_recovers_without_duplicates") {
        return;
    }
    let pool = unique("outage");
    let _cleanup = Cleanup(vec![pool.clone()]);
    let tmp = tempfile::TempDir::new().unwrap();
    let proxy = SocketProxy::new(tmp.path().join("docker.sock"));
    proxy.up().await;
    let mut cfg = config(tmp.path(), RuntimeKind::Docker);
    cfg.docker_host = Some(format!("unix://{}", proxy.path.display()));
    let app = start(cfg, Some(tmp)).await;
    let d = docker::client().await;

    app.create_pool_ok(&pool, 2, json!({"version": V1})).await;
    app.wait_converged(&pool, 2, LIMIT).await;

    proxy.down().await;
    assert_eq!(app.scale(&pool, 4).await.status(), StatusCode::OK, "the API keeps working without Docker");
    let p = app
        .wait_pool(&pool, LIMIT, "a RuntimeUnavailable condition", |p| {
            p["status"]["conditions"].as_array().is_some_and(|cs| {
                cs.iter().any(|c| {
                    c["type"] == "RuntimeAvailable" && c["status"] == "False" && c["reason"] == "RuntimeUnavailable"
                })
            })
        })
        .await;
    assert!(p["status"]["last_error"].as_str().is_some_and(|e| !e.is_empty()));
    assert_eq!(app.get("/readyz").await.status(), StatusCode::SERVICE_UNAVAILABLE);
    // Backoff, not a busy loop: over 30 s of outage, a handful of failed
    // passes at most (a pass that cannot reach the engine waits for it
    // rather than failing), and the outage is told once.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let warnings = app.events(&pool).await.into_iter().filter(|e| e["reason"] == "RuntimeUnavailable").count();
    assert!((1..=3).contains(&warnings), "{warnings} outage events: a repeated failure is one story");
    let metrics = app.get("/metrics").await.text().await.unwrap_or_default();
    let failed: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("drover_reconcile_passes_total") && l.contains(&pool) && l.contains("error"))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum();
    assert!(failed <= 5.0, "{failed} failed passes in a 30 s outage");
    assert_eq!(docker::pool_containers(&d, &pool).await.len(), 2, "nothing changed while Docker was away");

    proxy.up().await;
    let back = std::time::Instant::now();
    app.wait_converged(&pool, 4, LIMIT).await;
    assert!(back.elapsed() < Duration::from_secs(15), "converged {:?} after the engine came back", back.elapsed());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let seen = docker::pool_containers(&d, &pool).await;
    assert_eq!(seen.len(), 4, "exactly 4 containers after the outage: {seen:#?}");
    let p = app.pool(&pool).await;
    let available =
        p["status"]["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "RuntimeAvailable").cloned();
    assert_eq!(available.map(|c| c["status"].clone()), Some(json!("True")));
    assert_eq!(app.get("/readyz").await.status(), StatusCode::OK);
    proxy.down().await;
}

#[tokio::test]
async fn a_write_waits_out_a_busy_database_instead_of_failing() {
    let app = spawn_app().await;
    app.create_pool_ok("busy", 0, json!({"paused": true})).await;
    // Another process holds SQLite's write lock for a while.
    let url = format!("sqlite://{}", app.data_dir.join("drover.db").display());
    let mut other = <sqlx::SqliteConnection as sqlx::Connection>::connect(&url).await.unwrap();
    sqlx::query("begin immediate").execute(&mut other).await.unwrap();
    sqlx::query("update pools set updated_at = updated_at").execute(&mut other).await.unwrap();
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        sqlx::query("commit").execute(&mut other).await.unwrap();
    });
    let started = std::time::Instant::now();
    let res = app.scale("busy", 3).await;
    assert_eq!(res.status(), StatusCode::OK, "{}", res.text().await.unwrap_or_default());
    assert!(started.elapsed() >= Duration::from_millis(1000), "the write waited for the lock");
    release.await.unwrap();
    assert_eq!(app.pool("busy").await["replicas"], 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_five_times_during_a_20_machine_rollout_still_converges_exactly() {
    if !require_docker("sigkill_five_times_during_a_20_machine_rollout_still_converges_exactly") {
        return;
    }
    let pool = unique("kill9");
    let _cleanup = Cleanup(vec![pool.clone()]);
    let d = docker::client().await;
    let tmp = tempfile::TempDir::new().unwrap();
    let mut proc = Process::spawn(tmp.path());
    proc.wait_up().await;
    let client = client_with_token(&admin_token(tmp.path()));
    let spec = json!({"name": pool, "replicas": 20, "version": V1, "strategy": {"max_surge": 5}});
    let res = client.post(format!("{}/v1/pools", proc.addr)).json(&spec).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    proc.wait_pool(&client, &pool, LIMIT, "20 machines on the first image", |p| {
        p["status"]["ready_replicas"] == 20 && p["status"]["updated_replicas"] == 20
    })
    .await;

    let res = client
        .patch(format!("{}/v1/pools/{pool}", proc.addr))
        .header("content-type", "application/merge-patch+json")
        .body(json!({"version": V2}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    for round in 0..5 {
        let pause = rand::rng().random_range(150..1200);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let before = docker::pool_containers(&d, &pool).await.len();
        proc.kill();
        eprintln!("round {round}: SIGKILL after {pause} ms with {before} containers");
        proc = Process::spawn(tmp.path());
        proc.wait_up().await;
    }
    let p = proc
        .wait_pool(&client, &pool, LIMIT, "the rollout to converge after the kills", |p| {
            let s = &p["status"];
            s["replicas"] == 20
                && s["ready_replicas"] == 20
                && s["updated_replicas"] == 20
                && s["observed_generation"] == p["generation"]
        })
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    let seen = docker::pool_containers(&d, &pool).await;
    assert_eq!(seen.len(), 20, "no duplicate or orphan container");
    assert!(seen.iter().all(|c| c.image == format!("kindest/node:{V2}") && c.running), "{seen:#?}");
    let recorded = proc.machine_names(&client, &pool).await;
    assert_eq!(recorded, seen.iter().map(|c| c.name.clone()).collect::<HashSet<_>>(), "records mirror the containers");
    assert_eq!(p["revision"], 2);
    let rollout: Value =
        client.get(format!("{}/v1/pools/{pool}/rollout", proc.addr)).send().await.unwrap().json().await.unwrap();
    assert_eq!(rollout["state"], "complete", "{rollout:#}");
    proc.kill();
}
