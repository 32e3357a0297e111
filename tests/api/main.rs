//! All integration tests, in one binary to keep link time low.

mod apply;
mod chaos;
mod chaos_checks;
mod cli;
mod clusters;
#[path = "../support/command.rs"]
mod command;
mod connections;
mod consistency;
mod cors;
mod crashes;
mod docker;
mod drain;
mod engines;
#[path = "../support/engines.rs"]
mod engines_support;
mod faults;
mod hardening;
mod helpers;
mod image;
#[path = "../support/images.rs"]
mod images;
mod job_leases;

#[path = "../support/kube_sim.rs"]
mod kube_sim;
mod lifecycle;
mod metrics;
mod namespaces;
mod oidc;
mod openapi;
mod opt_outs;
mod passes;
#[path = "../support/pki.rs"]
mod pki;
mod placement;
mod pools;
#[path = "../support/postgres.rs"]
mod postgres;
mod process;
mod reconcile;
mod replicas;
mod rig;
mod rollouts;
mod schema_parity;
mod security;
mod soak;
mod streams;
mod tls;
mod traces;
mod ui;
mod upgrade_crash;
mod upgrade_env;
mod upgrade_runner;
mod upgrades;
