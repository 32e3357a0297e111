//! The price of least privilege: the same requests with a token granted one
//! namespace of many and with a `*` admin token, in one run of one server.
//!
//! A fresh release `drover serve --runtime simulated` process; 100
//! namespaces of 100 pools each (10,000 pools, 0 replicas: nothing to
//! reconcile), made through the API. Then:
//!
//! 1. `wrk` at 64 connections on `GET /v1/pools/web-0?namespace=ns-0`, in
//!    alternating turns of `DROVER_BENCH_SECS` (default 10) seconds: admin
//!    token, scoped token (a viewer of ns-0 alone), ... (`DROVER_BENCH_TURNS`,
//!    default 3 each); the median turn of each, and their ratio.
//! 2. One page (the default limit) of `GET /v1/pools?namespace=ns-0` and of
//!    `GET /v1/pools?namespace=*` as the scoped token, 1,000 times each,
//!    one at a time: p50 and p99, and that every pool on them is ns-0's.
//!
//! Peers in the same run: the bare axum handler (the stack's ceiling) on
//! the same body.
//!
//! Run: `cargo bench --bench namespaces` (needs `wrk`: apt-get install wrk).
//! `DROVER_BENCH_NAMESPACES` and `DROVER_BENCH_POOLS_EACH` change the fleet.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

#[path = "support/measure.rs"]
mod measure;
use measure::{Server, bare, env_or, percentile, wrk};

async fn start(dir: &std::path::Path) -> anyhow::Result<Server> {
    let data = dir.join("data");
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let child = Command::new(env!("CARGO_BIN_EXE_drover"))
        .args(["serve", "--runtime", "simulated", "--log-level", "warn"])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .arg("--data-dir")
        .arg(&data)
        .stdout(Stdio::null())
        .spawn()?;
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build()?;
    Server::ready(child, base, http, &data).await
}

impl Server {
    async fn post(&self, path: &str, body: Value) -> anyhow::Result<Value> {
        let res = self.http.post(format!("{}{path}", self.base)).bearer_auth(&self.token).json(&body).send().await?;
        let status = res.status();
        let answer: Value = res.json().await.unwrap_or(Value::Null);
        anyhow::ensure!(status.is_success(), "POST {path}: {status} {answer}");
        Ok(answer)
    }
}

/// `n` sequential GETs of `path` with `token`: their latencies (ms) and
/// the last answer.
async fn timed(s: &Server, token: &str, path: &str, n: usize) -> anyhow::Result<(Vec<f64>, Value)> {
    let mut took = Vec::with_capacity(n);
    let mut last = Value::Null;
    for _ in 0..n {
        let t = Instant::now();
        let res = s.http.get(format!("{}{path}", s.base)).bearer_auth(token).send().await?;
        anyhow::ensure!(res.status().is_success(), "GET {path}: {}", res.status());
        last = res.json().await?;
        took.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    Ok((took, last))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let secs = env_or("DROVER_BENCH_SECS", 10);
    let turns = env_or("DROVER_BENCH_TURNS", 3);
    let namespaces = env_or("DROVER_BENCH_NAMESPACES", 100);
    let each = env_or("DROVER_BENCH_POOLS_EACH", 100);
    let dir = tempfile::TempDir::new()?;
    let server = start(dir.path()).await?;

    let made = Instant::now();
    for n in 0..namespaces {
        let ns = format!("ns-{n}");
        server.post("/v1/namespaces", json!({"name": ns})).await?;
        for p in 0..each {
            let pool = json!({"name": format!("web-{p}"), "replicas": 0, "version": "v1.29.2"});
            server.post(&format!("/v1/pools?namespace={ns}"), pool).await?;
        }
    }
    eprintln!("{} pools in {namespaces} namespaces made in {:.0?}", namespaces * each, made.elapsed());
    let grants = json!([{"namespace": "ns-0", "role": "viewer"}]);
    let scoped = server.post("/v1/tokens", json!({"name": "ns-0-viewer", "grants": grants})).await?;
    let scoped = scoped["token"].as_str().ok_or_else(|| anyhow::anyhow!("no secret in {scoped}"))?.to_owned();

    let url = format!("{}/v1/pools/web-0?namespace=ns-0", server.base);
    let body = server.http.get(&url).bearer_auth(&server.token).send().await?.bytes().await?.to_vec();
    let ceiling = bare(body, "/v1/pools/web-0").await?;
    let (mut admin, mut narrow, mut axum) = (Vec::new(), Vec::new(), Vec::new());
    for turn in 1..=turns {
        eprintln!("turn {turn}/{turns}: `*` admin, scoped token, bare axum ({secs} s each)");
        admin.push(wrk(&url, Some(&server.token), secs)?);
        narrow.push(wrk(&url, Some(&scoped), secs)?);
        axum.push(wrk(&ceiling, None, secs)?);
    }
    let median = |runs: &[(f64, f64)]| {
        let mut rps: Vec<f64> = runs.iter().map(|r| r.0).collect();
        let mut p99: Vec<f64> = runs.iter().map(|r| r.1).collect();
        (percentile(&mut rps, 0.5), percentile(&mut p99, 0.5))
    };
    let turns_of = |runs: &[(f64, f64)]| runs.iter().map(|r| format!("{:.0}", r.0)).collect::<Vec<_>>().join(", ");
    let (admin_rps, admin_p99) = median(&admin);
    let (narrow_rps, narrow_p99) = median(&narrow);
    let (axum_rps, axum_p99) = median(&axum);
    println!(
        "\nGET /v1/pools/web-0?namespace=ns-0, {} pools in {namespaces} namespaces, wrk -t2 -c64, \
         {turns} turns of {secs} s, median turn:\n",
        namespaces * each
    );
    println!("| credential | requests/s | p99 (ms) | every turn (req/s) |");
    println!("|---|---:|---:|---|");
    println!("| `*` admin token | {admin_rps:.0} | {admin_p99:.2} | {} |", turns_of(&admin));
    println!("| token granted ns-0 alone (viewer) | {narrow_rps:.0} | {narrow_p99:.2} | {} |", turns_of(&narrow));
    println!("| bare axum handler, same body | {axum_rps:.0} | {axum_p99:.2} | {} |", turns_of(&axum));
    println!("\nscoped / admin throughput: {:.0}%", 100.0 * narrow_rps / admin_rps);

    println!("\nOne page of pools as the token granted ns-0 alone, 1,000 requests one at a time:\n");
    println!("| request | p50 (ms) | p99 (ms) | pools on the page | all ns-0's |");
    println!("|---|---:|---:|---:|---|");
    for path in ["/v1/pools?namespace=ns-0", "/v1/pools?namespace=*"] {
        let (mut took, page) = timed(&server, &scoped, path, 1000).await?;
        let items = page["items"].as_array().cloned().unwrap_or_default();
        let own = items.iter().all(|p| p["namespace"] == "ns-0");
        let (p50, p99) = (percentile(&mut took, 0.5), percentile(&mut took, 0.99));
        println!("| `GET {path}` | {p50:.2} | {p99:.2} | {} | {own} |", items.len());
        anyhow::ensure!(own, "a page of {path} showed another namespace's pool");
    }
    drop(server);
    Ok(())
}
