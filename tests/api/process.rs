//! drover as a separate process of the real binary, for crash tests. Its
//! standard error goes to a log file, which tests read to name a failure
//! or to make sure nothing panicked.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

pub struct Process {
    child: std::process::Child,
    pub addr: String,
    /// Where its standard error goes.
    pub log: PathBuf,
}

impl Process {
    pub fn spawn(data_dir: &Path) -> Self {
        Self::spawn_with(data_dir, &[])
    }

    /// `drover serve` on `data_dir` with `extra` flags; a `--stop-timeout`
    /// among them replaces the default of 2 s.
    pub fn spawn_with(data_dir: &Path, extra: &[&str]) -> Self {
        Self::spawn_clocked(data_dir, None, &[], extra)
    }

    /// [`spawn_with`](Self::spawn_with) with environment variables set for
    /// drover (settings read from the environment, as operators set them).
    pub fn spawn_env(data_dir: &Path, env: &[(&str, &str)], extra: &[&str]) -> Self {
        Self::spawn_clocked(data_dir, None, env, extra)
    }

    /// [`spawn_with`](Self::spawn_with) with the process's wall clock moved
    /// by `offset` (`"+60s"`, `"-60s"`) through Debian's `faketime`; its
    /// monotonic clock is left alone. The test fails, saying why, when
    /// `faketime` is missing (scripts/test.sh installs it).
    pub fn spawn_faked(data_dir: &Path, offset: &str, extra: &[&str]) -> Self {
        Self::spawn_clocked(data_dir, Some(offset), &[], extra)
    }

    fn spawn_clocked(data_dir: &Path, offset: Option<&str>, env: &[(&str, &str)], extra: &[&str]) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port();
        std::fs::create_dir_all(data_dir).expect("creating the data directory");
        let log = data_dir.join(format!("serve-{port}.log"));
        let stderr = std::fs::File::create(&log).expect("creating the process log");
        let stop = if extra.contains(&"--stop-timeout") { &[][..] } else { &["--stop-timeout", "2s"][..] };
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_drover"));
        if let Some(offset) = offset {
            // The library itself, preloaded into drover (the `faketime`
            // program would run drover as its child, and a kill by pid would
            // stop only the wrapper).
            command
                .env("LD_PRELOAD", libfaketime())
                .env("FAKETIME", offset)
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
                .env("FAKETIME_NO_CACHE", "1");
        }
        command.envs(env.iter().copied());
        command
            .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--log-level", "warn"])
            .args(stop)
            .arg("--data-dir")
            .arg(data_dir)
            .args(extra);
        if let Some(drover::db::Location::Postgres(url)) = crate::postgres::store_for_data_dir(data_dir) {
            command.env("DROVER_DATABASE_URL", url);
        }
        let child = command.stderr(Stdio::from(stderr)).spawn().expect("starting drover");
        Self { child, addr: format!("http://127.0.0.1:{port}"), log }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What it wrote to standard error so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its exit status, once it exited within `limit`.
    pub async fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Still running: it did not exit (nor panic its way out).
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub async fn wait_up(&self) {
        let client = reqwest::Client::new();
        for _ in 0..200 {
            if client.get(format!("{}/healthz", self.addr)).send().await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("drover did not come up at {}; its log:\n{}", self.addr, self.output());
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

    /// Reconcile passes this process has finished, from its `/metrics`.
    pub async fn passes_finished(&self, client: &reqwest::Client) -> f64 {
        let res = client.get(format!("{}/metrics", self.addr)).send().await.expect("reading /metrics");
        assert!(res.status().is_success(), "/metrics answered {}", res.status());
        crate::helpers::metric(&res.text().await.expect("the metrics text"), "drover_reconcile_passes_total")
    }

    /// Waits until a reconcile pass that began after this call has finished
    /// (see `TestApp::wait_pass_after_now`; for a process with one pool, and
    /// a resync interval short enough that passes come without a change).
    pub async fn wait_pass_after_now(&self, client: &reqwest::Client, limit: Duration, what: &str) {
        let now = self.passes_finished(client).await;
        crate::helpers::wait_for(limit, what, async || self.passes_finished(client).await >= now + 2.0).await;
    }

    /// The names of the pool's machine records, as this process serves them.
    pub async fn machine_names(&self, client: &reqwest::Client, pool: &str) -> HashSet<String> {
        let url = format!("{}/v1/pools/{pool}/machines?limit=500", self.addr);
        let page: Value = client.get(url).send().await.expect("listing machines").json().await.expect("machines JSON");
        crate::helpers::names(page["items"].as_array().map_or(&[][..], Vec::as_slice))
    }

    /// Sends `signal` (SIGSTOP, SIGCONT, SIGTERM...) to this process, by pid.
    pub fn signal(&self, signal: i32) {
        let pid = i32::try_from(self.child.id()).expect("a pid fits an i32");
        // SAFETY: kill(2) on the pid of a child this test started.
        let sent = unsafe { libc::kill(pid, signal) };
        assert_eq!(sent, 0, "sending signal {signal} to {pid}: {}", std::io::Error::last_os_error());
    }

    /// SIGKILL: no graceful anything.
    pub fn kill(mut self) {
        self.kill_now();
    }

    /// SIGKILL, and wait until it is gone (its locks with it).
    pub fn kill_now(&mut self) {
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

/// Debian's libfaketime (package `faketime`); the test fails, saying why,
/// without it.
fn libfaketime() -> std::path::PathBuf {
    let candidates = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|arch| arch.path().join("faketime/libfaketime.so.1"))
        .chain([std::path::PathBuf::from("/usr/lib/faketime/libfaketime.so.1")]);
    candidates.into_iter().find(|p| p.is_file()).unwrap_or_else(|| {
        panic!("this test needs Debian's `faketime` (libfaketime.so.1 under /usr/lib/*/faketime): scripts/test.sh installs it")
    })
}
