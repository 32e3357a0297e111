//! The story of an engine in its events: it stopped answering, it was given
//! up for lost, it answers again. Recorded off the worker's loop, so that a
//! slow store never delays a pass.

use std::time::Duration;

use chrono::Utc;

use super::context::{Context, warn_unrecorded};
use crate::db;
use crate::domain::event::{EventType, NewEvent};

pub(super) fn record(ctx: &Context, engine: &str, reachable: bool, message: String) {
    let (ctx, engine) = (ctx.clone(), engine.to_owned());
    tokio::spawn(async move {
        let (type_, reason) =
            if reachable { (EventType::Normal, "EngineReachable") } else { (EventType::Warning, "EngineUnreachable") };
        warn_unrecorded(
            db::events::record_alone(&ctx.db, &NewEvent::engine(&engine, type_, reason, message), Utc::now()).await,
        );
        if reachable {
            return;
        }
        // Still silent at the lost timeout: its machines are replaced elsewhere.
        let lost_after = ctx.timing.lost_after;
        tokio::time::sleep(lost_after + Duration::from_millis(50)).await;
        let Some(e) = ctx.engines.get(&engine) else { return };
        if e.lost(Utc::now(), lost_after) {
            let message = format!(
                "no answer for {} s: its machines count as lost and are replaced on the other engines",
                lost_after.as_secs()
            );
            let ev = NewEvent::engine(&engine, EventType::Warning, "EngineLost", message);
            warn_unrecorded(db::events::record_alone(&ctx.db, &ev, Utc::now()).await);
        }
    });
}
