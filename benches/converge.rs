//! How fast drover converges a pool, next to the engine's own limit.
//!
//! For each size N, in the same run and against the same Docker engine:
//! - `engine`: create and start N containers straight through the engine's
//!   API, all at once (the fastest this engine can go), then remove them;
//! - `drover`: scale a pool from 0 to N and wait until its status reports N
//!   ready machines, then scale back to 0.
//!
//! Run: `cargo bench --bench converge` (needs Docker and /bin/busybox).
//! Sizes: `DROVER_BENCH_SIZES=20,50` (default). Rounds: `DROVER_BENCH_ROUNDS=3`.

#[path = "../tests/support/images.rs"]
mod images;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::models::ContainerCreateBody;
use bollard::query_parameters::{CreateContainerOptionsBuilder, RemoveContainerOptionsBuilder};
use drover::app::Application;
use drover::config::{RuntimeKind, ServeConfig};
use futures_util::future::join_all;
use serde_json::{Value, json};

const LIMIT: Duration = Duration::from_secs(300);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    images::build_once();
    let sizes: Vec<usize> = std::env::var("DROVER_BENCH_SIZES")
        .unwrap_or_else(|_| "20,50".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let rounds: usize = std::env::var("DROVER_BENCH_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(3);
    let docker = Docker::connect_with_defaults()?.negotiate_version().await?;
    let image = format!("kindest/node:{}", images::V1);

    let server = Server::start(RuntimeKind::Docker, 1000).await?;
    let (base, http) = (server.base.clone(), server.http.clone());
    let pool = format!("bench-{}", std::process::id());
    let res = http
        .post(format!("{base}/v1/pools"))
        .json(&json!({"name": pool, "replicas": 0, "version": images::V1}))
        .send()
        .await?;
    anyhow::ensure!(res.status().is_success(), "creating the bench pool: {}", res.text().await?);

    println!("| machines | engine direct (best of {rounds}) | drover converge (best of {rounds}) | ratio |");
    println!("|---:|---:|---:|---:|");
    for &n in &sizes {
        let mut engine = Duration::MAX;
        let mut drover = Duration::MAX;
        for round in 0..rounds {
            engine = engine.min(direct(&docker, &image, n, round).await?);
            drover = drover.min(converge(&http, &base, &pool, n).await?);
        }
        println!(
            "| {n} | {:.2} s | {:.2} s | {:.2}x |",
            engine.as_secs_f64(),
            drover.as_secs_f64(),
            drover.as_secs_f64() / engine.as_secs_f64()
        );
    }

    // Rolling updates of 20 machines, next to the engine doing the same work
    // (create and start 20 new containers, remove 20 old ones) all at once.
    let n: usize = std::env::var("DROVER_BENCH_ROLLOUT").ok().and_then(|s| s.parse().ok()).unwrap_or(20);
    println!();
    println!(
        "| rolling update of {n} | engine direct (best of {rounds}) | drover rollout (best of {rounds}) | ratio |"
    );
    println!("|---|---:|---:|---:|");
    scale(&http, &base, &pool, n).await?;
    wait_ready(&http, &base, &pool, n).await?;
    let mut version = images::V1;
    for surge in [json!(5), json!("100%")] {
        patch(&http, &base, &pool, json!({"strategy": {"max_surge": surge, "max_unavailable": 0}})).await?;
        let (mut engine, mut drover) = (Duration::MAX, Duration::MAX);
        for round in 0..rounds {
            engine = engine.min(direct_replace(&docker, n, round).await?);
            version = if version == images::V1 { images::V2 } else { images::V1 };
            let started = Instant::now();
            patch(&http, &base, &pool, json!({"version": version})).await?;
            wait_rollout(&http, &base, &pool, n).await?;
            drover = drover.min(started.elapsed());
        }
        println!(
            "| surge {surge} | {:.2} s | {:.2} s | {:.2}x |",
            engine.as_secs_f64(),
            drover.as_secs_f64(),
            drover.as_secs_f64() / engine.as_secs_f64()
        );
    }

    http.delete(format!("{base}/v1/pools/{pool}")).send().await?;
    let deadline = Instant::now() + LIMIT;
    while http.get(format!("{base}/v1/pools/{pool}")).send().await?.status() != reqwest::StatusCode::NOT_FOUND {
        anyhow::ensure!(Instant::now() < deadline, "bench pool was not removed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    server.stop().await?;
    println!();
    println!("peak RSS of this process so far (drover in-process + the bench client): {} MiB", peak_rss_mib());

    simulated_scale().await
}

/// drover running in this process on a fresh data directory, and a client
/// that sends its admin token.
struct Server {
    base: String,
    http: reqwest::Client,
    stop: tokio::sync::oneshot::Sender<()>,
    handle: tokio::task::JoinHandle<anyhow::Result<()>>,
    _data: tempfile::TempDir,
}

impl Server {
    async fn start(runtime: RuntimeKind, max_replicas: u32) -> anyhow::Result<Self> {
        let data = tempfile::TempDir::new()?;
        let mut cfg = ServeConfig::for_data_dir(data.path().to_path_buf());
        cfg.runtime = runtime;
        cfg.max_replicas = max_replicas;
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

    async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        self.handle.await?
    }
}

/// Peak resident memory of this process, from /proc (Linux).
fn peak_rss_mib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).map(str::to_owned))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|kb| kb.parse::<u64>().ok()))
        .map_or(0, |kb| kb / 1024)
}

/// The reconciler and store at scale, without Docker's cost: one pool of
/// `DROVER_BENCH_SIMULATED` (default 1000) machines on the simulated runtime.
async fn simulated_scale() -> anyhow::Result<()> {
    let n: usize = std::env::var("DROVER_BENCH_SIMULATED").ok().and_then(|s| s.parse().ok()).unwrap_or(1000);
    let server = Server::start(RuntimeKind::Simulated, u32::try_from(n).unwrap_or(u32::MAX)).await?;
    let (base, http) = (server.base.clone(), server.http.clone());
    let res = http
        .post(format!("{base}/v1/pools"))
        .json(&json!({"name": "sim", "replicas": 0, "version": "v1.29.2", "image": "sim/node:1"}))
        .send()
        .await?;
    anyhow::ensure!(res.status().is_success(), "creating the simulated pool: {}", res.text().await?);
    let started = Instant::now();
    scale(&http, &base, "sim", n).await?;
    wait_ready(&http, &base, "sim", n).await?;
    let up = started.elapsed();
    let started = Instant::now();
    patch(&http, &base, "sim", json!({"image": "sim/node:2", "strategy": {"max_surge": "25%"}})).await?;
    wait_rollout(&http, &base, "sim", n).await?;
    let rolled = started.elapsed();
    let started = Instant::now();
    let list = http.get(format!("{base}/v1/pools/sim/machines?limit=500")).send().await?;
    anyhow::ensure!(list.status().is_success(), "listing machines");
    let page = started.elapsed();
    println!();
    println!("| simulated runtime, {n} machines | time |");
    println!("|---|---:|");
    println!("| converge 0 -> {n} | {:.2} s |", up.as_secs_f64());
    println!("| rolling update, surge 25% | {:.2} s |", rolled.as_secs_f64());
    println!("| GET one page of 500 machines | {:.1} ms |", page.as_secs_f64() * 1000.0);
    println!("peak RSS of this process after the simulated run: {} MiB", peak_rss_mib());
    server.stop().await
}

/// Creates and starts `n` containers at once straight through the engine;
/// returns the time until all run, then removes them (untimed).
async fn direct(docker: &Docker, image: &str, n: usize, round: usize) -> anyhow::Result<Duration> {
    let names: Vec<String> = (0..n).map(|i| format!("bench-direct-{}-{round}-{i}", std::process::id())).collect();
    let started = Instant::now();
    let results = join_all(names.iter().map(|name| async move {
        let body = ContainerCreateBody {
            image: Some(image.to_owned()),
            labels: Some(HashMap::from([("drover.bench".to_owned(), "direct".to_owned())])),
            ..Default::default()
        };
        let opts = CreateContainerOptionsBuilder::default().name(name).build();
        let created = docker.create_container(Some(opts), body).await?;
        docker.start_container(&created.id, None).await?;
        Ok::<_, bollard::errors::Error>(())
    }))
    .await;
    let elapsed = started.elapsed();
    let failed = results.iter().filter(|r| r.is_err()).count();
    join_all(names.iter().map(|name| async move {
        let opts = RemoveContainerOptionsBuilder::default().force(true).build();
        let _ = docker.remove_container(name, Some(opts)).await;
    }))
    .await;
    anyhow::ensure!(failed == 0, "{failed} of {n} direct creations failed");
    Ok(elapsed)
}

/// Scales the pool to `n`, waits for `n` ready machines, returns that time,
/// then scales back to 0 and waits for it (untimed).
async fn converge(http: &reqwest::Client, base: &str, pool: &str, n: usize) -> anyhow::Result<Duration> {
    let started = Instant::now();
    scale(http, base, pool, n).await?;
    wait_ready(http, base, pool, n).await?;
    let elapsed = started.elapsed();
    scale(http, base, pool, 0).await?;
    wait_ready(http, base, pool, 0).await?;
    Ok(elapsed)
}

/// The engine's own time for a whole replacement: `n` old containers exist;
/// create and start `n` new ones and remove the old, all at once.
async fn direct_replace(docker: &Docker, n: usize, round: usize) -> anyhow::Result<Duration> {
    let old: Vec<String> = (0..n).map(|i| format!("bench-old-{}-{round}-{i}", std::process::id())).collect();
    let new: Vec<String> = (0..n).map(|i| format!("bench-new-{}-{round}-{i}", std::process::id())).collect();
    let v1 = format!("kindest/node:{}", images::V1);
    let v2 = format!("kindest/node:{}", images::V2);
    join_all(old.iter().map(|name| run(docker, name, &v1))).await.into_iter().collect::<Result<Vec<_>, _>>()?;
    let started = Instant::now();
    let creates = join_all(new.iter().map(|name| run(docker, name, &v2)));
    let removes = join_all(old.iter().map(|name| remove(docker, name)));
    let (created, _) = tokio::join!(creates, removes);
    let elapsed = started.elapsed();
    join_all(new.iter().map(|name| remove(docker, name))).await;
    created.into_iter().collect::<Result<Vec<_>, _>>()?;
    Ok(elapsed)
}

async fn run(docker: &Docker, name: &str, image: &str) -> Result<(), bollard::errors::Error> {
    let body = ContainerCreateBody { image: Some(image.to_owned()), ..Default::default() };
    let created =
        docker.create_container(Some(CreateContainerOptionsBuilder::default().name(name).build()), body).await?;
    docker.start_container(&created.id, None).await
}

async fn remove(docker: &Docker, name: &str) {
    let _ = docker
        .stop_container(name, Some(bollard::query_parameters::StopContainerOptionsBuilder::default().t(10).build()))
        .await;
    let _ = docker.remove_container(name, Some(RemoveContainerOptionsBuilder::default().force(true).build())).await;
}

async fn patch(http: &reqwest::Client, base: &str, pool: &str, body: Value) -> anyhow::Result<()> {
    let res = http
        .patch(format!("{base}/v1/pools/{pool}"))
        .header("content-type", "application/merge-patch+json")
        .body(body.to_string())
        .send()
        .await?;
    anyhow::ensure!(res.status().is_success(), "patch {body}: {}", res.text().await?);
    Ok(())
}

async fn wait_rollout(http: &reqwest::Client, base: &str, pool: &str, n: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + LIMIT;
    loop {
        let p: Value = http.get(format!("{base}/v1/pools/{pool}")).send().await?.json().await?;
        let s = &p["status"];
        if s["observed_generation"] == p["generation"]
            && s["updated_replicas"] == n
            && s["ready_replicas"] == n
            && s["replicas"] == n
        {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "rollout never finished: {s}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn scale(http: &reqwest::Client, base: &str, pool: &str, n: usize) -> anyhow::Result<()> {
    let res = http.put(format!("{base}/v1/pools/{pool}/scale")).json(&json!({ "replicas": n })).send().await?;
    anyhow::ensure!(res.status().is_success(), "scale to {n}: {}", res.text().await?);
    Ok(())
}

async fn wait_ready(http: &reqwest::Client, base: &str, pool: &str, n: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + LIMIT;
    loop {
        let p: Value = http.get(format!("{base}/v1/pools/{pool}")).send().await?.json().await?;
        let s = &p["status"];
        if s["observed_generation"] == p["generation"] && s["ready_replicas"] == n && s["replicas"] == n {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "pool never reached {n} ready machines: {s}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
