//! Thousands of pools on the simulated runtime, and an API that stays
//! responsive meanwhile.
//!
//! For each size (default 1,000, 3,000 and 10,000 pools of 10 machines), a
//! fresh `drover serve --runtime simulated` process (the release binary):
//! - pools are created through the API by 8 concurrent clients; every
//!   create's latency is kept, and `GET /v1/pools/{name}` of an early pool
//!   is timed every 50 ms throughout;
//! - convergence: the time from the last create until every machine is
//!   ready (counted in drover's store, read-only);
//! - idle: the process's CPU over 60 s once converged, and its RSS;
//! - `GET /v1/pools/{name}` at 64 connections with `wrk`, in turns with a
//!   bare axum handler, built here, serving the same bytes (3 turns of 5 s
//!   each; the median turn is reported).
//!
//! Run: `cargo bench --bench scale` (needs `wrk`: apt-get install wrk).
//! `DROVER_BENCH_POOLS=1000,3000,10000`, `DROVER_BENCH_IDLE=60` (seconds).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

#[path = "support/measure.rs"]
mod measure;
use measure::{Rss, bare, percentile, usage, wrk};

const MACHINES: u32 = 10;
const CREATORS: usize = 8;
const LIMIT: Duration = Duration::from_secs(900);

struct Server {
    child: Child,
    base: String,
    http: reqwest::Client,
    data: tempfile::TempDir,
}

impl Server {
    async fn start() -> anyhow::Result<Self> {
        let data = tempfile::TempDir::new()?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new(env!("CARGO_BIN_EXE_drover"))
            .args(["serve", "--runtime", "simulated", "--log-level", "warn", "--max-replicas", "100"])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--data-dir")
            .arg(data.path())
            .stdout(Stdio::null())
            .spawn()?;
        let base = format!("http://127.0.0.1:{port}");
        let started = Instant::now();
        while reqwest::get(format!("{base}/healthz")).await.is_err() {
            anyhow::ensure!(started.elapsed() < Duration::from_secs(30), "drover did not come up");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let token = std::fs::read_to_string(data.path().join("admin.token"))?;
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(reqwest::header::AUTHORIZATION, format!("Bearer {}", token.trim()).parse()?);
        let http = reqwest::Client::builder().default_headers(headers).pool_max_idle_per_host(64).build()?;
        Ok(Self { child, base, http, data })
    }

    fn token(&self) -> anyhow::Result<String> {
        Ok(std::fs::read_to_string(self.data.path().join("admin.token"))?.trim().to_owned())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn name(i: usize) -> String {
    format!("p{i:05}")
}

/// Ready machines, read from drover's store (SQLite allows readers beside
/// the writer in WAL mode).
async fn ready_machines(data: &Path) -> anyhow::Result<i64> {
    let url = format!("sqlite://{}?mode=ro", data.join("drover.db").display());
    let mut conn = <sqlx::SqliteConnection as sqlx::Connection>::connect(&url).await?;
    let n: i64 = sqlx::query_scalar("select count(*) from machines where ready = 1").fetch_one(&mut conn).await?;
    Ok(n)
}

struct Row {
    pools: usize,
    create_p50: f64,
    create_p99: f64,
    create_max: f64,
    get_p99_during: f64,
    creating: Duration,
    converged_after: Duration,
    idle_cpu: f64,
    rss: Rss,
    /// The median pair of [`PAIRS`] (by ratio), and the lowest and
    /// highest ratio of all.
    drover: (f64, f64),
    bare: (f64, f64),
    ratios: (f64, f64),
}

/// drover and the bare handler are measured in turns, this many times for
/// [`PAIR_SECS`] each, so that a change in the machine's speed during the
/// run (other processes, CPU frequency) lands on both alike.
const PAIRS: usize = 3;
const PAIR_SECS: u32 = 5;

async fn run(pools: usize, idle: Duration) -> anyhow::Result<Row> {
    let server = Arc::new(Server::start().await?);
    let pid = server.child.id();
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(pools)));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // An early pool read throughout.
    let probe = {
        let (server, done) = (server.clone(), done.clone());
        tokio::spawn(async move {
            let mut samples = Vec::new();
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                let started = Instant::now();
                let res = server.http.get(format!("{}/v1/pools/{}", server.base, name(10))).send().await;
                if res.is_ok_and(|r| r.status().is_success()) {
                    samples.push(started.elapsed().as_secs_f64() * 1000.0);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            samples
        })
    };
    let started = Instant::now();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let creators: Vec<_> = (0..CREATORS)
        .map(|_| {
            let (server, next, latencies) = (server.clone(), next.clone(), latencies.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    if i >= pools {
                        return Ok::<_, anyhow::Error>(());
                    }
                    let body =
                        json!({"name": name(i), "replicas": MACHINES, "version": "v1.29.2", "image": "sim/node:1"});
                    let t = Instant::now();
                    let res = server.http.post(format!("{}/v1/pools", server.base)).json(&body).send().await?;
                    anyhow::ensure!(res.status().as_u16() == 201, "create {}: {}", name(i), res.status());
                    if let Ok(mut l) = latencies.lock() {
                        l.push(t.elapsed().as_secs_f64() * 1000.0);
                    }
                }
            })
        })
        .collect();
    for c in creators {
        c.await??;
    }
    let creating = started.elapsed();
    let last_create = Instant::now();
    let want = pools as i64 * i64::from(MACHINES);
    loop {
        if ready_machines(server.data.path()).await? == want {
            break;
        }
        anyhow::ensure!(last_create.elapsed() < LIMIT, "{pools} pools never converged");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let converged_after = last_create.elapsed();
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut during = probe.await?;

    tokio::time::sleep(Duration::from_secs(5)).await;
    let (cpu0, _) = usage(pid)?;
    tokio::time::sleep(idle).await;
    let (cpu1, rss) = usage(pid)?;
    let idle_cpu = (cpu1 - cpu0) / idle.as_secs_f64() * 100.0;

    let url = format!("{}/v1/pools/{}", server.base, name(10));
    let body = server.http.get(&url).send().await?.bytes().await?.to_vec();
    let (token, bare) = (server.token()?, bare(body, "/v1/pools/p00010").await?);
    let mut pairs = Vec::with_capacity(PAIRS);
    for _ in 0..PAIRS {
        let ours = wrk(&url, Some(&token), PAIR_SECS)?;
        pairs.push((ours, wrk(&bare, None, PAIR_SECS)?));
    }
    let ratio = |p: &((f64, f64), (f64, f64))| p.0.0 / p.1.0;
    pairs.sort_by(|a, b| ratio(a).total_cmp(&ratio(b)));
    let ratios = (pairs.first().map_or(0.0, ratio), pairs.last().map_or(0.0, ratio));
    let (drover, bare) = pairs[PAIRS / 2];

    let mut creates = latencies.lock().map(|l| l.clone()).unwrap_or_default();
    Ok(Row {
        pools,
        create_p50: percentile(&mut creates, 0.5),
        create_p99: percentile(&mut creates, 0.99),
        create_max: percentile(&mut creates, 1.0),
        get_p99_during: percentile(&mut during, 0.99),
        creating,
        converged_after,
        idle_cpu,
        rss,
        drover,
        bare,
        ratios,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let sizes: Vec<usize> = std::env::var("DROVER_BENCH_POOLS")
        .unwrap_or_else(|_| "1000,3000,10000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let idle = Duration::from_secs(std::env::var("DROVER_BENCH_IDLE").ok().and_then(|s| s.parse().ok()).unwrap_or(60));
    let mut rows = Vec::new();
    for n in sizes {
        eprintln!("{n} pools of {MACHINES} machines...");
        rows.push(run(n, idle).await?);
    }
    println!(
        "| pools | create p50 / p99 / max | GET p99 while creating | all created in | all ready after last create | idle CPU ({} s) | RSS (private) | GET at 64 conn: drover | bare axum | drover / bare (range of {PAIRS} turns) |",
        idle.as_secs()
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {:.1} / {:.1} / {:.1} ms | {:.1} ms | {:.1} s | {:.1} s | {:.1}% | {:.0} MiB ({:.0} MiB) | {:.0} req/s, p99 {:.2} ms | {:.0} req/s, p99 {:.2} ms | {:.0}% ({:.0}-{:.0}%) |",
            r.pools,
            r.create_p50,
            r.create_p99,
            r.create_max,
            r.get_p99_during,
            r.creating.as_secs_f64(),
            r.converged_after.as_secs_f64(),
            r.idle_cpu,
            r.rss.total,
            r.rss.anon,
            r.drover.0,
            r.drover.1,
            r.bare.0,
            r.bare.1,
            r.drover.0 / r.bare.0 * 100.0,
            r.ratios.0 * 100.0,
            r.ratios.1 * 100.0
        );
    }
    Ok(())
}
