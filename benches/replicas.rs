//! drover on PostgreSQL, and several replicas of it, measured in one run
//! beside what a user would pick instead (one drover on SQLite) and the
//! ceiling of the stack (a bare axum handler):
//!
//! - `stores`: one `drover serve --runtime simulated` on SQLite, then one on
//!   PostgreSQL, each fresh: 1,000 pools of 10 machines created by 8
//!   concurrent clients (every create's latency kept), the time until every
//!   machine is ready, and `GET /v1/pools/{name}` at 64 connections with
//!   `wrk`: 3 turns of 8 s of SQLite, PostgreSQL and a bare axum handler
//!   serving the same bytes, alternating; the median turn of each.
//! - `visibility`: two replicas on PostgreSQL; 1,000 writes (a label of one
//!   pool) through the first, each followed at once by reads through the
//!   second until it shows the write: the time from the write's answer to
//!   its first sight through the other replica.
//! - `failover`: two replicas on the Docker engine with `--lease-duration`
//!   `DROVER_BENCH_LEASE` (default 3s); a pool of 3 machines; its driver is
//!   SIGKILLed and the pool is scaled to 4 through the other replica at
//!   once. Measured: from the SIGKILL to the 4th machine ready, driven by
//!   the survivor. `DROVER_BENCH_TRIALS` trials (default 5).
//! - `scale`: 3 replicas (`--lease-duration` `DROVER_BENCH_LEASE`),
//!   10,000 pools of 10 simulated machines created through all three: the
//!   time until every machine is ready (counted in the database), each
//!   replica's CPU over 60 s of idling once converged, and whether any pool
//!   is driven twice (an unexpired lease per pool, and every pool's
//!   `status.driver` is its lease's holder).
//!
//! Run: `cargo bench --bench replicas` (needs `wrk` and Docker; starts its
//! own PostgreSQL server, as the tests do). `DROVER_BENCH_PARTS` (default
//! `stores,visibility,failover,scale`), `DROVER_BENCH_POOLS` (scale,
//! default 10000), `DROVER_BENCH_IDLE` (seconds, default 60).

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sqlx::Connection;

// Bounded docker CLI calls, shared with the tests.
#[allow(dead_code)]
#[path = "../tests/support/command.rs"]
mod command;
#[path = "support/measure.rs"]
mod measure;
// Shared with the tests, which use more of them.
#[allow(dead_code)]
#[path = "../tests/support/images.rs"]
mod images;
#[allow(dead_code)]
#[path = "../tests/support/postgres.rs"]
mod postgres;

use measure::{bare, percentile, usage, wrk};

const MACHINES: u32 = 10;
const CREATORS: usize = 8;
const LIMIT: Duration = Duration::from_secs(1200);

/// A `drover serve` of the release build.
struct Server {
    child: Child,
    base: String,
    data: tempfile::TempDir,
}

impl Server {
    async fn start(args: &[&str]) -> anyhow::Result<Self> {
        let data = tempfile::TempDir::new()?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new(env!("CARGO_BIN_EXE_drover"))
            .args(["serve", "--log-level", "warn", "--max-replicas", "100", "--listen", &format!("127.0.0.1:{port}")])
            .arg("--data-dir")
            .arg(data.path())
            .args(args)
            .stdout(Stdio::null())
            .spawn()?;
        let base = format!("http://127.0.0.1:{port}");
        let started = Instant::now();
        while reqwest::get(format!("{base}/healthz")).await.is_err() {
            anyhow::ensure!(started.elapsed() < Duration::from_secs(30), "drover did not come up");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(Self { child, base, data })
    }

    fn token(&self) -> Option<String> {
        std::fs::read_to_string(self.data.path().join("admin.token")).ok().map(|t| t.trim().to_owned())
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

fn client(token: &str) -> anyhow::Result<reqwest::Client> {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(reqwest::header::AUTHORIZATION, format!("Bearer {token}").parse()?);
    Ok(reqwest::Client::builder().default_headers(headers).pool_max_idle_per_host(64).build()?)
}

fn name(i: usize) -> String {
    format!("p{i:05}")
}

/// Creates `pools` pools through `bases` in turn from 8 clients; every
/// create's latency in ms.
async fn create(http: &reqwest::Client, bases: &[String], pools: usize, image: &str) -> anyhow::Result<Vec<f64>> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(pools)));
    let creators: Vec<_> = (0..CREATORS)
        .map(|_| {
            let (http, bases, next, latencies) = (http.clone(), bases.to_vec(), next.clone(), latencies.clone());
            let image = image.to_owned();
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    if i >= pools {
                        return Ok::<_, anyhow::Error>(());
                    }
                    let body = json!({"name": name(i), "replicas": MACHINES, "version": "v1.29.2", "image": image});
                    let t = Instant::now();
                    let res = http.post(format!("{}/v1/pools", bases[i % bases.len()])).json(&body).send().await?;
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
    Ok(latencies.lock().map(|l| l.clone()).unwrap_or_default())
}

/// Ready machines, counted in the store.
async fn ready(store: &Store) -> anyhow::Result<i64> {
    Ok(match store {
        Store::Sqlite(path) => {
            let url = format!("sqlite://{}?mode=ro", path.display());
            let mut c = sqlx::SqliteConnection::connect(&url).await?;
            sqlx::query_scalar("select count(*) from machines where ready = 1").fetch_one(&mut c).await?
        }
        Store::Postgres(url) => {
            let mut c = sqlx::PgConnection::connect(url).await?;
            sqlx::query_scalar("select count(*) from machines where ready").fetch_one(&mut c).await?
        }
    })
}

enum Store {
    Sqlite(std::path::PathBuf),
    Postgres(String),
}

async fn wait_ready(store: &Store, want: i64) -> anyhow::Result<Duration> {
    let started = Instant::now();
    while ready(store).await? < want {
        anyhow::ensure!(started.elapsed() < LIMIT, "never converged");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(started.elapsed())
}

struct StoreRow {
    creates: (f64, f64, f64),
    converged: Duration,
    get: (f64, f64),
}

/// Seconds of each `wrk` turn, and turns of each server.
const TURN_SECS: u32 = 8;
const TURNS: usize = 3;

/// One drover on each store, the GET turns alternating between them.
async fn stores(pg: &postgres::PgServer) -> anyhow::Result<()> {
    const POOLS: usize = 1000;
    let url = pg.fresh_database();
    let mut rows = Vec::new();
    let mut servers = Vec::new();
    for store in [None, Some(url.as_str())] {
        let mut args = vec!["--runtime", "simulated"];
        if let Some(url) = store {
            args.extend(["--database-url", url]);
        }
        let server = Server::start(&args).await?;
        let token = server.token().ok_or_else(|| anyhow::anyhow!("no admin token"))?;
        let http = client(&token)?;
        let started = Instant::now();
        let mut creates = create(&http, std::slice::from_ref(&server.base), POOLS, "sim/node:1").await?;
        eprintln!("{POOLS} pools created in {:.1} s", started.elapsed().as_secs_f64());
        let counted = match store {
            None => Store::Sqlite(server.data.path().join("drover.db")),
            Some(url) => Store::Postgres(url.to_owned()),
        };
        let converged = wait_ready(&counted, (POOLS as i64) * i64::from(MACHINES)).await?;
        rows.push(StoreRow {
            creates: (percentile(&mut creates, 0.5), percentile(&mut creates, 0.99), percentile(&mut creates, 1.0)),
            converged,
            get: (0.0, 0.0),
        });
        servers.push((server, token));
    }
    // The bare handler serves the bytes drover answers for the same pool.
    let (sqlite, token) = &servers[0];
    let path = format!("/v1/pools/{}", name(10));
    let body = client(token)?.get(format!("{}{path}", sqlite.base)).send().await?.bytes().await?;
    let ceiling = bare(body.to_vec(), &path).await?;
    let mut targets: Vec<(String, Option<&str>)> =
        servers.iter().map(|(s, t)| (format!("{}{path}", s.base), Some(t.as_str()))).collect();
    targets.push((ceiling, None));
    let mut turns: Vec<Vec<(f64, f64)>> = vec![Vec::new(); targets.len()];
    for _ in 0..TURNS {
        for (i, (url, token)) in targets.iter().enumerate() {
            turns[i].push(wrk(url, *token, TURN_SECS)?);
        }
    }
    let medians: Vec<(f64, f64)> = turns
        .into_iter()
        .map(|mut t| {
            t.sort_by(|a, b| a.0.total_cmp(&b.0));
            t[TURNS / 2]
        })
        .collect();
    for (row, median) in rows.iter_mut().zip(&medians) {
        row.get = *median;
    }
    println!(
        "\n| store | create p50 / p99 / max | all 10,000 machines ready after the last create | GET at 64 conn (median of {TURNS} turns of {TURN_SECS} s) | GET / SQLite's | GET / bare axum's |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let (sqlite_get, bare_get) = (rows[0].get.0, medians[2].0);
    for (label, r) in ["SQLite (embedded)", "PostgreSQL (same host)"].iter().zip(&rows) {
        println!(
            "| {label} | {:.1} / {:.1} / {:.1} ms | {:.1} s | {:.0} req/s, p99 {:.2} ms | {:.0}% | {:.0}% |",
            r.creates.0,
            r.creates.1,
            r.creates.2,
            r.converged.as_secs_f64(),
            r.get.0,
            r.get.1,
            r.get.0 / sqlite_get * 100.0,
            r.get.0 / bare_get * 100.0,
        );
    }
    println!("| bare axum handler, same bytes | | | {:.0} req/s, p99 {:.2} ms | | |", medians[2].0, medians[2].1);
    println!(
        "\ncreate p99, PostgreSQL / SQLite: {:.2}x (target at most 2x)",
        rows[1].creates.1 / rows[0].creates.1.max(0.001)
    );
    let (pg, token) = &servers[1];
    let metrics = client(token)?.get(format!("{}/metrics", pg.base)).send().await?.text().await?;
    let sum = |family: &str| -> f64 {
        metrics
            .lines()
            .filter(|l| l.starts_with(family))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    println!(
        "PostgreSQL: {:.0} pool reads from the cache, {:.0} from the store, {:.0} read barriers ({:.1} reads each)",
        sum("drover_pool_reads_total{source=\"cache\"}"),
        sum("drover_pool_reads_total{source=\"store"),
        sum("drover_read_barriers_total"),
        sum("drover_pool_reads_total") / sum("drover_read_barriers_total").max(1.0)
    );
    Ok(())
}

/// Writes through one replica, read through the other: how long after
/// its answer a write is seen.
async fn visibility(pg: &postgres::PgServer) -> anyhow::Result<()> {
    const WRITES: usize = 1000;
    let url = pg.fresh_database();
    let args = ["--runtime", "simulated", "--database-url", url.as_str(), "--lease-duration", "3s"];
    let a = Server::start(&args).await?;
    let b = Server::start(&args).await?;
    let token = a.token().or_else(|| b.token()).ok_or_else(|| anyhow::anyhow!("no admin token"))?;
    let http = client(&token)?;
    let body = json!({"name": "seen", "replicas": 0, "version": "v1.29.2"});
    let res = http.post(format!("{}/v1/pools", a.base)).json(&body).send().await?;
    anyhow::ensure!(res.status().as_u16() == 201, "create: {}", res.status());
    let (mut lags, mut first_read_current) = (Vec::with_capacity(WRITES), 0);
    for i in 0..WRITES {
        let res = http
            .patch(format!("{}/v1/pools/seen", a.base))
            .header("content-type", "application/merge-patch+json")
            .body(json!({"labels": {"write": i.to_string()}}).to_string())
            .send()
            .await?;
        anyhow::ensure!(res.status().is_success(), "write {i}: {}", res.status());
        let written = res.json::<Value>().await?["generation"].as_i64().unwrap_or(i64::MAX);
        let answered = Instant::now();
        for read in 0.. {
            let seen = pool(&http, &b.base, "seen").await["generation"].as_i64().unwrap_or(0);
            if seen >= written {
                first_read_current += usize::from(read == 0);
                break;
            }
            anyhow::ensure!(answered.elapsed() < Duration::from_secs(10), "write {i} never seen through b");
        }
        lags.push(answered.elapsed().as_secs_f64() * 1000.0);
    }
    println!(
        "\n| writes through replica A | seen through replica B after: p50 / p99 / max | first read through B already current | target |"
    );
    println!("|---:|---:|---:|---:|");
    println!(
        "| {WRITES} | {:.2} / {:.2} / {:.2} ms | {first_read_current} of {WRITES} | p99 < 50 ms |",
        percentile(&mut lags, 0.5),
        percentile(&mut lags, 0.99),
        percentile(&mut lags, 1.0)
    );
    Ok(())
}

async fn pool(http: &reqwest::Client, base: &str, name: &str) -> Value {
    match http.get(format!("{base}/v1/pools/{name}")).send().await {
        Ok(r) => r.json().await.unwrap_or(Value::Null),
        Err(_) => Value::Null,
    }
}

/// SIGKILL of a pool's driver, then a scale through the other replica: how
/// long until the change is applied.
async fn failover(pg: &postgres::PgServer, lease: &str, trials: usize) -> anyhow::Result<()> {
    images::build_once();
    let mut samples = Vec::new();
    for trial in 0..trials {
        let url = pg.fresh_database();
        let args = ["--database-url", url.as_str(), "--stop-timeout", "2s", "--lease-duration", lease];
        let mut a = Server::start(&args).await?;
        let mut b = Server::start(&args).await?;
        let token = a.token().or_else(|| b.token()).ok_or_else(|| anyhow::anyhow!("no admin token"))?;
        let http = client(&token)?;
        let pool_name = format!("failover-{}-{trial}", std::process::id());
        let body = json!({"name": pool_name, "replicas": 3, "version": images::V1});
        let res = http.post(format!("{}/v1/pools", a.base)).json(&body).send().await?;
        anyhow::ensure!(res.status().as_u16() == 201, "create: {}", res.status());
        let started = Instant::now();
        let driver = loop {
            let p = pool(&http, &a.base, &pool_name).await;
            if p["status"]["ready_replicas"] == 3 && p["status"]["driver"].is_string() {
                break p["status"]["driver"].as_str().unwrap_or_default().to_owned();
            }
            anyhow::ensure!(started.elapsed() < LIMIT, "the pool never got ready");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let a_drives = driver.contains(&format!("-{}-", a.child.id()));
        let (victim, survivor) = if a_drives { (&mut a, &mut b) } else { (&mut b, &mut a) };
        let killed = Instant::now();
        victim.kill();
        let survivor_pid = format!("-{}-", survivor.child.id());
        let res = http
            .patch(format!("{}/v1/pools/{pool_name}", survivor.base))
            .header("content-type", "application/merge-patch+json")
            .body(json!({"replicas": 4}).to_string())
            .send()
            .await?;
        anyhow::ensure!(res.status().is_success(), "scale: {}", res.status());
        loop {
            let p = pool(&http, &survivor.base, &pool_name).await;
            let by_survivor = p["status"]["driver"].as_str().is_some_and(|d| d.contains(&survivor_pid));
            if by_survivor && p["status"]["ready_replicas"] == 4 {
                break;
            }
            anyhow::ensure!(killed.elapsed() < LIMIT, "the survivor never applied the change");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let took = killed.elapsed();
        eprintln!("trial {trial}: the change applied {:.2} s after the driver's SIGKILL", took.as_secs_f64());
        samples.push(took.as_secs_f64());
        // The survivor first, or it would replace what is removed.
        a.kill();
        b.kill();
        let ids = command::docker(&["ps", "-aq", "--filter", &format!("label=drover.dev/pool={pool_name}")])
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let ids: Vec<&str> = ids.split_whitespace().collect();
        if !ids.is_empty() {
            command::docker(&[&["rm", "-f"][..], &ids].concat()).map_err(|e| anyhow::anyhow!("{e}"))?;
        }
    }
    let mut sorted = samples.clone();
    println!("\n| lease | SIGKILL of the driver -> the next change applied by the other replica ({trials} trials) |");
    println!("|---:|---:|");
    println!(
        "| {lease} | {} (median {:.1} s, worst {:.1} s) |",
        samples.iter().map(|s| format!("{s:.1} s")).collect::<Vec<_>>().join(", "),
        percentile(&mut sorted, 0.5),
        percentile(&mut sorted, 1.0)
    );
    Ok(())
}

/// 3 replicas, thousands of pools.
async fn scale(pg: &postgres::PgServer, pools: usize, idle: Duration, lease: &str) -> anyhow::Result<()> {
    let url = pg.fresh_database();
    let args = ["--runtime", "simulated", "--database-url", url.as_str(), "--lease-duration", lease];
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(Server::start(&args).await?);
    }
    let token = replicas.iter().find_map(Server::token).ok_or_else(|| anyhow::anyhow!("no admin token"))?;
    let http = client(&token)?;
    let bases: Vec<String> = replicas.iter().map(|r| r.base.clone()).collect();
    let started = Instant::now();
    let mut creates = create(&http, &bases, pools, "sim/node:1").await?;
    let created = started.elapsed();
    let converged = wait_ready(&Store::Postgres(url.clone()), pools as i64 * i64::from(MACHINES)).await?;
    eprintln!(
        "{pools} pools: created in {:.1} s, all ready {:.1} s later",
        created.as_secs_f64(),
        converged.as_secs_f64()
    );

    tokio::time::sleep(Duration::from_secs(5)).await;
    let before: Vec<f64> = replicas.iter().map(|r| usage(r.child.id()).map_or(0.0, |u| u.0)).collect();
    tokio::time::sleep(idle).await;
    let after: Vec<(f64, measure::Rss)> =
        replicas.iter().map(|r| usage(r.child.id()).unwrap_or((0.0, measure::Rss::default()))).collect();
    let cpu: Vec<f64> = before.iter().zip(&after).map(|(b, a)| (a.0 - b) / idle.as_secs_f64() * 100.0).collect();

    let mut db = sqlx::PgConnection::connect(&url).await?;
    let per_replica: Vec<(String, i64)> = sqlx::query_as(
        "select holder, count(*) from leases where kind = 'pool' and expires_at > now() group by holder order by holder",
    )
    .fetch_all(&mut db)
    .await?;
    let unleased: i64 = sqlx::query_scalar(
        "select count(*) from pools p where not exists
           (select 1 from leases l where l.kind = 'pool' and l.name = p.name and l.expires_at > now())",
    )
    .fetch_one(&mut db)
    .await?;
    let mismatched: i64 = sqlx::query_scalar(
        "select count(*) from pools p join leases l on l.kind = 'pool' and l.name = p.name
         where (p.status::jsonb ->> 'driver') is distinct from l.holder",
    )
    .fetch_one(&mut db)
    .await?;
    println!(
        "\n| replicas | pools x machines | create p50 / p99 (through all 3) | all ready after the last create | leases per replica | pools without a lease / driven by another than the holder | idle CPU per replica ({} s) | RSS per replica |",
        idle.as_secs()
    );
    println!("|---:|---:|---:|---:|---|---:|---|---|");
    println!(
        "| 3 | {pools} x {MACHINES} | {:.1} / {:.1} ms | {:.1} s | {} | {unleased} / {mismatched} | {} | {} |",
        percentile(&mut creates, 0.5),
        percentile(&mut creates, 0.99),
        converged.as_secs_f64(),
        per_replica.iter().map(|(_, n)| n.to_string()).collect::<Vec<_>>().join(", "),
        cpu.iter().map(|c| format!("{c:.1}%")).collect::<Vec<_>>().join(", "),
        after.iter().map(|(_, r)| format!("{:.0} MiB", r.total)).collect::<Vec<_>>().join(", "),
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let parts = std::env::var("DROVER_BENCH_PARTS").unwrap_or_else(|_| "stores,visibility,failover,scale".into());
    let pools = std::env::var("DROVER_BENCH_POOLS").ok().and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let idle = Duration::from_secs(std::env::var("DROVER_BENCH_IDLE").ok().and_then(|s| s.parse().ok()).unwrap_or(60));
    let lease = std::env::var("DROVER_BENCH_LEASE").unwrap_or_else(|_| "3s".into());
    let trials = std::env::var("DROVER_BENCH_TRIALS").ok().and_then(|s| s.parse().ok()).unwrap_or(5);
    // Durable, as in production: the comparison with SQLite is fair.
    let pg = postgres::PgServer::start_durable().map_err(|e| anyhow::anyhow!(e))?;
    for part in parts.split(',').map(str::trim) {
        match part {
            "stores" => stores(&pg).await?,
            "visibility" => visibility(&pg).await?,
            "failover" => failover(&pg, &lease, trials).await?,
            "scale" => scale(&pg, pools, idle, &lease).await?,
            other => anyhow::bail!("unknown part {other:?}: stores, visibility, failover or scale"),
        }
    }
    Ok(())
}
