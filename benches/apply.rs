//! `drover apply` on a fleet of 1,000 pools (simulated runtime), end to end:
//! the release `drover` CLI reading a YAML fleet file and a fresh release
//! `drover serve --runtime simulated` planning and applying it.
//!
//! Per round, on a fresh server, each step timed as the CLI's wall time
//! (process start, YAML, request, plan, transaction, output):
//! 1. dry run against an empty server (1,000 creates planned);
//! 2. the first apply (1,000 pools created in one transaction);
//! 3. a no-op re-apply at once (the reconciler busy bringing machines up);
//! 4. a no-op re-apply once every machine is ready;
//! 5. a dry run of a new version for every pool (1,000 updates, each with
//!    the reconciler's rollout plan);
//! 6. that apply.
//!
//! Run: `cargo bench --bench apply`. `DROVER_BENCH_POOLS=1000`,
//! `DROVER_BENCH_ROUNDS=3` (the median round of each step is reported).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(600);

struct Server {
    child: Child,
    base: String,
    token: String,
    _data: tempfile::TempDir,
}

impl Server {
    async fn start() -> anyhow::Result<Self> {
        let data = tempfile::TempDir::new()?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new(env!("CARGO_BIN_EXE_drover"))
            .args(["serve", "--runtime", "simulated", "--log-level", "warn"])
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
        let token = std::fs::read_to_string(data.path().join("admin.token"))?.trim().to_owned();
        Ok(Self { child, base, token, _data: data })
    }

    /// `drover apply` with `args`: its wall time and exit code.
    fn apply(&self, file: &Path, args: &[&str]) -> anyhow::Result<(Duration, i32)> {
        let started = Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_drover"))
            .args(["apply", "--apply-set", "bench", "--detailed-exitcode", "-f"])
            .arg(file)
            .args(args)
            .env("DROVER_SERVER", &self.base)
            .env("DROVER_TOKEN", &self.token)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()?;
        let took = started.elapsed();
        let code = out.status.code().unwrap_or(-1);
        anyhow::ensure!(
            code == 0 || code == 2,
            "drover apply {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok((took, code))
    }

    /// Waits until every pool of the fleet has all its machines ready.
    async fn converged(&self, pools: usize, replicas: u64) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let http = reqwest::Client::new();
        loop {
            anyhow::ensure!(started.elapsed() < LIMIT, "the fleet did not converge within {LIMIT:?}");
            let mut ready = 0;
            let mut cursor: Option<String> = None;
            loop {
                let url = match &cursor {
                    None => format!("{}/v1/pools?limit=500", self.base),
                    Some(c) => format!("{}/v1/pools?limit=500&cursor={c}", self.base),
                };
                let page: serde_json::Value = http.get(url).bearer_auth(&self.token).send().await?.json().await?;
                for p in page["items"].as_array().into_iter().flatten() {
                    let s = &p["status"];
                    if s["ready_replicas"] == replicas
                        && s["updated_replicas"] == replicas
                        && p["generation"] == s["observed_generation"]
                    {
                        ready += 1;
                    }
                }
                match page["next_cursor"].as_str() {
                    Some(c) => cursor = Some(c.to_owned()),
                    None => break,
                }
            }
            if ready == pools {
                return Ok(started.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A fleet file of `pools` pools of `replicas` machines of `version`.
fn fleet(dir: &Path, pools: usize, replicas: u64, version: &str) -> anyhow::Result<std::path::PathBuf> {
    let mut text = String::from("# drover apply benchmark fleet\n");
    for i in 0..pools {
        text.push_str(&format!(
            "---\napiVersion: drover.dev/v1\nkind: Pool\nname: p{i:05}\nspec:\n  replicas: {replicas}\n  version: {version}\n  labels: {{team: bench, shard: s{}}}\n  strategy: {{max_surge: 1, max_unavailable: 0}}\n",
            i % 10
        ));
    }
    let path = dir.join(format!("fleet-{version}.yaml"));
    std::fs::write(&path, text)?;
    Ok(path)
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let pools = env_number("DROVER_BENCH_POOLS", 1000);
    let rounds = env_number("DROVER_BENCH_ROUNDS", 3);
    const REPLICAS: u64 = 2;
    let dir = tempfile::TempDir::new()?;
    let v1 = fleet(dir.path(), pools, REPLICAS, "v1.29.2")?;
    let v2 = fleet(dir.path(), pools, REPLICAS, "v1.30.0")?;
    let size = std::fs::metadata(&v1)?.len();
    println!("apply benchmark: {pools} pools of {REPLICAS} machines, fleet file {} KiB, {rounds} rounds", size / 1024);
    let steps = [
        "dry run, empty server (creates planned)",
        "first apply (pools created)",
        "no-op re-apply, at once",
        "no-op re-apply, fleet converged",
        "dry run of a new version (updates + rollout plans)",
        "apply of the new version",
    ];
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); steps.len()];
    let mut converge = Vec::new();
    for round in 0..rounds {
        let server = Server::start().await?;
        let expect = |(took, code): (Duration, i32), changed: bool| -> anyhow::Result<Duration> {
            anyhow::ensure!((code == 2) == changed, "unexpected exit {code}");
            Ok(took)
        };
        samples[0].push(expect(server.apply(&v1, &["--dry-run"])?, true)?);
        samples[1].push(expect(server.apply(&v1, &[])?, true)?);
        samples[2].push(expect(server.apply(&v1, &[])?, false)?);
        converge.push(server.converged(pools, REPLICAS).await?);
        samples[3].push(expect(server.apply(&v1, &[])?, false)?);
        samples[4].push(expect(server.apply(&v2, &["--dry-run"])?, true)?);
        samples[5].push(expect(server.apply(&v2, &[])?, true)?);
        let row: Vec<String> = samples.iter().map(|s| format!("{:.2}", s[round].as_secs_f64())).collect();
        println!(
            "round {}: {} s; converged {:.1} s after the first apply",
            round + 1,
            row.join(" / "),
            converge[round].as_secs_f64()
        );
    }
    println!();
    println!("| step ({pools} pools) | median of {rounds} |");
    println!("|---|---|");
    for (step, s) in steps.iter().zip(samples) {
        println!("| {step} | {:.2} s |", median(s).as_secs_f64());
    }
    println!("| fleet converged after the first apply | {:.1} s |", median(converge).as_secs_f64());
    Ok(())
}
