//! Deleting machines in the background: cordon and drain the node (for
//! pools of a cluster), stop the container within its grace period, remove
//! it, then drop the record. A pass only records the intent and hands the
//! machine over, so a machine taking its whole grace period never holds up
//! the next pass; the planner sees it as terminating meanwhile.
//!
//! The intent is durable (recorded before the stop begins), so a deletion
//! cut short by a crash, a shutdown or an outage is simply handed over
//! again by the next pass: at most one deletion per machine is in flight
//! (the `terminator` keeps count).

use crate::domain::object::PoolRef;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::context::{Context, ReconcileError};
use super::node;
use super::plan::{DeleteReason, Deletion};
use crate::db::{self, pools::Pool};
use crate::domain::event::{EventType, NewEvent};
use crate::runtime::Wake;

/// Starts deleting `d` in the background unless the terminator has its
/// deletion in flight or waiting out a backoff after a failure.
pub(super) fn hand_over(ctx: &Context, pool: &Pool, d: &Deletion) {
    if !ctx.terminator.claim(&d.machine) {
        return;
    }
    let (ctx, pool, d) = (ctx.clone(), pool.clone(), d.clone());
    let cancel = ctx.terminator.cancelled();
    let terminator = Arc::clone(&ctx.terminator);
    terminator.spawn(async move {
        let outcome = tokio::select! {
            // Shutting down: the recorded intent lets the next run finish it.
            _ = cancel.cancelled() => None,
            r = delete_machine(&ctx, &pool, &d) => Some(r),
        };
        let failed = match &outcome {
            Some(Err(e)) => Some((crate::error::error_chain(e), matches!(e, ReconcileError::Drain { .. }))),
            _ => None,
        };
        let retry_in = ctx.terminator.settle(&d.machine, failed);
        if let (Some(Err(e)), Some((n, wait))) = (&outcome, retry_in) {
            report_failure(&ctx, &pool, &d, e, n, wait).await;
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
        if outcome.is_some() {
            let _ = ctx.wakes.send(Wake::Pool(pool.id.clone()));
        }
    });
}

fn why(reason: DeleteReason) -> &'static str {
    match reason {
        DeleteReason::Outdated => "it runs an outdated image",
        DeleteReason::DeleteRequested => "deletion was requested",
        DeleteReason::Excess => "the pool has more machines than replicas",
        DeleteReason::PoolDeleting => "the pool is being deleted",
        DeleteReason::Unready => "it stayed unready past machine_ready_timeout_seconds",
        DeleteReason::Broken => "it kept failing after restarts in place",
    }
}

/// The event and log line of a deletion that begins.
pub(super) fn deleting_event(pool: &PoolRef, d: &Deletion) -> NewEvent {
    NewEvent::pool(
        pool,
        EventType::Normal,
        "MachineDeleting",
        format!("deleting {} on engine {}: {}", d.machine, d.engine, why(d.reason)),
    )
}

#[tracing::instrument(skip(ctx, pool, d), fields(pool = %pool.id, machine = %d.machine, engine = %d.engine))]
async fn delete_machine(ctx: &Context, pool: &Pool, d: &Deletion) -> Result<(), ReconcileError> {
    let started = Instant::now();
    let Some(engine) = ctx.engines.get(&d.engine) else {
        // The engine was removed from drover: nothing can reach the
        // container any more; the record goes (its pass sees it vanished).
        return Ok(());
    };
    if engine.reachable() && engine.container(&d.container_id).is_none() {
        // Gone already: a deletion that finished just before this one was
        // handed over (the pass that did so had looked before it ended).
        let mut tx = ctx.begin().await?;
        db::machines::delete(&mut tx, &pool.id, &d.machine).await?;
        tx.commit().await?;
        return Ok(());
    }
    // Draining waits on the cluster, not on the engine.
    ctx.may_act()?;
    let cluster = node::leave_cluster(ctx, pool, &d.machine).await?;
    ctx.may_act()?;
    let grace = pool.spec.stop_grace_period_seconds().map_or(ctx.stop_timeout_secs, i64::from);
    let removed = ctx.sent(engine.remove(&d.container_id, grace, &ctx.gate()).await)?;
    super::context::count_call(ctx, &d.engine, "remove", &removed);
    removed?;
    if let Some(api) = &cluster {
        node::forget_node(ctx, pool, api, &d.machine).await;
    }
    let now = ctx.clock.now();
    let ev = NewEvent::pool(
        &pool.id,
        EventType::Normal,
        "MachineDeleted",
        format!("deleted {} ({:.1} s to stop and remove)", d.machine, started.elapsed().as_secs_f64()),
    );
    let mut tx = ctx.begin().await?;
    db::machines::delete(&mut tx, &pool.id, &d.machine).await?;
    db::events::record(&mut tx, &ev, now).await?;
    tx.commit().await?;
    ctx.changes.pool(&pool.id);
    tracing::info!(reason = ?d.reason, "machine deleted");
    Ok(())
}

async fn report_failure(ctx: &Context, pool: &Pool, d: &Deletion, e: &ReconcileError, n: u32, wait: Duration) {
    let message = format!(
        "deleting {} failed ({} in a row), trying again in {} s: {}",
        d.machine,
        n,
        wait.as_secs(),
        crate::error::error_chain(e)
    );
    tracing::warn!(pool = %pool.id, machine = %d.machine, error = %message, "machine deletion failed");
    // One event per failure streak, then one every few tries: an outage
    // must not fill the event log.
    if n == 1 || n.is_power_of_two() {
        let reason = if matches!(e, ReconcileError::Drain { .. }) { "DrainFailed" } else { "MachineDeleteFailed" };
        let ev = NewEvent::pool(&pool.id, EventType::Warning, reason, message);
        ctx.record(&ev).await;
    }
}
