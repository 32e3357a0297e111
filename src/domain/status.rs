//! What the reconciler last observed of a pool, and its conditions.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::domain::rollout::RolloutProgress;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

/// A Kubernetes-style condition: one aspect of the pool's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Condition {
    /// `Ready`, `Progressing`, `RuntimeAvailable`, ...
    #[serde(rename = "type")]
    pub type_: String,
    pub status: ConditionStatus,
    /// CamelCase reason, stable enough to match on.
    pub reason: String,
    pub message: String,
    /// When `status` last changed.
    pub last_transition_time: DateTime<Utc>,
}

/// A pool's machines on one engine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EngineReplicas {
    pub replicas: u32,
    pub ready_replicas: u32,
}

/// Observed state of a pool, written after every reconcile pass.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct PoolStatus {
    /// The `generation` the last pass worked from; behind `generation`
    /// while a change has not been acted on yet.
    pub observed_generation: i64,
    /// Machines that exist.
    pub replicas: u32,
    /// Machines whose container runs (and is healthy, where it has a check).
    pub ready_replicas: u32,
    /// Machines that run the desired image.
    pub updated_replicas: u32,
    /// Machines ready for at least `min_ready_seconds`.
    pub available_replicas: u32,
    /// Machines being deleted (stopping within their grace period, or
    /// waiting for their engine); not counted in `replicas`.
    pub terminating_replicas: u32,
    /// Machines on each engine (those counted in `replicas`).
    pub engines: BTreeMap<String, EngineReplicas>,
    pub conditions: Vec<Condition>,
    /// The error of the last failed pass, cleared by a good one.
    pub last_error: Option<String>,
    /// When a pass last changed this status (passes that change nothing
    /// write nothing).
    pub last_reconciled_at: Option<DateTime<Utc>>,
    /// Progress of the current (or last) rollout.
    pub rollout: Option<RolloutProgress>,
}

impl PoolStatus {
    /// Sets a condition, keeping its transition time when the status holds.
    pub fn set_condition(
        &mut self,
        type_: &str,
        status: ConditionStatus,
        reason: &str,
        message: impl Into<String>,
        now: DateTime<Utc>,
    ) {
        let message = message.into();
        match self.conditions.iter_mut().find(|c| c.type_ == type_) {
            Some(c) => {
                if c.status != status {
                    c.last_transition_time = now;
                }
                c.status = status;
                c.reason = reason.to_owned();
                c.message = message;
            }
            None => self.conditions.push(Condition {
                type_: type_.to_owned(),
                status,
                reason: reason.to_owned(),
                message,
                last_transition_time: now,
            }),
        }
    }

    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_time_moves_only_when_status_changes() {
        let t0 = DateTime::from_timestamp(0, 0).unwrap();
        let t1 = DateTime::from_timestamp(10, 0).unwrap();
        let t2 = DateTime::from_timestamp(20, 0).unwrap();
        let mut s = PoolStatus::default();
        s.set_condition("Ready", ConditionStatus::False, "Scaling", "0/3", t0);
        s.set_condition("Ready", ConditionStatus::False, "Scaling", "1/3", t1);
        assert_eq!(s.condition("Ready").unwrap().last_transition_time, t0);
        assert_eq!(s.condition("Ready").unwrap().message, "1/3");
        s.set_condition("Ready", ConditionStatus::True, "AllReady", "3/3", t2);
        assert_eq!(s.condition("Ready").unwrap().last_transition_time, t2);
        assert_eq!(s.conditions.len(), 1);
    }
}
