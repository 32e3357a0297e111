//! How fast drover scales and rolls a pool, next to what users would pick
//! instead, side by side in one run on the same engine:
//! - `engine`: the same containers straight through the engine's API, all
//!   at once (the engine's own limit);
//! - `swarm`: a Docker Swarm service on this engine (`service scale`, and
//!   `service update --update-parallelism 5 --update-order start-first
//!   --update-delay 0s`);
//! - `drover`: a pool scaled and rolled through drover's API, with
//!   `strategy.replacement` `termination_started` (the default) and
//!   `termination_complete`.
//!
//! Every peer is timed by the same observer, the engine's container list:
//! done means N containers of the new image running and none of the old.
//! drover's figure "ready" is its own status reporting N ready machines
//! (settled for 1 s), for reference.
//!
//! Two images: one whose process exits at once on SIGTERM, one that
//! ignores it, so every stop takes the whole grace period (10 s), as a
//! real node shutting down does.
//!
//! Run: `cargo bench --bench converge` (needs Docker; builds its images).
//! `DROVER_BENCH_N=50`, `DROVER_BENCH_ROUNDS=2` (best of),
//! `DROVER_BENCH_IMAGES=quick` or `stubborn` (default: both).

// Bounded docker CLI calls and engine requests, shared with the tests.
#[allow(dead_code)]
#[path = "../../tests/support/command.rs"]
mod command;
#[path = "../../tests/support/images.rs"]
mod images;

mod drover;
mod engine;
mod observe;
mod swarm;

use std::time::Duration;

use bollard::Docker;
use serde_json::json;

const SURGE: usize = 5;
const GRACE: u32 = 10;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

#[derive(Default, Clone, Copy)]
struct Best(Option<Duration>);

impl Best {
    fn add(&mut self, d: Duration) {
        self.0 = Some(self.0.map_or(d, |b| b.min(d)));
    }
    fn get(self) -> Duration {
        self.0.unwrap_or_default()
    }
}

#[derive(Default)]
struct Figures {
    engine_up: Best,
    swarm_up: Best,
    drover_up: Best,
    drover_up_ready: Best,
    engine_roll: Best,
    swarm_roll: Best,
    swarm_roll_own: Best,
    started_roll: Best,
    started_roll_ready: Best,
    complete_roll: Best,
    complete_roll_ready: Best,
}

async fn measure(
    docker: &Docker,
    swarm: &swarm::Swarm,
    from: &str,
    to: &str,
    n: usize,
    rounds: usize,
) -> anyhow::Result<Figures> {
    let mut f = Figures::default();
    let grace = Duration::from_secs(u64::from(GRACE));
    for round in 1..=rounds {
        eprintln!("{from} -> {to}, round {round}: engine");
        let mut engine = engine::Engine::new(docker.clone());
        let (up, old) = engine.scale_up(from, n).await?;
        f.engine_up.add(up);
        let (roll, new) = engine.replace(&old, to, i32::try_from(GRACE).unwrap_or(10)).await?;
        f.engine_roll.add(roll);
        engine.clean(&new).await?;

        eprintln!("{from} -> {to}, round {round}: swarm");
        swarm.create(from, GRACE, SURGE).await?;
        f.swarm_up.add(swarm.scale(from, n).await?);
        let (seen, own) = swarm.update(to, n).await?;
        f.swarm_roll.add(seen);
        f.swarm_roll_own.add(own);
        swarm.remove().await?;

        eprintln!("{from} -> {to}, round {round}: drover");
        let mut d = drover::Drover::start(docker.clone(), grace).await?;
        let strategy = json!({"max_surge": SURGE, "max_unavailable": 0});
        let pool = d.pool(from, strategy.clone()).await?;
        let up = d.scale(&pool, from, n).await?;
        f.drover_up.add(up.engine);
        f.drover_up_ready.add(up.status);
        let roll = d.roll(&pool, to, n).await?;
        f.started_roll.add(roll.engine);
        f.started_roll_ready.add(roll.status);
        d.delete(&pool).await?;
        let strict = json!({"max_surge": SURGE, "max_unavailable": 0, "replacement": "termination_complete"});
        let pool = d.pool(from, strict).await?;
        d.scale(&pool, from, n).await?;
        let roll = d.roll(&pool, to, n).await?;
        f.complete_roll.add(roll.engine);
        f.complete_roll_ready.add(roll.status);
        d.delete(&pool).await?;
        d.stop().await?;
    }
    Ok(f)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    images::build_once();
    let n = env("DROVER_BENCH_N", 50);
    let rounds = env("DROVER_BENCH_ROUNDS", 2).max(1);
    let docker = Docker::connect_with_defaults()?.negotiate_version().await?;
    let swarm = swarm::Swarm::join(docker.clone())?;
    let quick = (format!("kindest/node:{}", images::V1), format!("kindest/node:{}", images::V2));
    let stubborn = (images::STUBBORN_V1.to_owned(), images::STUBBORN_V2.to_owned());
    // DROVER_BENCH_IMAGES=quick or =stubborn runs one of the two images.
    let only = std::env::var("DROVER_BENCH_IMAGES").unwrap_or_default();
    let images =
        [("quick", "exits at once on SIGTERM", &quick), ("stubborn", "ignores SIGTERM (10 s grace)", &stubborn)];
    let mut results = Vec::new();
    for (_, what, (from, to)) in images.into_iter().filter(|(key, ..)| only.is_empty() || only.contains(key)) {
        match measure(&docker, &swarm, from, to, n, rounds).await {
            Ok(f) => results.push((what, f)),
            Err(e) => {
                swarm.leave();
                return Err(e);
            }
        }
    }
    swarm.leave();

    println!("Best of {rounds} rounds; every figure is until the engine lists the containers running.");
    println!();
    println!("(a) 0 -> {n} machines");
    println!();
    println!("| image | engine alone | Swarm | drover | drover / engine | drover / Swarm | drover, status ready |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (what, f) in &results {
        let (e, s, d) = (f.engine_up.get(), f.swarm_up.get(), f.drover_up.get());
        println!(
            "| {what} | {} | {} | {} | {:.2}x | {:.2}x | {} |",
            secs(e),
            secs(s),
            secs(d),
            d.as_secs_f64() / e.as_secs_f64(),
            d.as_secs_f64() / s.as_secs_f64(),
            secs(f.drover_up_ready.get())
        );
    }
    println!();
    println!("(b) rolling image change of {n} machines, surge {SURGE}, unavailable 0");
    println!();
    println!(
        "| image | engine alone (all at once) | Swarm | Swarm says done | drover `termination_started` | drover / Swarm | status ready | drover `termination_complete` | status ready |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (what, f) in &results {
        let (s, d) = (f.swarm_roll.get(), f.started_roll.get());
        println!(
            "| {what} | {} | {} | {} | {} | {:.2}x | {} | {} | {} |",
            secs(f.engine_roll.get()),
            secs(s),
            secs(f.swarm_roll_own.get()),
            secs(d),
            d.as_secs_f64() / s.as_secs_f64(),
            secs(f.started_roll_ready.get()),
            secs(f.complete_roll.get()),
            secs(f.complete_roll_ready.get()),
        );
    }
    Ok(())
}
