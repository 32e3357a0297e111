//! Pools and their machines as an application: everything the API asks of
//! them, between the HTTP handlers (which parse and answer) and the store.
//!
//! - [`Pools`]: create, change (with optimistic concurrency), scale,
//!   delete, roll back, approve a batch, plan; read pools, their events,
//!   revisions and rollouts.
//! - [`Machines`]: a pool's machines, and choosing which one goes next.
//!
//! Each holds only what it uses, and answers [`PoolError`], which the HTTP
//! layer turns into a problem document.

mod error;
mod machines;
mod service;
mod wake;

pub use error::PoolError;
pub use machines::{Machines, PoolMachine, PoolMachines};
pub use service::{Planned, Pools, Rollout, target};
pub use wake::Wake;
