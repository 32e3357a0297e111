//! The pool reconciler: observe the containers, plan (pure), execute the
//! plan through the runtime, record status. Level-triggered: a pass never
//! asks why it was woken, so running it twice is harmless.

mod node;
pub mod plan;
pub mod rollback;
pub mod worker;

pub use node::NodeSettings;

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use futures_util::future::join_all;
use tokio::sync::Semaphore;

use crate::db::{self, Db, machines::Machine, pools::Pool};
use crate::domain::event::{EventType, NewEvent, SubjectKind};
use crate::domain::pool::PoolSpec;
use crate::domain::rollout::{self as rollout, Counts};
use crate::domain::status::{ConditionStatus, PoolStatus};
use crate::runtime::{Container, ContainerState, CreateContainer, Runtime, RuntimeError, labels};
use plan::{Creation, Deletion, Desired, Observed, Plan};

/// What every pass needs, shared by the worker and the API's dry runs.
#[derive(Clone)]
pub struct Context {
    pub db: Db,
    pub runtime: Runtime,
    /// Container operations in flight at once, across all pools.
    pub parallel: Arc<Semaphore>,
    pub stop_timeout_secs: i64,
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Cordon and drain of a machine's node, for pools that belong to a cluster.
    pub nodes: NodeSettings,
}

impl Context {
    /// Counts one container runtime call and passes its result on.
    fn counted<T>(&self, op: &str, r: Result<T, RuntimeError>) -> Result<T, RuntimeError> {
        let result = match &r {
            Ok(_) => "ok",
            Err(RuntimeError::Unavailable(_)) => "unavailable",
            Err(_) => "error",
        };
        self.metrics.inc("drover_runtime_calls_total", &[("op", op), ("result", result)]);
        r
    }

    async fn list(&self, pool: &str) -> Result<Vec<Container>, RuntimeError> {
        let r = self.runtime.list_pool(pool).await;
        self.counted("list", r)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("store: {0}")]
    Store(#[from] sqlx::Error),
    #[error("{failed} of {total} container operations failed; first: {first}")]
    Partial { failed: usize, total: usize, first: Box<ReconcileError> },
    /// Rule 5: the machine's node was not cordoned and drained, so its
    /// container is kept.
    #[error("machine {machine} kept: its node in cluster {cluster:?} was not drained")]
    Drain {
        machine: String,
        cluster: String,
        #[source]
        source: crate::k8s::DrainError,
    },
}

impl ReconcileError {
    /// The error behind a `Partial`, or this one.
    fn first(&self) -> &ReconcileError {
        match self {
            Self::Partial { first, .. } => first,
            other => other,
        }
    }
}

/// How a pass ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The pool matches its spec, or waits for a person: wait for the next
    /// change or resync.
    Converged,
    /// Work remains (machines starting, old ones to replace): look again soon.
    Progressing,
    /// The pool no longer exists.
    Gone,
}

fn seconds_since(t: DateTime<Utc>, now: DateTime<Utc>) -> i64 {
    now.signed_duration_since(t).num_seconds()
}

/// The machines the planner sees, joined from containers and records.
pub fn observe(containers: &[Container], records: &[Machine], spec: &PoolSpec, now: DateTime<Utc>) -> Vec<Observed> {
    let desired_image = spec.desired_image();
    let by_name: HashMap<&str, &Machine> = records.iter().map(|m| (m.name.as_str(), m)).collect();
    containers
        .iter()
        .map(|c| {
            let record = by_name.get(c.name.as_str());
            let ready = c.ready();
            let up_to_date = c.image == desired_image;
            let ready_long_enough = spec.min_ready_seconds == 0
                || record
                    .and_then(|r| r.ready_since)
                    .is_some_and(|since| seconds_since(since, now) >= i64::from(spec.min_ready_seconds));
            let stuck = up_to_date
                && !ready
                && spec.machine_ready_timeout_seconds.is_some_and(|t| seconds_since(c.created_at, now) > i64::from(t));
            Observed {
                name: c.name.clone(),
                container_id: c.id.clone(),
                up_to_date,
                ready,
                available: ready && ready_long_enough,
                stuck,
                delete_requested: record.is_some_and(|r| r.delete_requested),
                never_started: c.state == ContainerState::Created,
                failure_domain: c.failure_domain().map(str::to_owned),
                created_at: c.created_at.timestamp(),
            }
        })
        .collect()
}

pub fn counts(observed: &[Observed]) -> Counts {
    let n = |f: &dyn Fn(&Observed) -> bool| u32::try_from(observed.iter().filter(|m| f(m)).count()).unwrap_or(u32::MAX);
    Counts {
        total: n(&|_| true),
        updated: n(&|m| m.up_to_date),
        ready: n(&|m| m.ready),
        available: n(&|m| m.available),
        updated_available: n(&|m| m.up_to_date && m.available),
        outdated: n(&|m| !m.up_to_date),
    }
}

/// The planner's view of the pool, given what the pass observed.
pub fn desired_of(pool: &Pool, observed: &[Observed]) -> Desired {
    let bounds = pool.spec.strategy.resolve(pool.spec.replicas);
    let rolling = observed.iter().any(|m| !m.up_to_date);
    let max_updated = (pool.spec.strategy.batch_approval && rolling).then(|| {
        let approved = u32::try_from(pool.batches_approved.max(1)).unwrap_or(u32::MAX);
        approved.saturating_mul(bounds.batch_size()).min(pool.spec.replicas)
    });
    Desired {
        replicas: pool.spec.replicas,
        failure_domains: pool.spec.failure_domains.clone(),
        max_surge: bounds.max_surge,
        max_unavailable: bounds.max_unavailable,
        paused: pool.spec.paused,
        deleting: pool.deleting,
        max_updated,
    }
}

/// Observes a pool and plans a pass without changing anything: the dry run.
pub async fn dry_run(ctx: &Context, pool: &Pool) -> Result<(Plan, Counts), ReconcileError> {
    let containers = ctx.list(&pool.name).await?;
    let records = db::machines::list_for_pool(&ctx.db, &pool.name).await?;
    let observed = observe(&containers, &records, &pool.spec, Utc::now());
    Ok((plan::plan(&observed, &desired_of(pool, &observed)), counts(&observed)))
}

/// One pass over one pool. The worker guarantees no two passes of the same
/// pool run at once.
#[tracing::instrument(skip(ctx), fields(pool = %name))]
pub async fn reconcile_once(ctx: &Context, name: &str) -> Result<Outcome, ReconcileError> {
    let Some(pool) = db::pools::get(&ctx.db, name).await? else {
        return Ok(Outcome::Gone);
    };
    let mut containers = ctx.list(name).await?;
    sync_records(ctx, &pool, &containers).await?;
    if pool.deleting && containers.is_empty() {
        return purge(ctx, name).await;
    }
    let mut records = db::machines::list_for_pool(&ctx.db, name).await?;
    let mut observed = observe(&containers, &records, &pool.spec, Utc::now());
    let desired = desired_of(&pool, &observed);
    let plan = plan::plan(&observed, &desired);
    execute(ctx, &pool, &plan).await?;

    if !plan.is_empty() {
        containers = ctx.list(name).await?;
        sync_records(ctx, &pool, &containers).await?;
        records = db::machines::list_for_pool(&ctx.db, name).await?;
        observed = observe(&containers, &records, &pool.spec, Utc::now());
    }
    let counts = counts(&observed);
    let awaiting_approval = plan.is_empty() && desired.max_updated.is_some_and(|allowed| counts.updated >= allowed);
    let status = status_after_pass(ctx, &pool, &counts, awaiting_approval).await?;
    db::pools::write_status(&ctx.db, name, &status).await?;
    let settled = counts.complete(pool.spec.replicas) && plan.is_empty();
    Ok(if settled || pool.spec.paused || awaiting_approval || pool.deleting && plan.is_empty() {
        Outcome::Converged
    } else {
        Outcome::Progressing
    })
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

/// Counts, conditions and rollout progress after a successful pass; may
/// start an automatic rollback when the progress deadline has just passed.
async fn status_after_pass(
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
        let mut tx = ctx.db.begin().await?;
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
