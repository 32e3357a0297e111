//! Programs the tests and the benchmarks run (the docker CLI above all),
//! each with a bounded wait. The Docker engine can hang: 20.10 deadlocks
//! when many containers are removed at once, and CI once waited hours on a
//! `docker` call that never returned. Every call here is killed at its
//! limit and fails with a message that names the engine, so a hung engine
//! costs a test, not the run.
//!
//! Shared by the integration tests and the benchmarks (each declares it as
//! `command` at its crate's root).

use std::fmt;
use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How long one docker CLI call may take. The slowest the tests make (an
/// image build, the removal of a few dozen containers) take seconds on an
/// engine that works; a minute means it does not.
pub const DOCKER_LIMIT: Duration = Duration::from_secs(60);

/// Why a bounded command gave no output.
#[derive(Debug)]
pub enum Failure {
    /// It could not be started at all.
    Start { shown: String, error: std::io::Error },
    /// It ran past its limit and was killed.
    TimedOut { shown: String, limit: Duration },
    /// It ended with a failure status.
    Failed { shown: String, stderr: String },
}

impl Failure {
    pub fn timed_out(&self) -> bool {
        matches!(self, Failure::TimedOut { .. })
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Start { shown, error } => write!(f, "{shown}: cannot start it: {error}"),
            Failure::TimedOut { shown, limit } if shown.starts_with("\"docker") => write!(
                f,
                "{shown} did not finish within {limit:?} and was killed: the Docker engine is most likely hung \
                 (Docker 20.10 can deadlock when many containers are removed at once; if `docker ps` hangs too, \
                 restart the engine)"
            ),
            Failure::TimedOut { shown, limit } => write!(f, "{shown} did not finish within {limit:?} and was killed"),
            Failure::Failed { shown, stderr } => write!(f, "{shown} failed: {}", stderr.trim()),
        }
    }
}

/// Runs `cmd` to its end, for `limit` at most, its output captured; kills
/// it at the limit. A failure status is an error too.
pub fn run_within(cmd: &mut Command, limit: Duration) -> Result<Output, Failure> {
    let shown = format!("{cmd:?}");
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|error| Failure::Start { shown: shown.clone(), error })?;
    // Each pipe is read on a thread of its own: a child blocked on a full
    // pipe would never exit, and this thread only polls.
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let deadline = Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            // Expired (or cannot be waited on): killed by its own handle,
            // so by its pid. Its reader threads end when its pipes close.
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Failure::TimedOut { shown, limit });
            }
        }
    };
    let output = Output { status, stdout: collect(stdout), stderr: collect(stderr) };
    if output.status.success() {
        Ok(output)
    } else {
        Err(Failure::Failed { shown, stderr: String::from_utf8_lossy(&output.stderr).into_owned() })
    }
}

/// `docker <args>` against the engine of the environment (`DOCKER_HOST`,
/// else the local socket), within [`DOCKER_LIMIT`]: its standard output,
/// trimmed.
pub fn docker(args: &[&str]) -> Result<String, Failure> {
    let out = run_within(Command::new("docker").args(args).env("DOCKER_BUILDKIT", "0"), DOCKER_LIMIT)?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Awaits `call` (a request to an engine's API) for [`DOCKER_LIMIT`] at
/// most. bollard's own timeout bounds a request until its answer's headers
/// arrive; a body read after them (a listing) has none.
pub async fn engine_call<T>(what: &str, call: impl Future<Output = T>) -> Result<T, String> {
    tokio::time::timeout(DOCKER_LIMIT, call).await.map_err(|_| {
        format!(
            "{what}: the Docker engine did not answer within {DOCKER_LIMIT:?}; it is most likely hung (if \
             `docker ps` hangs too, restart the engine)"
        )
    })
}

type Reader = Option<std::thread::JoinHandle<Vec<u8>>>;

fn drain(pipe: Option<impl Read + Send + 'static>) -> Reader {
    pipe.map(|mut pipe| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    })
}

fn collect(reader: Reader) -> Vec<u8> {
    reader.and_then(|r| r.join().ok()).unwrap_or_default()
}

// Paths in full rather than `use super::*`: a benchmark that declares this
// module may compile it with cfg(test) but without its tests.
#[cfg(test)]
mod tests {
    #[test]
    fn a_command_past_its_limit_is_killed_and_the_error_says_so() {
        let started = std::time::Instant::now();
        let sleep = super::run_within(std::process::Command::new("sleep").arg("30"), super::Duration::from_millis(200));
        let err = sleep.unwrap_err();
        assert!(err.timed_out(), "{err}");
        assert!(started.elapsed() < super::Duration::from_secs(5), "killed at its limit, not waited out");
        assert!(err.to_string().contains("did not finish within 200ms"), "{err}");
    }

    #[test]
    fn a_docker_call_past_its_limit_names_the_engine() {
        let err =
            super::Failure::TimedOut { shown: "\"docker\" \"rm\" \"-f\" \"x\"".into(), limit: super::DOCKER_LIMIT };
        assert!(err.to_string().contains("the Docker engine is most likely hung"), "{err}");
    }

    #[test]
    fn output_and_failures_come_back_whole() {
        let sh = |script: &str| {
            super::run_within(std::process::Command::new("sh").args(["-c", script]), super::Duration::from_secs(10))
        };
        let out = sh("echo out; echo err >&2").expect("sh runs");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n");
        let err = sh("echo bad >&2; exit 3").unwrap_err();
        assert!(matches!(&err, super::Failure::Failed { stderr, .. } if stderr.trim() == "bad"), "{err}");
    }
}
