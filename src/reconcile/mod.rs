//! The pool reconciler: observe what the engines report, plan (pure),
//! execute the plan, record status. Level-triggered: a pass never asks why
//! it was woken, so running it twice is harmless; and it decides from what
//! the engines report, never from what drover last did.
//!
//! - [`observe`]: containers + records + clock -> what the planner sees.
//! - [`plan`]: the pure planner.
//! - `execute`: deletions recorded then handed to `terminate` (background),
//!   repairs and creations inline, the starts of new containers handed to
//!   the [`starter`] (background).
//! - `records`, `status`: what a pass writes back, only when it changed.
//! - [`worker`]: which pool gets a pass when.

mod context;
mod engine_events;
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
pub mod worker;

pub use crate::k8s::NodeSettings;
pub use context::{Context, ReconcileError};
pub use status::{counts, record_failure};

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::db::{self, pools::Pool};
use crate::domain::event::SubjectKind;
use crate::domain::rollout::Counts;
use observe::{EngineView, Observation, Timing};
use plan::{Desired, Observed, Plan};

/// How a pass ended, and when the pool wants its next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing changes by the clock alone: wait for an event, a change or
    /// the resync.
    Idle,
    /// Look again after this long (work in flight, a machine settling, a
    /// restart due), or sooner if woken.
    Requeue(Duration),
    /// The pool no longer exists.
    Gone,
}

/// How soon a pass that acted looks again, events aside.
const RECHECK: Duration = Duration::from_secs(2);

/// What the pass knows of every engine, now, for `pool`.
fn engine_views(ctx: &Context, pool: &Pool, now: DateTime<Utc>) -> Vec<EngineView> {
    ctx.engines
        .all()
        .iter()
        .map(|e| {
            let health = e.health();
            let reachable = health.reachability == crate::runtime::Reachability::Reachable;
            let lost_after = chrono::Duration::from_std(ctx.timing.lost_after).unwrap_or(chrono::Duration::MAX);
            // Engines keep their own (wall) time for reachability.
            EngineView {
                name: e.name.clone(),
                reachable,
                listed: health.reachability != crate::runtime::Reachability::Syncing,
                lost: e.lost(now, ctx.timing.lost_after),
                lost_at: (!reachable).then(|| health.since + lost_after),
                // An engine being listed for the first time is not failing;
                // only one that has not answered is.
                error: health
                    .last_error
                    .as_ref()
                    .filter(|_| !reachable)
                    .map(|why| format!("engine {} ({}) does not answer: {why}", e.name, e.address())),
                allowed: pool.spec.places_on(&e.name, &e.labels) && !e.draining(),
            }
        })
        .collect()
}

/// The planner's view of the pool, given what the pass observed.
pub fn desired_of(pool: &Pool, observed: &[Observed], engines: &[EngineView], timing: &Timing) -> Desired {
    let bounds = pool.spec.strategy.resolve(pool.spec.replicas);
    let rolling = observed.iter().any(|m| !m.up_to_date && !m.lost);
    let max_updated = (pool.spec.strategy.batch_approval && rolling).then(|| {
        let approved = u32::try_from(pool.batches_approved.max(1)).unwrap_or(u32::MAX);
        approved.saturating_mul(bounds.batch_size()).min(pool.spec.replicas)
    });
    // While an engine has not been listed yet, what it holds is unknown:
    // creating machines now could double them.
    let unlisted = engines.iter().any(|e| !e.listed && !e.lost && e.allowed);
    let usable = if unlisted {
        Vec::new()
    } else {
        engines.iter().filter(|e| e.reachable && e.allowed).map(|e| e.name.clone()).collect()
    };
    Desired {
        replicas: pool.spec.replicas,
        failure_domains: pool.spec.failure_domains.clone(),
        engines: usable,
        max_surge: bounds.max_surge,
        max_unavailable: bounds.max_unavailable,
        replacement: pool.spec.strategy.replacement,
        paused: pool.spec.paused,
        deleting: pool.deleting,
        max_updated,
        max_failed_restarts: timing.restart.max_failed.max(1),
    }
}

/// Everything one look at a pool yields, before anything is done.
struct Look {
    obs: Observation,
    engines: Vec<EngineView>,
    records: Vec<db::machines::Machine>,
}

async fn look(ctx: &Context, pool: &Pool, now: DateTime<Utc>) -> Result<Look, ReconcileError> {
    let engines = engine_views(ctx, pool, now);
    let containers: Vec<(String, crate::runtime::Container)> =
        ctx.engines.containers_of(&pool.name).into_iter().map(|(e, c)| (e.name.clone(), c)).collect();
    let records = db::machines::list_for_pool(ctx.db.background(), &pool.name).await?;
    let obs = observe::observe(&pool.name, &containers, &records, &engines, &pool.spec, &ctx.timing, now);
    Ok(Look { obs, engines, records })
}

/// Observes a pool and plans a pass without changing anything: the dry run.
pub async fn dry_run(ctx: &Context, pool: &Pool) -> Result<(Plan, Counts), ReconcileError> {
    let look = look(ctx, pool, ctx.clock.now()).await?;
    let observed = look.obs.observed();
    let desired = desired_of(pool, &observed, &look.engines, &ctx.timing);
    let refused = host_refusal(ctx, pool).is_some();
    Ok((plan_pass(ctx, &observed, &desired, refused), counts(&observed)))
}

/// What a pass would do, less:
/// - the starts already under way: a new machine's container looks
///   created, not broken, until its start (which runs in the background,
///   see `starter`) is done;
/// - every new machine, when the settings no longer allow what the spec
///   asks for (see [`host_refusal`]).
fn plan_pass(ctx: &Context, observed: &[Observed], desired: &Desired, host_refused: bool) -> Plan {
    let mut plan = plan::plan(observed, desired);
    plan.repair.retain(|r| !(r.action == plan::RepairAction::Start && ctx.starter.in_flight(&r.container_id)));
    if host_refused {
        plan.without_new_machines(observed, desired.replicas);
    }
    plan
}

/// Why the settings refuse the pool's spec, if they do. A spec is checked
/// against them when it is written; they may have been tightened since (a
/// restart with fewer `--allowed-images` or `--allowed-mount-paths`). Such a
/// pool keeps the machines it has and creates no new one, not even to
/// replace a machine, until its spec or the settings change.
fn host_refusal(ctx: &Context, pool: &Pool) -> Option<status::Blocked> {
    let refused = ctx.limits.host.refusal(&pool.spec)?;
    Some(status::Blocked {
        reason: "HostPolicyRefused",
        message: format!(
            "this server's settings no longer allow the spec, so no machine is created or replaced: {refused}"
        ),
    })
}

/// The pool's counts as its engines report them now, for views that must
/// not lag behind a pass (the rollout view right after a change).
pub async fn live_counts(ctx: &Context, pool: &Pool) -> Result<Counts, ReconcileError> {
    let look = look(ctx, pool, ctx.clock.now()).await?;
    Ok(counts(&look.obs.observed()))
}

/// One pass over one pool. The worker guarantees no two passes of the same
/// pool run at once.
#[tracing::instrument(skip(ctx), fields(pool = %name))]
pub async fn reconcile_once(ctx: &Context, name: &str) -> Result<Outcome, ReconcileError> {
    let Some(pool) = ctx.db.pool_for_worker(name).await? else {
        return Ok(Outcome::Gone);
    };
    let now = ctx.clock.now();
    let mut seen = look(ctx, &pool, now).await?;
    records::sync(ctx, name, &seen.obs, &seen.records, now).await?;
    if pool.deleting && seen.obs.machines.is_empty() {
        return purge(ctx, name).await;
    }
    let observed = seen.obs.observed();
    let desired = desired_of(&pool, &observed, &seen.engines, &ctx.timing);
    let refused = host_refusal(ctx, &pool);
    let plan = plan_pass(ctx, &observed, &desired, refused.is_some());
    let acted = !(plan.delete.is_empty() && plan.repair.is_empty() && plan.create.is_empty());
    // Records as the executor will find them: synced just now.
    let synced: Vec<db::machines::Machine> = seen.obs.machines.iter().map(|s| s.record.clone()).collect();
    let executed = execute::execute(ctx, &pool, &plan, &synced).await;

    if acted {
        let now = ctx.clock.now();
        let fresh = look(ctx, &pool, now).await?;
        records::sync(ctx, name, &fresh.obs, &fresh.records, now).await?;
        seen = fresh;
    }
    executed?;
    let observed = seen.obs.observed();
    let counts = counts(&observed);
    let awaiting_approval = plan.is_empty() && desired.max_updated.is_some_and(|allowed| counts.updated >= allowed);
    let blocked = match refused {
        Some(refused) => Some(refused),
        None => cluster_problem(ctx, &pool).await?,
    };
    let status =
        status::status_after_pass(ctx, &pool, &observed, &seen.engines, awaiting_approval, blocked, now).await?;
    let held = pool.spec.paused || awaiting_approval;
    status::write_if_changed(ctx, &pool, status, held, ctx.clock.now()).await?;

    let until_change = seen.obs.next_change.map(|t| (t - ctx.clock.now()).to_std().unwrap_or(Duration::ZERO));
    Ok(match (plan.is_empty(), until_change) {
        (false, Some(d)) => Outcome::Requeue(d.min(RECHECK)),
        (false, None) => Outcome::Requeue(RECHECK),
        // The clock will change what the pass sees (a small margin so that
        // the next pass is past the moment, not just before it).
        (true, Some(d)) => Outcome::Requeue(d + Duration::from_millis(20)),
        (true, None) => Outcome::Idle,
    })
}

/// Why the pool's cluster could not be used, if it could not: the pool says
/// so on every pass, not only when a drain needs the cluster.
async fn cluster_problem(ctx: &Context, pool: &Pool) -> Result<Option<status::Blocked>, ReconcileError> {
    let Some(cluster) = pool.spec.cluster.as_deref() else { return Ok(None) };
    let problem = match db::clusters::credentials(ctx.db.background(), cluster).await? {
        None => format!("cluster {cluster:?} is not registered"),
        Some(Err(e)) => format!("the credentials of cluster {cluster:?} cannot be used: {e}"),
        Some(Ok(credentials)) => match credentials.config(ctx.nodes.retry.call_timeout).await {
            Ok(_) => return Ok(None),
            Err(e) => format!("the credentials of cluster {cluster:?} cannot be used: {e}"),
        },
    };
    Ok(Some(status::Blocked { reason: "ClusterCredentialsInvalid", message: problem }))
}

/// The deleting pool has no machines left: drop its rows.
async fn purge(ctx: &Context, name: &str) -> Result<Outcome, ReconcileError> {
    let mut tx = ctx.db.begin_background().await?;
    db::events::purge(&mut tx, SubjectKind::Pool, name).await?;
    db::pools::remove(&mut tx, name).await?;
    tx.commit().await?;
    tracing::info!(pool = name, "pool deleted");
    Ok(Outcome::Gone)
}
