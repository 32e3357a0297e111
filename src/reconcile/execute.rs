//! Applying a plan through the container runtime: deletions (after cordon
//! and drain, for pools of a cluster), then starts of interrupted creations,
//! then creations, each with bounded parallelism, each with its record and
//! event.

use std::collections::HashMap;

use chrono::Utc;
use futures_util::future::join_all;

use super::plan::{self, Creation, Deletion, Plan};
use super::{Context, ReconcileError, node};
use crate::db::{self, pools::Pool};
use crate::domain::event::{EventType, NewEvent};
use crate::runtime::{CreateContainer, RuntimeError, labels};

/// Applies a plan: deletions first, then (only if they all worked)
/// creations, each side with bounded parallelism.
pub(super) async fn execute(ctx: &Context, pool: &Pool, plan: &Plan) -> Result<(), ReconcileError> {
    let total = plan.delete.len() + plan.start.len() + plan.create.len();
    let deletes = join_all(plan.delete.iter().map(|d| delete_machine(ctx, pool, d))).await;
    let mut errors: Vec<ReconcileError> = deletes.into_iter().filter_map(Result::err).collect();
    if errors.is_empty() {
        let starts = join_all(plan.start.iter().map(|s| start_machine(ctx, pool, s))).await;
        errors.extend(starts.into_iter().filter_map(|r| r.err().map(ReconcileError::from)));
        let creates = join_all(plan.create.iter().map(|c| create_machine(ctx, pool, c))).await;
        errors.extend(creates.into_iter().filter_map(|r| r.err().map(ReconcileError::from)));
    }
    let failed = errors.len();
    match errors.into_iter().next() {
        None => Ok(()),
        Some(first) if failed == 1 && total == 1 => Err(first),
        Some(first) => Err(ReconcileError::Partial { failed, total, first: Box::new(first) }),
    }
}

async fn create_machine(ctx: &Context, pool: &Pool, c: &Creation) -> Result<(), RuntimeError> {
    let _permit = ctx.parallel.acquire().await.map_err(|_| RuntimeError::Unavailable("shutting down".into()))?;
    let name = crate::domain::names::new_machine_name();
    let mut container_labels: HashMap<String, String> = pool.spec.labels.clone().into_iter().collect();
    container_labels.insert(labels::POOL.into(), pool.name.clone());
    container_labels.insert(labels::MANAGED_BY.into(), labels::MANAGED_BY_VALUE.into());
    if let Some(fd) = &c.failure_domain {
        container_labels.insert(labels::FAILURE_DOMAIN.into(), fd.clone());
    }
    let spec = CreateContainer {
        name: name.clone(),
        image: pool.spec.desired_image(),
        labels: container_labels,
        mounts: pool.spec.extra_mounts.clone(),
        stop_timeout_secs: ctx.stop_timeout_secs,
    };
    let created = ctx.runtime.create(&spec).await;
    let container = ctx.counted("create", created)?;
    let now = Utc::now();
    let fd = c.failure_domain.as_deref().map(|f| format!(" in {f}")).unwrap_or_default();
    let ev =
        NewEvent::pool(&pool.name, EventType::Normal, "MachineCreated", format!("created {name} ({}){fd}", spec.image));
    let stored = async {
        let mut tx = crate::db::begin_write(&ctx.db).await?;
        db::machines::upsert_from_container(&mut *tx, &pool.name, &container, now).await?;
        db::events::record(&mut *tx, &ev, now).await?;
        tx.commit().await
    };
    warn_unrecorded(stored.await);
    tracing::info!(machine = %name, "machine created");
    Ok(())
}

async fn start_machine(ctx: &Context, pool: &Pool, s: &plan::Start) -> Result<(), RuntimeError> {
    let _permit = ctx.parallel.acquire().await.map_err(|_| RuntimeError::Unavailable("shutting down".into()))?;
    let started = ctx.runtime.start(&s.container_id, ctx.stop_timeout_secs).await;
    ctx.counted("start", started)?;
    let ev = NewEvent::pool(
        &pool.name,
        EventType::Normal,
        "MachineStarted",
        format!("started {}, whose creation was interrupted", s.machine),
    );
    warn_unrecorded(db::events::record(&ctx.db, &ev, Utc::now()).await);
    tracing::info!(machine = %s.machine, "interrupted machine started");
    Ok(())
}

async fn delete_machine(ctx: &Context, pool: &Pool, d: &Deletion) -> Result<(), ReconcileError> {
    // Draining waits on the cluster, not on Docker: it holds no container-operation permit.
    let cluster = node::leave_cluster(ctx, pool, &d.machine).await?;
    let permit = ctx.parallel.acquire().await.map_err(|_| RuntimeError::Unavailable("shutting down".into()))?;
    let removed = ctx.runtime.remove(&d.container_id, ctx.stop_timeout_secs).await;
    ctx.counted("remove", removed)?;
    drop(permit);
    if let Some(api) = &cluster {
        node::forget_node(ctx, pool, api, &d.machine).await;
    }
    let now = Utc::now();
    let why = match d.reason {
        plan::DeleteReason::Outdated => "it runs an outdated image",
        plan::DeleteReason::DeleteRequested => "deletion was requested",
        plan::DeleteReason::Excess => "the pool has more ready machines than replicas",
        plan::DeleteReason::PoolDeleting => "the pool is being deleted",
        plan::DeleteReason::Unready => "it stayed unready past machine_ready_timeout_seconds",
    };
    let ev = NewEvent::pool(&pool.name, EventType::Normal, "MachineDeleted", format!("deleted {}: {why}", d.machine));
    let stored = async {
        let mut tx = crate::db::begin_write(&ctx.db).await?;
        db::machines::delete(&mut *tx, &pool.name, &d.machine).await?;
        db::events::record(&mut *tx, &ev, now).await?;
        tx.commit().await
    };
    warn_unrecorded(stored.await);
    tracing::info!(machine = %d.machine, reason = ?d.reason, "machine deleted");
    Ok(())
}

/// The container is already created or gone when its record is written,
/// and the next pass re-derives records from Docker, so a failed write is
/// logged rather than failing the operation.
pub(super) fn warn_unrecorded(result: sqlx::Result<()>) {
    if let Err(e) = result {
        tracing::warn!(error = %e, "recording a machine change failed; the next pass will repair it");
    }
}
