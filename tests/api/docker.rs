//! Test support for the real Docker engine: a check that fails loudly when
//! the engine is missing, images built locally (see `images.rs`: no
//! registry is reachable), and a sampler of a pool's containers.

use std::collections::HashMap;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bollard::Docker;
use bollard::models::ContainerSummaryStateEnum;
use bollard::query_parameters::ListContainersOptionsBuilder;

use crate::images::{self, docker};
pub use crate::images::{CRASH_IMAGE, HEALTHY_IMAGE, PLAIN_IMAGE, STUBBORN_V1, STUBBORN_V2, V1, V2};

/// Opting out of the tests that need a Docker engine (README: "Testing").
pub const SKIP_DOCKER: &str = "DROVER_SKIP_DOCKER_TESTS";

/// True when Docker is usable, after building the test images. Without an
/// engine the test fails with the reason, unless the user opted out with
/// `DROVER_SKIP_DOCKER_TESTS=1`: then it says so and the caller returns.
pub fn require_docker(test: &str) -> bool {
    let probe = Command::new("docker").args(["version", "--format", "{{.Server.Version}}"]).output();
    let problem = match probe {
        Ok(out) if out.status.success() => None,
        Ok(out) => Some(String::from_utf8_lossy(&out.stderr).trim().to_owned()),
        Err(e) => Some(format!("cannot run the docker CLI: {e}")),
    };
    match problem {
        None => {
            images::build_once();
            true
        }
        Some(why) if std::env::var_os(SKIP_DOCKER).is_some() => {
            eprintln!("{test}: not run, {SKIP_DOCKER} is set ({why})");
            false
        }
        Some(why) => panic!("{test} needs a running Docker engine: {why} (set {SKIP_DOCKER}=1 to opt out)"),
    }
}

/// Removes a pool's containers when a test ends, pass or fail.
pub struct Cleanup(pub Vec<String>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        // Twice: a reconcile pass in flight when the test ended may still
        // create a container after the first sweep.
        self.sweep();
        std::thread::sleep(Duration::from_millis(500));
        self.sweep();
    }
}

impl Cleanup {
    fn sweep(&self) {
        for pool in &self.0 {
            let ids = Command::new("docker")
                .args(["ps", "-aq", "--filter", &format!("label=drover.dev/pool={pool}")])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).split_whitespace().map(str::to_owned).collect::<Vec<_>>())
                .unwrap_or_default();
            if !ids.is_empty() {
                let _ = Command::new("docker").arg("rm").arg("-f").args(&ids).output();
            }
        }
    }
}

/// One container as the test sees it through the engine.
#[derive(Debug, Clone)]
pub struct Seen {
    pub name: String,
    pub image: String,
    pub running: bool,
    /// The engine's state: running, exited, created, paused, ...
    pub state: String,
    pub labels: HashMap<String, String>,
}

pub async fn client() -> Docker {
    Docker::connect_with_defaults().expect("docker client").negotiate_version().await.expect("docker version")
}

/// Containers carrying `label` (`key=value`), as the engine lists them.
pub async fn containers(docker: &Docker, label: &str) -> Vec<Seen> {
    let filters = HashMap::from([("label".to_owned(), vec![label.to_owned()])]);
    let opts = ListContainersOptionsBuilder::default().all(true).filters(&filters).build();
    docker
        .list_containers(Some(opts))
        .await
        .expect("listing containers")
        .into_iter()
        .map(|c| Seen {
            name: c.names.unwrap_or_default().first().map(|n| n.trim_start_matches('/').to_owned()).unwrap_or_default(),
            image: c.image.unwrap_or_default(),
            running: matches!(c.state, Some(ContainerSummaryStateEnum::RUNNING)),
            state: c.state.map(|s| s.to_string()).unwrap_or_default(),
            labels: c.labels.unwrap_or_default(),
        })
        .collect()
}

pub async fn pool_containers(docker: &Docker, pool: &str) -> Vec<Seen> {
    containers(docker, &format!("drover.dev/pool={pool}")).await
}

/// Samples a pool's containers every 100 ms until stopped: the smallest
/// number running and the largest number existing.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    stats: Arc<Mutex<(usize, usize, usize)>>,
    handle: tokio::task::JoinHandle<()>,
}

impl Sampler {
    pub fn start(docker: Docker, pool: String) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(Mutex::new((usize::MAX, 0, 0)));
        let (s, st) = (stop.clone(), stats.clone());
        let handle = tokio::spawn(async move {
            // Bounded: at most 10 minutes of samples.
            for _ in 0..6000 {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                let seen = pool_containers(&docker, &pool).await;
                let running = seen.iter().filter(|c| c.running).count();
                if let Ok(mut g) = st.lock() {
                    g.0 = g.0.min(running);
                    g.1 = g.1.max(seen.len());
                    g.2 += 1;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Self { stop, stats, handle }
    }

    /// (fewest running, most existing, samples taken)
    pub async fn finish(self) -> (usize, usize, usize) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.handle.await;
        *self.stats.lock().expect("sampler stats")
    }
}

/// Runs a container by hand, outside drover.
pub fn run_by_hand(name: &str, image: &str, labels: &[(&str, &str)]) -> String {
    let mut args = vec!["run".to_owned(), "-d".to_owned(), "--name".to_owned(), name.to_owned()];
    for (k, v) in labels {
        args.push("--label".into());
        args.push(format!("{k}={v}"));
    }
    args.push(image.to_owned());
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    docker(&refs)
}

pub fn remove_by_hand(name: &str) {
    docker(&["rm", "-f", name]);
}
