//! Deletions cut short: drover SIGKILLed, or the engine cut off, while
//! machines are being stopped (scale-down and rollout). After the next pass
//! no exited or created container of the pool is left, none was counted as
//! ready, records mirror containers, and a later scale-up works.

use std::collections::HashSet;
use std::time::Duration;

use drover::config::RuntimeKind;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::docker::{self, Cleanup, STUBBORN_V1, STUBBORN_V2, require_docker};
use crate::faults::SocketProxy;
use crate::helpers::{TestApp, admin_token, client_with_token, config, start, unique, wait_for};
use crate::process::Process;

const LIMIT: Duration = Duration::from_secs(120);

/// A drover process, its client and its data directory, restartable.
pub struct Served {
    proc: Option<Process>,
    pub client: reqwest::Client,
    data: tempfile::TempDir,
}

/// Machines ignore SIGTERM and the grace period is 3 s: every stop takes 3 s.
const FLAGS: &[&str] = &["--stop-timeout", "3s", "--resync-interval", "5s"];

impl Served {
    pub async fn start() -> Self {
        let data = tempfile::TempDir::new().expect("data dir");
        let proc = Process::spawn_with(data.path(), FLAGS);
        proc.wait_up().await;
        let client = client_with_token(&admin_token(data.path()));
        Self { proc: Some(proc), client, data }
    }

    pub fn addr(&self) -> String {
        self.proc.as_ref().map(|p| p.addr.clone()).unwrap_or_default()
    }

    pub async fn send(&self, method: reqwest::Method, path: &str, body: Value) -> StatusCode {
        let mut req = self.client.request(method.clone(), format!("{}{path}", self.addr()));
        req = if method == reqwest::Method::PATCH {
            req.header("content-type", "application/merge-patch+json").body(body.to_string())
        } else {
            req.json(&body)
        };
        req.send().await.expect("request").status()
    }

    pub async fn pool(&self, pool: &str) -> Value {
        let url = format!("{}/v1/pools/{pool}", self.addr());
        self.client.get(url).send().await.expect("get pool").json().await.unwrap_or(Value::Null)
    }

    /// SIGKILL, then a new process on the same data directory (the old one
    /// is gone, its locks with it, when `kill` returns).
    pub async fn kill_and_restart(&mut self) {
        if let Some(p) = self.proc.take() {
            p.kill();
        }
        let proc = Process::spawn_with(self.data.path(), FLAGS);
        proc.wait_up().await;
        self.proc = Some(proc);
    }
}

/// Exactly `n` containers, all running `image`, the records naming exactly
/// them, and the status agreeing, within `LIMIT`.
pub async fn assert_converged(served: &Served, d: &bollard::Docker, pool: &str, n: usize, image: &str) {
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let seen = docker::pool_containers(d, pool).await;
        let p = served.pool(pool).await;
        let s = &p["status"];
        let clean = seen.len() == n && seen.iter().all(|c| c.running && c.image == image);
        if clean && s["ready_replicas"] == n && s["replicas"] == n && s["terminating_replicas"] == 0 {
            let url = format!("{}/v1/pools/{pool}/machines?limit=500", served.addr());
            let page: Value = served.client.get(url).send().await.expect("machines").json().await.expect("JSON");
            let records = crate::helpers::names(page["items"].as_array().map_or(&[][..], Vec::as_slice));
            let names: HashSet<String> = seen.iter().map(|c| c.name.clone()).collect();
            assert_eq!(records, names, "records mirror the containers");
            return;
        }
        let leftovers: Vec<(&str, &str)> =
            seen.iter().filter(|c| !c.running).map(|c| (c.name.as_str(), c.state.as_str())).collect();
        assert!(
            tokio::time::Instant::now() < deadline,
            "not converged on {n} running {image}: {} containers, not running: {leftovers:?}; status {s:#}",
            seen.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Polls until the pool reports machines terminating (stops under way).
async fn until_stopping(served: &Served, pool: &str) {
    let deadline = tokio::time::Instant::now() + LIMIT;
    while served.pool(pool).await["status"]["terminating_replicas"].as_u64().unwrap_or(0) == 0 {
        assert!(tokio::time::Instant::now() < deadline, "no machine began to stop");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn sigkill_while_machines_stop_leaves_no_exited_container_and_scaling_goes_on() {
    require_docker();
    let pool = unique("kill-stop");
    let _cleanup = Cleanup(vec![pool.clone()]);
    let d = docker::client().await;
    let mut served = Served::start().await;
    let spec =
        json!({"name": pool, "replicas": 10, "version": "v1.29.2", "image": STUBBORN_V1, "strategy": {"max_surge": 5}});
    assert_eq!(served.send(reqwest::Method::POST, "/v1/pools", spec).await, StatusCode::CREATED);
    assert_converged(&served, &d, &pool, 10, STUBBORN_V1).await;

    // Scale-down: killed while six machines take their grace period.
    let path = format!("/v1/pools/{pool}");
    assert_eq!(served.send(reqwest::Method::PATCH, &path, json!({"replicas": 4})).await, StatusCode::OK);
    until_stopping(&served, &pool).await;
    served.kill_and_restart().await;
    assert_converged(&served, &d, &pool, 4, STUBBORN_V1).await;

    // Rollout: killed while old machines stop.
    assert_eq!(served.send(reqwest::Method::PATCH, &path, json!({"image": STUBBORN_V2})).await, StatusCode::OK);
    until_stopping(&served, &pool).await;
    served.kill_and_restart().await;
    assert_converged(&served, &d, &pool, 4, STUBBORN_V2).await;

    // And scaling still works.
    assert_eq!(served.send(reqwest::Method::PATCH, &path, json!({"replicas": 6})).await, StatusCode::OK);
    assert_converged(&served, &d, &pool, 6, STUBBORN_V2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn an_engine_outage_during_a_scale_down_leaves_no_exited_container() {
    require_docker();
    let pool = unique("cut-stop");
    let _cleanup = Cleanup(vec![pool.clone()]);
    let d = docker::client().await;
    let tmp = tempfile::TempDir::new().expect("data dir");
    let proxy = SocketProxy::new(tmp.path().join("docker.sock"));
    proxy.up().await;
    let mut cfg = config(tmp.path(), RuntimeKind::Docker);
    cfg.docker_host = Some(format!("unix://{}", proxy.path.display()));
    cfg.stop_timeout = Duration::from_secs(3);
    let app: TestApp = start(cfg, Some(tmp)).await;
    app.create_pool_ok(&pool, 8, json!({"image": STUBBORN_V1})).await;
    app.wait_converged(&pool, 8, LIMIT).await;

    assert_eq!(app.scale(&pool, 3).await.status(), StatusCode::OK);
    app.wait_pool(&pool, LIMIT, "machines stopping", |p| p["status"]["terminating_replicas"].as_u64().unwrap_or(0) > 0)
        .await;
    // The engine goes away in the middle of the stops, and comes back once
    // drover has seen it gone and the engine has finished the stops on its
    // own: containers that exited while drover could not see them.
    proxy.down().await;
    app.wait_pool(&pool, LIMIT, "the pool to report the engine unreachable", |p| {
        p["status"]["conditions"]
            .as_array()
            .is_some_and(|cs| cs.iter().any(|c| c["type"] == "RuntimeAvailable" && c["status"] == "False"))
    })
    .await;
    wait_for(LIMIT, "the engine to finish the stops drover asked for (3 machines left running)", async || {
        docker::pool_containers(&d, &pool).await.iter().filter(|c| c.running).count() <= 3
    })
    .await;
    let left = docker::pool_containers(&d, &pool).await;
    assert!(left.iter().any(|c| c.state == "exited"), "no machine exited while drover was cut off: {left:#?}");
    proxy.up().await;
    app.wait_converged(&pool, 3, LIMIT).await;
    let seen = docker::pool_containers(&d, &pool).await;
    assert_eq!(seen.len(), 3, "{seen:#?}");
    assert!(seen.iter().all(|c| c.running), "no exited container left: {seen:#?}");
    assert_eq!(app.scale(&pool, 5).await.status(), StatusCode::OK);
    app.wait_converged(&pool, 5, LIMIT).await;
    proxy.down().await;
}

/// The containers of every pool named `pool`, by the namespace their
/// label names (none: `default`, as machines made before namespaces).
async fn by_namespace(d: &bollard::Docker, pool: &str) -> std::collections::BTreeMap<String, Vec<docker::Seen>> {
    let mut out: std::collections::BTreeMap<String, Vec<docker::Seen>> = Default::default();
    for c in docker::pool_containers(d, pool).await {
        let ns = c.labels.get("drover.dev/namespace").cloned().unwrap_or_else(|| "default".to_owned());
        out.entry(ns).or_default().push(c);
    }
    out
}

/// Waits until namespace `ns`'s pool `pool` has exactly `n` running
/// containers of `image` and no other, and its status says so.
async fn converged_in(served: &Served, d: &bollard::Docker, ns: &str, pool: &str, n: usize, image: &str) {
    let what = format!("{ns}/{pool} on {n} running {image}");
    wait_for(LIMIT, &what, async || {
        let seen = by_namespace(d, pool).await.remove(ns).unwrap_or_default();
        let url = format!("{}/v1/pools/{pool}?namespace={ns}", served.addr());
        let p: Value = served.client.get(url).send().await.expect("get pool").json().await.unwrap_or(Value::Null);
        let s = &p["status"];
        seen.len() == n
            && seen.iter().all(|c| c.running && c.image == image)
            && s["ready_replicas"] == n
            && s["terminating_replicas"] == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn two_pools_of_one_name_in_two_namespaces_keep_their_own_machines_across_a_sigkill() {
    require_docker();
    let pool = unique("twin");
    let _cleanup = Cleanup(vec![pool.clone()]);
    let d = docker::client().await;
    let mut served = Served::start().await;
    let post = reqwest::Method::POST;
    assert_eq!(served.send(post.clone(), "/v1/namespaces", json!({"name": "team-b"})).await, StatusCode::CREATED);
    for ns in ["default", "team-b"] {
        let spec = json!({"name": pool, "replicas": 3, "version": "v1.29.2", "image": STUBBORN_V1,
                          "strategy": {"max_surge": 2}});
        let path = format!("/v1/pools?namespace={ns}");
        assert_eq!(served.send(post.clone(), &path, spec).await, StatusCode::CREATED, "{ns}");
    }
    converged_in(&served, &d, "default", &pool, 3, STUBBORN_V1).await;
    converged_in(&served, &d, "team-b", &pool, 3, STUBBORN_V1).await;

    // Scale both, each its own way.
    let patch = |ns: &str| format!("/v1/pools/{pool}?namespace={ns}");
    let patched = served.send(reqwest::Method::PATCH, &patch("default"), json!({"replicas": 4})).await;
    assert_eq!(patched, StatusCode::OK);
    let patched = served.send(reqwest::Method::PATCH, &patch("team-b"), json!({"replicas": 2})).await;
    assert_eq!(patched, StatusCode::OK);
    converged_in(&served, &d, "default", &pool, 4, STUBBORN_V1).await;
    converged_in(&served, &d, "team-b", &pool, 2, STUBBORN_V1).await;
    let team_b: HashSet<String> =
        by_namespace(&d, &pool).await.remove("team-b").unwrap_or_default().into_iter().map(|c| c.name).collect();

    // Roll default's, and SIGKILL drover while its old machines stop.
    let rolled = served.send(reqwest::Method::PATCH, &patch("default"), json!({"image": STUBBORN_V2})).await;
    assert_eq!(rolled, StatusCode::OK);
    until_stopping(&served, &pool).await;
    served.kill_and_restart().await;
    converged_in(&served, &d, "default", &pool, 4, STUBBORN_V2).await;
    let still: HashSet<String> =
        by_namespace(&d, &pool).await.remove("team-b").unwrap_or_default().into_iter().map(|c| c.name).collect();
    assert_eq!(still, team_b, "team-b's machines are the same ones: none adopted, replaced or removed");

    // Default's to 0: team-b's stay.
    let zero = served.send(reqwest::Method::PATCH, &patch("default"), json!({"replicas": 0})).await;
    assert_eq!(zero, StatusCode::OK);
    converged_in(&served, &d, "default", &pool, 0, STUBBORN_V2).await;
    converged_in(&served, &d, "team-b", &pool, 2, STUBBORN_V1).await;
    let left: Vec<String> = by_namespace(&d, &pool).await.into_keys().collect();
    assert_eq!(left, ["team-b"], "only team-b's machines are left");
}
