//! The container image, tried: the Dockerfile's last stage, built from
//! the Dockerfile's own text with the build stage's two outputs (the static
//! binary, the empty data directory) taken from this machine, run with the
//! engine's socket mounted and its data on a volume, driven over HTTP, then
//! stopped and run again on the same volume.
//!
//! The build stage itself needs a registry (its `FROM rust:...`), which
//! tests cannot reach; `scripts/static_binary.sh` builds the same binary
//! with the same flags (a test below compares them) and `scripts/test.sh`
//! passes its path in [`STATIC_BINARY`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::command;
use crate::docker::{Cleanup, SKIP_DOCKER, V1, require_docker};
use crate::helpers::{client_with_token, unique, wait_for};

/// Where the static binary is (`scripts/static_binary.sh` prints it).
const STATIC_BINARY: &str = "DROVER_STATIC_BINARY";

const DOCKERFILE: &str = include_str!("../../Dockerfile");
const STATIC_SCRIPT: &str = include_str!("../../scripts/static_binary.sh");

/// What the build stage leaves in its `/out`, which the last stage copies:
/// the path there, and the name this test gives the local stand-in in the
/// build context.
const STAGE_OUTPUTS: [(&str, &str); 2] = [("/out/drover", "drover"), ("/out/data", "data")];

/// How long the whole test may take: two starts of drover, one machine,
/// an image build of some 30 MB.
const LIMIT: Duration = Duration::from_secs(180);

/// The instructions of the Dockerfile's last stage, continuation lines
/// joined and comments left out, its `FROM` first.
fn last_stage(dockerfile: &str) -> Vec<String> {
    let mut instructions: Vec<String> = Vec::new();
    let mut pending = String::new();
    for line in dockerfile.lines().map(str::trim).filter(|l| !l.starts_with('#')) {
        match line.strip_suffix('\\') {
            Some(part) => pending.push_str(part),
            None => {
                pending.push_str(line);
                let done = std::mem::take(&mut pending);
                if !done.trim().is_empty() {
                    instructions.push(done.split_whitespace().collect::<Vec<_>>().join(" "));
                }
            }
        }
    }
    let from = instructions.iter().rposition(|i| keyword(i) == "FROM").expect("the Dockerfile has a FROM");
    instructions.split_off(from)
}

fn keyword(instruction: &str) -> String {
    instruction.split_whitespace().next().unwrap_or_default().to_ascii_uppercase()
}

/// The last stage with each `COPY --from=...` reading the build context
/// instead, by the names of [`STAGE_OUTPUTS`]; every other instruction as
/// written. Fails on a stage output this test does not know.
fn local_stage(stage: &[String]) -> Result<String, String> {
    let mut out = String::new();
    for instruction in stage {
        let words: Vec<&str> = instruction.split_whitespace().collect();
        if keyword(instruction) == "COPY" && words.iter().any(|w| w.starts_with("--from=")) {
            let paths: Vec<&str> = words[1..].iter().filter(|w| !w.starts_with("--")).copied().collect();
            let [source, target] = paths.as_slice() else {
                return Err(format!("{instruction:?}: one source and one target expected"));
            };
            let Some((_, local)) = STAGE_OUTPUTS.iter().find(|(built, _)| built == source) else {
                return Err(format!("{instruction:?}: the test has no stand-in for {source}; add it to STAGE_OUTPUTS"));
            };
            out.push_str(&format!("COPY {local} {target}\n"));
        } else {
            out.push_str(instruction);
            out.push('\n');
        }
    }
    Ok(out)
}

/// The flags of a `cargo build` line: each word from `cargo build` on, and
/// the `RUSTFLAGS` it runs with; where the output goes left out.
fn build_flags(text: &str) -> Vec<String> {
    let joined = text.replace("\\\n", " ");
    let line =
        joined.lines().find(|l| !l.trim_start().starts_with('#') && l.contains("cargo build")).unwrap_or_default();
    let rustflags = line.split("RUSTFLAGS=\"").nth(1).and_then(|r| r.split('"').next()).unwrap_or_default();
    let mut flags: Vec<String> = vec![format!("RUSTFLAGS={rustflags}")];
    let after = line.split("cargo build").nth(1).unwrap_or_default();
    let mut words = after.split_whitespace().take_while(|w| !matches!(*w, "&&" | ">&2" | ";"));
    while let Some(word) = words.next() {
        if word == "--target-dir" {
            words.next();
        } else {
            flags.push(word.to_owned());
        }
    }
    flags.sort();
    flags
}

#[test]
fn the_test_reads_the_last_stage_of_the_dockerfile_and_its_build_flags() {
    let stage = last_stage(DOCKERFILE);
    assert_eq!(stage[0], "FROM scratch", "the image's last stage is an empty base: {stage:#?}");
    let local = local_stage(&stage).unwrap_or_else(|e| panic!("{e}"));
    assert!(local.contains("COPY drover /drover\n") && local.contains("COPY data /data\n"), "{local}");
    assert!(local.contains("ENTRYPOINT [\"/drover\"]\n") && local.contains("VOLUME /data\n"), "{local}");
    assert!(!local.contains("--from"), "{local}");
    let unknown = local_stage(&["COPY --from=build /out/other /other".to_owned()]);
    assert!(unknown.is_err_and(|e| e.contains("/out/other")), "a stage output without a stand-in is named");
    let continued = last_stage("FROM a AS b\nRUN x\nFROM scratch\n# note\nENV A=1 \\\n    B=2\nCMD [\"serve\"]\n");
    assert_eq!(continued, ["FROM scratch", "ENV A=1 B=2", "CMD [\"serve\"]"]);

    let (image, script) = (build_flags(DOCKERFILE), build_flags(STATIC_SCRIPT));
    assert!(image.iter().any(|f| f == "RUSTFLAGS=-C target-feature=+crt-static"), "{image:?}");
    assert!(image.iter().any(|f| f == "--release"), "{image:?}");
    assert_eq!(script, image, "scripts/static_binary.sh builds drover as the Dockerfile does");
}

/// The static binary, or the reason there is none.
fn static_binary() -> PathBuf {
    let Some(path) = std::env::var_os(STATIC_BINARY).filter(|p| !p.is_empty()) else {
        panic!(
            "this test runs the container image, which holds drover built as a static binary as the Dockerfile \
             builds it: build it with `bash scripts/static_binary.sh` and pass the path it prints in \
             {STATIC_BINARY} (scripts/test.sh does both), or set {SKIP_DOCKER}=1 to list the Docker tests as ignored"
        );
    };
    let path = PathBuf::from(path);
    assert!(
        path.is_file(),
        "{STATIC_BINARY}={} is not a file; rebuild it with scripts/static_binary.sh",
        path.display()
    );
    path
}

/// `docker <args>`, failing the test with the reason.
fn docker(args: &[&str]) -> String {
    command::docker(args).unwrap_or_else(|e| panic!("{e}"))
}

/// The image, its containers and its volume, removed when the test ends,
/// pass or fail, each by name and within the docker calls' limit. Never
/// panics (see `docker::Cleanup`). Declare it after the pool's `Cleanup`,
/// so that drover is gone before the pool's machines are swept.
struct Rig {
    image: String,
    volume: String,
    containers: Vec<String>,
    context: tempfile::TempDir,
}

impl Drop for Rig {
    fn drop(&mut self) {
        let mut calls: Vec<Vec<&str>> = self.containers.iter().map(|c| vec!["rm", "-f", c.as_str()]).collect();
        calls.push(vec!["volume", "rm", "-f", &self.volume]);
        calls.push(vec!["rmi", "-f", &self.image]);
        for args in calls {
            if let Err(e) = command::docker(&args) {
                eprintln!("image test: may be left behind: {e}");
                if e.timed_out() {
                    return;
                }
            }
        }
    }
}

impl Rig {
    /// Builds the last stage into an image named after `name`.
    fn build(name: &str, binary: &Path) -> Rig {
        let context = tempfile::TempDir::new().expect("a build context");
        let dockerfile = local_stage(&last_stage(DOCKERFILE)).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(context.path().join("Dockerfile"), &dockerfile).expect("writing the Dockerfile");
        std::fs::copy(binary, context.path().join("drover")).expect("copying the static binary");
        std::fs::create_dir(context.path().join("data")).expect("the data directory");
        let rig = Rig {
            image: format!("drover-test/image:{name}"),
            volume: format!("drover-test-{name}"),
            containers: Vec::new(),
            context,
        };
        let ctx = rig.context.path().to_str().expect("a UTF-8 path");
        docker(&["build", "-q", "-t", &rig.image, ctx]);
        rig
    }

    /// Runs the image as the Dockerfile's header says (the engine's socket
    /// mounted, the data on a volume), its port published on loopback;
    /// answers its address.
    fn run(&mut self, name: &str) -> String {
        self.containers.push(name.to_owned());
        let socket = format!("{}:/var/run/docker.sock", engine_socket());
        let data = format!("{}:/data", self.volume);
        docker(&["run", "-d", "--name", name, "-v", &socket, "-v", &data, "-p", "127.0.0.1::8080", &self.image]);
        let port = docker(&["port", name, "8080/tcp"]);
        let port = port.lines().next().and_then(|l| l.rsplit(':').next()).unwrap_or_default().to_owned();
        assert!(port.parse::<u16>().is_ok(), "docker port {name}: {port:?}");
        format!("http://127.0.0.1:{port}")
    }

    /// The admin token drover wrote on its first start, read from the volume.
    fn admin_token(&self, container: &str) -> String {
        let at = self.context.path().join("admin.token");
        docker(&["cp", &format!("{container}:/data/admin.token"), at.to_str().expect("a UTF-8 path")]);
        std::fs::read_to_string(&at).expect("the copied token").trim().to_owned()
    }

    /// Stops `container` as an orchestrator would (SIGTERM, then a grace
    /// period longer than drover's stop timeout) and answers its exit code.
    fn stop(&self, container: &str) -> String {
        docker(&["stop", "-t", "30", container]);
        docker(&["inspect", "-f", "{{.State.ExitCode}}", container])
    }

    fn logs(&self, container: &str) -> String {
        command::docker(&["logs", "--tail", "40", container]).unwrap_or_else(|e| e.to_string())
    }
}

/// The engine's socket on this host: `DOCKER_HOST`'s when it is one,
/// else the default.
fn engine_socket() -> String {
    let host = std::env::var("DOCKER_HOST").unwrap_or_default();
    host.strip_prefix("unix://").unwrap_or("/var/run/docker.sock").to_owned()
}

/// How long drover may take to answer after its container started.
const UP_WITHIN: Duration = Duration::from_secs(30);
/// How long a pool may take to be ready: one machine, its settle time.
const READY_WITHIN: Duration = Duration::from_secs(60);

/// Polls `GET /healthz` until drover in `container` answers; the panic
/// shows its log. (`wait_for` gets a longer limit than the timeout around
/// it, so that the timeout, which can name the log, ends the wait.)
async fn wait_up(rig: &Rig, container: &str, addr: &str) {
    let client = reqwest::Client::new();
    let up = async || client.get(format!("{addr}/healthz")).send().await.is_ok_and(|r| r.status().is_success());
    let waited = tokio::time::timeout(UP_WITHIN, wait_for(2 * UP_WITHIN, "drover to answer /healthz", up)).await;
    if waited.is_err() {
        panic!("drover in {container} did not answer within {UP_WITHIN:?}; its log:\n{}", rig.logs(container));
    }
}

/// The pool as `addr` serves it, once `done` holds; the panic shows the
/// last state seen.
async fn wait_pool(
    client: &reqwest::Client,
    addr: &str,
    pool: &str,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let url = format!("{addr}/v1/pools/{pool}");
    let mut seen = Value::Null;
    let poll = async || {
        seen = match client.get(&url).send().await {
            Ok(res) => res.json().await.unwrap_or(Value::Null),
            Err(_) => Value::Null,
        };
        done(&seen)
    };
    if tokio::time::timeout(READY_WITHIN, wait_for(2 * READY_WITHIN, what, poll)).await.is_err() {
        panic!("timed out after {READY_WITHIN:?} waiting for {what}; the pool is {seen:#}");
    }
    seen
}

/// The names of the pool's machines, as `addr` serves them.
async fn machine_names(client: &reqwest::Client, addr: &str, pool: &str) -> Vec<String> {
    let url = format!("{addr}/v1/pools/{pool}/machines");
    let page: Value = client.get(url).send().await.expect("listing machines").json().await.expect("machines JSON");
    let items = page["items"].as_array().map_or(&[][..], Vec::as_slice);
    items.iter().map(|m| m["name"].as_str().unwrap_or_default().to_owned()).collect()
}

fn ready(pool: &Value) -> bool {
    let s = &pool["status"];
    pool["generation"] == s["observed_generation"] && s["ready_replicas"] == 1 && s["replicas"] == 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn the_container_image_runs_a_pool_to_ready_and_keeps_its_store_on_the_volume() {
    require_docker();
    let binary = static_binary();
    let name = unique("image");
    let pool = unique("img");
    let _machines = Cleanup(vec![pool.clone()]);
    let mut rig = Rig::build(&name, &binary);
    let run = async {
        let first = format!("drover-test-{name}-1");
        let addr = rig.run(&first);
        wait_up(&rig, &first, &addr).await;
        let token = rig.admin_token(&first);
        let client = client_with_token(&token);
        let body = json!({"name": pool, "replicas": 1, "version": V1});
        let res = client.post(format!("{addr}/v1/pools")).json(&body).send().await.expect("creating the pool");
        assert_eq!(res.status(), StatusCode::CREATED, "{}", res.text().await.unwrap_or_default());
        let seen = wait_pool(&client, &addr, &pool, "one ready machine, made by drover in its container", ready).await;
        let before = machine_names(&client, &addr, &pool).await;
        assert_eq!(rig.stop(&first), "0", "SIGTERM stops drover cleanly as PID 1; its log:\n{}", rig.logs(&first));

        // Another container on the same volume: the same store, token and pool.
        let second = format!("drover-test-{name}-2");
        let addr = rig.run(&second);
        wait_up(&rig, &second, &addr).await;
        let again = wait_pool(&client, &addr, &pool, "the pool, from the store on the volume", ready).await;
        assert_eq!(again["generation"], seen["generation"], "{again:#}");
        let after = machine_names(&client, &addr, &pool).await;
        assert_eq!(after, before, "the machine made before the restart is adopted, not replaced");
        assert_eq!(rig.stop(&second), "0", "its log:\n{}", rig.logs(&second));
    };
    if tokio::time::timeout(LIMIT, run).await.is_err() {
        panic!(
            "the image test did not finish within {LIMIT:?}: the engine is slow or hung, or drover in its \
             container never made the pool ready"
        );
    }
}
