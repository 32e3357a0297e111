//! drover: an HTTP admin service that keeps Docker machine pools at their
//! desired size and image.
//!
//! A tour, from the outside in:
//! - [`config`]: command-line flags and their environment fallbacks.
//! - [`cli`]: the client commands (`drover pools ...`) that talk to a server.
//! - [`app`]: builds the service and runs it until a shutdown signal.
//! - [`state`]: what every handler shares (`AppState`): the services.
//! - [`http`]: the API routes, one module per resource, the OpenAPI document,
//!   and the accept loop with its connection limits. A handler parses,
//!   calls one service function and answers; it never touches the store
//!   (scripts/layers.py checks it).
//! - The services, each with only what it uses and an error type of its
//!   own: [`pools`] (pools, rollouts, machines), [`clusters`] (and the one
//!   way from stored credentials to a cluster client), [`upgrade`]'s
//!   `service`, [`engines`], [`auth`]'s `tokens`, [`events`] (for the
//!   event streams), [`idempotency`].
//! - [`error`]: the API's one error type, answered as RFC 9457 problems.
//! - [`auth`]: bearer tokens (held in memory), roles and the audit trail.
//! - [`access`]: OIDC issuers and client-certificate subjects, mapped to roles.
//! - [`tls`]: HTTPS for the listener, mutual TLS, certificate reload.
//! - [`changes`]: "pool X / job Y changed" notices that wake event streams.
//! - [`retention`]: the pruner that keeps audit, events, jobs and keys bounded.
//! - [`reconcile`]: the pool reconciler: observe, decide (pure), execute,
//!   record.
//! - [`runtime`]: the container engines: Docker (bollard) and a simulation.
//! - [`upgrade`]: control-plane upgrade jobs: persisted steps, each safe to redo.
//! - [`k8s`]: the Kubernetes calls upgrades and drains make.
//! - [`db`]: SQLite storage, one module per table.
//! - [`domain`]: pure types and rules: names, versions, images, specs.
//! - [`apply`]: declarative fleets: documents, the planner, the service
//!   behind `POST /v1/apply` and `drover apply`.

pub mod app;
pub mod apply;
pub mod audit;
pub mod changes;
pub mod cli;
pub mod clock;
pub mod clusters;
pub mod config;
pub mod db;
pub mod domain;
pub mod engines;
pub mod error;
pub mod events;
pub mod http;
pub mod idempotency;
pub mod identity;
pub mod k8s;
pub mod metrics;
pub mod pools;
pub mod reconcile;
pub mod replicas;
pub mod retention;
pub mod runtime;
pub mod state;
pub mod telemetry;
pub mod tls;
pub mod upgrade;
