//! The pool reconciler: observe what the engines report, decide (pure),
//! execute, record. Level-triggered: a pass never asks why it was woken, so
//! running it twice is harmless; and it decides from what the engines
//! report, never from what drover last did.
//!
//! - [`observe`]: containers + records + clock -> what the planner sees.
//! - [`decide`]: the pure decision of a pass: the plan ([`plan`]), the
//!   status, the events, a rollback, the next look.
//! - `execute`: deletions recorded then handed to `terminate` (background),
//!   repairs and creations inline, the starts of new containers handed to
//!   the [`starter`] (background).
//! - `records`, `status`: what a pass writes back, only when it changed.
//! - [`worker`]: which pool gets a pass when.

mod context;
pub mod decide;
mod execute;
mod node;
pub mod observe;
pub mod plan;
mod records;
pub mod rollback;
pub mod starter;
mod status;
pub mod terminate;
pub mod terminator;
#[cfg(test)]
mod testing;
pub mod worker;

pub use crate::k8s::NodeSettings;
pub use context::{Context, ReconcileError};
pub use decide::{Outcome, counts};
pub use status::record_failure;

use std::collections::{BTreeMap, HashSet};

use chrono::{DateTime, Utc};
use futures_util::future::join_all;

use crate::clusters::ConnectError;
use crate::db::{self, pools::Pool};
use crate::domain::object::{ObjectRef, PoolRef};
use crate::domain::rollout::Counts;
use crate::engines::breaker::Block;
use crate::runtime::{Container, RuntimeError};
use observe::{EngineView, Observation, World};
use plan::{Observed, Plan};

/// What the pass knows of every engine, now, for `pool`, whose namespace
/// is fenced to engines labelled `fence` (empty: any engine).
fn engine_views(ctx: &Context, pool: &Pool, fence: &BTreeMap<String, String>, now: DateTime<Utc>) -> Vec<EngineView> {
    let image = pool.spec.desired_image();
    ctx.engines
        .all()
        .iter()
        .map(|e| {
            let health = e.health();
            let fenced = !crate::domain::labels::matches(fence, &e.labels);
            let reachable = health.reachability == crate::engines::Reachability::Reachable;
            EngineView {
                name: e.name.clone(),
                reachable,
                lost: e.lost(now),
                lost_at: e.lost_at(),
                // An engine being listed for the first time is not failing;
                // only one that has not answered is.
                error: health
                    .last_error
                    .as_ref()
                    .filter(|_| !reachable)
                    .map(|why| format!("engine {} ({}) does not answer: {why}", e.name, e.address())),
                allowed: pool.spec.places_on(&e.name, &e.labels) && !fenced && !e.draining(),
                fenced,
                unplaceable: e.unplaceable(Some(&image), now),
                failing: e.unplaceable(None, now).is_some_and(|u| u.block == Block::Failing),
                first_list: e.first_list_due(now).is_some(),
            }
        })
        .collect()
}

/// Everything one look at a pool yields, before anything is done.
struct Look {
    obs: Observation,
    /// The planner's view of `obs`.
    observed: Vec<Observed>,
    engines: Vec<EngineView>,
    records: Vec<db::machines::Machine>,
}

impl Look {
    /// What `decide` needs of this look.
    fn inputs<'a>(
        &'a self,
        ctx: &'a Context,
        pool: &'a Pool,
        cluster_problem: Option<String>,
        failing: &'a dyn Fn(&str) -> Option<terminator::Failure>,
        now: DateTime<Utc>,
    ) -> decide::Inputs<'a> {
        decide::Inputs {
            pool,
            observed: &self.observed,
            next_change: self.obs.next_change,
            engines: &self.engines,
            timing: &ctx.timing,
            limits: &ctx.limits,
            cluster_problem,
            failing,
            now,
        }
    }
}

async fn look(ctx: &Context, pool: &Pool, now: DateTime<Utc>) -> Result<Look, ReconcileError> {
    // Both reads on one connection. The fence is read on every pass (one
    // row by its key): a fence set through another replica holds from this
    // replica's next pass.
    let mut conn = ctx.db.background_connection().await?;
    let fence = db::namespaces::get(conn.exec(), &pool.id.namespace).await?;
    let fence = fence.map(|n| n.engine_selector).unwrap_or_default();
    let engines = engine_views(ctx, pool, &fence, now);
    let containers_of = || -> Vec<(String, Container)> {
        ctx.engines.containers_of(&pool.id).into_iter().map(|(e, c)| (e.name.clone(), c)).collect()
    };
    let mut containers = containers_of();
    let records = db::machines::list_for_pool(conn.exec(), &pool.id).await?;
    drop(conn);
    let due = observe::to_confirm(&containers, &records, &engines, &ctx.timing, now);
    let unconfirmed = if due.is_empty() {
        HashSet::new()
    } else {
        let unconfirmed = confirm(ctx, due).await;
        containers = containers_of();
        unconfirmed
    };
    let starting = ctx.starter.in_flight_among(containers.iter().map(|(_, c)| c.id.as_str()));
    let world = World {
        containers: &containers,
        records: &records,
        engines: &engines,
        starting: &starting,
        unconfirmed: &unconfirmed,
    };
    let obs = observe::observe(&pool.id, &world, &pool.spec, &ctx.timing, now);
    Ok(Look { observed: obs.observed(), obs, engines, records })
}

/// Asks the engines again about the containers due to settle (engine, id),
/// see [`observe::to_confirm`]; answers those that could not be asked.
async fn confirm(ctx: &Context, due: Vec<(String, String)>) -> HashSet<String> {
    let rereads = due.into_iter().map(|(engine, id)| async move {
        let reread = match ctx.engines.get(&engine) {
            Some(e) => e.reread(&id).await,
            None => Err(RuntimeError::Unavailable(format!("engine {engine} was removed"))),
        };
        match reread {
            Ok(()) => None,
            Err(e) => {
                tracing::debug!(engine, container = %id, error = %e, "a settling container could not be read again");
                Some(id)
            }
        }
    });
    join_all(rereads).await.into_iter().flatten().collect()
}

/// Observes a pool and plans a pass without changing anything: the dry run.
pub async fn dry_run(ctx: &Context, pool: &Pool) -> Result<(Plan, Counts), ReconcileError> {
    let now = ctx.clock.now();
    let look = look(ctx, pool, now).await?;
    let failing = |m: &str| ctx.terminator.failure(m);
    let decision = decide::decide(&look.inputs(ctx, pool, None, &failing, now));
    Ok((decision.plan, counts(&look.observed)))
}

/// The pool's counts as its engines report them now, for views that must
/// not lag behind a pass (the rollout view right after a change).
pub async fn live_counts(ctx: &Context, pool: &Pool) -> Result<Counts, ReconcileError> {
    let look = look(ctx, pool, ctx.clock.now()).await?;
    Ok(counts(&look.observed))
}

/// One pass over one pool: observe, decide, act, observe again if it
/// acted, decide the status, write it. The worker guarantees no two passes
/// of the same pool run at once.
///
/// Its span says what the pass saw and decided: the pool's generation, the
/// machines it planned to create, delete and repair, and what comes next.
#[tracing::instrument(skip(ctx), fields(
    namespace = %name.namespace,
    pool = %name.name,
    otel.name = "reconcile",
    pool.generation = tracing::field::Empty,
    plan.create = tracing::field::Empty,
    plan.delete = tracing::field::Empty,
    plan.repair = tracing::field::Empty,
    decision = tracing::field::Empty,
))]
pub async fn reconcile_once(ctx: &Context, name: &PoolRef) -> Result<Outcome, ReconcileError> {
    let result = pass(ctx, name).await;
    tracing::Span::current().record(
        "decision",
        match &result {
            Ok(Outcome::Idle) => "converged",
            Ok(Outcome::Requeue(_)) => "progressing",
            Ok(Outcome::Gone) => "gone",
            Err(_) => "error",
        },
    );
    result
}

async fn pass(ctx: &Context, name: &PoolRef) -> Result<Outcome, ReconcileError> {
    let Some(pool) = ctx.db.pool_for_worker(name).await? else {
        return Ok(Outcome::Gone);
    };
    tracing::Span::current().record("pool.generation", pool.generation);
    if ctx.fence.needs_fresh_look() {
        ctx.engines.relist_pool(name).await?;
        ctx.fence.looked();
    }
    let now = ctx.clock.now();
    let seen = look(ctx, &pool, now).await?;
    records::sync(ctx, name, &seen.obs, &seen.records, now).await?;
    if pool.deleting && seen.obs.machines.is_empty() {
        return purge(ctx, name).await;
    }
    let cluster = cluster_problem(ctx, &pool).await?;
    let failing = |m: &str| ctx.terminator.failure(m);
    let first = decide::decide(&seen.inputs(ctx, &pool, cluster.clone(), &failing, now));
    let plan = &first.plan;
    let acted = !(plan.delete.is_empty() && plan.repair.is_empty() && plan.create.is_empty());
    let span = tracing::Span::current();
    // As i64: OpenTelemetry's integers are signed (a u64 would be text).
    let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    span.record("plan.create", count(plan.create.len()));
    span.record("plan.delete", count(plan.delete.len()));
    span.record("plan.repair", count(plan.repair.len()));
    // Records as the executor will find them: synced just now.
    let synced: Vec<db::machines::Machine> = seen.obs.machines.iter().map(|s| s.record.clone()).collect();
    let executed = execute::execute(ctx, &pool, plan, &synced).await;
    let (decision, seen) = if acted {
        let now = ctx.clock.now();
        let fresh = look(ctx, &pool, now).await?;
        records::sync(ctx, name, &fresh.obs, &fresh.records, now).await?;
        (decide::after(&fresh.inputs(ctx, &pool, cluster, &failing, now), first.plan, first.desired), fresh)
    } else {
        (first, seen)
    };
    executed?;

    for ev in &decision.events {
        ctx.record(ev).await;
    }
    let mut status = decision.status;
    if decision.rollback {
        match rollback::rollback(&ctx.db, &ctx.fence, &pool, None, "the progress deadline passed", now).await {
            Ok(rolled) => {
                let counts = counts(&seen.observed);
                status = decide::rolled_back(status, &pool, rolled.revision, &counts, now);
            }
            Err(e) => tracing::warn!(pool = %pool.id, error = %e, "automatic rollback not possible"),
        }
    }
    status::write_if_changed(ctx, &pool, status, decision.held, ctx.clock.now()).await?;
    Ok(decision.next)
}

/// Why the pool's cluster could not be used, if it could not: the pool says
/// so on every pass, not only when a drain needs the cluster.
async fn cluster_problem(ctx: &Context, pool: &Pool) -> Result<Option<String>, ReconcileError> {
    let Some(cluster) = pool.cluster() else { return Ok(None) };
    Ok(match crate::clusters::check(ctx.db.background(), &cluster, ctx.nodes.retry.call_timeout).await {
        Ok(()) => None,
        Err(ConnectError::NotRegistered(_)) => Some(format!("cluster {:?} is not registered", cluster.name)),
        Err(ConnectError::Unusable { source, .. }) => {
            Some(format!("the credentials of cluster {:?} cannot be used: {source}", cluster.name))
        }
        Err(ConnectError::Store(e)) => return Err(e.into()),
    })
}

/// The deleting pool has no machines left: drop its rows.
async fn purge(ctx: &Context, name: &PoolRef) -> Result<Outcome, ReconcileError> {
    let mut tx = ctx.begin().await?;
    db::events::purge(&mut tx, &ObjectRef::Pool(name.clone())).await?;
    db::pools::remove(&mut tx, name).await?;
    tx.commit().await?;
    tracing::info!(namespace = %name.namespace, pool = %name.name, "pool deleted");
    Ok(Outcome::Gone)
}
