//! Docker Swarm on the same engine, driven by its CLI as its users do: a
//! service scaled from 0, then updated with `--update-parallelism`,
//! `--update-order start-first` and no delay. The swarm is initialised for
//! the bench and left again only if the bench initialised it.

use std::time::{Duration, Instant};

use bollard::Docker;

use crate::observe;

pub struct Swarm {
    docker: Docker,
    initialised_here: bool,
    service: String,
    pub label: String,
}

/// A docker CLI call, bounded: a hung engine fails the bench, naming it.
fn cli(args: &[&str]) -> anyhow::Result<String> {
    crate::command::docker(args).map_err(|e| anyhow::anyhow!("{e}"))
}

impl Swarm {
    pub fn join(docker: Docker) -> anyhow::Result<Self> {
        let state = cli(&["info", "--format", "{{.Swarm.LocalNodeState}}"])?;
        let initialised_here = state == "inactive";
        if initialised_here {
            cli(&["swarm", "init", "--advertise-addr", "127.0.0.1"])?;
        }
        let service = format!("bench-swarm-{}", std::process::id());
        let label = format!("com.docker.swarm.service.name={service}");
        Ok(Self { docker, initialised_here, service, label })
    }

    /// A service of `image` with 0 tasks, stops with `grace` seconds, updates
    /// `parallelism` at a time, new task first.
    pub async fn create(&self, image: &str, grace: u32, parallelism: usize) -> anyhow::Result<()> {
        cli(&[
            "service",
            "create",
            "--detach",
            "--quiet",
            "--name",
            &self.service,
            "--replicas",
            "0",
            "--no-resolve-image",
            "--stop-grace-period",
            &format!("{grace}s"),
            "--update-parallelism",
            &parallelism.to_string(),
            "--update-order",
            "start-first",
            "--update-delay",
            "0s",
            "--update-failure-action",
            "continue",
            image,
        ])?;
        Ok(())
    }

    pub async fn scale(&self, image: &str, n: usize) -> anyhow::Result<Duration> {
        let started = Instant::now();
        cli(&["service", "scale", "--detach", &format!("{}={n}", self.service)])?;
        observe::until_running(&self.docker, &self.label, image, n, started).await
    }

    /// The rolling update, timed by the engine (all new running, no old one
    /// running) and by Swarm's own account (UpdateStatus completed).
    pub async fn update(&self, image: &str, n: usize) -> anyhow::Result<(Duration, Duration)> {
        let started = Instant::now();
        cli(&["service", "update", "--detach", "--quiet", "--no-resolve-image", "--image", image, &self.service])?;
        let mut completed = None;
        loop {
            if completed.is_none() {
                let state = cli(&[
                    "service",
                    "inspect",
                    "--format",
                    "{{if .UpdateStatus}}{{.UpdateStatus.State}}{{end}}",
                    &self.service,
                ])?;
                if state == "completed" {
                    completed = Some(started.elapsed());
                }
            }
            if observe::running(&self.docker, &self.label, image).await? == (n, 0) {
                let engine = started.elapsed();
                // Swarm's own account may come a moment later.
                while completed.is_none() {
                    anyhow::ensure!(started.elapsed() < observe::LIMIT, "swarm never called its update complete");
                    let state = cli(&[
                        "service",
                        "inspect",
                        "--format",
                        "{{if .UpdateStatus}}{{.UpdateStatus.State}}{{end}}",
                        &self.service,
                    ])?;
                    if state == "completed" {
                        completed = Some(started.elapsed());
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                return Ok((engine, completed.unwrap_or(engine)));
            }
            anyhow::ensure!(started.elapsed() < observe::LIMIT, "swarm update never finished");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn remove(&self) -> anyhow::Result<()> {
        cli(&["service", "rm", &self.service])?;
        observe::until_gone(&self.docker, &self.label).await
    }

    /// Leaves the swarm if the bench made it, as the machine was found.
    pub fn leave(&self) {
        let _ = cli(&["service", "rm", &self.service]);
        if self.initialised_here
            && let Err(e) = cli(&["swarm", "leave", "--force"])
        {
            eprintln!("leaving the swarm the bench initialised failed: {e}");
        }
    }
}
