//! Waking the reconciler and the event streams after a committed change.

/// Wakes the reconciler and the event streams of a pool.
#[derive(Clone)]
pub struct Wake {
    pub queue: crate::reconcile::worker::PoolQueue,
    pub changes: crate::events::changes::Changes,
}

impl Wake {
    pub fn pool(&self, pool: &crate::domain::object::PoolRef) {
        self.queue.enqueue(pool);
        self.changes.pool(pool);
    }
}
