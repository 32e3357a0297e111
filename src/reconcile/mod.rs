//! The pool reconciler: observe the containers, plan (pure), execute the
//! plan through the runtime, record status. Level-triggered: a pass never
//! asks why it was woken, so running it twice is harmless.

pub mod plan;
pub mod worker;

use std::collections::HashMap;
use std::sync::Arc;

use chrono::Utc;
use futures_util::future::join_all;
use tokio::sync::Semaphore;

use crate::db::{self, Db, machines::Machine, pools::Pool};
use crate::domain::event::{EventType, NewEvent, SubjectKind};
use crate::domain::status::{ConditionStatus, PoolStatus};
use crate::runtime::{Container, CreateContainer, Runtime, RuntimeError, labels};
use plan::{Creation, Deletion, Desired, Observed, Plan};

/// What every pass needs, shared by the worker and the API's dry runs.
#[derive(Clone)]
pub struct Context {
    pub db: Db,
    pub runtime: Runtime,
    /// Container operations in flight at once, across all pools.
    pub parallel: Arc<Semaphore>,
    pub stop_timeout_secs: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("store: {0}")]
    Store(#[from] sqlx::Error),
    #[error("{failed} of {total} container operations failed; first: {first}")]
    Partial { failed: usize, total: usize, first: RuntimeError },
}

/// How a pass ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The pool matches its spec; wait for the next change or resync.
    Converged,
    /// Work remains (machines starting, old ones to replace): look again soon.
    Progressing,
    /// The pool no longer exists.
    Gone,
}

/// The observed machines the planner sees, joined from containers and records.
pub fn observe(containers: &[Container], records: &[Machine], desired_image: &str) -> Vec<Observed> {
    let requested: HashMap<&str, bool> = records.iter().map(|m| (m.name.as_str(), m.delete_requested)).collect();
    containers
        .iter()
        .map(|c| Observed {
            name: c.name.clone(),
            container_id: c.id.clone(),
            up_to_date: c.image == desired_image,
            ready: c.ready(),
            delete_requested: requested.get(c.name.as_str()).copied().unwrap_or(false),
            never_started: c.state == crate::runtime::ContainerState::Created,
            failure_domain: c.failure_domain().map(str::to_owned),
            created_at: c.created_at.timestamp(),
        })
        .collect()
}

pub fn desired_of(pool: &Pool) -> Desired {
    let bounds = pool.spec.strategy.resolve(pool.spec.replicas);
    Desired {
        replicas: pool.spec.replicas,
        failure_domains: pool.spec.failure_domains.clone(),
        max_surge: bounds.max_surge,
        max_unavailable: bounds.max_unavailable,
        paused: pool.spec.paused,
        deleting: pool.deleting,
    }
}

/// One pass over one pool. The worker guarantees no two passes of the same
/// pool run at once.
#[tracing::instrument(skip(ctx), fields(pool = %name))]
pub async fn reconcile_once(ctx: &Context, name: &str) -> Result<Outcome, ReconcileError> {
    let Some(pool) = db::pools::get(&ctx.db, name).await? else {
        return Ok(Outcome::Gone);
    };
    let containers = ctx.runtime.list_pool(name).await?;
    sync_records(ctx, &pool, &containers).await?;
    let records = db::machines::list_for_pool(&ctx.db, name).await?;

    let image = pool.spec.desired_image();
    let observed = observe(&containers, &records, &image);
    let plan = plan::plan(&observed, &desired_of(&pool));
    if pool.deleting && containers.is_empty() {
        return purge(ctx, name).await;
    }
    execute(ctx, &pool, &plan).await?;

    let containers = if plan.is_empty() { containers } else { ctx.runtime.list_pool(name).await? };
    if !plan.is_empty() {
        sync_records(ctx, &pool, &containers).await?;
    }
    let status = status_after_pass(&pool, &containers, &image);
    let converged = plan.is_empty()
        && status.replicas == pool.spec.replicas
        && status.ready_replicas == pool.spec.replicas
        && status.updated_replicas == pool.spec.replicas;
    db::pools::write_status(&ctx.db, name, &status).await?;
    Ok(if converged || pool.spec.paused { Outcome::Converged } else { Outcome::Progressing })
}

/// Rules 2 and 3 of the seed: every container has a record; records whose
/// container is gone are dropped so that the next plan replaces them.
async fn sync_records(ctx: &Context, pool: &Pool, containers: &[Container]) -> Result<(), ReconcileError> {
    let now = Utc::now();
    let records = db::machines::list_for_pool(&ctx.db, &pool.name).await?;
    let mut tx = ctx.db.begin().await?;
    for c in containers {
        if !records.iter().any(|r| r.name == c.name) {
            let how = if c.labels.get(labels::MANAGED_BY).map(String::as_str) == Some(labels::MANAGED_BY_VALUE) {
                "found"
            } else {
                "adopted"
            };
            let ev = NewEvent::pool(
                &pool.name,
                EventType::Normal,
                "MachineAdopted",
                format!("{how} container {} ({})", c.name, c.image),
            );
            // Machines this process creates are recorded by the executor;
            // only announce those that appeared some other way.
            if how == "adopted" {
                db::events::record(&mut *tx, &ev, now).await?;
            }
        }
        db::machines::upsert_from_container(&mut *tx, &pool.name, c, now).await?;
    }
    for r in &records {
        if !containers.iter().any(|c| c.name == r.name) {
            db::machines::delete(&mut *tx, &pool.name, &r.name).await?;
            let ev = NewEvent::pool(
                &pool.name,
                EventType::Warning,
                "MachineVanished",
                format!("container of {} is gone; it will be replaced", r.name),
            );
            db::events::record(&mut *tx, &ev, now).await?;
        }
    }
    tx.commit().await?;
    Ok(())
}

/// Applies a plan: deletions first, then (only if they all worked)
/// creations, each side with bounded parallelism.
async fn execute(ctx: &Context, pool: &Pool, plan: &Plan) -> Result<(), ReconcileError> {
    let total = plan.delete.len() + plan.start.len() + plan.create.len();
    let deletes = join_all(plan.delete.iter().map(|d| delete_machine(ctx, pool, d))).await;
    let mut errors: Vec<RuntimeError> = deletes.into_iter().filter_map(Result::err).collect();
    if errors.is_empty() {
        let starts = join_all(plan.start.iter().map(|s| start_machine(ctx, pool, s))).await;
        errors.extend(starts.into_iter().filter_map(Result::err));
        let creates = join_all(plan.create.iter().map(|c| create_machine(ctx, pool, c))).await;
        errors.extend(creates.into_iter().filter_map(Result::err));
    }
    let failed = errors.len();
    match errors.into_iter().next() {
        None => Ok(()),
        Some(first) if failed == 1 && total == 1 => Err(first.into()),
        Some(first) => Err(ReconcileError::Partial { failed, total, first }),
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
    let container = ctx.runtime.create(&spec).await?;
    let now = Utc::now();
    let fd = c.failure_domain.as_deref().map(|f| format!(" in {f}")).unwrap_or_default();
    let ev =
        NewEvent::pool(&pool.name, EventType::Normal, "MachineCreated", format!("created {name} ({}){fd}", spec.image));
    let stored = async {
        let mut tx = ctx.db.begin().await?;
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
    ctx.runtime.start(&s.container_id, ctx.stop_timeout_secs).await?;
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

async fn delete_machine(ctx: &Context, pool: &Pool, d: &Deletion) -> Result<(), RuntimeError> {
    let _permit = ctx.parallel.acquire().await.map_err(|_| RuntimeError::Unavailable("shutting down".into()))?;
    ctx.runtime.remove(&d.container_id, ctx.stop_timeout_secs).await?;
    let now = Utc::now();
    let why = match d.reason {
        plan::DeleteReason::Outdated => "it runs an outdated image",
        plan::DeleteReason::DeleteRequested => "deletion was requested",
        plan::DeleteReason::Excess => "the pool has more ready machines than replicas",
        plan::DeleteReason::PoolDeleting => "the pool is being deleted",
    };
    let ev = NewEvent::pool(&pool.name, EventType::Normal, "MachineDeleted", format!("deleted {}: {why}", d.machine));
    let stored = async {
        let mut tx = ctx.db.begin().await?;
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
fn warn_unrecorded(result: sqlx::Result<()>) {
    if let Err(e) = result {
        tracing::warn!(error = %e, "recording a machine change failed; the next pass will repair it");
    }
}

/// The deleting pool has no containers left: drop its rows.
async fn purge(ctx: &Context, name: &str) -> Result<Outcome, ReconcileError> {
    let mut tx = ctx.db.begin().await?;
    db::events::purge(&mut *tx, SubjectKind::Pool, name).await?;
    db::pools::remove(&mut *tx, name).await?;
    tx.commit().await?;
    tracing::info!(pool = name, "pool deleted");
    Ok(Outcome::Gone)
}

/// Counts and conditions after a successful pass.
fn status_after_pass(pool: &Pool, containers: &[Container], image: &str) -> PoolStatus {
    let now = Utc::now();
    let mut status = PoolStatus {
        observed_generation: pool.generation,
        replicas: count(containers.len()),
        ready_replicas: count(containers.iter().filter(|c| c.ready()).count()),
        updated_replicas: count(containers.iter().filter(|c| c.image == image).count()),
        conditions: pool.status.conditions.clone(),
        last_error: None,
        last_reconciled_at: Some(now),
    };
    status.set_condition(
        "RuntimeAvailable",
        ConditionStatus::True,
        "RuntimeReachable",
        "the container runtime answers",
        now,
    );
    let want = pool.spec.replicas;
    let (ready, reason, message) = if pool.deleting {
        (ConditionStatus::False, "Deleting", format!("removing {} machines", status.replicas))
    } else if status.ready_replicas == want && status.updated_replicas == want && status.replicas == want {
        (ConditionStatus::True, "AllReady", format!("{want} of {want} machines ready and up to date"))
    } else if pool.spec.paused {
        (ConditionStatus::False, "Paused", "the pool is paused".to_owned())
    } else if status.updated_replicas < status.replicas {
        (
            ConditionStatus::False,
            "RollingUpdate",
            format!("{} of {} machines run {image}", status.updated_replicas, status.replicas),
        )
    } else if status.replicas > want {
        (ConditionStatus::False, "ScalingDown", format!("{} machines, want {want}", status.replicas))
    } else {
        (ConditionStatus::False, "ScalingUp", format!("{} of {want} machines ready", status.ready_replicas))
    };
    status.set_condition("Ready", ready, reason, message, now);
    status
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Records a failed pass on the pool: conditions, last error, an event.
pub async fn record_failure(ctx: &Context, name: &str, err: &ReconcileError) {
    let now = Utc::now();
    let message = crate::error::error_chain(err);
    let result = async {
        let Some(pool) = db::pools::get(&ctx.db, name).await? else { return Ok(()) };
        let mut status = pool.status.clone();
        let unavailable = matches!(err, ReconcileError::Runtime(RuntimeError::Unavailable(_)))
            || matches!(err, ReconcileError::Partial { first: RuntimeError::Unavailable(_), .. });
        if unavailable {
            status.set_condition(
                "RuntimeAvailable",
                ConditionStatus::False,
                "RuntimeUnavailable",
                message.clone(),
                now,
            );
        }
        let repeated = status.last_error.as_deref() == Some(message.as_str());
        status.last_error = Some(message.clone());
        let mut tx = ctx.db.begin().await?;
        db::pools::write_status(&mut *tx, name, &status).await?;
        // A failure that repeats word for word is one story, told once.
        if !repeated {
            let reason = if unavailable { "RuntimeUnavailable" } else { "ReconcileFailed" };
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
