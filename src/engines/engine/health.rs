//! Whether an engine can be reached: its health as a small state machine
//! (syncing, reachable, unreachable), the wake-ups that tell the reconciler
//! when it changes, and the announcement that an engine is given up for
//! lost once `--engine-lost-after` has passed without an answer.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use utoipa::ToSchema;

use super::{Engine, after};
use crate::runtime::{EngineChange, RuntimeError, Wake};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Reachability {
    /// Being listed for the first time, and no attempt has failed yet.
    Syncing,
    Reachable,
    Unreachable,
}

/// What drover knows of an engine's health.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineHealth {
    pub reachability: Reachability,
    /// When `reachability` last changed.
    pub since: DateTime<Utc>,
    pub version: Option<String>,
    pub last_error: Option<String>,
    /// Last time the engine answered.
    pub last_seen: Option<DateTime<Utc>>,
}

/// How long new machines wait for an engine's first list: long enough for
/// an engine that answers (milliseconds) and for a connect that times out
/// (5 s), so that a pool spreads over an engine registered a moment ago;
/// an engine still not listed after it is passed over.
pub const FIRST_LIST_GRACE: Duration = Duration::from_secs(10);

impl Engine {
    pub fn health(&self) -> EngineHealth {
        self.health.borrow().clone()
    }

    /// When it is given up for lost, while it does not answer.
    pub fn lost_at(&self) -> Option<DateTime<Utc>> {
        let h = self.health.borrow();
        (h.reachability != Reachability::Reachable).then(|| after(h.since, self.lost_after))
    }

    /// Unreachable, or never listed, for at least `--engine-lost-after`:
    /// its machines are given up for lost and replaced elsewhere.
    pub fn lost(&self, now: DateTime<Utc>) -> bool {
        self.lost_at().is_some_and(|at| now >= at)
    }

    pub fn reachable(&self) -> bool {
        self.health().reachability == Reachability::Reachable
    }

    /// While its first list is under way and within [`FIRST_LIST_GRACE`]:
    /// when new machines stop waiting for it.
    pub fn first_list_due(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let h = self.health.borrow();
        let due = after(h.since, FIRST_LIST_GRACE);
        (h.reachability == Reachability::Syncing && now < due).then_some(due)
    }

    pub(super) fn set_health(&self, change: impl FnOnce(&mut EngineHealth)) -> (Reachability, Reachability) {
        let mut transition = (Reachability::Syncing, Reachability::Syncing);
        self.health.send_if_modified(|h| {
            let before = h.clone();
            change(h);
            if h.reachability != before.reachability {
                h.since = crate::clock::wall();
            }
            transition = (before.reachability, h.reachability);
            *h != before
        });
        transition
    }

    pub(super) fn tell(&self, change: EngineChange, message: String) {
        // Fails only once the worker has stopped.
        let _ = self.wakes.send(Wake::Engine { name: self.name.clone(), change, message });
    }

    pub(super) fn reached(&self, version: Option<String>) {
        let (before, _) = self.set_health(|h| {
            h.reachability = Reachability::Reachable;
            h.last_error = None;
            h.last_seen = Some(crate::clock::wall());
            if version.is_some() {
                h.version = version;
            }
        });
        if before != Reachability::Reachable {
            tracing::info!(engine = %self.name, address = %self.address(), "engine reachable");
            let again = if before == Reachability::Syncing { "answers" } else { "answers again" };
            self.tell(EngineChange::Reachable, format!("{} {again}", self.address()));
        }
    }

    pub(super) fn lost_contact(&self, error: &RuntimeError) {
        let message = error.to_string();
        let never = self.health.borrow().last_seen.is_none();
        let (before, _) = self.set_health(|h| {
            h.reachability = Reachability::Unreachable;
            h.last_error = Some(message.clone());
        });
        if before == Reachability::Unreachable {
            tracing::debug!(engine = %self.name, error = %message, "engine still unreachable");
            return;
        }
        tracing::warn!(engine = %self.name, error = %message, "engine unreachable; reconnecting with backoff");
        let what = if never { "has not answered since drover started or registered it" } else { "does not answer" };
        self.tell(EngineChange::Unreachable, format!("{} {what}: {message}", self.address()));
    }

    /// Tells, once per outage, that the engine is given up for lost, when
    /// `--engine-lost-after` has passed without an answer. Runs until
    /// `cancel`, asleep until the health changes or the deadline comes.
    pub(super) async fn announce_lost(&self, cancel: &CancellationToken) {
        let mut health = self.health.subscribe();
        let mut told: Option<DateTime<Utc>> = None;
        loop {
            let since = health.borrow_and_update().since;
            let due = self.lost_at().filter(|_| told != Some(since));
            let wait = due.map(|at| (at - crate::clock::wall()).to_std().unwrap_or(Duration::ZERO));
            tokio::select! {
                _ = cancel.cancelled() => return,
                changed = health.changed() => if changed.is_err() { return },
                _ = tokio::time::sleep(wait.unwrap_or(Duration::MAX)), if wait.is_some() => {
                    told = Some(since);
                    let message = format!(
                        "no answer for {}: its machines count as lost and are replaced on the other engines",
                        humantime::format_duration(self.lost_after)
                    );
                    tracing::warn!(engine = %self.name, "engine given up for lost");
                    self.tell(EngineChange::Lost, message);
                }
            }
        }
    }
}
