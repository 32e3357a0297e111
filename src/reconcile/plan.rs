//! Planning: what one reconcile pass should do, as a pure function of what
//! it observed and what the pool asks for. No IO happens here, so every
//! rule is tested with tables and random worlds.
//!
//! The rules are the MachinePool seed's, generalised by a rolling-update
//! strategy (the seed is `max_surge = 100%`, `max_unavailable = 0`):
//!
//! 1. Create `replicas - up-to-date` machines, never more than fit under
//!    `replicas + max_surge` in all. Creation never deletes.
//! 2. Delete outdated machines first (those with a delete request first),
//!    then up-to-date ready ones with a delete request, then other
//!    up-to-date ready ones; newest first among those.
//! 3. Never let a deletion leave fewer ready machines than
//!    `replicas - max_unavailable`, and never delete an up-to-date machine
//!    unless there are more ready machines than `replicas`.
//! 4. Up-to-date machines that are not ready are never scale-down
//!    candidates. Outdated ones that are not ready go first: removing them
//!    costs no availability.
//!
//! Beyond the seed: a machine counts as *available* only once it has been
//! ready for `min_ready_seconds`; machines stuck unready past a deadline are
//! replaced, a few at a time; and with batch approval a rollout converts at
//! most `max_updated` machines before it waits for a person.

use std::cmp::Reverse;

use serde::Serialize;
use utoipa::ToSchema;

/// One machine as the pass observed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    pub name: String,
    pub container_id: String,
    /// Its container runs the pool's desired image.
    pub up_to_date: bool,
    pub ready: bool,
    /// Ready for at least `min_ready_seconds`; implies `ready`.
    pub available: bool,
    /// Up to date, not ready, and older than the machine ready timeout.
    pub stuck: bool,
    pub delete_requested: bool,
    /// Created but never started: a create that was interrupted (drover
    /// stopped between the engine's create and start calls).
    pub never_started: bool,
    pub failure_domain: Option<String>,
    /// Creation time in seconds; orders candidates of equal rank.
    pub created_at: i64,
}

/// What the pool asks for, with the strategy resolved against `replicas`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    pub replicas: u32,
    pub failure_domains: Vec<String>,
    pub max_surge: u32,
    pub max_unavailable: u32,
    pub paused: bool,
    pub deleting: bool,
    /// While a rollout waits for batch approval: the most up-to-date
    /// machines allowed now. `None`: no limit.
    pub max_updated: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeleteReason {
    /// Runs an image other than the desired one.
    Outdated,
    /// Marked for deletion by a user or an autoscaler.
    DeleteRequested,
    /// More ready machines than `replicas`.
    Excess,
    /// The pool itself is being deleted.
    PoolDeleting,
    /// Stayed unready past the machine ready timeout; it is replaced.
    Unready,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Deletion {
    pub machine: String,
    #[serde(skip)]
    pub container_id: String,
    pub reason: DeleteReason,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Creation {
    /// Failure domain the new machine goes to, when the pool has any.
    pub failure_domain: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Start {
    pub machine: String,
    #[serde(skip)]
    pub container_id: String,
}

/// Deletions run before creations, so that the machine count never
/// overshoots the surge bound while a pass is half applied.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, ToSchema)]
pub struct Plan {
    pub delete: Vec<Deletion>,
    /// Up-to-date containers whose creation was interrupted before start.
    pub start: Vec<Start>,
    pub create: Vec<Creation>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.delete.is_empty() && self.create.is_empty() && self.start.is_empty()
    }
}

/// Decides one pass. Running it on a converged world yields an empty plan.
pub fn plan(machines: &[Observed], desired: &Desired) -> Plan {
    if desired.deleting {
        let delete = machines
            .iter()
            .map(|m| Deletion {
                machine: m.name.clone(),
                container_id: m.container_id.clone(),
                reason: DeleteReason::PoolDeleting,
            })
            .collect();
        return Plan { delete, ..Plan::default() };
    }
    if desired.paused {
        return Plan::default();
    }

    let replicas = desired.replicas as usize;
    let floor = desired.replicas.saturating_sub(desired.max_unavailable) as usize;
    let mut ready = machines.iter().filter(|m| m.ready).count();
    let mut available = machines.iter().filter(|m| m.available).count();
    let mut delete = Vec::new();
    let mut deleted = vec![false; machines.len()];
    let mut remove = |i: usize, reason: DeleteReason, deleted: &mut Vec<bool>| {
        let m = &machines[i];
        deleted[i] = true;
        delete.push(Deletion { machine: m.name.clone(), container_id: m.container_id.clone(), reason });
    };
    // Removing a ready `m` must keep both floors: ready machines, and
    // available ones. A ready machine that is not yet available still goes
    // only when enough others have proven themselves (Deployments count new
    // unavailable pods against the scale-down budget the same way).
    let affordable = |m: &Observed, ready: usize, available: usize| {
        !m.ready || (ready > floor && available - usize::from(m.available) >= floor)
    };

    // Outdated: not-ready first (free), then delete-requested, then oldest.
    // Under batch approval, enough of them stay to fill the pool beside the
    // up-to-date machines the approved batches allow.
    let mut outdated: Vec<usize> = (0..machines.len()).filter(|&i| !machines[i].up_to_date).collect();
    outdated.sort_by_key(|&i| {
        let m = &machines[i];
        (m.ready, !m.delete_requested, m.created_at, m.name.clone())
    });
    let keep_outdated = desired.max_updated.map_or(0, |allowed| replicas.saturating_sub(allowed as usize));
    let mut outdated_left = outdated.len();
    for i in outdated {
        let m = &machines[i];
        if outdated_left <= keep_outdated && m.ready {
            break;
        }
        if !affordable(m, ready, available) {
            continue;
        }
        ready -= usize::from(m.ready);
        available -= usize::from(m.available);
        outdated_left -= 1;
        remove(
            i,
            if m.delete_requested { DeleteReason::DeleteRequested } else { DeleteReason::Outdated },
            &mut deleted,
        );
    }

    // Remediation: stuck machines are replaced, never more at once than
    // unavailability allows (one at a time when it is zero), counting
    // replacements still starting.
    let starting =
        (0..machines.len()).filter(|&i| machines[i].up_to_date && !machines[i].ready && !machines[i].stuck).count();
    let mut budget = (desired.max_unavailable.max(1) as usize).saturating_sub(starting);
    let mut stuck: Vec<usize> = (0..machines.len()).filter(|&i| machines[i].stuck && !deleted[i]).collect();
    stuck.sort_by_key(|&i| (machines[i].created_at, machines[i].name.clone()));
    for i in stuck {
        if budget == 0 {
            break;
        }
        budget -= 1;
        remove(i, DeleteReason::Unready, &mut deleted);
    }

    // Up-to-date and ready: only true excess, delete requests first, then
    // newest; and only once no ready outdated machine is left, since those
    // go first (they may have stayed for availability).
    let outdated_ready_left = (0..machines.len()).any(|i| !deleted[i] && !machines[i].up_to_date && machines[i].ready);
    let mut current: Vec<usize> =
        (0..machines.len()).filter(|&i| machines[i].up_to_date && machines[i].ready).collect();
    current.sort_by_key(|&i| {
        let m = &machines[i];
        (!m.delete_requested, Reverse(m.created_at), m.name.clone())
    });
    for i in current {
        if ready <= replicas || outdated_ready_left {
            break;
        }
        let m = &machines[i];
        if !affordable(m, ready, available) {
            // Wait for availability rather than pass over a machine someone
            // asked to remove first.
            break;
        }
        ready -= 1;
        available -= usize::from(m.available);
        remove(i, if m.delete_requested { DeleteReason::DeleteRequested } else { DeleteReason::Excess }, &mut deleted);
    }

    let remaining = || machines.iter().zip(&deleted).filter(|(_, d)| !**d).map(|(m, _)| m);
    let total_after = remaining().count();
    let up_to_date_after = remaining().filter(|m| m.up_to_date).count();
    let want = replicas.saturating_sub(up_to_date_after);
    let room = (replicas + desired.max_surge as usize).saturating_sub(total_after);
    let approved = desired.max_updated.map_or(usize::MAX, |a| (a as usize).saturating_sub(up_to_date_after));
    let count = want.min(room).min(approved);

    let start = remaining()
        .filter(|m| m.up_to_date && m.never_started)
        .map(|m| Start { machine: m.name.clone(), container_id: m.container_id.clone() })
        .collect();
    let domains = spread(&desired.failure_domains, remaining().filter(|m| m.up_to_date), count);
    let create = domains.into_iter().map(|failure_domain| Creation { failure_domain }).collect();
    Plan { delete, start, create }
}

/// Picks a failure domain for each of `count` new machines: always the
/// domain with the fewest machines so far, ties broken by list order.
fn spread<'a>(domains: &[String], existing: impl Iterator<Item = &'a Observed>, count: usize) -> Vec<Option<String>> {
    if domains.is_empty() {
        return vec![None; count];
    }
    let mut load = vec![0usize; domains.len()];
    for m in existing {
        if let Some(i) = m.failure_domain.as_ref().and_then(|fd| domains.iter().position(|d| d == fd)) {
            load[i] += 1;
        }
    }
    (0..count)
        .map(|_| {
            let (i, _) = load.iter().enumerate().min_by_key(|(i, n)| (**n, *i)).unwrap_or((0, &0));
            load[i] += 1;
            Some(domains[i].clone())
        })
        .collect()
}

#[cfg(test)]
mod tests;
