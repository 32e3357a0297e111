//! The row a pool ([`Pool`], a domain type) is read from. Apart from the queries (`pools`) so that the cache of pools and
//! the write gate in front of it need not depend on them.
//!
//! The spec is kept as the document the API shows (`PoolSpecView`, every
//! default filled in) and read back as input through the spec's rules, so
//! the store needs no spec type of its own; rows written by earlier
//! releases, which lack later fields, read with those fields' defaults.

use chrono::{DateTime, Utc};

use crate::domain::object::{Namespace, PoolRef};
pub use crate::domain::pool::Pool;
use crate::domain::pool::PoolSpec;

#[derive(sqlx::FromRow)]
pub(super) struct PoolRow {
    namespace: String,
    name: String,
    generation: i64,
    version: i64,
    spec: String,
    status: String,
    deleting: bool,
    revision: i64,
    batches_approved: i64,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

impl TryFrom<PoolRow> for Pool {
    type Error = sqlx::Error;

    fn try_from(r: PoolRow) -> Result<Self, Self::Error> {
        let id = PoolRef::new(Namespace::stored(r.namespace), r.name);
        let decode = |what: &str, e: serde_json::Error| {
            sqlx::Error::Decode(format!("pool {id}: stored {what} is not valid: {e}").into())
        };
        // The document the API shows, read back through the spec's rules.
        let document = serde_json::from_str(&r.spec).map_err(|e| decode("spec", e))?;
        let spec = crate::domain::json::document(document)
            .and_then(PoolSpec::from_stored)
            .map_err(|e| sqlx::Error::Decode(format!("pool {id}: stored spec is not valid: {e}").into()))?;
        let status = serde_json::from_str(&r.status).map_err(|e| decode("status", e))?;
        Ok(Pool {
            id,
            generation: r.generation,
            version: r.version,
            spec,
            status,
            deleting: r.deleting,
            revision: r.revision,
            batches_approved: r.batches_approved,
            created_at: r.created_at,
            updated_at: r.updated_at,
        })
    }
}
