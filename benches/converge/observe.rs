//! The one observer every peer is timed by: the engine's own list of
//! containers, polled every 50 ms, so that drover, Swarm and the engine
//! alone are held to the same finish line.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::models::ContainerSummaryStateEnum;
use bollard::query_parameters::ListContainersOptionsBuilder;

/// Longest any one measured phase may take before the bench gives up.
pub const LIMIT: Duration = Duration::from_secs(600);

/// (running containers with `image`, running containers with another image)
/// among those carrying `label` (`key=value`).
pub async fn running(docker: &Docker, label: &str, image: &str) -> anyhow::Result<(usize, usize)> {
    let filters = HashMap::from([("label".to_owned(), vec![label.to_owned()])]);
    let opts = ListContainersOptionsBuilder::default().all(true).filters(&filters).build();
    let list = crate::command::engine_call("listing containers", docker.list_containers(Some(opts)))
        .await
        .map_err(|e| anyhow::anyhow!(e))??;
    let run = |c: &&bollard::models::ContainerSummary| matches!(c.state, Some(ContainerSummaryStateEnum::RUNNING));
    let wanted = list.iter().filter(run).filter(|c| c.image.as_deref() == Some(image)).count();
    let others = list.iter().filter(run).count() - wanted;
    Ok((wanted, others))
}

/// How many containers carry `label`, in any state.
pub async fn count(docker: &Docker, label: &str) -> anyhow::Result<usize> {
    let filters = HashMap::from([("label".to_owned(), vec![label.to_owned()])]);
    let opts = ListContainersOptionsBuilder::default().all(true).filters(&filters).build();
    let list = crate::command::engine_call("listing containers", docker.list_containers(Some(opts)))
        .await
        .map_err(|e| anyhow::anyhow!(e))??;
    Ok(list.len())
}

/// Waits until exactly `n` containers with `label` run `image` and none
/// runs another; answers the time since `started`.
pub async fn until_running(
    docker: &Docker,
    label: &str,
    image: &str,
    n: usize,
    started: Instant,
) -> anyhow::Result<Duration> {
    loop {
        if running(docker, label, image).await? == (n, 0) {
            return Ok(started.elapsed());
        }
        anyhow::ensure!(started.elapsed() < LIMIT, "{label}: never reached {n} running {image}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until no container carries `label` (untimed clean-up).
pub async fn until_gone(docker: &Docker, label: &str) -> anyhow::Result<()> {
    let started = Instant::now();
    while count(docker, label).await? > 0 {
        anyhow::ensure!(started.elapsed() < LIMIT, "{label}: containers never went away");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}
