//! Events: the append-only story of what drover did and why.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::object::{ObjectRef, PoolRef};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "Normal",
            Self::Warning => "Warning",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Event {
    /// Increasing with time; newer events have larger ids.
    pub id: i64,
    /// Pool name, job id or engine name the event is about.
    pub subject: String,
    pub time: DateTime<Utc>,
    #[serde(rename = "type")]
    pub type_: EventType,
    /// CamelCase, stable: `MachineCreated`, `ScaledDown`, `ReconcileFailed`...
    pub reason: String,
    pub message: String,
}

/// An event about to be recorded.
#[derive(Debug, Clone)]
pub struct NewEvent {
    /// What it is about.
    pub subject: ObjectRef,
    pub type_: EventType,
    pub reason: &'static str,
    pub message: String,
}

impl NewEvent {
    pub fn pool(pool: &PoolRef, type_: EventType, reason: &'static str, message: impl Into<String>) -> Self {
        Self { subject: ObjectRef::Pool(pool.clone()), type_, reason, message: message.into() }
    }

    /// An event about upgrade job `id`.
    pub fn job(id: i64, type_: EventType, reason: &'static str, message: impl Into<String>) -> Self {
        Self { subject: ObjectRef::Job(id), type_, reason, message: message.into() }
    }

    pub fn engine(engine: &str, type_: EventType, reason: &'static str, message: impl Into<String>) -> Self {
        Self { subject: ObjectRef::Engine(engine.to_owned()), type_, reason, message: message.into() }
    }
}
