//! All integration tests, in one binary to keep link time low.

mod clusters;
mod helpers;
#[path = "../support/kube_sim.rs"]
mod kube_sim;
mod openapi;
mod pools;
mod upgrade_env;
mod upgrades;
