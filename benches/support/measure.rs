//! Measurements shared by the benchmarks: percentiles, a process's CPU
//! and memory from /proc, `wrk`, and the bare handler drover is measured
//! against.

#![allow(dead_code)]

use std::process::Command;

pub fn percentile(samples: &mut [f64], p: f64) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    samples.sort_by(f64::total_cmp);
    let i = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[i]
}

/// (user + system CPU seconds, RSS in MiB) of a process, from /proc.
pub fn usage(pid: u32) -> anyhow::Result<(f64, Rss)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let fields: Vec<&str> = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("").split_whitespace().collect();
    let ticks: f64 = fields.get(11).and_then(|u| u.parse().ok()).unwrap_or(0.0)
        + fields.get(12).and_then(|s| s.parse().ok()).unwrap_or(0.0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb = |field: &str| -> f64 {
        status
            .lines()
            .find(|l| l.starts_with(field))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    // USER_HZ is 100 on Linux.
    Ok((ticks / 100.0, Rss { total: kb("VmRSS:") / 1024.0, anon: kb("RssAnon:") / 1024.0 }))
}

/// Resident memory in MiB: all of it, and the private (anonymous) part;
/// the rest is file-backed, mostly the database's memory map, which the
/// kernel shares with its page cache and can drop at will.
#[derive(Clone, Copy, Default)]
pub struct Rss {
    pub total: f64,
    pub anon: f64,
}

/// `wrk` at 64 connections for `secs`: (requests per second, p99 in ms).
pub fn wrk(url: &str, token: Option<&str>, secs: u32) -> anyhow::Result<(f64, f64)> {
    let mut cmd = Command::new("wrk");
    cmd.args(["-t2", "-c64", &format!("-d{secs}s"), "--latency"]);
    if let Some(t) = token {
        cmd.args(["-H", &format!("Authorization: Bearer {t}")]);
    }
    let out = cmd.arg(url).output().map_err(|e| anyhow::anyhow!("running wrk (apt-get install wrk): {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let rps = text
        .lines()
        .find(|l| l.starts_with("Requests/sec:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("wrk printed no rate:\n{text}"))?;
    let p99 = text
        .lines()
        .find(|l| l.trim_start().starts_with("99%"))
        .and_then(|l| l.split_whitespace().nth(1))
        .map(|v| {
            let (n, unit) = v.split_at(v.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(v.len()));
            let n: f64 = n.parse().unwrap_or(f64::NAN);
            match unit {
                "us" => n / 1000.0,
                "s" => n * 1000.0,
                _ => n,
            }
        })
        .ok_or_else(|| anyhow::anyhow!("wrk printed no p99:\n{text}"))?;
    let errors = text.lines().find(|l| l.contains("Non-2xx") || l.contains("Socket errors"));
    if let Some(e) = errors {
        eprintln!("wrk {url}: {e}");
    }
    Ok((rps, p99))
}

/// A bare axum server (in this process) answering every request with
/// `body`: the ceiling of what any handler on this stack can do here. Its
/// URL, with `path`.
pub async fn bare(body: Vec<u8>, path: &str) -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let body = axum::body::Bytes::from(body);
    let app = axum::Router::new().fallback(move || {
        let body = body.clone();
        async move { ([(axum::http::header::CONTENT_TYPE, "application/json")], body) }
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(format!("http://{addr}{path}"))
}

/// A `drover serve` process a benchmark started, with a client and the
/// admin token it wrote; killed when dropped.
pub struct Server {
    pub child: std::process::Child,
    pub base: String,
    pub http: reqwest::Client,
    pub token: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Waits (up to 30 s) until `child`, serving at `base` with its data in
    /// `data`, answers `/healthz`, and reads the admin token it wrote.
    pub async fn ready(
        child: std::process::Child,
        base: String,
        http: reqwest::Client,
        data: &std::path::Path,
    ) -> anyhow::Result<Self> {
        let started = std::time::Instant::now();
        while http.get(format!("{base}/healthz")).send().await.is_err() {
            anyhow::ensure!(started.elapsed() < std::time::Duration::from_secs(30), "drover did not come up");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let token = std::fs::read_to_string(data.join("admin.token"))?.trim().to_owned();
        Ok(Self { child, base, http, token })
    }
}

/// A number from the environment, or `default`.
pub fn env_or(name: &str, default: u32) -> u32 {
    std::env::var(name).ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}
