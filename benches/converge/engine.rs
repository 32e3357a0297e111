//! The engine alone: the same containers created, started, stopped and
//! removed straight through its API, all at once, with nothing in between.
//! What no orchestrator on this engine can beat.

use std::collections::HashMap;
use std::time::Instant;

use bollard::Docker;
use bollard::models::ContainerCreateBody;
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, RemoveContainerOptionsBuilder, StopContainerOptionsBuilder,
};
use futures_util::future::join_all;

use crate::observe;

pub struct Engine {
    pub docker: Docker,
    /// `key=value` on every container of this peer.
    pub label: String,
    seq: usize,
}

impl Engine {
    pub fn new(docker: Docker) -> Self {
        Self { docker, label: format!("drover.bench=engine-{}", std::process::id()), seq: 0 }
    }

    fn names(&mut self, n: usize) -> Vec<String> {
        self.seq += 1;
        (0..n).map(|i| format!("bench-engine-{}-{}-{i}", std::process::id(), self.seq)).collect()
    }

    async fn run(&self, name: &str, image: &str) -> anyhow::Result<()> {
        let (k, v) = self.label.split_once('=').unwrap_or_default();
        let body = ContainerCreateBody {
            image: Some(image.to_owned()),
            labels: Some(HashMap::from([(k.to_owned(), v.to_owned())])),
            ..Default::default()
        };
        let opts = CreateContainerOptionsBuilder::default().name(name).build();
        let created = self.docker.create_container(Some(opts), body).await?;
        self.docker.start_container(&created.id, None).await?;
        Ok(())
    }

    async fn stop_and_remove(&self, name: &str, grace: i32) {
        let _ = self.docker.stop_container(name, Some(StopContainerOptionsBuilder::default().t(grace).build())).await;
        let opts = RemoveContainerOptionsBuilder::default().force(true).build();
        let _ = self.docker.remove_container(name, Some(opts)).await;
    }

    /// `n` containers of `image`, all at once; the time until all run.
    pub async fn scale_up(&mut self, image: &str, n: usize) -> anyhow::Result<(std::time::Duration, Vec<String>)> {
        let names = self.names(n);
        let started = Instant::now();
        let made = join_all(names.iter().map(|name| self.run(name, image))).await;
        made.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
        let took = observe::until_running(&self.docker, &self.label, image, n, started).await?;
        Ok((took, names))
    }

    /// Replaces `old` (running some image) by as many of `image`, all at
    /// once: starts the new and stops the old within `grace` seconds.
    pub async fn replace(
        &mut self,
        old: &[String],
        image: &str,
        grace: i32,
    ) -> anyhow::Result<(std::time::Duration, Vec<String>)> {
        let new = self.names(old.len());
        let started = Instant::now();
        let creates = join_all(new.iter().map(|name| self.run(name, image)));
        let removes = join_all(old.iter().map(|name| self.stop_and_remove(name, grace)));
        let (made, _) = tokio::join!(creates, removes);
        made.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
        let took = observe::until_running(&self.docker, &self.label, image, new.len(), started).await?;
        Ok((took, new))
    }

    pub async fn clean(&self, names: &[String]) -> anyhow::Result<()> {
        join_all(names.iter().map(|name| self.stop_and_remove(name, 0))).await;
        observe::until_gone(&self.docker, &self.label).await
    }
}
