//! What a machine is doing, derived from what its engine reports: the
//! phases, and the rules that say when a machine counts as ready.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A machine's phase, from its container's observed state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum MachinePhase {
    /// The container exists but was never started (a creation in progress,
    /// or one interrupted between the engine's create and start).
    Creating,
    /// The process runs but has not proven itself yet: within the settle
    /// time, or its health check has not passed yet.
    Starting,
    /// The process runs; `ready` says whether it is healthy and settled.
    Running,
    /// The process ended (see the exit code and the OOM flag).
    Exited,
    /// Frozen by `docker pause`.
    Paused,
    /// The engine failed to remove or stop it; only replacing it helps.
    Dead,
    /// drover is deleting it: it counts toward nothing and is finished off
    /// even across restarts of drover.
    Terminating,
    /// Its engine cannot be reached, so its state is not known.
    Unknown,
}

impl MachinePhase {
    /// Broken machines are repaired (restarted in place, unpaused) or
    /// replaced; they are never waited for.
    pub fn is_broken(self) -> bool {
        matches!(self, Self::Exited | Self::Paused | Self::Dead)
    }

    /// Stable text, as stored and as the API shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Creating => "creating",
            Self::Starting => "starting",
            Self::Running => "running",
            Self::Exited => "exited",
            Self::Paused => "paused",
            Self::Dead => "dead",
            Self::Terminating => "terminating",
            Self::Unknown => "unknown",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [
            Self::Creating,
            Self::Starting,
            Self::Running,
            Self::Exited,
            Self::Paused,
            Self::Dead,
            Self::Terminating,
            Self::Unknown,
        ]
        .into_iter()
        .find(|p| p.as_str() == s)
    }
}

/// Restart-in-place policy of broken machines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestartPolicy {
    /// Wait before the second restart; it doubles with each failed one.
    pub base: Duration,
    /// Longest wait between restarts.
    pub cap: Duration,
    /// Restarts that did not bring the machine back to ready, after which
    /// it is replaced instead.
    pub max_failed: u32,
}

impl Default for RestartPolicy {
    /// The first restart is immediate (a machine stopped by hand comes back
    /// at once); then 1 s, 2 s, 4 s, 8 s; after five failed restarts (about
    /// 15 s of crash-looping) the machine is replaced, which bounds both the
    /// restart rate and how long a broken container is nursed.
    fn default() -> Self {
        Self { base: Duration::from_secs(1), cap: Duration::from_secs(60), max_failed: 5 }
    }
}

impl RestartPolicy {
    /// How long after its last exit a machine with `failed` failed restarts
    /// is restarted again.
    pub fn delay(&self, failed: u32) -> Duration {
        if failed == 0 {
            return Duration::ZERO;
        }
        super::backoff::exponential(self.base, failed, self.cap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_round_trip_through_their_text() {
        for p in [MachinePhase::Creating, MachinePhase::Terminating, MachinePhase::Unknown] {
            assert_eq!(MachinePhase::parse(p.as_str()), Some(p));
            assert_eq!(serde_json::to_value(p).unwrap(), p.as_str());
        }
        assert_eq!(MachinePhase::parse("bogus"), None);
    }

    #[test]
    fn restarts_back_off_from_immediate_to_the_cap() {
        let p = RestartPolicy::default();
        let delays: Vec<u64> = (0..9).map(|n| p.delay(n).as_secs()).collect();
        assert_eq!(delays, [0, 1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(p.delay(u32::MAX), p.cap);
    }
}
