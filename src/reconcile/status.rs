//! What a pass writes back: counts, conditions and rollout progress after a
//! good pass (which may start an automatic rollback), and the failure, as a
//! condition and an event told once, after a bad one.

use chrono::Utc;

use super::{Context, ReconcileError, rollback};
use crate::db::{self, pools::Pool};
use crate::domain::event::{EventType, NewEvent};
use crate::domain::rollout::{self as rollout, Counts};
use crate::domain::status::{ConditionStatus, PoolStatus};
use crate::runtime::RuntimeError;

/// Counts, conditions and rollout progress after a successful pass; may
/// start an automatic rollback when the progress deadline has just passed.
pub(super) async fn status_after_pass(
    ctx: &Context,
    pool: &Pool,
    counts: &Counts,
    awaiting_approval: bool,
) -> Result<PoolStatus, ReconcileError> {
    let now = Utc::now();
    let spec = &pool.spec;
    let image = spec.desired_image();
    let mut status = PoolStatus {
        observed_generation: pool.generation,
        replicas: counts.total,
        ready_replicas: counts.ready,
        updated_replicas: counts.updated,
        available_replicas: counts.available,
        conditions: pool.status.conditions.clone(),
        last_error: None,
        last_reconciled_at: Some(now),
        rollout: None,
    };
    status.set_condition(
        "RuntimeAvailable",
        ConditionStatus::True,
        "RuntimeReachable",
        "the container runtime answers",
        now,
    );
    status.set_condition("Reconciled", ConditionStatus::True, "PassSucceeded", "the last pass applied its plan", now);

    let prev = pool.status.rollout.as_ref();
    let hold = spec.paused || awaiting_approval;
    let mut progress =
        rollout::track(prev, pool.revision, counts, spec.replicas, spec.progress_deadline_seconds, hold, now);
    let newly_stalled =
        progress.deadline_exceeded && !prev.is_some_and(|p| p.revision == pool.revision && p.deadline_exceeded);
    if newly_stalled {
        let message = format!(
            "no progress for {} s: {} of {} machines updated and available, {} outdated",
            spec.progress_deadline_seconds, counts.updated_available, spec.replicas, counts.outdated
        );
        let ev = NewEvent::pool(&pool.name, EventType::Warning, "ProgressDeadlineExceeded", message);
        db::events::record(&ctx.db, &ev, now).await?;
        if spec.strategy.auto_rollback {
            match rollback::rollback(&ctx.db, pool, None, "the progress deadline passed").await {
                Ok(rolled) => {
                    progress = rollout::track(
                        None,
                        rolled.revision,
                        counts,
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
        (
            ConditionStatus::False,
            "ProgressDeadlineExceeded",
            format!("no progress for {} s", spec.progress_deadline_seconds),
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
        (ConditionStatus::False, "Deleting", format!("removing {} machines", counts.total))
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

/// Records a failed pass on the pool: conditions, last error, an event.
pub async fn record_failure(ctx: &Context, name: &str, err: &ReconcileError) {
    let now = Utc::now();
    let message = crate::error::error_chain(err);
    let result = async {
        let Some(pool) = db::pools::get(&ctx.db, name).await? else { return Ok(()) };
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
        let mut tx = crate::db::begin_write(&ctx.db).await?;
        db::pools::write_status(&mut *tx, name, &status).await?;
        // A failure that repeats word for word is one story, told once.
        if !repeated {
            db::events::record(&mut *tx, &NewEvent::pool(name, EventType::Warning, reason, message.clone()), now)
                .await?;
        }
        tx.commit().await
    }
    .await;
    if let Err(e) = result {
        tracing::warn!(pool = name, error = %e, "could not record a failed pass");
    }
}
