//! All integration tests, in one binary to keep link time low.

mod cli;
mod clusters;
mod connections;
mod docker;
mod drain;
mod faults;
mod hardening;
mod helpers;
#[path = "../support/images.rs"]
mod images;
#[path = "../support/kube_sim.rs"]
mod kube_sim;
mod metrics;
mod openapi;
mod pools;
mod process;
mod reconcile;
mod rollouts;
mod security;
mod streams;
mod ui;
mod upgrade_env;
mod upgrades;
