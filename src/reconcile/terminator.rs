//! The bookkeeping of background deletions: which machines are being
//! deleted, which deletions failed and when each may be tried again, and
//! the tasks doing the work (`terminate`). It knows nothing of a pass, so
//! that a pass's context can hold it.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Longest wait before a failed deletion is tried again.
const MAX_RETRY: Duration = Duration::from_secs(30);

#[derive(Default)]
pub struct Terminator {
    state: Mutex<State>,
    tasks: TaskTracker,
    cancel: CancellationToken,
}

#[derive(Default)]
struct State {
    in_flight: HashMap<String, ()>,
    /// Failed deletions, by machine.
    failed: HashMap<String, Failure>,
}

/// A deletion that failed, for the pool's status and the retry's backoff.
#[derive(Debug, Clone)]
pub struct Failure {
    /// Failures in a row.
    pub count: u32,
    pub retry_at: Instant,
    pub message: String,
    /// The node could not be drained (rather than the container removed).
    pub drain: bool,
}

impl Terminator {
    /// Deletions stop when `cancel` fires; `tasks` lets shutdown wait for them.
    pub fn new(tasks: TaskTracker, cancel: CancellationToken) -> Self {
        Self { state: Mutex::default(), tasks, cancel }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn in_flight(&self) -> usize {
        self.state().in_flight.len()
    }

    /// The last failure of the machine's deletion, while it keeps failing.
    pub fn failure(&self, machine: &str) -> Option<Failure> {
        self.state().failed.get(machine).cloned()
    }

    /// Takes on the machine's deletion, unless it is in flight or waiting
    /// out a backoff after a failure (`false`).
    pub(super) fn claim(&self, machine: &str) -> bool {
        let mut s = self.state();
        if s.in_flight.contains_key(machine) {
            return false;
        }
        if s.failed.get(machine).is_some_and(|f| Instant::now() < f.retry_at) {
            return false;
        }
        s.in_flight.insert(machine.to_owned(), ());
        true
    }

    /// Records how a claimed deletion ended: `failed` holds the error's
    /// message and whether the drain failed. Answers, for a failure, how
    /// many in a row and how long to wait before the next try.
    pub(super) fn settle(&self, machine: &str, failed: Option<(String, bool)>) -> Option<(u32, Duration)> {
        let mut s = self.state();
        s.in_flight.remove(machine);
        let Some((message, drain)) = failed else {
            s.failed.remove(machine);
            return None;
        };
        let n = s.failed.get(machine).map_or(1, |f| f.count + 1);
        let wait = Duration::from_secs(1u64 << n.min(5)).min(MAX_RETRY);
        s.failed.insert(machine.to_owned(), Failure { count: n, retry_at: Instant::now() + wait, message, drain });
        Some((n, wait))
    }

    /// Fires at shutdown: deletions stop at once (their recorded intent
    /// lets the next run finish them).
    pub(super) fn cancelled(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Runs a deletion in the background, tracked so shutdown waits for it.
    pub(super) fn spawn(&self, work: impl Future<Output = ()> + Send + 'static) {
        // In the span of the pass that handed it over: its engine calls
        // belong to that pass's trace.
        self.tasks.spawn(tracing::Instrument::in_current_span(work));
    }
}
