//! Test support for the real Docker engine: a check that fails loudly when
//! the engine is missing, images built locally (see `images.rs`: no
//! registry is reachable), and a sampler of a pool's containers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bollard::Docker;
use bollard::models::ContainerSummaryStateEnum;
use bollard::query_parameters::ListContainersOptionsBuilder;

use crate::command::{self, DOCKER_LIMIT};
use crate::images::{self, docker};
pub use crate::images::{CRASH_IMAGE, HEALTHY_IMAGE, PLAIN_IMAGE, STUBBORN_V1, STUBBORN_V2, V1, V2};

/// Opting out of the tests that need a Docker engine (README.md, "Tests").
pub const SKIP_DOCKER: &str = "DROVER_SKIP_DOCKER_TESTS";

/// Fails the test, with the reason, unless a Docker engine answers; then
/// builds the test images (once per run). A test that calls it carries
/// `#[cfg_attr(skip_docker_tests, ignore = ...)]` (`build.rs` sets the cfg
/// when [`SKIP_DOCKER`] is set), so an opted-out run lists it as ignored;
/// `opt_outs.rs` checks that every such test does.
pub fn require_docker() {
    if let Err(why) = command::docker(&["version", "--format", "{{.Server.Version}}"]) {
        panic!(
            "this test needs a running Docker engine ({why}); start one (scripts/test.sh tries), or set \
             {SKIP_DOCKER}=1 to list the Docker tests as ignored"
        );
    }
    images::build_once();
}

/// Removes a pool's containers when a test ends, pass or fail. Declare it
/// before the server (`TestApp`, `Process`), so that it is dropped after
/// the server has stopped: then nothing creates a container after the sweep.
pub struct Cleanup(pub Vec<String>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        self.sweep();
    }
}

impl Cleanup {
    /// Never panics: it runs in `Drop`, often while a failed test unwinds,
    /// where a panic would abort the whole test binary. A failure is printed
    /// and the sweep carries on; a hung engine ends it (every later call
    /// would wait out its limit too).
    fn sweep(&self) {
        for pool in &self.0 {
            let listed = command::docker(&["ps", "-aq", "--filter", &format!("label=drover.dev/pool={pool}")]);
            let ids = match listed {
                Ok(ids) => ids,
                Err(e) => {
                    eprintln!("Cleanup: the containers of pool {pool} may be left behind: {e}");
                    if e.timed_out() {
                        return;
                    }
                    continue;
                }
            };
            let ids: Vec<&str> = ids.split_whitespace().collect();
            // A few at a time: Docker 20.10 can deadlock removing many at once.
            for batch in ids.chunks(8) {
                let args: Vec<&str> = ["rm", "-f"].into_iter().chain(batch.iter().copied()).collect();
                if let Err(e) = command::docker(&args) {
                    eprintln!("Cleanup: containers of pool {pool} may be left behind: {e}");
                    if e.timed_out() {
                        return;
                    }
                }
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

/// A client of the local engine whose every request gives up after
/// [`DOCKER_LIMIT`] (bollard's default is two minutes).
pub async fn client() -> Docker {
    let docker = Docker::connect_with_defaults().expect("docker client").with_timeout(DOCKER_LIMIT);
    docker.negotiate_version().await.unwrap_or_else(|e| panic!("asking the Docker engine its version: {e}"))
}

/// Containers carrying `label` (`key=value`), as the engine lists them.
pub async fn containers(docker: &Docker, label: &str) -> Vec<Seen> {
    let filters = HashMap::from([("label".to_owned(), vec![label.to_owned()])]);
    let opts = ListContainersOptionsBuilder::default().all(true).filters(&filters).build();
    command::engine_call("listing containers", docker.list_containers(Some(opts)))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|e| panic!("listing containers: {e}"))
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

/// One container event, as the engine reports it.
#[derive(Debug, Clone)]
pub struct EngineEvent {
    /// By the engine's clock (this host's).
    pub at: std::time::SystemTime,
    /// create, start, kill, die, stop, destroy...
    pub action: String,
    pub name: String,
    pub id: String,
}

/// The engine's own record of what happened to a pool's containers, from
/// the moment it starts: what a test checks "no running machine was
/// removed" against, rather than drover's word for it.
pub struct EventLog {
    /// In the engine's order.
    seen: Arc<Mutex<Vec<EngineEvent>>>,
    handle: tokio::task::JoinHandle<()>,
}

impl EventLog {
    /// Follows `docker`'s container events of `pool`.
    pub fn start(docker: &Docker, pool: &str) -> Self {
        use bollard::query_parameters::EventsOptionsBuilder;
        use futures_util::StreamExt;
        let filters = HashMap::from([
            ("type".to_owned(), vec!["container".to_owned()]),
            ("label".to_owned(), vec![format!("drover.dev/pool={pool}")]),
        ]);
        // From this very moment: `since` has one-second steps, so events of
        // the second before are dropped by their own timestamp.
        let started = chrono::Utc::now();
        let since = (started.timestamp() - 1).to_string();
        let from = started.timestamp_nanos_opt().unwrap_or(0);
        let opts = EventsOptionsBuilder::default().since(&since).filters(&filters).build();
        let mut stream = docker.events(Some(opts));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let handle = tokio::spawn(async move {
            while let Some(Ok(ev)) = stream.next().await {
                if ev.time_nano.is_some_and(|t| t < from) {
                    continue;
                }
                let action = ev.action.unwrap_or_default();
                let id = ev.actor.as_ref().and_then(|a| a.id.clone()).unwrap_or_default();
                let name = ev.actor.and_then(|a| a.attributes?.get("name").cloned()).unwrap_or_default();
                let nanos = ev.time_nano.and_then(|t| u64::try_from(t).ok()).unwrap_or(0);
                let at = std::time::UNIX_EPOCH + Duration::from_nanos(nanos);
                if let Ok(mut log) = log.lock() {
                    log.push(EngineEvent { at, action, name, id });
                }
            }
        });
        Self { seen, handle }
    }

    /// Every event so far, in the engine's order.
    pub fn entries(&self) -> Vec<EngineEvent> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Containers the engine stopped, killed or removed, with the action.
    pub fn removals(&self) -> Vec<(String, String)> {
        let seen = self.entries().into_iter().map(|e| (e.action, e.name));
        seen.filter(|(action, _)| matches!(action.as_str(), "kill" | "stop" | "destroy")).collect()
    }

    /// The most containers that existed at once, `at_start` existing when
    /// the log started.
    pub fn peak_existing(&self, at_start: usize) -> usize {
        let (mut now, mut peak) = (at_start as i64, at_start as i64);
        for e in self.entries() {
            match e.action.as_str() {
                "create" => now += 1,
                "destroy" => now -= 1,
                _ => {}
            }
            peak = peak.max(now);
        }
        peak.max(0) as usize
    }

    /// Containers the engine created.
    pub fn created(&self) -> Vec<String> {
        self.entries().into_iter().filter(|e| e.action == "create").map(|e| e.name).collect()
    }
}

impl Drop for EventLog {
    fn drop(&mut self) {
        self.handle.abort();
    }
}
