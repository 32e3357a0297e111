//! Extra Docker engines beside the host's, for tests and benchmarks of
//! pools across engines: each a `dockerd` of its own with its own socket,
//! exec root, data root, containerd namespaces, daemon ID and, above all,
//! its own bridge (a `--bridge none` engine would delete the host's
//! `docker0`).
//! Stopping one is how a lost host is simulated. Everything made here is
//! undone on drop: the daemon (stopped by its exact pid), its bridge, its
//! directories.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Engines made by this process so far: each gets a different bridge and subnet.
static MADE: AtomicU32 = AtomicU32::new(0);

pub struct ExtraEngine {
    pub name: String,
    dir: tempfile::TempDir,
    bridge: String,
    daemon: Option<Child>,
}

/// `cmd`'s trimmed output; a hung engine (or anything else) gets the
/// bounded wait of `command.rs`.
fn run(cmd: &mut Command) -> Result<String, String> {
    let out = crate::command::run_within(cmd, crate::command::DOCKER_LIMIT).map_err(|e| e.to_string())?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// A private /24 no interface of this host uses.
fn free_subnet(seed: u32) -> Result<u32, String> {
    let used = run(Command::new("ip").args(["-4", "-o", "addr"]))?;
    (0..250)
        .map(|k| 10 + (seed * 7 + k) % 240)
        .find(|n| !used.contains(&format!("10.213.{n}.")))
        .ok_or_else(|| "no free 10.213.x.0/24 subnet for a test bridge".to_owned())
}

impl ExtraEngine {
    /// Starts an engine named `name` and loads `images` from the host's engine.
    pub fn start(name: &str, images: &[&str]) -> Result<Self, String> {
        let n = MADE.fetch_add(1, Ordering::SeqCst);
        let bridge = format!("drv{}x{n}", std::process::id() % 100_000);
        let subnet = free_subnet(std::process::id() + n)?;
        let dir = tempfile::Builder::new().prefix("drover-engine-").tempdir().map_err(|e| e.to_string())?;
        run(Command::new("ip").args(["link", "add", &bridge, "type", "bridge"]))?;
        let mut engine = Self { name: name.to_owned(), dir, bridge, daemon: None };
        run(Command::new("ip").args(["addr", "add", &format!("10.213.{subnet}.1/24"), "dev", &engine.bridge]))?;
        run(Command::new("ip").args(["link", "set", &engine.bridge, "up"]))?;
        let config = serde_json::json!({
            "data-root": engine.dir.path().join("data"),
            // Docker 20.10 derives the daemon's ID (`docker info`'s ID) from
            // this key, by default the host's /etc/docker/key.json: without
            // a key of its own this engine would be the host's daemon to
            // drover, as a second daemon on one host is. Each extra engine
            // stands for a host of its own. (Docker 23 and later keep the ID
            // in the data root instead.)
            "deprecated-key-path": engine.dir.path().join("key.json"),
            "storage-driver": "fuse-overlayfs",
            "log-driver": "json-file",
        });
        std::fs::write(engine.dir.path().join("daemon.json"), config.to_string()).map_err(|e| e.to_string())?;
        engine.launch()?;
        let saved = engine.dir.path().join("images.tar");
        run(Command::new("docker").args(["save", "-o"]).arg(&saved).args(images))?;
        engine.docker(&["load", "-q", "-i", &saved.to_string_lossy()])?;
        let _ = std::fs::remove_file(saved);
        Ok(engine)
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    pub fn socket(&self) -> PathBuf {
        self.path("docker.sock")
    }

    /// `unix:///...`, as drover registers it.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket().display())
    }

    fn launch(&mut self) -> Result<(), String> {
        let log = std::fs::File::create(self.path("dockerd.log")).map_err(|e| e.to_string())?;
        let ns = format!("{}-{}", self.bridge, self.name);
        let child = Command::new("dockerd")
            .arg("--config-file")
            .arg(self.path("daemon.json"))
            .arg("--host")
            .arg(self.endpoint())
            .arg("--exec-root")
            .arg(self.path("exec"))
            .arg("--pidfile")
            .arg(self.path("docker.pid"))
            .args(["--containerd-namespace", &ns, "--containerd-plugins-namespace", &format!("{ns}-p")])
            .args(["--iptables=false", "--ip-masq=false", "--bridge", &self.bridge])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting dockerd: {e}"))?;
        self.daemon = Some(child);
        let started = Instant::now();
        while self.docker(&["version", "--format", "{{.Server.Version}}"]).is_err() {
            if started.elapsed() > Duration::from_secs(30) {
                let log = std::fs::read_to_string(self.path("dockerd.log")).unwrap_or_default();
                return Err(format!("dockerd for {} did not answer within 30 s:\n{log}", self.name));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(())
    }

    /// An API client of this engine.
    pub fn client(&self) -> Result<bollard::Docker, String> {
        let socket = self.socket();
        let limit = crate::command::DOCKER_LIMIT.as_secs();
        bollard::Docker::connect_with_unix(&socket.to_string_lossy(), limit, bollard::API_DEFAULT_VERSION)
            .map_err(|e| format!("connecting to {}: {e}", self.endpoint()))
    }

    /// The docker CLI against this engine.
    pub fn docker(&self, args: &[&str]) -> Result<String, String> {
        run(Command::new("docker").arg("-H").arg(self.endpoint()).args(args))
    }

    /// Names of the containers of `pool` here, running or not.
    pub fn pool_containers(&self, pool: &str) -> Vec<(String, bool)> {
        let filter = format!("label=drover.dev/pool={pool}");
        self.docker(&["ps", "-a", "--filter", &filter, "--format", "{{.Names}} {{.State}}"])
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_once(' ').map(|(n, s)| (n.to_owned(), s == "running")))
            .collect()
    }

    /// Stops the daemon (SIGTERM to its own pid, then SIGKILL after 30 s):
    /// the host is lost. Its containers stop with it.
    pub fn stop(&mut self) {
        let Some(mut child) = self.daemon.take() else { return };
        let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(30) {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Starts the daemon again on the same data: the host is back.
    pub fn restart(&mut self) -> Result<(), String> {
        self.launch()
    }
}

impl Drop for ExtraEngine {
    fn drop(&mut self) {
        if self.daemon.is_some() {
            // Remove what tests left, then stop the daemon.
            if let Ok(ids) = self.docker(&["ps", "-aq"]) {
                let ids: Vec<&str> = ids.split_whitespace().collect();
                if !ids.is_empty() {
                    let mut args = vec!["rm", "-f"];
                    args.extend(ids);
                    let _ = self.docker(&args);
                }
            }
        }
        self.stop();
        let _ = run(Command::new("ip").args(["link", "del", &self.bridge]));
    }
}
