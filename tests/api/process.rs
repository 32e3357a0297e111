//! drover as a separate process of the real binary, for crash tests.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::Value;

pub struct Process {
    child: std::process::Child,
    pub addr: String,
}

impl Process {
    pub fn spawn(data_dir: &std::path::Path) -> Self {
        Self::spawn_with(data_dir, &[])
    }

    /// With more `drover serve` flags; a `--stop-timeout` among them
    /// replaces the default of 2 s.
    pub fn spawn_with(data_dir: &std::path::Path, flags: &[&str]) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port();
        let stop = if flags.contains(&"--stop-timeout") { &[][..] } else { &["--stop-timeout", "2s"][..] };
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_drover"))
            .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--log-level", "warn"])
            .args(stop)
            .arg("--data-dir")
            .arg(data_dir)
            .args(flags)
            .spawn()
            .expect("starting drover");
        Self { child, addr: format!("http://127.0.0.1:{port}") }
    }

    pub async fn wait_up(&self) {
        let client = reqwest::Client::new();
        for _ in 0..200 {
            if client.get(format!("{}/healthz", self.addr)).send().await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("drover did not come up at {}", self.addr);
    }

    /// Polls the pool through `client` until `done` holds, for at most
    /// `limit`; the panic names what was awaited and the last state seen.
    pub async fn wait_pool(
        &self,
        client: &reqwest::Client,
        pool: &str,
        limit: Duration,
        what: &str,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let p: Value = match client.get(format!("{}/v1/pools/{pool}", self.addr)).send().await {
                Ok(r) => r.json().await.unwrap_or(Value::Null),
                Err(_) => Value::Null,
            };
            if done(&p) {
                return p;
            }
            assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}; the pool is {p:#}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The names of the pool's machine records, as this process serves them.
    pub async fn machine_names(&self, client: &reqwest::Client, pool: &str) -> HashSet<String> {
        let url = format!("{}/v1/pools/{pool}/machines?limit=500", self.addr);
        let page: Value = client.get(url).send().await.expect("listing machines").json().await.expect("machines JSON");
        crate::helpers::names(page["items"].as_array().map_or(&[][..], Vec::as_slice))
    }

    /// SIGKILL: no graceful anything.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
