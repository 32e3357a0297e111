//! The chaos run of `tests/api/chaos.rs` (the same code: three replicas,
//! random kills, pauses, cuts and database restarts while pools scale and
//! roll), for longer than the suite's 25 s: `cargo bench --bench chaos`.
//!
//! `DROVER_CHAOS_SECONDS` (default 300) of faults; `DROVER_CHAOS_SEED`
//! replays a run's schedule (its seed is printed first). Needs Docker and
//! PostgreSQL's binaries, as the tests do. Exits with an error, the
//! summary and every violation when a check fails.

use std::time::Duration;

// The test code, shared through `#[path]` as the other benches share it.
// Each module carries more than this run uses.
#[allow(dead_code)]
#[path = "../tests/api/chaos.rs"]
mod chaos;
#[allow(dead_code)]
#[path = "../tests/api/chaos_checks.rs"]
mod chaos_checks;
#[allow(dead_code)]
#[path = "../tests/support/command.rs"]
mod command;
#[allow(dead_code, unused_imports)]
#[path = "../tests/api/docker.rs"]
mod docker;
#[allow(dead_code)]
#[path = "../tests/api/helpers.rs"]
mod helpers;
#[allow(dead_code)]
#[path = "../tests/support/images.rs"]
mod images;
#[allow(dead_code)]
#[path = "../tests/support/postgres.rs"]
mod postgres;
#[allow(dead_code)]
#[path = "../tests/api/process.rs"]
mod process;
#[allow(dead_code)]
#[path = "../tests/api/rig.rs"]
mod rig;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    docker::require_docker();
    let settings = chaos::Settings::new(Duration::from_secs(300), true);
    let names = chaos::pool_names();
    // Declared before the run, so dropped after its replicas have stopped.
    let _cleanup = docker::Cleanup(names.clone());
    let report = chaos::run(&settings, &names).await;
    println!("{}", report.summary);
    if !report.violations.is_empty() {
        println!("evidence:\n{}", report.evidence);
        anyhow::bail!("{} violations:\n{}", report.violations.len(), report.violations.join("\n"));
    }
    Ok(())
}
