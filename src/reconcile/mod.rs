//! The pool reconciler: observe the containers, plan (pure), execute the
//! plan through the runtime, record status. Level-triggered: a pass never
//! asks why it was woken, so running it twice is harmless.

mod execute;
mod node;
pub mod plan;
pub mod rollback;
mod status;
pub mod worker;

use execute::{execute, warn_unrecorded};
pub use status::record_failure;
use status::status_after_pass;

pub use node::NodeSettings;

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use tokio::sync::Semaphore;

use crate::db::{self, Db, machines::Machine, pools::Pool};
use crate::domain::event::{EventType, NewEvent, SubjectKind};
use crate::domain::pool::PoolSpec;
use crate::domain::rollout::Counts;
use crate::metrics::CallResult;
use crate::runtime::{Container, ContainerState, Runtime, RuntimeError, labels};
use plan::{Desired, Observed, Plan};

/// What every pass needs, shared by the worker and the API's dry runs.
#[derive(Clone)]
pub struct Context {
    pub db: Db,
    pub runtime: Runtime,
    /// Container operations in flight at once, across all pools.
    pub parallel: Arc<Semaphore>,
    pub stop_timeout_secs: i64,
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Tells event streams that a pool changed.
    pub changes: crate::changes::Changes,
    /// Cordon and drain of a machine's node, for pools that belong to a cluster.
    pub nodes: NodeSettings,
}

impl Context {
    /// Counts one container runtime call and passes its result on.
    fn counted<T>(&self, op: &'static str, r: Result<T, RuntimeError>) -> Result<T, RuntimeError> {
        let result = match &r {
            Ok(_) => CallResult::Ok,
            Err(RuntimeError::Unavailable(_)) => CallResult::Unavailable,
            Err(_) => CallResult::Error,
        };
        self.metrics.runtime_call(op, result);
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
    let mut tx = crate::db::begin_write(&ctx.db).await?;
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

/// The deleting pool has no containers left: drop its rows.
async fn purge(ctx: &Context, name: &str) -> Result<Outcome, ReconcileError> {
    let mut tx = crate::db::begin_write(&ctx.db).await?;
    db::events::purge(&mut *tx, SubjectKind::Pool, name).await?;
    db::pools::remove(&mut *tx, name).await?;
    tx.commit().await?;
    tracing::info!(pool = name, "pool deleted");
    Ok(Outcome::Gone)
}
