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

/// One aspect of a pool's state that a condition reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ConditionType {
    /// All `replicas` machines ready, available and up to date.
    Ready,
    /// The rollout moves (or completed), or is stalled.
    Progressing,
    /// No machine is broken, stuck, unknown or failing to be deleted.
    MachinesHealthy,
    /// The last pass applied its plan and nothing keeps the pool from its work.
    Reconciled,
    /// The pool's engines answer.
    RuntimeAvailable,
}

/// Declares [`Reason`] and its names at once, so that the two cannot part.
macro_rules! reasons {
    ($($(#[$group:meta])* $v:ident),* $(,)?) => {
        /// Why a condition has its status: CamelCase, stable enough to match
        /// on. Stored in a pool's status, so a variant is never renamed or
        /// removed.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum Reason {
            $($(#[$group])* $v),*
        }

        impl Reason {
            /// As the API and events write it: the variant's name.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$v => stringify!($v)),*
                }
            }
        }
    };
}

reasons!(
    // Ready
    AllReady,
    Deleting,
    Paused,
    BatchAwaitingApproval,
    RollingUpdate,
    ScalingDown,
    ScalingUp,
    // Progressing
    RolloutComplete,
    RolloutProgressing,
    ProgressDeadlineExceeded,
    // MachinesHealthy
    AllHealthy,
    DrainFailed,
    MachineDeleteFailed,
    EngineLost,
    EngineUnreachable,
    CrashLoopBackOff,
    MachineRestarting,
    MachineExited,
    MachinePaused,
    MachineUnready,
    // Reconciled
    PassSucceeded,
    WaitingForMachines,
    HostPolicyRefused,
    ClusterCredentialsInvalid,
    NoEngineAvailable,
    WaitingForEngines,
    ReconcileFailed,
    // RuntimeAvailable
    RuntimeReachable,
    RuntimeUnavailable,
);

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A Kubernetes-style condition: one aspect of the pool's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Condition {
    /// `Ready`, `Progressing`, `RuntimeAvailable`, ...
    #[serde(rename = "type")]
    #[schema(value_type = String)]
    pub type_: ConditionType,
    pub status: ConditionStatus,
    /// CamelCase reason, stable enough to match on.
    #[schema(value_type = String)]
    pub reason: Reason,
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
// Stored as JSON, and shown as is: every field defaults when read (rows
// from earlier releases lack later fields) and is required when shown.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PoolStatus {
    /// The `generation` the last pass worked from; behind `generation`
    /// while a change has not been acted on yet.
    #[serde(default)]
    #[schema(required = true)]
    pub observed_generation: i64,
    /// Machines that exist.
    #[serde(default)]
    #[schema(required = true)]
    pub replicas: u32,
    /// Machines whose container runs (and is healthy, where it has a check).
    #[serde(default)]
    #[schema(required = true)]
    pub ready_replicas: u32,
    /// Machines that run the desired image.
    #[serde(default)]
    #[schema(required = true)]
    pub updated_replicas: u32,
    /// Machines ready for at least `min_ready_seconds`.
    #[serde(default)]
    #[schema(required = true)]
    pub available_replicas: u32,
    /// Machines being deleted (stopping within their grace period, or
    /// waiting for their engine); not counted in `replicas`.
    #[serde(default)]
    #[schema(required = true)]
    pub terminating_replicas: u32,
    /// Machines on each engine (those counted in `replicas`).
    #[serde(default)]
    #[schema(required = true)]
    pub engines: BTreeMap<String, EngineReplicas>,
    #[serde(default)]
    #[schema(required = true)]
    pub conditions: Vec<Condition>,
    /// The error of the last failed pass, cleared by a good one.
    #[serde(default)]
    #[schema(required = true)]
    pub last_error: Option<String>,
    /// When a pass last changed this status (passes that change nothing
    /// write nothing).
    #[serde(default)]
    #[schema(required = true)]
    pub last_reconciled_at: Option<DateTime<Utc>>,
    /// Progress of the current (or last) rollout.
    #[serde(default)]
    #[schema(required = true)]
    pub rollout: Option<RolloutProgress>,
    /// The drover replica that drives the pool (it wrote this status), when
    /// several replicas share a PostgreSQL store; `null` with one process.
    #[serde(default)]
    #[schema(required = true)]
    pub driver: Option<String>,
}

impl PoolStatus {
    /// Sets a condition, keeping its transition time when the status holds.
    pub fn set_condition(
        &mut self,
        type_: ConditionType,
        status: ConditionStatus,
        reason: Reason,
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
                c.reason = reason;
                c.message = message;
            }
            None => self.conditions.push(Condition { type_, status, reason, message, last_transition_time: now }),
        }
    }

    pub fn condition(&self, type_: ConditionType) -> Option<&Condition> {
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
        let ready = ConditionType::Ready;
        s.set_condition(ready, ConditionStatus::False, Reason::ScalingUp, "0/3", t0);
        s.set_condition(ready, ConditionStatus::False, Reason::ScalingUp, "1/3", t1);
        assert_eq!(s.condition(ready).unwrap().last_transition_time, t0);
        assert_eq!(s.condition(ready).unwrap().message, "1/3");
        s.set_condition(ready, ConditionStatus::True, Reason::AllReady, "3/3", t2);
        assert_eq!(s.condition(ready).unwrap().last_transition_time, t2);
        assert_eq!(s.conditions.len(), 1);
    }

    #[test]
    fn a_reason_reads_as_it_is_stored_and_an_unknown_one_does_not_read() {
        assert_eq!(Reason::ProgressDeadlineExceeded.as_str(), "ProgressDeadlineExceeded");
        let stored = serde_json::json!({"type": "Ready", "status": "True", "reason": "AllReady", "message": "",
                                        "last_transition_time": "2026-12-04T00:00:00Z"});
        let c: Condition = serde_json::from_value(stored.clone()).unwrap();
        assert_eq!((c.type_, c.reason), (ConditionType::Ready, Reason::AllReady));
        assert_eq!(serde_json::to_value(&c).unwrap(), stored);
        let mut unknown = stored;
        unknown["reason"] = "Bogus".into();
        assert!(serde_json::from_value::<Condition>(unknown).is_err());
    }
}
