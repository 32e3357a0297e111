//! The price of trace export (issue 37), side by side in one run.
//!
//! 1. `GET /v1/pools/{name}` at 64 connections (`wrk`) against three
//!    release `drover serve --runtime simulated` processes, started once
//!    and kept for every turn, each with the same fleet (`DROVER_BENCH_POOLS`,
//!    default 100, 0 replicas): export off; export on with
//!    `OTEL_TRACES_SAMPLER=traceidratio OTEL_TRACES_SAMPLER_ARG=0.1`; export
//!    on with `always_on`. Turns of `DROVER_BENCH_SECS` (default 10) seconds
//!    alternate (off, 10%, 100%, bare axum, off, ...; `DROVER_BENCH_TURNS`,
//!    default 3, after an unmeasured warm-up of each); the median turn of each
//!    and its ratio to export off. The bare axum handler on the same body is
//!    the stack's ceiling. Targets: 10% >= 95% of off, 100% >= 80%.
//! 2. 0 -> `DROVER_BENCH_N` (default 50) machines of one pool on the real
//!    Docker engine, two `drover serve` processes (export off, export on
//!    with `always_on`), `DROVER_BENCH_RUNS` (default 3) alternating runs
//!    each: from the `POST /v1/pools` to the engine listing every machine
//!    running, and to drover's status saying every one ready. The pool is
//!    deleted, and its containers waited out, between runs. Target: on
//!    within 3% of off.
//!
//! Export goes to a minimal OTLP/HTTP sink in this process (one per drover
//! process) that answers every `POST /v1/traces` with 200 and an empty
//! protobuf body, counting the posts and bytes it received; it decodes the
//! first post (all of them for the Docker runs) to show which spans went
//! out. Spans drover dropped come from its own `/metrics`.
//!
//! Run: `cargo bench --bench traces` (needs `wrk` and Docker; builds the
//! test images as the tests do, no registry).

#[allow(dead_code)]
#[path = "../tests/support/command.rs"]
mod command;
#[allow(dead_code)]
#[path = "../tests/support/images.rs"]
mod images;
#[path = "support/measure.rs"]
mod measure;
#[allow(dead_code)]
#[path = "converge/observe.rs"]
mod observe;

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use axum::body::Bytes;
use measure::{Server, bare, env_or, percentile, usage, wrk};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message as _;
use serde_json::{Value, json};

/// A label on every container of this run, so that a failed run can still
/// remove what it made.
fn bench_label() -> String {
    format!("drover.bench=traces-{}", std::process::id())
}

/// What an OTLP/HTTP sink received.
#[derive(Default)]
struct Sink {
    posts: AtomicU64,
    bytes: AtomicU64,
    /// Decode every post, not only the first (the Docker runs' few).
    decode_all: bool,
    /// Spans decoded, by name.
    names: Mutex<BTreeMap<String, u64>>,
}

impl Sink {
    fn record(&self, body: &[u8]) {
        let first = self.posts.fetch_add(1, Ordering::Relaxed) == 0;
        self.bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
        if !(first || self.decode_all) {
            return;
        }
        let Ok(req) = ExportTraceServiceRequest::decode(body) else {
            eprintln!("the collector got a post that is no ExportTraceServiceRequest ({} bytes)", body.len());
            return;
        };
        let mut names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        let spans = req.resource_spans.iter().flat_map(|r| &r.scope_spans).flat_map(|s| &s.spans);
        for span in spans {
            *names.entry(span.name.clone()).or_default() += 1;
        }
    }

    fn summary(&self) -> String {
        let names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        let decoded: u64 = names.values().sum();
        let shown: Vec<String> = names.iter().map(|(n, c)| format!("`{n}` x{c}")).collect();
        format!(
            "{} posts, {:.1} MiB; {} {decoded} spans: {}",
            self.posts.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed) as f64 / (1024.0 * 1024.0),
            if self.decode_all { "all posts decoded," } else { "the first post decoded," },
            shown.join(", ")
        )
    }
}

/// A minimal OTLP/HTTP collector on loopback: its base URL and its counts.
async fn collector(decode_all: bool) -> anyhow::Result<(String, Arc<Sink>)> {
    let sink = Arc::new(Sink { decode_all, ..Sink::default() });
    let kept = sink.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: Bytes| {
            let kept = kept.clone();
            async move {
                kept.record(&body);
                ([(axum::http::header::CONTENT_TYPE, "application/x-protobuf")], Bytes::new())
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.context("binding the collector")?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((url, sink))
}

/// One configuration of trace export.
#[derive(Clone, Copy)]
enum Export {
    Off,
    Ratio10,
    AlwaysOn,
}

impl Export {
    fn name(self) -> &'static str {
        match self {
            Export::Off => "export off",
            Export::Ratio10 => "export on, `traceidratio` 0.1",
            Export::AlwaysOn => "export on, `always_on`",
        }
    }
}

/// A `drover serve` process of this bench, with its collector.
struct Peer {
    server: Server,
    export: Export,
    sink: Option<Arc<Sink>>,
    _dir: tempfile::TempDir,
}

async fn start(export: Export, simulated: bool, decode_all: bool) -> anyhow::Result<Peer> {
    let dir = tempfile::TempDir::new()?;
    let data = dir.path().join("data");
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_drover"));
    cmd.args(["serve", "--log-level", "warn", "--listen", &format!("127.0.0.1:{port}")]);
    cmd.arg("--data-dir").arg(&data).stdout(Stdio::null());
    if simulated {
        cmd.args(["--runtime", "simulated"]);
    }
    // Only what this bench sets configures drover: nothing from the caller's
    // environment may turn export on for "off" or pick another runtime.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        if key.starts_with("OTEL_") || key.starts_with("DROVER_") {
            cmd.env_remove(key);
        }
    }
    let sink = match export {
        Export::Off => None,
        Export::Ratio10 | Export::AlwaysOn => {
            let (url, sink) = collector(decode_all).await?;
            cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", url);
            if let Export::Ratio10 = export {
                cmd.env("OTEL_TRACES_SAMPLER", "traceidratio").env("OTEL_TRACES_SAMPLER_ARG", "0.1");
            } else {
                cmd.env("OTEL_TRACES_SAMPLER", "always_on");
            }
            Some(sink)
        }
    };
    let child = cmd.spawn().context("starting drover serve")?;
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build()?;
    let server = Server::ready(child, base, http, &data).await.with_context(|| export.name())?;
    Ok(Peer { server, export, sink, _dir: dir })
}

impl Peer {
    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> anyhow::Result<(u16, Value)> {
        let s = &self.server;
        let mut req = s.http.request(method.clone(), format!("{}{path}", s.base)).bearer_auth(&s.token);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let res = req.send().await.with_context(|| format!("{method} {path}"))?;
        let status = res.status().as_u16();
        Ok((status, res.json().await.unwrap_or(Value::Null)))
    }

    async fn post(&self, path: &str, body: Value) -> anyhow::Result<()> {
        let (status, answer) = self.call(reqwest::Method::POST, path, Some(body)).await?;
        anyhow::ensure!((200..300).contains(&status), "POST {path}: {status} {answer}");
        Ok(())
    }

    /// Spans drover counted as dropped (`/metrics`), as it printed them.
    async fn dropped(&self) -> anyhow::Result<String> {
        let s = &self.server;
        let text = s.http.get(format!("{}/metrics", s.base)).bearer_auth(&s.token).send().await?.text().await?;
        let value = text
            .lines()
            .find(|l| l.starts_with("drover_trace_spans_dropped_total"))
            .and_then(|l| l.split_whitespace().last());
        Ok(value.unwrap_or("(no counter on /metrics)").to_owned())
    }

    fn collected(&self) -> String {
        self.sink.as_ref().map_or_else(|| "nothing (no collector)".to_owned(), |s| s.summary())
    }
}

/// One measured turn: requests per second, p99 (ms), drover's CPU per request (µs).
type Turn = (f64, f64, f64);

fn turn(url: &str, token: Option<&str>, pid: Option<u32>, secs: u32) -> anyhow::Result<Turn> {
    let before = pid.map(usage).transpose()?.map_or(0.0, |u| u.0);
    let (rps, p99) = wrk(url, token, secs)?;
    let after = pid.map(usage).transpose()?.map_or(0.0, |u| u.0);
    let cpu_us = if pid.is_some() { 1e6 * (after - before) / (rps * f64::from(secs)) } else { f64::NAN };
    Ok((rps, p99, cpu_us))
}

fn medians(turns: &[Turn]) -> Turn {
    let pick = |f: fn(&Turn) -> f64| percentile(&mut turns.iter().map(f).collect::<Vec<_>>(), 0.5);
    (pick(|t| t.0), pick(|t| t.1), pick(|t| t.2))
}

async fn reads(secs: u32, turns: u32) -> anyhow::Result<()> {
    let pools = env_or("DROVER_BENCH_POOLS", 100);
    let mut peers = Vec::new();
    for export in [Export::Off, Export::Ratio10, Export::AlwaysOn] {
        let peer = start(export, true, false).await?;
        for p in 0..pools {
            peer.post("/v1/pools", json!({"name": format!("web-{p}"), "replicas": 0, "version": "v1.29.2"})).await?;
        }
        peers.push(peer);
    }
    let path = format!("/v1/pools/web-{}", pools / 2);
    let off = &peers[0].server;
    let body = off.http.get(format!("{}{path}", off.base)).bearer_auth(&off.token).send().await?.bytes().await?;
    let ceiling = bare(body.to_vec(), &path).await?;
    let url = |p: &Peer| format!("{}{path}", p.server.base);

    eprintln!("warm-up: 2 s of each");
    for p in &peers {
        wrk(&url(p), Some(&p.server.token), 2)?;
    }
    let mut runs: Vec<Vec<Turn>> = vec![Vec::new(); peers.len() + 1];
    for t in 1..=turns {
        eprintln!("turn {t}/{turns}: off, 10%, 100%, bare axum ({secs} s each)");
        for (i, p) in peers.iter().enumerate() {
            runs[i].push(turn(&url(p), Some(&p.server.token), Some(p.server.child.id()), secs)?);
        }
        runs[peers.len()].push(turn(&ceiling, None, None, secs)?);
    }
    // The last batch leaves within a second.
    tokio::time::sleep(Duration::from_secs(2)).await;

    println!("\n(1) GET {path}, {pools} pools of 0 replicas, wrk -t2 -c64, {turns} turns of {secs} s, median turn:\n");
    println!("| drover | requests/s | of export off | p99 (ms) | drover CPU per request (µs) | every turn (req/s) |");
    println!("|---|---:|---:|---:|---:|---|");
    let (off_rps, ..) = medians(&runs[0]);
    let every = |r: &[Turn]| r.iter().map(|t| format!("{:.0}", t.0)).collect::<Vec<_>>().join(", ");
    for (i, p) in peers.iter().enumerate() {
        let (rps, p99, cpu) = medians(&runs[i]);
        let ratio = 100.0 * rps / off_rps;
        println!("| {} | {rps:.0} | {ratio:.1}% | {p99:.2} | {cpu:.1} | {} |", p.export.name(), every(&runs[i]));
    }
    let (rps, p99, _) = medians(&runs[peers.len()]);
    println!("| bare axum handler, same body | {rps:.0} | | {p99:.2} | | {} |", every(&runs[peers.len()]));
    println!();
    exported(&peers).await
}

/// What each peer's collector received and its drover dropped.
async fn exported(peers: &[Peer]) -> anyhow::Result<()> {
    for p in peers {
        println!(
            "- {}: the collector got {}; drover dropped {} spans",
            p.export.name(),
            p.collected(),
            p.dropped().await?
        );
    }
    Ok(())
}

/// Waits until `pool`'s status says `n` machines ready at its generation.
async fn until_ready(peer: &Peer, pool: &str, n: usize, started: Instant) -> anyhow::Result<Duration> {
    loop {
        let (_, p) = peer.call(reqwest::Method::GET, &format!("/v1/pools/{pool}"), None).await?;
        let s = &p["status"];
        if s["observed_generation"] == p["generation"] && s["ready_replicas"] == n && s["replicas"] == n {
            return Ok(started.elapsed());
        }
        anyhow::ensure!(started.elapsed() < observe::LIMIT, "{pool} never reached {n} ready: {s}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One 0 -> `n`: (until the engine lists them running, until drover says ready).
async fn scale_up(peer: &Peer, docker: &bollard::Docker, name: &str, n: usize) -> anyhow::Result<(Duration, Duration)> {
    let image = format!("kindest/node:{}", images::V1);
    let (key, value) = bench_label().split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())).unwrap_or_default();
    let body = json!({"name": name, "replicas": n, "version": "v1.29.2", "image": image, "labels": {key: value}});
    let started = Instant::now();
    peer.post("/v1/pools", body).await?;
    let label = format!("drover.dev/pool={name}");
    let engine = observe::until_running(docker, &label, &image, n, started).await?;
    let ready = until_ready(peer, name, n, started).await?;
    let (status, answer) = peer.call(reqwest::Method::DELETE, &format!("/v1/pools/{name}"), None).await?;
    anyhow::ensure!((200..300).contains(&status), "DELETE {name}: {status} {answer}");
    observe::until_gone(docker, &label).await?;
    let gone = Instant::now();
    while peer.call(reqwest::Method::GET, &format!("/v1/pools/{name}"), None).await?.0 != 404 {
        anyhow::ensure!(gone.elapsed() < observe::LIMIT, "{name} was never deleted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok((engine, ready))
}

async fn docker_runs(peers: &[Peer], runs: u32, n: usize) -> anyhow::Result<()> {
    let docker = bollard::Docker::connect_with_defaults()?.negotiate_version().await.context("the Docker engine")?;
    let mut took: Vec<Vec<(Duration, Duration)>> = vec![Vec::new(); peers.len()];
    for run in 1..=runs {
        for (i, peer) in peers.iter().enumerate() {
            eprintln!("run {run}/{runs}: 0 -> {n}, {}", peer.export.name());
            let name = format!("traces-{}-{i}-{run}", std::process::id());
            took[i].push(scale_up(peer, &docker, &name, n).await?);
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;

    let secs = |d: Duration| d.as_secs_f64();
    let median = |r: &[(Duration, Duration)], f: fn(&(Duration, Duration)) -> Duration| {
        percentile(&mut r.iter().map(|x| secs(f(x))).collect::<Vec<_>>(), 0.5)
    };
    println!("\n(2) 0 -> {n} machines of one pool on the Docker engine, {runs} alternating runs each, median:\n");
    println!(
        "| drover | engine lists {n} running | of export off | status says {n} ready | of export off | every run (ready, s) |"
    );
    println!("|---|---:|---:|---:|---:|---|");
    let (off_engine, off_ready) = (median(&took[0], |x| x.0), median(&took[0], |x| x.1));
    for (i, peer) in peers.iter().enumerate() {
        let (engine, ready) = (median(&took[i], |x| x.0), median(&took[i], |x| x.1));
        let every: Vec<String> = took[i].iter().map(|x| format!("{:.2}", secs(x.1))).collect();
        println!(
            "| {} | {engine:.2} s | {:.1}% | {ready:.2} s | {:.1}% | {} |",
            peer.export.name(),
            100.0 * engine / off_engine,
            100.0 * ready / off_ready,
            every.join(", ")
        );
    }
    println!();
    exported(peers).await
}

/// Removes every container this run labelled (after its drovers are gone,
/// so that none is made again); bounded like every docker call here.
fn remove_leftovers() {
    let filter = format!("label={}", bench_label());
    match command::docker(&["ps", "-aq", "--filter", &filter]) {
        Ok(ids) if ids.is_empty() => {}
        Ok(ids) => {
            let mut args = vec!["rm", "-f"];
            args.extend(ids.split_whitespace());
            if let Err(e) = command::docker(&args) {
                eprintln!("removing this run's containers: {e}");
            }
        }
        Err(e) => eprintln!("listing this run's containers: {e}"),
    }
}

/// The load averages (1, 5, 15 min): other work on this machine's two
/// cores shows in every figure, so the reader should see how much there was.
fn load() -> String {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let secs = env_or("DROVER_BENCH_SECS", 10);
    let turns = env_or("DROVER_BENCH_TURNS", 3);
    let runs = env_or("DROVER_BENCH_RUNS", 3);
    let n = env_or("DROVER_BENCH_N", 50) as usize;
    println!("load average at the start: {}", load());
    reads(secs, turns).await?;
    println!("\nload average after (1): {}", load());

    images::build_once();
    let mut peers = Vec::new();
    for export in [Export::Off, Export::AlwaysOn] {
        peers.push(start(export, false, true).await?);
    }
    let result = docker_runs(&peers, runs, n).await;
    drop(peers);
    remove_leftovers();
    println!("\nload average after (2): {}", load());
    result
}
