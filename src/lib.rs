//! drover: an HTTP admin service that keeps Docker machine pools at their
//! desired size and image.
//!
//! A tour, from the outside in:
//! - [`config`]: command-line flags and their environment fallbacks.
//! - [`cli`]: the client commands (`drover pools ...`) that talk to a server.
//! - [`app`]: builds the service and runs it until a shutdown signal.
//! - [`state`]: what every handler shares (`AppState`).
//! - [`http`]: the API routes, one module per resource, the OpenAPI document,
//!   and the accept loop with its connection limits.
//! - [`pools`], [`clusters`]: the application services handlers call: the
//!   logic between a parsed request and the store (spec changes with
//!   optimistic concurrency, rollbacks, plans; reaching a cluster).
//! - [`error`]: the API's one error type, answered as RFC 9457 problems.
//! - [`auth`]: bearer tokens (held in memory), roles and the audit trail.
//! - [`changes`]: "pool X / job Y changed" notices that wake event streams.
//! - [`retention`]: the pruner that keeps audit, events, jobs and keys bounded.
//! - [`reconcile`]: the pool reconciler: observe, plan (pure), execute, record.
//! - [`runtime`]: the container runtimes: Docker (bollard) and a simulation.
//! - [`upgrade`]: control-plane upgrade jobs: persisted steps, each safe to redo.
//! - [`k8s`]: Kubernetes clients from stored credentials, and the calls upgrades make.
//! - [`db`]: SQLite storage, one module per table.
//! - [`domain`]: pure types and rules: names, versions, images, specs.

pub mod app;
pub mod auth;
pub mod changes;
pub mod cli;
pub mod clock;
pub mod clusters;
pub mod config;
pub mod db;
pub mod domain;
pub mod engines;
pub mod error;
pub mod http;
pub mod k8s;
pub mod metrics;
pub mod pools;
pub mod reconcile;
pub mod retention;
pub mod runtime;
pub mod state;
pub mod telemetry;
pub mod upgrade;
