//! Applying a plan. Deletions are recorded first (intent and event, one
//! transaction) and handed to the background terminator; repairs and
//! creations run inline, each engine within its own parallelism limit, and
//! are recorded with their events in one transaction at the end. The start
//! of a new container is handed to the background starter.

use crate::domain::object::PoolRef;
use std::collections::HashMap;

use chrono::Utc;
use futures_util::future::join_all;

use super::context::{Context, ReconcileError, count_call};
use super::plan::{Creation, Plan, Repair, RepairAction};
use super::terminate::deleting_event;
use crate::db::{self, machines::Machine, pools::Pool};
use crate::domain::event::{EventType, NewEvent};
use crate::domain::machine::MachinePhase;
use crate::engines::Engine;
use crate::engines::breaker::Scope;
use crate::runtime::{Container, ContainerState, CreateContainer, RuntimeError, Wake, labels};

/// Applies a plan; answers the first error of the container operations.
pub(super) async fn execute(
    ctx: &Context,
    pool: &Pool,
    plan: &Plan,
    records: &[Machine],
) -> Result<(), ReconcileError> {
    let now = ctx.clock.now();
    if !plan.delete.is_empty() {
        let mut tx = ctx.begin().await?;
        for d in &plan.delete {
            db::machines::begin_termination(&mut tx, &pool.id, &d.machine, reason_text(d.reason), now).await?;
            db::events::record(&mut tx, &deleting_event(&pool.id, d), now).await?;
        }
        tx.commit().await?;
    }
    for d in plan.finish.iter().chain(&plan.delete) {
        super::terminate::hand_over(ctx, pool, d);
    }

    let by_name: HashMap<&str, &Machine> = records.iter().map(|r| (r.name.as_str(), r)).collect();
    let repairs = join_all(plan.repair.iter().map(|r| repair(ctx, r))).await;
    let creations = join_all(plan.create.iter().map(|c| create(ctx, pool, c))).await;

    let mut errors = Vec::new();
    let mut tx = None;
    for (r, outcome) in plan.repair.iter().zip(repairs) {
        let Err(e) = outcome else {
            let tx = match &mut tx {
                Some(tx) => tx,
                None => tx.insert(ctx.begin().await?),
            };
            let failed = r.action == RepairAction::Restart;
            db::machines::record_restart(tx, &pool.id, &r.machine, failed, now).await?;
            let next = ctx.timing.restart.delay(r.failed_restarts + 1);
            let ev = repair_event(&pool.id, r, by_name.get(r.machine.as_str()).copied(), next);
            db::events::record(tx, &ev, now).await?;
            continue;
        };
        errors.push(e);
    }
    for outcome in creations {
        match outcome {
            Ok((container, engine, ev)) => {
                let tx = match &mut tx {
                    Some(tx) => tx,
                    None => tx.insert(ctx.begin().await?),
                };
                db::machines::write_observed(tx, &created_record(&pool.id, &engine, &container, now)).await?;
                db::events::record(tx, &ev, now).await?;
            }
            Err(e) => errors.push(e),
        }
    }
    if let Some(tx) = tx {
        tx.commit().await?;
    }
    let total = plan.repair.len() + plan.create.len();
    let failed = errors.len();
    // A lost lease stops the pass, whatever else failed.
    if let Some(i) = errors.iter().position(|e| matches!(e, ReconcileError::Lost(_))) {
        return Err(errors.swap_remove(i));
    }
    match errors.into_iter().next() {
        None => Ok(()),
        Some(first) if total == 1 => Err(first),
        Some(first) => Err(ReconcileError::Partial { failed, total, first: Box::new(first) }),
    }
}

fn reason_text(reason: super::plan::DeleteReason) -> &'static str {
    match reason {
        super::plan::DeleteReason::Outdated => "outdated",
        super::plan::DeleteReason::DeleteRequested => "delete_requested",
        super::plan::DeleteReason::Excess => "excess",
        super::plan::DeleteReason::PoolDeleting => "pool_deleting",
        super::plan::DeleteReason::Unready => "unready",
        super::plan::DeleteReason::Broken => "broken",
    }
}

fn repair_event(pool: &PoolRef, r: &Repair, record: Option<&Machine>, next_wait: std::time::Duration) -> NewEvent {
    let what = match (r.action, record) {
        (RepairAction::Start, _) => format!("started {}, whose creation was interrupted", r.machine),
        (RepairAction::Unpause, _) => format!("unpaused {}, which was paused", r.machine),
        (RepairAction::Restart, Some(m)) if m.phase == MachinePhase::Exited => format!(
            "restarted {} in place: it {} (failed restarts so far: {}, next wait {} s)",
            r.machine,
            super::records::exit_story(m),
            r.failed_restarts,
            next_wait.as_secs()
        ),
        (RepairAction::Restart, _) => format!("restarted {} in place", r.machine),
    };
    let reason = match r.action {
        RepairAction::Start => "MachineStarted",
        RepairAction::Unpause => "MachineUnpaused",
        RepairAction::Restart => "MachineRestarted",
    };
    NewEvent::pool(pool, EventType::Normal, reason, what)
}

async fn repair(ctx: &Context, r: &Repair) -> Result<(), ReconcileError> {
    ctx.may_act()?;
    let engine = ctx
        .engines
        .get(&r.engine)
        .ok_or_else(|| RuntimeError::Unavailable(format!("engine {:?} is not registered", r.engine)))?;
    let (op, result) = match r.action {
        RepairAction::Start | RepairAction::Restart => ("start", engine.start(&r.container_id, &ctx.gate()).await),
        RepairAction::Unpause => ("unpause", engine.unpause(&r.container_id, &ctx.gate()).await),
    };
    let result = ctx.sent(result)?;
    count_call(ctx, &r.engine, op, &result);
    if r.action == RepairAction::Start {
        // The first start of a new machine, cut short earlier: placement.
        placed(ctx, &engine, Scope::Engine, &result).await;
    }
    result?;
    tracing::info!(machine = %r.machine, engine = %r.engine, action = ?r.action, "machine repaired");
    Ok(())
}

/// Starts a new container in the background (see [`super::starter`]) and
/// wakes the pool when the start has ended. A failed start is left to the
/// next pass, which finds the container created and starts it as a repair,
/// with the error on the pass if it fails again.
fn start_in_background(ctx: &Context, pool: &PoolRef, engine: &str, container_id: &str) {
    if !ctx.starter.claim(container_id) {
        return;
    }
    let (ctx, pool, engine_name, id) = (ctx.clone(), pool.to_owned(), engine.to_owned(), container_id.to_owned());
    let cancel = ctx.starter.cancelled();
    let starter = std::sync::Arc::clone(&ctx.starter);
    starter.spawn(async move {
        let gate = ctx.gate();
        let started = match ctx.engines.get(&engine_name) {
            None => None,
            Some(engine) => tokio::select! {
                // Shutting down: the next run starts the created container.
                _ = cancel.cancelled() => None,
                // Unsent when the lease was lost meanwhile: the new driver
                // starts it.
                r = engine.start(&id, &gate) => ctx.sent(r).ok(),
            },
        };
        ctx.starter.done(&id);
        if let Some(result) = &started {
            count_call(&ctx, &engine_name, "start", result);
            if let Some(engine) = ctx.engines.get(&engine_name) {
                placed(&ctx, &engine, Scope::Engine, result).await;
            }
            if let Err(e) = result {
                tracing::warn!(%pool, engine = %engine_name, container = %id, error = %e,
                    "starting a new machine failed; the next pass tries again");
            }
            let _ = ctx.wakes.send(Wake::Pool(pool));
        }
    });
}

/// A fresh machine name that no engine and no record holds. Names are
/// drawn from 36^6; by the birthday bound a collision is likely somewhere
/// once about 50,000 machines exist, and a name is the machine's key in the
/// store and its container's name on every engine, so it is checked, not
/// hoped for.
async fn unused_name(ctx: &Context) -> Result<String, ReconcileError> {
    let mut name = crate::domain::names::new_machine_name();
    for _ in 0..16 {
        let on_an_engine = ctx.engines.all().iter().any(|e| e.has_container_named(&name));
        if !on_an_engine && !db::machines::name_taken(ctx.db.background(), &name).await? {
            return Ok(name);
        }
        name = crate::domain::names::new_machine_name();
    }
    Err(RuntimeError::NameInUse(name).into())
}

async fn create(ctx: &Context, pool: &Pool, c: &Creation) -> Result<(Container, String, NewEvent), ReconcileError> {
    let engine = ctx
        .engines
        .get(&c.engine)
        .ok_or_else(|| RuntimeError::Unavailable(format!("engine {:?} is not registered", c.engine)))?;
    let name = unused_name(ctx).await?;
    let mut container_labels: HashMap<String, String> = pool.spec.labels().clone().into_iter().collect();
    container_labels.insert(labels::POOL.into(), pool.id.name.clone());
    container_labels.insert(labels::NAMESPACE.into(), pool.id.namespace.as_str().to_owned());
    container_labels.insert(labels::ENGINE.into(), c.engine.clone());
    container_labels.insert(labels::MANAGED_BY.into(), labels::MANAGED_BY_VALUE.into());
    if let Some(fd) = &c.failure_domain {
        container_labels.insert(labels::FAILURE_DOMAIN.into(), fd.clone());
    }
    let spec = CreateContainer {
        name: name.clone(),
        image: pool.spec.desired_image(),
        labels: container_labels,
        mounts: pool.spec.extra_mounts().to_vec(),
        stop_timeout_secs: ctx.stop_timeout_secs,
    };
    ctx.may_act()?;
    let created = ctx.sent(engine.create(&spec, &ctx.gate()).await)?;
    count_call(ctx, &c.engine, "create", &created);
    let scope = match &created {
        Err(RuntimeError::ImageMissing(image)) => Some(Scope::Image(image.clone())),
        // Our own name collision says nothing of the engine.
        Err(RuntimeError::NameInUse(_)) => None,
        Err(_) => Some(Scope::Engine),
        Ok(_) => Some(Scope::Image(spec.image.clone())),
    };
    if let Some(scope) = scope {
        placed(ctx, &engine, scope, &created).await;
    }
    let container = created?;
    if container.state != ContainerState::Created {
        // Created and started in one call (the simulated engine).
        placed(ctx, &engine, Scope::Engine, &Ok::<(), RuntimeError>(())).await;
    }
    // Each start goes as soon as its container exists, not after the
    // pass's last creation.
    if container.state == ContainerState::Created {
        start_in_background(ctx, &pool.id, &c.engine, &container.id);
    }
    let fd = c.failure_domain.as_deref().map(|f| format!(", failure domain {f}")).unwrap_or_default();
    let ev = NewEvent::pool(
        &pool.id,
        EventType::Normal,
        "MachineCreated",
        format!("created {name} ({}) on engine {}{fd}", spec.image, c.engine),
    );
    tracing::info!(machine = %name, engine = %c.engine, "machine created");
    Ok((container, c.engine.clone(), ev))
}

/// Feeds the outcome of a placement (a create, or the first start of a
/// new machine) to the engine's breaker, and tells the engine's events when
/// the breaker opens or closes.
async fn placed<T>(ctx: &Context, engine: &Engine, scope: Scope, result: &Result<T, RuntimeError>) {
    let now = ctx.clock.now();
    let what = match &scope {
        Scope::Engine => "new machines".to_owned(),
        Scope::Image(image) => format!("new machines of {image}"),
    };
    let ev = match result {
        Ok(_) => engine.placement_succeeded(&scope).then(|| {
            NewEvent::engine(&engine.name, EventType::Normal, "PlacementResumed", format!("{what} go here again"))
        }),
        Err(e) => engine.placement_failed(scope, e, now).map(|trip| {
            let message = format!(
                "{e}: no {what} go here before {} (failure {} in a row); the pools place them on other engines",
                trip.until.format("%H:%M:%S UTC"),
                trip.failures
            );
            NewEvent::engine(&engine.name, EventType::Warning, "PlacementBackedOff", message)
        }),
    };
    if let Some(ev) = ev {
        ctx.record(&ev).await;
    }
}

/// The record of a machine this pass created: creating or starting, until
/// a later pass sees it settle.
fn created_record(pool: &PoolRef, engine: &str, c: &Container, now: chrono::DateTime<Utc>) -> Machine {
    Machine {
        name: c.name.clone(),
        pool: pool.to_owned(),
        engine: engine.to_owned(),
        container_id: c.id.clone(),
        image: c.image.clone(),
        failure_domain: c.failure_domain().map(str::to_owned),
        phase: match c.state {
            ContainerState::Running => MachinePhase::Starting,
            ContainerState::Created => MachinePhase::Creating,
            _ => MachinePhase::Exited,
        },
        state: c.state,
        health: c.health,
        exit_code: c.exit_code,
        oom_killed: c.oom_killed,
        ready: false,
        delete_requested: false,
        ready_since: None,
        started_at: c.started_at,
        finished_at: c.finished_at,
        restarts: 0,
        failed_restarts: 0,
        last_restart_at: None,
        terminating_since: None,
        terminating_reason: None,
        created_at: c.created_at,
        updated_at: now,
    }
}
