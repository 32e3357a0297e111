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
use crate::helpers::{RawStore, admin_token, client_with_token, config, hold_for, metric, spawn_app, start, unique};
use crate::process::Process;

const LIMIT: Duration = Duration::from_secs(120);

/// A short resync for drover processes, so that passes keep coming once a
/// pool has converged (a pass after convergence is what shows a duplicate).
const RESYNC: &[&str] = &["--resync-interval", "1s"];

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
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn a_docker_outage_gives_conditions_and_events_then_recovers_without_duplicates() {
    require_docker();
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
    // Backoff, not a busy loop: over 30 s of outage (15 times the 2 s
    // backoff cap) a handful of failed passes at most (a pass that cannot
    // reach the engine waits for it rather than failing), the outage told
    // once, and nothing changed on the engine. A rate over time: no later
    // event could show it, so this one window is observed, poll by poll.
    let failures = format!("drover_pool_reconcile_failures_total{{namespace=\"default\",pool=\"{pool}\"}}");
    hold_for(Duration::from_secs(30), "during a 30 s Docker outage", async || {
        let warnings = app.events(&pool).await.into_iter().filter(|e| e["reason"] == "RuntimeUnavailable").count();
        if !(1..=3).contains(&warnings) {
            return Err(format!("{warnings} outage events: a repeated failure is one story"));
        }
        let failed = metric(&app.metrics_text(), &failures);
        if failed > 5.0 {
            return Err(format!("{failed} failed passes: the retries do not back off"));
        }
        match docker::pool_containers(&d, &pool).await.len() {
            2 => Ok(()),
            n => Err(format!("{n} containers, not 2: something changed while Docker was away")),
        }
    })
    .await;

    proxy.up().await;
    let back = std::time::Instant::now();
    app.wait_converged(&pool, 4, LIMIT).await;
    assert!(back.elapsed() < Duration::from_secs(15), "converged {:?} after the engine came back", back.elapsed());
    app.wait_pass_after_now(LIMIT, "a pass after convergence, which would show a duplicate").await;
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
    // Another session holds the lock a write needs for a while: SQLite's
    // write lock, or the pool's row in PostgreSQL.
    let mut other = app.raw_store().await;
    let begin = if matches!(other, RawStore::Sqlite(_)) { "begin immediate" } else { "begin" };
    other.execute(begin, &[]).await;
    other.execute("update pools set updated_at = updated_at", &[]).await;
    let release = tokio::spawn(async move {
        // The fault itself (a lock held for 1.5 s), not a wait for anything.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        other.execute("commit", &[]).await;
    });
    let started = std::time::Instant::now();
    let res = app.scale("busy", 3).await;
    assert_eq!(res.status(), StatusCode::OK, "{}", res.text().await.unwrap_or_default());
    assert!(started.elapsed() >= Duration::from_millis(1000), "the write waited for the lock");
    release.await.unwrap();
    assert_eq!(app.pool("busy").await["replicas"], 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn sigkill_five_times_during_a_20_machine_rollout_still_converges_exactly() {
    require_docker();
    let pool = unique("kill9");
    let _cleanup = Cleanup(vec![pool.clone()]);
    let d = docker::client().await;
    let tmp = tempfile::TempDir::new().unwrap();
    let mut proc = Process::spawn_with(tmp.path(), RESYNC);
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
        // Not a wait for anything: the kill lands at a random moment of the
        // rollout, which is what the test is about.
        let pause = rand::rng().random_range(150..1200);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let before = docker::pool_containers(&d, &pool).await.len();
        proc.kill();
        eprintln!("round {round}: SIGKILL after {pause} ms with {before} containers");
        proc = Process::spawn_with(tmp.path(), RESYNC);
        proc.wait_up().await;
    }
    let p = proc
        .wait_pool(&client, &pool, LIMIT, "the rollout to converge after the kills", |p| {
            let s = &p["status"];
            s["replicas"] == 20
                && s["ready_replicas"] == 20
                && s["updated_replicas"] == 20
                && s["terminating_replicas"] == 0
                && s["observed_generation"] == p["generation"]
        })
        .await;
    proc.wait_pass_after_now(&client, LIMIT, "a pass after convergence, which would show a duplicate").await;

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
