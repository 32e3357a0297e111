//! Everything about the Docker engines pools run on: registering them, the
//! live set drover drives, and each engine's health, placement and
//! informer. Talking to an engine (the Docker API, the simulation) is
//! [`crate::runtime`]'s; the `engines` table is [`crate::db::engines`]'s;
//! the routes are `http::engines`.
//!
//! - [`service`]: engines as a resource: register, drain, remove, follow
//!   what other replicas registered; bring the registered ones up at start.
//! - [`spec`]: a registration and its rules (pure).
//! - [`set`]: the engines drover drives, each with its informer task.
//! - [`engine`]: one engine: its backend, the cache of its containers, the
//!   container operations pools ask of it within its own limit, its
//!   health, its placement, and the informer that keeps its cache current.
//! - [`daemons`]: one Docker daemon, one engine: duplicates refused or
//!   kept from placement, a changed daemon held until an admin confirms.
//! - [`breaker`]: the backoff of an engine that failed to place machines
//!   (pure).
//! - [`events`]: what an engine's changes are called in its events.

pub mod breaker;
pub mod daemons;
pub mod engine;
pub mod events;
pub mod service;
pub mod set;
pub mod spec;

pub use engine::health::{EngineHealth, Reachability};
pub use engine::placement::Unplaceable;
pub use engine::{Engine, EngineSettings};
pub use service::*;
pub use set::{EngineSet, LOCAL_ENGINE};
