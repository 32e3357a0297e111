//! Pools across engines: 0 -> N machines on one engine, on two, on the same
//! two with a third that never answers (registered at a socket nobody
//! listens on), and on three; and the time to recover from losing one of
//! three engines.
//!
//! The three engines are the host's and two extra `dockerd`s started by the
//! bench on this machine (their own sockets, data and bridges; see
//! `tests/support/engines.rs`), so they share its two cores: the figures
//! show drover's own overhead and the engines' parallelism on one host, not
//! three hosts' worth of capacity. Each figure is timed by the engines'
//! own container lists.
//!
//! Run: `cargo bench --bench engines` (needs Docker and root, for the
//! extra engines' bridges). `DROVER_BENCH_N=60`.

// Bounded docker CLI calls and engine requests, shared with the tests.
#[allow(dead_code)]
#[path = "../tests/support/command.rs"]
mod command;
#[path = "../tests/support/images.rs"]
mod images;
// Shared with the tests, which use all of it.
#[allow(dead_code)]
#[path = "../tests/support/engines.rs"]
mod support;

use std::time::{Duration, Instant};

use drover::app::Application;
use drover::config::{RuntimeKind, ServeConfig};
use serde_json::{Value, json};
use support::ExtraEngine;

const LIMIT: Duration = Duration::from_secs(600);

struct Drover {
    base: String,
    http: reqwest::Client,
    stop: tokio::sync::oneshot::Sender<()>,
    handle: tokio::task::JoinHandle<anyhow::Result<()>>,
    _data: tempfile::TempDir,
}

impl Drover {
    async fn start() -> anyhow::Result<Self> {
        let data = tempfile::TempDir::new()?;
        let mut cfg = ServeConfig::for_data_dir(data.path().to_path_buf());
        cfg.runtime = RuntimeKind::Docker;
        let app = Application::build(cfg).await?;
        let base = format!("http://{}", app.local_addr()?);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let handle = tokio::spawn(app.run_until_stopped(async move {
            let _ = stopped.await;
        }));
        let token = std::fs::read_to_string(data.path().join("admin.token"))?;
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(reqwest::header::AUTHORIZATION, format!("Bearer {}", token.trim()).parse()?);
        let http = reqwest::Client::builder().default_headers(headers).build()?;
        Ok(Self { base, http, stop, handle, _data: data })
    }

    async fn send(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
        let mut req = self.http.request(method.clone(), format!("{}{path}", self.base));
        if let Some(b) = body {
            req = if method == reqwest::Method::PATCH {
                req.header("content-type", "application/merge-patch+json").body(b.to_string())
            } else {
                req.json(&b)
            };
        }
        let res = req.send().await?;
        anyhow::ensure!(res.status().is_success(), "{method} {path}: {}", res.status());
        Ok(res.json().await.unwrap_or(Value::Null))
    }

    async fn pool(&self, name: &str) -> anyhow::Result<Value> {
        self.send(reqwest::Method::GET, &format!("/v1/pools/{name}"), None).await
    }

    /// Waits until the status reports `n` ready machines, counted only on
    /// `engines`; answers the time since `started`.
    async fn until_ready(&self, pool: &str, n: u64, engines: &[&str], started: Instant) -> anyhow::Result<Duration> {
        loop {
            let p = self.pool(pool).await?;
            let s = &p["status"];
            let on: u64 = engines.iter().map(|e| s["engines"][*e]["ready_replicas"].as_u64().unwrap_or(0)).sum();
            if s["ready_replicas"] == n && on == n && s["observed_generation"] == p["generation"] {
                return Ok(started.elapsed());
            }
            anyhow::ensure!(started.elapsed() < LIMIT, "{pool} never had {n} ready on {engines:?}: {s}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the pool is back to exactly `n` containers across the
    /// engines (the local one and `extra`), all ready in drover's status.
    async fn until_exact(
        &self,
        pool: &str,
        n: u64,
        extra: &[&ExtraEngine],
        started: Instant,
    ) -> anyhow::Result<Duration> {
        let docker = bollard::Docker::connect_with_defaults()?.negotiate_version().await?;
        loop {
            let local = pool_containers(&docker, pool, true).await?;
            let others: u64 = extra.iter().map(|e| e.pool_containers(pool).len() as u64).sum();
            let p = self.pool(pool).await?;
            let s = &p["status"];
            if local + others == n && s["replicas"] == n && s["ready_replicas"] == n {
                return Ok(started.elapsed());
            }
            anyhow::ensure!(started.elapsed() < LIMIT, "{pool} never came back to exactly {n}: {s}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn delete_pool(&self, name: &str) -> anyhow::Result<()> {
        self.send(reqwest::Method::DELETE, &format!("/v1/pools/{name}"), None).await?;
        let started = Instant::now();
        while self.http.get(format!("{}/v1/pools/{name}", self.base)).send().await?.status() != 404 {
            anyhow::ensure!(started.elapsed() < LIMIT, "{name} was never deleted");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(())
    }
}

/// How many containers of `pool` the local engine holds: running ones, or
/// (`all`) in any state.
async fn pool_containers(docker: &bollard::Docker, pool: &str, all: bool) -> anyhow::Result<u64> {
    let label = format!("drover.dev/pool={pool}");
    let filters = std::collections::HashMap::from([("label".to_owned(), vec![label])]);
    let opts = bollard::query_parameters::ListContainersOptionsBuilder::default().all(all).filters(&filters).build();
    let list = command::engine_call("listing containers", docker.list_containers(Some(opts)))
        .await
        .map_err(|e| anyhow::anyhow!(e))??;
    Ok(list.len() as u64)
}

/// Time from the scale request until `n` machines are running on the
/// engines, by their own lists, and until drover's status says `n` ready.
async fn scale_up(
    d: &Drover,
    pool: &str,
    engines: &[&str],
    n: u64,
    extra: &[&ExtraEngine],
) -> anyhow::Result<(Duration, Duration)> {
    let placement = json!({"name": pool, "replicas": 0, "version": "v1.29.2", "image": format!("kindest/node:{}", images::V1), "engines": engines});
    d.send(reqwest::Method::POST, "/v1/pools", Some(placement)).await?;
    let docker = bollard::Docker::connect_with_defaults()?.negotiate_version().await?;
    let started = Instant::now();
    d.send(reqwest::Method::PATCH, &format!("/v1/pools/{pool}"), Some(json!({"replicas": n}))).await?;
    let running = loop {
        let local = pool_containers(&docker, pool, false).await?;
        let others: u64 = extra.iter().map(|e| e.pool_containers(pool).iter().filter(|(_, r)| *r).count() as u64).sum();
        if local + others == n {
            break started.elapsed();
        }
        anyhow::ensure!(started.elapsed() < LIMIT, "{pool}: never {n} running");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let ready = d.until_ready(pool, n, engines, started).await?;
    Ok((running, ready))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    images::build_once();
    let n: u64 = std::env::var("DROVER_BENCH_N").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
    let image = format!("kindest/node:{}", images::V1);
    let mut e1 = ExtraEngine::start("e1", &[&image]).map_err(anyhow::Error::msg)?;
    let mut e2 = ExtraEngine::start("e2", &[&image]).map_err(anyhow::Error::msg)?;
    let d = Drover::start().await?;
    for e in [&e1, &e2] {
        d.send(reqwest::Method::POST, "/v1/engines", Some(json!({"name": e.name, "endpoint": e.endpoint()}))).await?;
    }
    // Let both informers list once before timing anything.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let (one_running, one_ready) = scale_up(&d, "bench-one", &["local"], n, &[]).await?;
    d.delete_pool("bench-one").await?;
    // Two engines, then the same two with a third that never answers
    // (registered a moment before, at a socket nobody listens on): the
    // dead one must cost nothing.
    let (two_running, two_ready) = scale_up(&d, "bench-two", &["local", "e1"], n, &[&e1]).await?;
    d.delete_pool("bench-two").await?;
    let nowhere = tempfile::TempDir::new()?;
    let dead = format!("unix://{}/no-such-engine.sock", nowhere.path().display());
    d.send(reqwest::Method::POST, "/v1/engines", Some(json!({"name": "dead", "endpoint": dead}))).await?;
    let with_dead = ["local", "e1", "dead"];
    let (dead_running, dead_ready) = scale_up(&d, "bench-dead", &with_dead, n, &[&e1]).await?;
    d.delete_pool("bench-dead").await?;
    d.send(reqwest::Method::DELETE, "/v1/engines/dead", None).await?;

    let three = ["local", "e1", "e2"];
    let (three_running, three_ready) = scale_up(&d, "bench-three", &three, n, &[&e1, &e2]).await?;

    // Lose e2 (its daemon stops, as a host that goes away) and time the way
    // back to n ready machines on the other two.
    let lost = Instant::now();
    e2.stop();
    let stopped = lost.elapsed();
    let back = d.until_ready("bench-three", n, &["local", "e1"], lost).await?;

    // The host comes back with its stopped containers: time the way to
    // exactly n machines again, the surplus removed.
    let returned = Instant::now();
    e2.restart().map_err(anyhow::Error::msg)?;
    let exact = d.until_exact("bench-three", n, &[&e1, &e2], returned).await?;
    d.delete_pool("bench-three").await?;
    let _ = d.stop.send(());
    d.handle.await??;
    e1.stop();

    println!("| {n} machines | running (engines' lists) | ready (drover's status) |");
    println!("|---|---:|---:|");
    println!("| 0 -> {n} on one engine | {:.2} s | {:.2} s |", one_running.as_secs_f64(), one_ready.as_secs_f64());
    println!("| 0 -> {n} on two engines | {:.2} s | {:.2} s |", two_running.as_secs_f64(), two_ready.as_secs_f64());
    println!(
        "| 0 -> {n} on the same two, a third engine dead at registration | {:.2} s | {:.2} s |",
        dead_running.as_secs_f64(),
        dead_ready.as_secs_f64()
    );
    println!(
        "| 0 -> {n} on three engines | {:.2} s | {:.2} s |",
        three_running.as_secs_f64(),
        three_ready.as_secs_f64()
    );
    println!();
    println!(
        "losing one of three engines (--engine-lost-after 30s): {n} ready on the other two {:.2} s after its daemon \
         was told to stop ({:.2} s of which the daemon took to stop its containers and exit)",
        back.as_secs_f64(),
        stopped.as_secs_f64()
    );
    println!(
        "its daemon started again (its {n}/3 stopped containers come back): exactly {n} machines, all ready, \
         {:.2} s later",
        exact.as_secs_f64()
    );
    Ok(())
}
