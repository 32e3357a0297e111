//! Planning: what one reconcile pass should do, as a pure function of what
//! it observed and what the pool asks for. No IO happens here, so every
//! rule is tested with tables and random worlds.
//!
//! The rules are those of Cluster API's Docker MachinePool controller,
//! generalised by a rolling-update strategy (its behaviour is
//! `max_surge = 100%`, `max_unavailable = 0`; docs/machines.md):
//!
//! 1. Create `replicas - up-to-date` machines, never more than fit under
//!    `replicas + max_surge` in all. Creation never deletes.
//! 2. Delete outdated machines first (those with a delete request first),
//!    then up-to-date ones beyond `replicas`: not-ready ones first (they
//!    cost no availability), then ready ones with a delete request, then
//!    ready ones on the fullest engine and failure domain, newest first.
//! 3. Never let a deletion leave fewer ready machines than
//!    `replicas - max_unavailable`, and never delete an up-to-date machine
//!    while up-to-date machines do not exceed `replicas`.
//!
//! Beyond those rules:
//! - *Broken* machines (exited, paused, dead) are repaired: restarted in
//!   place or unpaused once their backoff has passed; replaced after too
//!   many failed restarts, or at once when dead. A never-started container
//!   (a creation interrupted) is started.
//! - *Terminating* machines (a deletion was recorded) are always finished
//!   off and count toward nothing but, under `termination_complete`, the
//!   surge bound.
//! - Machines on an engine that cannot be reached are *unknown*: nothing is
//!   done to them, and they still count, until the engine is given up for
//!   *lost*; then they count toward nothing and are replaced elsewhere. If
//!   the engine comes back, the surplus goes by rule 2, fullest engine first.
//! - New machines go only to engines that answer and whose placement is not
//!   backed off (see `domain::placement`); spreading over engines is a
//!   preference for where new machines go, never a reason to delete one.
//!   A container created but never started on a backed-off engine is
//!   replaced elsewhere. What no engine can take is counted as `unplaced`.
//! - A machine counts as *available* only once it has been ready for
//!   `min_ready_seconds`; machines running but unready past the ready
//!   timeout are replaced a few at a time; with batch approval a rollout
//!   converts at most `max_updated` machines before it waits for a person.

use std::cmp::Reverse;
use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::domain::machine::MachinePhase;
use crate::domain::strategy::ReplacementPolicy;

/// One machine as the pass observed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    pub name: String,
    pub container_id: String,
    /// The engine it runs on.
    pub engine: String,
    pub phase: MachinePhase,
    /// Its container runs the pool's desired image.
    pub up_to_date: bool,
    /// Running, settled, and healthy where the image has a health check.
    pub ready: bool,
    /// Ready for at least `min_ready_seconds`; implies `ready`.
    pub available: bool,
    /// Running and up to date, but not ready past the machine ready timeout.
    pub stuck: bool,
    pub delete_requested: bool,
    /// drover recorded its deletion (it is terminating by drover's hand, as
    /// opposed to being removed by someone else): the deletion is finished.
    pub deleting: bool,
    /// Its engine has been unreachable past the lost timeout.
    pub lost: bool,
    /// Broken, and its restart backoff has passed.
    pub repair_due: bool,
    /// Restarts in place that did not bring it back to ready.
    pub failed_restarts: u32,
    pub failure_domain: Option<String>,
    /// Creation time in seconds; orders candidates of equal rank.
    pub created_at: i64,
    /// Its engine's placement breaker is open (creates or starts there
    /// fail): a container never started there is replaced elsewhere.
    pub engine_failing: bool,
    /// Its first start runs in the background now: it is neither broken
    /// nor due a start.
    pub start_in_flight: bool,
}

impl Observed {
    /// A machine on engine `e0`, running (ready) or starting (not ready).
    #[cfg(test)]
    pub(crate) fn for_test(name: &str, up_to_date: bool, ready: bool) -> Observed {
        Observed {
            name: name.into(),
            container_id: format!("id-{name}"),
            engine: "e0".into(),
            phase: if ready { MachinePhase::Running } else { MachinePhase::Starting },
            up_to_date,
            ready,
            available: ready,
            stuck: false,
            delete_requested: false,
            deleting: false,
            lost: false,
            repair_due: false,
            failed_restarts: 0,
            failure_domain: None,
            created_at: 0,
            engine_failing: false,
            start_in_flight: false,
        }
    }

    fn terminating(&self) -> bool {
        self.phase == MachinePhase::Terminating
    }

    /// On an unreachable engine: nothing can be done to it.
    fn unknown(&self) -> bool {
        self.phase == MachinePhase::Unknown
    }

    /// Counts toward the pool: neither being deleted nor given up for lost.
    fn active(&self) -> bool {
        !self.terminating() && !self.lost
    }
}

/// What the pool asks for, with the strategy resolved against `replicas`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    pub replicas: u32,
    pub failure_domains: Vec<String>,
    /// Engines new machines may go to: the pool's engines that answer and
    /// whose placement is not backed off.
    pub engines: Vec<String>,
    pub max_surge: u32,
    pub max_unavailable: u32,
    pub replacement: ReplacementPolicy,
    pub paused: bool,
    pub deleting: bool,
    /// While a rollout waits for batch approval: the most up-to-date
    /// machines allowed now. `None`: no limit.
    pub max_updated: Option<u32>,
    /// Failed restarts after which a broken machine is replaced.
    pub max_failed_restarts: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeleteReason {
    /// Runs an image other than the desired one.
    Outdated,
    /// Marked for deletion by a user or an autoscaler.
    DeleteRequested,
    /// More machines than `replicas`.
    Excess,
    /// The pool itself is being deleted.
    PoolDeleting,
    /// Ran but stayed unready past the machine ready timeout; it is replaced.
    Unready,
    /// Kept failing after restarts in place, or dead; it is replaced.
    Broken,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Deletion {
    pub machine: String,
    #[serde(skip)]
    pub container_id: String,
    pub engine: String,
    pub reason: DeleteReason,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RepairAction {
    /// Start a container whose creation was interrupted before its start.
    Start,
    /// Start an exited container again: a restart in place.
    Restart,
    Unpause,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Repair {
    pub machine: String,
    #[serde(skip)]
    pub container_id: String,
    pub engine: String,
    pub action: RepairAction,
    /// Restarts in place that did not help so far.
    pub failed_restarts: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Creation {
    /// Engine the new machine goes to.
    pub engine: String,
    /// Failure domain the new machine goes to, when the pool has any.
    pub failure_domain: Option<String>,
}

/// What one pass does. Deletions are recorded before creations run, so that
/// the machine count never overshoots the surge bound while a pass is half
/// applied; the stops themselves run in the background.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Plan {
    /// Machines already terminating: their deletion is (re)started if it is
    /// not in flight.
    pub finish: Vec<Deletion>,
    pub delete: Vec<Deletion>,
    pub repair: Vec<Repair>,
    pub create: Vec<Creation>,
    /// New machines the pool needs now that no engine can take: every
    /// engine it may use is unreachable, draining or backed off.
    pub unplaced: u32,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.finish.is_empty() && self.delete.is_empty() && self.create.is_empty() && self.repair.is_empty()
    }

    /// Keeps only what needs no new machine: no creation, no first start
    /// of a container created but never started (a shutdown cut its start
    /// short: it would be a new process all the same), and a machine that
    /// a new one was to replace (outdated, unready, broken) goes only while
    /// more than `replicas` of the pool's active `machines` are left.
    /// Deletions asked for and the pool's own deletion go on, and so do
    /// restarts of machines that ran.
    pub fn without_new_machines(&mut self, machines: &[Observed], replicas: u32) {
        self.create.clear();
        self.unplaced = 0;
        self.repair.retain(|r| r.action != RepairAction::Start);
        let active = machines.iter().filter(|m| m.active()).count();
        let replaced =
            |d: &Deletion| matches!(d.reason, DeleteReason::Outdated | DeleteReason::Unready | DeleteReason::Broken);
        let others = self.delete.iter().filter(|d| !replaced(d)).count();
        let mut spare = active.saturating_sub(replicas as usize).saturating_sub(others);
        self.delete.retain(|d| {
            if !replaced(d) {
                return true;
            }
            let keep = spare > 0;
            spare = spare.saturating_sub(1);
            keep
        });
    }
}

fn deletion(m: &Observed, reason: DeleteReason) -> Deletion {
    Deletion { machine: m.name.clone(), container_id: m.container_id.clone(), engine: m.engine.clone(), reason }
}

/// Decides one pass. Running it on a converged world yields an empty plan.
pub fn plan(machines: &[Observed], desired: &Desired) -> Plan {
    let mut p = Plan {
        finish: machines.iter().filter(|m| m.deleting).map(|m| deletion(m, DeleteReason::Excess)).collect(),
        ..Plan::default()
    };
    if desired.deleting {
        p.delete = machines
            .iter()
            .filter(|m| !m.terminating() && !m.unknown())
            .map(|m| deletion(m, DeleteReason::PoolDeleting))
            .collect();
        return p;
    }
    if desired.paused {
        return p;
    }
    let mut s = Selection::new(machines, desired);
    s.outdated();
    s.excess();
    s.broken();
    s.stuck();
    let (create, unplaced) = s.creations();
    (p.create, p.unplaced) = (create, unplaced);
    p.delete = s.delete;
    p.repair = s.repair;
    p
}

/// The working state of one plan: what is chosen so far, and the ready and
/// available counts that every ready deletion must keep above the floor.
struct Selection<'a> {
    machines: &'a [Observed],
    desired: &'a Desired,
    floor: usize,
    ready: usize,
    available: usize,
    deleted: Vec<bool>,
    delete: Vec<Deletion>,
    repair: Vec<Repair>,
}

impl<'a> Selection<'a> {
    fn new(machines: &'a [Observed], desired: &'a Desired) -> Self {
        let active = || machines.iter().filter(|m| m.active());
        Self {
            machines,
            desired,
            floor: desired.replicas.saturating_sub(desired.max_unavailable) as usize,
            ready: active().filter(|m| m.ready).count(),
            available: active().filter(|m| m.available).count(),
            deleted: vec![false; machines.len()],
            delete: Vec::new(),
            repair: Vec::new(),
        }
    }

    /// Indices of machines still in play: active, known, not chosen yet.
    fn open(&self, keep: impl Fn(&Observed) -> bool) -> Vec<usize> {
        (0..self.machines.len())
            .filter(|&i| !self.deleted[i] && self.machines[i].active() && !self.machines[i].unknown())
            .filter(|&i| keep(&self.machines[i]))
            .collect()
    }

    /// Removing a ready machine must keep both floors: ready machines, and
    /// available ones. A ready machine that is not yet available still goes
    /// only when enough others have proven themselves (Deployments count
    /// new unavailable pods against the scale-down budget the same way).
    fn affordable(&self, m: &Observed) -> bool {
        !m.ready || (self.ready > self.floor && self.available - usize::from(m.available) >= self.floor)
    }

    fn remove(&mut self, i: usize, reason: DeleteReason) {
        let m = &self.machines[i];
        self.deleted[i] = true;
        self.ready -= usize::from(m.ready);
        self.available -= usize::from(m.available);
        self.delete.push(deletion(m, reason));
    }

    fn requested_or(m: &Observed, reason: DeleteReason) -> DeleteReason {
        if m.delete_requested { DeleteReason::DeleteRequested } else { reason }
    }

    /// Outdated: not-ready first (free), then delete-requested, then oldest.
    /// Under batch approval, enough of them stay to fill the pool beside the
    /// up-to-date machines the approved batches allow.
    fn outdated(&mut self) {
        let mut outdated = self.open(|m| !m.up_to_date);
        outdated.sort_by_key(|&i| {
            let m = &self.machines[i];
            (m.ready, !m.delete_requested, m.created_at, m.name.clone())
        });
        let replicas = self.desired.replicas as usize;
        let keep = self.desired.max_updated.map_or(0, |allowed| replicas.saturating_sub(allowed as usize));
        let mut left = outdated.len();
        for i in outdated {
            let m = &self.machines[i];
            if left <= keep && m.ready {
                break;
            }
            if !self.affordable(m) {
                continue;
            }
            left -= 1;
            self.remove(i, Self::requested_or(m, DeleteReason::Outdated));
        }
    }

    /// Up-to-date machines beyond `replicas`. Not-ready ones go first, at no
    /// cost: delete-requested, broken, then those still starting. Ready ones
    /// go only as true excess, once no ready outdated machine is left (those
    /// go first; they may have stayed for availability): delete-requested
    /// first, then from the fullest engine and failure domain, newest first.
    fn excess(&mut self) {
        let replicas = self.desired.replicas as usize;
        // Machines on an unreachable engine still count: they may be fine.
        let up_to_date = (0..self.machines.len())
            .filter(|&i| !self.deleted[i] && self.machines[i].active() && self.machines[i].up_to_date)
            .count();
        let mut excess = up_to_date.saturating_sub(replicas);
        let mut unready = self.open(|m| m.up_to_date && !m.ready);
        unready.sort_by_key(|&i| {
            let m = &self.machines[i];
            (!m.delete_requested, !m.phase.is_broken(), Reverse(m.created_at), m.name.clone())
        });
        for i in unready {
            if excess == 0 {
                return;
            }
            excess -= 1;
            self.remove(i, Self::requested_or(&self.machines[i], DeleteReason::Excess));
        }
        let outdated_ready_left = !self.open(|m| !m.up_to_date && m.ready).is_empty();
        while excess > 0 && !outdated_ready_left {
            let Some(i) = self.fullest_ready() else { return };
            if !self.affordable(&self.machines[i]) {
                // Wait for availability rather than pass over a machine
                // someone asked to remove first.
                return;
            }
            excess -= 1;
            self.remove(i, Self::requested_or(&self.machines[i], DeleteReason::Excess));
        }
    }

    /// The next ready up-to-date machine to remove as excess.
    fn fullest_ready(&self) -> Option<usize> {
        let mut per_engine: HashMap<&str, usize> = HashMap::new();
        let mut per_domain: HashMap<Option<&str>, usize> = HashMap::new();
        for i in self.open(|_| true) {
            let m = &self.machines[i];
            *per_engine.entry(m.engine.as_str()).or_default() += 1;
            *per_domain.entry(m.failure_domain.as_deref()).or_default() += 1;
        }
        self.open(|m| m.up_to_date && m.ready).into_iter().min_by_key(|&i| {
            let m = &self.machines[i];
            (
                !m.delete_requested,
                Reverse(per_engine.get(m.engine.as_str()).copied().unwrap_or(0)),
                Reverse(per_domain.get(&m.failure_domain.as_deref()).copied().unwrap_or(0)),
                Reverse(m.created_at),
                m.name.clone(),
            )
        })
    }

    /// Broken up-to-date machines: repaired in place when their backoff has
    /// passed, replaced when dead or after too many failed restarts.
    /// A container created but never started, on an engine whose breaker
    /// is open, is replaced elsewhere rather than started there.
    fn broken(&mut self) {
        let due = |m: &Observed| m.phase.is_broken() || (m.phase == MachinePhase::Creating && !m.start_in_flight);
        for i in self.open(|m| m.up_to_date && due(m)) {
            let m = &self.machines[i];
            let action = match m.phase {
                MachinePhase::Dead => None,
                _ if m.failed_restarts >= self.desired.max_failed_restarts => None,
                MachinePhase::Creating if m.engine_failing => None,
                MachinePhase::Creating => Some(RepairAction::Start),
                MachinePhase::Paused => Some(RepairAction::Unpause),
                _ => Some(RepairAction::Restart),
            };
            match action {
                None => self.remove(i, DeleteReason::Broken),
                Some(action) if m.repair_due || action == RepairAction::Start => self.repair.push(Repair {
                    machine: m.name.clone(),
                    container_id: m.container_id.clone(),
                    engine: m.engine.clone(),
                    action,
                    failed_restarts: m.failed_restarts,
                }),
                Some(_) => {}
            }
        }
    }

    /// Remediation: machines running but stuck unready are replaced, never
    /// more at once than unavailability allows (one at a time when it is
    /// zero), counting replacements still starting.
    fn stuck(&mut self) {
        let starting = self.open(|m| m.up_to_date && !m.ready && !m.stuck && !m.phase.is_broken()).len();
        let mut budget = (self.desired.max_unavailable.max(1) as usize).saturating_sub(starting);
        let mut stuck = self.open(|m| m.stuck);
        stuck.sort_by_key(|&i| (self.machines[i].created_at, self.machines[i].name.clone()));
        for i in stuck {
            if budget == 0 {
                break;
            }
            budget -= 1;
            self.remove(i, DeleteReason::Unready);
        }
    }

    /// Rule 1: enough new machines to reach `replicas` up to date, within
    /// the surge bound and the approved batches, spread over engines and
    /// failure domains; and how many of them no engine can take.
    fn creations(&self) -> (Vec<Creation>, u32) {
        let d = self.desired;
        let remaining =
            || self.machines.iter().zip(&self.deleted).filter(|(m, gone)| !**gone && m.active()).map(|(m, _)| m);
        let up_to_date = remaining().filter(|m| m.up_to_date).count();
        let strict = d.replacement == ReplacementPolicy::TerminationComplete;
        let terminating = if strict {
            self.machines.iter().filter(|m| m.terminating() && !m.lost).count() + self.delete.len()
        } else {
            0
        };
        let counted = remaining().count() + terminating;
        let replicas = d.replicas as usize;
        let want = replicas.saturating_sub(up_to_date);
        let room = (replicas + d.max_surge as usize).saturating_sub(counted);
        let approved = d.max_updated.map_or(usize::MAX, |a| (a as usize).saturating_sub(up_to_date));
        let count = want.min(room).min(approved);
        if d.engines.is_empty() {
            return (Vec::new(), u32::try_from(count).unwrap_or(u32::MAX));
        }
        let engines = spread(&d.engines, remaining().map(|m| m.engine.as_str()), count);
        let domains = spread(&d.failure_domains, remaining().filter_map(|m| m.failure_domain.as_deref()), count);
        let create = engines
            .into_iter()
            .zip(domains.into_iter().map(Some).chain(std::iter::repeat(None)))
            .map(|(engine, failure_domain)| Creation { engine, failure_domain })
            .collect();
        (create, 0)
    }
}

/// Picks a slot for each of `count` new machines: always the one with the
/// fewest machines so far, ties broken by list order. No slots, no picks.
fn spread<'a>(slots: &[String], existing: impl Iterator<Item = &'a str>, count: usize) -> Vec<String> {
    if slots.is_empty() {
        return Vec::new();
    }
    let mut load = vec![0usize; slots.len()];
    for name in existing {
        if let Some(i) = slots.iter().position(|s| s == name) {
            load[i] += 1;
        }
    }
    (0..count)
        .map(|_| {
            let (i, _) = load.iter().enumerate().min_by_key(|(i, n)| (**n, *i)).unwrap_or((0, &0));
            load[i] += 1;
            slots[i].clone()
        })
        .collect()
}

#[cfg(test)]
mod tests;
