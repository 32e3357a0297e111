//! Machine records, kept by what the engines report: every container has a record
//! that says what was last observed of it; records whose container is gone
//! are dropped, so that the next plan replaces them. Only records that
//! changed are written, all in one transaction with the events that explain
//! them (a machine broke, was found, vanished).

use crate::domain::object::PoolRef;
use std::collections::HashMap;

use chrono::{DateTime, Utc};

use super::context::{Context, ReconcileError};
use super::observe::Observation;
use crate::db::{self, machines::Machine};
use crate::domain::event::{EventType, NewEvent};
use crate::domain::machine::MachinePhase;

/// What changed for a machine that deserves a line in the pool's events.
fn transition(pool: &PoolRef, old: Option<&Machine>, new: &Machine) -> Option<NewEvent> {
    let Some(old) = old else {
        // Machines this process creates are announced by the executor;
        // these appeared some other way.
        if new.phase == MachinePhase::Terminating {
            return None;
        }
        let message = format!("found container {} ({}) on engine {}", new.name, new.image, new.engine);
        return Some(NewEvent::pool(pool, EventType::Normal, "MachineFound", message));
    };
    if old.phase == new.phase && old.container_id == new.container_id {
        return None;
    }
    let message = match new.phase {
        MachinePhase::Exited => format!("{} {}", new.name, exit_story(new)),
        MachinePhase::Paused => format!("{} was paused", new.name),
        MachinePhase::Dead => format!("{} is dead: its engine could not stop or remove it", new.name),
        _ => return None,
    };
    let reason = match new.phase {
        MachinePhase::Exited => "MachineExited",
        MachinePhase::Paused => "MachinePaused",
        _ => "MachineDead",
    };
    Some(NewEvent::pool(pool, EventType::Warning, reason, message))
}

/// "exited with code 137 (killed) after running 5 s, out of memory".
pub(super) fn exit_story(m: &Machine) -> String {
    let code = match m.exit_code {
        Some(c @ 128..=192) => format!("exited with code {c} (signal {})", c - 128),
        Some(c) => format!("exited with code {c}"),
        None => "exited".to_owned(),
    };
    let ran = match (m.started_at, m.finished_at) {
        (Some(s), Some(f)) if f >= s => format!(" after running {:.1} s", (f - s).num_milliseconds() as f64 / 1000.0),
        _ => String::new(),
    };
    let oom = if m.oom_killed { ", killed for lack of memory" } else { "" };
    format!("{code}{ran}{oom}")
}

/// Writes what changed since `before` (the records the pass started from).
pub(super) async fn sync(
    ctx: &Context,
    pool: &PoolRef,
    obs: &Observation,
    before: &[Machine],
    now: DateTime<Utc>,
) -> Result<(), ReconcileError> {
    let old: HashMap<&str, &Machine> = before.iter().map(|m| (m.name.as_str(), m)).collect();
    let changed: Vec<&Machine> = obs
        .machines
        .iter()
        .map(|s| &s.record)
        .filter(|r| old.get(r.name.as_str()).is_none_or(|o| !o.same_as(r)))
        .collect();
    if changed.is_empty() && obs.vanished.is_empty() {
        return Ok(());
    }
    let mut tx = ctx.begin().await?;
    for r in changed {
        let record = Machine { updated_at: now, ..r.clone() };
        db::machines::write_observed(&mut tx, &record).await?;
        if let Some(ev) = transition(pool, old.get(r.name.as_str()).copied(), r) {
            db::events::record(&mut tx, &ev, now).await?;
        }
    }
    for r in &obs.vanished {
        db::machines::delete(&mut tx, pool, &r.name).await?;
        // A machine whose deletion was under way is simply done.
        if r.terminating_since.is_none() {
            let ev = NewEvent::pool(
                pool,
                EventType::Warning,
                "MachineVanished",
                format!("container of {} is gone from engine {}; it will be replaced", r.name, r.engine),
            );
            db::events::record(&mut tx, &ev, now).await?;
        }
    }
    tx.commit().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exited(t: impl Fn(i64) -> Option<DateTime<Utc>>) -> Machine {
        Machine {
            name: "worker-a".into(),
            pool: "p".into(),
            engine: "local".into(),
            container_id: "c".into(),
            image: "i".into(),
            failure_domain: None,
            phase: MachinePhase::Exited,
            state: crate::runtime::ContainerState::Exited,
            health: crate::runtime::HealthState::None,
            exit_code: Some(137),
            oom_killed: true,
            ready: false,
            delete_requested: false,
            ready_since: None,
            started_at: t(10),
            finished_at: t(15),
            restarts: 0,
            failed_restarts: 0,
            last_restart_at: None,
            terminating_since: None,
            terminating_reason: None,
            created_at: DateTime::UNIX_EPOCH,
            updated_at: DateTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn exits_are_told_with_their_signal_runtime_and_memory() {
        let m = exited(|s| DateTime::from_timestamp(s, 0));
        assert_eq!(exit_story(&m), "exited with code 137 (signal 9) after running 5.0 s, killed for lack of memory");
        let quiet = Machine { exit_code: Some(3), oom_killed: false, started_at: None, ..m };
        assert_eq!(exit_story(&quiet), "exited with code 3");
    }

    /// PostgreSQL keeps microseconds: the record read back from it is the
    /// same observation as the one, to the nanosecond, it was written from
    /// (a periodic pass rewrote every machine row while they differed), and
    /// a change of a microsecond is still a change.
    #[test]
    fn a_record_read_back_at_microseconds_is_the_observation_it_was_written_from() {
        let observed = exited(|s| DateTime::from_timestamp(s, 123_456_789));
        let stored = exited(|s| DateTime::from_timestamp(s, 123_456_000));
        assert!(stored.same_as(&observed) && observed.same_as(&stored));
        let later = Machine { updated_at: DateTime::from_timestamp(99, 0).unwrap_or_default(), ..stored.clone() };
        assert!(later.same_as(&observed), "when it was written is not part of the observation");
        let moved = exited(|s| DateTime::from_timestamp(s, 123_457_000));
        assert!(!moved.same_as(&observed));
    }
}
