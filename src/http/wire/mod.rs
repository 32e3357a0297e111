//! Wire types shared by more than one resource module: what clients send
//! and receive. Resource modules import these, never each other.

pub mod pools;
pub mod upgrades;

pub use pools::{EventList, PoolView};
