//! drover: an HTTP admin service that keeps Docker machine pools at their
//! desired size and image.
//!
//! A tour, from the outside in:
//! - [`config`]: command-line flags and their environment fallbacks.
//! - [`cli`]: the client commands (`drover pools ...`) that talk to a server.
//! - [`app`]: builds the service and runs it until a shutdown signal.
//! - [`http`]: the API routes, one module per resource, and the OpenAPI document.
//! - [`error`]: the API's one error type, answered as RFC 9457 problems.
//! - [`auth`]: bearer tokens, roles and the audit trail.
//! - [`reconcile`]: the pool reconciler: observe, plan (pure), execute, record.
//! - [`runtime`]: the container runtimes: Docker (bollard) and a simulation.
//! - [`upgrade`]: control-plane upgrade jobs: persisted steps, each safe to redo.
//! - [`k8s`]: Kubernetes clients from stored credentials, and the calls upgrades make.
//! - [`db`]: SQLite storage, one module per table.
//! - [`domain`]: pure types and rules: names, versions, images, specs.

pub mod app;
pub mod auth;
pub mod cli;
pub mod clock;
pub mod config;
pub mod db;
pub mod domain;
pub mod engines;
pub mod error;
pub mod http;
pub mod k8s;
pub mod metrics;
pub mod reconcile;
pub mod runtime;
pub mod telemetry;
pub mod upgrade;
