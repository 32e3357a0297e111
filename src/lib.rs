//! drover: an HTTP admin service that keeps Docker machine pools at their
//! desired size and image, and upgrades self-hosted Kubernetes control
//! planes, as one process on SQLite or as several replicas on PostgreSQL.
//! docs/architecture.md has one line per folder and where to change what.
//!
//! A tour, from the outside in:
//! - [`config`]: command-line flags and their environment fallbacks.
//! - [`cli`]: the client commands (`drover pools ...`, `drover apply`).
//! - [`app`]: builds the service and runs it until a shutdown signal.
//! - [`state`]: what every handler shares (`AppState`): the services.
//! - [`http`]: the API routes, one module per resource, their wire types,
//!   the OpenAPI document, and the accept loop with its connection limits.
//!   A handler parses, calls one service function and answers; it never
//!   touches the store (scripts/layers.py checks it).
//! - [`identity`]: who may call: tokens, OIDC issuers, client
//!   certificates, and the role each route needs; [`audit`]: what they did.
//! - [`tls`]: HTTPS for the listener, mutual TLS, certificate reload.
//! - [`error`]: the API's one error type, answered as RFC 9457 problems.
//! - The features, each a service with an error type of its own:
//!   [`pools`] (pools, rollouts, machines), [`engines`] (the Docker engines
//!   pools run on), [`clusters`], [`upgrade`] (control-plane upgrade jobs),
//!   [`apply`] (declarative fleets), [`namespaces`] (what every pool,
//!   cluster, job and apply set belongs to), [`events`] (histories and
//!   change notices), [`idempotency`].
//! - [`reconcile`]: the pool reconciler: observe, decide (pure), execute,
//!   record.
//! - [`replicas`]: several replicas on PostgreSQL: leases (pools' and
//!   jobs'), their keeper, and the other replicas' change notices.
//! - [`runtime`]: talking to a container engine: Docker (bollard) or the
//!   simulation.
//! - [`k8s`]: the Kubernetes calls upgrades and drains make.
//! - [`retention`]: the pruner that keeps audit, events, jobs and keys bounded.
//! - [`db`]: the store, SQLite or PostgreSQL: one module per table, every
//!   statement written once for both, and the cache of pools.
//! - [`domain`]: pure types and rules: names, versions, images, specs.
//! - [`metrics`], [`telemetry`], [`clock`]: what the rest measures, logs
//!   and reads the time from.

pub mod app;
pub mod apply;
pub mod audit;
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
pub mod namespaces;
pub mod pools;
pub mod reconcile;
pub mod replicas;
pub mod retention;
pub mod runtime;
pub mod state;
pub mod telemetry;
pub mod tls;
pub mod upgrade;
