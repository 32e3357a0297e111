//! The story of an engine in its events: it stopped answering (or never
//! did), it was given up for lost, it answers again; and placement on it
//! was backed off or resumed. Recorded off the worker's loop, so that a
//! slow store never delays a pass.

use super::context::Context;
use crate::domain::event::{EventType, NewEvent};
use crate::runtime::EngineChange;

pub(super) fn record(ctx: &Context, engine: &str, change: EngineChange, message: String) {
    let (type_, reason) = match change {
        EngineChange::Reachable => (EventType::Normal, "EngineReachable"),
        EngineChange::Unreachable => (EventType::Warning, "EngineUnreachable"),
        EngineChange::Lost => (EventType::Warning, "EngineLost"),
    };
    let (ctx, ev) = (ctx.clone(), NewEvent::engine(engine, type_, reason, message));
    ctx.tasks.clone().spawn(async move { ctx.record(&ev).await });
}
