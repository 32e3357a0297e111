//! The story of an engine in its events: it stopped answering (or never
//! did), it was given up for lost, it answers again. The worker records
//! them off its loop, so that a slow store never delays a pass.

use crate::domain::event::{EventType, NewEvent};
use crate::runtime::EngineChange;

/// The event that tells of `change` on `engine`.
pub fn event(engine: &str, change: EngineChange, message: String) -> NewEvent {
    let (type_, reason) = match change {
        EngineChange::Reachable => (EventType::Normal, "EngineReachable"),
        EngineChange::Unreachable => (EventType::Warning, "EngineUnreachable"),
        EngineChange::Lost => (EventType::Warning, "EngineLost"),
    };
    NewEvent::engine(engine, type_, reason, message)
}
