//! Deciding one pass, as a pure function of what the pass found: the
//! pool's stored state, its machines and engines as observed, the settings
//! and the time go in; what to do (the plan), the status to write, the
//! events to tell, whether to roll back, and when to look again come out.
//! Nothing here reads or writes anything; `mod.rs` observes before and
//! performs after, so every rule here is tested with tables and random
//! worlds.
//!
//! A pass decides twice when it acts: its plan from what it saw first, its
//! status from what it sees after acting ([`after`]), so that the status
//! never lags behind the machines it just created or removed.
//!
//! Conditions:
//! - `Ready`: all `replicas` machines ready, available and up to date.
//! - `Progressing`: the rollout moves (or completed), or is stalled.
//! - `MachinesHealthy`: no machine is broken, stuck, unknown or failing to
//!   be deleted; otherwise the reason names the worst and the machines.
//! - `Reconciled`: the last pass applied its plan and the pool is not short
//!   of ready machines, and nothing keeps the pool from its work: not the
//!   settings (`HostPolicyRefused`), its cluster (`ClusterCredentialsInvalid`)
//!   or its engines (`NoEngineAvailable`, `WaitingForEngines`).
//! - `RuntimeAvailable`: the pool's engines answer.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::observe::{EngineView, Timing};
use super::plan::{self, Desired, Observed, Plan};
use super::terminator::Failure;
use crate::domain::event::{EventType, NewEvent};
use crate::domain::machine::MachinePhase;
use crate::domain::object::Namespace;
use crate::domain::pool::Pool;
use crate::domain::pool::SpecLimits;
use crate::domain::rollout::{self, Counts, RolloutProgress};
use crate::domain::status::{ConditionStatus, ConditionType, EngineReplicas, PoolStatus, Reason};

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
pub(crate) const RECHECK: Duration = Duration::from_secs(2);

/// The planner's view of the pool, given what the pass observed.
pub fn desired_of(pool: &Pool, observed: &[Observed], engines: &[EngineView], timing: &Timing) -> Desired {
    let bounds = pool.spec.strategy().resolve(pool.spec.replicas());
    let rolling = observed.iter().any(|m| !m.up_to_date && !m.lost);
    let max_updated = (pool.spec.strategy().batch_approval && rolling).then(|| {
        let approved = u32::try_from(pool.batches_approved.max(1)).unwrap_or(u32::MAX);
        approved.saturating_mul(bounds.batch_size()).min(pool.spec.replicas())
    });
    // Only engines that answer take new machines: one that does not holds
    // nothing drover does not know of from its records, which count. But
    // while an engine's first list is under way (a moment after it was
    // registered, or after drover started), new machines wait for it: it
    // may hold machines of the pool, and the pool should spread over it.
    let first_list = engines.iter().any(|e| e.allowed && e.first_list);
    let usable = if first_list {
        Vec::new()
    } else {
        engines.iter().filter(|e| e.placeable()).map(|e| e.name.clone()).collect()
    };
    Desired {
        replicas: pool.spec.replicas(),
        failure_domains: pool.spec.failure_domains().to_vec(),
        engines: usable,
        max_surge: bounds.max_surge,
        max_unavailable: bounds.max_unavailable,
        replacement: pool.spec.strategy().replacement,
        paused: pool.spec.paused(),
        deleting: pool.deleting,
        max_updated,
        max_failed_restarts: timing.restart.max_failed.max(1),
    }
}

/// What a pass found, and the rules it decides by.
pub struct Inputs<'a> {
    pub pool: &'a Pool,
    /// The pool's machines as observed.
    pub observed: &'a [Observed],
    /// The earliest moment what was observed changes by the clock alone.
    pub next_change: Option<DateTime<Utc>>,
    pub engines: &'a [EngineView],
    pub timing: &'a Timing,
    pub limits: &'a SpecLimits,
    /// Why the pool's cluster cannot be used, when it belongs to one and
    /// its credentials were found unusable.
    pub cluster_problem: Option<String>,
    /// Deletions that keep failing, by machine (they run in the background).
    pub failing: &'a dyn Fn(&str) -> Option<Failure>,
    pub now: DateTime<Utc>,
}

/// What a pass decided.
#[derive(Debug, Clone)]
pub struct Decision {
    pub plan: Plan,
    pub desired: Desired,
    pub status: PoolStatus,
    /// Told once, when what they tell starts.
    pub events: Vec<NewEvent>,
    /// The rollout just passed its progress deadline and the pool asks to
    /// be rolled back when that happens.
    pub rollback: bool,
    /// The rollout is held (paused, or waiting for a batch's approval): its
    /// progress clock restarts on every pass, so the status is written.
    pub held: bool,
    /// When to look again, events aside.
    pub next: Outcome,
}

/// Decides a pass from one observation.
pub fn decide(i: &Inputs<'_>) -> Decision {
    let desired = desired_of(i.pool, i.observed, i.engines, i.timing);
    let mut plan = plan::plan(i.observed, &desired);
    if host_refusal(i).is_some() {
        plan.without_new_machines(i.observed, desired.replicas);
    }
    after(i, plan, desired)
}

/// The status, events and next look after `plan` (decided earlier in the
/// pass) was carried out, from what the pass sees now.
pub fn after(i: &Inputs<'_>, plan: Plan, desired: Desired) -> Decision {
    let observed = i.observed;
    let counts = counts(observed);
    let awaiting_approval = plan.is_empty() && desired.max_updated.is_some_and(|allowed| counts.updated >= allowed);
    let blocked = host_refusal(i).or_else(|| unplaced(&plan, i.engines, &i.pool.id.namespace)).or_else(|| {
        i.cluster_problem.clone().map(|message| Blocked { reason: Reason::ClusterCredentialsInvalid, message })
    });
    let (status, events, rollback) = status(i, observed, &counts, awaiting_approval, blocked);
    let next = next_look(i, &plan);
    Decision { held: i.pool.spec.paused() || awaiting_approval, plan, desired, status, events, rollback, next }
}

/// The status of a pool just rolled back to `revision`: its rollout starts
/// again, as a return to an earlier revision.
pub fn rolled_back(
    mut status: PoolStatus,
    pool: &Pool,
    revision: i64,
    counts: &Counts,
    now: DateTime<Utc>,
) -> PoolStatus {
    let spec = &pool.spec;
    let mut progress =
        rollout::track(None, revision, counts, spec.replicas(), spec.progress_deadline_seconds(), false, now);
    progress.rolling_back = true;
    status.rollout = Some(progress);
    status
}

pub fn counts(observed: &[Observed]) -> Counts {
    let active: Vec<&Observed> = observed.iter().filter(|m| m.phase != MachinePhase::Terminating && !m.lost).collect();
    let n = |f: &dyn Fn(&Observed) -> bool| u32::try_from(active.iter().filter(|m| f(m)).count()).unwrap_or(u32::MAX);
    Counts {
        total: n(&|_| true),
        updated: n(&|m| m.up_to_date),
        ready: n(&|m| m.ready),
        available: n(&|m| m.available),
        updated_available: n(&|m| m.up_to_date && m.available),
        outdated: n(&|m| !m.up_to_date),
        terminating: u32::try_from(observed.iter().filter(|m| m.phase == MachinePhase::Terminating).count())
            .unwrap_or(u32::MAX),
    }
}

/// Why a pool cannot do its work, whatever its machines look like.
struct Blocked {
    reason: Reason,
    message: String,
}

/// Why the settings refuse the pool's spec, if they do. A spec is checked
/// against them when it is written; they may have been tightened since (a
/// restart with fewer `--allowed-images` or `--allowed-mount-paths`). Such a
/// pool keeps the machines it has and creates no new one, not even to
/// replace a machine, until its spec or the settings change.
fn host_refusal(i: &Inputs<'_>) -> Option<Blocked> {
    let refused = i.limits.host.refusal(&i.pool.spec)?;
    Some(Blocked {
        reason: Reason::HostPolicyRefused,
        message: format!(
            "this server's settings no longer allow the spec, so no machine is created or replaced: {refused}"
        ),
    })
}

/// Why the pool's new machines went nowhere, if some did: each engine it
/// may use, and why that engine takes none now.
fn unplaced(plan: &Plan, engines: &[EngineView], namespace: &Namespace) -> Option<Blocked> {
    if plan.unplaced == 0 {
        return None;
    }
    let listing: Vec<&str> = engines.iter().filter(|e| e.allowed && e.first_list).map(|e| e.name.as_str()).collect();
    if !listing.is_empty() {
        let message = format!(
            "{} new machine(s) wait for the first list of engine(s) {} (a few seconds at most)",
            plan.unplaced,
            listing.join(", ")
        );
        return Some(Blocked { reason: Reason::WaitingForEngines, message });
    }
    let why: Vec<String> = engines
        .iter()
        .filter(|e| e.allowed)
        .filter_map(|e| Some(format!("engine {}: {}", e.name, e.unplaceable.as_ref()?.message)))
        .collect();
    let fenced = !engines.iter().any(|e| e.allowed) && engines.iter().any(|e| e.fenced);
    let why = match (why.is_empty(), fenced) {
        (false, _) => why.join("; "),
        (true, true) => format!(
            "namespace {namespace} is fenced to engines whose labels match its engine_selector, and no engine the \
             pool's placement allows does"
        ),
        (true, false) => "the pool's placement allows no engine".to_owned(),
    };
    let message = format!("{} new machine(s) have no engine to go to: {why}", plan.unplaced);
    Some(Blocked { reason: Reason::NoEngineAvailable, message })
}

/// When the pass should look again, events aside: soon after acting; when
/// the clock changes what it sees (a machine settles, a backoff passes);
/// when a backed-off engine may be tried, if machines went unplaced
/// (engines that come back wake every pool themselves).
fn next_look(i: &Inputs<'_>, plan: &Plan) -> Outcome {
    let retry = i.engines.iter().filter(|e| e.allowed).filter_map(|e| e.unplaceable.as_ref()?.retry_at).min();
    let next_change = [i.next_change, retry.filter(|_| plan.unplaced > 0)].into_iter().flatten().min();
    let until_change = next_change.map(|t| (t - i.now).to_std().unwrap_or(Duration::ZERO));
    match (plan.is_empty(), until_change) {
        (false, Some(d)) => Outcome::Requeue(d.min(RECHECK)),
        (false, None) => Outcome::Requeue(RECHECK),
        // A small margin, so that the next pass is past the moment, not
        // just before it.
        (true, Some(d)) => Outcome::Requeue(d + Duration::from_millis(20)),
        (true, None) => Outcome::Idle,
    }
}

/// Machines (and ready ones) on each engine, of those that count.
fn per_engine(observed: &[Observed]) -> BTreeMap<String, EngineReplicas> {
    let mut out: BTreeMap<String, EngineReplicas> = BTreeMap::new();
    for m in observed.iter().filter(|m| m.phase != MachinePhase::Terminating && !m.lost) {
        let e = out.entry(m.engine.clone()).or_default();
        e.replicas += 1;
        e.ready_replicas += u32::from(m.ready);
    }
    out
}

/// What is wrong with the pool's machines, worst first: a reason and a
/// message naming (a few of) them.
fn machine_health(observed: &[Observed], failing: &dyn Fn(&str) -> Option<Failure>) -> Option<(Reason, String)> {
    let names = |f: &dyn Fn(&Observed) -> bool| -> Vec<&str> {
        observed.iter().filter(|m| f(m)).map(|m| m.name.as_str()).collect()
    };
    let list = |v: &[&str]| {
        let shown: Vec<&str> = v.iter().take(5).copied().collect();
        let more = if v.len() > 5 { format!(" and {} more", v.len() - 5) } else { String::new() };
        format!("{}{more}", shown.join(", "))
    };
    let deleting = names(&|m| m.phase == MachinePhase::Terminating && failing(&m.name).is_some());
    if let Some(first) = deleting.first().and_then(|n| failing(n)) {
        let reason = if first.drain { Reason::DrainFailed } else { Reason::MachineDeleteFailed };
        return Some((reason, format!("deleting {} keeps failing: {}", list(&deleting), first.message)));
    }
    type Check<'a> = (Reason, &'a dyn Fn(&Observed) -> bool, &'a str);
    let checks: [Check; 7] = [
        (Reason::EngineLost, &|m| m.lost, "on an engine given up for lost; replaced elsewhere"),
        (
            Reason::EngineUnreachable,
            &|m| m.phase == MachinePhase::Unknown && !m.lost,
            "on an engine that does not answer",
        ),
        (Reason::CrashLoopBackOff, &|m| !m.ready && m.failed_restarts >= 2, "keep failing after restarts in place"),
        (Reason::MachineRestarting, &|m| !m.ready && m.failed_restarts == 1, "restarted in place, not ready yet"),
        (
            Reason::MachineExited,
            &|m| m.phase == MachinePhase::Exited || m.phase == MachinePhase::Dead,
            "exited; restarting in place",
        ),
        (Reason::MachinePaused, &|m| m.phase == MachinePhase::Paused, "paused; unpausing"),
        (Reason::MachineUnready, &|m| m.stuck, "stayed unready past machine_ready_timeout_seconds; replacing"),
    ];
    checks.into_iter().find_map(|(reason, f, what)| {
        let hit = names(f);
        (!hit.is_empty()).then(|| (reason, format!("{}: {what}", list(&hit))))
    })
}

/// Counts, conditions and rollout progress; the events to tell; whether
/// the progress deadline has just passed with automatic rollback asked for.
fn status(
    i: &Inputs<'_>,
    observed: &[Observed],
    counts: &Counts,
    awaiting_approval: bool,
    blocked: Option<Blocked>,
) -> (PoolStatus, Vec<NewEvent>, bool) {
    let (pool, now) = (i.pool, i.now);
    let spec = &pool.spec;
    let mut events = Vec::new();
    let mut status = PoolStatus {
        observed_generation: pool.generation,
        replicas: counts.total,
        ready_replicas: counts.ready,
        updated_replicas: counts.updated,
        available_replicas: counts.available,
        terminating_replicas: counts.terminating,
        engines: per_engine(observed),
        conditions: pool.status.conditions.clone(),
        last_error: None,
        last_reconciled_at: pool.status.last_reconciled_at,
        rollout: None,
        // Who drives the pool is not the decision's: the pass sets it.
        driver: pool.status.driver.clone(),
    };
    let unhealthy = machine_health(observed, i.failing);

    // RuntimeAvailable: only the engines this pool uses or may use concern it.
    let concerns = |e: &EngineView| e.allowed || observed.iter().any(|m| m.engine == e.name);
    let silent: Vec<&str> = i.engines.iter().filter(|e| concerns(e)).filter_map(|e| e.error.as_deref()).collect();
    let was_available =
        pool.status.condition(ConditionType::RuntimeAvailable).is_none_or(|c| c.status == ConditionStatus::True);
    if silent.is_empty() {
        let ok = (ConditionStatus::True, Reason::RuntimeReachable, "the engines answer");
        status.set_condition(ConditionType::RuntimeAvailable, ok.0, ok.1, ok.2, now);
    } else {
        let message = silent.join("; ");
        let (f, r) = (ConditionStatus::False, Reason::RuntimeUnavailable);
        status.set_condition(ConditionType::RuntimeAvailable, f, r, message.clone(), now);
        status.last_error = Some(message.clone());
        // Told once when it starts, not on every pass while it lasts.
        if was_available {
            events.push(NewEvent::pool(&pool.id, EventType::Warning, "RuntimeUnavailable", message));
        }
    }

    let healthy = ConditionType::MachinesHealthy;
    match &unhealthy {
        Some((reason, message)) => status.set_condition(healthy, ConditionStatus::False, *reason, message.clone(), now),
        None => status.set_condition(healthy, ConditionStatus::True, Reason::AllHealthy, "no machine is broken", now),
    }

    let reconciled = ConditionType::Reconciled;
    let short = counts.ready < spec.replicas() && !pool.deleting;
    let deletions_failing =
        unhealthy.as_ref().is_some_and(|(r, _)| matches!(r, Reason::DrainFailed | Reason::MachineDeleteFailed));
    match &unhealthy {
        Some((reason, message)) if short || deletions_failing => {
            status.set_condition(reconciled, ConditionStatus::False, *reason, message.clone(), now);
            if deletions_failing {
                status.last_error = Some(message.clone());
            }
        }
        _ if short => status.set_condition(
            reconciled,
            ConditionStatus::False,
            Reason::WaitingForMachines,
            format!("{} of {} machines ready", counts.ready, spec.replicas()),
            now,
        ),
        _ => status.set_condition(
            reconciled,
            ConditionStatus::True,
            Reason::PassSucceeded,
            "the last pass applied its plan",
            now,
        ),
    }
    // Whatever else holds, a pool that cannot do its work is not reconciled.
    if let Some(Blocked { reason, message }) = blocked {
        status.set_condition(reconciled, ConditionStatus::False, reason, message.clone(), now);
        status.last_error = Some(message);
    }

    let (progress, stalled_now) = progress(i, counts, awaiting_approval, unhealthy.as_ref(), &mut events);
    let rollback = stalled_now && spec.strategy().auto_rollback;
    let image = spec.desired_image();
    let (progressing, reason, message) = if progress.deadline_exceeded {
        let why = unhealthy.as_ref().map(|(r, m)| format!(" ({r}: {m})")).unwrap_or_default();
        (
            ConditionStatus::False,
            Reason::ProgressDeadlineExceeded,
            format!("no progress for {} s{why}", spec.progress_deadline_seconds()),
        )
    } else if counts.complete(spec.replicas()) {
        (ConditionStatus::True, Reason::RolloutComplete, format!("revision {} runs on all machines", pool.revision))
    } else {
        (ConditionStatus::True, Reason::RolloutProgressing, format!("moving to revision {} ({image})", pool.revision))
    };
    status.set_condition(ConditionType::Progressing, progressing, reason, message, now);
    status.rollout = Some(progress);

    let (ready, reason, message) = ready(pool, counts, awaiting_approval, &image);
    status.set_condition(ConditionType::Ready, ready, reason, message, now);
    (status, events, rollback)
}

/// The rollout's progress, and whether its deadline has just passed (told
/// by an event, once).
fn progress(
    i: &Inputs<'_>,
    counts: &Counts,
    awaiting_approval: bool,
    unhealthy: Option<&(Reason, String)>,
    events: &mut Vec<NewEvent>,
) -> (RolloutProgress, bool) {
    let (pool, spec) = (i.pool, &i.pool.spec);
    let prev = pool.status.rollout.as_ref();
    let hold = spec.paused() || awaiting_approval;
    let progress =
        rollout::track(prev, pool.revision, counts, spec.replicas(), spec.progress_deadline_seconds(), hold, i.now);
    let stalled_now =
        progress.deadline_exceeded && !prev.is_some_and(|p| p.revision == pool.revision && p.deadline_exceeded);
    if stalled_now {
        let why = unhealthy.map(|(r, m)| format!("; {r}: {m}")).unwrap_or_default();
        let message = format!(
            "no progress for {} s: {} of {} machines updated and available, {} outdated{why}",
            spec.progress_deadline_seconds(),
            counts.updated_available,
            spec.replicas(),
            counts.outdated
        );
        events.push(NewEvent::pool(&pool.id, EventType::Warning, "ProgressDeadlineExceeded", message));
    }
    (progress, stalled_now)
}

fn ready(pool: &Pool, counts: &Counts, awaiting_approval: bool, image: &str) -> (ConditionStatus, Reason, String) {
    let want = pool.spec.replicas();
    if pool.deleting {
        (ConditionStatus::False, Reason::Deleting, format!("removing {} machines", counts.total + counts.terminating))
    } else if counts.complete(want) {
        (ConditionStatus::True, Reason::AllReady, format!("{want} of {want} machines ready and up to date"))
    } else if pool.spec.paused() {
        (ConditionStatus::False, Reason::Paused, "the pool is paused".to_owned())
    } else if awaiting_approval {
        let message = "the rollout waits for POST .../rollout/continue".to_owned();
        (ConditionStatus::False, Reason::BatchAwaitingApproval, message)
    } else if counts.outdated > 0 {
        let message = format!("{} of {} machines run {image}", counts.updated, counts.total);
        (ConditionStatus::False, Reason::RollingUpdate, message)
    } else if counts.total > want {
        (ConditionStatus::False, Reason::ScalingDown, format!("{} machines, want {want}", counts.total))
    } else {
        (ConditionStatus::False, Reason::ScalingUp, format!("{} of {want} machines available", counts.available))
    }
}

#[cfg(test)]
mod tests;
