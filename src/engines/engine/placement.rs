//! Whether an engine takes new machines now, and why not: draining, its
//! daemon another engine's or not the one registered, not reached,
//! unreachable, or backed off by its placement breaker
//! (`domain::placement`) after creates or first starts failed there.

use chrono::{DateTime, Utc};

use super::Engine;
use super::health::Reachability;
use super::identity::Mismatch;
use crate::engines::breaker::{Block, Breaker, Scope, Trip};
use crate::runtime::RuntimeError;

/// Why an engine takes no new machine now, for its status and the pools'.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unplaceable {
    pub block: Block,
    pub message: String,
    /// When placement is tried again, for a breaker that is open.
    pub retry_at: Option<DateTime<Utc>>,
}

impl Engine {
    fn breaker(&self) -> std::sync::MutexGuard<'_, Breaker> {
        self.breaker.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a failed create or first start; answers the trip when this
    /// failure opened the breaker (for the engine's event).
    pub fn placement_failed(&self, scope: Scope, error: &RuntimeError, now: DateTime<Utc>) -> Option<Trip> {
        let trip = self.breaker().failed(scope, &error.to_string(), now)?;
        tracing::warn!(engine = %self.name, error = %error, failures = trip.failures, until = %trip.until,
            "placement on this engine backed off");
        Some(trip)
    }

    /// Records a successful placement; answers whether it closed a breaker.
    pub fn placement_succeeded(&self, scope: &Scope) -> bool {
        self.breaker().succeeded(scope)
    }

    /// Why no new machine of `image` goes here now, if none does; `image`
    /// `None` asks about the engine as a whole (its status).
    pub fn unplaceable(&self, image: Option<&str>, now: DateTime<Utc>) -> Option<Unplaceable> {
        let h = self.health();
        let blocked = |block, message: String| Some(Unplaceable { block, message, retry_at: None });
        if self.draining() {
            return blocked(Block::Draining, "draining: its machines move to other engines".into());
        }
        if let Some(mismatch) = self.identity().mismatch() {
            let block = match mismatch {
                Mismatch::Duplicate { .. } => Block::DuplicateDaemon,
                Mismatch::Changed { .. } => Block::DaemonChanged,
            };
            return blocked(block, mismatch.message(&self.name));
        }
        let error = h.last_error.as_deref().map(|e| format!(": {e}")).unwrap_or_default();
        match h.reachability {
            Reachability::Reachable => {}
            Reachability::Syncing => {
                let retry_at = self.first_list_due(now);
                return Some(Unplaceable { block: Block::NotReached, message: "not listed yet".into(), retry_at });
            }
            _ if h.last_seen.is_none() => return blocked(Block::NotReached, format!("never answered{error}")),
            _ => return blocked(Block::Unreachable, format!("does not answer{error}")),
        }
        let breaker = self.breaker();
        let trip = match image {
            Some(image) => breaker.open_for(image, now),
            None => breaker.engine_open(now),
        }?;
        Some(Unplaceable {
            block: Block::Failing,
            message: format!("placement failed {} time(s) in a row: {}", trip.failures, trip.error),
            retry_at: image.and_then(|i| breaker.retry_at(i, now)).or(Some(trip.until)),
        })
    }

    /// Images this engine refused, until one is placed here again:
    /// (image, error, backed off until).
    pub fn refused_images(&self) -> Vec<(String, String, DateTime<Utc>)> {
        self.breaker().images().map(|(i, t)| (i.to_owned(), t.error.clone(), t.until)).collect()
    }
}
