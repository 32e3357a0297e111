//! What a pass writes back: the status it decided (see `decide`), only when
//! more than its timestamps changed; and after a failed pass, the failure,
//! as a condition and an event told once.

use crate::domain::object::PoolRef;
use chrono::{DateTime, Utc};

use super::context::{Context, ReconcileError};
use crate::db::{self, pools::Pool};
use crate::domain::event::{EventType, NewEvent};
use crate::domain::status::{ConditionStatus, ConditionType, PoolStatus, Reason};
use crate::runtime::RuntimeError;

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
    status.driver = ctx.driver();
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
    let mut tx = ctx.begin().await?;
    db::pools::write_status(&mut tx, &pool.id, &status).await?;
    tx.commit().await?;
    Ok(())
}

/// Records a failed pass on the pool: conditions, last error, an event.
pub async fn record_failure(ctx: &Context, name: &PoolRef, err: &ReconcileError) {
    let now = ctx.clock.now();
    let message = crate::error::error_chain(err);
    let result = async {
        let Some(pool) = ctx.db.pool_for_worker(name).await? else { return Ok(()) };
        let mut status = pool.status.clone();
        let unavailable = matches!(err.first(), ReconcileError::Runtime(RuntimeError::Unavailable(_)));
        if unavailable {
            let (f, r) = (ConditionStatus::False, Reason::RuntimeUnavailable);
            status.set_condition(ConditionType::RuntimeAvailable, f, r, message.clone(), now);
        }
        let reason = match err.first() {
            _ if unavailable => Reason::RuntimeUnavailable,
            ReconcileError::Drain { .. } => Reason::DrainFailed,
            _ => Reason::ReconcileFailed,
        };
        status.set_condition(ConditionType::Reconciled, ConditionStatus::False, reason, message.clone(), now);
        let repeated = status.last_error.as_deref() == Some(message.as_str());
        status.last_error = Some(message.clone());
        status.last_reconciled_at = Some(now);
        status.driver = ctx.driver();
        let mut tx = ctx.begin().await?;
        db::pools::write_status(&mut tx, name, &status).await?;
        // A failure that repeats word for word is one story, told once.
        if !repeated {
            db::events::record(
                &mut tx,
                &NewEvent::pool(name, EventType::Warning, reason.as_str(), message.clone()),
                now,
            )
            .await?;
        }
        tx.commit().await?;
        Ok::<_, ReconcileError>(())
    }
    .await;
    if let Err(e) = result {
        tracing::warn!(pool = %name, error = %e, "could not record a failed pass");
    }
}
