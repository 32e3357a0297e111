//! The soak: drover SIGKILLed at random moments during rollouts and scale
//! changes of a 10-machine pool, and after each restart the world checked
//! whole: running == replicas, all on the desired image, no container left
//! in any other state, records == containers, status ready == replicas at
//! the current generation.
//!
//! A small count runs with every `cargo test`; `scripts/soak.sh 100` runs
//! the long one (DROVER_SOAK_ITERATIONS), whose result is in BENCHMARKS.md.

use std::time::{Duration, Instant};

use rand::RngExt;
use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::crashes::{Served, assert_converged};
use crate::docker::{self, Cleanup, STUBBORN_V1, STUBBORN_V2, require_docker};
use crate::helpers::unique;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(skip_docker_tests, ignore = "DROVER_SKIP_DOCKER_TESTS is set")]
async fn sigkill_at_random_moments_of_rollouts_and_scaling_always_converges_exactly() {
    require_docker();
    let iterations: usize = std::env::var("DROVER_SOAK_ITERATIONS").ok().and_then(|s| s.parse().ok()).unwrap_or(3);
    let pool = unique("soak");
    let _cleanup = Cleanup(vec![pool.clone()]);
    let d = docker::client().await;
    let mut served = Served::start().await;
    let spec =
        json!({"name": pool, "replicas": 10, "version": "v1.29.2", "image": STUBBORN_V1, "strategy": {"max_surge": 3}});
    assert_eq!(served.send(Method::POST, "/v1/pools", spec).await, StatusCode::CREATED);
    let (mut replicas, mut image) = (10usize, STUBBORN_V1);
    assert_converged(&served, &d, &pool, replicas, image).await;
    let path = format!("/v1/pools/{pool}");
    let started = Instant::now();
    for i in 0..iterations {
        let change = if rand::rng().random_bool(0.5) {
            image = if image == STUBBORN_V1 { STUBBORN_V2 } else { STUBBORN_V1 };
            json!({"image": image})
        } else {
            replicas = rand::rng().random_range(4..=14);
            json!({"replicas": replicas})
        };
        assert_eq!(served.send(Method::PATCH, &path, change.clone()).await, StatusCode::OK);
        // Not a wait for anything: the kill lands at a random moment of the
        // change, which is what the soak is about.
        let after = Duration::from_millis(rand::rng().random_range(0..3000));
        tokio::time::sleep(after).await;
        served.kill_and_restart().await;
        assert_converged(&served, &d, &pool, replicas, image).await;
        eprintln!("soak {}/{iterations}: {change} then SIGKILL after {after:?}: converged", i + 1);
    }
    eprintln!("soak: {iterations} kills, all converged, in {:?}", started.elapsed());
}
