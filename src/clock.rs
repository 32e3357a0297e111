//! The time as the reconciler sees it: the system clock, or a clock a test
//! moves by hand, so that settling, backoff and deadlines are tested in
//! microseconds instead of against the wall clock.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};

/// The latest time [`wall`] handed out, in microseconds since the epoch.
static LAST_WALL: AtomicI64 = AtomicI64::new(i64::MIN);

/// The system time, never earlier than a time this process handed out
/// before. The system clock may step back (a VM's clock is corrected, or
/// reads a few milliseconds behind on another core): a job cancelled after
/// it was created must not read as finished before it was created.
pub fn wall() -> DateTime<Utc> {
    let now = Utc::now();
    let micros = now.timestamp_micros();
    let before = LAST_WALL.fetch_max(micros, Ordering::AcqRel);
    if before <= micros {
        return now;
    }
    DateTime::from_timestamp_micros(before).unwrap_or(now)
}

#[derive(Clone, Default)]
pub enum Clock {
    #[default]
    System,
    /// Stands still until `advance`d.
    Manual(Arc<Mutex<DateTime<Utc>>>),
}

impl Clock {
    pub fn manual(start: DateTime<Utc>) -> Self {
        Self::Manual(Arc::new(Mutex::new(start)))
    }

    pub fn now(&self) -> DateTime<Utc> {
        match self {
            Self::System => wall(),
            Self::Manual(t) => *t.lock().unwrap_or_else(|p| p.into_inner()),
        }
    }

    /// Moves a manual clock forward; the system clock moves by itself.
    pub fn advance(&self, by: Duration) {
        if let Self::Manual(t) = self {
            let mut t = t.lock().unwrap_or_else(|p| p.into_inner());
            *t += chrono::Duration::from_std(by).unwrap_or(chrono::Duration::MAX);
        }
    }
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::System => f.write_str("Clock::System"),
            Self::Manual(_) => write!(f, "Clock::Manual({})", self.now()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::SubsecRound;

    #[test]
    fn the_wall_clock_never_goes_back_within_the_process() {
        // As if the system clock had stepped 2 ms back since the last read.
        let ahead = Utc::now() + chrono::Duration::milliseconds(2);
        LAST_WALL.fetch_max(ahead.timestamp_micros(), Ordering::AcqRel);
        let t = wall();
        assert!(t >= ahead.trunc_subsecs(6), "{t} < {ahead}");
        let mut last = t;
        for _ in 0..10_000 {
            let next = wall();
            assert!(next >= last, "{next} < {last}");
            last = next;
        }
    }
}
