//! The application logic of pools: create, change (with optimistic
//! concurrency), delete, roll back, approve a batch, plan. Handlers parse a
//! request, call one function here and shape its answer; every spec change
//! goes through [`update_spec`] or [`crate::reconcile::rollback`], both of
//! which write it with `db::pools::change_spec`.

use chrono::Utc;

use crate::db::{self, machines::Machine, pools::Pool};
use crate::domain::event::{EventType, NewEvent};
use crate::domain::names::PoolName;
use crate::domain::pool::{PoolSpec, describe_change};
use crate::domain::rollout::Counts;
use crate::error::{ApiError, ApiResult};
use crate::reconcile::{self, plan::Plan, rollback::RollbackError};
use crate::state::AppState;

pub async fn load(state: &AppState, name: &str) -> ApiResult<Pool> {
    state.db.pool(name).await?.ok_or_else(|| ApiError::not_found("pool", name))
}

/// Wakes the reconciler and the event streams after a committed change.
fn changed(state: &AppState, name: &str) {
    state.queue.enqueue(name);
    state.changes.pool(name);
}

/// A pool may name only a registered cluster: its machines' nodes are
/// drained through it. Checked in the writing transaction, against the
/// cluster delete that checks the other way.
async fn check_cluster(db: impl sqlx::SqliteExecutor<'_>, spec: &PoolSpec) -> ApiResult<()> {
    let Some(cluster) = spec.cluster.as_deref() else { return Ok(()) };
    if db::clusters::exists(db, cluster).await? {
        return Ok(());
    }
    Err(ApiError::invalid(
        "cluster",
        "cluster_exists",
        format!("names no registered cluster ({cluster:?}); register it with POST /v1/clusters first"),
    ))
}

/// Creates a pool at generation 1 and revision 1.
pub async fn create(state: &AppState, name: &PoolName, spec: &PoolSpec) -> ApiResult<Pool> {
    let now = Utc::now();
    let mut tx = state.db.begin_write().await?;
    check_cluster(&mut *tx, spec).await?;
    let pool = match db::pools::insert(&mut tx, name.as_str(), spec, now).await {
        Ok(pool) => pool,
        Err(e) if e.as_database_error().is_some_and(|d| d.is_unique_violation()) => {
            return Err(ApiError::Conflict(format!("a pool named {name:?} already exists")));
        }
        Err(e) => return Err(e.into()),
    };
    db::revisions::record_first(&mut tx, name.as_str(), spec, now).await?;
    let message = format!("created with {} replicas of {}", spec.replicas, spec.desired_image());
    db::events::record(&mut tx, &NewEvent::pool(name.as_str(), EventType::Normal, "Created", message), now).await?;
    tx.commit().await?;
    changed(state, name.as_str());
    tracing::info!(pool = %name, "pool created");
    Ok(pool)
}

/// Applies `change` to the pool's spec with optimistic concurrency: bumps
/// the generation only if nobody else did since we read it. With `pinned`
/// generations (the request's `If-Match`) a lost race is the client's 412;
/// without, we re-read and try again. `reason` names the event.
pub async fn update_spec(
    state: &AppState,
    name: &str,
    pinned: Option<&[i64]>,
    reason: &'static str,
    change: impl Fn(&PoolSpec) -> ApiResult<PoolSpec>,
) -> ApiResult<Pool> {
    const ATTEMPTS: usize = 5;
    for _ in 0..ATTEMPTS {
        let pool = load(state, name).await?;
        if let Some(tags) = pinned
            && !tags.contains(&pool.generation)
        {
            let asked: Vec<String> = tags.iter().map(i64::to_string).collect();
            return Err(ApiError::PreconditionFailed(format!(
                "pool {name:?} is at generation {}, not {}",
                pool.generation,
                asked.join(" or ")
            )));
        }
        if pool.deleting {
            return Err(ApiError::Conflict(format!("pool {name:?} is being deleted; its spec can no longer change")));
        }
        let spec = change(&pool.spec)?;
        if spec == pool.spec {
            return Ok(pool);
        }
        let now = Utc::now();
        let mut tx = state.db.begin_write().await?;
        // A pool that named a cluster before checks existed can still be scaled.
        if spec.cluster != pool.spec.cluster {
            check_cluster(&mut *tx, &spec).await?;
        }
        let event = |_| NewEvent::pool(name, EventType::Normal, reason, describe_change(&pool.spec, &spec));
        let Some(written) = db::pools::change_spec(&mut tx, &pool, &spec, now, event).await? else {
            drop(tx);
            if pinned.is_some() {
                return Err(ApiError::PreconditionFailed(format!(
                    "pool {name:?} changed while this request ran; re-read it and retry"
                )));
            }
            continue;
        };
        tx.commit().await?;
        // The revision and approvals may have moved in this transaction.
        let updated = state.db.pool(name).await?.unwrap_or(written.pool);
        changed(state, name);
        tracing::info!(pool = name, generation = updated.generation, "spec updated");
        return Ok(updated);
    }
    Err(ApiError::Conflict(format!("pool {name:?} kept changing under this request; retry")))
}

/// Flags the pool for deletion (the reconciler removes its machines, then
/// the pool). Repeating it is harmless.
pub async fn delete(state: &AppState, name: &str) -> ApiResult<Pool> {
    let now = Utc::now();
    let mut tx = state.db.begin_write().await?;
    let pool = match db::pools::mark_deleting(&mut tx, name, now).await? {
        Some(pool) => {
            let message = "pool marked for deletion; removing its machines";
            db::events::record(&mut tx, &NewEvent::pool(name, EventType::Normal, "DeletionRequested", message), now)
                .await?;
            pool
        }
        // Already deleting (a repeated call), or missing.
        None => load(state, name).await?,
    };
    tx.commit().await?;
    changed(state, name);
    Ok(pool)
}

/// Removes a chosen machine: marks it and lowers `replicas` by one, in one
/// transaction. For a machine already marked (a repeated call) nothing
/// changes. Returns the machine and the pool.
pub async fn remove_machine(state: &AppState, name: &str, machine: &str) -> ApiResult<(Machine, Pool)> {
    let now = Utc::now();
    let mut tx = state.db.begin_write().await?;
    let (m, pool) = match db::machines::mark_if_unmarked(&mut tx, name, machine, now).await? {
        Some(m) => {
            let Some(pool) = db::pools::decrement_replicas(&mut tx, name, now).await? else {
                return Err(ApiError::Conflict(format!(
                    "pool {name:?} is being deleted or has zero replicas; there is nothing to scale down"
                )));
            };
            let message = format!("{machine} removed on request; replicas lowered to {}", pool.spec.replicas);
            db::events::record(
                &mut tx,
                &NewEvent::pool(name, EventType::Normal, "MachineRemovalRequested", message),
                now,
            )
            .await?;
            tx.commit().await?;
            (m, pool)
        }
        None => {
            drop(tx);
            // Marked before (a repeated call), or missing.
            let pool = state.db.pool(name).await?.ok_or_else(|| ApiError::not_found("pool", name))?;
            let m = db::machines::get(state.db.read(), name, machine)
                .await?
                .ok_or_else(|| ApiError::not_found("machine", machine))?;
            (m, pool)
        }
    };
    changed(state, name);
    Ok((m, pool))
}

/// Approves the next batch of a rollout with `strategy.batch_approval`.
pub async fn approve_batch(state: &AppState, name: &str) -> ApiResult<Pool> {
    let pool = load(state, name).await?;
    if !pool.spec.strategy.batch_approval {
        return Err(ApiError::Conflict(format!("pool {name:?} does not use strategy.batch_approval")));
    }
    if pool.status.replicas == pool.status.updated_replicas && pool.status.observed_generation == pool.generation {
        return Err(ApiError::Conflict(format!("pool {name:?} has no rollout in progress")));
    }
    let now = Utc::now();
    let mut tx = state.db.begin_write().await?;
    let pool = db::pools::approve_batch(&mut tx, name).await?.ok_or_else(|| ApiError::not_found("pool", name))?;
    let message = format!("batch {} of revision {} approved", pool.batches_approved, pool.revision);
    db::events::record(&mut tx, &NewEvent::pool(name, EventType::Normal, "BatchApproved", message), now).await?;
    tx.commit().await?;
    state.queue.enqueue(name);
    Ok(pool)
}

/// Returns the pool to an earlier revision's version and image (default:
/// the newest earlier one with another image). An operator (`admin` false)
/// may not pick another custom image for a pool with host mounts.
pub async fn rollback(state: &AppState, name: &str, revision: Option<i64>, admin: bool) -> ApiResult<Pool> {
    let pool = load(state, name).await?;
    if pool.deleting {
        return Err(ApiError::Conflict(format!("pool {name:?} is being deleted")));
    }
    let target = match revision {
        Some(r) => db::revisions::get(state.db.read(), name, r).await?,
        None => db::revisions::previous(state.db.read(), name, pool.revision).await?,
    };
    if let Some(target) = &target {
        // The same rules as a PATCH of `image`: the image must be allowed,
        // and on a pool with host mounts only an admin picks it.
        if !state.limits().host.image_allowed(&target.desired_image) {
            return Err(ApiError::invalid(
                "revision",
                "image_allowed",
                format!(
                    "revision {} runs {:?}, which this server no longer allows",
                    target.revision, target.desired_image
                ),
            ));
        }
        if !admin && target.image.is_some() && target.image != pool.spec.image && !pool.spec.extra_mounts.is_empty() {
            tracing::info!("operator tried to roll a pool with host mounts back to another custom image");
            return Err(ApiError::Forbidden { need: "admin" });
        }
    }
    let rolled =
        reconcile::rollback::rollback(&state.db, &pool, revision, "rollback requested").await.map_err(|e| match e {
            RollbackError::UnknownRevision { .. } => ApiError::invalid("revision", "exists", e),
            RollbackError::Store(s) => ApiError::Database(s),
            RollbackError::BadRevision { .. } => ApiError::Internal(e.into()),
            other => ApiError::Conflict(other.to_string()),
        })?;
    changed(state, name);
    Ok(rolled.pool)
}

/// What the reconciler would do now, for the pool as it is or with the
/// spec `propose` makes of it. Nothing is changed.
pub async fn plan(
    state: &AppState,
    name: &str,
    propose: Option<impl FnOnce(&PoolSpec) -> ApiResult<PoolSpec>>,
) -> ApiResult<(Pool, Plan, Counts)> {
    let mut pool = load(state, name).await?;
    if let Some(propose) = propose {
        let proposed = propose(&pool.spec)?;
        if proposed.desired_image() != pool.spec.desired_image() {
            // A new image starts a new rollout with its first batch approved.
            pool.batches_approved = 1;
        }
        pool.spec = proposed;
    }
    let (plan, observed) = reconcile::dry_run(&state.reconcile, &pool).await.map_err(|e| match e {
        reconcile::ReconcileError::Runtime(r) => ApiError::Unavailable(r.to_string()),
        reconcile::ReconcileError::Store(s) => ApiError::Database(s),
        other => ApiError::Internal(anyhow::anyhow!(other.to_string())),
    })?;
    Ok((pool, plan, observed))
}

/// Machine counts observed now, for a rollout view.
pub async fn live_counts(state: &AppState, pool: &Pool) -> ApiResult<Counts> {
    reconcile::live_counts(&state.reconcile, pool)
        .await
        .map_err(|e| ApiError::Internal(anyhow::Error::new(e).context("observing the pool")))
}
