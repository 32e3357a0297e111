//! Rollout bookkeeping: is the pool's rollout progressing, complete, paused,
//! stalled or rolling back? Pure functions of the counts a pass observed,
//! the previous record and the clock, so the rules are tested alone.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Machine counts of one pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Counts {
    /// Machines that exist.
    pub total: u32,
    /// Machines that run the desired image.
    pub updated: u32,
    pub ready: u32,
    /// Ready for at least `min_ready_seconds`.
    pub available: u32,
    /// Up to date and available: what a rollout is converging to.
    pub updated_available: u32,
    /// Machines that run another image.
    pub outdated: u32,
    /// Machines being deleted; not counted in `total`.
    pub terminating: u32,
}

/// What the reconciler remembers of the current rollout, in the pool status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RolloutProgress {
    /// The revision this rollout moves to.
    pub revision: i64,
    pub started_at: DateTime<Utc>,
    /// Last time more machines became updated-and-available, or fewer
    /// stayed outdated.
    pub last_progress_at: DateTime<Utc>,
    pub updated_available: u32,
    pub outdated: u32,
    /// No progress for `progress_deadline_seconds`.
    pub deadline_exceeded: bool,
    /// This rollout is an automatic return to an earlier revision.
    pub rolling_back: bool,
    pub completed_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RolloutState {
    Progressing,
    Complete,
    /// `paused` is set, or a batch waits for approval.
    Paused,
    /// No progress within the progress deadline.
    Stalled,
    /// An automatic rollback is under way.
    RollingBack,
}

impl Counts {
    pub fn complete(&self, replicas: u32) -> bool {
        self.outdated == 0 && self.total == replicas && self.updated_available == replicas
    }
}

/// The rollout record after a pass.
pub fn track(
    prev: Option<&RolloutProgress>,
    revision: i64,
    counts: &Counts,
    replicas: u32,
    deadline_seconds: u32,
    hold: bool,
    now: DateTime<Utc>,
) -> RolloutProgress {
    let mut p = match prev {
        Some(p) if p.revision == revision => p.clone(),
        _ => RolloutProgress {
            revision,
            started_at: now,
            last_progress_at: now,
            updated_available: counts.updated_available,
            outdated: counts.outdated,
            deadline_exceeded: false,
            rolling_back: false,
            completed_at: None,
        },
    };
    // Time spent paused or waiting for approval is not a lack of progress.
    if hold || counts.updated_available > p.updated_available || counts.outdated < p.outdated {
        p.last_progress_at = now;
        p.deadline_exceeded = false;
    }
    p.updated_available = counts.updated_available;
    p.outdated = counts.outdated;
    if counts.complete(replicas) {
        p.completed_at.get_or_insert(now);
        p.deadline_exceeded = false;
    } else {
        p.completed_at = None;
        let idle = now.signed_duration_since(p.last_progress_at);
        if idle.num_milliseconds() > i64::from(deadline_seconds) * 1000 {
            p.deadline_exceeded = true;
        }
    }
    p
}

/// The state a person should see.
pub fn state(
    p: &RolloutProgress,
    counts: &Counts,
    replicas: u32,
    paused: bool,
    awaiting_approval: bool,
) -> RolloutState {
    if counts.complete(replicas) {
        RolloutState::Complete
    } else if paused || awaiting_approval {
        RolloutState::Paused
    } else if p.deadline_exceeded {
        RolloutState::Stalled
    } else if p.rolling_back {
        RolloutState::RollingBack
    } else {
        RolloutState::Progressing
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(s, 0).unwrap_or_default()
    }

    fn counts(updated_available: u32, outdated: u32) -> Counts {
        Counts {
            total: updated_available + outdated,
            updated: updated_available,
            ready: updated_available + outdated,
            available: updated_available + outdated,
            updated_available,
            outdated,
            terminating: 0,
        }
    }

    #[test]
    fn a_new_revision_starts_a_new_rollout() {
        let p = track(None, 2, &counts(0, 3), 3, 60, false, t(0));
        assert_eq!((p.revision, p.started_at, p.deadline_exceeded), (2, t(0), false));
        let q = track(Some(&p), 3, &counts(0, 3), 3, 60, false, t(10));
        assert_eq!((q.revision, q.started_at), (3, t(10)));
    }

    #[test]
    fn progress_resets_the_deadline_and_idleness_exceeds_it() {
        let p = track(None, 2, &counts(0, 3), 3, 60, false, t(0));
        let p = track(Some(&p), 2, &counts(1, 2), 3, 60, false, t(50));
        assert_eq!(p.last_progress_at, t(50));
        let p = track(Some(&p), 2, &counts(1, 2), 3, 60, false, t(110));
        assert!(!p.deadline_exceeded, "exactly at the deadline is not past it");
        let p = track(Some(&p), 2, &counts(1, 2), 3, 60, false, t(111));
        assert!(p.deadline_exceeded);
        assert_eq!(state(&p, &counts(1, 2), 3, false, false), RolloutState::Stalled);
        let p = track(Some(&p), 2, &counts(2, 1), 3, 60, false, t(120));
        assert!(!p.deadline_exceeded, "progress clears a stall");
    }

    #[test]
    fn holding_is_not_stalling() {
        let p = track(None, 2, &counts(1, 2), 3, 60, false, t(0));
        let p = track(Some(&p), 2, &counts(1, 2), 3, 60, true, t(100));
        assert!(!p.deadline_exceeded);
        let p = track(Some(&p), 2, &counts(1, 2), 3, 60, false, t(150));
        assert!(!p.deadline_exceeded, "the clock restarted when the hold ended");
    }

    #[test]
    fn completion_is_recorded_once_and_wins_over_other_states() {
        let p = track(None, 2, &counts(3, 0), 3, 60, false, t(5));
        assert_eq!(p.completed_at, Some(t(5)));
        let p = track(Some(&p), 2, &counts(3, 0), 3, 60, false, t(500));
        assert_eq!(p.completed_at, Some(t(5)));
        assert_eq!(state(&p, &counts(3, 0), 3, true, true), RolloutState::Complete);
    }

    #[test]
    fn paused_and_rolling_back_are_told_apart() {
        let mut p = track(None, 2, &counts(1, 2), 3, 60, false, t(0));
        assert_eq!(state(&p, &counts(1, 2), 3, true, false), RolloutState::Paused);
        assert_eq!(state(&p, &counts(1, 2), 3, false, true), RolloutState::Paused);
        p.rolling_back = true;
        assert_eq!(state(&p, &counts(1, 2), 3, false, false), RolloutState::RollingBack);
        assert_eq!(state(&p, &counts(1, 2), 3, false, false), RolloutState::RollingBack);
    }
}
