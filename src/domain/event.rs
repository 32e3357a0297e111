//! Events: the append-only story of what drover did and why.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

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

/// What an event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubjectKind {
    Pool,
    Job,
    Engine,
}

impl SubjectKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pool => "pool",
            Self::Job => "job",
            Self::Engine => "engine",
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
    pub kind: SubjectKind,
    pub subject: String,
    pub type_: EventType,
    pub reason: &'static str,
    pub message: String,
}

impl NewEvent {
    pub fn pool(pool: &str, type_: EventType, reason: &'static str, message: impl Into<String>) -> Self {
        Self { kind: SubjectKind::Pool, subject: pool.to_owned(), type_, reason, message: message.into() }
    }

    /// An event about upgrade job `id`.
    pub fn job(id: i64, type_: EventType, reason: &'static str, message: impl Into<String>) -> Self {
        Self { kind: SubjectKind::Job, subject: id.to_string(), type_, reason, message: message.into() }
    }

    pub fn engine(engine: &str, type_: EventType, reason: &'static str, message: impl Into<String>) -> Self {
        Self { kind: SubjectKind::Engine, subject: engine.to_owned(), type_, reason, message: message.into() }
    }
}
