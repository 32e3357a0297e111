//! SQLite storage: the connection pool, migrations, and one module of
//! queries per table. Every state change and the event that explains it are
//! written in one transaction.

pub mod audit;
pub mod clusters;
pub mod engines;
pub mod events;
pub mod idempotency;
pub mod machines;
pub mod pool_spec;
pub mod pools;
pub mod revisions;
mod text;
pub mod tokens;
pub mod upgrade_components;
pub mod upgrade_steps;
pub mod upgrades;

mod gate;
pub mod pool_cache;
mod pool_row;
mod store;

pub use gate::{Priority, WriteTx};
pub use store::{Db, connect, run_checkpoints};

/// Opaque page cursors: base64url of the last key a page returned.
pub mod cursor {
    use base64::Engine as _;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;

    pub fn encode(key: &str) -> String {
        URL_SAFE_NO_PAD.encode(key)
    }

    pub fn decode(cursor: &str) -> Option<String> {
        URL_SAFE_NO_PAD.decode(cursor).ok().and_then(|b| String::from_utf8(b).ok())
    }
}
