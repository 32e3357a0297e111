//! What a pass writes back: counts, conditions and rollout progress after a
//! good pass (which may start an automatic rollback), and the failure, as a
//! condition and an event told once, after a bad one.
//!
//! Conditions:
//! - `Ready`: all `replicas` machines ready, available and up to date.
//! - `Progressing`: the rollout moves (or completed), or is stalled.
//! - `MachinesHealthy`: no machine is broken, stuck, unknown or failing to
//!   be deleted; otherwise the reason names the worst and the machines.
//! - `Reconciled`: the last pass applied its plan and the pool is not short
//!   of ready machines, and nothing keeps the pool from its work: not the
//!   settings (`HostPolicyRefused`: its spec is no longer allowed, so no
//!   machine is created) nor its cluster (`ClusterCredentialsInvalid`).
//! - `RuntimeAvailable`: the pool's engines answer.

use chrono::{DateTime, Utc};

use super::context::{Context, ReconcileError};
use super::observe::EngineView;
use super::plan::Observed;
use super::rollback;
use crate::db::{self, pools::Pool};
use crate::domain::event::{EventType, NewEvent};
use crate::domain::machine::MachinePhase;
use crate::domain::rollout::{self as rollout, Counts};
use crate::domain::status::{ConditionStatus, EngineReplicas, PoolStatus};
use crate::runtime::RuntimeError;
use std::collections::BTreeMap;

pub fn counts(observed: &[Observed]) -> Counts {
    let active: Vec<&Observed> = observed.iter().filter(|m| m.phase != MachinePhase::Terminating && !m.lost).collect();
    let n = |f: &dyn Fn(&Observed) -> bool| u32::try_from(active.iter().filter(|m| f(m)).count()).unwrap_or(u32::MAX);
    Counts {
        total: n(&|_| true),
        updated: n(&|m| m.up_to_date),
        ready: n(&|m| m.ready),
        available: n(&|m| m.available),
        updated_available: n(&|m| m.up_to_date && m.available),
        outdated: n(&|m| !m.up_to_date),
        terminating: u32::try_from(observed.iter().filter(|m| m.phase == MachinePhase::Terminating).count())
            .unwrap_or(u32::MAX),
    }
}

/// Machines (and ready ones) on each engine, of those that count.
fn per_engine(observed: &[Observed]) -> BTreeMap<String, EngineReplicas> {
    let mut out: BTreeMap<String, EngineReplicas> = BTreeMap::new();
    for m in observed.iter().filter(|m| m.phase != MachinePhase::Terminating && !m.lost) {
        let e = out.entry(m.engine.clone()).or_default();
        e.replicas += 1;
        e.ready_replicas += u32::from(m.ready);
    }
    out
}

/// What is wrong with the pool's machines, worst first: a reason and a
/// message naming (a few of) them.
pub(super) fn machine_health(ctx: &Context, observed: &[Observed]) -> Option<(&'static str, String)> {
    let names = |f: &dyn Fn(&Observed) -> bool| -> Vec<&str> {
        observed.iter().filter(|m| f(m)).map(|m| m.name.as_str()).collect()
    };
    let list = |v: &[&str]| {
        let shown: Vec<&str> = v.iter().take(5).copied().collect();
        let more = if v.len() > 5 { format!(" and {} more", v.len() - 5) } else { String::new() };
        format!("{}{more}", shown.join(", "))
    };
    let failing = names(&|m| m.phase == MachinePhase::Terminating && ctx.terminator.failure(&m.name).is_some());
    if let Some(first) = failing.first().and_then(|n| ctx.terminator.failure(n)) {
        let reason = if first.drain { "DrainFailed" } else { "MachineDeleteFailed" };
        return Some((reason, format!("deleting {} keeps failing: {}", list(&failing), first.message)));
    }
    type Check<'a> = (&'static str, &'a dyn Fn(&Observed) -> bool, &'a str);
    let checks: [Check; 7] = [
        ("EngineLost", &|m| m.lost, "on an engine given up for lost; replaced elsewhere"),
        ("EngineUnreachable", &|m| m.phase == MachinePhase::Unknown && !m.lost, "on an engine that does not answer"),
        ("CrashLoopBackOff", &|m| !m.ready && m.failed_restarts >= 2, "keep failing after restarts in place"),
        ("MachineRestarting", &|m| !m.ready && m.failed_restarts == 1, "restarted in place, not ready yet"),
        (
            "MachineExited",
            &|m| m.phase == MachinePhase::Exited || m.phase == MachinePhase::Dead,
            "exited; restarting in place",
        ),
        ("MachinePaused", &|m| m.phase == MachinePhase::Paused, "paused; unpausing"),
        ("MachineUnready", &|m| m.stuck, "stayed unready past machine_ready_timeout_seconds; replacing"),
    ];
    checks.into_iter().find_map(|(reason, f, what)| {
        let hit = names(f);
        (!hit.is_empty()).then(|| (reason, format!("{}: {what}", list(&hit))))
    })
}

/// Why a pool cannot do its work, whatever its machines look like.
pub(super) struct Blocked {
    /// `HostPolicyRefused` or `ClusterCredentialsInvalid`.
    pub reason: &'static str,
    pub message: String,
}

/// Counts, conditions and rollout progress after a successful pass; may
/// start an automatic rollback when the progress deadline has just passed.
pub(super) async fn status_after_pass(
    ctx: &Context,
    pool: &Pool,
    observed: &[Observed],
    engines: &[EngineView],
    awaiting_approval: bool,
    blocked: Option<Blocked>,
    now: DateTime<Utc>,
) -> Result<PoolStatus, ReconcileError> {
    let counts = counts(observed);
    let spec = &pool.spec;
    let image = spec.desired_image();
    let mut status = PoolStatus {
        observed_generation: pool.generation,
        replicas: counts.total,
        ready_replicas: counts.ready,
        updated_replicas: counts.updated,
        available_replicas: counts.available,
        terminating_replicas: counts.terminating,
        engines: per_engine(observed),
        conditions: pool.status.conditions.clone(),
        last_error: None,
        last_reconciled_at: pool.status.last_reconciled_at,
        rollout: None,
    };
    let unhealthy = machine_health(ctx, observed);
    // Only the engines this pool uses or may use concern it.
    let concerns = |e: &EngineView| e.allowed || observed.iter().any(|m| m.engine == e.name);
    let silent: Vec<&str> = engines.iter().filter(|e| concerns(e)).filter_map(|e| e.error.as_deref()).collect();
    let was_available = pool.status.condition("RuntimeAvailable").is_none_or(|c| c.status == ConditionStatus::True);
    if silent.is_empty() {
        status.set_condition("RuntimeAvailable", ConditionStatus::True, "RuntimeReachable", "the engines answer", now);
    } else {
        let message = silent.join("; ");
        status.set_condition("RuntimeAvailable", ConditionStatus::False, "RuntimeUnavailable", message.clone(), now);
        status.last_error = Some(message.clone());
        // Told once when it starts, not on every pass while it lasts.
        if was_available {
            let ev = NewEvent::pool(&pool.name, EventType::Warning, "RuntimeUnavailable", message);
            db::events::record_alone(&ctx.db, &ev, now).await?;
        }
    }
    match &unhealthy {
        Some((reason, message)) => {
            status.set_condition("MachinesHealthy", ConditionStatus::False, reason, message.clone(), now)
        }
        None => {
            status.set_condition("MachinesHealthy", ConditionStatus::True, "AllHealthy", "no machine is broken", now)
        }
    }
    let short = counts.ready < spec.replicas && !pool.deleting;
    let deletions_failing =
        unhealthy.as_ref().is_some_and(|(r, _)| matches!(*r, "DrainFailed" | "MachineDeleteFailed"));
    match &unhealthy {
        Some((reason, message)) if short || deletions_failing => {
            status.set_condition("Reconciled", ConditionStatus::False, reason, message.clone(), now);
            if deletions_failing {
                status.last_error = Some(message.clone());
            }
        }
        _ if short => status.set_condition(
            "Reconciled",
            ConditionStatus::False,
            "WaitingForMachines",
            format!("{} of {} machines ready", counts.ready, spec.replicas),
            now,
        ),
        _ => status.set_condition(
            "Reconciled",
            ConditionStatus::True,
            "PassSucceeded",
            "the last pass applied its plan",
            now,
        ),
    }
    // Whatever else holds, a pool that cannot do its work is not reconciled.
    if let Some(Blocked { reason, message }) = blocked {
        status.set_condition("Reconciled", ConditionStatus::False, reason, message.clone(), now);
        status.last_error = Some(message);
    }

    let prev = pool.status.rollout.as_ref();
    let hold = spec.paused || awaiting_approval;
    let mut progress =
        rollout::track(prev, pool.revision, &counts, spec.replicas, spec.progress_deadline_seconds, hold, now);
    let newly_stalled =
        progress.deadline_exceeded && !prev.is_some_and(|p| p.revision == pool.revision && p.deadline_exceeded);
    if newly_stalled {
        let why = unhealthy.as_ref().map(|(r, m)| format!("; {r}: {m}")).unwrap_or_default();
        let message = format!(
            "no progress for {} s: {} of {} machines updated and available, {} outdated{why}",
            spec.progress_deadline_seconds, counts.updated_available, spec.replicas, counts.outdated
        );
        let ev = NewEvent::pool(&pool.name, EventType::Warning, "ProgressDeadlineExceeded", message);
        db::events::record_alone(&ctx.db, &ev, now).await?;
        if spec.strategy.auto_rollback {
            match rollback::rollback(&ctx.db, pool, None, "the progress deadline passed").await {
                Ok(rolled) => {
                    progress = rollout::track(
                        None,
                        rolled.revision,
                        &counts,
                        spec.replicas,
                        spec.progress_deadline_seconds,
                        false,
                        now,
                    );
                    progress.rolling_back = true;
                }
                Err(e) => tracing::warn!(pool = %pool.name, error = %e, "automatic rollback not possible"),
            }
        }
    }
    let (progressing, reason, message) = if progress.deadline_exceeded {
        let why = unhealthy.as_ref().map(|(r, m)| format!(" ({r}: {m})")).unwrap_or_default();
        (
            ConditionStatus::False,
            "ProgressDeadlineExceeded",
            format!("no progress for {} s{why}", spec.progress_deadline_seconds),
        )
    } else if counts.complete(spec.replicas) {
        (ConditionStatus::True, "RolloutComplete", format!("revision {} runs on all machines", pool.revision))
    } else {
        (ConditionStatus::True, "RolloutProgressing", format!("moving to revision {} ({image})", pool.revision))
    };
    status.set_condition("Progressing", progressing, reason, message, now);
    status.rollout = Some(progress);

    let want = spec.replicas;
    let (ready, reason, message) = if pool.deleting {
        (ConditionStatus::False, "Deleting", format!("removing {} machines", counts.total + counts.terminating))
    } else if counts.complete(want) {
        (ConditionStatus::True, "AllReady", format!("{want} of {want} machines ready and up to date"))
    } else if spec.paused {
        (ConditionStatus::False, "Paused", "the pool is paused".to_owned())
    } else if awaiting_approval {
        (ConditionStatus::False, "BatchAwaitingApproval", "the rollout waits for POST .../rollout/continue".to_owned())
    } else if counts.outdated > 0 {
        (
            ConditionStatus::False,
            "RollingUpdate",
            format!("{} of {} machines run {image}", counts.updated, counts.total),
        )
    } else if counts.total > want {
        (ConditionStatus::False, "ScalingDown", format!("{} machines, want {want}", counts.total))
    } else {
        (ConditionStatus::False, "ScalingUp", format!("{} of {want} machines available", counts.available))
    };
    status.set_condition("Ready", ready, reason, message, now);
    Ok(status)
}

/// Writes the status unless only its timestamps would change: a pass that
/// changes nothing writes nothing.
/// While the rollout is held (paused, awaiting approval) its progress clock
/// is restarted on every pass, so those passes do write.
pub(super) async fn write_if_changed(
    ctx: &Context,
    pool: &Pool,
    mut status: PoolStatus,
    held: bool,
    now: DateTime<Utc>,
) -> Result<(), ReconcileError> {
    let mut before = pool.status.clone();
    before.last_reconciled_at = None;
    let mut after = status.clone();
    after.last_reconciled_at = None;
    if let (false, Some(a), Some(b)) = (held, before.rollout.as_mut(), after.rollout.as_mut()) {
        // Progress bookkeeping that only moves with the clock.
        if a.updated_available == b.updated_available
            && a.outdated == b.outdated
            && a.deadline_exceeded == b.deadline_exceeded
        {
            b.last_progress_at = a.last_progress_at;
        }
    }
    if before == after {
        return Ok(());
    }
    status.last_reconciled_at = Some(now);
    let mut tx = ctx.db.begin_background().await?;
    db::pools::write_status(&mut tx, &pool.name, &status).await?;
    tx.commit().await?;
    Ok(())
}

/// Records a failed pass on the pool: conditions, last error, an event.
pub async fn record_failure(ctx: &Context, name: &str, err: &ReconcileError) {
    let now = Utc::now();
    let message = crate::error::error_chain(err);
    let result = async {
        let Some(pool) = ctx.db.pool_for_worker(name).await? else { return Ok(()) };
        let mut status = pool.status.clone();
        let unavailable = matches!(err.first(), ReconcileError::Runtime(RuntimeError::Unavailable(_)));
        if unavailable {
            status.set_condition(
                "RuntimeAvailable",
                ConditionStatus::False,
                "RuntimeUnavailable",
                message.clone(),
                now,
            );
        }
        let reason = match err.first() {
            _ if unavailable => "RuntimeUnavailable",
            ReconcileError::Drain { .. } => "DrainFailed",
            _ => "ReconcileFailed",
        };
        status.set_condition("Reconciled", ConditionStatus::False, reason, message.clone(), now);
        let repeated = status.last_error.as_deref() == Some(message.as_str());
        status.last_error = Some(message.clone());
        status.last_reconciled_at = Some(now);
        let mut tx = ctx.db.begin_background().await?;
        db::pools::write_status(&mut tx, name, &status).await?;
        // A failure that repeats word for word is one story, told once.
        if !repeated {
            db::events::record(&mut tx, &NewEvent::pool(name, EventType::Warning, reason, message.clone()), now)
                .await?;
        }
        tx.commit().await
    }
    .await;
    if let Err(e) = result {
        tracing::warn!(pool = name, error = %e, "could not record a failed pass");
    }
}
