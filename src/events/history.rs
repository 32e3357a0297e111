//! Events as the event streams read them: what a subject's history holds
//! after an id, and where it ends now. Pages of a history are read through
//! the service of the subject (pools, upgrades, engines), which first checks
//! that the subject exists.

use crate::db::{self, Db};
use crate::domain::event::Event;
use crate::domain::object::ObjectRef;

#[derive(Clone)]
pub struct Events {
    db: Db,
}

impl Events {
    pub fn new(db: Db) -> Self {
        Self { db }
    }

    /// Up to `limit` events of a subject with ids above `after`, oldest first.
    pub async fn after(&self, of: &ObjectRef, after: i64, limit: u32) -> sqlx::Result<Vec<Event>> {
        db::events::after(self.db.read(), of, after, limit).await
    }

    /// The id of a subject's newest event, 0 when it has none.
    pub async fn last_id(&self, of: &ObjectRef) -> sqlx::Result<i64> {
        db::events::last_id(self.db.read(), of).await
    }
}
