//! The bookkeeping of background starts of new machines.
//!
//! A pass creates a new machine's container itself: from then on the
//! engine holds its name, image and labels, and a refusal (a missing image,
//! a name in use) fails the pass. It hands the start over: starting is the
//! slow half of a creation (the engine sets up the container's network and
//! process), and a pass that waited for it would keep the pool's next pass
//! waiting too, with machines that settled meanwhile and their replacements
//! due. Until it runs, the planner sees the machine as `creating`: it counts
//! toward `replicas` and the surge bound, and is not ready.
//!
//! A start cut short (a shutdown, a crash, an outage) leaves a created
//! container, which the next pass starts as a repair, unless its start is
//! still in flight here.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Mutex;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub struct Starter {
    /// Containers being started, by id.
    in_flight: Mutex<HashSet<String>>,
    tasks: TaskTracker,
    cancel: CancellationToken,
}

impl Starter {
    /// Starts stop when `cancel` fires; `tasks` lets shutdown wait for them.
    pub fn new(tasks: TaskTracker, cancel: CancellationToken) -> Self {
        Self { in_flight: Mutex::default(), tasks, cancel }
    }

    fn in_flight_set(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.in_flight.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Those of `ids` whose start is in flight now. Asked about one pool's
    /// containers, never the whole set: while a large fleet is created,
    /// tens of thousands of starts wait for their engine, and a pass that
    /// copied them all made each pass cost O(fleet), convergence O(fleet²).
    pub fn in_flight_among<'a>(&self, ids: impl IntoIterator<Item = &'a str>) -> HashSet<String> {
        let in_flight = self.in_flight_set();
        ids.into_iter().filter(|id| in_flight.contains(*id)).map(str::to_owned).collect()
    }

    /// Takes on the container's start, unless it is in flight (`false`).
    pub(super) fn claim(&self, container_id: &str) -> bool {
        self.in_flight_set().insert(container_id.to_owned())
    }

    /// The claimed start has ended, one way or the other.
    pub(super) fn done(&self, container_id: &str) {
        self.in_flight_set().remove(container_id);
    }

    /// Fires at shutdown: a created container is started by the next run.
    pub(super) fn cancelled(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Runs a start in the background, tracked so shutdown waits for it.
    pub(super) fn spawn(&self, work: impl Future<Output = ()> + Send + 'static) {
        // In the span of the pass that handed it over: its engine calls
        // belong to that pass's trace.
        self.tasks.spawn(tracing::Instrument::in_current_span(work));
    }
}
