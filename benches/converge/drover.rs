//! drover in this process, on a fresh data directory, driving the same
//! engine through its API as a user would.

use std::time::{Duration, Instant};

use bollard::Docker;
use drover::app::Application;
use drover::config::{RuntimeKind, ServeConfig};
use serde_json::{Value, json};

use crate::observe;

pub struct Drover {
    docker: Docker,
    base: String,
    http: reqwest::Client,
    stop: tokio::sync::oneshot::Sender<()>,
    handle: tokio::task::JoinHandle<anyhow::Result<()>>,
    _data: tempfile::TempDir,
    seq: usize,
}

/// The timings of one change: until the engine shows it done, and until
/// drover's status says so (ready machines: settled or healthy).
pub struct Timed {
    pub engine: Duration,
    pub status: Duration,
}

impl Drover {
    pub async fn start(docker: Docker, stop_timeout: Duration) -> anyhow::Result<Self> {
        let data = tempfile::TempDir::new()?;
        let mut cfg = ServeConfig::for_data_dir(data.path().to_path_buf());
        cfg.runtime = RuntimeKind::Docker;
        cfg.stop_timeout = stop_timeout;
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
        Ok(Self { docker, base, http, stop, handle, _data: data, seq: 0 })
    }

    pub async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        self.handle.await?
    }

    /// A new pool of 0 machines of `image` with `strategy`; answers its name.
    pub async fn pool(&mut self, image: &str, strategy: Value) -> anyhow::Result<String> {
        self.seq += 1;
        let name = format!("bench-{}-{}", std::process::id(), self.seq);
        let body = json!({"name": name, "replicas": 0, "version": "v1.29.2", "image": image, "strategy": strategy});
        let res = self.http.post(format!("{}/v1/pools", self.base)).json(&body).send().await?;
        anyhow::ensure!(res.status().is_success(), "creating {name}: {}", res.text().await?);
        Ok(name)
    }

    fn label(pool: &str) -> String {
        format!("drover.dev/pool={pool}")
    }

    async fn patch(&self, pool: &str, body: Value) -> anyhow::Result<()> {
        let res = self
            .http
            .patch(format!("{}/v1/pools/{pool}", self.base))
            .header("content-type", "application/merge-patch+json")
            .body(body.to_string())
            .send()
            .await?;
        anyhow::ensure!(res.status().is_success(), "patch {body}: {}", res.text().await?);
        Ok(())
    }

    /// Waits until the status reports `n` ready machines on `image`, at the
    /// current generation, nothing left to delete.
    async fn until_status(&self, pool: &str, image: &str, n: usize, started: Instant) -> anyhow::Result<Duration> {
        loop {
            let p: Value = self.http.get(format!("{}/v1/pools/{pool}", self.base)).send().await?.json().await?;
            let s = &p["status"];
            if s["observed_generation"] == p["generation"]
                && p["desired_image"] == image
                && s["ready_replicas"] == n
                && s["updated_replicas"] == n
                && s["replicas"] == n
                && s["terminating_replicas"] == 0
            {
                return Ok(started.elapsed());
            }
            anyhow::ensure!(started.elapsed() < observe::LIMIT, "{pool} never reached {n} ready on {image}: {s}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn scale(&self, pool: &str, image: &str, n: usize) -> anyhow::Result<Timed> {
        let started = Instant::now();
        self.patch(pool, json!({"replicas": n})).await?;
        let engine = observe::until_running(&self.docker, &Self::label(pool), image, n, started).await?;
        let status = self.until_status(pool, image, n, started).await?;
        Ok(Timed { engine, status })
    }

    pub async fn roll(&self, pool: &str, image: &str, n: usize) -> anyhow::Result<Timed> {
        let started = Instant::now();
        self.patch(pool, json!({"image": image})).await?;
        let engine = observe::until_running(&self.docker, &Self::label(pool), image, n, started).await?;
        let status = self.until_status(pool, image, n, started).await?;
        Ok(Timed { engine, status })
    }

    pub async fn delete(&self, pool: &str) -> anyhow::Result<()> {
        let res = self.http.delete(format!("{}/v1/pools/{pool}", self.base)).send().await?;
        anyhow::ensure!(res.status().is_success(), "deleting {pool}");
        observe::until_gone(&self.docker, &Self::label(pool)).await
    }
}
