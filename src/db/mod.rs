//! Storage: SQLite (embedded, the default) or PostgreSQL (shared by
//! several replicas), their connection pools and migrations
//! (`migrations/sqlite`, `migrations/postgres`), and one module of queries
//! per table, each statement written once for both stores ([`exec`]).
//! Every state change and the event that explains it are written in one
//! transaction.

pub mod apply_sets;
pub mod audit;
pub mod clusters;
pub mod engines;
pub mod events;
pub mod gauges;
pub mod health;
pub mod idempotency;
pub mod leases;
pub mod machines;
pub mod namespaces;
pub mod page;
pub mod pools;
pub mod retention;
pub mod revisions;
mod text;
pub mod tokens;
pub mod upgrade_components;
pub mod upgrade_steps;
pub mod upgrades;

pub mod exec;
pub mod freshness;
mod gate;
pub mod notify;
pub mod pool_cache;
mod pool_row;
mod store;

pub use crate::config::Location;
pub use gate::{Priority, WriteTx};
pub use store::{Db, connect, connect_with_leases, run_checkpoints, session_name};
